# SPDX-License-Identifier: Apache-2.0
"""The child of test_crash.py: opens a store, puts messages until it is killed, and prints one
line per acknowledged message: `ack <index> <commit_log_offset> <size> <queue_offset> <put_ok>`.

With --durability-log it also appends every completed sync to that file (`sync <path> <start>
<end>`, `ckpt <path> <hex>`), so the parent can throw away what a power cut would have lost.
"""
import argparse
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from rocketstore import FlushDiskType, Message, MessageStore  # noqa: E402
from rocketstore.fs import FileSystem  # noqa: E402

TOPICS = ("CrashA", "CrashB", "CrashC")


def crash_config(mode):
    from rocketstore.testing import small_config
    return small_config(
        flush_disk_type=FlushDiskType.SYNC_FLUSH if mode == "sync" else FlushDiskType.ASYNC_FLUSH,
        flush_interval_commit_log=5, flush_commit_log_least_pages=0,
        flush_commit_log_thorough_interval=20, flush_interval_consume_queue=5,
        flush_consume_queue_thorough_interval=20,
        transient_store_pool_enable=(mode == "pool"), transient_store_pool_size=3,
        commit_interval_commit_log=5, commit_commit_log_thorough_interval=5)


def message(index):
    """Message `index`, the same in the child and in the parent's check."""
    rng = random.Random(index)
    body = bytes(rng.getrandbits(8) for _ in range(rng.choice((0, 10, 100, 700, 3000))))
    return Message(TOPICS[index % 3], body, tags=f"t{index % 5}", keys=f"k{index}",
                   queue_id=rng.randrange(4), born_timestamp=index)


class RecordingFS(FileSystem):
    """Logs every completed sync, so the parent knows what a power cut would keep."""

    def __init__(self, log_path):
        self._log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _note(self, line):
        os.write(self._log, (line + "\n").encode())

    def sync_mapped(self, kernels, mm, path, start, length):
        super().sync_mapped(kernels, mm, path, start, length)
        self._note(f"sync {path} {start} {start + length}")

    def sync_checkpoint(self, mm, path):
        super().sync_checkpoint(mm, path)
        self._note(f"ckpt {path} {bytes(mm[:40]).hex()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--mode", choices=("sync", "async", "pool"), required=True)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--start", type=int, default=0, help="index of the first message")
    ap.add_argument("--durability-log", default=None)
    ap.add_argument("--count", type=int, default=None,
                    help="put this many messages, print `done`, then wait to be killed")
    ap.add_argument("--batch", type=int, default=None,
                    help="put_messages of exactly this many, every time")
    args = ap.parse_args()
    fs = RecordingFS(args.durability_log) if args.durability_log else None
    store = MessageStore(args.store, crash_config(args.mode), kernels=args.backend, fs=fs)
    store.load()
    store.start()
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    rng = random.Random(args.start)
    i = args.start
    end = None if args.count is None else args.start + args.count
    while end is None or i < end:
        if args.batch or rng.random() < 0.2:
            n = args.batch or rng.randrange(2, 40)
            if end is not None:
                n = min(n, end - i)
            rs = store.put_messages([message(j) for j in range(i, i + n)])
            assert rs.ok, rs.status
            durable = int(rs.status.name == "PUT_OK")
            lines = [f"ack {i + k} {int(o)} {int(s)} {int(q)} {durable}\n" for k, (o, s, q) in
                     enumerate(zip(rs.commit_log_offsets, rs.sizes, rs.queue_offsets))]
            out.write("".join(lines))
            i += n
        else:
            r = store.put_message(message(i))
            assert r.ok, r.status
            durable = int(r.status.name == "PUT_OK")
            out.write(f"ack {i} {r.commit_log_offset} {r.wrote_bytes} {r.queue_offset} "
                      f"{durable}\n")
            i += 1
        out.flush()
    out.write("done\n")
    out.flush()
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
