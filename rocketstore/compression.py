# SPDX-License-Identifier: Apache-2.0
"""Compressed message bodies (doc/01 §3.5): MessageDecoder's decompress rule on read, and the
4.9 producer's compression on write.

A body is compressed when SYSFLAG has COMPRESSED_FLAG (0x1). Its codec is in the 5.x
compression-type bits (SYSFLAG & 0x700) >> 8: 0 (a 4.x producer, which knows only zlib) and 3
are zlib, 1 is LZ4, 2 is Zstandard; any other value is no codec. zlib is a zlib stream
(java.util.zip Deflater/Inflater), LZ4 an LZ4 frame (lz4-java's LZ4FrameOutputStream), Zstandard
a zstd frame. zlib comes from the standard library; LZ4 and Zstandard need the optional extras
`rocketstore[lz4]` and `rocketstore[zstd]`, imported when a body first needs them.
"""
import importlib
import zlib

from . import format as F
from .errors import CorruptBodyError, MissingCodecError

# The 4.9 producer (DefaultMQProducer): bodies of at least compressMsgBodyOverHowmuch bytes are
# deflated at zipCompressLevel (the rocketmq.client.compress.level property, default 5).
DEFAULT_THRESHOLD = 4096
DEFAULT_LEVEL = 5

ZLIB, LZ4, ZSTD = "zlib", "lz4", "zstd"
# (SYSFLAG & COMPRESSION_TYPE_MASK) >> 8 -> codec name (5.x CompressionType.findByValue).
_BY_TYPE = {0: ZLIB, 1: LZ4, 2: ZSTD, 3: ZLIB}
# codec -> (its extra, the module it needs)
_EXTRA = {LZ4: ("lz4", "lz4.frame"), ZSTD: ("zstd", "zstandard")}


def codec_of(sys_flag):
    """The codec name of a record's body: None when it is stored as it is, or raises
    CorruptBodyError for a compression type no RocketMQ version writes."""
    if not sys_flag & F.COMPRESSED_FLAG:
        return None
    kind = (sys_flag & F.COMPRESSION_TYPE_MASK) >> 8
    codec = _BY_TYPE.get(kind)
    if codec is None:
        raise CorruptBodyError(f"unknown compression type {kind} in sysFlag {sys_flag:#x}")
    return codec


def compression_name(sys_flag):
    """The codec name of a COMPRESSED record's sysFlag, never raising: "type N" for a
    compression type no RocketMQ writes."""
    kind = (sys_flag & F.COMPRESSION_TYPE_MASK) >> 8
    return _BY_TYPE.get(kind, f"type {kind}")


def _module(codec):
    extra, name = _EXTRA[codec]
    try:
        # Imported by name: the extras are optional, and neither ships type information.
        module = importlib.import_module(name)
    except ImportError as exc:
        raise MissingCodecError(
            f"this body is {codec}-compressed and reading it needs the {name} package: "
            f"pip install 'rocketstore[{extra}]' ({exc})") from None
    return module


def decompress(body, sys_flag, where=""):
    """The original bytes of a stored `body` whose record has `sys_flag` (as bytes; a body
    stored uncompressed is returned as it is). A body its codec cannot decode raises
    CorruptBodyError naming `where` (the record: its topic and offset)."""
    try:
        codec = codec_of(sys_flag)
    except CorruptBodyError as exc:
        raise CorruptBodyError(f"{where}: {exc}" if where else str(exc)) from None
    if codec is None:
        return body
    data = bytes(body)
    try:
        if codec == ZLIB:
            d = zlib.decompressobj()
            out = d.decompress(data)
            if not d.eof:
                raise zlib.error("the zlib stream is truncated")
            return out
        if codec == LZ4:
            return _module(LZ4).decompress(data)
        # A streamed zstd frame need not say its content size: decompress it as a stream.
        d = _module(ZSTD).ZstdDecompressor().decompressobj()
        out = d.decompress(data)
        if not d.eof:
            raise ValueError("the zstd frame is truncated")
        return out
    except MissingCodecError as exc:
        raise MissingCodecError(f"{where}: {exc}" if where else str(exc)) from None
    except Exception as exc:    # each codec has its own error type (zlib.error, RuntimeError)
        raise CorruptBodyError(
            f"{where + ': ' if where else ''}its {len(data)}-byte {codec} body does not "
            f"decompress: {exc}") from None


def compress_zlib(body, level=DEFAULT_LEVEL):
    """UtilAll.compress: a zlib stream (java.util.zip.Deflater at `level`, default strategy,
    through a DeflaterOutputStream), which zlib.compressobj writes byte for byte."""
    c = zlib.compressobj(level)
    return c.compress(body) + c.flush()


def compress_for_put(body, threshold, level):
    """DefaultMQProducerImpl#tryToCompressMessage: the bytes to store and whether they are
    compressed. A body of at least `threshold` bytes is deflated even when that makes it
    longer, as the producer does."""
    if len(body) < threshold:
        return body, False
    return compress_zlib(body, level), True
