/* test_cpu_forward.c: the CPU backend's whole forward pass on tiny random models built in memory
 * (Qwen3 with q/k norms and heads*head_dim != hidden; Qwen2 with q/k/v biases and MQA; Llama with
 * llama3 rope and f16 weights). Checks that the paged KV cache is used right:
 *   - prefill + decode steps == one prefill of the whole sequence
 *   - two sequences in one step == each alone
 *   - a prefill in two chunks (the second attends to the cached first) == unchunked
 *   - slot -1 tokens are not written, and their cached K/V is what attention reads
 *   - 1 thread == 2 threads; a step run in slices of 3 tokens == in one piece
 *   - all of it == a naive dense forward written here in double (no cache), to 1e-5 of the
 *     largest logit.
 * The kernels are batch-invariant (see ops.h), so the cache-path comparisons are bit-exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/ops.h"
#include "common.h"

/* ---------------------------------------------------------------- tiny random models */

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / (1ull << 23)) - 1.0);
}

static Tensor rand_tensor(DType dt, int64_t rows, int64_t cols, float scale, float offset) {
    int64_t n = rows * cols;
    void *p = xmalloc((size_t)n * dtype_size(dt));
    for (int64_t i = 0; i < n; i++) {
        float v = offset + scale * frand();
        if (dt == DTYPE_BF16) ((uint16_t *)p)[i] = f32_to_bf16(v);
        else if (dt == DTYPE_F16) ((uint16_t *)p)[i] = f32_to_f16(v);
        else ((float *)p)[i] = v;
    }
    return (Tensor){p, dt, rows, cols};
}

static double at(const Tensor *t, int64_t i) {
    if (!t->data) return 0.0;
    if (t->dtype == DTYPE_BF16) return bf16_to_f32(((const uint16_t *)t->data)[i]);
    if (t->dtype == DTYPE_F16) return f16_to_f32(((const uint16_t *)t->data)[i]);
    return ((const float *)t->data)[i];
}

typedef enum { TINY_QWEN3, TINY_QWEN2, TINY_LLAMA } TinyKind;

static void tiny_model(TinyKind kind, ModelConfig *cfg, ModelWeights *w) {
    memset(cfg, 0, sizeof *cfg);
    memset(w, 0, sizeof *w);
    DType dt = DTYPE_BF16;
    cfg->vocab_size = 97;
    cfg->hidden_size = 48;
    cfg->intermediate_size = 80;
    cfg->num_hidden_layers = 2;
    cfg->rms_norm_eps = 1e-6f;
    cfg->rope_theta = 10000.0;
    cfg->rope_type = ROPE_DEFAULT;
    if (kind == TINY_QWEN3) {
        cfg->arch = ARCH_QWEN3;
        cfg->num_attention_heads = 4, cfg->num_key_value_heads = 2, cfg->head_dim = 16;
        cfg->qk_norm = 1;
        cfg->tie_word_embeddings = 1;
        cfg->rope_theta = 1000000.0;
    } else if (kind == TINY_QWEN2) {
        cfg->arch = ARCH_QWEN2;
        cfg->num_attention_heads = 4, cfg->num_key_value_heads = 1, cfg->head_dim = 12;
        cfg->attention_bias = 1;
        cfg->rms_norm_eps = 1e-5f;
        dt = DTYPE_F32;
    } else {
        cfg->arch = ARCH_LLAMA;
        cfg->num_attention_heads = 6, cfg->num_key_value_heads = 3, cfg->head_dim = 10;
        cfg->rope_type = ROPE_LLAMA3;
        cfg->rope_theta = 500000.0;
        cfg->rope_factor = 8.0;
        cfg->rope_low_freq_factor = 1.0;
        cfg->rope_high_freq_factor = 4.0;
        cfg->rope_original_max_position = 32;
        cfg->attention_bias = 1; /* Llama: q/k/v and o_proj biases */
        cfg->o_proj_bias = 1;
        dt = DTYPE_F16;
    }
    const int H = cfg->hidden_size, hd = cfg->head_dim, qd = cfg->num_attention_heads * hd,
              kvd = cfg->num_key_value_heads * hd, I = cfg->intermediate_size;
    w->embed_tokens = rand_tensor(dt, cfg->vocab_size, H, 1.0f, 0.0f);
    w->layers = xcalloc(cfg->num_hidden_layers, sizeof(LayerWeights));
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        LayerWeights *lw = &w->layers[l];
        lw->input_layernorm = rand_tensor(dt, 1, H, 0.2f, 1.0f);
        lw->post_attention_layernorm = rand_tensor(dt, 1, H, 0.2f, 1.0f);
        lw->q_proj = rand_tensor(dt, qd, H, 0.3f, 0.0f);
        lw->k_proj = rand_tensor(dt, kvd, H, 0.3f, 0.0f);
        lw->v_proj = rand_tensor(dt, kvd, H, 0.3f, 0.0f);
        lw->o_proj = rand_tensor(dt, H, qd, 0.2f, 0.0f);
        lw->gate_proj = rand_tensor(dt, I, H, 0.2f, 0.0f);
        lw->up_proj = rand_tensor(dt, I, H, 0.2f, 0.0f);
        lw->down_proj = rand_tensor(dt, H, I, 0.2f, 0.0f);
        if (cfg->qk_norm) {
            lw->q_norm = rand_tensor(dt, 1, hd, 0.2f, 1.0f);
            lw->k_norm = rand_tensor(dt, 1, hd, 0.2f, 1.0f);
        }
        if (cfg->attention_bias) {
            lw->q_bias = rand_tensor(dt, 1, qd, 0.5f, 0.0f);
            lw->k_bias = rand_tensor(dt, 1, kvd, 0.5f, 0.0f);
            lw->v_bias = rand_tensor(dt, 1, kvd, 0.5f, 0.0f);
        }
        if (cfg->o_proj_bias) lw->o_bias = rand_tensor(dt, 1, H, 0.5f, 0.0f);
    }
    w->norm = rand_tensor(dt, 1, H, 0.2f, 1.0f);
    w->lm_head = cfg->tie_word_embeddings ? w->embed_tokens
                                          : rand_tensor(dt, cfg->vocab_size, H, 0.5f, 0.0f);
}

static void tiny_free(const ModelConfig *cfg, ModelWeights *w) {
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        LayerWeights *lw = &w->layers[l];
        const Tensor *ts[] = {&lw->input_layernorm, &lw->post_attention_layernorm, &lw->q_proj,
                              &lw->k_proj, &lw->v_proj, &lw->o_proj, &lw->gate_proj, &lw->up_proj,
                              &lw->down_proj, &lw->q_norm, &lw->k_norm, &lw->q_bias, &lw->k_bias,
                              &lw->v_bias, &lw->o_bias};
        for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) free((void *)ts[i]->data);
    }
    free(w->layers);
    if (w->lm_head.data != w->embed_tokens.data) free((void *)w->lm_head.data);
    free((void *)w->embed_tokens.data);
    free((void *)w->norm.data);
}

/* ---------------------------------------------------------------- the naive dense forward */

static double ref_inv_freq(const ModelConfig *cfg, int d, int i) {
    double f = 1.0 / pow(cfg->rope_theta, 2.0 * i / d);
    if (cfg->rope_type == ROPE_LINEAR) return f / cfg->rope_factor;
    if (cfg->rope_type == ROPE_LLAMA3) {
        double wavelen = 2 * M_PI / f, old = cfg->rope_original_max_position;
        if (wavelen < old / cfg->rope_high_freq_factor) return f;
        if (wavelen > old / cfg->rope_low_freq_factor) return f / cfg->rope_factor;
        double s = (old / wavelen - cfg->rope_low_freq_factor) /
                   (cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
        return (1 - s) * f / cfg->rope_factor + s * f;
    }
    return f;
}

static void ref_rmsnorm(double *y, const double *x, const Tensor *w, int64_t woff, int n,
                        double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * at(w, woff + i);
}

/* y[n] = x . W[n] + b[n] */
static void ref_linear(double *y, const double *x, const Tensor *W, const Tensor *b) {
    for (int64_t n = 0; n < W->rows; n++) {
        double s = b->data ? at(b, n) : 0.0;
        for (int64_t k = 0; k < W->cols; k++) s += x[k] * at(W, n * W->cols + k);
        y[n] = s;
    }
}

static void ref_rope(double *v, int heads, int d, int pos, const ModelConfig *cfg) {
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < d / 2; i++) {
            double ang = pos * ref_inv_freq(cfg, d, i), a = v[h * d + i], b = v[h * d + i + d / 2];
            v[h * d + i] = a * cos(ang) - b * sin(ang);
            v[h * d + i + d / 2] = b * cos(ang) + a * sin(ang);
        }
}

/* logits [n, vocab] of every position of ids[0..n) */
static void naive_forward(const ModelConfig *cfg, const ModelWeights *w, const int32_t *ids, int n,
                          float *logits) {
    const int H = cfg->hidden_size, hd = cfg->head_dim, NH = cfg->num_attention_heads,
              KVH = cfg->num_key_value_heads, qd = NH * hd, kvd = KVH * hd,
              I = cfg->intermediate_size, V = cfg->vocab_size;
    double *x = xcalloc((size_t)n * H, sizeof(double)), *h = xmalloc(H * sizeof(double));
    double *q = xmalloc((size_t)n * qd * sizeof(double)), *k = xmalloc((size_t)n * kvd * sizeof(double)),
           *v = xmalloc((size_t)n * kvd * sizeof(double)), *att = xmalloc(qd * sizeof(double)),
           *o = xmalloc(H * sizeof(double)), *g = xmalloc(I * sizeof(double)),
           *u = xmalloc(I * sizeof(double)), *p = xmalloc(n * sizeof(double)),
           *lg = xmalloc(V * sizeof(double));
    for (int t = 0; t < n; t++)
        for (int i = 0; i < H; i++) x[t * H + i] = at(&w->embed_tokens, (int64_t)ids[t] * H + i);
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        const LayerWeights *lw = &w->layers[l];
        for (int t = 0; t < n; t++) {
            ref_rmsnorm(h, x + t * H, &lw->input_layernorm, 0, H, cfg->rms_norm_eps);
            ref_linear(q + t * qd, h, &lw->q_proj, &lw->q_bias);
            ref_linear(k + t * kvd, h, &lw->k_proj, &lw->k_bias);
            ref_linear(v + t * kvd, h, &lw->v_proj, &lw->v_bias);
            if (cfg->qk_norm) {
                for (int j = 0; j < NH; j++)
                    ref_rmsnorm(q + t * qd + j * hd, q + t * qd + j * hd, &lw->q_norm, 0, hd,
                                cfg->rms_norm_eps);
                for (int j = 0; j < KVH; j++)
                    ref_rmsnorm(k + t * kvd + j * hd, k + t * kvd + j * hd, &lw->k_norm, 0, hd,
                                cfg->rms_norm_eps);
            }
            ref_rope(q + t * qd, NH, hd, t, cfg);
            ref_rope(k + t * kvd, KVH, hd, t, cfg);
        }
        for (int t = 0; t < n; t++) {
            for (int hh = 0; hh < NH; hh++) {
                int kh = hh / (NH / KVH);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int i = 0; i < hd; i++) s += q[t * qd + hh * hd + i] * k[j * kvd + kh * hd + i];
                    p[j] = s / sqrt((double)hd);
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
                for (int i = 0; i < hd; i++) {
                    double s = 0;
                    for (int j = 0; j <= t; j++) s += p[j] / sum * v[j * kvd + kh * hd + i];
                    att[hh * hd + i] = s;
                }
            }
            Tensor none = {0};
            ref_linear(o, att, &lw->o_proj, &lw->o_bias);
            for (int i = 0; i < H; i++) x[t * H + i] += o[i];
            ref_rmsnorm(h, x + t * H, &lw->post_attention_layernorm, 0, H, cfg->rms_norm_eps);
            ref_linear(g, h, &lw->gate_proj, &none);
            ref_linear(u, h, &lw->up_proj, &none);
            for (int i = 0; i < I; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_linear(o, g, &lw->down_proj, &none);
            for (int i = 0; i < H; i++) x[t * H + i] += o[i];
        }
    }
    for (int t = 0; t < n; t++) {
        Tensor none = {0};
        ref_rmsnorm(h, x + t * H, &w->norm, 0, H, cfg->rms_norm_eps);
        ref_linear(lg, h, &w->lm_head, &none);
        for (int i = 0; i < V; i++) logits[(int64_t)t * V + i] = (float)lg[i];
    }
    free(x), free(h), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(p),
        free(lg);
}

/* ---------------------------------------------------------------- driving the backend */

enum { BS = 4, NUM_BLOCKS = 40, MBPS = 8, MAX_TOKENS = 64 };

typedef struct {
    const int32_t *ids; /* the new tokens */
    int n;              /* how many */
    int start;          /* position of ids[0] */
    const int32_t *table; /* [MBPS] */
    int cached;         /* positions below this get slot -1 */
} Chunk;

/* One step over the chunks; logits of every new token, in order, into logits [T, vocab]. */
static int run_step(Backend *b, const Chunk *c, int S, float *logits) {
    int32_t ids[MAX_TOKENS], pos[MAX_TOKENS], cuq[9], cuk[9], ctx[8], tables[8 * MBPS],
        lidx[MAX_TOKENS];
    int64_t slots[MAX_TOKENS];
    int T = 0, maxq = 0, maxk = 0;
    cuq[0] = cuk[0] = 0;
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < c[s].n; i++, T++) {
            int p = c[s].start + i;
            ids[T] = c[s].ids[i];
            pos[T] = p;
            slots[T] = p < c[s].cached ? -1 : (int64_t)c[s].table[p / BS] * BS + p % BS;
            lidx[T] = T;
        }
        ctx[s] = c[s].start + c[s].n;
        cuq[s + 1] = T;
        cuk[s + 1] = cuk[s] + ctx[s];
        if (c[s].n > maxq) maxq = c[s].n;
        if (ctx[s] > maxk) maxk = ctx[s];
        memcpy(tables + s * MBPS, c[s].table, MBPS * sizeof(int32_t));
    }
    StepInputs in = {.is_prefill = maxq > 1, .num_tokens = T, .num_seqs = S, .input_ids = ids,
                     .positions = pos, .slot_mapping = slots, .cu_seqlens_q = cuq,
                     .cu_seqlens_k = cuk, .max_seqlen_q = maxq, .max_seqlen_k = maxk,
                     .context_lens = ctx, .block_tables = tables, .max_blocks_per_seq = MBPS,
                     .logits_indices = lidx, .num_logits = T};
    /* logits mode: every row's raw logits copied out; greedy sampling rows */
    SamplingRow rows[MAX_TOKENS];
    int32_t sampled[MAX_TOKENS];
    for (int i = 0; i < T; i++)
        rows[i] = (SamplingRow){.top_p = 1.0f, .repetition_penalty = 1.0f, .num_logprobs = -1};
    in.sampling = rows;
    StepOutputs out = {.token_ids = sampled, .logits = logits};
    return b->forward(b, &in, &out);
}

static Backend *make_backend(const ModelConfig *cfg, const ModelWeights *w, int threads) {
    BackendOptions o = {.num_threads = threads, .max_num_tokens = MAX_TOKENS, .max_num_seqs = MAX_TOKENS,
                        .max_model_len = MBPS * BS};
    Backend *b = NULL;
    assert_int_equal(backend_cpu_create(cfg, w, &o, &b), 0);
    KVCacheSpec spec = {.num_blocks = NUM_BLOCKS, .block_size = BS, .dtype = DTYPE_F32};
    assert_int_equal(b->init_kv_cache(b, &spec), 0);
    return b;
}

static float max_abs(const float *a, int64_t n) {
    float m = 0;
    for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i]));
    return m;
}

static void expect_same(const char *what, const float *got, const float *want, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
    if (worst != 0) fail_msg("%s: logits differ by up to %.3g (expected bit-identical)", what, worst);
}

/* ---------------------------------------------------------------- the tests */

#define N_PROMPT 19

static void check_model(TinyKind kind) {
    ModelConfig cfg;
    ModelWeights w;
    tiny_model(kind, &cfg, &w);
    const int V = cfg.vocab_size;
    int32_t ids[N_PROMPT], ids2[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) {
        ids[i] = (int32_t)((frand() + 1.0f) * 0.5f * V) % V;
        ids2[i] = (int32_t)((frand() + 1.0f) * 0.5f * V) % V;
    }
    int32_t tabA[MBPS] = {7, 3, 12, 0, 25, 9, -1, -1}, tabB[MBPS] = {30, 1, 18, 5, 22, 14, -1, -1};
    float *ref = xmalloc((size_t)N_PROMPT * V * sizeof(float));
    float *full = xmalloc((size_t)2 * N_PROMPT * V * sizeof(float));
    float *got = xmalloc((size_t)2 * N_PROMPT * V * sizeof(float));

    /* (5) one prefill == the naive dense forward */
    naive_forward(&cfg, &w, ids, N_PROMPT, ref);
    Backend *b = make_backend(&cfg, &w, 2);
    Chunk whole = {ids, N_PROMPT, 0, tabA, 0};
    assert_int_equal(run_step(b, &whole, 1, full), 0);
    double worst = 0, scale = max_abs(ref, (int64_t)N_PROMPT * V);
    for (int64_t i = 0; i < (int64_t)N_PROMPT * V; i++)
        worst = fmax(worst, fabs((double)full[i] - ref[i]) / scale);
    print_message("kind %d: max |logit| %.3g, worst error vs naive %.3g of it\n", kind, scale, worst);
    if (worst > 1e-5) fail_msg("kind %d: differs from the naive forward by %.3g", kind, worst);
    b->destroy(b);

    /* (1) prefill 11 + 8 decode steps == whole prefill */
    b = make_backend(&cfg, &w, 2);
    Chunk pre = {ids, 11, 0, tabA, 0};
    assert_int_equal(run_step(b, &pre, 1, got), 0);
    for (int t = 11; t < N_PROMPT; t++) {
        Chunk dec = {ids + t, 1, t, tabA, 0};
        assert_int_equal(run_step(b, &dec, 1, got + (int64_t)t * V), 0);
    }
    expect_same("prefill + decode", got, full, (int64_t)N_PROMPT * V);
    b->destroy(b);

    /* (3) chunked prefill 6 + 13 == whole, using a fresh backend and other blocks */
    b = make_backend(&cfg, &w, 1);
    Chunk c1 = {ids, 6, 0, tabB, 0}, c2 = {ids + 6, N_PROMPT - 6, 6, tabB, 0};
    assert_int_equal(run_step(b, &c1, 1, got), 0);
    assert_int_equal(run_step(b, &c2, 1, got + 6 * V), 0);
    expect_same("chunked prefill (1 thread)", got, full, (int64_t)N_PROMPT * V);
    b->destroy(b);

    /* (2) two sequences in one step == each alone; then batched decode of both */
    float *alone2 = xmalloc((size_t)N_PROMPT * V * sizeof(float));
    b = make_backend(&cfg, &w, 2);
    Chunk solo = {ids2, N_PROMPT, 0, tabB, 0};
    assert_int_equal(run_step(b, &solo, 1, alone2), 0);
    b->destroy(b);
    b = make_backend(&cfg, &w, 2);
    Chunk pair[2] = {{ids, 15, 0, tabA, 0}, {ids2, 12, 0, tabB, 0}};
    assert_int_equal(run_step(b, pair, 2, got), 0);
    expect_same("batched seq 0", got, full, 15 * V);
    expect_same("batched seq 1", got + 15 * V, alone2, 12 * V);
    Chunk dec2[2] = {{ids + 15, 1, 15, tabA, 0}, {ids2 + 12, 1, 12, tabB, 0}};
    assert_int_equal(run_step(b, dec2, 2, got), 0);
    expect_same("batched decode seq 0", got, full + 15 * V, V);
    expect_same("batched decode seq 1", got + V, alone2 + 12 * V, V);
    b->destroy(b);

    /* (4) prefix-cache hit: seq C shares seq A's first 2 blocks (8 tokens). Its step carries
     * those 8 tokens with slot -1 and wrong ids: they must not be written, and C's later
     * tokens must read A's cached K/V. */
    b = make_backend(&cfg, &w, 2);
    assert_int_equal(run_step(b, &whole, 1, got), 0);
    size_t nf = 0;
    float *kv = backend_cpu_kv_cache(b, &nf);
    float *before = xmalloc(nf * sizeof(float));
    memcpy(before, kv, nf * sizeof(float));
    int32_t idsC[N_PROMPT], tabC[MBPS] = {tabA[0], tabA[1], 33, 34, 35, 36, -1, -1};
    memcpy(idsC, ids, sizeof idsC);
    for (int i = 0; i < 8; i++) idsC[i] = (ids[i] + 1 + i) % V; /* garbage for cached slots */
    Chunk hit = {idsC, N_PROMPT, 0, tabC, 8};
    assert_int_equal(run_step(b, &hit, 1, got), 0);
    expect_same("prefix-cached tokens", got + 8 * V, full + 8 * V, (int64_t)(N_PROMPT - 8) * V);
    /* every slot outside blocks 33..36 is untouched (A's blocks included) */
    const int L = cfg.num_hidden_layers, kvd = cfg.num_key_value_heads * cfg.head_dim;
    for (int kvi = 0; kvi < 2; kvi++)
        for (int l = 0; l < L; l++)
            for (int blk = 0; blk < NUM_BLOCKS; blk++) {
                if (blk >= 33 && blk <= 36) continue;
                size_t off = (((size_t)kvi * L + l) * NUM_BLOCKS + blk) * BS * kvd;
                assert_memory_equal(kv + off, before + off, (size_t)BS * kvd * sizeof(float));
            }
    free(before);

    /* bad inputs are refused, not crashed on */
    int32_t bad[1] = {V + 3};
    Chunk badc = {bad, 1, 0, tabA, 0};
    assert_int_equal(run_step(b, &badc, 1, got), CVLLM_EINVAL);
    int32_t badtab[MBPS] = {NUM_BLOCKS, -1, -1, -1, -1, -1, -1, -1};
    Chunk badt = {ids, 2, 0, badtab, 0};
    assert_int_equal(run_step(b, &badt, 1, got), CVLLM_EINVAL);
    b->destroy(b);

    free(alone2);
    free(ref);
    free(full);
    free(got);
    tiny_free(&cfg, &w);
}

static void test_qwen3_tiny(void **state) { (void)state; check_model(TINY_QWEN3); }
static void test_qwen2_tiny_bias_mqa(void **state) { (void)state; check_model(TINY_QWEN2); }
static void test_llama_tiny_llama3_f16(void **state) { (void)state; check_model(TINY_LLAMA); }

/* the scalar reference path gives the same logits as the fast one (to rounding) */
static void test_scalar_path_agrees(void **state) {
    (void)state;
    ModelConfig cfg;
    ModelWeights w;
    tiny_model(TINY_QWEN3, &cfg, &w);
    const int V = cfg.vocab_size;
    int32_t ids[N_PROMPT], tab[MBPS] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int i = 0; i < N_PROMPT; i++) ids[i] = (i * 37 + 5) % V;
    float *a = xmalloc((size_t)N_PROMPT * V * sizeof(float)),
          *s = xmalloc((size_t)N_PROMPT * V * sizeof(float));
    Chunk whole = {ids, N_PROMPT, 0, tab, 0};
    CpuIsa prev = cpu_isa_get();
    Backend *b = make_backend(&cfg, &w, 2);
    assert_int_equal(run_step(b, &whole, 1, a), 0);
    b->destroy(b);
    cpu_isa_set(CPU_ISA_SCALAR);
    b = make_backend(&cfg, &w, 2);
    assert_int_equal(run_step(b, &whole, 1, s), 0);
    b->destroy(b);
    cpu_isa_set(prev);
    double worst = 0, scale = max_abs(s, (int64_t)N_PROMPT * V);
    for (int64_t i = 0; i < (int64_t)N_PROMPT * V; i++)
        worst = fmax(worst, fabs((double)a[i] - s[i]) / scale);
    print_message("%s vs scalar: worst %.3g of max |logit|\n", cpu_isa_name(prev), worst);
    assert_true(worst <= 1e-5);
    free(a);
    free(s);
    tiny_free(&cfg, &w);
}

/* a step run in slices of 3 tokens (CVLLM_CPU_TOKEN_SLICE) gives the same logits, bit for bit,
 * with two sequences in the step and every row's logits requested */
static void test_token_slices_identical(void **state) {
    (void)state;
    ModelConfig cfg;
    ModelWeights w;
    tiny_model(TINY_QWEN2, &cfg, &w);
    const int V = cfg.vocab_size;
    int32_t ids[N_PROMPT], tabA[MBPS] = {0, 1, 2, 3, 4, 5, 6, 7},
                           tabB[MBPS] = {8, 9, 10, 11, 12, 13, 14, 15};
    for (int i = 0; i < N_PROMPT; i++) ids[i] = (i * 53 + 11) % V;
    Chunk pair[2] = {{ids, 13, 0, tabA, 0}, {ids + 3, 11, 0, tabB, 0}};
    float *a = xmalloc((size_t)24 * V * sizeof(float)), *s3 = xmalloc((size_t)24 * V * sizeof(float));
    Backend *b = make_backend(&cfg, &w, 2);
    assert_int_equal(run_step(b, pair, 2, a), 0);
    b->destroy(b);
    setenv("CVLLM_CPU_TOKEN_SLICE", "3", 1);
    b = make_backend(&cfg, &w, 2);
    unsetenv("CVLLM_CPU_TOKEN_SLICE");
    assert_int_equal(run_step(b, pair, 2, s3), 0);
    b->destroy(b);
    expect_same("slices of 3 tokens", s3, a, (int64_t)24 * V);
    free(a);
    free(s3);
    tiny_free(&cfg, &w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_tiny),
        cmocka_unit_test(test_qwen2_tiny_bias_mqa),
        cmocka_unit_test(test_llama_tiny_llama3_f16),
        cmocka_unit_test(test_scalar_path_agrees),
        cmocka_unit_test(test_token_slices_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
