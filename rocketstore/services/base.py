# SPDX-License-Identifier: Apache-2.0
"""ServiceThread (RocketMQ common/ServiceThread.java) on a threading.Event."""
import logging
import threading

log = logging.getLogger(__name__)


class ServiceThread:
    """A daemon loop. `wait_for_running(ms)` returns early after `wakeup()` and then calls
    `on_wait_end()`; `run_once()` is the body; exceptions are logged and the loop goes on."""

    name = "ServiceThread"
    join_time_s = 90.0

    def __init__(self):
        self._stopped = threading.Event()
        self._notified = threading.Event()
        # ServiceThread.hasNotified: a wakeup while one is pending costs one attribute read,
        # not the Event's lock and notify (a put wakes the flusher every time).
        self.has_notified = False
        self._thread = None

    @property
    def is_stopped(self):
        return self._stopped.is_set()

    def start(self):
        if self._thread is not None:
            return
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stopped.is_set():
            try:
                self.run_once()
            except Exception:  # a service must never die silently
                log.exception("%s: error in service loop", self.name)
                self._stopped.wait(0.01)
        try:
            self.on_shutdown()
        except Exception:
            log.exception("%s: error during shutdown", self.name)

    def run_once(self):
        raise NotImplementedError  # pragma: no cover - every service overrides it

    def on_shutdown(self):
        """Last work after the loop ends (a final flush, a drain)."""

    def on_wait_end(self):
        """Called when a wait ends (swap request lists here)."""

    def wakeup(self):
        if not self.has_notified:
            self.has_notified = True
            self._notified.set()

    def wait_for_running(self, interval_ms):
        # has_notified is the truth and the Event only wakes a sleeper: a wakeup landing
        # between the two resets below leaves has_notified set, so the next call returns at
        # once instead of sleeping a whole interval with a request pending.
        if not self.has_notified:
            self._notified.wait(interval_ms / 1000.0)
        self.has_notified = False
        self._notified.clear()
        self.on_wait_end()

    def shutdown(self):
        self._stopped.set()
        self.has_notified = True
        self._notified.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(self.join_time_s)
            if t.is_alive():
                log.warning("%s did not stop within %.0f s", self.name, self.join_time_s)
        self._thread = None
