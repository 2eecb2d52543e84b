# SPDX-License-Identifier: Apache-2.0
"""IndexFile kernels and IndexService: golden bytes from doc/02 §3.2, cext == cffi == pure,
terminating walks over corrupt chains, the broker's own index files and query answers, and
queries that never return a message for a colliding key."""
import json
import mmap
import os
import shutil
import struct
import threading

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from rocketstore import Message, MessageStore, QueryMessageResult, testing
from rocketstore import format as F
from rocketstore.clock import StepClock
from rocketstore.errors import KernelArgumentError, KernelBoundsError
from rocketstore.fs import FileSystem
from rocketstore.mapped_file import MappedFile
from rocketstore.index_file import (ENTRY_RESERVE_WINDOW, IndexFile, index_file_size,
                                    infer_geometry, time_millis_to_human_string)
from rocketstore import index_file
from rocketstore.index_service import INDEX_AHEAD_DIR, INDEX_MADE_AHEAD, index_keys
from rocketstore.message import java_string_hash

from broker_data import BASIC, broker_messages

LONG_MAX = (1 << 63) - 1
STAMPS = [1796046348973, 1796046349996, 1796046350997]     # doc/02 §3
SLOTS, ENTRIES = 5_000_000, 20_000_000                       # the defaults of §3.2


def _entry_pos(slot_num, n):
    return F.INDEX_HEADER_SIZE + slot_num * F.INDEX_SLOT_SIZE + n * F.INDEX_ENTRY_SIZE


def _put(k, buf, slots, entries, key, phy, ts):
    return k.index_put(buf, slots, entries, k.index_hash(key.encode()), phy, ts)


# ---- golden bytes: doc/02 §3.2 --------------------------------------------------------------

def test_index_put_writes_the_broker_written_entries_slots_and_header(backend):
    # An anonymous mapping: 420 MB of address space, only the touched pages are real.
    buf = mmap.mmap(-1, index_file_size(SLOTS, ENTRIES))
    assert len(buf) == 420_000_040
    for i in range(3):
        assert _put(backend, buf, SLOTS, ENTRIES, f"TopicTest#key{i}", 135 * i, STAMPS[i]) == i + 2
    assert buf[20_000_040:20_000_060] == bytes(20)
    assert buf[20_000_060:20_000_080].hex().upper() == \
        "62B4514D" "0000000000000000" "00000000" "00000000"
    assert buf[20_000_080:20_000_100].hex().upper() == \
        "62B4514C" "0000000000000087" "00000001" "00000000"
    assert buf[20_000_100:20_000_120].hex().upper() == \
        "62B4514B" "000000000000010E" "00000002" "00000000"
    assert buf[3_937_884:3_937_888] == bytes.fromhex("00000001")
    assert buf[3_937_880:3_937_884] == bytes.fromhex("00000002")
    assert buf[3_937_876:3_937_880] == bytes.fromhex("00000003")
    assert buf[:40].hex().upper() == ("000001A22CB462AD" "000001A22CB46A95" "0000000000000000"
                                      "000000000000010E" "00000003" "00000004")
    out = np.zeros(8, dtype=np.int64)
    h = backend.index_hash(b"TopicTest#key1")
    assert backend.index_lookup(buf, SLOTS, ENTRIES, h, 0, LONG_MAX, 32, out) == 1
    assert out[0] == 135
    # The derived example: a second key1 at 405, 3.5 s later, chains to entry 2.
    assert _put(backend, buf, SLOTS, ENTRIES, "TopicTest#key1", 405, STAMPS[0] + 3500) == 5
    assert buf[20_000_120:20_000_140].hex().upper() == \
        "62B4514C" "0000000000000195" "00000003" "00000002"
    assert buf[3_937_880:3_937_884] == bytes.fromhex("00000004")
    assert backend.index_lookup(buf, SLOTS, ENTRIES, h, 0, LONG_MAX, 32, out) == 2
    assert out[:2].tolist() == [405, 135]          # newest first
    assert backend.index_lookup(buf, SLOTS, ENTRIES, h, 0, LONG_MAX, 1, out) == 1
    assert out[0] == 405
    buf.close()


@pytest.mark.parametrize("key, code", [("TopicTest#key0", 1655984461),
                                       ("TopicTest#key1", 1655984460),
                                       ("TopicTest#key2", 1655984459)])
def test_index_hash_is_the_absolute_java_string_hash(backend, key, code):
    assert java_string_hash(key) == -code
    assert backend.index_hash(key.encode()) == code


def test_index_hash_maps_integer_min_value_to_zero(backend):
    assert java_string_hash("polygenelubricants") == -2 ** 31
    assert backend.index_hash(b"polygenelubricants") == 0


def test_index_hash_counts_utf16_units_of_non_bmp_keys(backend):
    key = "T#\U0001F600ключ"
    assert backend.index_hash(key.encode()) == abs(java_string_hash(key))


# ---- put and lookup rules ----------------------------------------------------------------------

def test_a_full_file_refuses_a_put_and_writes_nothing(backend):
    buf = bytearray(index_file_size(4, 3))
    assert backend.index_put(buf, 4, 3, 7, 100, 5000) == 2
    assert backend.index_put(buf, 4, 3, 8, 200, 6000) == 3
    before = bytes(buf)
    assert backend.index_put(buf, 4, 3, 9, 300, 7000) == 0
    assert bytes(buf) == before


def test_first_entry_of_a_rolled_file_is_timed_from_the_pre_seeded_begin(backend):
    buf = bytearray(index_file_size(4, 10))
    struct.pack_into(">qqqq", buf, 0, 10_000, 10_000, 50, 50)      # previous file's end
    backend.index_put(buf, 4, 10, 1, 60, 15_999)
    backend.index_put(buf, 4, 10, 2, 70, 18_000)
    e1 = struct.unpack_from(">iqii", buf, _entry_pos(4, 1))
    e2 = struct.unpack_from(">iqii", buf, _entry_pos(4, 2))
    assert e1 == (1, 60, 5, 0)          # (15999 - 10000) / 1000, truncated
    assert e2 == (2, 70, 2, 0)          # relative to the new begin, 15999
    assert struct.unpack_from(">qqqqii", buf, 0) == (15_999, 18_000, 60, 70, 2, 3)


def test_time_diff_is_clamped_to_zero_and_int_max(backend):
    buf = bytearray(index_file_size(4, 10))
    backend.index_put(buf, 4, 10, 1, 0, 1_000_000)
    backend.index_put(buf, 4, 10, 2, 1, 999_000)                 # earlier than begin
    backend.index_put(buf, 4, 10, 3, 2, 1_000_000 + 10 ** 13)    # > Integer.MAX_VALUE s
    diffs = [struct.unpack_from(">i", buf, _entry_pos(4, n) + 12)[0] for n in (1, 2, 3)]
    assert diffs == [0, 0, 2 ** 31 - 1]


def test_hash_slot_count_counts_slots_not_entries(backend):
    buf = bytearray(index_file_size(4, 10))
    for h in (1, 5, 9, 2):          # 1, 5 and 9 share slot 1
        backend.index_put(buf, 4, 10, h, h, 1000)
    assert struct.unpack_from(">ii", buf, 32) == (2, 5)
    out = np.zeros(10, dtype=np.int64)
    assert backend.index_lookup(buf, 4, 10, 5, 0, LONG_MAX, 10, out) == 1
    assert out[0] == 5


def test_lookup_stops_at_entries_older_than_begin(backend):
    buf = bytearray(index_file_size(4, 10))
    for i, ts in enumerate((1000, 3000, 5000, 7000)):
        backend.index_put(buf, 4, 10, 4, i, ts)
    out = np.zeros(10, dtype=np.int64)
    n = backend.index_lookup(buf, 4, 10, 4, 3000, 5000, 10, out)
    assert out[:n].tolist() == [2, 1]


def test_batch_put_stops_where_the_file_fills_and_equals_single_puts(backend):
    a = bytearray(index_file_size(8, 6))
    b = bytearray(index_file_size(8, 6))
    hashes = np.array([3, 11, 19, 4, 3, 7, 8], dtype=np.int32)
    offs = np.arange(7, dtype=np.int64) * 100
    stamps = 1_700_000_000_000 + np.arange(7, dtype=np.int64) * 1500
    assert backend.index_put_batch(a, 8, 6, hashes, offs, stamps) == 5
    for i in range(5):
        backend.index_put(b, 8, 6, int(hashes[i]), int(offs[i]), int(stamps[i]))
    assert a == b


def test_a_looping_chain_terminates(backend):
    buf = bytearray(index_file_size(4, 8))
    struct.pack_into(">qqqqii", buf, 0, 1000, 1000, 0, 0, 1, 4)
    struct.pack_into(">i", buf, F.INDEX_HEADER_SIZE + 4 * 1, 3)        # slot 1 -> entry 3
    for n, prev in ((1, 3), (2, 1), (3, 2)):                          # 3 -> 2 -> 1 -> 3 ...
        struct.pack_into(">iqii", buf, _entry_pos(4, n), 5, 100 * n, 0, prev)
    out = np.zeros(1000, dtype=np.int64)
    n = backend.index_lookup(buf, 4, 8, 5, 0, LONG_MAX, 1000, out)
    assert n == 8                      # bounded by index_num hops
    assert out[:4].tolist() == [300, 200, 100, 300]


def test_out_of_range_slot_and_prev_values_end_the_walk(backend):
    buf = bytearray(index_file_size(4, 8))
    struct.pack_into(">qqqqii", buf, 0, 1000, 1000, 0, 0, 1, 3)
    out = np.zeros(8, dtype=np.int64)
    for slot_value in (-1, 3, 8, 10 ** 6):
        struct.pack_into(">i", buf, F.INDEX_HEADER_SIZE + 4, slot_value)
        assert backend.index_lookup(buf, 4, 8, 1, 0, LONG_MAX, 8, out) == 0
    struct.pack_into(">i", buf, F.INDEX_HEADER_SIZE + 4, 2)
    for prev in (-5, 3, 2, 9999):
        struct.pack_into(">iqii", buf, _entry_pos(4, 2), 1, 42, 0, prev)
        assert backend.index_lookup(buf, 4, 8, 1, 0, LONG_MAX, 8, out) == 1
    struct.pack_into(">iqii", buf, _entry_pos(4, 2), 1, 42, -1, 0)      # negative timeDiff
    assert backend.index_lookup(buf, 4, 8, 1, 0, LONG_MAX, 8, out) == 0


def test_a_header_claiming_more_entries_than_the_file_holds_never_reads_past_it(backend):
    buf = bytearray(index_file_size(2, 4))
    struct.pack_into(">qqqqii", buf, 0, 1000, 1000, 0, 0, 1, 10 ** 6)
    struct.pack_into(">i", buf, F.INDEX_HEADER_SIZE, 4)                 # entry 4 is past the end
    out = np.zeros(8, dtype=np.int64)
    assert backend.index_lookup(buf, 2, 4, 0, 0, LONG_MAX, 8, out) == 0
    assert backend.index_put(buf, 2, 4, 0, 1, 1) == 0                   # reads as full


def test_kernels_reject_a_short_buffer_a_bad_geometry_and_a_negative_hash(backend):
    out = np.zeros(4, dtype=np.int64)
    with pytest.raises(KernelBoundsError):
        backend.index_put(bytearray(index_file_size(4, 4) - 1), 4, 4, 1, 0, 0)
    with pytest.raises(KernelBoundsError):
        backend.index_lookup(bytes(index_file_size(4, 4) - 1), 4, 4, 1, 0, 1, 4, out)
    for slots, entries in ((0, 4), (4, 0), (-1, 4)):
        with pytest.raises(KernelArgumentError):
            backend.index_put(bytearray(100), slots, entries, 1, 0, 0)
    with pytest.raises(KernelArgumentError):
        backend.index_put(bytearray(index_file_size(4, 4)), 4, 4, -1, 0, 0)
    with pytest.raises(KernelArgumentError):
        backend.index_lookup(bytes(index_file_size(4, 4)), 4, 4, -1, 0, 1, 4, out)
    buf = bytearray(index_file_size(4, 4))
    with pytest.raises(KernelArgumentError):
        backend.index_put_batch(buf, 4, 4, [1, -1], [0, 0], [0, 0])
    assert buf == bytes(len(buf))                                       # validated first
    with pytest.raises(KernelArgumentError):
        backend.index_put_batch(buf, 4, 4, [1, 2], [0], [0, 0])


# ---- cext == cffi == pure ------------------------------------------------------------------------

_OPS = st.lists(st.tuples(st.integers(0, 2 ** 31 - 1), st.integers(-2 ** 40, 2 ** 40),
                          st.integers(-2 ** 42, 2 ** 42)), max_size=40)


@given(st.integers(1, 9), st.integers(1, 12), _OPS, st.booleans(),
       st.integers(-2 ** 42, 2 ** 42), st.integers(-2 ** 42, 2 ** 62), st.integers(-1, 50))
def test_put_and_lookup_agree_across_backends(backends, slots, entries, ops, batch, begin, end,
                                              max_num):
    results = []
    for k in backends:
        buf = bytearray(index_file_size(slots, entries))
        if batch:
            counts = [k.index_put_batch(buf, slots, entries,
                                        np.array([o[0] for o in ops], dtype=np.int32),
                                        np.array([o[1] for o in ops], dtype=np.int64),
                                        np.array([o[2] for o in ops], dtype=np.int64))]
        else:
            counts = [k.index_put(buf, slots, entries, *o) for o in ops]
        found = []
        for h, _, _ in ops[:6]:
            out = np.zeros(64, dtype=np.int64)
            n = k.index_lookup(buf, slots, entries, h, begin, end, max_num, out)
            found.append(out[:n].tolist())
        results.append((bytes(buf), counts, found))
    assert all(r == results[0] for r in results[1:])


@given(st.integers(1, 6), st.integers(1, 10), st.data())
def test_lookup_agrees_across_backends_on_random_bytes(backends, slots, entries, data):
    buf = data.draw(st.binary(min_size=index_file_size(slots, entries),
                              max_size=index_file_size(slots, entries) + 8))
    h = data.draw(st.integers(0, 2 ** 31 - 1))
    begin = data.draw(st.integers(-2 ** 63, 2 ** 63 - 1))
    end = data.draw(st.integers(-2 ** 63, 2 ** 63 - 1))
    answers = []
    for k in backends:
        out = np.zeros(32, dtype=np.int64)
        n = k.index_lookup(buf, slots, entries, h, begin, end, 32, out)
        assert n <= entries
        answers.append(out[:n].tolist())
    assert all(a == answers[0] for a in answers[1:])


def _cffi():
    testing.load_backend("cffi")        # fails, never skips, when cffi is not built
    from rocketstore.kernels._cffi_lib import ffi, lib
    return ffi, lib


def _chains(ffi, bufs, slots, entries, outs, cap):
    """rs_index_chain[len(bufs)] at the start of each file's chain (at and hops 0), chain i
    writing to outs[i]; the buffers it points into are kept alive with it."""
    chains = ffi.new("rs_index_chain[]", len(bufs))
    keep = [ffi.from_buffer(b) for b in bufs]
    for c, b, buf, out in zip(chains, keep, bufs, outs):
        c.buf, c.len, c.slot_num, c.index_num = b, len(buf), slots, entries
        c.at, c.hops, c.out, c.cap = 0, 0, out, cap
    return chains, keep


def _walk_alone(lib, ffi, buf, slots, entries, h, begin, end, cap, at=0, hops=0):
    """rs_index_walk of one file's chain from (at, hops) to its end, cap offsets a call:
    (offsets, the final hops)."""
    b = ffi.from_buffer(buf)
    at_p, hops_p = ffi.new("int32_t *", at), ffi.new("int64_t *", hops)
    out, count = ffi.new("int64_t[]", cap), ffi.new("int64_t *")
    found = []
    while at_p[0] >= 0:
        assert lib.rs_index_walk(b, len(buf), slots, entries, h, begin, end, at_p, hops_p,
                                 out, cap, count) == lib.RS_OK
        found += [out[j] for j in range(count[0])]
    return found, hops_p[0]


@given(st.data())
def test_chains_walked_together_each_give_a_prefix_of_their_own_walk_and_resume_to_the_rest(
        data):
    """rs_index_walk_chains (the cext key query's first walk over its newest files): each
    chain's offsets are the first of its file's own walk, it resumes with rs_index_walk to
    exactly the rest (hops included), and it stops early only once the chains before it hold
    `want` offsets. Chains are built by index_put over a few hashes, some bytes then
    overwritten at random, so that chains also loop, point out of range and end early."""
    ffi, lib = _cffi()
    k = testing.load_backend("pure")
    slots = data.draw(st.integers(1, 4))
    entries = data.draw(st.integers(2, 24))
    bufs = []
    for _ in range(data.draw(st.integers(1, 5))):
        buf = bytearray(index_file_size(slots, entries))
        for h, phy, ts in data.draw(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 999),
                                                       st.integers(0, 9_000)), max_size=40)):
            k.index_put(buf, slots, entries, h, phy, 1_800_000_000_000 + ts)
        for pos, byte in data.draw(st.lists(st.tuples(st.integers(0, len(buf) - 1),
                                                      st.integers(0, 255)), max_size=2)):
            buf[pos] = byte
        bufs.append(buf)
    h = data.draw(st.integers(0, 2))
    begin = 1_800_000_000_000 + data.draw(st.integers(-1000, 9_000))
    end = begin + data.draw(st.integers(0, 20_000))
    want, cap = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 8))
    stopped = 0
    outs = [ffi.new("int64_t[]", cap) for _ in bufs]
    chains, keep = _chains(ffi, bufs, slots, entries, outs, cap)
    assert lib.rs_index_walk_chains(chains, len(bufs), h, begin, end, want) == lib.RS_OK
    before = 0
    for c, buf, out in zip(chains, bufs, outs):
        alone = _walk_alone(lib, ffi, buf, slots, entries, h, begin, end, cap)
        got = [out[j] for j in range(c.count)]
        rest = _walk_alone(lib, ffi, buf, slots, entries, h, begin, end, cap, c.at, c.hops) \
            if c.at >= 0 else ([], c.hops)
        assert (got + rest[0], rest[1]) == alone
        if c.count < cap and c.at >= 0:             # stopped by neither its end nor cap
            assert before >= want
            stopped += 1
        if before < want:                           # walked as far as alone, in one call
            assert got == alone[0][:cap]
        before += c.count
    event(f"chains stopped early: {min(stopped, 2)}")


def test_a_chain_stopped_for_the_newer_files_offsets_resumes_where_it_stopped():
    """The newer file's first entry is the one offset a query wants: the older file's chain
    stops in the same step, before its first hop, at its head entry, and resumes from
    there with rs_index_walk to the whole of it."""
    ffi, lib = _cffi()
    k = testing.load_backend("pure")
    newer, older = bytearray(index_file_size(2, 16)), bytearray(index_file_size(2, 16))
    k.index_put(newer, 2, 16, 7, 500, 1_800_000_000_000)
    for i in range(10):
        k.index_put(older, 2, 16, 7, 100 + i, 1_800_000_000_000)
    outs = [ffi.new("int64_t[]", 8) for _ in range(2)]
    chains, keep = _chains(ffi, [newer, older], 2, 16, outs, 8)
    assert lib.rs_index_walk_chains(chains, 2, 7, 0, 1 << 62, 1) == lib.RS_OK
    assert (chains[0].count, outs[0][0], chains[0].at) == (1, 500, -1)
    assert (chains[1].count, chains[1].at, chains[1].hops) == (0, 10, 0)
    rest = _walk_alone(lib, ffi, older, 2, 16, 7, 0, 1 << 62, 8, chains[1].at, chains[1].hops)
    assert rest == _walk_alone(lib, ffi, older, 2, 16, 7, 0, 1 << 62, 8)
    assert rest[0] == list(range(109, 99, -1))


def test_chains_walked_together_refuse_bad_arguments_and_walk_nothing():
    ffi, lib = _cffi()
    k = testing.load_backend("pure")
    good = bytearray(index_file_size(4, 8))
    k.index_put(good, 4, 8, 3, 77, 1_800_000_000_000)
    short = bytearray(index_file_size(4, 8) - 1)
    bufs = [ffi.from_buffer(b) for b in (good, short)]
    chains = ffi.new("rs_index_chain[]", lib.RS_INDEX_MAX_CHAINS + 1)
    out = ffi.new("int64_t[]", 4)
    for c in chains:
        c.buf, c.len, c.slot_num, c.index_num = bufs[0], len(good), 4, 8
        c.at, c.hops, c.out, c.cap, c.count = 0, 0, out, 4, -5
    walk = lib.rs_index_walk_chains
    assert walk(chains, lib.RS_INDEX_MAX_CHAINS + 1, 3, 0, 1 << 62, 1) == lib.RS_E_ARG
    assert walk(chains, 1, 3, 0, 1 << 62, 0) == lib.RS_E_ARG
    assert walk(chains, 1, -3, 0, 1 << 62, 1) == lib.RS_E_ARG
    chains[1].buf, chains[1].len = bufs[1], len(short)
    assert walk(chains, 2, 3, 0, 1 << 62, 1) == lib.RS_E_BOUNDS
    assert chains[0].at == 0 and chains[0].count == -5       # nothing walked
    assert walk(chains, 1, 3, 0, 1 << 62, 1) == lib.RS_OK
    assert (chains[0].count, out[0], chains[0].at) == (1, 77, -1)


@given(st.one_of(st.binary(max_size=40), st.text(max_size=20).map(str.encode)))
def test_index_hash_agrees_across_backends(backends, key):
    hashes = {k.index_hash(key) for k in backends}
    assert len(hashes) == 1 and hashes.pop() >= 0


# ---- which keys: doc/02 §2.4 --------------------------------------------------------------------

@pytest.mark.parametrize("props, keys", [
    (b"KEYS\x01a b\x02UNIQ_KEY\x01U1", [b"U1", b"a", b"b"]),
    (b"UNIQ_KEY\x01U1\x02KEYS\x01 a  b ", [b"U1", b"a", b"b"]),
    (b"KEYS\x01", []),
    (b"TAGS\x01t\x02KEYS\x01x\x02KEYS\x01y", [b"y"]),            # the last one wins
    (b"KEYS\x01x\x02KEYS\x01", [b"x"]),                         # an empty value is not read
    (b"XKEYS\x01x\x02UNIQ_KEYS\x01y", []),
    (b"KEYS\x01a\x01b", [b"a\x01b"]),
])
def test_index_keys_follow_string2message_properties(props, keys):
    assert index_keys(props) == keys


# ---- the broker's index (tests/data/rmq-4.9.8-basic) ---------------------------------------------

def _queries():
    with open(os.path.join(BASIC, "queries.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture
def broker_ro(broker_store, backend):
    store = MessageStore.open_read_only(broker_store, kernels=backend)
    yield store
    store.shutdown()


def test_read_only_open_infers_the_brokers_index_geometry(broker_ro):
    assert (broker_ro.config.max_hash_slot_num, broker_ro.config.max_index_num) == (64, 500)
    assert len(broker_ro.index_service.index_file_list) == 6


def test_every_broker_query_gets_the_brokers_commit_log_offsets(broker_ro):
    for q in _queries():
        r = broker_ro.query_message(q["topic"], q["key"], q["maxNum"], q["begin"], q["end"])
        assert isinstance(r, QueryMessageResult)
        assert [m.commit_log_offset for m in r.messages] == q["commitLogOffsets"], q["key"]
        assert [m.msg_id for m in r.messages] == [h["msgId"] for h in q["hits"]]


def test_every_key_of_every_broker_message_finds_exactly_its_messages(broker_ro):
    by_key = {}
    for m in broker_messages():
        props = m["properties"].encode()
        for key in index_keys(props):
            by_key.setdefault((m["topic"], key.decode()), []).append(m["commitLogOffset"])
    assert len(by_key) > 900
    for (topic, key), offsets in by_key.items():
        got = broker_ro.query_message(topic, key, max_num=64)
        assert [m.commit_log_offset for m in got.messages] == sorted(offsets)[-64:], (topic, key)


def test_index_last_update_is_the_newest_files_end(broker_ro):
    r = broker_ro.query_message("OrderTopic", "ord-0")
    last = broker_ro.index_service.index_file_list[-1]
    assert r.index_last_update_timestamp == last.end_timestamp == \
        broker_messages()[-1]["storeTimestamp"]
    assert r.index_last_update_phy_offset == last.end_phy_offset


def test_broker_index_files_hold_one_entry_per_indexed_key(broker_ro):
    files = broker_ro.index_service.index_file_list
    assert [f.index_count for f in files] == [500] * 5 + [143]
    header, slots, entries = files[0].arrays()
    assert header["index_count"][0] == 500 and header["hash_slot_count"][0] == \
        files[0].hash_slot_count
    assert (slots >= 0).all() and entries[0].tobytes() == bytes(20)
    assert int(entries["phy_offset"][1]) == 0 == files[0].begin_phy_offset
    del header, slots, entries


def test_unique_key_and_msg_id_and_offset_lookups_on_the_broker_store(broker_ro):
    msgs = broker_messages()
    m10 = msgs[10]
    uniq = m10["properties"].split("UNIQ_KEY\x01")[1].split("\x02")[0]
    got = broker_ro.query_message_by_unique_key("PayTopic", uniq)
    assert got.commit_log_offset == m10["commitLogOffset"]
    assert broker_ro.query_message_by_unique_key("OrderTopic", uniq) is None
    for m in (msgs[0], msgs[777], msgs[-1]):
        assert broker_ro.view_message_by_id(m["msgId"]).to_dict(m["cqTagsCode"]) == m
        assert broker_ro.look_message_by_offset(m["commitLogOffset"]).msg_id == m["msgId"]
    assert broker_ro.view_message_by_id("0A00000100002A9F" + "%016X" % 5) is None
    with pytest.raises(ValueError):
        broker_ro.view_message_by_id("zz")


def test_geometry_inference_rejects_sizes_that_fit_nothing(tmp_path):
    p = tmp_path / "20260101000000000"
    p.write_bytes(bytes(1001))
    from rocketstore.fs import DEFAULT
    assert infer_geometry([str(p)], DEFAULT, 64, 500) is None
    q = tmp_path / "20260101000000001"
    q.write_bytes(bytes(index_file_size(64, 500)))
    assert infer_geometry([str(q)], DEFAULT, 64, 500) == (64, 500)


def _index_bytes(root):
    return {p.name: p.read_bytes() for p in sorted((root / "index").iterdir())}


def _keyed_store(root, backend, n, **cfg):
    """A store of n messages keyed k0..k{n-1} (three topics), shut down cleanly."""
    store = _store(root, backend, **cfg)
    try:
        store.put_messages([Message(f"T{i % 3}", b"x" * (i % 40), keys=f"k{i}")
                            for i in range(n)])
    finally:
        store.shutdown()


def _assert_every_key_found(store, n):
    for i in range(n):
        assert [m.keys for m in store.query_message(f"T{i % 3}", f"k{i}").messages] == \
            [f"k{i}"], i


def test_geometry_inference_tells_apart_two_geometries_of_one_file_size(tmp_path, backend):
    assert index_file_size(64, 500) == index_file_size(164, 480)
    from rocketstore.fs import DEFAULT
    paths = {}
    for slots, entries in ((64, 500), (164, 480)):
        path = str(tmp_path / f"20260101000{slots:06d}")
        f = IndexFile(path, slots, entries, backend, DEFAULT)
        for i in range(37):
            f.put_key(f"T#k{i}", 1000 + i, 1_800_000_000_000 + i)
        f.close()
        paths[slots, entries] = path
    for geometry, path in paths.items():
        for configured in ((64, 500), (164, 480), (SLOTS, ENTRIES)):
            assert infer_geometry([path], DEFAULT, *configured) == geometry, configured


def test_verify_finds_no_problem_in_a_clean_store_with_64_slots_and_500_entries(tmp_path,
                                                                                 backend):
    _keyed_store(tmp_path, backend, 300)
    store = MessageStore.open_read_only(tmp_path, kernels=backend)
    try:
        report = store.verify()
        assert [str(p) for p in report.problems] == []
        assert report.index_entries == 300
        _assert_every_key_found(store, 300)
    finally:
        store.shutdown()


def test_verify_finds_no_problem_in_a_clean_64_slot_store_whose_index_holds_no_key(tmp_path,
                                                                                  backend):
    """An index file with no entry does not tell its numbers (64 and 500 are neither the
    defaults nor their ratio); it holds nothing to check, so it is no problem. Emptied under
    keyed records, the records missing from the index are reported all the same."""
    store = testing.open_store(tmp_path, backend)
    try:
        for _ in range(5):
            assert store.put_message(Message("T", b"no keys")).ok
    finally:
        store.shutdown()

    def problems():
        ro = MessageStore.open_read_only(tmp_path, kernels=backend)
        try:
            return [str(p) for p in ro.verify().problems]
        finally:
            ro.shutdown()
    assert problems() == []
    store = testing.open_store(tmp_path, backend)
    try:
        assert store.put_message(Message("T", b"keyed", keys="k1")).ok
    finally:
        store.shutdown()
    (path,) = (tmp_path / "index").iterdir()
    empty = bytearray(path.stat().st_size)
    empty[:F.INDEX_HEADER_SIZE] = path.read_bytes()[:F.INDEX_HEADER_SIZE]
    empty[F.INDEX_POS_INDEX_COUNT:F.INDEX_POS_INDEX_COUNT + 4] = (1).to_bytes(4, "big")
    path.write_bytes(bytes(empty))
    found = problems()
    assert len(found) == 1 and "'T#k1'" in found[0] and "has no index entry" in found[0], found


def test_a_writable_open_with_other_index_settings_keeps_the_files_geometry(tmp_path,
                                                                            backend):
    _keyed_store(tmp_path, backend, 1200)
    before = _index_bytes(tmp_path)
    assert len(before) == 3
    default_index = dict(max_hash_slot_num=SLOTS, max_index_num=ENTRIES)
    _store(tmp_path, backend, **default_index).shutdown()
    assert _index_bytes(tmp_path) == before
    store = _store(tmp_path, backend, **default_index)
    try:
        assert (store.index_service.hash_slot_num, store.index_service.index_num) == (64, 500)
        store.put_messages([Message(f"T{i % 3}", b"y", keys=f"k{i}") for i in range(1200, 1700)])
        testing.wait_dispatched(store)
        _assert_every_key_found(store, 1700)
    finally:
        store.shutdown()
    after = _index_bytes(tmp_path)
    assert len(after) == 4 and {len(b) for b in after.values()} == {index_file_size(64, 500)}
    names = sorted(before)
    assert [after[n] for n in names[:2]] == [before[n] for n in names[:2]]


def test_recover_and_rebuild_keep_the_index_files_geometry(tmp_path, backend):
    from rocketstore import repair
    _keyed_store(tmp_path, backend, 300)
    before = _index_bytes(tmp_path)
    repair.recover(str(tmp_path), kernels=backend)
    assert {n: len(b) for n, b in _index_bytes(tmp_path).items()} == \
        {n: len(b) for n, b in before.items()}
    repair.rebuild_index(str(tmp_path), kernels=backend)
    repair.rebuild_consume_queues(str(tmp_path), kernels=backend)
    assert {len(b) for b in _index_bytes(tmp_path).values()} == {index_file_size(64, 500)}
    store = MessageStore.open_read_only(tmp_path, kernels=backend)
    try:
        _assert_every_key_found(store, 300)
    finally:
        store.shutdown()


def test_a_writable_open_refuses_index_files_of_unknown_geometry_and_keeps_them(tmp_path,
                                                                                backend):
    from rocketstore.errors import StoreLoadError
    _keyed_store(tmp_path, backend, 10)
    odd = tmp_path / "index" / "20990101000000000"
    odd.write_bytes(b"\1" * 1001)
    before = _index_bytes(tmp_path)
    with pytest.raises(StoreLoadError, match="max_hash_slot_num and max_index_num"):
        _store(tmp_path, backend)
    assert _index_bytes(tmp_path) == before
    store = MessageStore.open_read_only(tmp_path, kernels=backend)
    try:
        assert store.index_service.unreadable == [str(odd.parent / p) for p in sorted(before)]
    finally:
        store.shutdown()


def test_verify_names_every_record_whose_keys_the_index_lost(tmp_path, backend):
    _keyed_store(tmp_path, backend, 1200)
    ro = MessageStore.open_read_only(tmp_path, kernels=backend)
    try:
        assert ro.verify().ok
        lost = ro.index_service.index_file_list[1]
        lo, hi = lost.begin_phy_offset, lost.end_phy_offset
        records = [(m.commit_log_offset, m.topic, m.keys) for m in
                   (ro.look_message_by_offset(o) for o in _record_offsets(ro))]
    finally:
        ro.shutdown()
    os.remove(lost.path)
    ro = MessageStore.open_read_only(tmp_path, kernels=backend)
    try:
        problems = ro.verify().problems
    finally:
        ro.shutdown()
    want = [(f"commitlog/{off // 65536 * 65536:020d}", off % 65536, f"key '{topic}#{keys}' of the "
             f"record at {off} has no index entry: key queries miss the record")
            for off, topic, keys in records if lo <= off <= hi]
    assert 400 < len(want) < 500
    assert [(p.kind, p.file, p.offset, p.detail) for p in problems] == \
        [("index",) + w for w in want[:100]] + \
        [("index", "index", -1, f"{len(want)} record keys in all are missing from the index "
          "(the first 100 are listed)")]


def _record_offsets(store):
    offsets = []
    offset = 0
    while offset < store.get_max_phy_offset():
        m = store.look_message_by_offset(offset)
        if m is None:                            # a file's blank tail
            offset = (offset // 65536 + 1) * 65536
            continue
        offsets.append(offset)
        offset += m.store_size
    return offsets


def test_index_files_pointing_past_a_truncated_commit_log_are_rebuilt(tmp_path, backend):
    """A power cut kept flushed index files whose records never reached the disk."""
    _keyed_store(tmp_path, backend, 1200)
    ro = MessageStore.open_read_only(tmp_path, kernels=backend)
    try:
        cut = ro.query_message("T0", "k900").messages[0].commit_log_offset
        names = [f.file_name for f in ro.index_service.index_file_list]
        ends = [f.end_timestamp for f in ro.index_service.index_file_list]
    finally:
        ro.shutdown()
    for f in sorted((tmp_path / "commitlog").iterdir()):
        start = int(f.name)
        if start + 65536 <= cut:
            continue
        data = f.read_bytes()
        keep = max(0, cut - start)
        f.write_bytes(data[:keep] + bytes(len(data) - keep))
    cp = bytearray((tmp_path / "checkpoint").read_bytes())
    cp[16:24] = struct.pack(">q", max(ends))          # it vouches for every index file
    (tmp_path / "checkpoint").write_bytes(bytes(cp))
    (tmp_path / "abort").write_bytes(b"")
    store = _store(tmp_path, backend)
    try:
        report = store.recovery_report
        assert report.process_offset == cut
        assert report.index_files_dropped == names[1:]
        store.put_messages([Message(f"T{i % 3}", b"z", keys=f"n{i}") for i in range(300)])
        testing.wait_dispatched(store)
        for i in range(300):
            assert len(store.query_message(f"T{i % 3}", f"n{i}").messages) == 1, i
        _assert_every_key_found(store, 900)
        assert store.query_message("T0", "k900").messages == []
    finally:
        store.shutdown()
    ro = MessageStore.open_read_only(tmp_path, kernels=backend)
    try:
        assert [str(p) for p in ro.verify().problems] == []
    finally:
        ro.shutdown()


# ---- IndexService in a running store -------------------------------------------------------------

def _store(root, backend, **cfg):
    return testing.open_store(root, backend, testing.small_config(**cfg),
                              clock=StepClock(1_800_000_000_000, 7))


def test_a_hash_collision_never_returns_the_other_message(tmp_path, backend):
    assert java_string_hash("Aa") == java_string_hash("BB")
    store = _store(tmp_path, backend)
    try:
        store.put_message(Message("T", b"x", keys="Aa"))
        store.put_message(Message("T", b"y", keys="BB CC"))
        testing.wait_dispatched(store)
        assert len(store.index_service.query_offset("T", "Aa", 32, 0, LONG_MAX)[0]) == 2   # hashes
        assert [m.keys for m in store.query_message("T", "Aa").messages] == ["Aa"]
        assert [m.keys for m in store.query_message("T", "BB").messages] == ["BB CC"]
        assert store.query_message("U", "Aa").messages == []
    finally:
        store.shutdown()


def test_rollback_records_and_redispatched_records_are_not_indexed(tmp_path, backend):
    store = _store(tmp_path, backend)
    try:
        store.put_message(Message("T", b"x", keys="k1", sys_flag=F.TRANSACTION_ROLLBACK_TYPE))
        store.put_message(Message("T", b"x", keys="k2", sys_flag=F.TRANSACTION_PREPARED_TYPE))
        store.put_message(Message("T", b"x", keys="k3"))
        testing.wait_dispatched(store)
        f = store.index_service.index_file_list[-1]
        assert f.index_count == 3
        assert store.query_message("T", "k1").messages == []
        assert len(store.query_message("T", "k2").messages) == 1
        # Re-dispatching the same records (abnormal recovery does) adds nothing: the
        # broker's `offset < endPhyOffset` check would add the last record's keys again.
        rows = np.empty(8, dtype=F.SCAN_DTYPE)
        mf = store.commitlog.mfq.files[0]
        n, *_ = store.kernels.commitlog_scan(mf.mm, 0, mf.read_position, False, rows)
        store.index_service.dispatch(rows[:n].tolist(), mf.mm)
        assert f.index_count == 3
    finally:
        store.shutdown()


def test_full_files_roll_with_names_from_the_triggering_records_store_time(tmp_path, backend):
    store = _store(tmp_path, backend, max_index_num=5, max_hash_slot_num=4)
    try:
        results = [store.put_message(Message("T", b"x", keys=f"a{i} b{i}")) for i in range(5)]
        testing.wait_dispatched(store)
        files = store.index_service.index_file_list
        # 4 entries per file: record 0 and 1, then 2 and 3, then 4.
        assert [f.file_name for f in files] == [
            time_millis_to_human_string(results[i].store_timestamp) for i in (0, 2, 4)]
        assert [f.index_count for f in files] == [5, 5, 3]
        assert files[1].begin_phy_offset == results[2].commit_log_offset
        for i, r in enumerate(results):
            for key in (f"a{i}", f"b{i}"):
                assert [m.commit_log_offset for m in store.query_message("T", key).messages] \
                    == [r.commit_log_offset]
    finally:
        store.shutdown()
    cp = (tmp_path / "checkpoint").read_bytes()
    assert struct.unpack_from(">q", cp, 16)[0] == results[3].store_timestamp


def test_a_roll_inside_one_record_names_the_next_file_after_the_last(tmp_path, backend):
    store = _store(tmp_path, backend, max_index_num=3, max_hash_slot_num=4)
    try:
        store.put_message(Message("T", b"x", keys="a b c d e"))
        testing.wait_dispatched(store)
        names = [f.file_name for f in store.index_service.index_file_list]
        assert len(names) == 3 and names == sorted(set(names))
        assert [m.keys for m in store.query_message("T", "e").messages] == ["a b c d e"]
    finally:
        store.shutdown()


def test_abnormal_recovery_destroys_and_rebuilds_index_files_past_the_checkpoint(tmp_path,
                                                                                  backend):
    root = tmp_path / "s"
    store = _store(root, backend)
    msgs = [Message(f"T{i % 3}", b"b" * (i % 50), keys=f"k{i} g{i % 7}",
                    properties={"UNIQ_KEY": f"U{i:08X}"}) for i in range(700)]
    try:
        store.put_messages(msgs[:300])
        for m in msgs[300:]:
            store.put_message(m)
    finally:
        store.shutdown()
    index_dir = root / "index"
    before = {p.name: p.read_bytes() for p in index_dir.iterdir()}
    assert len(before) == 5          # 2100 keys, 499 per file
    # A crash before any checkpoint write: every index file is past indexMsgTimestamp 0.
    (root / "abort").write_bytes(b"")
    (root / "checkpoint").write_bytes(bytes(4096))
    destroyed = []

    class Watch(type(store.fs)):
        def remove(self, path):
            destroyed.append(os.path.basename(path))
            super().remove(path)
    store = testing.open_store(root, backend, testing.small_config(), fs=Watch())
    try:
        assert not store.recovery_report.normal
        assert sorted(destroyed) == sorted(before)
        for i in (0, 299, 699):
            assert [m.keys for m in store.query_message(f"T{i % 3}", f"k{i}").messages] == \
                [f"k{i} g{i % 7}"]
    finally:
        store.shutdown()
    assert {p.name: p.read_bytes() for p in index_dir.iterdir()} == before


def test_abnormal_load_keeps_index_files_the_checkpoint_vouches_for(tmp_path, backend):
    root = tmp_path / "s"
    cfg = dict(max_index_num=10)
    store = _store(root, backend, **cfg)
    try:
        for i in range(30):
            store.put_message(Message("T", b"x", keys=f"k{i}"))
    finally:
        store.shutdown()
    index_dir = root / "index"
    before = [p.read_bytes() for p in sorted(index_dir.iterdir())]
    index_ts = struct.unpack_from(">q", (root / "checkpoint").read_bytes(), 16)[0]
    ends = [struct.unpack_from(">q", b, 8)[0] for b in before]
    vouched = sum(1 for e in ends if e <= index_ts)
    assert index_ts == ends[-2] and vouched == len(before) - 1   # the last full file
    (root / "abort").write_bytes(b"")
    store = MessageStore(root, testing.small_config(**cfg), kernels=backend)
    store.load()
    try:
        names = [f.file_name for f in store.index_service.index_file_list]
        assert names[:vouched] == sorted(os.listdir(index_dir))[:vouched]
    finally:
        store.shutdown()
    after = [p.read_bytes() for p in sorted(index_dir.iterdir())]
    assert after[:vouched] == before[:vouched]
    # Rebuilt by recovery's re-dispatch as it was: the record at the kept file's
    # endPhyOffset, which the broker's `offset < endPhyOffset` check would index once more,
    # keeps the entries it had.
    assert after[-1] == before[-1]
    store = MessageStore.open_read_only(root, kernels=backend)
    try:
        for i in range(30):
            assert len(store.query_message("T", f"k{i}").messages) == 1
    finally:
        store.shutdown()


def test_delete_expired_file_removes_files_ending_below_the_offset_but_never_the_last(tmp_path,
                                                                                    backend):
    store = _store(tmp_path, backend, max_index_num=5, max_hash_slot_num=4)
    try:
        results = [store.put_message(Message("T", b"x", keys=f"k{i}")) for i in range(13)]
        testing.wait_dispatched(store)
        svc = store.index_service
        files = list(svc.index_file_list)
        assert len(files) == 4
        assert svc.delete_expired_file(files[0].end_phy_offset) == 0
        assert svc.delete_expired_file(files[1].end_phy_offset) == 1
        assert svc.delete_expired_file(10 ** 12) == 2
        assert svc.index_file_list == files[3:]
        # Left: the last file, and the one made ahead of its roll.
        assert sorted(os.listdir(tmp_path / "index")) == [files[3].file_name]
        assert store.query_message("T", "k12").messages[0].commit_log_offset == \
            results[12].commit_log_offset
    finally:
        store.shutdown()


def test_message_index_disabled_writes_no_index(tmp_path, backend):
    store = _store(tmp_path, backend, message_index_enable=False)
    try:
        store.put_message(Message("T", b"x", keys="k"))
        testing.wait_dispatched(store)
        assert store.query_message("T", "k").messages == []
    finally:
        store.shutdown()
    assert not (tmp_path / "index").exists() or os.listdir(tmp_path / "index") == []


def test_query_rounds_narrow_end_and_max_num_is_capped(tmp_path, backend):
    # Whole seconds apart: an entry keeps its time as seconds after the file's begin.
    store = testing.open_store(tmp_path, backend, testing.small_config(max_msgs_num_batch=4),
                               clock=StepClock(1_800_000_000_000, 1000))
    try:
        rs = [store.put_message(Message("T", b"x", keys="same")) for _ in range(10)]
        testing.wait_dispatched(store)
        r = store.query_message("T", "same", max_num=100)
        assert [m.commit_log_offset for m in r.messages] == [x.commit_log_offset for x in rs[-4:]]
        r = store.query_message("T", "same", begin=rs[2].store_timestamp,
                                end=rs[5].store_timestamp)
        assert [m.commit_log_offset for m in r.messages] == \
            [x.commit_log_offset for x in rs[2:6]]
        later = rs[-1].store_timestamp + 10 ** 7
        assert store.query_message("T", "same", begin=later).messages == []
    finally:
        store.shutdown()


# ---- get_offset_in_queue_by_time: doc/02 §1.9 ----------------------------------------------

def test_a_time_window_holds_exactly_the_messages_stored_inside_it(tmp_path, backend):
    # 7 ms apart, so store times fall between the whole seconds an entry keeps.
    store = _store(tmp_path, backend)
    try:
        rs = [store.put_message(Message("T", b"x", keys="same")) for i in range(300)]
        testing.wait_dispatched(store)
        for lo, hi in ((200, 220), (143, 151), (0, 3), (299, 299), (150, 150)):
            got = store.query_message("T", "same", max_num=64, begin=rs[lo].store_timestamp,
                                      end=rs[hi].store_timestamp)
            assert [m.commit_log_offset for m in got.messages] == \
                [r.commit_log_offset for r in rs[lo:hi + 1]], (lo, hi)
        got = store.query_message("T", "same", begin=rs[200].store_timestamp + 1,
                                  end=rs[201].store_timestamp - 1)
        assert got.messages == []
    finally:
        store.shutdown()


def _queue_written_in_real_time(store):
    """250 puts to T/0 (3 ConsumeQueue files), dispatched, each file's mtime set to the store
    time of its last unit, as if written in real time; the put results and the queue."""
    rs = [store.put_message(Message("T", b"x")) for _ in range(250)]
    testing.wait_dispatched(store)
    cq = store.consume_queue_table["T"][0]
    for f in cq.mfq.files:
        last = (f.file_from_offset + f.read_position) // 20 - 1
        t = rs[last].store_timestamp / 1000
        os.utime(f.path, (t, t))
    return rs, cq


def test_offset_by_time_finds_exact_nearest_and_edge_entries(tmp_path, backend):
    store = _store(tmp_path, backend)
    try:
        rs, cq = _queue_written_in_real_time(store)
        ts = [r.store_timestamp for r in rs]                # 7 ms apart
        q = store.get_offset_in_queue_by_time
        assert q("T", 0, ts[0]) == 0
        assert q("T", 0, ts[137]) == 137
        assert q("T", 0, ts[137] + 3) == 137               # nearer the left
        assert q("T", 0, ts[137] + 4) == 138               # nearer the right
        assert q("T", 0, ts[0] - 10 ** 6) == 0
        assert q("T", 0, ts[-1] + 10 ** 6) == 249
        assert q("T", 1, ts[5]) == 0 and q("Nope", 0, ts[5]) == 0
    finally:
        store.shutdown()


def test_index_query_offset_passes_over_a_file_cleaning_destroyed_while_it_looks(tmp_path,
                                                                                backend):
    # Cleaning destroys an index file before it drops it from the list a query took: reading
    # its header raised ValueError (a closed mapping) out of IndexService.query_offset.
    store = _store(tmp_path, backend)
    try:
        store.put_messages([Message("T", b"x", keys="k") for _ in range(1200)])
        testing.wait_dispatched(store)
        files = store.index_service.index_file_list
        look = store.index_service.lookup_offsets      # query_offset without its batch cap
        assert len(files) >= 3
        every = look("T", "k", 5000, 0, LONG_MAX)[0]
        oldest = files[0].index_count - 1           # entries (the first is a blank)
        assert files[0].destroy(0)
        kept = look("T", "k", 5000, 0, LONG_MAX)[0]
        assert kept and set(kept) < set(every) and len(kept) == len(every) - oldest
        files[-1].destroy(0)            # the newest: no last-update figures, no error
        assert look("T", "k", 5000, 0, LONG_MAX)[1:] == (0, 0)
    finally:
        store.shutdown()


def test_offset_by_time_skips_a_file_deleted_while_it_looks(tmp_path, backend):
    # Cleaning (or a cut) deletes a file before it drops it from the queue's list: reading
    # its mtime raised FileNotFoundError out of get_offset_in_queue_by_time. 4.9.8's
    # File.lastModified() reads 0 for a missing file, which passes it over.
    store = _store(tmp_path, backend)
    try:
        rs, cq = _queue_written_in_real_time(store)
        first = cq.mfq.files[0]
        assert first.destroy() and not os.path.exists(first.path)
        assert store.get_offset_in_queue_by_time("T", 0, rs[137].store_timestamp) == 137
    finally:
        store.shutdown()


def test_offset_by_time_on_the_broker_store_with_broker_like_mtimes(broker_store, backend):
    msgs = [m for m in broker_messages() if m["topic"] == "LogTopic" and m["queueId"] == 1]
    qdir = broker_store / "consumequeue" / "LogTopic" / "1"
    for name in sorted(os.listdir(qdir)):
        last = min(int(name) // 20 + 49, len(msgs) - 1)
        t = msgs[last]["storeTimestamp"] / 1000
        os.utime(qdir / name, (t, t))
    store = MessageStore.open_read_only(broker_store, kernels=backend)
    try:
        for m in msgs[::17]:
            got = store.get_offset_in_queue_by_time("LogTopic", 1, m["storeTimestamp"])
            # Equal store times are possible: the answer is a unit with that time.
            assert msgs[got]["storeTimestamp"] == m["storeTimestamp"]
    finally:
        store.shutdown()


def test_numpy_views_of_an_index_file_are_zero_copy(tmp_path, backend):
    from rocketstore.fs import DEFAULT
    f = IndexFile(str(tmp_path / "20300101000000000"), 8, 16, backend, DEFAULT)
    assert f.put_key("T#a", 10, 1000) and f.put_key("T#b", 20, 2000)
    header, slots, entries = f.arrays()
    assert header["index_count"][0] == 3 and header["end_phy_offset"][0] == 20
    assert entries["phy_offset"][1:3].tolist() == [10, 20]
    assert int(slots[backend.index_hash(b"T#b") % 8]) == 2
    f.put_key("T#c", 30, 3000)
    assert entries["phy_offset"][3] == 30                  # a view, not a copy
    del header, slots, entries
    assert f.close()


def _scan_rows(kernels, data):
    from rocketstore import format as F
    rows = np.zeros(len(data) // 91 + 1, dtype=F.SCAN_DTYPE)
    n, _, _, _ = kernels.commitlog_scan(data, 0, len(data), False, rows)
    return rows[:n]


def test_index_keys_kernel_matches_the_broker_key_rule_in_every_backend():
    """rs_index_keys hashes exactly what IndexService#buildIndex indexes, in every backend."""
    from rocketstore import testing
    from rocketstore.index_service import index_keys
    store_dir = os.path.join(os.path.dirname(__file__), "data", "rmq-4.9.8-basic", "store")
    pure = testing.load_backend("pure")
    for name in sorted(os.listdir(os.path.join(store_dir, "commitlog"))):
        with open(os.path.join(store_dir, "commitlog", name), "rb") as f:
            data = f.read()
        rows = _scan_rows(pure, data)
        expected = []
        for i, row in enumerate(rows.tolist()):
            p, t = row[0] + row[17], row[0] + row[15]
            for key in index_keys(data[p:p + row[18]]):
                expected.append((pure.index_hash(data[t:t + row[16]] + b"#" + key), i))
        for backend in testing.backend_params():
            k = testing.load_backend(backend)
            hashes = np.zeros(4 * len(rows) + 1, np.int32)
            krows = np.zeros(4 * len(rows) + 1, np.int32)
            n, done = k.index_keys(data, rows, hashes, krows)
            assert done == len(rows)
            assert list(zip(hashes[:n].tolist(), krows[:n].tolist())) == expected, backend


def test_index_keys_writes_a_row_all_or_none_and_skips_rollback():
    from rocketstore import format as F, testing
    buf = bytearray(4096)
    pos = 0
    pure = testing.load_backend("pure")
    for sys_flag, keys in ((0, "a b  c"), (F.TRANSACTION_ROLLBACK_TYPE, "x"), (0, "d")):
        props = f"KEYS\x01{keys}\x02UNIQ_KEY\x01U".encode()
        pos += pure.msg_encode(buf, pos, b"T", b"", props, 0, 0, 0, pos, sys_flag, 0,
                               bytes(8), 0, bytes(8), 0, 0)
    for backend in testing.backend_params():
        k = testing.load_backend(backend)
        rows = _scan_rows(k, bytes(buf[:pos]))
        h = np.zeros(5, np.int32)
        r = np.zeros(5, np.int32)
        assert k.index_keys(bytes(buf[:pos]), rows, h, r) == (4, 2)   # row 2 did not fit
        assert r[:4].tolist() == [0, 0, 0, 0]
        assert h[0] == k.index_hash(b"T#U") and h[3] == k.index_hash(b"T#c")
        h = np.zeros(8, np.int32)
        r = np.zeros(8, np.int32)
        assert k.index_keys(bytes(buf[:pos]), rows, h, r) == (6, 3)    # rollback row skipped
        assert r[:6].tolist() == [0, 0, 0, 0, 2, 2]


def test_a_redispatched_record_whose_keys_straddle_two_files_gets_only_its_missing_keys(
        tmp_path, backend):
    store = _store(tmp_path, backend, max_index_num=4, max_hash_slot_num=4)
    try:
        store.put_message(Message("T", b"x", keys="a0"))
        store.put_message(Message("T", b"x", keys="a1 b1 c1"))     # 2 keys fit, 1 rolls over
        testing.wait_dispatched(store)
        files = store.index_service.index_file_list
        assert [g.index_count for g in files] == [4, 2]
        # The second file is lost (as abnormal recovery destroys it) and the records are
        # dispatched again: the new file gets only the key the first one lacks.
        store.index_service.index_file_list = files[:1]
        files[1].destroy(0)
        rows = np.empty(8, dtype=F.SCAN_DTYPE)
        mf = store.commitlog.mfq.files[0]
        n, *_ = store.kernels.commitlog_scan(mf.mm, 0, mf.read_position, False, rows)
        store.index_service.dispatch(rows[:n].tolist(), mf.mm)
        assert [g.index_count for g in store.index_service.index_file_list] == [4, 2]
        assert len(store.query_message("T", "c1").messages) == 1
    finally:
        store.shutdown()


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc/self/smaps")
def test_flushing_an_index_file_takes_its_pages_off_the_page_tables_and_keeps_its_entries(
        tmp_path, backend):
    # An index file is flushed once full, when nothing writes to it again: its pages need not
    # stay mapped through their write-back (FileSystem.unmap_written).
    store = testing.open_store(tmp_path / "s", backend)
    try:
        for i in range(100):
            assert store.put_message(Message("T", b"x", keys=f"k{i}")).ok
        testing.wait_until(lambda: store.query_message("T", "k99", 1, 0, 1 << 62).messages)
        f = store.index_service.index_file_list[0]
        assert testing.resident_bytes(f.mf.path) > 0
        f.flush()
        # All but the page holding the file's end, which a sync never drops (the page a
        # writer fills, in a file still written): this small file's end lies in the first
        # window of entries, which was populated ahead.
        assert testing.resident_bytes(f.mf.path) <= 4096
        hits = store.query_message("T", "k42", 10, 0, 1 << 62)
        assert [m.keys for m in hits.messages] == ["k42"]
    finally:
        store.shutdown()


@pytest.mark.skipif(not FileSystem().large_folio_size() or
                    not os.path.exists("/proc/self/smaps"),
                    reason="large page-cache folios (THP) and Linux's /proc/self/smaps")
def test_a_new_index_file_is_written_in_large_folios_and_one_loaded_from_disk_is_not(
        tmp_path, backend):
    """A file the store makes fills the page cache in 2 MiB folios, so the queries' chain
    walks over it map whole folios; its reservations end on whole folios, so a write into a
    folio never makes the file system allocate past them. A file loaded from disk keeps
    pages: a cold query reads the page it needs, not 2 MiB around it. A small file keeps
    pages too: one folio step would reserve it whole."""
    folio = FileSystem().large_folio_size()
    root = tmp_path / "s"
    store = testing.open_store(root, backend, testing.small_config(
        max_hash_slot_num=SLOTS, max_index_num=ENTRIES))
    try:
        assert store.put_message(Message("T", b"x", keys="k0")).ok
        testing.wait_dispatched(store)
        f = store.index_service.index_file_list[-1]
        assert f.mf.reserve_align == folio
        assert f.mf.reserved_position % folio == 0 and f.mf.reserved_position > f.table_end
        assert [flags >= {"hg", "rr"} for flags in testing.mapping_flags(f.path)] == [True]
        # Whatever of it is mapped by 2 MiB entries is whole folios of what is resident.
        pmd = testing.pmd_mapped_bytes(f.path)
        assert pmd % folio == 0 and pmd <= testing.resident_bytes(f.path)
        path = f.path
    finally:
        store.shutdown()
    store = testing.open_store(root, backend, testing.small_config(
        max_hash_slot_num=SLOTS, max_index_num=ENTRIES))
    try:
        f = store.index_service.index_file_list[-1]
        assert f.path == path and f.mf.reserve_align < folio
        assert ["hg" in flags for flags in testing.mapping_flags(path)] == [False]
        assert [m.keys for m in store.query_message("T", "k0", 1, 0, 1 << 62).messages] == \
            ["k0"]
    finally:
        store.shutdown()
    small = IndexFile(str(tmp_path / "small"), 1024, 4 * folio // F.INDEX_ENTRY_SIZE - 1000,
                      backend, FileSystem())
    try:
        assert small.file_size < 4 * folio and small.mf.reserve_align < folio
        assert ["hg" in flags for flags in testing.mapping_flags(small.path)] == [False]
    finally:
        small.close()


# The next index file, made ahead of its roll.
AHEAD = os.path.join(INDEX_AHEAD_DIR, INDEX_MADE_AHEAD)


class _RecordingIndexReserves(FileSystem):
    """Records each index file reservation: (path, offset, thread name, length)."""

    def __init__(self):
        self.calls = []

    def reserve(self, path, offset, length):
        if os.sep + "index" + os.sep in path or path.endswith(os.sep + AHEAD):
            self.calls.append((path, offset, threading.current_thread().name, length))
        return super().reserve(path, offset, length)


def _made_ahead(store):
    """The index file made ahead, once the populator is idle (None if there is none)."""
    populator = store.populate_service
    testing.wait_until(lambda: populator.pending == 0, what="the populator idle")
    return store.index_service._spare


def test_the_index_file_made_ahead_after_a_full_one_starts_with_the_window_it_grew_to(
        tmp_path, backend):
    """A store that filled an index file writes keys fast: its next file's first window is
    the one the full file grew to, not 64 KiB that its writer would overtake at the roll."""
    cfg = testing.small_config(max_index_num=40_000, max_hash_slot_num=1024)
    store = testing.open_store(tmp_path / "s", backend, cfg, fs=_RecordingIndexReserves())
    try:
        svc = store.index_service
        n = 0
        while len(svc.index_file_list) < 2:
            assert store.put_messages(
                [Message("T", b"x", keys=f"k{n + i}") for i in range(1000)]).ok
            n += 1000
            testing.wait_dispatched(store)
        full = svc.index_file_list[0]
        assert full.mf.reserve_window > ENTRY_RESERVE_WINDOW
        spare = _made_ahead(store)
        assert spare is not None and spare.mf.reserve_window >= full.mf.reserve_window
        table = F.INDEX_HEADER_SIZE + 1024 * F.INDEX_SLOT_SIZE
        assert spare.mf.reserved_position >= min(spare.file_size,
                                                 table + full.mf.reserve_window)
    finally:
        store.shutdown()


def test_the_index_file_made_ahead_has_its_first_window_of_entries_reserved_past_the_table(
        tmp_path, backend, monkeypatch):
    """Where the slot table ends inside a large folio, its last reservation (on the folio's
    boundary) reaches past the first entries already: the file made ahead still has its
    first window of entries reserved, or its writer reserves that whole window (32 MiB for a
    fast writer) inside its put at the roll."""
    window = 8 << 20
    monkeypatch.setattr(index_file, "ENTRY_RESERVE_WINDOW", window)
    slots, entries = 1_600_000, 600_000        # a table of 6.4 MB: it ends inside a folio
    cfg = testing.small_config(max_index_num=entries, max_hash_slot_num=slots)
    store = testing.open_store(tmp_path / "s", backend, cfg)
    try:
        assert store.put_message(Message("T", b"x", keys="k")).ok
        testing.wait_dispatched(store)
        spare = _made_ahead(store)
        assert spare is not None and spare.mf.reserve_window >= window
        folio = max(spare.mf.reserve_align, mmap.PAGESIZE)
        table = F.INDEX_HEADER_SIZE + slots * F.INDEX_SLOT_SIZE
        assert spare.mf.reserved_position >= (table + window) // folio * folio
    finally:
        store.shutdown()


def test_the_next_index_file_is_made_ahead_and_taken_at_the_roll(tmp_path, backend):
    """The file after the last one is made on the populator's thread, its slot table and
    first entries reserved, under `<last>.creating`; the roll renames it to the time of the
    record that needs it and seeds its header, so the dispatching thread (the putting one,
    when dispatch runs inline) reserves no slot table."""
    root = tmp_path / "s"
    fs = _RecordingIndexReserves()
    store = testing.open_store(root, backend, testing.small_config(max_index_num=5,
                                                                   max_hash_slot_num=4),
                               clock=StepClock(1_800_000_000_000, 7), fs=fs)
    index_dir = root / "index"
    try:
        results = [store.put_message(Message("T", b"x", keys=f"k{i}")) for i in range(4)]
        testing.wait_dispatched(store)
        svc = store.index_service
        first = svc.index_file_list[-1]
        spare = _made_ahead(store)
        # Beside index/, not in it: a broker loads every file there.
        assert spare is not None and spare.path == str(root / AHEAD)
        assert sorted(os.listdir(index_dir)) == [first.file_name]
        table = F.INDEX_HEADER_SIZE + 4 * F.INDEX_SLOT_SIZE
        assert spare.mf.reserved_position > table
        assert spare.header() == (0, 0, 0, 0, 0, 1)         # zeros until taken
        assert {(offset, who) for path, offset, who, _ in fs.calls if path == spare.path} >= \
            {(0, "PopulateAheadService")}
        # Full after 4 entries (the first is never used): the 5th key rolls.
        results += [store.put_message(Message("T", b"x", keys=f"k{i}")) for i in range(4, 8)]
        testing.wait_dispatched(store)
        files = svc.index_file_list
        assert len(files) == 2 and files[-1] is spare
        assert spare.path == str(index_dir / spare.file_name) and spare.file_name > \
            first.file_name
        assert spare.mf.file_from_offset == int(spare.file_name)
        # The roll reserved no slot table: the file's first reservation was made ahead.
        assert not [c for c in fs.calls if c[:2] == (spare.path, 0)]
        # And the next one is made ahead of the next roll.
        nxt = _made_ahead(store)
        assert nxt is not None and nxt is not spare and nxt.path == str(root / AHEAD)
        for i in range(8):
            got = store.query_message("T", f"k{i}").messages
            assert [m.commit_log_offset for m in got] == [results[i].commit_log_offset]
    finally:
        store.shutdown()
    # Nothing made ahead outlives the store, nor the directory it was made in.
    assert sorted(os.listdir(index_dir)) == sorted(f.file_name for f in files)
    assert not (root / INDEX_AHEAD_DIR).exists()


def test_the_index_files_are_the_same_bytes_whether_made_ahead_or_at_the_roll(tmp_path,
                                                                             backend):
    def index_bytes(root, ahead):
        store = testing.open_store(root, backend, testing.small_config(max_index_num=9,
                                                                       max_hash_slot_num=4),
                                   clock=StepClock(1_800_000_000_000, 7))
        if not ahead:
            store.index_service.populator = None
        try:
            for i in range(40):
                assert store.put_message(Message("T", b"x", keys=f"k{i} j{i}")).ok
                testing.wait_dispatched(store)
                if ahead:
                    _made_ahead(store)
            assert (store.index_service._spare is not None) == ahead
        finally:
            store.shutdown()
        assert not (root / AHEAD).exists()
        return {p.name: p.read_bytes() for p in (root / "index").iterdir()}

    made = index_bytes(tmp_path / "ahead", True)
    assert len(made) >= 9
    assert made == index_bytes(tmp_path / "inline", False)


def test_an_index_file_made_ahead_that_a_crash_leaves_is_removed_at_load(tmp_path, backend):
    root = tmp_path / "s"
    copy = tmp_path / "copy"
    store = _store(root, backend, max_index_num=5, max_hash_slot_num=4)
    try:
        for i in range(6):
            assert store.put_message(Message("T", b"x", keys=f"k{i}")).ok
        testing.wait_dispatched(store)
        spare = _made_ahead(store)
        assert spare is not None
        store.flush()
        # What a kill leaves: the files as they are, the file made ahead among them.
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("lock"))
    finally:
        store.shutdown()
    leftover = copy / AHEAD
    assert leftover.exists() and spare.path == str(root / AHEAD)
    # And one where releases before INDEX_AHEAD_DIR made it, in the store root.
    older = copy / INDEX_MADE_AHEAD
    shutil.copyfile(leftover, older)
    again = MessageStore(str(copy), testing.small_config(max_index_num=5, max_hash_slot_num=4),
                         clock=StepClock(1_900_000_000_000, 7), kernels=backend)
    try:
        again.load()
        assert not leftover.exists() and not older.exists()
        again.start()
        assert [str(p) for p in again.verify().problems] == []
        for i in range(6):
            assert len(again.query_message("T", f"k{i}").messages) == 1
    finally:
        again.shutdown()


def test_the_slot_table_of_the_file_made_ahead_is_reserved_a_step_at_a_time(tmp_path, backend,
                                                                           monkeypatch):
    """A step per turn of the populator, so the queues' windows asked for meanwhile wait for
    one step of a 20 MB table at most, not all of it."""
    step = 16 << 10
    monkeypatch.setattr(MappedFile, "RESERVE_STEP", step)
    fs = _RecordingIndexReserves()
    store = testing.open_store(tmp_path / "s", backend,
                               testing.small_config(max_index_num=8, max_hash_slot_num=16384),
                               clock=StepClock(1_800_000_000_000, 7), fs=fs)
    try:
        assert store.put_message(Message("T", b"x", keys="k")).ok
        testing.wait_dispatched(store)
        spare = _made_ahead(store)
        assert spare is not None
        table = spare.table_end
        # This spare's calls: the first file was made ahead under the same name before it.
        mine = [c for c in fs.calls if c[0] == spare.path]
        first = max(i for i, c in enumerate(mine) if c[1] == 0)
        steps = [(offset, length) for _, offset, _, length in mine[first:] if offset < table]
        assert steps == [(offset, min(step, table - offset)) for offset in range(0, table, step)]
        assert len(steps) == 5
        assert {who for path, _, who, _ in fs.calls if path == spare.path} == \
            {"PopulateAheadService"}
        assert spare.mf.reserved_position > table
    finally:
        store.shutdown()
