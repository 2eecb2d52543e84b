# SPDX-License-Identifier: Apache-2.0
"""rocketstore against what an embedding program would otherwise use, on one seeded workload.

    pip install -e '.[bench]'
    python -m pytest bench/bench_peers.py --benchmark-only -q --benchmark-columns=mean,ops

The workload is `workload.make_messages(N, queues=1)`: N messages (ROCKETSTORE_PEERS_N,
default 1 000 000) of 128-byte bodies, one topic, each with a unique key ("key-<i>") and a tag.
Three operations, one benchmark group each, so one table compares every store:

- write:  all N messages in commits of 1000 (put_messages batches for rocketstore), into a
          fresh store. rocketstore's time runs until its ConsumeQueue and IndexFile are built
          too (reput caught up), since a peer's commit also leaves the key index updated;
          extra_info["put_returned_s"] is when the last put returned.
- read:   every message back in write order, decoded (rocketstore: get_message over the
          ConsumeQueue, 1000 per call; peers: a cursor over the sequence-keyed table).
- lookup: 10 000 random keys (seeded), each answered with its message, decoded and checked
          (rocketstore: query_message over the IndexFile).

Stores and their durability settings; every peer commits once per 1000 messages:

| variant | write path | durable at commit |
|---|---|---|
| rocketstore-<backend>-async | ASYNC_FLUSH, one CommitLog file sized to the workload | no (page
  cache; flushed every 500 ms) |
| rocketstore-<backend>-sync  | SYNC_FLUSH (group commit msync per put_messages batch) | yes |
| lmdb-nosync | `lmdb.open(sync=False)`; seq -> record (append=True) and key -> seq | no |
| lmdb-sync   | `lmdb.open(sync=True)` (default): fsync per commit | yes |
| sqlite-wal-off  | WAL, `synchronous=OFF`; INTEGER PRIMARY KEY table, an index on key | no |
| sqlite-wal-full | WAL, `synchronous=FULL`: WAL fsynced per commit | yes |
| rocksdb-nosync  | rocksdict, raw mode, WriteBatch per 1000, WAL on, `sync=False` | no (WAL) |
| rocksdb-sync    | the same with `WriteOptions.sync=True` | yes |
| file-append     | plain Python: length-prefixed records, buffered write + flush per 1000;
  key index is an in-memory dict | no |
| file-append-fsync | the same with os.fsync per 1000 | yes (records; not the dict) |

Peers store each message as one record (born timestamp, queue id, topic, keys, tags, body) and
decode it back to a tuple; rocketstore stores RocketMQ's CommitLog record and decodes a
MessageExt. Ratios against LMDB (>1: faster than LMDB) go into extra_info and, at the end, a
table on the terminal; scripts/bench-table turns --benchmark-json output into
doc/performance.md's tables.
LMDB runs first so every later variant can be compared with it.
"""
import dataclasses
import functools
import os
import random
import shutil
import sqlite3
import struct
import time

import pytest

from rocketstore import FlushDiskType, MessageStore, StoreConfig, kernels
from rocketstore.workload import check_puts, check_read_back, make_messages, sized_config

try:
    import lmdb
except ImportError:        # pragma: no cover - the bench extra installs it
    lmdb = None
try:
    import rocksdict
except ImportError:        # pragma: no cover
    rocksdict = None

N = int(os.environ.get("ROCKETSTORE_PEERS_N", "1000000"))
LOOKUPS = min(10_000, N)
COMMIT = 1000              # messages per commit / put_messages batch
READ_BATCH = 1000          # messages per get_message call
ROUNDS = int(os.environ.get("ROCKETSTORE_PEERS_ROUNDS", "3"))   # read and lookup rounds
TOPIC = "BenchTopic0"
REFERENCES = ("lmdb-nosync", "lmdb-sync")
OPS = ("write", "read", "lookup")
GROUP = {"write": f"peers: write {N:,} msgs (commit/1000)",
         "read": f"peers: read {N:,} msgs in order",
         "lookup": f"peers: look up {LOOKUPS:,} random keys"}

# ---- peer record codec -------------------------------------------------------------------------
_HEAD = struct.Struct(">qiHHHI")      # born_timestamp, queue_id, len topic/keys/tags/body


def encode_record(m):
    props = m.properties
    topic = m.topic.encode()
    keys = props.get("KEYS", "").encode()
    tags = props.get("TAGS", "").encode()
    return b"".join((_HEAD.pack(m.born_timestamp, m.queue_id, len(topic), len(keys), len(tags),
                                len(m.body)), topic, keys, tags, m.body))


def decode_record(rec, unpack=_HEAD.unpack_from, hs=_HEAD.size):
    born, qid, lt, lk, lg, lb = unpack(rec)
    p = hs + lt + lk + lg
    rec = bytes(rec)
    return (rec[hs:hs + lt].decode(), qid, rec[hs + lt:hs + lt + lk].decode(),
            rec[hs + lt + lk:p].decode(), rec[p:p + lb], born)


def _batches(msgs):
    return [msgs[i:i + COMMIT] for i in range(0, len(msgs), COMMIT)]


_CONFIG_FIELDS = {f.name for f in dataclasses.fields(StoreConfig)}


@functools.lru_cache(maxsize=1)
def _messages():
    return make_messages(N, queues=1)


@functools.lru_cache(maxsize=1)
def _file_sizes():
    """CommitLog and ConsumeQueue file sizes that hold the workload (not 1 GiB per store)."""
    cfg = sized_config(_messages())
    return {"mapped_file_size_commit_log": cfg.mapped_file_size_commit_log,
            "mapped_file_size_consume_queue": cfg.mapped_file_size_consume_queue}


# ---- stores ------------------------------------------------------------------------------------
class RocketStore:
    def __init__(self, path, backend, sync):
        cfg = StoreConfig(
            **_file_sizes(),
            flush_disk_type=FlushDiskType.SYNC_FLUSH if sync else FlushDiskType.ASYNC_FLUSH,
            # An ephemeral HA port, so a store (or a broker) already on 10912 does not matter.
            **({"ha_listen_port": 0} if "ha_listen_port" in _CONFIG_FIELDS else {}))
        self.store = MessageStore(path, cfg, kernels=backend)
        self.store.load()
        self.store.start()
        self.put_returned_s = None
        self.results = []

    def write(self, batches):
        store = self.store
        keep = self.results.append
        t0 = time.perf_counter()
        for b in batches:
            keep(store.put_messages(b))
        self.put_returned_s = time.perf_counter() - t0
        while store.dispatch_behind_bytes() > 0:     # ConsumeQueue + IndexFile built
            time.sleep(0.0005)

    def check(self):
        """Outside the timed write: every put answered PUT_OK and every message reads back."""
        check_puts(self.results, N)
        check_read_back(self.store, _messages())

    def read(self):
        get = self.store.get_message
        offset = got = 0
        while True:
            r = get("peers", TOPIC, 0, offset, READ_BATCH)
            if not r.messages:
                return got
            got += len(r.messages)
            offset = r.next_begin_offset

    def lookup(self, keys):
        query = self.store.query_message
        return [(m[0].body if m else None)
                for m in (query(TOPIC, k, 1).messages for k in keys)]

    def close(self):
        self.store.shutdown()


class LmdbStore:
    def __init__(self, path, sync):
        os.makedirs(path)
        self.env = lmdb.open(path, map_size=8 << 30, max_dbs=2, sync=sync, metasync=sync)
        self.log = self.env.open_db(b"log")
        self.idx = self.env.open_db(b"keys")
        self.seq = 0

    def write(self, batches):
        env, log, idx, pack = self.env, self.log, self.idx, struct.Struct(">Q").pack
        seq = self.seq
        for b in batches:
            with env.begin(write=True) as txn:
                for m in b:
                    k = pack(seq)
                    txn.put(k, encode_record(m), append=True, db=log)
                    txn.put(m.properties["KEYS"].encode(), k, db=idx)
                    seq += 1
        self.seq = seq

    def read(self):
        got = 0
        with self.env.begin(db=self.log, buffers=True) as txn:
            for rec in txn.cursor().iternext(keys=False, values=True):
                decode_record(rec)
                got += 1
        return got

    def lookup(self, keys):
        out = []
        with self.env.begin() as txn:
            get, log, idx = txn.get, self.log, self.idx
            for k in keys:
                seq = get(k.encode(), db=idx)
                out.append(decode_record(get(seq, db=log))[4] if seq is not None else None)
        return out

    def close(self):
        self.env.close()


class SqliteStore:
    def __init__(self, path, sync):
        os.makedirs(path)
        self.db = sqlite3.connect(os.path.join(path, "msgs.db"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={'FULL' if sync else 'OFF'}")
        self.db.execute("CREATE TABLE msgs (seq INTEGER PRIMARY KEY, keys TEXT NOT NULL, "
                        "topic TEXT, queue_id INTEGER, tags TEXT, born INTEGER, body BLOB)")
        self.db.execute("CREATE INDEX msgs_keys ON msgs(keys)")

    def write(self, batches):
        db = self.db
        sql = "INSERT INTO msgs (keys, topic, queue_id, tags, born, body) VALUES (?,?,?,?,?,?)"
        for b in batches:
            db.execute("BEGIN")
            db.executemany(sql, [(m.properties["KEYS"], m.topic, m.queue_id,
                                  m.properties.get("TAGS"), m.born_timestamp, m.body)
                                 for m in b])
            db.execute("COMMIT")

    def read(self):
        got = 0
        for _ in self.db.execute("SELECT topic, queue_id, keys, tags, body, born FROM msgs "
                                 "ORDER BY seq"):
            got += 1
        return got

    def lookup(self, keys):
        cur = self.db.cursor()
        sql = "SELECT topic, queue_id, keys, tags, body, born FROM msgs WHERE keys = ?"
        out = []
        for k in keys:
            row = cur.execute(sql, (k,)).fetchone()
            out.append(row[4] if row else None)
        return out

    def close(self):
        self.db.close()


class RocksStore:
    def __init__(self, path, sync):
        self.db = rocksdict.Rdict(path, rocksdict.Options(raw_mode=True))
        self.wo = rocksdict.WriteOptions()
        self.wo.sync = sync
        self.seq = 0

    def write(self, batches):
        db, wo, pack = self.db, self.wo, struct.Struct(">Q").pack
        seq = self.seq
        for b in batches:
            wb = rocksdict.WriteBatch(raw_mode=True)
            for m in b:
                k = b"m" + pack(seq)
                wb.put(k, encode_record(m))
                wb.put(b"k" + m.properties["KEYS"].encode(), k)
                seq += 1
            db.write(wb, wo)
        self.seq = seq

    def read(self):
        got = 0
        it = self.db.iter()
        it.seek(b"m")
        while it.valid():
            decode_record(it.value())
            got += 1
            it.next()
        return got

    def lookup(self, keys):
        get = self.db.get
        out = []
        for k in keys:
            seq = get(b"k" + k.encode())
            out.append(decode_record(get(seq))[4] if seq is not None else None)
        return out

    def close(self):
        self.db.close()


class AppendFile:
    _LEN = struct.Struct(">I")

    def __init__(self, path, sync):
        os.makedirs(path)
        self.path = os.path.join(path, "log.bin")
        self.f = open(self.path, "w+b", buffering=1 << 20)   # + : lookups pread its fd
        self.sync = sync
        self.index = {}     # key -> (offset, length): in memory only

    def write(self, batches):
        f, index, pack, sync = self.f, self.index, self._LEN.pack, self.sync
        pos = f.tell()
        for b in batches:
            for m in b:
                rec = encode_record(m)
                f.write(pack(len(rec)))
                f.write(rec)
                index[m.properties["KEYS"]] = (pos + 4, len(rec))
                pos += 4 + len(rec)
            f.flush()
            if sync:
                os.fsync(f.fileno())

    def read(self):
        got = 0
        unpack = self._LEN.unpack
        with open(self.path, "rb", buffering=1 << 20) as f:
            read = f.read
            while True:
                head = read(4)
                if not head:
                    return got
                decode_record(read(unpack(head)[0]))
                got += 1

    def lookup(self, keys):
        fd = self.f.fileno()
        index, pread = self.index, os.pread
        out = []
        for k in keys:
            where = index.get(k)
            out.append(decode_record(pread(fd, where[1], where[0]))[4] if where else None)
        return out

    def close(self):
        self.f.close()


def _variants():
    out = []
    if lmdb is not None:
        out += [("lmdb-nosync", lambda p: LmdbStore(p, False)),
                ("lmdb-sync", lambda p: LmdbStore(p, True))]
    for be in kernels.available():
        for mode in ("async", "sync"):
            out.append((f"rocketstore-{be}-{mode}",
                        lambda p, be=be, mode=mode: RocketStore(p, be, mode == "sync")))
    out += [("sqlite-wal-off", lambda p: SqliteStore(p, False)),
            ("sqlite-wal-full", lambda p: SqliteStore(p, True))]
    if rocksdict is not None:
        out += [("rocksdb-nosync", lambda p: RocksStore(p, False)),
                ("rocksdb-sync", lambda p: RocksStore(p, True))]
    out += [("file-append", lambda p: AppendFile(p, False)),
            ("file-append-fsync", lambda p: AppendFile(p, True))]
    return out


VARIANTS = dict(_variants())
# Variant-major order (write, read, lookup of one store, then the next), so one store at a
# time holds disk and page cache.
CASES = [(v, op) for v in VARIANTS for op in OPS]


# ---- fixtures ----------------------------------------------------------------------------------
def _check(store):
    if isinstance(store, RocketStore):
        store.check()
    assert store.read() == N


@pytest.fixture(scope="module")
def workload():
    msgs = _messages()
    picks = random.Random(11).sample(range(N), LOOKUPS)
    return {"batches": _batches(msgs), "keys": [f"key-{i}" for i in picks],
            "bodies": [msgs[i].body for i in picks]}


class _Bench:
    """The store of the variant under test (one at a time) and the measured means."""

    def __init__(self, root):
        self.root = root
        self.name = self.store = None
        self.means = {}            # (op, variant) -> mean seconds
        self.extra = {}

    def fresh(self, name):
        self.drop()
        path = os.path.join(self.root, name)
        shutil.rmtree(path, ignore_errors=True)
        self.name, self.store = name, VARIANTS[name](path)
        return self.store

    def written(self, name, workload):
        """The variant's store with the workload in it (written unmeasured if -k skipped it)."""
        if self.name != name:
            self.fresh(name).write(workload["batches"])
            _check(self.store)
        return self.store

    def drop(self):
        if self.store is not None:
            self.store.close()
            shutil.rmtree(os.path.join(self.root, self.name), ignore_errors=True)
        self.name = self.store = None


@pytest.fixture(scope="module")
def bench_state(module_tmp, request):
    state = _Bench(str(module_tmp))
    yield state
    state.drop()
    _report(request.config, state.means)


def _ratio_items(op, name, mean, means):
    out = {}
    for ref in REFERENCES:
        ref_mean = means.get((op, ref))
        if ref_mean and ref != name:
            out[f"x_vs_{ref}"] = round(ref_mean / mean, 3)
    return out


def _report(config, means):
    """A table of speed ratios against LMDB, printed at module teardown (above the tables)."""
    tr = config.pluginmanager.getplugin("terminalreporter")
    capman = config.pluginmanager.getplugin("capturemanager")
    if tr is None or not means:
        return
    if capman is not None:              # module teardown runs with output captured
        with capman.global_and_fixture_disabled():
            _write_report(tr, means)
    else:
        _write_report(tr, means)


def _write_report(tr, means):
    names = [v for v in VARIANTS if any((op, v) in means for op in OPS)]
    tr.write_line("")
    tr.write_line(f"bench_peers: N={N:,}, lookups={LOOKUPS:,}; speed ratio vs LMDB "
                  f"(x = LMDB time / this time, >1 is faster); msgs/s in brackets")
    head = f"{'variant':<28}" + "".join(f"{op + ' vs nosync/sync':>34}" for op in OPS)
    tr.write_line(head)
    for v in names:
        cells = []
        for op in OPS:
            mean = means.get((op, v))
            if mean is None:
                cells.append(f"{'-':>34}")
                continue
            count = LOOKUPS if op == "lookup" else N
            rs = [means.get((op, ref)) for ref in REFERENCES]
            ratio = "/".join(f"{r / mean:.2f}" if r else "-" for r in rs)
            cells.append(f"{ratio + f' [{count / mean:,.0f}]':>34}")
        tr.write_line(f"{v:<28}" + "".join(cells))


# ---- the benchmark -----------------------------------------------------------------------------
@pytest.mark.parametrize("variant,op", CASES, ids=[f"{op}-{v}" for v, op in CASES])
def test_peer(benchmark, bench_state, workload, variant, op):
    benchmark.group = GROUP[op]
    benchmark.name = variant
    benchmark.extra_info.update(messages=N if op != "lookup" else LOOKUPS, body_bytes=128,
                                commit_every=COMMIT)
    if op == "write":
        batches = workload["batches"]

        def setup():
            return (bench_state.fresh(variant),), {}

        def write(store):
            store.write(batches)
        benchmark.pedantic(write, setup=setup, rounds=1, iterations=1)
        store = bench_state.store
        if isinstance(store, RocketStore):
            benchmark.extra_info["put_returned_s"] = round(store.put_returned_s, 3)
        _check(store)
    elif op == "read":
        store = bench_state.written(variant, workload)
        got = benchmark.pedantic(store.read, rounds=ROUNDS, iterations=1, warmup_rounds=0)
        assert got == N
    else:
        store = bench_state.written(variant, workload)
        keys = workload["keys"]
        bodies = benchmark.pedantic(store.lookup, args=(keys,), rounds=ROUNDS, iterations=1)
        found = sum(1 for got, want in zip(bodies, workload["bodies"]) if got == want)
        benchmark.extra_info["found"] = found
        assert found == LOOKUPS
    if benchmark.stats is None:         # --benchmark-disable: ran once, nothing measured
        return
    mean = benchmark.stats.stats.mean
    bench_state.means[(op, variant)] = mean
    count = LOOKUPS if op == "lookup" else N
    benchmark.extra_info["msgs_per_s"] = round(count / mean)
    benchmark.extra_info.update(_ratio_items(op, variant, mean, bench_state.means))
