# SPDX-License-Identifier: Apache-2.0
"""The read path of MessageStore: pulling from a ConsumeQueue (getMessage, and its columnar
form get_batch) and walking the CommitLog in order, over the parts of a loaded store that
MessageStore hands in.

The unit walk is one call of a ReadPath: the backend's compiled one when it has it (cext),
else PyReadPath below, which is the reference both meet. The walk reads a queue's units where
they lie in its mapping, so a call costs the same whatever the queue's backlog; it checks each
unit's record with the record-check kernel where it lies in its CommitLog file, and builds
MessageExt objects from the kernel's row (properties decoded on first use), or, for get_batch,
hands the rows themselves back beside views of the bodies in the mapping."""
import logging
import sys
import time

import numpy as np

from . import format as F
from .compression import decompress
from .errors import RS_E_ARG, RS_E_BOUNDS, StoreError, raise_for_status
from .mapped_file import MappedFile
from .message import MessageExt
from .status import GetMessageResult, GetMessageStatus as G, QueryMessageResult

log = logging.getLogger(__name__)
UNIT = F.CQ_STORE_UNIT_SIZE


# The bounds of one in-process get_message (a broker caps a remote pull at 32 messages or
# 256 KiB instead): max_msg_nums at most MAX_MSG_NUMS, and no message is added once the
# records collected reach MAX_BYTES (the first one always comes, whatever its size).
MAX_MSG_NUMS = 65_536
MAX_BYTES = 64 << 20


def _corrupt(queue_offset, phy_offset, reason):
    log.warning("unit at queue offset %d: the record at commit-log offset %d fails the record "
                "check (reason %d); skipped", queue_offset, phy_offset, reason)


def make_read_path(kernels):
    """The backend's compiled ReadPath if it has one, else PyReadPath over its kernels."""
    compiled = getattr(kernels, "ReadPath", None)
    if compiled is not None:
        return compiled(MessageExt, MappedFile, _corrupt, GetMessageResult,
                        (G.FOUND, G.NO_MATCHED_MESSAGE, G.MESSAGE_WAS_REMOVING),
                        GetBatchResult, sys.modules[__name__], QueryMessageResult)
    return PyReadPath(kernels, _corrupt)


def _find(files, offset, file_size):
    """MappedFileQueue.find_by_offset over a snapshot of its list."""
    if not files:
        return None
    first = files[0].file_from_offset
    if offset < first or offset >= files[-1].file_from_offset + file_size:
        return None
    idx = offset // file_size - first // file_size
    if 0 <= idx < len(files):
        f = files[idx]
        if f.file_from_offset <= offset < f.file_from_offset + file_size:
            return f
    for f in files:
        if f.file_from_offset <= offset < f.file_from_offset + file_size:
            return f
    return None


def _open(f):
    """(read-only view of f's mapping, start offset, readable end offset), or None when the
    file was unmapped meanwhile (cleaning). The view keeps the mapping from being closed."""
    try:
        mv = memoryview(f.mm).toreadonly()
    except (ValueError, BufferError):
        return None
    start = f.file_from_offset
    return mv, start, start + min(f.committed_position, len(mv))


def _row_inside(row, buf_len):
    """Whether the fields a SCAN_DTYPE row (a tuple) locates lie inside its record and the
    record inside a buffer of buf_len bytes (pyx/_read.pxi _row_inside)."""
    pos, size, sysf = row[0], row[7], row[9]
    hosts = F.pos_record_tail(sysf)
    return (pos >= 0 and size >= hosts and pos + size <= buf_len
            and all(0 <= off and 0 <= length and off + length <= size
                    for off, length in (row[13:15], row[15:17], row[17:19])))


class PyReadPath:
    """The unit walk of get_message and get_batch over the contract's kernels: the reference
    that the compiled ReadPath (pyx/_read.pxi) meets, at pure or cffi speed."""

    def __init__(self, kernels, on_corrupt):
        self._k = kernels
        self._on_corrupt = on_corrupt
        # Statistics of pull and pull_batch, as the compiled ReadPath keeps them.
        self.found = self.miss = self.transferred = self.time_max = 0

    def _count(self, n, t0):
        if n:
            self.found += 1
            self.transferred += n
        else:
            self.miss += 1
        ms = (time.monotonic_ns() - t0) // 1_000_000
        if ms > self.time_max:
            self.time_max = ms

    def decode_rows(self, buf, rows, n):
        """MessageExt objects of the first `n` rows (format.SCAN_DTYPE, commitlog_scan's
        output over `buf`): iter_messages and dump, without re-parsing a record."""
        if getattr(rows, "dtype", None) != F.SCAN_DTYPE:
            raise_for_status(RS_E_ARG, "decode_rows: rows must be a SCAN_DTYPE array")
        if n < 0 or n > len(rows):
            raise_for_status(RS_E_BOUNDS, "decode_rows: more rows than given")
        mv = memoryview(buf).cast("B")
        out = []
        for row in rows[:n].tolist():
            if not _row_inside(row, len(mv)):
                raise_for_status(RS_E_BOUNDS, "decode_rows: a row outside the buffer")
            out.append(MessageExt.from_row(mv, row))
        return out

    def get_message(self, store, group, topic, queue_id, offset, max_msg_nums,
                    message_filter):
        """The compiled ReadPath's fused entry (arguments, catch-up and pull in one call);
        here always None: MessageStore checks, catches up and calls pull() in Python."""
        return None

    get_batch = get_message

    def query_message(self, store, topic, key, max_num, begin, end):
        """The compiled ReadPath's fused key query; here always None: MessageStore checks,
        catches up and calls query.query_message in Python."""
        return None

    def pull(self, store, cq, offset, max_n, message_filter, max_bytes, subscription=None,
             property_filter=None):
        """get_message's common case for queue `cq`: its GetMessageResult, or None when the
        answer is decided before a unit is read (the offset outside the queue) or the first
        unit's file is missing, which get_message below answers."""
        t0 = time.monotonic_ns()
        max_off = cq.mfq.get_max_offset() // UNIT
        min_logic = cq.min_logic_offset
        if max_off == 0 or offset < min_logic // UNIT or offset >= max_off:
            return None
        max_py = store.commitlog.mfq.get_max_offset()
        commitlog = store.commitlog
        messages, scanned, removing, max_phy, filtered = self.read(
            cq.mfq.files, cq.file_size, commitlog.mfq.files, commitlog.file_size, offset,
            max_off, min_logic, max_n, scan_limit(max_n), max_bytes, message_filter,
            subscription=subscription, property_filter=property_filter)
        if scanned < 0:
            return None
        self._count(len(messages), t0)
        if messages:
            return GetMessageResult(G.FOUND, offset + scanned, min_logic // UNIT, max_off,
                                    messages, max_py - max_phy > store.mem_limit, filtered)
        return GetMessageResult(G.MESSAGE_WAS_REMOVING if removing else G.NO_MATCHED_MESSAGE,
                                offset + scanned, min_logic // UNIT, max_off, messages, False,
                                filtered)

    def pull_batch(self, store, cq, offset, max_n, message_filter, max_bytes,
                   subscription=None, property_filter=None):
        """get_batch's common case for queue `cq`: its GetBatchResult, or None as for pull."""
        t0 = time.monotonic_ns()
        max_off = cq.mfq.get_max_offset() // UNIT
        min_logic = cq.min_logic_offset
        if max_off == 0 or offset < min_logic // UNIT or offset >= max_off:
            return None
        max_py = store.commitlog.mfq.get_max_offset()
        commitlog = store.commitlog
        rows = bytearray(max_n * F.SCAN_DTYPE.itemsize)
        row_file = bytearray(max_n * 4)
        held = []
        try:
            n, scanned, removing, max_phy, filtered = self.read(
                cq.mfq.files, cq.file_size, commitlog.mfq.files, commitlog.file_size, offset,
                max_off, min_logic, max_n, scan_limit(max_n), max_bytes, message_filter, rows,
                held, row_file, subscription, property_filter)
        except BaseException:
            # A filter raised: no result will own the files held so far.
            for f in held:
                f.release()
            raise
        if scanned < 0:
            for f in held:
                f.release()
            return None
        self._count(n, t0)
        if n:
            return GetBatchResult(G.FOUND, offset + scanned, min_logic // UNIT, max_off, n,
                                  rows, row_file, held, max_py - max_phy > store.mem_limit,
                                  filtered)
        return GetBatchResult(G.MESSAGE_WAS_REMOVING if removing else G.NO_MATCHED_MESSAGE,
                              offset + scanned, min_logic // UNIT, max_off,
                              filtered_count=filtered)

    def read(self, cq_files, cq_file_size, log_files, log_file_size, offset, max_off,
             min_logic, max_n, scan_limit, max_bytes, message_filter, rows=None, held=None,
             row_file=None, subscription=None, property_filter=None):
        """Walk the queue's units from queue offset `offset` (DefaultMessageStore#getMessage's
        loop, doc/01 §6) over snapshots of the queue's and the CommitLog's file lists.

        A unit is filtered out, without counting toward max_n, when `message_filter(tags_code)`
        is false, when `subscription` (a subscription.Subscription with tags) holds no hash
        its tagsCode's low 32 bits may be (ExpressionMessageFilter#isMatchedByConsumeQueue) or,
        once its record is read, not its TAGS string (the tags_match kernel), or when
        `property_filter(properties dict)` is false. A unit is also skipped when its record
        fails the record check (on_corrupt is told). The walk goes on into
        the queue's next file while fewer than max_n were found, up to scan_limit units and
        the queue's max offset `max_off`, and adds no record once max_bytes are collected
        (the first always comes). A unit whose record's file is gone (or not yet readable)
        makes the walk skip the rest of that CommitLog file.

        Without `rows`: returns (MessageExt list, units scanned, removing, last offset, units
        filtered out).
        With `rows` (a SCAN_DTYPE array or a writable buffer of such rows), `held` (a list)
        and `row_file` (int32 array or buffer), each found
        record's row goes to rows[i] (pos relative to its file), the CommitLog files they lie
        in are held (MappedFile.hold) and appended to `held`, and row_file[i] indexes it; the
        first result is then the row count. Units scanned is -1 when the first unit's queue
        file is missing or holds no unit there (OFFSET_FOUND_NULL). `removing` says a record's
        file was found gone before any record was found and after the last unit filtered out
        (MESSAGE_WAS_REMOVING; the broker's status is the later of the two)."""
        batch = rows is not None
        if batch:
            if getattr(rows, "dtype", F.SCAN_DTYPE) != F.SCAN_DTYPE:
                raise_for_status(RS_E_ARG, "read: rows must be a SCAN_DTYPE array")
            # Plain writable buffers (bytearray) are taken as rows and int32s.
            rows = np.frombuffer(rows, dtype=F.SCAN_DTYPE)
            row_file = np.frombuffer(row_file, dtype=np.int32)
            if min(len(rows), len(row_file)) < max_n or held is None:
                raise_for_status(RS_E_ARG, "read: fewer output rows than max_n")
        messages = [] if not batch else None
        check = self._k.commitlog_scan
        one = np.empty(1, dtype=F.SCAN_DTYPE)   # per call: readers run in many threads
        found = scanned = nbytes = max_phy = filtered = 0
        removing = full = False
        codes = None
        if subscription is not None and subscription.tags:
            codes = frozenset(subscription.codes.tolist())
            tag_bytes, tag_ends = subscription.tag_bytes, subscription.tag_ends
            tags_match = self._k.tags_match
        first = True
        skip_below = -1
        lf = log = None
        log_rows = False
        ahead = []              # rows checked ahead in the current CommitLog file
        at = 0
        # Units are read in chunks of what the call can use, never the queue's whole tail.
        chunk = max(64, 2 * max_n)
        try:
            while True:
                pos = (offset + scanned) * UNIT
                f = None if pos < min_logic else _find(cq_files, pos, cq_file_size)
                q = _open(f) if f is not None else None
                if q is None or pos >= q[2]:
                    if first:
                        scanned = -1
                    break
                first = False
                qmv, qstart, qend = q
                take = min((qend - pos) // UNIT, scan_limit - scanned)
                done = 0
                while done < take and not full:
                    k = min(take - done, chunk)
                    units = np.frombuffer(qmv, dtype=F.CQ_DTYPE, count=k,
                                          offset=pos - qstart + done * UNIT).tolist()
                    done += k
                    for i, (phy, size, tags) in enumerate(units):
                        if phy < skip_below:
                            scanned += 1
                            continue
                        if found and (found >= max_n or nbytes + size > max_bytes):
                            full = True
                            break
                        scanned += 1
                        if message_filter is not None and not message_filter(tags):
                            filtered += 1
                            removing = False
                            continue
                        if codes is not None:
                            low = tags & 0xFFFFFFFF     # Java's tagsCode.intValue()
                            if (low - (1 << 32) if low & 0x80000000 else low) not in codes:
                                filtered += 1
                                removing = False
                                continue
                        if size <= 0 or phy < 0:    # no record is there: a damaged unit
                            self._on_corrupt(offset + scanned - 1, phy, RS_E_ARG)
                            continue
                        if not (log is not None and log[1] <= phy and phy + size <= log[2]):
                            if batch and lf is not None and not log_rows:
                                held.pop().release()
                            log = None
                            log_rows = False
                            ahead = []
                            lf = _find(log_files, phy, log_file_size)
                            if lf is not None and (not batch or lf.hold()):
                                if batch:
                                    held.append(lf)
                                log = _open(lf)
                                if log is None and batch:
                                    held.pop().release()
                                    lf = None
                            else:
                                lf = None
                        if not (log is not None and log[1] <= phy and phy + size <= log[2]):
                            if not found:
                                removing = True
                            skip_below = phy + log_file_size - phy % log_file_size
                            continue
                        rel = phy - log[1]
                        while at < len(ahead) and ahead[at][0] < rel:
                            at += 1
                        if at < len(ahead) and ahead[at][0] == rel and ahead[at][7] <= size:
                            row = ahead[at]
                            at += 1
                        else:
                            # The units after this one that point right behind its record
                            # (a queue written alone) are checked in the same call; each is
                            # taken below only where its own unit would have it.
                            end = rel + size
                            j = i + 1
                            last = min(len(units), i + max_n - found)
                            while j < last:
                                p2, s2, _ = units[j]
                                if p2 - log[1] != end or s2 <= 0 or p2 + s2 > log[2]:
                                    break
                                end += s2
                                j += 1
                            out = one if j == i + 1 else np.empty(j - i, dtype=F.SCAN_DTYPE)
                            n, _, reason, _ = check(log[0], rel, end, False, out)
                            ahead = out[:n].tolist()
                            row = ahead[0] if n else None
                            if row is not None and row[7] > size:
                                row, reason = None, F.SCAN_PARTIAL   # runs past its unit
                            at = 1
                        if row is None or row[1] != phy:
                            if row is None:
                                self._on_corrupt(offset + scanned - 1, phy, reason)
                            continue
                        m = None
                        if codes is not None:
                            p0 = row[0] + row[17]
                            if not tags_match(log[0][p0:p0 + row[18]], tag_bytes, tag_ends):
                                filtered += 1
                                removing = False
                                continue
                        if property_filter is not None:
                            m = MessageExt.from_row(log[0], row)
                            if not property_filter(m.properties):
                                filtered += 1
                                removing = False
                                continue
                        if batch:
                            rows[found] = row
                            # The unit's tagsCode, what a filter sees (a delayed message's
                            # unit holds its delivery time, not the TAGS hash).
                            rows[found]["tags_code"] = tags
                            row_file[found] = len(held) - 1
                            log_rows = True
                        else:
                            messages.append(m if m is not None
                                            else MessageExt.from_row(log[0], row))
                        found += 1
                        nbytes += size
                        max_phy = phy
                    del units
                del qmv, q
                if full or found >= max_n or scanned >= scan_limit \
                        or offset + scanned >= max_off:
                    break
        finally:
            if batch and lf is not None and not log_rows and held:
                held.pop().release()
        return (found if batch else messages), scanned, removing, max_phy, filtered


def prelude(cq, offset, correction):
    """The statuses of a read of queue `cq` decided before any unit is read: (min, max, result
    or None), as DefaultMessageStore#getMessage orders them; `correction` is the store's
    next_offset_correction. MessageStore's get_message and get_batch ask this when their
    ReadPath's pull answers None."""
    min_off = cq.min_logic_offset // UNIT
    max_off = cq.mfq.get_max_offset() // UNIT
    if max_off == 0:
        return min_off, max_off, (G.NO_MESSAGE_IN_QUEUE, correction(offset, 0))
    if offset < min_off:
        return min_off, max_off, (G.OFFSET_TOO_SMALL, correction(offset, min_off))
    if offset == max_off:
        return min_off, max_off, (G.OFFSET_OVERFLOW_ONE, offset)
    if offset > max_off:
        return min_off, max_off, (G.OFFSET_OVERFLOW_BADLY, correction(offset, max_off))
    return min_off, max_off, None


def scan_limit(max_msg_nums):
    # Units looked at, filtered out or not: the broker's bound on one call's scan.
    return max(16000, max_msg_nums * UNIT) // UNIT


def found_null(cq, offset, correction):
    """OFFSET_FOUND_NULL: no unit where the offset says (its queue file is gone, or not yet
    written); the next offset is the next file's first."""
    return G.OFFSET_FOUND_NULL, correction(offset, cq.roll_next_file(offset))


class _FileHold:
    """A batch's hold on one CommitLog file (MappedFile.hold), once a body view of it was
    asked for: its read-only view of the mapping keeps the pages mapped even if a forced
    destroy unlinks the file, and every BodyBuffer over it refers to this object, so the hold
    lasts while any body view lives. Released once, by release() or when the last user goes."""
    __slots__ = ("mf", "view", "_released", "__weakref__")

    def __init__(self, mf):
        self.mf = mf
        self._released = False
        try:
            self.view = memoryview(mf.mm).toreadonly()
        except ValueError:
            # Only a destroy forced past destroy_maped_file_interval_forcibly unmaps a held
            # file: its bytes are gone (GetBatchResult.buffer says so).
            self.view = None

    def release(self):
        if not self._released:
            self._released = True
            self.mf.release()
            view = self.view
            if view is not None:
                try:
                    view.release()      # unpinned, unless body views were taken from it
                except BufferError:
                    pass

    def __del__(self):
        self.release()


class HeldFiles:
    """The CommitLog files a GetBatchResult holds (MappedFile.hold, once each: `held`) and,
    for each, the _FileHold that took its hold over once a body view of it was asked for
    (`holds`, None until then). release() lets every file go; when this object goes without
    release() (its result was dropped), the files no _FileHold took over are released, and
    the others stay held by their body views. The result itself has no finalizer: the
    compiled read path gives its results a compiled twin of this class (pyx/_read.pxi),
    whose release on deallocation costs no Python call."""
    __slots__ = ("held", "holds", "_done")

    def __init__(self, held):
        self.held = held
        self.holds = [None] * len(held)
        self._done = False

    def release(self):
        """Release each file, through its _FileHold when one took it over; once."""
        if self._done:
            return
        self._done = True
        for mf, hold in zip(self.held, self.holds):
            if hold is not None:
                hold.release()
            else:
                mf.release()

    def __del__(self):
        if self._done:
            return
        self._done = True
        for mf, hold in zip(self.held, self.holds):
            if hold is None:
                mf.release()


class BodyBuffer(np.ndarray):
    """A read-only uint8 view of one held CommitLog file: every slice of it refers to the
    _FileHold, so the file stays held and mapped while any body view lives."""

    def __array_finalize__(self, obj):
        self._hold = getattr(obj, "_hold", None)


def held_view(mf, start, end):
    """A read-only memoryview of `mf`'s bytes [start, end) that keeps the file held
    (MappedFile.hold) and mapped while it or any slice of it lives, as body views do; None when
    the file is being destroyed."""
    if not mf.hold():
        return None
    hold = _FileHold(mf)
    if hold.view is None:
        hold.release()
        return None
    buf = np.frombuffer(hold.view, dtype=np.uint8).view(BodyBuffer)
    buf._hold = hold
    return memoryview(buf[start:end])


class GetBatchResult:
    """get_batch's answer: get_message's status, next_begin_offset, min/max offsets,
    suggest_pulling_from_slave and filtered_count, and the records found as numpy columns in
    queue order.

    Columns: commit_log_offset, size, store_timestamp, tags_code (the ConsumeQueue unit's, as
    a filter sees it: the TAGS hash, or a delayed message's delivery time), queue_offset,
    born_timestamp, queue_id, sys_flag, body_crc, body_length; `rows` is the record-check
    kernel's whole row array (format.SCAN_DTYPE, pos relative to the record's file) and
    file_index the file of each row. Columns are views of `rows`, made when asked.
    `compressed` (bool) marks the records whose stored body is compressed (COMPRESSED_FLAG;
    sys_flag holds the codec, doc/01 §3.5).

    body(i) is a zero-copy, read-only memoryview of record i's body in its CommitLog file, as
    stored: a compressed body stays compressed there (original_body(i) decompresses it). The
    files stay held (their expiry and the store's shutdown wait, as for a held MappedFile)
    while the result or any body view lives, or until release(): body views taken before then
    stay readable, even after their file is deleted; none can be taken after. Use
    `with store.get_batch(...) as b:` to release at once."""

    __slots__ = ("status", "next_begin_offset", "min_offset", "max_offset",
                 "suggest_pulling_from_slave", "_n", "_raw", "_raw_file", "_rows", "_files",
                 "_buffers", "_released", "filtered_count")
    # Private slots the compiled read path (pyx/_read.pxi) fills when it builds a result.
    LENT_SLOTS = ("_n", "_raw", "_raw_file", "_rows", "_files", "_buffers", "_released")

    def __init__(self, status, next_begin_offset, min_offset, max_offset, n=0, rows=None,
                 row_file=None, held=(), suggest_pulling_from_slave=False, filtered_count=0):
        self.status = status
        self.filtered_count = filtered_count
        self.next_begin_offset = next_begin_offset
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.suggest_pulling_from_slave = suggest_pulling_from_slave
        self._n = n
        self._raw = rows
        self._raw_file = row_file
        self._rows = None
        # The MappedFiles held once each for this result, released by release() or when the
        # result goes (HeldFiles; None when none is held).
        self._files = HeldFiles(held) if held else None
        self._buffers = None
        self._released = False

    @property
    def message_count(self):
        return self._n

    def __len__(self):
        return self._n

    @property
    def rows(self):
        rows = self._rows
        if rows is None:
            if self._n:
                rows = np.frombuffer(self._raw, dtype=F.SCAN_DTYPE, count=self._n)
            else:
                rows = np.empty(0, dtype=F.SCAN_DTYPE)
            self._rows = rows
        return rows

    @property
    def file_index(self):
        if not self._n:
            return np.empty(0, dtype=np.int32)
        return np.frombuffer(self._raw_file, dtype=np.int32, count=self._n)

    commit_log_offset = property(lambda self: self.rows["phy_offset"])
    size = property(lambda self: self.rows["size"])
    store_timestamp = property(lambda self: self.rows["store_timestamp"])
    tags_code = property(lambda self: self.rows["tags_code"])
    queue_offset = property(lambda self: self.rows["queue_offset"])
    born_timestamp = property(lambda self: self.rows["born_timestamp"])
    queue_id = property(lambda self: self.rows["queue_id"])
    sys_flag = property(lambda self: self.rows["sys_flag"])
    body_crc = property(lambda self: self.rows["body_crc"])
    body_length = property(lambda self: self.rows["body_len"])
    # Body views are the stored bytes: this marks the compressed ones (doc/01 §3.5).
    compressed = property(lambda self: (self.rows["sys_flag"] & F.COMPRESSED_FLAG) != 0)

    def buffer(self, i):
        """The read-only uint8 view (BodyBuffer) of the CommitLog file holding record i;
        record i's body is buffer(i)[rows["pos"][i] + rows["body_off"][i]:][:body_length[i]]."""
        if self._released:
            raise StoreError("this batch was released: its body views must be taken "
                             "before release()")
        k = int(self.file_index[i])
        files = self._files
        if self._buffers is None:
            self._buffers = [None] * len(files.held)
        buf = self._buffers[k]
        if buf is None:
            hold = files.holds[k] = _FileHold(files.held[k])   # takes over the hold
            if hold.view is None:
                raise StoreError(
                    f"{hold.mf.path} was deleted while this batch held it (forced after "
                    "destroy_maped_file_interval_forcibly) and before a body view of it was "
                    "taken: its bodies are gone")
            buf = np.frombuffer(hold.view, dtype=np.uint8).view(BodyBuffer)
            buf._hold = hold
            self._buffers[k] = buf
        return buf

    def body(self, i):
        """Record i's body: a read-only memoryview into its CommitLog file, no copy."""
        row = self.rows[i]
        start = int(row["pos"]) + int(row["body_off"])
        return memoryview(self.buffer(i)[start:start + int(row["body_len"])])

    def original_body(self, i):
        """Record i's original body as bytes: body(i) decompressed when the record is
        compressed (CorruptBodyError, MissingCodecError as MessageExt.body), else a copy."""
        row = self.rows[i]
        where = (f"the message at commit-log offset {int(row['phy_offset'])} (queue offset "
                 f"{int(row['queue_offset'])})")
        return bytes(decompress(self.body(i), int(row["sys_flag"]), where))

    def bodies(self):
        """Every record's body(i), in order."""
        return [self.body(i) for i in range(self._n)]

    def release(self):
        """Let the held files go (expiry, shutdown); body views already taken stay readable."""
        if self._released:
            return
        self._released = True
        if self._files is not None:
            self._files.release()
        self._buffers = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return (f"GetBatchResult({self.status.name}, next_begin_offset="
                f"{self.next_begin_offset}, min={self.min_offset}, max={self.max_offset}, "
                f"messages={self._n}, filtered={self.filtered_count})")


def iter_messages(commitlog, kernels, decode_rows, from_offset=None):
    """Every record of `commitlog` in order, decoded (blank records skipped): the records the
    scan kernel validated, decoded from its rows by `decode_rows` (the store's
    ReadPath.decode_rows)."""
    rows = np.empty(1024, dtype=F.SCAN_DTYPE)
    offset = commitlog.min_offset if from_offset is None else from_offset
    end = commitlog.max_offset
    while 0 <= offset < end:
        mf = commitlog.mfq.find_by_offset(offset)
        if mf is None:
            break
        start = offset - mf.file_from_offset
        n, stop, reason, _ = kernels.commitlog_scan(mf.mm, start, mf.read_position, False,
                                                    rows)
        yield from decode_rows(mf.mm, rows, n)
        offset = mf.file_from_offset + stop
        if reason == F.SCAN_BLANK or (reason == F.SCAN_END
                                      and stop >= mf.read_position >= mf.file_size):
            offset = commitlog.roll_next_file(offset)
        elif reason != F.SCAN_END:
            break
