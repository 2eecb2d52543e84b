/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_crc32.h - zlib-compatible CRC-32 and Java's String.hashCode over UTF-8 bytes.
 */
#ifndef RS_CRC32_H
#define RS_CRC32_H

#include "rs_common.h"

/*
 * rs_crc32 - IEEE CRC-32 (reflected polynomial 0xEDB88320, init/xorout 0xFFFFFFFF), continuing
 * from `crc` exactly like zlib.crc32(data, crc) and java.util.zip.CRC32.
 *
 * Bounds: reads buf[0, len).  buf may be NULL when len == 0.  Never fails.
 * GIL: pure computation, callable without it.
 * Java: UtilAll#crc32.  RocketMQ stores crc & 0x7FFFFFFF as BODYCRC (see rs_msg.h); this
 * function returns the full 32 bits so callers can chain it like zlib.
 * Speed: on x86-64, carry-less multiply folding picked at run time (VPCLMULQDQ/AVX-512 from 256
 * bytes, PCLMULQDQ from 64); slice-by-8 tables elsewhere and for short buffers and tails.
 */
uint32_t rs_crc32(uint32_t crc, const uint8_t *buf, size_t len);

/*
 * rs_java_hash - Java String.hashCode of the UTF-8 text buf[0, len): h = 31*h + unit over the
 * UTF-16 code units of the decoded string, int32 wrap-around.
 *
 * Decoding matches Java's new String(bytes, UTF_8) and Python's bytes.decode('utf-8', 'replace'):
 * each maximal ill-formed subpart (Unicode ch. 3, "U+FFFD substitution of maximal subparts")
 * becomes one U+FFFD; code points above U+FFFF contribute a surrogate pair.
 *
 * Bounds: reads buf[0, len).  Returns RS_OK and the hash in *hash.
 * GIL: callable without it.
 * Java: String#hashCode, as used by MessageExtBrokerInner#tagsString2tagsCode and the IndexFile key hash.
 */
int rs_java_hash(const uint8_t *buf, size_t len, int32_t *hash);

/*
 * rs_java_hash_continue - the hash of (text already hashed to h) + buf[0, len): String.hashCode
 * is a polynomial, so "topic#" can be hashed once and each key appended.  Exact only when the
 * first part ends on a character boundary (it ends in ASCII '#' where this is used).
 */
uint32_t rs_java_hash_continue(uint32_t h, const uint8_t *buf, size_t len);

#endif /* RS_CRC32_H */
