# SPDX-License-Identifier: Apache-2.0
"""py_ha: a master's byte stream through the slave's frame decoder (HAClient._dispatch_frames,
wire.decode_header) delivered in arbitrary chunks, and the same bytes through the master's
report reader (wire.last_report). Invariants: a frame is appended only at the slave's max
offset and only whole; an oversized or negative header closes the connection, and a frame off
the slave's file grid also halts the client; nothing raises."""
import _harness  # sets sys.path; instruments rocketstore under atheris

with _harness.instrumented(__name__):
    from rocketstore.ha import wire
    from rocketstore.ha.slave import HAClient


class _CommitLog:
    def __init__(self):
        self.max_offset = 0
        self.file_size = 1 << 20

    def append_data(self, offset, body):
        assert offset == self.max_offset or self.max_offset == 0, (offset, self.max_offset)
        self.max_offset = offset + len(body)
        return True


class _Store:
    def __init__(self):
        self.commitlog = _CommitLog()
        self.reput_service = None
        self.config = None


class _Client(HAClient):
    def __init__(self):
        # No socket and no thread: only the buffer state _dispatch_frames works on. A small
        # read buffer keeps the "move the tail to the front" path reachable.
        self.store = _Store()
        self._buf = bytearray(256)
        self._pos = self._dispatch = 0
        self.frames_received = 0
        self.closed = None
        self.error = None

    def _close(self, why=None):
        self.closed = why or "closed"

    def halt(self, reason):
        self.error = reason


def TestOneInput(data):
    if not data:
        return
    step = data[0] % 64 + 1
    stream = data[1:]
    c = _Client()
    view = memoryview(c._buf)
    i = 0
    while i < len(stream) and c.closed is None:
        room = len(c._buf) - c._pos
        if room == 0:
            break            # a frame larger than the buffer: the real slave refuses it first
        chunk = stream[i:i + min(step, room)]
        c._buf[c._pos:c._pos + len(chunk)] = chunk
        c._pos += len(chunk)
        i += len(chunk)
        ok = _dispatch(c, view)
        assert ok == (c.closed is None)
        assert c.error is None or c.closed is not None
        assert 0 <= c._dispatch <= c._pos <= len(c._buf)
    view.release()
    pos = len(stream) - len(stream) % 8
    off, new = wire.last_report(stream, 0, len(stream))
    assert new == (pos if pos >= 8 else 0)
    assert off is None or off == wire.decode_report(stream, pos - 8)


def _dispatch(c, view):
    # The real method bounds bodies by wire.MAX_FRAME_BODY (4 MiB); with a 256-byte buffer a
    # body that can never fit would wait forever, exactly what the bound prevents upstream.
    saved = wire.MAX_FRAME_BODY
    try:
        wire.decode_header.__defaults__ = (0, len(c._buf) - wire.HEADER_SIZE)
        return c._dispatch_frames(view)
    finally:
        wire.decode_header.__defaults__ = (0, saved)


if __name__ == "__main__":
    _harness.run(TestOneInput)
