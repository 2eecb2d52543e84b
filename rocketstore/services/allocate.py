# SPDX-License-Identifier: Apache-2.0
"""AllocateMappedFileService: creates the next CommitLog file ahead of time, and reserves and
pre-faults a bounded window of it, so an append never waits for file creation; it also
pre-faults each window the writer reserves, so appends pay no first-touch page faults. RSS and
allocated disk follow the data, never a whole 1 GiB file ahead of it."""
import logging
import os
import threading

from ..format import OS_PAGE_SIZE
from ..mapped_file import MappedFile
from .base import ServiceThread

log = logging.getLogger(__name__)


class AllocateMappedFileService(ServiceThread):
    name = "AllocateMappedFileService"

    def __init__(self, file_size, kernels, fs, prefault=True, pool=None, reserve_window=0):
        super().__init__()
        self.pool = pool
        self.file_size = file_size
        self._k = kernels
        self._fs = fs
        self._prefault = prefault
        self._window = reserve_window
        self._populate = []        # (MappedFile, start, end) reserved by the writer, to fault in
        self._lock = threading.Condition()
        self._wanted = None        # path of the file to prepare next
        self._making = None        # path being prepared right now
        self._ready = {}           # path -> MappedFile prepared in the background

    def _make(self, path, prefault):
        # A sparse file; the writer reserves its blocks a window at a time (MappedFile.reserve).
        # Made ahead of time, the first window is reserved and faulted in here already.
        mf = MappedFile(path, self.file_size, self._k, self._fs, pool=self.pool,
                        reserve_window=self._window)
        if prefault:
            try:
                mf.reserve(1)
            except OSError:
                mf.destroy()
                raise
            self._fs.prefault(mf.mm, 0, mf.reserved_position)
        return mf

    def populate(self, mf, start, end):
        """Fault in [start, end) of `mf` on this thread (the writer just reserved it)."""
        if self._prefault:
            with self._lock:
                self._populate.append((mf, start, end))
            self.wakeup()

    def _populate_pending(self):
        with self._lock:
            todo, self._populate = self._populate, []
        for mf, start, end in todo:
            # No hold(): a borrower would make cleaning retry the file later. The mapping
            # cannot close during madvise: mmap.mmap runs it under the GIL, and a Mapping
            # makes close() raise BufferError meanwhile (the closer retries); a closed one
            # raises ValueError, which prefault ignores.
            if mf.is_available:
                start -= start % OS_PAGE_SIZE
                self._fs.prefault(mf.mm, start, end - start)

    def take(self, path, next_offset):
        """The file at `path` (prepared, or created now), and queue the one after it."""
        with self._lock:
            # Never create a file the background thread is still creating: two mappings of
            # one path would let shutdown delete the one in use.
            self._lock.wait_for(lambda: self._making != path)
            mf = self._ready.pop(path, None)
            if self._wanted == path:
                self._wanted = None
        if mf is None:
            # Created while a producer waits: faulting a whole file in now would cost more
            # than the first touches it saves.
            mf = self._make(path, prefault=False)
        nxt = os.path.join(os.path.dirname(path), "%020d" % next_offset)
        with self._lock:
            self._wanted = nxt
        self.wakeup()
        return mf

    def run_once(self):
        self.wait_for_running(1000)
        self._populate_pending()
        with self._lock:
            path = self._wanted
            self._wanted = None
            if path is None or path in self._ready or self._fs.exists(path):
                return
            self._making = path
        mf = None
        try:
            mf = self._make(path, self._prefault)
        except OSError as exc:
            # The writer creates the file itself when it needs it, and meets the error then.
            log.error("could not pre-allocate %s: %s", path, exc)
        finally:
            with self._lock:
                if mf is not None:
                    self._ready[path] = mf
                self._making = None
                self._lock.notify_all()

    def on_shutdown(self):
        # Files prepared but never used are removed: an empty file past the end would make a
        # later load see a longer queue than was written.
        with self._lock:
            ready, self._ready = self._ready, {}
            self._populate = []
        for mf in ready.values():
            mf.destroy()
