# SPDX-License-Identifier: Apache-2.0
"""First-touch page faults and the slowest put, writing into a fresh store (cext): the
allocator populating the CommitLog window ahead of the writer ("prefault on", the default)
against `prefault_next_file=False` ("prefault off"), beside two ceilings: the same puts into a
file reserved and populated whole before the timed region ("populated"), and a plain write of
the same record bytes into a warm (populated) mapping ("warm mmap write").

Each round opens a new store and waits until the allocator has made its first file (and, with
prefault on, populated its first window), as a broker starts before producers arrive. The
writer is the benchmark's own thread: its minor faults (getrusage RUSAGE_THREAD) are counted
around the timed puts. extra_info: faults_per_mib per round, max_put_ms and p99_put_ms over all
rounds, and mib written per round; "populated" shows the faults left that are not first
touches of the file (the interpreter's own heap)."""
import array
import os
import resource
import shutil
import time

import pytest

from rocketstore import Message, PutMessageStatus, testing
from rocketstore.workload import check_puts, check_read_back

BODY = 1024
BATCH = 1000
CALLS = 48                  # put_batch: 48 x 1000 x 1 KiB, about 50 MiB per round
SINGLES = 20_000            # put_message: about 21 MiB per round
ROUNDS = 3
MiB = 1 << 20
TOPIC = "PopulateTopic"


def _minflt():
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _messages(n):
    return [Message(TOPIC, bytes([65 + i % 26]) * BODY, queue_id=0, born_timestamp=1)
            for i in range(n)]


def _wait_first_file(store, populated, timeout=30.0):
    """Until the allocator has made the first CommitLog file and, when it populates, brought
    its first window in."""
    path = store.commitlog.mfq.path_to_create(0)
    want = min(store.config.commit_log_reserve_window, store.commitlog.file_size) \
        if populated else 0
    deadline = time.monotonic() + timeout
    while not (os.path.exists(path) and testing.resident_bytes(path) >= want):
        assert time.monotonic() < deadline, "the allocator did not prepare the first file"
        time.sleep(0.001)


def _populate_whole(store):
    cl = store.commitlog
    mf = cl.mfq.get_last_mapped_file(0)
    mf.reserve(cl.file_size)
    store.fs.prefault(mf.mm, 0, cl.file_size)


def _timed(put, calls):
    """Run put(i) `calls` times: (per-call seconds, bytes written per call, results that
    failed, messages stored, writer-thread minor faults). Nothing is kept per call but
    numbers in arrays sized up front: a heap growing into fresh pages (a result object per
    put kept alive) would add faults that are not the file's."""
    lat = array.array("d", bytes(8 * calls))
    wrote = array.array("q", bytes(8 * calls))
    failed = []
    stored = 0
    f0 = _minflt()
    for i in range(calls):
        t = time.perf_counter()
        r = put(i)
        lat[i] = time.perf_counter() - t
        if r.status is not PutMessageStatus.PUT_OK:
            failed.append(r)
        wrote[i] = r.wrote_bytes
        stored += getattr(r, "count", 1)
    return lat, wrote, failed, stored, _minflt() - f0


def _report(benchmark, rounds):
    lat = sorted(x for r in rounds for x in r["lat"])
    benchmark.extra_info["mib"] = round(rounds[0]["bytes"] / MiB, 1)
    benchmark.extra_info["faults_per_mib"] = [round(r["faults"] * MiB / r["bytes"], 2)
                                              for r in rounds]
    benchmark.extra_info["max_put_ms"] = round(lat[-1] * 1e3, 3)
    benchmark.extra_info["p99_put_ms"] = round(lat[int(len(lat) * 0.99)] * 1e3, 3)


def _workload(op):
    """(messages, rounds, put(store, i), calls): what one round puts, as a store sizes it."""
    if op == "put_batch":
        msgs = _messages(BATCH)
        bodies = [m.body for m in msgs]
        return msgs, CALLS, (lambda store, i: store.put_batch(TOPIC, 0, bodies,
                                                             born_timestamp=1)), CALLS
    msgs = _messages(SINGLES)
    return msgs, 1, (lambda store, i: store.put_message(msgs[i])), SINGLES


def _group(op):
    return f"fresh store, {op} of 1 KiB bodies: writer faults and slowest put"


def _store_run(benchmark, store_factory, mode, op):
    backend = testing.load_backend("cext")
    msgs, n, put, calls = _workload(op)
    state = {"rounds": []}

    def setup():
        old = state.pop("store", None)
        if old is not None:       # only the last round's store is read back: free the disk
            old.shutdown()
            shutil.rmtree(old.root, ignore_errors=True)
        store = store_factory(backend, msgs, n, prefault_next_file=mode != "prefault off")
        _wait_first_file(store, mode != "prefault off")
        if mode == "populated":
            _populate_whole(store)
        state["store"] = store
        return (store,), {}

    def run(store):
        lat, wrote, failed, stored, faults = _timed(lambda i: put(store, i), calls)
        state["rounds"].append({"lat": lat, "faults": faults, "bytes": sum(wrote),
                                "failed": failed, "stored": stored})

    benchmark.group = _group(op)
    benchmark.pedantic(run, setup=setup, rounds=ROUNDS, iterations=1)
    _report(benchmark, state["rounds"])
    for r in state["rounds"]:
        check_puts(r["failed"])
        assert r["stored"] == len(msgs) * n
    check_read_back(state["store"], msgs, n)


@pytest.mark.parametrize("mode", ["prefault on", "prefault off", "populated"])
@pytest.mark.parametrize("op", ["put_batch", "put_message"])
def test_fresh_store_writer_faults(benchmark, store_factory, mode, op):
    _store_run(benchmark, store_factory, mode, op)


@pytest.mark.parametrize("op", ["put_batch", "put_message"])
def test_warm_mmap_write_of_the_same_bytes(benchmark, store_factory, tmp_path, op):
    """The ceiling: the records one round of puts wrote, copied again into a mapping whose
    every page is reserved and populated, one slice assignment per put."""
    backend = testing.load_backend("cext")
    msgs, n, put, calls = _workload(op)
    store = store_factory(backend, msgs, n)
    results = [put(store, i) for i in range(calls)]
    check_puts(results, len(msgs) * n)
    sizes = [r.wrote_bytes for r in results]
    data = store.commitlog.get_data(0, sum(sizes))
    assert data is not None and len(data) == sum(sizes)
    path = str(tmp_path / "warm")
    fs = store.fs
    fs.create_sized(path, len(data))
    mm = fs.map(path, len(data), kernels=backend)
    view = memoryview(data)
    rounds = []
    try:
        fs.reserve(path, 0, len(data))
        fs.prefault(mm, 0, len(data))
        offs = [0]
        for size in sizes:
            offs.append(offs[-1] + size)

        def write(i):
            mm[offs[i]:offs[i + 1]] = view[offs[i]:offs[i + 1]]
            return results[i]

        def run():
            lat, _, _, _, faults = _timed(write, calls)
            rounds.append({"lat": lat, "faults": faults, "bytes": len(data)})
        benchmark.group = _group(op)
        benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
        _report(benchmark, rounds)
        assert mm[:len(data)] == data          # every round's copy read back
    finally:
        view.release()
        mm.close()
        fs.remove(path)
