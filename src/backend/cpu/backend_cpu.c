/* backend_cpu.c: the CPU backend: the model's layer graph over one step, in f32, on weights kept
 * in their stored dtype. This is the reference other backends are checked against, so the graph
 * reads top to bottom like the transformers modeling code it mirrors (Qwen3 / Qwen2 / Llama):
 *
 *   x = embed[ids]
 *   per layer:  h = rmsnorm(x) * w_in
 *               q, k, v = h @ Wq^T (+bq), h @ Wk^T (+bk), h @ Wv^T (+bv)
 *               Qwen3: q, k = rmsnorm_per_head(q) * q_norm, rmsnorm_per_head(k) * k_norm
 *               q, k = rope(q, positions), rope(k, positions)
 *               cache[slot_mapping[t]] = k[t], v[t]   (slot -1: already cached, not written)
 *               a = causal attention of q over the cache through each sequence's block table
 *               x += a @ Wo^T
 *               h = rmsnorm(x) * w_post
 *               x += (silu(h @ Wg^T) * (h @ Wu^T)) @ Wd^T
 *   logits = (rmsnorm(x[logits_indices]) * w_norm) @ lm_head^T
 *
 * A step is run in slices of at most CPU_TOKEN_SLICE tokens, in order, each through all the
 * layers: a slice attends to the K/V that earlier slices of the step already wrote, exactly as a
 * chunked prefill would (the kernels are batch-invariant, so the logits do not depend on the
 * slicing). This bounds the working set of a long prefill (the matmul re-reads its activations
 * once per weight tile: 256 tokens x 12 KB stay in cache, 16k tokens would not) and the
 * workspace (only the residual stream x is sized by max_num_tokens).
 *
 * Memory: the activation workspace is one allocation sized at create from BackendOptions; the
 * KV cache is one allocation in init_kv_cache; the small per-layer vectors (norm weights, biases)
 * are widened to f32 once at create (kilobytes); the matrices are never copied. */
#include "backend/cpu/backend_cpu.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/sampler.h"
#include "backend/cpu/threadpool.h"
#include "common.h"

#define CPU_TOKEN_SLICE 256 /* tokens per slice of a step (CVLLM_CPU_TOKEN_SLICE overrides) */
/* An fp8 cache's per-tensor k and v scale: vLLM's default without calibrated scales */
#define CPU_KV_SCALE 1.0f

typedef struct {
    float *in_norm, *post_norm; /* [hidden] */
    float *q_norm, *k_norm;     /* [head_dim] or NULL */
    float *bq, *bk, *bv;        /* [heads*head_dim], [kv*head_dim] x2, or NULL */
    float *bo;                  /* [hidden] o_proj bias (Llama/Qwen3 attention_bias) or NULL */
    /* bf16 matrices packed for the AVX2 kernels (matmul_pack_bf16), in CpuBackend.packed;
     * NULL = not packed */
    const uint16_t *pq, *pk, *pv, *po, *pgate, *pup, *pdown;
} LayerParams;

/* CVLLM_CPU_PROFILE=1: wall time per op, printed when the backend is destroyed. */
enum { PROF_NORMS, PROF_QKV, PROF_ROPE_STORE, PROF_ATTENTION, PROF_O, PROF_GATE_UP, PROF_DOWN,
       PROF_LM_HEAD, PROF_SAMPLE, PROF_N };
static const char *const PROF_NAMES[PROF_N] = {"norms+residual+embed", "qkv", "qk_norm+rope+store",
                                               "attention", "o_proj", "gate_up+silu", "down",
                                               "lm_head", "sample"};

typedef struct {
    ModelConfig cfg;
    const ModelWeights *w; /* borrowed */
    int profile;
    double prof[PROF_N], prof_t;
    int64_t prof_steps;
    BackendOptions opt;
    ThreadPool *pool;      /* owned */
    int hidden, heads, kv_heads, head_dim, q_dim, kv_dim, inter, vocab, layers;

    float *params;         /* owned: every LayerParams vector, final_norm and inv_freq */
    LayerParams *lp;       /* owned: [layers] */
    float *final_norm;     /* [hidden] */
    const uint16_t *p_lm_head; /* lm_head packed for the AVX2 kernels, or NULL */
    void *packed;          /* owned (cpu_alloc_huge): every packed matrix, or NULL */
    size_t packed_map;
    float *inv_freq;       /* [head_dim/2] */

    int slice;             /* tokens per slice: S = min(max_num_tokens, CPU_TOKEN_SLICE) */
    float *ws;             /* owned: the activation workspace, carved below */
    float *x;              /* [max_num_tokens, hidden] residual stream */
    int32_t *token_seq;    /* [max_num_tokens] the sequence of each token */
    int32_t *token_keys;   /* [max_num_tokens] the keys each token attends to (from cu_seqlens) */
    float *logits;         /* [max_num_seqs, vocab] one step's logits rows */
    void *sampler_scratch; /* sampler_scratch_bytes(vocab) */
    float *h, *tmp;        /* [S, hidden] normed input, matmul output */
    float *q, *k, *v, *att;/* [S, q_dim], [S, kv_dim] x2, [S, q_dim] */
    float *g, *u;          /* [S, inter] */
    float *xp;             /* [S, max(hidden, q_dim, inter)]: matmul inputs, permuted (bf16) */
    float *cos_t, *sin_t;  /* [S, head_dim/2] */
    float *scores;         /* [nth, heads * max_model_len] attention scratch */

    void *kv;              /* owned (mmap): [2, layers, num_blocks, block_size, kv_heads, head_dim]
                            * of kv_dtype: f32, bf16 (--kv-cache-dtype bfloat16) or fp8 e4m3
                            * (--kv-cache-dtype fp8: stored = e4m3(x / 1.0), vLLM's scales) */
    DType kv_dtype;
    size_t kv_floats, kv_map_bytes; /* kv_floats: elements */
    int num_blocks, block_size;
} CpuBackend;

/* ---------------------------------------------------------------- create / destroy */

static float *widen(float **cursor, const Tensor *t, int64_t n) {
    if (!t->data) return NULL;
    CHECK(t->rows * t->cols == n, "vector of %lld elements, expected %lld",
          (long long)(t->rows * t->cols), (long long)n);
    float *p = *cursor;
    cpu_to_f32(p, t->data, t->dtype, 0, n);
    *cursor += n;
    return p;
}

static int check_matrix(const char *name, int layer, const Tensor *t, int64_t rows, int64_t cols) {
    if (!t->data || t->rows != rows || t->cols != cols)
        return cvllm_errorf(CVLLM_EINVAL,
                            "cpu backend: layer %d %s is [%lld, %lld]%s, expected [%lld, %lld]",
                            layer, name, (long long)t->rows, (long long)t->cols,
                            t->data ? "" : " (missing)", (long long)rows, (long long)cols);
    return 0;
}

/* With the AVX2 kernels, bf16 matrices are repacked once into 16-row panels (ops.h: one
 * contiguous stream per panel for batch-1 decode, 12-accumulator tiles for batches): a bf16 copy
 * of the weights, never an f32 one, in one huge-page arena (cpu_alloc_huge: batch-1 decode streams
 * all of it every token). CVLLM_CPU_PACK=0 keeps the row-major kernels. Two passes: sizes, then
 * the packing. */
static const uint16_t *pack_one(CpuBackend *c, const Tensor *t, size_t *off) {
    if (t->dtype != DTYPE_BF16) return NULL;
    const size_t at = *off;
    *off += (matmul_packed_bytes(t) + 63) / 64 * 64;
    if (!c->packed) return NULL; /* sizing pass */
    uint16_t *dst = (uint16_t *)((char *)c->packed + at);
    matmul_pack_bf16_into(t, dst);
    return dst;
}

static void pack_weights(CpuBackend *c) {
    const char *env = getenv("CVLLM_CPU_PACK");
    if (cpu_isa_get() != CPU_ISA_AVX2 || (env && !strcmp(env, "0"))) return;
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        for (int l = 0; l < c->layers; l++) {
            const LayerWeights *lw = &c->w->layers[l];
            LayerParams *p = &c->lp[l];
            p->pq = pack_one(c, &lw->q_proj, &off);
            p->pk = pack_one(c, &lw->k_proj, &off);
            p->pv = pack_one(c, &lw->v_proj, &off);
            p->po = pack_one(c, &lw->o_proj, &off);
            p->pgate = pack_one(c, &lw->gate_proj, &off);
            p->pup = pack_one(c, &lw->up_proj, &off);
            p->pdown = pack_one(c, &lw->down_proj, &off);
        }
        c->p_lm_head = pack_one(c, &c->w->lm_head, &off);
        if (pass == 0) {
            if (off == 0) return; /* nothing in bf16 */
            c->packed = cpu_alloc_huge(off, &c->packed_map);
            CHECK(c->packed != NULL, "out of memory for %zu bytes of packed weights", off);
        }
    }
}

static int cpu_forward(Backend *b, const StepInputs *in, StepOutputs *out);
static int64_t cpu_kv_block_bytes(Backend *b, int block_size, DType dtype);
static DType cpu_kv_default_dtype(Backend *b);
static int64_t cpu_kv_budget_bytes(Backend *b);
static int cpu_init_kv_cache(Backend *b, const KVCacheSpec *spec);
static void cpu_destroy(Backend *b);

int backend_cpu_create(const ModelConfig *cfg, const ModelWeights *w, const BackendOptions *o,
                       Backend **out) {
    *out = NULL;
    if (o->gpu_memory_utilization != 0)
        return cvllm_errorf(CVLLM_EINVAL, "--gpu-memory-utilization applies to a GPU; the cpu "
                                          "backend's KV cache is sized by --kv-cache-memory");
    if (o->tp_size > 1)
        return cvllm_errorf(CVLLM_EUNSUPPORTED, "cpu backend: no tensor parallelism");
    if (o->max_num_tokens <= 0 || o->max_num_seqs <= 0 || o->max_model_len <= 0)
        return cvllm_errorf(CVLLM_EINVAL,
                            "cpu backend: max_num_tokens %d, max_num_seqs %d, max_model_len %d "
                            "must all be positive",
                            o->max_num_tokens, o->max_num_seqs, o->max_model_len);
    if (cfg->num_attention_heads <= 0 || cfg->num_key_value_heads <= 0 ||
        cfg->num_attention_heads % cfg->num_key_value_heads || cfg->head_dim <= 0 ||
        cfg->head_dim % 2 || cfg->head_dim > CPU_MAX_HEAD_DIM)
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "cpu backend: %d heads, %d kv heads, head_dim %d (need heads a "
                            "multiple of kv heads and an even head_dim of at most 512)",
                            cfg->num_attention_heads, cfg->num_key_value_heads, cfg->head_dim);
    const int H = cfg->hidden_size, hd = cfg->head_dim, qd = cfg->num_attention_heads * hd,
              kvd = cfg->num_key_value_heads * hd, I = cfg->intermediate_size,
              L = cfg->num_hidden_layers;
    int rc = 0;
    if (w->embed_tokens.rows != cfg->vocab_size || w->embed_tokens.cols != H ||
        w->lm_head.rows != cfg->vocab_size || w->lm_head.cols != H || !w->norm.data)
        return cvllm_errorf(CVLLM_EINVAL, "cpu backend: embed/lm_head/norm do not match the config");
    for (int l = 0; l < L && !rc; l++) {
        const LayerWeights *lw = &w->layers[l];
        if ((rc = check_matrix("q_proj", l, &lw->q_proj, qd, H)) ||
            (rc = check_matrix("k_proj", l, &lw->k_proj, kvd, H)) ||
            (rc = check_matrix("v_proj", l, &lw->v_proj, kvd, H)) ||
            (rc = check_matrix("o_proj", l, &lw->o_proj, H, qd)) ||
            (rc = check_matrix("gate_proj", l, &lw->gate_proj, I, H)) ||
            (rc = check_matrix("up_proj", l, &lw->up_proj, I, H)) ||
            (rc = check_matrix("down_proj", l, &lw->down_proj, H, I)))
            return rc;
        if (cfg->qk_norm && (!lw->q_norm.data || !lw->k_norm.data))
            return cvllm_errorf(CVLLM_EINVAL, "cpu backend: layer %d lacks q_norm/k_norm", l);
    }

    CpuBackend *c = xcalloc(1, sizeof *c);
    c->cfg = *cfg;
    c->w = w;
    c->opt = *o;
    c->pool = threadpool_create(o->num_threads);
    const char *prof = getenv("CVLLM_CPU_PROFILE");
    c->profile = prof && *prof && strcmp(prof, "0") != 0;
    c->hidden = H;
    c->heads = cfg->num_attention_heads;
    c->kv_heads = cfg->num_key_value_heads;
    c->head_dim = hd;
    c->q_dim = qd;
    c->kv_dim = kvd;
    c->inter = I;
    c->vocab = cfg->vocab_size;
    c->layers = L;

    /* small f32 vectors */
    size_t np = (size_t)L * (3 * H + 2 * hd + qd + 2 * kvd) + H + hd / 2;
    c->params = xmalloc(np * sizeof(float));
    c->lp = xcalloc((size_t)L, sizeof(LayerParams));
    float *cur = c->params;
    for (int l = 0; l < L; l++) {
        const LayerWeights *lw = &w->layers[l];
        LayerParams *p = &c->lp[l];
        p->in_norm = widen(&cur, &lw->input_layernorm, H);
        p->post_norm = widen(&cur, &lw->post_attention_layernorm, H);
        CHECK(p->in_norm && p->post_norm, "layer %d lacks its layer norms", l);
        if (cfg->qk_norm) {
            p->q_norm = widen(&cur, &lw->q_norm, hd);
            p->k_norm = widen(&cur, &lw->k_norm, hd);
        }
        p->bq = widen(&cur, &lw->q_bias, qd);
        p->bk = widen(&cur, &lw->k_bias, kvd);
        p->bv = widen(&cur, &lw->v_bias, kvd);
        p->bo = widen(&cur, &lw->o_bias, H);
    }
    pack_weights(c);
    c->final_norm = widen(&cur, &w->norm, H);
    c->inv_freq = cur;
    cur += hd / 2;
    CHECK(cur <= c->params + np, "params overflow");
    rope_inv_freq_cpu(cfg, hd, c->inv_freq);

    /* activation workspace */
    const char *env_slice = getenv("CVLLM_CPU_TOKEN_SLICE");
    c->slice = env_slice && atoi(env_slice) > 0 ? atoi(env_slice) : CPU_TOKEN_SLICE;
    if (c->slice > o->max_num_tokens) c->slice = o->max_num_tokens;
    const size_t T = (size_t)o->max_num_tokens, S = (size_t)c->slice,
                 nth = (size_t)threadpool_size(c->pool), heads = (size_t)c->heads;
    size_t kmax = (size_t)(H > qd ? H : qd) > (size_t)I ? (size_t)(H > qd ? H : qd) : (size_t)I;
    size_t nws = T * ((size_t)H + 2) +
                 S * (2 * (size_t)H + 2 * (size_t)qd + 2 * (size_t)kvd + 2 * (size_t)I + (size_t)hd + kmax) +
                 nth * (size_t)o->max_model_len * heads;
    c->ws = xmalloc(nws * sizeof(float));
    cur = c->ws;
#define CARVE(ptr, n) (ptr = cur, cur += (n))
    CARVE(c->x, T * H);
    c->token_seq = (int32_t *)cur; /* int32 and float are both 4 bytes */
    cur += T;
    c->token_keys = (int32_t *)cur;
    cur += T;
    CARVE(c->h, S * H);
    CARVE(c->tmp, S * H);
    CARVE(c->q, S * qd);
    CARVE(c->att, S * qd);
    CARVE(c->k, S * kvd);
    CARVE(c->v, S * kvd);
    CARVE(c->g, S * I);
    CARVE(c->u, S * I);
    CARVE(c->xp, S * kmax);
    CARVE(c->cos_t, S * (hd / 2));
    CARVE(c->sin_t, S * (hd / 2));
    CARVE(c->scores, nth * (size_t)o->max_model_len * heads);
#undef CARVE
    CHECK(cur == c->ws + nws, "workspace carve mismatch");
    c->logits = xmalloc((size_t)o->max_num_seqs * (size_t)c->vocab * sizeof(float));
    c->sampler_scratch = xmalloc(sampler_scratch_bytes(c->vocab));

    Backend *b = xcalloc(1, sizeof *b);
    b->name = "cpu";
    b->ctx = c;
    b->forward = cpu_forward;
    b->kv_block_bytes = cpu_kv_block_bytes;
    b->kv_default_dtype = cpu_kv_default_dtype;
    b->kv_budget_bytes = cpu_kv_budget_bytes;
    b->init_kv_cache = cpu_init_kv_cache;
    b->destroy = cpu_destroy;
    *out = b;
    return 0;
}

static void cpu_destroy(Backend *b) {
    if (!b) return;
    CpuBackend *c = b->ctx;
    if (c && c->profile && c->prof_steps) {
        double total = 0;
        for (int k = 0; k < PROF_N; k++) total += c->prof[k];
        fprintf(stderr, "cpu backend profile: %lld steps, %.3f s\n", (long long)c->prof_steps, total);
        for (int k = 0; k < PROF_N; k++)
            fprintf(stderr, "  %-22s %8.3f s  %5.1f%%\n", PROF_NAMES[k], c->prof[k],
                    100.0 * c->prof[k] / total);
    }
    if (c) {
        threadpool_destroy(c->pool);
        cpu_free_huge(c->packed, c->packed_map);
        free(c->params);
        free(c->lp);
        free(c->ws);
        free(c->logits);
        free(c->sampler_scratch);
        cpu_free_huge(c->kv, c->kv_map_bytes);
        free(c);
    }
    free(b);
}

float *backend_cpu_kv_cache(Backend *b, size_t *num_floats) {
    CpuBackend *c = b->ctx;
    if (c->kv_dtype != DTYPE_F32) return NULL;
    if (num_floats) *num_floats = c->kv_floats;
    return c->kv;
}

int backend_cpu_num_threads(Backend *b) { return threadpool_size(((CpuBackend *)b->ctx)->pool); }

ThreadPool *backend_cpu_pool(Backend *b) { return ((CpuBackend *)b->ctx)->pool; }

/* ---------------------------------------------------------------- KV cache */

#define CPU_DEFAULT_KV_BYTES (2LL << 30)

/* min(2 GiB, half of MemAvailable) */
static int64_t cpu_kv_budget_bytes(Backend *b) {
    (void)b;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return CPU_DEFAULT_KV_BYTES;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    int64_t half = kb * 1024 / 2;
    return half > 0 && half < CPU_DEFAULT_KV_BYTES ? half : CPU_DEFAULT_KV_BYTES;
}

static int64_t cpu_kv_block_bytes(Backend *b, int block_size, DType dtype) {
    CpuBackend *c = b->ctx;
    return 2LL * c->layers * block_size * c->kv_dim * (int64_t)dtype_size(dtype);
}

static DType cpu_kv_default_dtype(Backend *b) {
    (void)b;
    return DTYPE_F32; /* the reference: exact f32 attention */
}

/* zeroes the task-th 2 MB of the memory at ctx */
static void prefault_job(void *ctx, int64_t task, int thread) {
    (void)thread;
    memset((char *)ctx + ((size_t)task << 21), 0, (size_t)1 << 21);
}

static int cpu_init_kv_cache(Backend *b, const KVCacheSpec *spec) {
    CpuBackend *c = b->ctx;
    if (c->kv) return cvllm_errorf(CVLLM_EINVAL, "cpu backend: KV cache already allocated");
    if (spec->dtype != DTYPE_F32 && spec->dtype != DTYPE_BF16 && spec->dtype != DTYPE_FP8_E4M3)
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "cpu backend: KV cache dtype must be f32, bf16 or fp8_e4m3");
    if (spec->num_blocks <= 0 || spec->block_size <= 0)
        return cvllm_errorf(CVLLM_EINVAL, "cpu backend: KV cache of %d blocks of %d tokens",
                            spec->num_blocks, spec->block_size);
    size_t n = 2 * (size_t)c->layers * (size_t)spec->num_blocks * (size_t)spec->block_size *
               (size_t)c->kv_dim;
    /* zeroed, in 2 MB huge pages where the kernel allows (THP "madvise" mode): attention reads
     * slot rows a page apart (one f32 row of Qwen3-0.6B is 4 KB), and with 4 KB pages every row
     * is a TLB miss and a first touch is a fault per 4 KB */
    const size_t esize = dtype_size(spec->dtype);
    size_t bytes = 0;
    void *p = cpu_alloc_huge(n * esize, &bytes);
    if (!p)
        return cvllm_errorf(CVLLM_ENOMEM, "cpu backend: cannot allocate a KV cache of %zu bytes",
                            n * esize);
    if (spec->prefault) /* every thread zeroes its share, 2 MB at a time (bytes: a multiple) */
        threadpool_run(c->pool, prefault_job, p, (int64_t)(bytes >> 21));
    c->kv = p;
    c->kv_dtype = spec->dtype;
    c->kv_map_bytes = bytes;
    c->kv_floats = n;
    c->num_blocks = spec->num_blocks;
    c->block_size = spec->block_size;
    return 0;
}

/* ---------------------------------------------------------------- forward */

/* The inputs come from the model runner, but token ids reach it from requests: everything is
 * checked, and a bad step is refused with a message instead of reading out of bounds. */
static int validate(const CpuBackend *c, const StepInputs *in) {
    if (!c->kv) return cvllm_errorf(CVLLM_EINVAL, "cpu backend: forward before init_kv_cache");
    StepLimits l = {.max_num_tokens = c->opt.max_num_tokens,
                    .max_num_seqs = c->opt.max_num_seqs,
                    .max_model_len = c->opt.max_model_len,
                    .vocab_size = c->vocab,
                    .num_blocks = c->num_blocks,
                    .block_size = c->block_size};
    return step_inputs_check(in, &l);
}

/* Charges the time since the last mark to op k (when profiling). */
static void prof_mark(CpuBackend *c, int k) {
    if (!c->profile) return;
    double t = now_seconds();
    c->prof[k] += t - c->prof_t;
    c->prof_t = t;
}

/* The per-token ops between the matmuls, one task per token on the pool (a step of 16 decode
 * tokens spent 4% of its time in them on one thread). Each token's arithmetic is the same
 * whatever thread runs it. */
typedef struct {
    CpuBackend *c;
    float *x;           /* [T, H] residual rows of the slice */
    const float *add;   /* [T, H] added to x first, or NULL */
    const float *norm;  /* rmsnorm weight: h = rmsnorm(x) * norm; NULL: no norm */
} ResidualNormJob;

static void residual_norm_job(void *ctx, int64_t t, int thread) {
    (void)thread;
    ResidualNormJob *j = ctx;
    const int H = j->c->hidden;
    float *x = j->x + t * H;
    if (j->add) {
        const float *y = j->add + t * H;
        for (int i = 0; i < H; i++) x[i] += y[i];
    }
    if (j->norm) rmsnorm_cpu(j->c->h + t * H, x, j->norm, H, j->c->cfg.rms_norm_eps);
}

/* x += add (if add); h = rmsnorm(x) * norm (if norm), over the slice's T tokens */
static void residual_norm(CpuBackend *c, float *x, const float *add, const float *norm, int T) {
    ResidualNormJob j = {c, x, add, norm};
    threadpool_run(c->pool, residual_norm_job, &j, T);
}

typedef struct {
    CpuBackend *c;
    const LayerParams *p;
    const int64_t *slots; /* the slice's slot_mapping */
    char *kc, *vc;        /* this layer's K and V cache */
} QkRopeStoreJob;

/* Qwen3's per-head q/k norms, rope, and the token's K/V into its cache slot (slot -1: already
 * cached, not written) */
static void qk_rope_store_job(void *ctx, int64_t t, int thread) {
    (void)thread;
    QkRopeStoreJob *j = ctx;
    CpuBackend *c = j->c;
    const LayerParams *p = j->p;
    const int hd = c->head_dim, half = hd / 2;
    const float eps = c->cfg.rms_norm_eps;
    float *q = c->q + t * c->q_dim, *k = c->k + t * c->kv_dim;
    if (p->q_norm) {
        for (int h = 0; h < c->heads; h++) rmsnorm_cpu(q + h * hd, q + h * hd, p->q_norm, hd, eps);
        for (int h = 0; h < c->kv_heads; h++) rmsnorm_cpu(k + h * hd, k + h * hd, p->k_norm, hd, eps);
    }
    const float *cs = c->cos_t + t * half, *sn = c->sin_t + t * half;
    rope_apply_cpu(q, c->heads, hd, cs, sn);
    rope_apply_cpu(k, c->kv_heads, hd, cs, sn);
    const int64_t slot = j->slots[t];
    if (slot < 0) return;
    const float *vt = c->v + t * c->kv_dim;
    if (c->kv_dtype == DTYPE_BF16) { /* rounded to nearest even, as torch's .to(bfloat16) */
        uint16_t *kd = (uint16_t *)j->kc + slot * c->kv_dim, *vd = (uint16_t *)j->vc + slot * c->kv_dim;
        for (int i = 0; i < c->kv_dim; i++) kd[i] = f32_to_bf16(k[i]), vd[i] = f32_to_bf16(vt[i]);
    } else if (c->kv_dtype == DTYPE_FP8_E4M3) { /* x / scale (1.0), rounded, saturated at 448 */
        uint8_t *kd = (uint8_t *)j->kc + slot * c->kv_dim, *vd = (uint8_t *)j->vc + slot * c->kv_dim;
        for (int i = 0; i < c->kv_dim; i++)
            kd[i] = f32_to_fp8_e4m3(k[i] / CPU_KV_SCALE), vd[i] = f32_to_fp8_e4m3(vt[i] / CPU_KV_SCALE);
    } else {
        memcpy((float *)j->kc + slot * c->kv_dim, k, c->kv_dim * sizeof(float));
        memcpy((float *)j->vc + slot * c->kv_dim, vt, c->kv_dim * sizeof(float));
    }
}

/* Layer l over the slice of the step's tokens t0 .. t0+T. On entry c->h holds rmsnorm(x) *
 * in_norm of the slice (computed by the previous layer's last pass, or after the embedding); on
 * return x holds the layer's output and, but after the last layer, c->h the next layer's input. */
static void layer_forward(CpuBackend *c, int l, const StepInputs *in, int t0, int T) {
    const LayerWeights *lw = &c->w->layers[l];
    const LayerParams *p = &c->lp[l];
    const int H = c->hidden, hd = c->head_dim;
    float *x = c->x + (int64_t)t0 * H; /* [T, H]: this slice's rows of the residual stream */

    /* attention block */
    MatmulPart qkv[3] = {{&lw->q_proj, p->bq, c->q, c->q_dim, p->pq},
                         {&lw->k_proj, p->bk, c->k, c->kv_dim, p->pk},
                         {&lw->v_proj, p->bv, c->v, c->kv_dim, p->pv}};
    matmul_cpu(c->pool, c->h, H, T, qkv, 3, c->xp);
    prof_mark(c, PROF_QKV);
    /* store_kvcache: this layer's K at kv[0][l], V at kv[1][l], each [slots, kv_dim] */
    const int64_t layer_elems = (int64_t)c->num_blocks * c->block_size * c->kv_dim;
    const size_t esize = dtype_size(c->kv_dtype);
    QkRopeStoreJob qj = {c, p, in->slot_mapping + t0,
                         (char *)c->kv + (int64_t)l * layer_elems * esize,
                         (char *)c->kv + ((int64_t)c->layers + l) * layer_elems * esize};
    threadpool_run(c->pool, qk_rope_store_job, &qj, T);
    prof_mark(c, PROF_ROPE_STORE);
    AttentionArgs aa = {.q = c->q, .out = c->att, .k_cache = qj.kc, .v_cache = qj.vc,
                        .kv_dtype = c->kv_dtype, .k_scale = CPU_KV_SCALE, .v_scale = CPU_KV_SCALE,
                        .num_tokens = T,
                        .n_heads = c->heads, .n_kv_heads = c->kv_heads, .head_dim = hd,
                        .block_size = c->block_size, .scale = 1.0f / sqrtf((float)hd),
                        .num_keys = c->token_keys + t0, .token_seq = c->token_seq + t0,
                        .block_tables = in->block_tables,
                        .max_blocks_per_seq = in->max_blocks_per_seq, .scratch = c->scores,
                        .scratch_stride = (int64_t)c->opt.max_model_len * c->heads};
    attention_cpu(c->pool, &aa);
    prof_mark(c, PROF_ATTENTION);
    MatmulPart o = {&lw->o_proj, p->bo, c->tmp, H, p->po};
    matmul_cpu(c->pool, c->att, c->q_dim, T, &o, 1, c->xp);
    prof_mark(c, PROF_O);

    /* MLP block */
    residual_norm(c, x, c->tmp, p->post_norm, T);
    prof_mark(c, PROF_NORMS);
    gate_up_silu_cpu(c->pool, c->h, T, &lw->gate_proj, &lw->up_proj, p->pgate, p->pup, c->g, c->u,
                     c->xp);
    prof_mark(c, PROF_GATE_UP);
    MatmulPart down = {&lw->down_proj, NULL, c->tmp, H, p->pdown};
    matmul_cpu(c->pool, c->g, c->inter, T, &down, 1, c->xp);
    prof_mark(c, PROF_DOWN);
    /* x += tmp, then (but after the last layer) the next layer's input norm, in one pass */
    residual_norm(c, x, c->tmp, l + 1 < c->layers ? c->lp[l + 1].in_norm : NULL, T);
    prof_mark(c, PROF_NORMS);
}

static int cpu_forward(Backend *b, const StepInputs *in, StepOutputs *out) {
    CpuBackend *c = b->ctx;
    int rc = validate(c, in);
    if (rc) return rc;
    const int T = in->num_tokens, H = c->hidden, half = c->head_dim / 2;
    const ModelWeights *w = c->w;
    if (c->profile) {
        c->prof_t = now_seconds();
        c->prof_steps++;
    }

    /* token t of seq s attends causally to the first seqlen_k - (q1 - 1 - t) of its keys, the
     * last new token to all of them (the contract in backend.h) */
    for (int s = 0; s < in->num_seqs; s++) {
        const int q1 = in->cu_seqlens_q[s + 1], nk = in->cu_seqlens_k[s + 1] - in->cu_seqlens_k[s];
        for (int t = in->cu_seqlens_q[s]; t < q1; t++) {
            c->token_seq[t] = s;
            c->token_keys[t] = nk - (q1 - 1 - t);
        }
    }
    float *logits = c->logits;
    /* slices in token order: a slice's attention reads the K/V the earlier ones wrote */
    for (int t0 = 0; t0 < T; t0 += c->slice) {
        const int n = T - t0 < c->slice ? T - t0 : c->slice;
        for (int t = 0; t < n; t++) {
            cpu_to_f32(c->x + (int64_t)(t0 + t) * H, w->embed_tokens.data, w->embed_tokens.dtype,
                       (int64_t)in->input_ids[t0 + t] * H, H);
            rope_cos_sin_cpu(in->positions[t0 + t], c->inv_freq, half,
                             c->cos_t + (int64_t)t * half, c->sin_t + (int64_t)t * half);
        }
        residual_norm(c, c->x + (int64_t)t0 * H, NULL, c->lp[0].in_norm, n);
        prof_mark(c, PROF_NORMS);
        for (int l = 0; l < c->layers; l++) layer_forward(c, l, in, t0, n);
    }

    /* final norm and lm_head on the wanted rows only, a slice of rows at a time */
    for (int i0 = 0; i0 < in->num_logits; i0 += c->slice) {
        const int m = in->num_logits - i0 < c->slice ? in->num_logits - i0 : c->slice;
        for (int i = 0; i < m; i++)
            rmsnorm_cpu(c->h + (int64_t)i * H, c->x + (int64_t)in->logits_indices[i0 + i] * H,
                        c->final_norm, H, c->cfg.rms_norm_eps);
        prof_mark(c, PROF_NORMS);
        MatmulPart head = {&w->lm_head, NULL, logits + (int64_t)i0 * c->vocab, c->vocab,
                           c->p_lm_head};
        matmul_cpu(c->pool, c->h, H, m, &head, 1, c->xp);
        prof_mark(c, PROF_LM_HEAD);
    }
    prof_mark(c, PROF_NORMS);
    if (out->logits)
        memcpy(out->logits, logits, (size_t)in->num_logits * c->vocab * sizeof(float));
    for (int i = 0; i < in->num_logits; i++) {
        const SamplingRow *r = &in->sampling[i];
        out->token_ids[i] = sampler_sample(logits + (int64_t)i * c->vocab, c->vocab, r,
                                           c->sampler_scratch, out->logprobs ? &out->logprobs[i] : NULL,
                                           out->top_ids ? out->top_ids + (int64_t)i * CVLLM_MAX_LOGPROBS : NULL,
                                           out->top_logprobs ? out->top_logprobs + (int64_t)i * CVLLM_MAX_LOGPROBS : NULL);
    }
    prof_mark(c, PROF_SAMPLE);
    return 0;
}

/* ---------------------------------------------------------------- registry entry */

static int cpu_probe(char *desc, size_t n) {
    snprintf(desc, n, "cpu: %ld cores, %s", sysconf(_SC_NPROCESSORS_ONLN), cpu_isa_name(cpu_isa_get()));
    return 1;
}

const BackendEntry backend_cpu_entry = {
    .name = "cpu", .create = backend_cpu_create, .probe = cpu_probe, .bench_ops = bench_cpu_ops};
