# SPDX-License-Identifier: Apache-2.0
# put_batch's argument layout (rocketstore/batch.py columns) in one pass for its common case:
# `bodies` a list of bytes (or None), `tags` and `keys` each None, a str (shared: no column)
# or a list of as many str / bytes / None. batch_columns lays it out as numpy columns for
# batch.columns; PutPath.put_lists (_put.pxi) lays it out in its own working memory and puts
# it in the same call. Both go through _list_lengths and _list_copy below.
# Included by _cext.pyx after _put.pxi (rs_has_separator, _np).


cdef inline Py_ssize_t _text_len(object item, bint text) except -2:
    """Byte length of a column item: bytes, None (empty) and, if `text`, str as UTF-8;
    -1 for any other type (the caller's general path)."""
    cdef Py_ssize_t size
    if type(item) is bytes:
        return PyBytes_GET_SIZE(item)
    if text and type(item) is str:
        if PyUnicode_IS_COMPACT_ASCII(item):
            return PyUnicode_GET_LENGTH(item)
        PyUnicode_AsUTF8AndSize(item, &size)      # cached in the str for the copy
        return size
    if item is None:
        return 0
    return -1


cdef inline const char *_text_ptr(object item) except? NULL:
    cdef Py_ssize_t size
    if type(item) is bytes:
        return PyBytes_AS_STRING(item)
    if PyUnicode_IS_COMPACT_ASCII(item):
        return <const char *>PyUnicode_DATA(item)
    return PyUnicode_AsUTF8AndSize(item, &size)


cdef struct _Lists:
    # put_batch's lists laid out: column c (0 bodies, 1 tags, 2 keys) item i is at
    # off[c][i]:off[c][i + 1] of that column's data, `has[c]` when the column exists (tags
    # or keys: a list with a value for every message; a shared str, None or a list empty for
    # every message has none). var[i] is the lengths of body i, tags i and keys i summed,
    # prefix[i] the sum of var[:i] (n + 1 of them), and the maxima are what the put path
    # validates. The caller provides off[c] (n + 1 int64s for each column given as a list),
    # var (n) and prefix (n + 1).
    Py_ssize_t n
    int64_t *off[3]
    int64_t *var
    int64_t *prefix
    bint has[3]
    int64_t total[3]
    int64_t body_max, tk_max, var_max


cdef inline size_t _lists_ints(Py_ssize_t n) noexcept:
    """How many int64s _lists_carve lays n messages' arrays out in."""
    return <size_t>(5 * n + 4)


cdef inline void _lists_carve(_Lists *L, Py_ssize_t n, int64_t *ints) noexcept:
    """L's arrays for n messages in `ints` (_lists_ints(n) of them): the three offset
    columns, then prefix, then var."""
    cdef int c
    L.n = n
    for c in range(3):
        L.off[c] = ints + c * (n + 1)
    L.prefix = ints + 3 * (n + 1)
    L.var = L.prefix + n + 1


cdef bint _lists_taken(object bodies, object tags, object keys) except -1:
    """Whether the arguments have the shapes _list_lengths lays out (their items are checked
    there): a list of bodies, and tags and keys each None, a str or a list as long."""
    cdef Py_ssize_t n
    if type(bodies) is not list:
        return False
    n = PyList_GET_SIZE(bodies)
    for arg in (tags, keys):
        if arg is not None and type(arg) is not str and (
                type(arg) is not list or PyList_GET_SIZE(arg) != n):
            return False
    return True


cdef bint _list_lengths(list bodies, object tags, object keys, _Lists *L) except -1:
    """Fill L's offsets, var, prefix, `has`, totals and maxima (L.n and the arrays set by the
    caller, the arguments checked by _lists_taken). False when the general path must lay
    the batch out: an item of another type, or a tags or keys column empty for some messages
    only (their properties order differs)."""
    cdef Py_ssize_t n = L.n, i, m, length
    cdef int64_t total, tk, vtotal = 0
    cdef int64_t *o
    cdef int c
    cdef list items
    L.body_max = L.tk_max = L.var_max = 0
    for c in range(3):
        L.has[c] = False
        L.total[c] = 0
        arg = bodies if c == 0 else (tags if c == 1 else keys)
        if type(arg) is not list:
            continue
        items = <list>arg
        o = L.off[c]
        o[0] = total = 0
        m = 0                                   # items with a value
        for i in range(n):
            length = _text_len(<object>PyList_GET_ITEM(items, i), c != 0)
            if length < 0:
                return False
            m += length != 0
            total += length
            o[i + 1] = total
            if c == 0 and length > L.body_max:
                L.body_max = length
        L.total[c] = total
        if c == 0:
            L.has[c] = True
        elif m == n and n:
            L.has[c] = True
        elif m != 0:
            return False                        # some lack it: their properties order differs
    for i in range(n):
        tk = 0
        for c in range(1, 3):
            if L.has[c]:
                tk += L.off[c][i + 1] - L.off[c][i]
        L.var[i] = L.off[0][i + 1] - L.off[0][i] + tk
        L.prefix[i] = vtotal
        vtotal += L.var[i]
        if tk > L.tk_max:
            L.tk_max = tk
        if L.var[i] > L.var_max:
            L.var_max = L.var[i]
    L.prefix[n] = vtotal
    return True


cdef bint _list_copy(list bodies, object tags, object keys, const _Lists *L,
                     char *dst0, char *dst1, char *dst2) except -1:
    """Copy column c's items to dst<c> (L.total[c] bytes, for each column L has), once
    _list_lengths has run: nothing runs between the passes that could change the lists.
    False when a tags or keys value holds \\x01 or \\x02 (the general path raises)."""
    cdef Py_ssize_t i, size
    cdef int c
    cdef char *dst
    cdef list items
    cdef const int64_t *o
    for c in range(3):
        if not L.has[c]:
            continue
        items = <list>(bodies if c == 0 else (tags if c == 1 else keys))
        dst = dst0 if c == 0 else (dst1 if c == 1 else dst2)
        o = L.off[c]
        for i in range(L.n):
            size = o[i + 1] - o[i]
            if size:
                memcpy(dst + o[i], _text_ptr(<object>PyList_GET_ITEM(items, i)), size)
        if c and rs_has_separator(<const uint8_t *>dst, <size_t>L.total[c]):
            return False
    return True


def batch_columns(bodies, tags, keys):
    """put_batch's common case laid out in one call, for batch.columns. Returns None for
    arguments of other shapes or types, and when a tags or keys item holds \\x01 or \\x02 or
    a column is empty for some messages only: the Python path then raises or lays those out,
    with its own messages. Otherwise
    (bodies_data, body_off, tags_data, tags_off, keys_data, keys_off, var, prefix, body_max,
    tk_max, var_max): data bytes with n + 1 int64 offsets (numpy) per column, None for tags
    or keys without a column; var, prefix and the maxima as _Lists has them. The prefix
    spares the put path a numpy cumsum (~5 ns a message) for the records' offsets."""
    cdef _Lists L
    cdef Py_buffer view
    cdef char *dst[3]
    cdef Py_ssize_t n
    cdef int c
    if not _lists_taken(bodies, tags, keys):
        return None
    n = PyList_GET_SIZE(bodies)
    # One int64 array for every offset column, var and prefix; the columns are views of it.
    ints = _np.empty(_lists_ints(n), dtype=_np.int64)
    PyObject_GetBuffer(ints, &view, PyBUF_WRITABLE)
    _lists_carve(&L, n, <int64_t *>view.buf)
    PyBuffer_Release(&view)             # the array, held, keeps its data where it is
    if not _list_lengths(<list>bodies, tags, keys, &L):
        return None
    data = [None, None, None]
    for c in range(3):
        if L.has[c]:
            data[c] = PyBytes_FromStringAndSize(NULL, L.total[c])
            dst[c] = PyBytes_AS_STRING(data[c])
        else:
            dst[c] = NULL
    if not _list_copy(<list>bodies, tags, keys, &L, dst[0], dst[1], dst[2]):
        return None
    step = n + 1                        # the views of _lists_carve's arrays
    offs = [ints[c * step:(c + 1) * step] if L.has[c] else None for c in range(3)]
    return (data[0], offs[0], data[1], offs[1], data[2], offs[2],
            ints[4 * step:4 * step + n], ints[3 * step:4 * step],
            L.body_max, L.tk_max, L.var_max)


cdef struct _Tpl:
    # A properties template (batch.batch_template) as _Batch takes it: the fragments (bytes,
    # held by whoever filled this), their 4 offsets, and the slot (1 for column a, 2 for b,
    # 0 for none) each of TAGS and KEYS fills.
    PyObject *frags
    int64_t off[4]
    int32_t tags_col
    int32_t keys_col


# The templates of batches without properties and without a shared TAGS or KEYS, by which of
# the two have a column (1 TAGS, 2 KEYS): most batches repeat one of these. _TPL_HELD holds
# what they point into.
cdef _Tpl _TPLS[4]
cdef list _TPL_HELD = []

# A batch whose working memory is larger than this gets its own, freed after the call, so one
# huge batch does not leave a PutPath holding its size for good.
DEF LIST_SCRATCH_MAX = 4 << 20


cdef int _tpl_set(_Tpl *t, object tpl) except -1:
    frags, frag_off, tags_col, keys_col = tpl
    if type(frags) is not bytes or len(frag_off) != 4:
        raise TypeError(f"not a properties template: {tpl!r}")
    for i in range(4):
        t.off[i] = frag_off[i]
    t.tags_col = tags_col
    t.keys_col = keys_col
    t.frags = <PyObject *>frags
    return 0


cdef char *_grown(char **block, size_t *cap, size_t need) except? NULL:
    """`*block`, grown to at least `need` bytes (its contents not kept)."""
    if cap[0] < need:
        PyMem_Free(block[0])
        block[0] = <char *>PyMem_Malloc(need)
        cap[0] = need if block[0] != NULL else 0
        if block[0] == NULL:
            raise MemoryError()
    return block[0]


cdef object _put_lists(PutPath path, topic, queue_id, bodies, tags, keys, properties, flag,
                       born_timestamp, born_host, template, written_rows):
    """PutPath.put_lists: the lists laid out (_list_lengths, _list_copy) in the path's
    working memory, the properties template from `template` (batch.batch_template; kept
    here for the batches without properties), and the batch put by PutPath._put_batch."""
    cdef _Lists L
    cdef _Batch c
    cdef _Tpl tmp
    cdef _Tpl *t
    cdef char *ints = NULL
    cdef char *data = NULL
    cdef const uint8_t *col[3]
    cdef size_t need_ints, need_data
    cdef bint cached
    cdef Py_ssize_t n, flen
    cdef int k
    cdef int32_t slot
    if not _lists_taken(bodies, tags, keys):
        return None
    if properties is not None and type(properties) is not dict:
        return None
    n = PyList_GET_SIZE(bodies)
    if n == 0:
        return None
    need_ints = _lists_ints(n) * sizeof(int64_t)
    cached = not path._lists_busy and need_ints <= LIST_SCRATCH_MAX
    if cached:
        path._lists_busy = True
    try:
        # Inside the try: a MemoryError leaves the working memory free for the next call.
        if cached:
            ints = _grown(&path._lists_ints, &path._lists_ints_cap, need_ints)
        else:
            ints = <char *>PyMem_Malloc(need_ints)
            if ints == NULL:
                raise MemoryError()
        _lists_carve(&L, n, <int64_t *>ints)
        if not _list_lengths(<list>bodies, tags, keys, &L):
            return None
        need_data = <size_t>(L.total[0] + L.total[1] + L.total[2]) + 1
        if cached and need_data <= LIST_SCRATCH_MAX:
            data = _grown(&path._lists_data, &path._lists_data_cap, need_data)
        else:
            data = <char *>PyMem_Malloc(need_data)
            if data == NULL:
                raise MemoryError()
        col[0] = <const uint8_t *>data
        col[1] = col[0] + L.total[0]
        col[2] = col[1] + L.total[1]
        if not _list_copy(<list>bodies, tags, keys, &L, <char *>col[0], <char *>col[1],
                          <char *>col[2]):
            return None
        if (type(tags) is not str and type(keys) is not str
                and not properties):
            t = &_TPLS[L.has[1] | (L.has[2] << 1)]
            if t.frags == NULL:
                tpl = template(None, None, L.has[1], L.has[2], None)
                if tpl is None:
                    return None
                _tpl_set(t, tpl)
                _TPL_HELD.append(tpl)
        else:
            tpl = template(tags, keys, L.has[1], L.has[2], properties)
            if tpl is None:
                return None     # `properties` replaces a per-message TAGS or KEYS
            _tpl_set(&tmp, tpl)
            t = &tmp
        memset(&c, 0, sizeof(c))
        c.n = n
        c.body = col[0]
        c.body_len = <size_t>L.total[0]
        c.body_off = L.off[0]
        for k in range(1, 3):
            if not L.has[k]:
                continue
            slot = t.tags_col if k == 1 else t.keys_col
            if slot == 1:
                c.a, c.a_len, c.a_off = col[k], <size_t>L.total[k], L.off[k]
            elif slot == 2:
                c.b, c.b_len, c.b_off = col[k], <size_t>L.total[k], L.off[k]
            else:
                return None
        flen = PyBytes_GET_SIZE(<object>t.frags)
        c.frags = <const uint8_t *>PyBytes_AS_STRING(<object>t.frags)
        c.frags_len = <size_t>flen
        c.frag_off = t.off
        c.tags_col = t.tags_col
        c.prefix = L.prefix
        c.shared = flen         # every message's properties hold the fragments
        c.body_max = L.body_max
        c.props_max = flen + L.tk_max
        c.var_max = flen + L.var_max
        return path._put_batch(topic, queue_id, &c, flag, born_timestamp, born_host,
                               written_rows, properties)
    finally:
        if cached:
            path._lists_busy = False
            if data != path._lists_data:
                PyMem_Free(data)
        else:
            PyMem_Free(ints)
            PyMem_Free(data)
