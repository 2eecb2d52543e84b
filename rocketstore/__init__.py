# SPDX-License-Identifier: Apache-2.0
"""rocketstore: Apache RocketMQ's message store, embedded in Python, byte-compatible with a
broker's store directory. See README.md."""
from ._version import __version__
from .config import BrokerRole, FlushDiskType, StoreConfig
from .errors import (ConfigError, CorruptBodyError, CorruptRecordError, InvalidArgumentError,
                     MessageIllegalError, MissingCodecError, StoreClosedError, StoreError,
                     StoreLoadError, StoreLockedError, UnsafePathError)
from .kernels import BACKEND
from .live import LiveReader
from .message import Message, MessageExt
from .recovery import RecoveryReport
from .status import (AppendStatus, GetMessageResult, GetMessageStatus, PutMessageResult,
                     PutMessagesResult, PutMessageStatus, QueryMessageResult)
from .store import MessageStore
from .subscription import Subscription, parse_subscription

__all__ = [
    "__version__", "BACKEND", "MessageStore", "LiveReader", "StoreConfig", "FlushDiskType",
    "BrokerRole",
    "Message", "MessageExt", "PutMessageStatus", "GetMessageStatus", "AppendStatus",
    "PutMessageResult", "PutMessagesResult", "GetMessageResult", "QueryMessageResult",
    "RecoveryReport", "Subscription", "parse_subscription",
    "StoreError", "StoreLockedError", "StoreClosedError", "StoreLoadError", "UnsafePathError",
    "MessageIllegalError", "CorruptRecordError", "ConfigError", "InvalidArgumentError",
    "CorruptBodyError", "MissingCodecError",
]
