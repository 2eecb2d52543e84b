# SPDX-License-Identifier: Apache-2.0
"""The rest of DefaultMessageStore's read interface, snake_case: each method answers as 4.9.8's
does, and none of them creates a queue for a topic the store does not have."""
import os

import pytest

from rocketstore import (BrokerRole, FlushDiskType, InvalidArgumentError, Message,
                         PutMessageStatus, testing)
from rocketstore.services.flush import GroupCommitService


@pytest.fixture
def store(tmp_path, backend):
    s = testing.open_store(tmp_path / "s", backend)
    yield s
    s.shutdown()


def _fill(store):
    return [store.put_message(Message("T", b"m%d" % i, queue_id=1)) for i in range(5)]


def _no_queue_dir(store, topic):
    return not os.path.exists(os.path.join(store.root, "consumequeue", topic))


def test_get_consume_queue_never_creates_one(store):
    _fill(store)
    assert store.get_consume_queue("T", 1) is store.find_consume_queue("T", 1)
    assert store.get_consume_queue("T", 7) is None and store.get_consume_queue("U", 0) is None
    assert _no_queue_dir(store, "U") and "U" not in store.consume_queue_table


def test_queue_positions_and_store_times_come_from_the_units(store):
    rs = _fill(store)
    assert store.get_message_total_in_queue("T", 1) == 5
    assert store.get_message_total_in_queue("U", 0) == 0
    assert store.get_commit_log_offset_in_queue("T", 1, 3) == rs[3].commit_log_offset
    assert store.get_commit_log_offset_in_queue("T", 1, 5) == 0          # not written yet
    assert store.get_message_store_timestamp("T", 1, 2) == rs[2].store_timestamp
    assert store.get_message_store_timestamp("T", 1, 9) == -1
    assert store.get_message_store_timestamp("U", 0, 0) == -1
    assert store.get_earliest_message_time() == rs[0].store_timestamp
    assert store.get_earliest_message_time("T", 1) == rs[0].store_timestamp
    assert store.get_earliest_message_time("U", 0) == -1
    assert _no_queue_dir(store, "U")


def test_earliest_message_time_of_an_empty_store_is_minus_one(store):
    assert store.get_earliest_message_time() == -1


def test_select_one_message_by_offset_returns_the_records_bytes(store):
    rs = _fill(store)
    raw = store.select_one_message_by_offset(rs[1].commit_log_offset)
    assert len(raw) == rs[1].wrote_bytes
    assert store.look_message_by_offset(rs[1].commit_log_offset).body == b"m1"
    assert bytes(store.select_one_message_by_offset(rs[1].commit_log_offset, 8)) == \
        bytes(raw[:8])
    assert store.select_one_message_by_offset(rs[-1].commit_log_offset + 10 ** 6) is None
    with pytest.raises(ValueError):
        store.select_one_message_by_offset(-1)


def test_check_in_disk_compares_the_distance_with_the_memory_budget(store, monkeypatch):
    rs = _fill(store)
    assert store.check_in_disk_by_consume_offset("T", 1, 0) is False
    monkeypatch.setattr(store, "mem_limit", rs[-1].commit_log_offset - 1)
    assert store.check_in_disk_by_consume_offset("T", 1, 0) is True      # far behind the end
    assert store.check_in_disk_by_consume_offset("T", 1, 4) is False
    assert store.check_in_disk_by_consume_offset("T", 1, 9) is False     # no such unit


def test_confirm_offset_is_kept_for_the_caller(store):
    assert store.get_confirm_offset() == -1
    store.set_confirm_offset(1234)
    assert store.get_confirm_offset() == 1234


def test_transient_store_pool_deficient_only_when_its_buffers_are_gone(tmp_path, backend):
    plain = testing.open_store(tmp_path / "p", backend)
    try:
        assert plain.is_transient_store_pool_deficient() is False
    finally:
        plain.shutdown()
    pooled = testing.open_store(tmp_path / "s", backend, testing.small_config(
        transient_store_pool_enable=True, transient_store_pool_size=2))
    try:
        pool = pooled.commitlog.pool
        assert pooled.is_transient_store_pool_deficient() is (pool.available == 0)
        taken = [pool.borrow() for _ in range(pool.available)]
        assert pooled.is_transient_store_pool_deficient() is True
        for buf in taken:
            pool.give_back(buf)
    finally:
        pooled.shutdown()


def test_append_to_commit_log_is_a_slaves_and_wakes_reput(tmp_path, backend):
    master = testing.open_store(tmp_path / "m", backend)
    try:
        rs = [master.put_message(Message("T", b"%d" % i)) for i in range(3)]
        end = rs[-1].commit_log_offset + rs[-1].wrote_bytes
        raw = bytes(master.commitlog.mfq.files[0].mm[:end])
        with pytest.raises(InvalidArgumentError, match="slave"):
            master.append_to_commit_log(end, raw)
    finally:
        master.shutdown()
    slave = testing.open_store(tmp_path / "s", backend,
                               testing.small_config(broker_role=BrokerRole.SLAVE))
    try:
        assert slave.append_to_commit_log(0, raw) is True
        assert slave.append_to_commit_log(0, raw) is False        # not at the end any more
        testing.wait_until(lambda: slave.dispatch_behind_bytes() == 0, what="reput")
        assert slave.get_max_offset_in_queue("T", 0) == 3
    finally:
        slave.shutdown()


@pytest.mark.parametrize("per_time", [1, 3])
def test_offset_by_time_with_a_boundary_finds_the_first_and_last_stored_then(tmp_path, backend,
                                                                            per_time):
    # 5.x BoundaryType over three ConsumeQueue files (100 units each), with runs of equal
    # store times: lower is the first message stored at or after t, upper the last at or
    # before it; below every time both are 0, above it lower is the queue's end.
    from rocketstore.clock import ReplayClock
    n = 250
    times = [10_000 + (i // per_time) * 10 for i in range(n)]
    store = testing.open_store(tmp_path / "s", backend, clock=ReplayClock(times))
    try:
        rs = [store.put_message(Message("T", b"x")) for _ in range(n)]
        assert [r.store_timestamp for r in rs] == times
        for t in sorted({times[0] - 5, times[-1] + 5} | {times[i] + d for i in
                                                           range(0, n, 7) for d in (-3, 0, 4)}):
            lower = next((i for i, v in enumerate(times) if v >= t), n)
            upper = max((i for i, v in enumerate(times) if v <= t), default=0)
            assert store.get_offset_in_queue_by_time("T", 0, t, "lower") == lower, t
            assert store.get_offset_in_queue_by_time("T", 0, t, "upper") == upper, t
        assert store.get_offset_in_queue_by_time("U", 0, times[0], "lower") == 0
        with pytest.raises(InvalidArgumentError, match="boundary"):
            store.get_offset_in_queue_by_time("T", 0, times[0], "LOWER")
    finally:
        store.shutdown()


# ---- flush, reset_write_offset, get_commit_log_data ----------------------------------------

def _spread(store, n=120, size=1500):
    """Messages over several 64 KiB CommitLog files, alternating two queues, keyed."""
    return [store.put_message(Message("T", b"%05d" % i + b"x" * size, queue_id=i % 2,
                                      keys="k%d" % i)) for i in range(n)]


def test_flush_syncs_every_file_written_and_returns_the_flushed_offset(tmp_path, backend):
    # The flusher waits ten minutes between rounds: only flush() can move the offset.
    store = testing.open_store(tmp_path / "s", backend, testing.small_config(
        flush_commit_log_timed=True, flush_interval_commit_log=600_000))
    try:
        rs = _spread(store)
        end = store.get_max_phy_offset()
        mfq = store.commitlog.mfq
        assert len(mfq.files) >= 3 and mfq.flushed_where < end
        assert store.flush() == end == mfq.flushed_where
        assert all(f.flushed_position == f.read_position for f in mfq.files)
        assert store.checkpoint.physic_msg_timestamp == rs[-1].store_timestamp
        assert store.flush() == end                 # nothing new: the same answer
    finally:
        store.shutdown()


def test_flush_with_write_buffers_commits_them_first(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend, testing.small_config(
        transient_store_pool_enable=True, transient_store_pool_size=4,
        flush_commit_log_timed=True, flush_interval_commit_log=600_000,
        commit_interval_commit_log=600_000))
    try:
        mfq = store.commitlog.mfq
        # Each put wakes the committer, which commits 4 pages or more, or everything once its
        # thorough interval passed: held off while the puts run, so that they stay in the
        # write buffers whatever the host's speed (a slow one once let it commit them all).
        with store.commit_service._lock:
            _spread(store, n=20)
            end = mfq.get_max_wrote_position()   # in write buffers, not in the files yet
            assert mfq.committed_where < end
        assert store.flush() == end == mfq.committed_where == mfq.flushed_where
        assert store.get_max_phy_offset() == end
    finally:
        store.shutdown()


def test_flush_with_sync_flush_goes_through_the_group_commit(tmp_path, backend, monkeypatch):
    calls = []
    store = testing.open_store(tmp_path / "s", backend, testing.small_config(
        flush_disk_type=FlushDiskType.SYNC_FLUSH))
    service = type(store.flush_service)         # the backend's group commit
    assert issubclass(service, GroupCommitService)
    wait_flushed = service.wait_flushed

    def recording(self, offset, timeout_ms):
        calls.append(offset)
        return wait_flushed(self, offset, timeout_ms)

    monkeypatch.setattr(service, "wait_flushed", recording)
    try:
        # WAIT=false: the puts return before their sync, as a broker's oneway sends do.
        for i in range(5):
            store.put_message(Message("T", b"m%d" % i, properties={"WAIT": "false"}))
        calls.clear()
        end = store.get_max_phy_offset()
        assert store.flush() == end == store.commitlog.mfq.flushed_where
        assert calls == [end]
    finally:
        store.shutdown()


@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH])
def test_reset_write_offset_cuts_the_commit_log_queues_and_index_back(tmp_path, backend,
                                                                       flush):
    root = tmp_path / "s"
    store = testing.open_store(root, backend, testing.small_config(flush_disk_type=flush))
    try:
        rs = _spread(store, n=80)
        cut = rs[50].commit_log_offset
        assert store.get_max_phy_offset() - cut <= 2 * store.commitlog.file_size
        assert store.reset_write_offset(cut) is True
        assert store.get_max_phy_offset() == cut
        assert store.get_max_offset_in_queue("T", 0) == 25
        assert store.get_max_offset_in_queue("T", 1) == 25
        assert store.query_message("T", "k60").message_count == 0
        assert store.query_message("T", "k49").message_count == 1
        assert store.look_message_by_offset(rs[60].commit_log_offset) is None
        r = store.put_message(Message("T", b"after", queue_id=0, keys="k60"))
        assert r.status is PutMessageStatus.PUT_OK
        assert (r.commit_log_offset, r.queue_offset) == (cut, 25)
        got = store.get_message("g", "T", 0, 25)
        assert [m.body for m in got.messages] == [b"after"]
        assert [m.body for m in store.query_message("T", "k60").messages] == [b"after"]
        assert store.flush() == r.commit_log_offset + r.wrote_bytes
    finally:
        store.shutdown()
    store = testing.open_store(root, backend, testing.small_config(flush_disk_type=flush))
    try:
        assert store.recovery_report.normal and store.recovery_report.truncated_bytes == 0
        assert store.get_max_offset_in_queue("T", 0) == 26
        assert store.get_max_offset_in_queue("T", 1) == 25
        assert store.get_message("g", "T", 0, 25).messages[0].body == b"after"
    finally:
        store.shutdown()


def test_reset_write_offset_refuses_more_than_two_files_back_and_outside_the_log(store):
    rs = _spread(store, n=150)
    end = store.get_max_phy_offset()
    assert end - rs[0].commit_log_offset > 2 * store.commitlog.file_size
    assert store.reset_write_offset(rs[0].commit_log_offset) is False
    assert store.get_max_phy_offset() == end
    assert store.get_max_offset_in_queue("T", 0) == 75
    with pytest.raises(InvalidArgumentError, match="outside the CommitLog"):
        store.reset_write_offset(end + 1)
    with pytest.raises(ValueError):
        store.reset_write_offset(-1)
    assert store.reset_write_offset(end) is True             # a cut at the end changes nothing
    assert store.get_max_offset_in_queue("T", 1) == 75



def test_a_cut_and_a_topic_deletion_at_once_do_not_deadlock(store, monkeypatch):
    # delete_topic takes the put lock, then the dispatch lock; reset_write_offset took the
    # dispatch lock, then the put lock: one of each at once waited for the other forever
    # (seen in a stress run of puts, cuts and deletions), puts hanging behind them. Both take
    # them in that order now; a cut started while the deletion holds them waits, then runs.
    import threading
    rs = _fill(store)
    assert store.put_message(Message("Gone", b"x")).status is PutMessageStatus.PUT_OK
    testing.wait_dispatched(store)
    cut = threading.Thread(target=store.reset_write_offset, args=(rs[3].commit_log_offset,))
    stuck = []
    select = store.topic_configs.select

    def select_under_the_put_lock(topic):
        # delete_topic holds the put lock and the dispatch lock here.
        cut.start()
        cut.join(0.3)                       # the cut waits for the put lock meanwhile
        if not cut.is_alive():
            stuck.append("the cut ran inside the deletion")
        return select(topic)
    monkeypatch.setattr(store.topic_configs, "select", select_under_the_put_lock)
    deleted = store.delete_topic("Gone")
    monkeypatch.undo()
    cut.join(10)
    assert not cut.is_alive() and stuck == [] and deleted
    assert store.get_max_offset_in_queue("T", 1) == 3
    assert store.put_message(Message("T", b"next", queue_id=1)).queue_offset == 3

def test_commit_log_data_is_a_view_to_the_files_written_end_that_holds_the_file(store):
    rs = _fill(store)
    # Flushed and dispatched now: the flusher's thorough round (every 10 s) would hold the
    # file while it synced, and the reput thread while it caught up, and count among the
    # views held.
    assert store.flush() >= rs[-1].commit_log_offset + rs[-1].wrote_bytes
    testing.wait_dispatched(store)
    off = rs[1].commit_log_offset
    mf = store.commitlog.mfq.find_by_offset(off)
    before = mf.ref_count
    view = store.get_commit_log_data(off)
    assert view.readonly and len(view) == mf.read_position - (off - mf.file_from_offset)
    assert bytes(view[:rs[1].wrote_bytes]) == bytes(store.select_one_message_by_offset(off))
    assert mf.ref_count == before + 1
    tail = view[rs[1].wrote_bytes:]             # a slice keeps the hold too
    del view
    assert mf.ref_count == before + 1
    assert bytes(tail[:4]) == rs[2].wrote_bytes.to_bytes(4, "big")
    del tail
    assert mf.ref_count == before
    end = rs[-1].commit_log_offset + rs[-1].wrote_bytes
    assert store.get_commit_log_data(end) is None           # nothing written there yet
    assert store.get_commit_log_data(10 ** 9) is None
    with pytest.raises(ValueError):
        store.get_commit_log_data(-1)


def _six_master_records(tmp_path, backend):
    """Six records a master wrote (its put results, and the CommitLog bytes they fill), for a
    slave to receive by hand."""
    master = testing.open_store(tmp_path / "m", backend)
    try:
        rs = [master.put_message(Message("T", b"%d" % i)) for i in range(6)]
        end = rs[-1].commit_log_offset + rs[-1].wrote_bytes
        return rs, bytes(master.commitlog.mfq.files[0].mm[:end])
    finally:
        master.shutdown()


def test_a_replicated_frame_zeroed_by_a_cut_at_its_start_is_not_published(tmp_path, backend):
    # A cut at the CommitLog's end (the frame's start) moves no position, but it zeroes the
    # file's tail, where the frame's body already was: the publish, which compared only the
    # write position with the frame's start, moved it to the frame's end over zeros, which
    # reput and a recovery stop at.
    rs, raw = _six_master_records(tmp_path, backend)
    end = len(raw)
    frame = rs[4].commit_log_offset
    slave = testing.open_store(tmp_path / "s", backend,
                               testing.small_config(broker_role=BrokerRole.SLAVE))
    try:
        cl = slave.commitlog
        assert slave.append_to_commit_log(0, raw[:frame]) is True
        mf = cl.replica_target(frame, end - frame)
        mf.write_target[frame:end] = raw[frame:end]            # the body arrived
        assert slave.reset_write_offset(frame) is True          # then the cut
        assert cl.publish_replica(mf, frame, end) is False
        assert slave.get_max_phy_offset() == frame
        # The master sends from the slave's offset again: everything lands.
        assert slave.append_to_commit_log(frame, raw[frame:]) is True
        testing.wait_until(lambda: slave.dispatch_behind_bytes() == 0, what="reput")
        assert slave.get_max_offset_in_queue("T", 0) == 6
    finally:
        slave.shutdown()


def test_a_replicated_frame_whose_place_was_cut_meanwhile_is_not_published(tmp_path, backend):
    # The HA client reserves a frame's place (replica_target), receives the body into the
    # file, then publishes it (publish_replica), taking the put lock for each step only. A
    # reset_write_offset in between cut the CommitLog below the frame: the publish still
    # moved the write position to the frame's end, past a run of zeros, so the slave took
    # the frame for appended (and reported it to the master) while its reput and a
    # recovery stop at the zeros.
    rs, raw = _six_master_records(tmp_path, backend)
    end = len(raw)
    cut, frame = rs[2].commit_log_offset, rs[4].commit_log_offset
    slave = testing.open_store(tmp_path / "s", backend,
                               testing.small_config(broker_role=BrokerRole.SLAVE))
    try:
        cl = slave.commitlog
        assert slave.append_to_commit_log(0, raw[:frame]) is True
        mf = cl.replica_target(frame, end - frame)
        assert slave.reset_write_offset(cut) is True            # while the body arrives
        mf.write_target[frame:end] = raw[frame:end]
        assert cl.publish_replica(mf, frame, end) is False
        assert slave.get_max_phy_offset() == cut
        # Nothing of the frame is left past the write position to be taken for records.
        assert bytes(mf.mm[cut:end]) == bytes(end - cut)
        # The master sends from the slave's offset again: everything lands.
        assert slave.append_to_commit_log(cut, raw[cut:]) is True
        testing.wait_until(lambda: slave.dispatch_behind_bytes() == 0, what="reput")
        assert slave.get_max_offset_in_queue("T", 0) == 6
    finally:
        slave.shutdown()
