# SPDX-License-Identifier: Apache-2.0
"""Retention by size (store_size_budget) and topic deletion (delete_topic,
clean_unused_topic, destroy), driven by an injected clock and disk-usage source."""
import os
import time

import pytest

from rocketstore import GetMessageStatus as G, Message, MessageStore, testing
from rocketstore.errors import ConfigError, StoreClosedError
from rocketstore.config import StoreConfig
from rocketstore.clock import ManualClock

NOW = 1_700_000_000_000
HOUR = 3_600_000
FILE = 4096
OTHER_HOUR = str((time.localtime(NOW / 1000).tm_hour + 12) % 24)   # never reached here



def config(**overrides):
    # Files never expire by age in these tests (the delete hour is never reached, the disk
    # is nearly empty): whatever goes, goes for the budget.
    base = dict(mapped_file_size_commit_log=FILE, mapped_file_size_consume_queue=10 * 20,
                file_reserved_time=1, delete_when=OTHER_HOUR,
                delete_commit_log_files_interval=0, delete_consume_queue_files_interval=0,
                flush_interval_commit_log=10, delete_file_batch_max=100)
    base.update(overrides)
    return testing.small_config(**base)


@pytest.fixture
def make(tmp_path, backend):
    stores = []

    def make(root=None, **overrides):
        s = testing.open_store(root or tmp_path / "store", backend, config=config(**overrides),
                               clock=ManualClock(NOW), disk_usage=lambda path: 0.1)
        stores.append(s)
        return s
    yield make
    for s in stores:
        s.shutdown()


def fill(store, n=60, topic="TopicA", queue_id=0, body=b"b" * 200):
    results = [store.put_message(Message(topic, body, queue_id=queue_id)) for _ in range(n)]
    assert all(r.ok for r in results)
    testing.wait_dispatched(store)
    testing.wait_flushed(store.commitlog)
    return results




# ---- store_size_budget --------------------------------------------------------------------

def test_store_size_budget_is_validated():
    assert StoreConfig().store_size_budget == 0
    with pytest.raises(ConfigError, match="store_size_budget"):
        StoreConfig(store_size_budget=-1)
    with pytest.raises(ConfigError, match="store_size_budget"):
        StoreConfig(store_size_budget="1G")
    assert StoreConfig.from_properties({"storeSizeBudget": "5000"}).store_size_budget == 5000


def test_store_size_counts_allocated_bytes_of_commitlog_queues_and_index(make):
    store = make()
    fill(store)
    cl_dir = store.commitlog.mfq.store_path
    # Every CommitLog segment, the one the allocator made ahead of the writer included.
    paths = [os.path.join(cl_dir, n) for n in os.listdir(cl_dir)]
    paths += [f.path for cq in store.all_consume_queues() for f in cq.mfq.files]
    paths += [f.path for f in store.index_service.index_file_list]
    want = sum(os.stat(p).st_blocks * 512 for p in paths)
    assert store.store_size() == want


def test_no_budget_deletes_nothing_that_has_not_expired(make):
    store = make()
    fill(store)
    before = testing.commitlog_names(store.commitlog)
    plan = store.clean_plan()
    assert plan.budget == 0 and not plan.over_budget and plan.files == []
    assert plan.store_bytes == store.store_size()
    assert store.clean_files_periodically() == []
    assert testing.commitlog_names(store.commitlog) == before


def test_budget_deletes_the_oldest_commitlog_files_and_their_queue_files_first(make):
    probe = make()
    fill(probe)
    full = probe.store_size()
    probe.shutdown()
    # The same data in a store whose budget is about half of what it takes.
    budget = full // 2
    store = make(root=probe.root + "-b", store_size_budget=budget)
    results = fill(store)
    before = testing.commitlog_names(store.commitlog)
    cq_before = [f.file_name for f in store.find_consume_queue("TopicA", 0).mfq.files]
    plan = store.clean_plan()
    assert plan.over_budget and plan.store_bytes > budget
    assert [f[0] for f in plan.files] == before[:len(plan.files)]
    assert plan.store_bytes - plan.freed_bytes <= budget
    deleted = store.clean_files_periodically()
    assert [f.file_name for f in deleted] == [f[0] for f in plan.files]
    assert testing.commitlog_names(store.commitlog) == before[len(deleted):]
    cq_after = [f.file_name for f in store.find_consume_queue("TopicA", 0).mfq.files]
    assert cq_after == cq_before[len(cq_before) - len(cq_after):]
    assert len(cq_after) < len(cq_before)
    assert store.store_size() <= budget
    # The newest messages are all still there; the queue starts past the deleted ones.
    new_min = store.get_min_phy_offset()
    first = store.get_min_offset_in_queue("TopicA", 0)
    assert results[first].commit_log_offset >= new_min
    g = store.get_message("g", "TopicA", 0, first, 64)
    assert g.status is G.FOUND
    assert [m.commit_log_offset for m in g.messages] == \
        [r.commit_log_offset for r in results[first:]]
    # Within budget now: the next round deletes nothing.
    assert not store.clean_plan().over_budget
    assert store.clean_files_periodically() == []


def test_a_budget_is_kept_from_the_first_cleaning_interval_after_start(make):
    """The scheduled round, not a manual one, brings the store within its budget: with a
    budget the first round comes after clean_resource_interval (RocketMQ's first round, a
    minute after start, would leave the store over it meanwhile)."""
    probe = make()
    fill(probe)
    budget = probe.store_size() // 2
    probe.shutdown()
    store = make(root=probe.root + "-b", store_size_budget=budget, clean_resource_interval=50)
    fill(store)
    deadline = time.monotonic() + 20
    while store.store_size() > budget and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.store_size() <= budget
    assert store.get_min_phy_offset() > 0


def test_budget_never_deletes_unconsumed_data_when_protected(make):
    store = make(store_size_budget=1, clean_protect_unconsumed=True)
    results = fill(store)
    store.commit_offset("slow", "TopicA", 0, 10)
    needed = results[10].commit_log_offset
    plan = store.clean_plan()
    assert plan.over_budget and plan.protected and plan.lost == {}
    assert all(end <= needed for _, _, end in plan.files)
    deleted = store.clean_files_periodically()
    assert all(f.end_offset <= needed for f in deleted)
    g = store.get_message("slow", "TopicA", 0, 10, 64)
    assert g.status is G.FOUND
    assert [m.commit_log_offset for m in g.messages] == \
        [r.commit_log_offset for r in results[10:]]
    # Once the group has consumed everything, the budget takes all but the current file.
    store.commit_offset("slow", "TopicA", 0, len(results))
    store.clean_files_periodically()
    assert len(testing.commitlog_names(store.commitlog)) == 1


def test_budget_without_protection_reports_what_the_groups_lose(make):
    store = make(store_size_budget=1)
    results = fill(store)
    store.commit_offset("slow", "TopicA", 0, 0)
    plan = store.clean_plan()
    assert plan.over_budget and not plan.protected
    new_min = plan.files[-1][2]
    assert plan.lost == {"slow": sum(r.commit_log_offset < new_min for r in results)}
    assert len(store.clean_files_periodically()) == len(plan.files)
    assert len(testing.commitlog_names(store.commitlog)) == 1


# ---- delete_topic -------------------------------------------------------------------------

def _topic_dir(store, topic):
    return os.path.join(store.root, "consumequeue", topic)


def test_delete_topic_removes_queues_config_and_offsets_and_keeps_records(make):
    store = make()
    store.update_topic_config("Gone", read_queue_nums=2, write_queue_nums=2)
    gone = fill(store, 30, topic="Gone") + fill(store, 5, topic="Gone", queue_id=1)
    kept = fill(store, 10, topic="Kept")
    store.commit_offset("g", "Gone", 0, 7)
    store.commit_offset("g", "Kept", 0, 3)
    max_before = store.get_max_phy_offset()
    assert store.delete_topic("Gone") is True
    assert not os.path.exists(_topic_dir(store, "Gone"))
    assert store.topic_config("Gone") is None
    assert store.query_offset("g", "Gone", 0) == -1
    assert store.query_offset("g", "Kept", 0) == 3
    # Its records stay in the CommitLog until they expire.
    assert store.get_max_phy_offset() == max_before
    assert store.look_message_by_offset(gone[0].commit_log_offset).topic == "Gone"
    # Not served: as for a topic never written.
    never = store.get_message("g", "Never", 0, 0)
    g = store.get_message("g", "Gone", 0, 0)
    assert g.status is never.status and g.messages == [] and \
        g.next_begin_offset == never.next_begin_offset
    assert store.get_max_offset_in_queue("Gone", 0) == 0
    assert store.get_message("g", "Kept", 0, 0, 64).messages[-1].commit_log_offset == \
        kept[-1].commit_log_offset
    # Deleting it again has nothing left to delete.
    assert store.delete_topic("Gone") is False


def test_a_put_after_delete_topic_starts_a_fresh_queue_at_offset_zero(make):
    store = make()
    fill(store, 25, topic="T")
    store.delete_topic("T")
    r = store.put_message(Message("T", b"new"))
    assert r.ok and r.queue_offset == 0
    g = store.get_message("g", "T", 0, 0, 64)
    assert g.status is G.FOUND and [m.body for m in g.messages] == [b"new"]


def test_a_topic_deleted_before_its_records_reached_its_queues_is_deleted(make):
    # Found by tests/test_lifecycle_model.py: with its records still in write buffers (or not
    # yet dispatched), the topic looked as if it had nothing to delete; delete_topic answered
    # False, and its queues came once the records were committed and dispatched.
    store = make(transient_store_pool_enable=True, commit_interval_commit_log=10,
                 commit_commit_log_least_pages=4,
                 commit_commit_log_thorough_interval=2 ** 31 - 1)
    puts = [store.put_message(Message("Fresh", b"x", queue_id=q)) for q in range(3)]
    time.sleep(0.05)                        # five commit rounds: under 4 pages, none commits
    assert store.commitlog.mfq.committed_where == 0 == store.dispatch_behind_bytes()
    assert store.delete_topic("Fresh") is True
    store.catch_up()
    assert [store.get_max_offset_in_queue("Fresh", q) for q in range(3)] == [0, 0, 0]
    assert store.get_message("g", "Fresh", 0, 0).messages == []
    assert store.query_message("Fresh", puts[0].msg_id).messages == []


@pytest.mark.parametrize("put_after", [False, True])
@pytest.mark.parametrize("crash", [False, True])
def test_a_deleted_topic_is_not_served_after_restart(tmp_path, backend, crash, put_after):
    root = tmp_path / "store"
    store = testing.open_store(root, backend, config=config())
    fill(store, 40, topic="T")
    fill(store, 5, topic="Other")
    fill(store, 20, topic="T")       # T's records are the newest in the CommitLog
    store.delete_topic("T")
    if put_after:
        r = store.put_message(Message("T", b"after", queue_id=0))
        assert r.ok and r.queue_offset == 0
    testing.wait_dispatched(store)
    testing.wait_flushed(store.commitlog)
    if crash:
        # An abnormal exit: the next open dispatches the CommitLog again from its start.
        store.checkpoint.physic_msg_timestamp = store.checkpoint.logics_msg_timestamp = 0
        store.checkpoint.index_msg_timestamp = 0
        store.checkpoint.flush()
        store.shutdown()
        open(root / "abort", "wb").close()
    else:
        # A clean exit: the next start dispatches from where the remaining queues end,
        # which is before T's last records.
        store.shutdown()
    again = testing.open_store(root, backend, config=config())
    try:
        if crash:
            assert again.recovery_report.dispatched > 60
        testing.wait_dispatched(again)
        want = [b"after"] if put_after else []
        assert [m.body for m in again.get_message("g", "T", 0, 0, 64).messages] == want
        assert again.get_max_offset_in_queue("T", 0) == len(want)
        assert again.get_message("g", "T", 0, 40, 64).messages == []
        r = again.put_message(Message("T", b"later"))
        assert r.ok and r.queue_offset == len(want)
        assert len(again.get_message("g", "Other", 0, 0, 64).messages) == 5
    finally:
        again.shutdown()


def test_delete_topic_while_other_threads_put_loses_and_misplaces_nothing(make):
    import threading
    store = make()
    fill(store, 20, topic="T")
    stop = threading.Event()
    acks = {"Other": [], "T": []}

    def producer(topic):
        i = 0
        while not stop.is_set() or i < 50:
            r = store.put_message(Message(topic, b"%d" % i))
            assert r.ok
            acks[topic].append(r)
            i += 1
    threads = [threading.Thread(target=producer, args=(t,)) for t in ("Other", "T")]
    for t in threads:
        t.start()
    testing.wait_until(lambda: len(acks["T"]) >= 20, what="puts to T")
    assert store.delete_topic("T")
    stop.set()
    for t in threads:
        t.join()
    testing.wait_dispatched(store)
    other = testing.read_queue(store, "Other", batch=1000)
    assert [m.commit_log_offset for m in other] == [r.commit_log_offset for r in acks["Other"]]
    # T's puts that came after the deletion form the new queue, from offset 0, in order.
    deleted_at = store.deleted_topics.table["T"]["offset"]
    after = [r for r in acks["T"] if r.commit_log_offset >= deleted_at]
    assert 20 <= len(acks["T"]) - len(after) and after    # puts on both sides
    got = testing.read_queue(store, "T", batch=1000)
    assert [m.commit_log_offset for m in got] == [r.commit_log_offset for r in after]
    assert [m.queue_offset for m in got] == list(range(len(after)))


def test_a_deletion_killed_after_its_entry_finishes_at_the_next_open(tmp_path, backend):
    root = tmp_path / "store"
    store = testing.open_store(root, backend, config=config())
    store.update_topic_config("T")
    fill(store, 30, topic="T")
    fill(store, 3, topic="Other")
    store.commit_offset("g", "T", 0, 4)
    store.persist_configs()
    # The first step of delete_topic (the durable entry), then a kill: queues, config and
    # offsets are all still there.
    store.deleted_topics.mark("T", store.get_max_phy_offset(), pending=True)
    store.shutdown()
    again = testing.open_store(root, backend, config=config())
    try:
        assert "T" not in again.consume_queue_table
        assert not os.path.exists(_topic_dir(again, "T"))
        assert again.topic_config("T") is None and again.query_offset("g", "T", 0) == -1
        assert again.get_message("g", "T", 0, 0).messages == []
        assert again.deleted_topics.pending() == []
        assert len(again.get_message("g", "Other", 0, 0, 64).messages) == 3
    finally:
        again.shutdown()


def test_a_deletion_killed_after_setting_its_queues_aside_finishes_at_the_next_open(
        tmp_path, backend):
    root = tmp_path / "store"
    store = testing.open_store(root, backend, config=config())
    fill(store, 30, topic="T")
    store.shutdown()
    # The state between the rename and the removal of the set-aside directory.
    store = MessageStore(root, config(), kernels=backend)
    store.load()
    store.deleted_topics.mark("T", store.get_max_phy_offset(), pending=True)
    store.shutdown()
    os.rename(root / "consumequeue" / "T", root / "consumequeue" / "T.deleted")
    again = testing.open_store(root, backend, config=config())
    try:
        assert not os.path.exists(root / "consumequeue" / "T.deleted")
        assert again.get_message("g", "T", 0, 0).messages == []
        assert again.stray_files() == []
    finally:
        again.shutdown()


def test_a_read_only_open_does_not_serve_a_topic_whose_deletion_was_interrupted(
        tmp_path, backend):
    root = tmp_path / "store"
    store = testing.open_store(root, backend, config=config())
    fill(store, 30, topic="T")
    fill(store, 3, topic="Other")
    store.deleted_topics.mark("T", store.get_max_phy_offset(), pending=True)
    store.shutdown()
    reader = MessageStore.open_read_only(root, kernels=backend)
    try:
        assert "T" not in reader.consume_queue_table
        assert len(reader.get_message("g", "Other", 0, 0, 64).messages) == 3
    finally:
        reader.shutdown()
    assert os.path.isdir(root / "consumequeue" / "T")     # a reader changes nothing


def test_delete_topic_refuses_bad_input_and_a_read_only_store(make, tmp_path, backend):
    store = make()
    fill(store, 3, topic="T")
    with pytest.raises(TypeError):
        store.delete_topic(None)
    store.shutdown()
    with pytest.raises(StoreClosedError):
        store.delete_topic("T")
    reader = MessageStore.open_read_only(store.root, kernels=backend)
    try:
        with pytest.raises(StoreClosedError):
            reader.delete_topic("T")
    finally:
        reader.shutdown()


def test_deleted_topic_entries_go_once_its_records_expired(make):
    store = make(store_size_budget=1)
    fill(store, 30, topic="T")
    store.delete_topic("T")
    assert "T" in store.deleted_topics.table
    fill(store, 60, topic="Other")
    store.clean_files_periodically()
    assert store.get_min_phy_offset() > store.deleted_topics.table.get("T", {"offset": 0})[
        "offset"] or "T" not in store.deleted_topics.table
    assert "T" not in store.deleted_topics.table and store.deleted_topics.offsets_raw == {}


# ---- clean_unused_topic, destroy -----------------------------------------------------------

def test_clean_unused_topic_keeps_the_kept_and_system_topics(make):
    store = make()
    for topic in ("Keep", "Drop", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
                  "rmq_sys_foo", "TBW102", "%LMQ%x"):
        fill(store, 2, topic=topic)
    store.update_topic_config("Drop")
    assert store.clean_unused_topic({"Keep"}) == ["Drop"]
    assert sorted(store.consume_queue_table) == sorted(
        ["Keep", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_foo", "TBW102",
         "%LMQ%x"])
    assert not os.path.exists(_topic_dir(store, "Drop"))
    assert store.topic_config("Drop") is not None       # 4.9.8 leaves the config
    assert store.get_message("g", "Drop", 0, 0).messages == []
    with pytest.raises(TypeError):
        store.clean_unused_topic("Keep")


def test_destroy_is_refused_while_the_store_is_open_and_removes_every_file_after(
        make, tmp_path):
    store = make()
    fill(store, 10)
    store.update_topic_config("TopicA")
    with pytest.raises(Exception, match="shutdown"):
        store.destroy()
    assert os.path.isdir(os.path.join(store.root, "commitlog"))
    store.shutdown()
    foreign = os.path.join(store.root, "mine.txt")
    open(foreign, "w").close()
    store.destroy()
    assert os.listdir(store.root) == ["mine.txt"]
    os.remove(foreign)
    store.destroy()                 # nothing left: a second call is harmless
    assert not os.path.exists(store.root)


def test_a_kill_anywhere_in_delete_topic_leaves_the_topic_whole_or_deleted(tmp_path):
    """Kill the deletion at each of its file-system changes in turn; every time the store
    opens (recovering) with T either whole (all 30 messages, config, offsets) or deleted (not
    served, config and offsets gone), and a put to T then works. One backend (the first
    expected): the deletion's file-system steps are Python's, the same under every backend,
    and a child process per step costs seconds."""
    import subprocess
    import sys
    backend = testing.load_backend(testing.backend_params()[0])
    child = os.path.join(os.path.dirname(__file__), "crashers", "delete_topic.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    seen = set()
    for kill_at in range(1, 100):
        root = tmp_path / f"store{kill_at}"
        rc = subprocess.run([sys.executable, child, str(root), backend.NAME, str(kill_at)],
                            env=env, timeout=120).returncode
        assert rc in (0, 9)
        store = testing.open_store(root, backend, config=config())
        try:
            testing.wait_dispatched(store)
            got = [m.body for q in (0, 1)
                   for m in store.get_message("g", "T", q, 0, 64).messages]
            whole = len(got) == 30
            if whole:
                assert store.topic_config("T") is not None
                assert store.query_offset("g", "T", 0) == 3
                seen.add("whole")
            else:
                assert got == [], f"killed at change {kill_at}: {len(got)} of T's messages"
                assert store.topic_config("T") is None
                assert store.query_offset("g", "T", 0) == -1
                assert not any(n.startswith("T") for n in
                               os.listdir(os.path.join(root, "consumequeue")))
                seen.add("deleted")
            assert [m.body for m in store.get_message("g", "Other", 0, 0, 64).messages] == \
                [b"o%d" % i for i in range(5)]
            r = store.put_message(Message("T", b"new", queue_id=0))
            assert r.ok and r.queue_offset == (15 if whole else 0)
        finally:
            store.shutdown()
        if rc == 0:
            break
    assert rc == 0 and seen == {"whole", "deleted"}


def test_destroy_is_refused_while_another_store_holds_the_directory(make, backend):
    from rocketstore.errors import StoreLockedError
    store = make()
    fill(store, 5)
    other = MessageStore(store.root, config(), kernels=backend)
    with pytest.raises(StoreLockedError):
        other.destroy()
    assert store.get_message("g", "TopicA", 0, 0, 64).messages


# ---- the CLI --------------------------------------------------------------------------------

# small_config's index numbers, which the index file sizes alone do not tell.
INDEX_OPTS = ("--max-hash-slot-num", "64", "--max-index-num", "500")


def _cli_store(root, backend):
    store = testing.open_store(root, backend, config=config())
    store.update_topic_config("T")
    fill(store, 12, topic="T")
    fill(store, 3, topic="Other")
    store.commit_offset("g", "T", 0, 2)
    return store


def test_cli_delete_topic_deletes_and_verify_stays_clean(tmp_path, backend):
    import json
    root = tmp_path / "store"
    _cli_store(root, backend).shutdown()
    r = testing.run_cli("delete-topic", str(root), "T", *INDEX_OPTS)
    assert r.returncode == 0 and "deleted topic T" in r.stdout, r.stderr
    st = json.loads(testing.run_cli("stat", str(root), "--json", check=True).stdout)
    assert [t["topic"] for t in st["topics"]] == ["Other"]
    assert all(t["topic"] != "T" for g in st["groups"] for t in g["topics"])
    # Its records are still in the CommitLog, and that is no damage.
    assert testing.run_cli("verify", str(root)).returncode == 0
    r = testing.run_cli("delete-topic", str(root), "T", *INDEX_OPTS)
    assert r.returncode == 1 and "nothing deleted" in r.stderr


def test_cli_delete_topic_refuses_a_store_in_use_in_one_line(tmp_path, backend):
    root = tmp_path / "store"
    store = _cli_store(root, backend)
    try:
        r = testing.run_cli("delete-topic", str(root), "T", *INDEX_OPTS)
        assert r.returncode == 2
        assert r.stderr.count("\n") == 1 and f"process {os.getpid()} holds its lock" in r.stderr, \
            r.stderr
        assert store.get_message("g", "T", 0, 0, 64).messages
    finally:
        store.shutdown()


def test_cli_stat_shows_the_store_size_against_a_budget(tmp_path, backend):
    import json
    root = tmp_path / "store"
    _cli_store(root, backend).shutdown()
    reader = MessageStore.open_read_only(root, kernels=backend)
    try:
        size = reader.store_size()
    finally:
        reader.shutdown()
    st = json.loads(testing.run_cli("stat", str(root), "--json", "--budget",
                                    str(4 * size), check=True).stdout)
    assert st["storeSize"] == {"bytes": size, "budget": 4 * size, "budgetUsedRatio": 0.25}
    out = testing.run_cli("stat", str(root), "--budget", str(4 * size), check=True).stdout
    assert f"budget     {size:,} of {4 * size:,} bytes used (25.0%" in out
    out = testing.run_cli("stat", str(root), check=True).stdout
    assert f"size       {size:,} bytes" in out and "no budget" in out
    r = testing.run_cli("stat", str(root), "--budget", "-1")
    assert r.returncode == 2 and "--budget" in r.stderr
