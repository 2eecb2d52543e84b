# SPDX-License-Identifier: Apache-2.0
"""On-disk constants, mirrored from csrc/rs_format.h (which draws each layout as a byte table).

tests/test_contract.py checks that every value here equals the C header's.
"""
import numpy as np

# CommitLog record (doc/01 §3)
MESSAGE_MAGIC_CODE = -626843481          # 0xDAA320A7, v1 record
MESSAGE_MAGIC_CODE_V2 = -626843477       # 0xDAA320AB, v2 record (2-byte topic length)
BLANK_MAGIC_CODE = -875286124            # 0xCBD43194, end-of-file filler
END_FILE_MIN_BLANK_LENGTH = 8
MSG_FIXED_V1_IPV4 = 91                   # 84 + 4 (body len) + 1 (topic len) + 2 (props len)
MAX_TOPIC_LENGTH = 127
MAX_PROPERTIES_LENGTH = 32767

# Fixed positions inside a record (IPv4 born host)
POS_TOTALSIZE = 0
POS_MAGIC = 4
POS_BODYCRC = 8
POS_QUEUEID = 12
POS_FLAG = 16
POS_QUEUEOFFSET = 20
POS_PHYSICALOFFSET = 28
POS_SYSFLAG = 36
POS_BORNTIMESTAMP = 40
POS_BORNHOST = 48

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

# Properties (doc/01 §3.6)
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# ConsumeQueue (doc/02 §1.2)
CQ_STORE_UNIT_SIZE = 20
CQ_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert CQ_DTYPE.itemsize == CQ_STORE_UNIT_SIZE

# IndexFile (doc/02 §2; byte tables in rs_format.h)
INDEX_HEADER_SIZE = 40
INDEX_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20
INDEX_POS_BEGIN_TIMESTAMP = 0
INDEX_POS_END_TIMESTAMP = 8
INDEX_POS_BEGIN_PHY_OFFSET = 16
INDEX_POS_END_PHY_OFFSET = 24
INDEX_POS_HASH_SLOT_COUNT = 32
INDEX_POS_INDEX_COUNT = 36
INDEX_ENTRY_POS_KEY_HASH = 0
INDEX_ENTRY_POS_PHY_OFFSET = 4
INDEX_ENTRY_POS_TIME_DIFF = 12
INDEX_ENTRY_POS_PREV_INDEX = 16
INDEX_HEADER_DTYPE = np.dtype([
    ("begin_timestamp", ">i8"), ("end_timestamp", ">i8"), ("begin_phy_offset", ">i8"),
    ("end_phy_offset", ">i8"), ("hash_slot_count", ">i4"), ("index_count", ">i4")])
INDEX_ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"),
                              ("prev_index", ">i4")])
assert INDEX_HEADER_DTYPE.itemsize == INDEX_HEADER_SIZE
assert INDEX_ENTRY_DTYPE.itemsize == INDEX_ENTRY_SIZE

# Checkpoint (doc/03 §3)
CHECKPOINT_FILE_SIZE = 4096
OS_PAGE_SIZE = 4096

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
