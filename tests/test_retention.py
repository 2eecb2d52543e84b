# SPDX-License-Identifier: Apache-2.0
"""Retention by size (store_size_budget) and topic deletion (delete_topic,
clean_unused_topic, destroy), driven by an injected clock and disk-usage source."""
import os
import time

import pytest

from rocketstore import GetMessageStatus as G, Message, MessageStore, testing
from rocketstore.errors import ConfigError, StoreClosedError
from rocketstore.config import StoreConfig

NOW = 1_700_000_000_000
HOUR = 3_600_000
FILE = 4096
OTHER_HOUR = str((time.localtime(NOW / 1000).tm_hour + 12) % 24)   # never reached here


class Clock:
    def __init__(self, now=NOW):
        self.now = now

    def __call__(self):
        return self.now


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
                               clock=Clock(), disk_usage=lambda path: 0.1)
        stores.append(s)
        return s
    yield make
    for s in stores:
        s.shutdown()


def fill(store, n=60, topic="TopicA", queue_id=0, body=b"b" * 200):
    results = [store.put_message(Message(topic, body, queue_id=queue_id)) for _ in range(n)]
    assert all(r.ok for r in results)
    testing.wait_dispatched(store)
    testing.wait_flushed(store)
    return results


def names(store):
    return [f.file_name for f in store.commitlog.mfq.files]


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
    fs = store.fs
    paths = [f.path for f in store.commitlog.mfq.files]
    paths += [f.path for cq in store.all_consume_queues() for f in cq.mfq.files]
    paths += [f.path for f in store.index_service.index_file_list]
    want = sum(os.stat(p).st_blocks * 512 for p in paths)
    assert store.store_size() == want


def test_no_budget_deletes_nothing_that_has_not_expired(make):
    store = make()
    fill(store)
    before = names(store)
    plan = store.clean_plan()
    assert plan.budget == 0 and not plan.over_budget and plan.files == []
    assert plan.store_bytes == store.store_size()
    assert store.clean_files_periodically() == []
    assert names(store) == before


def test_budget_deletes_the_oldest_commitlog_files_and_their_queue_files_first(make):
    probe = make()
    fill(probe)
    full = probe.store_size()
    probe.shutdown()
    # The same data in a store whose budget is about half of what it takes.
    budget = full // 2
    store = make(root=probe.root + "-b", store_size_budget=budget)
    results = fill(store)
    before = names(store)
    cq_before = [f.file_name for f in store.find_consume_queue("TopicA", 0).mfq.files]
    plan = store.clean_plan()
    assert plan.over_budget and plan.store_bytes > budget
    assert [f[0] for f in plan.files] == before[:len(plan.files)]
    assert plan.store_bytes - plan.freed_bytes <= budget
    deleted = store.clean_files_periodically()
    assert [f.file_name for f in deleted] == [f[0] for f in plan.files]
    assert names(store) == before[len(deleted):]
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
    assert len(names(store)) == 1


def test_budget_without_protection_reports_what_the_groups_lose(make):
    store = make(store_size_budget=1)
    results = fill(store)
    store.commit_offset("slow", "TopicA", 0, 0)
    plan = store.clean_plan()
    assert plan.over_budget and not plan.protected
    new_min = plan.files[-1][2]
    assert plan.lost == {"slow": sum(r.commit_log_offset < new_min for r in results)}
    assert len(store.clean_files_periodically()) == len(plan.files)
    assert len(names(store)) == 1
