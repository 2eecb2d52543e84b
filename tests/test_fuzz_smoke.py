# SPDX-License-Identifier: Apache-2.0
"""A short run of every fuzz target of fuzz/ (scripts/fuzz runs them for long).

For each C target: replay the seed corpus and the saved regressions through the Python-visible
kernels of every backend and require cext == cffi == pure on each (the differential half of
the harness's checks); and, when clang with libFuzzer is here, build the harness (ASan + UBSan)
and run it for a few seconds over the same inputs. Python targets replay their corpus and
regressions in-process, and run under atheris for a bounded number of runs when it imports.
A missing fuzzing tool skips only the fuzzing run, saying so; with
ROCKETSTORE_REQUIRE_FUZZERS=1 (set by .ci/run when it installed the tools) it fails instead.
"""
import glob
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from rocketstore import format as F
from rocketstore.errors import StoreError
from rocketstore.kernels import pure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUZZ = os.path.join(ROOT, "fuzz")
REGRESSIONS = os.path.join(ROOT, "tests", "data", "fuzz-regressions")
C_TARGETS = ("msg_check", "commitlog_scan", "properties", "cq_search", "index", "index_keys")
PY_TARGETS = ("py_record", "py_config", "py_checkpoint", "py_ha")
SMOKE_SECONDS = os.environ.get("FUZZ_SMOKE_SECONDS", "2")


def inputs(target):
    files = sorted(glob.glob(os.path.join(FUZZ, "corpus", target, "*")))
    files += sorted(glob.glob(os.path.join(REGRESSIONS, target, "*")))
    assert files, f"no seeds for {target}"
    out = []
    for path in files:
        with open(path, "rb") as f:
            out.append(f.read())
    return out


# ---- the C targets, replayed through every backend ---------------------------------------
def _scan(k, buf, start, end, crc, cap):
    out = np.zeros(cap, dtype=F.SCAN_DTYPE)
    try:
        res = k.commitlog_scan(buf, start, end, crc, out)
    except StoreError as exc:
        return type(exc).__name__
    return res, out[:res[0]].tobytes()


def replay_msg_check(k, data):
    ctl, buf = (data[0] if data else 0), data[1:]
    pos = ctl & 0x0F
    scanned = _scan(k, buf, pos, len(buf), bool(ctl & 0x10), 1)
    # A key query's record check over the same bytes, at the offset the record states.
    phy = struct.unpack_from(">q", buf, pos + 28)[0] if pos + 36 <= len(buf) else 0
    try:
        match = k.index_match(buf, len(buf), pos, phy, None, b"a", -(1 << 63), (1 << 63) - 1)
    except StoreError as exc:
        match = type(exc).__name__
    return scanned, match


def replay_commitlog_scan(k, data):
    head, buf = data[:4].ljust(4, b"\0"), data[4:]
    start, cut, cap, crc = head[0] % 16, head[1] % 16, head[2] % 9, head[3] & 1
    return _scan(k, buf, start, len(buf) - cut, bool(crc), cap)


def replay_properties(k, data):
    ctl, rest = (data[0] if data else 0), data[1:]
    v2 = bool(ctl & 1)
    tl = min((ctl >> 1) % 32, len(rest))
    topic, props = rest[:tl], rest[tl:tl + F.MAX_PROPERTIES_LENGTH]
    host = bytes([127, 0, 0, 1, 0, 0, 0x27, 0x10])
    rec = bytearray(pure.msg_size(0, 3, len(topic), len(props), v2))
    k.msg_encode(rec, 0, topic, b"abc", props, 1, 0, 7, 0, 0, 1, host, 2, host, 0, 0, v2)
    return bytes(rec), _scan(k, rec, 0, len(rec), True, 1)


def replay_cq_search(k, data):
    head, buf = data[:9].ljust(9, b"\0"), data[9:]
    key, start = struct.unpack("<q", head[:8])[0], head[8] % 24
    try:
        return k.cq_search(buf, start, len(buf), key)
    except StoreError as exc:
        return type(exc).__name__


def replay_index(k, data):
    head, body = data[:23].ljust(23, b"\0"), data[23:]
    slot_num, index_num = head[0] % 64 + 1, head[1] % 64 + 1
    key_hash = struct.unpack("<I", head[2:6])[0] & 0x7FFFFFFF
    begin, end = struct.unpack("<qq", head[6:22])
    cap = head[22] % 8
    need = 40 + slot_num * 4 + index_num * 20
    buf = bytearray(body[:need].ljust(need, b"\0"))
    out = np.zeros(8, dtype=np.int64)
    n1 = k.index_lookup(buf, slot_num, index_num, key_hash, begin, end, cap, out)
    r1 = out[:n1].tolist()
    # The same walk resumed one result at a time finds the same offsets.
    walked, at, hops, one = [], 0, 0, np.zeros(1, dtype=np.int64)
    while len(walked) < cap and at >= 0:
        n, at, hops = k.index_walk(buf, slot_num, index_num, key_hash, begin, end, at, hops, one)
        walked += one[:n].tolist()
    assert walked == r1
    put = k.index_put(buf, slot_num, index_num, key_hash, begin, end)
    n2 = k.index_lookup(buf, slot_num, index_num, key_hash, -(1 << 63), (1 << 63) - 1, 8, out)
    return r1, put, out[:n2].tolist(), bytes(buf)


def replay_index_keys(k, data):
    """fuzz_index_keys.c: rows scanned from the buffer, or raw bytes taken as rows."""
    head, buf = data[:2].ljust(2, b"\0"), data[2:]
    cap, raw = head[0] % 17, head[1] & 1
    if raw:
        n = min(8, len(buf) // F.SCAN_DTYPE.itemsize)
        rows = np.frombuffer(buf[:n * F.SCAN_DTYPE.itemsize], dtype=F.SCAN_DTYPE).copy()
    else:
        rows = np.zeros(8, dtype=F.SCAN_DTYPE)
        n = k.commitlog_scan(buf, 0, len(buf), False, rows)[0]
        rows = rows[:n]
    hashes = np.zeros(16, dtype=np.int32)
    key_rows = np.zeros(16, dtype=np.int32)
    try:
        count, done = k.index_keys(buf, rows, hashes[:cap], key_rows[:cap])
    except StoreError as exc:
        return type(exc).__name__
    return count, done, hashes[:count].tolist(), key_rows[:count].tolist()


REPLAY = {"msg_check": replay_msg_check, "commitlog_scan": replay_commitlog_scan,
          "properties": replay_properties, "cq_search": replay_cq_search,
          "index": replay_index, "index_keys": replay_index_keys}


@pytest.mark.parametrize("target", C_TARGETS)
def test_c_target_corpus_agrees_across_backends(target, backends):
    replay = REPLAY[target]
    for data in inputs(target):
        results = [(k.NAME, replay(k, data)) for k in backends]
        for name, res in results[1:]:
            assert res == results[0][1], f"{target}: {name} != {results[0][0]} on {data[:64]!r}"


def _missing(tool):
    """A fuzzing tool is absent: fail where it is required, else skip saying what did not run."""
    if os.environ.get("ROCKETSTORE_REQUIRE_FUZZERS") == "1":
        pytest.fail(f"ROCKETSTORE_REQUIRE_FUZZERS=1 but {tool} is not usable here")
    pytest.skip(f"{tool} not installed: no fuzzing run here (the corpus replay still ran)")


def _libfuzzer_clang():
    """clang able to link -fsanitize=fuzzer here, or None (then only the replay above runs)."""
    cc = shutil.which("clang") or shutil.which("clang-14")
    if cc is None:
        return None
    probe = os.path.join(ROOT, "build", "fuzz", "probe")
    os.makedirs(os.path.dirname(probe), exist_ok=True)
    src = probe + ".c"
    with open(src, "w") as f:
        f.write("#include <stdint.h>\n#include <stddef.h>\n"
                "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n")
    r = subprocess.run([cc, "-fsanitize=fuzzer,address,undefined", "-o", probe, src],
                       capture_output=True)
    return cc if r.returncode == 0 else None


@pytest.fixture(scope="module")
def fuzz_binaries():
    # No scripts/fuzz beside tests/ (scripts/check-wheel's copy): the corpus replay only.
    if not os.path.exists(os.path.join(ROOT, "scripts", "fuzz")) or _libfuzzer_clang() is None:
        return None
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "fuzz"), "--build"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return os.path.join(ROOT, "build", "fuzz")


@pytest.mark.parametrize("target", C_TARGETS)
def test_c_target_runs_clean_under_libfuzzer(target, fuzz_binaries, tmp_path):
    """A few seconds of real fuzzing (ASan + UBSan) from the seeds. Without clang's libFuzzer
    it is skipped, visibly (the corpus replay above still runs every seed through every
    backend), unless ROCKETSTORE_REQUIRE_FUZZERS=1 (.ci/run sets it when it has the tools)."""
    if fuzz_binaries is None:
        _missing("clang with libFuzzer (and scripts/fuzz beside tests/)")
    dirs = [os.path.join(FUZZ, "corpus", target)]
    if os.path.isdir(os.path.join(REGRESSIONS, target)):
        dirs.append(os.path.join(REGRESSIONS, target))
    work = tmp_path / "corpus"
    work.mkdir()
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1")
    r = subprocess.run([os.path.join(fuzz_binaries, f"fuzz_{target}"), str(work), *dirs,
                        f"-max_total_time={SMOKE_SECONDS}", "-timeout=10", "-max_len=65536",
                        f"-artifact_prefix={tmp_path}/"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-6000:]
    assert "Done" in r.stderr


# ---- the Python targets --------------------------------------------------------------------
def _load_py_target(target):
    sys.path.insert(0, os.path.join(FUZZ, "py"))
    try:
        import importlib
        return importlib.import_module(f"fuzz_{target}")
    finally:
        sys.path.pop(0)


@pytest.mark.parametrize("target", PY_TARGETS)
def test_python_target_replays_corpus_and_regressions(target):
    mod = _load_py_target(target)
    for data in inputs(target):
        mod.TestOneInput(data)
        mod.TestOneInput(data[::-1])     # something beyond the seeds, still deterministic


def _have_atheris():
    try:
        import atheris  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.parametrize("target", PY_TARGETS)
def test_python_target_runs_under_atheris(target, tmp_path):
    """A bounded atheris run (coverage-guided mutation from the seeds). Without atheris it is
    skipped, visibly, unless ROCKETSTORE_REQUIRE_FUZZERS=1."""
    if not _have_atheris():
        _missing("atheris")
    work = tmp_path / "corpus"
    work.mkdir()
    dirs = [os.path.join(FUZZ, "corpus", target)]
    if os.path.isdir(os.path.join(REGRESSIONS, target)):
        dirs.append(os.path.join(REGRESSIONS, target))
    r = subprocess.run([sys.executable, os.path.join(FUZZ, "py", f"fuzz_{target}.py"),
                        str(work), *dirs, f"-max_total_time={SMOKE_SECONDS}", "-max_len=8192",
                        "-timeout=10", f"-artifact_prefix={tmp_path}/"],
                       capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-6000:]
