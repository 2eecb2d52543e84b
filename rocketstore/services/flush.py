# SPDX-License-Identifier: Apache-2.0
"""Flush services (spec 03 §2): CommitLog async flush and ConsumeQueue flush + checkpoint."""
import logging
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
        # Up to 10 full flushes until nothing moves; these do not refresh physicMsgTimestamp.
        mfq = self._store.commitlog.mfq
        for _ in range(10):
            if mfq.flush(0):
                break


class FlushConsumeQueueService(ServiceThread):
    """Flush every ConsumeQueue each flush_interval_consume_queue ms; on thorough rounds (and
    at shutdown) also write the checkpoint file."""

    name = "FlushConsumeQueueService"

    def __init__(self, store):
        super().__init__()
        self._store = store
        self._last_thorough = 0

    def do_flush(self, retry_times, force=False):
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
