# SPDX-License-Identifier: Apache-2.0
"""The read path of MessageStore, as plain functions over a loaded store: pulling from a
ConsumeQueue (getMessage) and walking the CommitLog in order."""
import logging
import struct

import numpy as np

from . import format as F
from .errors import CorruptRecordError, StoreClosedError
from .message import MessageExt
from .status import GetMessageResult, GetMessageStatus as G

log = logging.getLogger(__name__)
_UNIT = struct.Struct(">qiq")


# The bounds of one in-process get_message (a broker caps a remote pull at 32 messages or
# 256 KiB instead): max_msg_nums at most MAX_MSG_NUMS, and no message is added once the
# records collected reach MAX_BYTES (the first one always comes, whatever its size).
MAX_MSG_NUMS = 65_536
MAX_BYTES = 64 << 20


def get_message(store, group, topic, queue_id, offset, max_msg_nums=32, message_filter=None):
    """DefaultMessageStore#getMessage over a loaded store (spec 01 §6): statuses and next
    offsets as RocketMQ's table, units scanned from the ConsumeQueue, records decoded. The
    scan goes on into the queue's next file while fewer than `max_msg_nums` were found."""
    if not store._loaded:
        raise StoreClosedError("the store is not loaded")
    max_py = store.commitlog.max_offset
    cq = store.find_consume_queue(topic, queue_id)
    min_off = cq.min_offset_in_queue
    max_off = cq.max_offset_in_queue
    corr = store._next_offset_correction
    if max_off == 0:
        return GetMessageResult(G.NO_MESSAGE_IN_QUEUE, corr(offset, 0), min_off, max_off)
    if offset < min_off:
        return GetMessageResult(G.OFFSET_TOO_SMALL, corr(offset, min_off), min_off, max_off)
    if offset == max_off:
        return GetMessageResult(G.OFFSET_OVERFLOW_ONE, offset, min_off, max_off)
    if offset > max_off:
        return GetMessageResult(G.OFFSET_OVERFLOW_BADLY, corr(offset, max_off), min_off,
                                max_off)
    units, _ = cq.read_units(offset)
    if units is None:
        return GetMessageResult(G.OFFSET_FOUND_NULL, corr(offset, cq.roll_next_file(offset)),
                                min_off, max_off)
    status = G.NO_MATCHED_MESSAGE
    messages = []
    next_phy_file_start = -1
    max_phy_seen = 0
    nbytes = 0
    mem_limit = store._mem_limit
    commitlog = store.commitlog
    decode = MessageExt.decode
    append = messages.append
    mf = None
    mf_start = mf_end = 0
    # Units looked at, filtered out or not: the broker's bound on one call's scan.
    scan_limit = max(16000, max_msg_nums * F.CQ_STORE_UNIT_SIZE) // F.CQ_STORE_UNIT_SIZE
    scanned = 0
    full = False
    while True:
        take = min(len(units) // F.CQ_STORE_UNIT_SIZE, scan_limit - scanned)
        for phy, size, tags in _UNIT.iter_unpack(units[:take * F.CQ_STORE_UNIT_SIZE]):
            if phy < next_phy_file_start:
                scanned += 1
                continue
            count = len(messages)
            if count and (count >= max_msg_nums or nbytes + size > MAX_BYTES):
                full = True
                break
            scanned += 1
            if message_filter is not None and not message_filter(tags):
                continue
            # Units of one queue mostly point into the same CommitLog file: reuse it.
            if not (mf_start <= phy and phy + size <= mf_end):
                mf = commitlog.mfq.find_by_offset(phy)
                if mf is not None:
                    mf_start = mf.file_from_offset
                    mf_end = mf_start + mf.read_position
            rec = None
            if mf is not None and mf_start <= phy and phy + size <= mf_end:
                try:
                    rec = mf.mm[phy - mf_start:phy - mf_start + size]
                except ValueError:            # unmapped by cleaning meanwhile
                    rec = None
            if rec is None:
                if not messages:
                    status = G.MESSAGE_WAS_REMOVING
                next_phy_file_start = commitlog.roll_next_file(phy)
                continue
            try:
                m = decode(rec)
            except CorruptRecordError as exc:
                m = None
                log.warning("%s-%d unit at %d: %s", topic, queue_id, offset + scanned - 1, exc)
            if m is None or m.commit_log_offset != phy:
                continue                      # a damaged unit: skip it, as a filter would
            append(m)
            nbytes += size
            max_phy_seen = phy
            status = G.FOUND
        if full or len(messages) >= max_msg_nums or scanned >= scan_limit \
                or offset + scanned >= max_off:
            break
        units, _ = cq.read_units(offset + scanned)
        if units is None:
            break
    next_begin = offset + scanned
    suggest = max_py - max_phy_seen > mem_limit if messages else False
    return GetMessageResult(status, next_begin, min_off, max_off, messages, suggest)


def iter_messages(store, from_offset=None):
    """Every record in commit-log order, decoded (blank records skipped)."""
    rows = np.empty(1024, dtype=F.SCAN_DTYPE)
    offset = store.commitlog.min_offset if from_offset is None else from_offset
    end = store.commitlog.max_offset
    while 0 <= offset < end:
        mf = store.commitlog.mfq.find_by_offset(offset)
        if mf is None:
            break
        start = offset - mf.file_from_offset
        n, stop, reason, _ = store.kernels.commitlog_scan(mf.mm, start, mf.read_position,
                                                         False, rows)
        for row in rows[:n].tolist():
            pos, size = row[0], row[7]
            yield MessageExt.decode(mf.mm[pos:pos + size])
        offset = mf.file_from_offset + stop
        if reason == F.SCAN_BLANK or (reason == F.SCAN_END
                                      and stop >= mf.read_position >= mf.file_size):
            offset = store.commitlog.roll_next_file(offset)
        elif reason != F.SCAN_END:
            break
