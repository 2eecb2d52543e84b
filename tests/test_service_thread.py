# SPDX-License-Identifier: Apache-2.0
"""ServiceThread (services/base.py), the one thread lifecycle of the store, and the store's
scheduled thread built on it (services/scheduler.py), driven without a store."""
import os
import socket
import threading

import pytest

from rocketstore import testing
from rocketstore.clock import ManualClock
from rocketstore.services.base import ServiceThread
from rocketstore.services.scheduler import StoreScheduledService


class Recorder(ServiceThread):
    """Runs `body` per loop and records on which thread on_shutdown ran."""

    name = "Recorder"
    join_time_s = 10.0

    def __init__(self, body):
        super().__init__()
        self.body = body
        self.runs = 0
        self.shutdown_thread = None

    def run_once(self):
        self.runs += 1
        self.body(self)

    def on_shutdown(self):
        self.shutdown_thread = threading.current_thread()


def test_a_loop_that_stops_itself_ends_and_runs_on_shutdown_on_its_own_thread():
    def body(svc):
        if svc.runs == 3:
            assert svc.join() is False                 # joining itself: refused, no deadlock
            svc.stop()
    svc = Recorder(body)
    svc.start()
    testing.wait_until(lambda: not svc.is_alive, 10, "the loop to end")
    assert svc.runs == 3 and svc.is_stopped
    assert svc.shutdown_thread is not None
    assert svc.shutdown_thread is not threading.current_thread()
    svc.shutdown()                                     # after the loop ended: returns at once


def test_shutdown_interrupts_a_blocking_call_and_waits_for_the_loop_to_end():
    a, b = socket.socketpair()

    class Blocked(Recorder):
        interrupts = 0

        def interrupt(self):
            self.interrupts += 1
            a.shutdown(socket.SHUT_RDWR)

    entered = threading.Event()

    def body(svc):
        entered.set()
        a.recv(1)                                      # blocks until interrupt() cuts it

    svc = Blocked(body)
    svc.start()
    entered.wait(10)
    svc.shutdown()
    assert not svc.is_alive and svc.interrupts == 1
    assert svc.shutdown_thread is not None
    svc.stop()                                         # stopping again: no second interrupt
    assert svc.interrupts == 1
    a.close()
    b.close()


def test_an_error_in_the_loop_is_handed_to_on_error_and_the_default_goes_on():
    def body(svc):
        if svc.runs < 3:
            raise RuntimeError("transient")
        svc.stop()
    svc = Recorder(body)
    svc.start()
    testing.wait_until(lambda: not svc.is_alive, 10, "the loop to end")
    assert svc.runs == 3                               # two errors did not end it

    class StopOnError(Recorder):
        def on_error(self):
            self.stop()

    def always(svc):
        raise RuntimeError("lasting")
    svc = StopOnError(always)
    svc.start()
    testing.wait_until(lambda: not svc.is_alive, 10, "the loop to end")
    assert svc.runs == 1 and svc.shutdown_thread is not None


def test_a_wakeup_ends_a_wait_early_and_one_given_before_the_wait_is_not_lost():
    svc = Recorder(lambda s: None)
    svc.wakeup()
    svc.wait_for_running(86_400_000)                   # returns at once: a wakeup is pending
    assert not svc.has_notified
    waited = threading.Event()
    t = threading.Thread(target=lambda: (svc.wait_for_running(86_400_000), waited.set()))
    t.start()
    svc.wakeup()
    t.join(10)
    assert waited.is_set()


def test_scheduled_tasks_run_when_due_then_every_period_and_a_failing_one_spares_the_others():
    now = ManualClock(1_000)                           # monotonic milliseconds here
    ran = []

    def failing():
        ran.append("fail")
        raise OSError("disk")
    svc = StoreScheduledService([("clean", 60_000, 10_000, lambda: ran.append("clean")),
                                 ("check", 1_000, 10_000, failing)], now=now)
    now.now += 1_000
    svc.run_once()
    assert ran == ["fail"]                             # only the disk check is due
    now.now += 59_000
    svc.run_once()
    assert ran == ["fail", "clean", "fail"]            # the failing check did not stop clean
    now.now += 9_999
    svc.wakeup()                                       # nothing due: run_once only waits
    svc.run_once()
    assert ran == ["fail", "clean", "fail"]
    now.now += 1
    svc.run_once()
    assert ran == ["fail", "clean", "fail", "clean", "fail"]


BATCH_POLICY = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"),
                                  reason="SCHED_BATCH is Linux's scheduling policy")
WORK_AHEAD = ("PopulateAheadService", "ReserveAheadService", "AllocateMappedFileService")


def _policies(names):
    """The scheduling policy of each running thread named in `names`, by name."""
    return {t.name: os.sched_getscheduler(t.native_id) for t in threading.enumerate()
            if t.name in names}


@BATCH_POLICY
def test_a_service_that_works_ahead_runs_as_batch_and_any_other_as_before():
    seen = {}

    def body(svc):
        seen[svc.name] = os.sched_getscheduler(0)
        svc.stop()
    ahead, other = Recorder(body), Recorder(body)
    ahead.name, ahead.works_ahead = "Ahead", True
    other.name = "Other"
    for svc in (ahead, other):
        svc.start()
        assert svc.join(), "the loop ended"
    assert seen == {"Ahead": os.SCHED_BATCH, "Other": os.SCHED_OTHER}


@BATCH_POLICY
def test_a_stores_threads_that_work_ahead_of_the_writer_never_preempt_it(tmp_path, backend):
    """Populating, reserving and making files ahead run as SCHED_BATCH; flushing, dispatch,
    scheduling and the statistics keep the policy the process has."""
    store = testing.open_store(tmp_path / "s", backend, testing.small_config())
    try:
        running = {t.name for t in threading.enumerate()}
        assert set(WORK_AHEAD) <= running
        policies = _policies(running)
        assert {n: p for n, p in policies.items() if n in WORK_AHEAD} == \
            dict.fromkeys(WORK_AHEAD, os.SCHED_BATCH)
        others = {n: p for n, p in policies.items() if n.endswith("Service")
                  and n not in WORK_AHEAD}
        assert "ReputMessageService" in others and "FlushRealTimeService" in others
        assert set(others.values()) == {os.sched_getscheduler(0)}
    finally:
        store.shutdown()
