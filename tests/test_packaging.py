# SPDX-License-Identifier: Apache-2.0
"""What a source install meets: the license it ships, and a build that fails saying why."""
import os
import shutil
import subprocess
import sys
import tarfile

import rocketstore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.dirname(os.path.abspath(rocketstore.__file__))
IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.so",
                                "*.o", ".hypothesis", ".pytest_cache", ".benchmarks", "data")


def _source_tree(dst):
    """A copy of the source tree; the package comes from wherever rocketstore was imported
    (scripts/check-wheel runs the tests from a tree without rocketstore/)."""
    shutil.copytree(REPO, dst, ignore=IGNORE)
    if not os.path.isdir(os.path.join(dst, "rocketstore")):
        shutil.copytree(PACKAGE, os.path.join(dst, "rocketstore"), ignore=IGNORE)
    return dst


def _setup_py(tree, *args, **env):
    return subprocess.run([sys.executable, "setup.py", *args], cwd=tree, capture_output=True,
                          text=True, env={**os.environ, **env})


def test_the_license_is_apache_2_and_the_sdist_ships_it(tmp_path):
    with open(os.path.join(REPO, "LICENSE")) as f:
        text = f.read()
    assert "Apache License" in text.splitlines()[1]
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    tree = _source_tree(tmp_path / "src")
    r = _setup_py(tree, "-q", "sdist", "-d", str(tmp_path / "dist"),
                  ROCKETSTORE_BUILD_CEXT="0", ROCKETSTORE_BUILD_CFFI="0")
    assert r.returncode == 0, r.stderr
    assert "LICENSE" not in r.stdout + r.stderr     # no "no files found matching 'LICENSE'"
    (sdist,) = os.listdir(tmp_path / "dist")
    with tarfile.open(tmp_path / "dist" / sdist) as tar:
        shipped = tar.extractfile(f"{sdist[:-len('.tar.gz')]}/LICENSE").read().decode()
    assert shipped == text


def test_a_build_without_a_compiler_says_what_is_missing_and_how_to_install_pure(tmp_path):
    tree = _source_tree(tmp_path / "src")
    r = _setup_py(tree, "-q", "build_ext", "-b", str(tmp_path / "out"), "-t",
                  str(tmp_path / "tmp"), ROCKETSTORE_BUILD_CEXT="0", CC="/nonexistent/cc")
    assert r.returncode != 0
    err = r.stderr
    assert "building the compiled backend rocketstore.kernels._cffi_lib failed" in err
    assert "no C compiler: '/nonexistent/cc' is not installed or not on PATH" in err
    assert "needs a C compiler and the Python development headers" in err
    assert "ROCKETSTORE_BUILD_CEXT=0 ROCKETSTORE_BUILD_CFFI=0" in err


def test_a_build_without_python_headers_says_so(tmp_path):
    tree = _source_tree(tmp_path / "src")
    # The interpreter's include directory made to look empty, as without python3-dev; the
    # compiler (/bin/false, which exists) then fails as it would on the missing Python.h.
    hide_headers = ("import runpy, sysconfig; real = sysconfig.get_paths; "
                    "sysconfig.get_paths = lambda *a, **k: {**real(*a, **k), "
                    "'include': '/nonexistent/include'}; "
                    "runpy.run_path('setup.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", hide_headers, "-q", "build_ext", "-b",
                        str(tmp_path / "out"), "-t", str(tmp_path / "tmp")], cwd=tree,
                       capture_output=True, text=True,
                       env={**os.environ, "ROCKETSTORE_BUILD_CEXT": "0", "CC": "/bin/false"})
    assert r.returncode != 0
    assert "no Python headers: /nonexistent/include/Python.h does not exist" in r.stderr
    assert "no C compiler" not in r.stderr
    assert "ROCKETSTORE_BUILD_CEXT=0 ROCKETSTORE_BUILD_CFFI=0" in r.stderr
