# SPDX-License-Identifier: Apache-2.0
"""MessageStore: the composition root (DefaultMessageStore). It wires the CommitLog, the
ConsumeQueues, the services and recovery together, and delegates every real job to them."""
import contextlib
import dataclasses
import errno
import functools
import logging
import os
import threading
import time

from . import kernels as _kernels
from .kernels.contract import KERNEL_NAMES
from . import query, read_path, recovery
from .arguments import (INT32_MAX, INT64_MAX, INT64_MIN, check_callable, check_int,
                        check_offset_commit, check_offset_query, check_optional_int, check_queue,
                        check_str, explain_put_failure)
from .batch import batch_template, columns, compress_bodies
from .checkpoint import StoreCheckpoint
from .clock import system_clock
from .commitlog import CommitLog
from .config import BrokerRole, FlushDiskType, StoreConfig
from .config_manager import SubscriptionGroupConfig, TopicConfig, all_managers
from .consumer import (Arrivals, AsyncConsumer, Consumer, PutWake, await_message,
                       check_wait_ms, wait_for_message)
from .consume_queue import ConsumeQueue, DirtyQueues
from .dispatch import ConsumeQueueDispatcher
from .ha.master import HAService
from .index_file import infer_geometry
from .index_service import INDEX_AHEAD_DIR, INDEX_MADE_AHEAD, IndexService
from .errors import (ConfigError, CorruptRecordError, InvalidArgumentError, StoreClosedError,
                     StoreError, StoreLoadError, UnsafePathError)
from .format import MAX_TOPIC_LENGTH, SCHEDULE_TOPIC
from .fs import (DEFAULT as DEFAULT_FS, is_inside, machine_memory, mappings_hold_descriptors,
                 raise_fd_limit)
from .lockfile import StoreLock, abort_path
from .mapped_file_queue import is_index_name, is_queue_dir_name, split_segment_names
from .message import (PROPERTY_WAIT, MessageExt, compressed_message, keep_stored,
                      topic_bytes_problem, topic_problem)
from .running_flags import NOT_WRITEABLE_MASK, RunningFlags
from .services.clean import (CleanCommitLogService, CleanConsumeQueueService, Consumption,
                             StoreSize, disk_usage_source)
from .services.scheduler import StoreScheduledService
from .services.flush import (CommitRealTimeService, CompiledGroupCommitService,
                             FlushConsumeQueueService, FlushRealTimeService,
                             GroupCommitService, SyncLatch)
from .services.populate import PopulateAheadService
from .services.reput import ReputMessageService, WrittenRows
from .services.schedule import ScheduleMessageService
from .stats import (LOCK_BEGIN, PUT_BYTES, PUT_FAILED, PUT_HIST, PUT_LATENCY_BUCKETS,
                    PUT_TIMES, GetCounters, StoreStatsService, busy_for, get_totals, record_put)
from .status import GetMessageResult, PutMessageResult, PutMessagesResult, PutMessageStatus
from .subscription import read_filters
from . import topic_delete
from .topic_delete import DeletedTopicManager

log = logging.getLogger(__name__)


# Segment files whose sizes are compared to tell a store's file size (enough for a majority
# over a damaged few, few enough to stay quick on a store with thousands of queues).
_SIZE_SAMPLE = 64


def _usual_size(fs, paths):
    """The size most of `paths` have (the larger on a tie), 0 when none has any: every
    segment has its directory's file size, so a truncated or empty one must not decide."""
    counts = {}
    for p in paths:
        size = fs.size(p)
        if size:
            counts[size] = counts.get(size, 0) + 1
    return max(counts, key=lambda size: (counts[size], size)) if counts else 0


_NO_LOCK = contextlib.nullcontext()


def _resolves_outside(root, path):
    """True when `path`, symlinks resolved, is not `root` or below it."""
    return not is_inside(root, path)


# What a store keeps under its root ("rebuild" is repair.REBUILD_MARKER); only these are
# checked for links out of it.
# INDEX_MADE_AHEAD in the root is where releases before INDEX_AHEAD_DIR made that file.
STORE_ENTRIES = ("lock", "abort", "checkpoint", "rebuild", "commitlog", "consumequeue", "index",
                 "config", INDEX_AHEAD_DIR, INDEX_MADE_AHEAD)

_SLAVE_REASON = "message store is slave mode, so putMessage is forbidden"


def _stored(result):
    """A GetMessageResult whose compressed messages keep their stored bodies
    (decompress=False)."""
    keep_stored(result.messages or ())
    return result


class MessageStore:
    """An embedded RocketMQ store rooted at `root`.

    `with MessageStore(root, config) as store:` loads (recovering if needed), starts the
    services, and shuts down cleanly on exit. `kernels` picks a backend ("cext", "cffi",
    "pure" or a module) for this instance; `clock` returns epoch milliseconds and stamps
    every record; `read_only=True` opens without the lock, never writes, starts nothing.
    `disk_usage(path)` returns the used fraction of the disk holding `path` (default: the
    file system's), which cleaning and disk-full protection read.

    Read-your-writes: a put that returned is visible to every read that starts after it
    (get_message, the queue offsets, queries), whatever the flush mode or write-buffer pool;
    a read that finds dispatch behind does the dispatch itself. After shutdown() begins, a put
    is either durable under the flush mode's contract or raises StoreClosedError; every
    method of a shut-down store raises StoreClosedError.
    """

    # First run and period of the scheduled jobs (ms): RocketMQ's addScheduleTask values.
    CLEAN_INITIAL_DELAY_MS = 60_000
    DISK_CHECK_INITIAL_DELAY_MS = 1000
    DISK_CHECK_INTERVAL_MS = 10_000
    CONSUMER_OFFSET_PERSIST_INTERVAL_MS = 5000   # BrokerConfig.flushConsumerOffsetInterval
    # drop_cold_commit_log_cache's period: well within the 2 s after which a guest with free
    # page reporting hands freed memory back to its host, so the writer's next pages reuse it.
    COLD_CACHE_INTERVAL_MS = 500
    # Waits here are woken by the reput dispatch; a live.LiveReader polls (consumer.py).
    poll_backoff = None

    def __init__(self, root, config=None, clock=None, kernels=None, fs=None, read_only=False,
                 disk_usage=None):
        self.root = os.fspath(root)
        self.config = config if config is not None else StoreConfig(store_path_root_dir=self.root)
        if not isinstance(self.config, StoreConfig):
            raise ConfigError("config must be a StoreConfig")
        self.kernels = _kernels.resolve(kernels)
        missing = [n for n in KERNEL_NAMES if not hasattr(self.kernels, n)]
        if missing:
            raise TypeError(f"kernels must be a backend name or a kernel module; {kernels!r} "
                            f"has no {missing[0]}")
        check_callable(clock, "clock")
        check_callable(disk_usage, "disk_usage")
        self.clock = clock or system_clock
        self.fs = fs or DEFAULT_FS
        self.read_only = read_only
        self.writable = not read_only
        self.is_slave = self.config.broker_role is BrokerRole.SLAVE
        self.commitlog = CommitLog(self.root, self.config, self.kernels, self.fs, read_only)
        self.commitlog.mfq.root = self._confine_root(self.commitlog.mfq.store_path)
        self.consume_queue_table = {}      # topic -> {queue_id: ConsumeQueue}
        self._cq_raw = {}                  # (topic bytes, queue_id) -> ConsumeQueue, for reput
        self._cq_lock = threading.Lock()
        # One cleaning round at a time (the clean thread's and clean_files_periodically's), and
        # none while reset_write_offset cuts.
        self._clean_lock = threading.Lock()
        # Queues written since FlushConsumeQueueService last took them (ConsumeQueue.dirty).
        self.dirty_cqs = DirtyQueues()
        # Consumers waiting for their queue (get_message(wait_ms=...), consume, aconsume),
        # woken by the reput dispatch (consumer.py).
        self.arrivals = Arrivals()
        self.checkpoint = None
        self.recovery_report = None
        self.reput_service = None
        # dispatch_in_put_lag's hooks on a started master (begins/ends: with a lag of 0)
        self._help_dispatch = self._put_begins = self._put_ends = None
        # ... and, with a compiled dispatch, the putting thread's WrittenRows (a lag of 0)
        self._written = None
        self._compiled_put_list = None
        self._put_columns = None        # the compiled put_batch (PutPath.put_columns), if any
        self._put_lists = None          # ... and from its lists (PutPath.put_lists)
        self.flush_service = None
        self.commit_service = None
        self.flush_cq_service = None
        # Made by load(), shared by the flushers from start(): tripped by the first failed
        # sync (fail-stop).
        self.sync_latch = None
        self.ha_service = None             # HAService once started (doc/05)
        self._lock = None if read_only else StoreLock(self.root, self.fs)
        self.running_flags = RunningFlags()
        self.disk_usage = disk_usage or disk_usage_source(self.fs)
        self.commitlog.on_disk_full = self._on_disk_full
        (self.topic_configs, self.subscription_groups, self.consumer_offsets,
         self.delay_offsets) = all_managers(self.root, self.fs, self.clock, read_only)
        self.topic_configs.on_change = self._topic_configs_changed
        # Deleted topics and where in the CommitLog they were deleted (topic_delete.py).
        self.deleted_topics = DeletedTopicManager(self.root, self.fs, self.clock, read_only)
        # The checkpoint it moves is opened by load().
        self._cq_dispatcher = ConsumeQueueDispatcher(
            self.find_consume_queue_raw, self.deleted_topics, self.config.delay_levels,
            self.kernels, is_slave=self.is_slave)
        self._dispatchers = [self._cq_dispatcher]
        # It dispatches after the CQs, and cleaning trims it after them.
        self.index_service = IndexService(self.root, self.config, self.kernels, self.fs,
                                          self.writable)
        # Reserves and populates queue and index windows ahead of their writer (the putting
        # thread, with dispatch inline); running from start() to shutdown(), inline
        # otherwise (recovery, a store never started).
        self.populate_service = PopulateAheadService() if self.writable else None
        self.index_service.populator = self.populate_service
        if self.config.message_index_enable:
            self._dispatchers.append(self.index_service)
        self.clean_commitlog_service = CleanCommitLogService(
            self.config, self.root, self.fs, self.clock, self.commitlog.mfq, self.disk_usage,
            self.running_flags, dispatched_offset=self._dispatched_offset,
            measure_size=self._measure_size,
            consumption=Consumption(self.consumer_offsets, self.consume_queue_table))
        self.clean_consume_queue_service = CleanConsumeQueueService(
            self.commitlog, self.all_consume_queues, self.clock, self.config,
            index_service=self.index_service, deleted_topics=self.deleted_topics)
        self.scheduled_service = None
        self.schedule_message_service = None   # delayed delivery, masters only
        # Public for the store's readers (read_path, the compiled ReadPath, consumers): true
        # between load() and shutdown(); a plain attribute, as the read path reads it per call.
        self.loaded = False
        self._running = False
        # The put hook's choice (_update_put_wake), made by consumer threads and the reput
        # thread: under this lock, and only between start() and shutdown().
        self._put_wake_lock = threading.Lock()
        self._put_wake_on = False
        self._confirm_offset = -1
        # Bytes behind the CommitLog's end past which a read is "suggest pull from slave"
        # (accessMessageInMemoryMaxRatio of the memory the process may use: a container's
        # limit where lower, as Java 17 reports it); read by the read paths, and past it the
        # CommitLog's page cache is evicted (drop_cold_commit_log_cache).
        self.mem_limit = machine_memory() * self.config.access_message_in_memory_max_ratio // 100
        # The backend's ReadPath: get/pull entries, decode_rows and its get counters; its
        # users (query, stats, cli dump) call it through this attribute.
        self.read_path = read_path.make_read_path(self.kernels)
        self.get_counters = GetCounters()
        # Samples the counters once a second while the store runs (stats.py).
        self.stats_service = StoreStatsService(
            self.root, self.commitlog.put_cells,
            functools.partial(get_totals, self.get_counters, self.read_path), self.runtime_info,
            self.lock_time_mills if self.clock is system_clock else None)

    @classmethod
    def open_read_only(cls, root, config=None, kernels=None, fs=None):
        """Open an existing store (ours or a broker's) for reading: no lock, no writes, file
        sizes taken from the files themselves. Returns a loaded store; call shutdown(). It
        reads the files as they were when it opened; live.LiveReader follows a writer.
        `fs` as for MessageStore (a fault-injecting double in tests)."""
        root = os.fspath(root)
        fs = fs or DEFAULT_FS
        sizes = {}
        cl_dir = os.path.join(root, "commitlog")
        names = split_segment_names(fs, cl_dir, None)[0]
        size = _usual_size(fs, [os.path.join(cl_dir, n) for n in names])
        if size:
            sizes["mapped_file_size_commit_log"] = size
        cq_base = os.path.join(root, "consumequeue")
        cq_files = []
        for topic in fs.list_dir(cq_base):
            # Never size the store from a planted symlink, nor list a stray file.
            if _resolves_outside(root, os.path.join(cq_base, topic)) or \
                    not fs.is_dir(os.path.join(cq_base, topic)):
                continue
            qdirs = [q for q in fs.list_dir(os.path.join(cq_base, topic))
                     if is_queue_dir_name(q)
                     and not _resolves_outside(root, os.path.join(cq_base, topic, q))
                     and fs.is_dir(os.path.join(cq_base, topic, q))]
            for q in qdirs:
                files = split_segment_names(fs, os.path.join(cq_base, topic, q),
                                            None)[0]
                cq_files += [os.path.join(cq_base, topic, q, f) for f in files]
                if len(cq_files) >= _SIZE_SAMPLE:
                    break
            if len(cq_files) >= _SIZE_SAMPLE:
                break
        size = _usual_size(fs, cq_files)
        if size:
            sizes["mapped_file_size_consume_queue"] = size
        if config is None:
            config = StoreConfig(store_path_root_dir=root, **sizes)
        else:
            config = dataclasses.replace(config, **sizes)
        idx_dir = os.path.join(root, "index")
        idx = [os.path.join(idx_dir, n)
               for n in split_segment_names(fs, idx_dir, None, is_index_name)[0]]
        geometry = infer_geometry(idx, fs, config.max_hash_slot_num, config.max_index_num)
        if geometry is not None:
            config = dataclasses.replace(config, max_hash_slot_num=geometry[0],
                                         max_index_num=geometry[1])
        else:
            log.warning("%s: index file sizes fit no hash slot / index number pair tried; "
                        "key queries will find nothing", idx_dir)
        store = cls(root, config, kernels=kernels, read_only=True, fs=fs)
        store.load()
        return store

    # ---- lifecycle --------------------------------------------------------------------------
    def __enter__(self):
        self.load()
        if not self.read_only:
            self.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def load(self, force_recovery=False):
        """Map every file and recover (DefaultMessageStore#load). Takes the lock first: two
        processes recovering one directory would truncate each other's data.
        `force_recovery` runs abnormal recovery even after a clean shutdown."""
        if self.loaded:
            return self.recovery_report
        if mappings_hold_descriptors(self.kernels):
            raise_fd_limit()
        if not self.read_only:
            self.fs.ensure_dir(self.root)
            self._lock.acquire()
        elif not self.fs.is_dir(self.root):
            raise StoreLoadError(f"{self.root} is not a store directory")
        unsynced_cut = False
        try:
            self._check_links()
            # First, as a broker loads its config files before its message store: a start
            # they refuse has recovered, cut and rebuilt nothing.
            self._load_configs()
            rebuilding = None
            if not self.read_only:
                from . import repair        # imports this module: bound late
                rebuilding = repair.begin_pending_rebuild(self.fs, self.root)
                if rebuilding is not None:
                    self._adopt_geometry(repair.pending_geometry(rebuilding))
            killed = self.fs.exists(abort_path(self.root))
            last_exit_ok = not force_recovery and rebuilding is None and not killed
            if killed and not self.read_only:
                # Killed (no shutdown) after a failed sync, the process left the pages the
                # kernel could not write cached and clean: recovery must not read those.
                self._drop_cached_data()
            # Before the queues and recovery: a deleted topic's leftovers are not loaded, and
            # its records are not dispatched again.
            if not self.deleted_topics.load():
                self._corrupt_pair(self.deleted_topics.path)
            self.commitlog.load()
            self._load_consume_queues()
            self.checkpoint = StoreCheckpoint(os.path.join(self.root, "checkpoint"), self.fs,
                                              self.read_only)
            self._cq_dispatcher.checkpoint = self.checkpoint
            # From the load, not the start: a store loaded and not started syncs too (flush,
            # and a replicated frame's publish on a slave).
            self.sync_latch = self.commitlog.sync_latch = SyncLatch(self.running_flags,
                                                                    self.checkpoint)
            # Before recovery: an abnormal exit drops index files past the checkpoint, and
            # recovery's re-dispatch rebuilds them.
            self.index_service.load(last_exit_ok, self.checkpoint)
            try:
                self.recovery_report = recovery.recover(self._recovery_parts(), last_exit_ok,
                                                        self.index_service)
            except OSError:
                # A cut's zeros failed to sync (or a file to open). A read-only open cuts
                # nothing on disk, and writes nothing into the store.
                unsynced_cut = not self.read_only
                raise
            if rebuilding is not None:
                repair.end_pending_rebuild(self.fs, self.root, self.all_consume_queues(),
                                           self.index_service, self.checkpoint)
            self._finish_pending_deletions()
        except BaseException as exc:
            self._close_files()
            if unsynced_cut:
                # The zeros a cut wrote may sit cached and clean, never written: the next
                # open must recover abnormally, and read what the disk holds.
                self._keep_abort_file()
                self._drop_cached_data()
            if self._lock is not None:
                self._lock.release()
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise StoreLoadError(
                    f"disk full: {exc}. Opening {self.root} for writing (and recovering it) "
                    f"needs space: free some, or open it read-only "
                    f"(MessageStore.open_read_only)") from exc
            raise
        self.loaded = True
        self.arrivals.open()
        return self.recovery_report

    def _keep_abort_file(self):
        """Make the next open recover abnormally, whatever becomes of this process: a sync
        failed while no started store keeps the abort file."""
        try:
            self.fs.write_bytes(abort_path(self.root), b"", sync=True)
        except OSError as exc:
            log.error("could not keep %s (%s)", abort_path(self.root), exc)

    def _adopt_geometry(self, geometry):
        """Size the files an interrupted rebuild wiped as they were, whatever this open's
        config says: the store's geometry is its files', as for every file that remains."""
        changed = {k: v for k, v in geometry.items() if getattr(self.config, k) != v}
        if not changed:
            return
        log.warning("%s: rebuilding with the sizes the interrupted rebuild recorded (%s), not "
                    "the configured ones", self.root,
                    ", ".join(f"{k}={v}" for k, v in changed.items()))
        self.config = dataclasses.replace(self.config, **changed)
        self.index_service.hash_slot_num = self.config.max_hash_slot_num
        self.index_service.index_num = self.config.max_index_num

    def _load_configs(self):
        """ConfigManager#load for each JSON file (see _corrupt_pair for a file whose `.bak`
        is corrupt too)."""
        for manager in (self.topic_configs, self.subscription_groups, self.consumer_offsets,
                        self.delay_offsets):
            if not manager.load():
                self._corrupt_pair(manager.path)

    def _corrupt_pair(self, path):
        """A config file whose `.bak` is corrupt too. It stops a writable load, as it stops a
        broker's start: the store's next persist would overwrite what an operator may still
        mend by hand. A read-only open (verify, dump, stat, query) goes on with that table
        empty: no record depends on it, and verify reports the file."""
        if not self.read_only:
            raise StoreLoadError(
                f"{path} and its .bak are both corrupt: mend one, restore it from a backup, "
                f"or move both aside to start with an empty table; `rocketstore verify` "
                f"checks the rest of the store meanwhile")
        log.error("%s and its .bak are both corrupt: read without that table", path)

    def persist_configs(self):
        """Write every config file that changed since it was last written."""
        if self.read_only:
            return
        self.check_open()
        for manager in (self.topic_configs, self.subscription_groups, self.consumer_offsets,
                        self.delay_offsets):
            manager.persist_if_dirty()

    def _outside_root(self, path):
        """True (and logged) when `path` resolves outside the store root: a symlink planted
        in consumequeue/ must not make us read, truncate or write files elsewhere. A
        writable store refuses to load (later puts would write through the link); a
        read-only one (verify, dump) skips the entry."""
        if not _resolves_outside(self.root, path):
            return False
        root, real = os.path.realpath(self.root), os.path.realpath(path)
        if not self.read_only:
            raise StoreLoadError(f"{path} resolves to {real}, outside the store {root}: "
                                 f"remove the symlink")
        log.warning("skipping %s: it resolves to %s, outside the store %s", path, real, root)
        return True

    def _confine_root(self, path):
        """The directory nothing under `path` may leave: the store root, or `path` itself when
        configured outside it (a CommitLog on another disk)."""
        inside = os.path.abspath(path).startswith(os.path.abspath(self.root) + os.sep)
        return self.root if inside else path

    def unsafe_links(self):
        """(path, why) for each symlink in the store that a write would follow onto a file or
        out of the store: under STORE_ENTRIES, and the CommitLog directory if elsewhere."""
        found = []
        for name in STORE_ENTRIES:
            found += self.fs.unsafe_links(self.root, os.path.join(self.root, name))
        mfq = self.commitlog.mfq
        if mfq.root != self.root:
            found += self.fs.unsafe_links(mfq.root, mfq.store_path)
        return found

    def _check_links(self):
        """Refuse to open writable a store with a link a write would follow (a planted
        `index/…` link grew its target to 420 MB); a read-only open names them and reads on,
        skipping ConsumeQueue links out of the store as before."""
        links = self.unsafe_links()
        for path, why in links:
            if not self.read_only:
                more = f" (and {len(links) - 1} more)" if len(links) > 1 else ""
                raise UnsafePathError(f"{path} is {why}{more}: the store never writes through "
                                      "a link; remove it")
            log.warning("%s is %s", path, why)

    def _load_consume_queues(self):
        base = os.path.join(self.root, "consumequeue")
        for topic in self.fs.list_dir(base):
            tdir = os.path.join(base, topic)
            if topic.endswith(topic_delete.DELETED_SUFFIX) and self.fs.is_dir(tdir) and \
                    not self._outside_root(tdir):
                # A deletion killed before it removed the queues it had set aside.
                if self.writable:
                    log.info("removing %s: the rest of a topic deletion", tdir)
                    topic_delete.remove_tree(self.fs, tdir)
                continue
            if not self.fs.is_dir(tdir):
                log.warning("ignoring %s: not a topic directory; left as it is", tdir)
                continue
            if self._outside_root(tdir):
                continue
            for qid in self.fs.list_dir(tdir):
                qdir = os.path.join(tdir, qid)
                # loadConsumeQueue skips names Integer.parseInt rejects; `007` would parse
                # but name another directory than queue 7's.
                if not is_queue_dir_name(qid) or not self.fs.is_dir(qdir):
                    log.warning("ignoring %s: not a queue directory; left as it is", qdir)
                    continue
                if self._outside_root(qdir):
                    continue
                cq = self._new_cq(topic, int(qid))
                cq.load()
        for topic, entry in self.deleted_topics.table.items():
            for cq in list(self.consume_queue_table.get(topic, {}).values()):
                if topic_delete.is_leftover(cq, entry["offset"]):
                    # Killed between the deletion's entry and its queues' removal.
                    self._forget_queue(cq)
                    if self.writable:
                        log.info("removing %s: its topic was deleted", cq.mfq.store_path)
                        cq.destroy()
                        self.fs.remove_dir_if_empty(cq.mfq.store_path)
                    else:
                        cq.close()
            if not self.consume_queue_table.get(topic, True):
                del self.consume_queue_table[topic]
                if self.writable:
                    self.fs.remove_dir_if_empty(os.path.join(base, topic))

    def verify(self, progress=None):
        """Check every file of the loaded store (`rocketstore verify`; open it read-only): a
        verify.VerifyReport of the problems found. `progress(n)` is called as the checks go
        (n: CommitLog bytes checked since the last call)."""
        from . import verify        # imports repair, which imports this module: bound late
        self.check_open()
        return verify.verify_store(verify.VerifyParts(
            self.root, self.config, self.fs, self.kernels, self.commitlog,
            self.consume_queue_table, self.all_consume_queues, self.index_service,
            self.checkpoint, self.deleted_topics, self.unsafe_links), progress)

    def stray_files(self):
        """Paths (relative to the root) under commitlog/, consumequeue/ and index/ that are
        no store file, which load left alone: a `commitlog/0`, a 21-digit name, a file where
        a queue directory belongs. Reported by verify and stat."""
        fs = self.fs
        out = []
        mfq = self.commitlog.mfq
        out += [os.path.join(mfq.store_path, n)
                for n in split_segment_names(fs, mfq.store_path, mfq.file_size)[1]]
        base = os.path.join(self.root, "consumequeue")
        for topic in fs.list_dir(base):
            tdir = os.path.join(base, topic)
            if not fs.is_dir(tdir):
                out.append(tdir)
                continue
            for qid in fs.list_dir(tdir):
                qdir = os.path.join(tdir, qid)
                if not is_queue_dir_name(qid) or not fs.is_dir(qdir):
                    out.append(qdir)
                    continue
                out += [os.path.join(qdir, n)
                        for n in split_segment_names(fs, qdir, self.config.cq_file_size)[1]]
        idx_dir = os.path.join(self.root, "index")
        out += [os.path.join(idx_dir, n)
                for n in split_segment_names(fs, idx_dir, None, is_index_name)[1]]
        return [os.path.relpath(p, self.root) for p in out]

    def start(self):
        """Start the services (DefaultMessageStore#start): reput first, caught up before the
        store accepts puts, then flushing; the abort file marks the store as running."""
        if self.read_only:
            raise StoreClosedError("a read-only store does not start")
        if not self.loaded:
            self.load()
        if self._running:
            return
        # First: the catch-up dispatch below and every writer after it ask it for windows.
        self.populate_service.start()
        reput_from = max(0, self.commitlog.min_offset)
        for cq in self.all_consume_queues():
            reput_from = max(reput_from, cq.max_physic_offset)
        self.reput_service = ReputMessageService(
            self.commitlog, self.kernels, self.dispatchers, reput_from, arrivals=self.arrivals,
            running_flags=self.running_flags, is_slave=self.is_slave,
            on_idle=self._update_put_wake)
        self.reput_service.do_reput()               # catch up before accepting puts
        self.index_service.make_next_ahead()
        recovery.recover_topic_queue_table(self.commitlog, self.all_consume_queues())
        # HA next (doc/03 §7); bound before any thread starts, so a taken port fails clean.
        self.ha_service = HAService(self.config, self.commitlog, self._appended)
        if self.ha_service.client is not None:
            self.reput_service.halt_replication = self.ha_service.client.halt
        self.ha_service.start()
        self.reput_service.start()
        self.commitlog.start()
        latch = self.checkpoint.latch = self.sync_latch
        self.flush_cq_service = FlushConsumeQueueService(
            self.config, self.checkpoint, latch, self.dirty_cqs, self.all_consume_queues(),
            self.index_service.flush_pending, self.fs, os.path.join(self.root, "consumequeue"))
        self.flush_cq_service.start()
        cfg = self.config
        if cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            if hasattr(self.kernels, "GroupCommit"):
                self.flush_service = CompiledGroupCommitService(
                    self.commitlog.mfq, self.checkpoint, self.kernels, latch)
                # _after_put_sync, compiled where the backend has it: a put woken by its
                # sync runs no Python.
                self.commitlog.after_put = self.flush_service.after_put(
                    self.kernels, cfg, PutMessageStatus.PUT_OK,
                    PutMessageStatus.FLUSH_DISK_TIMEOUT, PROPERTY_WAIT) or self._after_put_sync
            else:
                self.flush_service = GroupCommitService(self.commitlog.mfq, self.checkpoint,
                                                        latch)
                self.commitlog.after_put = self._after_put_sync
        else:
            self.flush_service = FlushRealTimeService(self.config, self.commitlog.mfq,
                                                      self.checkpoint, latch)
            self.commitlog.wake_on_put = self.flush_service
        self.flush_service.start()
        if self.commitlog.pool is not None:
            self.commit_service = CommitRealTimeService(self.config, self.commitlog.mfq,
                                                        self.flush_service.wake_for)
            self.commit_service.start()
            # ASYNC_FLUSH with write buffers: the committer wakes, and it wakes the flusher.
            self.commitlog.after_put = None
            self.commitlog.wake_on_put = self.commit_service
        if cfg.broker_role is BrokerRole.SYNC_MASTER:
            self.commitlog.after_put = self.ha_service.make_after_put(self.commitlog.after_put)
        # While consumers wait, while reput is idle, or always with wake_reput_on_put
        # (readers in other processes), puts wake reput too (consumer.PutWake); the hook as
        # set above is what puts wake otherwise.
        self._plain_put_wake = self.commitlog.wake_on_put
        self.arrivals.on_waiting = self._update_put_wake
        with self._put_wake_lock:
            self._put_wake_on = True
        self._update_put_wake()
        self.fs.write_bytes(abort_path(self.root), b"", sync=False)
        self._running = True
        self._install_put_path()
        if cfg.compress_msg_body:
            self._install_compression()
        if cfg.dispatch_in_put_lag >= 0 and not self.is_slave:
            self._install_inline_dispatch()
        # A store_size_budget is kept from the first interval: RocketMQ's first round, a
        # minute after start, lets a store writing 1.4 GB/s pass its budget by 80 GB first.
        first_clean = self.CLEAN_INITIAL_DELAY_MS if cfg.store_size_budget <= 0 else \
            min(self.CLEAN_INITIAL_DELAY_MS, cfg.clean_resource_interval)
        self.scheduled_service = StoreScheduledService([
            ("clean", first_clean, cfg.clean_resource_interval, self._clean_files),
            ("disk-check", self.DISK_CHECK_INITIAL_DELAY_MS, self.DISK_CHECK_INTERVAL_MS,
             self.clean_commitlog_service.is_space_full),
            ("consumer-offsets", self.CONSUMER_OFFSET_PERSIST_INTERVAL_MS,
             self.CONSUMER_OFFSET_PERSIST_INTERVAL_MS, self.consumer_offsets.persist_if_dirty),
            ("delay-offsets", cfg.flush_delay_offset_interval, cfg.flush_delay_offset_interval,
             self.delay_offsets.persist_if_dirty),
        ] + ([("cold-cache", self.COLD_CACHE_INTERVAL_MS, self.COLD_CACHE_INTERVAL_MS,
               self._drop_cold_cache)] if cfg.drop_cold_commit_log_cache else []))
        self.scheduled_service.start()
        self.handle_schedule_message_service(cfg.broker_role)
        self.stats_service.start()

    def handle_schedule_message_service(self, role):
        """handleScheduleMessageService: a master delivers delayed messages, a slave never
        does (its records come from the master, deliveries included)."""
        if role is BrokerRole.SLAVE:
            service, self.schedule_message_service = self.schedule_message_service, None
            if service is not None:
                service.shutdown()
        elif self.schedule_message_service is None:
            self.schedule_message_service = ScheduleMessageService(
                self.config.delay_levels, self.delay_offsets, self.commitlog,
                self.find_consume_queue, self.clock, put_messages=self._put_messages,
                is_running=lambda: self._running, catch_up=self.catch_up,
                timeup_encode=getattr(self.kernels, "timeup_encode", None),
                put_encoded=self._put_encoded)
            self.schedule_message_service.start()

    def shutdown(self):
        """Stop services in reverse order, flush everything, write the checkpoint, and remove
        the abort file only if reput caught up (otherwise the next open recovers)."""
        if not self.loaded:
            return
        # First: every waiting consumer wakes and gives up (StoreClosedError, or its
        # iteration ends) instead of reading files about to close.
        self.arrivals.close()
        caught_up = True
        if self._running:
            self._running = False
            self.__dict__.pop("put_message", None)
            self.__dict__.pop("put_messages", None)
            self._help_dispatch = self._put_begins = self._put_ends = None
            self._written = None
            # First: a delivery under way finishes its put, and no later one starts.
            self.handle_schedule_message_service(BrokerRole.SLAVE)
            # Before anything is committed or flushed: a put already holding the lock
            # finishes its write first, every later one raises StoreClosedError, so what
            # the final commit and flush cover is everything ever acknowledged.
            self.commitlog.stop_puts()
            self.stats_service.shutdown()           # removes the runtime file
            if self.scheduled_service is not None:
                # Started last, stopped first: no file deletion during the final flush.
                self.scheduled_service.shutdown()
                self.scheduled_service = None
            # A round a caller of clean_files_periodically started ends before the final
            # flush (it would destroy files under it, and raise on them once closed).
            with self._clean_lock:
                pass
            self.ha_service.shutdown()              # HA first: doc/03 §7 reversed
            self.commitlog.after_put = None
            with self._put_wake_lock:
                self._put_wake_on = False       # reput, still running, sets no hook now
                self.commitlog.wake_on_put = None
            # Whether every service whose last work makes data durable (or vouches for it)
            # ended: one still running (a sync outlasting its join time) may yet fail.
            ended = True
            if self.commit_service is not None:
                ended = self.commit_service.shutdown()  # commit write buffers before the drain
            # A reput still running may yet dispatch, past the final flushes and into files
            # closing: not caught up, however far it got.
            reput_ended = self.reput_service.shutdown()
            caught_up = reput_ended and self.reput_service.behind() <= 0
            # After the last dispatch: no writer asks it for a window any more.
            self.populate_service.shutdown()
            ended = self.flush_service.shutdown() and ended
            ended = self.flush_cq_service.shutdown() and ended
            latch = self.sync_latch
            if not latch.failed(latch.INDEX):
                try:
                    self.index_service.flush()
                except OSError as exc:
                    latch.trip(latch.INDEX, exc)
            self.commitlog.shutdown()
            # Closed, not just persisted: a change racing shutdown is either in this persist
            # or refused, never acknowledged after it and lost.
            for manager in (self.topic_configs, self.subscription_groups,
                            self.consumer_offsets, self.delay_offsets):
                try:
                    manager.close()
                except OSError as exc:
                    # A full disk must not stop the shutdown half-way: the config files keep
                    # their last complete version, and the data is flushed and closed below.
                    log.error("could not write the config files: %s", exc)
            self.checkpoint.flush()
            mfq = self.commitlog.mfq
            durable = mfq.flushed_where >= mfq.get_max_wrote_position()
            if not durable:
                log.error("shutdown: the CommitLog is flushed to %d of %d; keeping the abort "
                          "file so the next open recovers", mfq.flushed_where,
                          mfq.get_max_wrote_position())
            if not ended:
                log.error("shutdown: a flush service did not stop in time; keeping the abort "
                          "file so the next open recovers")
            if not caught_up:
                log.error("shutdown: %s; keeping the abort file so the next open recovers",
                          "dispatch is behind the CommitLog" if reput_ended else
                          "the reput service did not stop in time")
            if latch.tripped:
                log.error("shutdown: %s; keeping the abort file so the next open recovers "
                          "from what reached the disk", "; ".join(latch.failures.values()))
            elif caught_up and durable and ended:
                self.fs.remove(abort_path(self.root))
        self._close_files()
        # Unmapped now: their cached pages can go, so that the next open's recovery reads
        # what the disk holds, not pages a failed sync left cached but never wrote. Read
        # here, not in the block above: a shutdown that raised part way and is called again
        # skips that block, and still drops them.
        if self.sync_latch is not None and self.sync_latch.tripped:
            self._drop_cached_data()
        if self._lock is not None:
            self._lock.release()
        self.loaded = False

    def _appended(self):
        """The HA client appended a frame: reput dispatches it now, and a SYNC_FLUSH group
        commit syncs it (its thread looks by itself only every second once idle)."""
        self.reput_service.wakeup()
        flusher = self.flush_service
        if isinstance(flusher, GroupCommitService):
            flusher.wakeup()

    def _update_put_wake(self, _changed=None):
        """The put hook with the reput wake-up (consumer.PutWake) while a consumer waits,
        while reput is idle, or always with wake_reput_on_put; the plain one otherwise. Made
        from what holds now, under a lock, so the last of concurrent calls sets the right one.
        Also Arrivals.on_waiting and ReputMessageService's on_idle: the flag they pass
        (`_changed`) is read here from its source instead."""
        with self._put_wake_lock:
            if not self._put_wake_on:
                return
            plain = self._plain_put_wake
            reput = self.reput_service
            if self.arrivals.waiting or reput.idle or self.config.wake_reput_on_put:
                self.commitlog.wake_on_put = PutWake(
                    plain, reput, self.commitlog.mfq.get_max_wrote_position)
            else:
                self.commitlog.wake_on_put = plain

    def queue_ends_before_recovery(self):
        """The ConsumeQueues as recovery finds them, for a plan made before recovering
        (repair.plan_recovery): each queue's own recovery done, not yet cut at the
        CommitLog's end, as {(topic, queue_id): (min_offset, max_offset, max_physic_offset)}.
        Only on a store not loaded (it opens the files and closes them again)."""
        if self.loaded:
            raise StoreError("queue_ends_before_recovery plans before recovery: call it on a "
                             "store not yet loaded")
        self.commitlog.load()
        try:
            self._load_consume_queues()
            ends = {}
            for cq in self.all_consume_queues():
                cq.recover()
                ends[(cq.topic, cq.queue_id)] = (cq.min_offset_in_queue, cq.max_offset_in_queue,
                                                 cq.max_physic_offset)
            return ends
        finally:
            self._close_files()

    def _drop_cached_data(self):
        """Drop the clean cached pages of every CommitLog, ConsumeQueue and index file on disk,
        and the checkpoint's (FileSystem.drop_cached), so the next reader reads what the disk
        holds. Pages a mapping holds, and dirty pages, stay (the kernel skips them): call it
        with none of those files mapped here."""
        fs = self.fs
        dirs = [self.commitlog.mfq.store_path, os.path.join(self.root, "index")]
        base = os.path.join(self.root, "consumequeue")
        for topic in fs.list_dir(base):
            tdir = os.path.join(base, topic)
            if fs.is_dir(tdir):
                dirs += [os.path.join(tdir, qid) for qid in fs.list_dir(tdir)]
        paths = [os.path.join(self.root, "checkpoint")]
        for d in dirs:
            if fs.is_dir(d):
                paths += [os.path.join(d, name) for name in fs.list_dir(d)]
        for path in paths:
            if not fs.exists(path) or fs.is_dir(path):
                continue
            try:
                fs.drop_cached(path)
            except OSError as exc:
                log.error("could not drop the cached pages of %s (%s): recovery may read "
                          "records the disk does not hold", path, exc)

    def _close_files(self):
        self.commitlog.close()
        for cq in self.all_consume_queues():
            cq.close()
        self.index_service.close()
        if self.checkpoint is not None:
            self.checkpoint.close()

    def _check_running(self):
        if not self._running:
            raise StoreClosedError("the store is not running (shut down, read-only or not "
                                   "started)")

    @property
    def dispatchers(self):
        """The dispatchers reput hands each record to, in order (the ConsumeQueue builder, then
        the index). The reput service holds this very list: edit it in place; the attribute
        cannot be rebound, since a new list would silently leave reput with the old one."""
        return self._dispatchers

    def check_open(self):
        """Raise StoreClosedError unless the store is loaded and not shut down."""
        if not self.loaded:
            raise StoreClosedError("the store is closed (shut down, or never loaded)")

    def catch_up(self):
        """Read-your-writes: commit what sits in write buffers and dispatch whatever reput
        has not yet, so every put that returned is visible to the read that follows it."""
        self._commit_pending()
        reput = self.reput_service
        if reput is not None:
            reput.catch_up()

    def _commit_pending(self):
        """Read-your-writes for a read by commit-log offset: with the TransientStorePool, a
        record is readable once its write buffer is committed (the readers' view of a pooled
        file ends at its committed position), which the commit thread does only every
        commit_interval_commit_log ms."""
        if self.commit_service is not None:
            self.commit_service.commit_now()

    def _after_put_sync(self, end_offset, msg):
        """SYNC_FLUSH: wait for the group commit unless the message says WAIT=false."""
        if msg.properties.get(PROPERTY_WAIT) == "false":
            self.flush_service.wakeup()
            return PutMessageStatus.PUT_OK
        if self.flush_service.wait_flushed(end_offset, self.config.sync_flush_timeout):
            return PutMessageStatus.PUT_OK
        return PutMessageStatus.FLUSH_DISK_TIMEOUT

    # ---- ConsumeQueue table -------------------------------------------------------------------
    def _new_cq(self, topic, queue_id):
        with self._cq_lock:
            queues = self.consume_queue_table.setdefault(topic, {})
            cq = queues.get(queue_id)
            if cq is None:
                cq = ConsumeQueue(self.root, topic, queue_id, self.config.cq_file_size,
                                  self.kernels, self.fs, writable=self.writable,
                                  reserve_window=self.config.consume_queue_reserve_window,
                                  populator=self.populate_service)
                cq.mfq.root = self.root
                cq.dirty = self.dirty_cqs
                queues[queue_id] = cq
                self._cq_raw[(topic.encode("utf-8"), queue_id)] = cq
            return cq

    def find_consume_queue(self, topic, queue_id):
        """The queue object (created empty when missing, as findConsumeQueue does)."""
        self.check_open()
        queues = self.consume_queue_table.get(topic)
        if queues is not None:
            cq = queues.get(queue_id)
            if cq is not None:
                return cq
        check_queue(topic, queue_id)
        return self._new_cq(topic, queue_id)

    consume_queue = find_consume_queue

    def find_consume_queue_raw(self, topic_bytes, queue_id):
        """find_consume_queue by the topic's bytes as a record stores them: the dispatchers'
        lookup, which recovery uses before the store is loaded. The queue it makes names a
        directory, so its topic and queue id are checked as dispatch checks a record's."""
        cq = self._cq_raw.get((topic_bytes, queue_id))
        if cq is None:
            if not isinstance(topic_bytes, (bytes, bytearray, memoryview)):
                raise TypeError(f"topic_bytes must be bytes, not {type(topic_bytes).__name__}")
            why = topic_bytes_problem(topic_bytes)
            if why is not None:
                raise InvalidArgumentError(f"topic_bytes: {why}")
            cq = self._new_cq(bytes(topic_bytes).decode("utf-8"),
                              check_int(queue_id, "queue_id", 0, INT32_MAX))
        return cq

    def all_consume_queues(self):
        return [cq for queues in list(self.consume_queue_table.values())
                for cq in list(queues.values())]

    def _recovery_parts(self):
        """What recovery works on (recovery.RecoveryParts), as the store has it now."""
        return recovery.RecoveryParts(self.commitlog, self.all_consume_queues, self.checkpoint,
                                      self.kernels, self.config, self.dispatchers,
                                      self.writable)

    def _forget_queue(self, cq):
        """Take a queue out of the tables (the caller holds the locks the store needs)."""
        with self._cq_lock:
            queues = self.consume_queue_table.get(cq.topic)
            if queues is not None and queues.get(cq.queue_id) is cq:
                del queues[cq.queue_id]
            key = (cq.topic.encode("utf-8"), cq.queue_id)
            if self._cq_raw.get(key) is cq:
                del self._cq_raw[key]

    # ---- topic deletion (topic_delete.py) -----------------------------------------------------
    def delete_topic(self, topic):
        """Delete a topic as 5.x deleteTopics and the broker's deleteTopic do: its
        ConsumeQueues, its topic config and every group's consumer offsets on it go; its
        records stay in the CommitLog until they expire, and are never served again
        (get_message answers as for a topic never written). A later put to it starts a fresh
        queue at offset 0. Returns True when the topic had anything to delete.

        Crash-safe: a store killed during the call opens with the topic whole or deleted."""
        self._check_writable_config()
        check_str(topic, "topic")
        return self._delete_topic(topic, configs=True)

    def clean_unused_topic(self, keep):
        """4.9.8 cleanUnusedTopic: delete the ConsumeQueues of every topic not in `keep`
        (an iterable of topic names), except system topics (SCHEDULE_TOPIC_XXXX, RMQ_SYS_*,
        rmq_sys_*, TBW102, ...) and LMQ topics. Topic configs and consumer offsets stay, as in
        4.9.8. Returns the topics whose queues were deleted, sorted."""
        self._check_writable_config()
        if isinstance(keep, (str, bytes)):
            raise TypeError("keep must be an iterable of topic names, not a single string")
        keep = set(keep)
        for t in keep:
            check_str(t, "topic in keep")
        gone = [t for t in sorted(self.consume_queue_table)
                if t not in keep and not topic_delete.is_system_topic(t)]
        return [t for t in gone if self._delete_topic(t, configs=False)]

    def _delete_topic(self, topic, configs):
        cl = self.commitlog
        reput = self.reput_service
        with cl.put_lock, (reput.dispatch_lock if reput is not None else _NO_LOCK):
            if cl.closed:
                cl.refuse_closed()
            # Every record put so far reaches its queue now, so what is removed below is all
            # the topic has, and what reput dispatches later was put later. First: a topic
            # whose records reput had not reached yet (or that sat in write buffers) looked
            # as if it had nothing to delete, and its queues came after the call.
            self._commit_pending()
            if reput is not None and not reput.is_stopped:
                reput.do_reput()
            queues = self.consume_queue_table.get(topic) or {}
            has_config = configs and self.topic_configs.select(topic) is not None
            has_offsets = configs and any(
                t == topic for _, t, _ in self.consumer_offsets.entries())
            # A queue object with no file is what a read of an unknown topic creates.
            has_queues = any(cq.mfq.files for cq in queues.values()) or \
                self.fs.is_dir(os.path.join(self.root, "consumequeue", topic))
            if not (has_queues or has_config or has_offsets):
                return False
            deleted_at = max(cl.max_offset, cl.mfq.get_max_wrote_position())
            # The commit point: from here on the topic is deleted, whatever happens.
            self.deleted_topics.mark(topic, deleted_at, pending=True)
            with self._cq_lock:
                queues = self.consume_queue_table.pop(topic, {})
                for qid in queues:
                    self._cq_raw.pop((topic.encode("utf-8"), qid), None)
            table = cl.topic_queue_table
            for key in [k for k in table if k[0] == topic]:
                del table[key]          # the next put to it starts at queue offset 0
            for d in self.dispatchers:
                forget = getattr(d, "forget_queues", None)
                if forget is not None:
                    forget()
            # Closed before the rename: a closed queue has no last file, so the
            # PopulateAheadService can no longer make a next file for it, which would
            # create the topic's directory again after the rename.
            for cq in queues.values():
                cq.close()
            base = os.path.join(self.root, "consumequeue")
            tdir = os.path.join(base, topic)
            aside = topic_delete.deleted_dir(base, topic)
            if self.fs.is_dir(tdir):
                if self.fs.exists(aside):
                    topic_delete.remove_tree(self.fs, aside)
                self.fs.rename(tdir, aside)
                self.fs.fsync_dir(base)
        self._finish_deletion(topic, configs)
        log.info("deleted topic %s (%d queue(s)); its records stay in the CommitLog until "
                 "they expire", topic, len(queues))
        return True

    def _finish_deletion(self, topic, configs):
        """The deletion's second half, also run by load() for an entry still pending."""
        if configs:
            self.topic_configs.delete(topic)
            for group, t, _ in self.consumer_offsets.entries():
                if t == topic:
                    self.consumer_offsets.remove(group, topic)
            self.consumer_offsets.persist_if_dirty()
        aside = topic_delete.deleted_dir(os.path.join(self.root, "consumequeue"), topic)
        if self.fs.exists(aside):
            topic_delete.remove_tree(self.fs, aside)
        self.deleted_topics.mark(topic, 0, pending=False)

    def _finish_pending_deletions(self):
        if self.read_only:
            return
        for topic in self.deleted_topics.pending():
            log.info("finishing the deletion of topic %s", topic)
            self._finish_deletion(topic, configs=True)

    def destroy(self):
        """DefaultMessageStore#destroy: remove every file of the store (CommitLog,
        ConsumeQueues, index, checkpoint, abort, config/, the rebuild marker, then the lock
        file and the root if nothing else is left in it). Refused (StoreError) unless the
        store is shut down, and (StoreLockedError) while another process holds it. Files
        that are not the store's are left where they are."""
        if self.read_only:
            raise StoreError("a read-only store is never destroyed")
        if self.loaded:
            raise StoreError("destroy() removes every file of the store: call shutdown() "
                             "first (the store is still open)")
        fs = self.fs
        if not fs.is_dir(self.root):
            return
        lock = StoreLock(self.root, fs)
        lock.acquire()              # no other process may have it open
        try:
            cl_dir = self.commitlog.mfq.store_path
            for name in split_segment_names(fs, cl_dir, None)[0]:
                fs.remove(os.path.join(cl_dir, name))
            fs.remove_dir_if_empty(cl_dir)
            for name in ("consumequeue", "index", "config", INDEX_AHEAD_DIR):
                path = os.path.join(self.root, name)
                if fs.is_dir(path) and not _resolves_outside(self.root, path):
                    topic_delete.remove_tree(fs, path)
            for name in ("abort", "checkpoint", "rebuild"):
                fs.remove(os.path.join(self.root, name))
        finally:
            lock.release()
        fs.remove(os.path.join(self.root, "lock"))
        fs.remove_dir_if_empty(self.root)

    # ---- put ----------------------------------------------------------------------------------
    def _install_put_path(self):
        """Bind put_message to the backend's compiled put path, when it has one: the common
        put is then one call with no Python frame, and every other case comes back to the
        method below. Masters only (a slave refuses puts)."""
        make = getattr(self.kernels, "PutPath", None)
        if make is None or self.is_slave:
            return
        from .mapped_file import MappedFile
        from .message import _HOST_CACHE, Message
        path = make(self._put_message, self._put_messages, self.commitlog, self.running_flags,
                    NOT_WRITEABLE_MASK, self.clock, Message, MappedFile, PutMessageResult,
                    PutMessagesResult, PutMessageStatus.PUT_OK, _HOST_CACHE)
        self.put_message = path.put
        self.put_messages = path.put_list
        self._compiled_put_list = self.put_messages     # takes `written` (inline dispatch)
        self._put_columns = path.put_columns
        self._put_lists = path.put_lists

    def _install_compression(self):
        """compress_msg_body: put_message and put_messages compress each body as a 4.9
        producer does before sending it (compression.compress_for_put), above whichever put
        path is bound, so every backend stores the same bytes. A broker batch is stored as it
        is: the client never compresses a MessageBatch."""
        put, put_list = self.put_message, self.put_messages
        cfg = self.config
        threshold, level = cfg.compress_msg_body_over_howmuch, cfg.compress_level

        def put_message(msg):
            return put(compressed_message(msg, threshold, level))

        def put_messages(msgs, batch_properties=None):
            if batch_properties is None:
                try:
                    msgs = [compressed_message(m, threshold, level) for m in msgs]
                except TypeError:
                    pass                # not iterable: put_messages says so
            return put_list(msgs, batch_properties)

        put_message.__doc__ = MessageStore.put_message.__doc__
        put_messages.__doc__ = MessageStore.put_messages.__doc__
        self.put_message = put_message
        self.put_messages = put_messages

    def _install_inline_dispatch(self):
        """dispatch_in_put_lag: put_messages (whichever path is bound) and put_batch
        dispatch in their own thread once reput lags that far behind
        (ReputMessageService.dispatch_if_behind)."""
        put_list = self.put_messages
        lag = self.config.dispatch_in_put_lag
        reput = self.reput_service
        help_dispatch = functools.partial(reput.dispatch_if_behind, lag)
        if lag:
            def put_messages(msgs, batch_properties=None):
                r = put_list(msgs, batch_properties)
                help_dispatch()
                return r
        else:
            # Every batch put dispatches what it wrote: the reput thread stands aside meanwhile.
            begins, ends = reput.put_begins, reput.put_ends
            if reput.takes_put_rows and not self.config.effective_transient_store_pool_enable:
                # The compiled put paths hand the dispatch the rows of what they wrote, so
                # it does not scan those records again; one WrittenRows per putting thread.
                # (Not with write buffers: their records become readable at a later commit,
                # so no put's dispatch could take them.)
                local = threading.local()

                def written():
                    w = getattr(local, "w", None)
                    if w is None:
                        w = local.w = WrittenRows()
                    w.n = 0
                    w.cuts = reput.cuts
                    return w
                self._written = written
            if self._written is not None and put_list is self._compiled_put_list:
                def put_messages(msgs, batch_properties=None):
                    begins()
                    try:
                        w = written()
                        r = put_list(msgs, batch_properties, w)
                        help_dispatch(w)
                    finally:
                        ends()
                    return r
            else:
                def put_messages(msgs, batch_properties=None):
                    begins()
                    try:
                        r = put_list(msgs, batch_properties)
                        help_dispatch()
                    finally:
                        ends()
                    return r
            self._put_begins = begins
            self._put_ends = ends

        put_messages.__doc__ = MessageStore.put_messages.__doc__
        self.put_messages = put_messages
        self._help_dispatch = help_dispatch

    def put_message(self, msg):
        """Store one message (asyncPutMessage + wait). Bad input raises MessageIllegalError;
        a store that is not writeable (disk full) answers SERVICE_NOT_AVAILABLE with a reason."""
        if not self._running:
            self._check_running()
        if self.is_slave:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, reason=_SLAVE_REASON)
        if self.running_flags.flag_bits & NOT_WRITEABLE_MASK:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                    reason=self._not_writeable_reason())
        if self.commitlog.put_cells[LOCK_BEGIN] and self.is_os_page_cache_busy():
            return PutMessageResult(PutMessageStatus.OS_PAGECACHE_BUSY, reason=self._busy_reason())
        t0 = time.monotonic_ns()
        try:
            r = self.commitlog.put_message(msg, self.clock)
        except Exception as exc:
            explain_put_failure((msg,), exc)
            raise
        record_put(self.commitlog.put_cells, time.monotonic_ns() - t0,
                   r.status is PutMessageStatus.PUT_OK)
        return r

    # What a compiled put path falls back to (the instance's put_message is then that path).
    _put_message = put_message

    def put_messages(self, msgs, batch_properties=None):
        """Store a list of messages of any topics and queues under one lock acquisition.
        `batch_properties` makes it a broker batch (one topic and queue; see
        CommitLog.put_messages), so a broker's MessageBatch replays byte for byte."""
        self._check_running()
        try:
            msgs = list(msgs)
        except TypeError:
            raise TypeError(f"msgs must be an iterable of Message, not "
                            f"{type(msgs).__name__}") from None
        if batch_properties is not None and not isinstance(batch_properties, dict):
            raise TypeError(f"batch_properties must be a dict or None, not "
                            f"{type(batch_properties).__name__}")
        refused = self._refused_batch()
        if refused is not None:
            return refused
        t0 = time.monotonic_ns()
        try:
            r = self.commitlog.put_messages(msgs, self.clock, batch_properties)
        except Exception as exc:
            explain_put_failure(msgs, exc)
            raise
        record_put(self.commitlog.put_cells, time.monotonic_ns() - t0,
                   r.status is PutMessageStatus.PUT_OK)
        return r

    _put_messages = put_messages

    def _put_encoded(self, records, sizes, keys, topics):
        """put_messages for records encoded already, each to its own queue (the schedule
        service's batch path; CommitLog.put_encoded). Returns (status, written, reason)."""
        self._check_running()
        refused = self._refused_batch()
        if refused is not None:
            return refused.status, 0, refused.reason
        t0 = time.monotonic_ns()
        status, done, reason = self.commitlog.put_encoded(records, sizes, keys, topics,
                                                          self.clock)
        record_put(self.commitlog.put_cells, time.monotonic_ns() - t0,
                   status is PutMessageStatus.PUT_OK)
        return status, done, reason

    def put_batch(self, topic, queue_id, bodies, tags=None, keys=None, properties=None, *,
                  flag=0, born_timestamp=0, born_host=("127.0.0.1", 0)):
        """Store many bodies to one topic and queue, columnar: the bytes put_messages writes
        for [Message(topic, body, tags=t, keys=k, queue_id=queue_id, properties=properties,
        flag=flag, born_timestamp=born_timestamp, born_host=born_host) ...], encoded without
        the GIL and with no per-message Python object.

        `bodies`: a list of bytes-like objects, or an (offsets, data) pair as Arrow and numpy
        lay them out (int32 or int64 offsets, n + 1 of them). `tags` and `keys`: one str for
        every message, or one value per message (None or "" for none; a key may be a list of
        str) as a list or an (offsets, data) pair of UTF-8. `properties`: a dict every message
        carries; a DELAY level is refused (put_messages rewrites delayed messages). Bad input
        raises MessageIllegalError or TypeError with nothing written. Returns a
        PutMessagesResult (numpy columns). With compress_msg_body, bodies are compressed
        as put_message compresses them."""
        self._check_running()
        put_lists = self._put_lists
        if (put_lists is not None and not self.config.compress_msg_body
                and self._refused_batch() is None):
            # The compiled path lays out and puts the common batch in one call. None: it
            # wrote nothing, and the general path below lays the batch out (raising for bad
            # input) and puts it.
            r = self._put_dispatched(put_lists, topic, queue_id, bodies, tags, keys,
                                     properties, flag, born_timestamp, born_host,
                                     batch_template)
            if r is not None:
                return r
        cols = columns(bodies, tags, keys, properties, self.kernels.column_join,
                       getattr(self.kernels, "batch_columns", None))
        refused = self._refused_batch()
        if refused is not None:
            return refused
        cfg = self.config
        if cfg.compress_msg_body:
            compress_bodies(cols, cfg.compress_msg_body_over_howmuch, cfg.compress_level)
        return self._put_dispatched(self._put_columns_or_python, topic, queue_id, cols, flag,
                                    born_timestamp, born_host)

    def _put_dispatched(self, put, *args):
        """put(*args, written): a batch put between the reput service's put_begins and
        put_ends, with the dispatch of what it wrote after it, as put_messages does (the
        hooks of _install_dispatch_in_put). `written` is the putting thread's WrittenRows,
        or None. Returns what `put` returns; nothing is dispatched when that is None."""
        help_dispatch, begins, ends = self._help_dispatch, self._put_begins, self._put_ends
        written = self._written
        if begins is not None:
            begins()
        try:
            if written is not None:
                written = written()
            r = put(*args, written)
            if help_dispatch is not None and r is not None:
                help_dispatch(written)
        finally:
            if begins is not None:
                ends()
        return r

    def _put_columns_or_python(self, topic, queue_id, cols, flag, born_timestamp, born_host,
                               written):
        """The laid-out batch `cols` through the compiled put_columns, or through
        CommitLog.put_batch, the reference, when that declines (or the backend has none)."""
        put_columns = self._put_columns
        r = None if put_columns is None else put_columns(
            topic, queue_id, cols, flag, born_timestamp, born_host, written)
        if r is None:
            t0 = time.monotonic_ns()
            r = self.commitlog.put_batch(topic, queue_id, cols, self.clock, flag=flag,
                                         born_timestamp=born_timestamp,
                                         born_host=born_host, written=written)
            record_put(self.commitlog.put_cells, time.monotonic_ns() - t0,
                       r.status is PutMessageStatus.PUT_OK)
        return r

    def _refused_batch(self):
        """checkStoreStatus for a list or a batch: the empty result a slave, a store that
        is not writeable or a busy put lock answers, or None when the put may go on."""
        if self.is_slave or self.running_flags.flag_bits & NOT_WRITEABLE_MASK:
            status = PutMessageStatus.SERVICE_NOT_AVAILABLE
            reason = _SLAVE_REASON if self.is_slave else self._not_writeable_reason()
        elif self.commitlog.put_cells[LOCK_BEGIN] and self.is_os_page_cache_busy():
            status, reason = PutMessageStatus.OS_PAGECACHE_BUSY, self._busy_reason()
        else:
            return None
        import numpy as np
        empty = np.empty(0, dtype=np.int64)
        return PutMessagesResult(status, 0, empty, empty, empty, 0, 0, reason=reason)

    # ---- back-pressure (isOSPageCacheBusy) ----------------------------------------------
    def is_os_page_cache_busy(self):
        """True when a put has held the put lock longer than
        config.os_page_cache_busy_time_out_mills (and less than 10,000,000 ms, 4.9.8's guard
        against a bogus begin time), by the store's clock: puts then answer
        OS_PAGECACHE_BUSY before taking the lock, as the broker's send path does. The clock
        is read only while a put holds the lock."""
        begin = self.commitlog.put_cells[LOCK_BEGIN]
        return bool(begin) and busy_for(begin, self.clock(),
                                        self.config.os_page_cache_busy_time_out_mills)

    def metrics(self):
        """The store's counters as numbers, for a metrics exporter (stats.prometheus_collector):
        put_messages, put_bytes, put_failed, put_latency ({bucket name: puts}), get_found,
        get_miss, get_transferred, dispatch_behind_bytes, and lock_time_ms (lock_time_mills;
        None under an injected clock, which a scraping thread must not call)."""
        cells = self.commitlog.put_cells
        found, miss, transferred, _ = get_totals(self.get_counters, self.read_path)
        return {"put_messages": int(cells[PUT_TIMES]), "put_bytes": int(cells[PUT_BYTES]),
                "put_failed": int(cells[PUT_FAILED]),
                "put_latency": {name: int(cells[PUT_HIST + i])
                                for i, name in enumerate(PUT_LATENCY_BUCKETS)},
                "get_found": found, "get_miss": miss, "get_transferred": transferred,
                "dispatch_behind_bytes": self.dispatch_behind_bytes(),
                "lock_time_ms": self.lock_time_mills() if self.clock is system_clock else None}

    def dispatch_failures(self):
        """(dispatch attempts failed in a row, the OS error failing them or None): a reput
        that keeps failing (a full disk, no descriptors left) names its error here; (0, None)
        while dispatch works, and before start()."""
        reput = self.reput_service
        if reput is None:
            return 0, None
        return reput.failures, reput.failing

    def lock_time_mills(self):
        """How long (ms, by the store's clock) the put holding the put lock has held it; 0
        when none does (lockTimeMills, the broker's pageCacheLockTimeMills)."""
        begin = self.commitlog.put_cells[LOCK_BEGIN]
        if not begin:
            return 0
        return max(0, self.clock() - begin)

    def _busy_reason(self):
        return (f"[PC_SYNCHRONIZED]broker busy: the put lock has been held longer than "
                f"os_page_cache_busy_time_out_mills "
                f"({self.config.os_page_cache_busy_time_out_mills} ms)")

    def _on_disk_full(self, reason):
        """A reservation found the disk full: refuse puts before the lock from now on, until
        the disk check sees space again (CleanCommitLogService.is_space_full)."""
        if self.running_flags.get_and_make_disk_full(reason):
            log.error("%s: puts are refused until space is freed", reason)

    def _not_writeable_reason(self):
        flags = self.running_flags
        if flags.is_disk_full:
            return flags.disk_full_reason
        return "the message store is not writeable: " + ", ".join(flags.describe())

    # ---- topics, groups, consumer offsets (config/*.json) --------------------------------------
    def _check_writable_config(self):
        if not self.loaded:
            raise StoreClosedError("the store is not loaded")
        if self.read_only:
            raise StoreClosedError("a read-only store does not change its config files")

    def _topic_configs_changed(self, table):
        # Rebound, not mutated: encode() reads the dict without a lock.
        self.commitlog.write_queue_limits = {name: tc.write_queue_nums
                                             for name, tc in table.items()}

    def topic_config(self, topic):
        """The topic's TopicConfig, or None."""
        self.check_open()
        return self.topic_configs.select(check_str(topic, "topic"))

    def update_topic_config(self, topic, read_queue_nums=16, write_queue_nums=16, perm=6,
                            topic_filter_type="SINGLE_TAG", topic_sys_flag=0, order=False):
        """Create or replace a topic's config and persist topics.json. From then on a put to
        queue_id >= write_queue_nums raises MessageIllegalError."""
        self._check_writable_config()
        # The put's rule, length included: a topic no put accepts needs no config.
        why = topic_problem(topic, MAX_TOPIC_LENGTH)
        if why is not None:
            raise ConfigError(why)
        for name, value in (("read_queue_nums", read_queue_nums),
                            ("write_queue_nums", write_queue_nums), ("perm", perm),
                            ("topic_sys_flag", topic_sys_flag)):
            check_int(value, name)
        check_str(topic_filter_type, "topic_filter_type")
        if read_queue_nums < 0 or write_queue_nums < 0:
            raise ConfigError("queue numbers must be >= 0")
        old = self.topic_configs.select(topic)
        tc = TopicConfig(topic, read_queue_nums, write_queue_nums, perm, topic_filter_type,
                         topic_sys_flag, order, extra=dict(old.extra) if old else {})
        return self.topic_configs.update(tc)

    def delete_topic_config(self, topic):
        """Remove a topic's config (its queues and messages stay); returns the old one."""
        self._check_writable_config()
        return self.topic_configs.delete(check_str(topic, "topic"))

    def subscription_group(self, group):
        """The group's SubscriptionGroupConfig, or None."""
        self.check_open()
        return self.subscription_groups.find(check_str(group, "group"))

    def update_subscription_group(self, group, **fields):
        """Create or update a subscription group (fields as SubscriptionGroupConfig's, e.g.
        retry_max_times=3) and persist subscriptionGroup.json."""
        self._check_writable_config()
        check_str(group, "group")
        old = self.subscription_groups.find(group)
        base = dataclasses.asdict(old) if old else {}
        base.update(fields, group_name=group)
        try:
            cfg = SubscriptionGroupConfig(**base)
        except TypeError as exc:
            raise ConfigError(str(exc)) from None
        return self.subscription_groups.update(cfg)

    def delete_subscription_group(self, group):
        self._check_writable_config()
        return self.subscription_groups.delete(check_str(group, "group"))

    def commit_offset(self, group, topic, queue_id, offset):
        """Record `offset` (the next message to consume) for the group on a queue; written to
        consumerOffset.json as `topic@group` by the periodic service and at shutdown."""
        self._check_writable_config()
        check_offset_commit(group, topic, queue_id, offset)
        self.consumer_offsets.commit_offset(group, topic, queue_id, offset)

    def query_offset(self, group, topic, queue_id):
        """The committed offset, or -1 when the group never committed one for the queue."""
        self.check_open()
        check_offset_query(group, topic, queue_id)
        return self.consumer_offsets.query_offset(group, topic, queue_id)

    # ---- cleaning -----------------------------------------------------------------------------
    def clean_files_periodically(self, now_ms=None):
        """One cleaning round (cleanFilesPeriodically): expired CommitLog files, then the
        ConsumeQueue and index files below the new minimum. Returns the CommitLog files
        deleted."""
        self._check_running()
        deleted = self._clean_files(check_optional_int(now_ms, "now_ms", INT64_MIN, INT64_MAX))
        if deleted is None:
            raise StoreClosedError("the store shut down before the cleaning round could run")
        return deleted

    def _drop_cold_cache(self):
        """drop_cold_commit_log_cache: evict the CommitLog's flushed bytes farther behind its
        end than mem_limit (where a read counts them as on disk) from the page cache. Not
        those reput has yet to dispatch: it reads them next, and would fault them back in
        from the disk, cached again for good (each range is evicted once)."""
        mfq = self.commitlog.mfq
        below = min(mfq.flushed_where, mfq.get_max_offset() - self.mem_limit)
        dispatched = self._dispatched_offset()
        if dispatched is not None:
            below = min(below, dispatched)
        mfq.drop_cache_below(below)

    def _clean_files(self, now_ms=None):
        """One cleaning round; None, with nothing done, once shutdown has begun: shutdown
        waits for a round under way before its final flush, and none starts after."""
        with self._clean_lock:
            if not self._running:
                return None
            if now_ms is None:
                now_ms = self.clock()
            deleted = self.clean_commitlog_service.run_once(now_ms)
            self.clean_consume_queue_service.run_once(now_ms)
        return deleted

    def clean_plan(self, now_ms=None):
        """What the next cleaning round would delete and the unconsumed messages per group it
        would cost (a CleanPlan), without deleting anything."""
        self.check_open()
        check_optional_int(now_ms, "now_ms", INT64_MIN, INT64_MAX)
        return self.clean_commitlog_service.plan(now_ms)

    def store_size(self):
        """Bytes the store's CommitLog, ConsumeQueue and index files take on disk (allocated
        blocks: the files are sparse), as store_size_budget counts them."""
        self.check_open()
        return self._measure_size().total

    def _measure_size(self):
        return StoreSize(self.fs, self.commitlog.mfq, self.all_consume_queues(),
                         self.index_service.index_file_list)

    def _dispatched_offset(self):
        """Where reput has dispatched the CommitLog to; None before it runs."""
        reput = self.reput_service
        return None if reput is None else reput.reput_from_offset

    def execute_delete_files_manually(self):
        """Make the next 20 cleaning rounds delete expired files whatever the hour."""
        self._check_running()
        self.clean_commitlog_service.execute_delete_files_manually()

    # ---- get ----------------------------------------------------------------------------------
    def get_min_offset_in_queue(self, topic, queue_id):
        self.check_open()
        check_queue(topic, queue_id)
        return self.find_consume_queue(topic, queue_id).min_offset_in_queue

    def get_max_offset_in_queue(self, topic, queue_id):
        """The queue offset the next put to the queue gets; counts every put returned."""
        self.check_open()
        check_queue(topic, queue_id)
        self.catch_up()
        return self.find_consume_queue(topic, queue_id).max_offset_in_queue

    def get_min_phy_offset(self):
        self.check_open()
        return self.commitlog.min_offset

    def get_max_phy_offset(self):
        self.check_open()
        return self.commitlog.max_offset

    def update_ha_master_address(self, addr):
        """DefaultMessageStore#updateHaMasterAddress: the "host:port" a slave follows, used
        from its next connection on (a broker learns it from the name server)."""
        check_str(addr, "addr")
        self.config.ha_master_address = addr
        if self.ha_service is not None:
            self.ha_service.update_master_address(addr)

    def dispatch_behind_bytes(self):
        """CommitLog bytes written but not yet dispatched to the ConsumeQueues and index."""
        self.check_open()
        # A batch put's keys still with the index worker count as dispatched once settled.
        self.index_service.settle_for_reader()
        return self.reput_service.behind() if self.reput_service else 0

    def next_offset_correction(self, old, new):
        """The next offset a read answers when `old` was out of range and `new` is where the
        queue has data: a slave keeps `old` unless offset_check_in_slave (as 4.9.8 does)."""
        if self.is_slave and not self.config.offset_check_in_slave:
            return old
        return new

    def get_message(self, group, topic, queue_id, offset, max_msg_nums=32, message_filter=None,
                    *, subscription=None, property_filter=None, wait_ms=0, decompress=True):
        """Pull up to `max_msg_nums` messages from a queue, from queue offset `offset` on
        (DefaultMessageStore#getMessage: the same statuses and next offsets).

        Every put that returned before the call is visible to it (read-your-writes). Unlike
        a broker's remote pull, the call is not cut at 32 messages or 256 KiB: it returns
        `max_msg_nums` messages when the queue holds them, up to the bounds
        read_path.MAX_MSG_NUMS (max_msg_nums itself) and read_path.MAX_BYTES (the bytes of
        the records collected, after the first one).

        `subscription` is a tag expression as a RocketMQ consumer subscribes with: None, ""
        or "*" for every message, else tags separated by "||" ("TagA || TagB"), each trimmed
        (or a parsed subscription.Subscription; expressions are parsed once and cached). A
        unit is read only when its tagsCode is one of the tags' String.hashCode() (the
        broker's ExpressionMessageFilter), and its message is taken only when its TAGS is one
        of the tags (a hash collision, or no TAGS, is left out, as the 4.9 client does).
        `property_filter`, if given, is then called with each message's properties dict and
        leaves it out when it returns False (the place of the broker's isMatchedByCommitLog;
        SQL92 expressions are not parsed). `message_filter`, if given, is called with each
        unit's tagsCode, before the subscription, and skips the unit when it returns False.

        Units a filter leaves out do not count toward `max_msg_nums`; the result's
        `filtered_count` says how many there were and `next_begin_offset` is past them. When
        every unit read was left out the status is NO_MATCHED_MESSAGE, as the broker's (its
        last unit's file gone: MESSAGE_WAS_REMOVING), and reading on from next_begin_offset
        continues the scan. Messages come back decoded as MessageExt (properties decoded on
        first use).

        `wait_ms` > 0 makes the call wait, up to that many ms, for the queue to have a message
        at `offset` (one the filter accepts): it returns as soon as the reput dispatch writes
        one (woken, not polling; the wait holds neither the GIL nor a lock), or when the time
        is up with what get_message answers then. Only "nothing there yet" answers wait
        (NO_MESSAGE_IN_QUEUE, OFFSET_OVERFLOW_ONE); an offset out of range answers at once.
        A shutdown meanwhile raises StoreClosedError. A read-only store dispatches nothing,
        so there a wait lasts its whole time.

        A compressed body (COMPRESSED_FLAG, doc/01 §3.5) comes back as the original bytes,
        decompressed when MessageExt.body is first read (CorruptBodyError if it cannot be);
        with `decompress` false `body` is the stored bytes (MessageExt.stored_body always is).
        """
        if not decompress:
            return _stored(self.get_message(group, topic, queue_id, offset, max_msg_nums,
                                            message_filter, subscription=subscription,
                                            property_filter=property_filter, wait_ms=wait_ms))
        if wait_ms:
            check_wait_ms(wait_ms)
            return wait_for_message(self, group, topic, queue_id, offset, max_msg_nums,
                                    message_filter, wait_ms, subscription=subscription,
                                    property_filter=property_filter)
        return self._read(self.read_path.get_message, self.read_path.pull, GetMessageResult,
                          group, topic, queue_id, offset, max_msg_nums, message_filter,
                          subscription, property_filter)

    def _read(self, compiled, pull, result, group, topic, queue_id, offset, max_msg_nums,
              message_filter, subscription, property_filter):
        """get_message's and get_batch's walk: `compiled` takes the common call whole (the
        checks, the catch-up and the pull) where the backend has it; `pull` reads from a queue
        that exists, and `result` is the type of the answers decided before a unit is read."""
        if subscription is None and property_filter is None:
            r = compiled(self, group, topic, queue_id, offset, max_msg_nums, message_filter)
            if r is not None:
                return r
        self.check_open()
        cq = self._checked_queue(group, topic, queue_id, offset, max_msg_nums, message_filter)
        if subscription is not None or property_filter is not None:
            subscription, property_filter = read_filters(subscription, property_filter)
        self.catch_up()
        if cq is not None and self.loaded:
            # The common case as one call (it counts itself in the statistics); the rest
            # (statuses decided before a unit is read) below.
            r = pull(self, cq, offset, max_msg_nums, message_filter, read_path.MAX_BYTES,
                     subscription, property_filter)
            if r is not None:
                return r
        return self._read_past_pull(pull, result, topic, queue_id, int(offset),
                                    int(max_msg_nums), message_filter, cq, subscription,
                                    property_filter)

    def _checked_queue(self, group, topic, queue_id, offset, max_msg_nums, message_filter):
        """get_message's and get_batch's arguments checked; the queue when it exists."""
        queues = self.consume_queue_table.get(topic)
        cq = queues.get(queue_id) if queues is not None else None
        # The common call, checked by type alone: a queue that exists has a valid topic and
        # queue id (a bool would find queue 0 or 1, hence the exact type).
        if cq is None or type(queue_id) is not int or type(offset) is not int \
                or type(group) is not str or type(max_msg_nums) is not int \
                or not 0 < max_msg_nums <= read_path.MAX_MSG_NUMS \
                or (message_filter is not None and not callable(message_filter)):
            check_str(group, "group")
            check_queue(topic, queue_id)
            check_int(offset, "offset")
            check_int(max_msg_nums, "max_msg_nums", 1, read_path.MAX_MSG_NUMS)
            check_callable(message_filter, "message_filter")
            return None
        return cq

    def get_batch(self, group, topic, queue_id, offset, max_msg_nums=32, message_filter=None,
                  *, subscription=None, property_filter=None):
        """get_message as columns: the same walk, filters, statuses, offsets and records,
        returned as a read_path.GetBatchResult of numpy columns (commit_log_offset, size,
        store_timestamp, tags_code, queue_offset, ...) with zero-copy body views (body(i))
        that keep their CommitLog file held and mapped while they live. No object is made
        per message (but one per message a property_filter is asked about). Body views are
        the stored bytes: the `compressed` column marks the records whose body is compressed
        (sys_flag has their codec), and original_body(i) decompresses one."""
        return self._read(self.read_path.get_batch, self.read_path.pull_batch,
                          read_path.GetBatchResult, group, topic, queue_id, offset,
                          max_msg_nums, message_filter, subscription, property_filter)

    def _read_past_pull(self, pull, result, topic, queue_id, offset, max_msg_nums,
                        message_filter, cq, subscription, property_filter):
        """get_message's and get_batch's answer when their ReadPath's pull did not give it:
        the statuses decided before a unit is read (read_path.prelude), else the pull, else
        OFFSET_FOUND_NULL (its first unit's file is missing). `cq`: the queue, if known."""
        if not self.loaded:
            raise StoreClosedError("the store is not loaded")
        if cq is None:
            cq = self.find_consume_queue(topic, queue_id)
        correction = self.next_offset_correction
        min_off, max_off, early = read_path.prelude(cq, offset, correction)
        if early is None:
            r = pull(self, cq, offset, max_msg_nums, message_filter, read_path.MAX_BYTES,
                     subscription, property_filter)
            if r is not None:
                return r            # counted by the read path
            early = read_path.found_null(cq, offset, correction)
        self.get_counters.miss += 1
        return result(early[0], early[1], min_off, max_off)

    # ---- consumers that wait, and asyncio (rocketstore/consumer.py) ----------------------------
    def consume(self, group, topic, queue_id, batch_size=32, message_filter=None, *,
                subscription=None, property_filter=None, decompress=True):
        """A Consumer: `for messages in store.consume(group, topic, queue_id):` yields lists of
        MessageExt as they arrive, from the group's committed offset (the queue's minimum if
        none), committing a batch's end when the next batch is asked for. close() (or leaving
        `with store.consume(...) as c:`) or the store's shutdown ends it. `subscription`,
        `property_filter` and `message_filter` filter as get_message's do; the offsets
        committed move past the units they leave out. Compressed bodies are the original ones
        unless `decompress` is false (get_message)."""
        return Consumer(self, group, topic, queue_id, batch_size, message_filter,
                        decompress=decompress, subscription=subscription,
                        property_filter=property_filter)

    def aconsume(self, group, topic, queue_id, batch_size=32, message_filter=None, *,
                 subscription=None, property_filter=None, decompress=True):
        """consume() for asyncio: `async for messages in store.aconsume(...)`; the event loop
        never blocks (reads and commits run in its default executor)."""
        return AsyncConsumer(self, group, topic, queue_id, batch_size, message_filter,
                             decompress=decompress, subscription=subscription,
                             property_filter=property_filter)

    async def aput_message(self, msg):
        """put_message for asyncio. The put runs in the loop's default executor, always: even
        an ASYNC_FLUSH put can block (the put lock under contention, waiting for the next
        CommitLog file, a page fault into a file being written), and a SYNC_FLUSH or
        SYNC_MASTER put waits for the disk or the slave."""
        import asyncio
        return await asyncio.get_running_loop().run_in_executor(None, self.put_message, msg)

    async def aget_message(self, group, topic, queue_id, offset, max_msg_nums=32,
                           message_filter=None, *, subscription=None, property_filter=None,
                           wait_ms=0, decompress=True):
        """get_message (and its filters, wait_ms and decompress) for asyncio: the reads run in
        the loop's default executor, the wait is an asyncio.Event the reput dispatch sets."""
        check_wait_ms(wait_ms)
        self.check_open()
        read_filters(subscription, property_filter)     # refused here, not in the executor
        r = await await_message(self, group, topic, queue_id, offset, max_msg_nums,
                                message_filter, wait_ms, subscription=subscription,
                                property_filter=property_filter)
        return r if decompress else _stored(r)

    def look_message_by_offset(self, phy_offset, decompress=True):
        """The record at a commit-log offset, decoded; None if there is none. Its body is
        the original one unless `decompress` is false (get_message)."""
        self.check_open()
        check_int(phy_offset, "phy_offset")
        self._commit_pending()
        rec = self.commitlog.get_message_bytes(phy_offset)
        if rec is None:
            return None
        try:
            m = MessageExt.decode(rec)
            return m if decompress else m.keep_stored()
        except CorruptRecordError as exc:
            log.warning("no record at offset %d: %s", phy_offset, exc)
            return None

    # ---- queries (rocketstore/query.py) ---------------------------------------------------------
    def query_message(self, topic, key, max_num=32, begin=0, end=None, decompress=True):
        """Messages carrying `key` (a KEYS piece or UNIQ_KEY) under `topic`, stored in
        [begin, end] ms (end None: no bound), at most min(max_num, max_msgs_num_batch), newest
        kept, in ascending offset order: a QueryMessageResult (DefaultMessageStore#queryMessage,
        but every hit is checked against its record, so a hash collision never answers).
        Every put that returned before the call is indexed for it. Bodies are the original
        ones unless `decompress` is false (get_message)."""
        # The common call as one compiled call (the checks, catch-up and query below).
        r = self.read_path.query_message(self, topic, key, max_num, begin, end)
        if r is not None:
            if not decompress:
                keep_stored(r.messages)
            return r
        if not self.loaded:
            self.check_open()
        # The common call in a few type checks; anything else goes through the full checks,
        # which say what is wrong.
        if not (type(topic) is str and type(key) is str and type(max_num) is int
                and type(begin) is int and (end is None or type(end) is int)
                and 1 <= max_num and INT64_MIN <= begin <= INT64_MAX
                and (end is None or INT64_MIN <= end <= INT64_MAX)):
            check_str(topic, "topic")
            check_str(key, "key")
            check_int(max_num, "max_num", 1)
            # Store timestamps are Java longs: a wider bound overflowed the index lookup.
            check_int(begin, "begin", INT64_MIN, INT64_MAX)
            check_optional_int(end, "end", INT64_MIN, INT64_MAX)
        self.catch_up()
        r = query.query_message(self.commitlog, self.index_service, self.kernels, self.read_path,
                                self.config.max_msgs_num_batch, topic, key, max_num, begin, end)
        if not decompress:
            keep_stored(r.messages)
        return r

    def query_message_by_unique_key(self, topic, uniq_key, decompress=True):
        """The MessageExt whose UNIQ_KEY is `uniq_key` under `topic`, or None. Its body is
        the original one unless `decompress` is false (get_message)."""
        self.check_open()
        check_str(topic, "topic")
        check_str(uniq_key, "uniq_key")
        self.catch_up()
        m = query.query_message_by_unique_key(
            self.commitlog, self.index_service, self.kernels, self.read_path,
            self.config.max_msgs_num_batch, topic, uniq_key)
        return m if decompress or m is None else m.keep_stored()

    def view_message_by_id(self, msg_id, decompress=True):
        """The MessageExt an offset msgId names, or None (InvalidArgumentError, a ValueError,
        if it is no msgId). Its body is the original one unless `decompress` is false."""
        self.check_open()
        check_str(msg_id, "msg_id")
        self._commit_pending()
        m = query.view_message_by_id(self.commitlog, self.kernels, msg_id)
        return m if decompress or m is None else m.keep_stored()

    def get_offset_in_queue_by_time(self, topic, queue_id, timestamp, boundary=None):
        """The queue offset of the message stored nearest `timestamp` (4.9.x algorithm,
        ConsumeQueue#getOffsetInQueueByTime; the file is chosen by its mtime). With
        `boundary` "lower" or "upper", 5.x's BoundaryType: the first message stored at or
        after `timestamp`, or the last one stored at or before it."""
        self.check_open()
        check_str(topic, "topic")
        check_int(queue_id, "queue_id")
        check_int(timestamp, "timestamp")
        if boundary is not None and boundary not in query.BOUNDARIES:
            raise InvalidArgumentError(f"boundary must be None, 'lower' or 'upper', "
                                       f"got {boundary!r}")
        self.catch_up()
        queues = self.consume_queue_table.get(topic)
        cq = queues.get(queue_id) if queues else None
        if boundary is None:
            return query.get_offset_in_queue_by_time(cq, self.commitlog, self.fs, timestamp)
        return query.get_offset_in_queue_by_boundary(cq, self.commitlog, timestamp, boundary)

    # ---- the rest of DefaultMessageStore's read interface -----------------------------------
    # Java's versions call findConsumeQueue, which creates a missing queue; these never create
    # one (a read must not leave a queue directory behind) and answer as for an empty queue.
    def get_consume_queue(self, topic, queue_id):
        """The ConsumeQueue of `topic`/`queue_id`, or None when the store has none
        (getConsumeQueue). find_consume_queue is the variant that creates it."""
        self.check_open()
        check_queue(topic, queue_id)
        self.catch_up()
        return self.consume_queue_table.get(topic, {}).get(queue_id)

    def _unit(self, topic, queue_id, queue_offset):
        """(commit-log offset, size) of a queue's unit, or None (getIndexBuffer)."""
        check_int(queue_offset, "queue_offset")
        cq = self.get_consume_queue(topic, queue_id)
        if cq is None or queue_offset < cq.min_offset_in_queue:
            return None
        units = cq.units(queue_offset, 1)
        return (int(units[0]["offset"]), int(units[0]["size"])) if len(units) else None

    def get_message_total_in_queue(self, topic, queue_id):
        """Units in the queue (max - min offset; 0 for a queue the store does not have)."""
        cq = self.get_consume_queue(topic, queue_id)
        return cq.message_total_in_queue if cq is not None else 0

    def get_commit_log_offset_in_queue(self, topic, queue_id, queue_offset):
        """The commit-log offset the queue's unit `queue_offset` points at, 0 if none."""
        self.check_open()
        unit = self._unit(topic, queue_id, queue_offset)
        return unit[0] if unit else 0

    def get_message_store_timestamp(self, topic, queue_id, queue_offset):
        """The store time of the queue's message `queue_offset`, -1 if none."""
        self.check_open()
        unit = self._unit(topic, queue_id, queue_offset)
        return self.commitlog.pickup_store_timestamp(*unit) if unit else -1

    def get_earliest_message_time(self, topic=None, queue_id=None):
        """The store time of the oldest message: of the store's first record, or with
        `topic` and `queue_id` of the queue's first unit; -1 if none."""
        self.check_open()
        if topic is None and queue_id is None:
            off = self.commitlog.min_offset
            rec = self.commitlog.get_message_bytes(off) if off >= 0 else None
            return self.commitlog.pickup_store_timestamp(off, len(rec)) if rec else -1
        cq = self.get_consume_queue(topic, queue_id)
        if cq is None:
            return -1
        return self.get_message_store_timestamp(topic, queue_id, cq.min_offset_in_queue)

    def select_one_message_by_offset(self, commit_log_offset, size=None):
        """The raw bytes of the record at `commit_log_offset` (its `size` read from the record
        unless given), or None: selectOneMessageByOffset, as a copy."""
        self.check_open()
        check_int(commit_log_offset, "commit_log_offset", 0)
        self._commit_pending()
        if size is None:
            return self.commitlog.get_message_bytes(commit_log_offset)
        check_int(size, "size", 1)
        return self.commitlog.get_data(commit_log_offset, size)

    def check_in_disk_by_consume_offset(self, topic, queue_id, consume_offset):
        """True when the queue's message `consume_offset` lies further behind the CommitLog's
        end than access_message_in_memory_max_ratio of the machine's memory allows, so a read
        would likely come from disk (checkInDiskByConsumeOffset); False if there is none."""
        self.check_open()
        unit = self._unit(topic, queue_id, consume_offset)
        return unit is not None and self.commitlog.max_offset - unit[0] > self.mem_limit

    def append_to_commit_log(self, start_offset, data):
        """A slave's append of replicated CommitLog bytes that begin at `start_offset` (the
        CommitLog's end; appendToCommitLog): True when written, and reput is woken. A master
        refuses it (InvalidArgumentError): raw bytes would bypass its queue offsets."""
        self.check_open()
        check_int(start_offset, "start_offset", 0)
        if not self.is_slave:
            raise InvalidArgumentError("append_to_commit_log is for a slave's replicated "
                                       "bytes; a master stores messages with put_message")
        ok = self.commitlog.append_data(start_offset, memoryview(data).cast("B"))
        if ok and self.reput_service is not None:
            self.reput_service.wakeup()
        return ok

    def get_confirm_offset(self):
        """The confirm offset (getConfirmOffset): -1 until set_confirm_offset, as in 4.9.8,
        which reads it only in duplication mode; rocketstore does not implement that mode (see
        config.NOT_IMPLEMENTED), so here it is a value kept for the caller."""
        self.check_open()
        return self._confirm_offset

    def set_confirm_offset(self, offset):
        self.check_open()
        check_int(offset, "offset", -1)
        self._confirm_offset = offset

    def is_transient_store_pool_deficient(self):
        """True when the write-buffer pool is enabled and has no buffer left."""
        self.check_open()
        pool = self.commitlog.pool
        return pool is not None and pool.available == 0

    def get_commit_log_data(self, offset):
        """The CommitLog bytes from `offset` to the written end of the file holding it, as a
        zero-copy read-only memoryview (getCommitLogData; what HA ships): the file stays held
        and mapped while the view or a slice of it lives, as get_batch's body views do, so
        expiry and shutdown wait for it (drop it, or `view.release()`, when done). None when
        no file holds `offset` or nothing is written there yet."""
        self.check_open()
        check_int(offset, "offset", 0)
        self._commit_pending()
        mf = self.commitlog.mfq.find_by_offset(offset, offset == 0)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        end = mf.read_position
        if not 0 <= pos < end:
            return None
        return read_path.held_view(mf, pos, end)

    def flush(self):
        """Make everything written so far durable and return the CommitLog's flushed offset
        (DefaultMessageStore#flush). Write buffers are committed first. With SYNC_FLUSH the
        group commit syncs it, as a put's leader does (GroupCommitService.wait_flushed): one
        path, so a flush never races the puts' syncs; it waits up to sync_flush_timeout ms
        and then returns what is flushed. With ASYNC_FLUSH the flusher's full flush runs in
        the caller's thread, excluding the flusher's own round. Once a CommitLog sync failed
        it syncs nothing and returns the flushed offset the last good sync left (SyncLatch);
        on a store loaded and not started, the sync that fails raises StoreError."""
        self.check_open()
        mfq = self.commitlog.mfq
        if self.read_only:
            return mfq.flushed_where
        if self.commit_service is not None:
            self.commit_service.commit_now()
        elif self.commitlog.pool is not None:
            mfq.commit_through()
        service = self.flush_service
        if isinstance(service, GroupCommitService):
            service.wait_flushed(mfq.get_max_offset(), self.config.sync_flush_timeout)
        elif service is not None:
            service.flush_all()
        else:                               # loaded, not started: nothing else flushes
            latch = self.sync_latch
            if not latch.failed(latch.COMMITLOG) and \
                    not latch.flush_commitlog(mfq, mfq.flush_through):
                self._keep_abort_file()
                raise StoreError(f"{latch.failures[latch.COMMITLOG]}: the CommitLog is durable "
                                 f"up to {mfq.flushed_where} only; reopen the store")
        if mfq.store_timestamp > 0 and self.checkpoint is not None:
            self.checkpoint.physic_msg_timestamp = max(self.checkpoint.physic_msg_timestamp,
                                                       mfq.store_timestamp)
        return mfq.flushed_where

    def reset_write_offset(self, offset):
        """Cut the CommitLog back to `offset` (resetWriteOffset, with 5.x's
        MappedFileQueue.resetOffset: 4.9.8's walks from the list head and so never resets
        anything). Refused (False) when `offset` is more than two CommitLog files behind the
        written end, as 5.x refuses it. Otherwise the CommitLog's write, commit and flush
        positions go to `offset`, later files are deleted, and every ConsumeQueue unit and
        index file past it goes too, as recovery's truncation does (doc/03 §4); the queue
        offsets follow. Returns True.

        It holds the put lock throughout, so no put runs meanwhile (and no replicated
        append on a slave); what was written before it is dispatched and synced first. No
        cleaning round runs meanwhile either: the cut reads the CommitLog from its first file
        when it rebuilds the index, and a round destroying files under it left it half done. A
        slave whose master is ahead fetches the cut bytes again; slaves of this store are
        not told. An `offset` past the written end or before the first file raises
        InvalidArgumentError. A failed sync of the zeros written past the cut trips the
        SyncLatch (puts are refused from then on) and raises StoreError, the cut done in
        this process but not known durable."""
        self._check_running()
        check_int(offset, "offset", 0)
        cl = self.commitlog
        mfq = cl.mfq
        reput = self.reput_service
        flusher = self.flush_service
        flush_lock = getattr(flusher, "flush_lock", _NO_LOCK)
        unsynced_cut = None
        # The put lock before the dispatch lock, as delete_topic takes them: taken the other
        # way round, a cut and a deletion at once each waited for the other's.
        with self._clean_lock, cl.put_lock, reput.dispatch_lock:
            if cl.closed:
                cl.refuse_closed()
            self._commit_pending()
            end = mfq.get_max_wrote_position()
            first = mfq.first_file
            if offset > end or (first is not None and offset < first.file_from_offset):
                raise InvalidArgumentError(
                    f"offset {offset} is outside the CommitLog [{max(mfq.get_min_offset(), 0)}"
                    f", {end}]")
            if end - offset > 2 * cl.file_size:
                return False
            # Everything written reaches its queues (and the disk, for SYNC_FLUSH's
            # accounting) before the cut, so the cut leaves no pending range behind.
            if not reput.is_stopped:
                reput.do_reput()
            # The index worker's job reads records the cut may remove: done before it.
            self.index_service.settle()
            # The cut sets the flushed offset to `offset`, and syncs start from there on: what
            # lies below it must be durable first. Left dirty, no later sync would cover it,
            # and a put acknowledged after the cut would sit behind bytes a power cut loses
            # (recovery then stops at them and drops that put too).
            unsynced = f"the CommitLog could not be synced up to {end}: nothing was cut"
            if isinstance(flusher, GroupCommitService):
                if not flusher.wait_flushed(end, self.config.sync_flush_timeout):
                    raise StoreError(unsynced + " (a sync failed or took longer than "
                                     "sync_flush_timeout)")
            with flush_lock:
                if not isinstance(flusher, GroupCommitService):
                    if not flusher.run_flush(mfq.flush_through):
                        raise StoreError(unsynced + " (a sync failed)")
                    if mfq.flushed_where < end:
                        raise StoreError(unsynced)
                report = recovery.RecoveryReport(normal=True)
                max_phy = max((cq.max_physic_offset for cq in self.all_consume_queues()),
                              default=-1)
                queues = self.all_consume_queues()
                try:
                    recovery.truncate(self.commitlog, queues, offset, max_phy, report)
                except OSError as exc:
                    unsynced_cut = exc          # cut all the same: see below
                recovery.drop_index_past(self._recovery_parts(), self.index_service, offset,
                                         report)
                recovery.recover_topic_queue_table(self.commitlog, queues)
                for d in self.dispatchers:
                    forget = getattr(d, "forget_queues", None)
                    if forget is not None:
                        forget()
                reput.reput_from_offset = offset
                reput.cuts += 1             # rows a put made before the cut are stale
                if isinstance(flusher, GroupCommitService):
                    flusher.restart_from(offset)
        log.warning("CommitLog reset to offset %d: %d bytes dropped", offset,
                    report.truncated_bytes)
        if unsynced_cut is not None:
            # The disk may still hold what was cut, under zeros a later sync could report
            # durable without writing them: fail stop, as at any failed sync, so no put
            # lands on them; the next open recovers from the disk (and cuts again).
            latch = self.sync_latch
            path = unsynced_cut.filename or ""
            kind = latch.COMMITLOG if path.startswith(mfq.store_path) else \
                latch.CONSUME_QUEUE
            latch.trip(kind, unsynced_cut, f"of the cut to {offset} ")
            raise StoreError(f"the CommitLog was cut to {offset}, but {unsynced_cut}: the "
                             "cut may not be durable; puts are refused, reopen the store")
        return True

    def get_runtime_info(self):
        """What 4.9.8 reports as the store's runtime info, as a dict of str to str with its
        keys: StoreStatsService's (putTps, getFoundTps, getMissTps, getTotalTps and
        getTransferedTps over 10 s, 1 min and 10 min, space separated and empty until that
        much was sampled; the put-latency histogram putMessageDistributeTime; put and get
        totals), DefaultMessageStore's (disk ratios, CommitLog min and max offsets, and on a
        master scheduleMessageOffset_<level> = "delivered,max" per delay level), and the
        broker's store keys (dispatchBehindBytes, pageCacheLockTimeMills,
        earliestMessageTimeStamp; with write buffers remainTransientStoreBufferNumbs and the
        bytes left to commit and to flush, as plain numbers). A running store also publishes
        it once a second to its runtime file for `rocketstore stat` (stats.py)."""
        self.check_open()
        return self.runtime_info(self.lock_time_mills())

    def runtime_info(self, lock_time_mills):
        """get_runtime_info with the lock time given: the publishing thread must not call an
        injected store clock (a replay or step clock hands its values to the records)."""
        info = self.stats_service.runtime_info()
        cl_path = self.commitlog.mfq.store_path
        ratio = self.disk_usage(cl_path)
        info["commitLogDiskRatio"] = repr(float(ratio))
        info["commitLogDiskRatio_" + cl_path] = repr(float(ratio))
        info["consumeQueueDiskRatio"] = repr(float(self.disk_usage(
            os.path.join(self.root, "consumequeue"))))
        if self.schedule_message_service is not None:
            # ScheduleMessageService.buildRunningStats: "delivered,max" per delay level.
            queues = self.consume_queue_table.get(SCHEDULE_TOPIC, {})
            for level, offset in sorted(self.delay_offsets.offset_table.items()):
                cq = queues.get(level - 1)
                info[f"scheduleMessageOffset_{level}"] = \
                    f"{offset},{cq.max_offset_in_queue if cq is not None else 0}"
        info["commitLogMinOffset"] = str(self.get_min_phy_offset())
        info["commitLogMaxOffset"] = str(self.get_max_phy_offset())
        info["dispatchBehindBytes"] = str(self.dispatch_behind_bytes())
        if lock_time_mills is not None:
            info["pageCacheLockTimeMills"] = str(lock_time_mills)
        info["earliestMessageTimeStamp"] = str(self.get_earliest_message_time())
        pool = self.commitlog.pool
        if pool is not None:
            mfq = self.commitlog.mfq
            info["remainTransientStoreBufferNumbs"] = str(pool.available)
            info["remainHowManyDataToCommit"] = str(max(
                0, mfq.get_max_wrote_position() - mfq.committed_where))
            info["remainHowManyDataToFlush"] = str(max(
                0, mfq.get_max_offset() - mfq.flushed_where))
        return info

    def iter_messages(self, from_offset=None, decompress=True):
        """Every record in commit-log order, decoded (blank records skipped). Bodies are the
        original ones, decompressed when read, unless `decompress` is false (get_message): a
        body that does not decompress raises CorruptBodyError when it is read, and the walk
        goes on past it."""
        self.check_open()
        check_optional_int(from_offset, "from_offset")
        self._commit_pending()
        it = read_path.iter_messages(self.commitlog, self.kernels, self.read_path.decode_rows,
                                     from_offset)
        return it if decompress else (m.keep_stored() for m in it)
