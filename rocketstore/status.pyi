# SPDX-License-Identifier: Apache-2.0
# Types of rocketstore.status (checked against the module by mypy.stubtest).
import enum
from typing import Optional

import numpy as np
import numpy.typing as npt

from .message import MessageExt

class PutMessageStatus(enum.Enum):
    PUT_OK = 'PUT_OK'
    FLUSH_DISK_TIMEOUT = 'FLUSH_DISK_TIMEOUT'
    FLUSH_SLAVE_TIMEOUT = 'FLUSH_SLAVE_TIMEOUT'
    SLAVE_NOT_AVAILABLE = 'SLAVE_NOT_AVAILABLE'
    SERVICE_NOT_AVAILABLE = 'SERVICE_NOT_AVAILABLE'
    CREATE_MAPEDFILE_FAILED = 'CREATE_MAPEDFILE_FAILED'
    MESSAGE_ILLEGAL = 'MESSAGE_ILLEGAL'
    PROPERTIES_SIZE_EXCEEDED = 'PROPERTIES_SIZE_EXCEEDED'
    OS_PAGECACHE_BUSY = 'OS_PAGECACHE_BUSY'
    UNKNOWN_ERROR = 'UNKNOWN_ERROR'
    LMQ_CONSUME_QUEUE_NUM_EXCEEDED = 'LMQ_CONSUME_QUEUE_NUM_EXCEEDED'
    @property
    def ok(self) -> bool: ...

class GetMessageStatus(enum.Enum):
    FOUND = 'FOUND'
    NO_MATCHED_MESSAGE = 'NO_MATCHED_MESSAGE'
    MESSAGE_WAS_REMOVING = 'MESSAGE_WAS_REMOVING'
    OFFSET_FOUND_NULL = 'OFFSET_FOUND_NULL'
    OFFSET_OVERFLOW_BADLY = 'OFFSET_OVERFLOW_BADLY'
    OFFSET_OVERFLOW_ONE = 'OFFSET_OVERFLOW_ONE'
    OFFSET_TOO_SMALL = 'OFFSET_TOO_SMALL'
    NO_MATCHED_LOGIC_QUEUE = 'NO_MATCHED_LOGIC_QUEUE'
    NO_MESSAGE_IN_QUEUE = 'NO_MESSAGE_IN_QUEUE'

class AppendStatus(enum.Enum):
    PUT_OK = 'PUT_OK'
    END_OF_FILE = 'END_OF_FILE'
    MESSAGE_SIZE_EXCEEDED = 'MESSAGE_SIZE_EXCEEDED'
    PROPERTIES_SIZE_EXCEEDED = 'PROPERTIES_SIZE_EXCEEDED'
    UNKNOWN_ERROR = 'UNKNOWN_ERROR'

class PutMessageResult:
    LENT_SLOTS: tuple[str, ...]
    status: PutMessageStatus
    reason: Optional[str]
    commit_log_offset: int
    queue_offset: int
    store_timestamp: int
    wrote_bytes: int
    def __init__(self, status: PutMessageStatus, commit_log_offset: int = -1,
                 queue_offset: int = -1, store_timestamp: int = 0, wrote_bytes: int = 0,
                 store_host_raw: bytes = b'', reason: Optional[str] = None) -> None: ...
    @property
    def msg_id(self) -> str: ...
    @property
    def ok(self) -> bool: ...

class PutMessagesResult:
    LENT_SLOTS: tuple[str, ...]
    status: PutMessageStatus
    reason: Optional[str]
    count: int
    commit_log_offsets: npt.NDArray[np.int64]
    queue_offsets: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    store_timestamp: int
    wrote_bytes: int
    def __init__(self, status: PutMessageStatus, count: int,
                 commit_log_offsets: npt.NDArray[np.int64], queue_offsets: npt.NDArray[np.int64],
                 sizes: npt.NDArray[np.int64], store_timestamp: int, wrote_bytes: int,
                 store_host_raws: object = (), reason: Optional[str] = None) -> None: ...
    @property
    def msg_ids(self) -> list[str]: ...
    @property
    def msg_id(self) -> str: ...
    @property
    def ok(self) -> bool: ...

class GetMessageResult:
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt]
    suggest_pulling_from_slave: bool
    filtered_count: int
    def __init__(self, status: GetMessageStatus, next_begin_offset: int, min_offset: int,
                 max_offset: int, messages: Optional[list[MessageExt]] = None,
                 suggest_pulling_from_slave: bool = False, filtered_count: int = 0) -> None: ...
    @property
    def message_count(self) -> int: ...

class QueryMessageResult:
    messages: list[MessageExt]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int
    buffer_total_size: int
    def __init__(self, messages: Optional[list[MessageExt]] = None,
                 index_last_update_timestamp: int = 0, index_last_update_phy_offset: int = 0,
                 buffer_total_size: int = 0) -> None: ...
    @property
    def message_count(self) -> int: ...
