# SPDX-License-Identifier: Apache-2.0
"""The child of test_full_disk.py: one store session on a small file system, in its own
process, so that a SIGBUS kills this process and not pytest. Prints one JSON object a line.

`put`   opens the store, puts messages from --start on; with --fill, fills the disk (a
        filler file) once --fill-after messages are acknowledged; stops a few puts after the
        first refusal; shuts down (or, with --kill, dies by SIGKILL, leaving the store to
        abnormal recovery). Lines: {"ack": i}, {"refused": status, "reason": ...}.
        With --sync the store flushes SYNC_FLUSH and only PUT_OK acknowledges a put: a
        FLUSH_DISK_TIMEOUT (the put's sync failed) counts as a refusal.
`check` opens the store writable (or reports the clear load error), tries one put, then
        reads every message: through the ConsumeQueues when writable, and through a
        read-only open's CommitLog walk (ids, and their store times). Lines:
        {"checkpoint_physic"} (as found), {"load_error"}, {"recovered"}, {"put"}, {"queues"},
        {"walk", "stored"}.
"""
import argparse
import errno
import json
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from rocketstore import (FlushDiskType, Message, MessageStore, PutMessageStatus,  # noqa: E402
                         StoreConfig, testing)
from rocketstore.errors import StoreLoadError  # noqa: E402

TOPICS = ("FullA", "FullB")
REFUSALS = 3        # puts tried after the first refusal: all must be refused too


def config(sync=False, large=False):
    # Small files and windows, so a 16-24 MiB file system holds many of each. `large`: the
    # default CommitLog window (16 MiB) in 32 MiB files, so that the allocator populates them
    # in large page-cache folios (AllocateMappedFileService.FOLIO_WINDOWS), and index files
    # of 8.4 MB, which are written in large folios too (index_file.LARGE_FOLIOS_FROM).
    return StoreConfig(flush_disk_type=FlushDiskType.SYNC_FLUSH if sync else
                       FlushDiskType.ASYNC_FLUSH,
                       mapped_file_size_commit_log=(32 << 20) if large else 1 << 20,
                       mapped_file_size_consume_queue=20 * 2000,
                       commit_log_reserve_window=(16 << 20) if large else 256 * 1024,
                       consume_queue_reserve_window=4096,
                       max_hash_slot_num=256,
                       max_index_num=420_000 if large else 2000)


def message(i):
    body = b"%06d" % i + bytes([i % 251]) * (300 + 97 * i % 1200)
    return Message(TOPICS[i % 2], body, keys=f"k{i}", queue_id=i % 3, born_timestamp=i)


def msg_id(m):
    return int(m.body[:6])


def say(**obj):
    print(json.dumps(obj), flush=True)


def fill(path):
    """Write zeros to `path` until the file system has no page left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 20, 1 << 16, 4096):
            zeros = bytes(chunk)
            while True:
                try:
                    os.write(fd, zeros)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)


def put(args):
    store = MessageStore(args.root, config(args.sync, args.large), kernels=args.backend)
    store.load()
    store.start()
    refused = 0
    i = args.start
    while refused <= REFUSALS and i < args.start + args.max:
        if args.fill and i - args.start == args.fill_after:
            fill(args.fill)
        r = store.put_message(message(i))
        if r.status == PutMessageStatus.PUT_OK if args.sync else r.ok:
            if refused:
                say(error=f"message {i} acknowledged after a refusal")
            say(ack=i)
            i += 1
        else:
            refused += 1
            say(refused=r.status.name, reason=r.reason)
    if args.kill:
        os.kill(os.getpid(), signal.SIGKILL)
    store.shutdown()
    say(shutdown="ok")


def read_queues(store):
    ids = []
    for topic in TOPICS:
        for qid in range(3):
            offset = store.get_min_offset_in_queue(topic, qid)
            while True:
                got = store.get_message("g", topic, qid, offset, 32)
                if not got.messages:
                    break
                ids.extend(msg_id(m) for m in got.messages)
                offset = got.next_begin_offset
    return sorted(ids)


def check(args):
    checkpoint = os.path.join(args.root, "checkpoint")
    if os.path.exists(checkpoint):
        with open(checkpoint, "rb") as f:       # as the last run left it
            say(checkpoint_physic=int.from_bytes(f.read(8), "big"))
    store = MessageStore(args.root, config(args.sync, args.large), kernels=args.backend)
    try:
        report = store.load()
    except StoreLoadError as exc:
        say(load_error=str(exc))
    else:
        say(recovered={"normal": report.normal, "truncated_bytes": report.truncated_bytes})
        store.start()
        try:
            r = store.put_message(message(args.start))
            say(put=r.status.name, reason=r.reason)
            # Reput may be unable to write the queues on a full disk; whatever it could
            # not write is what a read through the queues misses, so wait for it only
            # when the disk has room.
            if args.room:
                testing.wait_dispatched(store, timeout=60)
                say(queues=read_queues(store))
        finally:
            store.shutdown()
    ro = MessageStore.open_read_only(args.root, config(large=args.large), kernels=args.backend)
    try:
        walk, stored = [], []
        for m in ro.iter_messages():
            walk.append(msg_id(m))
            stored.append(m.store_timestamp)
            if m.body != message(walk[-1]).body:
                say(error=f"message {walk[-1]} read back with another body")
        say(walk=walk, stored=stored)
    finally:
        ro.shutdown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("action", choices=("put", "check"))
    ap.add_argument("root")
    ap.add_argument("--backend", default="cext")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--max", type=int, default=100_000)
    ap.add_argument("--fill")
    ap.add_argument("--fill-after", type=int, default=0)
    ap.add_argument("--room", action="store_true", help="the disk has room again")
    ap.add_argument("--kill", action="store_true", help="die by SIGKILL instead of shutdown")
    ap.add_argument("--sync", action="store_true", help="SYNC_FLUSH; only PUT_OK acknowledges")
    ap.add_argument("--large", action="store_true",
                    help="CommitLog files populated in large folios (config)")
    args = ap.parse_args()
    put(args) if args.action == "put" else check(args)


if __name__ == "__main__":
    main()
