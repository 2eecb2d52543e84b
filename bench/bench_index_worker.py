# SPDX-License-Identifier: Apache-2.0
"""put_messages of 1 000 with the index worker and without it, rounds alternated on one store.

The cext backend hands a batch put's index keys to a thread of its own (kernels' IndexWorker,
csrc/rs_index_worker.h). Whether that pays is a question about the putting thread, and this
machine's speed moves up to 2x between runs: so the two sides run in turn on the same store,
a round of each, within the same second. The rounds with the worker are the benchmark's; the
round without it runs in pedantic's untimed setup before each (the store's worker set aside,
its job settled), timed by itself. extra_info has each side's median round, by wall time and
by the putting thread's CPU time, per message.

Unlike alternating the store with `f.write` (doc/performance.md, "Back to back or
alternated"), both sides here are the same store with the same helper threads, so neither
side's helpers work in the other's rounds more than its own."""
import os
import statistics
import time

from rocketstore import testing
from rocketstore.workload import check_puts, check_read_back, make_messages

N = 20_000
BATCH = 1000
PAIRS = int(os.environ.get("ROCKETSTORE_WORKER_PAIRS", "8"))


def test_put_messages_with_and_without_the_index_worker(benchmark, store_factory):
    msgs = make_messages(N)
    store = store_factory(testing.load_backend("cext"), msgs, 2 * PAIRS + 2)
    idx = store.index_service
    worker = idx.worker
    assert worker is not None
    batches = [msgs[i:i + BATCH] for i in range(0, N, BATCH)]
    results = []
    keep = results.append
    wall = time.perf_counter_ns
    cpu = time.thread_time_ns
    rounds = {"with": [], "without": []}

    def put_round(side):
        c0, w0 = cpu(), wall()
        for b in batches:
            keep(store.put_messages(b))
        rounds[side].append((wall() - w0, cpu() - c0))

    def without():
        idx.settle()
        idx.worker = None
        try:
            put_round("without")
        finally:
            idx.worker = worker

    benchmark.group = "put_messages (batches of 1000): the index worker, alternated"
    benchmark.extra_info["messages"] = N
    benchmark.pedantic(put_round, args=("with",), setup=without, rounds=PAIRS, iterations=1,
                       warmup_rounds=1)
    check_puts(results, len(results) // len(batches) * N)
    check_read_back(store, msgs, len(results) // len(batches))
    used = 0
    for side, got in rounds.items():
        got = got[1:] if len(got) > 1 else got          # the warm-up pair
        used = len(got)
        benchmark.extra_info[f"{side}_wall_ns_per_msg"] = round(
            statistics.median(w for w, _ in got) / N, 1)
        benchmark.extra_info[f"{side}_cpu_ns_per_msg"] = round(
            statistics.median(c for _, c in got) / N, 1)
    benchmark.extra_info["jobs"] = worker.jobs
    benchmark.extra_info["jobs_waited_for"] = worker.waited
    benchmark.extra_info["jobs_taken_back"] = worker.reclaimed
    info = benchmark.extra_info
    print(f"\nput_messages of {BATCH}, {used} rounds each side: with the "
          f"index worker {info['with_wall_ns_per_msg']} ns/msg wall, "
          f"{info['with_cpu_ns_per_msg']} CPU; without {info['without_wall_ns_per_msg']} "
          f"wall, {info['without_cpu_ns_per_msg']} CPU; jobs {info['jobs']}, waited for "
          f"{info['jobs_waited_for']}, taken back {info['jobs_taken_back']}")
