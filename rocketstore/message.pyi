# SPDX-License-Identifier: Apache-2.0
# Types of rocketstore.message (checked against the module by mypy.stubtest).
from collections.abc import Iterable, Mapping
from typing import Any, Optional, TypeVar, Union

from .errors import CorruptRecordError as CorruptRecordError
from .errors import MessageIllegalError as MessageIllegalError

_Host = tuple[str, int]
_Buffer = Union[bytes, bytearray, memoryview]
_M = TypeVar('_M', bound=Iterable[Optional['MessageExt']])

PROPERTY_KEYS: str
PROPERTY_TAGS: str
PROPERTY_DELAY: str
PROPERTY_UNIQ_KEY: str
PROPERTY_REAL_TOPIC: str
PROPERTY_REAL_QID: str
PROPERTY_WAIT: str
KEY_SEPARATOR: str
PY_LAZY_FIELDS: dict[str, property]

def topic_problem(topic: object, max_bytes: Optional[int] = 127) -> Optional[str]: ...
def topic_bytes_problem(raw: _Buffer) -> Optional[str]: ...
def valid_topic_bytes(raw: _Buffer) -> bool: ...
def body_bytes(body: object) -> _Buffer: ...
def java_string_hash(text: str) -> int: ...
def hashmap_order(names: Iterable[str]) -> list[str]: ...
def properties_to_string(props: Mapping[str, str]) -> str: ...
def string_to_properties(text: str) -> dict[str, str]: ...
def tags_code_of(tags: Optional[str]) -> int: ...
def keep_stored(messages: _M) -> _M: ...
def compressed_message(msg: Message, threshold: int, level: int) -> Message: ...
def pack_host(host: _Host) -> tuple[bytes, bool]: ...
def unpack_host(raw: bytes) -> _Host: ...
def host_to_string(host: _Host) -> str: ...
def make_msg_id(store_host_packed: bytes, phy_offset: int) -> str: ...
def decode_msg_id(msg_id: str) -> tuple[_Host, int]: ...

class _Keyed:
    @property
    def tags(self) -> Optional[str]: ...
    @property
    def keys(self) -> Optional[str]: ...

class Message(_Keyed):
    topic: str
    body: Any
    queue_id: int
    flag: int
    properties: dict[str, str]
    born_timestamp: int
    born_host: _Host
    store_host: Optional[_Host]
    sys_flag: int
    reconsume_times: int
    prepared_transaction_offset: int
    def __init__(self, topic: str, body: Any = b'', tags: Optional[str] = None,
                 keys: Union[str, Iterable[str], None] = None, queue_id: int = 0, flag: int = 0,
                 properties: Optional[Mapping[str, str]] = None, born_timestamp: int = 0,
                 born_host: _Host = ('127.0.0.1', 0), store_host: Optional[_Host] = None,
                 sys_flag: int = 0, reconsume_times: int = 0,
                 prepared_transaction_offset: int = 0) -> None: ...
    @property
    def delay_time_level(self) -> int: ...

class MessageExt(_Keyed):
    LENT_SLOTS: tuple[str, ...]
    store_size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    born_timestamp: int
    born_host_raw: bytes
    store_timestamp: int
    store_host_raw: bytes
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    stored_body: bytes
    topic: str
    magic: int
    @property
    def where(self) -> str: ...
    @property
    def compressed(self) -> bool: ...
    @property
    def compression(self) -> Optional[str]: ...
    def keep_stored(self) -> MessageExt: ...
    @classmethod
    def decode(cls, rec: _Buffer, check_crc: bool = False) -> MessageExt: ...
    @classmethod
    def from_row(cls, buf: _Buffer, row: Any, topic: Optional[str] = None) -> MessageExt: ...
    @property
    def properties_string(self) -> str: ...
    @property
    def properties(self) -> dict[str, str]: ...
    @property
    def born_host(self) -> _Host: ...
    @property
    def store_host(self) -> _Host: ...
    @property
    def msg_id(self) -> str: ...
    @property
    def transaction_type(self) -> int: ...
    def to_dict(self, cq_tags_code: Optional[int] = None,
                decompress: bool = True) -> dict[str, Any]: ...
