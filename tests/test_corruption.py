# SPDX-License-Identifier: Apache-2.0
"""Random bit flips and truncations in CommitLog, ConsumeQueue and checkpoint files: the store
still opens, serves what is intact, and says what it dropped. It never raises or hangs."""
import os
import random
import shutil

import pytest

from rocketstore import Message, MessageStore, StoreError, testing
from rocketstore.workload import make_messages

SEEDS = int(os.environ.get("ROCKETSTORE_CORRUPTION_SEEDS", "40"))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine") / "store"
    store = testing.open_store(root, testing.backend_params()[0])
    try:
        msgs = make_messages(1500, body_size=90, topics=3, queues=2)
        store.put_messages(msgs[:700])
        for m in msgs[700:]:
            store.put_message(m)
        testing.wait_dispatched(store)
    finally:
        store.shutdown()
    return root


def damage(root, rng):
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


def read_everything(store):
    count = 0
    for topic, queues in list(store.consume_queue_table.items()):
        for qid in list(queues):
            offset = store.get_min_offset_in_queue(topic, qid)
            for _ in range(10_000):
                r = store.get_message("g", topic, qid, offset, 32)
                count += len(r.messages)
                if r.next_begin_offset <= offset:
                    break
                offset = r.next_begin_offset
    for _ in store.iter_messages():
        count += 1
    return count


@pytest.mark.parametrize("seed", range(SEEDS))
def test_damaged_store_opens_serves_and_reports(tmp_path, backend, pristine, seed):
    rng = random.Random(seed)
    root = tmp_path / "store"
    shutil.copytree(pristine, root)
    damage(root, rng)
    store = MessageStore(root, testing.small_config(), kernels=backend)
    try:
        store.load()
    except StoreError as exc:       # documented refusals only, never a crash
        pytest.fail(f"damaged store did not open: {exc!r}")
    store.start()
    try:
        report = store.recovery_report
        assert report.process_offset == store.get_max_phy_offset()
        read_everything(store)
        r = store.put_message(Message("AfterDamage", b"still writable"))
        assert r.ok
        testing.wait_dispatched(store)
        assert store.get_message("g", "AfterDamage", 0, 0).messages[0].body == b"still writable"
    finally:
        store.shutdown()
