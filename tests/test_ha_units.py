# SPDX-License-Identifier: Apache-2.0
"""HA classes below the facade (doc/05): HAClient, the master's HAService and its accept loop,
and GroupTransferService, each driven on its own with a real CommitLog
and sockets the test holds, without a MessageStore around them."""
import errno
import os
import socket
import threading

import pytest

from rocketstore import testing
from rocketstore.commitlog import CommitLog
from rocketstore.config import BrokerRole
from rocketstore.fs import FileSystem
from rocketstore.ha import slave as slave_module
from rocketstore.ha import wire
from rocketstore.ha.group_transfer import GroupTransferService
from rocketstore.ha.master import HAService
from rocketstore.ha.slave import HAClient

FILE = 64 * 1024


def make_commitlog(root, role):
    config = testing.small_config(broker_role=role, mapped_file_size_commit_log=FILE)
    commitlog = CommitLog(str(root), config, testing.load_backend(testing.backend_params()[0]),
                          FileSystem())
    commitlog.load()
    return config, commitlog


class FakeMaster:
    """A listening socket the test accepts on and speaks the master side of the wire with."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(10)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.conn = None

    def accept(self):
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(10)
        return self.conn

    def read_report(self):
        return wire.decode_report(recv_exactly(self.conn, wire.REPORT_SIZE))

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


def recv_exactly(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"peer closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


@pytest.fixture
def slave_log(tmp_path):
    config, commitlog = make_commitlog(tmp_path / "slave", BrokerRole.SLAVE)
    yield config, commitlog
    commitlog.stop_puts()
    commitlog.close()


@pytest.fixture
def master():
    m = FakeMaster()
    yield m
    m.close()


# ---- HAClient ---------------------------------------------------------------------------------
def test_client_reports_its_max_offset_on_connect_and_counts_heartbeat_frames(slave_log, master):
    config, commitlog = slave_log
    client = HAClient(config, commitlog, master.address)
    client.start()
    try:
        master.accept()
        assert master.read_report() == 0
        assert client.following and client.connected
        master.conn.sendall(wire.encode_header(0, 0))
        testing.wait_until(lambda: client.frames_received == 1, 10, "the heartbeat frame")
    finally:
        client.shutdown()
    assert not client.following and not client.is_alive


def test_client_appends_a_frame_at_its_max_offset_reports_it_and_wakes_the_reput(slave_log,
                                                                                 master):
    config, commitlog = slave_log
    woken = threading.Event()
    client = HAClient(config, commitlog, master.address, on_append=woken.set)
    client.start()
    try:
        master.accept()
        assert master.read_report() == 0
        body = bytes(range(256)) * 40
        master.conn.sendall(wire.encode_header(0, len(body)) + body)
        assert master.read_report() == len(body)       # acknowledged once it is in the log
        assert commitlog.max_offset == len(body)
        assert bytes(commitlog.get_data(0, len(body))) == body
        assert woken.is_set()
    finally:
        client.shutdown()


class _CountingFileSystem(FileSystem):
    """Counts populates, descriptors opened and closed, and body bytes written with pwrite
    and with splice, on CommitLog files."""

    def __init__(self):
        self.populates = 0
        self.open_fds = set()
        self.opened = 0
        self.pwritten = 0
        self.spliced = 0

    def pwrite(self, fd, data, pos, path):
        super().pwrite(fd, data, pos, path)
        self.pwritten += len(data)

    def splice(self, pipe_fd, fd, count, pos, path):
        super().splice(pipe_fd, fd, count, pos, path)
        self.spliced += count

    def prefault(self, mm, start=0, length=None, chunk=1 << 20, from_end=False):
        self.populates += 1
        return super().prefault(mm, start, length, chunk, from_end)

    def open_fd(self, path, writable=True):
        fd = super().open_fd(path, writable)
        self.open_fds.add(fd)
        self.opened += 1
        return fd

    def close_fd(self, fd):
        self.open_fds.discard(fd)
        super().close_fd(fd)


def _slave_commitlog(tmp_path, fs, heartbeat_ms=None):
    """A slave's config (1 MiB CommitLog files) and its loaded CommitLog over `fs`."""
    config = testing.small_config(broker_role=BrokerRole.SLAVE,
                                  mapped_file_size_commit_log=1 << 20)
    if heartbeat_ms is not None:
        config.ha_send_heartbeat_interval = heartbeat_ms
    commitlog = CommitLog(str(tmp_path / "slave"), config,
                          testing.load_backend(testing.backend_params()[0]), fs)
    commitlog.load()
    return config, commitlog


@pytest.mark.parametrize("splice", [
    pytest.param(True, marks=pytest.mark.skipif(not slave_module.SPLICE,
                                                reason="no splice(2) here")),
    False], ids=["splice", "pwrite"])
def test_client_writes_a_frame_larger_than_its_staging_buffer_without_populating_the_file(
        tmp_path, master, splice):
    # Populating would zero-fill every page before the copy overwrites it (doc/05 §4): the
    # slave's allocator and client populate nothing; the staged part of the body goes in with
    # pwrite, the rest with splice (socket -> pipe -> file) or, without it, pwrite again.
    fs = _CountingFileSystem()
    config, commitlog = _slave_commitlog(tmp_path, fs)
    commitlog.allocator.start()
    client = HAClient(config, commitlog, master.address)
    client.splice = splice
    client.start()
    try:
        master.accept()
        assert master.read_report() == 0
        body = bytes(range(251)) * 2000                 # 502 KB: most of it past the stage
        assert len(body) > slave_module.STAGE_SIZE
        master.conn.sendall(wire.encode_header(0, len(body)) + body)
        testing.wait_until(lambda: commitlog.max_offset == len(body), 10, "the frame")
        assert bytes(commitlog.get_data(0, len(body))) == body
        assert fs.populates == 0
        assert fs.opened == 1 and len(fs.open_fds) == 1  # the file being written
        assert fs.pwritten + fs.spliced == len(body)
        assert fs.pwritten <= slave_module.STAGE_SIZE if splice else fs.spliced == 0
    finally:
        client.shutdown()
        commitlog.allocator.shutdown()
        commitlog.stop_puts()
        commitlog.close()
    assert not fs.open_fds                              # closed with the connection


def _refused_frame_is_taken_again(master, commitlog, fs, body, refused=lambda: True):
    """The master sends one frame of `body` (past the staging buffer), whose write `fs`
    fails once: the client drops the connection with nothing of the frame readable, then
    reconnects, asks for the frame again and takes it whole. `refused()` is checked after
    the failed write."""
    frame = wire.encode_header(0, len(body)) + body
    master.accept()
    assert master.read_report() == 0
    master.conn.sendall(frame)
    try:
        left = recv_exactly_or_eof(master.conn)
    except ConnectionResetError:                  # closed with the frame's rest unread
        left = b""
    assert left == b""                            # the client closed the connection
    assert fs.injected["write"] == 1 and refused()
    assert commitlog.max_offset == 0                  # nothing of the frame is readable
    master.conn.close()
    master.accept()
    assert master.read_report() == 0                  # it asks for the frame again
    master.conn.sendall(frame)
    assert master.read_report() == len(body)
    assert bytes(commitlog.get_data(0, len(body))) == body

def test_client_that_cannot_write_a_frame_publishes_none_of_it_and_takes_it_again_later(
        tmp_path, master):
    fs = testing.FaultInjectingFileSystem()
    # The heartbeat interval is also the wait before reconnecting.
    config, commitlog = _slave_commitlog(tmp_path, fs, heartbeat_ms=200)
    fs.fail("write", errno.EIO, match=os.sep + "commitlog" + os.sep, times=1)
    client = HAClient(config, commitlog, master.address)
    client.start()
    try:
        _refused_frame_is_taken_again(master, commitlog, fs, bytes(range(251)) * 400)
        assert client.following and client.error is None
    finally:
        client.shutdown()
        commitlog.stop_puts()
        commitlog.close()


@pytest.mark.skipif(not slave_module.SPLICE, reason="no splice(2) here")
def test_client_whose_splice_into_the_file_fails_publishes_none_of_the_frame_and_takes_it_again(
        tmp_path, master):
    # The second write of the frame is its first splice (the first is the staged part's pwrite):
    # the fault-injecting file system fails splices like any write.
    fs = testing.FaultInjectingFileSystem()
    # The heartbeat interval is also the wait before reconnecting.
    config, commitlog = _slave_commitlog(tmp_path, fs, heartbeat_ms=200)
    writes = iter(range(1 << 30))
    fs.fail("write", errno.EIO, times=1,
            match=lambda path: os.sep + "commitlog" + os.sep in path and next(writes) == 1)
    spliced = []
    real_splice = fs.splice

    def splice(pipe_fd, fd, count, pos, path):
        spliced.append(count)
        real_splice(pipe_fd, fd, count, pos, path)
    fs.splice = splice
    client = HAClient(config, commitlog, master.address)
    client.start()
    try:
        _refused_frame_is_taken_again(master, commitlog, fs, bytes(range(251)) * 1000,
                                      refused=lambda: spliced)  # the failed write: a splice
        assert client.splice and len(spliced) > 1         # an I/O error is no reason to stop
        assert client.following and client.error is None
    finally:
        client.shutdown()
        commitlog.stop_puts()
        commitlog.close()


class _NoSpliceFileSystem(FileSystem):
    """A file system whose files take no splice (EINVAL, as splice(2) answers then)."""

    def __init__(self):
        self.refused = 0

    def splice(self, pipe_fd, fd, count, pos, path):
        self.refused += 1
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)


@pytest.mark.skipif(not slave_module.SPLICE, reason="no splice(2) here")
def test_client_on_a_file_system_refusing_splice_takes_the_frame_again_at_once_with_pwrite(
        tmp_path, master, monkeypatch):
    # No back-off: the next connection follows at once, even with a day-long reconnect wait.
    monkeypatch.setattr(slave_module, "RECONNECT_INTERVAL_MS", 86_400_000)
    fs = _NoSpliceFileSystem()
    config, commitlog = _slave_commitlog(tmp_path, fs, heartbeat_ms=86_400_000)
    client = HAClient(config, commitlog, master.address)
    client.start()
    body = bytes(range(251)) * 1000                     # 251 KB: past the staging buffer
    frame = wire.encode_header(0, len(body)) + body
    try:
        master.accept()
        assert master.read_report() == 0
        master.conn.sendall(frame)
        try:
            assert recv_exactly_or_eof(master.conn) == b""    # closed: splice refused
        except ConnectionResetError:
            pass
        assert fs.refused == 1 and not client.splice
        assert commitlog.max_offset == 0
        master.conn.close()
        master.accept()
        assert master.read_report() == 0
        master.conn.sendall(frame)
        assert master.read_report() == len(body)
        assert bytes(commitlog.get_data(0, len(body))) == body
        assert fs.refused == 1                            # through the bounce buffer now
        assert client.following and client.error is None
    finally:
        client.shutdown()
        commitlog.stop_puts()
        commitlog.close()


def test_client_drops_a_frame_not_at_its_max_offset_and_writes_nothing(slave_log, master):
    config, commitlog = slave_log
    client = HAClient(config, commitlog, master.address)
    client.start()
    try:
        master.accept()
        assert master.read_report() == 0
        master.conn.sendall(wire.encode_header(0, 8) + b"12345678")
        assert master.read_report() == 8
        master.conn.sendall(wire.encode_header(100, 8) + b"abcdefgh")   # a gap: not 8
        assert recv_exactly_or_eof(master.conn) == b""    # the client closed the connection
        assert commitlog.max_offset == 8
        assert bytes(commitlog.get_data(0, 8)) == b"12345678"
        assert client.following and client.error is None  # it reconnects, not halts
    finally:
        client.shutdown()


def test_client_waiting_to_reconnect_wakes_when_the_master_address_changes(
        slave_log, master, monkeypatch):
    # Without the wakeup the client would wait a whole day before its next attempt.
    monkeypatch.setattr(slave_module, "RECONNECT_INTERVAL_MS", 86_400_000)
    config, commitlog = slave_log
    config.ha_send_heartbeat_interval = 86_400_000
    client = HAClient(config, commitlog, None)
    client.start()
    try:
        assert client.following and client.connections_made == 0
        client.update_master_address(master.address)
        master.accept()
        assert master.read_report() == 0
        assert client.connections_made == 1
    finally:
        client.shutdown()
    assert not client.following


def test_client_halted_from_another_thread_stops_following_and_cuts_the_connection(slave_log,
                                                                                  master):
    config, commitlog = slave_log
    client = HAClient(config, commitlog, master.address)
    client.start()
    try:
        master.accept()
        assert master.read_report() == 0
        client.halt("the master's bytes cannot be kept")
        assert recv_exactly_or_eof(master.conn) == b""
        testing.wait_until(lambda: not client.following, 10, "the client to stop")
        assert client.error == "the master's bytes cannot be kept"
        client.halt("a second reason")                 # the first reason stays
        assert client.error == "the master's bytes cannot be kept"
    finally:
        client.shutdown()


def recv_exactly_or_eof(sock):
    """What the peer sends until it closes (heartbeat reports may come first)."""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return b""


def test_client_shut_down_before_it_started_does_nothing(slave_log):
    config, commitlog = slave_log
    client = HAClient(config, commitlog, "127.0.0.1:1")
    client.shutdown()
    assert not client.following and client.connections_made == 0


# ---- HAService (master) -----------------------------------------------------------------------
def test_master_accepts_a_slave_serves_its_reports_and_closes_everything_on_shutdown(tmp_path):
    config, commitlog = make_commitlog(tmp_path / "master", BrokerRole.SYNC_MASTER)
    config.ha_listen_port = 0
    service = HAService(config, commitlog)
    service.start()
    peer = None
    try:
        peer = socket.create_connection(("127.0.0.1", service.port), timeout=10)
        testing.wait_until(lambda: service.connection_count == 1, 10, "the connection")
        peer.sendall(wire.encode_report(0))
        conn = service.connections[0]
        testing.wait_until(lambda: conn.slave_ack_offset == 0, 10, "the report")
        assert service.push2slave_max_offset == 0
        threads = {t.name for t in threading.enumerate()}
        assert {"HAAcceptSocketService", f"HAReadSocketService-{conn.addr}",
                f"HAWriteSocketService-{conn.addr}"} <= threads
    finally:
        service.shutdown()
        commitlog.close()
    assert service.connections == []
    assert recv_exactly_or_eof(peer) == b""
    peer.close()
    names = {t.name for t in threading.enumerate()}
    assert not any(n.startswith(("HAAcceptSocketService", "HARead", "HAWrite")) for n in names)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", service.port), timeout=1).close()


def test_master_writer_sends_the_log_from_the_reported_offset_and_acks_release_producers(
        tmp_path):
    config, commitlog = make_commitlog(tmp_path / "master", BrokerRole.SYNC_MASTER)
    config.ha_listen_port = 0
    data = bytes(range(256)) * 8
    assert commitlog.append_data(0, data)
    service = HAService(config, commitlog)
    service.start()
    peer = None
    try:
        peer = socket.create_connection(("127.0.0.1", service.port), timeout=10)
        peer.sendall(wire.encode_report(1000))           # a slave that has 1000 bytes
        got = b""
        while len(got) < len(data) - 1000:
            offset, size = wire.decode_header(recv_exactly(peer, wire.HEADER_SIZE))
            if size:
                assert offset == 1000 + len(got)
                got += recv_exactly(peer, size)
        assert got == data[1000:]
        released = []
        waiter = threading.Thread(
            target=lambda: released.append(service.group_transfer.wait_for(len(data), 60_000)))
        waiter.start()
        testing.wait_until(lambda: service.group_transfer.waiting == 1, 10, "a producer")
        peer.sendall(wire.encode_report(len(data)))
        waiter.join(10)
        assert released == [True] and service.push2slave_max_offset == len(data)
    finally:
        service.shutdown()
        if peer is not None:
            peer.close()
        commitlog.close()


# ---- GroupTransferService ---------------------------------------------------------------------
def test_group_transfer_started_again_after_shutdown_parks_producers_again():
    gt = GroupTransferService()
    gt.shutdown()
    assert gt.wait_for(10, 60_000) is False            # stopped: answered at once
    gt.start()
    result = []
    t = threading.Thread(target=lambda: result.append(gt.wait_for(10, 60_000)))
    t.start()
    testing.wait_until(lambda: gt.waiting == 1, 10, "a parked producer")
    gt.notify_transfer_some(10)
    t.join(10)
    assert result == [True] and gt.waiting == 0
