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
    """SYNC_FLUSH group commit, leader/follower: a put waits until the flushed offset passes
    its record's end (spec 03 §2.2).

    The first put to wait while no flush runs leads: in its own thread, without the GIL, it
    flushes everything written so far, whoever wrote it. Puts that wait meanwhile follow: each
    sleeps on a lock of its own, released by the leader whose flush covered it, so a flush
    wakes exactly the puts it made durable and no one else (no notify_all convoy on one
    condition). When a flush ends with puts still uncovered (written after it began), the one
    with the lowest offset is woken to lead the next flush. Every put written while a flush
    runs is covered by the next one: concurrent producers and batches share syncs.

    The thread itself leads a flush every 10 ms, or on wakeup(), when nobody does: it serves
    puts that do not wait (WAIT=false) and a slave's appends, as 4.9.x's GroupCommitService
    flushes with no request pending. Its final flush ends every wait.

    A put answers PUT_OK only if its bytes were flushed within its timeout; a leader whose
    flush outlasted the timeout answers FLUSH_DISK_TIMEOUT like its followers, once the flush
    it runs returns (msync cannot be interrupted)."""

    name = "GroupCommitService"
    RETRY_S = 0.01          # pause after a failed flush, as the service loop pauses after an error

    def __init__(self, store):
        super().__init__()
        self._store = store
        self._mfq = store.commitlog.mfq
        self._lock = threading.Lock()
        self._flushed = self._mfq.flushed_where   # published under _lock, read anywhere
        self._leading = False                       # a flush is running; under _lock
        self._waiters = []                          # [end offset, lock held until woken]
        self._final_flush_done = False              # set under _lock by on_shutdown
        self.syncs = 0        # flushes that made something durable (benchmarks report it)

    def wait_flushed(self, offset, timeout_ms):
        """Block until `offset` is durable; False after `timeout_ms` (FLUSH_DISK_TIMEOUT)."""
        if self._flushed >= offset:
            return True
        return self._await(offset, time.monotonic() + timeout_ms / 1000.0)

    def _await(self, offset, deadline):
        lock = self._lock
        me = None
        while True:
            with lock:
                if me is not None and me in self._waiters:
                    self._waiters.remove(me)            # timed out, not woken
                if self._flushed >= offset:
                    return True
                if self._final_flush_done:
                    # Not is_stopped: the final flush still serves a put written before
                    # shutdown, so only its completion ends the wait early.
                    return False
                lead = not self._leading
                if lead:
                    self._leading = True
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    me = [offset, _new_lock()]
                    me[1].acquire()
                    self._waiters.append(me)
            if lead:
                self._lead(deadline)
                with lock:
                    if self._flushed >= offset and time.monotonic() <= deadline:
                        return True
                    if time.monotonic() > deadline:
                        return False
                # The flush failed and time remains: wait for (or lead) another.
                me = None
                continue
            me[1].acquire(True, remaining)

    def _lead(self, deadline=None):
        """Flush everything written, then publish, wake the puts covered and hand the lead to
        the first uncovered one. Call holding the lead (`_leading` set by the caller). A failed
        flush is logged and retried every RETRY_S until `deadline` (None: once)."""
        mfq = self._mfq
        try:
            while True:
                before = mfq.flushed_where
                try:
                    self._flush_written()
                    break
                except Exception:       # EIO and the like: the puts wait, as for a stall
                    log.exception("%s: flush failed", self.name)
                    if deadline is None or time.monotonic() + self.RETRY_S > deadline:
                        break
                    time.sleep(self.RETRY_S)
        finally:
            with self._lock:
                flushed = self._flushed = mfq.flushed_where
                if flushed > before:
                    self.syncs += 1
                self._leading = False
                waiters = self._waiters
                if waiters:
                    rest = []
                    for w in waiters:
                        if w[0] <= flushed:
                            w[1].release()
                        else:
                            rest.append(w)
                    if rest:
                        nxt = min(rest, key=_offset_of)
                        rest.remove(nxt)
                        nxt[1].release()            # it leads the next flush
                    self._waiters = rest

    def _flush_written(self):
        mfq = self._mfq
        target = mfq.get_max_offset()
        # One call flushes one file: a batch that crossed into a new file needs a second.
        for _ in range(len(mfq.files) + 1):
            if mfq.flush(0) or mfq.flushed_where >= target:
                break
        if mfq.store_timestamp > 0:
            self._store.checkpoint.physic_msg_timestamp = mfq.store_timestamp

    def _take_lead(self, timeout_s):
        """Become the leader (the thread's own rounds); False if a put holds the lead past
        `timeout_s` (None: wait for it however long)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        me = None
        while True:
            with self._lock:
                if me is not None and me in self._waiters:
                    self._waiters.remove(me)
                if not self._leading:
                    self._leading = True
                    return True
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                # Queued as the highest offset: woken when a flush leaves nobody else to lead.
                me = [float("inf"), _new_lock()]
                me[1].acquire()
                self._waiters.append(me)
            me[1].acquire(True, -1 if deadline is None else
                          max(0.0, deadline - time.monotonic()))

    def run_once(self):
        self.wait_for_running(10)
        mfq = self._mfq
        # Only when something is unflushed and no put leads: the leader flushes it anyway.
        if self._leading or mfq.flushed_where >= mfq.get_max_offset():
            return
        with self._lock:
            if self._leading:
                return
            self._leading = True
        self._lead()

    def on_shutdown(self):
        self._take_lead(None)
        self._lead()
        with self._lock:
            self._final_flush_done = True
            waiters, self._waiters = self._waiters, []
        for w in waiters:
            w[1].release()


def _new_lock():
    return threading.Lock()


def _offset_of(waiter):
    return waiter[0]


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
