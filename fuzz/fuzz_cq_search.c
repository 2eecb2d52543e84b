/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_cq_search - ConsumeQueue units through rs_cq_search (a binary search over a window of
 * 20-byte units, ragged tail ignored) and rs_cq_encode_batch round trips.  Input: 8-byte key,
 * 1 byte start offset, then unit bytes.  Invariants: the index is within [0, units]; on sorted
 * units it is the lower bound; re-encoding the decoded units gives the same bytes.
 */
#include "fuzz_common.h"
#include "rs_cq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t key = (int64_t)rs_fuzz_take(&data, &size, 8);
    int64_t start = (int64_t)(rs_fuzz_take(&data, &size, 1) % 24);
    uint8_t *buf = rs_fuzz_dup(data, size);
    int64_t index = -1, units, i, nbytes = 0;
    int sorted = 1, r;

    r = rs_cq_search(buf, size, start, (int64_t)size, key, &index);
    if ((uint64_t)start > size) {
        RS_FUZZ_CHECK(r == RS_E_BOUNDS);
        free(buf);
        return 0;
    }
    RS_FUZZ_CHECK(r == RS_OK);
    units = ((int64_t)size - start) / RS_CQ_STORE_UNIT_SIZE;
    RS_FUZZ_CHECK(index >= 0 && index <= units);
    for (i = 1; i < units; i++)
        if (rs_load_i64(buf + start + (i - 1) * 20) > rs_load_i64(buf + start + i * 20))
            sorted = 0;
    if (sorted) {
        RS_FUZZ_CHECK(index == units || rs_load_i64(buf + start + index * 20) >= key);
        RS_FUZZ_CHECK(index == 0 || rs_load_i64(buf + start + (index - 1) * 20) < key);
    }
    if (units > 0) {
        int64_t *off = malloc(sizeof(int64_t) * (size_t)units);
        int32_t *sz = malloc(sizeof(int32_t) * (size_t)units);
        int64_t *tag = malloc(sizeof(int64_t) * (size_t)units);
        uint8_t *out = malloc((size_t)units * 20);
        if (!off || !sz || !tag || !out)
            abort();
        for (i = 0; i < units; i++) {
            off[i] = rs_load_i64(buf + start + i * 20);
            sz[i] = rs_load_i32(buf + start + i * 20 + 8);
            tag[i] = rs_load_i64(buf + start + i * 20 + 12);
        }
        r = rs_cq_encode_batch(out, (size_t)units * 20, 0, off, sz, tag, (size_t)units, &nbytes);
        RS_FUZZ_CHECK(r == RS_OK && nbytes == units * 20);
        RS_FUZZ_CHECK(memcmp(out, buf + start, (size_t)nbytes) == 0);
        /* One unit short of room: nothing may be written past the end. */
        r = rs_cq_encode_batch(out, (size_t)units * 20 - 1, 0, off, sz, tag, (size_t)units, &nbytes);
        RS_FUZZ_CHECK(r == RS_E_BOUNDS);
        free(off); free(sz); free(tag); free(out);
    }
    free(buf);
    return 0;
}
