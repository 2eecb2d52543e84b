# SPDX-License-Identifier: Apache-2.0
"""Builds both compiled kernel backends over csrc/ (metadata lives in pyproject.toml).

- rocketstore.kernels._cext:     Cython, pyx/_cext.pyx + csrc/*.c (CPython only)
- rocketstore.kernels._cffi_lib: cffi out-of-line API mode, csrc/build_cffi.py + csrc/*.c

Switches (environment): ROCKETSTORE_BUILD_CEXT=0 and ROCKETSTORE_BUILD_CFFI=0 skip a backend
(both for a pure-Python install); ROCKETSTORE_DEBUG=1 builds with asserts, -O0 -g and Cython
line tracing + annotation; ROCKETSTORE_SANITIZE=address,undefined builds both modules with those
sanitizers (run them with the runtimes preloaded: scripts/sanitize-tests). A compiler error fails
the build: there is no soft fallback.
"""
import glob
import os
import platform

from setuptools import Extension, find_packages, setup


def _switch(name, default):
    return os.environ.get(name, default).strip() == "1"


CPYTHON = platform.python_implementation() == "CPython"
BUILD_CEXT = _switch("ROCKETSTORE_BUILD_CEXT", "1") and CPYTHON   # PyPy: cffi only
BUILD_CFFI = _switch("ROCKETSTORE_BUILD_CFFI", "1")
DEBUG = _switch("ROCKETSTORE_DEBUG", "0")
SANITIZE = os.environ.get("ROCKETSTORE_SANITIZE", "").strip()

C_SOURCES = sorted(glob.glob(os.path.join("csrc", "*.c")))


def _sanitize_args():
    # Kept equal to csrc/build_cffi.py's sanitize_args(). -O1 keeps stack traces readable and
    # still lets ASan see every out-of-bounds access; the same flags go to the link so the
    # module pulls in the sanitizer runtimes (which must be LD_PRELOADed into python).
    if not SANITIZE or os.name == "nt":
        return []
    return [f"-fsanitize={SANITIZE}", "-fno-omit-frame-pointer", "-g", "-O1"]


def _compile_args():
    # Kept equal to csrc/build_cffi.py's compile_args(), which the cffi build uses.
    if os.name == "nt":
        return ["/Od", "/Zi"] if DEBUG else ["/O2"]
    if DEBUG:
        return ["-O0", "-g", "-std=c99", "-Wall", "-Wextra"] + _sanitize_args()
    return ["-O3", "-std=c99", "-Wall", "-Wextra"] + _sanitize_args()


def _cext_modules():
    from Cython.Build import cythonize

    directives = {"language_level": 3, "boundscheck": False, "wraparound": False}
    macros = []
    if DEBUG:
        directives.update(linetrace=True)
        macros += [("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")]
    ext = Extension(
        "rocketstore.kernels._cext",
        sources=["pyx/_cext.pyx"] + C_SOURCES,
        include_dirs=["csrc"],
        define_macros=macros,
        # py-lmdb's trick: a debug build keeps assert() even where the toolchain sets NDEBUG.
        undef_macros=["NDEBUG"] if DEBUG else [],
        extra_compile_args=_compile_args(),
        extra_link_args=_sanitize_args(),
    )
    return cythonize([ext], include_path=["pyx"], compiler_directives=directives,
                     build_dir=os.path.join("build", "cython"), annotate=DEBUG)


setup(
    packages=find_packages(include=["rocketstore", "rocketstore*"]),
    package_data={"rocketstore": ["py.typed"]},
    ext_modules=_cext_modules() if BUILD_CEXT else [],
    cffi_modules=["csrc/build_cffi.py:ffibuilder"] if BUILD_CFFI else [],
    zip_safe=False,
)
