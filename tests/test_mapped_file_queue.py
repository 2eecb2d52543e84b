# SPDX-License-Identifier: Apache-2.0
"""MappedFile and MappedFileQueue below the facade: segment names, finding the file of an
offset, growth, truncation, flushing, holding a file through its deletion, the segments
a load refuses or drops, and evicting the page cache behind the writer."""
import errno
import os
import resource
import threading

import pytest

from rocketstore import testing
from rocketstore.errors import StoreLoadError
from rocketstore.fs import DEFAULT, FileSystem
from rocketstore.mapped_file import MappedFile, offset_to_file_name
from rocketstore.mapped_file_queue import MappedFileQueue, drop_creating_leftovers

SIZE = 4096


def _queue(path, backend, writable=True, fs=DEFAULT, size=SIZE):
    q = MappedFileQueue(str(path), size, backend, fs, writable)
    q.root = str(path.parent)
    q.load()
    return q


def _fill(q, n_files):
    """Grow the queue to `n_files` files, each written to its end with one byte pattern."""
    size = q.file_size
    for i in range(n_files):
        mf = q.get_last_mapped_file(0)
        mf.reserve(size)
        mf.mm[0:size] = bytes([i + 1]) * size
        mf.wrote_position = mf.committed_position = size
    return q


def test_a_segment_is_named_by_its_first_offset_in_20_digits():
    assert offset_to_file_name(0) == "0" * 20
    assert offset_to_file_name(1073741824) == "00000000001073741824"


def test_files_are_created_at_whole_file_offsets_one_after_another(tmp_path, backend):
    q = _queue(tmp_path / "log", backend)
    first = q.get_last_mapped_file(start_offset=SIZE * 3 + 17)
    assert first.file_from_offset == SIZE * 3 and first.first_create_in_queue
    assert q.get_last_mapped_file(need_create=False) is first   # not full: the same file
    first.wrote_position = first.committed_position = SIZE
    second = q.get_last_mapped_file()
    assert second.file_from_offset == SIZE * 4 and not second.first_create_in_queue
    assert sorted(os.listdir(tmp_path / "log")) == [offset_to_file_name(SIZE * 3),
                                                     offset_to_file_name(SIZE * 4)]
    q.close()


@pytest.mark.parametrize("offset, expected", [
    (0, 0), (SIZE - 1, 0), (SIZE, 1), (3 * SIZE - 1, 2), (3 * SIZE, None), (-1, None)])
def test_the_file_of_an_offset_is_found_at_its_boundaries(tmp_path, backend, offset,
                                                          expected):
    q = _fill(_queue(tmp_path / "log", backend), 3)
    want = q.files[expected] if expected is not None else None
    assert q.find_by_offset(offset) is want
    assert q.find_by_offset(offset, return_first_on_not_found=True) is (want or q.files[0])
    q.close()


def test_truncation_deletes_later_files_and_zeroes_the_tail_of_the_kept_one(tmp_path, backend):
    q = _fill(_queue(tmp_path / "log", backend), 3)
    q.truncate_dirty_files(SIZE + 100)
    assert [f.file_from_offset for f in q.files] == [0, SIZE]
    assert q.get_max_offset() == SIZE + 100
    kept = q.files[1]
    assert bytes(kept.mm[:100]) == b"\x02" * 100
    assert bytes(kept.mm[100:SIZE]) == bytes(SIZE - 100)
    assert sorted(os.listdir(tmp_path / "log")) == [offset_to_file_name(0),
                                                     offset_to_file_name(SIZE)]
    q.close()


def test_flush_moves_the_flushed_offset_a_file_at_a_time(tmp_path, backend):
    q = _fill(_queue(tmp_path / "log", backend), 2)
    assert q.flush() is False and q.flushed_where == SIZE
    assert q.flush() is False and q.flushed_where == 2 * SIZE
    assert q.flush() is True                         # nothing left to flush
    q.close()


def test_a_flusher_round_flushes_every_complete_file_then_the_one_being_written(tmp_path,
                                                                               backend):
    # A flusher calling flush() once an interval fell a file an interval behind a burst
    # (found by tests/test_lifecycle_model.py: 32 KiB files stayed unsynced for seconds).
    q = _fill(_queue(tmp_path / "log", backend), 4)
    mf = q.get_last_mapped_file(0)
    mf.reserve(SIZE)
    mf.mm[0:100] = b"z" * 100
    mf.wrote_position = mf.committed_position = 100
    assert q.flush_round(1) is False and q.flushed_where == 4 * SIZE   # not the partial page
    assert q.flush_round(1) is True
    assert q.flush_round(0) is False and q.flushed_where == 4 * SIZE + 100
    assert q.flush_round(0) is True
    assert all(f.flushed_position == SIZE for f in q.files[:4])
    q.close()


def test_a_committer_round_commits_every_complete_write_buffer(tmp_path, backend):
    q = _fill(_queue(tmp_path / "log", backend), 3)
    for f in q.files:
        f.committed_position = 0            # written, as into write buffers, not committed
    assert q.commit_round(1) is False and q.committed_where == 3 * SIZE
    assert q.commit_round(1) is True
    q.close()


def test_a_periodic_flush_leaves_the_page_the_writer_is_filling_to_a_thorough_one(tmp_path,
                                                                                 backend):
    # Writing back the page being appended to would make the writer's next append fault on
    # it (doc/03 §2.3); a thorough flush (least pages 0) still takes every byte.
    page = 4096
    q = MappedFileQueue(str(tmp_path / "log"), 8 * page, backend, DEFAULT, True)
    q.root = str(tmp_path)
    q.load()
    mf = q.get_last_mapped_file(0)
    mf.reserve(8 * page)
    written = 5 * page + 100
    mf.mm[0:written] = b"x" * written
    mf.wrote_position = mf.committed_position = written
    assert q.flush(4) is False and q.flushed_where == 5 * page
    assert q.flush(4) is True and q.flushed_where == 5 * page   # under a page more: too few
    mf.mm[written:8 * page] = b"y" * (8 * page - written)
    mf.wrote_position = mf.committed_position = 6 * page
    assert q.flush(1) is False and q.flushed_where == 6 * page  # a boundary write: all of it
    mf.wrote_position = mf.committed_position = 6 * page + 1
    assert q.flush(0) is False and q.flushed_where == 6 * page + 1
    mf.wrote_position = mf.committed_position = 8 * page      # full: to its end
    assert q.flush(1) is False and q.flushed_where == 8 * page
    q.close()


# The pure backend's sync is fdatasync of the whole file, every page: only the backends that
# msync a range can leave the writer's page alone.
@pytest.mark.parametrize("backend_name",
                         [n for n in testing.backend_params() if n != "pure"])
def test_after_a_periodic_flush_the_writer_appends_to_its_page_without_a_fault(tmp_path,
                                                                               backend_name):
    # What leaving the writer's page unflushed buys: a page written back is write-protected
    # again, so the next append to it faults (and may wait while its I/O is submitted).
    backend = testing.load_backend(backend_name)
    page = 4096
    q = MappedFileQueue(str(tmp_path / "log"), 8 * page, backend, DEFAULT, True)
    q.root = str(tmp_path)
    q.load()
    mf = q.get_last_mapped_file(0)
    mf.reserve(8 * page)

    def append(end):
        """Write up to `end`; the page faults this thread took meanwhile."""
        data = b"x" * (end - mf.wrote_position)
        before = resource.getrusage(resource.RUSAGE_THREAD)
        mf.mm[mf.wrote_position:end] = data
        after = resource.getrusage(resource.RUSAGE_THREAD)
        mf.wrote_position = mf.committed_position = end
        return after.ru_minflt - before.ru_minflt + after.ru_majflt - before.ru_majflt

    append(3 * page + 100)
    assert q.flush(0) is False            # a thorough flush takes the writer's page too...
    if append(3 * page + 200) == 0:       # ...which must then fault to be written again
        pytest.skip("this file system leaves a page it synced writable")
    append(5 * page + 100)
    assert q.flush(1) is False and q.flushed_where == 5 * page
    assert append(5 * page + 200) == 0
    q.close()


def test_flush_skips_files_cleaning_removed_before_the_flusher_reached_them(tmp_path, backend):
    q = _fill(_queue(tmp_path / "log", backend), 3)
    q.delete_files(q.files[:2])
    q.flush()
    assert q.flushed_where == 3 * SIZE
    q.close()


def test_a_reload_sees_every_file_full_until_recovery_says_otherwise(tmp_path, backend):
    q = _fill(_queue(tmp_path / "log", backend), 2)
    q.flush()
    q.flush()
    q.close()
    again = _queue(tmp_path / "log", backend)
    assert [f.read_position for f in again.files] == [SIZE, SIZE]
    assert again.get_min_offset() == 0 and again.get_max_offset() == 2 * SIZE
    again.close()


def test_a_writable_load_refuses_segments_that_are_not_adjacent(tmp_path, backend):
    _fill(_queue(tmp_path / "log", backend), 3).close()
    os.remove(tmp_path / "log" / offset_to_file_name(SIZE))
    with pytest.raises(StoreLoadError, match="not adjacent"):
        _queue(tmp_path / "log", backend)
    reader = _queue(tmp_path / "log", backend, writable=False)   # a reader reads what is there
    assert [f.file_from_offset for f in reader.files] == [0, 2 * SIZE]
    reader.close()


def test_a_writable_load_deletes_never_written_segments_past_a_gap_and_keeps_the_rest(
        tmp_path, backend):
    """Files made ahead, all zeros, that a kill left past a deleted one: nothing is lost by
    deleting them, and the queue opens. One written segment past the gap keeps the refusal."""
    _fill(_queue(tmp_path / "log", backend), 2).close()
    for k in (3, 4):                               # made ahead, never written; 2 was deleted
        (tmp_path / "log" / offset_to_file_name(k * SIZE)).write_bytes(bytes(SIZE))
    q = _queue(tmp_path / "log", backend)
    assert [f.file_from_offset for f in q.files] == [0, SIZE]
    assert sorted(os.listdir(tmp_path / "log")) == [offset_to_file_name(k * SIZE)
                                                    for k in (0, 1)]
    q.close()
    (tmp_path / "log" / offset_to_file_name(3 * SIZE)).write_bytes(bytes(SIZE))
    (tmp_path / "log" / offset_to_file_name(4 * SIZE)).write_bytes(bytes(SIZE - 1) + b"x")
    with pytest.raises(StoreLoadError, match="not adjacent"):
        _queue(tmp_path / "log", backend)
    assert len(os.listdir(tmp_path / "log")) == 4   # nothing deleted


def test_a_writable_load_drops_an_empty_last_segment_a_crash_left(tmp_path, backend):
    _fill(_queue(tmp_path / "log", backend), 1).close()
    (tmp_path / "log" / offset_to_file_name(SIZE)).write_bytes(b"")
    q = _queue(tmp_path / "log", backend)
    assert [f.file_from_offset for f in q.files] == [0]
    assert not (tmp_path / "log" / offset_to_file_name(SIZE)).exists()
    q.close()


def test_a_segment_of_another_size_is_refused_naming_the_file(tmp_path, backend):
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / offset_to_file_name(0)).write_bytes(bytes(SIZE * 2))
    with pytest.raises(StoreLoadError, match="bytes but segments here are"):
        _queue(tmp_path / "log", backend)


def test_a_held_file_is_deleted_only_when_released_or_forced(tmp_path, backend):
    q = _fill(_queue(tmp_path / "log", backend), 3)
    first, second = q.files[0], q.files[1]
    assert first.hold()
    assert first.try_destroy(now_ms=0, interval_forcibly_ms=1000) is False   # a reader has it
    assert os.path.exists(first.path) and not first.hold()    # no new readers meanwhile
    first.release()
    assert first.try_destroy(now_ms=10, interval_forcibly_ms=1000) is True
    assert not os.path.exists(first.path)
    # A view still exported after the forced interval: the file goes, its pages stay for
    # the view (Python cannot unmap under it, unlike Java's cleaner).
    view = memoryview(second.mm)[10:30]
    assert second.try_destroy(now_ms=0, interval_forcibly_ms=1000) is False
    assert second.try_destroy(now_ms=1000, interval_forcibly_ms=1000) is True
    assert not os.path.exists(second.path)
    assert bytes(view) == b"\x02" * 20
    view.release()
    q.close()


def test_a_forced_destroy_waits_for_a_short_use_of_the_pages_then_unmaps(tmp_path, backend):
    # A cold read copies without the GIL and without hold() (read_cold); a forced destroy
    # landing in it once gave up the unmap at the first try and left the mapping behind,
    # readable by a batch that should have been told its file was deleted.
    q = _fill(_queue(tmp_path / "log", backend), 2)
    first = q.files[0]
    view = memoryview(first.mm)[:8]             # the short use: over in 50 ms
    timer = threading.Timer(0.05, view.release)
    timer.start()
    try:
        assert first.try_destroy(now_ms=0, interval_forcibly_ms=0) is True
    finally:
        timer.join()
    assert first.mm.closed and not os.path.exists(first.path)
    q.close()


def test_a_full_disk_fails_the_new_file_and_leaves_no_segment_behind(tmp_path, backend):
    fs = testing.FaultInjectingFileSystem()
    q = _queue(tmp_path / "log", backend, fs=fs)
    fs.fail("map", errno.ENOSPC)
    with pytest.raises(OSError):
        MappedFile(q.path_to_create(0), SIZE, backend, fs)
    assert os.listdir(tmp_path / "log") == []
    q.close()


def test_a_file_destroyed_while_a_view_pins_its_mapping_is_deleted_and_its_offset_starts_empty(
        tmp_path, backend):
    # The view outlives the destroy's wait, so the mapping stays; the file must still go, or
    # the next file made at its offset takes up its stale bytes.
    q = _fill(_queue(tmp_path / "q", backend), 2)
    second = q.files[1]
    view = memoryview(second.mm)
    try:
        assert second.destroy(0) is False           # not unmapped: the view holds it
        assert not os.path.exists(second.path)
        assert view[0] == 2                         # the view still reads its pages
    finally:
        view.release()
    q.files = q.files[:1]
    again = q.get_last_mapped_file(SIZE)
    assert again.file_from_offset == SIZE
    with open(again.path, "rb") as f:
        assert f.read() == bytes(SIZE)
    q.destroy()


def test_a_creating_file_renamed_by_a_live_writer_while_listed_is_passed_over(tmp_path):
    """A read-only open of a running store lists the directory while the writer creates a
    file: its `.creating` name may be gone (renamed into place) by the time it is read."""
    class RenamedMeanwhile(FileSystem):
        def holds_only_zeros(self, path, chunk=1 << 20):
            os.rename(path, path[:-len(".creating")])
            return super().holds_only_zeros(path, chunk)

    name = "20231114221320000.creating"
    (tmp_path / name).write_bytes(bytes(4096))
    (tmp_path / "notes.txt").write_bytes(b"x")
    kept = drop_creating_leftovers(RenamedMeanwhile(), str(tmp_path), [name, "notes.txt"],
                                   lambda base: base.isdigit(), writable=False)
    assert kept == ["notes.txt"]
    assert (tmp_path / "20231114221320000").exists()


@pytest.mark.parametrize("when", ["size", "map"])
def test_a_read_only_load_passes_over_a_file_cleaning_deleted_while_it_loads(tmp_path, backend,
                                                                              when):
    """A read-only open of a running store lists a queue's files while the writer's cleaning
    deletes its oldest: the file may be gone by the time its size is read, or it is mapped.
    The store then starts at the next file, as it does on disk; a writable load still fails."""
    class CleanedMeanwhile(FileSystem):
        def _clean(self, path):
            if os.path.basename(path) == offset_to_file_name(0) and os.path.exists(path):
                os.remove(path)

        def size(self, path):
            if when == "size":
                self._clean(path)
            return super().size(path)

        def map(self, path, size, writable=True, kernels=None):
            if when == "map":
                self._clean(path)
            return super().map(path, size, writable, kernels)

    for start in range(0, 3 * SIZE, SIZE):
        (tmp_path / offset_to_file_name(start)).write_bytes(bytes(SIZE))
    q = MappedFileQueue(str(tmp_path), SIZE, backend, CleanedMeanwhile(), writable=False)
    assert q.load()
    assert [f.file_from_offset for f in q.files] == [SIZE, 2 * SIZE]
    q.close()
    (tmp_path / offset_to_file_name(0)).write_bytes(bytes(SIZE))
    writer = MappedFileQueue(str(tmp_path), SIZE, backend, CleanedMeanwhile(), writable=True)
    with pytest.raises(FileNotFoundError):
        writer.load()


# ---- the page cache behind the writer (MessageStore's drop_cold_commit_log_cache) ------------
class Evicted(FileSystem):
    """Records the ranges evicted from the page cache, as (file name, start, length)."""

    def __init__(self):
        self.ranges = []

    def drop_cached_range(self, path, start, length):
        self.ranges.append((os.path.basename(path), start, length))
        super().drop_cached_range(path, start, length)


PAGE = 4096
FILE = 64 * PAGE


def test_each_range_leaves_the_page_cache_once_and_again_after_a_truncation(tmp_path, backend):
    fs = Evicted()
    q = _fill(_queue(tmp_path / "log", backend, fs=fs, size=FILE), 3)
    names = [os.path.basename(mf.path) for mf in q.files]
    try:
        q.drop_cache_below(-FILE)                     # a store younger than its window
        assert fs.ranges == []
        q.drop_cache_below(FILE + 3 * PAGE + 100)     # whole pages only
        assert fs.ranges == [(names[0], 0, FILE), (names[1], 0, 3 * PAGE)]
        fs.ranges.clear()
        q.drop_cache_below(FILE + 3 * PAGE + 200)     # nothing new on whole pages
        assert fs.ranges == []
        # A truncation back into the first file: what is written again there is evicted
        # when passed again, from the page holding the truncation point on.
        q.drop_cache_below(FILE // 2 + 10)
        assert fs.ranges == []
        q.drop_cache_below(2 * FILE + PAGE)
        assert fs.ranges == [(names[0], FILE // 2, FILE // 2), (names[1], 0, FILE),
                             (names[2], 0, PAGE)]
    finally:
        q.close()


def test_a_file_removed_before_its_eviction_is_passed_over(tmp_path, backend):
    fs = Evicted()
    q = _fill(_queue(tmp_path / "log", backend, fs=fs, size=FILE), 2)
    names = [os.path.basename(mf.path) for mf in q.files]
    try:
        os.unlink(q.files[0].path)
        q.drop_cache_below(2 * FILE)
        assert fs.ranges == [(names[0], 0, FILE), (names[1], 0, FILE)]
        fs.ranges.clear()
        q.drop_cache_below(2 * FILE)
        assert fs.ranges == []
    finally:
        q.close()
