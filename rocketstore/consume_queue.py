# SPDX-License-Identifier: Apache-2.0
"""ConsumeQueue: one per (topic, queue_id), fixed 20-byte units (doc/02 §1)."""
import logging
import os
import threading

import numpy as np

from . import leaves
from .format import CQ_DTYPE, CQ_UNIT, CQ_STORE_UNIT_SIZE as UNIT
from .mapped_file import CqMappedFile, cell_property
from .mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

_UNIT = CQ_UNIT.struct
_FILLER_SIZE = 0x7FFFFFFF
_FILLER = _UNIT.pack(0, _FILLER_SIZE, 0)


# A queue's window grows from consume_queue_reserve_window up to this as it is written:
# 40 000 quiet queues hold a small window each, a busy one few fallocate calls.
RESERVE_WINDOW_MAX = 1 << 20
# The same for a queue a PopulateAheadService serves: the writer asks at half a window
# before the reserved end, so a busy queue keeps up to 2 MiB (100 000 units) populated ahead
# while the service waits for a CPU on a loaded machine.
POPULATED_WINDOW_MAX = 4 << 20


def _reserve(f, end, populator, mfq):
    """The writer is about to write units below `end`, past the file's refill_position.
    With a populator (PopulateAheadService) the next window is reserved and populated on
    its thread, ahead of the writer, which reserves only what it writes past the reserved
    end itself. Without one the window is reserved and faulted in here, at once: the
    dispatcher writing units holds the GIL, a page fault on each first touch there would
    hold it too, and populating runs without it (cext Mapping)."""
    if populator is not None:
        populator.refill(f, end, mfq)
        return
    old, new = f.reserve(end)
    f.populate(old, new)


class DirtyQueues:
    """The ConsumeQueues written since the flusher last took them, so a flush round costs the
    queues that changed, not every queue of the store.

    A writer marks a queue after its positions moved, and need not mark it again while
    `epoch` (bumped by every take) is the one it marked it in: a take after the write flushes
    the write, and the next write after a take sees the new epoch and marks again.

    A writer that knows its write stayed within the pages the file had written to (its
    written end crossed no page boundary and did not fill the file) may mark the queue as
    `grew=False`, and record `~epoch` as the epoch it marked it in. Such a write leaves the
    file's count of dirty pages where it was, so a periodic round (least pages > 0) would
    find the queue as due as its last test found it: the round files it with the queues it
    tested and found below the least without testing it, and a thorough round flushes it.
    With 40 000 queues written each second, testing each took the flusher ~50 ms of GIL a
    round (doc/performance.md, "A flush round that tested every queue"). A write that grows
    a queue marked `grew=False` in the same epoch marks it again, as grown."""

    __slots__ = ("_lock", "_queues", "_same_pages", "epoch")

    def __init__(self):
        self._lock = threading.Lock()
        self._queues = set()
        self._same_pages = set()
        self.epoch = 0

    def mark(self, cq):
        with self._lock:
            self._queues.add(cq)

    def mark_all(self, cqs, grew=True):
        with self._lock:
            (self._queues if grew else self._same_pages).update(cqs)

    def take(self):
        """(grown, same_pages): the queues marked since the last take, those marked grown
        and those marked only as written within their pages; both sets start empty again."""
        with self._lock:
            queues, self._queues = self._queues, set()
            same, self._same_pages = self._same_pages, set()
            self.epoch += 1
        same.difference_update(queues)      # the cost of the (few) grown, not of the rest
        return queues, same

    def __len__(self):
        return len(self._queues | self._same_pages)

    def __contains__(self, cq):
        return cq in self._queues or cq in self._same_pages


class ConsumeQueue:
    """Units are written by the reput thread only; readers take `self.mfq.files` once."""

    __slots__ = ("topic", "queue_id", "mfq", "file_size", "_cell",
                 "min_logic_offset", "_k", "_commit_log_min", "dirty", "_marked", "_version",
                 "populator")
    # The compiled dispatcher (pyx/_cq_dispatch.pxi) marks the queues it wrote as put_unit's
    # _mark does, reading and setting the epoch a queue was last marked in. It keeps each
    # queue's append state (last file, positions) from call to call while `_version` is the
    # object it read it with: every method here that changes the queue's files or positions
    # from Python bumps it first (_changed), so the loop reads them again.
    # `_cell` holds max_physic_offset as a one-element int64 array, which the dispatcher
    # publishes into with a plain C store, as CqMappedFile's positions (see there).
    LENT_SLOTS = ("_marked", "_version", "_cell")

    def __init__(self, root, topic, queue_id, file_size, kernels, fs, writable=True,
                 reserve_window=0, populator=None):
        self.topic = topic
        self.queue_id = queue_id
        # getMappedFileSizeConsumeQueue rounds the configured size up to whole units.
        self.file_size = -(-file_size // UNIT) * UNIT
        path = os.path.join(root, "consumequeue", topic, str(queue_id))
        self.mfq = MappedFileQueue(path, self.file_size, kernels, fs, writable,
                                   reserve_window=reserve_window,
                                   reserve_window_max=(RESERVE_WINDOW_MAX if populator is None
                                                       else POPULATED_WINDOW_MAX),
                                   no_readahead_while_written=True,
                                   populator=populator, file_type=CqMappedFile)
        # A PopulateAheadService populating this queue's windows off the writer's thread.
        self.populator = populator
        self._cell = leaves.cells((-1,))
        self.max_physic_offset = -1     # end (offset + size) of the last unit's record
        self.min_logic_offset = 0       # byte offset of the first valid unit
        self._k = kernels
        # The store's DirtyQueues, marked after a write (None: nothing tracks this queue), and
        # the epoch it was last marked in.
        self.dirty = None
        self._marked = None       # the epoch of its last mark: see DirtyQueues
        self._version = 0

    max_physic_offset = cell_property(0, "End (offset + size) of the last unit's record; -1 "
                                         "with no unit.")

    def _changed(self):
        """Python is about to change the queue's files or positions: a compiled dispatcher's
        kept state of them is stale (see LENT_SLOTS)."""
        self._version += 1

    # ---- load and recovery (doc/02 §1.5-1.6) --------------------------------------------
    def load(self):
        self._changed()
        return self.mfq.load()

    def recover(self):
        """ConsumeQueue#recover: from the last three files, stop at the first invalid unit."""
        self._changed()
        files = self.mfq.files
        if not files:
            return
        index = max(0, len(files) - 3)
        # 4.9.8 starts at the third-last file. If that one begins with no valid unit (files
        # made but never written back before a power cut read as zeros), step back to the
        # last file that does: otherwise max_physic_offset stays unknown, and the units
        # before those files that point past the recovered CommitLog are never cut.
        while index > 0 and not self._starts_valid(files[index]):
            index -= 1
        f = files[index]
        process = f.file_from_offset
        while True:
            # Units past the written extent are zeros (invalid), and reading them would
            # allocate them on tmpfs, so only the written extent is looked at.
            units = np.frombuffer(f.mm, dtype=CQ_DTYPE, count=f.data_end() // UNIT)
            valid = (units["offset"] >= 0) & (units["size"] > 0)
            n = int(np.argmin(valid)) if not valid.all() else len(units)
            if n:
                last = units[n - 1]
                self.max_physic_offset = int(last["offset"]) + int(last["size"])
            del units, valid
            process = f.file_from_offset + n * UNIT
            if n == self.file_size // UNIT and index + 1 < len(files):
                index += 1
                f = files[index]
                continue
            break
        self.mfq.flushed_where = self.mfq.committed_where = process
        self.mfq.truncate_dirty_files(process)

    @staticmethod
    def _starts_valid(f):
        """Whether the file's first unit is valid (offset >= 0, size > 0)."""
        if f.data_end() < UNIT:
            return False
        first = np.frombuffer(f.mm, dtype=CQ_DTYPE, count=1)
        ok = int(first["offset"][0]) >= 0 and int(first["size"][0]) > 0
        del first
        return ok

    def truncate_dirty_logic_files(self, phy_offset):
        """Drop units pointing at or past `phy_offset` (ConsumeQueue#truncateDirtyLogicFiles),
        and, unlike 4.9.8, units whose record would end past it: the CommitLog keeps whole
        records only, so such a unit is damaged (a flipped size bit). 4.9.8 keeps it, and its
        end becomes the queue's max physical offset, from which reput starts: past the log's
        end, so no record put after the open was ever dispatched. OSError when the zeroed
        tail could not be synced, once the cut is done."""
        self._changed()
        self.max_physic_offset = phy_offset
        while True:
            f = self.mfq.last_file
            if f is None:
                break
            end = min(f.wrote_position, f.data_end())      # zeros past data_end
            units = np.frombuffer(f.mm, dtype=CQ_DTYPE, count=end // UNIT)
            offs = units["offset"]
            sizes = units["size"]
            # The filler units a late-starting queue begins with (fillPreBlank) point at no
            # record; offs + sizes could overflow on a damaged offset: compared by difference.
            filler = (offs == 0) & (sizes == _FILLER_SIZE)
            ok = filler | ((offs >= 0) & (sizes > 0) & (offs < phy_offset)
                           & (sizes <= phy_offset - offs))
            if len(units) == 0 or not ok[0]:
                del units, offs, sizes, filler, ok
                if f.wrote_position == 0 and len(self.mfq.files) == 1:
                    break
                self.mfq.delete_last_file()
                continue
            n = int(np.argmin(ok)) if not ok.all() else len(ok)
            records = np.flatnonzero(~filler[:n])
            if len(records):        # else (fillers only) phy_offset, set above
                last = int(records[-1])
                self.max_physic_offset = int(offs[last]) + int(sizes[last])
            del units, offs, sizes, filler, ok
            f.set_positions(n * UNIT)
            if self.mfq.writable:
                try:
                    f.zero_tail(n * UNIT)
                finally:
                    self._after_truncate()
                return
            break
        self._after_truncate()

    def _after_truncate(self):
        # A flushed offset past the new end would name a file that is gone: the flush of the
        # units written next would find nothing, and they would never be flushed.
        mfq = self.mfq
        end = mfq.get_max_offset()
        mfq.flushed_where = min(mfq.flushed_where, end)
        mfq.committed_where = min(mfq.committed_where, end)
        self._mark()

    def _mark(self):
        dirty = self.dirty
        if dirty is not None:
            epoch = dirty.epoch             # read after the write: see DirtyQueues
            if epoch != self._marked:
                dirty.mark(self)
                self._marked = epoch

    def correct_min_offset(self, min_commit_log_offset):
        """correctMinOffset (doc/02 §1.7): the first unit whose record is still in the
        CommitLog sets min_logic_offset; when none is, the queue is logically empty and its
        minimum is its end, as in 5.x. 4.9.8 searched only the first file and kept its minimum
        when nothing there was still in the CommitLog: once cleaning had deleted the files
        below, that minimum pointed below every file left, and the queue counted messages that
        were gone. Here the search goes on past a first file whose every unit is below (one a
        reader held when cleaning tried to delete it, which a later round deletes). Each file
        is held while it is read: the clean thread calls this, and a deletion of the topic (or
        cleaning) may close a file meanwhile, which then holds nothing and is passed over."""
        end_of_queue = None
        for f in list(self.mfq.files):
            if not f.hold():
                continue
            try:
                end = f.read_position
                i = self._k.cq_search(f.mm, 0, end, min_commit_log_offset)
            finally:
                f.release()
            if i * UNIT < end:
                self.min_logic_offset = f.file_from_offset + i * UNIT
                return
            end_of_queue = f.file_from_offset + end
        if end_of_queue is not None:
            self.min_logic_offset = max(self.min_logic_offset, end_of_queue)

    def delete_expired_file(self, min_commit_log_offset, now_ms):
        """ConsumeQueue#deleteExpiredFile (doc/02 §1.8): destroy whole files whose units all
        point below the CommitLog minimum (never the last file), then correct the minimum
        logical offset. Returns the number of files deleted. Called by the clean thread."""
        self._changed()         # never the last file today; a stale kept state costs one reload
        count = self.mfq.delete_expired_file_by_offset(min_commit_log_offset, UNIT, now_ms)
        self.correct_min_offset(min_commit_log_offset)
        return count

    # ---- offsets ---------------------------------------------------------------------------
    @property
    def min_offset_in_queue(self):
        return self.min_logic_offset // UNIT

    @property
    def max_offset_in_queue(self):
        return self.mfq.get_max_offset() // UNIT

    @property
    def message_total_in_queue(self):
        return self.max_offset_in_queue - self.min_offset_in_queue

    def last_offset(self):
        """commitLogOffset + size of the last unit, or -1."""
        f = self.mfq.last_file
        if f is None or f.wrote_position < UNIT:
            return -1
        off, size, _ = _UNIT.unpack_from(f.mm, f.wrote_position - UNIT)
        return off + size

    # ---- writes (reput thread only) ---------------------------------------------------------
    def put_units(self, offsets, sizes, tags_codes, first_queue_offset):
        """Append units for consecutive queue offsets starting at `first_queue_offset`
        (putMessagePositionInfo, batched). Units already present are skipped (redispatch)."""
        self._changed()
        n = len(offsets)
        # Dedup: records this queue already has (offset + size <= max_physic_offset); the
        # ends ascend, since a queue's records are in commit-log order.
        ends = np.asarray(offsets, dtype=np.int64) + np.asarray(sizes, dtype=np.int64)
        start = int(np.searchsorted(ends, self.max_physic_offset, side="right"))
        while start < n:
            qoff = first_queue_offset + start
            expect = qoff * UNIT
            f = self.mfq.get_last_mapped_file(expect)
            if f.first_create_in_queue and qoff != 0 and f.wrote_position == 0 \
                    and f.file_from_offset + f.wrote_position != expect:
                self._fill_pre_blank(f, expect)
            current = f.file_from_offset + f.wrote_position
            if qoff != 0 and expect < current:
                # Already present: skip the overlap.
                skip = min(n - start, (current - expect) // UNIT)
                start += skip
                continue
            if qoff != 0 and expect != current:
                log.warning("[BUG] logic queue order maybe wrong: %s-%d expected %d got %d",
                            self.topic, self.queue_id, expect, current)
            room = (f.file_size - f.wrote_position) // UNIT
            k = min(room, n - start)
            pos = f.wrote_position
            if pos + k * UNIT > f.refill_position:
                _reserve(f, pos + k * UNIT, self.populator, self.mfq)
            self._k.cq_encode_batch(f.mm, pos, offsets[start:start + k], sizes[start:start + k],
                                    tags_codes[start:start + k])
            f.wrote_position = f.committed_position = pos + k * UNIT
            self.max_physic_offset = int(offsets[start + k - 1]) + int(sizes[start + k - 1])
            start += k
            self._mark()

    def put_unit(self, offset, size, tags_code, queue_offset):
        """One unit (the common reput case): same rules as put_units."""
        self._changed()
        if offset + size <= self.max_physic_offset:
            return
        expect = queue_offset * UNIT
        f = self.mfq.get_last_mapped_file(expect)
        if f.first_create_in_queue and queue_offset != 0 and f.wrote_position == 0 \
                and f.file_from_offset != expect:
            self._fill_pre_blank(f, expect)
        pos = f.wrote_position
        current = f.file_from_offset + pos
        if queue_offset != 0:
            if expect < current:
                return
            if expect != current:
                log.warning("[BUG] logic queue order maybe wrong: %s-%d expected %d got %d",
                            self.topic, self.queue_id, expect, current)
        if pos + UNIT > f.refill_position:
            _reserve(f, pos + UNIT, self.populator, self.mfq)
        self._k.cq_encode(f.mm, pos, offset, size, tags_code)
        f.wrote_position = f.committed_position = pos + UNIT
        self.max_physic_offset = offset + size
        dirty = self.dirty
        if dirty is not None and dirty.epoch != self._marked:
            self._mark()

    def refill_written(self):
        """The compiled dispatcher (cq_dispatch) wrote units past the last file's
        refill_position, below its reserved end, and asks for the next window now, as
        put_unit asks before its first unit there."""
        f = self.mfq.last_file
        if f is not None and f.wrote_position > f.refill_position:
            _reserve(f, f.wrote_position, self.populator, self.mfq)

    def _fill_pre_blank(self, f, expect):
        """A queue whose first unit is not 0 starts with filler units (fillPreBlank)."""
        self.min_logic_offset = expect
        self.mfq.flushed_where = self.mfq.committed_where = expect
        until = expect % f.file_size
        if until:
            f.reserve(until)
            f.mm[0:until] = _FILLER * (until // UNIT)
        f.wrote_position = f.committed_position = until
        f.flushed_position = 0

    # ---- reads ------------------------------------------------------------------------------
    def units(self, start, count):
        """Units [start, start+count) as a read-only numpy structured array (CQ_DTYPE). Within
        one file it is a zero-copy view; across files, a copy. Stops at the written end."""
        parts = []
        pos = start * UNIT
        end = min(start + count, self.max_offset_in_queue) * UNIT
        while pos < end:
            f = self.mfq.find_by_offset(pos)
            # Held while viewed: cleaning (or a cut) may destroy a file found here meanwhile,
            # and its units are then gone.
            if f is None or not f.hold():
                break
            try:
                rel = pos - f.file_from_offset
                stop = min(end - f.file_from_offset, f.read_position)
                if stop <= rel:
                    break
                arr = np.frombuffer(f.mm, dtype=CQ_DTYPE, count=(stop - rel) // UNIT,
                                    offset=rel)
            finally:
                f.release()
            arr.flags.writeable = False
            parts.append(arr)
            pos = f.file_from_offset + stop
        if not parts:
            return np.empty(0, dtype=CQ_DTYPE)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def roll_next_file(self, index):
        per_file = self.file_size // UNIT
        return index + per_file - index % per_file

    def flush(self, least_pages=0):
        return self.mfq.flush(least_pages)

    def destroy(self):
        self._changed()
        self.mfq.destroy()
        self.max_physic_offset = -1
        self.min_logic_offset = 0

    def close(self):
        self._changed()
        self.mfq.close()
