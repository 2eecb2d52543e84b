/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_sched.c - delivered records of delayed messages, encoded in bulk (rs_sched.h).
 */
#include <string.h>

#include "rs_sched.h"
#include "rs_msg.h"

typedef struct rs_prop {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *val;
    size_t val_len;
    uint32_t bucket;
} rs_prop;

static int rs_same(const uint8_t *a, size_t a_len, const char *b)
{
    size_t b_len = strlen(b);
    return a_len == b_len && memcmp(a, b, b_len) == 0;
}

/* REAL_QID as schedule.py's rule: [+-]?[0-9]+ whose value is in [0, 2^31). */
static int rs_queue_id(const uint8_t *s, size_t len, int32_t *qid)
{
    size_t i = 0;
    int neg = 0;
    int64_t v = 0;

    if (len && (s[0] == '+' || s[0] == '-')) {
        neg = s[0] == '-';
        i = 1;
    }
    if (i == len)
        return 0;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (s[i] - '0');
        if (v > INT32_MAX)
            return 0;
    }
    if (neg && v != 0)
        return 0;
    *qid = (int32_t)v;
    return 1;
}

/* The delivered record of the scheduled record p[0, size): RS_TIMEUP_* or the encoded size
 * (> 0) written at out[pos]. */
static int rs_timeup_one(const uint8_t *p, int64_t size,
                         const uint8_t *topics, const int64_t *topic_off, int64_t n_topics,
                         int64_t max_body, int64_t max_record,
                         uint8_t *out, size_t out_len, int64_t pos,
                         int64_t *key, int64_t *topic_at, const uint8_t *src)
{
    rs_prop props[RS_TIMEUP_MAX_PROPS], t;
    rs_part parts[4 * RS_TIMEUP_MAX_PROPS];
    static const uint8_t sep1 = RS_NAME_VALUE_SEPARATOR, sep2 = RS_PROPERTY_SEPARATOR;
    int n_props = 0, i, j, v2, rsize;
    size_t n_parts = 0;
    int32_t total, magic, sys_flag, body_len, qid = 0;
    int64_t q, bh, sh, topic_len, props_len, end, k, topic_idx;
    const uint8_t *bhost, *shost, *body, *pr, *seg, *stop, *rtopic;
    size_t rtopic_len;
    const rs_prop *real_topic = NULL, *real_qid = NULL;
    uint32_t h;

    if (size < RS_MSG_FIXED_V1_IPV4)
        return RS_TIMEUP_SLOW;
    total = rs_load_i32(p + RS_POS_TOTALSIZE);
    magic = rs_load_i32(p + RS_POS_MAGIC);
    if (total != size || (magic != RS_MESSAGE_MAGIC_CODE && magic != RS_MESSAGE_MAGIC_CODE_V2))
        return RS_TIMEUP_SLOW;
    v2 = magic == RS_MESSAGE_MAGIC_CODE_V2;
    sys_flag = rs_load_i32(p + RS_POS_SYSFLAG);
    if ((sys_flag & RS_TRANSACTION_TYPE_MASK) == RS_TRANSACTION_PREPARED_TYPE ||
        (sys_flag & RS_TRANSACTION_TYPE_MASK) == RS_TRANSACTION_ROLLBACK_TYPE)
        return RS_TIMEUP_SLOW;     /* not dispatched: the reference path takes no queue offset */
    bh = (sys_flag & RS_BORNHOST_V6_FLAG) ? RS_HOST_V6_LENGTH : RS_HOST_V4_LENGTH;
    sh = (sys_flag & RS_STOREHOSTADDRESS_V6_FLAG) ? RS_HOST_V6_LENGTH : RS_HOST_V4_LENGTH;
    q = RS_POS_BORNHOST;
    bhost = p + q;
    q += bh + 8;
    shost = p + q;
    q += sh;
    if (q + 16 > size)
        return RS_TIMEUP_SLOW;
    body_len = rs_load_i32(p + q + 12);
    q += 16;
    if (body_len < 0 || body_len > max_body || q + body_len > size)
        return RS_TIMEUP_SLOW;
    body = p + q;
    q += body_len;
    if (q + (v2 ? 2 : 1) > size)
        return RS_TIMEUP_SLOW;
    topic_len = v2 ? rs_load_i16(p + q) : p[q];
    q += v2 ? 2 : 1;
    if (topic_len < 0 || q + topic_len + 2 > size)
        return RS_TIMEUP_SLOW;
    q += topic_len;
    props_len = rs_load_i16(p + q);
    q += 2;
    if (props_len < 0 || q + props_len != size)
        return RS_TIMEUP_SLOW;
    pr = p + q;
    for (k = 0; k < props_len; k++)
        if (pr[k] & 0x80)
            return RS_TIMEUP_SLOW;  /* non-ASCII: chars and bytes differ, the reference path */

    /* string2messageProperties: a segment shorter than 3, or whose first 0x01 is its first
     * or last char, is skipped; a name seen again keeps its place and takes the new value. */
    seg = pr;
    end = props_len;
    while (seg <= pr + end) {
        size_t seg_len, kl;
        const uint8_t *s1;

        stop = memchr(seg, RS_PROPERTY_SEPARATOR, (size_t)(pr + end - seg));
        if (stop == NULL)
            stop = pr + end;
        seg_len = (size_t)(stop - seg);
        s1 = seg_len >= 3 ? memchr(seg, RS_NAME_VALUE_SEPARATOR, seg_len) : NULL;
        if (s1 != NULL && s1 != seg && s1 != stop - 1) {
            kl = (size_t)(s1 - seg);
            for (i = 0; i < n_props; i++)
                if (props[i].key_len == kl && memcmp(props[i].key, seg, kl) == 0)
                    break;
            if (i == n_props) {
                if (n_props == RS_TIMEUP_MAX_PROPS)
                    return RS_TIMEUP_SLOW;
                n_props++;
                props[i].key = seg;
                props[i].key_len = kl;
            }
            props[i].val = s1 + 1;
            props[i].val_len = (size_t)(stop - s1 - 1);
        }
        seg = stop + 1;
    }
    for (i = 0; i < n_props; i++) {
        if (rs_same(props[i].key, props[i].key_len, "REAL_TOPIC"))
            real_topic = &props[i];
        else if (rs_same(props[i].key, props[i].key_len, "REAL_QID"))
            real_qid = &props[i];
    }
    if (real_topic == NULL || real_topic->val_len == 0 || real_qid == NULL ||
        !rs_queue_id(real_qid->val, real_qid->val_len, &qid))
        return RS_TIMEUP_SLOW;
    for (k = 0; k < n_topics; k++)
        if ((size_t)(topic_off[k + 1] - topic_off[k]) == real_topic->val_len &&
            memcmp(topics + topic_off[k], real_topic->val, real_topic->val_len) == 0)
            break;
    if (k == n_topics) {
        topic_at[0] = (int64_t)(real_topic->val - src);
        topic_at[1] = (int64_t)real_topic->val_len;
        return RS_TIMEUP_TOPIC;
    }
    topic_idx = k;
    /* The sort below moves the entries: keep the topic itself, not its entry. */
    rtopic = real_topic->val;
    rtopic_len = real_topic->val_len;
    real_topic = real_qid = NULL;

    /* HashMap order: bucket (spread String.hashCode & 15), then insertion. ASCII names, so
     * UTF-16 units are the bytes. Insertion sort keeps equal buckets in insertion order. */
    for (i = 0; i < n_props; i++) {
        h = 0;
        for (k = 0; k < (int64_t)props[i].key_len; k++)
            h = 31 * h + props[i].key[k];
        props[i].bucket = (h ^ (h >> 16)) & 15;
    }
    for (i = 1; i < n_props; i++) {
        t = props[i];
        for (j = i; j > 0 && props[j - 1].bucket > t.bucket; j--)
            props[j] = props[j - 1];
        props[j] = t;
    }
    for (i = 0; i < n_props; i++) {
        if (i) {
            parts[n_parts].buf = &sep2;
            parts[n_parts++].len = 1;
        }
        parts[n_parts].buf = props[i].key;
        parts[n_parts++].len = props[i].key_len;
        parts[n_parts].buf = &sep1;
        parts[n_parts++].len = 1;
        parts[n_parts].buf = props[i].val;
        parts[n_parts++].len = props[i].val_len;
    }

    {
        size_t pl = 0;
        for (k = 0; k < (int64_t)n_parts; k++)
            pl += parts[k].len;
        rsize = rs_msg_size(sys_flag, body_len, (int64_t)rtopic_len, (int64_t)pl, 0);
    }
    if (rsize < 0 || rsize + RS_END_FILE_MIN_BLANK_LENGTH > max_record)
        return RS_TIMEUP_SLOW;
    if (!rs_in_bounds(pos, (uint64_t)rsize, out_len))
        return RS_TIMEUP_FULL;
    rsize = rs_msg_encode_parts(out, out_len, pos, rtopic, rtopic_len,
                                body, (size_t)body_len, parts, n_parts, qid,
                                rs_load_i32(p + RS_POS_FLAG), 0, 0, sys_flag,
                                rs_load_i64(p + RS_POS_BORNTIMESTAMP), bhost, (size_t)bh, 0,
                                shost, (size_t)sh, rs_load_i32(shost + sh), 0, 0);
    if (rsize < 0)
        return RS_TIMEUP_SLOW;
    *key = (topic_idx << 32) | (int64_t)qid;
    return rsize;
}

int rs_timeup_encode(const uint8_t *src, size_t src_len,
                     const int64_t *rec_pos, const int32_t *rec_size, int64_t first, int64_t n,
                     const uint8_t *topics, size_t topics_len,
                     const int64_t *topic_off, int64_t n_topics,
                     int64_t max_body, int64_t max_record,
                     uint8_t *out, size_t out_len,
                     int32_t *out_size, int64_t *out_key,
                     int64_t *done, int64_t *out_bytes, int64_t *topic_at)
{
    int64_t i, k;
    int r;

    if (first < 0 || n < first || n_topics < 0 || *out_bytes < 0)
        return RS_E_ARG;
    for (k = 0; k < n_topics; k++)
        if (topic_off[k] < 0 || topic_off[k + 1] < topic_off[k] ||
            (uint64_t)topic_off[k + 1] > (uint64_t)topics_len)
            return RS_E_BOUNDS;
    for (i = first; i < n; i++) {
        if (rec_size[i] < 0 || !rs_in_bounds(rec_pos[i], (uint64_t)rec_size[i], src_len)) {
            *done = i;
            return RS_E_BOUNDS;
        }
        r = rs_timeup_one(src + rec_pos[i], rec_size[i], topics, topic_off, n_topics,
                          max_body, max_record, out, out_len, *out_bytes, &out_key[i],
                          topic_at, src);
        if (r <= RS_TIMEUP_FULL) {    /* a stop reason; a record is at least 91 bytes */
            *done = i;
            return r;
        }
        out_size[i] = r;
        *out_bytes += r;
    }
    *done = n;
    return RS_TIMEUP_DONE;
}
