/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_index_keys - rs_index_keys over the rows rs_commitlog_scan found in a damaged CommitLog
 * region (the reput path), and over raw bytes taken as rows (hostile offsets and lengths).
 * Invariants: scan rows always succeed; keys come out in row order, never more than cap, each
 * hash is >= 0; rows whose offsets leave the buffer give RS_E_BOUNDS, never a wild read.
 */
#include "fuzz_common.h"
#include "rs_commitlog.h"
#include "rs_index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t cap = (size_t)rs_fuzz_take(&data, &size, 1) % 17;     /* 0..16 keys */
    int raw_rows = (int)(rs_fuzz_take(&data, &size, 1) & 1);
    uint8_t *buf = rs_fuzz_dup(data, size);
    rs_scan_rec rows[8];
    int32_t hashes[16], key_rows[16];
    size_t nrows = 0, count = 0, done = 0, k;
    int r;

    if (raw_rows) {
        nrows = size / sizeof(rs_scan_rec);
        if (nrows > 8)
            nrows = 8;
        memcpy(rows, buf, nrows * sizeof(rs_scan_rec));
    } else {
        int64_t n = 0, stop = 0;
        int32_t reason = 0, stop_size = 0;
        r = rs_commitlog_scan(buf, size, 0, (int64_t)size, 0, rows, 8, &n, &stop, &reason,
                              &stop_size);
        RS_FUZZ_CHECK(r == RS_OK);
        nrows = (size_t)n;
    }
    r = rs_index_keys(buf, size, rows, nrows, hashes, key_rows, cap, &count, &done);
    if (r == RS_OK) {
        RS_FUZZ_CHECK(count <= cap && done <= nrows);
        for (k = 0; k < count; k++) {
            RS_FUZZ_CHECK(hashes[k] >= 0 && key_rows[k] >= 0 && (size_t)key_rows[k] < done + 1);
            RS_FUZZ_CHECK(k == 0 || key_rows[k] >= key_rows[k - 1]);
        }
    } else {
        RS_FUZZ_CHECK(raw_rows && r == RS_E_BOUNDS);
    }
    free(buf);
    return 0;
}
