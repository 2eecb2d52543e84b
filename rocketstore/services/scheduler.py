# SPDX-License-Identifier: Apache-2.0
"""The store's scheduled thread (DefaultMessageStore's scheduledExecutorService): one
ServiceThread running the periodic jobs the store hands it, cleaning, the disk check and
config persistence among them."""
import logging
import time

from .base import ServiceThread

log = logging.getLogger(__name__)


class StoreScheduledService(ServiceThread):
    """The store's scheduled thread: cleaning every clean_resource_interval after 60 s, the
    disk-full check every 10 s after 1 s, and config persistence. Each task is
    (name, first delay ms, period ms, callable); timing is monotonic, the decisions inside
    the callables use the store clock."""

    name = "StoreScheduledService"
    join_time_s = 30.0

    def __init__(self, tasks):
        super().__init__()
        now = time.monotonic() * 1000.0
        self.tasks = [[name, now + delay, period, fn] for name, delay, period, fn in tasks]

    def run_once(self):
        now = time.monotonic() * 1000.0
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
