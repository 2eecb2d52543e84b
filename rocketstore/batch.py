# SPDX-License-Identifier: Apache-2.0
"""Columns of a put_batch: bodies, tags and keys as one data buffer plus int64 offsets each,
and the shared properties string cut around the per-message TAGS and KEYS, so the batch_encode
kernel writes the bytes put_messages writes for the equivalent Message objects."""
import numpy as np

from . import format as F
from .compression import compress_zlib
from .errors import MessageIllegalError
from .message import (KEY_SEPARATOR, PROPERTY_DELAY, PROPERTY_KEYS, PROPERTY_TAGS, body_bytes,
                      properties_to_string)

# Stand-ins for a per-message value while the shared properties string is built; NUL never
# survives into a template because the slots are cut out of it.
_SLOT = {PROPERTY_TAGS: "\x00put_batch TAGS\x00", PROPERTY_KEYS: "\x00put_batch KEYS\x00"}


class Column:
    """Item i is data[off[i]:off[i + 1]] (Arrow's layout); `lens` are the item lengths,
    computed on first use (the compiled layout's put path never needs them)."""
    __slots__ = ("data", "off", "_lens")

    def __init__(self, data, off):
        self.data = data
        self.off = off
        self._lens = None

    @property
    def lens(self):
        if self._lens is None:
            self._lens = np.diff(self.off)
        return self._lens


def _offsets_from_lengths(lengths, n):
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(lengths, dtype=np.int64, count=n), out=off[1:])
    return off


def _pair(obj):
    """(offsets, data) when `obj` is such a pair: a 2-tuple whose first item is a 1-d array
    of 4- or 8-byte integers (Arrow and numpy offsets). None otherwise, so a tuple of two
    bodies stays two bodies."""
    if type(obj) is not tuple or len(obj) != 2 or isinstance(obj[0], (bytes, bytearray, str)):
        return None
    try:
        off = np.asarray(obj[0])
    except (TypeError, ValueError):
        return None
    if off.ndim != 1 or off.dtype.kind not in "iu" or off.dtype.itemsize < 4:
        return None
    return off, obj[1]


def _from_pair(pair, what):
    off, data = pair
    if len(off) == 0:
        raise TypeError(f"{what}: an (offsets, data) pair needs at least one offset")
    try:
        data = memoryview(data)
    except TypeError:
        raise TypeError(f"{what}: the data of an (offsets, data) pair must be a buffer, not "
                        f"{type(data).__name__}") from None
    if not data.c_contiguous:
        raise TypeError(f"{what}: the data buffer must be C-contiguous")
    data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    if off.dtype.kind == "u" and len(off) and int(off.max()) > 0x7FFFFFFFFFFFFFFF:
        raise MessageIllegalError(f"{what}: offsets outside the data buffer")
    off = np.ascontiguousarray(off, dtype=np.int64)
    if off[0] < 0 or off[-1] > len(data) or (np.diff(off) < 0).any():
        raise MessageIllegalError(f"{what}: offsets must not decrease and must stay inside "
                                  f"the {len(data)}-byte data buffer")
    return Column(data, off)


def bodies_column(bodies, join):
    """`bodies` (a list of bytes-like objects, or an (offsets, data) pair) as a Column;
    `join` is the backend's column_join."""
    pair = _pair(bodies)
    if pair is not None:
        return _from_pair(pair, "bodies")
    if isinstance(bodies, (str, bytes, bytearray, memoryview)) or not hasattr(bodies, "__len__"):
        raise TypeError(f"bodies must be a list of bytes or an (offsets, data) pair, not "
                        f"{type(bodies).__name__}")
    joined = join(bodies, False)
    if joined is not None:
        return Column(joined[0], np.frombuffer(joined[1], dtype=np.int64))
    # Other buffers (bytearray, memoryview, array('i')): their raw bytes, as body_bytes
    # makes of them for put_messages.
    flat = []
    for b in bodies:
        if isinstance(b, str) or (b is not None and not _is_buffer(b)):
            raise TypeError(f"each body must be bytes or a buffer, not {type(b).__name__}")
        flat.append(body_bytes(b))
    return Column(b"".join(flat), _offsets_from_lengths(map(len, flat), len(flat)))


def _is_buffer(obj):
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


def _text_item(value, name):
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if name == PROPERTY_KEYS and isinstance(value, (list, tuple)) and \
            all(isinstance(k, str) for k in value):
        return KEY_SEPARATOR.join(value)     # Message(keys=[...]) joins them the same way
    kinds = "a str, a list of str" if name == PROPERTY_KEYS else "a str"
    raise TypeError(f"each of {name.lower()} must be {kinds} or None, not "
                    f"{type(value).__name__}")


def text_column(values, n, name, join):
    """Per-message TAGS or KEYS as a Column of UTF-8 bytes (an empty item: the message has
    none, as Message(tags="") has none). `values`: a list of str (KEYS also a list of str per
    message) or None, or an (offsets, data) pair of UTF-8 bytes."""
    pair = _pair(values)
    if pair is not None:
        col = _from_pair(pair, name.lower())
    else:
        if not hasattr(values, "__len__"):
            raise TypeError(f"{name.lower()} must be a str, a list or an (offsets, data) pair, "
                            f"not {type(values).__name__}")
        joined = join(values, True) if type(values) is list else None
        if joined is None:
            joined = join([_text_item(v, name) for v in values], True)
        col = Column(joined[0], np.frombuffer(joined[1], dtype=np.int64))
    if len(col.lens) != n:
        raise MessageIllegalError(f"{name.lower()} has {len(col.lens)} items for {n} bodies")
    used = col.data[int(col.off[0]):int(col.off[-1])]
    if type(used) is not bytes:
        used = bytes(used)
    if b"\x01" in used or b"\x02" in used:
        raise MessageIllegalError(
            f"a {name} value holds \\x01 or \\x02, the properties separators")
    return col


def properties_template(tags, keys, properties):
    """The properties string every message of the batch shares, cut around its per-message
    values: (fragments as UTF-8 bytes, their 4 offsets, the names filling the 2 slots in
    order). `tags` / `keys`: None (absent), a shared str, or PER_MESSAGE. The dict is built as
    Message builds it (TAGS, KEYS, then `properties`, which may replace them in place), and
    properties_to_string orders it, so the put path's cached HashMap order decides here too."""
    model = {}
    for name, value in ((PROPERTY_TAGS, tags), (PROPERTY_KEYS, keys)):
        if value is PER_MESSAGE:
            model[name] = _SLOT[name]
        elif value:
            model[name] = value
    if properties:
        model.update(properties)
    text = properties_to_string(model)
    if any(text.count(slot) > (model.get(name) is slot) for name, slot in _SLOT.items()):
        raise MessageIllegalError("a property value holds put_batch's internal slot marker")
    slots = sorted((text.find(_SLOT[name]), name) for name in _SLOT
                   if model.get(name) is _SLOT[name])
    pieces, names, at = [], [], 0
    for where, name in slots:
        pieces.append(text[at:where])
        names.append(name)
        at = where + len(_SLOT[name])
    pieces.append(text[at:])
    pieces += [""] * (3 - len(pieces))
    frags = [p.encode("utf-8") for p in pieces]
    off = np.zeros(4, dtype=np.int64)
    np.cumsum([len(f) for f in frags], out=off[1:])
    return b"".join(frags), off, names


PER_MESSAGE = object()


class Columns:
    """What batch_encode takes for one batch: bodies, up to two per-message properties
    columns (a, b: Column or None), the shared fragments and every message's properties
    length."""
    __slots__ = ("n", "bodies", "a", "b", "frags", "frag_off", "_props_lens", "properties",
                 "flags_or", "_lens", "tags_col")

    def __init__(self):
        self._props_lens = self._lens = None
        # Where TAGS lies, for batch_encode's rows: 1 / 2 in column a / b, 0 in no column
        # (the fragments, or nowhere), -1 unknown (whole per-message strings).
        self.tags_col = -1

    @property
    def props_lens(self):
        """Each message's properties length: the fragments plus its a and b items."""
        if self._props_lens is None:
            lens = np.full(self.n, len(self.frags), dtype=np.int64)
            for col in (self.a, self.b):
                if col is not None:
                    lens += col.lens
            self._props_lens = lens
        return self._props_lens

    @props_lens.setter
    def props_lens(self, lens):
        self._props_lens = lens

    def record_lens(self):
        """(var, prefix, shared, body_max, props_max, var_max): message i's body plus
        properties length is var[i] + shared (its record size less the part every record
        of the batch shares), prefix[i] is the sum of var[:i] (n + 1 int64s), and the maxima
        (var_max of var + shared) are what the put path validates, so it checks n values by
        three comparisons."""
        if self._lens is None:
            body, props = self.bodies.lens, self.props_lens
            var = body + props
            prefix = np.zeros(self.n + 1, dtype=np.int64)
            np.cumsum(var, out=prefix[1:])
            if self.n:
                self._lens = (var, prefix, 0, int(body.max()), int(props.max()),
                              int(var.max()))
            else:
                self._lens = (var, prefix, 0, 0, 0, 0)
        return self._lens


def _values(arg, n, name, join):
    """None, a shared str, or a Column of per-message values (None when all are empty)."""
    if arg is None or isinstance(arg, str):
        return arg or None
    col = text_column(arg, n, name, join)
    if not col.lens.any():
        return None
    return col


_TEMPLATES: dict = {}


def _template(tags, keys, properties):
    """properties_template, remembered for properties of str names and values (most batches
    repeat one layout; other values convert, so 1 and True must not share an entry)."""
    items = ()
    if properties:
        items = tuple(properties.items())
        if not all(type(k) is str and type(v) is str for k, v in items):
            return properties_template(tags, keys, properties)
    key = (tags, keys, items)
    t = _TEMPLATES.get(key)
    if t is None:
        t = properties_template(tags, keys, properties)
        if len(_TEMPLATES) >= 1024:
            _TEMPLATES.clear()
        _TEMPLATES[key] = t
    return t


def batch_template(tags, keys, tags_column, keys_column, properties):
    """The properties template of a batch whose TAGS (KEYS) are a per-message column when
    `tags_column` (`keys_column`), else `tags` (`keys`) when it is a non-empty str, else
    absent; the DELAY check first. (frags, frag_off, tags_slot, keys_slot): the fragments and
    their offsets as properties_template makes them, and the slot each of TAGS and KEYS
    fills (1 for the first, 2 for the second, 0 for none). None when `properties` replaces
    a per-message TAGS or KEYS: the messages' lengths then differ from their columns'."""
    check_delay(dict(properties or {}))
    frags, frag_off, names = _template(
        PER_MESSAGE if tags_column else (tags if type(tags) is str and tags else None),
        PER_MESSAGE if keys_column else (keys if type(keys) is str and keys else None),
        properties)
    if len(names) != bool(tags_column) + bool(keys_column):
        return None
    slot = {name: k + 1 for k, name in enumerate(names)}
    return frags, frag_off, slot.get(PROPERTY_TAGS, 0), slot.get(PROPERTY_KEYS, 0)


def _fast_columns(bodies, tags, keys, properties, fast):
    """columns() through the backend's compiled batch_columns; None when it declines."""
    r = fast(bodies, tags, keys)
    if r is None:
        return None
    bdata, boff, tdata, toff, kdata, koff, var, prefix, body_max, tk_max, var_max = r
    t = batch_template(tags, keys, tdata is not None, kdata is not None, properties)
    if t is None:
        return None
    frags, frag_off, tags_slot, keys_slot = t
    c = Columns()
    c.properties = properties
    c.flags_or = None
    c.bodies = Column(bdata, boff)
    c.n = len(var)
    slots = [None, None, None]
    if tags_slot:
        slots[tags_slot] = Column(tdata, toff)
    if keys_slot:
        slots[keys_slot] = Column(kdata, koff)
    c.a, c.b = slots[1], slots[2]
    c.tags_col = tags_slot
    c.frags = frags
    c.frag_off = frag_off
    flen = len(frags)       # every message's properties hold the fragments
    if c.n:
        c._lens = (var, prefix, flen, body_max, flen + tk_max, flen + var_max)
    else:
        c._lens = (var, prefix, flen, 0, 0, 0)
    return c


def columns(bodies, tags, keys, properties, join, fast=None):
    """Validate and lay out a put_batch's arguments (no store state involved); `join` is the
    backend's column_join, `fast` its batch_columns when it has one (the common case in one
    compiled call; everything it declines takes the Python path below)."""
    if properties is not None and not isinstance(properties, dict):
        raise TypeError(f"properties must be a dict or None, not {type(properties).__name__}")
    if fast is not None:
        c = _fast_columns(bodies, tags, keys, properties, fast)
        if c is not None:
            return c
    c = Columns()
    c.properties = properties
    c.flags_or = None
    c.bodies = bodies_column(bodies, join)
    n = c.n = len(c.bodies.lens)
    tags = _values(tags, n, PROPERTY_TAGS, join)
    keys = _values(keys, n, PROPERTY_KEYS, join)
    check_delay(dict(properties or {}))
    cols = {PROPERTY_TAGS: tags, PROPERTY_KEYS: keys}
    varying = {k: v for k, v in cols.items() if isinstance(v, Column)}
    if all(v.lens.all() for v in varying.values()):
        frags, c.frag_off, names = properties_template(
            *(PER_MESSAGE if isinstance(v, Column) else v for v in cols.values()), properties)
        c.frags = frags
        picked = [varying[name] for name in names]
        c.a, c.b = (picked + [None, None])[:2]
        c.tags_col = names.index(PROPERTY_TAGS) + 1 if PROPERTY_TAGS in names else 0
        c.props_lens = np.full(n, len(frags), dtype=np.int64)
        for col in picked:
            c.props_lens += col.lens
        return c
    # Some messages lack a TAGS or KEYS the others have: their properties order differs, so
    # each message's string is built whole here, once per presence pattern's template.
    templates = {}
    items = []
    for i in range(n):
        present = tuple(name for name, v in varying.items() if v.lens[i])
        t = templates.get(present)
        if t is None:
            t = templates[present] = properties_template(
                *(PER_MESSAGE if name in present else (None if isinstance(v, Column) else v)
                  for name, v in cols.items()), properties)
        frags, off, names = t
        parts = [frags[off[0]:off[1]]]
        for k, name in enumerate(names):
            col = varying[name]
            parts.append(bytes(col.data[col.off[i]:col.off[i + 1]]))
            parts.append(frags[off[k + 1]:off[k + 2]])
        parts.append(frags[off[len(names) + 1]:off[3]])
        items.append(b"".join(parts))
    c.a = Column(b"".join(items), _offsets_from_lengths(map(len, items), n))
    c.b = None
    c.frags = b""
    c.frag_off = np.zeros(4, dtype=np.int64)
    c.props_lens = c.a.lens
    return c


def check_delay(props):
    """put_batch writes no DELAY rewrite (SCHEDULE_TOPIC_XXXX): refuse a delay level it
    would need, as the put path refuses a DELAY that is not a number."""
    level = props.get(PROPERTY_DELAY)
    try:
        level = int(level) if level else 0
    except (TypeError, ValueError):
        raise MessageIllegalError(f"DELAY property is not a number: {level!r}") from None
    if level > 0:
        raise MessageIllegalError("put_batch does not delay messages: put delayed ones with "
                                  "put_message or put_messages")


def max_len_check(lens, limit, what, status="MESSAGE_ILLEGAL"):
    if len(lens) and int(lens.max()) > limit:
        i = int(lens.argmax())
        raise MessageIllegalError(f"message {i}: {what} is {int(lens[i])} bytes; at most "
                                  f"{limit}", status=status)


def compress_bodies(cols, threshold, level):
    """Deflate each body of at least `threshold` bytes as put_message does with
    compress_msg_body (compression.compress_for_put), and mark those records' COMPRESSED_FLAG
    in cols.flags_or, so put_batch stores the bytes put_messages stores."""
    big = cols.bodies.lens >= threshold
    if not big.any():
        return cols
    data = memoryview(cols.bodies.data).cast("B")
    off = cols.bodies.off.tolist()
    items = []
    for i, deflate in enumerate(big.tolist()):
        body = data[off[i]:off[i + 1]]
        items.append(compress_zlib(body, level) if deflate else bytes(body))
    cols.bodies = Column(b"".join(items), _offsets_from_lengths(map(len, items), cols.n))
    cols.flags_or = np.where(big, F.COMPRESSED_FLAG, 0).astype(np.int32)
    cols._lens = None           # the bodies changed
    return cols

