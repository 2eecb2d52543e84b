# SPDX-License-Identifier: Apache-2.0
# PutPath: MessageStore.put_message's common path as one compiled call (included by _cext.pyx).
#
# The Python path (MessageStore.put_message -> CommitLog.put_message) is the reference and
# handles every case; this class does the common one with no Python frame: it reads the
# Message's slots, builds the properties string in HashMap order straight into the record,
# and encodes the record once, at its final offset with its final queue offset and store
# time, into the current CommitLog file's mapping. Anything else -- a topic not seen yet, a
# delay, a transaction, a roll, a reservation, a write buffer, a refused store, a value of an
# unexpected type -- is handed to the Python path whole, before anything is written, so both
# paths write the same bytes and raise the same errors.
#
# Message, MappedFile and PutMessageResult are __slots__ classes. After an exact type check
# their members are read and written at the offsets their member descriptors give, as
# PyMember_GetOne/SetOne do, without the attribute lookup: measured, the lookups were a third
# of the call.
from cpython.dict cimport PyDict_Next
from cpython.long cimport PyLong_Check
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyTypeObject
from cpython.ref cimport Py_XDECREF, Py_XINCREF
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

import numpy as _np

from rocketstore.clock import system_clock as _system_clock
from rocketstore.errors import StoreClosedError as _StoreClosedError
from rocketstore import stats as _stats

cdef extern from "Python.h":
    ctypedef Py_ssize_t Py_hash_t
    PyObject *_PyDict_GetItem_KnownHash(object d, object key, Py_hash_t h) except? NULL
    int _PyDict_SetItem_KnownHash(object d, object key, object v, Py_hash_t h) except -1
    void Py_XINCREF(PyObject *o)
    void PyObject_GC_UnTrack(object op)
    bint PyObject_IS_GC(object op)
    bint PyObject_GC_IsTracked(object op)
    ctypedef struct PyMemberDef:
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member
    object PyType_GenericAlloc(PyTypeObject *tp, Py_ssize_t nitems)
    void Py_INCREF(object o)
    Py_ssize_t PyDict_GET_SIZE(object d)    # a macro: no call for an exact dict's length
    # PyThreadState *, as void *: put_columns lets go of the GIL only for large batches.
    void *PyEval_SaveThread()
    void PyEval_RestoreThread(void *state)

__all__ += ("PutPath",)

# The properties a record may carry on this path. A HashMap of up to 8 entries keeps its
# initial 16 buckets (it resizes past 12 and treeifies a bucket at 9), so its iteration order
# is (bucket, insertion order): message.hashmap_order's rule without the resize steps.
DEF MAX_FAST_PROPS = 8
DEF KEY_CACHE = 64                  # property names remembered with their HashMap bucket
DEF FAST_MAX_BODY = 65536           # larger bodies take the path that CRCs without the GIL
DEF PROPS_INLINE = 128              # put_list's room per record for its properties string
DEF NOGIL_BATCH_BYTES = 65536       # put_columns encodes a batch this large without the GIL
DEF MAX_WAKE_SERVICES = 4           # services a put's wake-up reads in place (PutPath._wake)

# Cells of CommitLog.put_cells (rocketstore/stats.py; checked against it in PutPath.__init__).
DEF C_LOCK_BEGIN = 0
DEF C_PUT_TIMES = 1
DEF C_PUT_BYTES = 2
DEF C_PUT_FAILED = 3
DEF C_PUT_TIME_MAX = 4
DEF C_PUT_HIST = 5
DEF N_CELLS = 18
DEF BUSY_GUARD_MS = 10000000

# What may follow a record in its file: the blank that ends a full one (doc/01 §3.9).
cdef int _BLANK = RS_END_FILE_MIN_BLANK_LENGTH
cdef int _V6_FLAGS = RS_BORNHOST_V6_FLAG | RS_STOREHOSTADDRESS_V6_FLAG

cdef const uint8_t *_SEP1 = <const uint8_t *>b"\x01"
cdef const uint8_t *_SEP2 = <const uint8_t *>b"\x02"

# Member order in PutPath's offset tables.
_MESSAGE_SLOTS = ("topic", "body", "queue_id", "flag", "properties", "born_timestamp",
                  "born_host", "store_host", "sys_flag", "reconsume_times",
                  "prepared_transaction_offset")
DEF M_TOPIC = 0
DEF M_BODY = 1
DEF M_QID = 2
DEF M_FLAG = 3
DEF M_PROPS = 4
DEF M_BORN_TS = 5
DEF M_BORN_HOST = 6
DEF M_STORE_HOST = 7
DEF M_SYS_FLAG = 8
DEF M_RECONSUME = 9
DEF M_PREPARED = 10
_FILE_SLOTS = ("wrote_position", "committed_position", "refill_position", "file_from_offset",
               "mm", "wbuf", "store_timestamp")
DEF F_WROTE = 0
DEF F_COMMITTED = 1
DEF F_REFILL = 2
DEF F_FROM = 3
DEF F_MM = 4
DEF F_WBUF = 5
DEF F_STORE_TS = 6
_RESULT_SLOTS = ("status", "reason", "commit_log_offset", "queue_offset", "store_timestamp",
                 "wrote_bytes", "_store_host_raw")
# status.PutMessagesResult's members, set in place by put_list's stored-whole result.
_PUTS_RESULT_SLOTS = ("status", "reason", "count", "commit_log_offsets", "queue_offsets", "sizes",
                      "store_timestamp", "wrote_bytes", "_store_host_raws")


cdef object _result_columns(Py_ssize_t n, int64_t **phys):
    """A batch result's three int64 columns as one array of 3n (PutPath._stored_all cuts it):
    one allocation and one buffer lookup a call instead of three of each and their
    memoryviews (callgrind: a put_messages of one took 7 600 instructions fewer, of 61 000).
    `*phys` is set to its data: the commit log offsets, then the queue offsets, then the
    sizes. The data does not move while the array is referenced, so the pointer outlives
    the buffer view."""
    cdef Py_buffer view
    cols = _np.empty(3 * n, _np.int64)
    PyObject_GetBuffer(cols, &view, PyBUF_WRITABLE)
    phys[0] = <int64_t *>view.buf
    PyBuffer_Release(&view)
    return cols


cdef int _member_offsets(type cls, tuple names, Py_ssize_t *out) except -1:
    """The offsets of `names`, members of __slots__ class `cls` or a class it derives from,
    for _member/_set_member. A name that `cls` (or a class between it and the member's) turns
    into a property is refused: the member no longer holds the value. A private member is
    read only when its class lends it (LENT_SLOTS): the class then knows the compiled layer
    takes part in what that member holds."""
    for i, name in enumerate(names):
        d = None
        for c in cls.__mro__:
            if name in c.__dict__:
                d = c.__dict__[name]
                break
        if type(d).__name__ != "member_descriptor":
            raise TypeError(f"{cls.__name__}.{name} is not a __slots__ member")
        if name.startswith("_") and name not in getattr(cls, "LENT_SLOTS", ()):
            raise TypeError(f"{cls.__name__}.{name} is private and not in its LENT_SLOTS")
        out[i] = (<PyMemberDescrObject *><PyObject *>d).d_member.offset
    return 0


cdef extern from *:
    """
    /* Fibonacci hashing of a 64-bit key into a power-of-two table (mask = size - 1). */
    static inline size_t rs_mix(uint64_t key, size_t mask) {
        return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 32) & mask;
    }
    """
    size_t rs_mix(uint64_t key, size_t mask) noexcept nogil


cdef inline uint64_t _queue_hash_key(PyObject *topic_b, int32_t queue_id) noexcept nogil:
    """A queue as the put path keys it: its validated topic's bytes object, and the queue id."""
    return (<uint64_t><size_t>topic_b >> 4) ^ (<uint64_t><uint32_t>queue_id << 32)


cdef inline PyObject *_member(object obj, Py_ssize_t offset) noexcept:
    """The member at `offset` (borrowed; NULL when unset)."""
    return (<PyObject **>(<char *><PyObject *>obj + offset))[0]


cdef extern from *:
    """
    /* Replace the member at `offset` of `obj` with `value`, as PyMember_SetOne does. Always
       inline: as a Cython inline function the compiler kept it a call in put(), whose ten
       result and file members then cost a call each (measured under callgrind). */
    #if defined(__GNUC__)
    __attribute__((always_inline))
    #endif
    static inline void rs_set_member(PyObject *obj, Py_ssize_t offset, PyObject *value) {
        PyObject **slot = (PyObject **)((char *)obj + offset);
        PyObject *old = *slot;
        Py_INCREF(value);
        *slot = value;
        Py_XDECREF(old);
    }
    """
    void _set_member "rs_set_member" (object obj, Py_ssize_t offset, object value) noexcept


cdef extern from *:
    """
    #include <structmember.h>
    /* A class of object members only, for the result classes of rocketstore/status.py (see
       _untracked_slots_type). Not a garbage-collected type: its instances neither are
       tracked nor count toward generation 0's threshold, which even an untracked instance
       of a __slots__ class does. A heap type: an instance holds a reference to its class,
       given back here. The members are those of the first class below object (a subclass a
       class statement makes is collected, and clears its own members first). */
    static void rs_slots_dealloc(PyObject *self) {
        PyTypeObject *tp = Py_TYPE(self), *base = tp;
        PyObject **member = (PyObject **)((char *)self + sizeof(PyObject));
        Py_ssize_t i, n;
        while (base->tp_base != &PyBaseObject_Type)
            base = base->tp_base;
        n = (base->tp_basicsize - (Py_ssize_t)sizeof(PyObject)) / (Py_ssize_t)sizeof(PyObject *);
        for (i = 0; i < n; i++)
            Py_CLEAR(member[i]);
        tp->tp_free(self);
        Py_DECREF(tp);
    }

    /* The class `qualified` ("module.Name") with one object member per str of the tuple
       `names`, in order. The names' UTF-8 and the qualified name must outlive the class: the
       caller keeps them (the class's __slots__ and _tp_name). */
    static PyObject *rs_untracked_slots_type(const char *qualified, PyObject *names) {
        Py_ssize_t i, n = PyTuple_GET_SIZE(names);
        PyMemberDef *members = PyMem_Calloc((size_t)n + 1, sizeof(PyMemberDef));
        PyObject *type = NULL;
        if (members == NULL)
            return PyErr_NoMemory();
        for (i = 0; i < n; i++) {
            members[i].name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
            if (members[i].name == NULL)
                goto done;
            members[i].type = T_OBJECT_EX;
            members[i].offset = (Py_ssize_t)(sizeof(PyObject) + (size_t)i * sizeof(PyObject *));
        }
        {
            PyType_Slot slots[] = {
                {Py_tp_dealloc, (void *)rs_slots_dealloc},
                {Py_tp_new, (void *)PyType_GenericNew},
                {Py_tp_members, members},   /* copied into the class */
                {0, NULL},
            };
            PyType_Spec spec = {qualified, (int)(sizeof(PyObject) + (size_t)n * sizeof(PyObject *)),
                                0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, slots};
            type = PyType_FromSpec(&spec);
        }
    done:
        PyMem_Free(members);
        return type;
    }
    """
    object rs_untracked_slots_type(const char *qualified, object names)


def _untracked_slots_type(str qualified, tuple names):
    """A class holding the members `names` (all str), named `qualified` ("module.Name"),
    whose instances the garbage collector does not track or count (status._untracked copies
    a __slots__ class's methods onto it: CPython 3.11 makes any class a class statement
    builds a collected one, a subclass of this included). Only for classes whose members can
    refer to no container that could refer back (rocketstore/status.py's results): a cycle
    through one would never be collected. Its `__slots__` names the members, so pickle and
    copy see them as a __slots__ class's."""
    if not all(type(n) is str and n.isidentifier() for n in names) or len(set(names)) < len(names):
        raise ValueError(f"member names must be distinct identifiers, not {names!r}")
    name_b = qualified.encode()
    if b"." not in name_b:
        raise ValueError(f"{qualified!r} is not a qualified name (module.Name)")
    cls = rs_untracked_slots_type(name_b, names)
    cls.__slots__ = names
    cls._tp_name = name_b              # holds the bytes the class's tp_name points into
    return cls


def _untrack_gc(obj):
    """Stop the garbage collector tracking `obj` (rocketstore/leaves.py decides which objects
    may be: those that refer to nothing that could refer back). No-op for an object it does
    not track."""
    if PyObject_IS_GC(obj) and PyObject_GC_IsTracked(obj):
        PyObject_GC_UnTrack(obj)


cdef inline int64_t _now_ms() noexcept nogil:
    """System.currentTimeMillis, as clock.system_clock computes it."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef extern from *:
    """
    #include <time.h>
    /* A monotonic clock for the latency statistics (stats.py): the coarse one where the
       system has it (a few ns a call, ticking every 1-4 ms; measured on a loaded x86-64
       VM: 10 ns against 50-60 ns for CLOCK_MONOTONIC, read twice per put). */
    static inline int64_t rs_stats_ns(void) {
        struct timespec ts;
    #ifdef CLOCK_MONOTONIC_COARSE
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    #else
        clock_gettime(CLOCK_MONOTONIC, &ts);
    #endif
        return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    }
    """
    int64_t rs_stats_ns() noexcept nogil


cdef inline int64_t _mono_ns() noexcept nogil:
    return rs_stats_ns()


cdef extern from *:
    """
    /* A dict's version tag (PEP 509): changed by every insertion, deletion or replacement
       of a value. put() keys its copies of the CommitLog's put state on it, so the state costs
       one compare per put instead of six dict lookups. Used where CPython maintains it for every
       mutation of an instance dict once the object's __dict__ has been made (3.9-3.12, GIL
       builds); elsewhere rs_dict_versioned() is 0 and the state is read on every put. */
    #if PY_VERSION_HEX < 0x030D0000 && !defined(Py_GIL_DISABLED) && !defined(Py_LIMITED_API)
    #  if defined(__GNUC__)
    #    pragma GCC diagnostic push
    #    pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    #  endif
    static inline uint64_t rs_dict_version(PyObject *d) { return ((PyDictObject *)d)->ma_version_tag; }
    #  if defined(__GNUC__)
    #    pragma GCC diagnostic pop
    #  endif
    static inline int rs_dict_versioned(void) { return 1; }
    #else
    static inline uint64_t rs_dict_version(PyObject *d) { (void)d; return 0; }
    static inline int rs_dict_versioned(void) { return 0; }
    #endif
    """
    uint64_t rs_dict_version(object d) noexcept
    bint rs_dict_versioned() noexcept


cdef inline int _latency_bucket(int64_t ms) noexcept nogil:
    """stats.latency_bucket: setPutMessageEntireTimeMax's buckets."""
    if ms <= 0:
        return 0
    if ms < 10:
        return 1
    if ms < 50:
        return 2
    if ms < 100:
        return 3
    if ms < 200:
        return 4
    if ms < 500:
        return 5
    if ms < 1000:
        return 6
    if ms < 10000:
        return 7 + <int>(ms // 1000 - 1) if ms < 5000 else 11
    return 12


cdef extern from *:
    """
    /* Whether p[0:n] holds a properties separator (0x01 or 0x02, doc/01 §3.6), n <= 64:
       bytes one at a time. */
    static inline int rs_has_separator_bytes(const uint8_t *p, size_t n) {
        size_t i;
        for (i = 0; i < n; i++)
            if ((uint8_t)(p[i] - 1) < 2)
                return 1;
        return 0;
    }
    /* Whether a byte of w is below 3: (w - 0x03..) & ~w & 0x80.. is nonzero exactly then
       (a borrow only ever runs on from a byte below 3, which is flagged itself), which the
       separators 0x01 and 0x02 are, and NUL. */
    #define RS_BYTE_BELOW_3(w) \
        ((((w) - 0x0303030303030303ULL) & ~(w) & 0x8080808080808080ULL) != 0)
    /* Whether p[0:n] holds a properties separator (0x01 or 0x02, doc/01 §3.6): eight bytes
       a step for the short strings properties hold (the tail as an overlapping last word: a
       byte seen twice changes nothing), byte by byte only where a word holds a byte below 3,
       memchr for long strings. Measured under callgrind: a byte loop alone was ~95
       instructions a message for a 4-byte tag and a 9-byte key. */
    #if defined(__GNUC__)
    __attribute__((always_inline))
    #endif
    static inline int rs_has_separator(const uint8_t *p, size_t n) {
        uint64_t w;
        uint32_t a, b;
        size_t i;
        if (n > 64)
            return memchr(p, 1, n) != NULL || memchr(p, 2, n) != NULL;
        if (n >= 8) {
            for (i = 0; i + 8 <= n; i += 8) {
                memcpy(&w, p + i, 8);
                if (RS_BYTE_BELOW_3(w))
                    return rs_has_separator_bytes(p, n);
            }
            if (i == n)
                return 0;
            memcpy(&w, p + n - 8, 8);
        } else if (n >= 4) {
            memcpy(&a, p, 4);
            memcpy(&b, p + n - 4, 4);
            w = ((uint64_t)a << 32) | b;
        } else {
            return rs_has_separator_bytes(p, n);
        }
        return RS_BYTE_BELOW_3(w) && rs_has_separator_bytes(p, n);
    }
    /* A property name or value read in place: 1 when `s` is an exact str in compact ASCII
       (its bytes are its UTF-8) holding neither separator, its bytes in *buf and *n; 0 when
       it is NULL, not an exact str, or holds a separator (the Python path decides); -1 for
       any other str (the caller asks PyUnicode_AsUTF8AndSize). Always inline: as a Cython
       inline function the compiler kept it a call per property (measured under callgrind). */
    #if defined(__GNUC__)
    __attribute__((always_inline))
    #endif
    static inline int rs_text_view(PyObject *s, const uint8_t **buf, Py_ssize_t *n) {
        if (s == NULL || !PyUnicode_CheckExact(s))
            return 0;
    #if !defined(Py_LIMITED_API)
        if (PyUnicode_IS_COMPACT_ASCII(s)) {
            *buf = (const uint8_t *)PyUnicode_DATA(s);
            *n = PyUnicode_GET_LENGTH(s);
            return !rs_has_separator(*buf, (size_t)*n);
        }
    #endif
        return -1;
    }
    """
    int rs_text_view(PyObject *s, const uint8_t **buf, Py_ssize_t *n) noexcept
    bint rs_has_separator(const uint8_t *p, size_t n) noexcept nogil


cdef extern from *:
    """
    /* The value of an exact int of at most two 30-bit digits (|v| < 2**60), read in place as
       CPython's own compact-int fast paths do; 0 for anything else (another type, an int
       subclass, a bigger int, a layout this does not know) and for NULL (a deleted member),
       which the caller converts the general way. Always inline: left to the compiler, it was
       a call per field. */
    #if defined(__GNUC__)
    __attribute__((always_inline))
    #endif
    static inline int rs_small_int(PyObject *o, int64_t *v) {
    #if !defined(Py_LIMITED_API) && PY_VERSION_HEX >= 0x030C0000
        if (o != NULL && Py_IS_TYPE(o, &PyLong_Type)
                && PyUnstable_Long_IsCompact((PyLongObject *)o)) {
            *v = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
            return 1;
        }
    #elif !defined(Py_LIMITED_API) && PYLONG_BITS_IN_DIGIT == 30
        if (o != NULL && Py_IS_TYPE(o, &PyLong_Type)) {
            const digit *d = ((PyLongObject *)o)->ob_digit;
            switch (Py_SIZE(o)) {
            case 0: *v = 0; return 1;
            case 1: *v = (int64_t)d[0]; return 1;
            case -1: *v = -(int64_t)d[0]; return 1;
            case 2: *v = (int64_t)d[0] | ((int64_t)d[1] << 30); return 1;
            case -2: *v = -((int64_t)d[0] | ((int64_t)d[1] << 30)); return 1;
            }
        }
    #endif
        (void)o; (void)v;
        return 0;
    }
    """
    bint rs_small_int(PyObject *o, int64_t *v) noexcept


cdef extern from *:
    """
    /* dst[0:n] = src[0:n] for the short names and values properties hold, without a call:
       two overlapping loads and stores (rs_msg.c's rs_copy does the same in the encoder). */
    static inline void rs_small_copy(uint8_t *dst, const uint8_t *src, size_t n) {
        if (n > 16) {
            memcpy(dst, src, n);
        } else if (n >= 8) {
            uint64_t a, b;
            memcpy(&a, src, 8); memcpy(&b, src + n - 8, 8);
            memcpy(dst, &a, 8); memcpy(dst + n - 8, &b, 8);
        } else if (n >= 4) {
            uint32_t a, b;
            memcpy(&a, src, 4); memcpy(&b, src + n - 4, 4);
            memcpy(dst, &a, 4); memcpy(dst + n - 4, &b, 4);
        } else if (n > 0) {
            uint8_t a = src[0], b = src[n / 2], c = src[n - 1];
            dst[0] = a; dst[n / 2] = b; dst[n - 1] = c;
        }
    }
    """
    void rs_small_copy(uint8_t *dst, const uint8_t *src, size_t n) noexcept nogil


cdef bint _text_utf8(PyObject *s, const uint8_t **buf, Py_ssize_t *n) except -1:
    """rs_text_view for a str that is not compact ASCII: its UTF-8, which CPython caches,
    when it holds neither separator; False when the Python path decides (it raises)."""
    try:
        buf[0] = <const uint8_t *>PyUnicode_AsUTF8AndSize(<object>s, n)
    except UnicodeEncodeError:          # a lone surrogate: the Python path raises it
        return False
    return not rs_has_separator(buf[0], <size_t>n[0])


cdef extern from *:
    """
    #include "pythread.h"
    /* _thread.lock as Modules/_threadmodule.c lays it out from CPython 3.2 to 3.12 (3.13
       made it a PyMutex). PutPath takes the put lock through it only after checking that
       the lock's type is exactly _thread.lock of this size on such a version: lock.acquire()
       and release() are method calls that parse their arguments, measured at a seventh of
       put(). Uncontended, this does what they do (a non-blocking take, then the `locked`
       flag they keep); contended, PutPath calls acquire() itself, which waits without the
       GIL. */
    typedef struct {
        PyObject_HEAD
        PyThread_type_lock lock_lock;
        PyObject *in_weakreflist;
        char locked;
    } rs_lockobject;
    static inline int rs_lock_layout_known(Py_ssize_t basicsize) {
    #if PY_VERSION_HEX < 0x030D0000 && !defined(Py_GIL_DISABLED) && !defined(Py_LIMITED_API)
        return basicsize == (Py_ssize_t)sizeof(rs_lockobject);
    #else
        (void)basicsize;
        return 0;
    #endif
    }
    /* Python/thread_pthread.h makes a lock a POSIX semaphore on this condition. Its
       non-blocking take (PyThread_acquire_lock) reads the monotonic clock for a deadline
       it does not use (3.11: a vDSO clock_gettime, ~4 % of put()'s perf samples): where the
       lock is a semaphore, sem_trywait takes it the same way without the clock. Trusted
       only after _check_lock_sem saw a lock's semaphore count follow acquire/release. */
    #include <unistd.h>
    #if defined(_POSIX_SEMAPHORES) && (_POSIX_SEMAPHORES+0) != -1 \
        && !defined(HAVE_BROKEN_POSIX_SEMAPHORES) \
        && (defined(HAVE_SEM_TIMEDWAIT) || defined(HAVE_SEM_CLOCKWAIT))
    #include <semaphore.h>
    #include <errno.h>
    #define RS_LOCK_SEM 1
    #endif
    static int rs_lock_sem = 0;     /* set once at import (_check_lock_sem) */
    static inline int rs_lock_sem_value(PyObject *lock) {
    #ifdef RS_LOCK_SEM
        int v = -1;
        if (sem_getvalue((sem_t *)((rs_lockobject *)lock)->lock_lock, &v) != 0)
            return -1;
        return v;
    #else
        (void)lock;
        return -1;
    #endif
    }
    static inline int rs_lock_try(PyObject *lock) {
        rs_lockobject *o = (rs_lockobject *)lock;
    #ifdef RS_LOCK_SEM
        if (rs_lock_sem) {
            int r;
            while ((r = sem_trywait((sem_t *)o->lock_lock)) != 0 && errno == EINTR)
                ;
            if (r != 0)
                return 0;
            o->locked = 1;
            return 1;
        }
    #endif
        if (PyThread_acquire_lock(o->lock_lock, NOWAIT_LOCK) != PY_LOCK_ACQUIRED)
            return 0;
        o->locked = 1;
        return 1;
    }
    static inline int rs_lock_give(PyObject *lock) {
        rs_lockobject *o = (rs_lockobject *)lock;
        if (!o->locked)
            return 0;       /* not held: release() raises what it raises */
        o->locked = 0;
        PyThread_release_lock(o->lock_lock);
        return 1;
    }
    """
    bint rs_lock_layout_known(Py_ssize_t basicsize) noexcept
    bint rs_lock_try(PyObject *lock) noexcept
    int rs_lock_sem_value(PyObject *lock) noexcept
    int rs_lock_sem
    bint rs_lock_give(PyObject *lock) noexcept


from _thread import LockType as _LockType, allocate_lock as _allocate_lock


cdef int _check_lock_sem() except -1:
    """Whether a _thread.lock's lock_lock is the semaphore rs_lock_try takes directly: its
    count read while one is held by acquire() and after release()."""
    cdef int held, free
    if not rs_lock_layout_known((<type>_LockType).__basicsize__):
        return 0
    probe = _allocate_lock()
    probe.acquire()
    held = rs_lock_sem_value(<PyObject *>probe)
    probe.release()
    free = rs_lock_sem_value(<PyObject *>probe)
    global rs_lock_sem
    rs_lock_sem = held == 0 and free == 1
    return 0


_check_lock_sem()
# Whether put() takes a free put lock with sem_trywait (read by tests).
_LOCK_BY_SEMAPHORE = bool(rs_lock_sem)


cdef struct _Batch:
    # A columnar batch as rs_batch_encode reads it, pointers valid for the call: column c
    # (bodies, a, b) item i is data[off[i]:off[i + 1]], a and b NULL when absent; the
    # properties fragments with their 4 offsets; flags_or per record or NULL. prefix[i] is
    # the sum of the bodies' and columns' lengths before record i (n + 1 of them), `shared`
    # what every record's properties add to that (the fragments), and the maxima are what
    # PutPath._put_batch validates (batch.Columns.record_lens).
    Py_ssize_t n
    const uint8_t *body
    size_t body_len
    const int64_t *body_off
    const uint8_t *a
    size_t a_len
    const int64_t *a_off
    const uint8_t *b
    size_t b_len
    const int64_t *b_off
    const uint8_t *frags
    size_t frags_len
    const int64_t *frag_off
    const int32_t *flags_or
    const int64_t *prefix
    int64_t shared, body_max, props_max, var_max
    int32_t tags_col


cdef struct _Rec:
    # One message's record, as _prepare read it. The objects it points into are held (strong
    # references, dropped by _rec_release): between _prepare and the encode, waiting for the
    # put lock or calling the clock lets other threads run, and a message changed meanwhile
    # must not free what the record is encoded from.
    PyObject *topic             # str, and the queue id int: the queue table's key
    PyObject *qid
    PyObject *topic_b           # bytes
    PyObject *body              # bytes
    PyObject *born              # packed born host, bytes
    const uint8_t *topic_p      # their bytes, for the GIL-free encode
    const uint8_t *body_p
    const uint8_t *born_p
    size_t topic_len
    size_t body_len
    size_t born_len
    rs_part *parts              # the properties string, in pieces
    Py_ssize_t n_parts
    Py_ssize_t pbuf_used        # bytes of _prepare's pbuf the one piece took (0: none)
    const uint8_t *tags_p       # the TAGS value's UTF-8, for the record's scan row; tags_len
    Py_ssize_t tags_len         # -1: no TAGS property
    int64_t born_ts
    int64_t prepared
    int32_t queue_id
    int32_t flag
    int32_t sys_flag
    int32_t reconsume
    int32_t size
    PyObject *held[2 * MAX_FAST_PROPS]  # property names and values `parts` point into
    Py_ssize_t n_held


cdef inline int _wake_on_put(object wake, int64_t end) except -1:
    """CommitLog.finish_put's wake-up, inline: the service `wake` (CommitLog.wake_on_put, or
    None) is woken unless one is pending (has_notified) or the put's records, ending at
    CommitLog offset `end`, stop before its wake_from. Attribute reads spare a method call
    per put."""
    if wake is not None and not wake.has_notified and end >= <int64_t>wake.wake_from:
        wake.wakeup()
    return 0


cdef inline void _rec_release(_Rec *r) noexcept:
    """Drop the references a _prepare that returned True took."""
    cdef Py_ssize_t i
    Py_XDECREF(r.topic)
    Py_XDECREF(r.qid)
    Py_XDECREF(r.topic_b)
    Py_XDECREF(r.body)
    Py_XDECREF(r.born)
    for i in range(r.n_held):
        Py_XDECREF(r.held[i])
    r.n_held = 0


cdef struct _QueueKey:
    # A queue's key in CommitLog.topic_queue_table, made once: (topic, queue id) and its hash.
    PyObject *topic_b           # strong: keeps the address from being reused by another
    int32_t queue_id
    PyObject *key               # strong: the tuple
    Py_hash_t hash


cdef inline int _rec_encode(const _Rec *r, char *out, size_t out_len, int64_t pos,
                            int64_t qoff, int64_t phy, int64_t ts, const uint8_t *store,
                            size_t store_len) noexcept nogil:
    """Encode `r` at out[pos:] with its final queue offset, physical offset and store time;
    its size, or a negative status."""
    return rs_msg_encode_parts(<uint8_t *>out, out_len, pos, r.topic_p, r.topic_len,
                               r.body_p, r.body_len, r.parts, r.n_parts, r.queue_id, r.flag,
                               qoff, phy, r.sys_flag, r.born_ts, r.born_p, r.born_len, ts,
                               store, store_len, r.reconsume, r.prepared, 0)


cdef inline int _rec_encode_row(const _Rec *r, char *out, size_t out_len, int64_t pos,
                                int64_t qoff, int64_t phy, int64_t ts, const uint8_t *store,
                                size_t store_len, int32_t topic_hash, int tags,
                                int64_t tags_code, rs_scan_rec *row) noexcept nogil:
    """_rec_encode, and the record's scan row into `row` (rs_msg_encode_row)."""
    return rs_msg_encode_row(<uint8_t *>out, out_len, pos, r.topic_p, r.topic_len, r.body_p,
                             r.body_len, r.parts, r.n_parts, r.queue_id, r.flag, qoff, phy,
                             r.sys_flag, r.born_ts, r.born_p, r.born_len, ts, store, store_len,
                             r.reconsume, r.prepared, topic_hash, tags, tags_code, row)


cdef inline int _encoded(int rc, int size) except -1:
    if rc != size:
        _check(rc if rc < 0 else RS_E_ARG, "put_message")
    return 0


cdef void _requeue(Py_ssize_t *qslot, size_t qcap, const _Rec *recs,
                   const Py_ssize_t *first_of, Py_ssize_t n_keys) noexcept:
    """put_list's distinct-queue table of `qcap` slots, rebuilt from its `n_keys` queues."""
    cdef Py_ssize_t k
    cdef size_t h
    memset(qslot, 0xFF, qcap * sizeof(Py_ssize_t))
    for k in range(n_keys):
        h = rs_mix(_queue_hash_key(recs[first_of[k]].topic_b, recs[first_of[k]].queue_id),
                   qcap - 1)
        while qslot[h] >= 0:
            h = (h + 1) & (qcap - 1)
        qslot[h] = k


cdef class PutPath:
    """PutPath(store_put, store_put_list, commitlog, running_flags, not_writeable_mask, clock,
    message_type, mapped_file_type, result_type, batch_result_type, put_ok, host_cache)

    `put(msg)` is MessageStore.put_message and `put_list(msgs, batch_properties=None)` is
    MessageStore.put_messages: the same results, bytes and errors. Cases this class does not
    take go to `store_put(msg)` and `store_put_list(msgs, batch_properties)`, the Python
    paths. `fast` counts messages stored here, `slow` the calls handed over (a profile of
    what misses the compiled path)."""
    cdef object _store_put
    cdef object _store_put_list
    cdef type _batch_result_type
    cdef object _cl
    cdef dict _cld                  # the CommitLog's instance __dict__: its put state
    cdef object _lock               # the put lock last seen, and its bound methods
    cdef object _acquire
    cdef object _release
    cdef bint _lock_direct          # _lock is a _thread.lock taken through rs_lock_try
    cdef object _mfq
    cdef object _flags
    cdef long _mask
    cdef dict _topics
    cdef type _message_type
    cdef type _file_type
    cdef type _result_type
    cdef object _put_ok
    cdef object _clock
    cdef bint _system_clock
    cdef bytes _store_raw
    cdef int32_t _store_v6
    cdef dict _hosts
    cdef object _last_born
    cdef bytes _last_born_raw
    cdef int32_t _last_born_v6
    cdef int64_t _max_body
    cdef int64_t _file_size
    cdef Py_ssize_t _m[11]
    cdef Py_ssize_t _f[7]
    cdef Py_ssize_t _r[7]
    cdef Py_ssize_t _b[9]            # _PUTS_RESULT_SLOTS
    cdef char *_scratch             # put_list's working memory, reused (see there)
    cdef size_t _scratch_cap
    cdef rs_part *_parts
    cdef size_t _parts_cap
    cdef bint _scratch_busy
    cdef PyObject *_kc_obj[KEY_CACHE]   # property names seen, held, with their HashMap
    cdef int _kc_bucket[KEY_CACHE]      # bucket (-1 for DELAY); two ways a set, by address
    cdef const uint8_t *_kc_buf[KEY_CACHE]  # and their UTF-8 (valid while the name is held)
    cdef Py_ssize_t _kc_len[KEY_CACHE]
    cdef _QueueKey *_qkeys          # open addressing by (topic bytes, queue id); put lock
    cdef size_t _qcap
    cdef size_t _qn
    cdef readonly Py_ssize_t fast
    cdef readonly Py_ssize_t slow
    cdef int64_t[::1] _cells_view   # CommitLog.put_cells, held: the array cannot be resized
    # The CommitLog.wake_on_put last seen, and the services it wakes with their wake_cells
    # (ServiceThread: has_notified, wake_from), exported into _wake_bufs; _n_wake 0: read by
    # attribute (_wake_on_put).
    cdef object _wake_obj
    cdef tuple _wake_services
    cdef Py_buffer _wake_bufs[MAX_WAKE_SERVICES]
    cdef int64_t *_wake_cells[MAX_WAKE_SERVICES]
    cdef Py_ssize_t _n_wake
    cdef int64_t *_cells
    cdef int64_t _busy_ms
    # put()'s copies of the CommitLog's put state (_sync_state), valid while the instance
    # dict's version is _cl_ver; and of the file list, while the queue's dict is at _mfq_ver.
    cdef bint _cl_valid
    cdef uint64_t _cl_ver
    cdef object _c_limits
    cdef object _c_after
    cdef object _c_wake
    cdef object _c_table
    cdef bint _c_closed
    cdef dict _mfqd
    cdef bint _mfq_valid
    cdef uint64_t _mfq_ver
    cdef object _c_files
    cdef object _last_topic         # the last topic met and its bytes, while _topics is at
    cdef object _last_topic_b       # _topics_ver (messages of one producer share the str)
    cdef uint64_t _topics_ver
    cdef object _ts_obj             # the last store time's int: puts in one ms share it
    cdef int64_t _ts
    cdef type _flags_type
    cdef Py_ssize_t _flag_bits_off
    # put_lists' working memory (the laid-out columns' offsets, and their bytes), reused
    # while no other put_lists call holds it (_put_lists, _columns.pxi).
    cdef char *_lists_ints
    cdef size_t _lists_ints_cap
    cdef char *_lists_data
    cdef size_t _lists_data_cap
    cdef bint _lists_busy

    def __dealloc__(self):
        cdef size_t i
        for i in range(KEY_CACHE):
            Py_XDECREF(self._kc_obj[i])
        self._unbind_wake()
        PyMem_Free(self._scratch)
        PyMem_Free(self._parts)
        PyMem_Free(self._lists_ints)
        PyMem_Free(self._lists_data)
        if self._qkeys != NULL:
            for i in range(self._qcap):
                Py_XDECREF(self._qkeys[i].topic_b)
                Py_XDECREF(self._qkeys[i].key)
            PyMem_Free(self._qkeys)

    cdef _QueueKey *_queue_key(self, _Rec *r, object table) except NULL:
        """The table key of `r`'s queue, made and hashed on its first put only. Under the put
        lock: `table` is CommitLog.topic_queue_table."""
        cdef size_t i, cap
        cdef PyObject *p
        cdef _QueueKey *old
        cdef _QueueKey *e
        if 2 * (self._qn + 1) > self._qcap:
            old, cap = self._qkeys, self._qcap
            self._qcap = 64 if cap == 0 else 2 * cap
            self._qkeys = <_QueueKey *>PyMem_Calloc(self._qcap, sizeof(_QueueKey))
            if self._qkeys == NULL:
                self._qkeys, self._qcap = old, cap
                raise MemoryError()
            for i in range(cap):
                if old[i].key != NULL:
                    e = self._slot_for(old[i].topic_b, old[i].queue_id)
                    e[0] = old[i]
            PyMem_Free(old)
        e = self._slot_for(r.topic_b, r.queue_id)
        if e.key == NULL:
            key = (<object>r.topic, <object>r.qid)
            e.hash = hash(key)
            e.topic_b = r.topic_b
            e.queue_id = r.queue_id
            Py_XINCREF(e.topic_b)
            e.key = <PyObject *>key
            Py_XINCREF(e.key)
            self._qn += 1
            # A queue the Python path put to first is keyed by its own tuple, and a dict keeps
            # the first key object it was given: each lookup with this equal one would then
            # compare the tuples item by item (measured: an eighth of put()). Re-keyed with
            # this one, lookups match on identity; the table's order matters to nothing.
            if type(table) is dict:
                p = _PyDict_GetItem_KnownHash(table, key, e.hash)
                if p != NULL:
                    value = <object>p
                    del (<dict>table)[key]
                    _PyDict_SetItem_KnownHash(table, key, value, e.hash)
        return e

    cdef inline _QueueKey *_slot_for(self, PyObject *topic_b, int32_t queue_id) noexcept:
        cdef size_t i = rs_mix(_queue_hash_key(topic_b, queue_id), self._qcap - 1)
        while self._qkeys[i].key != NULL and not (self._qkeys[i].topic_b == topic_b
                                                   and self._qkeys[i].queue_id == queue_id):
            i = (i + 1) & (self._qcap - 1)
        return &self._qkeys[i]

    def __init__(self, store_put, store_put_list, commitlog, running_flags,
                 long not_writeable_mask, clock, type message_type, type mapped_file_type,
                 type result_type, type batch_result_type, put_ok, dict host_cache):
        _member_offsets(message_type, _MESSAGE_SLOTS, self._m)
        _member_offsets(mapped_file_type, _FILE_SLOTS, self._f)
        _member_offsets(result_type, _RESULT_SLOTS, self._r)
        _member_offsets(batch_result_type, _PUTS_RESULT_SLOTS, self._b)
        self._store_put = store_put
        self._store_put_list = store_put_list
        self._batch_result_type = batch_result_type
        self._cl = commitlog
        self._cld = commitlog.__dict__
        for name in ("closed", "put_lock", "after_put", "wake_on_put", "topic_queue_table",
                     "write_queue_limits"):
            if name not in self._cld:
                raise TypeError(f"CommitLog.{name} is not an instance attribute")
        self._mfq = commitlog.mfq
        self._flags = running_flags
        self._flags_type = type(running_flags)
        d = self._flags_type.__dict__.get("flag_bits")
        self._flag_bits_off = -1
        if type(d).__name__ == "member_descriptor":
            self._flag_bits_off = (<PyMemberDescrObject *><PyObject *>d).d_member.offset
        self._mfqd = commitlog.mfq.__dict__
        self._mask = not_writeable_mask
        self._topics = commitlog._topics
        self._message_type = message_type
        self._file_type = mapped_file_type
        self._result_type = result_type
        self._put_ok = put_ok
        self._clock = clock
        self._system_clock = clock is _system_clock
        self._store_raw = commitlog.store_host_raw        # the config's; fixed for the store
        self._store_v6 = RS_STOREHOSTADDRESS_V6_FLAG if len(self._store_raw) == 20 else 0
        self._hosts = host_cache
        self._last_born = None
        self._max_body = commitlog.config.max_message_size
        self._file_size = commitlog.file_size
        if (_stats.N_PUT_CELLS != N_CELLS or _stats.PUT_HIST != C_PUT_HIST
                or len(commitlog.put_cells) != N_CELLS):
            raise TypeError("CommitLog.put_cells does not have the cells PutPath writes")
        self._cells_view = commitlog.put_cells
        self._cells = &self._cells_view[0]
        self._busy_ms = commitlog.config.os_page_cache_busy_time_out_mills

    cdef bint _busy(self) except -1:
        """stats.busy_for (isOSPageCacheBusy) by the store clock, read only while a put
        holds the lock: the Python path then answers OS_PAGECACHE_BUSY."""
        cdef int64_t begin = self._cells[C_LOCK_BEGIN], diff
        if begin == 0:
            return False
        diff = self._now() - begin
        return self._busy_ms < diff < BUSY_GUARD_MS

    cdef inline void _record(self, int64_t t0, bint ok) noexcept:
        """stats.record_put for one call of this path (under the GIL)."""
        cdef int64_t ms = (_mono_ns() - t0) // 1000000
        self._cells[C_PUT_HIST + _latency_bucket(ms)] += 1
        if ms > self._cells[C_PUT_TIME_MAX]:
            self._cells[C_PUT_TIME_MAX] = ms
        if not ok:
            self._cells[C_PUT_FAILED] += 1

    cdef object _stored_all(self, object status, Py_ssize_t n, object cols, object ts,
                            int64_t total):
        """The PutMessagesResult of a batch stored whole: `cols` holds its n commit log
        offsets, n queue offsets and n sizes back to back (one array, one allocation), its
        members set in place (its __init__ was a Python frame a call) and the object left
        untracked, as put()'s result: it refers to arrays, ints, bytes and an enum member."""
        res = PyType_GenericAlloc(<PyTypeObject *>self._batch_result_type, 0)
        _set_member(res, self._b[0], status)
        _set_member(res, self._b[1], None)
        _set_member(res, self._b[2], n)
        _set_member(res, self._b[3], cols[:n])
        _set_member(res, self._b[4], cols[n:2 * n])
        _set_member(res, self._b[5], cols[2 * n:])
        _set_member(res, self._b[6], ts)
        _set_member(res, self._b[7], total)
        _set_member(res, self._b[8], self._store_raw)
        if PyObject_IS_GC(res):         # a class from _untracked_slots_type is not
            PyObject_GC_UnTrack(res)
        return res

    cdef bint _prepare(self, object msg, _Rec *r, rs_part *parts, object limits,
                       uint8_t *pbuf, Py_ssize_t pcap) except -1:
        """Read and check everything `msg`'s record needs, before any lock: its fields, its
        properties as up to 4 * MAX_FAST_PROPS `parts` in HashMap order, and its size. False
        when the Python path must take the message (and then raises whatever it raises).
        Properties of at most `pcap` bytes are copied to `pbuf` as one part instead (r.pbuf_used
        says how many bytes): the encode then copies one piece, not a name, a value and a
        separator each (measured: ~220 instructions a record for two properties). True: `r`
        holds references to what it points into, which the caller drops (_rec_release)."""
        cdef PyObject *pk
        cdef PyObject *pv
        cdef PyObject *pm
        cdef PyObject *pb
        cdef PyObject *pq
        cdef PyObject *pp
        cdef object topic, body, qid_obj, props, born, lim, packed
        cdef bytes topic_b, born_raw
        cdef int32_t born_v6, tx, h, spread
        cdef int t
        cdef size_t c
        cdef Py_ssize_t n_props, i, j, ppos = 0, klen, vlen, props_len = 0, n_parts = 0
        cdef const uint8_t *kb
        cdef const uint8_t *vb
        cdef int bucket[MAX_FAST_PROPS]
        cdef int order[MAX_FAST_PROPS]
        cdef rs_part kv[2 * MAX_FAST_PROPS]
        cdef PyObject *kv_obj[2 * MAX_FAST_PROPS]
        cdef Py_ssize_t tags_i = -1
        cdef int64_t v_qid, v_flag, v_sys, v_rec
        cdef uint8_t *q
        if type(msg) is not self._message_type:
            return False
        # A deleted attribute (NULL) sends the message to the Python path, which raises: each
        # member is checked where it is read (rs_small_int and _read_ints check the ints),
        # not all eleven first (measured under callgrind: ~40 instructions a message).
        pm = _member(msg, self._m[M_TOPIC])
        pb = _member(msg, self._m[M_BODY])
        pq = _member(msg, self._m[M_QID])
        pp = _member(msg, self._m[M_PROPS])
        if pm == NULL or pb == NULL or pq == NULL or pp == NULL:
            return False
        topic = <object>pm
        body = <object>pb
        qid_obj = <object>pq
        props = <object>pp
        if (topic is self._last_topic and rs_dict_versioned()
                and rs_dict_version(self._topics) == self._topics_ver):
            topic_b = self._last_topic_b
        else:
            topic_b = self._topics.get(topic)   # validated topics only
            self._last_topic = topic
            self._last_topic_b = topic_b
            self._topics_ver = rs_dict_version(self._topics)
        if (topic_b is None or type(body) is not bytes or type(qid_obj) is not int
                or type(props) is not dict or len(<bytes>body) > self._max_body
                or len(<bytes>body) > FAST_MAX_BODY
                or _member(msg, self._m[M_STORE_HOST]) != <PyObject *>None):
            return False
        # The six ints, read in place when each is an int of one or two digits (a call and a
        # try block per field cost ~180 instructions a message, measured under callgrind);
        # anything else is converted as before.
        if not (rs_small_int(<PyObject *>qid_obj, &v_qid)
                and rs_small_int(_member(msg, self._m[M_FLAG]), &v_flag)
                and rs_small_int(_member(msg, self._m[M_SYS_FLAG]), &v_sys)
                and rs_small_int(_member(msg, self._m[M_BORN_TS]), &r.born_ts)
                and rs_small_int(_member(msg, self._m[M_RECONSUME]), &v_rec)
                and rs_small_int(_member(msg, self._m[M_PREPARED]), &r.prepared)):
            if not self._read_ints(msg, r):
                return False
        elif (v_qid != <int32_t>v_qid or v_flag != <int32_t>v_flag or v_sys != <int32_t>v_sys
                or v_rec != <int32_t>v_rec):
            return False                        # OverflowError: the Python path raises
        else:
            r.queue_id = <int32_t>v_qid
            r.flag = <int32_t>v_flag
            r.sys_flag = <int32_t>v_sys
            r.reconsume = <int32_t>v_rec
        tx = r.sys_flag & RS_TRANSACTION_TYPE_MASK
        if (r.queue_id < 0 or tx == RS_TRANSACTION_PREPARED_TYPE
                or tx == RS_TRANSACTION_ROLLBACK_TYPE):
            return False
        if limits is not None and (type(limits) is not dict or len(<dict>limits)):
            lim = limits.get(topic)
            if lim is not None and qid_obj >= lim:
                return False
        pm = _member(msg, self._m[M_BORN_HOST])
        if pm == NULL:
            return False
        born = <object>pm
        if born is self._last_born:
            born_raw = self._last_born_raw
            born_v6 = self._last_born_v6
        else:
            packed = self._hosts.get(born)
            if packed is None:
                return False                    # pack_host validates and caches it
            born_raw = <bytes>(<tuple>packed)[0]
            born_v6 = RS_BORNHOST_V6_FLAG if (<tuple>packed)[1] else 0
            self._last_born = born
            self._last_born_raw = born_raw
            self._last_born_v6 = born_v6
        r.sys_flag = (r.sys_flag & ~_V6_FLAGS) | born_v6 | self._store_v6

        # Properties: name\x01value pairs, \x02 between, in HashMap order.
        r.tags_len = -1
        n_props = PyDict_GET_SIZE(props)
        if n_props:
            if n_props > MAX_FAST_PROPS:
                return False
            i = 0
            # Exactly n_props steps: nothing here runs Python code that could change the dict,
            # so the step that would only answer "no more" (a call) is not taken.
            while i < n_props:
                if not PyDict_Next(props, &ppos, &pk, &pv):
                    return False
                t = rs_text_view(pv, &vb, &vlen)
                if t == 0 or (t < 0 and not _text_utf8(pv, &vb, &vlen)):
                    return False                # None, not a str, or a separator inside
                # Two ways per set, the set by a multiplicative hash of the address: names
                # of one size class sit 64 bytes apart in one pool, and with the set taken
                # straight from address bits TAGS and KEYS shared a slot and evicted each
                # other on every message (a name hash per property, ~9 % of put_list's
                # instructions under callgrind).
                c = rs_mix(<uint64_t><size_t>pk, KEY_CACHE - 1) & ~(<size_t>1)
                if self._kc_obj[c] != pk and self._kc_obj[c + 1] == pk:
                    c += 1
                if self._kc_obj[c] == pk:       # a name seen before (TAGS, KEYS, ...)
                    kb = self._kc_buf[c]
                    klen = self._kc_len[c]
                    bucket[i] = self._kc_bucket[c]
                else:
                    t = rs_text_view(pk, &kb, &klen)
                    if (t == 0 or (t < 0 and not _text_utf8(pk, &kb, &klen))
                            or rs_java_hash(kb, <size_t>klen, &h) != RS_OK):
                        return False
                    spread = h ^ <int32_t>(<uint32_t>h >> 16)
                    bucket[i] = spread & 15
                    if klen == 5 and memcmp(kb, b"DELAY", 5) == 0:
                        bucket[i] = -1
                    # The set's first way moves to its second (whose name is let go), and
                    # the new name takes the first: two names of one set both stay.
                    Py_XDECREF(self._kc_obj[c + 1])
                    self._kc_obj[c + 1] = self._kc_obj[c]
                    self._kc_bucket[c + 1] = self._kc_bucket[c]
                    self._kc_buf[c + 1] = self._kc_buf[c]
                    self._kc_len[c + 1] = self._kc_len[c]
                    # Held, so the address cannot come back as another name.
                    Py_XINCREF(pk)
                    self._kc_obj[c] = pk
                    self._kc_bucket[c] = bucket[i]
                    self._kc_buf[c] = kb
                    self._kc_len[c] = klen
                if bucket[i] < 0:               # DELAY: the Python path rewrites the topic
                    return False
                kv[2 * i].buf = kb
                kv[2 * i].len = <size_t>klen
                kv[2 * i + 1].buf = vb
                kv[2 * i + 1].len = <size_t>vlen
                kv_obj[2 * i] = pk
                kv_obj[2 * i + 1] = pv
                if klen == 4 and memcmp(kb, b"TAGS", 4) == 0:
                    r.tags_p = vb               # the scan row's tagsCode, if one is made
                    r.tags_len = vlen
                    tags_i = i
                props_len += klen + vlen + 2
                # insertion sort on bucket, stable: equal buckets keep insertion order
                j = i
                while j > 0 and bucket[order[j - 1]] > bucket[i]:
                    order[j] = order[j - 1]
                    j -= 1
                order[j] = i
                i += 1
            props_len -= 1
            if props_len > RS_MAX_PROPERTIES_LENGTH:
                return False
        r.pbuf_used = 0
        if n_props and props_len <= pcap:
            # One piece: name\x01value pairs, \x02 between, in pbuf.
            q = pbuf
            for i in range(n_props):
                j = order[i]
                rs_small_copy(q, kv[2 * j].buf, kv[2 * j].len)
                q += kv[2 * j].len
                q[0] = 1
                rs_small_copy(q + 1, kv[2 * j + 1].buf, kv[2 * j + 1].len)
                if j == tags_i:
                    r.tags_p = q + 1            # the copy: the value is not held
                q += 1 + kv[2 * j + 1].len
                if i + 1 < n_props:
                    q[0] = 2
                    q += 1
            parts[0].buf = pbuf
            parts[0].len = <size_t>props_len
            n_parts = 1
            r.pbuf_used = props_len
        elif n_props:
            for i in range(n_props):
                j = order[i]
                parts[n_parts] = kv[2 * j]
                parts[n_parts + 1].buf = _SEP1
                parts[n_parts + 1].len = 1
                parts[n_parts + 2] = kv[2 * j + 1]
                n_parts += 3
                if i + 1 < n_props:
                    parts[n_parts].buf = _SEP2
                    parts[n_parts].len = 1
                    n_parts += 1
        r.size = rs_record_size(r.sys_flag, len(<bytes>body), len(topic_b), props_len, 0)
        if r.size <= 0 or r.size + _BLANK > self._file_size:
            return False
        # Borrowed: `msg` holds them, and the caller holds `msg`.
        r.topic = <PyObject *>topic
        r.qid = <PyObject *>qid_obj
        r.topic_b = <PyObject *>topic_b
        r.body = <PyObject *>body
        r.born = <PyObject *>born_raw
        r.topic_p = <const uint8_t *>PyBytes_AS_STRING(topic_b)
        r.topic_len = <size_t>PyBytes_GET_SIZE(topic_b)
        r.body_p = <const uint8_t *>PyBytes_AS_STRING(body)
        r.body_len = <size_t>PyBytes_GET_SIZE(body)
        r.born_p = <const uint8_t *>PyBytes_AS_STRING(born_raw)
        r.born_len = <size_t>PyBytes_GET_SIZE(born_raw)
        r.parts = parts
        r.n_parts = n_parts
        # Held until _rec_release (see _Rec): taken last, after every check, so a False return
        # holds nothing; no allocation since the pointers above were read, so no other code
        # ran in between. Properties copied to pbuf need nothing held.
        Py_XINCREF(r.topic)
        Py_XINCREF(r.qid)
        Py_XINCREF(r.topic_b)
        Py_XINCREF(r.body)
        Py_XINCREF(r.born)
        r.n_held = 0
        if n_props and not r.pbuf_used:
            for i in range(2 * n_props):
                Py_XINCREF(kv_obj[i])
                r.held[i] = kv_obj[i]
            r.n_held = 2 * n_props
        return True

    cdef bint _read_ints(self, object msg, _Rec *r) except -1:
        """_prepare's ints when one is not a small int: converted as Cython converts them
        (an int subclass, __index__); False when one does not convert or fit, so the Python
        path takes the message and raises what the store documents. Ints only (bool is
        one): Cython would truncate a float, which the other backends refuse."""
        cdef int i
        cdef PyObject *p
        for i in (M_QID, M_FLAG, M_SYS_FLAG, M_BORN_TS, M_RECONSUME, M_PREPARED):
            p = _member(msg, self._m[i])
            if p == NULL or not PyLong_Check(<object>p):
                return False
        try:
            r.queue_id = <object>_member(msg, self._m[M_QID])
            r.flag = <object>_member(msg, self._m[M_FLAG])
            r.sys_flag = <object>_member(msg, self._m[M_SYS_FLAG])
            r.born_ts = <object>_member(msg, self._m[M_BORN_TS])
            r.reconsume = <object>_member(msg, self._m[M_RECONSUME])
            r.prepared = <object>_member(msg, self._m[M_PREPARED])
        except (TypeError, OverflowError):
            return False
        return True

    cdef int _sync_state(self) except -1:
        """Bring put()'s copies of the CommitLog's put state up to date: a compare while its
        instance dict is unchanged, the six lookups (and a new lock bound) when it changed.
        Called before the lock only: a copy that changes while put() holds the lock is seen
        by _state_current, and that put goes to the Python path."""
        cdef dict cl = self._cld
        cdef uint64_t ver = rs_dict_version(cl)
        if self._cl_valid and ver == self._cl_ver and rs_dict_versioned():
            return 0
        self._cl_valid = False
        self._c_limits = cl["write_queue_limits"]
        self._c_closed = bool(cl["closed"])
        self._c_after = cl["after_put"]
        self._c_wake = cl["wake_on_put"]
        self._c_table = cl["topic_queue_table"]
        lock = cl["put_lock"]
        if lock is not self._lock:      # replaced (tests do): bind to the new one
            self._bind_lock(lock)
        self._cl_ver = ver
        self._cl_valid = True
        return 0

    cdef inline bint _state_current(self) except -1:
        """Under the put lock: whether the copies _sync_state made still hold. Without dict
        versions, what the lock guards is read again here (the lock itself was read before)."""
        cdef dict cl
        if rs_dict_versioned():
            return self._cl_valid and rs_dict_version(self._cld) == self._cl_ver
        cl = self._cld
        self._c_closed = bool(cl["closed"])
        self._c_after = cl["after_put"]
        self._c_wake = cl["wake_on_put"]
        self._c_table = cl["topic_queue_table"]
        return True

    cdef inline object _files(self):
        """MappedFileQueue.files, read again only when the queue's dict changed (a roll
        replaces the list)."""
        cdef uint64_t ver = rs_dict_version(self._mfqd)
        if not (self._mfq_valid and ver == self._mfq_ver and rs_dict_versioned()):
            self._mfq_valid = False
            self._c_files = self._mfqd["files"]
            self._mfq_ver = ver
            self._mfq_valid = True
        return self._c_files

    cdef inline bint _not_writeable(self) except -1:
        """RunningFlags.flag_bits & not_writeable_mask, the slot read in place."""
        cdef PyObject *bits
        if self._flag_bits_off >= 0 and type(self._flags) is self._flags_type:
            bits = _member(self._flags, self._flag_bits_off)
            if bits != NULL and type(<object>bits) is int:
                return (<long><object>bits & self._mask) != 0
        return self._flags.flag_bits & self._mask

    cdef int _bind_lock(self, lock) except -1:
        self._acquire = lock.acquire
        self._release = lock.release
        self._lock = lock
        self._lock_direct = (type(lock) is _LockType
                             and rs_lock_layout_known((<type>_LockType).__basicsize__))
        return 0

    cdef inline int _lock_take(self) except -1:
        """The put lock, bound already: taken in place when free, else by acquire()."""
        if not (self._lock_direct and rs_lock_try(<PyObject *>self._lock)):
            self._acquire()
        return 0

    cdef inline int _lock_give(self) except -1:
        if not (self._lock_direct and rs_lock_give(<PyObject *>self._lock)):
            self._release()
        return 0

    cdef inline int _take_lock(self) except -1:
        lock = self._cld["put_lock"]
        if lock is not self._lock:      # replaced (tests do): bind to the new one
            self._bind_lock(lock)
        self._lock_take()
        return 0

    cdef inline int _wake(self, object wake, int64_t end) except -1:
        """_wake_on_put, with each service's has_notified and wake_from read in place from its
        wake_cell (services.base.ServiceThread): no attribute lookup a put, and for a wake
        that names its services (consumer.PutWake.services) no Python frame of its own."""
        cdef Py_ssize_t i
        if wake is None:
            return 0
        if wake is not self._wake_obj:
            self._bind_wake(wake)
        if self._n_wake == 0:
            return _wake_on_put(wake, end)
        for i in range(self._n_wake):
            if self._wake_cells[i][0] == 0 and end >= self._wake_cells[i][1]:
                (<tuple>self._wake_services)[i].wakeup()
        return 0

    cdef int _bind_wake(self, object wake) except -1:
        """Read what `wake` wakes: itself when it has a wake_cell, else the services of its
        `services` when each has one; otherwise (_n_wake 0) its attributes at every put."""
        cdef Py_ssize_t i
        self._unbind_wake()
        self._wake_obj = wake
        services = (wake,) if hasattr(wake, "wake_cell") else getattr(wake, "services", None)
        if type(services) is not tuple or not 0 < len(<tuple>services) <= MAX_WAKE_SERVICES:
            return 0
        try:
            for i in range(len(<tuple>services)):
                self._wake_cells[i] = _cell(services[i].wake_cell, &self._wake_bufs[i], 2)
                self._n_wake = i + 1
        except (AttributeError, TypeError):
            self._unbind_wake()             # a service without an int64 cell: attributes
            self._wake_obj = wake
            return 0
        self._wake_services = services
        return 0

    cdef void _unbind_wake(self) noexcept:
        cdef Py_ssize_t i
        for i in range(self._n_wake):
            PyBuffer_Release(&self._wake_bufs[i])
        self._n_wake = 0
        self._wake_services = None
        self._wake_obj = None

    cdef inline int64_t _now(self) except? -1:
        if self._system_clock:
            return _now_ms()
        return self._clock()

    cdef object _fitting_file(self, int64_t size):
        """Under the put lock: the CommitLog's last file when `size` more bytes, and the blank
        that may follow them, fit it below its refill position, in a writable compiled
        mapping; else None, for the Python path (a roll or a reservation, where the disk may
        refuse, or a file this path does not know)."""
        cdef Py_ssize_t i
        cdef int64_t end
        cdef Mapping m
        files = self._files()
        if type(files) is not list or not files:
            return None
        mf = (<list>files)[len(<list>files) - 1]
        if type(mf) is not self._file_type:
            return None
        for i in range(7):
            if _member(mf, self._f[i]) == NULL:
                return None
        end = <int64_t><object>_member(mf, self._f[F_WROTE]) + size + _BLANK
        mm = <object>_member(mf, self._f[F_MM])
        if (end > <int64_t><object>_member(mf, self._f[F_REFILL]) or end > self._file_size
                or type(mm) is not Mapping):
            return None
        m = <Mapping>mm
        if m._addr == NULL or not m.writable:
            return None
        return mf

    cdef object _moved(self, object mf, object end, bint buffered, int64_t ts):
        """Under the put lock: `mf`'s positions moved to `end` after a write stamped `ts`
        (with a write buffer only wrote_position: readers wait for the commit). Returns the
        store time's int, shared by the puts of one millisecond."""
        if self._ts_obj is None or self._ts != ts:
            self._ts_obj = ts
            self._ts = ts
        _set_member(mf, self._f[F_WROTE], end)
        if not buffered:
            _set_member(mf, self._f[F_COMMITTED], end)
        _set_member(mf, self._f[F_STORE_TS], self._ts_obj)
        return self._ts_obj

    def put(self, msg):
        """Store one message (MessageStore.put_message)."""
        cdef _Rec r
        cdef rs_part parts[4 * MAX_FAST_PROPS]
        cdef uint8_t pbuf[PROPS_INLINE]     # the properties string, copied before the lock
        cdef dict cl = self._cld
        cdef object mf, after, wake, table, qoff_obj, res, status
        cdef _QueueKey *qk
        cdef PyObject *p
        cdef object ts_obj
        cdef int64_t ts, pos, qoff, phy, t0
        cdef Mapping m
        cdef Py_buffer out
        cdef char *dst
        cdef size_t dst_len
        cdef bint buffered

        self._sync_state()
        if (self._not_writeable()
                or (self._cells[C_LOCK_BEGIN] != 0 and self._busy())
                or not self._prepare(msg, &r, parts, self._c_limits, pbuf, PROPS_INLINE)):
            return self._slow(msg)
        try:
            t0 = _mono_ns()

            # Under the put lock: the final offsets, and the record written once. The state
            # copied before the lock still holds unless another thread changed the CommitLog's
            # attributes while this one waited for the lock (shutdown, a new hook): then the
            # Python path takes this put and reads them itself.
            self._lock_take()
            try:
                if not self._state_current() or self._c_closed:
                    return self._slow_unlocked(msg)
                mf = self._fitting_file(r.size)
                if mf is None:
                    return self._slow_unlocked(msg)
                pos = <object>_member(mf, self._f[F_WROTE])
                m = <Mapping><object>_member(mf, self._f[F_MM])
                # The TransientStorePool's write buffer takes the record instead of the mapping,
                # and only wrote_position moves: readers wait for the commit (doc/03 §2.4).
                buffered = _member(mf, self._f[F_WBUF]) != <PyObject *>None
                after = self._c_after
                wake = self._c_wake
                table = self._c_table
                # The put is taken here: a clock that waits keeps the lock, as the Python path
                # does. Only unmapping could change what was read above, and that needs the lock.
                ts = self._now()
                self._cells[C_LOCK_BEGIN] = ts
                if m._addr == NULL:
                    raise _StoreClosedError("the CommitLog file was unmapped during a put")
                qk = self._queue_key(&r, table)
                p = _PyDict_GetItem_KnownHash(table, <object>qk.key, qk.hash)
                qoff_obj = 0 if p == NULL else <object>p
                qoff = qoff_obj
                phy = <int64_t><object>_member(mf, self._f[F_FROM]) + pos
                if buffered:
                    PyObject_GetBuffer(<object>_member(mf, self._f[F_WBUF]), &out, PyBUF_WRITABLE)
                    dst = <char *>out.buf
                    dst_len = <size_t>out.len
                else:
                    dst = m._addr
                    dst_len = <size_t>m._size
                try:
                    _encoded(_rec_encode(&r, dst, dst_len, pos, qoff, phy, ts,
                                         <const uint8_t *>PyBytes_AS_STRING(self._store_raw),
                                         <size_t>PyBytes_GET_SIZE(self._store_raw)), r.size)
                finally:
                    if buffered:
                        PyBuffer_Release(&out)
                ts_obj = self._moved(mf, pos + r.size, buffered, ts)
                _PyDict_SetItem_KnownHash(table, <object>qk.key, qoff_obj + 1, qk.hash)
                self._cells[C_PUT_TIMES] += 1
                self._cells[C_PUT_BYTES] += r.size
            finally:
                self._cells[C_LOCK_BEGIN] = 0
                self._lock_give()
            self.fast += 1
            self._wake(wake, phy + r.size)
            status = self._put_ok if after is None else after(phy + r.size, msg)
            self._record(t0, status is self._put_ok)
            res = PyType_GenericAlloc(<PyTypeObject *>self._result_type, 0)
            _set_member(res, self._r[0], status)
            _set_member(res, self._r[1], None)
            _set_member(res, self._r[2], phy)
            _set_member(res, self._r[3], qoff_obj)
            _set_member(res, self._r[4], ts_obj)
            _set_member(res, self._r[5], r.size)
            _set_member(res, self._r[6], self._store_raw)
            # Not tracked by the garbage collector: it refers to an enum member, ints and bytes
            # only, so it can be in no cycle, and a program keeping a million results would
            # otherwise make every collection walk them all (measured: ~30 % of a put). The
            # class status.py builds is not even a collected one (_untracked_slots_type).
            if PyObject_IS_GC(res):
                PyObject_GC_UnTrack(res)
            return res
        finally:
            _rec_release(&r)     # what the record pointed into (see _Rec)

    def put_list(self, msgs, batch_properties=None, written_rows=None):
        """Store a list of messages (MessageStore.put_messages): every record is checked
        before the lock, then encoded once at its final offset, one Python call per file
        touched (which picks, reserves or rolls it). A list with any message this path does
        not take, a broker batch (`batch_properties`), or anything but a list goes to the
        Python path whole.

        `written_rows` (services.reput.WrittenRows, or None): on this path, it receives the scan
        rows of the records written into the first file touched (rs_msg_row, as each is
        encoded), so the put's inline dispatch need not scan them (doc/03 §8); its `n` is
        left as the caller set it (0) when the Python path takes the list."""
        cdef Py_ssize_t n, i, k, done = 0, nparts_cap, nparts_used = 0, n_keys = 0
        cdef Py_ssize_t n_prepared = 0     # records whose references are held
        cdef _Rec *recs = NULL
        cdef rs_part *parts = NULL
        cdef rs_part *grown
        cdef int64_t *qoffs
        cdef int64_t *phys
        cdef int64_t *sizes
        cdef int64_t *base = NULL         # per distinct queue: its offset before this call
        cdef int64_t *count = NULL        # per distinct queue: records written by this call
        cdef Py_ssize_t *slot_of = NULL   # per record: its distinct queue
        cdef int64_t ts, total = 0, written = 0, pos, limit, wpos, phy_base, t0
        cdef dict cl = self._cld
        cdef Py_ssize_t *qslot = NULL      # the distinct-queue table: slot -> queue, or -1
        cdef Py_ssize_t *first_of = NULL   # per distinct queue: its first record
        cdef size_t qcap, qmax, h, store_len, need
        cdef char *block = NULL
        cdef uint8_t *pnext
        cdef uint8_t *pend
        cdef bint cached
        cdef const uint8_t *store_p
        cdef PyObject **kobj = NULL         # per distinct queue: its table key and hash
        cdef Py_hash_t *khash = NULL
        cdef _QueueKey *qk
        cdef PyObject *p
        cdef object key, table, after, wake, mf, status, reason, target, status_obj
        cdef Py_buffer out, rb
        cdef rs_scan_rec *rowp = NULL      # `written`'s rows, filled in the first file only
        cdef Py_ssize_t n_rows = 0
        cdef int64_t rows_bytes = 0
        cdef PyObject *row_topic = NULL    # the topic whose hash row_hash is
        cdef int32_t row_hash = 0
        cdef int32_t tags_h = 0
        cdef int64_t tags_code
        if (batch_properties is not None or type(msgs) is not list
                or self._flags.flag_bits & self._mask or not msgs
                or (self._cells[C_LOCK_BEGIN] != 0 and self._busy())):
            return self._slow_list(msgs, batch_properties)
        t0 = _mono_ns()
        n = len(<list>msgs)
        memset(&out, 0, sizeof(out))
        memset(&rb, 0, sizeof(rb))
        cols = _result_columns(n, &phys)
        qoffs = phys + n
        sizes = qoffs + n
        # Working memory, one block reused call after call (a fresh quarter megabyte per call
        # was freed back to the OS and faulted in again each time): the records, then the
        # distinct-queue table and per-queue arrays; the properties' pieces grow apart.
        qmax = 16
        while qmax < 2 * n:
            qmax *= 2
        need = (n * sizeof(_Rec) + 2 * n * sizeof(Py_ssize_t) + qmax * sizeof(Py_ssize_t)
                + 2 * n * sizeof(int64_t) + n * sizeof(PyObject *) + n * sizeof(Py_hash_t)
                + n * PROPS_INLINE)
        nparts_cap = n * 8 + 4 * MAX_FAST_PROPS
        cached = not self._scratch_busy
        if cached:
            self._scratch_busy = True
            if self._scratch_cap < need:
                PyMem_Free(self._scratch)
                self._scratch = <char *>PyMem_Malloc(need)
                self._scratch_cap = need if self._scratch != NULL else 0
            if self._parts_cap < nparts_cap:
                PyMem_Free(self._parts)
                self._parts = <rs_part *>PyMem_Malloc(nparts_cap * sizeof(rs_part))
                self._parts_cap = nparts_cap if self._parts != NULL else 0
            block = self._scratch
            parts = self._parts
            nparts_cap = self._parts_cap
        else:                       # another thread's put_list is using them
            block = <char *>PyMem_Malloc(need)
            parts = <rs_part *>PyMem_Malloc(nparts_cap * sizeof(rs_part))
        try:
            if block == NULL or parts == NULL:
                raise MemoryError()
            if written_rows is not None:
                rows_obj = written_rows.rows
                if rows_obj is None or len(rows_obj) < n:
                    rows_obj = _np.empty(max(n, 1024), dtype=_SCAN_DTYPE)
                    written_rows.rows = rows_obj
                PyObject_GetBuffer(rows_obj, &rb, PyBUF_WRITABLE)
                rowp = <rs_scan_rec *>rb.buf
            recs = <_Rec *>block
            slot_of = <Py_ssize_t *>(recs + n)
            first_of = slot_of + n
            qslot = first_of + n
            base = <int64_t *>(qslot + qmax)
            count = base + n
            kobj = <PyObject **>(count + n)
            khash = <Py_hash_t *>(kobj + n)
            pnext = <uint8_t *>(khash + n)      # the properties strings _prepare copies
            pend = pnext + n * PROPS_INLINE
            # Distinct queues by (validated topic bytes, queue id): the topic cache hands out
            # one bytes object per topic, so equal topics share it. The table has room for
            # 2n (qmax) and starts at 64 slots, doubled as queues come: a list goes to a few
            # queues, and clearing the whole table was ~16 instructions a message (callgrind).
            qcap = min(qmax, <size_t>64)
            memset(qslot, 0xFF, qcap * sizeof(Py_ssize_t))       # -1: empty
            limits = cl["write_queue_limits"]     # rebound on change: one per call
            if type(limits) is dict and not len(<dict>limits):
                limits = None                       # no limit: nothing to look up per message
            for i in range(n):
                if nparts_cap - nparts_used < 4 * MAX_FAST_PROPS:
                    grown = <rs_part *>PyMem_Realloc(parts, 2 * nparts_cap * sizeof(rs_part))
                    if grown == NULL:
                        raise MemoryError()
                    nparts_cap *= 2
                    # Records prepared so far point into the old block: move them along.
                    for k in range(i):
                        recs[k].parts = grown + (recs[k].parts - parts)
                    parts = grown
                if not self._prepare((<list>msgs)[i], &recs[i], parts + nparts_used, limits,
                                     pnext, pend - pnext):
                    return self._slow_list(msgs, None)
                n_prepared = i + 1
                pnext += recs[i].pbuf_used
                nparts_used += recs[i].n_parts
                sizes[i] = recs[i].size
                total += recs[i].size
                # The record's queue among the list's distinct queues, by (topic bytes
                # object, queue id) in a C table: the topic cache hands out one bytes object
                # per topic, so equal topics share it. A tuple key is made once per queue.
                h = rs_mix(_queue_hash_key(recs[i].topic_b, recs[i].queue_id), qcap - 1)
                while True:
                    k = qslot[h]
                    if k < 0:
                        k = n_keys
                        n_keys += 1
                        qslot[h] = k
                        first_of[k] = i
                        if 2 * <size_t>n_keys > qcap:      # at most half full: double it
                            qcap *= 2                       # (n_keys <= n, qmax >= 2n)
                            _requeue(qslot, qcap, recs, first_of, n_keys)
                        break
                    if recs[first_of[k]].topic_b == recs[i].topic_b and \
                            recs[first_of[k]].queue_id == recs[i].queue_id:
                        break
                    h = (h + 1) & (qcap - 1)
                slot_of[i] = k
            store_p = <const uint8_t *>PyBytes_AS_STRING(self._store_raw)
            store_len = <size_t>PyBytes_GET_SIZE(self._store_raw)
            memset(count, 0, n_keys * sizeof(int64_t))

            self._take_lock()
            try:
                if cl["closed"]:
                    return self._slow_list_unlocked(msgs)
                after = cl["after_put"]
                wake = cl["wake_on_put"]
                table = cl["topic_queue_table"]
                ts = self._now()
                self._cells[C_LOCK_BEGIN] = ts
                # Each queue's table key, made once per PutPath (under the lock, as put()
                # does); borrowed here, the key table holds them.
                for k in range(n_keys):
                    qk = self._queue_key(&recs[first_of[k]], table)
                    kobj[k] = qk.key
                    khash[k] = qk.hash
                for k in range(n_keys):
                    p = _PyDict_GetItem_KnownHash(table, <object>kobj[k], khash[k])
                    base[k] = 0 if p == NULL else <int64_t><object>p
                for i in range(n):
                    k = slot_of[i]
                    qoffs[i] = base[k] + count[k]
                    count[k] += 1
                memset(count, 0, n_keys * sizeof(int64_t))
                status = None
                try:
                    while done < n:
                        # The last file when the rest fits below its refill position (as
                        # put() finds it); else Python picks the file, creates or reserves
                        # it, and says why not when it cannot.
                        mf = self._fitting_file(total - written)
                        if mf is None:
                            mf, status, reason = self._cl._batch_file(total - written)
                            if mf is None:
                                break
                        target = mf.write_target
                        PyObject_GetBuffer(target, &out, PyBUF_WRITABLE)
                        try:
                            wpos = mf.wrote_position
                            limit = min(<int64_t>mf.reserved_position, self._file_size)
                            phy_base = <int64_t>mf.file_from_offset + wpos
                            pos = wpos
                            # With the GIL: the records point into the messages' objects,
                            # which another thread could change meanwhile. (Measured: letting
                            # the reput thread in here cost the writer more than it gained.)
                            if done:
                                rowp = NULL         # rows describe one file only
                            while done < n and pos + recs[done].size + _BLANK <= limit:
                                phys[done] = phy_base + (pos - wpos)
                                if rowp == NULL:
                                    _encoded(_rec_encode(&recs[done], <char *>out.buf,
                                                         <size_t>out.len, pos, qoffs[done],
                                                         phys[done], ts, store_p, store_len),
                                             recs[done].size)
                                else:
                                    if recs[done].topic_b != row_topic:
                                        row_topic = recs[done].topic_b
                                        row_hash = rs_msg_topic_hash(recs[done].topic_p,
                                                                     recs[done].topic_len)
                                    tags_code = 0
                                    if recs[done].tags_len > 0:
                                        rs_java_hash(recs[done].tags_p,
                                                     <size_t>recs[done].tags_len, &tags_h)
                                        tags_code = tags_h
                                    # The record and its row in one call: the row is set
                                    # from the values encoded, not read back (rs_msg_row).
                                    _encoded(_rec_encode_row(&recs[done], <char *>out.buf,
                                                             <size_t>out.len, pos, qoffs[done],
                                                             phys[done], ts, store_p, store_len,
                                                             row_hash,
                                                             RS_ROW_TAGS_GIVEN
                                                             if recs[done].tags_len > 0
                                                             else RS_ROW_TAGS_NONE, tags_code,
                                                             &rowp[done]), recs[done].size)
                                    n_rows = done + 1
                                    rows_bytes = pos + recs[done].size - wpos
                                count[slot_of[done]] += 1
                                pos += recs[done].size
                                done += 1
                        finally:
                            PyBuffer_Release(&out)
                        if pos > wpos:
                            mf.wrote_position = pos
                            if mf.wbuf is None:
                                mf.committed_position = pos
                            mf.store_timestamp = ts
                            written += pos - wpos
                        if done < n and pos + recs[done].size + _BLANK > self._file_size:
                            self._cl._end_file(mf, pos)
                finally:
                    # What was written keeps its queue offsets; the rest gives them back.
                    for k in range(n_keys):
                        if count[k]:
                            _PyDict_SetItem_KnownHash(table, <object>kobj[k],
                                                      base[k] + count[k], khash[k])
                    self._cells[C_PUT_TIMES] += done
                    self._cells[C_PUT_BYTES] += written
            finally:
                self._cells[C_LOCK_BEGIN] = 0
                self._lock_give()
        finally:
            for i in range(n_prepared):
                _rec_release(&recs[i])      # what the records pointed into (see _Rec)
            PyBuffer_Release(&rb)
            if cached:
                self._parts = parts             # grown, perhaps
                self._parts_cap = nparts_cap
                self._scratch_busy = False
            else:
                PyMem_Free(block)
                PyMem_Free(parts)
        if n_rows:
            written_rows.n = n_rows
            written_rows.offset = phys[0]
            written_rows.nbytes = rows_bytes
        # The store host of every message: one bytes object, not a list of `done` references
        # to it (PutMessagesResult.msg_ids reads either; ~10 instructions a message).
        stored = self._store_raw
        if done < n:
            self._record(t0, False)
            return self._batch_result_type(status, done, cols[:done], cols[n:n + done].copy(),
                                           cols[2 * n:2 * n + done], ts, written, stored,
                                           reason=reason)
        self.fast += n
        self._wake(wake, phys[n - 1] + sizes[n - 1])
        status_obj = (self._put_ok if after is None
                      else after(phys[n - 1] + sizes[n - 1], (<list>msgs)[n - 1]))
        self._record(t0, status_obj is self._put_ok)
        return self._stored_all(status_obj, n, cols, ts, total)

    def put_columns(self, topic, queue_id, cols, flag, born_timestamp, born_host,
                    written_rows=None):
        """MessageStore.put_batch's common case from batch.columns' layout (_columns); None,
        counted in `slow`, when the Python path must take the batch."""
        r = self._columns(topic, queue_id, cols, flag, born_timestamp, born_host, written_rows)
        if r is None:
            self.slow += 1
        return r

    def put_lists(self, topic, queue_id, bodies, tags, keys, properties, flag,
                  born_timestamp, born_host, template, written_rows=None):
        """MessageStore.put_batch's common case straight from its arguments, laid out in this
        object's working memory (_put_lists, _columns.pxi): no Columns, no numpy column and
        no bytes object per call. `template` is batch.batch_template. None, with nothing
        written, when the caller must lay the batch out with batch.columns (which raises for
        bad input) and put it through put_columns, which counts in `slow` what it hands to
        the Python path."""
        return _put_lists(self, topic, queue_id, bodies, tags, keys, properties, flag,
                          born_timestamp, born_host, template, written_rows)

    cdef object _columns(self, topic, queue_id, cols, flag, born_timestamp, born_host,
                         written_rows):
        """put_columns: the columnar batch `cols` (batch.Columns) read into a _Batch and put by
        _put_batch. Measured before this path: a one-message put_batch spent 9 us in
        CommitLog.put_batch, against 2.7 us for put_list's whole call."""
        cdef Py_ssize_t n, i
        cdef _Batch c
        cdef object lens, a, b, flags_or
        cdef const int64_t[::1] ko, kf, kpre
        cdef const int64_t[::1] ka, kb
        cdef const int32_t[::1] kx
        cdef Py_buffer v[4]             # bodies, a, b, frags
        n = cols.n
        if n <= 0:
            return None
        lens = cols.record_lens()
        if type(lens) is not tuple or len(<tuple>lens) != 6:
            return None
        memset(&c, 0, sizeof(c))
        c.n = n
        kpre = _offsets(lens[1], n + 1)
        c.prefix = &kpre[0]
        c.shared = lens[2]
        c.body_max = lens[3]
        c.props_max = lens[4]
        c.var_max = lens[5]
        bodies = cols.bodies
        a = cols.a
        b = cols.b
        ko = _offsets(bodies.off, n + 1)
        c.body_off = &ko[0]
        kf = _offsets(cols.frag_off, 4)
        c.frag_off = &kf[0]
        if a is not None:
            ka = _offsets(a.off, n + 1)
            c.a_off = &ka[0]
        if b is not None:
            kb = _offsets(b.off, n + 1)
            c.b_off = &kb[0]
        flags_or = cols.flags_or
        if flags_or is not None:
            try:
                kx = flags_or
            except (TypeError, ValueError, BufferError):
                return None
            if kx.shape[0] < n:
                return None
            c.flags_or = &kx[0]
        c.tags_col = cols.tags_col
        memset(v, 0, sizeof(v))
        try:
            _ro(bodies.data, &v[0])
            _ro(b"" if a is None else a.data, &v[1])
            _ro(b"" if b is None else b.data, &v[2])
            _ro(cols.frags, &v[3])
            c.body = <const uint8_t *>v[0].buf
            c.body_len = <size_t>v[0].len
            c.a = <const uint8_t *>v[1].buf
            c.a_len = <size_t>v[1].len
            c.b = <const uint8_t *>v[2].buf
            c.b_len = <size_t>v[2].len
            c.frags = <const uint8_t *>v[3].buf
            c.frags_len = <size_t>v[3].len
            return self._put_batch(topic, queue_id, &c, flag, born_timestamp, born_host,
                                   written_rows, cols.properties)
        finally:
            for i in range(4):
                PyBuffer_Release(&v[i])

    cdef object _put_batch(self, topic, queue_id, const _Batch *c, flag, born_timestamp,
                           born_host, written_rows, properties):
        """MessageStore.put_batch's common case as one call, CommitLog.put_batch being the
        reference: the laid-out batch `c` to one topic and queue, encoded by rs_batch_encode
        at the current file's write position. `written_rows` as put_list's; `properties` the
        batch's (what after_put reads).

        None, with nothing written and the lock not held, when the Python path must take
        the batch: an empty batch, a topic or born host not seen yet, a value of another
        type, a record over a limit, or a batch that does not fit below its file's refill
        position (a roll or a reservation, where the disk may refuse)."""
        cdef Py_ssize_t n = c.n, i
        cdef int64_t qbase, pos, phy_base, total, empty_size, ts, t0
        cdef int64_t count = 0, nbytes = 0, born_ts
        cdef int32_t qid, v_flag, sys_flag, born_v6
        cdef int rc
        cdef bytes topic_b, born_raw
        cdef object lim, mf, mm, table, after, wake, qoff_obj, status, ts_obj
        cdef object target, rows_obj = None
        cdef rs_scan_rec *pr = NULL
        cdef int64_t *phys
        cdef int64_t *qoffs
        cdef int64_t *sizes
        cdef Py_buffer v[2]             # rows, and the file's buffer
        cdef _Rec r
        cdef _QueueKey *qk
        cdef PyObject *p
        cdef bint buffered
        cdef void *save
        cdef const uint8_t *topic_p
        cdef const uint8_t *born_p
        cdef const uint8_t *store_p
        cdef size_t topic_len, born_len, store_len
        if (type(topic) is not str or type(queue_id) is not int or type(flag) is not int
                or type(born_timestamp) is not int or type(born_host) is not tuple
                or not 0 <= queue_id <= 0x7FFFFFFF or not -0x80000000 <= flag <= 0x7FFFFFFF
                or not -0x8000000000000000 <= born_timestamp <= 0x7FFFFFFFFFFFFFFF):
            return None
        qid = queue_id
        v_flag = flag
        born_ts = born_timestamp
        topic_b = self._topics.get(topic)       # validated topics only
        self._sync_state()
        if topic_b is None or self._c_closed:
            return None
        lim = self._c_limits
        if type(lim) is not dict:
            return None
        if len(<dict>lim):
            lim = (<dict>lim).get(topic)
            if lim is not None and queue_id >= lim:
                return None
        if n <= 0 or c.body_max > self._max_body or c.props_max > RS_MAX_PROPERTIES_LENGTH:
            return None
        packed = self._hosts.get(born_host)
        if packed is None:
            return None                         # pack_host validates and caches it
        born_raw = <bytes>(<tuple>packed)[0]
        born_v6 = RS_BORNHOST_V6_FLAG if (<tuple>packed)[1] else 0
        sys_flag = self._store_v6 | born_v6
        topic_p = <const uint8_t *>PyBytes_AS_STRING(topic_b)
        topic_len = <size_t>PyBytes_GET_SIZE(topic_b)
        born_p = <const uint8_t *>PyBytes_AS_STRING(born_raw)
        born_len = <size_t>PyBytes_GET_SIZE(born_raw)
        store_p = <const uint8_t *>PyBytes_AS_STRING(self._store_raw)
        store_len = <size_t>PyBytes_GET_SIZE(self._store_raw)
        empty_size = rs_record_size(sys_flag, 0, len(topic_b), 0, 0)
        if empty_size <= 0 or empty_size + c.var_max > self._file_size - _BLANK:
            return None
        total = (empty_size + c.shared) * n + c.prefix[n]
        cols_a = _result_columns(n, &phys)     # the queue offsets are set below
        qoffs = phys + n
        sizes = qoffs + n
        if written_rows is not None:
            rows_obj = written_rows.rows
            if rows_obj is None or len(rows_obj) < n:
                rows_obj = _np.empty(max(n, 1024), dtype=_SCAN_DTYPE)
                written_rows.rows = rows_obj
        r.topic = <PyObject *>topic             # what _queue_key reads of a record
        r.qid = <PyObject *>queue_id
        r.topic_b = <PyObject *>topic_b
        r.queue_id = qid
        memset(v, 0, sizeof(v))
        t0 = _mono_ns()
        try:
            if rows_obj is not None:
                if getattr(rows_obj, "dtype", None) != _SCAN_DTYPE:
                    return None
                _rw(rows_obj, &v[0])
                if v[0].len < n * <Py_ssize_t>sizeof(rs_scan_rec):
                    return None
                pr = <rs_scan_rec *>v[0].buf
            self._lock_take()
            try:
                # As put(): the state copied before the lock still holds unless another
                # thread changed the CommitLog's attributes meanwhile (shutdown, a new hook).
                if not self._state_current() or self._c_closed:
                    return None
                mf = self._fitting_file(total)
                if mf is None:
                    return None
                pos = <object>_member(mf, self._f[F_WROTE])
                mm = <object>_member(mf, self._f[F_MM])
                buffered = _member(mf, self._f[F_WBUF]) != <PyObject *>None
                target = <object>_member(mf, self._f[F_WBUF]) if buffered else mm
                after = self._c_after
                wake = self._c_wake
                table = self._c_table
                ts = self._now()
                self._cells[C_LOCK_BEGIN] = ts
                qk = self._queue_key(&r, table)
                p = _PyDict_GetItem_KnownHash(table, <object>qk.key, qk.hash)
                qoff_obj = 0 if p == NULL else <object>p
                qbase = qoff_obj
                phy_base = <int64_t><object>_member(mf, self._f[F_FROM]) + pos
                # The file stays mapped while its buffer is held (Mapping counts exports).
                _rw(target, &v[1])
                # Only a large batch lets go of the GIL for its encode: for a few records the
                # hand-off costs more than the loop, and each release lets a waiting service
                # thread take the putter's core (doc/performance.md,
                # "What a `put_batch` call costs beside its messages").
                save = PyEval_SaveThread() if total >= NOGIL_BATCH_BYTES else NULL
                rc = rs_batch_encode(<uint8_t *>v[1].buf, <size_t>v[1].len, pos,
                                     pos + total + _BLANK, topic_p, topic_len, qid,
                                     c.body, c.body_len, c.body_off,
                                     c.a, c.a_len, c.a_off, c.b, c.b_len, c.b_off,
                                     c.frags, c.frags_len, c.frag_off,
                                     0, n, v_flag, sys_flag, c.flags_or, born_ts, born_p,
                                     born_len, ts, store_p, store_len, qbase, phy_base, phys,
                                     sizes, pr, c.tags_col, &count, &nbytes)
                if save != NULL:
                    PyEval_RestoreThread(save)
                PyBuffer_Release(&v[1])
                _check(rc, "batch_encode")
                if count != n or nbytes != total:
                    # Nothing moved: what was written lies past the write position, unread.
                    raise RuntimeError(f"[BUG] put_batch: {count} records of {nbytes} "
                                       f"bytes encoded, {n} of {total} expected")
                ts_obj = self._moved(mf, pos + total, buffered, ts)
                _PyDict_SetItem_KnownHash(table, <object>qk.key, qoff_obj + n, qk.hash)
                self._cells[C_PUT_TIMES] += n
                self._cells[C_PUT_BYTES] += total
            finally:
                self._cells[C_LOCK_BEGIN] = 0
                self._lock_give()
        finally:
            for i in range(2):
                PyBuffer_Release(&v[i])
        if pr != NULL:
            written_rows.n = n
            written_rows.offset = phy_base
            written_rows.nbytes = total
        self.fast += n
        self._wake(wake, phy_base + total)
        if after is None:
            status = self._put_ok
        else:
            # after_put reads the WAIT property, which the batch shares.
            status = after(phy_base + total, self._message_type(
                topic, queue_id=queue_id, properties=properties))
        self._record(t0, status is self._put_ok)
        for i in range(n):
            qoffs[i] = qbase + i
        return self._stored_all(status, n, cols_a, ts_obj, total)


    cdef object _slow_list(self, msgs, batch_properties):
        self.slow += 1
        return self._store_put_list(msgs, batch_properties)

    cdef object _slow_list_unlocked(self, msgs):
        self._lock_give()
        try:
            return self._slow_list(msgs, None)
        finally:
            self._lock_take()

    cdef object _slow(self, msg):
        self.slow += 1
        return self._store_put(msg)

    cdef object _slow_unlocked(self, msg):
        # Called with the put lock held: the Python path takes it itself.
        self._lock_give()
        try:
            return self._slow(msg)
        finally:
            self._lock_take()
