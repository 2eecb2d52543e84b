# SPDX-License-Identifier: Apache-2.0
"""put_message's compiled path (the cext backend's PutPath) writes the bytes, returns the
results and raises the errors of the Python path it stands in for, and hands every case it
does not take to that path."""
import random
import subprocess
import sys

import pytest

from rocketstore import Message, PutMessageStatus, testing
from rocketstore.clock import StepClock
from rocketstore.message import tags_code_of
from rocketstore.errors import MessageIllegalError, StoreClosedError
from rocketstore.services.base import ServiceThread
from rocketstore.services.reput import ReputMessageService
from rocketstore.workload import make_messages

BACKENDS = testing.backend_params()
needs_cext = pytest.mark.skipif("cext" not in BACKENDS, reason="the cext backend is not built")


def _commitlog_bytes(root):
    out = b""
    for name, digest in sorted(testing.tree_digest(root).items()):
        if name.startswith("commitlog"):
            out += (name + digest).encode()
    return out


def _random_messages(seed, count):
    """Messages whose properties cover what the compiled path must order and encode like
    the broker's HashMap: 0-12 entries (past 8 the Python path takes them), names that share
    buckets, UTF-8 names and values, empty values, and a few it must refuse."""
    rng = random.Random(seed)
    names = ["TAGS", "KEYS", "UNIQ_KEY", "a", "b", "Aa", "BB", "key", "x" * 40, "名前",
             "WAIT", "TRAN_MSG", "DELAY", "p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8"]
    values = ["", "v", "3", "value with spaces", "ü-ñ-€", "😀", "0" * 300]
    out = []
    for i in range(count):
        props = {rng.choice(names): rng.choice(values) for _ in range(rng.randrange(13))}
        out.append(Message("PathTopic%d" % (i % 3), rng.randbytes(rng.randrange(200)),
                           queue_id=rng.randrange(4), flag=rng.randrange(-5, 5),
                           properties=props, born_timestamp=rng.randrange(1 << 42),
                           reconsume_times=rng.randrange(3),
                           born_host=rng.choice([("10.0.0.7", 40001), ("127.0.0.1", 0),
                                                 ("::1", 9)])))
    return out


def _put_all(root, backend, msgs):
    store = testing.open_store(root, backend)
    answers = []
    try:
        for m in msgs:
            try:
                r = store.put_message(m)
                answers.append((r.status, r.commit_log_offset, r.queue_offset,
                                r.store_timestamp, r.wrote_bytes, r.msg_id))
            except MessageIllegalError as exc:
                answers.append(("refused", str(exc)))
        path = getattr(store.put_message, "__self__", None)
    finally:
        store.shutdown()
    return answers, _commitlog_bytes(root), path


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_backend_answers_and_writes_the_same_for_random_properties(tmp_path, seed):
    msgs = _random_messages(seed, 400)
    msgs.insert(50, Message("PathTopic0", b"sep", properties={"a": "x\x01y"}))
    msgs.insert(60, Message("PathTopic1", b"none", properties={"a": None, "b": "c"}))
    results = {n: _put_all(tmp_path / n, testing.load_backend(n), msgs) for n in BACKENDS}
    ref_answers, ref_bytes, _ = results[BACKENDS[-1]]
    assert sum(a[0] == "refused" for a in ref_answers) >= 1
    for name in BACKENDS:
        answers, data, _ = results[name]
        assert answers == ref_answers, name
        assert data == ref_bytes, name


@needs_cext
def test_puts_into_a_transient_pool_buffer_take_the_compiled_path_and_read_once_committed(
        tmp_path):
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"),
                               testing.small_config(mapped_file_size_commit_log=1 << 20,
                                                    transient_store_pool_enable=True,
                                                    transient_store_pool_size=2))
    try:
        path = store.put_message.__self__
        first = store.put_message(Message("T", b"first"))      # validates the topic in Python
        fast = path.fast
        mf = store.commitlog.mfq.last_file
        assert mf.wbuf is not None
        r = store.put_message(Message("T", b"buffered"))
        assert r.status is PutMessageStatus.PUT_OK and path.fast == fast + 1
        end = r.commit_log_offset + r.wrote_bytes
        assert mf.wrote_position == end
        # In the buffer, not yet in the file unless a commit already moved it there.
        if mf.committed_position < end:
            assert bytes(mf.mm[r.commit_log_offset:end]) == bytes(r.wrote_bytes)
        testing.wait_until(lambda: mf.committed_position >= end, what="the commit")
        testing.wait_until(lambda: len(store.get_message("g", "T", 0, 0, 10).messages) == 2,
                           what="both messages dispatched")
        got = store.get_message("g", "T", 0, 0, 10)
        assert [m.body for m in got.messages] == [b"first", b"buffered"]
        assert store.look_message_by_offset(first.commit_log_offset).body == b"first"
    finally:
        store.shutdown()


@needs_cext
def test_common_puts_take_the_compiled_path_and_the_rest_fall_back(tmp_path):
    # Files large enough that no put rolls (a roll is the Python path's too).
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"),
                               testing.small_config(mapped_file_size_commit_log=1 << 20))
    try:
        path = store.put_message.__self__
        msgs = make_messages(300, topics=2)
        for m in msgs:
            assert store.put_message(m).status is PutMessageStatus.PUT_OK
        # The first put of each topic validates and caches the topic in Python.
        assert (path.fast, path.slow) == (298, 2)
        rare = [Message("BenchTopic0", b"d", properties={"DELAY": "2"}),
                Message("BenchTopic0", bytearray(b"not bytes")),
                Message("BenchTopic0", b"tx", sys_flag=0x4),
                Message("BenchTopic0", b"h", store_host=("10.1.1.1", 10911)),
                Message("BenchTopic0", b"p", properties={"k%d" % i: "v" for i in range(9)})]
        for m in rare:
            assert store.put_message(m).status is PutMessageStatus.PUT_OK
        assert (path.fast, path.slow) == (298, 2 + len(rare))
    finally:
        store.shutdown()


@needs_cext
def test_a_put_after_shutdown_through_a_kept_reference_raises_store_closed(tmp_path):
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"))
    put = store.put_message          # what a benchmark loop keeps
    assert put(Message("T", b"x")).status is PutMessageStatus.PUT_OK
    store.shutdown()
    with pytest.raises(StoreClosedError):
        put(Message("T", b"y"))
    assert "put_message" not in vars(store)



@needs_cext
def test_the_compiled_put_follows_commitlog_state_changed_between_puts(tmp_path, monkeypatch):
    # PutPath keeps copies of the CommitLog's put state (lock, hooks, queue table, limits,
    # the file list, the running flags) and refreshes them when the objects holding them
    # change: every change made between two puts must be seen by the second. (Reput kept
    # from idling: it would set its own put hook over the one this test sets.)
    import threading
    monkeypatch.setattr(ReputMessageService, "IDLE_AFTER_MS", 3_600_000)
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"),
                               testing.small_config(mapped_file_size_commit_log=1 << 20))
    cl = store.commitlog
    try:
        path = store.put_message.__self__
        put = store.put_message
        assert put(Message("T", b"a")).queue_offset == 0
        fast = path.fast
        assert put(Message("T", b"b")).queue_offset == 1 and path.fast == fast + 1

        class CountingLock:
            def __init__(self):
                self.lock, self.taken = threading.Lock(), 0

            def acquire(self, *args):
                self.taken += 1
                return self.lock.acquire(*args)

            def release(self):
                self.lock.release()

            __enter__ = acquire

            def __exit__(self, *exc):
                self.release()
        counting = CountingLock()
        cl.put_lock = counting
        assert put(Message("T", b"c")).queue_offset == 2
        assert counting.taken == 1 and path.fast == fast + 2

        class Waker:
            has_notified, wake_from, woken = False, 0, 0

            def wakeup(self):
                self.woken += 1
        plain, waker = cl.wake_on_put, Waker()
        cl.wake_on_put = waker
        put(Message("T", b"d"))
        assert waker.woken == 1
        cl.wake_on_put = plain

        # A queue table replaced (as recovery does) is the one read and advanced.
        old_table = cl.topic_queue_table
        cl.topic_queue_table = dict(old_table)
        assert put(Message("T", b"e")).queue_offset == 4
        assert cl.topic_queue_table[("T", 0)] == 5 and old_table[("T", 0)] == 4
        assert path.fast == fast + 4

        # A limit on the topic's queues sends a put past it to the Python path.
        slow = path.slow
        cl.write_queue_limits = {"T": 1}
        with pytest.raises(MessageIllegalError):
            put(Message("T", b"f", queue_id=3))
        assert path.slow == slow + 1
        cl.write_queue_limits = {}

        # Another topic validated meanwhile leaves the first one's bytes right.
        put(Message("U", b"g"))
        m = Message("T", b"h")
        assert put(m).queue_offset == 5
        testing.wait_until(lambda: store.get_message("g", "T", 0, 5, 1).messages)
        assert store.get_message("g", "T", 0, 5, 1).messages[0].body == b"h"

        # Not writeable: refused, and writeable again: taken.
        store.running_flags.get_and_make_not_writeable()
        assert put(Message("T", b"i")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        store.running_flags.get_and_make_writeable()
        assert put(Message("T", b"j")).status is PutMessageStatus.PUT_OK
    finally:
        store.shutdown()
    with pytest.raises(StoreClosedError):
        put(Message("T", b"k"))

@needs_cext
def test_compiled_put_results_are_not_tracked_by_the_garbage_collector(tmp_path):
    import gc
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"))
    try:
        store.put_message(Message("T", b"first"))
        r = store.put_message(Message("T", b"second"))
        assert not gc.is_tracked(r)
        assert r.ok and r.queue_offset == 1 and r.msg_id
        assert repr(r).startswith("PutMessageResult(PUT_OK")

        # put_messages' result, its members set in place by the compiled put_list: the same
        # columns and message ids as the records stored.
        rs = store.put_messages([Message("T", b"third"), Message("T", b"fourth", keys="k4")])
        assert not gc.is_tracked(rs)
        assert rs.ok and rs.count == 2 and rs.reason is None
        assert rs.queue_offsets.tolist() == [2, 3]
        assert rs.commit_log_offsets[0] == r.commit_log_offset + r.wrote_bytes
        assert (rs.commit_log_offsets[1] - rs.commit_log_offsets[0]) == rs.sizes[0]
        assert rs.wrote_bytes == int(rs.sizes.sum())
        assert rs.store_timestamp > 0
        got = store.get_message("g", "T", 0, 2, 2).messages
        assert [m.body for m in got] == [b"third", b"fourth"]
        assert rs.msg_ids == [m.msg_id for m in got]
        assert repr(rs) == "PutMessagesResult(PUT_OK, count=2)"

        # put_batch's result, from the compiled put_columns, likewise.
        rb = store.put_batch("T", 0, [b"fifth", b"sixth", b"seventh"])
        assert not gc.is_tracked(rb)
        assert rb.ok and rb.count == 3 and rb.queue_offsets.tolist() == [4, 5, 6]
        assert rb.commit_log_offsets[0] == rs.commit_log_offsets[1] + rs.sizes[1]
        assert rb.wrote_bytes == int(rb.sizes.sum())
        got = store.get_message("g", "T", 0, 4, 3).messages
        assert [m.body for m in got] == [b"fifth", b"sixth", b"seventh"]
        assert rb.msg_ids == [m.msg_id for m in got]
    finally:
        store.shutdown()


@needs_cext
def test_put_results_a_program_keeps_bring_on_no_garbage_collection(tmp_path):
    # Untracked or not, an instance of a class statement's class counts toward generation
    # 0's threshold: keeping every result ran a collection every 700 puts (and in the
    # put_message bench, the process's first full collection inside its first timed round).
    import gc
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"))
    msgs = make_messages(3001)
    try:
        store.put_message(msgs[0])                  # warm: the topic, the first file
        gc.disable()
        counts = []
        for i in range(3):
            kept = []
            before = gc.get_count()[0]
            for m in msgs[1 + 1000 * i:1001 + 1000 * i]:
                kept.append(store.put_message(m))
            counts.append(gc.get_count()[0] - before)
            assert all(r.ok for r in kept) and len({r.commit_log_offset for r in kept}) == 1000
        # The list, and whatever the store's own threads allocate meanwhile (see
        # test_batch_puts_allocate_no_garbage_collected_object_per_message); not a result.
        assert min(counts) < 200, counts
    finally:
        gc.enable()
        store.shutdown()


HAVE_GC = 1 << 14          # Py_TPFLAGS_HAVE_GC: a class whose instances the collector counts
_PLAIN_RESULTS = """
import sys
sys.modules["rocketstore.kernels._cext"] = None     # as where the module was never built
import pickle
from rocketstore import status, testing
from rocketstore.message import Message
for cls in (status.PutMessageResult, status.PutMessagesResult):
    print(sorted(dir(cls)))
store = testing.open_store(sys.argv[1], testing.load_backend("pure"))
try:
    r = store.put_message(Message("T", b"x"))
    back = pickle.loads(pickle.dumps(r))
    print(repr(back), back.msg_id == r.msg_id, type(r).__flags__ >> 14 & 1)
finally:
    store.shutdown()
"""


@needs_cext
def test_results_rebuilt_untracked_keep_the_plain_classes_attributes_and_pickle(tmp_path):
    import copy
    import gc
    import pickle
    from rocketstore.status import PutMessageResult, PutMessagesResult
    out = subprocess.run([sys.executable, "-c", _PLAIN_RESULTS, str(tmp_path / "plain")],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    plain_one, plain_many, put = out.splitlines()
    # Where the compiled module is missing, a plain __slots__ class (HAVE_GC set: 1).
    assert put.startswith("PutMessageResult(PUT_OK, commit_log_offset=0") and put.endswith(
        "True 1")
    assert eval(plain_one) == sorted(set(dir(PutMessageResult)) - {"_tp_name"})
    assert eval(plain_many) == sorted(set(dir(PutMessagesResult)) - {"_tp_name"})
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"))
    try:
        one = store.put_message(Message("T", b"x"))
        many = store.put_messages([Message("T", b"y"), Message("T", b"z")])
    finally:
        store.shutdown()
    for r in (one, many):
        assert not type(r).__flags__ & HAVE_GC and not gc.is_tracked(r)
        for twin in (pickle.loads(pickle.dumps(r)), copy.copy(r)):
            assert type(twin) is type(r) and repr(twin) == repr(r) and twin.msg_id == r.msg_id
    assert PutMessageResult(PutMessageStatus.PUT_OK, 1, 2).queue_offset == 2
    made = [PutMessageResult(PutMessageStatus.PUT_OK) for _ in range(500)]
    assert not any(gc.is_tracked(r) for r in made)


def _put_lists(root, backend, msgs, size):
    store = testing.open_store(root, backend)
    answers = []
    try:
        for i in range(0, len(msgs), size):
            try:
                r = store.put_messages(msgs[i:i + size])
                answers.append((r.status, r.count, list(r.commit_log_offsets),
                                list(r.queue_offsets), list(r.sizes), r.store_timestamp,
                                r.wrote_bytes, r.msg_id))
            except MessageIllegalError as exc:
                answers.append(("refused", str(exc)))
    finally:
        store.shutdown()
    return answers, _commitlog_bytes(root)


@pytest.mark.parametrize("size", [1, 7, 150])
def test_every_backend_answers_and_writes_the_same_for_lists(tmp_path, size):
    msgs = _random_messages(5, 450)
    # Eight properties each (the most the compiled path takes): the pieces of the list's
    # properties strings outgrow their first allocation.
    msgs[100:160] = [Message("PathTopic2", b"full", queue_id=i % 4,
                             properties={"p%d" % j: "v%d" % (i * j) for j in range(8)})
                     for i in range(60)]
    results = {n: _put_lists(tmp_path / n, testing.load_backend(n), msgs, size)
               for n in BACKENDS}
    ref = results[BACKENDS[-1]]
    for name in BACKENDS:
        assert results[name] == ref, name


def test_hundreds_of_property_names_made_at_run_time_write_the_same_bytes(tmp_path):
    """The compiled path remembers property names by address, two to a set: names made at
    run time (not interned), far more than it remembers, each coming back as a new object
    of the same text, evict one another and still order and encode as the broker's HashMap
    does, in every backend."""
    rng = random.Random(11)
    msgs = []
    for i in range(600):
        names = ["n%d" % rng.randrange(400) for _ in range(rng.randrange(1, 8))]
        props = {"".join(list(n)): "v%d" % i for n in names}    # a new str each time
        props["TAGS"] = "T%d" % (i % 5)
        msgs.append(Message("PathTopic%d" % (i % 2), b"b%d" % i, queue_id=i % 4,
                            properties=props))
    results = {n: _put_lists(tmp_path / n, testing.load_backend(n), msgs, 100)
               for n in BACKENDS}
    ref = results[BACKENDS[-1]]
    assert all(a[0] is PutMessageStatus.PUT_OK for a in ref[0])
    for name in BACKENDS:
        assert results[name] == ref, name


def test_a_list_whose_properties_outgrow_the_room_to_copy_them_writes_the_same(tmp_path):
    """put_list copies each record's properties string into one piece while its room lasts
    (128 bytes a record on average), and past it encodes them piece by piece: one list
    meets both, and every backend writes the same bytes."""
    first = [Message("PathTopic0", b"", queue_id=q) for q in range(4)]   # creates the queues
    msgs = [Message("PathTopic0", b"b%d" % i, queue_id=i % 4, tags="T%d" % (i % 3),
                    keys=["k%d" % i, "x"],
                    properties={"big": "v" * (i * 37 % 700), "p": "ü" * (1 + i % 3)})
            for i in range(300)]
    written = {}
    for name in BACKENDS:
        store = testing.open_store(tmp_path / name, testing.load_backend(name))
        try:
            store.put_messages(first)
            path = getattr(store.put_message, "__self__", None)    # cext: its PutPath
            path = path if hasattr(path, "fast") else None
            fast = path.fast if path is not None else 0
            r = store.put_messages(msgs)
            assert r.status is PutMessageStatus.PUT_OK and r.count == 300
            if path is not None:
                assert path.fast == fast + 300         # the compiled path took the list
            got = store.get_message("g", "PathTopic0", 1, 1, 100)
            assert [bytes(m.body) for m in got.messages] == [
                bytes(m.body) for m in msgs if m.queue_id == 1]
            assert [m.properties for m in got.messages] == [
                m.properties for m in msgs if m.queue_id == 1]
        finally:
            store.shutdown()
        written[name] = _commitlog_bytes(tmp_path / name)
    assert len(set(written.values())) == 1, written.keys()


@needs_cext
def test_a_list_of_common_messages_is_stored_by_one_compiled_call(tmp_path):
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"),
                               testing.small_config(mapped_file_size_commit_log=1 << 20))
    try:
        path = store.put_message.__self__       # put_messages is that path's put_list
        msgs = make_messages(600, topics=3)
        store.put_messages(msgs[:3])              # first sight of each topic: Python's path
        assert (path.fast, path.slow) == (0, 1)
        r = store.put_messages(msgs[3:])
        assert r.status is PutMessageStatus.PUT_OK and r.count == 597
        assert (path.fast, path.slow) == (597, 1)
        # One message the compiled path does not take sends the whole list to Python.
        mixed = make_messages(5, topics=3, start=600) + [
            Message("BenchTopic0", b"d", properties={"DELAY": "1"})]
        assert store.put_messages(mixed).count == 6
        assert (path.fast, path.slow) == (597, 2)
        got = store.get_message("g", "BenchTopic0", 0, 0, 500)
        assert [bytes(m.body) for m in got.messages] == [
            bytes(m.body) for m in msgs + mixed[:5] if m.topic == "BenchTopic0"
            and m.queue_id == 0]
    finally:
        store.shutdown()


@needs_cext
def test_batch_puts_allocate_no_garbage_collected_object_per_message(tmp_path):
    import gc
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"),
                               testing.small_config(mapped_file_size_commit_log=8 << 20))
    msgs = make_messages(3000)
    bodies = [m.body for m in msgs[:1000]]
    keys = [m.keys for m in msgs[:1000]]
    calls = {"put_messages": lambda: store.put_messages(msgs[1000:2000]),
             "put_batch": lambda: store.put_batch("BenchTopic0", 0, bodies, tags="t", keys=keys)}
    try:
        store.put_messages(msgs[:1000])
        gc.disable()
        for name, call in calls.items():
            call()                                  # warm: topic caches, files
            # The result and its few arrays; nothing per message. The store's own threads
            # allocate meanwhile too: a few dozen objects, and now and then a burst (a file
            # made ahead) that took one call to 308 in CI. The fewest of three calls counts;
            # an object per message would be in every one of them.
            counts = []
            for _ in range(3):
                before = gc.get_count()[0]
                assert call().count == 1000
                counts.append(gc.get_count()[0] - before)
            assert min(counts) < 200, (name, counts)
    finally:
        gc.enable()
        store.shutdown()


def test_lists_put_from_many_threads_at_once_all_land_in_order(tmp_path, backend):
    import threading
    store = testing.open_store(tmp_path / "s", backend)
    lists = {t: [[Message("Threads", b"%d-%d-%d" % (t, j, i), queue_id=t,
                          properties={"k": "%d" % i})
                  for i in range(100)] for j in range(30)] for t in range(4)}
    failures = []

    def run(t):
        for msgs in lists[t]:
            r = store.put_messages(msgs)
            if r.status is not PutMessageStatus.PUT_OK or r.count != len(msgs):
                failures.append((t, r.status))
    try:
        threads = [threading.Thread(target=run, args=(t,)) for t in lists]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not failures
        for t, per_thread in lists.items():
            want = [m.body for msgs in per_thread for m in msgs]
            got = []
            while len(got) < len(want):
                r = store.get_message("g", "Threads", t, len(got), 1000)
                assert r.messages, (t, len(got))
                got.extend(bytes(m.body) for m in r.messages)
            assert got == want
    finally:
        store.shutdown()


def test_a_property_with_a_lone_surrogate_is_refused_alike_and_writes_nothing(tmp_path,
                                                                               backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        store.put_message(Message("T", b"first", properties={"a": "b"}))
        end = store.commitlog.max_offset
        with pytest.raises(UnicodeEncodeError):
            store.put_message(Message("T", b"bad", properties={"a": "\udc80"}))
        with pytest.raises(UnicodeEncodeError):
            store.put_messages([Message("T", b"ok"), Message("T", b"bad",
                                                             properties={"\udc80": "v"})])
        assert store.commitlog.max_offset == end
        assert store.put_message(Message("T", b"after")).queue_offset == 1
    finally:
        store.shutdown()


def test_a_put_waits_while_another_thread_holds_the_put_lock(tmp_path, backend):
    # The compiled path takes a free put lock in place and calls acquire() when it is held:
    # a put started meanwhile must wait for the holder, then land after what it wrote.
    import threading
    store = testing.open_store(tmp_path / "s", backend)
    lock = store.commitlog.put_lock
    done = []
    started = threading.Event()

    def put_one():
        started.set()
        done.append(store.put_message(Message("Held", b"second")))
    try:
        assert store.put_message(Message("Held", b"first")).queue_offset == 0
        lock.acquire()
        try:
            worker = threading.Thread(target=put_one)
            worker.start()
            started.wait()
            worker.join(0.05)
            assert not done             # still waiting for the lock
        finally:
            lock.release()
        worker.join()
        assert done[0].status is PutMessageStatus.PUT_OK and done[0].queue_offset == 1
        assert not lock.locked()
    finally:
        store.shutdown()


@pytest.mark.skipif(sys.platform != "linux" or sys.version_info >= (3, 13),
                    reason="a _thread.lock is a POSIX semaphore on Linux up to CPython 3.12")
def test_the_compiled_put_takes_a_free_lock_as_a_semaphore_where_the_lock_is_one():
    # Where CPython's lock is a semaphore, put() takes it with sem_trywait (no clock read);
    # the two tests around this one then prove that path keeps the lock's Python view.
    assert testing.load_backend("cext")._LOCK_BY_SEMAPHORE


def test_the_put_lock_is_free_after_every_kind_of_put(tmp_path, backend):
    # Taken and given back in place, the lock must look to Python exactly as acquire() and
    # release() leave it: free after compiled puts, after the ones handed to the Python path
    # from under it, and after refused ones.
    store = testing.open_store(tmp_path / "s", backend)
    lock = store.commitlog.put_lock
    nine = {"k%d" % i: "v" for i in range(9)}          # past what the compiled path takes
    try:
        puts = [lambda: store.put_message(Message("Free", b"a")),
                lambda: store.put_message(Message("Free", b"b", properties=nine)),
                lambda: store.put_messages([Message("Free", b"c"), Message("Free", b"d")]),
                lambda: store.put_messages([Message("Free", b"e", properties=nine)])]
        for put in puts * 2:
            assert put().status is PutMessageStatus.PUT_OK
            assert not lock.locked()
        with pytest.raises(UnicodeEncodeError):
            store.put_message(Message("Free", b"bad", properties={"a": "\udc80"}))
        assert not lock.locked()
        with pytest.raises(RuntimeError):
            lock.release()              # nothing holds it
        assert lock.acquire(blocking=False)
        lock.release()
        assert store.commitlog.topic_queue_table[("Free", 0)] == 10    # five puts, twice
    finally:
        store.shutdown()


class _Idle(ServiceThread):
    """A service never started: what puts wake shows in its has_notified."""

    def run_once(self):
        pass


def _store_with_its_own_put_hook(root, backend):
    # Reput stopped: going idle or busy, it would put the store's own hook back.
    store = testing.open_store(root, backend)
    store.reput_service.shutdown()
    return store


def test_a_put_wakes_a_service_by_its_current_mark_and_notified_flag(tmp_path, backend):
    # The compiled path reads a service's has_notified and wake_from in place (its
    # wake_cell): every change made between puts must count, for a single put and a list.
    store = _store_with_its_own_put_hook(tmp_path / "s", backend)
    try:
        cl = store.commitlog
        plain = cl.wake_on_put
        svc = _Idle("idle")
        cl.wake_on_put = svc
        for put in (lambda: store.put_message(Message("T", b"m")),
                    lambda: store.put_messages([Message("T", b"a"), Message("T", b"b")])):
            put()                               # the topic known, the path warm
            svc.has_notified = False
            svc.wake_from = cl.max_offset + (1 << 30)
            put()
            assert not svc.has_notified         # the records end before the mark
            svc.wake_from = cl.max_offset + 1
            put()
            assert svc.has_notified             # they pass it
            woken = []
            svc.wakeup = lambda: woken.append(1)
            put()
            # Pending: the compiled path does not call it; the Python path calls it, and
            # wakeup() itself finds it pending.
            assert woken == ([] if backend.NAME == "cext" else [1]) and svc.has_notified
            del svc.wakeup
            svc.has_notified = False
            svc.wake_from = 0
            put()
            assert svc.has_notified             # 0: every put wakes
        cl.wake_on_put = plain
        assert store.put_message(Message("T", b"z")).ok
    finally:
        store.shutdown()


def test_while_a_consumer_waits_a_put_wakes_reput_and_the_flusher_by_their_own_flags(
        tmp_path, backend):
    # consumer.PutWake names its services; the compiled path wakes each by its own cell as
    # PutWake.wakeup() would: reput whenever it has no wake-up pending, the flusher only
    # past its mark.
    from rocketstore.consumer import PutWake
    store = _store_with_its_own_put_hook(tmp_path / "s", backend)
    try:
        cl = store.commitlog
        flusher, reput = _Idle("flusher"), _Idle("reput")
        cl.wake_on_put = PutWake(flusher, reput, cl.mfq.get_max_wrote_position)
        for put in (lambda: store.put_message(Message("T", b"m")),
                    lambda: store.put_messages([Message("T", b"a"), Message("T", b"b")])):
            put()
            flusher.has_notified = reput.has_notified = False
            flusher.wake_from = cl.max_offset + (1 << 30)
            put()
            assert reput.has_notified and not flusher.has_notified
            reput.has_notified = False
            flusher.wake_from = cl.max_offset + 1
            put()
            assert reput.has_notified and flusher.has_notified
            calls = []
            reput.wakeup = lambda: calls.append("reput")
            flusher.wakeup = lambda: calls.append("flusher")
            put()
            assert calls == []                  # both pending
            reput.has_notified = False
            put()
            assert calls == ["reput"]
            del reput.wakeup, flusher.wakeup
        cl.wake_on_put = PutWake(None, reput, cl.mfq.get_max_wrote_position)
        reput.has_notified = False
        store.put_message(Message("T", b"z"))
        assert reput.has_notified
    finally:
        store.shutdown()


def test_queue_offsets_run_on_when_the_compiled_and_python_paths_alternate(tmp_path, backend):
    # The Python path creates each queue's table entry (a topic's first put is its); the
    # compiled path then re-keys the entry with its own key. Every put, whichever path
    # takes it, must continue the same queue, and the table keep one entry per queue.
    store = testing.open_store(tmp_path / "s", backend)
    nine = {"k%d" % i: "v" for i in range(9)}
    try:
        want = []
        for i in range(12):
            props = nine if i % 3 == 1 else {"KEYS": "k%d" % i}
            for qid in (0, 1):
                r = store.put_message(Message("Alt", b"%d-%d" % (qid, i), queue_id=qid,
                                              properties=props))
                assert r.queue_offset == i, (i, qid)
                want.append((qid, b"%d-%d" % (qid, i)))
        table = store.commitlog.topic_queue_table
        assert {k: v for k, v in table.items() if k[0] == "Alt"} == {("Alt", 0): 12,
                                                                      ("Alt", 1): 12}
        for qid in (0, 1):
            testing.wait_until(lambda: store.get_max_offset_in_queue("Alt", qid) == 12)
            got = store.get_message("g", "Alt", qid, 0, 32).messages
            assert [bytes(m.body) for m in got] == [b for q, b in want if q == qid]
    finally:
        store.shutdown()


# Property names and values of these lengths, with one byte of interest at every position:
# short ones (read a word or two at a time by the compiled path), and around 64 bytes (past
# 64 it asks memchr).
_SEPARATOR_LENGTHS = list(range(1, 25)) + [63, 64, 65, 66]


def _with_byte_at(char, n, at):
    return "".join(char if i == at else "abcdefgh"[i % 8] for i in range(n))


def test_a_separator_at_any_position_of_a_property_name_or_value_is_refused(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        assert store.put_messages([Message("Sep", b"first", tags="t")]).status \
            is PutMessageStatus.PUT_OK                      # the topic is known from here on
        end = store.commitlog.max_offset
        for n in _SEPARATOR_LENGTHS:
            for at in range(n):
                for sep in "\x01\x02":
                    text = _with_byte_at(sep, n, at)
                    for props in ({"name": text}, {text: "value"}):
                        with pytest.raises(MessageIllegalError):
                            store.put_messages([Message("Sep", b"x", keys="k",
                                                        properties=props)])
        assert store.commitlog.max_offset == end
    finally:
        store.shutdown()


def test_bytes_beside_the_separators_at_any_position_are_stored_and_read_back(tmp_path,
                                                                              backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        assert store.put_messages([Message("Near", b"first")]).status is PutMessageStatus.PUT_OK
        path = store.put_message.__self__               # the compiled path with cext
        fast = getattr(path, "fast", None)
        sent = [{"v": _with_byte_at(char, n, at), _with_byte_at(char, n, at) + "k": "w"}
                for n in _SEPARATOR_LENGTHS for at in range(n) for char in "\x00\x03\x7f\x81"]
        r = store.put_messages([Message("Near", b"m%d" % i, properties=p)
                                for i, p in enumerate(sent)])
        assert r.status is PutMessageStatus.PUT_OK and r.count == len(sent)
        if fast is not None:
            assert path.fast == fast + len(sent)            # taken by the compiled path
        got = store.get_message("g", "Near", 0, 1, len(sent))
        assert [dict(m.properties) for m in got.messages] == sent
    finally:
        store.shutdown()


class _ChangingClock:
    """A clock that, on the call a put makes under the put lock, replaces what the messages
    in `victims` hold (body and properties, freeing the old objects) and fills the freed
    memory with other objects: what another thread may do while a put waits for a
    contended put lock (acquire() lets other threads run). The store time is StepClock's."""

    def __init__(self):
        self._inner = StepClock()
        self.victims = []
        self.junk = []

    def __call__(self):
        victims, self.victims = self.victims, []
        for m in victims:
            n = len(m.body)
            m.body = bytes(bytearray(b"N" * n))
            m.properties = {"KEYS": "n" * 300}
            self.junk += [bytes(bytearray(b"Z" * n)) for _ in range(64)]
            self.junk += ["".join(["z"] * k) for k in (5, 6, 7, 10, 200, 300) for _ in range(64)]
        return self._inner()


def _changeable_message(i, keys_len):
    # Objects made at run time, held by the message alone: replacing them frees them.
    return Message("Changed", bytes(bytearray(b"O" * (299 + i) + b"!")), queue_id=0,
                   properties={"KEYS": "".join(["k"] * keys_len),
                               "TAGS": "".join(["t"] * (5 + i))})


@pytest.mark.parametrize("as_list", [False, True])
@pytest.mark.parametrize("keys_len", [200, 10])        # properties pointed to, or copied
def test_a_message_changed_while_its_put_holds_the_lock_is_stored_as_it_was_read(
        tmp_path, backend, as_list, keys_len):
    # The compiled path read the message's body and properties in place before the lock and
    # encoded them after it: an object replaced meanwhile was freed, and the record (CRC
    # and all, acknowledged PUT_OK) held whatever reused its memory.
    clock = _ChangingClock()
    store = testing.open_store(tmp_path / "s", backend, clock=clock)
    try:
        store.put_message(Message("Changed", b"warm"))     # the file is ready: no roll
        msgs = [_changeable_message(i, keys_len) for i in range(3)]
        # Equal copies, not the objects themselves: the messages must be their only holders.
        want = [(bytes(bytearray(m.body)), {k: "".join(list(v)) for k, v in m.properties.items()})
                for m in msgs]
        if as_list:
            clock.victims = list(msgs)
            res = store.put_messages(msgs)
            assert res.status is PutMessageStatus.PUT_OK
            offsets = list(res.commit_log_offsets)
        else:
            offsets = []
            for m in msgs:
                clock.victims = [m]
                r = store.put_message(m)
                assert r.status is PutMessageStatus.PUT_OK
                offsets.append(r.commit_log_offset)
        got = [store.look_message_by_offset(off) for off in offsets]
        for (body, props), m in zip(want, got):
            assert m.body == body
            assert {k: m.properties[k] for k in props} == props
        # The queue units' tagsCode, which a put's inline dispatch takes from its TAGS.
        testing.wait_dispatched(store)
        units = store.find_consume_queue("Changed", 0).units(1, 3)
        assert list(units["tags_code"]) == [tags_code_of(p["TAGS"]) for _, p in want]
    finally:
        store.shutdown()


@pytest.mark.parametrize("member", ["topic", "body", "queue_id", "flag", "properties",
                                    "born_timestamp", "born_host", "store_host", "sys_flag",
                                    "reconsume_times", "prepared_transaction_offset"])
def test_a_message_missing_any_member_is_refused_alike_and_writes_nothing(tmp_path, member):
    """A deleted slot reads as NULL in the compiled path, which checks each member where it
    reads it: the message goes to the Python path, alone or in a list, whose error every
    backend raises alike."""
    seen = set()
    for name in BACKENDS:
        store = testing.open_store(tmp_path / name, testing.load_backend(name))
        try:
            ok, bad = make_messages(2)
            delattr(bad, member)
            errors = []
            for put in (store.put_message, lambda m: store.put_messages([ok, m])):
                with pytest.raises(Exception) as exc:
                    put(bad)
                errors.append((type(exc.value), str(exc.value)))
            seen.add(tuple(errors))
            assert store.get_max_offset_in_queue("BenchTopic0", 0) == 0
        finally:
            store.shutdown()
    assert len(seen) == 1


def test_a_list_to_hundreds_of_queues_takes_each_queue_offset_in_turn(tmp_path):
    """put_list's table of a list's distinct queues starts small and grows as queues come:
    a list going to 40 topics x 10 queues in a shuffled order stores every message at the
    next offset of its own queue, the same bytes in every backend."""
    import random
    msgs = make_messages(2000, topics=40, queues=10)
    random.Random(3).shuffle(msgs)
    written = {}
    for name in BACKENDS:
        store = testing.open_store(tmp_path / name, testing.load_backend(name),
                                   testing.small_config(mapped_file_size_commit_log=1 << 22))
        try:
            store.put_messages(msgs[:1000])         # first sight of the topics: Python's path
            path = getattr(store.put_message, "__self__", None)    # cext: its PutPath
            fast = path.fast if hasattr(path, "fast") else None
            r = store.put_messages(msgs[1000:])
            assert r.status is PutMessageStatus.PUT_OK and r.count == 1000
            if fast is not None:
                assert path.fast == fast + 1000     # the compiled path took the list
            nxt = {}
            for m, q in zip(msgs[1000:], r.queue_offsets.tolist()):
                key = (m.topic, m.queue_id)
                want = nxt.get(key, sum(1 for x in msgs[:1000] if (x.topic, x.queue_id) == key))
                assert q == want
                nxt[key] = q + 1
        finally:
            store.shutdown()
        written[name] = _commitlog_bytes(tmp_path / name)
    assert len(set(written.values())) == 1, written.keys()
