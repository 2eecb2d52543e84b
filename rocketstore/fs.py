# SPDX-License-Identifier: Apache-2.0
"""The only module that opens, truncates, maps, syncs, renames or deletes files.

Everything above it calls `FileSystem` methods, so tests can hand a store a double that injects
faults (google/leveldb's Env). Paths are plain strings.
"""
import ctypes
import errno
import fcntl
import mmap
import os
import stat
import sys
import threading
import time

from . import leaves
from .errors import StoreLockedError, UnsafePathError
from .format import OS_PAGE_SIZE

# Never follow a symlink when opening a file to create or write it: a planted link would take
# the write (truncate, extend, map) to a file outside the store.
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

# Linux 5.14+: fault every page of a range in, writable, in one call (no per-page first touch).
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
# FileSystem.unmap_written: where MADV_DONTNEED on a shared file mapping keeps its data.
_DROP_PTES = sys.platform.startswith("linux") and hasattr(mmap, "MADV_DONTNEED")

_PMD_SIZE = None


def _pmd_size():
    """The kernel's PMD size (FileSystem.large_folio_size), read once; 0 without THP."""
    global _PMD_SIZE
    if _PMD_SIZE is None:
        try:
            with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
                _PMD_SIZE = int(f.read())
        except (OSError, ValueError):
            _PMD_SIZE = 0
    return _PMD_SIZE


def machine_memory(cgroup_root="/sys/fs/cgroup", self_cgroup="/proc/self/cgroup"):
    """Bytes of memory this process may use: the machine's physical memory, or the lowest
    memory limit on the path of the cgroup it runs in where that is lower. Java 17's
    OperatingSystemMXBean reports the same in a container, and a broker sizes its in-memory
    window from it (accessMessageInMemoryMaxRatio). 8 GiB where neither can be read."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    limit = _cgroup_memory_limit(cgroup_root, self_cgroup)
    return total if limit is None else min(total, limit)


def _cgroup_memory_limit(root, self_cgroup):
    """The lowest memory limit set on this process's cgroup or its ancestors (cgroup v2
    `memory.max`, under `root` or, on a hybrid layout, `root`/unified; v1
    `memory.limit_in_bytes` under `root`/memory), or None where none is set or readable.
    "max" (v2) and v1's near-2^63 mean no limit; the caller's min() absorbs the latter."""
    try:
        with open(self_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    places = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        parts = [p for p in path.split("/") if p]
        if hierarchy == "0" and controllers == "":
            places += [(os.path.join(root, "unified"), parts, "memory.max"),
                       (root, parts, "memory.max")]
        elif "memory" in controllers.split(","):
            places.append((os.path.join(root, "memory"), parts, "memory.limit_in_bytes"))
    lowest = None
    for base, parts, name in places:
        for depth in range(len(parts), -1, -1):
            try:
                with open(os.path.join(base, *parts[:depth], name)) as f:
                    text = f.read().strip()
            except OSError:
                continue
            if text.isdigit():
                lowest = int(text) if lowest is None else min(lowest, int(text))
    return lowest


def _libc_syncfs():
    """libc's syncfs(2) (Linux 2.6.39+, glibc 2.14+), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_syncfs = _libc_syncfs()

# Python 3.13+: mmap.mmap need not keep a duplicate of the descriptor it maps.
_NO_TRACKFD = {"trackfd": False} if sys.version_info >= (3, 13) else {}


def open_nofollow(path, flags, mode=0o644):
    """os.open with O_NOFOLLOW; a symlink at `path` raises UnsafePathError naming it."""
    try:
        return os.open(path, flags | O_NOFOLLOW, mode)
    except OSError as exc:
        # Linux answers ELOOP, the BSDs EMLINK, for O_NOFOLLOW on a link.
        if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise UnsafePathError(
                f"{path} is a symbolic link (to {os.path.realpath(path)}): the store writes "
                "its files in place and never through a link; remove it") from None
        raise


def _reserve_answer(err, path, offset, length):
    """What FileSystem.reserve answers for a posix_fallocate that failed with `err`: False
    when the file system cannot reserve at all, else the OSError to raise, naming the file
    and how much was asked (posix_fallocate names neither)."""
    if err in (errno.EOPNOTSUPP, errno.EINVAL):
        return False
    return OSError(err, f"{os.strerror(err)} (reserving {length} bytes at {offset})", path)


def is_inside(root, path):
    """True when `path`, symlinks resolved, is `root` or below it (root resolved too)."""
    if _plainly_below(root, path):
        return True
    root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _plainly_below(root, path):
    """True when `path` is `root` joined with plain names (no "." or ".."), none of them a
    symlink: `path` then resolves below `root` whatever `root` itself resolves to. The walk
    stops at the first name that does not exist yet (nothing there to follow). A few lstat
    calls instead of two realpath walks from "/": a store creating 40 000 queue directories
    checks each before and after making it. False when unsure; is_inside then resolves both."""
    base = root.rstrip(os.sep)
    if not base or not path.startswith(base + os.sep):
        return False
    names = path[len(base) + 1:].split(os.sep)
    # Every name first: a ".." after a name that does not exist yet would still climb out
    # once something (os.makedirs) creates that name.
    if any(name in ("", ".", "..") for name in names):
        return False
    cur = base
    for name in names:
        cur = cur + os.sep + name
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        if stat.S_ISLNK(st.st_mode):
            return False
    return True


# POSIX record locks belong to the process, so a second store in this process would get the
# lock again: FileSystem.lock keeps its own registry of locked files, keyed by (device, inode).
# And closing any descriptor of a locked file in this process drops the lock: a descriptor
# opened on a file locked here is kept open until unlock() (the list), not closed.
_held: dict = {}
_held_mutex = threading.Lock()


def _held_key(path):
    """`path`'s key in _held, or None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino

class _Flock(ctypes.Structure):
    """struct flock, with the field order of this platform's <fcntl.h> (ctypes lays out the
    padding): Linux puts l_type and l_whence first, the BSDs and macOS last."""
    _common: list = [("l_start", ctypes.c_int64), ("l_len", ctypes.c_int64),
                     ("l_pid", ctypes.c_int32)]
    _kind: list = [("l_type", ctypes.c_short), ("l_whence", ctypes.c_short)]
    if sys.platform.startswith("linux"):
        _fields_ = _kind + _common
    elif sys.platform.startswith("freebsd"):
        _fields_ = _common + _kind + [("l_sysid", ctypes.c_int)]
    else:                                       # macOS, NetBSD, OpenBSD
        _fields_ = _common + _kind


# A file being sized under its temporary name; one left behind was killed before its rename,
# so nothing was ever written to it.
CREATING_SUFFIX = ".creating"


class FileSystem:
    """Real file-system access. Subclass and override to inject faults."""

    # A sync of mapped bytes (sync_written) goes to the disk at most this many bytes per
    # msync. One msync put a whole flush in the device's queue at once: every 500 ms
    # hundreds of MiB under sustained writes, a 1 GiB CommitLog file at its roll, 400 MiB for
    # a full index file. Every synchronous read the store needed meanwhile waited behind it:
    # the block bitmaps posix_fallocate reads to reserve the CommitLog's next window (4 MiB
    # reservations took up to 1 s, and the putter that reached its reserved end stalled as
    # long), a page a reader faults in. 60 s of sustained writes (bench_sustained.py), whole
    # msyncs against chunks of 16 MiB: 20-32 puts over 50 ms against 2-5, the longest put
    # 840-916 ms against 59-179, the CommitLog's bandwidth no lower (310-328 MB/s against
    # 314-367). Chunks of 8, 32 and 64 MiB: 2-5, 2-5 and 10 such puts, and 8 MiB wrote a
    # little slower (doc/performance.md, "Syncs in chunks").
    SYNC_CHUNK = 16 << 20

    def exists(self, path):
        return os.path.exists(path)

    def is_dir(self, path):
        return os.path.isdir(path)

    def is_link(self, path):
        return os.path.islink(path)

    def ensure_dir(self, path, root=None):
        """Create `path` and its parents. With `root` (an ancestor of `path`), refuse a path
        that a symlinked directory takes outside `root`, before and after creating it: files
        made in it would land outside the store."""
        if root is not None:
            self._check_inside(root, path)
        if not os.path.isdir(path):
            # Only when missing: mkdir of an existing directory still takes its parent's
            # lock, which a create or rename there holds while ext4 waits for its journal
            # under heavy writeback: a put rolling the CommitLog was seen in mkdir
            # (filename_create) for 145 ms, 69 ms of it asleep.
            os.makedirs(path, exist_ok=True)
        if root is not None:
            self._check_inside(root, path)

    @staticmethod
    def _check_inside(root, path):
        if not is_inside(root, path):
            raise UnsafePathError(
                f"{path} resolves to {os.path.realpath(path)}, outside the store "
                f"{os.path.realpath(root)}: remove the symlink")

    def unsafe_links(self, root, top):
        """(path, why) for every symlink at or under `top` that a writer must not follow: one
        resolving outside `root`, or one to anything but a directory (a store never links its
        files). Links to directories inside `root` are walked through, once each."""
        found = []
        seen = set()
        real_root = os.path.realpath(root)

        def link(path):
            real = os.path.realpath(path)
            if not is_inside(real_root, real):
                found.append((path, f"a symbolic link to {real}, outside the store "
                                    f"{real_root}"))
            elif not os.path.isdir(real):
                found.append((path, f"a symbolic link to {real}, not a directory"))
            else:
                return real
            return None

        if os.path.islink(top):
            real = link(top)
            pending = [(top, real)] if real else []
        else:
            pending = [(top, os.path.realpath(top))] if os.path.isdir(top) else []
        while pending:
            path, real = pending.pop()
            if real in seen:
                continue
            seen.add(real)
            try:
                with os.scandir(path) as it:
                    for entry in it:
                        # d_type answers without a stat: plain files are the bulk of a store,
                        # and a directory's real path is its parent's plus its name.
                        if entry.is_symlink():
                            target = link(entry.path)
                            if target:
                                pending.append((entry.path, target))
                        elif entry.is_dir(follow_symlinks=False):
                            pending.append((entry.path, os.path.join(real, entry.name)))
            except OSError:
                continue
        return sorted(found)

    def list_dir(self, path):
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def size(self, path):
        return os.path.getsize(path)

    def mtime_ms(self, path):
        """The file's last-modified time in ms; 0 when it is gone, as Java's
        File.lastModified() answers (a file cleaning or a cut deleted while a caller looked)."""
        try:
            return int(os.stat(path).st_mtime * 1000)
        except FileNotFoundError:
            return 0

    def allocated(self, path):
        """Bytes the file takes on disk (st_blocks * 512): below its size while sparse."""
        return os.stat(path).st_blocks * 512

    def touch_mtime(self, path):
        os.utime(path, follow_symlinks=False)

    def create_sized(self, path, size, preallocate=False):
        """Create `path` with `size` bytes (sparse zeros), or extend an existing one. A new file
        is sized under a temporary name and renamed, so a crash never leaves a short file.
        `preallocate` reserves its blocks (ENOSPC now rather than SIGBUS on a later write)."""
        if os.path.lexists(path):
            fd = open_nofollow(path, os.O_RDWR)
            try:
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)
            finally:
                os.close(fd)
            return
        # A path that is itself a temporary name (a file made ahead of its name, renamed
        # when taken) is sized in place: a crash leaves zeros under it either way.
        tmp = path if path.endswith(CREATING_SUFFIX) else path + CREATING_SUFFIX
        fd = open_nofollow(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            if preallocate:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    os.ftruncate(fd, size)
            else:
                os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            os.remove(tmp)
            raise
        os.close(fd)
        if tmp != path:
            os.replace(tmp, path)

    def map(self, path, size, writable=True, kernels=None):
        """Map the first `size` bytes of an existing file, and close the descriptor at once:
        a mapping does not need it, and a store with 40 000 queues must not hold 40 000 fds.
        A kernel backend exporting `Mapping` (cext) maps in C and keeps no descriptor either;
        otherwise mmap.mmap keeps a duplicate until it is closed (before Python 3.13's
        trackfd=False, which is then used)."""
        # Read-only tools may read through a link; a writable mapping never follows one.
        fd = open_nofollow(path, os.O_RDWR) if writable else os.open(path, os.O_RDONLY)
        try:
            actual = os.fstat(fd).st_size
            if not writable and actual < size:
                # A short file opened read-only: map a zero-padded private copy instead, so
                # no read past its end can fault (SIGBUS), and the file stays untouched.
                mm = mmap.mmap(-1, size)
                mm[:actual] = os.pread(fd, actual, 0)
                return mm
            mapping = getattr(kernels, "Mapping", None)
            if mapping is not None:
                return mapping(fd, size, writable)
            return leaves.mapping(mmap.mmap(fd, size, mmap.MAP_SHARED,
                                            mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0),
                                            **_NO_TRACKFD))
        finally:
            os.close(fd)

    def reserve(self, path, offset, length):
        """Allocate the blocks of [offset, offset+length) of `path` (posix_fallocate), so a
        later write through a mapping there cannot fault for want of space: a full disk
        then raises OSError(ENOSPC) here instead of SIGBUS in the writer. False when the
        file system cannot reserve at all (writes there stay unprotected)."""
        try:
            # Never through a link (as map): a link's target may lie outside the store.
            fd = os.open(path, os.O_RDWR | O_NOFOLLOW)
            try:
                os.posix_fallocate(fd, offset, length)
            finally:
                os.close(fd)
        except OSError as exc:
            answer = _reserve_answer(exc.errno, path, offset, length)
            if answer is False:
                return False
            raise answer from None
        return True

    def reserve_many(self, kernels, requests):
        """reserve() of each (path, offset, length) of `requests`, answered in order: True,
        False, or the OSError that reserve() would raise. A kernel backend with space_prepare
        makes them all in one call that releases the GIL once: PopulateAheadService, serving
        hundreds of queues at once, otherwise waited to take the GIL back four times a file
        behind a dispatcher running long compiled calls (doc/performance.md, "The populating
        thread starved of the GIL"). A file system whose reserve() differs (a test's) keeps it."""
        prepare = getattr(kernels, "space_prepare", None)
        if prepare is None or type(self).reserve is not FileSystem.reserve:
            answers = []
            for path, offset, length in requests:
                try:
                    answers.append(self.reserve(path, offset, length))
                except OSError as exc:
                    answers.append(exc)
            return answers
        errs = prepare([(path, offset, length, None, 0, 0) for path, offset, length in requests])
        return [True if err == 0 else _reserve_answer(err, path, offset, length)
                for err, (path, offset, length) in zip(errs, requests)]

    def data_end(self, path):
        """The end of the last written extent of `path`: everything past it reads as zeros.
        Recovery reads no further, because on tmpfs merely reading a hole through a mapping
        allocates it (a full disk then kills the reader with SIGBUS) and a sparse 1 GiB
        file would take 1 GiB. Reserved but never written blocks count as holes here."""
        fd = os.open(path, os.O_RDONLY)
        try:
            end = 0
            while True:
                try:
                    start = os.lseek(fd, end, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:       # no data at or after `end`
                        return end
                    raise
                end = os.lseek(fd, start, os.SEEK_HOLE)
        except (AttributeError, OSError):
            # No SEEK_DATA (or it failed): assume the whole file holds data.
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def holds_only_zeros(self, path, chunk=1 << 20):
        """True when every byte of `path` is zero (what create_sized leaves: nothing was ever
        written). Reads only up to its data end, so a sparse file costs nothing."""
        end = self.data_end(path)
        with open(path, "rb") as f:
            pos = 0
            while pos < end:
                block = f.read(min(chunk, end - pos))
                if not block or block.count(0) != len(block):
                    return not block
                pos += len(block)
        return True

    def prefault(self, mm, start=0, length=None, chunk=1 << 20, from_end=False):
        """Fault in [start, start+length) of a writable mapping (by default all of it), so
        appends there never pay first touch. Reserve the range first: populating pages of
        a sparse range would allocate them with no ENOSPC check.

        `from_end`: for a writer heading into the range from below, populate its last pages
        first. Where memory is slow to come by (a VM whose host backs each freed page again
        on first touch: 0.35-0.7 GB/s here, against a writer at 1.2 GB/s), a writer catches
        up with a populate going forward and then waits on each folio it locks, one core
        idle (doc/performance.md, "A writer behind its populate"); going backward, the two
        meet once, the writer faulting in the lower pages itself while this fills the upper.

        mmap.madvise holds the GIL (a Mapping's does not), so go a chunk at a time and let
        other threads run in between. Without MADV_POPULATE_WRITE (Linux < 5.14) nothing is
        done: writing a zero per page instead would race a writer catching up with the range."""
        try:
            # In the try: a mapping closed meanwhile (its file destroyed) has no length either.
            end = len(mm) if length is None else min(len(mm), start + length)
            if end <= start:
                return
            if not isinstance(mm, mmap.mmap):
                # A Mapping goes 2 MiB per madvise without the GIL: one call, since taking
                # the GIL back from a busy thread between chunks costs up to a switch
                # interval (5 ms) each.
                mm.madvise(MADV_POPULATE_WRITE, start, end - start, from_end)
                return
            chunks = range(start, end, chunk)
            for i, pos in enumerate(reversed(chunks) if from_end else chunks):
                if i:
                    time.sleep(0)       # the GIL to other threads between chunks
                mm.madvise(MADV_POPULATE_WRITE, pos, min(chunk, end - pos))
        except (OSError, ValueError, AttributeError):
            pass

    def populate_many(self, kernels, requests, call_bytes=16 << 20):
        """prefault() of the pages holding [start, end) for each (mm, start, end) of
        `requests` (the range clipped to the mapping; a closed mapping passed over). With a
        kernel backend's space_prepare, one call that releases the GIL once per `call_bytes`
        populated (reserve_many says why). Each call borrows its mappings, so a destroy waits
        for it (MappedFile._unmap): the bound keeps that wait to one call's populate."""
        # madvise wants the page holding `start`.
        requests = [(mm, start - start % OS_PAGE_SIZE, end) for mm, start, end in requests]
        prepare = getattr(kernels, "space_prepare", None)
        if prepare is None or type(self).prefault is not FileSystem.prefault:
            for mm, start, end in requests:
                self.prefault(mm, start, end - start)
            return
        call, size = [], 0
        for mm, start, end in requests:
            call.append((None, 0, 0, mm, start, end - start))
            size += end - start
            if size >= call_bytes:
                prepare(call)
                call, size = [], 0
        if call:
            prepare(call)

    def cache_range(self, path, start, length):
        """Bring [start, start+length) of the file at `path` into the page cache now
        (POSIX_FADV_WILLNEED), so a populate of a mapping there only maps the pages. Exactly
        that range: unlike a fault through a mapping with readahead, whose read-around
        reaches past it and may cache a large folio straddling its end (see
        AllocateMappedFileService). A hint: nothing where fadvise is missing or refused
        (tmpfs ignores it)."""
        advise = getattr(os, "posix_fadvise", None)
        if advise is None or length <= 0:
            return
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            advise(fd, start, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)

    def large_folio_size(self):
        """The largest page-cache folio a fault in a mapping advised MADV_HUGEPAGE brings in
        (the PMD size: 2 MiB on x86-64), or 0 where the kernel has none. Such a fault reads
        exactly the aligned folio holding the page, readahead or not (do_sync_mmap_readahead),
        where the file system supports large folios (ext4 and XFS on recent kernels)."""
        return _pmd_size()

    def advise_hugepage(self, mm):
        """MADV_HUGEPAGE on the whole mapping: populating it, or a first write to it, fills
        the page cache a large folio at a time, not 4 KiB (populating 1 GiB of a fallocated
        ext4 file took 0.12-0.14 s of CPU against 0.9-1.1 s a page at a time, MADV_RANDOM
        either way: doc/performance.md, "Large folios"). A write to such a folio makes the
        file system allocate every block it covers, so whoever advises it must keep writes
        below a reserved end aligned to large_folio_size (MappedFile.use_large_folios).
        False where the mapping or the platform cannot take it."""
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except (OSError, ValueError, AttributeError):
            return False
        return True

    def advise_random(self, mm, random=True):
        """MADV_RANDOM on the whole mapping (MADV_NORMAL with random=False): a first touch of
        a page then brings in that page alone, not a readahead window around it. Ignored
        where the mapping or the platform cannot take it."""
        try:
            mm.madvise(mmap.MADV_RANDOM if random else mmap.MADV_NORMAL)
        except (OSError, ValueError, AttributeError):
            pass

    def unmap_written(self, mm, start, length):
        """Drop the page-table entries of mm[start:start+length) (whole pages, written for
        good) before they are synced. The pages stay in the page cache, dirty, and the sync
        writes them as before; a reader's next touch maps them back (a minor fault).

        Why: writing back a page mapped writable write-protects it, one TLB flush per page,
        and each flush interrupts every other core running a thread of this process (an
        inter-processor interrupt, which a VM turns into exits on both sides). The store
        always has such threads (producers, reput, the allocator). Dropping the range first
        costs one flush for all of it. Measured on the 2-core VM, 253 KB written through a
        mapping and then msync'ed while another thread of the process ran: 0.9-1.3 ms,
        against 0.42-0.48 ms with the range dropped first and 0.32-0.40 ms for pwrite +
        fdatasync of the same bytes. Linux only: MADV_DONTNEED keeps a shared file mapping's
        data there (the dirty bits move to the page cache); elsewhere it is not relied on."""
        if not _DROP_PTES or length <= 0:
            return
        try:
            mm.madvise(mmap.MADV_DONTNEED, start, length)
        except (OSError, ValueError, AttributeError):
            pass                # a hint: the sync that follows is what counts

    def sync_written(self, kernels, mm, path, start, end):
        """Make mm[start:end) durable, the bytes of a file only appended to: unmap_written of
        the range's whole pages below the one holding `end`, then sync_mapped of the range,
        SYNC_CHUNK bytes at a time where the backend syncs a range (see SYNC_CHUNK).

        With a backend exporting sync_written (an msync of the mapping), both are one call per
        chunk that releases the GIL once. Between two calls the syncing thread takes the GIL
        back, and waits for whichever producer holds it (a put_messages of 1 000 holds it for
        a quarter of a millisecond and more): with SYNC_FLUSH that wait lies on the path of
        every put the sync serves, and its syncs are far below a chunk. A subclass that hooks
        either step (fault injection) gets both calls, chunk by chunk."""
        fused = getattr(kernels, "sync_written", None)
        ranged = getattr(kernels, "SYNC_RANGE_FD_UNUSED", False)
        cls = type(self)
        fuse = (fused is not None and ranged and cls.unmap_written is FileSystem.unmap_written
                and cls.sync_mapped is FileSystem.sync_mapped)
        lo = start
        while lo < end:
            # Chunks end on multiples of SYNC_CHUNK, so on page boundaries. Without a ranged
            # sync (the pure backend's fdatasync), any call syncs the whole file: one call.
            hi = min(end, lo - lo % self.SYNC_CHUNK + self.SYNC_CHUNK) if ranged else end
            if fuse:
                fused(mm, lo, hi - lo, _DROP_PTES)
            else:
                page = lo - lo % OS_PAGE_SIZE
                self.unmap_written(mm, page, hi - hi % OS_PAGE_SIZE - page)
                self.sync_mapped(kernels, mm, path, lo, hi - lo)
            lo = hi

    def write_behind(self, kernels, path, start, end):
        """Write [start, end) of the file at `path` back to the disk, SYNC_CHUNK bytes at a
        time with two in flight, and wait for it, without making it durable (the backend's
        write_behind: no metadata, no device cache flush); the sync_written that follows then
        finds clean pages and makes them durable. True once written; False where the backend
        or the system has no write_behind, or the call failed: the sync that follows writes
        them, and reports a write-back error itself, on the mapping's own file."""
        fn = getattr(kernels, "write_behind", None)
        if fn is None or end <= start:      # nothing to write, or no way to: the sync does it
            return False
        try:
            fd = open_nofollow(path, os.O_RDONLY)
        except OSError:
            return False
        try:
            return fn(fd, start, end - start, self.SYNC_CHUNK)
        except OSError:
            return False
        finally:
            os.close(fd)

    def sync_mapped(self, kernels, mm, path, start, length):
        """Make mm[start:start+length] of the file at `path` durable (the kernel's msync, or
        fdatasync on the file for the pure backend). Fault-injecting doubles hook here."""
        if getattr(kernels, "SYNC_RANGE_FD_UNUSED", False):
            kernels.sync_range(mm, -1, start, length)       # an msync: no descriptor needed
            return
        fd = open_nofollow(path, os.O_RDWR)
        try:
            kernels.sync_range(mm, fd, start, length)
        finally:
            os.close(fd)

    def sync_filesystem(self, path):
        """Make every file of the file system holding `path` durable in one call (Linux's
        syncfs): the data of files written through mappings, their metadata, one journal
        commit and one cache flush. True once done; False where there is no syncfs, and the
        caller syncs file by file. OSError when write-back failed (Linux 5.8+ reports it).

        Thousands of ConsumeQueue files synced one msync each cost a journal commit check and
        a device cache flush per file: about 1 ms each on ext4, 24 s to shut down a store of
        10 000 queues. One syncfs covers them all."""
        if _syncfs is None:
            return False
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            if _syncfs(fd) != 0:           # ctypes releases the GIL for the call
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), path)
        finally:
            os.close(fd)
        return True

    def drop_cached(self, path):
        """Evict the file's clean cached pages (posix_fadvise DONTNEED) so the next reader
        reads what the disk holds; nothing where there is no fadvise. After a failed sync: the
        kernel marks the pages it could not write clean and may keep them, and a recovery
        reading those would find records the disk does not hold. Pages a mapping still holds
        (another process's) stay."""
        self.drop_cached_range(path, 0, 0)

    def drop_cached_range(self, path, start, length):
        """Evict the clean cached pages of [start, start+length) of the file at `path`
        (posix_fadvise DONTNEED; length 0: to the end); nothing where there is no fadvise.
        Pages still mapped somewhere, or dirty, stay (the kernel skips them)."""
        advise = getattr(os, "posix_fadvise", None)
        if advise is None:
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            advise(fd, start, length, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def sync_checkpoint(self, mm, path):
        """Make the small checkpoint mapping durable with the GIL released: fdatasync of its
        file, which writes the pages dirtied through the mapping as msync does. mmap.flush
        (msync) holds the GIL, and on ext4 it waits for the inode's buffer and a device cache
        flush behind whatever the disk is writing: 61 ms once in a sustained run, the putter
        and every other thread of the process waiting with it."""
        sync = getattr(os, "fdatasync", None)
        if sync is None:                # no fdatasync (macOS): the mapping's own msync
            mm.flush()
            return
        fd = self.open_fd(path)
        try:
            sync(fd)
        finally:
            self.close_fd(fd)

    def open_fd(self, path, writable=True):
        return open_nofollow(path, os.O_RDWR) if writable else os.open(path, os.O_RDONLY)

    def close_fd(self, fd):
        os.close(fd)

    def pwrite(self, fd, data, pos, path):
        """Write all of `data` at `pos` of `fd`, the open file at `path` (the HA slave's
        CommitLog writes). OSError when the file refuses them."""
        with memoryview(data) as mv:
            done = 0
            while done < len(mv):
                with mv[done:] as rest:
                    n = os.pwrite(fd, rest, pos + done)
                if n <= 0:
                    raise OSError(errno.EIO, "pwrite wrote nothing", path)
                done += n

    def splice(self, pipe_fd, fd, count, pos, path):
        """Move `count` bytes waiting in the pipe `pipe_fd` into `fd`, the open file at `path`,
        at `pos`, all of them (Linux splice(2)): the page cache copies them straight from the
        pipe's pages, which for a pipe filled from a socket are the received buffers, so
        nothing passes through user space (the HA slave's CommitLog writes, doc/05 §4).
        OSError when the file refuses them (EINVAL: its file system cannot splice), with part
        of them possibly written and the rest left in the pipe."""
        done = 0
        while done < count:
            n = os.splice(pipe_fd, fd, count - done, offset_dst=pos + done)
            if n <= 0:
                raise OSError(errno.EIO, "splice wrote nothing", path)
            done += n

    def fsync_dir(self, path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, path):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass

    def remove_dir_if_empty(self, path):
        try:
            os.rmdir(path)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.ENOENT, errno.EEXIST):
                raise

    def rename(self, src, dst):
        os.replace(src, dst)

    def read_bytes(self, path):
        with open(path, "rb") as f:
            return f.read()

    def read_at(self, path, offset, length):
        """Up to `length` bytes of `path` from `offset` (fewer at its end), read with pread:
        a hole reads as zeros, where reading it through a mapping allocates it on tmpfs and,
        on a full one, kills the reader with SIGBUS."""
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def write_bytes(self, path, data, sync=True):
        fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def lock(self, path):
        """Take the store's lock file: an exclusive lock on bytes [0,1) of `path`, as
        FileChannel.tryLock(0, 1, false) takes it (so a Java broker and rocketstore exclude
        each other), then write the broker's 4 bytes "lock". Returns a handle for unlock();
        StoreLockedError when this or another process holds it."""
        # The lock is taken before anything else is checked: a planted link must not get the
        # "lock" bytes written through it.
        fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with _held_mutex:
            if key in _held:
                _held[key].append(fd)       # closed by the holder's unlock (see _held)
                raise StoreLockedError(f"{path} is locked by another MessageStore in this "
                                       "process")
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except OSError:
                os.close(fd)
                raise StoreLockedError(f"{path} is locked by another process: the store is "
                                       "already open") from None
            _held[key] = []
        try:
            os.pwrite(fd, b"lock", 0)
            os.fsync(fd)
        except BaseException:
            self.unlock((fd, key))
            raise
        return fd, key

    def unlock(self, handle):
        fd, key = handle
        with _held_mutex:
            try:
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
            finally:
                os.close(fd)
                for other in _held.pop(key, ()):
                    os.close(other)

    def lock_holder(self, path):
        """(the file exists, the pid holding its lock or 0, or None when it cannot tell).
        F_GETLK only asks: taking the lock, even briefly, could fail a broker starting then."""
        if not os.path.exists(path):
            return False, None
        # Under the mutex: no lock() of this process takes the file between the open and the
        # close, which would drop it (see _held).
        with _held_mutex:
            if _held_key(path) in _held:
                return True, os.getpid()        # locked here: no descriptor opened at all
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                return True, None
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) in _held:
                    # Locked by this process (the file was replaced since the check above),
                    # which F_GETLK does not report; the descriptor stays open until unlock().
                    _held[(st.st_dev, st.st_ino)].append(fd)
                    fd = -1
                    return True, os.getpid()
                query = _Flock(l_type=fcntl.F_WRLCK, l_whence=os.SEEK_SET, l_start=0, l_len=1)
                answer = _Flock.from_buffer_copy(fcntl.fcntl(fd, fcntl.F_GETLK, bytes(query)))
                return True, (0 if answer.l_type == fcntl.F_UNLCK else answer.l_pid)
            except (OSError, ValueError):
                return True, None
            finally:
                if fd >= 0:
                    os.close(fd)

    def disk_usage_ratio(self, path):
        """UtilAll#getDiskPartitionSpaceUsedPercent: used / (used + usable), rounded up to a
        whole percent, as a fraction; -1 on error (callers treat that as full)."""
        try:
            st = os.statvfs(path)
        except OSError:
            return -1.0
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        entire = used + st.f_bavail * st.f_frsize
        if entire <= 0:
            return -1.0
        return -(-used * 100 // entire) / 100


def mappings_hold_descriptors(kernels):
    """True when FileSystem.map with these kernels keeps a descriptor per mapping (mmap.mmap
    before Python 3.13), so a store needs one per queue file."""
    return getattr(kernels, "Mapping", None) is None and not _NO_TRACKFD


def raise_fd_limit(want=1 << 20):
    """For mappings that hold descriptors (see mappings_hold_descriptors): a broker-sized
    store maps one file per queue (RocketMQ keeps a FileChannel per file and asks for
    ulimit -n 655350). Lift the soft limit to the hard one, and the hard one too where we
    may (root). Returns the soft limit now in force."""
    try:
        import resource
    except ImportError:         # not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for new_soft, new_hard in ((want, want), (hard, hard)):
        if hard != resource.RLIM_INFINITY and new_hard < hard:
            continue
        try:
            if new_soft > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, new_hard))
                break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


DEFAULT = FileSystem()
