# SPDX-License-Identifier: Apache-2.0
"""IndexFile: one hash-indexed file of message keys (doc/02 §2; layout in csrc/rs_format.h).

A 40-byte header, `slot_num` 4-byte hash slots and `index_num` 20-byte entries, mapped through
a MappedFile (so `fs.py` does every file operation and clean-up waits for borrowers). The
kernels do the byte work on the mapping; this class only knows where the file is and what its
header says. Written by the reput thread only; readers borrow the mapping with hold/release.
"""
import datetime
import time

import numpy as np

from . import format as F
from .mapped_file import MappedFile, read_cold

_HEAD = F.INDEX_HEADER.struct
_I32 = F.I32
_I64 = F.I64
_ENTRY = F.INDEX_ENTRY.struct
# Entries are appended in order, so their blocks are reserved this far ahead (the slot table,
# written at random, is reserved whole when the file is created).
ENTRY_RESERVE_WINDOW = 64 * 1024
# Doubling up to this while a file fills. One index file is written at a time, and at 3 M
# keyed messages/s its entries grow by 120-130 MB/s: a 4 MiB window's half-window lead lasted
# 16 ms, and the writer reserved the next window itself, once behind a 57 ms fallocate
# (doc/performance.md, "The index writer's own reservations").
ENTRY_RESERVE_WINDOW_MAX = 32 << 20
# A new file of at least this many large folios is written in them (see IndexFile): its
# reservations then fall on whole folios, which a small file would reserve whole at once.
LARGE_FOLIOS_FROM = 4


def _index_count(mm):
    """The header's indexCount, read as 1 when not above 0 (IndexHeader#load)."""
    n = _I32.unpack_from(mm, F.INDEX_POS_INDEX_COUNT)[0]
    return n if n > 0 else 1


def index_file_size(slot_num, index_num):
    """Bytes of an index file: 40 + slot_num * 4 + index_num * 20."""
    return F.INDEX_HEADER_SIZE + slot_num * F.INDEX_SLOT_SIZE + index_num * F.INDEX_ENTRY_SIZE


def time_millis_to_human_string(ms):
    """UtilAll#timeMillisToHumanString: local time as yyyyMMddHHmmssSSS."""
    t = time.localtime(ms // 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + "%03d" % (ms % 1000)


def human_string_to_time_millis(name):
    """The epoch milliseconds a yyyyMMddHHmmssSSS local-time file name stands for."""
    dt = datetime.datetime.strptime(name[:14], "%Y%m%d%H%M%S")
    return int(time.mktime(dt.timetuple())) * 1000 + int(name[14:17])


class IndexFile:
    """One index file. `end_phy_offset` / `end_timestamp` pre-seed a new file's header with
    the previous file's end values (IndexFile's constructor), as the broker does on roll."""

    __slots__ = ("mf", "slot_num", "index_num", "file_size", "_k", "_fs", "populator")

    def __init__(self, path, slot_num, index_num, kernels, fs, writable=True,
                 end_phy_offset=0, end_timestamp=0, populator=None, reserve=True):
        """`reserve=False`: a new file is only sized and mapped; its maker reserves the
        header, the slot table and the first entries (reserve_entries) before any write
        (IndexService makes the next file ahead so, a step at a time)."""
        self.slot_num = slot_num
        self.index_num = index_num
        self.file_size = index_file_size(slot_num, index_num)
        self._k = kernels
        self._fs = fs
        fresh = writable and not fs.exists(path)
        # Writable: create, or extend a short file (Java's RandomAccessFile.setLength does).
        # Read-only: map as is; a short file becomes a zero-padded private copy.
        self.mf = MappedFile(path, self.file_size, kernels, fs, writable=writable,
                             create=writable, reserve_window=ENTRY_RESERVE_WINDOW,
                             reserve_window_max=ENTRY_RESERVE_WINDOW_MAX)
        # No readahead: slots are written and read at random, entries appended a page at a
        # time and read along hash chains. With readahead a writer's first touch of a page
        # would zero-fill a whole window (read_ahead_kb, 8 MiB on many disks) in one fault,
        # in the putting thread when dispatch runs inline: a put stalled for tens of ms.
        fs.advise_random(self.mf.mm, True)
        folio = fs.large_folio_size()
        if fresh and folio and self.file_size >= LARGE_FOLIOS_FROM * folio:
            # Written in large page-cache folios (2 MiB), which reads then map whole: a key
            # query's chain walk is a few loads at random over hundreds of MB of entries,
            # each a TLB miss as well as a cache miss in 4 KiB pages. With 10 M keys (two
            # files) queries ran 1.13x faster, and populating a folio takes about an eighth
            # of the CPU of its pages one by one (doc/performance.md, "Index files in large
            # folios"). Only files made here: a file loaded from disk is read back a page
            # per miss, not a folio, so a store larger than memory does not read 2 MiB for
            # each entry a cold query needs.
            self.mf.use_large_folios(folio)
        # A PopulateAheadService reserving and populating entry windows off the writer's
        # thread; None: the writer reserves, and faults pages. The slot table is not
        # populated: its pages are written at random, and only those keys reach.
        self.populator = populator
        if fresh and reserve:
            try:
                self.reserve_entries(1)
            except OSError:
                # A full disk: leave no file behind, so the next attempt starts afresh.
                self.mf.destroy(0)
                raise
            self.begin_after(end_phy_offset, end_timestamp)

    def begin_after(self, end_phy_offset, end_timestamp):
        """Pre-seed a new file's header with the previous file's end values (IndexFile's
        constructor), as the broker does on roll; 0 leaves a field zero."""
        mm = self.mf.mm
        if end_phy_offset > 0:
            _I64.pack_into(mm, F.INDEX_POS_BEGIN_PHY_OFFSET, end_phy_offset)
            _I64.pack_into(mm, F.INDEX_POS_END_PHY_OFFSET, end_phy_offset)
        if end_timestamp > 0:
            _I64.pack_into(mm, F.INDEX_POS_BEGIN_TIMESTAMP, end_timestamp)
            _I64.pack_into(mm, F.INDEX_POS_END_TIMESTAMP, end_timestamp)

    # ---- header (read back from the mapping, where every put writes it) ----------------------
    @property
    def path(self):
        return self.mf.path

    @property
    def file_name(self):
        return self.mf.file_name

    @property
    def mm(self):
        return self.mf.mm

    def header(self):
        """(beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount,
        indexCount), indexCount <= 0 read as 1 (IndexHeader#load)."""
        h = _HEAD.unpack_from(self.mf.mm, 0)
        return h if h[5] > 0 else h[:5] + (1,)

    # The header's fields, read by the cleaning thread, at load, at a roll and by a query
    # per file: an old file's header page may be off the page cache, so without the GIL.
    def _header_i64(self, pos):
        return _I64.unpack(read_cold(self.mf.mm, pos, 8))[0]

    @property
    def begin_timestamp(self):
        return self._header_i64(F.INDEX_POS_BEGIN_TIMESTAMP)

    @property
    def end_timestamp(self):
        return self._header_i64(F.INDEX_POS_END_TIMESTAMP)

    @property
    def begin_phy_offset(self):
        return self._header_i64(F.INDEX_POS_BEGIN_PHY_OFFSET)

    @property
    def end_phy_offset(self):
        return self._header_i64(F.INDEX_POS_END_PHY_OFFSET)

    @property
    def hash_slot_count(self):
        return _I32.unpack_from(self.mf.mm, F.INDEX_POS_HASH_SLOT_COUNT)[0]

    @property
    def index_count(self):
        return _index_count(self.mf.mm)

    @property
    def is_write_full(self):
        return self.index_count >= self.index_num

    def open_after(self, phy_offset):
        """Not full, and every record indexed so far lies before CommitLog offset `phy_offset`
        (not is_write_full and end_phy_offset < phy_offset, in one call: a put's inline
        dispatch asks this once a put)."""
        mm = self.mf.mm
        return (_index_count(mm) < self.index_num
                and _I64.unpack_from(mm, F.INDEX_POS_END_PHY_OFFSET)[0] < phy_offset)

    def is_time_matched(self, begin, end):
        """IndexFile#isTimeMatched: [begin, end] overlaps [beginTimestamp, endTimestamp]."""
        fb = self.begin_timestamp
        fe = self.end_timestamp
        return (begin < fb and end > fe) or fb <= begin <= fe or fb <= end <= fe

    # ---- writes (reput thread only) -----------------------------------------------------------
    def reserve_entries(self, n):
        """Reserve the header, the slot table and the next `n` entries before a put writes
        there (OSError(ENOSPC) on a full disk, never SIGBUS). Writers write entries below
        the file's refill_position; past it a populator is asked for the next window."""
        mf = self.mf
        table = self.table_end
        if table > mf.reserved_position:
            # Before the header is read: on tmpfs even a read through the mapping allocates
            # the page, so a full disk would raise SIGBUS at index_count.
            mf.reserve(table)
        end = min(self.file_size, table + (self.index_count + n) * F.INDEX_ENTRY_SIZE)
        if end > mf.refill_position:
            if self.populator is not None:
                self.populator.refill(mf, end)
            elif end > mf.reserved_position:
                mf.reserve(end)

    @property
    def table_end(self):
        """Where the header and the slot table end and the entries begin."""
        return F.INDEX_HEADER_SIZE + self.slot_num * F.INDEX_SLOT_SIZE

    def put_key(self, key, phy_offset, store_timestamp):
        """IndexFile#putKey of the UTF-8 key (`topic#key`, str or bytes); False when full."""
        if isinstance(key, str):
            key = key.encode("utf-8")
        self.reserve_entries(1)
        return self._k.index_put(self.mf.mm, self.slot_num, self.index_num,
                                 self._k.index_hash(key), phy_offset, store_timestamp) > 0

    def put_batch(self, key_hashes, phy_offsets, store_timestamps):
        """Put keys in order until the file is full; returns how many were put."""
        self.reserve_entries(len(key_hashes))
        return self._k.index_put_batch(self.mf.mm, self.slot_num, self.index_num, key_hashes,
                                       phy_offsets, store_timestamps)

    # ---- reads --------------------------------------------------------------------------------
    def select_phy_offsets(self, key_hash, max_num, begin, end, out=None):
        """IndexFile#selectPhyOffset: phyOffsets of `key_hash` stored in [begin, end], newest
        first, at most max_num. `out` (an int64 array) avoids an allocation per call."""
        if out is None:
            out = np.empty(max(0, max_num), dtype=np.int64)
        if not self.mf.hold():
            return []
        try:
            n = self._k.index_lookup(self.mf.mm, self.slot_num, self.index_num, key_hash, begin,
                                     end, max_num, out)
        finally:
            self.mf.release()
        return out[:n].tolist()

    def arrays(self):
        """Zero-copy numpy views of the whole file, for analytics: (header, slots, entries) with
        format.INDEX_HEADER_DTYPE (one row), big-endian int32 slots, and INDEX_ENTRY_DTYPE rows
        (entry 0 included, unused). The views pin the mapping: drop them before close()."""
        mm = self.mf.mm
        header = np.frombuffer(mm, dtype=F.INDEX_HEADER_DTYPE, count=1)
        slots = np.frombuffer(mm, dtype=F.INDEX_SLOT_DTYPE, count=self.slot_num,
                              offset=F.INDEX_HEADER_SIZE)
        entries = np.frombuffer(mm, dtype=F.INDEX_ENTRY_DTYPE, count=self.index_num,
                                offset=F.INDEX_HEADER_SIZE + self.slot_num * F.INDEX_SLOT_SIZE)
        return header, slots, entries

    # ---- lifecycle ----------------------------------------------------------------------------
    def flush(self):
        """Make the whole file durable (IndexFile#flush: the header is already written through).
        Called once the file is full (no entry is written to it again) and at shutdown, so its
        pages go off the page tables first (FileSystem.sync_written): up to 100 000 pages
        otherwise each cost a TLB flush on every core as they are written back."""
        if not self.mf.writable or not self.mf.hold():
            return
        try:
            self._fs.sync_written(self._k, self.mf.mm, self.mf.path, 0, self.file_size)
        finally:
            self.mf.release()

    def close(self):
        return self.mf.close()

    def destroy(self, wait_s=3.0):
        """Unmap and delete; False while a borrower (or a numpy view) still pins it."""
        return self.mf.destroy(wait_s)

    def __repr__(self):
        return f"IndexFile({self.file_name}, count={self.index_count}/{self.index_num})"


def valid_geometry(path, fs, slot_num, index_num):
    """True when the file at `path` reads consistently as `slot_num` slots and `index_num`
    entries: the size matches, every used slot points at an entry of its own slot and every
    entry's prevIndex at an older entry of the same slot. Used to infer a foreign store's
    sizes; only the header, the slots and the used entries are read (_HoleSafe)."""
    size = fs.size(path)
    if slot_num < 1 or index_num < 2 or size != index_file_size(slot_num, index_num):
        return False
    data = _HoleSafe(path, fs, size)
    count = _index_count(data[:F.INDEX_HEADER_SIZE])
    if count > index_num:
        return False
    base = F.INDEX_HEADER_SIZE + slot_num * F.INDEX_SLOT_SIZE
    return _consistent(data[:base + count * F.INDEX_ENTRY_SIZE], slot_num, index_num)


def _consistent(mm, slot_num, index_num):
    count = _index_count(mm)
    if count > index_num:
        return False
    base = F.INDEX_HEADER_SIZE + slot_num * F.INDEX_SLOT_SIZE
    if any(mm[base:base + F.INDEX_ENTRY_SIZE]):
        return False
    slots = np.frombuffer(mm, dtype=F.INDEX_SLOT_DTYPE, count=slot_num, offset=F.INDEX_HEADER_SIZE)
    entries = np.frombuffer(mm, dtype=F.INDEX_ENTRY_DTYPE, count=count, offset=base)
    try:
        if ((slots < 0) | (slots >= count)).any():
            return False
        hashes = entries["key_hash"].astype(np.int64)
        if (hashes < 0).any():
            return False
        used = np.nonzero(slots)[0]
        if (hashes[slots[used]] % slot_num != used).any():
            return False
        prev = entries["prev_index"][1:].astype(np.int64)
        idx = np.arange(1, count)
        linked = prev > 0
        if ((prev < 0) | (prev >= idx)).any():
            return False
        return bool((hashes[prev[linked]] % slot_num == hashes[idx[linked]] % slot_num).all())
    finally:
        del slots, entries                # views of `mm` (a mapping pinned by them)


class _HoleSafe:
    """A file's bytes by slices, read with pread (FileSystem.read_at): infer_geometry and
    valid_geometry read files a store may not have finished writing, whose holes a mapping
    would allocate on tmpfs (on a full one: SIGBUS, seen after a writable open that failed
    for the full disk had made an index file and reserved only its first page)."""

    def __init__(self, path, fs, size):
        self.path, self.fs, self.size = path, fs, size

    def __len__(self):
        return self.size

    def __getitem__(self, s):
        start, stop, _ = s.indices(self.size)
        data = self.fs.read_at(self.path, start, max(0, stop - start))
        return data + bytes(max(0, stop - start) - len(data))     # a short file: zeros


def _ends_where_entries_end(mm, slot_num, index_num, count):
    """O(1) check of a geometry against a file holding `count` - 1 entries: the last used
    entry holds data and the first unused one is zero. Two geometries of one file size shift
    the entries by whole entries, so at most one of them passes."""
    if count > index_num:
        return False
    last = F.INDEX_HEADER_SIZE + slot_num * F.INDEX_SLOT_SIZE + \
        (count - 1) * F.INDEX_ENTRY_SIZE
    entry = mm[last:last + F.INDEX_ENTRY_SIZE]
    key_hash, _, _, prev = _ENTRY.unpack_from(entry, 0)
    if not any(entry) or key_hash < 0 or not 0 <= prev < count - 1:
        return False
    return count == index_num or not any(mm[last + F.INDEX_ENTRY_SIZE:
                                            last + 2 * F.INDEX_ENTRY_SIZE])


def _data_end(mm, lo, chunk=1 << 20):
    """One past the last non-zero byte of `mm` at or after `lo` (`lo` if none)."""
    end = len(mm)
    while end > lo:
        start = max(lo, end - chunk)
        data = mm[start:end].rstrip(b"\0")
        if data:
            return start + len(data)
        end = start
    return lo


def _geometry_from_data_end(mm, size, count):
    """The (slot_num, index_num) of file size `size` whose `count` - 1 entries end where the
    file's data ends, or None."""
    end = _data_end(mm, F.INDEX_HEADER_SIZE)
    fixed = F.INDEX_HEADER_SIZE + count * F.INDEX_ENTRY_SIZE
    # The last entry spans (end - 20, end]: 4 * slot_num lies in [end - fixed, end - fixed + 20).
    for s in range(max(1, (end - fixed) // 4), (end - fixed + F.INDEX_ENTRY_SIZE) // 4 + 1):
        rest = size - F.INDEX_HEADER_SIZE - s * F.INDEX_SLOT_SIZE
        if rest <= 0 or rest % F.INDEX_ENTRY_SIZE:
            continue
        n = rest // F.INDEX_ENTRY_SIZE
        if n >= max(count, 2) and _ends_where_entries_end(mm, s, n, count):
            return s, n
    return None


__all__ = ["IndexFile", "index_file_size", "time_millis_to_human_string",
           "human_string_to_time_millis", "valid_geometry", "infer_geometry"]


def majority_size(paths, fs):
    """The paths of the size more than half of `paths` share, or None when no size does: index
    files all have one size, so the odd ones out are damaged (a truncated copy, say)."""
    by_size = {}
    for p in paths:
        by_size.setdefault(fs.size(p), []).append(p)
    best = max(by_size.values(), key=len, default=[])
    return best if 2 * len(best) > len(paths) else None


def infer_geometry(paths, fs, slot_num, index_num):
    """(slot_num, index_num) of the index files at `paths` (written with a maxHashSlotNum /
    maxIndexNum that may not be the configured ones), or None when the files do not tell.

    A file's size alone does not fix both numbers (64 slots and 500 entries make the same
    size as 164 and 480), so the fullest file decides: its indexCount says how many entries
    are used, and the geometry must put the last of them where the file's data ends. The
    configured numbers are tried first, in O(1); a file of the configured size is read to its
    data end only when they fail that test, and another geometry must then also pass
    `valid_geometry`. Files without a single entry say nothing: the configured numbers are
    taken if the size fits, else RocketMQ's ratio index_num = 4 * slot_num if it fits. Files
    of another size than most are damaged and say nothing either."""
    if not paths:
        return slot_num, index_num
    paths = majority_size(paths, fs)
    if paths is None:
        return None
    size = fs.size(paths[0])
    configured = size == index_file_size(slot_num, index_num)
    if size < F.INDEX_HEADER_SIZE:
        return None
    counts = [(_I32.unpack_from(_HoleSafe(p, fs, size)[:F.INDEX_HEADER_SIZE],
                                F.INDEX_POS_INDEX_COUNT)[0], p) for p in paths]
    # A header whose indexCount no file of this size can hold is damaged: it tells nothing.
    most = (size - F.INDEX_HEADER_SIZE) // F.INDEX_ENTRY_SIZE + 1
    counts = [(c, p) for c, p in counts if c <= most] or [(0, paths[0])]
    ranked = sorted(counts, reverse=True)
    if ranked[0][0] <= 1:
        if configured:
            return slot_num, index_num
        if (size - F.INDEX_HEADER_SIZE) % 84 == 0:
            s = (size - F.INDEX_HEADER_SIZE) // 84
            return s, 4 * s
        return None
    # The fullest files in turn: damage to one (its last entries, its slots) must not leave
    # the numbers untold while the others tell them.
    for count, fullest in ranked[:_GEOMETRY_WITNESSES]:
        if count <= 1:
            break
        found = _geometry_told_by(fullest, fs, size, count, counts, slot_num, index_num,
                                  configured)
        if found is not None:
            return found
    return None


# How many of the fullest index files infer_geometry asks before it gives up.
_GEOMETRY_WITNESSES = 8


def _geometry_told_by(fullest, fs, size, count, counts, slot_num, index_num, configured):
    """infer_geometry's answer from one file holding `count` - 1 entries, or None."""
    mm = _HoleSafe(fullest, fs, size)
    if configured and _ends_where_entries_end(mm, slot_num, index_num, count):
        return slot_num, index_num
    found = _geometry_from_data_end(mm, size, count)
    if found is not None and found != (slot_num, index_num) and \
            valid_geometry(fullest, fs, *found):
        return found
    if configured:
        return slot_num, index_num
    # The last entry is all zeros (key hash 0 at offset 0): try the counts and the ratio.
    candidates = []
    for c, _ in sorted(counts, reverse=True):
        rest = size - F.INDEX_HEADER_SIZE - c * F.INDEX_ENTRY_SIZE
        if c >= 2 and rest > 0 and rest % F.INDEX_SLOT_SIZE == 0:
            candidates.append((rest // F.INDEX_SLOT_SIZE, c))
    if (size - F.INDEX_HEADER_SIZE) % 84 == 0:
        s = (size - F.INDEX_HEADER_SIZE) // 84
        candidates.append((s, 4 * s))
    for s, n in dict.fromkeys(candidates):
        if count <= n and valid_geometry(fullest, fs, s, n):
            return s, n
    return None
