# SPDX-License-Identifier: Apache-2.0
"""IndexService: the reput thread's index dispatcher, the file list, and key queries
(spec 02 §2.4-2.8, RocketMQ IndexService.java).

The reput thread is the only writer of index files. Readers (queries) and the clean thread take
`index_file_list` once: it is replaced, never mutated, under `_lock`.
"""
import logging
import os
import threading

import numpy as np

from . import format as F
from .dispatch import Dispatcher
from .index_file import (IndexFile, human_string_to_time_millis, time_millis_to_human_string)
from .mapped_file_queue import is_index_name, split_segment_names

log = logging.getLogger(__name__)

LONG_MAX = (1 << 63) - 1
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


class IndexService(Dispatcher):
    """The store's index: files under `<root>/index`, one dispatcher pass per record batch."""

    def __init__(self, store):
        self._store = store
        self._k = store.kernels
        self._fs = store.fs
        self.store_path = os.path.join(store.root, "index")
        self.hash_slot_num = store.config.max_hash_slot_num
        self.index_num = store.config.max_index_num
        self.writable = store.writable
        self.index_file_list = []       # replaced (never mutated) under _lock
        self._lock = threading.Lock()
        self._pending_flush = []        # full files awaiting flush; guarded by _lock

    # ---- load ---------------------------------------------------------------------------------
    def load(self, last_exit_ok):
        """IndexService#load: open the files in name order. After an abnormal exit, destroy
        those whose endTimestamp is past the checkpoint's indexMsgTimestamp: recovery
        re-dispatches their records (spec 02 §2.7). A read-only store destroys nothing."""
        files = []
        index_ts = self._store.checkpoint.index_msg_timestamp
        names, strays = split_segment_names(self._fs, self.store_path, None, is_index_name)
        for name in strays:
            log.warning("ignoring %s: not an index file name (yyyyMMddHHmmssSSS); left as it "
                        "is", os.path.join(self.store_path, name))
        for name in names:
            path = os.path.join(self.store_path, name)
            f = IndexFile(path, self.hash_slot_num, self.index_num, self._k, self._fs,
                          writable=self.writable)
            if not last_exit_ok and self.writable and f.end_timestamp > index_ts:
                log.info("index file %s ends after the checkpoint (%d > %d): destroyed, to be "
                         "rebuilt", name, f.end_timestamp, index_ts)
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
        self._fs.ensure_dir(self.store_path, self._store.root)
        end_phy = end_ts = 0
        if prev is not None:
            end_phy, end_ts = prev.end_phy_offset, prev.end_timestamp
        f = IndexFile(os.path.join(self.store_path, name), self.hash_slot_num, self.index_num,
                      self._k, self._fs, writable=True, end_phy_offset=end_phy,
                      end_timestamp=end_ts)
        with self._lock:
            self.index_file_list = files + [f]
            if prev is not None:
                self._pending_flush.append(prev)
        return f

    def _writable_file(self, store_timestamp):
        files = self.index_file_list
        if files and not files[-1].is_write_full:
            return files[-1]
        return self._new_file(store_timestamp)

    def dispatch_array(self, arr, buf):
        """CommitLogDispatcherBuildIndex over a batch of scanned records (spec 02 §2.4): per
        record, UNIQ_KEY then each KEYS piece under `topic#key` (hashed by the index_keys
        kernel); ROLLBACK records and records below the current file's endPhyOffset (a
        re-dispatch) are skipped, the latter with numpy before any per-row work. A full file
        rolls exactly where the broker would roll."""
        if not len(arr) or not self.writable or self.index_num < 2:
            return
        files = self.index_file_list
        if files:
            end_phy = files[-1].end_phy_offset
            phy = arr["phy_offset"]
            if int(phy[-1]) < end_phy:
                return
            if int(phy[0]) < end_phy:
                arr = arr[phy >= end_phy]
        stamps_all = arr["store_timestamp"]
        f = self._writable_file(int(stamps_all[0]))
        # The keys of every row, hashed in C (UNIQ_KEY then each KEYS piece, ROLLBACK skipped).
        cap = 4 * len(arr) + 16
        while True:
            hashes = np.empty(cap, dtype=np.int32)
            key_rows = np.empty(cap, dtype=np.int32)
            n, rows_done = self._k.index_keys(buf, arr, hashes, key_rows)
            if rows_done == len(arr):
                break
            cap *= 4
        if not n:
            return
        hashes = hashes[:n]
        key_rows = key_rows[:n]
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

    def dispatch(self, rows, buf):
        """CommitLogDispatcherBuildIndex over rows given as tuples (see dispatch_array)."""
        if rows:
            self.dispatch_array(np.array(rows, dtype=F.SCAN_DTYPE), buf)

    # ---- query ---------------------------------------------------------------------------------
    def query_offset(self, topic, key, max_num, begin, end):
        """IndexService#queryOffset: (phyOffsets newest first per file, newest file first;
        index last-update timestamp; index last-update phy offset). max_num is capped by
        max_msgs_num_batch. Hash matches only: the caller checks the records."""
        max_num = min(max_num, self._store.config.max_msgs_num_batch)
        files = self.index_file_list
        if not files or max_num <= 0:
            return [], 0, 0
        key_hash = self._k.index_hash((topic + "#" + key).encode("utf-8"))
        out = np.empty(max_num, dtype=np.int64)
        found = []
        last = files[-1]
        last_ts, last_phy = last.end_timestamp, last.end_phy_offset
        for f in reversed(files):
            if f.is_time_matched(begin, end):
                found += f.select_phy_offsets(key_hash, max_num - len(found), begin, end,
                                              out[:max_num - len(found)])
            if f.begin_timestamp < begin or len(found) >= max_num:
                break
        return found, last_ts, last_phy

    # ---- flush, delete, close --------------------------------------------------------------------
    def flush_pending(self):
        """IndexService#flush for each file that filled up since the last call: force it, then
        advance the checkpoint's indexMsgTimestamp to its endTimestamp and flush the
        checkpoint (spec 02 §2.7). Called by the flush-cq thread and at shutdown."""
        with self._lock:
            pending, self._pending_flush = self._pending_flush, []
        checkpoint = self._store.checkpoint
        for f in pending:
            if not f.is_write_full:
                continue
            end_ts = f.end_timestamp
            f.flush()
            if checkpoint is not None:
                checkpoint.index_msg_timestamp = end_ts
                checkpoint.flush()

    def flush(self):
        """Flush full files (advancing the checkpoint), then every other file (at shutdown)."""
        self.flush_pending()
        for f in self.index_file_list:
            f.flush()

    def delete_expired_file(self, offset):
        """IndexService#deleteExpiredFile (spec 02 §2.8): when the first file ends below
        `offset`, destroy files in order (never the last) while their endPhyOffset < offset.
        Returns the number deleted. Called by the clean thread."""
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

    def close(self):
        for f in self.index_file_list:
            f.close()
        self.index_file_list = []

    def destroy(self):
        """Delete every index file (DefaultMessageStore#destroy)."""
        for f in self.index_file_list:
            f.destroy(3.0)
        self.index_file_list = []
