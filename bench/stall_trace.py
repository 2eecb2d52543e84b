# SPDX-License-Identifier: Apache-2.0
"""Who had the CPUs while a put of bench_sustained.py stalled: reads the benchmark's JSON
(its thread ids and stall windows) with a scheduler trace taken during the same run.

    perf record -a -k CLOCK_MONOTONIC -e sched:sched_switch -e sched:sched_waking \\
        -o sched.data -- python -m pytest bench/bench_sustained.py --benchmark-only -s -q \\
        --benchmark-json=sustained.json
    python bench/stall_trace.py sustained.json sched.data

For the stalled puts together it prints how long the putting thread waited for a CPU (it was
runnable: preempted, or woken and queued) and how long it slept, by the thread that woke it
(a thread of the store releasing the GIL or a lock; a wakeup from an interrupt, such as a
timer or an I/O completion, is charged to whatever ran on that CPU). Then the CPU time of
every other thread while the putter was off a CPU: the store's threads by name, this
process's other threads as "ours:<comm>", other processes as "other:<comm>", and "idle".
For every put of the run, the putter's sleeps by waker. Needs root (a system-wide trace)
and perf with the sched tracepoints; `perf record -k CLOCK_MONOTONIC` stamps events on the
clock of time.perf_counter_ns, which the benchmark's windows use."""
import bisect
import collections
import json
import re
import subprocess
import sys

_EVENT = re.compile(r"^\s*(\d+)/(\d+)\s+\[(\d+)\]\s+(\d+)\.(\d+):\s+sched:(\w+):\s+(.*)$")
_SWITCH = re.compile(r"prev_comm=(.*?) prev_pid=(\d+) .*prev_state=(\S+) ==> "
                     r"next_comm=(.*?) next_pid=(\d+)")
_WAKING = re.compile(r"comm=(.*?) pid=(\d+) ")


def _overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))


class Trace:
    """The putter's off-CPU intervals [out, state, woken at, waker tid, back in] and every
    CPU's run intervals (start, end, tid), from `perf script`."""

    def __init__(self, perf_data, putter):
        self.putter = putter
        self.off = []
        self.runs = collections.defaultdict(list)
        self.comm = {}
        self.pid = {}
        self.our_pid = None
        running = {}
        cur = None
        p = subprocess.Popen(["perf", "script", "-i", perf_data, "--ns",
                              "-F", "pid,tid,cpu,time,event,trace"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in p.stdout:
            m = _EVENT.match(line)
            if not m:
                continue
            pid, tid, cpu, sec, frac, name, trace = m.groups()
            pid, tid, cpu = int(pid), int(tid), int(cpu)
            t = int(sec) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])
            self.pid[tid] = pid
            if tid == putter:
                self.our_pid = pid
            if name == "sched_switch":
                s = _SWITCH.search(trace)
                if not s:
                    continue
                prev, state, nxt = int(s.group(2)), s.group(3), int(s.group(5))
                self.comm[prev], self.comm[nxt] = s.group(1), s.group(4)
                last = running.get(cpu)
                if last:
                    self.runs[cpu].append((last[0], t, last[1]))
                running[cpu] = (t, nxt)
                if prev == putter:
                    cur = [t, state, None, None, None]
                if nxt == putter and cur:
                    cur[4] = t
                    self.off.append(cur)
                    cur = None
            elif name == "sched_waking":
                s = _WAKING.search(trace)
                if s and int(s.group(2)) == putter and cur and cur[2] is None:
                    cur[2], cur[3] = t, tid
        p.wait()
        for runs in self.runs.values():
            runs.sort()
        self._starts = {cpu: [r[0] for r in runs] for cpu, runs in self.runs.items()}
        self._off_starts = [o[0] for o in self.off]

    def name(self, tid, names):
        if tid in names:
            return names[tid]
        if tid == 0:
            return "idle"
        where = "ours" if self.pid.get(tid) == self.our_pid else "other"
        return f"{where}:{self.comm.get(tid, tid)}"

    def ran(self, t0, t1, names, into):
        """Add each thread's CPU time within [t0, t1) to `into`."""
        for cpu, runs in self.runs.items():
            i = max(0, bisect.bisect_left(self._starts[cpu], t0) - 1)
            while i < len(runs) and runs[i][0] < t1:
                o = _overlap(runs[i][0], runs[i][1], t0, t1)
                if o:
                    into[self.name(runs[i][2], names)] += o
                i += 1

    def off_within(self, t0, t1):
        i = max(0, bisect.bisect_left(self._off_starts, t0) - 1)
        while i < len(self.off) and self.off[i][0] < t1:
            if self.off[i][4] > t0:
                yield self.off[i]
            i += 1


def main(bench_json, perf_data):
    info = json.load(open(bench_json))["benchmarks"][0]["extra_info"]
    names = {tid: name for name, tid in info["thread_ids"].items()}
    putter = info["thread_ids"]["MainThread"]
    windows = info["stall_windows_ns"]
    trace = Trace(perf_data, putter)
    ms = 1e6

    total = waiting = asleep = 0
    slept_by = collections.Counter()
    others = collections.Counter()
    for w0, w1 in windows:
        total += w1 - w0
        for out, state, woken, waker, back in trace.off_within(w0, w1):
            if state.startswith("R"):           # preempted: runnable throughout
                waiting += _overlap(out, back, w0, w1)
            else:
                woke = woken or back
                asleep += _overlap(out, woke, w0, w1)
                waiting += _overlap(woke, back, w0, w1)
                slept_by[trace.name(waker, names) if waker else "?"] += \
                    _overlap(out, woke, w0, w1)
            trace.ran(max(out, w0), min(back, w1), names, others)
    print("Each stalled put: the putter's sleeps by kind (S: a futex, the GIL or a lock; D: "
          "uninterruptible, I/O, a page or inode lock) and waker (ms):")
    first = windows[0][0] if windows else 0
    for w0, w1 in windows:
        each = collections.Counter()
        for out, state, woken, waker, back in trace.off_within(w0, w1):
            if not state.startswith("R"):
                who = trace.name(waker, names) if waker else "?"
                each[f"{state[:1]} {who}"] += _overlap(out, woken or back, w0, w1)
        print(f"  +{(w0 - first) / 1e9:6.2f} s {(w1 - w0) / ms:6.1f} ms: " + ", ".join(
            f"{k} {v / ms:.0f}" for k, v in each.most_common() if v >= ms))
    print(f"{len(windows)} stalled puts, {total / ms:,.0f} ms: the putter waited for a CPU "
          f"{waiting / ms:,.0f} ms and slept {asleep / ms:,.0f} ms")
    for who, ns in slept_by.most_common(12):
        print(f"  slept until woken by {who}: {ns / ms:,.0f} ms")
    print("CPU time of the others while the putter was off a CPU in them (ms, all CPUs):")
    for who, ns in others.most_common(15):
        print(f"  {who}: {ns / ms:,.0f}")

    if windows:
        start, end = windows[0][0], windows[-1][1]
        by = collections.Counter()
        count = collections.Counter()
        for out, state, woken, waker, back in trace.off_within(start, end):
            if not state.startswith("R"):
                who = trace.name(waker, names) if waker else "?"
                by[who] += (woken or back) - out
                count[who] += 1
        print("All the putter's sleeps from the first stall to the last, by waker (ms, count):")
        for who, ns in by.most_common(12):
            print(f"  {who}: {ns / ms:,.0f} ({count[who]})")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
