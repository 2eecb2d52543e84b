# SPDX-License-Identifier: Apache-2.0
"""Test helpers shared by tests/ and bench/: the backend parameter and a store factory.

It ships in the wheel (the installed suite uses it) but imports pytest only when a helper that
reports through pytest runs, so importing it never needs pytest.

ROCKETSTORE_EXPECT_BACKENDS=cext,cffi,pure (set by .ci/run) turns a backend that fails to
import into a test failure instead of a silently shorter matrix. ROCKETSTORE_TEST_BACKENDS
narrows the matrix to the backends it names; ROCKETSTORE_SOAK=1 runs the long fault tests on
every backend (fault_backends).
"""
import contextlib
import ctypes
import errno
import mmap
import os
import subprocess
import threading
import zlib

from . import kernels
from .clock import StepClock
from .config import StoreConfig
from .fs import FileSystem
from .store import MessageStore
from .workload import wait_dispatched  # noqa: F401  (shared with bench/ and rocketstore bench)

ALL_BACKENDS = ("cext", "cffi", "pure")


def _names(var):
    return [b.strip() for b in os.environ.get(var, "").split(",") if b.strip()]


def expected_backends():
    return _names("ROCKETSTORE_EXPECT_BACKENDS")


def backend_params():
    """Every backend that should be tested: those expected plus those that import; or exactly
    ROCKETSTORE_TEST_BACKENDS when it is set (scripts/check-wheel tests the wheel's compiled
    backends: its pure backend is the Python the source tree's run already tested)."""
    only = _names("ROCKETSTORE_TEST_BACKENDS")
    unknown = sorted(set(only) - set(ALL_BACKENDS))
    if unknown:
        raise ValueError(f"ROCKETSTORE_TEST_BACKENDS names unknown backends {unknown}; "
                         f"known: {', '.join(ALL_BACKENDS)}")
    names = set(only) or set(kernels.available()) | set(expected_backends())
    return [b for b in ALL_BACKENDS if b in names]


def fault_backends():
    """The backends a long fault test (a real write-back error, a filling disk) runs on: the
    first of backend_params(), or all of them with ROCKETSTORE_SOAK=1. Such a test proves the
    services (flush, fail-stop, recovery), which every backend shares; the backends differ in
    their kernels, which the rest of the suite holds to the same bytes."""
    names = backend_params()
    return names if os.environ.get("ROCKETSTORE_SOAK", "") not in ("", "0") else names[:1]


def load_backend(name):
    """The kernel module, or a test failure (never a skip) when it does not import."""
    try:
        return kernels.load(name)
    except ImportError as exc:
        import pytest
        pytest.fail(f"backend {name!r} is expected but does not import: {exc}")


def fixed_seed(name):
    """A random seed that is the same on every run, unlike hash() of a str (PYTHONHASHSEED),
    and printed, so that a failing kill schedule can be replayed: ROCKETSTORE_SEED overrides it."""
    seed = int(os.environ.get("ROCKETSTORE_SEED") or zlib.crc32(name.encode()))
    print(f"seed for {name}: {seed} (replay with ROCKETSTORE_SEED={seed})")
    return seed


def small_config(**overrides):
    """A config with small files so tests roll files quickly."""
    base = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=100 * 20,
                max_index_num=500, max_hash_slot_num=64, prefault_next_file=True)
    base.update(overrides)
    return StoreConfig(**base)


def open_store(root, backend, config=None, clock=None, **kwargs):
    """A loaded and started store on `root` with a deterministic clock."""
    store = MessageStore(root, config or small_config(), clock=clock or StepClock(),
                         kernels=backend, **kwargs)
    store.load()
    store.start()
    return store


def run_cli(*args, check=False):
    """`python -m rocketstore ARGS` in a subprocess, as a user runs it (text output)."""
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "rocketstore", *args], capture_output=True,
                          text=True, check=check)


def tree_digest(root, ignore=()):
    """SHA-256 of every file under `root`, keyed by its path relative to `root`, leaving out
    the file names in `ignore` (comparing two stores' bytes, leave out "lock" and "abort":
    they hold a pid, or say only how the store was closed). A running store's runtime file
    (stats.RUNTIME_FILE, rewritten every second) is never part of its bytes."""
    import hashlib
    from .stats import RUNTIME_FILE
    out = {}
    for d, _, names in os.walk(root):
        for name in names:
            if name in ignore or name in (RUNTIME_FILE, RUNTIME_FILE + ".tmp"):
                continue
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def damage_seeds(share=1):
    """How many random-damage seeds (damage_at_random) a test runs: ROCKETSTORE_CORRUPTION_SEEDS
    (40 by default; a soak sets thousands), divided by `share` for a test whose seed costs
    more, at least one."""
    return max(1, int(os.environ.get("ROCKETSTORE_CORRUPTION_SEEDS", "40")) // share)


def damage_at_random(root, rng):
    """Damage the store at `root` as a failing disk or a careless operator might, driven by
    `rng` (random.Random): one to four of its files (the lock file aside) each cut to a random
    length, or given 1-20 flipped bits; half the time an `abort` file as a crash leaves. The
    corruption tests' model: a seed names one damage, so a failure replays from its seed.
    Returns the paths damaged."""
    files = []
    for d, _, names in os.walk(root):
        for name in names:
            if name not in ("lock",):
                files.append(os.path.join(d, name))
    victims = rng.sample(files, k=min(len(files), rng.randint(1, 4)))
    for path in victims:
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            if rng.random() < 0.3 and size:
                f.truncate(rng.randrange(size))
            else:
                for _ in range(rng.randint(1, 20)):
                    if size == 0:
                        break
                    pos = rng.randrange(size)
                    f.seek(pos)
                    byte = f.read(1)
                    f.seek(pos)
                    f.write(bytes([byte[0] ^ (1 << rng.randrange(8))]))
    if rng.random() < 0.5:
        open(os.path.join(root, "abort"), "wb").close()
    return victims


def wait_until(cond, timeout=10.0, what="the condition"):
    """Poll `cond()` until it is true; AssertionError naming `what` after `timeout` s. The
    timeout is a hang guard, never a speed claim: shared CI machines stall for seconds."""
    import time
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.002)


def file_system_type(path):
    """The type of the file system holding `path` (the longest mount point above it), from
    /proc/self/mounts; "" where there is none."""
    if not os.path.exists("/proc/self/mounts"):
        return ""
    real = os.path.realpath(path)
    best, kind = "", ""
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            point = fields[1].replace("\\040", " ")
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) > len(best):
                best, kind = point, fields[2]
    return kind


def runs_during(call):
    """(call()'s result, whether another Python thread ran while it ran): a thread waiting
    for the GIL records perf_counter stamps, and with a switch interval far longer than the
    call, it can only run inside the call if the call releases the GIL."""
    import sys
    import time
    switch = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        stamps, go = [], threading.Event()

        def spin():
            go.wait()
            end = time.perf_counter() + 0.05
            while (now := time.perf_counter()) < end:
                stamps.append(now)
        t = threading.Thread(target=spin)
        t.start()
        go.set()                # from here the spinner waits for the GIL this thread holds
        t0 = time.perf_counter()
        result = call()
        t1 = time.perf_counter()
        t.join()
        return result, any(t0 < s < t1 for s in stamps)
    finally:
        sys.setswitchinterval(switch)


# The store calls that read or write files, sync, or wait: an event loop must never run them
# itself (the asyncio API hands them to the loop's executor).
BLOCKING_CALLS = ("put_message", "put_messages", "put_batch", "get_message", "get_batch",
                  "query_message", "look_message_by_offset", "flush")


def run_guarded_loop(coro, stall_s=1.0):
    """Run `coro` to completion on a new debug event loop and fail (AssertionError) if any of
    BLOCKING_CALLS of a MessageStore or LiveReader ran on the loop's thread, or if a loop step
    took longer than `stall_s`. The first check is exact and does not depend on the machine's
    load; the second is a guard against a step that blocks for long (a loaded machine can
    stretch an honest step to tens of ms, so it is no speed claim)."""
    import asyncio
    import functools
    import logging
    from .live import LiveReader
    loop_thread = threading.get_ident()
    on_loop = []
    saved = []
    for cls in (MessageStore, LiveReader):
        for name in BLOCKING_CALLS:
            fn = cls.__dict__.get(name)
            if fn is None:
                continue

            @functools.wraps(fn)
            def guarded(*args, _fn=fn, _name=f"{cls.__name__}.{name}", **kwargs):
                if threading.get_ident() == loop_thread:
                    on_loop.append(_name)
                return _fn(*args, **kwargs)
            saved.append((cls, name, fn))
            setattr(cls, name, guarded)

    slow = []

    class _Slow(logging.Handler):
        def emit(self, record):
            if "took" in record.getMessage():
                slow.append(record.getMessage())
    handler = _Slow(logging.WARNING)
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addHandler(handler)
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = stall_s
    try:
        result = loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
        finally:
            asyncio_log.removeHandler(handler)
            for cls, name, fn in saved:
                setattr(cls, name, fn)
    assert on_loop == [], f"store calls ran on the event loop's thread: {on_loop}"
    assert slow == [], slow
    return result


class FixedDiskUsage:
    """An injected disk-usage source (StoreConfig's disk_usage hook): the used fraction every
    path reports, which the test sets."""

    def __init__(self, ratio=0.2):
        self.ratio = ratio

    def __call__(self, path):
        return self.ratio


def read_queue(store, topic, queue_id=0, batch=32):
    """Every message of a queue from its minimum offset, pulling batch after batch."""
    out, offset = [], store.get_min_offset_in_queue(topic, queue_id)
    while True:
        g = store.get_message("g", topic, queue_id, offset, batch)
        if not g.messages:
            return out
        out.extend(g.messages)
        offset = g.next_begin_offset


def commitlog_names(commitlog):
    """A CommitLog's file names, oldest first."""
    return [f.file_name for f in commitlog.mfq.files]


def wait_flushed(commitlog, timeout=5.0):
    """Block until the flush service has flushed every full file of `commitlog` (cleaning
    never deletes past the flushed offset)."""
    import time
    deadline = time.monotonic() + timeout
    mfq = commitlog.mfq
    while mfq.last_file is not None and mfq.flushed_where < mfq.last_file.file_from_offset:
        if time.monotonic() > deadline:
            raise AssertionError("the flush service did not catch up")
        time.sleep(0.001)


def cached_bytes(path):
    """Bytes of the file `path` in the page cache (mincore on a fresh read-only mapping, which
    reports page-cache residency, whoever brought the pages in): what a populate, a fault or
    its readahead read or zero-filled. Linux; 0 for an empty file."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap of " + path)
        try:
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore of " + path)
            return sum(b & 1 for b in vec.raw) * mmap.PAGESIZE
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def _smaps_field(path, field, whole_dir=False):
    """The values of `field` (its words after the name) in each of this process's mappings
    of the file `path`, or with whole_dir of files under the directory `path`
    (/proc/self/smaps), one list per mapping."""
    real = os.path.realpath(path)
    prefix = real.rstrip(os.sep) + os.sep
    found = []
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                inside = len(head) >= 6 and (
                    head[5] == real or whole_dir and head[5].startswith(prefix))
            elif inside and head[0] == field:
                found.append(head[1:])
    return found


def _smaps_bytes(path, field):
    """The sum of `field` (a size in kB) over this process's mappings of the file `path` or
    of files under the directory `path`, in bytes."""
    return sum(int(kb) * 1024 for kb, *_ in _smaps_field(path, field, whole_dir=True))


def resident_bytes(path):
    """Bytes of this process's mappings of the file `path`, or of files under the directory
    `path`, that are in memory (Rss in /proc/self/smaps): what populating or touching them
    brought in."""
    return _smaps_bytes(path, "Rss:")


def pmd_mapped_bytes(path):
    """Bytes of this process's mappings of the file `path`, or of files under the directory
    `path`, mapped by 2 MiB page-table entries (FilePmdMapped in /proc/self/smaps): the
    page-cache folios of that size a read maps whole, one TLB entry each. Whether the kernel
    made such folios depends on the free memory it had in 2 MiB blocks when they were filled."""
    return _smaps_bytes(path, "FilePmdMapped:")


def mapping_flags(path):
    """The VmFlags of each of this process's mappings of the file `path` (/proc/self/smaps),
    one set per mapping: "hg" marks a mapping advised MADV_HUGEPAGE, "rr" MADV_RANDOM."""
    return [set(flags) for flags in _smaps_field(path, "VmFlags:")]


@contextlib.contextmanager
def tmpfs(mountpoint, size):
    """A real small file system (tmpfs of `size`, e.g. "16m") mounted at `mountpoint` for the
    block: full-disk tests need the kernel's ENOSPC and SIGBUS, not a double. Needs root."""
    os.makedirs(mountpoint, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
                   check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=True)


class FaultInjectingFileSystem(FileSystem):
    """A FileSystem double for fault tests, after LevelDB's FaultInjectionTestEnv.

    - `fail(op, err, match, times)` makes an operation raise OSError(err) for the paths
      `match` accepts (a substring or a predicate; all paths by default), `times` times or
      until `heal()`. The operations are the FileSystem methods that can meet a full or
      failing disk: create, map (writable), reserve, sync (sync_mapped, sync_checkpoint,
      sync_filesystem, fsync_dir), write (write_bytes, pwrite, splice), read (read_bytes,
      map read-only), rename, remove, lock.
    - It keeps, for each file the store writes, the bytes its last sync made durable (the
      first sight of a file that was already there counts as durable). `crash()` is the power
      cut: from then on nothing the process does reaches "the disk" (the calls still work, as
      they would until the process noticed). After the store is shut down or abandoned,
      `drop_unsynced()` rewrites every such file as the cut left it, removes the files made
      after it and restores those removed after it: what a reopen after a power cut finds.

    - A failed sync loses what it was to write, as Linux does ("fsyncgate"): the kernel
      reports a write-back error once and marks the pages clean, so a later sync of them
      succeeds with the bytes never on disk. The pages a failed sync_mapped covered (the
      whole file for sync_checkpoint; for sync_filesystem, every page of a tracked file below
      its path that differs from the durable image) keep their durable bytes at the cut,
      whatever later syncs cover them (`lost` lists them).

    Data only: a file created (or renamed, removed) before the cut is taken to exist (be
    renamed, be gone) after it, as ext4's ordered mode mostly gives; its bytes are what its
    syncs covered, zeros elsewhere, and a write_bytes without sync leaves nothing durable.
    """

    OPS = ("create", "map", "reserve", "sync", "write", "read", "rename", "remove", "lock")
    _GONE = None

    def __init__(self):
        self._faults = []               # [op, errno, match, remaining or None]
        self.injected = {}              # op -> faults raised
        self._durable = {}              # path -> bytearray, or _GONE
        self._made_after_cut = set()
        self._cut = False
        self._mutex = threading.Lock()
        self.lost = {}                  # path -> [(start, end)]: pages a failed sync lost

    # ---- faults ----------------------------------------------------------------------------
    def fail(self, op, err=errno.ENOSPC, match=None, times=None):
        if op not in self.OPS:
            raise ValueError(f"op must be one of {self.OPS}, got {op!r}")
        if match is None:
            test = lambda path: True                            # noqa: E731
        elif callable(match):
            test = match
        else:
            test = lambda path: match in path                   # noqa: E731
        with self._mutex:
            self._faults.append([op, err, test, times])

    def heal(self):
        with self._mutex:
            self._faults.clear()

    def _check(self, op, path):
        with self._mutex:
            for fault in self._faults:
                f_op, err, test, remaining = fault
                if f_op == op and test(path) and (remaining is None or remaining > 0):
                    if remaining is not None:
                        fault[3] -= 1
                    self.injected[op] = self.injected.get(op, 0) + 1
                    raise OSError(err, os.strerror(err), path)

    def _check_sync(self, path, start, end):
        """_check("sync", path); a failed sync loses the pages of [start, end)."""
        try:
            self._check("sync", path)
        except OSError:
            self._lose(path, start, end)
            raise

    def _lose(self, path, start, end):
        page = mmap.PAGESIZE
        start -= start % page
        end += -end % page
        with self._mutex:
            if not self._cut and end > start:
                self.lost.setdefault(path, []).append((start, end))

    # ---- the durable image -----------------------------------------------------------------
    def _seen(self, path):
        """Start tracking `path`: its current bytes are durable (it was there before, and
        nothing tracked has written it since)."""
        if path not in self._durable and path not in self._made_after_cut:
            try:
                with open(path, "rb") as f:
                    self._durable[path] = bytearray(f.read())
            except FileNotFoundError:
                self._durable[path] = self._GONE

    def _made(self, path):
        with self._mutex:
            if self._cut:
                if self._durable.get(path, self._GONE) is self._GONE:
                    self._made_after_cut.add(path)
            elif self._durable.get(path) is self._GONE or path not in self._durable:
                self._durable[path] = bytearray()

    def _synced(self, path, data, start=0):
        with self._mutex:
            if self._cut:
                return
            image = self._durable.get(path)
            if image is None:
                image = self._durable[path] = bytearray()
            end = start + len(data)
            if len(image) < end:
                image.extend(bytes(end - len(image)))
            old = bytes(image[start:end])
            image[start:end] = data
            for lo, hi in self.lost.get(path, ()):
                lo, hi = max(lo, start), min(hi, end)
                if lo < hi:             # lost: the disk keeps what it had
                    image[lo:hi] = old[lo - start:hi - start]

    def crash(self):
        with self._mutex:
            self._cut = True

    def drop_unsynced(self):
        """Leave the files as the power cut left them; call once the store's mappings are
        gone (after shutdown, or after the crashed process's store was abandoned)."""
        with self._mutex:
            for path in self._made_after_cut:
                if os.path.lexists(path):
                    os.remove(path)
            for path, image in self._durable.items():
                if image is self._GONE:
                    if os.path.lexists(path):
                        os.remove(path)
                    continue
                size = len(image)
                if os.path.exists(path):
                    size = max(size, os.path.getsize(path))   # sizing is metadata: it stays
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(image)
                    f.truncate(size)
            self._durable.clear()
            self._made_after_cut.clear()
            self.lost.clear()
            self._cut = False

    # ---- the FileSystem operations ---------------------------------------------------------
    def create_sized(self, path, size, preallocate=False):
        self._check("create", path)
        existed = os.path.lexists(path)
        if existed:
            with self._mutex:
                self._seen(path)
        super().create_sized(path, size, preallocate)
        if not existed:
            self._made(path)

    def map(self, path, size, writable=True, kernels=None):
        self._check("map" if writable else "read", path)
        if writable:
            with self._mutex:
                self._seen(path)
        return super().map(path, size, writable, kernels)

    def reserve(self, path, offset, length):
        self._check("reserve", path)
        return super().reserve(path, offset, length)

    def sync_mapped(self, kernels, mm, path, start, length):
        self._check_sync(path, start, start + length)
        super().sync_mapped(kernels, mm, path, start, length)
        self._synced(path, mm[start:start + length], start)

    def sync_checkpoint(self, mm, path):
        self._check_sync(path, 0, len(mm))
        super().sync_checkpoint(mm, path)
        self._synced(path, mm[:], 0)

    def fsync_dir(self, path):
        self._check("sync", path)
        super().fsync_dir(path)

    def sync_filesystem(self, path):
        # The whole file system: every file tracked so far is durable as it reads now
        # (mapped writes included: read() sees the page cache).
        try:
            self._check("sync", path)
        except OSError:
            self._lose_dirty_below(path)
            raise
        if not super().sync_filesystem(path):
            return False
        with self._mutex:
            paths = [p for p, image in self._durable.items() if image is not self._GONE]
        for p in paths:
            try:
                with open(p, "rb") as f:
                    self._synced(p, f.read())
            except FileNotFoundError:
                pass
        return True

    def _lose_dirty_below(self, root):
        """A failed syncfs of `root`: the pages of the tracked files below it that differ
        from their durable image are lost."""
        root = os.path.join(str(root), "")
        page = mmap.PAGESIZE
        with self._mutex:
            images = [(p, image) for p, image in self._durable.items()
                      if image is not self._GONE and p.startswith(root)]
        for p, image in images:
            try:
                with open(p, "rb") as f:
                    now = f.read()
            except FileNotFoundError:
                continue
            for pos in range(0, len(now), page):
                if now[pos:pos + page] != bytes(image[pos:pos + page]).ljust(
                        min(page, len(now) - pos), b"\0"):
                    self._lose(p, pos, pos + page)

    def pwrite(self, fd, data, pos, path):
        self._check("write", path)
        super().pwrite(fd, data, pos, path)

    def splice(self, pipe_fd, fd, count, pos, path):
        self._check("write", path)
        super().splice(pipe_fd, fd, count, pos, path)

    def write_bytes(self, path, data, sync=True):
        self._check("write", path)
        with self._mutex:
            self._seen(path)
        super().write_bytes(path, data, sync)
        with self._mutex:
            durable = sync and not self._cut
            if durable:
                self._durable[path] = bytearray(data)
        if not durable:
            self._made(path)            # the name exists; its bytes are not durable

    def read_bytes(self, path):
        self._check("read", path)
        return super().read_bytes(path)

    def rename(self, src, dst):
        self._check("rename", dst)
        with self._mutex:
            self._seen(src)
            self._seen(dst)
        super().rename(src, dst)
        with self._mutex:
            if self._cut:
                if src in self._made_after_cut:
                    self._made_after_cut.discard(src)
                    self._made_after_cut.add(dst)
            else:
                self._durable[dst] = self._durable.get(src) or bytearray()
                self._durable[src] = self._GONE

    def remove(self, path):
        self._check("remove", path)
        with self._mutex:
            self._seen(path)
        super().remove(path)
        with self._mutex:
            if not self._cut:
                self._durable[path] = self._GONE

    def lock(self, path):
        self._check("lock", path)
        return super().lock(path)


class FullDisk(FaultInjectingFileSystem):
    """A disk that fills and empties on the test's word: while `full`, operation `op` fails
    with ENOSPC on the paths `match` accepts (as FaultInjectingFileSystem.fail)."""

    def __init__(self, op, match=None, full=True):
        super().__init__()
        self._op, self._match = op, match
        self.full = full

    @property
    def full(self):
        return bool(self._faults)

    @full.setter
    def full(self, full):
        self.heal()
        if full:
            self.fail(self._op, errno.ENOSPC, match=self._match)
