# SPDX-License-Identifier: Apache-2.0
"""`rocketstore bench`: produce, consume and reopen an embedded store; print one table."""
import json
import os
import shutil
import tempfile
import time

from . import kernels as _kernels
from .config import StoreConfig
from .store import MessageStore
from .workload import make_messages


def _fdatasync_latency_us(directory, rounds=20):
    path = os.path.join(directory, ".fdatasync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        samples = []
        for i in range(rounds):
            os.pwrite(fd, b"x" * 4096, i * 4096)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            samples.append((time.perf_counter() - t0) * 1e6)
    finally:
        os.close(fd)
        os.remove(path)
    samples.sort()
    return samples[len(samples) // 2]


def _phase(name, count, nbytes, seconds, latencies_us):
    latencies_us.sort()
    n = len(latencies_us)

    def pct(p):
        return latencies_us[min(n - 1, int(p * n))] if n else 0.0
    return {"phase": name, "messages": count, "seconds": round(seconds, 4),
            "msgs_per_s": round(count / seconds) if seconds else 0,
            "mb_per_s": round(nbytes / seconds / 1e6, 1) if seconds else 0,
            "p50_us": round(pct(0.50), 1), "p99_us": round(pct(0.99), 1),
            "max_us": round(latencies_us[-1], 1) if n else 0.0}


def run_bench(args):
    backend = _kernels.resolve(args.backend)
    root = args.dir or tempfile.mkdtemp(prefix="rocketstore-bench-")
    cleanup = args.dir is None
    cfg = StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=args.file_size)
    msgs = make_messages(args.messages, args.size, args.topics, args.queues)
    results = []
    try:
        # produce
        lat = []
        perf = time.perf_counter
        with MessageStore(root, cfg, kernels=backend) as store:
            t0 = perf()
            if args.batch <= 1:
                put = store.put_message
                for m in msgs:
                    t = perf()
                    put(m)
                    lat.append((perf() - t) * 1e6)
            else:
                for i in range(0, len(msgs), args.batch):
                    chunk = msgs[i:i + args.batch]
                    t = perf()
                    store.put_messages(chunk)
                    lat.append((perf() - t) * 1e6 / len(chunk))
            produce_s = perf() - t0
            nbytes = store.get_max_phy_offset()
            results.append(_phase("produce", len(msgs), nbytes, produce_s, lat))
            # consume every queue through its ConsumeQueue
            while store.dispatch_behind_bytes() > 0:
                time.sleep(0.001)
            lat = []
            got = 0
            t0 = perf()
            for t in range(args.topics):
                topic = f"BenchTopic{t}"
                for q in range(args.queues):
                    offset = 0
                    while True:
                        t1 = perf()
                        r = store.get_message("bench", topic, q, offset, 32)
                        if not r.messages:
                            break
                        lat.append((perf() - t1) * 1e6 / len(r.messages))
                        got += len(r.messages)
                        offset = r.next_begin_offset
            results.append(_phase("consume", got, nbytes, perf() - t0, lat))
            if got != len(msgs):
                raise RuntimeError(f"consumed {got} of {len(msgs)} messages")
        # reopen: recovery of what was just written
        t0 = perf()
        store = MessageStore(root, cfg, kernels=backend)
        store.load()
        reopen_s = perf() - t0
        store.shutdown()
        results.append(_phase("reopen", len(msgs), nbytes, reopen_s, [reopen_s * 1e6]))
        fsync_us = _fdatasync_latency_us(root)
    finally:
        if cleanup:
            shutil.rmtree(root, ignore_errors=True)
    report = {"backend": backend.NAME, "messages": args.messages, "body_size": args.size,
              "topics": args.topics, "queues": args.queues, "batch": args.batch,
              "flush": args.flush, "fdatasync_p50_us": round(fsync_us, 1), "phases": results}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"rocketstore bench: backend={backend.NAME} messages={args.messages} "
              f"size={args.size}B topics={args.topics} queues={args.queues} "
              f"batch={args.batch} flush={args.flush}")
        cols = ["phase", "msgs_per_s", "mb_per_s", "p50_us", "p99_us", "max_us"]
        print("  ".join(f"{c:>12}" for c in cols))
        for r in results:
            print("  ".join(f"{r[c]:>12}" for c in cols))
        print(f"fdatasync of 4 KiB on this disk (p50): {fsync_us:.1f} us")
    return 0
