# SPDX-License-Identifier: Apache-2.0
"""The processes of tests/test_live_reader.py and bench/bench_live_reader.py: a writer that
puts numbered messages into a store, and a reader (a LiveReader in its own process) that
follows it and checks what it gets.

Every message's body is `<queue id>:<queue offset>` padded to BODY bytes, so a reader can tell
a message out of order, seen twice or missing without being told what was put.

    python live_worker.py writer ROOT --seconds S [--queues Q] [--rate R] [--budget B]
        [--offsets-dir DIR --readers N] [--backend NAME]
    python live_worker.py reader ROOT OUT --offsets PATH --stop STOPFILE [--queues Q]

The writer prints one line per acknowledged put ("<queue> <queue offset>", written with one
os.write each, so a SIGKILL loses none it printed) and, at the end, "deleted <n>" (CommitLog
files its cleaning deleted). Given --offsets-dir, it reads the readers' offsets files there
(consumerOffset.json format) and commits their minimum for the group "live-readers" in its
store, so that cleaning (store_size_budget, clean_protect_unconsumed) never deletes what a
reader has not read yet; it cleans nothing until N readers have an offsets file. Restarted on
the same store, it goes on from each queue's maximum.

The reader consumes every queue with a Consumer (batches, offsets committed to --offsets) until
STOPFILE exists (written by the test once the writer is done: JSON {queue id: end offset}) and
it has read every queue to its end, then writes OUT as JSON: per queue the offsets it saw, in
order, and the errors it found."""
import argparse
import json
import os
import sys
import time

TOPIC = "LiveTopic"
GROUP = "live-readers"
BODY = 120


def small_config(**overrides):
    from rocketstore import testing
    # Small files: the CommitLog rolls every few hundred messages and a queue's file every
    # 100 units, so rolls and cleaning happen within seconds.
    return testing.small_config(**{"mapped_file_size_commit_log": 64 * 1024, **overrides})


def body(queue_id, offset):
    return (b"%d:%d:" % (queue_id, offset)).ljust(BODY, b".")


def parse(b):
    q, off, _ = b.split(b":", 2)
    return int(q), int(off)


def _reader_offsets(directory, queues):
    """The least offset each queue has been read to by every reader whose offsets file is in
    `directory` (0 for a reader that has committed nothing yet)."""
    from rocketstore.live import _ReaderOffsets
    from rocketstore.fs import DEFAULT
    low = {q: None for q in range(queues)}
    for name in os.listdir(directory):
        if not name.endswith(".json"):
            continue
        offsets = _ReaderOffsets(os.path.join(directory, name), DEFAULT)
        offsets.load()
        for q in range(queues):
            o = max(0, offsets.query_offset(GROUP, TOPIC, q))
            low[q] = o if low[q] is None else min(low[q], o)
    return {q: o or 0 for q, o in low.items()}


def _readers_there(args):
    """Whether every reader has committed once (before that, cleaning could delete what one
    of them has not read)."""
    if not args.offsets_dir:
        return True
    names = [n for n in os.listdir(args.offsets_dir) if n.endswith(".json")]
    return len(names) >= args.readers


def writer(args):
    from rocketstore import Message, MessageStore
    cfg = small_config(store_size_budget=args.budget, clean_protect_unconsumed=True)
    store = MessageStore(args.root, cfg, kernels=args.backend)
    store.load()
    store.start()
    out = sys.stdout.fileno()
    next_off = [store.get_max_offset_in_queue(TOPIC, q) for q in range(args.queues)]
    deleted = 0
    t0 = time.monotonic()
    last_clean = t0
    sent = 0
    try:
        while time.monotonic() - t0 < args.seconds:
            q = sent % args.queues
            r = store.put_message(Message(TOPIC, body(q, next_off[q]), queue_id=q))
            if r.status.name != "PUT_OK" or r.queue_offset != next_off[q]:
                raise SystemExit(f"put {q}:{next_off[q]} answered {r.status.name} at "
                                 f"{r.queue_offset}")
            os.write(out, b"%d %d\n" % (q, next_off[q]))
            next_off[q] += 1
            sent += 1
            if args.rate:
                ahead = sent / args.rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
            now = time.monotonic()
            if args.budget and now - last_clean > 0.05 and _readers_there(args):
                last_clean = now
                if args.offsets_dir:
                    for qq, o in _reader_offsets(args.offsets_dir, args.queues).items():
                        store.commit_offset(GROUP, TOPIC, qq, o)
                deleted += len(store.clean_files_periodically())
    finally:
        store.shutdown()
    os.write(out, b"deleted %d\n" % deleted)


def reader(args):
    from rocketstore.live import LiveReader
    seen = {q: [] for q in range(args.queues)}
    errors = []
    with LiveReader(args.root, offsets_path=args.offsets, offsets_flush_ms=50) as live:
        consumers = [live.consume(GROUP, TOPIC, q, batch_size=64) for q in range(args.queues)]
        ends = None
        while True:
            for c in consumers:
                batch = c.next_batch(wait_ms=5)
                for m in batch or ():
                    q, off = parse(m.body)
                    if q != c.queue_id or off != m.queue_offset or m.topic != TOPIC:
                        errors.append(f"queue {c.queue_id} offset {m.queue_offset}: "
                                      f"body {m.body[:20]!r}")
                    seen[c.queue_id].append(m.queue_offset)
            live.flush_offsets()    # the last commit too: the test reads these files
            if ends is None and os.path.exists(args.stop):
                with open(args.stop) as f:
                    ends = {int(q): e for q, e in json.load(f).items()}
            if ends is not None and all(c.offset >= ends.get(c.queue_id, 0)
                                        for c in consumers):
                break
        for c in consumers:
            c.commit()
            c.close()
    with open(args.out + ".tmp", "w") as f:
        json.dump({"seen": seen, "errors": errors}, f)
    os.replace(args.out + ".tmp", args.out)


def main(argv=None):
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="role", required=True)
    w = sub.add_parser("writer")
    w.add_argument("root")
    w.add_argument("--seconds", type=float, required=True)
    w.add_argument("--queues", type=int, default=2)
    w.add_argument("--rate", type=float, default=0)
    w.add_argument("--budget", type=int, default=0)
    w.add_argument("--offsets-dir")
    w.add_argument("--readers", type=int, default=0)
    w.add_argument("--backend")
    r = sub.add_parser("reader")
    r.add_argument("root")
    r.add_argument("out")
    r.add_argument("--offsets", required=True)
    r.add_argument("--stop", required=True)
    r.add_argument("--queues", type=int, default=2)
    args = p.parse_args(argv)
    (writer if args.role == "writer" else reader)(args)


if __name__ == "__main__":
    main()
