# SPDX-License-Identifier: Apache-2.0
"""ConsumeQueue below the facade: units written and read back across files, the filler of a
queue that starts late, redispatch, truncation, recovery and expiry (doc/02 §1)."""
import os
import struct

import numpy as np
import pytest

from rocketstore.consume_queue import ConsumeQueue, DirtyQueues
from rocketstore.format import CQ_POS_SIZE, CQ_STORE_UNIT_SIZE as UNIT, I32
from rocketstore.fs import DEFAULT
from rocketstore.mapped_file import CqMappedFile

PER_FILE = 8                     # units per file: small, so files roll


def _queue(root, backend, per_file=PER_FILE, writable=True):
    cq = ConsumeQueue(str(root), "T", 0, per_file * UNIT, backend, DEFAULT, writable)
    cq.load()
    return cq


def _put(cq, first_queue_offset, count, first_phy=0, size=100):
    offsets = np.arange(count, dtype=np.int64) * size + first_phy
    sizes = np.full(count, size, dtype=np.int32)
    tags = np.arange(count, dtype=np.int64) + 1000
    cq.put_units(offsets, sizes, tags, first_queue_offset)
    return offsets


def _files(root):
    return sorted(p.name for p in (root / "consumequeue" / "T" / "0").iterdir())


def test_the_file_size_is_rounded_up_to_whole_units(tmp_path, backend):
    cq = ConsumeQueue(str(tmp_path), "T", 0, 7 * UNIT + 1, backend, DEFAULT)
    assert cq.file_size == 8 * UNIT


def test_units_written_across_files_read_back_in_order(tmp_path, backend):
    cq = _queue(tmp_path, backend)
    offsets = _put(cq, 0, 20)
    assert _files(tmp_path) == [f"{i * PER_FILE * UNIT:020d}" for i in range(3)]
    assert cq.max_offset_in_queue == 20 and cq.min_offset_in_queue == 0
    units = cq.units(0, 50)
    assert list(units["offset"]) == list(offsets)
    assert list(units["tags_code"]) == list(range(1000, 1020))
    assert list(cq.units(6, 4)["offset"]) == list(offsets[6:10])     # across a file end
    assert cq.last_offset() == offsets[-1] + 100
    cq.close()


def test_a_unit_is_20_big_endian_bytes_offset_size_tags_code(tmp_path, backend):
    cq = _queue(tmp_path, backend)
    cq.put_unit(123456789, 77, -5, 0)
    cq.flush()
    cq.close()
    raw = (tmp_path / "consumequeue" / "T" / "0" / f"{0:020d}").read_bytes()
    assert raw[:UNIT] == struct.pack(">qiq", 123456789, 77, -5)


def test_a_queue_that_starts_late_begins_with_filler_units(tmp_path, backend):
    cq = _queue(tmp_path, backend)
    _put(cq, 11, 2)             # queue offset 11: the second file, 3 units in
    assert _files(tmp_path) == [f"{PER_FILE * UNIT:020d}"]
    assert cq.min_offset_in_queue == 11 and cq.max_offset_in_queue == 13
    cq.flush()
    raw = (tmp_path / "consumequeue" / "T" / "0" / f"{PER_FILE * UNIT:020d}").read_bytes()
    filler = struct.pack(">qiq", 0, 0x7FFFFFFF, 0)
    assert raw[:3 * UNIT] == filler * 3
    assert list(cq.units(11, 2)["size"]) == [100, 100]
    cq.close()


def test_units_already_present_are_skipped_on_redispatch(tmp_path, backend):
    cq = _queue(tmp_path, backend)
    _put(cq, 0, 5)
    before = cq.units(0, 5).copy()
    _put(cq, 0, 7)              # the first five again, then two new ones
    assert cq.max_offset_in_queue == 7
    assert (cq.units(0, 5) == before).all()
    cq.put_unit(0, 100, 0, 0)   # an old record: ignored
    assert cq.max_offset_in_queue == 7
    cq.close()


def test_truncation_drops_the_units_whose_record_does_not_end_below_a_commit_log_offset(
        tmp_path, backend):
    cq = _queue(tmp_path, backend)
    _put(cq, 0, 20)             # records of 100 bytes at 0, 100, ..., 1900
    cq.truncate_dirty_logic_files(1050)
    # Units 0..9 point at records that end by 1000; unit 10's record [1000, 1100) was cut
    # in two by the cut (4.9.8 keeps that unit: it compares offsets alone).
    assert cq.max_offset_in_queue == 10
    assert cq.max_physic_offset == 1000
    assert _files(tmp_path) == [f"{i * PER_FILE * UNIT:020d}" for i in range(2)]
    _put(cq, 10, 3, first_phy=1000)              # the queue goes on from there
    assert list(cq.units(9, 4)["offset"]) == [900, 1000, 1100, 1200]
    cq.close()


def test_truncation_drops_a_unit_whose_damaged_size_reaches_past_the_commit_log(
        tmp_path, backend):
    cq = _queue(tmp_path, backend)
    _put(cq, 0, 12)             # records of 100 bytes at 0, ..., 1100: the log ends at 1200
    cq.flush()
    cq.close()
    last = tmp_path / "consumequeue" / "T" / "0" / f"{PER_FILE * UNIT:020d}"
    raw = bytearray(last.read_bytes())
    I32.pack_into(raw, 3 * UNIT + CQ_POS_SIZE, 100 | 1 << 26)     # unit 11's size, one bit off
    last.write_bytes(bytes(raw))
    cq = _queue(tmp_path, backend)
    cq.recover()
    assert cq.max_physic_offset == 1100 + (100 | 1 << 26)        # as 4.9.8 would leave it
    cq.truncate_dirty_logic_files(1200)
    # Dropped: reput starts at the queues' largest max physical offset, and from past the
    # log's end it would dispatch nothing put from then on.
    assert cq.max_offset_in_queue == 11 and cq.max_physic_offset == 1100
    cq.close()


def test_truncation_keeps_the_filler_units_a_late_queue_starts_with(tmp_path, backend):
    cq = _queue(tmp_path, backend)
    _put(cq, 11, 2)             # three filler units, then records at 0 and 100
    cq.truncate_dirty_logic_files(1000)
    assert cq.min_offset_in_queue == 11 and cq.max_offset_in_queue == 13
    assert cq.max_physic_offset == 200
    cq.truncate_dirty_logic_files(150)      # the second record, [100, 200), is cut
    assert cq.max_offset_in_queue == 12 and cq.max_physic_offset == 100
    cq.truncate_dirty_logic_files(50)       # and the first: fillers alone point at no record
    assert cq.max_offset_in_queue == 11 and cq.max_physic_offset == 50
    cq.close()


def test_recovery_stops_at_the_first_invalid_unit(tmp_path, backend):
    cq = _queue(tmp_path, backend)
    _put(cq, 0, 12)
    cq.flush()
    cq.close()
    second = tmp_path / "consumequeue" / "T" / "0" / f"{PER_FILE * UNIT:020d}"
    raw = bytearray(second.read_bytes())
    raw[UNIT:2 * UNIT] = bytes(UNIT)            # unit 9 torn to zeros; 10 and 11 follow it
    second.write_bytes(bytes(raw))
    cq = _queue(tmp_path, backend)
    cq.recover()
    assert cq.max_offset_in_queue == 9
    assert cq.max_physic_offset == 900
    cq.close()


def test_expiry_deletes_whole_files_below_the_commit_log_minimum_but_never_the_last(
        tmp_path, backend):
    cq = _queue(tmp_path, backend)
    _put(cq, 0, 20)
    assert cq.delete_expired_file(1000, now_ms=0) == 1       # file 0 (units 0..7) goes
    assert cq.min_offset_in_queue == 10                      # first unit at offset >= 1000
    assert cq.delete_expired_file(10**9, now_ms=0) == 1      # file 1 goes; the last stays
    assert len(_files(tmp_path)) == 1
    cq.close()


def test_a_first_file_a_reader_held_through_cleaning_does_not_hold_the_minimum_back(
        tmp_path, backend):
    """Found by tests/test_lifecycle_model.py (once in 300 lives): a queue's first file was
    held when cleaning came (a reader, the flusher), so it stayed that round, and the search
    for the minimum, which looked only in the first file, found nothing there and left the
    minimum at 0."""
    cq = _queue(tmp_path, backend)
    _put(cq, 0, 20)                                          # records 0..2000, 8 units a file
    first = cq.mfq.files[0]
    assert first.hold()
    try:
        cq.delete_expired_file(1000, now_ms=0)
        assert cq.mfq.files[0] is first                      # held: not deleted this round
        assert cq.min_offset_in_queue == 10
    finally:
        first.release()
    cq.close()


def test_a_queue_whose_every_unit_points_below_the_commit_log_minimum_is_empty_at_its_end(
        tmp_path, backend):
    """5.x's correctMinOffset: 4.9.8 kept the old minimum when the first file left held no
    unit at or above the CommitLog minimum, a queue offset below every file left, counting
    messages that are gone (found by tests/test_lifecycle_model.py)."""
    cq = _queue(tmp_path, backend)
    _put(cq, 0, 20)                                          # records 0..2000, 8 units a file
    cq.delete_expired_file(500, now_ms=0)
    assert cq.min_offset_in_queue == 5
    assert cq.delete_expired_file(5000, now_ms=0) == 2       # the last file stays
    assert (cq.min_offset_in_queue, cq.max_offset_in_queue) == (20, 20)
    assert cq.message_total_in_queue == 0
    _put(cq, 20, 1, first_phy=5000)                          # the queue goes on from its end
    assert (cq.min_offset_in_queue, cq.max_offset_in_queue) == (20, 21)
    cq.close()
    cq = _queue(tmp_path, backend)                           # as recoverTopicQueueTable does
    cq.recover()
    cq.correct_min_offset(5000)
    assert cq.min_offset_in_queue == 20
    cq.close()


def test_a_written_queue_is_marked_dirty_once_per_flush_round(tmp_path, backend):
    cq = _queue(tmp_path, backend)
    dirty = DirtyQueues()
    cq.dirty = dirty
    _put(cq, 0, 3)
    cq.put_unit(300, 100, 0, 3)
    assert cq in dirty and len(dirty) == 1
    assert dirty.take() == ({cq}, set())
    assert len(dirty) == 0
    cq.put_unit(400, 100, 0, 4)        # written after the take: marked again
    assert dirty.take() == ({cq}, set())
    cq.close()


def test_a_read_only_queue_writes_nothing_when_truncated(tmp_path, backend):
    cq = _queue(tmp_path, backend)
    _put(cq, 0, 12)
    cq.flush()
    cq.close()
    before = {n: (tmp_path / "consumequeue" / "T" / "0" / n).read_bytes()
              for n in _files(tmp_path)}
    ro = _queue(tmp_path, backend, writable=False)
    ro.recover()
    ro.truncate_dirty_logic_files(300)
    assert ro.max_offset_in_queue == 3
    ro.close()
    assert {n: (tmp_path / "consumequeue" / "T" / "0" / n).read_bytes()
            for n in _files(tmp_path)} == before


@pytest.mark.parametrize("start, count", [(0, 0), (25, 3), (19, 5)])
def test_reading_past_the_written_end_returns_what_is_there(tmp_path, backend, start, count):
    cq = _queue(tmp_path, backend)
    _put(cq, 0, 20)
    assert len(cq.units(start, count)) == max(0, min(start + count, 20) - start)
    cq.close()


def test_queue_files_lost_to_zeros_past_the_last_three_still_get_the_queue_cut_to_the_log(
        tmp_path, backend):
    # A power cut after the ConsumeQueue flusher synced units whose records the CommitLog
    # lost, with the queue's last three files never written back (zeros): recovery scans
    # only those three (as 4.9.8 does), found no valid unit, so it did not know how far the
    # queue points and never cut the units past the CommitLog's end. The queue kept offsets
    # for records that no longer exist, and new records came to lie where they point.
    from rocketstore import Message, testing
    root = tmp_path / "s"
    store = testing.open_store(root, backend)
    try:
        rs = [store.put_message(Message("T", b"m%03d" % i + bytes(100))) for i in range(800)]
        testing.wait_dispatched(store)
        keep_end = rs[300].commit_log_offset          # the log keeps records 0..299
        log_files = [f.path for f in store.commitlog.mfq.files]
        queue_files = [f.path for f in store.consume_queue_table["T"][0].mfq.files]
    finally:
        store.shutdown()
    size = testing.small_config().mapped_file_size_commit_log
    for path in log_files:                            # the lost CommitLog tail reads zeros
        start = int(os.path.basename(path))
        if start + size > keep_end:
            with open(path, "r+b") as f:
                f.seek(max(0, keep_end - start))
                f.write(bytes(start + size - max(start, keep_end)))
    assert len(queue_files) >= 6
    for path in queue_files[5:]:                      # units 500.. never written back
        with open(path, "r+b") as f:
            f.write(bytes(os.path.getsize(path)))
    open(root / "abort", "wb").close()
    store = testing.open_store(root, backend)
    try:
        testing.wait_dispatched(store)
        cq = store.consume_queue_table["T"][0]
        assert cq.max_offset_in_queue == 300
        got = store.get_message("g", "T", 0, 290, 32).messages
        assert [bytes(m.body[:4]) for m in got] == [b"m%03d" % i for i in range(290, 300)]
        r = store.put_message(Message("T", b"new"))
        assert r.queue_offset == 300                  # no gap, no offset reused
        assert [m.body for m in store.get_message("g", "T", 0, 300, 32).messages] == [b"new"]
    finally:
        store.shutdown()


def test_expiry_keeps_a_file_a_cut_made_the_last_while_the_round_ran(tmp_path, backend,
                                                                    monkeypatch):
    """Cleaning lists the queue's files without the dispatch lock a cut (reset_write_offset)
    holds: a cut landing after the list was taken deletes the last file and zeroes the tail
    of the one before, whose last unit then reads as offset 0, below any minimum. That file,
    now the last, still holds units the CommitLog keeps, and stays."""
    cq = _queue(tmp_path, backend)
    _put(cq, 0, 12)                     # file 0: records 0..700; file 1: 800..1100
    first = cq.mfq.files[0]
    cut = []
    original = CqMappedFile.is_available

    def is_available(self):
        if self is first and not cut:
            cut.append(True)
            cq.truncate_dirty_logic_files(500)      # the cut, while the round runs
        return original.fget(self)

    monkeypatch.setattr(CqMappedFile, "is_available", property(is_available))
    assert cq.delete_expired_file(300, now_ms=0) == 0
    monkeypatch.undo()
    assert cut and cq.mfq.files == [first]
    assert list(cq.units(0, 10)["offset"]) == [0, 100, 200, 300, 400]
    cq.close()


def test_correcting_the_minimum_of_a_queue_closed_meanwhile_raises_nothing(tmp_path, backend,
                                                                          monkeypatch):
    """A cleaning round corrects each queue's minimum without the locks delete_topic takes:
    a deletion closing the queue between the round finding its first file and searching it
    made the search raise ValueError (mmap closed) out of the round."""
    cq = _queue(tmp_path, backend)
    _put(cq, 0, 12)                     # records 0..1100
    closed = []
    original = CqMappedFile.read_position

    def read_position(self):
        if not closed:
            closed.append(True)
            cq.close()                  # delete_topic, while the round looks
        return original.fget(self)

    monkeypatch.setattr(CqMappedFile, "read_position", property(read_position))
    cq.correct_min_offset(500)
    assert closed
