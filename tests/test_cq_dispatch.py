# SPDX-License-Identifier: Apache-2.0
"""The compiled ConsumeQueue dispatcher (the cext backend's cq_dispatch) against the numpy path
every backend can take: the same units, and no Python call for a row in the common case."""
import pytest

from rocketstore import MessageStore
from rocketstore import format as F
from rocketstore import testing
from rocketstore.message import Message

# "TfBxj" and "TJ1la" share an FNV-1a hash (the scan's topic_hash), so their rows share a
# (hash, queue id) key and must still reach their own queues.
TOPICS = ["TfBxj", "TJ1la", "T0", "T1", "T2"]


def workload(rounds):
    out = []
    for i in range(rounds * 60):
        topic = TOPICS[i % len(TOPICS)]
        props = {"DELAY": "2"} if i % 17 == 0 else {}
        sys_flag = F.TRANSACTION_PREPARED_TYPE if i % 23 == 0 else \
            F.TRANSACTION_ROLLBACK_TYPE if i % 29 == 0 else 0
        out.append(Message(topic, b"m%d" % i, tags="t%d" % (i % 3), keys="k%d" % i,
                           queue_id=i % 3, sys_flag=sys_flag, properties=props))
    return out


def cq_digest(root):
    return {k: v for k, v in testing.tree_digest(root).items() if k.startswith("consumequeue")}


def run_store(root, compiled, stand_still_rounds=3):
    """Put three rounds with reput standing still, dispatch each round in one go, dispatch the
    last round again (a retried batch), and count the rows handed to Python on each pass."""
    store = testing.open_store(root, testing.load_backend("cext"),
                               testing.small_config(mapped_file_size_consume_queue=8 * 20))
    cqd = store.dispatchers[0]
    if not compiled:
        cqd._k_dispatch = None
    slow = []
    row = cqd._dispatch_row
    cqd._dispatch_row = lambda r, buf: slow.append(r) or row(r, buf)
    per_pass = []
    try:
        store.reput_service.shutdown()
        msgs = workload(stand_still_rounds)
        per_round = len(msgs) // stand_still_rounds
        for r in range(stand_still_rounds):
            start = store.commitlog.max_offset
            for m in msgs[r * per_round:(r + 1) * per_round]:
                assert store.put_message(m).status.ok
            del slow[:]
            store.reput_service.do_reput()
            per_pass.append(len(slow))
        store.reput_service.reput_from_offset = start
        del slow[:]
        store.reput_service.do_reput()
        per_pass.append(len(slow))
        queues = {(t, q): (store.get_max_offset_in_queue(t, q),
                           store.get_message("g", t, q, 0, 1000).messages)
                  for t in TOPICS for q in range(3)}
        bodies = {k: [m.body for m in v[1]] for k, v in queues.items()}
        return per_pass, bodies
    finally:
        store.reput_service.start()
        store.shutdown()


def test_compiled_dispatch_writes_the_units_the_numpy_path_writes(tmp_path):
    _, bodies_c = run_store(tmp_path / "c", compiled=True)
    _, bodies_n = run_store(tmp_path / "n", compiled=False)
    assert cq_digest(tmp_path / "c") == cq_digest(tmp_path / "n")
    assert bodies_c == bodies_n
    # Colliding topic hashes still reach their own queues.
    assert bodies_c[("TfBxj", 0)][:1] == [b"m15"] and bodies_c[("TJ1la", 1)][:1] == [b"m1"]


def test_compiled_dispatch_hands_python_only_the_rare_rows(tmp_path):
    per_pass, _ = run_store(tmp_path / "c", compiled=True)
    msgs = workload(3)

    # Transaction halves and rollbacks get no unit; delayed rows go to SCHEDULE_TOPIC_XXXX.
    units = [m for m in msgs if not m.sys_flag]
    owner = {}                  # queue id -> the colliding topic whose row came first
    for m in units:
        if m.topic in TOPICS[:2] and not m.properties.get("DELAY"):
            owner.setdefault(m.queue_id, m.topic)

    def rare(r):
        # Delayed rows (their tagsCode), and the colliding topic that does not own the slot.
        return sum(1 for m in units if r * 60 <= int(m.body[1:]) < (r + 1) * 60
                   and (m.properties.get("DELAY")
                        or m.topic in TOPICS[:2] and owner[m.queue_id] != m.topic))
    # Round 0 meets every queue for the first time; round 1 only rare rows (its units fit the
    # 8-unit files); a retried round 2 finds every unit present.
    assert per_pass[0] > per_pass[1] == rare(1) > 0
    assert per_pass[3] == rare(2)


def test_retried_dispatch_adds_no_unit(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        for i in range(40):
            assert store.put_message(Message("T", b"m%d" % i, queue_id=i % 2)).status.ok
        testing.wait_dispatched(store)
        # The populate service may still be making a queue's next file (an empty one).
        testing.wait_until(lambda: store.populate_service.pending == 0)
        before = cq_digest(tmp_path / "s")
        with store.reput_service.dispatch_lock:
            store.reput_service.reput_from_offset = 0
            store.reput_service.do_reput()
        assert cq_digest(tmp_path / "s") == before
        assert [store.get_max_offset_in_queue("T", q) for q in (0, 1)] == [20, 20]
    finally:
        store.shutdown()


def _dispatch_after_python_changed_the_queues(root, compiled, change):
    """Put and dispatch a round, let `change(store)` rewrite queues from Python between two
    dispatch calls, then put and dispatch a second round. The compiled dispatcher keeps each
    queue's state from call to call; what Python changed must be read again, not overwritten.
    Returns what the queues read back."""
    store = testing.open_store(root, testing.load_backend("cext"),
                               testing.small_config(mapped_file_size_consume_queue=8 * 20))
    if not compiled:
        store.dispatchers[0]._k_dispatch = None
    try:
        store.reput_service.shutdown()
        for rnd in range(2):
            for i in range(12):
                m = Message("T", b"r%d-%d" % (rnd, i), queue_id=i % 2)
                assert store.put_message(m).status.ok
            store.reput_service.do_reput()
            if rnd == 0:
                change(store)
        return {q: (store.get_max_offset_in_queue("T", q),
                    [m.body for m in store.get_message(
                        "g", "T", q, store.get_min_offset_in_queue("T", q), 100).messages])
                for q in (0, 1)}
    finally:
        store.reput_service.start()
        store.shutdown()


def test_kept_queue_state_follows_a_truncation_between_calls(tmp_path):
    def truncate_and_redispatch(store):
        # Drop queue 0's units from its fourth record on, then dispatch those records again.
        cq = store.find_consume_queue("T", 0)
        phy = int(cq.units(3, 1)["offset"][0])
        cq.truncate_dirty_logic_files(phy)
        assert store.get_max_offset_in_queue("T", 0) == 3
        store.reput_service.reput_from_offset = phy
        store.reput_service.do_reput()
    got = _dispatch_after_python_changed_the_queues(tmp_path / "c", True,
                                                    truncate_and_redispatch)
    want = _dispatch_after_python_changed_the_queues(tmp_path / "n", False,
                                                     truncate_and_redispatch)
    assert cq_digest(tmp_path / "c") == cq_digest(tmp_path / "n")
    assert got == want
    assert got[0] == (12, [b"r0-%d" % i for i in range(0, 12, 2)] +
                      [b"r1-%d" % i for i in range(0, 12, 2)])


def test_kept_queue_state_follows_a_queue_destroyed_between_calls(tmp_path):
    def destroy(store):
        # Queue 1's files are deleted (as abnormal recovery does with a queue it cannot
        # trust); the second round's units start a new file after filler units.
        store.find_consume_queue("T", 1).destroy()
    got = _dispatch_after_python_changed_the_queues(tmp_path / "c", True, destroy)
    want = _dispatch_after_python_changed_the_queues(tmp_path / "n", False, destroy)
    assert cq_digest(tmp_path / "c") == cq_digest(tmp_path / "n")
    assert got == want
    assert got[1] == (12, [b"r1-%d" % i for i in range(1, 12, 2)])


def test_kept_queue_state_follows_units_python_appended_between_calls(tmp_path):
    def dispatch_by_python(store):
        # More records dispatched by the numpy path (ConsumeQueue.put_units/put_unit): the
        # compiled loop's kept positions are behind them, and its next units go after them.
        for i in range(5):
            assert store.put_message(Message("T", b"py-%d" % i, queue_id=i % 2)).status.ok
        cqd = store.dispatchers[0]
        compiled, cqd._k_dispatch = cqd._k_dispatch, None
        try:
            store.reput_service.do_reput()
        finally:
            cqd._k_dispatch = compiled
    got = _dispatch_after_python_changed_the_queues(tmp_path / "c", True, dispatch_by_python)
    want = _dispatch_after_python_changed_the_queues(tmp_path / "n", False, dispatch_by_python)
    assert cq_digest(tmp_path / "c") == cq_digest(tmp_path / "n")
    assert got == want
    assert got[0] == (15, [b"r0-%d" % i for i in range(0, 12, 2)] +
                      [b"py-%d" % i for i in range(0, 5, 2)] +
                      [b"r1-%d" % i for i in range(0, 12, 2)])


def test_a_slaves_dispatch_advances_physic_msg_timestamp(tmp_path, backend):
    # ConsumeQueue#putMessagePositionInfoWrapper: on a SLAVE each unit written also sets the
    # checkpoint's physicMsgTimestamp (nothing else on a slave knows a record's store time).
    from rocketstore import BrokerRole
    master = testing.open_store(tmp_path / "m", backend)
    try:
        rs = [master.put_message(Message("T", b"%d" % i)) for i in range(5)]
        raw = bytes(master.commitlog.mfq.files[0].mm[:rs[-1].commit_log_offset +
                                                       rs[-1].wrote_bytes])
    finally:
        master.shutdown()
    slave = testing.open_store(tmp_path / "s", backend,
                               testing.small_config(broker_role=BrokerRole.SLAVE))
    try:
        assert slave.commitlog.append_data(0, raw)
        testing.wait_dispatched(slave)
        assert slave.checkpoint.physic_msg_timestamp == rs[-1].store_timestamp
        assert slave.checkpoint.logics_msg_timestamp == rs[-1].store_timestamp
    finally:
        slave.shutdown()


def test_the_dispatcher_list_reput_holds_cannot_be_rebound(tmp_path):
    # Reput holds the store's list itself: a rebound attribute would leave it dispatching to
    # the old one, so rebinding is refused and editing in place reaches reput.
    store = MessageStore(tmp_path / "s")
    store.load()
    try:
        every = store.dispatchers
        with pytest.raises(AttributeError):
            store.dispatchers = []
        assert store.dispatchers is every and len(every) >= 1
    finally:
        store.shutdown()


def test_a_queue_passing_its_refill_position_stays_in_the_compiled_loop(tmp_path):
    # Half a window before a queue file's reserved end the writer asks PopulateAheadService
    # for the next window. The compiled loop writes on to the reserved end and asks when it
    # publishes: a row handed to Python there cost a publish and a reload of every queue
    # the call had loaded, for each queue passing its refill position.
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"),
                               testing.small_config(mapped_file_size_consume_queue=300_000 * 20))
    cqd = store.dispatchers[0]
    slow = []
    row = cqd._dispatch_row
    cqd._dispatch_row = lambda r, buf: slow.append(r) or row(r, buf)
    queues, per_round, rounds = 8, 300, 8
    try:
        store.reput_service.shutdown()
        first_windows = None
        for r in range(rounds):
            msgs = [Message("T", b"m%d" % i, queue_id=i % queues)
                    for i in range(per_round * queues)]
            for b in range(0, len(msgs), 400):
                assert store.put_messages(msgs[b:b + 400]).ok
            del slow[:]
            store.reput_service.do_reput()
            # Each round (300 units a queue) stays within the lead of half a window (16 KiB
            # windows, 409 units, doubling): with the service idle between rounds, the loop
            # never reaches a reserved end. The first round meets each queue once.
            assert len(slow) == (queues if r == 0 else 0)
            testing.wait_until(lambda: store.populate_service.pending == 0)
            if r == 0:
                first_windows = store.populate_service.served
        files = [store.find_consume_queue("T", q).mfq.last_file for q in range(queues)]
        # Every queue asked for windows past its first and got them reserved ahead.
        assert store.populate_service.served >= first_windows + 2 * queues
        for f in files:
            assert f.wrote_position == per_round * rounds * 20
            assert f.reserved_position > f.wrote_position
            assert f.refill_position > 16 << 10
        for q in range(queues):
            got = store.get_message("g", "T", q, per_round * rounds - 1, 1).messages
            assert [m.body for m in got] == [b"m%d" % ((per_round - 1) * queues + q)]
    finally:
        store.reput_service.start()
        store.shutdown()
