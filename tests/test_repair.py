# SPDX-License-Identifier: Apache-2.0
"""`rebuild-cq` and `rebuild-index` killed at any point: the `rebuild` marker, written before
the wipe and removed once the rebuilt files are flushed, makes the next open (or the next run
of a repair tool) finish the rebuild, so every message and key is reachable again."""
import dataclasses
import os
import subprocess
import sys

import pytest

from rocketstore import MessageStore, StoreConfig, repair, testing
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


@pytest.mark.slow
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
        problems = [str(p) for p in ro.verify().problems]
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


def file_sizes(root, sub):
    return {os.path.getsize(os.path.join(d, n))
            for d, _, names in os.walk(os.path.join(root, sub)) for n in names}


@pytest.mark.parametrize("tool,sub", [("cq", "consumequeue"), ("index", "index")])
def test_an_open_finishing_a_killed_rebuild_sizes_the_files_as_they_were(tmp_path, pristine,
                                                                         tool, sub):
    """The wipe leaves no file to take the geometry from: the marker keeps it, and an open
    with RocketMQ's default queue and index sizes must not rebuild with those."""
    root = copy_store(pristine, tmp_path / "store")
    sizes = file_sizes(root, sub)
    kill_rebuild(root, tool, 1)
    fields = {"cq": ("mapped_file_size_consume_queue",),
              "index": ("max_hash_slot_num", "max_index_num")}[tool]
    defaults = dataclasses.replace(testing.small_config(),
                                   **{f: getattr(StoreConfig(), f) for f in fields})
    store = MessageStore(root, defaults, kernels=BACKEND)
    store.load()
    store.start()
    try:
        assert reachable(store) == (COUNT, KEYS)
    finally:
        store.shutdown()
    assert file_sizes(root, sub) == sizes
    store = MessageStore(root, testing.small_config(), kernels=BACKEND)
    assert store.load().normal
    store.start()
    try:
        assert reachable(store) == (COUNT, KEYS)
    finally:
        store.shutdown()


STRAYS = ["index/notes.txt", "index/2024", "index/201912011200000000", "consumequeue/notes.txt",
          "consumequeue/BenchTopic0/notes.txt", "consumequeue/BenchTopic0/007/00000000000000000000",
          "consumequeue/BenchTopic0/0/0", "consumequeue/BenchTopic0/0/00000000000000000000.bak"]


@pytest.mark.parametrize("tool", ["cq", "index"])
@pytest.mark.parametrize("killed", [False, True])
def test_a_rebuild_wipes_only_store_files_and_leaves_stray_names_alone(tmp_path, pristine,
                                                                        tool, killed):
    root = copy_store(pristine, tmp_path / "store")
    for name in STRAYS:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"not the store's: " + name.encode())
    if killed:
        kill_rebuild(root, tool, 1)
    else:
        (repair.rebuild_consume_queues if tool == "cq" else repair.rebuild_index)(
            str(root), kernels=BACKEND)
    store = MessageStore(root, testing.small_config(), kernels=BACKEND)
    store.load()
    store.start()
    try:
        assert reachable(store) == (COUNT, KEYS)
    finally:
        store.shutdown()
    for name in STRAYS:
        assert (root / name).read_bytes() == b"not the store's: " + name.encode()


@pytest.mark.parametrize("tool", ["recover", "rebuild-cq", "rebuild-index"])
def test_a_tool_that_cannot_tell_the_index_geometry_refuses_before_changing_anything(tmp_path,
                                                                                     tool):
    """Index files without a single entry do not tell their hash slot and entry numbers when
    those are not RocketMQ's (64 and 500 here): rebuild-index replaced them with 420 MB files,
    and rebuild-cq refused only after its marker was written."""
    from rocketstore import Message, cli
    from rocketstore.errors import StoreLoadError
    root = tmp_path / "store"
    store = testing.open_store(root, BACKEND)
    try:
        for _ in range(5):
            assert store.put_message(Message("T", b"no keys")).ok
    finally:
        store.shutdown()
    before = testing.tree_digest(root)
    run = {"recover": repair.recover, "rebuild-cq": repair.rebuild_consume_queues,
           "rebuild-index": repair.rebuild_index}[tool]
    with pytest.raises(StoreLoadError, match="cannot tell the hash slot and entry numbers"):
        run(str(root), kernels=BACKEND)
    assert testing.tree_digest(root) == before
    # Told the numbers (the API's keywords, the CLI's options), each runs and keeps the sizes.
    sizes = file_sizes(root, "index")
    run(str(root), kernels=BACKEND, max_hash_slot_num=64, max_index_num=500)
    assert file_sizes(root, "index") == sizes
    assert cli.main(["--backend", BACKEND, tool, str(root), "--max-hash-slot-num", "64",
                     "--max-index-num", "500"]) == 0
    assert file_sizes(root, "index") == sizes


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


@pytest.mark.parametrize("dirs, zeroed", [
    ({"consumequeue": None}, ("physic_msg_timestamp", "logics_msg_timestamp")),
    ({"index": None}, ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp")),
])
def test_marking_a_rebuild_zeroes_only_the_dispatch_timestamps_of_the_checkpoint(tmp_path, dirs,
                                                                                  zeroed):
    # A 5.x checkpoint: masterFlushedOffset and confirmPhyOffset, and every byte past the
    # fields, must survive the reset that sends recovery back to the first file.
    from rocketstore import format as F
    from rocketstore.fs import DEFAULT as fs
    values = dict(zip((name for name, _ in F.CHECKPOINT.fields), (101, 102, 103, 104, 105)))
    raw = bytearray(F.CHECKPOINT.struct.pack(*values.values()))
    raw += bytes(range(256)) * ((F.CHECKPOINT_FILE_SIZE - len(raw)) // 256)
    raw += bytes(F.CHECKPOINT_FILE_SIZE - len(raw))
    (tmp_path / "checkpoint").write_bytes(raw)
    repair.mark_rebuild(fs, str(tmp_path), dirs)
    after = (tmp_path / "checkpoint").read_bytes()
    assert len(after) == F.CHECKPOINT_FILE_SIZE
    assert after[F.CHECKPOINT.size:] == raw[F.CHECKPOINT.size:]
    assert dict(zip(values, F.CHECKPOINT.struct.unpack_from(after))) == \
        {name: 0 if name in zeroed else v for name, v in values.items()}
