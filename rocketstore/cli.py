# SPDX-License-Identifier: Apache-2.0
"""The `rocketstore` command: `bench` (the main job) and offline tools for a store directory."""
import argparse
import json
import logging
import sys

from ._version import __version__
from .errors import (ConfigError, InvalidArgumentError, MessageIllegalError, StoreError,
                     StoreLockedError, UnsafePathError)

log = logging.getLogger("rocketstore")


def _selected(store, args, damage):
    """Messages of a store in commit-log order, filtered by the dump/export options. Damage
    does not end the walk: each problem goes to `damage(where, detail)` and the records
    after it follow, as `verify` finds them."""
    import os
    from .verify import walk_commitlog
    start = getattr(args, "from_offset", None)
    if args.limit is not None and args.limit < 0:
        raise UsageError(f"--limit is {args.limit}; it must be at least 0")
    if start is not None and not _record_starts_at(store, start):
        raise StoreError(f"no record starts at commit-log offset {start}")
    count = 0
    for step in walk_commitlog(store, start):
        if step[0] == "damage":
            _, mf, pos, detail = step
            damage(f"{os.path.relpath(mf.path, store.root)}@{pos}", detail)
            continue
        _, mf, chunk = step
        # The records the scan checked, decoded from its rows (the read path's decoder).
        for m in store._read_path.decode_rows(mf.mm, chunk, len(chunk)):
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
    from . import format as F
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
    from .store import MessageStore
    store = MessageStore.open_read_only(args.store_dir, kernels=args.backend)
    out = sys.stdout
    damage = _DamageLog("dump")
    printed = 0
    try:
        for m in _selected(store, args, damage):
            out.write(json.dumps(m.to_dict(_cq_tags_code(store, m)), separators=(",", ":")))
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
    from .store import MessageStore
    store = MessageStore.open_read_only(args.store_dir, kernels=args.backend)
    out = sys.stdout
    writer = None
    damage = _DamageLog("export")
    printed = 0
    try:
        for m in _selected(store, args, damage):
            row = {"topic": m.topic, "queueId": m.queue_id, "queueOffset": m.queue_offset,
                   "commitLogOffset": m.commit_log_offset, "storeTimestamp": m.store_timestamp,
                   "bornTimestamp": m.born_timestamp, "msgId": m.msg_id, "tags": m.tags,
                   "keys": m.keys,
                   "body": (base64.b64encode(m.body).decode() if args.body == "base64"
                            else bytes(m.body).decode("utf-8", "replace"))}
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


def _verify(args):
    from .progress import progress_bar
    from .store import MessageStore
    from .verify import verify_store
    import os
    from .fs import DEFAULT
    _, holder = DEFAULT.lock_holder(os.path.join(args.store_dir, "lock"))
    if holder:
        print(f"rocketstore verify: warning: the store is in use (pid {holder} holds its "
              f"lock): what it writes meanwhile may show as problems", file=sys.stderr)
    store = MessageStore.open_read_only(args.store_dir, kernels=args.backend)
    try:
        total = max(0, store.get_max_phy_offset() - max(0, store.get_min_phy_offset()))
        with progress_bar(total, "verify", unit="B") as bar:
            report = verify_store(store, bar.update)
    finally:
        store.shutdown()
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for problem in report.problems:
            print(problem)
        print(f"{report.records} records, {report.units} consume-queue units, "
              f"{report.index_entries} index entries checked: "
              f"{'OK' if report.ok else f'{len(report.problems)} problem(s)'}")
    return 0 if report.ok else 1


def _recover(args):
    """The plan first (computed read-only by the recovery code itself), then, unless
    --dry-run, the real run, reported in the plan's terms so the two can be compared."""
    import dataclasses
    from . import repair
    from .store import MessageStore
    geometry = dict(max_hash_slot_num=args.max_hash_slot_num, max_index_num=args.max_index_num)
    plan = repair.plan_recovery(args.store_dir, kernels=args.backend, **geometry)
    if args.json and args.dry_run:
        json.dump(plan.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not args.json:
        print(f"scan from file {plan.start_file}: the CommitLog ends at {plan.process_offset} "
              f"({plan.stop_reason or 'clean'}); {plan.truncated_bytes} bytes past it would "
              f"be truncated")
        for queue, units in sorted(plan.truncated_units.items()):
            print(f"  consume queue {queue}: {units} unit(s) past the end would be dropped")
        print(f"{plan.redispatch_records} record(s) would be dispatched again: consume-queue "
              f"units {plan.units_before} -> {plan.units_after}, index entries "
              f"{plan.index_entries_before} -> {plan.index_entries_after}"
              + (f" (rebuilding index file(s) {', '.join(plan.index_files_rebuilt)})"
                 if plan.index_files_rebuilt else ""))
    if args.dry_run:
        print("dry run: nothing changed")
        return 0
    report = repair.recover(args.store_dir, kernels=args.backend, **geometry)
    after = MessageStore.open_read_only(args.store_dir, kernels=args.backend)
    try:
        units, entries = repair.store_counts(after)
    finally:
        after.shutdown()
    result = dict(repair.camel_keys(dataclasses.asdict(report)), unitsBefore=plan.units_before,
                  unitsAfter=units, indexEntriesBefore=plan.index_entries_before,
                  indexEntriesAfter=entries)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"recovered: {report.records} records scanned, {report.dispatched} dispatched, "
              f"CommitLog ends at {report.process_offset}; consume-queue units "
              f"{plan.units_before} -> {units}, index entries {plan.index_entries_before} -> "
              f"{entries}")
    return 0


def _rebuild(args):
    import dataclasses
    from . import repair
    rebuild = (repair.rebuild_consume_queues if args.command == "rebuild-cq"
               else repair.rebuild_index)
    geometry = dict(max_hash_slot_num=args.max_hash_slot_num, max_index_num=args.max_index_num)
    if args.command == "rebuild-cq":
        report = rebuild(args.store_dir, kernels=args.backend, cq_file_size=args.cq_file_size,
                         **geometry)
    else:
        report = rebuild(args.store_dir, kernels=args.backend, **geometry)
    if args.json:
        json.dump(repair.camel_keys(dataclasses.asdict(report)), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"{args.command}: {report.records} records scanned, {report.dispatched} "
              f"dispatched in {report.seconds:.2f} s")
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


def _files_per_kind(store):
    """{kind: {"files": n, "bytes": apparent size, "allocatedBytes": on disk}} for commitlog,
    consumequeue, index and config. Segments are created at full size but sparse, so the
    apparent size overstates the disk a store uses."""
    import os
    fs = store.fs

    def walk(path):
        count = size = allocated = 0
        for name in fs.list_dir(path):
            p = os.path.join(path, name)
            if fs.is_dir(p):
                c, b, a = walk(p)
                count, size, allocated = count + c, size + b, allocated + a
            else:
                count, size = count + 1, size + fs.size(p)
                allocated += fs.allocated(p)
        return count, size, allocated

    kinds = {}
    dirs = {"commitlog": store.config.commitlog_dir(store.root),
            "consumequeue": os.path.join(store.root, "consumequeue"),
            "index": os.path.join(store.root, "index"),
            "config": os.path.join(store.root, "config")}
    for kind, path in dirs.items():
        count, size, allocated = walk(path)
        kinds[kind] = {"files": count, "bytes": size, "allocatedBytes": allocated}
    return kinds


def _ms_to_iso(ms):
    """UTC ISO time of an epoch-ms value, or None when it is 0 or no calendar date (a
    damaged checkpoint can hold anything up to 2**63 - 1)."""
    import datetime
    if not ms:
        return None
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(
            timespec="milliseconds")
    except (OverflowError, ValueError, OSError):
        return None


def store_stat(store, budget=None):
    """The `stat` report of an open (read-only) store as a JSON-ready dict, keys in
    RocketMQ's camelCase as every command's JSON. `budget`: the store_size_budget to report
    the store's size against (None: the store config's; 0: none)."""
    import os
    root = store.root
    if budget is None:
        budget = store.config.store_size_budget
    used = store.store_size()
    topics = []
    for topic in sorted(store.consume_queue_table):
        queues = store.consume_queue_table[topic]
        tc = store.topic_config(topic)
        topics.append({
            "topic": topic,
            "config": tc.to_json_obj() if tc else None,
            "queues": [{"queueId": q, "minOffset": queues[q].min_offset_in_queue,
                        "maxOffset": queues[q].max_offset_in_queue}
                       for q in sorted(queues)]})
    for name in sorted(set(store.topic_configs.topic_config_table) -
                       set(store.consume_queue_table)):
        topics.append({"topic": name, "config": store.topic_config(name).to_json_obj(),
                       "queues": []})
    groups = {}
    for group, topic, offsets in store.consumer_offsets.entries():
        table = store.consume_queue_table.get(topic, {})
        queues = []
        for qid in sorted(offsets):
            cq = table.get(qid)
            max_off = cq.max_offset_in_queue if cq is not None else None
            lag = max(0, max_off - offsets[qid]) if max_off is not None else None
            queues.append({"queueId": qid, "offset": offsets[qid], "maxOffset": max_off,
                           "lag": lag})
        entry = groups.setdefault(group, {"group": group, "lag": 0, "topics": []})
        entry["topics"].append({"topic": topic, "queues": queues,
                                "lag": sum(q["lag"] or 0 for q in queues)})
        entry["lag"] += entry["topics"][-1]["lag"]
    for group in store.subscription_groups.subscription_group_table:
        groups.setdefault(group, {"group": group, "lag": 0, "topics": []})
    cp = store.checkpoint
    lock_file, holder = store.fs.lock_holder(os.path.join(root, "lock"))
    try:
        disk = store.fs.disk_usage_ratio(root)
    except OSError:
        disk = None
    return {
        "storeDir": root,
        "commitlog": {"minOffset": store.get_min_phy_offset(),
                      "maxOffset": store.get_max_phy_offset()},
        "files": _files_per_kind(store),
        "strayFiles": store.stray_files(),
        "checkpoint": {name: {"ms": value, "utc": _ms_to_iso(value)} for name, value in (
            ("physicMsgTimestamp", cp.physic_msg_timestamp),
            ("logicsMsgTimestamp", cp.logics_msg_timestamp),
            ("indexMsgTimestamp", cp.index_msg_timestamp))},
        "abortFile": store.fs.exists(os.path.join(root, "abort")),
        "lockFile": lock_file,
        "lockedByPid": holder,
        "diskUsedRatio": disk,
        # What store_size_budget counts: allocated bytes of CommitLog, queue and index files.
        "storeSize": {"bytes": used, "budget": budget or None,
                      "budgetUsedRatio": used / budget if budget else None},
        "topics": topics,
        "groups": [groups[g] for g in sorted(groups)],
    }


def _print_stat(st, out):
    w = out.write
    w(f"store      {st['storeDir']}\n")
    cl = st["commitlog"]
    w(f"commitlog  offsets {cl['minOffset']} .. {cl['maxOffset']}\n")
    state = "present (running, or not shut down cleanly)" if st["abortFile"] else "absent"
    holder = st["lockedByPid"]
    lock = ("absent" if not st["lockFile"] else
            "present, not held" if holder == 0 else
            f"present, held by pid {holder}" if holder else "present")
    w(f"abort      {state}\nlock       {lock}\n")
    disk = st["diskUsedRatio"]
    w(f"disk       {'unknown' if disk is None else f'{disk:.1%} used'}\n")
    size = st["storeSize"]
    if size["budget"]:
        w(f"budget     {size['bytes']:,} of {size['budget']:,} bytes used "
          f"({size['budgetUsedRatio']:.1%}; CommitLog, queues and index, allocated)\n")
    else:
        w(f"size       {size['bytes']:,} bytes (CommitLog, queues and index, allocated); "
          f"no budget given (--budget)\n")
    w("files\n")
    for kind, f in st["files"].items():
        w(f"  {kind:<13}{f['files']:>7} files {f['bytes']:>15,} bytes "
          f"{f['allocatedBytes']:>15,} allocated\n")
    for rel in st["strayFiles"]:
        w(f"  ignored      {rel} (not a store file name)\n")
    w("checkpoint\n")
    for name, v in st["checkpoint"].items():
        w(f"  {name:<22}{v['ms']:>20}  {v['utc'] or '-'}\n")
    w("topics\n")
    for t in st["topics"]:
        cfg = t["config"]
        extra = (f"  (read {cfg['readQueueNums']}, write {cfg['writeQueueNums']}, "
                 f"perm {cfg['perm']})" if cfg else "")
        w(f"  {t['topic']}{extra}\n")
        for q in t["queues"]:
            w(f"    queue {q['queueId']:<4} min {q['minOffset']:<10} max {q['maxOffset']}\n")
    w("groups\n")
    for g in st["groups"]:
        w(f"  {g['group']}  lag {g['lag']}\n")
        for t in g["topics"]:
            for q in t["queues"]:
                w(f"    {t['topic']} queue {q['queueId']:<4} offset {q['offset']:<10} "
                  f"max {q['maxOffset']}  lag {q['lag']}\n")


def _stat(args):
    from .store import MessageStore
    if args.budget is not None and args.budget < 0:
        raise UsageError(f"--budget is {args.budget}; it must be at least 0 (0: none)")
    store = MessageStore.open_read_only(args.store_dir, kernels=args.backend)
    try:
        st = store_stat(store, args.budget)
    finally:
        store.shutdown()
    if args.json:
        json.dump(st, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_stat(st, sys.stdout)
    return 0


def _delete_topic(args):
    """`delete-topic STORE TOPIC`: opens the store for writing (taking its lock, so never
    while another process has it open), deletes the topic as MessageStore.delete_topic does,
    and shuts down cleanly. Exit 1 when the topic had nothing to delete."""
    from . import repair
    from .store import MessageStore
    import os
    from .fs import DEFAULT as fs
    # Said first and alone: reading the store to size its files can warn about it, and a
    # store in use is the whole answer (load() takes the lock itself, which decides a race).
    _, holder = fs.lock_holder(os.path.join(args.store_dir, "lock"))
    if holder:
        raise StoreLockedError(f"{args.store_dir} is in use: process {holder} holds its lock; "
                               "delete the topic from that process, or stop it first")
    geometry = {k: v for k, v in (("max_hash_slot_num", args.max_hash_slot_num),
                                  ("max_index_num", args.max_index_num)) if v is not None}
    store = MessageStore(args.store_dir, repair._writable_config(args.store_dir, **geometry),
                         kernels=args.backend)
    store.load()
    try:
        store.start()
        deleted = store.delete_topic(args.topic)
    finally:
        store.shutdown()
    if not deleted:
        print(f"rocketstore delete-topic: topic {args.topic} has no queue, config or consumer "
              f"offset in {args.store_dir}; nothing deleted", file=sys.stderr)
        return 1
    print(f"deleted topic {args.topic}: its queues, config and consumer offsets; its records "
          f"stay in the CommitLog until they expire")
    return 0


def _query(args):
    """`query key|id|offset|time`: JSON lines as `dump` prints them; exit 1 when nothing is
    found, 2 on a bad argument or store."""
    from .config import StoreConfig
    from .message import decode_msg_id
    from .mapped_file_queue import is_index_name, split_segment_names
    from .store import MessageStore
    from . import query
    if args.what == "id":
        try:
            decode_msg_id(args.msg_id)
        except ValueError:
            raise UsageError(f"{args.msg_id!r} is not an offset msgId (32 or 56 hex "
                             f"digits)") from None
    explicit = args.max_hash_slot_num is not None or args.max_index_num is not None
    defaults = StoreConfig()
    slots = args.max_hash_slot_num or defaults.max_hash_slot_num
    entries = args.max_index_num or defaults.max_index_num
    config = StoreConfig(store_path_root_dir=args.store_dir, max_hash_slot_num=slots,
                         max_index_num=entries)
    store = MessageStore.open_read_only(args.store_dir, config=config, kernels=args.backend)
    try:
        if args.what == "key":
            got = (store.config.max_hash_slot_num, store.config.max_index_num)
            if explicit and got != (slots, entries):
                raise UsageError(f"the index files do not have {slots} hash slots and "
                                 f"{entries} entries")
            files = store._indexer.index_file_list
            if not files and split_segment_names(store.fs, store._indexer.store_path, None,
                                                 is_index_name)[0]:
                raise StoreError("cannot tell the index files' hash slot and entry numbers; "
                                 "pass --max-hash-slot-num and --max-index-num")
            messages = store.query_message(args.topic, args.key, args.max, args.begin,
                                           args.end).messages
            what = f"key {args.key!r} in topic {args.topic!r}"
        elif args.what == "id":
            m = store.view_message_by_id(args.msg_id)
            messages = [m] if m is not None else []
            what = f"msgId {args.msg_id}"
        elif args.what == "offset":
            m = query.message_at(store, args.phy_offset)
            messages = [m] if m is not None else []
            what = f"commit-log offset {args.phy_offset}"
        else:
            if args.queue not in store.consume_queue_table.get(args.topic, {}):
                return _not_found(f"queue {args.queue} in topic {args.topic!r}")
            offset = store.get_offset_in_queue_by_time(args.topic, args.queue, args.timestamp)
            json.dump({"topic": args.topic, "queueId": args.queue, "timestamp": args.timestamp,
                       "queueOffset": offset}, sys.stdout, separators=(",", ":"))
            sys.stdout.write("\n")
            return 0
        for m in messages:
            sys.stdout.write(json.dumps(m.to_dict(_cq_tags_code(store, m)),
                                        separators=(",", ":")))
            sys.stdout.write("\n")
    finally:
        store.shutdown()
    if not messages:
        return _not_found(f"message with {what}")
    return 0


def _not_found(what):
    print(f"rocketstore query: no {what}", file=sys.stderr)
    return 1


# The least value of each `rocketstore bench` count: none may be negative, and a run needs a
# topic, a queue, a producer thread and a batch of at least one message.
_BENCH_MINIMUM = {"messages": 0, "size": 0, "topics": 1, "queues": 1, "batch": 1, "threads": 1,
                  "queries": 0, "file_size": 0}


def check_counts(args, minimum, body_size_option):
    """Refuse counts a run cannot use before it builds or opens anything (`minimum`: option
    dest -> least value; `body_size_option`: the dest of a body size, capped at
    max_message_size): they used to end in ZeroDivisionError, a silent empty run, or
    MESSAGE_ILLEGAL from every put."""
    from .config import StoreConfig
    for name, least in minimum.items():
        value = getattr(args, name)
        if value < least:
            raise UsageError(f"--{name.replace('_', '-')} is {value}; it must be at least {least}")
    cap = StoreConfig().max_message_size
    size = getattr(args, body_size_option)
    if size > cap:
        raise UsageError(f"--{body_size_option.replace('_', '-')} is {size}; a body may be at "
                         f"most {cap} bytes (max_message_size)")


def _bench(args):
    from .bench_job import run_bench
    check_counts(args, _BENCH_MINIMUM, "size")
    # Building the messages comes before the first progress bar and takes a while.
    print(f"rocketstore bench: building {args.messages:,} messages of {args.size} bytes",
          file=sys.stderr, flush=True)
    return run_bench(args)


# Where a user reaches for json.load: the config files stay byte for byte as a broker writes
# them, so a broker can read a store we wrote.
CONFIG_JSON_NOTE = (
    "config/*.json are written byte for byte as a RocketMQ 4.9 broker writes them: fastjson's "
    "dialect, where consumerOffset.json has bare integer keys ({0:1,1:5}) that json.load "
    "rejects. `rocketstore stat --json` prints the same topics, groups and offsets as "
    "standard JSON.")


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


def build_parser():
    p = argparse.ArgumentParser(
        prog="rocketstore", epilog=CONFIG_JSON_NOTE,
        description="An embeddable Apache RocketMQ message store: benchmark it, or inspect a "
                    "store directory written by rocketstore or by a RocketMQ broker.")
    p.add_argument("--debug", action="store_true",
                   help="show tracebacks and debug logging (accepted anywhere on the line)")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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
    b.add_argument("--flush", choices=["async", "sync"], default="async",
                   help="ASYNC_FLUSH or SYNC_FLUSH (group commit)")
    b.add_argument("--threads", type=int, default=1, help="producer threads")
    b.add_argument("--queries", type=int, default=10_000, help="random key lookups")
    b.add_argument("--file-size", type=int, default=0,
                   help="CommitLog file size in bytes (0: sized to the messages, at most 1 GiB)")
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    b.set_defaults(func=_bench)

    d = sub.add_parser("dump", help="print every message as one JSON object per line",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d.add_argument("store_dir", help="store root (holds commitlog/, consumequeue/)")
    _add_selection(d)
    d.set_defaults(func=_dump)

    e = sub.add_parser("export", help="stream messages out for analysis (read-only)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("store_dir", help="store root")
    e.add_argument("--format", choices=["jsonl", "csv"], default="jsonl", help="output format")
    e.add_argument("--body", choices=["text", "base64"], default="text",
                   help="how bodies are written")
    _add_selection(e)
    e.set_defaults(func=_export)

    v = sub.add_parser("verify", help="check every record, consume-queue unit, index entry, "
                                      "the checkpoint and config files (read-only); exit 1 on "
                                      "problems")
    v.add_argument("store_dir", help="store root")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(func=_verify)

    index_opts = argparse.ArgumentParser(add_help=False)
    index_opts.add_argument("--max-hash-slot-num", type=int, default=None,
                            help="hash slots per index file (default: inferred from the "
                                 "files, trying 5000000 first)")
    index_opts.add_argument("--max-index-num", type=int, default=None,
                            help="entries per index file (default: inferred, trying 20000000)")
    r = sub.add_parser("recover", parents=[index_opts],
                       help="run abnormal recovery offline: truncate a damaged tail, "
                            "re-dispatch what the queues miss")
    r.add_argument("store_dir", help="store root")
    r.add_argument("--dry-run", action="store_true",
                   help="only show what would be truncated and re-dispatched")
    r.add_argument("--json", action="store_true", help="print the plan or report as JSON")
    r.set_defaults(func=_recover)

    for name, what in (("rebuild-cq", "ConsumeQueues"), ("rebuild-index", "IndexFiles")):
        rb = sub.add_parser(name, parents=[index_opts],
                            help=f"delete and rebuild every one of the {what} from the "
                                 "CommitLog")
        rb.add_argument("store_dir", help="store root")
        rb.add_argument("--json", action="store_true", help="print the report as JSON")
        if name == "rebuild-cq":
            rb.add_argument("--cq-file-size", type=int, default=None,
                            help="bytes per ConsumeQueue file (default: the existing files', "
                                 "else 6000000)")
        rb.set_defaults(func=_rebuild)

    s = sub.add_parser("stat", help="summarise a store directory (read-only): topics, queues, "
                                    "consumer lag, files, checkpoint, lock and disk",
                       epilog=CONFIG_JSON_NOTE)
    s.add_argument("store_dir", help="store root (holds commitlog/, consumequeue/, config/)")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.add_argument("--budget", type=int, default=None,
                   help="a store_size_budget in bytes to show the store's size against")
    s.set_defaults(func=_stat)

    dt = sub.add_parser("delete-topic", parents=[index_opts],
                        help="delete a topic's queues, config and consumer offsets (takes the "
                             "store's lock: not while it is open elsewhere)")
    dt.add_argument("store_dir", help="store root")
    dt.add_argument("topic")
    dt.set_defaults(func=_delete_topic)

    q = sub.add_parser("query", help="find messages by key, msgId, commit-log offset, or a "
                                     "queue offset by time (read-only)")
    qsub = q.add_subparsers(dest="what", required=True, metavar="KIND")
    qk = qsub.add_parser("key", parents=[index_opts],
                         help="messages whose KEYS or UNIQ_KEY hold KEY, through the index")
    qk.add_argument("store_dir", help="store root")
    qk.add_argument("topic")
    qk.add_argument("key")
    qk.add_argument("--begin", type=int, default=0, help="earliest store time, epoch ms")
    qk.add_argument("--end", type=int, default=None, help="latest store time, epoch ms")
    qk.add_argument("--max", type=int, default=32,
                    help="at most this many (newest kept; capped by maxMsgsNumBatch, 64)")
    qi = qsub.add_parser("id", parents=[index_opts], help="the message an offset msgId names")
    qi.add_argument("store_dir", help="store root")
    qi.add_argument("msg_id")
    qo = qsub.add_parser("offset", parents=[index_opts],
                         help="the message at a commit-log offset")
    qo.add_argument("store_dir", help="store root")
    qo.add_argument("phy_offset", type=int)
    qt = qsub.add_parser("time", parents=[index_opts],
                         help="the queue offset of the message stored nearest TIMESTAMP")
    qt.add_argument("store_dir", help="store root")
    qt.add_argument("topic")
    qt.add_argument("queue", type=int)
    qt.add_argument("timestamp", type=int, help="epoch ms")
    q.set_defaults(func=_query)

    from .serve import add_serve_parser
    add_serve_parser(sub)
    _accept_global_options_anywhere(sub)
    return p


def _accept_global_options_anywhere(sub):
    """`--backend` after the subcommand too (`rocketstore bench --backend pure`, as the README
    writes it). SUPPRESS keeps a subcommand that was not given it from resetting the value
    given before the subcommand."""
    for parser in sub.choices.values():
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        targets = [parser] + [q for a in nested for q in a.choices.values()]
        for target in targets:
            if any("--backend" in a.option_strings for a in target._actions):
                continue
            target.add_argument("--backend", default=argparse.SUPPRESS,
                                choices=["cext", "cffi", "pure"],
                                help="kernel backend (as before the subcommand)")


class UsageError(StoreError):
    """A command line the tools cannot act on (not a store, a bad argument): exit status 2."""


# What a directory must hold to count as a store root: RocketMQ's store root keeps
# commitlog/, consumequeue/, index/, checkpoint, config/, abort and lock side by side, and
# a broker store always has its CommitLog directory or its checkpoint.
STORE_MARKERS = ("commitlog", "checkpoint")


def require_store_dir(path):
    """Refuse a path that is no store root, saying what a store root holds; the tools would
    otherwise read any directory as an empty store and answer OK."""
    import os
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such directory")
    if not os.path.isdir(path):
        raise UsageError(f"{path} is not a directory")
    present = [m for m in STORE_MARKERS if os.path.exists(os.path.join(path, m))]
    if not present:
        raise UsageError(f"{path} is not a store directory: expected commitlog/ or checkpoint "
                         f"in it (a store root holds commitlog/, consumequeue/, index/, "
                         f"checkpoint, config/)")
    cl = os.path.join(path, "commitlog")
    if os.path.lexists(cl) and not os.path.isdir(cl):
        raise UsageError(f"{cl} is not a directory")
    return path


def _extract_debug(argv):
    """`--debug` counts wherever it stands on the line, so it never has to be moved in front
    of the subcommand to get a traceback."""
    rest = [a for a in argv if a != "--debug"]
    return len(rest) != len(argv), rest


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    debug, argv = _extract_debug(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.debug = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if getattr(args, "store_dir", None) is not None and args.command in _STORE_COMMANDS:
            require_store_dir(args.store_dir)
        return args.func(args) or 0
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep the interpreter from
        # complaining about the lost stdout at exit.
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"rocketstore {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:             # noqa: BLE001 - one line, never a traceback
        if debug:
            raise
        # 2: the tools refuse to act on what they were given (a bad argument or option
        # value, no store, a store in use, a link they will not write through, a message or
        # config the store refuses); 1: they acted and failed or found problems.
        usage = isinstance(exc, (UsageError, InvalidArgumentError, ConfigError,
                                 StoreLockedError, UnsafePathError, MessageIllegalError))
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"rocketstore {args.command}: error: {text}", file=sys.stderr)
        return 2 if usage else 1


# Commands whose positional argument must be an existing store root (serve and bench may
# create one).
_STORE_COMMANDS = ("dump", "export", "verify", "recover", "rebuild-cq", "rebuild-index",
                   "stat", "query", "delete-topic")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
