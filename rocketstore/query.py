# SPDX-License-Identifier: Apache-2.0
"""Message queries of MessageStore, as plain functions over a loaded store: by key and unique
key through the index (spec 02 §2.6), by msgId, and a queue offset by time (spec 02 §1.9).
"""
import logging
import struct

from .errors import InvalidArgumentError
from .format import CQ_STORE_UNIT_SIZE as UNIT
from .message import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, decode_msg_id
from .status import QueryMessageResult

log = logging.getLogger(__name__)

LONG_MAX = (1 << 63) - 1
_UNIT = struct.Struct(">qi")


def message_has_key(msg, topic, key):
    """The record really carries `key` under `topic`: its UNIQ_KEY, or a KEYS piece. The index
    matches hashes only, so this is what keeps a collision out of a query's answer."""
    if msg.topic != topic or key not in msg.properties_string:
        return False
    props = msg.properties
    if props.get(PROPERTY_UNIQ_KEY) == key:
        return True
    keys = props.get(PROPERTY_KEYS)
    return bool(key) and keys is not None and key in keys.split(KEY_SEPARATOR)


def query_message(store, topic, key, max_num=32, begin=0, end=None):
    """DefaultMessageStore#queryMessage: the newest messages (at most max_num, capped by
    max_msgs_num_batch) that carry the key (see message_has_key) and were stored in
    [begin, end], in ascending offset order.

    The index matches hashes, and times only to the second (see IndexService.query_offset),
    so hits are read back and judged. When judging throws hits out (collisions, records
    stored just outside the window), the lookup is repeated for more hits until enough are
    kept or the index has no more: the broker's three rounds could come back empty while
    matching messages sat behind a second's worth of misses."""
    result = QueryMessageResult()
    index = store._indexer
    end_time = LONG_MAX if end is None else end
    want = min(max_num, store.config.max_msgs_num_batch)
    judged = {}                 # offset -> the message kept there, or None
    kept = {}                   # offset -> message, of the current lookup
    limit = want
    while want > 0:
        offsets, last_ts, last_phy = index.lookup_offsets(topic, key, limit, begin, end_time)
        result.index_last_update_timestamp = last_ts
        result.index_last_update_phy_offset = last_phy
        kept = {}
        for offset in offsets:
            if offset not in judged:
                msg = store.look_message_by_offset(offset)
                ok = (msg is not None and msg.commit_log_offset == offset
                      and begin <= msg.store_timestamp <= end_time
                      and message_has_key(msg, topic, key))
                judged[offset] = msg if ok else None
            msg = judged[offset]
            if msg is not None:
                kept[offset] = msg
                if len(kept) == want:
                    break
        if len(kept) == want or len(offsets) < limit:
            break
        limit *= 4
    for offset in sorted(kept):
        msg = kept[offset]
        result.messages.append(msg)
        result.buffer_total_size += msg.store_size
    return result


def query_message_by_unique_key(store, topic, uniq_key):
    """The message whose UNIQ_KEY (the client-side msgId) is `uniq_key`, or None; the oldest
    when a retry stored it more than once."""
    for msg in query_message(store, topic, uniq_key).messages:
        if msg.properties.get(PROPERTY_UNIQ_KEY) == uniq_key:
            return msg
    return None


def view_message_by_id(store, msg_id):
    """The message an offset msgId (store host + commit-log offset) names, or None. A msgId
    that is not 16 or 28 hex bytes raises InvalidArgumentError (a ValueError)."""
    try:
        _, offset = decode_msg_id(msg_id)
    except ValueError:
        raise InvalidArgumentError(
            f"{msg_id!r} is not an offset msgId (32 or 56 hex digits)") from None
    msg = store.look_message_by_offset(offset)
    if msg is None or msg.commit_log_offset != offset:
        return None
    return msg


def _java_div(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def get_offset_in_queue_by_time(store, topic, queue_id, timestamp):
    """ConsumeQueue#getOffsetInQueueByTime as 4.9.x does it (spec 02 §1.9).

    The file is the first whose last-modified time is >= timestamp, else the last: the
    broker's own rule, so a store whose files were copied (new mtimes) answers from its first
    file, as a broker would. Within the file: binary search on the records' store
    timestamps, the nearer neighbour when there is no exact match. 0 without a queue."""
    queues = store.consume_queue_table.get(topic)
    cq = queues.get(queue_id) if queues else None
    if cq is None:
        return 0
    files = list(cq.mfq.files)
    if not files:
        return 0
    mf = files[-1]
    for f in files:
        if store.fs.mtime_ms(f.path) >= timestamp:
            mf = f
            break
    if not mf.hold():
        return 0
    try:
        base = mf.file_from_offset
        low = max(0, cq.min_logic_offset - base)
        high = mf.read_position - UNIT
        target = left = right = -1
        left_value = right_value = -1
        min_phy = store.commitlog.min_offset
        pickup = store.commitlog.pickup_store_timestamp
        mm = mf.mm
        while high >= low:
            mid = (low + high) // (2 * UNIT) * UNIT
            phy, size = _UNIT.unpack_from(mm, mid)
            if phy < min_phy:
                low = mid + UNIT
                left = mid
                continue
            store_time = pickup(phy, size)
            if store_time < 0:
                return 0
            if store_time == timestamp:
                target = mid
                break
            if store_time > timestamp:
                high = mid - UNIT
                right, right_value = mid, store_time
            else:
                low = mid + UNIT
                left, left_value = mid, store_time
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


def get_offset_in_queue_by_boundary(store, topic, queue_id, timestamp, boundary):
    """ConsumeQueue#getOffsetInQueueByTime(timestamp, BoundaryType) as 5.x does it: "lower"
    is the first queue offset whose message was stored at or after `timestamp`, "upper" the
    last one stored at or before it (between two stored times, lower is the later message and
    upper the earlier one, so that [lower, upper] ranges read well). The file is chosen by the
    store times of its first and last units, not by its mtime. 0 without a queue."""
    queues = store.consume_queue_table.get(topic)
    cq = queues.get(queue_id) if queues else None
    files = list(cq.mfq.files) if cq is not None else []
    if not files:
        return 0
    pickup = store.commitlog.pickup_store_timestamp

    def time_at(mf, pos):
        phy, size = _UNIT.unpack_from(mf.mm, pos)
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
        return _bounded_search(store, cq, mf, timestamp, boundary, time_at)
    finally:
        for f in held:
            f.release()


def _bounded_search(store, cq, mf, timestamp, boundary, time_at):
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
    min_phy = store.commitlog.min_offset
    target = left = right = -1
    while high >= low:
        mid = (low + high) // (2 * UNIT) * UNIT
        phy, _ = _UNIT.unpack_from(mf.mm, mid)
        if phy < min_phy:
            low = mid + UNIT
            left = mid
            continue
        store_time = time_at(mf, mid)
        if store_time < 0:
            return 0
        if store_time == timestamp:
            target = mid
            break
        if store_time > timestamp:
            high = mid - UNIT
            right = mid
        else:
            low = mid + UNIT
            left = mid
    if target != -1:
        # Neighbours may share the store time: walk to the first (lower) or last (upper).
        step = -UNIT if lower else UNIT
        while floor <= target + step <= ceiling and time_at(mf, target + step) == timestamp:
            target += step
        offset = target
    else:
        offset = right if lower else left
    return _java_div(base + offset, UNIT)
