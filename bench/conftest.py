# SPDX-License-Identifier: Apache-2.0
"""Benchmarks: `pytest bench --benchmark-only`. benchmark.group is the operation, so one table
compares the backends (and the baselines) side by side.

Every benchmark checks, outside its timed region, that each put answered PUT_OK and that every
message reads back (rocketstore.workload.check_puts / check_read_back), sizes its store's files
to its data (workload.sized_config), and deletes its store when it ends."""
import shutil

import pytest

from rocketstore import MessageStore, testing
from rocketstore.workload import sized_config


@pytest.fixture(params=testing.backend_params())
def backend(request):
    return testing.load_backend(request.param)


@pytest.fixture
def tmp_path(tmp_path):
    """pytest's tmp_path, removed when the benchmark ends, passed or failed: pytest keeps the
    directories of its last three runs, and benchmark stores are big."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory):
    """A directory for a module's shared stores, removed after the module's last benchmark."""
    path = tmp_path_factory.mktemp("bench")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def store_factory(tmp_path):
    """make(backend, msgs, rounds, **config): a started store sized for `msgs` put `rounds`
    times; every store made is shut down and deleted at teardown."""
    stores = []

    def make(backend, msgs, rounds=1, **config):
        s = MessageStore(tmp_path / f"s{len(stores)}", sized_config(msgs, rounds, **config),
                         kernels=backend)
        s.load()
        s.start()
        stores.append(s)
        return s
    yield make
    for s in stores:
        s.shutdown()
        # pytest keeps the last runs' tmp_path directories: a store is deleted here, not later.
        shutil.rmtree(s.root, ignore_errors=True)
