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
    woken = threading.Event()
    committer = CommitRealTimeService(config, log.mfq, woken.set)
    committer.run_once()
    assert log.mfq.committed_where == log.max_offset and woken.is_set()
