/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_index_worker.c - the index worker (rs_index_worker.h): one thread, one job slot, one
 * mutex and two condition variables (work for a sleeping worker, done for a waiting caller).
 * `pending` is also read without the mutex, with acquire order, so that a caller whose job is
 * done learns it (and sees its results) without a system call: the common case, since the
 * putter comes back for the index only after encoding a whole batch.  While jobs come the
 * worker naps instead of being woken (worker_main says why), and a job it has not started
 * when the caller needs it is taken back (rs_index_worker_reclaim).
 */
#define _GNU_SOURCE               /* pthread under -std=c99 */
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "rs_index.h"
#include "rs_index_worker.h"

#define WORKER_MAGIC 0x52534957u   /* "RSIW" */

typedef struct worker_state {
    uint32_t magic;
    int stop;
    int pending;                  /* written under mu; read atomically without it */
    int asleep;                   /* in its condition wait: a submit must wake it */
    int running;                  /* the worker has taken the job and is at it */
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

/* With mu held: until the worker finished the pending job, if any. */
static void wait_idle(worker_state *s)
{
    while (s->pending)
        pthread_cond_wait(&s->done, &s->mu);
}

static void destroy_sync(worker_state *s)
{
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
}

/* While jobs come, the worker naps this long between looks instead of being woken. */
#define WORKER_NAP_NS 50000L
/* ...until none came for this long; then it sleeps until a submit wakes it. */
#define WORKER_HOT_NS 20000000L

static int64_t worker_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *worker_main(void *arg)
{
    worker_state *s = (worker_state *)arg;
    rs_index_job *j;
    int64_t last = 0;
    struct timespec nap = {0, WORKER_NAP_NS};

    pthread_mutex_lock(&s->mu);
    for (;;) {
        /* Why naps, not a wake-up per job: woken by the putter, the worker was placed by the
         * scheduler on the putter's own CPU whenever the other core was busy (the allocator
         * populating the CommitLog ahead takes half of it), preempting the putter: 35
         * involuntary switches a round of 20 jobs.  As SCHED_BATCH it no longer preempted,
         * but then waited behind the populating threads for its turn on the other core, and
         * the putter waited for it at most of its next puts.  A nap's timer wakes it on its own
         * CPU. */
        while (!s->stop && s->job == NULL) {
            if (worker_now_ns() - last > WORKER_HOT_NS) {
                s->asleep = 1;
                pthread_cond_wait(&s->work, &s->mu);
                s->asleep = 0;
            } else {
                pthread_mutex_unlock(&s->mu);
                nanosleep(&nap, NULL);
                pthread_mutex_lock(&s->mu);
            }
        }
        if (s->job == NULL)
            break;                /* stopped with nothing left to do */
        j = s->job;
        s->running = 1;
        pthread_mutex_unlock(&s->mu);
        rs_index_job_run(j);
        last = worker_now_ns();
        pthread_mutex_lock(&s->mu);
        s->job = NULL;
        s->running = 0;
        __atomic_store_n(&s->pending, 0, __ATOMIC_RELEASE);   /* the results first */
        pthread_cond_broadcast(&s->done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void rs_index_job_run(rs_index_job *job)
{
    job->stop = RS_INDEX_STOP_NONE;
    job->status = rs_index_dispatch(job->ibuf, job->ilen, job->slot_num, job->index_num,
                                    job->limit, job->buf, job->len, job->rows, job->nrows,
                                    &job->row, &job->skip, &job->stop);
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
        destroy_sync(s);
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
    if (s->asleep)
        pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return RS_OK;
}

int rs_index_worker_pending(uint8_t *st, size_t len)
{
    worker_state *s = worker_get(st, len);

    return s != NULL && __atomic_load_n(&s->pending, __ATOMIC_ACQUIRE);
}

int rs_index_worker_reclaim(uint8_t *st, size_t len)
{
    worker_state *s = worker_get(st, len);
    int taken = 0;

    if (s == NULL)
        return 0;
    pthread_mutex_lock(&s->mu);
    if (s->pending && !s->running) {
        s->job = NULL;
        s->pending = 0;
        taken = 1;
    }
    pthread_mutex_unlock(&s->mu);
    return taken;
}

int rs_index_worker_wait(uint8_t *st, size_t len)
{
    worker_state *s = worker_get(st, len);

    if (s == NULL)
        return RS_E_ARG;
    if (!__atomic_load_n(&s->pending, __ATOMIC_ACQUIRE))
        return RS_OK;
    pthread_mutex_lock(&s->mu);
    wait_idle(s);
    pthread_mutex_unlock(&s->mu);
    return RS_OK;
}

int rs_index_worker_close(uint8_t *st, size_t len)
{
    worker_state *s = worker_get(st, len);

    if (s == NULL)
        return RS_E_ARG;
    pthread_mutex_lock(&s->mu);
    wait_idle(s);
    s->stop = 1;
    pthread_cond_signal(&s->work);        /* asleep or napping, it sees stop */
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->magic = 0;
    destroy_sync(s);
    return RS_OK;
}
