/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_index.c - IndexFile put and chain walk (doc/02 §2.3, §2.6).
 */
#include <string.h>

#include "rs_index.h"
#include "rs_crc32.h"
#include "rs_msg.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

int rs_index_hash(const uint8_t *buf, size_t len, int32_t *hash)
{
    int32_t h = 0;

    rs_java_hash(buf, len, &h);
    /* Math.abs(Integer.MIN_VALUE) is still negative in Java; indexKeyHashMethod then uses 0. */
    *hash = h == INT32_MIN ? 0 : (h < 0 ? -h : h);
    return RS_OK;
}

/* One segment of a properties string, for rs_index_props: neither name holds 0x01, so a segment
 * that starts with name + 0x01 has its first 0x01 right there; it counts when a value follows. */
static inline void rs_index_segment(const uint8_t *seg, size_t seg_len, const uint8_t **uniq,
                                    size_t *uniq_len, const uint8_t **keys, size_t *keys_len)
{
    if (seg_len > 5 && memcmp(seg, "KEYS\x01", 5) == 0) {
        *keys = seg + 5;
        *keys_len = seg_len - 5;
    } else if (seg_len > 9 && memcmp(seg, "UNIQ_KEY\x01", 9) == 0) {
        *uniq = seg + 9;
        *uniq_len = seg_len - 9;
    }
}

#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#define RS_INDEX_MASKS 1
/* Bit i of *seps (*spaces) set when p[i] is 0x02 (a space), for 16 <= len <= 64: 16 bytes a
 * compare, the last 16 overlapping bytes seen already (their bits come out the same), and
 * nothing read outside p[0, len). */
static inline void rs_index_masks(const uint8_t *p, size_t len, uint64_t *seps,
                                  uint64_t *spaces)
{
    const __m128i two = _mm_set1_epi8(RS_PROPERTY_SEPARATOR), space = _mm_set1_epi8(' ');
    uint64_t s = 0, b = 0;
    size_t i;
    __m128i v;

    for (i = 0; i + 16 <= len; i += 16) {
        v = _mm_loadu_si128((const __m128i *)(const void *)(p + i));
        s |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, two)) << i;
        b |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, space)) << i;
    }
    if (i < len) {
        v = _mm_loadu_si128((const __m128i *)(const void *)(p + len - 16));
        s |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, two)) << (len - 16);
        b |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, space)) << (len - 16);
    }
    *seps = s;
    *spaces = b;
}
#endif

/* The UNIQ_KEY and KEYS values of a properties string, as string2messageProperties reads them:
 * a segment counts when its first 0x01 is neither its first nor its last byte (see rs_tags_code
 * in rs_msg.c), and the last valid segment of a name wins.  A value not found is NULL.  One
 * pass over the segments finds both.
 *
 * With `spaces` (not NULL), a properties string of 16 to 64 bytes (a key and a tag or two) is
 * read with SSE2 where the compiler has it: its separators and spaces as bit masks from four
 * compares, the segments walked by their bits.  Then 1 is returned and bit i of *spaces is set
 * when keys[i] is a space (0 without KEYS), for rs_index_chunk_row's split; otherwise 0, and
 * the segments are found by memchr.  Measured under callgrind: the memchr calls and this
 * function's loop were ~130 instructions a record of the index dispatch.  Always inline: as a
 * call, saving and restoring registers cost a fifth of it. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((always_inline))
#endif
static inline int rs_index_props(const uint8_t *props, size_t len, const uint8_t **uniq,
                          size_t *uniq_len, const uint8_t **keys, size_t *keys_len,
                          uint64_t *spaces)
{
    size_t a = 0;

    *uniq = *keys = NULL;
    *uniq_len = *keys_len = 0;
#ifdef RS_INDEX_MASKS
    if (spaces != NULL && len >= 16 && len <= 64) {
        uint64_t seps, sp;

        rs_index_masks(props, len, &seps, &sp);
        for (;;) {
            size_t end = seps ? (size_t)__builtin_ctzll(seps) : len;

            rs_index_segment(props + a, end - a, uniq, uniq_len, keys, keys_len);
            if (!seps)
                break;
            seps &= seps - 1;
            a = end + 1;
        }
        /* KEYS' value starts 5 bytes into its segment and is at most 59 bytes long. */
        *spaces = *keys ? (sp >> (size_t)(*keys - props)) & ((1ULL << *keys_len) - 1) : 0;
        return 1;
    }
#else
    (void)spaces;
#endif
    while (a <= len) {
        const uint8_t *seg = props + a;
        const uint8_t *sep = memchr(seg, RS_PROPERTY_SEPARATOR, len - a);
        size_t seg_len = sep ? (size_t)(sep - seg) : len - a;

        rs_index_segment(seg, seg_len, uniq, uniq_len, keys, keys_len);
        if (!sep)
            break;
        a += seg_len + 1;
    }
    return 0;
}

/* A scanned row's topic and properties lie inside buf[0, len)?  Rows normally come from
 * rs_commitlog_scan over the same buf; they are checked anyway, in unsigned arithmetic that
 * cannot overflow (each term is below 2^63 + 2^32). */
static int rs_index_row_in(const rs_scan_rec *r, size_t len)
{
    uint64_t t0, p0;

    if (r->pos < 0 || r->topic_off < 0 || r->topic_len < 0 || r->props_off < 0 ||
        r->props_len < 0 || (uint64_t)r->pos > (uint64_t)len)
        return 0;
    t0 = (uint64_t)r->pos + (uint64_t)r->topic_off;
    p0 = (uint64_t)r->pos + (uint64_t)r->props_off;
    return t0 + (uint64_t)r->topic_len <= (uint64_t)len &&
           p0 + (uint64_t)r->props_len <= (uint64_t)len;
}

/* The hash of "topic#": every key of a row continues from it. */
static inline uint32_t rs_index_prefix(const uint8_t *buf, const rs_scan_rec *r)
{
    return 31 * rs_java_hash_continue(0, buf + r->pos + r->topic_off, (size_t)r->topic_len) +
           '#';
}

static inline int32_t rs_index_abs(uint32_t h)
{
    int32_t s = (int32_t)h;
    return s == INT32_MIN ? 0 : (s < 0 ? -s : s);
}

int rs_index_key_hash(const uint8_t *topic, size_t topic_len, const uint8_t *key,
                      size_t key_len, int32_t *hash)
{
    uint32_t h = 31 * rs_java_hash_continue(0, topic, topic_len) + '#';

    *hash = rs_index_abs(rs_java_hash_continue(h, key, key_len));
    return RS_OK;
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
        const uint8_t *uniq, *keys;
        size_t uniq_len, keys_len, need = 0, a;
        uint32_t prefix;

        if ((r->sys_flag & RS_TRANSACTION_TYPE_MASK) == RS_TRANSACTION_ROLLBACK_TYPE)
            continue;
        if (!rs_index_row_in(r, len))
            return RS_E_BOUNDS;
        rs_index_props(buf + r->pos + r->props_off, (size_t)r->props_len, &uniq, &uniq_len,
                       &keys, &keys_len, NULL);
        if (uniq)
            need++;
        for (a = 0; keys && a < keys_len; a++)      /* pieces: runs of non-space bytes */
            if (keys[a] != ' ' && (a == 0 || keys[a - 1] == ' '))
                need++;
        if (need == 0)
            continue;
        if (n + need > cap)
            break;
        prefix = rs_index_prefix(buf, r);
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

/* Where key_hash's slot lies in the file, as an offset: header + (keyHash % slot_num) * 4. */
static inline size_t rs_index_slot_pos(int32_t slot_num, int32_t key_hash)
{
    return RS_INDEX_HEADER_SIZE + (size_t)(key_hash % slot_num) * RS_INDEX_SLOT_SIZE;
}

/* One putKey after the geometry check, key_hash's slot at `slot_pos` (rs_index_slot_pos,
 * which a caller that prefetched the slot has at hand); returns the new indexCount or 0 when
 * full. */
static int32_t rs_index_put1(uint8_t *buf, int32_t slot_num, int32_t index_num,
                             int32_t key_hash, size_t slot_pos, int64_t phy_offset,
                             int64_t store_timestamp)
{
    int32_t count = rs_index_count(buf);
    int64_t begin_ts, diff;
    int32_t slot_value;
    uint8_t *slot, *entry;

    if (count >= index_num)
        return 0;
    slot = buf + slot_pos;
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
    return rs_index_put1(buf, slot_num, index_num, key_hash,
                         rs_index_slot_pos(slot_num, key_hash), phy_offset, store_timestamp);
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
        if (rs_index_put1(buf, slot_num, index_num, key_hashes[i],
                          rs_index_slot_pos(slot_num, key_hashes[i]), phy_offsets[i],
                          store_timestamps[i]) == 0)
            break;
    *count = (int64_t)i;
    return RS_OK;
}

/* Where one chain of rs_index_walk_chains stands between its steps. */
typedef struct {
    const uint8_t *entries;     /* the file's entry 0 */
    int64_t begin_ts;           /* the header's beginTimestamp */
    int32_t index_count;
    int32_t n;                  /* the entry the next step reads */
    int64_t h;                  /* hops so far, over all calls */
    int live;                   /* 0 once the chain stopped (its at says why) */
} rs_walk_state;

/* Start chain c: find its first entry (its slot's, for at == 0), or stop it. */
static void rs_walk_start(rs_index_chain *c, rs_walk_state *s, int32_t key_hash)
{
    int32_t n = c->at;

    s->live = 0;
    s->h = c->hops;
    if (c->at < 0 || c->cap <= 0)
        return;                 /* the walk ended in an earlier call, or no room */
    s->index_count = rs_index_count(c->buf);
    if (n == 0)
        n = rs_load_i32(c->buf + rs_index_slot_pos(c->slot_num, key_hash));
    /* n >= index_num: a corrupt header may claim more entries than the file holds. */
    c->at = -1;
    if (n <= 0 || n > s->index_count || n >= c->index_num || s->index_count <= 1)
        return;
    s->begin_ts = rs_load_i64(c->buf + RS_INDEX_POS_BEGIN_TIMESTAMP);
    s->entries = c->buf + RS_INDEX_HEADER_SIZE + (size_t)c->slot_num * RS_INDEX_SLOT_SIZE;
    s->n = n;
    s->live = 1;
}

/* One hop of chain c: judge entry s->n and move to its prevIndex, or stop the chain. */
static void rs_walk_step(rs_index_chain *c, rs_walk_state *s, int32_t key_hash, int64_t begin,
                         int64_t end)
{
    const uint8_t *e = s->entries + (size_t)s->n * RS_INDEX_ENTRY_SIZE;
    int32_t hash_read, prev;
    int64_t phy_read, diff, time_read;

    if (s->h >= c->index_num) {
        s->live = 0;            /* a corrupt chain that loops ends here */
        return;
    }
    hash_read = rs_load_i32(e + RS_INDEX_ENTRY_POS_KEY_HASH);
    phy_read = rs_load_i64(e + RS_INDEX_ENTRY_POS_PHY_OFFSET);
    diff = rs_load_i32(e + RS_INDEX_ENTRY_POS_TIME_DIFF);
    prev = rs_load_i32(e + RS_INDEX_ENTRY_POS_PREV_INDEX);
    if (diff < 0) {
        s->live = 0;
        return;
    }
    time_read = (int64_t)((uint64_t)s->begin_ts + (uint64_t)(diff * 1000));
    if (hash_read == key_hash && time_read >= begin && time_read <= end)
        c->out[c->count++] = phy_read;
    if (prev <= 0 || prev > s->index_count || prev >= c->index_num || prev == s->n ||
        time_read < begin) {
        s->live = 0;
        return;
    }
    s->n = prev;
    s->h++;
    if (c->count == c->cap) {
        /* Out of room with the chain going on: the next call starts at prev. */
        c->at = prev;
        s->live = 0;
    }
}

int rs_index_walk_chains(rs_index_chain *chains, size_t n, int32_t key_hash, int64_t begin,
                         int64_t end, int64_t want)
{
    rs_walk_state s[RS_INDEX_MAX_CHAINS];
    int64_t before;
    size_t i;
    int r, live;

    if (n > RS_INDEX_MAX_CHAINS || want < 1)
        return RS_E_ARG;
    for (i = 0; i < n; i++) {
        r = rs_index_geometry(chains[i].len, chains[i].slot_num, chains[i].index_num);
        if (r != RS_OK)
            return r;
        if (key_hash < 0 || chains[i].hops < 0)
            return RS_E_ARG;
    }
    /* Every chain's slot load starts before the first is needed. */
    for (i = 0; i < n; i++) {
        chains[i].count = 0;
        if (chains[i].at == 0 && chains[i].cap > 0)
            __builtin_prefetch(chains[i].buf + rs_index_slot_pos(chains[i].slot_num, key_hash));
    }
    for (i = 0; i < n; i++)
        rs_walk_start(&chains[i], &s[i], key_hash);
    do {
        /* A step: each live chain's entry load starts, then each is judged in turn. */
        for (i = 0; i < n; i++)
            if (s[i].live)
                __builtin_prefetch(s[i].entries + (size_t)s[i].n * RS_INDEX_ENTRY_SIZE);
        live = 0;
        before = 0;
        for (i = 0; i < n; i++) {
            if (s[i].live && before >= want) {
                chains[i].at = s[i].n;  /* the newer chains hold enough: resume here */
                s[i].live = 0;
            }
            if (s[i].live) {
                rs_walk_step(&chains[i], &s[i], key_hash, begin, end);
                live |= s[i].live;
            }
            before += chains[i].count;
        }
    } while (live);
    for (i = 0; i < n; i++)
        chains[i].hops = s[i].h;
    return RS_OK;
}

int rs_index_walk(const uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                  int32_t key_hash, int64_t begin, int64_t end, int32_t *at, int64_t *hops,
                  int64_t *out, int64_t cap, int64_t *count)
{
    rs_index_chain c;
    int r;

    c.buf = buf;
    c.len = len;
    c.slot_num = slot_num;
    c.index_num = index_num;
    c.at = *at;
    c.hops = *hops;
    c.out = out;
    c.cap = cap;
    *count = 0;
    r = rs_index_walk_chains(&c, 1, key_hash, begin, end, INT64_MAX);
    if (r != RS_OK)
        return r;
    *at = c.at;
    *hops = c.hops;
    *count = c.count;
    return RS_OK;
}

int rs_index_lookup(const uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                    int32_t key_hash, int64_t begin, int64_t end,
                    int64_t *out, int64_t cap, int64_t *count)
{
    int32_t at = 0;
    int64_t hops = 0;

    return rs_index_walk(buf, len, slot_num, index_num, key_hash, begin, end, &at, &hops, out,
                         cap, count);
}

int rs_index_has_key(const uint8_t *props, size_t props_len, const uint8_t *key,
                     size_t key_len)
{
    const uint8_t *uniq, *keys;
    size_t uniq_len, keys_len, a, b;

    if (key_len == 0)
        return 0;               /* an empty key is no KEYS piece, and UNIQ_KEY is never empty */
    rs_index_props(props, props_len, &uniq, &uniq_len, &keys, &keys_len, NULL);
    if (uniq && uniq_len == key_len && memcmp(uniq, key, key_len) == 0)
        return 1;
    for (a = 0; keys && a < keys_len; a = b + 1) {
        for (b = a; b < keys_len && keys[b] != ' '; b++)
            ;
        if (b - a == key_len && memcmp(keys + a, key, key_len) == 0)
            return 1;
    }
    return 0;
}

int rs_index_match_row(const uint8_t *buf, size_t len, int64_t pos, int64_t phy_offset,
                       const uint8_t *topic, size_t topic_len, const uint8_t *key,
                       size_t key_len, int64_t begin, int64_t end, rs_scan_rec *row,
                       int32_t *size)
{
    const uint8_t *rec;
    int r;

    *size = 0;
    if (pos < 0 || (uint64_t)pos > (uint64_t)len)
        return RS_E_BOUNDS;
    r = rs_msg_check(buf, len, pos, 0, row, size);
    if (r != RS_OK) {
        *size = 0;
        return 0;               /* a blank, torn or damaged record answers nothing */
    }
    rec = buf + pos;
    if (row->phy_offset != phy_offset || row->store_timestamp < begin ||
        row->store_timestamp > end ||
        (topic && ((size_t)row->topic_len != topic_len ||
                   memcmp(rec + row->topic_off, topic, topic_len) != 0)) ||
        (key && !rs_index_has_key(rec + row->props_off, (size_t)row->props_len, key,
                                  key_len))) {
        *size = 0;
        return 0;
    }
    return 1;
}

int rs_index_match(const uint8_t *buf, size_t len, int64_t pos, int64_t phy_offset,
                   const uint8_t *topic, size_t topic_len, const uint8_t *key, size_t key_len,
                   int64_t begin, int64_t end, int32_t *size)
{
    rs_scan_rec row;

    return rs_index_match_row(buf, len, pos, phy_offset, topic, topic_len, key, key_len, begin,
                              end, &row, size);
}

/* rs_index_dispatch's keys travel in chunks: a chunk's keys are found and hashed first, and
 * their slots prefetched, before any is put.  Put one by one as they are found, each put waits
 * for its slot's cache miss (the slot table is megabytes, hit at random); a chunk lets those
 * misses overlap.  64 keys: their slots are 64 lines, well inside L1. */
#define RS_INDEX_CHUNK 64

typedef struct {
    uint32_t hash;      /* abs'd index hash */
    uint32_t row;       /* index into rows */
    uint32_t key;       /* the key's number within its row */
    uint32_t last;      /* the row's last key */
    uint32_t slot;      /* hash % slot_num: found once, for the prefetch and the put */
} rs_index_key;

/* Append row i's keys numbered >= *from to ks[*n, RS_INDEX_CHUNK), prefetching their slots.
 * Returns 1 when the row is done, else 0 with *from = the first key left out. */
/* The last topic whose "topic#" hash rs_index_chunk_row computed: rows of one topic follow each
 * other (a batch put's, most passes' rows), and comparing the topic bytes costs less than
 * hashing them again. */
typedef struct rs_index_topic {
    const uint8_t *topic;       /* NULL: none yet */
    int32_t len;
    uint32_t prefix;
} rs_index_topic;

/* Whether a[0:n] == b[0:n]: the last row's topic against this row's, once per row, so two
 * overlapping word compares for the short names topics are rather than a memcmp call. */
static inline int rs_index_same(const uint8_t *a, const uint8_t *b, size_t n)
{
    uint64_t x, y, u, v;

    if (n < 8 || n > 16)
        return memcmp(a, b, n) == 0;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    memcpy(&u, a + n - 8, 8);
    memcpy(&v, b + n - 8, 8);
    return ((x ^ y) | (u ^ v)) == 0;
}

static int rs_index_chunk_row(const uint8_t *buf, const rs_scan_rec *r, uint32_t i,
                              const uint8_t *slots, int32_t slot_num, rs_index_key *ks,
                              size_t *n, size_t *from, rs_index_topic *last)
{
    const uint8_t *uniq, *keys, *topic;
    size_t uniq_len, keys_len, k = 0, a, first = *n;
    uint32_t prefix, h;
    uint64_t spaces;
    int masked = rs_index_props(buf + r->pos + r->props_off, (size_t)r->props_len, &uniq,
                                &uniq_len, &keys, &keys_len, &spaces);

    if (!uniq && !keys)
        return 1;
    topic = buf + r->pos + r->topic_off;
    if (last->topic != NULL && last->len == r->topic_len &&
        rs_index_same(last->topic, topic, (size_t)r->topic_len)) {
        prefix = last->prefix;
    } else {
        prefix = rs_index_prefix(buf, r);
        last->topic = topic;
        last->len = r->topic_len;
        last->prefix = prefix;
    }
    for (a = 0; uniq || (keys && a < keys_len);) {
        const uint8_t *key;
        size_t b, klen;

        if (uniq) {             /* UNIQ_KEY first, then the KEYS pieces */
            key = uniq;
            klen = uniq_len;
            uniq = NULL;
        } else {
            if (masked) {       /* a < keys_len <= 59: the shift is defined */
                uint64_t m = spaces >> a;

                b = m ? a + (size_t)__builtin_ctzll(m) : keys_len;
            } else {
                const uint8_t *sp = memchr(keys + a, ' ', keys_len - a);

                b = sp ? (size_t)(sp - keys) : keys_len;
            }
            key = keys + a;
            klen = b - a;
            a = b + 1;
            if (klen == 0)
                continue;
        }
        if (k++ < *from)
            continue;
        if (*n == RS_INDEX_CHUNK) {
            *from = k - 1;
            return 0;
        }
        h = (uint32_t)rs_index_abs(rs_java_hash_continue(prefix, key, klen));
        ks[*n].slot = h % (uint32_t)slot_num;
        __builtin_prefetch(slots + (size_t)ks[*n].slot * RS_INDEX_SLOT_SIZE, 1);
        ks[*n].hash = h;
        ks[*n].row = i;
        ks[*n].key = (uint32_t)(k - 1);
        ks[*n].last = 0;
        (*n)++;
    }
    if (*n > first)
        ks[*n - 1].last = 1;
    return 1;
}

int rs_index_dispatch(uint8_t *ibuf, size_t ilen, int32_t slot_num, int32_t index_num,
                      int64_t limit, const uint8_t *buf, size_t len, const rs_scan_rec *rows,
                      size_t nrows, size_t *row, size_t *skip, int32_t *stop)
{
    int r = rs_index_geometry(ilen, slot_num, index_num);
    size_t table = RS_INDEX_HEADER_SIZE + (size_t)slot_num * RS_INDEX_SLOT_SIZE;
    size_t i, j, n, lim, pi, pk;
    size_t full_row = *row, full_key = *skip;   /* where a full file rolls: after the last put */
    rs_index_key ks[RS_INDEX_CHUNK];
    rs_index_topic last = {NULL, 0, 0};

    *stop = RS_INDEX_STOP_NONE;
    if (r != RS_OK)
        return r;
    if (*row > nrows || nrows > UINT32_MAX || limit < 0)
        return RS_E_ARG;
    lim = (uint64_t)limit < (uint64_t)ilen ? (size_t)limit : ilen;
    /* Every row is checked before the first put, so bad rows leave the file untouched. */
    for (i = *row; i < nrows; i++)
        if ((rows[i].sys_flag & RS_TRANSACTION_TYPE_MASK) != RS_TRANSACTION_ROLLBACK_TYPE &&
            !rs_index_row_in(&rows[i], len))
            return RS_E_BOUNDS;
    pi = *row;
    pk = *skip;
    for (;;) {
        /* Find the next chunk of keys, from key pk of row pi on. */
        for (n = 0; pi < nrows && n < RS_INDEX_CHUNK; pi++, pk = 0) {
            const rs_scan_rec *rw = &rows[pi];

            if ((rw->sys_flag & RS_TRANSACTION_TYPE_MASK) == RS_TRANSACTION_ROLLBACK_TYPE)
                continue;
            if (!rs_index_chunk_row(buf, rw, (uint32_t)pi, ibuf + RS_INDEX_HEADER_SIZE,
                                    slot_num, ks, &n, &pk, &last))
                break;
        }
        if (n == 0)
            break;
        for (j = 0; j < n; j++) {
            int32_t count = rs_index_count(ibuf);

            /* getAndCreateLastIndexFile runs for every record: a full file rolls at the next
             * key of the record that filled it, or else at the record after, whatever it
             * holds (the numpy path rolls at the same rows). */
            if (count >= index_num) {
                *row = full_row;
                *skip = full_key;
                *stop = RS_INDEX_STOP_FULL;
                return RS_OK;
            }
            if (table + ((size_t)count + 1) * RS_INDEX_ENTRY_SIZE > lim) {
                *row = ks[j].row;
                *skip = ks[j].key;
                *stop = RS_INDEX_STOP_ROOM;
                return RS_OK;
            }
            rs_index_put1(ibuf, slot_num, index_num, (int32_t)ks[j].hash,
                          RS_INDEX_HEADER_SIZE + (size_t)ks[j].slot * RS_INDEX_SLOT_SIZE,
                          rows[ks[j].row].phy_offset, rows[ks[j].row].store_timestamp);
            full_row = ks[j].last ? ks[j].row + 1 : ks[j].row;
            full_key = ks[j].last ? 0 : ks[j].key + 1;
        }
    }
    if (full_row < nrows && rs_index_count(ibuf) >= index_num) {
        *row = full_row;
        *skip = full_key;
        *stop = RS_INDEX_STOP_FULL;
        return RS_OK;
    }
    *row = nrows;
    *skip = 0;
    return RS_OK;
}
