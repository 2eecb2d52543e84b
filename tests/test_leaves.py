# SPDX-License-Identifier: Apache-2.0
"""The locks, conditions and cells a store keeps per queue and per file are not tracked by
the cyclic garbage collector (rocketstore/leaves.py), so a full collection walks a few
objects per queue, not twenty, and they still work and are freed as before."""
import gc
import threading
import weakref

import pytest

from rocketstore import Message, leaves, testing

needs_compiled = pytest.mark.skipif(not leaves.untracks(),
                                    reason="no compiled backend to untrack with")


def _queue_objects(store):
    """Every lock, condition (and its parts), cell and mapping of the store's queues and
    files."""
    for queues in store.consume_queue_table.values():
        for cq in queues.values():
            mfq = cq.mfq
            yield cq._cell
            yield from (mfq._lock, mfq._made, mfq._made._waiters, mfq._made.acquire)
            for f in mfq.files:
                yield from (f._cell, f._lock, f._reserve_lock, f._commit_lock, f._cond,
                            f._cond._waiters, f._cond.acquire, f._cond.release, f.mm)


def _tracked_count():
    gc.collect()
    return len(gc.get_objects())


@needs_compiled
def test_no_lock_condition_cell_or_mapping_of_a_queue_is_tracked_by_the_collector(
        tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend)
    try:
        assert store.put_messages([Message(f"T{t}", b"x", queue_id=q)
                                   for t in range(3) for q in range(2)]).status.ok
        testing.wait_dispatched(store)
        objects = list(_queue_objects(store))
        assert len(objects) == 6 * (5 + 9)     # six queues of one file each
        assert not [o for o in objects if gc.is_tracked(o)]
        # The CommitLog's files too (MappedFile makes them the same way).
        f = store.commitlog.mfq.files[0]
        assert not any(gc.is_tracked(o) for o in (f._lock, f._cond, f._reserve_lock, f.mm))
    finally:
        store.shutdown()


@needs_compiled
def test_a_queue_costs_a_full_collection_a_few_objects(tmp_path, backend):
    # 22 a queue of one file before, 7 after: a full collection of 10 000 queues took 95 ms,
    # 59 after. Here each queue also has its next file made ahead (about 9 after, 30 before).
    store = testing.open_store(tmp_path / "s", backend)
    try:
        before = _tracked_count()
        n = 100
        assert store.put_messages([Message(f"T{q // 4}", b"x", queue_id=q % 4)
                                   for q in range(n)]).status.ok
        testing.wait_dispatched(store)
        assert _tracked_count() - before <= 12 * n
    finally:
        store.shutdown()


def test_an_untracked_condition_wakes_its_waiter_and_is_freed_by_reference_counting():
    cond = leaves.condition(leaves.lock())
    woke = []
    ready = []

    def wait(c):
        with c:
            woke.append(c.wait_for(lambda: bool(ready), timeout=10))
    t = threading.Thread(target=wait, args=(cond,))
    t.start()
    with cond:
        ready.append(True)
        cond.notify_all()
    t.join(10)
    assert woke == [True]
    gone = weakref.ref(cond)
    del cond
    assert gone() is None           # not left for a collection that would never see it
