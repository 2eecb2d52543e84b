# SPDX-License-Identifier: Apache-2.0
# The reput thread's pass as one GIL-free section (included by _cext.pyx, after
# _cq_dispatch.pxi, whose CqSlots and row loop it calls).
#
# A scan, the ConsumeQueue row loop and the index row loop each released and retook the GIL;
# while a writer runs Python, each retake can wait for the 5 ms switch interval, so a pass
# of a few thousand rows waited up to 15 ms, and reput fell behind the writer. Here the three
# run back to back in one GIL-free section; the GIL is taken before it (to pin the buffers
# and load the queues the previous pass wrote to) and after it (to publish). A put's own few
# rows keep the GIL throughout (NOGIL_DISPATCH_ROWS). Whatever the
# common rows do not cover -- a queue not loaded, a roll, a full index file -- goes back to
# the dispatchers' own paths, from the row where each loop stopped.

__all__ += ("reput_dispatch",)

# A put's own rows (`given`) are dispatched without the GIL from this many on. Fewer are
# dispatched with the GIL held, in one piece: a release that short only wakes a service thread
# waiting for the GIL (reput, populate-ahead), which finds it taken back and sleeps again, and
# that wake-up costs the putter more than the rows (doc/performance.md, "A put's few rows
# dispatched with the GIL held": put_messages of 1 and of 10 took a fifth less thread CPU a
# call this way; from about 200 rows, holding the GIL through the rows was the slower).
DEF NOGIL_DISPATCH_ROWS = 32


def reput_dispatch(buf, int64_t start, int64_t end, rows, Py_ssize_t prev_n, CqSlots slots,
                   index_file, Py_ssize_t given=0):
    """Scan the records of buf[start:end] into `rows` (format.SCAN_DTYPE, as commitlog_scan
    does, CRC unchecked), then append the ConsumeQueue units of the rows (as cq_dispatch's
    common case, with `slots`) and put their keys into `index_file` (as index_dispatch, from
    its first key; None: no index), without the GIL from the scan to the last key (with it
    for fewer than NOGIL_DISPATCH_ROWS `given` rows).

    Before the section, the queues of rows[:prev_n] -- the previous pass's rows, still in
    `rows` -- are loaded from their Python objects, so a steady stream of rows to the same
    queues needs no GIL inside it. That is done only while passes return to the queues of
    the pass before: with rows spread over more queues than a pass holds (40 000 queues,
    4096 rows), each pass meets other queues, and loading (and unpinning) the last pass's
    thousands of queues would be pure cost. When the run stops at a row whose queue is not
    loaded, the queues of the rows from there are loaded with the GIL and a second GIL-free
    section goes on from that row (the index's keys are put in the last section). The units
    written are published (positions into the cells of the queues and their files)
    before this returns, however it returns.

    Returns (count, stop_pos, reason, stop_size) as commitlog_scan, then (cq_row, last_ts):
    the first row whose unit is not written (count when all are) and the store timestamp of
    the last row dispatched by the units' rules, then (index_row, index_skip, index_stop) as
    rs_index_dispatch leaves them (index_row = count, index_stop = 0 when every key is in).

    `given` > 0: rows[:given] are the rows of exactly the records of buf[start:end], made by
    the put that wrote them (batch_encode's or PutPath.put_list's `rows`), and are not
    scanned again: the pass returns (given, end, SCAN_END, 0, ...) as the scan would.
    prev_n must then be 0 (the rows are the put's, not the previous pass's)."""
    cdef Py_buffer b, rv, iv
    cdef const rs_scan_rec *base
    cdef int64_t cap, count = 0, stop_pos = 0, last_ts = 0
    cdef int32_t reason = 0, stop_size = 0, istop = RS_INDEX_STOP_NONE
    cdef int r = RS_OK, ri = RS_OK, need = 0
    cdef Py_ssize_t i_cq = 0, loaded_to
    cdef size_t irow = 0, iskip = 0
    cdef int32_t slot_num = 0, index_num = 0
    cdef int64_t limit = 0
    cdef bint indexing = index_file is not None
    cdef bint release = given == 0 or given >= NOGIL_DISPATCH_ROWS
    cdef void *save = NULL
    memset(&b, 0, sizeof(b))
    memset(&rv, 0, sizeof(rv))
    memset(&iv, 0, sizeof(iv))
    try:
        _ro(buf, &b)
        if start < 0 or end > b.len or start > end:
            _raise_for_status(RS_E_BOUNDS, "reput_dispatch")
        dtype = getattr(rows, "dtype", None)
        # Identity first: the rows' arrays are made with SCAN_DTYPE itself, and the equality
        # of two structured dtypes is a comparison of their fields (~150 instructions).
        if dtype is not None and dtype is not _SCAN_DTYPE and dtype != _SCAN_DTYPE:
            _raise_for_status(RS_E_ARG, "reput_dispatch: rows must be a SCAN_DTYPE array")
        _rw(rows, &rv)
        cap = rv.len // SCAN_REC_SIZE
        base = <const rs_scan_rec *>rv.buf
        if prev_n < 0 or prev_n > cap:
            _raise_for_status(RS_E_ARG, "reput_dispatch: prev_n outside rows")
        if given < 0 or given > cap or (given and prev_n):
            _raise_for_status(RS_E_ARG, "reput_dispatch: given outside rows")
        if indexing:
            slot_num = index_file.slot_num
            index_num = index_file.index_num
            imf = index_file.mf
            limit = imf.refill_position     # see index_dispatch
            _rw(imf.mm, &iv)    # pinned: the file cannot unmap under the loop (IndexFile.mm,
                                # without the property's Python frame)
        # The last pass's queues, loaded (and pinned) with the GIL held now rather than by a
        # retake in the middle. Their rows' topic bytes are compared in buf[:start] only,
        # bytes already read as records: past them lie unwritten pages, and reading a hole
        # of a shared mapping allocates a page (on tmpfs; SIGBUS on a full disk). Rows from
        # another file compare unequal or out of bounds, and their queues stay unloaded.
        if prev_n and slots.preload:
            slots.load_run(base, 0, prev_n, prev_n, <const char *>b.buf, start)
        slots.t.pass_no += 1
        slots.t.distinct = slots.t.recur = 0
        if given:
            # The put's rows' queues, loaded first: every pass unloads the queues it touched
            # (publish), so a section run before this would stop at the first row for them.
            slots.load_run(base, 0, given, given, <const char *>b.buf, b.len)
        # Only C from here to the restore: no Python object is touched without the GIL.
        save = PyEval_SaveThread() if release else NULL
        if given:
            # The put's rows: what the scan would make of buf[start:end] (the caller
            # checked they span it), so only the dispatch is left to do.
            count = given
            stop_pos = end
        else:
            r = rs_commitlog_scan(<const uint8_t *>b.buf, <size_t>b.len, start, end, 0,
                                  <rs_scan_rec *>rv.buf, cap, &count, &stop_pos, &reason,
                                  &stop_size)
        if r == RS_OK and count:
            i_cq = _cq_run(&slots.t, base, 0, count, <const char *>b.buf, b.len,
                           &last_ts, &need)
            if indexing and need != NEED_LOAD:
                ri = rs_index_dispatch(<uint8_t *>iv.buf, <size_t>iv.len, slot_num,
                                       index_num, limit, <const uint8_t *>b.buf,
                                       <size_t>b.len, base, <size_t>count, &irow, &iskip,
                                       &istop)
        if save != NULL:
            PyEval_RestoreThread(save)
            save = NULL
        if r == RS_OK and count and need == NEED_LOAD:
            # The rows' own queues, loaded now: their topic bytes lie in records just scanned.
            # A row load_run cannot foresee (a queue Python must take first) ends the second
            # run; the caller's dispatcher takes the rows from where it stopped.
            loaded_to = slots.load_run(base, i_cq, count, count, <const char *>b.buf, b.len)
            save = PyEval_SaveThread() if release else NULL
            i_cq = _cq_run(&slots.t, base, i_cq, loaded_to, <const char *>b.buf, b.len,
                           &last_ts, &need)
            if indexing:
                ri = rs_index_dispatch(<uint8_t *>iv.buf, <size_t>iv.len, slot_num,
                                       index_num, limit, <const uint8_t *>b.buf,
                                       <size_t>b.len, base, <size_t>count, &irow, &iskip,
                                       &istop)
            if save != NULL:
                PyEval_RestoreThread(save)
                save = NULL
        if slots.t.distinct:
            # Load this pass's queues before the next one only if most queues of this pass
            # were those of the pass before.
            slots.preload = 2 * slots.t.recur >= slots.t.distinct
        _check(r, "reput_dispatch: scan")
        _check(ri, "reput_dispatch: index")
        if not indexing:
            irow = <size_t>count
    finally:
        slots.publish()             # the units are readable from here on; pins released
        PyBuffer_Release(&iv)
        PyBuffer_Release(&rv)
        PyBuffer_Release(&b)
    return (count, stop_pos, reason, stop_size, i_cq, last_ts, <int64_t>irow, <int64_t>iskip,
            istop)


__all__ += ("PutDispatch",)


cdef class PutDispatch:
    """PutDispatch(mfq, arrivals, mapped_file_type, file_size)

    A put's dispatch of its own rows as one compiled call, for
    ReputMessageService.dispatch_if_behind (with its dispatch_lock held):
    `(written, reput_from_offset, cuts, run, cqd, idx)`, with the put's
    services.reput.WrittenRows, where dispatch stands, the service's count of CommitLog cuts,
    its reput_dispatch and the two dispatchers it runs (the service's _fused_parts: the
    ConsumeQueue dispatcher and the IndexService, with the compiled loops).

    When the rows are exactly what a pass would scan next -- they begin at
    `reput_from_offset`, in the CommitLog file (of `mfq`) that holds it, and end within its
    readable area, and no cut came since the put began (WrittenRows.cuts) -- they are
    dispatched by `run` without a scan, each dispatcher's own path taking the rows after
    where its loop stopped, and the waiting consumers of `arrivals` are woken. Returns where
    dispatch then stands; -1, with nothing done, leaves the rows to the service's scan. A
    dispatcher's OS error is raised (the service counts it). The rows are spent
    (written.n = 0) once a file was held for them.

    The service's methods did this in Python, a score of calls a put: for a put_messages of
    one message they were a third of its instructions (doc/performance.md, "A small put's
    fixed cost")."""
    cdef object _mfq
    cdef object _arrivals
    cdef type _file_type
    cdef int64_t _file_size
    cdef Py_ssize_t _f[7]           # _MF_SLOTS

    def __init__(self, mfq, arrivals, type mapped_file_type, int64_t file_size):
        _member_offsets(mapped_file_type, _MF_SLOTS, self._f)
        self._mfq = mfq
        self._arrivals = arrivals
        self._file_type = mapped_file_type
        self._file_size = file_size

    def __call__(self, written, int64_t reput_from_offset, cuts, run, cqd, idx):
        cdef int64_t offset = written.offset, nbytes = written.nbytes, start, end
        cdef Py_ssize_t n = written.n
        if offset != reput_from_offset or written.cuts != cuts:
            return -1
        slots = cqd.slots
        if slots is None:               # reput_dispatch would take None for its CqSlots
            return -1
        files = self._mfq.files
        if type(files) is not list:
            return -1
        mf = _mf_find(<list>files, offset, self._file_size, self._f)
        if mf is None or not isinstance(mf, self._file_type) or not _mf_hold(mf, self._f):
            return -1
        try:
            start = offset - <int64_t><object>_member(mf, self._f[R_FROM])
            end = start + nbytes
            # The readable area (MappedFile.read_position): a reader never sees a unit
            # before its record (doc/02).
            if start < 0 or end > <int64_t><object>_member(mf, self._f[R_READ]):
                return -1
            target = idx.fused_target(offset)
            if target is False:         # the index needs the scan's path
                return -1
            # Enough rows for the index worker to be worth a hand-off: their keys are put
            # on the other core while this thread returns (IndexWorker).
            worker = (idx.worker if target is not None and n >= NOGIL_DISPATCH_ROWS else None)
            buf = <object>_member(mf, self._f[R_MM])
            rows = written.rows
            (count, _, _, _, cq_row, last_ts, index_row, index_skip,
             _) = run(buf, start, end, rows, 0, slots, target if worker is None else None, n)
            if count:
                if last_ts:
                    cqd.dispatched_until(last_ts)
                if cq_row < count:
                    cqd.dispatch_array(rows[cq_row:count], buf)
                if worker is None and target is not None and index_row < count:
                    idx.dispatch_from(rows[:count], buf, target, index_row, index_skip)
            if self._arrivals.waiting:
                self._arrivals.notify(rows[:n])
            if worker is not None and count:
                # The rows go with the job; the put gets the job before's back.
                written.rows = (<IndexWorker>worker).submit(rows, count, buf, mf, target)
            return offset + nbytes
        finally:
            _mf_release(mf, self._f)
            written.n = 0


__all__ += ("IndexWorker",)


cdef class IndexWorker:
    """IndexWorker(finish)

    The index keys of a put's rows, put into their IndexFile by the worker thread of
    csrc/rs_index_worker.h while the putting thread goes on (PutDispatch submits them). They were a
    tenth of that thread's CPU in put_messages of 1 000 (doc/performance.md, "The index on the
    other core"). One job at a time: `settle()` waits for it (or, when the worker has not
    started it, takes it back and runs it in the caller's thread), then -- where the worker
    stopped before the last key (a full file to roll, blocks to reserve) -- calls
    `finish(rows, buf, target, row, skip, again)` with the GIL (IndexService._finish_worker),
    then lets go of the job's buffers and files. Whatever uses the index settles first: the
    index service does, at each of its entry points.

    A job holds (MappedFile.hold) the CommitLog file whose records it reads and the index file
    it writes, and pins their mappings, until it is settled. When `finish` raises (an OSError
    rolling a file on a full disk) the job stays pending, and the next settle calls it again
    with `again` True: from the first row then, the index service skipping what the file
    holds already. A job of a process that is not the worker's (a fork's child) runs in the
    caller's thread. The worker never runs Python and never takes the GIL."""

    cdef uint8_t *_st
    cdef size_t _len
    cdef bint _started
    cdef rs_index_job _job
    cdef Py_buffer _b, _iv, _rv
    cdef object _rows, _spare, _buf, _mf, _target, _lock, _finish
    cdef readonly bint pending      # a job submitted and not yet settled
    cdef bint _again
    cdef readonly int64_t jobs      # submitted so far
    cdef readonly int64_t waited    # settles that found the worker still at it
    cdef readonly int64_t reclaimed  # jobs taken back before the worker started them

    def __cinit__(self, finish):
        self._len = RS_INDEX_WORKER_STATE_BYTES
        self._st = <uint8_t *>PyMem_Calloc(1, self._len)
        if self._st == NULL:
            raise MemoryError()
        _check(rs_index_worker_init(self._st, self._len), "IndexWorker: starting the index worker")
        self._started = True

    def __init__(self, finish):
        self._finish = finish
        self._lock = _ThreadLock()

    def __dealloc__(self):
        if self._started:
            rs_index_worker_close(self._st, self._len)       # waits for a job still running
            self._started = False
        PyBuffer_Release(&self._b)
        PyBuffer_Release(&self._iv)
        PyBuffer_Release(&self._rv)
        PyMem_Free(self._st)
        self._st = NULL

    def submit(self, rows, Py_ssize_t count, buf, mf, target):
        """Put the keys of rows[:count] (format.SCAN_DTYPE, of records in `buf`, the mapping
        of CommitLog file `mf`) into IndexFile `target` from its first key, on the worker.
        The caller settled the job before. Returns the rows array of the job before (None
        for the first), for the caller's next rows: `rows` is the job's until it is
        settled."""
        if self.pending:
            raise RuntimeError("IndexWorker.submit: the job before is not settled")
        if count <= 0 or count > len(rows):
            raise ValueError("IndexWorker.submit: count outside rows")
        imf = target.mf
        if not mf.hold():
            raise OSError("IndexWorker.submit: the CommitLog file is being destroyed")
        if not imf.hold():
            mf.release()
            raise OSError("IndexWorker.submit: the index file is being destroyed")
        try:
            _ro(buf, &self._b)
            _rw(imf.mm, &self._iv)
            _ro(rows, &self._rv)
            if self._rv.len < count * SCAN_REC_SIZE:
                _raise_for_status(RS_E_ARG, "IndexWorker.submit: rows")
        except BaseException:
            self._let_go(mf, imf)
            raise
        self._job.ibuf = <uint8_t *>self._iv.buf
        self._job.ilen = <size_t>self._iv.len
        self._job.buf = <const uint8_t *>self._b.buf
        self._job.len = <size_t>self._b.len
        self._job.rows = <const rs_scan_rec *>self._rv.buf
        self._job.nrows = <size_t>count
        self._job.limit = imf.refill_position       # see index_dispatch
        self._job.slot_num = target.slot_num
        self._job.index_num = target.index_num
        self._job.row = 0
        self._job.skip = 0
        self._job.stop = RS_INDEX_STOP_NONE
        self._job.status = RS_OK
        self._rows = rows
        self._buf = buf
        self._mf = mf
        self._target = target
        self.pending = True
        self.jobs += 1
        if rs_index_worker_submit(self._st, self._len, &self._job) != RS_OK:
            self._run_here()        # no worker in this process (a fork's child)
        spare = self._spare
        self._spare = None
        return spare

    def settle(self):
        """Wait for the job, finish it where the worker stopped, and let go of its buffers and
        files. Nothing when none is pending. Raises what the job or `finish` raised (the job
        then stays pending; see the class)."""
        cdef int status
        if not self.pending:
            return
        with self._lock:
            if not self.pending:
                return
            if rs_index_worker_pending(self._st, self._len):
                if rs_index_worker_reclaim(self._st, self._len):
                    # Not started: the worker is waiting for a CPU. Done here instead.
                    self.reclaimed += 1
                    self._run_here()
                else:
                    self.waited += 1
                    with nogil:
                        rs_index_worker_wait(self._st, self._len)
            status = self._job.status
            if status != RS_OK:
                # The kernel refused before any write (bad geometry or rows outside the
                # CommitLog file): the job cannot be done again any better.
                self._done()
                _check(status, "IndexWorker: index dispatch")
            if self._again or self._job.row < self._job.nrows:
                try:
                    self._finish(self._rows[:self._job.nrows], self._buf, self._target,
                                 <Py_ssize_t>self._job.row, <Py_ssize_t>self._job.skip,
                                 self._again)
                except BaseException:
                    self._again = True
                    raise
            self._done()

    cdef _run_here(self):
        """The job, run in the caller's thread (without the GIL)."""
        with nogil:
            rs_index_job_run(&self._job)

    cdef _done(self):
        self._let_go(self._mf, self._target.mf)
        self._spare = self._rows
        self._rows = self._buf = self._mf = self._target = None
        self._again = False
        self.pending = False

    cdef _let_go(self, mf, imf):
        PyBuffer_Release(&self._b)
        PyBuffer_Release(&self._iv)
        PyBuffer_Release(&self._rv)
        imf.release()
        mf.release()

    def close(self):
        """Settle the job, then stop the worker and join its thread. Idempotent."""
        try:
            self.settle()
        finally:
            if self._started:
                with nogil:
                    rs_index_worker_close(self._st, self._len)
                self._started = False
