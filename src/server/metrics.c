/* metrics.c: Prometheus text for GET /metrics (see metrics.h). */
#include "server/metrics.h"

#include <string.h>

/* vLLM v1's buckets (vllm/v1/metrics/loggers.py) */
static const double TTFT_B[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double ITL_B[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                               0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double E2E_B[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                               30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double LEN_B[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000,
                               20000, 50000, 100000};

#define NB(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void hist_init(Histogram *h, const double *b, int n) {
    memset(h, 0, sizeof *h);
    h->bounds = b;
    h->num_bounds = n;
}

static void hist_observe(Histogram *h, double v) {
    int i = 0;
    while (i < h->num_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

void metrics_init(Metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, TTFT_B, NB(TTFT_B));
    hist_init(&m->itl, ITL_B, NB(ITL_B));
    hist_init(&m->e2e, E2E_B, NB(E2E_B));
    hist_init(&m->prompt_len, LEN_B, NB(LEN_B));
    hist_init(&m->gen_len, LEN_B, NB(LEN_B));
}

void metrics_destroy(Metrics *m) { pthread_mutex_destroy(&m->mu); }

void metrics_observe_ttft(Metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    hist_observe(&m->ttft, s);
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_itl(Metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    hist_observe(&m->itl, s);
    pthread_mutex_unlock(&m->mu);
}

void metrics_add_tokens(Metrics *m, int64_t p, int64_t g) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += p;
    m->generation_tokens += g;
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_finished(Metrics *m, CvllmFinishReason r, double e2e, int prompt_tokens,
                              int gen_tokens) {
    pthread_mutex_lock(&m->mu);
    if (r > 0 && r < 5) m->finished[r]++;
    hist_observe(&m->e2e, e2e);
    hist_observe(&m->prompt_len, prompt_tokens);
    hist_observe(&m->gen_len, gen_tokens);
    pthread_mutex_unlock(&m->mu);
}

static void head(SBuf *o, const char *name, const char *type, const char *help) {
    sbuf_printf(o, "# HELP cvllm:%s %s\n# TYPE cvllm:%s %s\n", name, help, name, type);
}

static void hist_render(SBuf *o, const Histogram *h, const char *name, const char *help,
                        const char *labels) {
    head(o, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i <= h->num_bounds; i++) {
        cum += h->counts[i];
        if (i < h->num_bounds)
            sbuf_printf(o, "cvllm:%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, h->bounds[i],
                        (unsigned long long)cum);
        else
            sbuf_printf(o, "cvllm:%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels,
                        (unsigned long long)cum);
    }
    sbuf_printf(o, "cvllm:%s_sum{%s} %.9g\ncvllm:%s_count{%s} %llu\n", name, labels, h->sum, name,
                labels, (unsigned long long)h->count);
}

void metrics_render(Metrics *m, const CvllmStats *st, const char *model_name, SBuf *o) {
    char labels[320];
    /* label values escape \ " and newline */
    SBuf esc = {0};
    for (const char *p = model_name; *p; p++) {
        if (*p == '\\' || *p == '"') sbuf_add(&esc, "\\", 1);
        if (*p == '\n') sbuf_adds(&esc, "\\n");
        else sbuf_add(&esc, p, 1);
    }
    snprintf(labels, sizeof labels, "model_name=\"%.280s\"", esc.s ? esc.s : "");
    sbuf_free(&esc);

    head(o, "num_requests_running", "gauge", "Number of requests in model execution batches.");
    sbuf_printf(o, "cvllm:num_requests_running{%s} %d\n", labels, st->num_running);
    head(o, "num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
    sbuf_printf(o, "cvllm:num_requests_waiting{%s} %d\n", labels, st->num_waiting);
    head(o, "kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage (blocks held by requests).");
    sbuf_printf(o, "cvllm:kv_cache_usage_perc{%s} %.9g\n", labels,
                st->num_kv_blocks > 0 ? (double)st->kv_blocks_used / st->num_kv_blocks : 0.0);
    head(o, "prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.");
    sbuf_printf(o, "cvllm:prefix_cache_queries_total{%s} %lld\n", labels, (long long)st->prefix_cache_queries);
    head(o, "prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.");
    sbuf_printf(o, "cvllm:prefix_cache_hits_total{%s} %lld\n", labels, (long long)st->prefix_cache_hits);
    head(o, "num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.");
    sbuf_printf(o, "cvllm:num_preemptions_total{%s} %lld\n", labels, (long long)st->num_preemptions);

    pthread_mutex_lock(&m->mu);
    head(o, "prompt_tokens_total", "counter", "Number of prefill tokens processed.");
    sbuf_printf(o, "cvllm:prompt_tokens_total{%s} %lld\n", labels, (long long)m->prompt_tokens);
    head(o, "generation_tokens_total", "counter", "Number of generation tokens processed.");
    sbuf_printf(o, "cvllm:generation_tokens_total{%s} %lld\n", labels, (long long)m->generation_tokens);
    head(o, "request_success_total", "counter", "Count of successfully processed requests.");
    static const char *const REASONS[] = {NULL, "stop", "length", "abort", "error"};
    for (int r = 1; r < 5; r++)
        sbuf_printf(o, "cvllm:request_success_total{%s,finished_reason=\"%s\"} %lld\n", labels,
                    REASONS[r], (long long)m->finished[r]);
    hist_render(o, &m->ttft, "time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels);
    hist_render(o, &m->itl, "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels);
    hist_render(o, &m->e2e, "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", labels);
    hist_render(o, &m->prompt_len, "request_prompt_tokens", "Number of prefill tokens processed.", labels);
    hist_render(o, &m->gen_len, "request_generation_tokens", "Number of generation tokens processed.", labels);
    pthread_mutex_unlock(&m->mu);
}
