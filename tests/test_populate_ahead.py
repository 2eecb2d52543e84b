# SPDX-License-Identifier: Apache-2.0
"""ConsumeQueue and index windows are reserved and populated ahead of their writer by the
store's PopulateAheadService: a put that dispatches inline (the default) never populates a
queue or index window in its own thread, windows stay bounded, and the writer still reserves
what it writes itself when the service lags, so a full disk refuses cleanly."""
import errno
import logging
import os
import threading

import pytest

from rocketstore import testing
from rocketstore.consume_queue import POPULATED_WINDOW_MAX, RESERVE_WINDOW_MAX, ConsumeQueue
from rocketstore.fs import FileSystem
from rocketstore.index_file import ENTRY_RESERVE_WINDOW_MAX
from rocketstore.mapped_file import MappedFile
from rocketstore.mapped_file_queue import MappedFileQueue
from rocketstore.services.populate import PopulateAheadService
from test_populate import SlowCreate

SERVICE = PopulateAheadService.name


def _part(path):
    if (path or "").endswith(os.sep + "index.creating"):
        return "index"              # the next index file, made ahead in index.ahead/
    parts = (path or "").split(os.sep)
    return next((p for p in ("commitlog", "consumequeue", "index") if p in parts), None)


class Recording(FileSystem):
    """Records every populate (thread, store part, start, length) and every reservation
    (thread, store part); `full_parts` refuses reservations of those parts with ENOSPC;
    `hold` (an Event) keeps the service's populates waiting until it is set."""

    def __init__(self):
        self.paths = {}
        self.populates = []
        self.reserves = []
        self.creates = []
        self.full_parts = set()
        self.hold = None

    def create_sized(self, path, size):
        self.creates.append((threading.current_thread().name, _part(path)))
        return super().create_sized(path, size)

    def map(self, path, size, writable=True, kernels=None):
        mm = super().map(path, size, writable, kernels=kernels)
        self.paths[id(mm)] = path
        return mm

    def reserve(self, path, offset, length):
        part = _part(path)
        self.reserves.append((threading.current_thread().name, part))
        if part in self.full_parts:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return super().reserve(path, offset, length)

    def prefault(self, mm, start=0, length=None, chunk=1 << 20, from_end=False):
        thread = threading.current_thread().name
        if self.hold is not None and thread == SERVICE:
            self.hold.wait(30)
        self.populates.append((thread, _part(self.paths.get(id(mm))), start, length))
        return super().prefault(mm, start, length, chunk, from_end)


def _page_up(n):
    # A file's last page may be partly past its end (a queue file of 6 000 000 bytes).
    return -(-n // 4096) * 4096


def config(**kw):
    # RocketMQ's queue file (300 000 units) and a small index file; 16 KiB first windows.
    return testing.small_config(**{"mapped_file_size_commit_log": 64 << 20,
                                   "mapped_file_size_consume_queue": 300_000 * 20,
                                   "max_hash_slot_num": 4096, "max_index_num": 400_000, **kw})


def _put_keyed_batches(store, batches, size=1000, start=0):
    for b in range(start, start + batches):
        r = store.put_batch("TopicA", 0, [b"q" * 16] * size,
                            keys=[f"k-{b * size + i}" for i in range(size)])
        assert r.ok


def test_a_put_whose_queue_and_index_windows_end_populates_nothing_in_its_own_thread(
        tmp_path, backend):
    fs = Recording()
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        assert store.config.dispatch_in_put_lag == 0      # each put dispatches its records
        putter = threading.current_thread().name
        # 120 000 units and entries: 2.4 MB of each, many windows of 16 KiB and up.
        _put_keyed_batches(store, 120)
        testing.wait_dispatched(store)
        testing.wait_until(lambda: store.populate_service.pending == 0)
        mine = [p for p in fs.populates if p[0] == putter and p[1] in ("consumequeue", "index")]
        assert mine == []
        served = {p[1] for p in fs.populates if p[0] == SERVICE}
        assert served == {"consumequeue", "index"}
        # The service reserved windows ahead too. (How many the writer reserved itself -- a
        # new file's first window, the slot table, any window the service had not reached
        # yet -- depends on how the two threads were scheduled.)
        reserved_by = [r for r in fs.reserves if r[1] in ("consumequeue", "index")]
        assert any(r[0] == SERVICE for r in reserved_by)
        assert store.populate_service.served_inline == 0
        # Every unit and key is there.
        cq = store.find_consume_queue("TopicA", 0)
        assert cq.max_offset_in_queue == 120_000
        assert store.query_message("TopicA", "k-119999", 8, 0, 2 ** 62).messages
    finally:
        store.shutdown()


def test_queue_and_index_windows_populated_ahead_stay_bounded(tmp_path, backend):
    fs = Recording()
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        for round_ in range(6):
            _put_keyed_batches(store, 40, start=40 * round_)
            testing.wait_dispatched(store)
            testing.wait_until(lambda: store.populate_service.pending == 0)
            cq = store.find_consume_queue("TopicA", 0).mfq.files[-1]
            index = store.index_service.index_file_list[-1]
            # An index file's entries end after the header, the slot table and its count.
            entries_end = index.file_size - (index.index_num - index.index_count) * 20
            for mf, written, cap in ((cq, cq.wrote_position, POPULATED_WINDOW_MAX),
                                     (index.mf, entries_end, ENTRY_RESERVE_WINDOW_MAX)):
                assert mf.refill_position <= mf.reserved_position
                # At most one window reserved ahead of what is written, a few MiB.
                assert mf.reserved_position - written <= cap + 4096, mf
            # Nothing populated outside reserved blocks (a full disk would SIGBUS there).
            assert testing.cached_bytes(cq.path) <= _page_up(cq.reserved_position)
        for kind, cap in (("consumequeue", POPULATED_WINDOW_MAX),
                          ("index", ENTRY_RESERVE_WINDOW_MAX)):
            sizes = [p[3] for p in fs.populates if p[1] == kind]
            assert sizes and max(sizes) <= cap, kind
    finally:
        store.shutdown()


class _Lagging(PopulateAheadService):
    """A service starved of CPU: it holds what it is asked (`held`) until `serve_oldest`
    serves the oldest request still held that reserves a window."""

    def __init__(self):
        super().__init__()
        self.held = []

    def _queue(self, request):
        self.held.append(request)
        return True

    def serve_oldest(self):
        request = next(r for r in self.held if r[3])
        self.held.remove(request)
        self._fill(*request)


def test_a_stale_window_reserved_just_before_the_index_writer_s_own_leaves_it_room(
        tmp_path, backend, monkeypatch, caplog):
    # The service, lagging two requests behind, reserves the window ahead of an old writer
    # end just before the writer, past reserved_position, takes the reserve lock itself.
    # The window ends past the writer's end, so the writer's reserve finds nothing to do;
    # and half a window (the lead the writer just asked with) before its end lies below
    # what the writer had already been let write. Without room made, the compiled index
    # loop raised RuntimeError in the putting thread ("no room made"), count=24202 in a
    # benchmark of 20 000 keyed messages a put.
    service = _Lagging()
    store = testing.open_store(tmp_path / "s", backend, config=config())
    try:
        assert not store.index_service.index_file_list
        store.index_service.populator = service
        real_reserve = MappedFile.reserve
        armed = []
        met = []

        def reserve(mf, end, required=True):
            if armed and required and mf is armed[0].mf:
                index = armed.pop()
                service.serve_oldest()
                written = index.file_size - (index.index_num - index.index_count) * 20
                met.append((mf.refill_position < written, end <= mf.reserved_position))
            return real_reserve(mf, end, required)
        monkeypatch.setattr(MappedFile, "reserve", reserve)
        batches = 0
        while not armed and batches < 100:
            _put_keyed_batches(store, 1, start=batches)
            batches += 1
            if sum(1 for r in service.held if r[3]) == 2:
                armed.append(store.index_service.index_file_list[-1])
        assert armed and batches < 100
        while armed and batches < 100:
            _put_keyed_batches(store, 1, start=batches)
            batches += 1
        # The interleaving was met: the stale window left refill_position below what the
        # writer had written, and reaching past the end it asked for.
        assert met == [(True, True)]
        hooked = batches - 1
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        _put_keyed_batches(store, 2, start=batches)
        batches += 2
        testing.wait_dispatched(store)
        # Every key indexed once.
        index = store.index_service.index_file_list[-1]
        assert index.index_count == 1000 * batches + 1
        keys = [f"k-{b * 1000 + 999}" for b in range(batches)]
        keys += [f"k-{hooked * 1000 + i}" for i in range(1000)]
        for key in keys:
            assert len(store.query_message("TopicA", key, 8, 0, 2 ** 62).messages) == 1, key
    finally:
        store.shutdown()


def test_puts_go_on_while_the_populate_service_is_stuck(tmp_path, backend):
    fs = Recording()
    fs.hold = threading.Event()
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        # Every window past the first ones is reserved by the writer itself, and its pages
        # faulted in by the writes: slower, never blocked, nothing lost.
        _put_keyed_batches(store, 60)
        testing.wait_dispatched(store)
        assert store.find_consume_queue("TopicA", 0).max_offset_in_queue == 60_000
        assert store.query_message("TopicA", "k-59999", 8, 0, 2 ** 62).messages
    finally:
        fs.hold.set()
        store.shutdown()


def test_a_disk_too_full_for_the_next_queue_window_fails_the_dispatch_without_sigbus(
        tmp_path, backend):
    fs = Recording()
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        _put_keyed_batches(store, 5)
        testing.wait_dispatched(store)
        fs.full_parts.add("consumequeue")
        # The service cannot reserve ahead; the writer meets ENOSPC when it gets to the
        # reserved end itself. The puts themselves are in the CommitLog.
        _put_keyed_batches(store, 300, start=5)
        cq = store.find_consume_queue("TopicA", 0)
        f = cq.mfq.files[-1]
        assert f.wrote_position <= f.reserved_position
        assert testing.cached_bytes(f.path) <= _page_up(f.reserved_position)
        assert cq.max_offset_in_queue < 305_000
        fs.full_parts.clear()
        # Reput retries once a second, then dispatches up to 300 000 units: with the pure
        # backend on a loaded machine, more than ten seconds.
        testing.wait_until(lambda: cq.max_offset_in_queue == 305_000, timeout=120,
                           what="the queue dispatched after the disk freed up")
    finally:
        store.shutdown()


def test_without_a_running_service_a_queue_window_is_populated_in_the_callers_thread(
        tmp_path, backend):
    fs = Recording()
    service = PopulateAheadService()             # never started: asks are served inline
    cq = ConsumeQueue(str(tmp_path), "TopicA", 0, 300_000 * 20, backend, fs,
                      reserve_window=16 << 10, populator=service)
    for i in range(2000):
        cq.put_unit(1000 + 100 * i, 100, 0, i)
    f = cq.mfq.files[-1]
    assert service.served_inline > 0 and service.served == 0
    me = threading.current_thread().name
    assert fs.populates and all(p[0] == me for p in fs.populates)
    assert f.wrote_position == 2000 * 20 <= f.refill_position <= f.reserved_position
    assert testing.cached_bytes(f.path) <= _page_up(f.reserved_position)
    cq.mfq.destroy()


@pytest.mark.parametrize("populator", [False, True])
def test_a_new_queue_file_starts_with_the_window_its_predecessor_grew_to_when_populated_ahead(
        tmp_path, backend, populator):
    service = PopulateAheadService() if populator else None
    cq = ConsumeQueue(str(tmp_path), "TopicA", 0, 20_000 * 20, backend, FileSystem(),
                      reserve_window=16 << 10, populator=service)
    for i in range(20_010):              # a whole file, and 10 units of the next
        cq.put_unit(1000 + 100 * i, 100, 0, i)
    first, second = cq.mfq.files
    assert first.reserve_window > 4 * (16 << 10)
    cap = POPULATED_WINDOW_MAX if populator else RESERVE_WINDOW_MAX
    assert first.reserve_window <= cap and second.reserve_window <= cap
    if populator:
        # Its lead is there from the first unit on.
        assert second.reserve_window >= first.reserve_window
        assert second.reserved_position >= first.reserve_window // 2
    else:
        # Grown again from the configured window (doubled once by its first reservation).
        assert second.reserve_window <= 2 * (16 << 10)
    cq.mfq.destroy()


def test_a_queue_rolls_into_a_file_made_and_populated_off_the_putting_thread(tmp_path, backend):
    fs = Recording()
    store = testing.open_store(tmp_path / "s", backend, config=config(
        mapped_file_size_consume_queue=20_000 * 20), fs=fs)
    try:
        putter = threading.current_thread().name
        for b in range(70):                          # 3.5 files of 20 000 units
            _put_keyed_batches(store, 1, start=b)
            # The service keeps up (as its lead lets it, unless the machine starves it).
            testing.wait_until(lambda: store.populate_service.pending == 0)
        testing.wait_dispatched(store)
        cq = store.find_consume_queue("TopicA", 0)
        assert len(cq.mfq.files) == 4
        queue_files = [c[0] for c in fs.creates if c[1] == "consumequeue"]
        # The writer made the queue's first file; the service made each next one ahead.
        assert queue_files.count(putter) == 1
        assert queue_files.count(SERVICE) >= 3
        assert cq.max_offset_in_queue == 70_000
        assert store.get_message("g", "TopicA", 0, 69_999, 1).messages
    finally:
        store.shutdown()
    # The file made for the next roll was never written: shutdown deleted it.
    names = sorted(os.listdir(tmp_path / "s" / "consumequeue" / "TopicA" / "0"))
    assert names == [f"{i * 400_000:020d}" for i in range(4)]
    store = testing.open_store(tmp_path / "s", backend, config=config(
        mapped_file_size_consume_queue=20_000 * 20))
    try:
        assert store.find_consume_queue("TopicA", 0).max_offset_in_queue == 70_000
    finally:
        store.shutdown()


@pytest.mark.parametrize("fast_roll_s, made_at_roll", [(3600.0, True), (0.0, False)])
def test_a_queue_whose_files_fill_fast_keeps_two_files_made_ahead_from_the_roll(
        tmp_path, backend, monkeypatch, fast_roll_s, made_at_roll):
    """A file filled in under FAST_ROLL_S has the two files after the one the writer rolls
    into made at once, not the next one once that is reserved to its end: two files' time of
    lead, not a window's. (The threshold is set here, so that the test does not depend on
    the machine's pace.)"""
    monkeypatch.setattr(MappedFileQueue, "FAST_ROLL_S", fast_roll_s)
    size = 300_000 * 20
    store = testing.open_store(tmp_path / "s", backend, config=config())
    try:
        _put_keyed_batches(store, 301)              # 301 000 units: into the second file
        testing.wait_dispatched(store)
        testing.wait_until(lambda: store.populate_service.pending == 0)
        mfq = store.find_consume_queue("TopicA", 0).mfq
        assert len(mfq.files) == 2
        # The file rolled into is not reserved to its end: the making that waits for that
        # has not begun.
        assert mfq.files[-1].reserved_position < size
        made = [f.file_from_offset for f in mfq._ready]
        assert made == ([2 * size, 3 * size] if made_at_roll else [])
        # Either way the queue rolls on, into the files made, and reads back.
        _put_keyed_batches(store, 300, start=301)
        testing.wait_dispatched(store)
        assert len(mfq.files) == 3
        assert store.find_consume_queue("TopicA", 0).max_offset_in_queue == 601_000
        assert store.get_message("g", "TopicA", 0, 600_999, 1).messages
    finally:
        store.shutdown()
    # The files made ahead were never written: shutdown deleted them.
    names = sorted(os.listdir(tmp_path / "s" / "consumequeue" / "TopicA" / "0"))
    assert names == [f"{i * size:020d}" for i in range(3)]


def test_a_roll_into_a_file_being_made_waits_for_it_and_the_path_is_made_once(tmp_path,
                                                                              backend):
    """The next file is made outside the queue's lock; a writer rolling into it meanwhile
    waits for it and takes it, never making (or, once rejected, deleting) the same path."""
    class SlowCreate(FileSystem):
        def __init__(self):
            self.creates = []
            self.entered = threading.Event()
            self.gate = threading.Event()

        def create_sized(self, path, size, preallocate=False):
            self.creates.append((threading.current_thread().name, path))
            if threading.current_thread().name == SERVICE:
                self.entered.set()
                assert self.gate.wait(30)
            return super().create_sized(path, size, preallocate)

    fs = SlowCreate()
    service = PopulateAheadService()
    service.start()
    size = 64 << 10
    mfq = MappedFileQueue(str(tmp_path / "q"), size, backend, fs, reserve_window=size,
                          reserve_window_max=size, populator=service)
    try:
        first = mfq.get_last_mapped_file(0)
        service.prepare_after(mfq, first)       # as a fast queue's roll asks
        assert fs.entered.wait(30)              # the service is making the second file
        rolled = []
        first.wrote_position = size             # full: the writer rolls
        writer = threading.Thread(target=lambda: rolled.append(mfq.get_last_mapped_file(0)),
                                  name="writer")
        writer.start()
        writer.join(0.3)
        assert writer.is_alive() and not rolled  # waiting for the file being made
        fs.gate.set()
        writer.join(30)
        assert rolled and rolled[0].file_from_offset == size
        assert [f.file_from_offset for f in mfq.files] == [0, size]
        second = os.path.join(str(tmp_path / "q"), f"{size:020d}")
        assert [c for c in fs.creates if c[1] == second] == [(SERVICE, second)]
        assert os.path.exists(second)
    finally:
        fs.gate.set()
        service.shutdown()
        mfq.drop_prepared()
        mfq.close()


class _RemovesWhileMaking(SlowCreate):
    """SlowCreate (the making of `path` waits for `go`), recording each file removed, in
    order."""

    def __init__(self, path):
        super().__init__(path)
        self.removed = []

    def remove(self, path):
        self.removed.append(os.path.basename(path))
        return super().remove(path)


@pytest.mark.parametrize("drop", ["close", "delete_last_file"])
def test_files_made_ahead_are_deleted_from_the_last_even_while_one_is_being_made(
        tmp_path, backend, drop):
    """Files made ahead are deleted from the last, so that a kill between two deletions
    leaves adjacent segments, which load requires. One still being made lies past the others:
    it goes first too. (A kill between them once left a topic's queue unloadable: CI.)"""
    size = 64 << 10
    directory = str(tmp_path / "q")
    fs = _RemovesWhileMaking(os.path.join(directory, f"{2 * size:020d}"))
    service = PopulateAheadService()            # not running: made in the caller's thread
    mfq = MappedFileQueue(directory, size, backend, fs, reserve_window=size,
                          reserve_window_max=size, populator=service)
    first = mfq.get_last_mapped_file(0)
    mfq._ahead = 2                              # as a fast-filling queue's roll sets it
    assert mfq.prepare_next(first).file_from_offset == size
    maker = threading.Thread(target=mfq.prepare_next, args=(first,), name="maker")
    maker.start()
    assert fs.creating.wait(30)                 # the file after it is being made
    dropper = threading.Thread(target=getattr(mfq, drop), name="dropper")
    dropper.start()
    dropper.join(0.3)
    fs.go.set()
    maker.join(30)
    dropper.join(30)
    assert not maker.is_alive() and not dropper.is_alive()
    made = [f"{2 * size:020d}", f"{size:020d}"]
    assert [name for name in fs.removed if name in made] == made
    # close keeps the queue's own file; delete_last_file deletes it (the last) too.
    assert os.listdir(directory) == ([f"{0:020d}"] if drop == "close" else [])
    mfq.close()


@pytest.mark.parametrize("fast_roll_s, made", [(0.0, 1), (3600.0, 2)])
def test_files_made_ahead_are_deleted_when_the_queue_is_truncated_before_them(
        tmp_path, backend, monkeypatch, fast_roll_s, made):
    monkeypatch.setattr(MappedFileQueue, "FAST_ROLL_S", fast_roll_s)   # one ahead, or two
    service = PopulateAheadService()             # not started: served in this thread
    cq = ConsumeQueue(str(tmp_path), "TopicA", 0, 20_000 * 20, backend, FileSystem(),
                      reserve_window=16 << 10, populator=service)
    for i in range(39_000):                      # the second file reserved to its end
        cq.put_unit(1000 + 100 * i, 100, 0, i)
    directory = os.path.join(str(tmp_path), "consumequeue", "TopicA", "0")
    assert sorted(os.listdir(directory)) == [f"{i * 400_000:020d}" for i in range(2 + made)]
    assert len(cq.mfq.files) == 2
    # Back into the first file: the second is deleted, and those made after it too.
    cq.truncate_dirty_logic_files(1000 + 100 * 10_000)
    assert sorted(os.listdir(directory)) == [f"{0:020d}"]
    for i in range(10_000, 40_010):              # rolls into files made afresh
        cq.put_unit(1000 + 100 * i, 100, 0, i)
    assert cq.max_offset_in_queue == 40_010
    assert [f.file_from_offset for f in cq.mfq.files] == [0, 400_000, 800_000]
    cq.mfq.destroy()
    assert os.listdir(directory) == []


class _ServiceAtRename(FileSystem):
    """Runs `at_rename()` right after a rename: the populate service making a queue's next
    file just as a topic deletion moved the topic's directory aside."""

    at_rename = None

    def rename(self, src, dst):
        super().rename(src, dst)
        if self.at_rename is not None and dst.endswith(".deleted"):
            self.at_rename()


def test_a_deleted_topic_s_queue_gets_no_file_made_ahead_after_its_directory_moved(
        tmp_path, backend):
    fs = _ServiceAtRename()
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        _put_keyed_batches(store, 2)
        testing.wait_dispatched(store)
        mfq = store.find_consume_queue("TopicA", 0).mfq

        def make_next():
            files = mfq.files
            if files:
                mfq.prepare_next(files[-1])
        fs.at_rename = make_next
        assert store.delete_topic("TopicA")
        fs.at_rename = None
        assert not os.path.exists(tmp_path / "s" / "consumequeue" / "TopicA")
    finally:
        store.shutdown()
    assert not os.path.exists(tmp_path / "s" / "consumequeue" / "TopicA")


def test_files_made_ahead_are_bounded_across_queues(tmp_path, backend, monkeypatch):
    # Each file made ahead is one more mapping; a process has vm.max_map_count of them.
    monkeypatch.setattr(PopulateAheadService, "MAX_PREPARED", 2)
    service = PopulateAheadService()             # not started: served in this thread
    queues = [ConsumeQueue(str(tmp_path), "TopicA", q, 1000 * 20, backend, FileSystem(),
                           reserve_window=16 << 10, populator=service) for q in range(4)]
    for cq in queues:
        for i in range(999):                     # the first file reserved to its end
            cq.put_unit(1000 + 100 * i, 100, 0, i)
    assert service.prepared == 2
    assert sorted(len(os.listdir(os.path.join(str(tmp_path), "consumequeue", "TopicA",
                                              str(q)))) for q in range(4)) == [1, 1, 2, 2]
    for cq in queues:                            # rolls: into files made ahead, or made now
        for i in range(999, 1001):
            cq.put_unit(1000 + 100 * i, 100, 0, i)
        assert cq.max_offset_in_queue == 1001
    for cq in queues:
        cq.mfq.destroy()
    assert service.prepared == 0


class _PopulateInFlight(FileSystem):
    """Keeps a populate of the mapping `target` in flight until `go` is set, using its pages
    meanwhile (a buffer export, as a GIL-free madvise does): until then the file cannot be
    unmapped (close() raises BufferError)."""

    target = None

    def __init__(self):
        self.started = threading.Event()
        self.go = threading.Event()

    def prefault(self, mm, start=0, length=None, chunk=1 << 20, from_end=False):
        if mm is self.target:
            with memoryview(mm):
                self.started.set()
                self.go.wait(30)
        return super().prefault(mm, start, length, chunk, from_end)


def test_a_file_truncated_away_while_its_window_is_populated_is_deleted_not_taken_up_again(
        tmp_path, backend):
    # A file left on disk by a destroy that could not unmap is found by the next file made at
    # its offset (create_sized keeps an existing file): its stale units would then follow the
    # new ones, and recovery would take them for queue entries.
    fs = _PopulateInFlight()
    service = PopulateAheadService()
    service.start()
    cq = ConsumeQueue(str(tmp_path), "TopicA", 0, 1000 * 20, backend, fs,
                      reserve_window=4096, populator=service)
    try:
        for i in range(1500):
            cq.put_unit(1000 + 100 * i, 100, 0, i)
        testing.wait_until(lambda: service.pending == 0, what="the service idle")
        second = cq.mfq.files[1]
        path = second.path
        fs.target = second.mm
        service.ask(second, second.wrote_position, start=0, reserve=False)
        testing.wait_until(fs.started.is_set, what="the populate in flight")

        def finish_populate_once_destroy_began():
            testing.wait_until(lambda: not second.is_available, what="the destroy")
            fs.go.set()
        opener = threading.Thread(target=finish_populate_once_destroy_began)
        opener.start()
        cq.truncate_dirty_logic_files(1000 + 100 * 500)     # back into the first file
        opener.join()
        assert not os.path.exists(path)
        for i in range(500, 1200):
            cq.put_unit(10**6 + 100 * i, 100, 0, i)
        assert cq.max_offset_in_queue == 1200
        with open(path, "rb") as f:                         # the file after the new units
            f.seek(200 * 20)
            assert f.read() == bytes(800 * 20)
    finally:
        fs.go.set()
        service.shutdown()
        cq.mfq.destroy()


def test_an_index_file_cut_away_while_its_window_is_populated_is_deleted(tmp_path, backend):
    # reset_write_offset drops the index files holding entries past the cut; one left on disk
    # because a populate held its pages would be loaded at the next start, entries and all.
    fs = _PopulateInFlight()
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        _put_keyed_batches(store, 4)
        testing.wait_dispatched(store)
        testing.wait_until(lambda: store.populate_service.pending == 0, what="the service idle")
        index = store.index_service.index_file_list[-1]
        path = index.mf.path
        fs.target = index.mf.mm
        store.populate_service.ask(index.mf, index.mf.wrote_position, start=0, reserve=False)
        testing.wait_until(fs.started.is_set, what="the populate in flight")

        def finish_populate_once_destroy_began():
            testing.wait_until(lambda: not index.mf.is_available, what="the destroy")
            fs.go.set()
        opener = threading.Thread(target=finish_populate_once_destroy_began)
        opener.start()
        assert store.reset_write_offset(0)
        opener.join()
        assert not os.path.exists(path)
    finally:
        fs.go.set()
        store.shutdown()


class _BeforeFirstPopulate(FileSystem):
    """Runs `during()` once, as the first populate begins."""

    during = None

    def prefault(self, mm, start=0, length=None, chunk=1 << 20, from_end=False):
        if self.during is not None:
            during, self.during = self.during, None
            during()
        return super().prefault(mm, start, length, chunk, from_end)


def test_a_file_made_ahead_and_deleted_before_its_populate_is_not_populated(tmp_path, backend):
    # The service made the next file ahead (prepare_next); before it populated that file's
    # first window, a truncation deleted it unused (drop_prepared). prefault means to ignore
    # a closed mapping but read its length first: ValueError out of the service's round,
    # whose other requests were then never served (nor counted off `pending`).
    from rocketstore.mapped_file_queue import MappedFileQueue
    size = 64 * 1024
    fs = _BeforeFirstPopulate()
    service = PopulateAheadService()            # not running: it serves in the caller
    mfq = MappedFileQueue(str(tmp_path / "q"), size, backend, fs, reserve_window=16 * 1024,
                          populator=service)
    mf = mfq.get_last_mapped_file(0)
    mf.reserve(size)                            # reserved to its end: the next is made ahead
    fs.during = mfq.drop_prepared
    service.ask(mf, 0, mfq=mfq)
    assert fs.during is None and service.prepared == 0
    assert os.listdir(tmp_path / "q") == ["%020d" % 0]


class _Gated(FileSystem):
    """Keeps the service's first reservation call waiting until `gate` is set, and records
    each reserve_many and populate_many call (how many files, in which order), and each file
    made. reserve() and prefault() are FileSystem's own, so a backend with space_prepare
    serves a call in one compiled call."""

    def __init__(self):
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls = []

    def reserve_many(self, kernels, requests):
        self.calls.append(("reserve", len(requests)))
        self.entered.set()
        assert self.gate.wait(30)
        return super().reserve_many(kernels, requests)

    def populate_many(self, kernels, requests, call_bytes=16 << 20):
        self.calls.append(("populate", len(requests)))
        return super().populate_many(kernels, requests, call_bytes)

    def create_sized(self, path, size, preallocate=False):
        self.calls.append(("create", path))
        return super().create_sized(path, size, preallocate)


def _queue_file(tmp_path, name, backend, fs, populator=None, size=64 << 10):
    """The first file of a queue of `size`-byte files with 16 KiB first windows."""
    mfq = MappedFileQueue(str(tmp_path / name), size, backend, fs, reserve_window=16 << 10,
                          reserve_window_max=size, populator=populator)
    return mfq, mfq.get_last_mapped_file(0)


def _blocks(mf):
    return os.stat(mf.path).st_blocks * 512


@pytest.fixture
def gated():
    """A started PopulateAheadService and a _Gated file system; afterwards the gate is opened
    and the service stopped."""
    fs = _Gated()
    service = PopulateAheadService()
    service.start()
    yield fs, service
    fs.gate.set()
    service.shutdown()


def _hold(fs, service, mf):
    """Ask for mf's first window and return once the service waits in that call."""
    fs.calls.clear()
    service.ask(mf, 0)
    assert fs.entered.wait(30)


def test_files_asking_at_once_are_served_in_batches_of_one_call_each(tmp_path, backend, gated):
    fs, service = gated
    first = _queue_file(tmp_path, "first", backend, fs)[1]
    files = [_queue_file(tmp_path, f"q{i}", backend, fs)[1] for i in range(150)]
    _hold(fs, service, first)
    for mf in files:                          # 150 writers ask meanwhile
        service.ask(mf, 0)
    fs.gate.set()
    testing.wait_until(lambda: service.pending == 0, what="the service idle")
    reserves = [n for call, n in fs.calls if call == "reserve"]
    populates = [n for call, n in fs.calls if call == "populate"]
    # One call for the first request, then one per batch of up to BATCH files: not one (and
    # with it four releases of the GIL) per file.
    assert reserves == [1, 64, 64, 22] == populates
    for mf in [first] + files:
        assert mf.reserved_position == 16 << 10
        assert _blocks(mf) >= 16 << 10        # reserved (and populated: written pages)
    assert service.served == 151 and service.served_inline == 0


def test_windows_asked_for_are_served_before_the_next_files_are_made(tmp_path, backend, gated):
    fs, service = gated
    # A file of 16 KiB: its first window reaches its end, so the service makes the queue's
    # next file; the others are 64 KiB files still short of theirs.
    mfq, ending = _queue_file(tmp_path, "ending", backend, fs, populator=service, size=16 << 10)
    first = _queue_file(tmp_path, "first", backend, fs)[1]
    files = [_queue_file(tmp_path, f"q{i}", backend, fs)[1] for i in range(100)]
    try:
        _hold(fs, service, first)
        service.ask(ending, 0, mfq=mfq)
        for mf in files:
            service.ask(mf, 0)
        fs.gate.set()
        testing.wait_until(lambda: service.pending == 0, what="the service idle")
        assert len(mfq.files) == 1 and len(mfq._ready) == 1
        creates = [i for i, call in enumerate(fs.calls) if call[0] == "create"]
        reserves = [i for i, call in enumerate(fs.calls) if call[0] == "reserve"]
        # The next file (a dozen system calls) waited for every window asked for; its own
        # first window is reserved with reserve() (FileSystem's, not recorded here).
        assert len(creates) == 1 and creates[0] > max(reserves)
        assert [fs.calls[i][1] for i in reserves] == [1, 64, 37]
        assert all(mf.reserved_position == 16 << 10 for mf in files)
    finally:
        mfq.drop_prepared()


def test_a_writer_reserving_in_a_file_of_a_batch_does_not_wait_for_the_batch(tmp_path, backend,
                                                                               gated):
    # The batch's fallocates run with no reserve lock held (each can wait behind writeback):
    # the writer reserves for itself at once, and the service's window, planned before,
    # is published only where it reaches past the writer's.
    fs, service = gated
    mf = _queue_file(tmp_path, "q", backend, fs)[1]
    _hold(fs, service, mf)                    # plans [0, 16 KiB) and waits in its call
    done = threading.Event()
    mine = []

    def writer():
        mine.append(mf.reserve(40 << 10))
        done.set()
    threading.Thread(target=writer, daemon=True).start()
    assert done.wait(10), "the writer waited for the service's reservations"
    old, new = mine[0]
    assert old == 0 and new > 40 << 10
    fs.gate.set()
    testing.wait_until(lambda: service.pending == 0, what="the service idle")
    # The writer's window stands: the service's smaller one was not published over it.
    assert mf.reserved_position == new
    assert mf.refill_position <= mf.reserved_position


class _Reserves(FileSystem):
    """Records each reservation: (thread, offset, length)."""

    def __init__(self):
        self.reserves = []

    def reserve(self, path, offset, length):
        self.reserves.append((threading.current_thread().name, offset, length))
        return super().reserve(path, offset, length)


WINDOW_MAX = 64 << 10


@pytest.fixture
def served_queue(tmp_path, backend):
    """A queue of 1 MiB files whose windows grow from 16 KiB to WINDOW_MAX, served by a
    started PopulateAheadService, on a _Reserves file system: (fs, service, its first file,
    write_to_refill). write_to_refill(end) has the writer ask at `end` (by default just past
    refill_position), as a queue's dispatch does, and waits for the service to be idle."""
    fs = _Reserves()
    service = PopulateAheadService()
    service.start()
    mfq = MappedFileQueue(str(tmp_path / "q"), 1 << 20, backend, fs, reserve_window=16 << 10,
                          reserve_window_max=WINDOW_MAX, populator=service)
    mf = mfq.get_last_mapped_file(0)

    def write_to_refill(end=None):
        service.refill(mf, mf.refill_position + 20 if end is None else end, mfq=mfq)
        testing.wait_until(lambda: service.pending == 0, what="the service idle")
    try:
        yield fs, service, mf, write_to_refill
    finally:
        service.shutdown()
        mfq.drop_prepared()


def test_a_file_whose_window_grew_to_the_most_has_blocks_held_ahead_and_windows_there_cost_no_call(
        served_queue):
    # Behind writeback a fallocate waited 60-140 ms, and a writer at millions of units a
    # second crossed its half-window lead meanwhile, then waited in its own fallocate
    # for the service's. Once a writer is that fast, the service holds its file's blocks
    # BLOCK_WINDOWS windows ahead, so the next windows are published with no call at all.
    fs, service, mf, write_to_refill = served_queue
    while mf.reserve_window < WINDOW_MAX:
        write_to_refill()
    held = min(mf.file_size, mf.reserved_position + service.BLOCK_WINDOWS * WINDOW_MAX)
    assert mf.blocks_position == held
    assert _blocks(mf) >= held                    # the blocks are there
    fs.reserves.clear()
    reserved = mf.reserved_position
    write_to_refill()
    assert reserved < mf.reserved_position <= held    # a window inside what was held
    # Only the blocks past what was held were asked for, by the service, ahead.
    assert fs.reserves and all(thread == SERVICE and offset >= held
                               for thread, offset, _ in fs.reserves)
    assert mf.blocks_position == min(mf.file_size,
                                     mf.reserved_position + service.BLOCK_WINDOWS * WINDOW_MAX)


def test_a_slow_file_holds_no_blocks_past_its_window(served_queue):
    _, _, mf, write_to_refill = served_queue
    write_to_refill(20)
    assert mf.reserve_window < mf.reserve_window_max
    assert mf.blocks_position == mf.reserved_position


def test_blocks_the_disk_refuses_to_hold_ahead_leave_the_writer_to_meet_enospc(served_queue):
    fs, service, mf, write_to_refill = served_queue
    refuse = {"over": WINDOW_MAX}      # reservations longer than this: only held blocks
    real = fs.reserve

    def reserve(path, offset, length):
        if length > refuse["over"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(path, offset, length)
    fs.reserve = reserve
    while mf.reserve_window < WINDOW_MAX:
        write_to_refill()
    write_to_refill()
    # Refused: a log line, nothing held past the window, the service idle.
    assert mf.blocks_position == mf.reserved_position
    # The disk full: the writer, past what is reserved, meets the error itself, with a
    # write to refuse.
    refuse["over"] = 0
    with pytest.raises(OSError) as err:
        write_to_refill(mf.reserved_position + 20)
    assert err.value.errno == errno.ENOSPC
    # Room again: blocks are held ahead once more.
    refuse["over"] = 1 << 30
    write_to_refill()
    assert mf.blocks_position > mf.reserved_position


class _MakingAheadOnRemove(FileSystem):
    """Before each file removal, runs `during()`: the populator's thread making the next file
    ahead (MappedFileQueue.prepare_next) at that moment."""

    during = None

    def remove(self, path):
        if self.during is not None:
            self.during()
        return super().remove(path)


def test_a_file_made_ahead_while_a_cut_deletes_files_is_not_unlinked_under_its_writer(
        tmp_path, backend):
    # A ConsumeQueue cut back into its first file deletes the second file and the two made
    # ahead after it (a fast queue keeps two). The populator, making files ahead of the new
    # last file meanwhile, made one under the path of a made-ahead file not yet deleted
    # (create_sized keeps an existing file); removing that path then unlinked the file the
    # writer later rolled into, and every unit written there was gone at the next open (its
    # flush failed with ENOENT first).
    size = 16 * 1024
    fs = _MakingAheadOnRemove()
    service = PopulateAheadService()            # not running: prepare_next is called here
    mfq = MappedFileQueue(str(tmp_path / "q"), size, backend, fs, reserve_window=size,
                          populator=service)
    first = mfq.get_last_mapped_file(0)
    assert first.append_bytes(b"a" * size)
    second = mfq.get_last_mapped_file(0)        # a fast roll: two files are made ahead
    assert second.append_bytes(b"b" * size)
    made = [mfq.prepare_next(second), mfq.prepare_next(second)]
    assert [f.file_from_offset for f in made] == [2 * size, 3 * size]
    fs.during = lambda: mfq.prepare_next(mfq.files[-1])
    mfq.delete_last_file()
    fs.during = None
    # Nothing was made while the cut's files were being deleted.
    assert os.listdir(tmp_path / "q") == ["%020d" % 0]
    first.set_positions(size // 2)
    assert first.append_bytes(b"c" * (size // 2))
    for fill in (b"d", b"e"):
        f = mfq.get_last_mapped_file(0)
        assert f.append_bytes(fill * size)
    assert [f.file_from_offset for f in mfq.files] == [0, size, 2 * size]
    for f, fill in zip(mfq.files, (b"a" * (size // 2) + b"c" * (size // 2), b"d" * size,
                                   b"e" * size)):
        with open(f.path, "rb") as disk:
            assert disk.read() == fill, f.path
    mfq.destroy()
