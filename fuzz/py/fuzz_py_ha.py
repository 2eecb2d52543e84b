# SPDX-License-Identifier: Apache-2.0
"""py_ha: a master's byte stream through the slave's frame decoder delivered in arbitrary
chunks, as HAClient._serve delivers it: into the staging buffer (HAClient._dispatch_frames,
wire.decode_header) or, while a frame's body is open, written into the file at the body's
position (HAClient._write_body, pwrite in the client, a copy here) and counted
(HAClient._body_received); and the same bytes through the master's report reader
(wire.last_report). Invariants: a frame is published only at the slave's max offset and only
whole, with exactly the stream's body bytes; an oversized or negative header closes the
connection, and a frame off the slave's file grid also halts the client; nothing raises."""
import _harness  # sets sys.path; instruments rocketstore under atheris

with _harness.instrumented(__name__):
    from rocketstore.ha import wire
    from rocketstore.ha.slave import HAClient

FILE_SIZE = 1 << 16


class _File:
    def __init__(self, file_from_offset):
        self.file_from_offset = file_from_offset
        self.mm = self.write_target = bytearray(FILE_SIZE)
        self.wrote_position = 0
        self.fds = 0                     # descriptors open_writer_fd handed out and not closed

    def populate(self, start, end):
        raise AssertionError("the slave writes with pwrite and populates nothing")

    def open_writer_fd(self):
        self.fds += 1
        return -1

    def close_fd(self, fd):
        assert fd == -1 and self.fds > 0
        self.fds -= 1


class _CommitLog:
    file_size = FILE_SIZE

    def __init__(self):
        self.max_offset = 0
        self.mf = None
        self.open = None                 # (file, position, size) of the frame being received
        self.published = []              # (offset, body) of every whole frame
        self.files = []

    def replica_target(self, offset, size):
        assert self.open is None
        assert offset == self.max_offset or self.max_offset == 0, (offset, self.max_offset)
        assert offset // FILE_SIZE == (offset + size - 1) // FILE_SIZE, "spans two files"
        if self.mf is None or self.mf.wrote_position == FILE_SIZE:
            assert offset % FILE_SIZE == 0
            self.mf = _File(offset)
            self.files.append(self.mf)
        self.open = (self.mf, self.mf.wrote_position, size)
        return self.mf

    def publish_replica(self, mf, begin, pos):
        f, start, size = self.open
        assert mf is f and begin == start and pos == start + size, "published a partial frame"
        self.open = None
        mf.wrote_position = pos
        self.max_offset = mf.file_from_offset + pos
        self.published.append((mf.file_from_offset + start, bytes(mf.write_target[start:pos])))
        return True


class _Client(HAClient):
    def __init__(self):
        # No socket and no thread: only the state the frame decoder works on. A small staging
        # buffer keeps the "move a partial header to the front" path reachable.
        super().__init__(None, _CommitLog())
        self._stage = bytearray(256)
        self.closed = None

    def _close(self, why=None):
        self._drop_frame()
        self._close_file()
        self.closed = why or "closed"

    def _write_body(self, data, pos):
        # What os.pwrite does to the file, with the client's bounds.
        mf = self._file_mf
        assert self._file_fd == -1 and mf is self._frame_mf
        assert self._frame_rel <= pos and pos + len(data) <= self._frame_rel + self._frame_size
        mf.write_target[pos:pos + len(data)] = data
        return True

    def halt(self, reason):
        self.error = reason


def frames(stream):
    """(offset, body) of the whole, non-empty frames at the start of `stream`."""
    out, i = [], 0
    while len(stream) - i >= wire.HEADER_SIZE:
        offset, size = wire.HEADER.unpack_from(stream, i)
        if size < 0 or len(stream) - i - wire.HEADER_SIZE < size:
            break
        if size:
            out.append((offset, stream[i + wire.HEADER_SIZE:i + wire.HEADER_SIZE + size]))
        i += wire.HEADER_SIZE + size
    return out


def TestOneInput(data):
    if not data:
        return
    step = data[0] % 64 + 1
    stream = data[1:]
    c = _Client()
    stage = memoryview(c._stage)
    i = 0
    while i < len(stream) and c.closed is None:
        if c._frame_got < c._frame_size:
            # An open body, as _serve takes it: received, written at its position, counted.
            n = min(step, c._frame_size - c._frame_got, len(stream) - i)
            ok = (c._write_body(stream[i:i + n], c._frame_rel + c._frame_got)
                  and c._body_received(n))
        else:
            room = len(c._stage) - c._pos
            assert room >= len(c._stage) - wire.HEADER_SIZE    # at most a partial header left
            n = min(step, room, len(stream) - i)
            c._stage[c._pos:c._pos + n] = stream[i:i + n]
            c._pos += n
            ok = c._dispatch_frames(stage)
        i += n
        assert ok == (c.closed is None)
        assert c.error is None or c.closed is not None
        assert not ok or (c._dispatch == 0 and 0 <= c._pos < wire.HEADER_SIZE)
    c._drop_frame()
    c._close_file()
    assert all(f.fds == 0 for f in c.commitlog.files)     # every descriptor closed
    stage.release()
    published = c.commitlog.published
    assert published == frames(stream)[:len(published)]
    pos = len(stream) - len(stream) % 8
    off, new = wire.last_report(stream, 0, len(stream))
    assert new == (pos if pos >= 8 else 0)
    assert off is None or off == wire.decode_report(stream, pos - 8)


if __name__ == "__main__":
    _harness.run(TestOneInput)
