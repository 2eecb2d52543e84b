# SPDX-License-Identifier: Apache-2.0
"""Seeded message generator shared by `rocketstore bench`, bench/ and tests: the same seed gives
the same messages, so backends and peers are compared on identical input."""
import random

from .message import Message


def make_messages(count, body_size=128, topics=1, queues=4, seed=7, keys=True, tags=True,
                  start=0):
    """`count` messages spread round-robin over topics and queues, each with a unique key."""
    rng = random.Random(seed)
    alphabet = bytes(range(48, 123))
    pool = bytes(rng.choice(alphabet) for _ in range(4096 + body_size))
    names = [f"BenchTopic{t}" for t in range(topics)]
    out = []
    for i in range(start, start + count):
        off = (i * 131) % 4096
        out.append(Message(
            names[i % topics],
            pool[off:off + body_size],
            tags=f"Tag{i % 8}" if tags else None,
            keys=f"key-{i}" if keys else None,
            queue_id=(i // topics) % queues,
            born_timestamp=1_700_000_000_000 + i,
            born_host=("10.0.0.7", 40001),
        ))
    return out
