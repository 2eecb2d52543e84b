# SPDX-License-Identifier: Apache-2.0
# Mapping: a shared file mapping that keeps no descriptor (included by _cext.pyx).
#
# CPython's mmap.mmap dup()s the descriptor it maps and holds the copy until close, so a store
# with one file per queue needs one descriptor per queue: 40 000 queues exceed the default
# `ulimit -n`.  A mapping does not need its descriptor (mmap(2): "closing the file descriptor
# does not unmap the region"), which is what RocketMQ's MappedFile gets from the JVM's
# FileChannel.map.  This class maps with mmap(2) and keeps only the address; FileSystem.map
# closes the descriptor right after.  It offers what the store uses of mmap.mmap, with the
# same errors, and refuses to unmap while a buffer export (memoryview, numpy array, kernel
# call) or one of its own GIL-free calls still points into it.
from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.errno cimport errno
from libc.string cimport memchr, memcmp, memcpy, memmove
from posix.mman cimport MAP_FAILED, MAP_SHARED, MS_SYNC, PROT_READ, PROT_WRITE, mmap, msync, munmap
from posix.stat cimport S_ISREG, fstat, struct_stat
from posix.unistd cimport _SC_PAGESIZE, sysconf

from os import strerror as _strerror

cdef extern from "<sys/mman.h>" nogil:
    # Not in Cython's posix.mman (POSIX has only posix_madvise, which lacks POPULATE_WRITE).
    int madvise(void *addr, size_t length, int advice)

# Copies at least this long run without the GIL: touching a page of a mapping may wait on the
# disk, and a producer must not wait with it.
DEF NOGIL_MAP_BYTES = 65536
# MADV_POPULATE_READ / MADV_POPULATE_WRITE (Linux 5.14+; not in every libc's headers). Each
# call holds the process's mmap lock (read) for its whole range: a populate of tens of MiB,
# preempted on a loaded machine, held it for seconds, and an mmap or a MADV_RANDOM of any
# thread (a writer) queued behind it, and page faults of every thread behind that writer. A
# populate goes a chunk per call, so the lock is let go between chunks.
DEF RS_MADV_POPULATE_READ = 22
DEF RS_MADV_POPULATE_WRITE = 23
DEF POPULATE_CHUNK = 2097152
cdef char *_FORMAT_B = b"B"      # unsigned bytes, as mmap.mmap exports

__all__ += ("Mapping",)


cdef inline void _unmap_nogil(char *addr, Py_ssize_t size) noexcept:
    """munmap without the GIL, as CPython's mmap does: unmapping tears down a page-table
    entry per page mapped in 4 KiB, ~20 ms for a 1 GiB file mapped that way (measured), and
    a put in another thread must not wait for it."""
    with nogil:
        munmap(addr, <size_t>size)


cdef inline object _os_error(int err, str what):
    return OSError(err, f"{_strerror(err)} ({what})")


cdef class Mapping:
    """Mapping(fd, size, writable=True): map the first `size` bytes of the open file `fd`
    (MAP_SHARED), keeping no descriptor; the caller closes `fd` when it likes.

    The mmap.mmap subset the store uses: len(), item and slice reads (int, bytes) and
    assignment, find(), flush([offset[, size]]) (msync), madvise(option[, start[, length[,
    from_end]]]),
    close() and `closed`, the buffer protocol (writable when `writable`) and `with`.  Copies of
    64 KiB or more, find(), flush() and madvise() release the GIL.  close() raises BufferError
    while an export or such a call is live, as mmap.mmap does; use after close raises
    ValueError."""
    cdef char *_addr
    cdef Py_ssize_t _size
    cdef Py_ssize_t _exports          # buffer exports plus GIL-free calls in progress
    cdef readonly bint writable

    def __cinit__(self, int fd, Py_ssize_t size, bint writable=True):
        cdef struct_stat st
        cdef void *p
        cdef int prot = PROT_READ | (PROT_WRITE if writable else 0)
        self._addr = NULL
        if size <= 0:
            raise ValueError("mapping size must be positive")
        if fstat(fd, &st) != 0:
            raise _os_error(errno, "fstat")
        # A shared page past the end of the file raises SIGBUS on first touch: refuse it, as
        # mmap.mmap does.
        if S_ISREG(st.st_mode) and st.st_size < size:
            raise ValueError("mmap length is greater than file size")
        with nogil:
            p = mmap(NULL, <size_t>size, prot, MAP_SHARED, fd, 0)
        if p == MAP_FAILED:
            raise _os_error(errno, "mmap")
        self._addr = <char *>p
        self._size = size
        self.writable = writable

    def __dealloc__(self):
        # No export can outlive the object: each one holds a reference to it.
        cdef char *addr = self._addr
        if addr != NULL:
            self._addr = NULL
            _unmap_nogil(addr, self._size)

    cdef inline int _live(self) except -1:
        if self._addr == NULL:
            raise ValueError("mmap closed or invalid")
        return 0

    cdef inline int _writable(self) except -1:
        self._live()
        if not self.writable:
            raise TypeError("mmap can't modify a readonly memory map.")
        return 0

    @property
    def closed(self):
        return self._addr == NULL

    def close(self):
        """Unmap; BufferError while a view or a GIL-free call still uses the pages."""
        cdef char *addr
        if self._addr == NULL:
            return
        if self._exports > 0:
            raise BufferError("cannot close exported pointers exist")
        addr = self._addr
        self._addr = NULL           # closed to every other thread before the GIL goes
        _unmap_nogil(addr, self._size)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __len__(self):
        self._live()
        return self._size

    # ---- buffer protocol -----------------------------------------------------------------
    def __getbuffer__(self, Py_buffer *view, int flags):
        self._live()
        if (flags & PyBUF_WRITABLE) and not self.writable:
            raise BufferError("Object is not writable.")
        view.buf = self._addr
        view.obj = self
        view.len = self._size
        view.readonly = not self.writable
        view.itemsize = 1
        view.format = _FORMAT_B if (flags & PyBUF_FORMAT) else NULL
        view.ndim = 1
        view.shape = &self._size if (flags & PyBUF_ND) else NULL
        view.strides = &view.itemsize if (flags & PyBUF_STRIDES) else NULL
        view.suboffsets = NULL
        view.internal = NULL
        self._exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self._exports -= 1

    # ---- items and slices ----------------------------------------------------------------
    cdef Py_ssize_t _index(self, object key) except -1:
        cdef Py_ssize_t i = key
        if i < 0:
            i += self._size
        if i < 0 or i >= self._size:
            raise IndexError("mmap index out of range")
        return i

    cdef object _copy_out(self, Py_ssize_t start, Py_ssize_t n, bint release=False):
        cdef object out = PyBytes_FromStringAndSize(NULL, n)
        cdef char *dst = PyBytes_AS_STRING(out)
        if n < NOGIL_MAP_BYTES and not release:
            memcpy(dst, self._addr + start, <size_t>n)
            return out
        self._exports += 1
        try:
            with nogil:
                memcpy(dst, self._addr + start, <size_t>n)
        finally:
            self._exports -= 1
        return out

    def copy_released(self, Py_ssize_t start, Py_ssize_t n):
        """The `n` bytes at `start`, copied with the GIL released however few they are: for
        bytes that may be off the page cache, whose fault waits on the disk. A slice this
        short copies with the GIL held, and every thread of the process waited with it."""
        self._live()
        if start < 0 or n < 0 or n > self._size - start:
            raise IndexError("mmap slice out of range")
        return self._copy_out(start, n, True)

    def __getitem__(self, key):
        cdef Py_ssize_t start, stop, step
        self._live()
        if isinstance(key, slice):
            start, stop, step = key.indices(self._size)
            if step == 1:
                return self._copy_out(start, stop - start if stop > start else 0)
            view = memoryview(self)[key]
            try:
                return view.tobytes()
            finally:
                view.release()
        return <unsigned char>self._addr[self._index(key)]

    def __setitem__(self, key, value):
        cdef Py_ssize_t start, stop, step, n, i
        cdef Py_buffer src
        cdef const unsigned char *s
        cdef long item
        self._writable()
        if not isinstance(key, slice):
            item = value
            if item < 0 or item > 255:
                raise ValueError("mmap item value must be in range(0, 256)")
            self._addr[self._index(key)] = <char>item
            return
        start, stop, step = key.indices(self._size)
        n = len(range(start, stop, step))
        memset(&src, 0, sizeof(src))
        _ro(value, &src)
        try:
            if src.len != n:
                raise IndexError("mmap slice assignment is wrong size")
            s = <const unsigned char *>src.buf
            if step != 1:
                for i in range(n):
                    self._addr[start + i * step] = <char>s[i]
            elif n < NOGIL_MAP_BYTES:
                # memmove: the source may be a view of this very mapping.
                memmove(self._addr + start, s, <size_t>n)
            else:
                self._exports += 1
                try:
                    with nogil:
                        memmove(self._addr + start, s, <size_t>n)
                finally:
                    self._exports -= 1
        finally:
            PyBuffer_Release(&src)

    def __delitem__(self, key):
        raise TypeError("mmap object doesn't support item deletion")

    # ---- search, sync, advice ------------------------------------------------------------
    def find(self, sub, start=None, end=None):
        """Lowest index of `sub` in [start, end) (negative values count from the end), or -1."""
        cdef Py_buffer needle
        cdef Py_ssize_t lo, hi, found = -1
        cdef const char *p
        cdef const char *last
        cdef const char *n0
        cdef Py_ssize_t nlen
        self._live()
        lo = 0 if start is None else start
        hi = self._size if end is None else end
        if lo < 0:
            lo = max(0, lo + self._size)
        if hi < 0:
            hi = max(0, hi + self._size)
        hi = min(hi, self._size)
        memset(&needle, 0, sizeof(needle))
        _ro(sub, &needle)
        self._exports += 1
        try:
            nlen = needle.len
            n0 = <const char *>needle.buf
            if lo <= hi and nlen <= hi - lo:
                with nogil:
                    p = self._addr + lo
                    last = self._addr + hi - nlen
                    if nlen == 0:
                        found = lo
                    while found < 0 and p <= last:
                        p = <const char *>memchr(p, n0[0], <size_t>(last - p + 1))
                        if p == NULL:
                            break
                        if memcmp(p, n0, <size_t>nlen) == 0:
                            found = p - self._addr
                        p += 1
        finally:
            self._exports -= 1
            PyBuffer_Release(&needle)
        return found

    def flush(self, offset=0, size=None):
        """msync(MS_SYNC) [offset, offset+size) (default: to the end), without the GIL."""
        cdef Py_ssize_t off, n, page
        cdef char *base
        cdef int rc
        self._live()
        off = offset
        n = self._size - off if size is None else size
        if off < 0 or n < 0 or off + n > self._size:
            raise ValueError("flush values out of range")
        if n == 0:
            return
        page = sysconf(_SC_PAGESIZE)
        # msync wants a page-aligned address; a mapping starts on a page.
        base = self._addr + (off - off % page)
        n += off % page
        self._exports += 1
        try:
            with nogil:
                rc = msync(base, <size_t>n, MS_SYNC)
        finally:
            self._exports -= 1
        if rc != 0:
            raise _os_error(errno, "msync")

    def madvise(self, int option, start=0, length=None, bint from_end=False):
        """madvise(2) on [start, start+length) (clamped to the mapping), without the GIL, so
        MADV_POPULATE_WRITE faults pages in while producers run; a populate goes 2 MiB per
        madvise call, so other threads' mmap and madvise calls (and the page faults queued
        behind them) wait for a chunk at most, not the whole range. `from_end` (populates
        only): the chunks from the last to the first (FileSystem.prefault says why)."""
        cdef Py_ssize_t lo, n, off = 0, step
        cdef int rc = 0
        self._live()
        lo = start
        if lo < 0 or lo >= self._size:
            raise ValueError("madvise start out of bounds")
        n = self._size - lo if length is None else length
        if n < 0:
            raise ValueError("madvise length invalid")
        n = min(n, self._size - lo)
        self._exports += 1
        try:
            with nogil:
                if option == RS_MADV_POPULATE_WRITE or option == RS_MADV_POPULATE_READ:
                    if from_end:
                        # The last chunk is the partial one: the others stay aligned to
                        # `lo`, as they are going forward.
                        off = n
                        while off > 0 and rc == 0:
                            step = (off - 1) % <Py_ssize_t>POPULATE_CHUNK + 1
                            off -= step
                            rc = madvise(self._addr + lo + off, <size_t>step, option)
                    else:
                        while off < n and rc == 0:
                            step = min(<Py_ssize_t>POPULATE_CHUNK, n - off)
                            rc = madvise(self._addr + lo + off, <size_t>step, option)
                            off += step
                else:
                    rc = madvise(self._addr + lo, <size_t>n, option)
        finally:
            self._exports -= 1
        if rc != 0:
            raise _os_error(errno, "madvise")
