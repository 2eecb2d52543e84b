# SPDX-License-Identifier: Apache-2.0
"""The compiled index dispatcher (the cext backend's index_dispatch) against the index_keys +
index_put_batch path every backend takes: the same index files, byte for byte, through keys,
UNIQ_KEY, multi-key, non-ASCII keys, rollbacks, rolls inside and between records, and
reservations; and Python is asked only to roll a file or reserve blocks."""
import struct

import numpy as np
import pytest

from rocketstore import format as F
from rocketstore import testing
from rocketstore.errors import KernelBoundsError
from rocketstore.index_file import IndexFile
from rocketstore.message import Message


def workload(n):
    """Records whose keys exercise every rule of IndexService#buildIndex."""
    out = []
    for i in range(n):
        props = {}
        keys = None
        kind = i % 9
        if kind == 0:
            keys = f"k{i}"
        elif kind == 1:
            keys = f" a{i}  b{i} c{i} "          # leading, doubled and trailing spaces
        elif kind == 2:
            props["UNIQ_KEY"] = f"U{i:08X}"
            keys = f"k{i} kk{i}"
        elif kind == 3:
            keys = f"ключ{i} 键{i} \U0001F600{i}"   # 2-, 3- and 4-byte UTF-8 (a surrogate pair)
        elif kind == 4:
            props["UNIQ_KEY"] = f"U{i:08X}"      # UNIQ_KEY alone
        elif kind == 5:
            keys = "   "                          # only spaces: no key
        elif kind == 6:
            keys = " ".join(f"m{i}-{j}" for j in range(7))   # more keys than a small file holds
        sys_flag = F.TRANSACTION_ROLLBACK_TYPE if i % 13 == 0 else \
            F.TRANSACTION_PREPARED_TYPE if i % 11 == 0 else 0
        out.append(Message(f"T{i % 3}", b"m%d" % i, keys=keys, queue_id=i % 2,
                           sys_flag=sys_flag, properties=props))
    return out


def straddling_records(index_dir):
    """Records whose keys a roll split between two files: a file's first entry is at the
    phyOffset its predecessor's last entry is at."""
    heads = [struct.unpack_from(">qqqq", p.read_bytes()[:32]) for p in sorted(index_dir.iterdir())]
    return sum(1 for a, b in zip(heads, heads[1:]) if b[2] == a[3])


def index_digest(root):
    return {k: v for k, v in testing.tree_digest(root).items() if k.startswith("index")}


def run_store(root, backend, compiled=True, batches=(40, 1, 150, 7), **config):
    """Put `batches` records at a time with reput standing still, dispatching each in one go;
    returns the calls the compiled loop made to Python, as (file was full, rows left)."""
    store = testing.open_store(root, backend, testing.small_config(**config))
    idx = store.index_service
    if not compiled:
        idx._k_dispatch = None
    calls = []
    room = idx._make_room

    def counting(f, ts, rows_left):
        calls.append((f.is_write_full, rows_left))
        return room(f, ts, rows_left)
    idx._make_room = counting
    msgs = workload(sum(batches))
    try:
        store.reput_service.shutdown()
        at = 0
        for size in batches:
            for m in msgs[at:at + size]:
                assert store.put_message(m).status.ok
            at += size
            store.reput_service.do_reput()
        found = store.query_message("T0", "ключ3").messages + \
            store.query_message("T0", "\U0001F60048").messages
        assert [m.body for m in found] == [b"m3", b"m48"]
        return calls, len(idx.index_file_list)
    finally:
        store.reput_service.start()
        store.shutdown()


def test_every_backend_writes_the_same_index_files_through_keys_rolls_and_rollbacks(tmp_path):
    digests = {}
    for name in testing.backend_params():
        k = testing.load_backend(name)
        run_store(tmp_path / name, k, max_index_num=40, max_hash_slot_num=8)
        digests[name] = index_digest(tmp_path / name)
    if "cext" in digests:
        run_store(tmp_path / "numpy", testing.load_backend("cext"), compiled=False,
                  max_index_num=40, max_hash_slot_num=8)
        digests["cext without index_dispatch"] = index_digest(tmp_path / "numpy")
    first = next(iter(digests.values()))
    assert len(first) > 5 and straddling_records(tmp_path / "cext" / "index") > 0
    for name, d in digests.items():
        assert d == first, f"{name} differs"


@pytest.fixture
def cext():
    return testing.load_backend("cext")


def test_compiled_dispatch_calls_python_only_to_roll_and_reserve(tmp_path, cext):
    batches = (40, 1, 150, 7)
    calls, files = run_store(tmp_path / "c", cext, batches=batches, max_index_num=40,
                             max_hash_slot_num=8)
    # One call per roll, none per row or key (the files are small enough to be reserved
    # whole); a roll at a batch's first record is made before the loop, as in the numpy path.
    assert all(full for full, _ in calls)
    assert files - 1 - len(batches) <= len(calls) <= files - 1


def test_compiled_dispatch_reserves_blocks_as_a_large_batch_goes(tmp_path, cext):
    # 20 000 entries: a file of 400 KB whose blocks are reserved 64 KiB (3 276 entries) ahead.
    geometry = dict(max_index_num=20_000, max_hash_slot_num=1000,
                    mapped_file_size_commit_log=1 << 20)
    calls, files = run_store(tmp_path / "c", cext, batches=(6000,), **geometry)
    run_store(tmp_path / "n", cext, compiled=False, batches=(6000,), **geometry)
    assert index_digest(tmp_path / "c") == index_digest(tmp_path / "n")
    assert files == 1 and calls and not any(full for full, _ in calls)
    assert len(calls) < 6                   # each reservation covers the rows left


def test_index_dispatch_refuses_rows_outside_the_buffer_before_writing(tmp_path, cext):
    buf = bytearray(4096)
    pos = cext.msg_encode(buf, 0, b"T", b"x", b"KEYS\x01a b", 0, 0, 0, 0, 0, 0,
                          b"\x7f\x00\x00\x01\x00\x00\x00\x01", 0,
                          b"\x7f\x00\x00\x01\x00\x00\x00\x02", 0, 0)
    rows = np.zeros(2, dtype=F.SCAN_DTYPE)
    assert cext.commitlog_scan(buf, 0, pos, True, rows)[0] == 1
    rows[1] = rows[0]
    rows[1]["props_len"] = 4096                 # past the buffer
    f = IndexFile(str(tmp_path / "20260101000000000"), 8, 40, cext, _fs(), writable=True)
    before = bytes(f.mm)
    with pytest.raises(KernelBoundsError):
        cext.index_dispatch(rows, bytes(buf[:pos]), f, 0, None)
    assert bytes(f.mm) == before
    cext.index_dispatch(rows[:1], bytes(buf[:pos]), f, 1, None)     # key "a" is in already
    assert f.index_count == 2
    f.close()


def _fs():
    from rocketstore.fs import FileSystem
    return FileSystem()


def _props_of_every_length(rng, count):
    """Properties strings of 0 to ~90 bytes (the compiled dispatch reads 16 to 64 bytes with
    bit masks, others with memchr): KEYS values with spaces anywhere, UNIQ_KEY, repeated and
    empty KEYS segments (the last valid one wins), names without a value, empty segments."""
    def word():
        return "".join(rng.choice("ab  c") for _ in range(rng.randrange(0, 14)))
    pieces = [lambda: "KEYS\x01" + word(), lambda: "UNIQ_KEY\x01" + word(),
              lambda: "TAGS\x01" + word(), lambda: "KEYS", lambda: "KEYS\x01",
              lambda: "", lambda: "X\x01" + word(), lambda: " KEYS\x01" + word()]
    out = []
    while len(out) < count:
        props = "\x02".join(rng.choice(pieces)() for _ in range(rng.randrange(1, 6)))
        if len(props) <= 90:
            out.append(props.encode())
    return out


def test_index_dispatch_finds_keys_as_index_keys_does_in_properties_of_every_length(tmp_path,
                                                                                    cext):
    import random
    pure = testing.load_backend("pure")
    host = b"\x7f\x00\x00\x01\x00\x00\x00\x01"
    buf = bytearray(1 << 20)
    pos = 0
    all_props = _props_of_every_length(random.Random(11), 3000)
    assert {len(p) for p in all_props} >= set(range(0, 70))
    for i, props in enumerate(all_props):
        pos += cext.msg_encode(buf, pos, b"T%d" % (i % 3), b"x", props, 0, 0, i, pos, 0,
                               1_700_000_000_000, host, 1_700_000_000_000 + i, host, 0, 0)
    data = bytes(buf[:pos])
    rows = np.zeros(len(all_props), dtype=F.SCAN_DTYPE)
    assert pure.commitlog_scan(data, 0, pos, True, rows)[0] == len(all_props)
    # The reference: index_keys (every backend's path) then index_put_batch, in pure Python.
    hashes = np.zeros(20_000, dtype=np.int32)
    of_row = np.zeros(20_000, dtype=np.int32)
    n, done = pure.index_keys(data, rows, hashes, of_row)
    assert done == len(rows) and n > 2000
    f = IndexFile(str(tmp_path / "20260101000000000"), 4099, 20_000, cext, _fs(), writable=True)
    want = bytearray(len(f.mm))
    pure.index_put_batch(want, 4099, 20_000, hashes[:n], rows["phy_offset"][of_row[:n]],
                         rows["store_timestamp"][of_row[:n]])
    cext.index_dispatch(rows, data, f, 0, None)
    assert f.index_count == n + 1
    table = F.INDEX_HEADER_SIZE
    assert bytes(f.mm)[table:] == bytes(want)[table:]
    f.close()
