# SPDX-License-Identifier: Apache-2.0
"""PopulateAheadService: reserves and populates the next window of ConsumeQueue and index
files ahead of their writer, on its own thread.

Units and index entries are written by whichever thread dispatches: the reput thread, or the
putting thread itself when dispatch runs inline (dispatch_in_put_lag, 0 by default). Before
this service that thread populated each new window of a queue file itself (up to 1 MiB,
inside a put: 40-80 ms on a loaded machine, where the populate took its CPU share and the
page cache's dirty throttling) and took a first-touch fault per page of index entries.

A file served here has a `refill_lead` of half its window: its writer reaches
refill_position while that much reserved and populated space is still ahead of it, asks
(`refill`), and goes on writing at once; this thread reserves the next window (fallocate)
and populates it. The writer reserves itself only what it is about to write past
reserved_position (this thread lagged, or the file is new), so a full disk still refuses
that write with ENOSPC and nothing is ever written or populated outside reserved blocks.
Windows stay bounded: a file's window doubles from its configured size up to its
reserve_window_max (a few MiB), and this thread populates one window past the writer at most.

Separate from AllocateMappedFileService, which populates the CommitLog ahead in steps of up
to tens of MB: a queue's request must not wait behind one of those."""
import collections
import functools
import logging
import threading

from ..format import OS_PAGE_SIZE
from ..mapped_file import BlockHolder, populate_many, reserve_ahead_many
from .base import ServiceThread

log = logging.getLogger(__name__)


def _half_window_lead(mf):
    """The writer of `mf` asks for its next window half a window before the reserved end."""
    lead = mf.reserve_window // 2
    mf.refill_lead = lead - lead % OS_PAGE_SIZE


class PopulateAheadService(ServiceThread):
    name = "PopulateAheadService"
    works_ahead = True
    # Files made ahead at once, across every queue. Each is one more mapping, and a process
    # has vm.max_map_count of them (65 530 by default): 40 000 queues each with a next file
    # made ahead failed their mmaps with ENOMEM. A queue past the bound rolls as before.
    MAX_PREPARED = 1024
    # Requests served with one release of the GIL for their reservations and one for their
    # populates (mapped_file.reserve_ahead_many): 400 queues asking at once were served 5-20
    # a dispatch round when each file took four, each retake waiting up to a switch interval
    # behind a dispatcher in long compiled calls. Bounded so that a call borrows a few dozen
    # mappings at most (a file being destroyed waits for the populate call that borrows it).
    BATCH = 64
    # A file whose writer grew its window to the most (a queue or the index taking millions
    # of entries a second) has its blocks held this many windows past its reserved end, two
    # windows a step, once no window or file is asked for. Behind writeback a fallocate
    # waited 60-140 ms, the writer crossed its half-window lead (2 MiB of a queue: 17 ms at
    # 5.8 M units/s) meanwhile and reserved inside its put, where its fallocate waited for
    # this thread's (doc/performance.md, "A fault with the GIL held, and blocks ahead of fast
    # queues"). Within what is held, a window is published with no file-system call, this
    # thread's and the writer's alike.
    BLOCK_WINDOWS = 4

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        # (MappedFile, writer's end (None: give its readahead back), populate from or None,
        #  reserve, its MappedFileQueue or None)
        self._todo = []
        # Calls that make a file ahead of its writer, run once no window is asked for: a
        # queue's next file (_prepare_next), the next index file (make_ahead); each still
        # counted in `pending`. Taken from the front: with 40 000 queues filling their files
        # at once it is thousands long.
        self._next_files = collections.deque()
        # Fast files whose blocks to hold ahead (BLOCK_WINDOWS), by id, each counted in
        # `pending`.
        self._hold = {}
        self._holder = BlockHolder()
        # Bytes populated, and requests served on this thread / in the asking thread (the
        # service not running: before start, after shutdown). Read by stats and tests.
        self.populated_bytes = 0
        self.served = 0
        self.served_inline = 0
        self.pending = 0           # requests asked and not yet served (0: idle)
        self.prepared = 0          # files made ahead and not yet taken or deleted

    def ask_as_writer(self, mf, end):
        """Reserve and populate the window ahead of `end` in `mf` as its writer's first ask
        would: with a lead of half a window, where the writer asks for the next one."""
        _half_window_lead(mf)
        self.ask(mf, end)

    def refill(self, mf, end, mfq=None):
        """The writer of `mf` is about to write below `end`, past mf.refill_position. Reserve
        what it needs now if that is past reserved_position (OSError(ENOSPC) on a full
        disk: the write is refused), and have the next window reserved and populated. With
        `mfq` (the file's queue), the file after it is made here once `mf` is reserved to
        its end (MappedFileQueue.prepare_next)."""
        _half_window_lead(mf)
        if end > mf.reserved_position:
            # This thread lagged or the file is new: the writer reserves a window itself
            # (its refill_position half a window on, where it asks again), faults what it
            # writes next (a page at a time: these files have no readahead while written),
            # and the rest of that window is populated here meanwhile.
            mf.reserve(end)
            self.ask(mf, end, start=end, reserve=False, mfq=mfq)
            return
        # Asked once: the writer goes on below reserved_position without calling again,
        # until the window reserved here moves refill_position on.
        mf.refill_position = mf.reserved_position
        self.ask(mf, end, mfq=mfq)

    def ask(self, mf, end, start=None, reserve=True, mfq=None):
        """Reserve the window ahead of `end` in `mf` (unless `reserve` is false) and populate
        what is reserved from `start` (default: what this reserves) up to a window past
        `end`, on this thread; in the caller's when it is not running."""
        if not self._queue((mf, end, start, reserve, mfq)):
            self.served_inline += 1
            self._fill(mf, end, start, reserve, mfq)

    def make_ahead(self, make):
        """Have `make()` make a file ahead of its writer, on this thread, once no window is
        asked for (as a queue's next file is made). Nothing when this service is not
        running: the writer makes its file itself at its roll."""
        if not self._running():
            return
        with self._lock:
            self._next_files.append(make)
            self.pending += 1
        self.wakeup()

    def prepare_after(self, mfq, mf):
        """Have `mfq`'s files made ahead of its writer, who just rolled into `mf`, now
        rather than once `mf` is reserved to its end: the queue fills its files fast
        (MappedFileQueue.FAST_ROLL_S)."""
        self.make_ahead(functools.partial(self._prepare_next, mfq, mf))

    def give_readahead_back(self, mf):
        """`mf` is no longer written (its queue rolled to a file made here): readers get its
        readahead back, advised on this thread (a madvise waits for the mmap lock)."""
        if not self._queue((mf, None, None, False, None)):
            self._advise_normal(mf)

    def _queue(self, request):
        """Hand `request` to this thread; False when it is not running (the caller serves it)."""
        if not self._running():
            return False
        with self._lock:
            self._todo.append(request)
            self.pending += 1
        self.wakeup()
        return True

    def _running(self):
        return self.is_alive and not self.is_stopped

    def _advise_normal(self, mf):
        if mf.is_available:
            mf.advise_random(False)

    def run_once(self):
        self.wait_for_running(1000)
        while True:
            with self._lock:
                todo, self._todo = self._todo, []
            if todo:
                while todo:
                    batch, todo = self._next_batch(todo)
                    self._serve(batch)
                continue
            # Windows first, files after: a window is asked for half a window before its
            # writer needs it; a file is made ahead a whole window before the roll, and takes
            # a dozen system calls (1-3 ms here). When 400 queues filled their files at once,
            # making their next files between their windows left the windows late.
            # Then blocks ahead of fast writers, a step at a time, all of the above first.
            hold = make = None
            with self._lock:
                if self._next_files:
                    make = self._next_files.popleft()
                elif self._hold:
                    hold = self._hold.pop(next(iter(self._hold)))
                else:
                    return
            more = False
            try:
                if self.is_stopped:
                    pass                        # dropped, and counted off below
                elif make is not None:
                    make()
                else:
                    more = self._hold_step(hold)
            finally:
                with self._lock:
                    if more and id(hold) not in self._hold:
                        self._hold[id(hold)] = hold     # to the back: others step too
                    else:
                        self.pending -= 1

    def _hold_if_fast(self, mf):
        """Hold `mf`'s blocks ahead (BLOCK_WINDOWS) if its window grew to the most."""
        if (0 < mf.reserve_window_max <= mf.reserve_window and mf.reserved_position < mf.file_size
                and self._running()):
            with self._lock:
                if id(mf) not in self._hold:
                    self._hold[id(mf)] = mf
                    self.pending += 1

    def _hold_step(self, mf):
        """One step of `mf`'s blocks ahead; True while more remains."""
        return self._holder.step(mf, self.BLOCK_WINDOWS * mf.reserve_window,
                                 step=2 * mf.reserve_window)

    def _next_batch(self, todo):
        """Up to BATCH requests of `todo`, each file once (a second request for a file would
        plan the same window again), and the rest."""
        batch, rest, files = [], [], set()
        for request in todo:
            if len(batch) < self.BATCH and id(request[0]) not in files:
                files.add(id(request[0]))
                batch.append(request)
            else:
                rest.append(request)
        return batch, rest

    def _serve(self, batch):
        """Serve `batch`; a request whose file is now reserved to its end stays pending until
        the file after it is made (run_once)."""
        later = 0
        try:
            if self.is_stopped:
                return                  # dropped: the writers reserve for themselves
            fills = []
            for mf, end, start, reserve, mfq in batch:
                if end is None:
                    self._advise_normal(mf)
                else:
                    self.served += 1
                    fills.append((mf, end, start, reserve, mfq))
            later = len(self._fill_many(fills))
        finally:
            with self._lock:
                self.pending -= len(batch) - later

    def _fill(self, mf, end, start, reserve, mfq):
        # In the asking thread (the service not running): the next file is made at once.
        for mfq, mf in self._fill_many([(mf, end, start, reserve, mfq)], defer=False):
            self._prepare_next(mfq, mf)

    def _fill_many(self, fills, defer=True):
        """Reserve each file's window ahead of its writer and populate it: the batch's
        reservations in one call, then its populates in one (mapped_file.reserve_ahead_many).
        Returns the (mfq, mf) whose next file is to be made, which with `defer` are queued
        for run_once, each still counted pending."""
        starts = reserve_ahead_many([(mf, end, start, reserve)
                                     for mf, end, start, reserve, _ in fills])
        populates = []
        for (mf, end, _, _, _), pos in zip(fills, starts):
            if pos is None:
                continue
            # One window past the writer at most, even where the file system reserves
            # nothing (the whole file counts as reserved then).
            stop = min(mf.reserved_position, end + mf.reserve_window)
            if stop > pos:
                populates.append((mf, pos, stop))
                self.populated_bytes += stop - pos
        # A closed mapping is passed over; one being populated cannot close meanwhile
        # (close() raises BufferError while it is borrowed: MappedFile._unmap waits).
        populate_many(populates)
        for (mf, _, _, _, _), pos in zip(fills, starts):
            if pos is not None:
                self._hold_if_fast(mf)
        files = [(mfq, mf) for (mf, _, _, _, mfq), pos in zip(fills, starts)
                 if pos is not None and mfq is not None and mf.reserved_position >= mf.file_size]
        if defer and files:
            with self._lock:
                self._next_files.extend(functools.partial(self._prepare_next, mfq, mf)
                                        for mfq, mf in files)
        return files

    def _prepare_next(self, mfq, mf):
        """The files `mfq` keeps made ahead of its writer in `mf` (one, or two for a queue
        that fills its files fast), each with its first window reserved and populated."""
        while self.prepared < self.MAX_PREPARED:
            try:
                nxt = mfq.prepare_next(mf)
                if nxt is None:
                    return
                _half_window_lead(nxt)
                _, new = nxt.reserve(0, required=False)
            except OSError as exc:
                # The writer makes the file (or reserves in it) itself at the roll, and meets
                # the error then, with a write to refuse.
                log.info("%s: could not prepare a file after %s: %s", mfq.store_path,
                         mf.file_name, exc)
                return
            nxt.populate(0, new)
            self.populated_bytes += new
            self._hold_if_fast(nxt)
            if not nxt.is_available:
                return                  # dropped meanwhile (a truncation): none after it

    def prepared_made(self):
        """A queue made its next file ahead (MappedFileQueue.prepare_next)."""
        with self._lock:
            self.prepared += 1

    def prepared_gone(self):
        """A file made ahead was taken by its queue's roll, or deleted unused."""
        with self._lock:
            self.prepared -= 1

    def on_shutdown(self):
        with self._lock:
            self.pending -= len(self._todo) + len(self._next_files) + len(self._hold)
            self._todo = []
            self._next_files.clear()
            self._hold.clear()
