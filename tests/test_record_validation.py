# SPDX-License-Identifier: Apache-2.0
"""What a record may hold. Topic bytes name a directory under consumequeue/, so a stored topic
a put would refuse ("../../x", "/x") is a corrupt record everywhere the CommitLog is read:
open, recover, rebuild-cq, rebuild-index and verify report it, none dispatches it, and
nothing is created outside the store. On the put side: bodies are their bytes on every
backend, and the properties separators \\x01 and \\x02 are refused inside properties."""
import array
import os

import numpy as np
import pytest

from rocketstore import Message, MessageStore, repair, testing
from rocketstore.message import topic_problem
from rocketstore.dispatch import ConsumeQueueDispatcher
from rocketstore import format as F
from rocketstore.errors import CorruptRecordError, MessageIllegalError
from rocketstore.kernels import pure

GOOD = "GoodTopic"


def forge_topic(root, old, new):
    """Overwrite the first record's topic `old` with `new` (same length, so TOTALSIZE, the body
    and its CRC stay consistent); returns the record's CommitLog offset."""
    assert len(old) == len(new)
    path = os.path.join(root, "commitlog", "%020d" % 0)
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        at = data.find(bytes([len(old)]) + old.encode())
        assert at > 0
        data[at + 1:at + 1 + len(new)] = new
        f.seek(0)
        f.write(data)
    rows = np.zeros(64, dtype=F.SCAN_DTYPE)
    # The record's start: the last record that begins before the topic bytes.
    n, _, _, _ = pure.commitlog_scan(bytes(data), 0, at, False, rows)
    return int(rows["pos"][n - 1]) + int(rows["size"][n - 1]) if n else 0


def make_store(tmp_path, backend, forged):
    """A store three directories down whose 6th record gets topic bytes `forged`."""
    root = tmp_path / "a" / "b" / "store"
    victim = "T" * len(forged)
    store = testing.open_store(root, backend)
    try:
        for i in range(5):
            assert store.put_message(Message(GOOD, b"before %d" % i, keys=f"k{i}")).ok
        assert store.put_message(Message(victim, b"forged", keys="kx")).ok
        for i in range(5, 10):
            assert store.put_message(Message(GOOD, b"after %d" % i, keys=f"k{i}")).ok
        testing.wait_dispatched(store)
    finally:
        store.shutdown()
    # Its queue and the index entries go, so whatever rebuilds them must read the record.
    for d, _, names in os.walk(root / "consumequeue" / victim, topdown=False):
        for name in names:
            os.remove(os.path.join(d, name))
        os.rmdir(d)
    offset = forge_topic(root, victim, forged)
    return root, offset


def assert_nothing_outside(tmp_path, root):
    inside = str(root)
    ancestors = {str(p) for p in root.parents}
    for d, dirs, names in os.walk(tmp_path):
        for name in dirs + names:
            path = os.path.join(d, name)
            assert path.startswith(inside) or path in ancestors, f"created outside: {path}"
    assert sorted(os.listdir(root / "consumequeue")) == [GOOD]


FORGED = [b"../../../outside/X", "abs"]


def forged_bytes(tmp_path, which):
    return which if which != "abs" else str(tmp_path / "abs" / "X").encode()


@pytest.mark.parametrize("which", FORGED)
def test_abnormal_open_stops_at_a_path_topic_and_creates_nothing_outside(tmp_path, backend,
                                                                         which):
    root, offset = make_store(tmp_path, backend, forged_bytes(tmp_path, which))
    open(root / "abort", "wb").close()
    store = MessageStore(root, testing.small_config(), kernels=backend)
    store.load()
    store.start()
    try:
        report = store.recovery_report
        assert report.process_offset == offset == store.get_max_phy_offset()
        assert "topic" in report.stop_reason
        assert len(store.get_message("g", GOOD, 0, 0, 32).messages) == 5
    finally:
        store.shutdown()
    assert_nothing_outside(tmp_path, root)


@pytest.mark.parametrize("tool", ["recover", "rebuild_consume_queues", "rebuild_index"])
@pytest.mark.parametrize("which", FORGED)
def test_repair_tools_stop_at_a_path_topic_and_create_nothing_outside(tmp_path, backend, tool,
                                                                      which):
    root, offset = make_store(tmp_path, backend, forged_bytes(tmp_path, which))
    report = getattr(repair, tool)(str(root), kernels=backend)
    assert report.process_offset == offset
    assert "topic" in report.stop_reason
    assert_nothing_outside(tmp_path, root)


def test_verify_reports_a_path_topic_with_file_and_offset(tmp_path, backend):
    root, offset = make_store(tmp_path, backend, b"../../../outside/X")
    ro = MessageStore.open_read_only(root, kernels=backend)
    try:
        problems = [str(p) for p in ro.verify().problems]
    finally:
        ro.shutdown()
    assert f"commitlog: commitlog/{'%020d' % 0}@{offset}: corrupt record (topic bytes are not " \
        "a valid topic name)" in problems
    assert_nothing_outside(tmp_path, root)


def test_dispatcher_refuses_a_row_whose_topic_a_put_would_refuse(tmp_path, backend):
    """Whoever hands it rows, the ConsumeQueue dispatcher never turns bytes into a path."""
    store = testing.open_store(tmp_path / "store", backend)
    try:
        buf = bytearray(512)
        n = store.kernels.msg_encode(buf, 0, b"../escape", b"x", b"", 0, 0, 0, 0, 0, 1,
                                     bytes(8), 2, bytes(8), 0, 0)
        rows = np.zeros(1, dtype=F.SCAN_DTYPE)
        rows[0] = (0, 0, 0, 0, 2, 1, 0, n, 0, 0, 0, 0, 0, 0, 0, n - 2 - 9, 9, n, 0, 0, 0)
        dispatcher = ConsumeQueueDispatcher(
            store.find_consume_queue_raw, store.deleted_topics, store.config.delay_levels,
            store.kernels, checkpoint=store.checkpoint)
        with pytest.raises(CorruptRecordError):
            dispatcher.dispatch_array(rows, bytes(buf))
        with pytest.raises(CorruptRecordError):
            dispatcher.dispatch(rows.tolist(), bytes(buf))
    finally:
        store.shutdown()
    assert not (tmp_path / "store" / "escape").exists()
    assert store.consume_queue_table == {}


@pytest.mark.parametrize("topic", ["", ".", "..", "a/b", "../x", "a\0b", "\ud800", "é" * 64])
def test_put_and_topic_config_refuse_a_topic_outside_the_rule(tmp_path, backend, topic):
    assert topic_problem(topic) is not None
    store = testing.open_store(tmp_path / "store", backend)
    try:
        with pytest.raises(MessageIllegalError):
            store.put_message(Message(topic, b"x"))
        with pytest.raises(ValueError):
            store.update_topic_config(topic)
        assert store.get_max_phy_offset() == 0
    finally:
        store.shutdown()


def test_topic_config_refuses_a_topic_longer_than_a_put_accepts(tmp_path, backend):
    store = testing.open_store(tmp_path / "store", backend)
    try:
        with pytest.raises(MessageIllegalError):
            store.put_message(Message("x" * 128, b"x"))
        with pytest.raises(ValueError):
            store.update_topic_config("x" * 128)
        assert store.topic_config("x" * 128) is None
        store.update_topic_config("x" * 127)
    finally:
        store.shutdown()


# ---- bodies and properties -------------------------------------------------------------------
BODIES = {
    "array-i": lambda: array.array("i", range(40)),
    "numpy-int64": lambda: np.arange(30, dtype=np.int64),
    "numpy-2d": lambda: np.arange(24, dtype=np.uint16).reshape(4, 6),
    "numpy-strided": lambda: np.arange(64, dtype=np.uint8)[::2],
    "bytearray": lambda: bytearray(b"plain bytes"),
    "memoryview": lambda: memoryview(b"view of bytes"),
}


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_any_buffer_body_is_stored_as_its_bytes_and_later_puts_survive(tmp_path, backend, kind):
    root = tmp_path / "store"
    body = BODIES[kind]()
    raw = np.asarray(body).tobytes() if not isinstance(body, (bytearray, memoryview)) \
        else bytes(body)
    store = testing.open_store(root, backend)
    try:
        assert store.put_message(Message("Bodies", body)).ok
        for i in range(20):
            assert store.put_message(Message("Bodies", b"next %d" % i)).ok
        testing.wait_dispatched(store)
    finally:
        store.shutdown()
    open(root / "abort", "wb").close()            # abnormal recovery checks every record
    store = MessageStore(root, testing.small_config(), kernels=backend)
    store.load()
    store.start()
    try:
        assert store.recovery_report.truncated_bytes == 0
        got = store.get_message("g", "Bodies", 0, 0, 32).messages
        assert len(got) == 21
        assert bytes(got[0].body) == raw
    finally:
        store.shutdown()


@pytest.mark.parametrize("body", ["text", 12, [1, 2]])
def test_a_body_that_is_not_a_buffer_is_refused(store_root_backend, body):
    store = store_root_backend
    with pytest.raises(MessageIllegalError):
        store.put_message(Message("Bodies", body))
    assert store.get_max_phy_offset() == 0


class _Index:
    """An int-like object that is not an int: struct would take it through __index__."""

    def __index__(self):
        return 2


INT_FIELDS = ["flag", "sys_flag", "born_timestamp", "reconsume_times",
              "prepared_transaction_offset"]


@pytest.mark.parametrize("value", [2.7, "2", _Index()], ids=["float", "str", "index"])
@pytest.mark.parametrize("field", INT_FIELDS)
def test_an_int_field_that_is_not_an_int_is_refused_alike_by_every_backend(
        store_root_backend, field, value):
    # cext's compiled put truncated a float (2.7 stored as 2) and the pure backend took an
    # __index__ object where cffi refused both: one contract, whatever the backend.
    store = store_root_backend
    bad = Message("Ints", b"x")
    setattr(bad, field, value)
    with pytest.raises(MessageIllegalError, match=f"{field} must be an int"):
        store.put_message(bad)
    with pytest.raises(MessageIllegalError, match=f"{field} must be an int"):
        store.put_messages([Message("Ints", b"ok"), bad])
    assert store.get_max_phy_offset() == 0


@pytest.fixture
def store_root_backend(tmp_path, backend):
    s = testing.open_store(tmp_path / "store", backend)
    yield s
    s.shutdown()


SEPARATORS = [
    dict(tags="Tag\x01A"),
    dict(keys="k1\x02UNIQ_KEY\x01forged"),
    dict(keys=["a", "b\x01c"]),
    dict(properties={"a\x02UNIQ_KEY": "x"}),
    dict(properties={"name": "v\x02UNIQ_KEY\x01forged"}),
    dict(properties={"na\x01me": "v"}),
]


@pytest.mark.parametrize("fields", SEPARATORS)
def test_property_separators_inside_properties_are_refused(store_root_backend, fields):
    store = store_root_backend
    with pytest.raises(MessageIllegalError):
        store.put_message(Message("Props", b"x", **fields))
    with pytest.raises(MessageIllegalError):
        store.put_messages([Message("Props", b"ok"), Message("Props", b"x", **fields)])
    assert store.get_max_phy_offset() == 0
    assert store.query_message_by_unique_key("Props", "forged") is None


def test_property_separators_in_batch_properties_are_refused(store_root_backend):
    store = store_root_backend
    with pytest.raises(MessageIllegalError):
        store.put_messages([Message("Props", b"x")],
                           batch_properties={"b": "1\x02UNIQ_KEY\x01forged"})
    assert store.get_max_phy_offset() == 0


@pytest.mark.parametrize("topic", ["JTopic_\u00fc_\u4e2d", "a b", "abc\n", "...", "x" * 127,
                                   "\U0001f600" * 31])
def test_a_topic_a_java_store_takes_is_put_dispatched_and_read_back(tmp_path, backend, topic):
    # DefaultMessageStore#checkMessage bounds only the length; a broker's send path alone
    # holds topics to ^[%|a-zA-Z0-9_-]+$, so stores a Java program wrote hold such topics.
    root = tmp_path / "store"
    store = testing.open_store(root, backend)
    try:
        r = store.put_message(Message(topic, b"x", tags="T"))
        assert r.ok
        store.update_topic_config(topic)
        got = store.get_message("g", topic, 0, 0)
        assert [m.topic for m in got.messages] == [topic]
    finally:
        store.shutdown()
    assert (root / "consumequeue" / topic / "0").is_dir()
    again = testing.open_store(root, backend)
    try:
        assert again.get_max_offset_in_queue(topic, 0) == 1
        assert again.recovery_report.normal
    finally:
        again.shutdown()
