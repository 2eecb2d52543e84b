# SPDX-License-Identifier: Apache-2.0
"""Argument checks of MessageStore's public methods. A wrong type raises TypeError, a value
out of its domain InvalidArgumentError, a bad message field MessageIllegalError; each names
the argument, and each is raised before anything is read, created or written."""
import operator

from .message import topic_problem
from .errors import InvalidArgumentError, MessageIllegalError, StoreError
from .format import MAX_TOPIC_LENGTH

INT32_MAX = 0x7FFFFFFF
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _type_name(value):
    return type(value).__name__


def check_str(value, name):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {_type_name(value)}")
    return value


def check_int(value, name, lo=None, hi=None):
    """`value` as an int (numpy integers accepted, bool refused) within [lo, hi]."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, not {_type_name(value)}") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise InvalidArgumentError(f"{name} is {value}; it must be within "
                                   f"[{'-inf' if lo is None else lo}, "
                                   f"{'inf' if hi is None else hi}]")
    return value


def check_optional_int(value, name, lo=None, hi=None):
    return None if value is None else check_int(value, name, lo, hi)


def check_topic(topic, name="topic"):
    """A topic a put accepts (message.topic_problem): a queue's directory is named after it,
    so nothing else may reach the file system."""
    check_str(topic, name)
    why = topic_problem(topic, MAX_TOPIC_LENGTH)
    if why is not None:
        raise InvalidArgumentError(f"{name}: {why}")
    return topic


def check_queue(topic, queue_id):
    check_topic(topic)
    check_int(queue_id, "queue_id", 0, INT32_MAX)


def check_offset_query(group, topic, queue_id):
    """A consumer offset's key, as query_offset takes it (MessageStore and LiveReader)."""
    check_str(group, "group")
    check_str(topic, "topic")
    check_int(queue_id, "queue_id")


def check_offset_commit(group, topic, queue_id, offset):
    """A consumer offset to record, as commit_offset takes it (MessageStore and
    LiveReader): a queue a put could name, and an offset from 0."""
    check_str(group, "group")
    check_queue(topic, queue_id)
    check_int(offset, "offset", 0)


def check_callable(value, name):
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, not {_type_name(value)}")


# ---- messages: explained only after a put failed, so the put path pays nothing ------------

def _bytes_like(value):
    try:
        memoryview(value).release()
        return True
    except TypeError:
        return False


def _host_problem(host, name):
    if not (isinstance(host, tuple) and len(host) == 2 and isinstance(host[0], str)
            and isinstance(host[1], int) and not isinstance(host[1], bool)):
        return f"{name} must be a (host str, port int) tuple, not {host!r}"
    return None


def message_problem(msg):
    """Why `msg` cannot be encoded, as one sentence; None when nothing is visibly wrong."""
    from .message import Message
    if not isinstance(msg, Message):
        return f"a Message is required, not {_type_name(msg)}"
    if msg.body is not None and not _bytes_like(msg.body):
        return f"body must be bytes-like or None, not {_type_name(msg.body)}"
    if not isinstance(msg.properties, dict):
        return f"properties must be a dict, not {_type_name(msg.properties)}"
    for field, lo, hi in (("queue_id", 0, INT32_MAX), ("flag", -INT32_MAX - 1, INT32_MAX),
                          ("sys_flag", 0, INT32_MAX),
                          ("reconsume_times", -INT32_MAX - 1, INT32_MAX),
                          ("born_timestamp", INT64_MIN, INT64_MAX),
                          ("prepared_transaction_offset", INT64_MIN, INT64_MAX)):
        value = getattr(msg, field)
        if not isinstance(value, int):          # bool is one: every put path takes it
            return f"{field} must be an int, not {_type_name(value)}"
        if not lo <= value <= hi:
            return f"{field} is {value}; it must be within [{lo}, {hi}]"
    problem = _host_problem(msg.born_host, "born_host")
    if problem is None and msg.store_host is not None:
        problem = _host_problem(msg.store_host, "store_host")
    return problem


def explain_put_failure(msgs, exc):
    """Called in an `except` around a put that raised `exc`: raise a clear error naming the
    bad message or field instead, or return so the caller re-raises `exc` (a StoreError is
    already clear, and one the checks cannot explain is a bug to see as it is)."""
    if isinstance(exc, StoreError):
        return
    for i, msg in enumerate(msgs):
        problem = message_problem(msg)
        if problem is not None:
            where = "" if len(msgs) == 1 else f"message {i}: "
            if not problem.startswith("a Message"):
                raise MessageIllegalError(where + problem) from None
            raise TypeError(where + problem) from None
