# SPDX-License-Identifier: Apache-2.0
"""An idle store's threads: ReputMessageService stops looking for records every millisecond
once nothing is written (IDLE_AFTER_MS), and the next put wakes it, whatever path wrote the
record; a SYNC_FLUSH store's group commit thread stops looking every 10 ms, and what needs it
wakes it (tests/test_ha.py: a slave's appends); ScheduleMessageService runs an empty level
about once a second, not every 100 ms (tests/test_schedule.py: still on time). Timeouts are
hang guards, never speed claims."""
import sys
import time

import pytest

from rocketstore import FlushDiskType, Message, testing
from rocketstore.consumer import PutWake
from rocketstore.message import PROPERTY_WAIT

GUARD = 60          # seconds for something that should take milliseconds
HOUR_MS = 3_600_000


def _open(tmp_path, backend, **config):
    return testing.open_store(tmp_path / "s", backend, testing.small_config(**config))


def _wait_idle(store):
    testing.wait_until(lambda: store.reput_service.idle, GUARD, "reput to become idle")


def _dispatched(store, end):
    """Whether reput alone (no read: every read catches up first) dispatched up to `end`."""
    return store.reput_service.reput_from_offset >= end


def _switches(tid):
    with open(f"/proc/self/task/{tid}/status") as fh:
        return sum(int(line.split()[1]) for line in fh if "ctxt_switches" in line)


def _switches_in_half_a_second(service, seconds=0.5):
    """The thread switches `service`'s thread made in half a second, or `seconds` (Linux)."""
    tid = service._thread.native_id
    before = _switches(tid)
    time.sleep(seconds)
    return _switches(tid) - before


def _assert_quiet(store, service, settled, what, at_most, seconds=0.5):
    """Once `settled()`, `service`'s thread makes at most `at_most` switches in `seconds`;
    `store` is shut down either way."""
    try:
        testing.wait_until(settled, GUARD, what)
        assert _switches_in_half_a_second(service, seconds) <= at_most
    finally:
        store.shutdown()


LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="counts the thread's switches in Linux's /proc/self/task")


@LINUX_ONLY
def test_an_idle_stores_reput_thread_sleeps_instead_of_polling_every_millisecond(tmp_path,
                                                                                  backend):
    store = _open(tmp_path, backend)
    try:
        assert store.put_message(Message("T", b"x")).ok
        _wait_idle(store)
        # Polling every millisecond made about 450 switches in half a second; idle, it
        # waits IDLE_WAIT_MS (a second) at a time.
        assert _switches_in_half_a_second(store.reput_service) <= 5
        # Puts wake it while it is idle, as while a consumer waits.
        assert isinstance(store.commitlog.wake_on_put, PutWake)
    finally:
        store.shutdown()
    assert store.commitlog.wake_on_put is None      # shutdown's, never an idle reput's


@pytest.mark.parametrize("how", ["put_message", "put_messages", "put_batch"])
def test_a_put_after_an_idle_spell_wakes_reput_and_is_dispatched_without_a_read(
        tmp_path, backend, how):
    """Reput's idle wait made an hour long: only the put's own wake-up can get its record
    dispatched within the guard. Then the plain put hook is back, until idle again."""
    store = _open(tmp_path, backend)
    try:
        reput = store.reput_service
        plain = store._plain_put_wake
        reput.IDLE_WAIT_MS = HOUR_MS
        assert store.put_message(Message("T", b"first")).ok
        _wait_idle(store)
        if how == "put_message":
            r = store.put_message(Message("T", b"after the idle spell"))
        elif how == "put_messages":
            r = store.put_messages([Message("T", b"after"), Message("T", b"the idle spell")])
        else:
            r = store.put_batch("T", 0, [b"after", b"the idle spell"])
        assert r.ok
        end = store.commitlog.max_offset
        testing.wait_until(lambda: _dispatched(store, end), GUARD, "the put dispatched")
        testing.wait_until(lambda: store.commitlog.wake_on_put is plain or reput.idle, GUARD,
                           "the plain hook back")
        _wait_idle(store)
    finally:
        store.shutdown()


def test_reput_stays_awake_while_a_record_written_is_not_yet_readable(tmp_path, backend):
    """With write buffers a put's record is readable only after its commit, here at least
    half a second later (longer than IDLE_AFTER_MS), and the committer does not wake reput:
    woken by the put before the commit, reput must not go idle with the record written but
    not dispatched, or it would sleep through the commit (its idle wait made an hour)."""
    store = _open(tmp_path, backend, mapped_file_size_commit_log=1 << 20,
                  transient_store_pool_enable=True, transient_store_pool_size=2,
                  commit_interval_commit_log=500, commit_commit_log_thorough_interval=500)
    try:
        reput = store.reput_service
        reput.IDLE_WAIT_MS = HOUR_MS
        assert store.put_message(Message("T", b"first")).ok
        _wait_idle(store)
        r = store.put_message(Message("T", b"buffered"))
        assert r.ok
        end = r.commit_log_offset + r.wrote_bytes
        testing.wait_until(lambda: _dispatched(store, end), GUARD,
                           "the buffered put dispatched after its commit")
    finally:
        store.shutdown()


# ---- the SYNC_FLUSH group commit's thread --------------------------------------------------
def _open_sync(tmp_path, backend):
    return _open(tmp_path, backend, flush_disk_type=FlushDiskType.SYNC_FLUSH)


def _quiet(flusher):
    return flusher._poll_ms() == flusher.IDLE_WAIT_MS


@LINUX_ONLY
def test_an_idle_sync_flush_stores_group_commit_thread_sleeps_instead_of_polling(tmp_path,
                                                                                 backend):
    store = _open_sync(tmp_path, backend)
    flusher = store.flush_service
    assert store.put_message(Message("T", b"x")).ok
    # Looking every 10 ms made about 50 switches in half a second.
    _assert_quiet(store, flusher, lambda: _quiet(flusher), "the group commit to go quiet", 5)


def test_a_put_that_does_not_wait_is_synced_after_an_idle_spell(tmp_path, backend):
    """WAIT=false: the put returns before its sync, and wakes the group commit's thread,
    which syncs it at once, not at its next look (made an hour away)."""
    store = _open_sync(tmp_path, backend)
    try:
        flusher = store.flush_service
        flusher.IDLE_WAIT_MS = HOUR_MS
        assert store.put_message(Message("T", b"x")).ok
        testing.wait_until(lambda: _quiet(flusher), GUARD, "the group commit to go quiet")
        r = store.put_message(Message("T", b"no wait", properties={PROPERTY_WAIT: "false"}))
        assert r.ok
        end = r.commit_log_offset + r.wrote_bytes
        testing.wait_until(lambda: store.commitlog.mfq.flushed_where >= end, GUARD,
                           "the put synced")
    finally:
        store.shutdown()


# ---- ScheduleMessageService -----------------------------------------------------------------
@LINUX_ONLY
def test_an_idle_stores_schedule_service_runs_its_empty_levels_about_once_a_second(tmp_path,
                                                                                  backend):
    store = _open(tmp_path, backend)
    svc = store.schedule_message_service
    # Its first runs come 1 s after start (FIRST_DELAY_TIME_MS); then every level is empty,
    # and each waits a second (its delay, at most IDLE_WAIT_MS) instead of 100 ms. Every
    # 100 ms made 18-30 switches in two seconds.
    first = min(svc._next_run.values())
    _assert_quiet(store, svc, lambda: min(svc._next_run.values()) >= first + 1000,
                  "the first runs", 8, seconds=2.0)
