# SPDX-License-Identifier: Apache-2.0
# Key queries as one compiled call (included by _cext.pyx): hash, slot, chain walk across the
# index files, record check and key match, with Python touched only to find the mappings and
# to decode the answers.

__all__ += ("index_walk", "index_match", "index_query")

# Offsets taken from a chain per rs_index_walk call: a query mostly wants a handful.
DEF WALK_CHUNK = 64
# Index files whose chains a query walks together, a hop of each a step (see _start_chains):
# a query walks on into older files only while it wants more.
DEF CHAIN_FILES = 4
cdef const uint8_t *_EMPTY = <const uint8_t *>b""


def index_walk(buf, int32_t slot_num, int32_t index_num, int32_t key_hash, int64_t begin,
               int64_t end, int32_t at, int64_t hops, out_offsets):
    """rs_index_walk: (count, at, hops); see contract.index_walk."""
    cdef Py_buffer b
    cdef int64_t[::1] o = out_offsets
    cdef int64_t count = 0
    cdef int r
    memset(&b, 0, sizeof(b))
    _ro(buf, &b)
    try:
        r = rs_index_walk(<const uint8_t *>b.buf, <size_t>b.len, slot_num, index_num, key_hash,
                          begin, end, &at, &hops, &o[0] if o.shape[0] else NULL,
                          <int64_t>o.shape[0], &count)
    finally:
        PyBuffer_Release(&b)
    _check(r, "index_walk")
    return count, at, hops


def index_match(buf, int64_t limit, int64_t pos, int64_t phy_offset, topic, key,
                int64_t begin, int64_t end):
    """rs_index_match over buf[0, limit): the record's size when it answers, else 0."""
    cdef Py_buffer b, t, k
    cdef const uint8_t *tp
    cdef const uint8_t *kp
    cdef int32_t size = 0
    cdef int r
    memset(&b, 0, sizeof(b))
    memset(&t, 0, sizeof(t))
    memset(&k, 0, sizeof(k))
    try:
        _ro(buf, &b)
        if topic is not None:
            _ro(topic, &t)
        if key is not None:
            _ro(key, &k)
        if limit < 0 or limit > b.len:
            _raise_for_status(RS_E_BOUNDS, "index_match")
        # None: not compared (NULL to C). An empty buffer is compared, so it must not
        # arrive as NULL.
        tp = NULL if topic is None else (<const uint8_t *>t.buf if t.len else _EMPTY)
        kp = NULL if key is None else (<const uint8_t *>k.buf if k.len else _EMPTY)
        r = rs_index_match(<const uint8_t *>b.buf, <size_t>limit, pos, phy_offset, tp,
                           <size_t>t.len, kp, <size_t>k.len, begin, end, &size)
    finally:
        PyBuffer_Release(&k)
        PyBuffer_Release(&t)
        PyBuffer_Release(&b)
    _check(r, "index_match")
    return size if r == 1 else 0


cdef class _CommitLogFiles:
    """The CommitLog files of one query, read from its MappedFileQueue once: the segment
    holding an offset is then found as MappedFileQueue.find_by_offset finds it, in C."""
    cdef object files
    cdef Py_ssize_t n
    cdef int64_t first, fsize

    def __cinit__(self, mfq):
        self.files = mfq.files
        self.n = len(self.files)
        self.fsize = mfq.file_size
        self.first = self.files[0].file_from_offset if self.n else 0

    cdef object find(self, int64_t offset):
        cdef int64_t idx, start
        if self.n == 0 or self.fsize <= 0 or offset < self.first:
            return None
        idx = offset // self.fsize - self.first // self.fsize
        if 0 <= idx < self.n:
            mf = self.files[idx]
            start = mf.file_from_offset
            if start <= offset < start + self.fsize:
                return mf
        for mf in self.files:
            start = mf.file_from_offset
            if start <= offset < start + self.fsize:
                return mf
        return None


cdef object _query_judge(_CommitLogFiles logs, int64_t offset, const uint8_t *topic,
                         size_t topic_len, const uint8_t *key, size_t key_len, int64_t begin,
                         int64_t end, object decode, int32_t *size):
    """decode(the bytes of the record at CommitLog `offset`) if it answers the query, else
    None. Its file's mapping is borrowed as a buffer for the check and the copy, so it cannot
    be unmapped meanwhile (a file unmapped before reads as no record, as CommitLog.get_data
    answers)."""
    cdef Py_buffer v
    cdef int64_t start, limit
    cdef int r
    size[0] = 0
    mf = logs.find(offset)
    if mf is None:
        return None
    start = mf.file_from_offset
    limit = mf.read_position
    memset(&v, 0, sizeof(v))
    try:
        PyObject_GetBuffer(mf.mm, &v, PyBUF_SIMPLE)
    except ValueError:                    # unmapped by cleaning meanwhile
        return None
    try:
        if limit > v.len:
            limit = v.len
        if offset - start >= limit:
            return None
        r = rs_index_match(<const uint8_t *>v.buf, <size_t>limit, offset - start, offset,
                           topic, topic_len, key, key_len, begin, end, size)
        if r != 1:
            size[0] = 0
            return None
        rec = PyBytes_FromStringAndSize(<const char *>v.buf + (offset - start), size[0])
    finally:
        PyBuffer_Release(&v)
    return decode(rec)


cdef object _query_judge_row(ReadPath rp, list log_files, int64_t log_file_size,
                             int64_t offset, const uint8_t *topic, size_t topic_len,
                             const uint8_t *key, size_t key_len, int64_t begin, int64_t end,
                             int32_t *size):
    """_query_judge with the message built by `rp` from the record check's row, as get_message
    builds its messages: the record is parsed once, and the file is found and borrowed as
    ReadPath's unit walk does it (its slots read in place, not through attribute lookups)."""
    cdef Py_buffer v
    cdef _Window w
    cdef rs_scan_rec row
    cdef int r
    size[0] = 0
    f = rp._find(log_files, offset, log_file_size)
    if f is None:
        return None
    memset(&v, 0, sizeof(v))
    try:
        if not rp._open(f, &v, &w) or offset >= w.end:
            return None                   # unmapped by cleaning meanwhile, or not readable
        r = rs_index_match_row(w.buf, <size_t>(w.end - w.start), offset - w.start, offset,
                               topic, topic_len, key, key_len, begin, end, &row, size)
        if r != 1:
            size[0] = 0
            return None
        return rp._message(w.buf + row.pos, &row)
    finally:
        PyBuffer_Release(&v)


def index_query(files, mfq, topic, key, int64_t want, int64_t begin, int64_t end, decode):
    """The messages under `topic` that carry `key` (UNIQ_KEY or a KEYS piece), stored in
    [begin, end]: the newest `want` by the index's order (newest file first, each chain
    newest first), in ascending CommitLog offset order. See contract.index_query."""
    return _index_query(files, mfq, topic, key, want, begin, end, decode)


cdef inline bint _time_matched(int64_t walk_begin, int64_t end, int64_t fb,
                               int64_t fe) noexcept:
    """IndexFile#isTimeMatched: whether an index file of [fb, fe] may hold the window."""
    return (walk_begin < fb and end > fe) or (fb <= walk_begin <= fe) or (fb <= end <= fe)


cdef int _start_chains(files, Py_ssize_t nf, int32_t key_hash, int64_t walk_begin,
                       int64_t end, int64_t want, Py_buffer *views, Py_ssize_t *which,
                       rs_index_chain *chains, int64_t (*outs)[WALK_CHUNK],
                       Py_ssize_t *held) except -1:
    """Walk the chains of the newest CHAIN_FILES index files the query would walk, all at
    once (rs_index_walk_chains), each into outs[k], stopping each older one where the newer
    hold `want` offsets. Sets *held to how many were started: chains[k] is files[which[k]]'s,
    and views[0:*held) are held, even on an error (the caller releases them once the query
    is over). The query then takes each file's offsets from its chain, resuming it where it
    stopped.

    A chain walk is a run of dependent loads, each a miss once the index outgrows the caches,
    and a query needing the older files walked them only after the newest's whole chain.
    With 10 M messages (two index files, about five entries a query), blocks of 40 000
    queries alternated in one process against the chain heads prefetched alone: 4 % more
    queries a second with max_num 1, 9 % with 32 (doc/performance.md, "Key queries at
    10 M"). If the walk refuses one of the files (its geometry), none is started: the query
    walks file by file, and raises when it gets to that file, as before."""
    cdef Py_ssize_t i, k = 0
    cdef int32_t slot_num, index_num
    cdef const uint8_t *b
    cdef int64_t fb, fe
    cdef int64_t cap = want if want < WALK_CHUNK else WALK_CHUNK
    cdef bint stop
    held[0] = 0
    for i in range(nf - 1, -1, -1):
        if k == CHAIN_FILES:
            break
        f = files[i]
        slot_num = f.slot_num
        index_num = f.index_num
        mm = f.mf.mm
        memset(&views[k], 0, sizeof(Py_buffer))
        try:
            PyObject_GetBuffer(mm, &views[k], PyBUF_SIMPLE)
        except ValueError:                # unmapped: the walk passes it over too
            continue
        b = <const uint8_t *>views[k].buf
        if views[k].len < RS_INDEX_HEADER_SIZE:
            PyBuffer_Release(&views[k])
            continue                      # passed over by the walk too
        fb = rs_load_i64(b + RS_INDEX_POS_BEGIN_TIMESTAMP)
        fe = rs_load_i64(b + RS_INDEX_POS_END_TIMESTAMP)
        stop = fb < walk_begin            # the walk stops after this file
        if _time_matched(walk_begin, end, fb, fe):
            chains[k].buf = b
            chains[k].len = <size_t>views[k].len
            chains[k].slot_num = slot_num
            chains[k].index_num = index_num
            chains[k].at = 0
            chains[k].hops = 0
            chains[k].out = outs[k]
            chains[k].cap = cap
            chains[k].count = 0
            which[k] = i
            k += 1
            held[0] = k
        else:
            PyBuffer_Release(&views[k])
        if stop:
            break
    if k and rs_index_walk_chains(chains, <size_t>k, key_hash, walk_begin, end,
                                  want) != RS_OK:
        # A file the walk refuses (its geometry): the query walks file by file instead, and
        # raises when it gets there, not while newer files may still answer it.
        for i in range(k):
            PyBuffer_Release(&views[i])
        held[0] = 0
    return 0


cdef tuple _index_query(files, mfq, topic, key, int64_t want, int64_t begin, int64_t end,
                        decode):
    cdef Py_buffer iv
    cdef int64_t out[WALK_CHUNK]
    cdef int64_t *judged = out            # the offsets being judged
    # The newest files' chains, walked together first (_start_chains).
    cdef Py_buffer views[CHAIN_FILES]
    cdef Py_ssize_t which[CHAIN_FILES]
    cdef rs_index_chain chains[CHAIN_FILES]
    cdef int64_t outs[CHAIN_FILES][WALK_CHUNK]
    cdef Py_ssize_t nheld = 0, c = 0      # chains[c] is the next the file loop gets to
    cdef const uint8_t *ib
    cdef size_t ilen
    cdef bint started, own
    cdef int64_t seen[WALK_CHUNK]         # offsets judged, the first WALK_CHUNK of them
    cdef int64_t walk_begin = begin, count = 0, hops, fb = 0, fe, nbytes = 0, last_ts = 0
    cdef int64_t last_phy = 0, j, cap, off, first_off = 0
    cdef int32_t key_hash = 0, at, slot_num, index_num, size
    cdef Py_ssize_t i, k, nf, nkept = 0, nseen = 0, s
    cdef const char *tp
    cdef const char *kp
    cdef Py_ssize_t tlen, klen
    cdef int r
    cdef bint matched, dup
    cdef _CommitLogFiles logs = None      # read on the first offset to judge
    # A ReadPath as decode builds each hit from the record check's row, as get_message does.
    cdef ReadPath rp = decode if isinstance(decode, ReadPath) else None
    cdef list log_files = None            # with rp: the CommitLog's files, read once
    cdef int64_t log_file_size = 0
    messages = []
    offsets = None                        # with more than one kept, their offsets
    more_seen = None                      # offsets judged past the first WALK_CHUNK
    nf = len(files)
    if nf == 0 or want <= 0:
        return messages, 0, 0, 0
    # UnicodeEncodeError for a lone surrogate, as str.encode raises in every backend.
    tp = PyUnicode_AsUTF8AndSize(topic, &tlen)
    kp = PyUnicode_AsUTF8AndSize(key, &klen)
    rs_index_key_hash(<const uint8_t *>tp, <size_t>tlen, <const uint8_t *>kp, <size_t>klen,
                      &key_hash)
    # An entry keeps whole seconds after its file's begin, rounded down: a record stored at
    # `begin` may read up to 999 ms earlier (IndexService.lookup_offsets).
    if begin > 0:
        walk_begin = begin - 999 if begin > 999 else 0
    try:
        if nf > 1:                        # one chain alone is walked as it goes
            _start_chains(files, nf, key_hash, walk_begin, end, want, views, which, chains,
                          outs, &nheld)
        for i in range(nf - 1, -1, -1):
            f = files[i]
            started = c < nheld and which[c] == i
            own = not started             # else views[c] holds it until the query ends
            if started:
                ib = <const uint8_t *>views[c].buf
                ilen = <size_t>views[c].len
            else:
                memset(&iv, 0, sizeof(iv))
                try:
                    PyObject_GetBuffer(f.mf.mm, &iv, PyBUF_SIMPLE)
                except ValueError:        # unmapped: a destroyed file holds nothing
                    continue
                ib = <const uint8_t *>iv.buf
                ilen = <size_t>iv.len
            try:
                if ilen < RS_INDEX_HEADER_SIZE:
                    continue
                fb = rs_load_i64(ib + RS_INDEX_POS_BEGIN_TIMESTAMP)
                fe = rs_load_i64(ib + RS_INDEX_POS_END_TIMESTAMP)
                if i == nf - 1:
                    last_ts = fe
                    last_phy = rs_load_i64(ib + RS_INDEX_POS_END_PHY_OFFSET)
                matched = _time_matched(walk_begin, end, fb, fe)
                if started:               # its first offsets are in, and where it stopped
                    slot_num = chains[c].slot_num
                    index_num = chains[c].index_num
                    at = chains[c].at
                    hops = chains[c].hops
                    count = chains[c].count
                    judged = outs[c]
                    c += 1
                else:
                    slot_num = f.slot_num
                    index_num = f.index_num
                    at = 0
                    hops = 0
                # A file outside the window is not walked, but its begin still ends the loop.
                while matched and nkept < want:
                    if started:
                        started = False
                    elif at >= 0:
                        cap = want - nkept
                        if cap > WALK_CHUNK:
                            cap = WALK_CHUNK
                        r = rs_index_walk(ib, ilen, slot_num, index_num, key_hash, walk_begin,
                                          end, &at, &hops, out, cap, &count)
                        _check(r, "index_query")
                        judged = out
                    else:
                        break
                    for j in range(count):
                        off = judged[j]
                        # Each offset is judged once: one record's keys may share a chain.
                        dup = False
                        for s in range(nseen):
                            if seen[s] == off:
                                dup = True
                                break
                        if dup or (more_seen is not None and off in more_seen):
                            continue
                        if nseen < WALK_CHUNK:
                            seen[nseen] = off
                            nseen += 1
                        else:
                            if more_seen is None:
                                more_seen = set()
                            more_seen.add(off)
                        if rp is not None:
                            if log_files is None:
                                log_files = mfq.files
                                log_file_size = mfq.file_size
                            msg = _query_judge_row(rp, log_files, log_file_size, off,
                                                   <const uint8_t *>tp, <size_t>tlen,
                                                   <const uint8_t *>kp, <size_t>klen, begin, end,
                                                   &size)
                        else:
                            if logs is None:
                                logs = _CommitLogFiles(mfq)
                            msg = _query_judge(logs, off, <const uint8_t *>tp, <size_t>tlen,
                                               <const uint8_t *>kp, <size_t>klen, begin, end,
                                               decode, &size)
                        if msg is None:
                            continue
                        messages.append(msg)
                        nbytes += size
                        nkept += 1
                        if nkept == 1:
                            first_off = off
                        elif nkept == 2:
                            offsets = [first_off, off]
                        elif nkept > 2:
                            offsets.append(off)
                        if nkept == want:
                            break
            finally:
                if own:
                    PyBuffer_Release(&iv)
            if fb < walk_begin or nkept >= want:
                break
    finally:
        for k in range(nheld):
            PyBuffer_Release(&views[k])
    if nkept > 1:
        order = sorted(range(nkept), key=offsets.__getitem__)
        messages = [messages[o] for o in order]
    return messages, nbytes, last_ts, last_phy
