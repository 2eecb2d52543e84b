# SPDX-License-Identifier: Apache-2.0
"""Offline repair of a store directory: `rocketstore recover`, `rebuild-cq`, `rebuild-index`.

Each takes the store's lock (a running broker or store makes it refuse), so it never races a
writer. `plan_recovery` answers what abnormal recovery would do without changing a byte."""
import dataclasses
import logging
import os

import numpy as np

from . import format as F
from .dispatch import R_PHY, R_QID, R_SIZE, R_SYSFLAG, row_topic
from .fs import DEFAULT as DEFAULT_FS
from .lockfile import abort_path
from .store import MessageStore

log = logging.getLogger(__name__)

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


# ---- rebuilds, and the marker that makes an interrupted one finish ----------------------------
# `rebuild` in the store root names, one per line, a directory being rebuilt and the config
# values its files are sized by (the wipe removes the files they were read from). It is written
# durably before anything is wiped and removed only once the rebuilt files are flushed, so a
# rebuild killed at any point is redone by the next open (MessageStore.load) or run.
REBUILD_MARKER = "rebuild"
# What each rebuilt directory's files are sized by, kept in the marker.
_GEOMETRY = {"consumequeue": ("mapped_file_size_consume_queue",),
             "index": ("max_hash_slot_num", "max_index_num")}
_REBUILDABLE = tuple(_GEOMETRY)


def _marker_path(root):
    return os.path.join(root, REBUILD_MARKER)


def pending_rebuild(fs, root):
    """{directory: its argument or None} of an unfinished rebuild; empty when none."""
    path = _marker_path(root)
    if not fs.exists(path):
        return {}
    out = {}
    for line in fs.read_bytes(path).decode("ascii", "replace").splitlines():
        name, _, arg = line.partition(" ")
        if name in _REBUILDABLE:
            out[name] = arg or None
    return out


def _reset_checkpoint(fs, root, reset_index):
    """A zero checkpoint sends abnormal recovery back to the first file, so every record is
    dispatched again into what was wiped."""
    ckpt = os.path.join(root, "checkpoint")
    if fs.exists(ckpt):
        raw = bytearray(fs.read_bytes(ckpt))
        raw[0:16] = bytes(16)                     # physicMsgTimestamp, logicsMsgTimestamp
        if reset_index:
            raw[16:24] = bytes(8)                 # indexMsgTimestamp
        fs.write_bytes(ckpt, bytes(raw))


def mark_rebuild(fs, root, dirs):
    """Record durably that `dirs` ({directory: argument}) are to be rebuilt, with the abort file
    and a reset checkpoint, so even a broker opening the store next re-dispatches everything.
    Call with the lock held."""
    text = "".join(f"{d} {a}\n" if a is not None else f"{d}\n" for d, a in dirs.items())
    fs.write_bytes(_marker_path(root), text.encode())
    fs.write_bytes(abort_path(root), b"")
    _reset_checkpoint(fs, root, "index" in dirs)
    fs.fsync_dir(root)


def begin_pending_rebuild(fs, root):
    """At load, before anything is mapped: if a rebuild is pending, wipe what it rebuilds (again,
    since a killed run may have left part of it) and reset the checkpoint. Returns the
    directories being rebuilt, or None."""
    dirs = pending_rebuild(fs, root)
    if not dirs:
        return None
    log.warning("%s: an interrupted rebuild of %s is being redone", root, ", ".join(dirs))
    for sub in dirs:
        base = os.path.join(root, sub)
        for d, _, names in os.walk(base, topdown=False):
            for name in names:
                fs.remove(os.path.join(d, name))
            if d != base:
                fs.remove_dir_if_empty(d)
    _reset_checkpoint(fs, root, "index" in dirs)
    return dirs


def end_pending_rebuild(store):
    """After recovery re-dispatched every record: flush what was rebuilt, then drop the
    marker. The abort file stays until a clean shutdown, as for any open."""
    for cq in store.all_consume_queues():
        cq.flush(0)
    store.index_service.flush()
    store.checkpoint.flush()
    store.fs.remove(_marker_path(store.root))
    store.fs.fsync_dir(store.root)


def _rebuild(root, kernels, wipe_dir, **overrides):
    fs = DEFAULT_FS
    dirs = pending_rebuild(fs, root)        # an interrupted rebuild is finished too
    # What was wiped may be all gone: its geometry survives in the marker only.
    for sub, fields in _GEOMETRY.items():
        if dirs.get(sub) and not any(f in overrides for f in fields):
            overrides.update(zip(fields, map(int, dirs[sub].split())))
    cfg = _writable_config(root, **overrides)
    store = MessageStore(root, cfg, kernels=kernels)
    lock = store._lock
    lock.acquire()                       # refuse while anyone else has the store open
    try:
        dirs[wipe_dir] = None
        for sub in dirs:
            dirs[sub] = " ".join(str(getattr(cfg, f)) for f in _GEOMETRY[sub])
        mark_rebuild(store.fs, root, dirs)
    finally:
        lock.release()
    # load() finds the marker: it wipes, re-dispatches from the first file, drops the marker.
    report = store.load(force_recovery=True)
    store.start()
    store.shutdown()
    return report


def rebuild_consume_queues(root, kernels=None, cq_file_size=None):
    """Delete every ConsumeQueue and rebuild them all from the CommitLog. The file size is
    the existing queues' (or `cq_file_size`, or RocketMQ's default when none are left)."""
    extra = {"mapped_file_size_consume_queue": cq_file_size} if cq_file_size else {}
    return _rebuild(root, kernels, "consumequeue", **extra)


def rebuild_index(root, kernels=None):
    """Delete every IndexFile and rebuild the index from the CommitLog."""
    return _rebuild(root, kernels, "index")
