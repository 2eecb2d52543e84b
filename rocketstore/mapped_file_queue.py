# SPDX-License-Identifier: Apache-2.0
"""MappedFileQueue: a directory of equally sized segments named by start offset (doc/01 §2)."""
import datetime
import logging
import os
import time
from array import array

from . import format as F
from . import leaves
from .errors import StoreLoadError
from .fs import CREATING_SUFFIX
from .mapped_file import MappedFile, offset_to_file_name

log = logging.getLogger(__name__)

SEGMENT_NAME_LEN = 20       # UtilAll#offset2FileName: CommitLog and ConsumeQueue segments
INDEX_NAME_LEN = 17         # UtilAll#timeMillisToHumanString: yyyyMMddHHmmssSSS
_QUEUE_ID_MAX = (1 << 31) - 1
# MappedFileQueue._making while files are being deleted (_remove_files): no file is made then.
DELETING = -1


def is_segment_name(name, length=SEGMENT_NAME_LEN):
    """True for a store file name: exactly `length` ASCII digits. `0` or a 21-digit name
    parses to an offset too, and once taken for a segment it shadows the real one (recovery
    then truncates real data): anything else is reported and left alone."""
    return len(name) == length and name.isascii() and name.isdigit()


def is_index_name(name):
    """True for an IndexFile name: a yyyyMMddHHmmssSSS time (17 digits that form a date)."""
    if not is_segment_name(name, INDEX_NAME_LEN):
        return False
    try:
        datetime.datetime.strptime(name[:14], "%Y%m%d%H%M%S")
    except ValueError:
        return False
    return True


def is_queue_dir_name(name):
    """True for a ConsumeQueue directory name: a queue id as the broker writes it (decimal, no
    sign or leading zero, an int). `007` would load as queue 7 while naming another directory."""
    return (name.isascii() and name.isdigit() and (name == "0" or name[0] != "0")
            and int(name) <= _QUEUE_ID_MAX)


def drop_creating_leftovers(fs, directory, strays, is_name, writable):
    """The strays that are not a store file's own `<name>.creating` temporary: a crash between
    creating and renaming leaves one, all zeros since nothing was written to it. A writable
    queue removes it; one holding data is not ours, and stays. One gone by the time it is
    read was a live writer's, renamed into place meanwhile (a read-only open of a running
    store lists the directory while the writer creates files)."""
    kept = []
    for name in strays:
        base, dot, suffix = name.rpartition(".")
        path = os.path.join(directory, name)
        creating = dot and "." + suffix == CREATING_SUFFIX and is_name(base)
        try:
            leftover = creating and not fs.is_dir(path) and fs.holds_only_zeros(path)
        except FileNotFoundError:
            continue
        if leftover:
            log.info("removing %s: a file a crash left half-created", name)
            if writable:
                fs.remove(path)
            continue
        kept.append(name)
    return kept


def split_segment_names(fs, directory, file_size, is_name=is_segment_name):
    """(segments, strays): the names in `directory` that are store files (`is_name`, not a
    directory, and, with `file_size`, a multiple of it), and the rest. A segment starts at a
    multiple of the file size (getLastMappedFile rounds down); a name in between is not ours
    and, taken for one, would overlap a real one."""
    segments, strays = [], []
    for name in fs.list_dir(directory):
        if (is_name(name) and (not file_size or not int(name) % file_size)
                and not fs.is_dir(os.path.join(directory, name))):
            segments.append(name)
        else:
            strays.append(name)
    if file_size and len(segments) > 1:
        # A short file next to no other segment is no segment cut short: extending it as
        # one (then truncating it away in recovery) would destroy a file that is not ours.
        offs = [int(n) for n in segments]
        for i, name in enumerate(list(segments)):
            if (i and offs[i] - offs[i - 1] == file_size) or \
                    (i + 1 < len(offs) and offs[i + 1] - offs[i] == file_size):
                continue
            if fs.size(os.path.join(directory, name)) != file_size:
                segments.remove(name)
                strays.append(name)
    return segments, sorted(strays)


class FlushPlan:
    """The files a sync of the whole file system is to make durable, and to where, for any
    number of queues (MappedFileQueue.flush_plan adds each queue's). In flat columns, not a
    tuple and a list per queue: those were objects the garbage collector tracks, and at
    10 000 queues their promotion set off full collections that held the GIL for 103-165 ms
    (doc/performance.md, "A full collection in the flush round")."""

    __slots__ = ("queues", "files", "ends", "stamps", "truncations")

    def __init__(self):
        self.queues = []                # the MappedFileQueue of each entry, in queue order
        self.files = []
        self.ends = array("q")
        self.stamps = array("q")        # each file's store time, read before its end
        self.truncations = array("q")   # each file's truncation count when its end was read

    def add(self, queue, f, end, store_timestamp, truncations):
        self.queues.append(queue)
        self.files.append(f)
        self.ends.append(end)
        self.stamps.append(store_timestamp)
        self.truncations.append(truncations)

    def settle(self, least_pages=0):
        """The plan's bytes are durable (it was made with `least_pages`). A file truncated
        meanwhile ends its queue's part: its end, and those after it in that queue, no
        longer say what was written."""
        cut = None                      # the queue whose part a truncation ended
        for queue, f, end, truncations, stamp in zip(self.queues, self.files, self.ends,
                                                     self.truncations, self.stamps):
            if queue is cut:
                continue
            if not f.mark_flushed(end, truncations, queue):
                cut = queue
            elif least_pages == 0:
                queue.store_timestamp = stamp


class MappedFileQueue:
    """Segments in ascending offset order. The list is replaced, never mutated in place, so a
    reader thread can take `self.files` once and walk it without a lock."""

    # A queue whose last file filled in less than this many seconds has two files made ahead
    # of its writer, not one, and the next made as it rolls rather than a window before the
    # roll. At 5.8 M units a second a 6 MB ConsumeQueue file lasts 50 ms, a window's lead
    # 10-20 ms, and making a file (its create waits behind the file system's journal while
    # writeback converts the CommitLog's blocks) took up to 141 ms: the writer waited for it.
    FAST_ROLL_S = 1.0

    def __init__(self, store_path, file_size, kernels, fs, writable=True, allocator=None,
                 reserve_window=0, reserve_window_max=None, no_readahead_while_written=False,
                 populator=None, file_type=MappedFile):
        self.store_path = store_path
        self.file_size = file_size
        self.files = []
        self.flushed_where = 0
        self.committed_where = 0
        self.store_timestamp = 0     # last store time seen by a full flush (checkpoint feed)
        self._k = kernels
        self._fs = fs
        self.writable = writable
        self._allocator = allocator  # optional: creates files ahead of time (CommitLog only)
        self.file_type = file_type   # MappedFile, or a subclass (CqMappedFile) for every file
        self.reserve_window = reserve_window   # MappedFile.reserve's window for every file
        self.reserve_window_max = reserve_window_max
        # The file being written has no readahead (MADV_RANDOM) when set: its writer's first
        # touch of a page (a populate, or a fault) then brings in that page alone, not a
        # readahead window of zeros (read_ahead_kb, 8 MiB on many disks: more than a whole
        # ConsumeQueue file) in the writer's thread. The file it leaves gets readahead back.
        self.no_readahead_while_written = no_readahead_while_written
        # A PopulateAheadService populating this queue's windows ahead of its writer, when
        # set. It also makes the next file once the last one is reserved to its end, or two
        # ahead from the roll on for a queue that fills its files fast (prepare_next), so
        # the writer's roll takes a file made, mapped and populated off its thread: no
        # create, mmap or madvise there (each of those waits for the process's mmap lock,
        # which a long populate elsewhere holds). A new file starts with the reservation
        # window its predecessor grew to: a busy queue keeps its lead across a roll instead
        # of growing it again from the configured size.
        self.populator = populator
        # Files made ahead, in offset order, the first the next to roll into; guarded by
        # _lock, and so is _making, the offset of the one being made (outside the lock: a
        # roll that needs another file does not wait for it), or DELETING while files are
        # deleted (_remove_files).
        self._ready = []
        self._making = None
        self._ahead = 1              # files to keep made ahead (2 for a fast queue)
        self._rolled_at = None       # time.monotonic() of the last roll (or first file)
        self._cache_dropped = 0      # drop_cache_below's mark
        self._lock = leaves.lock()
        self._made = leaves.condition(self._lock)    # _making cleared
        self.root = None             # the store root: no directory is created outside it
        self.stray_names = []        # names load() found and left alone, not being segments

    # ---- load --------------------------------------------------------------------------
    def load(self):
        """MappedFileQueue#load: map every segment; positions = file size until recovery.

        Segments that all have one other size mean the configured size is wrong
        (StoreLoadError). A segment shorter than its neighbours was damaged or cut short: its
        missing tail reads as never-written space, which recovery takes for the end of data."""
        files = []
        names, strays = split_segment_names(self._fs, self.store_path, self.file_size)
        self.stray_names = drop_creating_leftovers(self._fs, self.store_path, strays,
                                                   is_segment_name, self.writable)
        if self.stray_names and not names and \
                split_segment_names(self._fs, self.store_path, None)[0]:
            raise StoreLoadError(
                f"no segment name in {self.store_path} is a multiple of {self.file_size}: "
                "the configured file size does not match the store")
        for name in self.stray_names:
            log.warning("ignoring %s: not a segment (%d digits, a multiple of %d, next to the "
                        "others or of their size); left as it is",
                        os.path.join(self.store_path, name), SEGMENT_NAME_LEN, self.file_size)
        names = self._check_adjacent(names)
        sizes = {}
        for n in names:
            try:
                sizes[n] = self._fs.size(os.path.join(self.store_path, n))
            except FileNotFoundError:
                if self.writable:
                    raise
                # A read-only open of a running store: its cleaning deleted the file since
                # the directory was listed. Its records are gone from the store too.
                log.info("%s was deleted while the store was opened; passed over",
                         os.path.join(self.store_path, n))
        names = [n for n in names if n in sizes]
        damaged_ok = self.file_size in sizes.values() or len(set(sizes.values())) > 1
        for name in names:
            path = os.path.join(self.store_path, name)
            size = sizes[name]
            if size == 0 and name == names[-1]:
                # A file created but never sized (a crash at the wrong moment): nothing was
                # ever written to it, so drop it, as RocketMQ 5.x does.
                log.warning("removing empty last segment %s", path)
                if self.writable:
                    self._fs.remove(path)
                continue
            # A reader sized the store from most of its segments (open_read_only), so even a
            # queue's only file may be the short one: read it, and let verify report it.
            if size < self.file_size and (damaged_ok or not self.writable):
                log.warning("%s is %d bytes, not %d: treating the missing tail as empty",
                            path, size, self.file_size)
                if self.writable:
                    self._fs.create_sized(path, self.file_size)
            elif size > self.file_size and damaged_ok and not self.writable:
                # A reader reads what a segment of this size holds; the rest is reported by
                # verify, and a writable open refuses the file.
                log.warning("%s is %d bytes, not %d: reading its first %d", path, size,
                            self.file_size, self.file_size)
            elif size != self.file_size:
                raise StoreLoadError(
                    f"{path} is {size} bytes but segments here are {self.file_size} bytes: "
                    "the configured file size does not match the store")
            try:
                mf = self.file_type(path, self.file_size, self._k, self._fs, self.writable,
                                    create=False, reserve_window=self.reserve_window,
                                    reserve_window_max=self.reserve_window_max)
            except FileNotFoundError:
                if self.writable:
                    raise
                log.info("%s was deleted while the store was opened; passed over", path)
                continue
            mf.set_positions(self.file_size)
            files.append(mf)
        files.sort(key=lambda f: f.file_from_offset)
        for a, b in zip(files, files[1:]):
            if b.file_from_offset - a.file_from_offset != self.file_size:
                log.error("segments %s and %s are not adjacent", a.file_name, b.file_name)
        self.files = files
        return True

    # ---- offsets -----------------------------------------------------------------------
    @property
    def last_file(self):
        files = self.files
        return files[-1] if files else None

    @property
    def first_file(self):
        files = self.files
        return files[0] if files else None

    def get_min_offset(self):
        f = self.first_file
        return f.file_from_offset if f else -1

    def get_max_offset(self):
        files = self.files          # not last_file: a put's inline dispatch asks once a put
        if not files:
            return 0
        f = files[-1]
        return f.file_from_offset + f.read_position

    def get_max_wrote_position(self):
        f = self.last_file
        return f.file_from_offset + f.wrote_position if f else 0

    def find_by_offset(self, offset, return_first_on_not_found=False):
        """findMappedFileByOffset: the segment holding `offset`, or None."""
        files = self.files
        if not files:
            return None
        first = files[0]
        last = files[-1]
        if offset < first.file_from_offset or offset >= last.file_from_offset + self.file_size:
            return first if return_first_on_not_found else None
        idx = offset // self.file_size - first.file_from_offset // self.file_size
        if 0 <= idx < len(files):
            f = files[idx]
            if f.file_from_offset <= offset < f.file_from_offset + self.file_size:
                return f
        for f in files:
            if f.file_from_offset <= offset < f.file_from_offset + self.file_size:
                return f
        return first if return_first_on_not_found else None

    # ---- growth ------------------------------------------------------------------------
    def get_last_mapped_file(self, start_offset=0, need_create=True):
        """The file to append to: the last one unless full; else a new one when asked."""
        last = self.last_file
        if last is not None and not last.is_full:
            return last
        if not need_create:
            return last
        if last is None:
            create_offset = start_offset - start_offset % self.file_size
        else:
            create_offset = last.file_from_offset + self.file_size
        return self._create(create_offset)

    def path_to_create(self, offset):
        """The path of the file starting at `offset`, its directory created (inside root)."""
        self._fs.ensure_dir(self.store_path, self.root)
        return os.path.join(self.store_path, offset_to_file_name(offset))

    def _create(self, offset):
        with self._lock:
            # Waits for a file being made unless the roll takes a file made already: the
            # one being made may be this very file (its path is made once), or lie past the
            # files made, which are deleted below and must not go before it.
            while self._making is not None and not (
                    self._ready and self._ready[0].file_from_offset == offset):
                self._made.wait()
            last = self.last_file
            if last is not None and last.file_from_offset >= offset:
                return last
            ready, self._ready, prepared = self._ready, [], None
            if ready and ready[0].file_from_offset == offset:
                prepared, self._ready = ready[0], ready[1:]    # the rest stays made ahead
                self.populator.prepared_gone()
            else:
                self._destroy_made(ready)   # made for an end since truncated: never used
            if prepared is not None:
                mf = prepared
                if self.no_readahead_while_written and last is not None:
                    self.populator.give_readahead_back(last)
            elif self._allocator is not None:
                mf = self._allocator.take(self.path_to_create(offset), offset + self.file_size)
            else:
                mf = self._make(offset, last)
                if self.no_readahead_while_written and last is not None and last.is_available:
                    self._fs.advise_random(last.mm, False)
            if not self.files:
                mf.first_create_in_queue = True
            self.files = self.files + [mf]
            now = time.monotonic()
            fast = self._rolled_at is not None and now - self._rolled_at < self.FAST_ROLL_S
            self._rolled_at = now
            self._ahead = 2 if fast else 1
        if fast and self.populator is not None:
            # Made from now on, a whole file's time before the roll (outside the lock, which
            # prepare_next takes).
            self.populator.prepare_after(self, mf)
        if prepared is not None and mf.reserved_position >= self.file_size:
            # Reserved whole already (a file no larger than its window): its writer never
            # asks for a window in it, so the file after it is asked for now (outside the
            # lock, which prepare_next takes).
            self.populator.ask(mf, self.file_size, start=self.file_size, reserve=False,
                               mfq=self)
        return mf

    def _make(self, offset, last):
        window = self.reserve_window
        if self.populator is not None and last is not None:
            window = max(window, last.reserve_window)
        mf = self.file_type(self.path_to_create(offset), self.file_size, self._k, self._fs,
                            reserve_window=window, reserve_window_max=self.reserve_window_max)
        if self.no_readahead_while_written:
            self._fs.advise_random(mf.mm, True)
        return mf

    def _check_adjacent(self, names):
        """The segments a writable load takes: `names`, refused (StoreLoadError) past a gap,
        since recovery would take the first run for the whole queue and write over or
        truncate the rest, as a broker's load refuses it. Segments past the gap that were
        never written (all zeros) are deleted instead: files made ahead that a kill left
        behind a deleted one (earlier builds could delete a file being made ahead after those
        made before it), which hold nothing. A reader takes every segment."""
        gap = next((i for i, (a, b) in enumerate(zip(names, names[1:]), 1)
                    if int(b) - int(a) != self.file_size), None)
        if gap is None or not self.writable:
            return names
        past = [os.path.join(self.store_path, n) for n in names[gap:]]
        if not all(self._fs.holds_only_zeros(p) for p in past):
            raise StoreLoadError(
                f"segments {names[gap - 1]} and {names[gap]} in {self.store_path} are not "
                "adjacent: a segment between them is missing, or one of them is not ours; "
                "move it away")
        for path in reversed(past):
            log.warning("removing %s: past a missing segment and never written (a file made "
                        "ahead, left by a kill)", path)
            self._fs.remove(path)
        return names[:gap]

    def prepare_next(self, after):
        """Make one more file ahead of the writer of `after` (the last file): the one after
        `after`, or after those made already, unless `_ahead` are made. Runs on the
        populator's thread, the making outside the lock: a roll into a file made earlier
        does not wait for it, and a roll into this one waits for it rather than make its path
        too. Returns the file, or None when there is nothing to make (made or being made
        already, or `after` no longer the last file). The caller reserves and populates its
        first window. OSError (a full disk) leaves the roll to the writer, which meets the
        error with a write to refuse."""
        with self._lock:
            files = self.files
            if (self._making is not None or not files or files[-1] is not after
                    or not after.is_available or not self.writable
                    or len(self._ready) >= self._ahead):
                return None
            base = self._ready[-1] if self._ready else after
            offset = self._making = base.file_from_offset + self.file_size
        mf = None
        try:
            mf = self._make(offset, base)
        finally:
            with self._lock:
                # Still the next file to make: the writer may have rolled meanwhile (into a
                # file made before), but nothing was truncated, dropped or closed.
                end = self._ready[-1] if self._ready else \
                    (self.files[-1] if self.files else None)
                kept = (mf is not None and end is not None and self.writable
                        and end.file_from_offset + self.file_size == offset)
                if kept:
                    self._ready = self._ready + [mf]
                    self.populator.prepared_made()
                elif mf is not None:
                    mf.destroy()            # before _making clears: the path is free then
                self._making = None
                self._made.notify_all()
        return mf if kept else None

    def drop_prepared(self):
        """Delete the files made ahead, if any: they were never written, and left on disk
        they would load as empty segments past the end (_remove_files)."""
        self._remove_files(None, ())

    def _remove_files(self, files, gone):
        """Make `files` (None: unchanged) the queue's files and delete `gone`, the files cut
        off its end, and the files made ahead. No file is made until every one of them is
        deleted (DELETING): a file made meanwhile at the path of one not yet deleted would
        take up that file (create_sized keeps an existing file) and lose its units with it
        when the path is removed, the next unit's flush failing on a file that is gone. A
        ConsumeQueue cut did that: the populator made the files after the new last one
        again at once, one under the path of a made-ahead file still being deleted.

        A file still being made is waited for first, so that it is kept (and deleted here)
        or deleted by its maker. The files go from the last: a kill in between leaves the
        segments on disk adjacent, which load requires."""
        with self._lock:
            while self._making is not None:
                self._made.wait()
            if files is not None:
                self.files = files
            made, self._ready = self._ready, []
            self._making = DELETING
        try:
            self._destroy_made(made)
            for f in reversed(gone):
                if self.writable:
                    f.destroy()
                else:
                    f.close()
        finally:
            with self._lock:
                self._making = None
                self._made.notify_all()

    def _destroy_made(self, made):
        """Delete files made ahead (consecutive, in offset order) from the last: a kill
        between two deletions leaves the segments on disk adjacent, which load requires."""
        for mf in reversed(made):
            self.populator.prepared_gone()
            mf.destroy()

    # ---- flush -------------------------------------------------------------------------
    def flush(self, least_pages=0, write_behind=False):
        """Flush the file holding flushed_where; True if nothing moved (MappedFileQueue#flush).
        `write_behind`: see MappedFile.flush."""
        files = self.files
        if files and self.flushed_where < files[0].file_from_offset:
            # Cleaning removed files the flusher had not reached (a ConsumeQueue's go as soon
            # as the CommitLog's minimum passes them). Their bytes need no flush; looking for
            # them would find nothing, and this queue would never be flushed again.
            self.flushed_where = files[0].file_from_offset
        f = self.find_by_offset(self.flushed_where, self.flushed_where == 0)
        if f is None:
            return True
        ts = f.store_timestamp
        old = self.flushed_where
        f.flush(least_pages, self, write_behind)
        unchanged = self.flushed_where == old
        if least_pages == 0:
            self.store_timestamp = ts
        return unchanged

    def flush_round(self, least_pages=0, write_behind=False):
        """A flusher's round: flush() file after file while the flushed offset lies in a
        complete file (each one flushes whole, whatever least_pages), then the file being
        written as flush(least_pages) would. MappedFileQueue#flush takes one file a call, and
        a flusher calling it once an interval fell a file an interval behind any burst that
        filled several: with small files, seconds of acknowledged ASYNC_FLUSH writes unsynced
        after the writer stopped. True if nothing moved."""
        return self._round(lambda: self.flushed_where, self.flush, least_pages, write_behind)

    def commit_round(self, least_pages=0):
        """commit() as flush_round flushes: every complete file, then the one being written."""
        return self._round(lambda: self.committed_where, self.commit, least_pages)

    def _round(self, where, step, *args):
        """step(*args) while where() lies in a complete file (not the last), then once for the
        file being written; True if nothing moved. Bounded: a writer may keep rolling."""
        for i in range(len(self.files) + 10):
            last = self.last_file
            behind = last is not None and where() < last.file_from_offset
            if step(*args):
                return i == 0
            if not behind:
                return False
        return False

    def flush_through(self):
        """Full flushes of every file written so far (flush_round(0))."""
        self.flush_round(0)

    def commit_through(self):
        """Full commits of every write buffer filled so far (commit_round(0))."""
        self.commit_round(0)

    def flush_due(self, least_pages):
        """Whether flush(least_pages) would sync anything now: a file before the last one is
        not flushed to its end, or the last one is able to flush. A periodic round of many
        queues asks this first, because a queue written a unit at a time keeps one partial
        page dirty for many rounds, and the whole flush path found that out at ~10 µs of GIL
        a queue (40 000 such queues held the GIL 0.3-0.4 s of every second)."""
        files = self.files
        if not files:
            return False
        last = files[-1]
        if self.flushed_where < last.file_from_offset:
            return True
        return last.is_able_to_flush(least_pages)

    def flush_plan(self, plan, least_pages=0):
        """Add to `plan` (a FlushPlan) what flush(least_pages), called until nothing moves,
        would make durable now, for a sync of the whole file system to cover, after which
        plan.settle() moves the positions as those flushes would have. Returns how many
        files it added."""
        where = self.flushed_where
        size = self.file_size
        added = 0
        for f in self.files:
            if f.file_from_offset + size <= where:
                continue
            truncations = f.truncations
            ts = f.store_timestamp      # before the end, as flush reads them
            end = f.flush_end(least_pages)
            if end is None:
                break
            plan.add(self, f, end, ts, truncations)
            added += 1
        return added

    # ---- truncation and deletion ---------------------------------------------------------
    def truncate_dirty_files(self, offset):
        """Drop everything at or after `offset`: later files are deleted, the containing one
        gets its three positions set to offset % size (MappedFileQueue#truncateDirtyFiles).
        The OSError of a failed sync of the zeroed tail (MappedFile.zero_tail) is raised once
        the cut is done."""
        keep = []
        gone = []
        failed = None
        for f in self.files:
            if f.file_from_offset + self.file_size > offset:
                if offset >= f.file_from_offset:
                    f.set_positions(offset % self.file_size)
                    if self.writable:
                        try:
                            f.zero_tail(offset % self.file_size)
                        except OSError as exc:
                            failed = exc
                    keep.append(f)
                else:
                    gone.append(f)
            else:
                keep.append(f)
        self._remove_files(keep, gone)
        if failed is not None:
            raise failed

    def mark_flushed(self, flushed, store_timestamp):
        """[.., flushed) was synced by a caller (the group commit's own syncs): the queue's and
        the files' flushed positions, and the last flushed store time, follow, as flush(0)
        leaves them."""
        old = self.flushed_where
        for f in reversed(self.files):          # the newest first: one or two files moved
            lo = f.file_from_offset
            if lo + f.file_size <= old:
                break
            if lo < flushed:
                f.flushed_position = max(f.flushed_position, min(flushed - lo, f.file_size))
        self.flushed_where = flushed
        self.store_timestamp = store_timestamp

    def commit(self, least_pages=0):
        """Commit the file holding committed_where; True if nothing moved."""
        f = self.find_by_offset(self.committed_where, self.committed_where == 0)
        if f is None:
            return True
        where = f.file_from_offset + f.commit(least_pages)
        unchanged = where == self.committed_where
        self.committed_where = where
        return unchanged

    # ---- the page cache behind the writer --------------------------------------------
    def drop_cache_below(self, offset):
        """Evict the page cache of the files' bytes below `offset`, which the caller knows
        to be flushed (clean), from where the last call stopped: off this process's page
        tables, then out of the cache; pages another process maps stay (the kernel skips
        them). A file removed or being destroyed meanwhile is passed over. Where a truncation
        moved `offset` back, the mark follows it, and what is written again there is
        evicted once passed again."""
        files = self.files
        start = max(min(self._cache_dropped, offset), files[0].file_from_offset if files else 0)
        for mf in files:
            if mf.file_from_offset >= offset:
                break
            lo = max(start, mf.file_from_offset) - mf.file_from_offset
            hi = min(offset, mf.file_from_offset + mf.file_size) - mf.file_from_offset
            lo -= lo % F.OS_PAGE_SIZE
            hi -= hi % F.OS_PAGE_SIZE
            if hi <= lo or not mf.hold():
                continue        # nothing on whole pages, or the file is being destroyed
            try:
                # Off this process's page tables first (a reader may have mapped pages back
                # since their flush): the kernel evicts no page a mapping holds.
                self._fs.unmap_written(mf.mm, lo, hi - lo)
                self._fs.drop_cached_range(mf.path, lo, hi - lo)
            except FileNotFoundError:
                pass            # cleaned meanwhile: nothing of it is cached any more
            finally:
                mf.release()
        self._cache_dropped = max(offset, 0)

    def delete_files(self, files):
        """Drop destroyed files from the list (MappedFileQueue#deleteExpiredFile). Under the
        queue lock: a put rolling to a new file rebinds the list concurrently."""
        gone = set(map(id, files))
        with self._lock:
            current = self.files
            n = len(files)
            if all(id(f) in gone for f in current[:n]):
                self.files = current[n:]        # the usual case: a prefix, sliced in C
            else:
                self.files = [f for f in current if id(f) not in gone]

    def retry_delete_first_file(self, now_ms, interval_forcibly_ms):
        """retryDeleteFirstFile: finish destroying a first file that an earlier destroy left
        marked unavailable because a reader still held it. True if it is gone now."""
        first = self.first_file
        if first is None or first.is_available:
            return False
        log.warning("the mapped file %s was destroyed once, but is still alive", first.path)
        if first.try_destroy(now_ms, interval_forcibly_ms):
            self.delete_files([first])
            return True
        return False

    def delete_expired_file_by_offset(self, offset, unit_size, now_ms,
                                      interval_forcibly_ms=60_000):
        """deleteExpiredFileByOffset: destroy leading files whose last unit's physical offset is
        below `offset`; never the last file. Returns the number deleted.

        A cut (ConsumeQueue.truncate_dirty_logic_files, under the dispatch lock cleaning does
        not take) may delete the last files and zero the tail of the file before them while
        this runs: a file it made the last, or deleted, since the list was taken ends the
        round, and one it truncated since its count was read is not destroyed (its last
        unit, zeroed, reads as offset 0)."""
        files = self.files[:-1]
        deleted = []
        for f in files:
            truncations = f.truncations
            current = self.files
            if not current or f is current[-1] or f not in current:
                break
            if not f.is_available:      # a hanged file from an earlier round
                destroy = True
            else:
                last_phy = f.last_unit_phy(unit_size)
                if last_phy is None:    # unmapped meanwhile
                    break
                destroy = last_phy < offset
            if destroy and f.try_destroy(now_ms, interval_forcibly_ms, truncations):
                deleted.append(f)
            else:
                break
        if deleted:
            self.delete_files(deleted)
        return len(deleted)

    def delete_last_file(self):
        files = self.files
        self._remove_files(files[:-1], files[-1:])

    def destroy(self):
        files = self.files
        self.flushed_where = self.committed_where = 0
        self._remove_files([], files)

    def close(self):
        for f in self.files:
            f.close()
        self.files = []
        self.drop_prepared()
