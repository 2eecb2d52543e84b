# SPDX-License-Identifier: Apache-2.0
"""Offline repair of a store directory: `rocketstore recover`, `rebuild-cq`, `rebuild-index`.

Each takes the store's lock (a running broker or store makes it refuse), so it never races a
writer. `plan_recovery` answers what abnormal recovery would do without changing a byte."""
import dataclasses
import os

import numpy as np

from . import format as F
from .dispatch import R_PHY, R_QID, R_SIZE, R_SYSFLAG, row_topic
from .lockfile import abort_path
from .store import MessageStore

_SKIP_CQ = (F.TRANSACTION_PREPARED_TYPE, F.TRANSACTION_ROLLBACK_TYPE)


@dataclasses.dataclass
class RecoveryPlan:
    start_file: str
    process_offset: int            # where recovery would end the CommitLog
    truncated_bytes: int           # data bytes past it (never-written zeros not counted)
    stop_reason: str
    truncated_units: dict          # "topic-queue" -> units that point past process_offset
    redispatch_records: int        # records the ConsumeQueues do not have yet

    def to_dict(self):
        return dataclasses.asdict(self)


def _writable_config(root, **overrides):
    """The config a store directory was written with, as far as its files tell."""
    ro = MessageStore.open_read_only(root)
    try:
        cfg = ro.config
    finally:
        ro.shutdown()
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def plan_recovery(root, kernels=None):
    """What abnormal recovery would truncate and re-dispatch, computed read-only."""
    cfg = _writable_config(root)
    before = MessageStore(root, cfg, kernels=kernels, read_only=True)
    before_units = {}
    before.commitlog.load()
    before._load_consume_queues()
    for cq in before.all_consume_queues():
        cq.recover()
        before_units[(cq.topic, cq.queue_id)] = cq.max_offset_in_queue
    before._close_files()

    store = MessageStore(root, cfg, kernels=kernels, read_only=True)
    store.load(force_recovery=True)
    try:
        report = store.recovery_report
        truncated = {}
        for cq in store.all_consume_queues():
            lost = before_units.get((cq.topic, cq.queue_id), 0) - cq.max_offset_in_queue
            if lost > 0:
                truncated[f"{cq.topic}-{cq.queue_id}"] = lost
        redispatch = _count_undispatched(store)
        return RecoveryPlan(report.start_file, report.process_offset, report.truncated_bytes,
                            report.stop_reason, truncated, redispatch)
    finally:
        store.shutdown()


def _count_undispatched(store):
    """Records between the reput start and the CommitLog end that their queue lacks."""
    k = store.kernels
    rows = np.empty(4096, dtype=F.SCAN_DTYPE)
    start = max(0, store.commitlog.min_offset)
    for cq in store.all_consume_queues():
        start = max(start, cq.max_physic_offset)
    if not store.all_consume_queues():
        start = max(0, store.commitlog.min_offset)
    count = 0
    offset = start
    end = store.commitlog.max_offset
    while offset < end:
        mf = store.commitlog.mfq.find_by_offset(offset)
        if mf is None:
            break
        n, stop, reason, _ = k.commitlog_scan(mf.mm, offset - mf.file_from_offset,
                                              mf.read_position, False, rows)
        for row in rows[:n].tolist():
            if row[R_SYSFLAG] & F.TRANSACTION_TYPE_MASK in _SKIP_CQ:
                continue
            queues = store.consume_queue_table.get(row_topic(row, mf.mm), {})
            cq = queues.get(row[R_QID])
            if cq is None or row[R_PHY] + row[R_SIZE] > cq.max_physic_offset:
                count += 1
        offset = mf.file_from_offset + stop
        if reason == F.SCAN_BLANK:
            offset = store.commitlog.roll_next_file(offset)
        elif reason != F.SCAN_END or (n == 0 and stop >= mf.read_position):
            break
    return count


def recover(root, kernels=None):
    """Run abnormal recovery now (truncate the dirty tail, re-dispatch what the queues miss),
    then shut down cleanly. Returns the RecoveryReport."""
    cfg = _writable_config(root)
    store = MessageStore(root, cfg, kernels=kernels)
    report = store.load(force_recovery=True)
    store.start()
    store.shutdown()
    return report


def _rebuild(root, kernels, wipe_dirs, reset_index, **overrides):
    cfg = _writable_config(root, **overrides)
    store = MessageStore(root, cfg, kernels=kernels)
    lock = store._lock
    lock.acquire()                       # refuse while anyone else has the store open
    try:
        store._check_links()             # before wiping: nothing is written through a link
        for sub in wipe_dirs:
            base = os.path.join(root, sub)
            for d, _, names in os.walk(base, topdown=False):
                for name in names:
                    store.fs.remove(os.path.join(d, name))
                if d != base:
                    store.fs.remove_dir_if_empty(d)
        # A zero checkpoint sends abnormal recovery back to the first file, so every record
        # is dispatched again into what was wiped.
        ckpt = os.path.join(root, "checkpoint")
        if store.fs.exists(ckpt):
            raw = bytearray(store.fs.read_bytes(ckpt))
            raw[8:16] = bytes(8)                      # logicsMsgTimestamp
            raw[0:8] = bytes(8)                       # physicMsgTimestamp
            if reset_index:
                raw[16:24] = bytes(8)                 # indexMsgTimestamp
            store.fs.write_bytes(ckpt, bytes(raw))
        store.fs.write_bytes(abort_path(root), b"")
    finally:
        lock.release()
    store = MessageStore(root, cfg, kernels=kernels)
    report = store.load(force_recovery=True)
    store.start()
    store.shutdown()
    return report


def rebuild_consume_queues(root, kernels=None, cq_file_size=None):
    """Delete every ConsumeQueue and rebuild them all from the CommitLog. The file size is
    the existing queues' (or `cq_file_size`, or RocketMQ's default when none are left)."""
    extra = {"mapped_file_size_consume_queue": cq_file_size} if cq_file_size else {}
    return _rebuild(root, kernels, ["consumequeue"], reset_index=False, **extra)


def rebuild_index(root, kernels=None):
    """Delete every IndexFile and rebuild the index from the CommitLog."""
    return _rebuild(root, kernels, ["index"], reset_index=True)
