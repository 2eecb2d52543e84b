# SPDX-License-Identifier: Apache-2.0
"""Put and get throughput, 128-byte bodies, ASYNC_FLUSH: one table per operation comparing
backends, with a plain-Python length-prefixed f.write loop as the baseline.

Messages per second = extra_info["messages"] * ops (rounds per second)."""
import struct

import pytest

from rocketstore import MessageStore, StoreConfig
from rocketstore.workload import make_messages

N = 20_000
BATCH = 1000


def _config(**kw):
    base = dict(mapped_file_size_commit_log=1 << 30)
    base.update(kw)
    return StoreConfig(**base)


@pytest.fixture
def store_factory(tmp_path):
    stores = []

    def make(backend, **kw):
        s = MessageStore(tmp_path / f"s{len(stores)}", _config(**kw), kernels=backend)
        s.load()
        s.start()
        stores.append(s)
        return s
    yield make
    for s in stores:
        s.shutdown()


def test_put_message(benchmark, backend, store_factory):
    store = store_factory(backend)
    msgs = make_messages(N)
    put = store.put_message

    def run():
        for m in msgs:
            put(m)
    benchmark.group = "put_message (one at a time)"
    benchmark.extra_info["messages"] = N
    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)


def test_put_messages(benchmark, backend, store_factory):
    store = store_factory(backend)
    msgs = make_messages(N)
    batches = [msgs[i:i + BATCH] for i in range(0, N, BATCH)]

    def run():
        for b in batches:
            store.put_messages(b)
    benchmark.group = "put_messages (batches of 1000)"
    benchmark.extra_info["messages"] = N
    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("group", ["put_message (one at a time)",
                                   "put_messages (batches of 1000)"])
def test_plain_file_write_baseline(benchmark, tmp_path, group):
    """The same messages, length-prefixed (topic, keys, tags, body) into a buffered file."""
    msgs = make_messages(N)
    pack = struct.Struct(">iHH").pack
    f = open(tmp_path / "baseline.bin", "wb")

    def run():
        write = f.write
        for m in msgs:
            props = (m.properties.get("KEYS", "") + "\x02" + m.properties.get("TAGS", "")).encode()
            topic = m.topic.encode()
            write(pack(len(m.body), len(topic), len(props)))
            write(topic)
            write(props)
            write(m.body)
        f.flush()
    benchmark.group = group
    benchmark.name = "plain f.write"
    benchmark.extra_info["messages"] = N
    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    f.close()


def test_get_message_batch_32(benchmark, backend, store_factory):
    store = store_factory(backend)
    store.put_messages(make_messages(N, queues=1))
    while store.dispatch_behind_bytes() > 0:
        pass

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


def _topics_that_fit(wanted, queues=4):
    """Every queue maps a file, and CPython's mmap holds a descriptor per mapping: cap the
    topic count by the open-file limit (the cap is reported in extra_info)."""
    from rocketstore.fs import raise_fd_limit
    limit = raise_fd_limit() or 1024
    return min(wanted, max(1, (limit - 512) // queues))


@pytest.mark.parametrize("topics", [1, 10_000])
def test_put_many_topics(benchmark, backend, store_factory, topics):
    """The seed's point: every topic shares one CommitLog, so 10 000 topics x 4 queues cost
    about what one topic costs (a Kafka-style log per partition would not)."""
    topics = _topics_that_fit(topics)
    store = store_factory(backend, mapped_file_size_consume_queue=1000 * 20)
    total = 40_000
    msgs = make_messages(total, topics=topics, queues=4)
    batches = [msgs[i:i + BATCH] for i in range(0, total, BATCH)]

    def run():
        for b in batches:
            store.put_messages(b)
    benchmark.group = "put_messages: 10 000 topics x 4 queues vs 1 topic"
    benchmark.extra_info["messages"] = total
    benchmark.extra_info["topics"] = topics
    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)

