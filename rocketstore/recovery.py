# SPDX-License-Identifier: Apache-2.0
"""Startup recovery (doc/03 §5-§6), as plain functions over the parts of a loaded store that
MessageStore hands them (RecoveryParts: the CommitLog, its ConsumeQueues, the checkpoint, the
dispatchers), never the store itself. The CommitLog is changed through its own methods
(truncate_to, reset_queue_offsets); the index service is handed in by the store.

Recovery never raises on a bad tail: the scan stops at the last good record, everything after
it is truncated, and the RecoveryReport says what was dropped.
"""
import dataclasses
import logging
from typing import Any, Callable

import numpy as np

from . import format as F
from .config import BrokerRole
from .clock import monotonic_ns
from .dispatch import dispatch_all

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RecoveryReport:
    normal: bool                 # clean shutdown (no abort file)
    start_file: str = ""         # first CommitLog file scanned
    scanned_bytes: int = 0
    records: int = 0
    process_offset: int = 0      # where the CommitLog now ends
    truncated_bytes: int = 0     # CommitLog bytes dropped past process_offset
    stop_reason: str = ""
    dispatched: int = 0          # records re-dispatched into ConsumeQueues/index
    seconds: float = 0.0
    # Abnormal recovery rebuilds the index from where its surviving files end, which may be
    # well before start_file: -1 when the index was not rebuilt.
    index_rebuilt_from: int = -1
    index_redispatched: int = 0  # records handed to the index from index_rebuilt_from
    index_files_dropped: list = dataclasses.field(default_factory=list)  # past the checkpoint


@dataclasses.dataclass(frozen=True)
class RecoveryParts:
    """What recovery works on, wired by MessageStore (the one composition root) when it
    recovers: recovery reads and changes these and nothing else of the store."""
    commitlog: Any
    consume_queues: Callable[[], list]   # the loaded ConsumeQueues (all_consume_queues)
    checkpoint: Any                      # StoreCheckpoint; None before load
    kernels: Any
    config: Any
    dispatchers: list                    # what a re-dispatched record is handed to
    writable: bool


# Not a kernel outcome: the last record ends in zeros where its properties must end (_torn).
_SCAN_TORN = -1

_REASONS = {F.SCAN_END: "end", F.SCAN_BLANK: "blank", F.SCAN_EMPTY: "empty",
            F.SCAN_CORRUPT: "corrupt", F.SCAN_MISMATCH: "length mismatch",
            F.SCAN_PARTIAL: "partial record",
            F.SCAN_TOPIC: "corrupt (topic bytes are not a valid topic name)",
            _SCAN_TORN: "torn record (its tail was never written)"}


def scan_commitlog(commitlog, kernels, start_index, check_crc, dispatch=None, report=None,
                   start_pos=0, stop_index=None, torn_check=False):
    """Walk records from file `start_index` (at `start_pos`, a record's start) until one
    fails, or until file `stop_index` begins; return the offset where the walk stopped.
    With `torn_check`, a last record whose tail was never written stops the walk (_torn):
    recovery asks for it where a tail can be missing (see torn_tail_possible).

    With `dispatch`, every valid record is handed to it (abnormal recovery). Each file is
    read up to its written extent only (MappedFile.data_end): past it the file is zeros,
    and reading a hole through the mapping allocates it on tmpfs, or on a full disk kills
    the process with SIGBUS."""
    files = commitlog.mfq.files
    rows = np.empty(4096, dtype=F.SCAN_DTYPE)
    index = start_index
    mf = files[index]
    limit = mf.data_end()
    pos = start_pos
    while True:
        n, stop, reason, _ = kernels.commitlog_scan(mf.mm, pos, limit, check_crc, rows)
        if reason == F.SCAN_END and stop < limit and n > 1:
            # The rows filled up: the next call starts at the last record, so whichever call
            # meets the end of the data has the record before it (below).
            n -= 1
            stop = int(rows[n]["pos"])
        elif torn_check and n and (reason == F.SCAN_EMPTY or
                    (reason == F.SCAN_END and limit <= stop < mf.file_size)):
            # Never-written space follows: the last record may be torn (doc/03 §5.3).
            if _torn(mf.mm, rows[n - 1]):
                n -= 1
                stop = int(rows[n]["pos"])
                reason = _SCAN_TORN
        if report is not None:
            report.records += n
            report.scanned_bytes += stop - pos
        if n and dispatch is not None:
            dispatch(rows[:n], mf.mm)
            if report is not None:
                report.dispatched += n
        pos = stop
        if reason == F.SCAN_END and pos < limit:
            continue                       # the rows array filled up
        if reason == F.SCAN_END and pos < mf.file_size:
            reason = F.SCAN_EMPTY          # only never-written space follows
        if reason == F.SCAN_BLANK or (reason == F.SCAN_END and pos >= mf.file_size):
            index += 1
            if index >= len(files) or index == stop_index:
                # The last file ends in a blank: data ends where the next file would start.
                pos = mf.file_size
                break
            mf = files[index]
            limit = mf.data_end()
            pos = 0
            continue
        if report is not None:
            report.stop_reason = _REASONS.get(reason, str(reason))
        break
    return mf.file_from_offset + pos


def _torn(mm, row):
    """Whether the record of `row`, the last one before never-written space, lost its tail:
    a write cut short (a process killed in the middle of it, or an HA slave that received only
    part of a frame or was sent a frame cut inside the record) leaves zeros past the cut,
    and the lengths, the topic and the body CRC (which covers only the body) may all still
    hold. Properties end the record, and their last byte is that of the last value, or the
    0x01 after its name when the value is empty: zero only for a value ending in U+0000, which
    no system property has. Taken as complete, a torn record makes the store report an offset
    past bytes it does not have: a slave then asks its master for what follows and keeps the
    zeros for good (doc/03 §5.3)."""
    if row["props_len"] <= 0:
        return False
    end = int(row["pos"]) + int(row["size"])
    return mm[end - 1:end] == b"\0"


def torn_tail_possible(config, normal):
    """Where the last record's tail can be missing: always on a slave, which writes frames
    as they arrive and is sent frames cut inside records (a clean shutdown mid-frame leaves
    the cut too), and on a master after a crash (a power cut can leave the page holding a
    tail unwritten). Not after a master's clean shutdown, which wrote every record whole and
    flushed it: there a last property value that really ends in U+0000 is kept."""
    return config.broker_role is BrokerRole.SLAVE or not normal


def recover_consume_queues(queues):
    """recoverConsumeQueue: each queue from its last three files; the max physical end."""
    max_phy = -1
    for cq in queues:
        cq.recover()
        max_phy = max(max_phy, cq.max_physic_offset)
    return max_phy


def dirty_tail_bytes(mfq, offset, chunk=1 << 20):
    """Bytes from `offset` to the last non-zero byte of the queue: the data a truncation at
    `offset` drops (the zeros of never-written space do not count)."""
    for f in reversed(mfq.files):
        if f.file_from_offset + f.file_size <= offset:
            break
        lo = max(0, offset - f.file_from_offset)
        end = f.data_end()          # never read holes: see FileSystem.data_end
        while end > lo:
            start = max(lo, end - chunk)
            data = f.mm[start:end].rstrip(b"\0")
            if data:
                return f.file_from_offset + start + len(data) - offset
            end = start
    return 0


def truncate(commitlog, queues, process_offset, max_phy_of_cq, report):
    """Cut the CommitLog at `process_offset` and every ConsumeQueue unit past it (recovery,
    and MessageStore.reset_write_offset); `queues` the loaded ConsumeQueues. A zeroed tail
    that could not be synced raises its OSError once everything is cut (the CommitLog's
    first), so no queue is left pointing past the log."""
    report.truncated_bytes = dirty_tail_bytes(commitlog.mfq, process_offset)
    failed = None
    try:
        commitlog.truncate_to(process_offset)
    except OSError as exc:
        failed = exc
    if max_phy_of_cq >= process_offset:
        for cq in queues:
            try:
                cq.truncate_dirty_logic_files(process_offset)
            except OSError as exc:
                failed = failed or exc
    if failed is not None:
        raise failed


def _recover_empty(parts):
    """No CommitLog at all: nothing the ConsumeQueues point at exists, so they go too."""
    parts.commitlog.truncate_to(0)
    if parts.writable:
        for cq in parts.consume_queues():
            cq.destroy()
    return 0


def recover_normally(parts, max_phy_of_cq, report):
    """recoverNormally (4.9.x): scan the last three files; truncate after the last good one."""
    commitlog = parts.commitlog
    files = commitlog.mfq.files
    if not files:
        return _recover_empty(parts)
    # 4.9.x scans the last three files. After a clean shutdown every record was dispatched,
    # so the file holding the ConsumeQueues' end is enough (5.3.x starts there): a restart
    # then costs at most one file's scan whatever the store's size.
    start = max(0, len(files) - 3)
    holder = commitlog.mfq.find_by_offset(max_phy_of_cq) if max_phy_of_cq > 0 else None
    if holder is not None:
        start = max(start, files.index(holder))
    report.start_file = files[start].file_name
    process = scan_commitlog(commitlog, parts.kernels, start, parts.config.check_crc_on_recover,
                             report=report, torn_check=torn_tail_possible(parts.config, True))
    truncate(commitlog, parts.consume_queues(), process, max_phy_of_cq, report)
    return process


def _matched_for_abnormal(mf, checkpoint, config):
    """isMappedFileMatchedRecover: the file starts with a record stored no later than what
    the checkpoint says every ConsumeQueue (and index, when messageIndexSafe) had."""
    if mf.data_end() == 0:
        return False                # never written (and not to be read: see scan_commitlog)
    mm = mf.mm
    if F.I32.unpack_from(mm, F.POS_MAGIC)[0] not in (F.MESSAGE_MAGIC_CODE,
                                                      F.MESSAGE_MAGIC_CODE_V2):
        return False
    store_ts = F.store_timestamp_at(mm)
    if store_ts == 0:
        return False
    if config.message_index_enable and config.message_index_safe:
        return store_ts <= checkpoint.min_timestamp_index
    return store_ts <= checkpoint.min_timestamp


def recover_abnormally(parts, max_phy_of_cq, report, indexer):
    """recoverAbnormally: from the newest file the checkpoint vouches for, re-dispatching every
    valid record (ConsumeQueues skip units they already have)."""
    commitlog = parts.commitlog
    files = commitlog.mfq.files
    if not files:
        return _recover_empty(parts)
    start = 0
    for i in range(len(files) - 1, -1, -1):
        if _matched_for_abnormal(files[i], parts.checkpoint, parts.config):
            start = i
            break
    report.start_file = files[start].file_name
    index_from = _redispatch_index(parts, indexer, start, report)
    dispatchers = parts.dispatchers

    def dispatch(arr, buf):
        dispatch_all(dispatchers, arr, buf)
        if index_from >= 0:
            report.index_redispatched += int(np.count_nonzero(arr["phy_offset"] >= index_from))

    process = scan_commitlog(commitlog, parts.kernels, start, parts.config.check_crc_on_recover,
                             dispatch=dispatch if parts.writable else None, report=report,
                             torn_check=torn_tail_possible(parts.config, False))
    truncate(commitlog, parts.consume_queues(), process, max_phy_of_cq, report)
    if index_from >= 0:
        drop_index_past(parts, indexer, process, report)
    return process


def _index_end(commitlog, indexer):
    """Where the index ends: the newest surviving file's endPhyOffset (load() keeps a flushed
    prefix of files), or the CommitLog's start when no file survived."""
    survivors = indexer.index_file_list
    begin = max(0, commitlog.min_offset)
    return max(begin, survivors[-1].end_phy_offset) if survivors else begin


def _index_only_pass(parts, indexer, begin, stop_index, report):
    """Hand the records from `begin` (a record's start) to the index alone, up to file
    `stop_index` (None: the end of data). The ConsumeQueues and the process offset are not
    touched, so a bad record here stops only this pass. Returns where it stopped."""
    commitlog = parts.commitlog
    files = commitlog.mfq.files
    holder = commitlog.mfq.find_by_offset(begin)
    first = files.index(holder) if holder is not None else 0
    pos = begin - files[first].file_from_offset if holder is not None else 0

    def to_index(arr, buf):
        indexer.dispatch_array(arr, buf)
        report.index_redispatched += len(arr)

    log.info("rebuilding the index from offset %d (file %s)", begin, files[first].file_name)
    return scan_commitlog(commitlog, parts.kernels, first,
                          parts.config.check_crc_on_recover, dispatch=to_index,
                          start_pos=pos, stop_index=stop_index)


def _redispatch_index(parts, indexer, start, report):
    """Rebuild the index up to CommitLog file `start`, where the re-dispatch of every record
    begins: 4.9.8 starts the index there too, and loses the keys of older records whose index
    file load() destroyed. The index dispatcher skips what it already has. Returns where the
    index is rebuilt from, -1 when it is not (read-only store, index disabled)."""
    if not parts.writable or indexer not in parts.dispatchers:
        return -1
    report.index_files_dropped = list(indexer.dropped)
    begin = report.index_rebuilt_from = _index_end(parts.commitlog, indexer)
    stop = parts.commitlog.mfq.files[start]
    if begin < stop.file_from_offset and \
            _index_only_pass(parts, indexer, begin, start, report) < stop.file_from_offset:
        log.warning("the index rebuild stopped at a bad record: records up to file %s stay "
                    "unindexed", stop.file_name)
    return begin


def drop_index_past(parts, indexer, process, report):
    """A power cut can keep a flushed index file whose records never reached the disk, so
    recovery truncated them. Its entries would stand for whatever is stored there next, and
    the dispatcher would skip those new records as indexed already: destroy such files and
    rebuild the index from the survivors' end up to `process`."""
    dropped = indexer.drop_past(process)
    if not dropped:
        return
    report.index_files_dropped += dropped
    survivors = indexer.index_file_list
    # The checkpoint vouched for the dropped files: it must not vouch for their rebuilds.
    checkpoint = parts.checkpoint
    checkpoint.index_msg_timestamp = min(checkpoint.index_msg_timestamp,
                                         survivors[-1].end_timestamp if survivors else 0)
    checkpoint.flush()
    begin = _index_end(parts.commitlog, indexer)
    report.index_rebuilt_from = min(report.index_rebuilt_from, begin)
    if begin < process:
        _index_only_pass(parts, indexer, begin, None, report)


def recover_topic_queue_table(commitlog, queues):
    """recoverTopicQueueTable: next queue offsets from the ConsumeQueues (`queues`, the loaded
    ones); min offsets corrected to the CommitLog's first offset."""
    min_phy = commitlog.min_offset
    table = {}
    for cq in queues:
        table[(cq.topic, cq.queue_id)] = cq.max_offset_in_queue
        if min_phy >= 0:
            cq.correct_min_offset(min_phy)
    commitlog.reset_queue_offsets(table)


def recover(parts, last_exit_ok, indexer):
    """Recover a loaded store from its RecoveryParts (doc/03 §5-§6); `indexer` is its
    IndexService."""
    t0 = monotonic_ns()
    report = RecoveryReport(normal=last_exit_ok)
    max_phy = recover_consume_queues(parts.consume_queues())
    if last_exit_ok:
        process = recover_normally(parts, max_phy, report)
    else:
        process = recover_abnormally(parts, max_phy, report, indexer)
    report.process_offset = process
    recover_topic_queue_table(parts.commitlog, parts.consume_queues())
    report.seconds = (monotonic_ns() - t0) / 1e9
    log.info("recovery: %s", report)
    return report
