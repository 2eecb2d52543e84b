# SPDX-License-Identifier: Apache-2.0
"""The store a real RocketMQ 4.9.8 broker wrote (tests/data/rmq-4.9.8-basic) and its own account
of every message: shared by the conformance, index and CLI tests (a helper, not a test module)."""
import json
import os

from rocketstore import StoreConfig

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
BASIC = os.path.join(DATA, "rmq-4.9.8-basic")
# The driver put properties into the message's HashMap in this order (README of the data set).
INSERTION_ORDER = ["TAGS", "KEYS", "orderId", "region", "priority", "traceOn", "UNIQ_KEY"]


def broker_messages():
    with open(os.path.join(BASIC, "messages.jsonl")) as f:
        return [json.loads(line) for line in f]


def broker_config(**kw):
    return StoreConfig(mapped_file_size_commit_log=32768, mapped_file_size_consume_queue=1000,
                       max_index_num=500, max_hash_slot_num=64, store_host=("10.0.0.1", 10911),
                       **kw)


def tree_bytes(root, sub):
    out = {}
    base = os.path.join(root, sub)
    for d, _, files in os.walk(base):
        for name in files:
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, base)] = f.read()
    return out
