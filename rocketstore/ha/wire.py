# SPDX-License-Identifier: Apache-2.0
"""Classic HA frames (doc/05 §2), big-endian, as pure functions over bytes.

Slave -> master: an 8-byte offset report (the slave's CommitLog max offset).
Master -> slave: a 12-byte header (physical offset of the first body byte, body size) and
then `size` raw CommitLog bytes; size 0 is a heartbeat.
"""
import struct

REPORT = struct.Struct(">q")
HEADER = struct.Struct(">qi")
REPORT_SIZE = REPORT.size          # 8
HEADER_SIZE = HEADER.size          # 12

# HAClient's read buffer in 4.9.x is 4 MiB: a frame whose body cannot fit it never completes
# there (the slave stalls). Our slave refuses such a frame, and our master sends none: this is
# the default and the cap of ha_transfer_batch_size.
SLAVE_READ_BUFFER_SIZE = 4 * 1024 * 1024
MAX_FRAME_BODY = SLAVE_READ_BUFFER_SIZE - HEADER_SIZE

__all__ = ["REPORT_SIZE", "HEADER_SIZE", "SLAVE_READ_BUFFER_SIZE", "MAX_FRAME_BODY",
           "encode_report", "decode_report", "last_report", "encode_header", "decode_header",
           "parse_address", "FrameError"]


class FrameError(ValueError):
    """A frame no honest peer sends (negative or oversized body, negative offset)."""


def encode_report(offset):
    """The 8 bytes a slave sends: its CommitLog max offset."""
    return REPORT.pack(offset)


def decode_report(buf, pos=0):
    """The offset of the report at buf[pos:pos + 8]."""
    return REPORT.unpack_from(buf, pos)[0]


def last_report(buf, start, end):
    """ReadSocketService's rule (doc/05 §3.2): of the unprocessed bytes buf[start:end], only
    the last complete 8-byte report counts. Reports are aligned on the connection's byte
    stream, so `start` and the returned position are multiples of 8 from the stream start.
    Returns (offset or None, new start)."""
    pos = end - (end - start) % REPORT_SIZE
    if pos - start < REPORT_SIZE:
        return None, start
    return REPORT.unpack_from(buf, pos - REPORT_SIZE)[0], pos


def encode_header(offset, size):
    """The 12-byte transfer header: body starts at CommitLog `offset`, `size` bytes long."""
    return HEADER.pack(offset, size)


def decode_header(buf, pos=0, max_body=MAX_FRAME_BODY):
    """(offset, size) of the header at buf[pos:pos + 12]; FrameError for a negative offset, a
    negative size or a body larger than `max_body`."""
    offset, size = HEADER.unpack_from(buf, pos)
    if offset < 0:
        raise FrameError(f"frame offset {offset} is negative")
    if size < 0 or size > max_body:
        raise FrameError(f"frame body of {size} bytes at offset {offset} is outside "
                         f"0..{max_body}")
    return offset, size


def parse_address(addr):
    """("host", port) from "host:port" (IPv6 as "[::1]:port" or "::1:port")."""
    if not isinstance(addr, str) or ":" not in addr:
        raise ValueError(f"HA master address {addr!r} is not host:port")
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    port = int(port)
    if not host or not 0 < port < 65536:
        raise ValueError(f"HA master address {addr!r} is not host:port")
    return host, port
