# SPDX-License-Identifier: Apache-2.0
"""Reput's dispatch of put messages to their ConsumeQueues and the index, per row, at 1, 400 and
40 000 queues: the cost per row should not grow with the number of queues a batch touches.

Each round puts N messages over the queues with the reput service standing still (outside the
timed region), then times one ReputMessageService.do_reput() over them. extra_info["ns_per_row"]
is the dispatching thread's CPU time per row (the median round)."""
import statistics
import time

import pytest

from bench_put import _topics_that_fit
from rocketstore.workload import check_puts, check_read_back, make_messages

N = 80_000
BATCH = 1000
ROUNDS = 3
RUNS = ROUNDS + 1          # with the warmup round, which creates every queue's first file


@pytest.mark.parametrize("topics,queues", [(1, 1), (100, 4), (10_000, 4)],
                         ids=["1-queue", "400-queues", "40000-queues"])
def test_reput_dispatch(benchmark, backend, store_factory, topics, queues):
    topics = _topics_that_fit(topics, backend, queues)
    msgs = make_messages(N, topics=topics, queues=queues)
    store = store_factory(backend, msgs, RUNS)
    reput = store.reput_service
    reput.shutdown()            # the puts below wait for the timed do_reput()
    batches = [msgs[i:i + BATCH] for i in range(0, N, BATCH)]
    results = []
    cpu = []

    def put_round():
        for b in batches:
            results.append(store.put_messages(b))

    def run():
        t0 = time.thread_time_ns()
        reput.do_reput()
        cpu.append(time.thread_time_ns() - t0)
    try:
        benchmark.group = "reput dispatch (ConsumeQueue + index)"
        benchmark.extra_info["messages"] = N
        benchmark.extra_info["queues"] = topics * queues
        benchmark.pedantic(run, setup=put_round, rounds=ROUNDS, iterations=1, warmup_rounds=1)
        benchmark.extra_info["ns_per_row"] = round(statistics.median(cpu[1:]) / N)
        assert store.dispatch_behind_bytes() == 0
        check_puts(results, len(results) // len(batches) * N)
        check_read_back(store, msgs, len(results) // len(batches))
    finally:
        reput.start()
