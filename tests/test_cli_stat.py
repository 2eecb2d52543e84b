# SPDX-License-Identifier: Apache-2.0
"""`rocketstore stat STORE_DIR [--json]`, driven as a user would (subprocess)."""
import json
import os

from rocketstore import Message, testing


def rocketstore(*args, check=True):
    return testing.run_cli(*args, check=check)


tree_digest = testing.tree_digest


def test_stat_of_a_broker_store_lists_its_queues_and_files_without_changing_it(broker_store):
    before = tree_digest(broker_store)
    st = json.loads(rocketstore("stat", str(broker_store), "--json").stdout)
    assert tree_digest(broker_store) == before
    topics = {t["topic"]: t for t in st["topics"]}
    assert set(topics) == {"LogTopic", "OrderTopic", "PayTopic"}
    assert [q["queueId"] for q in topics["OrderTopic"]["queues"]] == [0, 1, 2, 3]
    assert sum(q["maxOffset"] for t in topics.values() for q in t["queues"]) == \
        sum(1 for _ in open(os.path.join(os.path.dirname(__file__), "data", "rmq-4.9.8-basic",
                                         "messages.jsonl")))
    assert st["files"]["commitlog"]["files"] == 11
    assert st["files"]["commitlog"]["bytes"] == 11 * 32768
    assert st["files"]["index"]["files"] == 6 and st["files"]["config"]["files"] == 1
    assert st["checkpoint"]["physicMsgTimestamp"]["ms"] > 0
    assert st["abortFile"] is False and st["lockFile"] is True and st["lockedByPid"] == 0
    assert 0 <= st["diskUsedRatio"] <= 1 and st["groups"] == []


def test_stat_text_report_names_each_section(broker_store):
    out = rocketstore("stat", str(broker_store)).stdout
    for word in ("commitlog", "abort", "lock", "disk", "files", "checkpoint", "topics",
                 "groups", "PayTopic", "queue 0"):
        assert word in out


def test_stat_shows_consumer_lag_topic_configs_and_the_running_owner(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        store.update_topic_config("T", read_queue_nums=2, write_queue_nums=2)
        for i in range(10):
            store.put_message(Message("T", b"m", queue_id=i % 2))
        testing.wait_dispatched(store)
        store.commit_offset("G", "T", 0, 2)
        store.commit_offset("G", "T", 1, 5)
        store.update_subscription_group("Idle")
        store.persist_configs()
        st = json.loads(rocketstore("stat", str(tmp_path / "s"), "--json").stdout)
    finally:
        store.shutdown()
    groups = {g["group"]: g for g in st["groups"]}
    assert groups["G"]["lag"] == 3 and groups["Idle"] == {"group": "Idle", "lag": 0,
                                                          "topics": []}
    queues = groups["G"]["topics"][0]["queues"]
    assert [(q["queueId"], q["offset"], q["maxOffset"], q["lag"]) for q in queues] == \
        [(0, 2, 5, 3), (1, 5, 5, 0)]
    topic = st["topics"][0]
    assert topic["config"]["writeQueueNums"] == 2
    assert st["abortFile"] is True and st["lockedByPid"] == os.getpid()


def test_stat_of_a_missing_directory_is_one_clear_error(tmp_path):
    out = rocketstore("stat", str(tmp_path / "nope"), check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "error" in out.stderr


def test_help_lists_stat():
    assert "stat" in rocketstore("--help").stdout


def test_stat_shows_allocated_bytes_beside_the_apparent_size(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        store.put_message(Message("T", b"m"))
    finally:
        store.shutdown()
    st = json.loads(rocketstore("stat", str(tmp_path / "s"), "--json").stdout)
    cl = st["files"]["commitlog"]
    paths = list((tmp_path / "s" / "commitlog").iterdir())
    assert cl["allocatedBytes"] == sum(os.stat(p).st_blocks * 512 for p in paths)
    assert cl["bytes"] == sum(os.path.getsize(p) for p in paths)
    assert "allocated" in rocketstore("stat", str(tmp_path / "s")).stdout


def test_stat_survives_a_checkpoint_time_no_calendar_holds(broker_store):
    with open(broker_store / "checkpoint", "r+b") as f:
        f.write(((1 << 63) - 1).to_bytes(8, "big"))
    out = rocketstore("stat", str(broker_store), "--json", check=False)
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)
    assert st["checkpoint"]["physicMsgTimestamp"] == {"ms": (1 << 63) - 1, "utc": None}
    assert rocketstore("stat", str(broker_store), check=False).returncode == 0


def test_stat_refuses_a_directory_that_holds_no_store(tmp_path):
    (tmp_path / "store").mkdir()
    out = rocketstore("stat", str(tmp_path), check=False)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"rocketstore stat: error: {tmp_path} is not a store directory: expected commitlog/ "
        "or checkpoint in it (a store root holds commitlog/, consumequeue/, index/, "
        "checkpoint, config/)"]


def test_stat_help_says_how_to_read_consumer_offsets_as_json():
    for args in (("stat", "--help"), ("--help",)):
        text = " ".join(rocketstore(*args).stdout.split())
        assert "bare integer keys ({0:1,1:5}) that json.load rejects" in text
        assert "rocketstore stat --json" in text
