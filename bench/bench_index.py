# SPDX-License-Identifier: Apache-2.0
"""IndexFile benchmarks, one table per operation (benchmark.group) comparing the backends:

- index build during dispatch: IndexService.dispatch over scanned CommitLog rows (keys/s in
  extra_info), default file geometry (5,000,000 slots, 20,000,000 entries);
- query_message of a single-hit key on a store with N_STORE indexed messages, including reading
  and decoding the hit (queries/s = 1 / mean);
- the bare index_lookup kernel on that store's index file.

`pytest bench/bench_index.py --benchmark-only --benchmark-columns=mean,ops`
"""
import dataclasses
import itertools
import random
import shutil
import types

import numpy as np
import pytest

from rocketstore import MessageStore, StoreConfig, testing
from rocketstore import format as F
from rocketstore.clock import StepClock
from rocketstore.fs import DEFAULT as FS
from rocketstore.index_service import IndexService
from rocketstore.message import Message

N_BUILD = 100_000          # records per build round, each with UNIQ_KEY + 2 KEYS pieces
N_STORE = 1_000_000        # indexed messages in the query store
LONG_MAX = (1 << 63) - 1


def _messages(n, start=0):
    return [Message("BenchTopic", b"x" * 32, tags="TagA", keys=f"key-{i} grp-{i % 100}",
                    queue_id=i % 4, properties={"UNIQ_KEY": f"7F0000010000{i:020X}"},
                    born_timestamp=1_700_000_000_000 + i) for i in range(start, start + n)]


def _config(root):
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=1 << 30,
                       flush_interval_consume_queue=60_000)


@pytest.fixture(scope="module")
def build_log(tmp_path_factory):
    """A CommitLog of N_BUILD records, and its scanned rows in reput-sized batches."""
    root = tmp_path_factory.mktemp("index-build")
    store = testing.open_store(root, testing.load_backend("cext"),
                               dataclasses.replace(_config(root), message_index_enable=False),
                               clock=StepClock(1_800_000_000_000, 1))
    msgs = _messages(N_BUILD)
    for i in range(0, N_BUILD, 1000):
        store.put_messages(msgs[i:i + 1000])
    testing.wait_dispatched(store, 60)
    mf = store.commitlog.mfq.files[0]
    rows = np.empty(N_BUILD, dtype=F.SCAN_DTYPE)
    n, *_ = store.kernels.commitlog_scan(mf.mm, 0, mf.read_position, False, rows)
    assert n == N_BUILD
    data = bytes(mf.mm[:mf.read_position])
    store.shutdown()
    batches = [rows[i:i + 4096].tolist() for i in range(0, n, 4096)]
    return data, batches


def test_index_build_during_dispatch(benchmark, backend, build_log, tmp_path):
    data, batches = build_log
    benchmark.group = "index build during dispatch (keys/s = keys / mean)"
    rounds = itertools.count()
    holder = {}

    def setup():
        root = tmp_path / f"r{next(rounds)}"
        root.mkdir()
        fake = types.SimpleNamespace(kernels=backend, fs=FS, root=str(root), writable=True,
                                     config=StoreConfig(), checkpoint=None)
        holder["svc"] = IndexService(fake)
        return (holder["svc"],), {}

    def run(svc):
        for rows in batches:
            svc.dispatch(rows, data)

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    svc = holder["svc"]
    keys = sum(f.index_count - 1 for f in svc.index_file_list)
    assert keys == 3 * N_BUILD
    svc.close()
    benchmark.extra_info.update(keys=keys, keys_per_s=round(keys / benchmark.stats.stats.mean))


@pytest.fixture(scope="module")
def query_store_dir(tmp_path_factory):
    """A store with N_STORE indexed messages (built once with cext: every backend writes the
    same bytes), then opened by each backend."""
    root = tmp_path_factory.mktemp("index-query") / "store"
    store = testing.open_store(root, testing.load_backend("cext"), _config(root),
                               clock=StepClock(1_800_000_000_000, 1))
    step = 10_000
    for i in range(0, N_STORE, step):
        store.put_messages(_messages(step, i))
    testing.wait_dispatched(store, 600)
    store.shutdown()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def query_store(query_store_dir, backend):
    store = MessageStore(query_store_dir, _config(query_store_dir), kernels=backend)
    store.load()
    yield store
    store.shutdown()


def test_query_message_single_hit(benchmark, backend, query_store):
    benchmark.group = f"query_message single hit, {N_STORE:,} indexed messages"
    rng = random.Random(5)
    keys = itertools.cycle([f"key-{rng.randrange(N_STORE)}" for _ in range(4096)])
    query = query_store.query_message

    def one():
        key = next(keys)
        r = query("BenchTopic", key)
        return r.messages[0].keys.split(" ")[0] == key and len(r.messages) == 1

    assert benchmark(one)
    benchmark.extra_info.update(messages=N_STORE,
                                queries_per_s=round(1 / benchmark.stats.stats.mean))


def test_index_lookup_kernel(benchmark, backend, query_store):
    benchmark.group = "index_lookup kernel, one key"
    f = query_store._indexer.index_file_list[0]
    h = backend.index_hash(b"BenchTopic#key-12345")
    out = np.empty(32, dtype=np.int64)
    assert benchmark(backend.index_lookup, f.mm, f.slot_num, f.index_num, h, 0, LONG_MAX, 32,
                     out) == 1
