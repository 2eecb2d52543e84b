# SPDX-License-Identifier: Apache-2.0
"""The allocator keeps a bounded window of reserved and populated CommitLog pages ahead of the
writer, first file included: the writer asks for the next window at refill_position, a lead
(half a window or more, as the writer's pace asks) before the reserved end, and reserves
itself only on reaching reserved_position. A put never waits for a populate, and a disk that
fills meanwhile still refuses puts cleanly."""
import errno
import logging
import mmap
import os
import threading
import time

import numpy as np
import pytest

from rocketstore import FlushDiskType, Message, PutMessageStatus, testing
from rocketstore import format as F
from rocketstore.config import BrokerRole
from rocketstore.fs import FileSystem
from rocketstore.mapped_file import MappedFile
from rocketstore.services.allocate import (BLOCK_WINDOWS, LEAD_WINDOWS,
                                           AllocateMappedFileService)

KiB = 1 << 10
WINDOW = 256 * KiB
ALLOCATOR = "AllocateMappedFileService"
RESERVER = "ReserveAheadService"
BACKGROUND = {ALLOCATOR, RESERVER}      # the threads that reserve ahead of the writer


def config(**kw):
    return testing.small_config(**{"mapped_file_size_commit_log": 2 << 20,
                                   "commit_log_reserve_window": WINDOW, **kw})


class Recording(FileSystem):
    """Records which thread reserves which CommitLog blocks (`reserves`: thread name,
    offset, length); `full` refuses them with ENOSPC; `hold` (an Event, when set) keeps
    every populate waiting until it is set."""

    def __init__(self):
        self.reserves = []
        self.full = False
        self.hold = None
        self.populating = threading.Event()

    def reserve(self, path, offset, length):
        if os.sep + "commitlog" + os.sep in path:
            self.reserves.append((threading.current_thread().name, offset, length))
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return super().reserve(path, offset, length)

    @property
    def reservers(self):
        return [name for name, _, _ in self.reserves]

    def prefault(self, mm, start=0, length=None, chunk=1 << 20, from_end=False):
        if self.hold is not None:
            self.populating.set()
            self.hold.wait(30)
        return super().prefault(mm, start, length, chunk, from_end)


def settled(mf):
    """The allocator has answered the writer's last request: refill_position sits below the
    reserved end again (or the file is reserved to its end), and every reserved page is in,
    but those below the flushed position, which a flush takes off the page tables."""
    synced = mf.flushed_position - mf.flushed_position % 4096
    return ((mf.refill_position < mf.reserved_position or mf.reserved_position == mf.file_size)
            and testing.resident_bytes(mf.path) >= mf.reserved_position - synced)


def test_the_writer_asks_for_the_next_window_while_half_a_window_of_populated_pages_is_ahead(
        tmp_path, backend):
    fs = Recording()
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        # The first file of a new store is made and populated before any put.
        path = os.path.join(store.commitlog.mfq.store_path, f"{0:020d}")
        testing.wait_until(lambda: os.path.exists(path) and testing.resident_bytes(path) >= WINDOW)
        acks = []
        while len(store.commitlog.mfq.files) < 2:
            r = store.put_message(Message("TopicA", b"p" * 30000))
            assert r.ok
            acks.append(r)
            mf = store.commitlog.mfq.files[-1]
            testing.wait_until(lambda mf=mf: settled(mf))
            if mf.reserved_position < mf.file_size:
                ahead = mf.reserved_position - mf.wrote_position
                # At least half a window populated ahead; bounded to LEAD_WINDOWS windows
                # (the lead grows for a writer as fast as the allocator's answers, as this
                # one, which waits for each).
                assert WINDOW // 2 <= ahead <= LEAD_WINDOWS * WINDOW + 2 * 4096, (mf, ahead)
                assert mf.refill_position > mf.wrote_position
                assert WINDOW // 2 <= mf.reserved_position - mf.refill_position <= ahead
        # Paced like this, the writer never reserved anything itself.
        assert fs.reservers and set(fs.reservers) <= BACKGROUND
        assert len(acks) > 2 * (2 << 20) // WINDOW
    finally:
        store.shutdown()


class SlowPopulate(Recording):
    """Every populate of the CommitLog takes at least 20 ms, as on a loaded machine or a disk
    whose page cache is throttled: a fast writer then outruns a half-window lead."""

    def __init__(self):
        super().__init__()
        self.done = 0
        self.slow = True

    def prefault(self, mm, start=0, length=None, chunk=1 << 20, from_end=False):
        if self.slow:
            time.sleep(0.02)
        try:
            return super().prefault(mm, start, length, chunk, from_end)
        finally:
            self.done += 1


def test_the_lead_grows_for_a_writer_faster_than_the_populates_and_stays_bounded(
        tmp_path, backend):
    fs = SlowPopulate()
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        leads = []
        files = 1
        # 30 KB puts back to back fill a 2 MiB file in a few ms, asking for windows that
        # the allocator populates long after: it measures how late it was. After each file,
        # the writer lets it catch up with one request, so the measurement is taken.
        while len(store.commitlog.mfq.files) < 6:
            assert store.put_message(Message("TopicA", b"g" * 30000)).ok
            mf = store.commitlog.mfq.files[-1]
            leads.append(mf.refill_lead)
            if len(store.commitlog.mfq.files) > files:
                files = len(store.commitlog.mfq.files)
                done = fs.done
                testing.wait_until(lambda done=done: fs.done > done)
            # Whatever the writer's pace, at most LEAD_WINDOWS windows are reserved (and
            # populated) ahead of the end of its last put.
            assert mf.reserved_position - mf.wrote_position <= LEAD_WINDOWS * WINDOW + 4096
        assert max(leads) > WINDOW // 2
        assert max(leads) <= LEAD_WINDOWS * WINDOW - WINDOW // 4
        # Once populates are quick again the allocator keeps a grown lead populated ahead.
        fs.slow = False
        assert store.put_message(Message("TopicA", b"g" * 30000)).ok
        mf = store.commitlog.mfq.files[-1]
        testing.wait_until(lambda: settled(mf))
        if mf.reserved_position < mf.file_size:
            assert mf.reserved_position - mf.wrote_position > WINDOW // 2
    finally:
        store.shutdown()


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc/self/smaps")
def test_the_file_being_written_has_no_readahead_and_the_file_it_leaves_gets_it_back(
        tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend, config=config())
    try:
        while len(store.commitlog.mfq.files) < 2:
            assert store.put_message(Message("TopicA", b"h" * 30000)).ok
        first, second = store.commitlog.mfq.files[:2]
        # "rr": MADV_RANDOM. A page the writer reaches before the allocator populated it
        # costs the writer that page alone, not a readahead window zero-filled in the put.
        # Waited for: while the allocator populates, it maps the file a second time, with
        # readahead, for the populate alone.
        testing.wait_until(
            lambda: [("rr" in f) for f in testing.mapping_flags(second.path)] == [True])
        # Given back on the allocator's thread (a madvise waits for the mmap lock).
        testing.wait_until(
            lambda: [("rr" in f) for f in testing.mapping_flags(first.path)] == [False])
    finally:
        store.shutdown()


def test_a_loaded_file_gets_its_window_populated_ahead_of_its_write_position(tmp_path,
                                                                             backend):
    root = tmp_path / "s"
    store = testing.open_store(root, backend, config=config())
    for _ in range(100):
        assert store.put_message(Message("TopicA", b"q" * 3000)).ok
    store.shutdown()
    fs = Recording()
    store = testing.open_store(root, backend, config=config(), fs=fs)
    try:
        mf = store.commitlog.mfq.files[-1]
        wrote = mf.wrote_position
        assert 0 < wrote < mf.file_size
        testing.wait_until(lambda: mf.reserved_position >= wrote + WINDOW)
        first = wrote - wrote % 4096
        testing.wait_until(lambda: testing.resident_bytes(mf.path) >= mf.reserved_position - first)
        assert mf.refill_position == mf.reserved_position - WINDOW // 2
        assert set(fs.reservers) <= BACKGROUND
    finally:
        store.shutdown()


def test_a_store_whose_last_file_is_full_prepares_the_next_one_at_start(tmp_path, backend):
    root = tmp_path / "s"
    store = testing.open_store(root, backend, config=config())
    while len(store.commitlog.mfq.files) < 2:
        assert store.put_message(Message("TopicA", b"r" * 30000)).ok
    store.shutdown()
    # The message that rolled over is lost with its file: the first file, full, is last.
    second = os.path.join(store.commitlog.mfq.store_path, f"{2 << 20:020d}")
    os.remove(second)
    store = testing.open_store(root, backend, config=config())
    try:
        assert store.commitlog.mfq.files[-1].is_full
        testing.wait_until(lambda: os.path.exists(second) and
                   testing.resident_bytes(second) >= WINDOW)
        assert store.put_message(Message("TopicA", b"next")).ok
        assert store.commitlog.mfq.files[-1].path == second
    finally:
        store.shutdown()


class SlowCreate(FileSystem):
    """The first creation of `path` waits for `go` (set by the test), once `creating` says
    it began; every creation of a CommitLog file is recorded."""

    def __init__(self, path):
        self.path = path
        self.creating = threading.Event()
        self.go = threading.Event()
        self.created = []

    def create_sized(self, path, size, preallocate=False):
        self.created.append(path)
        if path == self.path and not self.creating.is_set():
            self.creating.set()
            self.go.wait(30)
        return super().create_sized(path, size, preallocate)


def test_a_file_a_writer_is_creating_is_not_made_again_by_a_want_meanwhile(tmp_path, backend):
    """A slave's HA client starts before CommitLog.start, which wants the file after a full
    last one: the client may be creating that file for its first frame meanwhile. Made twice,
    the allocator's copy counted as prepared but never used, and shutdown deleted the file
    the CommitLog was writing."""
    file_size = config().mapped_file_size_commit_log
    path = str(tmp_path / "s" / "commitlog" / f"{5 * file_size:020d}")
    fs = SlowCreate(path)
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        mfq = store.commitlog.mfq
        allocator = store.commitlog.allocator
        assert mfq.path_to_create(5 * file_size) == path
        taken = []
        writer = threading.Thread(target=lambda: taken.append(
            allocator.take(path, 6 * mfq.file_size)))
        writer.start()
        assert fs.creating.wait(30)
        allocator.want(path)                      # what CommitLog.start asks at that moment
        # The allocator thread takes up the want (wakeup) while the writer's creation waits.
        # It clears _wanted and sets _making (were it to make the file) under one lock, so
        # both None means it is done with this want.
        def done():
            with allocator._lock:
                return allocator._wanted is None and allocator._making is None
        testing.wait_until(done, 10, "the allocator to take up the want")
        fs.go.set()
        writer.join(30)
        assert taken and taken[0].path == path
        assert fs.created.count(path) == 1, fs.created
    finally:
        store.shutdown()
    assert os.path.exists(path)
    taken[0].destroy()


def test_a_slave_prepares_no_first_file_since_the_master_names_it(tmp_path, backend):
    master = testing.open_store(tmp_path / "m", backend, config=config())
    slave = testing.open_store(tmp_path / "sl", backend,
                               config=config(broker_role=BrokerRole.SLAVE))
    try:
        testing.wait_until(lambda: os.listdir(master.commitlog.mfq.store_path))
        time.sleep(0.2)
        assert not os.path.exists(slave.commitlog.mfq.store_path) or \
            os.listdir(slave.commitlog.mfq.store_path) == []
    finally:
        master.shutdown()
        slave.shutdown()


def test_puts_go_on_while_every_populate_is_stuck(tmp_path, backend):
    """No lock a put needs is held across a populate: with every populate blocked, puts cross
    refill_position and reserved_position (reserving themselves) and roll files, creating
    them since the allocator cannot."""
    fs = Recording()
    fs.hold = threading.Event()
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        # The allocator is stuck in its first populate before the first put.
        testing.wait_until(fs.populating.is_set, what="a populate to start")
        done = []

        def put():
            for i in range(1500):
                done.append(store.put_message(Message("TopicA", b"%06d" % i + b"s" * 2000)))
        t = threading.Thread(target=put)
        t.start()
        t.join(60)
        assert not t.is_alive()
        assert all(r.ok for r in done) and len(done) == 1500
        assert len(store.commitlog.mfq.files) >= 2
        # The allocator being stuck, reservations went on without it: by its reserving
        # thread, or by the writer when it got there first (this one puts back to back).
        assert set(fs.reservers) - {ALLOCATOR}
        fs.hold.set()
        # The file the writer made itself meanwhile gets a window populated ahead of its
        # writer too, once the allocator runs again.
        mf = store.commitlog.mfq.files[-1]
        testing.wait_until(lambda: settled(mf))
        assert mf.reserved_position - mf.wrote_position >= WINDOW // 2
    finally:
        fs.hold.set()
        store.shutdown()


def test_a_writer_gets_its_windows_reserved_ahead_while_the_allocator_is_stuck_populating(
        tmp_path, backend):
    """Past the dirty budget one populate can take a second: the writer's next windows are
    still reserved ahead of it meanwhile, by the reserving thread, so the writer never
    reserves (a fallocate that may wait on the disk) inside its puts."""
    fs = Recording()
    fs.hold = threading.Event()
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        testing.wait_until(fs.populating.is_set, what="a populate to start")
        assert store.put_message(Message("TopicA", b"first")).ok
        mf = store.commitlog.mfq.files[-1]
        testing.wait_until(lambda: mf.refill_position > mf.wrote_position,
                           what="the first window reserved")
        asked = len(fs.reservers)
        windows = 0

        def put():
            nonlocal windows
            while mf.wrote_position < mf.file_size * 3 // 4:
                reserved = mf.reserved_position
                assert store.put_message(Message("TopicA", b"w" * 3000)).ok
                if mf.refill_position == mf.reserved_position < mf.file_size:
                    # The writer asked for its next window: reserved without the allocator.
                    testing.wait_until(lambda: mf.refill_position < mf.reserved_position,
                                       what="the next window reserved")
                windows += mf.reserved_position > reserved
        writer = threading.Thread(target=put, name="writer")
        writer.start()
        writer.join(60)
        assert not writer.is_alive()
        assert windows >= 3 and len(store.commitlog.mfq.files) == 1
        assert fs.reservers[asked:] and set(fs.reservers[asked:]) == {RESERVER}
    finally:
        fs.hold.set()
        store.shutdown()


class StuckPastFirstStep(Recording):
    """Holds, until `release` is set, any reservation in the CommitLog's second file that
    reaches past its first `step` bytes (`stuck` is set meanwhile)."""

    def __init__(self, step):
        super().__init__()
        self.step = step
        self.stuck = threading.Event()
        self.release = threading.Event()

    def reserve(self, path, offset, length):
        if path.endswith(f"{2 << 20:020d}") and offset + length > self.step:
            self.stuck.set()
            self.release.wait(60)
        return super().reserve(path, offset, length)


def test_a_writer_rolling_into_a_file_being_reserved_ahead_waits_for_one_step_not_the_window(
        tmp_path, backend, monkeypatch):
    """The next file's first window is reserved ahead a step at a time, each published before
    the next, so a writer rolling into the file while a step is stuck on the disk (a
    fallocate behind writeback) writes below what the steps before reserved, without
    waiting on the file's reserve lock."""
    step = 64 * KiB
    monkeypatch.setattr(MappedFile, "RESERVE_STEP", step)
    fs = StuckPastFirstStep(step)
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        first = store.commitlog.mfq
        allocator = store.commitlog.allocator
        nxt = os.path.join(first.store_path, f"{2 << 20:020d}")
        acks = []
        while not fs.stuck.is_set() and (not first.files or first.files[-1].wrote_position
                                         <= (2 << 20) - 64 * KiB):
            r = store.put_message(Message("TopicA", b"%06d" % len(acks) + b"r" * 2000))
            assert r.ok
            acks.append(r)
        assert len(first.files) == 1
        # The reserving thread or the allocator reserves the next file's first window ahead
        # once the file is made and this one is reserved to its end: which of them, and
        # when, depends on how the threads were scheduled. Asked here as they ask it, should
        # neither have yet (it then waits behind theirs for the lock).
        testing.wait_until(lambda: fs.stuck.is_set() or nxt in allocator._ready,
                           what="the next file made ahead")
        if not fs.stuck.is_set():
            threading.Thread(target=allocator._ready[nxt].reserve_ahead, args=(0,),
                             daemon=True).start()
        testing.wait_until(fs.stuck.is_set, what="the next file's second step")

        def roll():
            while len(first.files) < 2 or first.files[-1].wrote_position < step // 2:
                r = store.put_message(Message("TopicA", b"%06d" % len(acks) + b"r" * 2000))
                assert r.ok
                acks.append(r)
        writer = threading.Thread(target=roll, name="writer")
        writer.start()
        writer.join(20)
        # Done in the new file while the step ahead was still stuck.
        done_while_stuck = not writer.is_alive()
        fs.release.set()
        writer.join(60)
        assert done_while_stuck and not writer.is_alive()
        assert first.files[-1].path == nxt
    finally:
        fs.release.set()
        store.shutdown()
    again = testing.open_store(tmp_path / "s", backend, config=config())
    try:
        got = [m.body[:6] for m in again.iter_messages()]
        assert got == [b"%06d" % i for i in range(len(acks))]
    finally:
        again.shutdown()


class FullAfter(FileSystem):
    """Reserves `steps` times, then answers ENOSPC."""

    def __init__(self, steps):
        self.steps = steps
        self.calls = []

    def reserve(self, path, offset, length):
        self.calls.append((offset, length))
        if len(self.calls) > self.steps:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return super().reserve(path, offset, length)


def stepped_file(tmp_path, backend, monkeypatch, fs, window_steps):
    """A 1 MiB file on `fs` reserving a 64 KiB RESERVE_STEP at a time, with a window of
    `window_steps` steps and a lead of one; returns (file, step)."""
    step = 64 * KiB
    monkeypatch.setattr(MappedFile, "RESERVE_STEP", step)
    mf = MappedFile(str(tmp_path / f"{0:020d}"), 1 << 20, backend, fs,
                    reserve_window=window_steps * step)
    mf.refill_lead = step
    return mf, step


def test_a_window_reserved_ahead_that_the_disk_refuses_partway_keeps_the_steps_before(
        tmp_path, backend, monkeypatch):
    fs = FullAfter(2)
    mf, step = stepped_file(tmp_path, backend, monkeypatch, fs, 5)
    try:
        assert mf.reserve_ahead(0) is None          # a log line; the writer meets it later
        assert fs.calls == [(0, step), (step, step), (2 * step, step)]
        # The two steps the disk gave stay reserved, and the writer writes below them
        # without reserving; it asks again at refill_position, which did not move.
        assert (mf.reserved_position, mf.refill_position) == (2 * step, 0)
        fs.steps = len(fs.calls) + 10
        assert mf.reserve(2 * step) == (2 * step, 2 * step)
        assert len(fs.calls) == 3
        # Once there is room again, the window is taken a step at a time and published
        # as one window, its lead below its end.
        assert mf.reserve_ahead(step) == 2 * step
        assert fs.calls[3:] == [(2 * step, step), (3 * step, step), (4 * step, step),
                                (5 * step, step)]
        assert (mf.reserved_position, mf.refill_position) == (6 * step, 5 * step)
    finally:
        mf.close()


def test_blocks_held_past_the_window_make_the_next_window_a_publish_without_a_fallocate(
        tmp_path, backend, monkeypatch):
    fs = FullAfter(100)
    mf, step = stepped_file(tmp_path, backend, monkeypatch, fs, 2)
    try:
        assert mf.reserve_ahead(0) == 0
        assert (mf.reserved_position, mf.refill_position, mf.blocks_position) == \
            (2 * step, step, 2 * step)
        del fs.calls[:]
        # A step per call, three steps past the reserved end, and then nothing more.
        assert [mf.reserve_blocks_ahead(3 * step) for _ in range(4)] == \
            [True, True, False, False]
        assert fs.calls == [(2 * step, step), (3 * step, step), (4 * step, step)]
        # Blocks only: the window and the writer's next request stay where they were.
        assert (mf.reserved_position, mf.refill_position, mf.blocks_position) == \
            (2 * step, step, 5 * step)
        # The writer's next window lies below the blocks held: published, no fallocate.
        assert mf.reserve(3 * step) == (2 * step, 5 * step)
        assert (mf.refill_position, len(fs.calls)) == (4 * step, 3)
        # A window reaching past them takes only what they do not cover.
        assert mf.reserve_ahead(4 * step) == 5 * step
        assert fs.calls[3:] == [(5 * step, step)]
        assert mf.blocks_position == mf.reserved_position == 6 * step
        # A truncation forgets them: nothing is known to be reserved past the data.
        mf.reserve_blocks_ahead(2 * step)
        mf.set_positions(step)
        assert mf.blocks_position == mf.reserved_position == step
    finally:
        mf.close()


class HeldPast(FileSystem):
    """Holds every reservation ending past `past` until `release` is set (`held` is set
    meanwhile); `cut()`, when set, runs inside the held call first."""

    def __init__(self):
        self.past = 1 << 62
        self.cut = None
        self.held = threading.Event()
        self.release = threading.Event()

    def reserve(self, path, offset, length):
        if offset + length > self.past:
            self.held.set()
            if self.cut is not None:
                self.cut()
            self.release.wait(30)
        return super().reserve(path, offset, length)


def test_a_writer_publishing_below_the_blocks_held_never_waits_for_a_step_stuck_on_the_disk(
        tmp_path, backend, monkeypatch):
    """A fallocate can wait 50-150 ms behind writeback: the step ahead runs without the
    reserve lock, so a writer whose window lies below the blocks already held goes on."""
    fs = HeldPast()
    mf, step = stepped_file(tmp_path, backend, monkeypatch, fs, 2)
    fs.past = 5 * step
    try:
        mf.reserve_ahead(0)
        while mf.reserve_blocks_ahead(3 * step):
            pass
        assert mf.blocks_position == 5 * step
        stuck = threading.Thread(target=mf.reserve_blocks_ahead, args=(5 * step,))
        stuck.start()
        assert fs.held.wait(10)
        t0 = time.monotonic()
        assert mf.reserve(3 * step) == (2 * step, 5 * step)
        assert time.monotonic() - t0 < 5 and stuck.is_alive()
        fs.release.set()
        stuck.join(10)
        assert mf.blocks_position == 6 * step
    finally:
        fs.release.set()
        mf.close()


def test_a_step_ahead_that_a_truncation_overtakes_publishes_nothing(tmp_path, backend,
                                                                      monkeypatch):
    fs = HeldPast()
    mf, step = stepped_file(tmp_path, backend, monkeypatch, fs, 2)
    fs.past = 2 * step
    fs.cut = lambda: mf.set_positions(step // 2)
    fs.release.set()
    try:
        mf.reserve_ahead(0)
        assert mf.reserve_blocks_ahead(4 * step) is False
        assert mf.blocks_position == mf.reserved_position == step // 2
    finally:
        mf.close()


def test_a_fast_writer_gets_blocks_held_past_its_window_and_reserves_nothing_itself_there(
        tmp_path, backend):
    """The reserving thread holds blocks for what the writer writes in BLOCKS_LEAD_S at its
    measured rate, past the populated window, and bounded; a writer that catches up with
    its window below them publishes the next one without a fallocate of its own there.
    (Its window is sized by its rate: one reaching past the blocks held, with the
    reserving thread behind on a busy host, allocates only what lies past them.)"""
    fs = Recording()
    window = 1 << 20
    store = testing.open_store(tmp_path / "s", backend, fs=fs, config=config(
        mapped_file_size_commit_log=64 << 20, commit_log_reserve_window=window))
    batch = [Message("TopicA", b"%06d" % i + b"f" * 10_000) for i in range(10)]

    def put():
        r = store.put_messages(batch)
        assert r.ok and r.count == len(batch)
    try:
        put()
        mf = store.commitlog.mfq.files[-1]
        while mf.blocks_position - mf.reserved_position < MappedFile.RESERVE_STEP:
            assert mf.wrote_position < 40 << 20, "no blocks held past the window"
            put()
            assert mf.blocks_position - mf.reserved_position <= BLOCK_WINDOWS * window
        asked, held = len(fs.reserves), mf.blocks_position
        while mf.wrote_position < held - 2 * window:
            put()
        assert store.commitlog.mfq.files == [mf]
        assert [(offset, length) for name, offset, length in fs.reserves[asked:]
                if name == "MainThread" and offset < held] == []
    finally:
        store.shutdown()


def test_a_disk_that_fills_under_blocks_held_ahead_refuses_puts_cleanly_and_keeps_the_acked(
        tmp_path, backend, caplog):
    """The writer goes on into the blocks held ahead, then is refused with the disk's
    reason; the reserving thread asks the disk again only once the writer moved on."""
    fs = Recording()
    window = 1 << 20
    cfg = config(mapped_file_size_commit_log=64 << 20, commit_log_reserve_window=window)
    store = testing.open_store(tmp_path / "s", backend, fs=fs, config=cfg)
    batch = [Message("TopicA", b"%06d" % i + b"d" * 10_000) for i in range(10)]
    acked = 0
    try:
        mf = None
        while mf is None or mf.blocks_position - mf.reserved_position < MappedFile.RESERVE_STEP:
            r = store.put_messages(batch)
            assert r.ok
            acked += r.count
            mf = store.commitlog.mfq.files[-1]
            assert mf.wrote_position < 40 << 20, "no blocks held past the window"
        caplog.set_level(logging.INFO, logger="rocketstore.services.allocate")
        fs.full = True
        while True:
            r = store.put_messages(batch)
            acked += r.count
            if not r.ok:
                break
        assert r.status == PutMessageStatus.SERVICE_NOT_AVAILABLE and "disk full" in r.reason
        time.sleep(0.3)
        # Asked again only where the blocks held moved on: no loop against a full disk.
        refused = [m for m in caplog.messages if "could not hold blocks ahead" in m]
        assert len(refused) <= 2
    finally:
        store.shutdown()
    again = testing.open_store(tmp_path / "s", backend, config=cfg)
    try:
        assert sum(1 for _ in again.iter_messages()) == acked
    finally:
        again.shutdown()


def test_a_quiet_writer_holds_no_blocks_past_its_window(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend, config=config(
        mapped_file_size_commit_log=64 << 20, commit_log_reserve_window=1 << 20))
    try:
        for i in range(40):
            assert store.put_message(Message("TopicA", b"q" * 60_000)).ok
            time.sleep(0.02)
        mf = store.commitlog.mfq.files[-1]
        time.sleep(0.2)
        assert mf.blocks_position == mf.reserved_position
    finally:
        store.shutdown()


def test_the_next_file_is_made_while_the_writers_requests_keep_the_allocator_busy(tmp_path,
                                                                                 backend):
    """Under sustained writes on 2 cores the allocator is always behind: a request of the
    writer's is always waiting when it finishes one. The next file it was asked to prepare is
    still made, between requests; the writer made 7-10 files a minute itself at its rolls
    (each with a 64 MiB reservation inside the put) when it came only once none waited."""
    fs = SlowPopulate()
    allocator = AllocateMappedFileService(2 << 20, backend, fs, prefault=True,
                                          reserve_window=WINDOW)
    allocator.start()
    stop = threading.Event()
    try:
        first = allocator.take(str(tmp_path / f"{0:020d}"), 2 << 20)
        nxt = str(tmp_path / f"{2 << 20:020d}")

        def ask():
            # More requests than 20 ms populates can serve: never none waiting.
            end = 0
            while not stop.is_set():
                end = min(end + 4096, first.file_size)
                allocator.populate(first, end, end)
                time.sleep(0.002)
        asker = threading.Thread(target=ask, name="writer")
        asker.start()
        testing.wait_until(lambda: nxt in allocator._ready, timeout=10,
                           what="the next file made while requests keep coming")
    finally:
        stop.set()
        allocator.shutdown()
    asker.join()
    assert not os.path.exists(nxt)      # prepared and never taken: removed at shutdown
    first.destroy()


def test_a_disk_full_for_the_background_refill_refuses_only_the_put_past_the_reserved_end(
        tmp_path, backend):
    fs = Recording()
    root = tmp_path / "s"
    store = testing.open_store(root, backend, config=config(), fs=fs)
    try:
        acks = []
        for i in range(20):
            r = store.put_message(Message("TopicA", b"%06d" % i + b"f" * 3000))
            assert r.ok
            acks.append(r)
        mf = store.commitlog.mfq.files[-1]
        testing.wait_until(lambda: settled(mf))
        fs.full = True
        reserved = mf.reserved_position
        asked = len(fs.reservers)
        while True:
            r = store.put_message(Message("TopicA", b"%06d" % len(acks) + b"f" * 3000))
            if not r.ok:
                break
            acks.append(r)
        # Every put that fit the blocks reserved before the disk filled was taken; the
        # refill the allocator failed to reserve cost nothing but a log line.
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "disk full" in r.reason
        # The next put would have ended past the reserved end; the allocator tried first.
        assert acks[-1].commit_log_offset + 2 * acks[-1].wrote_bytes + 8 > reserved
        assert mf.reserved_position == reserved
        testing.wait_until(lambda: BACKGROUND & set(fs.reservers[asked:]))
        fs.full = False
        assert not store.clean_commitlog_service.is_space_full()
        r = store.put_message(Message("TopicA", b"%06d" % len(acks) + b"after"))
        assert r.ok
        acks.append(r)
    finally:
        store.shutdown()
    again = testing.open_store(root, backend, config=config())
    try:
        got = [m.body[:6] for m in again.iter_messages()]
        assert got == [b"%06d" % i for i in range(len(acks))]
    finally:
        again.shutdown()


def test_without_prefault_the_writer_reserves_and_nothing_is_populated(tmp_path, backend):
    fs = Recording()
    store = testing.open_store(tmp_path / "s", backend,
                               config=config(prefault_next_file=False), fs=fs)
    try:
        for _ in range(200):
            assert store.put_message(Message("TopicA", b"n" * 3000)).ok
        mf = store.commitlog.mfq.files[0]
        assert mf.refill_position == mf.reserved_position
        assert not BACKGROUND & set(fs.reservers)
    finally:
        store.shutdown()


def _keyed(n, body=b"k" * 100):
    return [Message("TopicA", body, keys=f"key-{i}", queue_id=0) for i in range(n)]


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc/self/smaps")
def test_queue_and_index_files_being_written_bring_in_their_pages_without_readahead(
        tmp_path, backend):
    # RocketMQ's sizes: a 6 MB queue file and a 420 MB index file, larger than a readahead
    # window. The writer's first touch of a page brings in that page (and the reserved window
    # a queue populates), never a readahead window of zeros: on a disk with read_ahead_kb
    # 8192 one fault zero-filled a whole queue file, or 8 MiB of an index file, in the put.
    cfg = config(mapped_file_size_consume_queue=300_000 * 20, max_hash_slot_num=5_000_000,
                 max_index_num=20_000_000)
    store = testing.open_store(tmp_path / "s", backend, config=cfg)
    try:
        assert store.put_messages(_keyed(64)).ok
        testing.wait_dispatched(store)
        cq = store.find_consume_queue("TopicA", 0).mfq.files[-1]
        assert 0 < testing.cached_bytes(cq.path) <= cq.reserved_position
        index = store.index_service.index_file_list[-1]
        # The header, the slots of 64 keys and one page of entries, not 8 MiB: each in the
        # page or the large folio (IndexFile) that holds it.
        cached = testing.cached_bytes(index.path)     # before the slots are read here
        unit = max(4096, index.mf.reserve_align)
        header, slots, entries = index.arrays()
        used = (F.INDEX_HEADER_SIZE + np.flatnonzero(slots) * F.INDEX_SLOT_SIZE) // unit
        first_entries = index.table_end // unit, (index.table_end + 65 * 20) // unit
        held = len(set(used.tolist()) | {0, *first_entries})
        del header, slots, entries
        assert 0 < cached <= held * unit
        assert [("rr" in f) for f in testing.mapping_flags(index.path)] == [True]
    finally:
        store.shutdown()


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc/self/smaps")
def test_the_queue_file_being_written_has_no_readahead_and_the_file_it_leaves_gets_it_back(
        tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend, config=config())
    try:
        while len(store.find_consume_queue("TopicA", 0).mfq.files) < 2:
            assert store.put_message(Message("TopicA", b"u", queue_id=0)).ok
            testing.wait_dispatched(store)
        first, second = store.find_consume_queue("TopicA", 0).mfq.files[:2]
        assert [("rr" in f) for f in testing.mapping_flags(second.path)] == [True]
        # Given back on the populate service's thread when it made the next file ahead.
        testing.wait_until(
            lambda: [("rr" in f) for f in testing.mapping_flags(first.path)] == [False])
    finally:
        store.shutdown()


class PopulatedThrough(Recording):
    """Records every mapping the CommitLog's allocator populates, in order."""

    def __init__(self):
        super().__init__()
        self.mappings = []

    def prefault(self, mm, start=0, length=None, chunk=1 << 20, from_end=False):
        if threading.current_thread().name == ALLOCATOR:
            self.mappings.append(mm)
        return super().prefault(mm, start, length, chunk, from_end)


class PopulatedFromEnd(FileSystem):
    """Records (mapping, from_end) for each populate the allocator's thread makes."""

    def __init__(self):
        self.calls = []

    def prefault(self, mm, start=0, length=None, chunk=1 << 20, from_end=False):
        if threading.current_thread().name == ALLOCATOR:
            self.calls.append((mm, from_end))
        return super().prefault(mm, start, length, chunk, from_end)


def test_the_allocator_populates_the_writers_windows_from_their_end_and_files_ahead_forward(
        tmp_path, backend):
    # From the end, so that a writer catching up with a populate meets it once instead of
    # waiting on each folio it locks (FileSystem.prefault); a file prepared ahead has no
    # writer to meet.
    fs = PopulatedFromEnd()
    allocator = AllocateMappedFileService(2 << 20, backend, fs, prefault=True,
                                          reserve_window=WINDOW)
    allocator.start()
    try:
        path = str(tmp_path / f"{0:020d}")
        first = allocator.take(path, 2 << 20)          # the writer's file; the next is wanted
        # The writer heads to the end of its file: windows asked for all the way, and then
        # the file prepared ahead gets its first window.
        for end in range(WINDOW // 2, first.file_size + 1, WINDOW // 2):
            allocator.populate(first, end)
        testing.wait_until(lambda: any(mm is not first.mm and not back
                                       for mm, back in fs.calls),
                           timeout=10, what="the file prepared ahead populated")
        calls = [(mm is first.mm, back) for mm, back in fs.calls]
        assert (True, True) in calls                # the writer's file, from the end
        assert (True, False) not in calls
        assert (False, True) not in calls           # the file prepared ahead, forward
    finally:
        allocator.shutdown()
    first.destroy()


class _RecordedMmap(mmap.mmap):
    """An mmap.mmap that records where each madvise call starts."""

    def madvise(self, option, start=0, length=None):
        self.starts.append(start)
        return super().madvise(option, start, length)


@pytest.mark.parametrize("from_end", [False, True], ids=["forward", "from_end"])
def test_a_populate_of_an_mmap_goes_a_chunk_at_a_time_in_its_order_and_covers_the_range(
        tmp_path, from_end):
    size, chunk = 8 << 20, 1 << 20
    length = (5 << 20) + 3 * mmap.PAGESIZE
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.truncate(size)
    with open(path, "r+b") as f:
        mm = _RecordedMmap(f.fileno(), size)
    mm.starts = []
    try:
        FileSystem().prefault(mm, mmap.PAGESIZE, length, chunk, from_end=from_end)
        forward = list(range(mmap.PAGESIZE, mmap.PAGESIZE + length, chunk))
        assert mm.starts == (forward[::-1] if from_end else forward)
        assert os.stat(path).st_blocks * 512 == length
    finally:
        mm.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc/self/smaps")
@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH])
def test_the_allocator_populates_the_writers_mapping_and_maps_no_other(tmp_path, backend, flush):
    # No second mapping with readahead (whose read-around reaches past the reserved end):
    # see the test below.
    fs = PopulatedThrough()
    store = testing.open_store(tmp_path / "s", backend, config=config(flush_disk_type=flush),
                               fs=fs)
    try:
        while len(store.commitlog.mfq.files) < 2:
            assert store.put_message(Message("TopicA", b"r" * 30000)).ok
        files = store.commitlog.mfq.files
        testing.wait_until(lambda: all(len(testing.mapping_flags(f.path)) == 1 for f in files))
        writers = [f.mm for f in files]
        assert fs.mappings
        assert [mm for mm in fs.mappings if not any(mm is w for w in writers)] == []
    finally:
        store.shutdown()


def test_an_async_flush_store_brings_no_page_past_the_reserved_end_into_the_page_cache(
        tmp_path, backend):
    # A page cached past reserved_position can be part of a large folio that also holds
    # reserved pages (XFS; read-around readahead makes them): the writer's first write to
    # the folio then makes the file system allocate all of it, past the reserved end, and
    # on a full disk that fault is SIGBUS instead of ENOSPC at reserve. So the allocator's
    # populate may fill the page cache only inside the reserved range.
    store = testing.open_store(tmp_path / "s", backend,
                               config=config(mapped_file_size_commit_log=64 << 20,
                                             flush_disk_type=FlushDiskType.ASYNC_FLUSH))
    try:
        for _ in range(8):
            assert store.put_message(Message("TopicA", b"r" * 30000)).ok
        mf = store.commitlog.mfq.files[-1]
        testing.wait_until(lambda: settled(mf))
        assert mf.reserved_position < mf.file_size
        assert testing.cached_bytes(mf.path) <= mf.reserved_position
    finally:
        store.shutdown()


class FolioRecording(FileSystem):
    """Large folios of FOLIO bytes (1 MiB, so a test's files stay small); records the end of
    each CommitLog reservation and the mappings advised to take large folios."""

    FOLIO = 1 << 20

    def __init__(self):
        self.ends = []
        self.large = set()

    def large_folio_size(self):
        return self.FOLIO

    def advise_hugepage(self, mm):
        self.large.add(id(mm))
        return super().advise_hugepage(mm)

    def reserve(self, path, offset, length):
        if os.sep + "commitlog" + os.sep in path:
            self.ends.append(offset + length)
        return super().reserve(path, offset, length)


def test_commitlog_files_populated_in_large_folios_are_reserved_to_whole_folios(tmp_path,
                                                                                backend):
    """A write into a large folio allocates all of its blocks: a reserved end inside one would
    let a write below it allocate past it (SIGBUS on a full disk; test_full_disk.py has the
    real one). Every end the store reserves to falls on a whole folio or the file's end."""
    fs = FolioRecording()
    size = 8 << 20
    cfg = config(mapped_file_size_commit_log=size, commit_log_reserve_window=4 * fs.FOLIO)
    store = testing.open_store(tmp_path / "s", backend, config=cfg, fs=fs)
    try:
        while len(store.commitlog.mfq.files) < 3:
            assert store.put_message(Message("TopicA", b"f" * 3000)).ok
        files = store.commitlog.mfq.files
        assert all(id(mf.mm) in fs.large and mf.reserve_align == fs.FOLIO for mf in files)
        assert len(fs.ends) > 3
        assert all(end % fs.FOLIO == 0 or end % size == 0 for end in fs.ends), fs.ends
    finally:
        store.shutdown()


def test_a_step_reserved_in_a_file_given_large_folios_ends_on_a_whole_folio(tmp_path, backend):
    fs = FolioRecording()
    mf = MappedFile(str(tmp_path / f"{0:020d}"), 8 * fs.FOLIO, backend, fs)
    try:
        # In pages: exactly to the end asked for.
        assert mf.reserve_step(1000) == 1000
        mf.use_large_folios(fs.FOLIO)       # reserved to the next whole folio first
        assert mf.reserved_position == fs.FOLIO
        # A folio straddling the reserved end would allocate past it when written.
        assert mf.reserve_step(fs.FOLIO + 1000) == 2 * fs.FOLIO
    finally:
        mf.close()


def test_a_sync_flush_commitlog_keeps_4k_pages_so_a_group_commit_writes_only_its_pages(
        tmp_path, backend):
    """The page cache writes a folio back whole: in 2 MiB folios each group commit of a few
    KiB wrote the writer's whole folio (16 threads of single puts wrote 8.4 GB to the disk
    for 16 MB of records, and each sync took 3.5x as long). SYNC_FLUSH files keep pages,
    whatever the window; ASYNC_FLUSH's periodic flushes cover whole folios and keep them."""
    fs = FolioRecording()
    size = 8 << 20
    cfg = config(mapped_file_size_commit_log=size, commit_log_reserve_window=4 * fs.FOLIO,
                 flush_disk_type=FlushDiskType.SYNC_FLUSH)
    store = testing.open_store(tmp_path / "s", backend, config=cfg, fs=fs)
    try:
        while len(store.commitlog.mfq.files) < 2:
            assert store.put_message(Message("TopicA", b"f" * 3000)).ok
        assert not fs.large
        assert all(mf.reserve_align == 4096 for mf in store.commitlog.mfq.files)
    finally:
        store.shutdown()


def test_a_window_smaller_than_four_folios_keeps_4k_pages(tmp_path, backend):
    """Rounding a small window's end up to whole folios would reserve far more than it:
    such files keep page-sized reservations and no large folios."""
    fs = FolioRecording()
    store = testing.open_store(tmp_path / "s", backend, config=config(), fs=fs)
    try:
        assert store.put_message(Message("TopicA", b"f" * 3000)).ok
        mf = store.commitlog.mfq.files[-1]
        assert mf.reserve_align == 4096 and id(mf.mm) not in fs.large
    finally:
        store.shutdown()


def test_a_file_given_large_folios_reserves_first_to_the_next_whole_folio(tmp_path, backend):
    fs = FolioRecording()
    mf = MappedFile(str(tmp_path / "00000000000000000000"), 4 << 20, backend, fs)
    try:
        mf.reserve(5000)                      # page-granular: 8 KiB
        assert mf.reserved_position == 8192
        assert mf.use_large_folios(fs.FOLIO)
        assert mf.reserved_position == fs.FOLIO and mf.refill_position == fs.FOLIO
        mf.reserve(fs.FOLIO + 1)
        assert mf.reserved_position == 2 * fs.FOLIO
    finally:
        mf.close()


def test_a_periodic_flush_leaves_the_large_folio_the_writer_is_filling(tmp_path, backend):
    """Syncing any page of a large folio write-protects all of it, and the writer's next
    append to it then waited behind the folio's write-back. A periodic flush (least pages > 0)
    stops at the folio boundary below the writer while something lies before it; a writer
    still in the folio it was in at the last flush is synced to its page, as 4 KiB files
    are; a thorough flush takes everything."""
    fs = FolioRecording()
    folio = fs.FOLIO
    mf = MappedFile(str(tmp_path / "00000000000000000000"), 4 * folio, backend, fs)
    try:
        mf.use_large_folios(folio)

        def write_to(pos):
            mf.reserve(pos)
            start = mf.wrote_position
            mf.mm[start:pos] = b"w" * (pos - start)
            mf.wrote_position = mf.committed_position = pos

        write_to(2 * folio + folio // 2)
        assert mf.flush(4) == 2 * folio
        write_to(2 * folio + 3 * folio // 4 + 100)
        assert mf.flush(4) == 2 * folio + 3 * folio // 4
        write_to(3 * folio + 4096 * 5 + 7)
        assert mf.flush(4) == 3 * folio
        assert mf.flush(0) == 3 * folio + 4096 * 5 + 7
    finally:
        mf.close()
