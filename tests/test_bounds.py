# SPDX-License-Identifier: Apache-2.0
"""Resource bounds: hostile lengths, loops and depths are answered with a reason or a clear
error, in bounded time and memory, on every backend."""
import mmap
import os
import socket
import struct
import time
import tracemalloc

import numpy as np
import pytest

from rocketstore import Message, testing
from rocketstore import format as F
from rocketstore.config_manager import DelayOffsetManager, TopicConfigManager, parse_fastjson
from rocketstore.errors import CorruptRecordError
from rocketstore.fs import FileSystem
from rocketstore.message import MessageExt
from rocketstore.status import GetMessageStatus
from rocketstore.store import MessageStore

BACKENDS = testing.backend_params()


@pytest.fixture(params=BACKENDS)
def k(request):
    return testing.load_backend(request.param)


# ---- a record header claiming 2 GiB -------------------------------------------------------
def test_record_claiming_2_gib_is_partial_at_once_without_allocating(k):
    buf = bytearray(4096)
    struct.pack_into(">ii", buf, 0, 0x7FFFFFF0, F.MESSAGE_MAGIC_CODE)
    out = np.zeros(4, dtype=F.SCAN_DTYPE)
    tracemalloc.start()
    t = time.monotonic()
    res = k.commitlog_scan(buf, 0, len(buf), True, out)
    elapsed = time.monotonic() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert res == (0, 0, F.SCAN_PARTIAL, 0)
    assert elapsed < 1.0 and peak < 1 << 20
    with pytest.raises(CorruptRecordError):
        MessageExt.decode(bytes(buf))


def test_negative_and_huge_inner_lengths_are_corrupt_not_reads(k):
    """A valid TOTALSIZE whose BODY length claims 2 GiB (or is negative)."""
    rec = bytearray(k.msg_size(0, 4, 1, 0))
    host = bytes(8)
    k.msg_encode(rec, 0, b"T", b"body", b"", 0, 0, 0, 0, 0, 0, host, 0, host, 0, 0)
    for body_len in (0x7FFFFFFF, -1, -0x80000000):
        bad = bytearray(rec)
        struct.pack_into(">i", bad, 84, body_len)
        out = np.zeros(1, dtype=F.SCAN_DTYPE)
        assert k.commitlog_scan(bad, 0, len(bad), False, out)[2] == F.SCAN_CORRUPT
        with pytest.raises(CorruptRecordError):
            MessageExt.decode(bytes(bad))


# ---- index chains -------------------------------------------------------------------------
def _loop_index(slot_num, index_num, key_hash, other_hash):
    """An index file whose chain for key_hash goes 2 -> 1 -> 2 -> ... for ever."""
    size = 40 + slot_num * 4 + index_num * 20
    return size, [
        (0, struct.pack(">qqqqii", 1000, 2000, 0, 0, 1, index_num - 1)),
        (40 + (key_hash % slot_num) * 4, struct.pack(">i", 2)),
        (40 + slot_num * 4 + 1 * 20, struct.pack(">iqii", other_hash, 111, 0, 2)),
        (40 + slot_num * 4 + 2 * 20, struct.pack(">iqii", other_hash, 222, 0, 1)),
    ]


def test_index_chain_that_loops_stops_after_index_num_hops(k):
    size, parts = _loop_index(8, 16, 5, 5)
    buf = bytearray(size)
    for at, b in parts:
        buf[at:at + len(b)] = b
    out = np.zeros(1000, dtype=np.int64)
    n = k.index_lookup(buf, 8, 16, 5, 0, 1 << 62, 1000, out)
    assert n <= 16                           # every hop matched, but at most index_num hops
    assert set(out[:n].tolist()) == {111, 222}


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "pure"] or ["pure"])
def test_index_chain_of_ten_million_hops_terminates(tmp_path, backend):
    """A sparse 200 MB index file (index_num = 10**7) whose chain loops between two entries:
    the walk does its 10**7 hops over two pages and stops; only those pages are touched."""
    k = testing.load_backend(backend)
    slot_num, index_num = 16, 10_000_000
    size, parts = _loop_index(slot_num, index_num, 5, 6)   # hashes differ: no results, all hops
    path = tmp_path / "index"
    with open(path, "wb") as f:
        f.truncate(size)
        for at, b in parts:
            f.seek(at)
            f.write(b)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
        out = np.zeros(4, dtype=np.int64)
        t = time.monotonic()
        n = k.index_lookup(mm, slot_num, index_num, 5, 0, 1 << 62, 4, out)
        elapsed = time.monotonic() - t
    assert n == 0
    assert elapsed < (60 if backend == "pure" else 5)


def test_index_lookup_with_header_claiming_more_entries_than_the_file(k):
    buf = bytearray(40 + 4 * 4 + 4 * 20)
    struct.pack_into(">qqqqii", buf, 0, 1, 2, 0, 0, 1, 0x7FFFFFFF)
    struct.pack_into(">i", buf, 40 + 4 * 3, 0x7FFFFFF0)              # slot -> far past the end
    out = np.zeros(4, dtype=np.int64)
    assert k.index_lookup(buf, 4, 4, 3, 0, 1 << 62, 4, out) == 0
    assert k.index_put(buf, 4, 4, 3, 10, 20) == 0                    # "full": nothing written


# ---- a ConsumeQueue pointing past the CommitLog -------------------------------------------
def test_consume_queue_pointing_past_the_commitlog_answers_cleanly(tmp_path):
    root = tmp_path / "store"
    store = testing.open_store(root, "pure")
    try:
        for i in range(5):
            store.put_message(Message("T", b"x" * 50, tags="a"))
        testing.wait_dispatched(store)
    finally:
        store.shutdown()
    cq = root / "consumequeue" / "T" / "0" / ("0" * 20)
    data = bytearray(cq.read_bytes())
    # Units 5 and 6: far past the CommitLog end, and a negative offset.
    struct.pack_into(">qiq", data, 5 * 20, 1 << 40, 100, 0)
    struct.pack_into(">qiq", data, 6 * 20, -5, 100, 0)
    cq.write_bytes(bytes(data))
    for name in BACKENDS:
        ro = MessageStore.open_read_only(str(root), kernels=name)
        try:
            res = ro.get_message("g", "T", 0, 0, 32)
            assert isinstance(res.status, GetMessageStatus)
            assert len(res.messages) <= 5
            for off in (5, 6):
                r = ro.get_message("g", "T", 0, off, 1)
                assert isinstance(r.status, GetMessageStatus) and not r.messages
            report = ro.verify()
            # The unit past the CommitLog is a finding at its own file@offset.
            assert ("consumequeue", f"consumequeue/T/0/{'0' * 20}", 5 * 20) in \
                {(p.kind, p.file, p.offset) for p in report.problems}
        finally:
            ro.shutdown()


# ---- config JSON ---------------------------------------------------------------------------
def _write_config(root, name, data):
    os.makedirs(os.path.join(root, "config"), exist_ok=True)
    with open(os.path.join(root, "config", name), "wb") as f:
        f.write(data)


def test_config_json_nested_a_million_deep_is_a_clear_error(tmp_path, caplog):
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_fastjson("[" * 1_000_000 + "]" * 1_000_000)
    _write_config(tmp_path, "delayOffset.json",
                  b'{"offsetTable":' + b'{"a":' * 1_000_000 + b"1" + b"}" * 1_000_001)
    m = DelayOffsetManager(str(tmp_path), FileSystem(), read_only=True)
    t = time.monotonic()
    assert m.load() is True                  # corrupt main file, no .bak: an empty table
    assert time.monotonic() - t < 10
    assert m.loaded_from is None and m.offset_table == {}
    assert "nested too deeply" in caplog.text
    # With a good .bak beside it, that is what loads (the broker's fallback).
    _write_config(tmp_path, "delayOffset.json.bak", b'{"offsetTable":{1:5}}')
    m = DelayOffsetManager(str(tmp_path), FileSystem(), read_only=True)
    assert m.load() is True and m.loaded_from == "bak" and m.offset_table == {1: 5}


def test_config_json_with_unterminated_escapes_parses_in_linear_time(tmp_path):
    """fuzz-regressions/py_config/unterminated-escapes, scaled up: the bare-key regex once
    rescanned from every quote (a 200 KB file took minutes)."""
    _write_config(tmp_path, "topics.json", b'"\\' * 100_000)
    m = TopicConfigManager(str(tmp_path), FileSystem(), read_only=True)
    t = time.monotonic()
    assert m.load() is True and m.loaded_from is None     # corrupt, no .bak: empty table
    assert time.monotonic() - t < 5


# ---- an HA master announcing a huge body --------------------------------------------------
def test_slave_closes_on_a_master_announcing_a_huge_body_without_allocating_it(tmp_path):
    from rocketstore.config import StoreConfig
    from rocketstore.ha import wire
    listen = socket.create_server(("127.0.0.1", 0))
    listen.settimeout(10)
    port = listen.getsockname()[1]
    cfg = StoreConfig(mapped_file_size_commit_log=64 * 1024, broker_role="SLAVE",
                      ha_master_address=f"127.0.0.1:{port}", ha_housekeeping_interval=2000)
    slave = MessageStore(str(tmp_path / "s"), cfg, kernels=BACKENDS[0])
    slave.load()
    slave.start()
    conn = None
    try:
        conn, _ = listen.accept()
        conn.settimeout(10)
        report = b""
        while len(report) < 8:
            report += conn.recv(8 - len(report))
        assert wire.decode_report(report) == 0
        tracemalloc.start()
        conn.sendall(wire.encode_header(0, 0x7FFFFFFF) + b"\0" * 4096)
        closed = False
        t = time.monotonic()
        try:
            while time.monotonic() - t < 10:
                if not conn.recv(4096):
                    closed = True
                    break
        except ConnectionResetError:
            closed = True
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert closed, "the slave kept a connection announcing a 2 GiB body"
        assert peak < 64 << 20                # nothing near the announced size was allocated
        assert slave.get_max_phy_offset() == 0
    finally:
        if conn is not None:
            conn.close()
        slave.shutdown()
        listen.close()
