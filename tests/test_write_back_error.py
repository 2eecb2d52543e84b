# SPDX-License-Identifier: Apache-2.0
"""A real write-back error: the fail-stop loses nothing acknowledged.

The store runs in a child (tests/crashers/full_disk.py) on an ext4 whose loop device's backing
file lives on a tmpfs smaller than it: ext4 believes it has room, and once the tmpfs is full
the loop device's writes fail and ext4's write-back reports the error to the store's
msync/fdatasync (ENOSPC or EIO, by kernel). Linux reports it once and marks the pages clean
("fsyncgate"), so the store must stop at the first failed sync (SyncLatch). The parent then
cuts the power: it unmounts the ext4 and detaches the loop device (the pages that failed are
gone with the mount), grows the tmpfs, checks the file system and mounts it again; the store
reopens with abnormal recovery and holds every acknowledged message, exactly.

CI runs these on the default backend; ROCKETSTORE_SOAK=1 runs them on every backend.
"""
import contextlib
import os
import shutil
import signal
import subprocess

import pytest

from rocketstore import testing

from test_full_disk import child, field

MiB = 1 << 20


def run(*argv):
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True)


def _skip_reason():
    if os.geteuid() != 0:
        return "needs root (mount, losetup)"
    for tool in ("losetup", "mkfs.ext4", "e2fsck"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices"
    return None


class FailingDisk:
    """An ext4 of `fs_mib` on a loop device whose backing file lives on a tmpfs of `room_mib`:
    writes past what the tmpfs holds fail under ext4, which believes it has room."""

    def __init__(self, base, room_mib=24, fs_mib=1024):
        self.tmpfs = base / "backing"
        self.mnt = base / "ext4"
        self.image = self.tmpfs / "image"
        self.fs_mib = fs_mib
        self.loop = None
        self.mounted = False
        os.makedirs(self.mnt)
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(testing.tmpfs(self.tmpfs, f"{room_mib}m"))

    def attach(self):
        self.loop = run("losetup", "-f", "--show", self.image).stdout.strip()
        # The loop driver ends a write request the backing file took only part of (a short
        # write: the tmpfs filled half-way) as a success, and the rest never lands: an
        # msync that returned 0 would have lost bytes, whatever the store does. With 4 KiB
        # blocks and requests of one page, a request is one tmpfs page, written whole or not
        # at all (ENOSPC, reported to the sync).
        with open(f"/sys/block/{os.path.basename(self.loop)}/queue/max_sectors_kb", "w") as f:
            f.write("4")

    def detach(self):
        if self.mounted:
            subprocess.run(["umount", str(self.mnt)], capture_output=True)
            if os.path.ismount(self.mnt):
                run("umount", "-l", self.mnt)
            self.mounted = False
        if self.loop is not None:
            run("losetup", "-d", self.loop)
            self.loop = None

    def mount(self):
        run("mount", "-t", "ext4", self.loop, self.mnt)
        self.mounted = True

    def __enter__(self):
        try:
            with open(self.image, "wb") as f:
                f.truncate(self.fs_mib * MiB)
            self.attach()
            # Everything ext4 keeps (inode tables, journal) written now, not lazily later,
            # and kept small (about 5 MiB of the tmpfs). The file system is much larger than
            # its room so that an ASYNC_FLUSH store, which writes faster than it syncs, meets
            # the failed sync before a full ext4.
            run("mkfs.ext4", "-q", "-b", "4096", "-N", "1024", "-J", "size=4",
                "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", self.loop)
            self.mount()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        try:
            self.detach()
        finally:
            self._stack.close()

    def power_cut_then_room(self, room_mib):
        """What a reopen after a power cut finds, on a disk with room again: the mount and
        the loop device go (with whatever never reached the backing file), the tmpfs grows,
        e2fsck repairs what the failed writes left, and the file system is mounted again."""
        self.detach()
        with contextlib.suppress(OSError):
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        run("mount", "-o", f"remount,size={room_mib}m", self.tmpfs)
        self.attach()
        fsck = subprocess.run(["e2fsck", "-fy", self.loop], capture_output=True, text=True)
        assert fsck.returncode in (0, 1, 2), fsck.stdout + fsck.stderr   # 1, 2: repaired
        self.mount()


@pytest.fixture
def failing_disk(tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    with FailingDisk(tmp_path) as disk:
        yield disk


def put_until_refused(backend, root, kill, sync=True):
    # An ASYNC_FLUSH store writes into the page cache much faster than its flusher's
    # msync, which is where the failure shows, gets through the full tmpfs: it may write a
    # few hundred MiB (the ext4 has 1 GiB) before the first put is refused.
    lines = child(backend, "put", root, *(["--sync"] if sync else ["--max", 600_000]),
                  *(["--kill"] if kill else []),
                  returncode=-signal.SIGKILL if kill else 0)
    acks = [x["ack"] for x in lines if "ack" in x]
    refusals = [x for x in lines if "refused" in x]
    assert kill or lines[-1] == {"shutdown": "ok"}, lines[-5:]
    return acks, refusals


def reopen_after_power_cut(backend, disk, root, sync=True):
    """The power cut, then a reopen on a disk with room: abnormal recovery ran, the store
    takes a new put, every record reads back with its exact body, the checkpoint (as the
    cut left it) vouches for no record that was lost, and the queues hold exactly what the
    CommitLog holds. Returns the ids the CommitLog holds before the new
    put, in order."""
    disk.power_cut_then_room(128)
    lines = child(backend, "check", root, "--start", 900_000, "--room",
                  *(["--sync"] if sync else []))
    assert field(lines, "load_error") is None, lines
    assert field(lines, "recovered")["recovered"]["normal"] is False
    assert field(lines, "put")["put"] == "PUT_OK", lines
    found = field(lines, "walk")
    walk, stored = found["walk"], found["stored"]
    # The walk reads the records in order, CRC-checked, and the child compares each body
    # with the one put under its id: messages 0..k, then the reopened store's own put.
    assert walk[:-1] == list(range(len(walk) - 1)) and walk[-1] == 900_000
    assert field(lines, "queues")["queues"] == sorted(walk)
    # physicMsgTimestamp is the store time of the last record a successful sync covered:
    # never later than the last record that survived (recovery would trust lost bytes).
    last_kept = stored[-2] if len(walk) > 1 else 0
    assert field(lines, "checkpoint_physic")["checkpoint_physic"] <= last_kept
    return walk[:-1]


def refused_for_a_failed_sync(refusals):
    """The first refused put met the failed sync (its own: FLUSH_DISK_TIMEOUT), or came after
    it; every later put is refused before it is written, naming the failure."""
    assert refusals, "the store never met the write-back error"
    first, *later = refusals
    assert first["refused"] in ("FLUSH_DISK_TIMEOUT", "SERVICE_NOT_AVAILABLE"), first
    for r in later:
        assert r["refused"] == "SERVICE_NOT_AVAILABLE", r
        assert "sync failed" in r["reason"] or "write error" in r["reason"], r


@pytest.mark.slow
@pytest.mark.parametrize("kill", [True, False], ids=["killed", "shut_down"])
@pytest.mark.parametrize("name", testing.fault_backends())
def test_write_back_error_stops_puts_and_a_power_cut_loses_nothing_acknowledged(
        failing_disk, name, kill):
    """SYNC_FLUSH: a put is acknowledged (PUT_OK) only once a sync covered it."""
    root = failing_disk.mnt / "store"
    acks, refusals = put_until_refused(name, root, kill)
    assert len(acks) > 100 and acks == list(range(len(acks)))
    refused_for_a_failed_sync(refusals)
    # The store stopped at the failed sync: shutdown too keeps the abort file.
    assert (root / "abort").exists()
    kept = reopen_after_power_cut(name, failing_disk, root)
    # Every acknowledged message is there. (Refused ones may be too: their sync failed,
    # not their write, and their pages may have reached the disk before it filled.)
    assert kept[:len(acks)] == acks


@pytest.mark.slow
@pytest.mark.parametrize("name", testing.fault_backends())
def test_write_back_error_with_async_flush_recovers_what_synced_and_no_more(
        failing_disk, name):
    """ASYNC_FLUSH: puts are acknowledged before any sync, so a power cut may take the
    newest; what recovery keeps is a prefix of them, whole, and the checkpoint does not
    vouch past it."""
    root = failing_disk.mnt / "store"
    acks, refusals = put_until_refused(name, root, kill=True, sync=False)
    assert len(acks) > 100 and acks == list(range(len(acks)))
    refused_for_a_failed_sync(refusals)
    kept = reopen_after_power_cut(name, failing_disk, root, sync=False)
    assert kept == acks[:len(kept)] and len(kept) > 100


@pytest.mark.slow
@pytest.mark.parametrize("name", testing.fault_backends())
def test_killed_after_a_write_back_error_a_reopen_reads_the_disk_not_the_cached_pages(
        failing_disk, name):
    """Killed after a failed sync, the store leaves the pages the kernel could not write
    cached and marked clean. A reopen on the same boot (the disk given room, no power cut)
    must recover from what the disk holds: recovering from those pages, it would take
    records the disk does not hold and write its next acknowledged put behind them, and
    that put would be lost at the next power cut."""
    root = failing_disk.mnt / "store"
    acks, refusals = put_until_refused(name, root, kill=True)
    refused_for_a_failed_sync(refusals)
    run("mount", "-o", "remount,size=128m", failing_disk.tmpfs)
    lines = child(name, "check", root, "--start", 900_000, "--room", "--sync")
    assert field(lines, "load_error") is None, lines
    assert field(lines, "recovered")["recovered"]["normal"] is False
    assert field(lines, "put")["put"] == "PUT_OK", lines
    reopened = field(lines, "walk")["walk"]
    assert reopened[:len(acks)] == acks and reopened[-1] == 900_000
    failing_disk.power_cut_then_room(128)
    lines = child(name, "check", root, "--start", 900_001, "--room", "--sync")
    assert field(lines, "put")["put"] == "PUT_OK", lines
    # What the reopen recovered was on the disk: its acknowledged put is still there, right
    # after it, and the next open's put follows.
    assert field(lines, "walk")["walk"] == reopened + [900_001]
