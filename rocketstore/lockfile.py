# SPDX-License-Identifier: Apache-2.0
"""The `lock` file (one store, one process) and the `abort` marker (spec 03 §4)."""
import fcntl
import os
import threading

from .errors import StoreLockedError
from .fs import open_nofollow

# POSIX record locks belong to the process, so a second store in this process would get the
# lock again: keep our own registry of locked files, keyed by (device, inode).
_held = set()
_held_mutex = threading.Lock()


class StoreLock:
    """Exclusive lock on bytes [0,1) of root/lock, as FileChannel.tryLock(0, 1, false) takes it,
    so a Java broker and rocketstore also exclude each other."""

    def __init__(self, root):
        self.path = os.path.join(root, "lock")
        self._fd = None
        self._key = None

    def acquire(self):
        # The lock is taken before anything else is checked: a planted link must not get
        # the "lock" bytes written through it.
        fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with _held_mutex:
            if key in _held:
                os.close(fd)
                raise StoreLockedError(f"{self.path} is locked by another MessageStore in this "
                                       "process")
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except OSError:
                os.close(fd)
                raise StoreLockedError(f"{self.path} is locked by another process: "
                                       "the store is already open") from None
            _held.add(key)
        self._fd, self._key = fd, key
        # The broker writes the 4 bytes "lock" once it holds the lock, and leaves them.
        os.pwrite(fd, b"lock", 0)
        os.fsync(fd)

    def release(self):
        if self._fd is None:
            return
        with _held_mutex:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)
            finally:
                os.close(self._fd)
                _held.discard(self._key)
        self._fd = self._key = None

    @property
    def held(self):
        return self._fd is not None


def abort_path(root):
    return os.path.join(root, "abort")
