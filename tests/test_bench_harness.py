# SPDX-License-Identifier: Apache-2.0
"""The checks every benchmark and `rocketstore bench` run after their timed region: a put that
was refused, or a message that does not read back, fails the run instead of being counted."""
import os
import subprocess
import sys

import pytest

from rocketstore import MessageStore, testing
from rocketstore.errors import WorkloadCheckError
from rocketstore.workload import (check_puts, check_read_back, commitlog_bytes, make_messages,
                                  sized_config)


@pytest.fixture
def store(tmp_path, backend):
    s = testing.open_store(tmp_path / "s", backend, testing.small_config(),
                           disk_usage=lambda path: 0.5)
    yield s
    s.shutdown()


def test_check_puts_passes_puts_that_stored_everything(store):
    msgs = make_messages(50)
    results = [store.put_messages(msgs[:40])] + [store.put_message(m) for m in msgs[40:]]
    assert check_puts(results, 50) == 50


def test_check_puts_names_the_status_and_reason_of_a_refused_put(tmp_path, backend):
    usage = {"ratio": 0.5}
    store = testing.open_store(tmp_path / "s", backend, testing.small_config(),
                               disk_usage=lambda path: usage["ratio"])
    try:
        msgs = make_messages(3)
        results = [store.put_message(msgs[0])]
        usage["ratio"] = 0.99
        assert store.clean_commitlog_service.is_space_full()
        results.append(store.put_message(msgs[1]))
        with pytest.raises(WorkloadCheckError, match=r"put 2 of 2 answered "
                                                     r"SERVICE_NOT_AVAILABLE: disk full"):
            check_puts(results)
        with pytest.raises(WorkloadCheckError, match="put 1 of 1 answered "
                                                     "SERVICE_NOT_AVAILABLE: disk full"):
            check_puts([store.put_messages(msgs[2:])])
    finally:
        store.shutdown()


def test_check_puts_counts_what_the_batches_stored(store):
    results = [store.put_messages(make_messages(10))]
    with pytest.raises(WorkloadCheckError, match="10 of 11 messages were stored"):
        check_puts(results, 11)


def test_check_read_back_passes_a_store_holding_every_message(store):
    msgs = make_messages(200, queues=4)
    for _ in range(2):
        check_puts([store.put_messages(msgs)], 200)
    check_read_back(store, msgs, rounds=2)
    check_read_back(store, msgs, rounds=2, ordered=False)
    check_read_back(store, msgs, rounds=2, sample=5)


def test_check_read_back_finds_messages_missing_from_a_queue(store):
    msgs = make_messages(200, queues=4)
    check_puts([store.put_messages(msgs[:150])], 150)
    with pytest.raises(WorkloadCheckError, match="holds 3[78] messages; 50 were put"):
        check_read_back(store, msgs)
    with pytest.raises(WorkloadCheckError, match="holds 3[78] messages; 50 were put"):
        check_read_back(store, msgs, sample=5)


def test_check_read_back_finds_a_body_that_differs(store):
    msgs = make_messages(20, queues=1)
    check_puts([store.put_messages(msgs)], 20)
    other = make_messages(20, queues=1)
    other[7].body = b"not what was put"
    with pytest.raises(WorkloadCheckError, match="BenchTopic0 queue 0 offset 7: the body"):
        check_read_back(store, other)
    with pytest.raises(WorkloadCheckError, match="the body differs"):
        check_read_back(store, other, ordered=False)


def test_sized_config_fits_the_data_in_one_commitlog_file(tmp_path, backend):
    msgs = make_messages(3000, body_size=300)
    cfg = sized_config(msgs, rounds=3)
    assert cfg.mapped_file_size_commit_log <= commitlog_bytes(msgs, 3) + (2 << 20)
    with MessageStore(tmp_path / "s", cfg, kernels=backend) as store:
        for _ in range(3):
            check_puts([store.put_messages(msgs)], 3000)
        check_read_back(store, msgs, rounds=3)
        assert len(store.commitlog.mfq.files) == 1
        assert store.get_max_phy_offset() <= commitlog_bytes(msgs, 3)


def test_bench_sizes_its_commitlog_file_to_the_messages(tmp_path):
    root = tmp_path / "s"
    r = testing.run_cli("bench", "--dir", str(root), "--messages", "2000", "--queries", "10",
                        "--json")
    assert r.returncode == 0, r.stderr
    sizes = [os.path.getsize(root / "commitlog" / n) for n in os.listdir(root / "commitlog")]
    assert sizes and max(sizes) <= 2 << 20


@pytest.fixture
def tiny_disk(tmp_path):
    """A 4 MiB tmpfs, unmounted at teardown."""
    with testing.tmpfs(tmp_path / "mnt", "4m") as mnt:
        yield mnt


@pytest.mark.parametrize("messages,file_size", [(40000, 1 << 20), (5000, 8 << 20)])
def test_bench_filling_its_disk_ends_with_a_one_line_error_not_a_signal(tiny_disk, messages,
                                                                         file_size):
    # The index file's 20 MB slot table never fits the 4 MiB disk: its creation must raise
    # ENOSPC (on tmpfs even reading an unreserved page through the mapping allocates it, and
    # used to raise SIGBUS), and the puts or the dispatch then fail with the disk's reason.
    r = testing.run_cli("bench", "--dir", str(tiny_disk / "s"), "--messages", str(messages),
                        "--file-size", str(file_size))
    assert r.returncode == 1, r.stderr
    last = r.stderr.splitlines()[-1]
    assert last.startswith("rocketstore bench: error: "), r.stderr
    assert "No space left on device" in last and "Traceback" not in r.stderr


@pytest.mark.parametrize("threads", ["1", "2"])
def test_bench_refuses_a_body_over_the_message_size_before_building_anything(threads):
    r = testing.run_cli("bench", "--messages", "4", "--size", str(5 << 20), "--threads", threads)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "rocketstore bench: error: --size is 5242880; a body may be at most 4194304 bytes "
        "(max_message_size)"]


@pytest.mark.parametrize("option,value", [("--messages", "-5"), ("--queues", "0"),
                                          ("--topics", "0"), ("--threads", "0"),
                                          ("--batch", "0"), ("--queries", "-1"),
                                          ("--file-size", "-1")])
def test_bench_refuses_a_count_it_cannot_use_with_one_line_and_no_temporary_store(
        tmp_path, option, value):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "rocketstore", "bench", option, value],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"rocketstore bench: error: {option} is {value}; it must be at least "
        f"{0 if option in ('--messages', '--queries', '--file-size') else 1}"]
    assert os.listdir(tmp_path) == []


def test_bench_failing_after_it_made_its_temporary_store_deletes_it(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "rocketstore", "bench", "--messages", "100",
                        "--file-size", str(1 << 40)], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "does not fit a Java int" in r.stderr.splitlines()[-1]
    assert os.listdir(tmp_path) == []


def test_bench_with_threads_that_interleave_in_a_queue_checks_what_it_read_back():
    # 3 threads over 4 queues, in batches of 7: every queue takes puts from several threads,
    # in an order of their making.
    r = testing.run_cli("bench", "--messages", "1000", "--threads", "3", "--batch", "7",
                        "--queries", "3", "--json")
    assert r.returncode == 0, r.stderr


def test_check_read_back_unordered_sample_finds_a_body_never_put_to_the_queue(store):
    msgs = make_messages(40, queues=2)
    check_puts([store.put_messages(msgs)], 40)
    shuffled = msgs[::-1]
    check_read_back(store, shuffled, ordered=False, sample=20)
    other = make_messages(40, queues=2)
    for m in other:
        m.body = b"never put"
    with pytest.raises(WorkloadCheckError, match="the body differs"):
        check_read_back(store, other, ordered=False, sample=1)


@pytest.mark.parametrize("threads", [1, 2])
def test_bench_put_raising_in_a_producer_thread_reaches_the_caller(store, threads):
    from rocketstore.cli.bench import _produce
    from rocketstore.errors import MessageIllegalError
    from rocketstore.cli.progress import progress_bar
    msgs = make_messages(4)
    msgs[3].topic = "not/a topic"
    with progress_bar(4, "produce") as bar, pytest.raises(MessageIllegalError, match="topic"):
        _produce(store, msgs, 1, threads, bar)
