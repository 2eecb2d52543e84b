# SPDX-License-Identifier: Apache-2.0
"""Put→wake latency of a waiting consumer, in-process (consumer.py).

    python -m pytest bench/bench_wait.py --benchmark-only -q --benchmark-columns=mean,rounds

A producer thread puts one message, a consumer receives it, N times in ping-pong: the producer
puts message i only once the consumer waits for it (its wait is registered), so every
latency is a wake-up, never a message that was already there. Latency = the consumer's clock
when the message is in its hands minus the producer's just before put_message. extra_info
holds p50_us / p99_us / max_us per variant:

- thread-wait: get_message(wait_ms=...) in a thread;
- thread-consumer: the Consumer iterator (store.consume, batch_size 1, committing);
- asyncio-wait: aget_message(wait_ms=...) on an event loop;
- asyncio-consumer: store.aconsume (batch_size 1, committing);
- poll-1ms (the peer): what a consumer without a wake-up does, get_message then
  time.sleep(0.001) until the message is there;
- event-floor (the floor): the same ping-pong through a bare threading.Event, no store.

The reput service dispatches on a 1 ms cycle (the broker's ReputMessageService); while a
consumer waits, each put also wakes it (consumer.PutWake), so the store's variants are not
bound by that cycle, and the poll peer is. N is
ROCKETSTORE_BENCH_WAIT_N (default 2000). Every put is checked and every message read back
outside the timed region; stores are deleted at the end (bench/conftest.py)."""
import asyncio
import os
import statistics
import threading
import time

import pytest

from rocketstore import Message
from rocketstore.workload import check_puts, check_read_back

N = int(os.environ.get("ROCKETSTORE_BENCH_WAIT_N", "2000"))
TOPIC = "WaitTopic"
LONG_MS = 60_000
VARIANTS = ("thread-wait", "thread-consumer", "asyncio-wait", "asyncio-consumer", "poll-1ms")


def _messages():
    return [Message(TOPIC, b"%08d" % i, queue_id=0) for i in range(N)]


def _record(benchmark, latencies):
    lat = sorted(latencies)
    q = statistics.quantiles(lat, n=100)
    benchmark.extra_info.update(n=len(lat), p50_us=round(q[49] * 1e6, 1),
                                p99_us=round(q[98] * 1e6, 1), max_us=round(lat[-1] * 1e6, 1))


def _producer(store, msgs, sent, received, results, waiting):
    """Put message i once the consumer waits for it; `sent[i]` is the time before the put."""
    for i, m in enumerate(msgs):
        while not waiting() or received[0] < i:
            time.sleep(0.0001)
        sent[i] = time.perf_counter()
        results.append(store.put_message(m))


def _consume_threads(store, variant, n, got):
    if variant == "thread-wait":
        for i in range(n):
            r = store.get_message("g", TOPIC, 0, i, 1, wait_ms=LONG_MS)
            yield r.messages
    elif variant == "thread-consumer":
        with store.consume("g", TOPIC, 0, batch_size=1) as c:
            for _ in range(n):
                yield next(c)
    elif variant == "poll-1ms":
        for i in range(n):
            while True:
                r = store.get_message("g", TOPIC, 0, i, 1)
                if r.messages:
                    break
                time.sleep(0.001)
            yield r.messages


async def _consume_async(store, variant, n, on_batch):
    if variant == "asyncio-wait":
        for i in range(n):
            r = await store.aget_message("g", TOPIC, 0, i, 1, wait_ms=LONG_MS)
            on_batch(r.messages)
    else:
        async with store.aconsume("g", TOPIC, 0, batch_size=1) as c:
            for _ in range(n):
                on_batch(await c.__anext__())


def _run(store, variant, msgs):
    n = len(msgs)
    sent = [0.0] * n
    lat = []
    bodies = []
    received = [0]
    results = []
    polling = variant == "poll-1ms"
    # The poll peer has no registration to wait for: the producer only keeps ping-pong.
    waiting = (lambda: True) if polling else (lambda: store.arrivals.waiting)

    def on_batch(messages):
        now = time.perf_counter()
        for m in messages:
            i = m.queue_offset
            lat.append(now - sent[i])
            bodies.append(m.body)
        received[0] += len(messages)

    prod = threading.Thread(target=_producer,
                            args=(store, msgs, sent, received, results, waiting))
    prod.start()
    if variant.startswith("asyncio"):
        asyncio.run(_consume_async(store, variant, n, on_batch))
    else:
        for messages in _consume_threads(store, variant, n, bodies):
            on_batch(messages)
    prod.join()
    return lat, bodies, results


@pytest.mark.parametrize("variant", VARIANTS)
def test_put_to_wake_latency(benchmark, store_factory, backend, variant):
    benchmark.group = "put->wake latency"
    msgs = _messages()
    store = store_factory(backend, msgs, 1, ha_listen_port=0)
    out = {}

    def run():
        out["r"] = _run(store, variant, msgs)
    benchmark.pedantic(run, rounds=1, iterations=1)
    lat, bodies, results = out["r"]
    check_puts(results, len(msgs))
    assert bodies == [m.body for m in msgs], "the consumer did not get every message in order"
    check_read_back(store, msgs)
    _record(benchmark, lat)


def test_event_floor(benchmark):
    """The same ping-pong through a threading.Event: the wake-up cost with no store at all."""
    benchmark.group = "put->wake latency"
    n = N
    sent = [0.0] * n
    lat = []
    go = [threading.Event() for _ in range(n)]
    armed = threading.Event()

    def producer():
        for i in range(n):
            armed.wait()
            armed.clear()
            sent[i] = time.perf_counter()
            go[i].set()

    def run():
        t = threading.Thread(target=producer)
        t.start()
        for i in range(n):
            armed.set()
            go[i].wait()
            lat.append(time.perf_counter() - sent[i])
        t.join()
    benchmark.pedantic(run, rounds=1, iterations=1)
    assert len(lat) == n
    _record(benchmark, lat)
