# SPDX-License-Identifier: Apache-2.0
"""LiveReader: read a store that another process is writing, and follow it.

`MessageStore.open_read_only` maps what is there when it opens and stays there. A LiveReader
takes no lock and writes nothing in the store directory; it maps each ConsumeQueue and
CommitLog file when a read first needs it, so it follows the writer through new messages, new
files, rolled files and files that cleaning deletes (doc/04 §2-§3) while it reads.

What it can trust: in another process nothing says how far the writer got, so every answer is
built from what the reader can check itself.

- A file is there once it has its full size (the store sizes a new file under a temporary
  name and renames it; a broker sizes it right after creating it): a shorter or missing file
  is "not yet there", and is never mapped, so no read can run past its end (SIGBUS).
- A file deleted by cleaning stays readable while the reader has it mapped (an unlinked
  file's pages live as long as a mapping does); the reader lets it go once a read needs a
  file the writer created after it.
- A unit is the writer's word that its record is complete: reput writes it after the record
  (doc/02 §1.4). The reader still checks each record against its unit before handing it out:
  the record check kernel (rs_msg_check through commitlog_scan, body CRC included) on a copy
  of the record, then its size, CommitLog offset, topic, queue id and queue offset against
  the unit. A unit that is zero, or whose record fails the check while the unit after it is
  still zero, is "not yet visible" (a torn unit, or a writer that crashed half-way): the read
  stops there and a later one tries again. A unit that fails while a later unit exists was
  passed by the writer for good: it is damaged, logged and skipped (as MessageStore's reads
  skip a damaged unit).
- A unit pointing below the oldest CommitLog file points at a record cleaning deleted: it is
  stepped over, as a broker's read of a removed message is.
- A queue whose newest file the reader mapped is gone from under its name, or another file
  (its topic deleted, and perhaps written anew from offset 0; its queues rebuilt), is read anew
  from the files on disk. Each call on the queue checks this, at most every
  `replaced_check_s` (1 ms): within that, a call may still answer from the queue as it was.

Consumer offsets are the reader's own: in memory, or in `offsets_path` (a file outside the
store directory, in the broker's consumerOffset.json format, written crash-safe as the
broker's config files are, at most every `offsets_flush_ms` on commit and on close). One file
per reader process: two readers sharing a file overwrite each other's offsets.

Reading: with the cext backend a read walks runs of units in one compiled call
(ReadPath.live_walk): each record copied, checked (rs_msg_check, body CRC included) and
matched against its unit on the copy, and its MessageExt made from the copy. The walk hands
back every unit it cannot settle alone (its record in a CommitLog file it was not given, or
failing a check) to the Python path below, which decides not-there, deleted, damaged or not
yet visible by the rules above; the cffi and pure backends take the Python path throughout.
The CommitLog file the last walk read in stays referenced until a walk needs another one, so
a file cleaning deleted may stay mapped that much longer.

Waiting: no reput runs in this process to wake a consumer, so a wait (`get_message(...,
wait_ms=N)`, `consume`, `aconsume`) reads the queue's next unit again after a short bounded
backoff, from POLL_FIRST_S doubling up to POLL_MAX_S (consumer.py's wait loop, with
`poll_backoff` set). A check of the next unit is one 20-byte read of a mapped page. The
writer's reput writes units on its 1 ms cycle (after 100 ms without a write, on the next put's
wake-up) unless the writer sets StoreConfig.wake_reput_on_put, which wakes it on every put.

Key queries (the index files) are not served here: use MessageStore.open_read_only for them.
"""
import logging
import os
import struct
import threading
import time

import numpy as np

from . import kernels as _kernels
from . import read_path
from .arguments import (check_callable, check_int, check_offset_commit, check_offset_query,
                        check_queue, check_str)
from .config import StoreConfig
from .config_manager import ConsumerOffsetManager
from .consumer import (Arrivals, AsyncConsumer, Consumer, await_message, check_wait_ms,
                       wait_for_message)
from .errors import ConfigError, InvalidArgumentError, StoreClosedError, StoreLoadError
from .format import CQ_STORE_UNIT_SIZE, OS_PAGE_SIZE, SCAN_DTYPE
from .fs import DEFAULT as DEFAULT_FS, is_inside
from .mapped_file import offset_to_file_name
from .mapped_file_queue import is_queue_dir_name, split_segment_names
from .status import GetMessageResult, GetMessageStatus as G

log = logging.getLogger(__name__)

_UNIT = struct.Struct(">qiq")
# A unit a broker writes before a queue's first real one when the queue's first file starts
# past offset 0 (doc/02 §1.4, step 5): no record, stepped over.
_BLANK_UNIT_SIZE = 0x7FFFFFFF
# Fields of a SCAN_DTYPE row as a tuple (rows[i].item()).
_R_PHY, _R_QOFF, _R_SIZE, _R_QID, _R_TOPIC_OFF, _R_TOPIC_LEN = (
    SCAN_DTYPE.names.index(n) for n in ("phy_offset", "queue_offset", "size", "queue_id",
                                        "topic_off", "topic_len"))


def _segment_size(fs, directories, unit=1):
    """The segment size of files in `directories`: the size most of their first files have
    (a file being created, still empty, does not count), else the least gap between two
    neighbours' names; 0 when nothing tells yet. Only whole multiples of `unit` count (a
    ConsumeQueue file holds whole 20-byte units): a file cut short by damage must not size
    every queue the reader maps."""
    gaps, sizes = [], {}
    for d in directories:
        starts = sorted(int(n) for n in split_segment_names(fs, d, None)[0])
        gaps += [b - a for a, b in zip(starts, starts[1:]) if b > a and (b - a) % unit == 0]
        for s in starts[:2]:
            try:
                size = fs.size(os.path.join(d, offset_to_file_name(s)))
            except OSError:
                continue
            if size and size % unit == 0:
                sizes[size] = sizes.get(size, 0) + 1
    if sizes:
        return max(sizes, key=lambda s: (sizes[s], s))
    return min(gaps) if gaps else 0


class _Segments:
    """One directory of fixed-size segments (a CommitLog or a ConsumeQueue), each mapped
    read-only the first time a read needs it and only once it has its full size."""

    __slots__ = ("path", "_reader", "_maps", "_inodes", "first_start", "_newest")

    def __init__(self, reader, path):
        self.path = path
        self._reader = reader
        self._maps = {}             # start offset -> read-only mapping
        self._inodes = {}           # start offset -> the mapped file's inode number
        self.first_start = -1       # the oldest segment on disk when last listed
        self._newest = None         # (start, path, inode) of the newest segment mapped

    def mapping(self, start, size):
        """The mapping of the segment starting at `start`, or None when it is not there (yet,
        or any more)."""
        mm = self._maps.get(start)
        if mm is not None:
            return mm
        fs = self._reader.fs
        path = os.path.join(self.path, offset_to_file_name(start))
        try:
            if fs.size(path) < size:
                return None         # being created: sized, or renamed in, next
            ino = os.stat(path).st_ino
            mm = fs.map(path, size, writable=False, kernels=self._reader.kernels)
        except FileNotFoundError:
            return None
        with self._reader._lock:
            self._forget_deleted()
            self._maps[start] = mm
            self._inodes[start] = ino
            if self._newest is None or start >= self._newest[0]:
                self._newest = (start, path, ino)
        return mm

    def newest_replaced(self):
        """True when the newest segment mapped is no longer the file on disk under its name
        (deleted, or deleted and made again: a topic deleted and written anew); one stat."""
        newest = self._newest
        if newest is None:
            return False
        try:
            return os.stat(newest[1]).st_ino != newest[2]
        except FileNotFoundError:
            return True

    def _forget_deleted(self):
        """Let go of the mappings of files cleaning deleted (their readers keep theirs)."""
        fs = self._reader.fs
        for start in list(self._maps):
            if not fs.exists(os.path.join(self.path, offset_to_file_name(start))):
                del self._maps[start]
                self._inodes.pop(start, None)

    def list_first(self, size):
        """The oldest segment's start offset on disk (-1: none); cached in first_start."""
        starts = [int(n) for n in split_segment_names(self._reader.fs, self.path, size)[0]]
        self.first_start = min(starts) if starts else -1
        return self.first_start

    def close(self):
        self._maps = {}
        self._inodes = {}
        self.first_start = -1
        self._newest = None


class _Queue:
    """A ConsumeQueue as the reader sees it: `end` is where the units known to be written
    end (a queue offset), moved on by advance()."""

    __slots__ = ("topic", "topic_b", "queue_id", "segments", "end", "checked")

    def __init__(self, reader, topic, queue_id, path):
        self.topic = topic
        self.topic_b = topic.encode("utf-8")
        self.queue_id = queue_id
        self.segments = _Segments(reader, path)
        self.end = 0
        self.checked = 0.0          # when its files were last checked for replacement

    def unit(self, q, file_size):
        """(phy, size, tags_code) of unit `q`, or None when its file is not there."""
        pos = q * CQ_STORE_UNIT_SIZE
        start = pos - pos % file_size
        mm = self.segments.mapping(start, file_size)
        if mm is None:
            return None
        rel = pos - start
        return _UNIT.unpack(mm[rel:rel + CQ_STORE_UNIT_SIZE])

    def advance(self, file_size):
        """Move `end` past the written units that follow it. Reads no page past the one that
        holds the first unit still zero (a sparse file's pages not written yet)."""
        q = self.end
        while True:
            pos = q * CQ_STORE_UNIT_SIZE
            start = pos - pos % file_size
            mm = self.segments.mapping(start, file_size)
            if mm is None:
                first = self.segments.list_first(file_size)
                if first > pos:         # cleaning deleted the queue's head: go on from its
                    q = first // CQ_STORE_UNIT_SIZE     # oldest file
                    continue
                break
            rel = pos - start
            if not any(mm[rel + 8:rel + 12]):
                break               # the common answer of a wait's check: nothing new
            n = max(1, (OS_PAGE_SIZE - rel % OS_PAGE_SIZE) // CQ_STORE_UNIT_SIZE)
            stop = min(file_size, rel + n * CQ_STORE_UNIT_SIZE)
            units = np.frombuffer(mm[rel:stop], dtype=np.uint8).reshape(-1, CQ_STORE_UNIT_SIZE)
            # A unit is written once its size field (bytes 8..12) is.
            written = units[:, 8:12].any(axis=1)
            n = len(written) if written.all() else int(written.argmin())
            q += n
            if n < len(written):
                break
        self.end = q
        return q


class LiveReader:
    """A reader of the store at `root` that follows the process writing it; see the module
    docstring for what it checks and promises.

    `offsets_path`: where its consumer offsets live (consumerOffset.json format, outside the
    store directory), None to keep them in memory. `config`: a StoreConfig whose CommitLog and
    ConsumeQueue file sizes to use; by default they are read from the files themselves (a
    store with no file yet then shows nothing until its first files appear).

    get_message, get_min/max_offset_in_queue, commit_offset and query_offset answer as
    MessageStore's do; consume() and aconsume() give the same Consumer and AsyncConsumer. Use
    it as a context manager, or call close()."""

    # consumer.py waits with this backoff (seconds) instead of a wake-up from reput.
    POLL_FIRST_S = 0.0001
    POLL_MAX_S = 0.001
    # How often a queue's files are checked for having been deleted and made anew (its topic
    # deleted, its queues rebuilt): a read within this long of the last check may still
    # answer from the queue as it was. A check on every call (a stat, about 2 µs here) made
    # a backlog read of 32 a call 10-25 % slower; with this limit the read is 2-5 % slower
    # than with no check at all (bench_live_reader.py). 0 checks on every call.
    replaced_check_s = 0.001
    poll_backoff = (POLL_FIRST_S, POLL_MAX_S)
    read_only = True

    def __init__(self, root, offsets_path=None, config=None, kernels=None, fs=None,
                 offsets_flush_ms=1000):
        self.root = os.fspath(root)
        self.fs = fs or DEFAULT_FS
        self.kernels = _kernels.resolve(kernels)
        if config is not None and not isinstance(config, StoreConfig):
            raise ConfigError("config must be a StoreConfig")
        check_int(offsets_flush_ms, "offsets_flush_ms", 0)
        if not self.fs.is_dir(self.root):
            raise StoreLoadError(f"{self.root} is not a store directory")
        self._cl_size = config.mapped_file_size_commit_log if config is not None else 0
        self._cq_size = config.cq_file_size if config is not None else 0
        self._lock = threading.Lock()
        self._queues = {}           # (topic, queue_id) -> _Queue
        self._commitlog = _Segments(self, os.path.join(self.root, "commitlog"))
        if config is not None:
            self._check_sizes()
        self._read_path = read_path.make_read_path(self.kernels)
        # cext: runs of units are read in one compiled call (ReadPath.live_walk); the other
        # backends, and every unit it hands back, take the Python path in _read.
        self._walk = getattr(self._read_path, "live_walk", None)
        if self._walk is not None:
            rp = type(self._read_path)
            self._walk_stops = (rp.LIVE_DONE, rp.LIVE_ZERO, rp.LIVE_FULL, rp.LIVE_OTHER)
        # The CommitLog file the last walk read records in, (mapping, start offset): a queue's
        # next records mostly lie in the same one.
        self._log_at = (None, -1)
        self.arrivals = Arrivals()      # only close() wakes a wait here (see poll_backoff)
        self.offsets_path = None if offsets_path is None else os.path.abspath(offsets_path)
        if self.offsets_path is not None and is_inside(self.root, self.offsets_path):
            raise InvalidArgumentError(f"offsets_path {offsets_path!r} is inside the store "
                                       "directory, which a LiveReader never writes")
        self.consumer_offsets = _ReaderOffsets(self.offsets_path, self.fs)
        if self.offsets_path is not None and not self.consumer_offsets.load():
            raise StoreLoadError(f"{self.offsets_path} and its .bak are both corrupt")
        self._flush_s = offsets_flush_ms / 1000.0
        self._flushed_at = time.monotonic()
        self.loaded = True
        self.arrivals.open()

    # ---- lifecycle -----------------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Wake and end every wait, write the offsets, let go of every mapping."""
        if not self.loaded:
            return
        self.arrivals.close()
        self.loaded = False
        self.consumer_offsets.close()
        with self._lock:
            for cq in self._queues.values():
                cq.segments.close()
            self._commitlog.close()
            self._log_at = (None, -1)

    shutdown = close

    def check_open(self):
        if not self.loaded:
            raise StoreClosedError("the live reader is closed")

    # ---- geometry --------------------------------------------------------------------------
    def _check_sizes(self):
        """A config whose file sizes the store's files contradict would show nothing: refuse
        it (ConfigError) rather than wait for files that never come."""
        fs = self.fs
        cq_base = os.path.join(self.root, "consumequeue")
        queue_dirs = []
        for topic in fs.list_dir(cq_base)[:8]:
            tdir = os.path.join(cq_base, topic)
            if fs.is_dir(tdir):
                queue_dirs += [os.path.join(tdir, q) for q in fs.list_dir(tdir)[:2]
                               if is_queue_dir_name(q)]
        for field, given, dirs, unit in (
                ("mapped_file_size_commit_log", self._cl_size, [self._commitlog.path], 1),
                ("mapped_file_size_consume_queue", self._cq_size, queue_dirs,
                 CQ_STORE_UNIT_SIZE)):
            found = _segment_size(fs, dirs, unit)
            if found and found != given:
                raise ConfigError(f"{field} is {given}, but the store's files are {found} "
                                  f"bytes (leave config out to take the sizes from the files)")

    def _commitlog_size(self):
        if not self._cl_size:
            self._cl_size = _segment_size(self.fs, [self._commitlog.path])
        return self._cl_size

    def _queue_size(self, cq):
        if not self._cq_size:
            dirs = [cq.segments.path] + [q.segments.path for q in list(self._queues.values())]
            self._cq_size = _segment_size(self.fs, dirs, CQ_STORE_UNIT_SIZE)
        return self._cq_size

    def _queue(self, topic, queue_id):
        """The queue, None while its directory does not exist. A queue whose newest file the
        reader mapped is no longer the one on disk under its name was deleted and perhaps
        written anew (its topic deleted, its queues rebuilt): it is read anew from the files
        there, since the old mapping would still hand out the deleted messages (their records
        stay in the CommitLog until they expire). Checked with one stat (about 2 µs here) at
        most every replaced_check_s; cleaning never deletes a queue's newest file."""
        cq = self._queues.get((topic, queue_id))
        if cq is not None:
            now = time.monotonic()
            if now - cq.checked < self.replaced_check_s:
                return cq
            cq.checked = now
            if cq.segments.newest_replaced():
                log.info("%s/%d: its ConsumeQueue files were replaced; reading them anew",
                         topic, queue_id)
                with self._lock:
                    cq.segments.close()
                cq.end = 0
            return cq
        check_queue(topic, queue_id)
        tdir = os.path.join(self.root, "consumequeue", topic)
        path = os.path.join(tdir, str(queue_id))
        if not self.fs.is_dir(path) or not is_queue_dir_name(str(queue_id)) or \
                not is_inside(self.root, path):
            return None
        with self._lock:
            cq = self._queues.setdefault((topic, queue_id),
                                         _Queue(self, topic, queue_id, path))
        return cq

    # ---- offsets ---------------------------------------------------------------------------
    def _min_offset(self, cq, size):
        first = cq.segments.list_first(size)
        return max(0, first) // CQ_STORE_UNIT_SIZE

    def get_min_offset_in_queue(self, topic, queue_id):
        """The queue's oldest offset on disk (0 for a queue not there yet)."""
        self.check_open()
        cq = self._queue(topic, queue_id)
        size = self._queue_size(cq) if cq is not None else 0
        return self._min_offset(cq, size) if size else 0

    def get_max_offset_in_queue(self, topic, queue_id):
        """Where the queue's written units end now (a unit written but whose record does not
        check yet is counted: get_message then answers with nothing at it for a while)."""
        self.check_open()
        cq = self._queue(topic, queue_id)
        size = self._queue_size(cq) if cq is not None else 0
        return cq.advance(size) if size else 0

    def commit_offset(self, group, topic, queue_id, offset):
        """Record the group's next offset on the queue, in this reader's own offsets."""
        self.check_open()
        check_offset_commit(group, topic, queue_id, offset)
        self.consumer_offsets.commit_offset(group, topic, queue_id, offset)
        if self.offsets_path is not None and \
                time.monotonic() - self._flushed_at >= self._flush_s:
            self.flush_offsets()

    def query_offset(self, group, topic, queue_id):
        """The committed offset of this reader's group, -1 if none."""
        self.check_open()
        check_offset_query(group, topic, queue_id)
        return self.consumer_offsets.query_offset(group, topic, queue_id)

    def flush_offsets(self):
        """Write the offsets file now (when there is one and something changed)."""
        self._flushed_at = time.monotonic()
        self.consumer_offsets.persist_if_dirty()

    # ---- reads ---------------------------------------------------------------------------
    def get_message(self, group, topic, queue_id, offset, max_msg_nums=32, message_filter=None,
                    *, wait_ms=0):
        """MessageStore.get_message on what the writer has made visible: every message
        handed out passed the record check against its unit. `wait_ms` > 0 waits up to that
        long for a message at `offset`, checking again with a short backoff."""
        if wait_ms:
            check_wait_ms(wait_ms)
            return wait_for_message(self, group, topic, queue_id, offset, max_msg_nums,
                                    message_filter, wait_ms)
        self.check_open()
        check_str(group, "group")
        check_int(offset, "offset")
        check_int(max_msg_nums, "max_msg_nums", 1, read_path.MAX_MSG_NUMS)
        check_callable(message_filter, "message_filter")
        cq = self._queue(topic, queue_id)
        size = self._queue_size(cq) if cq is not None else 0
        if cq is None or not size:
            return GetMessageResult(G.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        return self._read(cq, size, offset, max_msg_nums, message_filter)

    async def aget_message(self, group, topic, queue_id, offset, max_msg_nums=32,
                           message_filter=None, *, wait_ms=0):
        """get_message for asyncio (reads in the loop's default executor)."""
        check_wait_ms(wait_ms)
        self.check_open()
        return await await_message(self, group, topic, queue_id, offset, max_msg_nums,
                                   message_filter, wait_ms)

    def consume(self, group, topic, queue_id, batch_size=32, message_filter=None):
        """MessageStore.consume on this reader, committing to its own offsets."""
        return Consumer(self, group, topic, queue_id, batch_size, message_filter)

    def aconsume(self, group, topic, queue_id, batch_size=32, message_filter=None):
        """MessageStore.aconsume on this reader."""
        return AsyncConsumer(self, group, topic, queue_id, batch_size, message_filter)

    def _read(self, cq, size, offset, max_n, message_filter):
        end = cq.end if offset + max_n <= cq.end else cq.advance(size)
        first = cq.segments.first_start
        if first < 0 or offset * CQ_STORE_UNIT_SIZE < first:
            first = cq.segments.list_first(size)    # cached otherwise: a listing per read
        lo = max(0, first) // CQ_STORE_UNIT_SIZE    # would cost more than the read
        if end == 0:
            return GetMessageResult(G.NO_MESSAGE_IN_QUEUE, 0, lo, end)
        if offset < lo:
            return GetMessageResult(G.OFFSET_TOO_SMALL, lo, lo, end)
        if offset == end:
            return GetMessageResult(G.OFFSET_OVERFLOW_ONE, offset, lo, end)
        if offset > end:
            return GetMessageResult(G.OFFSET_OVERFLOW_BADLY, lo if lo == 0 else end, lo, end)
        messages = []
        rows = None                 # the Python path's row, made when first needed
        q = offset
        limit = offset + read_path.scan_limit(max_n)
        nbytes = 0
        walk = self._walk
        log_mm, log_start = self._log_at
        walked_at = -1
        while q < end and q < limit and len(messages) < max_n:
            if walk is not None:
                pos = q * CQ_STORE_UNIT_SIZE
                start = pos - pos % size
                mm = cq.segments.mapping(start, size)
                if mm is not None:
                    done_, zero_, full_, _ = self._walk_stops
                    n = min(end, limit, (start + size) // CQ_STORE_UNIT_SIZE) - q
                    did, why, nbytes = walk(mm, pos - start, n, q, log_mm, log_start, cq.topic_b,
                                            cq.queue_id, max_n, read_path.MAX_BYTES, nbytes,
                                            message_filter, messages)
                    q += did
                    if why == done_:
                        continue
                    if why == full_:
                        break
                    if why == zero_:
                        cq.end = end = q
                        break
                    # Unit q's record lies outside the CommitLog file at hand, or fails a
                    # check: take the file it lies in and walk again, once; then the unit
                    # goes the Python way below (not there, deleted, damaged, not yet valid).
                    if walked_at != q:
                        walked_at = q
                        log_mm, log_start = self._log_at = self._log_file(
                            cq.unit(q, size), log_mm, log_start)
                        continue
            unit = cq.unit(q, size)
            if unit is None:
                if q == offset:
                    # Its file went (cleaning) since the oldest one was listed.
                    lo = max(0, cq.segments.list_first(size)) // CQ_STORE_UNIT_SIZE
                    if offset < lo:
                        return GetMessageResult(G.OFFSET_TOO_SMALL, lo, lo, end)
                end = q
                break
            phy, rsize, tags = unit
            if rsize == 0:
                # Not written (yet or again: a writer's recovery zeroes the units it drops).
                cq.end = end = q
                break
            if phy == 0 and rsize == _BLANK_UNIT_SIZE:
                q += 1
                continue
            if messages and nbytes + rsize > read_path.MAX_BYTES:
                break
            rec = self._record(phy, rsize)
            if rows is None:
                rows = np.zeros(1, SCAN_DTYPE)
            if rec is _GONE:
                q += 1              # cleaning deleted its record, as a broker skips it
                continue
            if rec is None:
                end = q             # its CommitLog file is not there yet
                break
            if self._valid(rec, rows, cq, q, phy, rsize):
                q += 1
                if message_filter is None or message_filter(tags):
                    messages.extend(self._read_path.decode_rows(rec, rows, 1))
                    nbytes += rsize
                continue
            # Not (yet) a valid record: damaged only once the writer went past it for good,
            # i.e. a later unit is written, and read after that, this unit is the same and its
            # record still fails (a weakly ordered CPU may show a unit before its record).
            cq.end = q + 1
            if cq.advance(size) > q + 1 and cq.unit(q, size) == unit and \
                    not self._valid(self._record(phy, rsize), rows, cq, q, phy, rsize):
                log.warning("%s/%d: the unit at queue offset %d (CommitLog offset %d, %d "
                            "bytes) does not match its record; skipped", cq.topic,
                            cq.queue_id, q, phy, rsize)
                q += 1
                continue
            end = q
            break
        if messages:
            return GetMessageResult(G.FOUND, q, lo, end, messages)
        if q > offset:
            return GetMessageResult(G.NO_MATCHED_MESSAGE, q, lo, end)
        return GetMessageResult(G.OFFSET_OVERFLOW_ONE, offset, lo, offset)

    def _record(self, phy, size):
        """A copy of the `size` bytes at CommitLog offset `phy`: _GONE when cleaning deleted
        its file, _BAD when no record can be there, None when its file is not there yet."""
        file_size = self._commitlog_size()
        if not file_size:
            return None
        start = phy - phy % file_size
        if size <= 0 or phy < 0 or phy + size > start + file_size:
            return _BAD
        mm = self._commitlog.mapping(start, file_size)
        if mm is None:
            first = self._commitlog.list_first(file_size)
            return _GONE if first > start else None
        rel = phy - start
        return mm[rel:rel + size]

    def _log_file(self, unit, mm, start):
        """(mapping, start offset) of the CommitLog file the record of `unit` lies in, for
        ReadPath.live_walk; (mm, start) as they were when there is none."""
        file_size = self._commitlog_size()
        if unit is None or not file_size or unit[0] < 0:
            return mm, start
        at = unit[0] - unit[0] % file_size
        if at == start:
            return mm, start
        found = self._commitlog.mapping(at, file_size)
        return (mm, start) if found is None else (found, at)

    def _valid(self, rec, rows, cq, q, phy, size):
        return rec is not None and rec is not _BAD and rec is not _GONE and \
            self._checks(rec, rows, cq, q, phy, size)

    def _checks(self, rec, rows, cq, q, phy, size):
        """Whether `rec` is a whole, CRC-valid record and the one unit `q` describes."""
        if self.kernels.commitlog_scan(rec, 0, size, True, rows)[0] != 1:
            return False
        r = rows[0].item()
        if r[_R_SIZE] != size or r[_R_PHY] != phy or r[_R_QID] != cq.queue_id or \
                r[_R_QOFF] != q:
            return False
        return rec[r[_R_TOPIC_OFF]:r[_R_TOPIC_OFF] + r[_R_TOPIC_LEN]] == cq.topic_b


_GONE = object()
_BAD = object()


class _ReaderOffsets(ConsumerOffsetManager):
    """consumerOffset.json at a path of the reader's choosing (None: kept in memory only)."""

    def __init__(self, path, fs):
        if path is None:
            super().__init__("", fs, read_only=True)
            self.path = None
            return
        directory = os.path.dirname(path)
        super().__init__(directory, fs)
        self.path = path
        from .config_manager import _file_lock
        self._write_lock = _file_lock(path)

    def persist(self):
        if self.path is not None:
            super().persist()
