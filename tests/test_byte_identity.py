# SPDX-License-Identifier: Apache-2.0
"""Every backend writes the same bytes for the same seeded workload."""
import hashlib
import os

from rocketstore import Message, testing
from rocketstore.workload import make_messages


def digest_tree(root):
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            if name in ("lock", "abort"):
                continue
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def write_workload(root, backend):
    store = testing.open_store(root, backend)
    try:
        msgs = make_messages(600, body_size=100, topics=3, queues=3, seed=11)
        for m in msgs[:200]:
            store.put_message(m)
        store.put_messages(msgs[200:500])
        store.put_message(Message("Other", b"", properties={"DELAY": "3", "x": ""},
                                  born_host=("::1", 5)))
        store.put_messages(msgs[500:])
    finally:
        store.shutdown()
    return digest_tree(root)


def test_all_backends_write_identical_store_directories(tmp_path):
    names = testing.backend_params()
    trees = {n: write_workload(tmp_path / n, testing.load_backend(n)) for n in names}
    first = trees[names[0]]
    assert len(first) > 10
    for name in names[1:]:
        assert trees[name] == first, f"{name} differs from {names[0]}"
