# SPDX-License-Identifier: Apache-2.0
"""`rocketstore query key|id|offset|time`, run as a user runs it: a subprocess on a store dir."""
import json
import os
import subprocess
import sys

from rocketstore import Message, testing

from broker_data import BASIC, broker_messages, tree_bytes


def run(*args):
    return subprocess.run([sys.executable, "-m", "rocketstore", "query", *map(str, args)],
                          capture_output=True, text=True)


def lines(out):
    return [json.loads(line) for line in out.splitlines()]


def test_query_key_prints_the_brokers_answer_as_dump_lines(broker_store):
    dumped = {m["commitLogOffset"]: m for m in broker_messages()}
    with open(os.path.join(BASIC, "queries.jsonl")) as f:
        queries = [json.loads(line) for line in f]
    for q in queries[:8]:
        r = run("key", broker_store, q["topic"], q["key"], "--max", q["maxNum"])
        assert r.returncode == 0, r.stderr
        assert lines(r.stdout) == [dumped[o] for o in q["commitLogOffsets"]]


def test_query_key_with_no_hit_exits_1_with_one_error_line(broker_store):
    r = run("key", broker_store, "PayTopic", "ord-0")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "rocketstore query: no message with key 'ord-0' in topic 'PayTopic'"]


def test_query_key_honours_begin_end_and_max(broker_store):
    msgs = [m for m in broker_messages() if m["topic"] == "OrderTopic"
            and "grp-0" in (m["keys"] or "").split(" ")]
    r = run("key", broker_store, "OrderTopic", "grp-0", "--max", 5)
    assert [m["commitLogOffset"] for m in lines(r.stdout)] == \
        [m["commitLogOffset"] for m in msgs[-5:]]
    end = msgs[0]["storeTimestamp"] - 10 ** 6
    r = run("key", broker_store, "OrderTopic", "grp-0", "--end", end)
    assert r.returncode == 1


def test_query_key_rejects_index_sizes_that_do_not_fit_the_files(broker_store):
    r = run("key", broker_store, "OrderTopic", "ord-0", "--max-hash-slot-num", 64,
            "--max-index-num", 400)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "rocketstore query: error: the index files do not have 64 hash slots and 400 entries"]
    r = run("key", broker_store, "OrderTopic", "ord-0", "--max-hash-slot-num", 64,
            "--max-index-num", 500)
    assert r.returncode == 0 and lines(r.stdout)[0]["commitLogOffset"] == 0


def test_query_id_and_offset_print_the_message(broker_store):
    m = broker_messages()[600]
    for args in (("id", broker_store, m["msgId"]), ("offset", broker_store, m["commitLogOffset"])):
        r = run(*args)
        assert r.returncode == 0, r.stderr
        assert lines(r.stdout) == [m]


def test_query_id_and_offset_fail_cleanly_on_bad_input(broker_store):
    r = run("id", broker_store, "XYZ")
    assert r.returncode == 2
    assert r.stderr.strip() == "rocketstore query: error: 'XYZ' is not an offset msgId (32 or " \
                               "56 hex digits)"
    r = run("offset", broker_store, 5)
    assert r.returncode == 1 and "no message with commit-log offset 5" in r.stderr
    r = run("key", broker_store / "missing", "T", "k")
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_query_time_prints_the_queue_offset(broker_store):
    msgs = [m for m in broker_messages() if m["topic"] == "PayTopic" and m["queueId"] == 2]
    r = run("time", broker_store, "PayTopic", 2, msgs[0]["storeTimestamp"] - 1)
    assert r.returncode == 0
    assert lines(r.stdout) == [{"topic": "PayTopic", "queueId": 2,
                                "timestamp": msgs[0]["storeTimestamp"] - 1, "queueOffset": 0}]


def test_query_never_modifies_the_store(broker_store):
    before = {sub: tree_bytes(broker_store, sub) for sub in ("commitlog", "consumequeue", "index")}
    names = sorted(os.listdir(broker_store))
    run("key", broker_store, "OrderTopic", "ord-0")
    run("time", broker_store, "OrderTopic", 0, 0)
    assert sorted(os.listdir(broker_store)) == names
    for sub, files in before.items():
        assert tree_bytes(broker_store, sub) == files


def test_query_key_on_a_store_we_wrote_with_default_index_sizes(tmp_path):
    store = testing.open_store(tmp_path, testing.load_backend("pure"),
                               testing.small_config(max_index_num=20_000_000,
                                                    max_hash_slot_num=5_000_000))
    try:
        r = store.put_message(Message("T", b"hello", keys="alpha beta"))
    finally:
        store.shutdown()
    out = run("key", tmp_path, "T", "beta")
    assert out.returncode == 0, out.stderr
    assert [m["commitLogOffset"] for m in lines(out.stdout)] == [r.commit_log_offset]


def test_query_time_on_a_queue_the_store_does_not_have_exits_1(broker_store):
    for topic, queue in (("PayTopic", 3), ("NoTopic", 0)):
        r = run("time", broker_store, topic, queue, 0)
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.strip().splitlines() == [
            f"rocketstore query: no queue {queue} in topic {topic!r}"]


def test_a_query_argument_out_of_its_domain_is_a_usage_error(broker_store):
    r = run("key", broker_store, "OrderTopic", "ord-0", "--max", "0")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "rocketstore query: error: max_num is 0; it must be within [1, inf]"]
