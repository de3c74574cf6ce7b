/* threadpool.h: a small persistent pthread pool for the CPU backend's data-parallel kernels.
 * threadpool_run(pool, fn, ctx, n) runs fn(ctx, task, thread) for task = 0..n-1, each task
 * exactly once, on whichever threads get to it first (the caller included), and returns when all
 * n have finished. Tasks are claimed one by one from a shared counter, so the caller never waits
 * for a worker that has not started: on a loaded machine where a worker is descheduled, the
 * caller simply does the work itself. Workers spin briefly before sleeping on a condition
 * variable, so a forward pass of a few hundred short jobs pays no futex wake-up per job.
 * Not reentrant: one job at a time, from one caller thread. */
#ifndef CVLLM_BACKEND_CPU_THREADPOOL_H
#define CVLLM_BACKEND_CPU_THREADPOOL_H

#include <stdint.h>

typedef struct ThreadPool ThreadPool;
/* thread: 0 for the caller, 1..size-1 for the workers; use it to pick per-thread scratch. */
typedef void (*ThreadPoolFn)(void *ctx, int64_t task, int thread);

#define THREADPOOL_MAX_TASKS ((int64_t)1 << 24)

/* Creates a pool of num_threads threads in all (the caller counts as one; 0 = online CPUs). */
ThreadPool *threadpool_create(int num_threads);
/* Number of threads (>= 1), the caller included. */
int threadpool_size(const ThreadPool *p);
/* Runs fn over tasks 0..num_tasks-1 (num_tasks < THREADPOOL_MAX_TASKS); p == NULL runs them
 * in order on the caller. */
void threadpool_run(ThreadPool *p, ThreadPoolFn fn, void *ctx, int64_t num_tasks);
/* Joins the workers. Accepts NULL. */
void threadpool_destroy(ThreadPool *p);

#endif
