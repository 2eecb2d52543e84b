# SPDX-License-Identifier: Apache-2.0
"""The broker's JSON config files under `<root>/config/` (doc/04 §4).

`topics.json`, `subscriptionGroup.json`, `consumerOffset.json` and `delayOffset.json` are
written in fastjson's pretty dialect, byte for byte as a 4.9.x broker writes them (tab
indentation, bean members in alphabetical order, integer-keyed maps as `{0:3,1:0` on one line),
so a Java broker reads ours; the reader also takes Gson's whitespace and quoted integer keys,
so we read a broker's. Members we do not model (5.x `attributes`, `stateVersion`, ...) are
kept and written back.
"""
import contextlib
import dataclasses
import logging
import os
import threading
from typing import Optional
from dataclasses import dataclass, field

from .codec.fastjson import bean, parse_fastjson, to_fastjson
from .errors import StoreClosedError

log = logging.getLogger(__name__)

TOPIC_GROUP_SEPARATOR = "@"
PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4


def _int(value):
    """int(value), with fastjson's number forms; OverflowError (1e400 -> inf) becomes the
    ValueError every decode() is allowed to raise."""
    try:
        return int(value)
    except OverflowError as exc:
        raise ValueError(f"not an int: {value!r}") from exc


def _int_map(obj, what):
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise ValueError(f"{what} is not an object")
    return {int(k): _int(v) for k, v in obj.items()}


def _object(obj, what):
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise ValueError(f"{what} is not an object")
    return obj


# ---- value types --------------------------------------------------------------------------

def _camel(name):
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


class _JsonBean:
    """Dataclass <-> fastjson bean with Java member names; unknown members kept in `extra`."""

    def to_json_obj(self):
        members = {_camel(f.name): getattr(self, f.name) for f in dataclasses.fields(self)
                   if f.name != "extra"}
        members.update(self.extra)
        return bean(**members)

    @classmethod
    def from_json_obj(cls, obj):
        obj = _object(obj, cls.__name__)
        names = {_camel(f.name): f for f in dataclasses.fields(cls) if f.name != "extra"}
        kwargs, extra = {}, {}
        for key, value in obj.items():
            f = names.get(key)
            if f is None:
                extra[key] = value
            elif value is not None:
                kwargs[f.name] = _coerce(f, value)
        return cls(**kwargs, extra=extra)


def _coerce(f, value):
    kind = f.type
    if kind in ("int", int):
        return _int(value)
    if kind in ("bool", bool):
        return value if isinstance(value, bool) else str(value).lower() == "true"
    if kind in ("str", str):
        return str(value)
    return value


@dataclass
class DataVersion(_JsonBean):
    """`DataVersion`: bumped (timestamp = now, counter + 1) on every table change."""
    counter: int = 0
    timestamp: int = 0
    extra: dict = field(default_factory=dict, repr=False)

    def next_version(self, now_ms):
        self.timestamp = now_ms
        self.counter += 1


@dataclass
class TopicConfig(_JsonBean):
    """`TopicConfig` (doc/04 §4.4). perm: 2 write, 4 read, 6 both, 1 inherit."""
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    extra: dict = field(default_factory=dict, repr=False)

    @property
    def is_writeable(self):
        return bool(self.perm & PERM_WRITE)

    @property
    def is_readable(self):
        return bool(self.perm & PERM_READ)


@dataclass
class SubscriptionGroupConfig(_JsonBean):
    """`SubscriptionGroupConfig` with 4.9.x members and defaults."""
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    extra: dict = field(default_factory=dict, repr=False)


# ---- ConfigManager --------------------------------------------------------------------------

# One writer at a time per file: concurrent persists shared `F.tmp` (one truncating what another
# was about to rename: torn files, FileNotFoundError), and one holding an older table could
# rename it over a newer one. Keyed by path, so two managers of one file take turns too.
_file_locks: dict = {}
_file_locks_mutex = threading.Lock()


def _file_lock(path):
    key = os.path.abspath(path)
    with _file_locks_mutex:
        lock = _file_locks.get(key)
        if lock is None:
            lock = _file_locks[key] = threading.Lock()
        return lock


class ConfigManager:
    """One JSON file (`[C]ConfigManager.java`): `encode()`/`decode()` the table, `load()` with
    fallback to `.bak`, `persist()` crash-safe. Subclasses hold their table under `_lock`."""

    file_name: Optional[str] = None

    def __init__(self, root, fs, clock=None, read_only=False):
        self.path = os.path.join(root, "config", self.file_name)
        self._root = root
        self._write_lock = _file_lock(self.path)
        self._fs = fs
        self._clock = clock
        self.read_only = read_only
        self._lock = threading.RLock()
        self._dirty = False
        self._main_corrupt = False
        self.closed = False          # set by close(): changes are refused from then on
        self.loaded_from = None      # "main", "bak" or None (nothing on disk)

    # -- subclass surface --
    def encode(self):
        """The file's text in fastjson's pretty dialect."""
        raise NotImplementedError

    def decode(self, text):
        """Replace the table from `text`; raise ValueError (or KeyError/TypeError) if bad."""
        raise NotImplementedError

    # -- load (doc/04 §4.2) --
    def _read(self, path):
        try:
            data = self._fs.read_bytes(path)
        except FileNotFoundError:
            return None
        # Invalid UTF-8 decodes to U+FFFD as MixAll#file2String's new String(bytes) does; a
        # strict decode raised UnicodeDecodeError out of load() before any .bak fallback.
        return data.decode("utf-8", "replace")

    def load(self):
        """Load the file, else its `.bak`. False only when the main file was unusable and the
        `.bak` is corrupt too (the broker refuses to start then); a missing or empty pair
        means an empty table, True."""
        self.closed = False
        text = self._read(self.path)
        if text and text.strip():
            try:
                with self._lock:
                    self.decode(text)
                self.loaded_from = "main"
                return True
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("%s is corrupt (%s); loading %s.bak", self.path, exc, self.path)
                self._main_corrupt = True
        else:
            log.info("%s is missing or empty; loading %s.bak", self.path, self.path)
        return self.load_bak()

    def load_bak(self):
        bak = self.path + ".bak"
        text = self._read(bak)
        if not text or not text.strip():
            return True
        try:
            with self._lock:
                self.decode(text)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("%s is corrupt too (%s)", bak, exc)
            return False
        log.warning("loaded %s from %s", self.file_name, bak)
        self.loaded_from = "bak"
        # What we loaded must reach the main file even if nothing changes.
        self._dirty = True
        return True

    @contextlib.contextmanager
    def _change(self):
        """Hold the table lock for a change; once close() ran, refuse it: the final persist
        is behind us, and a change taken now would be acknowledged and then lost."""
        with self._lock:
            if self.closed:
                raise StoreClosedError(f"{self.file_name}: the store is shut down; the change "
                                       "is not kept")
            yield

    def close(self):
        """Refuse every later change (StoreClosedError), then persist what changed. Any change
        that came first is in this persist: it encodes under the same lock."""
        with self._lock:
            self.closed = True
        self.persist_if_dirty()

    # -- persist (doc/04 §4.1) --
    def mark_dirty(self):
        self._dirty = True

    @property
    def dirty(self):
        return self._dirty

    def persist(self):
        """Write the file: new content to `F.tmp` + fsync; the current `F` copied to `F.bak` +
        fsync; rename `F.tmp` over `F`; fsync the directory. This is 4.9.x's order
        (string2File) with the fsyncs it lacks and an atomic rename in place of its
        delete + rename, so `F` is never missing: after a crash at any point either `F` or
        `F.bak` holds a complete table. Writers of one file take turns, and each encodes the
        table once its turn has come, so the last rename carries the newest table."""
        if self.read_only:
            return
        fs = self._fs
        directory = os.path.dirname(self.path)
        tmp = self.path + ".tmp"
        with self._write_lock:
            with self._lock:
                text = self.encode()
                self._dirty = False
            fs.ensure_dir(directory, self._root)
            try:
                fs.write_bytes(tmp, text.encode("utf-8"), sync=True)
            except OSError:
                self._dirty = True      # a full disk: the next persist tries again
                raise
            if not self._main_corrupt:
                old = self._read(self.path)
                if old is not None:
                    fs.write_bytes(self.path + ".bak", old.encode("utf-8"), sync=True)
            fs.rename(tmp, self.path)
            fs.fsync_dir(directory)
            self._main_corrupt = False

    def persist_if_dirty(self):
        if self._dirty:
            self.persist()
            return True
        return False

    def _now(self):
        # Called only when a table changes: a replay clock must not be consumed otherwise.
        return self._clock() if self._clock is not None else 0


class TopicConfigManager(ConfigManager):
    """`config/topics.json`: TopicConfigSerializeWrapper (dataVersion, topicConfigTable)."""

    file_name = "topics.json"

    def __init__(self, root, fs, clock=None, read_only=False):
        super().__init__(root, fs, clock, read_only)
        self.topic_config_table = {}
        self.data_version = DataVersion()
        self.extra = {}
        self.on_change = None           # called with the table after every change

    def encode(self):
        table = {name: tc.to_json_obj() for name, tc in self.topic_config_table.items()}
        return to_fastjson(bean(dataVersion=self.data_version.to_json_obj(),
                                topicConfigTable=table, **self.extra))

    def decode(self, text):
        obj = _object(parse_fastjson(text), self.file_name)
        table = {}
        for name, raw in _object(obj.get("topicConfigTable"), "topicConfigTable").items():
            raw = dict(_object(raw, name))
            raw.setdefault("topicName", name)
            table[name] = TopicConfig.from_json_obj(raw)
        version = DataVersion.from_json_obj(obj.get("dataVersion"))
        self.topic_config_table = table
        self.data_version = version
        self.extra = {k: v for k, v in obj.items()
                      if k not in ("topicConfigTable", "dataVersion")}
        self._changed()

    def _changed(self):
        if self.on_change is not None:
            self.on_change(self.topic_config_table)

    def select(self, topic):
        return self.topic_config_table.get(topic)

    def update(self, tc):
        """updateTopicConfig: store, bump the data version, persist at once (as the broker)."""
        with self._change():
            self.topic_config_table = {**self.topic_config_table, tc.topic_name: tc}
            self.data_version.next_version(self._now())
            self._dirty = True
            self._changed()
        self.persist()
        return tc

    def delete(self, topic):
        with self._change():
            if topic not in self.topic_config_table:
                return None
            table = dict(self.topic_config_table)
            old = table.pop(topic)
            self.topic_config_table = table
            self.data_version.next_version(self._now())
            self._dirty = True
            self._changed()
        self.persist()
        return old


class SubscriptionGroupManager(ConfigManager):
    """`config/subscriptionGroup.json` (dataVersion, subscriptionGroupTable)."""

    file_name = "subscriptionGroup.json"

    def __init__(self, root, fs, clock=None, read_only=False):
        super().__init__(root, fs, clock, read_only)
        self.subscription_group_table = {}
        self.data_version = DataVersion()
        self.extra = {}

    def encode(self):
        table = {n: g.to_json_obj() for n, g in self.subscription_group_table.items()}
        return to_fastjson(bean(dataVersion=self.data_version.to_json_obj(),
                                subscriptionGroupTable=table, **self.extra))

    def decode(self, text):
        obj = _object(parse_fastjson(text), self.file_name)
        table = {}
        for name, raw in _object(obj.get("subscriptionGroupTable"),
                                 "subscriptionGroupTable").items():
            raw = dict(_object(raw, name))
            raw.setdefault("groupName", name)
            table[name] = SubscriptionGroupConfig.from_json_obj(raw)
        self.subscription_group_table = table
        self.data_version = DataVersion.from_json_obj(obj.get("dataVersion"))
        self.extra = {k: v for k, v in obj.items()
                      if k not in ("subscriptionGroupTable", "dataVersion")}

    def find(self, group):
        return self.subscription_group_table.get(group)

    def update(self, cfg):
        with self._change():
            self.subscription_group_table = {**self.subscription_group_table,
                                             cfg.group_name: cfg}
            self.data_version.next_version(self._now())
            self._dirty = True
        self.persist()
        return cfg

    def delete(self, group):
        with self._change():
            if group not in self.subscription_group_table:
                return None
            table = dict(self.subscription_group_table)
            old = table.pop(group)
            self.subscription_group_table = table
            self.data_version.next_version(self._now())
            self._dirty = True
        self.persist()
        return old


class ConsumerOffsetManager(ConfigManager):
    """`config/consumerOffset.json`: offsetTable["topic@group"][queue_id] = next offset to
    consume. Persisted by the periodic service, not on every commit (as the broker)."""

    file_name = "consumerOffset.json"

    def __init__(self, root, fs, clock=None, read_only=False):
        super().__init__(root, fs, clock, read_only)
        self.offset_table = {}
        self.extra = {}

    def encode(self):
        table = {k: dict(v) for k, v in self.offset_table.items()}
        return to_fastjson(bean(offsetTable=table, **self.extra))

    def decode(self, text):
        obj = _object(parse_fastjson(text), self.file_name)
        table = {}
        for key, raw in _object(obj.get("offsetTable"), "offsetTable").items():
            table[key] = _int_map(raw, key)
        self.offset_table = table
        self.extra = {k: v for k, v in obj.items() if k != "offsetTable"}

    def commit_offset(self, group, topic, queue_id, offset):
        key = topic + TOPIC_GROUP_SEPARATOR + group
        with self._change():
            queues = self.offset_table.get(key)
            if queues is None:
                queues = self.offset_table[key] = {}
            queues[int(queue_id)] = int(offset)
            self._dirty = True

    def query_offset(self, group, topic, queue_id):
        queues = self.offset_table.get(topic + TOPIC_GROUP_SEPARATOR + group)
        if queues is None:
            return -1
        return queues.get(queue_id, -1)

    def remove(self, group, topic):
        with self._change():
            if self.offset_table.pop(topic + TOPIC_GROUP_SEPARATOR + group, None) is not None:
                self._dirty = True

    def entries(self):
        """(group, topic, {queue_id: offset}) for every key, split at the first `@` (topic
        names cannot contain it).
        """
        with self._lock:
            items = [(k, dict(v)) for k, v in self.offset_table.items()]
        out = []
        for key, queues in items:
            topic, sep, group = key.partition(TOPIC_GROUP_SEPARATOR)
            if sep:
                out.append((group, topic, queues))
        return out


class DelayOffsetManager(ConfigManager):
    """`config/delayOffset.json`: delay level -> next offset to deliver in
    SCHEDULE_TOPIC_XXXX queue level - 1 (ScheduleMessageService's offsetTable)."""

    file_name = "delayOffset.json"

    def __init__(self, root, fs, clock=None, read_only=False):
        super().__init__(root, fs, clock, read_only)
        self.offset_table = {}
        self.extra = {}

    def encode(self):
        return to_fastjson(bean(offsetTable=dict(self.offset_table), **self.extra))

    def decode(self, text):
        obj = _object(parse_fastjson(text), self.file_name)
        self.offset_table = _int_map(obj.get("offsetTable"), "offsetTable")
        self.extra = {k: v for k, v in obj.items() if k != "offsetTable"}

    def update_offset(self, level, offset):
        with self._change():
            self.offset_table[int(level)] = int(offset)
            self._dirty = True

    def get_offset(self, level):
        return self.offset_table.get(level, -1)


def all_managers(root, fs, clock=None, read_only=False):
    """The four managers a store keeps, in load order."""
    return (TopicConfigManager(root, fs, clock, read_only),
            SubscriptionGroupManager(root, fs, clock, read_only),
            ConsumerOffsetManager(root, fs, clock, read_only),
            DelayOffsetManager(root, fs, clock, read_only))
