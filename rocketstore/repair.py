# SPDX-License-Identifier: Apache-2.0
"""Offline repair of a store directory: `rocketstore recover`, `rebuild-cq`, `rebuild-index`.

Each takes the store's lock (a running broker or store makes it refuse), so it never races a
writer. `plan_recovery` answers what abnormal recovery would do without changing a byte."""
import dataclasses
import logging
import os

from . import format as F
from .checkpoint import reset_dispatch_timestamps
from .dispatch import R_PHY, R_QID, R_QOFF, R_SIZE, R_SYSFLAG, row_topic
from .errors import StoreLoadError, UnsafePathError
from .fs import DEFAULT as DEFAULT_FS
from .index_service import IndexService
from .lockfile import StoreLock, abort_path
from .mapped_file_queue import is_index_name, is_queue_dir_name, split_segment_names
from .recovery import scan_commitlog
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
    redispatch_records: int        # records recovery hands to the dispatchers again
    units_before: int = 0          # ConsumeQueue units now ...
    units_after: int = 0           # ... and once recovered
    index_entries_before: int = 0  # index entries now ...
    index_entries_after: int = 0   # ... and once recovered
    index_files_rebuilt: list = dataclasses.field(default_factory=list)

    def to_dict(self):
        return camel_keys(dataclasses.asdict(self))


def camel_keys(d):
    """A dataclass dict with RocketMQ-style camelCase keys, as every command's JSON has."""
    def camel(name):
        head, *rest = name.split("_")
        return head + "".join(w.title() for w in rest)
    return {camel(k): v for k, v in d.items()}


def store_counts(queues, index_files):
    """(ConsumeQueue units, index entries) of a loaded store's ConsumeQueues and index files:
    what `recover` reports before and after, and what its plan predicts."""
    units = sum(cq.max_offset_in_queue - cq.min_offset_in_queue for cq in queues)
    entries = sum(f.index_count - 1 for f in index_files)
    return units, entries


_INDEX_GEOMETRY = ("max_hash_slot_num", "max_index_num")


def _index_geometry(max_hash_slot_num, max_index_num):
    """Config overrides for index numbers given by the caller (both or neither)."""
    if max_hash_slot_num is None and max_index_num is None:
        return {}
    if max_hash_slot_num is None or max_index_num is None:
        raise ValueError("give max_hash_slot_num and max_index_num together")
    return dict(zip(_INDEX_GEOMETRY, (max_hash_slot_num, max_index_num)))


def writable_config(root, **overrides):
    """The config a store directory was written with, as far as its files tell. Index files
    whose hash slot and entry numbers cannot be told (no entry in them, and sizes that fit
    neither the defaults nor their ratio) stop it, before any tool changes a byte: a writable
    open refuses them, and a rebuild would replace them with files of the default size."""
    ro = MessageStore.open_read_only(root)
    try:
        cfg = ro.config
        unreadable = ro.index_service.unreadable
        # Some readable files tell the numbers; the writable open then names the others.
        known = bool(ro.index_service.index_file_list)
    finally:
        ro.shutdown()
    if unreadable and not known and not all(f in overrides for f in _INDEX_GEOMETRY):
        raise StoreLoadError(
            f"{os.path.dirname(unreadable[0])}: cannot tell the hash slot and entry numbers "
            f"of the index files ({DEFAULT_FS.size(unreadable[0])} bytes); nothing was "
            "changed. Give the numbers they were written with (max_hash_slot_num and "
            "max_index_num; --max-hash-slot-num and --max-index-num)")
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


class _IndexCounter(IndexService):
    """The index dispatcher of a writable store run over the files abnormal recovery keeps,
    counting the entries it would add instead of writing them."""

    class _Sink:
        is_write_full = False

        def __init__(self):
            self.count = 0

        def put_batch(self, hashes, phys, stamps):
            self.count += len(hashes)
            return len(hashes)

    def __init__(self, root, config, kernels, fs, checkpoint, kept):
        super().__init__(root, config, kernels, fs, writable=True)
        self.checkpoint = checkpoint
        self.index_file_list = kept
        self.sink = self._Sink()
        # Counting goes through put_batch, which only the index_keys path calls.
        self._k_dispatch = None

    def _writable_file(self, store_timestamp):
        return self.sink


def _kept_index_files(checkpoint, index_files):
    """The index files a writable abnormal load keeps: those before the first one that ends
    past the checkpoint's indexMsgTimestamp (IndexService.load destroys the rest)."""
    index_ts = checkpoint.index_msg_timestamp
    kept = []
    for f in index_files:
        if f.end_timestamp > index_ts:
            break
        kept.append(f)
    return kept


def plan_recovery(root, kernels=None, max_hash_slot_num=None, max_index_num=None):
    """What `recover` would do, computed read-only by the code it runs: the same abnormal
    recovery scan (from the file the checkpoint vouches for, with the same CRC check), whose
    records go to the index dispatcher in counting mode and are matched against the
    ConsumeQueues by their put rule (a unit is added when its record ends past the queue's
    last one). The index numbers, when given, are those the index files were written with."""
    cfg = writable_config(root, **_index_geometry(max_hash_slot_num, max_index_num))
    loaded = MessageStore(root, cfg, kernels=kernels, read_only=True)
    loaded.load()
    try:
        _, entries_before = store_counts(loaded.all_consume_queues(),
                                         loaded.index_service.index_file_list)
    finally:
        loaded.shutdown()
    # The queues as recovery finds them: their own recovery done, not yet cut at the
    # CommitLog's end (a read-only load cuts them already).
    ends = MessageStore(root, cfg, kernels=kernels, read_only=True).queue_ends_before_recovery()
    cq_end = {q: (hi, phy) for q, (_, hi, phy) in ends.items()}
    units_before = sum(hi - lo for lo, hi, _ in ends.values())

    store = MessageStore(root, cfg, kernels=kernels, read_only=True)
    store.load(force_recovery=True)
    try:
        report = store.recovery_report
        truncated = {}
        for cq in store.all_consume_queues():
            lost = cq_end.get((cq.topic, cq.queue_id), (0, 0))[0] - cq.max_offset_in_queue
            if lost > 0:
                truncated[f"{cq.topic}-{cq.queue_id}"] = lost
        # Recovery also destroys the kept files holding an entry at or past the CommitLog's
        # new end (IndexService.drop_past) and indexes again from the survivors' end.
        kept = []
        for f in _kept_index_files(store.checkpoint, store.index_service.index_file_list):
            if f.end_phy_offset >= report.process_offset:
                break
            kept.append(f)
        index = _IndexCounter(store.root, store.config, store.kernels, store.fs,
                              store.checkpoint, kept)
        queue_ends = {(cq.topic, cq.queue_id): cq.max_offset_in_queue
                      for cq in store.all_consume_queues()}

        def count(arr, buf):
            _note_units(arr, buf, cq_end, queue_ends)

        files = store.commitlog.mfq.files
        if files:
            start = [f.file_name for f in files].index(report.start_file)
            crc = store.config.check_crc_on_recover
            scan_commitlog(store.commitlog, store.kernels, start, crc, dispatch=count)
            # The index, as recovery feeds it: from where it ends up to the start file, then
            # with every record from there on (it skips what it holds).
            begin = max(0, store.commitlog.min_offset)
            if kept:
                begin = max(begin, kept[-1].end_phy_offset)
            holder = store.commitlog.mfq.find_by_offset(begin)
            if holder is not None and files.index(holder) < start:
                scan_commitlog(store.commitlog, store.kernels, files.index(holder), crc,
                               dispatch=index.dispatch_array,
                               start_pos=begin - holder.file_from_offset, stop_index=start)
            scan_commitlog(store.commitlog, store.kernels, start, crc,
                           dispatch=index.dispatch_array)
        units_after = sum(queue_ends.values()) - sum(
            cq.min_offset_in_queue for cq in store.all_consume_queues())
        entries_after = sum(f.index_count - 1 for f in kept) + index.sink.count
        rebuilt = [f.file_name for f in store.index_service.index_file_list if f not in kept]
        return RecoveryPlan(report.start_file, report.process_offset, report.truncated_bytes,
                            report.stop_reason, truncated, report.records, units_before,
                            units_after, entries_before, entries_after, rebuilt)
    finally:
        store.shutdown()


def _note_units(arr, buf, cq_end, queue_ends):
    """ConsumeQueue#putMessagePositionInfo's skip rule over a scanned batch: a record gets a
    unit when it ends past its queue's last unit (as it was before recovery truncated the
    queue); `queue_ends` (queue -> next queue offset) grows accordingly."""
    for row in arr.tolist():
        if row[R_SYSFLAG] & F.TRANSACTION_TYPE_MASK in _SKIP_CQ:
            continue
        key = (row_topic(row, buf), row[R_QID])
        _, end_phy = cq_end.get(key, (0, -1))
        if row[R_PHY] + row[R_SIZE] > end_phy:
            queue_ends[key] = max(queue_ends.get(key, 0), row[R_QOFF] + 1)


def recover(root, kernels=None, max_hash_slot_num=None, max_index_num=None):
    """Run abnormal recovery now (truncate the dirty tail, re-dispatch what the queues miss),
    then shut down cleanly. Returns the RecoveryReport. The index numbers, when given, are
    those the index files were written with (needed when their files cannot tell them)."""
    cfg = writable_config(root, **_index_geometry(max_hash_slot_num, max_index_num))
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


def pending_geometry(dirs):
    """{config field: value} the files of each directory in `dirs` (pending_rebuild's answer)
    were sized by. What was wiped may be all gone: its geometry survives in the marker only,
    and rebuilding with another would change the store's file sizes. A value that is no
    number is left out."""
    out = {}
    for sub, fields in _GEOMETRY.items():
        values = (dirs.get(sub) or "").split()
        if len(values) == len(fields) and all(v.isdigit() for v in values):
            out.update(zip(fields, map(int, values)))
    return out


def _reset_checkpoint(fs, root, reset_index):
    """A zero checkpoint sends abnormal recovery back to the first file, so every record is
    dispatched again into what was wiped."""
    reset_dispatch_timestamps(fs, os.path.join(root, "checkpoint"), reset_index)


# Store roots whose rebuild this process has just marked: the open that follows finds the
# marker as an interrupted rebuild would leave it, but nothing was interrupted.
_MARKED_HERE: set = set()


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
    if os.path.abspath(root) in _MARKED_HERE:
        _MARKED_HERE.discard(os.path.abspath(root))
        log.info("%s: rebuilding %s", root, ", ".join(dirs))
    else:
        log.warning("%s: an interrupted rebuild of %s is being redone", root, ", ".join(dirs))
    cq_size = pending_geometry(dirs).get("mapped_file_size_consume_queue")
    if cq_size:
        cq_size = -(-cq_size // F.CQ_STORE_UNIT_SIZE) * F.CQ_STORE_UNIT_SIZE
    for sub in dirs:
        _wipe_store_files(fs, os.path.join(root, sub), sub == "index", cq_size)
    _reset_checkpoint(fs, root, "index" in dirs)
    return dirs


def _wipe_store_files(fs, base, index, cq_size):
    """Remove what a load takes for index or ConsumeQueue files (of `cq_size` bytes, when
    known), and the queue and topic directories that leaves empty. Any other name is not
    ours: it stays, as a load leaves it (and verify reports it)."""
    if index:
        for name in split_segment_names(fs, base, None, is_index_name)[0]:
            fs.remove(os.path.join(base, name))
        return
    for topic in fs.list_dir(base):
        tdir = os.path.join(base, topic)
        if not fs.is_dir(tdir):
            continue
        for qid in fs.list_dir(tdir):
            qdir = os.path.join(tdir, qid)
            if not is_queue_dir_name(qid) or not fs.is_dir(qdir):
                continue
            for name in split_segment_names(fs, qdir, cq_size)[0]:
                fs.remove(os.path.join(qdir, name))
            fs.remove_dir_if_empty(qdir)
        fs.remove_dir_if_empty(tdir)


def end_pending_rebuild(fs, root, queues, index_service, checkpoint):
    """After recovery re-dispatched every record: flush what was rebuilt (the ConsumeQueues
    `queues`, the index, the checkpoint), then drop the marker in `root`. The abort file
    stays until a clean shutdown, as for any open."""
    for cq in queues:
        cq.flush(0)
    index_service.flush()
    checkpoint.flush()
    fs.remove(_marker_path(root))
    fs.fsync_dir(root)


def _rebuild(root, kernels, wipe_dir, **overrides):
    fs = DEFAULT_FS
    dirs = pending_rebuild(fs, root)        # an interrupted rebuild is finished too
    interrupted = bool(dirs)
    for field, value in pending_geometry(dirs).items():
        overrides.setdefault(field, value)
    cfg = writable_config(root, **overrides)
    store = MessageStore(root, cfg, kernels=kernels)
    lock = StoreLock(root, store.fs)
    lock.acquire()                       # refuse while anyone else has the store open
    try:
        links = store.unsafe_links()     # before wiping: nothing is written through a link
        if links:
            path, why = links[0]
            raise UnsafePathError(f"{path} is {why}: the store never writes through a link; "
                                  "remove it")
        dirs[wipe_dir] = None
        for sub in dirs:
            dirs[sub] = " ".join(str(getattr(cfg, f)) for f in _GEOMETRY[sub])
        mark_rebuild(store.fs, root, dirs)
        if not interrupted:
            _MARKED_HERE.add(os.path.abspath(root))
    finally:
        lock.release()
    # load() finds the marker: it wipes, re-dispatches from the first file, drops the marker.
    report = store.load(force_recovery=True)
    store.start()
    store.shutdown()
    return report


def rebuild_consume_queues(root, kernels=None, cq_file_size=None, max_hash_slot_num=None,
                           max_index_num=None):
    """Delete every ConsumeQueue and rebuild them all from the CommitLog. The file size is
    the existing queues' (or `cq_file_size`, or RocketMQ's default when none are left); the
    index numbers, when given, are those the index files were written with."""
    extra = _index_geometry(max_hash_slot_num, max_index_num)
    if cq_file_size:
        extra["mapped_file_size_consume_queue"] = cq_file_size
    return _rebuild(root, kernels, "consumequeue", **extra)


def rebuild_index(root, kernels=None, max_hash_slot_num=None, max_index_num=None):
    """Delete every IndexFile and rebuild the index from the CommitLog, with the existing
    files' hash slot and entry numbers (or the ones given, which must come together)."""
    return _rebuild(root, kernels, "index", **_index_geometry(max_hash_slot_num, max_index_num))
