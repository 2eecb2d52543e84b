# SPDX-License-Identifier: Apache-2.0
"""Consumers that wait (RocketMQ's long polling: PullRequestHoldService woken by the
MessageArrivingListener), a consumer iterator that commits as it goes, and their asyncio
counterparts.

How a wait works: the waiter registers a wake-up under its queue's key (the topic's 32-bit
FNV-1a hash, the one commitlog_scan puts in every row, and the queue id), then reads; if the
queue has nothing at the offset it sleeps on a threading.Event (or an asyncio.Event), which
releases the GIL and holds no store lock. The reput dispatch, after each batch of units it
wrote, wakes the waiters of the keys in that batch only (Arrivals.notify), so a put to another
queue wakes nobody (two topics sharing a hash cost a spurious wake and a re-read, no more).
Registering before reading is what makes a wake-up impossible to miss: a batch dispatched
after the registration sets the event, one dispatched before it is seen by the read.

A store whose `poll_backoff` is not None (live.LiveReader: the writer is another process, so
nothing here dispatches) has no wake-up to wait for: its waits read again after a backoff
that starts at poll_backoff[0] s and doubles up to poll_backoff[1] s; an asyncio wait runs
that loop in the executor, a slice at a time.

Shutdown wakes every waiter: a wait then raises StoreClosedError (as every method of a
shut-down store does); a Consumer / AsyncConsumer iteration simply ends.
"""
import asyncio
import logging
import threading
import time

import numpy as np

from .errors import InvalidArgumentError, StoreClosedError
from .kernels.pure import _topic_hash      # the rows' topic_hash (rs_scan_rec), in Python
from .message import keep_stored
from .status import GetMessageStatus as G

log = logging.getLogger(__name__)

# Answers that mean "nothing at this offset yet": a wait goes on after them. Any other empty
# answer (an offset below the queue's minimum or far past its maximum) returns at once: only
# the caller can decide where to read from instead.
_NOTHING_YET = frozenset((G.NO_MESSAGE_IN_QUEUE, G.OFFSET_OVERFLOW_ONE,
                          G.NO_MATCHED_LOGIC_QUEUE))
_MASK32 = 0xFFFFFFFF
# Batches up to this many rows get their keys in Python; longer ones through numpy.
_SMALL_BATCH = 64


def queue_key(topic, queue_id):
    """The key a queue's waiters are registered under: the dispatched rows' (topic_hash,
    queue_id) packed in one int."""
    return (_topic_hash(topic.encode("utf-8")) << 32) | (queue_id & _MASK32)


class Arrivals:
    """Who waits on which queue. register() and unregister() come from waiting threads (or an
    event loop), notify() from the thread that dispatched a batch (reput, or a reader catching
    up), close() from shutdown. A wake-up is any callable that does not block."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_key = {}           # key -> [wake, ...]
        self.closed = False
        # Called with True when the first wait registers and False when the last one goes
        # (under the lock, so calls never reorder): the store makes puts wake reput then.
        self.on_waiting = None

    def open(self):
        self.closed = False

    def register(self, key, wake):
        with self._lock:
            if self.closed:
                raise StoreClosedError("the store is shutting down")
            first = not self._by_key
            self._by_key.setdefault(key, []).append(wake)
            if first and self.on_waiting is not None:
                self.on_waiting(True)

    def unregister(self, key, wake):
        with self._lock:
            wakes = self._by_key.get(key)
            if wakes is not None:
                try:
                    wakes.remove(wake)
                except ValueError:
                    pass
                if not wakes:
                    del self._by_key[key]
                    if not self._by_key and self.on_waiting is not None:
                        self.on_waiting(False)

    @property
    def waiting(self):
        """True while any wait is registered (read by the dispatcher without the lock: a
        waiter that registers after a batch was written reads that batch itself)."""
        return bool(self._by_key)

    def notify(self, rows):
        """Wake the waiters of every queue that `rows` (format.SCAN_DTYPE, just dispatched)
        gave a unit to. Costs one dict test while nobody waits."""
        by_key = self._by_key
        if not by_key or not len(rows):
            return
        hashes, qids = rows["topic_hash"], rows["queue_id"]
        if len(rows) <= _SMALL_BATCH:
            keys = {(h << 32) | (q & _MASK32) for h, q in zip(hashes.tolist(), qids.tolist())}
        else:
            packed = (hashes.astype(np.int64) << 32) | (qids.astype(np.int64) & _MASK32)
            keys = set(np.unique(packed).tolist())
        with self._lock:
            wakes = [w for k in keys & by_key.keys() for w in by_key[k]]
        _call_all(wakes)

    def close(self):
        """Shutdown: refuse new waits and wake every waiter."""
        with self._lock:
            self.closed = True
            self.on_waiting = None
            wakes = [w for ws in self._by_key.values() for w in ws]
        _call_all(wakes)


class PutWake:
    """CommitLog.wake_on_put while consumers wait (or reput is idle): a put wakes the reput
    service as well as what it woke before (`inner`, None when nothing was woken), so the put
    is dispatched, and its waiters woken, at once rather than at reput's next 1 ms cycle.
    `written_end()` is the CommitLog's written end: `inner` is woken, as by the plain hook,
    only once the records reach its own mark (`inner.wake_from`: the flusher's least pages),
    not by every put."""

    # Read by the compiled put path before each wakeup(): never set, so every put calls it;
    # wakeup() itself skips the services already notified.
    has_notified = False
    # Every put wakes reput, whatever the flusher's own mark.
    wake_from = 0

    def __init__(self, inner, reput, written_end):
        self.inner = inner
        self.reput = reput
        self._written_end = written_end
        # What wakeup() wakes, in its order, for the compiled put path: it reads each one's
        # wake_cell and calls its wakeup() itself, as wakeup() below decides (reput's own
        # mark is 0), without this object's Python frame (pyx/_put.pxi, PutPath._wake).
        self.services = (reput,) if inner is None else (inner, reput)

    def wakeup(self):
        inner = self.inner
        if (inner is not None and not inner.has_notified
                and (not inner.wake_from or self._written_end() >= inner.wake_from)):
            inner.wakeup()
        reput = self.reput
        if not reput.has_notified:
            reput.wakeup()


def _call_all(wakes):
    for wake in wakes:
        try:
            wake()
        except Exception:       # a waiter's loop closed under it: the others still wake
            log.debug("wake-up failed", exc_info=True)


def check_wait_ms(wait_ms, allow_none=False):
    if wait_ms is None and allow_none:
        return
    if type(wait_ms) is not int or wait_ms < 0:
        raise InvalidArgumentError(f"wait_ms must be an int >= 0"
                                   f"{' or None' if allow_none else ''}, got {wait_ms!r}")


def _settle(read, r, offset):
    """Step over units a filter left out: (answer, offset it was read at). A
    NO_MATCHED_MESSAGE answer moved next_begin_offset past them; read on from there, so an
    empty answer means the end of the queue, not the end of one scan."""
    while r.status is G.NO_MATCHED_MESSAGE and r.next_begin_offset > offset:
        offset = r.next_begin_offset
        r = read(offset)
    return r, offset


def _waitable(r):
    return not r.messages and r.status in _NOTHING_YET


class _Cancel:
    """A wait another thread may end early (Consumer.close): `wake` is the registered
    wake-up of the wait under way, `event` is set on close for a stalled consumer."""
    __slots__ = ("cancelled", "wake", "event")

    def __init__(self):
        self.cancelled = False
        self.wake = None
        self.event = threading.Event()


def _reader(store, group, topic, queue_id, max_msg_nums, message_filter, subscription,
            property_filter):
    """read(offset): one get_message of the wait. The filters go as keywords only when set:
    a reader without tag subscriptions (live.LiveReader) takes the waits too."""
    if subscription is None and property_filter is None:
        def read(at):
            return store.get_message(group, topic, queue_id, at, max_msg_nums, message_filter)
    else:
        def read(at):
            return store.get_message(group, topic, queue_id, at, max_msg_nums, message_filter,
                                     subscription=subscription, property_filter=property_filter)
    return read


def wait_for_message(store, group, topic, queue_id, offset, max_msg_nums, message_filter,
                     wait_ms, cancel=None, *, subscription=None, property_filter=None):
    """get_message that waits up to `wait_ms` ms (None: until a message, or `cancel`) for the
    queue to have a message at `offset` (one `message_filter` accepts). Returns the answer
    that had messages, or what get_message answers when the time is up (or the wait was
    cancelled, or the answer can never change by waiting: an offset out of range). Raises
    StoreClosedError when the store shuts down meanwhile. `subscription` and
    `property_filter` filter as get_message's."""
    read = _reader(store, group, topic, queue_id, max_msg_nums, message_filter, subscription,
                   property_filter)

    r, offset = _settle(read, read(offset), offset)     # the common case: no wait at all
    if not _waitable(r) or wait_ms == 0:
        return r
    deadline = None if wait_ms is None else time.monotonic() + wait_ms / 1000.0
    arrivals = store.arrivals
    poll = store.poll_backoff
    step = poll[0] if poll is not None else None
    key = queue_key(topic, queue_id)
    event = threading.Event()
    wake = event.set
    arrivals.register(key, wake)
    if cancel is not None:
        cancel.wake = wake
    try:
        while True:
            event.clear()           # before the read: a unit dispatched after it sets it again
            r, offset = _settle(read, read(offset), offset)
            if not _waitable(r) or (cancel is not None and cancel.cancelled):
                return r
            timeout = None
            if deadline is not None:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    return r
            if poll is not None:
                # No dispatch in this process wakes the wait (a LiveReader): read again
                # after a short backoff; close() still wakes it at once.
                timeout = step if timeout is None else min(timeout, step)
                step = min(2 * step, poll[1])
            event.wait(timeout)
            if arrivals.closed:
                raise StoreClosedError("the store shut down while waiting for a message")
    finally:
        if cancel is not None:
            cancel.wake = None
        arrivals.unregister(key, wake)


async def await_message(store, group, topic, queue_id, offset, max_msg_nums, message_filter,
                        wait_ms, cancel=None, *, subscription=None, property_filter=None):
    """wait_for_message for asyncio: each read runs in the loop's default executor (a read
    may wait for the reput lock or fault a page in from disk), the wait itself is an
    asyncio.Event set from the dispatching thread through call_soon_threadsafe."""
    loop = asyncio.get_running_loop()
    read = _reader(store, group, topic, queue_id, max_msg_nums, message_filter, subscription,
                   property_filter)

    def read_settled(at):
        return _settle(read, read(at), at)

    r, offset = await loop.run_in_executor(None, read_settled, offset)
    if not _waitable(r) or wait_ms == 0:
        return r
    deadline = None if wait_ms is None else loop.time() + wait_ms / 1000.0
    if store.poll_backoff is not None:
        return await _await_polling(store, group, topic, queue_id, offset, max_msg_nums,
                                    message_filter, deadline, cancel)
    arrivals = store.arrivals
    key = queue_key(topic, queue_id)
    event = asyncio.Event()

    def wake():
        loop.call_soon_threadsafe(event.set)

    arrivals.register(key, wake)
    if cancel is not None:
        cancel.wake = wake
    try:
        while True:
            event.clear()
            r, offset = await loop.run_in_executor(None, read_settled, offset)
            if not _waitable(r) or (cancel is not None and cancel.cancelled):
                return r
            timeout = None if deadline is None else deadline - loop.time()
            if timeout is not None and timeout <= 0:
                return r
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            if arrivals.closed:
                raise StoreClosedError("the store shut down while waiting for a message")
    finally:
        if cancel is not None:
            cancel.wake = None
        arrivals.unregister(key, wake)


# A polling wait (await_message on a store with poll_backoff) runs in the executor in slices
# of this many ms: the loop then runs a step per slice, not one per check, and a cancelled
# task leaves its thread polling no longer than this.
_POLL_SLICE_MS = 100


async def _await_polling(store, group, topic, queue_id, offset, max_msg_nums, message_filter,
                         deadline, cancel):
    """await_message where no dispatch wakes a wait: wait_for_message's polling loop, in the
    loop's default executor, a slice at a time until `deadline` (loop time; None: none)."""
    loop = asyncio.get_running_loop()
    while True:
        left = _POLL_SLICE_MS if deadline is None else \
            max(0, min(_POLL_SLICE_MS, int((deadline - loop.time()) * 1000)))
        r = await loop.run_in_executor(None, wait_for_message, store, group, topic, queue_id,
                                       offset, max_msg_nums, message_filter, left, cancel)
        if not _waitable(r) or left == 0 or (cancel is not None and cancel.cancelled):
            return r
        # Units a filter left out were stepped over: go on from behind them.
        offset = max(offset, r.next_begin_offset)


class _Cursor:
    """A consumer's position on a group/topic/queue, and its commit rule: a batch's end is
    committed when the caller asks for the next batch (it has then processed this one), so a
    crash or close() before that delivers the batch again (at least once). With `decompress`
    false, compressed bodies are handed out as stored (get_message's decompress)."""

    def __init__(self, store, group, topic, queue_id, batch_size, message_filter, *,
                 decompress=True, subscription=None, property_filter=None):
        store.check_open()
        if store.read_only and store.poll_backoff is None:
            # It could neither commit nor be woken: nothing dispatches in a read-only store
            # (a LiveReader, which polls and keeps its own offsets, can).
            raise StoreClosedError("a read-only store has no consumers (it keeps no consumer "
                                   "offsets and dispatches nothing): read it with get_message")
        from .arguments import check_callable, check_int, check_queue, check_str
        from .read_path import MAX_MSG_NUMS
        check_str(group, "group")
        check_queue(topic, queue_id)
        check_int(batch_size, "batch_size", 1, MAX_MSG_NUMS)
        check_callable(message_filter, "message_filter")
        from .subscription import read_filters
        # Parsed once for the consumer's life, as a broker keeps a group's SubscriptionData.
        self.subscription, self.property_filter = read_filters(subscription, property_filter)
        self.store = store
        self.group, self.topic, self.queue_id = group, topic, queue_id
        self.batch_size = batch_size
        self.message_filter = message_filter
        self.decompress = decompress
        committed = store.query_offset(group, topic, queue_id)
        # Never committed: from the queue's oldest message (CONSUME_FROM_FIRST_OFFSET).
        self.offset = committed if committed >= 0 else \
            store.get_min_offset_in_queue(topic, queue_id)
        self._pending = None        # the end of the batch handed out, not yet committed
        self.stalled = False
        self._cancel = _Cancel()

    @property
    def closed(self):
        return self._cancel.cancelled

    def commit(self):
        """Commit the batch handed out last now (as asking for the next batch would)."""
        if self._pending is not None:
            self.store.commit_offset(self.group, self.topic, self.queue_id, self._pending)
            self._pending = None

    def _before_read(self):
        """False when iteration must end: closed, or the store shut down."""
        if self._cancel.cancelled:
            return False
        try:
            self.commit()
        except StoreClosedError:
            if self.store.arrivals.closed or not self.store.loaded:
                return False        # the store shut down: the iteration ends
            raise
        return True

    # How long a consumer stuck at an offset out of range waits before it reads again.
    STALL_S = 1.0

    def _take(self, r):
        """The messages of answer `r` to hand out, or None to read again; moves the offset.
        Sets self.stalled when reading again at once would answer the same."""
        self.stalled = False
        if r.messages:
            self.offset = self._pending = r.next_begin_offset
            return r.messages if self.decompress else keep_stored(r.messages)
        if r.status in _NOTHING_YET:
            if r.next_begin_offset > self.offset:
                # Units the filter left out: consumed as far as this group is concerned.
                self.offset = self._pending = r.next_begin_offset
        elif r.next_begin_offset != self.offset:
            # Below the queue's minimum (expired files) or past its maximum (the queue was
            # recreated): go where the store says, as a broker's PULL_OFFSET_MOVED does.
            log.warning("consumer %s on %s/%d: %s at offset %d, moving to %d", self.group,
                        self.topic, self.queue_id, r.status.name, self.offset,
                        r.next_begin_offset)
            self.offset = self._pending = r.next_begin_offset
        else:
            # Out of range and not corrected (a slave with offset_check_in_slave off): no
            # dispatch will change the answer, so wait a while, not spin.
            log.warning("consumer %s on %s/%d: %s at offset %d; reading again in %.0f s",
                        self.group, self.topic, self.queue_id, r.status.name, self.offset,
                        self.STALL_S)
            self.stalled = True
        return None

    def _cancel_wait(self):
        c = self._cancel
        c.cancelled = True
        c.event.set()
        wake = c.wake
        if wake is not None:
            wake()


class Consumer(_Cursor):
    """Iterate a queue for a group: `for messages in store.consume(group, topic, queue_id):`
    yields lists of MessageExt (up to `batch_size`), waiting as long as it takes for the next
    one. It starts at the group's committed offset (the queue's minimum when there is none),
    and commits the end of a batch when the next one is asked for, or on commit(). close()
    (from any thread, or leaving a `with` block) ends the iteration, waking a waiting
    __next__; the batch handed out last is then not committed unless commit() was called.
    A store shutdown ends the iteration too."""

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.next_batch(None)
        if batch is None:
            raise StopIteration
        return batch

    def next_batch(self, wait_ms=None):
        """The next batch, or None when `wait_ms` passed with nothing (None: wait until a
        message or close) or the consumer is closed."""
        check_wait_ms(wait_ms, allow_none=True)
        deadline = None if wait_ms is None else time.monotonic() + wait_ms / 1000.0
        while self._before_read():
            left = None if deadline is None else \
                max(0, int((deadline - time.monotonic()) * 1000))
            try:
                r = wait_for_message(self.store, self.group, self.topic, self.queue_id,
                                     self.offset, self.batch_size, self.message_filter, left,
                                     self._cancel, subscription=self.subscription,
                                     property_filter=self.property_filter)
            except StoreClosedError:
                return None
            batch = self._take(r)
            if batch is not None:
                return batch
            if self.stalled:
                self._cancel.event.wait(self.STALL_S if deadline is None else
                                        max(0.0, min(self.STALL_S,
                                                     deadline - time.monotonic())))
            if deadline is not None and time.monotonic() >= deadline:
                return None
        return None

    def close(self):
        self._cancel_wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncConsumer(_Cursor):
    """Consumer for asyncio: `async for messages in store.aconsume(group, topic, queue_id):`,
    or `async with store.aconsume(...) as c:`. The same offsets and commit rule; the reads
    and commits run in the loop's default executor, so the event loop never blocks."""

    def __aiter__(self):
        return self

    async def __anext__(self):
        loop = asyncio.get_running_loop()
        while True:
            if not await loop.run_in_executor(None, self._before_read):
                raise StopAsyncIteration
            try:
                r = await await_message(self.store, self.group, self.topic, self.queue_id,
                                        self.offset, self.batch_size, self.message_filter,
                                        None, self._cancel, subscription=self.subscription,
                                        property_filter=self.property_filter)
            except StoreClosedError:
                raise StopAsyncIteration from None
            batch = self._take(r)
            if batch is not None:
                return batch
            if self.stalled:
                await loop.run_in_executor(None, self._cancel.event.wait, self.STALL_S)

    def close(self):
        """End the iteration; callable from the loop or any thread (the wake-up goes
        through call_soon_threadsafe)."""
        self._cancel_wait()

    async def aclose(self):
        self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()
