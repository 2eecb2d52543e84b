# SPDX-License-Identifier: Apache-2.0
"""HAService (doc/05 §3): the master's accept loop and one HAConnection per slave, with a
reader thread (offset reports) and a writer thread (CommitLog frames); on a slave it runs
the HAClient instead. Each of these threads is a ServiceThread (services/base.py).

Differences from 4.9.x, all invisible on the wire:
- The listener binds `ha_bind_address` (default 127.0.0.1); 4.9.x binds every interface and
  has no such setting. Set it to 0.0.0.0 (or ::) for the Java behaviour.
- A slave does not listen; a master does not run the client (4.9.x starts both, idle).
- Sockets are blocking with 1 s timeouts, one thread per direction, instead of NIO selectors.
- A writer that makes no progress for `ha_housekeeping_interval` closes the connection (a slave
  that stops reading but keeps reporting would otherwise pin it forever; memory is bounded
  either way: one frame, sent straight from the mapping).
- A first report beyond the master's max offset closes the connection like any later one
  (4.9.x accepts it, and then counts it as an acknowledgement for SYNC_MASTER producers).
- Frames carry up to ha_transfer_batch_size bytes, by default the most a 4.9.x slave takes
  (its 4 MiB read buffer less the 12-byte header), not 4.9.x's 32 KiB: fewer frames and
  offset reports for the same bytes. A 4.9.x slave follows either way.
- Frames are never cut out of the wrong file: 4.9.x's getData(0) on a master whose first file
  expired reads the first file at position 0 and labels it offset 0.
- At most `ha_max_connections` slaves at once; a further connection is closed on accept.
- Housekeeping counts complete offset reports, not bytes: a peer that trickles a byte now and
  then without ever completing a report is closed like a silent one.
- A slave that drops the connection DROPS_BEFORE_ERROR times in a row at the same acknowledged
  offset, with more to send, is logged as an error and named in `slave_error`. That is how a
  CommitLog file-size mismatch or damaged data looks from here: a 4.9.x slave refuses the frame,
  reconnects at the same offset and stalls forever. (Its reports only echo our frames, so the
  slave's file size cannot be seen directly; our slave names the cause itself and stops.)
"""
import logging
import socket
import threading

from ..clock import monotonic_ms
from ..config import BrokerRole
from ..message import PROPERTY_WAIT
from ..services.base import ServiceThread
from ..status import PutMessageStatus
from . import wire
from .group_transfer import GroupTransferService

log = logging.getLogger(__name__)

__all__ = ["HAService", "HAConnection"]

READ_BUFFER_SIZE = 1024 * 1024     # ReadSocketService: 1 MiB, reused when full
DROPS_BEFORE_ERROR = 3
SOCKET_TIMEOUT_S = 1.0             # the 1 s select of every 4.9.x HA loop


class _DataNotifier:
    """WaitNotifyObject: puts on a SYNC_MASTER wake every idle writer. A generation counter
    keeps a wakeup that lands before the writer starts waiting from being lost."""

    def __init__(self):
        self._cond = threading.Condition()
        self.generation = 0

    def wakeup_all(self):
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def wait(self, seen_generation, timeout_s):
        with self._cond:
            if self.generation == seen_generation:
                self._cond.wait(timeout_s)


class HAService:
    """Replication for one store: the listener and its connections on a master, the client
    on a slave, and the SYNC_MASTER acknowledgement wait. It uses the store's config and
    CommitLog only; `on_append` is called when a slave appended replicated records."""

    def __init__(self, config, commitlog, on_append=None):
        self.config = config
        self.commitlog = commitlog
        self.role = self.config.broker_role
        self.group_transfer = GroupTransferService()
        self.notifier = _DataNotifier()
        self.connections = []              # rebound under _conn_lock, read without it
        self._conn_lock = threading.Lock()
        self._acceptor = None              # _AcceptSocketService while listening
        self._stopped = threading.Event()
        self.client = None
        self.port = None                   # the bound HA port (master), for ha_listen_port 0
        self.listen_error = None           # why an ASYNC_MASTER runs without a listener
        self.refused_connections = 0       # closed on accept: ha_max_connections reached
        self.slave_error = None            # a slave that keeps stalling at one offset
        self._drops = {}                   # slave host -> (acked offset, drops there in a row)
        if self.role is BrokerRole.SLAVE:
            from .slave import HAClient
            self.client = HAClient(config, commitlog, config.ha_master_address, on_append)

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self):
        """Bind and start accepting (master) or start following the master (slave)."""
        self._stopped.clear()
        self.group_transfer.start()
        if self.client is not None:
            self.client.start()
            return
        cfg = self.config
        if self.role is BrokerRole.ASYNC_MASTER and not cfg.ha_listen:
            return              # an embedded store opens no port unless asked (ha_listen)
        family = socket.AF_INET6 if ":" in cfg.ha_bind_address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((cfg.ha_bind_address, cfg.ha_listen_port))
            sock.listen(64)
            sock.settimeout(SOCKET_TIMEOUT_S)
        except OSError as exc:
            sock.close()
            self.listen_error = exc
            if self.role is BrokerRole.SYNC_MASTER:
                raise           # every put would answer SLAVE_NOT_AVAILABLE: fail the start
            # An embedded ASYNC_MASTER is mostly a standalone store, and every store starts
            # on the default port: a second one in a process must still open.
            log.error("HA listener disabled: cannot bind %s:%d (%s); no slave can follow this "
                      "store", cfg.ha_bind_address, cfg.ha_listen_port, exc)
            return
        self.port = sock.getsockname()[1]
        self._acceptor = _AcceptSocketService(self, sock)
        self._acceptor.start()
        log.info("HA master listening on %s:%d", cfg.ha_bind_address, self.port)

    def shutdown(self):
        """Stop accepting, close every connection, release waiting producers."""
        self._stopped.set()
        if self.client is not None:
            self.client.shutdown()
        if self._acceptor is not None:
            self._acceptor.shutdown()
            self._acceptor = None
        for conn in list(self.connections):
            conn.shutdown()
        self.group_transfer.shutdown()
        self.notifier.wakeup_all()

    def _accepted(self, sock, addr):
        """A slave connected: serve it, unless ha_max_connections are served already."""
        cap = self.config.ha_max_connections
        with self._conn_lock:
            full = len(self.connections) >= cap
            if not full:
                conn = HAConnection(self, sock, addr)
                self.connections = self.connections + [conn]
        if full:
            self.refused_connections += 1
            log.warning("HA: refusing slave %s: already %d connections "
                        "(ha_max_connections)", addr, cap)
            sock.close()
            return
        log.info("HA: slave %s connected", addr)
        conn.start()

    def _remove(self, conn):
        with self._conn_lock:
            self.connections = [c for c in self.connections if c is not conn]
            self._note_drop(conn)

    def _note_drop(self, conn):
        """Count drops at one offset per slave host (under _conn_lock)."""
        if self._stopped.is_set() or conn.slave_request_offset < 0:
            return
        host = conn.addr[0] if isinstance(conn.addr, tuple) else conn.addr
        ack = conn.slave_ack_offset
        master_max = self.commitlog.max_offset
        if ack >= master_max:
            self._drops.pop(host, None)      # caught up: a drop now is no stall
            return
        last, count = self._drops.get(host, (None, 0))
        count = count + 1 if last == ack else 1
        self._drops[host] = (ack, count)
        if count == DROPS_BEFORE_ERROR:
            self.slave_error = (
                f"slave {host} dropped the connection {count} times in a row at offset {ack} "
                f"(master max {master_max}): it cannot take our data there; check that its "
                f"mapped_file_size_commit_log is {self.config.mapped_file_size_commit_log} "
                "and that its CommitLog is not damaged")
            log.error("HA: %s", self.slave_error)

    # ---- slave -----------------------------------------------------------------------------
    def update_master_address(self, addr):
        """HAClient#updateMasterAddress: used from the next connection on."""
        if self.client is not None:
            self.client.update_master_address(addr)

    # ---- acknowledgements ------------------------------------------------------------------
    @property
    def connection_count(self):
        return len(self.connections)

    @property
    def push2slave_max_offset(self):
        """The highest offset any slave acknowledged."""
        return self.group_transfer.push2slave_max_offset

    def is_slave_ok(self, master_put_where):
        """A slave is connected and within `ha_slave_fallbehind_max` of `master_put_where`."""
        return (len(self.connections) > 0 and master_put_where - self.push2slave_max_offset
                < self.config.ha_slave_fallbehind_max)

    def slave_fall_behind_much(self):
        return self.commitlog.max_offset - self.push2slave_max_offset

    def wakeup_writers(self):
        self.notifier.wakeup_all()

    def make_after_put(self, flush_after_put):
        """The SYNC_MASTER put tail (doc/01 §4 step 12): request the flush and the replica, wait
        for both; the replica's failure status wins over the flush's."""
        gt = self.group_transfer
        timeout_ms = self.config.slave_timeout
        ok = PutMessageStatus.PUT_OK

        def after_put(end_offset, msg):
            if msg.properties.get(PROPERTY_WAIT) == "false":
                return flush_after_put(end_offset, msg) if flush_after_put else ok
            if not self.is_slave_ok(end_offset):
                replica = PutMessageStatus.SLAVE_NOT_AVAILABLE
            else:
                self.notifier.wakeup_all()
                replica = None
            flush = flush_after_put(end_offset, msg) if flush_after_put else ok
            if replica is None:
                replica = ok if gt.wait_for(end_offset, timeout_ms) else \
                    PutMessageStatus.FLUSH_SLAVE_TIMEOUT
            return replica if replica is not ok else flush
        return after_put


class _AcceptSocketService(ServiceThread):
    """AcceptSocketService: takes slave connections on the listening socket, which it owns
    and closes when its loop ends."""

    name = "HAAcceptSocketService"
    join_time_s = 5.0

    def __init__(self, service, sock):
        super().__init__()
        self.service = service
        self.sock = sock

    def run_once(self):
        try:
            sock, addr = self.sock.accept()
        except socket.timeout:
            return
        except OSError as exc:
            if not self.is_stopped:
                log.warning("HA accept failed: %s", exc)
                self._stopped.wait(0.1)
            return
        if self.is_stopped:
            sock.close()
            return
        self.service._accepted(sock, addr)

    def interrupt(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)     # wakes a blocked accept (Linux)
        except OSError:
            pass

    def on_shutdown(self):
        self.sock.close()


class HAConnection:
    """One slave: ReadSocketService and WriteSocketService on one socket (doc/05 §3.2-3.3).
    The reader thread owns the teardown: it joins the writer and closes the socket."""

    def __init__(self, service, sock, addr):
        self.service = service
        self.commitlog = service.commitlog
        self.addr = addr
        self.sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(SOCKET_TIMEOUT_S)
        self.slave_request_offset = -1      # written by the reader thread only
        self.slave_ack_offset = -1          # written by the reader thread only
        self.next_transfer_from_where = -1  # written by the writer thread only
        self._stopped = threading.Event()
        # Set by the first report (or stop): the writer starts at once, not at its next poll.
        self._requested = threading.Event()
        self._reader = _ReadSocketService(self)
        self._writer = _WriteSocketService(self)

    def start(self):
        # Writer first: the reader's teardown joins it, and the reader may end at once.
        self._writer.start()
        self._reader.start()

    @property
    def is_stopped(self):
        return self._stopped.is_set()

    def stop(self, why=None):
        """Make both threads leave; shutting the socket down wakes a blocked recv or send."""
        if self._stopped.is_set():
            return
        if why:
            log.warning("HA: closing connection to slave %s: %s", self.addr, why)
        self._stopped.set()
        self._requested.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._writer.stop()
        self._reader.stop()
        self.service.notifier.wakeup_all()

    def shutdown(self, timeout=5.0):
        """Stop and wait for both threads to end (the reader joins the writer)."""
        self.stop()
        self._reader.join(timeout)

    def _on_report(self, offset):
        master_max = self.commitlog.max_offset
        self.slave_ack_offset = offset
        if offset > master_max:
            self.stop(f"slave reports offset {offset} beyond the master's max {master_max}")
            return False
        if self.slave_request_offset < 0:
            self.slave_request_offset = offset
            self._requested.set()
            log.info("HA: slave %s requests offset %d", self.addr, offset)
        self.service.group_transfer.notify_transfer_some(offset)
        return True

    def _teardown(self):
        """The reader's last act: the writer ends, the socket closes, the service forgets us."""
        self._writer.join(10)
        try:
            self.sock.close()
        except OSError:
            pass
        self.service._remove(self)
        log.info("HA: connection to slave %s closed", self.addr)


class _ReadSocketService(ServiceThread):
    """ReadSocketService: takes the slave's offset reports; closes a silent slave."""

    join_time_s = 10.0

    def __init__(self, conn):
        super().__init__(f"HAReadSocketService-{conn.addr}")
        self.conn = conn
        self._buf = bytearray(READ_BUFFER_SIZE)
        self._view = memoryview(self._buf)
        self._pos = self._process = 0
        self._last_report = monotonic_ms()
        self._housekeeping = conn.service.config.ha_housekeeping_interval

    def run_once(self):
        conn = self.conn
        buf = self._buf
        if self._pos == len(buf):          # full: reuse from the start, as 4.9.x does
            self._pos = self._process = 0
        try:
            n = conn.sock.recv_into(self._view[self._pos:])
        except socket.timeout:
            n = None
        except OSError as exc:
            conn.stop(f"read failed: {exc}")
            return
        now = monotonic_ms()
        if n == 0:
            conn.stop("the slave closed the connection")
            return
        if n:
            self._pos += n
            offset, self._process = wire.last_report(buf, self._process, self._pos)
            if offset is not None:
                self._last_report = now
                if not conn._on_report(offset):
                    return
        if now - self._last_report > self._housekeeping:
            conn.stop(f"housekeeping: no offset report for {now - self._last_report} ms")

    def on_error(self):
        self.conn.stop()

    def on_shutdown(self):
        self._view.release()
        self.conn._teardown()


class _WriteSocketService(ServiceThread):
    """WriteSocketService: sends CommitLog frames from the slave's requested offset, and a
    heartbeat header when idle."""

    join_time_s = 10.0

    def __init__(self, conn):
        super().__init__(f"HAWriteSocketService-{conn.addr}")
        self.conn = conn
        cfg = conn.service.config
        self._commitlog = conn.commitlog
        self._heartbeat = cfg.ha_send_heartbeat_interval
        self._housekeeping = cfg.ha_housekeeping_interval
        self._batch = cfg.ha_transfer_batch_size
        self._last_write = monotonic_ms()

    def run_once(self):
        conn = self.conn
        commitlog = self._commitlog
        if conn.slave_request_offset < 0:
            conn._requested.wait(SOCKET_TIMEOUT_S)
            return
        if conn.next_transfer_from_where < 0:
            if conn.slave_request_offset == 0:
                # A brand-new slave gets the master's last file, not its history.
                master_max = commitlog.max_offset
                file_size = commitlog.file_size
                conn.next_transfer_from_where = max(0, master_max - master_max % file_size)
            else:
                conn.next_transfer_from_where = conn.slave_request_offset
            log.info("HA: transfer to slave %s starts at %d", conn.addr,
                     conn.next_transfer_from_where)
        if monotonic_ms() - self._last_write > self._heartbeat:
            if not self._send([wire.encode_header(conn.next_transfer_from_where, 0)]):
                return
        notifier = conn.service.notifier
        generation = notifier.generation
        if not self._transfer() and not self.is_stopped:
            notifier.wait(generation, 0.1)

    def on_error(self):
        self.conn.stop()

    def on_shutdown(self):
        self.conn.stop()

    def _transfer(self):
        """Send one frame from next_transfer_from_where; False if there is nothing to send."""
        conn = self.conn
        commitlog = self._commitlog
        offset = conn.next_transfer_from_where
        with commitlog.held_slice(offset, self._batch) as body:
            if body is None:
                if offset < commitlog.min_offset:
                    # 4.9.8 waits here for good, and the slave stays behind without a word.
                    conn.stop(f"the slave needs offset {offset}, but cleaning removed the "
                              f"CommitLog below {commitlog.min_offset}: it cannot catch up; "
                              "give it a copy of the master's store")
                return False
            size = len(body)
            if not self._send([wire.encode_header(offset, size), body]):
                return True
        conn.next_transfer_from_where = offset + size
        return True

    def _send(self, parts):
        """Write every byte of `parts` (a frame), waiting in 1 s slices; stop the connection on
        error, shutdown, or no progress for ha_housekeeping_interval."""
        conn = self.conn
        sock = conn.sock
        parts = [memoryview(p) for p in parts]
        try:
            while parts:
                if conn.is_stopped:
                    return False
                try:
                    n = sock.sendmsg(parts)
                except socket.timeout:
                    stalled = monotonic_ms() - self._last_write
                    if stalled > self._housekeeping:
                        conn.stop(f"housekeeping: the slave read nothing for {stalled} ms")
                        return False
                    continue
                except OSError as exc:
                    conn.stop(f"write failed: {exc}")
                    return False
                self._last_write = monotonic_ms()
                while n:
                    head = parts[0]
                    if n >= len(head):
                        n -= len(head)
                        head.release()
                        parts.pop(0)
                    else:
                        parts[0] = head[n:]
                        head.release()
                        n = 0
            return True
        finally:
            for p in parts:
                p.release()
