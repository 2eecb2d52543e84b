# SPDX-License-Identifier: Apache-2.0
"""Message queries of MessageStore, as plain functions over the parts of a loaded store that
they read (the CommitLog, the index, a ConsumeQueue, the kernels), handed in by MessageStore:
by key and unique key through the index (doc/02 §2.6), by msgId, and a queue offset by time
(doc/02 §1.9).
"""
import logging

from .errors import InvalidArgumentError
from .format import CQ_UNIT, CQ_STORE_UNIT_SIZE as UNIT
from .message import PROPERTY_UNIQ_KEY, MessageExt, decode_msg_id
from .read_path import PyReadPath
from .status import QueryMessageResult

log = logging.getLogger(__name__)

LONG_MAX = (1 << 63) - 1
LONG_MIN = -(1 << 63)
_UNIT = CQ_UNIT.struct


def query_message(commitlog, index_service, kernels, read_path, cap, topic, key, max_num=32,
                  begin=0, end=None):
    """DefaultMessageStore#queryMessage: the newest messages (at most max_num, capped by
    max_msgs_num_batch) that carry the key under the topic (its UNIQ_KEY, or a piece of its
    KEYS: the client's filter, which a broker leaves to the client) and were stored in
    [begin, end], in ascending offset order.

    The index matches hashes, and times only to the second, so every hit is judged against
    its record: a whole, valid record at that offset, stored in the window, under the topic,
    with the key. The backend's index_query does the hashing, the chain walks (newest file
    first, each chain newest first), the record checks and key matches in one call, walking
    on past hits it throws out until enough are kept or the chains end: the broker's three
    rounds could come back empty while matching messages sat behind a second's worth of
    misses. `cap` is the store's max_msgs_num_batch; `read_path` its ReadPath."""
    # A compiled ReadPath builds each hit from the record check's row, as get_message builds
    # its messages, instead of parsing the record a second time (MessageExt.decode).
    rp = read_path
    index_service.settle_for_reader()     # a batch put's keys, from the index worker
    r = _new(QueryMessageResult)
    (r.messages, r.buffer_total_size, r.index_last_update_timestamp,
     r.index_last_update_phy_offset) = kernels.index_query(
        index_service.index_file_list, commitlog.mfq, topic, key,
        max_num if max_num < cap else cap, begin, LONG_MAX if end is None else end,
        _decode if type(rp) is PyReadPath else rp)
    return r


_decode = MessageExt.decode
_new = object.__new__                     # the result's four fields are set at once


def query_message_by_unique_key(commitlog, index_service, kernels, read_path, cap, topic,
                                uniq_key):
    """The message whose UNIQ_KEY (the client-side msgId) is `uniq_key`, or None; the oldest
    when a retry stored it more than once. The parts as query_message takes them."""
    for msg in query_message(commitlog, index_service, kernels, read_path, cap, topic,
                             uniq_key).messages:
        if msg.properties.get(PROPERTY_UNIQ_KEY) == uniq_key:
            return msg
    return None


def message_at(commitlog, kernels, phy_offset):
    """The record that starts at CommitLog `phy_offset`, decoded, or None: what a msgId or an
    offset names. The record must pass the scan's record check and say it lies at that
    offset, so a stale or damaged offset answers None, never a half-record."""
    mf = commitlog.mfq.find_by_offset(phy_offset)
    if mf is None:
        return None
    rel = phy_offset - mf.file_from_offset
    limit = mf.read_position
    try:
        view = memoryview(mf.mm)
    except ValueError:                    # unmapped by cleaning meanwhile
        return None
    with view:
        limit = min(limit, len(view))
        if rel < 0 or rel >= limit:
            return None
        size = kernels.index_match(view, limit, rel, phy_offset, None, None, LONG_MIN,
                                         LONG_MAX)
        rec = bytes(view[rel:rel + size]) if size else None
    return MessageExt.decode(rec) if rec is not None else None


def view_message_by_id(commitlog, kernels, msg_id):
    """The message an offset msgId (store host + commit-log offset) names, or None. A msgId
    that is not 16 or 28 hex bytes raises InvalidArgumentError (a ValueError)."""
    try:
        _, offset = decode_msg_id(msg_id)
    except ValueError:
        raise InvalidArgumentError(
            f"{msg_id!r} is not an offset msgId (32 or 56 hex digits)") from None
    return message_at(commitlog, kernels, offset)


def _java_div(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _bisect_units(mm, low, high, timestamp, min_phy, pickup):
    """ConsumeQueue's binary search over the units at byte positions [low, high] of one file
    (4.9.x and 5.x share it): (target, left, left_value, right, right_value), target the
    position of a unit stored exactly at `timestamp` or -1, left/right the nearest positions
    searched below/above it with their store times (-1 when none); None when a unit's record
    has no store time. Units pointing below the CommitLog's minimum count as left."""
    target = left = right = -1
    left_value = right_value = -1
    while high >= low:
        mid = (low + high) // (2 * UNIT) * UNIT
        phy, size, _ = _UNIT.unpack_from(mm, mid)
        if phy < min_phy:
            low = mid + UNIT
            left = mid
            continue
        store_time = pickup(phy, size)
        if store_time < 0:
            return None
        if store_time == timestamp:
            target = mid
            break
        if store_time > timestamp:
            high = mid - UNIT
            right, right_value = mid, store_time
        else:
            low = mid + UNIT
            left, left_value = mid, store_time
    return target, left, left_value, right, right_value


def get_offset_in_queue_by_time(cq, commitlog, fs, timestamp):
    """ConsumeQueue#getOffsetInQueueByTime as 4.9.x does it (doc/02 §1.9).

    The file is the first whose last-modified time is >= timestamp, else the last: the
    broker's own rule, so a store whose files were copied (new mtimes) answers from its first
    file, as a broker would. Within the file: binary search on the records' store
    timestamps, the nearer neighbour when there is no exact match. 0 without a queue (`cq`
    None); `fs` the store's FileSystem, which knows the files' mtimes."""
    if cq is None:
        return 0
    files = list(cq.mfq.files)
    if not files:
        return 0
    mf = files[-1]
    for f in files:
        if fs.mtime_ms(f.path) >= timestamp:
            mf = f
            break
    if not mf.hold():
        return 0
    try:
        base = mf.file_from_offset
        low = max(0, cq.min_logic_offset - base)
        high = mf.read_position - UNIT
        pickup = commitlog.pickup_store_timestamp
        found = _bisect_units(mf.mm, low, high, timestamp, commitlog.min_offset, pickup)
        if found is None:
            return 0
        target, left, left_value, right, right_value = found
        if target != -1:
            offset = target
        elif left_value == -1:
            offset = right
        elif right_value == -1:
            offset = left
        else:
            offset = right if abs(timestamp - left_value) > abs(timestamp - right_value) \
                else left
        # Java's int division truncates toward zero: offset -1 in file 0 gives 0.
        return _java_div(base + offset, UNIT)
    finally:
        mf.release()


BOUNDARIES = ("lower", "upper")


def get_offset_in_queue_by_boundary(cq, commitlog, timestamp, boundary):
    """ConsumeQueue#getOffsetInQueueByTime(timestamp, BoundaryType) as 5.x does it: "lower"
    is the first queue offset whose message was stored at or after `timestamp`, "upper" the
    last one stored at or before it (between two stored times, lower is the later message and
    upper the earlier one, so that [lower, upper] ranges read well). The file is chosen by the
    store times of its first and last units, not by its mtime. 0 without a queue (`cq`
    None)."""
    files = list(cq.mfq.files) if cq is not None else []
    if not files:
        return 0
    pickup = commitlog.pickup_store_timestamp

    def time_at(mf, pos):
        phy, size, _ = _UNIT.unpack_from(mf.mm, pos)
        return pickup(phy, size)

    held = [mf for mf in files if mf.hold()]
    try:
        if len(held) != len(files):
            return 0                    # cleaning removed a file meanwhile
        mf = None
        if boundary == "lower":
            # the first file (but the last) ending at or after timestamp, else the last
            mf = next((f for f in files[:-1] if time_at(f, f.file_size - UNIT) >= timestamp),
                      files[-1])
        else:
            for f in reversed(files):
                start = time_at(f, 0)
                if start <= 0 or start <= timestamp:     # an unknown start (-1) counts too
                    mf = f
                    break
            if mf is None:
                return 0
        return _bounded_search(commitlog, cq, mf, timestamp, boundary, time_at)
    finally:
        for f in held:
            f.release()


def _bounded_search(commitlog, cq, mf, timestamp, boundary, time_at):
    base = mf.file_from_offset
    low = max(0, cq.min_logic_offset - base)
    size = mf.file_size
    if 0 != mf.read_position != size:
        size = mf.read_position            # the last file, being written
    ceiling = size - UNIT
    floor = low
    high = ceiling
    lower = boundary == "lower"
    # Every unit stored before timestamp, or every one after it.
    if time_at(mf, ceiling) < timestamp:
        return _java_div(base + ceiling + (UNIT if lower else 0), UNIT)
    if time_at(mf, floor) > timestamp:
        return base // UNIT if lower else 0
    pickup = commitlog.pickup_store_timestamp
    found = _bisect_units(mf.mm, low, high, timestamp, commitlog.min_offset, pickup)
    if found is None:
        return 0
    target, left, _, right, _ = found
    if target != -1:
        # Neighbours may share the store time: walk to the first (lower) or last (upper).
        step = -UNIT if lower else UNIT
        while floor <= target + step <= ceiling and time_at(mf, target + step) == timestamp:
            target += step
        offset = target
    else:
        offset = right if lower else left
    return _java_div(base + offset, UNIT)
