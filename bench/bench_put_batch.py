# SPDX-License-Identifier: Apache-2.0
"""The columnar put_batch against put_messages of the same messages and a plain f.write of the
same record bytes: 1000 bodies of 128 B per call, one topic and queue, ASYNC_FLUSH, into a
CommitLog file populated before the timed region (so no put pays a first-touch fault).

`until` says where a round stops the clock: "written" when the last put returns,
"dispatched" once reput has also built the ConsumeQueue and index for every message.
test_small_batches puts the same number of messages 10 a call, until dispatched: the cost of a
call beside its messages. Messages per second = extra_info["messages"] * ops (rounds per
second)."""
import shutil

import pytest

from rocketstore import Message, testing
from rocketstore.workload import check_puts, check_read_back, make_messages, wait_dispatched

BATCH = 1000
CALLS = 100                # per round: 100 000 messages
ROUNDS = 3
GROUP = "put 1000 x 128 B to one queue"
SMALL = 10                 # messages a call in test_small_batches


def _messages(batch=BATCH):
    return [Message("BatchTopic", m.body, tags=m.tags, keys=m.keys, queue_id=0,
                    born_timestamp=m.born_timestamp, born_host=m.born_host)
            for m in make_messages(batch, body_size=128, topics=1, queues=1)]


def _populated_store(store_factory, backend, msgs, calls=CALLS):
    """A started store whose first CommitLog file is reserved and faulted in whole, as the
    allocator leaves a file it prepared ahead: the timed puts measure encoding, not faults."""
    store = store_factory(backend, msgs, calls)
    cl = store.commitlog
    mf = cl.mfq.get_last_mapped_file(0)
    mf.reserve(cl.file_size)
    store.fs.prefault(mf.mm, 0, cl.file_size)
    return store


def _run(benchmark, store_factory, backend, until, put, batch=BATCH):
    msgs = _messages(batch)
    calls = BATCH * CALLS // batch
    state = {}

    def setup():
        old = state.get("store")
        if old is not None:       # only the last round's store is read back: free the disk
            old.shutdown()
            shutil.rmtree(old.root, ignore_errors=True)
        state["store"] = store = _populated_store(store_factory, backend, msgs, calls)
        state["results"] = []
        return (store,), {}

    def run(store):
        keep = state["results"].append
        for _ in range(calls):
            keep(put(store, msgs))
        if until == "dispatched":
            wait_dispatched(store, timeout=600)
    benchmark.group = (f"{GROUP}, until {until}" if batch == BATCH else
                       f"put {batch} x 128 B to one queue ({calls} calls), until {until}")
    benchmark.extra_info["messages"] = batch * calls
    benchmark.pedantic(run, setup=setup, rounds=ROUNDS, iterations=1)
    check_puts(state["results"], batch * calls)
    check_read_back(state["store"], msgs, calls)


@pytest.mark.parametrize("until", ["written", "dispatched"])
def test_put_batch(benchmark, backend, store_factory, until):
    msgs = _messages()
    bodies = [m.body for m in msgs]
    tags = [m.tags for m in msgs]
    keys = [m.keys for m in msgs]
    born = dict(born_timestamp=msgs[0].born_timestamp, born_host=msgs[0].born_host)
    # One born timestamp for the batch: put_batch shares it, so read-back compares bodies.
    _run(benchmark, store_factory, backend, until,
         lambda store, _: store.put_batch("BatchTopic", 0, bodies, tags=tags, keys=keys, **born))


@pytest.mark.parametrize("until", ["written", "dispatched"])
def test_put_messages(benchmark, backend, store_factory, until):
    _run(benchmark, store_factory, backend, until, lambda store, msgs: store.put_messages(msgs))


@pytest.mark.parametrize("api", ["put_batch", "put_messages"])
def test_small_batches(benchmark, backend, store_factory, api):
    """The same 100 000 messages in calls of SMALL: what a call costs beside its messages,
    put_batch's Python layout and dispatch against put_messages' one compiled call."""
    msgs = _messages(SMALL)
    if api == "put_batch":
        bodies = [m.body for m in msgs]
        tags = [m.tags for m in msgs]
        keys = [m.keys for m in msgs]
        born = dict(born_timestamp=msgs[0].born_timestamp, born_host=msgs[0].born_host)

        def put(store, _):
            return store.put_batch("BatchTopic", 0, bodies, tags=tags, keys=keys, **born)
    else:
        def put(store, msgs):
            return store.put_messages(msgs)
    _run(benchmark, store_factory, backend, "dispatched", put, batch=SMALL)


def test_plain_file_write_of_the_same_records(benchmark, store_factory, tmp_path):
    """The records put_messages writes for these messages (the same on every backend), one
    f.write each, flushed per 1000."""
    msgs = _messages()
    store = store_factory(testing.load_backend(testing.backend_params()[0]), msgs, 1)
    r = store.put_messages(msgs)
    check_puts([r], BATCH)
    records = [bytes(store.commitlog.get_message_bytes(int(o))) for o in r.commit_log_offsets]
    path = tmp_path / "records.bin"
    f = open(path, "wb")
    rounds = []

    def run():
        write = f.write
        for _ in range(CALLS):
            for rec in records:
                write(rec)
            f.flush()
        rounds.append(1)
    benchmark.group = f"{GROUP}, until written"
    benchmark.name = "plain f.write"
    benchmark.extra_info["messages"] = BATCH * CALLS
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    f.close()
    # The baseline's read back: every round's records reached the file.
    assert path.stat().st_size == len(rounds) * CALLS * sum(map(len, records))
