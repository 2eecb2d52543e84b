# SPDX-License-Identifier: Apache-2.0
"""CommitLog: every message of every topic, appended under one put lock (doc/01 §3-§6)."""
import array
import contextlib
import errno
import struct
import threading

import numpy as np

from . import format as F
from .arguments import message_problem
from .batch import max_len_check
from .config import BrokerRole, FlushDiskType
from .errors import KernelBoundsError, MessageIllegalError, StoreClosedError
from .mapped_file_queue import MappedFileQueue
from .message import (PROPERTY_DELAY, PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, PROPERTY_WAIT,
                      Message, body_bytes, pack_host, properties_to_string, topic_problem)
from .services.allocate import AllocateMappedFileService
from .services.schedule import DeliveredMessage
from .stats import LOCK_BEGIN, PUT_BYTES, PUT_TIMES, new_put_cells
from .transient_pool import TransientStorePool
from .status import PutMessageResult, PutMessagesResult, PutMessageStatus

_I32 = F.I32
_NOT_DISPATCHED = (F.TRANSACTION_PREPARED_TYPE, F.TRANSACTION_ROLLBACK_TYPE)
_MAX_RECORD_OVERHEAD = 64 * 1024
# What after_put reads of a delivered record: its WAIT=false.
_NO_WAIT = Message("_", properties={PROPERTY_WAIT: "false"})


class _Encoded:
    """One message encoded outside the put lock (what MessageExtEncoder leaves in its buffer)."""
    __slots__ = ("size", "key", "dispatched", "store_raw")


class _PutLocked:
    """CommitLog._put_locked's context: a class, not a generator, because a batch put enters
    it on every call (the generator's context manager cost ~2 us of the ~25 a one-message
    put_batch took)."""

    __slots__ = ("_cl", "_clock", "_lock")

    def __init__(self, cl, clock):
        self._cl = cl
        self._clock = clock

    def __enter__(self):
        cl = self._cl
        self._lock = lock = cl.put_lock
        lock.acquire()
        try:
            if cl.closed:
                cl.refuse_closed()
            after_put = cl.after_put
            ts = self._clock()
            cl.put_cells[LOCK_BEGIN] = ts
        except BaseException:
            lock.release()
            raise
        return after_put, ts, cl.topic_queue_table

    def __exit__(self, *exc):
        self._cl.put_cells[LOCK_BEGIN] = 0
        self._lock.release()
        return False


class CommitLog:
    def __init__(self, root, config, kernels, fs, read_only=False):
        self.config = config
        self.file_size = config.mapped_file_size_commit_log
        self._k = kernels
        self.read_only = read_only
        self.allocator = None
        self.pool = None
        if not read_only:
            if config.effective_transient_store_pool_enable:
                self.pool = TransientStorePool(config.transient_store_pool_size, self.file_size)
            # A slave's CommitLog is written by the HA client with pwrite (ha/slave.py), which
            # takes page-cache pages without zero-filling them: populating them ahead would
            # zero every page once more, on the other core, for nothing (doc/05 §4). Its files
            # are still created and reserved ahead.
            prefault = ((config.prefault_next_file or config.warm_maped_file_enable)
                        and config.broker_role is not BrokerRole.SLAVE)
            # The page cache filled ahead of the populate, and large folios, only for
            # ASYNC_FLUSH, whose flushes cover many pages at once. SYNC_FLUSH's batch rounds
            # measured no faster with the fill (doc/performance.md); and the page cache writes
            # a folio back whole, so each group commit would write the writer's 2 MiB folio
            # for a few KiB of records (16 threads of single puts: 8.4 GB written for 16 MB
            # of records, each sync 3.5x slower; doc/performance.md, "Group commits in
            # 2 MiB folios").
            bulk_flush = config.flush_disk_type is FlushDiskType.ASYNC_FLUSH
            self.allocator = AllocateMappedFileService(
                self.file_size, kernels, fs,
                prefault=prefault, fill_cache=bulk_flush, large_folios=bulk_flush,
                pool=self.pool, reserve_window=config.commit_log_reserve_window)
        # Decides what a put waits for after the lock (sync flush, replication); set by the
        # store when its services start. None: return at once (ASYNC_FLUSH).
        self.after_put = None
        # The service a put wakes (the flusher, or the committer of write buffers); set by
        # the store for ASYNC_FLUSH, where nothing waits. A put whose records end at or past
        # its `wake_from` calls its wakeup() unless its `has_notified` says one is pending
        # (ServiceThread has both).
        self.wake_on_put = None
        # Called with the reason when a reservation finds the disk full; set by the store
        # (the disk-full running flag, so later puts are refused before the lock).
        self.on_disk_full = None
        # The store's SyncLatch once it loaded: a failed sync of zeros publish_replica wrote
        # trips it.
        self.sync_latch = None
        self.mfq = MappedFileQueue(config.commitlog_dir(root), self.file_size, kernels, fs,
                                   writable=not read_only, allocator=self.allocator,
                                   reserve_window=config.commit_log_reserve_window)
        self.put_lock = threading.Lock()
        # Set under the put lock by stop_puts(): a put that gets the lock later must not
        # write, since the files are about to be committed, flushed and closed.
        self.closed = False
        self.topic_queue_table = {}        # (topic, queue_id) -> next queue offset; put_lock
        # The file replica_target last handed out and its truncation count then (put_lock):
        # publish_replica refuses bytes a cut zeroed meanwhile, even one at their start.
        self._replica_mark = None
        # beginTimeInLock, the put counters and the latency histogram (stats.py), shared
        # with the compiled put path.
        self.put_cells = new_put_cells()
        self.store_host_raw, v6 = pack_host(tuple(config.store_host))
        self._store_host_v6 = F.STOREHOSTADDRESS_V6_FLAG if v6 else 0
        self._max_body = config.max_message_size
        self._delay_levels = config.delay_levels
        self._topics = {}                  # validated topic -> UTF-8 bytes
        # topic -> writeQueueNums of its TopicConfig; set by the store (config manager). A
        # dict rebound on change, never mutated, so encode reads it without a lock.
        self.write_queue_limits = {}
        self._tls = threading.local()

    # ---- lifecycle ------------------------------------------------------------------------
    def load(self):
        self.closed = False             # a store shut down and loaded again takes puts again
        return self.mfq.load()

    def start(self):
        if self.allocator is None:
            return
        self.allocator.start()
        # The file the next put goes to, loaded or still to be made, has its window
        # populated ahead too, not only the files the allocator makes after it.
        last = self.mfq.last_file
        if last is not None and not last.is_full:
            self.allocator.adopt(last)
        elif last is not None:
            self.allocator.want(self.mfq.path_to_create(last.end_offset))
        elif self.config.broker_role is not BrokerRole.SLAVE:
            # A slave's first file is named after the master's offset, unknown until then.
            # The offset get_last_mapped_file will ask for:
            where = self.mfq.committed_where
            self.allocator.want(self.mfq.path_to_create(where - where % self.file_size))

    def stop_puts(self):
        """Refuse every later put; returns once the put holding the lock, if any, is done."""
        with self.put_lock:
            self.closed = True

    def refuse_closed(self):
        raise StoreClosedError("the store is shutting down: the put was not written")

    def shutdown(self):
        if self.allocator is not None:
            self.allocator.shutdown()

    def close(self):
        self.mfq.close()
        if self.pool is not None:
            self.pool.destroy()

    # ---- recovery (doc/03 §5) -------------------------------------------------------------
    def truncate_to(self, offset):
        """The log ends at `offset`: everything after it is dropped (later files deleted, the
        holding file's tail zeroed), and the log counts as committed and flushed up to it.
        OSError when the zeroed tail could not be synced, once the cut is done."""
        mfq = self.mfq
        mfq.flushed_where = mfq.committed_where = offset
        mfq.truncate_dirty_files(offset)

    def reset_queue_offsets(self, table):
        """Set the next queue offset of every (topic, queue_id) (recoverTopicQueueTable). No
        put may run meanwhile: recovery runs before puts start, and reset_write_offset holds
        put_lock (not reentrant) around it."""
        self.topic_queue_table = dict(table)

    @property
    def min_offset(self):
        """getMinOffset: the first file's start offset (-1 when empty)."""
        return self.mfq.get_min_offset()

    @property
    def max_offset(self):
        return self.mfq.get_max_offset()

    def roll_next_file(self, offset):
        return offset + self.file_size - offset % self.file_size

    # ---- encoding (outside the lock) -----------------------------------------------------
    @property
    def max_body(self):
        """max_message_size: the longest body a put takes."""
        return self._max_body

    def topic_bytes(self, topic):
        """`topic` as records hold it; MessageIllegalError for a name the put path refuses."""
        return self._topic_bytes(topic)

    def _topic_bytes(self, topic):
        raw = self._topics.get(topic)
        if raw is None:
            why = topic_problem(topic, F.MAX_TOPIC_LENGTH)
            if why is not None:
                raise MessageIllegalError(why)
            raw = topic.encode("utf-8")
            self._topics[topic] = raw
        return raw

    def _scratch(self, size):
        buf = getattr(self._tls, "buf", None)
        if buf is None or len(buf) < size:
            buf = bytearray(max(size, 1 << 16, 2 * (len(buf) if buf else 0)))
            self._tls.buf = buf
        return buf

    def _check_batch(self, msgs, batch_properties):
        """DefaultMessageStore#checkMessages and the batch encoder's rules (doc/01 §5)."""
        if {(m.topic, m.queue_id) for m in msgs}.__len__() > 1:
            raise MessageIllegalError("a broker batch holds one topic and queue")
        if any(m.sys_flag & F.TRANSACTION_TYPE_MASK for m in msgs):
            raise MessageIllegalError("a batch cannot hold transaction messages")
        level = batch_properties.get(PROPERTY_DELAY)
        if level and level.strip() not in ("", "0"):
            raise MessageIllegalError("a batch cannot be delayed")
        if sum(len(body_bytes(m.body)) for m in msgs) > self._max_body:
            raise MessageIllegalError(
                f"the batch's bodies exceed max_message_size ({self._max_body})")
        return properties_to_string(batch_properties)

    def _grow(self, buf, need):
        """A larger thread-local scratch holding the bytes of `buf` encoded so far."""
        new = bytearray(max(need, 2 * len(buf)))
        new[:len(buf)] = buf
        self._tls.buf = new
        return new

    def _delay_rewrite(self, msg, topic, queue_id, props):
        """4.9.x put-time rule: a DELAY level on a NOT/COMMIT message moves it to
        SCHEDULE_TOPIC_XXXX, queue level-1, keeping the real topic and queue (doc/01 §4)."""
        level = props.get(PROPERTY_DELAY)
        try:
            level = int(level) if level else 0
        except ValueError:
            raise MessageIllegalError(f"DELAY property is not a number: {level!r}") from None
        if level <= 0:
            return topic, queue_id, props
        max_level = len(self._delay_levels)
        props = dict(props)
        if level > max_level:
            level = max_level
            props[PROPERTY_DELAY] = str(level)
        props[PROPERTY_REAL_TOPIC] = topic
        props[PROPERTY_REAL_QID] = str(queue_id)
        return F.SCHEDULE_TOPIC, level - 1, props

    def encode(self, msg, out, pos, batch_props=None):
        """Validate `msg` and encode its record at out[pos:] with queue offset, physical offset
        and store time left 0 (patched under the lock). Raises MessageIllegalError."""
        if msg.__class__ is DeliveredMessage:
            return self._encode_delivered(msg, out, pos)
        topic = msg.topic
        topic_b = self._topic_bytes(topic)
        body = body_bytes(msg.body)
        if len(body) > self._max_body:
            raise MessageIllegalError(
                f"body is {len(body)} bytes; max_message_size is {self._max_body}")
        queue_id = msg.queue_id
        if not isinstance(queue_id, int) or queue_id < 0 or queue_id > 0x7FFFFFFF:
            raise MessageIllegalError(f"queue id {queue_id!r} is not a valid queue")
        limit = self.write_queue_limits.get(topic)
        if limit is not None and queue_id >= limit:
            # The broker's SendMessageProcessor rule: "request queueId[..] is illegal".
            raise MessageIllegalError(
                f"queue id {queue_id} is illegal: topic {topic} has {limit} write queues")
        if not (isinstance(msg.flag, int) and isinstance(msg.sys_flag, int)
                and isinstance(msg.born_timestamp, int) and isinstance(msg.reconsume_times, int)
                and isinstance(msg.prepared_transaction_offset, int)):
            # Here, not at the kernel: Cython's conversion truncates a float and struct's
            # takes any __index__, where cffi refuses both; every backend refuses alike.
            raise MessageIllegalError(message_problem(msg))
        sys_flag = msg.sys_flag & ~(F.BORNHOST_V6_FLAG | F.STOREHOSTADDRESS_V6_FLAG)
        tx = sys_flag & F.TRANSACTION_TYPE_MASK
        props = msg.properties
        if batch_props is not None:
            # A broker batch (MessageExtBatch, doc/01 §5): no delay rewrite, and 4.9.x appends
            # the batch's own properties string to each item's, 0x02 between when both exist.
            item = properties_to_string(props) if props else ""
            joined = item + "\x02" + batch_props if item and batch_props else item or batch_props
            props_b = joined.encode("utf-8")
        elif PROPERTY_DELAY in props and tx in (F.TRANSACTION_NOT_TYPE,
                                                F.TRANSACTION_COMMIT_TYPE):
            new_topic, queue_id, props = self._delay_rewrite(msg, topic, queue_id, props)
            if new_topic is not topic:
                topic_b = self._topic_bytes(new_topic)
                topic = new_topic
        if batch_props is None:
            props_b = properties_to_string(props).encode("utf-8") if props else b""
        if len(props_b) > F.MAX_PROPERTIES_LENGTH:
            raise MessageIllegalError(
                f"properties are {len(props_b)} bytes; at most {F.MAX_PROPERTIES_LENGTH}",
                status=PutMessageStatus.PROPERTIES_SIZE_EXCEEDED.name)
        born_raw, born_v6 = pack_host(msg.born_host)
        if msg.store_host is None:
            store_raw = self.store_host_raw
            if self._store_host_v6:
                sys_flag |= F.STOREHOSTADDRESS_V6_FLAG
        else:
            store_raw, store_v6 = pack_host(msg.store_host)
            if store_v6:
                sys_flag |= F.STOREHOSTADDRESS_V6_FLAG
        if born_v6:
            sys_flag |= F.BORNHOST_V6_FLAG
        size = self._k.msg_encode(out, pos, topic_b, body, props_b, queue_id, msg.flag, 0, 0,
                                  sys_flag, msg.born_timestamp, born_raw, 0, store_raw,
                                  msg.reconsume_times, msg.prepared_transaction_offset)
        if size + F.END_FILE_MIN_BLANK_LENGTH > self.file_size:
            raise MessageIllegalError(
                f"a {size}-byte record cannot fit a {self.file_size}-byte CommitLog file")
        e = _Encoded()
        e.size = size
        e.key = (topic, queue_id)
        e.dispatched = tx not in _NOT_DISPATCHED
        e.store_raw = store_raw
        return e

    def _encode_delivered(self, msg, out, pos):
        """A delayed message's delivery (services/schedule.py): the record messageTimeup
        builds, its properties string and hosts given as stored, no delay rewrite (its map
        has no DELAY) and no write-queue check (the store's put path has none)."""
        topic_b = self._topic_bytes(msg.topic)
        body = msg.body
        if len(body) > self._max_body:
            raise MessageIllegalError(
                f"body is {len(body)} bytes; max_message_size is {self._max_body}")
        props_b = msg.properties_string.encode("utf-8")
        if len(props_b) > F.MAX_PROPERTIES_LENGTH:
            raise MessageIllegalError(
                f"properties are {len(props_b)} bytes; at most {F.MAX_PROPERTIES_LENGTH}",
                status=PutMessageStatus.PROPERTIES_SIZE_EXCEEDED.name)
        born_raw = msg.born_host_raw
        store_raw = msg.store_host_raw
        sys_flag = msg.sys_flag & ~(F.BORNHOST_V6_FLAG | F.STOREHOSTADDRESS_V6_FLAG)
        if len(born_raw) == F.HOST_V6_LENGTH:
            sys_flag |= F.BORNHOST_V6_FLAG
        if len(store_raw) == F.HOST_V6_LENGTH:
            sys_flag |= F.STOREHOSTADDRESS_V6_FLAG
        size = self._k.msg_encode(out, pos, topic_b, body, props_b, msg.queue_id, msg.flag, 0,
                                  0, sys_flag, msg.born_timestamp, born_raw, 0, store_raw,
                                  msg.reconsume_times, 0)
        if size + F.END_FILE_MIN_BLANK_LENGTH > self.file_size:
            raise MessageIllegalError(
                f"a {size}-byte record cannot fit a {self.file_size}-byte CommitLog file")
        e = _Encoded()
        e.size = size
        e.key = (msg.topic, msg.queue_id)
        e.dispatched = (sys_flag & F.TRANSACTION_TYPE_MASK) not in _NOT_DISPATCHED
        e.store_raw = store_raw
        return e

    def _record_bound(self, msg):
        return len(body_bytes(msg.body)) + F.MAX_PROPERTIES_LENGTH + 512

    # ---- put (under the lock) -------------------------------------------------------------
    def _writable_file(self):
        files = self.mfq.files
        if files:
            mf = files[-1]
            if mf.wrote_position < self.file_size:
                return mf
        return self.mfq.get_last_mapped_file(self.mfq.committed_where)

    def _end_file(self, mf, pos):
        """Fill the rest of a file with the 8-byte blank record; the file becomes full."""
        # With a write buffer, the commit copies the whole rest of the file into the mapping.
        end = pos + F.END_FILE_MIN_BLANK_LENGTH if mf.wbuf is None else self.file_size
        if end > mf.reserved_position:
            mf.reserve(end)
        self._k.commitlog_blank(mf.write_target, pos, self.file_size - pos)
        mf.wrote_position = self.file_size
        if mf.wbuf is None:
            mf.committed_position = self.file_size

    def _reserve_ahead(self, mf, end):
        """Reserve blocks up to `end` and the window ahead (OSError when the disk refuses);
        the allocator populates the new window past `end` off this thread."""
        old, new = mf.reserve(end)
        if new > old and self.allocator is not None:
            self.allocator.populate(mf, end, end)

    def _reserve(self, mf, end):
        """For a put past refill_position: to `end` plus the blank record that may follow it,
        which must never fault either. Below reserved_position the allocator is only asked to
        refill (the put goes on into pages populated already); past it, this thread reserves
        (_reserve_ahead). None, or the reason the disk refused."""
        end += F.END_FILE_MIN_BLANK_LENGTH
        if end <= mf.reserved_position and self.allocator is not None:
            self.allocator.refill(mf, end)
            return None
        try:
            self._reserve_ahead(mf, end)
        except OSError as exc:
            return self._refusal(exc)
        return None

    def _batch_file(self, remaining):
        """The file a batch writes its next records to, reserved for as many of its
        `remaining` bytes as fit there: (file, None, None), or (None, status, reason) when no
        file can be had or the disk refuses the space (nothing was written)."""
        try:
            mf = self._writable_file()
        except OSError as exc:
            return (None, PutMessageStatus.CREATE_MAPEDFILE_FAILED,
                    f"create mapped file failed: {self._refusal(exc)}")
        end = min(mf.wrote_position + remaining, self.file_size)
        if end + F.END_FILE_MIN_BLANK_LENGTH > mf.refill_position:
            reason = self._reserve(mf, end)
            if reason is not None:
                return None, PutMessageStatus.SERVICE_NOT_AVAILABLE, reason
        return mf, None, None

    def _refusal(self, exc):
        if exc.errno == errno.ENOSPC:
            reason = f"disk full: {exc}"
            if self.on_disk_full is not None:
                self.on_disk_full(reason)
        else:
            reason = f"cannot reserve CommitLog space: {exc}"
        return reason

    def _put_locked(self, clock):
        """The put lock held for a batch put, with its preamble: the log still open, the
        after_put hook read as this put uses it, the store time taken and the lock-begin cell
        set to it (cleared on the way out, however the put ends). Entered, it gives
        (after_put, store time, topic_queue_table)."""
        return _PutLocked(self, clock)

    def _append_run(self, mf, records, qoffs, ts):
        """Append to `mf` at its write position what fits of `records` (encoded, qoffs[i]
        the queue offset of the i-th) in one commitlog_append_batch call, stamped `ts`, and
        move the file's positions past it. Returns (records appended, their bytes, the
        physical offset of the first)."""
        wpos = mf.wrote_position
        base = mf.file_from_offset + wpos
        count, nbytes = self._k.commitlog_append_batch(
            mf.write_target, wpos, self.file_size, records, qoffs, base, ts)
        if count:
            mf.wrote_position = wpos + nbytes
            if mf.wbuf is None:
                mf.committed_position = wpos + nbytes
            mf.store_timestamp = ts
        return count, nbytes, base

    def _append_all(self, view, qoffs, sizes, total, ts, phys=None, whole=False):
        """Under the put lock: append the encoded records in `view` (`sizes`, `total` bytes
        in all, qoffs[i] the queue offset of the i-th) from the write position on, one run per
        file touched, ending each file they fill with its blank record. With `phys`, each
        record's physical offset is stored there. `whole`: a broker batch (MessageExtBatch),
        which 4.9.x appends whole: when it does not fit, the blank goes where it would start
        and all of it into the next file (doc/01 §5). Returns (records written, their bytes,
        the offset they end at, status, reason); status is None when all were written."""
        n = len(sizes)
        done = rd = end = 0
        while done < n:
            mf, status, reason = self._batch_file(total - rd)
            if mf is None:
                return done, rd, end, status, reason
            wpos = mf.wrote_position
            if whole and total + F.END_FILE_MIN_BLANK_LENGTH > self.file_size - wpos:
                self._end_file(mf, wpos)
                continue
            count, nbytes, base = self._append_run(mf, view[rd:], qoffs[done:], ts)
            if count:
                if phys is not None:
                    phys[done:done + count] = base + np.concatenate(
                        ([0], np.cumsum(sizes[done:done + count - 1])))
                done += count
                rd += nbytes
                end = base + nbytes
            if done < n:
                self._end_file(mf, mf.wrote_position)
        return done, rd, end, None, None

    def put_message(self, msg, clock):
        try:
            buf = self._tls.buf
            e = self.encode(msg, buf, 0)
        except (AttributeError, KernelBoundsError):
            buf = self._scratch(self._record_bound(msg))
            e = self.encode(msg, buf, 0)
        size = e.size
        key = e.key
        with self._put_locked(clock) as (after_put, ts, table):
            try:
                files = self.mfq.files
                mf = files[-1] if files else None
                if mf is None or mf.wrote_position >= self.file_size:
                    mf = self._writable_file()
                pos = mf.wrote_position
                if size + F.END_FILE_MIN_BLANK_LENGTH > self.file_size - pos:
                    self._end_file(mf, pos)
                    mf = self._writable_file()
                    pos = mf.wrote_position
            except OSError as exc:
                # ENOSPC and friends while rolling: nothing of this message was written and
                # the blank record closing the full file is valid, so refuse and go on.
                return PutMessageResult(PutMessageStatus.CREATE_MAPEDFILE_FAILED,
                                        reason=f"create mapped file failed: "
                                               f"{self._refusal(exc)}")
            if pos + size + F.END_FILE_MIN_BLANK_LENGTH > mf.refill_position:
                reason = self._reserve(mf, pos + size)
                if reason is not None:
                    return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE,
                                            reason=reason)
            qoff = table.get(key, 0) if e.dispatched else 0
            phy = mf.file_from_offset + pos
            if mf.wbuf is None:
                self._k.commitlog_append(mf.mm, pos, buf, qoff, phy, ts)
                mf.wrote_position = mf.committed_position = pos + size
            else:
                self._k.commitlog_append(mf.wbuf, pos, buf, qoff, phy, ts)
                mf.wrote_position = pos + size
            mf.store_timestamp = ts
            if e.dispatched:
                table[key] = qoff + 1
            self._count_puts(1, size)
        status = self.finish_put(after_put, phy + size, msg)
        return PutMessageResult(status, phy, qoff, ts, size, e.store_raw)

    def put_messages(self, msgs, clock, batch_properties=None):
        """Encode every message outside the lock, then append them under one lock, in as few
        kernel calls as files touched. All are validated before anything is written.

        With `batch_properties` (a dict) the list is one broker batch (MessageExtBatch): one
        topic and queue, no transaction or delay, bodies within max_message_size together,
        and the batch's properties appended to every item's, byte for byte as 4.9.x does."""
        n = len(msgs)
        batch_props = None
        if batch_properties is not None:
            batch_props = self._check_batch(msgs, batch_properties)
        buf = self._scratch(1 << 16)
        encoded = []
        pos = 0
        encode = self.encode
        for m in msgs:
            try:
                e = encode(m, buf, pos, batch_props)
            except KernelBoundsError:
                buf = self._grow(buf, pos + self._record_bound(m))
                e = encode(m, buf, pos, batch_props)
            pos += e.size
            encoded.append(e)
        total = pos
        if batch_props is not None and total + F.END_FILE_MIN_BLANK_LENGTH > self.file_size:
            raise MessageIllegalError(
                f"the broker batch takes {total} bytes: with its end-of-file blank it does "
                f"not fit a CommitLog file of {self.file_size} bytes")
        view = memoryview(buf)[:total]
        qoffs = array.array("q", bytes(8 * n))
        sizes = np.fromiter((e.size for e in encoded), dtype=np.int64, count=n)
        phys = np.empty(n, dtype=np.int64)
        try:
            with self._put_locked(clock) as (after_put, ts, table):
                for i, e in enumerate(encoded):
                    if e.dispatched:
                        q = table.get(e.key, 0)
                        qoffs[i] = q
                        table[e.key] = q + 1
                done, rd, _, status, reason = self._append_all(
                    view, qoffs, sizes, total, ts, phys, whole=batch_props is not None)
                if status is not None:
                    # Messages not written give their queue offsets back (highest first per
                    # queue, as assigned), so the next put leaves no gap.
                    for e in reversed(encoded[done:]):
                        if e.dispatched:
                            table[e.key] -= 1
                    self._count_puts(done, rd)
                    return PutMessagesResult(
                        status, done, phys[:done],
                        np.frombuffer(qoffs, dtype=np.int64)[:done].copy(),
                        sizes[:done], ts, rd, [e.store_raw for e in encoded[:done]],
                        reason=reason)
                self._count_puts(n, total)
        finally:
            view.release()
        status = PutMessageStatus.PUT_OK
        if n:
            status = self.finish_put(after_put, int(phys[-1]) + int(sizes[-1]), msgs[-1])
        return PutMessagesResult(status, n, phys,
                                 np.frombuffer(qoffs, dtype=np.int64), sizes, ts, total,
                                 [e.store_raw for e in encoded])

    def put_encoded(self, records, sizes, keys, topics, clock):
        """Append `records`, records encoded already with queue offset, physical offset and
        store time 0 (the schedule service's delivered ones, services/schedule.py), each to its
        own queue: sizes[i] its size, keys[i] = topic index << 32 | queue id, topics[k] the
        (validated) name of topic index k. Queue offsets are taken per queue in list order,
        as put_messages takes them. Returns (status, records written, reason)."""
        n = len(sizes)
        sizes = np.asarray(sizes, dtype=np.int64)
        total = int(sizes.sum())
        uniq, inv = np.unique(keys, return_inverse=True)
        counts = np.bincount(inv, minlength=len(uniq))
        # Each record's rank within its queue: its queue offset is the queue's base + rank.
        order = np.argsort(inv, kind="stable")
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        qkeys = [(topics[int(u) >> 32], int(u) & 0xFFFFFFFF) for u in uniq.tolist()]
        view = memoryview(records)[:total]
        try:
            with self._put_locked(clock) as (after_put, ts, table):
                bases = np.array([table.get(k, 0) for k in qkeys], dtype=np.int64)
                qoffs = bases[inv] + rank
                for k, b, c in zip(qkeys, bases.tolist(), counts.tolist()):
                    table[k] = b + c
                done, rd, end, status, reason = self._append_all(view, qoffs, sizes, total, ts)
                if status is not None:
                    # What was written keeps its queue offsets; the rest gives theirs back,
                    # so the next put leaves no gap.
                    kept = np.bincount(inv[:done], minlength=len(uniq))
                    for k, b, c in zip(qkeys, bases.tolist(), kept.tolist()):
                        table[k] = b + c
                    self._count_puts(done, rd)
                    return status, done, reason
                self._count_puts(n, total)
        finally:
            view.release()
        status = PutMessageStatus.PUT_OK
        if n:
            # Delivered records carry WAIT=false (messageTimeup): no flush or replica wait.
            status = self.finish_put(after_put, end, _NO_WAIT)
        return status, n, None

    def put_batch(self, topic, queue_id, cols, clock, flag=0, born_timestamp=0,
                  born_host=("127.0.0.1", 0), written=None):
        """Put the columnar batch `cols` (batch.Columns) to one topic and queue: the records
        put_messages writes for the same Message objects, encoded by one batch_encode call per
        file touched, straight into the file at their final offsets, without the GIL.
        Everything is validated before anything is written. `written`
        (services.reput.WrittenRows, or None) receives the scan rows of the records written
        into the first file touched, made by batch_encode as it writes them."""
        topic_b = self._topic_bytes(topic)
        if type(queue_id) is not int or not 0 <= queue_id <= 0x7FFFFFFF:
            raise MessageIllegalError(f"queue id {queue_id!r} is not a valid queue")
        limit = self.write_queue_limits.get(topic)
        if limit is not None and queue_id >= limit:
            raise MessageIllegalError(
                f"queue id {queue_id} is illegal: topic {topic} has {limit} write queues")
        n = cols.n
        # The maxima first: the arrays are walked again only to name the message refused.
        var, prefix, shared, body_max, props_max, var_max = cols.record_lens()
        if body_max > self._max_body:
            max_len_check(cols.bodies.lens, self._max_body, "the body")
        if props_max > F.MAX_PROPERTIES_LENGTH:
            max_len_check(cols.props_lens, F.MAX_PROPERTIES_LENGTH, "the properties string",
                          PutMessageStatus.PROPERTIES_SIZE_EXCEEDED.name)
        born_raw, born_v6 = pack_host(born_host)
        sys_flag = self._store_host_v6 | (F.BORNHOST_V6_FLAG if born_v6 else 0)
        empty_size = self._k.msg_size(sys_flag, 0, len(topic_b), 0)
        fixed = empty_size + shared
        if n and empty_size + var_max > self.file_size - F.END_FILE_MIN_BLANK_LENGTH:
            max_len_check(var + fixed, self.file_size - F.END_FILE_MIN_BLANK_LENGTH,
                          "the record")
        total = fixed * n + int(prefix[n])
        a, b = cols.a, cols.b
        args = (topic_b, queue_id, cols.bodies.data, cols.bodies.off,
                None if a is None else a.data, None if a is None else a.off,
                None if b is None else b.data, None if b is None else b.off,
                cols.frags, cols.frag_off)
        # Each record's offset and length, set by the encode as it writes it: no arithmetic
        # over the batch here (numpy's would also release the GIL for every large batch).
        phys = np.empty(n, dtype=np.int64)
        sizes = np.empty(n, dtype=np.int64)
        rows = None
        if written is not None and n:
            rows = written.rows
            if rows is None or len(rows) < n:
                rows = written.rows = np.empty(max(n, 1024), dtype=F.SCAN_DTYPE)
        key = (topic, queue_id)
        with self._put_locked(clock) as (after_put, ts, table):
            qbase = table.get(key, 0)
            done = rd = 0
            while done < n:
                mf, status, reason = self._batch_file(total - rd)
                if mf is None:
                    # What was written keeps its queue offsets; the rest takes none.
                    table[key] = qbase + done
                    self._count_puts(done, rd)
                    return PutMessagesResult(
                        status, done, phys[:done],
                        np.arange(qbase, qbase + done, dtype=np.int64), sizes[:done], ts,
                        rd, self.store_host_raw, reason=reason)
                wpos = mf.wrote_position
                base = mf.file_from_offset + wpos
                count, nbytes = self._k.batch_encode(
                    mf.write_target, wpos, self.file_size, *args, done, n, flag, sys_flag,
                    born_timestamp, born_raw, ts, self.store_host_raw, qbase + done, base,
                    flags_or=cols.flags_or, rows=rows, tags_col=cols.tags_col,
                    phys=phys[done:], sizes=sizes[done:])
                if count and rows is not None:
                    written.n, written.offset, written.nbytes = count, base, nbytes
                    rows = None             # rows describe one file only
                if count:
                    mf.wrote_position = wpos + nbytes
                    if mf.wbuf is None:
                        mf.committed_position = wpos + nbytes
                    mf.store_timestamp = ts
                    done += count
                    rd += nbytes
                if done < n:
                    self._end_file(mf, mf.wrote_position)
            if n:       # an empty batch leaves no queue behind, as put_messages([]) does
                table[key] = qbase + n
            self._count_puts(n, total)
        status = PutMessageStatus.PUT_OK
        if n:
            # after_put reads the message's WAIT property, which the batch shares: the
            # Message is built only when there is an after_put to read it.
            status = self.finish_put(after_put, int(phys[-1]) + int(sizes[-1]),
                                     None if after_put is None else
                                     Message(topic, queue_id=queue_id,
                                             properties=cols.properties))
        # One store host for the batch: its bytes, not a list of n references to them.
        return PutMessagesResult(status, n, phys, np.arange(qbase, qbase + n, dtype=np.int64),
                                 sizes, ts, total, self.store_host_raw)

    def _count_puts(self, n, nbytes):
        """Under the put lock: `n` records of `nbytes` in all were written."""
        self.put_cells[PUT_TIMES] += n
        self.put_cells[PUT_BYTES] += nbytes

    def finish_put(self, after_put, end_offset, msg):
        """What follows the lock (handleDiskFlush, handleHA): wake the flusher, then wait for
        what `after_put` waits for (sync flush, replicas). Returns the put's status."""
        wake = self.wake_on_put
        if wake is not None and end_offset >= wake.wake_from:
            wake.wakeup()
        return PutMessageStatus.PUT_OK if after_put is None else after_put(end_offset, msg)

    # ---- HA slave (doc/05 §4.1) ------------------------------------------------------------
    def replica_target(self, start_offset, size):
        """Where replicated bytes [start_offset, start_offset + size) go (CommitLog#appendData
        split in two, so the HA client can receive them straight into the mapping): the file
        to write them into at its wrote_position, reserved (and its allocator asked to
        populate ahead) for all `size` bytes. `start_offset` must be this CommitLog's max
        offset; a full last file rolls to the next one and an empty CommitLog starts with the
        file named `start_offset`, which must be a file boundary; the bytes must fit the file
        (master frames never span files). None when any of this does not hold, or the store
        is shutting down: files stay byte-identical to the master's because nothing is ever
        written out of place. OSError when the disk refuses the space."""
        with self.put_lock:
            if self.closed or not self._replica_starts_at(start_offset):
                return None
            files = self.mfq.files
            last = files[-1] if files else None
            if last is None or last.wrote_position >= self.file_size:
                mf = self.mfq.get_last_mapped_file(start_offset)
            else:
                mf = last
            end = mf.wrote_position + size
            if mf.file_from_offset + mf.wrote_position != start_offset or end > self.file_size:
                return None
            if end > mf.refill_position:
                if end <= mf.reserved_position and self.allocator is not None:
                    self.allocator.refill(mf, end)
                else:
                    self._reserve_ahead(mf, end)
            self._replica_mark = (mf, mf.truncations)
            return mf

    def _replica_starts_at(self, start_offset):
        """Whether replicated bytes may start at `start_offset` (put_lock held)."""
        files = self.mfq.files
        if not files:
            return start_offset % self.file_size == 0
        last = files[-1]
        if last.wrote_position >= self.file_size:
            return start_offset == last.end_offset
        return start_offset == last.file_from_offset + last.wrote_position

    def publish_replica(self, mf, start, pos):
        """Replicated bytes were written into `mf` at [start, pos) (by the HA client, through
        replica_target's file, at the wrote_position it had): make them readable. False, with
        nothing published, once the store is shutting down, or when the CommitLog no longer
        ends there: a reset_write_offset cut it (or destroyed `mf`) while the bytes arrived.
        A cut at `start` itself moves no position but zeroes the bytes already written: it
        is told by `mf`'s truncation count, changed since replica_target handed `mf` out.
        What they left past the write position is zeroed again, as the cut left it; when
        those zeros fail to sync, the store fails stop as at the cut's own (SyncLatch)."""
        with self.put_lock:
            if self.closed or pos > self.file_size or not mf.is_available:
                return False
            mark = self._replica_mark
            cut = mark is not None and mark[0] is mf and mark[1] != mf.truncations
            if mf.wrote_position != start or cut:
                if mf.wrote_position < pos:
                    try:
                        mf.zero_tail(mf.wrote_position)
                    except OSError as exc:
                        latch = self.sync_latch
                        if latch is None:
                            raise
                        latch.trip(latch.COMMITLOG, exc, "of the cut under a replicated "
                                   f"frame at {mf.file_from_offset + start} ")
                return False
            mf.wrote_position = mf.committed_position = pos
        return True

    def append_data(self, start_offset, data):
        """CommitLog#appendData: append raw replicated bytes that begin at `start_offset`
        (rules as replica_target). False, with nothing written, when they do not belong
        there."""
        n = len(data)
        if n == 0:
            with self.put_lock:
                return not self.closed and self._replica_starts_at(start_offset)
        mf = self.replica_target(start_offset, n)
        if mf is None:
            return False
        pos = mf.wrote_position
        mf.write_target[pos:pos + n] = data
        return self.publish_replica(mf, pos, pos + n)

    # ---- reads ------------------------------------------------------------------------------
    def get_data(self, offset, size):
        """`size` bytes at `offset` (a copy), or None if not readable."""
        mf = self.mfq.find_by_offset(offset, offset == 0)
        if mf is None:
            return None
        try:
            return mf.copy(offset - mf.file_from_offset, size)
        except ValueError:        # unmapped by cleaning meanwhile
            return None

    @contextlib.contextmanager
    def held_slice(self, offset, max_size):
        """A view of the readable bytes from `offset`, at most `max_size` and never past its
        file's end, with the file held so cleaning cannot unmap it while the view is in use
        (the HA writer sends frames straight from the mapping, doc/05 §3.3). Yields None when
        nothing is readable at `offset`. Release the view before the block ends."""
        mf = self.mfq.find_by_offset(offset)
        if mf is None or not mf.hold():
            yield None
            return
        try:
            rel = offset - mf.file_from_offset
            end = mf.read_position
            if not 0 <= rel < end:
                view = None
            else:
                try:
                    whole = memoryview(mf.mm)
                except ValueError:        # unmapped by cleaning meanwhile
                    view = None
                else:
                    with whole:
                        view = whole[rel:rel + min(end - rel, max_size)]
            if view is None:
                yield None
            else:
                with view:
                    yield view
        finally:
            mf.release()

    def get_message_bytes(self, offset):
        """The whole record at `offset` (size read from its first 4 bytes), or None."""
        head = self.get_data(offset, 4)
        if head is None:
            return None
        size = _I32.unpack(head)[0]
        if size <= 0:
            return None
        return self.get_data(offset, size)

    def pickup_store_timestamp(self, offset, size):
        rec = self.get_data(offset, min(size, 128))
        if rec is None:
            return -1
        try:
            return F.store_timestamp_at(rec)
        except struct.error:      # `size` too short to reach the STORETIMESTAMP its SYSFLAG places
            return -1

    def flush(self, least_pages=0):
        return self.mfq.flush(least_pages)
