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

/*
 * rs_sync_written - rs_sync_range of buf[start, start + length), after (with `drop`, on Linux)
 * taking the range's whole pages below the one holding its end off the page tables
 * (MADV_DONTNEED, which keeps a shared file mapping's data: the dirty bits move to the page
 * cache and the msync writes them as before).  Those pages must be written for good (the
 * files are only appended to).  Why: write-back of a page mapped writable write-protects it
 * with one TLB flush per page, each interrupting every other core running a thread of the
 * process; dropped first, the range costs one flush (FileSystem.unmap_written).  The drop is
 * a hint: its failure is not reported.  One call, so a wrapper releases the GIL once for both
 * system calls: a thread taking the GIL back between them waits for whichever producer holds
 * it, on the path of every put the sync serves.
 * Returns as rs_sync_range.
 */
int rs_sync_written(const uint8_t *buf, size_t len, int64_t start, int64_t length, int drop);

/*
 * rs_write_behind - write the dirty pages of [start, start + length) of the file open as `fd`
 * back to the disk and wait for them, `chunk` bytes at a time with two chunks in flight
 * (Linux's sync_file_range: the next chunk is started before the one before it is waited
 * for), without making them durable: no metadata and no device cache flush, which the msync
 * that follows does once.  Why: the ASYNC_FLUSH flusher's msync of each 16 MiB chunk wrote,
 * waited, and flushed the device's cache, one chunk at a time, and kept up with a writer
 * near 1 GB/s and no faster; the kernel's own writeback then took the rest, with the
 * ConsumeQueue and index folios the writer appends to locked while it waited for the disk
 * (doc/performance.md, "The device's queue behind those folios").  A hint: where the system
 * has no sync_file_range it writes nothing and says so (RS_WRITE_BEHIND_NONE), so that the
 * caller does not count the range as written.
 * Returns RS_OK once written; RS_WRITE_BEHIND_NONE where nothing could be; RS_E_BOUNDS for a
 * negative start or length or a chunk below 1;
 * RS_E_ERRNO_BASE - errno if sync_file_range fails (EBADF, EIO: the msync after it reports a
 * write-back error again, on its own file).
 * GIL: blocks on disk I/O; wrappers always release it.
 */
#define RS_WRITE_BEHIND_NONE 1
int rs_write_behind(int fd, int64_t start, int64_t length, int64_t chunk);

#endif /* RS_SYNC_H */
