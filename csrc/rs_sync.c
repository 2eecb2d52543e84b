/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_sync.c - msync of a byte range: the one kernel that does I/O.
 */
#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L   /* msync, sysconf under -std=c99 */
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "rs_sync.h"

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
        long page = sysconf(_SC_PAGESIZE);
        uintptr_t addr, base;

        if (page <= 0)
            page = 4096;
        addr = (uintptr_t)(buf + start);
        base = addr & ~((uintptr_t)page - 1);   /* msync wants a page-aligned address */
        if (msync((void *)base, (size_t)(addr - base) + (size_t)length, MS_SYNC) != 0)
            return RS_E_ERRNO_BASE - errno;
        return RS_OK;
    }
#endif
}
