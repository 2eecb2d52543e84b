# SPDX-License-Identifier: Apache-2.0
"""Each kernel x each backend: golden bytes from the spec, then cext == cffi == pure on random
input (hypothesis), then error behaviour.

Backends come from rocketstore.testing: every backend that imports, plus those named by
ROCKETSTORE_EXPECT_BACKENDS, where a missing one fails (never skips).
"""
import ctypes
import errno
import glob
import mmap
import os
import struct
import sys
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore import format as F
from rocketstore import testing
from rocketstore.errors import KernelArgumentError, KernelBoundsError, MessageIllegalError
from rocketstore.fs import FileSystem

BACKENDS = testing.backend_params()
DATA = os.path.join(os.path.dirname(__file__), "data", "rmq-4.9.8-basic", "store")

settings.register_profile("ci", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=50, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ---- doc/01 §7: the three records a 4.9.8 broker wrote -----------------------------------

GOLDEN_RECORDS = [bytes.fromhex(h) for h in (
    "00000087daa320a7248c774f000000000000000000000000000000000000000000000000000000000000018b"
    "cfe568007f0000010000cc79000001a22cb462ad7f00000100002a9f00000000000000000000000000000010"
    "48656c6c6f20526f636b65744d51203009546f7069635465737400134b455953016b65793002544147530154616741",
    "00000087daa320a7538b47d9000000000000000000000000000000010000000000000087000000000000018b"
    "cfe56be87f0000010000cc79000001a22cb466ac7f00000100002a9f00000000000000000000000000000010"
    "48656c6c6f20526f636b65744d51203109546f7069635465737400134b455953016b65793102544147530154616741",
    "00000087daa320a74a82166300000000000000000000000000000002000000000000010e000000000000018b"
    "cfe56fd07f0000010000cc79000001a22cb46a957f00000100002a9f00000000000000000000000000000010"
    "48656c6c6f20526f636b65744d51203209546f7069635465737400134b455953016b65793202544147530154616741",
)]
STORE_TIMESTAMPS = [1796046348973, 1796046349996, 1796046350997]
BODY_CRCS = [613185359, 1401636825, 1250039395]
BORN_HOST = bytes.fromhex("7F0000010000CC79")    # 127.0.0.1:52345
STORE_HOST = bytes.fromhex("7F00000100002A9F")   # 127.0.0.1:10911
TAGA_CODE = 2598919


def _golden_fields(i, queue_offset=None, phy_offset=None, store_timestamp=None):
    return dict(topic=b"TopicTest", body=b"Hello RocketMQ %d" % i,
                props=b"KEYS\x01key%d\x02TAGS\x01TagA" % i, queue_id=0, flag=0,
                queue_offset=i if queue_offset is None else queue_offset,
                phy_offset=135 * i if phy_offset is None else phy_offset, sys_flag=0,
                born_timestamp=1700000000000 + 1000 * i, born_host=BORN_HOST,
                store_timestamp=STORE_TIMESTAMPS[i] if store_timestamp is None else store_timestamp,
                store_host=STORE_HOST, reconsume_times=0, prepared_tx_offset=0)


@pytest.mark.parametrize("i", range(3))
def test_msg_encode_reproduces_the_broker_written_record(backend, i):
    out = bytearray(200)
    assert backend.msg_encode(out, 10, **_golden_fields(i)) == 135
    assert bytes(out[10:145]) == GOLDEN_RECORDS[i]
    assert out[:10] == bytes(10) and out[145:] == bytes(55)


@pytest.mark.parametrize("i", range(3))
def test_body_crc_is_zlib_crc32_masked_to_31_bits(backend, i):
    assert backend.crc32(b"Hello RocketMQ %d" % i) & 0x7FFFFFFF == BODY_CRCS[i]


def test_msg_size_of_the_golden_record_is_135(backend):
    assert backend.msg_size(0, 16, 9, 19) == 135
    assert backend.msg_size(0, 16, 9, 19, True) == 136
    assert backend.msg_size(0x30, 0, 0, 0) == 91 + 24


@pytest.mark.parametrize("i", range(3))
def test_commitlog_append_patches_queue_offset_phy_offset_and_store_timestamp(backend, i):
    raw = bytearray(135)
    backend.msg_encode(raw, 0, **_golden_fields(i, 0, 0, 0))
    out = bytearray(405)
    assert backend.commitlog_append(out, 135 * i, bytes(raw), i, 135 * i, STORE_TIMESTAMPS[i]) == \
        135
    assert bytes(out[135 * i:135 * (i + 1)]) == GOLDEN_RECORDS[i]


def test_commitlog_append_batch_writes_consecutive_records_with_one_timestamp(backend):
    raws = bytearray()
    for i in range(3):
        raw = bytearray(135)
        backend.msg_encode(raw, 0, **_golden_fields(i, 0, 0, 0))
        raws += raw
    out = bytearray(1000)
    qo = np.array([7, 8, 9], dtype=np.int64)
    assert backend.commitlog_append_batch(out, 100, 1000, bytes(raws), qo, 5000, 42) == (3, 405)
    for i in range(3):
        rec = out[100 + 135 * i:100 + 135 * (i + 1)]
        assert struct.unpack_from(">qq", rec, 20) == (7 + i, 5000 + 135 * i)
        assert struct.unpack_from(">q", rec, 56) == (42,)
        assert rec[64:] == GOLDEN_RECORDS[i][64:] and rec[:20] == GOLDEN_RECORDS[i][:20]


def test_commitlog_append_batch_keeps_8_bytes_for_the_blank(backend):
    raws = b"".join(GOLDEN_RECORDS)
    out = bytearray(1000)
    # 135 + 135 + 8 = 278: two records fit exactly, the third would leave 7 bytes.
    assert backend.commitlog_append_batch(out, 0, 278, raws, [0, 1, 2], 0, 1) == (2, 270)
    assert backend.commitlog_append_batch(out, 0, 277, raws, [0, 1, 2], 0, 1) == (1, 135)
    assert backend.commitlog_append_batch(out, 0, 142, raws, [0, 1, 2], 0, 1) == (0, 0)


def test_commitlog_scan_reads_the_golden_records_and_stops_at_zeros(backend):
    buf = bytearray(b"".join(GOLDEN_RECORDS) + bytes(100))
    out = np.zeros(8, dtype=F.SCAN_DTYPE)
    assert backend.commitlog_scan(buf, 0, len(buf), True, out) == (3, 405, F.SCAN_EMPTY, 0)
    assert list(out["phy_offset"][:3]) == [0, 135, 270]
    assert list(out["queue_offset"][:3]) == [0, 1, 2]
    assert list(out["tags_code"][:3]) == [TAGA_CODE] * 3
    assert list(out["store_timestamp"][:3]) == STORE_TIMESTAMPS
    assert list(out["body_crc"][:3]) == BODY_CRCS
    assert list(out["info"][:3]) == [F.SCAN_INFO_HAS_TAGS] * 3
    row = out[0]
    assert (row["body_off"], row["body_len"], row["topic_off"], row["topic_len"],
            row["props_off"], row["props_len"], row["size"]) == (88, 16, 105, 9, 116, 19, 135)
    # The output fills up: END at the first record not read.
    assert backend.commitlog_scan(buf, 0, len(buf), True, out[:2]) == (2, 270, F.SCAN_END, 0)
    # A record crossing `end` is PARTIAL, whatever lies beyond `end`.
    assert backend.commitlog_scan(buf, 0, 404, True, out) == (2, 270, F.SCAN_PARTIAL, 0)


def test_commitlog_scan_reports_a_corrupt_body_crc_only_when_checking(backend):
    buf = bytearray(b"".join(GOLDEN_RECORDS) + bytes(8))
    buf[135 + 88] ^= 1
    out = np.zeros(8, dtype=F.SCAN_DTYPE)
    assert backend.commitlog_scan(buf, 0, len(buf), True, out) == (1, 135, F.SCAN_CORRUPT, 0)
    assert backend.commitlog_scan(buf, 0, len(buf), False, out) == (3, 405, F.SCAN_EMPTY, 0)


@pytest.mark.parametrize("topic", [b"../../../outside/X", b"/tmp/outside/Y", b".", b"..",
                                   b"a\x00b", b"TopicTes\xff", b"\xed\xa0\x80", b"\xc0\xaf",
                                   b"\xf4\x90\x80\x80", b"\xe4\xb8", b""])
def test_commitlog_scan_stops_at_topic_bytes_a_put_would_refuse(backend, topic):
    """The topic names a directory under consumequeue/: the scan refuses what a put refuses."""
    out = np.zeros(4, dtype=F.SCAN_DTYPE)
    buf = bytearray(8192)
    pos = 0
    for t in (b"TopicTest", topic, b"TopicTest"):
        pos += backend.msg_encode(buf, pos, t, b"body", b"", 0, 0, 0, pos, 0, 1, BORN_HOST, 2,
                                  STORE_HOST, 0, 0)
    size0 = backend.msg_size(0, 4, 9, 0)
    assert backend.commitlog_scan(buf, 0, pos, True, out) == (1, size0, F.SCAN_TOPIC, 0)
    assert backend.commitlog_scan(buf, 0, pos, False, out) == (1, size0, F.SCAN_TOPIC, 0)


@pytest.mark.parametrize("topic", [b"%|_-09azAZ" + bytes(range(ord("a"), ord("z") + 1)),
                                   "JTopic_\u00fc_\u4e2d".encode(), b"a b", b"abc\n", b"...",
                                   "\U0001f600".encode(), bytes(range(1, 47)) + b"\x7f"])
def test_commitlog_scan_takes_every_topic_a_java_store_takes(backend, topic):
    # 4.9.8's store takes any topic a Java String encodes (non-ASCII too); only a broker's send
    # path holds topics to ^[%|a-zA-Z0-9_-]+$.
    buf = bytearray(1024)
    n = backend.msg_encode(buf, 0, topic, b"x", b"", 0, 0, 0, 0, 0, 1, BORN_HOST, 2, STORE_HOST,
                           0, 0)
    out = np.zeros(2, dtype=F.SCAN_DTYPE)
    assert backend.commitlog_scan(buf, 0, n, True, out) == (1, n, F.SCAN_END, 0)


def test_msg_encode_takes_a_multibyte_buffer_body_as_its_bytes(backends):
    import array
    body = array.array("i", range(25))
    records = []
    for k in backends:
        buf = bytearray(1024)
        n = k.msg_encode(buf, 0, b"T", body, b"", 0, 0, 0, 0, 0, 1, BORN_HOST, 2, STORE_HOST, 0, 0)
        assert n == k.msg_size(0, 100, 1, 0)
        records.append(bytes(buf[:n]))
    assert records[0].find(body.tobytes()) > 0
    assert all(r == records[0] for r in records)


def test_commitlog_scan_reports_a_length_mismatch_with_its_totalsize(backend):
    rec = bytearray(GOLDEN_RECORDS[0] + b"\0")
    struct.pack_into(">i", rec, 0, 136)         # fields end at 135: Java's "[BUG]" record
    buf = GOLDEN_RECORDS[1] + bytes(rec) + bytes(8)
    out = np.zeros(4, dtype=F.SCAN_DTYPE)
    assert backend.commitlog_scan(buf, 0, len(buf), True, out) == (1, 135, F.SCAN_MISMATCH, 136)


# ---- doc/01 §7 blank, doc/01 §3.7 / 02 §1.2 tagsCode, doc/02 §3.1 ConsumeQueue -------------

def test_commitlog_blank_writes_size_then_blank_magic(backend):
    out = bytearray(32768)
    assert backend.commitlog_blank(out, 32587, 32768 - 32587) == 8
    assert bytes(out[32587:32595]) == bytes.fromhex("000000B5CBD43194")
    assert bytes(out[32595:]) == bytes(173)
    small = bytearray(8)
    backend.commitlog_blank(small, 0, 1000)
    assert bytes(small) == bytes.fromhex("000003E8CBD43194")


def test_commitlog_scan_reports_a_blank_and_its_size(backend):
    buf = bytearray(GOLDEN_RECORDS[0] + bytes(181))
    backend.commitlog_blank(buf, 135, 181)
    out = np.zeros(4, dtype=F.SCAN_DTYPE)
    assert backend.commitlog_scan(buf, 0, len(buf), True, out) == (1, 135, F.SCAN_BLANK, 181)


@pytest.mark.parametrize("text, code", [
    (b"TagA", 2598919),
    (b"refunded", int.from_bytes(bytes.fromhex("FFFFFFFFD5CDEE17"), "big", signed=True)),
    (b"TopicTest#key0", -1655984461), (b"TopicTest#key1", -1655984460),
    (b"", 0), ("\U0001F600".encode(), 31 * 0xD83D + 0xDE00), (b"\xff", 0xFFFD),
])
def test_java_hash_matches_java_string_hashcode(backend, text, code):
    assert backend.java_hash(text) == code


def test_java_hash_of_refunded_is_the_documented_value(backend):
    assert backend.java_hash(b"refunded") == -707924457


CQ_GOLDEN = bytes.fromhex("0000000000000000 00000087 000000000027A807"
                          "0000000000000087 00000087 000000000027A807"
                          "000000000000010E 00000087 000000000027A807".replace(" ", ""))


def test_cq_encode_writes_the_broker_written_units(backend):
    out = bytearray(60)
    for i in range(3):
        assert backend.cq_encode(out, 20 * i, 135 * i, 135, TAGA_CODE) == 20
    assert bytes(out) == CQ_GOLDEN


def test_cq_encode_batch_writes_the_broker_written_units(backend):
    out = bytearray(80)
    n = backend.cq_encode_batch(out, 20, np.array([0, 135, 270], dtype=np.int64),
                                np.array([135] * 3, dtype=np.int32),
                                np.array([TAGA_CODE] * 3, dtype=np.int64))
    assert n == 60 and bytes(out[20:]) == CQ_GOLDEN and out[:20] == bytes(20)


def test_cq_encode_sign_extends_a_negative_tags_code(backend):
    out = bytearray(20)
    backend.cq_encode(out, 0, 0, 1, -5)
    assert bytes(out[12:]) == bytes.fromhex("FFFFFFFFFFFFFFFB")


def test_cq_search_finds_the_first_unit_at_or_after_an_offset(backend):
    for key, want in [(-1, 0), (0, 0), (1, 1), (135, 1), (270, 2), (271, 3), (10 ** 12, 3)]:
        assert backend.cq_search(CQ_GOLDEN, 0, 60, key) == want
    assert backend.cq_search(b"\0" * 20 + CQ_GOLDEN, 20, 80, 135) == 1
    assert backend.cq_search(CQ_GOLDEN, 0, 59, 1000) == 2     # a partial unit is not a unit
    assert backend.cq_search(CQ_GOLDEN, 0, 0, 0) == 0


# ---- a real broker's store (tests/data/rmq-4.9.8-basic) ---------------------------------------

def _commitlog_files():
    return sorted(glob.glob(os.path.join(DATA, "commitlog", "*")))


def test_commitlog_scan_accepts_every_broker_record_and_agrees_with_its_consume_queues(backend):
    rows = []
    for path in _commitlog_files():
        with open(path, "rb") as f:
            data = f.read()
        out = np.zeros(len(data) // 91 + 1, dtype=F.SCAN_DTYPE)
        n, stop, reason, size = backend.commitlog_scan(data, 0, len(data), True, out)
        assert reason in (F.SCAN_BLANK, F.SCAN_EMPTY), (path, stop, reason)
        if reason == F.SCAN_BLANK:
            assert stop + size == len(data)
        base = int(os.path.basename(path))
        assert all(out["phy_offset"][:n] == out["pos"][:n] + base)
        rows.append(out[:n])
    rows = np.concatenate(rows)
    by_phy = {int(r["phy_offset"]): r for r in rows}
    units = 0
    for path in glob.glob(os.path.join(DATA, "consumequeue", "*", "*", "*")):
        topic = path.split(os.sep)[-3]
        with open(path, "rb") as f:
            cq = np.frombuffer(f.read(), dtype=F.CQ_DTYPE)
        for u in cq[(cq["size"] > 0) & (cq["size"] != 0x7FFFFFFF)]:
            r = by_phy[int(u["offset"])]
            assert int(r["size"]) == int(u["size"])
            if topic != F.SCHEDULE_TOPIC:
                assert int(r["tags_code"]) == int(u["tags_code"])
            units += 1
    assert units > 100


# ---- cext == cffi == pure on random input ------------------------------------------------------

def _same(results):
    first = results[0]
    for r in results[1:]:
        assert r == first
    return first


def _outcome(fn, *args, **kwargs):
    """Return value or exception type, so that error behaviour is compared too."""
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:   # noqa: BLE001 - the type is the result under test
        return ("raise", type(exc))


@pytest.mark.parametrize("n", list(range(0, 301)) + [511, 512, 1023, 1024, 4095, 4097, 65536])
def test_crc32_equals_zlib_for_every_short_length(backends, n):
    data = bytes((i * 37 + n) & 0xFF for i in range(n + 3))
    for k in backends:
        for off in (0, 1, 3):       # unaligned starts through memoryview slices
            view = memoryview(data)[off:off + n]
            assert k.crc32(view) == zlib.crc32(view)
            assert k.crc32(view, 0x12345678) == zlib.crc32(view, 0x12345678)


def test_crc32_equals_zlib_on_large_buffers_and_chains(backends):
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, size=3 * 1024 * 1024 + 77, dtype=np.uint8)
    want = zlib.crc32(data)
    for k in backends:
        assert k.crc32(data) == want
        assert k.crc32(data[1000:], k.crc32(data[:1000])) == want
        assert k.crc32(bytearray(data.tobytes())) == want


@given(st.binary(max_size=3000), st.integers(0, 0xFFFFFFFF))
def test_crc32_equals_zlib_on_random_bytes(backends, data, value):
    assert _same([k.crc32(data, value) for k in backends]) == zlib.crc32(data, value)


@given(st.one_of(st.binary(max_size=64),
                 st.text(max_size=32).map(lambda s: s.encode("utf-8", "surrogatepass")),
                 st.lists(st.sampled_from([b"\xf0\x9f\x98\x80", b"\xed\xa0\x80", b"\xe0\x80",
                                           b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xe2\x82",
                                           b"\xf0\x9f\x98", b"a", b"\x80", b"\xef\xbf\xbd"]),
                          max_size=12).map(b"".join)))
def test_java_hash_agrees_across_backends_incl_invalid_utf8(backends, data):
    text = data.decode("utf-8", "replace")
    units = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for (u,) in struct.iter_unpack(">H", units):
        h = (31 * h + u) & 0xFFFFFFFF
    want = h - (1 << 32) if h & 0x80000000 else h
    assert _same([k.java_hash(data) for k in backends]) == want


def _segment():
    return st.one_of(
        st.builds(lambda v: b"TAGS\x01" + v, st.binary(min_size=0, max_size=8)),
        st.sampled_from([b"TAGS\x01TagA", b"KEYS\x01k1 k2", b"\x01TAGS", b"TAGS", b"TAGS\x01",
                         b"TA", b"", b"DELAY\x013", b"TAGS\x01\xf0\x9f\x98\x80", b"TAGS\x01\xff",
                         b"TAGS\x01a\x01b"]),
        st.binary(max_size=10))


PROPS = st.lists(_segment(), max_size=5).map(b"\x02".join).filter(lambda p: len(p) <= 32767)
INT32 = st.integers(-2 ** 31, 2 ** 31 - 1)
INT64 = st.integers(-2 ** 63, 2 ** 63 - 1)


def _tag_list(tags):
    """The tags_match arguments of a list of UTF-8 tags: (concatenation, int64 ends)."""
    return b"".join(tags), np.cumsum([len(t) for t in tags], dtype=np.int64)


def test_tags_match_finds_the_golden_record_tag(backend):
    props = b"KEYS\x01key0\x02TAGS\x01TagA"
    assert backend.tags_match(props, *_tag_list([b"Aa", b"TagA"]))
    assert not backend.tags_match(props, *_tag_list([b"TagB", b"Tag", b"TagAA"]))
    assert not backend.tags_match(b"KEYS\x01TagA", *_tag_list([b"TagA"]))   # no TAGS
    assert not backend.tags_match(b"", *_tag_list([b"TagA"]))
    assert not backend.tags_match(props, *_tag_list([]))
    # The last valid TAGS segment is the one (string2messageProperties' HashMap#put).
    assert backend.tags_match(b"TAGS\x01Old\x02TAGS\x01New\x02TAGS\x01", *_tag_list([b"New"]))
    assert not backend.tags_match(b"TAGS\x01Old\x02TAGS\x01New", *_tag_list([b"Old"]))


@pytest.mark.parametrize("ends", [[3, 2], [5], [-1, 2]])
def test_tags_match_rejects_ends_outside_or_out_of_order(backend, ends):
    with pytest.raises(KernelArgumentError):
        backend.tags_match(b"TAGS\x01abc", b"abcd", np.array(ends, dtype=np.int64))


@given(PROPS, st.lists(st.one_of(st.sampled_from([b"TagA", b"", b"\xf0\x9f\x98\x80", b"\xff"]),
                                 st.binary(max_size=8)), max_size=4))
def test_tags_match_agrees_across_backends(backends, props, tags):
    blob, ends = _tag_list(tags)
    got = _same([k.tags_match(props, blob, ends) for k in backends])
    value = None
    for seg in props.split(b"\x02"):
        i = seg.find(b"\x01")
        if seg[:i] == b"TAGS" and 0 < i < len(seg) - 1:
            value = seg[i + 1:]
    assert got == (value is not None and value in tags)


@st.composite
def records(draw):
    v2 = draw(st.booleans())
    sys_flag = draw(INT32)
    bh = 20 if sys_flag & 0x10 else 8
    sh = 20 if sys_flag & 0x20 else 8
    topic = draw(st.one_of(st.just(F.SCHEDULE_TOPIC.encode()),
                           st.binary(max_size=300 if v2 else 127)))
    return dict(topic=topic, body=draw(st.one_of(st.binary(max_size=200),
                                                 st.binary(min_size=4000, max_size=9000))),
                props=draw(PROPS), queue_id=draw(INT32), flag=draw(INT32),
                queue_offset=draw(INT64), phy_offset=draw(INT64), sys_flag=sys_flag,
                born_timestamp=draw(INT64), born_host=draw(st.binary(min_size=bh, max_size=bh)),
                store_timestamp=draw(INT64), store_host=draw(st.binary(min_size=sh, max_size=sh)),
                reconsume_times=draw(INT32), prepared_tx_offset=draw(INT64), v2=v2)


@given(records(), st.integers(0, 64), st.integers(-4, 64))
def test_msg_encode_agrees_across_backends(backends, fields, pos, slack):
    size = backends[0].msg_size(fields["sys_flag"], len(fields["body"]), len(fields["topic"]),
                                len(fields["props"]), fields["v2"])
    results = []
    for k in backends:
        out = bytearray(b"\xa5" * max(0, pos + size + slack))
        results.append((_outcome(k.msg_encode, out, pos, **fields), bytes(out)))
    outcome, _ = _same(results)
    assert outcome == (("ok", size) if slack >= 0 else ("raise", KernelBoundsError))


def test_msg_encode_copies_topics_and_properties_of_every_short_length_alike(backends):
    """The encoder copies short fields with fixed-size moves chosen by length (1-3, 4-7,
    8-16, 17-32 bytes, then memmove): every length from 0 to 40, with IPv6 hosts (20
    bytes), comes out the same in every backend."""
    for n in range(41):
        fields = dict(topic=bytes(range(65, 65 + n)) or b"T", body=bytes(range(n)),
                      props=bytes(range(97, 97 + n)), queue_id=1, flag=2, queue_offset=3,
                      phy_offset=4, sys_flag=0x30, born_timestamp=5,
                      born_host=bytes(range(100, 120)), store_timestamp=6,
                      store_host=bytes(range(200, 220)), reconsume_times=7,
                      prepared_tx_offset=8)
        results = []
        for k in backends:
            out = bytearray(b"\xa5" * 400)
            results.append((_outcome(k.msg_encode, out, 3, **fields), bytes(out)))
        _same(results)


@given(records(), st.sampled_from(["born", "store", "topic", "props"]))
def test_msg_encode_rejects_bad_hosts_and_long_fields_alike(backends, fields, what):
    if what == "born":
        fields["born_host"] += b"\0"
        want = KernelArgumentError
    elif what == "store":
        fields["store_host"] = fields["store_host"][:-1]
        want = KernelArgumentError
    elif what == "topic":
        fields["topic"] = b"t" * (32768 if fields["v2"] else 128)
        want = MessageIllegalError
    else:
        fields["props"] = b"p" * 32768
        want = MessageIllegalError
    out = bytearray(70000)
    for k in backends:
        assert _outcome(k.msg_encode, out, 0, **fields) == ("raise", want)
    assert out == bytearray(70000)


@st.composite
def damaged_logs(draw):
    """Records concatenated, then damaged: truncated, bit-flipped, blanked or zero-filled."""
    pure = testing.load_backend("pure")
    recs = draw(st.lists(records(), min_size=0, max_size=6))
    buf = bytearray()
    for fields in recs:
        fields = dict(fields, body=fields["body"][:300])
        size = pure.msg_size(fields["sys_flag"], len(fields["body"]), len(fields["topic"]),
                             len(fields["props"]), fields["v2"])
        rec = bytearray(size)
        pure.msg_encode(rec, 0, **fields)
        buf += rec
    tail = draw(st.sampled_from(["zeros", "blank", "junk", "none"]))
    if tail == "zeros":
        buf += bytes(draw(st.integers(0, 20)))
    elif tail == "blank":
        blank = bytearray(8)
        pure.commitlog_blank(blank, 0, draw(INT32))
        buf += blank + bytes(draw(st.integers(0, 10)))
    elif tail == "junk":
        buf += draw(st.binary(max_size=40))
    for _ in range(draw(st.integers(0, 3))):
        if buf:
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << draw(st.integers(0, 7))
    if buf and draw(st.booleans()):
        del buf[draw(st.integers(0, len(buf))):]
    return bytes(buf)


@given(damaged_logs(), st.booleans(), st.integers(0, 8), st.data())
def test_commitlog_scan_agrees_across_backends_on_damaged_logs(backends, buf, check_crc, cap,
                                                              data):
    start = data.draw(st.integers(0, len(buf)))
    end = data.draw(st.integers(start, len(buf)))
    results = []
    for k in backends:
        out = np.full(cap, -1, dtype=F.SCAN_DTYPE)
        results.append((k.commitlog_scan(buf, start, end, check_crc, out), out.tobytes()))
    _same(results)


@given(damaged_logs(), st.booleans())
def test_commitlog_scan_agrees_from_every_record_start(backends, buf, check_crc):
    out = np.zeros(16, dtype=F.SCAN_DTYPE)
    n, _, _, _ = backends[0].commitlog_scan(buf, 0, len(buf), check_crc, out)
    for start in [0] + [int(p) + int(s) for p, s in zip(out["pos"][:n], out["size"][:n])]:
        results = []
        for k in backends:
            o = np.zeros(16, dtype=F.SCAN_DTYPE)
            results.append((k.commitlog_scan(buf, start, len(buf), check_crc, o), o.tobytes()))
        _same(results)


@given(st.lists(records(), max_size=5), st.integers(0, 40), st.integers(0, 2000),
       st.integers(0, 6), INT64, INT64)
def test_commitlog_append_batch_agrees_across_backends(backends, recs, pos, room, n_offsets,
                                                       phy_base, store_ts):
    pure = testing.load_backend("pure")
    raws = bytearray()
    for fields in recs:
        fields = dict(fields, body=fields["body"][:100])
        rec = bytearray(pure.msg_size(fields["sys_flag"], len(fields["body"]),
                                      len(fields["topic"]), len(fields["props"]), fields["v2"]))
        pure.msg_encode(rec, 0, **fields)
        raws += rec
    qo = np.arange(100, 100 + n_offsets, dtype=np.int64)
    results = []
    for k in backends:
        out = bytearray(b"\x5a" * (pos + room + 16))
        results.append((_outcome(k.commitlog_append_batch, out, pos, pos + room, bytes(raws), qo,
                                 phy_base % (1 << 40), store_ts), bytes(out)))
    _same(results)


@given(st.binary(min_size=0, max_size=120), st.integers(-2, 60), INT64, INT64, INT64)
def test_commitlog_append_agrees_across_backends_on_any_bytes(backends, rec, pos, qo, phy, ts):
    results = []
    for k in backends:
        out = bytearray(b"\x11" * 150)
        results.append((_outcome(k.commitlog_append, out, pos, rec, qo, phy, ts), bytes(out)))
    _same(results)


@given(st.lists(st.tuples(INT64, INT32, INT64), max_size=50), st.integers(0, 30))
def test_cq_encode_batch_agrees_with_cq_encode_across_backends(backends, units, pos):
    offsets = np.array([u[0] for u in units], dtype=np.int64)
    sizes = np.array([u[1] for u in units], dtype=np.int32)
    tags = np.array([u[2] for u in units], dtype=np.int64)
    single = bytearray(pos + 20 * len(units))
    for i, u in enumerate(units):
        backends[0].cq_encode(single, pos + 20 * i, *u)
    for k in backends:
        out = bytearray(pos + 20 * len(units))
        assert k.cq_encode_batch(out, pos, offsets, sizes, tags) == 20 * len(units)
        assert out == single
        lists = bytearray(len(out))   # plain lists are converted, as numpy.asarray would
        k.cq_encode_batch(lists, pos, list(offsets), list(sizes), list(tags))
        assert lists == single


@given(st.lists(st.integers(-2 ** 40, 2 ** 40), max_size=60), st.booleans(),
       st.integers(-2 ** 41, 2 ** 41), st.integers(0, 19), st.data())
def test_cq_search_agrees_with_numpy_searchsorted_even_unsorted(backends, offsets, sort, key,
                                                                ragged, data):
    if sort:
        offsets = sorted(offsets)
    units = np.zeros(len(offsets), dtype=F.CQ_DTYPE)
    units["offset"] = offsets
    buf = units.tobytes() + bytes(ragged)
    start = 20 * data.draw(st.integers(0, len(offsets)))
    want = int(np.searchsorted(units["offset"][start // 20:], key, side="left"))
    assert _same([k.cq_search(buf, start, len(buf), key) for k in backends]) == want


# ---- buffers and errors -------------------------------------------------------------------------

def _window():
    """A 32-byte writable window with 16 guard bytes on each side."""
    backing = bytearray(b"\xee" * 64)
    return backing, memoryview(backing)[16:48]


WRITES = {
    "msg_encode": lambda k, w, pos: k.msg_encode(w, pos, **_golden_fields(0)),
    "commitlog_append": lambda k, w, pos: k.commitlog_append(w, pos, GOLDEN_RECORDS[0], 0, 0, 0),
    "commitlog_append_batch": lambda k, w, pos: k.commitlog_append_batch(
        w, pos, len(w) + 1, GOLDEN_RECORDS[0], [0], 0, 0),
    "commitlog_blank": lambda k, w, pos: k.commitlog_blank(w, pos, 8),
    "cq_encode": lambda k, w, pos: k.cq_encode(w, pos, 1, 2, 3),
    "cq_encode_batch": lambda k, w, pos: k.cq_encode_batch(
        w, pos, np.array([1, 2], dtype=np.int64), np.array([1, 2], dtype=np.int32),
        np.array([1, 2], dtype=np.int64)),
}


@pytest.mark.parametrize("kernel", sorted(WRITES))
@pytest.mark.parametrize("pos", [-1, 25, 32, 10 ** 6])
def test_out_of_bounds_writes_raise_and_touch_nothing(backend, kernel, pos):
    backing, window = _window()
    with pytest.raises(KernelBoundsError):
        WRITES[kernel](backend, window, pos)
    assert backing == bytearray(b"\xee" * 64)


def test_out_of_bounds_reads_raise(backend):
    out = np.zeros(2, dtype=F.SCAN_DTYPE)
    for start, end in [(-1, 10), (0, 101), (50, 40)]:
        with pytest.raises(KernelBoundsError):
            backend.commitlog_scan(bytes(100), start, end, True, out)
        with pytest.raises(KernelBoundsError):
            backend.cq_search(bytes(100), start, end, 0)


def test_commitlog_scan_rejects_an_output_of_another_dtype(backend):
    with pytest.raises(KernelArgumentError):
        backend.commitlog_scan(GOLDEN_RECORDS[0], 0, 135, True, np.zeros(4, dtype=np.int64))


def test_msg_size_rejects_negative_and_too_long_lengths(backend):
    with pytest.raises(KernelArgumentError):
        backend.msg_size(0, -1, 1, 1)
    with pytest.raises(MessageIllegalError):
        backend.msg_size(0, 1, 128, 1)
    assert backend.msg_size(0, 1, 128, 1, True) == 91 + 1 + 128 + 1 + 1
    with pytest.raises(MessageIllegalError):
        backend.msg_size(0, 1, 1, 32768)
    with pytest.raises(MessageIllegalError):
        backend.msg_size(0, 2 ** 31 - 50, 1, 1)


def test_commitlog_append_rejects_records_shorter_than_their_header(backend):
    out = bytearray(300)
    with pytest.raises(KernelBoundsError):
        backend.commitlog_append(out, 0, GOLDEN_RECORDS[0][:55], 0, 0, 0)
    with pytest.raises(KernelArgumentError):
        backend.commitlog_append(out, 0, GOLDEN_RECORDS[0][:100], 0, 0, 0)   # TOTALSIZE 135
    assert out == bytearray(300)


def test_commitlog_append_batch_rejects_too_few_queue_offsets(backend):
    with pytest.raises(KernelArgumentError):
        backend.commitlog_append_batch(bytearray(1000), 0, 1000, b"".join(GOLDEN_RECORDS),
                                       np.array([0, 1], dtype=np.int64), 0, 0)


def test_cq_encode_batch_rejects_arrays_of_different_lengths(backend):
    with pytest.raises(KernelArgumentError):
        backend.cq_encode_batch(bytearray(100), 0, [1, 2], [1], [1, 2])


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "numpy"])
def test_kernels_accept_every_contiguous_buffer_type(backend, kind):
    src = b"".join(GOLDEN_RECORDS) + bytes(16)
    wrap = {"bytes": bytes, "bytearray": bytearray,
            "memoryview": lambda b: memoryview(bytearray(b"xx" + b))[2:],
            "numpy": lambda b: np.frombuffer(bytearray(b), dtype=np.uint8)}[kind]
    buf = wrap(src)
    assert backend.crc32(buf) == zlib.crc32(src)
    assert backend.java_hash(wrap(b"TagA")) == TAGA_CODE
    out = np.zeros(4, dtype=F.SCAN_DTYPE)
    assert backend.commitlog_scan(buf, 0, len(src), True, out)[:3] == (3, 405, F.SCAN_EMPTY)
    assert backend.cq_search(wrap(CQ_GOLDEN), 0, 60, 135) == 1
    if kind != "bytes":
        dst = wrap(bytes(300))
        assert backend.commitlog_append(dst, 0, wrap(GOLDEN_RECORDS[1]), 1, 135,
                                        STORE_TIMESTAMPS[1]) == 135
        assert bytes(dst[:135]) == GOLDEN_RECORDS[1]
        fields = _golden_fields(2)
        for name in ("topic", "body", "props", "born_host", "store_host"):
            fields[name] = wrap(fields[name])
        assert backend.msg_encode(dst, 135, **fields) == 135
        assert bytes(dst[135:270]) == GOLDEN_RECORDS[2]


def test_pure_msg_encode_and_cq_batch_write_into_numpy_outputs():
    pure = testing.load_backend("pure")
    out = np.zeros(135, dtype=np.uint8)
    pure.msg_encode(out, 0, **_golden_fields(0))
    assert out.tobytes() == GOLDEN_RECORDS[0]
    units = np.zeros(40, dtype=np.uint8)
    pure.cq_encode_batch(units, 0, np.array([0, 135], np.int64), np.array([135, 135], np.int32),
                         np.array([2598919, 2598919], np.int64))
    assert units.tobytes()[20:] == bytes.fromhex("0000000000000087000000870000000000" "27A807")


def test_kernels_work_on_a_shared_mmap_and_leave_no_export_behind(backend, tmp_path):
    path = tmp_path / "00000000000000000000"
    path.write_bytes(bytes(4096))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 4096)
        for i in range(3):
            backend.msg_encode(mm, 135 * i, **_golden_fields(i))
        backend.commitlog_blank(mm, 405, 4096 - 405)
        out = np.zeros(8, dtype=F.SCAN_DTYPE)
        assert backend.commitlog_scan(mm, 0, 4096, True, out) == (3, 405, F.SCAN_BLANK, 3691)
        backend.cq_encode(mm, 1000, 1, 2, 3)
        assert backend.crc32(mm) == zlib.crc32(mm)
        backend.sync_range(mm, f.fileno(), 100, 500)
        backend.sync_range(mm, f.fileno(), 0, 0)
        mm.close()                  # raises BufferError if a kernel kept a view
    assert path.read_bytes()[:405] == b"".join(GOLDEN_RECORDS)


def test_sync_mapped_opens_the_file_only_for_a_backend_that_needs_its_descriptor(
        backend, tmp_path, monkeypatch):
    # The compiled backends msync the mapping: an open and a close per sync were a sixth of
    # SYNC_FLUSH's CPU per put. The pure backend's fdatasync still gets a real descriptor.
    from rocketstore import fs as fs_module
    opened = []
    real_open = fs_module.open_nofollow

    def counting_open(path, flags, mode=0o644):
        opened.append(path)
        return real_open(path, flags, mode)
    monkeypatch.setattr(fs_module, "open_nofollow", counting_open)
    path = tmp_path / "00000000000000000000"
    path.write_bytes(bytes(8192))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 8192)
        try:
            mm[100:600] = b"x" * 500
            fs_module.FileSystem().sync_mapped(backend, mm, str(path), 100, 500)
        finally:
            mm.close()
    msyncs = backend.NAME != "pure"
    assert getattr(backend, "SYNC_RANGE_FD_UNUSED", False) is msyncs
    assert opened == ([] if msyncs else [str(path)])
    assert path.read_bytes()[100:600] == b"x" * 500


class _HookedSync(FileSystem):
    """A FileSystem whose two sync steps are hooked, as fault-injecting doubles hook them."""

    def __init__(self):
        self.calls = []

    def unmap_written(self, mm, start, length):
        self.calls.append(("unmap_written", start, length))
        super().unmap_written(mm, start, length)

    def sync_mapped(self, kernels, mm, path, start, length):
        self.calls.append(("sync_mapped", start, length))
        super().sync_mapped(kernels, mm, path, start, length)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc/self/smaps")
@pytest.mark.parametrize("hooked", [False, True], ids=["plain", "hooked"])
def test_sync_written_syncs_the_range_and_takes_its_whole_pages_off_the_page_tables(
        backend, tmp_path, hooked):
    # One call releasing the GIL once where the backend msyncs (sync_written); a FileSystem
    # whose steps are hooked still sees both, with the same pages.
    page = 4096
    path = tmp_path / "00000000000000000000"
    path.write_bytes(bytes(8 * page))
    fs = _HookedSync() if hooked else FileSystem()
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 8 * page)
        try:
            mm[100:5 * page + 10] = b"y" * (5 * page - 90)
            before = testing.resident_bytes(str(path))
            assert before >= 6 * page
            fs.sync_written(backend, mm, str(path), 100, 5 * page + 10)
            # Pages 0-4 are written for good and dropped; page 5 holds the end and stays (and
            # so do pages 6-7 if the write's fault mapped them around it).
            assert testing.resident_bytes(str(path)) == before - 5 * page
            assert mm[100:5 * page + 10] == b"y" * (5 * page - 90)     # mapped back on touch
        finally:
            mm.close()
    if hooked:
        assert fs.calls == [("unmap_written", 0, 5 * page), ("sync_mapped", 100, 5 * page - 90)]
    assert path.read_bytes()[100:5 * page + 10] == b"y" * (5 * page - 90)


class _RecordingKernels:
    """A backend whose two sync kernels record the ranges they are given."""

    def __init__(self, inner):
        self._inner = inner
        self.calls = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def sync_range(self, mm, fd, start, length):
        self.calls.append(("sync_range", start, length))
        return self._inner.sync_range(mm, fd, start, length)

    def __dir__(self):
        return dir(self._inner)


def _recording_kernels(backend):
    k = _RecordingKernels(backend)
    if hasattr(backend, "sync_written"):
        def sync_written(mm, start, length, drop):
            k.calls.append(("sync_written", start, length))
            return backend.sync_written(mm, start, length, drop)
        k.sync_written = sync_written
    return k


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc/self/smaps")
@pytest.mark.parametrize("hooked", [False, True], ids=["plain", "hooked"])
def test_sync_written_goes_to_the_disk_a_chunk_at_a_time(backend, tmp_path, hooked):
    # One msync of a whole flush put all of it in the device's queue, ahead of every read
    # the store needed meanwhile. Chunks end on multiples of SYNC_CHUNK; the pure backend's
    # fdatasync syncs the whole file whatever the range, so it makes one call.
    page = 4096
    base = _HookedSync if hooked else FileSystem
    fs = type("ChunkedSync", (base,), {"SYNC_CHUNK": 2 * page})()
    kernels = _recording_kernels(backend)
    path = tmp_path / "00000000000000000000"
    path.write_bytes(bytes(8 * page))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 8 * page)
        try:
            mm[100:5 * page + 10] = b"y" * (5 * page - 90)
            before = testing.resident_bytes(str(path))
            fs.sync_written(kernels, mm, str(path), 100, 5 * page + 10)
            assert testing.resident_bytes(str(path)) == before - 5 * page
        finally:
            mm.close()
    chunks = [(100, 2 * page - 100), (2 * page, 2 * page), (4 * page, page + 10)]
    if not getattr(backend, "SYNC_RANGE_FD_UNUSED", False):
        chunks = [(100, 5 * page - 90)]
    kernel = "sync_range" if hooked or not hasattr(backend, "sync_written") else "sync_written"
    assert kernels.calls == [(kernel, start, length) for start, length in chunks]
    if hooked:
        pages = [(start - start % page, (start + length) // page * page - start + start % page)
                 for start, length in chunks]
        assert fs.calls == [call for (lo, n), (start, length) in zip(pages, chunks)
                            for call in (("unmap_written", lo, n),
                                         ("sync_mapped", start, length))]
    assert path.read_bytes()[100:5 * page + 10] == b"y" * (5 * page - 90)


def test_write_behind_writes_a_files_range_back_and_refuses_bad_arguments(backend, tmp_path):
    """FileSystem.write_behind opens the file and hands its descriptor to the backend's
    write_behind (Linux's sync_file_range, `chunk` bytes at a time). The pure backend has none,
    and a system without sync_file_range writes nothing: both say False, leaving the range to
    the sync that follows. Nothing read or written through the file changes."""
    fs = FileSystem()
    path = tmp_path / "00000000000000000000"
    data = bytes(range(256)) * (3 << 12)                # 3 MiB, dirty in the page cache
    path.write_bytes(data)
    has = hasattr(backend, "write_behind")
    writes = has and sys.platform.startswith("linux")
    assert fs.write_behind(backend, str(path), 4096, len(data)) is writes
    assert fs.write_behind(backend, str(path), 4096, 4096) is False     # nothing to write
    assert fs.write_behind(backend, str(tmp_path / "gone"), 0, 4096) is False
    if has:
        fd = os.open(path, os.O_RDONLY)
        try:
            assert backend.write_behind(fd, 0, 4096, 4096) is writes
            for start, length, chunk in ((-1, 10, 4096), (0, -1, 4096), (0, 10, 0)):
                with pytest.raises(KernelBoundsError):
                    backend.write_behind(fd, start, length, chunk)
        finally:
            os.close(fd)
        if sys.platform.startswith("linux"):
            with pytest.raises(OSError) as e:
                backend.write_behind(fd, 0, 10, 4096)         # closed: not a descriptor
            assert e.value.errno == errno.EBADF
    assert path.read_bytes() == data


COMPILED = [b for b in BACKENDS if b != "pure"]


@pytest.fixture(params=COMPILED)
def compiled(request):
    """The compiled backends only: pure syncs the whole file with fdatasync, not a range."""
    return testing.load_backend(request.param)


@pytest.mark.parametrize("start, length", [(-1, 10), (0, 4097), (4000, 100), (10, -1)])
def test_sync_range_outside_the_mapping_raises_in_compiled_backends(compiled, tmp_path, start,
                                                                    length):
    backend = compiled
    path = tmp_path / "f"
    path.write_bytes(bytes(4096))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 4096)
        try:
            with pytest.raises(KernelBoundsError):
                backend.sync_range(mm, f.fileno(), start, length)
            with pytest.raises(KernelBoundsError):
                backend.sync_written(mm, start, length, True)
        finally:
            mm.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="munmap of one page via libc")
def test_sync_range_of_an_unmapped_buffer_raises_oserror(compiled):
    # A buffer whose middle page is no longer mapped: msync over it fails with ENOMEM, which
    # the kernel's status must carry out as an OSError with that errno (not RS_E_BOUNDS, not
    # silence). The hole is mapped again before the mmap object is closed.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    mm = mmap.mmap(-1, 3 * page)
    anchor = ctypes.c_char.from_buffer(mm)
    hole = ctypes.addressof(anchor) + page
    del anchor
    assert libc.munmap(hole, page) == 0
    try:
        with pytest.raises(OSError) as info:
            compiled.sync_range(mm, -1, 0, 3 * page)
        assert info.value.errno == errno.ENOMEM
        compiled.sync_range(mm, -1, 0, page)          # the mapped first page still syncs
    finally:
        back = libc.mmap(hole, page, mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x10, -1, 0)   # MAP_FIXED
        assert back == hole
        mm.close()


@pytest.mark.parametrize("body_len", [0, 1, 4096, 4097, 70000])
def test_msg_encode_is_identical_across_the_gil_release_threshold(backends, body_len):
    fields = _golden_fields(0)
    fields["body"] = bytes(range(256)) * (body_len // 256) + bytes(body_len % 256)
    outs = []
    for k in backends:
        out = bytearray(body_len + 200)
        k.msg_encode(out, 0, **fields)
        outs.append(out)
    _same(outs)
    assert struct.unpack_from(">i", outs[0], 8)[0] == zlib.crc32(fields["body"]) & 0x7FFFFFFF


def test_expected_backends_are_all_present():
    expected = testing.expected_backends()
    missing = [b for b in expected if b not in BACKENDS]
    assert not missing
    for name in expected:
        testing.load_backend(name)


def test_empty_inputs_are_valid_everywhere(backends):
    for k in backends:
        assert k.crc32(b"") == 0
        assert k.java_hash(b"") == 0
        assert k.cq_encode_batch(bytearray(0), 0, np.zeros(0, np.int64), np.zeros(0, np.int32),
                                 np.zeros(0, np.int64)) == 0
        assert k.commitlog_append_batch(bytearray(0), 0, 0, b"", np.zeros(0, np.int64), 0, 0) \
            == (0, 0)
        assert k.commitlog_scan(b"", 0, 0, True, np.zeros(1, F.SCAN_DTYPE)) == (0, 0, 0, 0)
        assert k.cq_search(b"", 0, 0, 5) == 0



# ---- batch_encode: a column batch encoded in place (MessageStore.put_batch) -----------------

def test_batch_encode_writes_the_broker_records_from_columns(backend):
    """The three broker-written records from one body column, one KEYS column and the shared
    fragments around it; one call per record because the broker stamped each its own time."""
    bodies = [b"Hello RocketMQ %d" % i for i in range(3)]
    keys = [b"key%d" % i for i in range(3)]
    body_off = np.cumsum([0] + [len(b) for b in bodies]).astype(np.int64)
    key_off = np.cumsum([0] + [len(k) for k in keys]).astype(np.int64)
    frags = b"KEYS\x01" + b"\x02TAGS\x01TagA"
    out = bytearray(3 * 135 + 8)
    for i in range(3):
        f = _golden_fields(i)
        assert backend.batch_encode(
            out, 135 * i, len(out), f["topic"], 0, b"".join(bodies), body_off, b"".join(keys),
            key_off, None, None, frags, np.array([0, 5, 15, 15], dtype=np.int64), i, i + 1, 0,
            0, f["born_timestamp"], BORN_HOST, f["store_timestamp"], STORE_HOST, i,
            135 * i) == (1, 135)
    assert bytes(out) == b"".join(GOLDEN_RECORDS) + bytes(8)


def _column(draw, n, max_item):
    items = [draw(st.binary(max_size=max_item)) for _ in range(n)]
    off = np.cumsum([0] + [len(x) for x in items]).astype(np.int64)
    if draw(st.booleans()):           # a hostile offset: out of range or decreasing
        off[draw(st.integers(0, n))] = draw(st.integers(-3, len(b"".join(items)) + 3))
    return b"".join(items), off


@st.composite
def _batches(draw):
    n = draw(st.integers(0, 5))
    bodies, body_off = _column(draw, n, 40)
    a, a_off = _column(draw, n, 12) if draw(st.booleans()) else (None, None)
    b, b_off = _column(draw, n, 12) if draw(st.booleans()) else (None, None)
    frags = draw(st.binary(max_size=20))
    cuts = sorted(draw(st.integers(0, len(frags))) for _ in range(3))
    first = draw(st.integers(0, n))
    limit = draw(st.integers(0, 1200))
    return (limit, bodies, body_off, a, a_off, b, b_off, frags,
            np.array([0] + cuts, dtype=np.int64), first, n)


@given(batch=_batches(), pos=st.integers(0, 64))
def test_batch_encode_agrees_across_backends(backends, batch, pos):
    limit, bodies, body_off, a, a_off, b, b_off, frags, frag_off, first, n = batch
    results = []
    for k in backends:
        out = bytearray(1200)
        try:
            r = k.batch_encode(out, pos, limit, b"Topic", 3, bodies, body_off, a, a_off, b,
                               b_off, frags, frag_off, first, n, 5, 0, 17, BORN_HOST, 19,
                               STORE_HOST, 7, 1000)
        except (KernelBoundsError, KernelArgumentError) as exc:
            r = type(exc)
        results.append((r, bytes(out) if not isinstance(r, type) else None))
    assert all(x == results[0] for x in results[1:]), results


# ---- reserving and populating many files at once (FileSystem.reserve_many, space_prepare) ----

def _answers(answers):
    """reserve answers comparable across calls: True, False, or (errno, what it names)."""
    return [(a.errno, a.filename, a.strerror) if isinstance(a, OSError) else a for a in answers]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tmpfs, Linux's fallocate")
def test_reserve_many_answers_each_file_as_reserve_does(backend, tmp_path):
    # One call (one release of the GIL where the backend has space_prepare); each file's
    # answer is reserve()'s: blocks taken, or the OSError naming the file, a full disk too.
    with testing.tmpfs(tmp_path / "disk", "1m") as disk:
        ok = os.path.join(disk, "ok")
        link = os.path.join(disk, "link")
        outside = tmp_path / "outside"
        outside.write_bytes(b"")
        os.truncate(outside, 1 << 20)
        os.symlink(outside, link)
        open(ok, "wb").truncate(4 << 20)
        requests = [(ok, 0, 64 << 10), (os.path.join(disk, "missing"), 0, 4096),
                    (link, 0, 4096), (ok, 64 << 10, 2 << 20)]
        fs = FileSystem()
        answers = fs.reserve_many(backend, requests)
        # reserve() of each, on what the first call left (the first already holds its blocks).
        one_by_one = []
        for request in requests:
            try:
                one_by_one.append(fs.reserve(*request))
            except OSError as exc:
                one_by_one.append(exc)
        assert _answers(answers) == _answers(one_by_one)
        assert answers[0] is True
        assert [answers[1].errno, answers[2].errno, answers[3].errno] == [
            errno.ENOENT, errno.ELOOP, errno.ENOSPC]
        assert "reserving 2097152 bytes at 65536" in str(answers[3])
        assert os.stat(ok).st_blocks * 512 >= 64 << 10
        assert os.stat(outside).st_blocks == 0          # never through the link


def test_populate_many_brings_each_range_in_and_passes_over_a_closed_mapping(backend, tmp_path):
    page = 4096
    fs = FileSystem()
    maps = []
    for name in ("a", "b", "c"):
        path = tmp_path / name
        path.write_bytes(b"")
        os.truncate(path, 16 * page)      # no page cache yet: only what is populated comes in
        maps.append((str(path), fs.map(str(path), 16 * page, True, kernels=backend)))
    try:
        assert fs.reserve_many(backend, [(p, 0, 16 * page) for p, _ in maps]) == [True] * 3
        maps[2][1].close()
        before = testing.resident_bytes(str(tmp_path))
        fs.populate_many(backend, [(maps[0][1], 0, 4 * page), (maps[1][1], 100, 3 * page),
                                   (maps[2][1], 0, 16 * page), (maps[0][1], 12 * page, 20 * page)],
                         call_bytes=5 * page)
        # a: 4 pages, and its last 4 (the range clipped to the mapping); b: the 3 pages
        # holding [100, 3 pages); c: closed, nothing.
        assert testing.resident_bytes(str(tmp_path)) - before == 11 * page
    finally:
        for _, mm in maps[:2]:
            mm.close()


@pytest.fixture(params=COMPILED)
def preparing(request):
    """The compiled backends, which must offer space_prepare (no skip when one lacks it)."""
    kernels = testing.load_backend(request.param)
    assert hasattr(kernels, "space_prepare")
    return kernels


def test_space_prepare_populates_nothing_where_its_reservation_failed(preparing, tmp_path):
    # Populating a hole would allocate it with no ENOSPC check: a file whose reservation
    # failed is left as it was.
    page = 4096
    path = tmp_path / "f"
    path.write_bytes(b"")
    os.truncate(path, 16 * page)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 16 * page)
    try:
        os.chmod(tmp_path, 0o700)
        gone = str(tmp_path / "gone")
        assert preparing.space_prepare([(gone, 0, 4 * page, mm, 0, 4 * page),
                                        (None, 0, 0, mm, 8 * page, 2 * page)]) == [errno.ENOENT, 0]
        # Only the second request's two pages were populated (allocated on the way).
        assert os.stat(path).st_blocks * 512 == 2 * page
    finally:
        mm.close()


@pytest.mark.parametrize("request_", [("f", -1, 1, None, 0, 0), ("f", 0, -1, None, 0, 0),
                                      (None, 0, 0, "map", -1, 1), (None, 0, 0, "map", 0, -1),
                                      ("f\0x", 0, 1, None, 0, 0)],
                         ids=["offset", "length", "pop_start", "pop_length", "nul"])
def test_space_prepare_refuses_a_bad_request_before_touching_any_file(preparing, tmp_path,
                                                                      request_):
    path = tmp_path / "f"
    path.write_bytes(b"")
    os.truncate(path, 4096)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 4096)
    try:
        name, offset, length, m, pop_start, pop_length = request_
        bad = (str(tmp_path / name) if name else None, offset, length,
               mm if m else None, pop_start, pop_length)
        with pytest.raises(ValueError):
            preparing.space_prepare([(str(path), 0, 4096, None, 0, 0), bad])
        assert os.stat(path).st_blocks == 0
    finally:
        mm.close()
