# SPDX-License-Identifier: Apache-2.0
"""Property tests (hypothesis) across whole stores: backends write identical directories for
random messages; decode(encode(m)) gives back every MessageExt field; a damaged store never
makes open / verify / dump raise anything but a StoreError, and every example is small so it
ends in bounded time. HYPOTHESIS_PROFILE=ci (default) or dev picks the example counts."""
import os
import random
import shutil

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore import Message, testing
from rocketstore import format as F
from rocketstore.clock import StepClock
from rocketstore.errors import StoreError
from rocketstore.kernels import pure
from rocketstore.message import MessageExt, properties_to_string, string_to_properties
from rocketstore.store import MessageStore

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
EXAMPLES = {"ci": 1, "dev": 4, "thorough": 20}.get(PROFILE, 1)
SETTINGS = dict(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
BACKENDS = testing.backend_params()

# ---- strategies ---------------------------------------------------------------------------
topics = st.from_regex(r"\A[A-Za-z0-9_%|-]{1,24}\Z")
# Property text: anything but the two separators (a value holding them cannot round-trip in
# RocketMQ either) and surrogates (not UTF-8 encodable).
prop_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
                    min_size=1, max_size=12)
hosts = st.one_of(
    st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
    st.tuples(st.ip_addresses(v=6).map(str), st.integers(0, 65535)))
messages = st.builds(
    Message, topic=topics, body=st.binary(max_size=300),
    tags=st.none() | prop_text, keys=st.none() | st.lists(st.from_regex(r"\A\w{1,8}\Z"),
                                                              min_size=1, max_size=3),
    queue_id=st.integers(0, 3), flag=st.integers(-(1 << 31), (1 << 31) - 1),
    properties=st.dictionaries(st.from_regex(r"\A[A-Za-z][A-Za-z0-9_]{0,10}\Z")
                               .filter(lambda k: k not in ("TAGS", "KEYS", "DELAY")),
                               prop_text, max_size=4),
    born_timestamp=st.integers(0, 1 << 45), born_host=hosts,
    reconsume_times=st.integers(0, 16))


@settings(max_examples=6 * EXAMPLES, **SETTINGS)
@given(msgs=st.lists(messages, min_size=1, max_size=25), batch=st.booleans())
def test_random_messages_give_identical_store_directories_on_every_backend(tmp_path_factory,
                                                                           msgs, batch):
    trees = {}
    base = tmp_path_factory.mktemp("ident")
    for name in BACKENDS:
        root = base / name
        store = testing.open_store(root, testing.load_backend(name), clock=StepClock())
        try:
            if batch:
                # put_messages takes one topic/queue per batch, as a broker batch does.
                for m in msgs:
                    m.topic, m.queue_id = msgs[0].topic, msgs[0].queue_id
                store.put_messages(msgs)
            else:
                for m in msgs:
                    store.put_message(m)
        finally:
            store.shutdown()
        trees[name] = testing.tree_digest(root, ignore=("lock", "abort"))
    first = trees[BACKENDS[0]]
    assert any(k.startswith("commitlog") for k in first)
    for name in BACKENDS[1:]:
        assert trees[name] == first, f"{name} differs from {BACKENDS[0]}"


@settings(max_examples=60 * EXAMPLES, **SETTINGS)
@given(m=messages, v2=st.booleans(), store_host=hosts, queue_offset=st.integers(0, 1 << 62),
       phy_offset=st.integers(0, 1 << 62), store_ts=st.integers(0, 1 << 45),
       prepared=st.integers(-(1 << 63), (1 << 63) - 1),
       sys_bits=st.sampled_from([0, 1, 2, 4, 8, 12]))
def test_decode_of_encode_gives_back_every_field(m, v2, store_host, queue_offset, phy_offset,
                                                  store_ts, prepared, sys_bits):
    from rocketstore.message import pack_host
    bh, b6 = pack_host(m.born_host)
    sh, s6 = pack_host(store_host)
    sys_flag = sys_bits | (F.BORNHOST_V6_FLAG if b6 else 0) | \
        (F.STOREHOSTADDRESS_V6_FLAG if s6 else 0)
    topic = m.topic.encode()
    props = properties_to_string(m.properties).encode()
    size = pure.msg_size(sys_flag, len(m.body), len(topic), len(props), v2)
    recs = []
    for name in BACKENDS:
        k = testing.load_backend(name)
        out = bytearray(size + 3)
        assert k.msg_encode(out, 3, topic, m.body, props, m.queue_id, m.flag, queue_offset,
                            phy_offset, sys_flag, m.born_timestamp, bh, store_ts, sh,
                            m.reconsume_times, prepared, v2) == size
        recs.append(bytes(out[3:]))
    assert all(r == recs[0] for r in recs), "backends encode differently"
    d = MessageExt.decode(recs[0], check_crc=True)
    # The stored body: with COMPRESSED_FLAG (sys_bits 1) `body` would decompress it.
    assert (d.store_size, d.topic, bytes(d.stored_body), d.queue_id, d.flag, d.queue_offset,
            d.commit_log_offset, d.sys_flag, d.born_timestamp, d.store_timestamp,
            d.reconsume_times, d.prepared_transaction_offset) == (
        size, m.topic, m.body, m.queue_id, m.flag, queue_offset, phy_offset, sys_flag,
        m.born_timestamp, store_ts, m.reconsume_times, prepared)
    assert _norm(d.born_host) == _norm(m.born_host)
    assert _norm(d.store_host) == _norm(store_host)
    assert d.properties == string_to_properties(props.decode()) == m.properties
    assert d.tags == m.tags
    assert d.magic == (F.MESSAGE_MAGIC_CODE_V2 if v2 else F.MESSAGE_MAGIC_CODE)


def _norm(host):
    """(ip, port) compared as addresses: inet_ntop and ipaddress spell ::ffff:0:0 differently."""
    import ipaddress
    return ipaddress.ip_address(host[0]), host[1]


# ---- damaged stores -----------------------------------------------------------------------
_BASE = {}


def _base_store(tmp_path_factory):
    """One small store (3 CommitLog files, queues, index, configs), written once."""
    if "root" not in _BASE:
        root = tmp_path_factory.mktemp("base") / "store"
        cfg = testing.small_config(mapped_file_size_commit_log=4096,
                                   mapped_file_size_consume_queue=20 * 8)
        store = testing.open_store(root, "pure", config=cfg)
        try:
            rnd = random.Random(5)
            for i in range(30):
                body = bytes(rnd.randrange(256) for _ in range(200))
                store.put_message(Message(f"T{i % 3}", body, tags=f"tag{i % 4}",
                                          keys=[f"k{i}"], queue_id=i % 2))
            testing.wait_dispatched(store)
        finally:
            store.shutdown()
        _BASE["root"] = root
        _BASE["files"] = sorted(os.path.relpath(os.path.join(d, f), root)
                                for d, _, fs in os.walk(root) for f in fs if f != "lock")
    return _BASE["root"], _BASE["files"]


def _exercise(root, backend):
    """What `rocketstore verify`, `dump` and a writable open do; StoreError is the only
    exception allowed out."""
    try:
        store = MessageStore.open_read_only(root, kernels=backend)
    except StoreError:
        return
    try:
        store.verify()
        for m in store.iter_messages():
            m.to_dict()
    except StoreError:
        pass
    finally:
        store.shutdown()
    try:
        store = MessageStore(root, testing.small_config(mapped_file_size_commit_log=4096,
                                                        mapped_file_size_consume_queue=160),
                             clock=StepClock(), kernels=backend)
        store.load()
        try:
            for q in range(2):
                store.get_message("g", "T0", q, 0, 32)
        finally:
            store.shutdown()
    except StoreError:
        pass


@settings(max_examples=25 * EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_truncated_or_bit_flipped_store_raises_only_store_errors(tmp_path_factory, data):
    base, files = _base_store(tmp_path_factory)
    root = tmp_path_factory.mktemp("damaged") / "store"
    shutil.copytree(base, root)
    for _ in range(data.draw(st.integers(1, 3), label="damages")):
        rel = data.draw(st.sampled_from(files), label="file")
        path = os.path.join(root, rel)
        size = os.path.getsize(path)
        how = data.draw(st.sampled_from(["truncate", "flip", "flip", "zero-run"]), label="how")
        with open(path, "r+b") as f:
            if how == "truncate":
                f.truncate(data.draw(st.integers(0, size), label="to"))
            elif size:
                at = data.draw(st.integers(0, size - 1), label="at")
                f.seek(at)
                if how == "flip":
                    b = f.read(1)[0]
                    f.seek(at)
                    f.write(bytes([b ^ (1 << data.draw(st.integers(0, 7), label="bit"))]))
                else:
                    f.write(b"\0" * min(64, size - at))
    _exercise(str(root), data.draw(st.sampled_from(BACKENDS), label="backend"))
