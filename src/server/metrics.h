/* metrics.h: the server's Prometheus metrics, with vLLM's names under the prefix "cvllm:".
 * Histograms (time to first token, inter-token latency, end-to-end latency, with vLLM's buckets)
 * and token/request counters are observed by the server as outputs arrive (any thread, locked);
 * gauges and the prefix-cache / preemption counters come from the engine's stats at render time. */
#ifndef CVLLM_SERVER_METRICS_H
#define CVLLM_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "cvllm.h"
#include "server/sbuf.h"

#define METRICS_MAX_BUCKETS 24

typedef struct {
    const double *bounds; /* upper bounds, ascending (+Inf implicit) */
    int num_bounds;
    uint64_t counts[METRICS_MAX_BUCKETS + 1]; /* per bucket, not cumulative; last = +Inf */
    uint64_t count;
    double sum;
} Histogram;

typedef struct {
    pthread_mutex_t mu;
    Histogram ttft, itl, e2e, prompt_len, gen_len;
    int64_t prompt_tokens, generation_tokens;
    int64_t finished[5]; /* by CvllmFinishReason (stop, length, abort, error) */
} Metrics;

void metrics_init(Metrics *m);
void metrics_destroy(Metrics *m);
void metrics_observe_ttft(Metrics *m, double seconds);
void metrics_observe_itl(Metrics *m, double seconds);
/* A request (one choice) finished: its latency, prompt and generated token counts. */
void metrics_observe_finished(Metrics *m, CvllmFinishReason r, double e2e_seconds,
                              int prompt_tokens, int generation_tokens);
void metrics_add_tokens(Metrics *m, int64_t prompt_tokens, int64_t generation_tokens);
/* Appends the Prometheus text exposition (format 0.0.4) to out. */
void metrics_render(Metrics *m, const CvllmStats *st, const char *model_name, SBuf *out);

#endif
