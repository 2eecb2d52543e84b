# SPDX-License-Identifier: Apache-2.0
"""SYNC_FLUSH group commit (puts do the syncs, several at once, each woken by the sync that
covered it) and the ConsumeQueue flusher (a round flushes the queues written, and only them)."""
import contextlib
import errno
import gc
import os
import sys
import threading
import time

import pytest

from rocketstore import (BrokerRole, FlushDiskType, Message, MessageStore, PutMessageStatus,
                         testing)
from rocketstore.checkpoint import StoreCheckpoint
from rocketstore.consume_queue import ConsumeQueue
from rocketstore.mapped_file_queue import MappedFileQueue
from rocketstore.errors import StoreError
from rocketstore.format import CQ_UNIT
from rocketstore.fs import FileSystem
from rocketstore.services.flush import FlushRealTimeService
from rocketstore.services.reput import ReputMessageService

from test_store_interface import _six_master_records

# The file-system-wide sync that a round of many queues uses (where there is none, rounds
# sync file by file, which the other tests cover).
needs_syncfs = pytest.mark.skipif(not FileSystem().sync_filesystem(os.getcwd()),
                                  reason="no syncfs on this platform")


def sync_config(**kw):
    return testing.small_config(flush_disk_type=FlushDiskType.SYNC_FLUSH, **kw)


class _GatedSync:
    """A kernel module whose msync waits until `gate` is set: a disk that stalls on demand.
    Both sync kernels stall (sync_written is the one the CommitLog's syncs take)."""

    def __init__(self, inner):
        self._inner = inner
        self.gate = threading.Event()
        self.gate.set()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _stall(self):
        self.gate.wait()

    def sync_range(self, *args):
        self._stall()
        return self._inner.sync_range(*args)

    def sync_written(self, *args):
        self._stall()
        return self._inner.sync_written(*args)


class _FailingSync(FileSystem):
    """msync of CommitLog files fails with EIO while `failing` is set."""

    failing = False

    def sync_mapped(self, kernels, mm, path, start, length):
        if self.failing and os.sep + "commitlog" + os.sep in path:
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        return super().sync_mapped(kernels, mm, path, start, length)


def _end(result):
    """The CommitLog offset just past what a put_message / put_messages result wrote."""
    if hasattr(result, "commit_log_offsets"):
        return int(result.commit_log_offsets[-1]) + int(result.sizes[-1])
    return result.commit_log_offset + result.wrote_bytes


def _until(predicate, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def _put(store, t, i):
    """Thread t's i-th put: a single message, or every third time a batch of four."""
    if i % 3 == 2:
        return store.put_messages([Message("G", b"%d-%d-%d" % (t, i, j), queue_id=t % 4)
                                   for j in range(4)])
    return store.put_message(Message("G", b"%d-%d" % (t, i), queue_id=t % 4))


# ---- group commit -------------------------------------------------------------------------
def test_every_put_acknowledged_under_sync_flush_is_flushed_when_it_returns(tmp_path,
                                                                            backend):
    # Small CommitLog files: syncs cross file boundaries while many threads put.
    store = testing.open_store(tmp_path / "s", backend, sync_config())
    late = []
    results = []

    def produce(t):
        mfq = store.commitlog.mfq
        for i in range(40):
            r = _put(store, t, i)
            # Read at once, in the putting thread: durable when acknowledged, not later.
            if r.status is PutMessageStatus.PUT_OK and mfq.flushed_where < _end(r):
                late.append((t, i, mfq.flushed_where, _end(r)))
            results.append(r)
    try:
        threads = [threading.Thread(target=produce, args=(t,)) for t in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 24 * 40
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        assert late == []
        assert store.commitlog.mfq.flushed_where == store.commitlog.mfq.get_max_offset()
        svc = store.flush_service
        assert svc.waiting == 0 and svc.running == 0
    finally:
        store.shutdown()
    assert not (tmp_path / "s" / "abort").exists()


class _ResidentAtSync(FileSystem):
    """Records, right after each CommitLog sync, the bytes of that file still mapped (Rss)."""

    def __init__(self):
        self.resident = []

    def sync_mapped(self, kernels, mm, path, start, length):
        super().sync_mapped(kernels, mm, path, start, length)
        if os.sep + "commitlog" + os.sep in path:
            self.resident.append(testing.resident_bytes(path))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc/self/smaps")
@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH])
def test_a_sync_takes_the_whole_pages_it_made_durable_off_the_page_tables_and_keeps_them(
        tmp_path, backend, flush):
    # Nothing populated ahead (prefault off) and no periodic flush: the CommitLog's mapped
    # pages are those the put touched until the sync under test. Writing back a page still
    # mapped writable costs a TLB flush on every core (FileSystem.unmap_written).
    cfg = testing.small_config(mapped_file_size_commit_log=256 * 1024, flush_disk_type=flush,
                               prefault_next_file=False, flush_interval_commit_log=600_000)
    fs = _ResidentAtSync()
    store = testing.open_store(tmp_path / "s", backend, cfg, fs=fs)
    msgs = [Message("T", bytes([65 + i % 26]) * 1000, queue_id=0) for i in range(40)]
    try:
        r = store.put_messages(msgs)
        assert r.ok and _end(r) > 9 * 4096
        if flush is FlushDiskType.ASYNC_FLUSH:
            assert fs.resident == []
            assert testing.resident_bytes(str(store.commitlog.mfq.files[0].path)) > 9 * 4096
            assert store.flush() == _end(r)
        else:
            assert store.commitlog.mfq.flushed_where == _end(r)         # synced by the put
        # Only the page holding the end stays mapped: the next put writes on into it.
        assert fs.resident and fs.resident[-1] <= 4096
        got = store.get_message("g", "T", 0, 0, 64)
        assert [m.body for m in got.messages] == [m.body for m in msgs]
        assert store.put_message(Message("T", b"after", queue_id=0)).ok
    finally:
        store.shutdown()
    reopened = testing.open_store(tmp_path / "s", backend, cfg)
    try:
        got = reopened.get_message("g", "T", 0, 0, 64)
        assert [m.body for m in got.messages] == [m.body for m in msgs] + [b"after"]
    finally:
        reopened.shutdown()


def test_puts_and_batches_written_while_syncs_run_share_the_next_sync(tmp_path, backend):
    kernels = _GatedSync(backend)
    store = testing.open_store(tmp_path / "s", kernels, sync_config(sync_flush_timeout=30_000))
    svc = store.flush_service
    n = svc.MAX_SYNCS + 8
    results = [None] * n
    try:
        before = svc.syncs
        kernels.gate.clear()

        def produce(i):
            results[i] = _put(store, i, 2 if i % 2 else 0)
        threads = [threading.Thread(target=produce, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        # MAX_SYNCS syncs are stuck (the thread may hold one); every other put waits.
        _until(lambda: svc.running == svc.MAX_SYNCS
               and svc.waiting >= n - svc.MAX_SYNCS, "the puts to wait")
        kernels.gate.set()
        for t in threads:
            t.join()
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        assert store.commitlog.mfq.flushed_where >= max(_end(r) for r in results)
        # The stuck syncs, one sync for every put that waited behind them, and at most one
        # for a put that reached its wait late.
        assert svc.syncs - before <= svc.MAX_SYNCS + 2 < n
    finally:
        kernels.gate.set()
        store.shutdown()


def _two_producers(store):
    """The main thread and a second one each put and sync once: the service counts two
    producers, so the next put that finds the other one away gathers. The service's own
    thread is sent to sleep first (idle at once, for an hour): looking every 10 ms, it could
    sync a put's bytes between the put's write and its wait, on a loaded machine, and that
    put would return without waiting, uncounted (seen once in CI)."""
    svc = store.flush_service
    svc.IDLE_AFTER_MS = 0
    svc.IDLE_WAIT_MS = 3_600_000
    time.sleep(0.05)                # past the 10 ms look it may be in
    done = []
    t = threading.Thread(target=lambda: done.append(store.put_message(Message("T", b"a0"))))
    t.start()
    t.join()
    assert done[0].status is PutMessageStatus.PUT_OK
    assert store.put_message(Message("T", b"b0")).status is PutMessageStatus.PUT_OK
    assert svc.producers == 2


def test_a_leader_gathers_the_producer_writing_its_next_put_into_one_sync(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend, sync_config(sync_flush_timeout=30_000))
    svc = store.flush_service
    try:
        _two_producers(store)
        # A bound no test outlasts: only the other producer's arrival ends the gathering.
        svc.gather_ns = 60 * 10**9
        before = svc.syncs
        first = []
        leader = threading.Thread(
            target=lambda: first.append(store.put_message(Message("T", b"a1"))))
        leader.start()
        testing.wait_until(lambda: svc.gathering, what="the leader to gather")
        assert svc.syncs == before              # it waits for the other producer
        r = store.put_message(Message("T", b"b1"))
        leader.join()
        assert r.status is PutMessageStatus.PUT_OK
        assert first[0].status is PutMessageStatus.PUT_OK
        assert store.commitlog.mfq.flushed_where >= max(_end(r), _end(first[0]))
        assert svc.syncs - before == 1          # both puts, one sync
    finally:
        store.shutdown()


def test_a_gathering_leader_syncs_alone_when_the_other_producer_stays_away(tmp_path,
                                                                           backend):
    store = testing.open_store(tmp_path / "s", backend, sync_config(sync_flush_timeout=5_000))
    svc = store.flush_service
    try:
        _two_producers(store)
        svc.gather_ns = 10**6                    # the bound: 1 ms, well inside the timeout
        before = svc.syncs
        r = store.put_message(Message("T", b"b1"))      # the other producer never comes
        assert r.status is PutMessageStatus.PUT_OK
        assert store.commitlog.mfq.flushed_where >= _end(r)
        assert svc.syncs - before == 1 and not svc.gathering
    finally:
        store.shutdown()


def test_a_leader_whose_sync_would_cover_gather_bytes_syncs_without_gathering(tmp_path, backend):
    # Gathering until the deadline would answer FLUSH_DISK_TIMEOUT after 5 s.
    store = testing.open_store(tmp_path / "s", backend, sync_config(sync_flush_timeout=5_000))
    svc = store.flush_service
    try:
        _two_producers(store)
        svc.gather_ns = 60 * 10**9              # only the other producer would end a gathering
        svc.gather_bytes = 1024
        before = svc.syncs
        t0 = time.monotonic()
        r = store.put_message(Message("T", b"x" * 2048))   # the other producer never comes
        assert r.status is PutMessageStatus.PUT_OK
        assert time.monotonic() - t0 < 4.0
        assert store.commitlog.mfq.flushed_where >= _end(r)
        assert svc.syncs - before == 1 and not svc.gathering
    finally:
        store.shutdown()


def test_a_put_waiting_behind_a_stalled_sync_answers_flush_disk_timeout_in_time(tmp_path,
                                                                                  backend):
    kernels = _GatedSync(backend)
    store = testing.open_store(tmp_path / "s", kernels, sync_config(sync_flush_timeout=200))
    svc = store.flush_service
    svc.MAX_SYNCS = 1                   # the stalled sync holds the only slot
    first = []
    try:
        kernels.gate.clear()
        leader = threading.Thread(
            target=lambda: first.append(store.put_message(Message("T", b"leader"))))
        leader.start()
        _until(lambda: svc.running == 1, "the first sync to start")
        t0 = time.monotonic()
        r = store.put_message(Message("T", b"follower"))
        waited = time.monotonic() - t0
        assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT and r.status.ok
        assert waited < 5.0                     # its own timeout, not the stalled sync
        assert leader.is_alive()                # still inside msync
        kernels.gate.set()
        leader.join()
        # Its sync outlasted its timeout: durable, but not within the time it was given.
        assert first[0].status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        r = store.put_message(Message("T", b"after"))
        assert r.status is PutMessageStatus.PUT_OK
        assert store.commitlog.mfq.flushed_where >= _end(r)
    finally:
        kernels.gate.set()
        store.shutdown()


def test_shutdown_while_puts_wait_acknowledges_every_put_the_final_sync_covers(tmp_path,
                                                                              backend):
    kernels = _GatedSync(backend)
    store = testing.open_store(tmp_path / "s", kernels, sync_config(sync_flush_timeout=30_000))
    svc = store.flush_service
    results = [None] * 8
    try:
        kernels.gate.clear()

        def produce(i):
            results[i] = _put(store, i, i)
        threads = [threading.Thread(target=produce, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        _until(lambda: svc.waiting + svc.running >= 8, "the puts to wait")
        closer = threading.Thread(target=store.shutdown)
        closer.start()
        time.sleep(0.05)
        kernels.gate.set()
        closer.join(30)
        for t in threads:
            t.join(30)
        assert not closer.is_alive()
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    finally:
        kernels.gate.set()
        store.shutdown()
    assert not (tmp_path / "s" / "abort").exists()
    store = testing.open_store(tmp_path / "s", backend, sync_config())
    try:
        assert sum(store.get_max_offset_in_queue("G", q) for q in range(4)) == \
            sum(getattr(r, "count", 1) for r in results)
    finally:
        store.shutdown()


class _GatedFailingSync(_GatedSync):
    """A stalling disk whose next sync, once released, fails with EIO (`fail_next`), as a
    write-back error is reported once; `failed` counts the failures."""

    fail_next = False
    failed = 0

    def _stall(self):
        self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            self.failed += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))


def test_a_failed_sync_ends_every_put_waiting_on_it_and_acknowledges_none(tmp_path, backend):
    # The leader's sync fails: the puts following it (asleep in the compiled wait, with
    # cext and cffi) answer FLUSH_DISK_TIMEOUT, though a sync tried again would succeed.
    kernels = _GatedFailingSync(backend)
    store = testing.open_store(tmp_path / "s", kernels, sync_config(sync_flush_timeout=30_000))
    svc = store.flush_service
    results = [None] * 6
    try:
        kernels.gate.clear()
        kernels.fail_next = True

        def produce(i):
            results[i] = _put(store, i, i)
        threads = [threading.Thread(target=produce, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        _until(lambda: svc.waiting + svc.running >= 6, "the puts to wait")
        kernels.gate.set()
        for t in threads:
            t.join()
        assert kernels.failed == 1
        assert all(r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT for r in results)
        assert store.commitlog.mfq.flushed_where == 0
    finally:
        kernels.gate.set()
        store.shutdown()


def test_shutdown_with_a_failing_disk_ends_every_wait_without_acknowledging(tmp_path,
                                                                             backend):
    fs = _FailingSync()
    store = testing.open_store(tmp_path / "s", backend, sync_config(sync_flush_timeout=30_000),
                               fs=fs)
    results = [None] * 6
    try:
        assert store.put_message(Message("T", b"durable")).status is PutMessageStatus.PUT_OK
        fs.failing = True

        def produce(i):
            results[i] = _put(store, i, 0)
        threads = [threading.Thread(target=produce, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        time.sleep(0.1)                         # the first sync fails meanwhile
        t0 = time.monotonic()
        store.shutdown()
        for t in threads:
            t.join(30)
        assert time.monotonic() - t0 < 20       # not each put's 30 s timeout
        # Waiting when the sync failed, or refused after it (or by the shutdown).
        assert all(r.status in (PutMessageStatus.FLUSH_DISK_TIMEOUT,
                                PutMessageStatus.SERVICE_NOT_AVAILABLE) for r in results)
    finally:
        fs.failing = False
        store.shutdown()
    assert (tmp_path / "s" / "abort").exists()  # the next open recovers


def _fail_commitlog_sync_once(fs):
    """The kernel's way: a failed write-back is reported to one sync, and the next sync of
    the same pages succeeds (the double keeps them lost: fsyncgate)."""
    fs.fail("sync", errno.EIO, match=os.sep + "commitlog" + os.sep, times=1)


def _bodies(store, topic="T"):
    return [m.body for m in store.get_message("g", topic, 0, 0).messages]


@contextlib.contextmanager
def _reopened_after_a_crash(root, backend, config=None):
    """The store on `root` opened again: it recovered abnormally and dispatched what it kept."""
    store = testing.open_store(root, backend, config)
    try:
        assert not store.recovery_report.normal
        testing.wait_dispatched(store)
        yield store
    finally:
        store.shutdown()


@contextlib.contextmanager
def _power_cut_after_a_failed_sync(root, backend, config, fs, end, bodies):
    """After a failed CommitLog sync and shutdown: the abort file stays and the CommitLog's
    cached pages were dropped; then a power cut (fs's unsynced bytes lost), and the reopened
    store holds exactly `bodies`, to CommitLog offset `end`."""
    assert (root / "abort").exists()
    assert str(root / "commitlog" / ("0" * 20)) in fs.dropped
    fs.drop_unsynced()
    with _reopened_after_a_crash(root, backend, config) as store:
        assert store.get_max_phy_offset() == end
        assert _bodies(store) == bodies
        yield store


class _RecordingDrops(testing.FaultInjectingFileSystem):
    """Records the files whose cached pages the store dropped."""

    def __init__(self):
        super().__init__()
        self.dropped = []

    def drop_cached(self, path):
        self.dropped.append(path)
        super().drop_cached(path)


def test_a_failed_sync_is_never_retried_into_an_acknowledgement(tmp_path, backend):
    root = tmp_path / "s"
    fs = _RecordingDrops()
    # Long enough for the 10 ms retry of a put's own sync that a retrying store would make.
    store = testing.open_store(root, backend, sync_config(sync_flush_timeout=2000), fs=fs)
    try:
        before = store.put_message(Message("T", b"before"))
        assert before.status is PutMessageStatus.PUT_OK
        _fail_commitlog_sync_once(fs)
        lost = store.put_message(Message("T", b"lost"))
        assert lost.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        later = store.put_message(Message("T", b"refused"))
        assert later.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "reopen the store" in later.reason and store.running_flags.is_sync_failed()
        assert store.put_messages([Message("T", b"refused")]).status is \
            PutMessageStatus.SERVICE_NOT_AVAILABLE
        # A sync now would succeed (the fault is spent): the flushed offset does not move.
        assert store.flush() == store.commitlog.mfq.flushed_where == _end(before)
        assert store.sync_latch.failed(store.sync_latch.COMMITLOG)
        fs.crash()
    finally:
        store.shutdown()
    # Unmapped, the CommitLog's cached pages were dropped: a reopen without a power cut reads
    # the disk too, not the pages the failed sync left cached but unwritten.
    with _power_cut_after_a_failed_sync(root, backend, sync_config(), fs, _end(before),
                                        [b"before"]) as store:
        # Reopened, the store takes puts again.
        assert store.put_message(Message("T", b"again")).status is PutMessageStatus.PUT_OK


def test_an_async_flush_never_moves_past_a_failed_sync_and_reopen_recovers_the_synced_bytes(
        tmp_path, backend):
    root = tmp_path / "s"
    fs = testing.FaultInjectingFileSystem()
    clock = testing.StepClock(step=60_000)     # store times a minute apart
    store = testing.open_store(root, backend, testing.small_config(), clock=clock, fs=fs)
    try:
        a = store.put_message(Message("T", b"a" * 100))
        assert store.flush() == _end(a)
        a_ts = store.look_message_by_offset(a.commit_log_offset).store_timestamp
        _fail_commitlog_sync_once(fs)
        b = store.put_message(Message("T", b"b" * 100))
        assert b.status is PutMessageStatus.PUT_OK          # ASYNC_FLUSH: not a durability claim
        store.flush()                                       # the flusher's, or this one, fails
        assert fs.injected["sync"] == 1
        assert store.flush() == _end(a)                     # a retry would succeed: none is made
        assert store.put_message(Message("T", b"c")).status is \
            PutMessageStatus.SERVICE_NOT_AVAILABLE
    finally:
        store.shutdown()
    # Shut down with the disk healthy again: still no checkpoint past the failure, and no
    # clean exit.
    assert (root / "abort").exists()
    cp = StoreCheckpoint(str(root / "checkpoint"), FileSystem(), read_only=True)
    assert 0 < cp.physic_msg_timestamp <= a_ts
    fs.drop_unsynced()                                      # and then a power cut
    with _reopened_after_a_crash(root, backend) as store:
        assert store.get_max_phy_offset() == _end(a)
        assert _bodies(store) == [b"a" * 100]


class _PageChunkedSyncs(testing.FaultInjectingFileSystem):
    SYNC_CHUNK = 4096          # a flush of a few KiB goes to the disk in several syncs


# The compiled backends: pure's fdatasync syncs the whole file, so its flush is one sync.
@pytest.mark.parametrize("name", [b for b in testing.backend_params() if b != "pure"])
def test_a_flush_whose_later_chunk_fails_moves_nothing_and_reopen_keeps_a_prefix(tmp_path,
                                                                                 name):
    # A flush is synced a chunk at a time (FileSystem.SYNC_CHUNK): the chunks before a failed
    # one are on the disk, but the flushed position stays where it was, the store takes no
    # more puts, and after a power cut the reopened store holds a prefix of what was put.
    backend = testing.load_backend(name)
    root = tmp_path / "s"
    fs = _PageChunkedSyncs()
    # No periodic flush during the test: the one flush below covers every chunk.
    config = testing.small_config(flush_interval_commit_log=3_600_000)
    store = testing.open_store(root, backend, config, fs=fs)
    puts = [b"a" * 100] + [bytes([c]) * 1500 for c in b"bcdefghijk"]
    try:
        a = store.put_message(Message("T", puts[0]))
        assert store.flush() == _end(a)
        results = [store.put_message(Message("T", body)) for body in puts[1:]]
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        assert _end(results[-1]) - _end(a) > 3 * 4096            # four chunks or more
        commitlog_syncs = []

        def second_commitlog_sync(path):
            if os.sep + "commitlog" + os.sep not in path:
                return False
            commitlog_syncs.append(path)
            return len(commitlog_syncs) == 2

        fs.fail("sync", errno.EIO, match=second_commitlog_sync, times=1)
        store.flush()
        assert fs.injected["sync"] == 1 and len(commitlog_syncs) == 2
        assert store.flush() == _end(a)
        assert store.put_message(Message("T", b"refused")).status is \
            PutMessageStatus.SERVICE_NOT_AVAILABLE
    finally:
        store.shutdown()
    fs.drop_unsynced()                                      # and then a power cut
    with _reopened_after_a_crash(root, backend) as store:
        kept = _bodies(store)
        # The first chunk (from a's end to the next page) was synced: the message it holds
        # whole survives; what the failed chunk and the ones after held does not.
        assert kept == puts[:len(kept)] and 2 <= len(kept) < len(puts)
        assert store.get_max_phy_offset() <= _end(a) - _end(a) % 4096 + 4096


@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH])
def test_a_cut_is_refused_while_its_sync_fails_so_no_acknowledged_put_is_lost(
        tmp_path, backend, flush):
    # reset_write_offset moves the flushed offset to the cut: were the bytes below it still
    # dirty, no later sync would cover them, and a put acknowledged after the cut would be
    # lost at a power cut with them (recovery stops at the first record the cut lost).
    root = tmp_path / "s"

    def config():
        return testing.small_config(flush_disk_type=flush, sync_flush_timeout=100)
    fs = testing.FaultInjectingFileSystem()
    store = testing.open_store(root, backend, config(), fs=fs)
    try:
        assert store.put_message(Message("T", b"a" * 100)).status is PutMessageStatus.PUT_OK
        assert store.flush() == store.get_max_phy_offset()
        fs.fail("sync", errno.EIO, match=os.sep + "commitlog" + os.sep)
        # One put, so that both are written whatever the first sync does.
        bc = store.put_messages([Message("T", b"b" * 100), Message("T", b"c" * 100)])
        cut = int(bc.commit_log_offsets[1])
        end = store.get_max_phy_offset()
        with pytest.raises(StoreError, match="nothing was cut"):
            store.reset_write_offset(cut)
        assert store.get_max_phy_offset() == end
        assert store.get_max_offset_in_queue("T", 0) == 3
        # Healed, a sync would succeed, but could do so without the bytes the failed one
        # lost: the cut stays refused until the store is reopened.
        fs.heal()
        with pytest.raises(StoreError, match="nothing was cut"):
            store.reset_write_offset(cut)
        fs.crash()
    finally:
        store.shutdown()
    fs.drop_unsynced()
    store = testing.open_store(root, backend, config())
    try:
        got = store.get_message("g", "T", 0, 0)
        assert [m.body[:1] for m in got.messages] == [b"a"]
        assert store.reset_write_offset(store.get_max_phy_offset()) is True
    finally:
        store.shutdown()


@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH])
def test_records_a_cut_removed_do_not_come_back_after_a_power_cut(tmp_path, backend, flush):
    # The cut zeroes the file past it, in the page cache. Unsynced, those zeros are lost at a
    # power cut, and the old records of the same sizes line up behind the new ones: recovery
    # would read on into them and bring back what the cut removed.
    root = tmp_path / "s"

    def config():
        return testing.small_config(flush_disk_type=flush)
    fs = testing.FaultInjectingFileSystem()
    store = testing.open_store(root, backend, config(), fs=fs)
    try:
        rs = [store.put_message(Message("T", b"old-%d" % i)) for i in range(10)]
        assert store.flush() == store.get_max_phy_offset()
        assert store.reset_write_offset(rs[5].commit_log_offset)
        for i in range(2):
            assert store.put_message(Message("T", b"new-%d" % i)).status is \
                PutMessageStatus.PUT_OK
        assert store.flush() == store.get_max_phy_offset()
        fs.crash()
    finally:
        store.shutdown()
    fs.drop_unsynced()
    store = testing.open_store(root, backend, config())
    try:
        got = store.get_message("g", "T", 0, 0, 64)
        assert [m.body for m in got.messages] == [b"old-%d" % i for i in range(5)] + \
            [b"new-0", b"new-1"]
        assert store.get_max_phy_offset() == rs[7].commit_log_offset
    finally:
        store.shutdown()


@pytest.mark.parametrize("part", ["commitlog", "consumequeue"])
def test_a_cut_whose_zeroed_tail_fails_to_sync_trips_the_latch_so_no_put_lands_on_it(
        tmp_path, backend, part):
    # The zeros past a cut failed to reach the disk, which still holds the records the cut
    # removed. A put taken after it would lie on pages a later sync reports durable though
    # the failed one lost them (fsyncgate): at a power cut the old bytes would be back under
    # it. So the store stops as at any failed sync, and says the cut is not durable.
    root = tmp_path / "s"
    fs = _RecordingDrops()
    store = testing.open_store(root, backend, sync_config(), fs=fs)
    try:
        rs = [store.put_message(Message("T", b"old-%d" % i)) for i in range(10)]
        testing.wait_dispatched(store)
        store.flush_cq_service.do_flush(1, force=True)
        assert store.flush() == store.get_max_phy_offset()
        fs.fail("sync", errno.EIO, match=os.sep + part + os.sep, times=1)
        with pytest.raises(StoreError, match="zeroed tail"):
            store.reset_write_offset(rs[5].commit_log_offset)
        assert fs.injected["sync"] == 1
        # Cut all the same, in this process: nothing reads past it.
        assert store.get_max_phy_offset() == rs[5].commit_log_offset
        assert store.get_max_offset_in_queue("T", 0) == 5
        latch = store.sync_latch
        assert latch.failed(latch.COMMITLOG if part == "commitlog" else latch.CONSUME_QUEUE)
        assert store.put_message(Message("T", b"new")).status is \
            PutMessageStatus.SERVICE_NOT_AVAILABLE
        fs.crash()
    finally:
        store.shutdown()
    assert (root / "abort").exists()
    zeroed = root / part / ("0" * 20) if part == "commitlog" else \
        root / part / "T" / "0" / ("0" * 20)
    assert str(zeroed) in fs.dropped
    fs.drop_unsynced()
    with _reopened_after_a_crash(root, backend, sync_config()) as store:
        # The CommitLog's cut never reached its disk: the store is whole as before it.
        kept = 10 if part == "commitlog" else 5
        assert _bodies(store) == [b"old-%d" % i for i in range(kept)]


def test_a_replicated_frame_a_cut_raced_whose_zeroes_fail_to_sync_trips_the_latch(
        tmp_path, backend):
    # A cut raced a frame the HA client was receiving: its publish is refused, and the
    # frame's bytes past the cut are zeroed again and synced. When that sync fails the disk
    # may hold the frame under zeros a later sync reports durable, as after a failed cut:
    # the store stops the same way. The publish answers False, as for any frame a cut
    # refused, so the HA client closes its connection instead of meeting an OSError.
    rs, raw = _six_master_records(tmp_path, backend)
    end = len(raw)
    cut, frame = rs[2].commit_log_offset, rs[4].commit_log_offset
    root = tmp_path / "s"
    fs = _RecordingDrops()
    slave = testing.open_store(root, backend, testing.small_config(
        broker_role=BrokerRole.SLAVE), fs=fs)
    try:
        cl = slave.commitlog
        assert slave.append_to_commit_log(0, raw[:frame]) is True
        mf = cl.replica_target(frame, end - frame)
        assert slave.reset_write_offset(cut) is True
        mf.write_target[frame:end] = raw[frame:end]
        _fail_commitlog_sync_once(fs)
        assert cl.publish_replica(mf, frame, end) is False
        assert fs.injected["sync"] == 1
        assert bytes(mf.mm[cut:end]) == bytes(end - cut)
        latch = slave.sync_latch
        assert latch.failed(latch.COMMITLOG)
        assert slave.flush() == cut
    finally:
        slave.shutdown()
    assert (root / "abort").exists()
    assert str(root / "commitlog" / ("0" * 20)) in fs.dropped


def test_a_failed_flush_of_a_loaded_store_trips_the_latch_so_no_later_flush_claims_its_bytes(
        tmp_path, backend):
    # Loaded and not started, a store has no flusher: flush() syncs in the caller's thread.
    # Its failed sync stops the store as a flusher's does, since a retry would succeed with
    # the bytes lost; and the abort file is written at once, as nothing else would make
    # the next open recover from the disk.
    rs, raw = _six_master_records(tmp_path, backend)
    half = rs[3].commit_log_offset
    root = tmp_path / "s"

    def config():
        return testing.small_config(broker_role=BrokerRole.SLAVE)
    fs = _RecordingDrops()
    store = MessageStore(root, config(), clock=testing.StepClock(), kernels=backend, fs=fs)
    store.load()
    try:
        assert store.append_to_commit_log(0, raw[:half]) is True
        assert store.flush() == half
        assert store.append_to_commit_log(half, raw[half:]) is True
        _fail_commitlog_sync_once(fs)
        with pytest.raises(StoreError, match="reopen the store"):
            store.flush()
        assert fs.injected["sync"] == 1
        # The fault is spent: a sync would succeed now, and is not made.
        assert store.flush() == half
        latch = store.sync_latch
        assert latch.failed(latch.COMMITLOG)
        assert (root / "abort").exists()
        store.start()                       # the same latch: still stopped
        assert store.flush() == half
        fs.crash()
    finally:
        store.shutdown()
    with _power_cut_after_a_failed_sync(root, backend, config(), fs, half,
                                        [b"%d" % i for i in range(3)]):
        pass


def test_a_recovery_cut_whose_zeroed_tail_fails_to_sync_fails_the_open_and_keeps_it_abnormal(
        tmp_path, backend):
    # Recovery cuts a torn record off the CommitLog's tail; the sync of the zeros fails. The
    # open fails (no latch exists yet), and the abort file makes the next open abnormal: it
    # then drops the cached pages (the zeros the failed sync left clean in memory) and
    # recovers from what the disk holds, cutting again.
    root = tmp_path / "s"
    store = testing.open_store(root, backend)
    rs = [store.put_message(Message("T", b"r-%d" % i)) for i in range(4)]
    store.shutdown()
    assert not (root / "abort").exists()
    last = rs[-1].commit_log_offset
    with open(root / "commitlog" / ("0" * 20), "r+b") as fh:
        fh.seek(last + 4)                           # the last record's magic: torn
        fh.write(b"\xff" * 4)
    fs = testing.FaultInjectingFileSystem()
    fs.fail("sync", errno.EIO, match=os.sep + "commitlog" + os.sep, times=1)
    store = MessageStore(root, testing.small_config(), kernels=backend, fs=fs)
    with pytest.raises(OSError):
        store.load()
    assert (root / "abort").exists()
    with _reopened_after_a_crash(root, backend) as store:
        assert store.get_max_phy_offset() == last
        assert _bodies(store) == [b"r-%d" % i for i in range(3)]


def test_a_shutdown_called_again_after_raising_past_a_failed_sync_drops_the_pages(
        tmp_path, backend, monkeypatch):
    root = tmp_path / "s"
    fs = _RecordingDrops()
    store = testing.open_store(root, backend, sync_config(sync_flush_timeout=2000), fs=fs)
    assert store.put_message(Message("T", b"before")).status is PutMessageStatus.PUT_OK
    _fail_commitlog_sync_once(fs)
    assert store.put_message(Message("T", b"lost")).status is \
        PutMessageStatus.FLUSH_DISK_TIMEOUT

    def broken():
        raise RuntimeError("a service failed to stop")
    monkeypatch.setattr(store.commitlog, "shutdown", broken)
    with pytest.raises(RuntimeError):
        store.shutdown()
    assert (root / "abort").exists() and fs.dropped == []
    store.shutdown()                    # again: the files close, and their pages go
    assert not store.loaded and (root / "abort").exists()
    assert str(root / "commitlog" / ("0" * 20)) in fs.dropped


class _StallingQueueSyncs(FileSystem):
    """Once `stall` is set, a ConsumeQueue file's sync waits until `go` is set."""

    def __init__(self):
        self.stall = threading.Event()
        self.go = threading.Event()

    def sync_mapped(self, kernels, mm, path, start, length):
        if self.stall.is_set() and "consumequeue" in path:
            self.go.wait()
        super().sync_mapped(kernels, mm, path, start, length)


def test_a_shutdown_whose_queue_flusher_outlasts_its_join_keeps_the_abort_file(
        tmp_path, backend):
    # The ConsumeQueue flusher's last round is still syncing when shutdown stops waiting for
    # it: that sync may yet fail (and trip the latch) after shutdown decided the exit was
    # clean, and the next open would trust queues that never reached the disk.
    root = tmp_path / "s"
    fs = _StallingQueueSyncs()
    store = testing.open_store(root, backend, _cq_config(), fs=fs)
    flusher = store.flush_cq_service
    thread = flusher._thread
    try:
        assert store.put_message(Message("T", b"x")).ok
        testing.wait_dispatched(store)
        assert store.flush() == store.get_max_phy_offset()
        flusher.join_time_s = 0.05
        fs.stall.set()
        store.shutdown()
        assert thread.is_alive()            # still in its last round's sync
        assert (root / "abort").exists()
    finally:
        fs.go.set()
        thread.join()


def test_a_shutdown_whose_reput_outlasts_its_join_keeps_the_abort_file(tmp_path, backend,
                                                                         caplog):
    # Shutdown stops waiting for the reput service, whose drain still waits for the dispatch
    # lock (a cut or a reader's catch-up holds it): it may yet dispatch, after the final
    # queue flush and while the files close, so the store has not caught up, however far
    # dispatch got.
    root = tmp_path / "s"
    store = testing.open_store(root, backend)
    reput = store.reput_service
    thread = reput._thread
    assert store.put_message(Message("T", b"x")).ok
    testing.wait_dispatched(store)
    reput.join_time_s = 0.05
    with reput.dispatch_lock:
        store.shutdown()
        assert thread.is_alive()
        assert (root / "abort").exists()
        assert "the reput service did not stop in time" in caplog.text
    thread.join()


class _DropsAndReads(FileSystem):
    """Records, in order, the files whose cached pages are dropped and the files read (mapped,
    or read whole)."""

    def __init__(self):
        self.events = []

    def drop_cached(self, path):
        self.events.append(("drop", path))
        super().drop_cached(path)

    def map(self, path, size, writable=True, kernels=None):
        self.events.append(("read", path))
        return super().map(path, size, writable, kernels)

    def read_bytes(self, path):
        self.events.append(("read", path))
        return super().read_bytes(path)


@pytest.mark.parametrize("killed", [True, False])
def test_an_open_after_a_kill_drops_the_cached_pages_of_every_data_file_before_reading_it(
        tmp_path, backend, killed):
    # Killed after a failed sync (no shutdown to drop them), a process leaves the pages the
    # kernel could not write cached and marked clean: recovery would read them as durable.
    # The abort file says the last process did not shut down.
    root = tmp_path / "s"
    store = testing.open_store(root, backend)
    for i in range(30):
        assert store.put_message(Message("T%d" % (i % 3), b"m%d" % i, keys="k%d" % i,
                                         queue_id=i % 2)).ok
    testing.wait_dispatched(store)
    store.shutdown()
    data = [p for p in root.rglob("*") if p.is_file() and p.parent.name != "config"
            and p.name not in ("lock", "abort")]
    parts = {p.relative_to(root).parts[0] for p in data}
    assert parts == {"commitlog", "consumequeue", "index", "checkpoint"}
    if killed:
        (root / "abort").write_bytes(b"")
    fs = _DropsAndReads()
    store = MessageStore(root, testing.small_config(), kernels=backend, fs=fs)
    try:
        assert store.load().normal is not killed
    finally:
        store.shutdown()
    dropped = {path for op, path in fs.events if op == "drop"}
    if not killed:
        assert dropped == set()
        return
    assert dropped == {str(p) for p in data}
    first_read = {}
    for i, (op, path) in enumerate(fs.events):
        if op == "read":
            first_read.setdefault(path, i)
    last_drop = max(i for i, (op, _) in enumerate(fs.events) if op == "drop")
    assert all(first_read.get(str(p), last_drop + 1) > last_drop for p in data)


# ---- ConsumeQueue flush -------------------------------------------------------------------
def _cq_config(**kw):
    # The flusher's own rounds never come (an hour apart): the test calls do_flush.
    return testing.small_config(flush_interval_consume_queue=3_600_000, **kw)


@pytest.fixture
def flushed_cqs(monkeypatch):
    """The ConsumeQueues whose flush() is called, in order."""
    calls = []
    real = ConsumeQueue.flush

    def spy(cq, least_pages=0):
        calls.append(cq)
        return real(cq, least_pages)
    monkeypatch.setattr(ConsumeQueue, "flush", spy)
    return calls


def _queues(store, topic):
    return store.consume_queue_table[topic]


def test_a_flush_round_flushes_every_queue_written_since_the_last_and_no_other(
        tmp_path, backend, flushed_cqs):
    store = testing.open_store(tmp_path / "s", backend, _cq_config())
    try:
        for q in range(40):
            assert store.put_messages([Message("Q", b"m%d-%d" % (q, i), queue_id=q)
                                       for i in range(3)]).status.ok
        testing.wait_dispatched(store)
        store.flush_cq_service.do_flush(1, force=True)
        cqs = _queues(store, "Q")
        assert set(flushed_cqs) == set(cqs.values())
        assert all(cq.mfq.flushed_where == cq.mfq.get_max_offset() for cq in cqs.values())
        assert len(store.dirty_cqs) == 0

        del flushed_cqs[:]
        store.flush_cq_service.do_flush(1, force=True)
        assert flushed_cqs == []                # nothing written: nothing flushed

        written = {3, 17, 38}
        store.put_messages([Message("Q", b"again", queue_id=q) for q in sorted(written)])
        store.put_message(Message("Q", b"once more", queue_id=17))
        testing.wait_dispatched(store)
        assert {cq.queue_id for cq in cqs.values() if cq in store.dirty_cqs} == written
        store.flush_cq_service.do_flush(1, force=True)
        assert sorted(cq.queue_id for cq in flushed_cqs) == sorted(written)
        assert all(cq.mfq.flushed_where == cq.mfq.get_max_offset() for cq in cqs.values())
    finally:
        store.shutdown()


@pytest.fixture
def tested(monkeypatch):
    """The MappedFileQueues a periodic round tests (flush_due), in order."""
    calls = []
    real_due = MappedFileQueue.flush_due

    def spy(mfq, least_pages):
        calls.append(mfq)
        return real_due(mfq, least_pages)
    monkeypatch.setattr(MappedFileQueue, "flush_due", spy)
    return calls


def _least_two_pages_config():
    # Periodic rounds want two dirty pages; thorough rounds only when a test asks; files of
    # almost five pages.
    return _cq_config(flush_consume_queue_least_pages=2,
                      flush_consume_queue_thorough_interval=3_600_000,
                      mapped_file_size_consume_queue=1000 * 20)


def test_a_queue_below_the_least_pages_waits_untested_for_a_thorough_round(
        tmp_path, backend, flushed_cqs, tested):
    store = testing.open_store(tmp_path / "s", backend, _least_two_pages_config())
    try:
        store.put_message(Message("L", b"x"))
        testing.wait_dispatched(store)
        svc = store.flush_cq_service
        svc._last_thorough = time.monotonic_ns() // 1_000_000      # a thorough round just ran
        cq = _queues(store, "L")[0]
        svc.do_flush(1)
        assert tested == [cq.mfq]
        assert flushed_cqs == []                # one dirty page of two: tested, not flushed
        assert cq.mfq.flushed_where < cq.mfq.get_max_offset()
        svc.do_flush(1)
        assert tested == [cq.mfq]               # not written since: not tested again
        # Written onto a second page (a write within the first may go untested: see the
        # next test): tested again, and one dirty page still waits.
        assert store.put_messages([Message("L", b"y")] * 205).status.ok
        testing.wait_dispatched(store)
        svc.do_flush(1)
        assert tested == [cq.mfq, cq.mfq] and flushed_cqs == []
        svc.do_flush(1, force=True)
        assert flushed_cqs == [cq]
        assert cq.mfq.flushed_where == cq.mfq.get_max_offset()
        assert cq not in store.dirty_cqs
    finally:
        store.shutdown()


def test_a_queue_written_within_the_pages_it_had_dirtied_waits_untested_until_it_grows(
        tmp_path, backend, flushed_cqs, tested):
    """The compiled dispatcher marks a queue whose written end crossed no page boundary as
    written within its pages (DirtyQueues): its count of dirty pages did not move, so a
    periodic round files it with the queues below the least without testing it again. A
    write that then crosses a page in the same round's epoch marks it as grown: tested, and
    flushed once due; a thorough round flushes the rest. The Python dispatch (the cffi and
    pure backends) marks every write as grown, and its queues are tested each time."""
    store = testing.open_store(tmp_path / "s", backend, _least_two_pages_config())
    try:
        svc = store.flush_cq_service
        store.put_message(Message("W", b"x"))
        testing.wait_dispatched(store)
        svc._last_thorough = time.monotonic_ns() // 1_000_000      # a thorough round just ran
        cq = _queues(store, "W")[0]
        svc.do_flush(1)
        assert tested == [cq.mfq] and flushed_cqs == []
        assert store.put_messages([Message("W", b"y")] * 3).status.ok
        testing.wait_dispatched(store)
        assert cq in store.dirty_cqs
        svc.do_flush(1)
        compiled = backend.NAME == "cext"
        assert tested == ([cq.mfq] if compiled else [cq.mfq, cq.mfq]) and flushed_cqs == []
        assert cq not in store.dirty_cqs
        # Within the first page, then past the second boundary: due, and flushed to it.
        assert store.put_messages([Message("W", b"z")] * 3).status.ok
        testing.wait_dispatched(store)
        assert store.put_messages([Message("W", b"z")] * 410).status.ok
        testing.wait_dispatched(store)
        svc.do_flush(1)
        assert tested[-1] is cq.mfq and flushed_cqs == [cq]
        assert cq.mfq.flushed_where == 2 * 4096 < cq.mfq.get_max_offset()
        # The last page's units, written within the pages since: the thorough round's.
        assert store.put_messages([Message("W", b"t")] * 2).status.ok
        testing.wait_dispatched(store)
        svc.do_flush(1)
        assert cq.mfq.flushed_where == 2 * 4096
        svc.do_flush(1, force=True)
        assert cq.mfq.flushed_where == cq.mfq.get_max_offset() == 419 * 20
        assert len(store.dirty_cqs) == 0
    finally:
        store.shutdown()


def test_a_queue_still_due_after_a_round_is_flushed_on_by_the_next(tmp_path, backend):
    # A flush takes one file a call: a full first file, then 2.4 pages of the second.
    store = testing.open_store(tmp_path / "s", backend, _least_two_pages_config())
    try:
        for _ in range(3):
            assert store.put_messages([Message("D", b"d")] * 500).status.ok
        testing.wait_dispatched(store)
        svc = store.flush_cq_service
        svc._last_thorough = time.monotonic_ns() // 1_000_000      # a thorough round just ran
        cq = _queues(store, "D")[0]
        svc.do_flush(1)
        assert cq.mfq.flushed_where == 1000 * 20
        svc.do_flush(1)                          # nothing written meanwhile
        assert cq.mfq.flushed_where == 1000 * 20 + 2 * 4096
    finally:
        store.shutdown()


def test_queues_rebuilt_at_start_are_flushed_by_the_first_round(tmp_path, backend,
                                                                flushed_cqs):
    root = tmp_path / "s"
    store = testing.open_store(root, backend, _cq_config())
    store.put_messages([Message("R", b"r%d" % i, queue_id=i % 5) for i in range(50)])
    store.shutdown()
    for d, _, names in os.walk(root / "consumequeue", topdown=False):
        for name in names:
            os.remove(os.path.join(d, name))
        os.rmdir(d)
    store = testing.open_store(root, backend, _cq_config())     # reput rebuilds the queues
    try:
        cqs = _queues(store, "R")
        assert len(cqs) == 5 and all(cq in store.dirty_cqs for cq in cqs.values())
        del flushed_cqs[:]                      # the first store's shutdown flushed its own
        store.flush_cq_service.do_flush(1, force=True)
        assert set(flushed_cqs) == set(cqs.values())
        assert all(cq.mfq.flushed_where == cq.mfq.get_max_offset() == 10 * 20
                   for cq in cqs.values())
    finally:
        store.shutdown()


def test_units_written_after_a_truncation_are_flushed(tmp_path, backend, flushed_cqs):
    # 100 units per ConsumeQueue file (small_config): 250 units fill three files.
    store = testing.open_store(tmp_path / "s", backend, _cq_config())
    try:
        rs = store.put_messages([Message("T", b"t%d" % i) for i in range(250)])
        testing.wait_dispatched(store)
        store.flush_cq_service.do_flush(3, force=True)
        cq = _queues(store, "T")[0]
        assert len(cq.mfq.files) == 3 and cq.mfq.flushed_where == 250 * 20
        cq.truncate_dirty_logic_files(int(rs.commit_log_offsets[50]))   # as recovery does
        assert len(cq.mfq.files) == 1 and cq.max_offset_in_queue == 50
        assert cq.mfq.flushed_where <= cq.mfq.get_max_offset()
        del flushed_cqs[:]
        cq.put_unit(store.commitlog.max_offset, 100, 0, 50)
        cq.put_unit(store.commitlog.max_offset + 100, 100, 0, 51)
        store.flush_cq_service.do_flush(1, force=True)
        assert flushed_cqs == [cq]
        assert cq.mfq.flushed_where == cq.mfq.get_max_offset() == 52 * 20
        assert cq.mfq.files[0].flushed_position == 52 * 20
    finally:
        store.shutdown()


class _CountingSyncs(testing.FaultInjectingFileSystem):
    """Counts per-file syncs of ConsumeQueue files and whole-file-system syncs."""

    def __init__(self):
        super().__init__()
        self.cq_file_syncs = 0
        self.fs_syncs = 0

    def sync_mapped(self, kernels, mm, path, start, length):
        if "consumequeue" in path:
            self.cq_file_syncs += 1
        super().sync_mapped(kernels, mm, path, start, length)

    def sync_filesystem(self, path):
        self.fs_syncs += 1
        return super().sync_filesystem(path)


_MANY = 8       # queues: the rounds below sync together from this many (SYNC_TOGETHER_MIN)


def _many_queues_written(root, backend, fs, monkeypatch):
    from rocketstore.services.flush import FlushConsumeQueueService
    monkeypatch.setattr(FlushConsumeQueueService, "SYNC_TOGETHER_MIN", _MANY)
    store = testing.open_store(root, backend, _cq_config(), fs=fs)
    assert store.put_messages([Message("M", b"m%d-%d" % (q, i), queue_id=q)
                               for q in range(_MANY) for i in range(3)]).status.ok
    testing.wait_dispatched(store)
    return store


@needs_syncfs
def test_a_round_of_many_queues_syncs_their_file_system_once_and_no_file(
        tmp_path, backend, monkeypatch):
    fs = _CountingSyncs()
    store = _many_queues_written(tmp_path / "s", backend, fs, monkeypatch)
    try:
        store.flush_cq_service.do_flush(1, force=True)
        cqs = _queues(store, "M").values()
        assert (fs.fs_syncs, fs.cq_file_syncs) == (1, 0)
        assert all(cq.mfq.flushed_where == cq.mfq.get_max_offset() == 3 * 20 for cq in cqs)
        assert all(cq.mfq.files[0].flushed_position == 3 * 20 for cq in cqs)
        assert len(store.dirty_cqs) == 0
        # Fewer queues written than that: each is synced on its own.
        store.put_messages([Message("M", b"again", queue_id=q) for q in range(3)])
        testing.wait_dispatched(store)
        store.flush_cq_service.do_flush(1, force=True)
        assert (fs.fs_syncs, fs.cq_file_syncs) == (1, 3)
    finally:
        store.shutdown()


class _CountsObjectsAtSync(_CountingSyncs):
    """Reads, as the file-system sync begins, how many objects the collector tracks were made
    since `before` (gc.get_count's first count) and are still alive: the round's plan."""
    before = None
    planned_objects = None

    def sync_filesystem(self, path):
        if self.before is not None:
            self.planned_objects = gc.get_count()[0] - self.before
        return super().sync_filesystem(path)


@needs_syncfs
def test_a_round_of_many_queues_plans_them_without_an_object_per_queue_for_the_collector(
        tmp_path, backend):
    # A plan of a tuple and a list per queue set off a full collection at 10 000 queues,
    # which held the GIL for 103-165 ms (doc/performance.md). The plan itself makes about
    # six; the bound leaves room for what the store's other threads make meanwhile.
    n = 400
    fs = _CountsObjectsAtSync()
    store = testing.open_store(tmp_path / "s", backend, _cq_config(), fs=fs)
    try:
        assert store.put_messages([Message("M", b"m%d" % q, queue_id=q)
                                   for q in range(n)]).status.ok
        testing.wait_dispatched(store)
        gc.disable()            # the counts then only add up, with no collection between
        try:
            fs.before = gc.get_count()[0]
            store.flush_cq_service.do_flush(1, force=True)
        finally:
            gc.enable()
        assert fs.fs_syncs == 1
        assert fs.planned_objects < n // 4
        assert all(cq.mfq.flushed_where == 20 for cq in _queues(store, "M").values())
    finally:
        store.shutdown()


class _WritesDuringSync(_CountingSyncs):
    """Puts a unit into each of the _MANY queues while the file system sync runs: after the
    round's plan, before its sync."""
    store = None

    def sync_filesystem(self, path):
        store, self.store = self.store, None
        if store is not None:
            assert store.put_messages([Message("M", b"late", queue_id=q)
                                       for q in range(_MANY)]).status.ok
            testing.wait_dispatched(store)
        return super().sync_filesystem(path)


@contextlib.contextmanager
def _writes_during_the_next_sync(tmp_path, backend, monkeypatch):
    """(file system, store) with _MANY queues written, whose next file-system sync meets a
    unit written to each (_WritesDuringSync); the store is shut down after."""
    fs = _WritesDuringSync()
    store = _many_queues_written(tmp_path / "s", backend, fs, monkeypatch)
    fs.store = store
    try:
        yield fs, store
    finally:
        store.shutdown()


@needs_syncfs
def test_units_written_while_the_file_system_syncs_wait_for_the_next_round(
        tmp_path, backend, monkeypatch):
    with _writes_during_the_next_sync(tmp_path, backend, monkeypatch) as (fs, store):
        store.flush_cq_service.do_flush(1, force=True)
        cqs = _queues(store, "M").values()
        # Not a sync of each file for them: with many busy queues that is all of them.
        assert (fs.fs_syncs, fs.cq_file_syncs) == (1, 0)
        assert all(cq.mfq.flushed_where == 3 * 20 < cq.mfq.get_max_offset() == 4 * 20
                   for cq in cqs)
        assert all(cq in store.dirty_cqs for cq in cqs)
        store.flush_cq_service.do_flush(1, force=True)
        assert (fs.fs_syncs, fs.cq_file_syncs) == (2, 0)
        assert all(cq.mfq.flushed_where == 4 * 20 for cq in cqs)
        assert len(store.dirty_cqs) == 0


@needs_syncfs
def test_the_final_round_syncs_units_written_while_the_file_system_synced(
        tmp_path, backend, monkeypatch):
    with _writes_during_the_next_sync(tmp_path, backend, monkeypatch) as (fs, store):
        store.flush_cq_service.do_flush(3, force=True, final=True)
        assert (fs.fs_syncs, fs.cq_file_syncs) == (1, _MANY)
        assert all(cq.mfq.flushed_where == cq.mfq.get_max_offset() == 4 * 20
                   for cq in _queues(store, "M").values())


class _NoSyncfs(_CountingSyncs):
    def sync_filesystem(self, path):
        self.fs_syncs += 1
        return False


def test_without_syncfs_a_round_of_many_queues_syncs_each_queue(tmp_path, backend,
                                                                monkeypatch):
    fs = _NoSyncfs()
    store = _many_queues_written(tmp_path / "s", backend, fs, monkeypatch)
    try:
        store.flush_cq_service.do_flush(1, force=True)
        assert (fs.fs_syncs, fs.cq_file_syncs) == (1, _MANY)
        cqs = _queues(store, "M").values()
        assert all(cq.mfq.flushed_where == cq.mfq.get_max_offset() == 3 * 20 for cq in cqs)
        assert not store.sync_latch.tripped
    finally:
        store.shutdown()


@needs_syncfs
def test_a_failed_file_system_sync_marks_no_queue_flushed_and_the_next_open_rebuilds_them(
        tmp_path, backend, monkeypatch):
    root = tmp_path / "s"
    fs = _CountingSyncs()
    store = _many_queues_written(root, backend, fs, monkeypatch)
    try:
        # Reported once: a sync of each file after it would succeed without the lost pages.
        fs.fail("sync", errno.EIO, match=lambda p: p.endswith("consumequeue"), times=1)
        store.flush_cq_service.do_flush(1, force=True)
        store.flush_cq_service.do_flush(1, force=True)      # and no later round syncs them
        cqs = _queues(store, "M").values()
        assert fs.cq_file_syncs == 0
        assert all(cq.mfq.flushed_where == 0 for cq in cqs)
        assert store.running_flags.is_logics_queue_error()
        assert store.put_message(Message("M", b"refused")).status is \
            PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert store.flush() == store.get_max_phy_offset()  # the CommitLog is fine
    finally:
        store.shutdown()
    assert (root / "abort").exists()
    cp = StoreCheckpoint(str(root / "checkpoint"), FileSystem(), read_only=True)
    assert cp.logics_msg_timestamp == 0                     # nothing vouched for
    fs.drop_unsynced()                                      # a power cut: the queues are lost
    assert all(open(root / "consumequeue" / "M" / str(q) / ("0" * 20), "rb").read(60)
               == bytes(60) for q in range(_MANY))
    with _reopened_after_a_crash(root, backend, _cq_config()) as store:
        for q in range(_MANY):
            got = store.get_message("g", "M", q, 0).messages
            assert [m.body for m in got] == [b"m%d-%d" % (q, i) for i in range(3)]


def test_a_failed_checkpoint_sync_keeps_the_abort_file_and_refuses_puts(tmp_path, backend):
    root = tmp_path / "s"
    fs = testing.FaultInjectingFileSystem()
    store = testing.open_store(root, backend, fs=fs)
    try:
        assert store.put_message(Message("T", b"x")).ok
        fs.fail("sync", errno.EIO, match=lambda p: p.endswith("checkpoint"), times=1)
        store.flush_cq_service.do_flush(1, force=True)      # writes the checkpoint
        assert store.sync_latch.failed(store.sync_latch.CHECKPOINT)
        assert store.put_message(Message("T", b"y")).status is \
            PutMessageStatus.SERVICE_NOT_AVAILABLE
    finally:
        store.shutdown()
    assert (root / "abort").exists()
    with _reopened_after_a_crash(root, backend) as store:
        assert _bodies(store) == [b"x"]


def test_a_failed_index_sync_keeps_the_abort_file_and_the_next_open_rebuilds_the_index(
        tmp_path, backend):
    root = tmp_path / "s"
    fs = testing.FaultInjectingFileSystem()
    store = testing.open_store(root, backend, fs=fs)
    try:
        assert store.put_message(Message("T", b"x", keys="k1")).ok
        testing.wait_dispatched(store)
        index_ts = store.checkpoint.index_msg_timestamp
        fs.fail("sync", errno.EIO, match=os.sep + "index" + os.sep)
    finally:
        store.shutdown()                                    # its index flush fails
    assert (root / "abort").exists()
    cp = StoreCheckpoint(str(root / "checkpoint"), FileSystem(), read_only=True)
    assert cp.index_msg_timestamp == index_ts
    fs.drop_unsynced()
    with _reopened_after_a_crash(root, backend) as store:
        assert [m.body for m in store.query_message("T", "k1", 10, 0, 1 << 62).messages] \
            == [b"x"]


def test_queues_synced_together_are_durable_at_a_power_cut(tmp_path, backend, monkeypatch):
    root = tmp_path / "s"
    fs = _CountingSyncs()
    store = _many_queues_written(root, backend, fs, monkeypatch)
    store.flush_cq_service.do_flush(1, force=True)
    assert (fs.fs_syncs, fs.cq_file_syncs) == (1, 0)
    units = {q: bytes(cq.mfq.files[0].mm[:3 * 20]) for q, cq in _queues(store, "M").items()}
    fs.crash()
    store.shutdown()
    fs.drop_unsynced()
    for q, want in units.items():
        with open(root / "consumequeue" / "M" / str(q) / ("0" * 20), "rb") as f:
            assert f.read(3 * 20) == want != bytes(3 * 20)


class _TruncateDuringSyncfs(testing.FaultInjectingFileSystem):
    """Runs `during()` once, as the flush round's file-system sync begins: a truncation that
    lands between the round reading the queues' positions and marking them flushed."""

    during = None

    def sync_filesystem(self, path):
        during, self.during = self.during, None
        if during is not None:
            during()
        return super().sync_filesystem(path)


@needs_syncfs
def test_units_rewritten_after_a_truncation_during_a_round_s_syncfs_are_flushed(
        tmp_path, backend, monkeypatch):
    # The round read queue 0's end (3 units) before its sync; the truncation then cut the
    # queue to 1 unit. Marked flushed to the old end after the sync, the queue would take
    # the unit written next at [20, 40) for durable: no round would sync it.
    root = tmp_path / "s"
    fs = _TruncateDuringSyncfs()
    store = _many_queues_written(root, backend, fs, monkeypatch)
    cq = _queues(store, "M")[0]
    f = cq.mfq.files[0]
    second_phy = CQ_UNIT.struct.unpack_from(f.mm, 20)[0]
    fs.during = lambda: cq.truncate_dirty_logic_files(second_phy)
    store.flush_cq_service.do_flush(1, force=True)
    assert fs.during is None and store.flush_cq_service.synced_together == 1
    assert cq.max_offset_in_queue == 1
    assert cq.mfq.flushed_where <= 20 and f.flushed_position <= 20
    new_unit = (store.commitlog.max_offset, 100, 0)
    cq.put_unit(*new_unit, 1)
    store.flush_cq_service.do_flush(1, force=True)
    assert cq.mfq.flushed_where == f.flushed_position == 40
    fs.crash()
    store.shutdown()
    fs.drop_unsynced()
    with open(root / "consumequeue" / "M" / "0" / ("0" * 20), "rb") as fh:
        fh.seek(20)
        assert CQ_UNIT.struct.unpack(fh.read(20)) == new_unit


class _CutDuringIndexSync(testing.FaultInjectingFileSystem):
    """Runs `during()` once, as the sync of the index file at `path` begins."""

    during = None
    path = None

    def sync_mapped(self, kernels, mm, path, start, length):
        if self.during is not None and path == self.path:
            during, self.during = self.during, None
            during()
        return super().sync_mapped(kernels, mm, path, start, length)


def test_a_full_index_file_a_cut_destroys_while_it_waits_for_its_flush_is_skipped(
        tmp_path, backend):
    # The flush round took the full index files [first, second] to flush; while it synced the
    # first, reset_write_offset cut into the second's records and destroyed it. The round
    # then read the second's header from a file no longer mapped: ValueError out of the
    # flush-cq service's loop, the round's queues and checkpoint left for the next one.
    fs = _CutDuringIndexSync()
    cfg = testing.small_config(max_index_num=40, max_hash_slot_num=8,
                               flush_interval_consume_queue=3_600_000)
    store = testing.open_store(tmp_path / "s", backend, cfg, fs=fs)
    try:
        rs = [store.put_message(Message("T", b"m%d" % i, keys=f"k{i}")) for i in range(100)]
        assert all(r.status is PutMessageStatus.PUT_OK for r in rs)
        testing.wait_dispatched(store)
        index = store.index_service
        first, second = index.index_file_list[:2]
        assert index._pending_flush == [first, second]      # the hour-long round has not run
        cut = next(r.commit_log_offset for r in rs
                   if r.commit_log_offset > second.begin_phy_offset)
        stamp = store.checkpoint.index_msg_timestamp
        fs.path = first.mf.path
        fs.during = lambda: store.reset_write_offset(cut)
        index.flush_pending()
        assert fs.during is None and not second.mf.is_available
        assert index.index_file_list[0] is first and second not in index.index_file_list
        assert store.checkpoint.index_msg_timestamp == first.end_timestamp > stamp
        assert [m.body for m in store.query_message("T", "k3").messages] == [b"m3"]
    finally:
        store.shutdown()


class _CutAfterSync(testing.FaultInjectingFileSystem):
    """Runs `during()` once, right after the sync of a file whose path holds `match`: a cut
    that lands between a flush's sync and its marking the file (and queue) flushed."""

    during = None
    match = None

    def sync_mapped(self, kernels, mm, path, start, length):
        super().sync_mapped(kernels, mm, path, start, length)
        if self.during is not None and self.match in path:
            during, self.during = self.during, None
            during()


def test_units_written_after_a_cut_during_a_flush_s_sync_are_flushed(tmp_path, backend):
    # Queue 0 spans two files (100 units each): the first flushed whole, the second to 50
    # units and now written to 60. Its flush syncs [50, 60) of the second file; before it
    # marks that flushed, a cut to unit 80 deletes the second file. Marked flushed to
    # 100 + 60 units after the cut, the queue would look for its next flush past its end,
    # and the units written next at [80, ..) of the first file would never be synced.
    root = tmp_path / "s"
    fs = _CutAfterSync()
    store = testing.open_store(root, backend, _cq_config(), fs=fs)
    rs = store.put_messages([Message("T", b"t%d" % i) for i in range(150)])
    testing.wait_dispatched(store)
    store.flush_cq_service.do_flush(3, force=True)
    cq = _queues(store, "T")[0]
    assert len(cq.mfq.files) == 2 and cq.mfq.flushed_where == 150 * 20
    store.put_messages([Message("T", b"u%d" % i) for i in range(10)])
    testing.wait_dispatched(store)
    second = cq.mfq.files[1]
    fs.match = second.file_name
    fs.during = lambda: cq.truncate_dirty_logic_files(int(rs.commit_log_offsets[80]))
    store.flush_cq_service.do_flush(1, force=True)
    assert fs.during is None and not store.sync_latch.tripped
    assert len(cq.mfq.files) == 1 and cq.max_offset_in_queue == 80
    assert cq.mfq.flushed_where <= 80 * 20
    new_unit = (store.commitlog.max_offset, 100, 0)
    cq.put_unit(*new_unit, 80)
    store.flush_cq_service.do_flush(1, force=True)
    assert cq.mfq.flushed_where == cq.mfq.files[0].flushed_position == 81 * 20
    fs.crash()
    store.shutdown()
    fs.drop_unsynced()
    with open(root / "consumequeue" / "T" / "0" / ("0" * 20), "rb") as fh:
        fh.seek(80 * 20)
        assert CQ_UNIT.struct.unpack(fh.read(20)) == new_unit


def _count_wakeups(flusher, mfq):
    """The CommitLog's end at each wakeup() of `flusher`, from now on."""
    woken = []
    real = flusher.wakeup

    def counting():
        woken.append(mfq.get_max_offset())
        real()
    flusher.wakeup = counting
    return woken


def _each_put_path_wakes_the_flusher_and_is_flushed(store, woken, big, behind):
    """put_message, put_messages and put_batch of `big` each wake the flusher once, which
    flushes it without waiting for its interval; its next mark is `behind` bytes further."""
    flusher, mfq = store.flush_service, store.commitlog.mfq
    for put in (lambda: store.put_message(big), lambda: store.put_messages([big]),
                lambda: store.put_batch("T", 0, [big.body])):
        before = len(woken)
        assert put().status is PutMessageStatus.PUT_OK
        end = mfq.get_max_offset()
        assert len(woken) == before + 1 and woken[-1] == end
        testing.wait_until(lambda: mfq.flushed_where >= end - end % 4096,
                           what="the flush, long before the interval")
        testing.wait_until(lambda: flusher.wake_from == mfq.flushed_where
                           - mfq.flushed_where % 4096 + behind, what="the next mark")


@pytest.mark.parametrize("reput_too", [False, True], ids=["plain hook", "reput woken too"])
def test_an_async_put_wakes_the_flusher_only_once_it_has_least_pages_to_flush(tmp_path,
                                                                              backend,
                                                                              monkeypatch,
                                                                              reput_too):
    """Without flush_commit_log_timed, RocketMQ's FlushRealTimeService is woken by every put
    and flushes only when flush_commit_log_least_pages pages are unflushed: a put that
    leaves fewer need not wake it (each wake-up cost the putter a Python call and the
    flusher the GIL), one that reaches them must, and the flush follows at once, not at the
    interval. Every put path: put_message, put_messages and put_batch; and the same while
    puts wake reput too (consumer.PutWake: a consumer waits, reput is idle, or here
    wake_reput_on_put), which before woke the flusher at every put. (Reput kept from idling,
    so the hook stays the one the test chose.)"""
    from rocketstore.consumer import PutWake
    monkeypatch.setattr(ReputMessageService, "IDLE_AFTER_MS", 3_600_000)
    store = testing.open_store(tmp_path / "s", backend, testing.small_config(
        flush_disk_type=FlushDiskType.ASYNC_FLUSH, flush_commit_log_timed=False,
        flush_interval_commit_log=60_000, flush_commit_log_least_pages=4,
        wake_reput_on_put=reput_too))
    try:
        flusher = store.flush_service
        mfq = store.commitlog.mfq
        hook = store.commitlog.wake_on_put
        if reput_too:
            assert isinstance(hook, PutWake) and hook.inner is flusher
        else:
            assert hook is flusher
        woken = _count_wakeups(flusher, mfq)
        flushed = mfq.flushed_where
        assert flusher.wake_from == flushed - flushed % 4096 + 4 * 4096
        # Well under 4 pages by each path: nothing to flush, nobody woken.
        assert store.put_message(Message("T", b"a" * 100)).status is PutMessageStatus.PUT_OK
        assert store.put_messages([Message("T", b"b" * 100)] * 3).count == 3
        assert store.put_batch("T", 0, [b"c" * 100] * 3).count == 3
        assert woken == []
        assert mfq.flushed_where == flushed
        # The put whose record reaches the 4th page past the flushed one wakes the flusher,
        # which flushes it (its whole pages, least pages > 0 leaving a partial one dirty)
        # without waiting for its 60 s interval; its next mark is 4 pages further.
        _each_put_path_wakes_the_flusher_and_is_flushed(store, woken,
                                                        Message("T", b"d" * (4 * 4096)), 4 * 4096)
    finally:
        store.shutdown()


def _timed_store(tmp_path, backend, **kwargs):
    """ASYNC_FLUSH, timed (the default), with an interval no test waits for."""
    return testing.open_store(tmp_path / "s", backend, testing.small_config(
        flush_disk_type=FlushDiskType.ASYNC_FLUSH, flush_commit_log_timed=True,
        flush_interval_commit_log=60_000, flush_commit_log_least_pages=4,
        mapped_file_size_commit_log=1 << 20), **kwargs)


def test_a_timed_flusher_sleeps_its_interval_unless_a_put_leaves_write_behind_bytes_unflushed(
        tmp_path, backend, monkeypatch):
    """flush_commit_log_timed (the default): RocketMQ's flusher sleeps its interval whatever
    is written. Here a put that leaves WRITE_BEHIND bytes (64 KiB in this test) past the
    flushed offset ends the sleep, and the flush follows at once, not at the 60 s interval;
    smaller puts wake nothing, every put path alike (doc/03 §2.3). (Reput kept from idling,
    so the hook stays the flusher's own, on a machine slow enough to idle it in between.)"""
    monkeypatch.setattr(FlushRealTimeService, "WRITE_BEHIND", 64 << 10)
    monkeypatch.setattr(ReputMessageService, "IDLE_AFTER_MS", 3_600_000)
    store = _timed_store(tmp_path, backend)
    try:
        flusher = store.flush_service
        mfq = store.commitlog.mfq
        assert store.commitlog.wake_on_put is flusher
        woken = _count_wakeups(flusher, mfq)
        flushed = mfq.flushed_where
        assert flusher.wake_from == flushed - flushed % 4096 + (64 << 10)
        # Past the 4 least pages, but under 64 KiB, by each path: nobody woken, and nothing
        # flushed before the interval.
        page = Message("T", b"a" * 8192)
        assert store.put_message(page).status is PutMessageStatus.PUT_OK
        assert store.put_messages([page] * 2).count == 2
        assert store.put_batch("T", 0, [page.body] * 2).count == 2
        assert woken == []
        time.sleep(0.2)
        assert mfq.flushed_where == flushed
        _each_put_path_wakes_the_flusher_and_is_flushed(store, woken,
                                                        Message("T", b"d" * (64 << 10)), 64 << 10)
    finally:
        store.shutdown()


class _RecordingSyncs(FileSystem):
    """Records each write-behind (with whether it wrote) and each sync of a CommitLog file."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def write_behind(self, kernels, path, start, end):
        wrote = super().write_behind(kernels, path, start, end)
        if "commitlog" in str(path):
            self.calls.append(("write_behind", start, end, wrote))
        return wrote

    def sync_written(self, kernels, mm, path, start, end):
        if "commitlog" in str(path):
            self.calls.append(("sync", start, end))
        return super().sync_written(kernels, mm, path, start, end)


def test_an_async_flush_round_writes_its_pages_back_before_it_syncs_them(tmp_path, backend,
                                                                        monkeypatch):
    """The ASYNC_FLUSH flusher's round first writes back what it will sync, two chunks in
    flight and without a device cache flush (FileSystem.write_behind, where the backend has
    it: Linux's sync_file_range), then syncs the same range, which it finds clean. The
    msyncs alone kept up with a writer under about 1 GB/s, and the kernel's writeback took
    the rest (doc/performance.md, "The device's queue behind those folios")."""
    monkeypatch.setattr(FlushRealTimeService, "WRITE_BEHIND", 64 << 10)
    fs = _RecordingSyncs()
    store = _timed_store(tmp_path, backend, fs=fs)
    try:
        mfq = store.commitlog.mfq
        assert store.put_message(Message("T", b"d" * (80 << 10))).status is \
            PutMessageStatus.PUT_OK
        end = mfq.get_max_offset()
        testing.wait_until(lambda: mfq.flushed_where >= end - end % 4096, what="the flush")
        writes = hasattr(store.kernels, "write_behind") and sys.platform.startswith("linux")
        # (The first round after a start is a thorough one: it takes the partial page too.)
        (kind, start, to, wrote), sync = fs.calls[:2]
        assert (kind, start, wrote) == ("write_behind", 0, writes) and to >= end - end % 4096
        assert sync == ("sync", 0, to)
    finally:
        store.shutdown()
