# SPDX-License-Identifier: Apache-2.0
"""What durability costs: SYNC_FLUSH batches and threads against a bare fdatasync, ASYNC_FLUSH
against no flush service at all, and abnormal recovery speed (with CRC check)."""
import os
import threading
import time

import pytest

from rocketstore import FlushDiskType, MessageStore
from rocketstore.workload import check_puts, check_read_back, make_messages, sized_config

N = 20_000
BATCH = 1000


def test_sync_flush_put_messages(benchmark, backend, store_factory):
    msgs = make_messages(N)
    store = store_factory(backend, msgs, 4, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    batches = [msgs[i:i + BATCH] for i in range(0, N, BATCH)]
    results = []
    keep = results.append

    def run():
        for b in batches:
            keep(store.put_messages(b))
    benchmark.group = "SYNC_FLUSH put_messages (batches of 1000)"
    benchmark.extra_info["messages"] = N
    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    runs = len(results) // len(batches)
    check_puts(results, runs * N)
    check_read_back(store, msgs, runs)


def _fdatasync_p99_us(directory, rounds=200):
    path = os.path.join(directory, "probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    samples = []
    try:
        for i in range(rounds):
            os.pwrite(fd, b"x" * 512, (i * 512) % (1 << 20))
            t0 = time.perf_counter()
            os.fdatasync(fd)
            samples.append((time.perf_counter() - t0) * 1e6)
    finally:
        os.close(fd)
    samples.sort()
    return samples[int(0.99 * len(samples))]


@pytest.mark.parametrize("threads", [16])
def test_sync_flush_put_message_threads(benchmark, backend, tmp_path, store_factory, threads):
    per_thread = 300
    msgs = make_messages(threads * per_thread)
    store = store_factory(backend, msgs, 3, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    latencies = []
    results = []

    def worker(chunk):
        local = []
        done = []
        for m in chunk:
            t0 = time.perf_counter()
            done.append(store.put_message(m))
            local.append((time.perf_counter() - t0) * 1e6)
        latencies.extend(local)
        results.extend(done)

    def run():
        ts = [threading.Thread(target=worker, args=(msgs[i::threads],)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    benchmark.group = "SYNC_FLUSH put_message from 16 threads"
    benchmark.extra_info["messages"] = len(msgs)
    benchmark.pedantic(run, rounds=3, iterations=1)
    runs = len(results) // len(msgs)
    check_puts(results, runs * len(msgs))
    check_read_back(store, msgs, runs, ordered=False)
    latencies.sort()
    benchmark.extra_info["put_p99_us"] = round(latencies[int(0.99 * len(latencies))], 1)
    benchmark.extra_info["fdatasync_p99_us"] = round(_fdatasync_p99_us(str(tmp_path)), 1)


@pytest.mark.parametrize("flusher", ["async flush", "no flush service"])
def test_async_flush_overhead(benchmark, backend, store_factory, flusher):
    msgs = make_messages(N)
    store = store_factory(backend, msgs, 6, flush_interval_commit_log=50)
    if flusher == "no flush service":
        store.flush_service.shutdown()
    batches = [msgs[i:i + BATCH] for i in range(0, N, BATCH)]
    results = []
    keep = results.append

    def run():
        for b in batches:
            keep(store.put_messages(b))
    benchmark.group = "ASYNC_FLUSH vs no flush service (put_messages)"
    benchmark.extra_info["messages"] = N
    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    runs = len(results) // len(batches)
    check_puts(results, runs * N)
    check_read_back(store, msgs, runs)


def _filled_store(root, backend, count):
    """A closed store holding `count` 1 KiB messages, every one checked; returns its config,
    CommitLog size and messages."""
    msgs = make_messages(count, body_size=1024)
    cfg = sized_config(msgs)
    with MessageStore(root, cfg, kernels=backend) as store:
        check_puts([store.put_messages(msgs[i:i + BATCH]) for i in range(0, count, BATCH)],
                   count)
        check_read_back(store, msgs)
        size = store.get_max_phy_offset()
    return cfg, size, msgs


def _open_and_close(root, cfg, backend, expect_normal):
    s = MessageStore(root, cfg, kernels=backend)
    s.load()
    assert s.recovery_report.normal is expect_normal
    s.shutdown()


def _check_recovered(root, cfg, backend, size, msgs):
    with MessageStore(root, cfg, kernels=backend) as store:
        assert store.get_max_phy_offset() == size
        check_read_back(store, msgs)


def test_abnormal_recovery_with_crc(benchmark, backend, tmp_path):
    root = tmp_path / "s"
    cfg, size, msgs = _filled_store(root, backend, 200_000)

    def crash():
        (root / "abort").write_bytes(b"")          # as if the process had died

    benchmark.group = "abnormal recovery (CRC checked)"
    benchmark.extra_info["commitlog_bytes"] = size
    benchmark.pedantic(_open_and_close, args=(root, cfg, backend, False), setup=crash,
                       rounds=3, iterations=1)
    _check_recovered(root, cfg, backend, size, msgs)


def test_clean_restart(benchmark, backend, tmp_path):
    root = tmp_path / "s"
    cfg, size, msgs = _filled_store(root, backend, 100_000)
    benchmark.group = "clean restart"
    benchmark.extra_info["commitlog_bytes"] = size
    benchmark.pedantic(_open_and_close, args=(root, cfg, backend, True), rounds=3,
                       iterations=1)
    _check_recovered(root, cfg, backend, size, msgs)
