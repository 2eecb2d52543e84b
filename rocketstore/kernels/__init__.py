# SPDX-License-Identifier: Apache-2.0
"""Kernel backends: `load(name)`, `available()`, and DEFAULT picked from ROCKETSTORE_BACKEND.

ROCKETSTORE_BACKEND is `auto` (default), `cext`, `cffi` or `pure`. `auto` tries cext then cffi
on CPython (cffi first on PyPy, where Cython extensions go through slow C-API emulation);
landing on `pure` warns once, so a broken build is never a silent slowdown.
"""
import importlib
import os
import platform
import warnings

from .contract import KERNEL_NAMES

_MODULES = {
    "cext": "rocketstore.kernels._cext",
    "cffi": "rocketstore.kernels.cffi_backend",
    "pure": "rocketstore.kernels.pure",
}
_loaded: dict = {}
_errors: dict = {}


def load(name):
    """The kernel module called `name`; ImportError if that backend is not built."""
    if name not in _MODULES:
        raise ValueError(f"unknown kernel backend {name!r}: choose one of {sorted(_MODULES)}")
    if name not in _loaded:
        try:
            _loaded[name] = importlib.import_module(_MODULES[name])
        except ImportError as exc:
            _errors[name] = exc
            raise
    return _loaded[name]


def available():
    """Names of the backends that import here, fastest first."""
    names = []
    for name in _MODULES:
        try:
            load(name)
            names.append(name)
        except ImportError:
            pass
    return names


def _pick():
    wanted = os.environ.get("ROCKETSTORE_BACKEND", "auto").strip().lower() or "auto"
    if wanted != "auto":
        return load(wanted)
    order = ("cffi", "cext") if platform.python_implementation() == "PyPy" else ("cext", "cffi")
    for name in order:
        try:
            return load(name)
        except ImportError:
            continue
    warnings.warn(
        "rocketstore: no compiled kernel backend could be imported "
        f"({'; '.join(f'{n}: {e}' for n, e in _errors.items())}); using the pure-Python "
        "backend, which is much slower. Set ROCKETSTORE_BACKEND=pure to silence this.",
        RuntimeWarning, stacklevel=3)
    return load("pure")


def resolve(kernels):
    """A kernel module from None (the default), a backend name, or a module."""
    if kernels is None:
        return DEFAULT
    if isinstance(kernels, str):
        return load(kernels)
    return kernels


DEFAULT = _pick()
BACKEND = DEFAULT.NAME

__all__ = ["KERNEL_NAMES", "load", "available", "resolve", "DEFAULT", "BACKEND"]
