# SPDX-License-Identifier: Apache-2.0
"""index_query for the backends without a compiled one (cffi, pure): the loop of the cext's
pyx/_query.pxi in Python, over the backend's own index_hash, index_walk and index_match, so
all three answer alike."""
import numpy as np

from .. import format as F

_WALK_CHUNK = 64           # offsets taken from a chain per index_walk call
_SECOND_MS = 1000


def _header_i64(mv, pos):
    return F.I64.unpack_from(mv, pos)[0]


def _judge(k, mfq, offset, topic, key, begin, end, decode):
    """(message, size) of the record at CommitLog `offset` if it answers, else (None, 0)."""
    mf = mfq.find_by_offset(offset)
    if mf is None:
        return None, 0
    rel = offset - mf.file_from_offset
    limit = mf.read_position
    try:
        view = memoryview(mf.mm)
    except ValueError:                    # unmapped by cleaning meanwhile
        return None, 0
    with view:
        limit = min(limit, len(view))
        if rel < 0 or rel >= limit:
            return None, 0
        size = k.index_match(view, limit, rel, offset, topic, key, begin, end)
        if not size:
            return None, 0
        rec = bytes(view[rel:rel + size])
    # Checked again in the copy: the check above may have let other threads run (cffi calls
    # without the GIL), and a cut (reset_write_offset) zeroing the record, or a put writing
    # another there after it, would otherwise be decoded (the compiled index_query checks
    # and copies with the GIL held).
    if k.index_match(rec, size, 0, offset, topic, key, begin, end) != size:
        return None, 0
    return decode(rec), size


def index_query(k, files, mfq, topic, key, want, begin, end, decode):
    """contract.index_query with backend `k`'s kernels."""
    if not files or want <= 0:
        return [], 0, 0, 0
    # UnicodeEncodeError for a lone surrogate, as in the compiled backend.
    key_hash = k.index_hash((topic + "#" + key).encode("utf-8"))
    tb = topic.encode("utf-8")
    kb = key.encode("utf-8")
    # An entry keeps whole seconds after its file's begin, rounded down: a record stored at
    # `begin` may read up to 999 ms earlier.
    walk_begin = max(0, begin - (_SECOND_MS - 1)) if begin > 0 else begin
    out = np.empty(_WALK_CHUNK, dtype=np.int64)
    kept = []
    judged = set()
    nbytes = 0
    last_ts = last_phy = 0
    for i in range(len(files) - 1, -1, -1):
        f = files[i]
        try:
            view = memoryview(f.mf.mm)
        except ValueError:                # unmapped: a destroyed file holds nothing
            continue
        with view:
            if len(view) < F.INDEX_HEADER_SIZE:
                continue
            fb = _header_i64(view, F.INDEX_POS_BEGIN_TIMESTAMP)
            fe = _header_i64(view, F.INDEX_POS_END_TIMESTAMP)
            if i == len(files) - 1:
                last_ts = fe
                last_phy = _header_i64(view, F.INDEX_POS_END_PHY_OFFSET)
            # IndexFile#isTimeMatched
            matched = ((walk_begin < fb and end > fe) or fb <= walk_begin <= fe
                       or fb <= end <= fe)
            at = hops = 0
            while matched and at >= 0 and len(kept) < want:
                cap = min(_WALK_CHUNK, want - len(kept))
                count, at, hops = k.index_walk(view, f.slot_num, f.index_num, key_hash,
                                               walk_begin, end, at, hops, out[:cap])
                for offset in out[:count].tolist():
                    if offset in judged:
                        continue          # one record, two keys of it on this chain
                    judged.add(offset)
                    msg, size = _judge(k, mfq, offset, tb, kb, begin, end, decode)
                    if msg is not None:
                        kept.append((offset, msg))
                        nbytes += size
                        if len(kept) == want:
                            break
        if fb < walk_begin or len(kept) >= want:
            break
    kept.sort(key=lambda pair: pair[0])
    return [m for _, m in kept], nbytes, last_ts, last_phy
