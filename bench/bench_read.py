# SPDX-License-Identifier: Apache-2.0
"""Reading a queue: get_message (decoded MessageExt) and get_batch (numpy columns and body
views), against py-lmdb's raw in-order cursor over the same records, at two backlogs.

    python -m pytest bench/bench_read.py --benchmark-only -q --benchmark-columns=mean,ops

One store holds N + 1 024 messages (ROCKETSTORE_READ_N, default 1 000 000) of 128-byte bodies
in one queue, built once with the cext backend. A consumer with backlog B reads from queue
offset max - B: each timed round pulls the 1 024 messages there, as 32 pulls of 32 (or one of
1 024), so every variant reads the same records and only the backlog behind them differs
(1 024, i.e. about 1 k, and N). get_message_fields also reads each message's body and
queue offset, as GetBench's decoded variant does (a MessageExt makes them on first use). The
old get_message copied the queue's tail to the end of its
file on every call; this bench shows whether the rate still depends on the backlog.

The peer is an LMDB database holding the same CommitLog record bytes, keyed by queue offset
(8-byte big-endian): a pull is one cursor positioned at its first offset (set_key) and
stepped in order, values returned as bytes, in one read transaction per round. Ratios against
it (>1: faster than the cursor) go into extra_info["x_lmdb"] (mean rounds) and
["x_lmdb_best"] (fastest rounds), taken from the LMDB rates measured earlier in the same run.

extra_info["thread_cpu_ns_per_msg"] is the reading thread's CPU time per message over all rounds
(bench/java/GetBench reports the same for the Java store).

Groups: "read: pull 32" and "read: pull 1024" per backlog. Every round's last pull is checked
against the bodies put there, outside the timed region; the store is read back (sampled) once
per backend and deleted at the end of the module.
"""
import gc
import os
import shutil
import struct

import pytest

from rocketstore import MessageStore, GetMessageStatus
from rocketstore import format as F
from rocketstore.workload import check_puts, check_read_back, make_messages, sized_config

try:
    import lmdb
except ImportError:        # pragma: no cover - the bench extra installs it
    lmdb = None

N = int(os.environ.get("ROCKETSTORE_READ_N", "1000000"))
WINDOW = 1024                      # messages read per timed round
TOTAL = N + WINDOW
TOPIC = "BenchTopic0"
BACKLOGS = (WINDOW, N)
PULLS = (32, 1024)
_PEER_RATE = {}                    # (backlog, pull) -> LMDB msgs/s measured in this run
_KEY = struct.Struct(">Q")


@pytest.fixture(scope="module")
def workload(module_tmp):
    """(store directory, config, messages, lmdb env): built once for the module."""
    msgs = make_messages(TOTAL, queues=1)
    cfg = sized_config(msgs)
    root = module_tmp / "store"
    store = MessageStore(root, cfg, kernels="cext")
    store.load()
    store.start()
    results = [store.put_messages(msgs[i:i + 1000]) for i in range(0, TOTAL, 1000)]
    check_puts(results, TOTAL)
    check_read_back(store, msgs)
    env = None
    if lmdb is not None:
        env = lmdb.open(str(module_tmp / "lmdb"), map_size=8 << 30, sync=False,
                        metasync=False)
        rows = __import__("numpy").empty(4096, dtype=F.SCAN_DTYPE)
        seq = 0
        for mf in store.commitlog.mfq.files:
            pos = 0
            while True:
                n, stop, reason, _ = store.kernels.commitlog_scan(mf.mm, pos, mf.read_position,
                                                                  False, rows)
                with env.begin(write=True) as txn:
                    for p, size in zip(rows["pos"][:n].tolist(), rows["size"][:n].tolist()):
                        txn.put(_KEY.pack(seq), mf.mm[p:p + size], append=True)
                        seq += 1
                pos = stop
                if reason != F.SCAN_END or n == 0:
                    break
        assert seq == TOTAL
    store.shutdown()
    # The million messages just made reached the oldest GC generation: without a collection
    # here, the first benchmark that allocates would pay a full one over all of them (measured:
    # 54 rounds instead of thousands, twice the thread CPU per message).
    gc.collect()
    yield root, cfg, msgs, env
    if env is not None:
        env.close()
    shutil.rmtree(root, ignore_errors=True)


def _open(root, cfg, backend):
    store = MessageStore(root, cfg, kernels=backend)
    store.load()
    store.start()
    return store


def _expect(msgs, start, pull):
    """The bodies of the last pull of a round starting at queue offset `start`."""
    last = start + WINDOW - pull
    return [m.body for m in msgs[last:last + pull]]


@pytest.mark.parametrize("pull", PULLS)
@pytest.mark.parametrize("backlog", BACKLOGS)
def test_lmdb_cursor(benchmark, workload, backlog, pull, thread_cpu):
    if lmdb is None:
        pytest.skip("py-lmdb is not installed (pip install -e '.[bench]')")
    _, _, msgs, env = workload
    start = TOTAL - backlog
    benchmark.group = f"read: pull {pull}, backlog {backlog:,}"

    def round_():
        with env.begin(buffers=False) as txn:
            cur = txn.cursor()
            for off in range(start, start + WINDOW, pull):
                cur.set_key(_KEY.pack(off))
                got = [cur.value()]
                nxt, value = cur.next, cur.value
                for _ in range(pull - 1):
                    nxt()
                    got.append(value())
        return got
    got = benchmark(thread_cpu.wrap(round_))
    thread_cpu.record(benchmark, WINDOW)
    # A CommitLog record ends with its body, topic and properties: the body is in there.
    want = _expect(msgs, start, pull)
    assert len(got) == pull and all(w in g for w, g in zip(want, got))
    _PEER_RATE[(backlog, pull)] = _rates(benchmark)
    _record(benchmark, backlog, pull)


def _rates(benchmark):
    """msgs/s from the mean round and from the fastest (on a loaded machine the fastest
    round is the one least disturbed by other processes)."""
    stats = benchmark.stats.stats
    return WINDOW / stats.mean, WINDOW / stats.min


def _record(benchmark, backlog, pull):
    mean, best = _rates(benchmark)
    benchmark.extra_info["msgs_per_s"] = round(mean)
    benchmark.extra_info["msgs_per_s_best"] = round(best)
    peer = _PEER_RATE.get((backlog, pull))
    if peer:
        benchmark.extra_info["x_lmdb"] = round(mean / peer[0], 3)
        benchmark.extra_info["x_lmdb_best"] = round(best / peer[1], 3)


def _bench_pulls(benchmark, workload, backend, backlog, pull, thread_cpu, make_round, check):
    """Time one round of `make_round(store, start)` (WINDOW messages pulled `pull` at a time
    from `backlog` behind the queue's end) on a store opened with `backend`, then
    `check(result, msgs, start)` with what the round returned, outside the timed region."""
    root, cfg, msgs, _ = workload
    store = _open(root, cfg, backend)
    try:
        start = TOTAL - backlog
        benchmark.group = f"read: pull {pull}, backlog {backlog:,}"
        out = benchmark(thread_cpu.wrap(make_round(store, start)))
        thread_cpu.record(benchmark, WINDOW)
        check(store, out, msgs, start)
        _record(benchmark, backlog, pull)
    finally:
        store.shutdown()


@pytest.mark.parametrize("pull", PULLS)
@pytest.mark.parametrize("backlog", BACKLOGS)
def test_get_message(benchmark, workload, backend, backlog, pull, thread_cpu):
    def make_round(store, start):
        get = store.get_message

        def round_():
            for off in range(start, start + WINDOW, pull):
                r = get("bench", TOPIC, 0, off, pull)
            return r
        return round_

    def check(store, r, msgs, start):
        assert r.status is GetMessageStatus.FOUND
        assert [m.body for m in r.messages] == _expect(msgs, start, pull)
        check_read_back(store, msgs, sample=200)
    _bench_pulls(benchmark, workload, backend, backlog, pull, thread_cpu, make_round, check)


@pytest.mark.parametrize("pull", PULLS)
@pytest.mark.parametrize("backlog", BACKLOGS)
def test_get_message_fields(benchmark, workload, backend, backlog, pull, thread_cpu):
    """get_message, then each message's body and queue offset read, as bench/java/GetBench's
    decoded variant reads them: a MessageExt makes those fields on first use."""
    def make_round(store, start):
        get = store.get_message

        def round_():
            sink = 0
            for off in range(start, start + WINDOW, pull):
                r = get("bench", TOPIC, 0, off, pull)
                for m in r.messages:
                    sink += len(m.body) + m.queue_offset
            return r, sink
        return round_

    def check(store, out, msgs, start):
        r, sink = out
        assert r.status is GetMessageStatus.FOUND
        assert [m.body for m in r.messages] == _expect(msgs, start, pull)
        assert sink == sum(len(m.body) for m in msgs[start:start + WINDOW]) + sum(
            range(start, start + WINDOW))
    _bench_pulls(benchmark, workload, backend, backlog, pull, thread_cpu, make_round, check)


@pytest.mark.parametrize("pull", PULLS)
@pytest.mark.parametrize("backlog", BACKLOGS)
def test_get_batch(benchmark, workload, backend, backlog, pull, thread_cpu):
    def make_round(store, start):
        get = store.get_batch

        def round_():
            for off in range(start, start + WINDOW, pull):
                r = get("bench", TOPIC, 0, off, pull)
            return r
        return round_

    def check(store, r, msgs, start):
        assert r.status is GetMessageStatus.FOUND
        assert [bytes(b) for b in r.bodies()] == _expect(msgs, start, pull)
        r.release()
    _bench_pulls(benchmark, workload, backend, backlog, pull, thread_cpu, make_round, check)
