/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_index_worker.h - a put's index keys built on another core while the putter goes on.
 *
 * After a batch put has written its records and their ConsumeQueue units, the keys of its rows
 * still had to be hashed and put into the index file (rs_index_dispatch): a tenth of the
 * putting thread's CPU (doc/performance.md, "The index on the other core").  Here one thread
 * of its own, which never touches Python, runs that call for the put while the putter returns
 * and encodes its next batch; the putter (or whoever next needs the index) waits for the job
 * and takes over where it stopped.  The state lives in a caller-owned buffer of
 * RS_INDEX_WORKER_STATE_BYTES that must not move while in use; the job is caller-owned too,
 * and it and every buffer it points into must stay put until rs_index_worker_wait returns.
 * One job at a time: a caller submits, and waits before it submits again.
 * GIL: every function is callable without it; the wrapper releases it for
 * rs_index_worker_wait.
 */
#ifndef RS_INDEX_WORKER_H
#define RS_INDEX_WORKER_H

#include "rs_common.h"
#include "rs_format.h"

/* The bytes of state rs_index_worker_init wants (rs_index_worker.c checks that its layout fits). */
#define RS_INDEX_WORKER_STATE_BYTES 512

/*
 * One rs_index_dispatch call, its arguments and results by name: row and skip say where it
 * begins (as rs_index_dispatch takes them), and the worker sets row, skip, stop (as it leaves
 * them) and status (its return) before the job counts as done.
 */
typedef struct rs_index_job {
    uint8_t *ibuf;
    size_t ilen;
    const uint8_t *buf;
    size_t len;
    const rs_scan_rec *rows;
    size_t nrows;
    int64_t limit;
    size_t row;
    size_t skip;
    int32_t slot_num;
    int32_t index_num;
    int32_t stop;
    int32_t status;
} rs_index_job;

/*
 * rs_index_job_run - run `job` in the calling thread, as the worker runs it: what a caller does
 * with a job it took back (rs_index_worker_reclaim) or could not submit.
 */
void rs_index_job_run(rs_index_job *job);

/*
 * rs_index_worker_init - start the worker thread over st[0, len).  Returns RS_OK; RS_E_ARG for
 * a short or misaligned buffer; RS_E_ERRNO_BASE - errno when no thread could be started.
 */
int rs_index_worker_init(uint8_t *st, size_t len);

/*
 * rs_index_worker_submit - hand `job` to the worker and return at once.  Returns RS_OK;
 * RS_E_ARG when st is not a started worker of this process (a fork's child has no worker
 * thread), or when a job is still pending (nothing is submitted then).
 */
int rs_index_worker_submit(uint8_t *st, size_t len, rs_index_job *job);

/* rs_index_worker_pending - 1 from a submit until the worker finished that job, else 0. */
int rs_index_worker_pending(uint8_t *st, size_t len);

/*
 * rs_index_worker_reclaim - take a pending job back before the worker started it: 1 when it
 * was taken back (nothing of it is done, and it is no longer pending: the caller runs it
 * itself), 0 when no job is pending or the worker is already at it (rs_index_worker_wait
 * then).  Why: a worker that has not started its job by the time the caller needs the index
 * is waiting for a CPU, and on a 2-core machine behind the threads that populate ahead of the
 * writer that took milliseconds; the job itself takes tens of microseconds.
 */
int rs_index_worker_reclaim(uint8_t *st, size_t len);

/*
 * rs_index_worker_wait - block until no job is pending; then the last job's results are set and
 * visible to the caller.  Returns RS_OK; RS_E_ARG for a state that is not a started worker.
 */
int rs_index_worker_wait(uint8_t *st, size_t len);

/*
 * rs_index_worker_close - wait for the pending job, stop the worker and join its thread.  The state
 * may then be freed.  Returns RS_OK; RS_E_ARG for a state that is not a started worker (or
 * one started by another process: its thread is not there to join).
 */
int rs_index_worker_close(uint8_t *st, size_t len);

#endif
