# SPDX-License-Identifier: Apache-2.0
"""MessageStore.put_batch: a columnar batch writes exactly the bytes put_messages writes for the
same messages, on every backend; bad input is refused before anything is written."""
import array
import errno
import random

import numpy as np
import pytest

from rocketstore import Message, MessageIllegalError, PutMessageStatus, testing
from rocketstore.config import BrokerRole
from rocketstore.errors import KernelArgumentError, KernelBoundsError, StoreClosedError

N = 600          # ~130 KiB of records: two rolls of small_config's 64 KiB CommitLog files
BORN = dict(born_timestamp=1_700_000_000_123, born_host=("10.0.0.7", 40001))


@pytest.fixture(params=testing.backend_params())
def backend(request):
    return testing.load_backend(request.param)


def _bodies(n=N):
    return [bytes([65 + i % 26]) * (90 + i % 37) for i in range(n)]


def _tree_after(root, backend, put, config=None, n=N):
    store = testing.open_store(root, backend, config)
    try:
        result = put(store)
        assert result.status is PutMessageStatus.PUT_OK
        assert result.count == n
    finally:
        store.shutdown()
    return testing.tree_digest(root, ignore=("lock", "abort"))


def _same_bytes(tmp_path, backend, batch_kwargs, msgs):
    """put_batch(**batch_kwargs) and put_messages(msgs) leave identical store directories,
    rolled CommitLog files, ConsumeQueues, index and checkpoint included."""
    batch = _tree_after(tmp_path / "batch", backend,
                        lambda s: s.put_batch(**batch_kwargs, **BORN))
    listed = _tree_after(tmp_path / "list", backend, lambda s: s.put_messages(msgs))
    assert sum(k.startswith("commitlog") for k in listed) >= 3
    assert batch == listed


def test_put_batch_writes_the_bytes_of_put_messages_with_keys_tags_and_properties(
        tmp_path, backend):
    bodies = _bodies()
    keys = [f"order-{i}" for i in range(N)]
    props = {"region": "eu", "trace": "t-1", "a": "1", "zz": "", "UNIQ_KEY": "FIXED"}
    msgs = [Message("Orders", b, tags="Paid", keys=k, queue_id=2, properties=props, **BORN)
            for b, k in zip(bodies, keys)]
    _same_bytes(tmp_path, backend, dict(topic="Orders", queue_id=2, bodies=bodies, tags="Paid",
                                        keys=keys, properties=props), msgs)


def test_put_batch_with_per_message_tags_and_numpy_offsets_bodies_writes_the_same_bytes(
        tmp_path, backend):
    bodies = _bodies()
    data = np.frombuffer(b"".join(bodies), dtype=np.uint8)
    offsets = np.zeros(N + 1, dtype=np.int32)           # Arrow's binary layout
    np.cumsum([len(b) for b in bodies], out=offsets[1:])
    tags = [f"tag{i % 5}" for i in range(N)]
    keys = [[f"k{i}", f"kk{i}"] for i in range(N)]
    msgs = [Message("T_1", b, tags=t, keys=k, queue_id=0, **BORN)
            for b, t, k in zip(bodies, tags, keys)]
    _same_bytes(tmp_path, backend, dict(topic="T_1", queue_id=0, bodies=(offsets, data),
                                        tags=tags, keys=keys), msgs)


def test_put_batch_where_some_messages_lack_keys_or_tags_writes_the_same_bytes(
        tmp_path, backend):
    # A missing KEYS changes the HashMap and so the order of the others: per message.
    bodies = _bodies()
    keys = [None if i % 3 == 0 else f"ключ-{i}" for i in range(N)]
    tags = ["" if i % 4 == 0 else "Tg" for i in range(N)]
    props = {f"p{j}": str(j) for j in range(14)}
    msgs = [Message("Mixed", b, tags=t, keys=k, queue_id=1, properties=props, **BORN)
            for b, t, k in zip(bodies, tags, keys)]
    _same_bytes(tmp_path, backend, dict(topic="Mixed", queue_id=1, bodies=bodies, tags=tags,
                                        keys=keys, properties=props), msgs)


def test_put_batch_with_keys_as_offsets_and_data_and_an_ipv6_born_host_writes_the_same_bytes(
        tmp_path, backend):
    bodies = _bodies()
    keys = [f"id{i}".encode() for i in range(N)]
    key_off = np.zeros(N + 1, dtype=np.int64)
    np.cumsum([len(k) for k in keys], out=key_off[1:])
    born = dict(born_timestamp=5, born_host=("::1", 9876))
    batch = _tree_after(tmp_path / "batch", backend, lambda s: s.put_batch(
        "V6", 3, bodies, keys=(key_off, b"".join(keys)), **born))
    msgs = [Message("V6", b, keys=k.decode(), queue_id=3, **born) for b, k in zip(bodies, keys)]
    assert batch == _tree_after(tmp_path / "list", backend, lambda s: s.put_messages(msgs))


class PutMessagesResultOf:
    """The status and count _tree_after checks, for a put made of several calls."""

    def __init__(self, status, count):
        self.status, self.count = status, count


def _random_column(rng, n, pool):
    kind = rng.randrange(4)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice(pool)
    present = 1.0 if kind == 2 else rng.random()     # 2: every message has one
    return [rng.choice(pool) if rng.random() < present else rng.choice([None, ""])
            for _ in range(n)]


@pytest.mark.parametrize("seed", range(12))
def test_put_batch_matches_put_messages_for_random_tags_keys_and_properties(
        tmp_path, backend, seed):
    """Whatever TAGS / KEYS are shared, per message, partly missing or overridden by the
    properties, and whatever HashMap order the names take, the bytes are put_messages'."""
    rng = random.Random(seed)
    n = 120
    names = ["a", "b", "Aa", "BB", "KEYS", "TAGS", "UNIQ_KEY", "WAIT", "éé", "p1", "p17", "q"]
    values = ["v", "", "ü-1", "x y", "false", None]
    props = {rng.choice(names): rng.choice(values) for _ in range(rng.randrange(15))}
    tags = _random_column(rng, n, ["TagA", "t", "ü"])
    keys = _random_column(rng, n, ["k1", "k1 k2", ["a", "b"], "ключ"])
    bodies = [bytes([rng.randrange(256)]) * rng.randrange(300) for _ in range(n)]
    config = testing.small_config(transient_store_pool_enable=seed % 2 == 0)

    def per(col, i):
        return col[i] if isinstance(col, list) else col
    msgs = [Message("R", b, tags=per(tags, i), keys=per(keys, i), queue_id=1,
                    properties=props, **BORN) for i, b in enumerate(bodies)]
    if isinstance(keys, str) or keys is None or rng.random() < 0.5:
        batch_keys = keys
    else:       # Message joins a list of keys with spaces; the batch takes the joined str too
        batch_keys = [k if not isinstance(k, list) else " ".join(k) for k in keys]
    got = {"batch": [], "list": []}

    def kept(name, result):
        assert result.ok, result
        got[name].append((result.commit_log_offsets.tolist(), result.sizes.tolist(),
                          result.wrote_bytes))
        return result

    def part(col, cut):
        return col[cut] if isinstance(col, list) else col

    def put_batch(s):
        # The first message alone, then the rest: the topic is known by then, so on a
        # compiled backend the second call takes the compiled path (put_lists, or
        # put_columns after batch.columns' layout).
        kept("batch", s.put_batch("R", 1, bodies[:1], tags=part(tags, slice(1)),
                                  keys=part(batch_keys, slice(1)), properties=props, **BORN))
        r = kept("batch", s.put_batch("R", 1, bodies[1:], tags=part(tags, slice(1, None)),
                                      keys=part(batch_keys, slice(1, None)), properties=props,
                                      **BORN))
        return PutMessagesResultOf(r.status, n)

    def put_messages(s):
        kept("list", s.put_messages(msgs[:1]))
        r = kept("list", s.put_messages(msgs[1:]))
        return PutMessagesResultOf(r.status, n)
    batch = _tree_after(tmp_path / "batch", backend, put_batch, config, n)
    listed = _tree_after(tmp_path / "list", backend, put_messages, config, n)
    assert batch == listed
    assert got["batch"] == got["list"]      # the offsets and sizes are computed, not read


def test_put_batch_reads_back_by_queue_offset_and_by_key(tmp_path, backend):
    store = testing.open_store(tmp_path, backend)
    try:
        store.put_message(Message("Q", b"before", queue_id=1))
        bodies = _bodies(200)
        r = store.put_batch("Q", 1, bodies, tags="t", keys=[f"key-{i}" for i in range(200)])
        assert r.ok and list(r.queue_offsets) == list(range(1, 201))
        assert list(r.commit_log_offsets[1:]) == list(r.commit_log_offsets[:-1] + r.sizes[:-1])
        got = []
        offset = 1
        while offset < 201:
            res = store.get_message("g", "Q", 1, offset, 32)
            assert res.messages, res.status
            got += [bytes(m.body) for m in res.messages]
            offset = res.next_begin_offset
        assert got == bodies
        hit = store.query_message("Q", "key-137").messages
        assert [bytes(m.body) for m in hit] == [bodies[137]]
        assert hit[0].tags == "t" and hit[0].commit_log_offset == r.commit_log_offsets[137]
        assert store.put_message(Message("Q", b"after", queue_id=1)).queue_offset == 201
    finally:
        store.shutdown()


@pytest.mark.parametrize("call, error", [
    (dict(topic="a/b"), MessageIllegalError),
    (dict(queue_id=-1), MessageIllegalError),
    (dict(queue_id="0"), MessageIllegalError),
    (dict(bodies=[b"ok", "text"]), TypeError),
    (dict(bodies=b"one body"), TypeError),
    (dict(bodies=[b"x" * 5000, b"y"]), MessageIllegalError),
    (dict(keys=["k1", "bad\x01key"]), MessageIllegalError),
    (dict(tags=["a", "b\x02"]), MessageIllegalError),
    (dict(tags=["only one"]), MessageIllegalError),
    (dict(keys=["k", 7]), TypeError),
    (dict(properties={"DELAY": "3"}), MessageIllegalError),
    (dict(properties={"x": "y" * 40000}), MessageIllegalError),
    (dict(properties=[("x", "y")]), TypeError),
    (dict(bodies=(np.array([0, 2, 1], dtype=np.int64), b"abc")), MessageIllegalError),
    (dict(bodies=(np.array([0, 2, 9], dtype=np.int64), b"abc")), MessageIllegalError),
])
def test_put_batch_refuses_bad_input_and_writes_nothing(tmp_path, backend, call, error):
    store = testing.open_store(tmp_path, backend, testing.small_config(max_message_size=4096))
    try:
        store.put_message(Message("T", b"first"))
        before = (store.commitlog.max_offset, store.get_max_offset_in_queue("T", 0))
        args = dict(topic="T", queue_id=0, bodies=[b"b1", b"b2"])
        args.update(call)
        with pytest.raises(error):
            store.put_batch(**args)
        assert (store.commitlog.max_offset, store.get_max_offset_in_queue("T", 0)) == before
        assert store.put_batch("T", 0, [b"b3"]).queue_offsets.tolist() == [1]
    finally:
        store.shutdown()


def test_put_batch_on_a_slave_is_refused(tmp_path, backend):
    store = testing.open_store(tmp_path, backend,
                               testing.small_config(broker_role=BrokerRole.SLAVE))
    try:
        r = store.put_batch("T", 0, [b"x"])
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and r.count == 0
        assert store.commitlog.max_offset == 0
    finally:
        store.shutdown()


def test_batch_encode_kernel_equals_msg_encode_and_checks_its_offsets(backend):
    k = backend
    topic, host = b"Kt", bytes([10, 0, 0, 1, 0, 0, 0x1f, 0x90])
    bodies = [b"hello", b"", b"w" * 300]
    boff = np.array([0, 5, 5, 305], dtype=np.int64)
    keys = [b"a", b"bb", b"ccc"]
    koff = np.array([0, 1, 3, 6], dtype=np.int64)
    frags = b"KEYS\x01" + b"\x02x\x01y"
    foff = np.array([0, 5, 9, 9], dtype=np.int64)
    out = bytearray(2000)
    count, nbytes = k.batch_encode(out, 10, len(out), topic, 4, b"".join(bodies), boff,
                                   b"".join(keys), koff, None, None, frags, foff, 0, 3, 7, 0,
                                   11, host, 12, host, 100, 5000)
    want = bytearray(2000)
    pos = 10
    for i in range(3):
        pos += k.msg_encode(want, pos, topic, bodies[i], b"KEYS\x01" + keys[i] + b"\x02x\x01y",
                            4, 7, 100 + i, 5000 + pos - 10, 0, 11, host, 12, host, 0, 0)
    assert (count, nbytes) == (3, pos - 10) and out == want
    # The blank's 8 bytes stay free: the second record stops where the limit says.
    first = k.msg_size(0, 5, 2, 10)
    assert k.batch_encode(bytearray(2000), 0, first + 8 + 5, topic, 4, b"".join(bodies), boff,
                          b"".join(keys), koff, None, None, frags, foff, 0, 3, 7, 0, 11, host,
                          12, host, 100, 5000) == (1, first)
    with pytest.raises(KernelBoundsError):
        k.batch_encode(bytearray(2000), 0, 2000, topic, 4, b"".join(bodies),
                       np.array([0, 5, 5, 306], dtype=np.int64), None, None, None, None, frags,
                       foff, 0, 3, 7, 0, 11, host, 12, host, 100, 5000)


def test_batch_encode_kernel_reports_each_written_record_offset_and_length(backend):
    """phys and sizes receive, for exactly the records written, what put_batch returns: each
    record's PHYSICALOFFSET and length (from record `first`, stopping where the limit does)."""
    k = backend
    topic, host = b"Kt", bytes([10, 0, 0, 1, 0, 0, 0x1f, 0x90])
    bodies = [b"hello", b"", b"w" * 300, b"zz"]
    boff = np.array([0, 5, 5, 305, 307], dtype=np.int64)
    frags, foff = b"x\x01y", np.array([0, 3, 3, 3], dtype=np.int64)
    sizes_all = [k.msg_size(0, len(b), len(topic), 3) for b in bodies]
    args = (topic, 4, b"".join(bodies), boff, None, None, None, None, frags, foff)
    phys = np.full(4, -1, dtype=np.int64)
    sizes = np.full(4, -1, dtype=np.int64)
    # From record 1, with room for records 1 and 2 only (and the blank's 8 bytes).
    limit = 10 + sizes_all[1] + sizes_all[2] + 8
    count, nbytes = k.batch_encode(bytearray(2000), 10, limit, *args, 1, 4, 7, 0, 11, host, 12,
                                   host, 100, 5000, phys=phys, sizes=sizes)
    assert (count, nbytes) == (2, sizes_all[1] + sizes_all[2])
    assert phys.tolist() == [5000, 5000 + sizes_all[1], -1, -1]
    assert sizes.tolist() == [sizes_all[1], sizes_all[2], -1, -1]
    with pytest.raises(KernelArgumentError):    # room for fewer records than asked for
        k.batch_encode(bytearray(2000), 0, 2000, *args, 0, 4, 7, 0, 11, host, 12, host, 100,
                       5000, phys=np.empty(3, dtype=np.int64))
    # Any writable, contiguous buffer of int64s will do, on every backend.
    room = array.array("q", [-1] * 4)
    k.batch_encode(bytearray(2000), 10, limit, *args, 1, 4, 7, 0, 11, host, 12, host, 100,
                   5000, sizes=room)
    assert room.tolist() == [sizes_all[1], sizes_all[2], -1, -1]
    for wrong in (np.empty(4, dtype=np.int32), bytes(32), np.empty(4, dtype=np.int64)[::-1]):
        with pytest.raises(TypeError):
            k.batch_encode(bytearray(2000), 0, 2000, *args, 0, 4, 7, 0, 11, host, 12, host,
                           100, 5000, sizes=wrong)


def no_space_for(where):
    """A file system refusing with ENOSPC every reservation of a path containing `where`."""
    fs = testing.FaultInjectingFileSystem()
    fs.fail("reserve", errno.ENOSPC, match=where)
    return fs


def test_put_batch_stopped_by_a_full_disk_keeps_what_it_wrote_and_refuses_the_rest(
        tmp_path, backend):
    # The second CommitLog file cannot be reserved: the batch fills the first and stops.
    fs = no_space_for("%020d" % (64 * 1024))
    store = testing.open_store(tmp_path, backend, fs=fs)
    try:
        bodies = _bodies()
        r = store.put_batch("Full", 0, bodies, keys=[f"k{i}" for i in range(N)])
        assert r.status in (PutMessageStatus.SERVICE_NOT_AVAILABLE,
                            PutMessageStatus.CREATE_MAPEDFILE_FAILED)
        assert "disk full" in r.reason
        assert 0 < r.count < N and r.queue_offsets.tolist() == list(range(r.count))
        assert len(r.commit_log_offsets) == len(r.sizes) == len(r.msg_ids) == r.count
        assert int(r.commit_log_offsets[-1] + r.sizes[-1]) <= 64 * 1024 - 8
        got, offset = [], 0
        while True:
            res = store.get_message("g", "Full", 0, offset, 32)
            if not res.messages:
                break
            got += [bytes(m.body) for m in res.messages]
            offset = res.next_begin_offset
        assert got == bodies[:r.count]
        later = store.put_batch("Full", 0, [b"later"])
        assert later.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and later.count == 0
    finally:
        store.shutdown()


def test_column_join_gives_utf8_data_and_offsets_or_none_for_other_types(backend):
    data, off = backend.column_join([b"ab", None, "é", "", b"z"], True)
    assert data == b"ab\xc3\xa9z" and np.frombuffer(off, dtype=np.int64).tolist() == [
        0, 2, 2, 4, 4, 5]
    assert backend.column_join([b"ab", "text"], False) is None     # a str is no body
    assert backend.column_join([b"ab", bytearray(b"c")], True) is None
    assert backend.column_join((b"ab",), True) is None              # only a list
    data, off = backend.column_join([], False)
    assert data == b"" and np.frombuffer(off, dtype=np.int64).tolist() == [0]


def test_put_batch_of_nothing_stores_nothing(tmp_path, backend):
    store = testing.open_store(tmp_path, backend)
    try:
        r = store.put_batch("T", 0, [])
        assert r.ok and r.count == 0 and len(r.commit_log_offsets) == 0
        assert store.commitlog.max_offset == 0 and ("T", 0) not in store.commitlog.topic_queue_table
    finally:
        store.shutdown()


def test_put_batch_after_puts_stopped_raises_store_closed_and_writes_nothing(tmp_path, backend):
    store = testing.open_store(tmp_path, backend)
    try:
        store.commitlog.stop_puts()      # what shutdown does first, under the put lock
        with pytest.raises(StoreClosedError):
            store.put_batch("T", 0, [b"late"])
        assert store.commitlog.max_offset == 0
    finally:
        store.shutdown()


def test_put_batch_across_file_rolls_returns_the_offsets_sizes_and_ids_put_messages_returns(
        tmp_path, backend):
    """The records' offsets are computed, not read back: across two rolls they must still be
    where put_messages puts the same messages."""
    bodies = _bodies()
    keys = [f"k{i}" for i in range(N)]
    tags = [f"t{i % 5}" for i in range(N)]
    results = {}
    for name in ("batch", "list"):
        store = testing.open_store(tmp_path / name, backend)
        try:
            store.put_message(Message("R", b"first", queue_id=3, **BORN))
            if name == "batch":
                r = store.put_batch("R", 3, bodies, tags=tags, keys=keys,
                                    properties={"p": "v"}, **BORN)
            else:
                r = store.put_messages([Message("R", b, tags=t, keys=k, queue_id=3,
                                                properties={"p": "v"}, **BORN)
                                        for b, t, k in zip(bodies, tags, keys)])
            assert r.ok and r.count == N
            results[name] = (r.commit_log_offsets.tolist(), r.sizes.tolist(),
                             r.queue_offsets.tolist(), r.wrote_bytes, r.msg_ids)
        finally:
            store.shutdown()
    offsets = results["batch"][0]
    assert offsets[-1] >= 2 * 64 * 1024         # two rolls, as small_config's files
    assert results["batch"] == results["list"]


CEXT_ONLY = pytest.mark.skipif("cext" not in testing.backend_params(),
                               reason="the cext backend is not built")


def _layout(cols):
    """Everything batch_encode and the put path read from a Columns, as plain lists."""
    var, prefix, shared, body_max, props_max, var_max = cols.record_lens()
    col = [None if c is None else (bytes(c.data[c.off[0]:c.off[-1]]), np.diff(c.off).tolist())
           for c in (cols.bodies, cols.a, cols.b)]
    return (cols.n, col, bytes(cols.frags), np.asarray(cols.frag_off).tolist(),
            cols.props_lens.tolist(), (var + shared).tolist(),
            (prefix + shared * np.arange(cols.n + 1)).tolist(), body_max, props_max, var_max)


@CEXT_ONLY
@pytest.mark.parametrize("tags, keys, properties", [
    (["a", "bb", "ü"], ["k1", "k2", "ключ"], None),
    ("shared", ["k1", "k2", "k3"], {"x": "1", "KEYS": "over"}),   # the dict replaces KEYS
    (["a", "b", "c"], ["k1", "k2", "k3"], {"TAGS": "over"}),
    (None, None, {"TAGS": "p", "z": "2"}),
    ([None, "", None], [b"k1", "k2", "k3"], None),      # an empty column is no column
    ("", "", None),
])
def test_compiled_batch_columns_lay_out_what_the_python_path_lays_out(tags, keys, properties):
    """The cext backend's batch_columns stands in for batch.columns' Python layout: same
    columns, fragments, properties lengths, record lengths and maxima."""
    from rocketstore.batch import columns
    k = testing.load_backend("cext")
    bodies = [b"body-1", b"", None][:2] + [b"x" * 300]
    assert k.batch_columns(bodies, tags, keys) is not None
    fast = columns(bodies, tags, keys, properties, k.column_join, k.batch_columns)
    slow = columns(bodies, tags, keys, properties, k.column_join)
    assert _layout(fast) == _layout(slow)
    empty = columns([], None, [], properties, k.column_join, k.batch_columns)
    assert _layout(empty) == _layout(columns([], None, [], properties, k.column_join))


@CEXT_ONLY
@pytest.mark.parametrize("bodies, tags, keys", [
    ([b"a", bytearray(b"b")], None, None),                # other buffers: body_bytes
    ((b"a", b"b"), None, None),                           # not a list
    ([b"a", "text"], None, None),                         # a str is no body
    ([b"a", b"b"], ["t"], None),                          # one value for two bodies
    ([b"a", b"b"], None, ["k", ["k1", "k2"]]),            # a list of keys
    ([b"a", b"b"], ["t", None], None),                    # some messages lack TAGS
    ([b"a", b"b"], None, ["k", "bad\x01"]),               # a properties separator
    ([b"a", b"b"], ("t", "u"), None),                     # a tuple of tags
])
def test_compiled_batch_columns_hands_every_other_case_to_the_python_path(bodies, tags, keys):
    """Each of these is laid out or refused by batch.columns in Python, with its messages."""
    k = testing.load_backend("cext")
    assert k.batch_columns(bodies, tags, keys) is None


def _compiled_path(store):
    """The cext backend's PutPath (put_batch's compiled path), or None on other backends."""
    path = getattr(store.put_message, "__self__", None)
    return path if type(path).__name__ == "PutPath" else None


@pytest.mark.parametrize("pool", [False, True], ids=["mapped", "transient-pool"])
def test_put_batch_in_small_calls_writes_and_returns_what_put_messages_does_across_rolls(
        tmp_path, backend, pool):
    """Calls of a few messages: on the compiled backend most fit their file and take its one
    compiled call, the ones that roll or reserve take the Python path; the two must leave the
    same files and give the same results as put_messages of the same messages."""
    config = dict(transient_store_pool_enable=True, transient_store_pool_size=4) if pool else {}
    bodies = _bodies()
    keys = [f"k{i}" for i in range(N)]
    tags = [f"t{i % 5}" for i in range(N)]
    props = {"p": "v", "region": "eu"}
    step = 7
    trees, results, counts = {}, {}, {}
    for name in ("batch", "list"):
        root = tmp_path / name
        store = testing.open_store(root, backend, testing.small_config(**config))
        got = []
        try:
            for i in range(0, N, step):
                if name == "batch":
                    r = store.put_batch("R", 3, bodies[i:i + step], tags=tags[i:i + step],
                                        keys=keys[i:i + step], properties=props, **BORN)
                else:
                    r = store.put_messages([
                        Message("R", b, tags=t, keys=k, queue_id=3, properties=props, **BORN)
                        for b, t, k in zip(bodies[i:i + step], tags[i:i + step],
                                           keys[i:i + step])])
                assert r.ok and r.count == len(bodies[i:i + step])
                got.append((r.commit_log_offsets.tolist(), r.sizes.tolist(),
                            r.queue_offsets.tolist(), r.wrote_bytes, r.msg_ids,
                            r.store_timestamp))
            path = _compiled_path(store)
            counts[name] = None if path is None else (path.fast, path.slow)
            testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
        finally:
            store.shutdown()
        results[name] = got
        trees[name] = testing.tree_digest(root, ignore=("lock", "abort"))
    assert results["batch"] == results["list"]
    assert sum(k.startswith("commitlog") for k in trees["list"]) >= 3
    assert trees["batch"] == trees["list"]
    if counts["batch"] is not None:
        fast, slow = counts["batch"]
        # Most calls compiled; the first (a topic not seen yet) and each roll or reservation
        # went to Python.
        assert fast >= N // 2 and 3 <= slow < N // step // 2


@CEXT_ONLY
def test_a_batch_that_fits_its_file_is_stored_by_one_compiled_call_and_the_rest_fall_back(
        tmp_path):
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"),
                               testing.small_config(mapped_file_size_commit_log=4 << 20))
    try:
        path = _compiled_path(store)
        bodies = _bodies(50)
        r = store.put_batch("C", 0, bodies, tags="a", **BORN)    # the topic is new: Python
        assert r.ok and (path.fast, path.slow) == (0, 1)
        r = store.put_batch("C", 0, bodies, tags="a", keys=[f"k{i}" for i in range(50)],
                            **BORN)
        assert r.ok and (path.fast, path.slow) == (50, 1)
        assert r.queue_offsets.tolist() == list(range(50, 100))
        # A born host not seen yet, an empty batch and a body over the limit: Python's path,
        # which validates, caches or refuses.
        r = store.put_batch("C", 0, bodies[:2], born_host=("10.9.9.9", 1))
        assert r.ok and (path.fast, path.slow) == (50, 2)
        assert store.put_batch("C", 0, []).count == 0
        with pytest.raises(MessageIllegalError):
            store.put_batch("C", 0, [b"x" * (store.config.max_message_size + 1)], **BORN)
        assert path.fast == 50
        # A batch over 64 KiB: compiled, its encode without the GIL.
        big = [bytes([97 + i % 26]) * 600 for i in range(400)]
        r = store.put_batch("C", 1, big, tags="big", **BORN)
        assert r.ok and r.count == 400 and path.fast == 450
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
        got = store.get_message("g", "C", 1, 0, 400)
        assert [bytes(m.body) for m in got.messages] == big
        assert [m.tags for m in got.messages] == ["big"] * 400
        assert [bytes(m.body) for m in store.get_message("g", "C", 0, 50, 50).messages] == \
            bodies
        assert store.query_message("C", "k7", 10).messages[0].body == bodies[7]
    finally:
        store.shutdown()


def test_put_batch_calls_that_vary_their_columns_write_what_put_messages_writes(
        tmp_path, backend):
    """One store, one call after another, each with other columns: per-message TAGS and
    KEYS, either alone, neither, shared ones, properties beside them or replacing them, and
    some messages without TAGS. On the compiled backend these take put_lists with a kept
    template, or decline to batch.columns; every backend writes put_messages' bytes."""
    n = 40
    bodies = [bytes([48 + i % 10]) * (20 + i) for i in range(n)]
    tags = [f"t{i % 3}" for i in range(n)]
    keys = [f"key-{i}" for i in range(n)]
    calls = [dict(tags=tags, keys=keys), dict(tags=tags), dict(keys=keys), dict(),
             dict(tags="shared", keys=keys), dict(tags=tags, keys="k1 k2"),
             dict(tags=tags, keys=keys, properties={"p": "1", "TAGS": "over"}),
             dict(tags=tags, keys=keys, properties={"a": "x", "zz": "y"}),
             dict(tags=[None] + tags[1:], keys=keys), dict(tags=tags, keys=keys)]

    def message(i, tags=None, keys=None, properties=None):
        def per(col):
            return col[i] if isinstance(col, list) else col
        return Message("Vary", bodies[i], tags=per(tags), keys=per(keys), queue_id=0,
                       properties=properties, **BORN)

    def put(store, as_batch):
        for kw in calls:
            if as_batch:
                r = store.put_batch("Vary", 0, bodies, **kw, **BORN)
            else:
                r = store.put_messages([message(i, **kw) for i in range(n)])
            assert r.ok and r.count == n
        return PutMessagesResultOf(r.status, n)
    batch = _tree_after(tmp_path / "batch", backend, lambda s: put(s, True), n=n)
    listed = _tree_after(tmp_path / "list", backend, lambda s: put(s, False), n=n)
    assert batch == listed


@CEXT_ONLY
def test_a_batch_of_lists_is_laid_out_and_put_in_one_compiled_call(tmp_path, monkeypatch):
    """put_batch's common case never reaches batch.columns (the Python layout) on the cext
    backend: the lists are laid out by put_lists itself. Cases it does not take -- some
    messages without TAGS, properties replacing the KEYS column, a tuple of bodies -- are laid
    out by batch.columns, and still stored by the compiled put_columns."""
    import rocketstore.store as store_module
    laid_out = []
    real_columns = store_module.columns

    def columns(*args):
        laid_out.append(args[0])
        return real_columns(*args)
    monkeypatch.setattr(store_module, "columns", columns)
    store = testing.open_store(tmp_path / "s", testing.load_backend("cext"),
                               testing.small_config(mapped_file_size_commit_log=4 << 20))
    try:
        path = _compiled_path(store)
        bodies = _bodies(30)
        keys = [f"k{i}" for i in range(30)]
        assert store.put_batch("L", 0, bodies[:1], **BORN).ok     # a new topic: Python
        assert len(laid_out) == 1 and (path.fast, path.slow) == (0, 1)
        for kw in (dict(tags="a", keys=keys), dict(tags=["x"] * 30), dict(keys=keys),
                   dict(keys=keys, properties={"region": "eu"}), dict()):
            r = store.put_batch("L", 0, bodies, **kw, **BORN)
            assert r.ok and r.count == 30
        assert len(laid_out) == 1 and (path.fast, path.slow) == (150, 1)
        r = store.put_batch("L", 0, bodies, tags=[None] + ["x"] * 29, **BORN)
        assert r.ok and len(laid_out) == 2
        r = store.put_batch("L", 0, bodies, keys=keys, properties={"KEYS": "over"}, **BORN)
        assert r.ok and len(laid_out) == 3
        r = store.put_batch("L", 0, tuple(bodies), **BORN)
        assert r.ok and len(laid_out) == 4
        assert (path.fast, path.slow) == (240, 1)
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
        got = store.get_message("g", "L", 0, 1, 30).messages
        assert [bytes(m.body) for m in got] == bodies and {m.tags for m in got} == {"a"}
        assert len(store.query_message("L", "k7", 10).messages) == 3
        found = store.query_message("L", "over", 64).messages
        assert sorted(bytes(m.body) for m in found) == sorted(bodies)
    finally:
        store.shutdown()


def test_put_batch_from_several_threads_stores_every_batch_whole_and_in_order(
        tmp_path, backend):
    """Threads putting batches at once: on cext each batch is laid out while another's may
    hold the put path's working memory, and batches of over 64 KiB are encoded without the
    GIL. Every message reads back in its queue's order with its own body, tags and key."""
    import threading
    threads, calls, n = 4, 6, 300
    store = testing.open_store(tmp_path / "s", backend,
                               testing.small_config(mapped_file_size_commit_log=32 << 20))
    errors = []

    def bodies_of(t, c):
        return [bytes([65 + (t * 7 + c + i) % 26]) * (200 + (i % 150)) for i in range(n)]

    def put(t):
        try:
            for c in range(calls):
                r = store.put_batch("Threads", t, bodies_of(t, c),
                                    tags=[f"t{t}" for _ in range(n)],
                                    keys=[f"k{t}-{c}-{i}" for i in range(n)], **BORN)
                assert r.ok and r.count == n, r
                assert r.queue_offsets.tolist() == list(range(c * n, (c + 1) * n))
        except BaseException as exc:            # reported by the main thread
            errors.append(exc)
    try:
        store.put_batch("Threads", 0, [b"first"], **BORN)       # the topic is known now
        workers = [threading.Thread(target=put, args=(t,)) for t in range(1, threads + 1)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors, errors
        testing.wait_until(lambda: store.dispatch_behind_bytes() == 0, what="dispatch")
        for t in range(1, threads + 1):
            got = []
            while len(got) < calls * n:
                got += store.get_message("g", "Threads", t, len(got), 64).messages
            assert [bytes(m.body) for m in got] == [b for c in range(calls)
                                                    for b in bodies_of(t, c)]
            assert {m.tags for m in got} == {f"t{t}"}
            assert [m.keys for m in got] == [f"k{t}-{c}-{i}" for c in range(calls)
                                             for i in range(n)]
    finally:
        store.shutdown()
