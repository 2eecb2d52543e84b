# SPDX-License-Identifier: Apache-2.0
"""RunningFlags: the store health bitmask (apache/rocketmq: store/.../RunningFlags.java).

The bit values are RocketMQ's, so `flag_bits` means the same number a broker's
`getRunningFlags().getFlagBits()` would report.
"""
import threading

NOT_READABLE_BIT = 1
NOT_WRITEABLE_BIT = 1 << 1
WRITE_LOGICS_QUEUE_ERROR_BIT = 1 << 2
WRITE_INDEX_FILE_ERROR_BIT = 1 << 3
DISK_FULL_BIT = 1 << 4
# Ours, no broker has it (5.x uses bits 5 and 6): a CommitLog or checkpoint sync failed, so
# the disk may have lost writes that a later sync would report as durable (flush.SyncLatch).
SYNC_FAILED_BIT = 1 << 16

# isWriteable(): any of these refuses a put.
NOT_WRITEABLE_MASK = (NOT_WRITEABLE_BIT | WRITE_LOGICS_QUEUE_ERROR_BIT | DISK_FULL_BIT
                      | WRITE_INDEX_FILE_ERROR_BIT | SYNC_FAILED_BIT)

_NAMES = ((NOT_READABLE_BIT, "not readable"), (NOT_WRITEABLE_BIT, "not writeable"),
          (WRITE_LOGICS_QUEUE_ERROR_BIT, "consume queue write error"),
          (WRITE_INDEX_FILE_ERROR_BIT, "index file write error"), (DISK_FULL_BIT, "disk full"),
          (SYNC_FAILED_BIT, "a sync failed: the disk may have lost writes, reopen the store"))


class RunningFlags:
    """Bits set by services (disk check, dispatch errors) and read on every put.

    `flag_bits` is a plain int read without the lock: a put that races a flag change sees
    either value, as the Java field (volatile int) allows. `disk_full_reason` is what a put
    refused for DISK_FULL says: whoever sets the bit (the disk check, a reservation that met
    ENOSPC) says why."""

    __slots__ = ("flag_bits", "disk_full_reason", "_lock")

    def __init__(self):
        self.flag_bits = 0
        self.disk_full_reason = "disk full"
        self._lock = threading.Lock()

    def _set(self, bit):
        with self._lock:
            old = self.flag_bits
            self.flag_bits = old | bit
            return not (old & bit)

    def _clear(self, bit):
        with self._lock:
            old = self.flag_bits
            self.flag_bits = old & ~bit
            return bool(old & bit)

    def is_readable(self):
        return not self.flag_bits & NOT_READABLE_BIT

    def is_writeable(self):
        return not self.flag_bits & NOT_WRITEABLE_MASK

    def is_cq_writeable(self):
        """isCQWriteable: the index error bit does not stop ConsumeQueue writes."""
        return not self.flag_bits & (NOT_WRITEABLE_BIT | WRITE_LOGICS_QUEUE_ERROR_BIT
                                     | DISK_FULL_BIT)

    def get_and_make_readable(self):
        """Clear NOT_READABLE; True if the store was readable before."""
        return not self._clear(NOT_READABLE_BIT)

    def get_and_make_not_readable(self):
        return self._set(NOT_READABLE_BIT)

    def get_and_make_writeable(self):
        """Clear NOT_WRITEABLE; True if the store was writeable before."""
        return not self._clear(NOT_WRITEABLE_BIT)

    def get_and_make_not_writeable(self):
        return self._set(NOT_WRITEABLE_BIT)

    def make_logics_queue_error(self):
        self._set(WRITE_LOGICS_QUEUE_ERROR_BIT)

    def is_logics_queue_error(self):
        return bool(self.flag_bits & WRITE_LOGICS_QUEUE_ERROR_BIT)

    def make_index_file_error(self):
        self._set(WRITE_INDEX_FILE_ERROR_BIT)

    def is_index_file_error(self):
        return bool(self.flag_bits & WRITE_INDEX_FILE_ERROR_BIT)

    def make_sync_failed(self):
        self._set(SYNC_FAILED_BIT)

    def is_sync_failed(self):
        return bool(self.flag_bits & SYNC_FAILED_BIT)

    def get_and_make_disk_full(self, reason=None):
        """Set DISK_FULL, saying why (`reason`, what refused puts answer); True if it was not
        set before (Java returns the old 'not full'). The reason is in place before the bit:
        a put that sees the bit reads it without the lock."""
        if reason is not None:
            self.disk_full_reason = reason
        return self._set(DISK_FULL_BIT)

    def get_and_make_disk_ok(self):
        """Clear DISK_FULL; True if the disk was OK before."""
        return not self._clear(DISK_FULL_BIT)

    @property
    def is_disk_full(self):
        return bool(self.flag_bits & DISK_FULL_BIT)

    def describe(self):
        """The set bits as words, for logs, refusal reasons and `rocketstore stat`."""
        bits = self.flag_bits
        return [name for bit, name in _NAMES if bits & bit] or ["ok"]

    def __repr__(self):
        return f"RunningFlags({self.flag_bits:#x}: {', '.join(self.describe())})"
