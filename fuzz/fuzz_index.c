/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_index - an IndexFile image through rs_index_lookup (IndexFile#selectPhyOffset) and
 * rs_index_put (IndexFile#putKey): hostile headers (indexCount, beginTimestamp), slot values and
 * prevIndex chains that loop, point at themselves or past index_num.  Input: slot_num (1..64),
 * index_num (1..64), key hash, lookup window, result cap, then the file bytes (padded with zeros
 * or cut to the geometry; a short tail is also tried as-is for RS_E_BOUNDS).
 * Invariants: count <= cap; lookups terminate (libFuzzer's -timeout catches a loop); a walk
 * resumed one result at a time (rs_index_walk) finds what one lookup finds; two files' chains
 * walked together (rs_index_walk_chains) each give a prefix of their own walk, which resuming
 * completes; a put on a full file writes nothing; a put never touches bytes outside the
 * geometry (ASan: exact size).
 */
#include "fuzz_common.h"
#include "rs_index.h"

/* buf's whole walk for key_hash, from where at and hops stand, appended to all[*n, WALK_MAX):
 * a walk hops at most index_num <= 64 times, a result a hop at most, so it always ends. */
#define WALK_MAX 65
static void walk_rest(const uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                      int32_t key_hash, int64_t begin, int64_t end, int32_t at, int64_t hops,
                      int64_t *all, int64_t *n)
{
    int64_t got = 0;
    int r = rs_index_walk(buf, len, slot_num, index_num, key_hash, begin, end, &at, &hops,
                          all + *n, WALK_MAX - *n, &got);

    RS_FUZZ_CHECK(r == RS_OK && at < 0 && hops <= index_num);
    *n += got;
}

/* Two hostile files' chains walked together (rs_index_walk_chains): each chain's offsets are
 * a prefix of its file's own walk, resuming it gives the rest, and only a chain after ones
 * holding `want` offsets stops before its cap. */
static void check_chains(const uint8_t *file, size_t need, int32_t slot_num, int32_t index_num,
                         int32_t key_hash, int64_t begin, int64_t end, int64_t cap)
{
    uint8_t *files[2] = {rs_fuzz_dup(file, need), rs_fuzz_dup(file, need)};
    int64_t outs[2][8], whole[WALK_MAX], again[WALK_MAX], held = 0;
    int64_t want = (key_hash >> 4) % 8 + 1;
    rs_index_chain ch[2];
    size_t i, b;
    int r;

    /* The second file: the same bytes (its chain runs beside the first's, so stopping for
     * `want` is reached), or for odd hashes bytes of other values. */
    for (b = 0; (key_hash & 1) && b < need; b++)
        files[1][b] ^= (uint8_t)(0x5A + b);
    for (i = 0; i < 2; i++)
        ch[i] = (rs_index_chain){files[i], need, slot_num, index_num, 0, 0, outs[i],
                                 i ? 8 : (cap ? cap : 1), -1};
    r = rs_index_walk_chains(ch, 2, key_hash, begin, end, want);
    RS_FUZZ_CHECK(r == RS_OK);
    for (i = 0; i < 2; i++) {
        int64_t n = 0, m;

        RS_FUZZ_CHECK(ch[i].count >= 0 && ch[i].count <= ch[i].cap && ch[i].hops <= index_num);
        walk_rest(files[i], need, slot_num, index_num, key_hash, begin, end, 0, 0, whole, &n);
        RS_FUZZ_CHECK(ch[i].count <= n &&
                      memcmp(ch[i].out, whole, (size_t)ch[i].count * sizeof(int64_t)) == 0);
        memcpy(again, ch[i].out, (size_t)ch[i].count * sizeof(int64_t));
        m = ch[i].count;
        walk_rest(files[i], need, slot_num, index_num, key_hash, begin, end, ch[i].at,
                  ch[i].hops, again, &m);
        RS_FUZZ_CHECK(m == n && memcmp(again, whole, (size_t)n * sizeof(int64_t)) == 0);
        /* Stopped with room left: only for want, once the chains before hold enough. */
        if (ch[i].at >= 0 && ch[i].count < ch[i].cap)
            RS_FUZZ_CHECK(held >= want);
        held += ch[i].count;
    }
    free(files[0]);
    free(files[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int32_t slot_num = (int32_t)(rs_fuzz_take(&data, &size, 1) % 64) + 1;
    int32_t index_num = (int32_t)(rs_fuzz_take(&data, &size, 1) % 64) + 1;
    int32_t key_hash = (int32_t)(rs_fuzz_take(&data, &size, 4) & 0x7FFFFFFF);
    int64_t begin = (int64_t)rs_fuzz_take(&data, &size, 8);
    int64_t end = (int64_t)rs_fuzz_take(&data, &size, 8);
    int64_t cap = (int64_t)(rs_fuzz_take(&data, &size, 1) % 8);
    size_t need = RS_INDEX_HEADER_SIZE + (size_t)slot_num * 4 + (size_t)index_num * 20;
    uint8_t *file = calloc(need, 1), *before;
    int64_t out[8], walked[8], one = 0, n1 = 0, hops = 0, k = 0, count = -1;
    int32_t at = 0;
    int r;

    if (!file)
        abort();
    memcpy(file, data, size < need ? size : need);
    if (size < need) {
        /* The kernels must refuse a buffer shorter than the geometry, not read past it. */
        uint8_t *short_buf = rs_fuzz_dup(data, size);
        r = rs_index_lookup(short_buf, size, slot_num, index_num, key_hash, begin, end, out, cap,
                            &count);
        RS_FUZZ_CHECK(r == RS_E_BOUNDS && count == 0);
        free(short_buf);
    }
    r = rs_index_lookup(file, need, slot_num, index_num, key_hash, begin, end, out, cap, &count);
    RS_FUZZ_CHECK(r == RS_OK && count >= 0 && count <= cap);
    while (k < cap && at >= 0) {
        r = rs_index_walk(file, need, slot_num, index_num, key_hash, begin, end, &at, &hops,
                          &one, 1, &n1);
        RS_FUZZ_CHECK(r == RS_OK && n1 <= 1 && hops <= index_num && (n1 == 1 || at < 0));
        if (n1)
            walked[k++] = one;
    }
    RS_FUZZ_CHECK(k == count && memcmp(walked, out, (size_t)k * sizeof(int64_t)) == 0);
    check_chains(file, need, slot_num, index_num, key_hash, begin, end, cap);

    before = rs_fuzz_dup(file, need);
    r = rs_index_put(file, need, slot_num, index_num, key_hash, begin, end);
    RS_FUZZ_CHECK(r == 0 || (r >= 2 && r <= index_num));
    if (r == 0)
        RS_FUZZ_CHECK(memcmp(before, file, need) == 0);
    /* After a put the key is findable over the widest window, unless the file was full or the
     * hostile header makes the entry's time unreadable (negative timeDiff cannot happen: 0..MAX). */
    r = rs_index_lookup(file, need, slot_num, index_num, key_hash, INT64_MIN, INT64_MAX, out, 8,
                        &count);
    RS_FUZZ_CHECK(r == RS_OK && count <= 8);
    free(before);
    free(file);
    return 0;
}
