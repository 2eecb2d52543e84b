# SPDX-License-Identifier: Apache-2.0
"""Dispatch in a batch put's own thread (dispatch_in_put_lag) and the reput pass as one
compiled call (the cext backend's reput_dispatch): the same ConsumeQueue and index bytes as
the dispatchers' own paths, through queue-file rolls, index rolls, reservations, deleted
topics and transactions; a put that returns has its messages dispatched; a failing
dispatch never fails the put and is retried by the service thread."""
import threading

import pytest

from rocketstore import PutMessageStatus, testing
from rocketstore import format as F
from rocketstore.dispatch import Dispatcher
from rocketstore.message import Message

from test_index_dispatch import workload

# Small queue files (60 units) and index files (40 entries): both roll many times.
GEOMETRY = dict(mapped_file_size_consume_queue=60 * 20, max_index_num=40, max_hash_slot_num=8)


def queue_and_index_digest(root):
    return {k: v for k, v in testing.tree_digest(root).items()
            if k.startswith(("consumequeue", "index"))}


def put_workload(root, backend, fused=True, lag=0, batches=(40, 1, 150, 7, 300)):
    """Put workload() in put_messages batches and wait until everything is dispatched;
    returns the reput passes made by reput_dispatch."""
    store = testing.open_store(root, backend,
                               testing.small_config(dispatch_in_put_lag=lag, **GEOMETRY))
    reput = store.reput_service
    passes = []
    if not fused:
        reput._k_fused = None
    elif reput._k_fused is not None:
        run = reput._k_fused

        def counting(*args):
            out = run(*args)
            passes.append(out[0])
            return out
        reput._k_fused = counting
    msgs = workload(sum(batches))
    try:
        at = 0
        for size in batches:
            r = store.put_messages(msgs[at:at + size])
            assert r.status is PutMessageStatus.PUT_OK and r.count == size
            at += size
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
        found = store.query_message("T0", "ключ3").messages
        assert [m.body for m in found] == [b"m3"]
    finally:
        store.shutdown()
    return passes


@pytest.mark.parametrize("lag", [0, -1])
def test_every_backend_and_both_reput_paths_write_the_same_queues_and_index(tmp_path, lag):
    digests = {}
    for name in testing.backend_params():
        put_workload(tmp_path / name, testing.load_backend(name), lag=lag)
        digests[name] = queue_and_index_digest(tmp_path / name)
    if "cext" in digests:
        put_workload(tmp_path / "apart", testing.load_backend("cext"), fused=False, lag=lag)
        digests["cext without reput_dispatch"] = queue_and_index_digest(tmp_path / "apart")
    first = next(iter(digests.values()))
    assert sum(k.startswith("index") for k in first) > 5
    assert sum(k.startswith("consumequeue") for k in first) > 5
    for name, d in digests.items():
        assert d == first, f"{name} differs"


@pytest.fixture
def cext():
    return testing.load_backend("cext")


def test_the_compiled_pass_takes_whole_batches_across_queue_and_index_rolls(tmp_path, cext):
    passes = put_workload(tmp_path / "c", cext)
    # The last batch, 300 records over 5 queue files and many index files, is one pass;
    # a batch whose pass starts on a full index file goes through the dispatchers apart.
    assert 300 in passes and sum(passes) <= 498


class ThreadRecorder(Dispatcher):
    """Notes which thread dispatched each record."""

    def __init__(self):
        self.threads = []

    def dispatch(self, rows, buf):
        self.threads += [threading.current_thread().name] * len(rows)


@pytest.mark.parametrize("lag, putting_thread_dispatches", [(0, True), (-1, False)])
def test_a_batch_put_dispatches_what_it_wrote_before_it_returns(tmp_path, backend, lag,
                                                                putting_thread_dispatches):
    store = testing.open_store(tmp_path / "s", backend,
                               testing.small_config(dispatch_in_put_lag=lag))
    recorder = ThreadRecorder()
    try:
        with store.reput_service.dispatch_lock:
            store.dispatchers.append(recorder)
        msgs = [Message("T", b"x%d" % i, keys=f"k{i}") for i in range(50)]
        for i in range(0, 50, 10):
            assert store.put_messages(msgs[i:i + 10]).status is PutMessageStatus.PUT_OK
            if putting_thread_dispatches:
                assert store.dispatch_behind_bytes() == 0
        r = store.put_batch("T", 1, [b"a", b"b", b"c"], keys=["ka", "kb", "kc"])
        assert r.status is PutMessageStatus.PUT_OK
        if putting_thread_dispatches:
            assert store.dispatch_behind_bytes() == 0
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
        me = threading.current_thread().name
        assert len(recorder.threads) == 53
        assert (set(recorder.threads) == {me}) is putting_thread_dispatches
        assert me not in recorder.threads or putting_thread_dispatches
    finally:
        store.shutdown()


class FailingOnce(Dispatcher):
    """Raises an OS error (a full disk) the first time it is called, then dispatches."""

    def __init__(self):
        self.failed = False
        self.rows = 0

    def dispatch(self, rows, buf):
        if not self.failed:
            self.failed = True
            raise OSError(28, "No space left on device")
        self.rows += len(rows)


def test_a_dispatch_failing_in_the_putting_thread_leaves_the_put_done(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend,
                               testing.small_config(dispatch_in_put_lag=0))
    failing = FailingOnce()
    try:
        with store.reput_service.dispatch_lock:
            store.dispatchers.append(failing)
        r = store.put_messages([Message("T", b"x%d" % i) for i in range(5)])
        # The put succeeded, so it reports success; the service thread dispatches the
        # batch again a second later (the units written before the failure are kept).
        assert r.status is PutMessageStatus.PUT_OK and r.count == 5
        assert failing.failed
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="the retry")
        assert failing.rows == 5
        assert store.dispatch_failures() == (0, None)
        got = store.get_message("g", "T", 0, 0, 32)
        assert [m.body for m in got.messages] == [b"x%d" % i for i in range(5)]
    finally:
        store.shutdown()


def test_a_slave_never_dispatches_in_a_put(tmp_path, backend):
    from rocketstore.config import BrokerRole
    store = testing.open_store(tmp_path / "s", backend,
                               testing.small_config(broker_role=BrokerRole.SLAVE))
    try:
        assert store._help_dispatch is None
        r = store.put_messages([Message("T", b"x")])
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    finally:
        store.shutdown()


def test_transactions_and_deleted_topics_keep_their_units_rules_in_a_put(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend, testing.small_config())
    try:
        prepared = Message("T", b"p", sys_flag=F.TRANSACTION_PREPARED_TYPE)
        store.put_messages([Message("T", b"a"), prepared, Message("T", b"b")])
        assert store.dispatch_behind_bytes() == 0
        got = store.get_message("g", "T", 0, 0, 32)
        assert [m.body for m in got.messages] == [b"a", b"b"]
        store.put_messages([Message("Gone", b"g%d" % i) for i in range(3)])
        assert store.delete_topic("Gone")
        store.put_messages([Message("Gone", b"again")])
        got = store.get_message("g", "Gone", 0, 0, 32)
        assert [m.body for m in got.messages] == [b"again"]
    finally:
        store.shutdown()


def put_to_other_queues_each_pass(root, backend, record=None):
    """Batches whose queues change from one batch to the next (ten topics, then ten others,
    then the first ten again, ...), as rows spread over more queues than a pass holds do;
    `record(pass output)` sees each compiled pass once every queue exists."""
    store = testing.open_store(root, backend, testing.small_config(dispatch_in_put_lag=0))
    reput = store.reput_service
    if record is not None and reput._k_fused is not None:
        run = reput._k_fused
        every_queue_made = []

        def recording(*args):
            out = run(*args)
            if every_queue_made:
                record(out)
            return out
        reput._k_fused = recording
    try:
        for batch in range(8):
            group = "AB"[batch % 2]
            msgs = [Message(f"{group}{t}", b"%s-%d-%d" % (group.encode(), batch, t),
                            keys=f"k{group}{batch}-{t}") for t in range(10)]
            assert store.put_messages(msgs).status is PutMessageStatus.PUT_OK
            testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
            if batch == 1 and record is not None:
                every_queue_made.append(True)
        got = store.get_message("g", "A3", 0, 0, 32)
        assert [m.body for m in got.messages] == [b"A-%d-3" % b for b in (0, 2, 4, 6)]
        assert [m.body for m in store.query_message("B7", "kB5-7").messages] == [b"B-5-7"]
    finally:
        store.shutdown()


def test_a_pass_to_other_queues_than_the_last_one_is_dispatched_whole_by_the_compiled_pass(
        tmp_path, cext):
    passes = []
    put_to_other_queues_each_pass(tmp_path / "c", cext, passes.append)
    assert len(passes) >= 6
    for n, _, _, _, cq_row, _, index_row, _, _ in passes:
        # No row is left to the dispatchers' own paths: the queues the last pass did not
        # touch are loaded within the call.
        assert n and cq_row == n and index_row == n


def test_passes_to_other_queues_than_the_last_one_write_what_every_backend_writes(tmp_path):
    digests = {}
    for name in testing.backend_params():
        put_to_other_queues_each_pass(tmp_path / name, testing.load_backend(name))
        digests[name] = queue_and_index_digest(tmp_path / name)
    first = next(iter(digests.values()))
    assert sum(k.startswith("consumequeue") for k in first) == 20
    for name, d in digests.items():
        assert d == first, f"{name} differs"
