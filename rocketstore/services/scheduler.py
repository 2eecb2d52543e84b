# SPDX-License-Identifier: Apache-2.0
"""The store's scheduled thread (DefaultMessageStore's scheduledExecutorService): one
ServiceThread running the periodic jobs the store hands it, cleaning, the disk check and
config persistence among them."""
import logging

from ..clock import monotonic_ms
from .base import ServiceThread

log = logging.getLogger(__name__)


class StoreScheduledService(ServiceThread):
    """The store's scheduled thread: cleaning every clean_resource_interval after 60 s, the
    disk-full check every 10 s after 1 s, and config persistence. Each task is
    (name, first delay ms, period ms, callable); timing is monotonic (`now`, milliseconds),
    the decisions inside the callables use the store clock."""

    name = "StoreScheduledService"
    join_time_s = 30.0

    def __init__(self, tasks, now=monotonic_ms):
        super().__init__()
        self._now = now
        start = now()
        self.tasks = [[name, start + delay, period, fn] for name, delay, period, fn in tasks]

    def run_once(self):
        now = self._now()
        due = min(t[1] for t in self.tasks)
        if due > now:
            self.wait_for_running(due - now)
            return
        for task in self.tasks:
            if self.is_stopped:
                return
            name, at, period, fn = task
            if at <= now:
                task[1] = now + period
                try:
                    fn()
                except Exception:
                    log.exception("%s: scheduled task %s failed", self.name, name)
