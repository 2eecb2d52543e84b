# SPDX-License-Identifier: Apache-2.0
"""The compiled group commit's waits (csrc/rs_gc.h, a backend's GroupCommit): a wait is
answered by the sync that covers it and by nothing before, a sync hands the lead to the lowest
wait it left, a failed sync counts nothing, timeouts and shutdown end waits; and a store on that
backend acknowledges a put only once its bytes are durable. The waits run on Linux's futexes and,
built with -DRS_GC_CONDVAR, on the condition variable other platforms use."""
import collections
import importlib.util
import itertools
import os
import random
import shutil
import sysconfig
import threading
import time

import pytest

from rocketstore import FlushDiskType, Message, PutMessageStatus, testing
from rocketstore.services.flush import CompiledGroupCommitService

# csrc/rs_gc.h
DONE, LEAD, TIMEOUT, CLOSED, LATE = 1, 2, 3, 4, 5
FAR = 60 * 10**9        # a deadline no test reaches: only a sync or close answers


def _compiled():
    names = [n for n in testing.backend_params()
             if hasattr(testing.load_backend(n), "GroupCommit")]
    return names


@pytest.fixture(params=_compiled())
def kernels(request):
    return testing.load_backend(request.param)


CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")


@pytest.fixture(scope="module")
def condvar_group_commit(tmp_path_factory):
    """The cffi backend's GroupCommit over csrc/rs_gc.c built with -DRS_GC_CONDVAR: the branch
    that platforms without futexes compile, run here."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) to build the condition-variable waits")
    import cffi

    from rocketstore.kernels import cffi_backend
    spec = importlib.util.spec_from_file_location("_gc_interface",
                                                  os.path.join(CSRC, "interface.py"))
    interface = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(interface)
    ffi = cffi.FFI()
    ffi.cdef(interface.cffi_cdef(["rs_common.h", "rs_gc.h"]))
    ffi.set_source("_rs_gc_condvar", '#include "rs_gc.h"\n',
                   sources=[os.path.join(CSRC, "rs_gc.c")], include_dirs=[CSRC],
                   define_macros=[("RS_GC_CONDVAR", "1")],
                   extra_compile_args=interface.compile_args(),
                   extra_link_args=interface.link_args())
    built = ffi.compile(tmpdir=str(tmp_path_factory.mktemp("gc_condvar")))
    spec = importlib.util.spec_from_file_location("_rs_gc_condvar", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return type("CondvarGroupCommit", (cffi_backend.GroupCommit,),
                {"__slots__": (), "_ffi": module.ffi, "_lib": module.lib})


@pytest.fixture(params=_compiled() + ["condvar"])
def group_commit(request):
    """A GroupCommit class: each compiled backend's, and the condition-variable build's."""
    if request.param == "condvar":
        return request.getfixturevalue("condvar_group_commit")
    return testing.load_backend(request.param).GroupCommit


class _Wait(threading.Thread):
    """gc.wait(offset, now + timeout) in a thread of its own; `answer` once it returns."""

    def __init__(self, gc, offset, timeout_ns=FAR):
        super().__init__(daemon=True)
        self.gc, self.offset, self.timeout_ns = gc, offset, timeout_ns
        self.answer = None
        self.start()

    def run(self):
        self.answer = self.gc.wait(self.offset, time.monotonic_ns() + self.timeout_ns)


def _asleep(gc, n):
    testing.wait_until(lambda: gc.waiting == n, what=f"{n} waits asleep")


def test_a_sync_wakes_the_waits_it_covers_and_hands_the_lead_to_the_lowest_left(group_commit):
    gc = group_commit(0)
    gc.gather_bytes = 0
    assert gc.wait(100, time.monotonic_ns() + FAR) == LEAD      # no sync running: it leads
    covered, lowest, higher = _Wait(gc, 150), _Wait(gc, 300), _Wait(gc, 400)
    _asleep(gc, 3)
    assert (covered.answer, lowest.answer, higher.answer) == (None, None, None)
    assert gc.done(200, True) == 1                # [.., 200) durable: only the wait at 150
    covered.join()
    lowest.join()
    assert covered.answer == DONE
    assert lowest.answer == LEAD                  # the lowest offset the sync left leads next
    assert gc.leading and gc.waiting == 1 and higher.answer is None
    assert gc.flushed == 200
    assert gc.done(500, True) == 1
    higher.join()
    assert higher.answer == DONE and not gc.leading and gc.waiting == 0
    assert gc.wait(450, 0) == DONE                # durable already: no wait at all


def test_the_waits_a_sync_serves_wake_as_a_relay_each_waking_the_next(group_commit):
    """The sync wakes the oldest wait it served, and each woken wait the next: they come to
    the interpreter lock one after another instead of all at once (csrc/rs_gc.c). Waits that
    close() answers are answered each by close, not relayed."""
    gc = group_commit(0)
    gc.gather_bytes = 0
    assert gc.try_lead()
    waits = [_Wait(gc, 10 * (i + 1)) for i in range(6)]
    _asleep(gc, 6)
    assert gc.done(60, True) == 6
    for w in waits:
        w.join(30)
    assert [w.answer for w in waits] == [DONE] * 6
    assert gc.relayed == 5 and gc.waiting == 0 and not gc.leading
    assert gc.try_lead()
    more = [_Wait(gc, 100 + i) for i in range(3)]
    _asleep(gc, 3)
    gc.close()
    for w in more:
        w.join(30)
    assert [w.answer for w in more] == [CLOSED] * 3
    assert gc.relayed == 5


def test_relayed_waits_among_timeouts_leads_and_a_close_all_end_answered_rightly(group_commit):
    """16 threads wait on rising offsets with deadlines from 50 us to never, leading the syncs
    they are handed, for half a second, and then the state closes: every thread ends, and no
    wait is answered DONE for an offset the syncs had not reached."""
    gc = group_commit(0)
    offsets = itertools.count(1)        # next() is one step under the GIL: no offset twice
    stop = threading.Event()
    answers = collections.Counter()
    wrong = []

    def producer(seed):
        rng = random.Random(seed)
        while True:
            off = next(offsets)
            r = gc.wait(off, time.monotonic_ns() + rng.choice([50_000, 2_000_000, FAR]))
            answers[r] += 1
            if r in (DONE, LATE) and gc.flushed < off:
                wrong.append((off, r, gc.flushed))
            if r == LEAD:
                # Syncs what was handed out so far, sometimes after a while.
                if rng.random() < 0.2:
                    time.sleep(0.0005)
                gc.done(next(offsets), True)
            if r == CLOSED or stop.is_set() and r != LEAD:
                return

    threads = [threading.Thread(target=producer, args=(i,), daemon=True) for i in range(16)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    stop.set()
    time.sleep(0.05)
    gc.close()
    deadline = time.monotonic() + 20
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads)
    assert wrong == []
    assert answers[DONE] > 0 and answers[LEAD] > 0 and answers[TIMEOUT] > 0
    assert gc.relayed > 0 and gc.waiting == 0


def test_a_failed_sync_counts_nothing_and_hands_nothing_on(group_commit):
    gc = group_commit(0)
    gc.gather_bytes = 0
    assert gc.try_lead()
    w = _Wait(gc, 50)
    _asleep(gc, 1)
    assert gc.done(100, False) == 0
    assert gc.flushed == 0 and not gc.leading and gc.waiting == 1 and w.answer is None
    assert gc.try_lead()                          # the retry: any caller may lead it
    assert gc.done(100, True) == 1
    w.join()
    assert w.answer == DONE


def test_a_compiled_wait_times_out_while_the_sync_runs_on(group_commit):
    gc = group_commit(0)
    assert gc.try_lead()                          # a stalled sync
    w = _Wait(gc, 10, timeout_ns=20 * 10**6)
    w.join(30)
    assert w.answer == TIMEOUT and gc.waiting == 0 and gc.leading
    gc.done(10, True)
    assert gc.wait(10, 0) == DONE


def test_close_ends_every_wait_and_answers_the_covered_ones_done(group_commit):
    gc = group_commit(0)
    assert gc.try_lead()
    waits = [_Wait(gc, 100 * (i + 1)) for i in range(4)]
    _asleep(gc, 4)
    gc.done(200, True)       # 100 and 200 covered; 300 is handed the lead, 400 sleeps on
    for w in waits[:3]:
        w.join()
    assert [w.answer for w in waits[:3]] == [DONE, DONE, LEAD]
    gc.done(200, False)      # its sync failed: nothing moves
    gc.close()
    waits[3].join()
    assert waits[3].answer == CLOSED
    assert gc.wait(300, time.monotonic_ns() + FAR) == CLOSED   # later waits too
    assert gc.wait(150, 0) == DONE


def test_a_leader_gathers_until_the_producers_seen_lately_wait(group_commit):
    gc = group_commit(0)
    # Two producer threads wait in one sync, so the next leader waits for both.
    assert gc.try_lead()
    ws = [_Wait(gc, 10), _Wait(gc, 20)]
    _asleep(gc, 2)
    gc.done(5, True)         # covers neither: the lower one leads, the other still waits
    ws[0].join()
    gc.done(20, True)
    ws[1].join()
    assert gc.try_lead()     # a claim: the producers of the last two are counted
    gc.done(20, True)
    assert gc.producers == 2
    gc.gather_ns = FAR
    leader = _Wait(gc, 30)
    testing.wait_until(lambda: gc.gathering, what="the leader to gather")
    assert leader.answer is None
    follower = _Wait(gc, 40)                      # the second producer arrives: it syncs
    leader.join()
    assert leader.answer == LEAD and not gc.gathering
    _asleep(gc, 1)
    gc.done(40, True)
    follower.join()
    assert follower.answer == DONE


def test_a_leader_whose_sync_would_cover_gather_bytes_leads_at_once(group_commit):
    gc = group_commit(0)
    # Two producers waited in the last claims, as in the test above: a leader would gather.
    assert gc.try_lead()
    ws = [_Wait(gc, 10), _Wait(gc, 20)]
    _asleep(gc, 2)
    gc.done(5, True)
    ws[0].join()
    gc.done(20, True)
    ws[1].join()
    assert gc.try_lead()
    gc.done(20, True)
    assert gc.producers == 2
    gc.gather_ns = FAR
    gc.gather_bytes = 11
    # 10 bytes up to its record wait to be synced, under the bound: it gathers.
    leader = _Wait(gc, 30)
    testing.wait_until(lambda: gc.gathering, what="the leader to gather")
    follower = _Wait(gc, 31)
    leader.join()
    assert leader.answer == LEAD
    _asleep(gc, 1)
    gc.done(31, True)
    follower.join()
    # 11 bytes reach the bound: it leads at once, with the other producer away (gathering
    # would last until the deadline, 3 s).
    t0 = time.monotonic()
    assert gc.wait(42, time.monotonic_ns() + 3 * 10**9) == LEAD
    assert time.monotonic() - t0 < 2.0 and not gc.gathering
    gc.done(42, True)


def test_the_state_cannot_move_under_a_running_sync(group_commit):
    gc = group_commit(0)
    assert gc.try_lead() and not gc.try_lead()
    with pytest.raises(ValueError):
        gc.reset(0)
    gc.done(0, True)
    with pytest.raises(Exception):
        gc.done(0, True)                          # no one leads now
    gc.reset(70)
    assert gc.flushed == 70


def test_a_store_on_the_compiled_waits_acknowledges_only_durable_puts(tmp_path, kernels):
    store = testing.open_store(tmp_path / "s", kernels,
                               testing.small_config(flush_disk_type=FlushDiskType.SYNC_FLUSH))
    assert isinstance(store.flush_service, CompiledGroupCommitService)
    late = []

    def produce(t):
        mfq = store.commitlog.mfq
        for i in range(50):
            r = store.put_message(Message("G", b"%d-%d" % (t, i), queue_id=t % 4))
            assert r.status is PutMessageStatus.PUT_OK
            if mfq.flushed_where < r.commit_log_offset + r.wrote_bytes:
                late.append((t, i))
    try:
        threads = [threading.Thread(target=produce, args=(t,)) for t in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert late == []
        assert store.flush_service.syncs < 12 * 50      # puts shared syncs
    finally:
        store.shutdown()
