# SPDX-License-Identifier: Apache-2.0
"""The CommitLog's flushed bytes farther behind its end than the in-memory window leave the
page cache (StoreConfig.drop_cold_commit_log_cache): the writer's next pages then reuse their
memory. What is nearer stays cached, and every message still reads back, from the disk. The
window is the store's mem_limit: access_message_in_memory_max_ratio of the memory the process
may use (a container's limit where lower), past which a read counts a message as on disk.
(Which ranges are evicted, and when again: test_mapped_file_queue.py.)"""
import os
import time

import pytest

from rocketstore import FlushDiskType, Message, testing
from rocketstore.format import CQ_UNIT
from rocketstore.fs import FileSystem, machine_memory
from rocketstore.index_file import IndexFile
from rocketstore.mapped_file import MappedFile

MiB = 1 << 20
FILE = 1 * MiB
PAGE = 4096


def _config(**kw):
    return testing.small_config(**{"mapped_file_size_commit_log": FILE,
                                   "commit_log_reserve_window": 256 * 1024,
                                   "flush_disk_type": FlushDiskType.ASYNC_FLUSH, **kw})


def _fill(store, files):
    """Put messages until the CommitLog holds `files` full files and part of one more;
    returns (physical offset, body) of each."""
    put = []
    i = 0
    while store.commitlog.max_offset < files * FILE + FILE // 2:
        body = b"%06d" % i + b"c" * 2000
        r = store.put_message(Message("ColdTopic", body))
        assert r.ok
        put.append((r.commit_log_offset, body))
        i += 1
    return put


# Each way the CommitLog is written and made durable: puts into the mapping flushed every
# 500 ms, puts synced before they return, puts into write buffers committed with pwrite.
WRITES = {
    "async": {},
    "sync": {"flush_disk_type": FlushDiskType.SYNC_FLUSH},
    "write_buffers": {"transient_store_pool_enable": True, "transient_store_pool_size": 4},
}


@pytest.mark.parametrize("writes", sorted(WRITES))
def test_flushed_bytes_behind_the_in_memory_window_leave_the_page_cache_and_still_read_back(
        disk_path, backend, writes):
    store = testing.open_store(disk_path / "s", backend, config=_config(**WRITES[writes]))
    try:
        store.mem_limit = FILE          # a 1 MiB in-memory window
        put = _fill(store, 4)
        assert store.flush() >= store.commitlog.max_offset
        files = store.commitlog.mfq.files
        end = store.commitlog.max_offset
        # Not the first file: the runtime statistics read its first record's store time
        # every second (earliestMessageTimeStamp), and that read brings a readahead window
        # of it back.
        cold = [mf for mf in files[1:] if mf.file_from_offset + mf.file_size <= end - FILE]
        assert len(cold) >= 2
        testing.wait_until(lambda: all(testing.cached_bytes(mf.path) == 0 for mf in cold))
        # The window itself stays: the last file's written pages are still cached.
        last = files[-1]
        assert testing.cached_bytes(last.path) >= last.wrote_position - PAGE
        for offset, body in put:
            assert store.look_message_by_offset(offset).body == body
    finally:
        store.shutdown()


def test_bytes_reput_has_yet_to_dispatch_stay_in_the_page_cache_until_it_has(disk_path, backend):
    # Reput reads each record after the put: evicted before that, its pages came back from
    # the disk on that read and stayed, since a range is evicted once (a CI run's wait for
    # them to leave timed out).
    store = testing.open_store(disk_path / "s", backend, config=_config())
    try:
        store.reput_service.shutdown()  # dispatches nothing from here on
        reput_at = store.reput_service.reput_from_offset
        store.mem_limit = FILE
        _fill(store, 5)
        assert store.flush() >= store.commitlog.max_offset
        files = store.commitlog.mfq.files
        assert reput_at < files[1].file_from_offset
        store._drop_cold_cache()
        assert all(testing.cached_bytes(mf.path) >= mf.wrote_position - PAGE for mf in files[1:])
        # Dispatched through the third file: the second and third leave, the rest stay.
        store.reput_service.reput_from_offset = files[3].file_from_offset
        store._drop_cold_cache()
        assert all(testing.cached_bytes(mf.path) == 0 for mf in files[1:3])
        assert all(testing.cached_bytes(mf.path) >= mf.wrote_position - PAGE for mf in files[3:])
    finally:
        store.shutdown()


# Backends whose mappings copy without the GIL (Mapping.copy_released); mmap.mmap's slices
# hold it, and the pure and cffi backends read at their own speed.
RELEASING = [b for b in testing.backend_params()
             if hasattr(getattr(testing.load_backend(b), "Mapping", None), "copy_released")]


@pytest.mark.parametrize("name", RELEASING)
def test_a_read_of_commitlog_bytes_off_the_page_cache_lets_other_threads_run(disk_path, name):
    # A few bytes read through a slice of the mapping copy with the GIL held: where they are
    # off the page cache, the fault waits for the disk, and every thread of the process with
    # it. The stats thread's read of the oldest record's time so stalled puts 50-220 ms
    # behind a disk busy with writeback (doc/performance.md, "A fault with the GIL held").
    store = testing.open_store(disk_path / "s", testing.load_backend(name), config=_config())
    try:
        store.mem_limit = FILE
        put = _fill(store, 6)
        assert store.flush() >= store.commitlog.max_offset
        end = store.commitlog.max_offset
        # Files after the first (the stats thread reads the first), whose first record is
        # off the page cache; a few tries: a thread woken on a loaded machine may miss a read
        # that the disk serves quickly.
        firsts = {offset: body for offset, body in put if offset % FILE == 0}
        cold = [mf for mf in store.commitlog.mfq.files[1:]
                if mf.file_from_offset + mf.file_size <= end - FILE]
        assert len(cold) >= 3
        testing.wait_until(lambda: all(testing.cached_bytes(mf.path) == 0 for mf in cold))
        for mf in cold:
            offset = mf.file_from_offset
            record, ran = testing.runs_during(lambda: store.select_one_message_by_offset(offset))
            assert firsts[offset] in record
            if ran:
                break
        else:
            pytest.fail("no other thread ran while a read waited for the disk")
    finally:
        store.shutdown()


def _off_the_page_cache(path):
    """Written to the disk, then out of the page cache (nothing maps it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert testing.cached_bytes(path) == 0


@pytest.mark.parametrize("name", RELEASING)
def test_the_cleaning_thread_s_reads_of_old_queue_and_index_files_let_other_threads_run(
        disk_path, name):
    # Cleaning reads the last unit of each old ConsumeQueue file (last_unit_phy: the store
    # service's scan and each queue's own deletion) and the header of the oldest index
    # file, pages long gone from the page cache on a busy store: puts waited 60-110 ms
    # behind such a fault taken with the GIL held (doc/performance.md, "A fault with the
    # GIL held").
    kernels = testing.load_backend(name)
    fs = FileSystem()
    cq_path = str(disk_path / "cq")
    mf = MappedFile(cq_path, 1 << 20, kernels, fs)
    mf.mm[(1 << 20) - 20:] = CQ_UNIT.struct.pack(123_456_789, 100, 7)
    mf.close()
    index_path = str(disk_path / "index")
    index = IndexFile(index_path, 64, 64, kernels, fs)
    index.begin_after(987_654_321, 1_800_000_000_000)
    index.mf.close()
    cold = [
        (cq_path, lambda: MappedFile(cq_path, 1 << 20, kernels, fs, create=False),
         lambda f: f.last_unit_phy(20), 123_456_789),
        (index_path, lambda: IndexFile(index_path, 64, 64, kernels, fs, writable=False),
         lambda f: f.end_phy_offset, 987_654_321),
    ]
    for path, open_file, read, expected in cold:
        for _ in range(3):          # a thread woken on a loaded machine may miss a quick read
            _off_the_page_cache(path)
            f = open_file()         # mapped, nothing read
            assert testing.cached_bytes(path) == 0
            value, ran = testing.runs_during(lambda: read(f))
            (f.mf if isinstance(f, IndexFile) else f).close()
            assert value == expected
            if ran:
                break
        else:
            pytest.fail(f"no other thread ran while a read of {path} waited for the disk")


def test_with_drop_cold_commit_log_cache_off_the_page_cache_is_left_to_the_kernel(
        disk_path, backend):
    store = testing.open_store(disk_path / "s", backend,
                               config=_config(drop_cold_commit_log_cache=False))
    try:
        store.mem_limit = FILE
        _fill(store, 4)
        assert store.flush() >= store.commitlog.max_offset
        first = store.commitlog.mfq.files[0]
        time.sleep(3 * store.COLD_CACHE_INTERVAL_MS / 1000)    # the task's period, thrice
        assert testing.cached_bytes(first.path) > FILE // 2
    finally:
        store.shutdown()


# ---- the window's memory: a container's limit where lower, as Java 17 reports it ------------
def _cgroup_tree(root, files, self_cgroup):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    proc = root / "proc-self-cgroup"
    proc.write_text(self_cgroup)
    return str(root / "sys"), str(proc)


PHYSICAL = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.mark.parametrize("files, self_cgroup, expected", [
    # cgroup v2: the lowest limit on the path, the process's own cgroup or an ancestor
    ({"sys/app/memory.max": "max", "sys/app/worker/memory.max": str(2 << 30)},
     "0::/app/worker\n", 2 << 30),
    ({"sys/app/memory.max": str(1 << 30), "sys/app/worker/memory.max": "max"},
     "0::/app/worker\n", 1 << 30),
    # v2 on a hybrid layout (mounted at unified/)
    ({"sys/unified/pod/memory.max": str(3 << 30)}, "0::/pod\n", 3 << 30),
    # cgroup v1: the memory controller's hierarchy; its "unlimited" is near 2^63
    ({"sys/memory/docker/abc/memory.limit_in_bytes": str(512 << 20)},
     "4:memory:/docker/abc\n0::/\n", 512 << 20),
    ({"sys/memory/memory.limit_in_bytes": "9223372036854771712"}, "4:memory:/\n", PHYSICAL),
    # no limit set, or nothing readable: the machine's memory
    ({"sys/app/memory.max": "max"}, "0::/app\n", PHYSICAL),
    ({}, "0::/gone\n", PHYSICAL),
])
def test_the_in_memory_window_counts_a_containers_memory_limit_where_lower(
        tmp_path, files, self_cgroup, expected):
    root, proc = _cgroup_tree(tmp_path, files, self_cgroup)
    assert machine_memory(root, proc) == min(expected, PHYSICAL)


def test_the_in_memory_window_is_the_machines_memory_without_a_cgroup_file(tmp_path):
    assert machine_memory(str(tmp_path), str(tmp_path / "missing")) == PHYSICAL
