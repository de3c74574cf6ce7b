/* backend_cuda.c: the CUDA backend: the model's layer graph over one step on an NVIDIA GPU, the
 * same graph as the CPU reference (backend_cpu.c), with its kernels in *.cu next to this file:
 *
 *   x = embed[ids]                                       embedding_cuda            (x: f32)
 *   h = rmsnorm(x) * w_in                                residual_rmsnorm_cuda     (h: model dtype)
 *   per layer:  qkv = h @ [Wq; Wk; Wv]^T (+ bias)        gemm_cuda (cuBLASLt), add_bias_cuda
 *               Qwen3: q, k = rmsnorm per head; rope     qk_norm_rope_cuda (in place, f32)
 *               cache[slot_mapping[t]] = k[t], v[t]      store_kvcache_cuda (-1: not written)
 *               a = attention over the cache             attention_prefill_cuda / _decode_cuda
 *               x += a @ Wo^T (+ bo); h = rmsnorm(x)     gemm_cuda, residual_rmsnorm_cuda
 *               gu = h @ [Wg; Wu]^T                      gemm_cuda
 *               x += (silu(g) * u) @ Wd^T; h = next norm silu_mul_cuda, gemm_cuda,
 * residual_rmsnorm_cuda logits = (rmsnorm(x[logits_indices]) * w) @ lm_head^T  gather_rows_cuda,
 * residual_rmsnorm_cuda, gemm_cuda ids = sample(logits) sampler_cuda (logits stay on the GPU)
 *
 * Numbers: matrix products take the model's dtype (bf16 / f16; f32 models in exact f32) and
 * accumulate in f32 into f32 outputs, except gate/up and q/k/v, whose f32 sums are rounded to the
 * model's dtype (as transformers' bf16 nn.Linear writes them; CVLLM_CUDA_FUSE without "gu16" /
 * "qkv16": f32; q/k/v also where the model has a qkv bias); the residual stream, the q/k norms
 * and rope and the norms are f32; the KV cache holds the model's dtype by default
 * (--kv-cache-dtype auto, as vLLM on a GPU).
 *
 * Memory (all allocated at create / init_kv_cache / warmup, none in a step): the weights in one
 * device buffer, in their stored dtype, copied from the mmapped safetensors (q/k/v and gate/up
 * rows stacked so each is one product; norm vectors and biases widened to f32, kilobytes); the
 * activation workspace sized for max_num_tokens; the step's input arrays; the sampler's buffers;
 * one KV cache buffer. kv_budget_bytes runs a warm-up step at the largest batch first and
 * measures what the device then has in use.
 *
 * CUDA graphs: warmup captures the decode step (embedding .. lm_head) for batch buckets 1, 2, 4,
 * 8, then multiples of 16 up to max_num_seqs; a decode of n sequences replays the smallest bucket
 * B >= n with lanes n..B-1 padded (slot -1: nothing written; context 0: attention writes zeros;
 * their logits are not sampled). Sampling runs after the replay, outside the graph, because its
 * parameters and histories change every step. --enforce-eager: no graphs. */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/ops.h" /* rope_inv_freq_cpu: the same inverse frequencies */
#include "backend/cuda/graph_edges.h"
#include "backend/cuda/kernels.h"
#include "common.h"
#include "model/config.h"
#include "model/weights.h"
#ifdef CVLLM_HAVE_NCCL
#include "backend/cuda/tp.h"
#else
typedef struct TpGroup TpGroup; /* built without NCCL: no tensor parallelism */
#endif

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) return rc_;                                                                       \
    } while (0)

#define GEMM_WS_BYTES ((size_t)32 << 20)
#define GRAPH_RESERVE_BYTES ((int64_t)256 << 20) /* kept out of the KV budget for graphs etc. */
#define MAX_BUCKETS 64

/* CVLLM_CUDA_PROFILE=1: where a run's time goes, printed when the backend is destroyed. Each
 * forward records a CUDA event before every op (class below) and one at its end; after the step's
 * synchronization the time between consecutive events is added to the op's class, per phase
 * (prefill: any step with a sequence of several new tokens; decode: one token each). The GPU
 * stream runs the ops back to back, so the segments add up to the step's GPU time (gaps where the
 * GPU waited for a launch included in the next op). Host: the forward's wall time less its GPU
 * time (staging, launches not hidden, the synchronization), and the time between forwards (the
 * engine's scheduling and bookkeeping; the GPU idles then). A graph replay is one segment. The
 * decode steps' GPU time is also binned by the step's sequences (1, 2, 3-4, .., 129-192, 193-256,
 * more), so that a workload's share at each batch size shows. */
enum { PC_INPUTS, PC_GEMM, PC_ATTN, PC_OTHER, PC_LMHEAD, PC_GRAPH, PC_SAMPLER, PC_COMM, PC_N };
static const char *const PC_NAMES[PC_N] = {"inputs",       "matmul",   "attention",
                                           "other kernels", "lm_head",  "graph replay",
                                           "sampling",      "all-reduce/gather"};
#define PROF_MAX_EVENTS 1024
#define PROF_BINS 11
static int prof_bin_top(int i) { /* 1, 2, 4, .., 128, 192, 256, more */
    return i < 8 ? 1 << i : i == 8 ? 192 : i == 9 ? 256 : INT_MAX;
}
typedef struct {
    int on, active, n;
    cudaEvent_t ev[PROF_MAX_EVENTS];
    int cls[PROF_MAX_EVENTS];
    double gpu_ms[2][PC_N];
    double wall_s[2], between_s, t_enter, last_return;
    long long steps[2], tokens[2];
    /* decode steps by their sequences: PROF_BINS bins, bin i up to prof_bin_top(i) */
    long long bin_steps[PROF_BINS];
    double bin_ms[PROF_BINS];
} CudaProf;

typedef struct {
    const void *qkv_w;          /* [qd + 2 kvd, H] q, k, v rows stacked (adt) */
    const void *o_w;            /* [H, qd] */
    const void *gu_w;           /* [2 I, H] gate rows then up rows */
    const void *down_w;         /* [H, I] */
    float *in_norm, *post_norm; /* [H] */
    float *q_norm, *k_norm;     /* [hd] or NULL */
    float *qkv_bias;            /* [qd + 2 kvd] or NULL */
    float *o_bias;              /* [H] or NULL */
} CudaLayer;

typedef struct {
    ModelConfig cfg;
    BackendOptions opt;
    DType adt; /* the model's dtype: matrix-product inputs, default KV dtype */
    int dev, num_sms;
    char gpu_name[256];
    size_t gpu_total;
    cudaStream_t stream;
    /* this rank's share: heads, kvh, qd, kvd, qkvd, I (tensor parallelism splits them) */
    int H, heads, kvh, hd, qd, kvd, qkvd, I, V, L, Tmax, Smax, max_blocks;
    /* tensor parallelism (world 1: none): the rank's first q head, first kv head, and its
     * vocabulary rows [v0, v0 + Vr) within slices of Vs rows (the last one padded) */
    TpGroup *tp;
    int owns_tp; /* rank 0 started the group (and ends it) */
    char *msg;   /* rank 0: the step message being built */
    size_t msg_cap;
    int rank, world, q0, kv0, v0, Vs, Vr;

    void *d_weights; /* owned: every weight, carved into the fields below */
    size_t weights_bytes;
    CudaLayer *layers;           /* host array [L] of device pointers */
    const void *embed, *lm_head; /* [V, H] (the same buffer when tied) */
    float *final_norm, *inv_freq;

    void *d_ws; /* owned: the activation workspace, carved below */
    size_t ws_bytes;
    float *x;      /* [Tmax, H] residual stream */
    void *h;       /* [Tmax, H] normed input (adt) */
    float *qkv;    /* [Tmax, qkvd] f32: the qkv product's rows, or with qkv16 the normed q / k */
    void *qkv16;   /* [Tmax, qkvd] of adt: the qkv product's rows with qkv16 (else NULL) */
    void *att;     /* [Tmax, qd] attention output (adt) */
    float *tmp;    /* [Tmax, H] product outputs added to x */
    void *gu;      /* [Tmax, 2 I] of gudt */
    void *g;       /* [Tmax, I] (adt) */
    float *xl;     /* [Smax, H] rows whose logits are wanted */
    void *hl;      /* [Smax, H] (adt) */
    float *logits; /* [Smax, V] of ldt (room for f32) */
    DType ldt;     /* the logits: f32, or with CVLLM_CUDA_LOGITS=bf16 a bf16 model's own dtype
                    * on one GPU (transformers' and vLLM's rounding in a bf16 run; half the bytes
                    * lm_head writes and the sampler reads: +0.3-0.5% on the default workloads,
                    * but further from the f32 references: BENCHMARKS round 24) */
    uint16_t *h_logits16; /* logits mode: bf16 rows from the device, widened on the host */
    float *logits_shard;  /* [Smax, Vs] this rank's lm_head slice (one GPU: = logits) */
    float *logits_gather; /* rank 0 of several: [world][Smax * Vs] every rank's slice */
    void *attn_ws; /* decode partitions */
    size_t attn_ws_bytes;
    void *gemm_ws;
    CudaGemm *gemm;
    /* step inputs (device) and their pinned host staging, same layout */
    void *d_in, *h_in;
    /* h_in as the device addresses it (pinned memory is mapped: unified addressing), or NULL:
     * then the inputs go by cudaMemcpyAsync (CVLLM_CUDA_INPUTS=copy, or no mapping) */
    char *h_in_dev;
    size_t in_bytes;
    int32_t *d_ids, *d_pos, *d_cu_q, *d_ctx, *d_lidx, *d_tables, *d_order, *d_rec;
    int64_t *d_slots;
    int32_t *h_ids, *h_pos, *h_cu_q, *h_ctx, *h_lidx, *h_tables, *h_order, *h_rec;
    int order_decode; /* the decode blocks' launch order: 0 batch order, 1 longest context
                       * first, 2 that order folded, -1 the cache type's (CVLLM_CUDA_DEC_ORDER;
                       * stage_order) */
    int dec_tail;     /* a folded order: the shortest dec_tail % of the lanes last, unfolded
                       * (CVLLM_CUDA_DEC_TAIL=0..100, default 25) */
    int dec_rec;      /* with an order: the decode attention reads each launch position's facts
                       * from one record (AttentionParams.dec_rec, sent in place of the order;
                       * CVLLM_CUDA_DEC_REC=0: the order and the arrays) */
    int silu_pair;    /* one-token steps: the gate/up GEMV applies SiLU (fusion "silu"; only
                       * where gemv.cu takes the shapes and its grid is one wave:
                       * gemv_silu_pair_one_wave; set by alloc_workspace) */
    int residual_acc; /* one GPU: the o and down products add into x themselves (fusion "res") */
    DType gudt;       /* the gate/up product's output: adt (transformers' rounding of a bf16
                       * nn.Linear; half the bytes written and read back by silu_mul), or f32
                       * without fusion "gu16" */
    int fuse_qk;      /* decode steps of at most FUSE_QK_MAX_SEQS sequences (any number with
                       * GQA groups up to FUSE_QK_ANY_GROUP): the attention kernel norms,
                       * rotates and stores the raw qkv rows itself (fusion "qk";
                       * AttentionParams.positions) */
    int q16;              /* prefill steps whose attention runs on the tensor cores: the q/k
                           * kernel writes q in their 16-bit type (AttentionParams.q16; into
                           * gu, unused between the qkv and gate/up products), not in f32 back
                           * into the qkv rows (fusion "q16") */
    int qkv16_on;         /* the qkv product writes the model's 16-bit type (qkv16), as
                           * transformers' bf16 nn.Linear rounds q_proj, k_proj and v_proj; the
                           * q/k kernel and the fused decode prologue widen it (fusion "qkv16";
                           * a 16-bit model without a qkv bias) */
    uint64_t *order_keys; /* [Smax] host scratch of stage_order */
    unsigned skip;        /* op classes decode steps leave out (1 << PC_*; CVLLM_CUDA_SKIP) */
    int64_t *h_slots;
    /* sampling: rows, id histories, outputs (device + pinned host) */
    CudaSamplingRow *d_rows, *h_rows; /* d_rows: [2][Smax], a half a staging set (rows_dev) */
    int rows_mapped;                   /* CVLLM_CUDA_ROWS_MAPPED=1: the sampler reads h_rows */
    int32_t *d_hist, *h_hist;
    int64_t hist_cap;
    int32_t *d_tok, *h_tok, *d_top, *h_top;
    int32_t *d_bcast; /* tensor parallelism: rank 0's sampled ids of the step before, on every
                       * rank (asynchronous steps' pending tokens; launch_step) */
    float *d_lp, *h_lp, *d_tlp, *h_tlp;
    void *d_sampler_scratch;
    /* Asynchronous steps (cuda_submit, cuda_collect). h_in holds two staging sets of in_bytes;
     * the h_* arrays point into set `set`; each step takes the other set from the one before,
     * and set_done[k] is recorded after the last operation of the step that staged set k. */
    int set;
    cudaEvent_t set_done[2];
    /* the set whose set_done a submitted step has not recorded yet (-1: none): it is recorded
     * once the next step's input copy is enqueued (launch_step), or by the collect that waits for
     * it, so that nothing stands between a step's sampler and that copy on the stream (the copy
     * then runs during the sampler: sampler_pdl_note in sampler.cu) */
    int ev_pending;
    int *h_lpk[2];        /* per set: each logits row's num_logprobs */
    int set_rows[2];      /* per set: its step's logits rows */
    int fl_set[2], fl_head, fl_count; /* the sets of the steps submitted, not collected */
    int prev_set;         /* the set of the step staged last (-1: none yet) */

    void *d_kv; /* owned: [2, L, num_blocks, block_size, kvh, hd] of kvdt */
    DType kvdt;
    int num_blocks, block_size;
    int64_t activation_peak; /* measured by the warm-up step (bytes in use after weights) */
    int measured;

    cudaGraphExec_t graphs[MAX_BUCKETS];
    int buckets[MAX_BUCKETS], num_buckets;
    int graph_parts[MAX_BUCKETS];
    CudaProf prof;
} CudaBackend;

static void prof_mark(CudaBackend *c, int cls) {
    CudaProf *p = &c->prof;
    if (!p->active || p->n >= PROF_MAX_EVENTS) return;
    if (cudaEventRecord(p->ev[p->n], c->stream) != cudaSuccess) return;
    p->cls[p->n++] = cls;
}
#define PROF(c, k) ((c)->prof.active ? prof_mark((c), (k)) : (void)0)

static void prof_begin(CudaBackend *c) {
    CudaProf *p = &c->prof;
    if (!p->on) return;
    p->t_enter = now_seconds();
    if (p->last_return > 0) p->between_s += p->t_enter - p->last_return;
    p->active = 1;
    p->n = 0;
}

/* after the step's synchronization */
static void prof_end(CudaBackend *c, int phase, int tokens) {
    CudaProf *p = &c->prof;
    if (!p->active) return;
    double step_ms = 0;
    for (int i = 0; i + 1 < p->n; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[i], p->ev[i + 1]) == cudaSuccess)
            p->gpu_ms[phase][p->cls[i]] += ms, step_ms += ms;
    }
    if (phase == 1) {
        int b = 0;
        while (b + 1 < PROF_BINS && tokens > prof_bin_top(b))
            b++;
        p->bin_steps[b]++;
        p->bin_ms[b] += step_ms;
    }
    p->active = 0;
    p->last_return = now_seconds();
    p->wall_s[phase] += p->last_return - p->t_enter;
    p->steps[phase]++;
    p->tokens[phase] += tokens;
}

static void prof_report(CudaBackend *c) {
    CudaProf *p = &c->prof;
    if (!p->on) return;
    const char *phase[2] = {"prefill", "decode"};
    fprintf(stderr, "cvllm: cuda profile (CVLLM_CUDA_PROFILE; ms of GPU time by CUDA events):\n");
    for (int ph = 0; ph < 2; ph++) {
        double gpu = 0;
        for (int k = 0; k < PC_N; k++)
            gpu += p->gpu_ms[ph][k];
        fprintf(stderr,
                "cvllm: cuda profile: %-7s %6lld steps, %9lld tokens: wall in forward %9.1f ms = "
                "GPU %9.1f + host %8.1f\n",
                phase[ph], p->steps[ph], p->tokens[ph], p->wall_s[ph] * 1e3, gpu,
                p->wall_s[ph] * 1e3 - gpu);
        for (int k = 0; k < PC_N; k++)
            if (p->gpu_ms[ph][k] > 0)
                fprintf(stderr, "cvllm: cuda profile: %-7s   %-13s %9.1f ms (%4.1f%%)\n", phase[ph],
                        PC_NAMES[k], p->gpu_ms[ph][k],
                        gpu > 0 ? 100.0 * p->gpu_ms[ph][k] / gpu : 0.0);
    }
    for (int b = 0; b < PROF_BINS; b++) {
        if (!p->bin_steps[b]) continue;
        const int lo = b ? prof_bin_top(b - 1) + 1 : 1;
        char range[32];
        if (b + 1 < PROF_BINS)
            snprintf(range, sizeof range, "%d-%d", lo, prof_bin_top(b));
        else
            snprintf(range, sizeof range, "%d or more", lo);
        fprintf(stderr,
                "cvllm: cuda profile: decode steps of %s sequences: %5lld steps, GPU %8.1f ms "
                "(%.3f ms a step)\n",
                range, p->bin_steps[b], p->bin_ms[b], p->bin_ms[b] / p->bin_steps[b]);
    }
    fprintf(stderr,
            "cvllm: cuda profile: between forwards (the engine on the host, GPU idle): %.1f ms\n",
            p->between_s * 1e3);
}

/* ---------------------------------------------------------------- probe */

static int cuda_probe(char *desc, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
        snprintf(desc, n, "cuda: no CUDA GPU present (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        cudaGetLastError(); /* clear it */
        return 0;
    }
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        snprintf(desc, n, "cuda: cannot read the properties of GPU 0");
        return 0;
    }
    snprintf(desc, n, "cuda: %s (sm_%d%d, %d SMs, %.1f GiB)%s", p.name, p.major, p.minor,
             p.multiProcessorCount, p.totalGlobalMem / 1073741824.0,
             count > 1 ? " and more GPUs" : "");
    return 1;
}

/* ---------------------------------------------------------------- create */

static int check_matrix(const Tensor *t, const char *name, int layer, int64_t rows, int64_t cols,
                        DType adt) {
    if (!t->data || t->rows != rows || t->cols != cols)
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda backend: layer %d %s is [%lld, %lld]%s, expected "
                            "[%lld, %lld]",
                            layer, name, (long long)t->rows, (long long)t->cols,
                            t->data ? "" : " (missing)", (long long)rows, (long long)cols);
    if (t->dtype != adt)
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "cuda backend: layer %d %s is %s but the model's "
                            "matrices are %s (mixed dtypes are not supported)",
                            layer, name, dtype_name(t->dtype), dtype_name(adt));
    return 0;
}

/* Carves n bytes (256-aligned) from a buffer being laid out: pass 1 (base NULL) only counts. */
static void *carve(char *base, size_t *off, size_t n) {
    void *p = base ? base + *off : NULL;
    *off += (n + 255) / 256 * 256;
    return p;
}

/* Copies rows [row0, row0 + nrows) of a weight matrix into device memory at dst (stored dtype). */
static int upload_rows(void *dst, const Tensor *t, int64_t row0, int64_t nrows) {
    const size_t rb = (size_t)t->cols * dtype_size(t->dtype);
    CUDA_TRY(cudaMemcpy(dst, (const char *)t->data + (size_t)row0 * rb, (size_t)nrows * rb,
                        cudaMemcpyHostToDevice));
    return 0;
}

/* Copies columns [col0, col0 + ncols) of every row (a row-parallel product's input slice). */
static int upload_cols(void *dst, const Tensor *t, int64_t col0, int64_t ncols) {
    const size_t es = dtype_size(t->dtype);
    CUDA_TRY(cudaMemcpy2D(dst, (size_t)ncols * es, (const char *)t->data + (size_t)col0 * es,
                          (size_t)t->cols * es, (size_t)ncols * es, (size_t)t->rows,
                          cudaMemcpyHostToDevice));
    return 0;
}

/* n elements from offset off of a 1-D tensor, widened to f32 on the device (via host: kilobytes). */
static int upload_f32(float *dst, const Tensor *t, int64_t off, int64_t n, float *host_tmp) {
    cpu_to_f32(host_tmp, t->data, t->dtype, off, n);
    CUDA_TRY(cudaMemcpy(dst, host_tmp, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

/* The vocabulary rows [v0, v0 + Vr) of an [V, H] table, then Vs - Vr zero rows. */
static int upload_vocab(CudaBackend *c, void *dst, const Tensor *t) {
    const size_t rb = (size_t)c->H * dtype_size(c->adt);
    TRY(upload_rows(dst, t, c->v0, c->Vr));
    if (c->Vs > c->Vr)
        CUDA_TRY(cudaMemset((char *)dst + (size_t)c->Vr * rb, 0, (size_t)(c->Vs - c->Vr) * rb));
    return 0;
}

/* This rank's share of the weights (one GPU: all of them), in one device buffer:
 * q/k/v rows of its heads stacked (column-parallel), gate/up rows of its slice of the MLP, the
 * o_proj / down_proj columns of those (row-parallel: partial sums, all-reduced), its rows of the
 * embedding and lm_head (vocabulary-parallel); the norms whole. */
static int load_weights(CudaBackend *c, const ModelWeights *w) {
    const size_t es = dtype_size(c->adt);
    const int H = c->H, L = c->L, hd = c->hd;
    const int tied = w->lm_head.data == w->embed_tokens.data;
    for (int pass = 0; pass < 2; pass++) {
        char *base = c->d_weights;
        size_t off = 0;
        const void *embed = carve(base, &off, (size_t)c->Vs * H * es);
        const void *lm = tied ? embed : carve(base, &off, (size_t)c->Vs * H * es);
        float *fn = carve(base, &off, (size_t)H * 4),
              *invf = carve(base, &off, (size_t)c->hd / 2 * 4);
        for (int l = 0; l < L; l++) {
            CudaLayer *cl = &c->layers[l];
            const LayerWeights *lw = &w->layers[l];
            cl->qkv_w = carve(base, &off, (size_t)c->qkvd * H * es);
            cl->o_w = carve(base, &off, (size_t)H * c->qd * es);
            cl->gu_w = carve(base, &off, (size_t)2 * c->I * H * es);
            cl->down_w = carve(base, &off, (size_t)H * c->I * es);
            cl->in_norm = carve(base, &off, (size_t)H * 4);
            cl->post_norm = carve(base, &off, (size_t)H * 4);
            cl->q_norm = c->cfg.qk_norm ? carve(base, &off, (size_t)c->hd * 4) : NULL;
            cl->k_norm = c->cfg.qk_norm ? carve(base, &off, (size_t)c->hd * 4) : NULL;
            cl->qkv_bias = lw->q_bias.data ? carve(base, &off, (size_t)c->qkvd * 4) : NULL;
            cl->o_bias = lw->o_bias.data ? carve(base, &off, (size_t)H * 4) : NULL;
        }
        if (pass == 0) {
            c->weights_bytes = off;
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            cudaError_t e = cudaMalloc(&c->d_weights, off);
            if (e != cudaSuccess) {
                cudaGetLastError();
                return cvllm_errorf(CVLLM_ENOMEM,
                                    "cuda backend: the weights need %.2f GiB of GPU "
                                    "memory, %s has %.2f GiB free of %.2f GiB: the model does not "
                                    "fit on this GPU%s",
                                    off / 1073741824.0, c->gpu_name, fr / 1073741824.0,
                                    tot / 1073741824.0,
                                    c->world > 1 ? " (this rank's share)" : "");
            }
            continue;
        }
        c->embed = embed, c->lm_head = lm, c->final_norm = fn, c->inv_freq = invf;
    }
    /* the copies */
    int rc = 0;
    const int qkv_full = (c->cfg.num_attention_heads + 2 * c->cfg.num_key_value_heads) * hd;
    float *tmp = xmalloc((size_t)(qkv_full > H ? qkv_full : H) * sizeof(float) + 4096);
    if ((rc = upload_vocab(c, (void *)c->embed, &w->embed_tokens))) goto out;
    if (!tied && (rc = upload_vocab(c, (void *)c->lm_head, &w->lm_head))) goto out;
    if ((rc = upload_f32(c->final_norm, &w->norm, 0, H, tmp))) goto out;
    float *inv = xmalloc((size_t)c->hd / 2 * sizeof(float));
    rope_inv_freq_cpu(&c->cfg, c->hd, inv);
    cudaError_t e = cudaMemcpy(c->inv_freq, inv, (size_t)c->hd / 2 * 4, cudaMemcpyHostToDevice);
    free(inv);
    if (e != cudaSuccess) {
        rc = cuda_error(e, __FILE__, __LINE__, "inv_freq");
        goto out;
    }
    const int nq = c->heads, nkv = c->kvh; /* this rank's heads */
    for (int l = 0; l < c->L && !rc; l++) {
        const LayerWeights *lw = &w->layers[l];
        CudaLayer *cl = &c->layers[l];
        char *qkv = (char *)cl->qkv_w, *gu = (char *)cl->gu_w;
        if ((rc = upload_rows(qkv, &lw->q_proj, (int64_t)c->q0 * hd, (int64_t)nq * hd)) ||
            (rc = upload_rows(qkv + (size_t)c->qd * H * es, &lw->k_proj, (int64_t)c->kv0 * hd,
                              (int64_t)nkv * hd)) ||
            (rc = upload_rows(qkv + (size_t)(c->qd + c->kvd) * H * es, &lw->v_proj,
                              (int64_t)c->kv0 * hd, (int64_t)nkv * hd)) ||
            (rc = upload_cols((void *)cl->o_w, &lw->o_proj, (int64_t)c->q0 * hd, c->qd)) ||
            (rc = upload_rows(gu, &lw->gate_proj, (int64_t)c->rank * c->I, c->I)) ||
            (rc = upload_rows(gu + (size_t)c->I * H * es, &lw->up_proj, (int64_t)c->rank * c->I,
                              c->I)) ||
            (rc = upload_cols((void *)cl->down_w, &lw->down_proj, (int64_t)c->rank * c->I, c->I)) ||
            (rc = upload_f32(cl->in_norm, &lw->input_layernorm, 0, H, tmp)) ||
            (rc = upload_f32(cl->post_norm, &lw->post_attention_layernorm, 0, H, tmp)))
            break;
        if (cl->q_norm && ((rc = upload_f32(cl->q_norm, &lw->q_norm, 0, c->hd, tmp)) ||
                           (rc = upload_f32(cl->k_norm, &lw->k_norm, 0, c->hd, tmp))))
            break;
        if (cl->qkv_bias) {
            cpu_to_f32(tmp, lw->q_bias.data, lw->q_bias.dtype, (int64_t)c->q0 * hd, c->qd);
            cpu_to_f32(tmp + c->qd, lw->k_bias.data, lw->k_bias.dtype, (int64_t)c->kv0 * hd,
                       c->kvd);
            cpu_to_f32(tmp + c->qd + c->kvd, lw->v_bias.data, lw->v_bias.dtype,
                       (int64_t)c->kv0 * hd, c->kvd);
            e = cudaMemcpy(cl->qkv_bias, tmp, (size_t)c->qkvd * 4, cudaMemcpyHostToDevice);
            if (e != cudaSuccess) rc = cuda_error(e, __FILE__, __LINE__, "qkv bias");
        }
        if (!rc && cl->o_bias) rc = upload_f32(cl->o_bias, &lw->o_bias, 0, H, tmp);
    }
out:
    free(tmp);
    return rc;
}

#define FUSE_QK_MAX_SEQS 16 /* decode steps the qk fusion takes at any GQA group size */
#define FUSE_QK_ANY_GROUP 2 /* GQA groups (query heads per kv head) it takes at any batch */

/* Whether the comma-separated list e names `name`. */
static int list_has(const char *e, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = e; *p;) {
        const char *q = strchr(p, ',');
        const size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        p = q ? q + 1 : p + len;
    }
    return 0;
}

/* Whether the fusion named `name` is on: CVLLM_CUDA_FUSE unset or 1: every one; 0: none; else a
 * comma-separated list of the ones on ("silu": the gate/up GEMV with SiLU at one token; "qk": the
 * q/k norm, rope and K/V store inside the decode attention kernel; "gu16": the gate/up product
 * writes the model's dtype for silu_mul, not f32; "res": on one GPU the o and down products add
 * into the residual stream (cuBLASLt's beta 1), not into tmp for the norm to add; "q16": a
 * prefill's q written in the tensor-core attention's 16-bit type; "qkv16": the qkv product
 * writes the model's 16-bit type, as transformers' bf16 q/k/v_proj round it, read widened by the
 * q/k kernel and the fused decode prologue: half the bytes written and read back). */
static int fusion_on(const char *name) {
    const char *e = getenv("CVLLM_CUDA_FUSE");
    if (!e || !*e || strcmp(e, "1") == 0) return 1;
    if (strcmp(e, "0") == 0) return 0;
    return list_has(e, name);
}

/* CVLLM_CUDA_SKIP (measuring only: the outputs are wrong): a comma-separated list of the op
 * classes a decode step's layers leave out, "attn" (the attention kernels), "gemm" (the matrix
 * products) and "other" (norms, activation, bias, rope), so that a graph replay's time can be
 * split by class: the whole step's less the step's without a class. The number of steps a run
 * takes does not change (bench throughput ignores end-of-sequence tokens). */
static unsigned skip_classes(void) {
    const char *e = getenv("CVLLM_CUDA_SKIP");
    if (!e || !*e) return 0;
    const unsigned m = (list_has(e, "attn") ? 1u << PC_ATTN : 0) |
                       (list_has(e, "gemm") ? 1u << PC_GEMM : 0) |
                       (list_has(e, "other") ? 1u << PC_OTHER : 0);
    if (m)
        fprintf(stderr,
                "cvllm: cuda: CVLLM_CUDA_SKIP=%s: decode steps leave these ops out; their "
                "outputs are wrong (measuring only)\n",
                e);
    return m;
}

/* Carves the step-input arrays out of base (NULL: only counts), the device's (dev) or a host
 * staging set; returns their bytes. */
static size_t carve_inputs(CudaBackend *c, char *base, int dev) {
    const size_t T = (size_t)c->Tmax, S = (size_t)c->Smax;
    size_t off = 0;
    int32_t *ids = carve(base, &off, T * 4), *pos = carve(base, &off, T * 4);
    int64_t *slots = carve(base, &off, T * 8);
    int32_t *cu = carve(base, &off, (S + 1) * 4), *ctx = carve(base, &off, S * 4),
            *lidx = carve(base, &off, S * 4);
    int32_t *tables = carve(base, &off, S * (size_t)c->max_blocks * 4);
    CudaSamplingRow *rows = carve(base, &off, 2 * S * sizeof(CudaSamplingRow)); /* rows_dev */
    int32_t *hist = carve(base, &off, (size_t)c->hist_cap * 4);
    const size_t tops = S * CUDA_SAMPLER_MAX_LOGPROBS * 4;
    int32_t *tok = carve(base, &off, S * 4), *top = carve(base, &off, tops);
    float *lp = carve(base, &off, S * 4), *tlp = carve(base, &off, tops);
    int32_t *order = carve(base, &off, S * 4), *bcast = carve(base, &off, S * 4);
    int32_t *rec = carve(base, &off, S * DEC_REC_INTS * 4);
    if (!base) return off;
    if (dev) {
        c->d_ids = ids, c->d_pos = pos, c->d_slots = slots, c->d_cu_q = cu, c->d_ctx = ctx;
        c->d_lidx = lidx, c->d_tables = tables, c->d_rows = rows, c->d_hist = hist;
        c->d_tok = tok, c->d_top = top, c->d_lp = lp, c->d_tlp = tlp, c->d_order = order;
        c->d_bcast = bcast, c->d_rec = rec;
    } else {
        (void)bcast;
        c->h_ids = ids, c->h_pos = pos, c->h_slots = slots, c->h_cu_q = cu, c->h_ctx = ctx;
        c->h_lidx = lidx, c->h_tables = tables, c->h_rows = rows, c->h_hist = hist;
        c->h_tok = tok, c->h_top = top, c->h_lp = lp, c->h_tlp = tlp, c->h_order = order;
        c->h_rec = rec;
    }
    return off;
}

/* Where host array h of the current staging set lies in set k. */
static const void *in_set(const CudaBackend *c, const void *h, int k) {
    return (const char *)h + (ptrdiff_t)(k - c->set) * (ptrdiff_t)c->in_bytes;
}

/* The staging set the step staged last did not use: the one a new step takes (its step before
 * may still be running on the other). */
static int free_set(const CudaBackend *c) { return c->prev_set >= 0 ? 1 - c->prev_set : 0; }

/* Points the h_* arrays at host staging set k. */
static void staging_use(CudaBackend *c, int k) {
    c->set = k;
    carve_inputs(c, (char *)c->h_in + (size_t)k * c->in_bytes, 0);
}

/* The activation workspace, the step inputs and the sampler's buffers (device and pinned). */
static int alloc_workspace(CudaBackend *c) {
    {
        const char *e = getenv("CVLLM_CUDA_DEC_ORDER");
        const int v = e && *e ? atoi(e) : -1;
        c->order_decode = !e || !*e ? -1 : v >= 0 && v <= 2 ? v : 1;
    }
    c->dec_rec = cuda_env_flag("CVLLM_CUDA_DEC_REC", 1);
    c->rows_mapped = cuda_env_flag("CVLLM_CUDA_ROWS_MAPPED", 0);
    {
        const char *e = getenv("CVLLM_CUDA_DEC_TAIL");
        const int v = e && *e ? atoi(e) : 25;
        c->dec_tail = v < 0 ? 0 : v > 100 ? 100 : v;
    }
    c->order_keys = xmalloc((size_t)c->Smax * sizeof *c->order_keys);
    const size_t T = (size_t)c->Tmax, S = (size_t)c->Smax, es = dtype_size(c->adt);
    /* a bias is added to the f32 sums before transformers rounds them: those models keep f32 */
    c->qkv16_on = fusion_on("qkv16") && (c->adt == DTYPE_BF16 || c->adt == DTYPE_F16);
    for (int l = 0; l < c->L; l++)
        if (c->layers[l].qkv_bias) c->qkv16_on = 0;
    /* decode attention partitions: S * parts stays below S + 4 * SMs (attention_decode_num_parts
     * gives a sequence more than one partition only while the grid is small) */
    /* the cache's dtype is not known yet: the largest over each kernel's choice */
    const DType kvdts[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_FP8_E4M3};
    for (int s = 1; s <= c->Smax; s++)
        for (int d = 0; d < 8; d++) { /* d >= 4: the cache's rows known (the TMA kernel) */
            AttentionParams p = {.n_heads = c->heads,
                                 .n_kv_heads = c->kvh,
                                 .hd = c->hd,
                                 .kvdt = kvdts[d % 4],
                                 .block_size = c->opt.block_size,
                                 .cache_rows = d / 4,
                                 .num_seqs = s,
                                 .max_seqlen_k = c->opt.max_model_len};
            int parts = attention_decode_num_parts(&p, c->num_sms);
            size_t b = attention_decode_ws_bytes(s, c->heads, c->hd, parts);
            if (b > c->attn_ws_bytes) c->attn_ws_bytes = b;
        }
    for (int pass = 0; pass < 2; pass++) {
        char *base = c->d_ws;
        size_t off = 0;
        c->x = carve(base, &off, T * c->H * 4);
        c->h = carve(base, &off, T * c->H * es);
        c->qkv = carve(base, &off, T * c->qkvd * 4);
        c->qkv16 = c->qkv16_on ? carve(base, &off, T * c->qkvd * es) : NULL;
        c->att = carve(base, &off, T * c->qd * es);
        c->tmp = carve(base, &off, T * c->H * 4);
        c->gu = carve(base, &off, T * 2 * c->I * 4);
        c->g = carve(base, &off, T * c->I * es);
        c->xl = carve(base, &off, S * c->H * 4);
        c->hl = carve(base, &off, S * c->H * es);
        c->logits = carve(base, &off, S * c->V * 4);
        c->logits_shard = c->world > 1 ? carve(base, &off, S * c->Vs * 4) : c->logits;
        c->logits_gather =
            c->world > 1 && c->rank == 0 ? carve(base, &off, (size_t)c->world * S * c->Vs * 4) : NULL;
        c->attn_ws = carve(base, &off, c->attn_ws_bytes);
        c->gemm_ws = carve(base, &off, GEMM_WS_BYTES);
        c->d_sampler_scratch = carve(base, &off, sampler_cuda_scratch_bytes(c->Smax, c->V));
        if (pass == 0) {
            c->ws_bytes = off;
            cudaError_t e = cudaMalloc(&c->d_ws, off);
            if (e != cudaSuccess) {
                cudaGetLastError();
                return cvllm_errorf(CVLLM_ENOMEM,
                                    "cuda backend: the activation workspace for %d "
                                    "tokens needs %.2f GiB of GPU memory that is not there; lower "
                                    "--max-num-batched-tokens / --max-num-seqs",
                                    c->Tmax, off / 1073741824.0);
            }
        }
    }
    CUDA_TRY(cudaMemset(c->d_sampler_scratch, 0, sampler_cuda_scratch_bytes(c->Smax, c->V)));
    {
        const char *le = getenv("CVLLM_CUDA_LOGITS");
        c->ldt = c->world == 1 && c->adt == DTYPE_BF16 && le && !strcmp(le, "bf16") ? DTYPE_BF16
                                                                                    : DTYPE_F32;
    }
    c->fuse_qk = fusion_on("qk");
    c->q16 = fusion_on("q16");
    c->gudt = fusion_on("gu16") ? c->adt : DTYPE_F32;
    c->residual_acc = fusion_on("res");
    c->skip = skip_classes();
    c->silu_pair = fusion_on("silu") &&
                   gemv_cuda_supported(c->adt, 1, c->H, c->h, c->layers[0].gu_w) &&
                   gemv_silu_pair_one_wave(c->adt, c->I, c->num_sms);
    /* step inputs: the same layout on both sides, so each array is one copy; two host sets,
     * so that a step can be staged while the one before still reads its set (cuda_submit) */
    c->hist_cap = (int64_t)c->Smax * (c->opt.max_model_len + 1);
    c->in_bytes = carve_inputs(c, NULL, 0);
    cudaError_t e = cudaMalloc(&c->d_in, c->in_bytes);
    if (e == cudaSuccess) e = cudaMallocHost(&c->h_in, 2 * c->in_bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cvllm_errorf(CVLLM_ENOMEM,
                            "cuda backend: %.1f MiB of step buffers cannot be allocated",
                            3 * c->in_bytes / 1048576.0);
    }
    carve_inputs(c, c->d_in, 1);
    staging_use(c, 0);
    const char *ie = getenv("CVLLM_CUDA_INPUTS");
    void *dp = NULL;
    if (!(ie && strcmp(ie, "copy") == 0) &&
        cudaHostGetDevicePointer(&dp, c->h_in, 0) == cudaSuccess)
        c->h_in_dev = dp;
    cudaGetLastError();
    for (int k = 0; k < 2; k++) {
        c->h_lpk[k] = xmalloc((size_t)c->Smax * sizeof(int));
        CUDA_TRY(cudaEventCreateWithFlags(&c->set_done[k], cudaEventDisableTiming));
    }
    c->prev_set = -1;
    c->ev_pending = -1;
    return gemm_create(&c->gemm, c->gemm_ws, GEMM_WS_BYTES);
}

static int cuda_forward(Backend *b, const StepInputs *in, StepOutputs *out);
static int cuda_submit(Backend *b, const StepInputs *in);
static int cuda_collect(Backend *b, StepOutputs *out);
static int64_t cuda_kv_block_bytes(Backend *b, int block_size, DType dtype);
static DType cuda_kv_default_dtype(Backend *b);
static int64_t cuda_kv_budget_bytes(Backend *b);
static int cuda_init_kv_cache(Backend *b, const KVCacheSpec *spec);
static int cuda_warmup(Backend *b);
static int64_t cuda_kv_budget_all(Backend *b);
static int cuda_init_kv_cache_all(Backend *b, const KVCacheSpec *spec);
static int cuda_warmup_all(Backend *b);
static void cuda_destroy(Backend *b);

/* What rank 0 sends each worker in TP_MSG_CREATE (then the model folder's path). */
typedef struct {
    int32_t max_num_tokens, max_num_seqs, max_model_len, block_size, enforce_eager, tp_size;
    double gpu_memory_utilization;
} TpWireCreate;

/* Can the model be split over world ranks? (heads, MLP, vocabulary; KV heads split, or
 * replicated when fewer than the ranks) */
static int tp_shape_check(const ModelConfig *cfg, int world) {
    if (world == 1) return 0;
    const int kvh = cfg->num_key_value_heads;
    if (cfg->num_attention_heads % world || (kvh % world && world % kvh) ||
        cfg->intermediate_size % world || cfg->vocab_size < world)
        return cvllm_errorf(CVLLM_EINVAL,
                            "tensor parallel size %d does not divide this model: %d heads, %d kv "
                            "heads, intermediate size %d (the heads and the intermediate size must "
                            "be multiples of it, and the kv heads a multiple or a divisor)",
                            world, cfg->num_attention_heads, kvh, cfg->intermediate_size);
#ifndef CVLLM_HAVE_NCCL
    return cvllm_errorf(CVLLM_EUNSUPPORTED,
                        "cuda backend: tensor parallelism needs NCCL, which this build lacks");
#endif
    return 0;
}

static int cuda_create_rank(const ModelConfig *cfg, const ModelWeights *w, const BackendOptions *o,
                            TpGroup *g, Backend **out);

static int backend_cuda_create(const ModelConfig *cfg, const ModelWeights *w,
                               const BackendOptions *o, Backend **out) {
    return cuda_create_rank(cfg, w, o, NULL, out);
}

/* Creates rank o->tp_rank's backend. Rank 0 of several starts the group (the workers get their
 * CREATE message and load their own share meanwhile); a worker passes its joined group g. */
static int cuda_create_rank(const ModelConfig *cfg, const ModelWeights *w, const BackendOptions *o,
                            TpGroup *g, Backend **out) {
    *out = NULL;
    char desc[256];
    if (!cuda_probe(desc, sizeof desc)) return cvllm_errorf(CVLLM_EBACKEND, "%s", desc);
    const int world = o->tp_size > 1 ? o->tp_size : 1, rank = world > 1 ? o->tp_rank : 0;
    if (world > 1) {
        int n = 0;
        cudaGetDeviceCount(&n);
        if (o->tp_local_ranks <= 0 && n < world && rank == 0)
            return cvllm_errorf(CVLLM_EINVAL,
                                "tensor parallel size %d needs %d GPUs; this machine has %d", world,
                                world, n);
    }
    int rc = tp_shape_check(cfg, world);
    if (rc) return rc;
    if (o->max_num_tokens <= 0 || o->max_num_seqs <= 0 || o->max_model_len <= 0 ||
        o->block_size <= 0)
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda backend: max_num_tokens %d, max_num_seqs %d, "
                            "max_model_len %d, block_size %d must all be positive",
                            o->max_num_tokens, o->max_num_seqs, o->max_model_len, o->block_size);
    if (cfg->num_key_value_heads <= 0 || cfg->num_attention_heads % cfg->num_key_value_heads ||
        !attention_cuda_supported(cfg->head_dim))
        return cvllm_errorf(
            CVLLM_EUNSUPPORTED,
            "cuda backend: %d heads, %d kv heads, head_dim %d "
            "(need heads a multiple of kv heads and an even head_dim of at most 256)",
            cfg->num_attention_heads, cfg->num_key_value_heads, cfg->head_dim);
    const DType adt = w->embed_tokens.dtype;
    const int H = cfg->hidden_size, hd = cfg->head_dim, qd = cfg->num_attention_heads * hd,
              kvd = cfg->num_key_value_heads * hd, I = cfg->intermediate_size;
    if (w->embed_tokens.rows != cfg->vocab_size || w->embed_tokens.cols != H ||
        w->lm_head.rows != cfg->vocab_size || w->lm_head.cols != H || !w->norm.data ||
        w->lm_head.dtype != adt)
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda backend: embed/lm_head/norm do not match the config");
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        const LayerWeights *lw = &w->layers[l];
        if ((rc = check_matrix(&lw->q_proj, "q_proj", l, qd, H, adt)) ||
            (rc = check_matrix(&lw->k_proj, "k_proj", l, kvd, H, adt)) ||
            (rc = check_matrix(&lw->v_proj, "v_proj", l, kvd, H, adt)) ||
            (rc = check_matrix(&lw->o_proj, "o_proj", l, H, qd, adt)) ||
            (rc = check_matrix(&lw->gate_proj, "gate_proj", l, I, H, adt)) ||
            (rc = check_matrix(&lw->up_proj, "up_proj", l, I, H, adt)) ||
            (rc = check_matrix(&lw->down_proj, "down_proj", l, H, I, adt)))
            return rc;
        if (cfg->qk_norm && (!lw->q_norm.data || !lw->k_norm.data))
            return cvllm_errorf(CVLLM_EINVAL, "cuda backend: layer %d lacks q_norm/k_norm", l);
        if (!!lw->q_bias.data != !!lw->k_bias.data || !!lw->q_bias.data != !!lw->v_bias.data)
            return cvllm_errorf(CVLLM_EINVAL, "cuda backend: layer %d has some q/k/v biases only",
                                l);
    }
    CudaBackend *c = xcalloc(1, sizeof *c);
    c->cfg = *cfg;
    c->opt = *o;
    c->adt = adt;
    c->dev = o->device_id;
    /* this rank's share (see load_weights) */
    const int kvh = cfg->num_key_value_heads;
    c->rank = rank, c->world = world;
    c->H = H, c->hd = hd, c->V = cfg->vocab_size;
    c->heads = cfg->num_attention_heads / world;
    c->kvh = kvh >= world ? kvh / world : 1;
    c->q0 = rank * c->heads;
    c->kv0 = kvh >= world ? rank * c->kvh : rank / (world / kvh); /* replicated: ranks share one */
    c->qd = c->heads * hd, c->kvd = c->kvh * hd, c->qkvd = c->qd + 2 * c->kvd, c->I = I / world;
    c->Vs = (c->V + world - 1) / world;
    c->v0 = rank * c->Vs;
    c->Vr = c->V - c->v0 < c->Vs ? c->V - c->v0 : c->Vs;
    c->tp = g;
    c->L = cfg->num_hidden_layers;
    c->Tmax = o->max_num_tokens, c->Smax = o->max_num_seqs;
    c->max_blocks = (o->max_model_len + o->block_size - 1) / o->block_size;
    c->layers = xcalloc((size_t)c->L, sizeof(CudaLayer));
    Backend *b = xcalloc(1, sizeof *b);
    b->name = "cuda";
    b->ctx = c;
    b->forward = cuda_forward;
    b->kv_block_bytes = cuda_kv_block_bytes;
    b->kv_default_dtype = cuda_kv_default_dtype;
    b->kv_budget_bytes = cuda_kv_budget_all;
    b->init_kv_cache = cuda_init_kv_cache_all;
    b->warmup = cuda_warmup_all;
    b->destroy = cuda_destroy;

    double t0 = now_seconds();
#ifdef CVLLM_HAVE_NCCL
    if (world > 1 && rank == 0) { /* start the workers: they load their shares meanwhile */
        if ((rc = tp_group_start(&c->tp, world, o->tp_addr, o->tp_local_ranks, 120.0,
                                 o->verbose)))
            goto fail;
        c->owns_tp = 1;
        TpWireCreate wc = {.max_num_tokens = o->max_num_tokens,
                           .max_num_seqs = o->max_num_seqs,
                           .max_model_len = o->max_model_len,
                           .block_size = o->block_size,
                           .enforce_eager = o->enforce_eager,
                           .tp_size = world,
                           .gpu_memory_utilization = o->gpu_memory_utilization};
        const char *dir = o->model_dir ? o->model_dir : "";
        if ((rc = tp_send_all(c->tp, TP_MSG_CREATE, &wc, sizeof wc, dir, strlen(dir) + 1)))
            goto fail;
    }
#endif
    cudaError_t e = cudaSetDevice(c->dev);
    struct cudaDeviceProp prop;
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, c->dev);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        rc = cuda_error(e, __FILE__, __LINE__, "GPU set-up");
        goto fail;
    }
    snprintf(c->gpu_name, sizeof c->gpu_name, "%s", prop.name);
    c->num_sms = prop.multiProcessorCount;
    c->gpu_total = prop.totalGlobalMem;
    if (cuda_env_flag("CVLLM_CUDA_PROFILE", 0)) {
        c->prof.on = 1;
        for (int i = 0; i < PROF_MAX_EVENTS; i++)
            if (cudaEventCreate(&c->prof.ev[i]) != cudaSuccess) {
                c->prof.on = 0;
                break;
            }
    }
    if ((rc = load_weights(c, w))) goto fail;
    double t1 = now_seconds();
    if ((rc = alloc_workspace(c))) goto fail;
    if (c->h_in_dev && !c->prof.on) { /* profiles time whole steps, one at a time */
        b->submit = cuda_submit;
        b->collect = cuda_collect;
    }
#ifdef CVLLM_HAVE_NCCL
    if (world > 1) { /* every rank at once; then rank 0 hears that the others are ready */
        if ((rc = tp_nccl_init(c->tp, c->dev))) goto fail;
        if (rank == 0 && (rc = tp_gather_replies(c->tp, 0, NULL))) goto fail;
        if (o->verbose && rank == 0)
            fprintf(stderr,
                    "cvllm: cuda: tensor parallel over %d GPUs: each rank %d of %d heads, %d of %d "
                    "kv heads%s, %d of %d MLP rows, %d vocabulary rows (%.2f s)\n",
                    world, c->heads, cfg->num_attention_heads, c->kvh, kvh,
                    kvh < world ? " (replicated)" : "", c->I, I, c->Vs, now_seconds() - t0);
    }
#endif
    if (o->verbose)
        fprintf(stderr,
                "cvllm: cuda: %s; weights %.1f MiB (%s) uploaded in %.2f s; workspace "
                "%.1f MiB for %d tokens, %d sequences (%.2f s)\n",
                c->gpu_name, c->weights_bytes / 1048576.0, dtype_name(adt), t1 - t0,
                c->ws_bytes / 1048576.0, c->Tmax, c->Smax, now_seconds() - t1);
    *out = b;
    return 0;
fail:
    cuda_destroy(b);
    return rc;
}

static void cuda_destroy(Backend *b) {
    if (!b) return;
    CudaBackend *c = b->ctx;
#ifdef CVLLM_HAVE_NCCL
    /* a rank lost mid-step: if a kernel still waits on it, freeing would wait forever too;
     * the memory goes with the process */
    if (c && c->tp && tp_failed(c->tp) && c->stream &&
        cudaStreamQuery(c->stream) == cudaErrorNotReady) {
        if (c->owns_tp) tp_group_close(c->tp);
        free(c->layers);
        free(c->order_keys);
        free(c->h_logits16);
        free(c);
        free(b);
        return;
    }
#endif
    if (c) {
        prof_report(c);
        for (int i = 0; i < PROF_MAX_EVENTS && c->prof.on; i++)
            if (c->prof.ev[i]) cudaEventDestroy(c->prof.ev[i]);
        /* the graphs first: they hold the NCCL communicator, which cannot be freed before */
        for (int i = 0; i < c->num_buckets; i++)
            if (c->graphs[i]) cudaGraphExecDestroy(c->graphs[i]);
#ifdef CVLLM_HAVE_NCCL
        if (c->tp && c->owns_tp) tp_group_close(c->tp); /* the workers exit (or are ended) */
#endif
        c->tp = NULL;
        gemm_destroy(c->gemm);
        free(c->msg);
        cudaFree(c->d_weights);
        cudaFree(c->d_ws);
        cudaFree(c->d_in);
        cudaFreeHost(c->h_in);
        for (int k = 0; k < 2; k++) {
            free(c->h_lpk[k]);
            if (c->set_done[k]) cudaEventDestroy(c->set_done[k]);
        }
        cudaFree(c->d_kv);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c->layers);
        free(c->order_keys);
        free(c->h_logits16);
        free(c);
    }
    free(b);
}

/* ---------------------------------------------------------------- the model over one step */

/* What one launch of the model needs beyond the device input arrays. */
typedef struct {
    int T, S;         /* tokens, sequences (a graph: the bucket's lanes) */
    int max_q, max_k; /* bounds for the attention grids */
    int num_logits;   /* rows of d_lidx whose logits are computed */
    int decode;       /* every sequence has one new token: the paged decode kernel */
    int parts;        /* decode partitions (0: chosen from max_k) */
    const void *kv;   /* the KV cache to use (the warm-up uses a scratch one) */
    int num_blocks;
} ModelLaunch;

/* Waits for the stream (several ranks: watching the others, so that a lost rank is an error). */
static int sync_stream(CudaBackend *c) {
#ifdef CVLLM_HAVE_NCCL
    if (c->tp) return tp_stream_wait(c->tp, c->stream);
#endif
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    return 0;
}

/* Tensor parallelism: the sum over the ranks of n floats, in place (stream-ordered). */
static int tp_reduce(CudaBackend *c, float *buf, size_t n) {
#ifdef CVLLM_HAVE_NCCL
    PROF(c, PC_COMM);
    return tp_all_reduce_sum(c->tp, buf, n, c->stream);
#else
    (void)c, (void)buf, (void)n;
    return cvllm_errorf(CVLLM_EUNSUPPORTED, "cuda backend: built without NCCL");
#endif
}

/* Tensor parallelism: every rank's [n, Vs] logits slice to rank 0, as [n, V] rows in c->logits. */
static int tp_gather_logits(CudaBackend *c, int n) {
#ifdef CVLLM_HAVE_NCCL
    PROF(c, PC_COMM);
    TRY(tp_gather_to_root(c->tp, c->logits_shard, c->logits_gather, (size_t)n * c->Vs, c->stream));
    if (c->rank == 0)
        TRY(vocab_shards_to_rows_cuda(c->logits, c->logits_gather, n, c->V, c->Vs, c->world,
                                      c->stream));
    return 0;
#else
    (void)c, (void)n;
    return cvllm_errorf(CVLLM_EUNSUPPORTED, "cuda backend: built without NCCL");
#endif
}

/* Enqueues embedding .. lm_head on c->stream (no host synchronization: a graph captures it). */
static int run_model(CudaBackend *c, const ModelLaunch *m) {
    cudaStream_t st = c->stream;
    const int T = m->T, H = c->H;
    const float eps = c->cfg.rms_norm_eps;
    const size_t layer_elems = (size_t)m->num_blocks * c->block_size * c->kvd;
    const size_t kes = dtype_size(c->kvdt);
    const unsigned skip = m->decode ? c->skip : 0;
/* an op of class cls, unless a decode step leaves that class out (CVLLM_CUDA_SKIP) */
#define RUN(cls, call)                                                                             \
    do {                                                                                           \
        if (!((skip >> (cls)) & 1u)) TRY(call);                                                   \
    } while (0)
    PROF(c, PC_OTHER);
    TRY(embedding_cuda(c->x, c->embed, c->adt, c->d_ids, T, H, c->v0, c->Vr, st));
    if (c->tp) TRY(tp_reduce(c, c->x, (size_t)T * H));
    TRY(residual_rmsnorm_cuda(c->x, NULL, c->layers[0].in_norm, c->h, c->adt, T, H, eps, st));
    AttentionParams ap = {.q = c->qkv,
                          .ldq = c->qkvd,
                          .out = c->att,
                          .adt = c->adt,
                          .kvdt = c->kvdt,
                          .k_scale = 1.0f, /* fp8: vLLM's scales without calibration */
                          .v_scale = 1.0f,
                          .n_heads = c->heads,
                          .n_kv_heads = c->kvh,
                          .hd = c->hd,
                          .block_size = c->block_size,
                          .cache_rows = (int64_t)m->num_blocks * c->block_size,
                          .scale = 1.0f / sqrtf((float)c->hd),
                          .num_seqs = m->S,
                          .cu_seqlens_q = c->d_cu_q,
                          .context_lens = c->d_ctx,
                          .block_tables = c->d_tables,
                          .max_blocks_per_seq = c->max_blocks,
                          .max_seqlen_q = m->max_q,
                          .max_seqlen_k = m->max_k,
                          .seq_order =
                              m->decode && c->order_decode && !c->dec_rec ? c->d_order : NULL,
                          .dec_rec = m->decode && c->order_decode && c->dec_rec ? c->d_rec : NULL};
    const int pair = T == 1 && c->silu_pair;
    /* at most FUSE_QK_MAX_SEQS sequences: there the separate launch is a latency of its own
     * (batch-1 decode +1.3%); at large batches each attention block's prologue delays its K/V
     * stream instead where a block has 4 query heads (qwen3-8b, default workload: 5,735 fused
     * vs 5,844 tok/s), but not with up to 2 (GQA groups of 1 or 2: a warp a head, one round;
     * qwen3-0.6b's default workload 21,707 / 21,688 fused vs 21,546 / 21,559; H200,
     * 2026-11-23) */
    const int fuse_qk = m->decode && c->fuse_qk &&
                        (m->S <= FUSE_QK_MAX_SEQS || c->heads / c->kvh <= FUSE_QK_ANY_GROUP);
    if (fuse_qk) {
        ap.positions = c->d_pos;
        ap.slots = c->d_slots;
        ap.inv_freq = c->inv_freq;
        ap.eps = eps;
    }
    /* a prefill on the tensor-core attention: q in its 16-bit type, in gu (T x 2I x 4 bytes) */
    if (!m->decode && c->q16 && 4 * (int64_t)c->I >= c->qd) {
        ap.q16 = c->gu;
        ap.ldq16 = c->qd;
        if (!attention_prefill_uses_tc(&ap)) ap.q16 = NULL, ap.ldq16 = 0;
    }
    /* the qkv product in the model's 16-bit type, unless a prefill's q16 is of another (a bf16
     * model over an f16 cache): the q/k kernel reads its rows and writes q16 of their type */
    const int qkv16 = c->qkv16_on && !(ap.q16 && attention_prefill_tc_dtype(&ap) != c->adt);
    if (qkv16 && fuse_qk) ap.qkv16 = c->qkv16, ap.qkv16dt = c->adt;
    int parts = m->parts;
    if (m->decode && parts <= 0) parts = attention_decode_num_parts(&ap, c->num_sms);
    for (int l = 0; l < c->L; l++) {
        const CudaLayer *cl = &c->layers[l];
        char *kc = (char *)m->kv + (size_t)l * layer_elems * kes;
        char *vc = (char *)m->kv + (size_t)(c->L + l) * layer_elems * kes;
        PROF(c, PC_GEMM);
        if (qkv16)
            RUN(PC_GEMM, gemm_cuda_to(c->gemm, c->qkv16, c->adt, c->qkvd, c->h, cl->qkv_w, c->adt,
                                      T, c->qkvd, H, st));
        else
            RUN(PC_GEMM,
                gemm_cuda(c->gemm, c->qkv, c->qkvd, c->h, cl->qkv_w, c->adt, T, c->qkvd, H, st));
        PROF(c, PC_OTHER);
        if (cl->qkv_bias)
            RUN(PC_OTHER, add_bias_cuda(c->qkv, c->qkvd, cl->qkv_bias, T, c->qkvd, st));
        if (fuse_qk) { /* the decode kernel norms, rotates and stores (AttentionParams) */
            ap.q_norm = cl->q_norm;
            ap.k_norm = cl->k_norm;
        } else {
            RUN(PC_OTHER, qk_norm_rope_store_cuda(c->qkv, c->qkvd, qkv16 ? c->qkv16 : NULL, c->adt,
                                                  c->d_pos, c->inv_freq, cl->q_norm, cl->k_norm, T,
                                                  c->heads, c->kvh, c->hd, eps, kc, vc, c->kvdt,
                                                  1.0f, 1.0f, c->d_slots, (void *)ap.q16,
                                                  attention_prefill_tc_dtype(&ap), ap.ldq16, st));
        }
        ap.k_cache = kc;
        ap.v_cache = vc;
        PROF(c, PC_ATTN);
        if (m->decode)
            RUN(PC_ATTN, attention_decode_cuda(&ap, parts, c->attn_ws, st));
        else
            TRY(attention_prefill_cuda(&ap, st));
        PROF(c, PC_GEMM);
        /* o and down add into the residual stream x themselves (gemm_cuda_acc), except where
         * the ranks' partial sums must be reduced first or a bias added: there they go through
         * tmp and the norm adds them */
        const int o_acc = c->residual_acc && !c->tp && !cl->o_bias;
        if (o_acc)
            RUN(PC_GEMM, gemm_cuda_acc(c->gemm, c->x, H, c->att, cl->o_w, c->adt, T, H, c->qd, st));
        else
            RUN(PC_GEMM, gemm_cuda(c->gemm, c->tmp, H, c->att, cl->o_w, c->adt, T, H, c->qd, st));
        if (c->tp) TRY(tp_reduce(c, c->tmp, (size_t)T * H)); /* the ranks' partial sums */
        PROF(c, PC_OTHER);
        if (cl->o_bias) RUN(PC_OTHER, add_bias_cuda(c->tmp, H, cl->o_bias, T, H, st));
        RUN(PC_OTHER, residual_rmsnorm_cuda(c->x, o_acc ? NULL : c->tmp, cl->post_norm, c->h,
                                            c->adt, T, H, eps, st));
        PROF(c, PC_GEMM);
        if (pair) { /* one token: gate/up and SiLU in one launch (rows of a rank: its own) */
            RUN(PC_GEMM,
                gemv_silu_pair_cuda(c->g, c->h, cl->gu_w, c->adt, c->gudt, c->I, H, st));
        } else {
            RUN(PC_GEMM, gemm_cuda_to(c->gemm, c->gu, c->gudt, 2 * c->I, c->h, cl->gu_w, c->adt, T,
                                      2 * c->I, H, st));
            PROF(c, PC_OTHER);
            RUN(PC_OTHER, silu_mul_cuda(c->g, c->adt, c->gu, c->gudt, T, c->I, st));
        }
        PROF(c, PC_GEMM);
        const int down_acc = c->residual_acc && !c->tp;
        if (down_acc)
            RUN(PC_GEMM, gemm_cuda_acc(c->gemm, c->x, H, c->g, cl->down_w, c->adt, T, H, c->I, st));
        else
            RUN(PC_GEMM, gemm_cuda(c->gemm, c->tmp, H, c->g, cl->down_w, c->adt, T, H, c->I, st));
        if (c->tp) TRY(tp_reduce(c, c->tmp, (size_t)T * H));
        PROF(c, PC_OTHER);
        RUN(PC_OTHER, residual_rmsnorm_cuda(c->x, down_acc ? NULL : c->tmp,
                                            l + 1 < c->L ? c->layers[l + 1].in_norm : NULL,
                                            l + 1 < c->L ? c->h : NULL, c->adt, T, H, eps, st));
    }
    if (m->num_logits > 0) {
        PROF(c, PC_OTHER);
        TRY(gather_rows_cuda(c->xl, c->x, c->d_lidx, m->num_logits, H, st));
        TRY(residual_rmsnorm_cuda(c->xl, NULL, c->final_norm, c->hl, c->adt, m->num_logits, H, eps,
                                  st));
        PROF(c, PC_LMHEAD);
        TRY(gemm_cuda_to(c->gemm, c->logits_shard, c->ldt, c->Vs, c->hl, c->lm_head, c->adt,
                         m->num_logits, c->Vs, H, st));
        if (c->tp) TRY(tp_gather_logits(c, m->num_logits));
    }
    return 0;
#undef RUN
}

/* ---------------------------------------------------------------- KV cache and warm-up */

static int64_t cuda_kv_block_bytes(Backend *b, int block_size, DType dtype) {
    CudaBackend *c = b->ctx;
    return 2LL * c->L * block_size * c->kvd * (int64_t)dtype_size(dtype);
}

static DType cuda_kv_default_dtype(Backend *b) {
    return ((CudaBackend *)b->ctx)->adt;
}

/* The device's address of a staged (pinned) host array. */
static const void *mapped(const CudaBackend *c, const void *h) {
    return c->h_in_dev + ((const char *)h - (const char *)c->h_in);
}

/* The device copy of the current staging set's sampling rows: a half of d_rows a set, so that a
 * step's input copy, which runs beside the sampler of the step before (sampler_pdl_note in
 * sampler.cu), never writes the rows that sampler reads. They go with the step's other inputs
 * (copy_inputs), before its model: read from device memory, not over PCIe by every block of
 * the race kernel (9,728 of them for 256 rows of Qwen3). */
static CudaSamplingRow *rows_dev(const CudaBackend *c) {
    return c->d_rows + (size_t)c->set * c->Smax;
}

/* Block tables whose used columns hold up to this many bytes go with the other inputs in
 * copy_segments_cuda's one launch, as rows of their used columns (the kernel reads host memory
 * over PCIe, a word a thread, every word in flight at once); more by a copy engine
 * (cudaMemcpy2DAsync, a row at a time, the GPU idle meanwhile: the fp8 default workload's decode
 * inputs took 25.8 ms of GPU time that way, 15.3 ms as rows; H200, 2026-11-27, BENCHMARKS.md
 * round 25). CVLLM_CUDA_TABLES_MAPPED=N bytes sets the limit (0: always the copy engine). */
#define INPUT_TABLES_MAPPED_MAX (256 << 10)
static size_t tables_mapped_max(void) {
    static long long v = -1;
    if (v < 0) {
        const char *e = getenv("CVLLM_CUDA_TABLES_MAPPED");
        v = e && *e ? atoll(e) : INPUT_TABLES_MAPPED_MAX;
        if (v < 0) v = 0;
    }
    return (size_t)v;
}

/* Copies the staged inputs of T tokens, S sequences, n logits rows (and the decode order, with
 * order; the first `rows` sampling rows, into rows_dev) to the device: by one kernel that reads the pinned buffer where it is mapped (a copy
 * engine's operation costs a few microseconds each, and a step had eight: about 29 us of a
 * batch-1 decode step's 1.1 ms, H200, 2026-11-23), else by cudaMemcpyAsync each. Of the block
 * tables only the columns in use go: rows are max_model_len / block_size entries apart (2,560 for
 * qwen3-0.6b's 40,960 at block 16: 2.6 MB a step at 256 sequences, most of it never read) and a
 * batch uses its longest context's blocks, so larger tables go by one strided copy of those
 * columns. */
static int copy_inputs(CudaBackend *c, int T, int S, int n_logits, int order, int rows,
                       const int32_t *ids_from) {
    cudaStream_t st = c->stream;
    int w = 0; /* the table columns in use */
    for (int s = 0; s < S; s++) {
        const int nb = (c->h_ctx[s] + c->block_size - 1) / c->block_size;
        if (nb > w) w = nb;
    }
    const size_t pitch = (size_t)c->max_blocks * 4, used = (size_t)S * w * 4;
    CopySegments g = {.n = 0, .ids_from = ids_from}; /* from the pinned buffer */
#define SEG(d, h, nb) (g.src[g.n] = (h), g.dst[g.n] = (d), g.bytes[g.n++] = (int64_t)(nb))
    SEG(c->d_ids, c->h_ids, (size_t)T * 4);
    SEG(c->d_pos, c->h_pos, (size_t)T * 4);
    SEG(c->d_slots, c->h_slots, (size_t)T * 8);
    SEG(c->d_cu_q, c->h_cu_q, (size_t)(S + 1) * 4);
    SEG(c->d_ctx, c->h_ctx, (size_t)S * 4);
    if (n_logits > 0) SEG(c->d_lidx, c->h_lidx, (size_t)n_logits * 4);
    if (rows > 0) /* the sampler's rows, into this staging set's half (rows_dev) */
        SEG(rows_dev(c), c->h_rows, (size_t)rows * sizeof(CudaSamplingRow));
    if (order && c->dec_rec) /* the records carry the order */
        SEG(c->d_rec, c->h_rec, (size_t)S * DEC_REC_INTS * 4);
    else if (order)
        SEG(c->d_order, c->h_order, (size_t)S * 4);
    if (used > 0 && c->h_in_dev && used <= tables_mapped_max()) {
        g.rows[g.n] = S, g.src_pitch[g.n] = g.dst_pitch[g.n] = (int64_t)pitch;
        SEG(c->d_tables, c->h_tables, (size_t)w * 4);
    } else if (used > 0) {
        CUDA_TRY(cudaMemcpy2DAsync(c->d_tables, pitch, c->h_tables, pitch, (size_t)w * 4,
                                   (size_t)S, cudaMemcpyHostToDevice, st));
    }
#undef SEG
    if (!c->h_in_dev) { /* no mapping: a copy-engine operation each */
        if (ids_from) return cvllm_errorf(CVLLM_EINVAL, "cuda backend: pending ids, no mapping");
        for (int i = 0; i < g.n; i++)
            CUDA_TRY(cudaMemcpyAsync(g.dst[i], g.src[i], (size_t)g.bytes[i],
                                     cudaMemcpyHostToDevice, st));
        return 0;
    }
    for (int i = 0; i < g.n; i++)
        g.src[i] = mapped(c, g.src[i]);
    return copy_segments_cuda(&g, st);
}

/* A stable LSD radix sort of the lane indices by (longest length - length), 8 bits a pass, as
 * many passes as the longest length has bytes: about 2 us for 256 lanes where qsort took 15 us
 * of the step's host time (the GPU idles then). */
void attention_decode_order(const int32_t *ctx, int S, uint64_t *scratch, int32_t *order) {
    int32_t longest = 0;
    for (int i = 0; i < S; i++)
        if (ctx[i] > longest) longest = ctx[i];
#define DKEY(i) ((uint32_t)(longest - (ctx[i] > 0 ? ctx[i] : 0)))
    int32_t *src = order, *dst = (int32_t *)scratch; /* room for 2 S indices */
    for (int i = 0; i < S; i++)
        src[i] = i;
    for (int shift = 0;; shift += 8) {
        int start[257] = {0};
        for (int i = 0; i < S; i++)
            start[(DKEY(src[i]) >> shift & 255) + 1]++;
        for (int d = 0; d < 256; d++)
            start[d + 1] += start[d];
        for (int i = 0; i < S; i++)
            dst[start[DKEY(src[i]) >> shift & 255]++] = src[i];
        int32_t *t = src;
        src = dst, dst = t;
        if (shift + 8 >= 32 || ((uint32_t)longest >> (shift + 8)) == 0) break;
    }
#undef DKEY
    if (src != order) memcpy(order, src, (size_t)S * sizeof *order);
}

void attention_decode_records(const int32_t *order, int S, const int32_t *context_lens,
                              const int32_t *cu_seqlens_q, const int32_t *positions,
                              const int64_t *slots, const int32_t *block_tables,
                              int max_blocks_per_seq, int block_size, int32_t *rec) {
    for (int i = 0; i < S; i++) {
        const int s = order[i], ctx = context_lens[s], t = cu_seqlens_q[s + 1] - 1;
        const int nb = ctx > 0 ? (ctx + block_size - 1) / block_size : 0;
        int32_t *r = rec + (size_t)i * DEC_REC_INTS;
        r[0] = s, r[1] = ctx, r[2] = t, r[3] = positions && t >= 0 ? positions[t] : 0;
        for (int k = 0; k < DEC_REC_TAB; k++)
            r[DEC_REC_TAB0 + k] = k < nb && k < max_blocks_per_seq
                                      ? block_tables[(size_t)s * max_blocks_per_seq + k]
                                      : 0;
        const int64_t slot = slots && t >= 0 ? slots[t] : -1;
        memcpy(r + DEC_REC_SLOT, &slot, sizeof slot);
        for (int k = DEC_REC_SLOT + 2; k < DEC_REC_INTS; k++)
            r[k] = 0;
    }
}

void attention_decode_fold(int32_t *order, int S, int tail, int32_t *scratch) {
    const int n = tail < 0 ? S : tail > S ? 0 : S - tail; /* the folded ones */
    for (int i = 0; i < n; i++)
        scratch[i] = order[i % 2 ? n - 1 - i / 2 : i / 2];
    memcpy(order, scratch, (size_t)n * sizeof *order);
}

/* The decode attention's launch order of the S staged lanes (h_order; copy_inputs sends it):
 * longest context first, so that the blocks that start last are short; for an fp8 cache that
 * order folded (longest, shortest, second longest, ..). Longest first, a wave of blocks (4 an SM)
 * is contexts of about one length, which start, end and start the next wave together, each block
 * then in its fixed phases (setup, prologue, first tiles; merge) at once (the probe of round 19:
 * 22-80 of 528 blocks in their loop between waves); folded, the short ones end early and their
 * places refill while the long ones stream. H200, 2026-11-26 (docs/BENCHMARKS.md round 20), fp8
 * default workload, output tok/s: folded 37,072 / 37,022 / 36,959 against 35,930 / 36,308 /
 * 36,331 longest first (+2.3%); qwen3-8b 10,951 against 10,811; two to eight parts interleaved
 * +0.9-1.4%, batch order +1.0%, shortest first -2%. The 16-bit caches' kernel (3 blocks an SM, a
 * block's fixed phases a smaller share of its time) is slower folded (bf16 default 26,171 /
 * 26,347 / 26,364 against 26,507 / 26,520 / 26,546), so it keeps longest first. The fold leaves
 * the shortest dec_tail % (25) out, last, so that a launch ends on short blocks: fp8 default
 * +0.4% (39,587 / 39,590 against 39,415 / 39,445 with none; 12%: 39,494, 40%: 39,583, 60%:
 * 39,034; H200, 2026-11-27, round 33). With dec_rec the order goes as records
 * (attention_decode_records), sent in its place. */
static int stage_order(CudaBackend *c, int S) {
    if (!c->order_decode) return 0;
    attention_decode_order(c->h_ctx, S, c->order_keys, c->h_order);
    const int fold = c->order_decode < 0 ? c->kvdt == DTYPE_FP8_E4M3 : c->order_decode == 2;
    if (fold) attention_decode_fold(c->h_order, S, S * c->dec_tail / 100, (int32_t *)c->order_keys);
    if (c->dec_rec)
        attention_decode_records(c->h_order, S, c->h_ctx, c->h_cu_q, c->h_pos, c->h_slots,
                                 c->h_tables, c->max_blocks, c->block_size, c->h_rec);
    return 1;
}

/* A prefill of max_num_tokens tokens (sequences of up to max_model_len, at most max_num_seqs)
 * over a scratch one-block cache (every table entry 0, nothing stored), then their logits:
 * every kernel and product plan of the largest step runs once, and whatever the libraries
 * allocate on first use is in use afterwards. */
static int measure_step(CudaBackend *c) {
    const int bs = c->opt.block_size;
    void *kv = NULL;
    const size_t kvb = 2 * (size_t)c->L * bs * c->kvd * dtype_size(c->adt);
    CUDA_TRY(cudaMalloc(&kv, kvb));
    int T = 0, S = 0, maxq = 0;
    c->h_cu_q[0] = 0;
    while (T < c->Tmax && S < c->Smax) {
        int len = c->Tmax - T < c->opt.max_model_len ? c->Tmax - T : c->opt.max_model_len;
        for (int i = 0; i < len; i++) {
            c->h_ids[T + i] = (T + i) % c->V;
            c->h_pos[T + i] = i;
            c->h_slots[T + i] = -1;
        }
        for (int j = 0; j < c->max_blocks; j++)
            c->h_tables[(size_t)S * c->max_blocks + j] = 0;
        T += len;
        c->h_ctx[S] = len;
        c->h_lidx[S] = T - 1;
        c->h_cu_q[++S] = T;
        if (len > maxq) maxq = len;
    }
    const int saved_bs = c->block_size;
    const DType saved_dt = c->kvdt;
    c->block_size = bs;
    c->kvdt = c->adt;
    int rc = copy_inputs(c, T, S, S, 0, 0, NULL);
    ModelLaunch m = {.T = T,
                     .S = S,
                     .max_q = maxq,
                     .max_k = maxq,
                     .num_logits = S,
                     .decode = 0,
                     .kv = kv,
                     .num_blocks = 1};
    if (!rc) rc = run_model(c, &m);
    c->block_size = saved_bs;
    c->kvdt = saved_dt;
    int rs = rc ? 0 : sync_stream(c);
    if (!rs || !c->tp) cudaFree(kv);
    return rc ? rc : rs;
}

static int64_t cuda_kv_budget_bytes(Backend *b) {
    CudaBackend *c = b->ctx;
    if (!c->measured) {
        size_t fr0 = 0, tot = 0;
        cudaMemGetInfo(&fr0, &tot);
        double t0 = now_seconds();
        int rc = measure_step(c);
        if (rc) {
            fprintf(stderr, "cvllm: cuda: warm-up step failed: %s\n", cvllm_last_error());
            return -1;
        }
        size_t fr = 0;
        cudaMemGetInfo(&fr, &tot);
        /* in use by this process: weights + workspace + whatever the runtime and libraries took */
        c->activation_peak = (int64_t)c->ws_bytes + (int64_t)c->in_bytes + (int64_t)(fr0 - fr);
        c->measured = 1;
        if (c->opt.verbose)
            fprintf(stderr,
                    "cvllm: cuda: warm-up step of %d tokens in %.2f s; activation peak "
                    "%.1f MiB (workspace %.1f, step buffers %.1f, taken by the libraries %.1f)\n",
                    c->Tmax, now_seconds() - t0, c->activation_peak / 1048576.0,
                    c->ws_bytes / 1048576.0, c->in_bytes / 1048576.0, (fr0 - fr) / 1048576.0);
    }
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    const double util = c->opt.gpu_memory_utilization > 0 ? c->opt.gpu_memory_utilization : 0.9;
    /* vLLM's rule: util * total minus everything in use now (weights, workspace, the libraries,
     * other processes), less a reserve for the decode graphs */
    int64_t budget = (int64_t)(util * (double)tot) - (int64_t)(tot - fr) - GRAPH_RESERVE_BYTES;
    return budget > 0 ? budget : 0;
}

/* ---------------------------------------------------------------- the group's entry points
 * Rank 0 of several sends each call to the workers first (their warm-up steps and graph captures
 * run the same collectives as its own), does its own part, then gathers their replies. */

static int64_t cuda_kv_budget_all(Backend *b) {
#ifdef CVLLM_HAVE_NCCL
    CudaBackend *c = b->ctx;
    if (c->owns_tp) {
        if (tp_send_all(c->tp, TP_MSG_BUDGET, NULL, 0, NULL, 0)) {
            fprintf(stderr, "cvllm: cuda: %s\n", cvllm_last_error());
            return 0;
        }
        int64_t own = cuda_kv_budget_bytes(b), min = 0;
        if (own < 0 || tp_gather_replies(c->tp, own, &min)) {
            if (own >= 0) fprintf(stderr, "cvllm: cuda: %s\n", cvllm_last_error());
            return 0;
        }
        /* every rank holds as many blocks as the tightest can: the engine sizes one pool */
        if (c->opt.verbose)
            fprintf(stderr, "cvllm: cuda: KV budget %.1f MiB on rank 0, %.1f MiB on the tightest rank\n",
                    own / 1048576.0, min / 1048576.0);
        return min;
    }
#endif
    int64_t v = cuda_kv_budget_bytes(b);
    return v > 0 ? v : 0;
}

static int cuda_init_kv_cache_all(Backend *b, const KVCacheSpec *spec) {
#ifdef CVLLM_HAVE_NCCL
    CudaBackend *c = b->ctx;
    if (c->owns_tp) {
        TRY(tp_send_all(c->tp, TP_MSG_INIT_KV, spec, sizeof *spec, NULL, 0));
        TRY(cuda_init_kv_cache(b, spec));
        return tp_gather_replies(c->tp, 0, NULL);
    }
#endif
    return cuda_init_kv_cache(b, spec);
}

static int cuda_warmup_all(Backend *b) {
#ifdef CVLLM_HAVE_NCCL
    CudaBackend *c = b->ctx;
    if (c->owns_tp) {
        TRY(tp_send_all(c->tp, TP_MSG_WARMUP, NULL, 0, NULL, 0));
        TRY(cuda_warmup(b));
        return tp_gather_replies(c->tp, 0, NULL);
    }
#endif
    return cuda_warmup(b);
}

static int cuda_init_kv_cache(Backend *b, const KVCacheSpec *spec) {
    CudaBackend *c = b->ctx;
    if (c->d_kv) return cvllm_errorf(CVLLM_EINVAL, "cuda backend: KV cache already allocated");
    if (spec->dtype != DTYPE_BF16 && spec->dtype != DTYPE_F16 && spec->dtype != DTYPE_F32 &&
        spec->dtype != DTYPE_FP8_E4M3)
        return cvllm_errorf(CVLLM_EUNSUPPORTED, "cuda backend: KV cache dtype %s",
                            dtype_name(spec->dtype));
    if (spec->num_blocks <= 0 || spec->block_size != c->opt.block_size)
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda backend: KV cache of %d blocks of %d tokens "
                            "(backend made for blocks of %d)",
                            spec->num_blocks, spec->block_size, c->opt.block_size);
    const size_t bytes =
        (size_t)cuda_kv_block_bytes(b, spec->block_size, spec->dtype) * spec->num_blocks;
    cudaError_t e = cudaMalloc(&c->d_kv, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return cvllm_errorf(CVLLM_ENOMEM,
                            "cuda backend: a KV cache of %.2f GiB does not fit (%.2f "
                            "GiB free); lower --kv-cache-memory or --gpu-memory-utilization",
                            bytes / 1073741824.0, fr / 1073741824.0);
    }
    CUDA_TRY(cudaMemsetAsync(c->d_kv, 0, bytes, c->stream));
    c->kvdt = spec->dtype;
    c->num_blocks = spec->num_blocks;
    c->block_size = spec->block_size;
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    return 0;
}

/* Stages a decode batch of n real lanes padded to B (inputs already staged for lanes < n). */
static void pad_lanes(CudaBackend *c, int n, int B) {
    for (int i = n; i < B; i++) {
        c->h_ids[i] = 0;
        c->h_pos[i] = 0;
        c->h_slots[i] = -1;
        c->h_cu_q[i + 1] = i + 1;
        c->h_ctx[i] = 0;
        c->h_lidx[i] = i;
    }
}

static int bucket_for(const CudaBackend *c, int n) {
    for (int i = 0; i < c->num_buckets; i++)
        if (c->buckets[i] >= n) return i;
    return -1;
}

static int cuda_warmup(Backend *b) {
    CudaBackend *c = b->ctx;
    if (!c->d_kv) return cvllm_errorf(CVLLM_EINVAL, "cuda backend: warmup before init_kv_cache");
    if (c->opt.enforce_eager) return 0;
    double t0 = now_seconds();
    const int graph_dump = cuda_env_flag("CVLLM_CUDA_GRAPH_DUMP", 0);
    c->num_buckets = 0;
    for (int B = 1; B <= c->Smax && c->num_buckets < MAX_BUCKETS;) {
        c->buckets[c->num_buckets++] = B;
        B = B < 8 ? 2 * B : (B < 16 ? 16 : B + 16);
    }
    if (c->buckets[c->num_buckets - 1] < c->Smax && c->num_buckets < MAX_BUCKETS)
        c->buckets[c->num_buckets++] = c->Smax;
    for (int i = 0; i < c->num_buckets; i++) {
        const int B = c->buckets[i];
        /* B padding lanes: a dry run (plans, lazy module loads) then the capture */
        c->h_cu_q[0] = 0;
        pad_lanes(c, 0, B);
        for (int s = 0; s < B; s++)
            c->h_tables[(size_t)s * c->max_blocks] = 0;
        TRY(copy_inputs(c, B, B, B, stage_order(c, B), 0, NULL));
        AttentionParams ap = {.n_heads = c->heads,
                              .n_kv_heads = c->kvh,
                              .hd = c->hd,
                              .kvdt = c->kvdt,
                              .block_size = c->block_size,
                              .cache_rows = (int64_t)c->num_blocks * c->block_size,
                              .num_seqs = B,
                              .max_seqlen_k = c->opt.max_model_len};
        ModelLaunch m = {.T = B,
                         .S = B,
                         .max_q = 1,
                         .max_k = c->opt.max_model_len,
                         .num_logits = B,
                         .decode = 1,
                         .parts = attention_decode_num_parts(&ap, c->num_sms),
                         .kv = c->d_kv,
                         .num_blocks = c->num_blocks};
        c->graph_parts[i] = m.parts;
        TRY(run_model(c, &m));
        TRY(sync_stream(c));
        cudaGraph_t g;
        CUDA_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
        int rc = run_model(c, &m);
        cudaError_t e = cudaStreamEndCapture(c->stream, &g);
        if (rc) return rc;
        if (e != cudaSuccess) return cuda_error(e, __FILE__, __LINE__, "graph capture");
        const int dump = graph_dump && i == c->num_buckets - 1;
        if (cuda_graph_edges_mode() != GRAPH_EDGES_KEEP || dump) {
            int moved = 0;
            rc = cuda_graph_edges_launch_completion(g, cuda_graph_edges_mode(), dump, &moved);
            if (rc) {
                cudaGraphDestroy(g);
                return rc;
            }
            if (c->opt.verbose && i == c->num_buckets - 1)
                fprintf(stderr, "cvllm: cuda: %d programmatic edges of the batch-%d graph at "
                                "launch completion\n", moved, B);
        }
        e = cudaGraphInstantiate(&c->graphs[i], g, 0);
        cudaGraphDestroy(g);
        if (e != cudaSuccess) return cuda_error(e, __FILE__, __LINE__, "graph instantiate");
    }
    if (c->opt.verbose)
        fprintf(stderr, "cvllm: cuda: captured %d decode graphs (batch 1..%d) in %.2f s\n",
                c->num_buckets, c->buckets[c->num_buckets - 1], now_seconds() - t0);
    return 0;
}

/* ---------------------------------------------------------------- forward */

static int validate(const CudaBackend *c, const StepInputs *in) {
    if (!c->d_kv) return cvllm_errorf(CVLLM_EINVAL, "cuda backend: forward before init_kv_cache");
    StepLimits l = {.max_num_tokens = c->Tmax,
                    .max_num_seqs = c->Smax,
                    .max_model_len = c->opt.max_model_len,
                    .vocab_size = c->V,
                    .num_blocks = c->num_blocks,
                    .block_size = c->block_size,
                    .max_table_blocks = c->max_blocks};
    return step_inputs_check(in, &l);
}

/* Stages the sampling rows (and the id histories of rows with penalties). */
static int stage_sampling(CudaBackend *c, const StepInputs *in) {
    int64_t nid = 0;
    for (int i = 0; i < in->num_logits; i++) {
        const SamplingRow *r = &in->sampling[i];
        const int pen = sampling_row_has_penalty(r);
        CudaSamplingRow *d = &c->h_rows[i];
        *d = (CudaSamplingRow){.temperature = r->temperature,
                               .top_p = r->top_p,
                               .min_p = r->min_p,
                               .top_k = r->top_k,
                               .presence_penalty = r->presence_penalty,
                               .frequency_penalty = r->frequency_penalty,
                               .repetition_penalty = r->repetition_penalty,
                               .num_logprobs = r->num_logprobs,
                               .seed = r->seed,
                               .draw_index = (uint64_t)r->num_output,
                               .ids_offset = nid,
                               .has_penalty = pen};
        if (!pen) continue;
        const int64_t n = (int64_t)r->num_prompt + r->num_output;
        if (nid + n > c->hist_cap)
            return cvllm_errorf(CVLLM_EINVAL,
                                "cuda backend: penalty histories of %lld ids (room "
                                "for %lld)",
                                (long long)(nid + n), (long long)c->hist_cap);
        if (r->num_prompt) memcpy(c->h_hist + nid, r->prompt_ids, (size_t)r->num_prompt * 4);
        if (r->num_output)
            memcpy(c->h_hist + nid + r->num_prompt, r->output_ids, (size_t)r->num_output * 4);
        d->num_prompt = r->num_prompt;
        d->num_output = r->num_output;
        nid += n;
    }
    cudaStream_t st = c->stream;
    if (nid)
        CUDA_TRY(
            cudaMemcpyAsync(c->d_hist, c->h_hist, (size_t)nid * 4, cudaMemcpyHostToDevice, st));
    return 0;
}

/* How every rank launches one step (the header of TP_MSG_STEP): the staged arrays hold T tokens,
 * S sequences, n logits rows (a graph replay: the bucket's B lanes each). */
typedef struct {
    int32_t T, S, n, max_q, max_k, decode, bucket; /* bucket: the graph's index, or -1 (eager) */
    /* tensor parallelism, asynchronous steps: the rows the step before sampled, which every rank
     * receives from rank 0 (tp_broadcast_i32) before its inputs; 0: no pending tokens */
    int32_t pending;
} StepLaunch;

/* Copies the staged inputs (with the first `rows` sampling rows: copy_inputs) to the device and
 * enqueues the model (embedding .. logits). ids_from: NULL, or where the step before's sampled
 * ids are (staged ids -(r + 1) read from there; with tensor parallelism d_bcast, which the
 * broadcast below fills on every rank). */
static int launch_step(CudaBackend *c, const StepLaunch *sl, int rows, const int32_t *ids_from) {
#ifdef CVLLM_HAVE_NCCL
    if (c->tp && sl->pending > 0) { /* rank 0's samples of the step before, to every rank */
        TRY(tp_broadcast_i32(c->tp, c->d_tok, c->d_bcast, (size_t)sl->pending, c->stream));
        ids_from = c->d_bcast;
    }
#endif
    PROF(c, PC_INPUTS);
    TRY(copy_inputs(c, sl->T, sl->S, sl->n, sl->decode && stage_order(c, sl->S), rows,
                    ids_from));
    if (c->ev_pending >= 0) { /* the step before's end: every operation of it is ahead */
        CUDA_TRY(cudaEventRecord(c->set_done[c->ev_pending], c->stream));
        c->ev_pending = -1;
    }
    if (sl->bucket >= 0) {
        PROF(c, PC_GRAPH);
        CUDA_TRY(cudaGraphLaunch(c->graphs[sl->bucket], c->stream));
        return 0;
    }
    ModelLaunch m = {.T = sl->T,
                     .S = sl->S,
                     .max_q = sl->max_q,
                     .max_k = sl->max_k,
                     .num_logits = sl->n,
                     .decode = sl->decode,
                     .parts = 0,
                     .kv = c->d_kv,
                     .num_blocks = c->num_blocks};
    return run_model(c, &m);
}

#ifdef CVLLM_HAVE_NCCL
/* Rank 0: the step to the workers, before its own launch: the header, then the staged arrays
 * (ids, positions, slots [T], cu_seqlens_q [S + 1], context lengths [S], logits rows [n]) and each
 * sequence's block-table entries in use (ceil(context / block_size) of them), back to back. */
static int send_step(CudaBackend *c, const StepLaunch *sl) {
    size_t tab = 0;
    for (int s = 0; s < sl->S; s++)
        tab += (size_t)(c->h_ctx[s] + c->block_size - 1) / c->block_size;
    const size_t bytes = (size_t)sl->T * 16 + ((size_t)2 * sl->S + 1 + sl->n + tab) * 4;
    if (bytes > c->msg_cap) {
        free(c->msg);
        c->msg_cap = bytes + bytes / 2;
        c->msg = xmalloc(c->msg_cap);
    }
    char *p = c->msg;
#define PUT(src, nbytes) (memcpy(p, (src), (nbytes)), p += (nbytes))
    PUT(c->h_ids, (size_t)sl->T * 4);
    PUT(c->h_pos, (size_t)sl->T * 4);
    PUT(c->h_slots, (size_t)sl->T * 8);
    PUT(c->h_cu_q, (size_t)(sl->S + 1) * 4);
    PUT(c->h_ctx, (size_t)sl->S * 4);
    PUT(c->h_lidx, (size_t)sl->n * 4);
    for (int s = 0; s < sl->S; s++)
        PUT(c->h_tables + (size_t)s * c->max_blocks,
            (size_t)((c->h_ctx[s] + c->block_size - 1) / c->block_size) * 4);
#undef PUT
    return tp_send_all(c->tp, TP_MSG_STEP, sl, sizeof *sl, c->msg, (size_t)(p - c->msg));
}

/* A worker: one step from its message (checked against this rank's sizes), enqueued; as rank 0's
 * asynchronous steps, it is staged in the host set the step before did not use, once the step
 * that used that set last is done (set_done), so that a step runs while the next is staged. */
static int worker_step(CudaBackend *c, const char *msg, size_t n) {
    StepLaunch sl;
    if (n < sizeof sl) return cvllm_errorf(CVLLM_EINVAL, "step message of %zu bytes", n);
    memcpy(&sl, msg, sizeof sl);
    const char *p = msg + sizeof sl, *end = msg + n;
    if (sl.T < 0 || sl.T > c->Tmax || sl.S < 0 || sl.S > c->Smax || sl.n < 0 || sl.n > c->Smax ||
        sl.bucket >= c->num_buckets || sl.pending < 0 || sl.pending > c->Smax ||
        (size_t)(end - p) < (size_t)sl.T * 16 + ((size_t)2 * sl.S + 1 + sl.n) * 4)
        return cvllm_errorf(CVLLM_EINVAL, "malformed step message (%d tokens, %d sequences)", sl.T,
                            sl.S);
    const int k = free_set(c);
    TRY(tp_event_wait(c->tp, c->set_done[k]));
    staging_use(c, k);
#define GET(dst, nbytes) (memcpy((dst), p, (nbytes)), p += (nbytes))
    GET(c->h_ids, (size_t)sl.T * 4);
    GET(c->h_pos, (size_t)sl.T * 4);
    GET(c->h_slots, (size_t)sl.T * 8);
    GET(c->h_cu_q, (size_t)(sl.S + 1) * 4);
    GET(c->h_ctx, (size_t)sl.S * 4);
    GET(c->h_lidx, (size_t)sl.n * 4);
    for (int s = 0; s < sl.S; s++) {
        const int nb = (c->h_ctx[s] + c->block_size - 1) / c->block_size;
        if (c->h_ctx[s] < 0 || nb > c->max_blocks || (size_t)(end - p) < (size_t)nb * 4)
            return cvllm_errorf(CVLLM_EINVAL, "malformed step message (block tables)");
        GET(c->h_tables + (size_t)s * c->max_blocks, (size_t)nb * 4);
    }
#undef GET
    TRY(launch_step(c, &sl, 0, NULL));
    CUDA_TRY(cudaEventRecord(c->set_done[k], c->stream));
    c->prev_set = k;
    return 0;
}
#endif

/* Stages a step in the other host set and enqueues it: inputs, the model, the sampler, and
 * the outputs' way back (into the set, where they are read once set_done[set] has passed).
 * logits: NULL, or where the raw rows go too (golden tests). */
static int enqueue_step(CudaBackend *c, const StepInputs *in, float *logits) {
    const int T = in->num_tokens, S = in->num_seqs, n = in->num_logits;
    const int decode = in->max_seqlen_q == 1; /* one new token per sequence */
    const int prev = c->prev_set;
    if (in->input_rows) { /* pending ids: the rows of the step staged before, on the device */
        if (prev < 0 || !c->h_in_dev)
            return cvllm_errorf(CVLLM_EINVAL, "cuda backend: pending ids without a step before");
        for (int t = 0; t < T; t++)
            if (in->input_rows[t] >= c->set_rows[prev])
                return cvllm_errorf(CVLLM_EINVAL, "cuda backend: token %d: input row %d of %d", t,
                                    in->input_rows[t], c->set_rows[prev]);
    }
    staging_use(c, free_set(c)); /* not the set of a step that may be running */
    const int32_t *ids_from = NULL;
    if (in->input_rows) /* the other set's sampled ids (tensor parallelism: launch_step's) */
        ids_from = c->tp ? c->d_bcast : (const int32_t *)mapped(c, in_set(c, c->h_tok, prev));
    prof_begin(c);
    /* stage the inputs in pinned memory (tables repacked to this backend's row stride) */
    memcpy(c->h_ids, in->input_ids, (size_t)T * 4);
    for (int t = 0; ids_from && t < T; t++)
        if (in->input_rows[t] >= 0) c->h_ids[t] = -in->input_rows[t] - 1;
    memcpy(c->h_pos, in->positions, (size_t)T * 4);
    memcpy(c->h_slots, in->slot_mapping, (size_t)T * 8);
    memcpy(c->h_cu_q, in->cu_seqlens_q, (size_t)(S + 1) * 4);
    memcpy(c->h_ctx, in->context_lens, (size_t)S * 4);
    memcpy(c->h_lidx, in->logits_indices, (size_t)n * 4);
    for (int s = 0; s < S; s++) {
        const int nblk = (in->context_lens[s] + c->block_size - 1) / c->block_size;
        memcpy(c->h_tables + (size_t)s * c->max_blocks,
               in->block_tables + (size_t)s * in->max_blocks_per_seq, (size_t)nblk * 4);
    }
    /* a decode whose every sequence is sampled, with a captured bucket: replay its graph */
    const int bi = decode && n == S && c->num_buckets ? bucket_for(c, S) : -1;
    int identity = 1;
    for (int i = 0; i < n && identity; i++)
        identity = in->logits_indices[i] == i;
    StepLaunch sl = {.T = T, .S = S, .n = n, .max_q = in->max_seqlen_q, .max_k = in->max_seqlen_k,
                     .decode = decode, .bucket = -1,
                     .pending = in->input_rows ? c->set_rows[prev] : 0};
    if (bi >= 0 && identity) {
        const int B = c->buckets[bi];
        pad_lanes(c, S, B);
        sl.T = sl.S = sl.n = B;
        sl.bucket = bi;
    }
    c->prev_set = c->set;
    c->set_rows[c->set] = n;
#ifdef CVLLM_HAVE_NCCL
    if (c->tp) TRY(send_step(c, &sl));
#endif
    if (n > 0) TRY(stage_sampling(c, in)); /* the rows go with the inputs (copy_inputs) */
    const int rows_mapped = c->rows_mapped && c->h_in_dev;
    TRY(launch_step(c, &sl, rows_mapped ? 0 : n, ids_from));
    if (n == 0) {
        PROF(c, PC_INPUTS); /* the end mark */
        return 0;
    }
    PROF(c, PC_SAMPLER);
    /* the rows in device memory (rows_dev) unless CVLLM_CUDA_ROWS_MAPPED=1 (measuring: read
     * where they are staged); the tokens written to the pinned buffer itself (mapped: a
     * copy-engine operation fewer) */
    const CudaSamplingRow *rows = rows_mapped ? mapped(c, c->h_rows) : rows_dev(c);
    /* tensor parallelism: into d_tok too, where the next step's broadcast reads them */
    int32_t *tok = c->h_in_dev && !c->tp ? (int32_t *)mapped(c, c->h_tok) : c->d_tok;
    TRY(sampler_cuda(c->logits, c->ldt, n, c->V, rows, c->h_rows, c->d_hist, tok, c->d_lp,
                     c->d_top, c->d_tlp, c->d_sampler_scratch, c->stream));
    cudaStream_t st = c->stream;
    if (!c->h_in_dev || c->tp)
        CUDA_TRY(cudaMemcpyAsync(c->h_tok, c->d_tok, (size_t)n * 4, cudaMemcpyDeviceToHost, st));
    int any_lp = 0;
    for (int i = 0; i < n; i++) {
        c->h_lpk[c->set][i] = in->sampling[i].num_logprobs;
        any_lp |= in->sampling[i].num_logprobs >= 0;
    }
    if (any_lp) {
        CUDA_TRY(cudaMemcpyAsync(c->h_lp, c->d_lp, (size_t)n * 4, cudaMemcpyDeviceToHost, st));
        CUDA_TRY(cudaMemcpyAsync(c->h_top, c->d_top, (size_t)n * CUDA_SAMPLER_MAX_LOGPROBS * 4,
                                 cudaMemcpyDeviceToHost, st));
        CUDA_TRY(cudaMemcpyAsync(c->h_tlp, c->d_tlp, (size_t)n * CUDA_SAMPLER_MAX_LOGPROBS * 4,
                                 cudaMemcpyDeviceToHost, st));
    }
    if (logits && c->ldt == DTYPE_BF16) { /* golden tests only: the rows cross to the host */
        if (!c->h_logits16) c->h_logits16 = xmalloc((size_t)c->Smax * c->V * 2);
        CUDA_TRY(cudaMemcpyAsync(c->h_logits16, c->logits, (size_t)n * c->V * 2,
                                 cudaMemcpyDeviceToHost, st));
    } else if (logits) {
        CUDA_TRY(cudaMemcpyAsync(logits, c->logits, (size_t)n * c->V * 4, cudaMemcpyDeviceToHost,
                                 st));
    }
    PROF(c, PC_SAMPLER); /* the end mark */
    return 0;
}

/* The results of the step staged in set k (once it has run) into out. */
static void copy_outputs(const CudaBackend *c, int k, StepOutputs *out) {
    const int32_t *tok = in_set(c, c->h_tok, k), *top = in_set(c, c->h_top, k);
    const float *lp = in_set(c, c->h_lp, k), *tlp = in_set(c, c->h_tlp, k);
    const int n = c->set_rows[k];
    memcpy(out->token_ids, tok, (size_t)n * 4);
    for (int i = 0; i < n; i++) {
        const int nk = c->h_lpk[k][i];
        if (nk < 0) continue;
        if (out->logprobs) out->logprobs[i] = lp[i];
        for (int j = 0; j < nk && j < CUDA_SAMPLER_MAX_LOGPROBS; j++) {
            const size_t from = (size_t)i * CUDA_SAMPLER_MAX_LOGPROBS + j,
                         to = (size_t)i * CVLLM_MAX_LOGPROBS + j;
            if (out->top_ids) out->top_ids[to] = top[from];
            if (out->top_logprobs) out->top_logprobs[to] = tlp[from];
        }
    }
}

static int step_failed(Backend *b, int rc) {
    CudaBackend *c = b->ctx;
    c->prof.active = 0;
#ifdef CVLLM_HAVE_NCCL
    if (c->tp && tp_failed(c->tp)) b->broken = 1; /* a rank is gone: no step can run again */
#endif
    return rc;
}

static int cuda_forward(Backend *b, const StepInputs *in, StepOutputs *out) {
    CudaBackend *c = b->ctx;
    int rc = validate(c, in);
    if (rc) return rc;
    if (c->fl_count)
        return cvllm_errorf(CVLLM_EINVAL, "cuda backend: forward with steps in flight");
    CUDA_TRY(cudaSetDevice(c->dev)); /* the engine may step on another thread than create's */
    if ((rc = enqueue_step(c, in, out->logits)) || (rc = sync_stream(c))) return step_failed(b, rc);
    prof_end(c, in->max_seqlen_q == 1, in->num_tokens);
    copy_outputs(c, c->set, out);
    if (out->logits && c->ldt == DTYPE_BF16) /* bf16 widens to f32 exactly */
        for (int64_t i = 0; i < (int64_t)in->num_logits * c->V; i++) {
            const uint32_t u = (uint32_t)c->h_logits16[i] << 16;
            memcpy(&out->logits[i], &u, 4);
        }
    return 0;
}

/* Asynchronous steps (one GPU, inputs mapped, no profile): each its own staging set, its end
 * marked by that set's event; collect waits for the oldest. */
static int cuda_submit(Backend *b, const StepInputs *in) {
    CudaBackend *c = b->ctx;
    int rc = validate(c, in);
    if (rc) return rc;
    if (c->fl_count >= 2)
        return cvllm_errorf(CVLLM_EINVAL, "cuda backend: a third step submitted before a collect");
    CUDA_TRY(cudaSetDevice(c->dev));
    if ((rc = enqueue_step(c, in, NULL))) return step_failed(b, rc);
    c->ev_pending = c->set; /* launch_step recorded the step before's; this one's comes after the
                               next step's input copy, or at its collect */
    c->fl_set[(c->fl_head + c->fl_count++) % 2] = c->set;
    return 0;
}

static int cuda_collect(Backend *b, StepOutputs *out) {
    CudaBackend *c = b->ctx;
    if (c->fl_count == 0) return cvllm_errorf(CVLLM_EINVAL, "cuda backend: nothing to collect");
    const int k = c->fl_set[c->fl_head];
    c->fl_head = (c->fl_head + 1) % 2;
    c->fl_count--;
    CUDA_TRY(cudaSetDevice(c->dev));
    if (c->ev_pending == k) { /* no step after it yet: its end marked now */
        CUDA_TRY(cudaEventRecord(c->set_done[k], c->stream));
        c->ev_pending = -1;
    }
#ifdef CVLLM_HAVE_NCCL
    if (c->tp) { /* watching the peers: a lost rank must not leave this wait hanging */
        int rc = tp_event_wait(c->tp, c->set_done[k]);
        if (rc) return step_failed(b, rc);
    } else
#endif
        CUDA_TRY(cudaEventSynchronize(c->set_done[k]));
    copy_outputs(c, k, out);
    return 0;
}

/* ---------------------------------------------------------------- tensor-parallel worker */

#ifdef CVLLM_HAVE_NCCL
/* A worker process's life: join rank 0, load this rank's share of the model folder rank 0 names
 * (or model_dir), then run what rank 0 sends until SHUTDOWN. Any error goes to rank 0 (which
 * stops the engine) and ends the worker. */
static int cuda_worker_main(const char *addr, int rank, int device, const char *model_dir,
                            double timeout_s) {
    TpGroup *g = NULL;
    if (tp_group_join(&g, addr, rank, timeout_s)) {
        fprintf(stderr, "cvllm worker (rank %d): %s\n", rank, cvllm_last_error());
        return 1;
    }
    uint32_t type = 0;
    void *msg = NULL;
    size_t n = 0;
    ModelConfig cfg;
    ModelWeights w;
    int have_cfg = 0, have_w = 0, rc;
    Backend *b = NULL;
    if ((rc = tp_recv(g, &type, &msg, &n)) || type != TP_MSG_CREATE || n <= sizeof(TpWireCreate)) {
        if (!rc) tp_reply(g, 0, "expected the create message");
        goto out;
    }
    TpWireCreate wc;
    memcpy(&wc, msg, sizeof wc);
    const char *dir = model_dir ? model_dir : (const char *)msg + sizeof wc;
    BackendOptions o = {.device_id = device,
                        .max_num_tokens = wc.max_num_tokens,
                        .max_num_seqs = wc.max_num_seqs,
                        .max_model_len = wc.max_model_len,
                        .block_size = wc.block_size,
                        .gpu_memory_utilization = wc.gpu_memory_utilization,
                        .enforce_eager = wc.enforce_eager,
                        .tp_rank = rank,
                        .tp_size = wc.tp_size,
                        .model_dir = dir};
    if (rank >= wc.tp_size) rc = cvllm_errorf(CVLLM_EINVAL, "rank %d of %d", rank, wc.tp_size);
    if (!rc && !(rc = config_load(dir, &cfg))) have_cfg = 1;
    if (!rc && !(rc = weights_load(dir, &cfg, &w))) have_w = 1;
    if (!rc) rc = cuda_create_rank(&cfg, &w, &o, g, &b);
    free(msg), msg = NULL;
    if (rc) {
        tp_reply(g, 0, cvllm_last_error());
        goto out;
    }
    if (tp_reply(g, 0, NULL)) goto out;
    CudaBackend *c = b->ctx;
    for (;;) {
        if ((rc = tp_recv(g, &type, &msg, &n))) break;
        if (type == TP_MSG_SHUTDOWN) break;
        int64_t value = 0;
        /* steps are enqueued without a wait (worker_step); anything else once they are done */
        if (type != TP_MSG_STEP) rc = sync_stream(c);
        if (!rc) switch (type) {
        case TP_MSG_BUDGET:
            value = cuda_kv_budget_bytes(b);
            rc = value < 0 ? -1 : 0;
            break;
        case TP_MSG_INIT_KV: {
            KVCacheSpec spec;
            if (n != sizeof spec) {
                rc = cvllm_errorf(CVLLM_EINVAL, "malformed KV cache message");
                break;
            }
            memcpy(&spec, msg, sizeof spec);
            rc = cuda_init_kv_cache(b, &spec);
            break;
        }
        case TP_MSG_WARMUP: rc = cuda_warmup(b); break;
        case TP_MSG_STEP: rc = worker_step(c, msg, n); break;
        default: rc = cvllm_errorf(CVLLM_EINVAL, "unknown message %u", type);
        }
        free(msg), msg = NULL;
        if (rc) { /* to rank 0, then end */
            if (!tp_failed(g)) tp_reply(g, 0, cvllm_last_error());
            break;
        }
        if (type != TP_MSG_STEP && tp_reply(g, value, NULL)) {
            rc = -1;
            break;
        }
    }
out:
    free(msg);
    if (rc && tp_failed(g)) fprintf(stderr, "cvllm worker (rank %d): %s\n", rank, cvllm_last_error());
    if (b) {
        if (tp_failed(g)) { /* like rank 0: do not wait on a kernel stuck in a collective */
            tp_group_close(g);
            _exit(1);
        }
        cuda_destroy(b);
    }
    tp_group_close(g);
    if (have_w) weights_free(&w);
    (void)have_cfg;
    return rc ? 1 : 0;
}
#endif

/* ---------------------------------------------------------------- registry entry */

int bench_cuda_ops(int argc, char **argv); /* bench_cuda.c */

const BackendEntry backend_cuda_entry = {.name = "cuda",
                                         .create = backend_cuda_create,
                                         .probe = cuda_probe,
                                         .bench_ops = bench_cuda_ops,
#ifdef CVLLM_HAVE_NCCL
                                         .worker_main = cuda_worker_main
#endif
};
