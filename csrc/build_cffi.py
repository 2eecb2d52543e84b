# SPDX-License-Identifier: Apache-2.0
"""cffi out-of-line API builder for rocketstore.kernels._cffi_lib over csrc/*.c.

Used by setup.py (`cffi_modules=["csrc/build_cffi.py:ffibuilder"]`); `python csrc/build_cffi.py`
builds the module in place for development. API mode (`set_source`), never `verify()`: the C
compiler checks every declaration against the real headers. The declarations, sources and flags
come from csrc/interface.py, which renders the cdef from the headers.
"""
import importlib.util
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))


def _interface():
    # csrc/interface.py by path: setup.py runs this file through cffi with csrc/ off sys.path.
    spec = importlib.util.spec_from_file_location("_rocketstore_interface",
                                                  os.path.join(HERE, "interface.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


interface = _interface()


def _rel(path):
    # setuptools wants sources relative to setup.py's directory, which is the cwd when it runs us.
    try:
        return os.path.relpath(path)
    except ValueError:   # another drive on Windows
        return path


ffibuilder = FFI()
ffibuilder.cdef(interface.cffi_cdef())
ffibuilder.set_source(
    "rocketstore.kernels._cffi_lib",
    "".join(f'#include "{h}"\n' for h in interface.HEADERS),
    sources=[_rel(s) for s in interface.sources()],
    include_dirs=[_rel(HERE)],
    extra_compile_args=interface.compile_args(),
    extra_link_args=interface.link_args(),
)

if __name__ == "__main__":
    os.chdir(os.path.dirname(HERE))
    ffibuilder.compile(verbose=True)
