# SPDX-License-Identifier: Apache-2.0
"""Thread scaling: where the GIL is the limit.

    python -m pytest bench/bench_threads.py --benchmark-only -q --benchmark-columns=mean,ops

A fixed amount of work split over 1, 2, 4 and 8 threads, so a shorter time with more threads is
real parallelism (this machine's core count caps it: extra_info["cpus"]). extra_info["speedup"]
is the 1-thread time of the same variant divided by this one.

- producers: one store, ASYNC_FLUSH, PRODUCER_MSGS messages of 128 B in total, each thread
  putting its share with put_messages (batches of 1000) or put_message (one at a time), per
  backend. cext and cffi run the big kernels (batch append, body CRC) without the GIL; pure
  holds it throughout, except inside zlib.
- crc32: CRC_MIB MiB in 1 MiB buffers: cext (GIL released above 4 KiB), cffi (released on
  every call), zlib.crc32 (CPython releases it above 5 KiB), pure (which is zlib.crc32), and
  cext over the same bytes in 4 KiB calls, under its threshold, so holding the GIL.
"""
import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from rocketstore import FlushDiskType, kernels
from rocketstore.workload import check_puts, check_read_back, make_messages

THREADS = (1, 2, 4, 8)
PRODUCER_MSGS = int(os.environ.get("ROCKETSTORE_THREADS_MSGS", "80000"))
BATCH = 1000
RUNS = 4                 # 3 rounds and a warmup put the workload 4 times into one store
CRC_MIB = 256
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

_ones = {}       # (group, variant) -> 1-thread mean, for extra_info["speedup"]


def _record(benchmark, key, threads):
    benchmark.extra_info.update(threads=threads, cpus=CPUS)
    if benchmark.stats is None:          # --benchmark-disable
        return
    mean = benchmark.stats.stats.mean
    if threads == 1:
        _ones[key] = mean
    if key in _ones:
        benchmark.extra_info["speedup"] = round(_ones[key] / mean, 2)


def _split(items, n):
    k, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + k + (1 if i < r else 0)
        out.append(items[start:end])
        start = end
    return out


# ---- producers -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def producer_msgs():
    return make_messages(PRODUCER_MSGS, queues=8)


PRODUCER_BACKENDS = [b for b in ("cext", "cffi", "pure") if b in kernels.available()]
PRODUCER_CASES = [(api, be, t) for api in ("put_messages", "put_message")
                  for be in PRODUCER_BACKENDS for t in THREADS]


@pytest.mark.parametrize("api,backend_name,threads", PRODUCER_CASES,
                         ids=[f"{a}-{b}-{t}t" for a, b, t in PRODUCER_CASES])
def test_producers(benchmark, store_factory, producer_msgs, api, backend_name, threads):
    store = store_factory(backend_name, producer_msgs, RUNS,
                          flush_disk_type=FlushDiskType.ASYNC_FLUSH, ha_listen_port=0)
    shares = _split(producer_msgs, threads)
    results = []          # list.extend is atomic: producer threads share it
    if api == "put_messages":
        def produce(share):
            put = store.put_messages
            results.extend([put(share[i:i + BATCH]) for i in range(0, len(share), BATCH)])
    else:
        def produce(share):
            put = store.put_message
            results.extend([put(m) for m in share])
    pool = ThreadPoolExecutor(threads)
    list(pool.map(lambda _: None, range(threads)))      # threads exist before timing

    runs = []

    def run():
        for f in [pool.submit(produce, s) for s in shares]:
            f.result()
        runs.append(1)
    benchmark.group = f"threads: {api}, {PRODUCER_MSGS:,} msgs of 128 B in total"
    benchmark.name = f"{backend_name} x{threads}"
    benchmark.extra_info["messages"] = PRODUCER_MSGS
    try:
        benchmark.pedantic(run, rounds=RUNS - 1, iterations=1, warmup_rounds=1)
    finally:
        pool.shutdown()
    check_puts(results, len(runs) * PRODUCER_MSGS)
    check_read_back(store, producer_msgs, len(runs), ordered=False)
    _record(benchmark, (benchmark.group, backend_name), threads)
    if benchmark.stats is not None:
        benchmark.extra_info["msgs_per_s"] = round(PRODUCER_MSGS / benchmark.stats.stats.mean)


# ---- crc32 -----------------------------------------------------------------------------------
def _crc_variants():
    out = {}
    avail = kernels.available()
    if "cext" in avail:
        out["cext 1 MiB (no GIL)"] = (kernels.load("cext").crc32, 1 << 20)
    if "cffi" in avail:
        out["cffi 1 MiB (no GIL)"] = (kernels.load("cffi").crc32, 1 << 20)
    out["zlib.crc32 1 MiB (no GIL)"] = (zlib.crc32, 1 << 20)
    out["pure 1 MiB (zlib)"] = (kernels.load("pure").crc32, 1 << 20)
    if "cext" in avail:
        out["cext 4 KiB calls (GIL held)"] = (kernels.load("cext").crc32, 4 << 10)
    return out


CRC_VARIANTS = _crc_variants()
CRC_CASES = [(v, t) for v in CRC_VARIANTS for t in THREADS]


@pytest.fixture(scope="module")
def crc_buffers():
    block = os.urandom(1 << 20)
    return [block] * CRC_MIB       # the same bytes each time: CRC work does not depend on it


@pytest.mark.parametrize("variant,threads", CRC_CASES,
                         ids=[f"{v.split()[0]}-{v.split()[1]}{v.split()[2]}-{t}t"
                              for v, t in CRC_CASES])
def test_crc32_threads(benchmark, crc_buffers, variant, threads):
    fn, chunk = CRC_VARIANTS[variant]
    shares = _split(crc_buffers, threads)
    if chunk == 1 << 20:
        def work(bufs):
            for b in bufs:
                fn(b)
    else:
        def work(bufs):
            for b in bufs:
                mv = memoryview(b)
                for off in range(0, len(b), chunk):
                    fn(mv[off:off + chunk])
    pool = ThreadPoolExecutor(threads)
    list(pool.map(lambda _: None, range(threads)))
    barrier = threading.Barrier(threads)

    def task(bufs):
        barrier.wait()
        work(bufs)

    def run():
        for f in [pool.submit(task, s) for s in shares]:
            f.result()
    benchmark.group = f"threads: crc32 of {CRC_MIB} MiB in total"
    benchmark.name = f"{variant} x{threads}"
    benchmark.extra_info["bytes"] = CRC_MIB << 20
    try:
        benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    finally:
        pool.shutdown()
    _record(benchmark, (benchmark.group, variant), threads)
    if benchmark.stats is not None:
        benchmark.extra_info["GiB_per_s"] = round(CRC_MIB / 1024 / benchmark.stats.stats.mean, 2)
