# SPDX-License-Identifier: Apache-2.0
"""Every read-only command on a store damaged in many ways: never a traceback, exit status 0
or 1, and `verify` exits 1 whenever something was damaged. The commands run in-process
(`cli.main`), so an escaping exception fails the test where it happens."""
import contextlib
import io
import json
import os
import random
import shutil
import struct

import pytest

from rocketstore import Message, MessageStore, StoreLoadError, cli, testing

TOPICS = ("OrderTopic", "PayTopic", "LogTopic")
CONFIG = testing.small_config(max_index_num=200)
# Random damage (testing.damage_at_random), a quarter of the corruption tests' seeds: each
# seed runs every command below (ROCKETSTORE_CORRUPTION_SEEDS soaks both).
SEEDS = testing.damage_seeds(4)


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory):
    """~150 KiB over three CommitLog files, several ConsumeQueue and index files, every
    config file, shut down cleanly."""
    root = tmp_path_factory.mktemp("damage") / "store"
    store = testing.open_store(root, "pure", CONFIG)
    try:
        for topic in TOPICS:
            store.update_topic_config(topic, read_queue_nums=2, write_queue_nums=2)
        for i in range(600):
            store.put_message(Message(TOPICS[i % 3], b"b%d-" % i + b"x" * 200,
                                      queue_id=i % 2, keys=f"k{i} g{i % 7}", tags="TagA"))
        testing.wait_dispatched(store)
        store.commit_offset("G", "OrderTopic", 0, 5)
        store.update_subscription_group("G")
        store.persist_configs()
    finally:
        store.shutdown()
    return root


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def first(root, sub):
    return sorted(p for p in (root / sub).rglob("*") if p.is_file() and p.name.isdigit())[0]


def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def cut(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def commitlog(root, i):
    return sorted((root / "commitlog").iterdir())[i]


def index_file(root, i):
    return sorted((root / "index").iterdir())[i]


def cq_file(root, topic="PayTopic", qid="1", i=0):
    return sorted((root / "consumequeue" / topic / qid).iterdir())[i]


def write_checkpoint(root, physic):
    with open(root / "checkpoint", "r+b") as f:
        f.write(struct.pack(">q", physic))


def deep_offsets(root):
    text = '{"offsetTable":' + '{"a":' * 200_000 + "1" + "}" * 200_001
    (root / "config" / "consumerOffset.json").write_text(text)


def also_bak(name, text):
    def damage(root):
        for suffix in ("", ".bak"):
            (root / "config" / (name + suffix)).write_text(text)
    return damage


DAMAGE = {
    "commitlog-header-byte": lambda r: flip(commitlog(r, 1), 4),
    "commitlog-size-field": lambda r: flip(commitlog(r, 1), 0),
    "commitlog-body-byte": lambda r: flip(commitlog(r, 1), 300),
    "commitlog-last-file-record": lambda r: flip(commitlog(r, -1), 20),
    "commitlog-physical-offset": lambda r: flip(commitlog(r, 0), 28 + 7),
    "commitlog-truncated-half": lambda r: cut(commitlog(r, 1), 32 * 1024),
    "commitlog-truncated-empty": lambda r: cut(commitlog(r, 1), 0),
    "commitlog-middle-file-deleted": lambda r: os.remove(commitlog(r, 1)),
    "commitlog-all-files-deleted": lambda r: [os.remove(p) for p in
                                              list((r / "commitlog").iterdir())],
    "commitlog-zeroed-record": lambda r: _zero(commitlog(r, 0), 0, 120),
    "commitlog-stray-name": lambda r: (r / "commitlog" / "notes.txt").write_bytes(b"x"),
    "commitlog-misaligned-segment": lambda r: (r / "commitlog" /
                                               "00000000000000000777").write_bytes(
        bytes(64 * 1024)),
    "commitlog-directory-named-as-segment": lambda r: (r / "commitlog" /
                                                       "00000000000009999999").mkdir(),
    "cq-unit-offset": lambda r: flip(cq_file(r), 3),
    "cq-unit-size": lambda r: flip(cq_file(r), 20 + 10),
    "cq-truncated": lambda r: cut(cq_file(r), 7),
    "cq-first-file-deleted": lambda r: os.remove(cq_file(r)),
    "cq-last-file-deleted": lambda r: os.remove(cq_file(r, i=-1)),
    "cq-queue-deleted": lambda r: shutil.rmtree(r / "consumequeue" / "LogTopic" / "0"),
    "cq-all-deleted": lambda r: shutil.rmtree(r / "consumequeue"),
    "cq-stray-queue-dir": lambda r: (r / "consumequeue" / "PayTopic" / "x").mkdir(),
    "cq-stray-file-as-topic": lambda r: (r / "consumequeue" / "Stray").write_bytes(b"x"),
    "index-count-field": lambda r: flip(index_file(r, 0), 36 + 3),
    "index-slot": lambda r: _slot(index_file(r, 0)),
    "index-entry-offset": lambda r: flip(index_file(r, 0), 40 + 64 * 4 + 20 * 3 + 4 + 5),
    "index-entry-hash": lambda r: flip(index_file(r, 0), 40 + 64 * 4 + 20 * 3 + 1),
    "index-truncated": lambda r: cut(index_file(r, 0), 100),
    "index-deleted": lambda r: os.remove(index_file(r, 0)),
    "index-stray-name": lambda r: (r / "index" / "junk").write_bytes(b"x"),
    "checkpoint-flipped": lambda r: flip(r / "checkpoint", 1),
    "checkpoint-far-future": lambda r: write_checkpoint(r, (1 << 63) - 1),
    "checkpoint-negative": lambda r: write_checkpoint(r, -5),
    "checkpoint-truncated": lambda r: cut(r / "checkpoint", 10),
    "checkpoint-deleted": lambda r: os.remove(r / "checkpoint"),
    "config-garbage": lambda r: (r / "config" / "topics.json").write_text("{not json"),
    "config-garbage-with-bak": also_bak("topics.json", "{not json"),
    "config-wrong-shape": lambda r: (r / "config" / "consumerOffset.json").write_text("[]"),
    "config-deep-nesting": deep_offsets,
    "config-deep-nesting-with-bak": also_bak("consumerOffset.json",
                                             "[" * 200_000 + "]" * 200_000),
    "config-binary": lambda r: (r / "config" / "subscriptionGroup.json").write_bytes(
        b"\xff\xfe\x00garbage"),
    "abort-left-behind": lambda r: (r / "abort").write_bytes(b""),
    "cq-cut-to-whole-units": lambda r: cut(cq_file(r, "LogTopic", "0"), 200),
    "cq-forged-unit-past-the-end": lambda r: _forge_past_end(cq_file(r, "OrderTopic", "1", i=-1)),
}


def _last_unit(path):
    data = path.read_bytes()
    return max(i for i in range(0, len(data), 20) if data[i:i + 20] != bytes(20))


def _forge_past_end(path):
    """The queue's last unit made to point far past the CommitLog's end."""
    pos = _last_unit(path)
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(struct.pack(">qiq", 1 << 40, 135, 0))
    return pos


def _zero(path, start, length):
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(length))


def _slot(path):
    """Point a used hash slot at an entry number past indexCount."""
    data = bytearray(path.read_bytes())
    slots = struct.unpack_from(">64i", data, 40)
    used = next(i for i, s in enumerate(slots) if s)
    struct.pack_into(">i", data, 40 + used * 4, 10_000)
    path.write_bytes(bytes(data))


@pytest.fixture
def msg_id(clean_store):
    rc, out, _ = run("dump", clean_store, "--limit", "1")
    return json.loads(out)["msgId"]


def read_only_commands(root, msg_id):
    return [("verify", root), ("verify", root, "--json"), ("dump", root),
            ("export", root, "--format", "csv"), ("stat", root), ("stat", root, "--json"),
            ("query", "key", root, "PayTopic", "k1"), ("query", "id", root, msg_id),
            ("query", "offset", root, 0), ("query", "time", root, "PayTopic", 1, 0)]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_read_only_commands_on_a_damaged_store_answer_without_a_traceback(
        clean_store, msg_id, tmp_path, damage):
    root = tmp_path / "store"
    shutil.copytree(clean_store, root)
    DAMAGE[damage](root)
    for argv in read_only_commands(root, msg_id):
        rc, out, err = run(*argv)
        assert rc in (0, 1), (argv, rc, err)
        assert "Traceback" not in err, (argv, err)
        if argv[0] == "verify":
            assert rc == 1, (argv, out, err)


def test_a_config_file_whose_bak_is_corrupt_too_leaves_every_message_readable(clean_store,
                                                                             tmp_path):
    root = tmp_path / "store"
    shutil.copytree(clean_store, root)
    also_bak("topics.json", "{not json")(root)
    rc, out, err = run("verify", root)
    assert rc == 1
    assert [x.split(": does not parse")[0] for x in out.splitlines() if "does not parse" in x] \
        == ["config: config/topics.json", "config: config/topics.json.bak"]
    assert "600 records, 600 consume-queue units" in out     # the rest was checked
    rc, out, err = run("dump", root)
    assert rc == 0 and len(out.splitlines()) == 600
    # A command that writes refuses, on one line that names the ways out.
    rc, out, err = run("recover", root)
    assert rc == 1 and "Traceback" not in err
    assert "topics.json and its .bak are both corrupt: mend one" in err
    assert (root / "config" / "topics.json").read_text() == "{not json"


@pytest.mark.parametrize("seed", range(SEEDS))
def test_every_command_on_a_store_damaged_at_random_answers_and_the_repairs_reopen_it(
        clean_store, msg_id, tmp_path, seed):
    root = tmp_path / "store"
    shutil.copytree(clean_store, root)
    testing.damage_at_random(root, random.Random(seed))
    numbers = ("--max-hash-slot-num", CONFIG.max_hash_slot_num,
               "--max-index-num", CONFIG.max_index_num)
    repairs = [("recover", root, *numbers), ("rebuild-cq", root, *numbers),
               ("rebuild-index", root, *numbers)]
    for argv in read_only_commands(root, msg_id) + repairs:
        rc, out, err = run(*argv)
        assert rc in (0, 1) and "Traceback" not in err, (argv, rc, err)
    # Repaired, the store opens and takes a put; or it still refuses for a config file whose
    # .bak is damaged too, which no command rewrites (the operator mends it).
    store = MessageStore(root, CONFIG, kernels="pure")
    try:
        store.load()
    except StoreLoadError as exc:
        assert "and its .bak are both corrupt: mend one" in str(exc)
        return
    try:
        store.start()
        assert store.put_message(Message("AfterRepair", b"x")).ok
        testing.wait_dispatched(store)
        assert store.get_message("g", "AfterRepair", 0, 0).messages[0].body == b"x"
    finally:
        store.shutdown()


def test_read_only_commands_on_the_clean_store_succeed(clean_store, msg_id):
    before = testing.tree_digest(clean_store)
    for argv in read_only_commands(clean_store, msg_id):
        rc, out, err = run(*argv)
        assert rc == 0, (argv, err)
    assert testing.tree_digest(clean_store) == before


def test_an_empty_directory_and_an_empty_store_root_are_told_apart(tmp_path):
    rc, out, err = run("verify", tmp_path)
    assert rc == 2 and "is not a store directory" in err
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "checkpoint").write_bytes(bytes(4096))
    rc, out, err = run("verify", tmp_path)
    assert rc == 0 and "0 records" in out


def test_verify_names_a_zeroed_magic_code_as_unreadable_not_as_zeros(clean_store, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(clean_store, root)
    with open(commitlog(root, 1), "r+b") as f:
        f.seek(4)                       # the first record's magic code; its length stays
        f.write(bytes(4))
    rc, out, err = run("verify", root)
    assert rc == 1
    line = [x for x in out.splitlines() if x.startswith("commitlog:")][0]
    assert "a record with no magic code ends the data here" in line and "zeros" not in line


def test_verify_calls_a_negative_checkpoint_timestamp_negative(clean_store, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(clean_store, root)
    write_checkpoint(root, -1)
    rc, out, err = run("verify", root)
    assert rc == 1
    assert "checkpoint: checkpoint: physic_msg_timestamp -1 is negative" in out.splitlines()


def test_verify_names_each_damage_at_its_file_and_offset(clean_store, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(clean_store, root)
    cut(cq_file(root, "LogTopic", "0"), 200)                    # a whole number of units
    forged_file = cq_file(root, "OrderTopic", "1", i=-1)
    forged = _forge_past_end(forged_file)
    os.remove(cq_file(root, "PayTopic", "0"))
    (root / "abort").write_bytes(b"")
    rc, out, err = run("verify", root, "--json")
    assert rc == 1, err
    found = {(p["kind"], p["file"], p["offset"]): p["detail"]
             for p in json.loads(out)["problems"]}
    log_q = os.path.join("consumequeue", "LogTopic", "0", "%020d" % 0)
    assert "200 bytes" in found[("consumequeue", log_q, -1)]
    assert "missing" in found[("consumequeue", log_q, 200)]
    order_q = os.path.relpath(forged_file, root)
    assert "past where the queue ends" in found[("consumequeue", order_q, forged)]
    assert any(kind == "consumequeue" and f.startswith(os.path.join("consumequeue", "PayTopic",
                                                                    "0"))
               and "missing" in detail for (kind, f, _), detail in found.items())
    assert "abnormal recovery" in found[("abort", "abort", -1)]
