# SPDX-License-Identifier: Apache-2.0
"""Dispatchers: what the reput thread (and abnormal recovery) does with each new record.

A dispatcher gets a batch: `rows`, tuples in format.SCAN_DTYPE field order as commitlog_scan
returned them, and `buf`, the buffer they were scanned from (so topic and properties bytes can
be sliced at row.pos + *_off). The index dispatcher of issue 2 plugs in here.
"""
import array
import logging

from . import format as F
from .message import PROPERTY_DELAY, string_to_properties

log = logging.getLogger(__name__)

# Row field positions (format.SCAN_DTYPE order)
R_POS, R_PHY, R_QOFF, R_TAGS, R_STORE_TS = 0, 1, 2, 3, 4
R_SIZE, R_QID, R_SYSFLAG = 7, 8, 9
R_BODY_OFF, R_BODY_LEN = 13, 14
R_TOPIC_OFF, R_TOPIC_LEN, R_PROPS_OFF, R_PROPS_LEN, R_INFO = 15, 16, 17, 18, 19

_SKIP_CQ = (F.TRANSACTION_PREPARED_TYPE, F.TRANSACTION_ROLLBACK_TYPE)


class Dispatcher:
    def dispatch(self, rows, buf):
        raise NotImplementedError  # pragma: no cover


def row_properties(row, buf):
    pos = row[R_POS] + row[R_PROPS_OFF]
    return string_to_properties(bytes(buf[pos:pos + row[R_PROPS_LEN]]).decode("utf-8",
                                                                               "replace"))


def row_topic(row, buf):
    pos = row[R_POS] + row[R_TOPIC_OFF]
    return bytes(buf[pos:pos + row[R_TOPIC_LEN]]).decode("utf-8", "replace")


class ConsumeQueueDispatcher(Dispatcher):
    """CommitLogDispatcherBuildConsumeQueue: NOT and COMMIT records get a unit in their queue."""

    def __init__(self, store):
        self._store = store
        self._delay_levels = store.config.delay_levels

    def _schedule_tags_code(self, row, buf):
        """SCHEDULE_TOPIC_XXXX units carry the delivery time (spec 01 §3.7)."""
        props = row_properties(row, buf)
        try:
            level = int(props.get(PROPERTY_DELAY) or 0)
        except ValueError:
            return row[R_TAGS]
        if level <= 0:
            return row[R_TAGS]
        level = min(level, len(self._delay_levels))
        return row[R_STORE_TS] + self._delay_levels[level - 1]

    def dispatch(self, rows, buf):
        store = self._store
        find = store.find_consume_queue_raw
        groups = {}
        last_ts = 0
        for row in rows:
            if row[R_SYSFLAG] & F.TRANSACTION_TYPE_MASK in _SKIP_CQ:
                continue
            pos = row[R_POS] + row[R_TOPIC_OFF]
            cq = find(buf[pos:pos + row[R_TOPIC_LEN]], row[R_QID])
            tags = row[R_TAGS]
            if row[R_INFO] & F.SCAN_INFO_SCHEDULE:
                tags = self._schedule_tags_code(row, buf)
            g = groups.get(cq)
            qoff = row[R_QOFF]
            if g is None or g[3] + len(g[0]) != qoff:
                if g is not None:
                    self._flush_group(cq, g)
                groups[cq] = g = (array.array("q"), array.array("i"), array.array("q"), qoff)
            g[0].append(row[R_PHY])
            g[1].append(row[R_SIZE])
            g[2].append(tags)
            last_ts = row[R_STORE_TS]
        for cq, g in groups.items():
            self._flush_group(cq, g)
        if last_ts:
            store.checkpoint.logics_msg_timestamp = last_ts

    @staticmethod
    def _flush_group(cq, g):
        offsets, sizes, tags, first = g
        if len(offsets) == 1:
            cq.put_unit(offsets[0], sizes[0], tags[0], first)
        else:
            cq.put_units(offsets, sizes, tags, first)
