# SPDX-License-Identifier: Apache-2.0
"""Message value types and the properties codec (doc/01 §3.6-3.8)."""
import copy
import ipaddress
import socket
import struct
import zlib

from . import format as F
from .compression import codec_of, compress_for_put, compression_name, decompress
from .errors import (CorruptBodyError, CorruptRecordError, MessageIllegalError,
                     MissingCodecError)

_I16 = F.I16
_I32 = F.I32
_I64 = F.I64
_TAIL = F.RECORD_TAIL.struct

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_DELAY = "DELAY"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_WAIT = "WAIT"
KEY_SEPARATOR = " "

# The one topic rule, shared by put, topic config, the public API's arguments and the scan
# kernels (rs_msg.c rs_topic_ok is its C twin for stored bytes). 4.9.8's store takes any topic
# of at most 127 characters (DefaultMessageStore#checkMessage); only a broker's send path holds
# topics to ^[%|a-zA-Z0-9_-]+$, so a store holds "Topic_ü_中" too. A topic also names one
# directory under consumequeue/: the empty topic, "." and "..", and any "/" or NUL are refused.
def topic_problem(topic, max_bytes=127):
    """Why `topic` cannot be a topic, as a sentence; None when it can. `max_bytes` bounds its
    UTF-8 length (the v1 record's one length byte), None for no bound."""
    if not isinstance(topic, str):
        return f"topic {topic!r} is not a str"
    if topic in ("", ".", ".."):
        return f"topic {topic!r} names no directory of its own"
    if "/" in topic or "\0" in topic:
        return f"topic {topic!r} holds a '/' or NUL: it would name a path, not a directory"
    try:
        n = len(topic.encode("utf-8"))
    except UnicodeEncodeError:
        return f"topic {topic!r} is not valid Unicode (a lone surrogate)"
    if max_bytes is not None and n > max_bytes:
        return f"topic is {n} bytes in UTF-8; at most {max_bytes} are allowed"
    return None


def topic_bytes_problem(raw):
    """Why stored topic bytes are no topic, as one sentence; None when they are one:
    well-formed UTF-8 obeying topic_problem (the length is the record format's business)."""
    try:
        topic = bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return f"{bytes(raw)!r} are not UTF-8"
    return topic_problem(topic, None)


def valid_topic_bytes(raw):
    """Whether stored topic bytes are a topic (topic_bytes_problem)."""
    return topic_bytes_problem(raw) is None


def body_bytes(body):
    """A message body as a flat byte buffer: bytes as they are, any other buffer (bytearray,
    memoryview, numpy array, array('i')) as its raw bytes. Lengths are then bytes on every
    backend; the compiled ones read raw bytes anyway, and the pure one counted elements."""
    if body is None:
        return b""
    if type(body) is bytes:
        return body
    try:
        mv = memoryview(body)
    except TypeError:
        raise MessageIllegalError(
            f"message body must be bytes or a buffer, not {type(body).__name__}") from None
    if not mv.c_contiguous:
        return mv.tobytes()
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


# ---- Java String.hashCode and HashMap order ------------------------------------------------
def java_string_hash(text):
    """Java String.hashCode: int32 over UTF-16 code units (a non-BMP char counts twice)."""
    h = 0
    if text.isascii():
        for ch in text.encode("ascii"):
            h = (31 * h + ch) & 0xFFFFFFFF
    else:
        units = text.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(units), 2):
            h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _hashmap_order(names):
    """Iteration order of a java.util.HashMap that had `names` put in this order (doc/01 §3.6).

    Default capacity 16, load factor 0.75: the table doubles when size passes 3/4 of it, and a
    bucket that would reach 9 entries in a table under 64 forces a doubling too (treeifyBin).
    Resizes split buckets preserving order, so the final order is (bucket, insertion index).
    """
    cap = 16
    spread = []
    for name in names:
        h = java_string_hash(name) & 0xFFFFFFFF
        spread.append(h ^ (h >> 16))
    size = 0
    counts = {}
    for s in spread:
        b = s & (cap - 1)
        counts[b] = counts.get(b, 0) + 1
        if counts[b] >= 9 and cap < 64:
            cap *= 2
            counts = {}
            for t in spread[:size + 1]:
                counts[t & (cap - 1)] = counts.get(t & (cap - 1), 0) + 1
        size += 1
        if size > cap * 3 // 4:
            cap *= 2
            counts = {}
            for t in spread[:size]:
                counts[t & (cap - 1)] = counts.get(t & (cap - 1), 0) + 1
    return sorted(range(len(names)), key=lambda i: (spread[i] & (cap - 1), i))


_ORDER_CACHE: dict = {}


def hashmap_order(names):
    """`names` (a tuple, insertion order) reordered as the broker's HashMap iterates them."""
    order = _ORDER_CACHE.get(names)
    if order is None:
        order = tuple(names[i] for i in _hashmap_order(list(names)))
        if len(_ORDER_CACHE) < 65536:
            _ORDER_CACHE[names] = order
    return order


def properties_to_string(props):
    """messageProperties2String (4.9.x): name\x01value pairs joined by \x02 in HashMap order,
    with no separator after the last pair. None values are skipped. A name or value that is not
    a str raises MessageIllegalError, and so does one holding \x01 or \x02: it would be read
    back as other properties (a forged UNIQ_KEY, say), so the client's Validators refuse it
    too."""
    if not props:
        return ""
    order = _ORDER_CACHE.get(tuple(props))
    if order is not None:
        try:
            return _checked("\x02".join([k + "\x01" + props[k] for k in order]), len(order))
        except TypeError:       # a None or non-str value: the general path below
            pass
    for k, v in props.items():
        if not isinstance(k, str) or not (v is None or isinstance(v, str)):
            # A Java HashMap<String, String>: str() of anything else would store its repr
            # (b'x' for bytes), and a name that is not a str could not be encoded at all.
            bad, what = (k, "name") if not isinstance(k, str) else (v, f"value of {k!r}")
            raise MessageIllegalError(f"property {what} must be a str, not "
                                      f"{type(bad).__name__} ({bad!r:.40})")
    names = tuple(k for k, v in props.items() if v is not None)
    if not names:
        return ""
    order = hashmap_order(names)
    if len(names) == len(props) and len(_ORDER_CACHE) < 65536:
        _ORDER_CACHE[tuple(props)] = order
    return _checked("\x02".join([f"{k}\x01{props[k]}" for k in order]), len(order))


def _checked(text, pairs):
    """`text` if it holds exactly the separators its `pairs` put there."""
    if text.count("\x01") != pairs or text.count("\x02") != pairs - 1:
        raise MessageIllegalError(
            "a property name or value (TAGS and KEYS included) holds \\x01 or \\x02, "
            "the properties separators")
    return text


def string_to_properties(text):
    """string2messageProperties: a segment shorter than 3 chars, or whose first \\x01 is its
    first or last char, is skipped; so an empty value is written but never read back."""
    props = {}
    if not text:
        return props
    for seg in text.split("\x02"):
        if len(seg) < 3:
            continue
        i = seg.find("\x01")
        if i <= 0 or i == len(seg) - 1:
            continue
        props[seg[:i]] = seg[i + 1:]
    return props


def tags_code_of(tags):
    """tagsString2tagsCode: String.hashCode of TAGS, sign-extended; 0 without TAGS."""
    return java_string_hash(tags) if tags else 0


# ---- hosts ----------------------------------------------------------------------------------
_HOST_CACHE: dict = {}


def pack_host(host):
    """(ip, port) -> (packed address + 4-byte port, is_ipv6). Cached: hosts repeat."""
    packed = _HOST_CACHE.get(host)
    if packed is None:
        ip, port = host
        addr = ipaddress.ip_address(ip)
        if not 0 <= port <= 0xFFFFFFFF:
            raise ValueError(f"port out of range: {port}")
        packed = (addr.packed + F.I32.pack(port - (1 << 32) if port > 0x7FFFFFFF else port),
                  addr.version == 6)
        if len(_HOST_CACHE) < 4096:
            _HOST_CACHE[host] = packed
    return packed


def unpack_host(raw):
    """Packed address + port -> (ip, port)."""
    family = socket.AF_INET6 if len(raw) == F.HOST_V6_LENGTH else socket.AF_INET
    addr = socket.inet_ntop(family, raw[:-4])
    return addr, F.I32.unpack(raw[-4:])[0]


def host_to_string(host):
    """"ip:port" with the address as Java's getHostAddress prints it (IPv6 uncompressed)."""
    ip, port = host
    if ":" in ip:
        groups = struct.unpack(">8H", socket.inet_pton(socket.AF_INET6, ip))
        ip = ":".join("%x" % g for g in groups)
    return f"{ip}:{port}"


def make_msg_id(store_host_packed, phy_offset):
    """Offset msgId: store address + port + commit-log offset, uppercase hex (doc/01 §3.8)."""
    return (store_host_packed + _I64.pack(phy_offset)).hex().upper()


def decode_msg_id(msg_id):
    """Offset msgId -> ((ip, port), commit-log offset). 32 hex chars is IPv4, else IPv6."""
    raw = bytes.fromhex(msg_id)
    if len(raw) not in (F.HOST_V4_LENGTH + 8, F.HOST_V6_LENGTH + 8):
        raise ValueError(f"not an offset msgId: {msg_id!r}")
    return unpack_host(raw[:-8]), _I64.unpack(raw[-8:])[0]


# ---- value types ----------------------------------------------------------------------------
class _AssignedNone:
    """What a MessageExt lazy field's slot holds after the field was assigned None: a None
    slot means "not read from the record yet", so the assignment must be told apart from it
    (else the field would read back the record's value). One object, which pickles and copies
    as itself."""
    __slots__ = ()

    def __reduce__(self):
        return "_ASSIGNED_NONE"

    def __repr__(self):
        return "_ASSIGNED_NONE"


_ASSIGNED_NONE = _AssignedNone()


def _assigned(value):
    """A lazy field's slot value for an assignment of `value`."""
    return _ASSIGNED_NONE if value is None else value


class _Keyed:
    """TAGS and KEYS, read from a `properties` mapping."""
    __slots__ = ()

    @property
    def tags(self):
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self):
        """The KEYS property as stored: keys separated by spaces (Message.getKeys)."""
        return self.properties.get(PROPERTY_KEYS)


class Message(_Keyed):
    """A message to put: what a broker's MessageExtBrokerInner carries before the store.

    Properties are put into the broker's HashMap in this order: TAGS, KEYS, then `properties`
    in its own order; that insertion order is what decides ties in the stored order.
    """

    __slots__ = ("topic", "body", "queue_id", "flag", "properties", "born_timestamp",
                 "born_host", "store_host", "sys_flag", "reconsume_times",
                 "prepared_transaction_offset")

    def __init__(self, topic, body=b"", tags=None, keys=None, queue_id=0, flag=0,
                 properties=None, born_timestamp=0, born_host=("127.0.0.1", 0), store_host=None,
                 sys_flag=0, reconsume_times=0, prepared_transaction_offset=0):
        self.topic = topic
        self.body = body
        self.queue_id = queue_id
        self.flag = flag
        props = {}
        if tags:
            props[PROPERTY_TAGS] = tags
        if keys:
            props[PROPERTY_KEYS] = keys if isinstance(keys, str) else KEY_SEPARATOR.join(keys)
        if properties:
            props.update(properties)
        self.properties = props
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.store_host = store_host
        self.sys_flag = sys_flag
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset

    @property
    def delay_time_level(self):
        v = self.properties.get(PROPERTY_DELAY)
        try:
            return int(v) if v else 0
        except ValueError:
            return 0

    def __repr__(self):
        return (f"Message(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"body={len(self.body)}B, properties={self.properties!r})")


def keep_stored(messages):
    """Give each compressed MessageExt of `messages` its body as stored (the reads'
    decompress=False); returns `messages`."""
    for m in messages:
        if m is not None and m.sys_flag & F.COMPRESSED_FLAG:
            m.body = m.stored_body
    return messages


def compressed_message(msg, threshold, level):
    """`msg` as a 4.9 producer sends it (DefaultMQProducerImpl#tryToCompressMessage): a copy
    whose body of at least `threshold` bytes is zlib-deflated at `level`, with
    COMPRESSED_FLAG set; `msg` itself when its body is smaller, already compressed, or not
    a body at all (the put path refuses that). The caller's message is left as it was."""
    if not isinstance(msg, Message) or msg.sys_flag & F.COMPRESSED_FLAG:
        return msg
    try:
        body = body_bytes(msg.body)
    except MessageIllegalError:
        return msg
    stored, compressed = compress_for_put(body, threshold, level)
    if not compressed:
        return msg
    out = copy.copy(msg)
    out.body = stored
    out.sys_flag = msg.sys_flag | F.COMPRESSED_FLAG
    return out


# Everything up to BODYLENGTH when both hosts are IPv4 (the common case): one unpack.
_FIXED_V4 = F.RECORD_FIXED_V4.struct
_FIXED_V4_SIZE = F.RECORD_FIXED_V4.size
_MAGICS = (F.MESSAGE_MAGIC_CODE, F.MESSAGE_MAGIC_CODE_V2)


class MessageExt(_Keyed):
    """A stored record, decoded (MessageExt).

    The read path (get_message, read_path.iter_messages, key queries) builds these from the
    rows the record-check kernel fills (from_row here, or the compiled ReadPath): the record
    has been checked whole before its message is made, and the message keeps a copy of its
    bytes. The fields that cost nothing to make (sizes, ids, flags, hosts, topic, store time)
    are set at once; the ones that would each be a new object (body, queue and commit-log
    offsets, body CRC, born time, the properties) are read from that copy on first use and
    kept: a consumer pays for no field it does not look at, and a read makes two objects per
    message instead of seven. decode() is the stand-alone decoder of one record's bytes, which
    fills every field at once.

    `body` is the original body, as MessageDecoder gives it: a compressed one (COMPRESSED_FLAG,
    doc/01 §3.5) is decompressed on first use, and raises CorruptBodyError (MissingCodecError
    when its codec's extra is not installed) if it cannot be. `stored_body` is always the bytes
    in the record, which the body CRC covers. keep_stored() makes `body` the stored bytes."""

    # The lazy fields are properties over the private slots below (_crc, _qoff, _phy, _bts,
    # _stored, _body, _praw): None means "not read from _rec yet" (an empty slot would cost a
    # raised AttributeError to find out), and assigning a field fills its slot (_ASSIGNED_NONE
    # for None).
    __slots__ = ("store_size", "queue_id", "flag", "sys_flag", "born_host_raw",
                 "store_timestamp", "store_host_raw", "reconsume_times",
                 "prepared_transaction_offset", "topic", "magic", "_rec", "_crc", "_qoff",
                 "_phy", "_bts", "_stored", "_body", "_praw", "_pstr", "_props")
    # Private slots the compiled read path (pyx/_read.pxi) fills when it builds a message: the
    # record's bytes, and the lazy fields' caches (None: not read yet).
    LENT_SLOTS = ("_rec", "_crc", "_qoff", "_phy", "_bts", "_stored", "_body", "_praw", "_pstr",
                  "_props")

    @property
    def body_crc(self):
        v = self._crc
        if v is None:
            v = self._crc = _I32.unpack_from(self._rec, F.POS_BODYCRC)[0]
        return None if v is _ASSIGNED_NONE else v

    @body_crc.setter
    def body_crc(self, value):
        self._crc = _assigned(value)

    @property
    def queue_offset(self):
        v = self._qoff
        if v is None:
            v = self._qoff = _I64.unpack_from(self._rec, F.POS_QUEUEOFFSET)[0]
        return None if v is _ASSIGNED_NONE else v

    @queue_offset.setter
    def queue_offset(self, value):
        self._qoff = _assigned(value)

    @property
    def commit_log_offset(self):
        v = self._phy
        if v is None:
            v = self._phy = _I64.unpack_from(self._rec, F.POS_PHYSICALOFFSET)[0]
        return None if v is _ASSIGNED_NONE else v

    @commit_log_offset.setter
    def commit_log_offset(self, value):
        self._phy = _assigned(value)

    @property
    def born_timestamp(self):
        v = self._bts
        if v is None:
            v = self._bts = _I64.unpack_from(self._rec, F.POS_BORNTIMESTAMP)[0]
        return None if v is _ASSIGNED_NONE else v

    @born_timestamp.setter
    def born_timestamp(self, value):
        self._bts = _assigned(value)

    def _body_at(self):
        """(where BODY starts in _rec, its length): after RECORD_TAIL, whose place follows the
        hosts' lengths (doc/01 §3.1)."""
        p = F.pos_record_tail(self.sys_flag) + _TAIL.size
        return p, _I32.unpack_from(self._rec, p - 4)[0]

    @property
    def stored_body(self):
        v = self._stored
        if v is None:
            p, n = self._body_at()
            v = self._stored = self._rec[p:p + n]
        return None if v is _ASSIGNED_NONE else v

    @stored_body.setter
    def stored_body(self, value):
        self._stored = _assigned(value)

    @property
    def body(self):
        body = self._body
        if body is not None:
            return None if body is _ASSIGNED_NONE else body
        if self.sys_flag & F.COMPRESSED_FLAG:
            body = decompress(self.stored_body, self.sys_flag, self.where)
        else:
            body = self.stored_body
        self._body = body
        return body

    @body.setter
    def body(self, value):
        self._body = _assigned(value)

    def _props_raw(self):
        """The stored properties bytes: in _praw (decode), else after the body and topic in
        _rec (TOPICLENGTH is one byte in a v1 record, two in a v2 one)."""
        if self._praw is not None:
            return self._praw
        rec = self._rec
        p, n = self._body_at()
        p += n
        if self.magic == F.MESSAGE_MAGIC_CODE:
            p += 1 + rec[p]
        else:
            p += 2 + _I16.unpack_from(rec, p)[0]
        n = _I16.unpack_from(rec, p)[0]
        return rec[p + 2:p + 2 + n]

    @property
    def where(self):
        """The record, in words (for errors about it)."""
        return (f"the message at commit-log offset {self.commit_log_offset} (topic "
                f"{self.topic!r}, queue {self.queue_id}, queue offset {self.queue_offset})")

    @property
    def compressed(self):
        """Whether the stored body is compressed (SYSFLAG COMPRESSED_FLAG)."""
        return bool(self.sys_flag & F.COMPRESSED_FLAG)

    @property
    def compression(self):
        """The stored body's codec: "zlib", "lz4", "zstd", or None when it is not compressed
        (CorruptBodyError for a compression type no RocketMQ writes)."""
        return codec_of(self.sys_flag)

    def keep_stored(self):
        """Make `body` the stored bytes (a read with decompress=False); returns self."""
        self.body = self.stored_body
        return self

    @classmethod
    def decode(cls, rec, check_crc=False):
        """Decode one record (bytes). Raises CorruptRecordError if it is not one."""
        m = cls.__new__(cls)
        try:
            (size, magic, crc, m.queue_id, m.flag, m._qoff, m._phy, sysf,
             m._bts, bh, sts, sh, m.reconsume_times, m.prepared_transaction_offset,
             blen) = _FIXED_V4.unpack_from(rec, 0)
            if magic not in _MAGICS or size > len(rec):
                raise CorruptRecordError(f"no record here (magic {magic & 0xFFFFFFFF:#010x})")
            if sysf & (F.BORNHOST_V6_FLAG | F.STOREHOSTADDRESS_V6_FLAG):
                p = F.POS_BORNHOST
                n = F.born_host_length(sysf)
                bh = rec[p:p + n]
                p += n
                sts = _I64.unpack_from(rec, p)[0]
                p += 8
                n = F.store_host_length(sysf)
                sh = rec[p:p + n]
                p += n
                m.reconsume_times, m.prepared_transaction_offset, blen = _TAIL.unpack_from(rec, p)
                p += _TAIL.size
            else:
                p = _FIXED_V4_SIZE
            m.store_size = size
            m.magic = magic
            m._crc = crc
            m.sys_flag = sysf
            m.born_host_raw = bh
            m.store_timestamp = sts
            m.store_host_raw = sh
            body = rec[p:p + blen]
            m._stored = body
            m._body = None if sysf & F.COMPRESSED_FLAG else body
            p += blen
            if magic == F.MESSAGE_MAGIC_CODE:
                tlen = rec[p]
                p += 1
            else:
                tlen = _I16.unpack_from(rec, p)[0]
                p += 2
            m.topic = rec[p:p + tlen].decode("utf-8", "replace")
            p += tlen
            plen = _I16.unpack_from(rec, p)[0]
            p += 2
            m._praw = bytes(rec[p:p + plen])
            if blen < 0 or tlen < 0 or plen < 0 or p + plen != size:
                raise CorruptRecordError("record lengths do not add up to TOTALSIZE")
        except (struct.error, IndexError) as exc:
            raise CorruptRecordError(f"not a decodable record: {exc}") from None
        if check_crc and zlib.crc32(m._stored) & 0x7FFFFFFF != crc:
            raise CorruptRecordError("body CRC mismatch")
        m._rec = None           # every field is set: none is read from the record later
        m._pstr = None
        m._props = None
        return m

    @classmethod
    def from_row(cls, buf, row, topic=None):
        """The message of one record-check row (format.SCAN_DTYPE, as a tuple from tolist())
        over `buf`, where row[0] (pos) is the record's start: the kernel has validated the
        record and found every field, so nothing is parsed here; the record's bytes are kept
        and the fields that are new objects read from them on first use, as the compiled
        ReadPath does. `topic`, when given, is the str of the record's topic bytes (a queue's
        records share it)."""
        (pos, _phy, _qoff, _tags, sts, _bts, prepared, size, qid, sysf, flag, _crc, reconsume,
         _body_off, _body_len, topic_off, topic_len, _props_off, _props_len, info, _h) = row
        m = cls.__new__(cls)
        m.store_size = size
        m.magic = F.MESSAGE_MAGIC_CODE_V2 if info & F.SCAN_INFO_V2 else F.MESSAGE_MAGIC_CODE
        m.queue_id = qid
        m.flag = flag
        m.sys_flag = sysf
        m.store_timestamp = sts
        m.reconsume_times = reconsume
        m.prepared_transaction_offset = prepared
        rec = m._rec = bytes(buf[pos:pos + size])
        p = F.POS_BORNHOST
        n = F.born_host_length(sysf)
        m.born_host_raw = rec[p:p + n]
        p += n + 8
        n = F.store_host_length(sysf)
        m.store_host_raw = rec[p:p + n]
        if topic is None:
            topic = rec[topic_off:topic_off + topic_len].decode("utf-8", "replace")
        m.topic = topic
        m._crc = m._qoff = m._phy = m._bts = m._stored = m._body = m._praw = None
        m._pstr = None
        m._props = None
        return m

    @property
    def properties_string(self):
        """The stored properties text (name\x01value pairs joined by \x02), decoded on first
        use."""
        s = self._pstr
        if s is None:
            raw = self._props_raw()
            s = self._pstr = raw.decode("utf-8", "replace") if raw else ""
        return s

    @property
    def properties(self):
        if self._props is None:
            self._props = string_to_properties(self.properties_string)
        return self._props

    @property
    def born_host(self):
        return unpack_host(self.born_host_raw)

    @property
    def store_host(self):
        return unpack_host(self.store_host_raw)

    @property
    def msg_id(self):
        return make_msg_id(self.store_host_raw, self.commit_log_offset)

    @property
    def transaction_type(self):
        return self.sys_flag & F.TRANSACTION_TYPE_MASK

    def to_dict(self, cq_tags_code=None, decompress=True):
        """The JSON object of `rocketstore dump` (RocketMQ's field names). "body" (hex) and
        "bodyLen" are the original body's, as MessageDecoder gives it, or with `decompress`
        false the stored bytes. A record with COMPRESSED_FLAG adds "compressed": true,
        "compression" (its codec), "storedBodyLen" and "bodyDecompressed", and, when its
        body does not decompress, "bodyError" with the body given as stored: a dump goes on.
        (An uncompressed record's object is what it was before compression was read.)"""
        props = self.properties
        stored = self.stored_body
        body, error = stored, None
        if decompress:
            try:
                body = self.body
            except (CorruptBodyError, MissingCodecError) as exc:
                error = str(exc)
        d = {
            "topic": self.topic, "queueId": self.queue_id, "queueOffset": self.queue_offset,
            "commitLogOffset": self.commit_log_offset, "storeSize": self.store_size,
            "bodyCRC": self.body_crc, "sysFlag": self.sys_flag, "flag": self.flag,
            "bornTimestamp": self.born_timestamp, "bornHost": host_to_string(self.born_host),
            "storeTimestamp": self.store_timestamp,
            "storeHost": host_to_string(self.store_host),
            "reconsumeTimes": self.reconsume_times,
            "preparedTransactionOffset": self.prepared_transaction_offset,
            "tags": props.get(PROPERTY_TAGS), "keys": props.get(PROPERTY_KEYS),
            "properties": self.properties_string, "cqTagsCode": cq_tags_code,
            "bodyLen": len(body), "body": bytes(body).hex(), "msgId": self.msg_id,
        }
        if self.compressed:
            d["compressed"] = True
            d["compression"] = compression_name(self.sys_flag)
            d["storedBodyLen"] = len(stored)
            d["bodyDecompressed"] = body is not stored
            if error is not None:
                d["bodyError"] = error
        return d

    def __repr__(self):
        return (f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset}, commit_log_offset={self.commit_log_offset}, "
                f"body={len(self.stored_body)}B stored)")


# MessageExt's lazy fields: name -> (private slot, LazyField kind, position in the record).
_LAZY_FIELDS = {
    "body_crc": ("_crc", "INT32", F.POS_BODYCRC),
    "queue_offset": ("_qoff", "INT64", F.POS_QUEUEOFFSET),
    "commit_log_offset": ("_phy", "INT64", F.POS_PHYSICALOFFSET),
    "born_timestamp": ("_bts", "INT64", F.POS_BORNTIMESTAMP),
    "stored_body": ("_stored", "STORED_BODY", 0),
    "body": ("_body", "BODY", 0),
}
# The Python properties, kept: each compiled LazyField hands them the uncommon cases, and the
# tests compare the two.
PY_LAZY_FIELDS = {name: MessageExt.__dict__[name] for name in _LAZY_FIELDS}


def _compiled_lazy_fields():
    """Put the compiled backend's LazyField in place of each lazy property when it is built: a
    first read then makes only the field's object, and later reads cost a slot read, where a
    Python property's frame costs several times the allocation it saves."""
    try:
        from .kernels._cext import LazyField, install_dealloc
    except ImportError:         # no compiled backend here: the properties serve
        return
    for name, (slot, kind, pos) in _LAZY_FIELDS.items():
        setattr(MessageExt, name, LazyField(MessageExt, slot, getattr(LazyField, kind), pos,
                                            PY_LAZY_FIELDS[name], _ASSIGNED_NONE))
    # Freeing a message is then the release of its slots, without CPython's generic walk of
    # the class chain (a tenth of a get_message's instructions). A layout install_dealloc does
    # not take (another interpreter's) keeps CPython's deallocator; a test calls it directly.
    try:
        install_dealloc(MessageExt)
    except TypeError:
        pass


_compiled_lazy_fields()
