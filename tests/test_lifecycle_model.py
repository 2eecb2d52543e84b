# SPDX-License-Identifier: Apache-2.0
"""A seeded random life of one store, checked against a model of what it acknowledged.

Each step is one of: put_message, put_messages of a mixed list, put_batch, a read of a queue
range, a key query, a look-up by commit-log offset, a committed consumer offset, a topic
deleted, a LiveReader's read of a queue (one reader for the whole life, open across every
reopen), a cleaning round that deletes the oldest CommitLog files (a small store_size_budget),
or a reopen: clean, through abnormal recovery (the abort file left behind), or after the
ConsumeQueues or the index were rebuilt offline. Every open picks a backend and a way of
flushing at random, so the three backends read and extend each other's files, with and without
the TransientStorePool and group commit. The model is what a user was told: every message
acknowledged is served at the queue offset and commit-log offset its put answered, with its
body, keys and tags, and by its key, until its topic is deleted; a deleted topic serves nothing
and starts again at offset 0; what cleaning deleted is below each queue's minimum offset, and
what it kept is served as before (a ConsumeQueue rebuild forgets a queue none of whose
records is left); committed offsets survive reopens. Found so far: a queue
whose every message expired kept a minimum below its files, and the flusher synced one small
file an interval, seconds behind a burst.

CI runs a few seeds; ROCKETSTORE_LIFECYCLE_SEEDS=200 soaks."""
import os
import random

import pytest

from rocketstore import LiveReader, Message, repair, testing
from rocketstore.config import FlushDiskType
from rocketstore.status import PutMessageStatus

SEEDS = int(os.environ.get("ROCKETSTORE_LIFECYCLE_SEEDS", "3"))
STEPS = 90
TOPICS = ("TopicA", "TopicB", "TopicC")
QUEUES = 3
GROUPS = ("g1", "g2")
# Small files, so a life rolls CommitLog, ConsumeQueue and index files many times over.
# Cleaning runs only when a step asks (clean_resource_interval: an hour), and then deletes the
# oldest CommitLog files until the store fits its budget.
CONFIG = dict(mapped_file_size_commit_log=32 * 1024, mapped_file_size_consume_queue=40 * 20,
              max_hash_slot_num=32, max_index_num=200, store_size_budget=192 * 1024,
              clean_resource_interval=3_600_000)


class Model:
    """What the store acknowledged: per queue, its messages in queue order, each as
    (body, key, tags, commit-log offset); and each group's committed offsets."""

    def __init__(self):
        self.queues = {}
        self.committed = {}
        self.serial = 0
        self.floor = 0          # the CommitLog's minimum offset: cleaning deleted what is below

    def first_kept(self, topic, queue_id):
        """The queue offset of the queue's first message at or above the floor."""
        msgs = self.queues.get((topic, queue_id), [])
        return next((i for i, m in enumerate(msgs) if m[3] >= self.floor), len(msgs))

    def message(self, rng, topic, queue_id, tags=""):
        self.serial += 1
        key = f"k{self.serial}"
        if tags == "":
            tags = rng.choice((None, "a", "b"))
        body = rng.randbytes(rng.choice((0, 1, 40, 300, 2000)))
        return Message(topic, body, tags=tags, keys=key, queue_id=queue_id)

    def acked(self, msg, queue_offset, commit_log_offset):
        q = self.queues.setdefault((msg.topic, msg.queue_id), [])
        assert queue_offset == len(q), (msg.topic, msg.queue_id, queue_offset, len(q))
        q.append((msg.body, msg.properties.get("KEYS"), msg.properties.get("TAGS"),
                  commit_log_offset))

    def forget_expired_queues(self):
        for key in [k for k in self.queues if self.first_kept(*k) == len(self.queues[k])]:
            del self.queues[key]

    def delete(self, topic):
        for key in [k for k in self.queues if k[0] == topic]:
            del self.queues[key]
        for key in [k for k in self.committed if k[1] == topic]:
            del self.committed[key]


# How each open flushes: the three ways a master writes (ASYNC_FLUSH into the mapping, into the
# TransientStorePool's write buffers, and SYNC_FLUSH's group commit).
MODES = {"async": {}, "pool": dict(transient_store_pool_enable=True),
         "sync": dict(flush_disk_type=FlushDiskType.SYNC_FLUSH)}


def _open(root, rng, backends):
    backend, mode = rng.choice(backends), rng.choice(sorted(MODES))
    store = testing.open_store(root, backend, testing.small_config(**CONFIG, **MODES[mode]))
    return store, f"{backend} {mode}"


def _reopen(store, root, rng, backends, how, model):
    store.shutdown()
    if how == "abort":
        # As a crash after the last flush leaves it: recovery runs over complete files.
        open(os.path.join(root, "abort"), "w").close()
    elif how == "rebuild-cq":
        repair.rebuild_consume_queues(root, kernels=rng.choice(backends))
        # Rebuilt from the CommitLog: a queue none of whose records is left is gone, and a
        # put starts it again at offset 0 (as a broker whose consumequeue/ was deleted).
        model.forget_expired_queues()
    elif how == "rebuild-index":
        repair.rebuild_index(root, kernels=rng.choice(backends),
                             max_hash_slot_num=CONFIG["max_hash_slot_num"],
                             max_index_num=CONFIG["max_index_num"])
    return _open(root, rng, backends)


def _check_queue(store, model, topic, queue_id, start=0, count=None):
    expected = model.queues.get((topic, queue_id), [])
    assert store.get_max_offset_in_queue(topic, queue_id) == len(expected), (topic, queue_id)
    low = model.first_kept(topic, queue_id)
    assert store.get_min_offset_in_queue(topic, queue_id) == low, (topic, queue_id)
    start = max(start, low)
    end = len(expected) if count is None else min(len(expected), start + count)
    offset = start
    while offset < end:
        got = store.get_message("g", topic, queue_id, offset, min(32, end - offset))
        assert got.messages, (topic, queue_id, offset, got.status)
        for m in got.messages:
            assert m.topic == topic and m.queue_id == queue_id
        offset = _check_served(got.messages, expected, offset, (topic, queue_id))
    if count is None:
        assert not store.get_message("g", topic, queue_id, len(expected), 8).messages


def _check_served(messages, expected, offset, queue):
    """`messages`, read from queue offset `offset`, are the model's `expected` there: queue
    offset, body, keys, tags and commit-log offset. Returns the offset after them."""
    for m in messages:
        body, key, tags, phy = expected[m.queue_offset]
        assert (m.queue_offset, m.body, m.keys, m.tags, m.commit_log_offset) == (
            offset, body, key, tags, phy), (queue, offset)
        offset += 1
    return offset


def _check_key(store, model, topic, queue_id, i):
    body, key, _, phy = model.queues[(topic, queue_id)][i]
    found = store.query_message(topic, key, 64).messages
    assert [(m.commit_log_offset, m.body) for m in found] == [(phy, body)], (topic, key)


def _check_live(reader, model, topic, queue_id, rng):
    """A LiveReader serves the queue's messages the writer kept, at their offsets."""
    expected = model.queues.get((topic, queue_id), [])
    assert reader.get_max_offset_in_queue(topic, queue_id) == len(expected), (topic, queue_id)
    low = model.first_kept(topic, queue_id)
    if low == len(expected):
        return
    offset = rng.randrange(max(low, reader.get_min_offset_in_queue(topic, queue_id)),
                           len(expected))
    got = reader.get_message("g", topic, queue_id, offset, 32)
    assert got.messages, (topic, queue_id, offset, got.status)
    _check_served(got.messages, expected, offset, (topic, queue_id))


def _check_all(store, model):
    for topic in TOPICS:
        for q in range(QUEUES):
            _check_queue(store, model, topic, q)
    for (group, topic, q), offset in model.committed.items():
        assert store.query_offset(group, topic, q) == offset, (group, topic, q)
    for (topic, q), msgs in model.queues.items():
        for i in range(model.first_kept(topic, q), len(msgs), 7):
            _check_key(store, model, topic, q, i)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_random_life_of_a_store_serves_what_it_acknowledged(tmp_path, seed):
    rng = random.Random(seed)
    backends = testing.backend_params()
    root = str(tmp_path / "store")
    model = Model()
    store, backend = _open(root, rng, backends)
    reader = None
    history = [f"open {backend}"]
    try:
        for _ in range(STEPS):
            op = rng.choices(("put", "list", "batch", "read", "key", "offset", "commit",
                              "delete", "reopen", "clean", "live"),
                             weights=(8, 6, 4, 6, 4, 2, 2, 1, 2, 1, 3))[0]
            topic, q = rng.choice(TOPICS), rng.randrange(QUEUES)
            history.append(op)
            if op == "put":
                msg = model.message(rng, topic, q)
                r = store.put_message(msg)
                assert r.status == PutMessageStatus.PUT_OK, r
                model.acked(msg, r.queue_offset, r.commit_log_offset)
            elif op == "list":
                msgs = [model.message(rng, rng.choice(TOPICS), rng.randrange(QUEUES))
                        for _ in range(rng.randint(1, 60))]
                r = store.put_messages(msgs)
                assert r.status == PutMessageStatus.PUT_OK and r.count == len(msgs), r
                for m, qo, phy in zip(msgs, r.queue_offsets, r.commit_log_offsets):
                    model.acked(m, int(qo), int(phy))
            elif op == "batch":
                tags = rng.choice((None, "a"))
                msgs = [model.message(rng, topic, q, tags) for _ in range(rng.randint(1, 80))]
                r = store.put_batch(topic, q, [m.body for m in msgs], tags=tags,
                                    keys=[m.properties["KEYS"] for m in msgs])
                assert r.status == PutMessageStatus.PUT_OK and r.count == len(msgs), r
                for m, qo, phy in zip(msgs, r.queue_offsets, r.commit_log_offsets):
                    model.acked(m, int(qo), int(phy))
            elif op == "live":
                # A reader in another process, as far as the files go: it stays open across
                # the writer's reopens, rebuilds, cleaning and deletions.
                if reader is None:
                    reader = LiveReader(root, kernels=rng.choice(backends))
                    # Exact answers: a deleted or rebuilt queue is seen at the next call, not
                    # up to a millisecond later.
                    reader.replaced_check_s = 0
                # What the writer has made visible: with the TransientStorePool, what its
                # commit thread has committed, and then dispatched.
                store.catch_up()
                testing.wait_dispatched(store)
                _check_live(reader, model, topic, q, rng)
            elif op in ("read", "key", "offset", "commit"):
                msgs = model.queues.get((topic, q))
                low = model.first_kept(topic, q)
                if not msgs or low == len(msgs):
                    continue
                testing.wait_dispatched(store)
                i = rng.randrange(low, len(msgs))
                if op == "read":
                    _check_queue(store, model, topic, q, i, rng.randint(1, 50))
                elif op == "key":
                    _check_key(store, model, topic, q, i)
                elif op == "offset":
                    assert store.look_message_by_offset(msgs[i][3]).body == msgs[i][0]
                else:
                    group = rng.choice(GROUPS)
                    store.commit_offset(group, topic, q, i)
                    model.committed[(group, topic, q)] = i
            elif op == "delete":
                testing.wait_dispatched(store)
                store.delete_topic(topic)
                model.delete(topic)
                history[-1] = f"delete {topic}"
                for qq in range(QUEUES):
                    _check_queue(store, model, topic, qq)
            elif op == "clean":
                testing.wait_dispatched(store)
                testing.wait_flushed(store.commitlog)
                gone = store.clean_files_periodically()
                floor = max(0, store.get_min_phy_offset())     # -1: no file yet
                assert floor >= model.floor
                model.floor = floor
                history[-1] = f"clean {len(gone)} files, floor {floor}"
                _check_all(store, model)
            else:
                how = rng.choice(("clean", "abort", "rebuild-cq", "rebuild-index"))
                store, backend = _reopen(store, root, rng, backends, how, model)
                history[-1] = f"reopen {how} {backend}"
                testing.wait_dispatched(store)
                _check_all(store, model)
        testing.wait_dispatched(store)
        _check_all(store, model)
        store, backend = _reopen(store, root, rng, backends, "abort", model)
        history.append(f"reopen abort {backend}")
        testing.wait_dispatched(store)
        _check_all(store, model)
    except Exception as e:
        raise AssertionError(f"seed {seed} after {' / '.join(history[-12:])}: {e!r}") from e
    finally:
        store.shutdown()
        if reader is not None:
            reader.close()
