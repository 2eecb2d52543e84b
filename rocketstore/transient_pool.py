# SPDX-License-Identifier: Apache-2.0
"""TransientStorePool: write buffers the size of a CommitLog file, locked in RAM where the OS
allows it, borrowed by each new CommitLog file and returned when it is committed (doc/03 §2.4).

Appends then land in process memory and reach the page cache only on commit, so page-cache
stalls do not reach producers; the price is that a process crash loses what was not yet
committed (at most commit_interval_commit_log ms of puts)."""
import collections
import ctypes
import ctypes.util
import logging
import mmap
import threading

log = logging.getLogger(__name__)


def _mlock(buf):
    """mlock a buffer; False where the OS refuses (RLIMIT_MEMLOCK, no permission)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        view = (ctypes.c_char * len(buf)).from_buffer(buf)
        try:
            ok = libc.mlock(ctypes.addressof(view), ctypes.c_size_t(len(buf))) == 0
        finally:
            del view
        return ok
    except (OSError, AttributeError, TypeError, ValueError):
        return False


class TransientStorePool:
    def __init__(self, pool_size, file_size):
        self.file_size = file_size
        self._free = collections.deque()
        self._lock = threading.Lock()
        self.locked = 0
        for _ in range(pool_size):
            buf = mmap.mmap(-1, file_size)
            if _mlock(buf):
                self.locked += 1
            self._free.append(buf)
        if self.locked < pool_size:
            log.info("transient store pool: %d of %d buffers could be mlock'ed", self.locked,
                     pool_size)

    def borrow(self):
        """A free buffer, or None (the file then writes straight into its mapping)."""
        with self._lock:
            return self._free.popleft() if self._free else None

    def give_back(self, buf):
        with self._lock:
            self._free.appendleft(buf)

    @property
    def available(self):
        return len(self._free)

    def destroy(self):
        with self._lock:
            while self._free:
                self._free.pop().close()
