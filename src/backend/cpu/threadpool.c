/* threadpool.c: see threadpool.h. Dispatch protocol: the caller publishes (fn, ctx), sets
 * pending = nth-1 and bumps `generation`; each worker that sees a new generation runs its share
 * and decrements pending; the caller runs share 0 and waits for pending == 0. Sleeping workers
 * count themselves in `sleepers` (seq_cst) before re-checking the generation under the mutex, so
 * the caller's "bump generation, then broadcast if anyone sleeps" cannot lose a wake-up. */
#include "backend/cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "common.h"

#define SPIN_BEFORE_SLEEP 200000 /* ~ a few hundred microseconds of polling */

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() ((void)0)
#endif

typedef struct {
    ThreadPool *pool;
    int ith;
    pthread_t tid;
} Worker;

struct ThreadPool {
    int nth;
    Worker *workers; /* [nth-1], owned */
    ThreadPoolFn fn;
    void *ctx;
    atomic_uint generation;
    atomic_int pending;
    atomic_int sleepers;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *worker_main(void *arg) {
    Worker *w = arg;
    ThreadPool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop)) {
            if (++spins < SPIN_BEFORE_SLEEP) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = gen;
        p->fn(p->ctx, w->ith, p->nth);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

ThreadPool *threadpool_create(int num_threads) {
    if (num_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        num_threads = n > 0 ? (int)n : 1;
    }
    ThreadPool *p = xcalloc(1, sizeof *p);
    p->nth = num_threads;
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
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

void threadpool_run(ThreadPool *p, ThreadPoolFn fn, void *ctx) {
    if (!p || p->nth == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->nth - 1);
    atomic_fetch_add(&p->generation, 1); /* seq_cst: publishes fn/ctx/pending */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->nth);
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        if (++spins < 4096)
            cpu_relax();
        else
            sched_yield(); /* a worker was descheduled: give it the core */
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
