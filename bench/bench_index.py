# SPDX-License-Identifier: Apache-2.0
"""IndexFile benchmarks, one table per operation (benchmark.group) comparing the backends:

- index build during dispatch: IndexService.dispatch over scanned CommitLog rows (keys/s in
  extra_info), default file geometry (5,000,000 slots, 20,000,000 entries);
- key lookup: query_message of a single-hit key on a store with N_STORE indexed messages
  (ROCKETSTORE_INDEX_KEYS=1M,10M for several sizes in one run, or ROCKETSTORE_BENCH_10M=1 for
  1 M and 10 M), including reading and decoding the hit (queries/s = 1 / mean), beside LMDB's
  key lookup over the same messages and keys, in the same group;
- the bare index_lookup kernel on that store's index file.

`pytest bench/bench_index.py --benchmark-only --benchmark-columns=mean,ops`
"""
import dataclasses
import itertools
import os
import random
import shutil
import struct

import numpy as np
import pytest

from rocketstore import MessageStore, StoreConfig, testing
from rocketstore import format as F
from rocketstore.clock import StepClock
from rocketstore.fs import DEFAULT as FS
from rocketstore.index_service import IndexService
from rocketstore.message import Message
from rocketstore.workload import check_puts, check_read_back, commitlog_bytes, sized_config

from bench_peers import decode_record, encode_record

try:
    import lmdb
except ImportError:        # pragma: no cover - the bench extra installs it
    lmdb = None

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
        holder["svc"] = IndexService(str(root), StoreConfig(), backend, FS, writable=True)
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
    benchmark.extra_info["keys"] = keys
    if benchmark.stats is not None:     # None under --benchmark-disable: ran once, untimed
        benchmark.extra_info["keys_per_s"] = round(keys / benchmark.stats.stats.mean)


def _query_sizes():
    """Indexed messages of the query stores: ROCKETSTORE_INDEX_KEYS, a comma-separated list
    of counts ("1000000,10000000"; "1M" and "10M" are read as millions), each a multiple of
    10,000; else 1 M, and 10 M too when ROCKETSTORE_BENCH_10M=1. A 10 M store and its LMDB
    twin take a few minutes to build and ~4.5 GB of disk (deleted after the module)."""
    spec = os.environ.get("ROCKETSTORE_INDEX_KEYS", "").strip()
    if not spec:
        sizes = [N_STORE]
        if os.environ.get("ROCKETSTORE_BENCH_10M") == "1":
            sizes.append(10 * N_STORE)
        return sizes
    sizes = []
    for part in spec.split(","):
        part = part.strip().upper()
        n = int(part[:-1]) * 1_000_000 if part.endswith("M") else int(part)
        if n <= 0 or n % 10_000:
            # the stores are filled 10,000 messages per put_messages call
            raise ValueError(f"ROCKETSTORE_INDEX_KEYS: {part} is not a positive multiple of "
                             "10,000")
        sizes.append(n)
    return sizes


def _check_sample(store, n, k=2000, seed=3):
    """Outside the timed region: each queue holds its share of the n messages put, and k
    random ones read back through their ConsumeQueue with the body and keys put (the whole
    list of 10 M messages is never held at once)."""
    per_queue = {q: len(range(q, n, 4)) for q in range(4)}
    for q, count in per_queue.items():
        assert store.get_max_offset_in_queue("BenchTopic", q) == count
    rng = random.Random(seed)
    for i in (rng.randrange(n) for _ in range(k)):
        want = _messages(1, i)[0]
        r = store.get_message("g", "BenchTopic", i % 4, i // 4, 1)
        assert r.messages and r.messages[0].body == want.body and \
            r.messages[0].keys == want.keys, i


def _build_lmdb(path, n, step):
    """LMDB over the same n messages as bench_peers stores them: key -> seq, and seq -> the
    peer record (encode_record), one write transaction per `step` messages."""
    env = lmdb.open(str(path), map_size=max(1 << 30, n * 512), max_dbs=2, sync=False,
                    metasync=False)
    log, idx = env.open_db(b"log"), env.open_db(b"keys")
    pack = struct.Struct(">Q").pack
    for start in range(0, n, step):
        with env.begin(write=True) as txn:
            for seq, m in enumerate(_messages(min(step, n - start), start), start):
                k = pack(seq)
                txn.put(k, encode_record(m), append=True, db=log)
                txn.put(m.properties["KEYS"].split(" ")[0].encode(), k, db=idx)
    with env.begin() as txn:
        assert txn.stat(idx)["entries"] == n and txn.stat(log)["entries"] == n
    return env, log, idx


def _size_id(n):
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"


@pytest.fixture(scope="module", params=_query_sizes(), ids=_size_id)
def query_store_dir(module_tmp, request):
    """A store with n indexed messages, each with a UNIQ_KEY and two KEYS pieces (built once
    with cext: every backend writes the same bytes, and then opened by each backend), and an
    LMDB environment holding the same messages by key; yields (root, config, n, lmdb)."""
    n = request.param
    root = module_tmp / f"index-query-{n}"
    step = 10_000
    sample = _messages(step, n - step)            # the longest keys: a bound per record
    # CommitLog files of at most 1 GiB (the default; an int field): 10 M records take three.
    mib = 1 << 20
    log_size = min(1 << 30, -(-(commitlog_bytes(sample, n // step) + mib) // mib) * mib)
    cfg = sized_config(sample, n // step, store_path_root_dir=str(root),
                       flush_interval_consume_queue=60_000,
                       mapped_file_size_commit_log=log_size)
    store = testing.open_store(root, testing.load_backend("cext"), cfg,
                               clock=StepClock(1_800_000_000_000, 1))
    for start in range(0, n, step):
        check_puts([store.put_messages(_messages(step, start))], step)
    if n <= N_STORE:
        check_read_back(store, _messages(n))
    else:
        _check_sample(store, n)
    store.shutdown()
    env = _build_lmdb(module_tmp / f"lmdb-{n}", n, step) if lmdb is not None else None
    yield root, cfg, n, env
    if env is not None:
        env[0].close()
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(module_tmp / f"lmdb-{n}", ignore_errors=True)


@pytest.fixture
def query_store(query_store_dir, backend):
    root, cfg, n, _ = query_store_dir
    store = MessageStore(root, cfg, kernels=backend)
    store.load()
    yield store
    store.shutdown()


def _random_keys(n, count=4096, seed=5):
    rng = random.Random(seed)
    return [f"key-{rng.randrange(n)}" for _ in range(count)]


class _Recorder:
    """Keeps the last 4096 answers a benchmarked call gave for its key, so they are checked
    after the timed region (the check itself is not what is measured)."""

    def __init__(self, keys):
        self.keys = keys
        self.answers = [None] * len(keys)
        self.i = 0

    def check(self, ok):
        done = [(k, a) for k, a in zip(self.keys, self.answers) if a is not None]
        assert done and all(ok(k, a) for k, a in done)
        return len(done)


def _warm(one, size):
    """One untimed pass over the keys, for rocketstore and LMDB alike: the first touch of each
    page of a fresh mapping is a page fault, paid once per process, and without this pass the
    benchmark with fewer rounds (the slower one) would carry more of them in its mean."""
    for _ in range(size):
        one()


@pytest.mark.parametrize("max_num", [1, 32])
def test_query_message_single_hit(benchmark, backend, query_store, query_store_dir, max_num):
    n = query_store_dir[2]
    benchmark.group = f"key lookup, {n:,} indexed messages, max_num={max_num}"
    rec = _Recorder(_random_keys(n))
    keys, answers, size = rec.keys, rec.answers, len(rec.keys)
    query = query_store.query_message

    def one():
        i = rec.i = (rec.i + 1) % size
        answers[i] = query("BenchTopic", keys[i], max_num)

    _warm(one, size)
    benchmark(one)
    checked = rec.check(lambda k, r: len(r.messages) == 1 and
                        r.messages[0].keys.split(" ")[0] == k)
    benchmark.extra_info.update(messages=n, checked=checked)
    # What the queries read, and the share of it mapped in 2 MiB folios, which depends on the
    # free memory the kernel had when the store was built: a chain walk's loads miss the TLB
    # less there (10 M keys in 4 KiB pages ran 1.13x slower; doc/performance.md, "Key
    # queries at 10 M"), so a run's figure is read with it.
    touched = testing.resident_bytes(query_store.root)
    benchmark.extra_info["resident_mb"] = touched >> 20
    benchmark.extra_info["pmd_mapped_share"] = round(
        testing.pmd_mapped_bytes(query_store.root) / max(touched, 1), 2)
    if benchmark.stats is not None:     # None under --benchmark-disable
        benchmark.extra_info["queries_per_s"] = round(1 / benchmark.stats.stats.mean)


@pytest.mark.skipif(lmdb is None, reason="py-lmdb is not installed (the bench extra)")
@pytest.mark.parametrize("max_num", [1, 32])
def test_lmdb_key_lookup(benchmark, query_store_dir, max_num):
    """The peer: LMDB's key -> seq -> record lookup over the same messages and keys, the
    record decoded (bench_peers' codec), in one read transaction held open across calls
    (LMDB's best case). max_num only names the group: a key has one value."""
    n = query_store_dir[2]
    env, log, idx = query_store_dir[3]
    benchmark.group = f"key lookup, {n:,} indexed messages, max_num={max_num}"
    rec = _Recorder([k.encode() for k in _random_keys(n)])
    keys, answers, size = rec.keys, rec.answers, len(rec.keys)
    with env.begin() as txn:
        get = txn.get

        def one():
            i = rec.i = (rec.i + 1) % size
            answers[i] = decode_record(get(get(keys[i], db=idx), db=log))

        _warm(one, size)
        benchmark(one)
    checked = rec.check(lambda k, r: r[2].split(" ")[0] == k.decode())
    benchmark.extra_info.update(messages=n, checked=checked)
    if benchmark.stats is not None:     # None under --benchmark-disable
        benchmark.extra_info["queries_per_s"] = round(1 / benchmark.stats.stats.mean)


def test_index_lookup_kernel(benchmark, backend, query_store):
    benchmark.group = "index_lookup kernel, one key"
    f = query_store.index_service.index_file_list[0]
    h = backend.index_hash(b"BenchTopic#key-12345")
    out = np.empty(32, dtype=np.int64)
    assert benchmark(backend.index_lookup, f.mm, f.slot_num, f.index_num, h, 0, LONG_MAX, 32,
                     out) == 1
