/* threadpool.h: a small persistent pthread pool for the CPU backend's data-parallel kernels.
 * threadpool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once on each of the nth threads (the
 * caller is thread 0) and returns when all have finished. Workers spin briefly on a generation
 * counter before sleeping on a condition variable, so a forward pass of a few hundred short
 * jobs pays microseconds, not a futex wake-up each, per job. Not reentrant: one job at a time. */
#ifndef CVLLM_BACKEND_CPU_THREADPOOL_H
#define CVLLM_BACKEND_CPU_THREADPOOL_H

typedef struct ThreadPool ThreadPool;
typedef void (*ThreadPoolFn)(void *ctx, int ith, int nth);

/* Creates a pool of num_threads threads in all (the caller counts as one; 0 = online CPUs). */
ThreadPool *threadpool_create(int num_threads);
/* Number of threads (>= 1), the caller included. */
int threadpool_size(const ThreadPool *p);
/* Runs fn(ctx, ith, nth) for ith = 0..nth-1 in parallel; p == NULL runs fn(ctx, 0, 1). */
void threadpool_run(ThreadPool *p, ThreadPoolFn fn, void *ctx);
/* Joins the workers. Accepts NULL. */
void threadpool_destroy(ThreadPool *p);

#endif
