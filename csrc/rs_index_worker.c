/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_index_worker.c - the index worker (rs_index_worker.h): one thread, one job slot, one
 * mutex and two condition variables (work for the worker, done for the waiter).  `pending` is
 * also read without the mutex, with acquire order, so that a caller whose job is done learns
 * it (and sees its results) without a system call: the common case, since the putter comes
 * back for the index only after encoding a whole batch.
 */
#define _GNU_SOURCE               /* pthread under -std=c99 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include "rs_index.h"
#include "rs_index_worker.h"

#define WORKER_MAGIC 0x52534957u   /* "RSIW" */

typedef struct worker_state {
    uint32_t magic;
    int stop;
    int pending;                  /* written under mu; read atomically without it */
    pid_t pid;                    /* the process whose thread this is */
    rs_index_job *job;
    pthread_mutex_t mu;
    pthread_cond_t work;
    pthread_cond_t done;
    pthread_t thread;
} worker_state;

typedef char rs_worker_state_fits[sizeof(worker_state) <= RS_INDEX_WORKER_STATE_BYTES ? 1 : -1];

static worker_state *worker_get(uint8_t *st, size_t len)
{
    worker_state *s = (worker_state *)st;

    if (st == NULL || len < sizeof(worker_state) || ((uintptr_t)st % sizeof(void *)) != 0
        || s->magic != WORKER_MAGIC || s->pid != getpid())
        return NULL;
    return s;
}

static void *worker_main(void *arg)
{
    worker_state *s = (worker_state *)arg;
    rs_index_job *j;
#if defined(SCHED_BATCH)
    struct sched_param p;

    /* Woken by the putter at each job: as an ordinary thread, the wake-up often ran it on the
     * putter's own CPU, putting the putter off it (35 involuntary switches a round of 20 jobs,
     * the putter's wall time 20-50 % over its CPU time).  A batch thread does not preempt on
     * waking; the balancer moves it to the idle core.  A hint: its refusal changes nothing
     * else (as services/base.py's run_as_batch). */
    memset(&p, 0, sizeof(p));
    (void)sched_setscheduler(0, SCHED_BATCH, &p);
#endif

    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->job == NULL)
            pthread_cond_wait(&s->work, &s->mu);
        if (s->job == NULL)
            break;                /* stopped with nothing left to do */
        j = s->job;
        pthread_mutex_unlock(&s->mu);
        j->stop = RS_INDEX_STOP_NONE;
        j->status = rs_index_dispatch(j->ibuf, j->ilen, j->slot_num, j->index_num, j->limit,
                                      j->buf, j->len, j->rows, j->nrows, &j->row, &j->skip,
                                      &j->stop);
        pthread_mutex_lock(&s->mu);
        s->job = NULL;
        __atomic_store_n(&s->pending, 0, __ATOMIC_RELEASE);   /* the results first */
        pthread_cond_broadcast(&s->done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int rs_index_worker_init(uint8_t *st, size_t len)
{
    worker_state *s = (worker_state *)st;
    int err;

    if (st == NULL || len < sizeof(worker_state) || ((uintptr_t)st % sizeof(void *)) != 0)
        return RS_E_ARG;
    memset(s, 0, sizeof(*s));
    if (pthread_mutex_init(&s->mu, NULL) != 0)
        return RS_E_ARG;
    if (pthread_cond_init(&s->work, NULL) != 0 || pthread_cond_init(&s->done, NULL) != 0)
        return RS_E_ARG;
    s->pid = getpid();
    err = pthread_create(&s->thread, NULL, worker_main, s);
    if (err != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work);
        pthread_cond_destroy(&s->done);
        return RS_E_ERRNO_BASE - err;
    }
    s->magic = WORKER_MAGIC;
    return RS_OK;
}

int rs_index_worker_submit(uint8_t *st, size_t len, rs_index_job *job)
{
    worker_state *s = worker_get(st, len);

    if (s == NULL || job == NULL)
        return RS_E_ARG;
    pthread_mutex_lock(&s->mu);
    if (s->pending || s->stop) {
        pthread_mutex_unlock(&s->mu);
        return RS_E_ARG;
    }
    s->job = job;
    s->pending = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return RS_OK;
}

int rs_index_worker_pending(uint8_t *st, size_t len)
{
    worker_state *s = worker_get(st, len);

    return s != NULL && __atomic_load_n(&s->pending, __ATOMIC_ACQUIRE);
}

int rs_index_worker_wait(uint8_t *st, size_t len)
{
    worker_state *s = worker_get(st, len);

    if (s == NULL)
        return RS_E_ARG;
    if (!__atomic_load_n(&s->pending, __ATOMIC_ACQUIRE))
        return RS_OK;
    pthread_mutex_lock(&s->mu);
    while (s->pending)
        pthread_cond_wait(&s->done, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return RS_OK;
}

int rs_index_worker_close(uint8_t *st, size_t len)
{
    worker_state *s = worker_get(st, len);

    if (s == NULL)
        return RS_E_ARG;
    pthread_mutex_lock(&s->mu);
    while (s->pending)
        pthread_cond_wait(&s->done, &s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->magic = 0;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
    return RS_OK;
}
