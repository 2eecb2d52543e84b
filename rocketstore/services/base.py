# SPDX-License-Identifier: Apache-2.0
"""ServiceThread (RocketMQ common/ServiceThread.java) on a threading.Event: the one thread
lifecycle of the store. Every background loop (flushing, reput, cleaning, scheduling, the
HA accept loop, each HA connection's reader and writer, the HA client) is one of these.

The stop/join rule: `stop()` asks the loop to end and returns at once, from any thread (the
loop's own included); `interrupt()` is its hook to cut a blocking call short (a socket
shutdown). `shutdown()` is `stop()` and then a join of at most `join_time_s`; a thread never
joins itself. `on_shutdown()` runs on the service's own thread once its loop has ended."""
import array
import logging
import os
import threading

log = logging.getLogger(__name__)


def run_as_batch():
    """Schedule the calling thread as SCHED_BATCH where the system has it; True if it now is.

    A batch thread gets its fair share of CPU but does not preempt a running thread when it
    wakes. The services that work ahead of a writer (populating and reserving its next
    pages, making its next files) are woken by the writer itself: as ordinary threads, each
    wake-up on a 2-core machine put the putting thread off its CPU for 1-2 ms while the
    woken one populated, a put_messages round of 4 ms then taking 6-7 (doc/performance.md,
    "Threads that work ahead of the writer yield to it"). Their work has slack by design:
    a writer that reaches an unpopulated page faults it itself."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))   # 0: this thread, on Linux
    except OSError as e:                  # a sandbox that refuses it: run as before
        log.debug("SCHED_BATCH refused: %s", e)
        return False
    return True


class ServiceThread:
    """A daemon loop. `wait_for_running(ms)` returns early after `wakeup()` and then calls
    `on_wait_end()`; `run_once()` is the body; an exception from it is logged and handed
    to `on_error()`, which by default goes on after 10 ms."""

    name = "ServiceThread"
    join_time_s = 90.0
    # Work done ahead of a writer, which the writer does itself when this thread lags: run as
    # SCHED_BATCH (run_as_batch), so that waking it never takes the writer's CPU.
    works_ahead = False

    def __init__(self, name=None):
        if name is not None:
            self.name = name
        self._stopped = threading.Event()
        self._notified = threading.Event()
        # has_notified (0 or 1) and wake_from, in one int64 cell that the compiled put path
        # reads in place (pyx/_put.pxi, PutPath._wake): as attributes, their two lookups were
        # 20-40 ns of a put_message of about 500 (doc/performance.md).
        self.wake_cell = array.array("q", [0, 0])
        self._thread = None

    @property
    def has_notified(self):
        """ServiceThread.hasNotified: a wakeup while one is pending costs one read, not the
        Event's lock and notify (a put wakes the flusher every time)."""
        return self.wake_cell[0] != 0

    @has_notified.setter
    def has_notified(self, value):
        self.wake_cell[0] = 1 if value else 0

    @property
    def wake_from(self):
        """As CommitLog.wake_on_put: a put whose records end before this CommitLog offset does
        not wake the service (the store's put paths read it before wakeup()). 0: every put
        does."""
        return self.wake_cell[1]

    @wake_from.setter
    def wake_from(self, offset):
        self.wake_cell[1] = offset

    @property
    def is_stopped(self):
        return self._stopped.is_set()

    @property
    def is_alive(self):
        """Whether the loop's thread is running (False before start and once it ended)."""
        t = self._thread
        return t is not None and t.is_alive()

    def start(self):
        if self._thread is not None:
            return
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self):
        if self.works_ahead:
            run_as_batch()
        while not self._stopped.is_set():
            try:
                self.run_once()
            except Exception:  # a service must never die silently
                log.exception("%s: error in service loop", self.name)
                try:
                    self.on_error()
                except Exception:
                    log.exception("%s: error handling an error", self.name)
                    self.stop()
        try:
            self.on_shutdown()
        except Exception:
            log.exception("%s: error during shutdown", self.name)

    def run_once(self):
        raise NotImplementedError  # pragma: no cover - every service overrides it

    def on_error(self):
        """run_once raised (already logged): pause 10 ms, so a lasting fault does not spin."""
        self._stopped.wait(0.01)

    def on_shutdown(self):
        """Last work after the loop ends (a final flush, a drain, closing a socket)."""

    def on_wait_end(self):
        """Called when a wait ends (swap request lists here)."""

    def interrupt(self):
        """Cut a blocking call in run_once short (stop() calls it; shut a socket down here)."""

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

    def stop(self):
        """Ask the loop to end after its current run_once; never blocks, any thread may call
        it, and calling it again does nothing more."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.has_notified = True
        self._notified.set()
        try:
            self.interrupt()
        except Exception:
            log.exception("%s: error interrupting the loop", self.name)

    def join(self, timeout_s=None):
        """Wait up to `timeout_s` (default join_time_s) for the loop to end; True once it
        has (or never ran). A loop asking to join itself returns False at once."""
        t = self._thread
        if t is None:
            return True
        if t is threading.current_thread():
            return False
        t.join(self.join_time_s if timeout_s is None else timeout_s)
        if t.is_alive():
            log.warning("%s did not stop within %.0f s", self.name,
                        self.join_time_s if timeout_s is None else timeout_s)
            return False
        return True

    def shutdown(self):
        """stop() and join(): the loop has ended when this returns (or join_time_s passed).
        True if it ended (or never ran); False if it may still be running (its on_shutdown
        included), which a caller counting on its last work must not take as done."""
        self.stop()
        ended = self.join()
        self._thread = None
        return ended
