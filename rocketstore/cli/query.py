# SPDX-License-Identifier: Apache-2.0
"""`query key|id|offset|time`: find messages through the index, a msgId, a commit-log offset,
or a queue offset by store time."""
import argparse
import json
import sys

from ..errors import StoreError
from .common import UsageError, index_options
from .dump import cq_tags_code


def add_parsers(sub):
    q = sub.add_parser("query", help="find messages by key, msgId, commit-log offset, or a "
                                     "queue offset by time (read-only)")
    qsub = q.add_subparsers(dest="what", required=True, metavar="KIND")
    # What dump writes of each message found: bodies decompressed unless asked otherwise.
    body_opts = argparse.ArgumentParser(add_help=False)
    body_opts.add_argument("--stored-body", action="store_true",
                           help="write compressed bodies as stored instead of decompressing "
                                "them")
    qk = qsub.add_parser("key", parents=[index_options(), body_opts],
                         help="messages whose KEYS or UNIQ_KEY hold KEY, through the index")
    qk.add_argument("store_dir", help="store root")
    qk.add_argument("topic")
    qk.add_argument("key")
    qk.add_argument("--begin", type=int, default=0, help="earliest store time, epoch ms")
    qk.add_argument("--end", type=int, default=None, help="latest store time, epoch ms")
    qk.add_argument("--max", type=int, default=32,
                    help="at most this many (newest kept; capped by maxMsgsNumBatch, 64)")
    qi = qsub.add_parser("id", parents=[index_options(), body_opts],
                         help="the message an offset msgId names")
    qi.add_argument("store_dir", help="store root")
    qi.add_argument("msg_id")
    qo = qsub.add_parser("offset", parents=[index_options(), body_opts],
                         help="the message at a commit-log offset")
    qo.add_argument("store_dir", help="store root")
    qo.add_argument("phy_offset", type=int)
    qt = qsub.add_parser("time", parents=[index_options()],
                         help="the queue offset of the message stored nearest TIMESTAMP")
    qt.add_argument("store_dir", help="store root")
    qt.add_argument("topic")
    qt.add_argument("queue", type=int)
    qt.add_argument("timestamp", type=int, help="epoch ms")
    q.set_defaults(func=_query)


def _query(args):
    """`query key|id|offset|time`: JSON lines as `dump` prints them; exit 1 when nothing is
    found, 2 on a bad argument or store."""
    from ..config import StoreConfig
    from ..message import decode_msg_id
    from ..mapped_file_queue import is_index_name, split_segment_names
    from ..store import MessageStore
    from .. import query
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
            files = store.index_service.index_file_list
            if not files and split_segment_names(store.fs, store.index_service.store_path, None,
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
            m = query.message_at(store.commitlog, store.kernels, args.phy_offset)
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
            sys.stdout.write(json.dumps(m.to_dict(cq_tags_code(store, m),
                                                  decompress=not args.stored_body),
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
