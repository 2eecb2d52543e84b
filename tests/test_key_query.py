# SPDX-License-Identifier: Apache-2.0
"""Key queries as one kernel call (index_query, over index_walk and index_match): every
backend answers alike and as a brute-force reading of the messages put says, on random keys
with hash collisions, keys spread over many index files, time ranges and max_num limits; a
damaged record at an indexed offset is passed over, never an error."""
import random
import struct
import types

import numpy as np
import pytest

from rocketstore import Message, MessageStore, query, testing
from rocketstore import format as F
from rocketstore.clock import StepClock
from rocketstore.errors import KernelBoundsError
from rocketstore.message import MessageExt, java_string_hash, make_msg_id

BACKENDS = testing.backend_params()
LONG_MAX = (1 << 63) - 1
LONG_MIN = -(1 << 63)
START = 1_800_000_000_000

# Java String.hashCode collides on "Aa" and "BB", so every string of such blocks of one length
# hashes alike: "AaAa", "AaBB", "BBAa", "BBBB" share one index chain whatever the slot count.
COLLIDING = ["AaAa", "AaBB", "BBAa", "BBBB"]


def _keys_pool(rng):
    return COLLIDING + [f"k{i}" for i in range(40)] + ["dup", "shared"]


def _random_messages(rng, n):
    pool = _keys_pool(rng)
    msgs = []
    for i in range(n):
        keys = rng.sample(pool, rng.randrange(0, 4))
        if rng.random() < 0.1 and keys:
            keys.append(keys[0])                 # one key twice in a record
        props = {}
        if rng.random() < 0.7:
            # Some UNIQ_KEYs are also another message's KEYS piece.
            props["UNIQ_KEY"] = rng.choice(pool) if rng.random() < 0.2 else f"U{i:08X}"
        msgs.append(Message(rng.choice(["T0", "T1"]), b"b%d" % i,
                            keys=" ".join(keys) if keys else None, properties=props,
                            queue_id=i % 2))
    return msgs


def _carries(m, topic, key):
    if m.topic != topic or not key:
        return False
    return m.properties.get("UNIQ_KEY") == key or key in (m.keys or "").split(" ")


def _build(root, msgs, step_ms=137, **cfg):
    """Put msgs with a cext store whose clock steps `step_ms` per stored message; return the
    store's config and (offset, store time, message) of each put."""
    config = testing.small_config(**cfg)
    store = testing.open_store(root, testing.load_backend("cext"), config,
                               clock=StepClock(START, step_ms))
    try:
        results = [store.put_message(m) for m in msgs]
        assert all(r.ok for r in results)
        testing.wait_dispatched(store)
        files = len(store.index_service.index_file_list)
    finally:
        store.shutdown()
    puts = [(r.commit_log_offset, r.store_timestamp, m) for r, m in zip(results, msgs)]
    return config, puts, files


def _expected(puts, topic, key, want, begin, end):
    """The newest `want` messages carrying the key in [begin, end], ascending by offset."""
    hits = sorted(off for off, ts, m in puts if begin <= ts <= end and _carries(m, topic, key))
    return hits[-want:] if want > 0 else []


def _open(root, config, name):
    store = MessageStore(root, config, kernels=name)
    store.load()
    return store


def _answer(store, topic, key, max_num=32, begin=0, end=None):
    r = store.query_message(topic, key, max_num, begin, end)
    return ([m.commit_log_offset for m in r.messages], r.buffer_total_size,
            r.index_last_update_timestamp, r.index_last_update_phy_offset)


@pytest.fixture(scope="module")
def random_store(tmp_path_factory):
    """600 random messages over small index files (16 slots, 64 entries: chains collide in
    every slot and the keys spread over dozens of files)."""
    root = tmp_path_factory.mktemp("keyquery")
    rng = random.Random(11)
    config, puts, files = _build(root, _random_messages(rng, 600), max_hash_slot_num=16,
                                 max_index_num=64)
    assert files > 10
    return root, config, puts


def test_the_colliding_keys_really_share_a_hash():
    assert len({java_string_hash("T0#" + k) for k in COLLIDING}) == 1


def test_random_key_queries_answer_alike_on_every_backend_and_as_the_messages_say(random_store):
    root, config, puts = random_store
    rng = random.Random(12)
    pool = _keys_pool(rng) + ["absent", "U00000007", "U000000FF"]
    first, last = puts[0][1], puts[-1][1]
    queries = []
    for _ in range(150):
        begin = rng.choice([0, first, rng.randrange(first, last), rng.randrange(first, last)])
        end = rng.choice([None, last, rng.randrange(begin or first, last + 1)])
        queries.append((rng.choice(["T0", "T1", "T2"]), rng.choice(pool),
                        rng.choice([1, 2, 3, 5, 32, 100]), begin, end))
    answers = {}
    for name in BACKENDS:
        store = _open(root, config, name)
        try:
            answers[name] = [_answer(store, *q) for q in queries]
        finally:
            store.shutdown()
    for name in BACKENDS:
        assert answers[name] == answers[BACKENDS[0]], name
    for q, (offsets, nbytes, last_ts, last_phy) in zip(queries, answers[BACKENDS[0]]):
        topic, key, max_num, begin, end = q
        want = min(max_num, config.max_msgs_num_batch)
        assert offsets == _expected(puts, topic, key, want, begin,
                                    LONG_MAX if end is None else end), q
        assert (nbytes > 0) == bool(offsets)
        assert last_ts == puts[-1][1] and last_phy == puts[-1][0]
    # The queries found messages, and among them ones behind colliding hashes.
    assert sum(bool(a[0]) for a in answers[BACKENDS[0]]) > 50
    assert any(a[0] for q, a in zip(queries, answers[BACKENDS[0]]) if q[1] in COLLIDING)


def test_a_key_spread_over_many_index_files_is_found_in_each(tmp_path, backend):
    msgs = [Message("T", b"%d" % i, keys=f"every other{i % 3}") for i in range(90)]
    config, puts, files = _build(tmp_path, msgs, max_hash_slot_num=8, max_index_num=21)
    assert files >= 9                                # 20 entries per file, 2 keys a record
    store = _open(tmp_path, config, backend.NAME)
    try:
        offsets = [off for off, _, _ in puts]
        assert _answer(store, "T", "every", 100)[0] == offsets[-config.max_msgs_num_batch:]
        assert _answer(store, "T", "other1", 100)[0] == offsets[1::3]
        assert _answer(store, "T", "other2", 5)[0] == offsets[2::3][-5:]
    finally:
        store.shutdown()


def test_time_ranges_keep_what_was_stored_inside_them(tmp_path, backend):
    # 250 ms apart: a second holds four records, and entry times (whole seconds after the
    # file's begin) cannot tell them apart; the records' own store times do.
    msgs = [Message("T", b"%d" % i, keys="k") for i in range(40)]
    config, puts, _ = _build(tmp_path, msgs, step_ms=250, max_hash_slot_num=8,
                             max_index_num=16)
    store = _open(tmp_path, config, backend.NAME)
    try:
        stamps = [ts for _, ts, _ in puts]
        offsets = [off for off, _, _ in puts]
        for lo, hi in [(3, 9), (0, 0), (17, 17), (5, 39), (38, 39), (10, 30)]:
            got = _answer(store, "T", "k", 64, stamps[lo], stamps[hi])[0]
            assert got == offsets[lo:hi + 1], (lo, hi)
            got = _answer(store, "T", "k", 64, stamps[lo] + 1, stamps[hi] - 1)[0]
            assert got == offsets[lo + 1:hi], (lo, hi)
        assert _answer(store, "T", "k", 64, stamps[-1] + 1)[0] == []
        assert _answer(store, "T", "k", 64, 0, stamps[0] - 1)[0] == []
        assert _answer(store, "T", "k", 3, stamps[10], stamps[20])[0] == offsets[18:21]
    finally:
        store.shutdown()


def test_max_num_keeps_the_newest_and_the_batch_cap_bounds_it(tmp_path, backend):
    msgs = [Message("T", b"%d" % i, keys="k") for i in range(80)]
    config, puts, _ = _build(tmp_path, msgs, max_msgs_num_batch=50)
    store = _open(tmp_path, config, backend.NAME)
    try:
        offsets = [off for off, _, _ in puts]
        for max_num, want in [(1, 1), (7, 7), (50, 50), (51, 50), (1000, 50)]:
            offs, nbytes, _, _ = _answer(store, "T", "k", max_num)
            assert offs == offsets[-want:]
            assert nbytes == sum(len(store.commitlog.get_message_bytes(o)) for o in offs)
    finally:
        store.shutdown()


def _damage(store, offset, how):
    """Damage the record at `offset` through the store's own mapping; returns an undo."""
    mf = store.commitlog.mfq.find_by_offset(offset)
    pos = offset - mf.file_from_offset
    size = struct.unpack_from(">i", mf.mm, pos)[0]
    saved = bytes(mf.mm[pos:pos + size])
    if how == "magic":
        mf.mm[pos + 4:pos + 8] = b"\0\0\0\x01"
    elif how == "size":
        mf.mm[pos:pos + 4] = struct.pack(">i", 1 << 30)      # runs past the readable end
    elif how == "offset":
        mf.mm[pos + 28:pos + 36] = struct.pack(">q", offset + 1)   # PHYSICALOFFSET
    elif how == "topic":
        mf.mm[_props_len_pos(mf.mm, pos) - 1] = ord("/")           # no topic a put accepts
    elif how == "lengths":
        struct.pack_into(">h", mf.mm, _props_len_pos(mf.mm, pos), 7)   # PROPERTIESLENGTH
    elif how == "zero":
        mf.mm[pos:pos + size] = bytes(size)

    def undo():
        mf.mm[pos:pos + size] = saved
    return undo


def _props_len_pos(mm, pos):
    """Where PROPERTIESLENGTH sits in the v1 IPv4 record at pos."""
    body_len = struct.unpack_from(">i", mm, pos + 84)[0]
    topic_len = mm[pos + 88 + body_len]
    return pos + 88 + body_len + 1 + topic_len


@pytest.mark.parametrize("how", ["magic", "size", "offset", "topic", "lengths", "zero"])
def test_a_damaged_record_at_an_indexed_offset_is_passed_over(tmp_path, backend, how):
    msgs = [Message("T", b"%d" % i, keys=f"k kk{i}", properties={"UNIQ_KEY": f"U{i}"})
            for i in range(6)]
    config, puts, _ = _build(tmp_path, msgs)
    store = _open(tmp_path, config, backend.NAME)
    try:
        offsets = [off for off, _, _ in puts]
        undo = _damage(store, offsets[3], how)
        try:
            assert _answer(store, "T", "k")[0] == offsets[:3] + offsets[4:]
            assert _answer(store, "T", "kk3")[0] == []
            assert _answer(store, "T", "k", 3)[0] == offsets[2:3] + offsets[4:]
            assert store.query_message_by_unique_key("T", "U3") is None
            host = store.view_message_by_id(make_msg_id(b"\x7f\0\0\1\0\0\x27\x11",
                                                        offsets[4]))
            assert host is not None and host.commit_log_offset == offsets[4]
            assert store.view_message_by_id(make_msg_id(b"\x7f\0\0\1\0\0\x27\x11",
                                                        offsets[3])) is None
        finally:
            undo()
        assert _answer(store, "T", "k")[0] == offsets
    finally:
        store.shutdown()



def test_a_record_cut_between_its_check_and_its_copy_is_passed_over(tmp_path, backend,
                                                                    monkeypatch):
    # The backends without a compiled index_query check a record (index_match, which cffi
    # calls without the GIL) and copy it in separate steps: a reset_write_offset zeroing it
    # in between left zeros to decode, and query_message raised CorruptRecordError. The cext
    # checks and copies with the GIL held, which the cut needs.
    if backend.NAME == "cext":
        pytest.skip("the compiled index_query checks and copies a record in one step")
    store = testing.open_store(tmp_path / "s", backend)
    try:
        puts = [store.put_message(Message("T", b"%d" % i, keys="k")) for i in range(6)]
        testing.wait_dispatched(store)
        offsets = [r.commit_log_offset for r in puts]
        match = backend.index_match
        cut = []

        def index_match(buf, limit, pos, phy_offset, topic, key, begin, end):
            size = match(buf, limit, pos, phy_offset, topic, key, begin, end)
            if size and not cut:
                cut.append(phy_offset)          # checked; the cut lands before the copy
                assert store.reset_write_offset(phy_offset)
            return size
        monkeypatch.setattr(backend, "index_match", index_match)
        assert _answer(store, "T", "k")[0] == offsets[:5]
        assert cut == [offsets[5]]
    finally:
        store.shutdown()

def test_view_message_by_id_answers_only_at_a_record_start(tmp_path, backend):
    config, puts, _ = _build(tmp_path, [Message("T", b"abc", keys="k") for _ in range(3)])
    store = _open(tmp_path, config, backend.NAME)
    try:
        host = b"\x7f\0\0\1\0\0\x27\x11"
        for off, ts, m in puts:
            got = store.view_message_by_id(make_msg_id(host, off))
            assert got.commit_log_offset == off and got.body == b"abc" and got.keys == "k"
        end = puts[-1][0] + len(store.commitlog.get_message_bytes(puts[-1][0]))
        for off in (puts[1][0] + 4, puts[1][0] - 1, end, end + 100, 1 << 40):
            assert store.view_message_by_id(make_msg_id(host, off)) is None
    finally:
        store.shutdown()


# ---- the kernels underneath ---------------------------------------------------------------------

def test_index_walk_in_small_steps_walks_the_chain_index_lookup_walks(random_store):
    root, config, _ = random_store
    store = _open(root, config, "pure")
    try:
        f = store.index_service.index_file_list[-1]
        mm = bytes(f.mm)
    finally:
        store.shutdown()
    for name in BACKENDS:
        k = testing.load_backend(name)
        for key in ["T0#AaAa", "T0#k3", "T1#dup", "T1#shared"]:
            h = k.index_hash(key.encode())
            whole = np.empty(64, dtype=np.int64)
            n = k.index_lookup(mm, f.slot_num, f.index_num, h, 0, LONG_MAX, 64, whole)
            got, at, hops = [], 0, 0
            out = np.empty(2, dtype=np.int64)
            while at >= 0:
                count, at, hops = k.index_walk(mm, f.slot_num, f.index_num, h, 0, LONG_MAX,
                                               at, hops, out)
                got += out[:count].tolist()
            assert got == whole[:n].tolist(), (name, key)
            assert k.index_walk(mm, f.slot_num, f.index_num, h, 0, LONG_MAX, -1, 0, out) == \
                (0, -1, 0)


def test_index_walk_of_a_looping_chain_ends_after_index_num_hops_over_all_calls(backend):
    slots, entries = 4, 8
    buf = bytearray(F.INDEX_HEADER_SIZE + slots * 4 + entries * 20)
    for i in range(5):
        backend.index_put(buf, slots, entries, 4, 100 + i, START)
    # Entry 2 points back at entry 5 (the head): a loop.
    struct.pack_into(">i", buf, F.INDEX_HEADER_SIZE + slots * 4 + 2 * 20 + 16, 5)
    out = np.empty(1, dtype=np.int64)
    at, hops, got = 0, 0, []
    while at >= 0:
        count, at, hops = backend.index_walk(buf, slots, entries, 4, 0, LONG_MAX, at, hops, out)
        got += out[:count].tolist()
    assert hops <= entries and len(got) <= entries


def _record(k, topic=b"T", props=b"KEYS\x01a b\x02UNIQ_KEY\x01u1", phy=1000, ts=START):
    size = k.msg_size(0, 3, len(topic), len(props))
    out = bytearray(size)
    k.msg_encode(out, 0, topic, b"abc", props, 0, 0, 0, phy, 0, START, b"\x7f\0\0\1\0\0\0\1",
                 ts, b"\x7f\0\0\1\0\0\0\2", 0, 0)
    return out


def test_index_match_says_which_records_carry_a_key(backend):
    rec = _record(backend)
    n = len(rec)
    m = backend.index_match
    assert m(rec, n, 0, 1000, b"T", b"a", 0, LONG_MAX) == n
    assert m(rec, n, 0, 1000, b"T", b"b", 0, LONG_MAX) == n
    assert m(rec, n, 0, 1000, b"T", b"u1", 0, LONG_MAX) == n
    assert m(rec, n, 0, 1000, None, None, LONG_MIN, LONG_MAX) == n
    assert m(rec, n, 0, 1000, b"T", b"a b", 0, LONG_MAX) == 0
    assert m(rec, n, 0, 1000, b"T", b"", 0, LONG_MAX) == 0
    assert m(rec, n, 0, 1000, b"U", b"a", 0, LONG_MAX) == 0
    assert m(rec, n, 0, 1000, b"", b"a", 0, LONG_MAX) == 0
    assert m(rec, n, 0, 1001, b"T", b"a", 0, LONG_MAX) == 0
    assert m(rec, n, 0, 1000, b"T", b"a", START + 1, LONG_MAX) == 0
    assert m(rec, n, 0, 1000, b"T", b"a", 0, START - 1) == 0
    assert m(rec, n, 0, 1000, b"T", b"a", START, START) == n
    assert m(rec, n - 1, 0, 1000, b"T", b"a", 0, LONG_MAX) == 0     # torn: past the end
    with pytest.raises(KernelBoundsError):
        m(rec, n + 1, 0, 1000, b"T", b"a", 0, LONG_MAX)
    with pytest.raises(KernelBoundsError):
        m(rec, n, n + 1, 1000, b"T", b"a", 0, LONG_MAX)
    # The last valid segment of a name wins, as the index build reads it.
    rec2 = _record(backend, props=b"KEYS\x01old\x02KEYS\x01new\x02KEYS\x01")
    assert m(rec2, len(rec2), 0, 1000, b"T", b"new", 0, LONG_MAX) == len(rec2)
    assert m(rec2, len(rec2), 0, 1000, b"T", b"old", 0, LONG_MAX) == 0


def test_index_match_agrees_across_backends_on_damaged_records():
    ks = [testing.load_backend(name) for name in BACKENDS]
    rng = random.Random(4)
    base = _record(ks[0], props=b"KEYS\x01a  b\x02UNIQ_KEY\x01a\x02X\x01y")
    for _ in range(400):
        rec = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            rec[rng.randrange(len(rec))] = rng.randrange(256)
        limit = rng.choice([len(rec), rng.randrange(len(rec) + 1)])
        key = rng.choice([b"a", b"b", b"", b"y", None])
        topic = rng.choice([b"T", None])
        got = {k.index_match(rec, limit, 0, 1000, topic, key, 0, LONG_MAX) for k in ks}
        assert len(got) == 1, (bytes(rec).hex(), limit, key, topic)


def test_index_query_with_no_files_or_nothing_wanted_reads_nothing(backend):
    assert backend.index_query([], None, "T", "k", 32, 0, LONG_MAX, bytes) == ([], 0, 0, 0)


def test_a_key_with_a_lone_surrogate_raises_as_str_encode_does(tmp_path, backend):
    config, _, _ = _build(tmp_path, [Message("T", b"x", keys="k")])
    store = _open(tmp_path, config, backend.NAME)
    try:
        with pytest.raises(UnicodeEncodeError):
            store.query_message("T", "k\ud800")
    finally:
        store.shutdown()


def test_a_broken_commitlog_bound_is_a_bounds_error_not_a_read(backend):
    with pytest.raises(KernelBoundsError):
        backend.index_match(b"\0" * 8, -1, 0, 0, b"T", b"k", 0, LONG_MAX)


def test_non_ascii_keys_are_hashed_and_matched_as_the_index_build_does(tmp_path, backend):
    keys = ["ключ", "k😀", "é", "日本"]
    config, puts, _ = _build(tmp_path, [Message("T", b"%d" % i, keys=k)
                                        for i, k in enumerate(keys)] +
                             [Message("T", b"u", properties={"UNIQ_KEY": "ü😀"})])
    store = _open(tmp_path, config, backend.NAME)
    try:
        for (off, _, m) in puts[:-1]:
            assert _answer(store, "T", m.keys)[0] == [off]
        assert _answer(store, "T", "ü😀")[0] == [puts[-1][0]]
        assert _answer(store, "T", "k😀 ")[0] == []
    finally:
        store.shutdown()


_EXT_FIELDS = ("store_size", "body_crc", "queue_id", "flag", "queue_offset", "commit_log_offset",
               "sys_flag", "born_timestamp", "born_host_raw", "store_timestamp",
               "store_host_raw", "reconsume_times", "prepared_transaction_offset", "body",
               "topic", "magic", "properties_string", "properties", "keys", "tags")


def _fields(m):
    return tuple(getattr(m, name) for name in _EXT_FIELDS)


def test_a_query_hit_is_the_message_its_record_decodes_to_and_get_message_reads(tmp_path,
                                                                                 backend):
    """A hit is built from the record check's row where the backend can (the compiled
    ReadPath), else decoded from the record's bytes: either way every field is what
    MessageExt.decode reads from the record and what get_message gives for it, IPv6 hosts,
    UTF-8 topics' neighbours and empty bodies included."""
    msgs = [Message("Tq", b"body-%d" % i if i % 5 else b"", tags="t%d" % (i % 3),
                    keys=f"k{i % 4} all",
                    properties={"UNIQ_KEY": f"U{i:04X}",
                                **({"p\u00e9": "v\u00e9"} if i % 2 else {})},
                    queue_id=i % 2, born_host=("::1", 7) if i % 3 == 0 else ("10.1.2.3", 9))
            for i in range(24)]
    config = testing.small_config()
    with testing.open_store(tmp_path, backend, config,
                            clock=StepClock(START, 3)) as store:
        assert all(store.put_message(m).ok for m in msgs)
        testing.wait_dispatched(store)
        hits = store.query_message("Tq", "all", 100).messages
        assert len(hits) == len(msgs)
        raw = {m.commit_log_offset: MessageExt.decode(bytes(store.commitlog.get_data(
            m.commit_log_offset, m.store_size))) for m in hits}
        pulled = {m.commit_log_offset: m for q in (0, 1)
                  for m in store.get_message("g", "Tq", q, 0, 32).messages}
        for m in hits:
            assert _fields(m) == _fields(raw[m.commit_log_offset]) \
                == _fields(pulled[m.commit_log_offset])
        # The unique-key and msgId lookups share the path.
        one = hits[5]
        assert _fields(store.query_message_by_unique_key("Tq", one.properties["UNIQ_KEY"])) \
            == _fields(one)
        assert _fields(store.view_message_by_id(one.msg_id)) == _fields(one)


def test_the_compiled_query_builds_the_same_messages_from_rows_as_from_bytes(random_store):
    """cext's index_query given the store's ReadPath (a hit built from the record check's row)
    keeps the same records, bytes and messages as given MessageExt.decode (the record's bytes
    parsed again)."""
    if "cext" not in BACKENDS:
        pytest.skip("the cext backend is not built")
    root, config, puts = random_store
    store = _open(root, config, "cext")
    try:
        files, mfq = store.index_service.index_file_list, store.commitlog.mfq
        k = store.kernels
        kept = 0
        for topic in ("T0", "T1"):
            for key in _keys_pool(random.Random(0)) + ["U00000007", "absent"]:
                for want in (1, 3, 100):
                    a = k.index_query(files, mfq, topic, key, want, 0, LONG_MAX,
                                      MessageExt.decode)
                    b = k.index_query(files, mfq, topic, key, want, 0, LONG_MAX,
                                      store.read_path)
                    assert [_fields(m) for m in a[0]] == [_fields(m) for m in b[0]]
                    assert a[1:] == b[1:]
                    kept += len(a[0])
        assert kept > 100
    finally:
        store.shutdown()


def test_the_fused_query_answers_as_the_store_s_steps_and_leaves_other_calls_to_them(
        random_store, backend):
    """store.query_message takes the read path's one-call entry when it has one (cext): its
    answer equals query.query_message's after the store's catch-up, and any call that is not
    the common case answers None from it, so the store's checks run."""
    root, config, puts = random_store
    store = _open(root, config, backend)
    rp = store.read_path
    try:
        first, last = puts[0][1], puts[-1][1]
        for topic in ("T0", "T1", "T2"):
            for key in COLLIDING + ["k3", "dup", "U00000007", "absent"]:
                for max_num, begin, end in ((1, 0, None), (3, first + 5000, last - 5000),
                                            (100, 0, last), (2, last + 1, None)):
                    store.catch_up()
                    want = query.query_message(store.commitlog, store.index_service,
                                               store.kernels, store.read_path,
                                               store.config.max_msgs_num_batch, topic, key,
                                               max_num, begin, end)
                    got = store.query_message(topic, key, max_num, begin, end)
                    assert type(got) is type(want)
                    assert [_fields(m) for m in got.messages] == \
                        [_fields(m) for m in want.messages]
                    assert (got.buffer_total_size, got.index_last_update_timestamp,
                            got.index_last_update_phy_offset) == \
                        (want.buffer_total_size, want.index_last_update_timestamp,
                         want.index_last_update_phy_offset)
        for call in (("T0", b"k3", 1, 0, None), (b"T0", "k3", 1, 0, None),
                     ("T0", "k3", 0, 0, None), ("T0", "k3", True, 0, None),
                     ("T0", "k3", 1, 1 << 63, None), ("T0", "k3", 1, 0, -(1 << 63) - 1),
                     ("T0", "k3", 1, 0.0, None), ("T0", "k3", 1 << 64, 0, None)):
            assert rp.query_message(store, *call) is None
    finally:
        store.shutdown()
    assert rp.query_message(store, "T0", "k3", 1, 0, None) is None      # closed


def test_a_query_passes_over_an_unmapped_index_file_among_the_newest(random_store):
    """An index file unmapped meanwhile (cleaning destroyed it) holds nothing: the walk goes
    on to the older files, and every backend answers alike."""
    root, config, puts = random_store
    answers = {}
    for name in BACKENDS:
        store = _open(root, config, name)
        try:
            files = store.index_service.index_file_list
            files[-2].mf.mm.close()
            files[-7].mf.mm.close()
            got = []
            for topic in ("T0", "T1"):
                for key in _keys_pool(random.Random(0)):
                    for want in (1, 3, 100):
                        got.append(_answer(store, topic, key, want))
            answers[name] = got
        finally:
            store.shutdown()
    first = answers[BACKENDS[0]]
    assert all(a == first for a in answers.values())
    assert sum(bool(a[0]) for a in first) > 50



def test_an_index_file_the_walk_refuses_raises_only_once_the_query_gets_to_it(random_store):
    """A second-newest index file one byte short: a query the newest file answers never
    reaches it, in any backend (the compiled one walks the newest files' chains together,
    and starts none when the walk refuses one); one that wants more raises a bounds error
    there, in every backend."""
    root, config, puts = random_store
    off, _, last = next((p for p in reversed(puts) if p[2].keys), None)
    key = last.keys.split(" ")[0]
    for name in BACKENDS:
        store = _open(root, config, name)
        try:
            files = list(store.index_service.index_file_list)
            real = files[-2]
            files[-2] = types.SimpleNamespace(
                slot_num=real.slot_num, index_num=real.index_num,
                mf=types.SimpleNamespace(mm=bytes(real.mf.mm)[:-1]))
            k, mfq = store.kernels, store.commitlog.mfq
            got = k.index_query(files, mfq, last.topic, key, 1, 0, LONG_MAX, bytes)[0]
            assert len(got) == 1 and last.body in bytes(got[0])
            with pytest.raises(KernelBoundsError):
                k.index_query(files, mfq, last.topic, key, 100, 0, LONG_MAX, bytes)
        finally:
            store.shutdown()
