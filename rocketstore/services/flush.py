# SPDX-License-Identifier: Apache-2.0
"""Flush services (spec 03 §2): CommitLog async flush and ConsumeQueue flush + checkpoint."""
import logging
import threading
import time

from .base import ServiceThread

log = logging.getLogger(__name__)


def _now_ms():
    return time.monotonic_ns() // 1_000_000


class FlushRealTimeService(ServiceThread):
    """ASYNC_FLUSH: every flush_interval_commit_log ms, flush if at least
    flush_commit_log_least_pages pages are dirty; everything every thorough interval."""

    name = "FlushRealTimeService"

    def __init__(self, store):
        super().__init__()
        self._store = store
        self._last_flush = 0

    def run_once(self):
        cfg = self._store.config
        least = cfg.flush_commit_log_least_pages
        now = _now_ms()
        if now >= self._last_flush + cfg.flush_commit_log_thorough_interval:
            self._last_flush = now
            least = 0
        if cfg.flush_commit_log_timed:
            self._stopped.wait(cfg.flush_interval_commit_log / 1000.0)
        else:
            self.wait_for_running(cfg.flush_interval_commit_log)
        if self.is_stopped:
            return
        mfq = self._store.commitlog.mfq
        mfq.flush(least)
        if mfq.store_timestamp > 0:
            self._store.checkpoint.physic_msg_timestamp = mfq.store_timestamp

    def on_shutdown(self):
        # Full flushes until nothing moves, one file per call, so every file written since
        # the last round is covered; these do not refresh physicMsgTimestamp.
        mfq = self._store.commitlog.mfq
        for _ in range(len(mfq.files) + 10):
            if mfq.flush(0):
                break


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH group commit: a put waits until the flushed offset passes its record's end;
    one flush (one msync per file touched) serves every put waiting at that moment, and puts
    arriving during a flush are served by the next one (spec 03 §2.2)."""

    name = "GroupCommitService"

    def __init__(self, store):
        super().__init__()
        self._store = store
        self._mfq = store.commitlog.mfq
        self._cond = threading.Condition()
        self._flushed = self._mfq.flushed_where   # published under _cond
        self._final_flush_done = False              # set under _cond by on_shutdown

    def wait_flushed(self, offset, timeout_ms):
        """Block until `offset` is durable; False after `timeout_ms` (FLUSH_DISK_TIMEOUT)."""
        if self._flushed >= offset:
            return True
        self.wakeup()
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._cond:
            while self._flushed < offset:
                remaining = deadline - time.monotonic()
                # Not is_stopped: the final flush still serves a put written before
                # shutdown, so only its completion ends the wait early.
                if remaining <= 0 or self._final_flush_done:
                    return self._flushed >= offset
                self._cond.wait(remaining)
        return True

    def run_once(self):
        self.wait_for_running(10)
        self.flush_all()

    def flush_all(self):
        mfq = self._mfq
        target = mfq.get_max_offset()
        # One call flushes one file: a batch that crossed into a new file needs a second.
        for _ in range(len(mfq.files) + 1):
            if mfq.flush(0) or mfq.flushed_where >= target:
                break
        if mfq.store_timestamp > 0:
            self._store.checkpoint.physic_msg_timestamp = mfq.store_timestamp
        with self._cond:
            self._flushed = mfq.flushed_where
            self._cond.notify_all()

    def on_shutdown(self):
        self.flush_all()
        with self._cond:
            self._final_flush_done = True
            self._cond.notify_all()


class CommitRealTimeService(ServiceThread):
    """With a TransientStorePool: copy write buffers into the files every
    commit_interval_commit_log ms (4 pages at least, everything every thorough interval), then
    wake the flusher (spec 03 §2.4)."""

    name = "CommitRealTimeService"

    def __init__(self, store):
        super().__init__()
        self._store = store
        self._last_commit = 0
        # One committer at a time: this thread, or a reader wanting its own puts visible.
        self._lock = threading.Lock()

    def run_once(self):
        cfg = self._store.config
        least = cfg.commit_commit_log_least_pages
        now = _now_ms()
        if now >= self._last_commit + cfg.commit_commit_log_thorough_interval:
            least = 0
        mfq = self._store.commitlog.mfq
        with self._lock:
            moved = not mfq.commit(least)
        if moved:
            self._last_commit = now
            flusher = self._store.flush_service
            if flusher is not None:
                flusher.wakeup()
        self.wait_for_running(cfg.commit_interval_commit_log)

    def _commit_all(self):
        mfq = self._store.commitlog.mfq
        for _ in range(len(mfq.files) + 10):
            if mfq.commit(0):
                break

    def commit_now(self):
        """Commit every write buffer in the caller's thread, so a read sees each put that
        returned (the readers' view of a pooled file ends at its committed position).
        Nothing once the service stopped: its final commit ran."""
        mfq = self._store.commitlog.mfq
        if mfq.committed_where >= mfq.get_max_wrote_position():
            return
        with self._lock:
            if not self.is_stopped:
                self._commit_all()

    def on_shutdown(self):
        with self._lock:
            self._commit_all()


class FlushConsumeQueueService(ServiceThread):
    """Flush every ConsumeQueue each flush_interval_consume_queue ms; on thorough rounds (and
    at shutdown) also write the checkpoint file."""

    name = "FlushConsumeQueueService"

    def __init__(self, store):
        super().__init__()
        self._store = store
        self._last_thorough = 0

    def do_flush(self, retry_times, force=False):
        # Index files that filled up are flushed here, each advancing the checkpoint's
        # indexMsgTimestamp (the broker starts a thread per full file for the same job).
        flush_pending = getattr(getattr(self._store, "index_service", None), "flush_pending",
                                None)
        if flush_pending is not None:
            flush_pending()
        cfg = self._store.config
        least = cfg.flush_consume_queue_least_pages
        now = _now_ms()
        snapshot = 0
        if force or now >= self._last_thorough + cfg.flush_consume_queue_thorough_interval:
            self._last_thorough = now
            least = 0
            snapshot = self._store.checkpoint.logics_msg_timestamp
        for cq in self._store.all_consume_queues():
            for _ in range(retry_times):
                if cq.flush(least):
                    break
        if least == 0:
            if snapshot > 0:
                self._store.checkpoint.logics_msg_timestamp = snapshot
            self._store.checkpoint.flush()

    def run_once(self):
        self.wait_for_running(self._store.config.flush_interval_consume_queue)
        if not self.is_stopped:
            self.do_flush(1)

    def on_shutdown(self):
        self.do_flush(3, force=True)
