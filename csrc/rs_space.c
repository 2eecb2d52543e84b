/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_space.c - reserve file blocks and populate mappings for many files in one call.
 */
#if defined(__linux__)
#define _GNU_SOURCE               /* O_NOFOLLOW, O_CLOEXEC, madvise under -std=c99 */
#endif
#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L   /* posix_fallocate under -std=c99 */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "rs_space.h"

/* Not in every libc's headers (Linux 5.14+); the value is the kernel's ABI. */
#define RS_MADV_POPULATE_WRITE_ 23
#define RS_POPULATE_CHUNK ((int64_t)2 << 20)

#if !defined(_WIN32)
static int reserve(const char *path, int64_t offset, int64_t length)
{
    int fd, rc;

    do
        fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return RS_E_ERRNO_BASE - errno;
    do   /* posix_fallocate returns the error number; EINTR: a signal came, ask again */
        rc = posix_fallocate(fd, (off_t)offset, (off_t)length);
    while (rc == EINTR);
    (void)close(fd);
    return rc == 0 ? RS_OK : RS_E_ERRNO_BASE - rc;
}

static void populate(uint8_t *map, int64_t start, int64_t length)
{
    long page = sysconf(_SC_PAGESIZE);
    int64_t lo, end = start + length;

    if (page <= 0)
        page = 4096;
    lo = start - start % page;   /* a mapping begins on a page boundary */
    while (lo < end) {
        int64_t step = end - lo < RS_POPULATE_CHUNK ? end - lo : RS_POPULATE_CHUNK;

        if (madvise(map + lo, (size_t)step, RS_MADV_POPULATE_WRITE_) != 0)
            return;   /* a hint: an old kernel, or the range went away */
        lo += step;
    }
}
#endif

void rs_space_prepare(rs_space_req *reqs, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        rs_space_req *r = &reqs[i];

        r->result = RS_OK;
        if (r->map != NULL && r->pop_length != 0
                && (r->pop_length < 0
                    || !rs_in_bounds(r->pop_start, (uint64_t)r->pop_length, r->map_len))) {
            r->result = RS_E_BOUNDS;
            continue;
        }
        if (r->path != NULL && r->length != 0) {
            if (r->offset < 0 || r->length < 0) {
                r->result = RS_E_ARG;
                continue;
            }
#if defined(_WIN32)
            r->result = RS_E_ERRNO_BASE - 40;   /* ENOSYS */
            continue;
#else
            r->result = reserve(r->path, r->offset, r->length);
            if (r->result != RS_OK)
                continue;
#endif
        }
#if !defined(_WIN32)
        if (r->map != NULL && r->pop_length > 0)
            populate(r->map, r->pop_start, r->pop_length);
#endif
    }
}
