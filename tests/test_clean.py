# SPDX-License-Identifier: Apache-2.0
"""Expired-file cleaning (doc/04 §2-§3), disk-full protection and ENOSPC, driven by an
injected clock and disk-usage source: no thread, no sleeping."""
import os
import time
import threading

import pytest

from rocketstore import (GetMessageStatus as G, Message, MessageStore, PutMessageStatus,
                         StoreClosedError, testing)
from rocketstore.running_flags import DISK_FULL_BIT
from rocketstore.clock import ManualClock

NOW = 1_700_000_000_000
HOUR = 3_600_000


def hour_of(ms):
    """The local hour (delete_when's unit) at epoch milliseconds `ms`."""
    return str(time.localtime(ms / 1000).tm_hour)


OTHER_HOUR = str((int(hour_of(NOW)) + 12) % 24)     # never reached by these tests' clocks
FILE = 4096
PER_CQ_FILE = 10




def config(**overrides):
    base = dict(mapped_file_size_commit_log=FILE,
                mapped_file_size_consume_queue=PER_CQ_FILE * 20, file_reserved_time=1,
                delete_when=OTHER_HOUR, delete_commit_log_files_interval=0,
                delete_consume_queue_files_interval=0, flush_interval_commit_log=10)
    base.update(overrides)
    return testing.small_config(**base)


@pytest.fixture
def clock():
    return ManualClock(NOW)


@pytest.fixture
def disk():
    return testing.FixedDiskUsage()


@pytest.fixture
def make(tmp_path, backend, clock, disk):
    stores = []

    def make(fs=None, **overrides):
        s = testing.open_store(tmp_path / "store", backend, config=config(**overrides),
                               clock=clock, disk_usage=disk, fs=fs)
        stores.append(s)
        return s
    yield make
    for s in stores:
        s.shutdown()


def fill(store, n=60, body=b"b" * 200, queue_id=0):
    results = [store.put_message(Message("TopicA", body, queue_id=queue_id)) for _ in range(n)]
    assert all(r.ok for r in results)
    testing.wait_dispatched(store)
    testing.wait_flushed(store.commitlog)
    return results




def test_files_younger_than_file_reserved_time_stay_even_at_the_delete_hour(make, clock):
    store = make(delete_when=hour_of(NOW + HOUR - 1))
    fill(store)
    before = testing.commitlog_names(store.commitlog)
    clock.now = NOW + HOUR - 1
    assert store.clean_files_periodically() == []
    assert testing.commitlog_names(store.commitlog) == before


def test_expired_files_go_at_the_delete_hour_at_most_a_batch_per_round(make, clock):
    store = make(delete_when=f"{OTHER_HOUR};{hour_of(NOW + HOUR)}", delete_file_batch_max=3)
    fill(store)
    before = testing.commitlog_names(store.commitlog)
    assert len(before) >= 5
    clock.now = NOW + HOUR
    deleted = store.clean_files_periodically()
    assert [f.file_name for f in deleted] == before[:3]
    assert testing.commitlog_names(store.commitlog) == before[3:]
    assert not any(os.path.exists(f.path) for f in deleted)
    while store.clean_files_periodically():
        pass
    # never the file being written
    assert testing.commitlog_names(store.commitlog) == before[-1:]


def test_expired_files_wait_for_the_hour_while_the_disk_has_room(make, clock):
    store = make()
    fill(store)
    before = testing.commitlog_names(store.commitlog)
    clock.now = NOW + 10 * HOUR
    assert store.clean_files_periodically() == []
    assert testing.commitlog_names(store.commitlog) == before


def test_disk_past_max_used_ratio_deletes_expired_files_outside_the_hour(make, clock, disk):
    store = make(disk_max_used_space_ratio=50)
    fill(store)
    before = testing.commitlog_names(store.commitlog)
    disk.ratio = 0.6
    assert store.clean_files_periodically() == []          # full-ish, but nothing expired
    clock.now = NOW + HOUR
    assert len(store.clean_files_periodically()) == len(before) - 1


def test_max_used_ratio_is_clamped_to_ten_percent(make, clock, disk):
    store = make(disk_max_used_space_ratio=5)
    fill(store)
    clock.now = NOW + HOUR
    disk.ratio = 0.08                                   # above 5 %, below the 10 % floor
    assert store.clean_files_periodically() == []
    disk.ratio = 0.11
    assert store.clean_files_periodically()


def test_past_the_clean_forcibly_ratio_young_files_are_deleted_too(make, disk):
    store = make(delete_file_batch_max=100)
    fill(store)
    before = testing.commitlog_names(store.commitlog)
    disk.ratio = 0.86
    deleted = store.clean_files_periodically()
    assert [f.file_name for f in deleted] == before[:-1]
    assert not store.running_flags.is_disk_full


def test_clean_file_forcibly_disabled_keeps_young_files_on_a_full_disk(make, disk):
    store = make(clean_file_forcibly_enable=False)
    fill(store)
    disk.ratio = 0.86
    assert store.clean_files_periodically() == []


def test_manual_delete_acts_as_if_the_hour_had_come_for_twenty_rounds(make, clock):
    store = make(delete_file_batch_max=1)
    fill(store)
    clock.now = NOW + HOUR
    assert store.clean_files_periodically() == []
    store.execute_delete_files_manually()
    assert len(store.clean_files_periodically()) == 1
    assert store.clean_commitlog_service.manual_delete_file_several_times == 19


def test_deletions_are_spaced_by_delete_commit_log_files_interval(make, disk):
    store = make(delete_commit_log_files_interval=100, delete_file_batch_max=4)
    fill(store)
    slept = []
    store.clean_commitlog_service.sleep = slept.append
    disk.ratio = 0.86
    assert len(store.clean_files_periodically()) == 4
    assert slept == [0.1, 0.1, 0.1]


def test_disk_full_refuses_puts_with_a_reason_and_accepts_them_once_it_drops(make, disk):
    store = make()
    fill(store, n=3)
    disk.ratio = 0.91
    assert store.clean_commitlog_service.is_space_full()
    assert store.running_flags.flag_bits & DISK_FULL_BIT
    r = store.put_message(Message("TopicA", b"x"))
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and not r.ok
    assert "disk full" in r.reason and "91%" in r.reason
    rs = store.put_messages([Message("TopicA", b"x")])
    assert rs.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and rs.count == 0
    disk.ratio = 0.5
    assert not store.clean_commitlog_service.is_space_full()
    assert store.put_message(Message("TopicA", b"x")).status is PutMessageStatus.PUT_OK


def test_a_cleaning_round_on_a_full_disk_sets_the_flag_and_clears_it_when_room_returns(make,
                                                                                        disk):
    store = make()
    fill(store)
    disk.ratio = 0.95
    store.clean_files_periodically()
    assert store.running_flags.is_disk_full
    disk.ratio = 0.3
    store.clean_files_periodically()
    assert not store.running_flags.is_disk_full


def test_the_disk_check_thread_marks_the_disk_full_on_its_own(tmp_path, backend, disk):
    disk.ratio = 0.99
    MessageStore.DISK_CHECK_INITIAL_DELAY_MS, old = 0, MessageStore.DISK_CHECK_INITIAL_DELAY_MS
    try:
        store = testing.open_store(tmp_path / "s", backend, config=config(), disk_usage=disk)
    finally:
        MessageStore.DISK_CHECK_INITIAL_DELAY_MS = old
    try:
        testing.wait_until(lambda: store.running_flags.is_disk_full, what="the disk-full flag")
        assert store.put_message(Message("T", b"x")).status is \
            PutMessageStatus.SERVICE_NOT_AVAILABLE
    finally:
        store.shutdown()


def test_a_file_held_by_a_reader_is_kept_then_forced_out_after_the_interval(make, clock, disk):
    store = make(destroy_maped_file_interval_forcibly=120_000,
                 redelete_hanged_file_interval=1000)
    fill(store)
    first = store.commitlog.mfq.files[0]
    assert first.hold()
    disk.ratio = 0.86
    assert store.clean_files_periodically() == []       # the held file stops the round
    assert store.commitlog.mfq.files[0] is first and not first.is_available
    assert not first.hold()                             # no new borrowers
    assert os.path.exists(first.path)
    disk.ratio = 0.2
    clock.now = NOW + 60_000
    store.clean_commitlog_service.redelete_hanged_file(clock.now)
    assert os.path.exists(first.path)                   # still held, not yet forced
    clock.now = NOW + 120_000
    assert store.clean_commitlog_service.redelete_hanged_file(clock.now)
    assert not os.path.exists(first.path)
    assert store.commitlog.mfq.files[0] is not first
    first.release()


def test_a_released_hanged_file_goes_on_the_next_retry(make, clock, disk):
    store = make(redelete_hanged_file_interval=1000)
    fill(store)
    first = store.commitlog.mfq.files[0]
    first.hold()
    disk.ratio = 0.86
    store.clean_files_periodically()
    first.release()
    disk.ratio = 0.2
    clock.now += 1000
    assert store.clean_commitlog_service.redelete_hanged_file(clock.now)
    assert not os.path.exists(first.path)


def test_consume_queue_files_below_the_new_minimum_go_and_get_message_says_too_small(make, disk):
    store = make()
    results = fill(store, n=60)
    cq = store.consume_queue("TopicA", 0)
    cq_files = len(cq.mfq.files)
    assert cq_files >= 5
    disk.ratio = 0.86
    store.clean_files_periodically()
    min_phy = store.get_min_phy_offset()
    assert min_phy == store.commitlog.mfq.files[-1].file_from_offset
    first_kept = next(i for i, r in enumerate(results) if r.commit_log_offset >= min_phy)
    assert store.get_min_offset_in_queue("TopicA", 0) == first_kept
    assert len(cq.mfq.files) < cq_files
    assert cq.mfq.files[0].file_from_offset // 20 <= first_kept
    g = store.get_message("g", "TopicA", 0, 0)
    assert g.status is G.OFFSET_TOO_SMALL and g.next_begin_offset == first_kept
    g = store.get_message("g", "TopicA", 0, first_kept)
    assert g.status is G.FOUND and g.messages[0].commit_log_offset >= min_phy


def test_get_message_between_commitlog_and_consume_queue_cleaning_skips_removed_files(make,
                                                                                       disk):
    store = make()
    results = fill(store, n=60)
    disk.ratio = 0.86
    store.clean_commitlog_service.run_once()            # CommitLog only: CQ still points below
    min_phy = store.get_min_phy_offset()
    g = store.get_message("g", "TopicA", 0, 0)
    assert g.status in (G.MESSAGE_WAS_REMOVING, G.FOUND)
    assert all(m.commit_log_offset >= min_phy for m in g.messages)
    first_kept = next(i for i, r in enumerate(results) if r.commit_log_offset >= min_phy)
    assert g.next_begin_offset <= first_kept + len(g.messages)


def test_the_index_hook_gets_the_new_minimum(make, disk, monkeypatch):
    store = make()
    calls = []
    # Only the hook is replaced: the store flushes and closes its real index service.
    monkeypatch.setattr(store.index_service, "delete_expired_file", calls.append)
    fill(store)
    store.clean_files_periodically()
    assert calls == []                                  # minimum did not move
    disk.ratio = 0.86
    store.clean_files_periodically()
    assert calls == [store.get_min_phy_offset()]


def test_clean_plan_lists_files_and_unconsumed_cost_without_deleting(make, disk):
    store = make(delete_file_batch_max=2)
    results = fill(store)
    store.commit_offset("slow", "TopicA", 0, 0)
    store.commit_offset("done", "TopicA", 0, len(results))
    disk.ratio = 0.86
    before = testing.commitlog_names(store.commitlog)
    plan = store.clean_plan()
    assert testing.commitlog_names(store.commitlog) == before
    assert [f[0] for f in plan.files] == before[:2] and plan.clean_at_once
    new_min = plan.files[-1][2]
    assert plan.lost == {"slow": sum(r.commit_log_offset < new_min for r in results)}
    assert plan.to_dict()["bytes"] == 2 * FILE
    assert not store.running_flags.is_disk_full


def test_protect_unconsumed_keeps_files_a_group_still_needs(make, clock):
    store = make(clean_protect_unconsumed=True, delete_when=hour_of(NOW + HOUR),
                 delete_file_batch_max=100)
    results = fill(store)
    needed = results[30].commit_log_offset
    store.commit_offset("g", "TopicA", 0, 30)
    clock.now = NOW + HOUR
    plan = store.clean_plan()
    assert plan.lost == {} and plan.protected
    deleted = store.clean_files_periodically()
    assert deleted and all(f.end_offset <= needed for f in deleted)
    assert store.get_min_phy_offset() <= needed
    g = store.get_message("g", "TopicA", 0, 30)
    assert g.status is G.FOUND and g.messages[0].commit_log_offset == needed


def test_protect_unconsumed_gives_way_past_the_forced_ratio(make, disk):
    store = make(clean_protect_unconsumed=True, delete_file_batch_max=100)
    fill(store)
    store.commit_offset("g", "TopicA", 0, 0)
    before = testing.commitlog_names(store.commitlog)
    disk.ratio = 0.86
    assert store.clean_plan().lost["g"] > 0 and not store.clean_plan().protected
    assert len(store.clean_files_periodically()) == len(before) - 1


# ---- ENOSPC -------------------------------------------------------------------------------

def _full_commitlog(op):
    """A disk on which `op` ("create" or "map") fails with ENOSPC for every CommitLog file but
    the first while it is `full`."""
    return testing.FullDisk(op, match=lambda path: os.sep + "commitlog" + os.sep in path
                            and os.path.basename(path) != "%020d" % 0)


@pytest.mark.parametrize("where", ["create", "map"])
def test_enospc_while_rolling_refuses_the_put_and_keeps_every_message(tmp_path, backend, where):
    fs = _full_commitlog(where)
    root = tmp_path / "store"
    store = testing.open_store(root, backend, config=config(), fs=fs)
    stored = []
    for i in range(40):
        r = store.put_message(Message("TopicA", b"%03d" % i + b"x" * 200))
        if not r.ok:
            break
        stored.append(r)
    assert r.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED
    assert "No space left" in r.reason
    assert len(testing.commitlog_names(store.commitlog)) == 1
    assert not os.path.exists(root / "commitlog" / ("%020d" % FILE))
    testing.wait_dispatched(store)
    got = testing.read_queue(store, "TopicA")
    assert [m.body[:3] for m in got] == [b"%03d" % i for i in range(len(stored))]
    # The refusal marked the disk full: later puts are refused at once, until the disk
    # check sees space again.
    assert store.running_flags.is_disk_full
    rs = store.put_messages([Message("TopicA", b"y" * 200) for _ in range(3)])
    assert rs.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and rs.count == 0
    assert "No space left" in rs.reason
    fs.full = False
    assert not store.clean_commitlog_service.is_space_full()
    r = store.put_message(Message("TopicA", b"after"))
    assert r.ok and r.queue_offset == len(stored) and r.commit_log_offset == FILE
    store.shutdown()

    again = testing.open_store(root, backend, config=config())
    try:
        testing.wait_dispatched(again)
        got = testing.read_queue(again, "TopicA")
        assert len(got) == len(stored) + 1 and got[-1].body == b"after"
    finally:
        again.shutdown()


def test_enospc_in_the_middle_of_a_batch_stores_the_head_and_leaves_no_offset_gap(tmp_path,
                                                                                  backend):
    fs = _full_commitlog("create")
    store = testing.open_store(tmp_path / "store", backend, config=config(), fs=fs)
    try:
        rs = store.put_messages([Message("TopicA", b"z" * 300) for _ in range(30)])
        assert rs.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED
        assert 0 < rs.count < 30 and list(rs.queue_offsets) == list(range(rs.count))
        fs.full = False
        assert not store.clean_commitlog_service.is_space_full()
        r = store.put_message(Message("TopicA", b"next"))
        assert r.ok and r.queue_offset == rs.count
        testing.wait_dispatched(store)
        assert store.get_max_offset_in_queue("TopicA", 0) == rs.count + 1
    finally:
        store.shutdown()


def _cleaning_round(store, errors):
    """A thread (not started) that runs one cleaning round, keeping what it raises in
    `errors`."""

    def clean():
        try:
            store.clean_files_periodically()
        except Exception as exc:            # noqa: BLE001 - the test reports it
            errors.append(exc)
    return threading.Thread(target=clean)


def test_a_cleaning_round_called_while_the_clean_thread_runs_one_waits_for_it(make, clock,
                                                                               monkeypatch):
    # clean_files_periodically and the clean thread run the same round. Two at once: one
    # destroyed the first index file and, before it took the file out of the list, the other
    # read that file's header (delete_expired_file) and raised ValueError (mmap closed).
    from rocketstore.index_file import IndexFile
    store = make(delete_file_batch_max=1, max_index_num=5, max_hash_slot_num=4)
    results = [store.put_message(Message("TopicA", b"b" * 200, keys=f"k{i}")) for i in range(60)]
    assert all(r.ok for r in results)
    testing.wait_dispatched(store)
    testing.wait_flushed(store.commitlog)
    assert len(store.index_service.index_file_list) > 3
    clock.now = NOW + HOUR
    store.execute_delete_files_manually()
    first = threading.Thread(target=lambda: None)       # replaced below
    in_destroy, go_on = threading.Event(), threading.Event()
    destroy = IndexFile.destroy

    def paused_destroy(self, *args):
        done = destroy(self, *args)
        if threading.current_thread() is first and not in_destroy.is_set():
            in_destroy.set()                # destroyed, still listed: the other round runs
            go_on.wait(10)
        return done
    monkeypatch.setattr(IndexFile, "destroy", paused_destroy)
    errors = []
    first = _cleaning_round(store, errors)
    second = _cleaning_round(store, errors)
    first.start()
    assert in_destroy.wait(10)
    second.start()
    second.join(2)                          # fails at once without the fix; waits with it
    go_on.set()
    first.join()
    second.join()
    assert errors == []
    # Both rounds ran: two CommitLog files went, and the index files below them.
    assert store.commitlog.min_offset == 2 * FILE
    assert all(f.end_phy_offset >= 2 * FILE
               for f in store.index_service.index_file_list[:-1])


def test_a_cut_waits_for_a_cleaning_round_so_its_index_rebuild_reads_no_destroyed_file(
        make, clock, monkeypatch):
    # reset_write_offset drops the index files past the cut and rebuilds the index from the
    # CommitLog, here from its first file. A cleaning round destroying that file meanwhile
    # closed the mapping the rebuild was reading: ValueError (mmap closed) came out of
    # reset_write_offset with the cut half done -- the queues cut, but neither the next
    # queue offsets nor the reput offset moved back, so later puts got no units.
    from rocketstore.index_service import IndexService
    store = make(delete_when=hour_of(NOW + HOUR), delete_file_batch_max=1)
    results = [store.put_message(Message("TopicA", b"b" * 200, keys=f"k{i}")) for i in range(40)]
    assert all(r.ok for r in results)
    testing.wait_dispatched(store)
    testing.wait_flushed(store.commitlog)
    assert len(testing.commitlog_names(store.commitlog)) >= 3
    assert len(store.index_service.index_file_list) == 1
    cut = results[-3]
    assert cut.commit_log_offset >= 2 * FILE
    clock.now = NOW + HOUR
    rebuild = IndexService.dispatch_array
    errors = []
    cleaner = _cleaning_round(store, errors)

    def dispatch_array(self, arr, buf):
        if not cleaner.is_alive() and cleaner.ident is None:
            cleaner.start()                 # a cleaning round, while the rebuild reads
            cleaner.join(1)                 # done at once without the fix; waits with it
        return rebuild(self, arr, buf)
    monkeypatch.setattr(IndexService, "dispatch_array", dispatch_array)
    assert store.reset_write_offset(cut.commit_log_offset)
    monkeypatch.undo()
    cleaner.join()
    assert errors == [] and store.commitlog.min_offset == FILE
    r = store.put_message(Message("TopicA", b"after the cut"))
    assert r.ok and r.queue_offset == cut.queue_offset
    testing.wait_dispatched(store)
    got = store.get_message("g", "TopicA", 0, cut.queue_offset, 1).messages
    assert [m.body for m in got] == [b"after the cut"]


def test_shutdown_waits_for_a_cleaning_round_a_caller_started(make, clock, monkeypatch):
    # shutdown stops the clean thread, but a round clean_files_periodically runs went on
    # beside the final flush and the closing of the files: it raised ValueError on the closed
    # files, and could destroy files the flush was covering.
    from rocketstore.services.clean import CleanCommitLogService
    store = make(delete_when=hour_of(NOW + HOUR), delete_file_batch_max=1)
    fill(store)
    clock.now = NOW + HOUR
    run_once = CleanCommitLogService.run_once
    in_round, go_on = threading.Event(), threading.Event()

    def paused_run_once(self, *args):
        in_round.set()
        go_on.wait(10)
        return run_once(self, *args)
    monkeypatch.setattr(CleanCommitLogService, "run_once", paused_run_once)
    errors = []
    cleaner = _cleaning_round(store, errors)
    cleaner.start()
    assert in_round.wait(10)
    closer = threading.Thread(target=store.shutdown)
    closer.start()
    closer.join(1)
    assert closer.is_alive()                # it waits for the round under way
    go_on.set()
    cleaner.join(10)
    closer.join(10)
    assert not closer.is_alive() and errors == []
    assert not os.path.exists(os.path.join(store.root, "abort"))     # a clean shutdown
    with pytest.raises(StoreClosedError):
        store.clean_files_periodically()
