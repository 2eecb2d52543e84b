/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_crc32.c - CRC-32 (slice-by-8 tables, x86-64 PCLMULQDQ folding, the ARMv8 CRC32
 * instructions) and Java String.hashCode.
 */
#include <string.h>

#include "rs_crc32.h"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define RS_CRC32_PCLMUL 1
#include <immintrin.h>
#else
#define RS_CRC32_PCLMUL 0
#endif

/* ARMv8's optional CRC32 extension computes this very CRC (the IEEE polynomial, reflected, as
 * zlib's): CRC32X folds 8 bytes per instruction. Probed at run time from the kernel's
 * AT_HWCAP, since aarch64 wheels are built for every ARMv8 CPU (as LevelDB's
 * CanAccelerateCRC32C does). Little-endian only: CRC32X takes its 8 bytes in memory order. */
#if defined(__aarch64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && \
    defined(__ORDER_LITTLE_ENDIAN__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define RS_CRC32_ARM 1
#else
#define RS_CRC32_ARM 0
#endif

/* ---- slice-by-8 tables ------------------------------------------------------------------- */

/*
 * rs_crc_table[0] is the classic byte-wise table; table k advances a byte through k more zero
 * bytes, so eight table lookups consume eight input bytes per step (Intel's slicing-by-8).
 * Filled once at load time: a constructor runs before any thread can call us, which keeps the
 * kernels free of locks and lazy-init races even with the GIL released.
 */
static uint32_t rs_crc_table[8][256];
static int rs_crc_table_ready;

static void rs_crc_init_tables(void)
{
    uint32_t n, k, c;
    for (n = 0; n < 256; n++) {
        c = n;
        for (k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        rs_crc_table[0][n] = c;
    }
    for (n = 0; n < 256; n++) {
        c = rs_crc_table[0][n];
        for (k = 1; k < 8; k++) {
            c = rs_crc_table[0][c & 0xFF] ^ (c >> 8);
            rs_crc_table[k][n] = c;
        }
    }
    rs_crc_table_ready = 1;
}

#if defined(__GNUC__) || defined(__clang__)
__attribute__((constructor)) static void rs_crc_ctor(void) { rs_crc_init_tables(); }
#endif

static inline uint32_t rs_load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* crc here is the raw register (already inverted), as in zlib's internals. */
static uint32_t rs_crc32_table(uint32_t crc, const uint8_t *p, size_t len)
{
    if (RS_UNLIKELY(!rs_crc_table_ready))
        rs_crc_init_tables();   /* only on compilers without constructors */
    while (len >= 8) {
        uint32_t one = rs_load_le32(p) ^ crc;
        uint32_t two = rs_load_le32(p + 4);
        crc = rs_crc_table[7][one & 0xFF] ^ rs_crc_table[6][(one >> 8) & 0xFF] ^
              rs_crc_table[5][(one >> 16) & 0xFF] ^ rs_crc_table[4][one >> 24] ^
              rs_crc_table[3][two & 0xFF] ^ rs_crc_table[2][(two >> 8) & 0xFF] ^
              rs_crc_table[1][(two >> 16) & 0xFF] ^ rs_crc_table[0][two >> 24];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = rs_crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

/* ---- PCLMULQDQ folding (x86-64) ---------------------------------------------------------- */

#if RS_CRC32_PCLMUL
/*
 * Folding per Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ"
 * (Intel, 2009), in the reflected domain, as in Chromium zlib's crc32_simd.c and Linux's
 * crc32-pclmul_asm.S.  Constants are x^k mod P for the fold distances (k1/k2: 512 bits,
 * k3/k4: 128 bits, k5: 64 bits), then P' and mu for the Barrett reduction.
 *
 * Requires len >= 64 and len % 16 == 0; rs_crc32 passes the rest to the tables.  Loads are
 * unaligned (movdqu), which costs nothing on the CPUs that have PCLMULQDQ, so no aligned head.
 * The target attribute lets this file build without -mpclmul; it only runs after the cpuid check.
 */
__attribute__((target("pclmul,sse4.1")))
static uint32_t rs_crc32_pclmul(uint32_t crc, const uint8_t *buf, size_t len)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;

    x1 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = k1k2;
    buf += 64;
    len -= 64;

    /* Four independent 128-bit lanes hide the 7-cycle PCLMULQDQ latency. */
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5),
                           _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6),
                           _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7),
                           _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8),
                           _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x30)));
        buf += 64;
        len -= 64;
    }

    /* Fold the four lanes into one. */
    x0 = k3k4;
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);

    /* Remaining whole 16-byte blocks. */
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)(const void *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }

    /* 128 -> 64 bits. */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);

    /* Barrett reduction 64 -> 32 bits. */
    x0 = poly;
    x2 = _mm_and_si128(x1, mask32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, mask32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

/*
 * The same folding four 512-bit lanes at a time (VPCLMULQDQ, AVX-512), as in Chromium zlib's
 * crc32_avx512_simd_: 256 bytes per step instead of 64, which is what lets a 1 KiB body cost
 * about as much as the call itself.  k1/k2 fold over 2048 bits, k3/k4 over 512 bits; the
 * constants follow the paper's formula k = (x^(d+-32) mod P << 32)' << 1.
 * Requires len >= 256 and len % 64 == 0.
 */
__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.1")))
static uint32_t rs_crc32_vpclmul(uint32_t crc, const uint8_t *buf, size_t len)
{
    const __m512i k1k2 = _mm512_set_epi64(0x01322d1430LL, 0x011542778aLL, 0x01322d1430LL,
                                          0x011542778aLL, 0x01322d1430LL, 0x011542778aLL,
                                          0x01322d1430LL, 0x011542778aLL);
    const __m512i k3k4 = _mm512_set_epi64(0x01c6e41596LL, 0x0154442bd4LL, 0x01c6e41596LL,
                                          0x0154442bd4LL, 0x01c6e41596LL, 0x0154442bd4LL,
                                          0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k5k6 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k7k8 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m512i x0, x1, x2, x3, x4, x5, x6, x7, x8;
    __m128i a0, a1, a2, a3;

    x1 = _mm512_loadu_si512((const void *)(buf + 0x00));
    x2 = _mm512_loadu_si512((const void *)(buf + 0x40));
    x3 = _mm512_loadu_si512((const void *)(buf + 0x80));
    x4 = _mm512_loadu_si512((const void *)(buf + 0xC0));
    x1 = _mm512_xor_si512(x1, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)crc)));
    x0 = k1k2;
    buf += 256;
    len -= 256;

    while (len >= 256) {
        x5 = _mm512_clmulepi64_epi128(x1, x0, 0x00);
        x6 = _mm512_clmulepi64_epi128(x2, x0, 0x00);
        x7 = _mm512_clmulepi64_epi128(x3, x0, 0x00);
        x8 = _mm512_clmulepi64_epi128(x4, x0, 0x00);
        x1 = _mm512_clmulepi64_epi128(x1, x0, 0x11);
        x2 = _mm512_clmulepi64_epi128(x2, x0, 0x11);
        x3 = _mm512_clmulepi64_epi128(x3, x0, 0x11);
        x4 = _mm512_clmulepi64_epi128(x4, x0, 0x11);
        x1 = _mm512_xor_si512(_mm512_xor_si512(x1, x5), _mm512_loadu_si512((const void *)(buf + 0x00)));
        x2 = _mm512_xor_si512(_mm512_xor_si512(x2, x6), _mm512_loadu_si512((const void *)(buf + 0x40)));
        x3 = _mm512_xor_si512(_mm512_xor_si512(x3, x7), _mm512_loadu_si512((const void *)(buf + 0x80)));
        x4 = _mm512_xor_si512(_mm512_xor_si512(x4, x8), _mm512_loadu_si512((const void *)(buf + 0xC0)));
        buf += 256;
        len -= 256;
    }

    /* Four 512-bit lanes into one. */
    x0 = k3k4;
    x5 = _mm512_clmulepi64_epi128(x1, x0, 0x00);
    x1 = _mm512_clmulepi64_epi128(x1, x0, 0x11);
    x1 = _mm512_xor_si512(_mm512_xor_si512(x1, x2), x5);
    x5 = _mm512_clmulepi64_epi128(x1, x0, 0x00);
    x1 = _mm512_clmulepi64_epi128(x1, x0, 0x11);
    x1 = _mm512_xor_si512(_mm512_xor_si512(x1, x3), x5);
    x5 = _mm512_clmulepi64_epi128(x1, x0, 0x00);
    x1 = _mm512_clmulepi64_epi128(x1, x0, 0x11);
    x1 = _mm512_xor_si512(_mm512_xor_si512(x1, x4), x5);

    while (len >= 64) {
        x2 = _mm512_loadu_si512((const void *)buf);
        x5 = _mm512_clmulepi64_epi128(x1, x0, 0x00);
        x1 = _mm512_clmulepi64_epi128(x1, x0, 0x11);
        x1 = _mm512_xor_si512(_mm512_xor_si512(x1, x2), x5);
        buf += 64;
        len -= 64;
    }

    /* 512 -> 128 bits, one 128-bit quarter at a time. */
    a0 = k5k6;
    a1 = _mm512_extracti32x4_epi32(x1, 0);
    a2 = _mm512_extracti32x4_epi32(x1, 1);
    a3 = _mm_clmulepi64_si128(a1, a0, 0x00);
    a1 = _mm_clmulepi64_si128(a1, a0, 0x11);
    a1 = _mm_xor_si128(_mm_xor_si128(a1, a3), a2);
    a2 = _mm512_extracti32x4_epi32(x1, 2);
    a3 = _mm_clmulepi64_si128(a1, a0, 0x00);
    a1 = _mm_clmulepi64_si128(a1, a0, 0x11);
    a1 = _mm_xor_si128(_mm_xor_si128(a1, a3), a2);
    a2 = _mm512_extracti32x4_epi32(x1, 3);
    a3 = _mm_clmulepi64_si128(a1, a0, 0x00);
    a1 = _mm_clmulepi64_si128(a1, a0, 0x11);
    a1 = _mm_xor_si128(_mm_xor_si128(a1, a3), a2);

    /* 128 -> 64 bits, then Barrett, exactly as in rs_crc32_pclmul. */
    a2 = _mm_clmulepi64_si128(a1, a0, 0x10);
    a1 = _mm_xor_si128(_mm_srli_si128(a1, 8), a2);
    a0 = k7k8;
    a2 = _mm_srli_si128(a1, 4);
    a1 = _mm_and_si128(a1, mask32);
    a1 = _mm_clmulepi64_si128(a1, a0, 0x00);
    a1 = _mm_xor_si128(a1, a2);
    a0 = poly;
    a2 = _mm_and_si128(a1, mask32);
    a2 = _mm_clmulepi64_si128(a2, a0, 0x10);
    a2 = _mm_and_si128(a2, mask32);
    a2 = _mm_clmulepi64_si128(a2, a0, 0x00);
    a1 = _mm_xor_si128(a1, a2);
    return (uint32_t)_mm_extract_epi32(a1, 1);
}

/* 0 none, 1 PCLMULQDQ + SSE4.1, 2 also VPCLMULQDQ + AVX-512F; -1 not probed yet.
 * A racy first read only repeats an idempotent cpuid probe. */
static int rs_simd_level = -1;

static int rs_detect_simd(void)
{
    int level = 0;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1")) {
        level = 1;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq"))
            level = 2;
    }
    rs_simd_level = level;
    return level;
}

/* Below these the next smaller method wins: each fold path pays a fixed reduction. */
#define RS_CRC32_PCLMUL_MIN 64
#define RS_CRC32_VPCLMUL_MIN 256
#endif /* RS_CRC32_PCLMUL */

/* ---- ARMv8 CRC32 instructions (aarch64) --------------------------------------------------- */

#if RS_CRC32_ARM
/* <sys/auxv.h> is declared by hand (with glibc's and musl's values) so the file also compiles
 * against headers of another libc; getauxval exists in both. */
extern unsigned long getauxval(unsigned long type);
#define RS_AT_HWCAP 16
#define RS_HWCAP_CRC32 (1UL << 7)

/* 1 with the CRC32 instructions, 0 without, -1 not probed yet (an idempotent racy probe). */
static int rs_arm_crc_level = -1;

static int rs_detect_arm_crc(void)
{
    int level = (getauxval(RS_AT_HWCAP) & RS_HWCAP_CRC32) != 0;
    rs_arm_crc_level = level;
    return level;
}

/* The compilers' builtins, not <arm_acle.h>: older clang declares its __crc32* only when the
 * whole file is built with +crc, which would let the compiler use CRC32 anywhere. */
#if defined(__clang__)
#define RS_ARM_CRC_TARGET __attribute__((target("crc")))
#define RS_CRC32B(c, b) __builtin_arm_crc32b((c), (b))
#define RS_CRC32X(c, v) __builtin_arm_crc32d((c), (v))
#else
#define RS_ARM_CRC_TARGET __attribute__((target("+crc")))
#define RS_CRC32B(c, b) __builtin_aarch64_crc32b((c), (b))
#define RS_CRC32X(c, v) __builtin_aarch64_crc32x((c), (v))
#endif

RS_ARM_CRC_TARGET
static uint32_t rs_crc32_arm(uint32_t crc, const uint8_t *p, size_t len)
{
    /* crc is the raw register, as for rs_crc32_table */
    while (len && ((uintptr_t)p & 7)) {
        crc = RS_CRC32B(crc, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        crc = RS_CRC32X(crc, v);
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = RS_CRC32B(crc, *p++);
    return crc;
}
#endif /* RS_CRC32_ARM */

uint32_t rs_crc32(uint32_t crc, const uint8_t *buf, size_t len)
{
    uint32_t c = ~crc;
    assert(buf != NULL || len == 0);
#if RS_CRC32_ARM
    {
        int level = rs_arm_crc_level;
        if (RS_UNLIKELY(level < 0))
            level = rs_detect_arm_crc();
        if (level > 0)
            return ~rs_crc32_arm(c, buf, len);
    }
#endif
#if RS_CRC32_PCLMUL
    if (len >= RS_CRC32_PCLMUL_MIN) {
        int level = rs_simd_level;
        if (RS_UNLIKELY(level < 0))
            level = rs_detect_simd();
        if (level >= 2 && len >= RS_CRC32_VPCLMUL_MIN) {
            size_t chunk = len & ~(size_t)63;
            c = rs_crc32_vpclmul(c, buf, chunk);
            buf += chunk;
            len -= chunk;
        }
        if (level >= 1 && len >= RS_CRC32_PCLMUL_MIN) {
            size_t chunk = len & ~(size_t)15;
            c = rs_crc32_pclmul(c, buf, chunk);
            buf += chunk;
            len -= chunk;
        }
    }
#endif
    return ~rs_crc32_table(c, buf, len);
}

/* ---- Java String.hashCode over UTF-8 ------------------------------------------------------ */

#define RS_REPLACEMENT_CHAR 0xFFFDu

int rs_java_hash(const uint8_t *buf, size_t len, int32_t *hash)
{
    *hash = (int32_t)rs_java_hash_continue(0, buf, len);
    return RS_OK;
}

uint32_t rs_java_hash_continue(uint32_t h, const uint8_t *buf, size_t len)
{
    /* h is unsigned: Java's int overflow wraps, C's signed overflow is undefined */
    size_t i = 0;

    while (i < len) {
        uint32_t b0, cp;
        size_t need, k;
        uint8_t lo = 0x80, hi = 0xBF;

        /* Four ASCII bytes at once: h * 31^4 + b0 * 31^3 + ... + b3 leaves one multiply on the
         * dependency chain instead of four (keys and topics are short ASCII text mostly). */
        while (i + 4 <= len) {
            uint32_t w;

            memcpy(&w, buf + i, 4);
            if (w & 0x80808080u)
                break;
            h = h * 923521u + buf[i] * 29791u + buf[i + 1] * 961u + buf[i + 2] * 31u +
                buf[i + 3];
            i += 4;
        }
        if (i >= len)
            break;
        b0 = buf[i++];

        if (b0 < 0x80) {
            h = 31 * h + b0;
            continue;
        }
        /*
         * Well-formed sequences per Unicode Table 3-7.  The second byte's range is narrowed for
         * E0 (no overlongs), ED (no surrogates), F0 (no overlongs) and F4 (<= U+10FFFF); C0, C1
         * and F5..FF never start a sequence.
         */
        if (b0 >= 0xC2 && b0 <= 0xDF) {
            need = 1;
            cp = b0 & 0x1F;
        } else if (b0 >= 0xE0 && b0 <= 0xEF) {
            need = 2;
            cp = b0 & 0x0F;
            if (b0 == 0xE0)
                lo = 0xA0;
            else if (b0 == 0xED)
                hi = 0x9F;
        } else if (b0 >= 0xF0 && b0 <= 0xF4) {
            need = 3;
            cp = b0 & 0x07;
            if (b0 == 0xF0)
                lo = 0x90;
            else if (b0 == 0xF4)
                hi = 0x8F;
        } else {
            h = 31 * h + RS_REPLACEMENT_CHAR;
            continue;
        }
        for (k = 0; k < need && i < len; k++) {
            uint8_t c = buf[i];
            if (c < lo || c > hi)
                break;
            cp = (cp << 6) | (c & 0x3Fu);
            lo = 0x80;
            hi = 0xBF;
            i++;
        }
        if (k < need) {
            /* A maximal subpart: one U+FFFD, then resume at the byte that broke the sequence. */
            h = 31 * h + RS_REPLACEMENT_CHAR;
        } else if (cp >= 0x10000) {
            cp -= 0x10000;
            h = 31 * h + (0xD800u + (cp >> 10));
            h = 31 * h + (0xDC00u + (cp & 0x3FFu));
        } else {
            h = 31 * h + cp;
        }
    }
    return h;
}
