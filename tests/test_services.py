# SPDX-License-Identifier: Apache-2.0
"""Flush, commit and reput services: what each flush mode promises, observed."""
import threading
import time


from rocketstore import (FlushDiskType, GetMessageStatus as G, Message, MessageExt,
                         PutMessageStatus, testing)


def sync_config(**kw):
    return testing.small_config(flush_disk_type=FlushDiskType.SYNC_FLUSH, **kw)


def test_sync_flush_put_returns_after_its_bytes_are_flushed(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend, sync_config())
    try:
        for i in range(50):
            r = store.put_message(Message("Sync", b"%d" % i))
            assert r.status is PutMessageStatus.PUT_OK
            assert store.commitlog.mfq.flushed_where >= r.commit_log_offset + r.wrote_bytes
        rs = store.put_messages([Message("Sync", b"b%d" % i) for i in range(2000)])
        assert rs.status is PutMessageStatus.PUT_OK
        assert store.commitlog.mfq.flushed_where >= int(rs.commit_log_offsets[-1])
    finally:
        store.shutdown()


def test_group_commit_serves_concurrent_producers(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend, sync_config())
    results = []

    def produce(t):
        for i in range(100):
            results.append(store.put_message(Message("G", b"%d-%d" % (t, i), queue_id=t)))
    try:
        threads = [threading.Thread(target=produce, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 800
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        end = max(r.commit_log_offset + r.wrote_bytes for r in results)
        assert store.commitlog.mfq.flushed_where >= end
    finally:
        store.shutdown()


class _SlowSync:
    """A kernel module whose msync takes `delay` seconds: a disk that stalls. Both sync
    kernels stall (sync_written is the one the CommitLog's syncs take)."""

    def __init__(self, inner, delay):
        self._inner = inner
        self._delay = delay

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _stall(self):
        time.sleep(self._delay)

    def sync_range(self, *args):
        self._stall()
        return self._inner.sync_range(*args)

    def sync_written(self, *args):
        self._stall()
        return self._inner.sync_written(*args)


def test_sync_flush_answers_flush_disk_timeout_when_the_disk_stalls(tmp_path, backend):
    kernels = _SlowSync(backend, 0.5)
    store = testing.open_store(tmp_path / "s", kernels, sync_config(sync_flush_timeout=50))
    try:
        time.sleep(0.6)   # let a first flush of the empty store pass
        r = store.put_message(Message("Slow", b"x"))
        assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert r.status.ok                      # stored, just not known durable yet
        assert store.look_message_by_offset(r.commit_log_offset).body == b"x"
    finally:
        store.shutdown()


class _HeldSync(_SlowSync):
    """A kernel module whose msync blocks until `release` is set: a disk that hangs."""

    def __init__(self, inner):
        super().__init__(inner, 0)
        self.release = threading.Event()

    def _stall(self):
        self.release.wait(30)


def test_wait_false_does_not_wait_for_the_flush(tmp_path, backend):
    kernels = _HeldSync(backend)
    store = testing.open_store(tmp_path / "s", kernels, sync_config(sync_flush_timeout=20000))
    try:
        # Every sync hangs until released: a put that waited for one could not return.
        done = []
        t = threading.Thread(target=lambda: done.append(store.put_message(
            Message("NoWait", b"x", properties={"WAIT": "false"}))))
        t.start()
        t.join(10)
        assert done and done[0].status is PutMessageStatus.PUT_OK
    finally:
        kernels.release.set()
        store.shutdown()


# Write buffers committed every 10 ms once 4 pages are waiting, and no thorough commit for 24
# days: after a first put of more than 4 pages is committed, a put smaller than 4 pages stays
# in its write buffer until a reader asks.
POOL = dict(transient_store_pool_enable=True, transient_store_pool_size=3,
            commit_interval_commit_log=10, commit_commit_log_least_pages=4,
            commit_commit_log_thorough_interval=2 ** 31 - 1)


def _pool_store_past_its_first_commit(tmp_path, backend):
    store = testing.open_store(tmp_path / "s", backend, testing.small_config(**POOL))
    first = store.put_message(Message("Pool", b"f" * (4 * 4096 + 100)))
    testing.wait_until(lambda: store.commitlog.mfq.committed_where > first.commit_log_offset,
                       what="the first commit")
    return store


def test_transient_pool_shows_readers_only_committed_bytes(tmp_path, backend):
    store = _pool_store_past_its_first_commit(tmp_path, backend)
    try:
        assert store.commitlog.pool is not None and store.commit_service is not None
        r = store.put_message(Message("Pool", b"buffered"))
        assert r.status is PutMessageStatus.PUT_OK
        time.sleep(0.1)                         # ten commit rounds
        mfq = store.commitlog.mfq
        assert mfq.get_max_wrote_position() == r.commit_log_offset + r.wrote_bytes
        assert mfq.committed_where == r.commit_log_offset
        assert store.get_max_phy_offset() == r.commit_log_offset     # not visible yet
        # A read commits the buffers first (read-your-writes), then sees the put.
        g = store.get_message("g", "Pool", 0, 1)
        assert g.status is G.FOUND and g.messages[0].body == b"buffered"
        assert store.get_max_phy_offset() == r.commit_log_offset + r.wrote_bytes
        for i in range(300):                    # roll through several files and buffers
            store.put_message(Message("Pool", b"y" * 500))
    finally:
        store.shutdown()
    store = testing.open_store(tmp_path / "s", backend, testing.small_config(**POOL))
    try:
        assert store.get_max_offset_in_queue("Pool", 0) == 302
    finally:
        store.shutdown()


def test_a_read_by_commit_log_offset_sees_a_put_still_in_its_write_buffer(tmp_path, backend):
    # Found by tests/test_lifecycle_model.py: look_message_by_offset answered None for an
    # acknowledged put until the commit thread's next round.
    store = _pool_store_past_its_first_commit(tmp_path, backend)
    readers = {
        "look_message_by_offset": lambda r: store.look_message_by_offset(
            r.commit_log_offset).body,
        "view_message_by_id": lambda r: store.view_message_by_id(r.msg_id).body,
        "select_one_message_by_offset": lambda r: MessageExt.decode(
            store.select_one_message_by_offset(r.commit_log_offset)).body,
        "iter_messages": lambda r: next(store.iter_messages(r.commit_log_offset)).body,
    }
    try:
        for name, read in readers.items():
            body = name.encode()
            r = store.put_message(Message("Pool", body))
            assert store.commitlog.mfq.committed_where == r.commit_log_offset   # buffered
            assert read(r) == body, name
    finally:
        store.shutdown()


def test_async_flush_eventually_flushes_and_writes_the_checkpoint(tmp_path, backend):
    cfg = testing.small_config(flush_interval_commit_log=20, flush_commit_log_least_pages=0,
                               flush_interval_consume_queue=20)
    clock = iter(range(1_700_000_000_000, 1_800_000_000_000, 1000)).__next__
    store = testing.open_store(tmp_path / "s", backend, cfg, clock=clock)
    try:
        r = store.put_message(Message("A", b"x"))
        testing.wait_until(
            lambda: store.commitlog.mfq.flushed_where >= r.commit_log_offset + r.wrote_bytes,
            what="the flush")
        testing.wait_dispatched(store)
    finally:
        store.shutdown()
    raw = (tmp_path / "s" / "checkpoint").read_bytes()
    assert len(raw) == 4096
    assert int.from_bytes(raw[8:16], "big") == r.store_timestamp      # logicsMsgTimestamp


def test_reput_dispatches_a_put_with_no_reader_asking(tmp_path, backend):
    # A read catches reput up itself (read-your-writes), so this waits on reput alone.
    store = testing.open_store(tmp_path / "s", backend)
    try:
        store.put_message(Message("Fast", b"x"))
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="reput")
        assert store.get_max_offset_in_queue("Fast", 0) == 1
    finally:
        store.shutdown()
