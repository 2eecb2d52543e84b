# SPDX-License-Identifier: Apache-2.0
"""AllocateMappedFileService: creates and pre-faults the next CommitLog file ahead of time, so
an append never waits for file creation or pays first-touch page faults."""
import logging
import os
import threading

from ..mapped_file import MappedFile
from .base import ServiceThread

log = logging.getLogger(__name__)


class AllocateMappedFileService(ServiceThread):
    name = "AllocateMappedFileService"

    def __init__(self, file_size, kernels, fs, prefault=True, pool=None):
        super().__init__()
        self.pool = pool
        self.file_size = file_size
        self._k = kernels
        self._fs = fs
        self._prefault = prefault
        self._lock = threading.Condition()
        self._wanted = None        # path of the file to prepare next
        self._making = None        # path being prepared right now
        self._ready = {}           # path -> MappedFile prepared in the background

    def _make(self, path, prefault):
        # CommitLog files get their blocks up front: a full disk then fails the file's
        # creation (CREATE_MAPEDFILE_FAILED) instead of a later write through the mapping,
        # which would kill the process with SIGBUS.
        mf = MappedFile(path, self.file_size, self._k, self._fs, pool=self.pool,
                        preallocate=True)
        if prefault:
            self._fs.prefault(mf.mm)
        return mf

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
        with self._lock:
            path = self._wanted
            self._wanted = None
            if path is None or path in self._ready or self._fs.exists(path):
                return
            self._making = path
        mf = None
        try:
            mf = self._make(path, self._prefault)
        except OSError:
            log.exception("could not pre-allocate %s", path)
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
        for mf in ready.values():
            mf.destroy()
