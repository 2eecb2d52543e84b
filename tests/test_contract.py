# SPDX-License-Identifier: Apache-2.0
"""Every backend exports exactly the kernel contract, and the Python mirror of the on-disk
constants (format.py, errors.py) agrees with the C headers (csrc/rs_format.h, rs_common.h)."""
import inspect
import os
import re

import pytest

from rocketstore import errors
from rocketstore import format as F
from rocketstore import testing
from rocketstore.kernels.contract import KERNEL_NAMES, OPTIONAL_NAMES, Kernels

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
_DEFINE = re.compile(r"^#define\s+RS_(\w+)\s+\(?(-?(?:0x[0-9A-Fa-f]+|\d+))\)?(?:\s|$)", re.M)
_STRING = re.compile(r'^#define\s+RS_(\w+)\s+"([^"]*)"', re.M)
# C-only constants: no Python counterpart needed.
C_ONLY = {"MAX_TOPIC_LENGTH_V2", "HOST_V4_LENGTH", "HOST_V6_LENGTH"}


def _header(name):
    with open(os.path.join(CSRC, name)) as f:
        text = f.read()
    return {k: int(v, 0) for k, v in _DEFINE.findall(text)}, dict(_STRING.findall(text))


@pytest.fixture(params=testing.backend_params())
def kernels(request):
    return request.param, testing.load_backend(request.param)


def test_backend_is_named_after_itself(kernels):
    name, mod = kernels
    assert mod.NAME == name


def test_backend_defines_exactly_the_contract_functions(kernels):
    _, mod = kernels
    defined = {n for n, obj in vars(mod).items()
               if not n.startswith("_") and callable(obj)
               and getattr(obj, "__module__", None) == mod.__name__}
    assert defined - set(OPTIONAL_NAMES) == set(KERNEL_NAMES)


@pytest.mark.parametrize("name", [b for b in testing.backend_params() if b != "pure"])
def test_compiled_backend_has_no_other_public_names(name):
    # (the pure reference module also holds its imports: struct, zlib, np, F)
    mod = testing.load_backend(name)
    public = {n for n in dir(mod) if not n.startswith("_")}
    assert public - set(OPTIONAL_NAMES) == set(KERNEL_NAMES) | {"NAME"}
    assert set(mod.__all__) == public


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_kernel_signature_matches_the_protocol(kernels, kernel):
    _, mod = kernels
    want = inspect.signature(getattr(Kernels, kernel))
    want = [(p.name, p.default) for p in list(want.parameters.values())[1:]]   # drop self
    got = [(p.name, p.default) for p in inspect.signature(getattr(mod, kernel)).parameters.values()]
    assert got == want


def test_status_codes_equal_rs_common_h():
    ints, _ = _header("rs_common.h")
    codes = {k: v for k, v in ints.items() if k == "OK" or k.startswith("E_")}
    assert codes == {n[3:]: getattr(errors, n) for n in dir(errors) if re.match(r"RS_(OK|E_)", n)}


def test_format_constants_equal_rs_format_h():
    ints, strings = _header("rs_format.h")
    py_ints = {n: v for n, v in vars(F).items() if n.isupper() and type(v) is int}
    separators = {"NAME_VALUE_SEPARATOR", "PROPERTY_SEPARATOR"}   # str in Python, byte in C
    assert {n: v for n, v in ints.items() if n not in C_ONLY | separators} == py_ints
    assert strings == {"SCHEDULE_TOPIC": F.SCHEDULE_TOPIC}
    assert chr(ints["NAME_VALUE_SEPARATOR"]) == F.NAME_VALUE_SEPARATOR
    assert chr(ints["PROPERTY_SEPARATOR"]) == F.PROPERTY_SEPARATOR
    assert ints["MAX_TOPIC_LENGTH_V2"] == 32767
    assert F.CQ_DTYPE.itemsize == ints["CQ_STORE_UNIT_SIZE"]


def test_every_format_constant_has_a_c_twin():
    ints, strings = _header("rs_format.h")
    for name, value in vars(F).items():
        if name.isupper() and isinstance(value, (int, str)):
            assert name in ints or name in strings or name in (
                "NAME_VALUE_SEPARATOR", "PROPERTY_SEPARATOR"), name


def _cffi():
    testing.load_backend("cffi")        # fails, never skips, when cffi is not built
    from rocketstore.kernels._cffi_lib import ffi, lib
    return ffi, lib


def test_compiler_sees_the_same_constants_as_the_regex():
    ffi, lib = _cffi()
    for header in ("rs_common.h", "rs_format.h"):
        for name, value in _header(header)[0].items():
            assert getattr(lib, "RS_" + name) == value, name


def test_scan_dtype_is_the_c_struct_rs_scan_rec():
    ffi, _ = _cffi()
    assert F.SCAN_DTYPE.itemsize == ffi.sizeof("rs_scan_rec") == 112
    for field, (dtype, offset) in F.SCAN_DTYPE.fields.items():
        assert ffi.offsetof("rs_scan_rec", field) == offset, field
        assert ffi.sizeof(ffi.typeof("rs_scan_rec").fields[
            [f for f, _ in ffi.typeof("rs_scan_rec").fields].index(field)][1].type) == \
            dtype.itemsize, field
    assert [f for f, _ in ffi.typeof("rs_scan_rec").fields] == list(F.SCAN_DTYPE.names)
