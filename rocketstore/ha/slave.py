# SPDX-License-Identifier: Apache-2.0
"""HAClient (spec 05 §4): a slave connects to its master, reports its CommitLog max offset,
and appends each frame whose offset equals its own max offset; anything else drops the
connection, and the next connection re-reports the real offset.

Differences from 4.9.x, invisible on the wire:
- The first report goes out as soon as the connection is up (4.9.x waits one heartbeat
  interval, ~5 s); the reconnect wait is min(5 s, ha_send_heartbeat_interval).
- Besides 4.9.x's housekeeping (nothing written for ha_housekeeping_interval) the slave also
  closes when nothing was read for that long: a master sends a heartbeat every
  ha_send_heartbeat_interval, so silence (or a frame left half written) means it is gone.
- A frame body larger than the 4 MiB read buffer (wire.MAX_FRAME_BODY) or negative closes
  the connection; 4.9.x would wait for it forever.
- An empty slave accepts a first frame only at a file boundary (4.9.x would write it at the
  start of a file named by the rounded-down offset, out of place).
- The client stops following for good (until the store restarts), with `error` saying why,
  when the master's bytes cannot be used: a frame crossing one of our file boundaries or a
  first frame off our file grid (the master's files have another size), and, from the reput
  thread, a corrupt record or an end-of-file blank that disagrees with our file size. 4.9.x
  reconnects and stalls forever at "dispatch behind".
"""
import logging
import socket
import threading
import time

from . import wire

log = logging.getLogger(__name__)

__all__ = ["HAClient"]

RECONNECT_INTERVAL_MS = 5000
CONNECT_TIMEOUT_S = 3.0


def _now_ms():
    return time.monotonic_ns() // 1_000_000


class HAClient:
    """The slave side of one store's replication: a single thread that (re)connects, reports
    and appends. The slave CommitLog's only writer."""

    def __init__(self, store, master_address=None):
        self.store = store
        self.config = store.config
        self.master_address = master_address      # rebound by update_master_address
        self.connected = False
        self.connections_made = 0                 # for tests and logs
        self.frames_received = 0
        self._sock = None                         # used by the client thread only
        self._stopped = threading.Event()
        self._wake = threading.Event()            # ends a reconnect wait early
        self._thread = None
        self._buf = bytearray(wire.SLAVE_READ_BUFFER_SIZE)
        self._pos = 0                             # bytes received into _buf
        self._dispatch = 0                        # first byte of _buf not yet appended
        self._reported = 0
        self._last_write = 0
        self._last_read = 0
        self.error = None                         # why replication stopped for good

    @property
    def following(self):
        """Whether the client thread still (re)connects and appends."""
        return self._thread is not None and self._thread.is_alive()

    def update_master_address(self, addr):
        """Use `addr` ("host:port") from the next connection on (HAClient#updateMasterAddress
        keeps the current connection)."""
        if addr is not None:
            wire.parse_address(addr)
        if addr != self.master_address:
            log.info("HA: master address %s -> %s", self.master_address, addr)
            self.master_address = addr
            self._wake.set()

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self):
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="HAClient")
        self._thread.start()

    def shutdown(self):
        self._stop_and_cut()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        self._thread = None

    def halt(self, reason):
        """Stop following the master until the store restarts: what it sends cannot be kept
        (corrupt, or cut for files of another size). Any thread may call it."""
        if self.error is None:
            self.error = reason
            log.error("HA client: stopped following master %s: %s", self.master_address,
                      reason)
        self._stop_and_cut()

    def _stop_and_cut(self):
        """Stop the loop and cut the connection, so a blocked read returns at once."""
        self._stopped.set()
        self._wake.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _run(self):
        cfg = self.config
        retry_s = min(RECONNECT_INTERVAL_MS, cfg.ha_send_heartbeat_interval) / 1000.0
        while not self._stopped.is_set():
            try:
                if self._connect():
                    self._serve()
                else:
                    self._wake.wait(retry_s)
                    self._wake.clear()
            except Exception:
                log.exception("HA client: unexpected error")
                self._close()
                self._wake.wait(retry_s)
                self._wake.clear()
        self._close()

    # ---- connection -----------------------------------------------------------------------
    def _connect(self):
        addr = self.master_address
        if not addr:
            return False
        try:
            host, port = wire.parse_address(addr)
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            log.info("HA client: cannot connect to master %s: %s", addr, exc)
            return False
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(min(1.0, self.config.ha_send_heartbeat_interval / 1000.0))
        self._sock = sock
        self.connected = True
        self.connections_made += 1
        self._pos = self._dispatch = 0
        self._reported = self.store.commitlog.max_offset
        self._last_write = self._last_read = _now_ms()
        log.info("HA client: connected to master %s, slave max offset %d", addr,
                 self._reported)
        return self._report(self._reported)

    def _close(self, why=None):
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if why:
            log.warning("HA client: closing connection to master %s: %s",
                        self.master_address, why)
        self.connected = False
        try:
            sock.close()
        except OSError:
            pass
        self._pos = self._dispatch = 0
        self._last_write = 0

    def _report(self, offset):
        try:
            self._sock.sendall(wire.encode_report(offset))
        except OSError as exc:
            self._close(f"report failed: {exc}")
            return False
        self._reported = offset
        self._last_write = _now_ms()
        return True

    def _serve(self):
        cfg = self.config
        heartbeat = cfg.ha_send_heartbeat_interval
        housekeeping = cfg.ha_housekeeping_interval
        buf = self._buf
        view = memoryview(buf)
        try:
            while self._sock is not None and not self._stopped.is_set():
                if _now_ms() - self._last_write > heartbeat:
                    if not self._report(self._reported):
                        return
                try:
                    n = self._sock.recv_into(view[self._pos:])
                except socket.timeout:
                    n = None
                except OSError as exc:
                    self._close(f"read failed: {exc}")
                    return
                if n == 0:
                    self._close(None if self._stopped.is_set() else
                                "the master closed the connection")
                    return
                now = _now_ms()
                if n:
                    self._pos += n
                    self._last_read = now
                    if not self._dispatch_frames(view):
                        return
                    max_offset = self.store.commitlog.max_offset
                    if max_offset > self._reported and not self._report(max_offset):
                        return
                if now - self._last_write > housekeeping:
                    self._close(f"housekeeping: nothing written for {now - self._last_write} ms")
                    return
                if now - self._last_read > housekeeping:
                    self._close(f"housekeeping: nothing read for {now - self._last_read} ms")
                    return
        finally:
            view.release()

    def _dispatch_frames(self, view):
        """dispatchReadRequest: append every complete frame in the buffer. False (and the
        connection closed) on a frame that does not belong at the slave's max offset."""
        buf = self._buf
        store = self.store
        commitlog = store.commitlog
        pos, dispatch = self._pos, self._dispatch
        appended = False
        while pos - dispatch >= wire.HEADER_SIZE:
            try:
                offset, size = wire.decode_header(buf, dispatch)
            except wire.FrameError as exc:
                self._close(str(exc))
                return False
            slave_max = commitlog.max_offset
            if slave_max != 0 and slave_max != offset:
                self._close(f"master frame offset {offset} != slave max offset {slave_max}")
                return False
            fs = commitlog.file_size
            if size and (offset // fs != (offset + size - 1) // fs or
                         (slave_max == 0 and offset % fs)):
                # A master cuts frames at its own file ends and starts an empty slave at one,
                # so a frame off our grid means its files are not our size.
                self.halt(f"CommitLog file-size mismatch: the master sent {size} bytes at "
                          f"offset {offset}, which do not fit this slave's {fs}-byte files")
                self._close()
                return False
            end = dispatch + wire.HEADER_SIZE + size
            if end > pos:
                break
            if size:
                with view[dispatch + wire.HEADER_SIZE:end] as body:
                    ok = commitlog.append_data(offset, body)
                if not ok:
                    self._close(f"cannot append {size} bytes at offset {offset} (slave max "
                                f"{slave_max}, file size {commitlog.file_size})")
                    return False
                appended = True
            self.frames_received += 1
            dispatch = end
        if appended and store.reput_service is not None:
            store.reput_service.wakeup()
        if dispatch == pos:
            dispatch = pos = 0
        elif pos == len(buf) or len(buf) - pos < 64 * 1024:
            # Move the unread tail to the front (reallocateByteBuffer); a frame is at most
            # the buffer's size, so it always completes from there.
            tail = pos - dispatch
            buf[:tail] = bytes(view[dispatch:pos])
            dispatch, pos = 0, tail
        self._pos, self._dispatch = pos, dispatch
        return True
