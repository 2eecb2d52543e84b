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


# ---- checks and sizes shared by `rocketstore bench` and bench/ ------------------------------
# Run outside the timed region: a benchmark of puts that were refused (a full disk answers
# SERVICE_NOT_AVAILABLE fast) measures nothing.

def check_puts(results, messages=None):
    """Raise WorkloadCheckError unless every PutMessageResult / PutMessagesResult in `results`
    is PUT_OK and, given `messages`, they stored that many messages in all."""
    from .errors import WorkloadCheckError
    from .status import PutMessageStatus
    ok = PutMessageStatus.PUT_OK
    stored = 0
    for i, r in enumerate(results):
        if r.status is not ok:
            why = f": {r.reason}" if r.reason else ""
            raise WorkloadCheckError(f"put {i + 1} of {len(results)} answered "
                                     f"{r.status.name}{why}")
        stored += getattr(r, "count", 1)
    if messages is not None and stored != messages:
        raise WorkloadCheckError(f"{stored} of {messages} messages were stored")
    return stored


def wait_dispatched(store, timeout=5.0):
    """Block until reput has dispatched everything written so far. A dispatch that keeps
    failing (a full disk) ends the wait with its error rather than at the timeout; one that
    failed before the wait gets its retry first, since the disk may have room again."""
    import time
    from .errors import WorkloadCheckError
    deadline = time.monotonic() + timeout
    failed_before = store.dispatch_failures()[0]
    while store.dispatch_behind_bytes() > 0:
        failures, failing = store.dispatch_failures()
        if failing is not None and failures > failed_before:
            raise WorkloadCheckError(f"dispatch to the queues and index failed: {failing}")
        if time.monotonic() > deadline:
            raise WorkloadCheckError(f"reput did not catch up with the CommitLog in {timeout} s")
        time.sleep(0.001)


def _queue_bodies(store, topic, queue_id, lo, hi):
    bodies = []
    offset = lo
    while offset < hi:
        r = store.get_message("workload-check", topic, queue_id, offset, 32)
        if not r.messages:
            from .errors import WorkloadCheckError
            raise WorkloadCheckError(f"{topic} queue {queue_id}: nothing reads back at offset "
                                     f"{offset} of {hi} ({r.status.name})")
        bodies.extend(bytes(m.body) for m in r.messages)
        offset = r.next_begin_offset
    return bodies


def check_read_back(store, msgs, rounds=1, ordered=True, head_expired=False, sample=None,
                    seed=0):
    """Raise WorkloadCheckError unless every queue `msgs` went to reads back, through its
    ConsumeQueue, the bodies that were put there, `msgs` having been put `rounds` times.

    ordered=False compares each queue's bodies as a multiset (producer threads interleave);
    head_expired=True lets a queue start past offset 0 (cleaning deleted its head), the rest
    matching the tail of what was put; sample=K reads back K random messages per queue and
    takes the count from the queue's offsets (cheap, for `rocketstore bench`, whose consume
    phase has just read everything); with ordered=False each sampled body must be one put
    to that queue."""
    import random
    from .errors import WorkloadCheckError
    wait_dispatched(store, timeout=600)
    by_queue = {}
    for m in msgs:
        by_queue.setdefault((m.topic, m.queue_id), []).append(m.body)
    rng = random.Random(seed)
    for (topic, queue_id), bodies in by_queue.items():
        want = bodies * rounds
        lo = store.get_min_offset_in_queue(topic, queue_id)
        hi = store.get_max_offset_in_queue(topic, queue_id)
        if head_expired:
            want = want[max(0, len(want) - (hi - lo)):]
        elif lo != 0:
            raise WorkloadCheckError(f"{topic} queue {queue_id} starts at offset {lo}, not 0")
        if hi - lo != len(want):
            raise WorkloadCheckError(f"{topic} queue {queue_id} holds {hi - lo} messages; "
                                     f"{len(want)} were put")
        if sample is not None:
            put = None if ordered else set(want)
            for i in rng.sample(range(len(want)), min(sample, len(want))):
                got = _queue_bodies(store, topic, queue_id, lo + i, lo + i + 1)[0]
                if (got != want[i]) if ordered else (got not in put):
                    raise WorkloadCheckError(f"{topic} queue {queue_id} offset {lo + i}: the "
                                             "body differs from what was put")
            continue
        got = _queue_bodies(store, topic, queue_id, lo, hi)
        if len(got) != len(want):
            raise WorkloadCheckError(f"{topic} queue {queue_id}: {len(got)} of {len(want)} "
                                     "messages read back")
        if not ordered:
            got.sort()
            want = sorted(want)
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                raise WorkloadCheckError(f"{topic} queue {queue_id} offset {lo + i}: the "
                                         "body differs from what was put")


def commitlog_bytes(msgs, rounds=1):
    """An upper bound of the CommitLog bytes `msgs` take when put `rounds` times: each record's
    exact size with IPv6-sized hosts."""
    from . import format as F
    from .kernels import pure
    from .message import properties_to_string
    flags = F.BORNHOST_V6_FLAG | F.STOREHOSTADDRESS_V6_FLAG
    size = pure.msg_size
    total = 0
    for m in msgs:
        props = properties_to_string(m.properties).encode() if m.properties else b""
        total += size(flags, len(m.body or b""), len(m.topic.encode()), len(props))
    return total * rounds


def sized_config(msgs, rounds=1, **overrides):
    """A StoreConfig whose CommitLog file holds `msgs` put `rounds` times, and whose
    ConsumeQueue files hold the fullest queue, so a benchmark's store costs about its data:
    the default 1 GiB CommitLog file, and the next one allocated ahead, reserve 2 GiB of disk
    however little is put. `overrides` are further StoreConfig fields."""
    from .config import StoreConfig
    from .format import CQ_STORE_UNIT_SIZE
    mib = 1 << 20
    # Headroom: the 8-byte end-of-file blank, and a file never exactly full.
    need = commitlog_bytes(msgs, rounds) + mib
    per_queue = {}
    for m in msgs:
        key = (m.topic, m.queue_id)
        per_queue[key] = per_queue.get(key, 0) + 1
    units = max(per_queue.values(), default=0) * rounds + 1
    fields = dict(mapped_file_size_commit_log=-(-need // mib) * mib,
                  mapped_file_size_consume_queue=min(300_000, max(1000, units))
                  * CQ_STORE_UNIT_SIZE)
    fields.update(overrides)
    return StoreConfig(**fields)
