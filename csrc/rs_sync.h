/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_sync.h - make a byte range of a memory mapping durable.
 */
#ifndef RS_SYNC_H
#define RS_SYNC_H

#include "rs_common.h"

/*
 * rs_sync_range - msync(MS_SYNC) the pages holding buf[start, start + length), where buf is (a
 * window into) a shared writable file mapping.  The start is rounded down to the page size,
 * which stays inside the mapping because mappings begin on a page boundary.
 *
 * Returns RS_OK; RS_E_BOUNDS unless the range lies in buf[0, len); RS_E_ERRNO_BASE - errno if
 * msync fails (e.g. ENOMEM when buf is not a mapping).  length 0 is a no-op.
 * GIL: blocks on disk I/O; wrappers always release it.  CPython's mmap.flush() holds the GIL
 * through msync and would stall every producer thread, which is why this kernel exists.
 * Java: MappedFile#flush -> MappedByteBuffer#force.
 */
int rs_sync_range(const uint8_t *buf, size_t len, int64_t start, int64_t length);

#endif /* RS_SYNC_H */
