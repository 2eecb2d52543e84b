# SPDX-License-Identifier: Apache-2.0
"""HA replication on loopback (spec 05), master in this process, slave in a child process:

- replication throughput: an empty slave copies a 192 MiB CommitLog file (it starts at the
  master's last file, which is the only one), against a raw socket copy of the same mapped
  bytes to a child that only receives them; bytes/s = extra_info["bytes"] / mean;
- SYNC_MASTER put_messages, batches of 1000 x 128-byte bodies, with a slave acknowledging,
  against the same puts on an ASYNC_MASTER; msgs/s = extra_info["messages"] / mean;
- SYNC_MASTER single put: p50/p99 ack latency (µs) in extra_info.

`pytest bench/bench_ha.py --benchmark-only`; one backend (ROCKETSTORE_BACKEND / the default),
since replication is Python over sockets and the kernels only encode the puts.
"""
import os
import subprocess
import sys
import time

import pytest

from rocketstore import MessageStore, StoreConfig
from rocketstore.config import BrokerRole
from rocketstore.message import Message
from rocketstore.workload import make_messages

FILE = 256 << 20
DATA = 192 << 20
SLAVE_CHILD = r"""
import sys
from rocketstore import MessageStore, StoreConfig
from rocketstore.config import BrokerRole
root, addr, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = MessageStore(root, StoreConfig(store_path_root_dir=root, broker_role=BrokerRole.SLAVE,
                                   mapped_file_size_commit_log=size, prefault_next_file=False))
s.load(); s.start()
print("ready", flush=True)
sys.stdin.readline()
s.update_ha_master_address(addr)
sys.stdin.read()
s.shutdown()
"""
RAW_CHILD = r"""
import socket, sys
total = int(sys.argv[2])
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
buf = bytearray(4 << 20); view = memoryview(buf); got = 0
while got < total:
    n = sock.recv_into(view)
    if not n:
        break
    got += n
sock.sendall(b"ok")
"""


def _config(root, role, **kw):
    base = dict(store_path_root_dir=str(root), broker_role=role, ha_listen_port=0, ha_listen=True,
                mapped_file_size_commit_log=FILE, prefault_next_file=False)
    base.update(kw)
    return StoreConfig(**base)


@pytest.fixture(scope="module")
def filled_master(tmp_path_factory):
    root = tmp_path_factory.mktemp("ha-master")
    store = MessageStore(root, _config(root, BrokerRole.ASYNC_MASTER))
    store.load()
    store.start()
    body = os.urandom(16 << 10)
    while store.get_max_phy_offset() < DATA:
        store.put_messages([Message("Repl", body, queue_id=i % 4) for i in range(256)])
    yield store
    store.shutdown()


def test_replication_throughput(benchmark, filled_master, tmp_path):
    master = filled_master
    target = master.get_max_phy_offset()
    addr = f"127.0.0.1:{master.ha_service.port}"
    children = []

    def setup():
        root = tmp_path / f"slave{len(children)}"
        child = subprocess.Popen([sys.executable, "-c", SLAVE_CHILD, str(root), addr,
                                  str(FILE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdout.readline() == b"ready\n"
        children.append(child)

    def run():
        child = children[-1]
        child.stdin.write(b"go\n")
        child.stdin.flush()
        while not any(c.slave_ack_offset >= target for c in master.ha_service.connections):
            time.sleep(0.0005)
        child.stdin.close()
        child.wait(30)

    benchmark.group = "HA: copy a 192 MiB CommitLog over loopback"
    benchmark.name = "replication (HAService -> HAClient)"
    benchmark.extra_info["bytes"] = target
    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)


def test_raw_socket_copy_baseline(benchmark, filled_master):
    import socket
    master = filled_master
    mf = master.commitlog.mfq.files[0]
    total = mf.read_position
    listen = socket.create_server(("127.0.0.1", 0))
    port = listen.getsockname()[1]
    state = {}

    def setup():
        state["child"] = subprocess.Popen([sys.executable, "-c", RAW_CHILD, str(port),
                                           str(total)])
        state["sock"], _ = listen.accept()

    def run():
        sock = state["sock"]
        with memoryview(mf.mm) as mv:
            for pos in range(0, total, 1 << 20):
                with mv[pos:min(total, pos + (1 << 20))] as chunk:
                    sock.sendall(chunk)
        assert sock.recv(2) == b"ok"
        sock.close()
        state["child"].wait(30)

    benchmark.group = "HA: copy a 192 MiB CommitLog over loopback"
    benchmark.name = "raw socket copy (sendall -> recv_into)"
    benchmark.extra_info["bytes"] = total
    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    listen.close()


@pytest.fixture
def sync_pair(tmp_path):
    """A SYNC_MASTER here and a `rocketstore serve` slave child acknowledging it."""
    root = tmp_path / "m"
    master = MessageStore(root, _config(root, BrokerRole.SYNC_MASTER,
                                        mapped_file_size_commit_log=1 << 30))
    master.load()
    master.start()
    child = subprocess.Popen([sys.executable, "-m", "rocketstore", "serve", str(tmp_path / "s"),
                              "--role", "slave", "--master",
                              f"127.0.0.1:{master.ha_service.port}", "--file-size",
                              str(1 << 30), "--status-interval", "0"],
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
def async_master(tmp_path):
    root = tmp_path / "a"
    store = MessageStore(root, _config(root, BrokerRole.ASYNC_MASTER,
                                       mapped_file_size_commit_log=1 << 30))
    store.load()
    store.start()
    yield store
    store.shutdown()


N = 50_000


@pytest.mark.parametrize("role", ["SYNC_MASTER + slave", "ASYNC_MASTER, no slave"])
def test_put_messages_batch_1000(benchmark, role, request):
    store = request.getfixturevalue("sync_pair" if role.startswith("SYNC") else "async_master")
    batches = [make_messages(1000, start=i) for i in range(0, N, 1000)]

    def run():
        for b in batches:
            r = store.put_messages(b)
            assert r.status.name == "PUT_OK", r.status
    benchmark.group = "put_messages, batches of 1000 x 128 B"
    benchmark.name = role
    benchmark.extra_info["messages"] = N
    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)


def test_sync_master_single_put_ack_latency(benchmark, sync_pair):
    store = sync_pair
    msgs = make_messages(5000)
    lat = []

    def run():
        lat.clear()
        clock = time.perf_counter_ns
        for m in msgs:
            t0 = clock()
            r = store.put_message(m)
            lat.append(clock() - t0)
            assert r.status.name == "PUT_OK", r.status
    benchmark.group = "SYNC_MASTER put_message: ack latency"
    benchmark.extra_info["messages"] = len(msgs)
    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    lat.sort()
    benchmark.extra_info["p50_us"] = round(lat[len(lat) // 2] / 1000, 1)
    benchmark.extra_info["p99_us"] = round(lat[len(lat) * 99 // 100] / 1000, 1)
    benchmark.extra_info["max_us"] = round(lat[-1] / 1000, 1)
