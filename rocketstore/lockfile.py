# SPDX-License-Identifier: Apache-2.0
"""The `lock` file (one store, one process) and the `abort` marker (doc/03 §4)."""
import os


class StoreLock:
    """The store's `lock` file, held from load to shutdown (one store, one process). The
    locking itself is FileSystem.lock's, so a fault-injecting double sees it too."""

    def __init__(self, root, fs):
        self.path = os.path.join(root, "lock")
        self._fs = fs
        self._handle = None

    def acquire(self):
        self._handle = self._fs.lock(self.path)

    def release(self):
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self._fs.unlock(handle)

    @property
    def held(self):
        return self._handle is not None


def abort_path(root):
    return os.path.join(root, "abort")
