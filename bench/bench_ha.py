# SPDX-License-Identifier: Apache-2.0
"""HA replication on loopback (doc/05), master in this process, slave in a child process:

- replication throughput: an empty slave copies a 192 MiB CommitLog file (it starts at the
  master's last file, which is the only one), against two raw socket copies of the same
  mapped bytes: to a child that only receives them into one reused buffer, and to a child
  that writes them into a fresh file of the slave's size as the slave does (reserved before
  the copy, spliced socket -> pipe -> file: what any slave keeping the bytes pays for the page
  cache); bytes/s = extra_info["bytes"] / mean. What each copies, per byte: every sender
  copies from the mapping into the socket (sendall / sendmsg); the raw receiver copies out of
  the socket into one reused 4 MiB buffer, which stays in the CPU's cache; the slave and the
  raw file receiver copy from the socket's buffers into 192 MiB of fresh page cache, which
  does not (splice moves the buffers into the pipe by reference). The slave also dispatches
  the records it got (its reput), and both sides of replication run a store's idle threads.
  A second replication run has the slave receive into a 4 MiB buffer and pwrite from there
  (the path without splice: two copies on the slave). A round ends when the master
  holds the slave's acknowledgement of the last byte (a raw copy's when the child says it got
  every byte); the slave's shutdown, which flushes its CommitLog to disk, is not in it (the
  raw children write nothing to disk). extra_info["cpu_ms"] holds each side's CPU time per
  round (median): on a loaded 2-core machine the sum of both sides is what the wall time
  follows, and the slave's is split by thread (receive and write, reserve ahead, dispatch, flush);
- SYNC_MASTER put_messages, batches of 1000 x 128-byte bodies, with a slave acknowledging,
  against the same puts on an ASYNC_MASTER; msgs/s = extra_info["messages"] / mean;
- SYNC_MASTER single put: p50/p99 ack latency (µs) in extra_info.

`pytest bench/bench_ha.py --benchmark-only`; one backend (ROCKETSTORE_BACKEND / the default):
the kernels only encode the puts, and replication is the socket's copy and the slave's
splice, the same in every backend (the master sends from its mapping, cext's Mapping or
mmap.mmap).
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import pytest

from rocketstore import MessageStore, StoreConfig
from rocketstore.config import BrokerRole
from rocketstore.message import Message
from rocketstore.workload import check_puts, check_read_back, make_messages, sized_config

FILE = 256 << 20
DATA = 192 << 20
ROUNDS = 5                 # per copy benchmark: a loaded machine makes single rounds noisy
SLAVE_CHILD = r"""
import json, os, sys, threading
from rocketstore import MessageStore, StoreConfig
from rocketstore.config import BrokerRole
root, addr, size, splice = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "splice"

def thread_cpu_ms():
    # Each thread's CPU time in ms (Linux /proc: schedstat's ns), by thread name; {} elsewhere.
    out = {}
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/schedstat") as f:
                out[t.name] = int(f.read().split()[0]) / 1e6
        except OSError:
            continue
    return out

s = MessageStore(root, StoreConfig(store_path_root_dir=root, broker_role=BrokerRole.SLAVE,
                                   mapped_file_size_commit_log=size))
s.load(); s.start()
s.ha_service.client.splice = s.ha_service.client.splice and splice
print("ready", flush=True)
sys.stdin.readline()
c0 = thread_cpu_ms()
s.update_ha_master_address(addr)
sys.stdin.read()
c1 = thread_cpu_ms()
print(json.dumps({k: round(v - c0.get(k, 0), 1) for k, v in c1.items()}), flush=True)
s.shutdown()
"""
RAW_CHILD = r"""
import socket, sys, time
total = int(sys.argv[2])
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
buf = bytearray(4 << 20); view = memoryview(buf); got = 0
c0 = time.process_time()
while got < total:
    n = sock.recv_into(view)
    if not n:
        break
    got += n
sock.sendall(b"%020d%020d" % (got, (time.process_time() - c0) * 1000))
"""
# The same receive into a fresh CommitLog-sized file, as the slave writes it: reserved (here
# before the copy starts), spliced socket -> pipe (1 MiB, the slave's) -> file; the file is
# deleted at the end.
RAW_FILE_CHILD = r"""
import fcntl, os, socket, sys, time
from rocketstore import StoreConfig, kernels
from rocketstore.fs import FileSystem
from rocketstore.mapped_file import MappedFile
total, size, path = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
mf = MappedFile(path, size, kernels.DEFAULT, FileSystem(),
                reserve_window=StoreConfig().commit_log_reserve_window)   # as the slave's
fd = mf.open_writer_fd()
mf.reserve(total)          # before the copy: the slave's allocator reserves in its own thread
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
r, w = os.pipe()
size = fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
got = 0
c0 = time.process_time()
while got < total:
    n = os.splice(sock.fileno(), w, min(size, total - got))
    if not n:
        break
    done = 0
    while done < n:
        done += os.splice(r, fd, n - done, offset_dst=got + done)
    got += n
sock.sendall(b"%020d%020d" % (got, (time.process_time() - c0) * 1000))
mf.close_fd(fd)
mf.destroy()
"""


def _config(root, role, **kw):
    base = dict(store_path_root_dir=str(root), broker_role=role, ha_listen_port=0, ha_listen=True,
                mapped_file_size_commit_log=FILE, prefault_next_file=False)
    base.update(kw)
    return StoreConfig(**base)


@pytest.fixture(scope="module")
def filled_master(module_tmp):
    """An ASYNC_MASTER holding DATA bytes of 16 KiB messages, every put checked; yields the
    store and its messages."""
    root = module_tmp / "ha-master"
    store = MessageStore(root, _config(root, BrokerRole.ASYNC_MASTER))
    store.load()
    store.start()
    body = os.urandom(16 << 10)
    msgs, results = [], []
    while store.get_max_phy_offset() < DATA:
        batch = [Message("Repl", body, queue_id=i % 4) for i in range(256)]
        results.append(store.put_messages(batch))
        msgs += batch
    check_puts(results, len(msgs))
    check_read_back(store, msgs)
    # Neither benchmark runs beside the write-back of the fill (the first would pay for it).
    deadline = time.monotonic() + 60
    while store.commitlog.mfq.flushed_where < store.get_max_phy_offset():
        assert time.monotonic() < deadline, "the master's CommitLog was not flushed"
        time.sleep(0.01)
    yield store, msgs
    store.shutdown()


def _check_slave(root, msgs):
    """The slave (shut down) holds every message the master had, readable from its queues."""
    slave = MessageStore.open_read_only(root)
    try:
        check_read_back(slave, msgs)
    finally:
        slave.shutdown()


def _thread_cpu_ms():
    """This process's live threads' CPU time in ms, by (name, native id) (Linux /proc: the ns
    of schedstat, not stat's 10 ms ticks, which are as coarse as a thread's whole share of a
    round; {} elsewhere)."""
    out = {}
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/schedstat") as f:
                out[(t.name, t.native_id)] = int(f.read().split()[0]) / 1e6
        except OSError:
            continue
    return out


def _cpu_since(c0, c1):
    """CPU ms each thread alive at c1 spent since c0, summed by name (one connection's
    "HAWriteSocketService-(host, port)" counts as HAWriteSocketService)."""
    out = {}
    for key, ms in c1.items():
        name = key[0].split("-")[0]
        out[name] = out.get(name, 0) + ms - c0.get(key, 0)
    return out


def _median_cpu(rounds):
    """{name: median ms} over rounds of {name: ms} (a name missing in a round counts 0)."""
    names = sorted({k for r in rounds for k in r})
    return {k: round(statistics.median(r.get(k, 0) for r in rounds), 1) for k in names}


@pytest.mark.parametrize("receive", ["splice", "pwrite"])
def test_replication_throughput(benchmark, filled_master, tmp_path, receive):
    master, msgs = filled_master
    target = master.get_max_phy_offset()
    addr = f"127.0.0.1:{master.ha_service.port}"
    acks = master.ha_service.group_transfer
    children = []
    slave_cpu, master_cpu = [], []

    def check_last():
        if children:
            child = children[-1]
            slave_cpu.append(json.loads(child.stdout.readline()))
            assert child.wait(60) == 0          # shut down (and flushed) cleanly
            root = tmp_path / f"slave{len(children) - 1}"
            _check_slave(root, msgs)
            shutil.rmtree(root)          # one slave store on the disk at a time

    def setup():
        check_last()
        root = tmp_path / f"slave{len(children)}"
        # The last slave's connection is gone, so no late acknowledgement of it can come: the
        # next round waits for the new slave's own (wait_for below, woken by it, no polling).
        deadline = time.monotonic() + 30
        while master.ha_service.connections:
            assert time.monotonic() < deadline, "the last slave's connection stayed open"
            time.sleep(0.01)
        acks.push2slave_max_offset = 0
        child = subprocess.Popen([sys.executable, "-c", SLAVE_CHILD, str(root), addr,
                                  str(FILE), receive],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdout.readline() == b"ready\n"
        children.append(child)

    def run():
        child = children[-1]
        c0 = _thread_cpu_ms()
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert acks.wait_for(target, 60_000), "the slave did not acknowledge every byte"
        master_cpu.append(_cpu_since(c0, _thread_cpu_ms()))
        child.stdin.close()            # the slave shuts down; check_last waits for it

    benchmark.group = "HA: copy a 192 MiB CommitLog over loopback"
    benchmark.name = ("replication (HAService -> HAClient)" if receive == "splice" else
                      "replication, slave without splice (recv_into + pwrite)")
    benchmark.extra_info["bytes"] = target
    try:
        benchmark.pedantic(run, setup=setup, rounds=ROUNDS, iterations=1)
        check_last()
        # The master's MainThread is this benchmark waiting for the acknowledgement.
        benchmark.extra_info["cpu_ms"] = {"master threads": _median_cpu(master_cpu),
                                          "slave threads": _median_cpu(slave_cpu)}
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def _raw_copy(benchmark, mf, child_args, name):
    """Send mf's readable bytes in 1 MiB sendall calls to a child started with `child_args`
    (port and byte count appended first), which answers with the bytes it got and its CPU."""
    import socket
    total = mf.read_position
    listen = socket.create_server(("127.0.0.1", 0))
    port = listen.getsockname()[1]
    state = {"received": [], "cpu": [], "send_cpu": []}

    def setup():
        state["child"] = subprocess.Popen([sys.executable, "-c", child_args[0], str(port),
                                           str(total), *child_args[1:]])
        state["sock"], _ = listen.accept()

    def run():
        sock = state["sock"]
        c0 = time.thread_time()
        with memoryview(mf.mm) as mv:
            for pos in range(0, total, 1 << 20):
                with mv[pos:min(total, pos + (1 << 20))] as chunk:
                    sock.sendall(chunk)
        state["send_cpu"].append((time.thread_time() - c0) * 1000)
        answer = sock.recv(40, socket.MSG_WAITALL)
        state["received"].append(int(answer[:20]))
        state["cpu"].append(int(answer[20:]))
        sock.close()
        state["child"].wait(30)

    benchmark.group = "HA: copy a 192 MiB CommitLog over loopback"
    benchmark.name = name
    benchmark.extra_info["bytes"] = total
    try:
        benchmark.pedantic(run, setup=setup, rounds=ROUNDS, iterations=1)
    finally:
        listen.close()
    assert set(state["received"]) == {total}          # every round delivered every byte
    benchmark.extra_info["cpu_ms"] = {"sender thread": statistics.median(state["send_cpu"]),
                                      "receiver process": statistics.median(state["cpu"])}


def test_raw_socket_copy_baseline(benchmark, filled_master):
    master, _ = filled_master
    _raw_copy(benchmark, master.commitlog.mfq.files[0], [RAW_CHILD],
              "raw socket copy (sendall -> recv_into)")


def test_raw_socket_copy_into_fresh_file_baseline(benchmark, filled_master, tmp_path):
    master, _ = filled_master
    path = tmp_path / ("%020d" % 0)
    _raw_copy(benchmark, master.commitlog.mfq.files[0], [RAW_FILE_CHILD, str(FILE), str(path)],
              "raw socket copy into a fresh file (splice)")
    assert not path.exists()                        # each child deleted its file


N = 50_000
RUNS = 6                   # 5 rounds and a warmup


@pytest.fixture(scope="module")
def ha_msgs():
    return make_messages(N)


def _put_config(root, role, msgs):
    """_config with files sized to `msgs` put RUNS times, not 1 GiB."""
    size = sized_config(msgs, RUNS)
    return _config(root, role, mapped_file_size_commit_log=size.mapped_file_size_commit_log,
                   mapped_file_size_consume_queue=size.mapped_file_size_consume_queue)


@pytest.fixture
def sync_pair(tmp_path, ha_msgs):
    """A SYNC_MASTER here and a `rocketstore serve` slave child acknowledging it."""
    root = tmp_path / "m"
    cfg = _put_config(root, BrokerRole.SYNC_MASTER, ha_msgs)
    master = MessageStore(root, cfg)
    master.load()
    master.start()
    child = subprocess.Popen([sys.executable, "-m", "rocketstore", "serve", str(tmp_path / "s"),
                              "--role", "slave", "--master",
                              f"127.0.0.1:{master.ha_service.port}", "--file-size",
                              str(cfg.mapped_file_size_commit_log), "--status-interval", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    child.stdout.readline()
    deadline = time.monotonic() + 10
    while not any(c.slave_request_offset >= 0 for c in master.ha_service.connections):
        assert time.monotonic() < deadline, "the slave did not connect"
        time.sleep(0.01)
    yield master
    child.terminate()
    child.wait(30)
    master.shutdown()


@pytest.fixture
def async_master(tmp_path, ha_msgs):
    root = tmp_path / "a"
    store = MessageStore(root, _put_config(root, BrokerRole.ASYNC_MASTER, ha_msgs))
    store.load()
    store.start()
    yield store
    store.shutdown()


@pytest.mark.parametrize("role", ["SYNC_MASTER + slave", "ASYNC_MASTER, no slave"])
def test_put_messages_batch_1000(benchmark, role, request, ha_msgs):
    store = request.getfixturevalue("sync_pair" if role.startswith("SYNC") else "async_master")
    batches = [ha_msgs[i:i + 1000] for i in range(0, N, 1000)]
    results = []
    keep = results.append

    def run():
        for b in batches:
            keep(store.put_messages(b))
    benchmark.group = "put_messages, batches of 1000 x 128 B"
    benchmark.name = role
    benchmark.extra_info["messages"] = N
    benchmark.pedantic(run, rounds=RUNS - 1, iterations=1, warmup_rounds=1)
    runs = len(results) // len(batches)
    check_puts(results, runs * N)
    check_read_back(store, ha_msgs, runs)


def test_sync_master_single_put_ack_latency(benchmark, sync_pair, ha_msgs):
    store = sync_pair
    msgs = ha_msgs[:5000]
    lat = []
    results = []

    def run():
        lat.clear()
        keep = results.append
        clock = time.perf_counter_ns
        for m in msgs:
            t0 = clock()
            keep(store.put_message(m))
            lat.append(clock() - t0)
    benchmark.group = "SYNC_MASTER put_message: ack latency"
    benchmark.extra_info["messages"] = len(msgs)
    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    check_puts(results)
    check_read_back(store, msgs, len(results) // len(msgs))
    lat.sort()
    benchmark.extra_info["p50_us"] = round(lat[len(lat) // 2] / 1000, 1)
    benchmark.extra_info["p99_us"] = round(lat[len(lat) * 99 // 100] / 1000, 1)
    benchmark.extra_info["max_us"] = round(lat[-1] / 1000, 1)
