# SPDX-License-Identifier: Apache-2.0
"""What one sync of bytes written through a shared mapping costs, beside `pwrite + fdatasync` of
the same bytes, while another thread of the process runs on the other core (as a store's
producers, reput and allocator threads do). Writing back a page mapped writable write-protects
it with a TLB flush that interrupts every core running a thread of the process;
FileSystem.unmap_written takes the synced range off the page tables first, one flush for all
of it. `extra_info["vs_pwrite"]` is each variant's time over the same run's pwrite + fdatasync
(> 1 is slower). Every round writes a fresh range of a file whose blocks are allocated, and the
bytes are read back through a fresh descriptor after the timed rounds."""
import hashlib
import os
import threading

import pytest

from rocketstore import kernels as K
from rocketstore.fs import FileSystem

CHUNK = 253 * 1024          # a SYNC_FLUSH batch of 1000 records of 128 B bodies
ROUNDS = 60
SIZE = (ROUNDS + 2) * CHUNK + (1 << 20)
GROUP = f"one sync of {CHUNK // 1024} KB, another thread busy"
_pwrite = {}


@pytest.fixture
def busy_thread():
    """A thread keeping the other core busy without the GIL (hashlib on 16 MiB releases it)."""
    stop = threading.Event()
    data = bytes(16 << 20)

    def spin():
        while not stop.is_set():
            hashlib.sha256(data).digest()
    t = threading.Thread(target=spin, daemon=True)
    t.start()
    yield
    stop.set()
    t.join()


def _file(tmp_path, name):
    path = str(tmp_path / name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, SIZE)
    os.fsync(fd)
    return path, fd


def _check(path, rounds, data):
    fd = os.open(path, os.O_RDONLY)
    try:
        for r in range(rounds):
            assert os.pread(fd, CHUNK, r * CHUNK) == data
    finally:
        os.close(fd)


def test_pwrite_fdatasync(benchmark, tmp_path, busy_thread):
    path, fd = _file(tmp_path, "pwrite.bin")
    data = b"p" * CHUNK
    state = {"round": 0}

    def run():
        os.pwrite(fd, data, state["round"] * CHUNK)
        os.fdatasync(fd)
        state["round"] += 1
    benchmark.group = GROUP
    benchmark.name = "pwrite + fdatasync"
    try:
        benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    finally:
        os.close(fd)
    _check(path, state["round"], data)
    if benchmark.stats is not None:
        _pwrite["mean"] = benchmark.stats.stats.mean


@pytest.mark.parametrize("drop", [False, True], ids=["msync", "off the page tables, msync"])
def test_mapped_write_and_sync(benchmark, tmp_path, busy_thread, drop):
    kernels = K.load(K.available()[0])
    fs = FileSystem()
    path, fd = _file(tmp_path, "mapped.bin")
    os.close(fd)
    mm = fs.map(path, SIZE, kernels=kernels)
    # As the allocator leaves a CommitLog file: advised MADV_RANDOM, populated ahead.
    fs.advise_random(mm, True)
    fs.prefault(mm, 0, SIZE)
    data = b"m" * CHUNK
    state = {"round": 0}

    def run():
        start = state["round"] * CHUNK
        mm[start:start + CHUNK] = data
        if drop:
            lo = start - start % 4096
            end = start + CHUNK
            fs.unmap_written(mm, lo, end - end % 4096 - lo)
        fs.sync_mapped(kernels, mm, path, start, CHUNK)
        state["round"] += 1
    benchmark.group = GROUP
    benchmark.name = f"write through the mapping, {'off the page tables, ' if drop else ''}msync"
    benchmark.extra_info["backend"] = kernels.__name__.rsplit(".", 1)[-1]
    try:
        benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    finally:
        mm.close()
    _check(path, state["round"], data)
    if benchmark.stats is not None and "mean" in _pwrite:
        benchmark.extra_info["vs_pwrite"] = round(benchmark.stats.stats.mean / _pwrite["mean"], 2)
