# SPDX-License-Identifier: Apache-2.0
"""Checked by `mypy --strict` in scripts/typecheck (never run): an embedding program written
against the shipped .pyi types. A stub that loses or mistypes a public name fails here."""
from rocketstore import (GetMessageStatus, LiveReader, Message, MessageExt, MessageStore,
                         PutMessageStatus, StoreConfig)


def produce_and_consume(root: str) -> list[bytes]:
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20)
    with MessageStore(root, cfg) as store:
        r = store.put_message(Message("TopicA", b"hello", tags="TagA", keys="k1"))
        assert r.status is PutMessageStatus.PUT_OK and r.queue_offset >= 0
        rs = store.put_messages([Message("TopicA", b"%d" % i) for i in range(3)])
        first: int = int(rs.commit_log_offsets[0])
        got = store.get_message("g", "TopicA", 0, 0, 32)
        bodies = [m.body for m in got.messages] if got.status is GetMessageStatus.FOUND else []
        hit: MessageExt | None = store.look_message_by_offset(first)
        store.commit_offset("g", "TopicA", 0, got.next_begin_offset)
        keys = store.query_message("TopicA", "k1").messages
        return bodies + ([hit.body] if hit is not None else []) + [m.body for m in keys]


def wait_and_iterate(store: MessageStore) -> int:
    got = store.get_message("g", "TopicA", 0, 0, 32, wait_ms=100)
    n = len(got.messages)
    with store.consume("g", "TopicA", 0, batch_size=16) as consumer:
        batch = consumer.next_batch(wait_ms=100)
        n += len(batch) if batch is not None else 0
        for messages in consumer:
            n += sum(len(m.body) for m in messages)
            consumer.close()
    return n


async def consume_async(store: MessageStore) -> list[bytes]:
    r = await store.aput_message(Message("TopicA", b"async"))
    assert r.status is PutMessageStatus.PUT_OK
    got = await store.aget_message("g", "TopicA", 0, 0, wait_ms=100)
    bodies = [m.body for m in got.messages]
    async with store.aconsume("g", "TopicA", 0) as consumer:
        async for messages in consumer:
            bodies += [m.body for m in messages]
            await consumer.aclose()
    return bodies


def follow(root: str, offsets: str) -> int:
    with LiveReader(root, offsets_path=offsets) as reader:
        got = reader.get_message("g", "TopicA", 0, 0, 32, wait_ms=100)
        n = len(got.messages) + reader.get_max_offset_in_queue("TopicA", 0)
        with reader.consume("g", "TopicA", 0) as consumer:
            batch = consumer.next_batch(wait_ms=10)
            n += len(batch) if batch is not None else 0
        reader.flush_offsets()
        return n + reader.query_offset("g", "TopicA", 0)
