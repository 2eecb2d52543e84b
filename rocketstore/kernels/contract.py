# SPDX-License-Identifier: Apache-2.0
"""The kernel surface: what every backend (cext, cffi, pure) exports, written once.

Kernels are stateless loops over bytes in caller-supplied buffers. They never keep a view of a
buffer past the call and never decide policy (which file, whether to roll, what to do with a bad
tail): that is Python's job in the modules that call them.

Buffers: inputs accept any C-contiguous buffer (bytes, bytearray, memoryview, numpy array, mmap);
outputs must be writable (bytearray, writable memoryview, numpy array, mmap opened for write).
Bad arguments raise through rocketstore.errors.raise_for_status, identically in every backend.
"""
from typing import Protocol, Tuple

from ..errors import RS_E_ARG, raise_for_status

KERNEL_NAMES = (
    "crc32",
    "java_hash",
    "msg_size",
    "msg_encode",
    "commitlog_append",
    "commitlog_append_batch",
    "commitlog_blank",
    "commitlog_scan",
    "cq_encode",
    "cq_encode_batch",
    "cq_search",
    "tags_match",
    "index_hash",
    "index_put",
    "index_put_batch",
    "index_keys",
    "index_lookup",
    "index_walk",
    "index_match",
    "index_query",
    "sync_range",
    "batch_encode",
    "column_join",
)

# A backend may also export these; the store uses them when present.
#   Mapping(fd, size, writable=True): a shared mapping of the open file `fd` that keeps no
#   descriptor (FileSystem.map closes it at once), offering the mmap.mmap subset the store
#   uses (madvise with a fourth argument, from_end: a populate's chunks from the last, in one
#   GIL-free call), copy_released(start, n) (a GIL-free copy however short, for bytes that
#   may be off the page cache), the buffer protocol, and BufferError from close() while an
#   export is live. Without
#   it, mmap.mmap keeps a duplicate descriptor per mapped file (before Python 3.13).
#   cq_dispatch(rows, buf, slots, slow) and CqSlots(mapped_file_type, consume_queue_type): the
#   ConsumeQueue dispatcher's row loop, appending each common row's unit in compiled code
#   without the GIL, with its queues in a CqSlots table, and handing the others to slow(i); see
#   dispatch.ConsumeQueueDispatcher.dispatch_array. Without it, the dispatcher groups rows with
#   numpy.
#   PutPath(store_put, store_put_list, commitlog, running_flags, not_writeable_mask, clock,
#   message_type, mapped_file_type, result_type, batch_result_type, put_ok, host_cache):
#   MessageStore.put_message's and put_messages' common cases as compiled calls (`.put(msg)`,
#   `.put_list(msgs, batch_properties=None, written_rows=None)`, which fills `written_rows`, a
#   services.reput.WrittenRows, with the scan rows of what it wrote into its first file),
#   writing each record once at its final offset; every other case goes
#   to store_put / store_put_list, the Python paths. `.put_columns(topic, queue_id, cols,
#   flag, born_timestamp, born_host, written_rows=None)` is MessageStore.put_batch's common
#   case (a batch.Columns that fits its file below the refill position) as one call, or None
#   with nothing written: the caller then takes CommitLog.put_batch. `.put_lists(topic,
#   queue_id, bodies, tags, keys, properties, flag, born_timestamp, born_host, template,
#   written_rows=None)` takes that case straight from put_batch's arguments (template:
#   batch.batch_template), or returns None with nothing written for batch.columns to lay
#   out. They keep the CommitLog's `put_cells` (stats.py: beginTimeInLock, put counts and
#   latencies) as the Python paths do, and hand a put to them while another has held the
#   lock too long (they answer OS_PAGECACHE_BUSY).
#   Without it, those are the methods.
#   index_dispatch(rows, buf, f, skip, slow): the index dispatcher's row loop, finding, hashing
#   and putting each row's keys into IndexFile f in compiled code and asking slow(f, row) for
#   the file to go on in when f is full or out of reserved blocks; see
#   index_service.IndexService.dispatch_array. Without it, index_keys and index_put_batch.
#   reput_dispatch(buf, start, end, rows, prev_n, slots, index_file, given=0): the reput pass
#   in one GIL-free section: commitlog_scan of buf[start:end] into rows (unless `given` > 0:
#   rows[:given] are a put's rows of exactly those records, batch_encode's `rows` or
#   PutPath.put_list's `written_rows`), then cq_dispatch's common rows (with the CqSlots
#   `slots`) and index_dispatch's (into index_file, or None), stopping each where it would
#   call Python; returns the scan's four values, the first row without its unit, the last
#   dispatched store time, and where the index loop stopped. See
#   services/reput.ReputMessageService._fused_pass. Without it, the scan and each
#   dispatcher run apart, and puts make no rows.
#   PutDispatch(mfq, arrivals, mapped_file_type, file_size): with reput_dispatch, a put's
#   own rows (WrittenRows) dispatched without a scan as one compiled call; see
#   services/reput.ReputMessageService.dispatch_if_behind. Without it, puts make no rows.
#   IndexWorker(finish): with PutDispatch, a batch put's index keys put on a thread of its own
#   (csrc/rs_index_worker.h) while the putter goes on: `.submit(rows, count, buf, mf,
#   target)` hands rows[:count] over and returns the rows array of the job before (or None);
#   `.settle()` waits for the job and calls finish(rows, buf, target, row, skip, again)
#   where the worker stopped before the last key; `.pending`, `.jobs`, `.waited`,
#   `.reclaimed` (jobs taken back and run by the settling thread), and `.close()`. See
#   index_service.IndexService.settle. Without it, the putter puts the keys.
#   ReadPath(message_type, mapped_file_type, on_corrupt, result_type, statuses,
#   batch_result_type): get_message's and get_batch's unit walk as one compiled call
#   (`.read(...)`; `.pull(store, cq, offset, max_n, filter, max_bytes, subscription,
#   property_filter)` and `.pull_batch(...)`
#   for get_message's and get_batch's common cases, results built in the call), and
#   MessageExt objects from scanned rows (`.decode_rows(buf, rows, n)`), with
#   read_path.PyReadPath's arguments and results, and its get statistics (`found`, `miss`,
#   `transferred`, `time_max`). Without it, PyReadPath over commitlog_scan. Its
#   `.live_walk(...)` is LiveReader's unit loop (live.py), which the other backends run in
#   Python.
#   LazyField(message_type, slot, kind, pos, fallback, assigned_none): one of
#   message.MessageExt's lazy fields (body, stored_body, the offsets, body CRC, born time) as
#   a compiled descriptor, which message.py puts in place of the Python property `fallback`
#   when the backend imports; it reads the field from the message's record copy on first
#   use, as the property does, and hands it every uncommon case; a slot holding
#   `assigned_none` reads as None. Without it, the properties.
#   install_dealloc(cls): gives __slots__ class `cls` (message.MessageExt, when message.py
#   imports) a compiled tp_dealloc doing what CPython's subtype_dealloc does for it (its
#   members released, the object freed) without its generic walk of the class chain; TypeError
#   for a class with __dict__, __weakref__, a finalizer or a base holding slots. Without it,
#   CPython's.
#   timeup_encode(src, rec_pos, rec_size, first, n, topics, topic_off, max_body, max_record,
#   out, out_pos, out_size, out_key): the delivered records of scheduled ones (messageTimeup),
#   encoded in bulk in their common case and stopping at any other record, with
#   rs_timeup_encode's arguments and stop reasons (csrc/rs_sched.h); see
#   services/schedule.ScheduleMessageService._deliver_encoded. Without it, each record goes
#   through MessageExt.decode, message_timeup and put_messages.
#   batch_columns(bodies, tags, keys): put_batch's argument layout (batch.columns) in one
#   compiled call for its common case (a list of bytes; tags and keys None, a str or a list
#   of str / None), with the lengths and maxima the put path validates; None for anything
#   else, which batch.columns then lays out (or refuses) in Python. Without it, batch.columns
#   over column_join.
#   SYNC_RANGE_FD_UNUSED = True: sync_range ignores its `fd` (it msyncs the mapping), so
#   FileSystem.sync_mapped passes -1 and opens no descriptor for it: an open and a close per
#   sync were a sixth of SYNC_FLUSH's CPU per message with 16 threads putting. Without it,
#   the file is opened for each sync (the pure backend's fdatasync needs it).
#   sync_written(buf, start, length, drop): with SYNC_RANGE_FD_UNUSED, sync_range's msync of
#   buf[start:start+length] preceded (drop true, on Linux) by FileSystem.unmap_written's
#   MADV_DONTNEED of the range's whole pages below the one holding its end, in one call that
#   releases the GIL once: FileSystem.sync_written. Without it, the two calls.
#   write_behind(fd, start, length, chunk): write [start, start+length) of the file open as
#   `fd` back to the disk and wait for it, `chunk` bytes at a time with two in flight, without
#   making it durable (no metadata, no device cache flush), releasing the GIL (Linux's
#   sync_file_range). True once written; False where the system has no way to (nothing
#   written). Used by FileSystem.write_behind before the ASYNC_FLUSH flusher's msyncs
#   (MappedFile.flush). Without it, the msyncs alone.
#   space_prepare(requests): for each (path, offset, length, map, pop_start, pop_length),
#   posix_fallocate [offset, offset+length) of the file at `path` (never through a link) and,
#   if that succeeded, MADV_POPULATE_WRITE map[pop_start:pop_start+pop_length] (clipped to
#   the mapping; a map closed meanwhile is passed over), all in one call that releases the
#   GIL once (csrc/rs_space.h); returns each request's errno, 0 for success. Either part may
#   be empty (path None or length 0; map None or pop_length 0). Used by
#   FileSystem.reserve_many and populate_many for PopulateAheadService. Without it, one
#   FileSystem.reserve and prefault per file.
#   GroupCommit(flushed): SYNC_FLUSH's group commit waits (csrc/rs_gc.h) as a compiled object:
#   wait(offset, deadline_ns) sleeps without the GIL and answers RS_GC_DONE / LEAD / TIMEOUT /
#   CLOSED / LATE; try_lead(), done(flushed, ok, sync_ns), close(), reset(flushed), and the
#   state read for tests (flushed, leading, waiting, producers, gathering, gather_ns, relayed:
#   the served waits that the one served before woke); a leader gathers only while its sync
#   would cover less than `gather_bytes` (settable). Used by
#   services.flush.CompiledGroupCommitService. Without it, GroupCommitService's Python waits.
#   SyncWait(group_commit, resume, wakeup, config, ok, timed_out, wait_key): with GroupCommit,
#   CommitLog.after_put for SYNC_FLUSH (MessageStore._after_put_sync) as a compiled callable;
#   see CompiledGroupCommitService.after_put.
OPTIONAL_NAMES = (
    "Mapping",
    "GroupCommit",
    "SyncWait",
    "cq_dispatch",
    "CqSlots",
    "index_dispatch",
    "reput_dispatch",
    "PutDispatch",
    "IndexWorker",
    "PutPath",
    "ReadPath",
    "LazyField",
    "install_dealloc",
    "timeup_encode",
    "batch_columns",
    "SYNC_RANGE_FD_UNUSED",
    "sync_written",
    "write_behind",
    "space_prepare",
)


class Kernels(Protocol):
    NAME: str

    def crc32(self, data, value: int = 0) -> int:
        """zlib.crc32(data, value): IEEE CRC-32, unsigned. RocketMQ's BODYCRC is this &
        0x7FFFFFFF."""

    def java_hash(self, data) -> int:
        """Java String.hashCode of the UTF-8 text `data`, over UTF-16 code units, as a signed int32.

        Invalid UTF-8 is decoded as Java and Python both do it: each maximal ill-formed subpart
        (Unicode ch. 3, the WHATWG UTF-8 decoder) becomes one U+FFFD."""

    def msg_size(self, sys_flag: int, body_len: int, topic_len: int, props_len: int,
                 v2: bool = False) -> int:
        """TOTALSIZE of a record (doc/01 §3.1, calMsgLength). Raises MessageIllegalError when
        the topic is longer than its length field (127 for v1) or properties exceed 32767 bytes."""

    def msg_encode(self, out, pos: int, topic, body, props, queue_id: int, flag: int,
                   queue_offset: int, phy_offset: int, sys_flag: int, born_timestamp: int,
                   born_host, store_timestamp: int, store_host, reconsume_times: int,
                   prepared_tx_offset: int, v2: bool = False) -> int:
        """Encode one CommitLog record at out[pos:], computing the masked body CRC.

        born_host / store_host are packed socket addresses: 4-byte IPv4 + 4-byte port (8 bytes),
        or 16-byte IPv6 + 4-byte port (20 bytes); their lengths must agree with sys_flag's
        BORNHOST_V6_FLAG / STOREHOSTADDRESS_V6_FLAG. Returns the record size."""

    def commitlog_append(self, out, pos: int, record, queue_offset: int, phy_offset: int,
                         store_timestamp: int) -> int:
        """Copy one encoded record to out[pos:] and patch QUEUEOFFSET, PHYSICALOFFSET and
        STORETIMESTAMP (CommitLog.DefaultAppendMessageCallback#doAppend). Returns its size."""

    def commitlog_append_batch(self, out, pos: int, limit: int, records, queue_offsets,
                               phy_base: int, store_timestamp: int) -> Tuple[int, int]:
        """Append whole records from the concatenated `records` to out[pos:limit], each only if
        it leaves END_FILE_MIN_BLANK_LENGTH bytes before `limit` (doc/01 §3.9). Record k gets
        QUEUEOFFSET queue_offsets[k] (int64 array), PHYSICALOFFSET phy_base + bytes before it,
        and the one batch store timestamp. Returns (records appended, bytes appended)."""

    def commitlog_blank(self, out, pos: int, size: int) -> int:
        """Write the 8-byte END_OF_FILE marker: int `size` (bytes left in the file), BLANK magic."""

    def commitlog_scan(self, buf, start: int, end: int, check_crc: bool,
                       out) -> Tuple[int, int, int, int]:
        """Validate records in buf[start:end] (CommitLog#checkMessageAndReturnSize) and fill one
        SCAN_DTYPE row per valid record into `out` (a numpy array), at most len(out) rows.

        Returns (count, stop_pos, reason, stop_size): reason is a format.SCAN_* value telling why
        the scan stopped at stop_pos; stop_size is the blank's size for SCAN_BLANK and TOTALSIZE
        for SCAN_MISMATCH, else 0. Never raises on bad data: that is what `reason` is for."""

    def cq_encode(self, out, pos: int, offset: int, size: int, tags_code: int) -> int:
        """Write one 20-byte ConsumeQueue unit at out[pos:]. Returns 20."""

    def cq_encode_batch(self, out, pos: int, offsets, sizes, tags_codes) -> int:
        """Write len(offsets) units (int64, int32, int64 arrays) from out[pos:]. Returns bytes."""

    def cq_search(self, buf, start: int, end: int, phy_offset: int) -> int:
        """Binary search over units in buf[start:end] (ascending commitLogOffset): the index,
        relative to `start`, of the first unit whose offset >= phy_offset; the unit count if
        none."""

    def tags_match(self, props, tags, ends) -> bool:
        """Whether the TAGS value of the properties string `props` (found as commitlog_scan
        finds it: the last valid segment wins) equals one of the UTF-8 strings
        tags[ends[i-1]:ends[i]] (`ends` int64, ascending, ends[-1] = 0), byte for byte: a
        tag subscription's check of the record's tag string after its unit's tagsCode matched.
        A record without TAGS matches none. Raises for `ends` not ascending within `tags`."""

    def index_hash(self, key) -> int:
        """IndexFile key hash (IndexFile#indexKeyHashMethod): abs(String.hashCode) of the UTF-8
        key (callers pass `topic#key`), with Integer.MIN_VALUE, whose Java Math.abs is still
        negative, mapped to 0. Always >= 0."""

    def index_put(self, buf, slot_num: int, index_num: int, key_hash: int, phy_offset: int,
                  store_timestamp: int) -> int:
        """IndexFile#putKey (doc/02 §2.3) into `buf`, a whole index file of `slot_num` slots
        and `index_num` entries (len(buf) >= 40 + 4 slot_num + 20 index_num, else bounds
        error): write entry number indexCount, link it at the head of slot key_hash % slot_num,
        and update the header in place (first entry: begin fields; every entry: hashSlotCount,
        indexCount, end fields). Returns the new indexCount (>= 2), or 0 when the file is full
        (nothing written). A negative key_hash is an argument error."""

    def index_put_batch(self, buf, slot_num: int, index_num: int, key_hashes, phy_offsets,
                        store_timestamps) -> int:
        """index_put for each key (int32, int64, int64 arrays of one length) in order, stopping
        at the first that does not fit. Returns the number put: fewer than len(key_hashes)
        means the file is full and the caller rolls to a new file for the rest."""

    def index_keys(self, buf, rows, out_hashes, out_rows) -> Tuple[int, int]:
        """The index keys IndexService#buildIndex puts for scanned records: for each SCAN_DTYPE
        row of `rows` (commitlog_scan output over `buf`) that is not a ROLLBACK record, the
        index_hash of topic#UNIQ_KEY (when non-empty) then of topic#piece for each non-empty
        piece of KEYS split on single spaces (the last valid property segment of a name wins).
        Hashes and their row numbers go to out_hashes / out_rows (int32 arrays); a row's keys
        are written all or none. Returns (keys written, rows consumed): fewer rows than given
        means the outputs filled up."""

    def index_lookup(self, buf, slot_num: int, index_num: int, key_hash: int, begin: int,
                     end: int, max_num: int, out_offsets) -> int:
        """IndexFile#selectPhyOffset (doc/02 §2.6): walk key_hash's chain newest-first and
        write into `out_offsets` (a writable int64 array) the phyOffset of every entry whose
        keyHash equals key_hash and whose time lies in [begin, end]. Returns the count, at most
        min(max_num, len(out_offsets)). The walk also stops after index_num hops and on any
        out-of-range prevIndex, so a corrupt chain that loops terminates; it never reads
        outside the file's geometry."""

    def index_walk(self, buf, slot_num: int, index_num: int, key_hash: int, begin: int,
                   end: int, at: int, hops: int, out_offsets) -> Tuple[int, int, int]:
        """index_lookup that goes on where an earlier call stopped: `at` is 0 to start at
        key_hash's slot, the entry to resume at, or < 0 when the walk is over (nothing read);
        `hops` the hops walked so far (0 to start). Fills out_offsets (int64) up to its length
        and returns (count, at, hops) for the next call; at is -1 once the chain ended by any
        of index_lookup's stops, whose index_num-hop bound counts every call's hops."""

    def index_match(self, buf, limit: int, pos: int, phy_offset: int, topic, key, begin: int,
                    end: int) -> int:
        """Whether the record at buf[pos:limit] (limit: the end of readable data) answers a
        query for `key` under `topic` (UTF-8 bytes): a whole, valid record by the scan's
        record check (CRC not checked), PHYSICALOFFSET == phy_offset, STORETIMESTAMP in
        [begin, end], topic bytes equal, and `key` (non-empty) equal to its UNIQ_KEY or to a
        piece of its KEYS split on single spaces (last valid segment of a name wins, as
        index_keys reads them). A None topic or key is not compared (a msgId names a record
        by its offset alone). Returns the record's TOTALSIZE if so, else 0: damage is a 0,
        never an exception. limit outside [0, len(buf)] or pos outside [0, limit] is a bounds
        error."""

    def index_query(self, files, mfq, topic: str, key: str, want: int, begin: int, end: int,
                    decode) -> Tuple[list, int, int, int]:
        """MessageStore.query_message's work as one call (doc/02 §2.6): hash topic#key, walk
        its chain in each IndexFile of `files` newest file first (files whose time range
        misses the window are passed over; the walk stops after a file that begins before
        it), each chain newest first, over entries in [begin - 999 ms, end] (entry times are
        whole seconds), and judge each offset once with index_match against the CommitLog
        file of MappedFileQueue `mfq` holding it, until `want` records answer or the chains
        end. Returns (messages, their total bytes, the last file's endTimestamp and
        endPhyOffset): messages are decode(record bytes) of the kept records, in ascending
        offset order; a backend whose ReadPath is compiled also takes that ReadPath as
        `decode`, and builds each message from the record check's row as get_message does
        (the same message, the record parsed once). Mappings are borrowed as buffers while
        read, so they are not unmapped under the call; a file unmapped already holds
        nothing."""

    def sync_range(self, buf, fd: int, start: int, length: int) -> None:
        """Make buf[start:start+length] (a writable mmap of `fd`) durable, without holding the
        GIL."""

    def batch_encode(self, out, pos: int, limit: int, topic, queue_id: int, bodies, body_off,
                     a, a_off, b, b_off, frags, frag_off, first: int, n: int, flag: int,
                     sys_flag: int, born_timestamp: int, born_host, store_timestamp: int,
                     store_host, queue_offset: int, phy_base: int,
                     flags_or=None, rows=None, tags_col: int = -1, phys=None,
                     sizes=None) -> Tuple[int, int]:
        """Encode records first..n-1 of a columnar batch of one topic and queue straight into
        out[pos:limit], each only if it leaves 8 bytes before `limit` for the blank record
        (as commitlog_append_batch). Columns are Arrow-style (data, int64 offsets of n + 1):
        `bodies`, and the optional `a` and `b` (None data and offsets: empty). Record i's
        properties are frags[f0:f1] + a[i] + frags[f1:f2] + b[i] + frags[f2:f3] with
        frag_off = (f0, f1, f2, f3); its QUEUEOFFSET is queue_offset + i - first, its
        PHYSICALOFFSET phy_base + the bytes written before it, its SYSFLAG sys_flag |
        flags_or[i] when `flags_or` (n int32s, no host bit) is given; reconsume times and
        prepared offset are 0. Bytes equal msg_encode's for the same fields. Returns (count, bytes).
        Offsets outside their data, or decreasing, are a bounds error; a record whose
        properties exceed 32767 bytes is RS_E_TOO_LONG. Runs without the GIL. `rows`: a
        SCAN_DTYPE array with room for n - first rows, or None; rows[k] then gets record
        first + k's row exactly as commitlog_scan(out, pos, pos + bytes, False, ...) makes it,
        so a put can hand its dispatch the rows of what it wrote (doc/03 §8). `tags_col` tells
        where the caller laid out TAGS (batch.Columns.tags_col): 1 or 2, column a's or b's
        item (empty: none); 0, no column's (every record has record `first`'s); -1, unknown
        (searched for in each record). It only spares the search; a wrong claim gives wrong
        rows. `phys`, `sizes`: writable int64 arrays with room for n - first, or None;
        phys[k] and sizes[k] then get record first + k's PHYSICALOFFSET and length, so the
        put returns them without arithmetic over the batch (TypeError for another kind of
        array)."""

    def column_join(self, items, text: bool):
        """A list of bytes, None (empty) and, if `text`, str (encoded UTF-8) as one bytes
        object and its len(items) + 1 int64 offsets (a buffer): (data, offsets), so item i is
        data[offsets[i]:offsets[i + 1]]. None when `items` is not a list or holds any other
        type, for the caller's general path."""


def int64_output(arr, need, what):
    """How the Python backends take an optional int64 output column (batch_encode's `phys`
    and `sizes`), as the compiled one does: None stays None; anything but a writable,
    contiguous buffer of native int64s raises TypeError; fewer than `need` of them raises
    RS_E_ARG. Returns a writable memoryview of it."""
    if arr is None:
        return None
    try:
        mv = memoryview(arr)
    except TypeError:
        mv = None
    if (mv is None or mv.readonly or mv.ndim != 1 or mv.itemsize != 8
            or mv.format.lstrip("@=") not in ("q", "l") or not mv.c_contiguous):
        raise TypeError(f"batch_encode: {what} must be a writable, contiguous int64 array")
    if len(mv) < need:
        raise_for_status(RS_E_ARG, f"batch_encode: too little room in {what}")
    return mv
