/* engine.c: the public engine API (include/cvllm.h): loads the model, picks the backend, sizes
 * the KV cache, and runs the step loop  schedule -> model runner -> postprocess  (nano-vllm's
 * LLMEngine). Requests are validated when they are added, so a bad request is refused alone and
 * never reaches the batch. */
#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "common.h"
#include "engine/block_manager.h"
#include "engine/engine_internal.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "model/config.h"
#include "model/weights.h"

const char *cvllm_version(void) { return CVLLM_VERSION; }
const char *cvllm_backends(void) {
#ifdef CVLLM_HAVE_CUDA
    return "cpu,cuda";
#else
    return "cpu";
#endif
}

#define DEFAULT_CPU_KV_BYTES (2LL << 30)
#define DEFAULT_BLOCK_SIZE 16

struct CvllmEngine {
    ModelConfig cfg;
    ModelWeights weights;
    Backend *backend;
    BlockManager *bm;
    Scheduler *sched;
    ModelRunner *runner;
    int block_size, num_blocks, max_model_len, max_num_seqs, max_num_batched_tokens;
    Sequence **seqs; /* [num_ids]: by request id; NULL once taken. Owned. */
    int64_t num_ids, cap_ids;
    int32_t *step_tokens;   /* [max_num_seqs] */
    uint64_t rng;           /* counter that seeds unseeded requests */
    int64_t prompt_tokens_computed, generated_tokens;
    int peak_blocks_used;
    EngineLogitsFn logits_fn;
    void *logits_ctx;
};

void cvllm_engine_options_default(CvllmEngineOptions *o) {
    memset(o, 0, sizeof *o);
    o->device = CVLLM_DEVICE_AUTO;
    o->max_num_seqs = 256;
    o->max_num_batched_tokens = 16384;
    o->block_size = 0;
    o->gpu_memory_utilization = 0.9;
    o->enable_prefix_caching = 1;
    o->verbose = 1;
}

void cvllm_sampling_params_default(CvllmSamplingParams *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->min_p = 0.0f;
    p->seed = -1;
    p->max_tokens = 16;
}

static int create_backend(CvllmEngine *e, const CvllmEngineOptions *o, const BackendOptions *bo) {
    if (o->device == CVLLM_DEVICE_CUDA) return backend_cuda_create(&e->cfg, &e->weights, bo, &e->backend);
    if (o->device == CVLLM_DEVICE_AUTO) {
#ifdef CVLLM_HAVE_CUDA
        if (backend_cuda_create(&e->cfg, &e->weights, bo, &e->backend) == 0) return 0;
#endif
    }
    return backend_cpu_create(&e->cfg, &e->weights, bo, &e->backend);
}

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

    CvllmEngine *e = xcalloc(1, sizeof *e);
    int rc = config_load(model_dir, &e->cfg);
    if (rc < 0) goto fail;
    rc = weights_load(model_dir, &e->cfg, &e->weights);
    if (rc < 0) goto fail;

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
                         .max_model_len = e->max_model_len};
    rc = create_backend(e, &o, &bo);
    if (rc < 0) goto fail;

    /* KV cache: [2, layers, blocks, block_size, kv_heads, head_dim], f32 unless bf16 asked. */
    KVCacheSpec spec = {.block_size = bs,
                        .dtype = o.kv_cache_dtype == CVLLM_KV_DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32,
                        .prefault = o.prefault_kv_cache};
    int64_t bytes_per_block = 2LL * e->cfg.num_hidden_layers * bs * e->cfg.num_key_value_heads *
                              e->cfg.head_dim * (int64_t)dtype_size(spec.dtype);
    int64_t budget = o.kv_cache_memory;
    if (budget == 0) {
        int64_t avail = e->backend->available_kv_bytes(e->backend);
        budget = strcmp(e->backend->name, "cpu") == 0 && avail > DEFAULT_CPU_KV_BYTES
                     ? DEFAULT_CPU_KV_BYTES : avail;
    }
    int64_t nb = budget / bytes_per_block;
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
    if (o.verbose) {
        fprintf(stderr,
                "cvllm: %s on %s; KV cache [2, %d, %d, %d, %d, %d] %s: %lld bytes per block, %d "
                "blocks, %.1f MiB\n",
                e->cfg.arch_name, e->backend->name, e->cfg.num_hidden_layers, e->num_blocks, bs,
                e->cfg.num_key_value_heads, e->cfg.head_dim, dtype_name(spec.dtype),
                (long long)bytes_per_block, e->num_blocks,
                (double)bytes_per_block * e->num_blocks / (1024.0 * 1024.0));
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
    e->step_tokens = xmalloc((size_t)o.max_num_seqs * sizeof(int32_t));
    e->rng = 0x9E3779B97F4A7C15ULL;
    *out = e;
    return 0;
fail:
    cvllm_error_wrap(rc, "%s", model_dir);
    cvllm_engine_destroy(e);
    return rc;
}

void cvllm_engine_destroy(CvllmEngine *e) {
    if (!e) return;
    for (int64_t i = 0; i < e->num_ids; i++) sequence_destroy(e->seqs[i]);
    free(e->seqs);
    free(e->step_tokens);
    model_runner_destroy(e->runner);
    scheduler_destroy(e->sched);
    block_manager_destroy(e->bm);
    if (e->backend) e->backend->destroy(e->backend);
    weights_free(&e->weights);
    free(e);
}

/* Everything about a request that can be wrong, checked before anything is queued. */
static int validate_request(const CvllmEngine *e, const int32_t *prompt, int n,
                            const CvllmSamplingParams *p) {
    if (!prompt || n < 1) return cvllm_errorf(CVLLM_EINVAL, "empty prompt");
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= e->cfg.vocab_size)
            return cvllm_errorf(CVLLM_EINVAL, "prompt token %d at position %d is outside the "
                                              "vocabulary [0, %d)", prompt[i], i, e->cfg.vocab_size);
    if (p->max_tokens < 1)
        return cvllm_errorf(CVLLM_EINVAL, "max_tokens must be >= 1 (got %d)", p->max_tokens);
    if (n >= e->max_model_len)
        return cvllm_errorf(CVLLM_EINVAL, "prompt of %d tokens does not fit max_model_len %d "
                                          "(it must leave room for one generated token)",
                            n, e->max_model_len);
    if ((int64_t)n + p->max_tokens > e->max_model_len)
        return cvllm_errorf(CVLLM_EINVAL, "prompt (%d tokens) + max_tokens (%d) = %lld exceeds "
                                          "max_model_len %d",
                            n, p->max_tokens, (long long)n + p->max_tokens, e->max_model_len);
    if (blocks_for_tokens(n + p->max_tokens, e->block_size) > e->num_blocks)
        return cvllm_errorf(CVLLM_ENOMEM, "request needs %d KV blocks but the cache has %d; raise "
                                          "--kv-cache-memory",
                            blocks_for_tokens(n + p->max_tokens, e->block_size), e->num_blocks);
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return cvllm_errorf(CVLLM_EINVAL, "temperature must be >= 0 (got %g)", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return cvllm_errorf(CVLLM_EINVAL, "top_p must be in (0, 1] (got %g)", p->top_p);
    if (p->top_k < -1)
        return cvllm_errorf(CVLLM_EINVAL, "top_k must be -1, 0 (off) or positive (got %d)", p->top_k);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return cvllm_errorf(CVLLM_EINVAL, "min_p must be in [0, 1] (got %g)", p->min_p);
    if (p->num_stop_token_ids < 0 || (p->num_stop_token_ids > 0 && !p->stop_token_ids))
        return cvllm_errorf(CVLLM_EINVAL, "bad stop_token_ids");
    return 0;
}

int64_t cvllm_engine_add_request(CvllmEngine *e, const int32_t *prompt, int n,
                                 const CvllmSamplingParams *cp) {
    CvllmSamplingParams def;
    if (!cp) { cvllm_sampling_params_default(&def); cp = &def; }
    int rc = validate_request(e, prompt, n, cp);
    if (rc < 0) return rc;
    SamplingParams p = {.temperature = cp->temperature,
                        .top_p = cp->top_p,
                        .top_k = cp->top_k,
                        .min_p = cp->min_p,
                        .seed = cp->seed,
                        .max_tokens = cp->max_tokens,
                        .ignore_eos = cp->ignore_eos,
                        .stop_token_ids = (int32_t *)cp->stop_token_ids,
                        .num_stop_token_ids = cp->num_stop_token_ids};
    int64_t id = e->num_ids;
    Sequence *s = sequence_create(id, prompt, n, &p); /* copies prompt and stop ids */
    s->arrival = id;
    /* unseeded requests: distinct seeds from the engine's counter (sequence_seed_rng mixes them
     * with splitmix64, so consecutive values give unrelated streams) */
    sequence_seed_rng(s, cp->seed >= 0 ? (uint64_t)cp->seed : e->rng++);
    DA_PUSH(e->seqs, e->num_ids, e->cap_ids, s);
    scheduler_add(e->sched, s);
    return id;
}

static Sequence *find_seq(const CvllmEngine *e, int64_t id) {
    return id >= 0 && id < e->num_ids ? e->seqs[id] : NULL;
}

int cvllm_engine_finish_request(CvllmEngine *e, int64_t id, CvllmFinishReason reason) {
    Sequence *s = find_seq(e, id);
    if (!s) return cvllm_errorf(CVLLM_EINVAL, "unknown request %lld", (long long)id);
    if (s->status != SEQ_FINISHED) {
        scheduler_remove(e->sched, s);
        s->status = SEQ_FINISHED;
        s->finish_reason = reason;
    }
    return 0;
}

int cvllm_engine_abort_request(CvllmEngine *e, int64_t id) {
    return cvllm_engine_finish_request(e, id, CVLLM_FINISH_ABORT);
}

int cvllm_engine_has_unfinished(const CvllmEngine *e) { return !scheduler_is_finished(e->sched); }

int cvllm_engine_step(CvllmEngine *e) {
    Sequence **batch = NULL, *refused = NULL;
    int n = 0, is_prefill = 0, rc;
    while ((rc = scheduler_schedule(e->sched, &batch, &n, &is_prefill, &refused)) == CVLLM_ENOMEM)
        ; /* the refused sequence is finished (aborted); requests are validated at add time so
             this only happens if the cache shrank below a request's need */
    if (rc < 0) return rc;
    if (n == 0) return 0;
    if (is_prefill)
        for (int i = 0; i < n; i++) e->prompt_tokens_computed += batch[i]->num_scheduled_tokens;
    rc = model_runner_run(e->runner, batch, n, is_prefill, e->step_tokens);
    if (rc < 0) return rc;
    scheduler_postprocess(e->sched, batch, n, e->step_tokens);
    int generated = 0;
    for (int i = 0; i < n; i++) generated += e->step_tokens[i] >= 0;
    e->generated_tokens += generated;
    int used = e->num_blocks - block_manager_num_free(e->bm);
    if (used > e->peak_blocks_used) e->peak_blocks_used = used;
    return generated;
}

int cvllm_engine_peek(const CvllmEngine *e, int64_t id, const int32_t **ids, int *n,
                      CvllmFinishReason *finish) {
    Sequence *s = find_seq(e, id);
    if (!s) return cvllm_errorf(CVLLM_EINVAL, "unknown request %lld", (long long)id);
    *ids = s->token_ids + s->num_prompt_tokens;
    *n = s->num_tokens - s->num_prompt_tokens;
    if (finish) *finish = s->status == SEQ_FINISHED ? s->finish_reason : CVLLM_FINISH_NONE;
    return 0;
}

int cvllm_engine_take_output(CvllmEngine *e, int64_t id, CvllmOutput *out) {
    Sequence *s = find_seq(e, id);
    if (!s) return cvllm_errorf(CVLLM_EINVAL, "unknown request %lld", (long long)id);
    if (s->status != SEQ_FINISHED) return 0;
    out->request_id = id;
    out->num_prompt_tokens = s->num_prompt_tokens;
    out->prompt_token_ids = xmalloc((size_t)s->num_prompt_tokens * sizeof(int32_t));
    memcpy(out->prompt_token_ids, s->token_ids, (size_t)s->num_prompt_tokens * sizeof(int32_t));
    out->num_tokens = s->num_tokens - s->num_prompt_tokens;
    out->token_ids = xmalloc((size_t)(out->num_tokens ? out->num_tokens : 1) * sizeof(int32_t));
    memcpy(out->token_ids, s->token_ids + s->num_prompt_tokens, (size_t)out->num_tokens * sizeof(int32_t));
    out->finish_reason = s->finish_reason;
    out->num_cached_tokens = s->num_prefix_cached;
    sequence_destroy(s);
    e->seqs[id] = NULL;
    return 1;
}

void cvllm_output_free(CvllmOutput *o) {
    if (!o) return;
    free(o->prompt_token_ids);
    free(o->token_ids);
    o->prompt_token_ids = o->token_ids = NULL;
}

int cvllm_generate(CvllmEngine *e, int n, const int32_t *const *prompts, const int *lens,
                   const CvllmSamplingParams *params, CvllmOutput *outs, char **errors) {
    int64_t *ids = xmalloc((size_t)(n ? n : 1) * sizeof(int64_t));
    for (int i = 0; i < n; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        if (errors) errors[i] = NULL;
        ids[i] = cvllm_engine_add_request(e, prompts[i], lens[i], params ? &params[i] : NULL);
        if (ids[i] < 0) {
            outs[i].request_id = ids[i];
            if (errors) errors[i] = xstrdup(cvllm_last_error());
        }
    }
    int rc = 0;
    while (cvllm_engine_has_unfinished(e))
        if ((rc = cvllm_engine_step(e)) < 0) break;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && cvllm_engine_take_output(e, ids[i], &outs[i]) != 1 && rc == 0)
            rc = cvllm_errorf(CVLLM_EINVAL, "request %lld did not finish", (long long)ids[i]);
    free(ids);
    return rc < 0 ? rc : 0;
}

void cvllm_engine_get_stats(const CvllmEngine *e, CvllmStats *s) {
    memset(s, 0, sizeof *s);
    s->num_running = scheduler_num_running(e->sched);
    s->num_waiting = scheduler_num_waiting(e->sched);
    s->num_kv_blocks = e->num_blocks;
    s->kv_blocks_free = block_manager_num_free(e->bm);
    s->kv_blocks_used = e->num_blocks - s->kv_blocks_free;
    s->peak_kv_blocks_used = e->peak_blocks_used;
    s->prefix_cache_queries = block_manager_queries(e->bm);
    s->prefix_cache_hits = block_manager_hits(e->bm);
    s->num_preemptions = scheduler_num_preemptions(e->sched);
    s->prompt_tokens_computed = e->prompt_tokens_computed;
    s->generated_tokens = e->generated_tokens;
}

int cvllm_engine_vocab_size(const CvllmEngine *e) { return e->cfg.vocab_size; }
int cvllm_engine_max_model_len(const CvllmEngine *e) { return e->max_model_len; }
const char *cvllm_engine_device_name(const CvllmEngine *e) { return e->backend->name; }

static void forward_logits_hook(void *ctx, const Sequence *seq, const float *logits, int vocab) {
    CvllmEngine *e = ctx;
    e->logits_fn(e->logits_ctx, seq->id, logits, vocab);
}

void engine_set_logits_hook(CvllmEngine *e, EngineLogitsFn fn, void *ctx) {
    e->logits_fn = fn;
    e->logits_ctx = ctx;
    model_runner_set_logits_hook(e->runner, fn ? forward_logits_hook : NULL, e);
}
