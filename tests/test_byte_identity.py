# SPDX-License-Identifier: Apache-2.0
"""Every backend writes the same bytes for the same seeded workload."""

from rocketstore import Message, testing
from rocketstore.workload import make_messages


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
    return testing.tree_digest(root, ignore=("lock", "abort"))


def test_all_backends_write_identical_store_directories(tmp_path):
    names = testing.backend_params()
    trees = {n: write_workload(tmp_path / n, testing.load_backend(n)) for n in names}
    first = trees[names[0]]
    assert len(first) > 10
    for name in names[1:]:
        assert trees[name] == first, f"{name} differs from {names[0]}"
