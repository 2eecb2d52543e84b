# SPDX-License-Identifier: Apache-2.0
"""GroupTransferService (spec 05 §3.4): SYNC_MASTER producers wait until a slave has
acknowledged their record's end offset.

4.9.x queues a GroupCommitRequest per put and a service thread completes them; here each
producer waits on one Condition over the highest offset any slave acknowledged
(push2SlaveMaxOffset), which gives the same answers without a thread or a future per put.
"""
import threading
import time

__all__ = ["GroupTransferService"]


class GroupTransferService:
    """The max acknowledged offset over all slaves and the producers waiting on it."""

    def __init__(self):
        self._cond = threading.Condition()
        self.push2slave_max_offset = 0     # raised by connection readers under _cond
        self._stopped = False

    def notify_transfer_some(self, offset):
        """A slave acknowledged `offset`: raise the max and wake the producers it releases."""
        if offset <= self.push2slave_max_offset:
            return
        with self._cond:
            if offset > self.push2slave_max_offset:
                self.push2slave_max_offset = offset
                self._cond.notify_all()

    def wait_for(self, offset, timeout_ms):
        """True once some slave acknowledged `offset`; False after `timeout_ms` or at shutdown
        (FLUSH_SLAVE_TIMEOUT)."""
        if self.push2slave_max_offset >= offset:
            return True
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._cond:
            while self.push2slave_max_offset < offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped:
                    return False
                self._cond.wait(remaining)
        return True

    def start(self):
        with self._cond:
            self._stopped = False

    def shutdown(self):
        """Release every waiting producer (they answer FLUSH_SLAVE_TIMEOUT)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
