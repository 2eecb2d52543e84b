# SPDX-License-Identifier: Apache-2.0
# SYNC_FLUSH group commit waits in compiled code (csrc/rs_gc.h): the state a
# services.flush.CompiledGroupCommitService keeps, and the put's wait with the GIL released
# once for all of it (doc/03 §2.2).

from cpython.mem cimport PyMem_Free, PyMem_Malloc

__all__ += ("GroupCommit",)

cdef class GroupCommit:
    """The group commit's waits: `wait(offset, deadline_ns)` sleeps without the GIL until a
    sync covers `offset` (RS_GC_DONE, or RS_GC_LATE past the deadline), the deadline passes
    (RS_GC_TIMEOUT), close() ends it (RS_GC_CLOSED), or the caller is to lead the next sync
    (RS_GC_LEAD: it syncs, then calls done()); the values of csrc/rs_gc.h. Deadlines are
    time.monotonic_ns() values."""

    cdef uint8_t *_st
    cdef size_t _len
    cdef public bint gather

    def __cinit__(self, int64_t flushed):
        self._len = RS_GC_STATE_BYTES
        self._st = <uint8_t *>PyMem_Malloc(self._len)
        if self._st == NULL:
            raise MemoryError()
        _check(rs_gc_init(self._st, self._len, flushed), "GroupCommit")
        self.gather = True

    def __dealloc__(self):
        if self._st != NULL:
            # No wait can be running: each holds a reference to this object.
            rs_gc_destroy(self._st, self._len)
            PyMem_Free(self._st)
            self._st = NULL

    cdef inline int c_wait(self, int64_t offset, int64_t deadline_ns) except -1:
        cdef int r
        cdef int gather = self.gather
        with nogil:
            r = rs_gc_wait(self._st, self._len, offset, deadline_ns, gather)
        if r < 0:
            _check(r, "GroupCommit.wait")
        return r

    def wait(self, int64_t offset, int64_t deadline_ns):
        """One of RS_GC_DONE, LEAD, TIMEOUT, CLOSED, LATE (see the class)."""
        return self.c_wait(offset, deadline_ns)

    def try_lead(self):
        """True if the caller now leads the next sync (none was running), else False."""
        cdef int r = rs_gc_try_lead(self._st, self._len)
        _check(r, "GroupCommit.try_lead")
        return r == 1

    def done(self, int64_t flushed, bint ok, int64_t sync_ns=0):
        """The leader's sync ended: with `ok`, [.., flushed) is durable and the waits it
        covers wake; the lowest wait left leads next. Returns how many waits woke."""
        cdef int64_t n
        with nogil:
            n = rs_gc_done(self._st, self._len, flushed, ok, sync_ns)
        if n < 0:
            _check(<int>n, "GroupCommit.done: the caller does not lead")
        return n

    def close(self):
        """End every wait: GC_DONE where the durable offset covers it, else GC_CLOSED; so do
        later waits."""
        with nogil:
            rs_gc_close(self._st, self._len)

    def reset(self, int64_t flushed):
        """The durable offset is `flushed` (the CommitLog was cut back or emptied); ValueError
        while a sync is claimed or a put waits."""
        if rs_gc_reset(self._st, self._len, flushed) != RS_OK:
            raise ValueError("a sync is running or a put waits: the durable offset cannot move")

    cdef _stat(self, int i):
        cdef int64_t out[RS_GC_ST_N]
        _check(rs_gc_stats(self._st, self._len, out, RS_GC_ST_N), "GroupCommit.stats")
        return out[i]

    @property
    def flushed(self):
        return self._stat(RS_GC_ST_FLUSHED)

    @property
    def leading(self):
        return bool(self._stat(RS_GC_ST_LEADER))

    @property
    def waiting(self):
        return self._stat(RS_GC_ST_WAITING)

    @property
    def producers(self):
        return self._stat(RS_GC_ST_PRODUCERS)

    @property
    def gathering(self):
        return bool(self._stat(RS_GC_ST_GATHERING))

    @property
    def closed(self):
        return bool(self._stat(RS_GC_ST_CLOSED))

    @property
    def gather_ns(self):
        return self._stat(RS_GC_ST_GATHER_NS)

    @gather_ns.setter
    def gather_ns(self, int64_t ns):
        _check(rs_gc_set_gather_ns(self._st, self._len, ns), "GroupCommit.gather_ns")
