# SPDX-License-Identifier: Apache-2.0
"""Offline checks of a store directory (`rocketstore verify`), read-only.

Every CommitLog record is validated (magic, length, body CRC, and PHYSICALOFFSET equal to where
it sits), every ConsumeQueue unit is checked against the record it points at, index entries
against their records, and the checkpoint and config files for sanity. Each problem names its
file and offset, so an operator can go and look."""
import dataclasses
import json
import os

import numpy as np

from . import format as F
from .errors import CorruptRecordError
from .message import MessageExt, java_string_hash, PROPERTY_DELAY

_REASONS = {F.SCAN_CORRUPT: "corrupt record (bad magic, length or body CRC)",
            F.SCAN_MISMATCH: "record fields do not add up to its TOTALSIZE",
            F.SCAN_PARTIAL: "record runs past the end of its file"}


@dataclasses.dataclass
class Problem:
    kind: str          # commitlog | consumequeue | index | checkpoint | config | link
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


def _rel(store, path):
    return os.path.relpath(path, store.root)


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


def _check_commitlog(store, report, progress):
    """Every record of every file, CRC included; returns the valid records."""
    k = store.kernels
    rows = np.empty(4096, dtype=F.SCAN_DTYPE)
    files = store.commitlog.mfq.files
    offsets = []
    sizes = []
    for i, mf in enumerate(files):
        pos = 0
        last = i == len(files) - 1
        while True:
            n, stop, reason, stop_size = k.commitlog_scan(mf.mm, pos, mf.file_size, True, rows)
            if n:
                chunk = rows[:n]
                expect = mf.file_from_offset + chunk["pos"]
                bad = np.nonzero(chunk["phy_offset"] != expect)[0]
                for j in bad:
                    report.problems.append(Problem(
                        "commitlog", _rel(store, mf.path), int(chunk["pos"][j]),
                        f"PHYSICALOFFSET says {int(chunk['phy_offset'][j])}, the record sits at "
                        f"{int(expect[j])}"))
                offsets.append(expect.astype(np.int64))
                sizes.append(chunk["size"].astype(np.int64))
                report.records += n
                progress(int(chunk["size"].sum()))
            pos = stop
            if reason == F.SCAN_END and pos < mf.file_size:
                continue
            if reason == F.SCAN_BLANK:
                if stop_size != mf.file_size - pos:
                    report.problems.append(Problem(
                        "commitlog", _rel(store, mf.path), pos,
                        f"blank record claims {stop_size} bytes, {mf.file_size - pos} remain"))
            elif reason == F.SCAN_EMPTY:
                if not last:
                    report.problems.append(Problem(
                        "commitlog", _rel(store, mf.path), pos,
                        "data ends inside a file that is not the last one (missing records)"))
            elif reason in _REASONS:
                report.problems.append(Problem("commitlog", _rel(store, mf.path), pos,
                                               _REASONS[reason]))
                resume = _resync(mf, pos + 1)
                if resume is not None:
                    report.problems.append(Problem(
                        "commitlog", _rel(store, mf.path), pos,
                        f"{resume - pos} bytes unreadable; records resume at {resume}"))
                    pos = resume
                    continue
            break
    if not offsets:
        return _Records(np.empty(0, np.int64), np.empty(0, np.int64))
    return _Records(np.concatenate(offsets), np.concatenate(sizes))


_MAGICS = [(m & 0xFFFFFFFF).to_bytes(4, "big")
           for m in (F.MESSAGE_MAGIC_CODE, F.MESSAGE_MAGIC_CODE_V2)]


def _resync(mf, start):
    """The next position after damage where a record starts: its magic is in place and its
    PHYSICALOFFSET names that very position (recovery would stop at the damage; verify goes
    on, so one flipped byte is one problem, not a whole file of them)."""
    mm = mf.mm
    pos = start
    while True:
        hits = [i for i in (mm.find(magic, pos + 4) for magic in _MAGICS) if i >= 0]
        if not hits:
            return None
        q = min(hits) - 4
        if q + 36 <= mf.file_size and \
                int.from_bytes(mm[q + 28:q + 36], "big") == mf.file_from_offset + q:
            return q
        pos = q + 1


def _expected_tags_code(store, m):
    props = m.properties
    if m.topic == F.SCHEDULE_TOPIC and props.get(PROPERTY_DELAY):
        try:
            level = int(props[PROPERTY_DELAY])
        except ValueError:
            level = 0
        if level > 0:
            levels = store.config.delay_levels
            return m.store_timestamp + levels[min(level, len(levels)) - 1]
    tags = props.get("TAGS")
    return java_string_hash(tags) if tags else 0


def _check_consume_queues(store, report, good, progress):
    for cq in store.all_consume_queues():
        lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue
        units = cq.units(lo, hi - lo)
        found = good.size_at(units["offset"].astype(np.int64))
        for i, (off, size, tags) in enumerate(units.tolist()):
            index = lo + i
            f = cq.mfq.find_by_offset(index * F.CQ_STORE_UNIT_SIZE)
            where = (_rel(store, f.path) if f else f"consumequeue/{cq.topic}/{cq.queue_id}",
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
            try:
                m = MessageExt.decode(store.commitlog.get_data(off, size))
            except (CorruptRecordError, TypeError):
                report.problems.append(Problem("consumequeue", where[0], where[1],
                                               f"unit {index}: record at {off} unreadable"))
                continue
            if (m.topic, m.queue_id, m.queue_offset) != (cq.topic, cq.queue_id, index):
                report.problems.append(Problem(
                    "consumequeue", where[0], where[1],
                    f"unit {index} points at a record of {m.topic}-{m.queue_id} "
                    f"offset {m.queue_offset}"))
            elif tags != _expected_tags_code(store, m):
                report.problems.append(Problem(
                    "consumequeue", where[0], where[1],
                    f"unit {index} tagsCode {tags} != {_expected_tags_code(store, m)}"))
        progress(0)


def _check_index(store, report, good):
    """Every entry of every IndexFile: it points at a valid record that carries its key
    (topic#UNIQ_KEY or topic#each KEYS piece), its chain link points back inside the file,
    and the header agrees with the entries and slots."""
    service = getattr(store, "_indexer", None)
    if service is None:
        return
    from .index_service import index_keys
    k = store.kernels
    for f in list(service.index_file_list):
        rel = _rel(store, f.path)
        header, slots, entries = f.arrays()
        try:
            count = int(header["index_count"][0])
            if not 1 <= count <= f.index_num:
                report.problems.append(Problem("index", rel, 36,
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
            found = good.size_at(offsets)
            hashes = used["key_hash"].tolist()
            for j, (off, size) in enumerate(zip(offsets.tolist(), found.tolist())):
                where = base + (j + 1) * F.INDEX_ENTRY_SIZE
                if size < 0:
                    report.problems.append(Problem(
                        "index", rel, where, f"entry {j + 1} points at {off}, where no valid "
                        "record starts"))
                    continue
                m = MessageExt.decode(store.commitlog.get_data(off, size))
                topic = m.topic.encode()
                keys = {k.index_hash(topic + b"#" + key)
                        for key in index_keys(m.properties_string.encode())}
                if hashes[j] not in keys:
                    report.problems.append(Problem(
                        "index", rel, where, f"entry {j + 1}: no key of the record at {off} "
                        f"hashes to {hashes[j]}"))
        finally:
            del header, slots, entries        # the views pin the mapping


def _check_checkpoint(store, report, good):
    ckpt = store.checkpoint
    if ckpt is None:
        return
    last_ts = 0
    if good.last >= 0:
        m = store.look_message_by_offset(good.last)
        last_ts = m.store_timestamp if m else 0
    for name in ("physic_msg_timestamp", "logics_msg_timestamp"):
        value = getattr(ckpt, name)
        if value < 0 or (last_ts and value > last_ts + 3000):
            report.problems.append(Problem(
                "checkpoint", "checkpoint", -1,
                f"{name} {value} is later than the last record ({last_ts})"))


def _check_configs(store, report):
    config_dir = os.path.join(store.root, "config")
    if not os.path.isdir(config_dir):
        return
    for name in sorted(os.listdir(config_dir)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(config_dir, name)
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8")
            json.loads(_quote_int_keys(text))
        except (ValueError, OSError) as exc:
            report.problems.append(Problem("config", _rel(store, path), -1,
                                           f"does not parse: {exc}"))


def _quote_int_keys(text):
    """fastjson writes offset tables with bare int keys ({0:3}); make them JSON for checking."""
    import re
    return re.sub(r"([{,]\s*)(-?\d+)(\s*:)", r'\1"\2"\3', text)


def _check_names(store, report):
    """Files that load left alone (not a store file name) and links a write would follow."""
    for rel in store.stray_files():
        kind = rel.split(os.sep)[0]
        report.problems.append(Problem(kind if kind in ("consumequeue", "index") else
                                       "commitlog", rel, -1,
                                       "not a store file name: ignored and left as it is"))
    for path, why in store.unsafe_links():
        report.problems.append(Problem("link", _rel(store, path), -1,
                                       f"{why}: a writable open refuses the store"))


def verify_store(store, progress=None):
    """Check every file of a loaded (read-only) store; returns a VerifyReport."""
    progress = progress or (lambda n: None)
    report = VerifyReport()
    good = _check_commitlog(store, report, progress)
    _check_consume_queues(store, report, good, progress)
    _check_index(store, report, good)
    _check_checkpoint(store, report, good)
    _check_configs(store, report)
    _check_names(store, report)
    return report
