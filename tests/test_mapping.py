# SPDX-License-Identifier: Apache-2.0
"""Files are mapped without holding a descriptor each (kernels' optional `Mapping`), so the
number of queues a store can serve is not bounded by `ulimit -n`; a Mapping behaves as the
mmap.mmap it replaces."""
import json
import mmap
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from rocketstore import testing
from rocketstore.fs import DEFAULT as FS, mappings_hold_descriptors

MAPPING_BACKENDS = [b for b in testing.backend_params()
                    if hasattr(testing.load_backend(b), "Mapping")]
FD_FREE_BACKENDS = [b for b in testing.backend_params()
                    if not mappings_hold_descriptors(testing.load_backend(b))]


@pytest.fixture(params=MAPPING_BACKENDS)
def Mapping(request):
    return testing.load_backend(request.param).Mapping


def _file(tmp_path, size, name="f", data=b""):
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(data)
        f.truncate(size)
    return path


def _open(Mapping, path, size, writable=True):
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        return Mapping(fd, size, writable)
    finally:
        os.close(fd)


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as exc:   # the exception type is what is compared
        return ("raised", type(exc))


def test_the_compiled_backend_maps_files(tmp_path):
    # The guard: a build that lost the Mapping would otherwise just shrink this module's matrix.
    if "cext" in testing.backend_params():
        assert "cext" in MAPPING_BACKENDS and "cext" in FD_FREE_BACKENDS


def test_mapping_reads_writes_and_fails_like_mmap(Mapping, tmp_path):
    size = 3 * mmap.PAGESIZE
    seed = bytes(range(256)) * (size // 256)
    ours = _open(Mapping, _file(tmp_path, size, "a", seed), size)
    ref_f = open(_file(tmp_path, size, "b", seed), "r+b")
    ref = mmap.mmap(ref_f.fileno(), size)
    big = os.urandom(100_000)
    steps = [
        lambda m: len(m),
        lambda m: m[5], lambda m: m[-1], lambda m: m[size],
        lambda m: m[10:20], lambda m: m[-8:], lambda m: m[20:10], lambda m: m[1:50:7],
        lambda m: m[::-1][:5],
        lambda m: m.__setitem__(slice(0, 3), b"abc"),
        lambda m: m.__setitem__(slice(0, 3), b"ab"),
        lambda m: m.__setitem__(7, 200), lambda m: m.__setitem__(7, 256),
        lambda m: m.__setitem__(-1, 1), lambda m: m.__setitem__(size, 1),
        lambda m: m.__setitem__(slice(100, 100 + len(big)), big),
        lambda m: m.__setitem__(slice(1, 30, 3), b"zzzzzzzzzz"),
        lambda m: m.__setitem__(slice(40, 60), memoryview(m)[0:20]),
        lambda m: m.__delitem__(0),
        lambda m: m.find(b"abc"), lambda m: m.find(b"abc", 1), lambda m: m.find(big[-9:]),
        lambda m: m.find(b"\x05\x06", -300), lambda m: m.find(b"\x05\x06", 0, 6),
        lambda m: m.find(b"not there at all"), lambda m: m.find(b""),
        lambda m: m.flush(), lambda m: m.flush(mmap.PAGESIZE, 10), lambda m: m.flush(0, size + 1),
        lambda m: m.madvise(mmap.MADV_WILLNEED, mmap.PAGESIZE, 8),
        lambda m: m.madvise(mmap.MADV_WILLNEED, size),
        lambda m: bytes(m) == bytes(m[:]),
        lambda m: m[:],
    ]
    try:
        for i, step in enumerate(steps):
            assert _outcome(step, ours) == _outcome(step, ref), f"step {i}"
        assert np.frombuffer(ours, np.uint8).tobytes() == bytes(ref)
    finally:
        ours.close()
        ref.close()
        ref_f.close()


def test_mapping_writes_reach_the_file(Mapping, tmp_path):
    path = _file(tmp_path, 2 * mmap.PAGESIZE)
    m = _open(Mapping, path, 2 * mmap.PAGESIZE)
    m[4000:4200] = b"x" * 200
    m.flush(4000, 200)
    m.close()
    with open(path, "rb") as f:
        assert f.read()[3999:4201] == b"\0" + b"x" * 200 + b"\0"


def test_mapping_refuses_to_close_while_a_view_is_exported(Mapping, tmp_path):
    m = _open(Mapping, _file(tmp_path, mmap.PAGESIZE), mmap.PAGESIZE)
    view = memoryview(m)
    arr = np.frombuffer(m, dtype=np.uint8)
    arr_ro = np.frombuffer(m, dtype=np.uint8)
    with pytest.raises(BufferError):
        m.close()
    view.release()
    del arr
    with pytest.raises(BufferError):
        m.close()
    assert not m.closed and arr_ro[0] == 0    # still mapped: the last view still reads
    del arr_ro
    m.close()
    assert m.closed
    m.close()                                  # a second close is a no-op, as for mmap
    for use in (lambda: len(m), lambda: m[0], lambda: m[0:1], lambda: memoryview(m),
                lambda: m.find(b"a"), lambda: m.flush(), lambda: m.madvise(0)):
        with pytest.raises(ValueError):
            use()


@pytest.mark.parametrize("drop", ["close", "last reference"])
def test_unmapping_a_mapping_with_every_page_mapped_lets_other_threads_run(Mapping, tmp_path,
                                                                           drop):
    # Unmapping tears down a page-table entry per mapped page: ~20 ms for a 1 GiB file whose
    # every page was mapped (measured). A file deleted by the cleaner must not stall every put
    # that long, so the unmap runs without the GIL (as mmap.mmap's close and dealloc do).
    # Several tries: a thread woken on a loaded machine may miss a short unmap (three all
    # missed it once in CI, with the wheel's suite running beside the main one on 2 cores).
    size = 256 << 20
    path = _file(tmp_path, size)
    maps = []

    def unmap():
        m = maps.pop()
        if drop == "close":
            m.close()
        else:
            del m               # the last reference: the deallocator unmaps
    for _ in range(10):
        m = _open(Mapping, path, size)
        pages = np.frombuffer(m, dtype=np.uint8)[::mmap.PAGESIZE]
        pages[:] = 1            # every page written: mapped a page-table entry each
        del pages
        maps.append(m)
        del m
        if testing.runs_during(unmap)[1]:
            break
    else:
        pytest.fail(f"no other thread ran while {drop} unmapped {size >> 20} MiB")


def test_mapping_kernel_calls_leave_no_export_behind(Mapping, backend, tmp_path):
    k = backend
    m = _open(Mapping, _file(tmp_path, mmap.PAGESIZE), mmap.PAGESIZE)
    assert k.cq_encode(m, 0, 1234, 56, 7) == 20
    assert k.cq_search(m, 0, 20, 1234) == 0
    fd = os.open(str(tmp_path / "f"), os.O_RDWR)
    try:
        k.sync_range(m, fd, 0, 20)
    finally:
        os.close(fd)
    m.close()
    assert m.closed


def test_read_only_mapping_refuses_writes(Mapping, tmp_path):
    m = _open(Mapping, _file(tmp_path, mmap.PAGESIZE, data=b"abc"), mmap.PAGESIZE,
              writable=False)
    assert m[0:3] == b"abc" and not m.writable
    with pytest.raises(TypeError):
        m[0] = 1
    with pytest.raises(TypeError):
        m[0:1] = b"z"
    with pytest.raises(ValueError, match="read-only"):
        np.frombuffer(m, np.uint8)[0] = 1
    assert memoryview(m).readonly
    m.close()


def test_mapping_refuses_a_length_past_the_end_of_the_file(Mapping, tmp_path):
    with pytest.raises(ValueError, match="greater than file size"):
        _open(Mapping, _file(tmp_path, 100), 4096)
    with pytest.raises(ValueError):
        _open(Mapping, _file(tmp_path, 100), 0)


def test_fs_map_keeps_a_descriptor_only_where_the_backend_says_so(backend, tmp_path):
    k = backend
    paths = [_file(tmp_path, mmap.PAGESIZE, "%02d" % i) for i in range(20)]
    before = len(os.listdir("/proc/self/fd"))
    maps = [FS.map(p, mmap.PAGESIZE, kernels=k) for p in paths]
    try:
        grown = len(os.listdir("/proc/self/fd")) - before
        assert grown == (len(paths) if mappings_hold_descriptors(k) else 0)
    finally:
        for m in maps:
            m.close()


CHILD = textwrap.dedent("""
    import json, os, resource, sys
    from rocketstore import Message, testing
    root, backend, limit, topics = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    store = testing.open_store(root, backend)
    try:
        for t in range(topics):
            for q in range(4):
                r = store.put_message(Message("T%d" % t, b"%d.%d" % (t, q), queue_id=q))
                assert r.ok, r
        testing.wait_dispatched(store)
        fds = len(os.listdir("/proc/self/fd"))
        for t in range(topics):
            for q in range(4):
                got = store.get_message("g", "T%d" % t, q, 0, 32).messages
                assert [m.body for m in got] == [b"%d.%d" % (t, q)], (t, q, got)
        # The test's own queues: the schedule service adds its level queues about a second
        # after start, which a slow machine reaches before this line.
        queues = sum(len(qs) for topic, qs in store.consume_queue_table.items()
                     if topic.startswith("T"))
    finally:
        store.shutdown()
    print(json.dumps({"fds": fds, "queues": queues,
                      "limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
""")


@pytest.mark.parametrize("name", FD_FREE_BACKENDS)
def test_a_store_serves_more_queues_than_the_descriptor_limit(tmp_path, name):
    limit = 256
    run = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "store"), name,
                          str(limit), "500"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["queues"] == 2000
    # The store neither needed nor lifted the limit: every queue file is mapped, none open.
    assert out["limit"] == limit
    assert out["fds"] < 64


def test_mapping_populates_pages_as_mmap_does(Mapping, tmp_path):
    """madvise(MADV_POPULATE_WRITE) over a range allocates exactly that range of a sparse
    file, through a Mapping as through mmap.mmap (or fails alike on a kernel without it)."""
    from rocketstore.fs import MADV_POPULATE_WRITE
    size = 64 * mmap.PAGESIZE
    ours_path, ref_path = _file(tmp_path, size, "a"), _file(tmp_path, size, "b")
    ours = _open(Mapping, ours_path, size)
    with open(ref_path, "r+b") as f:
        ref = mmap.mmap(f.fileno(), size)
    try:
        got = [_outcome(m.madvise, MADV_POPULATE_WRITE, 8 * mmap.PAGESIZE, 16 * mmap.PAGESIZE)
               for m in (ours, ref)]
        assert got[0] == got[1]
        assert os.stat(ours_path).st_blocks == os.stat(ref_path).st_blocks
        if got[0][0] == "ok":
            assert os.stat(ours_path).st_blocks * 512 >= 16 * mmap.PAGESIZE
    finally:
        ours.close()
        ref.close()


@pytest.mark.parametrize("from_end", [False, True], ids=["forward", "from_end"])
def test_mapping_populates_a_range_longer_than_its_populate_chunk_whole(Mapping, tmp_path,
                                                                         from_end):
    """A populate goes 2 MiB per madvise call (so other threads' mmap calls wait for one
    chunk, not the range), forward or from the end: every page of a range of several chunks
    and a bit is allocated, and nothing past it, as mmap.mmap's single call does."""
    from rocketstore.fs import MADV_POPULATE_WRITE
    size = 8 << 20
    length = (5 << 20) + 3 * mmap.PAGESIZE            # 2.5 chunks, from an odd start
    ours_path, ref_path = _file(tmp_path, size, "a"), _file(tmp_path, size, "b")
    ours = _open(Mapping, ours_path, size)
    with open(ref_path, "r+b") as f:
        ref = mmap.mmap(f.fileno(), size)
    try:
        got = [_outcome(ours.madvise, MADV_POPULATE_WRITE, 5 * mmap.PAGESIZE, length, from_end),
               _outcome(ref.madvise, MADV_POPULATE_WRITE, 5 * mmap.PAGESIZE, length)]
        assert got[0] == got[1]
        if got[0][0] == "ok":
            # Blocks, not cached pages: readahead may bring in more around a fault.
            assert os.stat(ours_path).st_blocks == os.stat(ref_path).st_blocks
            assert os.stat(ours_path).st_blocks * 512 == length
    finally:
        ours.close()
        ref.close()
