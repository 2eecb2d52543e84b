# SPDX-License-Identifier: Apache-2.0
"""HA replication (doc/05): wire bytes, the slave's append rule, and master/slave runs across
processes on 127.0.0.1 ephemeral ports, with kills, cut sockets and hostile peers."""
import dataclasses
import itertools
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from rocketstore import MessageStore, testing
from rocketstore.cli import serve
from rocketstore.ha import wire
from rocketstore.message import Message
from rocketstore.status import PutMessageStatus as P

from crashers.ha_node import node_config
from crashers.writer import message

NODE = os.path.join(os.path.dirname(__file__), "crashers", "ha_node.py")
BACKEND = testing.backend_params()[0]
FILE = 64 * 1024


# ---- helpers ----------------------------------------------------------------------------------
class Node:
    """A store in a child process (tests/crashers/ha_node.py)."""

    def __init__(self, root, role, tmp_path, master=None, produce=0, wait_slave=False,
                 batch_every=0, file_size=FILE):
        cmd = [sys.executable, NODE, str(root), "--role", role, "--backend", BACKEND,
               "--file-size", str(file_size), "--produce", str(produce),
               "--batch-every", str(batch_every)]
        if master:
            cmd += ["--master", master]
        if wait_slave:
            cmd.append("--wait-slave")
        self.err_path = tmp_path / f"{os.path.basename(str(root))}-{time.monotonic_ns()}.err"
        self._err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._err)
        self.lines = queue.Queue()
        self.acks = []
        self.done_offset = None
        threading.Thread(target=self._pump, daemon=True).start()
        self.port = None
        first = self.next_line()
        if first.startswith("port "):
            self.port = int(first.split()[1])
            first = self.next_line()
        assert first == "ready", first

    def _pump(self):
        for raw in self.proc.stdout:
            line = raw.decode().rstrip("\n")
            parts = line.split()
            if len(parts) == 5 and parts[0] == "ack":
                self.acks.append((int(parts[1]), int(parts[2]), int(parts[3]), parts[4]))
            elif len(parts) == 2 and parts[0] == "done":
                self.done_offset = int(parts[1])
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self, timeout=20.0):
        while True:
            line = self.lines.get(timeout=timeout)
            if line is None:
                raise AssertionError("child exited: " + self.err_path.read_text()[-3000:])
            if not line.startswith("ack "):
                return line

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def wait_done(self, timeout=30.0):
        line = self.next_line(timeout)
        assert line.startswith("done "), line
        return self.done_offset

    def stop(self):
        """Clean shutdown (stdin closed), exit status 0."""
        self.proc.stdin.close()
        assert self.proc.wait(20) == 0, self.err_path.read_text()[-3000:]
        self._err.close()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)
        self._err.close()
        time.sleep(0.05)                     # let the pump read the last lines


def open_node(root, role, file_size=FILE, **cfg):
    store = MessageStore(root, node_config(role, file_size, **cfg), kernels=BACKEND)
    store.load()
    store.start()
    return store


def commitlog_files(root):
    d = os.path.join(root, "commitlog")
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = f.read()
    return out


def assert_same_commitlog(master_root, slave_root):
    """Every slave file equals the master's file of that name, byte for byte."""
    m, s = commitlog_files(master_root), commitlog_files(slave_root)
    assert s, "the slave has no CommitLog file"
    for name, data in s.items():
        assert name in m, f"slave file {name} is not on the master"
        assert data == m[name], f"file {name} differs"
    return m, s


def assert_prefix(master_root, slave_store):
    """The slave's CommitLog is a byte prefix of the master's, from its first file on."""
    m = commitlog_files(master_root)
    for mf in slave_store.commitlog.mfq.files:
        n = mf.wrote_position
        assert bytes(mf.mm[:n]) == m[mf.file_name][:n], f"{mf.file_name} is no prefix"


def acked_from_master(master, timeout=15.0):
    testing.wait_until(
        lambda: master.ha_service.push2slave_max_offset >= master.get_max_phy_offset(),
        timeout, "the slave to acknowledge everything")


def producer(store, count, start=0, batch_every=7):
    """Put `count` messages from `start` in a thread; returns (thread, stop event)."""
    stop = threading.Event()

    def run():
        i = start
        try:
            while i < start + count and not stop.is_set():
                if i % batch_every == 0:
                    n = 2 + i % 13
                    assert store.put_messages([message(j) for j in range(i, i + n)]).ok
                    i += n
                else:
                    assert store.put_message(message(i)).ok
                    i += 1
        except BaseException as exc:
            t.error = exc
            raise
    t = threading.Thread(target=run, daemon=True)
    t.error = None
    t.start()
    return t, stop


def join_producer(t, timeout=60.0):
    """Wait for a producer thread to have made all its puts: a master still putting when the
    logs are compared would differ from its slave in the last file for no fault of either."""
    t.join(timeout)
    assert not t.is_alive(), "the producer has not finished its puts"
    assert t.error is None, f"a put failed: {t.error!r}"


def all_messages(store):
    """Every message the store serves through get_message, keyed by its index."""
    out = {}
    for topic, queues in store.consume_queue_table.items():
        for qid, cq in queues.items():
            off = cq.min_offset_in_queue
            while off < cq.max_offset_in_queue:
                r = store.get_message("g", topic, qid, off, 64)
                assert r.messages, r
                for m in r.messages:
                    out[int(m.keys[1:])] = m
                off = r.next_begin_offset
    return out


# ---- wire --------------------------------------------------------------------------------------
def test_wire_frames_match_the_spec_example_bytes():
    assert wire.encode_report(0) == bytes.fromhex("0000000000000000")
    assert wire.encode_header(0, 405) == bytes.fromhex("0000000000000000 00000195")
    assert wire.encode_report(405) == bytes.fromhex("0000000000000195")
    assert wire.encode_header(405, 0) == bytes.fromhex("0000000000000195 00000000")
    assert wire.decode_report(bytes.fromhex("0000000000000195")) == 405
    assert wire.decode_header(bytes.fromhex("00000000000001950000000000")) == (405, 0)
    assert wire.REPORT_SIZE == 8 and wire.HEADER_SIZE == 12


def test_wire_takes_only_the_last_complete_report():
    buf = wire.encode_report(1) + wire.encode_report(2) + wire.encode_report(3)[:5]
    assert wire.last_report(buf, 0, len(buf)) == (2, 16)
    assert wire.last_report(buf, 16, len(buf)) == (None, 16)
    assert wire.last_report(buf, 8, 16) == (2, 16)


def test_wire_rejects_negative_and_oversized_frames():
    with pytest.raises(wire.FrameError):
        wire.decode_header(wire.encode_header(0, -1))
    with pytest.raises(wire.FrameError):
        wire.decode_header(wire.encode_header(0, wire.MAX_FRAME_BODY + 1))
    with pytest.raises(wire.FrameError):
        wire.decode_header(wire.encode_header(-5, 1))
    assert wire.decode_header(wire.encode_header(7, wire.MAX_FRAME_BODY)) == (
        7, wire.MAX_FRAME_BODY)
    assert wire.parse_address("127.0.0.1:10912") == ("127.0.0.1", 10912)
    assert wire.parse_address("[::1]:5") == ("::1", 5)
    with pytest.raises(ValueError):
        wire.parse_address("nohost")


# ---- the slave's append rule -------------------------------------------------------------------
def test_append_data_writes_only_at_the_max_offset_and_rolls_at_file_boundaries(tmp_path):
    store = MessageStore(tmp_path / "s", node_config("SLAVE", FILE), kernels=BACKEND)
    store.load()
    cl = store.commitlog
    try:
        assert not cl.append_data(100, b"x" * 10)             # empty: only a file boundary
        assert cl.mfq.files == []
        assert cl.append_data(2 * FILE, b"a" * (FILE - 8))    # first file named by the offset
        assert cl.min_offset == 2 * FILE and cl.max_offset == 3 * FILE - 8
        assert not cl.append_data(3 * FILE - 9, b"b")         # behind
        assert not cl.append_data(3 * FILE - 7, b"b")         # a gap
        assert not cl.append_data(3 * FILE - 8, b"b" * 9)     # past the file's end
        assert cl.append_data(3 * FILE - 8, b"c" * 8)         # fills the file exactly
        assert not cl.append_data(3 * FILE + 1, b"d")
        assert cl.append_data(3 * FILE, b"d" * 3)             # rolls to the next file
        assert [f.file_name for f in cl.mfq.files] == ["%020d" % (2 * FILE),
                                                       "%020d" % (3 * FILE)]
        assert cl.max_offset == 3 * FILE + 3
    finally:
        store.shutdown()


def test_slave_restarted_with_a_record_cut_short_fetches_its_tail_again(tmp_path):
    """A frame may end inside a record (the master cuts at its batch size), and a killed
    slave may have written part of a frame: the file then holds a record whose properties'
    tail is zeros. Recovery must end the log before that record, so that the slave asks for
    it again; taken as whole, the slave would ask for what follows and keep the zeros."""
    master = open_node(tmp_path / "m", "ASYNC_MASTER")
    try:
        for i in range(40):
            assert master.put_message(message(i)).ok
        last = master.put_message(message(40))
        assert last.ok
        end = master.get_max_phy_offset()
        start = last.commit_log_offset
        assert end - start == last.wrote_bytes
        cut = end - 3                                # inside the last record's properties
        slave = open_node(tmp_path / "s", "SLAVE")
        try:
            assert slave.commitlog.append_data(0, master.commitlog.get_data(0, cut))
        finally:
            slave.shutdown()
        # The reput could not dispatch the cut record, so the shutdown left the abort file
        # (4.9.x does too): recovery runs as after a kill.
        slave = open_node(tmp_path / "s", "SLAVE", master=f"127.0.0.1:{master.ha_service.port}")
        try:
            assert not slave.recovery_report.normal
            assert slave.recovery_report.process_offset == start, slave.recovery_report
            testing.wait_until(lambda: slave.get_max_phy_offset() == end, 20, "the tail")
        finally:
            slave.shutdown()
    finally:
        master.shutdown()
    assert_same_commitlog(tmp_path / "m", tmp_path / "s")


def test_a_sync_flush_slave_syncs_what_it_receives_after_an_idle_spell(tmp_path):
    """A SYNC_FLUSH slave's group commit thread looks by itself only every IDLE_WAIT_MS once
    idle (an hour here): each frame the HA client appends wakes it, so replicated records
    are synced at once."""
    master = open_node(tmp_path / "m", "ASYNC_MASTER")
    try:
        assert master.put_message(message(0)).ok
        slave = open_node(tmp_path / "s", "SLAVE", master=f"127.0.0.1:{master.ha_service.port}",
                          flush="sync")
        try:
            flusher = slave.flush_service
            flusher.IDLE_WAIT_MS = 3_600_000
            flushed = slave.commitlog.mfq

            def synced():
                return flushed.flushed_where >= master.get_max_phy_offset()
            testing.wait_until(synced, 20, "the first record synced on the slave")
            testing.wait_until(lambda: flusher._poll_ms() == flusher.IDLE_WAIT_MS, 20,
                               "the slave's group commit to go quiet")
            for i in range(1, 5):
                assert master.put_message(message(i)).ok
            testing.wait_until(synced, 20, "the records after the idle spell synced")
        finally:
            slave.shutdown()
    finally:
        master.shutdown()


# ---- replication across processes --------------------------------------------------------------
def test_slave_commitlog_is_byte_identical_across_files_and_serves_the_same_messages(tmp_path):
    master = Node(tmp_path / "m", "ASYNC_MASTER", tmp_path, produce=3000, wait_slave=True,
                  batch_every=5)
    slave = open_node(tmp_path / "s", "SLAVE", master=master.address)
    try:
        end = master.wait_done()
        assert end > 10 * FILE                            # several files, blank tails included
        testing.wait_until(lambda: slave.get_max_phy_offset() == end, 20, "the slave to catch up")
        testing.wait_dispatched(slave)
        served = all_messages(slave)
        assert sorted(served) == [a[0] for a in sorted(master.acks)]
        for index, offset, size, _ in master.acks:
            m = served[index]
            assert (m.commit_log_offset, m.store_size) == (offset, size)
            assert m.body == message(index).body and m.topic == message(index).topic
    finally:
        slave.shutdown()
        master.stop()
    m, s = assert_same_commitlog(tmp_path / "m", tmp_path / "s")
    assert sorted(m) == sorted(s)


def test_sigkilled_slave_recovers_and_catches_up(tmp_path):
    master = open_node(tmp_path / "m", "ASYNC_MASTER")
    try:
        slave = Node(tmp_path / "s", "SLAVE", tmp_path, master=f"127.0.0.1:"
                     f"{master.ha_service.port}")
        testing.wait_until(lambda: master.ha_service.connections and
                   master.ha_service.connections[0].next_transfer_from_where >= 0, 10, "slave")
        t, _ = producer(master, 6000)
        testing.wait_until(
            lambda: master.ha_service.push2slave_max_offset > 4 * FILE, 20, "transfer")
        slave.kill()                                      # mid-transfer: the master still puts
        killed_at = master.ha_service.push2slave_max_offset
        testing.wait_until(
            lambda: not master.ha_service.connections, 10, "the dead connection to go")
        slave = Node(tmp_path / "s", "SLAVE", tmp_path, master=f"127.0.0.1:"
                     f"{master.ha_service.port}")
        join_producer(t)
        acked_from_master(master, 20)
        assert master.get_max_phy_offset() > killed_at
        slave.stop()
    finally:
        master.shutdown()
    m, s = assert_same_commitlog(tmp_path / "m", tmp_path / "s")
    assert sorted(m) == sorted(s)


class CuttableProxy:
    """Forwards 127.0.0.1 connections to a target port; cut() drops every live one."""

    def __init__(self, target_port):
        self.target = target_port
        self.listen = socket.create_server(("127.0.0.1", 0))
        self.port = self.listen.getsockname()[1]
        self.socks = []
        self.accepted = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.listen.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self.socks += [a, b]
                self.accepted += 1
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src, dst):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        with self._lock:
            socks, self.socks = self.socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self):
        self.listen.close()
        self.cut()


def test_cut_connection_reconnects_and_resumes_byte_identical(tmp_path):
    master = open_node(tmp_path / "m", "ASYNC_MASTER")
    proxy = CuttableProxy(master.ha_service.port)
    try:
        slave = Node(tmp_path / "s", "SLAVE", tmp_path, master=f"127.0.0.1:{proxy.port}")
        testing.wait_until(lambda: master.ha_service.connections and
                   master.ha_service.connections[0].next_transfer_from_where >= 0, 10, "slave")
        t, _ = producer(master, 5000)
        for _ in range(2):
            testing.wait_until(
                lambda: master.ha_service.push2slave_max_offset > 2 * FILE, 20, "data")
            proxy.cut()
            time.sleep(0.1)
        join_producer(t)
        acked_from_master(master, 20)
        assert proxy.accepted >= 3                       # it came back after every cut
        # The master can drop the connection too.
        for conn in master.ha_service.connections:
            conn.stop("test: closed from the master side")
        assert master.put_message(message(10 ** 6)).ok
        acked_from_master(master, 20)
        slave.stop()
    finally:
        proxy.close()
        master.shutdown()
    m, s = assert_same_commitlog(tmp_path / "m", tmp_path / "s")
    assert sorted(m) == sorted(s)


def test_sigkilled_sync_master_left_every_acknowledged_message_on_the_slave(tmp_path):
    master = Node(tmp_path / "m", "SYNC_MASTER", tmp_path, produce=-1, wait_slave=True,
                  batch_every=4)
    slave = open_node(tmp_path / "s", "SLAVE", master=master.address)
    try:
        testing.wait_until(lambda: sum(a[3] == "PUT_OK" for a in master.acks) > 1500, 30, "acks")
        master.kill()
        acks = list(master.acks)
        ok = [a for a in acks if a[3] == "PUT_OK"]
        assert len(ok) > 1500
        # Once a slave was in sync, the master has nothing to answer but PUT_OK.
        assert {a[3] for a in acks} == {"PUT_OK"}
        for index, offset, size, _ in ok:
            m = slave.look_message_by_offset(offset)
            assert m is not None and m.store_size == size, f"acked message {index} lost"
            assert m.body == message(index).body
        assert_prefix(tmp_path / "m", slave)     # the master may hold more than it sent
    finally:
        slave.shutdown()


class FrameTap:
    """A proxy between one slave and the master that reads the frame headers going to the
    slave. hold(n) stops forwarding once n bytes of the master's stream went through (the
    stream's first n bytes; the rest waits in the proxy) until the proxy closes."""

    def __init__(self, master_port, hold=None):
        self.master_port = master_port
        self.hold = hold
        self.listen = socket.create_server(("127.0.0.1", 0))
        self.port = self.listen.getsockname()[1]
        self.frames = []                  # (offset, size) of every header forwarded
        self.forwarded = 0                # master -> slave bytes
        self.holding = threading.Event()
        self._socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        try:
            a, _ = self.listen.accept()
        except OSError:
            return
        b = socket.create_connection(("127.0.0.1", self.master_port))
        self._socks = [a, b]
        threading.Thread(target=CuttableProxy._pipe, args=(a, b), daemon=True).start()
        threading.Thread(target=self._down, args=(b, a), daemon=True).start()

    def _down(self, src, dst):
        pending = b""                     # bytes of a header not yet complete
        body_left = 0
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                if self.hold is not None:
                    data = data[:max(0, self.hold - self.forwarded)]
                view = memoryview(data)
                while view:                        # parse headers as the slave will
                    if body_left:
                        k = min(body_left, len(view))
                        body_left -= k
                        view = view[k:]
                        continue
                    need = wire.HEADER_SIZE - len(pending)
                    pending += bytes(view[:need])
                    view = view[need:]
                    if len(pending) == wire.HEADER_SIZE:
                        offset, size = wire.decode_header(pending)
                        self.frames.append((offset, size))
                        body_left, pending = size, b""
                dst.sendall(data)
                self.forwarded += len(data)
                if self.hold is not None and self.forwarded >= self.hold:
                    self.holding.set()
                    while src.recv(1 << 20):       # drain, forward nothing more
                        pass
                    break
        except OSError:
            pass

    def close(self):
        self.listen.close()
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def put_big(store, total, size=16000):
    """Put messages of `size` random bytes until the CommitLog holds `total` bytes."""
    i = 0
    while store.get_max_phy_offset() < total:
        batch = [Message("Big", os.urandom(size), keys=f"k{i + j}", queue_id=j % 2)
                 for j in range(64)]
        assert store.put_messages(batch).ok
        i += 64
    return i


def test_large_frames_are_cut_at_file_ends_and_replicate_byte_identical(tmp_path):
    """Frames up to the 4.9 slave's limit, each inside one file: the master's frames are
    MAX_FRAME_BODY long unless the file (or the data) ends first, and the slave, receiving
    them straight into its mapping, holds the same files."""
    fs = 6 << 20                           # not a multiple of a frame: frames end at files
    master = open_node(tmp_path / "m", "ASYNC_MASTER", file_size=fs,
                       batch=wire.MAX_FRAME_BODY)
    tap = slave = None
    try:
        put_big(master, 3 * fs + (1 << 20))
        # The slave already holds the master's first file (as if replicated before), so it
        # asks for the second one on: an empty slave would start at the master's last file.
        os.makedirs(tmp_path / "s" / "commitlog")
        name = "%020d" % 0
        with open(tmp_path / "m" / "commitlog" / name, "rb") as src, \
                open(tmp_path / "s" / "commitlog" / name, "wb") as dst:
            dst.write(src.read())
        tap = FrameTap(master.ha_service.port)
        slave = open_node(tmp_path / "s", "SLAVE", file_size=fs,
                          master=f"127.0.0.1:{tap.port}")
        acked_from_master(master, 30)
        end = master.get_max_phy_offset()
        testing.wait_dispatched(slave)
        assert slave.get_message("g", "Big", 0, 0, 4).messages      # served from file 0 on
        data = [f for f in tap.frames if f[1]]
        assert data[0][0] == fs
        pos = fs
        for offset, size in data:
            assert offset == pos and 0 < size <= wire.MAX_FRAME_BODY
            assert offset // fs == (offset + size - 1) // fs, "a frame spans two files"
            pos += size
            assert size == wire.MAX_FRAME_BODY or pos % fs == 0 or pos == end
        assert pos == end
        assert sum(size == wire.MAX_FRAME_BODY for _, size in data) == 2     # one per file
        assert sum((o + n) % fs == 0 for o, n in data) == 2            # files 1 and 2 end
        client = slave.ha_service.client
        assert client.frames_received >= len(data)
        assert client.reports_sent < len(data) + 5      # not a report per read
    finally:
        if slave is not None:
            slave.shutdown()
        if tap is not None:
            tap.close()
        master.shutdown()
    m, s = assert_same_commitlog(tmp_path / "m", tmp_path / "s")
    assert sorted(m) == sorted(s)


def test_slave_killed_mid_frame_resumes_byte_identical(tmp_path):
    """A slave SIGKILLed with half a large frame written into its mapping (and so into its
    file) but not acknowledged: it restarts, recovers, asks for what it lacks and ends with
    the master's files byte for byte."""
    fs = 16 << 20
    big = wire.MAX_FRAME_BODY
    master = open_node(tmp_path / "m", "ASYNC_MASTER", file_size=fs, batch=big)
    tap = None
    try:
        put_big(master, 2 * big + (1 << 20))               # file 0 only: the slave starts at 0
        hold = wire.HEADER_SIZE + big + wire.HEADER_SIZE + big // 2
        tap = FrameTap(master.ha_service.port, hold=hold)
        slave = Node(tmp_path / "s", "SLAVE", tmp_path, master=f"127.0.0.1:{tap.port}",
                     file_size=fs)
        assert tap.holding.wait(20), "the tap never forwarded half the second frame"
        with open(tmp_path / "m" / "commitlog" / ("%020d" % 0), "rb") as f:
            f.seek(big)
            half = f.read(big // 2)
        path = tmp_path / "s" / "commitlog" / ("%020d" % 0)

        def partial_in_file():
            with open(path, "rb") as f:
                f.seek(big)
                return f.read(big // 2) == half
        testing.wait_until(partial_in_file, 20, "half the second frame in the slave's file")
        conn = master.ha_service.connections[0]
        testing.wait_until(lambda: conn.slave_ack_offset == big, 10, "the first frame's ack")
        slave.kill()                                       # mid-frame: acked only frame 1
        assert conn.slave_ack_offset == big
        tap.close()
        testing.wait_until(
            lambda: not master.ha_service.connections, 10, "the dead connection to go")
        slave = Node(tmp_path / "s", "SLAVE", tmp_path, file_size=fs,
                     master=f"127.0.0.1:{master.ha_service.port}")
        acked_from_master(master, 30)
        slave.stop()
    finally:
        if tap is not None:
            tap.close()
        master.shutdown()
    m, s = assert_same_commitlog(tmp_path / "m", tmp_path / "s")
    assert sorted(m) == sorted(s)


def test_slave_reports_once_per_burst_not_once_per_frame(tmp_path):
    """200 frames arriving together are acknowledged by a handful of reports, the last one
    the end of the data (so a SYNC_MASTER producer still hears at once)."""
    data = real_records(tmp_path)
    fake = FakeMaster()
    slave = open_node(tmp_path / "s", "SLAVE", master=f"127.0.0.1:{fake.port}")
    try:
        assert fake.accept() == 0
        cuts = [len(data) * i // 200 for i in range(201)]
        fake.send(b"".join(wire.encode_header(a, b - a) + data[a:b]
                           for a, b in zip(cuts, cuts[1:])))
        reports = []
        buf = b""
        while not reports or reports[-1] != len(data):
            buf += fake.conn.recv(4096)
            while len(buf) >= 8:
                reports.append(wire.decode_report(buf[:8]))
                buf = buf[8:]
        assert reports == sorted(reports)
        assert len(reports) <= 10, reports
        assert slave.ha_service.client.frames_received == 200
    finally:
        slave.shutdown()
        fake.close()


def test_slave_assembles_frames_however_the_stream_is_cut(tmp_path):
    """Headers and bodies cut at any byte, bodies larger than the staging buffer included:
    the staged part of a body and the part received straight into the mapping join up byte
    for byte, and the slave dispatches every record."""
    fs = 1 << 20
    src = open_node(tmp_path / "src", "ASYNC_MASTER", file_size=fs)
    try:
        count = put_big(src, 300_000, size=3000)
        data = bytes(src.commitlog.get_data(0, src.get_max_phy_offset()))
    finally:
        src.shutdown()
    rnd = random.Random(15)
    stream, pos = [], 0
    for size in itertools.cycle([150_000, 1, 70_000, 12, 0, 40_000, 99_999]):
        if pos == len(data):
            break
        size = min(size, len(data) - pos)
        stream.append(wire.encode_header(pos, size) + data[pos:pos + size])
        pos += size
    stream = b"".join(stream)
    fake = FakeMaster()
    slave = open_node(tmp_path / "s", "SLAVE", file_size=fs, master=f"127.0.0.1:{fake.port}")
    try:
        assert fake.accept() == 0
        fake.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pos = 0
        while pos < len(stream):
            n = rnd.choice([1, 5, 11, 12, 13, 700, 30_000, 70_000])
            fake.send(stream[pos:pos + n])
            pos += n
            time.sleep(0.0005)                 # mostly one receive per piece
        testing.wait_until(lambda: slave.get_max_phy_offset() == len(data), 10, "every frame")
        assert bytes(slave.commitlog.get_data(0, len(data))) == data
        testing.wait_dispatched(slave)
        r = slave.get_message("g", "Big", 0, 0, 10_000)
        assert len(r.messages) == (count + 1) // 2 and slave.ha_service.client.error is None
    finally:
        slave.shutdown()
        fake.close()


def test_slave_on_a_full_disk_drops_the_frame_and_takes_it_once_there_is_room(tmp_path):
    """A frame whose space the disk refuses closes the connection with nothing published;
    the client waits its reconnect interval, asks again, and appends once there is room."""
    import errno
    from rocketstore.fs import FileSystem

    class CommitLogFull(FileSystem):
        full = True

        def reserve(self, path, offset, length):
            if self.full and f"{os.sep}commitlog{os.sep}" in path:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            return super().reserve(path, offset, length)

    data = real_records(tmp_path)
    fake = FakeMaster()
    fs = CommitLogFull()
    slave = MessageStore(tmp_path / "s", node_config("SLAVE", FILE,
                                                     master=f"127.0.0.1:{fake.port}"),
                         kernels=BACKEND, fs=fs)
    slave.load()
    slave.start()
    try:
        assert fake.accept() == 0
        fake.send(wire.encode_header(0, len(data)) + data)
        assert fake.closed_by_peer(), "the slave kept the connection"
        assert slave.get_max_phy_offset() == 0
        fs.full = False
        assert fake.accept() == 0
        fake.send(wire.encode_header(0, len(data)) + data)
        testing.wait_until(lambda: slave.get_max_phy_offset() == len(data), 10, "the frame")
        assert bytes(slave.commitlog.get_data(0, len(data))) == data
        assert slave.ha_service.client.error is None
    finally:
        slave.shutdown()
        fake.close()


def test_group_transfer_releases_exactly_the_producers_an_ack_covers():
    """Each SYNC_MASTER producer parks until an acknowledgement reaches its offset: an ack
    releases those it covers, at once, and leaves the others parked (no poll, no wake-all);
    a timeout and shutdown answer False."""
    from rocketstore.ha.group_transfer import GroupTransferService
    gt = GroupTransferService()
    results = {}

    def wait(offset):
        results[offset] = gt.wait_for(offset, 60_000)
    threads = {o: threading.Thread(target=wait, args=(o,)) for o in range(100, 900, 100)}
    for t in threads.values():
        t.start()
    testing.wait_until(lambda: gt.waiting == 8, 10, "eight parked producers")
    gt.notify_transfer_some(450)
    for o in (100, 200, 300, 400):
        threads[o].join(10)
        assert results.get(o) is True
    assert gt.waiting == 4 and all(threads[o].is_alive() for o in (500, 600, 700, 800))
    gt.notify_transfer_some(300)                       # behind the max: changes nothing
    assert gt.push2slave_max_offset == 450 and gt.waiting == 4
    gt.notify_transfer_some(800)
    for o in (500, 600, 700, 800):
        threads[o].join(10)
        assert results.get(o) is True
    assert gt.wait_for(800, 0) is True                 # acknowledged already: no wait
    assert gt.wait_for(801, 20) is False and gt.waiting == 0        # timed out, unparked
    late = threading.Thread(target=wait, args=(5000,))
    late.start()
    testing.wait_until(lambda: gt.waiting == 1, 10, "a parked producer")
    gt.shutdown()
    late.join(10)
    assert results[5000] is False
    assert gt.wait_for(6000, 60_000) is False          # after shutdown: at once


# ---- in-process behaviour ----------------------------------------------------------------------
def test_empty_slave_starts_at_the_masters_last_file(tmp_path):
    master = open_node(tmp_path / "m", "ASYNC_MASTER")
    slave = None
    try:
        i = 0
        while master.get_max_phy_offset() < 3 * FILE + 5000:
            assert master.put_message(message(i)).ok
            i += 1
        last_start = master.commitlog.mfq.files[-1].file_from_offset
        assert last_start == 3 * FILE
        slave = open_node(tmp_path / "s", "SLAVE", master=f"127.0.0.1:{master.ha_service.port}")
        acked_from_master(master)
        assert slave.get_min_phy_offset() == last_start
        for j in range(i, i + 300):                       # more after it joined, into file 4
            assert master.put_message(message(j)).ok
        acked_from_master(master)
        testing.wait_dispatched(slave)
        served = all_messages(slave)
        first = min(served)
        assert served[first].commit_log_offset >= last_start
        assert sorted(served) == list(range(first, i + 300))
        assert_prefix(tmp_path / "m", slave)
    finally:
        if slave is not None:
            slave.shutdown()
        master.shutdown()
    m, s = assert_same_commitlog(tmp_path / "m", tmp_path / "s")
    assert min(s) == "%020d" % (3 * FILE)


def test_sync_master_answers_slave_not_available_timeout_or_ok(tmp_path):
    master = open_node(tmp_path / "m", "SYNC_MASTER", slave_timeout=300, flush="sync")
    try:
        r = master.put_message(message(0))
        assert r.status is P.SLAVE_NOT_AVAILABLE and r.commit_log_offset == 0   # stored
        # A slave that reports once and then never acknowledges: timeouts.
        fake = socket.create_connection(("127.0.0.1", master.ha_service.port))
        fake.sendall(wire.encode_report(master.get_max_phy_offset()))
        testing.wait_until(
            lambda: master.ha_service.push2slave_max_offset == r.wrote_bytes, 5, "ack")
        t0 = time.monotonic()
        assert master.put_message(message(1)).status is P.FLUSH_SLAVE_TIMEOUT
        assert time.monotonic() - t0 > 0.25     # it waited for the ack it never got
        assert master.put_messages([message(2), message(3)]).status is P.FLUSH_SLAVE_TIMEOUT
        nowait = Message("NoWait", b"x", properties={"WAIT": "false"})
        # PUT_OK, not FLUSH_SLAVE_TIMEOUT: it did not wait for the ack the fake never sends.
        assert master.put_message(nowait).status is P.PUT_OK
        fake.close()
        testing.wait_until(lambda: not master.ha_service.connections, 5, "the fake to go")
        assert master.put_message(message(4)).status is P.SLAVE_NOT_AVAILABLE
        slave = open_node(tmp_path / "s", "SLAVE", master=f"127.0.0.1:{master.ha_service.port}")
        try:
            acked_from_master(master)
            assert master.put_message(message(5)).status is P.PUT_OK
            assert master.put_messages([message(6), message(7)]).status is P.PUT_OK
        finally:
            slave.shutdown()
    finally:
        master.shutdown()


def test_sync_master_counts_a_slave_too_far_behind_as_not_available(tmp_path):
    master = MessageStore(tmp_path / "m", node_config("SYNC_MASTER", FILE, slave_timeout=50),
                          kernels=BACKEND)
    master.config.ha_slave_fallbehind_max = 1000
    master.load()
    master.start()
    try:
        fake = socket.create_connection(("127.0.0.1", master.ha_service.port))
        testing.wait_until(lambda: master.ha_service.connections, 5, "connection")
        for i in range(10):                  # 0 acknowledged, so the gap passes 1000 bytes
            r = master.put_message(message(i))
        assert r.status is P.SLAVE_NOT_AVAILABLE
        fake.close()
    finally:
        master.shutdown()


def test_slave_refuses_puts_with_service_not_available(tmp_path):
    slave = open_node(tmp_path / "s", "SLAVE")
    try:
        r = slave.put_message(message(0))
        assert r.status is P.SERVICE_NOT_AVAILABLE and not r.ok
        rs = slave.put_messages([message(1), message(2)])
        assert rs.status is P.SERVICE_NOT_AVAILABLE and rs.count == 0
        assert slave.get_max_phy_offset() == 0
    finally:
        slave.shutdown()


def test_update_ha_master_address_at_run_time_starts_replication(tmp_path):
    master = open_node(tmp_path / "m", "ASYNC_MASTER")
    slave = open_node(tmp_path / "s", "SLAVE")          # no address yet
    try:
        for i in range(50):
            master.put_message(message(i))
        time.sleep(0.3)
        assert slave.get_max_phy_offset() == 0
        slave.update_ha_master_address(f"127.0.0.1:{master.ha_service.port}")
        acked_from_master(master)
        assert slave.get_max_phy_offset() == master.get_max_phy_offset()
    finally:
        slave.shutdown()
        master.shutdown()


# ---- hostile peers -----------------------------------------------------------------------------
class FakeMaster:
    """Accepts one slave, reads its report, sends what the test says; tells whether the slave
    closed the connection."""

    def __init__(self):
        self.listen = socket.create_server(("127.0.0.1", 0))
        self.listen.settimeout(10)
        self.port = self.listen.getsockname()[1]
        self.conn = None

    def accept(self):
        self.conn, _ = self.listen.accept()
        self.conn.settimeout(10)
        report = b""
        while len(report) < 8:
            report += self.conn.recv(8 - len(report))
        return wire.decode_report(report)

    def send(self, data):
        self.conn.sendall(data)

    def closed_by_peer(self, timeout=10.0):
        """True once the slave closed its end (reports are read and dropped)."""
        self.conn.settimeout(timeout)
        try:
            while self.conn.recv(4096):
                pass
        except (ConnectionResetError, socket.timeout) as exc:
            return not isinstance(exc, socket.timeout)
        return True

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.listen.close()


def real_records(tmp_path, count=20):
    """The CommitLog bytes of a real store holding `count` messages."""
    store = open_node(tmp_path / "src", "ASYNC_MASTER")
    try:
        for i in range(count):
            store.put_message(message(i))
        return bytes(store.commitlog.get_data(0, store.get_max_phy_offset()))
    finally:
        store.shutdown()


@pytest.mark.parametrize("attack", ["offset-ahead", "offset-behind", "oversized", "negative",
                                    "half-frame", "unaligned-first", "past-file-end"])
def test_slave_drops_a_hostile_master_and_appends_nothing_out_of_place(tmp_path, attack):
    """Bad frames close the connection; frames cut for files of another size ("unaligned-first",
    "past-file-end") also stop the following, with the reason in HAClient.error."""
    data = real_records(tmp_path)
    fake = FakeMaster()
    slave = open_node(tmp_path / "s", "SLAVE", master=f"127.0.0.1:{fake.port}",
                      housekeeping=800)
    try:
        assert fake.accept() == 0
        good = 0 if attack == "unaligned-first" else 1000
        if good:
            fake.send(wire.encode_header(0, good) + data[:good])
            testing.wait_until(lambda: slave.get_max_phy_offset() == good, 5, "the good frame")
        frame = {
            "offset-ahead": wire.encode_header(good + 1, 10) + data[good:good + 10],
            "offset-behind": wire.encode_header(good - 10, 10) + data[good - 10:good],
            "oversized": wire.encode_header(good, wire.MAX_FRAME_BODY + 1) + b"\0" * 4096,
            "negative": wire.encode_header(good, -1),
            "half-frame": wire.encode_header(good, 500) + data[good:good + 250],
            "unaligned-first": wire.encode_header(100, 10) + data[:10],
            "past-file-end": wire.encode_header(good, FILE) + b"\0" * FILE,
        }[attack]
        fake.send(frame)
        assert fake.closed_by_peer(), "the slave kept the connection"
        assert slave.get_max_phy_offset() == good
        if good:
            assert bytes(slave.commitlog.get_data(0, good)) == data[:good]
        else:
            assert slave.commitlog.mfq.files == []
        client = slave.ha_service.client
        if attack in ("unaligned-first", "past-file-end"):
            testing.wait_until(lambda: not client.following, 5, "the client to stop")
            assert "file-size mismatch" in client.error
            return
        # It reconnects and reports its real offset again.
        assert fake.accept() == good
        assert client.error is None
    finally:
        slave.shutdown()
        fake.close()


def test_master_closes_a_slave_that_never_reads(tmp_path):
    master = open_node(tmp_path / "m", "ASYNC_MASTER", file_size=16 << 20, housekeeping=1000)
    try:
        payload = [Message("Big", os.urandom(4000) * 16) for _ in range(200)]
        for m in payload:
            assert master.put_message(m).ok                # ~12.8 MB in file 0
        fake = socket.create_connection(("127.0.0.1", master.ha_service.port))
        fake.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        fake.sendall(wire.encode_report(0))
        testing.wait_until(lambda: master.ha_service.connections, 5, "connection")
        conn = master.ha_service.connections[0]
        stop = threading.Event()

        def heartbeats():                 # keeps reporting, so only the stalled writer can tell
            while not stop.wait(0.1):
                try:
                    fake.sendall(wire.encode_report(0))
                except OSError:
                    return
        threading.Thread(target=heartbeats, daemon=True).start()
        testing.wait_until(lambda: not master.ha_service.connections, 10, "the master to give up")
        stop.set()
        assert conn.next_transfer_from_where < master.get_max_phy_offset()
        fake.close()
    finally:
        master.shutdown()


def test_master_closes_a_silent_slave_and_one_reporting_beyond_its_data(tmp_path):
    master = open_node(tmp_path / "m", "ASYNC_MASTER", housekeeping=500)
    try:
        master.put_message(message(0))
        silent = socket.create_connection(("127.0.0.1", master.ha_service.port))
        testing.wait_until(lambda: master.ha_service.connections, 5, "connection")
        testing.wait_until(lambda: not master.ha_service.connections, 5, "housekeeping")
        silent.close()
        liar = socket.create_connection(("127.0.0.1", master.ha_service.port))
        liar.sendall(wire.encode_report(master.get_max_phy_offset() + 1))
        testing.wait_until(lambda: master.ha_service.connections == [] and
                   master.ha_service.push2slave_max_offset == 0, 5, "the liar to go")
        liar.settimeout(5)
        assert liar.recv(100) == b""
        liar.close()
    finally:
        master.shutdown()


def test_master_refuses_connections_beyond_ha_max_connections(tmp_path):
    cfg = dataclasses.replace(node_config("ASYNC_MASTER", housekeeping=60_000),
                              ha_max_connections=2)
    master = MessageStore(tmp_path / "m", cfg, kernels=BACKEND)
    master.load()
    master.start()
    socks = []
    try:
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", master.ha_service.port))
            s.sendall(wire.encode_report(0))
            socks.append(s)
        testing.wait_until(lambda: master.ha_service.refused_connections == 3, 5, "refusals")
        assert len(master.ha_service.connections) == 2
        closed = 0
        for s in socks:
            s.settimeout(0.5)
            try:
                closed += s.recv(100) == b""
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed == 3
        for s in socks[:2]:
            s.close()
        socks = socks[2:]
        testing.wait_until(lambda: len(master.ha_service.connections) == 0, 10, "the two to close")
        late = socket.create_connection(("127.0.0.1", master.ha_service.port))
        socks.append(late)
        testing.wait_until(
            lambda: len(master.ha_service.connections) == 1, 5, "a freed slot is used")
    finally:
        for s in socks:
            s.close()
        master.shutdown()


def test_master_closes_a_peer_that_trickles_bytes_but_never_reports_in_time(tmp_path):
    master = open_node(tmp_path / "m", "ASYNC_MASTER", housekeeping=500)
    stop = threading.Event()
    try:
        peer = socket.create_connection(("127.0.0.1", master.ha_service.port))
        report = wire.encode_report(0)

        def trickle():                # a byte every 150 ms: one report per 1.2 s
            i = 0
            while not stop.wait(0.15):
                try:
                    peer.sendall(report[i % 8:i % 8 + 1])
                except OSError:
                    return
                i += 1
        threading.Thread(target=trickle, daemon=True).start()
        testing.wait_until(lambda: master.ha_service.connections, 5, "connection")
        testing.wait_until(lambda: not master.ha_service.connections, 10, "housekeeping")
        peer.settimeout(5)
        try:
            while peer.recv(65536):
                pass
        except ConnectionResetError:
            pass
        peer.close()
    finally:
        stop.set()
        master.shutdown()


def test_slave_fed_a_record_with_a_path_topic_stops_following_and_dispatches_nothing(tmp_path):
    forged = b"../../../outside/X"
    master = open_node(tmp_path / "a" / "b" / "m", "ASYNC_MASTER")
    slave = None
    try:
        for i in range(5):
            assert master.put_message(Message("Good", b"%d" % i)).ok
        victim = master.put_message(Message("T" * len(forged), b"forged"))
        for i in range(5, 10):
            assert master.put_message(Message("Good", b"%d" % i)).ok
        testing.wait_dispatched(master)
        # Damage in the master's CommitLog after its own dispatch: what a slave is then fed.
        mm = master.commitlog.mfq.files[0].mm
        at = mm.find(bytes([len(forged)]) + b"T" * len(forged), victim.commit_log_offset)
        mm[at + 1:at + 1 + len(forged)] = forged
        slave = open_node(tmp_path / "a" / "b" / "s", "SLAVE",
                          master=f"127.0.0.1:{master.ha_service.port}")
        client = slave.ha_service.client
        testing.wait_until(lambda: client.error is not None, 10, "the slave to refuse the record")
        assert "corrupt record from the master at %d" % victim.commit_log_offset in client.error
        testing.wait_until(lambda: not client.following, 5, "the client to stop")
        assert slave.reput_service.reput_from_offset == victim.commit_log_offset
        assert sorted(slave.consume_queue_table) == ["Good"]
        assert slave.get_message("g", "Good", 0, 0, 32).messages.__len__() == 5
    finally:
        if slave is not None:
            slave.shutdown()
        master.shutdown()
    assert sorted(os.listdir(tmp_path)) == ["a"] and sorted(os.listdir(tmp_path / "a")) == ["b"]
    assert sorted(os.listdir(tmp_path / "a" / "b" / "s" / "consumequeue")) == ["Good"]


@pytest.mark.parametrize("master_size,slave_size", [(FILE, 2 * FILE), (2 * FILE, FILE)])
def test_a_master_slave_file_size_mismatch_stops_the_slave_with_a_reason(tmp_path, master_size,
                                                                        slave_size):
    master = open_node(tmp_path / "m", "ASYNC_MASTER", file_size=master_size)
    slave = open_node(tmp_path / "s", "SLAVE", file_size=slave_size,
                      master=f"127.0.0.1:{master.ha_service.port}")
    try:
        testing.wait_until(lambda: master.ha_service.connections and
                   master.ha_service.connections[0].next_transfer_from_where >= 0, 10,
                   "the slave to join")
        i = 0
        while master.get_max_phy_offset() < 3 * max(master_size, slave_size):
            assert master.put_message(message(i)).ok
            i += 1
        client = slave.ha_service.client
        testing.wait_until(lambda: client.error is not None, 15, "the mismatch to be detected")
        assert "file-size mismatch" in client.error
        testing.wait_until(lambda: not client.following, 5, "the client to stop")
        testing.wait_until(lambda: not master.ha_service.connections, 5, "the master to see it go")
        assert "stopped following" in serve._status(slave)
        assert master.ha_service.slave_error is None      # one drop, no loop: no stall
    finally:
        slave.shutdown()
        master.shutdown()


def test_master_names_a_slave_that_keeps_dropping_the_stream_at_one_offset(tmp_path):
    """What a 4.9.x slave with other file sizes does: refuse the frame, reconnect, report the
    same offset again, forever."""
    master = open_node(tmp_path / "m", "ASYNC_MASTER")
    try:
        for i in range(50):
            assert master.put_message(message(i)).ok
        for attempt in range(3):
            assert master.ha_service.slave_error is None
            s = socket.create_connection(("127.0.0.1", master.ha_service.port))
            s.sendall(wire.encode_report(0))
            s.settimeout(5)
            got = b""
            while len(got) < wire.HEADER_SIZE:
                got += s.recv(wire.HEADER_SIZE - len(got))
            assert wire.decode_header(got)[0] == 0
            s.close()
            testing.wait_until(lambda: not master.ha_service.connections, 5, "the drop")
        assert "dropped the connection 3 times in a row at offset 0" in \
            master.ha_service.slave_error
        assert "mapped_file_size_commit_log" in master.ha_service.slave_error
        assert master.ha_service.slave_error in serve._status(master)
    finally:
        master.shutdown()


# ---- CLI ----------------------------------------------------------------------------------------
def test_cli_serve_replicates_between_two_processes_and_stops_on_sigint(tmp_path):
    env = dict(os.environ, ROCKETSTORE_BACKEND=BACKEND)
    base = [sys.executable, "-m", "rocketstore", "serve", "--file-size", str(1 << 20),
            "--status-interval", "0.2"]
    m = subprocess.Popen(base + [str(tmp_path / "m"), "--role", "master", "--listen", "0",
                                 "--produce", "3000", "--batch", "100"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    s = None
    try:
        line = m.stdout.readline().decode()
        assert line.startswith("listening 127.0.0.1:"), line + m.stderr.read().decode()
        port = int(line.split()[1].rsplit(":", 1)[1])
        assert m.stdout.readline().decode().startswith("produced 3000 {'PUT_OK': 3000}")
        s = subprocess.Popen(base + [str(tmp_path / "s"), "--role", "slave", "--master",
                                     f"127.0.0.1:{port}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert s.stdout.readline().decode().startswith(f"slave of 127.0.0.1:{port}")
        name = "%020d" % 0

        def same():
            try:
                return (commitlog_files(tmp_path / "s")[name] ==
                        commitlog_files(tmp_path / "m")[name])
            except (OSError, KeyError):
                return False
        testing.wait_until(same, 15, "the slave's file to match the master's")
    finally:
        for p in (s, m):
            if p is not None:
                p.send_signal(signal.SIGINT)
        for p in (s, m):
            if p is not None:
                out, err = p.communicate(timeout=20)
                assert p.returncode == 0, err.decode()[-2000:]
                assert out.decode().rstrip().endswith("stopped")
    assert_same_commitlog(tmp_path / "m", tmp_path / "s")


def test_master_names_a_slave_that_cleaning_left_behind_its_commit_log(tmp_path, caplog):
    """4.9.8 waits for the deleted offset for good: the slave stays behind without a word."""
    cfg = dataclasses.replace(node_config("ASYNC_MASTER"), file_reserved_time=0,
                              delete_commit_log_files_interval=0,
                              delete_consume_queue_files_interval=0)
    master = MessageStore(tmp_path / "m", cfg, kernels=BACKEND, disk_usage=lambda p: 0.2)
    master.load()
    master.start()
    slave = None
    try:
        address = f"127.0.0.1:{master.ha_service.port}"
        slave = open_node(tmp_path / "s", "SLAVE", master=address)
        assert master.put_message(Message("T", b"a" * 1000)).ok
        testing.wait_until(lambda: slave.get_max_phy_offset() == master.get_max_phy_offset(), 20,
                   "the slave to catch up")
        slave_max = slave.get_max_phy_offset()
        slave.shutdown()
        for _ in range(300):
            assert master.put_message(Message("T", b"b" * 1000)).ok
        testing.wait_dispatched(master)
        testing.wait_flushed(master.commitlog)
        master.execute_delete_files_manually()
        master.clean_files_periodically()
        assert master.get_min_phy_offset() > slave_max
        slave = open_node(tmp_path / "s", "SLAVE", master=address)
        testing.wait_until(lambda: any("cleaning removed the CommitLog" in r.getMessage()
                               for r in caplog.records), 20, "the master to name the slave")
        assert slave.get_max_phy_offset() == slave_max
    finally:
        if slave is not None:
            slave.shutdown()
        master.shutdown()


def test_cli_serve_shuts_down_cleanly_however_many_sigints_arrive(tmp_path):
    # `timeout -s INT` signals the child and then its whole process group, and an impatient
    # user presses Ctrl-C twice: a signal arriving during shutdown must not interrupt it.
    env = dict(os.environ, ROCKETSTORE_BACKEND=BACKEND)
    p = subprocess.Popen([sys.executable, "-m", "rocketstore", "serve", str(tmp_path / "m"),
                          "--listen", "0", "--file-size", str(1 << 20), "--produce", "2000",
                          "--status-interval", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    lines = []
    try:
        assert p.stdout.readline().decode().startswith("listening 127.0.0.1:")
        assert p.stdout.readline().decode().startswith("produced 2000")
        reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
        reader.start()
        # Signals until shutdown is over ("stopped"): the first starts it, the rest land in it.
        while reader.is_alive() and not lines:
            p.send_signal(signal.SIGINT)
            time.sleep(0.001)
        reader.join(20)
        err = p.stderr.read()
        p.wait(20)
    finally:
        if p.poll() is None:
            p.kill()
    # Shut down in full: "stopped" is printed once the store is closed. A signal sent after
    # that may still end the exiting process (rc 130), which harms nothing.
    assert [x.decode().rstrip() for x in lines] == ["stopped"], err.decode()[-2000:]
    assert "already shutting down" in err.decode()
    assert not os.path.exists(tmp_path / "m" / "abort")


def test_a_master_node_waiting_for_its_slave_stops_cleanly_on_sigterm(tmp_path):
    # The README's recipe with a Java peer stops its nodes with SIGTERM, the master possibly
    # still waiting for a slave that never came.
    m = Node(tmp_path / "m", "ASYNC_MASTER", tmp_path, produce=10, wait_slave=True)
    try:
        m.proc.send_signal(signal.SIGTERM)
        assert m.wait_done() == 0           # nothing put: no slave reported
        assert m.next_line() == "stopped"
        assert m.proc.wait(20) == 0
        assert m.acks == []
    finally:
        if m.proc.poll() is None:
            m.kill()
