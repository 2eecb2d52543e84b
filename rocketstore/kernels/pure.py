# SPDX-License-Identifier: Apache-2.0
"""Reference kernels in Python (struct, zlib, numpy). The compiled backends must match these
byte for byte; tests/test_kernels.py holds them to it."""
import os
import sys
import struct
import zlib

import numpy as np

from .. import format as F
from ..errors import (RS_E_ARG, RS_E_BOUNDS, RS_E_TOO_LONG, raise_for_status)
from ..message import valid_topic_bytes
from . import _query_loop
from .contract import int64_output as _int64_output

NAME = "pure"

# The layouts of format.py, bound once here: this module is the pure backend's hot path.
_I16 = F.I16
_I32 = F.I32
_I64 = F.I64
_HEAD = F.RECORD_HEAD.struct                   # TOTALSIZE .. BORNTIMESTAMP (48 bytes)
_TAIL = F.RECORD_TAIL.struct                   # RECONSUMETIMES .. BODYLENGTH (16 bytes)
_CQ = F.CQ_UNIT.struct
_BLANK = F.BLANK.struct
_TAIL_SIZE = F.RECORD_TAIL.size
_pos_store_timestamp = F.pos_store_timestamp
_pos_record_tail = F.pos_record_tail
_SCHEDULE = F.SCHEDULE_TOPIC.encode()


def crc32(data, value=0):
    return zlib.crc32(data, value) & 0xFFFFFFFF


def java_hash(data):
    text = bytes(data).decode("utf-8", "replace")
    units = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for (u,) in struct.iter_unpack(">H", units):
        h = (31 * h + u) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def msg_size(sys_flag, body_len, topic_len, props_len, v2=False):
    if body_len < 0 or topic_len < 0 or props_len < 0:
        raise_for_status(RS_E_ARG, "msg_size")
    if topic_len > (32767 if v2 else F.MAX_TOPIC_LENGTH) or props_len > F.MAX_PROPERTIES_LENGTH:
        raise_for_status(RS_E_TOO_LONG, "msg_size")
    size = _pos_record_tail(sys_flag) + _TAIL_SIZE + body_len + (2 if v2 else 1) \
        + topic_len + 2 + props_len
    if size > 0x7FFFFFFF:
        raise_for_status(RS_E_TOO_LONG, "msg_size")
    return size


def msg_encode(out, pos, topic, body, props, queue_id, flag, queue_offset, phy_offset, sys_flag,
               born_timestamp, born_host, store_timestamp, store_host, reconsume_times,
               prepared_tx_offset, v2=False):
    if len(born_host) != F.born_host_length(sys_flag) or \
            len(store_host) != F.store_host_length(sys_flag):
        raise_for_status(RS_E_ARG, "msg_encode: host length does not match sys_flag")
    if type(body) is not bytes:
        body = memoryview(body).cast("B")    # lengths in bytes, as C reads any buffer
    size = msg_size(sys_flag, len(body), len(topic), len(props), v2)
    if pos < 0 or pos + size > len(out):
        raise_for_status(RS_E_BOUNDS, "msg_encode")
    crc = zlib.crc32(body) & 0x7FFFFFFF
    magic = F.MESSAGE_MAGIC_CODE_V2 if v2 else F.MESSAGE_MAGIC_CODE
    rec = b"".join((
        _HEAD.pack(size, magic, crc, queue_id, flag, queue_offset, phy_offset, sys_flag,
                   born_timestamp),
        bytes(born_host), _I64.pack(store_timestamp), bytes(store_host),
        _TAIL.pack(reconsume_times, prepared_tx_offset, len(body)), bytes(body),
        _I16.pack(len(topic)) if v2 else bytes((len(topic),)), bytes(topic),
        _I16.pack(len(props)), bytes(props),
    ))
    out[pos:pos + size] = memoryview(rec)
    return size


def commitlog_append(out, pos, record, queue_offset, phy_offset, store_timestamp):
    mv = memoryview(record).cast("B")
    if len(mv) < F.POS_BORNHOST + 8:
        raise_for_status(RS_E_BOUNDS, "commitlog_append: record too short")
    size = _I32.unpack_from(mv, 0)[0]
    sys_flag = _I32.unpack_from(mv, F.POS_SYSFLAG)[0]
    ts_pos = _pos_store_timestamp(sys_flag)
    if size < ts_pos + 8 or size > len(mv):
        raise_for_status(RS_E_ARG, "commitlog_append: TOTALSIZE does not fit the record")
    if pos < 0 or pos + size > len(out):
        raise_for_status(RS_E_BOUNDS, "commitlog_append")
    out[pos:pos + size] = mv[:size]
    _I64.pack_into(out, pos + F.POS_QUEUEOFFSET, queue_offset)
    _I64.pack_into(out, pos + F.POS_PHYSICALOFFSET, phy_offset)
    _I64.pack_into(out, pos + ts_pos, store_timestamp)
    return size


def commitlog_append_batch(out, pos, limit, records, queue_offsets, phy_base, store_timestamp):
    mv = memoryview(records).cast("B")
    if pos < 0 or limit > len(out) or pos > limit:
        raise_for_status(RS_E_BOUNDS, "commitlog_append_batch")
    qo = np.asarray(queue_offsets, dtype=np.int64)
    n = 0
    rd = 0
    wr = pos
    total = len(mv)
    while rd < total:
        if total - rd < F.POS_BORNHOST + 8:
            raise_for_status(RS_E_ARG, "commitlog_append_batch: truncated record")
        size = _I32.unpack_from(mv, rd)[0]
        if size < F.POS_BORNHOST + 8 or rd + size > total:
            raise_for_status(RS_E_ARG, "commitlog_append_batch: bad TOTALSIZE")
        if wr + size + F.END_FILE_MIN_BLANK_LENGTH > limit:
            break
        if n >= len(qo):
            raise_for_status(RS_E_ARG, "commitlog_append_batch: too few queue offsets")
        commitlog_append(out, wr, mv[rd:rd + size], int(qo[n]), phy_base + (wr - pos),
                         store_timestamp)
        wr += size
        rd += size
        n += 1
    return n, wr - pos


def _column(data, off, first, n, what):
    """Offsets first..n of a column as an int64 array, checked as rs_batch_encode checks them;
    None for an absent column."""
    if off is None:
        return None
    off = np.asarray(off, dtype=np.int64)
    if len(off) < n + 1:
        raise_for_status(RS_E_ARG, f"batch_encode: too few {what} offsets")
    window = off[first:n + 1]
    if window[0] < 0 or (np.diff(window) < 0).any() or window[-1] > len(data):
        raise_for_status(RS_E_BOUNDS, f"batch_encode: {what} offsets outside their data")
    return off


def batch_encode(out, pos, limit, topic, queue_id, bodies, body_off, a, a_off, b, b_off, frags,
                 frag_off, first, n, flag, sys_flag, born_timestamp, born_host,
                 store_timestamp, store_host, queue_offset, phy_base, flags_or=None, rows=None,
                 tags_col=-1, phys=None, sizes=None):
    if n < 0 or first < 0 or first > n:
        raise_for_status(RS_E_ARG, "batch_encode: bad record range")
    phys = _int64_output(phys, n - first, "phys")
    sizes = _int64_output(sizes, n - first, "sizes")
    if rows is not None and (tags_col not in (-1, 0, 1, 2) or (tags_col == 1 and a_off is None)
                             or (tags_col == 2 and b_off is None)):
        raise_for_status(RS_E_ARG, "batch_encode: tags_col")
    if rows is not None and (getattr(rows, "dtype", None) != F.SCAN_DTYPE
                             or len(rows) < n - first):
        raise_for_status(RS_E_ARG, "batch_encode: rows must be a SCAN_DTYPE array with a row "
                                   "per record")
    if flags_or is not None:
        flags_or = np.asarray(flags_or, dtype=np.int32)
        if len(flags_or) < n:
            raise_for_status(RS_E_ARG, "batch_encode: too few per-record flags")
    if pos < 0 or limit < 0 or limit > len(out) or pos > limit:
        raise_for_status(RS_E_BOUNDS, "batch_encode")
    bodies = memoryview(bodies).cast("B")
    a = memoryview(b"" if a is None else a).cast("B")
    b = memoryview(b"" if b is None else b).cast("B")
    frags = memoryview(frags).cast("B")
    fo = np.asarray(frag_off, dtype=np.int64)
    if len(fo) < 4 or fo[0] < 0 or (np.diff(fo[:4]) < 0).any():
        raise_for_status(RS_E_ARG, "batch_encode: fragment offsets out of order")
    if fo[3] > len(frags):
        raise_for_status(RS_E_BOUNDS, "batch_encode: fragments")
    bo = _column(bodies, body_off, first, n, "body")
    ao = _column(a, a_off, first, n, "first column")
    co = _column(b, b_off, first, n, "second column")
    if flags_or is not None and (flags_or[first:n]
                                 & (F.BORNHOST_V6_FLAG | F.STOREHOSTADDRESS_V6_FLAG)).any():
        raise_for_status(RS_E_ARG, "batch_encode: a host bit in the per-record flags")
    f0, f1, f2 = (bytes(frags[fo[k]:fo[k + 1]]) for k in range(3))
    wr = pos
    for i in range(first, n):
        props = b"".join((f0, bytes(a[ao[i]:ao[i + 1]]) if ao is not None else b"", f1,
                          bytes(b[co[i]:co[i + 1]]) if co is not None else b"", f2))
        body = bodies[bo[i]:bo[i + 1]]
        flags = sys_flag if flags_or is None else sys_flag | int(flags_or[i])
        size = msg_size(flags, len(body), len(topic), len(props))
        if wr + size + F.END_FILE_MIN_BLANK_LENGTH > limit:
            break
        msg_encode(out, wr, topic, body, props, queue_id, flag, queue_offset + (i - first),
                   phy_base + (wr - pos), flags, born_timestamp, born_host, store_timestamp,
                   store_host, 0, 0)
        if phys is not None:
            phys[i - first] = phy_base + (wr - pos)
        if sizes is not None:
            sizes[i - first] = size
        wr += size
    else:
        i = n
    if rows is not None and wr > pos:
        # The rows of what was written: the scan's, by definition here (tags_col is only a
        # shortcut for the compiled backends).
        commitlog_scan(out, pos, wr, False, rows[:i - first])
    return i - first, wr - pos


def column_join(items, text):
    if type(items) is not list:
        return None
    out = []
    for x in items:
        if type(x) is bytes:
            out.append(x)
        elif text and type(x) is str:
            out.append(x.encode("utf-8"))
        elif x is None:
            out.append(b"")
        else:
            return None
    off = np.zeros(len(out) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in out], out=off[1:])
    return b"".join(out), off


def commitlog_blank(out, pos, size):
    if pos < 0 or pos + F.END_FILE_MIN_BLANK_LENGTH > len(out):
        raise_for_status(RS_E_BOUNDS, "commitlog_blank")
    _BLANK.pack_into(out, pos, size, F.BLANK_MAGIC_CODE)
    return F.END_FILE_MIN_BLANK_LENGTH


def _tags_code(props):
    """tagsCode of a properties string (doc/01 §3.6-3.7); also whether TAGS was present."""
    tags = None
    for seg in props.split(b"\x02"):
        if len(seg.decode("utf-8", "replace")) < 3:
            continue
        i = seg.find(b"\x01")
        if i <= 0 or i == len(seg) - 1:
            continue
        if seg[:i] == b"TAGS":
            tags = seg[i + 1:]
    if tags is None:
        return 0, False
    return java_hash(tags), True


def _topic_hash(topic):
    """32-bit FNV-1a of the topic bytes, signed (rs_scan_rec.topic_hash)."""
    h = 2166136261
    for b in bytes(topic):
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _check_one(mv, p, end, check_crc):
    """One record at mv[p:end]: (reason or None, size, row tuple)."""
    if end - p < 8:
        return F.SCAN_PARTIAL, 0, None
    size, magic = _BLANK.unpack_from(mv, p)
    if magic == F.BLANK_MAGIC_CODE:
        return F.SCAN_BLANK, size, None
    if magic == 0:
        return F.SCAN_EMPTY, 0, None
    if magic not in (F.MESSAGE_MAGIC_CODE, F.MESSAGE_MAGIC_CODE_V2):
        return F.SCAN_CORRUPT, 0, None
    v2 = magic == F.MESSAGE_MAGIC_CODE_V2
    if size < F.MSG_FIXED_V1_IPV4:
        return F.SCAN_CORRUPT, 0, None
    if size > end - p:
        return F.SCAN_PARTIAL, size, None
    rec = mv[p:p + size]
    (_, _, body_crc, queue_id, flag, queue_offset, phy_offset, sys_flag,
     born_ts) = _HEAD.unpack_from(rec, 0)
    q = _pos_record_tail(sys_flag)
    body_off = q + _TAIL_SIZE
    if body_off > size:
        return F.SCAN_CORRUPT, 0, None
    store_ts = _I64.unpack_from(rec, _pos_store_timestamp(sys_flag))[0]
    reconsume, prepared, body_len = _TAIL.unpack_from(rec, q)
    if body_len < 0 or body_off + body_len > size:
        return F.SCAN_CORRUPT, 0, None
    q = body_off + body_len
    tl = 2 if v2 else 1
    if q + tl > size:
        return F.SCAN_CORRUPT, 0, None
    topic_len = _I16.unpack_from(rec, q)[0] if v2 else rec[q]
    topic_off = q + tl
    if topic_len < 0 or topic_off + topic_len + 2 > size:
        return F.SCAN_CORRUPT, 0, None
    q = topic_off + topic_len
    props_len = _I16.unpack_from(rec, q)[0]
    props_off = q + 2
    if props_len < 0 or props_off + props_len > size:
        return F.SCAN_CORRUPT, 0, None
    if check_crc and (zlib.crc32(rec[body_off:body_off + body_len]) & 0x7FFFFFFF) != body_crc:
        return F.SCAN_CORRUPT, 0, None
    topic = bytes(rec[topic_off:topic_off + topic_len])
    if not valid_topic_bytes(topic):
        return F.SCAN_TOPIC, 0, None
    if props_off + props_len != size:
        return F.SCAN_MISMATCH, size, None
    props = bytes(rec[props_off:props_off + props_len])
    tags_code, has_tags = _tags_code(props) if props_len else (0, False)
    info = (F.SCAN_INFO_V2 if v2 else 0) | (F.SCAN_INFO_HAS_TAGS if has_tags else 0)
    if topic == _SCHEDULE:
        info |= F.SCAN_INFO_SCHEDULE
    row = (p, phy_offset, queue_offset, tags_code, store_ts, born_ts, prepared, size, queue_id,
           sys_flag, flag, body_crc, reconsume, body_off, body_len, topic_off, topic_len,
           props_off, props_len, info, _topic_hash(topic))
    return None, size, row


def commitlog_scan(buf, start, end, check_crc, out):
    mv = memoryview(buf).cast("B")
    if start < 0 or end > len(mv) or start > end:
        raise_for_status(RS_E_BOUNDS, "commitlog_scan")
    if out.dtype != F.SCAN_DTYPE:
        raise_for_status(RS_E_ARG, "commitlog_scan: out must be a SCAN_DTYPE array")
    cap = len(out)
    n = 0
    p = start
    while True:
        if n >= cap or p >= end:
            return n, p, F.SCAN_END, 0
        reason, size, row = _check_one(mv, p, end, check_crc)
        if reason is not None:
            return n, p, reason, size if reason in (F.SCAN_BLANK, F.SCAN_MISMATCH) else 0
        out[n] = row
        n += 1
        p += size


def cq_encode(out, pos, offset, size, tags_code):
    if pos < 0 or pos + F.CQ_STORE_UNIT_SIZE > len(out):
        raise_for_status(RS_E_BOUNDS, "cq_encode")
    _CQ.pack_into(out, pos, offset, size, tags_code)
    return F.CQ_STORE_UNIT_SIZE


def cq_encode_batch(out, pos, offsets, sizes, tags_codes):
    n = len(offsets)
    if len(sizes) != n or len(tags_codes) != n:
        raise_for_status(RS_E_ARG, "cq_encode_batch: arrays differ in length")
    nbytes = n * F.CQ_STORE_UNIT_SIZE
    if pos < 0 or pos + nbytes > len(out):
        raise_for_status(RS_E_BOUNDS, "cq_encode_batch")
    units = np.empty(n, dtype=F.CQ_DTYPE)
    units["offset"] = offsets
    units["size"] = sizes
    units["tags_code"] = tags_codes
    out[pos:pos + nbytes] = memoryview(units.tobytes())
    return nbytes


def cq_search(buf, start, end, phy_offset):
    mv = memoryview(buf).cast("B")
    if start < 0 or end > len(mv) or start > end:
        raise_for_status(RS_E_BOUNDS, "cq_search")
    units = np.frombuffer(mv[start:end], dtype=F.CQ_DTYPE,
                          count=(end - start) // F.CQ_STORE_UNIT_SIZE)
    return int(np.searchsorted(units["offset"], phy_offset, side="left"))


def sync_range(buf, fd, start, length):
    # fdatasync drops the GIL and, on Linux, also writes back pages dirtied through a mapping.
    os.fdatasync(fd)


# ---- IndexFile (doc/02 §2) -------------------------------------------------------------------
_I32_MIN = -(1 << 31)
_I32_MAX = (1 << 31) - 1
_IDX_HEAD = F.INDEX_HEADER.struct
_IDX_ENTRY = F.INDEX_ENTRY.struct


def _wrap64(v):
    """Java long arithmetic: wrap to a signed 64-bit value."""
    return ((v + (1 << 63)) & 0xFFFFFFFFFFFFFFFF) - (1 << 63)


def _java_div(a, b):
    """Java's long division truncates toward zero; Python's // floors."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def tags_match(props, tags, ends):
    tags = bytes(tags)
    ends = np.asarray(ends, dtype=np.int64).tolist()
    start = 0
    for end in ends:
        if end < start or end > len(tags):
            raise_for_status(RS_E_ARG, "tags_match: ends not ascending within tags")
        start = end
    value = _prop_value(bytes(props), b"TAGS")
    if value is None:
        return False
    start = 0
    for end in ends:
        if tags[start:end] == value:
            return True
        start = end
    return False


def index_hash(key):
    h = java_hash(key)
    # Math.abs(Integer.MIN_VALUE) stays negative in Java; indexKeyHashMethod then uses 0.
    return 0 if h == _I32_MIN else abs(h)


def _prop_value(props, name):
    """The last valid `name` segment's value (as _tags_code reads TAGS), bytes or None."""
    value = None
    for seg in props.split(b"\x02"):
        i = seg.find(b"\x01")
        if i <= 0 or i == len(seg) - 1:
            continue
        if seg[:i] == name:
            value = seg[i + 1:]
    return value


def index_keys(buf, rows, out_hashes, out_rows):
    mv = memoryview(buf).cast("B")
    if getattr(rows, "dtype", None) != F.SCAN_DTYPE:
        raise_for_status(RS_E_ARG, "index_keys: rows must be a SCAN_DTYPE array")
    cap = min(len(out_hashes), len(out_rows))
    n = 0
    for i, row in enumerate(rows.tolist()):
        pos, sys_flag = row[0], row[9]
        topic_off, topic_len, props_off, props_len = row[15], row[16], row[17], row[18]
        if sys_flag & F.TRANSACTION_TYPE_MASK == F.TRANSACTION_ROLLBACK_TYPE:
            continue
        if min(pos, topic_off, topic_len, props_off, props_len) < 0 or \
                pos + topic_off + topic_len > len(mv) or pos + props_off + props_len > len(mv):
            raise_for_status(RS_E_BOUNDS, "index_keys")
        props = bytes(mv[pos + props_off:pos + props_off + props_len])
        keys = []
        uniq = _prop_value(props, b"UNIQ_KEY")
        if uniq is not None:
            keys.append(uniq)
        pieces = _prop_value(props, b"KEYS")
        if pieces is not None:
            keys.extend(k for k in pieces.split(b" ") if k)
        if not keys:
            continue
        if n + len(keys) > cap:
            return n, i
        prefix = bytes(mv[pos + topic_off:pos + topic_off + topic_len]) + b"#"
        for key in keys:
            out_hashes[n] = index_hash(prefix + key)
            out_rows[n] = i
            n += 1
    return n, len(rows)


def _index_geometry(buf, slot_num, index_num, what):
    if slot_num < 1 or index_num < 1:
        raise_for_status(RS_E_ARG, what)
    if F.INDEX_HEADER_SIZE + slot_num * F.INDEX_SLOT_SIZE + index_num * F.INDEX_ENTRY_SIZE \
            > len(buf):
        raise_for_status(RS_E_BOUNDS, what)


def _index_count(mv):
    n = _I32.unpack_from(mv, F.INDEX_POS_INDEX_COUNT)[0]
    return 1 if n <= 0 else n


def _index_put1(mv, slot_num, index_num, key_hash, phy_offset, store_timestamp):
    count = _index_count(mv)
    if count >= index_num:
        return 0
    slot_pos = F.INDEX_HEADER_SIZE + (key_hash % slot_num) * F.INDEX_SLOT_SIZE
    slot_value = _I32.unpack_from(mv, slot_pos)[0]
    if slot_value <= 0 or slot_value > count:
        slot_value = 0
    begin_ts, end_ts, begin_phy, end_phy, slots_used, _ = _IDX_HEAD.unpack_from(mv, 0)
    diff = _java_div(_wrap64(store_timestamp - begin_ts), 1000)
    if begin_ts <= 0 or diff < 0:
        diff = 0
    elif diff > _I32_MAX:
        diff = _I32_MAX
    entry = F.INDEX_HEADER_SIZE + slot_num * F.INDEX_SLOT_SIZE + count * F.INDEX_ENTRY_SIZE
    _IDX_ENTRY.pack_into(mv, entry, key_hash, phy_offset, diff, slot_value)
    _I32.pack_into(mv, slot_pos, count)
    if count <= 1:
        begin_phy, begin_ts = phy_offset, store_timestamp
    if slot_value == 0:
        slots_used = (slots_used + 1 + (1 << 31)) % (1 << 32) - (1 << 31)
    _IDX_HEAD.pack_into(mv, 0, begin_ts, store_timestamp, begin_phy, phy_offset, slots_used,
                        count + 1)
    return count + 1


def index_put(buf, slot_num, index_num, key_hash, phy_offset, store_timestamp):
    mv = memoryview(buf).cast("B")
    _index_geometry(mv, slot_num, index_num, "index_put")
    if key_hash < 0:
        raise_for_status(RS_E_ARG, "index_put")
    return _index_put1(mv, slot_num, index_num, key_hash, phy_offset, store_timestamp)


def index_put_batch(buf, slot_num, index_num, key_hashes, phy_offsets, store_timestamps):
    n = len(key_hashes)
    if len(phy_offsets) != n or len(store_timestamps) != n:
        raise_for_status(RS_E_ARG, "index_put_batch: arrays differ in length")
    mv = memoryview(buf).cast("B")
    _index_geometry(mv, slot_num, index_num, "index_put_batch")
    hashes = np.asarray(key_hashes, dtype=np.int32).tolist()
    offsets = np.asarray(phy_offsets, dtype=np.int64).tolist()
    stamps = np.asarray(store_timestamps, dtype=np.int64).tolist()
    if any(h < 0 for h in hashes):
        raise_for_status(RS_E_ARG, "index_put_batch")
    for i in range(n):
        if not _index_put1(mv, slot_num, index_num, hashes[i], offsets[i], stamps[i]):
            return i
    return n


def index_lookup(buf, slot_num, index_num, key_hash, begin, end, max_num, out_offsets):
    cap = max(0, min(max_num, len(out_offsets)))
    return _walk(buf, slot_num, index_num, key_hash, begin, end, 0, 0, out_offsets, cap,
                 "index_lookup")[0]


def index_walk(buf, slot_num, index_num, key_hash, begin, end, at, hops, out_offsets):
    return _walk(buf, slot_num, index_num, key_hash, begin, end, at, hops, out_offsets,
                 len(out_offsets), "index_walk")


def _walk(buf, slot_num, index_num, key_hash, begin, end, at, hops, out_offsets, cap, what):
    """rs_index_walk: (count, at, hops)."""
    mv = memoryview(buf).cast("B")
    _index_geometry(mv, slot_num, index_num, what)
    if key_hash < 0 or hops < 0:
        raise_for_status(RS_E_ARG, what)
    if at < 0 or cap <= 0:
        return 0, at, hops
    count = _index_count(mv)
    n = at or _I32.unpack_from(mv, F.INDEX_HEADER_SIZE +
                               (key_hash % slot_num) * F.INDEX_SLOT_SIZE)[0]
    if n <= 0 or n > count or n >= index_num or count <= 1:
        return 0, -1, hops
    begin_ts = _I64.unpack_from(mv, F.INDEX_POS_BEGIN_TIMESTAMP)[0]
    entries = F.INDEX_HEADER_SIZE + slot_num * F.INDEX_SLOT_SIZE
    found = 0
    at = -1
    # At most index_num hops over all calls: a corrupt chain that loops still ends.
    while hops < index_num and found < cap:
        hops += 1
        hash_read, phy_read, diff, prev = _IDX_ENTRY.unpack_from(
            mv, entries + n * F.INDEX_ENTRY_SIZE)
        if diff < 0:
            break
        time_read = _wrap64(begin_ts + diff * 1000)
        if hash_read == key_hash and begin <= time_read <= end:
            out_offsets[found] = phy_read
            found += 1
        if prev <= 0 or prev > count or prev >= index_num or prev == n or time_read < begin:
            break
        n = prev
        if found == cap:
            at = n                        # the chain goes on: the next call starts there
            break
    return found, at, hops


def _has_key(props, key):
    """rs_index_has_key over bytes."""
    if not key:
        return False
    if _prop_value(props, b"UNIQ_KEY") == key:
        return True
    pieces = _prop_value(props, b"KEYS")
    return pieces is not None and key in pieces.split(b" ")


def index_match(buf, limit, pos, phy_offset, topic, key, begin, end):
    mv = memoryview(buf).cast("B")
    if limit < 0 or limit > len(mv) or pos < 0 or pos > limit:
        raise_for_status(RS_E_BOUNDS, "index_match")
    reason, size, row = _check_one(mv, pos, limit, False)
    if reason is not None:
        return 0
    topic_off, topic_len, props_off, props_len = row[15], row[16], row[17], row[18]
    if row[1] != phy_offset or not begin <= row[4] <= end:
        return 0
    # None: not compared.
    if topic is not None and mv[pos + topic_off:pos + topic_off + topic_len] != bytes(topic):
        return 0
    if key is not None and \
            not _has_key(bytes(mv[pos + props_off:pos + props_off + props_len]), bytes(key)):
        return 0
    return size


def index_query(files, mfq, topic, key, want, begin, end, decode):
    return _query_loop.index_query(_SELF, files, mfq, topic, key, want, begin, end, decode)


_SELF = sys.modules[__name__]
