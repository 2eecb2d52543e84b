# SPDX-License-Identifier: Apache-2.0
"""IndexService: the reput thread's index dispatcher, the file list, and key queries
(doc/02 §2.4-2.8, RocketMQ IndexService.java).

The reput thread is the only writer of index files. Readers (queries) and the clean thread take
`index_file_list` once: it is replaced, never mutated, under `_lock`.
"""
import logging
import os
import threading

import numpy as np

from . import format as F
from .dispatch import Dispatcher
from .errors import StoreLoadError
from .fs import CREATING_SUFFIX
from .index_file import (IndexFile, human_string_to_time_millis, index_file_size,
                         infer_geometry, time_millis_to_human_string)
from .mapped_file_queue import drop_creating_leftovers, is_index_name, split_segment_names

log = logging.getLogger(__name__)

LONG_MAX = (1 << 63) - 1
# The next index file, made ahead of its roll (IndexService._spare) as INDEX_MADE_AHEAD in a
# directory of its own beside index/: a broker lists and loads every file in index/, and would
# take one there for its last file. Not in the store root, which the stats thread's rename of
# its runtime file locks (and dirties) every second: the roll's rename out of the root waited
# 50 ms behind it once, and for the root directory's block under writeback before.
INDEX_AHEAD_DIR = "index.ahead"
INDEX_MADE_AHEAD = "index" + CREATING_SUFFIX
_SECOND_MS = 1000              # an entry's time resolution
_KEYS = b"KEYS\x01"
_UNIQ_KEY = b"UNIQ_KEY\x01"


def _property(props, name):
    """The value of property `name` (b"NAME\\x01") in a stored properties string, as
    string2messageProperties reads it: the last segment of that name with a non-empty value
    wins. None when absent or empty."""
    i = props.rfind(b"\x02" + name)
    if i >= 0:
        start = i + 1 + len(name)
    elif props.startswith(name):
        start = len(name)
    else:
        return None
    j = props.find(b"\x02", start)
    value = props[start:] if j < 0 else props[start:j]
    if value:
        return value
    # An empty last value is skipped by the parser, so an earlier segment may still count.
    head = props[:max(0, i)]
    return _property(head, name) if i > 0 else None


def index_keys(props):
    """The keys IndexService#buildIndex indexes for a record, in order: UNIQ_KEY (if present),
    then each non-empty piece of KEYS split on a single space. Bytes in, bytes out."""
    out = []
    uniq = _property(props, _UNIQ_KEY)
    if uniq is not None:
        out.append(uniq)
    keys = _property(props, _KEYS)
    if keys is not None:
        out.extend(k for k in keys.split(b" ") if k)
    return out


def keys_held_at(files, phy_offset):
    """How many entries the newest of `files` end with that point at `phy_offset`: the keys
    of that record already indexed (one record's keys may straddle two files)."""
    held = 0
    for f in reversed(files):
        _, _, entries = f.arrays()
        offsets = tail = None
        try:
            offsets = entries["phy_offset"][1:f.index_count]
            tail = np.flatnonzero(offsets != phy_offset)
            held += len(offsets) - (int(tail[-1]) + 1 if len(tail) else 0)
            if len(tail):
                break
        finally:
            del entries, offsets, tail          # the views pin the mapping
    return held


class IndexService(Dispatcher):
    """The store's index: files under `<root>/index`, one dispatcher pass per record batch.
    `checkpoint` (given to load) records how far the index is flushed (indexMsgTimestamp)."""

    def __init__(self, root, config, kernels, fs, writable=True):
        self._root = root
        self._k = kernels
        self._fs = fs
        self.store_path = os.path.join(root, "index")
        self.hash_slot_num = config.max_hash_slot_num
        self.index_num = config.max_index_num
        self._config = config
        self.writable = writable
        self.checkpoint = None
        self.index_file_list = []       # replaced (never mutated) under _lock
        self._lock = threading.Lock()
        self._pending_flush = []        # full files awaiting flush; guarded by _lock
        self.unreadable = []            # paths load() left out: their geometry is unknown
        self.dropped = []               # names load() destroyed as past the checkpoint
        # The backend's compiled row loop (index_dispatch), if it has one.
        self._k_dispatch = getattr(self._k, "index_dispatch", None)
        # The backend's IndexWorker, if it has one: a batch put's keys are put on its thread
        # while the putter goes on (PutDispatch hands them over). Every entry point below that
        # reads or writes the files settles its job first (settle), so that in this process
        # a key is found as soon as its put returned, as before.
        self.worker = None
        make = getattr(self._k, "IndexWorker", None)
        if writable and make is not None:
            try:
                self.worker = make(self._finish_worker)
            except OSError as exc:
                log.warning("no index worker thread (%s): a put's keys are put by the putting "
                            "thread", exc)
        # The store's PopulateAheadService, given to every file opened or made from now on.
        self.populator = None
        # The next file, made ahead on the populator's thread as INDEX_MADE_AHEAD in
        # INDEX_AHEAD_DIR, and renamed into index/ at the roll, to the time of the record that
        # needs it. Making a file reserves its 20 MB slot table: in the dispatching thread,
        # which is the putting one when dispatch runs inline, a fallocate behind writeback
        # stalled puts (doc/performance.md, "Sustained writes"). Its header is seeded at the
        # roll, so it holds only zeros until then: a crash leaves a leftover that a writable
        # load removes. Guarded by _lock; None: a roll makes its file itself.
        self._spare = None
        self._ahead_dir = os.path.join(root, INDEX_AHEAD_DIR)
        self._ahead_path = os.path.join(self._ahead_dir, INDEX_MADE_AHEAD)
        self._made_ahead_dir = False    # made by _make_spare: removed at close when empty
        self._making = None             # the next file while its table is being reserved
        self._closed = False

    # ---- load ---------------------------------------------------------------------------------
    def load(self, last_exit_ok, checkpoint):
        """IndexService#load: open the files in name order, with the hash slot and entry
        numbers the files were written with (infer_geometry), whatever the config says: a
        file is never resized or its header rewritten. A writable store refuses files whose
        numbers cannot be told (StoreLoadError); a read-only one leaves them out (listed in
        `unreadable`).

        After an abnormal exit, destroy the files whose endTimestamp is past the checkpoint's
        indexMsgTimestamp, and every file after the first of them, so the survivors are a
        flushed prefix and `end_phy_offset` says where recovery must rebuild from (doc/02
        §2.7). A read-only store destroys nothing."""
        self.checkpoint = checkpoint
        self._closed = False
        if self.writable:
            self._drop_made_ahead_leftover()
        paths = []
        names, strays = split_segment_names(self._fs, self.store_path, None, is_index_name)
        strays = drop_creating_leftovers(self._fs, self.store_path, strays, is_index_name,
                                         self.writable)
        for name in strays:
            log.warning("ignoring %s: not an index file name (yyyyMMddHHmmssSSS); left as it "
                        "is", os.path.join(self.store_path, name))
        for name in names:
            path = os.path.join(self.store_path, name)
            if self._fs.size(path) == 0:
                # Sized under a temporary name and renamed, so only damage leaves an empty
                # file: it holds nothing.
                log.warning("ignoring empty index file %s", path)
                if self.writable:
                    self._fs.remove(path)
                continue
            paths.append(path)
        geometry = infer_geometry(paths, self._fs, self.hash_slot_num, self.index_num)
        if geometry is None:
            sizes = sorted({self._fs.size(p) for p in paths})
            what = (f"{self.store_path}: cannot tell the hash slot and entry numbers of the "
                    f"index files (sizes {', '.join(map(str, sizes))} bytes; configured "
                    f"{self.hash_slot_num} slots and {self.index_num} entries make "
                    f"{index_file_size(self.hash_slot_num, self.index_num)})")
            if self.writable:
                raise StoreLoadError(what + ": set max_hash_slot_num and max_index_num to "
                                     "the values they were written with")
            log.warning("%s; key queries will find nothing", what)
            self.unreadable = paths
            self.index_file_list = []
            return True
        size = index_file_size(*geometry)
        damaged = [p for p in paths if self._fs.size(p) != size]
        if damaged:
            named = ", ".join(f"{os.path.basename(p)} ({self._fs.size(p)} bytes)"
                              for p in damaged)
            what = (f"{self.store_path}: index file(s) {named} are not the {size} bytes of "
                    "the others: damaged")
            if self.writable:
                raise StoreLoadError(what + "; `rocketstore rebuild-index` rebuilds the index")
            log.warning("%s; left out, so key queries miss their keys", what)
            self.unreadable = damaged
            paths = [p for p in paths if p not in damaged]
        if geometry != (self.hash_slot_num, self.index_num):
            log.warning("%s: index files have %d hash slots and %d entries, not the configured "
                        "%d and %d: using the files' numbers", self.store_path, geometry[0],
                        geometry[1], self.hash_slot_num, self.index_num)
            self.hash_slot_num, self.index_num = geometry
        files = []
        index_ts = checkpoint.index_msg_timestamp
        drop = False
        for path in paths:
            f = IndexFile(path, self.hash_slot_num, self.index_num, self._k, self._fs,
                          writable=self.writable, populator=self.populator)
            if not last_exit_ok and self.writable and (drop or f.end_timestamp > index_ts):
                log.info("index file %s ends after the checkpoint (%d > %d) or follows one "
                         "that does: destroyed, to be rebuilt", f.file_name, f.end_timestamp,
                         index_ts)
                drop = True
                self.dropped.append(f.file_name)
                f.destroy(0)
                continue
            files.append(f)
        self.index_file_list = files
        return True

    # ---- build (reput thread) -------------------------------------------------------------------
    def _new_file(self, store_timestamp):
        """getAndCreateLastIndexFile's create branch. The name is the local time of the record
        that needs the file (not a clock call), so every backend writes the same directory and
        a replayed store gets reproducible names; bumped past the last name if not newer."""
        files = self.index_file_list
        prev = files[-1] if files else None
        name = time_millis_to_human_string(store_timestamp)
        if prev is not None and name <= prev.file_name:
            ms = human_string_to_time_millis(prev.file_name) + 1
            name = time_millis_to_human_string(ms)
            while name <= prev.file_name:
                ms += 1
                name = time_millis_to_human_string(ms)
        self._fs.ensure_dir(self.store_path, self._root)
        end_phy = end_ts = 0
        if prev is not None:
            end_phy, end_ts = prev.end_phy_offset, prev.end_timestamp
        path = os.path.join(self.store_path, name)
        f = self._take_spare(path)
        if f is None:
            f = IndexFile(path, self.hash_slot_num, self.index_num, self._k, self._fs,
                          writable=True, end_phy_offset=end_phy, end_timestamp=end_ts,
                          populator=self.populator)
        else:
            f.begin_after(end_phy, end_ts)
            if prev is not None:
                # Made while `prev` was young, it may have a smaller window than `prev` grew
                # to since: its writer would reserve its windows itself while they double.
                f.mf.reserve_window = max(f.mf.reserve_window, prev.mf.reserve_window)
        with self._lock:
            self.index_file_list = files + [f]
            if prev is not None:
                self._pending_flush.append(prev)
        self.make_next_ahead()
        return f

    def make_next_ahead(self):
        """Have the populator make the file after the last one ahead of the roll (_spare)."""
        if self.populator is not None and self.writable and self.index_num >= 2:
            self.populator.make_ahead(self._make_spare)

    def _drop_made_ahead_leftover(self):
        """The file made ahead, left by a crash: zeros (nothing is written to it before the
        roll renames it), removed as any `.creating` leftover is. One holding data is not
        ours: it stays, with a warning, and no file is made ahead while it is there. (A link
        there never gets this far: a writable open refuses it, STORE_ENTRIES.) Releases before
        INDEX_AHEAD_DIR made it in the store root: a leftover there goes the same way, and
        one holding data stays there without stopping anything."""
        for directory in (self._root, self._ahead_dir):
            path = os.path.join(directory, INDEX_MADE_AHEAD)
            if not self._fs.exists(path):
                continue
            if drop_creating_leftovers(self._fs, directory, [INDEX_MADE_AHEAD],
                                       lambda base: base == "index", writable=True):
                log.warning("%s is not an index file this store made ahead: left as it is%s",
                            path, ", and no index file is made ahead while it is there"
                            if directory == self._ahead_dir else "")

    def _make_spare(self):
        """On the populator's thread: the next file, sized and mapped as INDEX_MADE_AHEAD,
        then reserved (_reserve_spare)."""
        with self._lock:
            if self._spare is not None or self._making is not None or self._closed:
                return
        path = self._ahead_path
        if self._fs.exists(path) or self._fs.is_link(path):
            return          # not ours (_drop_made_ahead_leftover)
        try:
            self._fs.ensure_dir(self._ahead_dir, self._root)
            self._made_ahead_dir = True
            spare = IndexFile(path, self.hash_slot_num, self.index_num, self._k, self._fs,
                              writable=True, populator=self.populator, reserve=False)
        except OSError as exc:
            # The roll makes its file itself, and meets the error then, with a put to refuse.
            log.info("could not make the next index file ahead: %s", exc)
            return
        with self._lock:
            if not self._closed:
                self._making, spare = spare, None
        if spare is not None:
            spare.destroy()
            return
        self._reserve_spare()

    def _reserve_spare(self):
        """On the populator's thread: reserve the next step of the slot table of the file
        being made ahead (MappedFile.RESERVE_STEP), and queue the next step behind the
        windows asked for meanwhile: a 20 MB fallocate behind writeback can take a hundred
        ms, and the queues' windows must not wait for all of it. Once the table is
        reserved, so are the first entries, and the file is ready for the roll."""
        with self._lock:
            spare = self._making
        if spare is None:
            return
        mf = spare.mf
        try:
            if (mf.reserved_position < spare.table_end
                    and mf.reserve_step(spare.table_end) < spare.table_end):
                self.populator.make_ahead(self._reserve_spare)
                return
            # A store that filled a file writes keys fast: the next one starts with the
            # window its predecessor grew to, or its writer, right after the roll, would
            # overtake a 64 KiB first window and reserve the next ones itself.
            mf.reserve_window = max([mf.reserve_window] + [
                f.mf.reserve_window for f in self.index_file_list[-2:]])
            # Its first window of entries, asked for as its writer would ask. The table's
            # last reservation, on a large folio's boundary, may reach past the first entries
            # already; reserve_entries then asked for nothing, and the writer reserved the
            # whole first window in its put at the roll (a 32 MiB fallocate each file).
            self.populator.ask_as_writer(mf, spare.table_end)
        except OSError as exc:
            log.info("could not make the next index file ahead: %s", exc)
            with self._lock:
                if self._making is spare:
                    self._making = None
            spare.destroy()
            return
        with self._lock:
            if self._making is spare:
                self._making, self._spare = None, spare

    def _take_spare(self, path):
        """The file made ahead, renamed to `path`; None when there is none (or it cannot be
        renamed: the roll then makes its file itself)."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is None:
            return None
        # Never over a file there (a rename would replace it; the roll's own create keeps it).
        if ((spare.slot_num, spare.index_num) == (self.hash_slot_num, self.index_num)
                and not (self._fs.exists(path) or self._fs.is_link(path))):
            try:
                spare.mf.rename(path)
                spare.populator = self.populator    # the service's, should it have changed
                return spare
            except OSError as exc:
                log.warning("could not take the index file made ahead: %s", exc)
        spare.destroy()
        return None

    def _drop_spare(self):
        """No file is made ahead from now on; the one made (or being made) is deleted: it
        holds nothing."""
        with self._lock:
            self._closed = True
            gone = [f for f in (self._spare, self._making) if f is not None]
            self._spare = self._making = None
        for f in gone:
            f.destroy()
        if self._made_ahead_dir and not self._fs.is_link(self._ahead_dir):
            self._fs.remove_dir_if_empty(self._ahead_dir)

    def _writable_file(self, store_timestamp):
        files = self.index_file_list
        if files and not files[-1].is_write_full:
            return files[-1]
        return self._new_file(store_timestamp)

    def dispatch_array(self, arr, buf):
        """See _dispatch_array; the worker's job is settled first."""
        self.settle()
        self._dispatch_array(arr, buf)

    def _dispatch_array(self, arr, buf):
        """CommitLogDispatcherBuildIndex over a batch of scanned records (doc/02 §2.4): per
        record, UNIQ_KEY then each KEYS piece under `topic#key` (hashed by the index_keys
        kernel); ROLLBACK records and records below the current file's endPhyOffset (a
        re-dispatch) are skipped, the latter with numpy before any per-row work. A full file
        rolls exactly where the broker would roll. With the backend's index_dispatch the keys
        are found, hashed and put in one compiled pass; otherwise index_keys hashes them and
        put_batch puts them, with numpy in between."""
        if not len(arr) or not self.writable or self.index_num < 2:
            return
        files = self.index_file_list
        held = 0
        if files:
            end_phy = files[-1].end_phy_offset
            phy = arr["phy_offset"]
            if int(phy[-1]) < end_phy:
                return
            if int(phy[0]) < end_phy:
                arr = arr[phy >= end_phy]
            if end_phy > 0 and int(arr["phy_offset"][0]) == end_phy:
                # A re-dispatch reaches the record the index ended with (the broker's `<`
                # check lets it through): its keys already held are not added twice.
                held = keys_held_at(files, end_phy)
        stamps_all = arr["store_timestamp"]
        f = self._writable_file(int(stamps_all[0]))
        if self._k_dispatch is not None:
            # One compiled pass finds, hashes and puts every key; Python only rolls files and
            # reserves blocks, when the pass stops for it.
            self._k_dispatch(np.ascontiguousarray(arr), buf, f, held,
                             lambda g, row: self._make_room(g, int(stamps_all[row]),
                                                            len(arr) - row))
            return
        # The keys of every row, hashed in C (UNIQ_KEY then each KEYS piece, ROLLBACK skipped).
        cap = 4 * len(arr) + 16
        while True:
            hashes = np.empty(cap, dtype=np.int32)
            key_rows = np.empty(cap, dtype=np.int32)
            n, rows_done = self._k.index_keys(buf, arr, hashes, key_rows)
            if rows_done == len(arr):
                break
            cap *= 4
        hashes = hashes[:n]
        key_rows = key_rows[:n]
        if held:
            drop = min(held, int(np.count_nonzero(key_rows == 0)))
            hashes, key_rows, n = hashes[drop:], key_rows[drop:], n - drop
        if not n:
            return
        phys = arr["phy_offset"][key_rows]
        stamps = stamps_all[key_rows]
        done = 0
        while done < n:
            done += f.put_batch(hashes[done:], phys[done:], stamps[done:])
            if done < n:
                # Full. The broker rolls on the failed put when the same record has more
                # keys, else when the next record starts.
                row = int(key_rows[done])
                if row != int(key_rows[done - 1]):
                    row = int(key_rows[done - 1]) + 1
                f = self._new_file(int(stamps_all[row]))
        last = int(key_rows[-1])
        if f.is_write_full and last + 1 < len(arr):
            self._new_file(int(stamps_all[last + 1]))

    def fused_target(self, start_phy):
        """The IndexFile a reput pass whose first record is at CommitLog offset `start_phy`
        puts its keys into with reput_dispatch; None when this service indexes nothing;
        False when the pass must come through dispatch_array (no compiled index loop, no file
        yet, a full one, or a re-dispatch of records the file may hold: dispatch_array
        filters those)."""
        if not self.writable or self.index_num < 2:
            return None
        self.settle()
        files = self.index_file_list
        if not files or self._k_dispatch is None:
            return False
        f = files[-1]
        return f if f.open_after(start_phy) else False

    def dispatch_from(self, arr, buf, f, row, skip):
        """The keys of rows arr[row:] (the first `skip` of row `row` in already) into `f` and
        on, where a fused reput pass stopped: rolling and reserving as dispatch_array does."""
        stamps = arr["store_timestamp"]
        n = len(arr)
        self._k_dispatch(np.ascontiguousarray(arr[row:]), buf, f, skip,
                         lambda g, r: self._make_room(g, int(stamps[row + r]), n - row - r))

    def _finish_worker(self, arr, buf, f, row, skip, again):
        """IndexWorker's way on from where its job stopped: the keys of arr[row:] (the first
        `skip` of row `row` in already) into `f` and on; `again` (after this raised once):
        every row's keys, less those the files hold."""
        if again:
            self._dispatch_array(arr, buf)
        else:
            self.dispatch_from(arr, buf, f, row, skip)

    def settle(self):
        """Wait for the worker's job and finish it (IndexWorker.settle): before anything
        reads or writes the files. Raises what finishing it raised (an OSError rolling a
        file on a full disk): the job stays pending and is tried again at the next settle."""
        worker = self.worker
        if worker is not None and worker.pending:
            worker.settle()

    def settle_for_reader(self):
        """settle for a reader (a query, the flush thread): a job that cannot be finished
        now is left to the dispatch path, which reports and retries it; the reader reads
        what the files hold."""
        try:
            self.settle()
        except Exception as exc:
            log.debug("index: the worker's job is left unfinished for now: %s", exc)

    def _make_room(self, f, store_timestamp, rows_left):
        """index_dispatch's way on where file `f` cannot take a record's next key: a new file
        when `f` is full (named by that record's store time, as the numpy path names it), else
        blocks reserved in `f` for at least a key per record left."""
        if f.is_write_full:
            return self._new_file(store_timestamp)
        f.reserve_entries(rows_left + 1)
        return f

    def dispatch(self, rows, buf):
        """CommitLogDispatcherBuildIndex over rows given as tuples (see dispatch_array)."""
        if rows:
            self.dispatch_array(np.array(rows, dtype=F.SCAN_DTYPE), buf)

    # ---- query ---------------------------------------------------------------------------------
    def query_offset(self, topic, key, max_num, begin, end):
        """IndexService#queryOffset: (phyOffsets newest first per file, newest file first;
        index last-update timestamp; index last-update phy offset). max_num is capped by
        max_msgs_num_batch. Hash matches only: the caller checks the records."""
        return self.lookup_offsets(topic, key,
                                   min(max_num, self._config.max_msgs_num_batch),
                                   begin, end)

    def lookup_offsets(self, topic, key, max_num, begin, end):
        """query_offset without the batch cap.

        An entry keeps its time as whole seconds after its file's begin, rounded down, so a
        record stored at `begin` may read up to 999 ms earlier: the window starts that much
        sooner, and the caller filters on the records' exact store times."""
        self.settle_for_reader()
        files = self.index_file_list
        if not files or max_num <= 0:
            return [], 0, 0
        if begin > 0:
            begin = max(0, begin - (_SECOND_MS - 1))
        key_hash = self._k.index_hash((topic + "#" + key).encode("utf-8"))
        out = np.empty(max_num, dtype=np.int64)
        found = []
        last_ts = last_phy = 0
        for i in range(len(files) - 1, -1, -1):
            f = files[i]
            # Held while its header is read: cleaning may destroy a file of this snapshot
            # meanwhile, and a destroyed file holds nothing (as index_query passes over it).
            if not f.mf.hold():
                continue
            try:
                if i == len(files) - 1:
                    last_ts, last_phy = f.end_timestamp, f.end_phy_offset
                if f.is_time_matched(begin, end):
                    found += f.select_phy_offsets(key_hash, max_num - len(found), begin, end,
                                                  out[:max_num - len(found)])
                if f.begin_timestamp < begin or len(found) >= max_num:
                    break
            finally:
                f.mf.release()
        return found, last_ts, last_phy

    # ---- flush, delete, close --------------------------------------------------------------------
    def flush_pending(self):
        """IndexService#flush for each file that filled up since the last call: force it, then
        advance the checkpoint's indexMsgTimestamp to its endTimestamp and flush the
        checkpoint (doc/02 §2.7). Called by the flush-cq thread and at shutdown."""
        self.settle_for_reader()
        with self._lock:
            pending, self._pending_flush = self._pending_flush, []
        checkpoint = self.checkpoint
        for f in pending:
            # Held while read: a cut (drop_past) may destroy a file taken here meanwhile.
            if not f.mf.hold():
                continue                    # destroyed: nothing left to flush
            try:
                if not f.is_write_full:
                    continue
                end_ts = f.end_timestamp
                f.flush()
            finally:
                f.mf.release()
            if checkpoint is not None:
                checkpoint.index_msg_timestamp = end_ts
                checkpoint.flush()

    def flush(self):
        """Flush full files (advancing the checkpoint), then every other file (at shutdown)."""
        self.flush_pending()
        for f in self.index_file_list:
            f.flush()

    def drop_past(self, offset):
        """Destroy the files (a suffix) that hold an entry at or past CommitLog `offset`,
        which recovery or reset_write_offset truncated; returns their names. The reput thread
        is not dispatching (recovery runs before it starts; a cut holds its dispatch lock),
        but the populate service may be populating a window of one of them: the destroy waits
        for that, since a file left on disk would be loaded at the next start with entries
        past the cut."""
        self.settle()
        files = self.index_file_list
        keep = 0
        while keep < len(files) and files[keep].end_phy_offset < offset:
            keep += 1
        gone = files[keep:]
        for f in gone:
            log.info("index file %s has entries past the CommitLog's end %d: destroyed, to "
                     "be rebuilt", f.file_name, offset)
            if not f.destroy(3.0):
                log.warning("index file %s is deleted but stays mapped while a view of it is "
                            "held", f.file_name)
        with self._lock:
            self.index_file_list = files[:keep]
            self._pending_flush = [g for g in self._pending_flush if g not in gone]
        names = [f.file_name for f in gone]
        self.dropped += names
        return names

    def delete_expired_file(self, offset):
        """IndexService#deleteExpiredFile (doc/02 §2.8): when the first file ends below
        `offset`, destroy files in order (never the last) while their endPhyOffset < offset.
        Returns the number deleted. Called by the clean thread."""
        self.settle_for_reader()
        files = self.index_file_list
        if not files or files[0].end_phy_offset >= offset:
            return 0
        expired = []
        for f in files[:-1]:
            if f.end_phy_offset >= offset:
                break
            expired.append(f)
        deleted = 0
        for f in expired:
            if not f.destroy(3.0):
                log.warning("index file %s is still in use; deletion retried later",
                            f.file_name)
                break
            with self._lock:
                self.index_file_list = [g for g in self.index_file_list if g is not f]
                self._pending_flush = [g for g in self._pending_flush if g is not f]
            deleted += 1
        return deleted

    def _stop_worker(self):
        worker, self.worker = self.worker, None
        if worker is not None:
            try:
                worker.close()
            except Exception:
                log.exception("index: the worker's last job could not be finished")

    def close(self):
        self._stop_worker()
        self._drop_spare()
        for f in self.index_file_list:
            f.close()
        self.index_file_list = []

    def destroy(self):
        """Delete every index file (DefaultMessageStore#destroy)."""
        self._stop_worker()
        self._drop_spare()
        for f in self.index_file_list:
            f.destroy(3.0)
        self.index_file_list = []
