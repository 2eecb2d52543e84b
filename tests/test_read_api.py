# SPDX-License-Identifier: Apache-2.0
"""The public read and write API's promises: read-your-writes, get_message returning what it
is asked for, and a clear exception for every bad argument or closed store."""
import threading

import numpy as np
import pytest

from rocketstore import (ConfigError, GetMessageStatus as G, InvalidArgumentError, Message,
                         MessageIllegalError, MessageStore, StoreClosedError, testing)
from rocketstore import read_path
from rocketstore.format import SCHEDULE_TOPIC


@pytest.fixture
def store(tmp_path, backend):
    s = testing.open_store(tmp_path / "store", backend)
    yield s
    s.shutdown()


def park(service):
    """Keep a service thread from running its body again; returns the event that frees it."""
    go, parked = threading.Event(), threading.Event()

    def wait_for_running(interval_ms):
        parked.set()
        go.wait()
    service.wait_for_running = wait_for_running
    service.wakeup()
    parked.wait()
    return go


def test_a_put_is_visible_to_every_read_as_soon_as_it_returns(store):
    go = park(store.reput_service)
    try:
        r = store.put_message(Message("RYW", b"mine", keys="k-1"))
        assert store.get_max_offset_in_queue("RYW", 0) == 1
        g = store.get_message("g", "RYW", 0, r.queue_offset)
        assert g.status is G.FOUND and [m.body for m in g.messages] == [b"mine"]
        store.put_message(Message("RYW", b"second", keys="k-2"))
        assert [m.body for m in store.query_message("RYW", "k-2").messages] == [b"second"]
        assert store.query_message_by_unique_key("RYW", "nothing") is None
    finally:
        go.set()


def test_readers_catching_up_beside_the_reput_thread_dispatch_each_record_once(store):
    errors = []

    def produce_and_read(q):
        try:
            for i in range(150):
                r = store.put_message(Message("Race", b"%d-%d" % (q, i), queue_id=q))
                g = store.get_message("g", "Race", q, r.queue_offset, 1)
                assert g.messages[0].body == b"%d-%d" % (q, i)
        except AssertionError as exc:
            errors.append(exc)
    threads = [threading.Thread(target=produce_and_read, args=(q,)) for q in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for q in range(4):
        cq = store.consume_queue("Race", q)
        assert cq.max_offset_in_queue == 150
        offsets = np.concatenate([cq.units(i, 50)["offset"] for i in (0, 50, 100)])
        assert np.all(np.diff(offsets) > 0)


def test_get_message_returns_as_many_messages_as_asked_across_consume_queue_files(store):
    # 1000 bodies of 1 KiB: past the broker's 32-message and 256 KiB pull caps, and across
    # ten 100-unit ConsumeQueue files.
    store.put_messages([Message("Many", b"%04d" % i + b"x" * 1020) for i in range(1100)])
    g = store.get_message("g", "Many", 0, 0, 1000)
    assert g.status is G.FOUND and g.next_begin_offset == 1000
    assert [m.queue_offset for m in g.messages] == list(range(1000))
    assert g.messages[999].body[:4] == b"0999"
    g = store.get_message("g", "Many", 0, 1000, 1000)
    assert [m.queue_offset for m in g.messages] == list(range(1000, 1100))
    assert g.next_begin_offset == 1100


def test_get_message_stops_at_its_byte_bound_but_always_returns_one_message(store,
                                                                            monkeypatch):
    rs = store.put_messages([Message("Big", b"x" * 1000) for _ in range(20)])
    size = int(rs.sizes[0])
    monkeypatch.setattr(read_path, "MAX_BYTES", 10 * size)
    assert len(store.get_message("g", "Big", 0, 0, 1000).messages) == 10
    monkeypatch.setattr(read_path, "MAX_BYTES", 1)
    assert len(store.get_message("g", "Big", 0, 0, 1000).messages) == 1


def test_get_message_with_a_filter_still_stops_at_the_brokers_scan_bound(store):
    store.put_messages([Message("Filt", b"x", tags="A" if i % 2 else "B") for i in range(1000)])
    g = store.get_message("g", "Filt", 0, 0, 1, message_filter=lambda tags: False)
    assert g.status is G.NO_MATCHED_MESSAGE and g.next_begin_offset == 800


@pytest.mark.parametrize("n", [0, -1, read_path.MAX_MSG_NUMS + 1])
def test_max_msg_nums_outside_its_documented_bound_is_refused(store, n):
    store.put_message(Message("T", b"x"))
    with pytest.raises(InvalidArgumentError, match="max_msg_nums"):
        store.get_message("g", "T", 0, 0, n)


# ---- bad arguments --------------------------------------------------------------------------

BAD_CALLS = [
    ("put_message(None)", lambda s: s.put_message(None), TypeError, "Message is required"),
    ("put_message(str)", lambda s: s.put_message("T"), TypeError, "not str"),
    ("put_messages(None)", lambda s: s.put_messages(None), TypeError, "iterable of Message"),
    ("put_messages([None])", lambda s: s.put_messages([Message("T", b"ok"), None]), TypeError,
     "message 1: a Message is required"),
    ("put_messages(batch_properties=[])", lambda s: s.put_messages([], batch_properties=[]),
     TypeError, "batch_properties"),
    ("body str", lambda s: s.put_message(Message("T", "text")), MessageIllegalError,
     "message body must be bytes or a buffer, not str"),
    ("flag None", lambda s: s.put_message(Message("T", b"x", flag=None)), MessageIllegalError,
     "flag must be an int"),
    ("flag too big", lambda s: s.put_message(Message("T", b"x", flag=1 << 40)),
     MessageIllegalError, "flag is 1099511627776"),
    ("born_timestamp None", lambda s: s.put_message(Message("T", b"x", born_timestamp=None)),
     MessageIllegalError, "born_timestamp must be an int"),
    ("born_host str", lambda s: s.put_message(Message("T", b"x", born_host="h")),
     MessageIllegalError, "born_host must be a (host str, port int) tuple"),
    ("store_host str", lambda s: s.put_message(Message("T", b"x", store_host="h")),
     MessageIllegalError, "store_host"),
    ("sys_flag None", lambda s: s.put_message(Message("T", b"x", sys_flag=None)),
     MessageIllegalError, "sys_flag"),
    ("topic None", lambda s: s.put_message(Message(None, b"x")), MessageIllegalError,
     "topic None"),
    ("topic path", lambda s: s.put_message(Message("T/x", b"x")), MessageIllegalError,
     "would name a path"),
    ("update topic path", lambda s: s.update_topic_config("T/x"), ConfigError,
     "would name a path"),
    ("get topic dotdot", lambda s: s.get_message("g", "..", 0, 0), InvalidArgumentError,
     "names no directory"),
    ("get topic None", lambda s: s.get_message("g", None, 0, 0), TypeError,
     "topic must be a str, not NoneType"),
    ("get topic path", lambda s: s.get_message("g", "../x", 0, 0), InvalidArgumentError,
     "would name a path"),
    ("get group None", lambda s: s.get_message(None, "T", 0, 0), TypeError, "group"),
    ("get queue_id str", lambda s: s.get_message("g", "T", "0", 0), TypeError, "queue_id"),
    ("get queue_id -1", lambda s: s.get_message("g", "T", -1, 0), InvalidArgumentError,
     "queue_id is -1"),
    ("get offset None", lambda s: s.get_message("g", "T", 0, None), TypeError, "offset"),
    ("get offset float", lambda s: s.get_message("g", "T", 0, 1.5), TypeError, "offset"),
    ("get filter", lambda s: s.get_message("g", "T", 0, 0, 32, "A"), TypeError,
     "message_filter"),
    ("min offset", lambda s: s.get_min_offset_in_queue(None, 0), TypeError, "topic"),
    ("max offset", lambda s: s.get_max_offset_in_queue("T", None), TypeError, "queue_id"),
    ("consume_queue", lambda s: s.consume_queue("../../etc", 0), InvalidArgumentError,
     "topic"),
    ("query key None", lambda s: s.query_message("T", None), TypeError,
     "key must be a str, not NoneType"),
    ("query topic None", lambda s: s.query_message(None, "k"), TypeError, "topic"),
    ("query max_num 0", lambda s: s.query_message("T", "k", 0), InvalidArgumentError,
     "max_num"),
    ("query end str", lambda s: s.query_message("T", "k", 32, 0, "now"), TypeError, "end"),
    ("unique key None", lambda s: s.query_message_by_unique_key("T", None), TypeError,
     "uniq_key"),
    ("view id None", lambda s: s.view_message_by_id(None), TypeError, "msg_id"),
    ("view id not hex", lambda s: s.view_message_by_id("zz"), InvalidArgumentError,
     "is not an offset msgId"),
    ("look offset None", lambda s: s.look_message_by_offset(None), TypeError, "phy_offset"),
    ("by time None", lambda s: s.get_offset_in_queue_by_time("T", 0, None), TypeError,
     "timestamp"),
    ("iter from str", lambda s: s.iter_messages("0"), TypeError, "from_offset"),
    ("commit offset None", lambda s: s.commit_offset("g", "T", 0, None), TypeError, "offset"),
    ("commit group None", lambda s: s.commit_offset(None, "T", 0, 1), TypeError, "group"),
    ("query_offset topic", lambda s: s.query_offset("g", None, 0), TypeError, "topic"),
    ("topic_config None", lambda s: s.topic_config(None), TypeError, "topic"),
    ("update topic nums", lambda s: s.update_topic_config("T", write_queue_nums="8"),
     TypeError, "write_queue_nums"),
    ("subscription None", lambda s: s.subscription_group(None), TypeError, "group"),
    ("update group None", lambda s: s.update_subscription_group(None), TypeError, "group"),
    ("clean now str", lambda s: s.clean_files_periodically("now"), TypeError, "now_ms"),
    ("clean plan str", lambda s: s.clean_plan("now"), TypeError, "now_ms"),
    ("ha address", lambda s: s.update_ha_master_address(10912), TypeError, "addr"),
    ("query end past a long", lambda s: s.query_message("T", "k", 32, 0, 1 << 70),
     InvalidArgumentError, "end is 1180591620717411303424"),
    ("query begin past a long", lambda s: s.query_message("T", "k", 32, -(1 << 70)),
     InvalidArgumentError, "begin is"),
    ("clean now past a long", lambda s: s.clean_files_periodically(1 << 70),
     InvalidArgumentError, "now_ms is"),
    ("clean plan now past a long", lambda s: s.clean_plan(1 << 70), InvalidArgumentError,
     "now_ms is"),
    ("find queue path", lambda s: s.find_consume_queue("../x", 0), InvalidArgumentError,
     "would name a path"),
    # The dispatchers' lookup by a record's topic bytes is public too: a queue it makes
    # names a directory.
    ("raw topic path", lambda s: s.find_consume_queue_raw(b"../x", 0), InvalidArgumentError,
     "would name a path"),
    ("raw topic int", lambda s: s.find_consume_queue_raw(3, 0), TypeError,
     "topic_bytes must be bytes, not int"),
    ("raw topic not UTF-8", lambda s: s.find_consume_queue_raw(b"\xff", 0),
     InvalidArgumentError, "are not UTF-8"),
    ("raw queue_id -1", lambda s: s.find_consume_queue_raw(b"T", -1), InvalidArgumentError,
     "queue_id is -1"),
    ("raw queue_id str", lambda s: s.find_consume_queue_raw(b"T", "0"), TypeError,
     "queue_id must be an int"),
]


@pytest.mark.parametrize("call, exc, text", [c[1:] for c in BAD_CALLS],
                         ids=[c[0] for c in BAD_CALLS])
def test_a_bad_argument_raises_a_clear_error_and_stores_nothing(store, call, exc, text):
    kept = store.put_message(Message("T", b"kept"))
    with pytest.raises(exc, match=text.replace("(", r"\(").replace(")", r"\)")):
        call(store)
    assert store.get_max_phy_offset() == kept.commit_log_offset + kept.wrote_bytes
    g = store.get_message("g", "T", 0, 0)
    assert [m.body for m in g.messages] == [b"kept"]
    # The schedule service looks up its delay levels' queues in its own time: they are the
    # store's, not something the bad call stored.
    assert sorted(t for t in store.consume_queue_table if t != SCHEDULE_TOPIC) == ["T"]


EVERY_CALL = [
    ("put_message", lambda s: s.put_message(Message("T", b"x"))),
    ("put_messages", lambda s: s.put_messages([Message("T", b"x")])),
    ("get_message", lambda s: s.get_message("g", "T", 0, 0)),
    ("get_min_offset_in_queue", lambda s: s.get_min_offset_in_queue("T", 0)),
    ("get_max_offset_in_queue", lambda s: s.get_max_offset_in_queue("T", 0)),
    ("get_min_phy_offset", lambda s: s.get_min_phy_offset()),
    ("get_max_phy_offset", lambda s: s.get_max_phy_offset()),
    ("consume_queue", lambda s: s.consume_queue("T", 0)),
    ("consume_queue(new)", lambda s: s.consume_queue("New", 0)),
    ("look_message_by_offset", lambda s: s.look_message_by_offset(0)),
    ("query_message", lambda s: s.query_message("T", "k")),
    ("query_message_by_unique_key", lambda s: s.query_message_by_unique_key("T", "u")),
    ("view_message_by_id", lambda s: s.view_message_by_id("7F00000100002A9F0000000000000000")),
    ("get_offset_in_queue_by_time", lambda s: s.get_offset_in_queue_by_time("T", 0, 0)),
    ("iter_messages", lambda s: s.iter_messages()),
    ("commit_offset", lambda s: s.commit_offset("g", "T", 0, 1)),
    ("query_offset", lambda s: s.query_offset("g", "T", 0)),
    ("topic_config", lambda s: s.topic_config("T")),
    ("update_topic_config", lambda s: s.update_topic_config("T")),
    ("delete_topic_config", lambda s: s.delete_topic_config("T")),
    ("subscription_group", lambda s: s.subscription_group("g")),
    ("update_subscription_group", lambda s: s.update_subscription_group("g")),
    ("delete_subscription_group", lambda s: s.delete_subscription_group("g")),
    ("clean_files_periodically", lambda s: s.clean_files_periodically()),
    ("clean_plan", lambda s: s.clean_plan()),
    ("execute_delete_files_manually", lambda s: s.execute_delete_files_manually()),
    ("persist_configs", lambda s: s.persist_configs()),
    ("dispatch_behind_bytes", lambda s: s.dispatch_behind_bytes()),
    ("get_consume_queue", lambda s: s.get_consume_queue("T", 0)),
    ("get_message_total_in_queue", lambda s: s.get_message_total_in_queue("T", 0)),
    ("get_commit_log_offset_in_queue", lambda s: s.get_commit_log_offset_in_queue("T", 0, 0)),
    ("get_message_store_timestamp", lambda s: s.get_message_store_timestamp("T", 0, 0)),
    ("get_earliest_message_time", lambda s: s.get_earliest_message_time()),
    ("select_one_message_by_offset", lambda s: s.select_one_message_by_offset(0)),
    ("check_in_disk_by_consume_offset",
     lambda s: s.check_in_disk_by_consume_offset("T", 0, 0)),
    ("append_to_commit_log", lambda s: s.append_to_commit_log(0, b"")),
    ("get_confirm_offset", lambda s: s.get_confirm_offset()),
    ("set_confirm_offset", lambda s: s.set_confirm_offset(0)),
    ("is_transient_store_pool_deficient", lambda s: s.is_transient_store_pool_deficient()),
]


@pytest.mark.parametrize("call", [c[1] for c in EVERY_CALL], ids=[c[0] for c in EVERY_CALL])
def test_every_public_method_of_a_shut_down_store_raises_store_closed(tmp_path, backend,
                                                                       call):
    store = testing.open_store(tmp_path / "s", backend)
    store.put_message(Message("T", b"x"))
    store.shutdown()
    before = testing.tree_digest(tmp_path / "s")
    with pytest.raises(StoreClosedError):
        call(store)
    assert testing.tree_digest(tmp_path / "s") == before
    reopened = MessageStore(tmp_path / "s", store.config, kernels=backend)
    reopened.load()
    try:
        assert reopened.recovery_report.normal
        assert sorted(reopened.consume_queue_table) == ["T"]
    finally:
        reopened.shutdown()


def test_with_the_transient_pool_a_put_is_visible_as_soon_as_it_returns(tmp_path, backend):
    config = testing.small_config(transient_store_pool_enable=True,
                                  transient_store_pool_size=2)
    store = testing.open_store(tmp_path / "s", backend, config)
    frees = [park(store.commit_service), park(store.reput_service)]
    try:
        r = store.put_message(Message("Pool", b"buffered"))
        g = store.get_message("g", "Pool", 0, r.queue_offset)
        assert [m.body for m in g.messages] == [b"buffered"]
    finally:
        for go in frees:
            go.set()
        store.shutdown()


@pytest.mark.parametrize("kwargs, text", [
    (dict(kernels=5), "kernels must be a backend name or a kernel module"),
    (dict(clock=5), "clock must be callable"),
    (dict(disk_usage="0.5"), "disk_usage must be callable"),
])
def test_a_store_built_with_a_bad_collaborator_refuses_at_once(tmp_path, kwargs, text):
    with pytest.raises(TypeError, match=text):
        MessageStore(tmp_path / "s", **kwargs)
    assert not (tmp_path / "s").exists()


def test_a_unit_whose_file_cleaning_deletes_during_the_read_is_answered_as_gone(store,
                                                                                  monkeypatch):
    # The clean service (or a cut) destroyed the ConsumeQueue file after the read found it
    # and before it viewed the unit: ConsumeQueue.units read the closed mapping and the
    # caller got ValueError instead of "no such message".
    r = store.put_message(Message("T", b"m", queue_id=1))
    assert r.status.ok
    assert store.get_message_store_timestamp("T", 1, 0) > 0
    mfq = store.get_consume_queue("T", 1).mfq
    find = mfq.find_by_offset

    def find_then_cleaned(*args):
        f = find(*args)
        if f is not None:
            assert f.destroy()
        return f
    monkeypatch.setattr(mfq, "find_by_offset", find_then_cleaned)
    assert store.get_message_store_timestamp("T", 1, 0) == -1
    assert store.get_commit_log_offset_in_queue("T", 1, 0) == 0
