# SPDX-License-Identifier: Apache-2.0
"""Time sources. A store takes any callable returning epoch milliseconds, so tests and
replays can stamp records with exact, reproducible store timestamps."""
import itertools
import time


def system_clock():
    """Wall-clock epoch milliseconds (System.currentTimeMillis)."""
    return time.time_ns() // 1_000_000


def monotonic_ms():
    """Milliseconds of a clock that never goes back, for intervals and timeouts (never stored)."""
    return time.monotonic_ns() // 1_000_000


def monotonic_ns():
    """monotonic_ms in nanoseconds, for intervals shorter than a millisecond."""
    return time.monotonic_ns()


class StepClock:
    """start, start+step, start+2*step, ... one value per call: deterministic timestamps."""

    def __init__(self, start=1_700_000_000_000, step=1):
        self._it = itertools.count(start, step)

    def __call__(self):
        return next(self._it)


class ManualClock:
    """A clock that stands still until its owner moves it (`clock.now += 1000`): what is due,
    expired or stale is then decided by the caller, not by the machine's speed."""

    def __init__(self, now=1_700_000_000_000):
        self.now = now

    def __call__(self):
        return self.now


class ReplayClock:
    """Hands out a recorded sequence of store timestamps, one per put call (a broker replay)."""

    def __init__(self, timestamps):
        self._it = iter(timestamps)
        self._last = 0

    def __call__(self):
        self._last = next(self._it, self._last)
        return self._last
