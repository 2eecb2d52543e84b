# SPDX-License-Identifier: Apache-2.0
"""Put and get throughput, 128-byte bodies, ASYNC_FLUSH: one table per operation comparing
backends, with a plain-Python length-prefixed f.write loop as the baseline.

Messages per second = extra_info["messages"] * ops (rounds per second). The put benchmarks also
report the putting thread's CPU time per message (extra_info["thread_cpu_ns_per_msg"], timed
rounds only), the per-thread figure to set beside bench/java/PutBench's on a loaded machine."""
import os
import struct

import pytest

from rocketstore.workload import check_puts, check_read_back, make_messages

N = 20_000
BATCH = 1000
# Timed rounds of each put test and of the f.write baseline. Five rounds (30 MB of CommitLog
# with the warm-up) stay mostly inside what the allocator populates ahead; a longer burst
# (ROCKETSTORE_PUT_ROUNDS=30: 150 MB) measures a writer faster than new memory comes, on a VM
# whose host backs freed memory again (doc/performance.md, "A writer behind its populate").
ROUNDS = int(os.environ.get("ROCKETSTORE_PUT_ROUNDS", "5"))
RUNS = ROUNDS + 1          # with the warmup round (--benchmark-disable: one run)


def test_put_message(benchmark, backend, store_factory, thread_cpu):
    msgs = make_messages(N)
    store = store_factory(backend, msgs, RUNS)
    put = store.put_message
    results = []
    keep = results.append

    def run():
        for m in msgs:
            keep(put(m))
    benchmark.group = "put_message (one at a time)"
    benchmark.extra_info["messages"] = N
    benchmark.pedantic(thread_cpu.wrap(run), rounds=ROUNDS, iterations=1, warmup_rounds=1)
    thread_cpu.record(benchmark, N, skip=1)
    check_puts(results)
    check_read_back(store, msgs, len(results) // N)


def test_put_messages(benchmark, backend, store_factory, thread_cpu):
    msgs = make_messages(N)
    store = store_factory(backend, msgs, RUNS)
    batches = [msgs[i:i + BATCH] for i in range(0, N, BATCH)]
    results = []
    keep = results.append

    def run():
        for b in batches:
            keep(store.put_messages(b))
    benchmark.group = "put_messages (batches of 1000)"
    benchmark.extra_info["messages"] = N
    benchmark.pedantic(thread_cpu.wrap(run), rounds=ROUNDS, iterations=1, warmup_rounds=1)
    thread_cpu.record(benchmark, N, skip=1)
    check_puts(results, len(results) // len(batches) * N)
    check_read_back(store, msgs, len(results) // len(batches))


@pytest.mark.parametrize("group", ["put_message (one at a time)",
                                   "put_messages (batches of 1000)"])
def test_plain_file_write_baseline(benchmark, tmp_path, group):
    """The same messages, length-prefixed (topic, keys, tags, body) into a buffered file.

    Like for like: the peer reads the same Message attributes (topic, the KEYS and TAGS
    properties, body) and encodes the same str to UTF-8, with the cheapest plain-Python idiom
    (bound write, a prebuilt struct.Struct, a buffered file, no flush or sync per message;
    one flush per round puts the tail in the page cache, as the store's writes into its
    mapping are). It is favoured, not handicapped: it writes about 160 bytes per message
    where the store writes its 250-254-byte record (the CRC of the body, queue and physical
    offsets, store time, all properties in HashMap order), and it builds no ConsumeQueue
    unit or index entry; the store's reput and flush threads run on the same cores during
    its timed rounds, while the peer runs alone."""
    msgs = make_messages(N)
    pack = struct.Struct(">iHH").pack
    f = open(tmp_path / "baseline.bin", "wb")
    runs = []

    def run():
        write = f.write
        start = f.tell()
        for m in msgs:
            props = (m.properties.get("KEYS", "") + "\x02" + m.properties.get("TAGS", "")).encode()
            topic = m.topic.encode()
            write(pack(len(m.body), len(topic), len(props)))
            write(topic)
            write(props)
            write(m.body)
        f.flush()
        runs.append(f.tell() - start)
    benchmark.group = group
    benchmark.name = "plain f.write"
    benchmark.extra_info["messages"] = N
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    f.close()
    # The baseline's "read back": every round's records reached the file.
    assert (tmp_path / "baseline.bin").stat().st_size == sum(runs) >= len(runs) * N * 128
    # pytest keeps the last runs' tmp_path directories: the file goes now, as a store does.
    os.remove(tmp_path / "baseline.bin")


def test_get_message_batch_32(benchmark, backend, store_factory):
    msgs = make_messages(N, queues=1)
    store = store_factory(backend, msgs, rounds=1)
    check_puts([store.put_messages(msgs)], N)
    check_read_back(store, msgs)

    def run():
        offset = 0
        got = 0
        while True:
            r = store.get_message("g", "BenchTopic0", 0, offset, 32)
            if not r.messages:
                return got
            got += len(r.messages)
            offset = r.next_begin_offset
    benchmark.group = "get_message (batch 32, decoded)"
    benchmark.extra_info["messages"] = N
    assert benchmark(run) == N


def _topics_that_fit(wanted, backend, queues=4):
    """A backend whose mappings keep a descriptor each (mmap.mmap before Python 3.13) maps one
    file per queue: cap its topic count by the open-file limit (reported in extra_info).
    One that maps without descriptors (cext) runs every topic under the default limit."""
    from rocketstore.fs import mappings_hold_descriptors, raise_fd_limit
    if not mappings_hold_descriptors(backend):
        return wanted
    limit = raise_fd_limit() or 1024
    return min(wanted, max(1, (limit - 512) // queues))


def _soft_fd_limit():
    import resource
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _open_fds():
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1


# Timed rounds of test_put_many_topics. Fifteen by default: the first round carries the write
# faults of pages the kernel wrote back during the long warm-up that creates 40 000 queues
# (67 ms against 27-35 for the rest, 2026-12-04), so a median of three turned on whether one
# other round was slow too. Fifteen rounds add about half a second to the 30 s the queues take
# to create. ROCKETSTORE_MANY_TOPICS_ROUNDS=40 also takes in the ConsumeQueue flusher's
# once-a-second rounds.
MANY_TOPICS_ROUNDS = int(os.environ.get("ROCKETSTORE_MANY_TOPICS_ROUNDS", "15"))


@pytest.mark.parametrize("topics", [1, 10_000])
def test_put_many_topics(benchmark, backend, store_factory, topics):
    """The seed's point: every topic shares one CommitLog, so 10 000 topics x 4 queues cost
    about what one topic costs (a Kafka-style log per partition would not)."""
    wanted = topics
    topics = _topics_that_fit(topics, backend)
    total = 40_000
    msgs = make_messages(total, topics=topics, queues=4)
    store = store_factory(backend, msgs, rounds=MANY_TOPICS_ROUNDS + 1,
                          mapped_file_size_consume_queue=1000 * 20)
    batches = [msgs[i:i + BATCH] for i in range(0, total, BATCH)]
    results = []
    keep = results.append
    fds = []

    def run():
        for b in batches:
            keep(store.put_messages(b))
        fds.append(_open_fds())
    benchmark.group = "put_messages: 10 000 topics x 4 queues vs 1 topic"
    benchmark.extra_info["messages"] = total
    benchmark.extra_info["topics"] = topics
    benchmark.extra_info["capped"] = topics < wanted
    benchmark.pedantic(run, rounds=MANY_TOPICS_ROUNDS, iterations=1, warmup_rounds=1)
    check_puts(results, len(results) // len(batches) * total)
    check_read_back(store, msgs, len(results) // len(batches))
    # Counted once every queue is dispatched and mapped (reput trails the timed puts).
    fds.append(_open_fds())
    benchmark.extra_info["open_fds_max"] = max(fds)
    benchmark.extra_info["fd_soft_limit"] = _soft_fd_limit()
    benchmark.extra_info["queues"] = sum(len(q) for q in store.consume_queue_table.values())

