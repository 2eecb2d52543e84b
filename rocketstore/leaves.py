# SPDX-License-Identifier: Apache-2.0
"""The locks, conditions, int64 cells and mmaps the store keeps for each queue and each file,
made so that CPython's cyclic garbage collector does not track them.

A full collection walks every object the collector tracks, with the GIL held throughout:
nothing else in the process runs meanwhile. A store kept about 22 tracked objects per
ConsumeQueue, 15 of them these: each file's three locks and condition, each queue's lock and
condition (a condition brings a waiter deque and two bound methods of its lock), the int64
arrays the compiled dispatcher publishes positions into, and, with the backends that map
files with Python's mmap, each file's mmap object. A full collection of a store of 10 000
queues took 95 ms with them tracked, 59 without (doc/performance.md, "A full collection in
the flush round").

None of them can be part of a reference cycle: a lock, an mmap and an array refer to no
object, a bound method of a lock to the lock, a condition to its lock, those methods and its
deque, and the deque to the locks of waiting threads. Reference counting alone frees them,
and the collector could find no garbage in them. Only objects of those types are untracked;
anything else is left as it is. Without the compiled backend (the helper is in `_cext`)
they stay tracked, as any object."""
import functools
import mmap
import threading
from array import array
from collections import deque
from types import BuiltinMethodType

_LOCK_TYPE = type(threading.Lock())
# What threading.Condition makes for a Lock: its waiter deque and the lock's bound methods.
_CONDITION_PARTS = ("_waiters", "acquire", "release")


def _keep(obj):
    pass


@functools.cache
def _untracker():
    """The compiled helper, or _keep without the compiled backend. Imported at the first
    use, not with this module: fs imports this module while the package is still being
    imported, before the compiled backend can be."""
    try:
        from .kernels._cext import _untrack_gc
    except ImportError:
        return _keep
    return _untrack_gc


def untracks():
    """Whether the objects made here are untracked (the compiled backend is there)."""
    return _untracker() is not _keep


def _untrack(obj):
    _untracker()(obj)
    return obj


def lock():
    """A threading.Lock the collector does not track."""
    return _untrack(threading.Lock())


def condition(lock):
    """A threading.Condition on `lock` (one made by lock() above), which the collector does
    not track, nor the parts it made: its waiter deque and its bound methods of the lock."""
    cond = threading.Condition(lock)
    # By name, not vars(cond): that would give the instance a __dict__ of its own, one more
    # tracked object.
    for name in _CONDITION_PARTS:
        part = getattr(cond, name, None)
        if type(part) is deque or (type(part) is BuiltinMethodType
                                   and type(part.__self__) is _LOCK_TYPE):
            _untrack(part)
    return _untrack(cond)


def cells(values):
    """An int64 array of `values` the collector does not track."""
    return _untrack(array("q", values))


def mapping(mm):
    """`mm`, an mmap.mmap, no longer tracked by the collector (the Python-mmap backends map
    each file with one)."""
    if type(mm) is mmap.mmap:
        _untrack(mm)
    return mm
