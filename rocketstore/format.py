# SPDX-License-Identifier: Apache-2.0
"""On-disk constants and layouts, mirrored from csrc/rs_format.h (which draws each layout as a
byte table). This is the one Python definition of every byte layout: readers and writers take
the Struct, dtype and offsets from here, never spell their own.

tests/test_contract.py checks that every value here equals the C header's, and that each
layout's field offsets and size are the header's.
"""
import struct

import numpy as np


class Layout:
    """A fixed big-endian byte layout, defined once by its fields in order.

    `struct` packs and unpacks one instance, `dtype` views an array of them with numpy, and
    `offsets` maps each field to its byte offset; all three come from the same field list."""

    __slots__ = ("fields", "struct", "dtype", "offsets", "size")

    _NUMPY = {"b": ">i1", "h": ">i2", "i": ">i4", "q": ">i8"}

    def __init__(self, *fields):
        self.fields = fields
        self.struct = struct.Struct(">" + "".join(code for _, code in fields))
        self.dtype = np.dtype([(name, self._NUMPY.get(code) or "V" + code[:-1])
                               for name, code in fields])
        self.offsets, pos = {}, 0
        for name, code in fields:
            self.offsets[name] = pos
            pos += struct.calcsize(">" + code)
        self.size = self.struct.size
        assert self.size == pos == self.dtype.itemsize

    def prefix(self, n):
        """The layout of the first `n` fields."""
        return Layout(*self.fields[:n])

    def __repr__(self):
        return f"Layout{self.fields!r}"


# Big-endian scalars, for reading one field at a layout's offset.
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")

# CommitLog record (doc/01 §3)
MESSAGE_MAGIC_CODE = -626843481          # 0xDAA320A7, v1 record
MESSAGE_MAGIC_CODE_V2 = -626843477       # 0xDAA320AB, v2 record (2-byte topic length)
BLANK_MAGIC_CODE = -875286124            # 0xCBD43194, end-of-file filler
END_FILE_MIN_BLANK_LENGTH = 8
MSG_FIXED_V1_IPV4 = 91                   # 84 + 4 (body len) + 1 (topic len) + 2 (props len)
MAX_TOPIC_LENGTH = 127
MAX_PROPERTIES_LENGTH = 32767

# Fixed positions inside a record: the head, the same for every form (doc/01 §3.1).
RECORD_HEAD = Layout(("totalsize", "i"), ("magic", "i"), ("bodycrc", "i"), ("queueid", "i"),
                     ("flag", "i"), ("queueoffset", "q"), ("physicaloffset", "q"),
                     ("sysflag", "i"), ("borntimestamp", "q"))
POS_TOTALSIZE = RECORD_HEAD.offsets["totalsize"]
POS_MAGIC = RECORD_HEAD.offsets["magic"]
POS_BODYCRC = RECORD_HEAD.offsets["bodycrc"]
POS_QUEUEID = RECORD_HEAD.offsets["queueid"]
POS_FLAG = RECORD_HEAD.offsets["flag"]
POS_QUEUEOFFSET = RECORD_HEAD.offsets["queueoffset"]
POS_PHYSICALOFFSET = RECORD_HEAD.offsets["physicaloffset"]
POS_SYSFLAG = RECORD_HEAD.offsets["sysflag"]
POS_BORNTIMESTAMP = RECORD_HEAD.offsets["borntimestamp"]
POS_BORNHOST = RECORD_HEAD.size

# Host fields: address + 4-byte port, IPv4 unless SYSFLAG says IPv6 (doc/01 §3.2).
HOST_V4_LENGTH = 8
HOST_V6_LENGTH = 20

# From BORNHOST to BODYLENGTH when both hosts are IPv4 (the common form): one unpack.
RECORD_FIXED_V4 = Layout(*RECORD_HEAD.fields, ("bornhost", f"{HOST_V4_LENGTH}s"),
                         ("storetimestamp", "q"), ("storehost", f"{HOST_V4_LENGTH}s"),
                         ("reconsumetimes", "i"), ("preparedtransactionoffset", "q"),
                         ("bodylength", "i"))
assert RECORD_FIXED_V4.size + 1 + 2 == MSG_FIXED_V1_IPV4     # + topic length, properties length
# After STOREHOST, in every form: RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLENGTH.
RECORD_TAIL = Layout(("reconsumetimes", "i"), ("preparedtransactionoffset", "q"),
                     ("bodylength", "i"))

# END_OF_FILE blank (doc/01 §3.9): TOTALSIZE (bytes left in the file), then the BLANK magic.
BLANK = Layout(("totalsize", "i"), ("magic", "i"))

# SYSFLAG bits (doc/01 §3.5)
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_TYPE_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20
# 5.x: the codec of a COMPRESSED body, (SYSFLAG & 0x700) >> 8 (0 and 3 zlib, 1 LZ4, 2 zstd)
COMPRESSION_TYPE_MASK = 0x700
COMPRESSION_LZ4_TYPE = 0x100
COMPRESSION_ZSTD_TYPE = 0x200
COMPRESSION_ZLIB_TYPE = 0x300


def born_host_length(sys_flag):
    return HOST_V6_LENGTH if sys_flag & BORNHOST_V6_FLAG else HOST_V4_LENGTH


def store_host_length(sys_flag):
    return HOST_V6_LENGTH if sys_flag & STOREHOSTADDRESS_V6_FLAG else HOST_V4_LENGTH


def pos_store_timestamp(sys_flag):
    """Where STORETIMESTAMP sits in a record of this SYSFLAG (after an 8- or 20-byte BORNHOST)."""
    return POS_BORNHOST + born_host_length(sys_flag)


def pos_record_tail(sys_flag):
    """Where RECORD_TAIL (RECONSUMETIMES .. BODYLENGTH) sits in a record of this SYSFLAG."""
    return pos_store_timestamp(sys_flag) + I64.size + store_host_length(sys_flag)


def store_timestamp_at(buf, pos=0):
    """STORETIMESTAMP of the record at buf[pos], placed by its SYSFLAG; the record is not
    validated, as the broker's pickupStoreTimestamp and isMappedFileMatchedRecover read it."""
    sys_flag = I32.unpack_from(buf, pos + POS_SYSFLAG)[0]
    return I64.unpack_from(buf, pos + pos_store_timestamp(sys_flag))[0]


# Properties (doc/01 §3.6)
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# ConsumeQueue (doc/02 §1.2)
CQ_STORE_UNIT_SIZE = 20
CQ_UNIT = Layout(("offset", "q"), ("size", "i"), ("tags_code", "q"))
CQ_DTYPE = CQ_UNIT.dtype
CQ_POS_OFFSET = CQ_UNIT.offsets["offset"]
CQ_POS_SIZE = CQ_UNIT.offsets["size"]
CQ_POS_TAGS_CODE = CQ_UNIT.offsets["tags_code"]
assert CQ_UNIT.size == CQ_STORE_UNIT_SIZE

# IndexFile (doc/02 §2; byte tables in rs_format.h)
INDEX_HEADER_SIZE = 40
INDEX_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20
INDEX_HEADER = Layout(("begin_timestamp", "q"), ("end_timestamp", "q"), ("begin_phy_offset", "q"),
                      ("end_phy_offset", "q"), ("hash_slot_count", "i"), ("index_count", "i"))
INDEX_HEADER_DTYPE = INDEX_HEADER.dtype
INDEX_POS_BEGIN_TIMESTAMP = INDEX_HEADER.offsets["begin_timestamp"]
INDEX_POS_END_TIMESTAMP = INDEX_HEADER.offsets["end_timestamp"]
INDEX_POS_BEGIN_PHY_OFFSET = INDEX_HEADER.offsets["begin_phy_offset"]
INDEX_POS_END_PHY_OFFSET = INDEX_HEADER.offsets["end_phy_offset"]
INDEX_POS_HASH_SLOT_COUNT = INDEX_HEADER.offsets["hash_slot_count"]
INDEX_POS_INDEX_COUNT = INDEX_HEADER.offsets["index_count"]
INDEX_SLOT_DTYPE = np.dtype(">i4")
INDEX_ENTRY = Layout(("key_hash", "i"), ("phy_offset", "q"), ("time_diff", "i"),
                     ("prev_index", "i"))
INDEX_ENTRY_DTYPE = INDEX_ENTRY.dtype
INDEX_ENTRY_POS_KEY_HASH = INDEX_ENTRY.offsets["key_hash"]
INDEX_ENTRY_POS_PHY_OFFSET = INDEX_ENTRY.offsets["phy_offset"]
INDEX_ENTRY_POS_TIME_DIFF = INDEX_ENTRY.offsets["time_diff"]
INDEX_ENTRY_POS_PREV_INDEX = INDEX_ENTRY.offsets["prev_index"]
assert INDEX_HEADER.size == INDEX_HEADER_SIZE
assert INDEX_SLOT_DTYPE.itemsize == INDEX_SLOT_SIZE
assert INDEX_ENTRY.size == INDEX_ENTRY_SIZE

# Checkpoint (doc/03 §3): 4.9.x writes the first three fields, 5.x all five.
CHECKPOINT_FILE_SIZE = 4096
OS_PAGE_SIZE = 4096
CHECKPOINT = Layout(("physic_msg_timestamp", "q"), ("logics_msg_timestamp", "q"),
                    ("index_msg_timestamp", "q"), ("master_flushed_offset", "q"),
                    ("confirm_phy_offset", "q"))
CHECKPOINT_V49 = CHECKPOINT.prefix(3)
CHECKPOINT_POS_PHYSIC_MSG_TIMESTAMP = CHECKPOINT.offsets["physic_msg_timestamp"]
CHECKPOINT_POS_LOGICS_MSG_TIMESTAMP = CHECKPOINT.offsets["logics_msg_timestamp"]
CHECKPOINT_POS_INDEX_MSG_TIMESTAMP = CHECKPOINT.offsets["index_msg_timestamp"]
CHECKPOINT_POS_MASTER_FLUSHED_OFFSET = CHECKPOINT.offsets["master_flushed_offset"]
CHECKPOINT_POS_CONFIRM_PHY_OFFSET = CHECKPOINT.offsets["confirm_phy_offset"]

# One row of commitlog_scan output: the C struct rs_scan_rec, native byte order.
# Offsets *_off are relative to the record start; pos is relative to the scanned buffer;
# topic_hash is the 32-bit FNV-1a of the topic bytes (signed), for grouping rows by queue.
SCAN_DTYPE = np.dtype([
    ("pos", "=i8"), ("phy_offset", "=i8"), ("queue_offset", "=i8"), ("tags_code", "=i8"),
    ("store_timestamp", "=i8"), ("born_timestamp", "=i8"), ("prepared_tx_offset", "=i8"),
    ("size", "=i4"), ("queue_id", "=i4"), ("sys_flag", "=i4"), ("flag", "=i4"),
    ("body_crc", "=i4"), ("reconsume_times", "=i4"), ("body_off", "=i4"), ("body_len", "=i4"),
    ("topic_off", "=i4"), ("topic_len", "=i4"), ("props_off", "=i4"), ("props_len", "=i4"),
    ("info", "=i4"), ("topic_hash", "=i4"),
])
assert SCAN_DTYPE.itemsize == 112

# rs_scan_rec.info bits
SCAN_INFO_V2 = 0x1            # record uses the v2 magic
SCAN_INFO_HAS_TAGS = 0x2      # a non-empty TAGS property was found (tags_code is its hash)
SCAN_INFO_SCHEDULE = 0x4      # topic is SCHEDULE_TOPIC_XXXX: caller derives tags_code from DELAY

# Why commitlog_scan stopped (a value, not an error: doc/03 §5.3 outcomes)
SCAN_END = 0        # reached `end` or filled the output array
SCAN_BLANK = 1      # BLANK_MAGIC_CODE at stop_pos; stop_size = the blank's TOTALSIZE
SCAN_EMPTY = 2      # magic 0 at stop_pos: never-written space
SCAN_CORRUPT = 3    # bad magic, bad CRC, impossible length: the data ends at stop_pos
SCAN_MISMATCH = 4   # parsed lengths != TOTALSIZE (stop_size): "[BUG]" record, skippable
SCAN_PARTIAL = 5    # the record at stop_pos runs past `end` (or fewer than 8 bytes remain)
SCAN_TOPIC = 6      # topic bytes a put would refuse (message.topic_problem): corrupt

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
