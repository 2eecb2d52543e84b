# SPDX-License-Identifier: Apache-2.0
"""A batch put hands its inline dispatch the scan rows of what it wrote (batch_encode's
`rows`, PutPath.put_list's `written_rows`, services.reput.WrittenRows): those rows must be
exactly what commitlog_scan makes of the same bytes, whatever the topics, queues, tags,
keys, properties and hosts, and through a roll (rows then cover the first file only); the
dispatch takes them only when they start where dispatch stands, and the ConsumeQueue and
index bytes stay those of a scan."""
import random
import threading

import numpy as np
import pytest

from rocketstore import Message, PutMessageStatus, testing
from rocketstore import format as F
from rocketstore.batch import columns
from rocketstore.services.reput import WrittenRows

TOPICS = ["R", "Tü-中", "%RETRY%g1", "x" * 120]
NAMES = ["a", "b", "Aa", "BB", "KEYS", "TAGS", "UNIQ_KEY", "éé", "p1", "q"]
VALUES = ["v", "", "ü-1", "x y", "false", None]
HOSTS = [("10.0.0.7", 40001), ("::1", 9876), ("fe80::1:2", 1)]


def _random_props(rng):
    return {rng.choice(NAMES): rng.choice(VALUES) for _ in range(rng.randrange(8))}


def _column(rng, n, pool):
    kind = rng.randrange(4)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice(pool)
    present = 1.0 if kind == 2 else rng.random()     # 3: some messages have none
    return [rng.choice(pool) if rng.random() < present else rng.choice([None, ""])
            for _ in range(n)]


def _scan_rows(store, written):
    """commitlog_scan of the bytes `written` says its rows describe (in the write buffer,
    with transient_store_pool_enable: the file holds them once committed)."""
    mf = store.commitlog.mfq.find_by_offset(written.offset, False)
    start = written.offset - mf.file_from_offset
    end = start + written.nbytes
    want = np.zeros(written.n + 1, dtype=F.SCAN_DTYPE)
    n, stop, reason, _ = store.kernels.commitlog_scan(mf.write_target, start, end, False, want)
    assert (n, stop, reason) == (written.n, end, F.SCAN_END)
    return want[:n]


@pytest.mark.parametrize("seed", range(8))
def test_batch_encode_rows_equal_the_scan_of_the_records_it_wrote(tmp_path, backend, seed):
    rng = random.Random(seed)
    store = testing.open_store(tmp_path / "s", backend, testing.small_config(
        dispatch_in_put_lag=-1, transient_store_pool_enable=seed % 3 == 0))
    try:
        rolled = False
        for _ in range(6):
            n = rng.randrange(1, 160)
            bodies = [bytes([rng.randrange(256)]) * rng.randrange(400) for _ in range(n)]
            tags = _column(rng, n, ["TagA", "t", "ü", "Aa", "BB"])
            keys = _column(rng, n, ["k1", "k1 k2", "ключ"])
            cols = columns(bodies, tags, keys, _random_props(rng), backend.column_join,
                           getattr(backend, "batch_columns", None))
            written = WrittenRows()
            topic = rng.choice(TOPICS)
            r = store.commitlog.put_batch(topic, rng.randrange(8), cols, store.clock,
                                          flag=rng.randrange(3),
                                          born_timestamp=rng.randrange(1 << 41),
                                          born_host=rng.choice(HOSTS), written=written)
            assert r.status is PutMessageStatus.PUT_OK and r.count == n
            assert 0 < written.n <= n and written.offset == r.commit_log_offsets[0]
            rolled |= written.n < n
            assert (written.rows[:written.n] == _scan_rows(store, written)).all()
        assert rolled or seed % 2     # the 64 KiB files roll within most seeds' batches
    finally:
        store.shutdown()


@pytest.fixture
def cext():
    return testing.load_backend("cext")


@pytest.mark.parametrize("seed", range(8))
def test_put_list_rows_equal_the_scan_of_the_records_it_wrote(tmp_path, cext, seed):
    rng = random.Random(seed)
    store = testing.open_store(tmp_path / "s", cext, testing.small_config(
        dispatch_in_put_lag=-1, transient_store_pool_enable=seed % 3 == 0))
    put_list = store._compiled_put_list
    try:
        # A queue's first message goes through the Python path (it creates the queue).
        # So may a born host not seen before: both are met once here.
        store.put_messages([Message(t, b"", queue_id=q, born_host=h)
                            for t in TOPICS for q in range(4) for h in HOSTS])
        rolled = False
        for _ in range(5):
            n = rng.randrange(1, 200)
            # Tags, keys and properties the compiled path takes (it hands some non-ASCII
            # names and None values to the Python path, which makes no rows: see below).
            msgs = [Message(rng.choice(TOPICS), bytes([65 + i % 26]) * rng.randrange(300),
                            tags=rng.choice([None, "TagA", "Aa", "BB"]),
                            keys=rng.choice([None, "k1", "k1 k2", ["a", "b"]]),
                            queue_id=rng.randrange(4), flag=rng.randrange(3),
                            properties={k: v for k, v in _random_props(rng).items()
                                        if v is not None and k.isascii() and v.isascii()},
                            born_host=rng.choice(HOSTS),
                            born_timestamp=rng.randrange(1 << 41))
                    for i in range(n)]
            written = WrittenRows()
            fast = put_list.__self__.fast
            r = put_list(msgs, None, written)
            assert r.status is PutMessageStatus.PUT_OK and r.count == n
            assert put_list.__self__.fast == fast + n       # the compiled path took them
            assert 0 < written.n <= n and written.offset == r.commit_log_offsets[0]
            rolled |= written.n < n
            assert (written.rows[:written.n] == _scan_rows(store, written)).all()
        assert rolled or seed % 2
    finally:
        store.shutdown()


def test_put_list_taken_by_the_python_path_hands_no_rows(tmp_path, cext):
    store = testing.open_store(tmp_path / "s", cext, testing.small_config(dispatch_in_put_lag=-1))
    try:
        written = WrittenRows()
        for msgs, batch_properties in [
                ([Message("T", b"x")], {"k": "v"}),                     # a broker batch
                ([Message("T", b"x", properties={"a": None})], None)]:  # a None value
            fast = store._compiled_put_list.__self__.fast
            r = store._compiled_put_list(msgs, batch_properties, written)
            assert r.status is PutMessageStatus.PUT_OK and written.n == 0
            assert store._compiled_put_list.__self__.fast == fast
    finally:
        store.shutdown()


def _counting_given(store):
    """Count the reput passes that took a put's rows instead of scanning."""
    reput = store.reput_service
    run = reput._k_fused
    given = []

    def counting(*args):
        if len(args) > 7 and args[7]:
            given.append(args[7])
        return run(*args)
    reput._k_fused = counting
    return given


def _queues_and_index(root):
    return {k: v for k, v in testing.tree_digest(root).items()
            if k.startswith(("consumequeue", "index"))}


def _put_mixed(store, seed):
    """Batches to three topics; returns the topic, key and body of each batch's first."""
    rng = random.Random(seed)
    firsts = []
    for i in range(12):
        n = rng.randrange(1, 120)
        if i % 2:
            topic = rng.choice(TOPICS[:3])
            r = store.put_messages([Message(topic, b"m%d" % k, tags=rng.choice([None, "TagA"]),
                                            keys=f"k{i}-{k}", queue_id=rng.randrange(3))
                                    for k in range(n)])
            firsts.append((topic, f"k{i}-0", b"m0"))
        else:
            topic = rng.choice(TOPICS[:3])
            r = store.put_batch(topic, rng.randrange(3), [b"b%d" % k for k in range(n)],
                                tags="TagB", keys=[f"b{i}-{k}" for k in range(n)])
            firsts.append((topic, f"b{i}-0", b"b0"))
        assert r.status is PutMessageStatus.PUT_OK
    return firsts


@pytest.mark.parametrize("pool", [False, True])
def test_inline_dispatch_takes_the_puts_rows_and_writes_the_queues_a_scan_writes(tmp_path,
                                                                                 cext, pool):
    """With a write buffer (`pool`) the records are readable only once committed: the puts
    make no rows, and the scan takes those records later."""
    config = testing.small_config(dispatch_in_put_lag=0, max_index_num=200,
                                  transient_store_pool_enable=pool)
    store = testing.open_store(tmp_path / "rows", cext, config)
    given = _counting_given(store)
    try:
        firsts = _put_mixed(store, 1)
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
        for topic, key, body in firsts:
            assert [m.body for m in store.query_message(topic, key).messages] == [body]
    finally:
        store.shutdown()
    # Every put but those whose index file rolled; none with write buffers.
    assert len(given) >= 10 if not pool else not given
    store = testing.open_store(tmp_path / "scan", cext, config)
    store._written = None          # the puts hand no rows: every pass scans
    try:
        _put_mixed(store, 1)
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
    finally:
        store.shutdown()
    assert _queues_and_index(tmp_path / "rows") == _queues_and_index(tmp_path / "scan")


def test_rows_that_do_not_start_where_dispatch_stands_are_scanned_instead(tmp_path, cext):
    store = testing.open_store(tmp_path / "s", cext, testing.small_config(dispatch_in_put_lag=0))
    reput = store.reput_service
    given = _counting_given(store)
    put_list = store._compiled_put_list
    try:
        first, second = WrittenRows(), WrittenRows()
        with reput.dispatch_lock:       # neither put is dispatched meanwhile
            put_list([Message("T", b"a%d" % i, keys=f"a{i}") for i in range(20)], None, first)
            put_list([Message("T", b"b%d" % i, keys=f"b{i}") for i in range(20)], None, second)
            assert reput.reput_from_offset == first.offset < second.offset
        # Another writer's records lie before the second put's: its rows are not taken.
        reput.dispatch_if_behind(0, second)
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
        assert not given
        assert [m.body for m in store.query_message("T", "b7").messages] == [b"b7"]
        assert [m.body for m in store.query_message("T", "a3").messages] == [b"a3"]
        assert store.get_message("g", "T", 0, 0, 64).message_count == 40
    finally:
        store.shutdown()


def test_a_put_s_rows_are_not_dispatched_over_the_records_a_cut_put_in_their_place(
        tmp_path, cext, monkeypatch):
    # Put A wrote at X; before its inline dispatch ran, reset_write_offset cut the CommitLog
    # back to X and put B wrote other records there (to another queue), whose own dispatch is
    # late too. A's rows still start where dispatch stands, but describe records now gone:
    # taken, they would file B's messages under A's queue and offsets.
    from rocketstore.services.reput import ReputMessageService
    real = ReputMessageService.dispatch_if_behind
    late = threading.local()
    before_first = []

    def dispatch_if_behind(self, lag, written=None):
        if getattr(late, "skip", False):
            return None                 # B's dispatch: later than A's
        if before_first:
            before_first.pop()()
        return real(self, lag, written)
    monkeypatch.setattr(ReputMessageService, "dispatch_if_behind", dispatch_if_behind)
    store = testing.open_store(tmp_path / "s", cext, testing.small_config(dispatch_in_put_lag=0))
    reput = store.reput_service
    given = _counting_given(store)
    try:
        assert store.put_messages([Message("T", b"first")]).status is PutMessageStatus.PUT_OK
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
        cut = store.get_max_phy_offset()

        def cut_and_put_b():
            reput.put_begins()          # the reput thread stands aside, as for a put
            assert store.reset_write_offset(cut)

            def put_b():
                late.skip = True
                r = store.put_messages([Message("T", b"b-%02d" % i, keys=f"b{i:02d}",
                                                queue_id=1) for i in range(20)])
                assert r.status is PutMessageStatus.PUT_OK
            t = threading.Thread(target=put_b)
            t.start()
            t.join()
        before_first.append(cut_and_put_b)
        # Records of B's sizes, so that A's rows fit B's bytes: only their queue differs.
        r = store.put_messages([Message("T", b"a-%02d" % i, keys=f"a{i:02d}")
                                for i in range(20)])
        assert r.status is PutMessageStatus.PUT_OK and int(r.commit_log_offsets[0]) == cut
        reput.put_ends()
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
        assert store.get_max_offset_in_queue("T", 0) == 1
        got = store.get_message("g", "T", 1, 0, 64)
        assert [m.body for m in got.messages] == [b"b-%02d" % i for i in range(20)]
        assert [m.body for m in store.query_message("T", "b07").messages] == [b"b-07"]
        assert store.query_message("T", "a03").message_count == 0
        assert not given                # no put's rows were taken: each pass scanned
    finally:
        store.shutdown()


@pytest.mark.parametrize("tags", ["FIND", "NONE", "GIVEN"])
def test_encode_row_writes_the_bytes_of_encode_parts_and_the_row_rs_msg_row_reads_back(tags):
    """rs_msg_encode_row (PutPath.put_list's encode when it hands rows) sets the row from
    the values it encoded: the bytes are rs_msg_encode_parts', the row rs_msg_row's."""
    testing.load_backend("cffi")            # fails, never skips, when cffi is not built
    from rocketstore.kernels._cffi_lib import ffi, lib
    rng = random.Random(11)
    code = {"FIND": lib.RS_ROW_TAGS_FIND, "NONE": lib.RS_ROW_TAGS_NONE,
            "GIVEN": lib.RS_ROW_TAGS_GIVEN}[tags]
    for topic, born in [(b"T1", b"\x0a\x00\x00\x07\x00\x00\x9c\x41"),
                        (b"SCHEDULE_TOPIC_XXXX", b"\x00" * 8),
                        ("Tü-中".encode(), b"\x00" * 16 + b"\x00\x00\x26\x94")]:
        sys_flag = lib.RS_BORNHOST_V6_FLAG if len(born) == 20 else 0
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        pieces = [b"KEYS", b"\x01", b"k1 k2", b"\x02", b"TAGS", b"\x01", b"TagA"]
        keep = [ffi.from_buffer(p) for p in pieces]
        parts = ffi.new("rs_part[]", len(pieces))
        for i, p in enumerate(pieces):
            parts[i].buf = keep[i]
            parts[i].len = len(p)
        store = b"\x7f\x00\x00\x01\x00\x00\x27\x74"
        args = (topic, len(topic), body, len(body), parts, len(pieces), 3, 7, 42, 4096 + 16,
                sys_flag, 1_700_000_000_123, born, len(born), 1_700_000_000_456, store,
                len(store), 2, 99)
        want, got = bytearray(600), bytearray(600)
        size = lib.rs_msg_encode_parts(ffi.from_buffer(want), len(want), 16, *args, 0)
        row = ffi.new("rs_scan_rec *")
        assert lib.rs_msg_encode_row(ffi.from_buffer(got), len(got), 16, *args, -5, code,
                                     1234, row) == size > 0
        assert got == want
        ref = ffi.new("rs_scan_rec *")
        assert lib.rs_msg_row(ffi.from_buffer(want), len(want), 16, -5, code, 1234, ref) == size
        assert bytes(ffi.buffer(row)) == bytes(ffi.buffer(ref))
        # A `tags` none of the three: refused, with nothing written.
        untouched = bytearray(600)
        assert lib.rs_msg_encode_row(ffi.from_buffer(untouched), len(untouched), 16, *args, -5,
                                     7, 0, row) == lib.RS_E_ARG
        assert untouched == bytearray(600)
