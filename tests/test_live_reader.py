# SPDX-License-Identifier: Apache-2.0
"""LiveReader (rocketstore/live.py): a reader in another process that follows the writer.

The process tests run tests/live_worker.py: one writer and several reader processes, with
CommitLog files of 64 KiB and queue files of 100 units, so files roll every few hundred
messages, and a store_size_budget with clean_protect_unconsumed, so cleaning deletes files
during the run (only those every reader has read). ROCKETSTORE_SOAK_S sets the long run's
length (default 15 s)."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading

import pytest

from rocketstore import (ConfigError, GetMessageStatus as G, InvalidArgumentError, Message,
                         StoreClosedError, StoreError)
from rocketstore import testing
from rocketstore.format import CQ_STORE_UNIT_SIZE
from rocketstore.fs import FileSystem
from rocketstore.live import LiveReader
from rocketstore.message import tags_code_of

import live_worker

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "live_worker.py")
SOAK_S = float(os.environ.get("ROCKETSTORE_SOAK_S", "15"))
HANG_S = 300        # hang guards only: a loaded machine may be slow, never this slow
# Random damage (testing.damage_at_random), a quarter of the corruption tests' seeds
# (ROCKETSTORE_CORRUPTION_SEEDS soaks).
DAMAGE_SEEDS = testing.damage_seeds(4)
TOPIC = live_worker.TOPIC


def _env():
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(testing.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg, env.get("PYTHONPATH", "")])
    return env


class _Run:
    """A writer process and reader processes on one store under `tmp`."""

    def __init__(self, tmp, readers, queues=2):
        self.root = str(tmp / "store")
        os.makedirs(self.root)
        self.offsets = str(tmp / "offsets")
        os.makedirs(self.offsets)
        self.stop = str(tmp / "stop.json")
        self.queues = queues
        self.outs = [str(tmp / f"reader{i}.json") for i in range(readers)]
        self.readers = [subprocess.Popen(
            [sys.executable, WORKER, "reader", self.root, out, "--queues", str(queues),
             "--offsets", os.path.join(self.offsets, f"reader{i}.json"), "--stop", self.stop],
            env=_env()) for i, out in enumerate(self.outs)]
        self.acked = {q: -1 for q in range(queues)}
        self.deleted = 0

    def start_writer(self, seconds, rate=0, budget=256 * 1024):
        self.resumed = set(range(self.queues)) if hasattr(self, "writer") else set()
        self.writer = subprocess.Popen(
            [sys.executable, WORKER, "writer", self.root, "--seconds", str(seconds),
             "--queues", str(self.queues), "--rate", str(rate), "--budget", str(budget),
             "--offsets-dir", self.offsets, "--readers", str(len(self.readers))],
            env=_env(), stdout=subprocess.PIPE)
        return self.writer

    def read_acks(self, until=None):
        """Take the writer's acknowledgements, up to `until` in all (None: to its end)."""
        n = 0
        for line in self.writer.stdout:
            word, value = line.split()
            if word == b"deleted":
                self.deleted += int(value)
                continue
            q, off = int(word), int(value)
            # A restarted writer goes on from each queue's end, which the put a killed one
            # made but never acknowledged may have moved by one.
            gap = 1 if q in self.resumed else 0
            self.resumed.discard(q)
            assert self.acked[q] + 1 <= off <= self.acked[q] + 1 + gap, \
                "the writer acknowledged out of order"
            self.acked[q] = off
            n += 1
            if until is not None and n >= until:
                return

    def finish(self, ends):
        with open(self.stop + ".tmp", "w") as f:
            json.dump(ends, f)
        os.replace(self.stop + ".tmp", self.stop)
        for p in self.readers:
            assert p.wait(timeout=HANG_S) == 0
        results = []
        for out in self.outs:
            with open(out) as f:
                results.append(json.load(f))
        return results

    def committed(self, i):
        path = os.path.join(self.offsets, f"reader{i}.json")
        if not os.path.exists(path):
            return {}
        with LiveReader(self.root, offsets_path=path) as r:
            return {q: r.query_offset(live_worker.GROUP, TOPIC, q) for q in range(self.queues)}

    def kill(self):
        for p in self.readers + [getattr(self, "writer", None)]:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def _check_every_message_once_in_order(results, ends):
    for i, res in enumerate(results):
        assert res["errors"] == [], f"reader {i}: {res['errors'][:3]}"
        for q, end in ends.items():
            assert res["seen"][str(q)] == list(range(end)), \
                f"reader {i}, queue {q}: not every message once in order"


def _soak(tmp_path, seconds):
    run = _Run(tmp_path, readers=4)
    try:
        run.start_writer(seconds, rate=3000)
        run.read_acks()
        assert run.writer.wait(timeout=HANG_S) == 0
        ends = {q: a + 1 for q, a in run.acked.items()}
        results = run.finish(ends)
    finally:
        run.kill()
    _check_every_message_once_in_order(results, ends)
    # Files rolled and cleaning deleted some while the readers followed.
    assert sum(ends.values()) * 200 > 8 * 64 * 1024
    assert run.deleted > 0
    with LiveReader(run.root) as r:
        assert r.get_min_offset_in_queue(TOPIC, 0) > 0


def test_four_reader_processes_follow_a_writer_through_rolls_and_cleaning(tmp_path):
    _soak(tmp_path, 3)


@pytest.mark.slow
def test_four_reader_processes_follow_a_writer_for_a_soak(tmp_path):
    _soak(tmp_path, SOAK_S)


def test_readers_following_a_writer_killed_by_sigkill(tmp_path):
    """What is promised when the writer dies mid-put: each reader sees, in order and once,
    every message whose unit the writer wrote (every acknowledged message but the few reput
    had not dispatched yet, and perhaps one whose put had not returned), never a torn or
    invalid record, and nothing past it; once a writer reopens the store (its recovery
    dispatches the rest), the readers see every acknowledged message, then the new ones."""
    run = _Run(tmp_path, readers=2)
    try:
        run.start_writer(600)
        run.read_acks(until=3000)
        # Reput may lag the puts by any amount on a loaded machine (it had dispatched nothing
        # into one queue after 3 000 acks, once): kill once every queue has a unit, so the
        # check below has a last one to read back.
        with LiveReader(run.root) as r:
            testing.wait_until(
                lambda: all(r.get_max_offset_in_queue(TOPIC, q) >= 1 for q in range(run.queues)),
                HANG_S, "a unit in every queue")
        run.writer.send_signal(signal.SIGKILL)
        run.writer.wait()
        run.read_acks()                         # what it printed before it died
        with LiveReader(run.root) as r:
            units = {q: r.get_max_offset_in_queue(TOPIC, q) for q in range(run.queues)}
            for q, end in units.items():
                # No unit without its record: the last one reads back whole.
                assert end >= 1 and \
                    r.get_message("g", TOPIC, q, end - 1, 1).status is G.FOUND
        for q in range(run.queues):
            # Reput may lag the puts by any amount on a loaded machine; ahead of them it is by
            # at most the one put under way (the writer puts from one thread).
            assert units[q] - 1 <= run.acked[q] + 1
        for i in range(len(run.readers)):
            testing.wait_until(lambda: run.committed(i) == units, HANG_S,
                               f"reader {i} to read every unit the killed writer wrote")
        first_acked = dict(run.acked)
        run.start_writer(1)                     # recovers, then puts from each queue's end
        run.read_acks()
        assert run.writer.wait(timeout=HANG_S) == 0
        ends = {q: a + 1 for q, a in run.acked.items()}
        results = run.finish(ends)
    finally:
        run.kill()
    _check_every_message_once_in_order(results, ends)
    assert all(ends[q] > first_acked[q] + 1 for q in ends)


# ---- in one process: the reader's rules, file by file --------------------------------------

def _put(store, n, queue_id=0, start=0):
    for i in range(start, start + n):
        r = store.put_message(Message(TOPIC, live_worker.body(queue_id, i), queue_id=queue_id))
        assert r.status.name == "PUT_OK"


def _read_all(reader, queue_id=0, offset=0):
    out = []
    while True:
        r = reader.get_message("g", TOPIC, queue_id, offset, 32)
        if not r.messages and r.status is not G.NO_MATCHED_MESSAGE:
            return out, r
        out += [m.queue_offset for m in r.messages]
        offset = r.next_begin_offset


def _writer(tmp_path, backend, **cfg):
    return testing.open_store(str(tmp_path / "store"), backend, live_worker.small_config(**cfg))


def _body_byte(store, q):
    """(CommitLog file, position in it) of a body byte of queue 0's message `q`: changing it
    breaks the record's body CRC and nothing else."""
    phy = store.get_commit_log_offset_in_queue(TOPIC, 0, q)
    mf = store.commitlog.mfq.find_by_offset(phy)
    rec = store.select_one_message_by_offset(phy)
    return mf, phy - mf.file_from_offset + rec.index(live_worker.body(0, q)) + 5


def _unit_path(store, q, queue_id=0):
    cq = store.find_consume_queue(TOPIC, queue_id)
    size = cq.mfq.file_size
    pos = q * CQ_STORE_UNIT_SIZE
    return os.path.join(cq.mfq.store_path, "%020d" % (pos - pos % size)), pos % size


def test_a_reader_follows_new_messages_and_files(tmp_path, backend):
    store = _writer(tmp_path, backend)
    try:
        with LiveReader(store.root, kernels=backend) as reader:
            assert reader.get_message("g", TOPIC, 0, 0).status is G.NO_MATCHED_LOGIC_QUEUE
            _put(store, 10)
            testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
            assert _read_all(reader)[0] == list(range(10))
            _put(store, 1000, start=10)     # a few CommitLog and queue files on
            testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
            got, last = _read_all(reader)
            assert got == list(range(1010))
            assert last.status is G.OFFSET_OVERFLOW_ONE and last.next_begin_offset == 1010
            assert reader.get_max_offset_in_queue(TOPIC, 0) == 1010
            assert len(os.listdir(os.path.join(store.root, "commitlog"))) > 3
    finally:
        store.shutdown()


def test_a_record_that_fails_its_check_is_not_visible_until_the_writer_passes_it(tmp_path,
                                                                                  backend):
    store = _writer(tmp_path, backend)
    try:
        _put(store, 5)
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
        mf, body_at = _body_byte(store, 4)
        with LiveReader(store.root, kernels=backend) as reader:
            # The last record torn (its body CRC no longer matches): not visible, no error.
            mf.mm[body_at] ^= 0xFF
            got, last = _read_all(reader)
            assert got == [0, 1, 2, 3]
            assert last.status is G.OFFSET_OVERFLOW_ONE and last.next_begin_offset == 4
            # Whole again: visible.
            mf.mm[body_at] ^= 0xFF
            assert _read_all(reader, offset=4)[0] == [4]
            # A zero unit (a torn unit, or a writer that died before it) is not visible.
            _put(store, 1, start=5)
            testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
            path, rel = _unit_path(store, 5)
            cq_mm = store.find_consume_queue(TOPIC, 0).mfq.files[-1].mm
            saved = cq_mm[rel:rel + CQ_STORE_UNIT_SIZE]
            cq_mm[rel:rel + CQ_STORE_UNIT_SIZE] = bytes(CQ_STORE_UNIT_SIZE)
            assert _read_all(reader, offset=5)[0] == []
            cq_mm[rel:rel + CQ_STORE_UNIT_SIZE] = saved
            # Damaged for good (the writer wrote later units): skipped, the rest read.
            mf5, at5 = _body_byte(store, 5)
            mf5.mm[at5] ^= 0xFF
            _put(store, 2, start=6)
            testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
            assert _read_all(reader, offset=5)[0] == [6, 7]
    finally:
        store.shutdown()


def test_a_unit_is_checked_against_its_records_queue_offset_and_queue(tmp_path, backend):
    """A unit that points at a whole, valid record of another queue offset (stale units of a
    store a writer rewrote) is never followed."""
    store = _writer(tmp_path, backend)
    try:
        _put(store, 3)
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
        cq_mm = store.find_consume_queue(TOPIC, 0).mfq.files[-1].mm
        u0 = cq_mm[0:CQ_STORE_UNIT_SIZE]
        cq_mm[2 * CQ_STORE_UNIT_SIZE:3 * CQ_STORE_UNIT_SIZE] = u0    # unit 2 -> record 0
        with LiveReader(store.root, kernels=backend) as reader:
            assert _read_all(reader)[0] == [0, 1]
    finally:
        store.shutdown()


class _SlowCreate(FileSystem):
    """A file system whose first new segment past the first one under `directory` appears at
    its final name with size 0 and keeps it until `release` is set, as a broker's file does
    between its creation and setLength: a reader started now finds a writer mid-roll."""

    def __init__(self, directory):
        self.directory = directory
        self.entered = threading.Event()
        self.release = threading.Event()
        self.done = False       # the first file is created as usual; the roll is slow

    def create_sized(self, path, size, preallocate=False):
        if not self.done and os.path.dirname(path).startswith(self.directory) and \
                os.path.basename(path).strip("0") and not os.path.lexists(path):
            self.done = True
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            os.close(fd)
            self.entered.set()
            self.release.wait()
        return super().create_sized(path, size, preallocate)


@pytest.mark.parametrize("where", ["commitlog", "consumequeue"])
def test_a_reader_started_while_the_writer_rolls_sees_every_message(tmp_path, backend, where):
    root = str(tmp_path / "store")
    fs = _SlowCreate(os.path.join(root, where))
    store = testing.open_store(root, backend, live_worker.small_config(), fs=fs)
    acked = []

    def produce():
        for i in range(800):
            r = store.put_message(Message(TOPIC, live_worker.body(0, i), queue_id=0))
            assert r.status.name == "PUT_OK"
            acked.append(i)
    t = threading.Thread(target=produce)
    try:
        t.start()
        assert fs.entered.wait(HANG_S)
        seg_dir = os.path.join(root, where, *((TOPIC, "0") if where == "consumequeue" else ()))
        # The roll's file is there, at size 0: a reader must neither map nor cache it short.
        assert any(os.path.getsize(os.path.join(seg_dir, n)) == 0 for n in os.listdir(seg_dir))
        with LiveReader(root, kernels=backend) as reader:
            got, _ = _read_all(reader)
            assert got == list(range(len(got)))
            fs.release.set()
            t.join(HANG_S)
            testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
            got, _ = _read_all(reader)
            assert got == acked == list(range(800))
    finally:
        fs.release.set()
        t.join(HANG_S)
        store.shutdown()


def test_files_cleaning_deletes_while_a_reader_reads(tmp_path, backend):
    store = _writer(tmp_path, backend, store_size_budget=200 * 1024)
    try:
        _put(store, 300)
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
        with LiveReader(store.root, kernels=backend) as reader:
            first = reader.get_message("g", TOPIC, 0, 0, 8)       # maps the first files
            assert [m.queue_offset for m in first.messages] == list(range(8))
            _put(store, 1500, start=300)
            testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
            testing.wait_flushed(store.commitlog)
            assert store.clean_files_periodically()
            assert not os.path.exists(os.path.join(store.root, "commitlog", "%020d" % 0))
            low = reader.get_min_offset_in_queue(TOPIC, 0)
            assert low > 0
            # Its queue file gone or not, an offset in a deleted stretch answers (too small,
            # or its records stepped over), and reading on from the answer reaches the end.
            r = reader.get_message("g", TOPIC, 0, 8, 8)
            assert r.status in (G.OFFSET_TOO_SMALL, G.NO_MATCHED_MESSAGE, G.FOUND)
            got, last = _read_all(reader, offset=r.next_begin_offset)
            # It steps over records cleaning deleted (how many files one round deletes under
            # the budget varies with the blocks the files hold) and none that are there.
            min_phy = store.get_min_phy_offset()
            live = next(q for q in range(low, 1800)
                        if store.get_commit_log_offset_in_queue(TOPIC, 0, q) >= min_phy)
            assert got == list(range(got[0], 1800)) and got[0] <= live
            # A consumer that never committed starts at the oldest offset there.
            with reader.consume("g", TOPIC, 0, batch_size=500) as c:
                assert c.next_batch(wait_ms=0)[0].queue_offset >= low
    finally:
        store.shutdown()


BAD_OFFSET_CALLS = [
    (lambda s: s.query_offset(None, TOPIC, 0), TypeError),
    (lambda s: s.query_offset("g", None, 0), TypeError),
    (lambda s: s.query_offset("g", TOPIC, "0"), TypeError),
    (lambda s: s.commit_offset("g", TOPIC, 0, None), TypeError),
    (lambda s: s.commit_offset("g", TOPIC, 0, -1), InvalidArgumentError),
    (lambda s: s.commit_offset("g", TOPIC, -1, 0), InvalidArgumentError),
    (lambda s: s.commit_offset("g", "a/b", 0, 0), InvalidArgumentError),
]


def test_the_reader_refuses_the_offset_arguments_the_store_refuses_with_the_same_words(
        tmp_path, backend):
    store = _writer(tmp_path, backend)
    try:
        with LiveReader(store.root, kernels=backend) as reader:
            for call, exc in BAD_OFFSET_CALLS:
                with pytest.raises(exc) as by_store:
                    call(store)
                with pytest.raises(exc) as by_reader:
                    call(reader)
                assert str(by_reader.value) == str(by_store.value)
    finally:
        store.shutdown()


def test_offsets_are_the_readers_own_and_nothing_is_written_in_the_store(tmp_path, backend):
    store = _writer(tmp_path, backend)
    _put(store, 50)
    testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
    store.commit_offset("g", TOPIC, 0, 7)           # the writer's own group offset
    store.shutdown()
    before = testing.tree_digest(store.root)
    with pytest.raises(InvalidArgumentError, match="inside the store"):
        LiveReader(store.root, offsets_path=os.path.join(store.root, "config", "o.json"))
    path = str(tmp_path / "mine" / "consumerOffset.json")
    with LiveReader(store.root, offsets_path=path, kernels=backend) as reader:
        assert reader.query_offset("g", TOPIC, 0) == -1     # not the writer's 7
        with reader.consume("g", TOPIC, 0, batch_size=20) as c:
            assert [m.queue_offset for m in c.next_batch(0)] == list(range(20))
            c.commit()
    assert testing.tree_digest(store.root) == before
    with open(path) as f:
        text = f.read()
    assert '"offsetTable"' in text and f'"{TOPIC}@g"' in text
    with LiveReader(store.root, offsets_path=path, kernels=backend) as again:
        assert again.query_offset("g", TOPIC, 0) == 20
        with again.consume("g", TOPIC, 0, batch_size=100) as c:
            assert c.next_batch(0)[0].queue_offset == 20
    with LiveReader(store.root, kernels=backend) as in_memory:
        in_memory.commit_offset("g", TOPIC, 0, 3)
        assert in_memory.query_offset("g", TOPIC, 0) == 3
    assert testing.tree_digest(store.root) == before


def test_a_wait_returns_when_the_message_arrives_and_close_ends_it(tmp_path, backend):
    store = _writer(tmp_path, backend)
    try:
        _put(store, 1)
        reader = LiveReader(store.root, kernels=backend)
        threading.Timer(0.05, _put, (store, 1), {"start": 1}).start()
        r = reader.get_message("g", TOPIC, 0, 1, 8, wait_ms=60_000)
        assert [m.queue_offset for m in r.messages] == [1]
        c = reader.consume("g", TOPIC, 0)
        assert [m.queue_offset for m in next(c)] == [0, 1]
        threading.Timer(0.05, c.close).start()
        assert list(c) == []                    # close() ends the waiting iteration
        threading.Timer(0.05, reader.close).start()
        with pytest.raises(StoreClosedError):
            reader.get_message("g", TOPIC, 0, 2, 8, wait_ms=60_000)
    finally:
        store.shutdown()


def test_aconsume_on_a_reader_never_blocks_the_loop(tmp_path, backend):
    """The writer is another process, as for any LiveReader (in this one, its threads would
    take the GIL from the loop's steps)."""
    root = tmp_path / "store"
    root.mkdir()
    writer = subprocess.Popen([sys.executable, WORKER, "writer", str(root), "--seconds",
                               "0.5", "--queues", "1", "--rate", "20"],
                              env=_env(), stdout=subprocess.DEVNULL)

    async def main():
        got = []
        with LiveReader(root, kernels=backend) as reader:
            async with reader.aconsume("g", TOPIC, 0, batch_size=8) as c:
                async for batch in c:
                    got += [m.queue_offset for m in batch]
                    if len(got) >= 3:
                        break
            r = await reader.aget_message("g", TOPIC, 0, got[-1] + 1, 8, wait_ms=60_000)
        return got, r

    try:
        got, r = testing.run_guarded_loop(main())
        assert got == list(range(len(got))) and len(got) >= 3
        assert r.messages[0].queue_offset == got[-1] + 1
    finally:
        assert writer.wait(timeout=HANG_S) == 0


def test_the_readme_example_runs_a_producer_and_two_consumer_processes(tmp_path):
    """The README's example, as it is written there: its two scripts are examples/' files,
    and its commands run them (paths under tmp_path)."""
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    examples = os.path.join(top, "examples")
    if not os.path.isdir(examples):
        pytest.skip("no source tree beside the tests (an installed-wheel run)")
    with open(os.path.join(top, "README.md")) as f:
        readme = f.read()
    section = readme[readme.index("## Readers in other processes"):]
    for name in ("live_producer.py", "live_consumer.py"):
        with open(os.path.join(examples, name)) as f:
            assert "```python\n" + f.read() + "```" in section, f"README's {name} differs"
    script = section[section.index("```bash\n") + 8:]
    script = script[:script.index("```")].replace("/tmp/", str(tmp_path) + "/")
    # Block-buffered, each consumer's one line reaches the shared pipe in one write at exit;
    # unbuffered (PYTHONUNBUFFERED), print's text and newline are two writes and the two
    # consumers' lines can interleave.
    env = {k: v for k, v in _env().items() if k != "PYTHONUNBUFFERED"}
    out = subprocess.run(["bash", "-c", "set -e\n" + script], cwd=top, env=env,
                         capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    lines = sorted(out.stdout.splitlines())
    assert lines == ["audit: 10001 messages, next offset 10001",
                     "billing: 10001 messages, next offset 10001",
                     "producer: put 10001 messages"]
    assert os.path.exists(tmp_path / "billing-offsets.json")


def test_a_topic_deleted_and_written_anew_is_read_anew_never_serving_the_deleted_messages(
        tmp_path, backend):
    # The reader used to look for new files only once a read found nothing new, and then only
    # at the file its end lay in: inside the old range it served the deleted messages (their
    # records stay in the CommitLog until they expire) for good, and get_max_offset_in_queue
    # answered the old queue's end (found by tests/test_lifecycle_model.py).
    store = _writer(tmp_path, backend)
    try:
        _put(store, 10)
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
        with LiveReader(store.root, kernels=backend) as reader:
            assert _read_all(reader)[0] == list(range(10))
            store.delete_topic(TOPIC)
            _put(store, 3)              # the topic again, from queue offset 0
            testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
            # Checked at most every replaced_check_s (a stat each time).
            testing.wait_until(lambda: reader.get_max_offset_in_queue(TOPIC, 0) == 3,
                               timeout=1.0, what="the reader to see the queue anew")
            new = [store.get_commit_log_offset_in_queue(TOPIC, 0, i) for i in range(3)]
            got = reader.get_message("g", TOPIC, 0, 1).messages
            assert [m.commit_log_offset for m in got] == new[1:]
            r = reader.get_message("g", TOPIC, 0, 10)
            assert r.status is G.OFFSET_OVERFLOW_BADLY and r.next_begin_offset == 0
            got = reader.get_message("g", TOPIC, 0, 0).messages
            assert [m.body for m in got] == [live_worker.body(0, i) for i in range(3)]
            assert [m.commit_log_offset for m in got] == new
    finally:
        store.shutdown()


def test_file_sizes_come_from_the_config_when_given(tmp_path, backend):
    store = _writer(tmp_path, backend)
    try:
        _put(store, 500)
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
        with LiveReader(store.root, config=store.config, kernels=backend) as reader:
            assert _read_all(reader)[0] == list(range(500))
        # A config the files contradict would show nothing: refused.
        for wrong in (live_worker.small_config(mapped_file_size_consume_queue=1000 * 20),
                      live_worker.small_config(mapped_file_size_commit_log=1 << 20)):
            with pytest.raises(ConfigError, match="the store's files are"):
                LiveReader(store.root, config=wrong, kernels=backend)
    finally:
        store.shutdown()


def test_a_queue_file_cut_short_does_not_size_the_queues_the_reader_maps(tmp_path, backend):
    # A truncated ConsumeQueue file read first had its length (not a multiple of 20) taken as
    # every queue's file size: the next read raised numpy's "cannot reshape array".
    store = _writer(tmp_path, backend)
    try:
        _put(store, 50, queue_id=0)
        _put(store, 50, queue_id=1)
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
        path, _ = _unit_path(store, 0, queue_id=1)
    finally:
        store.shutdown()
    with open(path, "r+b") as f:
        f.truncate(31 * CQ_STORE_UNIT_SIZE + 7)
    with LiveReader(store.root, kernels=backend) as reader:
        got, last = _read_all(reader, queue_id=1)       # the damaged queue first
        assert got == [] and last.status is G.NO_MATCHED_LOGIC_QUEUE
        assert _read_all(reader, queue_id=0)[0] == list(range(50))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Three queues of 60 messages, one file each (so damage to it is all a reader has to
    size the queue files by), over several CommitLog files; shut down."""
    root = tmp_path_factory.mktemp("written") / "store"
    store = testing.open_store(str(root), "pure", live_worker.small_config())
    try:
        for q in range(3):
            _put(store, 60, queue_id=q)
        testing.wait_dispatched(store)
    finally:
        store.shutdown()
    return root


@pytest.mark.parametrize("seed", range(DAMAGE_SEEDS))
def test_a_reader_of_a_store_damaged_at_random_reads_each_queue_to_an_end(written, tmp_path,
                                                                         backend, seed):
    # Found this way: a queue file cut short sized every queue the reader mapped.
    root = tmp_path / "store"
    shutil.copytree(written, root)
    testing.damage_at_random(root, random.Random(seed))
    try:
        reader = LiveReader(root, kernels=backend)
    except StoreError:
        return                      # refused, clearly: nothing to read
    with reader:
        for q in range(3):
            offset, got = 0, []
            try:
                for _ in range(100):        # 60 messages: an end comes long before this
                    r = reader.get_message("g", TOPIC, q, offset, 32)
                    got += [m.queue_offset for m in r.messages]
                    if r.next_begin_offset <= offset:
                        break
                    offset = r.next_begin_offset
                else:
                    pytest.fail(f"queue {q} read on past offset {offset}")
            except StoreError:
                continue
            assert got == sorted(set(got)) and all(0 <= o < 60 for o in got)


# ---- the compiled walk (cext) and the writer's wake-up per put ------------------------------

def _answers(reader, queue_id, calls):
    out = []
    for offset, max_n, flt in calls:
        r = reader.get_message("g", TOPIC, queue_id, offset, max_n, flt)
        out.append((r.status, r.next_begin_offset, r.min_offset, r.max_offset,
                    [(m.queue_offset, m.commit_log_offset, m.body, m.properties,
                      m.store_timestamp, m.born_host_raw, m.store_host_raw, m.body_crc)
                     for m in r.messages]))
    return out


def test_the_compiled_walk_answers_as_the_python_path(tmp_path, monkeypatch):
    """cext's LiveReader reads runs of units in ReadPath.live_walk: its answers (statuses,
    offsets, every message field) are the Python path's, across CommitLog and queue file rolls,
    filters, the max_msg_nums and byte bounds, a damaged record and a unit zeroed."""
    cext = testing.load_backend("cext")
    store = _writer(tmp_path, cext)
    try:
        for i in range(700):            # two queues interleaved: records of each queue
            for q in (0, 1):            # spread over every CommitLog file
                r = store.put_message(Message(TOPIC, live_worker.body(q, i), queue_id=q,
                                              tags="even" if i % 2 == 0 else "odd"))
                assert r.status.name == "PUT_OK"
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0)
        mf, at = _body_byte(store, 300)
        mf.mm[at] ^= 0xFF               # damaged for good: later units exist
        even = tags_code_of("even")

        def only_even(tags):
            return tags == even
        calls = [(o, n, f) for o in (0, 1, 97, 99, 100, 290, 299, 300, 301, 640, 699, 700,
                                     701)
                 for n in (1, 7, 32) for f in (None, only_even)]
        calls += [(o, 32, None) for o in range(0, 700, 32)]
        compiled = LiveReader(store.root, kernels=cext)
        python = LiveReader(store.root, kernels=cext)
        python._walk = None
        walked = []
        walk = compiled._walk
        compiled._walk = lambda *a: walked.append(walk(*a)) or walked[-1]
        with compiled, python:
            for queue_id in (0, 1):
                assert _answers(compiled, queue_id, calls) == _answers(python, queue_id, calls)
            # A unit zeroed under readers that saw it written (a writer's recovery drops it).
            path, rel = _unit_path(store, 650)
            cq_mm = store.find_consume_queue(TOPIC, 0).mfq.files[-1].mm
            cq_mm[rel:rel + CQ_STORE_UNIT_SIZE] = bytes(CQ_STORE_UNIT_SIZE)
            after = [(o, 32, None) for o in (640, 650, 651, 0)]
            assert _answers(compiled, 0, after) == _answers(python, 0, after)
            assert [len(r[4]) for r in _answers(compiled, 0, after[:3])] == [10, 0, 0]
            # A byte bound that ends a call before max_msg_nums: three records fit.
            biggest = max(m.store_size for m in store.get_message("g", TOPIC, 0, 0).messages)
            monkeypatch.setattr("rocketstore.read_path.MAX_BYTES", 3 * biggest)
            small = [(o, 32, None) for o in (0, 5, 298)]
            assert _answers(compiled, 0, small) == _answers(python, 0, small)
            assert [len(r[4]) for r in _answers(compiled, 0, small)] == [3, 3, 3]
        assert sum(did for did, _, _ in walked) > 1000      # the compiled walk did read
        rp = type(compiled._read_path)
        assert {why for _, why, _ in walked} == {rp.LIVE_DONE, rp.LIVE_ZERO, rp.LIVE_FULL,
                                                 rp.LIVE_OTHER}
    finally:
        store.shutdown()


def test_the_compiled_walk_refuses_units_outside_its_mapping():
    from rocketstore.errors import KernelBoundsError
    from rocketstore.read_path import make_read_path
    walk = make_read_path(testing.load_backend("cext")).live_walk
    units = bytes(2 * CQ_STORE_UNIT_SIZE)
    for rel, n in ((0, 3), (CQ_STORE_UNIT_SIZE, 2), (-1, 1), (0, -1)):
        with pytest.raises(KernelBoundsError, match="outside the mapping"):
            walk(units, rel, n, 0, None, -1, b"t", 0, 32, 1 << 20, 0, None, [])
    assert walk(units, 0, 2, 0, None, -1, b"t", 0, 32, 1 << 20, 0, None, [])[:2] == \
        (0, type(walk.__self__).LIVE_ZERO)


def test_wake_reput_on_put_makes_each_put_visible_without_reputs_cycle(tmp_path, backend,
                                                                        monkeypatch):
    """With wake_reput_on_put, a put wakes the writer's reput itself, so a LiveReader sees it
    at once: here reput's own cycle is made an hour long, and each put still arrives."""
    from rocketstore.consumer import PutWake
    from rocketstore.services.reput import ReputMessageService
    # A store wakes reput per put only while a consumer of its own waits, or while reput is
    # idle (tests/test_idle_threads.py), which it is kept from here.
    monkeypatch.setattr(ReputMessageService, "IDLE_AFTER_MS", 3_600_000)
    plain = _writer(tmp_path / "plain", backend)
    try:
        assert not isinstance(plain.commitlog.wake_on_put, PutWake)
    finally:
        plain.shutdown()
    store = _writer(tmp_path, backend, wake_reput_on_put=True)
    try:
        reput = store.reput_service
        cycle = reput.wait_for_running
        reput.wait_for_running = lambda interval_ms: cycle(3_600_000)
        with LiveReader(store.root, kernels=backend) as reader:
            for i in range(5):
                _put(store, 1, start=i)
                testing.wait_until(
                    lambda i=i: reader.get_message("g", TOPIC, 0, i).status is G.FOUND,
                    HANG_S, f"message {i} visible to the reader")
            # A consumer of the writer's own that waits and leaves does not turn it off.
            store.get_message("g", TOPIC, 0, 5, wait_ms=1)
            assert isinstance(store.commitlog.wake_on_put, PutWake)
            _put(store, 1, start=5)
            testing.wait_until(lambda: reader.get_message("g", TOPIC, 0, 5).status is G.FOUND,
                               HANG_S, "message 5 visible to the reader")
    finally:
        store.shutdown()


def test_wake_reput_on_put_is_a_config_field_with_a_properties_key():
    from rocketstore import StoreConfig
    assert StoreConfig().wake_reput_on_put is False
    assert StoreConfig.from_properties({"wakeReputOnPut": "true"}).wake_reput_on_put is True
    with pytest.raises(ConfigError, match="wake_reput_on_put"):
        StoreConfig(wake_reput_on_put="yes")
