# SPDX-License-Identifier: Apache-2.0
"""Dispatchers: what the reput thread (and abnormal recovery) does with each new record.

A dispatcher gets a batch: `rows`, tuples in format.SCAN_DTYPE field order as commitlog_scan
returned them, and `buf`, the buffer they were scanned from (so topic and properties bytes can
be sliced at row.pos + *_off). A dispatcher that works on whole columns defines
`dispatch_array(arr, buf)` instead and gets the SCAN_DTYPE array itself.
"""
import array
import logging

import numpy as np

from . import format as F
from .errors import CorruptRecordError
from .message import PROPERTY_DELAY, string_to_properties, valid_topic_bytes

log = logging.getLogger(__name__)

# Field positions in a row tuple (rows[i].tolist()), taken from format.SCAN_DTYPE's order
(R_POS, R_PHY, R_QOFF, R_TAGS, R_STORE_TS, R_SIZE, R_QID, R_SYSFLAG, R_BODY_OFF, R_BODY_LEN,
 R_TOPIC_OFF, R_TOPIC_LEN, R_PROPS_OFF, R_PROPS_LEN, R_INFO, R_TOPIC_HASH) = (
    (F.SCAN_DTYPE.names or ()).index(name) for name in (
        "pos", "phy_offset", "queue_offset", "tags_code", "store_timestamp", "size", "queue_id",
        "sys_flag", "body_off", "body_len", "topic_off", "topic_len", "props_off", "props_len",
        "info", "topic_hash"))

_SKIP_CQ = (F.TRANSACTION_PREPARED_TYPE, F.TRANSACTION_ROLLBACK_TYPE)

class Dispatcher:
    def dispatch(self, rows, buf):
        raise NotImplementedError  # pragma: no cover


def dispatch_all(dispatchers, arr, buf):
    """Hand one scanned batch to every dispatcher, converting to tuples at most once."""
    rows = None
    for d in dispatchers:
        by_array = getattr(d, "dispatch_array", None)
        if by_array is not None:
            by_array(arr, buf)
        else:
            if rows is None:
                rows = arr.tolist()
            d.dispatch(rows, buf)


def row_properties(row, buf):
    pos = row[R_POS] + row[R_PROPS_OFF]
    return string_to_properties(bytes(buf[pos:pos + row[R_PROPS_LEN]]).decode("utf-8",
                                                                               "replace"))


def row_topic(row, buf):
    pos = row[R_POS] + row[R_TOPIC_OFF]
    return bytes(buf[pos:pos + row[R_TOPIC_LEN]]).decode("utf-8", "replace")


def _queue_of(find_queue, topic, queue_id, phy_offset):
    """The ConsumeQueue a record goes to (found or made by `find_queue(topic bytes, queue
    id)`), or None for a record whose queue id is negative, which gets no unit. Its topic
    names a directory under consumequeue/, so bytes a put would refuse ("../x", "/x") are
    refused here too, whoever scanned them. So is a negative queue id, which no put or
    broker writes: one bit flipped in a record's queue id (its CRC covers the body only) had
    made a queue named "-2147483647". The record stays readable by key and in the log; only
    its queue cannot be told, and the records around it are dispatched as before."""
    if not valid_topic_bytes(topic):
        raise CorruptRecordError(f"record topic {bytes(topic)!r} is not a valid topic name; "
                                 "not dispatched")
    if queue_id < 0:
        log.error("record at %d names queue %d of %r, which no put writes: damaged; no unit "
                  "written for it", phy_offset, queue_id, bytes(topic))
        return None
    return find_queue(topic, queue_id)


class ConsumeQueueDispatcher(Dispatcher):
    """CommitLogDispatcherBuildConsumeQueue: NOT and COMMIT records get a unit in their queue.

    Its collaborators: `find_queue(topic bytes, queue id)` (the store's queue, made on first
    use), the `deleted_topics` (topic_delete.py), the config's `delay_levels`, the `kernels`,
    and the `checkpoint` whose dispatch times it moves (the store sets it once loaded: the
    file is opened then). `is_slave`: a slave's dispatch moves physicMsgTimestamp too. The
    queues it writes mark themselves dirty (ConsumeQueue.put_unit, or the compiled loop as
    put_unit would)."""

    def __init__(self, find_queue, deleted_topics, delay_levels, kernels, *,
                 checkpoint=None, is_slave=False):
        self._find_queue = find_queue
        self._deleted_topics = deleted_topics
        self._kernels = kernels
        self.checkpoint = checkpoint
        self._is_slave = is_slave
        self._delay_levels = delay_levels
        # The compiled row loop, when the backend has one, and its table of queues by
        # (topic hash, queue id); used by the dispatching thread only.
        self._k_dispatch = getattr(kernels, "cq_dispatch", None)
        self._slots = None
        self.forget_queues()

    @property
    def slots(self):
        """The compiled row loop's CqSlots table (what the cext reput pass appends through),
        or None without the backend's cq_dispatch (or with it set aside)."""
        return self._slots if self._k_dispatch is not None else None

    def forget_queues(self):
        """Drop every queue the compiled loop remembers (a topic was deleted: its queue
        objects are gone from the store, and a row must find the new one). The caller holds
        the reput lock, or no dispatch can run."""
        if self._k_dispatch is not None:
            from .consume_queue import ConsumeQueue
            from .mapped_file import CqMappedFile
            self._slots = self._kernels.CqSlots(CqMappedFile, ConsumeQueue)

    def _deleted(self, row, buf):
        """True for a record of a deleted topic put before its deletion: it stays in the
        CommitLog until it expires, but never gets a unit again (topic_delete.py)."""
        pos = row[R_POS] + row[R_TOPIC_OFF]
        below = self._deleted_topics.offsets_raw.get(bytes(buf[pos:pos + row[R_TOPIC_LEN]]))
        return below is not None and row[R_PHY] < below

    def _schedule_tags_code(self, row, buf):
        """SCHEDULE_TOPIC_XXXX units carry the delivery time (doc/01 §3.7)."""
        props = row_properties(row, buf)
        try:
            level = int(props.get(PROPERTY_DELAY) or 0)
        except ValueError:
            return row[R_TAGS]
        if level <= 0:
            return row[R_TAGS]
        level = min(level, len(self._delay_levels))
        return row[R_STORE_TS] + self._delay_levels[level - 1]

    def dispatch(self, rows, buf):
        find_queue = self._find_queue
        deleted = self._deleted_topics.offsets_raw
        groups = {}
        last_ts = 0
        for row in rows:
            if row[R_SYSFLAG] & F.TRANSACTION_TYPE_MASK in _SKIP_CQ:
                continue
            if deleted and self._deleted(row, buf):
                continue
            pos = row[R_POS] + row[R_TOPIC_OFF]
            cq = _queue_of(find_queue, buf[pos:pos + row[R_TOPIC_LEN]], row[R_QID], row[R_PHY])
            if cq is None:
                continue
            tags = row[R_TAGS]
            if row[R_INFO] & F.SCAN_INFO_SCHEDULE:
                tags = self._schedule_tags_code(row, buf)
            g = groups.get(cq)
            qoff = row[R_QOFF]
            if g is None or g[3] + len(g[0]) != qoff:
                if g is not None:
                    self._flush_group(cq, g)
                groups[cq] = g = (array.array("q"), array.array("i"), array.array("q"), qoff)
            g[0].append(row[R_PHY])
            g[1].append(row[R_SIZE])
            g[2].append(tags)
            last_ts = row[R_STORE_TS]
        for cq, g in groups.items():
            self._flush_group(cq, g)
        if last_ts:
            self.dispatched_until(last_ts)

    def dispatched_until(self, last_ts):
        """The checkpoint's times after units up to store time `last_ts` were written."""
        checkpoint = self.checkpoint
        checkpoint.logics_msg_timestamp = last_ts
        if self._is_slave:
            # A slave appends raw bytes with no store time at hand, so its CQ writer feeds
            # physicMsgTimestamp, as ConsumeQueue#putMessagePositionInfoWrapper does.
            checkpoint.physic_msg_timestamp = last_ts

    def _dispatch_row(self, row, buf):
        """One row by ConsumeQueue.put_unit's rules; returns its queue (cq_dispatch's slow path,
        which then remembers the queue under the row's key), or None for a deleted topic's
        record or one with a negative queue id (the loop then does not remember it)."""
        if self._deleted_topics.offsets_raw and self._deleted(row, buf):
            return None
        pos = row[R_POS] + row[R_TOPIC_OFF]
        cq = _queue_of(self._find_queue, buf[pos:pos + row[R_TOPIC_LEN]], row[R_QID],
                       row[R_PHY])
        if cq is None:
            return None
        tags = row[R_TAGS]
        if row[R_INFO] & F.SCAN_INFO_SCHEDULE:
            tags = self._schedule_tags_code(row, buf)
        cq.put_unit(row[R_PHY], row[R_SIZE], tags, row[R_QOFF])
        return cq

    def dispatch_array(self, arr, buf):
        """The same as dispatch(), by columns. With the backend's cq_dispatch, one compiled
        pass appends the common rows and hands the rest to _dispatch_row: its cost per row does
        not grow with the number of queues a batch touches. Otherwise rows are grouped by
        (topic hash, queue id) with numpy, each group's topic bytes are compared before it is
        trusted (a hash collision falls back to the row-by-row path), and each run of
        consecutive queue offsets becomes one batch kernel call."""
        if self._k_dispatch is not None:
            # The loop marks the queues it wrote dirty (CqSlots.publish); put_unit marks
            # those of the rows it hands back.
            arr = np.ascontiguousarray(arr)
            last_ts = self._k_dispatch(arr, buf, self._slots,
                                       lambda i: self._dispatch_row(arr[i].item(), buf))
            if last_ts:
                self.dispatched_until(last_ts)
            return
        tx = arr["sys_flag"] & F.TRANSACTION_TYPE_MASK
        keep = (tx != F.TRANSACTION_PREPARED_TYPE) & (tx != F.TRANSACTION_ROLLBACK_TYPE)
        if not keep.all():
            arr = arr[keep]
        if not len(arr):
            return
        key = (arr["topic_hash"].astype(np.int64) << 32) | \
            (arr["queue_id"].astype(np.int64) & 0xFFFFFFFF)
        order = np.argsort(key, kind="stable")
        cuts = np.flatnonzero(np.diff(key[order])) + 1
        data = np.frombuffer(buf, dtype=np.uint8)
        try:
            for idx in np.split(order, cuts):
                self._dispatch_group(arr[idx], buf, data)
        finally:
            del data            # no view of the mapping may outlive the call
        self.dispatched_until(int(arr["store_timestamp"][-1]))

    def _dispatch_group(self, g, buf, data):
        tpos = int(g["pos"][0] + g["topic_off"][0])
        tlen = int(g["topic_len"][0])
        topic = bytes(buf[tpos:tpos + tlen])
        if len(g) > 1:
            starts = (g["pos"] + g["topic_off"]).astype(np.int64)
            same = (g["topic_len"] == tlen).all() and (
                data[starts[:, None] + np.arange(tlen)] ==
                np.frombuffer(topic, dtype=np.uint8)).all()
            if not same:                # two topics share a hash: go row by row
                self.dispatch(g.tolist(), buf)
                return
        below = self._deleted_topics.offsets_raw.get(topic)
        if below is not None:
            g = g[g["phy_offset"] >= below]     # a deleted topic's records before deletion
            if not len(g):
                return
        cq = _queue_of(self._find_queue, topic, int(g["queue_id"][0]), int(g["phy_offset"][0]))
        if cq is None:
            return
        tags = np.ascontiguousarray(g["tags_code"])
        schedule = np.flatnonzero(g["info"] & F.SCAN_INFO_SCHEDULE)
        for j in schedule:
            tags[j] = self._schedule_tags_code(g[j].item(), buf)
        offsets = np.ascontiguousarray(g["phy_offset"])
        sizes = np.ascontiguousarray(g["size"])
        qoffs = g["queue_offset"]
        if len(g) == 1:
            cq.put_unit(int(offsets[0]), int(sizes[0]), int(tags[0]), int(qoffs[0]))
            return
        breaks = np.flatnonzero(np.diff(qoffs) != 1) + 1
        for a, b in zip(np.concatenate(([0], breaks)), np.concatenate((breaks, [len(g)]))):
            cq.put_units(offsets[a:b], sizes[a:b], tags[a:b], int(qoffs[a]))

    @staticmethod
    def _flush_group(cq, g):
        offsets, sizes, tags, first = g
        if len(offsets) == 1:
            cq.put_unit(offsets[0], sizes[0], tags[0], first)
        else:
            cq.put_units(offsets, sizes, tags, first)
