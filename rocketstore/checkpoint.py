# SPDX-License-Identifier: Apache-2.0
"""StoreCheckpoint: the 4 KiB `checkpoint` file (doc/03 §3)."""
import struct

from .format import CHECKPOINT_FILE_SIZE

_V49 = struct.Struct(">qqq")      # physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp
_V5 = struct.Struct(">qqqqq")     # + masterFlushedOffset, confirmPhyOffset (5.x)


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
        if fs.exists(path):
            raw = fs.read_bytes(path)[:40].ljust(40, b"\0")
            (self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
             self.master_flushed_offset, self.confirm_phy_offset) = _V5.unpack(raw)
        if not read_only:
            # Like the broker, create the file as 4096 zero bytes when missing.
            fs.create_sized(path, CHECKPOINT_FILE_SIZE)
            # Its page is written through the mapping: on a full disk, ENOSPC now, not SIGBUS.
            fs.reserve(path, 0, CHECKPOINT_FILE_SIZE)
            self.mm = fs.map(path, CHECKPOINT_FILE_SIZE)

    def flush(self):
        if self.mm is None:
            return
        if self.layout_v5:
            _V5.pack_into(self.mm, 0, self.physic_msg_timestamp, self.logics_msg_timestamp,
                          self.index_msg_timestamp, self.master_flushed_offset,
                          self.confirm_phy_offset)
        else:
            _V49.pack_into(self.mm, 0, self.physic_msg_timestamp, self.logics_msg_timestamp,
                           self.index_msg_timestamp)
        self._fs.sync_checkpoint(self.mm, self.path)

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
