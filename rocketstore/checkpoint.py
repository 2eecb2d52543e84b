# SPDX-License-Identifier: Apache-2.0
"""StoreCheckpoint: the 4 KiB `checkpoint` file (doc/03 §3), and the only code that writes
its bytes."""
from . import format as F
from .format import CHECKPOINT_FILE_SIZE

_V49 = F.CHECKPOINT_V49.struct    # physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp
_V5 = F.CHECKPOINT.struct         # + masterFlushedOffset, confirmPhyOffset (5.x)
_TIMES = ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp")


class StoreCheckpoint:
    """In-memory values change freely; the file is written only by `flush()`."""

    def __init__(self, path, fs, read_only=False, layout_v5=False):
        self.path = path
        self._fs = fs
        self.read_only = read_only
        self.layout_v5 = layout_v5
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.master_flushed_offset = 0
        self.confirm_phy_offset = 0
        self.mm = None
        # field -> the most the file may say: a sync of what the field vouches for failed
        # (services.flush.SyncLatch), while the in-memory value may go on moving.
        self._held = {}
        # The store's SyncLatch once it started: a failed sync of this file trips it (and
        # flush() returns) instead of raising.
        self.latch = None
        if fs.exists(path):
            raw = fs.read_bytes(path)[:_V5.size].ljust(_V5.size, b"\0")
            (self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
             self.master_flushed_offset, self.confirm_phy_offset) = _V5.unpack(raw)
        self._opened = {name: getattr(self, name) for name in _TIMES}
        if not read_only:
            # Like the broker, create the file as 4096 zero bytes when missing.
            fs.create_sized(path, CHECKPOINT_FILE_SIZE)
            # Its page is written through the mapping: on a full disk, ENOSPC now, not SIGBUS.
            fs.reserve(path, 0, CHECKPOINT_FILE_SIZE)
            self.mm = fs.map(path, CHECKPOINT_FILE_SIZE)

    def opened_with(self, field):
        """What the file said for `field` when it was opened."""
        return self._opened[field]

    def hold(self, field, ts=None):
        """From now on the file says at most `ts` (default: the value now) for `field`, one
        of the three *_msg_timestamp names."""
        if ts is None:
            ts = getattr(self, field)
        self._held[field] = min(ts, self._held.get(field, ts))

    def _stored(self, field):
        value = getattr(self, field)
        held = self._held.get(field)
        return value if held is None else min(value, held)

    def flush(self):
        if self.mm is None:
            return
        times = [self._stored(name) for name in _TIMES]
        if self.layout_v5:
            _V5.pack_into(self.mm, 0, *times, self.master_flushed_offset,
                          self.confirm_phy_offset)
        else:
            _V49.pack_into(self.mm, 0, *times)
        try:
            self._fs.sync_checkpoint(self.mm, self.path)
        except OSError as exc:
            if self.latch is None:
                raise
            self.latch.trip(self.latch.CHECKPOINT, exc)

    @property
    def min_timestamp(self):
        """getMinTimestamp: min(physic, logics) - 3 s, floored at 0."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    @property
    def min_timestamp_index(self):
        return min(self.min_timestamp, self.index_msg_timestamp)

    def close(self):
        if self.mm is not None:
            self.mm.close()
            self.mm = None


def reset_dispatch_timestamps(fs, path, index):
    """Zero physicMsgTimestamp and logicsMsgTimestamp (and indexMsgTimestamp when `index`) in
    the checkpoint file at `path`, when there is one, leaving every other byte as it is: a
    zero checkpoint sends abnormal recovery back to the first CommitLog file (doc/03 §5.5).
    Written whole through fs.write_bytes, for an offline repair with no store open."""
    if not fs.exists(path):
        return
    raw = bytearray(fs.read_bytes(path))
    fields = F.CHECKPOINT_V49 if index else F.CHECKPOINT_V49.prefix(2)
    raw.extend(bytes(max(0, fields.size - len(raw))))    # a short file grows to hold them
    fields.struct.pack_into(raw, 0, *(0,) * len(fields.fields))
    fs.write_bytes(path, bytes(raw))
