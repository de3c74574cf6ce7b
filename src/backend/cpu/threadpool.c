/* threadpool.c: see threadpool.h.
 *
 * Claiming: one 64-bit atomic word packs [generation:16][num_tasks:24][next:24]. A thread
 * claims with a single fetch_add of 1 and learns, from the value it got, which job (generation),
 * how many tasks it has, and which task is its own. If next < num_tasks the claim is real, and
 * the job cannot end (the caller waits for `done == num_tasks`) until that task is done, so
 * reading the job's fn/ctx afterwards is safe. A claim past the end is simply dropped; each
 * thread makes at most one such claim per job, so `next` cannot overflow into num_tasks.
 *
 * Sleeping: workers poll the word for a new generation, then count themselves in `sleepers`
 * (seq_cst) before re-checking under the mutex; the caller publishes the word (seq_cst) before
 * reading `sleepers`, so a wake-up cannot be lost. */
#include "backend/cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "common.h"

#define SPIN_BEFORE_SLEEP 50000 /* pause instructions: a few hundred microseconds */

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define WORD_GEN(w) ((unsigned)((w) >> 48))
#define WORD_TASKS(w) ((int64_t)(((w) >> 24) & 0xffffff))
#define WORD_NEXT(w) ((int64_t)((w)&0xffffff))

typedef struct {
    ThreadPool *pool;
    int ith;
    pthread_t tid;
} Worker;

struct ThreadPool {
    int nth;
    Worker *workers;        /* [nth-1], owned */
    ThreadPoolFn fn;        /* the current job, valid while one of its tasks is claimed */
    void *ctx;
    unsigned gen;           /* caller only: generation of the last job */
    _Atomic uint64_t word;  /* [gen:16][num_tasks:24][next:24] */
    atomic_llong done;      /* tasks of the current job finished */
    atomic_int sleepers;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Claims and runs tasks of the job in `word` until none is left. */
static void work(ThreadPool *p, int ith) {
    for (;;) {
        uint64_t w = atomic_fetch_add(&p->word, 1);
        int64_t task = WORD_NEXT(w);
        if (task >= WORD_TASKS(w)) return;
        p->fn(p->ctx, task, ith);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void *worker_main(void *arg) {
    Worker *wk = arg;
    ThreadPool *p = wk->pool;
    unsigned seen = WORD_GEN(atomic_load(&p->word));
    for (;;) {
        int spins = 0;
        while (WORD_GEN(atomic_load(&p->word)) == seen && !atomic_load(&p->stop)) {
            if (++spins < SPIN_BEFORE_SLEEP) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (WORD_GEN(atomic_load(&p->word)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = WORD_GEN(atomic_load(&p->word));
        work(p, wk->ith);
    }
}

ThreadPool *threadpool_create(int num_threads) {
    if (num_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        num_threads = n > 0 ? (int)n : 1;
    }
    ThreadPool *p = xcalloc(1, sizeof *p);
    p->nth = num_threads;
    atomic_init(&p->word, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->workers = xcalloc((size_t)(num_threads > 1 ? num_threads - 1 : 1), sizeof(Worker));
    for (int i = 1; i < num_threads; i++) {
        Worker *w = &p->workers[i - 1];
        w->pool = p;
        w->ith = i;
        int rc = pthread_create(&w->tid, NULL, worker_main, w);
        CHECK(rc == 0, "pthread_create failed (%d)", rc);
    }
    return p;
}

int threadpool_size(const ThreadPool *p) { return p ? p->nth : 1; }

void threadpool_run(ThreadPool *p, ThreadPoolFn fn, void *ctx, int64_t num_tasks) {
    CHECK(num_tasks >= 0 && num_tasks < THREADPOOL_MAX_TASKS, "%lld tasks", (long long)num_tasks);
    if (!p || p->nth == 1 || num_tasks <= 1) {
        for (int64_t t = 0; t < num_tasks; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->done, 0);
    p->gen = (p->gen + 1) & 0xffff;
    atomic_store(&p->word, (uint64_t)p->gen << 48 | (uint64_t)num_tasks << 24);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < num_tasks) {
        if (++spins < 4096)
            cpu_relax();
        else
            sched_yield(); /* a worker holding a task was descheduled: give it the core */
    }
}

void threadpool_destroy(ThreadPool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nth; i++) pthread_join(p->workers[i - 1].tid, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->workers);
    free(p);
}
