/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_index_keys - rs_index_keys over the rows rs_commitlog_scan found in a damaged CommitLog
 * region (the reput path), and over raw bytes taken as rows (hostile offsets and lengths).
 * Invariants: scan rows always succeed; keys come out in row order, never more than cap, each
 * hash is >= 0; rows whose offsets leave the buffer give RS_E_BOUNDS, never a wild read.
 * rs_index_dispatch over the same rows, into 4-entry files rolled when full and a reserved
 * limit grown one entry at a time, puts exactly the hashes rs_index_keys gives with room for
 * all, in order; or gives the same RS_E_BOUNDS and writes nothing.
 */
#include "fuzz_common.h"
#include "rs_commitlog.h"
#include "rs_index.h"

#define SLOTS 5
#define ENTRIES 4
#define FILE_SIZE (RS_INDEX_HEADER_SIZE + SLOTS * RS_INDEX_SLOT_SIZE + ENTRIES * RS_INDEX_ENTRY_SIZE)

static void check_dispatch(const uint8_t *buf, size_t size, const rs_scan_rec *rows,
                           size_t nrows)
{
    size_t cap = nrows * (size + 1) + 1, count = 0, done = 0, put = 0, row = 0, skip = 0, k;
    int32_t *hashes = malloc(cap * sizeof(int32_t)), *key_rows = malloc(cap * sizeof(int32_t));
    uint8_t file[FILE_SIZE];
    int64_t limit = RS_INDEX_HEADER_SIZE + SLOTS * RS_INDEX_SLOT_SIZE + 2 * RS_INDEX_ENTRY_SIZE;
    int32_t stop = RS_INDEX_STOP_NONE;
    int r = rs_index_keys(buf, size, rows, nrows, hashes, key_rows, cap, &count, &done);

    memset(file, 0, sizeof(file));
    for (;;) {
        int rd = rs_index_dispatch(file, sizeof(file), SLOTS, ENTRIES, limit, buf, size, rows,
                                   nrows, &row, &skip, &stop);
        int32_t n = rs_load_i32(file + RS_INDEX_POS_INDEX_COUNT);

        if (r != RS_OK) {
            uint8_t zero[FILE_SIZE];

            memset(zero, 0, sizeof(zero));
            RS_FUZZ_CHECK(rd == r && memcmp(file, zero, sizeof(file)) == 0);
            break;
        }
        RS_FUZZ_CHECK(rd == RS_OK && row <= nrows);
        if (stop == RS_INDEX_STOP_ROOM) {
            RS_FUZZ_CHECK(limit < (int64_t)sizeof(file));
            limit += RS_INDEX_ENTRY_SIZE;
            continue;
        }
        /* A finished file's entries are the next keys rs_index_keys gave. */
        for (k = 1; (int32_t)k < n; k++) {
            const uint8_t *e = file + RS_INDEX_HEADER_SIZE + SLOTS * RS_INDEX_SLOT_SIZE +
                               k * RS_INDEX_ENTRY_SIZE;
            RS_FUZZ_CHECK(put < count && rs_load_i32(e) == hashes[put] &&
                          rs_load_i64(e + RS_INDEX_ENTRY_POS_PHY_OFFSET) ==
                          rows[key_rows[put]].phy_offset);
            put++;
        }
        if (stop == RS_INDEX_STOP_NONE)
            break;
        RS_FUZZ_CHECK(stop == RS_INDEX_STOP_FULL && n == ENTRIES && row < nrows);
        memset(file, 0, sizeof(file));              /* roll: a fresh file */
    }
    if (r == RS_OK)
        RS_FUZZ_CHECK(put == count && done == nrows);
    free(hashes);
    free(key_rows);
}

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
    check_dispatch(buf, size, rows, nrows);
    free(buf);
    return 0;
}
