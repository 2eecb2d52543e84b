# SPDX-License-Identifier: Apache-2.0
# ReadPath: MessageStore.get_message's unit walk as one compiled call (included by _cext.pyx).
#
# read_path.PyReadPath is the reference for every backend; this class walks the same units in
# the same order and gives the same results. The ConsumeQueue's units are read where they lie
# in its mapping (the queue's tail is never copied, so a call costs the same whatever the
# backlog), each unit's record is validated by rs_msg_check_read where it lies in its CommitLog
# file, and the call either builds the MessageExt objects (get_message) or copies the kernel's
# rows out (get_batch, whose bodies stay in the mapping).
#
# MessageExt and MappedFile are __slots__ classes: their members are read and written at the
# offsets their member descriptors give (_member / _set_member, as PutPath does). Every mapping
# is borrowed as a buffer while its bytes are read, so a file closed meanwhile (cleaning) is
# seen as removed instead of being read after munmap. The GIL is held throughout: the walk
# makes Python objects per record (get_message) or calls hold() per file and the filter per
# unit, and a pull of 32 costs less than releasing it twice; a get_batch of tens of thousands
# holds it for milliseconds.
from cpython.bytearray cimport PyByteArray_FromStringAndSize
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from libc.limits cimport LLONG_MAX
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.mem cimport PyMem_Free, PyMem_Realloc

__all__ += ("ReadPath", "LazyField", "install_dealloc")

# The slots a read fills (message.MessageExt): those that cost no new object, the record's
# bytes, and the properties' caches. The other fields are read from _rec on first use.
_EXT_SLOTS = ("store_size", "queue_id", "flag", "sys_flag", "born_host_raw", "store_timestamp",
              "store_host_raw", "reconsume_times", "prepared_transaction_offset", "topic",
              "magic", "_rec", "_crc", "_qoff", "_phy", "_bts", "_stored", "_body", "_praw",
              "_pstr", "_props")
# The longest topic a walk keeps to pass on to rs_msg_check_read (a broker's are at most 127).
DEF TOPIC_KEPT = 256
DEF X_SIZE = 0
DEF X_QID = 1
DEF X_FLAG = 2
DEF X_SYSF = 3
DEF X_BORN_HOST = 4
DEF X_STORE_TS = 5
DEF X_STORE_HOST = 6
DEF X_RECONSUME = 7
DEF X_PREPARED = 8
DEF X_TOPIC = 9
DEF X_MAGIC = 10
DEF X_REC = 11
DEF X_LAZY = 12         # _crc .. _props: None, read from _rec on first use
DEF N_EXT_SLOTS = 21
_MF_SLOTS = ("file_from_offset", "committed_position", "mm", "_lock", "_available", "_refs",
             "_cond")
_GET_RESULT_SLOTS = ("status", "next_begin_offset", "min_offset", "max_offset", "messages",
                     "suggest_pulling_from_slave", "filtered_count")
DEF N_GET_SLOTS = 7
_QUERY_RESULT_SLOTS = ("messages", "buffer_total_size", "index_last_update_timestamp",
                       "index_last_update_phy_offset")
_BATCH_RESULT_SLOTS = ("status", "next_begin_offset", "min_offset", "max_offset",
                       "suggest_pulling_from_slave", "_n", "_raw", "_raw_file", "_rows", "_files",
                       "_buffers", "_released", "filtered_count")
DEF N_BATCH_SLOTS = 13
DEF R_FROM = 0
DEF R_READ = 1
DEF R_MM = 2
DEF R_LOCK = 3
DEF R_AVAILABLE = 4
DEF R_REFS = 5
DEF R_COND = 6


# A MappedFile's slots (_MF_SLOTS offsets `off`) read in place: ReadPath's unit walk and
# PutDispatch (_reput.pxi) find, hold and release files with them.
cdef object _mf_find(list files, int64_t offset, int64_t file_size, const Py_ssize_t *off):
    """MappedFileQueue.find_by_offset over a snapshot of its list (None if not found)."""
    cdef Py_ssize_t n = len(files), idx
    cdef int64_t first, last, start
    if n == 0:
        return None
    first = <object>_member(files[0], off[R_FROM])
    last = <object>_member(files[n - 1], off[R_FROM])
    if offset < first or offset >= last + file_size:
        return None
    idx = <Py_ssize_t>(offset // file_size - first // file_size)
    if 0 <= idx < n:
        f = files[idx]
        start = <object>_member(f, off[R_FROM])
        if start <= offset < start + file_size:
            return f
    for f in files:
        start = <object>_member(f, off[R_FROM])
        if start <= offset < start + file_size:
            return f
    return None


cdef bint _mf_hold(object f, const Py_ssize_t *off) except -1:
    """MappedFile.hold with its slots read in place (the Python method's frame cost as much
    as a dozen records' checks): under the file's lock, False once it is being destroyed,
    else one more borrower."""
    lock = <object>_member(f, off[R_LOCK])
    lock.acquire()
    try:
        if not <object>_member(f, off[R_AVAILABLE]):
            return False
        _set_member(f, off[R_REFS], <object>_member(f, off[R_REFS]) + 1)
        return True
    finally:
        lock.release()


cdef int _mf_release(object f, const Py_ssize_t *off) except -1:
    """MappedFile.release with its slots read in place, as _mf_hold: one borrower fewer, and a
    close() waiting for the last one is woken."""
    lock = <object>_member(f, off[R_LOCK])
    lock.acquire()
    try:
        refs = <object>_member(f, off[R_REFS]) - 1
        _set_member(f, off[R_REFS], refs)
        if refs <= 0 and not <object>_member(f, off[R_AVAILABLE]):
            (<object>_member(f, off[R_COND])).notify_all()
    finally:
        lock.release()
    return 0

# live_walk's answers: why it stopped (ReadPath.LIVE_* for live.py).
DEF W_DONE = 0
DEF W_ZERO = 1
DEF W_FULL = 2
DEF W_OTHER = 3

cdef object _MAGIC_V1 = RS_MESSAGE_MAGIC_CODE
cdef object _MAGIC_V2 = RS_MESSAGE_MAGIC_CODE_V2


cdef struct _Window:
    # The file being read: its start offset, readable end (absolute offsets) and mapping.
    int64_t start
    int64_t end
    const uint8_t *buf


cdef extern from "Python.h":
    PyObject *PyDict_GetItemWithError(object d, object key) except? NULL


cdef inline object _dict_get(dict d, object key):
    """d.get(key) without the method call (an unhashable key raises TypeError, as get
    does)."""
    cdef PyObject *v = PyDict_GetItemWithError(d, key)
    return None if v == NULL else <object>v


cdef inline bint _has_code(const int64_t *codes, Py_ssize_t n, int64_t code) noexcept:
    """Whether `code` is among the n sorted `codes` (a subscription's tag hashes: a handful,
    so a binary search with no call)."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if codes[mid] < code:
            lo = mid + 1
        else:
            hi = mid
    return lo < n and codes[lo] == code


cdef inline bint _row_inside(const rs_scan_rec *r, Py_ssize_t buf_len) noexcept:
    """Whether the fields `r` locates (hosts, body, topic, properties) lie inside its record and
    the record inside a buffer of buf_len bytes."""
    cdef int64_t hosts = RS_POS_BORNHOST + (
        RS_HOST_V6_LENGTH if r.sys_flag & RS_BORNHOST_V6_FLAG else RS_HOST_V4_LENGTH) + 8 + (
        RS_HOST_V6_LENGTH if r.sys_flag & RS_STOREHOSTADDRESS_V6_FLAG else RS_HOST_V4_LENGTH)
    return (r.pos >= 0 and r.size >= hosts and r.pos + r.size <= buf_len
            and 0 <= r.body_off and 0 <= r.body_len and r.body_off + r.body_len <= r.size
            and 0 <= r.topic_off and 0 <= r.topic_len and r.topic_off + r.topic_len <= r.size
            and 0 <= r.props_off and 0 <= r.props_len and r.props_off + r.props_len <= r.size)


cdef class ReadPath:
    """ReadPath(message_type, mapped_file_type, on_corrupt, result_type=None, statuses=None,
    batch_result_type=None, limits=None, query_result_type=None): the unit walk of get_message
    and get_batch as one call (read), the whole common case of each with its result built here
    (pull, pull_batch: needs the result types and the (FOUND, NO_MATCHED_MESSAGE,
    MESSAGE_WAS_REMOVING) statuses), MessageStore's common get_message/get_batch call with its
    argument checks and catch-up (get_message, get_batch: also needs `limits`, an object whose
    MAX_MSG_NUMS and MAX_BYTES bound a call, read_path), its common key query
    (query_message: needs QueryMessageResult as query_result_type), and MessageExt objects
    from scanned rows (decode_rows, and a key query's hits).

    on_corrupt(queue_offset, phy_offset, reason) is called for a unit whose record fails the
    record check (the unit is then skipped, as a filter would)."""
    LIVE_DONE = W_DONE
    LIVE_ZERO = W_ZERO
    LIVE_FULL = W_FULL
    LIVE_OTHER = W_OTHER
    cdef Py_ssize_t _x[N_EXT_SLOTS]
    cdef Py_ssize_t _f[7]
    cdef type _ext
    cdef object _on_corrupt
    # The last topic and hosts met, reused while records repeat them (a queue's records share
    # a topic, and mostly their hosts): a memcmp instead of a new object per message.
    cdef bytes _topic_b
    cdef object _topic_s
    cdef bytes _born
    cdef bytes _store
    # Likewise the last store time (one per put batch) and record size (fixed-size messages).
    cdef object _ts_obj
    cdef int64_t _ts
    cdef object _size_obj
    cdef int32_t _size
    # pull(): GetMessageResult's type, members and statuses.
    cdef type _result
    cdef Py_ssize_t _g[N_GET_SLOTS]
    cdef object _found, _no_matched, _removing
    # pull_batch(): read_path.GetBatchResult's type and members.
    cdef type _batch
    cdef Py_ssize_t _b[N_BATCH_SLOTS]
    # Statistics of pull and pull_batch (stats.get_totals adds them up): calls that found
    # messages, calls that did not, messages returned, and the longest call (ms).
    cdef readonly int64_t found
    cdef readonly int64_t miss
    cdef readonly int64_t transferred
    cdef readonly int64_t time_max

    cdef inline void _count(self, Py_ssize_t n, int64_t t0) noexcept:
        cdef int64_t ms = (_mono_ns() - t0) // 1000000
        if n:
            self.found += 1
            self.transferred += n
        else:
            self.miss += 1
        if ms > self.time_max:
            self.time_max = ms
    # get_message() / get_batch(): what holds MAX_MSG_NUMS and MAX_BYTES (read_path), whose
    # values each call uses as they are then, as MessageStore reads them.
    cdef object _limits
    # Its two values, read again only when its __dict__ changed (a module's attributes are
    # its dict; a module attribute read costs ~250 instructions, a dict version compare few).
    cdef dict _limits_d
    cdef uint64_t _limits_ver
    cdef bint _limits_valid
    cdef long long _max_msg_nums
    cdef object _max_bytes
    # query_message(): QueryMessageResult's type and members.
    cdef type _query_result
    cdef Py_ssize_t _qr[4]
    # The store last read (a weak reference: the store owns this path) and the attributes a
    # call reads from it, copied from its instance dict and read again only when that dict
    # changed (any assignment to a store attribute changes its version), as PutPath's
    # _sync_state copies the CommitLog's: five attribute reads cost ~200 instructions each,
    # a tenth of a get_batch of 32.
    cdef object _st
    cdef dict _std
    cdef uint64_t _std_ver
    cdef bint _std_valid
    cdef object _s_loaded, _s_table, _s_commit, _s_reput, _s_mem_limit, _s_index, _s_config
    # The store's CommitLog (set once in MessageStore.__init__; _store_fields reads it) and
    # what of it never changes: its MappedFileQueue and file size.
    cdef object _log
    cdef object _log_mfq
    cdef int64_t _log_file_size
    # ConsumeQueue's members (mfq, file_size, min_logic_offset) read in place, as MappedFile's:
    # the queue type is taken from the first queue read (_cq_type; another type is read by
    # attribute).
    cdef type _cq_type
    cdef Py_ssize_t _cq[3]
    # A ConsumeQueue file's type (mapped_file.CqMappedFile, taken from the first one read) and
    # the offset of its `_cell`, where its positions are (_read_pos).
    cdef type _cell_type
    cdef Py_ssize_t _cell_off

    def __init__(self, message_type, mapped_file_type, on_corrupt, result_type=None,
                 statuses=None, batch_result_type=None, limits=None, query_result_type=None):
        _member_offsets(message_type, _EXT_SLOTS, self._x)
        _member_offsets(mapped_file_type, _MF_SLOTS, self._f)
        self._ext = message_type
        self._on_corrupt = on_corrupt
        self._result = result_type
        if result_type is not None:
            _member_offsets(result_type, _GET_RESULT_SLOTS, self._g)
            self._found, self._no_matched, self._removing = statuses
        self._batch = batch_result_type
        if batch_result_type is not None:
            _member_offsets(batch_result_type, _BATCH_RESULT_SLOTS, self._b)
        self._limits = limits
        self._query_result = query_result_type
        if query_result_type is not None:
            _member_offsets(query_result_type, _QUERY_RESULT_SLOTS, self._qr)

    # ---- one message -------------------------------------------------------------------------
    cdef inline bytes _host(self, const uint8_t *p, Py_ssize_t n, bint store):
        cdef bytes old = self._store if store else self._born
        if old is not None and PyBytes_GET_SIZE(old) == n \
                and memcmp(PyBytes_AS_STRING(old), p, <size_t>n) == 0:
            return old
        new = PyBytes_FromStringAndSize(<const char *>p, n)
        if store:
            self._store = new
        else:
            self._born = new
        return new

    cdef object _message(self, const uint8_t *rec, const rs_scan_rec *row):
        """A MessageExt of the checked record at `rec` with the kernel's `row`: a copy of the
        record's bytes, and the fields that need no new object (cached ints, hosts and topic
        shared with the previous message); body, offsets, body CRC, born time and properties
        are read from the copy when first asked for (message.MessageExt)."""
        cdef Py_ssize_t *x = self._x
        cdef const uint8_t *p
        cdef Py_ssize_t n, i
        m = PyType_GenericAlloc(<PyTypeObject *>self._ext, 0)
        if self._size_obj is None or self._size != row.size:
            self._size_obj = row.size
            self._size = row.size
        if self._ts_obj is None or self._ts != row.store_timestamp:
            self._ts_obj = row.store_timestamp
            self._ts = row.store_timestamp
        _set_member(m, x[X_SIZE], self._size_obj)
        _set_member(m, x[X_QID], row.queue_id)
        _set_member(m, x[X_FLAG], row.flag)
        _set_member(m, x[X_SYSF], row.sys_flag)
        _set_member(m, x[X_STORE_TS], self._ts_obj)
        _set_member(m, x[X_RECONSUME], row.reconsume_times)
        _set_member(m, x[X_PREPARED], row.prepared_tx_offset)
        _set_member(m, x[X_MAGIC], _MAGIC_V2 if row.info & RS_SCAN_INFO_V2 else _MAGIC_V1)
        # The hosts' lengths follow the sysflag bits, which rs_msg_check has checked against
        # TOTALSIZE (doc/01 §3.1).
        p = rec + RS_POS_BORNHOST
        n = RS_HOST_V6_LENGTH if row.sys_flag & RS_BORNHOST_V6_FLAG else RS_HOST_V4_LENGTH
        _set_member(m, x[X_BORN_HOST], self._host(p, n, False))
        p += n + 8
        n = RS_HOST_V6_LENGTH if row.sys_flag & RS_STOREHOSTADDRESS_V6_FLAG else RS_HOST_V4_LENGTH
        _set_member(m, x[X_STORE_HOST], self._host(p, n, True))
        p = rec + row.topic_off
        n = row.topic_len
        if self._topic_b is None or PyBytes_GET_SIZE(self._topic_b) != n \
                or memcmp(PyBytes_AS_STRING(self._topic_b), p, <size_t>n) != 0:
            self._topic_s = PyUnicode_DecodeUTF8(<const char *>p, n, "replace")
            self._topic_b = PyBytes_FromStringAndSize(<const char *>p, n)
        _set_member(m, x[X_TOPIC], self._topic_s)
        # One copy of the whole record (it lies in a mapping that may be unmapped later); the
        # rest is read from it on first use.
        _set_member(m, x[X_REC], PyBytes_FromStringAndSize(<const char *>rec, row.size))
        for i in range(X_LAZY, N_EXT_SLOTS):
            _set_member(m, x[i], None)
        # Not tracked by the garbage collector, as PutPath's results: it refers to ints, bytes,
        # str and None (later its properties dict of str), so it is in no cycle unless a caller
        # puts it into its own properties map; a consumer keeping many would otherwise make
        # every collection walk them (measured: ~40 % of a get_message of 32).
        PyObject_GC_UnTrack(m)
        return m

    def decode_rows(self, buf, rows, Py_ssize_t n):
        """MessageExt objects of the first `n` rows (format.SCAN_DTYPE, commitlog_scan's output
        over `buf`): iter_messages and dump, without re-parsing a record."""
        cdef Py_buffer b, rv
        cdef const rs_scan_rec *r
        cdef Py_ssize_t i
        cdef list out = []
        dtype = getattr(rows, "dtype", None)
        if dtype is not None and dtype != _SCAN_DTYPE:
            _raise_for_status(RS_E_ARG, "decode_rows: rows must be a SCAN_DTYPE array")
        memset(&b, 0, sizeof(b))
        memset(&rv, 0, sizeof(rv))
        try:
            _ro(buf, &b)
            _ro(rows, &rv)
            if n < 0 or n > rv.len // SCAN_REC_SIZE:
                _raise_for_status(RS_E_BOUNDS, "decode_rows: more rows than given")
            r = <const rs_scan_rec *>rv.buf
            for i in range(n):
                # Rows may come from anywhere: every field must lie inside its record, and the
                # record inside the buffer.
                if not _row_inside(&r[i], b.len):
                    _raise_for_status(RS_E_BOUNDS, "decode_rows: a row outside the buffer")
                out.append(self._message(<const uint8_t *>b.buf + r[i].pos, &r[i]))
        finally:
            PyBuffer_Release(&rv)
            PyBuffer_Release(&b)
        return out

    # ---- a LiveReader's walk (live.py) --------------------------------------------------------
    def live_walk(self, cq_mm, Py_ssize_t rel, Py_ssize_t n, int64_t q0, log_mm,
                  int64_t log_start, bytes topic_b, int32_t queue_id, Py_ssize_t max_n,
                  int64_t max_bytes, int64_t nbytes, message_filter, list messages):
        """LiveReader._read's unit loop over the `n` units at `rel` in ConsumeQueue mapping
        `cq_mm` (queue offsets q0..q0+n-1), their records in the CommitLog mapping `log_mm`
        (a whole file, starting at CommitLog offset `log_start`; None: none yet). Each record
        is copied, then checked (rs_msg_check, body CRC included) and matched against its unit
        (size, CommitLog offset, queue id, queue offset, topic) on the copy, and decoded from
        the copy: a writer's later change can never make the message differ from what was
        checked. MessageExt objects are appended to `messages` (at most max_n in all),
        `message_filter(tags_code)` deciding for a checked record, as LiveReader does.

        Returns (units done, why it stopped, nbytes): LIVE_DONE (n units done, or max_n
        messages), LIVE_ZERO (the next unit is not written), LIVE_FULL (the next record would
        pass max_bytes) or LIVE_OTHER (the next unit is for LiveReader's Python path: its
        record lies outside `log_mm`, or fails a check)."""
        cdef Py_buffer qv, lv
        cdef rs_scan_rec row
        cdef int32_t size, rsize
        cdef int64_t phy
        cdef const uint8_t *u
        cdef uint8_t *scratch = NULL
        cdef uint8_t *grown
        cdef size_t cap = 0
        cdef Py_ssize_t i = 0, tlen = PyBytes_GET_SIZE(topic_b)
        cdef int why = W_DONE
        cdef bint have_log = log_mm is not None
        memset(&qv, 0, sizeof(qv))
        memset(&lv, 0, sizeof(lv))
        try:
            _ro(cq_mm, &qv)
            if rel < 0 or n < 0 or rel + n * RS_CQ_STORE_UNIT_SIZE > qv.len:
                _raise_for_status(RS_E_BOUNDS, "live_walk: units outside the mapping")
            if have_log:
                _ro(log_mm, &lv)
            while i < n:
                if PyList_GET_SIZE(messages) >= max_n:
                    break
                u = <const uint8_t *>qv.buf + rel + i * RS_CQ_STORE_UNIT_SIZE
                phy = rs_load_i64(u)
                size = rs_load_i32(u + 8)
                if size == 0:
                    why = W_ZERO
                    break
                if phy == 0 and size == 0x7FFFFFFF:
                    i += 1                  # a broker's blank leading unit: no record
                    continue
                if PyList_GET_SIZE(messages) and nbytes + size > max_bytes:
                    why = W_FULL
                    break
                if not have_log or size < 0 or phy < log_start \
                        or phy - log_start > lv.len - size:
                    why = W_OTHER
                    break
                if <size_t>size > cap:
                    grown = <uint8_t *>PyMem_Realloc(scratch, <size_t>size)
                    if grown == NULL:
                        raise MemoryError()
                    scratch = grown
                    cap = <size_t>size
                memcpy(scratch, <const uint8_t *>lv.buf + (phy - log_start), <size_t>size)
                if rs_msg_check(scratch, <size_t>size, 0, 1, &row, &rsize) != RS_OK \
                        or rsize != size or row.pos != 0 or row.phy_offset != phy \
                        or row.queue_id != queue_id or row.queue_offset != q0 + i \
                        or row.topic_len != tlen or not _row_inside(&row, size) \
                        or memcmp(scratch + row.topic_off, PyBytes_AS_STRING(topic_b),
                                  <size_t>tlen) != 0:
                    why = W_OTHER
                    break
                i += 1
                if message_filter is None or message_filter(rs_load_i64(u + 12)):
                    messages.append(self._message(scratch, &row))
                    nbytes += size
        finally:
            PyMem_Free(scratch)
            PyBuffer_Release(&lv)
            PyBuffer_Release(&qv)
        return i, why, nbytes

    # ---- the unit walk ---------------------------------------------------------------------
    cdef inline object _find(self, list files, int64_t offset, int64_t file_size):
        return _mf_find(files, offset, file_size, self._f)

    cdef int64_t _read_pos(self, object f) except? -1:
        """f.read_position: a CommitLog file's committed_position member, read in place; a
        ConsumeQueue file's (CqMappedFile) is the second item of its cell (the class leaves
        the member None), read in place too. The cell is written with the GIL, which this
        holds: the units below the position read are written."""
        cdef PyObject *p = _member(f, self._f[R_READ])
        if p != NULL and PyLong_CheckExact(<object>p):
            return <object>p
        if self._cell_type is None and "_cell" in getattr(type(f), "LENT_SLOTS", ()):
            _member_offsets(type(f), ("_cell",), &self._cell_off)
            self._cell_type = type(f)
        if type(f) is self._cell_type:
            p = _member(f, self._cell_off)
            if p != NULL and type(<object>p) is _array:
                return (<object>p)[1]
        return f.read_position

    cdef inline bint _hold(self, object f) except -1:
        return _mf_hold(f, self._f)

    cdef inline int _release(self, object f) except -1:
        return _mf_release(f, self._f)

    cdef int _open(self, object f, Py_buffer *view, _Window *w) except -1:
        """Borrow file `f`'s mapping into `view` (released first); 0 when it is closed."""
        PyBuffer_Release(view)
        mm = <object>_member(f, self._f[R_MM])
        try:
            _ro(mm, view)
        except (ValueError, BufferError):
            return 0                    # unmapped by cleaning meanwhile
        w.start = <object>_member(f, self._f[R_FROM])
        w.end = w.start + self._read_pos(f)
        if w.end - w.start > view.len:
            w.end = w.start + view.len
        w.buf = <const uint8_t *>view.buf
        return 1

    def read(self, list cq_files, int64_t cq_file_size, list log_files, int64_t log_file_size,
             int64_t offset, int64_t max_off, int64_t min_logic, Py_ssize_t max_n,
             int64_t scan_limit, int64_t max_bytes, message_filter, rows=None,
             list held=None, row_file=None, subscription=None, property_filter=None):
        """The unit walk of read_path.PyReadPath.read, with the same arguments and results:
        (messages or row count, units scanned or -1 when the first unit's file is not there,
        whether a record was found removed before any was found, the last record's offset,
        units filtered out)."""
        return self._walk(cq_files, cq_file_size, log_files, log_file_size, offset, max_off,
                          min_logic, max_n, scan_limit, max_bytes, message_filter, rows, held,
                          row_file, subscription, property_filter)

    cdef int _positions(self, list log_files, list cq_files, int64_t *max_py,
                        int64_t *max_off) except -1:
        """The CommitLog's and the queue's max offsets (bytes; units), from the snapshots of
        their file lists the walk then reads; 0 if either is empty."""
        if not log_files or not cq_files:
            return 0
        last = log_files[len(log_files) - 1]
        max_py[0] = <int64_t>(<object>_member(last, self._f[R_FROM])) + self._read_pos(last)
        last = cq_files[len(cq_files) - 1]
        max_off[0] = (<int64_t>(<object>_member(last, self._f[R_FROM])) + self._read_pos(last)) \
            // RS_CQ_STORE_UNIT_SIZE
        return 1

    # ---- MessageStore's entry points ----------------------------------------------------------
    cdef object _common_queue(self, store, group, topic, queue_id, offset, max_n,
                              message_filter):
        """The queue of a get_message/get_batch call that takes the common path, after the
        store's read-your-writes catch-up; None for any other call (the store closed, an
        argument of another type or out of range, no such queue), which MessageStore then
        checks, and answers or raises for, in Python. The checks are MessageStore's
        check_open and _checked_queue, in that order; the catch-up is its catch_up, the
        reput service called only when it is behind the CommitLog's readable end."""
        cdef int overflow = 0
        cdef long long v
        if self._limits is None:
            return None
        self._store_fields(store)
        if self._s_loaded is not True:
            return None
        if type(group) is not str or type(queue_id) is not int or type(offset) is not int \
                or type(max_n) is not int \
                or (message_filter is not None and not callable(message_filter)):
            return None
        v = PyLong_AsLongLongAndOverflow(max_n, &overflow)
        self._limit_values()
        if overflow or not 0 < v <= self._max_msg_nums:
            return None
        PyLong_AsLongLongAndOverflow(offset, &overflow)
        if overflow:
            return None
        table = self._s_table
        queues = table.get(topic) if type(table) is not dict else _dict_get(table, topic)
        if queues is None:
            return None
        cq = queues.get(queue_id) if type(queues) is not dict else _dict_get(queues, queue_id)
        if cq is None:
            return None
        self._catch_up(store)
        return cq

    cdef int _limit_values(self) except -1:
        """_max_msg_nums and _max_bytes from `limits` as they are now."""
        cdef uint64_t ver
        if self._limits_d is None:
            d = getattr(self._limits, "__dict__", None)
            self._limits_d = d if type(d) is dict else {}
        ver = rs_dict_version(self._limits_d)
        if self._limits_valid and ver == self._limits_ver and rs_dict_versioned() \
                and len(self._limits_d):
            return 0
        self._limits_valid = False
        self._max_msg_nums = self._limits.MAX_MSG_NUMS
        self._max_bytes = self._limits.MAX_BYTES
        self._limits_ver = ver
        self._limits_valid = True
        return 0

    cdef int _store_fields(self, store) except -1:
        """Bring the copies of `store`'s attributes (_s_*) up to date: a compare while its
        instance dict is unchanged, the reads when it changed (or without dict versions)."""
        cdef uint64_t ver
        if self._st is None or PyWeakref_GET_OBJECT(self._st) is not <PyObject *>store:
            self._st = PyWeakref_NewRef(store, None)
            self._std = store.__dict__
            self._std_valid = False
        ver = rs_dict_version(self._std)
        if self._std_valid and ver == self._std_ver and rs_dict_versioned():
            return 0
        self._std_valid = False
        self._s_loaded = store.loaded
        self._s_table = store.consume_queue_table
        self._s_commit = store.commit_service
        self._s_reput = store.reput_service
        commitlog = store.commitlog
        if commitlog is not self._log:
            self._log_mfq = commitlog.mfq
            self._log_file_size = commitlog.file_size
            self._log = commitlog
        self._s_mem_limit = store.mem_limit
        self._s_index = store.index_service
        self._s_config = store.config
        self._std_ver = ver
        self._std_valid = True
        return 0

    cdef object _log_queue(self, store):
        """The MappedFileQueue of `store`'s CommitLog (cached with its file size, which
        _log_file_size then holds)."""
        self._store_fields(store)
        return self._log_mfq

    cdef object _queue_parts(self, cq, int64_t *file_size, int64_t *min_logic):
        """A ConsumeQueue's mfq (returned), file_size and min_logic_offset."""
        cdef PyObject *a
        cdef PyObject *b
        cdef PyObject *c
        if self._cq_type is None and type(cq).__dict__.get("__slots__") is not None:
            try:
                _member_offsets(type(cq), ("mfq", "file_size", "min_logic_offset"), self._cq)
                self._cq_type = type(cq)
            except TypeError:
                pass
        if type(cq) is self._cq_type:
            a = _member(cq, self._cq[0])
            b = _member(cq, self._cq[1])
            c = _member(cq, self._cq[2])
            if a != NULL and b != NULL and c != NULL:
                file_size[0] = <object>b
                min_logic[0] = <object>c
                return <object>a
        file_size[0] = cq.file_size
        min_logic[0] = cq.min_logic_offset
        return cq.mfq

    cdef int _catch_up(self, store) except -1:
        """MessageStore.catch_up (read-your-writes), the reput service called only when it is
        behind the CommitLog's readable end."""
        cdef int64_t max_py = 0
        self._store_fields(store)
        if self._s_commit is not None:
            store.catch_up()
            return 0
        reput = self._s_reput
        if reput is None:
            return 0
        log_files = self._log_queue(store).files
        if log_files:
            last = log_files[len(log_files) - 1]
            max_py = <int64_t>(<object>_member(last, self._f[R_FROM])) + self._read_pos(last)
        if reput.reput_from_offset < max_py:
            reput.catch_up()
        return 0

    def query_message(self, store, topic, key, max_num, begin, end):
        """MessageStore.query_message's common call as one (query.query_message: the
        arguments checked, the catch-up, index_query with hits built from the record check's
        rows, and the QueryMessageResult). None for any other call, which MessageStore checks
        and answers in Python."""
        cdef int overflow = 0
        cdef long long want, b, e = LLONG_MAX
        if self._query_result is None:
            return None
        self._store_fields(store)
        if self._s_loaded is not True:
            return None
        if type(topic) is not str or type(key) is not str or type(max_num) is not int \
                or type(begin) is not int or (end is not None and type(end) is not int):
            return None
        want = PyLong_AsLongLongAndOverflow(max_num, &overflow)
        if overflow or want < 1:
            return None
        b = PyLong_AsLongLongAndOverflow(begin, &overflow)
        if overflow:
            return None
        if end is not None:
            e = PyLong_AsLongLongAndOverflow(end, &overflow)
            if overflow:
                return None
        self._catch_up(store)
        index = self._s_index
        worker = index.worker
        if worker is not None and worker.pending:
            index.settle_for_reader()       # a batch put's keys, from the index worker
        cap = self._s_config.max_msgs_num_batch
        if cap < want:
            want = cap
        messages, nbytes, last_ts, last_phy = _index_query(
            index.index_file_list, self._log_mfq, topic, key, want, b, e, self)
        r = PyType_GenericAlloc(<PyTypeObject *>self._query_result, 0)
        _set_member(r, self._qr[0], messages)
        _set_member(r, self._qr[1], nbytes)
        _set_member(r, self._qr[2], last_ts)
        _set_member(r, self._qr[3], last_phy)
        return r

    def get_message(self, store, group, topic, queue_id, offset, max_msg_nums,
                    message_filter):
        """MessageStore.get_message's common call (no wait) as one: its arguments checked,
        the catch-up and pull(). None when the call is not the common case or pull() gives
        None: MessageStore answers it in Python."""
        cq = self._common_queue(store, group, topic, queue_id, offset, max_msg_nums,
                                message_filter)
        if cq is None:
            return None
        return self._pull(store, cq, offset, max_msg_nums, message_filter,
                          self._max_bytes, None, None)

    def get_batch(self, store, group, topic, queue_id, offset, max_msg_nums, message_filter):
        """MessageStore.get_batch's common call as one, as get_message() for pull_batch()."""
        cq = self._common_queue(store, group, topic, queue_id, offset, max_msg_nums,
                                message_filter)
        if cq is None:
            return None
        return self._pull_batch(store, cq, offset, max_msg_nums, message_filter,
                                self._max_bytes, None, None)

    def pull_batch(self, store, cq, int64_t offset, Py_ssize_t max_n, message_filter,
                   int64_t max_bytes, subscription=None, property_filter=None):
        """read_path.PyReadPath.pull_batch: get_batch's common case as one call, building the
        GetBatchResult here. None as for pull()."""
        return self._pull_batch(store, cq, offset, max_n, message_filter, max_bytes,
                                subscription, property_filter)

    cdef object _pull_batch(self, store, cq, int64_t offset, Py_ssize_t max_n, message_filter,
                            int64_t max_bytes, subscription, property_filter):
        cdef int64_t max_py = 0, min_logic, max_off = 0, max_phy, scanned, cq_file_size
        cdef int64_t t0 = _mono_ns()
        cdef Py_ssize_t n
        cdef Py_ssize_t *b = self._b
        cdef _HeldFiles files
        if self._batch is None:
            return None
        # Each list read once: the positions and the walk see the same snapshot.
        log_files = self._log_queue(store).files
        cq_files = self._queue_parts(cq, &cq_file_size, &min_logic).files
        if not self._positions(log_files, cq_files, &max_py, &max_off):
            return None
        if max_off == 0 or offset < min_logic // RS_CQ_STORE_UNIT_SIZE or offset >= max_off:
            return None
        # Plain buffers, viewed as numpy arrays only when a column is asked for.
        rows = PyByteArray_FromStringAndSize(NULL, max_n * SCAN_REC_SIZE)
        row_file = PyByteArray_FromStringAndSize(NULL, max_n * 4)
        held = []
        try:
            n, scanned, removing, max_phy, filtered = self._walk(
                cq_files, cq_file_size, log_files, self._log_file_size, offset,
                max_off, min_logic, max_n,
                max(16000, max_n * RS_CQ_STORE_UNIT_SIZE) // RS_CQ_STORE_UNIT_SIZE, max_bytes,
                message_filter, rows, held, row_file, subscription, property_filter)
        except BaseException:
            # A filter raised: no result will own the files held so far.
            for f in held:
                f.release()
            raise
        if scanned < 0:
            for f in held:
                f.release()
            return None
        r = PyType_GenericAlloc(<PyTypeObject *>self._batch, 0)
        if n:
            _set_member(r, b[0], self._found)
            _set_member(r, b[4], max_py - max_phy > <int64_t>self._s_mem_limit)
            _set_member(r, b[6], rows)
            _set_member(r, b[7], row_file)
        else:
            _set_member(r, b[0], self._removing if removing else self._no_matched)
            _set_member(r, b[4], False)
            _set_member(r, b[6], None)
            _set_member(r, b[7], None)
        _set_member(r, b[1], offset + scanned)
        _set_member(r, b[2], min_logic // RS_CQ_STORE_UNIT_SIZE)
        _set_member(r, b[3], max_off)
        _set_member(r, b[5], n)
        _set_member(r, b[8], None)
        if held:
            files = <_HeldFiles>_HeldFiles.__new__(_HeldFiles)
            files.held = held
            files.holds = [None] * len(held)
            files._path = self
            _set_member(r, b[9], files)
        else:
            _set_member(r, b[9], None)
        _set_member(r, b[10], None)
        _set_member(r, b[11], False)
        _set_member(r, b[12], filtered)
        self._count(n, t0)
        return r

    def pull(self, store, cq, int64_t offset, Py_ssize_t max_n, message_filter,
             int64_t max_bytes, subscription=None, property_filter=None):
        """read_path.PyReadPath.pull: get_message's common case as one call, the queue's and
        CommitLog's positions read here and the GetMessageResult built here. None when the
        answer is decided before a unit is read (the offset outside the queue) or the first
        unit's file is missing: MessageStore._read_past_pull gives those."""
        return self._pull(store, cq, offset, max_n, message_filter, max_bytes, subscription,
                          property_filter)

    cdef object _pull(self, store, cq, int64_t offset, Py_ssize_t max_n, message_filter,
                      int64_t max_bytes, subscription, property_filter):
        cdef int64_t max_py = 0, min_logic, max_off = 0, max_phy, scanned, cq_file_size
        cdef int64_t t0 = _mono_ns()
        cdef Py_ssize_t *g = self._g
        if self._result is None:
            return None
        # Each list read once: the positions and the walk see the same snapshot.
        log_files = self._log_queue(store).files
        cq_files = self._queue_parts(cq, &cq_file_size, &min_logic).files
        if not self._positions(log_files, cq_files, &max_py, &max_off):
            return None
        if max_off == 0 or offset < min_logic // RS_CQ_STORE_UNIT_SIZE or offset >= max_off:
            return None
        # Units looked at, filtered out or not: the broker's bound on one call's scan.
        messages, scanned, removing, max_phy, filtered = self._walk(
            cq_files, cq_file_size, log_files, self._log_file_size, offset,
            max_off, min_logic,
            max_n, max(16000, max_n * RS_CQ_STORE_UNIT_SIZE) // RS_CQ_STORE_UNIT_SIZE,
            max_bytes, message_filter, None, None, None, subscription, property_filter)
        if scanned < 0:
            return None
        r = PyType_GenericAlloc(<PyTypeObject *>self._result, 0)
        if messages:
            _set_member(r, g[0], self._found)
            _set_member(r, g[5], max_py - max_phy > <int64_t>self._s_mem_limit)
        else:
            _set_member(r, g[0], self._removing if removing else self._no_matched)
            _set_member(r, g[5], False)
        _set_member(r, g[1], offset + scanned)
        _set_member(r, g[2], min_logic // RS_CQ_STORE_UNIT_SIZE)
        _set_member(r, g[3], max_off)
        _set_member(r, g[4], messages)
        _set_member(r, g[6], filtered)
        self._count(len(<list>messages), t0)
        return r

    cdef tuple _walk(self, list cq_files, int64_t cq_file_size, list log_files,
                     int64_t log_file_size, int64_t offset, int64_t max_off, int64_t min_logic,
                     Py_ssize_t max_n, int64_t scan_limit, int64_t max_bytes, message_filter,
                     rows, list held, row_file, subscription, property_filter):
        cdef Py_buffer qv, lv, rv, fv, cv, tv, ev
        cdef _Window q, lw
        cdef rs_scan_rec row
        cdef rs_scan_rec *out_rows = NULL
        cdef int32_t *out_file = NULL
        cdef int32_t rsize
        cdef int64_t pos, rel, take, i, phy, tags, scanned = 0, nbytes = 0, max_phy = 0
        cdef int64_t skip_below = -1, qidx, filtered = 0
        # A subscription's tag hashes (sorted) and its tags (tags_match's arguments): set
        # only when it names tags; an unfiltered read tests by_tags and nothing else.
        cdef bint by_tags = False
        cdef const int64_t *codes = NULL
        cdef Py_ssize_t ncodes = 0
        cdef int32_t size
        cdef Py_ssize_t found = 0, cap = 0
        cdef bint removing = False, full = False, first = True, batch = rows is not None
        cdef bint have_log = False, log_rows = False
        cdef const uint8_t *u
        cdef int r
        cdef list messages = None
        # The topic of the records checked so far, for rs_msg_check_read.
        cdef uint8_t topic_buf[TOPIC_KEPT]
        cdef const uint8_t *topic = NULL
        cdef size_t topic_len = 0
        cdef int32_t topic_hash = 0
        memset(&qv, 0, sizeof(qv))
        memset(&lv, 0, sizeof(lv))
        memset(&rv, 0, sizeof(rv))
        memset(&fv, 0, sizeof(fv))
        memset(&cv, 0, sizeof(cv))
        memset(&tv, 0, sizeof(tv))
        memset(&ev, 0, sizeof(ev))
        lw.start = lw.end = 0
        lf = None
        m = None
        try:
            if batch:
                # A SCAN_DTYPE array, or a plain writable buffer of rows (bytearray).
                # (pull_batch's own bytearray has no dtype: no failed attribute lookup for it)
                if type(rows) is not bytearray \
                        and getattr(rows, "dtype", _SCAN_DTYPE) != _SCAN_DTYPE:
                    _raise_for_status(RS_E_ARG, "read: rows must be a SCAN_DTYPE array")
                _rw(rows, &rv)
                _rw(row_file, &fv)
                cap = min(rv.len // SCAN_REC_SIZE, fv.len // 4)
                if cap < max_n or held is None:
                    _raise_for_status(RS_E_ARG, "read: fewer output rows than max_n")
                out_rows = <rs_scan_rec *>rv.buf
                out_file = <int32_t *>fv.buf
            else:
                messages = []
            if subscription is not None and subscription.tags:
                by_tags = True
                _ro(subscription.codes, &cv)
                _ro(subscription.tag_bytes, &tv)
                _ro(subscription.tag_ends, &ev)
                codes = <const int64_t *>cv.buf
                ncodes = cv.len // 8
            while True:
                qidx = offset + scanned
                pos = qidx * RS_CQ_STORE_UNIT_SIZE
                f = None if pos < min_logic else self._find(cq_files, pos, cq_file_size)
                if f is None or not self._open(f, &qv, &q) or pos >= q.end:
                    if first:
                        scanned = -1
                    break
                first = False
                rel = pos - q.start
                take = min((q.end - pos) // RS_CQ_STORE_UNIT_SIZE, scan_limit - scanned)
                for i in range(take):
                    u = q.buf + rel + i * RS_CQ_STORE_UNIT_SIZE
                    phy = rs_load_i64(u)
                    size = rs_load_i32(u + 8)
                    if phy < skip_below:
                        scanned += 1
                        continue
                    if found and (found >= max_n or nbytes + size > max_bytes):
                        full = True
                        break
                    scanned += 1
                    if message_filter is not None:
                        tags = rs_load_i64(u + 12)
                        if not message_filter(tags):
                            filtered += 1
                            removing = False    # the broker's status is the later event's
                            continue
                    # Java's tagsCode.intValue(): the unit's low 32 bits, sign-extended.
                    if by_tags and not _has_code(codes, ncodes,
                                                 <int32_t>(<uint32_t>rs_load_i64(u + 12))):
                        filtered += 1
                        removing = False
                        continue
                    if size <= 0 or phy < 0:    # no record is there: a damaged unit
                        self._on_corrupt(offset + scanned - 1, phy, RS_E_ARG)
                        continue
                    # Units of one queue mostly point into the same CommitLog file: keep it.
                    if not (have_log and lw.start <= phy and phy + size <= lw.end):
                        if batch and lf is not None and not log_rows:
                            held.pop().release()
                        have_log = False
                        log_rows = False
                        lf = self._find(log_files, phy, log_file_size)
                        if lf is not None and (not batch or self._hold(lf)):
                            if batch:
                                held.append(lf)
                            if self._open(lf, &lv, &lw):
                                have_log = True
                            elif batch:
                                held.pop().release()
                                lf = None
                        else:
                            lf = None
                    if not (have_log and lw.start <= phy and phy + size <= lw.end):
                        if not found:
                            removing = True
                        skip_below = phy + log_file_size - phy % log_file_size
                        continue
                    r = rs_msg_check_read(lw.buf, <size_t>(phy + size - lw.start),
                                          phy - lw.start, topic, topic_len, topic_hash, &row,
                                          &rsize)
                    if r != RS_OK or row.phy_offset != phy:
                        if r != RS_OK:
                            self._on_corrupt(offset + scanned - 1, phy, r)
                        continue                # a damaged unit: skipped, as a filter would
                    if topic == NULL or row.topic_hash != topic_hash:
                        # The first record's topic, passed on to the next checks: a queue's
                        # records share it (a copy: the file may be released meanwhile).
                        if row.topic_len <= TOPIC_KEPT:
                            topic_len = <size_t>row.topic_len
                            memcpy(topic_buf, lw.buf + row.pos + row.topic_off, topic_len)
                            topic = topic_buf
                            topic_hash = row.topic_hash
                    if by_tags:
                        # The record's TAGS string: a hash collision passed the unit's test.
                        r = rs_tags_match(lw.buf + row.pos + row.props_off,
                                          <size_t>row.props_len, <const uint8_t *>tv.buf,
                                          <size_t>tv.len, <const int64_t *>ev.buf,
                                          <size_t>(ev.len // 8))
                        if r < 0:
                            _raise_for_status(r, "read: a subscription's tag_ends")
                        if r == 0:
                            filtered += 1
                            removing = False
                            continue
                    if property_filter is not None:
                        m = self._message(lw.buf + row.pos, &row)
                        if not property_filter(m.properties):
                            filtered += 1
                            removing = False
                            continue
                    if batch:
                        # The unit's tagsCode, what a filter sees (a delayed message's unit
                        # holds its delivery time, not the TAGS hash).
                        row.tags_code = rs_load_i64(u + 12)
                        out_rows[found] = row
                        out_file[found] = <int32_t>(len(held) - 1)
                        log_rows = True
                    elif property_filter is not None:
                        messages.append(m)      # made for the filter above
                    else:
                        messages.append(self._message(lw.buf + row.pos, &row))
                    found += 1
                    nbytes += size
                    max_phy = phy
                if full or found >= max_n or scanned >= scan_limit or offset + scanned >= max_off:
                    break
        finally:
            if batch and lf is not None and not log_rows and held:
                held.pop().release()
            PyBuffer_Release(&qv)
            PyBuffer_Release(&lv)
            PyBuffer_Release(&rv)
            PyBuffer_Release(&fv)
            PyBuffer_Release(&cv)
            PyBuffer_Release(&tv)
            PyBuffer_Release(&ev)
        return (found if batch else messages), scanned, removing, max_phy, filtered


@cython.no_gc
@cython.final
cdef class _HeldFiles:
    """read_path.HeldFiles for the results pull_batch builds: the same members and release(),
    and the same release when it goes without release(), done here on deallocation (the
    result has no finalizer, so dropping it costs no Python call). Not tracked by the garbage
    collector: it refers only to MappedFiles and _FileHolds, which never refer back to it, so
    it is in no cycle, and its lists are never cleared before it releases what they hold."""
    cdef readonly list held
    cdef readonly list holds
    cdef ReadPath _path
    cdef bint _done

    def __init__(self, ReadPath path, list held):
        self.held = held
        self.holds = [None] * len(held)
        self._path = path

    def release(self):
        """Release each file, through its _FileHold when one took it over; once."""
        cdef Py_ssize_t k
        if self._done:
            return
        self._done = True
        for k in range(len(self.held)):
            hold = self.holds[k]
            if hold is not None:
                hold.release()
            else:
                self._path._release(self.held[k])

    def __dealloc__(self):
        # The files whose body views were taken stay held by those views (their _FileHold).
        cdef Py_ssize_t k
        if self._done or self.held is None or self.holds is None or self._path is None:
            return
        self._done = True
        for k in range(len(self.held)):
            if self.holds[k] is None:
                self._path._release(self.held[k])


# ---- MessageExt's deallocation ------------------------------------------------------------
cdef extern from "Python.h":
    void _gc_untrack "PyObject_GC_UnTrack"(void *op)
    int PyObject_CallFinalizerFromDealloc(PyObject *op)

DEF MAX_FREE_SLOTS = 32
cdef Py_ssize_t _free_off[MAX_FREE_SLOTS]
cdef Py_ssize_t _free_n = 0
cdef PyTypeObject *_free_type = NULL


cdef void _slots_dealloc(PyObject *o) noexcept:
    """tp_dealloc of the class install_dealloc was given: what subtype_dealloc does for an
    instance of a __slots__ class with no __dict__, __weakref__ or finalizer, without the walk
    of its class chain and member tables (a get_message of 32 spent about a tenth of its
    instructions there). No Python object is made here: the instance's count is already 0."""
    cdef PyTypeObject *t = o.ob_type
    cdef PyObject **slot
    cdef PyObject *v
    cdef Py_ssize_t i
    # A finalizer set on the class later still runs (once: a subclass's ran already).
    if t.tp_finalize != NULL and PyObject_CallFinalizerFromDealloc(o) < 0:
        return                                  # resurrected
    _gc_untrack(o)
    for i in range(_free_n):
        slot = <PyObject **>(<char *>o + _free_off[i])
        v = slot[0]
        if v != NULL:
            slot[0] = NULL
            Py_XDECREF(v)
    t.tp_free(o)
    # A heap type's instance holds a reference to it (subtype_dealloc of a subclass leaves
    # this to its base's dealloc, which this is).
    Py_XDECREF(<PyObject *>t)


def install_dealloc(type cls):
    """Give __slots__ class `cls` (message.MessageExt) a compiled tp_dealloc: the same work as
    CPython's subtype_dealloc for such a class (its members released, the object freed, its
    type's reference dropped), at a fraction of the cost. Subclasses keep CPython's, which
    ends in this one. Refused (TypeError) for a class with an instance __dict__, __weakref__,
    a finalizer, a base holding slots, or a second class."""
    cdef PyTypeObject *t = <PyTypeObject *>cls
    global _free_n, _free_type
    if _free_type == t:
        return
    names = cls.__dict__.get("__slots__")
    if _free_type != NULL or type(names) is not tuple or not names \
            or len(names) > MAX_FREE_SLOTS:
        raise TypeError(f"install_dealloc: {cls.__name__} is not a __slots__ class this "
                        "can take")
    for base in cls.__mro__[1:-1]:
        if base.__dict__.get("__slots__") != () or "__del__" in base.__dict__:
            raise TypeError(f"install_dealloc: base {base.__name__} holds slots or a finalizer")
    if "__del__" in cls.__dict__ or t.tp_finalize != NULL or t.tp_del != NULL \
            or "__dict__" in names or "__weakref__" in names \
            or cls.__basicsize__ != object.__basicsize__ + len(names) * sizeof(PyObject *):
        raise TypeError(f"install_dealloc: {cls.__name__} has a finalizer, __dict__ or "
                        "__weakref__")
    _member_offsets(cls, names, _free_off)
    _free_n = len(names)
    _free_type = t
    t.tp_dealloc = _slots_dealloc


# ---- MessageExt's lazy fields -------------------------------------------------------------
# What a LazyField reads from the record copy (_rec) when its slot is still None.
DEF L_I32 = 0           # a big-endian int32 at a fixed position (BODYCRC)
DEF L_I64 = 1           # a big-endian int64 at a fixed position (offsets, BORNTIMESTAMP)
DEF L_STORED = 2        # BODY as stored
DEF L_BODY = 3          # BODY as given to the user: the stored one unless compressed


cdef class LazyField:
    """LazyField(message_type, slot, kind, pos, fallback, assigned_none): the compiled form of one of
    message.MessageExt's lazy fields (a property over private slot `slot`, None until read
    from the record copy in `_rec`), which message.py puts in place of the Python property
    `fallback` when this module imports. Reading a filled field costs what reading a slot does,
    and a first read makes only the field's own object; every case but the common one (a
    compressed body, a message with no record copy, a record too short for the field) is left
    to `fallback`, so both give the same value by construction. Kinds: INT32 or INT64 at byte
    `pos` of the record, STORED_BODY, BODY. `assigned_none` is what the slot holds once the
    field was assigned None (message._ASSIGNED_NONE), read back as None."""
    INT32 = L_I32
    INT64 = L_I64
    STORED_BODY = L_STORED
    BODY = L_BODY
    cdef type _cls
    cdef Py_ssize_t _slot, _rec, _sysf, _stored
    cdef int _kind
    cdef Py_ssize_t _pos
    cdef object _fallback
    cdef object _none

    def __init__(self, type message_type, str slot, int kind, Py_ssize_t pos, fallback,
                 assigned_none):
        cdef Py_ssize_t off[4]
        if kind < L_I32 or kind > L_BODY or pos < 0:
            _raise_for_status(RS_E_ARG, "LazyField: unknown kind or negative position")
        _member_offsets(message_type, (slot, "_rec", "sys_flag", "_stored"), off)
        self._cls = message_type
        self._slot, self._rec, self._sysf, self._stored = off[0], off[1], off[2], off[3]
        self._kind = kind
        self._pos = pos
        self._fallback = fallback
        self._none = assigned_none

    @property
    def __doc__(self):
        return self._fallback.__doc__

    cdef object _stored_body(self, object obj, const char *rec, Py_ssize_t n):
        """BODY's bytes from the record copy (filling _stored), or None when the record does
        not hold them where its SYSFLAG and BODYLENGTH say."""
        cdef PyObject *sysf = _member(obj, self._sysf)
        cdef int64_t flags
        cdef Py_ssize_t p
        cdef int32_t blen
        cdef int overflow = 0
        if sysf == NULL or type(<object>sysf) is not int:
            return None
        flags = PyLong_AsLongLongAndOverflow(<object>sysf, &overflow)
        if overflow:
            return None
        # BODY follows RECORD_TAIL, whose place follows the hosts' lengths (doc/01 §3.1).
        p = RS_POS_BORNHOST + (RS_HOST_V6_LENGTH if flags & RS_BORNHOST_V6_FLAG
                               else RS_HOST_V4_LENGTH) + 8 + (
            RS_HOST_V6_LENGTH if flags & RS_STOREHOSTADDRESS_V6_FLAG else RS_HOST_V4_LENGTH) + 16
        if p > n:
            return None
        blen = rs_load_i32(<const uint8_t *>rec + p - 4)
        if blen < 0 or blen > n - p:
            return None
        body = PyBytes_FromStringAndSize(rec + p, blen)
        _set_member(obj, self._stored, body)
        return body

    def __get__(self, obj, owner):
        cdef PyObject *v
        cdef PyObject *rec
        cdef const char *p
        cdef Py_ssize_t n
        cdef int64_t flags
        cdef int overflow = 0
        if obj is None or not isinstance(obj, self._cls):
            return self._fallback.__get__(obj, owner)
        v = _member(obj, self._slot)
        if v != NULL and v != <PyObject *>None:
            return None if v == <PyObject *>self._none else <object>v
        rec = _member(obj, self._rec)
        if v == NULL or rec == NULL or type(<object>rec) is not bytes:
            return self._fallback.__get__(obj, owner)
        p = PyBytes_AS_STRING(<object>rec)
        n = PyBytes_GET_SIZE(<object>rec)
        out = None
        if self._kind == L_I32:
            if self._pos <= n - 4:
                out = rs_load_i32(<const uint8_t *>p + self._pos)
        elif self._kind == L_I64:
            if self._pos <= n - 8:
                out = rs_load_i64(<const uint8_t *>p + self._pos)
        elif self._kind == L_STORED:
            return self._stored_body(obj, p, n) or self._fallback.__get__(obj, owner)
        else:
            # A compressed body is decompressed by the Python property (doc/01 §3.5).
            sysf = _member(obj, self._sysf)
            if sysf == NULL or type(<object>sysf) is not int:
                return self._fallback.__get__(obj, owner)
            flags = PyLong_AsLongLongAndOverflow(<object>sysf, &overflow)
            if overflow or flags & RS_COMPRESSED_FLAG:
                return self._fallback.__get__(obj, owner)
            v = _member(obj, self._stored)
            if v == <PyObject *>self._none:         # stored_body was assigned None
                return self._fallback.__get__(obj, owner)
            if v != NULL and v != <PyObject *>None:
                out = <object>v
            else:
                out = self._stored_body(obj, p, n)
        if out is None:
            return self._fallback.__get__(obj, owner)
        _set_member(obj, self._slot, out)
        return out

    def __set__(self, obj, value):
        if not isinstance(obj, self._cls):
            self._fallback.__set__(obj, value)
            return
        _set_member(obj, self._slot, self._none if value is None else value)

    def __delete__(self, obj):
        self._fallback.__delete__(obj)
