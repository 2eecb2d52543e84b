# SPDX-License-Identifier: Apache-2.0
import os
import shutil

import pytest

from rocketstore import testing

from broker_data import DATA


@pytest.fixture(params=testing.backend_params())
def backend(request):
    """Each store test runs once per kernel backend."""
    return testing.load_backend(request.param)


@pytest.fixture(scope="session")
def backends():
    """Every backend under test, loaded once, for tests that compare them with each other."""
    return [testing.load_backend(name) for name in testing.backend_params()]


@pytest.fixture
def broker_store(tmp_path):
    """A writable copy of the store a real RocketMQ 4.9.8 broker wrote (tests/data)."""
    dst = tmp_path / "broker-store"
    shutil.copytree(os.path.join(DATA, "rmq-4.9.8-basic", "store"), dst)
    for root, dirs, files in os.walk(dst):
        for name in dirs + files:
            os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
    return dst


@pytest.fixture
def disk_path(tmp_path):
    """tmp_path on a disk file system: tmpfs pages are the file itself, so fadvise cannot
    evict them, nor does a sync wait for a device."""
    if testing.file_system_type(tmp_path) in ("", "tmpfs"):
        pytest.skip("needs a disk file system (Linux; not tmpfs)")
    return tmp_path


def pytest_report_header(config):
    from rocketstore import kernels
    return (f"rocketstore backends available: {', '.join(kernels.available())}; "
            f"expected: {os.environ.get('ROCKETSTORE_EXPECT_BACKENDS', '(any)')}")
