# SPDX-License-Identifier: Apache-2.0
# put_batch's argument layout (rocketstore/batch.py columns) in one pass for its common case.
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


cdef object _join_into(list items, Py_ssize_t n, int64_t[::1] off):
    """items joined as one bytes object, item i at off[i]:off[i + 1] (filled already)."""
    cdef Py_ssize_t i, size
    data = PyBytes_FromStringAndSize(NULL, off[n])
    cdef char *dst = PyBytes_AS_STRING(data)
    for i in range(n):
        size = off[i + 1] - off[i]
        if size:
            memcpy(dst + off[i], _text_ptr(<object>PyList_GET_ITEM(items, i)), size)
    return data


def batch_columns(bodies, tags, keys):
    """put_batch's common case laid out in one call, for batch.columns: `bodies` a list of
    bytes (or None), `tags` and `keys` each None, a str (shared: no column) or a list of as
    many str / bytes / None. Returns None for anything else, and when a tags or keys item
    holds \\x01 or \\x02 or a column is empty for some messages only: the Python path then
    raises or lays those out, with its own messages. Otherwise
    (bodies_data, body_off, tags_data, tags_off, keys_data, keys_off, var, prefix, body_max,
    tk_max, var_max): data bytes with n + 1 int64 offsets (numpy) per column, None for tags
    or keys without a column (shared, absent, or empty for every message); var[i] the
    lengths of body i, tags i and keys i summed (n int64s, numpy), prefix[i] the sum of
    var[:i] (n + 1), body_max the longest body, tk_max the longest tags i + keys i, var_max
    the largest var[i]. The prefix spares the put path a numpy cumsum (~5 ns a message) for
    the records' offsets."""
    cdef Py_ssize_t n, i, m, length
    cdef int64_t total, bmax = 0, tkmax = 0, vmax = 0, vtotal = 0, tk
    cdef int64_t[::1] bo, to, vv, pv
    cdef int c
    if type(bodies) is not list:
        return None
    n = PyList_GET_SIZE(bodies)
    for arg in (tags, keys):
        if arg is not None and type(arg) is not str and (
                type(arg) is not list or PyList_GET_SIZE(arg) != n):
            return None
    body_off = _np.empty(n + 1, dtype=_np.int64)
    bo = body_off
    bo[0] = total = 0
    for i in range(n):
        length = _text_len(<object>PyList_GET_ITEM(bodies, i), False)
        if length < 0:
            return None
        total += length
        bo[i + 1] = total
        if length > bmax:
            bmax = length
    # Joined at once, as column_join does: nothing runs between the passes that could
    # change the list.
    bodies_data = _join_into(bodies, n, bo)
    var = _np.empty(n, dtype=_np.int64)
    vv = var
    for i in range(n):
        vv[i] = bo[i + 1] - bo[i]
    out = [None, None, None, None]
    for c in range(2):
        items = tags if c == 0 else keys
        if type(items) is not list:
            continue
        offs = _np.empty(n + 1, dtype=_np.int64)
        to = offs
        to[0] = total = 0
        m = 0                                   # items with a value
        for i in range(n):
            length = _text_len(<object>PyList_GET_ITEM(items, i), True)
            if length < 0:
                return None
            m += length != 0
            total += length
            to[i + 1] = total
        if m == 0:
            continue                            # empty for every message: no column
        if m != n:
            return None                         # some lack it: their properties order differs
        data = _join_into(items, n, to)
        if rs_has_separator(<const uint8_t *>PyBytes_AS_STRING(data), <size_t>total):
            return None
        for i in range(n):
            vv[i] += to[i + 1] - to[i]
        out[2 * c] = data
        out[2 * c + 1] = offs
    prefix = _np.empty(n + 1, dtype=_np.int64)
    pv = prefix
    for i in range(n):
        pv[i] = vtotal
        tk = vv[i] - (bo[i + 1] - bo[i])
        if tk > tkmax:
            tkmax = tk
        if vv[i] > vmax:
            vmax = vv[i]
        vtotal += vv[i]
    pv[n] = vtotal
    return (bodies_data, body_off, out[0], out[1], out[2], out[3], var, prefix,
            bmax, tkmax, vmax)
