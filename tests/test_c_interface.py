# SPDX-License-Identifier: Apache-2.0
"""The C interface has one source, the csrc/ headers: csrc/interface.py renders the cffi cdef and
Cython's pyx/csrc.pxd from them, and both builds take their sources and flags from it."""
import importlib.util
import os
import re

import pytest

from rocketstore import testing

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")


@pytest.fixture(scope="module")
def interface():
    spec = importlib.util.spec_from_file_location("_interface_under_test",
                                                  os.path.join(CSRC, "interface.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prototypes_by_grep():
    """Every `rs_*(` function declared at the start of a header line: an independent count."""
    names = set()
    for header in os.listdir(CSRC):
        if header.endswith(".h"):
            with open(os.path.join(CSRC, header)) as f:
                for line in f:
                    m = re.match(r"^(?!static)[a-z_0-9]+[\s*]+(rs_\w+)\(", line)
                    if m:
                        names.add(m.group(1))
    return names


def test_every_header_is_read(interface):
    on_disk = {h for h in os.listdir(CSRC) if h.endswith(".h")}
    assert set(interface.HEADERS) == on_disk


def test_every_declared_function_is_rendered_once(interface):
    _, _, functions, _ = interface.declarations()
    names = [name for name, _ in functions]
    assert len(names) == len(set(names))
    assert set(names) == _prototypes_by_grep()
    cdef, pxd = interface.cffi_cdef(), interface.cython_pxd()
    for name in names:
        assert len(re.findall(rf"\b{name}\(", cdef)) == 1, name
        assert len(re.findall(rf"\b{name}\(", pxd)) == 1, name


def test_static_inline_helpers_reach_cython_once_and_not_cffi(interface):
    cdef, pxd = interface.cffi_cdef(), interface.cython_pxd()
    assert "rs_load_be32" not in cdef and "rs_in_bounds" not in cdef
    # rs_common.h defines rs_load_be32 once per byte-order branch: declared once
    assert len(re.findall(r"\brs_load_be32\(", pxd)) == 1
    assert "    int64_t rs_load_i64(const uint8_t *p)\n" in pxd


def test_the_cffi_module_exposes_every_header_function(interface):
    testing.load_backend("cffi")            # fails, never skips, when cffi is not built
    from rocketstore.kernels._cffi_lib import lib
    _, _, functions, _ = interface.declarations()
    for name, _ in functions:
        assert callable(getattr(lib, name)), name


def test_the_pxd_renders_structs_as_cython_ctypedefs(interface):
    pxd = interface.cython_pxd()
    assert "    ctypedef struct rs_scan_rec:\n        int64_t pos\n" in pxd
    declarations = pxd.split('"""')[-1]
    assert not re.search(r"^\s*typedef struct", declarations, re.M) and ";" not in declarations


def test_a_declaration_it_cannot_read_is_an_error_not_a_silent_gap(interface):
    with pytest.raises(ValueError, match="cannot read the declaration"):
        interface.parse("extern int rs_global_counter[4] = {0};\nint (*rs_fp)(int);\n")
    with pytest.raises(ValueError, match="unterminated"):
        interface.parse("int rs_x(int a)\n")


def test_parse_reads_constants_structs_prototypes_and_skips_inline_bodies(interface):
    consts, structs, functions, inlines = interface.parse(
        "/* c */\n#define RS_A (-3)   /* why */\n#define RS_B 0x10\n#define RS_S \"x\"\n"
        "#define RS_F(x) (x)\n"
        "typedef struct rs_t {\n  int32_t a; /* a */\n  const uint8_t *p;\n} rs_t;\n"
        "typedef char rs_t_is_16[(sizeof(rs_t) == 16) ? 1 : -1];\n"
        "static inline int rs_h(int a) { return a; }\n"
        "static inline int rs_h(int a) { return -a; }\n"
        "int rs_f(const uint8_t *buf,\n         size_t len);\n")
    assert consts == ["RS_A", "RS_B"]
    assert structs == [("rs_t", ["int32_t a", "const uint8_t *p"])]
    assert functions == [("rs_f", "int rs_f(const uint8_t *buf, size_t len)")]
    assert inlines == [("rs_h", "int rs_h(int a)")]


def test_both_builds_compile_with_the_same_flags_and_sources(interface, monkeypatch):
    for debug in ("0", "1"):
        monkeypatch.setenv("ROCKETSTORE_DEBUG", debug)
        monkeypatch.setenv("ROCKETSTORE_SANITIZE", "address")
        args = interface.compile_args()
        assert args[-4:] == interface.link_args() == [
            "-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O1"]
        assert ("-UNDEBUG" in args) == (debug == "1")
    with open(os.path.join(os.path.dirname(CSRC), "setup.py")) as f:
        setup_py = f.read()
    with open(os.path.join(CSRC, "build_cffi.py")) as f:
        build_cffi = f.read()
    for text in (setup_py, build_cffi):
        assert "interface.compile_args()" in text and "interface.link_args()" in text
        assert "interface.sources()" in text
    assert {os.path.basename(s) for s in interface.sources()} == {
        f for f in os.listdir(CSRC) if f.endswith(".c")}
