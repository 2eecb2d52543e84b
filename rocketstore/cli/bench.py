# SPDX-License-Identifier: Apache-2.0
"""`rocketstore bench`: produce, consume, query by key and reopen an embedded store; print one
table of msgs/s, MB/s and latency percentiles per phase, with this disk's fdatasync latency
for reference.

Each phase is checked after its timed part (every put PUT_OK, every queue holding what was
put, every key found, the reopened store as long as the written one); a failed check ends the
run with WorkloadCheckError, which the CLI prints as one line."""
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time

from .. import kernels as _kernels
from ..config import FlushDiskType
from ..errors import WorkloadCheckError
from ..store import MessageStore
from ..workload import (check_puts, check_read_back, make_messages, sized_config,
                       wait_dispatched)
from .common import SIGNAL_POLL_S, DefaultsHelpFormatter, check_counts
from .progress import progress_bar

# Bodies compared per queue after the consume phase, which has just read every message.
SAMPLE_PER_QUEUE = 100
MAX_FILE_SIZE = 1 << 30        # RocketMQ's default CommitLog file size
ONE_AT_A_TIME_STEP = 1000      # puts between a producer's looks at the stop flag


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


def _produce(store, msgs, batch, threads, bar):
    """Put `msgs` from `threads` producer threads; per-message latencies in microseconds and
    the put results, for check_puts."""
    perf = time.perf_counter
    chunks = [msgs[i::threads] for i in range(threads)]
    latencies = []
    results = []
    lock = threading.Lock()
    stop = threading.Event()    # set on Ctrl-C; each producer looks at it between steps

    def work(chunk):
        local = []
        done = []
        keep = done.append
        if batch <= 1:
            put = store.put_message
            for i in range(0, len(chunk), ONE_AT_A_TIME_STEP):
                if stop.is_set():
                    break
                for m in chunk[i:i + ONE_AT_A_TIME_STEP]:
                    t = perf()
                    keep(put(m))
                    local.append((perf() - t) * 1e6)
                bar.update(min(ONE_AT_A_TIME_STEP, len(chunk) - i))
        else:
            for i in range(0, len(chunk), batch):
                if stop.is_set():
                    break
                part = chunk[i:i + batch]
                t = perf()
                keep(store.put_messages(part))
                local.append((perf() - t) * 1e6 / len(part))
                bar.update(len(part))
        with lock:
            latencies.extend(local)
            results.extend(done)

    if threads == 1:
        work(msgs)
        return latencies, results
    errors = []

    def guarded(chunk):
        # A put that raises (bad input) reaches the caller, and so the CLI's one-line error,
        # instead of a thread's traceback.
        try:
            work(chunk)
        except Exception as exc:
            errors.append(exc)
    ts = [threading.Thread(target=guarded, args=(c,)) for c in chunks]
    try:
        for t in ts:
            t.start()
        # Joined in steps of SIGNAL_POLL_S, so that a Ctrl-C the kernel hands to a producer
        # or to one of the store's threads still stops the run.
        for t in ts:
            while t.is_alive():
                t.join(SIGNAL_POLL_S)
    except BaseException:
        # Stop the producers before the caller shuts the store down under them. One not yet
        # alive (Ctrl-C came while starting it) has not run: its first step sees the flag.
        stop.set()
        for t in ts:
            if t.is_alive():
                t.join()
        raise
    if errors:
        raise errors[0]
    return latencies, results


def _config(args, root, msgs):
    """The CommitLog file size asked for, else one sized to the messages (at most 1 GiB), so
    a small run does not reserve two 1 GiB files."""
    flush = FlushDiskType.SYNC_FLUSH if args.flush == "sync" else FlushDiskType.ASYNC_FLUSH
    cfg = sized_config(msgs, store_path_root_dir=root, flush_disk_type=flush)
    size = args.file_size or min(cfg.mapped_file_size_commit_log, MAX_FILE_SIZE)
    return dataclasses.replace(cfg, mapped_file_size_commit_log=size)


def run_bench(args):
    backend = _kernels.resolve(args.backend)
    root = args.dir or tempfile.mkdtemp(prefix="rocketstore-bench-")
    cleanup = args.dir is None
    results = []
    perf = time.perf_counter
    try:
        msgs = make_messages(args.messages, args.size, args.topics, args.queues)
        cfg = _config(args, root, msgs)
        with MessageStore(root, cfg, kernels=backend) as store:
            with progress_bar(len(msgs), "produce", unit="msg") as bar:
                t0 = perf()
                lat, puts = _produce(store, msgs, args.batch, args.threads, bar)
                produce_s = perf() - t0
            check_puts(puts, len(msgs))
            nbytes = store.get_max_phy_offset()
            results.append(_phase("produce", len(msgs), nbytes, produce_s, lat))
            wait_dispatched(store, timeout=600)
            # consume every queue through its ConsumeQueue
            lat = []
            got = 0
            with progress_bar(len(msgs), "consume", unit="msg") as bar:
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
                            bar.update(len(r.messages))
                            offset = r.next_begin_offset
                consume_s = perf() - t0
            results.append(_phase("consume", got, nbytes, consume_s, lat))
            if got != len(msgs):
                raise WorkloadCheckError(f"consumed {got} of {len(msgs)} messages")
            # Producer threads interleave their puts, so a queue's order is theirs to decide.
            check_read_back(store, msgs, ordered=args.threads == 1, sample=SAMPLE_PER_QUEUE)
            # look up random keys through the IndexFile
            rng = random.Random(1)
            picks = [msgs[rng.randrange(len(msgs))] for _ in range(min(args.queries, len(msgs)))]
            lat = []
            missed = []
            with progress_bar(len(picks), "query", unit="key") as bar:
                t0 = perf()
                for m in picks:
                    t1 = perf()
                    r = store.query_message(m.topic, m.keys, 1)
                    lat.append((perf() - t1) * 1e6)
                    if not r.messages:
                        missed.append(m.keys)
                    bar.update(1)
                query_s = perf() - t0
            if missed:
                raise WorkloadCheckError(f"{len(missed)} of {len(picks)} keys not found, "
                                         f"e.g. {missed[0]!r}")
            results.append(_phase("query by key", len(picks), 0, query_s, lat))
        # reopen: recovery of what was just written
        t0 = perf()
        store = MessageStore(root, cfg, kernels=backend)
        store.load()
        reopen_s = perf() - t0
        reopened = store.get_max_phy_offset()
        store.shutdown()
        if reopened != nbytes:
            raise WorkloadCheckError(f"the reopened store holds {reopened} CommitLog bytes; "
                                     f"{nbytes} were written")
        results.append(_phase("reopen", len(msgs), nbytes, reopen_s, [reopen_s * 1e6]))
        fsync_us = _fdatasync_latency_us(root)
    finally:
        if cleanup:
            shutil.rmtree(root, ignore_errors=True)
    report = {"backend": backend.NAME, "messages": args.messages, "body_size": args.size,
              "topics": args.topics, "queues": args.queues, "batch": args.batch,
              "threads": args.threads, "flush": args.flush,
              "fdatasync_p50_us": round(fsync_us, 1), "phases": results}
    if args.json:
        # camelCase, as every other command's JSON.
        from ..repair import camel_keys
        report = dict(camel_keys(report), phases=[camel_keys(p) for p in results])
        print(json.dumps(report, indent=2))
        return 0
    print(f"rocketstore bench: backend={backend.NAME} messages={args.messages} "
          f"size={args.size}B topics={args.topics} queues={args.queues} batch={args.batch} "
          f"threads={args.threads} flush={args.flush}")
    cols = ["phase", "msgs_per_s", "mb_per_s", "p50_us", "p99_us", "max_us"]
    print("  ".join(f"{c:>12}" for c in cols))
    for r in results:
        print("  ".join(f"{r[c]:>12}" for c in cols))
    print(f"fdatasync of 4 KiB on this disk (p50): {fsync_us:.1f} us")
    return 0


def add_parsers(sub):
    b = sub.add_parser("bench", help="produce, consume and reopen a store; print a table",
                       formatter_class=DefaultsHelpFormatter)
    b.add_argument("--dir", default=None, help="store directory (default: a temporary one)")
    b.add_argument("--messages", type=int, default=200_000, help="messages to produce")
    b.add_argument("--size", type=int, default=128, help="body size in bytes")
    b.add_argument("--topics", type=int, default=1, help="number of topics")
    b.add_argument("--queues", type=int, default=4, help="queues per topic")
    b.add_argument("--batch", type=int, default=1,
                   help="messages per put_messages call (1: put_message)")
    b.add_argument("--flush", choices=["async", "sync"], default="async",
                   help="ASYNC_FLUSH or SYNC_FLUSH (group commit)")
    b.add_argument("--threads", type=int, default=1, help="producer threads")
    b.add_argument("--queries", type=int, default=10_000, help="random key lookups")
    b.add_argument("--file-size", type=int, default=0,
                   help="CommitLog file size in bytes (0: sized to the messages, at most 1 GiB)")
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    b.set_defaults(func=_bench)


# The least value of each `rocketstore bench` count: none may be negative, and a run needs a
# topic, a queue, a producer thread and a batch of at least one message.
_BENCH_MINIMUM = {"messages": 0, "size": 0, "topics": 1, "queues": 1, "batch": 1, "threads": 1,
                  "queries": 0, "file_size": 0}


def _bench(args):
    check_counts(args, _BENCH_MINIMUM, "size")
    # Building the messages comes before the first progress bar and takes a while.
    print(f"rocketstore bench: building {args.messages:,} messages of {args.size} bytes",
          file=sys.stderr, flush=True)
    return run_bench(args)
