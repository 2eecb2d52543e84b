/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_cq.c - ConsumeQueue unit encode and search.
 */
#include "rs_cq.h"

static inline void rs_cq_put(uint8_t *p, int64_t offset, int32_t size, int64_t tags_code)
{
    rs_store_be64(p, (uint64_t)offset);
    rs_store_be32(p + 8, (uint32_t)size);
    rs_store_be64(p + 12, (uint64_t)tags_code);
}

int rs_cq_encode(uint8_t *out, size_t out_len, int64_t pos,
                 int64_t offset, int32_t size, int64_t tags_code)
{
    if (!rs_in_bounds(pos, RS_CQ_STORE_UNIT_SIZE, out_len))
        return RS_E_BOUNDS;
    rs_cq_put(out + pos, offset, size, tags_code);
    return RS_CQ_STORE_UNIT_SIZE;
}

int rs_cq_encode_batch(uint8_t *out, size_t out_len, int64_t pos,
                       const int64_t *offsets, const int32_t *sizes, const int64_t *tags_codes,
                       size_t n, int64_t *nbytes)
{
    size_t i;
    uint8_t *p;

    *nbytes = 0;
    if (n > (SIZE_MAX / RS_CQ_STORE_UNIT_SIZE) ||
        !rs_in_bounds(pos, (uint64_t)n * RS_CQ_STORE_UNIT_SIZE, out_len))
        return RS_E_BOUNDS;
    p = out + pos;
    for (i = 0; i < n; i++, p += RS_CQ_STORE_UNIT_SIZE)
        rs_cq_put(p, offsets[i], sizes[i], tags_codes[i]);
    *nbytes = (int64_t)(n * RS_CQ_STORE_UNIT_SIZE);
    return RS_OK;
}

int rs_cq_search(const uint8_t *buf, size_t len, int64_t start, int64_t end,
                 int64_t phy_offset, int64_t *index)
{
    const uint8_t *units;
    int64_t lo = 0, hi;

    *index = 0;
    if (start < 0 || end < 0 || (uint64_t)end > (uint64_t)len || start > end)
        return RS_E_BOUNDS;
    units = buf + start;
    hi = (end - start) / RS_CQ_STORE_UNIT_SIZE;
    /* numpy's binsearch<side::left>: mid = lo + ((hi - lo) >> 1), go right while unit < key. */
    while (lo < hi) {
        int64_t mid = lo + ((hi - lo) >> 1);
        if (rs_load_i64(units + mid * RS_CQ_STORE_UNIT_SIZE) < phy_offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    assert(lo >= 0 && lo <= (end - start) / RS_CQ_STORE_UNIT_SIZE);
    *index = lo;
    return RS_OK;
}
