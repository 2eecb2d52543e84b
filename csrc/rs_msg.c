/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_msg.c - one CommitLog record: size, encode, validate.
 */
#include "rs_msg.h"
#include "rs_crc32.h"

/* BODYCRC keeps 31 bits: UtilAll#crc32 returns crc & 0x7FFFFFFF so it fits a positive int. */
#define RS_CRC_MASK 0x7FFFFFFFu

static inline int32_t rs_host_len(int32_t sys_flag, int32_t v6_bit)
{
    return (sys_flag & v6_bit) ? RS_HOST_V6_LENGTH : RS_HOST_V4_LENGTH;
}

/*
 * memmove(dst, src, n) for the short pieces of a record (hosts, topic, each property name,
 * separator and value): fixed-size loads and stores, no library call. A record has about a
 * dozen of them and the calls cost more than the copies (measured: a third of the encode).
 * Every load precedes every store, so overlapping ranges copy as memmove does.
 */
static inline void rs_copy(uint8_t *dst, const uint8_t *src, size_t n)
{
    if (n > 32) {
        memmove(dst, src, n);
    } else if (n > 16) {
        /* A properties string of a key and a tag: two overlapping 16-byte moves. */
        uint8_t a[16], b[16];
        memcpy(a, src, 16);
        memcpy(b, src + n - 16, 16);
        memcpy(dst, a, 16);
        memcpy(dst + n - 16, b, 16);
    } else if (n >= 8) {
        uint64_t a, b;
        memcpy(&a, src, 8);
        memcpy(&b, src + n - 8, 8);
        memcpy(dst, &a, 8);
        memcpy(dst + n - 8, &b, 8);
    } else if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, src, 4);
        memcpy(&b, src + n - 4, 4);
        memcpy(dst, &a, 4);
        memcpy(dst + n - 4, &b, 4);
    } else if (n > 0) {
        uint8_t a = src[0], b = src[n / 2], c = src[n - 1];
        dst[0] = a;
        dst[n / 2] = b;
        dst[n - 1] = c;
    }
}

int rs_msg_size(int32_t sys_flag, int64_t body_len, int64_t topic_len, int64_t props_len, int v2)
{
    return rs_record_size(sys_flag, body_len, topic_len, props_len, v2);
}

int rs_msg_encode(uint8_t *out, size_t out_len, int64_t pos,
                  const uint8_t *topic, size_t topic_len,
                  const uint8_t *body, size_t body_len,
                  const uint8_t *props, size_t props_len,
                  int32_t queue_id, int32_t flag, int64_t queue_offset, int64_t phy_offset,
                  int32_t sys_flag, int64_t born_timestamp,
                  const uint8_t *born_host, size_t born_host_len,
                  int64_t store_timestamp,
                  const uint8_t *store_host, size_t store_host_len,
                  int32_t reconsume_times, int64_t prepared_tx_offset, int v2)
{
    rs_part part;

    part.buf = props;
    part.len = props_len;
    return rs_msg_encode_parts(out, out_len, pos, topic, topic_len, body, body_len, &part, 1,
                               queue_id, flag, queue_offset, phy_offset, sys_flag,
                               born_timestamp, born_host, born_host_len, store_timestamp,
                               store_host, store_host_len, reconsume_times, prepared_tx_offset,
                               v2);
}


/*
 * The TAGS value of a properties string (doc/01 §3.6-3.7), for its tagsCode and for a tag
 * subscription's string check: split on 0x02; in each segment the first
 * 0x01 must be neither its first nor its last byte, else the segment is skipped.  Java also
 * skips segments shorter than 3 chars, but a segment passing the 0x01 test always has at least
 * name + 0x01 + value = 3 chars, so that test can never decide anything and is not repeated.
 * 0x01 and 0x02 are ASCII, so byte positions and char positions agree on first/last.
 */
static inline int rs_props_tags(const uint8_t *props, size_t len, const uint8_t **tags,
                                size_t *tags_len)
{
    size_t a = 0;

    *tags = NULL;
    *tags_len = 0;
    while (a <= len) {
        const uint8_t *seg = props + a;
        const uint8_t *sep = memchr(seg, RS_PROPERTY_SEPARATOR, len - a);
        size_t seg_len = sep ? (size_t)(sep - seg) : len - a;

        /* The segment's first 0x01 is its 5th byte ("TAGS" holds none) and not its last: the
         * name is TAGS and the value is not empty. No other segment needs its 0x01 found. */
        if (seg_len > 5 && memcmp(seg, "TAGS\x01", 5) == 0) {
            *tags = seg + 5;  /* HashMap#put: a later TAGS replaces an earlier one */
            *tags_len = seg_len - 5;
        }
        if (!sep)
            break;
        a += seg_len + 1;
    }
    return *tags != NULL;
}

static int rs_tags_code(const uint8_t *props, size_t len, int64_t *tags_code)
{
    const uint8_t *tags;
    size_t tags_len;

    if (!rs_props_tags(props, len, &tags, &tags_len)) {
        *tags_code = 0;
        return 0;
    }
    {
        int32_t h;
        rs_java_hash(tags, tags_len, &h);
        *tags_code = (int64_t)h;   /* (long) String.hashCode(): sign-extended, as the CQ stores it */
    }
    return 1;
}

int rs_tags_match(const uint8_t *props, size_t len, const uint8_t *tags, size_t tags_len,
                  const int64_t *ends, size_t n)
{
    const uint8_t *value;
    size_t value_len, i;
    int64_t start = 0;

    for (i = 0; i < n; i++) {
        if (ends[i] < start || (uint64_t)ends[i] > (uint64_t)tags_len)
            return RS_E_ARG;
        start = ends[i];
    }
    if (len == 0 || !rs_props_tags(props, len, &value, &value_len))
        return 0;   /* no TAGS: a tag subscription never takes it (PullAPIWrapper) */
    start = 0;
    for (i = 0; i < n; i++) {
        size_t k = (size_t)(ends[i] - start);
        if (k == value_len && memcmp(tags + start, value, k) == 0)
            return 1;
        start = ends[i];
    }
    return 0;
}

/* 32-bit FNV-1a of the topic bytes, as a signed int. Dispatch groups rows by (topic_hash,
 * queue_id) with numpy instead of slicing every topic out in Python; it compares the topic
 * bytes of each group before trusting it, so a collision costs speed, never correctness. */
static int32_t rs_topic_hash(const uint8_t *p, size_t n)
{
    uint32_t h = 2166136261u;
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= p[i];
        h *= 16777619u;
    }
    return (int32_t)h;
}

/* The topic rule for stored bytes (message.topic_problem is its Python twin): what a Java
 * String encodes to (well-formed UTF-8: no overlong form, surrogate or code point past
 * U+10FFFF), and a name for one directory under consumequeue/ (not empty, "." or "..", no '/'
 * or NUL). 4.9.8's store takes any topic ("Topic_ü_中" too); only a broker's send path holds
 * topics to ^[%|a-zA-Z0-9_-]+$. */
static int rs_topic_ok(const uint8_t *p, int32_t n)
{
    int32_t i = 0;
    if (n <= 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
        return 0;
    /* Eight bytes at a time while they are ASCII with no NUL or '/' (a topic's usual bytes,
     * which the loop below takes one by one); any other word is left to that loop. */
    while (n - i >= 8) {
        uint64_t w, s;
        memcpy(&w, p + i, 8);
        s = w ^ 0x2F2F2F2F2F2F2F2FULL;           /* a '/' byte becomes 0 */
        if ((w & 0x8080808080808080ULL) ||
            ((w - 0x0101010101010101ULL) & ~w & 0x8080808080808080ULL) ||
            ((s - 0x0101010101010101ULL) & ~s & 0x8080808080808080ULL))
            break;
        i += 8;
    }
    while (i < n) {
        uint8_t c = p[i];
        int32_t need, k;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            if (c == 0 || c == '/')
                return 0;
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0)
                lo = 0xA0;                /* no overlong form */
            else if (c == 0xED)
                hi = 0x9F;                /* no surrogate */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;                /* nothing past U+10FFFF */
        } else
            return 0;
        if (n - i - 1 < need)
            return 0;
        for (k = 1; k <= need; k++) {
            uint8_t b = p[i + k];
            if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF))
                return 0;
        }
        i += need + 1;
    }
    return 1;
}

/* rs_row_set's `tags` beside the RS_ROW_TAGS_* modes, for rs_msg_check_read: whether TAGS has
 * a value is found as RS_ROW_TAGS_FIND finds it, and tags_code is left 0 (not hashed). */
#define ROW_TAGS_SEEN -2

/* The one place a rs_scan_rec is set: from the record's fields, which rs_row_fill reads from
 * its bytes and rs_msg_encode_row has in hand.  `topic` is the record's topic bytes (for the
 * SCHEDULE_TOPIC_XXXX mark), `props` its properties (for RS_ROW_TAGS_FIND). */
static inline void rs_row_set(rs_scan_rec *row, int64_t pos, int32_t size, int32_t sys_flag,
                              int v2, int64_t fixed, int32_t body_len, int64_t topic_off,
                              const uint8_t *topic, int32_t topic_len, int64_t props_off,
                              const uint8_t *props, int32_t props_len, int32_t topic_hash,
                              int tags, int64_t tags_code, int64_t phy_offset,
                              int64_t queue_offset, int64_t store_timestamp,
                              int64_t born_timestamp, int64_t prepared_tx_offset,
                              int32_t queue_id, int32_t flag, int32_t body_crc,
                              int32_t reconsume_times)
{
    int has_tags;
    int32_t info;

    if (tags == RS_ROW_TAGS_FIND) {
        tags_code = 0;
        has_tags = props_len ? rs_tags_code(props, (size_t)props_len, &tags_code) : 0;
    } else if (tags == ROW_TAGS_SEEN) {
        const uint8_t *value;
        size_t value_len;

        tags_code = 0;
        has_tags = props_len ? rs_props_tags(props, (size_t)props_len, &value, &value_len) : 0;
    } else {
        has_tags = tags == RS_ROW_TAGS_GIVEN;
        if (!has_tags)
            tags_code = 0;
    }
    info = (v2 ? RS_SCAN_INFO_V2 : 0) | (has_tags ? RS_SCAN_INFO_HAS_TAGS : 0);
    if (topic_len == (int32_t)(sizeof(RS_SCHEDULE_TOPIC) - 1) &&
        memcmp(topic, RS_SCHEDULE_TOPIC, sizeof(RS_SCHEDULE_TOPIC) - 1) == 0)
        info |= RS_SCAN_INFO_SCHEDULE;   /* the caller derives tagsCode from DELAY (doc/01 §3.7) */

    row->pos = pos;
    row->phy_offset = phy_offset;
    row->queue_offset = queue_offset;
    row->tags_code = tags_code;
    row->store_timestamp = store_timestamp;
    row->born_timestamp = born_timestamp;
    row->prepared_tx_offset = prepared_tx_offset;
    row->size = size;
    row->queue_id = queue_id;
    row->sys_flag = sys_flag;
    row->flag = flag;
    row->body_crc = body_crc;
    row->reconsume_times = reconsume_times;
    row->body_off = (int32_t)(fixed);
    row->body_len = body_len;
    row->topic_off = (int32_t)topic_off;
    row->topic_len = topic_len;
    row->props_off = (int32_t)props_off;
    row->props_len = props_len;
    row->info = info;
    row->topic_hash = topic_hash;
    assert(props_off + props_len == size && topic_off + topic_len + 2 == props_off);
}

/* The row of a record whose lengths are known to fit (rs_msg_check checked them, or the caller
 * encoded the record), from its bytes. */
static inline void rs_row_fill(const uint8_t *rec, int64_t pos, int32_t size, int32_t sys_flag,
                               int v2, int64_t fixed, int32_t body_len, int64_t topic_off,
                               int32_t topic_len, int64_t props_off, int32_t props_len,
                               int32_t topic_hash, int tags, int64_t tags_code,
                               rs_scan_rec *row)
{
    int64_t q = RS_POS_BORNHOST + rs_host_len(sys_flag, RS_BORNHOST_V6_FLAG);

    rs_row_set(row, pos, size, sys_flag, v2, fixed, body_len, topic_off, rec + topic_off,
               topic_len, props_off, rec + props_off, props_len, topic_hash, tags, tags_code,
               rs_load_i64(rec + RS_POS_PHYSICALOFFSET), rs_load_i64(rec + RS_POS_QUEUEOFFSET),
               rs_load_i64(rec + q), rs_load_i64(rec + RS_POS_BORNTIMESTAMP),
               rs_load_i64(rec + fixed - 12), rs_load_i32(rec + RS_POS_QUEUEID),
               rs_load_i32(rec + RS_POS_FLAG), rs_load_i32(rec + RS_POS_BODYCRC),
               rs_load_i32(rec + fixed - 16));
}

/* rs_msg_encode_parts, and with `row` the record's row (rs_msg_encode_row). */
static inline int rs_encode_parts(uint8_t *out, size_t out_len, int64_t pos,
                                  const uint8_t *topic, size_t topic_len,
                                  const uint8_t *body, size_t body_len,
                                  const rs_part *props, size_t n_parts,
                                  int32_t queue_id, int32_t flag, int64_t queue_offset,
                                  int64_t phy_offset, int32_t sys_flag, int64_t born_timestamp,
                                  const uint8_t *born_host, size_t born_host_len,
                                  int64_t store_timestamp,
                                  const uint8_t *store_host, size_t store_host_len,
                                  int32_t reconsume_times, int64_t prepared_tx_offset, int v2,
                                  rs_scan_rec *row, int32_t topic_hash, int tags,
                                  int64_t tags_code)
{
    size_t bh = (size_t)rs_host_len(sys_flag, RS_BORNHOST_V6_FLAG);
    size_t sh = (size_t)rs_host_len(sys_flag, RS_STOREHOSTADDRESS_V6_FLAG);
    size_t props_len = 0, i;
    uint32_t crc;
    uint8_t *p;
    int size;

    if (born_host_len != bh || store_host_len != sh)
        return RS_E_ARG;
    for (i = 0; i < n_parts; i++) {
        if (props[i].len > (size_t)INT32_MAX)
            return RS_E_TOO_LONG;
        props_len += props[i].len;
    }
    size = rs_record_size(sys_flag, (int64_t)(body_len > INT64_MAX ? INT64_MAX : body_len),
                       (int64_t)(topic_len > INT64_MAX ? INT64_MAX : topic_len),
                       (int64_t)(props_len > INT64_MAX ? INT64_MAX : props_len), v2);
    if (size < 0)
        return size;
    if (!rs_in_bounds(pos, (uint64_t)size, out_len))
        return RS_E_BOUNDS;

    crc = rs_crc32(0, body, body_len) & RS_CRC_MASK;
    p = out + pos;
    rs_store_be32(p + 0, (uint32_t)size);
    rs_store_be32(p + 4, (uint32_t)(v2 ? RS_MESSAGE_MAGIC_CODE_V2 : RS_MESSAGE_MAGIC_CODE));
    rs_store_be32(p + 8, crc);
    rs_store_be32(p + 12, (uint32_t)queue_id);
    rs_store_be32(p + 16, (uint32_t)flag);
    rs_store_be64(p + 20, (uint64_t)queue_offset);
    rs_store_be64(p + 28, (uint64_t)phy_offset);
    rs_store_be32(p + 36, (uint32_t)sys_flag);
    rs_store_be64(p + 40, (uint64_t)born_timestamp);
    p += RS_POS_BORNHOST;
    rs_copy(p, born_host, bh);
    p += bh;
    rs_store_be64(p, (uint64_t)store_timestamp);
    p += 8;
    rs_copy(p, store_host, sh);
    p += sh;
    rs_store_be32(p, (uint32_t)reconsume_times);
    rs_store_be64(p + 4, (uint64_t)prepared_tx_offset);
    rs_store_be32(p + 12, (uint32_t)body_len);
    p += 16;
    if (body_len)
        memmove(p, body, body_len);   /* memmove: the caller may encode from its own window */
    p += body_len;
    if (v2) {
        rs_store_be16(p, (uint16_t)topic_len);
        p += 2;
    } else {
        *p++ = (uint8_t)topic_len;
    }
    rs_copy(p, topic, topic_len);
    p += topic_len;
    rs_store_be16(p, (uint16_t)props_len);
    p += 2;
    for (i = 0; i < n_parts; i++) {
        rs_copy(p, props[i].buf, props[i].len);
        p += props[i].len;
    }
    assert(p == out + pos + size);   /* the layout agrees with calMsgLength */
    if (row != NULL) {
        int64_t fixed = RS_POS_BORNHOST + (int64_t)bh + 8 + (int64_t)sh + 4 + 8 + 4;
        int64_t topic_off = fixed + (int64_t)body_len + (v2 ? 2 : 1);
        int64_t props_off = topic_off + (int64_t)topic_len + 2;

        rs_row_set(row, pos, size, sys_flag, v2, fixed, (int32_t)body_len, topic_off,
                   out + pos + topic_off, (int32_t)topic_len, props_off, out + pos + props_off,
                   (int32_t)props_len, topic_hash, tags, tags_code, phy_offset, queue_offset,
                   store_timestamp, born_timestamp, prepared_tx_offset, queue_id, flag,
                   (int32_t)crc, reconsume_times);
    }
    return size;
}

int rs_msg_encode_parts(uint8_t *out, size_t out_len, int64_t pos,
                        const uint8_t *topic, size_t topic_len,
                        const uint8_t *body, size_t body_len,
                        const rs_part *props, size_t n_parts,
                        int32_t queue_id, int32_t flag, int64_t queue_offset, int64_t phy_offset,
                        int32_t sys_flag, int64_t born_timestamp,
                        const uint8_t *born_host, size_t born_host_len,
                        int64_t store_timestamp,
                        const uint8_t *store_host, size_t store_host_len,
                        int32_t reconsume_times, int64_t prepared_tx_offset, int v2)
{
    return rs_encode_parts(out, out_len, pos, topic, topic_len, body, body_len, props, n_parts,
                           queue_id, flag, queue_offset, phy_offset, sys_flag, born_timestamp,
                           born_host, born_host_len, store_timestamp, store_host,
                           store_host_len, reconsume_times, prepared_tx_offset, v2, NULL, 0,
                           RS_ROW_TAGS_NONE, 0);
}

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
                      int32_t topic_hash, int tags, int64_t tags_code, rs_scan_rec *row)
{
    if (row == NULL ||
        (tags != RS_ROW_TAGS_FIND && tags != RS_ROW_TAGS_NONE && tags != RS_ROW_TAGS_GIVEN))
        return RS_E_ARG;
    return rs_encode_parts(out, out_len, pos, topic, topic_len, body, body_len, props, n_parts,
                           queue_id, flag, queue_offset, phy_offset, sys_flag, born_timestamp,
                           born_host, born_host_len, store_timestamp, store_host,
                           store_host_len, reconsume_times, prepared_tx_offset, 0, row,
                           topic_hash, tags, tags_code);
}

/* rs_msg_check and rs_msg_check_read: `known` (known_len bytes, known_hash its topic hash) is a
 * topic that passed the topic rule, or NULL; `tags` RS_ROW_TAGS_FIND or ROW_TAGS_SEEN. */
static int msg_check(const uint8_t *buf, size_t len, int64_t pos, int check_crc,
                     const uint8_t *known, size_t known_len, int32_t known_hash, int tags,
                     rs_scan_rec *row, int32_t *size_out)
{
    const uint8_t *rec;
    int32_t size, magic, sys_flag, body_len, props_len, topic_len;
    int64_t q, fixed, body_off, topic_off, props_off;
    int v2, same;
    size_t avail;

    *size_out = 0;
    if (pos < 0 || (uint64_t)pos > (uint64_t)len)
        return RS_E_BOUNDS;
    avail = len - (size_t)pos;
    if (avail < 8)
        return RS_SCAN_PARTIAL;
    rec = buf + pos;
    size = rs_load_i32(rec);
    magic = rs_load_i32(rec + RS_POS_MAGIC);
    if (magic == RS_BLANK_MAGIC_CODE) {
        *size_out = size;
        return RS_SCAN_BLANK;
    }
    if (magic == 0)
        return RS_SCAN_EMPTY;
    if (magic != RS_MESSAGE_MAGIC_CODE && magic != RS_MESSAGE_MAGIC_CODE_V2)
        return RS_SCAN_CORRUPT;
    v2 = magic == RS_MESSAGE_MAGIC_CODE_V2;
    if (size < RS_MSG_FIXED_V1_IPV4)
        return RS_SCAN_CORRUPT;
    if ((uint64_t)size > (uint64_t)avail) {
        *size_out = size;
        return RS_SCAN_PARTIAL;
    }

    /* From here every read is inside rec[0, size), checked field by field. */
    sys_flag = rs_load_i32(rec + RS_POS_SYSFLAG);
    q = RS_POS_BORNHOST + rs_host_len(sys_flag, RS_BORNHOST_V6_FLAG);
    fixed = q + 8 + rs_host_len(sys_flag, RS_STOREHOSTADDRESS_V6_FLAG) + 4 + 8 + 4;
    if (fixed > size)
        return RS_SCAN_CORRUPT;
    body_len = rs_load_i32(rec + fixed - 4);
    body_off = fixed;
    if (body_len < 0 || body_off + body_len > size)
        return RS_SCAN_CORRUPT;
    q = body_off + body_len;
    if (q + (v2 ? 2 : 1) > size)
        return RS_SCAN_CORRUPT;
    /* v1's topic length is read unsigned (0..255); v2's is a signed short. */
    topic_len = v2 ? rs_load_i16(rec + q) : rec[q];
    topic_off = q + (v2 ? 2 : 1);
    if (topic_len < 0 || topic_off + topic_len + 2 > size)
        return RS_SCAN_CORRUPT;
    q = topic_off + topic_len;
    props_len = rs_load_i16(rec + q);
    props_off = q + 2;
    if (props_len < 0 || props_off + props_len > size)
        return RS_SCAN_CORRUPT;
    if (check_crc &&
        (rs_crc32(0, rec + body_off, (size_t)body_len) & RS_CRC_MASK) !=
            rs_load_be32(rec + RS_POS_BODYCRC))
        return RS_SCAN_CORRUPT;   /* a stored CRC with bit 31 set can never match */
    /* A queue's records share one topic: bytes equal to a topic that passed the rule pass it,
     * and hash to its hash. */
    same = known != NULL && known_len == (size_t)topic_len &&
           memcmp(rec + topic_off, known, known_len) == 0;
    if (!same && !rs_topic_ok(rec + topic_off, topic_len))
        return RS_SCAN_TOPIC;
    if (props_off + props_len != size) {
        *size_out = size;
        return RS_SCAN_MISMATCH;
    }

    rs_row_fill(rec, pos, size, sys_flag, v2, fixed, body_len, topic_off, topic_len, props_off,
                props_len, same ? known_hash : rs_topic_hash(rec + topic_off, (size_t)topic_len),
                tags, 0, row);
    *size_out = size;
    return RS_OK;
}

int rs_msg_check(const uint8_t *buf, size_t len, int64_t pos, int check_crc,
                 rs_scan_rec *row, int32_t *size_out)
{
    return msg_check(buf, len, pos, check_crc, NULL, 0, 0, RS_ROW_TAGS_FIND, row, size_out);
}

int rs_msg_check_read(const uint8_t *buf, size_t len, int64_t pos, const uint8_t *topic,
                      size_t topic_len, int32_t topic_hash, rs_scan_rec *row, int32_t *size_out)
{
    return msg_check(buf, len, pos, 0, topic, topic_len, topic_hash, ROW_TAGS_SEEN, row,
                     size_out);
}

int32_t rs_msg_topic_hash(const uint8_t *topic, size_t len)
{
    return rs_topic_hash(topic, len);
}

int rs_msg_row(const uint8_t *buf, size_t len, int64_t pos, int32_t topic_hash, int tags,
               int64_t tags_code, rs_scan_rec *row)
{
    const uint8_t *rec;
    int32_t size, sys_flag, body_len, topic_len, props_len;
    int64_t fixed, topic_off, props_off;
    int v2;

    if (pos < 0 || (uint64_t)pos > (uint64_t)len || len - (size_t)pos < RS_MSG_FIXED_V1_IPV4)
        return RS_E_BOUNDS;
    rec = buf + pos;
    size = rs_load_i32(rec);
    if (size < RS_MSG_FIXED_V1_IPV4 || (uint64_t)size > (uint64_t)(len - (size_t)pos))
        return RS_E_BOUNDS;
    v2 = rs_load_i32(rec + RS_POS_MAGIC) == RS_MESSAGE_MAGIC_CODE_V2;
    sys_flag = rs_load_i32(rec + RS_POS_SYSFLAG);
    fixed = RS_POS_BORNHOST + rs_host_len(sys_flag, RS_BORNHOST_V6_FLAG) + 8 +
            rs_host_len(sys_flag, RS_STOREHOSTADDRESS_V6_FLAG) + 4 + 8 + 4;
    /* The lengths, checked only so that no read leaves the record: the caller encoded it. */
    if (fixed + (v2 ? 2 : 1) > size)
        return RS_E_ARG;
    body_len = rs_load_i32(rec + fixed - 4);
    if (body_len < 0 || fixed + body_len + (v2 ? 2 : 1) > size)
        return RS_E_ARG;
    topic_off = fixed + body_len + (v2 ? 2 : 1);
    topic_len = v2 ? rs_load_i16(rec + topic_off - 2) : rec[topic_off - 1];
    if (topic_len < 0 || topic_off + topic_len + 2 > size)
        return RS_E_ARG;
    props_off = topic_off + topic_len + 2;
    props_len = rs_load_i16(rec + props_off - 2);
    if (props_len < 0 || props_off + props_len != size)
        return RS_E_ARG;
    if (tags != RS_ROW_TAGS_FIND && tags != RS_ROW_TAGS_NONE && tags != RS_ROW_TAGS_GIVEN)
        return RS_E_ARG;
    rs_row_fill(rec, pos, size, sys_flag, v2, fixed, body_len, topic_off, topic_len, props_off,
                props_len, topic_hash, tags, tags_code, row);
    return size;
}
