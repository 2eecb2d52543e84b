# SPDX-License-Identifier: Apache-2.0
"""Tag subscriptions on the read path: the expression parsed as RocketMQ 4.9's
FilterAPI.buildSubscriptionData parses it, units filtered by tagsCode and then by the record's
TAGS string, the filtered units reported and stepped over as the broker's GetMessageResult
steps over them, and every backend giving the same answer."""
import asyncio
import random

import numpy as np
import pytest

from rocketstore import (GetMessageStatus as G, InvalidArgumentError, Message, MessageStore,
                         Subscription, parse_subscription, testing)
from rocketstore.message import java_string_hash

from broker_data import broker_config, broker_messages


@pytest.fixture
def store(tmp_path, backend):
    s = testing.open_store(tmp_path / "store", backend)
    yield s
    s.shutdown()


def put_tags(store, tags, topic="T", queue_id=0, properties=None):
    """One message per entry of `tags` (None: no TAGS); returns their queue offsets."""
    offsets = []
    for i, t in enumerate(tags):
        props = properties(i) if properties else None
        r = store.put_message(Message(topic, b"m%d" % i, tags=t, queue_id=queue_id,
                                      properties=props))
        assert r.ok
        offsets.append(r.queue_offset)
    return offsets


def read_all(store, topic, queue_id, subscription, n=32, **kw):
    """Every message a subscription takes from the queue, read on from each next_begin_offset
    as a consumer does, and the filtered units reported along the way."""
    offset, taken, filtered = 0, [], 0
    while True:
        r = store.get_message("g", topic, queue_id, offset, n, subscription=subscription, **kw)
        if r.status not in (G.FOUND, G.NO_MATCHED_MESSAGE):
            assert r.status is G.OFFSET_OVERFLOW_ONE
            return taken, filtered
        assert r.next_begin_offset > offset
        taken += r.messages
        filtered += r.filtered_count
        offset = r.next_begin_offset


# ---- parsing ---------------------------------------------------------------------------------
@pytest.mark.parametrize("expression", [None, "", "*"])
def test_star_empty_and_none_subscribe_to_every_message(expression):
    sub = parse_subscription(expression)
    assert sub.sub_all and sub.tags == frozenset()
    assert sub.matches_tags_code(12345) and sub.matches_tags(None)


@pytest.mark.parametrize("expression, tags", [
    ("TagA", {"TagA"}),
    ("TagA || TagB", {"TagA", "TagB"}),
    ("  TagA||TagB  ||TagA ", {"TagA", "TagB"}),
    ("TagA|||TagB", {"TagA", "|TagB"}),          # split("\\|\\|") takes "||" left to right
    ("TagA || || TagB", {"TagA", "TagB"}),       # empty pieces are skipped
    (" * ", {"*"}),                              # only "*" itself means every message
    ("TagA || *", {"TagA", "*"}),
    ("\x00\tTagA\x1f\n", {"TagA"}),              # String.trim(): every char <= U+0020
    ("\xa0TagA", {"\xa0TagA"}),                  # ... and nothing above it
    ("Tag A", {"Tag A"}),
])
def test_expressions_split_on_double_bars_and_trim_as_java_does(expression, tags):
    sub = parse_subscription(expression)
    assert sub.tags == frozenset(tags)
    assert sub.codes.tolist() == sorted({java_string_hash(t) for t in tags})
    assert sub.tag_bytes == b"".join(t.encode() for t in sorted(tags))
    assert sub.tag_ends.tolist() == np.cumsum([len(t.encode()) for t in sorted(tags)]).tolist()


@pytest.mark.parametrize("expression", ["||", "||||", " || ", " \t "])
def test_an_expression_naming_no_tag_is_refused(expression):
    with pytest.raises(InvalidArgumentError, match="names no tag"):
        parse_subscription(expression)


def test_a_subscription_that_is_not_a_str_is_refused(store):
    with pytest.raises(TypeError, match="subscription must be a str"):
        parse_subscription(["TagA"])
    with pytest.raises(TypeError, match="subscription must be a str"):
        store.get_message("g", "T", 0, 0, subscription=b"TagA")
    with pytest.raises(TypeError, match="property_filter must be callable"):
        store.get_message("g", "T", 0, 0, property_filter={"k": "v"})
    with pytest.raises(InvalidArgumentError):
        store.get_batch("g", "T", 0, 0, subscription="||")


def test_an_expression_is_parsed_once_and_a_parsed_one_is_taken_as_it_is():
    assert parse_subscription("Cached || Once") is parse_subscription("Cached || Once")
    sub = Subscription("mine", frozenset({"X"}))
    assert parse_subscription(sub) is sub


def test_the_code_test_compares_the_low_32_bits_as_the_broker_does():
    sub = parse_subscription("refunded")
    code = java_string_hash("refunded")
    assert code < 0
    assert sub.matches_tags_code(code)
    assert sub.matches_tags_code(code & 0xFFFFFFFF)            # Long.intValue()
    assert sub.matches_tags_code(code + (7 << 32))
    assert not sub.matches_tags_code(code + 1)


# ---- the read path ---------------------------------------------------------------------------
def test_tags_sharing_a_hash_are_told_apart_by_the_record_tag_string(store):
    assert java_string_hash("Aa") == java_string_hash("BB")
    tags = ["Aa", "BB", None, "Aa", "C", "BB", "Aa"]
    put_tags(store, tags)
    r = store.get_message("g", "T", 0, 0, 32, subscription="Aa")
    assert r.status is G.FOUND
    assert [m.queue_offset for m in r.messages] == [0, 3, 6]
    assert [m.tags for m in r.messages] == ["Aa", "Aa", "Aa"]
    assert r.filtered_count == 4 and r.next_begin_offset == 7
    r = store.get_message("g", "T", 0, 0, 32, subscription="BB")
    assert [m.queue_offset for m in r.messages] == [1, 5]
    r = store.get_message("g", "T", 0, 0, 32, subscription="BB || C")
    assert [m.tags for m in r.messages] == ["BB", "C", "BB"]
    # The units of both tags pass the first stage: the collision is the second's to drop.
    units = store.consume_queue("T", 0).units(0, 7)["tags_code"].tolist()
    assert units[0] == units[1] == java_string_hash("Aa")


def test_filtered_units_do_not_count_toward_max_msg_nums_and_next_offset_moves_past_them(
        store):
    tags = ["X", "A", "X", "X", "A", "X", "A", "X"]
    put_tags(store, tags)
    r = store.get_message("g", "T", 0, 0, 2, subscription="A")
    assert [m.queue_offset for m in r.messages] == [1, 4]
    # The walk stops at the unit that would be the third: past the two it took and the
    # three it left out, as nextBeginOffset = offset + units looked at.
    assert r.next_begin_offset == 5 and r.filtered_count == 3
    r = store.get_message("g", "T", 0, r.next_begin_offset, 2, subscription="A")
    assert [m.queue_offset for m in r.messages] == [6]
    assert r.next_begin_offset == 8 and r.filtered_count == 2
    assert store.get_message("g", "T", 0, 8, 2, subscription="A").status is \
        G.OFFSET_OVERFLOW_ONE


def test_a_window_with_every_unit_filtered_out_answers_no_matched_message(store):
    put_tags(store, ["X", None, "Y", "Aa"])
    r = store.get_message("g", "T", 0, 0, 32, subscription="BB || Z")
    assert r.status is G.NO_MATCHED_MESSAGE and r.messages == []
    assert r.next_begin_offset == 4 and r.filtered_count == 4
    b = store.get_batch("g", "T", 0, 1, 32, subscription="BB || Z")
    assert b.status is G.NO_MATCHED_MESSAGE and len(b) == 0
    assert b.next_begin_offset == 4 and b.filtered_count == 3


def test_one_call_looks_at_no_more_units_than_the_brokers_max_filter_message_count(store):
    # maxFilterMessageCount = max(16000, maxMsgNums * 20) bytes of units: 800 units for 32.
    n = 900
    r = store.put_messages([Message("T", b"x", tags="Other") for _ in range(n)])
    assert r.ok and r.count == n
    put_tags(store, ["Want"])
    r = store.get_message("g", "T", 0, 0, 32, subscription="Want")
    assert r.status is G.NO_MATCHED_MESSAGE
    assert r.next_begin_offset == 800 and r.filtered_count == 800
    r = store.get_message("g", "T", 0, 800, 32, subscription="Want")
    assert r.status is G.FOUND and [m.queue_offset for m in r.messages] == [n]
    assert r.filtered_count == 100


def test_get_batch_takes_the_same_units_as_get_message(store):
    rng = random.Random(testing.fixed_seed("batch-tags"))
    tags = [rng.choice(["Aa", "BB", "C", None]) for _ in range(300)]
    put_tags(store, tags)
    for sub in ("Aa", "BB || C", "Aa||BB", "*"):
        for offset, n in ((0, 32), (17, 5), (250, 64)):
            g = store.get_message("g", "T", 0, offset, n, subscription=sub)
            with store.get_batch("g", "T", 0, offset, n, subscription=sub) as b:
                assert b.status is g.status
                assert b.next_begin_offset == g.next_begin_offset
                assert b.filtered_count == g.filtered_count
                assert b.queue_offset.tolist() == [m.queue_offset for m in g.messages]
                assert [bytes(v) for v in b.bodies()] == [m.body for m in g.messages]


def test_a_property_filter_sees_each_candidate_properties_after_the_tag_check(store):
    put_tags(store, ["A", "A", "B", "A", "A"],
             properties=lambda i: {"region": "eu" if i % 2 == 0 else "us"})
    seen = []

    def eu(props):
        seen.append(props["TAGS"])
        return props.get("region") == "eu"
    r = store.get_message("g", "T", 0, 0, 32, subscription="A", property_filter=eu)
    assert [m.queue_offset for m in r.messages] == [0, 4]
    assert seen == ["A", "A", "A", "A"]        # "B" never reached it
    assert r.filtered_count == 3 and r.next_begin_offset == 5
    r = store.get_message("g", "T", 0, 0, 32, property_filter=lambda p: p["region"] == "us")
    assert [m.queue_offset for m in r.messages] == [1, 3]
    with store.get_batch("g", "T", 0, 0, 32, property_filter=eu) as b:
        assert b.queue_offset.tolist() == [0, 2, 4] and b.filtered_count == 2


def test_a_property_filter_that_raises_reaches_the_caller_and_holds_no_file(store):
    put_tags(store, ["A", "A", "A"])

    def boom(props):
        raise RuntimeError("filter failed")
    with pytest.raises(RuntimeError, match="filter failed"):
        store.get_batch("g", "T", 0, 0, 32, property_filter=boom)
    assert all(mf._refs == 0 for mf in store.commitlog.mfq.files)
    with pytest.raises(RuntimeError, match="filter failed"):
        store.get_message("g", "T", 0, 0, 32, subscription="A", property_filter=boom)
    assert [m.queue_offset for m in store.get_message("g", "T", 0, 0, 32).messages] == [0, 1, 2]


def test_message_filter_and_subscription_both_apply(store):
    put_tags(store, ["A", "B", "A", "B"])
    calls = []

    def every_unit(code):
        calls.append(code)
        return len(calls) != 3               # leaves out the third unit
    r = store.get_message("g", "T", 0, 0, 32, every_unit, subscription="A")
    assert [m.queue_offset for m in r.messages] == [0]
    assert len(calls) == 4 and r.filtered_count == 3


def test_every_backend_takes_the_same_units(tmp_path, backends):
    rng = random.Random(testing.fixed_seed("tag-backends"))
    pool = ["Aa", "BB", "TagA", "refunded", "ünï", None]
    tags = [rng.choice(pool) for _ in range(400)]
    answers = []
    for k in backends:
        s = testing.open_store(tmp_path / k.NAME, k)
        try:
            put_tags(s, tags)
            out = []
            for sub in ("Aa", "BB || refunded", "ünï", "TagA || Aa || Nope", "*", "Nope"):
                for offset, n in ((0, 32), (5, 1), (123, 500)):
                    r = s.get_message("g", "T", 0, offset, n, subscription=sub)
                    out.append((sub, offset, r.status, r.next_begin_offset, r.filtered_count,
                                [m.queue_offset for m in r.messages]))
            answers.append(out)
        finally:
            s.shutdown()
    assert all(a == answers[0] for a in answers[1:])
    # ... and the one the rule gives.
    for sub, offset, status, nxt, filtered, taken in answers[0]:
        wanted = parse_subscription(sub)
        expect = [i for i in range(offset, nxt) if wanted.matches_tags(tags[i])]
        assert taken == expect and filtered == nxt - offset - len(taken)


def test_a_consumer_with_a_subscription_yields_only_its_tags_and_commits_past_the_rest(store):
    put_tags(store, ["A", "B", "A", "B", "B"])
    with store.consume("g", "T", 0, subscription="A") as c:
        batch = c.next_batch(wait_ms=0)
        assert [m.queue_offset for m in batch] == [0, 2]
        assert c.next_batch(wait_ms=0) is None
        assert c.offset == 5
    assert store.query_offset("g", "T", 0) == 5


def test_an_async_consumer_with_a_subscription_yields_only_its_tags(store):
    put_tags(store, ["B", "A", "B", "A"])

    async def first_batch():
        async with store.aconsume("g", "T", 0, subscription="A || Z") as c:
            return await c.__anext__()
    assert [m.queue_offset for m in asyncio.run(first_batch())] == [1, 3]
    r = asyncio.run(store.aget_message("g", "T", 0, 0, 32, subscription="B"))
    assert [m.queue_offset for m in r.messages] == [0, 2]


# ---- a store the 4.9.8 broker wrote ------------------------------------------------------------
@pytest.mark.parametrize("expression", ["TagA", "refunded", "paid || created",
                                        " shipped_and_delivered_ok || TagB ", "*"])
def test_subscriptions_over_the_broker_store_take_what_its_tags_say(broker_store, backend,
                                                                    expression):
    msgs = broker_messages()
    wanted = parse_subscription(expression)
    with MessageStore(broker_store, broker_config(), kernels=backend) as store:
        for topic, queues in (("OrderTopic", 4), ("PayTopic", 3), ("LogTopic", 2)):
            for q in range(queues):
                queue = [m for m in msgs if m["topic"] == topic and m["queueId"] == q]
                taken, filtered = read_all(store, topic, q, expression)
                expect = [m for m in queue if wanted.matches_tags(m["tags"])]
                assert [m.commit_log_offset for m in taken] == \
                    [m["commitLogOffset"] for m in expect]
                assert [m.tags for m in taken] == [m["tags"] for m in expect]
                assert filtered == len(queue) - len(expect)
                # The first stage alone agrees with the broker's tagsCode per unit.
                assert all(wanted.matches_tags_code(m["cqTagsCode"]) for m in expect)


@pytest.mark.parametrize("tags, removing", [(["B", "A", "A"], True),
                                           (["B", "A", "A", "B"], False)])
def test_a_walk_that_found_nothing_reports_its_last_event_as_the_broker_does(
        store, tags, removing):
    # Three records fill CommitLog file 0, a fourth opens file 1. The walk is given the file
    # list without file 0, as after cleaning: units 0..2 point at a removed file.
    files = []
    for tag in tags:
        r = store.put_message(Message("T", bytes(20000), tags=tag))
        files.append(r.commit_log_offset // store.commitlog.file_size)
    assert files == [0, 0, 0, 1][:len(tags)]
    assert store.get_max_offset_in_queue("T", 0) == len(tags)     # dispatched: readable
    cq = store.consume_queue("T", 0)
    messages, scanned, removed, _, filtered = store.read_path.read(
        cq.mfq.files, cq.file_size, store.commitlog.mfq.files[1:], store.commitlog.file_size,
        0, len(tags), cq.min_logic_offset, 32, 800, 64 << 20, None,
        subscription=parse_subscription("A"))
    assert messages == [] and scanned == len(tags)
    # Unit 0 is filtered out, then unit 1's file is gone (MESSAGE_WAS_REMOVING) and unit 2
    # is skipped with it; a unit 3 filtered out after that makes it NO_MATCHED_MESSAGE again:
    # the later event decides, as getMessage's one status variable does.
    assert removed is removing and filtered == len(tags) - 2
