/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_index.c - IndexFile put and chain walk (spec 02 §2.3, §2.6).
 */
#include <string.h>

#include "rs_index.h"
#include "rs_crc32.h"

int rs_index_hash(const uint8_t *buf, size_t len, int32_t *hash)
{
    int32_t h = 0;

    rs_java_hash(buf, len, &h);
    /* Math.abs(Integer.MIN_VALUE) is still negative in Java; indexKeyHashMethod then uses 0. */
    *hash = h == INT32_MIN ? 0 : (h < 0 ? -h : h);
    return RS_OK;
}

/* The last valid `name` segment's value in a properties string (see rs_tags_code in rs_msg.c:
 * a segment counts when its first 0x01 is neither its first nor its last byte). */
static const uint8_t *rs_prop_value(const uint8_t *props, size_t len, const char *name,
                                    size_t name_len, size_t *value_len)
{
    const uint8_t *value = NULL;
    size_t a = 0;

    while (a <= len) {
        const uint8_t *seg = props + a;
        const uint8_t *sep = memchr(seg, RS_PROPERTY_SEPARATOR, len - a);
        size_t seg_len = sep ? (size_t)(sep - seg) : len - a;
        const uint8_t *kv = seg_len ? memchr(seg, RS_NAME_VALUE_SEPARATOR, seg_len) : NULL;

        if (kv && kv != seg && kv != seg + seg_len - 1 && (size_t)(kv - seg) == name_len &&
            memcmp(seg, name, name_len) == 0) {
            value = kv + 1;
            *value_len = seg_len - name_len - 1;
        }
        if (!sep)
            break;
        a += seg_len + 1;
    }
    return value;
}

static inline int32_t rs_index_abs(uint32_t h)
{
    int32_t s = (int32_t)h;
    return s == INT32_MIN ? 0 : (s < 0 ? -s : s);
}

int rs_index_keys(const uint8_t *buf, size_t len, const rs_scan_rec *rows, size_t nrows,
                  int32_t *out_hashes, int32_t *out_rows, size_t cap, size_t *count,
                  size_t *rows_done)
{
    size_t i, n = 0;

    *count = 0;
    *rows_done = 0;
    for (i = 0; i < nrows; i++) {
        const rs_scan_rec *r = &rows[i];
        const uint8_t *props, *topic, *uniq, *keys;
        size_t uniq_len = 0, keys_len = 0, need = 0, a;
        uint32_t prefix;
        uint64_t t0, p0;

        if ((r->sys_flag & RS_TRANSACTION_TYPE_MASK) == RS_TRANSACTION_ROLLBACK_TYPE)
            continue;
        /* Rows normally come from rs_commitlog_scan over the same buf; check them anyway, in
         * unsigned arithmetic that cannot overflow (each term is below 2^63 + 2^32). */
        if (r->pos < 0 || r->topic_off < 0 || r->topic_len < 0 || r->props_off < 0 ||
            r->props_len < 0 || (uint64_t)r->pos > (uint64_t)len)
            return RS_E_BOUNDS;
        t0 = (uint64_t)r->pos + (uint64_t)r->topic_off;
        p0 = (uint64_t)r->pos + (uint64_t)r->props_off;
        if (t0 + (uint64_t)r->topic_len > (uint64_t)len ||
            p0 + (uint64_t)r->props_len > (uint64_t)len)
            return RS_E_BOUNDS;
        topic = buf + t0;
        props = buf + p0;
        uniq = rs_prop_value(props, (size_t)r->props_len, "UNIQ_KEY", 8, &uniq_len);
        keys = rs_prop_value(props, (size_t)r->props_len, "KEYS", 4, &keys_len);
        if (uniq)
            need++;
        for (a = 0; keys && a < keys_len; a++)      /* pieces: runs of non-space bytes */
            if (keys[a] != ' ' && (a == 0 || keys[a - 1] == ' '))
                need++;
        if (need == 0)
            continue;
        if (n + need > cap)
            break;
        prefix = rs_java_hash_continue(0, topic, (size_t)r->topic_len);
        prefix = 31 * prefix + '#';
        if (uniq) {
            out_hashes[n] = rs_index_abs(rs_java_hash_continue(prefix, uniq, uniq_len));
            out_rows[n++] = (int32_t)i;
        }
        for (a = 0; keys && a < keys_len;) {
            size_t b = a;
            while (b < keys_len && keys[b] != ' ')
                b++;
            if (b > a) {
                out_hashes[n] = rs_index_abs(rs_java_hash_continue(prefix, keys + a, b - a));
                out_rows[n++] = (int32_t)i;
            }
            a = b + 1;
        }
    }
    *count = n;
    *rows_done = i;
    return RS_OK;
}

/* The geometry check shared by all kernels: returns RS_OK or the status to give back. */
static int rs_index_geometry(size_t len, int32_t slot_num, int32_t index_num)
{
    uint64_t need;

    if (slot_num < 1 || index_num < 1)
        return RS_E_ARG;
    need = RS_INDEX_HEADER_SIZE + (uint64_t)slot_num * RS_INDEX_SLOT_SIZE +
           (uint64_t)index_num * RS_INDEX_ENTRY_SIZE;
    if (need > (uint64_t)len)
        return RS_E_BOUNDS;
    return RS_OK;
}

/* IndexHeader#load: an indexCount <= 0 (a fresh, all-zero header) reads as 1. */
static inline int32_t rs_index_count(const uint8_t *buf)
{
    int32_t n = rs_load_i32(buf + RS_INDEX_POS_INDEX_COUNT);
    return n <= 0 ? 1 : n;
}

/* One putKey after the geometry check; returns the new indexCount or 0 when full. */
static int32_t rs_index_put1(uint8_t *buf, int32_t slot_num, int32_t index_num,
                             int32_t key_hash, int64_t phy_offset, int64_t store_timestamp)
{
    int32_t count = rs_index_count(buf);
    int64_t begin_ts, diff;
    int32_t slot_value;
    uint8_t *slot, *entry;

    if (count >= index_num)
        return 0;
    slot = buf + RS_INDEX_HEADER_SIZE + (size_t)(key_hash % slot_num) * RS_INDEX_SLOT_SIZE;
    slot_value = rs_load_i32(slot);
    if (slot_value <= 0 || slot_value > count)
        slot_value = 0;
    begin_ts = rs_load_i64(buf + RS_INDEX_POS_BEGIN_TIMESTAMP);
    /* Unsigned subtraction: Java's long wraps where C's signed overflow is undefined. */
    diff = (int64_t)((uint64_t)store_timestamp - (uint64_t)begin_ts) / 1000;
    if (begin_ts <= 0 || diff < 0)
        diff = 0;
    else if (diff > INT32_MAX)
        diff = INT32_MAX;
    entry = buf + RS_INDEX_HEADER_SIZE + (size_t)slot_num * RS_INDEX_SLOT_SIZE +
            (size_t)count * RS_INDEX_ENTRY_SIZE;
    rs_store_be32(entry + RS_INDEX_ENTRY_POS_KEY_HASH, (uint32_t)key_hash);
    rs_store_be64(entry + RS_INDEX_ENTRY_POS_PHY_OFFSET, (uint64_t)phy_offset);
    rs_store_be32(entry + RS_INDEX_ENTRY_POS_TIME_DIFF, (uint32_t)diff);
    rs_store_be32(entry + RS_INDEX_ENTRY_POS_PREV_INDEX, (uint32_t)slot_value);
    rs_store_be32(slot, (uint32_t)count);
    if (count <= 1) {
        rs_store_be64(buf + RS_INDEX_POS_BEGIN_PHY_OFFSET, (uint64_t)phy_offset);
        rs_store_be64(buf + RS_INDEX_POS_BEGIN_TIMESTAMP, (uint64_t)store_timestamp);
    }
    if (slot_value == 0)
        rs_store_be32(buf + RS_INDEX_POS_HASH_SLOT_COUNT,
                      rs_load_be32(buf + RS_INDEX_POS_HASH_SLOT_COUNT) + 1u);
    rs_store_be32(buf + RS_INDEX_POS_INDEX_COUNT, (uint32_t)(count + 1));
    rs_store_be64(buf + RS_INDEX_POS_END_PHY_OFFSET, (uint64_t)phy_offset);
    rs_store_be64(buf + RS_INDEX_POS_END_TIMESTAMP, (uint64_t)store_timestamp);
    return count + 1;
}

int rs_index_put(uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                 int32_t key_hash, int64_t phy_offset, int64_t store_timestamp)
{
    int r = rs_index_geometry(len, slot_num, index_num);

    if (r != RS_OK)
        return r;
    if (key_hash < 0)
        return RS_E_ARG;
    return rs_index_put1(buf, slot_num, index_num, key_hash, phy_offset, store_timestamp);
}

int rs_index_put_batch(uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                       const int32_t *key_hashes, const int64_t *phy_offsets,
                       const int64_t *store_timestamps, size_t n, int64_t *count)
{
    int r = rs_index_geometry(len, slot_num, index_num);
    size_t i;

    *count = 0;
    if (r != RS_OK)
        return r;
    /* Validate first, so a bad hash never leaves the file half-updated. */
    for (i = 0; i < n; i++)
        if (key_hashes[i] < 0)
            return RS_E_ARG;
    for (i = 0; i < n; i++)
        if (rs_index_put1(buf, slot_num, index_num, key_hashes[i], phy_offsets[i],
                          store_timestamps[i]) == 0)
            break;
    *count = (int64_t)i;
    return RS_OK;
}

int rs_index_lookup(const uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                    int32_t key_hash, int64_t begin, int64_t end,
                    int64_t *out, int64_t cap, int64_t *count)
{
    int r = rs_index_geometry(len, slot_num, index_num);
    const uint8_t *entries;
    int32_t index_count, n;
    int64_t begin_ts, found = 0, hops;

    *count = 0;
    if (r != RS_OK)
        return r;
    if (key_hash < 0)
        return RS_E_ARG;
    index_count = rs_index_count(buf);
    n = rs_load_i32(buf + RS_INDEX_HEADER_SIZE + (size_t)(key_hash % slot_num) * RS_INDEX_SLOT_SIZE);
    /* n >= index_num: a corrupt header may claim more entries than the file holds. */
    if (n <= 0 || n > index_count || n >= index_num || index_count <= 1)
        return RS_OK;
    begin_ts = rs_load_i64(buf + RS_INDEX_POS_BEGIN_TIMESTAMP);
    entries = buf + RS_INDEX_HEADER_SIZE + (size_t)slot_num * RS_INDEX_SLOT_SIZE;
    for (hops = 0; hops < index_num && found < cap; hops++) {
        const uint8_t *e = entries + (size_t)n * RS_INDEX_ENTRY_SIZE;
        int32_t hash_read = rs_load_i32(e + RS_INDEX_ENTRY_POS_KEY_HASH);
        int64_t phy_read = rs_load_i64(e + RS_INDEX_ENTRY_POS_PHY_OFFSET);
        int64_t diff = rs_load_i32(e + RS_INDEX_ENTRY_POS_TIME_DIFF);
        int32_t prev = rs_load_i32(e + RS_INDEX_ENTRY_POS_PREV_INDEX);
        int64_t time_read;

        if (diff < 0)
            break;
        time_read = (int64_t)((uint64_t)begin_ts + (uint64_t)(diff * 1000));
        if (hash_read == key_hash && time_read >= begin && time_read <= end)
            out[found++] = phy_read;
        if (prev <= 0 || prev > index_count || prev >= index_num || prev == n ||
            time_read < begin)
            break;
        n = prev;
    }
    *count = found;
    return RS_OK;
}
