# SPDX-License-Identifier: Apache-2.0
"""Races between a put and shutdown, and between cleaning and the reput and flush services:
each interleaving is forced with events; the one stress test only widens its window by
yielding inside the put lock."""
import errno
import os
import threading
import time

import pytest

from rocketstore import (FlushDiskType, Message, MessageStore, PutMessageStatus,
                         StoreClosedError, testing)
from rocketstore.clock import StepClock
from rocketstore.fs import FileSystem


class StallingClock:
    """A store clock that, once armed, blocks its next call until released: the put holding
    the put lock stops right there."""

    def __init__(self):
        self._inner = StepClock()
        self.armed = False
        self.stalled = threading.Event()
        self.go = threading.Event()

    def __call__(self):
        if self.armed:
            self.armed = False
            self.stalled.set()
            self.go.wait()
        return self._inner()


class ContendedLock:
    """The put lock, reporting through `contended` when a second thread has to wait for it."""

    def __init__(self, contended):
        self._lock = threading.Lock()
        self._contended = contended

    def acquire(self, blocking=True, timeout=-1):
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        self._contended.set()
        return self._lock.acquire(True, timeout)

    def release(self):
        self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def pool_config(**kw):
    return testing.small_config(transient_store_pool_enable=True, transient_store_pool_size=3,
                                **kw)


def bodies_on_disk(root, backend, config, topic="T", queue_id=0):
    """Reopen the store and return (recovery report, every body of the queue)."""
    store = MessageStore(root, config, kernels=backend)
    report = store.load()
    try:
        out, offset = [], 0
        while True:
            g = store.get_message("g", topic, queue_id, offset, 32)
            if not g.messages:
                return report, out
            out.extend(m.body for m in g.messages)
            offset = g.next_begin_offset
    finally:
        store.shutdown()


@pytest.mark.parametrize("config", [
    testing.small_config(), pool_config(),
    testing.small_config(flush_disk_type=FlushDiskType.SYNC_FLUSH)],
    ids=["mapped", "transient-pool", "sync-flush"])
def test_a_put_stalled_inside_the_lock_is_durable_before_shutdown_closes_the_files(
        tmp_path, backend, config):
    clock = StallingClock()
    store = testing.open_store(tmp_path / "s", backend, config, clock=clock)
    before = [store.put_message(Message("T", b"early-%d" % i)) for i in range(40)]
    assert all(r.status is PutMessageStatus.PUT_OK for r in before)
    # Shutdown is either waiting for the put lock or done: then the stalled put goes on.
    reached = threading.Event()
    store.commitlog.put_lock = ContendedLock(reached)
    outcome = {}

    def stalled_put():
        try:
            outcome["result"] = store.put_message(Message("T", b"stalled"))
        except StoreClosedError as exc:
            outcome["error"] = exc

    def shutdown():
        try:
            store.shutdown()
        finally:
            reached.set()
    clock.armed = True
    putter = threading.Thread(target=stalled_put)
    putter.start()
    clock.stalled.wait()
    closer = threading.Thread(target=shutdown)
    closer.start()
    reached.wait()
    clock.go.set()
    putter.join()
    closer.join()
    # The put held the lock first, so shutdown waited for it: written, and durable as its
    # flush mode promises (under SYNC_FLUSH, answered only once flushed).
    assert outcome["result"].status is PutMessageStatus.PUT_OK
    report, bodies = bodies_on_disk(tmp_path / "s", backend, config)
    assert bodies == [b"early-%d" % i for i in range(40)] + [b"stalled"]
    assert report.normal


class YieldingClock(StepClock):
    """A clock that gives up the GIL inside the put lock, so producers queue at the lock
    while shutdown runs (the window in which acknowledged puts used to be lost)."""

    def __call__(self):
        time.sleep(0.0002)
        return super().__call__()


def test_puts_acknowledged_while_shutdown_runs_are_all_there_after_reopen(tmp_path, backend):
    config = pool_config(commit_interval_commit_log=50)
    store = testing.open_store(tmp_path / "s", backend, config, clock=YieldingClock())
    acked = [[] for _ in range(8)]
    errors = []
    enough = threading.Event()

    def produce(t):
        i = 0
        try:
            while True:
                try:
                    r = store.put_message(Message("T", b"%d-%d" % (t, i), queue_id=t))
                except StoreClosedError:
                    return
                if not r.status.ok:
                    return
                acked[t].append(b"%d-%d" % (t, i))
                i += 1
                if i == 60:
                    enough.set()
        except Exception as exc:
            errors.append(exc)
        finally:
            enough.set()

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    enough.wait()
    store.shutdown()
    for t in threads:
        t.join()
    assert errors == []
    for q in range(8):
        report, bodies = bodies_on_disk(tmp_path / "s", backend, config, queue_id=q)
        assert bodies == acked[q]


def test_a_put_after_shutdown_began_raises_store_closed_and_writes_nothing(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    store.put_message(Message("T", b"kept"))
    store.commitlog.stop_puts()
    with pytest.raises(StoreClosedError):
        store.put_message(Message("T", b"refused"))
    with pytest.raises(StoreClosedError):
        store.put_messages([Message("T", b"refused")])
    store.shutdown()
    _, bodies = bodies_on_disk(tmp_path / "s", backend, testing.small_config())
    assert bodies == [b"kept"]


class FailingSync(testing.FaultInjectingFileSystem):
    """msync of CommitLog files fails with EIO once `failing` is set: a disk gone bad."""

    @property
    def failing(self):
        return bool(self._faults)

    @failing.setter
    def failing(self, failing):
        self.heal()
        if failing:
            self.fail("sync", errno.EIO, match=os.sep + "commitlog" + os.sep)


def test_shutdown_keeps_the_abort_file_when_the_commitlog_could_not_be_flushed(tmp_path,
                                                                                backend):
    fs = FailingSync()
    store = testing.open_store(tmp_path / "s", backend, fs=fs)
    fs.failing = True
    store.put_message(Message("T", b"not durable"))
    store.shutdown()
    assert (tmp_path / "s" / "abort").exists()
    report, bodies = bodies_on_disk(tmp_path / "s", backend, testing.small_config())
    assert not report.normal and bodies == [b"not durable"]


def cleaning_config(**kw):
    """Small files that expire at once, and no pause between deletions."""
    return testing.small_config(mapped_file_size_commit_log=4096, file_reserved_time=0,
                                delete_commit_log_files_interval=0,
                                delete_consume_queue_files_interval=0, **kw)


def open_cleaning_store(root, backend, config, fs=None):
    return testing.open_store(root, backend, config, fs=fs, disk_usage=lambda path: 0.2)


def test_cleaning_keeps_files_reput_has_not_dispatched_so_queue_offsets_stay_aligned(
        tmp_path, backend):
    store = open_cleaning_store(tmp_path / "s", backend, cleaning_config())
    try:
        store.reput_service.shutdown()      # reput stands still: the batch below is not seen
        for i in range(60):
            assert store.put_message(Message("T", b"m%d" % i + b"x" * 200)).status.ok
        assert len(store.commitlog.mfq.files) > 3
        store.execute_delete_files_manually()
        store.clean_files_periodically()
        store.reput_service.start()
        testing.wait_dispatched(store)
        for i in (0, 22, 33, 59):
            m = store.get_message("g", "T", 0, i, 1).messages[0]
            assert (m.queue_offset, m.body[:4].rstrip(b"x")) == (i, b"m%d" % i)
        r = store.put_message(Message("T", b"next"))
        assert r.queue_offset == 60
        testing.wait_dispatched(store)
        assert store.get_message("g", "T", 0, 60, 1).messages[0].body == b"next"
    finally:
        store.shutdown()


def test_cleaning_keeps_the_files_past_a_failed_sync_for_the_next_open_to_recover(tmp_path,
                                                                                 backend):
    fs = FailingSync()
    config = cleaning_config(flush_disk_type=FlushDiskType.SYNC_FLUSH,
                             sync_flush_timeout=10_000)
    store = open_cleaning_store(tmp_path / "s", backend, config, fs=fs)
    try:
        assert store.put_message(Message("T", b"flushed")).status is PutMessageStatus.PUT_OK
        fs.failing = True
        written = 0
        for i in range(60):
            r = store.put_message(Message("T", b"x%02d" % i + b"x" * 200,
                                          properties={"WAIT": "false"}))
            if r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE:
                break                       # the thread's sync failed: puts are refused
            assert r.status.ok
            written += 1
        # The premise: a sync failed while the puts were unflushed (the group commit's thread
        # syncs every 10 ms; on a loaded machine the loop can end before it ran).
        latch = store.sync_latch
        testing.wait_until(lambda: latch.failed(latch.COMMITLOG), what="a failed sync")
        testing.wait_dispatched(store)
        store.execute_delete_files_manually()
        store.clean_files_periodically()
        mfq = store.commitlog.mfq
        assert mfq.files[0].file_from_offset <= mfq.flushed_where
        fs.failing = False
    finally:
        store.shutdown()
    store = open_cleaning_store(tmp_path / "s", backend, config)
    try:
        # No power cut (the pages the failed sync lost are still in the page cache): every
        # put written is recovered, none was cleaned away unflushed.
        assert not store.recovery_report.normal
        testing.wait_dispatched(store)
        assert store.get_max_offset_in_queue("T", 0) == 1 + written
    finally:
        store.shutdown()


def test_cleaning_consume_queue_files_the_flusher_had_not_reached_keeps_the_queue_flushing(
        tmp_path, backend):
    # SYNC_FLUSH: every CommitLog file is flushed, so cleaning may delete them.
    config = cleaning_config(mapped_file_size_consume_queue=20 * 50,
                             flush_interval_consume_queue=3_600_000,
                             flush_disk_type=FlushDiskType.SYNC_FLUSH)
    store = open_cleaning_store(tmp_path / "s", backend, config)
    try:
        for i in range(400):
            assert store.put_message(Message("T", b"x" * 100)).status.ok
        testing.wait_dispatched(store)
        cq = store.consume_queue_table["T"][0]
        cq.flush(0)                         # the flusher stands in the first file
        assert 0 < cq.mfq.flushed_where <= cq.mfq.files[1].file_from_offset
        store.execute_delete_files_manually()
        store.clean_files_periodically()
        assert cq.mfq.files[0].file_from_offset > cq.mfq.flushed_where
        for i in range(100):
            assert store.put_message(Message("T", b"y" * 100)).status.ok
        testing.wait_dispatched(store)
        for _ in range(len(cq.mfq.files) + 1):
            store.flush_cq_service.do_flush(1, force=True)
        assert cq.mfq.flushed_where == cq.mfq.get_max_offset()
    finally:
        store.shutdown()


class CommitDuringFinalPersist(FileSystem):
    """Commits an offset from inside shutdown's write of consumerOffset.json: the moment a
    change used to be taken after the file's content was fixed."""

    store = None
    outcome = None

    def write_bytes(self, path, data, sync=True):
        if self.store is not None and path.endswith("consumerOffset.json.tmp"):
            store, self.store = self.store, None
            try:
                store.commit_offset("g", "T", 0, 99)
                self.outcome = "acknowledged"
            except StoreClosedError:
                self.outcome = "refused"
        super().write_bytes(path, data, sync)


def test_a_config_change_racing_shutdown_is_kept_or_refused_never_acknowledged_and_lost(
        tmp_path, backend):
    fs = CommitDuringFinalPersist()
    store = testing.open_store(tmp_path / "s", backend, fs=fs)
    store.commit_offset("g", "T", 0, 1)
    fs.store = store
    store.shutdown()
    assert fs.outcome is not None
    store = testing.open_store(tmp_path / "s", backend)
    try:
        kept = store.query_offset("g", "T", 0)
        assert (fs.outcome, kept) in (("acknowledged", 99), ("refused", 1))
        store.commit_offset("g", "T", 0, 2)         # a reopened store takes changes again
    finally:
        store.shutdown()
    store = testing.open_store(tmp_path / "s", backend)
    try:
        assert store.query_offset("g", "T", 0) == 2
    finally:
        store.shutdown()


def test_a_store_shut_down_and_started_again_takes_puts_again(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    store.put_message(Message("T", b"first"))
    store.shutdown()
    store.load()
    store.start()
    try:
        assert store.put_message(Message("T", b"second")).status is PutMessageStatus.PUT_OK
        assert [m.body for m in store.get_message("g", "T", 0, 0).messages] == \
            [b"first", b"second"]
    finally:
        store.shutdown()
