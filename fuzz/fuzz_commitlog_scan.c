/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_commitlog_scan - a CommitLog region through rs_commitlog_scan (recoverNormally's loop):
 * many records, blanks, never-written space and damage in one buffer.  The first bytes pick
 * start, end and the row capacity, so a scan window inside the buffer and a tiny output array are
 * exercised.  Invariants: rows are contiguous from start, stop_pos = start + their sizes, every
 * row lies inside [start, end), and the scan never writes past cap rows (ASan watches `out`).
 */
#include "fuzz_common.h"
#include "rs_commitlog.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t start = (int64_t)rs_fuzz_take(&data, &size, 1) % 16;
    int64_t cut = (int64_t)rs_fuzz_take(&data, &size, 1) % 16;
    int64_t cap = (int64_t)rs_fuzz_take(&data, &size, 1) % 9;   /* 0..8 rows */
    int check_crc = (int)(rs_fuzz_take(&data, &size, 1) & 1);
    uint8_t *buf = rs_fuzz_dup(data, size);
    rs_scan_rec *out = malloc(sizeof(rs_scan_rec) * (size_t)(cap ? cap : 1));
    int64_t end = (int64_t)size - cut, count = -1, stop_pos = -1, p, i;
    int32_t reason = -1, stop_size = -1;
    int r;

    if (!out)
        abort();
    r = rs_commitlog_scan(buf, size, start, end, check_crc, out, cap, &count, &stop_pos, &reason,
                          &stop_size);
    if (end < 0 || start > end) {
        RS_FUZZ_CHECK(r == RS_E_BOUNDS);
    } else {
        RS_FUZZ_CHECK(r == RS_OK && count >= 0 && count <= cap);
        RS_FUZZ_CHECK(reason >= RS_SCAN_END && reason <= RS_SCAN_TOPIC);
        for (i = 0, p = start; i < count; i++) {
            RS_FUZZ_CHECK(out[i].pos == p && out[i].size >= RS_MSG_FIXED_V1_IPV4);
            p += out[i].size;
            RS_FUZZ_CHECK(p <= end);
        }
        RS_FUZZ_CHECK(stop_pos == p);
        RS_FUZZ_CHECK(reason == RS_SCAN_BLANK || reason == RS_SCAN_MISMATCH || stop_size == 0);
    }
    free(out);
    free(buf);
    return 0;
}
