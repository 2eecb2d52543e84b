/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_msg_check - one CommitLog record through rs_msg_check (CommitLog#checkMessageAndReturnSize):
 * v1 and v2 magic, IPv4/IPv6 sysflag bits, every length field (TOTALSIZE, BODY, TOPIC, PROPERTIES).
 * The first input byte picks the start position and CRC checking, so records not at offset 0 and
 * a pos at or past the end are covered too.  Invariants: a good record's fields lie inside it;
 * rs_index_match (a key query's record check) answers only for a record rs_msg_check passes
 * when it skips the body CRC (key queries do not check it).
 */
#include "fuzz_common.h"
#include "rs_index.h"
#include "rs_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t ctl = (uint8_t)rs_fuzz_take(&data, &size, 1);
    int64_t pos = ctl & 0x0F;            /* 0..15: odd starts, and pos > len for tiny inputs */
    int check_crc = (ctl >> 4) & 1;
    uint8_t *buf = rs_fuzz_dup(data, size);
    rs_scan_rec row;
    int32_t rec_size = -1, match_size = -1;
    int64_t phy;
    int r, m;

    memset(&row, 0xA5, sizeof row);
    r = rs_msg_check(buf, size, pos, check_crc, &row, &rec_size);
    if ((uint64_t)pos > size) {
        RS_FUZZ_CHECK(r == RS_E_BOUNDS);
    } else if (r == RS_OK) {
        RS_FUZZ_CHECK(rec_size >= RS_MSG_FIXED_V1_IPV4 && (uint64_t)pos + rec_size <= size);
        RS_FUZZ_CHECK(row.size == rec_size && row.pos == pos);
        RS_FUZZ_CHECK(row.body_off >= 0 && row.body_len >= 0 &&
                      (int64_t)row.body_off + row.body_len <= rec_size);
        RS_FUZZ_CHECK(row.topic_off > row.body_off && row.topic_len >= 0 &&
                      (int64_t)row.topic_off + row.topic_len + 2 == row.props_off);
        RS_FUZZ_CHECK(row.props_len >= 0 && (int64_t)row.props_off + row.props_len == rec_size);
        RS_FUZZ_CHECK(!(row.info & RS_SCAN_INFO_V2) || row.topic_off == row.body_off + row.body_len + 2);
        RS_FUZZ_CHECK((row.info & RS_SCAN_INFO_HAS_TAGS) || row.tags_code == 0);
    } else {
        RS_FUZZ_CHECK(r >= RS_SCAN_BLANK && r <= RS_SCAN_TOPIC);
    }
    /* A key query checks the record without its body CRC, as the broker's lookups do: compare
     * it with the check that skips the CRC too. */
    if (check_crc && (uint64_t)pos <= size) {
        r = rs_msg_check(buf, size, pos, 0, &row, &rec_size);
    }
    /* The offset the record states, so that a good record can match: key "a", any topic. */
    phy = r == RS_OK ? row.phy_offset : 0;
    m = rs_index_match(buf, size, pos, phy, NULL, 0, (const uint8_t *)"a", 1, INT64_MIN,
                       INT64_MAX, &match_size);
    if ((uint64_t)pos > size)
        RS_FUZZ_CHECK(m == RS_E_BOUNDS && match_size == 0);
    else if (m == 1)
        RS_FUZZ_CHECK(r == RS_OK && match_size == rec_size);
    else
        RS_FUZZ_CHECK(m == 0 && match_size == 0);
    free(buf);
    return 0;
}
