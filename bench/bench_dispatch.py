# SPDX-License-Identifier: Apache-2.0
"""Reput's dispatch of put messages to their ConsumeQueues and the index, per row, at 1, 400 and
40 000 queues: the cost per row should not grow with the number of queues a batch touches.

Each round puts N messages (one key each) over the queues with the reput service standing
still (outside the timed region), then times one ReputMessageService.do_reput() over them with
only some dispatchers in place: none ("scan", the floor: the CommitLog scan every dispatch
pays), the ConsumeQueue dispatcher, the index dispatcher, or both (what a store runs).
"index-numpy" is the index dispatcher without the backend's compiled index_dispatch (the
index_keys + index_put_batch path the cffi and pure backends take), as the ceiling the
compiled loop is compared with.
extra_info["ns_per_row"] is the dispatching thread's CPU time per row (the median round);
the dispatchers' own cost is that minus the scan's."""
import statistics
import time

import pytest

from bench_put import _topics_that_fit
from rocketstore.dispatch import ConsumeQueueDispatcher
from rocketstore.index_service import IndexService
from rocketstore.workload import check_puts, check_read_back, make_messages

N = 80_000
BATCH = 1000
# Nine timed rounds, not three: at 400 queues each queue fills its first 16 KiB window in
# four rounds, and only the rounds after show whether the next windows were populated ahead
# of the dispatch (doc/performance.md, "The populating thread starved of the GIL").
ROUNDS = 9
RUNS = ROUNDS + 1          # with the warmup round, which creates every queue's first file
PARTS = {"scan": (), "cq": (ConsumeQueueDispatcher,), "index": (IndexService,),
         "index-numpy": (IndexService,), "cq+index": (ConsumeQueueDispatcher, IndexService)}


@pytest.mark.parametrize("part", list(PARTS))
@pytest.mark.parametrize("topics,queues", [(1, 1), (100, 4), (10_000, 4)],
                         ids=["1-queue", "400-queues", "40000-queues"])
def test_reput_dispatch(benchmark, backend, store_factory, topics, queues, part):
    topics = _topics_that_fit(topics, backend, queues)
    msgs = make_messages(N, topics=topics, queues=queues)
    store = store_factory(backend, msgs, RUNS)
    reput = store.reput_service
    reput.shutdown()            # the puts below wait for the timed do_reput()
    # Edited in place: the reput service holds this list (assigning a new one to the store
    # would leave reput dispatching with every dispatcher, whatever the part).
    every = list(store.dispatchers)
    store.dispatchers[:] = [d for d in every if isinstance(d, PARTS[part])]
    if part == "index-numpy":
        store.index_service._k_dispatch = None
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
        benchmark.group = f"reput dispatch per row: {part}"
        benchmark.extra_info["messages"] = N
        benchmark.extra_info["queues"] = topics * queues
        benchmark.extra_info["dispatchers"] = part
        benchmark.pedantic(run, setup=put_round, rounds=ROUNDS, iterations=1, warmup_rounds=1)
        benchmark.extra_info["ns_per_row"] = round(statistics.median(cpu[1:]) / N)
        assert store.dispatch_behind_bytes() == 0
        # What the timed passes left out is dispatched now, so every message reads back
        # through its ConsumeQueue and its key (a re-dispatch skips what is there).
        store.dispatchers[:] = every
        reput.reput_from_offset = store.commitlog.min_offset
        reput.do_reput()
        check_puts(results, len(results) // len(batches) * N)
        rounds = len(results) // len(batches)
        check_read_back(store, msgs, rounds)
        for m in (msgs[0], msgs[-1]):
            found = store.query_message(m.topic, m.keys).messages
            assert len(found) == rounds, f"key {m.keys}: {len(found)} of {rounds} found"
    finally:
        store.dispatchers[:] = every
        reput.start()
