# SPDX-License-Identifier: Apache-2.0
"""Builds both compiled kernel backends over csrc/ (metadata lives in pyproject.toml).

- rocketstore.kernels._cext:     Cython, pyx/_cext.pyx + csrc/*.c (CPython only)
- rocketstore.kernels._cffi_lib: cffi out-of-line API mode, csrc/build_cffi.py + csrc/*.c

Switches (environment): ROCKETSTORE_BUILD_CEXT=0 and ROCKETSTORE_BUILD_CFFI=0 skip a backend
(both for a pure-Python install); ROCKETSTORE_DEBUG=1 builds with asserts, -O0 -g and Cython
line tracing + annotation; ROCKETSTORE_SANITIZE=address,undefined builds both modules with those
sanitizers (run them with the runtimes preloaded: scripts/sanitize-tests). A compiler error fails
the build: there is no soft fallback, but the error says what is missing and how to install the
pure-Python backend instead.
"""
import glob
import os
import platform
import shutil
import sys
import sysconfig

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError


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


PURE_INSTALL = ("set ROCKETSTORE_BUILD_CEXT=0 ROCKETSTORE_BUILD_CFFI=0 and run the same pip "
                "install again")


def _missing_tools(compiler):
    """What a C build of an extension needs and this machine lacks, as sentences."""
    missing = []
    cc = getattr(compiler, "compiler_so", None) or getattr(compiler, "compiler", None)
    exe = cc[0] if cc else None
    if exe and not (os.path.isfile(exe) or shutil.which(exe)):
        missing.append(f"no C compiler: {exe!r} is not installed or not on PATH (set CC to "
                       "another one)")
    header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not os.path.exists(header):
        missing.append(f"no Python headers: {header} does not exist")
    return missing


class explaining_build_ext(build_ext):
    """build_ext whose failures say what a source build needs (a C compiler and the Python
    headers) and how to install without compiling, instead of only a compiler's exit status."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            found = _missing_tools(self.compiler) or [
                "the C compiler and the Python headers were found; see its output above"]
            raise CompileError(
                f"rocketstore: building the compiled backend {ext.name} failed: {exc}\n  - "
                + "\n  - ".join(found)
                + "\nA source build needs a C compiler and the Python development headers, "
                  "e.g. `apt-get install gcc python3-dev` (Debian, Ubuntu), `dnf install gcc "
                  "python3-devel` (Fedora, RHEL), `xcode-select --install` (macOS).\n"
                  "Or install the pure-Python backend alone (same files, slower): "
                  + PURE_INSTALL) from exc


def _cext_modules():
    try:
        from Cython.Build import cythonize
    except ImportError:
        sys.exit("rocketstore: the Cython backend needs Cython>=3 to build (pip installs it "
                 "from pyproject.toml; `python setup.py` alone does not). Or skip it "
                 "(ROCKETSTORE_BUILD_CEXT=0), or both compiled backends for a pure-Python "
                 "install: " + PURE_INSTALL)

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
    cmdclass={"build_ext": explaining_build_ext},
    zip_safe=False,
)
