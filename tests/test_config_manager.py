# SPDX-License-Identifier: Apache-2.0
"""config/*.json: fastjson's dialect byte for byte (doc/04 §4.5), the crash-safe write order,
the .bak fallback, and the store API that sits on them (topics, groups, consumer offsets)."""
import logging
import os

import pytest

from rocketstore import Message, MessageIllegalError, MessageStore, testing
from rocketstore.config_manager import (ConsumerOffsetManager, DelayOffsetManager,
                                        SubscriptionGroupConfig, SubscriptionGroupManager,
                                        TopicConfig, TopicConfigManager, parse_fastjson,
                                        to_fastjson)
from rocketstore.errors import StoreClosedError, StoreLoadError
from rocketstore.fs import FileSystem

DATA = os.path.join(os.path.dirname(__file__), "data", "rmq-4.9.8-basic", "store")
T = 1_700_000_000_000

# doc/04 §4.5, tabs as tabs, no trailing newline (MixAll.string2File writes the string as is).
TOPICS_JSON = ('{\n\t"dataVersion":{\n\t\t"counter":3,\n\t\t"timestamp":1700000000000\n\t},\n'
               '\t"topicConfigTable":{\n\t\t"TopicTest":{\n\t\t\t"order":false,\n'
               '\t\t\t"perm":6,\n\t\t\t"readQueueNums":4,\n\t\t\t"topicFilterType":"SINGLE_TAG",\n'
               '\t\t\t"topicName":"TopicTest",\n\t\t\t"topicSysFlag":0,\n'
               '\t\t\t"writeQueueNums":4\n\t\t}\n\t}\n}')
GROUPS_JSON = ('{\n\t"dataVersion":{\n\t\t"counter":1,\n\t\t"timestamp":1700000000000\n\t},\n'
               '\t"subscriptionGroupTable":{\n\t\t"GroupA":{\n\t\t\t"brokerId":0,\n'
               '\t\t\t"consumeBroadcastEnable":true,\n\t\t\t"consumeEnable":true,\n'
               '\t\t\t"consumeFromMinEnable":true,\n\t\t\t"groupName":"GroupA",\n'
               '\t\t\t"notifyConsumerIdsChangedEnable":true,\n\t\t\t"retryMaxTimes":16,\n'
               '\t\t\t"retryQueueNums":1,\n\t\t\t"whichBrokerWhenConsumeSlowly":1\n\t\t}\n\t}\n}')
OFFSETS_JSON = ('{\n\t"offsetTable":{\n\t\t"TopicTest@GroupA":{0:3,1:0,2:0,3:0\n\t\t},\n'
                '\t\t"%RETRY%GroupA@GroupA":{0:0\n\t\t}\n\t}\n}')
DELAY_JSON = '{\n\t"offsetTable":{1:5,3:12\n\t}\n}'


def read(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


def test_topics_json_is_written_byte_for_byte_as_the_spec_example(tmp_path):
    m = TopicConfigManager(str(tmp_path), FileSystem(), clock=lambda: T)
    for _ in range(3):
        m.update(TopicConfig("TopicTest", read_queue_nums=4, write_queue_nums=4))
    assert read(m.path) == TOPICS_JSON


def test_subscription_group_json_is_written_byte_for_byte_as_the_spec_example(tmp_path):
    m = SubscriptionGroupManager(str(tmp_path), FileSystem(), clock=lambda: T)
    m.update(SubscriptionGroupConfig("GroupA"))
    assert read(m.path) == GROUPS_JSON


def test_consumer_offset_json_keeps_int_keys_unquoted_on_one_line(tmp_path):
    m = ConsumerOffsetManager(str(tmp_path), FileSystem())
    for q, off in ((0, 3), (1, 0), (2, 0), (3, 0)):
        m.commit_offset("GroupA", "TopicTest", q, off)
    m.commit_offset("GroupA", "%RETRY%GroupA", 0, 0)
    m.persist()
    assert read(m.path) == OFFSETS_JSON


def test_delay_offset_json_sorts_levels_like_a_java_hash_map(tmp_path):
    m = DelayOffsetManager(str(tmp_path), FileSystem())
    m.update_offset(3, 12)
    m.update_offset(1, 5)
    m.persist()
    assert read(m.path) == DELAY_JSON


@pytest.mark.parametrize("cls,text", [(TopicConfigManager, TOPICS_JSON),
                                      (SubscriptionGroupManager, GROUPS_JSON),
                                      (ConsumerOffsetManager, OFFSETS_JSON),
                                      (DelayOffsetManager, DELAY_JSON)])
def test_spec_examples_read_back_and_rewrite_identically(tmp_path, cls, text):
    m = cls(str(tmp_path), FileSystem())
    m.decode(text)
    assert m.encode() == text


def test_the_brokers_gson_style_delay_offset_file_loads(tmp_path):
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "delayOffset.json").write_bytes(open(os.path.join(DATA, "config",
                                                             "delayOffset.json"), "rb").read())
    m = DelayOffsetManager(str(tmp_path), FileSystem())
    assert m.load() and m.loaded_from == "main" and m.offset_table == {}
    m.decode('{\n  "offsetTable": {\n    "1": 5,\n    "3": 12\n  }\n}')
    assert m.offset_table == {1: 5, 3: 12}


def test_unquoted_keys_inside_strings_are_left_alone():
    assert parse_fastjson('{"a,1:b":{0:1, 2 :3},"s":"{5:6"}') == \
        {"a,1:b": {"0": 1, "2": 3}, "s": "{5:6"}


def test_unknown_5x_members_survive_a_round_trip(tmp_path):
    text = ('{"dataVersion":{"counter":2,"stateVersion":7,"timestamp":5},"topicConfigTable":'
            '{"T":{"attributes":{},"order":false,"perm":6,"readQueueNums":8,'
            '"topicFilterType":"SINGLE_TAG","topicName":"T","topicSysFlag":0,'
            '"writeQueueNums":8}}}')
    m = TopicConfigManager(str(tmp_path), FileSystem())
    m.decode(text)
    assert m.select("T").write_queue_nums == 8 and m.select("T").extra == {"attributes": {}}
    again = parse_fastjson(m.encode())
    assert again == parse_fastjson(text)
    assert '\t\t\t"attributes":{},\n\t\t\t"order":false' in m.encode()


def test_null_members_are_omitted_like_fastjson():
    assert to_fastjson({"a": None, "b": 1}) == '{\n\t"b":1\n}'
    assert to_fastjson({"m": {}}) == '{\n\t"m":{}\n}'


class RecordingFS(FileSystem):
    def __init__(self):
        self.calls = []

    def write_bytes(self, path, data, sync=True):
        self.calls.append(("write", os.path.basename(path), sync))
        super().write_bytes(path, data, sync)

    def rename(self, src, dst):
        self.calls.append(("rename", os.path.basename(src), os.path.basename(dst)))
        super().rename(src, dst)

    def fsync_dir(self, path):
        self.calls.append(("fsync_dir", os.path.basename(path)))
        super().fsync_dir(path)


def test_persist_writes_temp_then_bak_then_renames_then_syncs_the_directory(tmp_path):
    fs = RecordingFS()
    m = ConsumerOffsetManager(str(tmp_path), fs)
    m.commit_offset("g", "t", 0, 1)
    m.persist()
    m.commit_offset("g", "t", 0, 2)
    fs.calls.clear()
    m.persist()
    name = "consumerOffset.json"
    assert fs.calls == [("write", name + ".tmp", True), ("write", name + ".bak", True),
                        ("rename", name + ".tmp", name), ("fsync_dir", "config")]
    assert '{0:1' in read(m.path + ".bak") and '{0:2' in read(m.path)


def test_a_crash_before_the_rename_leaves_the_previous_file_whole(tmp_path):
    class CrashOnRename(FileSystem):
        def rename(self, src, dst):
            raise OSError("simulated crash")

    m = ConsumerOffsetManager(str(tmp_path), FileSystem())
    m.commit_offset("g", "t", 0, 1)
    m.persist()
    bad = ConsumerOffsetManager(str(tmp_path), CrashOnRename())
    bad.commit_offset("g", "t", 0, 99)
    with pytest.raises(OSError):
        bad.persist()
    fresh = ConsumerOffsetManager(str(tmp_path), FileSystem())
    assert fresh.load() and fresh.query_offset("g", "t", 0) == 1


def test_corrupt_main_file_falls_back_to_bak_and_says_so(tmp_path, caplog):
    m = ConsumerOffsetManager(str(tmp_path), FileSystem())
    m.commit_offset("g", "t", 0, 1)
    m.persist()
    m.commit_offset("g", "t", 0, 2)
    m.persist()
    with open(m.path, "w") as f:
        f.write('{"offsetTable":{"t@g":{0:')
    fresh = ConsumerOffsetManager(str(tmp_path), FileSystem())
    with caplog.at_level(logging.WARNING):
        assert fresh.load()
    assert fresh.loaded_from == "bak" and fresh.query_offset("g", "t", 0) == 1
    assert "corrupt" in caplog.text and "consumerOffset.json" in caplog.text
    # The next persist repairs the main file and does not copy the corrupt one over .bak.
    fresh.persist()
    assert parse_fastjson(read(m.path)) == parse_fastjson(read(m.path + ".bak"))


def test_missing_main_file_loads_bak_and_missing_both_is_an_empty_table(tmp_path):
    m = TopicConfigManager(str(tmp_path), FileSystem(), clock=lambda: T)
    assert m.load() and m.loaded_from is None and m.topic_config_table == {}
    m.update(TopicConfig("A"))
    m.update(TopicConfig("B"))
    os.remove(m.path)
    fresh = TopicConfigManager(str(tmp_path), FileSystem())
    assert fresh.load() and fresh.loaded_from == "bak" and set(fresh.topic_config_table) == {"A"}


def test_a_store_whose_config_and_bak_are_both_corrupt_refuses_to_load(tmp_path, backend):
    cfg = tmp_path / "s" / "config"
    cfg.mkdir(parents=True)
    (cfg / "topics.json").write_text("{nope")
    (cfg / "topics.json.bak").write_text("{nope")
    store = MessageStore(tmp_path / "s", testing.small_config(), kernels=backend)
    with pytest.raises(StoreLoadError, match="topics.json and its .bak are both corrupt: "
                                             "mend one, restore it from a backup, or move"):
        store.load()
    # Nothing was written over either: what an operator may still mend is as it was.
    assert (cfg / "topics.json").read_text() == (cfg / "topics.json.bak").read_text() == "{nope"


def test_a_refused_open_for_a_corrupt_config_pair_recovers_nothing_first(tmp_path, backend):
    # The broker loads its config files before the message store, so a start refused for
    # them has cut nothing: an operator who mends topics.json finds the store as it was.
    root = tmp_path / "s"
    store = testing.open_store(root, backend, testing.small_config())
    for i in range(20):
        store.put_message(Message("T", b"m%d" % i))
    store.update_topic_config("T")
    store.update_topic_config("T2")             # topics.json and its .bak
    testing.wait_dispatched(store)
    store.shutdown()
    (root / "abort").touch()                    # the next open recovers abnormally...
    log = sorted((root / "commitlog").iterdir())[0]
    raw = bytearray(log.read_bytes())
    raw[raw.index(b"m19")] ^= 0xFF             # ...and would cut the last record (its CRC)
    log.write_bytes(bytes(raw))
    for name in ("topics.json", "topics.json.bak"):
        (root / "config" / name).write_text("{nope")
    before = testing.tree_digest(root, ignore=("lock",))
    with pytest.raises(StoreLoadError, match="both corrupt"):
        MessageStore(root, testing.small_config(), kernels=backend).load()
    assert testing.tree_digest(root, ignore=("lock",)) == before


@pytest.fixture
def store(tmp_path, backend):
    s = testing.open_store(tmp_path / "store", backend)
    yield s
    s.shutdown()


def test_query_offset_is_minus_one_until_a_group_commits(store):
    assert store.query_offset("g", "T", 0) == -1
    store.commit_offset("g", "T", 0, 42)
    assert store.query_offset("g", "T", 0) == 42
    assert store.query_offset("g", "T", 1) == -1 and store.query_offset("h", "T", 0) == -1


def test_offsets_topics_and_groups_survive_a_restart_in_rocketmq_format(tmp_path, backend):
    root = tmp_path / "store"
    s = testing.open_store(root, backend)
    s.commit_offset("GroupA", "TopicTest", 1, 7)
    s.update_topic_config("TopicTest", read_queue_nums=4, write_queue_nums=4)
    s.update_subscription_group("GroupA", retry_max_times=3)
    s.shutdown()
    assert "TopicTest@GroupA" in read(root / "config" / "consumerOffset.json")
    s = testing.open_store(root, backend)
    try:
        assert s.query_offset("GroupA", "TopicTest", 1) == 7
        assert s.topic_config("TopicTest") == TopicConfig("TopicTest", 4, 4)
        assert s.subscription_group("GroupA").retry_max_times == 3
        with pytest.raises(MessageIllegalError, match="queue id 4"):
            s.put_message(Message("TopicTest", b"x", queue_id=4))
    finally:
        s.shutdown()


def test_put_beyond_write_queue_nums_is_illegal_and_other_topics_are_unaffected(store):
    store.update_topic_config("Narrow", read_queue_nums=2, write_queue_nums=2, perm=6)
    assert store.put_message(Message("Narrow", b"x", queue_id=1)).ok
    with pytest.raises(MessageIllegalError):
        store.put_message(Message("Narrow", b"x", queue_id=2))
    with pytest.raises(MessageIllegalError):
        store.put_messages([Message("Narrow", b"x", queue_id=0),
                            Message("Narrow", b"y", queue_id=5)])
    assert store.put_message(Message("Wide", b"x", queue_id=99)).ok
    store.update_topic_config("Narrow", write_queue_nums=8)
    assert store.put_message(Message("Narrow", b"x", queue_id=5)).ok


def test_a_read_only_store_reads_configs_but_refuses_to_change_them(tmp_path, backend):
    root = tmp_path / "store"
    s = testing.open_store(root, backend)
    s.commit_offset("g", "t", 0, 5)
    s.shutdown()
    ro = MessageStore.open_read_only(root, kernels=backend)
    try:
        assert ro.query_offset("g", "t", 0) == 5
        with pytest.raises(StoreClosedError):
            ro.commit_offset("g", "t", 0, 6)
    finally:
        ro.shutdown()


def test_deleted_topics_keep_their_by_bytes_offsets_in_step_with_every_change(tmp_path):
    from rocketstore.topic_delete import DeletedTopicManager
    m = DeletedTopicManager(str(tmp_path), FileSystem())
    assert m.load() and m.offsets_raw == {}
    m.mark("Tö", 500, pending=True)
    m.mark("U", 900, pending=False)
    assert m.offsets_raw == {"Tö".encode(): 500, b"U": 900}
    assert m.prune(1000)                                   # U expired; Tö is still pending
    assert m.offsets_raw == {"Tö".encode(): 500}
    again = DeletedTopicManager(str(tmp_path), FileSystem())
    assert again.load() and again.offsets_raw == {"Tö".encode(): 500}
