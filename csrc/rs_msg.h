/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_msg.h - size, encode and validate one CommitLog record (doc/01 §3; layout in rs_format.h).
 */
#ifndef RS_MSG_H
#define RS_MSG_H

#include "rs_common.h"
#include "rs_format.h"

/* rs_msg_row's `tags`: what the caller knows of the record's TAGS value. */
#define RS_ROW_TAGS_FIND -1     /* nothing: find it in the properties */
#define RS_ROW_TAGS_NONE 0      /* the properties hold no TAGS with a value */
#define RS_ROW_TAGS_GIVEN 1     /* they do, and its hash is tags_code */

/*
 * rs_msg_size - TOTALSIZE of a record with these field lengths.
 *
 * Returns the size (> 0), RS_E_ARG for a negative length, or RS_E_TOO_LONG when the topic
 * exceeds its length field (127 for v1, 32767 for v2), the properties exceed 32767 bytes
 * (Short.MAX_VALUE) or the record would not fit TOTALSIZE's int.
 * GIL: trivial, keep it.
 * Java: MessageExtEncoder#calMsgLength (4.9.x: CommitLog#calMsgLength).
 */
int rs_msg_size(int32_t sys_flag, int64_t body_len, int64_t topic_len, int64_t props_len, int v2);

/*
 * rs_record_size - rs_msg_size itself, inline for the per-record loops (the put paths, the
 * batch encoder): a call per record cost more than the sum.
 */
static inline int rs_record_size(int32_t sys_flag, int64_t body_len, int64_t topic_len, int64_t props_len, int v2)
{
    int64_t size;

    if (body_len < 0 || topic_len < 0 || props_len < 0)
        return RS_E_ARG;
    if (topic_len > (v2 ? RS_MAX_TOPIC_LENGTH_V2 : RS_MAX_TOPIC_LENGTH) ||
        props_len > RS_MAX_PROPERTIES_LENGTH || body_len > INT32_MAX)
        return RS_E_TOO_LONG;
    size = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8                    /* TOTALSIZE .. BORNTIMESTAMP */
         + ((sys_flag & RS_BORNHOST_V6_FLAG) ? RS_HOST_V6_LENGTH : RS_HOST_V4_LENGTH)
         + 8                                                   /* BORNHOST, STORETIMESTAMP */
         + ((sys_flag & RS_STOREHOSTADDRESS_V6_FLAG) ? RS_HOST_V6_LENGTH : RS_HOST_V4_LENGTH)
         + 4 + 8                                               /* RECONSUMETIMES, PREPARED */
         + 4 + body_len + (v2 ? 2 : 1) + topic_len + 2 + props_len;
    if (size > INT32_MAX)
        return RS_E_TOO_LONG;   /* TOTALSIZE is a Java int */
    return (int)size;
}

/*
 * rs_msg_encode - encode one record at out[pos, pos + size), computing BODYCRC.
 *
 * born_host / store_host are packed socket addresses: 4-byte IPv4 + 4-byte port (8 bytes) or
 * 16-byte IPv6 + port (20 bytes); their lengths must agree with sys_flag's BORNHOST_V6_FLAG /
 * STOREHOSTADDRESS_V6_FLAG.  The checks run in the reference backend's order: host lengths
 * (RS_E_ARG), then rs_msg_size's, then bounds (RS_E_BOUNDS).  Nothing is written on error.
 * Returns the record size.
 * GIL: the body CRC grows with the body; wrappers release the GIL for large bodies.
 * Java: MessageExtEncoder#encode (4.9.x: CommitLog.MessageExtEncoder#encode).
 */
int rs_msg_encode(uint8_t *out, size_t out_len, int64_t pos,
                  const uint8_t *topic, size_t topic_len,
                  const uint8_t *body, size_t body_len,
                  const uint8_t *props, size_t props_len,
                  int32_t queue_id, int32_t flag, int64_t queue_offset, int64_t phy_offset,
                  int32_t sys_flag, int64_t born_timestamp,
                  const uint8_t *born_host, size_t born_host_len,
                  int64_t store_timestamp,
                  const uint8_t *store_host, size_t store_host_len,
                  int32_t reconsume_times, int64_t prepared_tx_offset, int v2);

/* One piece of a properties string that rs_msg_encode_parts writes in order. */
typedef struct rs_part {
    const uint8_t *buf;
    size_t len;
} rs_part;

/*
 * rs_msg_encode_parts - rs_msg_encode with the properties given as n_parts pieces written one
 * after another (their total is PROPERTIESLENGTH), so a batch whose records share most of their
 * properties string builds none of them in a scratch buffer.  Same checks and returns.
 * GIL: callable without it.
 */
int rs_msg_encode_parts(uint8_t *out, size_t out_len, int64_t pos,
                        const uint8_t *topic, size_t topic_len,
                        const uint8_t *body, size_t body_len,
                        const rs_part *props, size_t n_parts,
                        int32_t queue_id, int32_t flag, int64_t queue_offset, int64_t phy_offset,
                        int32_t sys_flag, int64_t born_timestamp,
                        const uint8_t *born_host, size_t born_host_len,
                        int64_t store_timestamp,
                        const uint8_t *store_host, size_t store_host_len,
                        int32_t reconsume_times, int64_t prepared_tx_offset, int v2);

/*
 * rs_msg_encode_row - rs_msg_encode_parts of a v1 record (MESSAGE_MAGIC_CODE), then its row as
 * rs_msg_row(out, out_len, pos, topic_hash, tags, tags_code, row) would make it, set from the
 * values just encoded instead of read back: a put that hands its rows to the dispatch (doc/03
 * §8) pays for the row a few stores.  Same returns as rs_msg_encode_parts; RS_E_ARG, with
 * nothing written, when row is NULL or `tags` is none of the three RS_ROW_TAGS_*.
 * GIL: callable without it.
 */
int rs_msg_encode_row(uint8_t *out, size_t out_len, int64_t pos,
                      const uint8_t *topic, size_t topic_len,
                      const uint8_t *body, size_t body_len,
                      const rs_part *props, size_t n_parts,
                      int32_t queue_id, int32_t flag, int64_t queue_offset, int64_t phy_offset,
                      int32_t sys_flag, int64_t born_timestamp,
                      const uint8_t *born_host, size_t born_host_len,
                      int64_t store_timestamp,
                      const uint8_t *store_host, size_t store_host_len,
                      int32_t reconsume_times, int64_t prepared_tx_offset,
                      int32_t topic_hash, int tags, int64_t tags_code, rs_scan_rec *row);

/*
 * rs_msg_check - validate the record at buf[pos, len) and extract its dispatch fields.
 *
 * len is the end of readable data: a record running past it is RS_SCAN_PARTIAL.
 * Returns RS_OK with *row filled and *size = TOTALSIZE for a good record; otherwise the
 * positive RS_SCAN_* reason (BLANK, EMPTY, CORRUPT, MISMATCH, PARTIAL, TOPIC) with *size = the
 * blank's or record's TOTALSIZE where one was read (0 otherwise) and *row untouched;
 * RS_E_BOUNDS if pos is outside [0, len].
 * The order of checks is CommitLog#checkMessageAndReturnSize's, as pure._check_one spells it,
 * plus the topic rule (RS_SCAN_TOPIC, after the CRC): well-formed UTF-8 naming one directory
 * under consumequeue/, so bytes a put would refuse ("../x", "/x", "", invalid UTF-8) never
 * reach a dispatcher.
 * TAGS is found like MessageDecoder#string2messageProperties (last valid TAGS wins) and hashed
 * with rs_java_hash, sign-extended to 64 bits because the ConsumeQueue stores a long.
 * GIL: callable without it.
 */
int rs_msg_check(const uint8_t *buf, size_t len, int64_t pos, int check_crc,
                 rs_scan_rec *row, int32_t *size);

/*
 * rs_msg_check_read - rs_msg_check without the CRC check, for a reader that found the record
 * through its ConsumeQueue unit, which carries the tagsCode: the same answers and the same row,
 * except that row->tags_code is left 0 (RS_SCAN_INFO_HAS_TAGS is set as rs_msg_check sets it;
 * the caller takes the unit's code). `topic` (topic_len bytes; NULL for none) is a topic that
 * passed the topic rule before, with topic_hash its rs_msg_topic_hash: a record whose topic
 * bytes are equal passes the rule and gets that hash without either being computed again (a
 * queue's records share one topic). GIL: callable without it.
 */
int rs_msg_check_read(const uint8_t *buf, size_t len, int64_t pos, const uint8_t *topic,
                      size_t topic_len, int32_t topic_hash, rs_scan_rec *row, int32_t *size);

/*
 * rs_msg_row - the row rs_msg_check makes for the record at buf[pos, len), for a record the
 * caller has just encoded there itself (rs_msg_encode_parts, rs_batch_encode), with its
 * topic's topic_hash (rs_msg_topic_hash, computed once per topic): a put hands the rows of what
 * it wrote to the dispatcher, which then does not scan those records again (doc/03 §8).
 * `tags` says what the caller knows of the record's TAGS: RS_ROW_TAGS_FIND, nothing (it is
 * found in the properties as rs_msg_check finds it); RS_ROW_TAGS_NONE, the properties hold
 * no TAGS with a value; RS_ROW_TAGS_GIVEN, they do, and its rs_java_hash is tags_code.
 * Only the lengths are checked, so that every read stays inside buf[pos, len); not the magic,
 * CRC or topic rule, which the put's own encode met.  The row is filled by the code that fills
 * rs_msg_check's, so the two are equal for any record rs_msg_check accepts.
 * Returns TOTALSIZE with *row filled; RS_E_BOUNDS when the record does not fit buf, RS_E_ARG
 * when its lengths disagree or `tags` is none of the three (*row then untouched).
 * GIL: callable without it.
 */
int rs_msg_row(const uint8_t *buf, size_t len, int64_t pos, int32_t topic_hash, int tags,
               int64_t tags_code, rs_scan_rec *row);

/*
 * rs_msg_topic_hash - rs_scan_rec.topic_hash of the topic bytes topic[0, len).
 * GIL: callable without it.
 */
int32_t rs_msg_topic_hash(const uint8_t *topic, size_t len);

/*
 * rs_tags_match - whether the TAGS value of the properties string props[0, len) is one of the
 * n strings tags[ends[i-1], ends[i]) (ends[-1] = 0): the string check of a tag subscription,
 * after a ConsumeQueue unit's tagsCode matched one of its hashes (two tags may share a
 * String.hashCode, e.g. "Aa" and "BB"). TAGS is found as rs_msg_check finds it (the last valid
 * segment wins) and compared byte for byte with the UTF-8 tags; a record without TAGS matches
 * none, as the 4.9 client's PullAPIWrapper#processPullResult drops it.
 * Returns 1 or 0; RS_E_ARG when ends is not ascending or runs past tags_len.
 * GIL: callable without it.
 */
int rs_tags_match(const uint8_t *props, size_t len, const uint8_t *tags, size_t tags_len,
                  const int64_t *ends, size_t n);

#endif /* RS_MSG_H */
