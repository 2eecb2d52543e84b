# SPDX-License-Identifier: Apache-2.0
"""What an idle store costs the machine: its service threads' CPU time and wake-ups a second
while nothing is put or read (3 s after a few puts: past ReputMessageService.IDLE_AFTER_MS
and the flush services' first rounds).

    python -m pytest bench/bench_idle.py --benchmark-only -q -s

ASYNC_FLUSH and SYNC_FLUSH stores. The ceiling is nothing at all: an embedded store that
nobody uses should cost next to no CPU and wake the machine rarely. The timed region is the
idle window itself (ROCKETSTORE_IDLE_SECONDS, default 2); extra_info holds cpu_ms_per_s and
wakeups_per_s for all the store's threads, and the three busiest threads by wake-ups. The
puts are checked and read back outside the timed region; stores are deleted at the end
(bench/conftest.py)."""
import os
import sys
import threading
import time

import pytest

from rocketstore import FlushDiskType
from rocketstore.workload import check_puts, check_read_back, make_messages

IDLE_S = float(os.environ.get("ROCKETSTORE_IDLE_SECONDS", "2"))
# Past the reput's IDLE_AFTER_MS (100 ms) and the flush services' first rounds, which sync
# what the puts wrote (FlushConsumeQueueService's first round is a thorough one): a store at
# rest, not one finishing its last writes.
SETTLE_S = 3.0


def _thread_costs(threads):
    """{thread name: (CPU ns, context switches)} from Linux's /proc/self/task."""
    out = {}
    for t in threads:
        try:
            with open(f"/proc/self/task/{t.native_id}/schedstat") as fh:
                cpu = int(fh.read().split()[0])
            with open(f"/proc/self/task/{t.native_id}/status") as fh:
                switches = sum(int(line.split()[1]) for line in fh if "ctxt_switches" in line)
        except (OSError, TypeError):
            continue            # ended meanwhile
        out[t.name] = (cpu, switches)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="reads the threads' costs from Linux's /proc/self/task")
@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH],
                         ids=["async", "sync"])
def test_idle_store(benchmark, backend, store_factory, flush):
    msgs = make_messages(100)
    store = store_factory(backend, msgs, 1, flush_disk_type=flush)
    check_puts([store.put_message(m) for m in msgs], len(msgs))
    here = threading.current_thread()
    threads = [t for t in threading.enumerate() if t is not here]
    seen = {}

    def idle():
        before = _thread_costs(threads)
        t0 = time.monotonic()
        time.sleep(IDLE_S)
        seen["s"] = time.monotonic() - t0
        after = _thread_costs(threads)
        seen["d"] = {k: (after[k][0] - v[0], after[k][1] - v[1])
                     for k, v in before.items() if k in after}
    time.sleep(SETTLE_S)
    benchmark.group = f"idle store, {flush.name}"
    benchmark.pedantic(idle, rounds=1, iterations=1)
    check_read_back(store, msgs)
    s, d = seen["s"], seen["d"]
    benchmark.extra_info["cpu_ms_per_s"] = round(sum(c for c, _ in d.values()) / 1e6 / s, 2)
    benchmark.extra_info["wakeups_per_s"] = round(sum(w for _, w in d.values()) / s, 1)
    busiest = sorted(d.items(), key=lambda kv: -kv[1][1])[:3]
    benchmark.extra_info["busiest"] = {k: f"{w / s:.0f}/s, {c / 1e6 / s:.2f} ms/s"
                                       for k, (c, w) in busiest}
    print(f"\n[{backend.NAME}, {flush.name}] idle store: "
          f"{benchmark.extra_info['cpu_ms_per_s']} ms of CPU and "
          f"{benchmark.extra_info['wakeups_per_s']} wake-ups a second; busiest: "
          f"{benchmark.extra_info['busiest']}")
