# SPDX-License-Identifier: Apache-2.0
"""Shared entry for the Python fuzz targets: `python fuzz/py/<target>.py [libFuzzer args]`
runs atheris; tests/test_fuzz_smoke.py imports the module and calls TestOneInput directly."""
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def instrumented(module_name):
    """Import rocketstore under atheris's coverage instrumentation when run as the fuzzer.
    Only rocketstore: atheris.instrument_all() over numpy & co. takes ~40 s per start."""
    if module_name != "__main__":
        return contextlib.nullcontext()
    import atheris
    return atheris.instrument_imports(include=["rocketstore"])


def run(test_one_input):
    import atheris
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
