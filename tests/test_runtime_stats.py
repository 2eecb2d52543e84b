# SPDX-License-Identifier: Apache-2.0
"""Runtime statistics (StoreStatsService), the put lock's begin time and OS_PAGECACHE_BUSY,
the runtime file a live store publishes and `rocketstore stat` reading it."""
import concurrent.futures
import json
import os
import sys
import threading

import pytest

from rocketstore import Message, PutMessageStatus, testing
from rocketstore.clock import ManualClock, ReplayClock
from rocketstore.stats import (PUT_LATENCY_BUCKETS, RUNTIME_FILE, StoreStatsService,
                               get_totals, latency_bucket, prometheus_collector,
                               read_runtime_file)

T0 = 1_700_000_000_000


class CountingClock(ManualClock):
    """A ManualClock that counts its readers' calls."""
    calls = 0

    def __call__(self):
        self.calls += 1
        return self.now


def _hist(info):
    return {name: int(count) for name, count in
            (part.rsplit(":", 1) for part in info["putMessageDistributeTime"].split())}


def test_puts_and_gets_are_counted_once_per_message_and_once_per_call(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        singles = [store.put_message(Message("T", b"m%d" % i, queue_id=0)) for i in range(10)]
        listed = store.put_messages([Message("T", b"l", queue_id=1) for _ in range(5)])
        batch = store.put_batch("T", 2, [b"b1", b"b2", b"b3"])
        found = store.get_message("g", "T", 0, 0, 4)
        missed = store.get_message("g", "T", 0, 10)
        info = store.get_runtime_info()
    finally:
        store.shutdown()
    assert found.status.name == "FOUND" and missed.status.name != "FOUND"
    assert info["putMessageTimesTotal"] == "18"
    assert int(info["putMessageSizeTotal"]) == \
        sum(r.wrote_bytes for r in singles) + listed.wrote_bytes + batch.wrote_bytes
    assert float(info["putMessageAverageSize"]) == int(info["putMessageSizeTotal"]) / 18
    assert info["putMessageFailedTimes"] == "0"
    hist = _hist(info)
    assert list(hist) == list(PUT_LATENCY_BUCKETS)
    assert sum(hist.values()) == 12         # 10 single puts, one list, one batch
    assert get_totals(store.get_counters, store.read_path)[:3] == (1, 1, 4)
    for key in ("bootTimestamp", "runtime", "putTps", "getFoundTps", "getMissTps",
                "getTotalTps", "getTransferedTps", "dispatchBehindBytes",
                "pageCacheLockTimeMills", "commitLogMinOffset", "commitLogMaxOffset",
                "commitLogDiskRatio", "consumeQueueDiskRatio", "earliestMessageTimeStamp"):
        assert isinstance(info[key], str), key
    assert info["pageCacheLockTimeMills"] == "0"
    assert info["earliestMessageTimeStamp"] == str(singles[0].store_timestamp)
    assert info["commitLogMaxOffset"] == str(int(batch.commit_log_offsets[-1] + batch.sizes[-1]))


def test_runtime_info_reports_each_delay_levels_delivered_and_max_offsets(tmp_path, backend):
    clock = ManualClock(T0)
    store = testing.open_store(tmp_path / "s", backend, clock=clock)
    try:
        for i in range(3):
            store.put_message(Message("T", b"d%d" % i, queue_id=0, properties={"DELAY": "2"}))
        clock.now += 10_000                              # level 2 is 5 s: all three are due
        assert store.schedule_message_service.deliver_due() == 3
        # Two more, not due: delivered 3 of 5 (the levels the service has an offset for).
        for i in range(2):
            store.put_message(Message("T", b"e%d" % i, queue_id=0, properties={"DELAY": "2"}))
        testing.wait_dispatched(store)
        info = store.get_runtime_info()
    finally:
        store.shutdown()
    assert info["scheduleMessageOffset_2"] == "3,5"
    assert not any(k.startswith("scheduleMessageOffset_") and k != "scheduleMessageOffset_2"
                   for k in info)


def test_tps_is_the_difference_of_two_samples_over_each_window(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        # A service of the test's own, sampled at the times it names (the store's own
        # samples once a second, at times of its own).
        stats = StoreStatsService(
            store.root, store.commitlog.put_cells,
            lambda: get_totals(store.get_counters, store.read_path), store.runtime_info)
        for second in range(61):
            store.put_messages([Message("T", b"x", queue_id=0) for _ in range(5)])
            store.get_message("g", "T", 0, 5 * second, 2)          # found, 2 messages
            store.get_message("g", "T", 0, 10 ** 6)                # a miss
            stats.sample(now_ms=second * 1000)
        info = stats.runtime_info()
    finally:
        store.shutdown()
    assert info["putTps"] == "5.0 5.0 "             # 600 s not sampled yet: empty, as Java
    assert info["getFoundTps"] == "1.0 1.0 "
    assert info["getMissTps"] == "1.0 1.0 "
    assert info["getTotalTps"] == "2.0 2.0 "
    assert info["getTransferedTps"] == "2.0 2.0 "


def test_latency_buckets_are_the_brokers():
    assert [latency_bucket(ms) for ms in
            (0, 1, 9, 10, 49, 50, 99, 100, 199, 200, 499, 500, 999, 1000, 1999, 2000, 2999,
             3000, 3999, 4000, 4999, 5000, 9999, 10000, 10 ** 9)] == \
        [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12]


def test_a_put_that_stalls_lands_in_its_latency_bucket(tmp_path, backend):
    """The compiled path keeps its own histogram cells: a put held 30 ms under the lock (its
    store clock stalls) counts in a bucket of 10 ms or more, on every backend (measured on a
    coarse clock that ticks every few ms, hence the margin)."""
    stall = threading.Event()

    def clock():
        if stall.is_set():
            stall.clear()
            threading.Event().wait(0.03)
        return T0

    store = testing.open_store(tmp_path / "s", backend, clock=clock)
    try:
        store.put_message(Message("T", b"warm", queue_id=0))
        stall.set()
        assert store.put_message(Message("T", b"slow", queue_id=0)).status is \
            PutMessageStatus.PUT_OK
        info = store.get_runtime_info()
    finally:
        store.shutdown()
    hist = _hist(info)
    assert sum(hist.values()) == 2
    assert sum(list(hist.values())[2:]) == 1        # [10~50ms] or later
    assert int(info["putMessageEntireTimeMax"]) >= 20


def test_a_put_answers_os_pagecache_busy_while_another_holds_the_lock_too_long(tmp_path,
                                                                               backend):
    """isOSPageCacheBusy with an injected clock: a put stalls under the put lock (its file
    is slow to come); while the store clock says it has held the lock over
    os_page_cache_busy_time_out_mills, every put answers OS_PAGECACHE_BUSY at once."""
    clock = CountingClock(T0)
    store = testing.open_store(tmp_path / "s", backend, clock=clock,
                               config=testing.small_config(
                                   os_page_cache_busy_time_out_mills=1000))
    cl = store.commitlog
    entered, release = threading.Event(), threading.Event()
    batch_file = cl._batch_file

    def stalling_batch_file(remaining):
        if not entered.is_set():
            entered.set()
            release.wait(60)
        return batch_file(remaining)

    cl._batch_file = stalling_batch_file
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        assert store.lock_time_mills() == 0 and not store.is_os_page_cache_busy()
        stalled = pool.submit(store.put_messages, [Message("T", b"a", queue_id=0)])
        assert entered.wait(60)
        clock.now = T0 + 500
        assert store.lock_time_mills() == 500 and not store.is_os_page_cache_busy()
        clock.now = T0 + 1001
        assert store.lock_time_mills() == 1001 and store.is_os_page_cache_busy()
        busy = [pool.submit(store.put_message, Message("T", b"b", queue_id=0)),
                pool.submit(store.put_messages, [Message("T", b"c", queue_id=0)])]
        results = [f.result(60) for f in busy]
        results.append(store.put_batch("T", 0, [b"d"]))
        for r in results:
            assert r.status is PutMessageStatus.OS_PAGECACHE_BUSY
            assert "os_page_cache_busy_time_out_mills" in r.reason
        assert store.get_runtime_info()["pageCacheLockTimeMills"] == "1001"
        # The publishing thread never reads an injected clock, lock held or not.
        calls = clock.calls
        store.stats_service.publish()
        assert clock.calls == calls
        assert "pageCacheLockTimeMills" not in read_runtime_file(store.root)["runtimeInfo"]
        clock.now = T0 + 10_000_000          # isOSPageCacheBusy's guard: a bogus begin time
        assert not store.is_os_page_cache_busy()
        release.set()
        assert stalled.result(60).status is PutMessageStatus.PUT_OK
        assert store.lock_time_mills() == 0 and not store.is_os_page_cache_busy()
        assert store.put_message(Message("T", b"e", queue_id=0)).status is \
            PutMessageStatus.PUT_OK
        testing.wait_dispatched(store)
        assert store.get_max_offset_in_queue("T", 0) == 2     # the refused wrote nothing
        assert store.get_runtime_info()["putMessageTimesTotal"] == "2"
    finally:
        release.set()
        pool.shutdown()
        store.shutdown()


def test_the_store_clock_is_read_for_the_busy_check_only_while_a_put_holds_the_lock(
        tmp_path, backend):
    """Puts from one thread never find the lock held, so they call the store clock once
    each, as before: a replay clock's timestamps land on the records unchanged."""
    stamps = [T0 + 7 * i for i in range(20)]
    store = testing.open_store(tmp_path / "s", backend, clock=ReplayClock(stamps))
    try:
        got = [store.put_message(Message("T", b"x", queue_id=0)).store_timestamp
               for _ in range(10)]
        got.append(int(store.put_messages([Message("T", b"y", queue_id=0)]).store_timestamp))
    finally:
        store.shutdown()
    assert got == stamps[:11]


def test_a_live_store_publishes_its_runtime_info_for_stat_in_another_process(tmp_path,
                                                                              backend):
    root = tmp_path / "s"
    store = testing.open_store(root, backend)
    try:
        for i in range(7):
            store.put_message(Message("T", b"m%d" % i, queue_id=0))
        testing.wait_until(
            lambda: (read_runtime_file(root) or {}).get("runtimeInfo", {}).get(
                "putMessageTimesTotal") == "7", what="the runtime file to count 7 puts")
        st = json.loads(testing.run_cli("stat", str(root), "--json", check=True).stdout)
        text = testing.run_cli("stat", str(root), check=True).stdout
        max_offset = store.get_max_phy_offset()
    finally:
        store.shutdown()
    rt = st["runtime"]
    assert rt["live"] is True and rt["pid"] == os.getpid()
    assert rt["runtimeInfo"]["putMessageTimesTotal"] == "7"
    assert rt["runtimeInfo"]["commitLogMaxOffset"] == str(max_offset)
    assert f"pid {os.getpid()}, live" in text and "putMessageTimesTotal" in text
    assert "[<=0ms]:" in text
    # Shut down: the file is gone, and stat says the store is not running.
    assert not os.path.exists(root / RUNTIME_FILE)
    st = json.loads(testing.run_cli("stat", str(root), "--json", check=True).stdout)
    assert st["runtime"] is None
    assert "runtime    none" in testing.run_cli("stat", str(root), check=True).stdout


def test_a_runtime_file_left_by_a_dead_store_is_reported_stale(tmp_path, backend):
    root = tmp_path / "s"
    store = testing.open_store(root, backend)
    store.put_message(Message("T", b"m", queue_id=0))
    store.shutdown()
    # What a killed store leaves: its last runtime file, and no one holding the lock.
    (root / RUNTIME_FILE).write_text(json.dumps({"pid": 1, "writtenAt": T0,
                                                 "runtimeInfo": {"putTps": "1.0  "}}))
    st = json.loads(testing.run_cli("stat", str(root), "--json", check=True).stdout)
    assert st["runtime"]["live"] is False
    assert "stale" in testing.run_cli("stat", str(root), check=True).stdout


def test_the_runtime_file_is_no_part_of_the_stores_bytes(tmp_path, backend):
    root = tmp_path / "s"
    store = testing.open_store(root, backend)
    try:
        store.put_message(Message("T", b"m", queue_id=0))
        testing.wait_until(lambda: os.path.exists(root / RUNTIME_FILE),
                           what="the runtime file")
        assert RUNTIME_FILE not in testing.tree_digest(root)
        assert RUNTIME_FILE not in store.stray_files()
    finally:
        store.shutdown()
    store = testing.open_store(root, backend)        # a clean open, nothing to recover
    try:
        assert store.recovery_report.normal
    finally:
        store.shutdown()


def test_prometheus_export_reports_the_counters(tmp_path, backend):
    prometheus_client = pytest.importorskip("prometheus_client")
    store = testing.open_store(tmp_path / "s", backend)
    try:
        for i in range(3):
            store.put_message(Message("T", b"m", queue_id=0))
        store.get_message("g", "T", 0, 0)
        registry = prometheus_client.CollectorRegistry()
        registry.register(prometheus_collector(store))
        assert registry.get_sample_value("rocketstore_put_messages_total") == 3
        assert registry.get_sample_value("rocketstore_get_calls_total",
                                         {"outcome": "found"}) == 1
        assert registry.get_sample_value("rocketstore_put_latency_total",
                                         {"bucket": "[<=0ms]"}) + sum(
            registry.get_sample_value("rocketstore_put_latency_total", {"bucket": b})
            for b in PUT_LATENCY_BUCKETS[1:]) == 3
    finally:
        store.shutdown()


def test_metrics_are_the_counters_as_numbers_and_never_call_an_injected_clock(tmp_path,
                                                                               backend):
    from rocketstore.clock import system_clock
    clock = CountingClock(T0)
    store = testing.open_store(tmp_path / "s", backend, clock=clock)
    try:
        for i in range(3):
            store.put_message(Message("T", b"m%d" % i, queue_id=0))
        store.get_message("g", "T", 0, 0)
        store.get_message("g", "T", 0, 3)                   # nothing there yet: a miss
        calls = clock.calls
        m = store.metrics()
        assert clock.calls == calls
        assert (m["put_messages"], m["put_failed"], sum(m["put_latency"].values())) == (3, 0, 3)
        assert list(m["put_latency"]) == list(PUT_LATENCY_BUCKETS)
        assert m["put_bytes"] > 3 * 2
        assert (m["get_found"], m["get_miss"], m["get_transferred"]) == (1, 1, 3)
        assert m["lock_time_ms"] is None
        assert store.dispatch_failures() == (0, None)
    finally:
        store.shutdown()
    live = testing.open_store(tmp_path / "live", backend, clock=system_clock)
    try:
        assert live.metrics()["lock_time_ms"] == 0         # no put holds the lock
    finally:
        live.shutdown()


def test_prometheus_export_without_the_library_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.setitem(sys.modules, "prometheus_client.core", None)
    store = testing.open_store(tmp_path / "s", "pure")
    try:
        with pytest.raises(ImportError, match=r"rocketstore\[prometheus\]"):
            prometheus_collector(store)
    finally:
        store.shutdown()
