# SPDX-License-Identifier: Apache-2.0
"""What durability costs: SYNC_FLUSH batches and threads against a bare fdatasync, ASYNC_FLUSH
against no flush service at all, and abnormal recovery speed (with CRC check)."""
import os
import threading
import time

import pytest

from rocketstore import FlushDiskType, MessageStore, StoreConfig
from rocketstore.workload import make_messages

N = 20_000
BATCH = 1000


def _store(root, backend, **kw):
    cfg = StoreConfig(mapped_file_size_commit_log=256 << 20, **kw)
    s = MessageStore(root, cfg, kernels=backend)
    s.load()
    s.start()
    return s


def test_sync_flush_put_messages(benchmark, backend, tmp_path):
    store = _store(tmp_path / "s", backend, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    batches = [make_messages(BATCH, start=i) for i in range(0, N, BATCH)]

    def run():
        for b in batches:
            assert store.put_messages(b).status.name == "PUT_OK"
    benchmark.group = "SYNC_FLUSH put_messages (batches of 1000)"
    benchmark.extra_info["messages"] = N
    try:
        benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    finally:
        store.shutdown()


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
def test_sync_flush_put_message_threads(benchmark, backend, tmp_path, threads):
    store = _store(tmp_path / "s", backend, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    per_thread = 300
    msgs = make_messages(threads * per_thread)
    latencies = []

    def worker(chunk):
        local = []
        for m in chunk:
            t0 = time.perf_counter()
            store.put_message(m)
            local.append((time.perf_counter() - t0) * 1e6)
        latencies.extend(local)

    def run():
        ts = [threading.Thread(target=worker, args=(msgs[i::threads],)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    benchmark.group = "SYNC_FLUSH put_message from 16 threads"
    benchmark.extra_info["messages"] = len(msgs)
    try:
        benchmark.pedantic(run, rounds=3, iterations=1)
    finally:
        store.shutdown()
    latencies.sort()
    benchmark.extra_info["put_p99_us"] = round(latencies[int(0.99 * len(latencies))], 1)
    benchmark.extra_info["fdatasync_p99_us"] = round(_fdatasync_p99_us(str(tmp_path)), 1)


@pytest.mark.parametrize("flusher", ["async flush", "no flush service"])
def test_async_flush_overhead(benchmark, backend, tmp_path, flusher):
    store = _store(tmp_path / "s", backend, flush_interval_commit_log=50)
    if flusher == "no flush service":
        store.flush_service.shutdown()
    batches = [make_messages(BATCH, start=i) for i in range(0, N, BATCH)]

    def run():
        for b in batches:
            store.put_messages(b)
    benchmark.group = "ASYNC_FLUSH vs no flush service (put_messages)"
    benchmark.extra_info["messages"] = N
    try:
        benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    finally:
        store.shutdown()


def _filled_store(root, backend, count):
    """A closed store holding `count` 1 KiB messages; returns its CommitLog size."""
    store = _store(root, backend)
    for i in range(0, count, BATCH):
        store.put_messages(make_messages(BATCH, body_size=1024, start=i))
    size = store.get_max_phy_offset()
    store.shutdown()
    return size


def _open_and_close(root, backend, expect_normal):
    s = MessageStore(root, StoreConfig(mapped_file_size_commit_log=256 << 20), kernels=backend)
    s.load()
    assert s.recovery_report.normal is expect_normal
    s.shutdown()


def test_abnormal_recovery_with_crc(benchmark, backend, tmp_path):
    root = tmp_path / "s"
    size = _filled_store(root, backend, 200_000)

    def crash():
        (root / "abort").write_bytes(b"")          # as if the process had died

    benchmark.group = "abnormal recovery (CRC checked)"
    benchmark.extra_info["commitlog_bytes"] = size
    benchmark.pedantic(_open_and_close, args=(root, backend, False), setup=crash, rounds=3,
                       iterations=1)


def test_clean_restart(benchmark, backend, tmp_path):
    root = tmp_path / "s"
    size = _filled_store(root, backend, 100_000)
    benchmark.group = "clean restart"
    benchmark.extra_info["commitlog_bytes"] = size
    benchmark.pedantic(_open_and_close, args=(root, backend, True), rounds=3, iterations=1)
