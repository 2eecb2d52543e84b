# SPDX-License-Identifier: Apache-2.0
"""Consumers that wait (consumer.py): get_message(wait_ms=...), the Consumer iterator and the
asyncio API. Timeouts here are hang guards, never speed claims."""
import asyncio
import threading

import pytest

from rocketstore import Message, MessageStore, testing
from rocketstore.consumer import queue_key
from rocketstore.errors import InvalidArgumentError, StoreClosedError
from rocketstore.message import tags_code_of
from rocketstore.status import GetMessageStatus as G

GUARD = 60          # seconds a test waits for something that should take milliseconds
LONG_MS = 600_000   # a wait that only a wake-up ends within the test


@pytest.fixture
def store(tmp_path, backend):
    s = testing.open_store(tmp_path / "s", backend)
    yield s
    s.shutdown()


def put(store, topic, queue_id, body, tags=None):
    r = store.put_message(Message(topic, body, tags=tags, queue_id=queue_id))
    assert r.ok, r
    return r


class Waiter(threading.Thread):
    """get_message(wait_ms=...) in a thread; `result` or `error` when it returns."""

    def __init__(self, store, topic="T", queue_id=0, offset=0, wait_ms=LONG_MS, **kw):
        super().__init__(daemon=True)
        self.args = (store, topic, queue_id, offset, wait_ms, kw)
        self.result = self.error = None
        self.registered = threading.Event()

    def run(self):
        store, topic, queue_id, offset, wait_ms, kw = self.args
        try:
            self.result = store.get_message("g", topic, queue_id, offset, wait_ms=wait_ms, **kw)
        except Exception as exc:
            self.error = exc

    def finish(self):
        self.join(GUARD)
        assert not self.is_alive(), "the waiter was never woken"
        if self.error is not None:
            raise self.error
        return self.result


def wait_registered(store, topic="T", queue_id=0, count=1):
    key = queue_key(topic, queue_id)
    testing.wait_until(lambda: len(store.arrivals._by_key.get(key, ())) >= count, GUARD,
                       "the waiter to register")


# ---- get_message(wait_ms=...) -------------------------------------------------------------
def test_wait_returns_the_message_a_put_brings(store):
    w = Waiter(store)
    w.start()
    wait_registered(store)
    put(store, "T", 0, b"hello")
    r = w.finish()
    assert r.status is G.FOUND
    assert [m.body for m in r.messages] == [b"hello"]
    assert r.next_begin_offset == 1
    assert not store.arrivals.waiting       # the waiter unregistered


def test_wait_answers_at_once_when_the_message_is_there(store):
    put(store, "T", 0, b"a")
    w = Waiter(store)
    w.start()
    assert [m.body for m in w.finish().messages] == [b"a"]


def test_wait_times_out_with_what_get_message_answers(store):
    r = store.get_message("g", "T", 0, 0, wait_ms=30)
    assert r.status is G.NO_MESSAGE_IN_QUEUE and r.messages == []
    put(store, "T", 0, b"a")
    r = store.get_message("g", "T", 0, 1, wait_ms=30)
    assert r.status is G.OFFSET_OVERFLOW_ONE and r.messages == [] and r.next_begin_offset == 1


def test_an_offset_out_of_range_answers_without_waiting(store):
    put(store, "T", 0, b"a")
    w = Waiter(store, offset=5)
    w.start()
    r = w.finish()              # a wait would last LONG_MS: the guard would fail first
    assert r.status is G.OFFSET_OVERFLOW_BADLY and r.next_begin_offset == 1


def test_shutdown_wakes_a_waiter_with_store_closed_error(tmp_path, backend):
    s = testing.open_store(tmp_path / "s", backend)
    w = Waiter(s)
    w.start()
    wait_registered(s)
    s.shutdown()
    with pytest.raises(StoreClosedError):
        w.finish()
    with pytest.raises(StoreClosedError):
        s.get_message("g", "T", 0, 0, wait_ms=10)


def test_puts_to_other_queues_wake_nobody(store):
    wakes = []
    key = queue_key("T", 0)

    def wake():
        wakes.append(1)
    store.arrivals.register(key, wake)
    try:
        put(store, "T", 1, b"other queue")
        put(store, "U", 0, b"other topic")
        testing.wait_dispatched(store)
        assert wakes == []
        put(store, "T", 0, b"mine")
        testing.wait_until(lambda: wakes, GUARD, "the wake-up of queue T/0")
    finally:
        store.arrivals.unregister(key, wake)


def test_a_waiter_on_another_queue_keeps_waiting(store):
    w0, w1 = Waiter(store, queue_id=0), Waiter(store, queue_id=1)
    w0.start()
    w1.start()
    wait_registered(store, queue_id=0)
    wait_registered(store, queue_id=1)
    put(store, "T", 1, b"for 1")
    assert [m.body for m in w1.finish().messages] == [b"for 1"]
    assert w0.is_alive()
    put(store, "T", 0, b"for 0")
    assert [m.body for m in w0.finish().messages] == [b"for 0"]


def test_puts_wake_reput_only_while_a_consumer_waits(store, monkeypatch):
    """(Or while reput is idle, tests/test_idle_threads.py: kept from idling here; the put
    moves it out of an idle spell that began before.)"""
    from rocketstore.consumer import PutWake
    from rocketstore.services.reput import ReputMessageService
    monkeypatch.setattr(ReputMessageService, "IDLE_AFTER_MS", 3_600_000)
    put(store, "T", 1, b"out of any idle spell")
    testing.wait_until(lambda: not isinstance(store.commitlog.wake_on_put, PutWake), GUARD,
                       "the plain put hook")
    plain = store.commitlog.wake_on_put
    w = Waiter(store)
    w.start()
    wait_registered(store)
    hook = store.commitlog.wake_on_put
    assert isinstance(hook, PutWake)
    assert hook.inner is plain and hook.reput is store.reput_service
    put(store, "T", 0, b"x")
    w.finish()
    assert store.commitlog.wake_on_put is plain     # the last waiter left


def test_wait_with_a_filter_skips_what_it_leaves_out(store):
    wanted = tags_code_of("B")
    w = Waiter(store, message_filter=lambda code: code == wanted)
    w.start()
    wait_registered(store)
    put(store, "T", 0, b"a1", tags="A")
    put(store, "T", 0, b"a2", tags="A")
    testing.wait_dispatched(store)
    assert w.is_alive()         # only units the filter leaves out arrived: still waiting
    put(store, "T", 0, b"b", tags="B")
    r = w.finish()
    assert [m.body for m in r.messages] == [b"b"] and r.next_begin_offset == 3


def test_many_waiters_on_one_queue_all_wake(store):
    ws = [Waiter(store) for _ in range(4)]
    for w in ws:
        w.start()
    wait_registered(store, count=4)
    put(store, "T", 0, b"x")
    assert all([m.body for m in w.finish().messages] == [b"x"] for w in ws)


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True])
def test_a_bad_wait_ms_is_refused(store, bad):
    with pytest.raises(InvalidArgumentError, match="wait_ms"):
        store.get_message("g", "T", 0, 0, wait_ms=bad)


# ---- the Consumer iterator -------------------------------------------------------------------
def test_consumer_starts_at_the_queue_minimum_without_a_committed_offset(store):
    for i in range(3):
        put(store, "T", 0, b"%d" % i)
    with store.consume("g", "T", 0, batch_size=2) as c:
        assert [m.body for m in next(c)] == [b"0", b"1"]
        assert store.query_offset("g", "T", 0) == -1      # handed out, not yet committed
        assert [m.body for m in next(c)] == [b"2"]
        assert store.query_offset("g", "T", 0) == 2       # asking for more committed it
        c.commit()
        assert store.query_offset("g", "T", 0) == 3


def test_consumer_starts_at_the_committed_offset(store):
    for i in range(4):
        put(store, "T", 0, b"%d" % i)
    store.commit_offset("g", "T", 0, 3)
    with store.consume("g", "T", 0) as c:
        assert [m.body for m in next(c)] == [b"3"]


def test_a_batch_not_committed_at_close_is_delivered_again(store):
    put(store, "T", 0, b"a")
    c = store.consume("g", "T", 0)
    assert [m.body for m in next(c)] == [b"a"]
    c.close()
    assert store.query_offset("g", "T", 0) == -1
    with pytest.raises(StopIteration):
        next(c)
    with store.consume("g", "T", 0) as again:
        assert [m.body for m in next(again)] == [b"a"]


def test_consumer_waits_for_messages_and_sees_each_once_in_order(store):
    got = []
    c = store.consume("g", "T", 0, batch_size=8)

    def run():
        for batch in c:
            got.extend(m.body for m in batch)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    bodies = [b"m%d" % i for i in range(50)]
    for b in bodies:
        put(store, "T", 0, b)
    testing.wait_until(lambda: len(got) >= len(bodies), GUARD, "every message consumed")
    c.close()                   # wakes the __next__ waiting in the thread
    t.join(GUARD)
    assert not t.is_alive()
    assert got == bodies
    # Everything but the last batch handed out was committed when the next one was asked for.
    assert 0 < store.query_offset("g", "T", 0) <= len(bodies)


def test_close_from_another_thread_ends_a_waiting_iteration(store):
    c = store.consume("g", "T", 0)
    out = []
    t = threading.Thread(target=lambda: out.append(list(c)), daemon=True)
    t.start()
    wait_registered(store)
    c.close()
    t.join(GUARD)
    assert not t.is_alive() and out == [[]]
    assert not store.arrivals.waiting


def test_store_shutdown_ends_a_waiting_iteration(tmp_path, backend):
    s = testing.open_store(tmp_path / "s", backend)
    put(s, "T", 0, b"a")
    c = s.consume("g", "T", 0)
    assert [m.body for m in next(c)] == [b"a"]
    out = []
    t = threading.Thread(target=lambda: out.append(list(c)), daemon=True)
    t.start()
    wait_registered(s)          # asking for the next batch committed the first
    s.shutdown()
    t.join(GUARD)
    assert not t.is_alive() and out == [[]]
    s2 = testing.open_store(tmp_path / "s", backend)
    try:
        assert s2.query_offset("g", "T", 0) == 1
    finally:
        s2.shutdown()


def test_next_batch_returns_none_when_its_time_is_up(store):
    with store.consume("g", "T", 0) as c:
        assert c.next_batch(wait_ms=20) is None
        put(store, "T", 0, b"a")
        assert [m.body for m in c.next_batch(wait_ms=LONG_MS)] == [b"a"]


def test_consumer_filter_and_arguments(store):
    wanted = tags_code_of("B")
    put(store, "T", 0, b"a", tags="A")
    put(store, "T", 0, b"b", tags="B")
    with store.consume("g", "T", 0, message_filter=lambda code: code == wanted) as c:
        assert [m.body for m in next(c)] == [b"b"]
    with pytest.raises(InvalidArgumentError):
        store.consume("g", "T", 0, batch_size=0)
    with pytest.raises(InvalidArgumentError):
        store.consume("g", "T", -1)


def test_consumer_follows_an_offset_past_the_queue_end(store):
    put(store, "T", 0, b"a")
    put(store, "T", 0, b"b")
    store.commit_offset("g", "T", 0, 10)        # e.g. the topic was deleted and recreated
    with store.consume("g", "T", 0) as c:
        assert c.next_batch(wait_ms=20) is None
        assert c.offset == 2
        put(store, "T", 0, b"c")
        assert [m.body for m in c.next_batch(wait_ms=LONG_MS)] == [b"c"]


def test_units_a_filter_leaves_out_are_committed(store):
    wanted = tags_code_of("B")
    put(store, "T", 0, b"a1", tags="A")
    put(store, "T", 0, b"a2", tags="A")
    with store.consume("g", "T", 0, message_filter=lambda code: code == wanted) as c:
        assert c.next_batch(wait_ms=20) is None
        assert c.offset == 2
        c.commit()
    assert store.query_offset("g", "T", 0) == 2


def test_an_uncorrected_offset_stalls_without_spinning_and_close_ends_it(store, monkeypatch):
    # A slave with offset_check_in_slave off answers an out-of-range offset without moving it.
    monkeypatch.setattr(store, "next_offset_correction", lambda old, new: old)
    put(store, "T", 0, b"a")
    store.commit_offset("g", "T", 0, 10)
    reads = []
    real = store.get_message

    def counting(*a, **kw):
        reads.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(store, "get_message", counting)
    c = store.consume("g", "T", 0)
    c.STALL_S = LONG_MS / 1000
    out = []
    t = threading.Thread(target=lambda: out.append(list(c)), daemon=True)
    t.start()
    testing.wait_until(lambda: c.stalled, GUARD, "the consumer to stall")
    n = len(reads)
    assert n <= 2               # one read, then a wait: no read loop
    c.close()
    t.join(GUARD)
    assert not t.is_alive() and out == [[]]
    assert c.offset == 10


def test_a_read_only_store_has_no_consumer(tmp_path, backend):
    s = testing.open_store(tmp_path / "s", backend)
    put(s, "T", 0, b"a")
    s.shutdown()
    ro = MessageStore.open_read_only(tmp_path / "s", kernels=backend)
    try:
        with pytest.raises(StoreClosedError, match="read-only"):
            ro.consume("g", "T", 0)
        assert [m.body for m in ro.get_message("g", "T", 0, 0, wait_ms=10).messages] == [b"a"]
    finally:
        ro.shutdown()


# ---- asyncio -------------------------------------------------------------------------------
def run_debug_loop(coro):
    """`coro` on a debug loop that fails the test if a store call that can block ran on the
    loop's thread, or a step stalled the loop (testing.run_guarded_loop)."""
    return testing.run_guarded_loop(asyncio.wait_for(coro, GUARD))


def test_the_loop_guard_catches_a_store_call_made_on_the_loop(store):
    """The check the asyncio tests rely on fails when the loop itself reads the store."""
    async def blocking():
        return store.get_message("g", "T", 0, 0)

    with pytest.raises(AssertionError, match="MessageStore.get_message"):
        run_debug_loop(blocking())
    assert run_debug_loop(_in_executor(store.get_message, "g", "T", 0, 0)) is not None


async def _in_executor(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def test_asyncio_put_and_consume_never_block_the_loop(store):
    n = 200

    async def produce():
        for i in range(n):
            r = await store.aput_message(Message("T", b"%d" % i, queue_id=0))
            assert r.ok

    async def consume():
        got = []
        async with store.aconsume("g", "T", 0, batch_size=16) as c:
            async for batch in c:
                got += [m.body for m in batch]
                if len(got) >= n:
                    break
        return got

    async def main():
        consumer = asyncio.ensure_future(consume())
        await asyncio.sleep(0.01)       # the consumer starts on an empty queue and waits
        await produce()
        return await consumer

    assert run_debug_loop(main()) == [b"%d" % i for i in range(n)]


def test_asyncio_wait_times_out_and_wakes(store):
    async def main():
        r = await store.aget_message("g", "T", 0, 0, wait_ms=20)
        assert r.status is G.NO_MESSAGE_IN_QUEUE
        waiting = asyncio.ensure_future(store.aget_message("g", "T", 0, 0, wait_ms=LONG_MS))
        while not store.arrivals.waiting:
            await asyncio.sleep(0.001)
        await asyncio.get_running_loop().run_in_executor(None, put, store, "T", 0, b"x")
        return await waiting

    r = run_debug_loop(main())
    assert [m.body for m in r.messages] == [b"x"]


def test_asyncio_consumer_ends_on_close_and_on_shutdown(tmp_path, backend):
    s = testing.open_store(tmp_path / "s", backend)

    async def main():
        c = s.aconsume("g", "T", 0)
        task = asyncio.ensure_future(c.__anext__())
        while not s.arrivals.waiting:
            await asyncio.sleep(0.001)
        c.close()
        with pytest.raises(StopAsyncIteration):
            await task
        c2 = s.aconsume("g", "T", 1)
        got = asyncio.ensure_future(_drain(c2))
        while not s.arrivals.waiting:
            await asyncio.sleep(0.001)
        await asyncio.get_running_loop().run_in_executor(None, s.shutdown)
        return await got

    try:
        assert run_debug_loop(main()) == []
    finally:
        s.shutdown()


async def _drain(consumer):
    out = []
    async for batch in consumer:
        out += batch
    return out


def test_the_readmes_asyncio_example_runs_as_written(tmp_path):
    """The README's asyncio consumer, copied from it and run in a fresh interpreter."""
    import os
    import subprocess
    import sys
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = os.path.join(top, "README.md")
    if not os.path.exists(readme):
        pytest.skip("no source tree beside the tests (an installed-wheel run)")
    with open(readme) as f:
        text = f.read()
    section = text[text.index("## Consumers that wait, and asyncio"):]
    code = section[section.index("```python\nimport asyncio\n") + 10:]
    code = code[:code.index("```")].replace("/tmp/async-store", str(tmp_path / "async-store"))
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(testing.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[b'e0', b'e1', b'e2']"

