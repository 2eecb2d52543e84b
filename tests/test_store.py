# SPDX-License-Identifier: Apache-2.0
"""MessageStore behaviour: put/get paths, the broker's put-time rules, bad input, locking."""
import multiprocessing
import os

import numpy as np
import pytest

from rocketstore import (GetMessageStatus as G, Message, MessageIllegalError, MessageStore,
                         PutMessageStatus, StoreLockedError, testing)
from rocketstore import format as F
from rocketstore.fs import FileSystem
from rocketstore.message import properties_to_string, string_to_properties


@pytest.fixture
def store(tmp_path, backend):
    s = testing.open_store(tmp_path / "store", backend)
    yield s
    s.shutdown()


def test_put_then_get_returns_the_message_with_every_field(store):
    r = store.put_message(Message("TopicA", b"body", tags="TagA", keys="k1 k2", queue_id=1,
                                  flag=7, properties={"a": "b"}, born_timestamp=1700000000000,
                                  born_host=("127.0.0.1", 52345)))
    assert r.status is PutMessageStatus.PUT_OK
    assert (r.commit_log_offset, r.queue_offset) == (0, 0)
    assert r.msg_id == "7F00000100002A9F0000000000000000"
    testing.wait_dispatched(store)
    g = store.get_message("g", "TopicA", 1, 0, 32)
    assert g.status is G.FOUND and (g.next_begin_offset, g.min_offset, g.max_offset) == (1, 0, 1)
    m = g.messages[0]
    assert (m.topic, m.queue_id, m.flag, m.body, m.tags, m.keys) == \
        ("TopicA", 1, 7, b"body", "TagA", "k1 k2")
    assert m.properties == {"a": "b", "KEYS": "k1 k2", "TAGS": "TagA"}
    assert m.born_host == ("127.0.0.1", 52345) and m.store_host == ("127.0.0.1", 10911)
    assert m.store_timestamp == r.store_timestamp and m.msg_id == r.msg_id
    assert store.consume_queue("TopicA", 1).units(0, 1)[0]["tags_code"] == 2598919


def test_queue_offsets_count_per_topic_and_queue(store):
    offs = [store.put_message(Message(t, b"x", queue_id=q)).queue_offset
            for t, q in [("A", 0), ("A", 1), ("A", 0), ("B", 0), ("A", 0)]]
    assert offs == [0, 0, 1, 0, 2]


def test_put_messages_assigns_offsets_like_single_puts(store, tmp_path, backend):
    msgs = [Message(f"T{i % 3}", b"m%d" % i, queue_id=i % 2) for i in range(3000)]
    rs = store.put_messages(msgs)
    assert rs.status is PutMessageStatus.PUT_OK and rs.count == 3000
    assert isinstance(rs.commit_log_offsets, np.ndarray)
    assert np.all(np.diff(rs.commit_log_offsets) > 0)
    testing.wait_dispatched(store)
    for i in (0, 1, 2, 1500, 2999):
        m = store.look_message_by_offset(int(rs.commit_log_offsets[i]))
        assert m.body == b"m%d" % i and m.queue_offset == rs.queue_offsets[i]
    assert store.get_max_offset_in_queue("T0", 0) == 500
    assert rs.msg_ids[0] == store.look_message_by_offset(int(rs.commit_log_offsets[0])).msg_id


def test_a_batch_shares_one_store_timestamp(store):
    rs = store.put_messages([Message("T", b"a"), Message("U", b"b", queue_id=3)])
    stamps = {store.look_message_by_offset(int(o)).store_timestamp
              for o in rs.commit_log_offsets}
    assert stamps == {rs.store_timestamp}


def test_full_file_ends_with_blank_record_and_next_file_starts_at_its_name(store):
    size = store.config.mapped_file_size_commit_log
    body = b"z" * 1000
    results = [store.put_message(Message("Roll", body)) for _ in range(70)]
    second = [r for r in results if r.commit_log_offset >= size][0]
    assert second.commit_log_offset == size
    prev = [r for r in results if r.commit_log_offset < size][-1]
    end = prev.commit_log_offset + prev.wrote_bytes
    blank = store.commitlog.mfq.files[0].mm[end:end + 8]
    assert blank == \
        (size - end).to_bytes(4, "big") + (F.BLANK_MAGIC_CODE & 0xFFFFFFFF).to_bytes(4, "big")
    names = sorted(os.listdir(os.path.join(store.root, "commitlog")))
    assert names[:2] == ["%020d" % 0, "%020d" % size]
    testing.wait_dispatched(store)
    offsets, next_offset = [], 0
    while next_offset < 70:                 # 32 per call at most (maxTransferCount)
        got = store.get_message("g", "Roll", 0, next_offset, 70)
        assert got.status is G.FOUND and got.messages
        offsets += [m.commit_log_offset for m in got.messages]
        next_offset = got.next_begin_offset
    assert offsets == [r.commit_log_offset for r in results]


def test_get_message_statuses_follow_rocketmq(store):
    assert store.get_message("g", "Nope", 0, 0).status is G.NO_MESSAGE_IN_QUEUE
    for i in range(3):
        store.put_message(Message("S", b"%d" % i))
    testing.wait_dispatched(store)
    r = store.get_message("g", "S", 0, 3)
    assert r.status is G.OFFSET_OVERFLOW_ONE and r.next_begin_offset == 3
    r = store.get_message("g", "S", 0, 9)
    assert r.status is G.OFFSET_OVERFLOW_BADLY and r.next_begin_offset == 3
    r = store.get_message("g", "S", 0, 1, 1)
    assert r.status is G.FOUND and r.next_begin_offset == 2 and r.messages[0].body == b"1"
    r = store.get_message("g", "S", 0, 0, 32, message_filter=lambda tags: False)
    assert r.status is G.NO_MATCHED_MESSAGE and r.next_begin_offset == 3


def test_delay_level_moves_message_to_schedule_topic(store):
    r = store.put_message(Message("Real", b"d", queue_id=2, properties={"DELAY": "99"}))
    testing.wait_dispatched(store)
    m = store.look_message_by_offset(r.commit_log_offset)
    assert (m.topic, m.queue_id) == (F.SCHEDULE_TOPIC, 17)
    assert m.properties == {"DELAY": "18", "REAL_TOPIC": "Real", "REAL_QID": "2"}
    unit = store.consume_queue(F.SCHEDULE_TOPIC, 17).units(0, 1)[0]
    assert unit["tags_code"] == m.store_timestamp + 7_200_000


def test_prepared_transaction_is_stored_but_not_dispatched(store):
    p = store.put_message(Message("Tx", b"half", sys_flag=F.TRANSACTION_PREPARED_TYPE))
    c = store.put_message(Message("Tx", b"commit", sys_flag=F.TRANSACTION_COMMIT_TYPE))
    assert p.queue_offset == 0 and c.queue_offset == 0
    testing.wait_dispatched(store)
    assert store.get_max_offset_in_queue("Tx", 0) == 1
    assert store.get_message("g", "Tx", 0, 0).messages[0].body == b"commit"


def test_empty_property_value_is_written_but_not_read_back(store):
    r = store.put_message(Message("E", b"", properties={"TAGS": "", "k": "v"}))
    m = store.look_message_by_offset(r.commit_log_offset)
    assert "TAGS\x01" in m.properties_string and m.properties == {"k": "v"}
    testing.wait_dispatched(store)
    assert store.consume_queue("E", 0).units(0, 1)[0]["tags_code"] == 0


def test_ipv6_hosts_set_the_sysflag_bits(store):
    r = store.put_message(Message("V6", b"six", born_host=("::1", 7),
                                  store_host=("fe80::1", 10911)))
    m = store.look_message_by_offset(r.commit_log_offset)
    assert m.sys_flag == F.BORNHOST_V6_FLAG | F.STOREHOSTADDRESS_V6_FLAG
    assert m.born_host == ("::1", 7) and len(r.msg_id) == 56


def test_properties_follow_java_hashmap_iteration_order():
    assert properties_to_string({"KEYS": "k", "TAGS": "t"}) == "KEYS\x01k\x02TAGS\x01t"
    assert properties_to_string({"TAGS": "t", "KEYS": "k"}) == "KEYS\x01k\x02TAGS\x01t"
    many = {f"p{i}": str(i) for i in range(30)}          # forces 32 then 64 buckets
    assert string_to_properties(properties_to_string(many)) == many


@pytest.mark.parametrize("msg, status", [
    (Message("bad/topic", b""), "MESSAGE_ILLEGAL"),
    (Message("../escape", b""), "MESSAGE_ILLEGAL"),
    (Message("T" * 128, b""), "MESSAGE_ILLEGAL"),
    (Message("T", b"x" * (4 * 1024 * 1024 + 1)), "MESSAGE_ILLEGAL"),
    (Message("T", b"", properties={"big": "v" * 40000}), "PROPERTIES_SIZE_EXCEEDED"),
    (Message("T", b"", queue_id=-1), "MESSAGE_ILLEGAL"),
    # Properties are a Java HashMap<String, String>: a name that is not a str raised
    # AttributeError, and str() of a value stored b'x' for bytes.
    (Message("T", b"", properties={7: "v"}), "MESSAGE_ILLEGAL"),
    (Message("T", b"", properties={None: "v"}), "MESSAGE_ILLEGAL"),
    (Message("T", b"", properties={"k": b"v"}), "MESSAGE_ILLEGAL"),
    (Message("T", b"", properties={"k": 7}), "MESSAGE_ILLEGAL"),
    (Message("T", b"", tags=5), "MESSAGE_ILLEGAL"),
])
def test_bad_input_raises_with_the_rocketmq_status_and_stores_nothing(store, msg, status):
    store.put_message(Message("Keep", b"kept"))
    before = store.get_max_phy_offset()
    with pytest.raises(MessageIllegalError) as exc:
        store.put_message(msg)
    assert exc.value.status == status
    with pytest.raises(MessageIllegalError):
        store.put_messages([Message("Fine", b"ok"), msg])
    assert store.get_max_phy_offset() == before
    assert store.look_message_by_offset(0).body == b"kept"


def test_second_store_in_this_process_gets_store_locked_error(store, backend):
    with pytest.raises(StoreLockedError):
        MessageStore(store.root, store.config, kernels=backend).load()
    assert store.put_message(Message("StillOpen", b"x")).ok


def _try_open(root, conn):
    try:
        MessageStore(root, testing.small_config(), kernels="pure").load()
        conn.send("opened")
    except StoreLockedError:
        conn.send("locked")


def test_second_process_gets_store_locked_error(store):
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_try_open, args=(store.root, child))
    p.start()
    p.join(60)
    assert parent.recv() == "locked"


def _other_process_opens(root):
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_try_open, args=(root, child))
    p.start()
    p.join(60)
    return parent.recv()


def test_a_refused_second_open_in_this_process_keeps_the_lock_against_other_processes(store,
                                                                                       backend):
    # The lock is a POSIX record lock, which closing any descriptor of the file in this
    # process drops: the refused open closed its own, and a second process could then open
    # the store as a second writer.
    with pytest.raises(StoreLockedError):
        MessageStore(store.root, store.config, kernels=backend).load()
    assert _other_process_opens(store.root) == "locked"


def test_verifying_the_store_read_only_in_its_writers_process_keeps_the_lock(store, backend):
    # verify asks who holds the lock (F_GETLK) on a descriptor of its own, and closed it.
    store.put_message(Message("Verified", b"x"))
    reader = MessageStore.open_read_only(store.root, store.config, kernels=backend)
    try:
        problems = reader.verify().problems
    finally:
        reader.shutdown()
    # The running store's abort file is no sign of a crash: it is in use.
    assert not [p for p in problems if p.kind == "abort"]
    assert _other_process_opens(store.root) == "locked"


def test_reopen_recovers_offsets_and_keeps_appending(tmp_path, backend):
    root = tmp_path / "s"
    s = testing.open_store(root, backend)
    results = [s.put_message(Message("R", b"%d" % i, queue_id=i % 2)) for i in range(500)]
    s.shutdown()
    assert not os.path.exists(root / "abort")
    with open(root / "lock", "rb") as f:
        assert f.read() == b"lock"
    s = testing.open_store(root, backend)
    try:
        assert s.recovery_report.normal
        assert s.get_max_phy_offset() == results[-1].commit_log_offset + results[-1].wrote_bytes
        assert s.get_max_offset_in_queue("R", 0) == 250
        r = s.put_message(Message("R", b"next", queue_id=0))
        assert r.queue_offset == 250
        testing.wait_dispatched(s)
        assert s.get_message("g", "R", 0, 250).messages[0].body == b"next"
    finally:
        s.shutdown()


def test_store_left_running_recovers_and_redispatches(tmp_path, backend):
    """An abort file forces abnormal recovery, which rebuilds lost ConsumeQueue units."""
    root = tmp_path / "s"
    s = testing.open_store(root, backend)
    for i in range(300):
        s.put_message(Message("A", b"%d" % i))
    s.shutdown()
    cq_dir = root / "consumequeue" / "A" / "0"
    for name in os.listdir(cq_dir):
        os.remove(cq_dir / name)
    (root / "abort").write_bytes(b"")
    s = testing.open_store(root, backend)
    try:
        assert not s.recovery_report.normal
        testing.wait_dispatched(s)
        assert s.get_max_offset_in_queue("A", 0) == 300
    finally:
        s.shutdown()


def test_corrupt_tail_is_truncated_on_open(tmp_path, backend):
    root = tmp_path / "s"
    s = testing.open_store(root, backend)
    rs = [s.put_message(Message("C", b"%05d" % i)) for i in range(100)]
    s.shutdown()
    path = root / "commitlog" / ("%020d" % 0)
    with open(path, "r+b") as f:        # flip a byte in the body of the last record
        f.seek(rs[-1].commit_log_offset + 90)
        f.write(b"\xff")
    s = testing.open_store(root, backend)
    try:
        assert s.recovery_report.stop_reason == "corrupt"
        assert s.get_max_phy_offset() == rs[-1].commit_log_offset
        assert s.get_max_offset_in_queue("C", 0) == 99
    finally:
        s.shutdown()


@pytest.mark.parametrize("count", [100, 4096, 4097])
@pytest.mark.parametrize("abort", [False, True], ids=["normal", "abnormal"])
@pytest.mark.parametrize("role", ["ASYNC_MASTER", "SLAVE"])
def test_a_last_record_ending_in_zeros_is_torn_on_a_slave_or_after_a_crash_and_kept_otherwise(
        tmp_path, backend, count, abort, role):
    """A write cut short (an HA slave holding part of a frame, a power cut on a master) leaves
    zeros where the last record's properties end, with lengths and body CRC intact: on a slave,
    and on a master after a crash, recovery stops before it. After a master's clean shutdown
    every record was whole, so the same bytes are a property value ending in U+0000 and kept.
    4096 records: the torn one is the last row of a full scan batch; 4097: the first of the
    next."""
    root = tmp_path / "s"
    s = testing.open_store(root, backend, config=testing.small_config(
        mapped_file_size_commit_log=1 << 20))
    rs = [s.put_message(Message("T", b"%05d" % i, keys=f"k{i}")) for i in range(count)]
    s.shutdown()
    last = rs[-1]
    with open(root / "commitlog" / ("%020d" % 0), "r+b") as f:
        f.seek(last.commit_log_offset + last.wrote_bytes - 3)
        f.write(bytes(3))
    if abort:
        (root / "abort").write_bytes(b"")
    s = testing.open_store(root, backend, config=testing.small_config(
        mapped_file_size_commit_log=1 << 20, broker_role=role))
    torn = abort or role == "SLAVE"
    try:
        assert s.recovery_report.normal is not abort
        assert s.recovery_report.stop_reason.startswith("torn record") is torn, \
            s.recovery_report
        end = last.commit_log_offset + (0 if torn else last.wrote_bytes)
        assert s.get_max_phy_offset() == end
        testing.wait_dispatched(s)
        assert s.get_max_offset_in_queue("T", 0) == count - (1 if torn else 0)
        r = s.get_message("g", "T", 0, count - 2, 32)
        assert [m.body for m in r.messages] == [b"%05d" % i for i in
                                                range(count - 2, count - (1 if torn else 0))]
    finally:
        s.shutdown()


def test_wrong_file_size_config_refuses_to_load_and_touches_nothing(tmp_path, backend):
    root = tmp_path / "s"
    s = testing.open_store(root, backend)
    s.put_message(Message("W", b"w"))
    s.shutdown()
    from rocketstore import StoreLoadError
    with pytest.raises(StoreLoadError):
        MessageStore(root, testing.small_config(mapped_file_size_commit_log=128 * 1024),
                     kernels=backend).load()
    s = testing.open_store(root, backend)
    try:
        assert s.look_message_by_offset(0).body == b"w"
    finally:
        s.shutdown()


def test_broker_batch_appends_its_properties_to_every_item(store):
    items = [Message("Batch", b"a", keys="k1", queue_id=1),
             Message("Batch", b"b", queue_id=1)]
    rs = store.put_messages(items, batch_properties={"WAIT": "true", "TAGS": "T"})
    first = store.look_message_by_offset(int(rs.commit_log_offsets[0]))
    second = store.look_message_by_offset(int(rs.commit_log_offsets[1]))
    batch = properties_to_string({"WAIT": "true", "TAGS": "T"})
    assert first.properties_string == "KEYS\x01k1\x02" + batch
    assert second.properties_string == batch
    assert first.store_timestamp == second.store_timestamp


def test_a_broker_batch_that_does_not_fit_goes_whole_to_the_next_file(tmp_path, backend):
    # 4.9.x's doAppend of a MessageExtBatch: the blank record where the batch would start,
    # and the whole batch at the start of the next file (a plain list rolls per record).
    size = 4096
    store = testing.open_store(tmp_path / "s", backend,
                               testing.small_config(mapped_file_size_commit_log=size))
    try:
        head = store.put_message(Message("Batch", b"h" * 3300))
        end = head.commit_log_offset + head.wrote_bytes
        items = [Message("Batch", b"%d" % i * 150) for i in range(6)]
        rs = store.put_messages(items, batch_properties={"TAGS": "T"})
        assert rs.status is PutMessageStatus.PUT_OK and rs.count == 6
        assert end + int(rs.sizes[:2].sum()) + 8 <= size      # the head of it would fit
        assert list(rs.commit_log_offsets) == list(size + np.concatenate(
            ([0], np.cumsum(rs.sizes[:-1]))))
        assert list(rs.queue_offsets) == list(range(1, 7))
        blank = store.commitlog.mfq.files[0].mm[end:end + 8]
        assert blank == (size - end).to_bytes(4, "big") + \
            (F.BLANK_MAGIC_CODE & 0xFFFFFFFF).to_bytes(4, "big")
        testing.wait_dispatched(store)
        got = store.get_message("g", "Batch", 0, 1)
        assert [m.body for m in got.messages] == [m.body for m in items]
        with pytest.raises(MessageIllegalError, match="does not fit a CommitLog file"):
            store.put_messages([Message("Batch", b"x" * 1500) for _ in range(3)],
                               batch_properties={})
        assert store.get_max_offset_in_queue("Batch", 0) == 7
    finally:
        store.shutdown()


@pytest.mark.parametrize("items, props", [
    ([Message("A", b""), Message("B", b"")], {}),
    ([Message("A", b"", sys_flag=F.TRANSACTION_PREPARED_TYPE)], {}),
    ([Message("A", b"")], {"DELAY": "2"}),
])
def test_a_broker_batch_breaking_its_rules_is_refused(store, items, props):
    with pytest.raises(MessageIllegalError):
        store.put_messages(items, batch_properties=props)
    assert store.get_max_phy_offset() == 0


def test_asking_who_holds_the_lock_in_the_writers_process_opens_no_descriptor(store):
    # The answer comes from this process's own record: a monitoring loop calling it must not
    # leave a descriptor behind per call (one kept open until unlock would be a leak).
    path = os.path.join(store.root, "lock")

    def open_on_lock():
        if not os.path.isdir("/proc/self/fd"):
            return None
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")) == \
                    os.path.realpath(path)
            except OSError:
                pass
        return n
    before = open_on_lock()
    for _ in range(20):
        assert store.fs.lock_holder(path) == (True, os.getpid())
    assert open_on_lock() == before


def test_a_read_only_open_that_fails_in_recovery_writes_nothing_into_the_store(tmp_path,
                                                                               backend):
    # A read-only open of a store whose writer's cleaning deletes a ConsumeQueue file while
    # recovery reads it fails; the store was shut down cleanly, and an open that writes
    # nothing must not leave it an abort file (its writer's next open would recover it as
    # if killed).
    root = tmp_path / "s"
    s = testing.open_store(root, backend)
    for i in range(10):
        assert s.put_message(Message("R", b"%d" % i)).status.ok
    s.shutdown()
    assert not os.path.exists(root / "abort")

    class Deleted(FileSystem):
        def data_end(self, path):
            if os.sep + "consumequeue" + os.sep in path:
                raise FileNotFoundError(2, "No such file or directory", path)
            return super().data_end(path)

    with pytest.raises(OSError):
        MessageStore.open_read_only(root, s.config, kernels=backend, fs=Deleted())
    assert not os.path.exists(root / "abort")
