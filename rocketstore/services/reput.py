# SPDX-License-Identifier: Apache-2.0
"""ReputMessageService: tails the CommitLog and feeds every dispatcher (doc/03 §8)."""
import functools
import logging
import threading
import time

import numpy as np

from .. import format as F
from ..dispatch import ConsumeQueueDispatcher, dispatch_all
from ..index_service import IndexService
from ..mapped_file import MappedFile
from .base import ServiceThread

log = logging.getLogger(__name__)


class WrittenRows:
    """The scan rows (format.SCAN_DTYPE) a batch put made of the records it wrote into one
    CommitLog file: rows[:n] describe the records at CommitLog offsets [offset, offset +
    nbytes), exactly as commitlog_scan would (kernels' batch_encode `rows`, PutPath.put_list
    `written`). One per putting thread, reused: the put's inline dispatch takes them instead
    of scanning those records again (ReputMessageService.dispatch_if_behind). `cuts`: the
    service's count of CommitLog cuts when the put began (MessageStore.reset_write_offset):
    rows made before a cut may describe records it removed and others then wrote over."""
    __slots__ = ("rows", "n", "offset", "nbytes", "cuts")

    def __init__(self):
        self.rows = None
        self.n = self.offset = self.nbytes = self.cuts = 0


class ReputMessageService(ServiceThread):
    """Dispatches the CommitLog's records from `reput_from_offset` on to `dispatchers` (the
    store's list), then wakes the consumers waiting in `arrivals`. `running_flags` takes the
    logic-queue error after repeated dispatch failures. On a slave (`is_slave`), bytes the
    master sent that cannot be records go to `halt_replication(reason)` once the store set it
    (HAClient.halt), else they are logged.

    Like the broker's, the thread looks for new records every millisecond. Unlike it, it
    stops looking once the store is idle: when the CommitLog's written end has not moved for
    IDLE_AFTER_MS and dispatch stands at it, it calls `on_idle(True)` (the store then makes
    every put wake it, as while a consumer waits) and sleeps up to IDLE_WAIT_MS; the first
    record written after that wakes it, and `on_idle(False)` gives puts their plain hook
    back. An idle store's reput made about 900 wake-ups and 30 ms of CPU a second
    (doc/performance.md, "An idle store"). Readers in this process never depend on the
    cycle: every read catches up first (MessageStore.catch_up)."""

    name = "ReputMessageService"
    BATCH = 4096   # rows per kernel call

    def __init__(self, commitlog, kernels, dispatchers, reput_from_offset, *, arrivals,
                 running_flags, is_slave=False, halt_replication=None, on_idle=None):
        super().__init__()
        self._commitlog = commitlog
        self._k = kernels
        self._dispatchers = dispatchers
        self._arrivals = arrivals
        self._running_flags = running_flags
        self._is_slave = is_slave
        self.halt_replication = halt_replication
        self.reput_from_offset = reput_from_offset    # written by the reput thread only
        # CommitLog cuts so far (MessageStore.reset_write_offset, under dispatch_lock): a
        # put's rows from before one are never taken (WrittenRows.cuts).
        self.cuts = 0
        self._rows = np.empty(self.BATCH, dtype=F.SCAN_DTYPE)
        self._k_fused = getattr(kernels, "reput_dispatch", None)
        # A put's own rows (WrittenRows) dispatched in one compiled call (the backend's
        # PutDispatch, with reput_dispatch); None: puts make no rows (takes_put_rows).
        make = getattr(kernels, "PutDispatch", None)
        self._put_dispatch = (None if make is None or self._k_fused is None or is_slave else
                              make(commitlog.mfq, arrivals, MappedFile, commitlog.file_size))
        self._prev_rows = 0         # rows of the last fused pass, still in _rows
        self._failures = 0
        self.last_error = None
        self._halted = None         # why a slave stopped dispatching replicated bytes
        # Idle tracking (run_once), on this thread only: the written end last seen and since
        # when it stood still (monotonic s). `idle` is read by the store's on_idle.
        self._on_idle = on_idle
        self.idle = False
        self._seen_end = -1
        self._still_since = 0.0
        # Batch puts under way that dispatch all they write: one item each. put_begins and
        # put_ends are the list's own append and pop, each one call under the GIL, so no
        # lock and no Python frame (with a lock and two methods, the pair was a tenth of a
        # put_messages of one message).
        self._putting = []
        self.put_begins = functools.partial(self._putting.append, True)
        self.put_ends = self._putting.pop
        # One dispatcher at a time: the service thread, or a reader catching up; the store
        # also holds it while it removes a topic or truncates, so reput sees all or none.
        self.dispatch_lock = threading.Lock()

    @property
    def takes_put_rows(self):
        """Whether dispatch_if_behind takes a put's WrittenRows instead of scanning them."""
        return self._put_dispatch is not None

    def behind(self):
        return self._commitlog.max_offset - self.reput_from_offset

    # How long the thread sleeps while it stands aside for batch puts (run_once).
    STAND_ASIDE_MS = 10
    # Idle (see the class): after this long with the written end still and dispatched, the
    # thread waits for a put's wake-up, or this long at most.
    IDLE_AFTER_MS = 100
    IDLE_WAIT_MS = 1000

    def run_once(self):
        # While batch puts dispatch what they write, a wake-up each millisecond would only
        # take the GIL from them (the putting thread's GIL releases signalled it: 5 % of a
        # put_messages call, measured) to find there is nothing to do.
        self.wait_for_running(self.IDLE_WAIT_MS if self.idle else
                              self.STAND_ASIDE_MS if self._putting else 1)
        if self._putting and not self._failures:
            # A batch put that dispatches all it wrote (dispatch_in_put_lag = 0) is under
            # way: it takes the tail with the GIL it holds anyway. Taking it here instead
            # would cost GIL hand-offs on both sides, the put waiting on the dispatch lock
            # meanwhile. Whatever no such put covers is taken once none is under way.
            self._note_idle(busy=True)
            return
        with self.dispatch_lock:
            self.do_reput()
            self._settle_index()
        self._note_idle()

    def _settle_index(self):
        """The index worker's last job (a batch put's keys), finished and let go of once puts
        pause: the putter settles each job itself at its next put, but the last one would
        otherwise keep its CommitLog and index files held until a reader came."""
        parts = self._fused_parts(self._dispatchers)
        if parts is not None:
            try:
                parts[1].settle()
            except OSError as exc:
                self._failed(exc, True)

    def _note_idle(self, busy=False):
        """After a cycle: become idle once the written end (committed or still in a write
        buffer) stood still for IDLE_AFTER_MS with dispatch at it; stop being idle as soon
        as it moves, or while anything is left to dispatch or dispatch is failing."""
        if self._on_idle is None:
            return
        end = self._commitlog.mfq.get_max_wrote_position()
        now = time.monotonic()
        if busy or end != self._seen_end or self.reput_from_offset < end or self._failures:
            self._seen_end = end
            self._still_since = now
            self._set_idle(False)
        elif not self.idle and now - self._still_since >= self.IDLE_AFTER_MS / 1000:
            # The hook first, the end after: a put either wrote before the look below (and
            # is seen), or reads the hook after it changed (and wakes this thread). A put
            # that read the old hook and writes with the GIL let go (a large batch) is the
            # one case this misses: IDLE_WAIT_MS bounds it, and such puts dispatch inline.
            self._set_idle(True)
            if self._commitlog.mfq.get_max_wrote_position() != end:
                self._set_idle(False)

    def _set_idle(self, idle):
        if idle != self.idle:
            self.idle = idle
            self._on_idle(idle)

    def dispatch_if_behind(self, lag, written=None):
        """Called by a batch put in its own thread, after its records became readable: when
        this service is more than `lag` bytes behind the CommitLog, dispatch up to its end
        here, before the put returns (doc/03 §8). A starved service thread (the GIL, a
        loaded machine) so never lets the queues and index fall far behind the writer.
        `written` (WrittenRows, or None): the rows the put made of what it wrote; when
        dispatch stands exactly where they begin, they are dispatched without a scan (the
        backend's PutDispatch, which says when it cannot), then whatever follows them is
        scanned as usual. Nothing while dispatch is failing (the
        service thread retries at its pace) or once the service stopped. The put itself
        succeeded, so nothing is raised."""
        if self._failures:
            return
        # A put's rows that begin where dispatch stands are behind it by themselves: the
        # CommitLog's end need not be read for them.
        if (written is None or not written.n or written.offset != self.reput_from_offset) \
                and self._commitlog.max_offset - self.reput_from_offset <= lag:
            return
        with self.dispatch_lock:
            if self._stopped.is_set():      # is_stopped, without the property's frame
                return
            try:
                if (not self._take_put_rows(written)
                        or self.reput_from_offset < self._commitlog.max_offset):
                    self.do_reput(retry_wait=False)
            except Exception as exc:
                # A put that raised would be retried, storing its messages twice. The service
                # thread takes the tail from here on.
                log.exception("reput: dispatch in the putting thread failed")
                self._failures += 1
                self.last_error = exc

    def _take_put_rows(self, written):
        """Dispatch a put's rows `written` (dispatch_lock held) without a scan when they are
        exactly what a pass would scan next (PutDispatch says when): True then. Anything
        else -- another writer's records before them, a slave, an index pass that needs its
        own path, rows made before a CommitLog cut (the records they describe may be gone,
        others written in their place) -- is left to the scan of do_reput."""
        if written is None or not written.n or self._put_dispatch is None:
            return False
        parts = self._fused_parts(self._dispatchers)
        if parts is None:
            return False
        try:
            end = self._put_dispatch(written, self.reput_from_offset, self.cuts, self._k_fused,
                                     *parts)
        except OSError as exc:
            self._prev_rows = 0
            self._failed(exc, False)
            return False
        if end < 0:
            return False
        self._prev_rows = 0     # this pass published other queues than self._rows' pass
        self._failures = 0
        self.last_error = None
        self.reput_from_offset = end
        return True

    def catch_up(self):
        """Dispatch, in the caller's thread, what is readable in the CommitLog but not yet
        dispatched, so a put is visible to reads as soon as it returns. Nothing once the
        service stopped: its final drain ran, and the files are about to close."""
        if self.reput_from_offset >= self._commitlog.max_offset:
            return
        with self.dispatch_lock:
            if not self.is_stopped:
                self.do_reput()

    def do_reput(self, retry_wait=True):
        """Dispatch every complete record between reput_from_offset and the read position.
        `retry_wait`: after a failed dispatch, wait a second before returning (the service
        thread's pace); a put dispatching inline returns at once."""
        cl = self._commitlog
        min_offset = cl.min_offset
        if min_offset >= 0 and self.reput_from_offset < min_offset:
            log.warning("reput offset %d is below the CommitLog minimum %d: skipping ahead",
                        self.reput_from_offset, min_offset)
            self.reput_from_offset = min_offset
        dispatchers = self._dispatchers
        arrivals = self._arrivals
        rows = self._rows
        while self.reput_from_offset < cl.max_offset:
            offset = self.reput_from_offset
            mf = cl.mfq.find_by_offset(offset, offset == 0)
            if mf is None or not mf.hold():
                break
            try:
                start = offset - mf.file_from_offset
                end = mf.read_position
                if start >= end:
                    if end >= mf.file_size:
                        self.reput_from_offset = cl.roll_next_file(offset)
                        continue
                    break
                scanned = None
                parts = self._fused_parts(dispatchers)
                if parts is not None:
                    scanned = self._fused_pass(parts, mf, start, end, retry_wait)
                    if scanned is False:
                        break
                if scanned is None:
                    n, stop, reason, stop_size = self._k.commitlog_scan(mf.mm, start, end,
                                                                        False, rows)
                    if n and not self._dispatch(dispatchers, rows[:n], mf.mm, retry_wait):
                        break
                else:
                    n, stop, reason, stop_size = scanned
                self.reput_from_offset = mf.file_from_offset + stop
                if n and arrivals.waiting:
                    # The units are readable: wake the consumers waiting on their queues
                    # (the MessageArrivingListener call of the broker's reput).
                    arrivals.notify(rows[:n])
            finally:
                mf.release()
            if reason == F.SCAN_END:
                continue
            if reason == F.SCAN_BLANK:
                if self._is_slave and stop + stop_size != mf.file_size:
                    # The master's end-of-file blank says where its file ends; ours ends
                    # elsewhere, so the records after it would never be dispatched.
                    self._stop_following(
                        f"CommitLog file-size mismatch: the master's file ends "
                        f"{stop + stop_size} bytes into the file at {mf.file_from_offset}, "
                        f"this slave's files are {mf.file_size} bytes")
                    break
                self.reput_from_offset = cl.roll_next_file(self.reput_from_offset)
            elif reason == F.SCAN_MISMATCH:
                log.error("[BUG] record at %d: read total count not equals msg total size",
                          self.reput_from_offset)
                self.reput_from_offset += stop_size
            else:
                if not self._is_slave:
                    # A master's readable area holds whole records only, so this is damage:
                    # skip the rest of the file's readable area, as the broker does.
                    log.error("reput: unreadable record at %d (%s); skipping to %d",
                              self.reput_from_offset, reason, mf.file_from_offset + end)
                    self.reput_from_offset = mf.file_from_offset + end
                elif reason in (F.SCAN_CORRUPT, F.SCAN_TOPIC):
                    # Replicated bytes that are not a record: nothing after them can be
                    # trusted, and a partial record never turns into a valid one.
                    why = ("invalid topic" if reason == F.SCAN_TOPIC else
                           "bad magic, length or CRC")
                    self._stop_following(
                        f"corrupt record from the master at {self.reput_from_offset} ({why})")
                elif reason == F.SCAN_PARTIAL and end >= mf.file_size:
                    # A full file whose last record runs past its end: the master's files are
                    # larger than ours, so that record will never be complete here.
                    self._stop_following(
                        f"CommitLog file-size mismatch: the record at {self.reput_from_offset} "
                        f"runs past the end of this slave's {mf.file_size}-byte file")
                break

    def _stop_following(self, reason):
        """On a slave: stop replicating, once, with `reason` visible (HAClient.error)."""
        halt = self.halt_replication
        if halt is not None:
            halt(reason)
        elif self._halted != reason:
            log.error("reput: %s", reason)
        self._halted = reason

    def _fused_parts(self, dispatchers):
        """(ConsumeQueue dispatcher, IndexService) when they are the whole dispatcher list
        and the backend runs a pass as one compiled call (reput_dispatch); else None."""
        if self._k_fused is None or len(dispatchers) != 2:
            return None
        cqd, idx = dispatchers
        if (type(cqd) is not ConsumeQueueDispatcher or cqd.slots is None
                or type(idx) is not IndexService):
            return None
        return cqd, idx

    def _fused_pass(self, parts, mf, start, end, retry_wait):
        """Scan mf's bytes [start, end) and dispatch them with reput_dispatch: one GIL-free
        section for the common rows, and each dispatcher's own path for the rows after
        where its loop stopped. Returns the scan's (count, stop, reason, stop_size); None
        when the index needs its own path for this pass (no compiled loop, no file yet, a
        full file, a re-dispatch): the caller scans and dispatches apart; False when
        dispatch failed. (A put's own rows take the same steps in PutDispatch, without the
        scan.)"""
        cqd, idx = parts
        try:
            # Settles the index worker's job first, which may fail as a dispatch does.
            target = idx.fused_target(mf.file_from_offset + start)
        except OSError as exc:
            self._failed(exc, retry_wait)
            return False
        if target is False:
            return None
        buf = mf.mm
        rows = self._rows
        try:
            (n, stop, reason, stop_size, cq_row, last_ts, index_row, index_skip,
             _) = self._k_fused(buf, start, end, rows, self._prev_rows, cqd.slots, target)
            self._prev_rows = n
            if n:
                if last_ts:
                    cqd.dispatched_until(last_ts)
                if cq_row < n:
                    cqd.dispatch_array(rows[cq_row:n], buf)
                if target is not None and index_row < n:
                    idx.dispatch_from(rows[:n], buf, target, index_row, index_skip)
        except OSError as exc:
            self._failed(exc, retry_wait)
            return False
        self._failures = 0
        self.last_error = None
        return n, stop, reason, stop_size

    MAX_DISPATCH_FAILURES = 30      # putMessagePositionInfoWrapper's attempts

    def _dispatch(self, dispatchers, arr, buf, retry_wait=True):
        """Dispatch a batch; on an OS error (no descriptors left, no space) retry the batch a
        second later, and after 30 failures in a row mark the logic-queue error flag, which
        stops puts, as the broker does. Units already written are skipped on the retry."""
        try:
            dispatch_all(dispatchers, arr, buf)
        except OSError as exc:
            self._failed(exc, retry_wait)
            return False
        self._failures = 0
        self.last_error = None
        return True

    def _failed(self, exc, retry_wait):
        """A dispatch attempt failed with the OS error `exc`: see _dispatch."""
        self._failures += 1
        self.last_error = exc
        log.error("reput: dispatch failed (%d in a row): %s%s", self._failures, exc,
                  " -- raise the open-file limit (ulimit -n): mmap.mmap (the cffi and pure "
                  "backends) keeps a descriptor per mapped file"
                  if getattr(exc, "errno", None) == 24 else "")
        if self._failures >= self.MAX_DISPATCH_FAILURES:
            self._running_flags.make_logics_queue_error()
        if retry_wait:
            self._stopped.wait(1.0)

    @property
    def failures(self):
        """Dispatch attempts failed in a row (0 once one succeeds)."""
        return self._failures

    @property
    def failing(self):
        """The OS error that failed the last two or more dispatch attempts in a row (a full
        disk, no descriptors left), or None while dispatch works or failed only once."""
        return self.last_error if self._failures >= 2 else None

    def on_shutdown(self):
        # Drain what was written before shutdown (the broker waits up to 5 s).
        try:
            with self.dispatch_lock:
                self.do_reput()
                self._settle_index()
        except Exception:
            log.exception("reput: final drain failed")
