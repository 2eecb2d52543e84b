# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: cdivision=True
"""Cython kernel backend over csrc/: the surface of rocketstore.kernels.contract, NAME = "cext".

Byte buffers go through the buffer protocol directly (PyObject_GetBuffer, PyBUF_SIMPLE) rather
than typed `unsigned char[::1]` memoryviews.  Both accept bytes, bytearray, memoryview slices,
numpy arrays and mmap objects without a copy and both refuse non-contiguous buffers, but a
typed memoryview builds a Cython memoryview object per argument: measured ~50 ns each, so
msg_encode's six buffers cost more than its work.  A raw Py_buffer costs a few ns, and `bytes`
skips even that.  Integer arrays (batch arguments) are typed memoryviews, as the style guide says.
"""
from cpython.buffer cimport (PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release,
                             PyObject_GetBuffer)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.ref cimport PyObject
from cpython.weakref cimport PyWeakref_GET_OBJECT, PyWeakref_NewRef
cimport cython
from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from csrc cimport *

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object text, Py_ssize_t *size) except NULL
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void *PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)

from array import array as _array
from _thread import allocate_lock as _ThreadLock
from os import fsencode as _os_fsencode

from rocketstore.errors import raise_for_status as _raise_for_status
from rocketstore.format import OS_PAGE_SIZE as _OS_PAGE_SIZE, SCAN_DTYPE as _SCAN_DTYPE

# The page a flush counts dirty pages in (MappedFile.is_able_to_flush).
cdef int64_t _PAGE = _OS_PAGE_SIZE

NAME = "cext"

__all__ = ("NAME", "crc32", "java_hash", "msg_size", "msg_encode", "commitlog_append",
           "commitlog_append_batch", "commitlog_blank", "commitlog_scan", "cq_encode",
           "cq_encode_batch", "cq_search", "tags_match", "index_hash", "index_put",
           "index_put_batch", "index_keys", "index_lookup", "sync_range", "sync_written",
           "write_behind",
           "space_prepare", "batch_encode", "column_join", "batch_columns", "timeup_encode",
           "SYNC_RANGE_FD_UNUSED")

# GIL release thresholds.  Releasing and re-taking an uncontended GIL costs ~50-100 ns: it pays
# once the kernel runs for microseconds.  CRC-32 runs at >10 GB/s here, so 4 KiB of CRC is
# still well under a microsecond; zlib.crc32 itself releases above 5 KiB.
DEF NOGIL_CRC_BYTES = 4096
# A plain copy runs at tens of GB/s: only large records are worth it.
DEF NOGIL_COPY_BYTES = 65536
DEF SCAN_REC_SIZE = 112


# Every Py_buffer starts zeroed (view.obj == NULL), so a `finally` may PyBuffer_Release all of
# them whichever were acquired: release is a no-op on a NULL obj.

cdef inline int _ro(object obj, Py_buffer *view) except -1:
    """Borrow a read-only C-contiguous view; bytes (the common case) without the protocol,
    leaving view.obj NULL because there is nothing to release."""
    if type(obj) is bytes:
        view.buf = PyBytes_AS_STRING(obj)
        view.len = PyBytes_GET_SIZE(obj)
        return 0
    PyObject_GetBuffer(obj, view, PyBUF_SIMPLE)
    return 0


cdef inline int _rw(object obj, Py_buffer *view) except -1:
    PyObject_GetBuffer(obj, view, PyBUF_WRITABLE)
    return 0


cdef inline int _check(int code, str what) except -1:
    if code < 0:
        _raise_for_status(code, what)
    return code


cdef object _as_array(object seq, str typecode):
    """Fallback for batch arguments that are not C-contiguous arrays of the exact type (lists,
    other numpy dtypes): one converted copy, as numpy.asarray does in the pure backend."""
    return _array(typecode, seq)


cdef const int64_t[::1] _i64s(object seq):
    """`seq` as contiguous int64s: itself when it already is one, else one converted copy."""
    cdef const int64_t[::1] m
    try:
        m = seq
    except (TypeError, ValueError, BufferError):
        m = _as_array(seq, "q")
    return m


cdef const int32_t[::1] _i32s(object seq):
    """`seq` as contiguous int32s, as _i64s."""
    cdef const int32_t[::1] m
    try:
        m = seq
    except (TypeError, ValueError, BufferError):
        m = _as_array(seq, "i")
    return m


def crc32(data, value=0):
    """zlib.crc32(data, value): IEEE CRC-32, unsigned."""
    cdef Py_buffer v
    cdef uint32_t c = 0 if value == 0 else <uint32_t>(<unsigned long long>(value & 0xFFFFFFFF))
    memset(&v, 0, sizeof(v))
    _ro(data, &v)
    try:
        if v.len > NOGIL_CRC_BYTES:
            with nogil:
                c = rs_crc32(c, <const uint8_t *>v.buf, <size_t>v.len)
        else:
            c = rs_crc32(c, <const uint8_t *>v.buf, <size_t>v.len)
    finally:
        PyBuffer_Release(&v)
    return c


def java_hash(data):
    """Java String.hashCode of the UTF-8 text `data` (signed int32)."""
    cdef Py_buffer v
    cdef int32_t h = 0
    memset(&v, 0, sizeof(v))
    _ro(data, &v)
    try:
        rs_java_hash(<const uint8_t *>v.buf, <size_t>v.len, &h)
    finally:
        PyBuffer_Release(&v)
    return h


def msg_size(int32_t sys_flag, int64_t body_len, int64_t topic_len, int64_t props_len,
             bint v2=False):
    """TOTALSIZE of a record (calMsgLength)."""
    return _check(rs_msg_size(sys_flag, body_len, topic_len, props_len, v2), "msg_size")


cdef inline int _encode(Py_buffer *v, int64_t pos, int32_t queue_id, int32_t flag,
                        int64_t queue_offset, int64_t phy_offset, int32_t sys_flag,
                        int64_t born_timestamp, int64_t store_timestamp, int32_t reconsume_times,
                        int64_t prepared_tx_offset, bint v2) noexcept nogil:
    # v = out, topic, body, props, born_host, store_host
    return rs_msg_encode(<uint8_t *>v[0].buf, <size_t>v[0].len, pos,
                         <const uint8_t *>v[1].buf, <size_t>v[1].len,
                         <const uint8_t *>v[2].buf, <size_t>v[2].len,
                         <const uint8_t *>v[3].buf, <size_t>v[3].len,
                         queue_id, flag, queue_offset, phy_offset, sys_flag, born_timestamp,
                         <const uint8_t *>v[4].buf, <size_t>v[4].len, store_timestamp,
                         <const uint8_t *>v[5].buf, <size_t>v[5].len,
                         reconsume_times, prepared_tx_offset, v2)


def msg_encode(out, int64_t pos, topic, body, props, int32_t queue_id, int32_t flag,
               int64_t queue_offset, int64_t phy_offset, int32_t sys_flag,
               int64_t born_timestamp, born_host, int64_t store_timestamp, store_host,
               int32_t reconsume_times, int64_t prepared_tx_offset, bint v2=False):
    """Encode one CommitLog record at out[pos:] (MessageExtEncoder#encode); returns its size."""
    cdef Py_buffer v[6]
    cdef int r
    memset(v, 0, sizeof(v))
    try:
        _rw(out, &v[0])
        _ro(topic, &v[1])
        _ro(body, &v[2])
        _ro(props, &v[3])
        _ro(born_host, &v[4])
        _ro(store_host, &v[5])
        if v[2].len > NOGIL_CRC_BYTES:
            with nogil:
                r = _encode(v, pos, queue_id, flag, queue_offset, phy_offset, sys_flag,
                            born_timestamp, store_timestamp, reconsume_times,
                            prepared_tx_offset, v2)
        else:
            r = _encode(v, pos, queue_id, flag, queue_offset, phy_offset, sys_flag,
                        born_timestamp, store_timestamp, reconsume_times, prepared_tx_offset, v2)
    finally:
        for i in range(6):
            PyBuffer_Release(&v[i])
    return _check(r, "msg_encode")


def commitlog_append(out, int64_t pos, record, int64_t queue_offset, int64_t phy_offset,
                     int64_t store_timestamp):
    """Copy one encoded record to out[pos:], patching QUEUEOFFSET, PHYSICALOFFSET and
    STORETIMESTAMP (DefaultAppendMessageCallback#doAppend); returns its size."""
    cdef Py_buffer o, rec
    cdef int r
    memset(&o, 0, sizeof(o))
    memset(&rec, 0, sizeof(rec))
    try:
        _rw(out, &o)
        _ro(record, &rec)
        if rec.len > NOGIL_COPY_BYTES:
            with nogil:
                r = rs_commitlog_append(<uint8_t *>o.buf, <size_t>o.len, pos,
                                        <const uint8_t *>rec.buf, <size_t>rec.len,
                                        queue_offset, phy_offset, store_timestamp)
        else:
            r = rs_commitlog_append(<uint8_t *>o.buf, <size_t>o.len, pos,
                                    <const uint8_t *>rec.buf, <size_t>rec.len,
                                    queue_offset, phy_offset, store_timestamp)
    finally:
        PyBuffer_Release(&o)
        PyBuffer_Release(&rec)
    return _check(r, "commitlog_append")


def commitlog_append_batch(out, int64_t pos, int64_t limit, records, queue_offsets,
                           int64_t phy_base, int64_t store_timestamp):
    """Append whole records while each leaves 8 bytes before `limit`; returns (count, bytes)."""
    cdef Py_buffer o, recs
    cdef const int64_t[::1] qo
    cdef int64_t count = 0, nbytes = 0
    cdef int r
    qo = _i64s(queue_offsets)
    memset(&o, 0, sizeof(o))
    memset(&recs, 0, sizeof(recs))
    try:
        _rw(out, &o)
        _ro(records, &recs)
        with nogil:
            r = rs_commitlog_append_batch(<uint8_t *>o.buf, <size_t>o.len, pos, limit,
                                          <const uint8_t *>recs.buf, <size_t>recs.len,
                                          &qo[0] if qo.shape[0] else NULL, <size_t>qo.shape[0],
                                          phy_base, store_timestamp, &count, &nbytes)
    finally:
        PyBuffer_Release(&o)
        PyBuffer_Release(&recs)
    _check(r, "commitlog_append_batch")
    return count, nbytes


def commitlog_blank(out, int64_t pos, int32_t size):
    """Write the 8-byte END_OF_FILE marker (size, BLANK magic); returns 8."""
    cdef Py_buffer o
    cdef int r
    _rw(out, &o)
    r = rs_commitlog_blank(<uint8_t *>o.buf, <size_t>o.len, pos, size)
    PyBuffer_Release(&o)
    return _check(r, "commitlog_blank")


def commitlog_scan(buf, int64_t start, int64_t end, bint check_crc, out):
    """Validate records in buf[start:end] into SCAN_DTYPE rows of `out`;
    returns (count, stop_pos, reason, stop_size).  Bad data is a reason, never an exception."""
    cdef Py_buffer b, o
    cdef int64_t count = 0, stop_pos = 0
    cdef int32_t reason = 0, stop_size = 0
    cdef int r
    memset(&b, 0, sizeof(b))
    memset(&o, 0, sizeof(o))
    try:
        _ro(buf, &b)
        # The reference checks bounds before the output's type: keep that order.
        if start < 0 or end > b.len or start > end:
            _raise_for_status(RS_E_BOUNDS, "commitlog_scan")
        dtype = getattr(out, "dtype", None)
        if dtype is not None and dtype != _SCAN_DTYPE:
            _raise_for_status(RS_E_ARG, "commitlog_scan: out must be a SCAN_DTYPE array")
        _rw(out, &o)
        with nogil:
            r = rs_commitlog_scan(<const uint8_t *>b.buf, <size_t>b.len, start, end, check_crc,
                                  <rs_scan_rec *>o.buf, o.len // SCAN_REC_SIZE,
                                  &count, &stop_pos, &reason, &stop_size)
    finally:
        PyBuffer_Release(&b)
        PyBuffer_Release(&o)
    _check(r, "commitlog_scan")
    return count, stop_pos, reason, stop_size


def cq_encode(out, int64_t pos, int64_t offset, int32_t size, int64_t tags_code):
    """Write one 20-byte ConsumeQueue unit at out[pos:]; returns 20.  Keeps the GIL: the work
    is smaller than a release."""
    cdef Py_buffer o
    cdef int r
    _rw(out, &o)
    r = rs_cq_encode(<uint8_t *>o.buf, <size_t>o.len, pos, offset, size, tags_code)
    PyBuffer_Release(&o)
    return _check(r, "cq_encode")


def cq_encode_batch(out, int64_t pos, offsets, sizes, tags_codes):
    """Write len(offsets) units (int64, int32, int64 arrays) from out[pos:]; returns bytes."""
    cdef Py_buffer o
    cdef const int64_t[::1] off
    cdef const int32_t[::1] siz
    cdef const int64_t[::1] tag
    cdef int64_t nbytes = 0
    cdef Py_ssize_t n
    cdef int r
    if not (len(offsets) == len(sizes) == len(tags_codes)):
        _raise_for_status(RS_E_ARG, "cq_encode_batch: arrays differ in length")
    off = _i64s(offsets)
    siz = _i32s(sizes)
    tag = _i64s(tags_codes)
    n = off.shape[0]
    _rw(out, &o)
    try:
        with nogil:
            r = rs_cq_encode_batch(<uint8_t *>o.buf, <size_t>o.len, pos,
                                   &off[0] if n else NULL, &siz[0] if n else NULL,
                                   &tag[0] if n else NULL, <size_t>n, &nbytes)
    finally:
        PyBuffer_Release(&o)
    _check(r, "cq_encode_batch")
    return nbytes


def cq_search(buf, int64_t start, int64_t end, int64_t phy_offset):
    """Index (relative to start) of the first unit in buf[start:end] whose offset >= phy_offset,
    numpy.searchsorted(side="left") over the units; O(log n), so the GIL stays."""
    cdef Py_buffer b
    cdef int64_t index = 0
    cdef int r
    memset(&b, 0, sizeof(b))
    _ro(buf, &b)
    r = rs_cq_search(<const uint8_t *>b.buf, <size_t>b.len, start, end, phy_offset, &index)
    PyBuffer_Release(&b)
    _check(r, "cq_search")
    return index


def tags_match(props, tags, ends):
    """Whether the TAGS value of the properties string `props` is one of the UTF-8 strings
    tags[ends[i-1]:ends[i]] (`ends`: int64, ascending): a tag subscription's string check."""
    cdef Py_buffer p, t
    cdef const int64_t[::1] e = _i64s(ends)
    cdef Py_ssize_t n = e.shape[0]
    cdef int r
    memset(&p, 0, sizeof(p))
    memset(&t, 0, sizeof(t))
    try:
        _ro(props, &p)
        _ro(tags, &t)
        r = rs_tags_match(<const uint8_t *>p.buf, <size_t>p.len, <const uint8_t *>t.buf,
                          <size_t>t.len, &e[0] if n else NULL, <size_t>n)
    finally:
        PyBuffer_Release(&p)
        PyBuffer_Release(&t)
    return _check(r, "tags_match") == 1


def index_hash(key):
    """IndexFile key hash: abs(String.hashCode) of the UTF-8 key, Integer.MIN_VALUE -> 0."""
    cdef Py_buffer v
    cdef int32_t h = 0
    memset(&v, 0, sizeof(v))
    _ro(key, &v)
    try:
        rs_index_hash(<const uint8_t *>v.buf, <size_t>v.len, &h)
    finally:
        PyBuffer_Release(&v)
    return h


def index_put(buf, int32_t slot_num, int32_t index_num, int32_t key_hash, int64_t phy_offset,
              int64_t store_timestamp):
    """IndexFile#putKey into a whole index file; the new indexCount, or 0 when full.  A fixed
    handful of loads and stores: keeps the GIL."""
    cdef Py_buffer b
    cdef int r
    _rw(buf, &b)
    r = rs_index_put(<uint8_t *>b.buf, <size_t>b.len, slot_num, index_num, key_hash, phy_offset,
                     store_timestamp)
    PyBuffer_Release(&b)
    return _check(r, "index_put")


def index_put_batch(buf, int32_t slot_num, int32_t index_num, key_hashes, phy_offsets,
                    store_timestamps):
    """index_put for each key in order until the file is full; returns the keys put."""
    cdef Py_buffer b
    cdef const int32_t[::1] kh
    cdef const int64_t[::1] po
    cdef const int64_t[::1] ts
    cdef int64_t count = 0
    cdef Py_ssize_t n
    cdef int r
    if not (len(key_hashes) == len(phy_offsets) == len(store_timestamps)):
        _raise_for_status(RS_E_ARG, "index_put_batch: arrays differ in length")
    kh = _i32s(key_hashes)
    po = _i64s(phy_offsets)
    ts = _i64s(store_timestamps)
    n = kh.shape[0]
    _rw(buf, &b)
    try:
        with nogil:
            r = rs_index_put_batch(<uint8_t *>b.buf, <size_t>b.len, slot_num, index_num,
                                   &kh[0] if n else NULL, &po[0] if n else NULL,
                                   &ts[0] if n else NULL, <size_t>n, &count)
    finally:
        PyBuffer_Release(&b)
    _check(r, "index_put_batch")
    return count


def index_keys(buf, rows, out_hashes, out_rows):
    """Index key hashes of scanned records (IndexService#buildIndex): for each SCAN_DTYPE row
    of `rows`, topic#UNIQ_KEY then topic#each KEYS piece, skipping ROLLBACK records, into
    out_hashes / out_rows (int32).  Returns (keys written, rows consumed)."""
    cdef Py_buffer b, rv
    cdef int32_t[::1] oh = out_hashes
    cdef int32_t[::1] orow = out_rows
    cdef size_t count = 0, done = 0
    cdef size_t cap = min(oh.shape[0], orow.shape[0])
    cdef int r
    dtype = getattr(rows, "dtype", None)
    if dtype is not None and dtype != _SCAN_DTYPE:
        _raise_for_status(RS_E_ARG, "index_keys: rows must be a SCAN_DTYPE array")
    memset(&b, 0, sizeof(b))
    memset(&rv, 0, sizeof(rv))
    try:
        _ro(buf, &b)
        _ro(rows, &rv)
        with nogil:
            r = rs_index_keys(<const uint8_t *>b.buf, <size_t>b.len,
                              <const rs_scan_rec *>rv.buf, <size_t>(rv.len // SCAN_REC_SIZE),
                              &oh[0] if cap else NULL, &orow[0] if cap else NULL, cap,
                              &count, &done)
    finally:
        PyBuffer_Release(&b)
        PyBuffer_Release(&rv)
    _check(r, "index_keys")
    return count, done


def index_lookup(buf, int32_t slot_num, int32_t index_num, int32_t key_hash, int64_t begin,
                 int64_t end, int64_t max_num, out_offsets):
    """IndexFile#selectPhyOffset: phyOffsets of key_hash's entries in [begin, end], newest
    first, into out_offsets (int64); returns how many (<= max_num, <= len(out_offsets))."""
    cdef Py_buffer b
    cdef int64_t[::1] out = out_offsets
    cdef int64_t count = 0
    cdef int64_t cap = out.shape[0]
    cdef int r
    if max_num < cap:
        cap = max_num if max_num > 0 else 0
    memset(&b, 0, sizeof(b))
    _ro(buf, &b)
    try:
        # Keeps the GIL: a chain is a few hops (slots outnumber keys per file), and giving the
        # GIL up for a microsecond lets any other thread hold it for a whole switch interval.
        r = rs_index_lookup(<const uint8_t *>b.buf, <size_t>b.len, slot_num, index_num,
                            key_hash, begin, end, &out[0] if out.shape[0] else NULL, cap,
                            &count)
    finally:
        PyBuffer_Release(&b)
    _check(r, "index_lookup")
    return count


# sync_range msyncs the mapping: FileSystem.sync_mapped need not open the file for it.
SYNC_RANGE_FD_UNUSED = True


def sync_range(buf, int fd, int64_t start, int64_t length):
    """msync(MS_SYNC) buf[start:start+length] of a writable mmap, without the GIL.  `fd` is
    part of the contract for the pure backend's fdatasync; a mapping needs only its address."""
    _sync_mapping(buf, start, length, False, "sync_range")


def sync_written(buf, int64_t start, int64_t length, bint drop):
    """msync(MS_SYNC) buf[start:start+length] of a writable mmap, with `drop` first taking the
    range's whole pages below the one holding its end off the page tables (rs_sync_written):
    one release of the GIL for both."""
    _sync_mapping(buf, start, length, drop, "sync_written")


def write_behind(int fd, int64_t start, int64_t length, int64_t chunk):
    """Write [start, start+length) of the file open as `fd` back, `chunk` bytes at a time, and
    wait for it, without the GIL and without making it durable (rs_write_behind). True once
    written; False where the system has no way to (nothing written)."""
    cdef int r
    with nogil:
        r = rs_write_behind(fd, start, length, chunk)
    return _check(r, "write_behind") != RS_WRITE_BEHIND_NONE


cdef int _sync_mapping(buf, int64_t start, int64_t length, bint drop, str what) except -1:
    # rs_sync_written without `drop` is rs_sync_range.
    cdef Py_buffer b
    cdef int r
    memset(&b, 0, sizeof(b))
    _ro(buf, &b)
    try:
        with nogil:
            r = rs_sync_written(<const uint8_t *>b.buf, <size_t>b.len, start, length, drop)
    finally:
        PyBuffer_Release(&b)
    _check(r, what)
    return 0


def space_prepare(requests):
    """Reserve and populate for many files in one release of the GIL (rs_space_prepare).
    `requests`: a list of (path, offset, length, map, pop_start, pop_length); path None or
    length 0 reserves nothing, map None or pop_length 0 populates nothing, and the populate
    range is clipped to the mapping. A map that cannot be borrowed writable (closed
    meanwhile) is not populated. Returns a list of errno values, 0 where the reservation (if
    any) succeeded; each populate is a hint and reports nothing."""
    cdef Py_ssize_t n = len(requests), i
    cdef rs_space_req *reqs
    cdef Py_buffer *views
    cdef int64_t offset, length, pop_start, pop_length
    paths = [None] * n
    reqs = <rs_space_req *>PyMem_Calloc(n or 1, sizeof(rs_space_req))
    views = <Py_buffer *>PyMem_Calloc(n or 1, sizeof(Py_buffer))
    if reqs == NULL or views == NULL:
        PyMem_Free(reqs)
        PyMem_Free(views)
        raise MemoryError()
    try:
        for i in range(n):
            path, offset, length, mm, pop_start, pop_length = requests[i]
            if offset < 0 or length < 0 or pop_start < 0 or pop_length < 0:
                _raise_for_status(RS_E_ARG, "space_prepare")
            if path is not None and length > 0:
                p = _os_fsencode(path)
                if b"\0" in p:
                    raise ValueError("space_prepare: embedded null byte in a path")
                paths[i] = p
                reqs[i].path = PyBytes_AS_STRING(p)
                reqs[i].offset = offset
                reqs[i].length = length
            if mm is not None and pop_length > 0:
                try:
                    PyObject_GetBuffer(mm, &views[i], PyBUF_WRITABLE)
                except (ValueError, BufferError, TypeError):
                    continue                    # closed meanwhile: nothing to populate
                if pop_start < views[i].len:
                    reqs[i].map = <uint8_t *>views[i].buf
                    reqs[i].map_len = <size_t>views[i].len
                    reqs[i].pop_start = pop_start
                    reqs[i].pop_length = min(pop_length, views[i].len - pop_start)
        with nogil:
            rs_space_prepare(reqs, <size_t>n)
        return [_space_errno(reqs[i].result) for i in range(n)]
    finally:
        for i in range(n):
            if views[i].buf != NULL:          # borrowed above (a failed borrow sets none)
                PyBuffer_Release(&views[i])
        PyMem_Free(reqs)
        PyMem_Free(views)


cdef int _space_errno(int32_t result) except -1:
    if result == RS_OK:
        return 0
    if result <= RS_E_ERRNO_BASE:
        return RS_E_ERRNO_BASE - result
    _raise_for_status(result, "space_prepare")    # an argument C refused: checked above
    return -1


# ---- columnar batch (MessageStore.put_batch) -----------------------------------------------

cdef const int64_t[::1] _offsets(object off, int64_t need):
    """The int64 offsets array `off`, checked to hold `need` (>= 1) entries: the kernel reads
    offsets up to index n and has no length for them."""
    cdef const int64_t[::1] m
    m = _i64s(off)
    if m.shape[0] < need:
        _raise_for_status(RS_E_ARG, "batch_encode: too few offsets")
    return m


cdef int64_t[::1] _out64(object arr, Py_ssize_t need, str what):
    """An output column of batch_encode: a writable, contiguous int64 array of `need` items
    at least."""
    cdef int64_t[::1] v
    try:
        v = arr
    except (TypeError, ValueError, BufferError):
        raise TypeError(f"batch_encode: {what} must be a writable, contiguous int64 array") \
            from None
    if v.shape[0] < need:
        _raise_for_status(RS_E_ARG, f"batch_encode: too little room in {what}")
    return v


def batch_encode(out, int64_t pos, int64_t limit, topic, int32_t queue_id, bodies, body_off,
                 a, a_off, b, b_off, frags, frag_off, int64_t first, int64_t n, int32_t flag,
                 int32_t sys_flag, int64_t born_timestamp, born_host, int64_t store_timestamp,
                 store_host, int64_t queue_offset, int64_t phy_base, flags_or=None,
                 rows=None, int32_t tags_col=-1, phys=None, sizes=None):
    """Encode records first..n-1 of a column batch at out[pos:limit] while each leaves 8
    bytes for the blank (rs_batch_encode); returns (count, bytes).  The loop runs without
    the GIL: the columns are plain buffers, borrowed for the call.  `rows` (SCAN_DTYPE, room
    for n - first): each record's scan row, made as it is written, with `tags_col` saying
    where TAGS lies (rs_batch_encode).  `phys`, `sizes` (int64, room for n - first): each
    record's physical offset and length, as it is written."""
    cdef Py_buffer v[9]
    cdef int64_t[::1] kp, ks
    cdef int64_t *pp = NULL
    cdef int64_t *ps = NULL
    cdef rs_scan_rec *pr = NULL
    cdef const int32_t[::1] kx
    cdef const int32_t *px = NULL
    cdef const int64_t[::1] ko, ka, kb, kf
    cdef const int64_t *po
    cdef const int64_t *pa = NULL
    cdef const int64_t *pb = NULL
    cdef const int64_t *pf
    cdef int64_t count = 0, nbytes = 0
    cdef int r
    if n < 0 or first < 0 or first > n:
        _raise_for_status(RS_E_ARG, "batch_encode: bad record range")
    ko = _offsets(body_off, n + 1)
    po = &ko[0]
    kf = _offsets(frag_off, 4)
    pf = &kf[0]
    if a_off is not None:
        ka = _offsets(a_off, n + 1)
        pa = &ka[0]
    if b_off is not None:
        kb = _offsets(b_off, n + 1)
        pb = &kb[0]
    if flags_or is not None:
        try:
            kx = flags_or
        except (TypeError, ValueError, BufferError):
            kx = _as_array(flags_or, "i")
        if kx.shape[0] < n:
            _raise_for_status(RS_E_ARG, "batch_encode: too few per-record flags")
        if n > 0:
            px = &kx[0]
    if phys is not None:
        kp = _out64(phys, n - first, "phys")
        pp = &kp[0] if n > first else NULL
    if sizes is not None:
        ks = _out64(sizes, n - first, "sizes")
        ps = &ks[0] if n > first else NULL
    memset(v, 0, sizeof(v))
    try:
        if rows is not None:
            dtype = getattr(rows, "dtype", None)
            if dtype is not None and dtype != _SCAN_DTYPE:
                _raise_for_status(RS_E_ARG, "batch_encode: rows must be a SCAN_DTYPE array")
            _rw(rows, &v[8])
            if v[8].len // SCAN_REC_SIZE < n - first:
                _raise_for_status(RS_E_ARG, "batch_encode: too few rows")
            pr = <rs_scan_rec *>v[8].buf
        _rw(out, &v[0])
        _ro(topic, &v[1])
        _ro(bodies, &v[2])
        _ro(b"" if a is None else a, &v[3])
        _ro(b"" if b is None else b, &v[4])
        _ro(frags, &v[5])
        _ro(born_host, &v[6])
        _ro(store_host, &v[7])
        with nogil:
            r = rs_batch_encode(<uint8_t *>v[0].buf, <size_t>v[0].len, pos, limit,
                                <const uint8_t *>v[1].buf, <size_t>v[1].len, queue_id,
                                <const uint8_t *>v[2].buf, <size_t>v[2].len, po,
                                <const uint8_t *>v[3].buf, <size_t>v[3].len, pa,
                                <const uint8_t *>v[4].buf, <size_t>v[4].len, pb,
                                <const uint8_t *>v[5].buf, <size_t>v[5].len, pf,
                                first, n, flag, sys_flag, px, born_timestamp,
                                <const uint8_t *>v[6].buf, <size_t>v[6].len, store_timestamp,
                                <const uint8_t *>v[7].buf, <size_t>v[7].len,
                                queue_offset, phy_base, pp, ps, pr, tags_col, &count,
                                &nbytes)
    finally:
        for i in range(9):
            PyBuffer_Release(&v[i])
    _check(r, "batch_encode")
    return count, nbytes


def column_join(items, bint text):
    """A list of bytes, None (empty) and, if `text`, str (as UTF-8) as one buffer and its
    n + 1 int64 offsets (an array('q')): (data, offsets), or None when an item is of another
    type, for the caller's general path.  One pass for lengths, one memcpy each: no per-item
    object."""
    cdef Py_ssize_t n, i, size, total = 0
    cdef PyObject *item
    cdef const char *src
    cdef int64_t[::1] off
    cdef char *dst
    if type(items) is not list:
        return None
    n = PyList_GET_SIZE(items)
    offsets = _array("q", bytes(8 * (n + 1)))
    off = offsets
    for i in range(n):
        item = PyList_GET_ITEM(items, i)
        if type(<object>item) is bytes:
            total += PyBytes_GET_SIZE(<object>item)
        elif text and type(<object>item) is str:
            if PyUnicode_IS_COMPACT_ASCII(<object>item):     # its bytes are its UTF-8
                total += PyUnicode_GET_LENGTH(<object>item)
            else:
                PyUnicode_AsUTF8AndSize(<object>item, &size)   # cached in the str for pass two
                total += size
        elif <object>item is not None:
            return None
        off[i + 1] = total
    data = PyBytes_FromStringAndSize(NULL, total)
    dst = PyBytes_AS_STRING(data)
    for i in range(n):
        item = PyList_GET_ITEM(items, i)
        size = off[i + 1] - off[i]
        if size:
            if type(<object>item) is bytes:
                src = PyBytes_AS_STRING(<object>item)
            elif PyUnicode_IS_COMPACT_ASCII(<object>item):
                src = <const char *>PyUnicode_DATA(<object>item)
            else:
                src = PyUnicode_AsUTF8AndSize(<object>item, &size)
            memcpy(dst + off[i], src, size)
    return data, offsets


include "_mapping.pxi"
include "_put.pxi"
include "_columns.pxi"
include "_read.pxi"


include "_cq_dispatch.pxi"
include "_reput.pxi"
include "_query.pxi"
include "_gc.pxi"


# ---- index dispatch (the reput thread's other hot loop) ------------------------------------

__all__ += ("index_dispatch",)


def index_dispatch(rows, buf, f, int64_t skip, slow):
    """IndexService#buildIndex for the scanned `rows` (format.SCAN_DTYPE) of `buf`, starting in
    the IndexFile `f`, the first `skip` keys of row 0 being in already.

    The rows' keys are found, hashed and put by rs_index_dispatch without the GIL, straight
    into the file's mapping. Where a row cannot go on in the file (it is full, or its next
    entry lies past its refill_position), `slow(f, row)` returns the file to go on in: a new
    one, or `f` with its next entry reserved; then the loop resumes at that row and key. The
    mapping is borrowed as a buffer for each GIL-free run, so it cannot be closed under it."""
    cdef Py_buffer rv, b, iv
    cdef size_t row = 0, nrows, sk
    cdef int32_t stop = RS_INDEX_STOP_NONE
    cdef int64_t limit, asked = -1
    cdef int32_t slot_num, index_num
    cdef int r
    if skip < 0:
        _raise_for_status(RS_E_ARG, "index_dispatch: negative skip")
    sk = <size_t>skip
    dtype = getattr(rows, "dtype", None)
    if dtype is not None and dtype != _SCAN_DTYPE:
        _raise_for_status(RS_E_ARG, "index_dispatch: rows must be a SCAN_DTYPE array")
    memset(&rv, 0, sizeof(rv))
    memset(&b, 0, sizeof(b))
    try:
        _ro(rows, &rv)
        _ro(buf, &b)
        nrows = <size_t>(rv.len // SCAN_REC_SIZE)
        while True:
            slot_num = f.slot_num
            index_num = f.index_num
            # Entries go below refill_position (the reserved end, or a lead before it when
            # a populator fills windows ahead); past it `slow` asks for more. Having asked
            # at `asked`, the loop writes on up to reserved_position if refill_position is
            # not past that: a populator serving an older request late sets it a lead
            # before that request's window, which may lie below where this writer stands.
            limit = f.mf.refill_position
            if limit <= asked:
                limit = f.mf.reserved_position
            memset(&iv, 0, sizeof(iv))
            _rw(f.mm, &iv)
            try:
                with nogil:
                    r = rs_index_dispatch(<uint8_t *>iv.buf, <size_t>iv.len, slot_num,
                                          index_num, limit, <const uint8_t *>b.buf,
                                          <size_t>b.len, <const rs_scan_rec *>rv.buf, nrows,
                                          &row, &sk, &stop)
            finally:
                PyBuffer_Release(&iv)
            _check(r, "index_dispatch")
            if stop == RS_INDEX_STOP_NONE:
                return
            g = slow(f, row)
            # reserved_position only grows (under the file's reserve lock): `slow` has
            # reserved the next entry, or it failed.
            if g is f and f.mf.reserved_position <= limit:
                raise RuntimeError(f"index_dispatch: no room made in {f!r} for row {row}")
            asked = limit if g is f else -1
            f = g
    finally:
        PyBuffer_Release(&b)
        PyBuffer_Release(&rv)


def timeup_encode(src, const int64_t[::1] rec_pos, const int32_t[::1] rec_size, int64_t first,
                  int64_t n, topics, const int64_t[::1] topic_off, int64_t max_body,
                  int64_t max_record, out, int64_t out_pos, int32_t[::1] out_size,
                  int64_t[::1] out_key):
    """Delivered records of scheduled ones, first..n-1, encoded at out[out_pos:] in the common
    case (rs_timeup_encode; services/schedule.py holds the rules). Not part of the kernel
    contract: the schedule service's batch path on this backend. Returns (reason, stopped at,
    end of what was written, (REAL_TOPIC offset in src, length) for RS_TIMEUP_TOPIC)."""
    cdef Py_buffer v[3]
    cdef int64_t done = first, nbytes = out_pos
    cdef int64_t topic_at[2]
    cdef int64_t n_topics = topic_off.shape[0] - 1
    cdef int r
    if first < 0 or n < first or n > rec_pos.shape[0] or n > rec_size.shape[0] or \
            n > out_size.shape[0] or n > out_key.shape[0] or n_topics < 0:
        _raise_for_status(RS_E_ARG, "timeup_encode: bad record range")
    topic_at[0] = topic_at[1] = 0
    memset(v, 0, sizeof(v))
    try:
        _ro(src, &v[0])
        _ro(topics, &v[1])
        _rw(out, &v[2])
        with nogil:
            r = rs_timeup_encode(<const uint8_t *>v[0].buf, <size_t>v[0].len,
                                 &rec_pos[0] if rec_pos.shape[0] else NULL,
                                 &rec_size[0] if rec_size.shape[0] else NULL, first, n,
                                 <const uint8_t *>v[1].buf, <size_t>v[1].len, &topic_off[0],
                                 n_topics, max_body, max_record,
                                 <uint8_t *>v[2].buf, <size_t>v[2].len,
                                 &out_size[0] if out_size.shape[0] else NULL,
                                 &out_key[0] if out_key.shape[0] else NULL,
                                 &done, &nbytes, topic_at)
    finally:
        for i in range(3):
            PyBuffer_Release(&v[i])
    if r < 0:
        _check(r, "timeup_encode")
    return r, done, nbytes, (topic_at[0], topic_at[1])
