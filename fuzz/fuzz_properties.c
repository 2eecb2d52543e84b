/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_properties - the PROPERTIES string parser (MessageDecoder#string2messageProperties as
 * rs_msg_check's tagsCode uses it) and the topic bytes, wrapped in an otherwise valid record so
 * every input reaches the parser.  Input: 1 control byte (v2, topic length), then topic +
 * properties bytes.  Invariants: the record is refused as RS_SCAN_TOPIC exactly when its topic
 * breaks a put's rule (empty, ".", "..", a '/' or NUL, or not UTF-8); otherwise it is accepted,
 * HAS_TAGS agrees with a direct search for a well-formed TAGS segment, and tags_code is 0
 * without one.
 */
#include "fuzz_common.h"
#include "rs_crc32.h"
#include "rs_msg.h"

/* Independent statement of the rule: some \x02-separated segment is "TAGS\x01<1+ bytes>". */
static int has_tags(const uint8_t *p, size_t n)
{
    size_t a = 0, b;
    for (;;) {
        for (b = a; b < n && p[b] != 0x02; b++)
            ;
        if (b - a >= 6 && memcmp(p + a, "TAGS\x01", 5) == 0)
            return 1;
        if (b >= n)
            return 0;
        a = b + 1;
    }
}

/* Independent statement of the topic rule: decode each code point and check its range. */
static int topic_ok(const uint8_t *p, size_t n)
{
    size_t i = 0;
    if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
        return 0;
    while (i < n) {
        uint32_t cp, min;
        size_t len, k;
        if (p[i] < 0x80) {
            if (p[i] == 0 || p[i] == '/')
                return 0;
            i++;
            continue;
        }
        if ((p[i] & 0xE0) == 0xC0) { len = 2; cp = p[i] & 0x1F; min = 0x80; }
        else if ((p[i] & 0xF0) == 0xE0) { len = 3; cp = p[i] & 0x0F; min = 0x800; }
        else if ((p[i] & 0xF8) == 0xF0) { len = 4; cp = p[i] & 0x07; min = 0x10000; }
        else return 0;
        if (i + len > n)
            return 0;
        for (k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t host[8] = {127, 0, 0, 1, 0, 0, 0x27, 0x10};
    uint8_t ctl = (uint8_t)rs_fuzz_take(&data, &size, 1);
    int v2 = ctl & 1;
    size_t topic_len = (size_t)(ctl >> 1) % 32, props_len;
    int64_t tags_code = 0;
    uint8_t *props, *rec;
    rs_scan_rec row;
    int32_t rec_size;
    int n, r;

    if (topic_len > size)
        topic_len = size;
    props_len = size - topic_len;
    if (props_len > RS_MAX_PROPERTIES_LENGTH)
        props_len = RS_MAX_PROPERTIES_LENGTH;
    n = rs_msg_size(0, 3, (int64_t)topic_len, (int64_t)props_len, v2);
    RS_FUZZ_CHECK(n > 0);
    rec = malloc((size_t)n);
    props = rs_fuzz_dup(data + topic_len, props_len);
    if (!rec)
        abort();
    r = rs_msg_encode(rec, (size_t)n, 0, data, topic_len, (const uint8_t *)"abc", 3, props,
                      props_len, 1, 0, 7, 0, 0, 1, host, 8, 2, host, 8, 0, 0, v2);
    RS_FUZZ_CHECK(r == n);
    r = rs_msg_check(rec, (size_t)n, 0, 1, &row, &rec_size);
    if (!topic_ok(data, topic_len)) {
        RS_FUZZ_CHECK(r == RS_SCAN_TOPIC);
        goto done;
    }
    RS_FUZZ_CHECK(r == RS_OK && rec_size == n);
    RS_FUZZ_CHECK(!!(row.info & RS_SCAN_INFO_HAS_TAGS) == has_tags(props, props_len));
    if (!(row.info & RS_SCAN_INFO_HAS_TAGS))
        RS_FUZZ_CHECK(row.tags_code == 0);
    (void)tags_code;
done:
    free(props);
    free(rec);
    return 0;
}
