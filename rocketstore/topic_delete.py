# SPDX-License-Identifier: Apache-2.0
"""Topic deletion: what a deleted topic leaves behind, and how a store that crashed in the
middle of one comes back.

A deleted topic's records stay in the CommitLog until they expire (as 5.x deleteTopics
leaves them), so anything that dispatches them again (abnormal recovery, a reput that starts
below them) would recreate its queues with their old offsets, and a later put to the topic,
which starts a fresh queue at offset 0, would then land behind them. `config/deletedTopics.json`
(ours; a broker ignores it) keeps, per deleted topic, the CommitLog offset at which it was
deleted: records of the topic below it are never dispatched again, and a queue directory of
the topic whose units point below it is a leftover of the deletion, never served.

The entry is written (durably) before anything is removed, and carries `pending` until the
topic config, consumer offsets and queue files are gone: a store killed at any point of a
deletion opens with the topic either whole (killed before the entry) or deleted (the open
finishes what the entry says). Queue directories are renamed out of the way
(`consumequeue/<topic>.deleted`, a name no topic can have) in one step before their files
are removed, and an open removes any such directory it finds.
"""
import logging
import os

from .codec.fastjson import bean, parse_fastjson, to_fastjson
from .config_manager import ConfigManager, _object
from .format import CQ_STORE_UNIT_SIZE, CQ_UNIT

log = logging.getLogger(__name__)

DELETED_SUFFIX = ".deleted"

# TopicValidator's system topics (4.9.8 and 5.x), which clean_unused_topic never removes.
SYSTEM_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "CHECKPOINT_TOPIC"})
SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "RMQ_SYS_")
LMQ_PREFIX = "%LMQ%"                      # MixAll.isLmq: light message queues are kept too


def is_system_topic(topic):
    """TopicValidator#isSystemTopic (plus the RMQ_SYS_ names), or an LMQ topic."""
    return (topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIXES)
            or topic.startswith(LMQ_PREFIX))


class DeletedTopicManager(ConfigManager):
    """`config/deletedTopics.json`: topic -> {"offset": CommitLog offset at deletion,
    "pending": the deletion is not finished}. Persisted on every change (crash-safe as every
    config file: tmp + fsync, .bak, rename, directory fsync)."""

    file_name = "deletedTopics.json"

    def __init__(self, root, fs, clock=None, read_only=False):
        super().__init__(root, fs, clock, read_only)
        self.table = {}
        # {topic as UTF-8 bytes: offset}, rebound with the table: what the dispatchers look
        # each record's topic up in.
        self.offsets_raw = {}

    def _set_table(self, table):
        self.table = table
        self.offsets_raw = {t.encode("utf-8"): e["offset"] for t, e in table.items()}

    def encode(self):
        return to_fastjson(bean(deletedTopicTable={
            t: bean(offset=e["offset"], pending=e["pending"]) for t, e in self.table.items()}))

    def decode(self, text):
        obj = _object(parse_fastjson(text), self.file_name)
        table = {}
        for topic, raw in _object(obj.get("deletedTopicTable"), "deletedTopicTable").items():
            raw = _object(raw, topic)
            table[str(topic)] = {"offset": int(raw["offset"]),
                                 "pending": bool(raw.get("pending", False))}
        self._set_table(table)

    def mark(self, topic, offset, pending):
        with self._change():
            old = self.table.get(topic)
            self._set_table({**self.table, topic: {
                "offset": max(offset, old["offset"] if old else offset), "pending": pending}})
            self._dirty = True
        self.persist()

    def pending(self):
        return [t for t, e in self.table.items() if e["pending"]]

    def prune(self, min_offset):
        """Drop entries every record below whose offset has expired: nothing of the topic
        from before its deletion remains to be dispatched again. True when any went."""
        with self._change():
            keep = {t: e for t, e in self.table.items()
                    if e["pending"] or e["offset"] > min_offset}
            if len(keep) == len(self.table):
                return False
            self._set_table(keep)
            self._dirty = True
        self.persist()
        return True


def first_record_offset(cq):
    """The CommitLog offset the queue's newest file starts with (the last file holding a
    unit), or None when the queue holds no unit. Only written extents are read (a hole read
    through the mapping would be allocated)."""
    for f in reversed(cq.mfq.files):
        try:
            if f.data_end() < CQ_STORE_UNIT_SIZE:
                continue
            offset, size, _ = CQ_UNIT.struct.unpack_from(f.mm, 0)
        except ValueError:          # unmapped meanwhile
            return None
        if size > 0 and offset >= 0:
            return offset
    return None


def is_leftover(cq, deleted_at):
    """True when the queue is what a deletion at CommitLog offset `deleted_at` removed: its
    units point below it (a queue the topic got after its deletion starts at or past it).
    An empty queue is a leftover too: it holds nothing to lose."""
    first = first_record_offset(cq)
    return first is None or first < deleted_at


def remove_tree(fs, path):
    """Remove a directory of queue directories and segment files (through the FileSystem, so
    a fault-injecting one sees every step)."""
    if not fs.is_dir(path):
        fs.remove(path)
        return
    for name in fs.list_dir(path):
        remove_tree(fs, os.path.join(path, name))
    fs.remove_dir_if_empty(path)


def deleted_dir(base, topic):
    return os.path.join(base, topic + DELETED_SUFFIX)
