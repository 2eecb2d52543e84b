/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_index - an IndexFile image through rs_index_lookup (IndexFile#selectPhyOffset) and
 * rs_index_put (IndexFile#putKey): hostile headers (indexCount, beginTimestamp), slot values and
 * prevIndex chains that loop, point at themselves or past index_num.  Input: slot_num (1..64),
 * index_num (1..64), key hash, lookup window, result cap, then the file bytes (padded with zeros
 * or cut to the geometry; a short tail is also tried as-is for RS_E_BOUNDS).
 * Invariants: count <= cap; lookups terminate (libFuzzer's -timeout catches a loop); a walk
 * resumed one result at a time (rs_index_walk) finds what one lookup finds; a put on a full file
 * writes nothing; a put never touches bytes outside the geometry (ASan: exact size).
 */
#include "fuzz_common.h"
#include "rs_index.h"

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
