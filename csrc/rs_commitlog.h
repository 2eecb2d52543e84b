/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_commitlog.h - append records or the END_OF_FILE blank into a CommitLog window; scan it.
 */
#ifndef RS_COMMITLOG_H
#define RS_COMMITLOG_H

#include "rs_common.h"
#include "rs_format.h"

/*
 * rs_commitlog_append - copy one encoded record to out[pos, pos + size) and patch QUEUEOFFSET
 * (@20), PHYSICALOFFSET (@28) and STORETIMESTAMP (@48 + born host length).
 *
 * rec[0, rec_len) must start with a record whose TOTALSIZE fits in it.  Returns the record size,
 * RS_E_BOUNDS if rec is shorter than 56 bytes or the record does not fit out, RS_E_ARG if
 * TOTALSIZE is too small to hold STORETIMESTAMP or longer than rec_len.
 * GIL: a memcpy of one record; wrappers release it only for large records.
 * Java: CommitLog.DefaultAppendMessageCallback#doAppend (the patch-and-copy half).
 */
int rs_commitlog_append(uint8_t *out, size_t out_len, int64_t pos,
                        const uint8_t *rec, size_t rec_len,
                        int64_t queue_offset, int64_t phy_offset, int64_t store_timestamp);

/*
 * rs_commitlog_append_batch - append whole records from the concatenation recs[0, recs_len)
 * at out[pos, limit), record k only if it leaves END_FILE_MIN_BLANK_LENGTH (8) bytes before
 * limit, so the blank marker always fits (doc/01 §3.9).  Record k gets QUEUEOFFSET
 * queue_offsets[k], PHYSICALOFFSET phy_base + (bytes appended before it) and STORETIMESTAMP
 * store_timestamp (one value per batch, as 4.9.8 writes it).
 *
 * Returns RS_OK with *count records and *nbytes bytes appended; RS_E_BOUNDS if
 * pos < 0, pos > limit or limit > out_len; RS_E_ARG for a truncated or impossible TOTALSIZE or
 * too few queue offsets.  Records before an RS_E_ARG stay written, as in the reference backend.
 * GIL: grows with the batch; wrappers release it.
 * Java: DefaultAppendMessageCallback#doAppend(..., MessageExtBatch, ...).
 */
int rs_commitlog_append_batch(uint8_t *out, size_t out_len, int64_t pos, int64_t limit,
                              const uint8_t *recs, size_t recs_len,
                              const int64_t *queue_offsets, size_t n_offsets,
                              int64_t phy_base, int64_t store_timestamp,
                              int64_t *count, int64_t *nbytes);

/*
 * rs_commitlog_blank - write the 8-byte END_OF_FILE marker at out[pos]: int size (bytes left in
 * the file), int BLANK_MAGIC_CODE.  Returns 8 or RS_E_BOUNDS.
 * GIL: trivial.
 * Java: DefaultAppendMessageCallback#doAppend, the `msgLen + END_FILE_MIN_BLANK_LENGTH > maxBlank` branch.
 */
int rs_commitlog_blank(uint8_t *out, size_t out_len, int64_t pos, int32_t size);

/*
 * rs_commitlog_scan - validate records in buf[start, end) one after another (rs_msg_check) and
 * fill one row per valid record into out[0, cap).
 *
 * Returns RS_OK, or RS_E_BOUNDS unless 0 <= start <= end <= len.  Outputs: *count rows filled;
 * *stop_pos where the scan stopped (relative to buf); *reason, an RS_SCAN_* value; *stop_size,
 * the blank's TOTALSIZE for RS_SCAN_BLANK and TOTALSIZE for RS_SCAN_MISMATCH, else 0.
 * Bad data is a reason, never an error.
 * GIL: grows with the buffer; wrappers release it.
 * Java: CommitLog#recoverNormally / recoverAbnormally calling checkMessageAndReturnSize in a loop.
 */
int rs_commitlog_scan(const uint8_t *buf, size_t len, int64_t start, int64_t end, int check_crc,
                      rs_scan_rec *out, int64_t cap,
                      int64_t *count, int64_t *stop_pos, int32_t *reason, int32_t *stop_size);

#endif /* RS_COMMITLOG_H */
