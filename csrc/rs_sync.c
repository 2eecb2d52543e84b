/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_sync.c - msync of a byte range (with rs_space.c, the kernels that do I/O).
 */
#if defined(__linux__)
#define _GNU_SOURCE               /* madvise, MADV_DONTNEED, sync_file_range under -std=c99 */
#include <fcntl.h>
#endif
#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L   /* msync, sysconf under -std=c99 */
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "rs_sync.h"

#if !defined(_WIN32)
/* The address of the page holding p: msync and madvise want page-aligned addresses, and a
 * mapping begins on a page boundary, so the page stays inside it. */
static uintptr_t page_of(const uint8_t *p)
{
    long page = sysconf(_SC_PAGESIZE);

    if (page <= 0)
        page = 4096;
    return (uintptr_t)p & ~((uintptr_t)page - 1);
}
#endif

int rs_sync_range(const uint8_t *buf, size_t len, int64_t start, int64_t length)
{
    if (length < 0 || !rs_in_bounds(start, (uint64_t)length, len))
        return RS_E_BOUNDS;
    if (length == 0)
        return RS_OK;
#if defined(_WIN32)
    (void)buf;
    return RS_E_ERRNO_BASE - 40;   /* ENOSYS: Windows flush semantics are not under test yet */
#else
    {
        uintptr_t addr = (uintptr_t)(buf + start), base = page_of(buf + start);

        if (msync((void *)base, (size_t)(addr - base) + (size_t)length, MS_SYNC) != 0)
            return RS_E_ERRNO_BASE - errno;
        return RS_OK;
    }
#endif
}

int rs_sync_written(const uint8_t *buf, size_t len, int64_t start, int64_t length, int drop)
{
    if (length < 0 || !rs_in_bounds(start, (uint64_t)length, len))
        return RS_E_BOUNDS;
#if defined(__linux__)
    if (drop && length > 0) {
        uintptr_t lo = page_of(buf + start), hi = page_of(buf + start + length);

        if (hi > lo)
            (void)madvise((void *)lo, (size_t)(hi - lo), MADV_DONTNEED);
    }
#else
    (void)drop;
#endif
    return rs_sync_range(buf, len, start, length);
}

#if defined(__linux__)
/* Start [off, off + len)'s write-back if not yet under way and wait for it to end. */
static int wait_written(int fd, int64_t off, int64_t len)
{
    if (sync_file_range(fd, off, len, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                        SYNC_FILE_RANGE_WAIT_AFTER) != 0)
        return RS_E_ERRNO_BASE - errno;
    return RS_OK;
}
#endif

int rs_write_behind(int fd, int64_t start, int64_t length, int64_t chunk)
{
    if (start < 0 || length < 0 || chunk < 1 || length > INT64_MAX - start)
        return RS_E_BOUNDS;
#if defined(__linux__)
    {
        int64_t lo = start, end = start + length, prev = -1, prev_len = 0;
        int r;

        while (lo < end) {
            /* Chunks end on multiples of `chunk`, as FileSystem.sync_written's msyncs do. */
            int64_t hi = lo - lo % chunk + chunk;

            if (hi > end)
                hi = end;
            if (sync_file_range(fd, lo, hi - lo, SYNC_FILE_RANGE_WRITE) != 0)
                return RS_E_ERRNO_BASE - errno;
            if (prev >= 0 && (r = wait_written(fd, prev, prev_len)) != RS_OK)
                return r;
            prev = lo;
            prev_len = hi - lo;
            lo = hi;
        }
        return prev >= 0 ? wait_written(fd, prev, prev_len) : RS_OK;
    }
#else
    (void)fd;
    return RS_WRITE_BEHIND_NONE;
#endif
}
