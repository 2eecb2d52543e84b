# SPDX-License-Identifier: Apache-2.0
"""Filesystem hygiene: modes follow 0644 / 0755 under the caller's umask, a link of any store
file or directory out of the store is never written through (open, recover, rebuild-*), only
exact store file names load (the rest is reported and left alone), config files survive
concurrent writers and SIGKILL, and paths with spaces and non-ASCII work."""
import contextlib
import logging
import os
import stat

import pytest

from rocketstore import Message, testing
from rocketstore.errors import StoreLoadError, UnsafePathError
from rocketstore.store import MessageStore

BACKEND = testing.backend_params()[0]


@contextlib.contextmanager
def umask(mask):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def write_store(root, n=30, **cfg):
    store = testing.open_store(root, BACKEND, config=testing.small_config(**cfg))
    try:
        for i in range(n):
            store.put_message(Message(f"T{i % 2}", b"x" * 100, tags="a", keys=[f"k{i}"],
                                      queue_id=i % 2))
        testing.wait_dispatched(store)
        store.persist_configs()
        store.topic_configs.mark_dirty()
        store.topic_configs.persist()            # main + .bak: write_bytes and the copy
    finally:
        store.shutdown()


def modes(root):
    files, dirs = {}, {}
    for d, subdirs, names in os.walk(root):
        dirs[os.path.relpath(d, root)] = stat.S_IMODE(os.stat(d).st_mode)
        for name in names:
            p = os.path.join(d, name)
            files[os.path.relpath(p, root)] = stat.S_IMODE(os.stat(p).st_mode)
    return files, dirs


# Files are opened 0o644 and directories made 0o777, both masked by the umask (as Java's
# FileChannel / File#mkdirs do): 0644 / 0755 under the usual 022, private under 077.
@pytest.mark.parametrize("mask,file_mode,dir_mode", [(0o022, 0o644, 0o755),
                                                     (0o077, 0o600, 0o700),
                                                     (0o002, 0o644, 0o775)])
def test_created_files_and_dirs_follow_0644_0777_under_the_umask(tmp_path, mask, file_mode,
                                                                 dir_mode):
    root = tmp_path / "store"
    with umask(mask):
        write_store(root, mapped_file_size_commit_log=4096)
    files, dirs = modes(root)
    kinds = {p.split(os.sep)[0] for p in files}
    assert {"commitlog", "consumequeue", "index", "config", "checkpoint", "lock"} <= kinds
    assert {p: m for p, m in files.items() if m != file_mode} == {}
    assert {p: m for p, m in dirs.items() if m != dir_mode and p != "."} == {}


def _plant_symlinked_topic(tmp_path):
    root = tmp_path / "store"
    write_store(root, n=4)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "0").mkdir(parents=True)
    victim = elsewhere / "0" / ("0" * 20)
    victim.write_bytes(b"\x7f" * 100)                      # not a multiple of 20: would be cut
    os.symlink(elsewhere, root / "consumequeue" / "Evil")
    # A queue directory symlinked out of a real topic directory, too.
    os.symlink(elsewhere / "0", root / "consumequeue" / "T0" / "7")
    return root, victim


def test_consumequeue_symlink_out_of_the_store_is_refused_by_a_writable_open(tmp_path):
    root, victim = _plant_symlinked_topic(tmp_path)
    store = MessageStore(str(root), testing.small_config(), kernels=BACKEND)
    with pytest.raises(StoreLoadError, match="outside the store"):
        store.load()
    store.shutdown()
    assert victim.read_bytes() == b"\x7f" * 100             # never truncated nor written


def test_consumequeue_symlink_out_of_the_store_is_skipped_read_only(tmp_path, caplog):
    root, victim = _plant_symlinked_topic(tmp_path)
    caplog.set_level(logging.WARNING)
    ro = MessageStore.open_read_only(str(root), kernels=BACKEND)
    try:
        assert ro.get_message("g", "T0", 0, 0, 32).messages
        assert ro.find_consume_queue("Evil", 0, create=False) is None \
            if "create" in ro.find_consume_queue.__code__.co_varnames else True
    finally:
        ro.shutdown()
    assert "outside the store" in caplog.text
    assert victim.read_bytes() == b"\x7f" * 100


def test_symlink_inside_the_store_still_loads(tmp_path):
    root = tmp_path / "store"
    write_store(root, n=4)
    cq = root / "consumequeue"
    os.rename(cq / "T1", cq / ".T1-real")
    os.symlink(cq / ".T1-real", cq / "T1")
    store = testing.open_store(root, BACKEND)
    try:
        assert len(store.get_message("g", "T1", 1, 0, 32).messages) == 2
    finally:
        store.shutdown()


def test_is_inside_answers_as_resolving_both_paths_does(tmp_path):
    """is_inside walks plain names below the root with lstat (the cheap answer for the 40 000
    queue directories of a big store) and resolves both paths only when unsure: the answer is
    always the one realpath gives, links in and out of the root, missing tails and ".." alike."""
    from rocketstore.fs import is_inside
    real_root = tmp_path / "real-root"
    (real_root / "consumequeue" / "T0").mkdir(parents=True)
    (real_root / "inner").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (real_root / "consumequeue" / "Out").symlink_to(outside)
    (real_root / "consumequeue" / "In").symlink_to(real_root / "inner")
    (real_root / "afile").write_bytes(b"")
    linked_root = tmp_path / "root-link"
    linked_root.symlink_to(real_root)

    def resolved(root, path):
        root, real = os.path.realpath(root), os.path.realpath(path)
        return real == root or real.startswith(root.rstrip(os.sep) + os.sep)
    for root in (str(real_root), str(linked_root), str(linked_root) + os.sep):
        base = root.rstrip(os.sep)
        for rel in ("consumequeue/T0/3", "consumequeue/T0", "consumequeue/New/0",
                    "consumequeue/Out/0", "consumequeue/Out", "consumequeue/In/0",
                    "consumequeue/T0/../../../outside", "consumequeue/New/../../../outside",
                    "consumequeue/./T0", "afile/x",
                    "consumequeue//T0", ""):
            path = base + os.sep + rel if rel else base
            assert is_inside(root, path) == resolved(root, path), (root, rel)
    assert not is_inside(str(real_root), str(real_root) + "/consumequeue/Out/0")
    assert is_inside(str(real_root), str(real_root) + "/consumequeue/New/0")
    assert not is_inside(str(real_root), str(real_root) + "/../outside/x")
    # A ".." past a name not made yet climbs out once os.makedirs makes that name.
    assert not is_inside(str(real_root), str(real_root) + "/consumequeue/New/../../../x")


@pytest.mark.parametrize("name", ["with space", "ünïcödé ストア", "tab\tand 'quote'"])
def test_store_paths_with_spaces_and_unicode(tmp_path, name, capsys):
    root = tmp_path / name / "store dir"
    write_store(root, n=6)
    store = testing.open_store(root, BACKEND)
    try:
        assert len(store.get_message("g", "T0", 0, 0, 32).messages) == 3
    finally:
        store.shutdown()
    from rocketstore import cli
    capsys.readouterr()
    assert cli.main(["dump", str(root)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 6


# ---- symlinks: a writable open, recover and rebuild-* never write through one ---------------

def _first(directory):
    return sorted(n for n in os.listdir(directory) if not n.startswith("."))[0]


# Each kind: (path under the store, is it a directory). Links to files point at a copy of the
# real file (same size, so no size check stops the open first); a missing file gets a link to
# an outside file all the same.
LINK_KINDS = {
    "abort": "abort",
    "lock": "lock",
    "checkpoint": "checkpoint",
    "rebuild marker": "rebuild",
    "topics.json": "config/topics.json",
    "topics.json.tmp": "config/topics.json.tmp",
    "topics.json.bak": "config/topics.json.bak",
    "consumerOffset.json": "config/consumerOffset.json",
    "commitlog segment": lambda root: "commitlog/" + _first(root / "commitlog"),
    "next commitlog .creating": "commitlog/00000000000000065536.creating",
    "next index file made ahead": "index.ahead/index.creating",
    "made-ahead index dir": "index.ahead",
    "index file made ahead by an older release": "index.creating",
    "consumequeue segment": lambda root: "consumequeue/T0/0/" + _first(
        root / "consumequeue" / "T0" / "0"),
    "index file": lambda root: "index/" + _first(root / "index"),
    "commitlog dir": "commitlog",
    "index dir": "index",
    "config dir": "config",
    "consumequeue dir": "consumequeue",
    "future topic dir": "consumequeue/NewTopic",
}


def _run(op, root):
    from rocketstore import repair
    if op == "open+put":
        store = MessageStore(str(root), testing.small_config(), kernels=BACKEND)
        try:
            store.load()
            store.start()
            store.put_message(Message("NewTopic", b"y" * 100, queue_id=0))
            store.update_topic_config("NewTopic")
        finally:
            store.shutdown()
    elif op == "recover":
        repair.recover(str(root), BACKEND)
    elif op == "rebuild-cq":
        repair.rebuild_consume_queues(str(root), BACKEND)
    else:
        repair.rebuild_index(str(root), BACKEND)


def _plant_link(tmp_path, kind):
    root = tmp_path / "store"
    write_store(root, n=40)
    rel = LINK_KINDS[kind]
    rel = rel(root) if callable(rel) else rel
    inside = root / rel
    outside = tmp_path / "outside" / "target"
    outside.parent.mkdir()
    if inside.is_dir():
        import shutil
        shutil.copytree(inside, outside)
        shutil.rmtree(inside)
    elif inside.exists():
        outside.write_bytes(inside.read_bytes())
        inside.unlink()
    elif kind in ("future topic dir", "made-ahead index dir"):
        outside.mkdir()
    else:
        outside.write_bytes(b"outside the store\n")
    inside.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, inside)
    return root, inside, outside


@pytest.mark.parametrize("op", ["open+put", "recover", "rebuild-cq", "rebuild-index"])
@pytest.mark.parametrize("kind", sorted(LINK_KINDS))
def test_a_link_out_of_the_store_is_refused_and_its_target_never_written(tmp_path, kind, op):
    root, inside, outside = _plant_link(tmp_path, kind)
    before = testing.tree_digest(outside.parent)
    with pytest.raises(UnsafePathError, match="symbolic link") as err:
        _run(op, root)
    assert str(inside) in str(err.value)
    assert testing.tree_digest(outside.parent) == before
    assert os.path.islink(inside)                   # reported, not removed


def test_a_link_to_a_file_inside_the_store_is_refused_too(tmp_path):
    root = tmp_path / "store"
    write_store(root, n=4)
    ckpt = root / "checkpoint"
    os.rename(ckpt, root / "config" / "checkpoint.real")
    os.symlink(root / "config" / "checkpoint.real", ckpt)
    with pytest.raises(UnsafePathError, match="not a directory"):
        _run("open+put", root)


def test_the_cli_names_the_link_in_one_line(tmp_path, capsys):
    from rocketstore import cli
    root, inside, outside = _plant_link(tmp_path, "index file")
    before = outside.read_bytes()
    for command in ("recover", "rebuild-cq", "rebuild-index"):
        capsys.readouterr()
        assert cli.main(["--backend", BACKEND, command, str(root)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(inside) in err, err
    assert outside.read_bytes() == before


def test_verify_reports_a_link_out_of_the_store(tmp_path):
    root, inside, _ = _plant_link(tmp_path, "checkpoint")
    ro = MessageStore.open_read_only(str(root), kernels=BACKEND)
    try:
        problems = ro.verify().problems
    finally:
        ro.shutdown()
    assert [p.file for p in problems if p.kind == "link"] == ["checkpoint"]


def test_a_link_planted_after_load_is_refused_when_a_queue_directory_is_made(tmp_path):
    root = tmp_path / "store"
    write_store(root, n=4)
    outside = tmp_path / "outside"
    outside.mkdir()
    store = testing.open_store(root, BACKEND)
    try:
        os.symlink(outside, root / "consumequeue" / "Late")
        with pytest.raises(UnsafePathError, match="outside the store"):
            store.find_consume_queue("Late", 0).mfq.get_last_mapped_file(0)
    finally:
        store.shutdown()
    assert list(outside.iterdir()) == []


def test_a_link_planted_after_load_is_not_written_through_by_a_config_write(tmp_path):
    root = tmp_path / "store"
    write_store(root, n=4)
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    store = testing.open_store(root, BACKEND)
    try:
        os.symlink(outside, root / "config" / "topics.json.tmp")
        with pytest.raises(UnsafePathError):
            store.update_topic_config("Late")
    finally:
        os.remove(root / "config" / "topics.json.tmp")
        store.shutdown()
    assert outside.read_bytes() == b"keep"


# ---- stray names: only exact store file names load; the rest is reported and left alone ------

STRAY_NAMES = {
    "commitlog": ["0", "1" * 21, "0" * 26, "0" * 19, "0" * 20 + ".creating",
                  "00000000000000000100",                   # 20 digits, not a file-size multiple
                  "20200101000000000000"],                  # a multiple, but far off and short
    "consumequeue/T0/0": ["0", "1" * 21, "0" * 26, "0" * 19, "00000000000000000010",
                          "20200101000000000000"],
    "index": ["0", "0" * 20, "0" * 17, "20231399000000000", "2" * 18],
}
STRAY_CASES = [(d, n) for d, names in STRAY_NAMES.items() for n in names]


def _messages(root):
    ro = MessageStore.open_read_only(str(root), kernels=BACKEND)
    try:
        return [(m.topic, m.body) for m in ro.iter_messages()]
    finally:
        ro.shutdown()


@pytest.mark.parametrize("where,name", STRAY_CASES)
def test_a_stray_name_is_left_alone_and_a_put_survives_reopen(tmp_path, where, name, caplog):
    root = tmp_path / "store"
    write_store(root, n=200)
    stray = root / where / name
    stray.write_bytes(b"not a segment")
    before = _messages(root)
    caplog.set_level(logging.WARNING)
    store = testing.open_store(root, BACKEND)
    try:
        put = store.put_message(Message("T0", b"acknowledged", queue_id=0))
        assert put.ok
    finally:
        store.shutdown()
    assert name in caplog.text
    store = testing.open_store(root, BACKEND)
    try:
        assert store.look_message_by_offset(put.commit_log_offset).body == b"acknowledged"
        assert store.get_max_offset_in_queue("T0", 0) == 101
        assert [m.body for m in store.get_message("g", "T0", 0, 100, 1).messages] == \
            [b"acknowledged"]
    finally:
        store.shutdown()
    assert _messages(root) == before + [("T0", b"acknowledged")]
    assert stray.read_bytes() == b"not a segment"


@pytest.mark.parametrize("where,name", [("commitlog", "%020d.creating" % (1 << 30)),
                                        ("index", "20261201120000000.creating")])
def test_a_file_a_crash_left_half_created_is_removed_by_a_writable_open_only(tmp_path, where,
                                                                             name):
    # create_sized sizes a new file under `<name>.creating` and renames it: a kill in between
    # leaves the temporary, never written to. It is ours, so no stray for verify to report.
    root = tmp_path / "store"
    write_store(root, n=20)
    (root / where).mkdir(exist_ok=True)
    leftover = root / where / name
    leftover.write_bytes(bytes(4096))
    before = _messages(root)
    MessageStore.open_read_only(str(root), kernels=BACKEND).shutdown()
    assert leftover.exists()                    # a read-only open changes nothing
    testing.open_store(root, BACKEND).shutdown()
    assert not leftover.exists()
    assert _messages(root) == before
    ro = MessageStore.open_read_only(str(root), kernels=BACKEND)
    try:
        assert [str(p) for p in ro.verify().problems] == []
    finally:
        ro.shutdown()


@pytest.mark.parametrize("where,name", STRAY_CASES)
def test_recover_with_a_stray_name_destroys_nothing(tmp_path, where, name):
    from rocketstore import repair
    root = tmp_path / "store"
    write_store(root, n=200)
    stray = root / where / name
    stray.write_bytes(b"not a segment")
    before = _messages(root)
    repair.recover(str(root), BACKEND)
    assert _messages(root) == before and len(before) == 200
    assert stray.read_bytes() == b"not a segment"


@pytest.mark.parametrize("where,name", STRAY_CASES[:3] + STRAY_CASES[-3:])
def test_verify_and_stat_report_a_stray_name(tmp_path, where, name, capsys):
    from rocketstore import cli
    root = tmp_path / "store"
    write_store(root, n=20)
    (root / where / name).write_bytes(b"not a segment")
    rel = os.path.join(where, name)
    capsys.readouterr()
    assert cli.main(["--backend", BACKEND, "verify", str(root)]) == 1
    assert rel in capsys.readouterr().out
    assert cli.main(["--backend", BACKEND, "stat", str(root)]) == 0
    assert f"ignored      {rel}" in capsys.readouterr().out


@pytest.mark.parametrize("qid", ["007", "01", "+1", "99999999999", "１"])
def test_a_queue_directory_not_named_by_a_queue_id_is_left_alone(tmp_path, qid, caplog):
    root = tmp_path / "store"
    write_store(root, n=20)
    odd = root / "consumequeue" / "T0" / qid
    os.rename(root / "consumequeue" / "T0" / "0", odd)
    caplog.set_level(logging.WARNING)
    store = testing.open_store(root, BACKEND)
    try:
        # `007` parses as 7 but names another directory than queue 7's: not loaded as one.
        assert set(store.consume_queue_table.get("T0", {})) <= {0}
    finally:
        store.shutdown()
    assert qid in caplog.text
    assert sorted(os.listdir(odd)) == ["0" * 20]


def test_a_file_where_a_queue_directory_belongs_is_left_alone(tmp_path, caplog):
    root = tmp_path / "store"
    write_store(root, n=20)
    (root / "consumequeue" / "T0" / "5").write_bytes(b"file")
    (root / "consumequeue" / "loose").write_bytes(b"file")
    caplog.set_level(logging.WARNING)
    store = testing.open_store(root, BACKEND)
    store.shutdown()
    assert (root / "consumequeue" / "T0" / "5").read_bytes() == b"file"
    assert (root / "consumequeue" / "loose").read_bytes() == b"file"
    assert "consumequeue/T0/5" in caplog.text.replace(os.sep, "/")


# ---- config writes: one writer at a time per file, durable, every acknowledged update kept ----

def test_concurrent_topic_updates_raise_nothing_and_keep_every_topic(tmp_path):
    import json
    import threading
    from rocketstore.config_manager import parse_fastjson
    root = tmp_path / "store"
    store = testing.open_store(root, BACKEND)
    errors = []
    start = threading.Barrier(8)

    def hammer(t):
        start.wait()
        for i in range(40):
            try:
                store.update_topic_config(f"T{t}_{i}", write_queue_nums=1 + i % 8)
                store.update_subscription_group(f"G{t}_{i}")
            except Exception as exc:                # noqa: BLE001 - any failure counts
                errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    try:
        assert errors == []
        config = root / "config"
        topics = parse_fastjson((config / "topics.json").read_text())["topicConfigTable"]
        groups = json.loads((config / "subscriptionGroup.json").read_text())
        want = {f"T{t}_{i}" for t in range(8) for i in range(40)}
        assert want <= set(topics)
        assert {f"G{t}_{i}" for t in range(8) for i in range(40)} <= \
            set(groups["subscriptionGroupTable"])
        assert not (config / "topics.json.tmp").exists()
        assert (config / "topics.json.bak").exists()
    finally:
        store.shutdown()


@pytest.mark.slow
def test_killed_while_updating_topics_keeps_every_acknowledged_update(tmp_path):
    import signal
    import subprocess
    import sys
    from rocketstore.config_manager import TopicConfigManager
    from rocketstore.fs import DEFAULT
    child = os.path.join(os.path.dirname(__file__), "crashers", "topic_writer.py")
    root = tmp_path / "store"
    acked = []
    for round_ in range(4):
        proc = subprocess.Popen([sys.executable, child, str(root), str(round_)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdout.readline() == b"ready\n", proc.stderr.read().decode()
            got = 0
            while got < 60 + 40 * round_:            # kill at a different point each round
                line = proc.stdout.readline()
                assert line, proc.stderr.read().decode()[-2000:]
                acked.append(line.split()[1].decode())
                got += 1
        finally:
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
        acked += [raw.split()[1].decode() for raw in out.decode().splitlines()
                  if raw.startswith("ack ") and len(raw.split()) == 2]
        manager = TopicConfigManager(str(root), DEFAULT)
        assert manager.load(), "topics.json and its .bak are both corrupt"
        assert manager.loaded_from == "main"
        missing = set(acked) - set(manager.topic_config_table)
        assert not missing, f"round {round_}: {len(missing)} acknowledged topics lost"


def test_a_gap_between_segments_refuses_a_writable_open_and_changes_nothing(tmp_path):
    from rocketstore import repair
    root = tmp_path / "store"
    write_store(root, n=700)
    cl = root / "commitlog"
    names = sorted(os.listdir(cl))
    assert len(names) >= 3
    os.rename(cl / names[1], tmp_path / names[1])           # a middle segment gone
    before = testing.tree_digest(root)
    for run in (lambda: _run("open+put", root), lambda: repair.recover(str(root), BACKEND)):
        with pytest.raises(StoreLoadError, match="not adjacent"):
            run()
    after = testing.tree_digest(root)
    assert {k: v for k, v in after.items() if k != "lock"} == \
        {k: v for k, v in before.items() if k != "lock"}


def test_a_store_reached_through_a_linked_root_opens_and_writes(tmp_path):
    real = tmp_path / "disk" / "store"
    write_store(real, n=4)
    os.symlink(real, tmp_path / "store")
    store = testing.open_store(tmp_path / "store", BACKEND)
    try:
        assert store.put_message(Message("Fresh", b"z", queue_id=3)).ok
        store.update_topic_config("Fresh")
    finally:
        store.shutdown()
    assert (real / "consumequeue" / "Fresh" / "3").is_dir()


def test_a_commitlog_configured_outside_the_root_is_not_taken_for_an_escape(tmp_path):
    cl_dir = tmp_path / "other-disk" / "commitlog"
    config = testing.small_config(store_path_commit_log=str(cl_dir))
    store = testing.open_store(tmp_path / "store", BACKEND, config=config)
    try:
        put = store.put_message(Message("T", b"z"))
    finally:
        store.shutdown()
    store = testing.open_store(tmp_path / "store", BACKEND, config=config)
    try:
        assert store.look_message_by_offset(put.commit_log_offset).body == b"z"
    finally:
        store.shutdown()
    assert os.listdir(cl_dir) == ["0" * 20]


def test_ensure_dir_of_an_existing_directory_makes_no_mkdir_call(tmp_path, monkeypatch):
    # mkdir of an existing directory waits for its parent's lock (held by a create or rename
    # there while the file system waits for its journal): a roll must not call it per file.
    from rocketstore.fs import FileSystem
    fs = FileSystem()
    target = tmp_path / "store" / "commitlog"
    made = []
    real_mkdir = os.mkdir

    def mkdir(path, *a, **kw):
        made.append(os.fspath(path))
        return real_mkdir(path, *a, **kw)
    monkeypatch.setattr(os, "mkdir", mkdir)
    fs.ensure_dir(str(target), str(tmp_path / "store"))
    assert target.is_dir() and made
    made.clear()
    fs.ensure_dir(str(target), str(tmp_path / "store"))
    assert made == []
    # A link out of the store is still refused when the directory exists.
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path / "out", tmp_path / "store" / "linked")
    with pytest.raises(UnsafePathError):
        fs.ensure_dir(str(tmp_path / "store" / "linked"), str(tmp_path / "store"))
