/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_gc.h - SYNC_FLUSH group commit waits: puts wait for the durable offset to pass their record
 * with no interpreter lock and no Python on the way (doc/03 §2.2).
 *
 * The state lives in a caller-owned buffer of RS_GC_STATE_BYTES that must not move while in use
 * (rocketstore/services/flush.py CompiledGroupCommitService owns one).  It holds the durable
 * offset, whether a sync is running (its "leader"), and the waits: each wait is a small record on
 * the waiting thread's own stack, linked into the state and woken by a futex on Linux (a condition
 * variable elsewhere), so a sync wakes exactly the waits it served, each with one system call, and
 * the woken thread needs no lock to learn its answer.  They wake as a relay, each woken wait
 * waking the next, so that they reach the interpreter lock one after another rather than all
 * at once (rs_gc.c).
 *
 * One sync at a time: a wait that finds no sync running becomes the leader, and the caller syncs
 * everything written, then calls rs_gc_done.  A sync that ends hands leadership to the waiting
 * put with the lowest offset, whose bytes it did not cover.  A new leader first gathers: while
 * fewer puts wait than producer threads waited in the last two syncs, it sleeps until they do or
 * for at most the recent mean sync time (MySQL's binlog group commit delay, bounded by the disk),
 * unless the bytes its sync would already cover reach the caller's bound: past it a sync's time
 * grows with its bytes, and gathering more only keeps the producers from putting meanwhile.
 * GIL: every function is callable without it; the wrappers release it for rs_gc_wait.
 */
#ifndef RS_GC_H
#define RS_GC_H

#include "rs_common.h"

/* The bytes of state rs_gc_init wants (rs_gc.c checks that its layout fits). */
#define RS_GC_STATE_BYTES 4096

/* rs_gc_wait answers. */
#define RS_GC_DONE 1       /* the durable offset covers the wait's offset, within its deadline */
#define RS_GC_LEAD 2       /* the caller leads: sync, then rs_gc_done */
#define RS_GC_TIMEOUT 3    /* the deadline passed first */
#define RS_GC_CLOSED 4     /* rs_gc_close ended the wait before the offset was durable */
#define RS_GC_LATE 5       /* covered, but only after the deadline (FLUSH_DISK_TIMEOUT) */

/* rs_gc_stats slots. */
#define RS_GC_ST_FLUSHED 0     /* the durable offset */
#define RS_GC_ST_LEADER 1      /* 1 while a sync is claimed */
#define RS_GC_ST_WAITING 2     /* waits asleep until a sync covers them */
#define RS_GC_ST_PRODUCERS 3   /* threads that waited in the last two syncs */
#define RS_GC_ST_GATHERING 4   /* 1 while a leader gathers */
#define RS_GC_ST_GATHER_NS 5   /* the gathering bound: the recent mean sync time */
#define RS_GC_ST_CLOSED 6
#define RS_GC_ST_RELAYED 7     /* served waits woken by the wait served before them */
#define RS_GC_ST_N 8

/* rs_gc_init - initialise st[0, len) with `flushed` durable.  RS_E_ARG if len is too small. */
int rs_gc_init(uint8_t *st, size_t len, int64_t flushed);

/* rs_gc_destroy - release what rs_gc_init set up; no wait may be in progress. */
int rs_gc_destroy(uint8_t *st, size_t len);

/*
 * rs_gc_wait - block until the durable offset reaches `offset`, the monotonic clock passes
 * `deadline_ns` (CLOCK_MONOTONIC nanoseconds), or the caller is to lead the next sync; returns
 * one of RS_GC_DONE, LEAD, TIMEOUT, CLOSED, LATE.  A leader gathers first while fewer than
 * `gather_bytes` bytes up to its own `offset` are not yet durable (0: it never gathers).
 * RS_GC_LEAD is returned whatever the deadline: the caller then owns the sync and must call
 * rs_gc_done.  Blocks: wrappers release the GIL.
 */
int rs_gc_wait(uint8_t *st, size_t len, int64_t offset, int64_t deadline_ns,
               int64_t gather_bytes);

/* rs_gc_try_lead - 1 if the caller now leads (no sync was running and the state is open), else 0. */
int rs_gc_try_lead(uint8_t *st, size_t len);

/*
 * rs_gc_done - the leader's sync ended.  ok: [.., flushed) is durable; the waits it covers are
 * answered RS_GC_DONE (or LATE), as a relay: this call wakes the oldest, and each wakes the next
 * on its way out of rs_gc_wait.  The lowest waiting offset left is handed the lead at once.
 * Not ok: nothing moves and no one is handed the lead (the caller closes the state: a failed
 * sync is never retried, see rocketstore/services/flush.py SyncLatch).  sync_ns feeds the
 * gathering bound (0: no sample).  Returns the number of waits served.
 */
int64_t rs_gc_done(uint8_t *st, size_t len, int64_t flushed, int ok, int64_t sync_ns);

/* rs_gc_close - end every wait (RS_GC_DONE if covered, else CLOSED); later waits answer CLOSED. */
int rs_gc_close(uint8_t *st, size_t len);

/* rs_gc_reset - the durable offset is `flushed` (the CommitLog was cut back or emptied) and the
 * state is open again.  RS_E_ARG while a sync is claimed or a wait is asleep. */
int rs_gc_reset(uint8_t *st, size_t len, int64_t flushed);

/* rs_gc_set_gather_ns - set the gathering bound (0: never gather). */
int rs_gc_set_gather_ns(uint8_t *st, size_t len, int64_t ns);

/* rs_gc_stats - out[0, RS_GC_ST_N) = the RS_GC_ST_* values.  RS_E_ARG if n < RS_GC_ST_N. */
int rs_gc_stats(uint8_t *st, size_t len, int64_t *out, int64_t n);

#endif /* RS_GC_H */
