# SPDX-License-Identifier: Apache-2.0
"""Filesystem hygiene: modes follow 0644 / 0755 under the caller's umask, a consumequeue entry
symlinked out of the store is never followed, and paths with spaces and non-ASCII work."""
import contextlib
import logging
import os
import stat

import pytest

from rocketstore import Message, testing
from rocketstore.errors import StoreLoadError
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
