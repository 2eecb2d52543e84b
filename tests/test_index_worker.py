# SPDX-License-Identifier: Apache-2.0
"""A batch put's index keys are put by the compiled backend's index worker (csrc/rs_index_worker.h,
kernels' IndexWorker) while the putting thread goes on. What must not change: a key is found as
soon as its put returned, the index files hold the same bytes as without the worker (and as the
pure backend's), a job the worker has not started is taken back by whoever needs the index,
a job the worker could not finish is finished by whoever settles it next, a failed finish is
tried again, the last job's files are let go of once puts pause, and a kill
loses no acknowledged key."""
import errno
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from rocketstore import Message, MessageStore, testing

from crashers.writer import crash_config, message

WRITER = os.path.join(os.path.dirname(__file__), "crashers", "writer.py")
BATCH = 100         # past NOGIL_DISPATCH_ROWS (32): a put this size hands its keys over


def _messages(n, start=0):
    return [Message(f"T{i % 3}", b"b%05d" % i, tags=f"t{i % 4}", keys=f"k{i} x{i % 7}",
                    queue_id=i % 4, born_timestamp=i) for i in range(start, start + n)]


def _index_bytes(root):
    d = root / "index"
    return {name: (d / name).read_bytes() for name in sorted(os.listdir(d))}


def _put_batches(store, msgs):
    for i in range(0, len(msgs), BATCH):
        r = store.put_messages(msgs[i:i + BATCH])
        assert r.ok, r.status


def _disable_worker(store):
    """The store's index worker stopped: its keys are put by the putting thread, as before."""
    idx = store.index_service
    idx.worker.close()
    idx.worker = None


def test_only_the_compiled_backend_has_a_worker_and_it_takes_a_batch_puts_keys(tmp_path):
    for name in testing.backend_params():
        store = testing.open_store(tmp_path / name, name)
        try:
            worker = store.index_service.worker
            assert (worker is not None) == (name == "cext"), name
            _put_batches(store, _messages(3 * BATCH))
            if worker is not None:
                assert worker.jobs >= 1
        finally:
            store.shutdown()


@pytest.mark.parametrize("name", testing.backend_params())
def test_a_batch_puts_keys_are_found_as_soon_as_it_returns(tmp_path, name):
    store = testing.open_store(tmp_path / "s", name)
    try:
        msgs = _messages(12 * BATCH)        # small_config: index files of 500 entries roll
        for i in range(0, len(msgs), BATCH):
            r = store.put_messages(msgs[i:i + BATCH])
            assert r.ok, r.status
            for k in (0, BATCH // 2, BATCH - 1):
                got = store.query_message(msgs[i + k].topic, f"k{i + k}").messages
                assert [g.commit_log_offset for g in got] == [r.commit_log_offsets[k]], i + k
        assert len(os.listdir(tmp_path / "s" / "index")) >= 3
    finally:
        store.shutdown()


def test_the_index_is_the_same_bytes_with_the_worker_as_without_it_and_as_pure(tmp_path):
    """Index files of 500 entries and two keys a message: the worker's jobs stop at full
    files and at the end of reserved blocks, and their settle finishes them."""
    msgs = _messages(20 * BATCH)
    got = {}
    for label, name, worker in (("worker", "cext", True), ("inline", "cext", False),
                                ("pure", "pure", False)):
        root = tmp_path / label
        store = testing.open_store(root, name)
        try:
            if name == "cext" and not worker:
                _disable_worker(store)
            _put_batches(store, msgs)
            if worker:
                assert store.index_service.worker.jobs >= 10
        finally:
            store.shutdown()
        got[label] = _index_bytes(root)
    assert len(got["worker"]) >= 5
    assert got["worker"] == got["inline"] == got["pure"]


def test_a_query_right_after_a_batch_put_takes_its_job_back_and_finds_the_keys(tmp_path):
    """A query straight after a batch put mostly comes before the worker looked for the job
    (it naps 50 us between looks): the query's settle takes the job back and runs it itself
    (IndexWorker.reclaimed). Whichever thread ran each job, every key is found at its record
    and the files end as the pure backend's."""
    size = 40                                   # past NOGIL_DISPATCH_ROWS: a job each
    msgs = _messages(400 * size)
    ref = testing.open_store(tmp_path / "pure", "pure")
    try:
        for i in range(0, len(msgs), size):
            assert ref.put_messages(msgs[i:i + size]).ok
    finally:
        ref.shutdown()
    store = testing.open_store(tmp_path / "cext", "cext")
    try:
        worker = store.index_service.worker
        for i in range(0, len(msgs), size):
            r = store.put_messages(msgs[i:i + size])
            assert r.ok, r.status
            k = i + size - 1
            got = store.query_message(msgs[k].topic, f"k{k}").messages
            assert [g.commit_log_offset for g in got] == [r.commit_log_offsets[-1]], k
        assert worker.reclaimed >= 1, (worker.jobs, worker.reclaimed, worker.waited)
    finally:
        store.shutdown()
    assert _index_bytes(tmp_path / "cext") == _index_bytes(tmp_path / "pure")


def test_a_finish_that_failed_is_tried_again_and_the_index_ends_the_same(tmp_path):
    """The finish of a job (a roll into a new file) fails once, as on a full disk: the put
    still succeeds, the job stays pending, the next settle does it again, and the files end
    as the pure backend's."""
    msgs = _messages(20 * BATCH)
    ref = testing.open_store(tmp_path / "pure", "pure")
    try:
        _put_batches(ref, msgs)
    finally:
        ref.shutdown()
    store = testing.open_store(tmp_path / "cext", "cext")
    idx = store.index_service
    real = idx.dispatch_from
    failed = []

    def failing_once(*args):
        if not failed:
            failed.append(args[3])
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(*args)
    idx.dispatch_from = failing_once
    try:
        _put_batches(store, msgs)
        # Every key is found: a query settles the job, doing it again if it is still pending.
        for i in (0, 777, len(msgs) - 1):
            got = store.query_message(msgs[i].topic, f"k{i}").messages
            assert len(got) == 1, i
        assert failed
        assert not idx.worker.pending
    finally:
        store.shutdown()
    assert _index_bytes(tmp_path / "cext") == _index_bytes(tmp_path / "pure")


def test_the_last_jobs_files_are_let_go_of_once_puts_pause(tmp_path):
    """The putter settles each job at its next put; after the last one, the reput thread
    settles it, so the CommitLog file it read and the index file it wrote are not held."""
    store = testing.open_store(tmp_path / "s", "cext")
    try:
        # The first batch makes the first index file (the scan's path); the second is a job.
        _put_batches(store, _messages(2 * BATCH))
        worker = store.index_service.worker
        assert worker.jobs == 1
        deadline = time.monotonic() + 5.0
        while worker.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not worker.pending
        assert store.commitlog.mfq.files[0]._refs == 0
        assert store.index_service.index_file_list[-1].mf._refs == 0
    finally:
        store.shutdown()


def test_closing_the_worker_settles_its_job_and_a_closed_worker_runs_jobs_in_the_caller(
        tmp_path):
    store = testing.open_store(tmp_path / "s", "cext")
    try:
        idx = store.index_service
        worker = idx.worker
        msgs = _messages(4 * BATCH)
        _put_batches(store, msgs[:BATCH])
        worker.close()
        assert not worker.pending
        worker.close()                      # again: nothing left to do
        _put_batches(store, msgs[BATCH:])   # the same worker object, its thread gone
        for i in (BATCH, len(msgs) - 1):
            assert len(store.query_message(msgs[i].topic, f"k{i}").messages) == 1
    finally:
        store.shutdown()


CYCLES = int(os.environ.get("ROCKETSTORE_CRASH_CYCLES", "20")) // 5 or 1


@pytest.mark.parametrize("name", testing.backend_params())
def test_a_kill_during_batch_puts_loses_no_acknowledged_key(tmp_path, name):
    """The writer puts batches of 100 (the worker's jobs) and is killed at a random moment,
    perhaps while a job is half done; the reopened store finds every acknowledged key at its
    record (the index is rebuilt from where it ends)."""
    rng = random.Random(testing.fixed_seed(f"index-worker-kill-{name}"))
    root = tmp_path / "store"
    start = 0
    for cycle in range(CYCLES):
        proc = subprocess.Popen([sys.executable, WRITER, str(root), "--mode", "async",
                                 "--backend", name, "--start", str(start), "--batch",
                                 str(BATCH)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = b""
        try:
            assert proc.stdout.readline() == b"ready\n", proc.stderr.read().decode()[-2000:]
            # The first batch acknowledged, however slow the machine: then a random moment.
            first = proc.stdout.readline()
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
        acks = []
        for line in (first + out).decode().splitlines():
            parts = line.split()
            if len(parts) == 6 and parts[0] == "ack":       # the last line may be cut short
                acks.append((int(parts[1]), int(parts[2])))
        assert acks, f"cycle {cycle}: nothing acknowledged"
        store = MessageStore(root, crash_config("async"), kernels=name)
        store.load()
        try:
            assert not store.recovery_report.normal
            for i, offset in acks:
                m = message(i)
                got = store.query_message(m.topic, m.keys).messages
                assert [g.commit_log_offset for g in got] == [offset], (cycle, i)
        finally:
            store.shutdown()
        # Past whatever the killed writer may have written unacknowledged: each key once.
        start = (cycle + 1) * 1_000_000
