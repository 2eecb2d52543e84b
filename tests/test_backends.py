# SPDX-License-Identifier: Apache-2.0
"""Backend selection: the environment variable, per-instance choice, and a loud fallback."""
import os
import subprocess
import sys

import pytest

import rocketstore
from rocketstore import kernels, testing


def run_python(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, check=True)


def test_every_expected_backend_imports():
    for name in testing.expected_backends():
        assert name in kernels.available(), f"{name} expected but not built"


def test_backend_env_var_picks_the_module():
    for name in testing.backend_params():
        out = run_python("import rocketstore; print(rocketstore.BACKEND)",
                         ROCKETSTORE_BACKEND=name)
        assert out.stdout.strip() == name


def test_falling_back_to_pure_warns_naming_the_variable():
    code = ("import sys, warnings\n"
            "sys.modules['rocketstore.kernels._cext'] = None\n"
            "sys.modules['rocketstore.kernels.cffi_backend'] = None\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    import rocketstore\n"
            "print(rocketstore.BACKEND)\n"
            "print([str(x.message) for x in w if x.category is RuntimeWarning])\n")
    out = run_python(code, ROCKETSTORE_BACKEND="auto")
    backend, warned = out.stdout.splitlines()
    assert backend == "pure"
    assert "ROCKETSTORE_BACKEND" in warned


def test_unknown_backend_name_is_rejected():
    with pytest.raises(ValueError):
        kernels.load("fortran")


def test_store_uses_the_backend_it_was_given(tmp_path):
    for name in testing.backend_params():
        store = rocketstore.MessageStore(tmp_path / name, testing.small_config(), kernels=name)
        assert store.kernels.NAME == name


def test_test_backends_env_var_narrows_the_matrix_and_refuses_unknown_names(monkeypatch):
    monkeypatch.setenv("ROCKETSTORE_TEST_BACKENDS", "cffi, cext")
    assert testing.backend_params() == ["cext", "cffi"]
    monkeypatch.setenv("ROCKETSTORE_TEST_BACKENDS", "cext,rust")
    with pytest.raises(ValueError, match="rust"):
        testing.backend_params()


def test_long_fault_tests_run_on_the_first_backend_unless_soaking(monkeypatch):
    monkeypatch.delenv("ROCKETSTORE_TEST_BACKENDS", raising=False)
    monkeypatch.delenv("ROCKETSTORE_SOAK", raising=False)
    assert testing.fault_backends() == testing.backend_params()[:1]
    monkeypatch.setenv("ROCKETSTORE_SOAK", "1")
    assert testing.fault_backends() == testing.backend_params()
