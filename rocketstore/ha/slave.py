# SPDX-License-Identifier: Apache-2.0
"""HAClient (doc/05 §4): a slave connects to its master, reports its CommitLog max offset,
and appends each frame whose offset equals its own max offset; anything else drops the
connection, and the next connection re-reports the real offset.

Frame bodies are written into the CommitLog file at the file's write position: headers (and
whatever follows them in the same read) land in a 64 KiB staging buffer and are written from
there with pwrite. On Linux the rest of a body goes socket -> pipe -> file with splice(2): the
socket's receive buffers are moved into the pipe by reference, and the page cache copies them
from there, so the bytes cross memory once on this side, not twice (into a buffer, then into
the page cache). For a 192 MiB copy on the loaded 2-core machine that was 10-20 % less CPU in a
bare receiver, but 0-8 % in this thread (medians of three runs alternating the two: 101, 105,
101 ms against 102, 108, 110 ms with pwrite; single benchmark runs have gone either way):
writing 192 MiB of fresh page cache is most of its cost either way. Elsewhere, or
when the kernel or the file system refuses to splice, the rest of a body is received into a
reused 4 MiB bounce buffer (4.9.x's read buffer size, which holds any frame body) as far as
the socket has it, and pwritten from there. The mapping shows the same page-cache pages, so
the reput and readers see the bytes once the frame is published.
Receiving straight into the mapping instead needs its pages populated first: the page cache
zero-fills each page (MADV_POPULATE_WRITE, one page per fault in a file advised MADV_RANDOM)
before the socket copy overwrites it. For a 192 MiB copy that took the slave's threads
230-270 ms of CPU, against 110-150 ms with pwrite, which takes whole pages without zero-filling
them, in large folios where the file system has them (doc/05 §4; bench/bench_ha.py shows each
thread's CPU); splice writes the same way. So a slave's allocator creates and reserves files
ahead but populates nothing.
With a pooled write buffer (transient store pool) bodies are received straight into it,
populated first, as before.

Differences from 4.9.x, invisible on the wire:
- The first report goes out as soon as the connection is up (4.9.x waits one heartbeat
  interval, ~5 s); the reconnect wait is min(5 s, ha_send_heartbeat_interval).
- Reports are rate-limited, not sent per frame: when the offset advanced and nothing more is
  waiting on the socket (so a SYNC_MASTER producer is acknowledged as soon as its bytes are
  in), and while data keeps coming, once REPORT_INTERVAL_NS or REPORT_BYTES has passed; plus
  the heartbeat of every ha_send_heartbeat_interval.
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
import errno
import fcntl
import logging
import os
import select
import socket

from ..clock import monotonic_ms, monotonic_ns
from ..services.base import ServiceThread
from . import wire

log = logging.getLogger(__name__)

__all__ = ["HAClient"]

RECONNECT_INTERVAL_MS = 5000
CONNECT_TIMEOUT_S = 3.0
STAGE_SIZE = 64 * 1024            # headers and small frames; larger bodies skip it
POPULATE_MIN = 64 * 1024          # a body this long has its pages populated before receiving
# The rest of a body: received here, then written with pwrite. One frame body fits; a smaller
# buffer meant more receive/pwrite rounds through Python for the same bytes (256 KiB: ~40 %
# more of the client thread's CPU than 4 MiB).
BOUNCE_SIZE = wire.SLAVE_READ_BUFFER_SIZE
# While more data waits on the socket, an advanced offset is reported after this long or this
# many bytes, whichever comes first (when nothing waits, it is reported at once).
REPORT_INTERVAL_NS = 1_000_000
REPORT_BYTES = 4 * 1024 * 1024
# socket -> pipe -> file (Linux). Each splice moves at most a pipe's worth: the pipe is made
# this large where the system lets it (/proc/sys/fs/pipe-max-size is 1 MiB by default; the
# default pipe, 64 KiB, meant ~16 times the splice calls).
SPLICE = hasattr(os, "splice") and hasattr(fcntl, "F_SETPIPE_SZ")
PIPE_SIZE = 1024 * 1024
# What splice(2) answers where the kernel or the file system cannot splice.
_NO_SPLICE = frozenset((errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP))


class HAClient(ServiceThread):
    """The slave side of one store's replication: a single ServiceThread that (re)connects,
    reports and appends, one connection per run_once. The slave CommitLog's only writer."""

    name = "HAClient"
    join_time_s = 10.0

    def __init__(self, config, commitlog, master_address=None, on_append=None):
        """`commitlog` is the one this client appends to; `on_append` (no arguments) is
        called after each complete frame, so the store dispatches it (and a SYNC_FLUSH store
        syncs it) at once."""
        super().__init__()
        self.config = config
        self.commitlog = commitlog
        self._on_append = on_append
        self.master_address = master_address      # rebound by update_master_address
        self.connected = False
        self.connections_made = 0                 # for tests and logs
        self.frames_received = 0                  # complete frames, heartbeats included
        self.reports_sent = 0
        self._sock = None                         # used by the client thread only
        self._stage = bytearray(STAGE_SIZE)
        self._pos = 0                             # bytes received into _stage
        self._dispatch = 0                        # first byte of _stage not yet used
        # The frame whose body is being received straight into the mapping: its file, the
        # body's first position in it, its size and how much of it arrived.
        self._frame_mf = None
        self._frame_rel = 0
        self._frame_size = 0
        self._frame_got = 0
        self._frame_view = None                   # a view of the body in the mapping
        # The file being written with pwrite, and its descriptor (see _open_frame).
        self._file_mf = None
        self._file_fd = None
        # splice: (read end, write end, size) of this connection's pipe, or None (pwrite
        # through the bounce buffer). `splice` turns False for good (until the store restarts)
        # once the kernel or the file system refused a splice.
        self.splice = SPLICE
        self._pipe = None
        self._reported = 0
        self._report_ns = 0                       # monotonic ns of the last report
        self._last_write = 0
        self._last_read = 0
        self.error = None                         # why replication stopped for good
        self._back_off = False                    # wait before reconnecting (disk full)

    @property
    def following(self):
        """Whether the client thread still (re)connects and appends."""
        return self.is_alive

    def update_master_address(self, addr):
        """Use `addr` ("host:port") from the next connection on (HAClient#updateMasterAddress
        keeps the current connection)."""
        if addr is not None:
            wire.parse_address(addr)
        if addr != self.master_address:
            log.info("HA: master address %s -> %s", self.master_address, addr)
            self.master_address = addr
            self.wakeup()                         # ends a reconnect wait early

    # ---- lifecycle (ServiceThread) --------------------------------------------------------
    def halt(self, reason):
        """Stop following the master until the store restarts: what it sends cannot be kept
        (corrupt, or cut for files of another size). Any thread may call it."""
        if self.error is None:
            self.error = reason
            log.error("HA client: stopped following master %s: %s", self.master_address,
                      reason)
        self.stop()

    def interrupt(self):
        """Cut the connection, so a blocked read returns at once."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _retry_ms(self):
        return min(RECONNECT_INTERVAL_MS, self.config.ha_send_heartbeat_interval)

    def run_once(self):
        """One connection: connect, follow until it ends, then wait before the next one
        (unless it ended cleanly and there is no reason to wait)."""
        if self._connect():
            self._serve()
            if not self._back_off:
                return
            # The disk refused the space: asking again at once would only fetch the same
            # frame for nothing.
            self._back_off = False
        self.wait_for_running(self._retry_ms())

    def on_error(self):
        self._close()
        self.wait_for_running(self._retry_ms())

    def on_shutdown(self):
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
        self._reported = self.commitlog.max_offset
        self._last_write = self._last_read = monotonic_ms()
        self._pipe = self._open_pipe()
        log.info("HA client: connected to master %s, slave max offset %d", addr,
                 self._reported)
        return self._report(self._reported)

    def _close(self, why=None):
        self._drop_frame()
        self._close_file()
        self._close_pipe()
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
        self._report_ns = monotonic_ns()
        self._last_write = monotonic_ms()
        self.reports_sent += 1
        return True

    def _report_progress(self, poller):
        """Report an advanced max offset now, unless more data already waits on the socket
        and the last report is recent (REPORT_INTERVAL_NS, REPORT_BYTES): the report then
        goes out once that data is in. Never block in a receive with an advance unreported:
        a SYNC_MASTER producer waits for it."""
        max_offset = self.commitlog.max_offset
        if max_offset <= self._reported:
            return True
        if (max_offset - self._reported < REPORT_BYTES
                and monotonic_ns() - self._report_ns < REPORT_INTERVAL_NS
                and poller.poll(0)):
            return True
        return self._report(max_offset)

    # ---- splice -----------------------------------------------------------------------------
    def _open_pipe(self):
        """This connection's pipe for splice, as large as PIPE_SIZE where the system lets it;
        None when splice is off or no pipe can be had (bodies then go through the bounce
        buffer)."""
        if not self.splice:
            return None
        try:
            r, w = os.pipe()
        except OSError as exc:
            log.warning("HA client: no pipe for splice (%s); receiving through a buffer", exc)
            return None
        try:
            size = fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            # Above pipe-max-size, or the user's pipe quota is used up: the default size.
            size = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
        return r, w, size

    def _close_pipe(self):
        """Close this connection's pipe, and whatever bytes it still held."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            os.close(pipe[0])
            os.close(pipe[1])

    def _no_splice(self, exc, what):
        """The kernel or the file system refused a splice: bodies go through the bounce
        buffer from the next connection on, which follows at once (the frame being received
        is not published, so the master sends it again)."""
        self.splice = False
        self._close(f"cannot splice {what} ({exc}); receiving through a buffer from now on")

    def _splice_in(self, sock, pipe, poller, wait_ms):
        """Move the next bytes of the frame's body, as many as the socket has (at most a
        pipe's worth), from the socket into the empty pipe. The socket is non-blocking (it
        has a timeout), so wait up to `wait_ms` for data first when it has none. Returns the
        bytes moved, 0 at the end of the stream, None when nothing came, False (and the
        connection closed) when splice is refused; raises OSError as a receive would."""
        want = min(pipe[2], self._frame_size - self._frame_got)
        for attempt in (0, 1):
            try:
                return os.splice(sock.fileno(), pipe[1], want)
            except BlockingIOError:
                if attempt or not poller.poll(wait_ms):
                    return None
            except OSError as exc:
                if exc.errno not in _NO_SPLICE:
                    raise
                self._no_splice(exc, "from the socket")
                return False
        return None

    def _splice_body(self, n, pos):
        """Move the `n` body bytes in the pipe to `pos` of the frame's file, all of them;
        False (and the connection closed) when the file refuses them, as _write_body."""
        mf = self._file_mf
        try:
            mf.splice(self._pipe[0], self._file_fd, n, pos)
        except OSError as exc:
            if exc.errno in _NO_SPLICE:
                self._no_splice(exc, f"into {mf.path}")
                return False
            self._back_off = True
            self._close(f"cannot write {n} bytes at {mf.path}:{pos}: {exc}")
            return False
        return True

    def _serve(self):
        cfg = self.config
        heartbeat = cfg.ha_send_heartbeat_interval
        housekeeping = cfg.ha_housekeeping_interval
        sock = self._sock
        stage = memoryview(self._stage)
        # Bodies either pass through this connection's pipe or through its bounce buffer.
        pipe = self._pipe
        bounce = memoryview(bytearray(0 if pipe else BOUNCE_SIZE))
        wait_ms = int(sock.gettimeout() * 1000)
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        try:
            while self._sock is not None and not self.is_stopped:
                if monotonic_ms() - self._last_write > heartbeat:
                    if not self._report(self._reported):
                        return
                body = self._frame_view
                direct = self._frame_got < self._frame_size and self._file_fd is not None
                try:
                    if direct and pipe:
                        # The rest of a frame's body, into the pipe (then the file).
                        n = self._splice_in(sock, pipe, poller, wait_ms)
                        if n is False:
                            return
                    elif direct:
                        # The rest of a frame's body, through the bounce buffer.
                        want = min(BOUNCE_SIZE, self._frame_size - self._frame_got)
                        with bounce[:want] as part:
                            n = sock.recv_into(part)
                    elif body is not None:
                        # The rest of a frame's body, straight into the pooled write buffer.
                        with body[self._frame_got:] as rest:
                            n = sock.recv_into(rest)
                    else:
                        n = sock.recv_into(stage[self._pos:])
                except socket.timeout:
                    n = None
                except OSError as exc:
                    self._close(f"read failed: {exc}")
                    return
                if n == 0:
                    self._close(None if self.is_stopped else
                                "the master closed the connection")
                    return
                now = monotonic_ms()
                if n:
                    self._last_read = now
                    if direct and pipe:
                        ok = (self._splice_body(n, self._frame_rel + self._frame_got)
                              and self._body_received(n))
                    elif direct:
                        with bounce[:n] as part:
                            ok = (self._write_body(part, self._frame_rel + self._frame_got)
                                  and self._body_received(n))
                    elif body is not None:
                        ok = self._body_received(n)
                    else:
                        self._pos += n
                        ok = self._dispatch_frames(stage)
                    if not ok or not self._report_progress(poller):
                        return
                if now - self._last_write > housekeeping:
                    self._close(f"housekeeping: nothing written for {now - self._last_write} ms")
                    return
                if now - self._last_read > housekeeping:
                    self._close(f"housekeeping: nothing read for {now - self._last_read} ms")
                    return
        finally:
            stage.release()
            bounce.release()
            self._drop_frame()

    # ---- frames ---------------------------------------------------------------------------
    def _dispatch_frames(self, stage):
        """dispatchReadRequest over the staging buffer: check each header, write the body
        bytes staged with it, and leave a body's rest to be received into the mapping. False
        (and the connection closed) on a frame that does not belong at the slave's max
        offset."""
        buf = self._stage
        commitlog = self.commitlog
        pos, dispatch = self._pos, self._dispatch
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
            dispatch += wire.HEADER_SIZE
            if size == 0:
                self.frames_received += 1
                continue
            if not self._open_frame(offset, size):
                return False
            staged = min(size, pos - dispatch)
            mf, rel = self._frame_mf, self._frame_rel
            if staged:
                if self._file_fd is not None:
                    with stage[dispatch:dispatch + staged] as part:
                        if not self._write_body(part, rel):
                            return False
                else:
                    mf.write_target[rel:rel + staged] = stage[dispatch:dispatch + staged]
                dispatch += staged
                if not self._body_received(staged):
                    return False
            if staged < size:
                # The staging buffer is used up: the rest is received by _serve, written with
                # pwrite (or straight into a pooled write buffer).
                if self._file_fd is None:
                    self._frame_view = memoryview(mf.write_target)[rel:rel + size]
                break
        # Only part of a header can be left: move it to the front.
        tail = pos - dispatch
        if tail:
            buf[:tail] = buf[dispatch:pos]
        self._pos, self._dispatch = tail, 0
        return True

    def _open_frame(self, offset, size):
        """Make the file ready for a frame's body: reserved, and its pages populated when the
        body is large (a no-op where the allocator got there first)."""
        commitlog = self.commitlog
        try:
            mf = commitlog.replica_target(offset, size)
        except OSError as exc:
            self._back_off = True
            self._close(f"cannot reserve {size} bytes at offset {offset}: {exc}")
            return False
        if mf is None:
            self._close(f"cannot append {size} bytes at offset {offset} (slave max "
                        f"{commitlog.max_offset}, file size {commitlog.file_size})")
            return False
        rel = mf.wrote_position
        if mf.write_target is mf.mm:
            # Written with pwrite: nothing to populate (see the module docstring).
            if mf is not self._file_mf:
                self._close_file()
                try:
                    self._file_fd = mf.open_writer_fd()
                except OSError as exc:
                    self._close(f"cannot open {mf.path} for writing: {exc}")
                    return False
                self._file_mf = mf
        else:
            # A pooled write buffer (transient store pool): bodies are received into it.
            self._close_file()
            if size >= POPULATE_MIN:
                mf.populate(rel, rel + size)
        self._frame_mf, self._frame_rel = mf, rel
        self._frame_size, self._frame_got = size, 0
        return True

    def _write_body(self, data, pos):
        """Write `data` (body bytes) at `pos` of the frame's file with pwrite, all of it;
        False (and the connection closed) when the file refuses them. The blocks are reserved
        already, so this is an I/O error rather than a full disk: the frame is not published,
        and the next connection, after the reconnect wait, asks for it again."""
        mf = self._file_mf
        try:
            mf.pwrite(self._file_fd, data, pos)
        except OSError as exc:
            self._back_off = True
            self._close(f"cannot write {len(data)} bytes at {mf.path}:{pos}: {exc}")
            return False
        return True

    def _close_file(self):
        """Close the descriptor of the file written with pwrite, if one is open."""
        mf, fd = self._file_mf, self._file_fd
        self._file_mf = self._file_fd = None
        if fd is not None:
            try:
                mf.close_fd(fd)
            except OSError:
                pass

    def _body_received(self, n):
        """`n` more body bytes are in the file. A complete frame becomes readable (and
        counts in the reported offset) and wakes the reput; a partial one stays past the
        write position, as 4.9.x keeps it in its read buffer: a connection lost mid-frame
        leaves the CommitLog at the frame's start, and the next one asks for it again."""
        self._frame_got += n
        if self._frame_got < self._frame_size:
            return True
        mf, start = self._frame_mf, self._frame_rel
        end = start + self._frame_size
        self._drop_frame()
        if not self.commitlog.publish_replica(mf, start, end):
            self._close("the frame was not published: the store is shutting down, or its "
                        "CommitLog was cut meanwhile")
            return False
        self.frames_received += 1
        if self._on_append is not None:
            self._on_append()
        return True

    def _drop_frame(self):
        """Forget the frame being received (complete, or its connection lost)."""
        view, self._frame_view = self._frame_view, None
        self._frame_mf = None
        self._frame_size = self._frame_got = 0
        if view is not None:
            view.release()
