# SPDX-License-Identifier: Apache-2.0
"""Test helpers shared by tests/ and bench/: the backend parameter and a store factory.

It ships in the wheel (the installed suite uses it) but imports pytest only when a helper that
reports through pytest runs, so importing it never needs pytest.

ROCKETSTORE_EXPECT_BACKENDS=cext,cffi,pure (set by .ci/run) turns a backend that fails to
import into a test failure instead of a silently shorter matrix.
"""
import contextlib
import os
import subprocess
import zlib

from . import kernels
from .clock import StepClock
from .config import StoreConfig
from .store import MessageStore
from .workload import wait_dispatched  # noqa: F401  (shared with bench/ and rocketstore bench)

ALL_BACKENDS = ("cext", "cffi", "pure")


def expected_backends():
    raw = os.environ.get("ROCKETSTORE_EXPECT_BACKENDS", "")
    return [b.strip() for b in raw.split(",") if b.strip()]


def backend_params():
    """Every backend that should be tested: those expected plus those that import."""
    names = set(kernels.available()) | set(expected_backends())
    return [b for b in ALL_BACKENDS if b in names]


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
    they hold a pid, or say only how the store was closed)."""
    import hashlib
    out = {}
    for d, _, names in os.walk(root):
        for name in names:
            if name in ignore:
                continue
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def wait_until(cond, timeout=10.0, what="the condition"):
    """Poll `cond()` until it is true; AssertionError naming `what` after `timeout` s. The
    timeout is a hang guard, never a speed claim: shared CI machines stall for seconds."""
    import time
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.002)


def wait_flushed(store, timeout=5.0):
    """Block until the flush service has flushed every full CommitLog file (cleaning never
    deletes past the flushed offset)."""
    import time
    deadline = time.monotonic() + timeout
    mfq = store.commitlog.mfq
    while mfq.flushed_where < mfq.last_file.file_from_offset:
        if time.monotonic() > deadline:
            raise AssertionError("the flush service did not catch up")
        time.sleep(0.001)


def resident_bytes(path):
    """Bytes of this process's mappings of the file `path`, or of files under the directory
    `path`, that are in memory (Rss in /proc/self/smaps): what populating or touching them
    brought in."""
    real = os.path.realpath(path)
    prefix = real.rstrip(os.sep) + os.sep
    rss = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                inside = len(head) >= 6 and (head[5] == real or head[5].startswith(prefix))
            elif inside and head[0] == "Rss:":
                rss += int(head[1]) * 1024
    return rss


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
