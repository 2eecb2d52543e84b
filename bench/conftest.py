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
    """make(backend, msgs, rounds, fs=None, **config): a started store sized for `msgs` put
    `rounds` times, on `fs` (a FileSystem; the real one by default); every store made is shut
    down and deleted at teardown."""
    stores = []

    def make(backend, msgs, rounds=1, fs=None, **config):
        s = MessageStore(tmp_path / f"s{len(stores)}", sized_config(msgs, rounds, **config),
                         kernels=backend, fs=fs)
        s.load()
        s.start()
        stores.append(s)
        return s
    yield make
    for s in stores:
        s.shutdown()
        # pytest keeps the last runs' tmp_path directories: a store is deleted here, not later.
        shutil.rmtree(s.root, ignore_errors=True)


class ThreadCpu:
    """The benchmarking thread's own CPU time per call of a timed function (wrap): a per-thread
    cost that other processes on a loaded machine inflate far less than wall time, comparable
    with the Java harnesses' ThreadMXBean figures (bench/java). Reading the clock costs well
    under a microsecond per call, against rounds of tens of microseconds or more."""

    def __init__(self):
        self.ns = []

    def wrap(self, fn):
        import time
        clock = time.thread_time_ns
        spent = self.ns.append

        def timed():
            c0 = clock()
            out = fn()
            spent(clock() - c0)
            return out
        return timed

    def record(self, benchmark, per_call, skip=0):
        """extra_info["thread_cpu_ns_per_msg"]: the mean over the calls after the first `skip`
        (a warm-up round), divided by the `per_call` messages each call handles."""
        calls = self.ns[skip:] or self.ns
        if calls:
            benchmark.extra_info["thread_cpu_ns_per_msg"] = round(
                sum(calls) / len(calls) / per_call, 1)


@pytest.fixture
def thread_cpu():
    return ThreadCpu()
