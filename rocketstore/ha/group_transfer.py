# SPDX-License-Identifier: Apache-2.0
"""GroupTransferService (doc/05 §3.4): SYNC_MASTER producers wait until a slave has
acknowledged their record's end offset.

4.9.x queues a GroupCommitRequest per put and a service thread polls them (every 10 ms, and on
each transfer notification). Here the slave's acknowledgement itself releases the producers:
each waiting producer parks on a lock of its own, kept in a heap by the offset it needs, and
the connection reader that takes an acknowledgement pops and releases exactly the producers
whose offset it covers. No thread in between, no polling, and no producer is woken to find
that its offset is still ahead (a Condition's notify_all would wake every waiter on every
acknowledgement).
"""
import heapq
import itertools
import threading

__all__ = ["GroupTransferService"]


class GroupTransferService:
    """The max acknowledged offset over all slaves and the producers waiting on it."""

    def __init__(self):
        self._mutex = threading.Lock()
        # Raised by connection readers under _mutex; read without it (an int is read whole).
        self.push2slave_max_offset = 0
        self._waiters = []               # heap of (offset, seq, lock held until released)
        self._seq = itertools.count()    # ties: no two heap entries compare their locks
        self._stopped = False

    @property
    def waiting(self):
        """Producers parked right now (their acknowledgement has not come)."""
        return len(self._waiters)

    def notify_transfer_some(self, offset):
        """A slave acknowledged `offset`: raise the max and release the producers it covers."""
        if offset <= self.push2slave_max_offset:
            return
        with self._mutex:
            if offset <= self.push2slave_max_offset:
                return
            self.push2slave_max_offset = offset
            waiters = self._waiters
            while waiters and waiters[0][0] <= offset:
                heapq.heappop(waiters)[2].release()

    def wait_for(self, offset, timeout_ms):
        """True once some slave acknowledged `offset`; False after `timeout_ms` or at shutdown
        (FLUSH_SLAVE_TIMEOUT)."""
        if self.push2slave_max_offset >= offset:
            return True
        parked = threading.Lock()
        parked.acquire()
        with self._mutex:
            if self.push2slave_max_offset >= offset:
                return True
            if self._stopped:
                return False
            entry = (offset, next(self._seq), parked)
            heapq.heappush(self._waiters, entry)
        if parked.acquire(timeout=max(0.0, timeout_ms / 1000.0)):
            return self.push2slave_max_offset >= offset    # False: released by shutdown
        with self._mutex:
            # Timed out; an acknowledgement may have come meanwhile (it popped us then).
            try:
                self._waiters.remove(entry)
            except ValueError:
                pass
            else:
                heapq.heapify(self._waiters)
            return self.push2slave_max_offset >= offset

    def start(self):
        with self._mutex:
            self._stopped = False

    def shutdown(self):
        """Release every waiting producer (they answer FLUSH_SLAVE_TIMEOUT)."""
        with self._mutex:
            self._stopped = True
            waiters, self._waiters = self._waiters, []
        for _, _, parked in waiters:
            parked.release()
