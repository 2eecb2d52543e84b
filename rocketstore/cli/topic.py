# SPDX-License-Identifier: Apache-2.0
"""`delete-topic`: delete a topic's queues, config and consumer offsets from a store that no
process has open."""
import sys

from ..errors import StoreLockedError
from .common import index_options


def add_parsers(sub):
    dt = sub.add_parser("delete-topic", parents=[index_options()],
                        help="delete a topic's queues, config and consumer offsets (takes the "
                             "store's lock: not while it is open elsewhere)")
    dt.add_argument("store_dir", help="store root")
    dt.add_argument("topic")
    dt.set_defaults(func=_delete_topic)


def _delete_topic(args):
    """`delete-topic STORE TOPIC`: opens the store for writing (taking its lock, so never
    while another process has it open), deletes the topic as MessageStore.delete_topic does,
    and shuts down cleanly. Exit 1 when the topic had nothing to delete."""
    from .. import repair
    from ..store import MessageStore
    import os
    from ..fs import DEFAULT as fs
    # Said first and alone: reading the store to size its files can warn about it, and a
    # store in use is the whole answer (load() takes the lock itself, which decides a race).
    _, holder = fs.lock_holder(os.path.join(args.store_dir, "lock"))
    if holder:
        raise StoreLockedError(f"{args.store_dir} is in use: process {holder} holds its lock; "
                               "delete the topic from that process, or stop it first")
    geometry = {k: v for k, v in (("max_hash_slot_num", args.max_hash_slot_num),
                                  ("max_index_num", args.max_index_num)) if v is not None}
    store = MessageStore(args.store_dir, repair.writable_config(args.store_dir, **geometry),
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
