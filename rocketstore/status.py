# SPDX-License-Identifier: Apache-2.0
"""Statuses and results with RocketMQ's names (PutMessageStatus.java, GetMessageStatus.java)."""
import enum


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPEDFILE_FAILED = "CREATE_MAPEDFILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    LMQ_CONSUME_QUEUE_NUM_EXCEEDED = "LMQ_CONSUME_QUEUE_NUM_EXCEEDED"

    @property
    def ok(self):
        """The message is stored (a flush or slave timeout still stored it)."""
        return self in (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT,
                        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
                        PutMessageStatus.SLAVE_NOT_AVAILABLE)


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class AppendStatus(enum.Enum):
    """AppendMessageStatus: the outcome of one append into the current file."""
    PUT_OK = "PUT_OK"
    END_OF_FILE = "END_OF_FILE"
    MESSAGE_SIZE_EXCEEDED = "MESSAGE_SIZE_EXCEEDED"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


def _untracked(cls):
    """`cls`, a __slots__ class, rebuilt by the compiled module where it imports as a class
    the garbage collector does not track, with the same members and attributes: even an
    untracked instance of a class statement's class counts toward generation 0's threshold,
    so a program keeping its put results ran a collection every 700 puts. Only for results:
    they refer to statuses, ints, str, bytes and arrays, never back to a container of their
    own (a cycle through one would never be collected). `cls` as it is otherwise."""
    try:
        from .kernels._cext import _untracked_slots_type
    except ImportError:
        return cls
    rebuilt = _untracked_slots_type(f"{cls.__module__}.{cls.__qualname__}", cls.__slots__)
    for name, value in vars(cls).items():
        if name not in cls.__slots__ and name not in ("__slots__", "__module__", "__dict__",
                                                      "__weakref__", "__qualname__"):
            setattr(rebuilt, name, value)
    return rebuilt


@_untracked
class PutMessageResult:
    """What put_message returns. msg_id is derived on first use; `reason` says why a put was
    refused (disk full, file creation failed), None otherwise."""

    __slots__ = ("status", "commit_log_offset", "queue_offset", "store_timestamp",
                 "wrote_bytes", "_store_host_raw", "reason")
    # The private slot the compiled put path (pyx/_put.pxi) fills when it builds a result.
    LENT_SLOTS = ("_store_host_raw",)

    def __init__(self, status, commit_log_offset=-1, queue_offset=-1, store_timestamp=0,
                 wrote_bytes=0, store_host_raw=b"", reason=None):
        self.status = status
        self.reason = reason
        self.commit_log_offset = commit_log_offset
        self.queue_offset = queue_offset
        self.store_timestamp = store_timestamp
        self.wrote_bytes = wrote_bytes
        self._store_host_raw = store_host_raw

    @property
    def msg_id(self):
        from .message import make_msg_id
        if self.commit_log_offset < 0:
            return None
        return make_msg_id(self._store_host_raw, self.commit_log_offset)

    @property
    def ok(self):
        return self.status.ok

    def __repr__(self):
        why = f", reason={self.reason!r}" if self.reason else ""
        return (f"PutMessageResult({self.status.name}, commit_log_offset="
                f"{self.commit_log_offset}, queue_offset={self.queue_offset}, "
                f"wrote_bytes={self.wrote_bytes}{why})")


@_untracked
class PutMessagesResult:
    """What put_messages returns: arrays, not one object per message. On a refusal `count`
    says how many of the first messages were stored and `reason` says why."""

    __slots__ = ("status", "count", "commit_log_offsets", "queue_offsets", "sizes",
                 "store_timestamp", "wrote_bytes", "_store_host_raws", "reason")
    # The private slot the compiled put_list (pyx/_put.pxi) fills when it builds a result.
    LENT_SLOTS = ("_store_host_raws",)

    def __init__(self, status, count, commit_log_offsets, queue_offsets, sizes,
                 store_timestamp, wrote_bytes, store_host_raws=(), reason=None):
        self.status = status
        self.reason = reason
        self.count = count
        self.commit_log_offsets = commit_log_offsets
        self.queue_offsets = queue_offsets
        self.sizes = sizes
        self.store_timestamp = store_timestamp
        self.wrote_bytes = wrote_bytes
        self._store_host_raws = store_host_raws

    @property
    def msg_ids(self):
        """Offset msgIds of every stored message, in order."""
        from .message import make_msg_id
        hosts = self._store_host_raws
        if type(hosts) is bytes:        # one store host for all (put_batch, compiled paths)
            return [make_msg_id(hosts, int(o)) for o in self.commit_log_offsets]
        return [make_msg_id(h, int(o)) for h, o in zip(hosts, self.commit_log_offsets)]

    @property
    def msg_id(self):
        """RocketMQ's batch answer: the comma-joined offset msgIds."""
        return ",".join(self.msg_ids)

    @property
    def ok(self):
        return self.status.ok

    def __repr__(self):
        return f"PutMessagesResult({self.status.name}, count={self.count})"


class GetMessageResult:
    """What get_message returns (GetMessageResult.java): the status, the offset to read on
    from, the queue's min/max offsets and the messages found. `filtered_count` is how many
    units the call's filters (a subscription, message_filter, property_filter) left out;
    next_begin_offset is past them."""
    __slots__ = ("status", "next_begin_offset", "min_offset", "max_offset", "messages",
                 "suggest_pulling_from_slave", "filtered_count")

    def __init__(self, status, next_begin_offset, min_offset, max_offset, messages=None,
                 suggest_pulling_from_slave=False, filtered_count=0):
        self.status = status
        self.filtered_count = filtered_count
        self.next_begin_offset = next_begin_offset
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.messages = messages if messages is not None else []
        self.suggest_pulling_from_slave = suggest_pulling_from_slave

    @property
    def message_count(self):
        return len(self.messages)

    def __repr__(self):
        return (f"GetMessageResult({self.status.name}, next_begin_offset="
                f"{self.next_begin_offset}, min={self.min_offset}, max={self.max_offset}, "
                f"messages={len(self.messages)}, filtered={self.filtered_count})")


class QueryMessageResult:
    """QueryMessageResult: the messages a key query found (MessageExt, ascending offset), and
    the newest index file's end timestamp and phy offset when the query ran
    (indexLastUpdateTimestamp / indexLastUpdatePhyoffset, which a client uses to tell how
    current the index was)."""

    __slots__ = ("messages", "index_last_update_timestamp", "index_last_update_phy_offset",
                 "buffer_total_size")

    def __init__(self, messages=None, index_last_update_timestamp=0,
                 index_last_update_phy_offset=0, buffer_total_size=0):
        self.messages = messages if messages is not None else []
        self.index_last_update_timestamp = index_last_update_timestamp
        self.index_last_update_phy_offset = index_last_update_phy_offset
        self.buffer_total_size = buffer_total_size

    @property
    def message_count(self):
        return len(self.messages)

    def __repr__(self):
        return (f"QueryMessageResult(messages={len(self.messages)}, index_last_update_timestamp="
                f"{self.index_last_update_timestamp}, index_last_update_phy_offset="
                f"{self.index_last_update_phy_offset})")
