# SPDX-License-Identifier: Apache-2.0
"""Delayed delivery (services/schedule.py).

- burst: N messages with DELAY=1 put at one instant (outside the timed region), then the
  store's clock moves past their due time and one ScheduleMessageService run delivers them
  all (timed). The peer, timed in the same run, is put_messages of the same messages without
  DELAY into a fresh store: the ordinary put path the deliveries go through.
  extra_info["msgs_per_s"] for both. N is ROCKETSTORE_BENCH_SCHEDULE_N (default 1 000 000,
  the issue's figure; scale it down on a small machine and say so).
- lag: a producer puts DELAY=1 messages at a paced rate (ROCKETSTORE_BENCH_SCHEDULE_RATE,
  default 10 000 msgs/s) for ROCKETSTORE_BENCH_SCHEDULE_SECONDS (default 5) on the real
  clock, with the service's own timers delivering. The lag of each message is its delivered
  record's store time minus its due time (scheduled record's store time + 1 s), from the
  records themselves after the run; extra_info holds p50 / p99 / max in ms.

Every put is checked, every delivered message read back from its real queue, outside the
timed regions; stores are deleted at the end."""
import os
import statistics
import threading
import time


from rocketstore import MessageStore
from rocketstore import format as F
from rocketstore.workload import check_puts, check_read_back, make_messages, sized_config

N = int(os.environ.get("ROCKETSTORE_BENCH_SCHEDULE_N", "1000000"))
RATE = int(os.environ.get("ROCKETSTORE_BENCH_SCHEDULE_RATE", "10000"))
SECONDS = float(os.environ.get("ROCKETSTORE_BENCH_SCHEDULE_SECONDS", "5"))
BATCH = 1000
T0 = 1_800_000_000_000


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        return self.now


def delayed(msgs, level=1):
    for m in msgs:
        m.properties = {**m.properties, "DELAY": str(level)}
    return msgs


def open_store(root, backend, msgs, rounds, clock=None):
    store = MessageStore(root, sized_config(msgs, rounds, message_delay_level="1s 5s"),
                         clock=clock, kernels=backend)
    store.load()
    store.start()
    return store


def put_all(store, msgs):
    return [store.put_messages(msgs[i:i + BATCH]) for i in range(0, len(msgs), BATCH)]


def test_burst_delivery(benchmark, backend, tmp_path):
    msgs = delayed(make_messages(N, topics=1, queues=4))
    plain = make_messages(N, topics=1, queues=4)
    clock = Clock()
    store = open_store(tmp_path / "delay", backend, msgs, 3, clock)
    peer = open_store(tmp_path / "peer", backend, plain, 1)
    try:
        check_puts(put_all(store, msgs), N)
        store.catch_up()                       # dispatched: the run below only delivers
        svc = store.schedule_message_service
        times = {}

        def deliver():
            clock.now = T0 + 1000
            t0 = time.perf_counter()
            svc.deliver_due()
            times["deliver"] = time.perf_counter() - t0

        benchmark.group = "delayed delivery: burst"
        benchmark.extra_info["messages"] = N
        benchmark.pedantic(deliver, rounds=1, iterations=1)
        t0 = time.perf_counter()
        results = put_all(peer, plain)
        times["peer"] = time.perf_counter() - t0
        check_puts(results, N)
        assert store.delay_offsets.get_offset(1) == N
        assert store.get_max_offset_in_queue(F.SCHEDULE_TOPIC, 0) == N
        check_read_back(store, msgs)            # every message in its real queue, in order
        check_read_back(peer, plain)
        benchmark.extra_info["msgs_per_s"] = round(N / times["deliver"])
        benchmark.extra_info["peer_put_messages_msgs_per_s"] = round(N / times["peer"])
        benchmark.extra_info["ratio_to_peer"] = round(times["peer"] / times["deliver"], 3)
    finally:
        store.shutdown()
        peer.shutdown()


def _percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def test_delivery_lag(benchmark, backend, tmp_path):
    total = int(RATE * SECONDS)
    msgs = delayed(make_messages(total, topics=1, queues=4))
    store = open_store(tmp_path / "lag", backend, msgs, 3)
    per_tick = max(1, RATE // 100)          # a batch every 10 ms
    results = []
    produced = {}

    def produce():
        start = time.monotonic()
        for k, i in enumerate(range(0, total, per_tick)):
            wait = start + k * 0.01 - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            results.append(store.put_messages(msgs[i:i + per_tick]))
        produced["s"] = time.monotonic() - start

    def run():
        t = threading.Thread(target=produce)
        t.start()
        t.join()
        deadline = time.monotonic() + 60
        while store.delay_offsets.get_offset(1) < total and time.monotonic() < deadline:
            time.sleep(0.01)

    try:
        benchmark.group = "delayed delivery: lag"
        benchmark.extra_info["messages"] = total
        benchmark.extra_info["rate"] = RATE
        benchmark.pedantic(run, rounds=1, iterations=1)
        check_puts(results, total)
        check_read_back(store, msgs)
        # Due time of each message from its scheduled record; delivery time from its
        # delivered one (same key in both).
        due = {}
        lo, hi = 0, store.get_max_offset_in_queue(F.SCHEDULE_TOPIC, 0)
        while lo < hi:
            r = store.get_message("bench", F.SCHEDULE_TOPIC, 0, lo, 1024)
            for m in r.messages:
                due[m.keys] = m.store_timestamp + 1000
            lo = r.next_begin_offset
        lags = []
        for q in range(4):
            lo, hi = 0, store.get_max_offset_in_queue("BenchTopic0", q)
            while lo < hi:
                r = store.get_message("bench", "BenchTopic0", q, lo, 1024)
                lags += [m.store_timestamp - due[m.keys] for m in r.messages]
                lo = r.next_begin_offset
        assert len(lags) == total
        benchmark.extra_info["lag_p50_ms"] = statistics.median(lags)
        benchmark.extra_info["lag_p99_ms"] = _percentile(lags, 0.99)
        benchmark.extra_info["lag_max_ms"] = max(lags)
        benchmark.extra_info["put_rate_achieved"] = round(total / produced["s"])
    finally:
        store.shutdown()
