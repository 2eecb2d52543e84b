# SPDX-License-Identifier: Apache-2.0
"""The rest of DefaultMessageStore's read interface, snake_case: each method answers as 4.9.8's
does, and none of them creates a queue for a topic the store does not have."""
import os

import pytest

from rocketstore import BrokerRole, InvalidArgumentError, Message, testing


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
    monkeypatch.setattr(store, "_mem_limit", rs[-1].commit_log_offset - 1)
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
