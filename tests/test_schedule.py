# SPDX-License-Identifier: Apache-2.0
"""Delayed delivery (services/schedule.py), as 4.9.8's ScheduleMessageService."""
import base64
import dataclasses
import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from rocketstore import MessageStore, testing
from rocketstore import format as F
from rocketstore.config import StoreConfig
from rocketstore.config_manager import parse_fastjson
from rocketstore.errors import ConfigError
from rocketstore.message import (Message, MessageExt, properties_to_string,
                                 string_to_properties, tags_code_of)
from rocketstore.services.schedule import DELAY_FOR_A_WHILE_MS, IDLE_WAIT_MS, message_timeup
from rocketstore.clock import ManualClock

from broker_data import DATA
from crashers.ha_node import node_config

REF = os.path.join(DATA, "delay")
T0 = 1_800_000_000_000
HERE = os.path.dirname(os.path.abspath(__file__))



def config(root, levels="1s 2s", **kw):
    kw = {"mapped_file_size_commit_log": 1 << 20,
          "mapped_file_size_consume_queue": 1000 * 20, **kw}
    return StoreConfig(store_path_root_dir=str(root), message_delay_level=levels, **kw)


def open_store(root, backend, clock=None, levels="1s 2s", **kw):
    store = MessageStore(root, config(root, levels, **kw), clock=clock, kernels=backend)
    store.load()
    store.start()
    return store


def delayed(i, level=1, topic="RealTopic", queue_id=None, **kw):
    return Message(topic, f"body-{i}".encode(), tags=f"T{i % 3}", keys=f"k{i}",
                   queue_id=i % 2 if queue_id is None else queue_id,
                   properties={"DELAY": str(level), "UNIQ_KEY": f"U{i:06d}"},
                   born_timestamp=T0 - 5, **kw)


def real_bodies(store, topic="RealTopic", queues=(0, 1)):
    out = []
    for q in queues:
        off = store.get_min_offset_in_queue(topic, q)
        while off < store.get_max_offset_in_queue(topic, q):
            r = store.get_message("g", topic, q, off, 256)
            out += [bytes(m.body) for m in r.messages]
            off = r.next_begin_offset
    return out


def schedule_count(store, level):
    return store.get_max_offset_in_queue(F.SCHEDULE_TOPIC, level - 1)


# ---- message_delay_level --------------------------------------------------------------------
def test_message_delay_level_parses_every_unit():
    cfg = StoreConfig(message_delay_level="1s 2m 3h 1d")
    assert cfg.delay_levels == [1000, 120_000, 3 * 3_600_000, 86_400_000]
    assert StoreConfig().max_delay_level == 18


@pytest.mark.parametrize("text", ["1s  2s", "1x", "s", "1.5s", "1s 2", ""])
def test_a_bad_message_delay_level_is_a_config_error(text):
    with pytest.raises(ConfigError, match="message_delay_level"):
        StoreConfig(message_delay_level=text)


# ---- delivery -------------------------------------------------------------------------------
def test_delay_level_1_messages_are_delivered_within_a_few_seconds(tmp_path, backend):
    store = open_store(tmp_path / "s", backend)
    try:
        for i in range(5):
            assert store.put_message(delayed(i)).ok
        assert real_bodies(store) == []             # moved to SCHEDULE_TOPIC_XXXX at put
        assert schedule_count(store, 1) == 5
        testing.wait_until(lambda: len(real_bodies(store)) == 5, 10,
                           "the 5 delayed messages to be delivered")
        assert sorted(real_bodies(store)) == sorted(f"body-{i}".encode() for i in range(5))
        assert store.delay_offsets.get_offset(1) == 5
    finally:
        store.shutdown()


def test_a_level_with_nothing_past_its_offset_waits_its_delay_at_most_a_second(tmp_path,
                                                                              backend):
    """A level whose queue holds nothing past its offset runs next after its delay (at most
    IDLE_WAIT_MS) rather than 100 ms: whatever is put meanwhile is due a delay after the
    put at the earliest, so that run still comes in time. Once a unit waits, 100 ms again."""
    clock = ManualClock(T0)
    store = open_store(tmp_path / "s", backend, clock, levels="1s 5s")
    svc = store.schedule_message_service
    try:
        assert svc.execute_on_timeup(1) == 1000             # empty: its delay, 1 s
        assert svc.execute_on_timeup(2) == IDLE_WAIT_MS     # 5 s, capped
        assert store.put_message(delayed(0, level=1)).ok    # due at T0 + 1000
        store.catch_up()
        assert svc.execute_on_timeup(1) == DELAY_FOR_A_WHILE_MS     # waiting: every 100 ms
        clock.now = T0 + 1000
        assert svc.execute_on_timeup(1) == 1000             # delivered: empty again
        assert real_bodies(store) == [b"body-0"]
    finally:
        store.shutdown()


def test_a_unit_is_delivered_only_when_its_time_has_come(tmp_path, backend):
    clock = ManualClock(T0)
    store = open_store(tmp_path / "s", backend, clock)
    svc = store.schedule_message_service
    try:
        store.put_message(delayed(0, level=2))          # due at T0 + 2000
        clock.now = T0 + 1999
        svc.deliver_due()
        assert real_bodies(store) == []
        clock.now = T0 + 2000
        svc.deliver_due()
        assert real_bodies(store) == [b"body-0"]
    finally:
        store.shutdown()


def _set_tags_code(store, level, queue_offset, value):
    cq = store.find_consume_queue(F.SCHEDULE_TOPIC, level - 1)
    f = cq.mfq.find_by_offset(queue_offset * 20)
    struct.pack_into(">q", f.mm, queue_offset * 20 - f.file_from_offset + 12, value)


def test_a_tags_code_beyond_now_plus_the_delay_is_taken_as_now(tmp_path, backend):
    clock = ManualClock(T0)
    store = open_store(tmp_path / "s", backend, clock)
    svc = store.schedule_message_service
    try:
        for i in range(3):
            store.put_message(delayed(i, level=2))
        store.get_max_offset_in_queue("RealTopic", 0)           # dispatched
        # Unit 0: a TAGS hash far in the future (what 4.9.8's abnormal recovery writes):
        # beyond now + 2 s, so correctDeliverTimestamp makes it due now. Unit 1: within
        # now + 2 s, so it waits, and unit 2 behind it waits too.
        _set_tags_code(store, 2, 0, T0 + 10 ** 9)
        _set_tags_code(store, 2, 1, T0 + 2000)
        svc.deliver_due()
        assert real_bodies(store) == [b"body-0"]
        assert store.delay_offsets.get_offset(2) == 1
        clock.now = T0 + 2000
        svc.deliver_due()
        assert sorted(real_bodies(store)) == [b"body-0", b"body-1", b"body-2"]
    finally:
        store.shutdown()


def test_delivered_record_has_the_properties_and_flags_message_timeup_builds(tmp_path,
                                                                             backends):
    records = []
    for backend in backends:
        clock = ManualClock(T0)
        store = open_store(tmp_path / backend.__name__, backend, clock)
        try:
            msg = delayed(7, level=1, queue_id=1, flag=5, sys_flag=F.TRANSACTION_COMMIT_TYPE,
                          reconsume_times=2, prepared_transaction_offset=999,
                          born_host=("2001:db8::7", 4000), store_host=("10.9.8.7", 10911))
            msg.properties["WAIT"] = "true"
            r = store.put_message(msg)
            assert r.ok
            src = store.look_message_by_offset(r.commit_log_offset)
            assert src.topic == F.SCHEDULE_TOPIC and src.queue_id == 0
            clock.now = T0 + 5000
            assert store.schedule_message_service.deliver_due() == 1
            got = store.get_message("g", "RealTopic", 1, 0).messages
            assert len(got) == 1
            out = got[0]
            # The stored string is the scheduled one re-read into a HashMap and written in its
            # order before DELAY is cleared: DELAY, REAL_TOPIC and REAL_QID stay; WAIT stays
            # "true" (setWaitStoreMsgOK(false) changes only the map).
            assert out.properties_string == properties_to_string(
                string_to_properties(src.properties_string))
            props = out.properties
            assert props["DELAY"] == "1" and props["REAL_TOPIC"] == "RealTopic"
            assert props["REAL_QID"] == "1" and props["WAIT"] == "true"
            assert (out.flag, out.sys_flag & ~F.BORNHOST_V6_FLAG, out.reconsume_times) == \
                (5, F.TRANSACTION_COMMIT_TYPE, 2)
            assert out.sys_flag & F.BORNHOST_V6_FLAG
            assert out.prepared_transaction_offset == 0
            assert (out.born_timestamp, out.born_host, out.store_host) == \
                (T0 - 5, ("2001:db8::7", 4000), ("10.9.8.7", 10911))
            assert out.store_timestamp == T0 + 5000
            cq = store.find_consume_queue("RealTopic", 1).units(0, 1)
            assert int(cq["tags_code"][0]) == tags_code_of("T1")
            # Index and unique key follow the put path.
            assert [m.body for m in store.query_message("RealTopic", "k7").messages] == \
                [b"body-7"]
            rec = store.commitlog.get_message_bytes(out.commit_log_offset)
            records.append(rec)
        finally:
            store.shutdown()
    assert all(r == records[0] for r in records)


def test_a_real_topic_of_rmq_sys_trans_half_topic_is_discarded_and_the_level_goes_on(
        tmp_path, backend):
    clock = ManualClock(T0)
    store = open_store(tmp_path / "s", backend, clock)
    try:
        store.put_message(delayed(0, topic="RMQ_SYS_TRANS_HALF_TOPIC", queue_id=0))
        store.put_message(delayed(1, queue_id=0))
        clock.now = T0 + 1000
        store.schedule_message_service.deliver_due()
        assert real_bodies(store) == [b"body-1"]
        assert store.get_max_offset_in_queue("RMQ_SYS_TRANS_HALF_TOPIC", 0) == 0
        assert store.delay_offsets.get_offset(1) == 2
    finally:
        store.shutdown()


def test_a_refused_put_keeps_the_offset_and_is_retried(tmp_path, backend):
    clock = ManualClock(T0)
    store = open_store(tmp_path / "s", backend, clock)
    svc = store.schedule_message_service
    try:
        for i in range(3):
            store.put_message(delayed(i))
        clock.now = T0 + 1000
        store.running_flags.get_and_make_not_writeable()        # puts answer NOT_AVAILABLE
        svc.deliver_due()
        assert real_bodies(store) == [] and store.delay_offsets.get_offset(1) == 0
        store.running_flags.get_and_make_writeable()
        svc.deliver_due()
        assert sorted(real_bodies(store)) == [b"body-0", b"body-1", b"body-2"]
        assert store.delay_offsets.get_offset(1) == 3
    finally:
        store.shutdown()


def test_a_record_with_an_unusable_real_topic_is_skipped_and_the_level_goes_on(tmp_path,
                                                                              backend):
    clock = ManualClock(T0)
    store = open_store(tmp_path / "s", backend, clock)
    try:
        # Written straight to the schedule queue (no DELAY: its tagsCode is 0, due at once).
        for bad in ({"REAL_TOPIC": "no/slashes", "REAL_QID": "0"},
                    {"REAL_TOPIC": "RealTopic", "REAL_QID": "x"},
                    {"REAL_QID": "0"}):
            assert store.put_message(Message(F.SCHEDULE_TOPIC, b"bad", queue_id=0,
                                             properties=bad)).ok
        store.put_message(delayed(1, queue_id=0))
        clock.now = T0 + 1000
        store.schedule_message_service.deliver_due()
        assert real_bodies(store) == [b"body-1"]
        assert store.delay_offsets.get_offset(1) == 4
        assert store.schedule_message_service.skipped == 3
    finally:
        store.shutdown()


def test_a_run_delivers_past_the_batch_byte_bound(tmp_path, backend, monkeypatch):
    from rocketstore.services import schedule
    monkeypatch.setattr(schedule, "DELIVER_BATCH_BYTES", 300)
    monkeypatch.setattr(schedule, "DELIVER_BATCH", 7)
    clock = ManualClock(T0)
    store = open_store(tmp_path / "s", backend, clock)
    try:
        store.put_messages([delayed(i) for i in range(50)])
        clock.now = T0 + 1000
        assert store.schedule_message_service.deliver_due() == 50
        assert sorted(real_bodies(store)) == sorted(f"body-{i}".encode() for i in range(50))
    finally:
        store.shutdown()


def _scheduled_record(props):
    from rocketstore import kernels
    rec = bytearray(600)
    size = kernels.resolve("pure").msg_encode(
        rec, 0, F.SCHEDULE_TOPIC.encode(), b"x", props.encode(), 0, 0, 0, 0, 0, 0,
        b"\x7f\0\0\1\0\0\0\1", 0, b"\x7f\0\0\1\0\0\0\1", 0, 0)
    return MessageExt.decode(bytes(rec[:size]))


def test_message_timeup_keeps_a_value_holding_the_name_value_separator():
    # string2messageProperties splits a segment at its first \x01 only; the rest, \x01
    # included, is the value, and messageProperties2String writes it back unchanged.
    props = "a\x01x\x01y\x02DELAY\x011\x02REAL_TOPIC\x01T\x02REAL_QID\x010"
    m = message_timeup(_scheduled_record(props))
    assert string_to_properties(m.properties_string)["a"] == "x\x01y"
    assert sorted(m.properties_string.split("\x02")) == sorted(props.split("\x02"))
    assert (m.topic, m.queue_id) == ("T", 0)


def test_message_timeup_refuses_a_record_without_its_real_queue():
    with pytest.raises(ValueError, match="REAL_QID"):
        message_timeup(_scheduled_record("DELAY\x011\x02REAL_TOPIC\x01T"))


# ---- byte identity with 4.9.8 ---------------------------------------------------------------
def _mask_store_timestamp(rec):
    b = bytearray(rec)
    sys_flag = struct.unpack_from(">i", b, F.POS_SYSFLAG)[0]
    p = F.POS_BORNHOST + (20 if sys_flag & F.BORNHOST_V6_FLAG else 8)
    b[p:p + 8] = bytes(8)
    return bytes(b)


def _reference_inputs():
    out = []
    with open(os.path.join(REF, "delay_inputs.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            out.append(Message(
                j["topic"], base64.b64decode(j["body"]), queue_id=j["queueId"], flag=j["flag"],
                properties=dict(j["properties"]), born_timestamp=j["bornTimestamp"],
                born_host=(j["bornHost"], j["bornPort"]),
                store_host=(j["storeHost"], j["storePort"]), sys_flag=j["sysFlag"],
                reconsume_times=j["reconsumeTimes"],
                prepared_transaction_offset=j["preparedTransactionOffset"]))
    return out


def test_delivered_records_are_byte_identical_to_a_4_9_8_store(tmp_path, backend):
    """tests/data/delay: 40 delayed messages (levels 1 and 2, and 5 clamped to 2; TAGS or
    not, 22 user properties, IPv6 hosts, COMMIT and COMPRESSED flags, WAIT) put into a real
    4.9.8 store with messageDelayLevel "1s 3s", and every CommitLog record after its
    ScheduleMessageService delivered them all. Same inputs here: every record, scheduled and
    delivered, is the same bytes at the same offset, store timestamps aside."""
    with open(os.path.join(REF, "delay_java_commitlog.jsonl")) as f:
        java = [json.loads(line) for line in f]
    clock = ManualClock(T0)
    store = open_store(tmp_path / "s", backend, clock, levels="1s 3s",
                       mapped_file_size_commit_log=4 << 20)
    svc = store.schedule_message_service
    try:
        for m in _reference_inputs():
            assert store.put_message(m).ok
        clock.now = T0 + 1000           # level 1 first, as the Java store delivered them
        svc.deliver_due()
        clock.now = T0 + 3000
        svc.deliver_due()
        ours = []
        off = 0
        while off < store.get_max_phy_offset():
            rec = store.commitlog.get_message_bytes(off)
            ours.append((off, rec))
            off += len(rec)
        offsets = dict(store.delay_offsets.offset_table)
    finally:
        store.shutdown()
    assert len(ours) == len(java) == 80
    for (off, rec), j in zip(ours, java):
        assert off == j["offset"]
        assert _mask_store_timestamp(rec) == \
            _mask_store_timestamp(base64.b64decode(j["record"])), f"record at {off}"
    with open(os.path.join(REF, "delay_java_delayOffset.json")) as f:
        java_offsets = {int(k): v for k, v in json.load(f)["offsetTable"].items()}
    assert offsets == java_offsets == {1: 27, 2: 13}


# ---- progress: restart and crash -----------------------------------------------------------
def test_restart_resumes_from_delay_offset_json(tmp_path, backend):
    root = tmp_path / "s"
    clock = ManualClock(T0)
    store = open_store(root, backend, clock)
    try:
        for i in range(4):
            store.put_message(delayed(i))
        clock.now = T0 + 5000
        for i in range(4, 10):
            store.put_message(delayed(i))           # due at T0 + 6000
        clock.now = T0 + 5500
        store.schedule_message_service.deliver_due()
        assert len(real_bodies(store)) == 4
    finally:
        store.shutdown()
    with open(root / "config" / "delayOffset.json") as f:
        text = f.read()
    assert parse_fastjson(text) == {"offsetTable": {"1": 4}}
    assert text == '{\n\t"offsetTable":{1:4\n\t}\n}'            # fastjson's own layout
    clock.now = T0 + 6000
    store = open_store(root, backend, clock)
    try:
        assert store.delay_offsets.get_offset(1) == 4
        store.schedule_message_service.deliver_due()
        bodies = real_bodies(store)
        assert sorted(bodies) == sorted(f"body-{i}".encode() for i in range(10))
    finally:
        store.shutdown()


def test_an_offset_past_the_schedule_queue_is_corrected_on_start(tmp_path, backend):
    root = tmp_path / "s"
    store = open_store(root, backend, ManualClock(T0))
    store.put_message(delayed(0))
    store.shutdown()
    os.makedirs(root / "config", exist_ok=True)
    with open(root / "config" / "delayOffset.json", "w") as f:
        f.write('{"offsetTable":{"1":50,"2":0}}')               # Gson's form, as a broker's
    store = open_store(root, backend, ManualClock(T0))
    try:
        assert store.delay_offsets.get_offset(1) == 1
    finally:
        store.shutdown()


_CRASH_CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[3])
from test_schedule import delayed, open_store
store = open_store(sys.argv[1], sys.argv[2], levels="1s 2s", flush_delay_offset_interval=100)
first, end = int(sys.argv[4]), int(sys.argv[5])
for start in range(first, end, 1000):
    r = store.put_messages([delayed(i) for i in range(start, min(end, start + 1000))])
    assert r.ok
print("up", flush=True)
time.sleep(60)
"""


def _written_units(root):
    """Bytes of units written to RealTopic queue 0's files (files are preallocated with
    zeros; a unit is never all zeros)."""
    qdir = root / "consumequeue" / "RealTopic" / "0"
    total = 0
    for name in sorted(os.listdir(qdir)) if qdir.exists() else []:
        try:
            with open(qdir / name, "rb") as f:
                total += len(f.read().rstrip(b"\0"))
        except FileNotFoundError:               # a file being made (.creating), renamed now
            continue
    return total


def _kill_mid_delivery(root, name, first, end, rng):
    """Run a child store on `root`, putting delayed messages `first`..`end`-1, and SIGKILL it
    a random few ms after its first delivery reached the real queue's file. The child always
    has messages of its own to deliver: a child with none might never write a unit (a slow
    parent can let the child before it deliver everything before the kill)."""
    before = _written_units(root)
    child = subprocess.Popen([sys.executable, "-c", _CRASH_CHILD, str(root), name, HERE,
                              str(first), str(end)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        testing.wait_until(lambda: _written_units(root) > before, 30,
                           "the child to start delivering")
        time.sleep(rng.random() * 0.1)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


@pytest.mark.slow
def test_sigkill_during_delivery_delivers_every_message_at_least_once(tmp_path, backend):
    """A child puts N messages with DELAY=1 and is killed while its service delivers them
    (offsets persisted every 100 ms); a second child resumes, puts a few more, and is killed
    too; reopened, the store delivers the rest. Every message is in its real queue at least
    once; duplicates are allowed (at least once), none is missing (never zero times)."""
    root = tmp_path / "s"
    n, more = 40_000, 2_000
    name = getattr(backend, "NAME", "cext")
    rng = __import__("random").Random(testing.fixed_seed("schedule-kill"))
    _kill_mid_delivery(root, name, 0, n, rng)
    counts = []
    store = MessageStore(root, config(root), kernels=backend)
    store.load()                                # not started: count what the kill left
    try:
        counts.append((len(real_bodies(store)), store.delay_offsets.get_offset(1)))
    finally:
        store.shutdown()
    _kill_mid_delivery(root, name, n, n + more, rng)
    store = open_store(root, backend)
    try:
        testing.wait_until(lambda: store.delay_offsets.get_offset(1) == n + more, 60,
                           "the reopened store to deliver the rest")
        bodies = real_bodies(store)
    finally:
        store.shutdown()
    print(f"after the first kill: {counts[0][0]} in real queues, delay offset "
          f"{counts[0][1]} of {n}; in the end {len(bodies)} (duplicates: "
          f"{len(bodies) - n - more})")
    assert set(bodies) == {f"body-{i}".encode() for i in range(n + more)}


# ---- master only -----------------------------------------------------------------------------
def test_a_slave_never_delivers_and_receives_the_masters_deliveries(tmp_path, backend):
    clock = ManualClock(T0)
    mcfg = dataclasses.replace(node_config("ASYNC_MASTER"), message_delay_level="1s 2s")
    master = MessageStore(tmp_path / "m", mcfg, clock=clock, kernels=backend)
    master.load()
    master.start()
    slave = None
    try:
        scfg = dataclasses.replace(node_config("SLAVE",
                                               master=f"127.0.0.1:{master.ha_service.port}"),
                                   message_delay_level="1s 2s")
        # The slave's clock is far past every due time: were it to deliver, it would.
        slave = MessageStore(tmp_path / "sl", scfg, clock=lambda: T0 + 10 ** 9,
                             kernels=backend)
        slave.load()
        slave.start()
        assert slave.schedule_message_service is None
        assert master.schedule_message_service is not None
        for i in range(6):
            assert master.put_message(delayed(i)).ok
        end = master.get_max_phy_offset()
        testing.wait_until(lambda: slave.get_max_phy_offset() == end, 20,
                           "the slave to replicate the scheduled messages")
        testing.wait_until(lambda: schedule_count(slave, 1) == 6, 10, "the slave's dispatch")
        time.sleep(1.5 + DELAY_FOR_A_WHILE_MS / 1000)       # a master would have run by now
        assert real_bodies(slave) == []
        assert not os.path.exists(tmp_path / "sl" / "config" / "delayOffset.json")
        clock.now = T0 + 1000
        master.schedule_message_service.deliver_due()
        assert len(real_bodies(master)) == 6
        end = master.get_max_phy_offset()
        testing.wait_until(lambda: slave.get_max_phy_offset() == end, 20,
                           "the slave to replicate the deliveries")
        testing.wait_until(lambda: len(real_bodies(slave)) == 6, 10, "the slave's dispatch")
        assert sorted(real_bodies(slave)) == sorted(real_bodies(master))
    finally:
        if slave is not None:
            slave.shutdown()
        master.shutdown()


def test_batch_delivery_writes_the_records_of_the_reference_path_with_declined_ones_in_place(
        backends, tmp_path):
    """The compiled backend encodes the common case in bulk (rs_timeup_encode) and sends the
    rest -- non-ASCII properties, more than 8 of them, a transaction-half real topic -- through
    the reference path in their place: the CommitLog bytes and queue order equal the pure
    backend's, and the level's offset passes every unit."""
    def batch(k):
        msgs = []
        for i in range(k):
            m = delayed(i, topic=f"RealTopic{i % 3}", queue_id=i % 4)
            if i % 11 == 3:
                m.properties = {**m.properties, "note": "caf\u00e9"}
            if i % 13 == 5:
                m.properties = {**m.properties, **{f"p{j}": str(j) for j in range(9)}}
            if i == 40:
                m.topic = "RMQ_SYS_TRANS_HALF_TOPIC"
            msgs.append(m)
        return msgs
    digests = []
    for be in backends:
        clock = ManualClock(T0)
        store = open_store(tmp_path / be.NAME, be, clock)
        try:
            msgs = batch(600)
            for i in range(0, 600, 100):
                assert store.put_messages(msgs[i:i + 100]).ok
            store.catch_up()
            clock.now = T0 + 1000
            assert store.schedule_message_service.deliver_due() == 599
            store.catch_up()
            assert store.delay_offsets.get_offset(1) == 600
            records = []
            for t in range(3):
                for q in range(4):
                    r = store.get_message("g", f"RealTopic{t}", q, 0, 1000)
                    records += [(m.queue_offset,
                                 bytes(store.commitlog.get_message_bytes(m.commit_log_offset)))
                                for m in r.messages]
            assert len(records) == 599
            batched = store.schedule_message_service.batched
            if hasattr(be, "timeup_encode"):    # both paths ran, each in its place
                assert 0 < batched < 599
            else:
                assert batched == 0
            digests.append(records)
        finally:
            store.shutdown()
    assert all(d == digests[0] for d in digests[1:])


def _reference_delivered(rec):
    """The delivered record's bytes by the reference path (MessageExt.decode, message_timeup,
    CommitLog's encode of a DeliveredMessage), or None where that path declines it."""
    from rocketstore import kernels
    try:
        m = message_timeup(MessageExt.decode(rec))
    except Exception:
        return None
    sys_flag = m.sys_flag & ~(F.BORNHOST_V6_FLAG | F.STOREHOSTADDRESS_V6_FLAG)
    sys_flag |= F.BORNHOST_V6_FLAG if len(m.born_host_raw) == F.HOST_V6_LENGTH else 0
    sys_flag |= F.STOREHOSTADDRESS_V6_FLAG if len(m.store_host_raw) == F.HOST_V6_LENGTH else 0
    out = bytearray(len(rec) + 512)
    try:
        size = kernels.resolve("pure").msg_encode(
            out, 0, m.topic.encode(), m.body, m.properties_string.encode(), m.queue_id, m.flag,
            0, 0, sys_flag, m.born_timestamp, m.born_host_raw, 0, m.store_host_raw,
            m.reconsume_times, 0)
    except Exception:
        return None
    return bytes(out[:size])


def test_timeup_encode_writes_the_reference_bytes_or_declines_damaged_records(backends):
    """rs_timeup_encode against the reference path on a scheduled record, each of its
    truncations and byte-flipped copies: it writes the reference path's bytes, or stops at
    the record (SLOW, or TOPIC for a real topic it was not given), never reading past it."""
    import numpy as np
    from rocketstore.services import schedule
    compiled = [b for b in backends if hasattr(b, "timeup_encode")]
    assert compiled or "cext" not in [b.NAME for b in backends]
    props = ("UNIQ_KEY\x01U1\x02DELAY\x011\x02TAGS\x01T\x02REAL_QID\x013\x02"
             "REAL_TOPIC\x01Real\x02KEYS\x01k1 k2\x02\x01x\x02ab")
    rec = bytearray(600)
    from rocketstore import kernels
    size = kernels.resolve("pure").msg_encode(
        rec, 0, F.SCHEDULE_TOPIC.encode(), b"body", props.encode(), 2, 7, 0, 0, 0, T0,
        b"\x7f\0\0\1\0\0\0\1", T0, b"\x0a\0\0\2\0\0\0\2", 3, 0)
    good = bytes(rec[:size])
    rng = __import__("random").Random(testing.fixed_seed("timeup-encode"))
    cases = [good] + [good[:n] for n in range(size)]
    for _ in range(3000):
        bad = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            bad[rng.randrange(size)] = rng.randrange(256)
        cases.append(bytes(bad))
    topics = b"Real"
    topic_off = np.array([0, 4], dtype=np.int64)
    wrote = 0
    for k in compiled:
        for case in cases:
            out = bytearray(len(case) + 512)
            out_size = np.zeros(1, dtype=np.int32)
            out_key = np.zeros(1, dtype=np.int64)
            reason, stop, end, _ = k.timeup_encode(
                case, np.zeros(1, dtype=np.int64), np.array([len(case)], dtype=np.int32), 0, 1,
                topics, topic_off, 1 << 20, 1 << 20, out, 0, out_size, out_key)
            want = _reference_delivered(case)
            if reason == schedule.TIMEUP_DONE:
                assert stop == 1 and end == out_size[0]
                assert bytes(out[:end]) == want
                assert out_key[0] >> 32 == 0
                wrote += 1
            else:
                assert reason in (schedule.TIMEUP_SLOW, schedule.TIMEUP_TOPIC)
                assert stop == 0 and end == 0
        assert wrote > 1            # the intact record, and copies damaged where it still holds


def test_a_batch_cut_short_by_a_full_disk_resumes_where_it_stopped(tmp_path, backend):
    """The disk refuses CommitLog space in the middle of a run's batch: what was stored keeps
    its queue offsets and the level's offset stops after it; healed, the next run delivers the
    rest, each message once and with no gap in its real queue."""
    import errno
    fs = testing.FaultInjectingFileSystem()
    clock = ManualClock(T0)
    store = MessageStore(tmp_path / "s", config(tmp_path / "s"), clock=clock, kernels=backend,
                         fs=fs)
    store.load()
    store.start()
    n = 600
    try:
        for i in range(0, n, 100):
            assert store.put_messages([Message("RealTopic", bytes(3000), keys=f"k{j}",
                                               queue_id=j % 2, properties={"DELAY": "1"})
                                       for j in range(i, i + 100)]).ok
        store.catch_up()
        fs.fail("reserve", errno.ENOSPC, match=os.sep + "commitlog" + os.sep)
        fs.fail("create", errno.ENOSPC, match=os.sep + "commitlog" + os.sep)
        clock.now = T0 + 1000
        first = store.schedule_message_service.deliver_due()
        assert 0 < first < n
        assert store.delay_offsets.get_offset(1) == first
        fs.heal()
        store.running_flags.get_and_make_disk_ok()  # as the disk check does once space is back
        assert store.schedule_message_service.deliver_due() == n - first
        assert store.delay_offsets.get_offset(1) == n
        keys = []
        for q in (0, 1):
            r = store.get_message("g", "RealTopic", q, 0, 1000)
            assert [m.queue_offset for m in r.messages] == list(range(n // 2))
            keys += [m.keys for m in r.messages]
        assert sorted(keys) == sorted(f"k{j}" for j in range(n))
    finally:
        store.shutdown()
