# SPDX-License-Identifier: Apache-2.0
"""The cleaning services below the facade (doc/04 §1-§3), each built from the collaborators it
uses: a real CommitLog and ConsumeQueues, an injected clock and disk-usage source, small
doubles for the rest, and no MessageStore."""
import time

import pytest

from rocketstore import testing
from rocketstore.clock import ManualClock
from rocketstore.commitlog import CommitLog
from rocketstore.consume_queue import ConsumeQueue
from rocketstore.config_manager import ConsumerOffsetManager
from rocketstore.fs import FileSystem
from rocketstore.message import Message
from rocketstore.running_flags import RunningFlags
from rocketstore.services.clean import (HOUR_MS, CleanCommitLogService,
                                        CleanConsumeQueueService, Consumption, StoreSize)

NOW = 1_700_000_000_000
FILE = 4096
BODY = b"b" * 200
OTHER_HOUR = str((time.localtime(NOW / 1000).tm_hour + 12) % 24)   # never the delete hour


def config(**overrides):
    base = dict(mapped_file_size_commit_log=FILE, mapped_file_size_consume_queue=20 * 10,
                file_reserved_time=1, delete_when=OTHER_HOUR, delete_commit_log_files_interval=0,
                delete_consume_queue_files_interval=0)
    base.update(overrides)
    return testing.small_config(**base)


class Parts:
    """A CommitLog and the collaborators a MessageStore would wire to its cleaning."""

    def __init__(self, root, backend, **overrides):
        self.root = str(root)
        self.config = config(**overrides)
        self.fs = FileSystem()
        self.clock = ManualClock(NOW)
        self.disk = testing.FixedDiskUsage(0.2)
        self.flags = RunningFlags()
        self.log = CommitLog(self.root, self.config, backend, self.fs)
        self.log.load()
        self.dispatched = None          # None: no reput yet
        self.queues = {}
        self.offsets = ConsumerOffsetManager(self.root, self.fs)
        self.backend = backend

    def fill(self, files):
        """Put 200-byte messages until `files` CommitLog files exist, and flush them."""
        results = []
        while len(self.log.mfq.files) < files:
            results.append(self.log.put_message(Message("T", BODY, queue_id=0), self.clock))
        while self.log.mfq.flushed_where < self.log.mfq.get_max_offset():
            self.log.mfq.flush(0)          # a file at a time
        return results

    def queue(self, results):
        """Queue T-0 with a unit for each put (what reput would have written)."""
        cq = ConsumeQueue(self.root, "T", 0, self.config.cq_file_size, self.backend, self.fs)
        self.queues.setdefault("T", {})[0] = cq
        for r in results:
            cq.put_unit(r.commit_log_offset, r.wrote_bytes, 0, r.queue_offset)
        return cq

    def all_queues(self):
        return [cq for qs in self.queues.values() for cq in qs.values()]

    def commitlog_service(self):
        """The service, told to delete as if the delete hour had come (manual deletion)."""
        svc = CleanCommitLogService(
            self.config, self.root, self.fs, self.clock, self.log.mfq, self.disk, self.flags,
            dispatched_offset=lambda: self.dispatched,
            measure_size=lambda: StoreSize(self.fs, self.log.mfq, self.all_queues(), []),
            consumption=Consumption(self.offsets, self.queues), sleep=lambda s: None)
        svc.execute_delete_files_manually()
        return svc

    def close(self):
        for cq in self.all_queues():
            cq.close()
        self.log.stop_puts()
        self.log.close()


@pytest.fixture
def parts(tmp_path, backend):
    made = []

    def make(**overrides):
        p = Parts(tmp_path / f"s{len(made)}", backend, **overrides)
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()


def test_the_disk_check_marks_the_flag_full_with_its_reason_and_clears_it_below(parts):
    p = parts()
    svc = p.commitlog_service()
    p.disk.ratio = 0.95
    assert svc.is_space_full()
    assert p.flags.is_disk_full and not p.flags.is_writeable()
    assert "disk_space_warning_level_ratio" in p.flags.disk_full_reason
    p.disk.ratio = 0.2
    assert not svc.is_space_full()
    assert not p.flags.is_disk_full


def test_a_put_that_sees_the_disk_full_flag_reads_the_checks_reason_not_a_default(parts):
    # Puts read the bit and the reason without the lock: the reason must be in place before
    # the bit is (a CI run once refused a put with the bare default "disk full").
    seen = []

    class Recording(RunningFlags):
        __slots__ = ()

        def _set(self, bit):
            seen.append(self.disk_full_reason)
            return super()._set(bit)
    p = parts()
    p.flags = Recording()
    svc = p.commitlog_service()
    p.disk.ratio = 0.95
    assert svc.is_space_full()
    assert seen and all("disk_space_warning_level_ratio" in r for r in seen), seen


def test_expired_files_go_oldest_first_and_never_the_last_one(parts):
    p = parts()
    p.fill(4)
    names = [mf.file_name for mf in p.log.mfq.files]
    svc = p.commitlog_service()
    p.clock.now = NOW + HOUR_MS - 1
    assert svc.run_once() == []                    # not expired yet
    deleted = svc.run_once(NOW + HOUR_MS)
    assert [mf.file_name for mf in deleted] == names[:-1]
    assert [mf.file_name for mf in p.log.mfq.files] == names[-1:]
    assert p.log.mfq.get_min_offset() == 3 * FILE


def test_no_file_past_what_reput_dispatched_is_deleted(parts):
    p = parts()
    p.fill(4)
    p.dispatched = FILE + 1                        # reput is inside the second file
    svc = p.commitlog_service()
    deleted = svc.run_once(NOW + HOUR_MS)
    assert [mf.file_from_offset for mf in deleted] == [0]
    assert p.log.mfq.get_min_offset() == FILE


def test_the_plan_counts_what_each_group_would_lose_and_deletes_nothing(parts):
    p = parts()
    results = p.fill(3)
    p.queue(results)
    p.offsets.commit_offset("g", "T", 0, 2)
    svc = p.commitlog_service()
    plan = svc.plan(NOW + HOUR_MS)
    assert [start for _, start, _ in plan.files] == [0, FILE]
    # Messages 2.. whose records lie in the two files.
    assert plan.lost == {"g": sum(r.commit_log_offset < 2 * FILE for r in results) - 2}
    assert len(p.log.mfq.files) == 3               # nothing deleted


def test_clean_protect_unconsumed_keeps_what_a_group_has_not_consumed(parts):
    p = parts(clean_protect_unconsumed=True)
    results = p.fill(4)
    p.queue(results)
    # The group has consumed up to the first message of the third file.
    first_in_third = next(i for i, r in enumerate(results) if r.commit_log_offset >= 2 * FILE)
    p.offsets.commit_offset("g", "T", 0, first_in_third)
    assert Consumption(p.offsets, p.queues).min_unconsumed_phy() == 2 * FILE
    deleted = p.commitlog_service().run_once(NOW + HOUR_MS)
    assert [mf.file_from_offset for mf in deleted] == [0, FILE]


class Counted:
    """A trailing collaborator (index service, deleted topics) that records its trims."""

    def __init__(self):
        self.calls = []
        self.table = {"gone": 1}

    def delete_expired_file(self, min_offset):
        self.calls.append(min_offset)

    def prune(self, min_offset):
        self.calls.append(min_offset)


def test_queue_cleaning_follows_the_commitlog_minimum_once_per_move(parts):
    p = parts()
    results = p.fill(4)
    cq = p.queue(results)
    cq_files = len(cq.mfq.files)
    assert cq_files > 2
    index, deleted = Counted(), Counted()
    svc = CleanConsumeQueueService(p.log, p.all_queues, p.clock, p.config,
                                   index_service=index, deleted_topics=deleted)
    assert svc.run_once() == 0                     # the minimum has not moved
    p.commitlog_service().run_once(NOW + HOUR_MS)
    n = svc.run_once()
    assert n > 0 and len(cq.mfq.files) == cq_files - n
    # The queue's minimum is its first unit whose record is still in the CommitLog.
    first = cq.min_offset_in_queue
    assert results[first - 1].commit_log_offset < 3 * FILE <= results[first].commit_log_offset
    assert index.calls == deleted.calls == [3 * FILE]
    assert svc.run_once() == 0                     # the same minimum: nothing again
    assert index.calls == [3 * FILE]
