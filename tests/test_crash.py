# SPDX-License-Identifier: Apache-2.0
"""Crash injection: a writer in a subprocess is SIGKILLed at random moments; the parent reopens
the store (abnormal recovery) and checks what each flush mode promises.

`process` mode: a killed process loses nothing that reached the page cache, so every
acknowledged message survives in every mode except the transient store pool, which keeps a
clean prefix. `power` mode also throws away every byte not synced before the kill (each page
after the last sync is dropped or kept at random, as a power cut leaves them): SYNC_FLUSH loses
nothing acknowledged, ASYNC_FLUSH keeps a clean prefix. ROCKETSTORE_CRASH_CYCLES sets the number
of kills per mode (default 20; the soak is 1000).
"""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from rocketstore import MessageStore, testing

from crashers.writer import crash_config, message

WRITER = os.path.join(os.path.dirname(__file__), "crashers", "writer.py")
CYCLES = int(os.environ.get("ROCKETSTORE_CRASH_CYCLES", "20"))
PAGE = 4096


def run_and_kill(root, mode, backend, start, rng, durability_log=None, count=None):
    """Kill the writer at a random moment, or once it has put `count` messages."""
    cmd = [sys.executable, WRITER, str(root), "--mode", mode, "--backend", backend,
           "--start", str(start)]
    if durability_log:
        cmd += ["--durability-log", str(durability_log)]
    if count is not None:
        cmd += ["--count", str(count)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done = []
    try:
        line = proc.stdout.readline()
        assert line == b"ready\n", proc.stderr.read().decode()[-2000:]
        if count is None:
            time.sleep(rng.uniform(0.0, 0.25))
        else:
            for line in iter(proc.stdout.readline, b""):
                if line == b"done\n":
                    break
                done.append(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
    acks = []
    for raw in b"".join(done).decode().splitlines() + out.decode().splitlines():
        parts = raw.split()
        if len(parts) == 6 and parts[0] == "ack":       # the last line may be cut short
            acks.append(tuple(int(p) for p in parts[1:]))
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    return acks


def snapshot(root):
    """The bytes of every data file: all durable, since the parent shut the store down."""
    files = {}
    for sub in ("commitlog", "consumequeue"):
        for d, _, names in os.walk(root / sub):
            for name in names:
                with open(os.path.join(d, name), "rb") as f:
                    files[os.path.join(d, name)] = f.read()
    ckpt = root / "checkpoint"
    files[str(ckpt)] = ckpt.read_bytes() if ckpt.exists() else b""
    return files


def cut_power(root, before, durability_log, rng):
    """Undo what no completed sync covered. A page that a sync covered keeps its new bytes;
    any other changed page keeps them or reverts to its old bytes at random, as writeback
    may or may not have reached it; the checkpoint reverts to its last synced bytes."""
    synced = {}
    checkpoint = None
    if os.path.exists(durability_log):
        with open(durability_log) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 4 and parts[0] == "sync":
                    pages = synced.setdefault(parts[1], set())
                    a, b = int(parts[2]), int(parts[3])
                    pages.update(range(a // PAGE, (b + PAGE - 1) // PAGE))
                elif len(parts) == 3 and parts[0] == "ckpt":
                    checkpoint = bytes.fromhex(parts[2])
        os.remove(durability_log)
    for sub in ("commitlog", "consumequeue"):
        for d, _, names in os.walk(root / sub):
            for name in names:
                path = os.path.join(d, name)
                with open(path, "r+b") as f:
                    now = f.read()
                    old = before.get(path, b"").ljust(len(now), b"\0")
                    durable = synced.get(path, set())
                    for p in range(0, (len(now) + PAGE - 1) // PAGE):
                        lo, hi = p * PAGE, min(len(now), (p + 1) * PAGE)
                        if p in durable or now[lo:hi] == old[lo:hi] or rng.random() < 0.5:
                            continue
                        f.seek(lo)
                        f.write(old[lo:hi])
    ckpt = root / "checkpoint"
    if ckpt.exists():
        restore = checkpoint if checkpoint is not None else before.get(str(ckpt), b"")
        with open(ckpt, "r+b") as f:
            f.write(restore[:40].ljust(40, b"\0"))


def check_store(root, backend, mode, acks, must_keep_all):
    store = MessageStore(root, crash_config(mode), kernels=backend)
    store.load()
    assert not store.recovery_report.normal           # the abort file forced recovery
    store.start()
    try:
        testing.wait_dispatched(store)
        present = []
        for index, offset, size, qoff, put_ok in acks:
            expected = message(index)
            m = store.look_message_by_offset(offset)
            ok = (m is not None and m.store_size == size and m.body == expected.body
                  and m.topic == expected.topic and m.queue_offset == qoff)
            present.append(ok)
            if must_keep_all and put_ok:
                assert ok, f"acknowledged message {index} at {offset} was lost"
        if False in present:                               # a clean prefix, nothing after
            first_lost = present.index(False)
            assert not any(present[first_lost:]), "a hole in the acknowledged messages"
        max_phy = store.get_max_phy_offset()
        for cq in store.all_consume_queues():
            lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue
            units = cq.units(lo, hi - lo)
            assert len(units) == hi - lo
            for i, unit in enumerate(units):
                off, size = int(unit["offset"]), int(unit["size"])
                assert off + size <= max_phy, "a unit points past the CommitLog"
                m = store.look_message_by_offset(off)
                assert m is not None and m.store_size == size
                assert (m.topic, m.queue_id, m.queue_offset) == (cq.topic, cq.queue_id, lo + i)
            assert store.commitlog.topic_queue_table.get((cq.topic, cq.queue_id), 0) == hi
        return sum(present)
    finally:
        store.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("mode, power, must_keep_all", [
    ("sync", False, True), ("async", False, True), ("pool", False, False),
    ("sync", True, True), ("async", True, False),
])
def test_killed_writer_loses_nothing_its_flush_mode_promised(tmp_path, mode, power,
                                                             must_keep_all):
    backend = testing.backend_params()[0]
    rng = random.Random(testing.fixed_seed(f"crash-{mode}-{power}"))
    root = tmp_path / "store"
    log = tmp_path / "durability.log" if power else None
    start = 0
    kept = 0
    for cycle in range(CYCLES):
        before = snapshot(root) if power else None
        acks = run_and_kill(root, mode, backend, start, rng, log)
        if power:
            cut_power(root, before, log, rng)
        kept += check_store(root, backend, mode, acks, must_keep_all)
        start = max([a[0] for a in acks], default=start) + 1
    assert kept > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", testing.backend_params())
def test_every_key_of_every_recovered_record_is_found_after_a_kill(tmp_path, name):
    """4.9.8 destroys the index files past the checkpoint's indexMsgTimestamp and re-dispatches
    only from the CommitLog file the checkpoint vouches for: the keys of the destroyed files'
    older records were lost. Here the index is rebuilt from wherever it ends."""
    from rocketstore.clock import StepClock
    root = tmp_path / "store"
    n = 1797                        # three full index files (499 keys each) and 300 keys
    old = int(time.time() * 1000) - 3_600_000
    store = testing.open_store(root, name, crash_config("async"), clock=StepClock(old, 100))
    try:
        written = [store.put_message(message(i)).commit_log_offset for i in range(n)]
    finally:
        store.shutdown()
    old_names = sorted(os.listdir(root / "index"))
    # 100 more keys keep the last index file partial: the kill leaves it past the checkpoint.
    acks = run_and_kill(root, "async", name, n, random.Random(7), count=100)
    assert len(acks) == 100
    store = MessageStore(root, crash_config("async"), kernels=name)
    store.load()
    try:
        report = store.recovery_report
        assert not report.normal
        expected = list(enumerate(written)) + [(a[0], a[1]) for a in acks]
        for i, offset in expected:
            m = message(i)
            got = store.query_message(m.topic, m.keys).messages
            assert [g.commit_log_offset for g in got] == [offset], i
        # Rebuilt from the last full file's end: the record of key 1496, once more.
        assert report.index_rebuilt_from == written[1496]
        assert report.index_redispatched == n + 100 - 1496
        assert report.index_files_dropped == [old_names[-1]]
    finally:
        store.shutdown()
    ro = MessageStore.open_read_only(root, kernels=name)
    try:
        problems = ro.verify().problems
    finally:
        ro.shutdown()
    # A load that was never started keeps the abort file, as 4.9.8's does (reput never caught
    # up): verify says the next open recovers again, and finds nothing else.
    assert [p.kind for p in problems] == ["abort"], [str(p) for p in problems]
