/* engine.c: the public engine API (include/cvllm.h): loads the model, asks the backend registry
 * for a backend, sizes the KV cache, and runs the step loop (nano-vllm's LLMEngine):
 *
 *   drain the inbox (adds, aborts) -> schedule -> model runner (the backend samples) ->
 *   postprocess (append, stop ids, max tokens) -> text (detokenize, stop strings) -> step outputs
 *
 * Threads: one thread owns the engine (step / run). Any thread may submit or abort: both only
 * touch the inbox, under the lock; the step drains it. Requests are validated when submitted, on
 * the submitting thread, against facts that never change after create (vocabulary, lengths, the
 * cache size), so a bad request is refused alone and at once. Stats and the block-pool view are
 * snapshots the step publishes under the same lock.
 *
 * Lifetime of a request: submitted (inbox) -> live (scheduler; `live` array) -> finished: its
 * last output goes out in the step that finished it, and it is freed at the start of the next
 * step (so the step's output pointers stay valid until then). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "common.h"
#include "engine/block_manager.h"
#include "engine/engine_internal.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/text_stream.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

const char *cvllm_version(void) { return CVLLM_VERSION; }

const char *cvllm_finish_reason_name(CvllmFinishReason r) {
    switch (r) {
    case CVLLM_FINISH_STOP: return "stop";
    case CVLLM_FINISH_LENGTH: return "length";
    case CVLLM_FINISH_ABORT: return "abort";
    case CVLLM_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

#define DEFAULT_BLOCK_SIZE 16

/* One request's engine-side state (Sequence.owner). */
typedef struct Request {
    Sequence *seq;
    CvllmOutputFn cb;
    void *user;
    int has_text;
    TextStream ts;
    int num_logprobs;           /* -1: none */
    float *logprobs;            /* [cap] */
    int32_t *top_ids;           /* [cap * num_logprobs] */
    float *top_lp;
    int cap_lp;
    int num_reported;           /* output tokens already in an output */
    char *error;                /* FINISH_ERROR's reason */
    int changed;                /* has an output in this step */
    int final_sent;             /* its last output went out: free at the next step */
} Request;

typedef struct {
    int is_abort;
    int64_t id;     /* abort */
    Request *req;   /* add */
} InboxEvent;

/* A submitted step, as the engine keeps it until its tokens are collected. */
typedef struct {
    Sequence **seqs; /* [max_num_seqs]: the batch (the scheduler's array is reused) */
    int *samples;    /* [max_num_seqs]: 1 if seqs[i] samples a token */
    int n, is_prefill;
    int advanced;    /* scheduler_advance done (asynchronous: before the collect) */
    int64_t step;    /* the scheduler's step number */
} EngineStep;

struct CvllmEngine {
    ModelConfig cfg;
    ModelWeights weights;
    Tokenizer *tok;
    Backend *backend;
    BlockManager *bm;
    Scheduler *sched;
    ModelRunner *runner;
    int block_size, num_blocks, max_model_len, max_num_seqs, max_num_batched_tokens;

    /* engine thread only */
    Request **live;         /* submitted and not yet freed */
    int num_live, cap_live;
    SampledToken *sampled;  /* [max_num_seqs] */
    int32_t *step_tokens;   /* [max_num_seqs]: the sampled ids, as postprocess takes them */
    CvllmRequestOutput *outs;
    int num_outs, cap_outs;
    Request **changed;      /* requests with an output this step */
    int num_changed, cap_changed;
    int64_t prompt_tokens_computed, generated_tokens, num_steps, requests_finished;
    int peak_blocks_used;
    /* Asynchronous scheduling: a step stays in flight (submitted, its tokens not yet collected)
     * while the next is scheduled and submitted; see cvllm_engine_step. */
    int async, async_opt; /* on; CvllmEngineOptions.async_scheduling */
    EngineStep steps[2];
    int flying, fly; /* flying: 1 while steps[fly] is in flight */
    EngineLogitsFn logits_fn;
    void *logits_ctx;

    /* shared: under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    InboxEvent *inbox;
    int num_inbox, cap_inbox;
    int shutdown, shutdown_drain;
    char *broken; /* the backend can run no more steps (a tensor-parallel rank lost): why */
    CvllmStats stats;       /* snapshot */
    int64_t *owners;        /* [num_blocks] block-pool snapshot, once asked for */
    int64_t *owners_next;   /* engine thread: the next snapshot, built outside the lock */
    int want_owners, owners_stale;
    int64_t next_id, requests_added;
    uint64_t seed_counter;  /* seeds unseeded requests */

    /* CVLLM_ENGINE_PROFILE=1: the step's host time by phase, printed at destroy (seconds) */
    int prof_on;
    double prof_s[6];
    int64_t prof_steps;
};

enum { EP_BEGIN, EP_SCHEDULE, EP_PREPARE, EP_FORWARD, EP_POSTPROCESS, EP_OUTPUTS };
static const char *const EP_NAMES[6] = {"inbox + frees", "schedule", "step inputs",
                                        "backend forward", "postprocess", "outputs"};

/* Adds the time since *t to phase k and restarts *t (profiling on). */
static void prof_lap(CvllmEngine *e, int k, double *t) {
    if (!e->prof_on) return;
    double now = now_seconds();
    e->prof_s[k] += now - *t;
    *t = now;
}

/* Moves the backend's time since *fwd0 (model_runner_forward_seconds) out of phase k into
 * EP_FORWARD, and restarts *fwd0 (profiling on). */
static void prof_shift(CvllmEngine *e, int k, double *fwd0) {
    if (!e->prof_on) return;
    const double now = model_runner_forward_seconds(e->runner), d = now - *fwd0;
    e->prof_s[k] -= d;
    e->prof_s[EP_FORWARD] += d;
    *fwd0 = now;
}

static void prof_report(const CvllmEngine *e) {
    if (!e->prof_on || e->prof_steps == 0) return;
    double total = 0;
    for (int k = 0; k < 6; k++) total += e->prof_s[k];
    fprintf(stderr, "cvllm: engine profile (CVLLM_ENGINE_PROFILE): %lld steps, %.1f ms\n",
            (long long)e->prof_steps, total * 1e3);
    for (int k = 0; k < 6; k++)
        fprintf(stderr, "cvllm: engine profile:   %-15s %9.1f ms (%6.1f us a step)\n", EP_NAMES[k],
                e->prof_s[k] * 1e3, e->prof_s[k] * 1e6 / (double)e->prof_steps);
}

void cvllm_engine_options_default(CvllmEngineOptions *o) {
    memset(o, 0, sizeof *o);
    o->device = CVLLM_DEVICE_AUTO;
    o->max_num_seqs = 256;
    o->max_num_batched_tokens = 16384;
    o->enable_prefix_caching = 1;
    o->load_tokenizer = 1;
    o->verbose = 1;
    o->tensor_parallel_size = 1;
}

void cvllm_sampling_params_default(CvllmSamplingParams *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->seed = -1;
    p->max_tokens = 16;
    p->logprobs = -1;
    p->skip_special_tokens = 1;
}

/* ---------------------------------------------------------------------------------------------
 * Create / destroy */

int cvllm_engine_create(const char *model_dir, const CvllmEngineOptions *opts, CvllmEngine **out) {
    *out = NULL;
    CvllmEngineOptions o;
    if (opts) o = *opts; else cvllm_engine_options_default(&o);
    int bs = o.block_size ? o.block_size : DEFAULT_BLOCK_SIZE;
    if (bs < 16 || bs > 256 || (bs & (bs - 1)))
        return cvllm_errorf(CVLLM_EINVAL, "block size %d: must be a power of two in 16..256", bs);
    if (o.max_num_seqs < 1) return cvllm_errorf(CVLLM_EINVAL, "max_num_seqs must be >= 1");
    if (o.max_num_batched_tokens < 1)
        return cvllm_errorf(CVLLM_EINVAL, "max_num_batched_tokens must be >= 1");
    if (o.max_model_len < 0 || o.kv_cache_memory < 0 || o.num_threads < 0)
        return cvllm_errorf(CVLLM_EINVAL, "negative engine option");
    if (!(o.gpu_memory_utilization >= 0 && o.gpu_memory_utilization <= 1))
        return cvllm_errorf(CVLLM_EINVAL, "gpu_memory_utilization must be in (0, 1]");
    if (getenv(CVLLM_TP_WORKER_ENV)) /* started as a rank, but main did not hand it over */
        return cvllm_errorf(CVLLM_EINVAL,
                            "this process was started as a tensor-parallel rank (CVLLM_TP_WORKER "
                            "is set) but did not call cvllm_worker_main() first thing in main; "
                            "it creates no engine (that would start ranks of its own)");
    if (o.tensor_parallel_size < 0 || o.tensor_parallel_size > 64)
        return cvllm_errorf(CVLLM_EINVAL, "tensor_parallel_size %d: must be in 1..64",
                            o.tensor_parallel_size);
    if (o.tp_local_ranks < 0 || o.tp_local_ranks > o.tensor_parallel_size)
        return cvllm_errorf(CVLLM_EINVAL, "tp_local_ranks %d: must be in 0..tensor_parallel_size",
                            o.tp_local_ranks);
    if (o.tensor_parallel_size == 0) o.tensor_parallel_size = 1;
    if (o.tensor_parallel_size > 1 && o.device == CVLLM_DEVICE_CPU)
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "tensor parallelism runs on GPUs (--device cuda); the CPU backend "
                            "uses one process");

    double t_start = now_seconds();
    CvllmEngine *e = xcalloc(1, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->seed_counter = 0x9E3779B97F4A7C15ULL;
    const char *ep = getenv("CVLLM_ENGINE_PROFILE");
    e->prof_on = ep && strcmp(ep, "0") != 0;
    int rc = config_load(model_dir, &e->cfg);
    if (rc < 0) goto fail;
    rc = weights_load(model_dir, &e->cfg, &e->weights);
    if (rc < 0) goto fail;
    if (o.load_tokenizer) {
        /* anything named tokenizer.json (a FIFO, a broken link too) goes to the loader, whose
         * error names it; only its absence means "no tokenizer" */
        char *tj = path_join(model_dir, "tokenizer.json");
        struct stat st;
        int present = lstat(tj, &st) == 0;
        free(tj);
        if (present) {
            rc = tokenizer_load(model_dir, &e->tok);
            if (rc < 0) goto fail;
        }
    }
    double t_load = now_seconds();

    int explicit_len = o.max_model_len > 0;
    e->max_model_len = explicit_len ? o.max_model_len : e->cfg.max_position_embeddings;
    if (e->max_model_len > e->cfg.max_position_embeddings) {
        rc = cvllm_errorf(CVLLM_EINVAL, "max_model_len %d exceeds the model's max_position_embeddings %d",
                          e->max_model_len, e->cfg.max_position_embeddings);
        goto fail;
    }
    e->block_size = bs;
    e->max_num_seqs = o.max_num_seqs;
    e->max_num_batched_tokens = o.max_num_batched_tokens;

    BackendOptions bo = {.num_threads = o.num_threads,
                         .device_id = 0,
                         .max_num_tokens = o.max_num_batched_tokens > o.max_num_seqs
                                               ? o.max_num_batched_tokens : o.max_num_seqs,
                         .max_num_seqs = o.max_num_seqs,
                         .max_model_len = e->max_model_len,
                         .block_size = bs,
                         .gpu_memory_utilization = o.gpu_memory_utilization,
                         .enforce_eager = o.enforce_eager,
                         .tp_rank = 0,
                         .tp_size = o.tensor_parallel_size,
                         .tp_addr = o.tp_addr,
                         .tp_local_ranks = o.tp_local_ranks,
                         .model_dir = model_dir,
                         .verbose = o.verbose};
    rc = backend_create(o.device, &e->cfg, &e->weights, &bo, &e->backend);
    if (rc < 0) goto fail;

    /* KV cache: [2, layers, blocks, block_size, kv_heads (this backend's share), head_dim] */
    KVCacheSpec spec = {.block_size = bs, .prefault = o.prefault_kv_cache};
    switch (o.kv_cache_dtype) {
    case CVLLM_KV_DTYPE_F32: spec.dtype = DTYPE_F32; break;
    case CVLLM_KV_DTYPE_BF16: spec.dtype = DTYPE_BF16; break;
    case CVLLM_KV_DTYPE_FP8: spec.dtype = DTYPE_FP8_E4M3; break;
    default: spec.dtype = e->backend->kv_default_dtype(e->backend);
    }
    int64_t bytes_per_block = e->backend->kv_block_bytes(e->backend, bs, spec.dtype);
    int64_t budget = o.kv_cache_memory ? o.kv_cache_memory : e->backend->kv_budget_bytes(e->backend);
    int64_t nb = bytes_per_block > 0 ? budget / bytes_per_block : 0;
    if (nb < 1) {
        rc = cvllm_errorf(CVLLM_ENOMEM,
                          "KV cache budget of %lld bytes holds no block (one block of %d tokens "
                          "needs %lld bytes); raise --kv-cache-memory",
                          (long long)budget, bs, (long long)bytes_per_block);
        goto fail;
    }
    if (nb > INT32_MAX / 2) nb = INT32_MAX / 2;
    e->num_blocks = (int)nb;
    int64_t cache_tokens = (int64_t)e->num_blocks * bs;
    if (cache_tokens < e->max_model_len) {
        if (explicit_len) {
            rc = cvllm_errorf(CVLLM_ENOMEM,
                              "max_model_len %d does not fit in the KV cache (%lld tokens in %d "
                              "blocks); raise --kv-cache-memory or lower --max-model-len",
                              e->max_model_len, (long long)cache_tokens, e->num_blocks);
            goto fail;
        }
        if (o.verbose)
            fprintf(stderr, "cvllm: max_model_len lowered from %d to %lld to fit the KV cache\n",
                    e->max_model_len, (long long)cache_tokens);
        e->max_model_len = (int)cache_tokens;
    }
    spec.num_blocks = e->num_blocks;
    rc = e->backend->init_kv_cache(e->backend, &spec);
    if (rc < 0) goto fail;
    double t_kv = now_seconds();
    if (e->backend->warmup && (rc = e->backend->warmup(e->backend)) < 0) goto fail;
    double t_warm = now_seconds();
    if (o.verbose) {
        fprintf(stderr,
                "cvllm: %s on %s; KV cache [2, %d, %d, %d, %d, %d] %s: %lld bytes per block, %d "
                "blocks, %.1f MiB\n",
                e->cfg.arch_name, e->backend->name, e->cfg.num_hidden_layers, e->num_blocks, bs,
                (int)(bytes_per_block / (2LL * e->cfg.num_hidden_layers * bs * e->cfg.head_dim *
                                         dtype_size(spec.dtype))),
                e->cfg.head_dim, dtype_name(spec.dtype), (long long)bytes_per_block,
                e->num_blocks, (double)bytes_per_block * e->num_blocks / (1024.0 * 1024.0));
        fprintf(stderr, "cvllm: start-up %.2f s (load %.2f s, backend + KV cache %.2f s, warm-up "
                        "%.2f s)\n",
                t_warm - t_start, t_load - t_start, t_kv - t_load, t_warm - t_kv);
    }

    e->bm = block_manager_create(e->num_blocks, bs, o.enable_prefix_caching);
    SchedulerConfig sc = {.max_num_seqs = o.max_num_seqs,
                          .max_num_batched_tokens = o.max_num_batched_tokens,
                          .max_model_len = e->max_model_len,
                          .eos_token_ids = e->cfg.eos_token_ids,
                          .num_eos_token_ids = e->cfg.num_eos_token_ids};
    e->sched = scheduler_create(&sc, e->bm);
    e->runner = model_runner_create(e->backend, e->cfg.vocab_size, bs, e->max_model_len,
                                    o.max_num_seqs, bo.max_num_tokens);
    e->sampled = xmalloc((size_t)o.max_num_seqs * sizeof(SampledToken));
    e->step_tokens = xmalloc((size_t)o.max_num_seqs * sizeof(int32_t));
    for (int k = 0; k < 2; k++) {
        e->steps[k].seqs = xmalloc((size_t)o.max_num_seqs * sizeof(Sequence *));
        e->steps[k].samples = xmalloc((size_t)o.max_num_seqs * sizeof(int));
    }
    /* on by default where the backend runs steps asynchronously; forced on, a backend without
     * submit runs each step at once (the engine's bookkeeping is the same: tests) */
    e->async_opt = o.async_scheduling;
    engine_refresh_async(e);
    e->stats.num_kv_blocks = e->stats.kv_blocks_free = e->num_blocks;
    *out = e;
    return 0;
fail:
    cvllm_error_wrap(rc, "%s", model_dir);
    cvllm_engine_destroy(e);
    return rc;
}

static void request_free(Request *r) {
    if (!r) return;
    sequence_destroy(r->seq);
    text_stream_free(&r->ts);
    free(r->logprobs);
    free(r->top_ids);
    free(r->top_lp);
    free(r->error);
    free(r);
}

void cvllm_engine_destroy(CvllmEngine *e) {
    if (!e) return;
    prof_report(e);
    if (e->flying) model_runner_collect(e->runner, e->sampled); /* let the device finish it */
    for (int k = 0; k < 2; k++) {
        free(e->steps[k].seqs);
        free(e->steps[k].samples);
    }
    for (int i = 0; i < e->num_live; i++) request_free(e->live[i]);
    for (int i = 0; i < e->num_inbox; i++) request_free(e->inbox[i].req);
    free(e->live);
    free(e->inbox);
    free(e->outs);
    free(e->changed);
    free(e->sampled);
    free(e->step_tokens);
    free(e->owners);
    free(e->owners_next);
    model_runner_destroy(e->runner);
    scheduler_destroy(e->sched);
    block_manager_destroy(e->bm);
    if (e->backend) e->backend->destroy(e->backend);
    tokenizer_free(e->tok);
    weights_free(&e->weights);
    free(e->broken);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

/* ---------------------------------------------------------------------------------------------
 * Submit (any thread) */

/* Everything about a request that can be wrong, checked before anything is queued. */
static int validate_request(const CvllmEngine *e, const int32_t *prompt, int n,
                            const CvllmSamplingParams *p, int *max_tokens) {
    if (!prompt || n < 1) return cvllm_errorf(CVLLM_EINVAL, "empty prompt");
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= e->cfg.vocab_size)
            return cvllm_errorf(CVLLM_EINVAL, "prompt token %d at position %d is outside the "
                                              "vocabulary [0, %d)", prompt[i], i, e->cfg.vocab_size);
    if (n >= e->max_model_len)
        return cvllm_errorf(CVLLM_EINVAL, "prompt of %d tokens does not fit max_model_len %d "
                                          "(it must leave room for one generated token)",
                            n, e->max_model_len);
    if (p->max_tokens == -1) {
        *max_tokens = e->max_model_len - n; /* what is left of the context, as vLLM */
    } else if (p->max_tokens < 1) {
        return cvllm_errorf(CVLLM_EINVAL, "max_tokens must be >= 1 (got %d)", p->max_tokens);
    } else {
        *max_tokens = p->max_tokens;
        if ((int64_t)n + p->max_tokens > e->max_model_len)
            return cvllm_errorf(CVLLM_EINVAL, "prompt (%d tokens) + max_tokens (%d) = %lld exceeds "
                                              "max_model_len %d",
                                n, p->max_tokens, (long long)n + p->max_tokens, e->max_model_len);
    }
    if (blocks_for_tokens(n + *max_tokens, e->block_size) > e->num_blocks)
        return cvllm_errorf(CVLLM_ENOMEM, "request needs %d KV blocks but the cache has %d; raise "
                                          "--kv-cache-memory",
                            blocks_for_tokens(n + *max_tokens, e->block_size), e->num_blocks);
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return cvllm_errorf(CVLLM_EINVAL, "temperature must be >= 0 (got %g)", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return cvllm_errorf(CVLLM_EINVAL, "top_p must be in (0, 1] (got %g)", p->top_p);
    if (p->top_k < -1)
        return cvllm_errorf(CVLLM_EINVAL, "top_k must be -1, 0 (off) or positive (got %d)", p->top_k);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return cvllm_errorf(CVLLM_EINVAL, "min_p must be in [0, 1] (got %g)", p->min_p);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return cvllm_errorf(CVLLM_EINVAL, "presence_penalty must be in [-2, 2] (got %g)",
                            p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return cvllm_errorf(CVLLM_EINVAL, "frequency_penalty must be in [-2, 2] (got %g)",
                            p->frequency_penalty);
    if (!(p->repetition_penalty > 0) || !isfinite(p->repetition_penalty))
        return cvllm_errorf(CVLLM_EINVAL, "repetition_penalty must be > 0 (got %g)",
                            p->repetition_penalty);
    if (p->logprobs < -1 || p->logprobs > CVLLM_MAX_LOGPROBS)
        return cvllm_errorf(CVLLM_EINVAL, "logprobs must be in 0..%d (got %d)", CVLLM_MAX_LOGPROBS,
                            p->logprobs);
    if (p->num_stop_token_ids < 0 || (p->num_stop_token_ids > 0 && !p->stop_token_ids))
        return cvllm_errorf(CVLLM_EINVAL, "bad stop_token_ids");
    for (int i = 0; i < p->num_stop_token_ids; i++)
        if (p->stop_token_ids[i] < 0)
            return cvllm_errorf(CVLLM_EINVAL, "stop token id %d is negative", p->stop_token_ids[i]);
    if (p->num_stop < 0 || (p->num_stop > 0 && !p->stop))
        return cvllm_errorf(CVLLM_EINVAL, "bad stop strings");
    if (p->num_stop > 0 && !e->tok)
        return cvllm_errorf(CVLLM_EINVAL, "stop strings need a tokenizer (no tokenizer.json)");
    for (int i = 0; i < p->num_stop; i++) {
        if (!p->stop[i] || !p->stop[i][0])
            return cvllm_errorf(CVLLM_EINVAL, "stop string %d is empty", i);
        if (!utf8_valid(p->stop[i], strlen(p->stop[i])))
            return cvllm_errorf(CVLLM_EINVAL, "stop string %d is not valid UTF-8", i);
    }
    return 0;
}

int64_t cvllm_engine_submit(CvllmEngine *e, const CvllmRequest *req) {
    const CvllmSamplingParams *cp = &req->params;
    int32_t *encoded = NULL;
    const int32_t *prompt = req->prompt_token_ids;
    int n = req->num_prompt_tokens;
    if (!prompt) {
        if (!req->prompt) return cvllm_errorf(CVLLM_EINVAL, "no prompt");
        if (!e->tok) return cvllm_errorf(CVLLM_EINVAL, "a text prompt needs a tokenizer (no tokenizer.json)");
        n = tokenizer_encode(e->tok, req->prompt, req->prompt_len, &encoded);
        if (n < 0) return n;
        prompt = encoded;
    }
    int max_tokens = 0;
    int rc = validate_request(e, prompt, n, cp, &max_tokens);
    if (rc < 0) {
        free(encoded);
        return rc;
    }
    SamplingParams p = {.temperature = cp->temperature,
                        .top_p = cp->top_p,
                        .top_k = cp->top_k,
                        .min_p = cp->min_p,
                        .presence_penalty = cp->presence_penalty,
                        .frequency_penalty = cp->frequency_penalty,
                        .repetition_penalty = cp->repetition_penalty,
                        .num_logprobs = cp->logprobs,
                        .max_tokens = max_tokens,
                        .ignore_eos = cp->ignore_eos,
                        .stop_token_ids = (int32_t *)cp->stop_token_ids,
                        .num_stop_token_ids = cp->num_stop_token_ids};
    Request *r = xcalloc(1, sizeof *r);
    r->cb = req->on_output;
    r->user = req->user;
    r->num_logprobs = cp->logprobs;
    r->has_text = e->tok != NULL;
    if (r->has_text)
        text_stream_init(&r->ts, e->tok, cp->skip_special_tokens, cp->stop, cp->num_stop,
                         cp->include_stop_str_in_output);

    pthread_mutex_lock(&e->mu);
    if (e->shutdown) {
        pthread_mutex_unlock(&e->mu);
        free(encoded);
        request_free(r);
        if (e->broken) return cvllm_errorf(CVLLM_EBACKEND, "%s", e->broken);
        return cvllm_errorf(CVLLM_ESHUTDOWN, "the engine is shutting down");
    }
    int64_t id = e->next_id++;
    /* unseeded requests: distinct seeds from a counter, mixed (splitmix64's finalizer) */
    if (cp->seed >= 0) {
        p.seed = (uint64_t)cp->seed;
    } else {
        uint64_t z = (e->seed_counter += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        p.seed = z ^ (z >> 31);
    }
    r->seq = sequence_create(id, prompt, n, &p); /* copies prompt and stop ids */
    r->seq->owner = r;
    e->requests_added++;
    InboxEvent ev = {.is_abort = 0, .id = id, .req = r};
    DA_PUSH(e->inbox, e->num_inbox, e->cap_inbox, ev);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    free(encoded);
    return id;
}

int64_t cvllm_engine_add_request(CvllmEngine *e, const int32_t *prompt, int n,
                                 const CvllmSamplingParams *p) {
    CvllmRequest r = {.prompt_token_ids = prompt, .num_prompt_tokens = n};
    if (p) r.params = *p;
    else cvllm_sampling_params_default(&r.params);
    if (!prompt) return cvllm_errorf(CVLLM_EINVAL, "empty prompt");
    return cvllm_engine_submit(e, &r);
}

int cvllm_engine_abort_request(CvllmEngine *e, int64_t id) {
    pthread_mutex_lock(&e->mu);
    InboxEvent ev = {.is_abort = 1, .id = id};
    DA_PUSH(e->inbox, e->num_inbox, e->cap_inbox, ev);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Step (engine thread) */

static void mark_changed(CvllmEngine *e, Request *r) {
    if (r->changed) return;
    r->changed = 1;
    DA_PUSH(e->changed, e->num_changed, e->cap_changed, r);
}

static Request *find_live(CvllmEngine *e, int64_t id) {
    for (int i = 0; i < e->num_live; i++)
        if (e->live[i]->seq->id == id) return e->live[i];
    return NULL;
}

/* Ends a live request now (abort, error, stop string): its blocks are freed at once. */
static void end_request(CvllmEngine *e, Request *r, CvllmFinishReason reason, const char *error) {
    if (r->seq->status == SEQ_FINISHED) return;
    scheduler_finish(e->sched, r->seq, reason);
    if (error && !r->error) r->error = xstrdup(error);
    mark_changed(e, r);
}

/* Frees the requests whose last output went out in an earlier step, and takes the inbox. */
static void begin_step(CvllmEngine *e) {
    int k = 0;
    for (int i = 0; i < e->num_live; i++) { /* a step in flight still holds its sequence */
        if (e->live[i]->final_sent && !e->live[i]->seq->in_flight) request_free(e->live[i]);
        else e->live[k++] = e->live[i];
    }
    e->num_live = k;
    e->num_changed = 0;
    e->num_outs = 0;

    pthread_mutex_lock(&e->mu);
    InboxEvent *ev = e->inbox;
    int nev = e->num_inbox;
    e->inbox = NULL;
    e->num_inbox = e->cap_inbox = 0;
    int abort_all = e->shutdown && !e->shutdown_drain;
    pthread_mutex_unlock(&e->mu);

    for (int i = 0; i < nev; i++) {
        if (!ev[i].is_abort) {
            DA_PUSH(e->live, e->num_live, e->cap_live, ev[i].req);
            scheduler_add(e->sched, ev[i].req->seq);
        } else {
            Request *r = find_live(e, ev[i].id);
            if (r) end_request(e, r, CVLLM_FINISH_ABORT, NULL);
        }
    }
    free(ev);
    if (abort_all)
        for (int i = 0; i < e->num_live; i++) end_request(e, e->live[i], CVLLM_FINISH_ABORT, NULL);
}

/* st: what output token number i (from 0) was sampled with */
static void record_logprobs(Request *r, const SampledToken *st, int i) {
    if (i >= r->cap_lp) {
        r->cap_lp = r->cap_lp ? 2 * r->cap_lp : 16;
        while (r->cap_lp <= i) r->cap_lp *= 2;
        r->logprobs = xrealloc(r->logprobs, (size_t)r->cap_lp * sizeof(float));
        size_t k = (size_t)(r->num_logprobs > 0 ? r->num_logprobs : 1);
        r->top_ids = xrealloc(r->top_ids, (size_t)r->cap_lp * k * sizeof(int32_t));
        r->top_lp = xrealloc(r->top_lp, (size_t)r->cap_lp * k * sizeof(float));
    }
    r->logprobs[i] = st->logprob;
    for (int j = 0; j < r->num_logprobs; j++) {
        r->top_ids[(size_t)i * r->num_logprobs + j] = st->top_ids[j];
        r->top_lp[(size_t)i * r->num_logprobs + j] = st->top_logprobs[j];
    }
}

/* Builds the step's outputs from the changed requests. */
static void build_outputs(CvllmEngine *e) {
    for (int i = 0; i < e->num_changed; i++) {
        Request *r = e->changed[i];
        Sequence *s = r->seq;
        int n_out = sequence_num_completion_tokens(s) - s->num_pending; /* known values only */
        int finished = s->status == SEQ_FINISHED && !s->num_pending;
        size_t new_text = 0;
        if (r->has_text) {
            if (n_out > r->num_reported || finished) {
                int stop = text_stream_push(&r->ts, s->token_ids + s->num_prompt_tokens + r->num_reported,
                                            n_out - r->num_reported, finished);
                if (stop) { /* a stop string: the request ends now, with "stop" */
                    if (!finished) scheduler_finish(e->sched, s, CVLLM_FINISH_STOP);
                    sequence_drop_pending(s); /* finished by length, its last token pending */
                    s->finish_reason = CVLLM_FINISH_STOP;
                    finished = 1;
                }
            }
            new_text = text_stream_release(&r->ts);
        }
        DA_PUSH(e->outs, e->num_outs, e->cap_outs, (CvllmRequestOutput){0});
        CvllmRequestOutput *o = &e->outs[e->num_outs - 1];
        o->request_id = s->id;
        o->user = r->user;
        o->prompt_token_ids = s->token_ids;
        o->num_prompt_tokens = s->num_prompt_tokens;
        o->num_cached_tokens = s->first_hit_tokens;
        o->token_ids = s->token_ids + s->num_prompt_tokens;
        o->num_tokens = n_out;
        o->num_new_tokens = n_out - r->num_reported;
        if (r->has_text) {
            o->text = r->ts.text;
            o->text_len = r->ts.released;
            o->new_text_len = new_text;
            o->new_text = r->ts.text + r->ts.released - new_text;
        }
        if (r->num_logprobs >= 0) {
            o->logprobs = r->logprobs;
            o->top_logprob_ids = r->top_ids;
            o->top_logprobs = r->top_lp;
            o->num_top_logprobs = r->num_logprobs;
        }
        o->finish_reason = finished ? s->finish_reason : CVLLM_FINISH_NONE;
        o->stop_reason = r->has_text && r->ts.matched >= 0 ? r->ts.stops[r->ts.matched] : NULL;
        o->stop_token_id = finished && !o->stop_reason ? s->stop_token_id : -1;
        o->error = finished && s->finish_reason == CVLLM_FINISH_ERROR ? r->error : NULL;
        r->num_reported = n_out;
        r->changed = 0;
        if (finished) {
            r->final_sent = 1;
            e->requests_finished++;
        }
    }
}

static void publish(CvllmEngine *e) {
    CvllmStats s = {0};
    s.num_running = scheduler_num_running(e->sched);
    s.num_waiting = scheduler_num_waiting(e->sched);
    s.num_kv_blocks = e->num_blocks;
    s.kv_blocks_free = block_manager_num_free(e->bm);
    s.kv_blocks_used = e->num_blocks - s.kv_blocks_free;
    if (s.kv_blocks_used > e->peak_blocks_used) e->peak_blocks_used = s.kv_blocks_used;
    s.peak_kv_blocks_used = e->peak_blocks_used;
    s.prefix_cache_queries = block_manager_query_tokens(e->bm);
    s.prefix_cache_hits = block_manager_hit_tokens(e->bm);
    s.num_preemptions = scheduler_num_preemptions(e->sched);
    s.prompt_tokens_computed = e->prompt_tokens_computed;
    s.generated_tokens = e->generated_tokens;
    s.num_steps = e->num_steps;
    s.requests_finished = e->requests_finished;
    pthread_mutex_lock(&e->mu);
    int want = e->want_owners;
    s.requests_added = e->requests_added;
    s.num_waiting += e->num_inbox;
    pthread_mutex_unlock(&e->mu);
    int64_t *owners = NULL;
    if (want) { /* the live view: who holds each block */
        s.kv_blocks_cached = block_manager_num_cached_free(e->bm);
        if (!e->owners_next) e->owners_next = xmalloc((size_t)e->num_blocks * sizeof(int64_t));
        owners = e->owners_next;
        for (int b = 0; b < e->num_blocks; b++) {
            uint64_t h;
            owners[b] = block_manager_ref_count(e->bm, b) == 0
                            ? (block_manager_block_hash(e->bm, b, &h) ? -2 : -1) : -1;
        }
        for (int i = 0;; i++) {
            Sequence *q = scheduler_running_at(e->sched, i);
            if (!q) break;
            for (int b = 0; b < q->num_blocks; b++)
                if (owners[q->block_table[b]] < 0) owners[q->block_table[b]] = q->id;
        }
    }
    pthread_mutex_lock(&e->mu);
    e->stats = s;
    if (owners) { /* swap: the reader's copy and the one built next */
        e->owners_next = e->owners;
        e->owners = owners;
    }
    pthread_mutex_unlock(&e->mu);
}

static void deliver(CvllmEngine *e) {
    for (int i = 0; i < e->num_outs; i++) {
        Request *r = e->outs[i].request_id >= 0 ? e->changed[i] : NULL;
        if (r && r->cb) r->cb(r->user, &e->outs[i]);
    }
}

/* A step failed (its submit, or its collect): its requests end with the backend's error. */
static void fail_step(CvllmEngine *e, const EngineStep *st, int rc) {
    char msg[512];
    snprintf(msg, sizeof msg, "the %s backend failed: %s", e->backend->name, cvllm_last_error());
    block_manager_forget_step(e->bm, st->step);
    for (int i = 0; i < st->n; i++) end_request(e, st->seqs[i]->owner, CVLLM_FINISH_ERROR, msg);
    if (e->backend->broken && !e->broken) {
        /* nothing can run any more: every request ends with the error, new ones are refused,
         * cvllm_engine_run returns */
        e->broken = xstrdup(msg);
        for (int i = 0; i < e->num_live; i++) end_request(e, e->live[i], CVLLM_FINISH_ERROR, msg);
        pthread_mutex_lock(&e->mu);
        e->shutdown = 1;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
    }
    cvllm_errorf(rc, "%s", msg);
}

/* Collects a submitted step's tokens and applies them (postprocess). Returns the tokens it
 * generated, or the backend's error. */
static int finish_step(CvllmEngine *e, EngineStep *st) {
    const int n = st->n;
    int rc = model_runner_collect(e->runner, e->sampled);
    for (int i = 0; i < n; i++) st->seqs[i]->in_flight--;
    if (rc < 0) {
        fail_step(e, st, rc);
        return rc;
    }
    if (!st->advanced) scheduler_advance(e->sched, st->seqs, n, st->samples);
    int32_t *tokens = e->step_tokens;
    int *got = st->samples; /* from here: 1 if seqs[i]'s placeholder takes the token */
    for (int i = 0; i < n; i++) {
        Sequence *q = st->seqs[i];
        tokens[i] = e->sampled[i].token;
        got[i] = tokens[i] >= 0 && q->num_pending;
        Request *r = q->owner;
        if (got[i] && r->num_logprobs >= 0)
            record_logprobs(r, &e->sampled[i], sequence_num_completion_tokens(q) - 1);
    }
    scheduler_resolve(e->sched, st->seqs, n, tokens);
    int generated = 0;
    for (int i = 0; i < n; i++) {
        Request *r = st->seqs[i]->owner;
        generated += got[i];
        if ((got[i] || st->seqs[i]->status == SEQ_FINISHED) && !r->final_sent) mark_changed(e, r);
    }
    e->generated_tokens += generated;
    return generated;
}

/* Whether the step scheduled next may be prepared before this one's tokens are known: not where
 * a running sequence's penalties need its last id, nor in logits mode (golden tests). */
static int async_now(CvllmEngine *e) {
    if (!e->async || e->logits_fn) return 0;
    for (int i = 0;; i++) {
        const Sequence *q = scheduler_running_at(e->sched, i);
        if (!q) return 1;
        const SamplingParams *p = &q->params;
        if (sampling_has_penalty(p->repetition_penalty, p->frequency_penalty, p->presence_penalty))
            return 0;
    }
}

/* One step. Synchronously: schedule, submit, collect, postprocess. Asynchronously, the step
 * before is still in flight: schedule this one as if every token of that step were known (its
 * sequences hold a placeholder: scheduler_advance), submit it (the device takes those ids from
 * the step before's rows), then collect the step before and postprocess it (scheduler_resolve)
 * while the device runs this one, which stays in flight. A sequence that the step before
 * finishes (EOS, a stop id or string) has had one more token scheduled; that token is dropped. */
int cvllm_engine_step(CvllmEngine *e, const CvllmRequestOutput **outs, int *num_outs) {
    if (outs) *outs = NULL;
    if (num_outs) *num_outs = 0;
    double t = e->prof_on ? now_seconds() : 0;
    double fwd0 = model_runner_forward_seconds(e->runner);
    begin_step(e);
    int step_rc = 0, generated = 0;
    if (e->flying && !async_now(e)) { /* the step in flight first */
        e->flying = 0;
        int g = finish_step(e, &e->steps[e->fly]);
        if (g < 0) step_rc = g;
        else generated += g;
    }
    prof_lap(e, EP_BEGIN, &t);
    prof_shift(e, EP_BEGIN, &fwd0);
    Sequence **batch = NULL, *refused = NULL;
    int n = 0, is_prefill = 0, rc;
    while ((rc = scheduler_schedule(e->sched, &batch, &n, &is_prefill, &refused)) == CVLLM_ENOMEM) {
        Request *r = refused->owner; /* finished by the scheduler, with its reason */
        if (!r->error) r->error = xstrdup(cvllm_last_error());
        mark_changed(e, r);
    }
    if (rc < 0) step_rc = rc;
    prof_lap(e, EP_SCHEDULE, &t);
    EngineStep *cur = &e->steps[e->flying ? 1 - e->fly : e->fly];
    int submitted = 0;
    if (rc == 0 && n > 0) {
        e->num_steps++;
        if (is_prefill)
            for (int i = 0; i < n; i++) e->prompt_tokens_computed += batch[i]->num_scheduled_tokens;
        memcpy(cur->seqs, batch, (size_t)n * sizeof *batch);
        cur->n = n;
        cur->is_prefill = is_prefill;
        cur->advanced = 0;
        cur->step = scheduler_current_step(e->sched);
        rc = model_runner_submit(e->runner, batch, n, is_prefill);
        prof_lap(e, EP_PREPARE, &t);
        prof_shift(e, EP_PREPARE, &fwd0); /* model_runner_submit less the backend's */
        e->prof_steps += e->prof_on;
        if (rc < 0) {
            step_rc = rc;
            fail_step(e, cur, rc);
        } else {
            submitted = 1;
            for (int i = 0; i < n; i++) {
                cur->samples[i] = batch[i]->sample_row >= 0;
                batch[i]->in_flight++;
            }
        }
    }
    if (e->flying) { /* the step before: collected while the device runs this one */
        e->flying = 0;
        int g = finish_step(e, &e->steps[e->fly]);
        if (g < 0) step_rc = g;
        else generated += g;
    }
    if (submitted) {
        e->fly = (int)(cur - e->steps);
        if (async_now(e)) {
            scheduler_advance(e->sched, cur->seqs, cur->n, cur->samples);
            cur->advanced = 1;
            e->flying = 1;
        } else {
            int g = finish_step(e, cur);
            if (g < 0) step_rc = g;
            else generated += g;
        }
    }
    prof_lap(e, EP_POSTPROCESS, &t);
    prof_shift(e, EP_POSTPROCESS, &fwd0); /* a collect's wait counts as the backend's */
    build_outputs(e);
    publish(e);
    deliver(e);
    prof_lap(e, EP_OUTPUTS, &t);
    if (outs) *outs = e->outs;
    if (num_outs) *num_outs = e->num_outs;
    return step_rc < 0 ? step_rc : generated;
}

int cvllm_engine_has_unfinished(CvllmEngine *e) {
    pthread_mutex_lock(&e->mu);
    int pending = e->num_inbox > 0;
    pthread_mutex_unlock(&e->mu);
    if (pending || e->flying || !scheduler_is_finished(e->sched)) return 1;
    for (int i = 0; i < e->num_live; i++) /* finished, but its last output not yet built */
        if (!e->live[i]->final_sent && e->live[i]->seq->status == SEQ_FINISHED) return 1;
    return 0;
}

int cvllm_engine_run(CvllmEngine *e) {
    int rc = 0;
    for (;;) {
        if (cvllm_engine_has_unfinished(e)) {
            int r = cvllm_engine_step(e, NULL, NULL);
            if (r < 0) rc = r; /* the step's requests got the error; the others go on */
            if (e->broken) break; /* unless the backend can run nothing more (below) */
            continue;
        }
        pthread_mutex_lock(&e->mu);
        while (e->num_inbox == 0 && !e->shutdown && !e->owners_stale)
            pthread_cond_wait(&e->cv, &e->mu);
        int refresh = e->owners_stale, stop = e->shutdown && e->num_inbox == 0;
        e->owners_stale = 0;
        pthread_mutex_unlock(&e->mu);
        if (refresh) publish(e);
        if (stop && !cvllm_engine_has_unfinished(e)) break;
    }
    publish(e);
    if (e->broken) rc = cvllm_errorf(CVLLM_EBACKEND, "%s", e->broken); /* also if it broke before */
    return rc;
}

void cvllm_engine_shutdown(CvllmEngine *e, int drain) {
    pthread_mutex_lock(&e->mu);
    e->shutdown = 1;
    e->shutdown_drain = drain;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* ---------------------------------------------------------------------------------------------
 * Blocking batch generation */

int cvllm_generate(CvllmEngine *e, int n, const int32_t *const *prompts, const int *lens,
                   const CvllmSamplingParams *params, CvllmOutput *outs) {
    int64_t *ids = xmalloc((size_t)(n ? n : 1) * sizeof(int64_t));
    for (int i = 0; i < n; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        ids[i] = cvllm_engine_add_request(e, prompts[i], lens[i], params ? &params[i] : NULL);
        outs[i].request_id = ids[i];
        if (ids[i] < 0) outs[i].error = xstrdup(cvllm_last_error());
    }
    int rc = 0;
    while (cvllm_engine_has_unfinished(e)) {
        const CvllmRequestOutput *o;
        int no;
        int r = cvllm_engine_step(e, &o, &no);
        if (r < 0) rc = r;
        for (int k = 0; k < no; k++) {
            if (o[k].finish_reason == CVLLM_FINISH_NONE) continue;
            int i = 0; /* ids are increasing in submission order */
            while (i < n && ids[i] != o[k].request_id) i++;
            if (i == n) continue;
            CvllmOutput *out = &outs[i];
            out->num_prompt_tokens = o[k].num_prompt_tokens;
            out->prompt_token_ids = xmalloc((size_t)o[k].num_prompt_tokens * sizeof(int32_t));
            memcpy(out->prompt_token_ids, o[k].prompt_token_ids,
                   (size_t)o[k].num_prompt_tokens * sizeof(int32_t));
            out->num_tokens = o[k].num_tokens;
            out->token_ids = xmalloc((size_t)(o[k].num_tokens ? o[k].num_tokens : 1) * sizeof(int32_t));
            memcpy(out->token_ids, o[k].token_ids, (size_t)o[k].num_tokens * sizeof(int32_t));
            if (o[k].text) {
                out->text = xmalloc(o[k].text_len + 1);
                memcpy(out->text, o[k].text, o[k].text_len);
                out->text[o[k].text_len] = '\0';
                out->text_len = o[k].text_len;
            }
            out->finish_reason = o[k].finish_reason;
            out->num_cached_tokens = o[k].num_cached_tokens;
            if (o[k].error) out->error = xstrdup(o[k].error);
        }
    }
    free(ids);
    return rc < 0 ? rc : 0;
}

void cvllm_output_free(CvllmOutput *o) {
    if (!o) return;
    free(o->prompt_token_ids);
    free(o->token_ids);
    free(o->text);
    free(o->error);
    o->prompt_token_ids = o->token_ids = NULL;
    o->text = o->error = NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Queries */

void cvllm_engine_get_stats(CvllmEngine *e, CvllmStats *s) {
    pthread_mutex_lock(&e->mu);
    *s = e->stats;
    pthread_mutex_unlock(&e->mu);
}

int cvllm_engine_block_owners(CvllmEngine *e, int64_t *owner, int n) {
    pthread_mutex_lock(&e->mu);
    if (!e->want_owners) {
        e->want_owners = 1; /* from now on every step publishes the pool */
        e->owners_stale = 1;
        pthread_cond_signal(&e->cv);
    }
    for (int b = 0; b < n && b < e->num_blocks; b++) owner[b] = e->owners ? e->owners[b] : -1;
    pthread_mutex_unlock(&e->mu);
    return e->num_blocks;
}

int cvllm_engine_vocab_size(const CvllmEngine *e) { return e->cfg.vocab_size; }
int cvllm_engine_max_model_len(const CvllmEngine *e) { return e->max_model_len; }
int cvllm_engine_block_size(const CvllmEngine *e) { return e->block_size; }
const char *cvllm_engine_device_name(const CvllmEngine *e) { return e->backend->name; }
const void *cvllm_engine_tokenizer(const CvllmEngine *e) { return e->tok; }

static void forward_logits_hook(void *ctx, const Sequence *seq, const float *logits, int vocab) {
    CvllmEngine *e = ctx;
    e->logits_fn(e->logits_ctx, seq->id, logits, vocab);
}

void engine_refresh_async(CvllmEngine *e) {
    e->async = e->async_opt > 0 || (e->async_opt == 0 && e->backend->submit);
}

struct Backend *engine_backend(CvllmEngine *e) {
    return e->backend;
}

void engine_set_logits_hook(CvllmEngine *e, EngineLogitsFn fn, void *ctx) {
    e->logits_fn = fn;
    e->logits_ctx = ctx;
    model_runner_set_logits_hook(e->runner, fn ? forward_logits_hook : NULL, e);
}
