/* test_engine.c: the whole engine on the CPU over small seeded models (cvllm mkmodel presets):
 * batching, preemption, chunked prefill and prefix caching must not change greedy outputs; seeded
 * sampling does not depend on the batch; bad requests are refused alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "common.h"
#include "cvllm.h"
#include "engine/engine_internal.h"

static char g_model[256];

static int make_model(void **state) {
    (void)state;
    snprintf(g_model, sizeof g_model, "%s/test_engine_model_%d",
             getenv("CVLLM_BUILD_DIR") ? getenv("CVLLM_BUILD_DIR") : "/tmp", (int)getpid());
    const char *bin = getenv("CVLLM_BIN") ? getenv("CVLLM_BIN") : "build/cvllm";
    char cmd[600];
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --preset test-qwen3 --seed 3 '%s' >/dev/null", bin,
             g_model);
    return system(cmd) == 0 ? 0 : -1;
}

static int remove_model(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_model);
    return system(cmd) == 0 ? 0 : -1;
}

static int g_max_model_len = 256;
static int g_async = -1; /* CvllmEngineOptions.async_scheduling of engine() */

static CvllmEngine *engine(int max_num_batched_tokens, int64_t kv_bytes, int prefix_caching,
                           int block_size) {
    CvllmEngineOptions o;
    cvllm_engine_options_default(&o);
    o.device = CVLLM_DEVICE_CPU;
    o.max_model_len = g_max_model_len;
    o.max_num_seqs = 16;
    o.verbose = 0;
    o.num_threads = 2;
    if (max_num_batched_tokens) o.max_num_batched_tokens = max_num_batched_tokens;
    if (kv_bytes) o.kv_cache_memory = kv_bytes;
    if (block_size) o.block_size = block_size;
    o.enable_prefix_caching = prefix_caching;
    o.async_scheduling = g_async;
    CvllmEngine *e = NULL;
    int rc = cvllm_engine_create(g_model, &o, &e);
    if (rc < 0) fprintf(stderr, "engine: %s\n", cvllm_last_error());
    assert_int_equal(rc, 0);
    return e;
}

#define NP 5
static const int LENS[NP] = {3, 17, 40, 70, 33};
static int32_t g_prompts[NP][128];

static void fill_prompts(void) {
    uint32_t x = 12345;
    for (int i = 0; i < NP; i++)
        for (int j = 0; j < 128; j++) {
            x = x * 1103515245u + 12345u;
            g_prompts[i][j] = (int32_t)((x >> 8) % 500);
        }
}

static CvllmSamplingParams greedy(int max_tokens) {
    CvllmSamplingParams p;
    cvllm_sampling_params_default(&p);
    p.temperature = 0;
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    return p;
}

/* Runs the NP prompts together; outs must be freed. */
static void run_all(CvllmEngine *e, const CvllmSamplingParams *p, CvllmOutput *outs) {
    const int32_t *ptrs[NP];
    CvllmSamplingParams ps[NP];
    for (int i = 0; i < NP; i++) ptrs[i] = g_prompts[i], ps[i] = *p;
    assert_int_equal(cvllm_generate(e, NP, ptrs, LENS, ps, outs), 0);
    for (int i = 0; i < NP; i++) assert_true(outs[i].request_id >= 0);
}

static void assert_same_tokens(const CvllmOutput *a, const CvllmOutput *b, int n) {
    for (int i = 0; i < n; i++) {
        assert_int_equal(a[i].num_tokens, b[i].num_tokens);
        for (int k = 0; k < a[i].num_tokens; k++) {
            if (a[i].token_ids[k] != b[i].token_ids[k])
                fprintf(stderr, "request %d differs at token %d: %d vs %d\n", i, k,
                        a[i].token_ids[k], b[i].token_ids[k]);
            assert_int_equal(a[i].token_ids[k], b[i].token_ids[k]);
        }
    }
}

static void free_outs(CvllmOutput *o, int n) {
    for (int i = 0; i < n; i++) cvllm_output_free(&o[i]);
}

static void test_batch_equals_alone(void **state) {
    (void)state;
    CvllmSamplingParams p = greedy(24);
    CvllmEngine *e = engine(0, 0, 1, 0);
    CvllmOutput batch[NP], alone[NP];
    run_all(e, &p, batch);
    for (int i = 0; i < NP; i++) {
        const int32_t *ptr = g_prompts[i];
        assert_int_equal(cvllm_generate(e, 1, &ptr, &LENS[i], &p, &alone[i]), 0);
        assert_int_equal(alone[i].num_tokens, 24);
        assert_int_equal(alone[i].finish_reason, CVLLM_FINISH_LENGTH);
    }
    assert_same_tokens(batch, alone, NP);
    free_outs(batch, NP);
    free_outs(alone, NP);
    cvllm_engine_destroy(e);
}

static void test_preemption_same_tokens(void **state) {
    (void)state;
    CvllmSamplingParams p = greedy(40);
    CvllmEngine *big = engine(0, 0, 1, 0);
    CvllmOutput ref[NP], got[NP];
    run_all(big, &p, ref);
    cvllm_engine_destroy(big);
    /* test-qwen3: 2 layers x 2 kv heads x head_dim 24 x f32 x (k,v) = 768 bytes a token; 16-token
     * blocks = 12 KiB; 10 blocks (160 tokens) cannot hold all five sequences at once. */
    g_max_model_len = 128;
    CvllmEngine *small = engine(0, 10 * 12288, 1, 0);
    g_max_model_len = 256;
    run_all(small, &p, got);
    CvllmStats st;
    cvllm_engine_get_stats(small, &st);
    assert_int_equal(st.num_kv_blocks, 10);
    assert_true(st.num_preemptions > 0);
    assert_same_tokens(ref, got, NP);
    free_outs(ref, NP);
    free_outs(got, NP);
    cvllm_engine_destroy(small);
}

/* Greedy outputs of the NP prompts from two engines are identical; destroys both. */
static void assert_engines_agree(CvllmEngine *a, CvllmEngine *b, int max_tokens) {
    CvllmSamplingParams p = greedy(max_tokens);
    CvllmOutput ref[NP], got[NP];
    run_all(a, &p, ref);
    run_all(b, &p, got);
    assert_same_tokens(ref, got, NP);
    free_outs(ref, NP);
    free_outs(got, NP);
    cvllm_engine_destroy(a);
    cvllm_engine_destroy(b);
}

static void test_chunked_prefill_same_tokens(void **state) {
    (void)state;
    assert_engines_agree(engine(0, 0, 1, 0), engine(7, 0, 1, 0), 16);
}

static void test_block_size_same_tokens(void **state) {
    (void)state;
    assert_engines_agree(engine(0, 0, 1, 16), engine(0, 0, 1, 64), 16);
}

/* Two requests share a 48-token prefix (3 blocks of 16); the second is sent after the first
 * finished. With prefix caching the second is served 48 cached tokens; outputs are identical
 * with caching on and off. An identical prompt hits every full block but its last token is
 * recomputed. */
static void prefix_run(int caching, CvllmOutput out[3]) {
    CvllmEngine *e = engine(0, 0, caching, 16);
    int32_t a[60], b[60];
    for (int i = 0; i < 60; i++) a[i] = b[i] = g_prompts[3][i];
    for (int i = 48; i < 60; i++) b[i] = (b[i] + 7) % 500;
    CvllmSamplingParams p = greedy(12);
    const int32_t *pa = a, *pb = b;
    int n60 = 60, n48 = 48;
    assert_int_equal(cvllm_generate(e, 1, &pa, &n60, &p, &out[0]), 0);
    assert_int_equal(cvllm_generate(e, 1, &pb, &n60, &p, &out[1]), 0);
    assert_int_equal(cvllm_generate(e, 1, &pa, &n48, &p, &out[2]), 0);
    CvllmStats st;
    cvllm_engine_get_stats(e, &st);
    if (caching) assert_true(st.prefix_cache_hits > 0);
    else assert_int_equal(st.prefix_cache_hits, 0);
    cvllm_engine_destroy(e);
}

static void test_prefix_caching_on_off(void **state) {
    (void)state;
    CvllmOutput on[3], off[3];
    prefix_run(1, on);
    prefix_run(0, off);
    assert_same_tokens(on, off, 3);
    assert_int_equal(on[0].num_cached_tokens, 0);
    assert_int_equal(on[1].num_cached_tokens, 48);
    assert_int_equal(on[2].num_cached_tokens, 47); /* all 3 blocks hit; last token recomputed */
    for (int i = 0; i < 3; i++) assert_int_equal(off[i].num_cached_tokens, 0);
    free_outs(on, 3);
    free_outs(off, 3);
}

static void test_seeded_sampling_independent_of_batch(void **state) {
    (void)state;
    CvllmSamplingParams p;
    cvllm_sampling_params_default(&p);
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.top_k = 50;
    p.seed = 1234;
    p.max_tokens = 20;
    p.ignore_eos = 1;
    CvllmEngine *e = engine(0, 0, 1, 0);
    CvllmOutput alone, batch[NP];
    const int32_t *ptr = g_prompts[2];
    assert_int_equal(cvllm_generate(e, 1, &ptr, &LENS[2], &p, &alone), 0);
    run_all(e, &p, batch);
    assert_same_tokens(&alone, &batch[2], 1);
    /* another seed gives another stream */
    CvllmOutput other;
    p.seed = 99;
    assert_int_equal(cvllm_generate(e, 1, &ptr, &LENS[2], &p, &other), 0);
    int differ = 0;
    for (int k = 0; k < other.num_tokens; k++) differ |= other.token_ids[k] != alone.token_ids[k];
    assert_true(differ);
    cvllm_output_free(&alone);
    cvllm_output_free(&other);
    free_outs(batch, NP);
    cvllm_engine_destroy(e);
}

static void test_stop_token_ids(void **state) {
    (void)state;
    CvllmEngine *e = engine(0, 0, 1, 0);
    CvllmSamplingParams p = greedy(10);
    CvllmOutput ref, got;
    const int32_t *ptr = g_prompts[1];
    assert_int_equal(cvllm_generate(e, 1, &ptr, &LENS[1], &p, &ref), 0);
    int32_t stop = ref.token_ids[3];
    p.stop_token_ids = &stop;
    p.num_stop_token_ids = 1;
    assert_int_equal(cvllm_generate(e, 1, &ptr, &LENS[1], &p, &got), 0);
    int first = 0;
    while (ref.token_ids[first] != stop) first++;
    assert_int_equal(got.num_tokens, first + 1);
    assert_int_equal(got.finish_reason, CVLLM_FINISH_STOP);
    cvllm_output_free(&ref);
    cvllm_output_free(&got);
    cvllm_engine_destroy(e);
}

/* A burst of requests with one system prompt, scheduled in one step: the first computes the
 * common 480-token prefix, the six others find its blocks in that same step, and every output is
 * the same as with prefix caching off. */
static void test_burst_shares_prefix_in_one_step(void **state) {
    (void)state;
    int saved = g_max_model_len;
    g_max_model_len = 512;
    int32_t p[7][490];
    uint32_t x = 99;
    for (int k = 0; k < 480; k++) {
        x = x * 1103515245u + 12345u;
        for (int i = 0; i < 7; i++) p[i][k] = (int32_t)((x >> 8) % 500);
    }
    for (int i = 0; i < 7; i++)
        for (int k = 480; k < 490; k++) p[i][k] = (int32_t)((k * 31 + i * 7) % 500);
    const int32_t *ptrs[7];
    int lens[7];
    CvllmSamplingParams ps[7];
    for (int i = 0; i < 7; i++) ptrs[i] = p[i], lens[i] = 490, ps[i] = greedy(6);
    CvllmOutput on[7], off[7];
    CvllmEngine *e = engine(0, 0, 1, 0);
    assert_int_equal(cvllm_generate(e, 7, ptrs, lens, ps, on), 0);
    CvllmStats st;
    cvllm_engine_get_stats(e, &st);
    cvllm_engine_destroy(e);
    e = engine(0, 0, 0, 0);
    assert_int_equal(cvllm_generate(e, 7, ptrs, lens, ps, off), 0);
    cvllm_engine_destroy(e);
    assert_int_equal(on[0].num_cached_tokens, 0);
    for (int i = 1; i < 7; i++) assert_int_equal(on[i].num_cached_tokens, 480);
    assert_int_equal(st.prefix_cache_hits, 6 * 480);
    assert_same_tokens(on, off, 7);
    free_outs(on, 7);
    free_outs(off, 7);
    g_max_model_len = saved;
}

static void test_bad_requests_refused_alone(void **state) {
    (void)state;
    CvllmEngine *e = engine(0, 64 * 12288, 1, 0); /* 64 blocks = 1024 tokens */
    int32_t bad_id[3] = {1, 512, 3}; /* vocab is 512 */
    int32_t long_prompt[300] = {0};
    const int32_t *prompts[5] = {g_prompts[0], bad_id, long_prompt, g_prompts[1], g_prompts[1]};
    int lens[5] = {LENS[0], 3, 300, LENS[1], LENS[1]};
    CvllmSamplingParams ps[5];
    for (int i = 0; i < 5; i++) ps[i] = greedy(8);
    ps[4].max_tokens = 250; /* 17 + 250 > max_model_len 256 */
    CvllmOutput outs[5];
    assert_int_equal(cvllm_generate(e, 5, prompts, lens, ps, outs), 0);
    assert_true(outs[0].request_id >= 0 && outs[3].request_id >= 0);
    assert_int_equal(outs[0].num_tokens, 8);
    assert_int_equal(outs[3].num_tokens, 8);
    assert_true(outs[1].request_id < 0 && strstr(outs[1].error, "vocabulary"));
    assert_true(outs[2].request_id < 0 && strstr(outs[2].error, "max_model_len"));
    assert_true(outs[4].request_id < 0 && strstr(outs[4].error, "max_tokens"));
    for (int i = 0; i < 5; i++) cvllm_output_free(&outs[i]);
    /* empty prompt, negative max_tokens, bad sampling values */
    CvllmSamplingParams p = greedy(4);
    assert_true(cvllm_engine_add_request(e, g_prompts[0], 0, &p) < 0);
    p.max_tokens = 0;
    assert_true(cvllm_engine_add_request(e, g_prompts[0], 3, &p) < 0);
    p = greedy(4);
    p.top_p = 0;
    assert_true(cvllm_engine_add_request(e, g_prompts[0], 3, &p) < 0);
    p = greedy(4);
    p.temperature = -1;
    assert_true(cvllm_engine_add_request(e, g_prompts[0], 3, &p) < 0);
    assert_false(cvllm_engine_has_unfinished(e));
    cvllm_engine_destroy(e);
}

/* A backend that can run no more steps (a tensor-parallel rank lost, here a stub forward that
 * says so): the requests of the step and every other live one end with its error, new ones are
 * refused with it, and cvllm_engine_run returns an error at once. */
static int broken_forward(Backend *b, const StepInputs *in, StepOutputs *out) {
    (void)in, (void)out;
    b->broken = 1;
    return cvllm_errorf(CVLLM_EBACKEND, "tensor parallelism: rank 1 is gone (test)");
}

static void test_broken_backend_stops_engine(void **state) {
    (void)state;
    CvllmEngine *e = engine(0, 0, 1, 0);
    CvllmSamplingParams p = greedy(8);
    int64_t ids[4];
    for (int i = 0; i < 3; i++) ids[i] = cvllm_engine_add_request(e, g_prompts[i], LENS[i], &p);
    const CvllmRequestOutput *outs;
    int n;
    assert_true(cvllm_engine_step(e, &outs, &n) >= 0); /* the three prefills run */
    ids[3] = cvllm_engine_add_request(e, g_prompts[3], LENS[3], &p); /* waiting: the next batch */
    Backend *b = engine_backend(e);
    int (*saved)(Backend *, const StepInputs *, StepOutputs *) = b->forward;
    b->forward = broken_forward;
    assert_true(cvllm_engine_step(e, &outs, &n) < 0);
    int errors = 0;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < 4; i++)
            if (outs[k].request_id == ids[i] && outs[k].finish_reason == CVLLM_FINISH_ERROR &&
                outs[k].error && strstr(outs[k].error, "rank 1 is gone"))
                errors++;
    assert_int_equal(errors, 4); /* the one in the failed batch and the three not in it */
    assert_true(cvllm_engine_add_request(e, g_prompts[0], LENS[0], &p) < 0);
    assert_non_null(strstr(cvllm_last_error(), "rank 1 is gone"));
    assert_true(cvllm_engine_run(e) < 0);
    assert_non_null(strstr(cvllm_last_error(), "rank 1 is gone"));
    b->forward = saved;
    cvllm_engine_destroy(e);
}

/* A process started as a tensor-parallel rank whose main did not hand over to
 * cvllm_worker_main() must not create an engine (it would start ranks of its own, and so on). */
static void test_rank_process_creates_no_engine(void **state) {
    (void)state;
    setenv("CVLLM_TP_WORKER", "127.0.0.1:1 1 1", 1);
    CvllmEngineOptions o;
    cvllm_engine_options_default(&o);
    o.device = CVLLM_DEVICE_CPU;
    o.verbose = 0;
    CvllmEngine *e = NULL;
    int rc = cvllm_engine_create(g_model, &o, &e);
    unsetenv("CVLLM_TP_WORKER");
    assert_true(rc < 0 && e == NULL);
    assert_non_null(strstr(cvllm_last_error(), "cvllm_worker_main"));
}

static void test_kv_budget_too_small(void **state) {
    (void)state;
    CvllmEngineOptions o;
    cvllm_engine_options_default(&o);
    o.device = CVLLM_DEVICE_CPU;
    o.verbose = 0;
    o.max_model_len = 128;
    o.kv_cache_memory = 1000; /* less than one block */
    CvllmEngine *e = NULL;
    assert_int_equal(cvllm_engine_create(g_model, &o, &e), CVLLM_ENOMEM);
    assert_null(e);
    assert_non_null(strstr(cvllm_last_error(), "kv-cache-memory"));
    /* a budget of 4 blocks (64 tokens) with max_model_len 128 explicitly asked: refused */
    o.kv_cache_memory = 4 * 12288;
    assert_int_equal(cvllm_engine_create(g_model, &o, &e), CVLLM_ENOMEM);
    /* without an explicit max_model_len it is lowered to fit, and a request that needs more
     * blocks than exist is refused with a clear error */
    o.max_model_len = 0;
    assert_int_equal(cvllm_engine_create(g_model, &o, &e), 0);
    assert_int_equal(cvllm_engine_max_model_len(e), 64);
    CvllmSamplingParams p = greedy(40);
    assert_true(cvllm_engine_add_request(e, g_prompts[3], 40, &p) < 0);
    cvllm_engine_destroy(e);
}

static void test_create_errors(void **state) {
    (void)state;
    CvllmEngine *e = NULL;
    CvllmEngineOptions o;
    cvllm_engine_options_default(&o);
    o.verbose = 0;
    assert_true(cvllm_engine_create("/nonexistent/model", &o, &e) < 0);
    assert_null(e);
    assert_non_null(strstr(cvllm_last_error(), "/nonexistent/model"));
    o.block_size = 24;
    assert_int_equal(cvllm_engine_create(g_model, &o, &e), CVLLM_EINVAL);
    o.block_size = 16;
    o.device = CVLLM_DEVICE_CUDA;
    if (!strstr(cvllm_backends(), "cuda")) {
        assert_int_equal(cvllm_engine_create(g_model, &o, &e), CVLLM_EBACKEND);
        assert_non_null(strstr(cvllm_last_error(), "CUDA"));
    }
}


/* ---------------------------------------------------------------------------------------------
 * Asynchronous scheduling (CvllmEngineOptions.async_scheduling): the next step is scheduled and
 * submitted before this one's tokens are known. Over the CPU backend (which has no submit: each
 * step runs at once) the engine's bookkeeping is the same as on a GPU, so every test above must
 * give the same results with it on. */

static void test_async_same_results(void **state) {
    g_async = 1;
    test_batch_equals_alone(state);
    test_preemption_same_tokens(state);
    test_chunked_prefill_same_tokens(state);
    test_block_size_same_tokens(state);
    test_prefix_caching_on_off(state);
    test_seeded_sampling_independent_of_batch(state);
    test_stop_token_ids(state);
    test_burst_shares_prefix_in_one_step(state);
    test_bad_requests_refused_alone(state);
    test_broken_backend_stops_engine(state);
    g_async = -1;
}

/* A mixed batch: stop ids that end requests at different steps, several max_tokens, log-probs,
 * seeded sampling, one request with a repetition penalty (its steps run one at a time) and one
 * aborted midway; async (a) against sync (s), request by request. */
#define NM 7
typedef struct {
    int num_tokens, finish_reason;
    int32_t ids[64];
    float lp[64]; /* the sampled tokens' log-probs (requests that ask) */
} MixedOut;

static void mixed_run(int async, MixedOut out[NM], const int32_t stops[NM]) {
    g_async = async;
    CvllmEngine *e = engine(0, 0, 1, 0);
    g_async = -1;
    CvllmSamplingParams ps[NM];
    int64_t ids[NM];
    memset(out, 0, NM * sizeof *out);
    for (int i = 0; i < NM; i++) {
        ps[i] = greedy(6 + 5 * i);
        ps[i].stop_token_ids = &stops[i];
        ps[i].num_stop_token_ids = stops[i] >= 0;
    }
    ps[1].logprobs = 3;
    ps[2].temperature = 0.8f, ps[2].seed = 7, ps[2].logprobs = 0;
    ps[4].repetition_penalty = 1.3f;
    for (int i = 0; i < NM; i++) {
        ids[i] = cvllm_engine_add_request(e, g_prompts[i % NP], LENS[i % NP], &ps[i]);
        assert_true(ids[i] >= 0);
    }
    int steps = 0;
    while (cvllm_engine_has_unfinished(e)) {
        const CvllmRequestOutput *o;
        int n;
        assert_true(cvllm_engine_step(e, &o, &n) >= 0);
        if (++steps == 6) cvllm_engine_abort_request(e, ids[6]);
        for (int k = 0; k < n; k++) {
            int i = 0;
            while (ids[i] != o[k].request_id) i++;
            MixedOut *m = &out[i];
            assert_true(o[k].num_tokens >= m->num_tokens && o[k].num_tokens <= 64);
            assert_int_equal(m->finish_reason, CVLLM_FINISH_NONE); /* one last output */
            m->num_tokens = o[k].num_tokens;
            memcpy(m->ids, o[k].token_ids, (size_t)o[k].num_tokens * sizeof(int32_t));
            if (o[k].logprobs)
                memcpy(m->lp, o[k].logprobs, (size_t)o[k].num_tokens * sizeof(float));
            m->finish_reason = o[k].finish_reason;
        }
    }
    CvllmStats st;
    cvllm_engine_get_stats(e, &st);
    int64_t total = 0;
    for (int i = 0; i < NM; i++) total += out[i].num_tokens;
    assert_true(st.generated_tokens >= total); /* an aborted request's last may go unreported */
    assert_true(st.generated_tokens <= total + 1);
    cvllm_engine_destroy(e);
}

static void test_async_mixed_requests(void **state) {
    (void)state;
    const int32_t none[NM] = {-1, -1, -1, -1, -1, -1, -1};
    MixedOut ref[NM], s[NM], a[NM];
    mixed_run(-1, ref, none);
    int32_t stops[NM];
    for (int i = 0; i < NM; i++) /* a stop id seen at token 2 + i % 4 */
        stops[i] = ref[i].num_tokens > 2 + i % 4 ? ref[i].ids[2 + i % 4] : -1;
    stops[3] = stops[6] = -1; /* 6: aborted before its max_tokens */
    mixed_run(-1, s, stops);
    mixed_run(1, a, stops);
    int stopped = 0;
    for (int i = 0; i < NM; i++) {
        assert_int_equal(s[i].finish_reason, a[i].finish_reason);
        stopped += s[i].finish_reason == CVLLM_FINISH_STOP;
        if (i == 6) { /* aborted after the same step count: what it had, maybe a token apart */
            assert_int_equal(a[i].finish_reason, CVLLM_FINISH_ABORT);
            assert_true(abs(a[i].num_tokens - s[i].num_tokens) <= 1);
            for (int k = 0; k < a[i].num_tokens && k < s[i].num_tokens; k++)
                assert_int_equal(a[i].ids[k], s[i].ids[k]);
            continue;
        }
        assert_int_equal(s[i].num_tokens, a[i].num_tokens);
        assert_memory_equal(s[i].ids, a[i].ids, (size_t)s[i].num_tokens * sizeof(int32_t));
        assert_memory_equal(s[i].lp, a[i].lp, (size_t)s[i].num_tokens * sizeof(float));
    }
    assert_true(stopped >= 3);
}

/* The backend's side of asynchronous scheduling, by a stub with submit and collect around the
 * CPU forward: the engine turns it on by itself, submits a step before it collects the one
 * before, and hands each pending token as input_rows = the row the step before sampled it in
 * (checked here against which sequence that row was). */
static struct {
    int (*forward)(Backend *, const StepInputs *, StepOutputs *);
    int32_t *ids;                 /* [tokens] */
    int32_t prev_ids[32];         /* the last submitted step's sampled ids */
    int32_t prev_seq_len[32];     /* its rows' context lengths */
    int prev_n;
    int32_t out_ids[2][32];
    float out_lp[2][32];
    int32_t out_top[2][32 * CVLLM_MAX_LOGPROBS];
    float out_tlp[2][32 * CVLLM_MAX_LOGPROBS];
    int out_n[2], head, count;
    int submits, overlapped, rows_seen;
} g_stub;

static int stub_submit(Backend *b, const StepInputs *in) {
    assert_true(g_stub.count < 2);
    if (g_stub.count == 1) g_stub.overlapped++;
    StepInputs r = *in;
    memcpy(g_stub.ids, in->input_ids, (size_t)in->num_tokens * sizeof(int32_t));
    for (int s = 0; in->input_rows && s < in->num_seqs; s++)
        for (int t = in->cu_seqlens_q[s]; t < in->cu_seqlens_q[s + 1]; t++) {
            const int row = in->input_rows[t];
            if (row < 0) continue;
            assert_true(row < g_stub.prev_n);
            assert_int_equal(in->input_ids[t], 0);
            /* the token at position p was sampled by a row whose context ended at p */
            assert_int_equal(g_stub.prev_seq_len[row], in->positions[t]);
            g_stub.ids[t] = g_stub.prev_ids[row];
            g_stub.rows_seen++;
        }
    r.input_ids = g_stub.ids;
    r.input_rows = NULL;
    const int k = (g_stub.head + g_stub.count) % 2;
    StepOutputs o = {.token_ids = g_stub.out_ids[k],
                     .logprobs = g_stub.out_lp[k],
                     .top_ids = g_stub.out_top[k],
                     .top_logprobs = g_stub.out_tlp[k]};
    int rc = g_stub.forward(b, &r, &o);
    if (rc < 0) return rc;
    for (int i = 0; i < in->num_logits; i++) {
        g_stub.prev_ids[i] = g_stub.out_ids[k][i];
        int t = in->logits_indices[i], s = 0;
        while (in->cu_seqlens_q[s + 1] <= t) s++;
        g_stub.prev_seq_len[i] = in->context_lens[s];
    }
    g_stub.prev_n = in->num_logits;
    g_stub.out_n[k] = in->num_logits;
    g_stub.count++;
    g_stub.submits++;
    return 0;
}

static int stub_collect(Backend *b, StepOutputs *out) {
    (void)b;
    assert_true(g_stub.count > 0);
    const int k = g_stub.head, n = g_stub.out_n[k];
    g_stub.head = (g_stub.head + 1) % 2;
    g_stub.count--;
    memcpy(out->token_ids, g_stub.out_ids[k], (size_t)n * sizeof(int32_t));
    memcpy(out->logprobs, g_stub.out_lp[k], (size_t)n * sizeof(float));
    memcpy(out->top_ids, g_stub.out_top[k], (size_t)n * CVLLM_MAX_LOGPROBS * sizeof(int32_t));
    memcpy(out->top_logprobs, g_stub.out_tlp[k], (size_t)n * CVLLM_MAX_LOGPROBS * sizeof(float));
    return 0;
}

static void test_async_backend_contract(void **state) {
    (void)state;
    CvllmSamplingParams p = greedy(20);
    CvllmOutput ref[NP], got[NP];
    CvllmEngine *e = engine(0, 0, 1, 0);
    run_all(e, &p, ref);
    Backend *b = engine_backend(e);
    memset(&g_stub, 0, sizeof g_stub);
    g_stub.forward = b->forward;
    g_stub.ids = xmalloc(4096 * sizeof(int32_t));
    b->submit = stub_submit;
    b->collect = stub_collect;
    run_all(e, &p, got); /* default async_scheduling (0) is still off: set at create */
    assert_int_equal(g_stub.overlapped, 0);
    assert_int_equal(g_stub.rows_seen, 0);
    cvllm_engine_destroy(e);
    assert_same_tokens(ref, got, NP);
    free_outs(got, NP);

    g_async = 0;
    e = engine(0, 0, 1, 0); /* a backend with submit at create: on */
    g_async = -1;
    b = engine_backend(e);
    g_stub.forward = b->forward;
    b->submit = stub_submit;
    b->collect = stub_collect;
    engine_refresh_async(e);
    int s0 = g_stub.submits;
    run_all(e, &p, got);
    assert_true(g_stub.submits > s0);
    assert_true(g_stub.overlapped >= 19); /* every decode step but the first */
    assert_true(g_stub.rows_seen >= 19 * NP);
    assert_int_equal(g_stub.count, 0);
    cvllm_engine_destroy(e);
    assert_same_tokens(ref, got, NP);
    free_outs(ref, NP);
    free_outs(got, NP);
    free(g_stub.ids);
}

int main(void) {
    fill_prompts();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_equals_alone),
        cmocka_unit_test(test_preemption_same_tokens),
        cmocka_unit_test(test_chunked_prefill_same_tokens),
        cmocka_unit_test(test_block_size_same_tokens),
        cmocka_unit_test(test_prefix_caching_on_off),
        cmocka_unit_test(test_seeded_sampling_independent_of_batch),
        cmocka_unit_test(test_stop_token_ids),
        cmocka_unit_test(test_burst_shares_prefix_in_one_step),
        cmocka_unit_test(test_bad_requests_refused_alone),
        cmocka_unit_test(test_broken_backend_stops_engine),
        cmocka_unit_test(test_rank_process_creates_no_engine),
        cmocka_unit_test(test_kv_budget_too_small),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_async_same_results),
        cmocka_unit_test(test_async_mixed_requests),
        cmocka_unit_test(test_async_backend_contract),
    };
    return cmocka_run_group_tests(tests, make_model, remove_model);
}
