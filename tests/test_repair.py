# SPDX-License-Identifier: Apache-2.0
"""`rebuild-cq` and `rebuild-index` killed at any point: the `rebuild` marker, written before
the wipe and removed once the rebuilt files are flushed, makes the next open (or the next run
of a repair tool) finish the rebuild, so every message and key is reachable again."""
import os
import subprocess
import sys

import pytest

from rocketstore import MessageStore, repair, testing
from rocketstore.verify import verify_store
from rocketstore.workload import make_messages

REBUILDER = os.path.join(os.path.dirname(__file__), "crashers", "rebuilder.py")
BACKEND = testing.backend_params()[0]
COUNT = 3000
KEYS = 300
TOPICS = 3
QUEUES = 4


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine") / "store"
    store = testing.open_store(root, BACKEND)
    try:
        msgs = make_messages(COUNT, body_size=60, topics=TOPICS, queues=QUEUES)
        for i in range(0, COUNT, 100):
            assert store.put_messages(msgs[i:i + 100]).ok
        testing.wait_dispatched(store)
    finally:
        store.shutdown()
    return root


def copy_store(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def reachable(store):
    """(messages reachable through the ConsumeQueues, keys found through the index)."""
    count = 0
    for t in range(TOPICS):
        for q in range(QUEUES):
            offset = 0
            while True:
                r = store.get_message("g", f"BenchTopic{t}", q, offset, 32)
                if not r.messages:
                    break
                count += len(r.messages)
                offset = r.next_begin_offset
    keys = sum(1 for i in range(KEYS)
               if store.query_message(f"BenchTopic{i % TOPICS}", f"key-{i}").messages)
    return count, keys


def kill_rebuild(root, tool, kill_at, at_create=False):
    cmd = [sys.executable, REBUILDER, str(root), "--tool", tool, "--kill-at", str(kill_at),
           "--backend", BACKEND] + (["--at-create"] if at_create else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stdout + proc.stderr[-3000:]
    assert os.path.exists(os.path.join(root, repair.REBUILD_MARKER))


@pytest.mark.parametrize("then", ["open", "run-again"])
@pytest.mark.parametrize("tool,kill_at,at_create", [
    ("cq", 1, False), ("cq", 7, False), ("cq", 3, True),
    ("index", 1, False), ("index", 2, True),
])
def test_a_rebuild_killed_midway_is_finished_by_the_next_open_or_run(tmp_path, pristine, tool,
                                                                     kill_at, at_create, then):
    root = copy_store(pristine, tmp_path / "store")
    kill_rebuild(root, tool, kill_at, at_create)
    if then == "run-again":
        (repair.rebuild_consume_queues if tool == "cq" else repair.rebuild_index)(
            str(root), kernels=BACKEND)
    store = MessageStore(root, testing.small_config(), kernels=BACKEND)
    report = store.load()
    store.start()
    try:
        assert not os.path.exists(root / repair.REBUILD_MARKER)
        if then == "open":
            assert not report.normal and report.dispatched == COUNT
        assert reachable(store) == (COUNT, KEYS)
    finally:
        store.shutdown()
    assert not os.path.exists(root / "abort")


def test_verify_reports_an_interrupted_rebuild(tmp_path, pristine):
    root = copy_store(pristine, tmp_path / "store")
    kill_rebuild(root, "index", 1)
    ro = MessageStore.open_read_only(root, kernels=BACKEND)
    try:
        problems = [str(p) for p in verify_store(ro).problems]
    finally:
        ro.shutdown()
    assert "repair: rebuild: a rebuild of index was interrupted; the next writable open (or " \
        "rebuild run) finishes it" in problems


def test_a_finished_rebuild_leaves_no_marker_and_a_clean_store(tmp_path, pristine):
    root = copy_store(pristine, tmp_path / "store")
    repair.rebuild_consume_queues(str(root), kernels=BACKEND)
    assert not os.path.exists(root / repair.REBUILD_MARKER)
    assert not os.path.exists(root / "abort")
    store = MessageStore(root, testing.small_config(), kernels=BACKEND)
    assert store.load().normal
    store.start()
    try:
        assert reachable(store) == (COUNT, KEYS)
    finally:
        store.shutdown()


@pytest.mark.parametrize("tool", ["rebuild-cq", "rebuild-index"])
def test_a_rebuild_warns_of_an_interrupted_rebuild_only_when_there_was_one(tmp_path, pristine,
                                                                         tool):
    root = copy_store(pristine, tmp_path / "store")
    r = testing.run_cli(tool, str(root))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    kill_rebuild(root, "cq" if tool == "rebuild-cq" else "index", 1)
    r = testing.run_cli(tool, str(root))
    assert r.returncode == 0
    assert "an interrupted rebuild of" in r.stderr and "is being redone" in r.stderr
