# SPDX-License-Identifier: Apache-2.0
"""Offline checks of a store directory (`rocketstore verify`), read-only.

Every CommitLog record is validated (magic, length, body CRC, and PHYSICALOFFSET equal to where
it sits), every ConsumeQueue unit is checked against the record it points at, index entries
against their records, and the checkpoint and config files for sanity. The other way round,
every record must have its unit and its index entries, so a deleted or cut file shows; segment
names, sizes and gaps are checked too. Each problem names its file and offset, so an operator
can go and look; damage that stops a check is a problem too, never a traceback."""
import dataclasses
import os
from typing import Any, Callable

import numpy as np

from . import format as F
from .errors import CorruptRecordError, StoreError
from .mapped_file import offset_to_file_name
from .mapped_file_queue import is_queue_dir_name, is_segment_name
from .message import MessageExt, java_string_hash, PROPERTY_DELAY
from .repair import REBUILD_MARKER, pending_rebuild

_REASONS = {F.SCAN_CORRUPT: "corrupt record (bad magic, length or body CRC)",
            F.SCAN_MISMATCH: "record fields do not add up to its TOTALSIZE",
            F.SCAN_PARTIAL: "record runs past the end of its file",
            F.SCAN_TOPIC: "corrupt record (topic bytes are not a valid topic name)"}


@dataclasses.dataclass
class Problem:
    kind: str          # commitlog | consumequeue | index | checkpoint | config | repair | link
    #                    | abort
    file: str          # path relative to the store root
    offset: int        # byte offset inside that file (-1: the file as a whole)
    detail: str

    def __str__(self):
        where = f"{self.file}@{self.offset}" if self.offset >= 0 else self.file
        return f"{self.kind}: {where}: {self.detail}"


@dataclasses.dataclass
class VerifyReport:
    records: int = 0
    units: int = 0
    index_entries: int = 0
    problems: list = dataclasses.field(default_factory=list)

    @property
    def ok(self):
        return not self.problems

    def to_dict(self):
        return {"ok": self.ok, "records": self.records, "units": self.units,
                "indexEntries": self.index_entries,
                "problems": [dataclasses.asdict(p) for p in self.problems]}


@dataclasses.dataclass(frozen=True)
class VerifyParts:
    """What verify reads of a loaded store, handed over by MessageStore.verify (the store
    wires them; verify never holds the store itself)."""
    root: str
    config: Any
    fs: Any
    kernels: Any
    commitlog: Any
    consume_queue_table: dict                 # topic -> {queue_id: ConsumeQueue}
    all_consume_queues: Callable[[], list]
    index_service: Any
    checkpoint: Any
    deleted_topics: Any                       # topic_delete.DeletedTopicManager
    unsafe_links: Callable[[], list]          # MessageStore.unsafe_links


def _rel(parts, path):
    return os.path.relpath(path, parts.root)


class _Records:
    """Offsets and sizes of the valid records, ascending (numpy, not a dict: a big store has
    hundreds of millions of them)."""

    def __init__(self, offsets, sizes):
        self.offsets = offsets
        self.sizes = sizes

    def size_at(self, offsets):
        """Sizes of the records starting at `offsets` (an array); -1 where none starts."""
        idx = np.searchsorted(self.offsets, offsets)
        idx = np.minimum(idx, max(len(self.offsets) - 1, 0))
        if not len(self.offsets):
            return np.full(len(offsets), -1, dtype=np.int64)
        hit = self.offsets[idx] == offsets
        return np.where(hit, self.sizes[idx], -1)

    @property
    def last(self):
        return int(self.offsets[-1]) if len(self.offsets) else -1


def walk_commitlog(commitlog, kernels, start=None, check_crc=True):
    """Every record of every CommitLog file from `start` (a record start; default the
    first), going on past damage where records resume as `verify` does. Yields
    ("records", mf, rows) per batch of valid records (`rows` is reused: consume it before
    the next step) and ("damage", mf, pos, detail) per problem found at file position pos."""
    k = kernels
    rows = np.empty(4096, dtype=F.SCAN_DTYPE)
    files = commitlog.mfq.files
    first = 0
    pos = 0
    if start is not None:
        mf = commitlog.mfq.find_by_offset(start)
        if mf is None:
            return
        first, pos = files.index(mf), start - mf.file_from_offset
    for i in range(first, len(files)):
        mf = files[i]
        last = i == len(files) - 1
        while True:
            n, stop, reason, stop_size = k.commitlog_scan(mf.mm, pos, mf.file_size, check_crc,
                                                          rows)
            if n:
                yield "records", mf, rows[:n]
            pos = stop
            if reason == F.SCAN_END and pos < mf.file_size:
                continue
            if reason == F.SCAN_BLANK:
                if stop_size != mf.file_size - pos:
                    yield ("damage", mf, pos,
                           f"blank record claims {stop_size} bytes, {mf.file_size - pos} remain")
            elif reason == F.SCAN_EMPTY:
                resume = _resync(mf, pos + 1)
                if resume is not None:
                    # A zero magic code reads as the end of the data, whatever its length says.
                    zeros = mf.mm[pos:resume].count(0) == resume - pos
                    what = ("bytes of zeros inside the data" if zeros else
                            "bytes unreadable: a record with no magic code ends the data here")
                    yield ("damage", mf, pos, f"{resume - pos} {what}; records resume at "
                                              f"{resume}")
                    pos = resume
                    continue
                if not last:
                    yield ("damage", mf, pos,
                           "data ends inside a file that is not the last one (missing records)")
            elif reason in _REASONS:
                yield "damage", mf, pos, _REASONS[reason]
                resume = _resync(mf, pos + 1)
                if resume is not None:
                    yield ("damage", mf, pos,
                           f"{resume - pos} bytes unreadable; records resume at {resume}")
                    pos = resume
                    continue
            break
        pos = 0


def _check_commitlog(parts, report, progress, missing):
    """Every record of every file, CRC included; returns the valid records. Each batch is
    also looked up in its ConsumeQueue (`missing` collects the records without a unit)."""
    offsets = []
    sizes = []
    for step in walk_commitlog(parts.commitlog, parts.kernels):
        if step[0] == "damage":
            _, mf, pos, detail = step
            report.problems.append(Problem("commitlog", _rel(parts, mf.path), pos, detail))
            continue
        _, mf, chunk = step
        expect = mf.file_from_offset + chunk["pos"]
        bad = np.nonzero(chunk["phy_offset"] != expect)[0]
        for j in bad:
            report.problems.append(Problem(
                "commitlog", _rel(parts, mf.path), int(chunk["pos"][j]),
                f"PHYSICALOFFSET says {int(chunk['phy_offset'][j])}, the record sits at "
                f"{int(expect[j])}"))
        offsets.append(expect.astype(np.int64))
        sizes.append(chunk["size"].astype(np.int64))
        _find_units(parts, chunk, mf.mm, missing)
        report.records += len(chunk)
        progress(int(chunk["size"].sum()))
    if not offsets:
        return _Records(np.empty(0, np.int64), np.empty(0, np.int64))
    return _Records(np.concatenate(offsets), np.concatenate(sizes))


_MAGICS = [F.I32.pack(m) for m in (F.MESSAGE_MAGIC_CODE, F.MESSAGE_MAGIC_CODE_V2)]


def _resync(mf, start):
    """The next position after damage where a record starts: its magic is in place and its
    PHYSICALOFFSET names that very position (recovery would stop at the damage; verify goes
    on, so one flipped byte is one problem, not a whole file of them)."""
    mm = mf.mm
    pos = start
    while True:
        hits = [i for i in (mm.find(magic, pos + F.POS_MAGIC) for magic in _MAGICS) if i >= 0]
        if not hits:
            return None
        q = min(hits) - F.POS_MAGIC
        if q + F.POS_PHYSICALOFFSET + 8 <= mf.file_size and \
                F.I64.unpack_from(mm, q + F.POS_PHYSICALOFFSET)[0] == mf.file_from_offset + q:
            return q
        pos = q + 1


def _record(parts, off, size):
    """The record of `size` bytes at commit-log offset `off`, decoded; None when it cannot be
    read. Read from the mapping, not through the store's readable end: verify reads records
    past it (a dirty tail, a live writer's newest appends)."""
    mf = parts.commitlog.mfq.find_by_offset(off)
    if mf is None:
        return None
    rel = off - mf.file_from_offset
    if rel + size > mf.file_size:
        return None
    try:
        return MessageExt.decode(mf.mm[rel:rel + size])
    except (CorruptRecordError, ValueError):
        return None


def _find_units(parts, chunk, buf, missing):
    """Note in `missing` every record of `chunk` whose queue has no unit at its queue
    offset: a deleted or truncated ConsumeQueue file loses them silently otherwise."""
    tx = chunk["sys_flag"] & F.TRANSACTION_TYPE_MASK
    keep = (tx != F.TRANSACTION_PREPARED_TYPE) & (tx != F.TRANSACTION_ROLLBACK_TYPE)
    deleted = parts.deleted_topics.offsets_raw
    chunk = chunk[keep]
    if not len(chunk):
        return
    key = (chunk["topic_hash"].astype(np.int64) << 32) | \
        (chunk["queue_id"].astype(np.int64) & 0xFFFFFFFF)
    order = np.argsort(key, kind="stable")
    for idx in np.split(order, np.flatnonzero(np.diff(key[order])) + 1):
        g = chunk[idx]
        topics = {bytes(buf[p:p + n]) for p, n in zip((g["pos"] + g["topic_off"]).tolist(),
                                                       g["topic_len"].tolist())}
        for raw in topics:
            sub = g if len(topics) == 1 else g[np.array(
                [bytes(buf[p:p + n]) == raw for p, n in zip(
                    (g["pos"] + g["topic_off"]).tolist(), g["topic_len"].tolist())])]
            below = deleted.get(raw)
            if below is not None:
                # A deleted topic's records stay until they expire, without units.
                sub = sub[sub["phy_offset"] >= below]
                if not len(sub):
                    continue
            topic = raw.decode("utf-8", "replace")
            qid = int(sub["queue_id"][0])
            cq = parts.consume_queue_table.get(topic, {}).get(qid)
            qoffs = sub["queue_offset"].astype(np.int64)
            phys = sub["phy_offset"].astype(np.int64)
            have = np.zeros(len(sub), dtype=bool)
            if cq is not None:
                # One read per ConsumeQueue file: a read stops at a missing file.
                per_file = cq.file_size // F.CQ_STORE_UNIT_SIZE
                for part in np.split(np.arange(len(qoffs)),
                                     np.flatnonzero(np.diff(qoffs // per_file)) + 1):
                    lo = int(qoffs[part].min())
                    units = cq.units(lo, int(qoffs[part].max()) - lo + 1)
                    rel = qoffs[part] - lo
                    inside = (rel >= 0) & (rel < len(units))
                    have[part[inside]] = units["offset"][rel[inside]] >= 0
                    del units
            for q, phy in zip(qoffs[~have].tolist(), phys[~have].tolist()):
                missing.setdefault((topic, qid), []).append((q, phy))


def _report_missing_units(parts, report, missing):
    """One problem per run of consecutive queue offsets that lack their unit."""
    for (topic, qid), pairs in sorted(missing.items()):
        cq = parts.consume_queue_table.get(topic, {}).get(qid)
        size = cq.file_size if cq is not None else parts.config.cq_file_size
        pairs.sort()
        run = [pairs[0]]
        for pair in pairs[1:] + [None]:
            if pair is not None and pair[0] == run[-1][0] + 1:
                run.append(pair)
                continue
            first, last = run[0], run[-1]
            pos = first[0] * F.CQ_STORE_UNIT_SIZE
            name = offset_to_file_name(pos - pos % size)
            units = (f"unit {first[0]}" if len(run) == 1 else f"units {first[0]}..{last[0]}")
            report.problems.append(Problem(
                "consumequeue", f"consumequeue/{topic}/{qid}/{name}", pos % size,
                f"{units} of {topic}-{qid} missing: the records at commit-log offsets "
                f"{first[1]}..{last[1]} have no consume-queue unit"))
            run = [pair]


def _check_layout(parts, report):
    """Names and sizes of every segment: a stray file, a segment of the wrong size and a
    gap between segments are findings (the loader skips or warns about them, and a reader
    would see the gap as missing data)."""
    fs = parts.fs
    queues = [("commitlog", parts.config.commitlog_dir(parts.root),
               parts.commitlog.mfq.file_size)]
    cq_base = os.path.join(parts.root, "consumequeue")
    for topic in sorted(fs.list_dir(cq_base)):
        tdir = os.path.join(cq_base, topic)
        if not fs.is_dir(tdir):
            report.problems.append(Problem("consumequeue", _rel(parts, tdir), -1,
                                           "not a topic directory"))
            continue
        for qid in sorted(fs.list_dir(tdir)):
            qdir = os.path.join(tdir, qid)
            if not is_queue_dir_name(qid) or not fs.is_dir(qdir):
                report.problems.append(Problem("consumequeue", _rel(parts, qdir), -1,
                                               "not a queue directory (ignored by the store)"))
                continue
            cq = parts.consume_queue_table.get(topic, {}).get(int(qid))
            queues.append(("consumequeue", qdir, cq.file_size if cq else None))
    for kind, path, size in queues:
        names = sorted(fs.list_dir(path))
        prev = None
        for name in names:
            p = os.path.join(path, name)
            if not is_segment_name(name) or fs.is_dir(p):
                report.problems.append(Problem(kind, _rel(parts, p), -1,
                                               "not a segment (ignored by the store)"))
                continue
            actual = fs.size(p)
            start = int(name)
            if size and actual != size:
                report.problems.append(Problem(
                    kind, _rel(parts, p), -1, f"{actual} bytes, segments here are {size}"))
            if size and start % size:
                report.problems.append(Problem(
                    kind, _rel(parts, p), -1, f"start offset {start} is not a multiple of "
                    f"the segment size {size}"))
            elif size and prev is not None and start != prev + size:
                report.problems.append(Problem(
                    kind, _rel(parts, p), -1, f"segments missing before it: the previous one "
                    f"starts at {prev}"))
            prev = start
    idx_dir = os.path.join(parts.root, "index")
    loaded = {f.file_name for f in parts.index_service.index_file_list}
    loaded |= {os.path.basename(p) for p in _empty_unreadable(parts)}
    for name in sorted(fs.list_dir(idx_dir)):
        if name not in loaded:
            report.problems.append(Problem("index", f"index/{name}", -1,
                                           "not an index file of this store's geometry "
                                           "(ignored by the store)"))


def _expected_tags_code(parts, m):
    props = m.properties
    if m.topic == F.SCHEDULE_TOPIC and props.get(PROPERTY_DELAY):
        try:
            level = int(props[PROPERTY_DELAY])
        except ValueError:
            level = 0
        if level > 0:
            levels = parts.config.delay_levels
            return m.store_timestamp + levels[min(level, len(levels)) - 1]
    tags = props.get("TAGS")
    return java_string_hash(tags) if tags else 0


def _check_consume_queues(parts, report, good, progress):
    for cq in parts.all_consume_queues():
        lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue
        units = cq.units(lo, hi - lo)
        found = good.size_at(units["offset"].astype(np.int64))
        for i, (off, size, tags) in enumerate(units.tolist()):
            index = lo + i
            f = cq.mfq.find_by_offset(index * F.CQ_STORE_UNIT_SIZE)
            where = (_rel(parts, f.path) if f else f"consumequeue/{cq.topic}/{cq.queue_id}",
                     index * F.CQ_STORE_UNIT_SIZE - (f.file_from_offset if f else 0))
            report.units += 1
            if size == 0x7FFFFFFF and off == 0:
                continue                       # filler unit before a queue's first offset
            if found[i] < 0:
                report.problems.append(Problem(
                    "consumequeue", where[0], where[1],
                    f"unit {index} points at {off}, where no valid record starts"))
                continue
            if found[i] != size:
                report.problems.append(Problem(
                    "consumequeue", where[0], where[1],
                    f"unit {index} says size {size}, the record is {int(found[i])} bytes"))
                continue
            m = _record(parts, off, size)
            if m is None:
                report.problems.append(Problem("consumequeue", where[0], where[1],
                                               f"unit {index}: record at {off} unreadable"))
                continue
            if (m.topic, m.queue_id, m.queue_offset) != (cq.topic, cq.queue_id, index):
                report.problems.append(Problem(
                    "consumequeue", where[0], where[1],
                    f"unit {index} points at a record of {m.topic}-{m.queue_id} "
                    f"offset {m.queue_offset}"))
            elif tags != _expected_tags_code(parts, m):
                report.problems.append(Problem(
                    "consumequeue", where[0], where[1],
                    f"unit {index} tagsCode {tags} != {_expected_tags_code(parts, m)}"))
        _check_queue_tail(parts, report, cq)
        progress(0)


def _check_queue_tail(parts, report, cq):
    """Units written after where the loaded queue ends: recovery stopped before them (a unit
    pointing past the CommitLog, or following a broken one), so a reader never sees them and
    a writable open drops them."""
    f = cq.mfq.last_file
    if f is None:
        return
    end = f.data_end()              # past it the file is zeros: reading a hole can fault
    pos = f.wrote_position
    if pos >= end:
        return
    tail = np.frombuffer(f.mm[pos:end], dtype=F.CQ_DTYPE, count=(end - pos) // F.CQ_STORE_UNIT_SIZE)
    written = np.flatnonzero((tail["offset"] != 0) | (tail["size"] != 0) | (tail["tags_code"] != 0))
    for j in written[:8].tolist():
        report.problems.append(Problem(
            "consumequeue", _rel(parts, f.path), pos + j * F.CQ_STORE_UNIT_SIZE,
            f"unit {(f.file_from_offset + pos) // F.CQ_STORE_UNIT_SIZE + j} "
            f"(offset {int(tail['offset'][j])}, size {int(tail['size'][j])}) lies past where the "
            "queue ends: it points past the CommitLog or follows a broken unit"))
    if len(written) > 8:
        report.problems.append(Problem(
            "consumequeue", _rel(parts, f.path), -1,
            f"{len(written)} units in all lie past where the queue ends (the first 8 listed)"))


def _empty_unreadable(parts):
    """The index files whose hash slot and entry numbers cannot be told but that hold no
    entry (indexCount <= 1): a clean store written with other numbers and no key yet. Nothing
    in them can be checked or lost; coverage still finds any key they should hold."""
    out = set()
    for path in parts.index_service.unreadable:
        mm = parts.fs.map(path, F.INDEX_HEADER_SIZE, writable=False)
        try:
            if F.I32.unpack_from(mm, F.INDEX_POS_INDEX_COUNT)[0] <= 1:
                out.add(path)
        finally:
            mm.close()
    return out


def _check_index(parts, report, good):
    """Every entry of every IndexFile: it points at a valid record that carries its key
    (topic#UNIQ_KEY or topic#each KEYS piece), its chain link points back inside the file,
    and the header agrees with the entries and slots. Then the other way round: every key
    of every valid record has an entry (see _check_index_coverage)."""
    service = parts.index_service
    if service is None:
        return
    from .index_service import index_keys
    k = parts.kernels
    empty = _empty_unreadable(parts)
    for path in service.unreadable:
        if path in empty:
            continue
        report.problems.append(Problem(
            "index", _rel(parts, path), -1, "its hash slot and entry numbers cannot be told "
            "(the index files' sizes or contents disagree): not checked"))
    indexed = []
    for f in list(service.index_file_list):
        rel = _rel(parts, f.path)
        header, slots, entries = f.arrays()
        try:
            count = int(header["index_count"][0])
            if not 1 <= count <= f.index_num:
                report.problems.append(Problem("index", rel, F.INDEX_POS_INDEX_COUNT,
                                               f"indexCount {count} outside 1..{f.index_num}"))
                continue
            used = entries[1:count]
            report.index_entries += len(used)
            base = F.INDEX_HEADER_SIZE + f.slot_num * F.INDEX_SLOT_SIZE
            if int(np.count_nonzero(slots)) != int(header["hash_slot_count"][0]):
                report.problems.append(Problem(
                    "index", rel, 32, f"hashSlotCount {int(header['hash_slot_count'][0])} but "
                    f"{int(np.count_nonzero(slots))} slots are in use"))
            for bad in np.flatnonzero((slots < 0) | (slots >= count)):
                report.problems.append(Problem(
                    "index", rel, F.INDEX_HEADER_SIZE + int(bad) * F.INDEX_SLOT_SIZE,
                    f"slot {int(bad)} points at entry {int(slots[bad])} of {count}"))
            numbers = np.arange(1, count)
            prev = used["prev_index"].astype(np.int64)
            for j in np.flatnonzero((prev < 0) | (prev >= numbers)):
                report.problems.append(Problem(
                    "index", rel, base + int(numbers[j]) * F.INDEX_ENTRY_SIZE,
                    f"entry {int(numbers[j])} links to {int(prev[j])}, not an earlier entry"))
            offsets = used["phy_offset"].astype(np.int64)
            indexed.append(_key_pairs(offsets, used["key_hash"]))
            found = good.size_at(offsets)
            hashes = used["key_hash"].tolist()
            for j, (off, size) in enumerate(zip(offsets.tolist(), found.tolist())):
                where = base + (j + 1) * F.INDEX_ENTRY_SIZE
                if size < 0:
                    report.problems.append(Problem(
                        "index", rel, where, f"entry {j + 1} points at {off}, where no valid "
                        "record starts"))
                    continue
                m = _record(parts, off, size)
                if m is None:
                    report.problems.append(Problem(
                        "index", rel, where, f"entry {j + 1}: record at {off} unreadable"))
                    continue
                topic = m.topic.encode()
                keys = {k.index_hash(topic + b"#" + key)
                        for key in index_keys(m.properties_string.encode())}
                if hashes[j] not in keys:
                    report.problems.append(Problem(
                        "index", rel, where, f"entry {j + 1}: no key of the record at {off} "
                        f"hashes to {hashes[j]}"))
        finally:
            del header, slots, entries        # the views pin the mapping
    if set(service.unreadable) <= empty:
        _check_index_coverage(parts, report, good, indexed)


_KEY_PAIR = np.dtype([("phy", "<i8"), ("hash", "<i8")])
MAX_UNINDEXED_PROBLEMS = 100     # then one summary: a lost index would list every record


def _key_pairs(phys, hashes):
    out = np.empty(len(phys), dtype=_KEY_PAIR)
    out["phy"] = phys
    out["hash"] = hashes
    return out


def _record_keys(parts, good):
    """(phy offsets, key hashes, file, position) of every key the index dispatcher puts for
    the valid records, hashed by the same index_keys kernel."""
    k = parts.kernels
    rows = np.empty(4096, dtype=F.SCAN_DTYPE)
    for mf in parts.commitlog.mfq.files:
        base = mf.file_from_offset
        lo, hi = np.searchsorted(good.offsets, [base, base + mf.file_size])
        starts = good.offsets[lo:hi] - base
        i = 0
        while i < len(starts):
            n, stop, _, _ = k.commitlog_scan(mf.mm, int(starts[i]), mf.file_size, False, rows)
            chunk = rows[:n]
            chunk = chunk[good.size_at(base + chunk["pos"].astype(np.int64)) >= 0]
            # This scan skips the CRC: keep the rows verify found valid, and go on from the
            # next valid record past where it stopped.
            i = max(i + 1, int(np.searchsorted(starts, stop)))
            if not len(chunk):
                continue
            cap = 4 * len(chunk) + 16
            while True:
                hashes = np.empty(cap, dtype=np.int32)
                key_rows = np.empty(cap, dtype=np.int32)
                nkeys, done = k.index_keys(mf.mm, chunk, hashes, key_rows)
                if done == len(chunk):
                    break
                cap *= 4
            key_rows = key_rows[:nkeys]
            yield (chunk["phy_offset"][key_rows].astype(np.int64), hashes[:nkeys], mf,
                   chunk["pos"][key_rows].astype(np.int64))


def _key_named(parts, good, phy, key_hash):
    """The `topic#key` of the record at `phy` that hashes to key_hash."""
    from .index_service import index_keys
    m = _record(parts, phy, int(good.size_at(np.array([phy]))[0]))
    if m is None:
        return f"hash {key_hash}"
    topic = m.topic.encode()
    for key in index_keys(m.properties_string.encode()):
        if parts.kernels.index_hash(topic + b"#" + key) == key_hash:
            return (topic + b"#" + key).decode("utf-8", "replace")
    return f"hash {key_hash}"


def _check_index_coverage(parts, report, good, indexed):
    """Every key of every valid record has an index entry at that record (a crash that lost
    index files shows here: queries would not find those records)."""
    service = parts.index_service
    if not parts.config.message_index_enable or not (service.index_file_list or
                                                     service.unreadable):
        return      # a store without index files keeps no index (messageIndexEnable=false)
    have = np.concatenate(indexed) if indexed else np.empty(0, dtype=_KEY_PAIR)
    have = have[np.lexsort((have["hash"], have["phy"]))]     # far faster than sorting records
    missing = 0
    for phys, hashes, mf, positions in _record_keys(parts, good):
        want = _key_pairs(phys, hashes)
        at = np.minimum(np.searchsorted(have, want), max(len(have) - 1, 0))
        absent = np.ones(len(want), dtype=bool) if not len(have) else have[at] != want
        for j in np.flatnonzero(absent):
            missing += 1
            if missing > MAX_UNINDEXED_PROBLEMS:
                continue
            report.problems.append(Problem(
                "index", _rel(parts, mf.path), int(positions[j]),
                f"key {_key_named(parts, good, int(phys[j]), int(hashes[j]))!r} of the record "
                f"at {int(phys[j])} has no index entry: key queries miss the record"))
    if missing > MAX_UNINDEXED_PROBLEMS:
        report.problems.append(Problem(
            "index", "index", -1, f"{missing} record keys in all are missing from the index "
            f"(the first {MAX_UNINDEXED_PROBLEMS} are listed)"))


def _check_checkpoint(parts, report, good):
    ckpt = parts.checkpoint
    if ckpt is None:
        return
    path = os.path.join(parts.root, "checkpoint")
    if not parts.fs.exists(path):
        report.problems.append(Problem("checkpoint", "checkpoint", -1, "missing"))
        return
    if parts.fs.size(path) != F.CHECKPOINT_FILE_SIZE:
        report.problems.append(Problem(
            "checkpoint", "checkpoint", -1,
            f"{parts.fs.size(path)} bytes, not {F.CHECKPOINT_FILE_SIZE} (one OS page, as a "
            "broker writes it)"))
    last_ts = 0
    if good.last >= 0:
        m = _record(parts, good.last, int(good.sizes[-1]))
        last_ts = m.store_timestamp if m else 0
    # indexMsgTimestamp may trail the others (it advances per full index file), never lead.
    for name in ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp"):
        value = getattr(ckpt, name)
        if value < 0:
            report.problems.append(Problem("checkpoint", "checkpoint", -1,
                                           f"{name} {value} is negative"))
        elif last_ts and value > last_ts + 3000:
            report.problems.append(Problem(
                "checkpoint", "checkpoint", -1,
                f"{name} {value} is later than the last record ({last_ts})"))


def _check_configs(parts, report):
    """Each config file (and its .bak) as the broker's config manager reads it: fastjson's
    dialect, the table it must hold; any other .json file must at least parse."""
    from .codec.fastjson import parse_fastjson
    from .config_manager import all_managers
    fs = parts.fs
    config_dir = os.path.join(parts.root, "config")
    if not fs.is_dir(config_dir):
        return
    managers = {m.file_name: m for m in all_managers(parts.root, fs, None, True)}
    for name in sorted(fs.list_dir(config_dir)):
        base = name[:-4] if name.endswith(".bak") else name
        if not base.endswith(".json"):
            continue
        path = os.path.join(config_dir, name)
        manager = managers.get(base)
        try:
            text = fs.read_bytes(path).decode("utf-8")
            if manager is not None and text.strip():
                manager.decode(text)
            elif text.strip():
                parse_fastjson(text)
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
            report.problems.append(Problem("config", _rel(parts, path), -1,
                                           f"does not parse: {exc}"))


def _check_links(parts, report):
    """Links a write would follow (stray names are _check_layout's)."""
    for path, why in parts.unsafe_links():
        report.problems.append(Problem("link", _rel(parts, path), -1,
                                       f"{why}: a writable open refuses the store"))


def verify_store(parts, progress=None):
    """Check every file of a loaded (read-only) store, from its VerifyParts (what
    MessageStore.verify hands in); returns a VerifyReport. A check that
    cannot finish on what it finds (damage no rule above foresaw) is itself a finding."""
    progress = progress or (lambda n: None)
    report = VerifyReport()
    missing = {}
    good = _Records(np.empty(0, np.int64), np.empty(0, np.int64))

    def commitlog():
        nonlocal good
        good = _check_commitlog(parts, report, progress, missing)

    for kind, check in (("commitlog", lambda: _check_layout(parts, report)),
                        ("commitlog", commitlog),
                        ("consumequeue", lambda: _report_missing_units(parts, report, missing)),
                        ("consumequeue", lambda: _check_consume_queues(parts, report, good,
                                                                       progress)),
                        ("index", lambda: _check_index(parts, report, good)),
                        ("checkpoint", lambda: _check_checkpoint(parts, report, good)),
                        ("config", lambda: _check_configs(parts, report)),
                        ("repair", lambda: _check_pending_rebuild(parts, report)),
                        ("abort", lambda: _check_abort(parts, report)),
                        ("link", lambda: _check_links(parts, report))):
        try:
            check()
        except (StoreError, OSError, ValueError, IndexError, RecursionError) as exc:
            report.problems.append(Problem(kind, kind, -1,
                                           f"check stopped by damage: {exc!r}"))
    return report


def _check_abort(parts, report):
    """An `abort` file with no process holding the lock: the last one did not shut down. The
    next writable open runs abnormal recovery; say what it would do, computed read-only by
    the recovery code itself (repair.plan_recovery, as `recover --dry-run`)."""
    from .lockfile import abort_path
    from .repair import plan_recovery
    if not parts.fs.exists(abort_path(parts.root)):
        return
    if parts.fs.lock_holder(os.path.join(parts.root, "lock"))[1]:
        return      # a running store keeps its abort file; the CLI warns that it is in use
    what = "the last run did not shut down cleanly"
    try:
        plan = plan_recovery(parts.root, kernels=parts.kernels,
                             max_hash_slot_num=parts.config.max_hash_slot_num,
                             max_index_num=parts.config.max_index_num)
    except (StoreError, OSError, ValueError) as exc:
        detail = f"{what}; recovery's plan cannot be computed: {exc}"
    else:
        detail = (f"{what}: the next writable open runs abnormal recovery, scanning from "
                  f"CommitLog file {plan.start_file}; the CommitLog would end at "
                  f"{plan.process_offset} ({plan.stop_reason or 'clean'}), "
                  f"{plan.truncated_bytes} byte(s) past it truncated, "
                  f"{sum(plan.truncated_units.values())} consume-queue unit(s) dropped, "
                  f"{plan.redispatch_records} record(s) dispatched again")
    report.problems.append(Problem("abort", "abort", -1, detail))


def _check_pending_rebuild(parts, report):
    """A rebuild killed midway: what it wiped is missing until a writable open finishes it."""
    dirs = pending_rebuild(parts.fs, parts.root)
    if dirs:
        report.problems.append(Problem(
            "repair", REBUILD_MARKER, -1,
            f"a rebuild of {', '.join(dirs)} was interrupted; the next writable open (or "
            "rebuild run) finishes it"))
