# SPDX-License-Identifier: Apache-2.0
"""Random bit flips and truncations in CommitLog, ConsumeQueue, index and checkpoint files: the
store still opens, serves what is intact, and says what it dropped. It never crashes or hangs.
The damage a writable open refuses is in index files of other sizes than they were written
with (the index is not rewritten behind the operator's back): the refusal names the repair,
and after it the store opens and serves."""
import os
import random
import shutil

import pytest

from rocketstore import Message, MessageStore, StoreError, StoreLoadError, repair, testing
from rocketstore import format as F
from rocketstore.format import CQ_STORE_UNIT_SIZE as UNIT
from rocketstore.workload import make_messages

SEEDS = testing.damage_seeds()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine") / "store"
    store = testing.open_store(root, testing.backend_params()[0])
    try:
        msgs = make_messages(1500, body_size=90, topics=3, queues=2)
        store.put_messages(msgs[:700])
        for m in msgs[700:]:
            store.put_message(m)
        testing.wait_dispatched(store)
    finally:
        store.shutdown()
    return root


def read_everything(store):
    count = 0
    for topic, queues in list(store.consume_queue_table.items()):
        for qid in list(queues):
            offset = store.get_min_offset_in_queue(topic, qid)
            for _ in range(10_000):
                r = store.get_message("g", topic, qid, offset, 32)
                count += len(r.messages)
                if r.next_begin_offset <= offset:
                    break
                offset = r.next_begin_offset
    for _ in store.iter_messages():
        count += 1
    return count


# The refusals a writable open makes of damaged index files, and the repair each names.
_INDEX_REFUSALS = {
    "`rocketstore rebuild-index` rebuilds the index": {},
    "set max_hash_slot_num and max_index_num to the values they were written with":
        {"max_hash_slot_num": testing.small_config().max_hash_slot_num,
         "max_index_num": testing.small_config().max_index_num},
}


def _opened_or_repaired(root, backend):
    """The damaged store at `root`, loaded; where the open refuses damaged index files (the
    index is not rewritten behind the operator's back), after the repair its error names."""
    store = MessageStore(root, testing.small_config(), kernels=backend)
    try:
        store.load()
        return store
    except StoreLoadError as exc:
        remedy = [numbers for said, numbers in _INDEX_REFUSALS.items() if said in str(exc)]
        if not remedy:
            pytest.fail(f"damaged store did not open: {exc!r}")
    except StoreError as exc:
        pytest.fail(f"damaged store did not open: {exc!r}")
    repair.rebuild_index(str(root), kernels=backend, **remedy[0])
    store = MessageStore(root, testing.small_config(), kernels=backend)
    store.load()
    return store


@pytest.mark.parametrize("seed", range(SEEDS))
def test_damaged_store_opens_serves_and_reports(tmp_path, backend, pristine, seed):
    rng = random.Random(seed)
    root = tmp_path / "store"
    shutil.copytree(pristine, root)
    testing.damage_at_random(root, rng)
    store = _opened_or_repaired(root, backend)
    store.start()
    try:
        report = store.recovery_report
        assert report.process_offset == store.get_max_phy_offset()
        read_everything(store)
        r = store.put_message(Message("AfterDamage", b"still writable"))
        assert r.ok
        testing.wait_dispatched(store)
        assert store.get_message("g", "AfterDamage", 0, 0).messages[0].body == b"still writable"
    finally:
        store.shutdown()


def test_a_unit_whose_size_was_damaged_past_the_log_does_not_hide_later_puts(tmp_path, backend,
                                                                           pristine):
    # Seed 92 of the test above: the last unit of a queue had a size bit flipped, its end
    # became that queue's max physical offset, 64 MiB past the log, and reput started there:
    # every put after the open was acknowledged and never reached its queue.
    root = tmp_path / "store"
    shutil.copytree(pristine, root)
    qdir = root / "consumequeue" / "BenchTopic1" / "1"
    last = qdir / sorted(os.listdir(qdir))[-1]
    raw = bytearray(last.read_bytes())
    units = len(raw) // UNIT
    while raw[(units - 1) * UNIT:units * UNIT] == bytes(UNIT):   # zeros past the last unit
        units -= 1
    size_at = (units - 1) * UNIT + F.CQ_POS_SIZE
    size = F.I32.unpack_from(raw, size_at)[0]
    F.I32.pack_into(raw, size_at, size | 1 << 26)
    last.write_bytes(bytes(raw))
    store = testing.open_store(root, backend, testing.small_config())
    try:
        before = store.get_max_offset_in_queue("BenchTopic1", 1)
        assert store.put_message(Message("BenchTopic1", b"after", queue_id=1)).ok
        assert store.put_message(Message("AfterDamage", b"still writable")).ok
        testing.wait_dispatched(store)
        got = store.get_message("g", "BenchTopic1", 1, before).messages
        assert [m.body for m in got] == [b"after"]
        assert store.get_message("g", "AfterDamage", 0, 0).messages[0].body == b"still writable"
    finally:
        store.shutdown()


def test_a_record_whose_queue_id_was_damaged_negative_gets_no_queue(tmp_path, backend, pristine):
    # Seed 1401 of the test above at 1 500 seeds: bit 31 of a record's queue id flipped (the
    # CRC covers the body only), and recovery's dispatch made a queue named "-2147483647".
    root = tmp_path / "store"
    shutil.copytree(pristine, root)
    first = root / "commitlog" / sorted(os.listdir(root / "commitlog"))[0]
    raw = bytearray(first.read_bytes())
    queue_id = F.I32.unpack_from(raw, F.POS_QUEUEID)[0]         # the first record's
    F.I32.pack_into(raw, F.POS_QUEUEID, queue_id | -(1 << 31))
    first.write_bytes(bytes(raw))
    (root / "abort").touch()                                      # recovery dispatches again
    store = testing.open_store(root, backend, testing.small_config())
    try:
        assert all(q >= 0 for queues in store.consume_queue_table.values() for q in queues)
        assert not [d for d in root.glob("consumequeue/*/*") if d.name.startswith("-")]
        got = store.get_message("g", "BenchTopic0", queue_id, 0, 2).messages
        assert [m.queue_offset for m in got] == [0, 1]   # the queue kept its units
        assert read_everything(store) > 0
    finally:
        store.shutdown()
