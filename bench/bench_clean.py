# SPDX-License-Identifier: Apache-2.0
"""A cleaning round over 1000 expired CommitLog files while a producer thread keeps putting.

The timed operation is one round (clean_files_periodically: CommitLog, then ConsumeQueues);
extra_info holds the producer's put latencies during the round, the mean time per file
deletion, and max put latency / mean deletion time: issue 5 asks that a put never waits
for more than one file deletion, and that the round fits its 10 s interval. The baseline_*
figures are the same producer for 0.1 s with no round running: the gap between the
two is what cleaning costs a put (GIL hand-offs between threads dominate both maxima).
Files are 4 KiB so the setup is quick."""
import contextlib
import shutil
import statistics
import threading
import time

from rocketstore import Message, MessageStore, testing
from rocketstore.workload import check_puts, check_read_back

FILES = 1000
FILE_SIZE = 4096
BODY = b"b" * 200
HOUR = 3_600_000
PRODUCED = Message("Bench", BODY, queue_id=0)      # what the producer thread puts


class Clock:
    def __init__(self):
        self.now = 1_700_000_000_000

    def __call__(self):
        return self.now


@contextlib.contextmanager
def producing(store, results):
    """A producer thread putting one message after another into `results`; yields its latency
    list."""
    stop = threading.Event()
    lat = []
    msg = PRODUCED

    def produce():
        put = store.put_message
        keep = results.append
        clock = time.perf_counter
        while not stop.is_set():
            t0 = clock()
            keep(put(msg))
            lat.append(clock() - t0)
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        yield lat
    finally:
        stop.set()
        producer.join()


def test_clean_round_over_1000_expired_files_while_putting(benchmark, backend, tmp_path):
    config = testing.small_config(
        mapped_file_size_commit_log=FILE_SIZE, mapped_file_size_consume_queue=1000 * 20,
        file_reserved_time=1, delete_file_batch_max=FILES, delete_commit_log_files_interval=0,
        delete_consume_queue_files_interval=0,
        # The flusher moves one file per round: at the default 500 ms, 1000 files take 500 s.
        flush_interval_commit_log=1)
    stores = []
    stats = {"lat": [], "base": [], "round": [], "deleted": []}
    last = {}                           # the round's store, its messages and put results

    def check_and_close():
        if last:
            produced = len(last["results"]) - last["batches"]
            check_puts(last["results"])
            # What cleaning left (the newest files) reads back as the tail of what was put.
            check_read_back(last["store"], last["msgs"] + [PRODUCED] * produced,
                            head_expired=True)
            last.clear()
        for s in stores:
            s.shutdown()
        stores.clear()
        for root in tmp_path.iterdir():        # rounds do not pile up on the disk
            shutil.rmtree(root)

    def setup():
        check_and_close()
        clock = Clock()
        store = MessageStore(tmp_path / f"s{len(stats['round'])}", config, clock=clock,
                             kernels=backend, disk_usage=lambda path: 0.80)
        store.load()
        store.start()
        stores.append(store)
        per_file = FILE_SIZE // 300
        msgs = [Message("Bench", BODY, queue_id=i % 4) for i in range(per_file * (FILES + 1))]
        results = [store.put_messages(msgs[i:i + 1000]) for i in range(0, len(msgs), 1000)]
        last.update(store=store, msgs=msgs, batches=len(results), results=results)
        testing.wait_dispatched(store, timeout=60)
        # Baseline: the same producer for 0.1 s with no cleaning round.
        with producing(store, results) as lat:
            time.sleep(0.1)
        stats["base"].extend(lat)
        testing.wait_dispatched(store, timeout=60)
        # Cleaning never deletes past the flushed offset: a round before the flusher caught up
        # would delete a few files, not 1000.
        testing.wait_flushed(store.commitlog, timeout=60)
        clock.now += 2 * HOUR            # everything written so far has expired
        return (store,), {}

    def run(store):
        with producing(store, last["results"]) as lat:
            t0 = time.perf_counter()
            deleted = store.clean_files_periodically()
            stats["round"].append(time.perf_counter() - t0)
        stats["lat"].extend(lat)
        stats["deleted"].append(len(deleted))

    benchmark.group = "clean round, 1000 expired 4 KiB files, producer running"
    try:
        benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
        check_and_close()
    finally:
        last.clear()                    # a failed round is reported as it failed
        check_and_close()
    lat = sorted(stats["lat"])
    per_file = statistics.mean(r / max(1, d) for r, d in zip(stats["round"], stats["deleted"]))
    info = benchmark.extra_info
    info["files_deleted_per_round"] = stats["deleted"]
    info["round_s"] = [round(r, 4) for r in stats["round"]]
    info["mean_deletion_ms"] = round(per_file * 1e3, 4)
    info["puts_during_rounds"] = len(lat)
    info["put_p50_us"] = round(lat[len(lat) // 2] * 1e6, 1)
    info["put_p99_us"] = round(lat[int(len(lat) * 0.99)] * 1e6, 1)
    info["put_max_us"] = round(lat[-1] * 1e6, 1)
    info["max_put_over_mean_deletion"] = round(lat[-1] / per_file, 2)
    base = sorted(stats["base"])
    info["baseline_put_p99_us"] = round(base[int(len(base) * 0.99)] * 1e6, 1)
    info["baseline_put_max_us"] = round(base[-1] * 1e6, 1)
    assert all(d >= FILES - 1 for d in stats["deleted"])
    assert max(stats["round"]) < config.clean_resource_interval / 1000
