# SPDX-License-Identifier: Apache-2.0
"""The read path's one-call walk (read_path.PyReadPath and the compiled ReadPath): messages
decoded from the record-check kernel's rows equal the stand-alone decoder's, properties come
on first use, reads from anywhere in a long queue match the old walk (bench/bench_read.py shows
their cost no longer grows with the backlog), get_batch's columns are get_message's results,
and body views keep their file mapped."""
import contextlib
import copy
import gc
import os
import pickle
import struct
import sys
import weakref

import numpy as np
import pytest

from rocketstore import GetMessageStatus as G, Message, MessageExt, testing
from rocketstore import format as F, read_path
from rocketstore.errors import StoreClosedError, StoreError
from rocketstore.read_path import PyReadPath, make_read_path
from rocketstore.clock import ManualClock
from rocketstore.message import PY_LAZY_FIELDS, compressed_message

NOW = 1_700_000_000_000

# Every MessageExt attribute a caller reads (properties_string and properties included).
FIELDS = ("store_size", "body_crc", "queue_id", "flag", "queue_offset", "commit_log_offset",
          "sys_flag", "born_timestamp", "born_host_raw", "store_timestamp", "store_host_raw",
          "reconsume_times", "prepared_transaction_offset", "body", "topic", "magic",
          "properties_string", "properties", "tags", "keys", "born_host", "store_host",
          "msg_id", "transaction_type")


def varied_messages(n=60, topic="ReadT"):
    """Messages that differ in every decoded field: tags, keys, properties (non-ASCII too),
    hosts (IPv6 among them), flags, empty and large bodies."""
    out = []
    for i in range(n):
        props = {"p%d" % (i % 5): "v" * (i % 7 + 1)}
        if i % 4 == 1:
            props["uni"] = "héllo-世界-%d" % i
        out.append(Message(
            topic, b"" if i % 9 == 0 else bytes([i % 256]) * (i * 37 % 3000),
            tags=None if i % 3 == 0 else "Tag%d" % (i % 4),
            keys=None if i % 5 == 0 else ["k%d" % i, "alt%d" % i],
            properties=props if i % 6 else None, flag=i % 3,
            born_timestamp=NOW + i, reconsume_times=i % 2,
            born_host=("::1", 4000 + i) if i % 7 == 3 else ("10.0.0.%d" % (i % 250), 9000),
            store_host=("fe80::2", 10911) if i % 11 == 4 else None))
    return out


def eager(store, phy, size):
    """The record at `phy`, decoded by the stand-alone decoder from a copy of its bytes."""
    mf = store.commitlog.mfq.find_by_offset(phy)
    rel = phy - mf.file_from_offset
    return MessageExt.decode(mf.mm[rel:rel + size])


def attrs(m):
    return {f: getattr(m, f) for f in FIELDS}


def pull_all(store, topic, queue_id=0, n=32, get=None):
    get = get or store.get_message
    out, offset = [], store.get_min_offset_in_queue(topic, queue_id)
    while True:
        g = get("g", topic, queue_id, offset, n)
        if g.status is not G.FOUND:
            return out
        out.append(g)
        offset = g.next_begin_offset


# ---- lazy properties --------------------------------------------------------------------------
def test_messages_from_the_read_path_equal_the_eager_decoder_with_properties_parsed_lazily(
        tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        msgs = varied_messages()
        assert all(store.put_message(m).ok for m in msgs)
        # DELAY moves a message to SCHEDULE_TOPIC_XXXX (a different topic, queue level - 1).
        assert store.put_message(Message("ReadT", b"later", properties={"DELAY": "3"})).ok
        got = [m for g in pull_all(store, "ReadT") for m in g.messages]
        got += store.get_message("g", F.SCHEDULE_TOPIC, 2, 0).messages
        assert len(got) == len(msgs) + 1
        for m in got:
            assert type(m) is MessageExt
            # Nothing of the properties is decoded until it is asked for.
            assert m._pstr is None and m._props is None
            ref = eager(store, m.commit_log_offset, m.store_size)
            assert attrs(m) == attrs(ref)
            assert m.to_dict(7) == ref.to_dict(7)
        assert got[-1].properties["REAL_TOPIC"] == "ReadT"
        assert got[5].properties["uni"] == "héllo-世界-5"
        assert [m.body for m in got[:-1]] == [bytes(m.body) for m in msgs]
        assert got[6].keys == "k6 alt6" and got[5].keys is None
        assert got[3].tags is None and got[1].tags == "Tag1"
    finally:
        store.shutdown()


LAZY_SLOTS = ("_crc", "_qoff", "_phy", "_bts", "_stored", "_body", "_praw", "_pstr", "_props")


def test_read_messages_keep_their_record_and_read_each_field_from_it_on_first_use(
        tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        msgs = varied_messages(40)
        msgs.append(compressed_message(Message("ReadT", b"squeeze " * 200, tags="z"), 64, 6))
        assert all(store.put_message(m).ok for m in msgs)
        got = [m for g in pull_all(store, "ReadT", n=7) for m in g.messages]
        again = [m for g in pull_all(store, "ReadT", n=7) for m in g.messages]
        assert len(got) == len(again) == len(msgs) and got[-1].compressed
        for m, m2 in zip(got, again):
            # Nothing that would be a new object is made before it is asked for.
            assert all(getattr(m, s) is None for s in LAZY_SLOTS)
            ref = eager(store, m.commit_log_offset, m.store_size)
            assert attrs(m) == attrs(ref)
            # The Python properties (a build without the compiled backend's LazyField) read
            # the same values from the same record.
            for name, prop in PY_LAZY_FIELDS.items():
                assert prop.__get__(m2, MessageExt) == getattr(ref, name), name
            # A copy or a pickle of a message read lazily, before and after its fields are
            # read, is the same message.
            for m3 in (m2, pickle.loads(pickle.dumps(m2)), copy.copy(m2)):
                assert attrs(m3) == attrs(ref)
        # The fields stay assignable, as MessageExt's slots were.
        m = again[0]
        m.queue_offset, m.body = 99, b"mine"
        assert (m.queue_offset, m.body, m.stored_body) == (99, b"mine", got[0].stored_body)
        assert again[-1].body == b"squeeze " * 200            # decompressed on first use
        assert got[-1].keep_stored().body == got[-1].stored_body == msgs[-1].body
    finally:
        store.shutdown()


def test_a_lazy_field_assigned_none_reads_back_none_not_the_record(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        assert store.put_message(Message("ReadT", b"body", tags="t")).ok
        fresh = lambda: pull_all(store, "ReadT", n=1)[0].messages[0]   # noqa: E731
        for name in PY_LAZY_FIELDS:
            m = fresh()
            setattr(m, name, None)
            assert getattr(m, name) is None, name
            # Through the Python property too (a build without the compiled LazyField), and
            # after a copy or a pickle.
            assert PY_LAZY_FIELDS[name].__get__(m, MessageExt) is None, name
            for m2 in (copy.copy(m), pickle.loads(pickle.dumps(m))):
                assert getattr(m2, name) is None, name
            # Assigning again takes the new value.
            setattr(m, name, 7)
            assert getattr(m, name) == 7, name
        # With its stored bytes dropped, an uncompressed message has no body either.
        m = fresh()
        m.stored_body = None
        assert m.body is None and m.queue_offset == 0
    finally:
        store.shutdown()


class _Token:
    """An object whose references a test counts; weakly referable."""


def test_a_freed_message_gives_back_what_its_fields_held(tmp_path, backend):
    """MessageExt is freed by the compiled backend's tp_dealloc when that backend is built
    (install_dealloc): a message read from a store or made by hand gives back every object
    its fields held; a subclass with slots of its own, __weakref__ and __del__ runs its
    finalizer once, clears its weak references and gives back both its fields and
    MessageExt's; a cycle through a message is collected."""
    store = testing.open_store(tmp_path / "s", backend)
    try:
        assert store.put_message(Message("Free", b"body", tags="t")).ok
        tok = _Token()
        base = sys.getrefcount(tok)
        for make in (lambda: store.get_message("g", "Free", 0, 0).messages[0],
                     lambda: MessageExt.__new__(MessageExt)):
            m = make()
            for name in MessageExt.__slots__:
                setattr(m, name, tok)
            assert sys.getrefcount(tok) == base + len(MessageExt.__slots__)
            del m
            assert sys.getrefcount(tok) == base
    finally:
        store.shutdown()
    finalized = []

    class Sub(MessageExt):
        __slots__ = ("extra", "__weakref__")

        def __del__(self):
            finalized.append(self.extra is tok)
    sub = Sub.__new__(Sub)
    sub.extra = sub.topic = sub.body = tok
    ref = weakref.ref(sub)
    del sub
    assert finalized == [True] and ref() is None and sys.getrefcount(tok) == base
    # A cycle: a message whose body refers back to it.
    m = MessageExt.__new__(MessageExt)
    holder = _Token()
    holder.m, m.body, m.topic = m, holder, tok
    ref = weakref.ref(holder)
    del m, holder
    gc.collect()
    assert ref() is None and sys.getrefcount(tok) == base


def test_install_dealloc_refuses_a_class_it_cannot_free_as_cpython_would():
    cext = pytest.importorskip("rocketstore.kernels._cext")
    cext.install_dealloc(MessageExt)              # installed at import: again is no change

    class WithDict:
        pass

    class WithDel:
        __slots__ = ("a",)

        def __del__(self):
            pass

    class Other:
        __slots__ = ("a",)
    for cls in (WithDict, WithDel, Other):
        with pytest.raises(TypeError):
            cext.install_dealloc(cls)


def test_every_backend_reads_the_same_messages_from_the_same_store(tmp_path):
    root = tmp_path / "s"
    store = testing.open_store(root, "cext")
    assert all(store.put_message(m).ok for m in varied_messages(120))
    store.shutdown()
    seen = {}
    for backend in testing.backend_params():
        store = testing.open_store(root, backend)
        try:
            seen[backend] = [
                (g.status, g.next_begin_offset, [m.to_dict() for m in g.messages])
                for g in pull_all(store, "ReadT", n=13)]
            seen[backend + "-iter"] = [m.to_dict() for m in store.iter_messages()]
            # get_batch's rows whole: the topic hash and the has-TAGS bit too, which the
            # compiled walk takes from the first record's topic and a TAGS search without
            # hashing (rs_msg_check_read), not as the record check computes them.
            batches = []
            for offset in range(0, 120, 13):
                with store.get_batch("g", "ReadT", 0, offset, 13) as b:
                    batches.append((b.status, b.next_begin_offset, b.rows.tobytes()))
            seen[backend + "-batch"] = batches
        finally:
            store.shutdown()
    first = seen["cext"]
    assert len(first) == 10 and sum(len(x[2]) for x in first) == 120
    for backend in testing.backend_params():
        assert seen[backend] == first
        assert seen[backend + "-iter"] == [d for x in first for d in x[2]]
        assert seen[backend + "-batch"] == seen["cext-batch"]
    rows = np.frombuffer(b"".join(x[2] for x in seen["cext-batch"]), dtype=F.SCAN_DTYPE)
    assert len(rows) == 120 and len(set(rows["topic_hash"].tolist())) == 1
    assert 0 < np.count_nonzero(rows["info"] & F.SCAN_INFO_HAS_TAGS) < 120


def test_decode_rows_refuses_rows_outside_its_buffer(backend):
    rp = make_read_path(backend)
    assert isinstance(rp, PyReadPath) != hasattr(backend, "ReadPath")
    rows = np.zeros(1, dtype=F.SCAN_DTYPE)
    rows["pos"] = 10
    rows["size"] = 100
    with pytest.raises(ValueError):
        rp.decode_rows(bytes(50), rows, 1)
    with pytest.raises(ValueError):
        rp.decode_rows(bytes(500), rows, 2)
    # Inside the buffer, but a field past its record's end.
    rows["body_off"] = 90
    rows["body_len"] = 20
    with pytest.raises(ValueError):
        rp.decode_rows(bytes(500), rows, 1)
    rows["body_len"] = 10
    # The row locates the record; the message's fields are read from the record's own bytes
    # (here zeros: BODYLENGTH 0, and the offsets 0), as for a row the kernel made.
    m = rp.decode_rows(bytes(500), rows, 1)[0]
    assert (m.store_size, m.body, m.queue_offset, m.commit_log_offset) == (100, b"", 0, 0)
    with pytest.raises(ValueError):
        rp.decode_rows(bytes(500), np.zeros(1, dtype=F.CQ_DTYPE), 1)


# ---- backlog ------------------------------------------------------------------------------------
def reference_walk(store, topic, queue_id, offset, n, message_filter=None):
    """get_message's walk as it was before the one-call read path: the queue's units read
    one by one, every record decoded by the stand-alone decoder. Filters, damaged records and
    removed files are not exercised here."""
    cq = store.consume_queue(topic, queue_id)
    max_off = cq.max_offset_in_queue
    out, q = [], offset
    while len(out) < n and q < max_off:
        unit = cq.units(q, 1)[0]
        q += 1
        if message_filter is not None and not message_filter(int(unit["tags_code"])):
            continue
        out.append(eager(store, int(unit["offset"]), int(unit["size"])))
    return out, q


def test_reads_from_the_middle_of_a_long_queue_match_the_old_walk(tmp_path, backend):
    # 2 000 units over twenty 100-unit ConsumeQueue files and many CommitLog files.
    store = testing.open_store(tmp_path / "s", backend)
    try:
        msgs = [Message("Long", b"%05d" % i + b"y" * (i % 200), tags="t%d" % (i % 3))
                for i in range(2000)]
        for i in range(0, 2000, 100):
            assert store.put_messages(msgs[i:i + 100]).ok
        testing.wait_dispatched(store)
        assert len(store.consume_queue("Long", 0).mfq.files) == 20
        assert len(store.commitlog.mfq.files) > 5

        tag1 = store.kernels.java_hash(b"t1")
        for offset, n, flt in [(0, 32, None), (1000, 32, None), (1090, 50, None),
                               (1999, 32, None), (1500, 700, None), (950, 40,
                                                                     lambda t: t == tag1)]:
            g = store.get_message("g", "Long", 0, offset, n, flt)
            want, next_offset = reference_walk(store, "Long", 0, offset, n, flt)
            assert g.status is G.FOUND
            assert [attrs(m) for m in g.messages] == [attrs(m) for m in want]
            assert g.next_begin_offset == next_offset
            b = store.get_batch("g", "Long", 0, offset, n, flt)
            assert b.next_begin_offset == next_offset
            assert b.commit_log_offset.tolist() == [m.commit_log_offset for m in want]
            b.release()
        assert store.get_message("g", "Long", 0, 2000).status is G.OFFSET_OVERFLOW_ONE
    finally:
        store.shutdown()


# ---- get_batch ----------------------------------------------------------------------------------
def batch_matches(b, g):
    assert (b.status, b.next_begin_offset, b.min_offset, b.max_offset) == \
        (g.status, g.next_begin_offset, g.min_offset, g.max_offset)
    assert b.suggest_pulling_from_slave == g.suggest_pulling_from_slave
    ms = g.messages
    assert len(b) == len(ms)
    for col, attr in [("commit_log_offset", "commit_log_offset"), ("size", "store_size"),
                      ("store_timestamp", "store_timestamp"), ("queue_offset", "queue_offset"),
                      ("born_timestamp", "born_timestamp"), ("queue_id", "queue_id"),
                      ("sys_flag", "sys_flag"), ("body_crc", "body_crc")]:
        assert getattr(b, col).tolist() == [getattr(m, attr) for m in ms], col
    assert b.tags_code.tolist() == [m.tags and tags_hash(m.tags) or 0 for m in ms]
    assert b.body_length.tolist() == [len(m.body) for m in ms]
    assert [bytes(v) for v in b.bodies()] == [m.body for m in ms]


def tags_hash(text):
    from rocketstore.message import java_string_hash
    return java_string_hash(text)


def test_get_batch_columns_equal_get_message_results(tmp_path, backend):
    # Store time stands still: the delayed message below never comes due, so the schedule
    # service never holds a file while the test checks that nothing is held.
    store = testing.open_store(tmp_path / "s", backend, clock=ManualClock(NOW))
    try:
        msgs = varied_messages(150, "Cols")
        assert all(store.put_message(m).ok for m in msgs)
        tag2 = tags_hash("Tag2")
        for offset in range(0, 150, 17):
            for n in (1, 7, 32, 200):
                for flt in (None, lambda t: t == tag2):
                    g = store.get_message("g", "Cols", 0, offset, n, flt)
                    with store.get_batch("g", "Cols", 0, offset, n, flt) as b:
                        batch_matches(b, g)
        # Statuses without messages come back the same way too.
        for offset in (-1, 150, 151):
            g = store.get_message("g", "Cols", 0, offset)
            b = store.get_batch("g", "Cols", 0, offset)
            assert (b.status, b.next_begin_offset, len(b)) == \
                (g.status, g.next_begin_offset, 0)
        g = store.get_message("g", "Empty", 0, 0)
        b = store.get_batch("g", "Empty", 0, 0)
        assert b.status is g.status is G.NO_MESSAGE_IN_QUEUE and len(b) == 0
        # tags_code is the unit's, as a filter sees it: a delayed message's delivery time.
        assert store.put_message(Message("Cols", b"later", tags="T",
                                         properties={"DELAY": "2"})).ok
        testing.wait_dispatched(store)
        unit = store.consume_queue(F.SCHEDULE_TOPIC, 1).units(0, 1)[0]
        with store.get_batch("g", F.SCHEDULE_TOPIC, 1, 0) as b:
            assert b.tags_code.tolist() == [int(unit["tags_code"])] != [tags_hash("T")]
        # Body views are read-only: the store's bytes cannot be written through them.
        b = store.get_batch("g", "Cols", 0, 1, 1)
        with pytest.raises(TypeError):
            b.body(0)[0] = 1
        b.release()
        # Nothing stays held once the batches are gone.
        gc.collect()
        # The store's own threads (reput, flush) hold a file for a moment while they read it.
        testing.wait_until(lambda: all(f.ref_count == 0 for f in store.commitlog.mfq.files),
                           what="every CommitLog file released")
    finally:
        store.shutdown()




def test_body_views_keep_their_file_held_and_mapped_after_the_store_deletes_it(tmp_path,
                                                                               backend):
    clock, disk = ManualClock(NOW), testing.FixedDiskUsage()
    cfg = testing.small_config(
        mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=10 * 20,
        file_reserved_time=1, delete_when=str((__import__("time").localtime(NOW / 1000)
                                              .tm_hour + 12) % 24),
        delete_commit_log_files_interval=0, delete_consume_queue_files_interval=0,
        destroy_maped_file_interval_forcibly=120_000, redelete_hanged_file_interval=1000)
    store = testing.open_store(tmp_path / "s", backend, config=cfg, clock=clock,
                               disk_usage=disk)
    try:
        bodies = [b"%03d" % i + b"z" * 200 for i in range(60)]
        assert all(store.put_message(Message("Held", body)).ok for body in bodies)
        testing.wait_dispatched(store)
        testing.wait_flushed(store.commitlog)
        b = store.get_batch("g", "Held", 0, 0, 5)
        first = store.commitlog.mfq.files[0]
        assert set(b.file_index.tolist()) == {0} and first.ref_count == 1
        views = b.bodies()
        assert [bytes(v) for v in views] == bodies[:5]
        del b                                 # the views alone keep the hold
        gc.collect()
        assert first.ref_count == 1
        disk.ratio = 0.86
        store.clean_files_periodically()
        assert os.path.exists(first.path) and not first.is_available
        # A file being destroyed lends no new hold: a batch over its units reads past it.
        again = store.get_batch("g", "Held", 0, 0, 5)
        assert first.ref_count == 1
        assert all(o >= first.file_from_offset + first.file_size
                   for o in again.commit_log_offset.tolist())
        again.release()
        clock.now = NOW + 120_000             # forced: the file goes while views live
        disk.ratio = 0.2
        assert store.clean_commitlog_service.redelete_hanged_file(clock.now)
        assert not os.path.exists(first.path)
        assert [bytes(v) for v in views] == bodies[:5]
        # A read now answers for what is left, and never from the deleted file.
        g = store.get_message("g", "Held", 0, store.get_min_offset_in_queue("Held", 0))
        assert all(m.commit_log_offset >= store.get_min_phy_offset() for m in g.messages)
        del views
        gc.collect()
        assert first.ref_count == 0
    finally:
        store.shutdown()


@contextlib.contextmanager
def _records_over_small_files(tmp_path, backend, topic, fill):
    """A store of 4 KiB CommitLog files holding 30 records of `topic` (bodies "000"+fill*300
    ...), dispatched and flushed (the flusher holds no file afterwards): (store, bodies)."""
    cfg = testing.small_config(mapped_file_size_commit_log=4096)
    store = testing.open_store(tmp_path / "s", backend, config=cfg)
    try:
        bodies = [b"%03d" % i + fill * 300 for i in range(30)]
        assert all(store.put_message(Message(topic, body)).ok for body in bodies)
        testing.wait_dispatched(store)
        # In the caller's thread, after the flusher's round (which takes every complete file
        # and may hold the last one while it syncs it): then nothing is left for it to hold.
        store.flush()
        yield store, bodies
    finally:
        store.shutdown()


def test_a_body_asked_for_after_a_forced_delete_raises_and_the_hold_is_released_once(
        tmp_path, backend):
    with _records_over_small_files(tmp_path, backend, "Gone", b"f") as (store, bodies):
        b = store.get_batch("g", "Gone", 0, 0, 3)
        first = store.commitlog.mfq.files[0]
        assert first.ref_count == 1
        # Forced at once: no view pins the pages, so the file is unmapped under the hold.
        assert first.try_destroy(NOW, 0)
        assert not os.path.exists(first.path)
        assert b.commit_log_offset.tolist()[:1] == [0]     # the columns are copies
        with pytest.raises(StoreError, match="deleted while this batch held it"):
            b.body(0)
        b.release()
        b.release()
        assert first.ref_count == 0


def test_a_released_batch_holds_nothing_and_its_views_stay_readable(tmp_path, backend):
    with _records_over_small_files(tmp_path, backend, "Rel", b"q") as (store, bodies):
        b = store.get_batch("g", "Rel", 0, 0, 30)
        held = {id(f): f for f in store.commitlog.mfq.files if f.ref_count}
        assert len(held) == len(set(b.file_index.tolist())) > 1
        views = b.bodies()
        b.release()
        b.release()                           # once only
        assert all(f.ref_count == 0 for f in held.values())
        first = store.commitlog.mfq.files[0]
        # The views still pin the pages: a destroy forced at once unlinks the file and
        # leaves the mapping to them.
        assert first.try_destroy(NOW, 0)
        assert not os.path.exists(first.path)
        assert [bytes(v) for v in views] == bodies
        del views
        # A released batch whose bodies were never viewed pins nothing at all.
        b = store.get_batch("g", "Rel", 0, 12, 3)
        second = store.commitlog.mfq.find_by_offset(int(b.commit_log_offset[0]))
        assert second is store.commitlog.mfq.files[1]
        assert b.file_index.tolist() == [0, 0, 0] and second.ref_count == 1
        b.release()
        assert second.ref_count == 0
        with pytest.raises(StoreError, match="released"):
            b.body(0)
        assert second.close(wait_s=0)         # unmapped at once, the batch still alive


def test_a_dropped_batch_releases_at_once_the_files_no_body_view_holds(tmp_path, backend):
    """A batch dropped without release() lets go of every file it held but those a body view
    was taken from, which stay held while the views live (no garbage collection needed: the
    result's files go with it)."""
    with _records_over_small_files(tmp_path, backend, "Drop", b"d") as (store, bodies):
        b = store.get_batch("g", "Drop", 0, 0, 30)
        files = [f for f in store.commitlog.mfq.files if f.ref_count]
        assert len(files) == len(set(b.file_index.tolist())) > 1
        assert all(f.ref_count == 1 for f in files)
        view = b.body(0)
        assert b.file_index.tolist()[0] == 0
        del b
        assert [f.ref_count for f in files] == [1] + [0] * (len(files) - 1)
        assert bytes(view) == bodies[0]
        del view
        gc.collect()
        assert all(f.ref_count == 0 for f in files)


def ten_records(tmp_path, backend, damaged):
    """A store with ten messages in queue Dmg/0, and (mapping, offset in it, bytes) of the
    record of queue offset `damaged`, to be damaged in place."""
    store = testing.open_store(tmp_path / "s", backend)
    assert all(store.put_message(Message("Dmg", b"%d" % i * 10)).ok for i in range(10))
    testing.wait_dispatched(store)
    unit = store.consume_queue("Dmg", 0).units(damaged, 1)[0]
    mf = store.commitlog.mfq.find_by_offset(int(unit["offset"]))
    rel = int(unit["offset"]) - mf.file_from_offset
    return store, mf.mm, rel, bytes(mf.mm[rel:rel + int(unit["size"])])


def test_a_damaged_record_is_skipped_by_both_reads_and_reported(tmp_path, backend, caplog):
    store, mm, rel, _ = ten_records(tmp_path, backend, 4)
    try:
        mm[rel + 4:rel + 8] = struct.pack(">i", 0x12345678)      # not a magic code
        # A unit whose size no record can have is skipped alone, not its whole file.
        cq_mm = store.consume_queue("Dmg", 0).mfq.files[0].mm
        cq_mm[7 * 20 + 8:7 * 20 + 12] = struct.pack(">i", -5)
        cq_mm[8 * 20:8 * 20 + 8] = struct.pack(">q", -100)
        g = store.get_message("g", "Dmg", 0, 0, 32)
        assert [m.queue_offset for m in g.messages] == [0, 1, 2, 3, 5, 6, 9]
        assert g.next_begin_offset == 10
        b = store.get_batch("g", "Dmg", 0, 0, 32)
        assert b.queue_offset.tolist() == [0, 1, 2, 3, 5, 6, 9]
        b.release()
        assert "fails the record check" in caplog.text
    finally:
        store.shutdown()


def test_a_record_whose_topic_breaks_the_rule_is_skipped_among_good_ones(tmp_path, backend,
                                                                         caplog):
    """The compiled walk passes the topic of the records it checked on to the next check,
    which then skips the topic rule for equal bytes: a damaged record of the same topic length
    in the middle of the queue is still refused by the rule, by both reads."""
    store, mm, rel, record = ten_records(tmp_path, backend, 5)
    try:
        at = rel + record.index(b"\x03Dmg") + 1
        mm[at:at + 3] = b"D/g"                          # a '/': no directory name
        g = store.get_message("g", "Dmg", 0, 0, 32)
        assert [m.queue_offset for m in g.messages] == [0, 1, 2, 3, 4, 6, 7, 8, 9]
        with store.get_batch("g", "Dmg", 0, 0, 32) as b:
            assert b.queue_offset.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9]
        assert "fails the record check" in caplog.text
    finally:
        store.shutdown()


# ---- MessageStore's fused entry (ReadPath.get_message / get_batch) ----------------------------
def _answer(r):
    """What a caller reads of a GetMessageResult or a GetBatchResult."""
    if hasattr(r, "messages"):
        return (r.status, r.next_begin_offset, r.min_offset, r.max_offset,
                r.suggest_pulling_from_slave, [attrs(m) for m in r.messages])
    with r:
        return (r.status, r.next_begin_offset, r.min_offset, r.max_offset,
                r.suggest_pulling_from_slave, r.rows.tobytes(), r.file_index.tolist(),
                [bytes(b) for b in r.bodies()])


def test_the_fused_entry_sees_the_store_change_between_calls(tmp_path, backend):
    """The compiled entry keeps copies of the store's attributes while the store's instance
    dict is unchanged: a queue table replaced, and a shutdown, are seen by the next call."""
    store = testing.open_store(tmp_path / "s", backend)
    try:
        assert store.put_message(Message("Seen", b"x")).ok
        assert len(store.get_message("g", "Seen", 0, 0).messages) == 1
        with store.get_batch("g", "Seen", 0, 0) as b:
            assert len(b) == 1
        table = store.consume_queue_table
        store.consume_queue_table = {}
        assert store.get_message("g", "Seen", 0, 0).status is \
            G.NO_MESSAGE_IN_QUEUE
        store.consume_queue_table = table
        with store.get_batch("g", "Seen", 0, 0) as b:
            assert len(b) == 1
    finally:
        store.shutdown()
    with pytest.raises(StoreClosedError):
        store.get_batch("g", "Seen", 0, 0)
    with pytest.raises(StoreClosedError):
        store.get_message("g", "Seen", 0, 0)


def test_the_fused_entry_answers_common_calls_as_the_store_s_separate_steps_do(tmp_path,
                                                                              backend):
    """store.get_message/get_batch take the read path's one-call entry when it has one (cext):
    its answers equal the steps it fuses, the store's catch-up and then pull/pull_batch, and a
    put that returned is visible to the next call (read-your-writes) though the entry, not
    the store, decides whether to catch up."""
    store = testing.open_store(tmp_path / "s", backend)
    rp = store.read_path
    try:
        msgs = varied_messages(90, "Fused")
        assert all(store.put_message(m).ok for m in msgs)
        tag1 = tags_hash("Tag1")
        for get, pull in (("get_message", rp.pull), ("get_batch", rp.pull_batch)):
            for offset in (0, 5, 37, 89):
                for n in (1, 3, 32, 100):
                    for flt in (None, lambda t: t == tag1):
                        store.catch_up()
                        want = _answer(pull(store, store.consume_queue("Fused", 0), offset, n,
                                            flt, read_path.MAX_BYTES))
                        assert _answer(getattr(store, get)("g", "Fused", 0, offset, n,
                                                           flt)) == want
            # Each put is seen by the very next call.
            for i in range(20):
                r = store.put_message(Message("Fused", b"new-%s-%d" % (get.encode(), i)))
                got = getattr(store, get)("g", "Fused", 0, r.queue_offset, 1)
                body = got.messages[0].body if get == "get_message" else bytes(got.body(0))
                assert got.status is G.FOUND and body == b"new-%s-%d" % (get.encode(), i)
    finally:
        store.shutdown()


@pytest.mark.parametrize("call", [
    ("g", "Fused", True, 0, 1, None),                 # a bool is not a queue id
    ("g", "Fused", 0, 0.0, 1, None),                  # nor a float an offset
    ("g", "Fused", 0, 1 << 70, 1, None),              # wider than a Java long
    ("g", "Fused", 0, 0, 0, None),
    ("g", "Fused", 0, 0, 1 << 17, None),              # above MAX_MSG_NUMS
    ("g", "Fused", 0, 0, 1, "not callable"),
    (b"g", "Fused", 0, 0, 1, None),
    ("g", "Absent", 0, 0, 1, None),                   # no such queue
    ("g", "Fused", 7, 0, 1, None),
    ("g", "Fused", 0, 5, 1, None),                    # beyond the queue: decided before a unit
    ("g", "Fused", 0, -3, 1, None),
])
def test_the_fused_entry_leaves_every_other_call_to_the_store(tmp_path, backend, call):
    """Any call that is not the common case answers None from the entry, so the store's own
    checks run and say what is wrong, or give the status (the same as before the entry)."""
    store = testing.open_store(tmp_path / "s", backend)
    try:
        assert store.put_message(Message("Fused", b"x")).ok
        rp = store.read_path
        assert rp.get_message(store, *call) is None
        assert rp.get_batch(store, *call) is None
    finally:
        store.shutdown()
    # A closed store's calls are left to the store too (which raises StoreClosedError).
    assert rp.get_message(store, "g", "Fused", 0, 0, 1, None) is None
    assert rp.get_batch(store, "g", "Fused", 0, 0, 1, None) is None


def test_pull_reads_a_queue_of_another_class_by_attribute_with_the_same_answer(tmp_path,
                                                                                backend):
    """The compiled pull reads a ConsumeQueue's mfq, file_size and min_logic_offset where its
    slots lie; a queue object of any other class is read by attribute, whichever came first."""
    store = testing.open_store(tmp_path / "s", backend)
    rp = store.read_path

    class Wrapped:
        def __init__(self, cq):
            self.mfq, self.file_size = cq.mfq, cq.file_size
            self.min_logic_offset = cq.min_logic_offset
    try:
        assert all(store.put_message(m).ok for m in varied_messages(40, "Other"))
        store.catch_up()
        cq = store.consume_queue("Other", 0)
        for pull in (rp.pull, rp.pull_batch):
            answers = [_answer(pull(store, q, 3, 10, None, read_path.MAX_BYTES))
                       for q in (Wrapped(cq), cq, Wrapped(cq), cq)]
            assert answers[0][0] is G.FOUND and answers[0][1] == 13
            assert all(a == answers[0] for a in answers)
    finally:
        store.shutdown()
