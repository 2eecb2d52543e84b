# SPDX-License-Identifier: Apache-2.0
"""CommitLog below the facade: records at their offsets with their queue offsets, the blank
record that ends a full file, a slave's appends, and the refusal after stop_puts."""
import struct

import pytest

from rocketstore import Message, PutMessageStatus, testing
from rocketstore import format as F
from rocketstore.commitlog import CommitLog
from rocketstore.errors import StoreClosedError
from rocketstore.fs import DEFAULT

FILE = 4096


def _clock():
    t = iter(range(1_700_000_000_000, 1_800_000_000_000))
    return lambda: next(t)


@pytest.fixture
def log(tmp_path, backend):
    cl = CommitLog(str(tmp_path), testing.small_config(mapped_file_size_commit_log=FILE),
                   backend, DEFAULT)
    cl.mfq.root = str(tmp_path)
    cl.load()
    cl.start()
    yield cl
    cl.shutdown()
    cl.close()


def _put(cl, clock, body=b"x" * 100, topic="T", queue_id=0):
    r = cl.put_message(Message(topic, body, queue_id=queue_id), clock)
    assert r.status is PutMessageStatus.PUT_OK
    return r


def test_records_follow_each_other_with_per_queue_offsets(log):
    clock = _clock()
    a = _put(log, clock, queue_id=0)
    b = _put(log, clock, queue_id=1)
    c = _put(log, clock, queue_id=0)
    assert (a.commit_log_offset, b.commit_log_offset, c.commit_log_offset) == \
        (0, a.wrote_bytes, a.wrote_bytes + b.wrote_bytes)
    assert (a.queue_offset, b.queue_offset, c.queue_offset) == (0, 0, 1)
    raw = log.get_message_bytes(c.commit_log_offset)
    assert len(raw) == c.wrote_bytes
    assert struct.unpack_from(">q", raw, F.POS_QUEUEOFFSET)[0] == 1
    assert struct.unpack_from(">q", raw, F.POS_PHYSICALOFFSET)[0] == c.commit_log_offset
    assert log.pickup_store_timestamp(c.commit_log_offset, c.wrote_bytes) == c.store_timestamp
    assert log.max_offset == c.commit_log_offset + c.wrote_bytes


def test_a_record_that_does_not_fit_leaves_a_blank_and_opens_the_next_file(log):
    clock = _clock()
    results = [_put(log, clock) for _ in range(FILE // 200 + 20)]
    rolled = next(r for r in results if r.commit_log_offset >= FILE)
    assert rolled.commit_log_offset == FILE
    before = [r for r in results if r.commit_log_offset < FILE][-1]
    end = before.commit_log_offset + before.wrote_bytes
    blank = log.get_data(end, 8)
    assert struct.unpack(">ii", blank) == (FILE - end, F.BLANK_MAGIC_CODE)
    assert FILE - end < rolled.wrote_bytes + F.END_FILE_MIN_BLANK_LENGTH
    assert log.roll_next_file(end) == FILE


def test_a_slave_appends_only_where_its_log_ends(log):
    record = bytes(64)
    assert log.append_data(100, record) is False          # an empty log starts at a boundary
    assert log.append_data(0, record) is True
    assert log.append_data(0, record) is False            # not where it ends now
    assert log.append_data(64, record + record) is True
    assert log.max_offset == 192
    assert log.append_data(192, bytes(FILE)) is False     # past its file's end: never split


def test_after_stop_puts_a_put_is_refused_and_nothing_is_written(log):
    clock = _clock()
    _put(log, clock)
    end = log.max_offset
    log.stop_puts()
    with pytest.raises(StoreClosedError):
        log.put_message(Message("T", b"late"), clock)
    assert log.append_data(end, bytes(8)) is False
    with pytest.raises(StoreClosedError):            # the schedule service's batch put
        log.put_encoded(bytes(64), [64], [0], ["T"], clock)
    assert log.max_offset == end


def test_reads_past_the_written_end_return_none(log):
    r = _put(log, _clock())
    assert log.get_data(r.commit_log_offset + r.wrote_bytes, 1) is None
    assert log.get_message_bytes(r.commit_log_offset + r.wrote_bytes) is None
    assert log.get_data(FILE * 5, 4) is None


def test_truncate_to_drops_later_files_zeroes_the_tail_and_moves_every_position(log):
    data = bytes(range(1, 256)) * 2                    # no zero byte: the tail is visible
    for start in range(0, 2 * FILE + 256, 256):
        assert log.append_data(start, data[:256])
    assert len(log.mfq.files) == 3
    cut = FILE + 100
    log.truncate_to(cut)
    mfq = log.mfq
    assert log.max_offset == cut
    assert mfq.flushed_where == mfq.committed_where == cut
    assert [f.file_from_offset for f in mfq.files] == [0, FILE]
    last = mfq.files[-1]
    assert last.wrote_position == last.committed_position == last.flushed_position == 100
    assert bytes(last.mm[100:256]) == bytes(156)       # the dropped tail reads as zeros
    assert bytes(log.get_data(FILE, 100)) == data[:100]
    assert log.append_data(cut, b"next")               # appends go on where it was cut


def test_reset_queue_offsets_takes_a_copy_the_next_put_numbers_from(log):
    table = {("T", 0): 7, ("T", 1): 0}
    log.reset_queue_offsets(table)
    table[("T", 0)] = 99                               # the caller's dict is not shared
    assert _put(log, _clock(), queue_id=0).queue_offset == 7
    assert _put(log, _clock(), queue_id=1).queue_offset == 0


def test_held_slice_holds_the_file_while_the_view_is_used_and_ends_at_readable_bytes(log):
    data = bytes(range(200))
    assert log.append_data(0, data)
    mf = log.mfq.files[0]
    before = mf.ref_count
    with log.held_slice(50, 1000) as view:
        assert bytes(view) == data[50:]                # cut at the read position
        assert mf.ref_count == before + 1
    assert mf.ref_count == before
    with log.held_slice(10, 5) as view:
        assert bytes(view) == data[10:15]
    with log.held_slice(200, 10) as view:              # nothing readable there yet
        assert view is None
    with log.held_slice(5 * FILE, 10) as view:         # no such file
        assert view is None
    assert mf.ref_count == before


# ---- recovery and the readers over a CommitLog alone (no MessageStore) -----------------------
def _reopened(tmp_path, backend, cl):
    """A second CommitLog over the same files, loaded as a store's load() leaves it."""
    cl.shutdown()
    cl.close()
    again = CommitLog(str(tmp_path), testing.small_config(mapped_file_size_commit_log=FILE),
                      backend, DEFAULT)
    again.mfq.root = str(tmp_path)
    again.load()
    return again


def test_normal_recovery_cuts_a_torn_tail_given_only_the_log_and_its_parts(
        tmp_path, backend, log):
    # Recovery takes the parts MessageStore hands it (RecoveryParts), not the store: here a
    # CommitLog with no queues, checkpoint or dispatchers is enough to find the torn record.
    from rocketstore import recovery
    clock = _clock()
    last = [_put(log, clock) for _ in range(3)][-1]
    end = last.commit_log_offset + last.wrote_bytes
    mf = log.mfq.files[-1]
    mf.mm[end - mf.file_from_offset:end - mf.file_from_offset + 40] = b"\x01" * 40
    cl = _reopened(tmp_path, backend, log)
    try:
        parts = recovery.RecoveryParts(cl, list, None, backend, cl.config, [], True)
        report = recovery.RecoveryReport(normal=True)
        assert recovery.recover_normally(parts, -1, report) == end
        assert (report.records, report.truncated_bytes) == (3, 40)
        recovery.recover_topic_queue_table(cl, [])
        assert cl.max_offset == end
        assert bytes(cl.mfq.files[-1].mm[end - mf.file_from_offset:][:40]) == bytes(40)
    finally:
        cl.close()


def test_iter_messages_and_message_at_read_a_commitlog_alone(backend, log):
    from rocketstore import query, read_path
    clock = _clock()
    puts = [_put(log, clock, body=b"m%d" % i, queue_id=i % 2) for i in range(5)]
    rp = read_path.make_read_path(backend)
    got = list(read_path.iter_messages(log, backend, rp.decode_rows))
    assert [(m.body, m.commit_log_offset, m.queue_offset) for m in got] == \
        [(b"m%d" % i, r.commit_log_offset, r.queue_offset) for i, r in enumerate(puts)]
    assert query.message_at(log, backend, puts[3].commit_log_offset).body == b"m3"
    assert query.message_at(log, backend, puts[3].commit_log_offset + 1) is None
