# SPDX-License-Identifier: Apache-2.0
"""Kernel micro-benchmarks: one table per operation (benchmark.group) comparing the backends,
with zlib.crc32 as the baseline in the crc32 groups.

`pytest bench/bench_kernels.py --benchmark-only --benchmark-columns=mean,ops`
"""
import zlib

import numpy as np
import pytest

from rocketstore import format as F
from rocketstore import kernels

IMPLS = kernels.available()


@pytest.fixture(params=IMPLS)
def impl(request):
    return kernels.load(request.param)


def _fields(i, body):
    return dict(topic=b"BenchTopic", body=body, props=b"KEYS\x01key%d\x02TAGS\x01TagA" % i,
                queue_id=i % 4, flag=0, queue_offset=i, phy_offset=0, sys_flag=0,
                born_timestamp=1700000000000 + i, born_host=bytes.fromhex("7F0000010000CC79"),
                store_timestamp=1700000000001 + i, store_host=bytes.fromhex("7F00000100002A9F"),
                reconsume_times=0, prepared_tx_offset=0)


def _body(n):
    return bytes((i * 131 + 7) & 0xFF for i in range(n))


@pytest.mark.parametrize("size", [128, 1024, 65536], ids=["128B", "1KiB", "64KiB"])
@pytest.mark.parametrize("name", IMPLS + ["zlib"])
def test_crc32(benchmark, name, size):
    benchmark.group = f"crc32 {size} B"
    data = _body(size)
    fn = zlib.crc32 if name == "zlib" else kernels.load(name).crc32
    benchmark.extra_info.update(bytes=size, impl=name)
    assert benchmark(fn, data) == zlib.crc32(data)


def test_msg_encode(benchmark, impl):
    benchmark.group = "msg_encode 128 B body"
    fields = _fields(1, _body(128))
    size = impl.msg_size(0, 128, len(fields["topic"]), len(fields["props"]))
    out = bytearray(size)
    benchmark.extra_info.update(record_bytes=size)
    # Positional, as commitlog.py calls it on the put path.
    assert benchmark(impl.msg_encode, out, 0, *fields.values()) == size


def test_commitlog_append(benchmark, impl):
    benchmark.group = "commitlog_append 128 B body"
    fields = _fields(1, _body(128))
    rec = bytearray(impl.msg_size(0, 128, len(fields["topic"]), len(fields["props"])))
    impl.msg_encode(rec, 0, **fields)
    rec = bytes(rec)
    out = bytearray(4096)
    assert benchmark(impl.commitlog_append, out, 100, rec, 7, 100, 1700000000002) == len(rec)


def test_cq_encode(benchmark, impl):
    benchmark.group = "cq_encode single"
    out = bytearray(F.CQ_STORE_UNIT_SIZE * 10)
    assert benchmark(impl.cq_encode, out, 40, 123456789, 135, 2598919) == 20


def test_cq_encode_batch(benchmark, impl):
    benchmark.group = "cq_encode_batch 1000"
    n = 1000
    offsets = np.arange(n, dtype=np.int64) * 135
    sizes = np.full(n, 135, dtype=np.int32)
    tags = np.full(n, 2598919, dtype=np.int64)
    out = bytearray(20 * n)
    benchmark.extra_info.update(units=n)
    assert benchmark(impl.cq_encode_batch, out, 0, offsets, sizes, tags) == 20 * n


def test_commitlog_scan(benchmark, impl):
    benchmark.group = "commitlog_scan 1000 records"
    pure = kernels.load("pure")
    n = 1000
    buf = bytearray()
    for i in range(n):
        fields = _fields(i, _body(128))
        rec = bytearray(pure.msg_size(0, 128, len(fields["topic"]), len(fields["props"])))
        pure.msg_encode(rec, 0, **fields)
        buf += rec
    buf = bytes(buf + bytes(64))
    out = np.zeros(n + 1, dtype=F.SCAN_DTYPE)
    benchmark.extra_info.update(records=n, bytes=len(buf))
    count, _, reason, _ = benchmark(impl.commitlog_scan, buf, 0, len(buf), True, out)
    assert (count, reason) == (n, F.SCAN_EMPTY)


def test_cq_search(benchmark, impl):
    benchmark.group = "cq_search 300000 units"
    units = np.zeros(300_000, dtype=F.CQ_DTYPE)
    units["offset"] = np.arange(300_000, dtype=np.int64) * 135
    buf = units.tobytes()
    assert benchmark(impl.cq_search, buf, 0, len(buf), 135 * 123_457) == 123_457
