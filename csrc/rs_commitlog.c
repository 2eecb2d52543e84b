/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_commitlog.c - CommitLog append, blank and scan over caller-supplied windows.
 */
#include "rs_commitlog.h"
#include "rs_msg.h"

/* The shortest prefix that still holds SYSFLAG and an IPv4 STORETIMESTAMP. */
#define RS_APPEND_MIN (RS_POS_BORNHOST + 8)

int rs_commitlog_append(uint8_t *out, size_t out_len, int64_t pos,
                        const uint8_t *rec, size_t rec_len,
                        int64_t queue_offset, int64_t phy_offset, int64_t store_timestamp)
{
    int32_t size, sys_flag, ts_pos;

    if (rec_len < RS_APPEND_MIN)
        return RS_E_BOUNDS;
    size = rs_load_i32(rec);
    sys_flag = rs_load_i32(rec + RS_POS_SYSFLAG);
    /* STORETIMESTAMP follows BORNHOST, whose length the sysflag decides (pickupStoreTimestamp). */
    ts_pos = RS_POS_BORNHOST +
             ((sys_flag & RS_BORNHOST_V6_FLAG) ? RS_HOST_V6_LENGTH : RS_HOST_V4_LENGTH);
    if (size < ts_pos + 8 || (uint64_t)size > (uint64_t)rec_len)
        return RS_E_ARG;
    if (!rs_in_bounds(pos, (uint64_t)size, out_len))
        return RS_E_BOUNDS;
    out += pos;
    memmove(out, rec, (size_t)size);
    rs_store_be64(out + RS_POS_QUEUEOFFSET, (uint64_t)queue_offset);
    rs_store_be64(out + RS_POS_PHYSICALOFFSET, (uint64_t)phy_offset);
    rs_store_be64(out + ts_pos, (uint64_t)store_timestamp);
    return size;
}

int rs_commitlog_append_batch(uint8_t *out, size_t out_len, int64_t pos, int64_t limit,
                              const uint8_t *recs, size_t recs_len,
                              const int64_t *queue_offsets, size_t n_offsets,
                              int64_t phy_base, int64_t store_timestamp,
                              int64_t *count, int64_t *nbytes)
{
    size_t rd = 0;
    int64_t wr = pos, n = 0;

    *count = 0;
    *nbytes = 0;
    if (pos < 0 || limit < 0 || (uint64_t)limit > (uint64_t)out_len || pos > limit)
        return RS_E_BOUNDS;
    while (rd < recs_len) {
        int32_t size;
        int r;

        if (recs_len - rd < RS_APPEND_MIN)
            return RS_E_ARG;
        size = rs_load_i32(recs + rd);
        if (size < RS_APPEND_MIN || (uint64_t)size > (uint64_t)(recs_len - rd))
            return RS_E_ARG;
        /* Keep room for the 8-byte blank: a batch that does not fit goes to the next file. */
        if (wr + size + RS_END_FILE_MIN_BLANK_LENGTH > limit)
            break;
        if ((uint64_t)n >= (uint64_t)n_offsets)
            return RS_E_ARG;
        r = rs_commitlog_append(out, out_len, wr, recs + rd, (size_t)size, queue_offsets[n],
                                phy_base + (wr - pos), store_timestamp);
        if (r < 0)
            return r;
        wr += size;
        rd += (size_t)size;
        n++;
    }
    *count = n;
    *nbytes = wr - pos;
    return RS_OK;
}

int rs_commitlog_blank(uint8_t *out, size_t out_len, int64_t pos, int32_t size)
{
    if (!rs_in_bounds(pos, RS_END_FILE_MIN_BLANK_LENGTH, out_len))
        return RS_E_BOUNDS;
    rs_store_be32(out + pos, (uint32_t)size);
    rs_store_be32(out + pos + 4, (uint32_t)RS_BLANK_MAGIC_CODE);
    return RS_END_FILE_MIN_BLANK_LENGTH;
}

int rs_commitlog_scan(const uint8_t *buf, size_t len, int64_t start, int64_t end, int check_crc,
                      rs_scan_rec *out, int64_t cap,
                      int64_t *count, int64_t *stop_pos, int32_t *reason, int32_t *stop_size)
{
    int64_t n = 0, p = start;

    *count = 0;
    *stop_pos = start;
    *reason = RS_SCAN_END;
    *stop_size = 0;
    if (start < 0 || end < 0 || (uint64_t)end > (uint64_t)len || start > end)
        return RS_E_BOUNDS;
    for (;;) {
        int32_t size;
        int r;

        if (n >= cap || p >= end) {
            *reason = RS_SCAN_END;
            break;
        }
        /* len = end: a record crossing `end` is PARTIAL even if buf holds more bytes. */
        r = rs_msg_check(buf, (size_t)end, p, check_crc, &out[n], &size);
        if (r != RS_OK) {
            *reason = r;
            /* Only a blank's and a "[BUG]" record's size tell the caller where to go next. */
            *stop_size = (r == RS_SCAN_BLANK || r == RS_SCAN_MISMATCH) ? size : 0;
            break;
        }
        assert(size >= RS_MSG_FIXED_V1_IPV4 && p + size <= end);   /* progress, in bounds */
        n++;
        p += size;
    }
    assert(n <= cap && p <= end);
    *count = n;
    *stop_pos = p;
    return RS_OK;
}
