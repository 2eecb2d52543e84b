# SPDX-License-Identifier: Apache-2.0
"""MappedFile: one fixed-size, memory-mapped segment file (doc/01 §2, RocketMQ MappedFile.java)."""
import errno
import logging
import os
import time

from . import leaves
from .format import CQ_POS_OFFSET, I64, OS_PAGE_SIZE

log = logging.getLogger(__name__)


def _round_up(n, unit):
    return -(-n // unit) * unit


def _page_up(n):
    return _round_up(n, OS_PAGE_SIZE)


def offset_to_file_name(offset):
    """UtilAll#offset2FileName: the decimal start offset, zero-padded to 20 digits."""
    return "%020d" % offset


def reserve_ahead_many(requests):
    """MappedFile.reserve_ahead(end, start, reserve) of each (mf, end, start, reserve) of
    `requests`, answered in order, with one FileSystem.reserve_many call per file system, so
    a thread serving hundreds of files releases the GIL once, not four times a file.

    No reserve lock is held across that call: each fallocate can wait behind writeback (up
    to 250 ms measured), and a writer reserving in one of the files must not wait for the
    whole batch. Each file's window is planned under its lock and published under it after
    the call, only if it reaches past what the file has reserved since (its writer may have
    reserved for itself meanwhile) and the file was not truncated in between: blocks a
    plan allocated and nobody publishes are only allocated space."""
    answers = [None] * len(requests)
    planned = []            # (index, mf, end, start, old, want, truncations, first)
    for i, (mf, end, start, reserve) in enumerate(requests):
        if not mf.is_available:
            continue
        if not reserve:
            answers[i] = mf._populate_start(mf.reserved_position, start)
            continue
        with mf._reserve_lock:
            old = mf.reserved_position
            want, _ = mf._reserve_plan(end, False)
            truncations = mf.truncations
            # What is held past the reserved end already (reserve_blocks_ahead) is not
            # asked for again: a window inside it is published with no call.
            first = max(old, mf.blocks_position)
            if old < want <= first:
                mf._reserved(end, want, True)
                want = old
        if want <= old:
            answers[i] = mf._populate_start(old, start)
        else:
            planned.append((i, mf, end, start, old, want, truncations, first))
    for (fs, kernels), group in _by_file_system((p[1], p) for p in planned).items():
        oks = fs.reserve_many(kernels, [(mf.path, first, want - first)
                                        for _, mf, _, _, _, want, _, first in group])
        for (i, mf, end, start, old, want, truncations, _), ok in zip(group, oks):
            if isinstance(ok, OSError):
                mf._not_reserved_ahead(ok)
                continue
            with mf._reserve_lock:
                if not mf.is_available or mf.truncations != truncations:
                    continue
                if not ok or want > mf.reserved_position:
                    mf._reserved(end, want, ok)
            answers[i] = mf._populate_start(old, start)
    return answers


class BlockHolder:
    """For a service thread holding blocks ahead of writers (MappedFile.reserve_blocks_ahead):
    a file whose disk refused is not asked again until its blocks_position moves. The
    refusal costs a log line; the writer meets the error itself when it gets there, with a
    write to refuse."""

    def __init__(self):
        self._refused = None        # (file, its blocks_position) where the disk said no

    def step(self, mf, lead, step=None):
        """One step of `mf`'s blocks toward `lead` past its window; True while more remains."""
        if self._refused == (mf, mf.blocks_position):
            return False
        try:
            return mf.reserve_blocks_ahead(lead, step)
        except OSError as exc:
            self._refused = (mf, mf.blocks_position)
            log.info("%s: could not hold blocks ahead of the writer: %s", mf.path, exc)
            return False


def read_cold(mm, pos, size):
    """`size` bytes at `pos` of the mapping `mm`, copied with the GIL released where the
    mapping can (a compiled Mapping's copy_released), however few: bytes that may be off the
    page cache (an old file's), whose fault waits for the disk. A thread faulting there with
    the GIL held stalled every other thread of the process with it: puts waited 50-220 ms
    behind the stats and cleaning threads' reads of old files (doc/performance.md, "A fault
    with the GIL held"). ValueError once unmapped."""
    copy = getattr(mm, "copy_released", None)
    return copy(pos, size) if copy is not None else mm[pos:pos + size]


def populate_many(requests):
    """MappedFile.populate(start, end) of each (mf, start, end) of `requests`, with one
    FileSystem.populate_many call per file system (reserve_ahead_many says why)."""
    ranges = ((mf, (mf.mm, start, end)) for mf, start, end in requests if end > start)
    for (fs, kernels), group in _by_file_system(ranges).items():
        fs.populate_many(kernels, group)


def _by_file_system(pairs):
    """{(FileSystem, kernels): [item, ...]} of the (MappedFile, item) `pairs`, in order: each
    file system answers the calls for its own files."""
    groups = {}
    for mf, item in pairs:
        groups.setdefault((mf._fs, mf._k), []).append(item)
    return groups


class MappedFile:
    """One segment. Positions are ints relative to the file start:

    wrote_position      bytes appended           (guarded by the owner's writer: put lock / reput)
    committed_position  bytes visible to readers (only below wrote_position with a write buffer)
    flushed_position    bytes known durable      (written by the flush thread only)
    reserved_position   bytes whose blocks exist (see reserve())
    refill_position     a writer reaching it asks for more reserved space (<= reserved_position)
    blocks_position     blocks exist below it too (>= reserved_position; reserve_blocks_ahead)

    Files are sparse: a writer calls reserve(end) before writing below `end` whenever `end`
    passes reserved_position (one integer compare in the common case), and a full disk then
    answers ENOSPC instead of killing the process with SIGBUS on the write.

    A file whose windows an allocator reserves and populates in the background has a
    `refill_lead`: refill_position then sits that far below reserved_position, so the writer
    asks for the next window while populated pages are still ahead of it. Below
    refill_position a writer writes without calling anything.
    """

    __slots__ = ("path", "file_name", "file_from_offset", "file_size", "mm", "wrote_position",
                 "committed_position", "flushed_position", "reserved_position", "refill_position",
                 "blocks_position",
                 "reserve_window", "reserve_window_max", "refill_lead", "store_timestamp",
                 "first_create_in_queue", "writable", "wbuf", "_pool", "_k", "_fs", "_refs",
                 "_available", "_lock", "_cond", "_reserve_lock", "_first_shutdown_ms",
                 "truncations", "_commit_lock", "_commit_fd", "reserve_align")
    # The most one fallocate reserves ahead of a writer with the reserve lock held
    # (_reserve_in_steps).
    RESERVE_STEP = 4 << 20
    # How long a forced try_destroy waits for a call that uses the pages without hold() to
    # end (_unmap): a cold read faults on the disk, tens of ms on a busy one.
    FORCED_UNMAP_WAIT_S = 0.5
    # Private slots the compiled read path (pyx/_read.pxi) reads and writes itself: it holds
    # and releases files inline, by hold() and release()'s protocol on these.
    LENT_SLOTS = ("_lock", "_available", "_refs", "_cond")  # type: tuple[str, ...]

    def __init__(self, path, file_size, kernels, fs, writable=True, create=True, pool=None,
                 reserve_window=0, reserve_window_max=None):
        self._name(path)
        self.file_size = file_size
        self.writable = writable
        self._k = kernels
        self._fs = fs
        if create:
            fs.create_sized(path, file_size)
        try:
            self.mm = fs.map(path, file_size, writable, kernels=kernels)
        except OSError:
            # A file created here but never mapped (ENOSPC, EMFILE) would load on reopen as
            # an empty segment past the end; leave nothing behind.
            if create:
                fs.remove(path)
            raise
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        # A file sized here holds no blocks; a loaded one holds its data (set_positions).
        self.reserved_position = 0
        self.refill_position = 0
        self.blocks_position = 0
        self.reserve_window = reserve_window
        # A file written fast reserves in growing windows, doubling up to this: a busy queue
        # then makes a few fallocate calls, not one per few hundred units.
        self.reserve_window_max = max(reserve_window, reserve_window_max or 0)
        self.refill_lead = 0              # set by an allocator that refills this file
        # Reserved ends fall on multiples of this (or the file's end): use_large_folios
        # raises it to the largest page-cache folio, so that none straddles the end.
        self.reserve_align = OS_PAGE_SIZE
        # The writer and the allocator thread both reserve; never held across a populate.
        self._reserve_lock = leaves.lock()
        self.store_timestamp = 0          # store time of the last record appended
        self.first_create_in_queue = False
        # With a TransientStorePool, appends go to a pooled write buffer and reach the mapping
        # only when committed; readers see committed bytes only.
        self._pool = pool
        self.wbuf = pool.borrow() if pool is not None else None
        # A commit writes the buffer into the file with pwrite, without the GIL: the buffer
        # goes back to the pool only under this lock, so no other file refills it under a
        # pwrite still reading it. The descriptor it writes through, opened at the first.
        self._commit_lock = leaves.lock()
        self._commit_fd = None
        self._refs = 0                    # views lent out between hold() and release()
        self._available = True
        # hold()/release() run per read: a bare Lock's C-level `with` is far cheaper than a
        # Condition's; the Condition (on the same lock) only serves close() waiting.
        self._lock = leaves.lock()
        self._cond = leaves.condition(self._lock)
        self._first_shutdown_ms = 0
        # set_positions calls so far: a flush that read its end before a truncation must not
        # mark that end flushed after it (the units written there next are not synced).
        self.truncations = 0

    def _name(self, path):
        """The file's path and name, and the offset (or, for an index file, the time) its
        name stands for: a file made ahead of its name (the next index file, IndexService)
        counts from 0 until it is renamed."""
        self.path = path
        self.file_name = os.path.basename(path)
        self.file_from_offset = int(self.file_name) if self.file_name.isdigit() else 0

    def rename(self, path):
        """Move the file to `path` (on the same file system); its mapping and positions
        stay."""
        self._fs.rename(self.path, path)
        self._name(path)

    # ---- positions -------------------------------------------------------------------
    @property
    def read_position(self):
        """Readers see up to here (MappedFile#getReadPosition)."""
        return self.committed_position

    @property
    def write_target(self):
        """Where appends go: the pooled write buffer if this file has one, else the mapping."""
        return self.mm if self.wbuf is None else self.wbuf

    @property
    def is_full(self):
        return self.wrote_position >= self.file_size

    @property
    def end_offset(self):
        return self.file_from_offset + self.file_size

    def set_positions(self, pos):
        """Positions of a loaded or truncated file: its bytes below `pos` were written, so
        their blocks exist; nothing is known to be reserved past them."""
        with self._lock:            # against a flush marking what it synced (mark_flushed)
            self.wrote_position = self.committed_position = self.flushed_position = pos
            self.reserved_position = self.refill_position = self.blocks_position = pos
            self.truncations += 1

    def data_end(self):
        """Where the file's written data ends (zeros after it); see FileSystem.data_end."""
        return min(self.file_size, _page_up(self._fs.data_end(self.path)))

    def reserve(self, end, required=True):
        """Allocate blocks up to `end`, and a window ahead of it while the disk allows, so
        writes below reserved_position cannot fault. On a disk too full for the window only
        what `end` needs is taken; OSError(ENOSPC) when not even that fits.

        `required=False` is the allocator reserving ahead of a writer at `end`: the window
        past `end` is taken whole, in steps (_reserve_in_steps; ENOSPC at the step that does
        not fit), and nothing when it is already there. The writer and the allocator may
        call this at once: the lock makes one wait for the other's fallocate (one step of
        it), never for a populate. Returns (old, new) reserved positions."""
        if not required:
            return self._reserve_in_steps(end)
        with self._reserve_lock:
            old = self.reserved_position
            want, need = self._reserve_plan(end, required)
            if want <= old:
                return old, old
            try:
                ok = self._allocate(old, want)
            except OSError as exc:
                if exc.errno != errno.ENOSPC or need <= old or want == need:
                    raise
                ok = self._allocate(old, need)
                want = need
            return old, self._reserved(end, want, ok)

    def _reserve_in_steps(self, end):
        """reserve(end, required=False): the window a RESERVE_STEP at a time, each step
        under the lock and published (reserved_position) before the next. A window reserved
        ahead can be 64 MiB, the next CommitLog file's first one at a roll, and a fallocate
        that reads block bitmaps behind writeback took up to 150 ms for 4 MiB; a writer
        rolling into the file, or reaching the end of what is reserved, then waited on the
        lock for all of it (doc/performance.md, "Sustained writes"). Now it waits for one
        step at most, and writes below what the steps before published without calling
        (refill_position moves only with the last step, as reserve() moves it). A step the
        disk refuses raises, the steps before it kept."""
        with self._reserve_lock:
            first = self.reserved_position
            want, _ = self._reserve_plan(end, False)
            truncations = self.truncations
        while True:
            with self._reserve_lock:
                old = self.reserved_position
                if want <= old or self.truncations != truncations or not self.is_available:
                    # Reserved past it meanwhile (its writer, or another thread reserving
                    # ahead), or cut back (recovery, truncation): that write plans again.
                    return first, old
                stop = min(want, self._align_up(old + self.RESERVE_STEP))
                ok = self._allocate(old, stop)
                if self.truncations != truncations:
                    return first, self.reserved_position
                if stop == want or not ok:
                    return first, self._reserved(end, want, ok)
                self._set_reserved(stop)

    def reserve_step(self, end):
        """Reserve toward `end`, with no window past it (but to a whole folio in a file
        given large folios: see use_large_folios) and one RESERVE_STEP at most: for the
        maker of a file nobody writes yet, a step per turn (IndexService makes the next
        index file so). Returns the new reserved_position."""
        with self._reserve_lock:
            old = self.reserved_position
            stop = min(end, self.file_size, _page_up(old + self.RESERVE_STEP))
            if self.reserve_align > OS_PAGE_SIZE:
                stop = min(self.file_size, self._align_up(stop))
            if stop <= old:
                return old
            return self._reserved(stop, stop, self._allocate(old, stop))

    def _reserve_plan(self, end, required):
        """Under _reserve_lock: (want, need) for reserve(end, required), the positions to
        reserve up to (want) and, on a disk too full for that, at least (need). want <=
        reserved_position: nothing to do."""
        old = self.reserved_position
        # A writer filling the file asks for its end plus the blank record's 8 bytes:
        # nothing exists past the file to reserve, and a zero-length fallocate is EINVAL.
        end = min(end, self.file_size)
        want = min(self.file_size, self._window_end(end))
        need = min(self.file_size, self._align_up(end)) if required else old
        if end <= old if required else want <= old:
            return old, old
        return want, need

    def _reserved(self, end, want, ok):
        """Under _reserve_lock: blocks up to `want` were reserved for a writer at `end` (ok
        False: the file system cannot reserve). Publish the positions; returns the new
        reserved_position."""
        end = min(end, self.file_size)
        if not ok:
            log.warning("%s: the file system cannot reserve blocks; a full disk will "
                        "fault writes to this file", self.path)
            want = self.file_size
        # Past refill_position the writer asks for more: a lead below a whole window
        # leaves populated pages ahead of it meanwhile; a shrunk window has no lead,
        # the disk having nothing more to give.
        whole = want == self._window_end(end)
        lead = self.refill_lead if whole else 0
        if whole and self.reserve_window < self.reserve_window_max:
            self.reserve_window = min(2 * self.reserve_window, self.reserve_window_max)
        self._set_reserved(want)
        self.refill_position = want - lead if want < self.file_size else want
        return want

    def _set_reserved(self, pos):
        """Under _reserve_lock: blocks exist below `pos` (reserved_position), and so below
        blocks_position, which never trails it."""
        self.reserved_position = pos
        self.blocks_position = max(self.blocks_position, pos)

    def _allocate(self, old, want):
        """Under _reserve_lock: FileSystem.reserve of [old, want), less what
        reserve_blocks_ahead holds already; no call at all when it holds the whole range."""
        start = max(old, self.blocks_position)
        if start >= want:
            return True
        return self._fs.reserve(self.path, start, want - start)

    def reserve_blocks_ahead(self, lead, step=None):
        """For the thread reserving ahead of this file's writer: the blocks of one more `step`
        (default RESERVE_STEP) toward `lead` bytes past reserved_position, and only the blocks:
        reserved_position and refill_position stay, so memory and the writer's requests
        follow the window as before. True while more remains to reserve.

        Why: a fallocate can wait 50-150 ms for ext4 to read a block bitmap behind gigabytes
        of writeback, and a writer at 0.8 GB/s crossed the whole window lead meanwhile, then
        reserved inside its put or waited for the lock (doc/performance.md, "Blocks ahead of
        the window"). Here the fallocate runs without the reserve lock, and a window then
        planned below blocks_position is published with no file-system call (_allocate).
        OSError when the disk refuses; the writer reserves what it needs itself then."""
        with self._reserve_lock:
            if not self.is_available:
                return False
            target = min(self.file_size, self._align_up(self.reserved_position + lead))
            start = max(self.reserved_position, self.blocks_position)
            if start >= target:
                return False
            stop = min(target, self._align_up(start + (step or self.RESERVE_STEP)))
            truncations = self.truncations
        ok = self._fs.reserve(self.path, start, stop - start)
        with self._reserve_lock:
            # Cut back meanwhile (recovery, truncation): what was planned no longer holds.
            if not ok or self.truncations != truncations or not self.is_available:
                return False
            # Everything below `start` had its blocks when planned, and blocks_position
            # only grows between truncations.
            self.blocks_position = max(self.blocks_position, stop)
            return stop < target

    def _align_up(self, n):
        return _round_up(n, self.reserve_align)

    def _window_end(self, end):
        """Where the window ahead of a writer at `end` ends: reserve_window past it, on a
        reserve_align boundary. With whole folios, rounded down (but never below the folio
        holding `end`), so that the window holds no more disk and memory than
        reserve_window, as with pages."""
        a = self.reserve_align
        if a <= OS_PAGE_SIZE:
            return _page_up(end + self.reserve_window)
        return max(_round_up(end, a), (end + self.reserve_window) // a * a)

    def use_large_folios(self, size):
        """Let this file's mapping fill the page cache in folios of up to `size` bytes
        (FileSystem.advise_hugepage), for a writer whose windows an allocator populates:
        about 8x less CPU a page than 4 KiB at a time. A write into a folio makes the file
        system allocate all of its blocks, and a folio straddling the reserved end would so
        allocate past the reservation: on a full disk, SIGBUS instead of ENOSPC at reserve.
        So reserved ends fall on multiples of `size` from now on (folios are aligned to
        their size), the current one first: reserved to the next multiple now, or, where the
        disk cannot give that, no large folios for this file. No-op with `size` 0 (no large
        folios). True if the advice was taken."""
        if size <= OS_PAGE_SIZE:
            return False
        with self._reserve_lock:
            old = self.reserved_position
            up = min(self.file_size, _round_up(old, size))
            if 0 < old < up:
                try:
                    ok = self._allocate(old, up)
                except OSError as exc:
                    self._not_reserved_ahead(exc)
                    return False
                if ok:
                    self._set_reserved(up)
                    if self.refill_position >= old:
                        self.refill_position = up
            self.reserve_align = size
        return self._fs.advise_hugepage(self.mm)

    def reserve_ahead(self, end, start=None, reserve=True):
        """For a service populating ahead of this file's writer, which is at `end`: reserve
        the window ahead of it (unless `reserve` is false), and return where populating
        starts: `start` (default: what was not reserved before), never below the writer, on
        a page boundary. None when the file is gone, or the disk refused: the writer
        reserves what it needs itself when it gets there, and meets the error then, with a
        write to refuse."""
        if not self.is_available:
            return None
        old = self.reserved_position
        if reserve:
            try:
                old, _ = self.reserve(end, required=False)
            except OSError as exc:
                self._not_reserved_ahead(exc)
                return None
        return self._populate_start(old, start)

    def _populate_start(self, old, start):
        pos = max(old if start is None else start, self.wrote_position)
        return pos - pos % OS_PAGE_SIZE

    def _not_reserved_ahead(self, exc):
        log.info("%s: could not reserve ahead of the writer: %s", self.path, exc)

    def populate(self, start, end):
        """Fault in [start, end) now (the page holding `start` included), so that writes
        there take no first-touch fault. Only reserved space: populating a hole would
        allocate it with no ENOSPC check. With the cext Mapping the GIL is released."""
        start -= start % OS_PAGE_SIZE
        if end > start:
            self._fs.prefault(self.mm, start, end - start)

    def open_writer_fd(self):
        """A descriptor of this file open for writing, for a writer that fills it with pwrite
        instead of through the mapping (the HA slave, doc/05 §4); close it with close_fd. The
        mapping is advised MADV_RANDOM from now on, as the allocator advises a file being
        written: a reader's fault below the write position then brings in its own page, not a
        readahead window reaching into the unwritten tail, zero-filled only to be overwritten."""
        fd = self._fs.open_fd(self.path, writable=True)
        self._fs.advise_random(self.mm, True)
        return fd

    def pwrite(self, fd, data, pos):
        """Write all of `data` at `pos` of this file through `fd` (from open_writer_fd)."""
        self._fs.pwrite(fd, data, pos, self.path)

    def splice(self, pipe_fd, fd, count, pos):
        """Move `count` bytes waiting in the pipe `pipe_fd` to `pos` of this file through `fd`
        (from open_writer_fd), all of them (FileSystem.splice)."""
        self._fs.splice(pipe_fd, fd, count, pos, self.path)

    def advise_random(self, random=True):
        """MADV_RANDOM on the mapping while a writer fills it (a first touch brings in one
        page, not a readahead window of zeros); MADV_NORMAL (readahead back) with False."""
        self._fs.advise_random(self.mm, random)

    def close_fd(self, fd):
        """Close a descriptor from open_writer_fd; readers get readahead back (the writer may
        advise again when it comes back)."""
        self._fs.close_fd(fd)
        self._fs.advise_random(self.mm, False)

    def zero_tail(self, pos, chunk=1 << 20):
        """Zero [pos, file end). A truncated tail must not hold stale records that a later
        recovery could take for valid ones once new data ends short of them. Only the
        written extent is read: past it the file reads as zeros already, and reading holes
        through the mapping would allocate them (tmpfs) on a disk that may be full.

        The zeros are synced: no flush covers bytes past the write position, and zeros lost
        at a power cut would bring the stale records back, in line behind the new ones when
        they have the same sizes (recovery then reads on into them). A failed sync raises
        OSError (naming this file) once the zeros are written: the caller finishes its cut
        and fails stop (SyncLatch), since a later sync of these pages could succeed with the
        zeros never on disk."""
        zeros = bytes(min(chunk, self.file_size))
        end = self.data_end()
        first = last = None
        while pos < end:
            n = min(chunk, end - pos)
            if self.mm[pos:pos + n] != zeros[:n]:
                self.mm[pos:pos + n] = zeros[:n]
                first = pos if first is None else first
                last = pos + n
            pos += n
        if first is not None:
            try:
                self._fs.sync_mapped(self._k, self.mm, self.path, first, last - first)
            except OSError as exc:
                raise OSError(exc.errno, f"the zeroed tail [{first}, {last}) could not be "
                              f"synced ({exc.strerror or exc})", self.path) from exc

    # ---- writes ----------------------------------------------------------------------
    def append_bytes(self, data):
        """appendMessage(byte[]): raw bytes at wrote_position, if they fit (CQ writes, HA)."""
        n = len(data)
        pos = self.wrote_position
        if pos + n > self.file_size:
            return False
        if pos + n > self.reserved_position:
            self.reserve(pos + n)
        self.mm[pos:pos + n] = data
        self.wrote_position = self.committed_position = pos + n
        return True

    def is_able_to_commit(self, least_pages):
        commit = self.committed_position
        write = self.wrote_position
        if self.is_full:
            return write > commit
        if least_pages > 0:
            return write // OS_PAGE_SIZE - commit // OS_PAGE_SIZE >= least_pages
        return write > commit

    def commit(self, least_pages=0):
        """Write [committed, wrote) from the write buffer into the file (MappedFile#commit);
        a file committed to its end gives its buffer back to the pool.

        With pwrite, as Java's commit0 writes through the file's channel, not through the
        mapping: the page cache takes the bytes without the mapping's pages being faulted
        in, so nobody populates them ahead (the allocator only reserves a pooled file's
        blocks), and the GIL is released while the kernel copies (and, past the dirty
        budget, throttles). A copy into the mapping held the GIL throughout, and the
        allocator populated every page of it first, only for the copy to overwrite it: 19 s
        of the allocator's CPU in a 60 s run of sustained writes (doc/performance.md).
        An OSError (the disk refused the write) leaves the committed position where it was:
        the bytes stay in the buffer, and the next commit writes them again."""
        if self.wbuf is None:
            return self.wrote_position
        with self._commit_lock:
            wbuf = self.wbuf
            if wbuf is None:                # given back meanwhile: closed or destroyed
                return self.committed_position
            if self.is_able_to_commit(least_pages):
                start = self.committed_position
                end = self.wrote_position
                truncations = self.truncations
                if self._commit_fd is None:
                    self._commit_fd = self.open_writer_fd()
                with memoryview(wbuf) as mv, mv[start:end] as part:
                    self._fs.pwrite(self._commit_fd, part, start, self.path)
                if truncations == self.truncations:     # else cut back meanwhile
                    self.committed_position = end
            if self.committed_position >= self.file_size:
                self._give_back_wbuf_locked()
        return self.committed_position

    def _give_back_wbuf(self):
        """Return the write buffer to the pool and close the commit's descriptor, once no
        commit is using them."""
        if self.wbuf is not None or self._commit_fd is not None:
            with self._commit_lock:
                self._give_back_wbuf_locked()

    def _give_back_wbuf_locked(self):
        wbuf, self.wbuf = self.wbuf, None
        fd, self._commit_fd = self._commit_fd, None
        if wbuf is not None:
            self._pool.give_back(wbuf)
        if fd is not None:
            self.close_fd(fd)

    def is_able_to_flush(self, least_pages):
        flush = self.flushed_position
        write = self.read_position
        if self.is_full:
            return write > flush
        if least_pages > 0:
            return write // OS_PAGE_SIZE - flush // OS_PAGE_SIZE >= least_pages
        return write > flush

    def flush(self, least_pages=0, queue=None, write_behind=False):
        """Make [flushed_position, read_position) durable if at least `least_pages` are dirty.
        A periodic flush (least_pages > 0) of a file still being written stops at the page
        boundary below read_position (in large folios, at the folio boundary while anything
        lies before it: flush_end): the partial page the writer is filling is left for the
        next flush (a thorough one, least_pages == 0, takes everything). Writing a page back
        write-protects it and locks it while the I/O is submitted, so the writer's next
        append to that page would fault and could wait for a busy disk (doc/03 §2.3).

        With `queue` (the MappedFileQueue holding this file), its flushed_where follows: this
        file's start plus its flushed position, flushed or not. Neither moves when the file
        was truncated or destroyed since the end was read (see mark_flushed).

        With `write_behind` (the ASYNC_FLUSH flusher), the range is first written back without
        being made durable (FileSystem.write_behind): two chunks in flight, where each msync
        wrote a chunk, waited for it and flushed the device's cache before the next; the
        msyncs then find the pages clean."""
        truncations = self.truncations
        end = self.flush_end(least_pages)
        if end is not None and self.hold():
            try:
                if write_behind:
                    self._fs.write_behind(self._k, self.path, self.flushed_position, end)
                self._sync_written(self.flushed_position, end)
            finally:
                self.release()
        else:
            end = self.flushed_position
        self.mark_flushed(end, truncations, queue, advance_only=False)
        return self.flushed_position

    def flush_end(self, least_pages=0):
        """Where flush(least_pages) would make the file durable to now; None if it would not
        flush."""
        if not self.is_able_to_flush(least_pages):
            return None
        end = self.read_position
        if least_pages > 0 and not self.is_full:
            # Not into the page the writer is filling (see flush). In large folios
            # (use_large_folios) the unit written back is the folio: syncing any page of the
            # writer's folio write-protects all of it, and the writer's next append waited
            # behind that I/O (59 ms in one put, beside a 70 ms sync). So up to the folio
            # boundary, where something lies before it; a writer slow enough to be still in
            # the folio it was in at the last round is synced to its page, as before.
            folio = end - end % self.reserve_align
            end = folio if folio > self.flushed_position else end - end % OS_PAGE_SIZE
        return end

    def mark_flushed(self, end, truncations=None, queue=None, advance_only=True):
        """[0, end) is durable (a sync of the whole file system: MappedFileQueue.settle; or
        flush's own); `truncations`: the file's count when `end` was read. False (nothing
        marked) when the file was truncated (or destroyed) since: the bytes now below `end`
        were not all written then. With `queue`, its flushed_where follows (only forward
        with `advance_only`).

        Check and set under the file's lock, which set_positions and destroy take too: a
        truncation lands before (nothing is marked) or after (and its clamp of the queue's
        flushed offset, which follows its set_positions, has the last word). Checked without
        it, a cut landing between the check and the set left the queue flushed past its end,
        and the units written next were never synced."""
        with self._lock:
            if truncations is not None and (truncations != self.truncations
                                            or not self._available):
                return False
            if end > self.flushed_position or not advance_only:
                self.flushed_position = end
            if queue is not None:
                where = self.file_from_offset + end
                if where > queue.flushed_where or not advance_only:
                    queue.flushed_where = where
            return True

    def sync(self, start, end):
        """Make [start, end) durable, leaving flushed_position to the caller: SYNC_FLUSH's group
        commit runs several syncs of one file at once and advances the position itself, in
        order. Nothing if the file is being destroyed."""
        if end <= start or not self.hold():
            return
        try:
            self._sync_written(start, end)
        finally:
            self.release()

    def _sync_written(self, start, end):
        """Sync [start, end), held by the caller. The whole pages below `end` are written for
        good (these files are only appended to; the page holding `end` may take more): off
        the page tables first, so their write-back flushes no TLB entry page by page
        (FileSystem.sync_written)."""
        self._fs.sync_written(self._k, self.mm, self.path, start, end)

    # ---- reference counting (ReferenceResource) ---------------------------------------
    # The compiled ReadPath (pyx/_read.pxi _hold, _release) follows this protocol on these
    # slots itself for get_batch: a change here is a change there.
    def hold(self):
        """Borrow the mapping; False once the file is being destroyed."""
        with self._lock:
            if not self._available:
                return False
            self._refs += 1
            return True

    def release(self):
        with self._lock:
            self._refs -= 1
            if self._refs <= 0 and not self._available:
                self._cond.notify_all()         # a close() is waiting for the last borrower

    def copy(self, pos, size):
        """A copy of `size` bytes at `pos`, or None past the read position; ValueError once
        unmapped. Read as bytes off the page cache are (read_cold): CommitLog files behind
        the in-memory window are dropped from it."""
        if pos < 0 or pos + size > self.read_position:
            return None
        return read_cold(self.mm, pos, size)

    def last_unit_phy(self, unit_size):
        """The physical offset in the last unit of a full ConsumeQueue file, as
        deleteExpiredFileByOffset reads it; None once unmapped. An old file's page may be off
        the page cache: read without the GIL (read_cold)."""
        try:
            return I64.unpack(read_cold(self.mm, self.file_size - unit_size + CQ_POS_OFFSET,
                                        8))[0]
        except ValueError:
            return None

    # ---- lifecycle -------------------------------------------------------------------
    def close(self, wait_s=1.0, unmap_wait_s=0):
        """Unmap once no borrower holds a view; returns False if borrowers remain.
        `unmap_wait_s`: how long a call using the pages without hold() may delay the unmap
        (_unmap); a plain close does not wait for one."""
        with self._cond:
            self._available = False
        self._give_back_wbuf()
        with self._cond:
            if self._refs > 0:
                self._cond.wait_for(lambda: self._refs <= 0, timeout=wait_s)
            if self._refs > 0:
                return False
        return self._unmap(unmap_wait_s)

    def _unmap(self, wait_s):
        """Unmap, waiting up to `wait_s` for a call that uses the pages without hold() to end:
        a populate (the allocator's and PopulateAheadService's madvise, which makes the
        Mapping's close() raise BufferError meanwhile) takes one window at most. A destroy that
        gave up at once left its file on disk, and the next file made at its offset took it
        up again, stale bytes and all. False while an exported view still pins the pages."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.mm.close()
                return True
            except BufferError:
                if time.monotonic() >= deadline:
                    return False
            time.sleep(0.001)

    def destroy(self, wait_s=1.0):
        """Unmap and delete the file; True if it was unmapped too. A view still held past
        `wait_s` keeps the mapping, but the file is deleted all the same (the pages stay
        valid for the view and go with it): left on disk, it would be taken up again, stale
        bytes and all, by the next file made at its offset (create_sized keeps an existing
        file) or loaded at the next start."""
        closed = self.close(wait_s, unmap_wait_s=wait_s)
        self._fs.remove(self.path)
        return closed

    @property
    def is_available(self):
        """False once a destroy has started (ReferenceResource#isAvailable)."""
        return self._available

    @property
    def ref_count(self):
        """Views currently lent out by hold()."""
        return self._refs

    def try_destroy(self, now_ms, interval_forcibly_ms, truncations=None):
        """MappedFile#destroy(intervalForcibly) without blocking: the first call marks the file
        unavailable (no new hold()); it is unmapped and deleted once no borrower remains, or
        once `interval_forcibly_ms` has passed since that first call. Returns True when the
        file is gone, False if it must be retried (the "hanged file"). With `truncations`
        (the file's count when the caller read what made it expired): False, nothing done,
        when the file was truncated since (set_positions takes this lock too)."""
        with self._cond:
            if truncations is not None and truncations != self.truncations:
                return False
            if self._available:
                self._available = False
                self._first_shutdown_ms = now_ms
            forced = now_ms - self._first_shutdown_ms >= interval_forcibly_ms
            busy = self._refs > 0 and not forced
        self._give_back_wbuf()
        if busy:
            return False
        # A call using the pages without hold() (a cold read's GIL-free copy, a populate)
        # is over in moments: a forced destroy waits that long, lest it leave the mapping to
        # it. An exported view (numpy array, memoryview) pins the mapping and Python cannot
        # unmap under it, unlike Java's forced cleaner. Forced: unlink the file anyway; the
        # pages stay valid for the last view and go with it.
        if not self._unmap(self.FORCED_UNMAP_WAIT_S if forced else 0) and not forced:
            return False
        self._fs.remove(self.path)
        return True

    def __repr__(self):
        return (f"MappedFile({self.file_name}, wrote={self.wrote_position}, "
                f"committed={self.committed_position}, flushed={self.flushed_position})")


def cell_property(index, doc):
    """A position read and written as item `index` of the owner's `_cell` array, the place the
    compiled dispatcher publishes it to with plain stores (no Python int is made)."""
    def get(self):
        return self._cell[index]

    def set(self, value):
        self._cell[index] = value
    return property(get, set, doc=doc)


class CqMappedFile(MappedFile):
    """A ConsumeQueue file. Its wrote and committed positions live in `_cell`, a two-element
    int64 array (wrote, committed) that the compiled dispatcher (pyx/_cq_dispatch.pxi)
    publishes into with plain C stores, so that publishing a queue's units makes no Python
    ints; every backend and every reader goes through these properties (the compiled read
    path reads the cell too). The array is never resized: the dispatcher keeps a buffer
    export of it, and the address of its data, while it keeps the queue's state.

    The cell is written only with the GIL held (the dispatcher publishes after its GIL-free
    row loop, after the units' bytes), and every reader reads it with the GIL held, so a
    reader that sees a position also sees the units below it."""

    __slots__ = ("_cell",)
    LENT_SLOTS = ("_lock", "_available", "_refs", "_cond", "_cell")

    def __init__(self, *args, **kwargs):
        self._cell = leaves.cells((0, 0))
        super().__init__(*args, **kwargs)
        # MappedFile's own members for these stay None: code reading them at their member
        # offsets instead of through the cell fails at once rather than reading a stale int.
        _WROTE_MEMBER.__set__(self, None)
        _COMMITTED_MEMBER.__set__(self, None)

    wrote_position = cell_property(0, "Where the next unit is written.")
    committed_position = cell_property(1, "What readers may read up to.")


_WROTE_MEMBER = MappedFile.__dict__["wrote_position"]
_COMMITTED_MEMBER = MappedFile.__dict__["committed_position"]
