# SPDX-License-Identifier: Apache-2.0
"""The ConsumeQueue dispatcher (doc/02 §2) and the statistics service below the facade, each
built from the collaborators it uses: a real CommitLog, ConsumeQueues and reput, small
doubles for the rest, and no MessageStore."""
import json
import os

import pytest

from rocketstore import testing
from rocketstore.clock import StepClock
from rocketstore.commitlog import CommitLog
from rocketstore.consume_queue import ConsumeQueue, DirtyQueues
from rocketstore.dispatch import ConsumeQueueDispatcher
from rocketstore.fs import FileSystem
from rocketstore.message import Message
from rocketstore.running_flags import RunningFlags
from rocketstore.services.reput import ReputMessageService
from rocketstore.stats import PUT_TIMES, RUNTIME_FILE, StoreStatsService, new_put_cells


class Arrivals:
    waiting = False

    def notify(self, rows):
        pass


class Checkpoint:
    logics_msg_timestamp = 0
    physic_msg_timestamp = 0


class DeletedTopics:
    """topic_delete.DeletedTopicManager's face to the dispatcher: topic bytes -> the CommitLog
    offset it was deleted at."""

    def __init__(self):
        self.offsets_raw = {}


class Queues:
    """The store's find_consume_queue_raw: a queue per (topic, queue id), made on first use."""

    def __init__(self, root, backend, fs, dirty):
        self.root, self.backend, self.fs, self.dirty = root, backend, fs, dirty
        self.made = {}

    def __call__(self, topic, queue_id):
        key = (bytes(topic).decode(), queue_id)
        cq = self.made.get(key)
        if cq is None:
            cq = self.made[key] = ConsumeQueue(self.root, key[0], queue_id, 20 * 50,
                                               self.backend, self.fs)
            cq.dirty = self.dirty
        return cq


@pytest.fixture
def parts(tmp_path, backend):
    fs = FileSystem()
    log = CommitLog(str(tmp_path), testing.small_config(), backend, fs)
    log.load()
    dirty = DirtyQueues()
    queues = Queues(str(tmp_path), backend, fs, dirty)
    yield log, queues, dirty
    for cq in queues.made.values():
        cq.close()
    log.stop_puts()
    log.close()


def dispatch(log, backend, dispatcher):
    reput = ReputMessageService(log, backend, [dispatcher], 0, arrivals=Arrivals(),
                                running_flags=RunningFlags())
    reput.do_reput()
    assert reput.behind() == 0


def test_each_record_gets_a_unit_in_its_queue_and_the_queue_is_marked_dirty(parts, backend):
    log, queues, dirty = parts
    clock = StepClock(start=5000)
    puts = [log.put_message(Message(f"T{i % 2}", b"m%d" % i, queue_id=i % 3), clock)
            for i in range(12)]
    checkpoint = Checkpoint()
    dispatcher = ConsumeQueueDispatcher(queues, DeletedTopics(), (1000,), backend,
                                        checkpoint=checkpoint)
    dispatch(log, backend, dispatcher)
    for (topic, qid), cq in queues.made.items():
        mine = [r for i, r in enumerate(puts) if (f"T{i % 2}", i % 3) == (topic, qid)]
        units = cq.units(0, 100)
        assert units["offset"].tolist() == [r.commit_log_offset for r in mine]
        assert units["size"].tolist() == [r.wrote_bytes for r in mine]
        del units
        assert cq in dirty
    assert len(queues.made) == 6
    assert checkpoint.logics_msg_timestamp == puts[-1].store_timestamp
    assert checkpoint.physic_msg_timestamp == 0        # a master's flusher moves that one


def test_a_deleted_topics_records_from_before_its_deletion_get_no_unit(parts, backend):
    log, queues, dirty = parts
    clock = StepClock()
    kept = [log.put_message(Message("Kept", b"x", queue_id=0), clock)]
    before = [log.put_message(Message("Gone", b"old", queue_id=0), clock) for _ in range(3)]
    deleted = DeletedTopics()
    deleted.offsets_raw[b"Gone"] = log.max_offset     # deleted here
    after = [log.put_message(Message("Gone", b"new", queue_id=0), clock) for _ in range(2)]
    kept.append(log.put_message(Message("Kept", b"x", queue_id=0), clock))
    dispatcher = ConsumeQueueDispatcher(queues, deleted, (1000,), backend,
                                        checkpoint=Checkpoint())
    dispatch(log, backend, dispatcher)
    gone = queues(b"Gone", 0)
    units = gone.units(0, 10)
    # The records put after the deletion (the topic made again) have their units, at their
    # own queue offsets; the ones before it have none (what stands before is blank units).
    offsets = units["offset"].tolist()
    del units
    assert offsets[after[0].queue_offset:] == [r.commit_log_offset for r in after]
    assert not {r.commit_log_offset for r in before} & set(offsets)
    units = queues(b"Kept", 0).units(0, 10)
    assert units["offset"].tolist() == [r.commit_log_offset for r in kept]
    del units


def test_a_slaves_dispatch_moves_the_physical_timestamp_too(parts, backend):
    log, queues, dirty = parts
    last = [log.put_message(Message("T", b"x", queue_id=0), StepClock(start=777))][-1]
    checkpoint = Checkpoint()
    dispatcher = ConsumeQueueDispatcher(queues, DeletedTopics(), (1000,), backend,
                                        checkpoint=checkpoint, is_slave=True)
    dispatch(log, backend, dispatcher)
    assert checkpoint.logics_msg_timestamp == checkpoint.physic_msg_timestamp == \
        last.store_timestamp


def test_the_stats_service_samples_its_sources_and_publishes_the_runtime_file(tmp_path):
    cells = new_put_cells()
    totals = [0, 0, 0, 7]
    locks = []
    svc = StoreStatsService(str(tmp_path), cells, lambda: tuple(totals),
                            lambda lock_ms: locks.append(lock_ms) or {"k": "v"},
                            lock_time_mills=lambda: 42)
    for second in range(11):
        cells[PUT_TIMES] = 3 * second
        totals[:3] = [2 * second, second, 4 * second]
        svc.sample(now_ms=second * 1000)
    info = svc.runtime_info()
    assert info["putTps"].split(" ")[0] == "3.0"
    assert info["getFoundTps"].split(" ")[0] == "2.0"
    assert info["getMissTps"].split(" ")[0] == "1.0"
    assert info["getTransferedTps"].split(" ")[0] == "4.0"
    assert info["getMessageEntireTimeMax"] == "7"
    svc.publish()
    with open(os.path.join(tmp_path, RUNTIME_FILE), "rb") as f:
        doc = json.loads(f.read())
    assert doc["runtimeInfo"] == {"k": "v"} and locks == [42]
    svc.on_shutdown()
    assert not os.path.exists(os.path.join(tmp_path, RUNTIME_FILE))


def test_the_stats_service_never_calls_an_injected_clock_for_the_lock_time(tmp_path):
    # With no lock_time_mills (the store's clock is injected), the lock time is left out.
    locks = []
    svc = StoreStatsService(str(tmp_path), new_put_cells(), lambda: (0, 0, 0, 0),
                            lambda lock_ms: locks.append(lock_ms) or {})
    svc.publish()
    svc.on_shutdown()
    assert locks == [None]
