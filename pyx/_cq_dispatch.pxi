# SPDX-License-Identifier: Apache-2.0
# ConsumeQueue dispatch, the reput thread's hot loop (included by _cext.pyx).
#
# The row loop runs without the GIL: each queue's append state is a C struct found through a
# C hash table, and the mapping it writes to is pinned (a buffer export, so close() refuses
# to unmap it) from the moment the state is loaded from the Python objects until it is
# published: the positions go into int64 cells that readers read them from (the file's and
# the queue's `_cell`, see mapped_file.CqMappedFile), with plain stores and no Python int.
# Before each GIL-free run, one pass with the GIL loads the state of
# every queue the rows touch, so the run does not leave and retake the GIL per queue (with
# 40 000 queues, nearly one per row; each retake can wait for the writer's switch interval).
# The GIL is taken inside a run only for the rare rows (a queue seen for the first time, a
# roll, a reservation, SCHEDULE_TOPIC_XXXX) and to publish.
#
# A queue's state survives from call to call, and the Python side says when it is stale:
# every change Python makes to a queue's files or positions goes through a ConsumeQueue
# method, which bumps the queue's `_version` (consume_queue.py). Loading a kept state is then
# one identity check of that member and the pin of its mapping; only on a different version
# (recovery, truncation, cleaning, destruction, a row Python dispatched, a roll) is the state
# read from the objects again. With 40 000 queues, each call touches thousands of queues
# about once each: the objects a queue's load and publish touch are prefetched a few rows
# ahead, so their cache misses overlap instead of adding up.

__all__ += ("CqSlots", "cq_dispatch")


# What the GIL-free run stopped for.
DEF NEED_NOTHING = 0
DEF NEED_LOAD = 1       # the row's queue is known but not loaded in this call
DEF NEED_SLOW = 2       # the row goes to Python
DEF NEED_RESERVE = 3    # the row's unit would pass its file's reserved end, as last read

# Rows whose queues are loaded before a GIL-free run, once a run met a row Python takes that
# loading could not foresee. Until then a run covers the whole call: each GIL-free section
# ends with a GIL retake, which can wait for the writer's switch interval (5 ms).
DEF LOAD_AHEAD = 512

# The row loop's unit prefetches, issued PF_BLOCK at a time: with 40 000 queues nearly every
# row's unit lies on a page of its own, and a prefetch that misses the TLB holds retirement
# until its page walk ends (perf: most of the loop's time sat on the prefetch, one row ahead
# at a time). In a loop of only prefetches, a block's page walks overlap. (load_run and
# publish keep their per-row distances: issued by blocks there, they measured slower.)
DEF PF_BLOCK = 16
# Prefetch distances, in rows (load_run) or queues (publish): the table entry first, the
# state when the entry has arrived, the objects the state points at when it has.
DEF PF_ENTRY = 16
DEF PF_STATE = 10
DEF PF_OBJECTS = 5


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #  define rs_prefetch_r(p) __builtin_prefetch((const void *)(p), 0, 3)
    #  define rs_prefetch_w(p) __builtin_prefetch((const void *)(p), 1, 3)
    #else
    #  define rs_prefetch_r(p) ((void)(p))
    #  define rs_prefetch_w(p) ((void)(p))
    #endif
    """
    void rs_prefetch_r(const void *p) noexcept nogil
    void rs_prefetch_w(const void *p) noexcept nogil


cdef struct _CqState:
    int64_t key                 # (topic hash << 32) | queue id
    const char *topic           # the topic's bytes: `short_topic`, or owned by the _CqSlot
    Py_ssize_t topic_len
    char *addr                  # the last file's mapping, pinned while `loaded`
    # refill: the file's refill_position, where the writer asks for the next window (its
    # reserved end, or half a window before it when a PopulateAheadService populates ahead);
    # reserved: its reserved_position, as last read (it only grows while the state is kept)
    int64_t cap, wrote, refill, reserved, size, base, max_phy
    uint64_t gen                # the call that loaded it; another call must load again
    uint64_t pass_no            # the last reput pass that appended to it (see _CqTable)
    bint loaded                 # loaded and pinned in the current call
    # The loop wrote past `refill` (below `reserved`): publish asks for the next window
    # (ConsumeQueue.refill_written) instead of the loop handing the row to Python.
    bint refill_due
    bint appendable             # loaded with a file this loop can append to
    # A topic up to 48 bytes is kept here, beside the fields every row reads: with 40 000
    # queues each row's topic comparison would otherwise be one more cache miss.
    char short_topic[48]
    # Kept between calls (`cached`): the objects the state was read from, borrowed from the
    # _CqSlot that holds them, and the positions they hold (what was last loaded or
    # published), so publishing compares integers instead of reading the objects.
    bint cached
    bint pinned                 # mm's export taken for the current call
    int64_t pub_wrote, pub_max
    # The cells readers read the positions from (CqMappedFile._cell: wrote, committed;
    # ConsumeQueue._cell: max_physic_offset), exported by the _CqSlot so they cannot be
    # resized: publishing is a plain store into them. pos_cell is set while `cached`.
    int64_t *pos_cell
    int64_t *max_cell
    PyObject *owner             # its _CqSlot (kept alive by CqSlots)
    PyObject *cq
    PyObject *file
    PyObject *mm
    PyObject *version           # the queue's `_version` when the state was read


cdef struct _CqEntry:          # key and state side by side: one cache line per probe
    int64_t key
    _CqState *st


cdef struct _CqTable:
    _CqEntry *e
    size_t cap                  # a power of two
    uint64_t gen                # bumped at every publish: loaded states go stale
    # Per reput pass (reput_dispatch numbers them): the queues the pass appended to, and how
    # many of those the pass before appended to too, so the next pass knows whether loading
    # the last pass's queues ahead pays.
    uint64_t pass_no
    Py_ssize_t distinct, recur


cdef inline void _prefetch_lines(const _CqState *st) noexcept nogil:
    """Every cache line of a state. It lives inside its _CqSlot object, at no particular
    alignment: its 232 bytes span four or five lines, and the last one holds the objects
    loading and publishing read first (perf: prefetching three lines from its start left
    the loads of st.file and st.mm missing)."""
    cdef const char *p = <const char *>st
    cdef const char *last
    if p == NULL:
        return
    last = p + sizeof(_CqState) - 1
    while p <= last:
        rs_prefetch_w(p)
        p += 64
    rs_prefetch_w(last)


cdef inline int64_t _cq_key(const rs_scan_rec *r) noexcept nogil:
    """A row's queue: (topic hash << 32) | queue id."""
    return (<int64_t>r.topic_hash << 32) | <int64_t><uint32_t>r.queue_id


cdef inline _CqState *_cq_find(const _CqTable *t, int64_t key) noexcept nogil:
    cdef size_t i = rs_mix(<uint64_t>key, t.cap - 1)
    while t.e[i].st != NULL:
        if t.e[i].key == key:
            return t.e[i].st
        i = (i + 1) & (t.cap - 1)
    return NULL


cdef inline void _cq_insert(_CqTable *t, _CqState *st) noexcept nogil:
    cdef size_t i = rs_mix(<uint64_t>st.key, t.cap - 1)
    while t.e[i].st != NULL:
        i = (i + 1) & (t.cap - 1)
    t.e[i].key = st.key
    t.e[i].st = st


DEF SEEN_KEYS = 16


cdef struct _SeenKeys:
    # A few queue keys, direct-mapped: load_run's queues already loaded in this call.
    uint32_t mask               # bit h: key[h] holds a key
    int64_t key[SEEN_KEYS]


cdef inline size_t _seen_slot(int64_t key) noexcept nogil:
    """A key's slot: its queue id plus a hash of its topic, so the queues of one topic (ids
    0, 1, 2 ...) take slots of their own, where a mixed hash of 4 keys into 16 slots would
    put two in one slot a third of the time."""
    return (<uint32_t>key + ((<uint32_t>(key >> 32) * 0x9E3779B1u) >> 28)) & (SEEN_KEYS - 1)


cdef struct _SeenStates:
    # _SeenKeys with each key's state.
    uint32_t mask
    int64_t key[SEEN_KEYS]
    _CqState *st[SEEN_KEYS]


cdef extern from *:
    """
    /* Whether a[0:n] == b[0:n]: inline for the short strings topics are (two overlapping
       word compares up to 16 bytes), memcmp past that. */
    static inline int rs_bytes_eq(const void *a, const void *b, size_t n) {
        const unsigned char *p = (const unsigned char *)a, *q = (const unsigned char *)b;
        uint64_t x, y, u, v;
        uint32_t x4, y4, u4, v4;
        if (n >= 8 && n <= 16) {
            memcpy(&x, p, 8); memcpy(&y, q, 8);
            memcpy(&u, p + n - 8, 8); memcpy(&v, q + n - 8, 8);
            return ((x ^ y) | (u ^ v)) == 0;
        }
        if (n >= 4 && n < 8) {
            memcpy(&x4, p, 4); memcpy(&y4, q, 4);
            memcpy(&u4, p + n - 4, 4); memcpy(&v4, q + n - 4, 4);
            return ((x4 ^ y4) | (u4 ^ v4)) == 0;
        }
        return memcmp(p, q, n) == 0;
    }
    """
    bint rs_bytes_eq(const void *a, const void *b, size_t n) noexcept nogil


cdef inline bint _seen_has(const _SeenKeys *s, int64_t key) noexcept nogil:
    cdef size_t h = _seen_slot(key)
    return (s.mask >> h) & 1 and s.key[h] == key


cdef inline void _seen_add(_SeenKeys *s, int64_t key) noexcept nogil:
    cdef size_t h = _seen_slot(key)
    s.key[h] = key
    s.mask |= 1u << h


cdef class _CqSlot:
    """One ConsumeQueue as the dispatch loop sees it: the Python objects are the truth between
    calls; inside a call the append state lives in `st` and is published at the end. Between
    calls it holds the objects `st` was read from (its last file, that file's Mapping, and
    the queue's `_version` then), so the next call can trust `st` while the version is the
    same object."""
    cdef _CqState st
    cdef bytes topic
    cdef object cq
    cdef object mfq
    cdef object file            # its last file
    cdef object mm              # that file's Mapping
    cdef object version         # held, so `is` means the same value
    # Exports of the cells st.pos_cell and st.max_cell point into (see _CqState).
    cdef Py_buffer pos_view
    cdef Py_buffer max_view

    def __cinit__(self):
        memset(&self.pos_view, 0, sizeof(Py_buffer))
        memset(&self.max_view, 0, sizeof(Py_buffer))

    def __dealloc__(self):
        PyBuffer_Release(&self.pos_view)
        PyBuffer_Release(&self.max_view)


cdef int64_t *_cell(object cell, Py_buffer *view, Py_ssize_t n) except NULL:
    """Export `cell` (an int64 array of at least `n` items: a position cell) into `view`, and
    the address of its first item: while exported it cannot be resized, so the address
    stays valid."""
    PyBuffer_Release(view)
    PyObject_GetBuffer(cell, view, PyBUF_WRITABLE | PyBUF_FORMAT)
    if (view.itemsize != 8 or view.format == NULL or view.format[0] != b'q'
            or view.format[1] != 0 or view.len < n * 8):
        PyBuffer_Release(view)
        raise TypeError(f"a position cell is an int64 array of {n} items, not {cell!r}")
    return <int64_t *>view.buf


_CQ_FILE_SLOTS = ("_cell", "refill_position", "file_from_offset", "file_size", "mm",
                  "reserved_position")
DEF CF_CELL = 0
DEF CF_REFILL = 1
DEF CF_FROM = 2
DEF CF_SIZE = 3
DEF CF_MM = 4
DEF CF_RESERVED = 5
DEF N_CF = 6
_CQ_SLOTS = ("_cell", "dirty", "_marked", "_version")
DEF CQ_CELL = 0
DEF CQ_DIRTY = 1
DEF CQ_MARKED = 2
DEF CQ_VERSION = 3


cdef class CqSlots:
    """The dispatcher's queues by (topic hash, queue id), in a table the row loop reads
    without the GIL. Grows by doubling; a ConsumeQueueDispatcher keeps one for its life."""
    cdef _CqTable t
    cdef Py_ssize_t _n
    cdef list _owners           # the _CqSlot objects the states live in
    cdef _CqState **_touched    # states loaded (and pinned) in the current call
    cdef Py_ssize_t _n_touched, _touched_cap
    cdef type _file_type
    cdef Py_ssize_t _f[N_CF]
    cdef Py_ssize_t _cq[4]         # ConsumeQueue's _cell, dirty, _marked, _version
    # Whether reput_dispatch loads the last pass's queues before its GIL-free section: only
    # while passes keep returning to the same queues (see reput_dispatch).
    cdef bint preload

    def __cinit__(self, type mapped_file_type, type consume_queue_type):
        # Members are read at their offsets, as PutPath does, and positions are published into
        # the cells (CqMappedFile, ConsumeQueue._cell): with 40 000 queues a batch loads and
        # publishes a queue per row or two.
        _member_offsets(mapped_file_type, _CQ_FILE_SLOTS, self._f)
        _member_offsets(consume_queue_type, _CQ_SLOTS, self._cq)
        self._file_type = mapped_file_type
        self.t.e = NULL
        self.t.cap = 0
        self.t.gen = 1
        self.t.pass_no = 2          # above any state's: a new state recurs from no pass
        self.t.distinct = self.t.recur = 0
        self.preload = True
        self._n = 0
        self._owners = []
        self._touched = NULL
        self._n_touched = self._touched_cap = 0
        self._grow(64)

    def __dealloc__(self):
        PyMem_Free(self.t.e)
        PyMem_Free(self._touched)

    def __len__(self):
        return self._n

    cdef int _grow(self, size_t cap) except -1:
        cdef _CqTable old = self.t
        cdef size_t i
        self.t.e = <_CqEntry *>PyMem_Calloc(cap, sizeof(_CqEntry))
        if self.t.e == NULL:
            self.t = old
            raise MemoryError()
        self.t.cap = cap
        for i in range(old.cap):
            if old.e[i].st != NULL:
                _cq_insert(&self.t, old.e[i].st)
        PyMem_Free(old.e)
        return 0

    cdef int add(self, int64_t key, bytes topic, cq) except -1:
        cdef _CqSlot s = _CqSlot()
        if 2 * <size_t>(self._n + 1) > self.t.cap:
            self._grow(2 * self.t.cap)
        s.topic = topic
        s.cq = cq
        s.mfq = cq.mfq
        s.st.key = key
        if len(topic) <= sizeof(s.st.short_topic):
            memcpy(s.st.short_topic, PyBytes_AS_STRING(topic), len(topic))
            s.st.topic = s.st.short_topic
        else:
            s.st.topic = PyBytes_AS_STRING(topic)
        s.st.topic_len = len(topic)
        s.st.gen = 0
        s.st.pass_no = 0
        s.st.loaded = False
        s.st.refill_due = False
        s.st.appendable = False
        s.st.cached = False
        s.st.pinned = False
        s.st.owner = <PyObject *>s
        s.st.cq = <PyObject *>cq
        s.st.file = s.st.mm = s.st.version = NULL
        s.st.pos_cell = NULL
        if _member(cq, self._cq[CQ_CELL]) == NULL:
            raise TypeError("a ConsumeQueue without its max_physic_offset cell")
        s.st.max_cell = _cell(<object>_member(cq, self._cq[CQ_CELL]), &s.max_view, 1)
        self._owners.append(s)
        _cq_insert(&self.t, &s.st)
        self._n += 1
        return 0

    cdef int load(self, _CqState *st) except -1:
        """Make the queue's append state current for this call and pin its mapping. The state
        is `appendable` only with a file this loop can append to (not when the queue has no
        file yet, or a mapping this module did not make). A state kept from an earlier call is
        reused while the queue's `_version` is the object it was read with."""
        cdef _CqSlot s
        cdef Py_ssize_t i
        cdef _CqState **grown
        if self._n_touched == self._touched_cap:
            grown = <_CqState **>PyMem_Realloc(
                self._touched, <size_t>(2 * self._touched_cap + 64) * sizeof(_CqState *))
            if grown == NULL:
                raise MemoryError()
            self._touched = grown
            self._touched_cap = 2 * self._touched_cap + 64
        st.gen = self.t.gen
        st.loaded = True
        st.appendable = False
        self._touched[self._n_touched] = st
        self._n_touched += 1
        if st.cached:
            if (_member(<object>st.cq, self._cq[CQ_VERSION]) == st.version
                    and (<Mapping>st.mm)._addr != NULL):
                (<Mapping>st.mm)._exports += 1  # pinned: close() raises BufferError until publish
                st.pinned = True
                st.appendable = True
                return 0
            self._forget(<_CqSlot>st.owner)
        s = <_CqSlot>st.owner
        if _member(s.cq, self._cq[CQ_VERSION]) == NULL:
            return 0
        version = <object>_member(s.cq, self._cq[CQ_VERSION])
        files = s.mfq.files
        if type(files) is not list or not files:
            return 0
        f = (<list>files)[len(<list>files) - 1]
        if type(f) is not self._file_type:
            return 0
        for i in range(N_CF):
            if _member(f, self._f[i]) == NULL:
                return 0
        mm = <object>_member(f, self._f[CF_MM])
        if type(mm) is not Mapping or not (<Mapping>mm).writable or (<Mapping>mm)._addr == NULL:
            return 0
        st.size = <object>_member(f, self._f[CF_SIZE])
        st.base = <object>_member(f, self._f[CF_FROM])
        st.pos_cell = _cell(<object>_member(f, self._f[CF_CELL]), &s.pos_view, 2)
        st.wrote = st.pos_cell[0]
        st.refill = <object>_member(f, self._f[CF_REFILL])
        st.reserved = <object>_member(f, self._f[CF_RESERVED])
        st.max_phy = st.max_cell[0]
        # What the objects hold now: publish writes only what the loop moved past these.
        st.pub_wrote = st.wrote
        st.pub_max = st.max_phy
        (<Mapping>mm)._exports += 1         # pinned: close() raises BufferError until publish
        st.pinned = True
        s.file = f
        s.mm = mm
        s.version = version
        st.file = <PyObject *>f
        st.mm = <PyObject *>mm
        st.version = <PyObject *>version
        st.cached = True
        st.addr = (<Mapping>mm)._addr
        st.cap = (<Mapping>mm)._size
        st.appendable = True
        return 0

    cdef void _forget(self, _CqSlot s) noexcept:
        """Drop what the slot kept from earlier calls: the next load reads the objects."""
        s.st.cached = False
        s.st.file = s.st.mm = s.st.version = NULL
        s.st.pos_cell = NULL
        PyBuffer_Release(&s.pos_view)
        s.file = s.mm = s.version = None

    cdef int forget(self, int64_t key) except -1:
        """The queue's Python objects were written outside the compiled loop (a row the loop
        handed to Python): its kept state must not be trusted without a full load."""
        cdef _CqState *st = _cq_find(&self.t, key)
        if st != NULL and not st.loaded:
            self._forget(<_CqSlot>st.owner)
        return 0

    cdef Py_ssize_t load_run(self, const rs_scan_rec *rows, Py_ssize_t i, Py_ssize_t n,
                             Py_ssize_t ahead, const char *buf, Py_ssize_t buf_len) except -1:
        """Load (with the GIL, which this holds throughout) every known queue that rows[i:end]
        append to, so the GIL-free run over them stops only for the rows Python takes; returns
        `end`. It ends after a row Python will take for sure (a queue not known yet, a
        SCHEDULE_TOPIC_XXXX row), or after `ahead` rows: every row Python takes unloads all
        queues and the rows after it are loaded again, so the caller bounds `ahead` once the
        run met a row this could not foresee (a roll, a reservation, a gap)."""
        cdef const rs_scan_rec *r
        cdef _CqState *st
        cdef int32_t tx
        cdef int64_t key
        cdef Py_ssize_t end = min(n, i + ahead), j
        # The queues this call found loaded or loaded, by key: a batch put's rows go round a
        # few queues (the round-robin producer of bench_put), so after the first row to each
        # one, every row needs nothing -- not its table probe, nor the three prefetches, which
        # cost ~150 instructions a row (callgrind) when each row's queue differs from the row
        # before's. Direct-mapped and small: with many queues it only misses, as before. Its
        # own topic bytes are still compared by _cq_run, so a topic sharing the hash is caught
        # there.
        cdef _SeenKeys seen
        cdef Py_ssize_t streak = 0          # rows in a row whose queue was in `seen`
        seen.mask = 0
        for j in range(i, min(end, i + PF_ENTRY)):
            if not _seen_has(&seen, _cq_key(rows + j)):
                self._prefetch_entry(rows + j)
        for j in range(i, min(end, i + PF_STATE)):
            if not _seen_has(&seen, _cq_key(rows + j)):
                self._prefetch_state(rows + j)
        for j in range(i, min(end, i + PF_OBJECTS)):
            if not _seen_has(&seen, _cq_key(rows + j)):
                self._prefetch_objects(rows + j)
        while i < end:
            # Once the last 2 * PF_ENTRY rows all went to queues already loaded, the rows
            # ahead most likely do too: their prefetches (hints only) are not even tried.
            if streak < 2 * PF_ENTRY:
                j = i + PF_ENTRY
                if j < end and not _seen_has(&seen, _cq_key(rows + j)):
                    self._prefetch_entry(rows + j)
                j = i + PF_STATE
                if j < end and not _seen_has(&seen, _cq_key(rows + j)):
                    self._prefetch_state(rows + j)
                j = i + PF_OBJECTS
                if j < end and not _seen_has(&seen, _cq_key(rows + j)):
                    self._prefetch_objects(rows + j)
            r = rows + i
            i += 1
            tx = r.sys_flag & RS_TRANSACTION_TYPE_MASK
            if tx == RS_TRANSACTION_PREPARED_TYPE or tx == RS_TRANSACTION_ROLLBACK_TYPE:
                continue
            if r.info & RS_SCAN_INFO_SCHEDULE:
                return i
            key = _cq_key(r)
            if _seen_has(&seen, key):
                streak += 1
                continue
            streak = 0
            st = _cq_find(&self.t, key)
            if st == NULL:
                return i
            if not (st.loaded and st.gen == self.t.gen):
                if (r.topic_len != st.topic_len or r.pos + r.topic_off + r.topic_len > buf_len
                        or memcmp(buf + r.pos + r.topic_off, st.topic,
                                  <size_t>r.topic_len) != 0):
                    return i                    # a topic sharing the hash: Python takes it
                self.load(st)
            _seen_add(&seen, key)
        return end

    # The three stages of load_run's prefetching. Prefetches never fault, so a state whose
    # kept pointers went stale costs nothing but a useless prefetch.
    cdef inline void _prefetch_entry(self, const rs_scan_rec *r) noexcept nogil:
        rs_prefetch_r(&self.t.e[rs_mix(<uint64_t>_cq_key(r), self.t.cap - 1)])

    cdef inline void _prefetch_state(self, const rs_scan_rec *r) noexcept nogil:
        _prefetch_lines(_cq_find(&self.t, _cq_key(r)))

    cdef inline void _prefetch_objects(self, const rs_scan_rec *r) noexcept nogil:
        cdef _CqState *st = _cq_find(&self.t, _cq_key(r))
        # What a kept state's load reads: the queue's `_version` member and the Mapping (its
        # address and export count). Not the file: that load does not read it.
        if st != NULL and st.cached and not st.loaded:
            rs_prefetch_r(<const char *>st.cq + self._cq[CQ_VERSION])
            rs_prefetch_w(st.mm)

    cdef int publish(self) except -1:
        """Positions into the cells of the queues' files and of the queues (CqMappedFile and
        ConsumeQueue `_cell`), pins released: readers see the units, and any Python code may
        run (and change the queues) after this. The units' bytes were written before, by this
        thread; every reader reads the cells with the GIL, which this holds, so a reader that
        sees a position sees the units below it (the GIL's release and acquire order them). Each
        queue keeps its state, with the objects just published, for the next call. The queues
        written to are then marked in their DirtyQueues as ConsumeQueue's own writes mark
        them (ConsumeQueue._mark): the epoch read after the positions moved, once per epoch;
        with 40 000 queues this walk, which touches them anyway, costs less than looking up
        every dispatched row's queue."""
        cdef _CqState *st
        cdef _CqState *ahead
        cdef Py_ssize_t k, n = self._n_touched
        cdef list written = []
        cdef list same_pages = []
        cdef list due = []
        for k in range(n):
            if k + PF_ENTRY < n:
                # The state itself first: the call's load_run touched it thousands of queues
                # ago, and with 40 000 queues it has left the cache since.
                _prefetch_lines(self._touched[k + PF_ENTRY])
            if k + PF_STATE < n:
                ahead = self._touched[k + PF_STATE]
                if ahead.pinned:           # its pin is released below
                    rs_prefetch_w(ahead.mm)
                if ahead.appendable and ahead.wrote != ahead.pub_wrote:
                    # The cells written below, and the member _mark reads.
                    rs_prefetch_w(ahead.pos_cell)
                    rs_prefetch_w(ahead.max_cell)
                    rs_prefetch_r(<const char *>ahead.cq + self._cq[CQ_MARKED])
            st = self._touched[k]
            if st.refill_due:
                due.append(<object>st.owner)
            if st.appendable:
                if st.wrote != st.pub_wrote:
                    st.pos_cell[0] = st.wrote
                    st.pos_cell[1] = st.wrote
                    # Whether the file's count of dirty pages grew, or the file filled
                    # (MappedFile.is_able_to_flush): if neither, a periodic flush round need
                    # not test it (DirtyQueues).
                    if (st.wrote // _PAGE != st.pub_wrote // _PAGE) or st.wrote == st.size:
                        written.append(<object>st.cq)
                    else:
                        same_pages.append(<object>st.cq)
                    st.pub_wrote = st.wrote
                if st.max_phy != st.pub_max:
                    st.max_cell[0] = st.max_phy
                    st.pub_max = st.max_phy
            if st.pinned:
                (<Mapping>st.mm)._exports -= 1
                st.pinned = False
            st.loaded = False
            st.appendable = False
        self._n_touched = 0
        self.t.gen += 1
        if written:
            self._mark(written, True)
        if same_pages:
            self._mark(same_pages, False)
        if due:
            self._refill(due)
        return 0

    cdef bint reread_reserved(self, _CqState *st) except -1:
        """Read a loaded queue's refill and reserved positions from its file again: True if
        the reserved end moved. PopulateAheadService moves them on its thread, and a state
        kept from call to call does not read the file (with 40 000 queues, one more cache
        miss a queue), so a row past the kept reserved end comes here before Python."""
        cdef int64_t reserved
        if not st.appendable or st.file == NULL:
            return False
        reserved = <object>_member(<object>st.file, self._f[CF_RESERVED])
        st.refill = <object>_member(<object>st.file, self._f[CF_REFILL])
        if reserved <= st.reserved:
            return False
        st.reserved = reserved
        return True

    cdef int _refill(self, list due) except -1:
        """Ask for the next window of each queue the loop wrote past its refill position, its
        units published (ConsumeQueue.refill_written), and keep the positions that moved."""
        cdef _CqSlot s
        for s in due:
            s.st.refill_due = False
            s.cq.refill_written()
            if s.st.cached:
                s.st.refill = <object>_member(s.file, self._f[CF_REFILL])
                s.st.reserved = <object>_member(s.file, self._f[CF_RESERVED])
        return 0

    cdef int _mark(self, list written, bint grew) except -1:
        """Mark the queues in `written` in their DirtyQueues as grown, or as written within
        their pages when not `grew`, once per epoch (the epoch read after the positions
        moved): not again while marked in this epoch, but for a queue marked within its
        pages that grows now."""
        cdef PyObject *d
        cdef PyObject *m
        cdef object dirty, last = None, epoch = None, marker = None
        cdef list marks = []
        for cq in written:
            d = _member(cq, self._cq[CQ_DIRTY])
            if d == NULL or d == <PyObject *>None:
                continue                    # no DirtyQueues tracks this queue
            dirty = <object>d
            if dirty is not last:
                self._mark_all(last, marks, marker, grew)
                last = dirty
                epoch = dirty.epoch         # read after the positions moved: DirtyQueues
                marker = epoch if grew else ~epoch
            m = _member(cq, self._cq[CQ_MARKED])
            # Marked in this epoch already: as grown (the epoch), or as `marker` asks now.
            if m == NULL or not (_is_marker(m, epoch) or _is_marker(m, marker)):
                marks.append(cq)
        self._mark_all(last, marks, marker, grew)
        return 0

    cdef int _mark_all(self, dirty, list marks, marker, bint grew) except -1:
        """Mark `marks` in `dirty`, then record the epoch they were marked in (`marker`:
        the epoch, or ~epoch for a mark within their pages)."""
        if not marks:
            return 0
        dirty.mark_all(marks, grew)
        for cq in marks:
            _set_member(cq, self._cq[CQ_MARKED], marker)
        del marks[:]
        return 0


cdef inline bint _is_marker(PyObject *m, object marker) except -1:
    return m == <PyObject *>marker or <object>m == marker


cdef inline void _prefetch_unit(const _CqTable *t, const rs_scan_rec *r) noexcept nogil:
    """Where a row's unit goes, fetched ahead: with 40 000 queues nearly every row writes to
    a page, and a cache line, of its own. Done here rather than while loading, where a page
    walk for the prefetch would stall the loading of the next queues' objects."""
    cdef _CqState *st = _cq_find(t, _cq_key(r))
    if st != NULL and st.appendable:
        rs_prefetch_w(st.addr + st.wrote)


cdef Py_ssize_t _cq_run(_CqTable *t, const rs_scan_rec *rows, Py_ssize_t i, Py_ssize_t n,
                        const char *buf, Py_ssize_t buf_len, int64_t *last_ts,
                        int *need) noexcept nogil:
    """Append the units of rows[i:n] until one needs the GIL; returns that row's index (n when
    none did) with the reason in `need`."""
    cdef const rs_scan_rec *r
    cdef _CqState *st
    # The states this run found, by key (the run adds nothing to the table): a batch put's
    # rows go round a few queues, so most rows need no probe.
    cdef _SeenStates found
    cdef _SeenKeys pf_seen
    cdef size_t h
    cdef int32_t tx
    cdef int64_t pos, key
    cdef Py_ssize_t j
    cdef Py_ssize_t to_unit = i, next_pf = i
    need[0] = NEED_NOTHING
    found.mask = 0
    # A row to a queue `found` holds needs no probe of the table: nothing is added to the
    # table during the run. Its topic bytes are compared all the same.
    while i < n:
        if i >= next_pf:
            # Every PF_BLOCK rows, the units of the rows one to two blocks ahead, in one tight
            # loop (see PF_BLOCK).
            # A queue's unit once per block: rows that go round a few queues (a round-robin
            # producer's batch) would each fetch the line of the row before to their queue.
            pf_seen.mask = 0
            for j in range(to_unit, min(n, i + 2 * PF_BLOCK)):
                key = _cq_key(rows + j)
                if not _seen_has(&pf_seen, key):
                    _seen_add(&pf_seen, key)
                    _prefetch_unit(t, rows + j)
            to_unit = max(to_unit, min(n, i + 2 * PF_BLOCK))
            next_pf = i + PF_BLOCK
        r = rows + i
        tx = r.sys_flag & RS_TRANSACTION_TYPE_MASK
        if tx == RS_TRANSACTION_PREPARED_TYPE or tx == RS_TRANSACTION_ROLLBACK_TYPE:
            # no unit until committed
            i += 1
            continue
        if r.info & RS_SCAN_INFO_SCHEDULE:             # the DELAY tagsCode
            need[0] = NEED_SLOW
            return i
        key = _cq_key(r)
        h = _seen_slot(key)
        if (found.mask >> h) & 1 and found.key[h] == key:
            st = found.st[h]
        else:
            st = _cq_find(t, key)
            found.key[h] = key
            found.st[h] = st
            found.mask |= 1u << h
        if (st == NULL or r.topic_len != st.topic_len
                or r.pos + r.topic_off + r.topic_len > buf_len
                or not rs_bytes_eq(buf + r.pos + r.topic_off, st.topic,
                                   <size_t>r.topic_len)):
            need[0] = NEED_SLOW                        # new queue, or a topic sharing the hash
            return i
        if not st.loaded or st.gen != t.gen:
            need[0] = NEED_LOAD
            return i
        if not st.appendable:
            need[0] = NEED_SLOW
            return i
        if st.pass_no != t.pass_no:                   # the pass's first row to this queue
            t.distinct += 1
            if st.pass_no + 1 == t.pass_no:
                t.recur += 1
            st.pass_no = t.pass_no
        last_ts[0] = r.store_timestamp
        if r.phy_offset + r.size <= st.max_phy:        # already dispatched (redispatch)
            i += 1
            continue
        pos = st.wrote
        if (pos + RS_CQ_STORE_UNIT_SIZE > st.size
                or r.queue_offset * RS_CQ_STORE_UNIT_SIZE != st.base + pos):
            need[0] = NEED_SLOW                        # roll, gap, overlap
            return i
        # Up to the reserved end: past the refill position only the ask for the next window
        # is due, made when the positions are published. Handing the row to Python instead
        # cost a publish and a reload of every queue the call had loaded: with 400 queues
        # passing their refill positions in one pass, 400 of each.
        if pos + RS_CQ_STORE_UNIT_SIZE > st.reserved:
            need[0] = NEED_RESERVE                     # moved on since read, or to reserve
            return i
        if rs_cq_encode(<uint8_t *>st.addr, <size_t>st.cap, pos, r.phy_offset, r.size,
                        r.tags_code) < 0:
            need[0] = NEED_SLOW
            return i
        if pos + RS_CQ_STORE_UNIT_SIZE > st.refill:
            st.refill_due = True
        st.wrote = pos + RS_CQ_STORE_UNIT_SIZE
        st.max_phy = r.phy_offset + r.size
        i += 1
    return i


def cq_dispatch(rows, buf, CqSlots slots, slow):
    """ConsumeQueue units for the scanned `rows` (format.SCAN_DTYPE) of `buf`, in one pass.

    The common row appends one unit at its queue's write position below the reserved end
    of the queue's current file, without the GIL and with no Python object per row (a queue
    that passed its file's refill position asks for the next window when the positions are
    published: CqSlots._refill). Anything
    else (a queue not in `slots` yet, a topic hash shared by two topics, a roll, a gap, a unit
    already present, a reservation, a SCHEDULE_TOPIC_XXXX row) is `slow(i)`, which dispatches
    row i by ConsumeQueue.put_unit's rules and returns its queue, then remembered in `slots`.
    Positions reach the queues' cells (CqMappedFile and ConsumeQueue `_cell`) before every
    slow call and at the end, so readers see a unit only after the batch's records, which are
    already readable.
    Returns the store timestamp of the last dispatched row, or 0."""
    cdef Py_buffer rv, b
    cdef const rs_scan_rec *r
    cdef const rs_scan_rec *base
    cdef Py_ssize_t i = 0, n, end, ahead
    cdef int64_t key, last_ts = 0
    cdef int need = NEED_NOTHING
    cdef _CqState *st
    memset(&rv, 0, sizeof(rv))
    memset(&b, 0, sizeof(b))
    _ro(rows, &rv)
    try:
        _ro(buf, &b)
        n = rv.len // SCAN_REC_SIZE
        ahead = n
        base = <const rs_scan_rec *>rv.buf
        while i < n:
            end = slots.load_run(base, i, n, ahead, <const char *>b.buf, b.len)
            with nogil:
                i = _cq_run(&slots.t, base, i, end, <const char *>b.buf, b.len, &last_ts, &need)
            if i >= end:
                continue
            if i + 1 < end:
                ahead = LOAD_AHEAD          # a row loading did not foresee: bound the reloads
            r = base + i
            if need == NEED_LOAD:           # not expected after load_run; kept for safety
                st = _cq_find(&slots.t, _cq_key(r))
                slots.load(st)
                continue                    # the run retries the row: appendable or slow
            if need == NEED_RESERVE and slots.reread_reserved(_cq_find(&slots.t, _cq_key(r))):
                continue                    # the service reserved further: the run retries
            # Python takes the row; it must see every position written so far, and any state
            # may be stale after it ran (it can roll files, release the GIL, ...).
            slots.publish()
            last_ts = r.store_timestamp
            key = _cq_key(r)
            cq = slow(i)
            slots.forget(key)               # Python wrote that queue's objects
            if cq is not None and not (r.info & RS_SCAN_INFO_SCHEDULE):
                if _cq_find(&slots.t, key) == NULL:
                    slots.add(key, PyBytes_FromStringAndSize(
                        <const char *>b.buf + r.pos + r.topic_off, r.topic_len), cq)
            i += 1
    finally:
        slots.publish()
        PyBuffer_Release(&b)
        PyBuffer_Release(&rv)
    return last_ts
