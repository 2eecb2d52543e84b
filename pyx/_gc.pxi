# SPDX-License-Identifier: Apache-2.0
# SYNC_FLUSH group commit waits in compiled code (csrc/rs_gc.h): the state a
# services.flush.CompiledGroupCommitService keeps, and the put's wait with the GIL released
# once for all of it (doc/03 §2.2).

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec as _gc_timespec


cdef inline int64_t _gc_now_ns() noexcept nogil:
    """time.monotonic_ns(): the clock of GroupCommit's deadlines (not the coarse one of the
    put statistics, which may lag by milliseconds and end a wait that early)."""
    cdef _gc_timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec

__all__ += ("GroupCommit",)

cdef class GroupCommit:
    """The group commit's waits: `wait(offset, deadline_ns)` sleeps without the GIL until a
    sync covers `offset` (RS_GC_DONE, or RS_GC_LATE past the deadline), the deadline passes
    (RS_GC_TIMEOUT), close() ends it (RS_GC_CLOSED), or the caller is to lead the next sync
    (RS_GC_LEAD: it syncs, then calls done()); the values of csrc/rs_gc.h. Deadlines are
    time.monotonic_ns() values. A leader gathers only while its sync would cover fewer than
    `gather_bytes` bytes (0: never)."""

    cdef uint8_t *_st
    cdef size_t _len
    cdef public int64_t gather_bytes

    def __cinit__(self, int64_t flushed):
        self._len = RS_GC_STATE_BYTES
        self._st = <uint8_t *>PyMem_Malloc(self._len)
        if self._st == NULL:
            raise MemoryError()
        _check(rs_gc_init(self._st, self._len, flushed), "GroupCommit")
        self.gather_bytes = INT64_MAX     # gather at any size, until the owner bounds it

    def __dealloc__(self):
        if self._st != NULL:
            # No wait can be running: each holds a reference to this object.
            rs_gc_destroy(self._st, self._len)
            PyMem_Free(self._st)
            self._st = NULL

    cdef inline int c_wait(self, int64_t offset, int64_t deadline_ns) except -1:
        cdef int r
        cdef int64_t gather_bytes = self.gather_bytes
        with nogil:
            r = rs_gc_wait(self._st, self._len, offset, deadline_ns, gather_bytes)
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
        covers wake, one after another (`relayed` counts the hops); the lowest wait left leads
        next. Returns how many waits it served."""
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
    def relayed(self):
        return self._stat(RS_GC_ST_RELAYED)

    @property
    def gather_ns(self):
        return self._stat(RS_GC_ST_GATHER_NS)

    @gather_ns.setter
    def gather_ns(self, int64_t ns):
        _check(rs_gc_set_gather_ns(self._st, self._len, ns), "GroupCommit.gather_ns")


__all__ += ("SyncWait",)


cdef class SyncWait:
    """CommitLog.after_put for SYNC_FLUSH on compiled waits (MessageStore._after_put_sync,
    compiled): a put that WAIT=false exempts wakes the service and answers `ok`; any other
    waits in GroupCommit.wait with the GIL released, and a put woken by the sync that covered
    it answers `ok` with no Python frame. What else the wait answers (lead the next sync,
    retry, time out) goes to `resume(offset, deadline_ns, answer)` (the service's Python),
    whose truth is `ok`, else `timed_out`. The timeout is config.sync_flush_timeout ms, read
    per put as the Python path does."""

    cdef GroupCommit _gc
    cdef object _resume, _wakeup, _config, _ok, _timed_out, _wait_key

    def __init__(self, GroupCommit gc, resume, wakeup, config, ok, timed_out, wait_key):
        self._gc = gc
        self._resume = resume
        self._wakeup = wakeup
        self._config = config
        self._ok = ok
        self._timed_out = timed_out
        self._wait_key = wait_key

    def __call__(self, int64_t end_offset, msg):
        cdef int64_t deadline
        cdef int r
        props = msg.properties
        if props.get(self._wait_key) == "false":
            self._wakeup()
            return self._ok
        deadline = _gc_now_ns() + <int64_t>self._config.sync_flush_timeout * 1000000
        r = self._gc.c_wait(end_offset, deadline)
        if r == RS_GC_DONE or self._resume(end_offset, deadline, r):
            return self._ok
        return self._timed_out
