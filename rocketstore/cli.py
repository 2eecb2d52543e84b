# SPDX-License-Identifier: Apache-2.0
"""The `rocketstore` command: `bench` (the main job) and offline tools for a store directory."""
import argparse
import json
import logging
import sys

from .errors import StoreError

log = logging.getLogger("rocketstore")


def _dump(args):
    from .store import MessageStore
    store = MessageStore.open_read_only(args.store_dir, kernels=args.backend)
    out = sys.stdout
    count = 0
    try:
        for m in store.iter_messages():
            if args.topic is not None and m.topic != args.topic:
                continue
            if args.queue is not None and m.queue_id != args.queue:
                continue
            out.write(json.dumps(m.to_dict(_cq_tags_code(store, m)), separators=(",", ":")))
            out.write("\n")
            count += 1
            if args.limit is not None and count >= args.limit:
                break
    finally:
        store.shutdown()
    return 0


def _cq_tags_code(store, m):
    """The tagsCode of the unit that points at `m`, or None when no unit does."""
    queues = store.consume_queue_table.get(m.topic)
    cq = queues.get(m.queue_id) if queues else None
    if cq is None:
        return None
    units = cq.units(m.queue_offset, 1)
    if len(units) != 1 or int(units[0]["offset"]) != m.commit_log_offset:
        return None
    return int(units[0]["tags_code"])


def _bench(args):
    from .bench_job import run_bench
    return run_bench(args)


def build_parser():
    p = argparse.ArgumentParser(
        prog="rocketstore",
        description="An embeddable Apache RocketMQ message store: benchmark it, or inspect a "
                    "store directory written by rocketstore or by a RocketMQ broker.")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    p.add_argument("--backend", default=None, choices=["cext", "cffi", "pure"],
                   help="kernel backend (default: ROCKETSTORE_BACKEND, else the fastest built)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("bench", help="produce, consume and reopen a store; print a table",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    b.add_argument("--dir", default=None, help="store directory (default: a temporary one)")
    b.add_argument("--messages", type=int, default=200_000, help="messages to produce")
    b.add_argument("--size", type=int, default=128, help="body size in bytes")
    b.add_argument("--topics", type=int, default=1, help="number of topics")
    b.add_argument("--queues", type=int, default=4, help="queues per topic")
    b.add_argument("--batch", type=int, default=1,
                   help="messages per put_messages call (1: put_message)")
    b.add_argument("--flush", choices=["async"], default="async", help="flush mode")
    b.add_argument("--file-size", type=int, default=64 << 20,
                   help="CommitLog file size in bytes")
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    b.set_defaults(func=_bench)

    d = sub.add_parser("dump", help="print every message as one JSON object per line",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d.add_argument("store_dir", help="store root (holds commitlog/, consumequeue/)")
    d.add_argument("--topic", default=None, help="only this topic")
    d.add_argument("--queue", type=int, default=None, help="only this queue id")
    d.add_argument("--limit", type=int, default=None, help="stop after this many messages")
    d.set_defaults(func=_dump)
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args) or 0
    except BrokenPipeError:
        return 0
    except (StoreError, OSError, ValueError) as exc:
        if args.debug:
            raise
        print(f"rocketstore {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
