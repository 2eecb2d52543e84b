# SPDX-License-Identifier: Apache-2.0
"""Delayed delivery: 4.9.x's ScheduleMessageService.

A put with a DELAY level goes to SCHEDULE_TOPIC_XXXX, queue level - 1 (CommitLog's put-time
rewrite); its ConsumeQueue unit's tagsCode is the delivery time, store time + the level's
delay. This service moves each unit whose time has come to the message's REAL_TOPIC /
REAL_QID, in queue order per level, as a new record put through the store's ordinary put
path, so ConsumeQueue, index, flush and HA follow it as they follow any put.

The rules carried over from 4.9.8:

- Levels come from `message_delay_level` ("1s 5s ... 2h", units s/m/h/d).
- Each level runs its own timer: first run 1 s after start, then 100 ms after each run,
  10 s after a run that failed. (Departure: after a run that found nothing past the level's
  offset, the next is up to IDLE_WAIT_MS later, see below.)
- A unit is due when its tagsCode is not after now; a tagsCode beyond now + the level's delay
  is taken as now (correctDeliverTimestamp: abnormal recovery of a broker writes the TAGS hash
  there). The first unit not yet due ends the run.
- The delivered record is messageTimeup's: body, flag, sysFlag, born time and host, store host
  and reconsume times of the scheduled record, prepared transaction offset 0, topic and queue
  from REAL_TOPIC / REAL_QID. Its properties string is the scheduled record's properties
  parsed into a HashMap and written back in that map's order *before* DELAY is removed, so
  DELAY, REAL_TOPIC and REAL_QID stay in the stored string; the map the put path sees has no
  DELAY (no second rewrite) and WAIT=false (the put does not wait for a flush or a replica).
- Progress per level is the next queue offset to deliver, kept in config/delayOffset.json
  (ScheduleMessageService's offsetTable) and advanced only after the put succeeded: a crash
  delivers again what was delivered since the last persist, never less (at least once). On
  start an offset outside the queue is moved to its nearest end (correctDelayOffset).
- A real topic of RMQ_SYS_TRANS_HALF_TOPIC is discarded, and a unit whose record cannot be read
  is skipped, as 4.9.8 does.
- Only a master delivers (handleScheduleMessageService): a slave never starts this service.

Departures: a level whose queue holds nothing past its offset runs next after the level's
delay, at most IDLE_WAIT_MS (1 s), instead of 100 ms: a message put after that run is due at
least the delay after it, so the next run still comes by its time (late by no more than its
unit's dispatch took, where 100 ms runs were up to 100 ms late), and from then on the level
runs every 100 ms. Idle, the 100 ms runs of every level were 9-15 wake-ups and about 2 ms
of CPU a second. One thread serves every level (4.9.8 has a pool of one thread per level), each
run delivers what is due in batches under one put lock, and a record without a usable
REAL_TOPIC / REAL_QID (or whose real topic is not a valid name) is logged and skipped where
4.9.8 would retry it every 100 ms forever and deliver nothing more of that level.
"""
import logging
import re
import threading

import numpy as np

from .. import format as F
from ..clock import monotonic_ms
from ..errors import CorruptRecordError, MessageIllegalError, StoreClosedError
from ..message import (PROPERTY_DELAY, PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, PROPERTY_WAIT,
                       Message, MessageExt, hashmap_order, string_to_properties)
from ..status import PutMessageStatus
from .base import ServiceThread

log = logging.getLogger(__name__)

FIRST_DELAY_TIME_MS = 1000
DELAY_FOR_A_WHILE_MS = 100
DELAY_FOR_A_PERIOD_MS = 10_000
IDLE_WAIT_MS = 1000        # the longest wait after a run that found the level's queue empty
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
# Units read and delivered per put-lock acquisition (4.9.8 reads to the end of the CQ file
# and puts one by one; the batch keeps one lock per many records).
DELIVER_BATCH = 4096
# ... and at most about this many record bytes (records may be up to max_message_size).
DELIVER_BATCH_BYTES = 8 << 20

# rs_timeup_encode's stop reasons (csrc/rs_sched.h).
TIMEUP_DONE, TIMEUP_SLOW, TIMEUP_TOPIC, TIMEUP_FULL = 0, 1, 2, 3
# Real topics the batch path matches a record's REAL_TOPIC against, by a linear scan.
MAX_TOPICS = 256
# At most this much of a CommitLog file is copied at once to encode from.
SPAN_BYTES = 64 << 20

_JAVA_INT = re.compile(r"[+-]?[0-9]+\Z")


def delay_level_to_queue_id(level):
    return level - 1


def queue_id_to_delay_level(queue_id):
    return queue_id + 1


class DeliveredMessage(Message):
    """The record messageTimeup builds, ready for the put path: hosts as stored (raw),
    `properties_string` as it goes into the record, and `properties` the map the put path
    consults (no DELAY, WAIT=false), as MessageExtBrokerInner carries both."""

    __slots__ = ("properties_string", "born_host_raw", "store_host_raw", "source_offset")


def java_properties_string(props):
    """messageProperties2String of a map read from a record: its pairs in HashMap order. Not
    message.properties_to_string, which refuses separators inside a value: a value read back
    may hold \x01 (everything after a segment's first \x01), and Java writes it as it is."""
    if not props:
        return ""
    return "\x02".join([k + "\x01" + props[k] for k in hashmap_order(tuple(props))])


def message_timeup(ext):
    """The DeliveredMessage 4.9.8's messageTimeup builds from the scheduled record `ext`
    (a MessageExt). Raises ValueError when REAL_TOPIC or REAL_QID is missing or not usable."""
    props = string_to_properties(ext.properties_string)
    # setPropertiesString(messageProperties2String(msgExt.getProperties())) comes before
    # clearProperty(DELAY): the stored string keeps DELAY (and REAL_TOPIC, REAL_QID).
    props_string = java_properties_string(props)
    topic = props.get(PROPERTY_REAL_TOPIC)
    qid = props.get(PROPERTY_REAL_QID)
    if not topic:
        raise ValueError("no REAL_TOPIC property")
    if qid is None or not _JAVA_INT.match(qid) or not 0 <= int(qid) <= 0x7FFFFFFF:
        raise ValueError(f"REAL_QID {qid!r} is not a queue id")
    m = DeliveredMessage.__new__(DeliveredMessage)
    m.topic = topic
    m.queue_id = int(qid)
    # The stored bytes, compressed or not, with the sysFlag that says so: the schedule
    # service re-puts the record as it was sent (4.9.8 reads it without decompressing).
    m.body = ext.stored_body
    m.flag = ext.flag
    m.sys_flag = ext.sys_flag
    m.born_timestamp = ext.born_timestamp
    m.born_host_raw = bytes(ext.born_host_raw)
    m.store_host_raw = bytes(ext.store_host_raw)
    m.born_host = None
    m.store_host = None
    m.reconsume_times = ext.reconsume_times
    m.prepared_transaction_offset = 0
    m.properties_string = props_string
    # The map the put path sees: setWaitStoreMsgOK(false), then clearProperty(DELAY).
    props[PROPERTY_WAIT] = "false"
    props.pop(PROPERTY_DELAY, None)
    m.properties = props
    m.source_offset = ext.commit_log_offset
    return m


def correct_deliver_timestamp(now, deliver_ts, delay_ms):
    """correctDeliverTimestamp, on arrays: a delivery time beyond now + the level's delay
    (a TAGS hash written by a broker's abnormal recovery) is taken as now."""
    return np.where(deliver_ts > now + delay_ms, now, deliver_ts)


class ScheduleMessageService(ServiceThread):
    """Delivers due delayed messages of every level; started by a master store, which hands
    it what it uses: the delay levels, the DelayOffsetManager, the CommitLog the records are
    read from, `find_consume_queue(topic, queue_id)`, the store clock, and
    `put_messages(msgs)` (the store's put path), `is_running()` and `catch_up()` (dispatch
    what reput has not yet); and for the batch path, where the backend has it, the kernel
    `timeup_encode` and `put_encoded(records, sizes, keys, topics)` (the store's append of
    encoded records, MessageStore._put_encoded)."""

    name = "ScheduleMessageService"

    def __init__(self, delay_levels, offsets, commitlog, find_consume_queue, clock, *,
                 put_messages, is_running, catch_up, timeup_encode=None, put_encoded=None):
        super().__init__()
        self.delay_levels = list(delay_levels)                    # ms, level 1 first
        self.offsets = offsets                                    # DelayOffsetManager
        self._commitlog = commitlog
        self._find_cq = find_consume_queue
        self._clock = clock
        self._put_messages = put_messages
        self._is_running = is_running
        self._catch_up = catch_up
        self._next_run = {}                                      # level -> monotonic s
        self._lock = threading.Lock()                            # one run at a time
        self.delivered = 0
        self.skipped = 0
        self.batched = 0                # of `delivered`, the records the batch path encoded
        # The batch path, where the backend has it (cext): records encoded by
        # rs_timeup_encode from the stored ones, and the real topics it may send them to.
        self._encode = timeup_encode if put_encoded is not None else None
        self._put_encoded = put_encoded
        self._topics = []
        self._topic_buf = b""
        self._topic_off = np.zeros(1, dtype=np.int64)
        self._out = None

    @property
    def max_delay_level(self):
        return len(self.delay_levels)

    # ---- lifecycle ----------------------------------------------------------------------
    def correct_delay_offset(self):
        """correctDelayOffset: an offset below the queue's minimum or past its maximum is
        moved to that end (files expired, or a queue rebuilt shorter)."""
        for level in range(1, self.max_delay_level + 1):
            current = self.offsets.offset_table.get(level)
            if current is None:
                continue
            cq = self._find_cq(F.SCHEDULE_TOPIC, delay_level_to_queue_id(level))
            lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue
            fixed = min(max(current, lo), hi)
            if fixed != current:
                log.error("schedule CQ offset invalid: delay level %d offset %d, queue holds "
                          "%d..%d; corrected to %d", level, current, lo, hi, fixed)
                self.offsets.update_offset(level, fixed)

    def start(self):
        self.correct_delay_offset()
        first = monotonic_ms() + FIRST_DELAY_TIME_MS
        self._next_run = {level: first for level in range(1, self.max_delay_level + 1)}
        super().start()

    def run_once(self):
        now = monotonic_ms()
        due = [lv for lv, t in self._next_run.items() if t <= now]
        if not due:
            wait = min(self._next_run.values(), default=now + 1000) - now
            self.wait_for_running(max(1, wait))
            return
        for level in due:
            if self.is_stopped:
                return
            try:
                delay_ms = self.execute_on_timeup(level)
            except StoreClosedError:
                # The store is shutting down and stops this service next: no busy retry.
                delay_ms = DELAY_FOR_A_WHILE_MS
            except Exception:
                log.exception("ScheduleMessageService: delivery of delay level %d failed", level)
                delay_ms = DELAY_FOR_A_PERIOD_MS
            self._next_run[level] = monotonic_ms() + delay_ms

    def on_shutdown(self):
        # ScheduleMessageService#shutdown persists; the store's config close does too.
        try:
            self.offsets.persist_if_dirty()
        except (OSError, StoreClosedError) as exc:
            log.error("could not write delayOffset.json: %s", exc)

    # ---- one run of one level -----------------------------------------------------------
    def offset_of(self, level):
        return self.offsets.offset_table.get(level, 0)

    def execute_on_timeup(self, level):
        """Deliver every due unit of `level` from its offset on. Returns the delay (ms) to the
        level's next run: 100 ms, as DeliverDelayedMessageTimerTask reschedules itself, or up
        to IDLE_WAIT_MS when the level's queue held nothing past its offset."""
        with self._lock:
            return self._execute(level)

    def _execute(self, level):
        delay_ms = self.delay_levels[level - 1]
        cq = self._find_cq(F.SCHEDULE_TOPIC, delay_level_to_queue_id(level))
        offset = self.offset_of(level)
        lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue
        if offset < lo or offset > hi:
            # getIndexBuffer found nothing: the next run starts from the nearest end.
            log.error("schedule CQ offset invalid: delay level %d offset %d, queue holds "
                      "%d..%d", level, offset, lo, hi)
            self.offsets.update_offset(level, lo if offset < lo else hi)
            return DELAY_FOR_A_WHILE_MS
        while offset < hi and not self.is_stopped_or_closed():
            units = cq.units(offset, min(DELIVER_BATCH, hi - offset))
            if len(units) == 0:
                break
            now = self._clock()
            tags = units["tags_code"].astype(np.int64)
            deliver = correct_deliver_timestamp(now, tags, delay_ms)
            not_due = np.flatnonzero(deliver > now)
            n_due = int(not_due[0]) if len(not_due) else len(units)
            if n_due:
                done, refused = self._deliver(level, offset, units[:n_due])
                offset += done
                if refused:
                    return DELAY_FOR_A_WHILE_MS         # retry from there in 100 ms
                if done < n_due:
                    continue                            # cut by bytes: the next batch
            if n_due < len(units):
                break
        if offset < hi:
            return DELAY_FOR_A_WHILE_MS
        # Nothing past the offset: what is put from now on is due a delay from now at the
        # earliest, so the level may wait that long (IDLE_WAIT_MS at most) and be on time.
        return max(DELAY_FOR_A_WHILE_MS, min(delay_ms, IDLE_WAIT_MS))

    def is_stopped_or_closed(self):
        return self.is_stopped or not self._is_running()

    def _deliver(self, level, offset, units):
        if self._encode is not None:
            return self._deliver_encoded(level, offset, units)
        return self._deliver_messages(level, offset, units)

    # ---- the batch path (compiled backend) -------------------------------------------------
    def _accept_topic(self, name):
        """Whether delivered records may go to `name` on the batch path: a valid topic name
        the put path would take (anything else goes through the reference path, which logs
        and skips it, or discards RMQ_SYS_TRANS_HALF_TOPIC)."""
        if name == TRANS_HALF_TOPIC:
            return False
        try:
            self._commitlog.topic_bytes(name)
        except MessageIllegalError:
            return False
        if len(self._topics) >= MAX_TOPICS:
            self._topics = []           # a linear table: start it again rather than grow it
        self._topics.append(name)
        raw = [t.encode("utf-8") for t in self._topics]
        self._topic_buf = b"".join(raw)
        self._topic_off = np.concatenate(([0], np.cumsum([len(r) for r in raw]))).astype(
            np.int64)
        return True

    def _span(self, phys, sizes, i, n):
        """The records from unit i on that one copy of one CommitLog file's bytes covers:
        (end index, the bytes, their positions in them), or (i, None, None) when unit i's
        record is not readable (the reference path then skips it)."""
        commitlog = self._commitlog
        mf = commitlog.mfq.find_by_offset(int(phys[i]), int(phys[i]) == 0)
        if mf is None:
            return i, None, None
        base = mf.file_from_offset
        limit = min(mf.read_position, mf.file_size) + base
        end = phys[i:n] + sizes[i:n]
        ok = (phys[i:n] >= phys[i]) & (end <= limit) & (end - phys[i] <= SPAN_BYTES)
        j = i + (int(np.argmin(ok)) if not ok.all() else n - i)
        if j == i:
            return i, None, None
        lo, hi = int(phys[i]) - base, int(end[:j - i].max()) - base
        try:
            src = mf.mm[lo:hi]
        except ValueError:              # unmapped by cleaning meanwhile
            return i, None, None
        return j, src, phys[:n] - (base + lo)

    def _deliver_encoded(self, level, offset, units):
        """_deliver_messages' outcome, with the common case (rs_timeup_encode's) encoded in
        bulk from the stored records and appended in one put per batch; a record it declines
        goes through the reference path on its own, in its place, so the order of the level's
        records is kept."""
        n = len(units)
        phys = units["offset"].astype(np.int64)
        sizes = units["size"].astype(np.int32)
        before = np.cumsum(sizes, dtype=np.int64) - sizes
        over = np.flatnonzero(before > DELIVER_BATCH_BYTES)
        if len(over):
            n = int(over[0])           # the rest in the next batch of this run
        max_body = self._commitlog.max_body
        file_size = self._commitlog.file_size
        need = int(before[n - 1] + sizes[n - 1]) + 128 * n + 4096 if n else 0
        if self._out is None or len(self._out) < need:
            self._out = bytearray(need)
        out = self._out
        out_size = np.zeros(n, dtype=np.int32)
        out_key = np.zeros(n, dtype=np.int64)
        pending = 0                     # first unit encoded and not yet put
        refused_at = [0]                # where a refused put stopped
        nbytes = 0
        i = 0

        def put(upto):
            """Put the encoded units [pending, upto); False when the put path refused some
            (the level's offset then stops at the first not stored)."""
            if upto == pending:
                return True
            status, stored, reason = self._put_encoded(
                out, out_size[pending:upto], out_key[pending:upto], self._topics)
            self.delivered += stored
            self.batched += stored
            if status is not PutMessageStatus.PUT_OK and stored < upto - pending:
                log.warning("delayed delivery refused (%s: %s); delay level %d retries from "
                            "queue offset %d", status.name, reason, level,
                            offset + pending + stored)
                refused_at[0] = pending + stored
                self.offsets.update_offset(level, offset + pending + stored)
                return False
            self.offsets.update_offset(level, offset + upto)
            return True

        while i < n:
            j, src, pos = self._span(phys, sizes, i, n)
            while src is not None and i < j:
                reason, i, nbytes, (tpos, tlen) = self._encode(
                    src, pos, sizes, i, j, self._topic_buf, self._topic_off, max_body,
                    file_size, out, nbytes, out_size, out_key)
                if reason == TIMEUP_DONE:
                    break
                if reason == TIMEUP_TOPIC and self._accept_topic(
                        bytes(src[tpos:tpos + tlen]).decode("ascii")):
                    continue
                if reason == TIMEUP_FULL and pending < i:
                    if not put(i):
                        return refused_at[0], True
                    pending, nbytes = i, 0
                    continue
                break                   # TIMEUP_SLOW, a topic refused, or FULL on its own
            if i >= n:
                break
            if src is not None and i == j:
                continue
            # Unit i takes the reference path, after everything before it is stored.
            if not put(i):
                return refused_at[0], True
            done, refused = self._deliver_messages(level, offset + i, units[i:i + 1])
            if refused:
                return i, True
            i += 1
            pending, nbytes = i, 0
        if not put(n):
            return refused_at[0], True
        return n, False

    def _deliver_messages(self, level, offset, units):
        """Put the due `units` (from queue offset `offset`) to their real queues, or as many as
        DELIVER_BATCH_BYTES allows. Returns (units done, delivered or skipped; whether the
        put path refused one): the level's offset is advanced past them only once their
        records are stored."""
        commitlog = self._commitlog
        msgs = []
        slots = []              # unit index each message came from
        n = len(units)
        taken = 0
        for i, (phy, size, _) in enumerate(units.tolist()):
            if taken > DELIVER_BATCH_BYTES:
                n = i           # the rest in the next batch of this run
                break
            taken += size
            rec = commitlog.get_data(phy, size)
            if rec is None:
                self.skipped += 1       # lookMessageByOffset found nothing: continue
                continue
            try:
                ext = MessageExt.decode(rec)
                msg = message_timeup(ext)
            except (CorruptRecordError, ValueError) as exc:
                log.error("delay level %d, queue offset %d: the record at %d cannot be "
                          "delivered (%s); skipped", level, offset + i, phy, exc)
                self.skipped += 1
                continue
            if msg.topic == TRANS_HALF_TOPIC:
                log.error("[BUG] the real topic of a scheduled message is %s; discarded",
                          TRANS_HALF_TOPIC)
                self.skipped += 1
                continue
            msgs.append(msg)
            slots.append(i)
        if not msgs:
            self.offsets.update_offset(level, offset + n)
            return n, False
        try:
            result = self._put_messages(msgs)
        except MessageIllegalError:
            # One record the put path refuses (an invalid real topic): put the rest one by
            # one, skipping it, rather than blocking the level.
            return self._deliver_one_by_one(level, offset, msgs, slots, n)
        stored = result.count if not result.ok else len(msgs)
        self.delivered += stored
        if stored < len(msgs):
            log.warning("delayed delivery refused (%s: %s); delay level %d retries from "
                        "queue offset %d", result.status.name, result.reason, level,
                        offset + slots[stored])
            self.offsets.update_offset(level, offset + slots[stored])
            return slots[stored], True
        self.offsets.update_offset(level, offset + n)
        return n, False

    def _deliver_one_by_one(self, level, offset, msgs, slots, n):
        for msg, i in zip(msgs, slots):
            try:
                result = self._put_messages([msg])
            except MessageIllegalError as exc:
                log.error("delay level %d, queue offset %d: not delivered, %s; skipped",
                          level, offset + i, exc)
                self.skipped += 1
                self.offsets.update_offset(level, offset + i + 1)
                continue
            if not result.ok:
                return i, True
            self.delivered += 1
            self.offsets.update_offset(level, offset + i + 1)
        self.offsets.update_offset(level, offset + n)
        return n, False

    def deliver_due(self):
        """Run every level once now (what the timers do, without waiting for them): for
        tests and tools with a clock of their own. Returns the messages delivered.
        Dispatches what reput has not yet first, so every put that returned is seen."""
        self._catch_up()
        before = self.delivered
        for level in range(1, self.max_delay_level + 1):
            self.execute_on_timeup(level)
        return self.delivered - before
