# SPDX-License-Identifier: Apache-2.0
"""Expired-file cleaning and disk-full protection (doc/04 §1-§3).

CleanCommitLogService and CleanConsumeQueueService are plain objects whose `run_once(now_ms)`
does one round, so tests drive them with an injected clock and disk-usage source and no
thread; services/scheduler.py's StoreScheduledService is the one thread that calls them (and
the other periodic jobs) on RocketMQ's schedule.
"""
import bisect
import dataclasses
import logging
import os
import time

import numpy as np

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000
MAX_MANUAL_DELETE_FILE_TIMES = 20
DISK_FULL_REASON = ("disk full: the CommitLog disk is {ratio:.0%} used, past "
                    "disk_space_warning_level_ratio {warning:.0%}; puts are refused until "
                    "cleaning brings it down")


def disk_usage_source(fs):
    """The default disk-usage source: `fs.disk_usage_ratio` of the nearest existing directory
    (a fresh store has no commitlog/ yet), -1 on error as UtilAll does (which reads as full
    for deletion and as not full for the disk-full flag)."""
    def usage(path):
        p = os.path.abspath(path)
        while not fs.exists(p) and os.path.dirname(p) != p:
            p = os.path.dirname(p)
        try:
            return fs.disk_usage_ratio(p)
        except OSError:
            return -1.0
    return usage


def is_it_time_to_do(when, now_ms):
    """UtilAll#isItTimeToDo: is the local hour of `now_ms` one of the ';'-separated hours?"""
    hour = time.localtime(now_ms / 1000.0).tm_hour
    for part in when.split(";"):
        part = part.strip()
        if part and int(part) == hour:
            return True
    return False


@dataclasses.dataclass
class CleanPlan:
    """What the next CommitLog cleaning round would do, computed without deleting.

    `files`: (file name, start offset, end offset) of each file it would delete, oldest first;
    `lost`: group -> committed-but-unconsumed messages those files hold; `protected`: files
    kept only because `clean_protect_unconsumed` is on. `budget` is `store_size_budget` (0:
    none), `store_bytes` the bytes the store's files take on disk now (allocated blocks), and
    `over_budget` whether that passes the budget, which makes the round delete the oldest
    files, expired or not; `freed_bytes` is what the round would free in all (the CommitLog
    files and the queue and index files they alone cover)."""
    time_up: bool
    space_to_delete: bool
    manual: bool
    clean_at_once: bool
    disk_ratio: float
    files: list
    lost: dict
    protected: list
    budget: int = 0
    store_bytes: int = 0
    over_budget: bool = False
    freed_bytes: int = 0

    @property
    def bytes(self):
        return sum(end - start for _, start, end in self.files)

    def to_dict(self):
        d = dataclasses.asdict(self)
        d["files"] = [{"name": n, "start": s, "end": e} for n, s, e in self.files]
        d["protected"] = [{"name": n, "start": s, "end": e} for n, s, e in self.protected]
        d["bytes"] = self.bytes
        return d


def allocated_bytes(fs, path):
    """Bytes `path` takes on disk (allocated blocks), 0 when it is gone (deleted meanwhile)."""
    try:
        return fs.allocated(path)
    except OSError:
        return 0


class StoreSize:
    """The bytes a store's files take on disk, and what deleting a prefix of its CommitLog
    would free.

    Sizes are allocated blocks (st_blocks), not apparent sizes: every segment is created at its
    full size but sparse, so a 1 GiB CommitLog file holding 10 MB takes 10 MB (plus its
    reserved window) of the disk the budget protects. The apparent size would count 1 GiB
    for it (a budget below one file size would then delete everything it could at once), and
    the data size would miss the reserved blocks, which the disk does pay for.

    `covered` lists, per ConsumeQueue and index file that cleaning would delete once the
    CommitLog minimum passes a physical offset (never a queue's last file, as
    CleanConsumeQueueService and IndexService decide), that offset and the file's bytes,
    sorted, so freed(new_min) is one bisect.

    `mfq` is the CommitLog's MappedFileQueue, `consume_queues` every ConsumeQueue and
    `index_files` the IndexService's file list, all measured through `fs`."""

    def __init__(self, fs, mfq, consume_queues, index_files):
        from ..format import CQ_STORE_UNIT_SIZE
        from ..mapped_file_queue import split_segment_names
        self.commitlog = {id(mf): allocated_bytes(fs, mf.path) for mf in mfq.files}
        covered = []
        # Segments on disk the list does not hold yet count too: the next file the allocator
        # created ahead of the writer takes its reserved window.
        listed = {os.path.basename(mf.path) for mf in mfq.files}
        other = sum(allocated_bytes(fs, os.path.join(mfq.store_path, name))
                    for name in split_segment_names(fs, mfq.store_path, None)[0]
                    if name not in listed)
        for cq in consume_queues:
            files = cq.mfq.files
            for f in files:
                size = allocated_bytes(fs, f.path)
                other += size
                if f is not files[-1]:
                    key = f.last_unit_phy(CQ_STORE_UNIT_SIZE)
                    if key is not None:
                        covered.append((key, size))
        for f in index_files:
            size = allocated_bytes(fs, f.path)
            other += size
            if f is not index_files[-1]:
                covered.append((f.end_phy_offset, size))
        covered.sort()
        self._keys = [k for k, _ in covered]
        self._sums = [0]
        for _, size in covered:
            self._sums.append(self._sums[-1] + size)
        self.total = sum(self.commitlog.values()) + other

    def of(self, mf):
        return self.commitlog.get(id(mf), 0)

    def covered_below(self, new_min):
        """Bytes of the queue and index files cleaning deletes once the CommitLog minimum is
        `new_min` (each one whose last physical offset is below it)."""
        return self._sums[bisect.bisect_left(self._keys, new_min)]


class CleanCommitLogService:
    """DefaultMessageStore.CleanCommitLogService: deletes expired CommitLog files at the
    delete_when hour, when the disk passes its ratio, or on manual request; sets and clears
    the disk-full running flag. `sleep` is injectable so tests skip the pauses.

    Its collaborators: the store's `config` and `root` (the CommitLog and ConsumeQueue
    directories it measures), `fs` (file times), `clock`, the CommitLog's MappedFileQueue
    `mfq` (the files it deletes), `disk_usage(path)` (the used fraction of a path's disk),
    `running_flags` (the disk-full flag and its reason), `dispatched_offset()` (where reput
    has dispatched to; None before it runs), `measure_size()` (a StoreSize of the store now)
    and `consumption` (the committed consumer offsets, a Consumption)."""

    def __init__(self, config, root, fs, clock, mfq, disk_usage, running_flags, *,
                 dispatched_offset, measure_size, consumption, sleep=time.sleep):
        self.config = config
        self.fs = fs
        self.clock = clock
        self.mfq = mfq
        self.disk_usage = disk_usage
        self.running_flags = running_flags
        self.dispatched_offset = dispatched_offset
        self.measure_size = measure_size
        self.consumption = consumption
        self.commitlog_dirs = [p for p in config.commitlog_dir(root).split(",") if p]
        self.consume_queue_dir = os.path.join(root, "consumequeue")
        self.sleep = sleep
        self.manual_delete_file_several_times = 0
        self.clean_immediately = False
        self.last_redelete_ms = 0
        self.last_ratio = 0.0

    # ---- disk measurements ---------------------------------------------------------------
    def physic_ratio(self):
        """The least used CommitLog disk (minPhysicRatio); -1 when unreadable."""
        usage = self.disk_usage
        return min(usage(p) for p in self.commitlog_dirs)

    def logics_ratio(self):
        return self.disk_usage(self.consume_queue_dir)

    def _assess(self):
        """isSpaceToDelete (4.9.x) as a pure function: (space_to_delete, clean_immediately,
        flag changes [True = mark full, False = mark OK] to apply in order, physic ratio)."""
        cfg = self.config
        limit = cfg.effective_disk_max_used_space_ratio / 100.0
        warning = cfg.disk_space_warning_level_ratio
        forcibly = cfg.disk_space_clean_forcibly_ratio
        immediately = False
        actions = []
        physic = None
        for measure in (self.physic_ratio, self.logics_ratio):
            ratio = measure()
            if physic is None:
                physic = ratio
            if ratio > warning:
                actions.append(True)
                immediately = True
            elif ratio > forcibly:
                immediately = True
            else:
                actions.append(False)
            if ratio < 0 or ratio > limit:
                return True, immediately, actions, physic
        return False, immediately, actions, physic

    def _apply_flags(self, actions, ratio):
        flags = self.running_flags
        cfg = self.config
        for full in actions:
            if full:
                reason = DISK_FULL_REASON.format(ratio=ratio,
                                                 warning=cfg.disk_space_warning_level_ratio)
                if flags.get_and_make_disk_full(reason):
                    log.error("disk maybe full soon (%.2f used), so mark disk full", ratio)
            elif not flags.get_and_make_disk_ok():
                log.info("disk space OK (%.2f used), so mark disk ok", ratio)

    def is_space_to_delete(self):
        """isSpaceToDelete: measure, set/clear the disk-full flag, remember cleanImmediately."""
        space, immediately, actions, ratio = self._assess()
        self.clean_immediately = immediately
        self.last_ratio = ratio
        self._apply_flags(actions, ratio)
        return space

    def is_space_full(self):
        """isSpaceFull (the 10 s disk check): mark the disk full past the warning ratio, OK
        below it. True when full."""
        ratio = self.physic_ratio()
        self.last_ratio = ratio
        full = ratio > self.config.disk_space_warning_level_ratio
        self._apply_flags([full], ratio)
        return full

    # ---- which files ---------------------------------------------------------------------
    def execute_delete_files_manually(self):
        """The admin "deleteExpiredCommitLog": the next 20 rounds act as if the hour had come."""
        self.manual_delete_file_several_times = MAX_MANUAL_DELETE_FILE_TIMES
        log.info("executeDeleteFilesManually was invoked")

    def last_modified_ms(self, mf):
        """RocketMQ reads the file's mtime. We prefer the store time of the last record
        appended, which comes from the same clock that ages it, so an injected clock ages
        files deterministically; files loaded from disk fall back to their mtime."""
        return mf.store_timestamp or self.fs.mtime_ms(mf.path)

    def deletable_end(self):
        """The CommitLog offset no deletion may pass: what reput has dispatched and what is
        flushed. A file past the first would leave the ConsumeQueues without its units (reput
        skips ahead, and queue offsets then misalign); past the second, the flusher would
        look for a file that is gone and never flush again. The flushed offset never passes
        the committed one (the flusher reads up to the committed position), so it bounds
        that too."""
        end = self.mfq.flushed_where
        dispatched = self.dispatched_offset()
        if dispatched is not None:
            end = min(end, dispatched)
        return end

    def select(self, now_ms, clean_at_once, protect_below=None, size=None):
        """deleteExpiredFileByTime's choice: leading files (never the last one) that expired
        or, with clean_at_once, any; at most delete_file_batch_max; stop at the first one
        kept, so a newer file never goes while an older remains. A file reaching past
        deletable_end() is always kept; with `protect_below`, so is one reaching past that
        physical offset. With `size` (a StoreSize) past store_size_budget, files also go
        unexpired, oldest first, until what they and the queue and index files they alone
        cover free brings the store within its budget. Returns (files, protected, freed
        bytes)."""
        cfg = self.config
        expired_ms = cfg.file_reserved_time * HOUR_MS
        safe_end = self.deletable_end()
        over = size.total - cfg.store_size_budget \
            if size is not None and cfg.store_size_budget > 0 else 0
        chosen, protected = [], []
        freed = 0
        for mf in self.mfq.files[:-1]:
            if len(chosen) >= cfg.delete_file_batch_max:
                break
            if not (clean_at_once or freed < over or
                    now_ms >= self.last_modified_ms(mf) + expired_ms):
                break
            if mf.end_offset > safe_end:
                log.info("keeping %s: not yet dispatched and flushed (up to %d)",
                         mf.file_name, safe_end)
                break
            if protect_below is not None and mf.end_offset > protect_below:
                protected.append(mf)
                break
            chosen.append(mf)
            if size is not None:
                freed = sum(size.of(f) for f in chosen) + size.covered_below(mf.end_offset)
        return chosen, protected, freed

    def measure(self):
        """A StoreSize when a store_size_budget is set, else None (nothing is measured)."""
        if self.config.store_size_budget <= 0:
            return None
        return self.measure_size()

    def _protect_below(self, immediately):
        cfg = self.config
        if not cfg.clean_protect_unconsumed or immediately:
            return None
        return self.consumption.min_unconsumed_phy()

    # ---- one round -----------------------------------------------------------------------
    def delete_expired_files(self, now_ms):
        """deleteExpiredFiles: one round. Returns the destroyed MappedFiles."""
        cfg = self.config
        time_up = is_it_time_to_do(cfg.delete_when, now_ms)
        space = self.is_space_to_delete()
        manual = self.manual_delete_file_several_times > 0
        if manual:
            self.manual_delete_file_several_times -= 1
        size = self.measure()
        over_budget = size is not None and size.total > cfg.store_size_budget
        if not (time_up or space or manual or over_budget):
            return []
        clean_at_once = cfg.clean_file_forcibly_enable and self.clean_immediately
        log.info("begin to delete before %d hours file. timeup: %s spacefull: %s "
                 "manualDeleteFileSeveralTimes: %d cleanAtOnce: %s overBudget: %s",
                 cfg.file_reserved_time, time_up, space, self.manual_delete_file_several_times,
                 clean_at_once, over_budget)
        files, protected, freed = self.select(now_ms, clean_at_once,
                                              self._protect_below(self.clean_immediately),
                                              size)
        if over_budget and size.total - freed > cfg.store_size_budget:
            log.warning("the store takes %d bytes, past its store_size_budget of %d; this "
                        "round frees %d (the current CommitLog file, undispatched or "
                        "unflushed data%s are kept)", size.total, cfg.store_size_budget, freed,
                        " and unconsumed files" if protected else "")
        if protected:
            log.info("keeping %s: a consumer group has not consumed it "
                     "(clean_protect_unconsumed)", protected[0].file_name)
        mfq = self.mfq
        interval = cfg.delete_commit_log_files_interval
        deleted = []
        for i, mf in enumerate(files):
            if not mf.try_destroy(now_ms, cfg.destroy_maped_file_interval_forcibly):
                log.warning("%s is still in use; it will be retried", mf.path)
                break
            # Out of the list at once: readers find the new minimum, not a closed mapping.
            mfq.delete_files([mf])
            deleted.append(mf)
            if interval > 0 and i + 1 < len(files):
                self.sleep(interval / 1000.0)
        if deleted:
            log.info("deleted %d expired CommitLog file(s), min offset now %d", len(deleted),
                     mfq.get_min_offset())
        return deleted

    def redelete_hanged_file(self, now_ms):
        """redeleteHangedFile: every redelete_hanged_file_interval, finish a first file that
        an earlier destroy left marked unavailable."""
        cfg = self.config
        if now_ms - self.last_redelete_ms < cfg.redelete_hanged_file_interval:
            return False
        self.last_redelete_ms = now_ms
        return self.mfq.retry_delete_first_file(
            now_ms, cfg.destroy_maped_file_interval_forcibly)

    def run_once(self, now_ms=None):
        """One CleanCommitLogService.run(): delete expired files, then retry a hanged one."""
        if now_ms is None:
            now_ms = self.clock()
        deleted = self.delete_expired_files(now_ms)
        self.redelete_hanged_file(now_ms)
        return deleted

    def plan(self, now_ms=None):
        """The next round's decision, with no deletion and no flag change."""
        cfg = self.config
        if now_ms is None:
            now_ms = self.clock()
        time_up = is_it_time_to_do(cfg.delete_when, now_ms)
        space, immediately, _, ratio = self._assess()
        manual = self.manual_delete_file_several_times > 0
        clean_at_once = cfg.clean_file_forcibly_enable and immediately
        # Measured whatever the budget, so the plan always says how big the store is.
        size = self.measure_size()
        over_budget = 0 < cfg.store_size_budget < size.total
        files, protected, freed = [], [], 0
        if time_up or space or manual or over_budget:
            files, protected, freed = self.select(
                now_ms, clean_at_once, self._protect_below(immediately),
                size if cfg.store_size_budget > 0 else None)
            if files and not freed:
                freed = sum(size.of(f) for f in files) + \
                    size.covered_below(files[-1].end_offset)
        new_min = files[-1].end_offset if files else None
        lost = self.consumption.unconsumed_below(new_min) if new_min is not None else {}
        return CleanPlan(time_up, space, manual, clean_at_once, ratio,
                         [(f.file_name, f.file_from_offset, f.end_offset) for f in files],
                         lost, [(f.file_name, f.file_from_offset, f.end_offset)
                                for f in protected],
                         cfg.store_size_budget, size.total, over_budget, freed)


class CleanConsumeQueueService:
    """DefaultMessageStore.CleanConsumeQueueService: once the CommitLog minimum moved, delete
    ConsumeQueue files wholly below it, correct each queue's minimum, then the index files.

    Its collaborators: the `commitlog` (its min_offset), `consume_queues()` (every queue
    now), `clock`, `config`, and optionally the `index_service` and the `deleted_topics`
    (topic_delete.py), both trimmed to the new minimum."""

    def __init__(self, commitlog, consume_queues, clock, config, *, index_service=None,
                 deleted_topics=None, sleep=time.sleep):
        self.commitlog = commitlog
        self.consume_queues = consume_queues
        self.clock = clock
        self.config = config
        self.index_service = index_service
        self.deleted_topics = deleted_topics
        self.sleep = sleep
        self.last_physical_min_offset = 0

    def run_once(self, now_ms=None):
        """deleteExpiredFiles: returns the number of ConsumeQueue files deleted."""
        min_offset = self.commitlog.min_offset
        if min_offset <= self.last_physical_min_offset:
            return 0
        self.last_physical_min_offset = min_offset
        if now_ms is None:
            now_ms = self.clock()
        interval = self.config.delete_consume_queue_files_interval
        total = 0
        for cq in self.consume_queues():
            n = cq.delete_expired_file(min_offset, now_ms)
            total += n
            if n and interval > 0:
                self.sleep(interval / 1000.0)
        # The IndexFile service (doc/02 §2.8) trails the ConsumeQueues.
        if self.index_service is not None:
            self.index_service.delete_expired_file(min_offset)
        # A deleted topic whose records have all expired needs no entry any more.
        deleted = self.deleted_topics
        if deleted is not None and deleted.table:
            deleted.prune(min_offset)       # the dispatchers see it (offsets_raw)
        return total


# ---- consumption state (clean_protect_unconsumed, clean_plan) ---------------------------------

class Consumption:
    """What the consumer groups still need: their committed offsets (a ConsumerOffsetManager)
    read against the store's queues (`queue_table`, topic -> {queue id: ConsumeQueue})."""

    def __init__(self, consumer_offsets, queue_table):
        self.consumer_offsets = consumer_offsets
        self.queue_table = queue_table

    def committed_positions(self):
        """(group, ConsumeQueue, committed offset) for each committed offset below its
        queue's max, the offset raised to the queue's minimum."""
        out = []
        for group, topic, queues in self.consumer_offsets.entries():
            table = self.queue_table.get(topic)
            if not table:
                continue
            for qid, offset in queues.items():
                cq = table.get(qid)
                if cq is None:
                    continue
                start = max(offset, cq.min_offset_in_queue)
                if start < cq.max_offset_in_queue:
                    out.append((group, cq, start))
        return out

    def min_unconsumed_phy(self):
        """The lowest CommitLog offset a committed consumer offset still needs, or None."""
        best = None
        for _, cq, start in self.committed_positions():
            units = cq.units(start, 1)
            if len(units):
                phy = int(units[0]["offset"])
                best = phy if best is None else min(best, phy)
            del units                   # a numpy view pins the CQ mapping
        return best

    def unconsumed_below(self, phy_offset, chunk=65_536):
        """group -> messages at or past its committed offset whose records lie below
        `phy_offset` (what deleting the CommitLog below it would cost the group)."""
        lost = {}
        for group, cq, start in self.committed_positions():
            end = cq.max_offset_in_queue
            count = 0
            pos = start
            while pos < end:
                units = cq.units(pos, min(chunk, end - pos))
                if not len(units):
                    break
                offs = units["offset"]
                k = int(np.searchsorted(offs, phy_offset))
                count += k
                full = k == len(units)
                pos += len(units)
                del units, offs
                if not full:
                    break
            if count:
                lost[group] = lost.get(group, 0) + count
        return lost
