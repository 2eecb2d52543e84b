# SPDX-License-Identifier: Apache-2.0
"""Services below the facade (doc/03 §2, §8), each given only the collaborators it uses: a
real CommitLog and small doubles for the rest, without a MessageStore."""
import threading

import pytest

from rocketstore import testing
from rocketstore.clock import StepClock
from rocketstore.commitlog import CommitLog
from rocketstore.config import BrokerRole
from rocketstore.fs import FileSystem
from rocketstore.message import Message
from rocketstore.running_flags import RunningFlags
from rocketstore.services.flush import CommitRealTimeService, FlushRealTimeService, SyncLatch
from rocketstore.services.reput import ReputMessageService


class Arrivals:
    """The consumer-arrival hook reput wakes: records what it was told."""

    def __init__(self):
        self.waiting = True
        self.notified = 0

    def notify(self, rows):
        self.notified += len(rows)


class Recorder:
    """A dispatcher that keeps (topic queue offset, physical offset) of each record."""

    def __init__(self):
        self.rows = []

    def dispatch_array(self, arr, buf):
        self.rows += [(int(r["queue_offset"]), int(r["phy_offset"])) for r in arr]


class Checkpoint:
    physic_msg_timestamp = 0


def make_commitlog(root, backend, role=BrokerRole.ASYNC_MASTER, **overrides):
    config = testing.small_config(broker_role=role, **overrides)
    log = CommitLog(str(root), config, backend, FileSystem())
    log.load()
    return config, log


@pytest.fixture
def closing():
    logs = []
    yield logs.append
    for log in logs:
        log.stop_puts()
        log.close()


def test_reput_dispatches_each_record_once_and_wakes_waiting_consumers(tmp_path, backend,
                                                                      closing):
    _, log = make_commitlog(tmp_path, backend)
    closing(log)
    clock = StepClock()
    ends = [log.put_message(Message(topic="T", queue_id=0, body=b"m%d" % i), clock)
            for i in range(5)]
    recorder, arrivals = Recorder(), Arrivals()
    reput = ReputMessageService(log, backend, [recorder], 0, arrivals=arrivals,
                                running_flags=RunningFlags())
    reput.do_reput()
    assert recorder.rows == [(r.queue_offset, r.commit_log_offset) for r in ends]
    assert reput.behind() == 0 and arrivals.notified == 5
    reput.do_reput()                                   # nothing new: nothing again
    assert len(recorder.rows) == 5


def test_reput_on_a_slave_hands_bytes_that_are_no_record_to_halt_replication(tmp_path, backend,
                                                                            closing):
    _, log = make_commitlog(tmp_path, backend, BrokerRole.SLAVE)
    closing(log)
    assert log.append_data(0, b"\x00\x00\x00\x40" + b"\xab" * 60)   # 64 bytes, bad magic
    reasons, recorder = [], Recorder()
    reput = ReputMessageService(log, backend, [recorder], 0, arrivals=Arrivals(),
                                running_flags=RunningFlags(), is_slave=True,
                                halt_replication=reasons.append)
    reput.do_reput()
    assert recorder.rows == [] and reput.reput_from_offset == 0
    assert reasons == ["corrupt record from the master at 0 (bad magic, length or CRC)"]


def test_reput_whose_dispatch_keeps_failing_marks_the_logic_queue_error(tmp_path, backend,
                                                                       closing, monkeypatch):
    _, log = make_commitlog(tmp_path, backend)
    closing(log)
    log.put_message(Message(topic="T", queue_id=0, body=b"x"), StepClock())

    class Full:
        def dispatch_array(self, arr, buf):
            raise OSError(28, "No space left on device")
    flags = RunningFlags()
    reput = ReputMessageService(log, backend, [Full()], 0, arrivals=Arrivals(),
                                running_flags=flags)
    monkeypatch.setattr(reput, "MAX_DISPATCH_FAILURES", 2)
    reput.stop()                                       # no 1 s pause between the attempts
    reput.do_reput()
    assert reput.failures == 1 and not flags.is_logics_queue_error()
    reput.do_reput()
    assert reput.failures == 2 and flags.is_logics_queue_error()
    assert reput.reput_from_offset == 0                # nothing counted as dispatched


def test_async_flush_syncs_what_was_put_and_moves_the_checkpoint_timestamp(tmp_path, backend,
                                                                          closing):
    config, log = make_commitlog(tmp_path, backend, flush_interval_commit_log=1)
    closing(log)
    log.put_message(Message(topic="T", queue_id=0, body=b"x"), StepClock(start=1234))
    checkpoint = Checkpoint()
    flusher = FlushRealTimeService(config, log.mfq, checkpoint,
                                   SyncLatch(RunningFlags(), checkpoint))
    flusher.run_once()
    assert log.mfq.flushed_where == log.max_offset
    assert checkpoint.physic_msg_timestamp == 1234


def test_the_committer_copies_write_buffers_to_the_files_and_wakes_the_flusher(tmp_path, backend,
                                                                              closing):
    config, log = make_commitlog(tmp_path, backend, transient_store_pool_enable=True,
                                 transient_store_pool_size=2, commit_interval_commit_log=1)
    closing(log)
    assert log.pool is not None
    log.put_message(Message(topic="T", queue_id=0, body=b"x"), StepClock())
    assert log.mfq.committed_where == 0                # in the write buffer only
    woken = []
    committer = CommitRealTimeService(config, log.mfq, woken.append)
    committer.run_once()
    assert log.mfq.committed_where == log.max_offset
    assert woken == [log.max_offset]          # the flusher is told how far the files reach


class _RecordingPwrites(FileSystem):
    """Records each pwrite (path, position, length) and each populate (the mapping's id);
    a pwrite can be made to fail once (`fail`) or to wait for `go` after saying it began."""

    def __init__(self):
        super().__init__()
        self.pwrites = []
        self.populated = set()
        self.fail = None
        self.go = None
        self.began = threading.Event()

    def pwrite(self, fd, data, pos, path):
        self.began.set()
        if self.go is not None:
            assert self.go.wait(10)
        if self.fail is not None:
            exc, self.fail = self.fail, None
            raise exc
        self.pwrites.append((path, pos, memoryview(data).nbytes))
        super().pwrite(fd, data, pos, path)

    def prefault(self, mm, start=0, length=None, chunk=1 << 20):
        self.populated.add(id(mm))
        return super().prefault(mm, start, length, chunk)


def _pooled_commitlog(root, backend, fs):
    config = testing.small_config(transient_store_pool_enable=True, transient_store_pool_size=2,
                                  commit_interval_commit_log=1, commit_commit_log_least_pages=0)
    log = CommitLog(str(root), config, backend, fs)
    log.load()
    return config, log


def test_a_pooled_file_is_committed_with_pwrite_and_its_mapping_is_never_populated(
        tmp_path, backend, closing):
    fs = _RecordingPwrites()
    config, log = _pooled_commitlog(tmp_path, backend, fs)
    closing(log)
    log.start()                         # the allocator: it reserves the pooled file ahead
    try:
        clock = StepClock()
        first = [log.put_message(Message(topic="T", queue_id=0, body=b"a%d" % i), clock)
                 for i in range(3)]
        mf = log.mfq.last_file
        assert mf.wbuf is not None
        committer = CommitRealTimeService(config, log.mfq, None)
        committer.run_once()
        middle = log.max_offset
        assert fs.pwrites == [(mf.path, 0, middle)]
        log.put_message(Message(topic="T", queue_id=0, body=b"b"), clock)
        end = log.mfq.get_max_wrote_position()
        committer.run_once()
        assert fs.pwrites[1:] == [(mf.path, middle, end - middle)]
        assert log.max_offset == end
        # Readers see the committed bytes through the mapping, as they were put.
        assert bytes(mf.mm[:log.max_offset]) == bytes(mf.wbuf[:log.max_offset])
        with open(mf.path, "rb") as f:
            assert f.read(log.max_offset) == bytes(mf.wbuf[:log.max_offset])
        assert all(r.status.name == "PUT_OK" for r in first)
        # The allocator reserved the pooled file's window but populated none of its pages
        # (the commit's pwrite fills the page cache itself).
        testing.wait_until(lambda: mf.reserved_position > mf.wrote_position)
        assert id(mf.mm) not in fs.populated
    finally:
        log.shutdown()


def test_a_commit_the_disk_refuses_keeps_the_bytes_for_the_next_commit(tmp_path, backend,
                                                                       closing):
    fs = _RecordingPwrites()
    config, log = _pooled_commitlog(tmp_path, backend, fs)
    closing(log)
    log.put_message(Message(topic="T", queue_id=0, body=b"kept"), StepClock())
    end = log.mfq.get_max_wrote_position()
    fs.fail = OSError(28, "No space left on device")
    with pytest.raises(OSError):
        log.mfq.commit(0)
    assert log.mfq.committed_where == 0             # nothing counts as committed
    CommitRealTimeService(config, log.mfq, None).run_once()
    assert log.mfq.committed_where == end
    mf = log.mfq.last_file
    with open(mf.path, "rb") as f:
        assert f.read(end) == bytes(mf.wbuf[:end])


def test_a_pooled_file_closed_during_a_commit_keeps_its_buffer_until_the_pwrite_ends(
        tmp_path, backend, closing):
    """The pwrite reads the buffer without the GIL: handed back to the pool meanwhile, it
    could be given to the next file and overwritten under it."""
    fs = _RecordingPwrites()
    config, log = _pooled_commitlog(tmp_path, backend, fs)
    closing(log)
    log.put_message(Message(topic="T", queue_id=0, body=b"x" * 100), StepClock())
    mf = log.mfq.last_file
    free_before = log.pool.available
    fs.go = threading.Event()
    committing = threading.Thread(target=log.mfq.commit, args=(0,))
    committing.start()
    assert fs.began.wait(10)
    closed = threading.Thread(target=mf.close)
    closed.start()
    closed.join(0.3)
    assert log.pool.available == free_before        # still the file's, under the pwrite
    fs.go.set()
    committing.join(10)
    closed.join(10)
    assert not committing.is_alive() and not closed.is_alive()
    assert log.pool.available == free_before + 1 and mf.wbuf is None
