# SPDX-License-Identifier: Apache-2.0
"""Flush services (doc/03 §2): CommitLog async flush and ConsumeQueue flush + checkpoint,
and the latch that stops them all at the first failed sync."""
import logging
import threading
import time

from ..clock import monotonic_ms, monotonic_ns
from ..format import OS_PAGE_SIZE
from ..mapped_file_queue import FlushPlan
from .base import ServiceThread

log = logging.getLogger(__name__)


class SyncLatch:
    """Fail-stop at the first failed sync of a kind of file (our policy; the broker logs and
    counts the range flushed). Linux reports a failed write-back once, to the next
    msync/fsync/syncfs, and marks the pages clean (some file systems drop them): a second
    sync of the same range succeeds with the bytes never on disk ("fsyncgate"; PostgreSQL
    12+ panics). So nothing is synced again to count as durable in this process: the
    flushers stop at what synced, puts are refused by a running-flags bit, the checkpoint
    never vouches past the failure, and shutdown keeps the abort file, so the next open
    recovers abnormally and CRC-checks (and truncates) what never reached the disk.

    Kinds: COMMITLOG (the flushers; SYNC_FAILED_BIT), CONSUME_QUEUE (WRITE_LOGICS_QUEUE_ERROR,
    logicsMsgTimestamp held), INDEX (WRITE_INDEX_FILE_ERROR, indexMsgTimestamp held) and
    CHECKPOINT (SYNC_FAILED_BIT). Any thread; `tripped` is read without a lock."""

    COMMITLOG, CONSUME_QUEUE, INDEX, CHECKPOINT = "CommitLog", "ConsumeQueue", "index", \
        "checkpoint"
    _HELD = {COMMITLOG: "physic_msg_timestamp", CONSUME_QUEUE: "logics_msg_timestamp",
             INDEX: "index_msg_timestamp"}
    _STOPS = {COMMITLOG: "the flushed offset stays where the last good sync left it and "
                         "waiting SYNC_FLUSH puts answer FLUSH_DISK_TIMEOUT",
              CONSUME_QUEUE: "no ConsumeQueue is flushed again, logicsMsgTimestamp is held",
              INDEX: "no index file is flushed again, indexMsgTimestamp is held",
              CHECKPOINT: "the checkpoint file may keep an older version"}

    def __init__(self, running_flags, checkpoint):
        """Sets `running_flags` bits and holds `checkpoint`'s times back."""
        self._flags = running_flags
        self._checkpoint = checkpoint
        self._lock = threading.Lock()
        self.failures = {}              # kind -> what failed first (logs, stat, tests)

    @property
    def tripped(self):
        """Whether any sync failed: the store must be reopened (abnormal recovery)."""
        return bool(self.failures)

    def failed(self, kind):
        return kind in self.failures

    def trip(self, kind, exc, what="", held_ts=None):
        """A sync of `kind`'s files failed with `exc` (`what`: the range, for the log). Its
        checkpoint time stays at `held_ts` (default: its value now, which only successful
        flushes moved) for the rest of the process. True the first time for `kind`."""
        with self._lock:
            if kind in self.failures:
                return False
            self.failures[kind] = f"{kind} sync {what}failed: {exc}"
            field = self._HELD.get(kind)
            if field is not None:
                self._checkpoint.hold(field, held_ts)
            flags = self._flags
            if kind == self.CONSUME_QUEUE:
                flags.make_logics_queue_error()
            elif kind == self.INDEX:
                flags.make_index_file_error()
            else:
                flags.make_sync_failed()
        log.error("%s; fail-stop, as a later sync could report success with the bytes lost: "
                  "%s, new puts are refused, and shutdown keeps the abort file; reopen the "
                  "store to recover from what reached the disk", self.failures[kind],
                  self._STOPS[kind])
        return True

    def flush_commitlog(self, mfq, flush, *args):
        """Run `flush(*args)`, a flush of the CommitLog's files (`mfq`), unless a CommitLog
        sync failed before; True if it ran and succeeded. A failure trips COMMITLOG: the
        flushed offset stays where the last good sync left it."""
        if self.failed(self.COMMITLOG):
            return False
        try:
            flush(*args)
        except OSError as exc:
            self.trip(self.COMMITLOG, exc, f"from {mfq.flushed_where} ")
            return False
        return True


class FlushRealTimeService(ServiceThread):
    """ASYNC_FLUSH: every flush_interval_commit_log ms, flush if at least
    flush_commit_log_least_pages pages are dirty; everything every thorough interval. Timed
    (flush_commit_log_timed, the default), a write that leaves WRITE_BEHIND bytes unflushed
    ends the interval early (doc/03 §2.3)."""

    name = "FlushRealTimeService"
    # Timed, the flusher slept its interval whatever came: a writer at 1.2-1.5 GB/s left
    # hundreds of MB dirty a round for the kernel's background writeback, which held the
    # ConsumeQueue and index folios the writer appends to locked for 100-200 ms while the
    # disk's writeback throttling kept it waiting: 0-9 puts over 50 ms a 60 s run. Woken at
    # this backlog, each round written back before its msyncs (write_behind): none in five
    # runs (doc/performance.md, "The device's queue behind those folios").
    WRITE_BEHIND = 16 << 20

    def __init__(self, config, mfq, checkpoint, latch):
        """Flushes the CommitLog's files (`mfq`); the checkpoint's physicMsgTimestamp follows.
        A failed sync trips `latch` (SyncLatch), and nothing is flushed after it."""
        super().__init__()
        self._config = config
        self._mfq = mfq
        self._checkpoint = checkpoint
        self._latch = latch
        self._last_flush = 0
        # One flusher at a time: this thread, or MessageStore.flush / reset_write_offset.
        self.flush_lock = threading.Lock()
        self._note_flushed()

    def _note_flushed(self):
        """Puts wake this thread (CommitLog.wake_on_put) only once the CommitLog's end is far
        enough past the flushed offset: without flush_commit_log_timed, at
        flush_commit_log_least_pages pages, where a round can write (MappedFile's
        isAbleToFlush; 4.9.8 wakes it on every put, and each round that finds less costs a
        thread switch and the GIL here); timed, at WRITE_BEHIND bytes (doc/03 §2.3). The
        thorough flush, and whatever a stale mark misses (another flusher moved the offset, a
        cut CommitLog), wait for the interval."""
        flushed = self._mfq.flushed_where
        if self._config.flush_commit_log_timed:
            behind = self.WRITE_BEHIND
        else:
            behind = max(0, self._config.flush_commit_log_least_pages) * OS_PAGE_SIZE
        self.wake_from = flushed - flushed % OS_PAGE_SIZE + behind

    def wake_for(self, end):
        """Wake this thread if the CommitLog's bytes up to `end` are written (committed, with
        write buffers) past its mark (wake_from)."""
        if not self.has_notified and end >= self.wake_from:
            self.wakeup()

    def run_once(self):
        cfg = self._config
        least = cfg.flush_commit_log_least_pages
        now = monotonic_ms()
        if now >= self._last_flush + cfg.flush_commit_log_thorough_interval:
            self._last_flush = now
            least = 0
        self.wait_for_running(cfg.flush_interval_commit_log)
        if self.is_stopped:
            return
        mfq = self._mfq
        try:
            with self.flush_lock:
                # Each round's pages written back before its msyncs (MappedFile.flush): the
                # msyncs alone wrote, waited for and cache-flushed each 16 MiB chunk in turn,
                # and fell behind a writer faster than about 1 GB/s.
                if not self.run_flush(mfq.flush_round, least, True):
                    return
        finally:
            self._note_flushed()
        if mfq.store_timestamp > 0:
            self._checkpoint.physic_msg_timestamp = mfq.store_timestamp

    def run_flush(self, flush, *args):
        """Under flush_lock: SyncLatch.flush_commitlog of `flush(*args)`."""
        return self._latch.flush_commitlog(self._mfq, flush, *args)

    def flush_all(self):
        """Full flushes until nothing moves, one file per call, so every file written so far
        is covered; these do not refresh physicMsgTimestamp. Any thread. False if a sync
        failed (now or before): the flushed offset says what is durable."""
        with self.flush_lock:
            return self.run_flush(self._mfq.flush_through)

    def on_shutdown(self):
        # The broker's thread ends on a last in-loop flush, so its checkpoint keeps the store
        # time of whichever thorough flush ran last: 0 when shutdown came before the first,
        # which sends the next abnormal recovery back to the first file. Everything is flushed
        # here, so the last record's store time is exact, and the same on every run.
        if self.flush_all() and self._mfq.store_timestamp > 0:
            self._checkpoint.physic_msg_timestamp = self._mfq.store_timestamp


_RUNNING, _DONE = 0, 1


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH group commit without a flusher thread in the way: a put waits until the
    flushed offset passes its record's end (doc/03 §2.2), and the waiting puts do the syncs.

    A put whose bytes no running sync covers starts one itself, in its own thread (the sync
    kernels run without the GIL), covering everything written since the last sync began,
    whoever wrote it: puts and batches from concurrent producers share it. A put that a running
    sync covers follows: it sleeps on a lock of its own, released by the sync that made its
    bytes durable, so a sync wakes exactly the puts it served (no notify_all convoy).

    Before it starts a sync, a put gathers: while a producer that waited in one of the last two
    syncs is not waiting now (it was just woken, and is writing its next put), the would-be
    leader sleeps, without the GIL, until the last of them arrives, or for at most the recent
    mean sync time (and never past its own timeout). Puts arriving meanwhile follow it: its
    sync covers them. A put runs under the GIL in one piece, so "a producer is mid-put" is seen
    as "it is not back in its wait yet": MySQL's binlog group commit delay, driven by the
    producers it waits for rather than a fixed timer. A lone producer never gathers, nor does a
    leader whose sync would already cover GATHER_BYTES (below). Every
    sync costs its own write-protect faults, TLB shootdowns, I/O submissions and wake-ups, CPU
    that the puts need. Measured with bench_durability on a loaded 2-core machine (ext4),
    interleaved runs: 16 threads putting ran 12-15.6 messages per sync against 4.3-4.8 with
    two syncs at once and no gathering, and 1.3x the puts per second (0.79x against 0.59x the
    same runs' per-thread pwrite + fdatasync, means of 4 and 8 runs); gathering with two
    syncs at once ran no better than with one. 4 producers of batches ran 2.5-3.8 batches per
    sync against 1.3-1.4.

    MAX_SYNCS syncs of consecutive ranges may run at once (with MAX_SYNCS > 1 the disk has one
    to work on while the puts a finished sync served wake up). The flushed offset is the end of
    the longest prefix of ranges whose syncs finished; a put is acknowledged only once it is
    inside that prefix. A put that finds MAX_SYNCS running waits, and the first sync to finish
    hands its slot to the waiting put with the lowest offset that no sync covers.

    The thread starts a sync every 10 ms, or on wakeup(), when something is unflushed: for
    puts that do not wait (WAIT=false) and a slave's appends, as 4.9.x's GroupCommitService
    flushes with no request pending. Unlike it, once it found nothing to sync for
    IDLE_AFTER_MS it looks only every IDLE_WAIT_MS: both of those wake it (a WAIT=false put
    calls wakeup(), and so does the store after each frame its HA client appends), and
    waiting puts sync for themselves. Idle, it made 98 wake-ups and used 9 ms of CPU a
    second. A failed sync is never retried (SyncLatch): the flushed offset stays before its
    range for good, every wait ends (FLUSH_DISK_TIMEOUT) and no sync starts again. Its final
    sync at shutdown ends every wait.

    A put answers PUT_OK only if its bytes were flushed within its timeout: a put whose own
    sync outlasted the timeout answers FLUSH_DISK_TIMEOUT like its followers, once the sync
    returns (msync cannot be interrupted)."""

    name = "GroupCommitService"
    MAX_SYNCS = 1
    # A leader gathers only while less than this is waiting to be synced up to its own record.
    # A sync's time is a fixed cost plus its bytes (ext4 on the 2-core VM, fdatasync of a
    # fallocated file: 0.22 ms for 4 KiB, 0.29 ms for 64 KiB, 0.32 ms for 256 KiB, 0.63 ms for
    # 1 MiB): gathering amortises the fixed cost over small puts, and past about this much
    # it only keeps the producers it waits for from putting while the disk works. Measured
    # with bench_durability's round (4 producers, 5 batches of 1 000 messages each, about
    # 250 KB a batch) on two stores in one process, rounds alternated, 20 each, three runs:
    # median round 13.3-14.7 ms with the bound against 14.3-15.7 ms without (2.0 against
    # 3.7-3.8 batches a sync). 16 threads of single puts leave a few KiB a sync, far below.
    GATHER_BYTES = 128 * 1024
    # The thread's look for something to sync: every POLL_MS, or every IDLE_WAIT_MS once
    # there was nothing for IDLE_AFTER_MS (see the class).
    POLL_MS = 10
    IDLE_AFTER_MS = 100
    IDLE_WAIT_MS = 1000

    def __init__(self, mfq, checkpoint, latch):
        """Syncs the CommitLog's files (`mfq`); the checkpoint's physicMsgTimestamp follows.
        A failed sync trips `latch` (SyncLatch)."""
        super().__init__()
        self._mfq = mfq
        self._checkpoint = checkpoint
        self._latch = latch
        self._lock = threading.Lock()
        # All under _lock; _flushed is also read without it (a stale value only delays).
        self._flushed = self._mfq.flushed_where     # durable: end of the finished prefix
        self._started = self._flushed               # end of the last range claimed
        self._ranges = []         # claimed, in offset order: [start, end, store ts, state]
        self._running = 0         # syncs running
        self._broken = False      # a sync failed: nothing counts as durable any more
        self._waiters = []        # waits (see wait_flushed) sleeping until woken
        self._final_flush_done = False
        self._busy_ms = monotonic_ms()  # when the thread last found something to sync
        self.syncs = 0            # ranges synced (benchmarks report puts per sync)
        # Gathering, all under _lock: waits not yet served; the threads that waited since
        # the last claim and in the claim before it (producers); how many those were at the
        # last claim; the lock a gathering leader sleeps on; the recent mean sync time.
        self._unserved = 0
        self._seen = set()
        self._seen_before = set()
        self._producers = 0
        self._gatherer = None
        self._sync_ns = 0
        self.gather_bytes = self.GATHER_BYTES     # settable (tests)

    # ---- puts ---------------------------------------------------------------------------
    def wait_flushed(self, offset, timeout_ms):
        """Block until `offset` is durable; False after `timeout_ms` (FLUSH_DISK_TIMEOUT)."""
        if self._flushed >= offset:
            return True
        # Nanoseconds: a millisecond clock would let a wait end up to 1 ms early, and a put
        # whose sync outlasted its timeout by less than that would be told it did not.
        deadline = monotonic_ns() + timeout_ms * 1_000_000
        # This wait: [end offset, lock released when woken, not yet served].
        me = [offset, None, True]
        with self._lock:
            self._unserved += 1
            self._seen.add(threading.get_ident())
            g = self._gatherer
            if g is not None and self._unserved >= self._producers:
                self._gatherer = None       # the last producer the leader waited for
                g.release()
        try:
            return self._wait(me, deadline)
        finally:
            if me[2]:
                with self._lock:
                    self._served(me)

    def _wait(self, me, deadline):
        offset = me[0]
        lock = self._lock
        gathered = False
        while True:
            with lock:
                if me[1] is not None:
                    if me in self._waiters:
                        self._waiters.remove(me)        # timed out, not woken
                    me[1] = None
                if self._flushed >= offset:
                    return monotonic_ns() <= deadline
                if self._final_flush_done or self._broken:
                    # Not is_stopped: the final sync still serves a put written before
                    # shutdown, so only its completion ends the wait early.
                    return False
                now = monotonic_ns()
                r = None
                if self._gatherer is not None:
                    pass                # a put gathers: its sync covers this one; follow it
                elif self._started < offset:
                    if (not gathered and self._running < self.MAX_SYNCS
                            and self._unserved < self._producers
                            and offset - self._flushed < self.gather_bytes):
                        gathered = True
                        r = self._gatherer = threading.Lock()
                        r.acquire()
                    else:
                        r = self._claim()
                if r is None:
                    remaining = deadline - now
                    if remaining <= 0:
                        return False
                    me[1] = threading.Lock()
                    me[1].acquire()
                    self._waiters.append(me)
            if r is None:
                if me[1].acquire(True, remaining / 1e9) and self._flushed >= offset:
                    # Woken by the sync that served it, which took it off _waiters: no need
                    # for the lock again (16 threads contending for it cost thread switches).
                    return monotonic_ns() <= deadline
                continue
            if type(r) is not list:
                # Gathering: released by the last producer to arrive, else the bound ends it.
                wait = min(self._sync_ns, deadline - monotonic_ns())
                if wait > 0:
                    r.acquire(True, wait / 1e9)
                with lock:
                    if self._gatherer is r:
                        self._gatherer = None
                continue
            self._sync_claimed(r)

    def _served(self, me):
        """Under _lock: the wait `me` is served (or ends): it no longer counts as a producer
        waiting, so a leader gathering waits for it to come back."""
        if me[2]:
            me[2] = False
            self._unserved -= 1

    def restart_from(self, offset):
        """The CommitLog was cut back to `offset` (MessageStore.reset_write_offset), with
        everything before it synced and no put running: the next range starts there."""
        with self._lock:
            if self._ranges or self._running:
                raise RuntimeError("a sync is running: the CommitLog cannot be cut back now")
            self._flushed = self._started = offset

    # ---- syncs --------------------------------------------------------------------------
    def _claim(self):
        """Under _lock: a range to sync now, everything written since the last claim, or None
        (MAX_SYNCS running, nothing new, a sync failed)."""
        if self._running >= self.MAX_SYNCS or self._broken:
            return None
        mfq = self._mfq
        if not self._ranges and mfq.flushed_where != self._flushed:
            # Something else moved the CommitLog's flushed offset (it was emptied): start over
            # from it.
            self._flushed = self._started = mfq.flushed_where
        files = mfq.files
        if not files:
            return None
        last = files[-1]
        # The store time first: the record carrying it is written (its position set) before
        # the time is, so the range read next covers it, as MappedFileQueue.flush reads it.
        ts = last.store_timestamp
        end = last.file_from_offset + last.read_position
        if end <= self._started:
            return None
        r = [self._started, end, ts, _RUNNING]
        self._started = end
        # The producers a later leader gathers: whoever waited since this claim's predecessor
        # or the one before (a producer served by the running sync is not waiting meanwhile).
        self._producers = len(self._seen | self._seen_before)
        self._seen_before = self._seen
        self._seen = set()
        self._ranges.append(r)
        self._running += 1
        return r

    def _sync_claimed(self, r):
        """Sync the claimed range `r`, then account for it; True if the sync succeeded."""
        ok = False
        try:
            t0 = monotonic_ns()
            self._sync(r[0], r[1])
            # The gathering bound: the mean sync time, most weight on the last eight.
            self._sync_ns += (monotonic_ns() - t0 - self._sync_ns) // 8
            ok = True
        except Exception as exc:    # EIO and the like: fail-stop, the puts waiting give up
            latch = self._latch
            latch.trip(latch.COMMITLOG, exc, f"of [{r[0]}, {r[1]}) ")
        finally:
            with self._lock:
                woken = self._finish(r, ok)
            # Outside the lock: each release may be a system call waking a thread.
            for w in woken:
                w.release()
        return ok

    def _sync(self, start, end):
        mfq = self._mfq
        size = mfq.file_size
        pos = start
        while pos < end:
            f = mfq.find_by_offset(pos)
            if f is None:
                first = mfq.first_file
                if first is not None and pos < first.file_from_offset:
                    pos = first.file_from_offset        # cleaned away: nothing to sync
                    continue
                return
            stop = min(end, f.file_from_offset + size)
            f.sync(pos - f.file_from_offset, stop - f.file_from_offset)
            pos = stop

    def _finish(self, r, ok):
        """Under _lock: a sync ended. Advance the flushed offset over the finished prefix, and
        return the locks to release (after _lock): those of the puts it covers, and that of a
        put nothing covers, which gets the free slot."""
        self._running -= 1
        if not ok:
            # No range counts from now on, and every wait ends: each woken put finds
            # _broken and answers FLUSH_DISK_TIMEOUT.
            self._broken = True
            waiters, self._waiters = self._waiters, []
            for w in waiters:
                self._served(w)
            return [w[1] for w in waiters]
        else:
            r[3] = _DONE
            self.syncs += 1
            ranges = self._ranges
            n = 0
            while n < len(ranges) and ranges[n][3] == _DONE:
                n += 1
            if n:
                last = ranges[n - 1]
                del ranges[:n]
                self._publish(last[1], last[2])
        waiters = self._waiters
        if not waiters:
            return ()
        flushed = self._flushed
        started = self._started
        rest = []
        woken = []
        lead = None
        for w in waiters:
            if w[0] <= flushed:
                woken.append(w[1])
                self._served(w)
                continue
            rest.append(w)
            if w[0] > started and (lead is None or w[0] < lead[0]):
                lead = w
        if lead is not None and self._running < self.MAX_SYNCS:
            rest.remove(lead)
            woken.append(lead[1])       # it claims the next range (or retries a failed one)
        self._waiters = rest
        return woken

    def _publish(self, flushed, ts):
        """Under _lock: [.., flushed) is durable. The queue's and files' flushed positions and
        the checkpoint's physicMsgTimestamp follow, as MappedFileQueue.flush(0) leaves them."""
        self._mfq.mark_flushed(flushed, ts)
        if ts > 0:
            self._checkpoint.physic_msg_timestamp = ts
        self._flushed = flushed

    # ---- what tests and benchmarks read -------------------------------------------------
    @property
    def running(self):
        """Syncs running now."""
        return self._running

    @property
    def waiting(self):
        """Puts asleep until a sync covers them."""
        return len(self._waiters)

    @property
    def producers(self):
        """Threads that waited in the last two claims: whom a leader gathers."""
        return self._producers

    @property
    def gathering(self):
        """Whether a leader is gathering now."""
        return self._gatherer is not None

    @property
    def gather_ns(self):
        """The gathering bound: the recent mean sync time (settable)."""
        return self._sync_ns

    @gather_ns.setter
    def gather_ns(self, ns):
        self._sync_ns = ns

    # ---- the thread ---------------------------------------------------------------------
    def _poll_ms(self):
        """How long the thread waits for a wakeup before it looks again (see the class)."""
        quiet = monotonic_ms() - self._busy_ms >= self.IDLE_AFTER_MS
        return self.IDLE_WAIT_MS if quiet else self.POLL_MS

    def run_once(self):
        self.wait_for_running(self._poll_ms())
        mfq = self._mfq
        if self._started >= mfq.get_max_offset() or self._broken:
            return
        self._busy_ms = monotonic_ms()
        if self._gatherer is not None:
            return              # a put gathers: it syncs within its bound, and more at once
        with self._lock:
            r = self._claim()
        if r is not None:
            self._sync_claimed(r)

    def on_shutdown(self):
        """Sync everything written (puts were stopped before), then end every wait."""
        while True:
            with self._lock:
                r = self._claim()
                idle = r is None and not self._ranges
            if r is not None:
                if not self._sync_claimed(r):
                    break                       # the disk refuses: the store keeps its abort file
            elif idle or self._broken:
                break
            else:
                time.sleep(0.001)               # a put's sync is still running
        with self._lock:
            self._final_flush_done = True
            waiters, self._waiters = self._waiters, []
        for w in waiters:
            w[1].release()


# GroupCommit.wait's answers (csrc/rs_gc.h RS_GC_*).
_GC_DONE, _GC_LEAD = 1, 2


class CompiledGroupCommitService(GroupCommitService):
    """GroupCommitService with its waits in compiled code, for a backend exporting
    GroupCommit (csrc/rs_gc.h): a put's wait releases the GIL once, and the sync that covers
    it wakes it with one futex wake, with no Python and no lock on the way (doc/03 §2.2).

    The protocol is the one above with one sync at a time: a put that finds no sync running
    leads (gathering first, as above), syncs everything written since the durable offset in
    its own thread, publishes it, and then wakes exactly the puts it covered, handing the lead
    to the lowest put still waiting. A failed sync counts nothing and closes the waits
    (SyncLatch): every wait ends, and no sync is led again. The final sync at shutdown ends
    every wait (close)."""

    MAX_SYNCS = 1
    IDLE_MS = 10            # a leader that found nothing to sync waits this long to lead again

    def __init__(self, mfq, checkpoint, kernels, latch):
        """Syncs the CommitLog's files (`mfq`) with `kernels.GroupCommit` keeping the waits;
        a failed sync trips `latch` (SyncLatch)."""
        ServiceThread.__init__(self)
        self._mfq = mfq
        self._checkpoint = checkpoint
        self._latch = latch
        self._gc = kernels.GroupCommit(mfq.flushed_where)
        self._gc.gather_bytes = self.GATHER_BYTES
        self._final_flush_done = False
        self._busy_ms = monotonic_ms()
        self.syncs = 0

    # ---- puts ---------------------------------------------------------------------------
    def wait_flushed(self, offset, timeout_ms):
        """Block until `offset` is durable; False after `timeout_ms` (FLUSH_DISK_TIMEOUT)."""
        deadline = monotonic_ns() + timeout_ms * 1_000_000
        return self.resume(offset, deadline, self._gc.wait(offset, deadline))

    def resume(self, offset, deadline, answer):
        """Go on with a wait for `offset` until `deadline` (monotonic ns) from GroupCommit.wait's
        `answer`: lead the sync it asks for. True if `offset` was durable in time."""
        gc = self._gc
        r = answer
        while True:
            if r == _GC_DONE:
                return True
            if r != _GC_LEAD:
                return False            # timed out, covered too late, shut down or failed
            moved = self._lead()
            if moved < 0:
                return False            # its sync failed: the waits are closed
            if gc.flushed >= offset:
                return monotonic_ns() <= deadline
            if moved == 0:
                # It found nothing to sync (the CommitLog was emptied): no spinning.
                left = deadline - monotonic_ns()
                if left <= 0:
                    return False
                time.sleep(min(left, self.IDLE_MS * 1_000_000) / 1e9)
            r = gc.wait(offset, deadline)

    def after_put(self, kernels, config, ok, timed_out, wait_key):
        """CommitLog.after_put for SYNC_FLUSH: the backend's compiled SyncWait, whose common
        case (woken by the sync that covered the put) runs no Python; None without one."""
        make = getattr(kernels, "SyncWait", None)
        if make is None:
            return None
        return make(self._gc, self.resume, self.wakeup, config, ok, timed_out, wait_key)

    def restart_from(self, offset):
        """The CommitLog was cut back to `offset` (MessageStore.reset_write_offset), with
        everything before it synced and no put running: the next sync starts there."""
        try:
            self._gc.reset(offset)
        except ValueError:
            raise RuntimeError("a sync is running: the CommitLog cannot be cut back now") \
                from None

    # ---- the sync -----------------------------------------------------------------------
    def _lead(self):
        """The caller leads: sync everything written since the durable offset, publish it,
        then wake the puts it covers (GroupCommit.done, without the GIL). Returns the bytes
        synced, or -1 if the sync failed."""
        gc = self._gc
        mfq = self._mfq
        start = flushed = gc.flushed
        ok = False
        took = 0
        try:
            if mfq.flushed_where != start:
                # Something else moved the CommitLog's flushed offset (it was emptied): start
                # over from it, as GroupCommitService._claim does.
                start = flushed = mfq.flushed_where
            files = mfq.files
            if files:
                last = files[-1]
                # The store time first: the record carrying it is written (its position set)
                # before the time is, so the range read next covers it.
                ts = last.store_timestamp
                end = last.file_from_offset + last.read_position
                if end > start:
                    t0 = monotonic_ns()
                    self._sync(start, end)
                    took = monotonic_ns() - t0
                    self._publish(end, ts)
                    self.syncs += 1
                    flushed = end
            ok = True
        except Exception as exc:    # EIO and the like: fail-stop
            latch = self._latch
            latch.trip(latch.COMMITLOG, exc, f"from {start} ")
            # Closed while this leader still holds the lead, so no put can lead a sync that
            # would count the lost range: every wait ends, later ones too.
            gc.close()
        finally:
            gc.done(flushed, ok, took)
        return flushed - start if ok else -1

    def _publish(self, flushed, ts):
        self._mfq.mark_flushed(flushed, ts)
        if ts > 0:
            self._checkpoint.physic_msg_timestamp = ts

    # ---- what tests and benchmarks read -------------------------------------------------
    @property
    def running(self):
        return int(self._gc.leading)

    @property
    def waiting(self):
        return self._gc.waiting

    @property
    def producers(self):
        return self._gc.producers

    @property
    def gathering(self):
        return self._gc.gathering

    @property
    def gather_ns(self):
        return self._gc.gather_ns

    @gather_ns.setter
    def gather_ns(self, ns):
        self._gc.gather_ns = ns

    @property
    def gather_bytes(self):
        """A leader gathers only while its sync would cover less than this (settable)."""
        return self._gc.gather_bytes

    @gather_bytes.setter
    def gather_bytes(self, n):
        self._gc.gather_bytes = n

    # ---- the thread ---------------------------------------------------------------------
    def run_once(self):
        self.wait_for_running(self._poll_ms())
        gc = self._gc
        if gc.flushed >= self._mfq.get_max_offset() or gc.closed:
            return
        self._busy_ms = monotonic_ms()
        if gc.try_lead():       # else a put leads (or gathers): its sync covers this
            self._lead()

    def on_shutdown(self):
        """Sync everything written (puts were stopped before), then end every wait."""
        gc = self._gc
        while True:
            if gc.try_lead():
                moved = self._lead()
                if moved <= 0:
                    break       # all synced, or the disk refuses: the store keeps its abort file
            elif gc.closed:
                break           # a sync failed: nothing is synced again
            else:
                time.sleep(0.001)               # a put's sync is still running
        self._final_flush_done = True
        gc.close()


class CommitRealTimeService(ServiceThread):
    """With a TransientStorePool: copy write buffers into the files every
    commit_interval_commit_log ms (4 pages at least, everything every thorough interval), then
    wake the flusher (doc/03 §2.4)."""

    name = "CommitRealTimeService"

    def __init__(self, config, mfq, wake_flusher=None):
        """Commits the CommitLog's write buffers (`mfq`); `wake_flusher(committed_where)` after
        each move (FlushRealTimeService.wake_for)."""
        super().__init__()
        self._config = config
        self._mfq = mfq
        self._wake_flusher = wake_flusher
        self._last_commit = 0
        # One committer at a time: this thread, or a reader wanting its own puts visible.
        self._lock = threading.Lock()

    def run_once(self):
        cfg = self._config
        least = cfg.commit_commit_log_least_pages
        now = monotonic_ms()
        if now >= self._last_commit + cfg.commit_commit_log_thorough_interval:
            least = 0
        mfq = self._mfq
        with self._lock:
            moved = not mfq.commit_round(least)
        if moved:
            self._last_commit = now
            if self._wake_flusher is not None:
                self._wake_flusher(mfq.committed_where)
        self.wait_for_running(cfg.commit_interval_commit_log)

    def _commit_all(self):
        self._mfq.commit_through()

    def commit_now(self):
        """Commit every write buffer in the caller's thread, so a read sees each put that
        returned (the readers' view of a pooled file ends at its committed position).
        Nothing once the service stopped: its final commit ran."""
        mfq = self._mfq
        if mfq.committed_where >= mfq.get_max_wrote_position():
            return
        with self._lock:
            if not self.is_stopped:
                self._commit_all()

    def on_shutdown(self):
        with self._lock:
            self._commit_all()


class FlushConsumeQueueService(ServiceThread):
    """Flush the ConsumeQueues written since the last round, each flush_interval_consume_queue
    ms, if at least flush_consume_queue_least_pages pages are dirty (every page on thorough
    rounds, and at shutdown, which also write the checkpoint file). A round costs the queues
    written, not every queue of the store: the dispatcher marks what it writes
    (`dirty_cqs`). A queue a periodic round leaves with units still due (a second file)
    stays marked for the next round; one with fewer dirty pages than the least waits for
    the thorough round, tested again before it only if written again."""

    name = "FlushConsumeQueueService"
    # A round with at least this many queues to sync syncs their file system once instead
    # (FileSystem.sync_filesystem): a sync per file costs ~1 ms on ext4 (journal commit
    # check, device cache flush), and a thorough round or a shutdown of a store with
    # 10 000 busy queues took 10-90 s. Below it, syncing the CommitLog's dirty pages with
    # the queues' would cost more than it saves.
    SYNC_TOGETHER_MIN = 64

    def __init__(self, config, checkpoint, latch, dirty_cqs, queues, flush_index=None, fs=None,
                 cq_root=None):
        """`queues`: every ConsumeQueue now; `flush_index()` flushes the index files that
        filled up (IndexService.flush_pending); `fs` and `cq_root`, the ConsumeQueues' file
        system and directory, let a round of many queues sync them together. A failed sync
        of a queue (or of the index) trips `latch` (SyncLatch): no queue (index file) is
        flushed after it, and logicsMsgTimestamp (indexMsgTimestamp) stays where the last
        good round left it."""
        super().__init__()
        self._config = config
        self._checkpoint = checkpoint
        self._latch = latch
        # What logicsMsgTimestamp may say: every queue was durable up to it (the snapshot of
        # the last thorough round that synced them all; at first what the file said when
        # the store opened, as the units recovery and reput's catch-up wrote since are not).
        self._logics_durable = checkpoint.opened_with("logics_msg_timestamp")
        self._dirty = dirty_cqs
        self._flush_index = flush_index
        self._fs = fs
        self._cq_root = cq_root
        self.synced_together = 0        # rounds that took one file-system sync (tests, stats)
        # Queues a periodic round left with fewer than the least dirty pages, for the next
        # thorough round: a periodic round looks at a queue again only once it is written.
        self._below = set()
        self._last_thorough = 0
        # What loading, recovery and reput's catch-up left unflushed: once, every queue.
        dirty_cqs.mark_all(cq for cq in queues if _unflushed(cq))

    def do_flush(self, retry_times, force=False, final=False):
        """One round: thorough (every page) when `force` or the thorough interval is due.
        `final`: the shutdown's round, after the last write, which syncs every queue left
        unflushed, one by one if need be."""
        latch = self._latch
        # Index files that filled up are flushed here, each advancing the checkpoint's
        # indexMsgTimestamp (the broker starts a thread per full file for the same job).
        if self._flush_index is not None and not latch.failed(latch.INDEX):
            try:
                self._flush_index()
            except OSError as exc:
                latch.trip(latch.INDEX, exc)
        cfg = self._config
        least = cfg.flush_consume_queue_least_pages
        now = monotonic_ms()
        snapshot = 0
        if force or now >= self._last_thorough + cfg.flush_consume_queue_thorough_interval:
            self._last_thorough = now
            least = 0
            snapshot = self._checkpoint.logics_msg_timestamp
        if not latch.failed(latch.CONSUME_QUEUE):
            failure = self._flush_queues(retry_times, least, final)
            if failure is not None:
                latch.trip(latch.CONSUME_QUEUE, failure, held_ts=self._logics_durable)
        if least == 0:
            if snapshot > 0 and not latch.failed(latch.CONSUME_QUEUE):
                self._checkpoint.logics_msg_timestamp = self._logics_durable = snapshot
            self._checkpoint.flush()

    def _flush_queues(self, retry_times, least, final=False):
        """Flush the queues written since the last round; the OSError of a sync that failed
        (the queues then stay marked), else None. Queues a file-system sync covered are not
        flushed again one by one (but for the `final` round): what was written to them
        after their plan stays marked for the next round. Syncing each of those files now
        cost a sync per queue written meanwhile, which with many busy queues is all of them
        (~1 ms each), and undid the one sync of their file system."""
        dirty = self._dirty
        left = []
        queues, same_pages = dirty.take()
        below = self._below
        if least > 0:
            # Queues with fewer than `least` dirty pages wait for the thorough round, as
            # flush(least) would leave them, and are not looked at again until then unless
            # written (the writer marks them again): only the test is paid, once. Those
            # written only within the pages they had dirtied would test as they last did
            # (DirtyQueues): they wait untested.
            below |= same_pages
            due = []
            for cq in queues:
                if cq.mfq.flush_due(least):
                    due.append(cq)
                else:
                    below.add(cq)
            queues = due
        else:
            queues |= same_pages
            queues |= below
            below.clear()
        try:
            settled = ()
            if len(queues) >= self.SYNC_TOGETHER_MIN and self._cq_root is not None:
                settled = self._sync_together(queues, least)
            for cq in queues:
                if final or cq not in settled:
                    for _ in range(retry_times):
                        if cq.flush(least):
                            break
                if _unflushed(cq):
                    # Still due (a flush takes one file a call): marked for the next round.
                    if least > 0 and not cq.mfq.flush_due(least):
                        below.add(cq)
                    else:
                        left.append(cq)
        except OSError as exc:
            dirty.mark_all(queues)
            return exc
        if left:
            dirty.mark_all(left)
        return None

    def _sync_together(self, queues, least):
        """Make what this round would flush of `queues` durable with one sync of their file
        system. Nothing changes where there is no syncfs: the round then syncs file by file.
        A failed syncfs raises: the kernel may have dropped any of the pages it reported
        lost, and a sync of each file after it could succeed without them. Returns the
        queues it settled (none when it synced nothing)."""
        plan = FlushPlan()
        # Each queue adds its files to the plan; those that added any are settled by it.
        planned = {cq for cq in queues if cq.mfq.flush_plan(plan, least)}
        if len(planned) < self.SYNC_TOGETHER_MIN:
            return ()
        if not self._fs.sync_filesystem(self._cq_root):
            return ()
        plan.settle(least)
        self.synced_together += 1
        return planned

    def run_once(self):
        self.wait_for_running(self._config.flush_interval_consume_queue)
        if not self.is_stopped:
            self.do_flush(1)

    def on_shutdown(self):
        self.do_flush(3, force=True, final=True)


def _unflushed(cq):
    mfq = cq.mfq
    return mfq.flushed_where < mfq.get_max_offset()
