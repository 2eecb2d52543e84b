# SPDX-License-Identifier: Apache-2.0
"""Against a store written by Apache RocketMQ 4.9.8 (tests/data/rmq-4.9.8-basic)."""
import os
import subprocess
import sys

from rocketstore import Message, MessageStore
from rocketstore.clock import ReplayClock
from rocketstore.message import string_to_properties

from broker_data import BASIC, INSERTION_ORDER, broker_config, broker_messages, tree_bytes


def replay(root, backend):
    """Put the broker's exact inputs with its exact store timestamps."""
    msgs = broker_messages()
    clock = ReplayClock([m["storeTimestamp"] for m in msgs])
    with MessageStore(root, broker_config(), clock=clock, kernels=backend) as store:
        for m in msgs:
            props = string_to_properties(m["properties"])
            host, port = m["bornHost"].rsplit(":", 1)
            r = store.put_message(Message(
                m["topic"], bytes.fromhex(m["body"]), queue_id=m["queueId"], flag=m["flag"],
                properties={k: props[k] for k in INSERTION_ORDER if k in props},
                born_timestamp=m["bornTimestamp"], born_host=(host, int(port))))
            assert (r.commit_log_offset, r.queue_offset, r.msg_id) == \
                (m["commitLogOffset"], m["queueOffset"], m["msgId"])


def test_dump_of_broker_store_equals_the_brokers_own_record(broker_store):
    out = subprocess.run([sys.executable, "-m", "rocketstore", "dump", str(broker_store)],
                         check=True, capture_output=True, text=True).stdout
    with open(os.path.join(BASIC, "messages.jsonl")) as f:
        expected = f.read().splitlines()
    assert out.splitlines() == expected


def test_dump_never_modifies_the_store(broker_store):
    before = {sub: tree_bytes(broker_store, sub) for sub in ("commitlog", "consumequeue")}
    names = sorted(os.listdir(broker_store))
    subprocess.run([sys.executable, "-m", "rocketstore", "dump", str(broker_store)],
                   check=True, capture_output=True)
    assert sorted(os.listdir(broker_store)) == names
    for sub, files in before.items():
        assert tree_bytes(broker_store, sub) == files


def test_replay_of_broker_inputs_writes_the_brokers_bytes(tmp_path, backend):
    replay(tmp_path / "ours", backend)
    for sub in ("commitlog", "consumequeue"):
        ours = tree_bytes(tmp_path / "ours", sub)
        theirs = tree_bytes(os.path.join(BASIC, "store"), sub)
        assert sorted(ours) == sorted(theirs)
        for name in theirs:
            assert ours[name] == theirs[name], f"{sub}/{name} differs"
    # Index files are named by creation time, so only their contents (in name order) compare.
    ours = tree_bytes(tmp_path / "ours", "index")
    theirs = tree_bytes(os.path.join(BASIC, "store"), "index")
    assert len(ours) == len(theirs) == 6
    for i, (mine, broker) in enumerate(zip(sorted(ours), sorted(theirs))):
        assert ours[mine] == theirs[broker], f"index file {i} ({broker}) differs"
    # indexMsgTimestamp: the endTimestamp of the last full index file.
    with open(os.path.join(BASIC, "store", "checkpoint"), "rb") as f:
        broker_checkpoint = f.read()
    with open(tmp_path / "ours" / "checkpoint", "rb") as f:
        assert f.read()[16:24] == broker_checkpoint[16:24]


def test_broker_store_opens_and_serves_every_message(broker_store, backend):
    msgs = broker_messages()
    with MessageStore(broker_store, broker_config(), kernels=backend) as store:
        assert store.recovery_report.normal
        assert store.get_max_phy_offset() == 335689
        by_queue = {}
        for m in msgs:
            by_queue.setdefault((m["topic"], m["queueId"]), []).append(m)
        for (topic, qid), expected in by_queue.items():
            got = []
            offset = 0
            while True:
                r = store.get_message("g", topic, qid, offset, 32)
                if r.status.name != "FOUND":
                    assert r.status.name == "OFFSET_OVERFLOW_ONE"
                    break
                got.extend(r.messages)
                offset = r.next_begin_offset
            assert [(g.commit_log_offset, g.queue_offset, g.msg_id) for g in got] == \
                [(e["commitLogOffset"], e["queueOffset"], e["msgId"]) for e in expected]
            assert store.get_max_offset_in_queue(topic, qid) == len(expected)
        m = store.look_message_by_offset(msgs[-1]["commitLogOffset"])
        assert m.keys == msgs[-1]["keys"] and m.body.hex() == msgs[-1]["body"]
