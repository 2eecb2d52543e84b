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
from rocketstore.workload import check_puts, check_read_back, sized_config

N_BUILD = 100_000          # records per build round, each with UNIQ_KEY + 2 KEYS pieces
N_STORE = 1_000_000        # indexed messages in the query store
LONG_MAX = (1 << 63) - 1


def _messages(n, start=0):
    return [Message("BenchTopic", b"x" * 32, tags="TagA", keys=f"key-{i} grp-{i % 100}",
                    queue_id=i % 4, properties={"UNIQ_KEY": f"7F0000010000{i:020X}"},
                    born_timestamp=1_700_000_000_000 + i) for i in range(start, start + n)]


def _config(root, msgs):
    """Default index geometry (what is measured); the CommitLog sized to `msgs`."""
    return sized_config(msgs, store_path_root_dir=str(root), flush_interval_consume_queue=60_000)


@pytest.fixture(scope="module")
def build_log(module_tmp):
    """A CommitLog of N_BUILD records, and its scanned rows in reput-sized batches."""
    root = module_tmp / "index-build"
    msgs = _messages(N_BUILD)
    store = testing.open_store(root, testing.load_backend("cext"),
                               dataclasses.replace(_config(root, msgs),
                                                   message_index_enable=False),
                               clock=StepClock(1_800_000_000_000, 1))
    check_puts([store.put_messages(msgs[i:i + 1000]) for i in range(0, N_BUILD, 1000)], N_BUILD)
    check_read_back(store, msgs)
    mf = store.commitlog.mfq.files[0]
    rows = np.empty(N_BUILD, dtype=F.SCAN_DTYPE)
    n, *_ = store.kernels.commitlog_scan(mf.mm, 0, mf.read_position, False, rows)
    assert n == N_BUILD
    data = bytes(mf.mm[:mf.read_position])
    store.shutdown()
    shutil.rmtree(root)
    batches = [rows[i:i + 4096].tolist() for i in range(0, n, 4096)]
    return data, batches


def test_index_build_during_dispatch(benchmark, backend, build_log, tmp_path):
    data, batches = build_log
    benchmark.group = "index build during dispatch (keys/s = keys / mean)"
    rounds = itertools.count()
    holder = {}

    def check_and_drop():
        """The last round indexed every key; its files leave the disk."""
        if "svc" in holder:
            svc = holder.pop("svc")
            keys = sum(f.index_count - 1 for f in svc.index_file_list)
            svc.close()
            shutil.rmtree(holder["root"])
            assert keys == 3 * N_BUILD
            return keys

    def setup():
        check_and_drop()
        root = holder["root"] = tmp_path / f"r{next(rounds)}"
        root.mkdir()
        fake = types.SimpleNamespace(kernels=backend, fs=FS, root=str(root), writable=True,
                                     config=StoreConfig(), checkpoint=None)
        holder["svc"] = IndexService(fake)
        return (holder["svc"],), {}

    def run(svc):
        for rows in batches:
            svc.dispatch(rows, data)

    try:
        benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
        keys = check_and_drop()
    finally:
        if "svc" in holder:
            holder.pop("svc").close()
    benchmark.extra_info.update(keys=keys, keys_per_s=round(keys / benchmark.stats.stats.mean))


@pytest.fixture(scope="module")
def query_store_dir(module_tmp):
    """A store with N_STORE indexed messages (built once with cext: every backend writes the
    same bytes), then opened by each backend; yields its root and config."""
    root = module_tmp / "index-query"
    msgs = _messages(N_STORE)
    cfg = _config(root, msgs)
    store = testing.open_store(root, testing.load_backend("cext"), cfg,
                               clock=StepClock(1_800_000_000_000, 1))
    step = 10_000
    check_puts([store.put_messages(msgs[i:i + step]) for i in range(0, N_STORE, step)],
               N_STORE)
    check_read_back(store, msgs)
    store.shutdown()
    yield root, cfg
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def query_store(query_store_dir, backend):
    root, cfg = query_store_dir
    store = MessageStore(root, cfg, kernels=backend)
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
