/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_batch.c - a columnar batch of one topic and queue, encoded in place.
 */
#include "rs_batch.h"
#include "rs_msg.h"
#include "rs_crc32.h"

/* Offsets first .. n of a column must stay inside its data and never decrease: the Python
 * side hands over Arrow or numpy offsets as they are, so they are checked here, once. */
static int rs_column_ok(const int64_t *off, size_t data_len, int64_t first, int64_t n)
{
    int64_t i;

    if (off == NULL)
        return 1;
    if (off[first] < 0)
        return 0;
    for (i = first; i < n; i++)
        if (off[i + 1] < off[i])
            return 0;
    return (uint64_t)off[n] <= (uint64_t)data_len;
}

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
                    rs_scan_rec *rows, int32_t tags_col, int64_t *count, int64_t *nbytes)
{
    rs_part parts[5];
    int64_t i, wr = pos;
    int32_t topic_hash = 0;
    int k;

    *count = 0;
    *nbytes = 0;
    if (pos < 0 || limit < 0 || (uint64_t)limit > (uint64_t)out_len || pos > limit)
        return RS_E_BOUNDS;
    if (first < 0 || first > n || body_off == NULL || frag_off == NULL)
        return RS_E_ARG;
    for (k = 0; k < 3; k++)
        if (frag_off[k] < 0 || frag_off[k + 1] < frag_off[k])
            return RS_E_ARG;
    if ((uint64_t)frag_off[3] > (uint64_t)frags_len)
        return RS_E_BOUNDS;
    if (!rs_column_ok(body_off, bodies_len, first, n) || !rs_column_ok(a_off, a_len, first, n) ||
        !rs_column_ok(b_off, b_len, first, n))
        return RS_E_BOUNDS;
    if (rows != NULL && (tags_col < -1 || tags_col > 2 || (tags_col == 1 && a_off == NULL) ||
                         (tags_col == 2 && b_off == NULL)))
        return RS_E_ARG;
    if (flags_or != NULL)
        for (i = first; i < n; i++)
            if (flags_or[i] & (RS_BORNHOST_V6_FLAG | RS_STOREHOSTADDRESS_V6_FLAG))
                return RS_E_ARG;

    if (rows != NULL)
        topic_hash = rs_msg_topic_hash(topic, topic_len);   /* one topic: hashed once */
    for (k = 0; k < 3; k++) {
        parts[2 * k].len = (size_t)(frag_off[k + 1] - frag_off[k]);
        parts[2 * k].buf = parts[2 * k].len ? frags + frag_off[k] : NULL;
    }
    for (i = first; i < n; i++) {
        int64_t body_len = body_off[i + 1] - body_off[i];
        int32_t flags = flags_or ? sys_flag | flags_or[i] : sys_flag;
        int size;

        /* An empty item may come with a NULL data pointer: never offset one. */
        parts[1].len = a_off ? (size_t)(a_off[i + 1] - a_off[i]) : 0;
        parts[1].buf = parts[1].len ? a + a_off[i] : NULL;
        parts[3].len = b_off ? (size_t)(b_off[i + 1] - b_off[i]) : 0;
        parts[3].buf = parts[3].len ? b + b_off[i] : NULL;
        size = rs_record_size(flags, body_len, (int64_t)topic_len,
                              (int64_t)(parts[0].len + parts[1].len + parts[2].len + parts[3].len +
                                        parts[4].len), 0);
        if (size < 0)
            return size;
        /* Keep room for the 8-byte blank: what does not fit goes to the next file. */
        if (wr + size + RS_END_FILE_MIN_BLANK_LENGTH > limit)
            break;
        /* The row from the values in hand as the record is encoded (rs_msg_encode_row): read
         * back from its bytes (rs_msg_row) it cost a tenth of a sustained put_batch's thread
         * CPU (perf, bench_sustained.py). */
        if (rows != NULL) {
            int tags = RS_ROW_TAGS_FIND;
            int64_t tags_code = 0;

            if (tags_col == 1 || tags_col == 2) {
                /* The TAGS value is the column's item: hashed as the scan hashes it. */
                const rs_part *v = &parts[2 * tags_col - 1];
                int32_t h = 0;
                tags = v->len ? RS_ROW_TAGS_GIVEN : RS_ROW_TAGS_NONE;
                if (v->len)
                    rs_java_hash(v->buf, v->len, &h);
                tags_code = h;
            } else if (tags_col == 0 && i > first) {
                /* In the fragments: record `first`'s TAGS, found in its properties. */
                tags = (rows[0].info & RS_SCAN_INFO_HAS_TAGS) ? RS_ROW_TAGS_GIVEN : RS_ROW_TAGS_NONE;
                tags_code = rows[0].tags_code;
            }
            size = rs_msg_encode_row(out, out_len, wr, topic, topic_len,
                                     body_len ? bodies + body_off[i] : NULL, (size_t)body_len,
                                     parts, 5, queue_id, flag, queue_offset + (i - first),
                                     phy_base + (wr - pos), flags, born_timestamp, born_host,
                                     born_host_len, store_timestamp, store_host, store_host_len,
                                     0, 0, topic_hash, tags, tags_code, &rows[i - first]);
        } else {
            size = rs_msg_encode_parts(out, out_len, wr, topic, topic_len,
                                       body_len ? bodies + body_off[i] : NULL,
                                       (size_t)body_len, parts, 5, queue_id, flag,
                                       queue_offset + (i - first), phy_base + (wr - pos), flags,
                                       born_timestamp, born_host, born_host_len, store_timestamp,
                                       store_host, store_host_len, 0, 0, 0);
        }
        if (size < 0)
            return size;
        if (phys != NULL)
            phys[i - first] = phy_base + (wr - pos);
        if (sizes != NULL)
            sizes[i - first] = size;
        wr += size;
        *count = i + 1 - first;
        *nbytes = wr - pos;
    }
    return RS_OK;
}
