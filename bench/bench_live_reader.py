# SPDX-License-Identifier: Apache-2.0
"""Write→visible latency in another process: a LiveReader (rocketstore/live.py) following this
process's store.

    python -m pytest bench/bench_live_reader.py --benchmark-only -q --benchmark-columns=mean,rounds

This process puts message i once the reader process says it is reading for i, after a random
pause of 0-5 ms (so the reader has been waiting a while, its backoff grown as an idle
consumer's is). The message body carries CLOCK_MONOTONIC (one clock for every process) taken
just before put_message; the reader takes it again when the message is in its hands. Latency
is the difference. extra_info holds p50_us / p99_us / max_us per variant:

- live-wait: LiveReader.get_message(wait_ms=...), polling with its backoff (100 µs doubling
  to 1 ms);
- live-consumer: the Consumer iterator on the LiveReader (batch_size 1, committing in memory);
- live-wait-wake, live-consumer-wake: the same with the writer's wake_reput_on_put on, so each
  put wakes its reput instead of waiting for reput's 1 ms cycle;
- poll-1ms (the peer): the same reader without a wait, get_message then time.sleep(0.001)
  until the message is there, what a program does without a wait;
- pipe-floor (the floor): the same ping-pong through a pipe, no store: a cross-process
  wake-up's cost.

N is ROCKETSTORE_BENCH_LIVE_N (default 1000). Every put is checked and every message read back
outside the timed region; stores are deleted at the end (bench/conftest.py)."""
import json
import os
import random
import statistics
import subprocess
import sys
import time

import pytest

from rocketstore import Message
from rocketstore.workload import check_puts, check_read_back

N = int(os.environ.get("ROCKETSTORE_BENCH_LIVE_N", "1000"))
TOPIC = "LiveBench"
VARIANTS = ("live-wait", "live-consumer", "poll-1ms", "live-wait-wake", "live-consumer-wake")
_NOW = time.CLOCK_MONOTONIC

READER = r"""
import json, sys, time
variant, root, n, backend = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
now = lambda: time.clock_gettime_ns(time.CLOCK_MONOTONIC)
lat, bodies = [], []
out = sys.stdout

def ready(i):
    out.write("%d\n" % i)
    out.flush()

def took(m):
    lat.append(now() - int(m.body.split(b":")[1]))
    bodies.append(m.body.decode())

if variant == "pipe-floor":
    for i in range(n):
        ready(i)
        took(type("M", (), {"body": sys.stdin.buffer.readline().strip()}))
else:
    from rocketstore.live import LiveReader
    with LiveReader(root, kernels=backend) as r:
        if variant == "live-consumer":
            with r.consume("g", "LiveBench", 0, batch_size=1) as c:
                for i in range(n):
                    ready(i)
                    took(next(c)[0])
        for i in range(n if variant != "live-consumer" else 0):
            ready(i)
            if variant == "live-wait":
                m = r.get_message("g", "LiveBench", 0, i, 1, wait_ms=60_000).messages[0]
            else:
                while True:
                    got = r.get_message("g", "LiveBench", 0, i, 1).messages
                    if got:
                        m = got[0]
                        break
                    time.sleep(0.001)
            took(m)
out.write(json.dumps({"lat_ns": lat, "bodies": bodies}) + "\n")
out.flush()
"""


def _env():
    import rocketstore
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(rocketstore.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg, env.get("PYTHONPATH", "")])
    return env


def _record(benchmark, lat_ns):
    lat = sorted(lat_ns)
    q = statistics.quantiles(lat, n=100)
    benchmark.extra_info.update(n=len(lat), p50_us=round(q[49] / 1000, 1),
                                p99_us=round(q[98] / 1000, 1), max_us=round(lat[-1] / 1000, 1))


def _pingpong(variant, root, n, send, backend="pure"):
    """Run the reader process; `send(i)` delivers message i once it is reading for it.
    Returns the reader's latencies (ns) and the bodies it got."""
    p = subprocess.Popen([sys.executable, "-c", READER, variant, str(root), str(n), backend],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env())
    rng = random.Random(0)
    try:
        for i in range(n):
            assert int(p.stdout.readline()) == i
            time.sleep(rng.uniform(0, 0.005))
            send(i, p)
        result = json.loads(p.stdout.readline())
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return result["lat_ns"], result["bodies"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_write_to_visible_in_another_process(benchmark, store_factory, backend, variant):
    benchmark.group = "write->visible in another process"
    store = store_factory(backend, [Message(TOPIC, b"0:%019d" % 0, queue_id=0)] * N, 1,
                          ha_listen_port=0, wake_reput_on_put=variant.endswith("-wake"))
    msgs, results = [], []

    def send(i, _):
        m = Message(TOPIC, b"%d:%d" % (i, time.clock_gettime_ns(_NOW)), queue_id=0)
        msgs.append(m)
        results.append(store.put_message(m))

    out = {}

    def run():
        out["r"] = _pingpong(variant.removesuffix("-wake"), store.root, N, send, backend.NAME)
    benchmark.pedantic(run, rounds=1, iterations=1)
    lat, bodies = out["r"]
    check_puts(results, N)
    assert bodies == [m.body.decode() for m in msgs], "the reader did not get every message"
    check_read_back(store, msgs)
    _record(benchmark, lat)


def test_pipe_floor(benchmark, tmp_path):
    """The same ping-pong through a pipe: a cross-process wake-up with no store at all."""
    benchmark.group = "write->visible in another process"
    sent = []

    def send(i, p):
        body = b"%d:%d" % (i, time.clock_gettime_ns(_NOW))
        sent.append(body.decode())
        p.stdin.write(body + b"\n")
        p.stdin.flush()

    out = {}

    def run():
        out["r"] = _pingpong("pipe-floor", tmp_path, N, send)
    benchmark.pedantic(run, rounds=1, iterations=1)
    lat, bodies = out["r"]
    assert bodies == sent
    _record(benchmark, lat)


READ_N = int(os.environ.get("ROCKETSTORE_BENCH_LIVE_READ_N", "50000"))
READ_VARIANTS = ("live-reader", "live-python-path", "open_read_only")


def _read_queue(reader, n):
    got, offset = [], 0
    while offset < n:
        r = reader.get_message("g", TOPIC, 0, offset, 32)
        got += r.messages
        offset = r.next_begin_offset
    return got


@pytest.mark.parametrize("variant", READ_VARIANTS)
def test_read_a_backlog(benchmark, store_factory, backend, variant):
    """Reading READ_N messages (128-byte bodies) of a running writer's store, 32 per
    get_message: a LiveReader (compiled ReadPath.live_walk in cext, each record copied and
    CRC-checked), the same reader kept to its Python path (what cffi and pure run, and cext ran
    before live_walk), and the peer, MessageStore.open_read_only's read path (no body CRC
    check). extra_info: us_per_message."""
    from rocketstore import MessageStore
    from rocketstore.live import LiveReader
    from rocketstore.testing import wait_until
    benchmark.group = "read a backlog (32 per call)"
    msgs = [Message(TOPIC, b"%06d" % i + b"x" * 122, queue_id=0) for i in range(READ_N)]
    store = store_factory(backend, msgs, 1)
    results = [store.put_messages(msgs[i:i + 256]) for i in range(0, READ_N, 256)]
    check_puts(results, READ_N)
    wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
    store.flush()
    if variant != "open_read_only":
        reader = LiveReader(store.root, kernels=backend)
        if variant == "live-python-path":
            reader._walk = None
    else:
        reader = MessageStore.open_read_only(store.root, kernels=backend)
    try:
        _read_queue(reader, READ_N)          # map the files once, outside the timed region
        out = {}

        def run():
            out["got"] = _read_queue(reader, READ_N)
        benchmark.pedantic(run, rounds=3, iterations=1)
        got = out["got"]
        assert [m.body for m in got] == [m.body for m in msgs], "the reader missed messages"
    finally:
        reader.shutdown()
    check_read_back(store, msgs)
    if benchmark.stats is not None:     # None under --benchmark-disable
        benchmark.extra_info.update(
            us_per_message=round(benchmark.stats.stats.mean / READ_N * 1e6, 3))
