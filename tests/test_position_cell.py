# SPDX-License-Identifier: Apache-2.0
"""A ConsumeQueue's positions live in cells (CqMappedFile._cell: wrote, committed;
ConsumeQueue._cell: max_physic_offset) that the compiled dispatcher publishes into with plain
stores: every reader sees what dispatch, truncation and reload leave there, the same in every
backend; the dispatcher lets go of a cell whose queue changed under it; and a reader never
sees a position ahead of the unit bytes below it."""
import threading

from rocketstore import format as F
from rocketstore import testing
from rocketstore.mapped_file import CqMappedFile, MappedFile
from rocketstore.message import Message

UNIT = F.CQ_STORE_UNIT_SIZE
TOPICS = ["A", "B"]


def _config():
    # 8 units a file: the workload rolls every queue a few times.
    return testing.small_config(mapped_file_size_consume_queue=8 * UNIT)


def _positions(store):
    """What readers read of every queue: each file's (start, wrote, committed) through its
    properties and its cell, the queue's max_physic_offset, and its offsets."""
    out = {}
    for t in TOPICS:
        for q in range(3):
            cq = store.find_consume_queue(t, q)
            files = [(f.file_from_offset, f.wrote_position, f.committed_position,
                      f.read_position, tuple(f._cell)) for f in cq.mfq.files]
            out[t, q] = (files, cq.max_physic_offset, cq._cell[0], cq.last_offset(),
                         store.get_max_offset_in_queue(t, q))
    return out


def _put(store, n, first=0):
    for i in range(first, first + n):
        assert store.put_message(Message(TOPICS[i % 2], b"m%d" % i, queue_id=i % 3)).status.ok
    testing.wait_dispatched(store)


def _run(root, backend):
    """Dispatch, truncate every queue to the CommitLog offset of message 40, dispatch again
    from there, reload: the positions after each step."""
    steps = []
    store = testing.open_store(root, backend, _config())
    try:
        _put(store, 100)
        steps.append(_positions(store))
        cut = store.get_message("g", "A", 1, 6, 1).messages[0].commit_log_offset
        with store.reput_service.dispatch_lock:
            for t in TOPICS:
                for q in range(3):
                    store.find_consume_queue(t, q).truncate_dirty_logic_files(cut)
            steps.append(_positions(store))
            store.reput_service.reput_from_offset = cut
            store.reput_service.do_reput()
        steps.append(_positions(store))
        _put(store, 30, first=100)
        steps.append(_positions(store))
    finally:
        store.shutdown()
    store = testing.open_store(root, backend, _config())
    try:
        steps.append(_positions(store))
        _put(store, 10, first=130)
        steps.append(_positions(store))
    finally:
        store.shutdown()
    return steps


def test_positions_after_dispatch_truncation_and_reload_agree_across_backends(tmp_path):
    runs = {name: _run(tmp_path / name, testing.load_backend(name))
            for name in testing.backend_params()}
    first, steps = runs.popitem()
    for name, other in runs.items():
        assert other == steps, (name, first)
    after, cut, redispatched, more, reloaded, last = steps
    # The cells are what the properties read, and the queues hold what was put.
    for step in steps:
        for files, max_phy, cell_max, last_off, _ in step.values():
            assert max_phy == cell_max == last_off
            assert all(w == c == r and cell == (w, c) for _, w, c, r, cell in files)
    assert after == redispatched
    assert sum(v[4] for v in after.values()) == 100
    assert sum(v[4] for v in cut.values()) < 100
    assert sum(v[4] for v in more.values()) == 130 and reloaded == more
    assert sum(v[4] for v in last.values()) == 140


def test_consume_queue_files_keep_their_positions_in_cells_not_members(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend, _config())
    try:
        _put(store, 60)                         # 10 units a queue: 8 and 2
        cq = store.find_consume_queue("A", 0)
        f = cq.mfq.last_file
        assert type(f) is CqMappedFile and len(cq.mfq.files) == 2
        # MappedFile's own members stay None: a reader reading them in place would fail, not
        # read a stale position.
        assert MappedFile.__dict__["wrote_position"].__get__(f) is None
        assert MappedFile.__dict__["committed_position"].__get__(f) is None
        assert tuple(f._cell) == (f.wrote_position, f.committed_position) == (2 * UNIT, 2 * UNIT)
        assert cq._cell[0] == cq.max_physic_offset == cq.last_offset()
        # A CommitLog file is a plain MappedFile.
        assert type(store.commitlog.mfq.last_file) is MappedFile
    finally:
        store.shutdown()


def _exported(cell):
    """Whether something holds an export of `cell` (the dispatcher, while it keeps the queue's
    state): a resize is refused then."""
    try:
        cell.append(0)
    except BufferError:
        return True
    cell.pop()
    return False


def test_dispatcher_releases_the_cells_of_a_truncated_closed_or_deleted_queue(tmp_path):
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"), _config())
    try:
        _put(store, 36)                         # 6 units in each queue's first file
        cq = store.find_consume_queue("A", 0)
        f = cq.mfq.last_file
        # The compiled dispatcher keeps the queue's state, and the cells it publishes into.
        assert _exported(f._cell) and _exported(cq._cell)
        _put(store, 18, first=36)               # 3 more: each queue rolls to a second file
        _put(store, 6, first=54)                # and one more unit there
        second = cq.mfq.last_file
        assert second is not f and not _exported(f._cell) and _exported(second._cell)
        assert second.wrote_position == 2 * UNIT
        # Truncation deletes the second file: its cell is let go at the next dispatch, and
        # the units dispatched again are published in the cells of the files they land in.
        with store.reput_service.dispatch_lock:
            cut = store.get_message("g", "A", 0, 6, 1).messages[0].commit_log_offset
            cq.truncate_dirty_logic_files(cut)
            assert cq.mfq.last_file is f and f.wrote_position == 6 * UNIT
            store.reput_service.reput_from_offset = cut
            store.reput_service.do_reput()
        assert not _exported(second._cell)
        last = cq.mfq.last_file
        assert last is not second and last.wrote_position == 2 * UNIT
        assert f.wrote_position == 8 * UNIT and cq.max_offset_in_queue == 10
        got = testing.read_queue(store, "A", 0)
        assert [m.body for m in got] == [b"m%d" % i for i in range(0, 60, 6)]
        assert cq.max_physic_offset == got[-1].commit_log_offset + got[-1].store_size
        # A deleted topic: the dispatcher forgets its queues (and their cells).
        _put(store, 6, first=60)
        assert _exported(last._cell)
        assert store.delete_topic("A")
        assert not _exported(last._cell) and not _exported(cq._cell)
    finally:
        store.shutdown()


def test_a_queue_made_again_after_its_topic_was_deleted_starts_from_its_own_positions(
        tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend, _config())
    try:
        _put(store, 60)
        old = store.find_consume_queue("A", 0)
        assert old.max_offset_in_queue == 10
        assert store.delete_topic("A")
        for i in range(3):
            assert store.put_message(Message("A", b"new%d" % i, queue_id=0)).status.ok
        testing.wait_dispatched(store)
        cq = store.find_consume_queue("A", 0)
        assert cq is not old
        assert cq.mfq.last_file.wrote_position == 3 * UNIT
        assert store.get_max_offset_in_queue("A", 0) == 3
        got = testing.read_queue(store, "A", 0)
        assert [m.body for m in got] == [b"new0", b"new1", b"new2"]
        assert cq.max_physic_offset == got[-1].commit_log_offset + got[-1].store_size
    finally:
        store.shutdown()


def test_a_reader_never_sees_a_position_ahead_of_the_unit_bytes(tmp_path, backend):
    """A reader thread reads each published position and the unit just below it while a
    writer puts and dispatches: the unit there is always written (its record's offset is
    not past the queue's max_physic_offset read before it and its size is not 0)."""
    store = testing.open_store(tmp_path / "s", backend, _config())
    stop = threading.Event()
    bad = []
    cq = store.find_consume_queue("A", 0)
    unit = F.CQ_UNIT.struct

    def read():
        while not stop.is_set():
            files = cq.mfq.files
            if not files:
                continue
            f = files[-1]
            pos = f.read_position
            if pos < UNIT or not f.hold():
                continue
            try:
                off, size, _ = unit.unpack_from(f.mm, pos - UNIT)
            finally:
                f.release()
            if size <= 0 or off < 0:
                bad.append((f.file_name, pos, off, size))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(400):
            assert store.put_message(Message("A", b"m%d" % i, queue_id=0)).status.ok
        testing.wait_dispatched(store)
        stop.set()
        reader.join()
        assert bad == []
        assert cq.max_offset_in_queue == 400
    finally:
        stop.set()
        reader.join()
        store.shutdown()
