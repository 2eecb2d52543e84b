# SPDX-License-Identifier: Apache-2.0
"""`dump` and `export`: the messages of a store, in commit-log order, as JSON lines or CSV."""
import json
import sys

from ..errors import CorruptBodyError, MissingCodecError, StoreError
from .common import DefaultsHelpFormatter, UsageError


def add_parsers(sub):
    d = sub.add_parser("dump", help="print every message as one JSON object per line",
                       formatter_class=DefaultsHelpFormatter)
    d.add_argument("store_dir", help="store root (holds commitlog/, consumequeue/)")
    _add_selection(d)
    d.set_defaults(func=_dump)

    e = sub.add_parser("export", help="stream messages out for analysis (read-only)",
                       formatter_class=DefaultsHelpFormatter)
    e.add_argument("store_dir", help="store root")
    e.add_argument("--format", choices=["jsonl", "csv"], default="jsonl", help="output format")
    e.add_argument("--body", choices=["text", "base64"], default="text",
                   help="how bodies are written")
    _add_selection(e)
    e.set_defaults(func=_export)


def _add_selection(p):
    p.add_argument("--topic", default=None, help="only this topic")
    p.add_argument("--queue", type=int, default=None, help="only this queue id")
    p.add_argument("--from", dest="from_offset", type=int, default=None,
                   help="first commit-log offset (a record start)")
    p.add_argument("--to", dest="to_offset", type=int, default=None,
                   help="stop before this commit-log offset")
    p.add_argument("--from-time", type=int, default=None,
                   help="only records stored at or after this epoch-ms time")
    p.add_argument("--to-time", type=int, default=None,
                   help="only records stored at or before this epoch-ms time")
    p.add_argument("--limit", type=int, default=None, help="stop after this many messages")
    p.add_argument("--stored-body", action="store_true",
                   help="write compressed bodies as stored instead of decompressing them")


def _selected(store, args, damage):
    """Messages of a store in commit-log order, filtered by the dump/export options. Damage
    does not end the walk: each problem goes to `damage(where, detail)` and the records
    after it follow, as `verify` finds them."""
    import os
    from ..verify import walk_commitlog
    start = getattr(args, "from_offset", None)
    if args.limit is not None and args.limit < 0:
        raise UsageError(f"--limit is {args.limit}; it must be at least 0")
    if start is not None and not _record_starts_at(store, start):
        raise StoreError(f"no record starts at commit-log offset {start}")
    count = 0
    for step in walk_commitlog(store.commitlog, store.kernels, start):
        if step[0] == "damage":
            _, mf, pos, detail = step
            damage(f"{os.path.relpath(mf.path, store.root)}@{pos}", detail)
            continue
        _, mf, chunk = step
        # The records the scan checked, decoded from its rows (the read path's decoder).
        for m in store.read_path.decode_rows(mf.mm, chunk, len(chunk)):
            if args.to_offset is not None and m.commit_log_offset >= args.to_offset:
                return
            if args.topic is not None and m.topic != args.topic:
                continue
            if args.queue is not None and m.queue_id != args.queue:
                continue
            if args.from_time is not None and m.store_timestamp < args.from_time:
                continue
            if args.to_time is not None and m.store_timestamp > args.to_time:
                continue
            if args.limit is not None and count >= args.limit:
                return
            yield m
            count += 1


def _record_starts_at(store, offset):
    """A valid record (or the blank that ends a file) starts at commit-log `offset`."""
    import numpy as np
    from .. import format as F
    mf = store.commitlog.mfq.find_by_offset(offset)
    if mf is None:
        return False
    rows = np.empty(1, dtype=F.SCAN_DTYPE)
    n, _, reason, _ = store.kernels.commitlog_scan(mf.mm, offset - mf.file_from_offset,
                                                   mf.file_size, True, rows)
    return n == 1 or reason == F.SCAN_BLANK


class _DamageLog:
    """Problems met while streaming records: one stderr line each, and the exit status."""

    def __init__(self, command):
        self.command = command
        self.count = 0

    def __call__(self, where, detail):
        self.count += 1
        print(f"rocketstore {self.command}: damage: {where}: {detail}", file=sys.stderr)

    def finish(self, printed):
        if not self.count:
            return 0
        print(f"rocketstore {self.command}: {self.count} problem(s) in the CommitLog, "
              f"{printed} message(s) written; run `rocketstore verify` for the whole store",
              file=sys.stderr)
        return 1


def _dump(args):
    from ..store import MessageStore
    store = MessageStore.open_read_only(args.store_dir, kernels=args.backend)
    out = sys.stdout
    damage = _DamageLog("dump")
    printed = 0
    try:
        for m in _selected(store, args, damage):
            d = m.to_dict(cq_tags_code(store, m), decompress=not args.stored_body)
            if "bodyError" in d:
                # Written as stored, marked, and reported: the dump goes on (doc/01 §3.5).
                damage(f"commit-log offset {m.commit_log_offset}", d["bodyError"])
            out.write(json.dumps(d, separators=(",", ":")))
            out.write("\n")
            printed += 1
    finally:
        store.shutdown()
    return damage.finish(printed)


def _export(args):
    """Messages of one topic for analysis: JSON lines with the body as text (UTF-8, invalid
    bytes replaced) or base64, properties as an object."""
    import base64
    import csv
    from ..store import MessageStore
    store = MessageStore.open_read_only(args.store_dir, kernels=args.backend)
    out = sys.stdout
    writer = None
    damage = _DamageLog("export")
    printed = 0
    try:
        for m in _selected(store, args, damage):
            body = body_or_stored(m, args.stored_body, damage)
            row = {"topic": m.topic, "queueId": m.queue_id, "queueOffset": m.queue_offset,
                   "commitLogOffset": m.commit_log_offset, "storeTimestamp": m.store_timestamp,
                   "bornTimestamp": m.born_timestamp, "msgId": m.msg_id, "tags": m.tags,
                   "keys": m.keys, "compressed": m.compressed,
                   "body": (base64.b64encode(body).decode() if args.body == "base64"
                            else bytes(body).decode("utf-8", "replace"))}
            if args.format == "csv":
                if writer is None:
                    writer = csv.DictWriter(out, fieldnames=list(row) + ["properties"])
                    writer.writeheader()
                writer.writerow(dict(row, properties=json.dumps(m.properties)))
            else:
                row["properties"] = m.properties
                out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")))
                out.write("\n")
            printed += 1
    finally:
        store.shutdown()
    return damage.finish(printed)


def body_or_stored(m, stored, damage):
    """m's original body, or its stored bytes when `stored` is set or the body does not
    decompress (reported to `damage`; the export goes on)."""
    if stored:
        return m.stored_body
    try:
        return m.body
    except (CorruptBodyError, MissingCodecError) as exc:
        damage(f"commit-log offset {m.commit_log_offset}", f"{exc}; written as stored")
        return m.stored_body


def cq_tags_code(store, m):
    """The tagsCode of the unit that points at `m`, or None when no unit does."""
    queues = store.consume_queue_table.get(m.topic)
    cq = queues.get(m.queue_id) if queues else None
    if cq is None:
        return None
    units = cq.units(m.queue_offset, 1)
    if len(units) != 1 or int(units[0]["offset"]) != m.commit_log_offset:
        return None
    return int(units[0]["tags_code"])
