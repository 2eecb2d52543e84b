# SPDX-License-Identifier: Apache-2.0
"""AllocateMappedFileService: creates the next CommitLog file ahead of time, and keeps a bounded
window of reserved (fallocate) and populated (MADV_POPULATE_WRITE) pages ahead of the writer of
the file being written, so a put neither waits for file creation nor takes first-touch faults.
RSS and allocated disk follow the data, never a whole 1 GiB file ahead of it.

The writer asks for the next window at its file's refill_position, a lead before the
reserved end; this thread reserves and populates it, off the writer and (with the compiled
Mapping, whose madvise releases it) off the GIL. The writer reserves itself only when it
reaches reserved_position first (this thread lagged or met a full disk), so a full disk still
refuses that put with ENOSPC.

The lead adapts to the writer: it covers what the writer writes in the time this thread takes
to serve a request (twice over), at least half the configured window and at most LEAD_WINDOWS
windows (64 MiB by default). Once the lead outgrows half a window, each refill populates one
step of a quarter window (not half), so the populated end moves on in small steps well ahead
of the writer. A populate is CPU work (zeroing pages) and, past the page cache's dirty
budget, throttled: on a loaded machine a request waits long for this thread, and a writer
that overtook the populated end would take the first-touch faults itself, each zero-filling
a readahead window of the file in the writer's thread."""
import logging
import os
import threading
import time

from ..format import OS_PAGE_SIZE
from ..mapped_file import BlockHolder, MappedFile
from .base import ServiceThread

log = logging.getLogger(__name__)

# The lead is bounded to this many configured windows ("tens of MB", not the next file).
LEAD_WINDOWS = 4
# Past the window, the reserving thread holds blocks alone (MappedFile.reserve_blocks_ahead)
# for what the writer writes in BLOCKS_LEAD_S at its measured rate, at most BLOCK_WINDOWS
# configured windows: a fallocate behind writeback took up to 150 ms here, and this thread
# waits for the GIL and a CPU besides. A quiet writer holds nothing past its window.
BLOCKS_LEAD_S = 0.25
BLOCK_WINDOWS = 8
# The writer's rate and the time to serve a request are smoothed with these weights for a new sample
# lower than the estimate; a higher sample is taken at once (a burst must not overtake).
DECAY = 0.75


class ReserveAheadService(ServiceThread):
    """Reserves (fallocate) each window a writer asks for as soon as it asks, on its own
    thread, for the allocator (which still populates, and reserves what this thread has not
    yet). Past the page cache's dirty budget one populate can take a second or more, during
    which the allocator serves nothing: a writer at disk speed then reached reserved_position
    first and reserved inside its put, where a fallocate that had to read a block bitmap
    behind gigabytes of writeback took 50-130 ms (doc/performance.md, "Sustained writes").
    A reservation is a short call, so this thread keeps the reserved end ahead of the writer
    while the populates lag; a disk that refuses one costs a log line here, and the writer
    meets the error when it gets there, with a put to refuse.

    Between requests it also holds blocks past the writer's window (`blocks_ahead`), so that
    one slow fallocate delays this thread and not the writer's next window."""
    name = "ReserveAheadService"
    works_ahead = True

    def __init__(self, after=None, blocks_ahead=None):
        """`after()`: called after each round of requests (the allocator's first windows of
        the files it prepared ahead). `blocks_ahead()`: (file, bytes) whose blocks to hold
        past its reserved window once no request waits, or None."""
        super().__init__()
        self._lock = threading.Lock()
        self._todo = []            # (MappedFile, writer's end)
        self._after = after
        self._blocks_ahead = blocks_ahead
        self._holder = BlockHolder()

    def ask(self, mf, end):
        with self._lock:
            self._todo.append((mf, end))
        self.wakeup()

    def run_once(self):
        self.wait_for_running(1000)
        while not self.is_stopped:
            with self._lock:
                todo, self._todo = self._todo, []
            for mf, end in todo:
                if self.is_stopped:
                    return
                mf.reserve_ahead(end)
            if todo and self._after is not None:
                self._after()
            with self._lock:
                if self._todo:
                    continue
            # Then blocks past the window, a step at a time, requests first between steps.
            if not self._step_blocks_ahead():
                return

    def _step_blocks_ahead(self):
        """One step of blocks past the writer's window; True while more remains."""
        ahead = self._blocks_ahead() if self._blocks_ahead is not None else None
        if ahead is None:
            return False
        mf, lead = ahead
        return self._holder.step(mf, lead)

    def on_shutdown(self):
        with self._lock:
            self._todo = []


class AllocateMappedFileService(ServiceThread):
    name = "AllocateMappedFileService"
    works_ahead = True
    # Large folios only where the reserve window holds at least this many of them.
    FOLIO_WINDOWS = 4

    def __init__(self, file_size, kernels, fs, prefault=True, pool=None, reserve_window=0,
                 fill_cache=False, large_folios=False):
        """`fill_cache`: fill the page cache for each reserved range before populating the
        writer's mapping (FileSystem.cache_range); `large_folios`: populate in large
        page-cache folios where the kernel has them (_advise_for_writer). Both for stores
        whose syncs cover many pages at once (ASYNC_FLUSH): a folio is written back whole,
        so a sync of a few KiB in the writer's folio would write all of it. The fill never
        goes through a mapping with readahead: its read-around reads past the reserved
        end, and where that makes a large folio (XFS) straddling
        reserved_position, the writer's first write to the folio allocates all of it: past
        the reservation, and on a full disk SIGBUS instead of ENOSPC at reserve."""
        super().__init__()
        self._fill_cache = fill_cache
        self._large_folios = large_folios
        self.pool = pool
        self.file_size = file_size
        self._k = kernels
        self._fs = fs
        self._prefault = prefault
        self._window = reserve_window
        self._refill = []          # (MappedFile, writer's end, populate from, asked at ns)
        self._lock = threading.Condition()
        self._wanted = None        # path of the file to prepare next
        self._making = None        # path being created right now
        self._taking = set()       # paths take() is creating itself, on a writer's thread
        self._ready = {}           # path -> MappedFile prepared in the background
        self._primed = set()       # paths of those whose first window _fill_ready populated
        self._writing = None       # the file whose writer this thread refilled last
        self._adopted = None       # the file adopt() took last (without readahead)
        self._readahead_back = []  # files adopt() left, to get readahead back here
        # The writer's pace, measured between its refill requests: (file, end, ns) of the
        # last request, and bytes/s. The time from a request to its window populated, in
        # seconds: queueing, this thread's wait for a CPU on a loaded machine, and the
        # populate itself. Read and written by the writer (refill) and this thread (_fill);
        # a lost update only delays the adaptation by one request.
        self._last_request = None
        self._rate = 0.0
        self._latency_s = 0.0
        self._reserver = (ReserveAheadService(self._reserve_ready, self._blocks_ahead)
                          if prefault else None)

    def start(self):
        if self._reserver is not None:
            self._reserver.start()
        super().start()

    def shutdown(self):
        ended = super().shutdown()
        if self._reserver is not None:
            ended = self._reserver.shutdown() and ended
        return ended

    def _make(self, path):
        # A sparse file; its blocks are reserved a window at a time (MappedFile.reserve).
        mf = MappedFile(path, self.file_size, self._k, self._fs, pool=self.pool,
                        reserve_window=self._window)
        if self._prefault:
            # Made to be written (see adopt): advised here, usually on this thread, since a
            # madvise waits for the mmap lock, which a populate elsewhere may hold long.
            self._advise_for_writer(mf)
        return mf

    def _advise_for_writer(self, mf):
        """A file this thread populates ahead of its writer: no readahead (see adopt), and
        with `large_folios`, large page-cache folios (use_large_folios) where the window is
        at least FOLIO_WINDOWS folios: its windows then end on whole folios, a quarter of a
        window at most below where they would end on pages (MappedFile._window_end)."""
        mf.advise_random(True)
        size = self._fs.large_folio_size() if self._large_folios else 0
        if size and self._window >= self.FOLIO_WINDOWS * size:
            mf.use_large_folios(size)

    def adopt(self, mf, end=None, advised=False):
        """Keep a window reserved and populated ahead of the writer of `mf` from now on, the
        first from `end` (default: its write position) on; a no-op without prefault.
        `advised`: `mf` was made by _make, which advised it already."""
        if self._prefault:
            # The writer's file has no readahead: a page the writer reaches before this
            # thread populated it (this thread being late, on a loaded machine) then costs
            # the writer one page, not a readahead window (8 MiB where read_ahead_kb is
            # 8192) zero-filled by one fault inside a put. The file it leaves gets its
            # readahead back for readers.
            with self._lock:
                left, self._adopted = self._adopted, mf
                if left is not None and left is not mf:
                    # On this thread, not the writer's (a madvise waits for the mmap lock).
                    self._readahead_back.append(left)
            if left is not None and left is not mf:
                self.wakeup()
            if not advised:
                self._advise_for_writer(mf)
            self._size_window(mf)
            # From the writer on: a window the reserving thread or _fill_ready took already
            # may not be populated yet (populating pages already in costs a page-table walk).
            pos = mf.wrote_position if end is None else end
            self.populate(mf, pos, pos)

    @property
    def lead(self):
        """Bytes populated ahead of the writer when it asks for more: what it writes at its
        measured rate in twice the time a request takes to be served, within [window/2,
        LEAD_WINDOWS x window - step], page-aligned."""
        w = self._window
        step = max(OS_PAGE_SIZE, w // 4)
        want = self._rate * 2 * self._latency_s
        lead = int(min(max(want, w // 2), LEAD_WINDOWS * w - step))
        return lead - lead % OS_PAGE_SIZE

    def _blocks_ahead(self):
        """For the reserving thread: the writer's file and the blocks to hold past its
        window (BLOCKS_LEAD_S at the writer's rate, at most BLOCK_WINDOWS windows), or None
        while that is less than a reservation step."""
        mf = self._adopted
        if mf is None or not self._window:
            return None
        lead = min(BLOCK_WINDOWS * self._window, int(self._rate * BLOCKS_LEAD_S))
        if lead < MappedFile.RESERVE_STEP:
            return None
        return mf, lead

    def _size_window(self, mf):
        """Give `mf` the current lead: its next reservation reaches a step past it, and at
        least the configured window (a quiet writer keeps the window and half-window lead
        it always had)."""
        if self._window:
            lead = self.lead
            mf.refill_lead = lead
            mf.reserve_window = max(self._window, lead + max(OS_PAGE_SIZE, self._window // 4))

    def refill(self, mf, end):
        """The writer of `mf` passed its refill_position at `end`: reserve the window ahead of
        `end` and populate it, on this thread."""
        # Asked once: the writer goes on writing below reserved_position without calling,
        # until the window reserved here moves refill_position on. (A refill finishing
        # between the read and the store leaves it lower: the writer then asks once more.)
        mf.refill_position = mf.reserved_position
        now = time.monotonic_ns()
        last = self._last_request
        if last is not None and last[0] is mf and end > last[1] and now > last[2]:
            rate = (end - last[1]) * 1e9 / (now - last[2])
            self._rate = rate if rate > self._rate else DECAY * self._rate + (1 - DECAY) * rate
        self._last_request = (mf, end, now)
        self.populate(mf, end)

    def populate(self, mf, end, start=None):
        """Reserve the window ahead of `end` in `mf` if it is not yet (at once, on the
        reserving thread), and populate what is reserved from `start` (default: the reserved
        end now, where the new window begins) on, on this thread."""
        if self._prefault:
            if start is None:
                start = mf.reserved_position
            with self._lock:
                self._refill.append((mf, end, start, time.monotonic_ns()))
            self._reserver.ask(mf, end)
            self.wakeup()

    def _refill_pending(self):
        while True:
            with self._lock:
                todo, self._refill = self._refill, []
            if not todo:
                return
            for mf, end, start, asked in todo:
                self._fill(mf, end, start, asked=asked)
            # Between rounds of requests, not only once none waits: under sustained writes
            # on 2 cores this thread is always behind, and a writer rolling into a file
            # nobody made makes it inside its put and reserves its first window there (64
            # MiB; 7-10 rolls a minute in bench_sustained.py went so). A few ms a file.
            self._make_wanted()

    def _fill(self, mf, end, start=None, urgent=True, asked=None):
        """Reserve the window ahead of `end` in `mf` and populate it from `start` (default:
        what is new). Urgent: a writer is heading there, since `asked` (ns). Otherwise (a
        file prepared ahead) the writer's requests come first, between chunks."""
        if not mf.is_available:
            return
        self._size_window(mf)
        pos = mf.reserve_ahead(end, start)
        if pos is None:
            return
        # A window, even where the file system reserves nothing (the whole file counts as
        # reserved then): memory follows the data.
        end = min(mf.reserved_position, end + max(self._window, mf.reserve_window))
        # A Mapping's madvise releases the GIL: an urgent range in one call, since each
        # chunk waits for the GIL again, which a busy writer holds, and the writer would
        # catch up. mmap.mmap's holds the GIL: a chunk at a time, so the writer runs in
        # between. A destroy or shutdown stops the work, and pages the writer passed are
        # skipped.
        # No hold(): a borrower would make cleaning retry the file later. The mapping cannot
        # close during madvise: mmap.mmap runs it under the GIL, and a Mapping makes close()
        # raise BufferError meanwhile (the closer retries); a closed one raises ValueError,
        # which prefault ignores.
        nogil = isinstance(mf.mm, getattr(self._k, "Mapping", ()))
        chunk = end if urgent and nogil else 1 << 20
        if mf.wbuf is not None:
            # A pooled file's puts go to its write buffer, and its commits pwrite them into
            # the page cache (MappedFile.commit): its blocks need reserving, its mapping no
            # populating, which would only zero pages the commit then overwrites.
            pos = end
        while pos < end and mf.is_available and not self.is_stopped:
            if not urgent:
                self._refill_pending()
            if self._fill_cache and mf.reserve_align <= OS_PAGE_SIZE:
                # The page cache filled for exactly this reserved range first (see
                # FileSystem.cache_range), then the writer's populate only maps the pages:
                # a populate a page per fault (~1 GB/s here) fell behind a putter at
                # 0.6-0.9 GB/s, which then took 180-325 major faults a round itself; with
                # this, 1-23 (doc/performance.md, "Where `put_messages` loses its rounds").
                # Not with large folios (MappedFile.use_large_folios): the populate then
                # faults them in at about 7 GB/s itself, and a fill would cache the range
                # in 4 KiB pages first.
                self._fs.cache_range(mf.path, pos, min(chunk, end - pos))
            # Urgent: the writer is heading into the range, and where new memory is slow to
            # come by it catches up with the (GIL-free) populate: from the end, so that it
            # meets it once rather than waiting on each folio it locks (FileSystem.prefault).
            self._fs.prefault(mf.mm, pos, min(chunk, end - pos), from_end=urgent)
            pos = max(pos + chunk, mf.wrote_position - mf.wrote_position % OS_PAGE_SIZE)
        if urgent:
            self._writing = mf
        if asked is not None:
            # What the lead must outlast, twice over. Counted also when the writer got
            # there first and little was left to populate: it was late, all the more so.
            took = (time.monotonic_ns() - asked) / 1e9
            self._latency_s = (took if took > self._latency_s
                               else DECAY * self._latency_s + (1 - DECAY) * took)

    def _fill_ready(self):
        """Reserve and populate the first window of the files prepared ahead, once the file
        being written is reserved to its end, not earlier: meanwhile this thread serves only
        that file's writer, and no memory is taken ahead of need. A file done already costs
        a compare."""
        writing = self._writing
        if writing is not None and writing.reserved_position < writing.file_size:
            return
        with self._lock:
            ready = list(self._ready.values())
        for mf in ready:
            # Its first window may be reserved already (ReserveAheadService): populated
            # from 0, once.
            if mf.path not in self._primed:
                self._fill(mf, 0, 0, urgent=False)
                self._primed.add(mf.path)

    def _reserve_ready(self):
        """On the reserving thread: the first window of each file prepared ahead, once the
        writer's file is reserved to its end (when _fill_ready would populate it), so a
        writer rolling into it while this thread is stuck in a populate finds it reserved."""
        writing = self._adopted
        if writing is None or writing.reserved_position < writing.file_size:
            return
        with self._lock:
            ready = list(self._ready.values())
        for mf in ready:
            if mf.reserved_position == 0:
                self._size_window(mf)       # its lead, as _fill gives it: refill before the end
                mf.reserve_ahead(0)

    def take(self, path, next_offset):
        """The file at `path` (prepared, or created now), and queue the one after it."""
        with self._lock:
            # Never create a file the background thread is still creating: two mappings of
            # one path would let shutdown delete the one in use. Only creation is waited
            # for: the window of a prepared file may still be populating.
            self._lock.wait_for(lambda: self._making != path)
            mf = self._ready.pop(path, None)
            self._primed.discard(path)
            if self._wanted == path:
                self._wanted = None
            if mf is None:
                # Nor the other way round: a want() of this path meanwhile (CommitLog.start
                # wants the file after a full last one, while a slave's HA client, started
                # first, may be creating it) must not make a second file under this path,
                # which shutdown would then delete as prepared but never used.
                self._taking.add(path)
        if mf is None:
            # Created while a producer waits: this thread reserves and populates its first
            # window from now on, while the producer writes its first pages.
            try:
                mf = self._make(path)
            finally:
                with self._lock:
                    self._taking.discard(path)
        # Populated already, or not yet (see _fill_ready): urgent from now on.
        self.adopt(mf, 0, advised=True)
        self.want(os.path.join(os.path.dirname(path), "%020d" % next_offset))
        return mf

    def want(self, path):
        """Prepare the file at `path` in the background, for a take() to come."""
        with self._lock:
            self._wanted = path
        self.wakeup()

    def run_once(self):
        self.wait_for_running(1000)
        with self._lock:
            back, self._readahead_back = self._readahead_back, []
        for mf in back:
            if mf.is_available:
                mf.advise_random(False)
        self._refill_pending()
        self._make_wanted()
        if self._prefault:
            self._fill_ready()

    def _make_wanted(self):
        with self._lock:
            path = self._wanted
            self._wanted = None
            if (path is None or path in self._ready or path in self._taking
                    or self._fs.exists(path)):
                return
            self._making = path
        mf = None
        try:
            mf = self._make(path)
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
            self._primed = set()
            self._refill = []
        self._writing = self._adopted = None
        self._readahead_back = []
        for mf in ready.values():
            mf.destroy()
