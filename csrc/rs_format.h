/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_format.h - every on-disk constant, each layout drawn once as a byte table.
 *
 * rocketstore/format.py mirrors these values and tests/test_contract.py checks that they agree
 * (it reads the RS_* defines below with a regex, so keep each one a plain integer literal).
 * Section references (§) are to doc/01-commitlog.md, and doc/02 to doc/02-consumequeue-index.md.
 */
#ifndef RS_FORMAT_H
#define RS_FORMAT_H

#include <stdint.h>

/*
 * CommitLog record, doc/01 §3.1 (MessageExtEncoder#encode, CommitLog#checkMessageAndReturnSize).
 * Big-endian throughout.  BH/SH = 8 for IPv4 hosts, 20 for IPv6 (sysflag 0x10 / 0x20, §3.2);
 * L = 1 for the v1 magic, 2 for the v2 magic (§3.3).  Offsets shown for IPv4 + v1.
 *
 *   off      size   field
 *   0        4      TOTALSIZE            int, whole record incl. this field
 *   4        4      MAGICCODE            0xDAA320A7 (v1) / 0xDAA320AB (v2)
 *   8        4      BODYCRC              crc32(body) & 0x7FFFFFFF
 *   12       4      QUEUEID
 *   16       4      FLAG
 *   20       8      QUEUEOFFSET          ConsumeQueue entry index, patched at append
 *   28       8      PHYSICALOFFSET       CommitLog offset of byte 0, patched at append
 *   36       4      SYSFLAG              bit set, doc/01 §3.5
 *   40       8      BORNTIMESTAMP
 *   48       BH     BORNHOST             4 (or 16) address bytes + int port
 *   48+BH    8      STORETIMESTAMP       patched at append
 *   56+BH    SH     STOREHOST
 *   56+BH+SH 4      RECONSUMETIMES
 *   60+BH+SH 8      PREPAREDTRANSACTIONOFFSET
 *   68+BH+SH 4+n    BODY                 int n, then n bytes
 *   ..       L+t    TOPIC                byte (v1) or short (v2) t, then t UTF-8 bytes
 *   ..       2+p    PROPERTIES           short p, then p bytes: name 0x01 value 0x02 ... (§3.6)
 *
 *   TOTALSIZE = 68 + BH + SH + 4 + n + L + t + 2 + p   (= 91 + n + t + p for IPv4 + v1)
 *
 * END_OF_FILE blank, doc/01 §3.9: the 8 bytes  int(bytes left in file)  int(BLANK magic).
 */
#define RS_MESSAGE_MAGIC_CODE (-626843481)      /* 0xDAA320A7 */
#define RS_MESSAGE_MAGIC_CODE_V2 (-626843477)   /* 0xDAA320AB */
#define RS_BLANK_MAGIC_CODE (-875286124)        /* 0xCBD43194 */
#define RS_END_FILE_MIN_BLANK_LENGTH 8
#define RS_MSG_FIXED_V1_IPV4 91
#define RS_MAX_TOPIC_LENGTH 127                 /* v1: the length is one byte, Java caps at 127 */
#define RS_MAX_TOPIC_LENGTH_V2 32767            /* v2: a short */
#define RS_MAX_PROPERTIES_LENGTH 32767          /* Short.MAX_VALUE */

#define RS_POS_TOTALSIZE 0
#define RS_POS_MAGIC 4
#define RS_POS_BODYCRC 8
#define RS_POS_QUEUEID 12
#define RS_POS_FLAG 16
#define RS_POS_QUEUEOFFSET 20
#define RS_POS_PHYSICALOFFSET 28
#define RS_POS_SYSFLAG 36
#define RS_POS_BORNTIMESTAMP 40
#define RS_POS_BORNHOST 48

/* SYSFLAG bits, doc/01 §3.5 (MessageSysFlag). */
#define RS_COMPRESSED_FLAG 0x1
#define RS_MULTI_TAGS_FLAG 0x2
#define RS_TRANSACTION_TYPE_MASK 0xC
#define RS_TRANSACTION_NOT_TYPE 0x0
#define RS_TRANSACTION_PREPARED_TYPE 0x4
#define RS_TRANSACTION_COMMIT_TYPE 0x8
#define RS_TRANSACTION_ROLLBACK_TYPE 0xC
#define RS_BORNHOST_V6_FLAG 0x10
#define RS_STOREHOSTADDRESS_V6_FLAG 0x20
/* 5.x: the codec of a COMPRESSED body, (SYSFLAG & 0x700) >> 8: 0 and 3 zlib, 1 LZ4, 2 zstd. */
#define RS_COMPRESSION_TYPE_MASK 0x700
#define RS_COMPRESSION_LZ4_TYPE 0x100
#define RS_COMPRESSION_ZSTD_TYPE 0x200
#define RS_COMPRESSION_ZLIB_TYPE 0x300

/* Host field sizes: address + 4-byte port. */
#define RS_HOST_V4_LENGTH 8
#define RS_HOST_V6_LENGTH 20

/* Properties, doc/01 §3.6 (MessageDecoder). */
#define RS_NAME_VALUE_SEPARATOR 0x01
#define RS_PROPERTY_SEPARATOR 0x02
#define RS_SCHEDULE_TOPIC "SCHEDULE_TOPIC_XXXX"

/*
 * ConsumeQueue unit, doc/02 §1.2 (ConsumeQueue#putMessagePositionInfo), CQ_STORE_UNIT_SIZE = 20:
 *
 *   off  size  field
 *   0    8     commitLogOffset   PHYSICALOFFSET of the record
 *   8    4     size              the record's TOTALSIZE
 *   12   8     tagsCode          String.hashCode(TAGS) sign-extended (doc/01 §3.7)
 */
#define RS_CQ_STORE_UNIT_SIZE 20
#define RS_CQ_POS_OFFSET 0
#define RS_CQ_POS_SIZE 8
#define RS_CQ_POS_TAGS_CODE 12

/*
 * IndexFile, doc/02 §2.1 (IndexHeader, IndexFile#putKey).  File = header, then slot_num
 * 4-byte hash slots (int: newest entry number of the slot's chain, 0 = empty), then
 * index_num 20-byte entries; total 40 + slot_num * 4 + index_num * 20 bytes.  Entry number 0
 * is never written, so a full file (indexCount == index_num) holds index_num - 1 entries.
 *
 * Header (40 bytes):
 *   off  size  field
 *   0    8     beginTimestamp   store time of the first entry (pre-seeded on roll)
 *   8    8     endTimestamp     store time of the last entry
 *   16   8     beginPhyOffset   CommitLog offset of the first entry (pre-seeded on roll)
 *   24   8     endPhyOffset     CommitLog offset of the last entry
 *   32   4     hashSlotCount    slots that went from empty to used
 *   36   4     indexCount       next entry number; 0 on a fresh file reads as 1
 *
 * Entry (20 bytes) at 40 + slot_num * 4 + n * 20:
 *   off  size  field
 *   0    4     keyHash          abs(String.hashCode("topic#key")), MIN_VALUE -> 0
 *   4    8     phyOffset        CommitLog offset of the record
 *   12   4     timeDiff         (storeTimestamp - beginTimestamp) / 1000, seconds
 *   16   4     prevIndex        previous entry of the same slot in this file, 0 = end
 */
#define RS_INDEX_HEADER_SIZE 40
#define RS_INDEX_SLOT_SIZE 4
#define RS_INDEX_ENTRY_SIZE 20
#define RS_INDEX_POS_BEGIN_TIMESTAMP 0
#define RS_INDEX_POS_END_TIMESTAMP 8
#define RS_INDEX_POS_BEGIN_PHY_OFFSET 16
#define RS_INDEX_POS_END_PHY_OFFSET 24
#define RS_INDEX_POS_HASH_SLOT_COUNT 32
#define RS_INDEX_POS_INDEX_COUNT 36
#define RS_INDEX_ENTRY_POS_KEY_HASH 0
#define RS_INDEX_ENTRY_POS_PHY_OFFSET 4
#define RS_INDEX_ENTRY_POS_TIME_DIFF 12
#define RS_INDEX_ENTRY_POS_PREV_INDEX 16

/*
 * Checkpoint, doc/03 §3: a 4096-byte file, zeros past the fields.  4.9.x writes the first
 * three, 5.x all five.
 *
 *   off  size  field
 *   0    8     physicMsgTimestamp
 *   8    8     logicsMsgTimestamp
 *   16   8     indexMsgTimestamp
 *   24   8     masterFlushedOffset   5.x
 *   32   8     confirmPhyOffset      5.x
 */
#define RS_CHECKPOINT_FILE_SIZE 4096
#define RS_OS_PAGE_SIZE 4096
#define RS_CHECKPOINT_POS_PHYSIC_MSG_TIMESTAMP 0
#define RS_CHECKPOINT_POS_LOGICS_MSG_TIMESTAMP 8
#define RS_CHECKPOINT_POS_INDEX_MSG_TIMESTAMP 16
#define RS_CHECKPOINT_POS_MASTER_FLUSHED_OFFSET 24
#define RS_CHECKPOINT_POS_CONFIRM_PHY_OFFSET 32

/* Why rs_commitlog_scan stopped (format.SCAN_*): values, not errors (doc/03 §5.3). */
#define RS_SCAN_END 0        /* reached end, or filled the output rows */
#define RS_SCAN_BLANK 1      /* BLANK magic at stop_pos; stop_size = its TOTALSIZE */
#define RS_SCAN_EMPTY 2      /* magic 0: never-written space */
#define RS_SCAN_CORRUPT 3    /* bad magic, CRC or impossible length */
#define RS_SCAN_MISMATCH 4   /* parsed lengths != TOTALSIZE (stop_size): Java's "[BUG]" record */
#define RS_SCAN_PARTIAL 5    /* record runs past end, or fewer than 8 bytes remain */
#define RS_SCAN_TOPIC 6      /* topic not UTF-8, empty, "." or "..", or with a / or NUL */

/* rs_scan_rec.info bits (format.SCAN_INFO_*). */
#define RS_SCAN_INFO_V2 0x1
#define RS_SCAN_INFO_HAS_TAGS 0x2
#define RS_SCAN_INFO_SCHEDULE 0x4

/*
 * One valid record found by rs_commitlog_scan: the dispatch fields of
 * CommitLog#checkMessageAndReturnSize (DispatchRequest).  Native byte order; identical to
 * format.SCAN_DTYPE, 112 bytes, no padding.  pos is relative to the scanned buffer, the *_off
 * fields relative to the record start.
 */
typedef struct rs_scan_rec {
    int64_t pos;
    int64_t phy_offset;
    int64_t queue_offset;
    int64_t tags_code;
    int64_t store_timestamp;
    int64_t born_timestamp;
    int64_t prepared_tx_offset;
    int32_t size;
    int32_t queue_id;
    int32_t sys_flag;
    int32_t flag;
    int32_t body_crc;
    int32_t reconsume_times;
    int32_t body_off;
    int32_t body_len;
    int32_t topic_off;
    int32_t topic_len;
    int32_t props_off;
    int32_t props_len;
    int32_t info;
    int32_t topic_hash;  /* FNV-1a (32-bit) of the topic bytes, for grouping rows by queue */
} rs_scan_rec;

/* C99 static assert: a negative array size fails the build if the layout drifts from SCAN_DTYPE. */
typedef char rs_scan_rec_is_112_bytes[(sizeof(rs_scan_rec) == 112) ? 1 : -1];

#endif /* RS_FORMAT_H */
