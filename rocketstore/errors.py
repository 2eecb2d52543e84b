# SPDX-License-Identifier: Apache-2.0
"""Exception hierarchy, and the one table that maps kernel status codes to exceptions.

Every backend (cext, cffi, pure) raises through `raise_for_status`, so a bad buffer gives the
same exception whichever kernel ran.
"""
import errno as _errno
import os as _os

# Kernel status codes (csrc/rs_common.h)
RS_OK = 0
RS_E_BOUNDS = -1     # a read or write would leave the caller's buffer
RS_E_ARG = -2        # an argument is out of its domain (host length vs sysflag, negative length)
RS_E_MAGIC = -3      # not a record magic
RS_E_CRC = -4        # body CRC mismatch
RS_E_SIZE = -5       # parsed field lengths disagree with TOTALSIZE
RS_E_TOO_LONG = -6   # topic or properties longer than the record format allows
RS_E_ERRNO_BASE = -1000  # rs_sync returns RS_E_ERRNO_BASE - errno


class StoreError(Exception):
    """Base of every rocketstore error."""


class StoreLockedError(StoreError):
    """Another MessageStore (in this or another process) holds the store directory's lock."""


class StoreClosedError(StoreError):
    """The store is shut down, or was never started."""


class StoreLoadError(StoreError):
    """A store directory cannot be loaded (wrong file sizes, unreadable files)."""


class WorkloadCheckError(StoreError):
    """A benchmark's puts were refused, or its messages do not read back as they were put."""


class UnsafePathError(StoreLoadError):
    """A store file or directory is a symbolic link that a write would follow out of the
    store (or onto another file): the store refuses rather than write through it."""


class MessageIllegalError(StoreError, ValueError):
    """A message breaks RocketMQ's put-time rules; `status` names the PutMessageStatus."""

    def __init__(self, message, status="MESSAGE_ILLEGAL"):
        super().__init__(f"{status}: {message}")
        self.status = status


class CorruptRecordError(StoreError, ValueError):
    """Bytes that should hold a record do not (outside recovery, which never raises)."""


class CorruptBodyError(StoreError, ValueError):
    """A compressed message body does not decompress (doc/01 §3.5): raised for that message
    when its body is asked for; scans (iter_messages, dump, export) report it and go on."""


class MissingCodecError(StoreError, ImportError):
    """A message body is compressed with a codec whose optional package is not installed; the
    message names the extra to install (rocketstore[lz4], rocketstore[zstd])."""


class KernelBoundsError(StoreError, ValueError):
    """A kernel was asked to read or write past the end of its buffer."""


class KernelArgumentError(StoreError, ValueError):
    """A kernel argument is outside its domain."""


class ConfigError(StoreError, ValueError):
    """A configuration value is invalid."""


class InvalidArgumentError(StoreError, ValueError):
    """An argument of a public MessageStore method is outside its domain."""


_STATUS = {
    RS_E_BOUNDS: (KernelBoundsError, "buffer too small"),
    RS_E_ARG: (KernelArgumentError, "invalid argument"),
    RS_E_MAGIC: (CorruptRecordError, "bad magic code"),
    RS_E_CRC: (CorruptRecordError, "body CRC mismatch"),
    RS_E_SIZE: (CorruptRecordError, "record length mismatch"),
    RS_E_TOO_LONG: (MessageIllegalError, "topic or properties too long"),
}


def raise_for_status(code, what=""):
    """Raise the exception for a negative kernel status; return `code` otherwise."""
    if code >= 0:
        return code
    if code <= RS_E_ERRNO_BASE:
        err = RS_E_ERRNO_BASE - code
        raise OSError(err, _os.strerror(err) if err else "unknown", what or None)
    cls, text = _STATUS.get(code, (StoreError, f"kernel status {code}"))
    msg = f"{what}: {text}" if what else text
    raise cls(msg)


__all__ = [name for name in dir() if name.endswith("Error")] + ["raise_for_status"]
del _errno
