/* bench_cpu.c: `cvllm bench ops` - micro-benchmarks of the CPU backend on this machine:
 *   bw       read bandwidth: sum of a large f32 array with all threads (the decode roofline)
 *   matmul   bf16 matmul at T tokens on the qwen3-0.6b shapes: GB/s of weights, GFLOP/s
 *   attention  decode attention alone (attention_cpu), batch 1 and 16, f32 and bf16 caches
 *   sampler  one token from a row of Qwen3's vocabulary size (vector and scalar passes)
 *   forward  a whole synthetic qwen3-0.6b (random bf16 weights in memory, tied lm_head):
 *            decode steps at batch sizes B over a context of C cached tokens -> tokens/s
 * Weight sets are cycled through several copies larger than the last-level cache, so the
 * figures are those of streaming weights from memory, as in real decode. */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/threadpool.h"
#include "args.h"
#include "common.h"
#include "model/presets.h"
#include "backend/cpu/sampler.h"



static DType g_kv_dtype = DTYPE_F32; /* --kv-cache-dtype */
static int g_repeat = 1;              /* --repeat */
static uint64_t g_rng = 0x853C49E6748FEA9Bull;
static inline uint32_t rnd32(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}
/* bf16 uniform in about [-scale, scale) */
static void fill_bf16(uint16_t *p, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++)
        p[i] = f32_to_bf16(scale * ((float)(rnd32() >> 8) * (1.0f / 8388608.0f) - 1.0f));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---------------------------------------------------------------- bandwidth */

typedef struct {
    float *a;
    int64_t n, per; /* elements; per task */
    int touch;
    float sums[1024];
} BwJob;

static void bw_job(void *ctx, int64_t task, int thread) {
    BwJob *j = ctx;
    int64_t lo = j->per * task, hi = lo + j->per < j->n ? lo + j->per : j->n;
    if (j->touch) {
        for (int64_t i = lo; i < hi; i++) j->a[i] = (float)(i & 7);
        return;
    }
    float s = 0;
    if (cpu_isa_get() >= CPU_ISA_AVX2)
        s = sum_f32_avx2(j->a + lo, hi - lo);
    else
        for (int64_t i = lo; i < hi; i++) s += j->a[i];
    j->sums[task & 1023] = s;
}

/* An array of `bytes` touched once, read by bw_sample. */
static BwJob bw_setup(ThreadPool *pool, int64_t bytes) {
    BwJob j = {.n = bytes / 4, .per = 1 << 20}; /* 4 MB tasks */
    j.a = xmalloc((size_t)j.n * sizeof(float));
    j.touch = 1;
    threadpool_run(pool, bw_job, &j, (j.n + j.per - 1) / j.per); /* first touch */
    j.touch = 0;
    return j;
}

/* One read of the whole array with every thread of the pool: GB/s. */
static double bw_sample(ThreadPool *pool, BwJob *j) {
    double t0 = now_seconds();
    threadpool_run(pool, bw_job, j, (j->n + j->per - 1) / j->per);
    return (double)j->n * 4 / (now_seconds() - t0) / 1e9;
}

static double bench_bandwidth(ThreadPool *pool, int64_t bytes, int reps) {
    BwJob j = bw_setup(pool, bytes);
    double best = 0, *gbs = xmalloc(reps * sizeof(double));
    for (int r = 0; r < reps; r++) {
        gbs[r] = bw_sample(pool, &j);
        if (gbs[r] > best) best = gbs[r];
    }
    qsort(gbs, reps, sizeof(double), cmp_double);
    printf("bandwidth: %.2f GB read, %d threads: best %.1f GB/s, median %.1f GB/s\n",
           (double)j.n * 4 / 1e9, threadpool_size(pool), best, gbs[reps / 2]);
    free(gbs);
    free(j.a);
    return best;
}

/* ---------------------------------------------------------------- matmul */

static void bench_matmul_shape(ThreadPool *pool, const char *name, int64_t N, int64_t K, int T,
                               int reps, int packed) {
    const int64_t bytes = N * K * 2;
    int copies = (int)((512ll << 20) / bytes) + 1; /* > 512 MB in all: never cache-resident */
    if (copies > 64) copies = 64;
    uint16_t *w = xmalloc((size_t)(bytes * copies));
    fill_bf16(w, N * K * copies, 0.05f);
    float *x = xmalloc((size_t)(T * K) * sizeof(float)), *y = xmalloc((size_t)(T * N) * sizeof(float));
    float *xp = xmalloc((size_t)(T * K) * sizeof(float));
    for (int64_t i = 0; i < T * K; i++) x[i] = (float)(rnd32() >> 8) / 8388608.0f - 1.0f;
    Tensor t = {w, DTYPE_BF16, N, K};
    uint16_t **wp = xcalloc((size_t)copies, sizeof *wp); /* packed copies (the AVX2 path) */
    for (int c = 0; packed && c < copies; c++) {
        t.data = w + (size_t)c * N * K;
        wp[c] = matmul_pack_bf16(&t);
    }
    MatmulPart part = {&t, NULL, y, N, wp[0]};
    int iters = reps * copies;
    if (iters < 4) iters = 4;
    /* warm-up */
    matmul_cpu(pool, x, K, T, &part, 1, xp);
    double t0 = now_seconds(), best = 0;
    for (int i = 0; i < iters; i++) {
        t.data = w + (size_t)(i % copies) * N * K;
        part.wp = wp[i % copies];
        const double ti = now_seconds();
        matmul_cpu(pool, x, K, T, &part, 1, xp);
        const double di = now_seconds() - ti;
        if (best == 0 || di < best) best = di;
    }
    double dt = (now_seconds() - t0) / iters;
    printf("  %-10s N=%6lld K=%5lld T=%2d %-6s: %8.1f us  %6.1f GB/s  %6.1f GFLOP/s  (best %.1f GB/s, "
           "%.1f GFLOP/s)\n", name, (long long)N, (long long)K, T, packed ? "packed" : "rows", dt * 1e6,
           bytes / dt / 1e9, 2.0 * T * N * K / dt / 1e9, bytes / best / 1e9, 2.0 * T * N * K / best / 1e9);
    for (int c = 0; c < copies; c++) free(wp[c]);
    free(wp);
    free(w);
    free(x);
    free(xp);
    free(y);
}

/* ---------------------------------------------------------------- synthetic model */

/* Random bf16 weights carved from one allocation (returned in *blob). */
static size_t synthetic_weights(const ModelConfig *c, ModelWeights *w, uint16_t **blob) {
    const int64_t H = c->hidden_size, hd = c->head_dim, qd = c->num_attention_heads * hd,
                  kvd = c->num_key_value_heads * hd, I = c->intermediate_size, V = c->vocab_size;
    const int64_t per_layer = 2 * H + 2 * hd + qd * H + 2 * kvd * H + H * qd + 3 * I * H;
    const int64_t total = V * H + H + c->num_hidden_layers * per_layer;
    uint16_t *p = xmalloc((size_t)total * 2);
    *blob = p;
    memset(w, 0, sizeof *w);
    w->layers = xcalloc((size_t)c->num_hidden_layers, sizeof(LayerWeights));
#define TAKE(T, R, C, SCALE, ONES)                                                                 \
    do {                                                                                           \
        (T) = (Tensor){p, DTYPE_BF16, (R), (C)};                                                   \
        if (ONES)                                                                                  \
            for (int64_t i_ = 0; i_ < (R) * (C); i_++) p[i_] = f32_to_bf16(1.0f);                  \
        else                                                                                       \
            fill_bf16(p, (R) * (C), (SCALE));                                                      \
        p += (R) * (C);                                                                            \
    } while (0)
    TAKE(w->embed_tokens, V, H, 0.05f, 0);
    TAKE(w->norm, 1, H, 0, 1);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        LayerWeights *lw = &w->layers[l];
        TAKE(lw->input_layernorm, 1, H, 0, 1);
        TAKE(lw->post_attention_layernorm, 1, H, 0, 1);
        TAKE(lw->q_norm, 1, hd, 0, 1);
        TAKE(lw->k_norm, 1, hd, 0, 1);
        TAKE(lw->q_proj, qd, H, 0.03f, 0);
        TAKE(lw->k_proj, kvd, H, 0.03f, 0);
        TAKE(lw->v_proj, kvd, H, 0.03f, 0);
        TAKE(lw->o_proj, H, qd, 0.03f, 0);
        TAKE(lw->gate_proj, I, H, 0.03f, 0);
        TAKE(lw->up_proj, I, H, 0.03f, 0);
        TAKE(lw->down_proj, H, I, 0.02f, 0);
    }
#undef TAKE
    CHECK(p == *blob + total, "synthetic weights carve mismatch");
    w->lm_head = w->embed_tokens;
    return (size_t)total * 2;
}

/* Greedy sampling rows for n logits rows (a static array, grown as needed). */
static const SamplingRow *greedy_rows(int n) {
    static SamplingRow *rows;
    static int cap;
    if (n > cap) {
        rows = xrealloc(rows, (size_t)n * sizeof *rows);
        for (int i = cap; i < n; i++)
            rows[i] = (SamplingRow){.top_p = 1.0f, .repetition_penalty = 1.0f, .num_logprobs = -1};
        cap = n;
    }
    return rows;
}

/* One decode step of B sequences whose first p tokens are cached (their new token at position
 * p); returns its wall time. Sequence s owns blocks s*mbps .. s*mbps + mbps - 1. */
static double decode_step(Backend *b, const ModelConfig *cfg, int B, int p, int block_size,
                          int mbps, float *logits) {
    int32_t *ids = xmalloc(B * sizeof(int32_t)), *pos = xmalloc(B * sizeof(int32_t)),
            *cuq = xmalloc((B + 1) * sizeof(int32_t)), *cuk = xmalloc((B + 1) * sizeof(int32_t)),
            *ctxl = xmalloc(B * sizeof(int32_t)), *lidx = xmalloc(B * sizeof(int32_t)),
            *tables = xmalloc((size_t)B * mbps * sizeof(int32_t));
    int64_t *slots = xmalloc(B * sizeof(int64_t));
    for (int s = 0; s < B; s++)
        for (int i = 0; i < mbps; i++) tables[s * mbps + i] = s * mbps + i;
    cuq[0] = cuk[0] = 0;
    for (int s = 0; s < B; s++) {
        ids[s] = (int32_t)(rnd32() % (uint32_t)cfg->vocab_size);
        pos[s] = p;
        slots[s] = (int64_t)tables[s * mbps + p / block_size] * block_size + p % block_size;
        ctxl[s] = p + 1;
        cuq[s + 1] = s + 1;
        cuk[s + 1] = cuk[s] + p + 1;
        lidx[s] = s;
    }
    StepInputs in = {.is_prefill = 0, .num_tokens = B, .num_seqs = B, .input_ids = ids,
                     .positions = pos, .slot_mapping = slots, .cu_seqlens_q = cuq,
                     .cu_seqlens_k = cuk, .max_seqlen_q = 1, .max_seqlen_k = p + 1,
                     .context_lens = ctxl, .block_tables = tables, .max_blocks_per_seq = mbps,
                     .logits_indices = lidx, .num_logits = B, .sampling = greedy_rows(B)};
    StepOutputs out = {.token_ids = (int32_t *)logits};
    const double t0 = now_seconds();
    int rc = b->forward(b, &in, &out);
    const double dt = now_seconds() - t0;
    CHECK(rc == 0, "forward failed: %s", cvllm_last_error());
    free(ids), free(pos), free(cuq), free(cuk), free(ctxl), free(lidx), free(tables), free(slots);
    return dt;
}

static double bench_prefill(Backend *b, const ModelConfig *cfg, int n, int block_size, int mbps,
                            float *logits) {
    int32_t *ids = xmalloc(n * sizeof(int32_t)), *pos = xmalloc(n * sizeof(int32_t)),
            *tables = xmalloc(mbps * sizeof(int32_t));
    int64_t *slots = xmalloc(n * sizeof(int64_t));
    for (int i = 0; i < mbps; i++) tables[i] = i;
    for (int t = 0; t < n; t++) {
        ids[t] = (int32_t)(rnd32() % (uint32_t)cfg->vocab_size);
        pos[t] = t;
        slots[t] = t;
    }
    int32_t cuq[2] = {0, n}, cuk[2] = {0, n}, ctx[1] = {n}, lidx[1] = {n - 1};
    StepInputs in = {.is_prefill = 1, .num_tokens = n, .num_seqs = 1, .input_ids = ids,
                     .positions = pos, .slot_mapping = slots, .cu_seqlens_q = cuq,
                     .cu_seqlens_k = cuk, .max_seqlen_q = n, .max_seqlen_k = n,
                     .context_lens = ctx, .block_tables = tables, .max_blocks_per_seq = mbps,
                     .logits_indices = lidx, .num_logits = 1, .sampling = greedy_rows(1)};
    StepOutputs out = {.token_ids = (int32_t *)logits};
    double t0 = now_seconds();
    int rc = b->forward(b, &in, &out);
    CHECK(rc == 0, "forward failed: %s", cvllm_last_error());
    double dt = now_seconds() - t0;
    free(ids), free(pos), free(tables), free(slots);
    return dt;
}

static void bench_forward(int64_t bw_bytes, int threads, const int *batches, int nb, int ctx,
                          int steps, int prefill) {
    ModelConfig cfg;
    model_preset_config(model_preset_find("qwen3-0.6b"), &cfg);
    ModelWeights w;
    uint16_t *blob;
    double t0 = now_seconds();
    size_t wbytes = synthetic_weights(&cfg, &w, &blob);
    /* bytes one decode step reads: everything but the embedding table, whose one row per token
     * is negligible; the tied lm_head reads it in full */
    printf("synthetic qwen3-0.6b: %.2f GB of bf16 weights (built in %.1f s)\n", wbytes / 1e9,
           now_seconds() - t0);
    int maxB = prefill;
    for (int i = 0; i < nb; i++)
        if (batches[i] > maxB) maxB = batches[i];
    const int block_size = 16, max_len = (ctx > prefill ? ctx : prefill) + steps + 8;
    const int mbps = (max_len + block_size - 1) / block_size;
    BackendOptions o = {.num_threads = threads, .max_num_tokens = maxB, .max_num_seqs = maxB,
                        .max_model_len = mbps * block_size};
    Backend *b = NULL;
    CHECK(backend_cpu_create(&cfg, &w, &o, &b) == 0, "%s", cvllm_last_error());
    int maxS = 0;
    for (int i = 0; i < nb; i++)
        if (batches[i] > maxS) maxS = batches[i];
    if (maxS < 1) maxS = 1;
    KVCacheSpec spec = {.num_blocks = maxS * mbps, .block_size = block_size, .dtype = g_kv_dtype};
    CHECK(b->init_kv_cache(b, &spec) == 0, "%s", cvllm_last_error());
    size_t nkv = 0;
    float *kv = backend_cpu_kv_cache(b, &nkv); /* NULL for a bf16 cache: left zero */
    for (size_t i = 0; i < nkv; i++) kv[i] = (float)(rnd32() >> 8) / 8388608.0f - 0.5f;
    const double kv_bytes = 2.0 * cfg.num_hidden_layers * spec.num_blocks * block_size *
                            cfg.num_key_value_heads * cfg.head_dim * dtype_size(g_kv_dtype);
    printf("cpu backend: %d threads, isa %s, KV cache %.1f MB %s\n", backend_cpu_num_threads(b),
           cpu_isa_name(cpu_isa_get()), kv_bytes / 1e6, dtype_name(g_kv_dtype));
    float *logits = xmalloc((size_t)maxB * cfg.vocab_size * sizeof(float));
    const double step_bytes = (double)wbytes; /* layers + tied lm_head (embed rows negligible) */
    /* Steps of the batch sizes alternate (B1, B2, B1, B2, ...), each round after one read of
     * the bandwidth array on the same threads: the host's drift (its memory bandwidth moves by
     * a third within a minute here) hits every batch size and the bound alike. Each batch size
     * gets steps x repeat timed steps (after two warm-up ones) at positions ctx .. ctx+steps-1
     * over and over; the median step is reported, with the 10th and 90th percentiles. The batch-1
     * bound is the weight bytes over the median bandwidth sample of the rounds (and over the
     * best one, the strict reading). */
    const int n = steps * g_repeat;
    double tok1 = 0, *times = xmalloc((size_t)nb * n * sizeof(double));
    double *bws = xmalloc((size_t)n * sizeof(double));
    ThreadPool *pool = backend_cpu_pool(b);
    BwJob bwj = bw_setup(pool, bw_bytes);
    for (int i = 0; i < nb; i++)
        for (int w = 0; w < 2; w++) decode_step(b, &cfg, batches[i], ctx, block_size, mbps, logits);
    for (int k = 0; k < n; k++) {
        bws[k] = bw_sample(pool, &bwj);
        for (int i = 0; i < nb; i++)
            times[i * n + k] = decode_step(b, &cfg, batches[i], ctx + k % steps, block_size, mbps, logits);
    }
    free(bwj.a);
    qsort(bws, n, sizeof(double), cmp_double);
    const double bw = bws[n / 2], bw_best = bws[n - 1];
    printf("bandwidth, one %.2f GB read before each round: median %.1f GB/s, p10-p90 %.1f .. %.1f, "
           "best %.1f\n", bw_bytes / 1e9, bw, bws[n / 10], bws[(n * 9) / 10], bw_best);
    for (int i = 0; i < nb; i++) {
        int B = batches[i];
        double *t = times + i * n;
        qsort(t, n, sizeof(double), cmp_double);
        double dt = t[n / 2];
        double tps = B / dt;
        if (B == 1) tok1 = tps;
        printf("decode B=%-3d ctx=%d: %7.2f ms/step  %7.1f tok/s  %6.1f GB/s of weights  "
               "%6.1f GFLOP/s",
               B, ctx, dt * 1e3, tps, step_bytes / dt / 1e9, 2.0 * B * step_bytes / 2 / dt / 1e9);
        if (B == 1)
            printf("  (%.0f%% of the %.1f tok/s bandwidth bound; %.0f%% of the best sample's %.1f)",
                   100.0 * tps / (bw * 1e9 / step_bytes), bw * 1e9 / step_bytes,
                   100.0 * tps / (bw_best * 1e9 / step_bytes), bw_best * 1e9 / step_bytes);
        if (B > 1 && tok1 > 0) printf("  (%.2fx batch 1)", tps / tok1);
        printf("  [median of %d steps; p10-p90 %.1f .. %.1f tok/s]\n", n, B / t[(n * 9) / 10],
               B / t[n / 10]);
    }
    free(times);
    free(bws);
    if (prefill > 0) {
        double dt = bench_prefill(b, &cfg, prefill, block_size, mbps, logits);
        printf("prefill of %d tokens: %.2f s  %.1f tok/s  %.1f GFLOP/s\n", prefill, dt,
               prefill / dt, 2.0 * prefill * (step_bytes / 2 - (double)cfg.vocab_size * cfg.hidden_size) / dt / 1e9);
    }
    free(logits);
    b->destroy(b);
    free(w.layers);
    free(blob);
}

/* ---------------------------------------------------------------- attention */

/* Decode attention alone (attention_cpu) over Qwen3-0.6B's heads (16 q, 8 kv, head_dim 128), 28
 * layers of a cache of B sequences x ctx cached tokens, f32 and bf16: median and best of reps. */
static void bench_attention(ThreadPool *pool, int ctx) {
    const int H = 16, KVH = 8, hd = 128, bs = 16, layers = 28, reps = 20;
    static const int batches[2] = {1, 16};
    printf("decode attention, qwen3-0.6b heads, 28 layers, context %d:\n", ctx);
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int bi = 0; bi < 2; bi++) {
            const int B = batches[bi], mbps = (ctx + bs) / bs, nblk = B * mbps;
            const size_t es = bf16 ? 2 : 4, layer_elems = (size_t)nblk * bs * KVH * hd;
            char *k = xmalloc(layer_elems * es * layers), *v = xmalloc(layer_elems * es * layers);
            for (size_t i = 0; i < layer_elems * layers; i++) {
                const float a = (float)(rnd32() >> 8) / 8388608.0f - 0.5f, c = (float)(rnd32() >> 8) / 8388608.0f - 0.5f;
                if (bf16) ((uint16_t *)k)[i] = f32_to_bf16(a), ((uint16_t *)v)[i] = f32_to_bf16(c);
                else ((float *)k)[i] = a, ((float *)v)[i] = c;
            }
            float *q = xmalloc((size_t)B * H * hd * sizeof(float)), *out = xmalloc((size_t)B * H * hd * sizeof(float));
            float *scratch = xmalloc((size_t)threadpool_size(pool) * H * (ctx + bs) * sizeof(float));
            for (int i = 0; i < B * H * hd; i++) q[i] = (float)(rnd32() >> 8) / 8388608.0f - 0.5f;
            int32_t *pos = xmalloc(B * sizeof(int32_t)), *seq = xmalloc(B * sizeof(int32_t)),
                    *tab = xmalloc((size_t)B * mbps * sizeof(int32_t));
            for (int s = 0; s < B; s++) {
                pos[s] = ctx, seq[s] = s; /* keys of the token */
                for (int i = 0; i < mbps; i++) tab[s * mbps + i] = i * B + s; /* blocks interleaved */
            }
            double *t = xmalloc(reps * sizeof(double));
            for (int r = -1; r < reps; r++) {
                const double t0 = now_seconds();
                for (int l = 0; l < layers; l++) {
                    AttentionArgs a = {.q = q, .out = out, .k_cache = k + l * layer_elems * es,
                                       .v_cache = v + l * layer_elems * es,
                                       .kv_dtype = bf16 ? DTYPE_BF16 : DTYPE_F32,
                                       .num_tokens = B, .n_heads = H, .n_kv_heads = KVH,
                                       .head_dim = hd, .block_size = bs, .scale = 0.0883883f,
                                       .num_keys = pos, .token_seq = seq, .block_tables = tab,
                                       .max_blocks_per_seq = mbps, .scratch = scratch,
                                       .scratch_stride = (int64_t)H * (ctx + bs)};
                    attention_cpu(pool, &a);
                }
                if (r >= 0) t[r] = now_seconds() - t0;
            }
            qsort(t, reps, sizeof(double), cmp_double);
            const double bytes = 2.0 * B * ctx * KVH * hd * es * layers;
            printf("  B=%-2d %-4s KV: %7.2f ms median, %7.2f ms best  (%.1f GB/s of K/V at the median)\n", B,
                   bf16 ? "bf16" : "f32", t[reps / 2] * 1e3, t[0] * 1e3, bytes / t[reps / 2] / 1e9);
            free(k), free(v), free(q), free(out), free(scratch), free(pos), free(seq), free(tab), free(t);
        }
}

/* ---------------------------------------------------------------- sampler */

/* One token sampled from a row of Qwen3's vocabulary size (temperature 0.6, as bench.py; and
 * greedy), with the vector passes and the scalar ones: best of 50 and mean, in ms. */
static void bench_sampler(void) {
    const int V = 151936, reps = 50;
    float *logits = xmalloc((size_t)V * sizeof(float)), *x = xmalloc((size_t)V * sizeof(float));
    void *scratch = xmalloc(sampler_scratch_bytes(V));
    for (int i = 0; i < V; i++) logits[i] = (float)(rnd32() >> 8) / 8388608.0f * 20.0f - 10.0f;
    const CpuIsa best_isa = cpu_isa_get();
    printf("sampler, vocab %d:\n", V);
    for (int pass = 0; pass < 2; pass++) {
        const CpuIsa isa = pass == 0 ? best_isa : CPU_ISA_SCALAR;
        if (pass == 1 && best_isa == CPU_ISA_SCALAR) break;
        cpu_isa_set(isa);
        for (int greedy = 0; greedy < 2; greedy++) {
            SamplingRow p = {.temperature = greedy ? 0.0f : 0.6f, .top_p = 1.0f, .seed = 1,
                             .repetition_penalty = 1.0f, .num_logprobs = -1};
            double best = 0, total = 0;
            for (int r = 0; r < reps; r++) {
                memcpy(x, logits, (size_t)V * sizeof(float));
                const double t0 = now_seconds();
                (void)sampler_sample(x, V, &p, scratch, NULL, NULL, NULL);
                const double dt = now_seconds() - t0;
                total += dt;
                if (best == 0 || dt < best) best = dt;
            }
            printf("  %-6s %-16s %.3f ms best, %.3f ms mean\n", cpu_isa_name(isa),
                   greedy ? "greedy" : "temperature 0.6", best * 1e3, total / reps * 1e3);
        }
    }
    cpu_isa_set(best_isa);
    free(logits), free(x), free(scratch);
}

/* ---------------------------------------------------------------- command line */

static void usage(FILE *f) {
    fprintf(f,
            "usage: cvllm bench ops [bw|matmul|attention|forward|sampler|all] [options]\n"
            "  --threads N      threads, at most the cores (0 = all cores; default 0)\n"
            "  --isa NAME       scalar | avx2 | avx512, up to what this CPU has (default: best)\n"
            "  --bw-gb G        bandwidth array size in GB, 0.001..1024 (default 1)\n"
            "  --batches LIST   decode batch sizes in 1..256, e.g. 1,16 (default 1,16; at most 16)\n"
            "  --ctx N          cached context per sequence, 1..32768 (default 128)\n"
            "  --steps N        timed decode steps, 1..100000 (default 10)\n"
            "  --prefill N      also time one prefill of N tokens, 0..16384 (default 0)\n"
            "  --kv-cache-dtype float32|bfloat16  KV cache elements (default float32)\n"
            "  --repeat R       time steps x R steps of each batch size (steps of the batch\n"
            "                   sizes alternate); report the median step, 1..1000 (default 1)\n"
            "Options that need more memory than the machine has are refused.\n");
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "cvllm bench ops: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n\n");
    usage(stderr);
    return 2;
}

/* Bytes the chosen parts allocate at their peak (they run one after the other). */
static double memory_needed(int all, const char *what, double bw_bytes, int ctx, int steps,
                            int prefill, const int32_t *batches, int nb) {
    const double kv_token = 2.0 * 28 * 8 * 128; /* K and V elements per token, qwen3-0.6b */
    double need = 0, part;
    if (all || !strcmp(what, "bw")) need = bw_bytes;
    if (all || !strcmp(what, "matmul")) need = need > 1.2e9 ? need : 1.2e9; /* > 512 MB of copies, packed too */
    if (all || !strcmp(what, "attention")) {
        part = 16.0 * ((ctx + 16) / 16) * 16 * kv_token * 4; /* B = 16, f32 */
        if (part > need) need = part;
    }
    if (all || !strcmp(what, "forward")) {
        int maxB = prefill, maxS = 1;
        for (int i = 0; i < nb; i++) {
            if (batches[i] > maxB) maxB = batches[i];
            if (batches[i] > maxS) maxS = batches[i];
        }
        const int len = (ctx > prefill ? ctx : prefill) + steps + 8, mbps = (len + 15) / 16;
        part = 1.5e9 + bw_bytes + (double)maxS * mbps * 16 * kv_token * dtype_size(g_kv_dtype) +
               (double)maxB * 151936 * 4 + (double)maxB * 64 * 1024; /* weights, bw, KV, logits, acts */
        if (part > need) need = part;
    }
    return need;
}

int bench_cpu_ops(int argc, char **argv) {
    const char *what = NULL;
    long long threads = 0, ctx = 128, steps = 10, prefill = 0, repeat = 1;
    int32_t default_batches[2] = {1, 16}, *batch_list = NULL;
    const int32_t *batches = default_batches;
    int nb = 2, isa = -1, rc = 2;
    double bw_gb = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto done;
        }
        if (a[0] != '-') {
            if (what) {
                fprintf(stderr, "cvllm bench ops: one part at a time ('%s' and '%s')\n", what, a);
                goto done;
            }
            what = a;
            continue;
        }
        static const char *const WITH_VALUE[] = {"--threads", "--isa", "--bw-gb", "--ctx", "--steps",
                                                 "--repeat", "--prefill", "--kv-cache-dtype", "--batches"};
        int known = 0;
        for (size_t k = 0; k < sizeof WITH_VALUE / sizeof *WITH_VALUE; k++) known |= !strcmp(a, WITH_VALUE[k]);
        if (!known) {
            rc = usage_error("unknown option '%s'", a);
            goto done;
        }
        if (!(v = cli_value(argc, argv, &i))) goto done;
        if (!strcmp(a, "--threads")) {
            if (cli_int(a, v, 0, cli_num_cores(), &threads) < 0) goto done;
        } else if (!strcmp(a, "--isa")) {
            isa = !strcmp(v, "scalar") ? CPU_ISA_SCALAR
                  : !strcmp(v, "avx2") ? CPU_ISA_AVX2
                  : !strcmp(v, "avx512") ? CPU_ISA_AVX512 : -1;
            if (isa < 0) {
                rc = usage_error("--isa: expected scalar, avx2 or avx512, got '%s'", v);
                goto done;
            }
            if (isa > (int)cpu_isa_best()) {
                fprintf(stderr, "cvllm bench ops: --isa %s: this CPU (and build) supports up to %s\n", v,
                        cpu_isa_name(cpu_isa_best()));
                goto done;
            }
        } else if (!strcmp(a, "--bw-gb")) {
            if (cli_float(a, v, 0.001, 1024, &bw_gb) < 0) goto done;
        } else if (!strcmp(a, "--ctx")) {
            if (cli_int(a, v, 1, 32768, &ctx) < 0) goto done;
        } else if (!strcmp(a, "--steps")) {
            if (cli_int(a, v, 1, 100000, &steps) < 0) goto done;
        } else if (!strcmp(a, "--repeat")) {
            if (cli_int(a, v, 1, 1000, &repeat) < 0) goto done;
        } else if (!strcmp(a, "--prefill")) {
            if (cli_int(a, v, 0, 16384, &prefill) < 0) goto done;
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            if (!strcmp(v, "float32") || !strcmp(v, "f32")) g_kv_dtype = DTYPE_F32;
            else if (!strcmp(v, "bfloat16") || !strcmp(v, "bf16")) g_kv_dtype = DTYPE_BF16;
            else {
                rc = usage_error("--kv-cache-dtype: expected float32 or bfloat16, got '%s'", v);
                goto done;
            }
        } else { /* --batches */
            free(batch_list);
            batch_list = NULL;
            if ((nb = cli_int_list(a, v, 1, 256, &batch_list)) < 0) goto done;
            if (nb > 16) {
                rc = usage_error("--batches: at most 16 batch sizes, got '%s'", v);
                goto done;
            }
            batches = batch_list;
        }
    }
    if (!what) what = "all";
    int all = !strcmp(what, "all");
    if (!all && strcmp(what, "bw") && strcmp(what, "matmul") && strcmp(what, "forward") &&
        strcmp(what, "sampler") && strcmp(what, "attention")) {
        rc = usage_error("unknown part '%s'", what);
        goto done;
    }
    const double need = memory_needed(all, what, bw_gb * 1e9, (int)ctx, (int)steps, (int)prefill, batches, nb);
    const double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (have > 0 && need > 0.9 * have) {
        fprintf(stderr, "cvllm bench ops: these options need about %.1f GB of memory; this machine has "
                        "%.1f GB (lower --bw-gb, --ctx, --batches or --prefill)\n", need / 1e9, have / 1e9);
        goto done;
    }
    if (isa >= 0) cpu_isa_set((CpuIsa)isa);
    g_repeat = (int)repeat;
    int batch_sizes[16];
    for (int k = 0; k < nb; k++) batch_sizes[k] = batches[k];
    ThreadPool *pool = threadpool_create((int)threads);
    printf("cpu: %d threads, isa %s (best %s)\n", threadpool_size(pool), cpu_isa_name(cpu_isa_get()),
           cpu_isa_name(cpu_isa_best()));
    if (all || !strcmp(what, "bw")) bench_bandwidth(pool, (int64_t)(bw_gb * 1e9), 7);
    if (all || !strcmp(what, "matmul")) {
        printf("bf16 matmul, qwen3-0.6b shapes (weights streamed from memory):\n");
        static const struct { const char *name; int64_t N, K; } shapes[] = {
            {"qkv", 4096, 1024}, {"o_proj", 1024, 2048}, {"gate/up", 3072, 1024},
            {"down", 1024, 3072}, {"lm_head", 151936, 1024}};
        /* row-major, and packed panels where the AVX2 kernels use them (bf16) */
        const int can_pack = cpu_isa_get() == CPU_ISA_AVX2;
        for (int packed = 0; packed <= can_pack; packed++)
            for (int T = 1; T <= 16; T += 15)
                for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
                    bench_matmul_shape(pool, shapes[s].name, shapes[s].N, shapes[s].K, T, 3, packed);
    }
    if (all || !strcmp(what, "attention")) bench_attention(pool, (int)ctx);
    threadpool_destroy(pool);
    if (all || !strcmp(what, "sampler")) bench_sampler();
    if (all || !strcmp(what, "forward"))
        bench_forward((int64_t)(bw_gb * 1e9), (int)threads, batch_sizes, nb, (int)ctx, (int)steps, (int)prefill);
    rc = 0;
done:
    free(batch_list);
    return rc;
}
