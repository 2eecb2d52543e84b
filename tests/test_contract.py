# SPDX-License-Identifier: Apache-2.0
"""Every backend exports exactly the kernel contract, and the Python mirror of the on-disk
constants (format.py, errors.py) agrees with the C headers (csrc/rs_format.h, rs_common.h)."""
import inspect
import os
import re

import numpy as np
import pytest

from rocketstore import errors
from rocketstore import format as F
from rocketstore import testing
from rocketstore.kernels.contract import KERNEL_NAMES, OPTIONAL_NAMES, Kernels

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
_DEFINE = re.compile(r"^#define\s+RS_(\w+)\s+\(?(-?(?:0x[0-9A-Fa-f]+|\d+))\)?(?:\s|$)", re.M)
_STRING = re.compile(r'^#define\s+RS_(\w+)\s+"([^"]*)"', re.M)
# C-only constants: no Python counterpart needed.
C_ONLY = {"MAX_TOPIC_LENGTH_V2"}


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


# Each layout of format.py, and the prefix of rs_format.h's defines that place its fields: the
# header's RS_<prefix><FIELD> is the offset of the layout's field <field>.
_LAYOUTS = [(F.RECORD_HEAD, "POS_"), (F.CQ_UNIT, "CQ_POS_"), (F.INDEX_HEADER, "INDEX_POS_"),
            (F.INDEX_ENTRY, "INDEX_ENTRY_POS_"), (F.CHECKPOINT, "CHECKPOINT_POS_")]


@pytest.mark.parametrize("layout, prefix", _LAYOUTS, ids=[p for _, p in _LAYOUTS])
def test_layout_field_offsets_are_the_headers_defines(layout, prefix):
    ints, _ = _header("rs_format.h")
    placed = {n[len(prefix):].lower(): v for n, v in ints.items() if n.startswith(prefix)}
    placed.pop("bornhost", None)         # where the head ends: its size, checked below
    assert placed == layout.offsets
    # the numpy view of the layout puts every field where the Struct packs it
    assert {n: layout.dtype.fields[n][1] for n in layout.dtype.names} == layout.offsets
    values = list(range(1, len(layout.fields) + 1))
    packed = layout.struct.pack(*values)
    assert np.frombuffer(packed, dtype=layout.dtype).tolist() == [tuple(values)]


def test_layout_sizes_are_the_headers():
    ints, _ = _header("rs_format.h")
    assert F.RECORD_HEAD.size == ints["POS_BORNHOST"]
    assert F.BLANK.size == ints["END_FILE_MIN_BLANK_LENGTH"]
    assert F.BLANK.offsets == {"totalsize": ints["POS_TOTALSIZE"], "magic": ints["POS_MAGIC"]}
    assert F.RECORD_FIXED_V4.size + 1 + 2 == ints["MSG_FIXED_V1_IPV4"]
    assert F.RECORD_FIXED_V4.offsets["storetimestamp"] == \
        ints["POS_BORNHOST"] + ints["HOST_V4_LENGTH"]
    assert F.RECORD_TAIL.size == 4 + 8 + 4
    assert F.CQ_UNIT.size == ints["CQ_STORE_UNIT_SIZE"]
    assert F.INDEX_HEADER.size == ints["INDEX_HEADER_SIZE"]
    assert F.INDEX_SLOT_DTYPE.itemsize == ints["INDEX_SLOT_SIZE"]
    assert F.INDEX_ENTRY.size == ints["INDEX_ENTRY_SIZE"]
    assert F.CHECKPOINT.size <= ints["CHECKPOINT_FILE_SIZE"]
    assert F.CHECKPOINT_V49.offsets.items() <= F.CHECKPOINT.offsets.items()


_FORMS = [(sys_flag, v2) for sys_flag in (0, F.BORNHOST_V6_FLAG, F.STOREHOSTADDRESS_V6_FLAG,
                                          F.BORNHOST_V6_FLAG | F.STOREHOSTADDRESS_V6_FLAG)
          for v2 in (False, True)]


@pytest.mark.parametrize("sys_flag, v2", _FORMS)
def test_record_field_offsets_agree_with_the_check_kernels_row(backend, sys_flag, v2):
    # The kernels place the fields after BORNHOST by the record's SYSFLAG (IPv4 or IPv6
    # hosts); format's offsets must find the same fields in all four host forms.
    bh = F.born_host_length(sys_flag)
    sh = F.store_host_length(sys_flag)
    body, topic, props = b"body!", b"T", b"TAGS\x01a\x02"
    out = bytearray(backend.msg_size(sys_flag, len(body), len(topic), len(props), v2))
    backend.msg_encode(out, 0, topic, body, props, queue_id=3, flag=5, queue_offset=7,
                       phy_offset=0, sys_flag=sys_flag, born_timestamp=11,
                       born_host=bytes(range(1, bh + 1)), store_timestamp=13,
                       store_host=bytes(range(50, 50 + sh)), reconsume_times=17,
                       prepared_tx_offset=19, v2=v2)
    rows = np.zeros(1, dtype=F.SCAN_DTYPE)
    assert backend.commitlog_scan(out, 0, len(out), True, rows)[0] == 1
    row = rows[0]
    assert F.store_timestamp_at(out) == row["store_timestamp"] == 13
    tail = F.pos_record_tail(sys_flag)
    assert F.RECORD_TAIL.struct.unpack_from(out, tail) == (17, 19, len(body))
    assert tail + F.RECORD_TAIL.size == row["body_off"]
    assert out[F.POS_BORNHOST:F.POS_BORNHOST + bh] == bytes(range(1, bh + 1))
    assert out[tail - sh:tail] == bytes(range(50, 50 + sh))
    head = F.RECORD_HEAD.struct.unpack_from(out, 0)
    assert head[1:] == (F.MESSAGE_MAGIC_CODE_V2 if v2 else F.MESSAGE_MAGIC_CODE,
                        row["body_crc"], 3, 5, 7, 0, sys_flag, 11)
    if not sys_flag and not v2:
        assert F.RECORD_FIXED_V4.struct.unpack_from(out, 0)[-1] == len(body)


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
