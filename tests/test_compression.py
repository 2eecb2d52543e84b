# SPDX-License-Identifier: Apache-2.0
"""Compressed bodies (doc/01 §3.5): every read gives the original body as MessageDecoder does
(4.9's COMPRESSED_FLAG with zlib, 5.x's LZ4 / Zstandard / zlib type bits), or the stored bytes
with decompress=False; a corrupt body is an error for that message alone; compress_msg_body
stores what a 4.9 producer sends, the same bytes on every backend."""
import asyncio
import base64
import json
import random
import sys
import zlib

import lz4.frame
import numpy as np
import pytest
import zstandard

from rocketstore import (ConfigError, CorruptBodyError, Message, MissingCodecError,
                         PutMessageStatus, StoreConfig, testing)
from rocketstore import format as F
from rocketstore.errors import KernelArgumentError
from rocketstore.message import MessageExt

ORIGINAL = b"".join(b"order %06d paid in full; " % i for i in range(1000))   # 27 000 bytes


def _zstd_stream(data):
    """A zstd frame as a streaming writer (zstd-jni's ZstdOutputStream) makes it: no content
    size in its header."""
    return zstandard.ZstdCompressor(level=3, write_content_size=False).compress(data)


# (name, sysFlag bits, the stored body)
CODECS = [
    ("zlib-4.9", F.COMPRESSED_FLAG, zlib.compress(ORIGINAL, 5)),
    ("zlib-5.x", F.COMPRESSED_FLAG | F.COMPRESSION_ZLIB_TYPE, zlib.compress(ORIGINAL, 9)),
    ("lz4", F.COMPRESSED_FLAG | F.COMPRESSION_LZ4_TYPE, lz4.frame.compress(ORIGINAL)),
    ("zstd", F.COMPRESSED_FLAG | F.COMPRESSION_ZSTD_TYPE, _zstd_stream(ORIGINAL)),
    ("zstd-sized", F.COMPRESSED_FLAG | F.COMPRESSION_ZSTD_TYPE,
     zstandard.ZstdCompressor().compress(ORIGINAL)),
]


@pytest.fixture
def store(tmp_path, backend):
    s = testing.open_store(tmp_path / "store", backend)
    yield s
    s.shutdown()


def _put(store, body, sys_flag, topic="Zip", key="k", **kw):
    r = store.put_message(Message(topic, body, keys=key, sys_flag=sys_flag,
                                  properties={"UNIQ_KEY": "U-" + key}, **kw))
    assert r.status is PutMessageStatus.PUT_OK
    return r


@pytest.mark.parametrize("name, flags, stored", CODECS, ids=[c[0] for c in CODECS])
def test_every_read_gives_the_original_body_of_each_codec_and_the_stored_one_on_request(
        store, name, flags, stored):
    r = _put(store, stored, flags)
    _put(store, b"plain", 0, key="p")
    # Stored as sent: the record holds the compressed bytes, and its CRC covers them.
    raw = store.select_one_message_by_offset(r.commit_log_offset)
    assert stored in raw and ORIGINAL not in raw
    reads = {
        "get_message": lambda **kw: store.get_message("g", "Zip", 0, 0, 1, **kw).messages[0],
        "look_message_by_offset": lambda **kw: store.look_message_by_offset(
            r.commit_log_offset, **kw),
        "query_message": lambda **kw: store.query_message("Zip", "k", **kw).messages[0],
        "query_message_by_unique_key": lambda **kw: store.query_message_by_unique_key(
            "Zip", "U-k", **kw),
        "view_message_by_id": lambda **kw: store.view_message_by_id(
            store.look_message_by_offset(r.commit_log_offset).msg_id, **kw),
        "iter_messages": lambda **kw: next(iter(store.iter_messages(**kw))),
    }
    for api, read in reads.items():
        m = read()
        assert m.body == ORIGINAL, api
        assert m.stored_body == stored and m.compressed, api
        assert m.sys_flag & (F.COMPRESSED_FLAG | F.COMPRESSION_TYPE_MASK) == flags, api
        kept = read(decompress=False)
        assert kept.body == stored and kept.stored_body == stored, api
    assert store.look_message_by_offset(r.commit_log_offset).compression == name.split("-")[0]
    plain = store.get_message("g", "Zip", 0, 1, 1).messages[0]
    assert plain.body == b"plain" and not plain.compressed and plain.compression is None
    assert plain.body is plain.stored_body          # nothing copied for an uncompressed body


def test_decoding_a_record_by_hand_decompresses_as_the_read_path_does(store):
    r = _put(store, CODECS[2][2], CODECS[2][1])
    m = MessageExt.decode(store.select_one_message_by_offset(r.commit_log_offset),
                          check_crc=True)
    assert m.body == ORIGINAL and m.keep_stored().body == CODECS[2][2]
    d = m.to_dict()
    assert (d["compressed"], d["compression"], d["bodyDecompressed"]) == (True, "lz4", False)


def test_get_batch_marks_compressed_rows_and_its_body_views_are_the_stored_bytes(store):
    _put(store, b"plain", 0, key="p")
    _put(store, CODECS[0][2], CODECS[0][1])
    _put(store, CODECS[3][2], CODECS[3][1])
    with store.get_batch("g", "Zip", 0, 0, 8) as b:
        assert b.compressed.tolist() == [False, True, True]
        assert (b.sys_flag & F.COMPRESSION_TYPE_MASK).tolist() == [0, 0, F.COMPRESSION_ZSTD_TYPE]
        assert bytes(b.body(1)) == CODECS[0][2] and bytes(b.body(2)) == CODECS[3][2]
        assert [b.original_body(i) for i in range(3)] == [b"plain", ORIGINAL, ORIGINAL]


def test_a_corrupt_compressed_body_fails_that_message_alone_and_never_stops_a_scan(store):
    _put(store, zlib.compress(b"first", 5), F.COMPRESSED_FLAG, key="a")
    bad = _put(store, zlib.compress(ORIGINAL, 5)[:-9], F.COMPRESSED_FLAG, key="b")  # truncated
    _put(store, b"not lz4 at all", F.COMPRESSED_FLAG | F.COMPRESSION_LZ4_TYPE, key="c")
    _put(store, b"no codec 5", F.COMPRESSED_FLAG | 0x500, key="d")
    _put(store, b"last", 0, key="e")
    got = store.get_message("g", "Zip", 0, 0).messages
    assert len(got) == 5 and got[0].body == b"first" and got[4].body == b"last"
    for m in got[1:4]:
        with pytest.raises(CorruptBodyError) as exc:
            m.body
        # The error names the message: its offset, topic and queue offset.
        assert f"commit-log offset {m.commit_log_offset}" in str(exc.value)
        assert "'Zip'" in str(exc.value) and f"queue offset {m.queue_offset}" in str(exc.value)
    assert "truncated" in str(pytest.raises(CorruptBodyError, getattr, got[1], "body").value)
    assert "unknown compression type 5" in str(
        pytest.raises(CorruptBodyError, getattr, got[3], "body").value)
    # A scan goes on past them; each one's stored bytes stay readable.
    scanned = list(store.iter_messages())
    assert [m.queue_offset for m in scanned] == [0, 1, 2, 3, 4]
    assert scanned[1].stored_body == zlib.compress(ORIGINAL, 5)[:-9]
    d = scanned[1].to_dict()
    assert d["bodyDecompressed"] is False and "truncated" in d["bodyError"]
    assert bytes.fromhex(d["body"]) == scanned[1].stored_body
    assert store.look_message_by_offset(bad.commit_log_offset, decompress=False).body \
        == zlib.compress(ORIGINAL, 5)[:-9]


@pytest.mark.parametrize("codec, module, extra", [
    (F.COMPRESSION_LZ4_TYPE, "lz4.frame", "rocketstore[lz4]"),
    (F.COMPRESSION_ZSTD_TYPE, "zstandard", "rocketstore[zstd]")])
def test_a_body_whose_codec_is_not_installed_names_the_extra_to_install(
        store, monkeypatch, codec, module, extra):
    stored = dict((c[1] & F.COMPRESSION_TYPE_MASK, c[2]) for c in CODECS)[codec]
    _put(store, stored, F.COMPRESSED_FLAG | codec)
    # A None entry in sys.modules makes importing that module fail, as if not installed.
    monkeypatch.setitem(sys.modules, module, None)
    m = store.get_message("g", "Zip", 0, 0).messages[0]
    with pytest.raises(MissingCodecError) as exc:
        m.body
    assert extra in str(exc.value) and "commit-log offset 0" in str(exc.value)
    assert "bodyError" in m.to_dict()           # dump reports it and goes on
    monkeypatch.undo()
    assert m.body == ORIGINAL


# ---- write: compress_msg_body ---------------------------------------------------------------
def _config(**kw):
    return testing.small_config(compress_msg_body=True, **kw)


def test_compress_msg_body_stores_what_a_4_9_producer_sends(tmp_path, backend):
    s = testing.open_store(tmp_path / "s", backend, _config())
    try:
        sizes = [4095, 4096, 20000]
        msgs = [Message("W", ORIGINAL[:n], keys=f"k{n}") for n in sizes]
        for m in msgs:
            s.put_message(m)
        # The caller's messages are left as they were (the producer restores its body too).
        assert [(len(m.body), m.sys_flag) for m in msgs] == [(n, 0) for n in sizes]
        got = s.get_message("g", "W", 0, 0, decompress=False).messages
        # tryToCompressMessage: bodies of at least compressMsgBodyOverHowmuch (4096) bytes,
        # deflated at level 5 (java.util.zip.Deflater, a zlib stream).
        assert [m.sys_flag & F.COMPRESSED_FLAG for m in got] == [0, 1, 1]
        assert got[0].body == ORIGINAL[:4095]
        assert got[1].body == zlib.compress(ORIGINAL[:4096], 5)
        assert got[2].body == zlib.compress(ORIGINAL[:20000], 5)
        assert [m.body for m in s.get_message("g", "W", 0, 0).messages] \
            == [ORIGINAL[:n] for n in sizes]
        assert s.query_message("W", "k20000").messages[0].body == ORIGINAL[:20000]
    finally:
        s.shutdown()


# What 4.9.8's UtilAll.compress(body, 5) returns for JAVA_INPUT: java.util.zip's Deflater(5)
# under a DeflaterOutputStream, run on OpenJDK 17.
JAVA_INPUT = b"".join(b"order %06d paid in full; " % i for i in range(160))     # 4 320 bytes
JAVA_DEFLATED = bytes.fromhex(
    "785e75d63d4a03400084d1abec119cfd5f3c8d108540302190fb0b3616f2a69dee55dffd79f97c96b7df95c7"
    "c7f552aedfe5eb75bbbd97fbdf155fd557f3d57d0d5fd3d7f2b57d1d5eb146ac116bc41ab146ac116bc41ab1"
    "46ac51ad51ad51ad51ad51ad51ad51ad51ad51ad51add1acd1acd1acd1acd1acd1acd1acd1acd1acd1acd1ad"
    "d1add1add1add1add1add1add1add1add1ad31ac31ac31ac31ac31ac31ac31ac31ac31ac31ac31ad31ad31ad"
    "31ad31ad31ad31ad31ad31ad31adb1acb1acb1acb1acb1acb1acb1acb1acb1acb1acb1adb1adb1adb1adb1ad"
    "b1adb1adb1adb1adb1ad71ac71ac71ac71ac71ac71ac71ac71ac71ac71a811b768dca2718bc62d1ab768dca2"
    "718bc62d1ab768dca2718bc62d1ab768dca2718bc62d1ab768dca2718bc62d1ab768dca2718bc62d1ab768dc"
    "a2718bc62d1ab768dca2718bc62d1ab768dca2718bc62d1ab768dca2718bc62d1ab768dca2718bc62d1ab768"
    "dca2718bc62d1ab768dca2718bc62d1ab768dca2718bc62d1ab768dca2718be65f8bfe00dadf2d10")

# What 5.x's Lz4Compressor (lz4-java 1.8's LZ4FrameOutputStream) and ZstdCompressor (zstd-jni
# 1.5's ZstdOutputStream, level 5) return for JAVA_INPUT.
JAVA_LZ4 = bytes.fromhex(
    "04224d1860707345030000716f7264657220300100f700207061696420696e2066756c6c3b201b001f311b00"
    "071f321b00071f331b00071f341b00071f351b00071f361b00071f371b00071f381b00071f391b00062f3130"
    "1b00070f0e01071f310e01071f310e01071f310e01071f310e01071f310e01071f310e01071f310e01071f31"
    "0e01071f320e01071f320e01071f320e01071f320e01071f320e01071f320e01071f320e01071f320e01071f"
    "320e01071f320e01071f330e01071f330e01071f330e01071f330e01071f330e01071f330e01071f330e0107"
    "1f330e01071f330e01071f330e01071f340e01071f340e01071f340e01071f340e01071f340e01071f340e01"
    "071f340e01071f340e01071f340e01071f340e01071f350e01071f350e01071f350e01071f350e01071f350e"
    "01071f350e01071f350e01071f350e01071f350e01071f350e01071f360e01071f360e01071f360e01071f36"
    "0e01071f360e01071f360e01071f360e01071f360e01071f360e01071f360e01071f370e01071f370e01071f"
    "370e01071f370e01071f370e01071f370e01071f370e01071f370e01071f370e01071f370e01071f380e0107"
    "1f380e01071f380e01071f380e01071f380e01071f380e01071f380e01071f380e01071f380e01071f380e01"
    "071f390e01071f390e01071f390e01071f390e01071f390e01071f390e01071f390e01071f390e01071f390e"
    "01071f390e01061f318c0a072f31300e01062f31300e01062f31300e01062f31300e01062f31300e01062f31"
    "300e01062f31300e01062f31300e01062f31300e01070f8c0a072f31310e01070f8c0a071f318c0a071f318c"
    "0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f31"
    "8c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f"
    "318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a07"
    "1f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a"
    "071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c0a071f318c"
    "0a0718318c0a50756c6c3b2000000000")
JAVA_ZSTD = bytes.fromhex(
    "28b52ffd0058ec0400e24b1a15a0a7700ca0d1fc75d2be54754fae9022c9c3ff0a04ffffffffffffffffffff"
    "ffffffffffab896745cfae269e153dba9a7856f4e46ae259d183ab896745cfad269e153db69a7856f4d46ae2"
    "59d143ab896745cfab8967450bc0300e032114421401838c1c02e2280480a1a810e86bec19f0a5ed11240427"
    "0427042b143f35969a663c8ac0f0399807f3601ecc89393807e7605ddbf435015606010000")


@pytest.mark.parametrize("flags, stored", [
    (F.COMPRESSED_FLAG, JAVA_DEFLATED),
    (F.COMPRESSED_FLAG | F.COMPRESSION_ZLIB_TYPE, JAVA_DEFLATED),
    (F.COMPRESSED_FLAG | F.COMPRESSION_LZ4_TYPE, JAVA_LZ4),
    (F.COMPRESSED_FLAG | F.COMPRESSION_ZSTD_TYPE, JAVA_ZSTD)], ids=["zlib", "zlib-5.x", "lz4",
                                                                   "zstd"])
def test_bodies_compressed_by_the_java_codecs_read_back(store, flags, stored):
    r = _put(store, stored, flags)
    assert store.look_message_by_offset(r.commit_log_offset).body == JAVA_INPUT
    assert store.get_message("g", "Zip", 0, 0).messages[0].body == JAVA_INPUT


def test_compress_msg_body_stores_the_bytes_java_deflater_makes(tmp_path, backend):
    s = testing.open_store(tmp_path / "s", backend, _config())
    try:
        r = s.put_message(Message("J", JAVA_INPUT))
        m = s.look_message_by_offset(r.commit_log_offset, decompress=False)
        assert m.sys_flag == F.COMPRESSED_FLAG and m.body == JAVA_DEFLATED
    finally:
        s.shutdown()


def test_compress_msg_body_leaves_a_broker_batch_and_small_bodies_as_they_are(
        tmp_path, backend):
    s = testing.open_store(tmp_path / "s", backend,
                           _config(compress_msg_body_over_howmuch=100, compress_level=1))
    try:
        s.put_messages([Message("B", ORIGINAL[:500]), Message("B", ORIGINAL[:500])],
                       batch_properties={})
        s.put_messages([Message("B", ORIGINAL[:99]), Message("B", ORIGINAL[:500])])
        got = s.get_message("g", "B", 0, 0, decompress=False).messages
        assert [m.sys_flag & F.COMPRESSED_FLAG for m in got] == [0, 0, 0, 1]
        assert got[3].body == zlib.compress(ORIGINAL[:500], 1)
    finally:
        s.shutdown()


def _mixed_workload(store):
    rnd = random.Random(5)
    bodies = [ORIGINAL[:rnd.choice([10, 4095, 4096, 6000, 9000])] for _ in range(40)]
    for b in bodies[:10]:
        store.put_message(Message("M", b, tags="T", keys="k"))
    store.put_messages([Message("M", b, tags="T", keys="k", queue_id=1) for b in bodies[10:20]])
    r = store.put_batch("M", 2, bodies[20:], tags="T", keys="k")
    assert r.status is PutMessageStatus.PUT_OK and r.count == 20
    return bodies


def test_compressed_puts_write_the_same_bytes_on_every_backend(tmp_path):
    trees = {}
    for name in testing.backend_params():
        s = testing.open_store(tmp_path / name, testing.load_backend(name), _config())
        try:
            bodies = _mixed_workload(s)
            read = [m.body for q in range(3) for m in s.get_message("g", "M", q, 0).messages]
            assert read == bodies
            flags = [m.sys_flag & 1 for m in s.iter_messages()]
            assert flags == [int(len(b) >= 4096) for b in bodies]
        finally:
            s.shutdown()
        trees[name] = testing.tree_digest(tmp_path / name, ignore=("lock", "abort"))
    first = next(iter(trees.values()))
    assert all(t == first for t in trees.values()), "a backend wrote other bytes"


def test_put_batch_compresses_as_put_messages_does(tmp_path, backend):
    bodies = [ORIGINAL[:n] for n in (5000, 10, 4096, 4095, 8000)]

    def tree(name, put):
        s = testing.open_store(tmp_path / name, backend, _config())
        try:
            put(s)
        finally:
            s.shutdown()
        return testing.tree_digest(tmp_path / name, ignore=("lock", "abort"))
    assert tree("batch", lambda s: s.put_batch("P", 0, bodies, tags="T")) \
        == tree("list", lambda s: s.put_messages([Message("P", b, tags="T") for b in bodies]))


def test_batch_encode_refuses_a_host_bit_in_the_per_record_flags(backend):
    args = (bytearray(4096), 0, 4096, b"T", 0, b"ab", np.array([0, 1, 2]), None, None, None,
            None, b"", np.zeros(4, dtype=np.int64), 0, 2, 0, 0, 0, b"\x7f\0\0\1\0\0\0\1", 0,
            b"\x7f\0\0\1\0\0\0\1", 0, 0)
    count, _ = backend.batch_encode(*args, flags_or=np.array([1, 0], dtype=np.int32))
    assert count == 2
    with pytest.raises(KernelArgumentError):
        backend.batch_encode(*args, flags_or=np.array([0, F.BORNHOST_V6_FLAG], dtype=np.int32))
    with pytest.raises(KernelArgumentError):
        backend.batch_encode(*args, flags_or=np.array([1], dtype=np.int32))


@pytest.mark.parametrize("field, value", [("compress_level", 10), ("compress_level", -2),
                                          ("compress_msg_body_over_howmuch", -1)])
def test_compression_settings_out_of_range_are_refused(field, value):
    with pytest.raises(ConfigError):
        StoreConfig(**{field: value})


def test_dump_json_marks_the_flag_and_stays_json(store):
    _put(store, CODECS[0][2], CODECS[0][1])
    d = json.loads(json.dumps(store.look_message_by_offset(0).to_dict()))
    assert (d["compressed"], d["compression"], d["bodyDecompressed"]) == (True, "zlib", True)
    assert bytes.fromhex(d["body"]) == ORIGINAL and d["bodyLen"] == len(ORIGINAL)
    assert d["storedBodyLen"] == len(CODECS[0][2])
    raw = store.look_message_by_offset(0).to_dict(decompress=False)
    assert bytes.fromhex(raw["body"]) == CODECS[0][2] and raw["bodyDecompressed"] is False


# ---- the command line -----------------------------------------------------------------------
def _closed_store_with_bodies(tmp_path, backend):
    root = tmp_path / "cli"
    s = testing.open_store(root, backend)
    try:
        _put(s, CODECS[0][2], CODECS[0][1], key="good")
        _put(s, b"\x78\x9c broken", F.COMPRESSED_FLAG, key="bad")
        _put(s, b"plain text", 0, key="plain")
    finally:
        s.shutdown()
    return str(root)


def test_dump_gives_original_bodies_marks_the_flag_and_reports_a_corrupt_one(tmp_path, backend):
    root = _closed_store_with_bodies(tmp_path, backend)
    r = testing.run_cli("dump", root)
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == 3                      # the corrupt body does not stop the dump
    good, bad, plain = lines
    assert bytes.fromhex(good["body"]) == ORIGINAL and good["compressed"] is True
    assert (good["compression"], good["bodyDecompressed"]) == ("zlib", True)
    assert bytes.fromhex(bad["body"]) == b"\x78\x9c broken" and "bodyError" in bad
    # An uncompressed record's line is as before: no compression fields.
    assert "compressed" not in plain and bytes.fromhex(plain["body"]) == b"plain text"
    assert r.returncode == 1 and f"commit-log offset {bad['commitLogOffset']}" in r.stderr
    stored = [json.loads(line) for line in testing.run_cli(
        "dump", "--stored-body", root).stdout.splitlines()]
    assert bytes.fromhex(stored[0]["body"]) == CODECS[0][2]
    assert stored[0]["bodyDecompressed"] is False


def test_export_and_query_give_original_bodies(tmp_path, backend):
    root = _closed_store_with_bodies(tmp_path, backend)
    r = testing.run_cli("export", "--body", "base64", root)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [base64.b64decode(x["body"]) for x in rows] \
        == [ORIGINAL, b"\x78\x9c broken", b"plain text"]
    assert [x["compressed"] for x in rows] == [True, True, False]
    assert r.returncode == 1 and "written as stored" in r.stderr
    q = testing.run_cli("query", "key", root, "Zip", "good")
    assert bytes.fromhex(json.loads(q.stdout)["body"]) == ORIGINAL
    q = testing.run_cli("query", "offset", "--stored-body", root, "0")
    assert bytes.fromhex(json.loads(q.stdout)["body"]) == CODECS[0][2]


def test_consumers_give_original_bodies_or_the_stored_ones_on_request(store):
    _put(store, CODECS[0][2], CODECS[0][1])
    with store.consume("g1", "Zip", 0) as c:
        assert [m.body for m in next(c)] == [ORIGINAL]
    with store.consume("g2", "Zip", 0, decompress=False) as c:
        assert [m.body for m in next(c)] == [CODECS[0][2]]

    async def first(**kw):
        async with store.aconsume("g3", "Zip", 0, **kw) as c:
            return [m.body async for m in _one(c)]

    async def _one(c):
        for m in await c.__anext__():
            yield m
    assert asyncio.run(first()) == [ORIGINAL]
    assert asyncio.run(first(decompress=False)) == [CODECS[0][2]]


def test_a_delayed_compressed_message_is_delivered_as_stored(tmp_path, backend):
    # The schedule service re-puts the record it reads without decompressing it (4.9.8's
    # lookMessageByOffset): the delivered record holds the same compressed bytes and flag.
    now = [1_800_000_000_000]
    s = testing.open_store(tmp_path / "s", backend, _config(message_delay_level="1s 2s"),
                           clock=lambda: now[0])
    try:
        r = s.put_message(Message("Late", ORIGINAL, properties={"DELAY": "1"}))
        scheduled = s.look_message_by_offset(r.commit_log_offset)
        assert scheduled.topic == F.SCHEDULE_TOPIC and scheduled.compressed
        s.get_max_offset_in_queue("Late", 0)        # dispatched (read-your-writes)
        now[0] += 1000
        s.schedule_message_service.deliver_due()
        out = s.get_message("g", "Late", 0, 0).messages[0]
        assert out.sys_flag & F.COMPRESSED_FLAG
        assert out.stored_body == scheduled.stored_body == zlib.compress(ORIGINAL, 5)
        assert out.body == ORIGINAL
    finally:
        s.shutdown()
