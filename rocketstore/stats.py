# SPDX-License-Identifier: Apache-2.0
"""Runtime statistics (4.9.8's StoreStatsService) and the runtime file a live store publishes.

Put counters live in one int64 array per CommitLog (`put_cells`), shared by every put path:
the compiled path (pyx/_put.pxi PutPath) writes its cells as plain C integers, the Python
paths index the array. One array, so `lock_time_mills()` and the page-cache-busy check read
one cell whichever path holds the put lock. The put count and bytes are added under the put
lock; the latency histogram after it (under the GIL).

Get counters are per call (found, miss, messages transferred): the read path's common case
counts in its own fields (C integers in the compiled ReadPath), the rest in GetCounters.

StoreStatsService samples the put and get totals once a second and keeps the last 600
samples, so TPS over 10 s, 1 min and 10 min are differences of two samples, as 4.9.8's
CallSnapshot.getTPS computes them. Each second it also rewrites the runtime file
(RUNTIME_FILE, doc/03 §9): a JSON document with the pid and get_runtime_info(), written to
a temporary name and renamed over the old one, so `rocketstore stat` in another process
reads a complete copy without the store's lock. Recovery and verify never read it; the
store removes it on shutdown."""
import array
import collections
import json
import os
import threading
import time

from .clock import system_clock
from .fs import DEFAULT as _FS
from .services.base import ServiceThread

# Cells of CommitLog.put_cells. LOCK_BEGIN is beginTimeInLock: the store time the put lock
# was taken by a put, 0 while no put holds it.
LOCK_BEGIN, PUT_TIMES, PUT_BYTES, PUT_FAILED, PUT_TIME_MAX, PUT_HIST = range(6)

# StoreStatsService.PUT_MESSAGE_ENTIRE_TIME_MAX_DESC: the put-latency buckets (ms).
PUT_LATENCY_BUCKETS = ("[<=0ms]", "[0~10ms]", "[10~50ms]", "[50~100ms]", "[100~200ms]",
                       "[200~500ms]", "[500ms~1s]", "[1~2s]", "[2~3s]", "[3~4s]", "[4~5s]",
                       "[5~10s]", "[10s~]")
# Upper bounds (exclusive) of buckets 1..11, as setPutMessageEntireTimeMax compares.
_BOUNDS_MS = (10, 50, 100, 200, 500, 1000, 2000, 3000, 4000, 5000, 10000)
N_PUT_CELLS = PUT_HIST + len(PUT_LATENCY_BUCKETS)

# isOSPageCacheBusy's guard: a lock "held" longer than this is a stale or bogus begin time.
BUSY_GUARD_MS = 10_000_000

RUNTIME_FILE = "runtime.json"
SAMPLE_INTERVAL_MS = 1000           # StoreStatsService.FREQUENCY_OF_SAMPLING
MAX_SAMPLES = 600                   # MAX_RECORDS_OF_SAMPLING: 10 minutes of samples
TPS_WINDOWS_S = (10, 60, 600)


def new_put_cells():
    return array.array("q", bytes(8 * N_PUT_CELLS))


def latency_bucket(ms):
    """The histogram bucket of a put that took `ms` milliseconds."""
    if ms <= 0:
        return 0
    for i, bound in enumerate(_BOUNDS_MS):
        if ms < bound:
            return i + 1
    return len(_BOUNDS_MS) + 1


def record_put(cells, elapsed_ns, ok):
    """Account one put call (one message, or one batch) that took `elapsed_ns` and answered
    PUT_OK or not (setPutMessageEntireTimeMax and putMessageFailedTimes)."""
    ms = elapsed_ns // 1_000_000
    cells[PUT_HIST + latency_bucket(ms)] += 1
    if ms > cells[PUT_TIME_MAX]:
        cells[PUT_TIME_MAX] = ms
    if not ok:
        cells[PUT_FAILED] += 1


def busy_for(begin, now, timeout_ms):
    """isOSPageCacheBusy: the put lock, taken at store time `begin` (0: not held), has been
    held longer than `timeout_ms` at `now`."""
    if not begin:
        return False
    diff = now - begin
    return timeout_ms < diff < BUSY_GUARD_MS


class GetCounters:
    """getMessageTimesTotalFound / Miss, getMessageTransferedMsgCount and
    getMessageEntireTimeMax. The read path (compiled ReadPath or read_path.PyReadPath)
    counts every call that walks units; the calls answered before that (an offset outside
    the queue, a missing file: MessageStore._read_past_pull) are misses counted here, and
    get_totals adds both. One update per call, never per message. Plain integers under the
    GIL: two calls racing may lose a count, which a rate does not notice."""
    __slots__ = ("found", "miss", "transferred", "time_max")

    def __init__(self):
        self.found = self.miss = self.transferred = self.time_max = 0


def get_totals(g, rp):
    """(found, miss, transferred, longest ms) of every get call so far: the store's
    GetCounters `g` and its read path's own counts `rp`."""
    return (g.found + rp.found, g.miss + rp.miss, g.transferred + rp.transferred,
            max(g.time_max, rp.time_max))


def _tps(samples, field, window):
    """CallSnapshot.getTPS between the last sample and the one `window` samples before it,
    as a string; "" until that many samples exist (as 4.9.8 prints it)."""
    if len(samples) <= window:
        return ""
    last = samples[-1]
    before = samples[-(window + 1)]
    elapsed = last[0] - before[0]
    if elapsed <= 0:
        return ""
    return repr((last[field] - before[field]) / elapsed * 1000.0)


def _tps_text(samples, field):
    return " ".join(_tps(samples, field, w) for w in TPS_WINDOWS_S)


def _format_runtime(ms):
    day, hour, minute = 86_400_000, 3_600_000, 60_000
    return (f"[ {ms // day} days, {ms % day // hour} hours, {ms % hour // minute} minutes, "
            f"{ms % minute // 1000} seconds ]")


class StoreStatsService(ServiceThread):
    """Samples the store's counters once a second and publishes the runtime file.

    It reads the CommitLog's `put_cells`, `get_totals()` (as get_totals returns them), and
    publishes `runtime_info(lock_ms)` (MessageStore.runtime_info) to the runtime file under
    `root`. `lock_time_mills` gives the put lock's hold time; None when the store has an
    injected clock, which this thread must never call (a replay or step clock hands its
    values to the records)."""

    name = "StoreStatsService"

    def __init__(self, root, put_cells, get_totals, runtime_info, lock_time_mills=None):
        super().__init__()
        self._root = root
        self._cells = put_cells
        self._get_totals = get_totals
        self._runtime_info = runtime_info
        self._lock_time_mills = lock_time_mills
        self._lock = threading.Lock()
        # (monotonic ms, puts, found, miss, found + miss, transferred)
        self._samples = collections.deque(maxlen=MAX_SAMPLES + 1)
        # Wall time, never the store clock: a replay clock's values are the records' own.
        self.boot_timestamp = system_clock()
        self.publish_errors = 0

    def sample(self, now_ms=None):
        """Take one sample (the thread does, once a second; tests pass `now_ms`)."""
        found, miss, transferred, _ = self._get_totals()
        row = (time.monotonic_ns() // 1_000_000 if now_ms is None else now_ms,
               self._cells[PUT_TIMES], found, miss, found + miss, transferred)
        with self._lock:
            self._samples.append(row)

    def runtime_info(self):
        """StoreStatsService.getRuntimeInfo: its keys, with its string values."""
        cells = self._cells
        get_max = self._get_totals()[3]
        with self._lock:
            samples = list(self._samples)
        total = cells[PUT_TIMES] or 1
        size = cells[PUT_BYTES]
        hist = " ".join(f"{name}:{cells[PUT_HIST + i]}"
                        for i, name in enumerate(PUT_LATENCY_BUCKETS))
        return {
            "bootTimestamp": str(self.boot_timestamp),
            "runtime": _format_runtime(system_clock() - self.boot_timestamp),
            "putMessageEntireTimeMax": str(cells[PUT_TIME_MAX]),
            "putMessageTimesTotal": str(total),
            "putMessageFailedTimes": str(cells[PUT_FAILED]),
            "putMessageSizeTotal": str(size),
            "putMessageDistributeTime": hist + " ",
            "putMessageAverageSize": repr(size / total),
            "dispatchMaxBuffer": "0",
            "getMessageEntireTimeMax": str(get_max),
            "putTps": _tps_text(samples, 1),
            "getFoundTps": _tps_text(samples, 2),
            "getMissTps": _tps_text(samples, 3),
            "getTotalTps": _tps_text(samples, 4),
            "getTransferedTps": _tps_text(samples, 5),
        }

    def publish(self):
        """Rewrite the runtime file: temporary name, then rename, so a reader never sees
        half of one. Errors are counted and logged by the loop, never raised into a put."""
        # The lock time needs the store clock: only the system clock is read from here (an
        # injected one stamps records, and a call from this thread would take a value).
        lock_ms = self._lock_time_mills() if self._lock_time_mills is not None else None
        doc = {"pid": os.getpid(), "writtenAt": system_clock(),
               "runtimeInfo": self._runtime_info(lock_ms)}
        path = os.path.join(self._root, RUNTIME_FILE)
        tmp = path + ".tmp"
        # The real file system, not the store's (a test's fault-injecting double): the
        # runtime file is no store data, and must not take a fault meant for a store file.
        _FS.write_bytes(tmp, json.dumps(doc, sort_keys=True).encode(), sync=False)
        _FS.rename(tmp, path)

    def run_once(self):
        self.wait_for_running(SAMPLE_INTERVAL_MS)
        if self.is_stopped:
            return
        self.sample()
        try:
            self.publish()
        except OSError:
            self.publish_errors += 1        # a full disk: the next second tries again

    def on_shutdown(self):
        root = self._root
        _FS.remove(os.path.join(root, RUNTIME_FILE))
        _FS.remove(os.path.join(root, RUNTIME_FILE + ".tmp"))


def read_runtime_file(root):
    """The runtime document a live store at `root` publishes, or None when there is none
    (not running, or a store that predates it). A reader, for `rocketstore stat`."""
    try:
        with open(os.path.join(root, RUNTIME_FILE), "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def prometheus_collector(store):
    """A prometheus_client collector of the store's runtime statistics: register it with
    `prometheus_client.REGISTRY.register(prometheus_collector(store))`. Needs the optional
    extra `rocketstore[prometheus]`. It reads MessageStore.metrics() at each scrape."""
    try:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    except ImportError:
        raise ImportError("metrics export needs prometheus_client: "
                          "pip install 'rocketstore[prometheus]'") from None

    class _Collector:
        def collect(self):
            m = store.metrics()
            yield CounterMetricFamily("rocketstore_put_messages", "messages put",
                                      value=m["put_messages"])
            yield CounterMetricFamily("rocketstore_put_bytes", "record bytes put",
                                      value=m["put_bytes"])
            yield CounterMetricFamily("rocketstore_put_failed", "put calls not PUT_OK",
                                      value=m["put_failed"])
            hist = CounterMetricFamily("rocketstore_put_latency", "put calls by latency",
                                       labels=["bucket"])
            for name, count in m["put_latency"].items():
                hist.add_metric([name], count)
            yield hist
            gets = CounterMetricFamily("rocketstore_get_calls", "get calls by outcome",
                                       labels=["outcome"])
            gets.add_metric(["found"], m["get_found"])
            gets.add_metric(["miss"], m["get_miss"])
            yield gets
            yield CounterMetricFamily("rocketstore_get_transferred", "messages returned",
                                      value=m["get_transferred"])
            yield GaugeMetricFamily("rocketstore_dispatch_behind_bytes",
                                    "CommitLog bytes not yet dispatched",
                                    value=m["dispatch_behind_bytes"])
            if m["lock_time_ms"] is not None:   # never an injected clock (see publish)
                yield GaugeMetricFamily("rocketstore_page_cache_lock_time_ms",
                                        "how long the current put has held the put lock",
                                        value=m["lock_time_ms"])

    return _Collector()
