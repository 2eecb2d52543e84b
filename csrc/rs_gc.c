/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_gc.c - SYNC_FLUSH group commit waits (rs_gc.h).
 *
 * A wait is a gc_wait on the waiting thread's stack.  Whoever wakes it first takes it off the
 * list under the mutex and marks it detached, then (after the mutex) stores the answer in its
 * word and wakes its futex: the waiter reads the answer without the mutex.  A waiter whose
 * deadline passes while it is detached waits for its answer (it is on its way), since the
 * waker still holds its address.
 *
 * The waits a sync serves are woken as a relay: rs_gc_done links them, oldest first, and wakes
 * the first; each, once awake, wakes the next (gc_relay) before its thread goes for the GIL.
 * Woken all at once, the 15 puts a sync serves for 16 threads each woke only to queue for the
 * interpreter lock and sleep again on it; on a 2-vCPU VM, where a thread switch costs several
 * microseconds of CPU, that was 2.3 switches and 25 us of CPU a put.  Relayed, a put is woken
 * about when the one before it is done with the lock: 1.35 switches and 18 us, and 10-20 %
 * more puts a second (doc/performance.md, "A relay of wake-ups").  Every hop is taken by a
 * thread that has its answer and is running, in C, so a relay cannot stall on Python code.
 */
#define _GNU_SOURCE               /* syscall, pthread under -std=c99 */
#include <errno.h>
#include <pthread.h>
#include <time.h>
/* Futex waits on Linux; elsewhere, or built with -DRS_GC_CONDVAR (how the tests run that
 * branch on Linux), one mutex-guarded condition variable. */
#if defined(__linux__) && !defined(RS_GC_CONDVAR)
#define RS_GC_FUTEX 1
#endif
#if defined(RS_GC_FUTEX)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "rs_gc.h"

#define GC_MAGIC 0x52534743u      /* "RSGC" */
#define GC_SEEN 128               /* producer threads remembered (a power of two) */
#define GC_FOREVER INT64_MAX

typedef struct gc_wait {
    int64_t offset;
    /* On the list: its neighbours.  Served by rs_gc_done: next is the next wait of the relay
     * (NULL for the last), set before the answer, read by this wait's thread after it. */
    struct gc_wait *prev, *next;
    uint32_t word;                /* 0 asleep, else the answer (RS_GC_*, or 1 for a gatherer) */
    int detached;                 /* off the list: a waker is about to set word */
} gc_wait;

typedef struct gc_state {
    uint32_t magic;
    int leader;                   /* a sync is claimed */
    int closed;
    pthread_mutex_t mu;
#if !defined(RS_GC_FUTEX)
    pthread_cond_t cv;            /* without futexes: one condition for every word */
#endif
    int64_t flushed;              /* read without mu through __atomic loads */
    gc_wait *head;                /* asleep waits, unordered */
    int64_t waiting;              /* on the list */
    int64_t unserved;             /* threads inside rs_gc_wait, not yet answered */
    gc_wait *gatherer;
    int64_t gather_ns;
    int64_t producers;
    int64_t relayed;              /* waits woken by the wait before them (atomic, no mu) */
    uint64_t epoch;               /* claims so far (from 2) */
    uint64_t seen_tid[GC_SEEN];   /* threads that waited, and the claim they last waited in */
    uint64_t seen_epoch[GC_SEEN];
} gc_state;

typedef char rs_gc_state_fits[sizeof(gc_state) <= RS_GC_STATE_BYTES ? 1 : -1];

static gc_state *gc_get(uint8_t *st, size_t len)
{
    gc_state *s = (gc_state *)st;

    if (st == NULL || len < sizeof(gc_state) || ((uintptr_t)st % sizeof(void *)) != 0)
        return NULL;
    return s->magic == GC_MAGIC ? s : NULL;
}

static int64_t gc_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- one word per wait ---------------------------------------------------------------- */

/* Sleep until w->word is set (its value) or the monotonic clock passes deadline (0). */
static uint32_t gc_sleep(gc_state *s, gc_wait *w, int64_t deadline)
{
#if defined(RS_GC_FUTEX)
    (void)s;
    for (;;) {
        struct timespec ts, *tp = NULL;
        uint32_t v = __atomic_load_n(&w->word, __ATOMIC_ACQUIRE);

        if (v != 0)
            return v;
        if (deadline != GC_FOREVER) {
            if (gc_now() >= deadline)
                return 0;
            ts.tv_sec = (time_t)(deadline / 1000000000);
            ts.tv_nsec = (long)(deadline % 1000000000);
            tp = &ts;
        }
        /* An absolute CLOCK_MONOTONIC deadline; EAGAIN (the word moved), EINTR and
         * ETIMEDOUT all come back to the checks above. */
        syscall(SYS_futex, &w->word, FUTEX_WAIT_BITSET_PRIVATE, 0, tp, NULL,
                FUTEX_BITSET_MATCH_ANY);
    }
#else
    uint32_t v;

    pthread_mutex_lock(&s->mu);
    while ((v = __atomic_load_n(&w->word, __ATOMIC_ACQUIRE)) == 0) {
        if (deadline == GC_FOREVER) {
            pthread_cond_wait(&s->cv, &s->mu);
        } else {
            struct timespec ts;
            int64_t left = deadline - gc_now(), abs_ns;

            if (left <= 0)
                break;
            clock_gettime(CLOCK_REALTIME, &ts);
            abs_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + left;
            ts.tv_sec = (time_t)(abs_ns / 1000000000);
            ts.tv_nsec = (long)(abs_ns % 1000000000);
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return v;
#endif
}

/* Give a detached wait its answer.  Called without mu; w may be gone once the word is set,
 * and a futex wake on a stale address only causes a spurious wake-up, which every sleep
 * tolerates. */
static void gc_wake(gc_state *s, gc_wait *w, uint32_t v)
{
#if defined(RS_GC_FUTEX)
    (void)s;
    __atomic_store_n(&w->word, v, __ATOMIC_RELEASE);
    syscall(SYS_futex, &w->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
#else
    pthread_mutex_lock(&s->mu);
    __atomic_store_n(&w->word, v, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
#endif
}

/* A sync served w, whose thread is awake: wake the next wait that sync served. */
static void gc_relay(gc_state *s, gc_wait *w)
{
    gc_wait *next = w->next;

    if (next == NULL)
        return;
    w->next = NULL;
    __atomic_fetch_add(&s->relayed, 1, __ATOMIC_RELAXED);
    gc_wake(s, next, RS_GC_DONE);
}

/* ---- under mu --------------------------------------------------------------------------- */

static void gc_unlink(gc_state *s, gc_wait *w)
{
    if (w->prev != NULL)
        w->prev->next = w->next;
    else
        s->head = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
    s->waiting--;
}

/* The calling thread waits in the current claim: remember it as a producer. */
static void gc_seen(gc_state *s)
{
    pthread_t self = pthread_self();
    uint64_t tid = 0;
    size_t i, k, h, free_slot = GC_SEEN;

    memcpy(&tid, &self, sizeof(self) < sizeof(tid) ? sizeof(self) : sizeof(tid));
    if (tid == 0)
        tid = 1;
    h = (size_t)((tid * 0x9E3779B97F4A7C15ull) >> 57) & (GC_SEEN - 1);
    for (i = 0; i < GC_SEEN; i++) {
        k = (h + i) & (GC_SEEN - 1);
        if (s->seen_tid[k] == tid) {
            s->seen_epoch[k] = s->epoch;
            return;
        }
        /* A slot last used two claims ago or more counts for nothing: reusable. */
        if (free_slot == GC_SEEN && (s->seen_tid[k] == 0 || s->seen_epoch[k] + 1 < s->epoch))
            free_slot = k;
        if (s->seen_tid[k] == 0)
            break;
    }
    if (free_slot != GC_SEEN) {
        s->seen_tid[free_slot] = tid;
        s->seen_epoch[free_slot] = s->epoch;
    }
}

/* A sync is claimed: the producers a later leader gathers are the threads that waited in
 * this claim or the one before. */
static void gc_claim(gc_state *s)
{
    int64_t n = 0;
    size_t k;

    for (k = 0; k < GC_SEEN; k++)
        if (s->seen_tid[k] != 0 && s->seen_epoch[k] + 1 >= s->epoch)
            n++;
    s->producers = n;
    s->epoch++;
}

/* ---- the interface ---------------------------------------------------------------------- */

int rs_gc_init(uint8_t *st, size_t len, int64_t flushed)
{
    gc_state *s = (gc_state *)st;

    if (st == NULL || len < sizeof(gc_state) || ((uintptr_t)st % sizeof(void *)) != 0)
        return RS_E_ARG;
    memset(s, 0, sizeof(*s));
    if (pthread_mutex_init(&s->mu, NULL) != 0)
        return RS_E_ARG;
#if !defined(RS_GC_FUTEX)
    if (pthread_cond_init(&s->cv, NULL) != 0)
        return RS_E_ARG;
#endif
    s->flushed = flushed;
    s->epoch = 2;
    s->magic = GC_MAGIC;
    return RS_OK;
}

int rs_gc_destroy(uint8_t *st, size_t len)
{
    gc_state *s = gc_get(st, len);

    if (s == NULL || s->head != NULL || s->gatherer != NULL || s->unserved != 0)
        return RS_E_ARG;
    s->magic = 0;
    pthread_mutex_destroy(&s->mu);
#if !defined(RS_GC_FUTEX)
    pthread_cond_destroy(&s->cv);
#endif
    return RS_OK;
}

int rs_gc_wait(uint8_t *st, size_t len, int64_t offset, int64_t deadline_ns,
               int64_t gather_bytes)
{
    gc_state *s = gc_get(st, len);
    gc_wait w, *g = NULL;
    uint32_t r;
    int covered;

    if (s == NULL)
        return RS_E_ARG;
    if (__atomic_load_n(&s->flushed, __ATOMIC_ACQUIRE) >= offset)
        return RS_GC_DONE;
    memset(&w, 0, sizeof(w));
    w.offset = offset;
    pthread_mutex_lock(&s->mu);
    if (s->flushed >= offset) {
        pthread_mutex_unlock(&s->mu);
        return RS_GC_DONE;
    }
    if (s->closed) {
        pthread_mutex_unlock(&s->mu);
        return RS_GC_CLOSED;
    }
    gc_seen(s);
    s->unserved++;
    if (!s->leader) {
        s->leader = 1;
        goto lead;
    }
    /* The last producer a gathering leader waits for: it syncs now. */
    if (s->gatherer != NULL && s->unserved >= s->producers) {
        g = s->gatherer;
        s->gatherer = NULL;
    }
    w.next = s->head;
    if (s->head != NULL)
        s->head->prev = &w;
    s->head = &w;
    s->waiting++;
    pthread_mutex_unlock(&s->mu);
    if (g != NULL)
        gc_wake(s, g, 1);

    r = gc_sleep(s, &w, deadline_ns);
    if (r == 0) {
        pthread_mutex_lock(&s->mu);
        if (!w.detached) {
            gc_unlink(s, &w);
            s->unserved--;
            pthread_mutex_unlock(&s->mu);
            return RS_GC_TIMEOUT;
        }
        pthread_mutex_unlock(&s->mu);
        r = gc_sleep(s, &w, GC_FOREVER);        /* its answer is on its way */
    }
    if (r == RS_GC_DONE) {
        gc_relay(s, &w);
        return gc_now() <= deadline_ns ? RS_GC_DONE : RS_GC_LATE;
    }
    if (r != RS_GC_LEAD)
        return (int)r;
    pthread_mutex_lock(&s->mu);

lead:
    /* Under mu, leading.  Gather while fewer threads wait than the producers seen lately, and
     * while the sync would cover fewer than gather_bytes (its fixed cost then dominates). */
    if (offset - s->flushed < gather_bytes && !s->closed && s->gather_ns > 0
            && s->unserved < s->producers) {
        int64_t now = gc_now();
        int64_t until = deadline_ns - now < s->gather_ns ? deadline_ns : now + s->gather_ns;

        if (until > now) {
            w.word = 0;
            w.detached = 0;
            s->gatherer = &w;
            pthread_mutex_unlock(&s->mu);
            r = gc_sleep(s, &w, until);
            pthread_mutex_lock(&s->mu);
            if (s->gatherer == &w) {
                s->gatherer = NULL;             /* the bound ended it */
            } else if (r == 0) {
                pthread_mutex_unlock(&s->mu);   /* an arrival is waking it */
                gc_sleep(s, &w, GC_FOREVER);
                pthread_mutex_lock(&s->mu);
            }
        }
    }
    s->unserved--;
    if (s->closed) {
        s->leader = 0;
        covered = s->flushed >= offset;
        pthread_mutex_unlock(&s->mu);
        return covered ? RS_GC_DONE : RS_GC_CLOSED;
    }
    gc_claim(s);
    pthread_mutex_unlock(&s->mu);
    return RS_GC_LEAD;
}

int rs_gc_try_lead(uint8_t *st, size_t len)
{
    gc_state *s = gc_get(st, len);
    int led = 0;

    if (s == NULL)
        return RS_E_ARG;
    pthread_mutex_lock(&s->mu);
    if (!s->leader && !s->closed) {
        s->leader = 1;
        gc_claim(s);
        led = 1;
    }
    pthread_mutex_unlock(&s->mu);
    return led;
}

int64_t rs_gc_done(uint8_t *st, size_t len, int64_t flushed, int ok, int64_t sync_ns)
{
    gc_state *s = gc_get(st, len);
    gc_wait *w, *next, *woken = NULL, *lead = NULL;
    int64_t n = 0;

    if (s == NULL)
        return RS_E_ARG;
    pthread_mutex_lock(&s->mu);
    if (!s->leader) {
        pthread_mutex_unlock(&s->mu);
        return RS_E_ARG;
    }
    s->leader = 0;
    if (sync_ns > 0)
        s->gather_ns += (sync_ns - s->gather_ns) / 8;   /* most weight on the last eight */
    /* Lower only when the CommitLog was emptied under the leader: its durable end is then
     * where the files start again. */
    if (ok)
        __atomic_store_n(&s->flushed, flushed, __ATOMIC_RELEASE);
    for (w = s->head; w != NULL; w = next) {
        next = w->next;
        if (w->offset <= s->flushed) {
            gc_unlink(s, w);
            w->detached = 1;
            w->next = woken;
            woken = w;
            s->unserved--;
            n++;
        } else if (lead == NULL || w->offset < lead->offset) {
            lead = w;
        }
    }
    /* A failed sync hands nothing on: its leader closes the state (rs_gc_close, before this
     * call), so nothing later can count as durable. */
    if (lead != NULL && ok && !s->closed) {
        gc_unlink(s, lead);
        lead->detached = 1;
        s->leader = 1;
    } else {
        lead = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    /* woken runs oldest first (the list is newest first); linked through next, it is the
     * relay: its first wait wakes the second, and so on. */
    if (woken != NULL)
        gc_wake(s, woken, RS_GC_DONE);
    if (lead != NULL)
        gc_wake(s, lead, RS_GC_LEAD);
    return n;
}

int rs_gc_close(uint8_t *st, size_t len)
{
    gc_state *s = gc_get(st, len);
    gc_wait *w, *next, *all, *g;
    int64_t flushed;

    if (s == NULL)
        return RS_E_ARG;
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    all = s->head;
    for (w = all; w != NULL; w = w->next) {
        w->detached = 1;
        s->unserved--;
    }
    s->head = NULL;
    s->waiting = 0;
    g = s->gatherer;
    s->gatherer = NULL;
    flushed = s->flushed;
    pthread_mutex_unlock(&s->mu);
    for (w = all; w != NULL; w = next) {
        next = w->next;
        w->next = NULL;             /* answered here, not by a relay */
        gc_wake(s, w, w->offset <= flushed ? RS_GC_DONE : RS_GC_CLOSED);
    }
    if (g != NULL)
        gc_wake(s, g, 1);
    return RS_OK;
}

int rs_gc_reset(uint8_t *st, size_t len, int64_t flushed)
{
    gc_state *s = gc_get(st, len);
    int r = RS_OK;

    if (s == NULL)
        return RS_E_ARG;
    pthread_mutex_lock(&s->mu);
    if (s->leader || s->head != NULL || s->gatherer != NULL)
        r = RS_E_ARG;
    else
        __atomic_store_n(&s->flushed, flushed, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&s->mu);
    return r;
}

int rs_gc_set_gather_ns(uint8_t *st, size_t len, int64_t ns)
{
    gc_state *s = gc_get(st, len);

    if (s == NULL || ns < 0)
        return RS_E_ARG;
    pthread_mutex_lock(&s->mu);
    s->gather_ns = ns;
    pthread_mutex_unlock(&s->mu);
    return RS_OK;
}

int rs_gc_stats(uint8_t *st, size_t len, int64_t *out, int64_t n)
{
    gc_state *s = gc_get(st, len);

    if (s == NULL || out == NULL || n < RS_GC_ST_N)
        return RS_E_ARG;
    pthread_mutex_lock(&s->mu);
    out[RS_GC_ST_FLUSHED] = s->flushed;
    out[RS_GC_ST_LEADER] = s->leader;
    out[RS_GC_ST_WAITING] = s->waiting;
    out[RS_GC_ST_PRODUCERS] = s->producers;
    out[RS_GC_ST_GATHERING] = s->gatherer != NULL;
    out[RS_GC_ST_GATHER_NS] = s->gather_ns;
    out[RS_GC_ST_CLOSED] = s->closed;
    out[RS_GC_ST_RELAYED] = __atomic_load_n(&s->relayed, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&s->mu);
    return RS_OK;
}
