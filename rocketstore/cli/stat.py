# SPDX-License-Identifier: Apache-2.0
"""`stat`: a summary of a store directory, read-only: topics, queues, consumer lag, files,
checkpoint, lock, disk and the size budget."""
import sys

from .common import CONFIG_JSON_NOTE, UsageError, print_json


def add_parsers(sub):
    s = sub.add_parser("stat", help="summarise a store directory (read-only): topics, queues, "
                                    "consumer lag, files, checkpoint, lock and disk",
                       epilog=CONFIG_JSON_NOTE)
    s.add_argument("store_dir", help="store root (holds commitlog/, consumequeue/, config/)")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.add_argument("--budget", type=int, default=None,
                   help="a store_size_budget in bytes to show the store's size against")
    s.set_defaults(func=_stat)


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
    from ..store import MessageStore
    if args.budget is not None and args.budget < 0:
        raise UsageError(f"--budget is {args.budget}; it must be at least 0 (0: none)")
    store = MessageStore.open_read_only(args.store_dir, kernels=args.backend)
    try:
        st = store_stat(store, args.budget)
    finally:
        store.shutdown()
    if args.json:
        print_json(st)
    else:
        _print_stat(st, sys.stdout)
    return 0
