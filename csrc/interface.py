# SPDX-License-Identifier: Apache-2.0
"""The one source of the C interface and of the C build, read by both compiled backends' builds.

- The headers (`HEADERS`) are the only place a kernel is declared. The cffi `cdef`
  (csrc/build_cffi.py) and Cython's `pyx/csrc.pxd` (written by setup.py before cythonize) are
  rendered from them here, as python-zstandard's make_cffi.py renders its cdef from zstd.h.
  A new kernel is added in its .c/.h, the kernel contract and one wrapper per backend.
- `sources()`, `compile_args()` and `link_args()` are what setup.py's Cython extension and the
  cffi module both compile with, so the two builds cannot drift apart.

What the headers may hold, so that this reader stays small: integer `#define RS_*` constants,
`typedef struct NAME { ... } NAME;`, function prototypes, `static inline` helpers (declared to
Cython, which compiles against the headers, not to cffi) and `typedef char check[cond ? 1 : -1]`
size checks (C-only). `#if` blocks are not evaluated, so prototypes must not sit in them.
This module is build-time only (it runs from the source tree; it is not in the wheel).
"""
import glob
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))

# Include order: a header after the headers whose types it uses.
HEADERS = ["rs_common.h", "rs_format.h", "rs_crc32.h", "rs_msg.h", "rs_commitlog.h", "rs_cq.h",
           "rs_index.h", "rs_index_worker.h", "rs_sync.h", "rs_space.h", "rs_batch.h", "rs_sched.h",
           "rs_gc.h"]

_DEFINE = re.compile(r"^\s*#\s*define\s+(RS_\w+)\s+\(?-?(?:0x[0-9A-Fa-f]+|\d+)\)?\s*$", re.M)
_STRUCT = re.compile(r"^typedef struct (\w+) \{(.*)\} (\w+);$")
_STATIC_ASSERT = re.compile(r"^typedef char \w+\[")   # a C89 compile-time size check
_INLINE = re.compile(r"^static inline [\w ]+?[\s*]+(rs_\w+)\s*\(.*\)$")
_PROTO = re.compile(r"^[\w ]+?[\s*]+(rs_\w+)\s*\(.*\);$")


def sources():
    """Every csrc/*.c, sorted, as absolute paths: both modules link all kernels."""
    return sorted(glob.glob(os.path.join(HERE, "*.c")))


def _switch(name):
    return os.environ.get(name, "0").strip() == "1"


def link_args():
    """ROCKETSTORE_SANITIZE=address,undefined: the sanitizer flags, for compile and link alike
    (the module then pulls in the sanitizer runtimes, which must be LD_PRELOADed into python)."""
    sanitize = os.environ.get("ROCKETSTORE_SANITIZE", "").strip()
    if not sanitize or os.name == "nt":
        return []
    # -O1 keeps stack traces readable and still lets ASan see every out-of-bounds access; it
    # comes last, so it wins over -O3.
    return [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g", "-O1"]


def compile_args():
    """-O3, or for ROCKETSTORE_DEBUG=1 -O0 -g with assert() kept even where the toolchain sets
    NDEBUG (py-lmdb's trick); plus the sanitizer flags."""
    if os.name == "nt":
        return ["/Od", "/Zi"] if _switch("ROCKETSTORE_DEBUG") else ["/O2"]
    if _switch("ROCKETSTORE_DEBUG"):
        return ["-O0", "-g", "-std=c99", "-Wall", "-Wextra", "-UNDEBUG"] + link_args()
    return ["-O3", "-std=c99", "-Wall", "-Wextra"] + link_args()


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def parse(text):
    """(constants, structs, functions) of one header's text.

    constants: [name]; structs: [(name, [field declaration])]; functions: [(name, prototype)],
    each prototype on one line without its `;`; inlines: the `static inline` helpers as
    [(name, prototype)], once each (a header may define one per #if branch)."""
    text = _strip_comments(text).replace("\\\n", " ")   # join continued #if lines
    constants = _DEFINE.findall(text)
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    structs, functions, inlines = [], [], {}
    statement, depth = [], 0
    for ch in body:
        statement.append(ch)
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            text = "".join(statement).lstrip()
            if depth == 0 and text.startswith("static"):
                # a static inline helper: its prototype for Cython, its body stays in C
                head = " ".join(text[:text.index("{")].split())
                m = _INLINE.match(head)
                if m:
                    inlines.setdefault(m.group(1), head[len("static inline "):])
                statement = []
        elif ch == ";" and depth == 0:
            decl = " ".join("".join(statement).split())
            statement = []
            if decl.startswith("extern") or _STATIC_ASSERT.match(decl):
                continue
            m = _STRUCT.match(decl)
            if m:
                if m.group(1) != m.group(3):
                    raise ValueError(f"typedef struct {m.group(1)} is named {m.group(3)}")
                fields = [" ".join(f.split()) for f in m.group(2).split(";") if f.strip()]
                structs.append((m.group(1), fields))
                continue
            m = _PROTO.match(decl)
            if not m:
                raise ValueError(f"csrc header: cannot read the declaration {decl!r}")
            functions.append((m.group(1), decl[:-1]))
    if "".join(statement).strip():
        raise ValueError(f"csrc header: unterminated declaration {''.join(statement)!r}")
    return constants, structs, functions, list(inlines.items())


def declarations(headers=HEADERS):
    """The parsed interface of `headers` (every header), in include order."""
    constants, structs, functions, inlines = [], [], [], []
    for header in headers:
        with open(os.path.join(HERE, header)) as f:
            c, s, fn, inl = parse(f.read())
        constants += c
        structs += s
        functions += fn
        inlines += inl
    return constants, structs, functions, inlines


def cffi_cdef(headers=HEADERS):
    """The cffi cdef of `headers` (every header): structs and prototypes as the headers spell
    them, and every integer constant as `#define RS_X ...`, so that `_cffi_lib.lib.RS_X` carries
    the compiler's value."""
    constants, structs, functions, _ = declarations(headers)
    out = []
    for name, fields in structs:
        out.append(f"typedef struct {name} {{\n"
                   + "".join(f"    {field};\n" for field in fields) + f"}} {name};")
    out += [proto + ";" for _, proto in functions]
    out += [f"#define {name} ..." for name in constants]
    return "\n".join(out) + "\n"


def _wrap(line, indent, width=100):
    """A prototype broken after commas to fit `width`, continuation lines under its `(`."""
    if len(indent) + len(line) <= width:
        return indent + line
    cont = " " * (len(indent) + line.index("(") + 1)
    parts = line.split(", ")
    lines, cur = [], indent + parts[0]
    for part in parts[1:]:
        if len(cur) + len(part) + 3 > width:   # ", " before, "," after
            lines.append(cur + ",")
            cur = cont + part
        else:
            cur += ", " + part
    lines.append(cur)
    return "\n".join(lines)


def cython_pxd():
    """pyx/csrc.pxd: the same interface for Cython, and the static inline helpers too (Cython
    compiles against the headers, so it can call them; cffi's cdef leaves them out). Every
    function works on caller buffers (rs_sync.h and rs_space.h also do I/O) and touches no
    Python object, so the whole block is nogil: the .pyx decides per call whether releasing
    the GIL pays."""
    constants, structs, functions, inlines = declarations()
    out = ["# SPDX-License-Identifier: Apache-2.0",
           "# GENERATED by setup.py from csrc/*.h (csrc/interface.py): do not edit, do not commit.",
           "from libc.stdint cimport (int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t,",
           "                          uint64_t)",
           "",
           "cdef extern from * nogil:",
           '    """']
    out += [f'    #include "{h}"' for h in HEADERS]
    out += ['    """']
    out += [f"    const int {name}" for name in constants]
    for name, fields in structs:
        out.append(f"    ctypedef struct {name}:")
        out += [f"        {field}" for field in fields]
    out += [_wrap(proto, "    ") for _, proto in functions + inlines]
    return "\n".join(out) + "\n"


def write_pxd(path):
    """Write cython_pxd() to `path` unless it already holds exactly that (keeps Cython's
    dependency tracking from rebuilding for nothing)."""
    text = cython_pxd()
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(path, "w") as f:
        f.write(text)
