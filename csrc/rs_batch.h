/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_batch.h - encode a columnar batch of records of one topic and queue straight into a
 * CommitLog window (MessageStore.put_batch).
 */
#ifndef RS_BATCH_H
#define RS_BATCH_H

#include "rs_common.h"
#include "rs_format.h"

/*
 * rs_batch_encode - encode records first .. n-1 of a column batch at out[pos, limit), each
 * only if it leaves END_FILE_MIN_BLANK_LENGTH (8) bytes before limit, as
 * rs_commitlog_append_batch does, so the caller ends a full file with the blank marker.
 *
 * Columns are Arrow-style: item i of a column is data[off[i], off[i + 1]), with n + 1 offsets.
 * Record i has body bodies[i], and the properties string
 *     frags[frag_off[0], frag_off[1]) + a[i] + frags[frag_off[1], frag_off[2]) + b[i]
 *     + frags[frag_off[2], frag_off[3])
 * where a column given as NULL data and offsets is empty for every record.  The caller builds
 * the fragments in the broker's HashMap order (TAGS and KEYS are the per-record columns), so
 * the bytes equal rs_msg_encode's for the same message.  Record i gets QUEUEOFFSET
 * queue_offset + (i - first), PHYSICALOFFSET phy_base + (bytes written before it) and
 * STORETIMESTAMP store_timestamp, and SYSFLAG sys_flag | flags_or[i] when flags_or is not NULL
 * (per-record bits, such as COMPRESSED_FLAG for the bodies a producer compressed; n entries, none
 * holding a host bit, which would change the record's length); everything else is shared by the
 * batch.
 *
 * When phys (sizes) is not NULL, phys[i - first] (sizes[i - first]) gets record i's PHYSICALOFFSET
 * (its length) as it is written (room for n - first each), so the caller needs no arithmetic over
 * the batch to return them.
 *
 * When rows is not NULL, rows[i - first] gets record i's row as rs_commitlog_scan would make it
 * (rs_msg_row; room for n - first rows), so the put can hand its dispatch the rows of what it
 * wrote instead of a scan of them.  tags_col says where the caller laid out TAGS, so that its
 * hash is not searched for in every record: 1 or 2, the value is item i of column a or b (empty:
 * no TAGS); 0, it is no column's, so every record has the TAGS (or none) of record `first`; -1,
 * unknown: each record's properties are searched as the scan does.  A wrong claim gives wrong
 * rows; RS_E_ARG for another value or a column claimed but absent.
 * Returns RS_OK with *count records and *nbytes bytes written; RS_E_BOUNDS if pos < 0,
 * pos > limit, limit > out_len or an offset points outside its data (offsets must not
 * decrease); RS_E_ARG for first > n, a host length that disagrees with sys_flag, a host bit
 * in flags_or or fragment offsets out of order; rs_msg_size's RS_E_TOO_LONG for a record whose properties exceed 32767
 * bytes.  Columns and fragments are checked before anything is written; a record refused by
 * rs_msg_size stops the batch there, the records before it written and counted (the caller
 * checks sizes first, so on its path this never happens).
 * GIL: grows with the batch; wrappers release it.
 * Java: DefaultAppendMessageCallback#doAppend over a MessageExtBatch, with the encode of
 * MessageExtEncoder#encode fused in (no intermediate encoded buffer).
 */
int rs_batch_encode(uint8_t *out, size_t out_len, int64_t pos, int64_t limit,
                    const uint8_t *topic, size_t topic_len, int32_t queue_id,
                    const uint8_t *bodies, size_t bodies_len, const int64_t *body_off,
                    const uint8_t *a, size_t a_len, const int64_t *a_off,
                    const uint8_t *b, size_t b_len, const int64_t *b_off,
                    const uint8_t *frags, size_t frags_len, const int64_t *frag_off,
                    int64_t first, int64_t n,
                    int32_t flag, int32_t sys_flag, const int32_t *flags_or,
                    int64_t born_timestamp, const uint8_t *born_host, size_t born_host_len,
                    int64_t store_timestamp, const uint8_t *store_host, size_t store_host_len,
                    int64_t queue_offset, int64_t phy_base, int64_t *phys, int64_t *sizes,
                    rs_scan_rec *rows, int32_t tags_col, int64_t *count, int64_t *nbytes);

#endif /* RS_BATCH_H */
