# SPDX-License-Identifier: Apache-2.0
"""What a FlushConsumeQueueService round costs at 4 000 queues, the every-second round (not
thorough, flush_consume_queue_least_pages 2) with none, 40 or all of the queues written one
unit since the last: the queues written ("dirty queues", what the service does) against every
queue (what the service did before it tracked them: the peer, measured first in each group).
A queue with less than 2 pages unflushed is looked at, not synced, in both: the round is pure
bookkeeping, and nothing of it grows with the queues not written.

extra_info["ms_per_round"] is the median round; "vs_every_queue" is the every-queue round's
time over this one's."""
import statistics
import time

import pytest

from bench_put import _topics_that_fit
from rocketstore import testing
from rocketstore.workload import make_messages

QUEUES = 4000
ROUNDS = 5
_every = {}     # written -> the every-queue round's median, for extra_info["vs_every_queue"]


@pytest.mark.parametrize("written", [0, 40, QUEUES])
@pytest.mark.parametrize("flush", ["every queue", "dirty queues"])
def test_consume_queue_flush_round(benchmark, backend, store_factory, flush, written):
    topics = _topics_that_fit(QUEUES // 4, backend)
    msgs = make_messages(topics * 4, topics=topics, queues=4)
    extra = msgs[::max(1, len(msgs) // written)][:written] if written else []
    store = store_factory(backend, msgs, ROUNDS + 2, flush_interval_consume_queue=3_600_000,
                          flush_consume_queue_thorough_interval=3_600_000)
    for i in range(0, len(msgs), 1000):
        assert store.put_messages(msgs[i:i + 1000]).status.ok
    testing.wait_dispatched(store)
    service = store.flush_cq_service
    service.do_flush(1, force=True)             # every queue flushed: the rounds start clean
    least = store.config.flush_consume_queue_least_pages
    times = []
    puts = []

    def write():
        for i in range(0, len(extra), 1000):
            puts.append(store.put_messages(extra[i:i + 1000]))
        testing.wait_dispatched(store)

    if flush == "dirty queues":
        def run():
            t0 = time.perf_counter()
            service.do_flush(1)
            times.append(time.perf_counter() - t0)
    else:
        def run():
            # The round as it was: every queue, every time.
            t0 = time.perf_counter()
            for cq in store.all_consume_queues():
                cq.flush(least)
            times.append(time.perf_counter() - t0)
    benchmark.group = f"ConsumeQueue flush round, {len(msgs)} queues, {written} written"
    benchmark.name = flush
    benchmark.extra_info["queues"] = len(msgs)
    benchmark.extra_info["written"] = written
    benchmark.pedantic(run, setup=write, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    median = statistics.median(times)
    benchmark.extra_info["ms_per_round"] = round(median * 1e3, 3)
    if flush == "every queue":
        _every[written] = median
    elif written in _every:
        benchmark.extra_info["vs_every_queue"] = round(_every[written] / median, 1)
    # A thorough round flushes every queue to its end; every message is in its queue.
    service.do_flush(1, force=True)
    queues = store.all_consume_queues()
    assert [cq for cq in queues if cq.mfq.flushed_where != cq.mfq.get_max_offset()] == []
    assert all(r.status.ok for r in puts)
    assert sum(cq.max_offset_in_queue for cq in queues) == len(msgs) + written * (ROUNDS + 1)
