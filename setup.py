# SPDX-License-Identifier: Apache-2.0
"""Builds both compiled kernel backends over csrc/ (metadata lives in pyproject.toml).

- rocketstore.kernels._cext:     Cython, pyx/_cext.pyx + csrc/*.c (CPython only)
- rocketstore.kernels._cffi_lib: cffi out-of-line API mode, csrc/build_cffi.py + csrc/*.c

Both take their sources, C flags and declarations from csrc/interface.py, which reads them from
the headers (pyx/csrc.pxd is written from there before cythonize).

Switches (environment): ROCKETSTORE_BUILD_CEXT=0 and ROCKETSTORE_BUILD_CFFI=0 skip a backend
(both for a pure-Python install); ROCKETSTORE_DEBUG=1 builds with asserts, -O0 -g and Cython
line tracing + annotation; ROCKETSTORE_SANITIZE=address,undefined builds both modules with those
sanitizers (run them with the runtimes preloaded: scripts/sanitize-tests). A compiler error fails
the build: there is no soft fallback, but the error says what is missing and how to install the
pure-Python backend instead.
"""
import importlib.util
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



def _interface():
    """csrc/interface.py, the one source of the C interface, sources and flags for both
    compiled modules (loaded by path: csrc/ is not a package)."""
    spec = importlib.util.spec_from_file_location("_rocketstore_interface",
                                                  os.path.join("csrc", "interface.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


interface = _interface()


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
    # Cython cimports the C interface from pyx/csrc.pxd, rendered from the headers.
    interface.write_pxd(os.path.join("pyx", "csrc.pxd"))
    ext = Extension(
        "rocketstore.kernels._cext",
        sources=["pyx/_cext.pyx"] + [os.path.relpath(s) for s in interface.sources()],
        include_dirs=["csrc"],
        define_macros=macros,
        extra_compile_args=interface.compile_args(),
        extra_link_args=interface.link_args(),
    )
    return cythonize([ext], include_path=["pyx"], compiler_directives=directives,
                     build_dir=os.path.join("build", "cython"), annotate=DEBUG)


setup(
    packages=find_packages(include=["rocketstore", "rocketstore*"]),
    package_data={"rocketstore": ["py.typed", "*.pyi"]},
    ext_modules=_cext_modules() if BUILD_CEXT else [],
    cffi_modules=["csrc/build_cffi.py:ffibuilder"] if BUILD_CFFI else [],
    cmdclass={"build_ext": explaining_build_ext},
    zip_safe=False,
)
