# SPDX-License-Identifier: Apache-2.0
"""Sustained writes beyond the page cache's dirty budget (issue "11 · Speed I"): cext,
ASYNC_FLUSH, put_batch of 1000 bodies of 128 B with tags and keys, for
ROCKETSTORE_SUSTAINED_SECONDS (default 60), against the disk's own `pwrite + fdatasync`
bandwidth measured first in the same run, on the same file system.

    python -m pytest bench/bench_sustained.py --benchmark-only -s -q

Two stores, one after the other: "mapped" (the default: puts write into the CommitLog's
mapping, which the allocator populates ahead) and "transient_pool" (transientStorePoolEnable:
puts write into pooled buffers, which a commit thread writes into the file with pwrite every
200 ms); `-k mapped` or `-k transient_pool` runs one.

It reports (on the terminal and in extra_info): the page cache's dirty budget and how it was
computed, the disk ceiling, the store's MB/s of CommitLog bytes and its ratio to the ceiling,
whether the run wrote past the dirty budget, the put latency p50 / p99 / p99.9 / max, the
putting thread's page faults (in all, puts with any, puts with FAULTED_PUT or more: those wrote
past the pages the allocator had populated), and every
put slower than 50 ms with what overlapped it: file-system calls of the store's threads (block
reservation, prefault, msync, file creation), a CommitLog file roll inside the put, and the
Dirty / Writeback page counts of /proc/meminfo at the time, and the host's steal time on each
CPU around it (time the hypervisor gave the virtual CPUs to other guests: the putter's own
clocks count it as its CPU time).

What fresh memory costs on the machine: the first write to 256 MiB of new anonymous memory
(GB/s, before the disk probe), and the guest's free page reporting (virtio-balloon: its order,
and how much freed memory the guest handed back to the host during the run). Where the host
backs handed-back memory again only on its next use, each page-cache page the store fills
costs that first touch: on the 2-core VM this ran at 0.35-0.7 GB/s, against 6-20 GB/s for
memory the host still backed, and dominated the allocator's CPU and the runs' stalls
(doc/performance.md, "Memory the host backs again").

The heap pytest and the setup built is frozen (gc.freeze) for the run, as a latency-sensitive
application does; the garbage collector's runs during it are reported.

Where the putting thread's time went, by the kernel's schedstat: on a CPU, runnable but waiting
for one (other threads had both: of this process, or of other sessions, which the scheduler's
autogroups serve first, each its fair share), or asleep (the GIL, a page lock, I/O). In all and
per stalled put, with every thread's CPU time over the run. For who had the CPUs meanwhile,
take a scheduler trace of the run and read it with bench/stall_trace.py (its docstring says how).

A run writes up to the dirty budget plus SECONDS x 2.5 times the probe's bandwidth (tens of GB
for the default), and stops there. Where a quarter more than that is not free, the store keeps
within a store_size_budget of what the disk has room for, deleting its oldest files as it
writes (a cleaning round a second; store_size_budget_bytes and deleted_commitlog_bytes say so),
and the read-back checks the messages kept; it skips, saying why, where that budget would be
under twice the dirty budget. Not run by CI (.ci/run runs tests/ only);
ROCKETSTORE_SUSTAINED_SECONDS=5 is a quick check of the harness.

Knobs: ROCKETSTORE_SUSTAINED_SECONDS, ROCKETSTORE_SUSTAINED_PROBE_MB (bytes the disk probe
writes, default 4096), ROCKETSTORE_SUSTAINED_BATCH (messages per put_batch, default 1000),
ROCKETSTORE_SUSTAINED_DROP_COLD=0 (StoreConfig.drop_cold_commit_log_cache off: the kernel
alone decides what the page cache keeps), ROCKETSTORE_SUSTAINED_DISPATCH_LAG=<bytes>
(StoreConfig.dispatch_in_put_lag: the reput thread dispatches until it is that far behind),
ROCKETSTORE_SUSTAINED_SAMPLERS=0 (no sampling
threads: no Dirty/Writeback, steal or kernel stacks in the report).
"""
import bisect
import gc
import os
import resource
import shutil
import threading
import time

import pytest

from rocketstore import Message, MessageStore, StoreConfig, testing
from rocketstore.fs import FileSystem
from rocketstore.workload import (check_puts, check_read_back, commitlog_bytes,
                                 make_messages)

MIB = 1 << 20
GIB = 1 << 30
SECONDS = float(os.environ.get("ROCKETSTORE_SUSTAINED_SECONDS", "60"))
PROBE_BYTES = int(os.environ.get("ROCKETSTORE_SUSTAINED_PROBE_MB", "4096")) * MIB
BATCH = int(os.environ.get("ROCKETSTORE_SUSTAINED_BATCH", "1000"))
# StoreConfig.drop_cold_commit_log_cache (on by default): 0 leaves the page cache to the kernel.
DROP_COLD = os.environ.get("ROCKETSTORE_SUSTAINED_DROP_COLD", "1") != "0"
# StoreConfig.dispatch_in_put_lag (0 by default: each put dispatches what it wrote); a lag in
# bytes leaves the ConsumeQueue units and index keys to the reput thread, as a Java broker
# does, until it falls that far behind.
DISPATCH_LAG = int(os.environ.get("ROCKETSTORE_SUSTAINED_DISPATCH_LAG", "0"))
# The two sampling threads (meminfo and steal every 10 ms, the putter's kernel stack every
# 5 ms) take the GIL at each sample: 0 runs without them, and without what they explain.
SAMPLERS = os.environ.get("ROCKETSTORE_SUSTAINED_SAMPLERS", "1") != "0"
PROBE_WRITE = 4 * MIB          # one pwrite
PROBE_SYNC_EVERY = 64 * MIB    # one fdatasync per this many bytes
STALL_NS = 50_000_000
# The run stops after this many times the CommitLog bytes the disk probe's pace allows.
CAP_OVER_PROBE = 2.5
# Where the disk cannot hold a whole run: the store's cleaning period (clean_resource_interval).
CLEAN_EVERY_MS = 1000
# A put taking this many page faults or more wrote into pages nobody had populated: a batch
# of 1000 x 128 B spans about 46 pages of the CommitLog.
FAULTED_PUT = 8
NOTABLE_NS = 1_000_000         # file-system calls shorter than this are not listed by a stall
KEY_SETS = 64                  # keys repeat every KEY_SETS * BATCH messages
SAMPLE_EVERY_S = 0.1
STEAL_EVERY_S = 0.01
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
STACK_EVERY_S = 0.005
TOPIC = "SustainedTopic"
MEM_PROBE_BYTES = 256 * MIB     # fresh memory touched once before the run (first_touch_gb_s)


# ---- the machine ---------------------------------------------------------------------------
def _read_int(path):
    with open(path) as f:
        return int(f.read().split()[0])


def meminfo():
    """/proc/meminfo in bytes."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, rest = line.split(":", 1)
            out[name] = int(rest.split()[0]) * 1024
    return out


def dirty_budget():
    """How many dirty page-cache bytes a writer may leave before the kernel throttles it
    (vm.dirty_bytes, else vm.dirty_ratio of the dirtyable memory, which MemAvailable
    approximates), and the background threshold where writeback starts."""
    vm = "/proc/sys/vm/"
    avail = meminfo()["MemAvailable"]
    out = {"mem_available": avail}
    for name in ("dirty", "dirty_background"):
        nbytes = _read_int(vm + name + "_bytes")
        ratio = _read_int(vm + name + "_ratio")
        if nbytes:
            out[name] = nbytes
            out[name + "_how"] = f"vm.{name}_bytes = {nbytes}"
        else:
            out[name] = avail * ratio // 100
            out[name + "_how"] = f"vm.{name}_ratio {ratio}% of MemAvailable {avail / 1e9:.2f} GB"
    return out


def disk_bandwidth(directory, total):
    """Bytes/s of 4 MiB pwrites to a fresh file with an fdatasync every 64 MiB and at the end:
    what the disk sustains for a writer that never lets the page cache fill."""
    path = os.path.join(directory, "disk-probe.bin")
    block = os.urandom(PROBE_WRITE)          # not zeros: a thin or compressing disk skips those
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        pos = 0
        while pos < total:
            os.pwrite(fd, block, pos)
            pos += PROBE_WRITE
            if pos % PROBE_SYNC_EVERY == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.remove(path)
    return pos / elapsed


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def cleaning_budget(path, pace):
    """A store_size_budget for a run the disk cannot hold whole, writing at up to `pace`
    bytes/s: what fits in four fifths of the free space, and keeps the disk's use below
    disk_max_used_space_ratio (75 %, where the store's disk checks begin), less the files made
    ahead (1 GiB) and two cleaning periods of writes (the rounds' lag)."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    room = min(st.f_bavail * st.f_frsize / 1.25, 0.75 * entire - used)
    return max(0, int(room - GIB - 2 * pace * CLEAN_EVERY_MS / 1000))


_REPORTING = "/sys/module/page_reporting/parameters/"


def page_reporting():
    """(page_reporting_order, KiB reported so far) of the guest's free page reporting
    (virtio-balloon), or None without it. A guest that reports hands its free memory back to
    the host, which backs each page again only on its next use: here that first touch ran
    at 0.35-0.7 GB/s against 6-20 GB/s for memory the host still backed (doc/performance.md,
    "Memory the host backs again"). Page cache the store fills counts: every run that starts
    after its predecessors' files were deleted pays it for each page it writes."""
    try:
        return (_read_int(_REPORTING + "page_reporting_order"),
                _read_int(_REPORTING + "reported_kib"))
    except (OSError, ValueError):
        return None


def first_touch_gb_s(nbytes=MEM_PROBE_BYTES):
    """GB/s of a first write to `nbytes` of fresh anonymous memory: the host's cost to back
    memory the guest hands out (a page-cache page the allocator populates is such memory)."""
    import mmap
    chunk = b"\x01" * MIB
    mm = mmap.mmap(-1, nbytes)
    try:
        t0 = time.perf_counter()
        for pos in range(0, nbytes, MIB):
            mm[pos:pos + MIB] = chunk
        return nbytes / (time.perf_counter() - t0) / 1e9
    finally:
        mm.close()


# ---- what the store's threads were doing -----------------------------------------------------
def _store_part(path):
    """commitlog, consumequeue, index or the file's name: the store directory `path` is in."""
    parts = os.fspath(path).split(os.sep)
    for part in ("commitlog", "consumequeue", "index"):
        if part in parts:
            return part
    return parts[-1]


class TimedFileSystem(FileSystem):
    """The real file system, recording (start_ns, end_ns, call, thread, bytes) for each call
    that may block for long: block reservation, prefault, msync, file creation and removal."""

    def __init__(self):
        self.calls = []

    def _timed(name, length_of, by_path=False):   # a decorator factory, for the class body
        def wrap(method):
            def timed(self, *a, **kw):
                t0 = time.perf_counter_ns()
                try:
                    return method(self, *a, **kw)
                finally:
                    # A call naming a file says which store it is for: the CommitLog, a
                    # ConsumeQueue or an index file.
                    what = f"{name}[{_store_part(a[0])}]" if by_path else name
                    self.calls.append((t0, time.perf_counter_ns(), what,
                                       threading.current_thread().name, length_of(a)))
            return timed
        return wrap

    reserve = _timed("reserve", lambda a: a[2], by_path=True)(FileSystem.reserve)
    prefault = _timed("prefault", lambda a: a[2] if len(a) > 2 and a[2] else len(a[0]))(
        FileSystem.prefault)
    sync_mapped = _timed("msync", lambda a: a[4])(FileSystem.sync_mapped)
    create_sized = _timed("create", lambda a: a[1], by_path=True)(FileSystem.create_sized)
    map = _timed("map", lambda a: a[1], by_path=True)(FileSystem.map)
    remove = _timed("remove", lambda a: 0)(FileSystem.remove)
    del _timed


def steal_ticks():
    """The machine's steal time so far, per CPU, in USER_HZ ticks (/proc/stat's eighth
    column): time the hypervisor ran something else while a virtual CPU wanted to run. A
    guest thread's own clocks (schedstat, rusage) count it as time on a CPU, so a put slowed
    by the host looks like a put doing more work."""
    with open("/proc/stat") as f:
        return tuple(int(ln.split()[8]) for ln in f
                     if ln.startswith("cpu") and ln[3].isdigit())


class MemSampler(threading.Thread):
    """Dirty and Writeback bytes every SAMPLE_EVERY_S, and the steal ticks of each CPU every
    STEAL_EVERY_S, stamped with perf_counter_ns."""

    def __init__(self):
        super().__init__(daemon=True, name="bench-meminfo")
        self.samples = []
        self.steal = []             # (perf_counter_ns, (ticks of cpu0, cpu1, ...))
        self.stop = threading.Event()

    def run(self):
        every = max(1, round(SAMPLE_EVERY_S / STEAL_EVERY_S))
        n = 0
        while not self.stop.wait(STEAL_EVERY_S):
            now = time.perf_counter_ns()
            self.steal.append((now, steal_ticks()))
            n += 1
            if n % every == 0:
                m = meminfo()
                self.samples.append((now, m["Dirty"], m["Writeback"]))

    def stolen_ms(self, t0, t1):
        """Steal of each CPU (ms) between the samples just before t0 and just after t1."""
        s = self.steal
        if not s:
            return None
        i = max(0, bisect.bisect_right(s, (t0,)) - 1)
        j = min(len(s) - 1, bisect.bisect_left(s, (t1,)))
        return [(b - a) * 1000 / TICKS_PER_S for a, b in zip(s[i][1], s[j][1])]


class KernelStacks(threading.Thread):
    """The putting thread's kernel stack (/proc/<pid>/task/<tid>/stack, root only) every
    STACK_EVERY_S: empty while it runs user code, else where in the kernel it waits."""

    def __init__(self, tid):
        super().__init__(daemon=True, name="bench-kstack")
        self.path = f"/proc/self/task/{tid}/stack"
        self.samples = []             # (perf_counter_ns, "fn <- caller <- ...")
        self.stop = threading.Event()

    def available(self):
        try:
            with open(self.path) as f:
                f.read()
            return True
        except OSError:
            return False

    def run(self):
        fd = os.open(self.path, os.O_RDONLY)
        try:
            while not self.stop.wait(STACK_EVERY_S):
                text = os.pread(fd, 8192, 0).decode(errors="replace")
                frames = [ln.split("] ", 1)[-1].split("+", 1)[0] for ln in text.splitlines()]
                frames = [f for f in frames if not f.startswith(("entry_SYSCALL", "do_syscall"))]
                if frames:
                    self.samples.append((time.perf_counter_ns(), " <- ".join(frames[:5])))
        finally:
            os.close(fd)


class GcTimes:
    """When CPython's cyclic collector ran (start_ns, end_ns, generation): it runs on whichever
    thread allocates, the putter included, and holds the GIL throughout."""

    def __init__(self):
        self.runs = []
        self._start = None

    def __call__(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter_ns()
        elif self._start is not None:
            self.runs.append((self._start, time.perf_counter_ns(), info["generation"]))
            self._start = None


class SchedStat:
    """A thread's /proc/<pid>/task/<tid>/schedstat: nanoseconds on a CPU and nanoseconds
    runnable but waiting for one (the run queue). Wall-clock time minus both is time asleep:
    on a lock (the GIL), in I/O or a page fault's wait. Needs schedstats in the kernel
    (CONFIG_SCHED_INFO); `read` is None without them."""

    def __init__(self, tid):
        self.read = None
        try:
            fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        except OSError:
            return
        self._fd = fd

        def read():
            on_cpu, waiting, _ = os.pread(fd, 128, 0).split()
            return int(on_cpu), int(waiting)
        self.read = read

    def close(self):
        if self.read is not None:
            os.close(self._fd)
            self.read = None


def thread_cpu_ns():
    """On-CPU and run-queue-wait ns of every thread of this process, by thread name (the
    store's services, the putter, the bench's samplers): what competed with the putter for
    this process's share of the machine."""
    out = {}
    for t in threading.enumerate():
        st = SchedStat(t.native_id)
        if st.read is not None:
            try:
                out[t.name] = st.read()
            except OSError:            # the thread ended meanwhile
                pass
            st.close()
    return out


def _percentile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _stall_report(stall, fs_calls, gc_runs, stacks, samples, stolen, start_ns):
    t0, t1, rolled, utime, stime, minflt, majflt, nvcsw, nivcsw, on_cpu, waiting = stall
    gcs = [g for g in gc_runs if g[0] < t1 and g[1] > t0 and g[1] - g[0] >= NOTABLE_NS]
    seen = {}
    for t, stack in stacks[bisect.bisect_left(stacks, (t0,)):bisect.bisect_left(stacks, (t1,))]:
        seen[stack] = seen.get(stack, 0) + 1
    over = [c for c in fs_calls if c[0] < t1 and c[1] > t0 and c[1] - c[0] >= NOTABLE_NS]
    i = bisect.bisect_left(samples, (t0,))
    mem = samples[min(i, len(samples) - 1)] if samples else (0, 0, 0)
    parts = [f"at {(t0 - start_ns) / 1e9:6.2f} s: {(t1 - t0) / 1e6:7.1f} ms",
             (f"putter CPU {utime * 1e3:.1f} ms user + {stime * 1e3:.1f} ms system, "
              f"{minflt} minor + {majflt} major faults, {nvcsw} waits + {nivcsw} preemptions"),
             f"Dirty {mem[1] / 1e9:.2f} GB Writeback {mem[2] / 1e9:.2f} GB"]
    if on_cpu is not None:
        asleep = max(0, t1 - t0 - on_cpu - waiting)     # the clocks are read apart
        parts.insert(1, f"putter on a CPU {on_cpu / 1e6:.1f} ms, waiting for one "
                        f"{waiting / 1e6:.1f} ms, asleep {asleep / 1e6:.1f} ms")
    steal = stolen(t0, t1)
    if steal is not None:
        # Over the sampling interval around the put (STEAL_EVERY_S each side), in ticks.
        parts.append("host steal " + " + ".join(f"{ms:.0f}" for ms in steal) + " ms (per CPU)")
    if rolled:
        parts.append("CommitLog file roll in this put")
    for g in gcs:
        parts.append(f"gc gen{g[2]} {(g[1] - g[0]) / 1e6:.1f} ms")
    for stack, n in sorted(seen.items(), key=lambda kv: -kv[1]):
        parts.append(f"putter in kernel x{n}: {stack}")
    for c in over:
        parts.append(f"{c[3]}:{c[2]}({c[4] / MIB:.0f} MiB, {(c[1] - c[0]) / 1e6:.1f} ms)")
    return "; ".join(parts)


def _autogroup():
    """This process's scheduler autogroup (kernel.sched_autogroup_enabled): the CPU is shared
    fairly between autogroups (sessions) first, then between the threads inside one."""
    try:
        with open("/proc/self/autogroup") as f:
            return f.read().strip()
    except OSError:
        return None


def _fs_summary(fs_calls, start_ns, end_ns):
    """Per thread and call during the timed run: count, bytes, total and longest time."""
    by = {}
    for t0, t1, name, thread, length in fs_calls:
        if start_ns <= t0 < end_ns:
            n, b, total, longest = by.get((thread, name), (0, 0, 0, 0))
            by[(thread, name)] = (n + 1, b + length, total + t1 - t0, max(longest, t1 - t0))
    return [f"fs {thread}:{name}: {n} calls, {b / MIB:,.0f} MiB, {total / 1e6:,.0f} ms in all, "
            f"longest {longest / 1e6:.1f} ms"
            for (thread, name), (n, b, total, longest) in sorted(by.items())]


# ---- the benchmark -------------------------------------------------------------------------
@pytest.mark.parametrize("writes", ["mapped", "transient_pool"])
def test_sustained_put_batch_beyond_dirty_budget(benchmark, tmp_path, writes):
    kernels = testing.load_backend("cext")
    free = free_bytes(tmp_path)
    if free < 2 * PROBE_BYTES:
        pytest.skip(f"the disk probe writes {PROBE_BYTES / 1e9:.1f} GB and wants twice that "
                    f"free; {free / 1e9:.1f} GB is")
    msgs = [Message(TOPIC, m.body, tags=m.tags, keys=m.keys, queue_id=0,
                    born_timestamp=m.born_timestamp, born_host=m.born_host)
            for m in make_messages(BATCH, body_size=128, topics=1, queues=1)]
    bodies = [m.body for m in msgs]
    tags = [m.tags for m in msgs]
    key_sets = [[f"key-{k * BATCH + i}" for i in range(BATCH)] for k in range(KEY_SETS)]
    born = {"born_timestamp": msgs[0].born_timestamp, "born_host": msgs[0].born_host}

    budget = dirty_budget()
    # Before the disk probe, whose page cache the guest frees and may hand back meanwhile.
    touch_gb_s = first_touch_gb_s()
    ceiling = disk_bandwidth(str(tmp_path), PROBE_BYTES)
    # The store outruns the disk only until the dirty budget is full; then the kernel holds it
    # to the disk's pace. But the probe, which waits for an fdatasync every 64 MiB, measured
    # 0.5-0.9x what the kernel's own writeback absorbed from the store, and runs stopped at
    # a cap of the probe's pace in 34-38 s of 60: the run stops at CAP_OVER_PROBE times it.
    # Each record brings a 20-byte ConsumeQueue unit and a 20-byte index entry; the files made
    # ahead (next CommitLog file, IndexFile) take about 1 GiB. A quarter of the free space is
    # left to the machine's other users. Where the rest cannot hold the whole run (the disk
    # probe ran at 1.7-2.0 GB/s on some days), the store deletes its oldest files as it
    # writes, as a broker at this pace does: a store_size_budget of what there is room for,
    # a cleaning round every CLEAN_EVERY_MS.
    record = commitlog_bytes(msgs) / BATCH
    free = free_bytes(tmp_path)
    cap = int(budget["dirty"] + SECONDS * ceiling * CAP_OVER_PROBE)   # CommitLog bytes
    will_write = int(cap * (record + 40) / record) + 1024 * MIB
    size_budget = 0
    if free < 1.25 * will_write:
        size_budget = cleaning_budget(tmp_path, ceiling * CAP_OVER_PROBE)
        # Cleaning never deletes what is not flushed yet: a budget near the dirty budget
        # would hold the writer to the flush, not measure it.
        if size_budget < 2 * budget["dirty"] + 4 * GIB:
            pytest.skip(f"{SECONDS:.0f} s of writes may take {will_write / 1e9:.1f} GB (dirty "
                        f"budget {budget['dirty'] / 1e9:.1f} GB + {SECONDS:.0f} s x "
                        f"{CAP_OVER_PROBE} x {ceiling / 1e6:.0f} MB/s, with queue and index "
                        f"files), and the {size_budget / 1e9:.1f} GB the store could keep by "
                        f"cleaning as it writes is under twice the dirty budget + 4 GiB")

    fs = TimedFileSystem()
    # "mapped": puts write into the CommitLog's mapping, populated ahead by the allocator (the
    # default); "transient_pool": into pooled write buffers that a commit thread writes into
    # the file every 200 ms (transientStorePoolEnable, RocketMQ's read-write separation).
    config = StoreConfig(transient_store_pool_enable=writes == "transient_pool",
                         drop_cold_commit_log_cache=DROP_COLD, store_size_budget=size_budget,
                         dispatch_in_put_lag=DISPATCH_LAG,
                         clean_resource_interval=CLEAN_EVERY_MS if size_budget else
                         StoreConfig.clean_resource_interval)
    store = MessageStore(tmp_path / "store", config, kernels=kernels, fs=fs)
    store.load()
    store.start()
    file_size = store.config.mapped_file_size_commit_log
    sampler = MemSampler()
    gc_times = GcTimes()
    kstacks = KernelStacks(threading.get_native_id())
    lat = []                       # ns per put_batch call
    # (start_ns, end_ns, rolled a CommitLog file, the putter's user and system CPU seconds,
    #  minor and major faults, voluntary and involuntary context switches)
    stalls = []
    state = {"stored": 0, "calls": 0}
    faults = {"total": 0, "puts": 0, "overtook": 0}
    # Where the putter's time inside puts went (ns): on a CPU, runnable but waiting for a CPU
    # (other threads, of this process or others, had them), asleep (the GIL, I/O, faults).
    sched = {"on_cpu": 0, "waiting": 0, "asleep": 0, "stall_on_cpu": 0, "stall_waiting": 0,
             "stall_asleep": 0}
    putter_sched = SchedStat(threading.get_native_id())
    try:
        def run():
            put = store.put_batch
            clock = time.perf_counter_ns
            # The putting thread's own CPU time, page faults and context switches, so a stall
            # says whether the thread was working, faulting or waiting (for the GIL, a lock,
            # or the kernel's dirty-page throttle).
            usage, who = resource.getrusage, resource.RUSAGE_THREAD
            schedstat = putter_sched.read or (lambda: (0, 0))
            keep = lat.append
            results = []
            last_end = 0
            state["cpu_before"] = thread_cpu_ns()
            state["reporting_before"] = page_reporting()
            start = clock()
            state["start"] = start
            deadline = start + int(SECONDS * 1e9)
            calls = 0
            while True:
                u0 = usage(who)
                c0, w0 = schedstat()
                t0 = clock()
                if t0 >= deadline or last_end >= cap:
                    break
                r = put(TOPIC, 0, bodies, tags=tags, keys=key_sets[calls % KEY_SETS], **born)
                t1 = clock()
                c1, w1 = schedstat()
                u1 = usage(who)
                keep(t1 - t0)
                on_cpu, waiting = c1 - c0, w1 - w0
                sched["on_cpu"] += on_cpu
                sched["waiting"] += waiting
                sched["asleep"] += max(0, t1 - t0 - on_cpu - waiting)
                calls += 1
                results.append(r)
                # Page faults taken inside the put: a put into populated pages takes next to
                # none; many mean it wrote pages the allocator had not populated yet (or
                # that writeback had cleaned again). Counted by the kernel per thread, so
                # other sessions' load does not blur it as it blurs wall-clock time.
                flt = u1.ru_minflt - u0.ru_minflt + u1.ru_majflt - u0.ru_majflt
                faults["total"] += flt
                if flt:
                    faults["puts"] += 1
                    if flt >= FAULTED_PUT:
                        faults["overtook"] += 1
                offs = r.commit_log_offsets
                if len(offs):             # empty when refused: check_puts reports that
                    end = int(offs[-1])
                    if t1 - t0 > STALL_NS:
                        stalls.append((t0, t1, end // file_size != last_end // file_size,
                                       u1.ru_utime - u0.ru_utime, u1.ru_stime - u0.ru_stime,
                                       u1.ru_minflt - u0.ru_minflt,
                                       u1.ru_majflt - u0.ru_majflt, u1.ru_nvcsw - u0.ru_nvcsw,
                                       u1.ru_nivcsw - u0.ru_nivcsw,
                                       on_cpu if putter_sched.read else None, waiting))
                        sched["stall_on_cpu"] += on_cpu
                        sched["stall_waiting"] += waiting
                        sched["stall_asleep"] += max(0, t1 - t0 - on_cpu - waiting)
                    last_end = end
                if len(results) == 256:     # every result kept would hold GBs of columns
                    state["stored"] += check_puts(results)
                    results.clear()
            state["stored"] += check_puts(results)
            state["calls"] = calls
            state["seconds"] = (clock() - start) / 1e9
            state["cpu_after"] = thread_cpu_ns()
            state["reporting_after"] = page_reporting()

        if SAMPLERS:
            sampler.start()
            if kstacks.available():
                kstacks.start()
        gc.callbacks.append(gc_times)
        benchmark.group = "sustained writes beyond the dirty budget"
        benchmark.extra_info["messages_per_call"] = BATCH
        # What pytest and the setup allocated is left out of the run's collections, as a
        # latency-sensitive application does: a generation-2 collection, about once a run,
        # walked it inside a put for 28-98 ms (doc/performance.md, "The page cache behind").
        gc.collect()
        gc.freeze()
        try:
            benchmark.pedantic(run, rounds=1, iterations=1)
        finally:
            gc.unfreeze()
        gc.callbacks.remove(gc_times)
        for t in (sampler, kstacks):
            t.stop.set()
            if t.is_alive():
                t.join()

        # Outside the timed region: every put was PUT_OK (checked above), every message is in
        # its queue, and a sample of bodies reads back.
        assert state["stored"] == state["calls"] * BATCH
        written = store.commitlog.max_offset
        deleted = store.get_min_phy_offset()
        if size_budget:
            # Rounds until one deletes nothing (the store's size counts the blocks its writers
            # held ahead, which the last round may have found over the budget), so the
            # queue's head follows the CommitLog files deleted last: until then a read of a
            # unit whose record's file is gone answers MESSAGE_WAS_REMOVING, as a broker's.
            for _ in range(16):
                before = store.get_min_phy_offset()
                store.clean_files_periodically()
                if store.get_min_phy_offset() == before:
                    break
        check_read_back(store, msgs, state["calls"], sample=200, head_expired=bool(size_budget))
        # Kernel thread ids by name, to read the run against a scheduler trace (perf sched).
        thread_ids = {t.name: t.native_id for t in threading.enumerate()}
    finally:
        putter_sched.close()
        if gc_times in gc.callbacks:
            gc.callbacks.remove(gc_times)
        for t in (sampler, kstacks):
            t.stop.set()
            if t.is_alive():
                t.join()
        store.shutdown()
        # Tens of GB: pytest would keep the last runs' tmp_path directories on the disk.
        shutil.rmtree(tmp_path / "store", ignore_errors=True)

    putter_sched_ok = bool(state.get("cpu_after"))
    rate = written / state["seconds"]
    lat.sort()
    peak_dirty = max((s[1] + s[2] for s in sampler.samples), default=0)
    figures = {
        "seconds": round(state["seconds"], 2),
        "messages": state["stored"],
        "msgs_per_s": round(state["stored"] / state["seconds"]),
        "commitlog_bytes": written,
        "store_mb_s": round(rate / 1e6, 1),
        "disk_pwrite_fdatasync_mb_s": round(ceiling / 1e6, 1),
        "ratio_to_disk": round(rate / ceiling, 3),
        "dirty_budget_bytes": budget["dirty"],
        "dirty_budget_how": budget["dirty_how"],
        "dirty_background_bytes": budget["dirty_background"],
        "dirty_background_how": budget["dirty_background_how"],
        "wrote_past_dirty_budget": written > budget["dirty"],
        "stopped_at_byte_cap": written >= cap,
        # Nonzero where the disk could not hold the run: the store deleted its oldest files
        # (deleted_commitlog_bytes of CommitLog) to stay within this budget as it wrote.
        "store_size_budget_bytes": size_budget,
        "deleted_commitlog_bytes": deleted,
        "peak_dirty_plus_writeback_bytes": peak_dirty,
        # The CommitLog's flushed bytes farther behind its end than the in-memory window leave
        # the page cache, so the writer's next pages reuse their memory.
        "drop_cold_commit_log_cache": DROP_COLD,
        "dispatch_in_put_lag": DISPATCH_LAG,
        "in_memory_window_bytes": store.mem_limit,
        "put_ms_p50": round(_percentile(lat, 0.5) / 1e6, 3),
        "put_ms_p99": round(_percentile(lat, 0.99) / 1e6, 3),
        "put_ms_p999": round(_percentile(lat, 0.999) / 1e6, 3),
        "put_ms_max": round(lat[-1] / 1e6, 3),
        "stalls_over_50ms": len(stalls),
        "putter_page_faults": faults["total"],
        "puts_with_faults": faults["puts"],
        f"puts_with_{FAULTED_PUT}_or_more_faults": faults["overtook"],
        "puts": state["calls"],
        "load_average": os.getloadavg(),
        # Whether fresh memory is dear on this machine: the host backs again, page by page,
        # what the guest handed back (page_reporting); the store's page cache is such memory.
        "first_touch_gb_s": round(touch_gb_s, 2),
        "page_reporting_order": (state["reporting_after"] or (None,))[0],
        "reported_to_host_during_run_gb": (
            round((state["reporting_after"][1] - state["reporting_before"][1]) * 1024 / 1e9, 1)
            if state.get("reporting_after") and state.get("reporting_before") else None),
        # The hypervisor's share of each CPU over the run: time the putter and the store's
        # threads could not run however idle the guest looked.
        "host_steal_s_per_cpu": [round(ms / 1e3, 2) for ms in
                                 sampler.stolen_ms(state["start"], state["start"]
                                                   + int(state["seconds"] * 1e9)) or []],
        "thread_ids": thread_ids,
        "autogroup": _autogroup(),
    }
    if putter_sched_ok:
        # The putter's time inside puts, and inside the stalled ones: a stall spent waiting
        # for a CPU is the machine's (or this process's other threads') doing, not a wait
        # inside the store.
        figures.update({f"putter_{k}_s": round(v / 1e9, 3) for k, v in sched.items()})
        before, after = state["cpu_before"], state["cpu_after"]
        figures["thread_cpu_s"] = {
            name: round((after[name][0] - before[name][0]) / 1e9, 2)
            for name in after if name in before}
        figures["thread_waiting_for_cpu_s"] = {
            name: round((after[name][1] - before[name][1]) / 1e9, 2)
            for name in after if name in before}
    benchmark.extra_info.update(figures)
    fs_calls = sorted(fs.calls)
    samples = sorted(sampler.samples)
    report = [f"{k}: {v}" for k, v in figures.items()]
    report += [_stall_report(s, fs_calls, gc_times.runs, sorted(kstacks.samples), samples,
                             sampler.stolen_ms, state["start"])
               for s in stalls]
    benchmark.extra_info["stalls"] = report[len(figures):]
    # CLOCK_MONOTONIC ns (perf_counter_ns on Linux), as `perf record -k CLOCK_MONOTONIC` stamps
    # its events: each stalled put's window, for a trace taken alongside.
    benchmark.extra_info["stall_windows_ns"] = [(s[0], s[1]) for s in stalls]
    end = state["start"] + int(state["seconds"] * 1e9)
    report += _fs_summary(fs_calls, state["start"], end)
    for gen in range(3):
        runs = [g[1] - g[0] for g in gc_times.runs if g[2] == gen and state["start"] <= g[0] < end]
        if runs:
            report.append(f"gc gen{gen}: {len(runs)} runs, {sum(runs) / 1e6:,.0f} ms in all, "
                          f"longest {max(runs) / 1e6:.1f} ms")
    print("\n" + "\n".join(report))
