# SPDX-License-Identifier: Apache-2.0
"""cffi kernel backend: rocketstore.kernels._cffi_lib (csrc/ built by csrc/build_cffi.py) adapted
to rocketstore.kernels.contract, NAME = "cffi".

cffi drops the GIL on every call, so nothing here decides about it. `bytes` arguments go to C
as they are; other buffers through `ffi.from_buffer`, released in `finally` so that no view
outlives the call (an mmap with a live export cannot close, and PyPy frees cdata late).
"""
import os as _os
import sys as _sys
from array import array as _array

from ..errors import RS_E_ARG as _RS_E_ARG
from ..errors import RS_E_BOUNDS as _RS_E_BOUNDS
from ..errors import raise_for_status as _raise_for_status
from ..format import SCAN_DTYPE as _SCAN_DTYPE
from ._cffi_lib import ffi as _ffi
from ._cffi_lib import lib as _lib
from . import pure as _pure
from . import _query_loop
from .contract import int64_output as _int64_output

NAME = "cffi"

__all__ = ("NAME", "crc32", "java_hash", "msg_size", "msg_encode", "commitlog_append",
           "commitlog_append_batch", "commitlog_blank", "commitlog_scan", "cq_encode",
           "cq_encode_batch", "cq_search", "tags_match", "index_hash", "index_put",
           "index_put_batch", "index_keys", "index_lookup", "index_walk", "index_match",
           "index_query", "sync_range", "sync_written", "write_behind", "space_prepare",
           "batch_encode", "column_join", "SYNC_RANGE_FD_UNUSED", "GroupCommit")

_from_buffer = _ffi.from_buffer
_release_cdata = _ffi.release
_new = _ffi.new
_NATIVE = "<" if _sys.byteorder == "little" else ">"
# memoryview formats of native-order signed integers of each size (numpy says 'l' for int64 on
# LP64 platforms and 'q' on Windows).
_INT_FORMATS = {8: {"q", "l", "@q", "@l", "=q", "=l", _NATIVE + "q", _NATIVE + "l"},
                4: {"i", "l", "@i", "@l", "=i", "=l", _NATIVE + "i", _NATIVE + "l"}}


def _ro(obj):
    """A read-only argument for C: bytes as they are, anything else as a borrowed uint8_t[]."""
    return obj if type(obj) is bytes else _from_buffer("uint8_t[]", obj)


def _rw(obj, ctype="uint8_t[]"):
    return _from_buffer(ctype, obj, require_writable=True)


def _release(*views):
    for v in views:
        if v is not None and type(v) is not bytes:
            _release_cdata(v)


def _ints(seq, itemsize, typecode):
    """A C-contiguous native array of `itemsize`-byte ints, converting (one copy) what is not,
    as numpy.asarray does in the pure backend; cffi itself would reinterpret any buffer."""
    try:
        mv = memoryview(seq)
    except TypeError:
        return _array(typecode, seq)
    with mv:
        if mv.ndim == 1 and mv.itemsize == itemsize and mv.c_contiguous \
                and mv.format in _INT_FORMATS[itemsize]:
            return seq
    return _array(typecode, seq)


def _check(code, what):
    if code < 0:
        _raise_for_status(code, what)
    return code


def crc32(data, value=0):
    value &= 0xFFFFFFFF
    if type(data) is bytes:
        return _lib.rs_crc32(value, data, len(data))
    v = _from_buffer("uint8_t[]", data)
    try:
        return _lib.rs_crc32(value, v, len(v))
    finally:
        _release_cdata(v)


def java_hash(data):
    h = _new("int32_t *")
    v = _ro(data)
    try:
        _lib.rs_java_hash(v, len(v), h)
    finally:
        _release(v)
    return h[0]


def msg_size(sys_flag, body_len, topic_len, props_len, v2=False):
    return _check(_lib.rs_msg_size(sys_flag, body_len, topic_len, props_len, bool(v2)),
                  "msg_size")


def msg_encode(out, pos, topic, body, props, queue_id, flag, queue_offset, phy_offset, sys_flag,
               born_timestamp, born_host, store_timestamp, store_host, reconsume_times,
               prepared_tx_offset, v2=False):
    o = t = b = p = bh = sh = None
    try:
        o = _rw(out)
        t = _ro(topic)
        b = _ro(body)
        p = _ro(props)
        bh = _ro(born_host)
        sh = _ro(store_host)
        r = _lib.rs_msg_encode(o, len(o), pos, t, len(t), b, len(b), p, len(p), queue_id, flag,
                               queue_offset, phy_offset, sys_flag, born_timestamp, bh, len(bh),
                               store_timestamp, sh, len(sh), reconsume_times, prepared_tx_offset,
                               bool(v2))
    finally:
        _release(o, t, b, p, bh, sh)
    return _check(r, "msg_encode")


def commitlog_append(out, pos, record, queue_offset, phy_offset, store_timestamp):
    o = rec = None
    try:
        o = _rw(out)
        rec = _ro(record)
        r = _lib.rs_commitlog_append(o, len(o), pos, rec, len(rec), queue_offset, phy_offset,
                                     store_timestamp)
    finally:
        _release(o, rec)
    return _check(r, "commitlog_append")


def commitlog_append_batch(out, pos, limit, records, queue_offsets, phy_base, store_timestamp):
    res = _new("int64_t[2]")
    o = recs = qo = None
    try:
        o = _rw(out)
        recs = _ro(records)
        qo = _from_buffer("int64_t[]", _ints(queue_offsets, 8, "q"))
        r = _lib.rs_commitlog_append_batch(o, len(o), pos, limit, recs, len(recs), qo, len(qo),
                                           phy_base, store_timestamp, res, res + 1)
    finally:
        _release(o, recs, qo)
    _check(r, "commitlog_append_batch")
    return res[0], res[1]


def commitlog_blank(out, pos, size):
    o = _rw(out)
    try:
        r = _lib.rs_commitlog_blank(o, len(o), pos, size)
    finally:
        _release_cdata(o)
    return _check(r, "commitlog_blank")


def commitlog_scan(buf, start, end, check_crc, out):
    res = _new("int64_t[2]")
    codes = _new("int32_t[2]")
    b = o = None
    try:
        b = _ro(buf)
        # The reference checks bounds before the output's type: keep that order.
        if start < 0 or end > len(b) or start > end:
            _raise_for_status(_RS_E_BOUNDS, "commitlog_scan")
        dtype = getattr(out, "dtype", None)
        if dtype is not None and dtype != _SCAN_DTYPE:
            _raise_for_status(_RS_E_ARG, "commitlog_scan: out must be a SCAN_DTYPE array")
        o = _rw(out, "rs_scan_rec[]")
        r = _lib.rs_commitlog_scan(b, len(b), start, end, bool(check_crc), o, len(o),
                                   res, res + 1, codes, codes + 1)
    finally:
        _release(b, o)
    _check(r, "commitlog_scan")
    return res[0], res[1], codes[0], codes[1]


def cq_encode(out, pos, offset, size, tags_code):
    o = _rw(out)
    try:
        r = _lib.rs_cq_encode(o, len(o), pos, offset, size, tags_code)
    finally:
        _release_cdata(o)
    return _check(r, "cq_encode")


def cq_encode_batch(out, pos, offsets, sizes, tags_codes):
    if not (len(offsets) == len(sizes) == len(tags_codes)):
        _raise_for_status(_RS_E_ARG, "cq_encode_batch: arrays differ in length")
    nbytes = _new("int64_t *")
    o = off = siz = tag = None
    try:
        off = _from_buffer("int64_t[]", _ints(offsets, 8, "q"))
        siz = _from_buffer("int32_t[]", _ints(sizes, 4, "i"))
        tag = _from_buffer("int64_t[]", _ints(tags_codes, 8, "q"))
        o = _rw(out)
        r = _lib.rs_cq_encode_batch(o, len(o), pos, off, siz, tag, len(off), nbytes)
    finally:
        _release(o, off, siz, tag)
    _check(r, "cq_encode_batch")
    return nbytes[0]


def cq_search(buf, start, end, phy_offset):
    index = _new("int64_t *")
    b = _ro(buf)
    try:
        r = _lib.rs_cq_search(b, len(b), start, end, phy_offset, index)
    finally:
        _release(b)
    _check(r, "cq_search")
    return index[0]


def tags_match(props, tags, ends):
    p = t = e = None
    try:
        e = _from_buffer("int64_t[]", _ints(ends, 8, "q"))
        p = _ro(props)
        t = _ro(tags)
        r = _lib.rs_tags_match(p, len(p), t, len(t), e, len(e))
    finally:
        _release(p, t, e)
    return _check(r, "tags_match") == 1


def index_hash(key):
    h = _new("int32_t *")
    v = _ro(key)
    try:
        _lib.rs_index_hash(v, len(v), h)
    finally:
        _release(v)
    return h[0]


def index_put(buf, slot_num, index_num, key_hash, phy_offset, store_timestamp):
    b = _rw(buf)
    try:
        r = _lib.rs_index_put(b, len(b), slot_num, index_num, key_hash, phy_offset,
                              store_timestamp)
    finally:
        _release_cdata(b)
    return _check(r, "index_put")


def index_put_batch(buf, slot_num, index_num, key_hashes, phy_offsets, store_timestamps):
    if not (len(key_hashes) == len(phy_offsets) == len(store_timestamps)):
        _raise_for_status(_RS_E_ARG, "index_put_batch: arrays differ in length")
    count = _new("int64_t *")
    b = kh = po = ts = None
    try:
        kh = _from_buffer("int32_t[]", _ints(key_hashes, 4, "i"))
        po = _from_buffer("int64_t[]", _ints(phy_offsets, 8, "q"))
        ts = _from_buffer("int64_t[]", _ints(store_timestamps, 8, "q"))
        b = _rw(buf)
        r = _lib.rs_index_put_batch(b, len(b), slot_num, index_num, kh, po, ts, len(kh), count)
    finally:
        _release(b, kh, po, ts)
    _check(r, "index_put_batch")
    return count[0]


def index_keys(buf, rows, out_hashes, out_rows):
    dtype = getattr(rows, "dtype", None)
    if dtype is not None and dtype != _SCAN_DTYPE:
        _raise_for_status(_RS_E_ARG, "index_keys: rows must be a SCAN_DTYPE array")
    res = _new("size_t[2]")
    b = rv = oh = orow = None
    try:
        b = _ro(buf)
        rv = _from_buffer("rs_scan_rec[]", rows)
        oh = _rw(out_hashes, "int32_t[]")
        orow = _rw(out_rows, "int32_t[]")
        r = _lib.rs_index_keys(b, len(b), rv, len(rv), oh, orow, min(len(oh), len(orow)),
                               res, res + 1)
    finally:
        _release(b, rv, oh, orow)
    _check(r, "index_keys")
    return res[0], res[1]


def index_lookup(buf, slot_num, index_num, key_hash, begin, end, max_num, out_offsets):
    count = _new("int64_t *")
    b = o = None
    try:
        o = _rw(out_offsets, "int64_t[]")
        cap = max(0, min(max_num, len(o)))
        b = _ro(buf)
        r = _lib.rs_index_lookup(b, len(b), slot_num, index_num, key_hash, begin, end, o, cap,
                                 count)
    finally:
        _release(b, o)
    _check(r, "index_lookup")
    return count[0]


def index_walk(buf, slot_num, index_num, key_hash, begin, end, at, hops, out_offsets):
    st = _new("int32_t *", at)
    hp = _new("int64_t *", hops)
    count = _new("int64_t *")
    b = o = None
    try:
        o = _rw(out_offsets, "int64_t[]")
        b = _ro(buf)
        r = _lib.rs_index_walk(b, len(b), slot_num, index_num, key_hash, begin, end, st, hp, o,
                               len(o), count)
    finally:
        _release(b, o)
    _check(r, "index_walk")
    return count[0], st[0], hp[0]


def index_match(buf, limit, pos, phy_offset, topic, key, begin, end):
    size = _new("int32_t *")
    b = t = k = None
    try:
        b = _ro(buf)
        # None: not compared (NULL to C).
        t = _ffi.NULL if topic is None else _ro(topic)
        k = _ffi.NULL if key is None else _ro(key)
        if limit < 0 or limit > len(b):
            _raise_for_status(_RS_E_BOUNDS, "index_match")
        r = _lib.rs_index_match(b, limit, pos, phy_offset, t,
                                0 if topic is None else len(t), k,
                                0 if key is None else len(k), begin, end, size)
    finally:
        _release(b, t if topic is not None else None, k if key is not None else None)
    _check(r, "index_match")
    return size[0] if r == 1 else 0


def index_query(files, mfq, topic, key, want, begin, end, decode):
    return _query_loop.index_query(_sys.modules[__name__], files, mfq, topic, key, want, begin,
                                   end, decode)


# sync_range msyncs the mapping: FileSystem.sync_mapped need not open the file for it.
SYNC_RANGE_FD_UNUSED = True


def sync_range(buf, fd, start, length):
    # `fd` serves the pure backend's fdatasync; msync needs only the mapping's address.
    _sync_mapping(buf, start, length, False, "sync_range")


def sync_written(buf, start, length, drop):
    # One C call: cffi releases the GIL once for its madvise and msync.
    _sync_mapping(buf, start, length, drop, "sync_written")


def write_behind(fd, start, length, chunk):
    # cffi releases the GIL around the call.
    return _check(_lib.rs_write_behind(fd, start, length, chunk),
                  "write_behind") != _lib.RS_WRITE_BEHIND_NONE


def _sync_mapping(buf, start, length, drop, what):
    # rs_sync_written without `drop` is rs_sync_range (as the cext backend calls it).
    b = _ro(buf)
    try:
        r = _lib.rs_sync_written(b, len(b), start, length, 1 if drop else 0)
    finally:
        _release(b)
    _check(r, what)


def space_prepare(requests):
    """Reserve and populate for many files in one C call, so one release of the GIL (see the
    cext backend's space_prepare for the arguments and the answer)."""
    n = len(requests)
    reqs = _new("rs_space_req[]", max(n, 1))
    keep, views = [], []
    try:
        for i, (path, offset, length, mm, pop_start, pop_length) in enumerate(requests):
            if offset < 0 or length < 0 or pop_start < 0 or pop_length < 0:
                _raise_for_status(_RS_E_ARG, "space_prepare")
            r = reqs[i]
            if path is not None and length > 0:
                p = _os.fsencode(path)
                if b"\0" in p:
                    raise ValueError("space_prepare: embedded null byte in a path")
                c = _new("char[]", p)
                keep.append(c)
                r.path, r.offset, r.length = c, offset, length
            if mm is not None and pop_length > 0:
                try:
                    v = _rw(mm)
                except (ValueError, BufferError, TypeError):
                    continue                    # closed meanwhile: nothing to populate
                views.append(v)
                if pop_start < len(v):
                    r.map, r.map_len, r.pop_start = v, len(v), pop_start
                    r.pop_length = min(pop_length, len(v) - pop_start)
        _lib.rs_space_prepare(reqs, n)
    finally:
        _release(*views)
    return [_space_errno(reqs[i].result) for i in range(n)]


def _space_errno(result):
    if result == 0:
        return 0
    if result <= _lib.RS_E_ERRNO_BASE:
        return _lib.RS_E_ERRNO_BASE - result
    return _check(result, "space_prepare")      # an argument C refused: checked above


def _offsets(off, need, what):
    """A borrowed int64_t[] over `off` (None for None), holding at least `need` entries: the
    kernel reads offsets up to index n and has no length for them."""
    if off is None:
        return _ffi.NULL
    v = _from_buffer("int64_t[]", _ints(off, 8, "q"))
    if len(v) < need:
        _release_cdata(v)
        _raise_for_status(_RS_E_ARG, f"batch_encode: too few {what} offsets")
    return v


def batch_encode(out, pos, limit, topic, queue_id, bodies, body_off, a, a_off, b, b_off, frags,
                 frag_off, first, n, flag, sys_flag, born_timestamp, born_host,
                 store_timestamp, store_host, queue_offset, phy_base, flags_or=None, rows=None,
                 tags_col=-1, phys=None, sizes=None):
    if n < 0 or first < 0 or first > n:
        _raise_for_status(_RS_E_ARG, "batch_encode: bad record range")
    phys = _int64_output(phys, n - first, "phys")
    sizes = _int64_output(sizes, n - first, "sizes")
    if rows is not None and getattr(rows, "dtype", None) not in (None, _SCAN_DTYPE):
        _raise_for_status(_RS_E_ARG, "batch_encode: rows must be a SCAN_DTYPE array")
    px = _ffi.NULL
    if flags_or is not None:
        px = _from_buffer("int32_t[]", _ints(flags_or, 4, "i"))
        if len(px) < n:
            _release_cdata(px)
            _raise_for_status(_RS_E_ARG, "batch_encode: too few per-record flags")
    res = _new("int64_t[2]")
    views = [] if px == _ffi.NULL else [px]
    try:
        o = _rw(out)
        views.append(o)
        bufs = [_ro(x) for x in (topic, bodies, b"" if a is None else a,
                                 b"" if b is None else b, frags, born_host, store_host)]
        views.extend(bufs)
        offs = [_offsets(body_off, n + 1, "body"), _offsets(a_off, n + 1, "first column"),
                _offsets(b_off, n + 1, "second column"), _offsets(frag_off, 4, "fragment")]
        views.extend(v for v in offs if v != _ffi.NULL)
        t, bo, av, bv, fr, bh, sh = bufs
        ro = _ffi.NULL
        if rows is not None:
            ro = _rw(rows, "rs_scan_rec[]")
            views.append(ro)
            if len(ro) < n - first:
                _raise_for_status(_RS_E_ARG, "batch_encode: too few rows")
        outs = [_ffi.NULL if x is None else _rw(x, "int64_t[]") for x in (phys, sizes)]
        views.extend(x for x in outs if x != _ffi.NULL)
        r = _lib.rs_batch_encode(o, len(o), pos, limit, t, len(t), queue_id, bo, len(bo),
                                 offs[0], av, len(av), offs[1], bv, len(bv), offs[2], fr,
                                 len(fr), offs[3], first, n, flag, sys_flag, px, born_timestamp,
                                 bh, len(bh), store_timestamp, sh, len(sh), queue_offset,
                                 phy_base, outs[0], outs[1], ro, tags_col, res, res + 1)
    finally:
        _release(*views)
    _check(r, "batch_encode")
    return res[0], res[1]


def column_join(items, text):
    # Per-item Python work with no C loop to hand it to: the reference implementation's.
    return _pure.column_join(items, text)



class GroupCommit:
    """SYNC_FLUSH's group commit waits over csrc/rs_gc.h, as the cext backend's GroupCommit
    (see rocketstore.kernels.contract): cffi drops the GIL for each call, so a wait sleeps
    without it and a sync wakes exactly the waits it covered. `_ffi` and `_lib` are class
    attributes so that the tests can run this wrapper over another build of csrc/rs_gc.c (its
    condition-variable branch)."""

    __slots__ = ("_cells", "_st", "_n", "gather_bytes")
    _ffi = _ffi
    _lib = _lib

    def __init__(self, flushed):
        n = self._lib.RS_GC_STATE_BYTES
        # int64_t cells: the state holds a mutex and pointers, and wants their alignment.
        self._cells = self._ffi.new("int64_t[]", n // 8)
        self._st = self._ffi.cast("uint8_t *", self._cells)
        self._n = n
        _check(self._lib.rs_gc_init(self._st, n, flushed), "GroupCommit")
        self.gather_bytes = (1 << 63) - 1     # gather at any size, until the owner bounds it

    def __del__(self):
        # No wait can be running: each holds a reference to this object.
        self._lib.rs_gc_destroy(self._st, self._n)

    def wait(self, offset, deadline_ns):
        r = self._lib.rs_gc_wait(self._st, self._n, offset, deadline_ns, self.gather_bytes)
        if r < 0:
            _check(r, "GroupCommit.wait")
        return r

    def try_lead(self):
        r = self._lib.rs_gc_try_lead(self._st, self._n)
        _check(r, "GroupCommit.try_lead")
        return r == 1

    def done(self, flushed, ok, sync_ns=0):
        n = self._lib.rs_gc_done(self._st, self._n, flushed, bool(ok), sync_ns)
        if n < 0:
            _check(n, "GroupCommit.done: the caller does not lead")
        return n

    def close(self):
        self._lib.rs_gc_close(self._st, self._n)

    def reset(self, flushed):
        if self._lib.rs_gc_reset(self._st, self._n, flushed) != 0:
            raise ValueError("a sync is running or a put waits: the durable offset cannot move")

    def _stat(self, i):
        out = self._ffi.new("int64_t[]", self._lib.RS_GC_ST_N)
        _check(self._lib.rs_gc_stats(self._st, self._n, out, self._lib.RS_GC_ST_N),
               "GroupCommit.stats")
        return out[i]

    flushed = property(lambda self: self._stat(self._lib.RS_GC_ST_FLUSHED))
    leading = property(lambda self: bool(self._stat(self._lib.RS_GC_ST_LEADER)))
    waiting = property(lambda self: self._stat(self._lib.RS_GC_ST_WAITING))
    producers = property(lambda self: self._stat(self._lib.RS_GC_ST_PRODUCERS))
    gathering = property(lambda self: bool(self._stat(self._lib.RS_GC_ST_GATHERING)))
    closed = property(lambda self: bool(self._stat(self._lib.RS_GC_ST_CLOSED)))
    relayed = property(lambda self: self._stat(self._lib.RS_GC_ST_RELAYED))

    @property
    def gather_ns(self):
        return self._stat(self._lib.RS_GC_ST_GATHER_NS)

    @gather_ns.setter
    def gather_ns(self, ns):
        _check(self._lib.rs_gc_set_gather_ns(self._st, self._n, ns), "GroupCommit.gather_ns")
