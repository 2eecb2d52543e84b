/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_space.h - reserve blocks of many files and populate their mappings, in one call.
 */
#ifndef RS_SPACE_H
#define RS_SPACE_H

#include "rs_common.h"

/*
 * One file's part of an rs_space_prepare call.  Either part may be empty.
 *   path, offset, length: posix_fallocate [offset, offset + length) of the regular file at
 *     `path` (NUL-terminated; opened O_NOFOLLOW: the store never writes through a link).
 *     path NULL or length 0: reserve nothing.
 *   map, map_len, pop_start, pop_length: MADV_POPULATE_WRITE the pages holding
 *     map[pop_start, pop_start + pop_length) of a shared writable file mapping, 2 MiB per
 *     madvise (other threads' faults and mmaps wait for the mmap lock no longer than that).
 *     map NULL or pop_length 0: populate nothing.  Only after the reservation succeeded:
 *     populating a hole would allocate it with no ENOSPC check.
 *   result (out): RS_OK; RS_E_ERRNO_BASE - errno when the open or the fallocate failed
 *     (ENOSPC: a full disk; EOPNOTSUPP or EINVAL: the file system cannot reserve);
 *     RS_E_BOUNDS when the populate range leaves the mapping.  A failed populate is not
 *     reported: it is a hint (a kernel before Linux 5.14 has no MADV_POPULATE_WRITE).
 */
typedef struct rs_space_req {
    const char *path;
    int64_t offset;
    int64_t length;
    uint8_t *map;
    size_t map_len;
    int64_t pop_start;
    int64_t pop_length;
    int32_t result;
} rs_space_req;

/*
 * rs_space_prepare - serve reqs[0, n) in order, each as its comment above says.
 * GIL: blocks on disk I/O; wrappers always release it, once for the whole batch.  Why one call:
 * a thread that releases the GIL for each open, fallocate, close and madvise waits up to a
 * switch interval to take it back from a thread running long compiled calls, four times a file
 * (PopulateAheadService behind a dispatcher: doc/performance.md).
 */
void rs_space_prepare(rs_space_req *reqs, size_t n);

#endif /* RS_SPACE_H */
