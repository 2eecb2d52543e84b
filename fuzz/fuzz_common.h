/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_common.h - helpers shared by the libFuzzer harnesses in fuzz/.
 *
 * Harnesses call csrc/ directly (no Python), built by scripts/fuzz with
 * clang -fsanitize=fuzzer,address,undefined.  Every input is copied into a heap block of exactly
 * its length, so ASan's redzone sits right after the last byte and a one-byte overread trips it.
 * RS_FUZZ_CHECK aborts on a broken invariant: libFuzzer then saves the input as a crash.
 */
#ifndef RS_FUZZ_COMMON_H
#define RS_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RS_FUZZ_CHECK(cond)                                                          \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                  \
        }                                                                             \
    } while (0)

/* An exact-size heap copy (malloc(0) may return NULL: use 1 byte and pass len 0). */
static inline uint8_t *rs_fuzz_dup(const uint8_t *data, size_t size)
{
    uint8_t *p = malloc(size ? size : 1);
    if (!p)
        abort();
    if (size)
        memcpy(p, data, size);
    return p;
}

/* Take n little-endian bytes from the front of the input (zero when it runs out). */
static inline uint64_t rs_fuzz_take(const uint8_t **data, size_t *size, size_t n)
{
    uint64_t v = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        if (*size) {
            v |= (uint64_t)(**data) << (8 * i);
            (*data)++;
            (*size)--;
        }
    }
    return v;
}

#endif /* RS_FUZZ_COMMON_H */
