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
 * accumulate in f32 into f32 outputs; the residual stream, q/k/v and the norms are f32; the
 * KV cache holds the model's dtype by default (--kv-cache-dtype auto, as vLLM on a GPU).
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
#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/ops.h" /* rope_inv_freq_cpu: the same inverse frequencies */
#include "backend/cuda/kernels.h"
#include "common.h"

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
 * engine's scheduling and bookkeeping; the GPU idles then). A graph replay is one segment. */
enum { PC_INPUTS, PC_GEMM, PC_ATTN, PC_OTHER, PC_LMHEAD, PC_GRAPH, PC_SAMPLER, PC_N };
static const char *const PC_NAMES[PC_N] = {"inputs",  "matmul",       "attention", "other kernels",
                                           "lm_head", "graph replay", "sampling"};
#define PROF_MAX_EVENTS 1024
typedef struct {
    int on, active, n;
    cudaEvent_t ev[PROF_MAX_EVENTS];
    int cls[PROF_MAX_EVENTS];
    double gpu_ms[2][PC_N];
    double wall_s[2], between_s, t_enter, last_return;
    long long steps[2], tokens[2];
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
    int H, heads, kvh, hd, qd, kvd, qkvd, I, V, L, Tmax, Smax, max_blocks;

    void *d_weights; /* owned: every weight, carved into the fields below */
    size_t weights_bytes;
    CudaLayer *layers;           /* host array [L] of device pointers */
    const void *embed, *lm_head; /* [V, H] (the same buffer when tied) */
    float *final_norm, *inv_freq;

    void *d_ws; /* owned: the activation workspace, carved below */
    size_t ws_bytes;
    float *x;      /* [Tmax, H] residual stream */
    void *h;       /* [Tmax, H] normed input (adt) */
    float *qkv;    /* [Tmax, qkvd] */
    void *att;     /* [Tmax, qd] attention output (adt) */
    float *tmp;    /* [Tmax, H] product outputs added to x */
    float *gu;     /* [Tmax, 2 I] */
    void *g;       /* [Tmax, I] (adt) */
    float *xl;     /* [Smax, H] rows whose logits are wanted */
    void *hl;      /* [Smax, H] (adt) */
    float *logits; /* [Smax, V] */
    void *attn_ws; /* decode partitions */
    size_t attn_ws_bytes;
    void *gemm_ws;
    CudaGemm *gemm;
    /* step inputs (device) and their pinned host staging, same layout */
    void *d_in, *h_in;
    size_t in_bytes;
    int32_t *d_ids, *d_pos, *d_cu_q, *d_ctx, *d_lidx, *d_tables;
    int64_t *d_slots;
    int32_t *h_ids, *h_pos, *h_cu_q, *h_ctx, *h_lidx, *h_tables;
    int64_t *h_slots;
    /* sampling: rows, id histories, outputs (device + pinned host) */
    CudaSamplingRow *d_rows, *h_rows;
    int32_t *d_hist, *h_hist;
    int64_t hist_cap;
    int32_t *d_tok, *h_tok, *d_top, *h_top;
    float *d_lp, *h_lp, *d_tlp, *h_tlp;
    void *d_sampler_scratch;

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
    for (int i = 0; i + 1 < p->n; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[i], p->ev[i + 1]) == cudaSuccess)
            p->gpu_ms[phase][p->cls[i]] += ms;
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

/* Copies a weight tensor into device memory at dst (its stored dtype). */
static int upload(void *dst, const Tensor *t, size_t bytes) {
    CUDA_TRY(cudaMemcpy(dst, t->data, bytes, cudaMemcpyHostToDevice));
    return 0;
}

/* A 1-D tensor widened to f32 on the device (through a host copy: kilobytes). */
static int upload_f32(float *dst, const Tensor *t, int64_t n, float *host_tmp) {
    cpu_to_f32(host_tmp, t->data, t->dtype, 0, n);
    CUDA_TRY(cudaMemcpy(dst, host_tmp, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

static int load_weights(CudaBackend *c, const ModelWeights *w) {
    const size_t es = dtype_size(c->adt);
    const int H = c->H, L = c->L;
    const int tied = w->lm_head.data == w->embed_tokens.data;
    for (int pass = 0; pass < 2; pass++) {
        char *base = c->d_weights;
        size_t off = 0;
        const void *embed = carve(base, &off, (size_t)c->V * H * es);
        const void *lm = tied ? embed : carve(base, &off, (size_t)c->V * H * es);
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
                                    "fit on this GPU",
                                    off / 1073741824.0, c->gpu_name, fr / 1073741824.0,
                                    tot / 1073741824.0);
            }
            continue;
        }
        c->embed = embed, c->lm_head = lm, c->final_norm = fn, c->inv_freq = invf;
    }
    /* the copies */
    int rc = 0;
    float *tmp = xmalloc((size_t)(c->qkvd > H ? c->qkvd : H) * sizeof(float) + 4096);
    const size_t ve = (size_t)c->V * H * es;
    if ((rc = upload((void *)c->embed, &w->embed_tokens, ve))) goto out;
    if (!tied && (rc = upload((void *)c->lm_head, &w->lm_head, ve))) goto out;
    if ((rc = upload_f32(c->final_norm, &w->norm, H, tmp))) goto out;
    float *inv = xmalloc((size_t)c->hd / 2 * sizeof(float));
    rope_inv_freq_cpu(&c->cfg, c->hd, inv);
    cudaError_t e = cudaMemcpy(c->inv_freq, inv, (size_t)c->hd / 2 * 4, cudaMemcpyHostToDevice);
    free(inv);
    if (e != cudaSuccess) {
        rc = cuda_error(e, __FILE__, __LINE__, "inv_freq");
        goto out;
    }
    for (int l = 0; l < c->L && !rc; l++) {
        const LayerWeights *lw = &w->layers[l];
        CudaLayer *cl = &c->layers[l];
        char *qkv = (char *)cl->qkv_w, *gu = (char *)cl->gu_w;
        if ((rc = upload(qkv, &lw->q_proj, (size_t)c->qd * H * es)) ||
            (rc = upload(qkv + (size_t)c->qd * H * es, &lw->k_proj, (size_t)c->kvd * H * es)) ||
            (rc = upload(qkv + (size_t)(c->qd + c->kvd) * H * es, &lw->v_proj,
                         (size_t)c->kvd * H * es)) ||
            (rc = upload((void *)cl->o_w, &lw->o_proj, (size_t)H * c->qd * es)) ||
            (rc = upload(gu, &lw->gate_proj, (size_t)c->I * H * es)) ||
            (rc = upload(gu + (size_t)c->I * H * es, &lw->up_proj, (size_t)c->I * H * es)) ||
            (rc = upload((void *)cl->down_w, &lw->down_proj, (size_t)H * c->I * es)) ||
            (rc = upload_f32(cl->in_norm, &lw->input_layernorm, H, tmp)) ||
            (rc = upload_f32(cl->post_norm, &lw->post_attention_layernorm, H, tmp)))
            break;
        if (cl->q_norm && ((rc = upload_f32(cl->q_norm, &lw->q_norm, c->hd, tmp)) ||
                           (rc = upload_f32(cl->k_norm, &lw->k_norm, c->hd, tmp))))
            break;
        if (cl->qkv_bias) {
            cpu_to_f32(tmp, lw->q_bias.data, lw->q_bias.dtype, 0, c->qd);
            cpu_to_f32(tmp + c->qd, lw->k_bias.data, lw->k_bias.dtype, 0, c->kvd);
            cpu_to_f32(tmp + c->qd + c->kvd, lw->v_bias.data, lw->v_bias.dtype, 0, c->kvd);
            e = cudaMemcpy(cl->qkv_bias, tmp, (size_t)c->qkvd * 4, cudaMemcpyHostToDevice);
            if (e != cudaSuccess) rc = cuda_error(e, __FILE__, __LINE__, "qkv bias");
        }
        if (!rc && cl->o_bias) rc = upload_f32(cl->o_bias, &lw->o_bias, H, tmp);
    }
out:
    free(tmp);
    return rc;
}

/* The activation workspace, the step inputs and the sampler's buffers (device and pinned). */
static int alloc_workspace(CudaBackend *c) {
    const size_t T = (size_t)c->Tmax, S = (size_t)c->Smax, es = dtype_size(c->adt);
    /* decode attention partitions: S * parts stays below S + 4 * SMs (attention_decode_num_parts
     * gives a sequence more than one partition only while the grid is small) */
    int parts_max = 1;
    for (int s = 1; s <= c->Smax; s++) {
        AttentionParams p = {.n_heads = c->heads,
                             .n_kv_heads = c->kvh,
                             .hd = c->hd,
                             .num_seqs = s,
                             .max_seqlen_k = c->opt.max_model_len};
        int parts = attention_decode_num_parts(&p, c->num_sms);
        size_t b = attention_decode_ws_bytes(s, c->heads, c->hd, parts);
        if (b > c->attn_ws_bytes) c->attn_ws_bytes = b;
        if (parts > parts_max) parts_max = parts;
    }
    for (int pass = 0; pass < 2; pass++) {
        char *base = c->d_ws;
        size_t off = 0;
        c->x = carve(base, &off, T * c->H * 4);
        c->h = carve(base, &off, T * c->H * es);
        c->qkv = carve(base, &off, T * c->qkvd * 4);
        c->att = carve(base, &off, T * c->qd * es);
        c->tmp = carve(base, &off, T * c->H * 4);
        c->gu = carve(base, &off, T * 2 * c->I * 4);
        c->g = carve(base, &off, T * c->I * es);
        c->xl = carve(base, &off, S * c->H * 4);
        c->hl = carve(base, &off, S * c->H * es);
        c->logits = carve(base, &off, S * c->V * 4);
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
    /* step inputs: the same layout on both sides, so each array is one copy */
    c->hist_cap = (int64_t)c->Smax * (c->opt.max_model_len + 1);
    for (int pass = 0; pass < 2; pass++) {
        for (int side = 0; side < 2; side++) {
            char *base = pass ? (side ? c->h_in : c->d_in) : NULL;
            size_t off = 0;
            int32_t *ids = carve(base, &off, T * 4), *pos = carve(base, &off, T * 4);
            int64_t *slots = carve(base, &off, T * 8);
            int32_t *cu = carve(base, &off, (S + 1) * 4), *ctx = carve(base, &off, S * 4),
                    *lidx = carve(base, &off, S * 4);
            int32_t *tables = carve(base, &off, S * (size_t)c->max_blocks * 4);
            CudaSamplingRow *rows = carve(base, &off, S * sizeof(CudaSamplingRow));
            int32_t *hist = carve(base, &off, (size_t)c->hist_cap * 4);
            int32_t *tok = carve(base, &off, S * 4),
                    *top = carve(base, &off, S * CUDA_SAMPLER_MAX_LOGPROBS * 4);
            float *lp = carve(base, &off, S * 4),
                  *tlp = carve(base, &off, S * CUDA_SAMPLER_MAX_LOGPROBS * 4);
            if (pass == 0) {
                c->in_bytes = off;
                break;
            }
            if (side == 0) {
                c->d_ids = ids, c->d_pos = pos, c->d_slots = slots, c->d_cu_q = cu, c->d_ctx = ctx;
                c->d_lidx = lidx, c->d_tables = tables, c->d_rows = rows, c->d_hist = hist;
                c->d_tok = tok, c->d_top = top, c->d_lp = lp, c->d_tlp = tlp;
            } else {
                c->h_ids = ids, c->h_pos = pos, c->h_slots = slots, c->h_cu_q = cu, c->h_ctx = ctx;
                c->h_lidx = lidx, c->h_tables = tables, c->h_rows = rows, c->h_hist = hist;
                c->h_tok = tok, c->h_top = top, c->h_lp = lp, c->h_tlp = tlp;
            }
        }
        if (pass == 0) {
            cudaError_t e = cudaMalloc(&c->d_in, c->in_bytes);
            if (e == cudaSuccess) e = cudaMallocHost(&c->h_in, c->in_bytes);
            if (e != cudaSuccess) {
                cudaGetLastError();
                return cvllm_errorf(CVLLM_ENOMEM,
                                    "cuda backend: %.1f MiB of step buffers cannot "
                                    "be allocated",
                                    c->in_bytes / 1048576.0);
            }
        }
    }
    return gemm_create(&c->gemm, c->gemm_ws, GEMM_WS_BYTES);
}

static int cuda_forward(Backend *b, const StepInputs *in, StepOutputs *out);
static int64_t cuda_kv_block_bytes(Backend *b, int block_size, DType dtype);
static DType cuda_kv_default_dtype(Backend *b);
static int64_t cuda_kv_budget_bytes(Backend *b);
static int cuda_init_kv_cache(Backend *b, const KVCacheSpec *spec);
static int cuda_warmup(Backend *b);
static void cuda_destroy(Backend *b);

static int backend_cuda_create(const ModelConfig *cfg, const ModelWeights *w,
                               const BackendOptions *o, Backend **out) {
    *out = NULL;
    char desc[256];
    if (!cuda_probe(desc, sizeof desc)) return cvllm_errorf(CVLLM_EBACKEND, "%s", desc);
    if (o->tp_size > 1)
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "cuda backend: tensor parallelism is not "
                            "implemented yet (tp_size %d)",
                            o->tp_size);
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
    int rc;
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
    c->H = H, c->heads = cfg->num_attention_heads, c->kvh = cfg->num_key_value_heads, c->hd = hd;
    c->qd = qd, c->kvd = kvd, c->qkvd = qd + 2 * kvd, c->I = I, c->V = cfg->vocab_size;
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
    b->kv_budget_bytes = cuda_kv_budget_bytes;
    b->init_kv_cache = cuda_init_kv_cache;
    b->warmup = cuda_warmup;
    b->destroy = cuda_destroy;

    double t0 = now_seconds();
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
    const char *pe = getenv("CVLLM_CUDA_PROFILE");
    if (pe && *pe && strcmp(pe, "0") != 0) {
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
    if (c) {
        prof_report(c);
        for (int i = 0; i < PROF_MAX_EVENTS && c->prof.on; i++)
            if (c->prof.ev[i]) cudaEventDestroy(c->prof.ev[i]);
        for (int i = 0; i < c->num_buckets; i++)
            if (c->graphs[i]) cudaGraphExecDestroy(c->graphs[i]);
        gemm_destroy(c->gemm);
        cudaFree(c->d_weights);
        cudaFree(c->d_ws);
        cudaFree(c->d_in);
        cudaFreeHost(c->h_in);
        cudaFree(c->d_kv);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c->layers);
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

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) return rc_;                                                                       \
    } while (0)

/* Enqueues embedding .. lm_head on c->stream (no host synchronization: a graph captures it). */
static int run_model(CudaBackend *c, const ModelLaunch *m) {
    cudaStream_t st = c->stream;
    const int T = m->T, H = c->H;
    const float eps = c->cfg.rms_norm_eps;
    const size_t layer_elems = (size_t)m->num_blocks * c->block_size * c->kvd;
    const size_t kes = dtype_size(c->kvdt);
    PROF(c, PC_OTHER);
    TRY(embedding_cuda(c->x, c->embed, c->adt, c->d_ids, T, H, st));
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
                          .scale = 1.0f / sqrtf((float)c->hd),
                          .num_seqs = m->S,
                          .cu_seqlens_q = c->d_cu_q,
                          .context_lens = c->d_ctx,
                          .block_tables = c->d_tables,
                          .max_blocks_per_seq = c->max_blocks,
                          .max_seqlen_q = m->max_q,
                          .max_seqlen_k = m->max_k};
    int parts = m->parts;
    if (m->decode && parts <= 0) parts = attention_decode_num_parts(&ap, c->num_sms);
    for (int l = 0; l < c->L; l++) {
        const CudaLayer *cl = &c->layers[l];
        char *kc = (char *)m->kv + (size_t)l * layer_elems * kes;
        char *vc = (char *)m->kv + (size_t)(c->L + l) * layer_elems * kes;
        PROF(c, PC_GEMM);
        TRY(gemm_cuda(c->gemm, c->qkv, c->qkvd, c->h, cl->qkv_w, c->adt, T, c->qkvd, H, st));
        PROF(c, PC_OTHER);
        if (cl->qkv_bias) TRY(add_bias_cuda(c->qkv, c->qkvd, cl->qkv_bias, T, c->qkvd, st));
        TRY(qk_norm_rope_store_cuda(c->qkv, c->qkvd, c->d_pos, c->inv_freq, cl->q_norm, cl->k_norm,
                                    T, c->heads, c->kvh, c->hd, eps, kc, vc, c->kvdt, 1.0f, 1.0f,
                                    c->d_slots, st));
        ap.k_cache = kc;
        ap.v_cache = vc;
        PROF(c, PC_ATTN);
        if (m->decode)
            TRY(attention_decode_cuda(&ap, parts, c->attn_ws, st));
        else
            TRY(attention_prefill_cuda(&ap, st));
        PROF(c, PC_GEMM);
        TRY(gemm_cuda(c->gemm, c->tmp, H, c->att, cl->o_w, c->adt, T, H, c->qd, st));
        PROF(c, PC_OTHER);
        if (cl->o_bias) TRY(add_bias_cuda(c->tmp, H, cl->o_bias, T, H, st));
        TRY(residual_rmsnorm_cuda(c->x, c->tmp, cl->post_norm, c->h, c->adt, T, H, eps, st));
        PROF(c, PC_GEMM);
        TRY(gemm_cuda(c->gemm, c->gu, 2 * c->I, c->h, cl->gu_w, c->adt, T, 2 * c->I, H, st));
        PROF(c, PC_OTHER);
        TRY(silu_mul_cuda(c->g, c->adt, c->gu, T, c->I, st));
        PROF(c, PC_GEMM);
        TRY(gemm_cuda(c->gemm, c->tmp, H, c->g, cl->down_w, c->adt, T, H, c->I, st));
        PROF(c, PC_OTHER);
        TRY(residual_rmsnorm_cuda(c->x, c->tmp, l + 1 < c->L ? c->layers[l + 1].in_norm : NULL,
                                  l + 1 < c->L ? c->h : NULL, c->adt, T, H, eps, st));
    }
    if (m->num_logits > 0) {
        PROF(c, PC_OTHER);
        TRY(gather_rows_cuda(c->xl, c->x, c->d_lidx, m->num_logits, H, st));
        TRY(residual_rmsnorm_cuda(c->xl, NULL, c->final_norm, c->hl, c->adt, m->num_logits, H, eps,
                                  st));
        PROF(c, PC_LMHEAD);
        TRY(gemm_cuda(c->gemm, c->logits, c->V, c->hl, c->lm_head, c->adt, m->num_logits, c->V, H,
                      st));
    }
    return 0;
}

/* ---------------------------------------------------------------- KV cache and warm-up */

static int64_t cuda_kv_block_bytes(Backend *b, int block_size, DType dtype) {
    CudaBackend *c = b->ctx;
    return 2LL * c->L * block_size * c->kvd * (int64_t)dtype_size(dtype);
}

static DType cuda_kv_default_dtype(Backend *b) {
    return ((CudaBackend *)b->ctx)->adt;
}

/* Copies the staged inputs of T tokens, S sequences, n logits rows to the device. */
static int copy_inputs(CudaBackend *c, int T, int S, int n_logits) {
    cudaStream_t st = c->stream;
    CUDA_TRY(cudaMemcpyAsync(c->d_ids, c->h_ids, (size_t)T * 4, cudaMemcpyHostToDevice, st));
    CUDA_TRY(cudaMemcpyAsync(c->d_pos, c->h_pos, (size_t)T * 4, cudaMemcpyHostToDevice, st));
    CUDA_TRY(cudaMemcpyAsync(c->d_slots, c->h_slots, (size_t)T * 8, cudaMemcpyHostToDevice, st));
    CUDA_TRY(
        cudaMemcpyAsync(c->d_cu_q, c->h_cu_q, (size_t)(S + 1) * 4, cudaMemcpyHostToDevice, st));
    CUDA_TRY(cudaMemcpyAsync(c->d_ctx, c->h_ctx, (size_t)S * 4, cudaMemcpyHostToDevice, st));
    if (n_logits > 0)
        CUDA_TRY(cudaMemcpyAsync(c->d_lidx, c->h_lidx, (size_t)n_logits * 4, cudaMemcpyHostToDevice,
                                 st));
    CUDA_TRY(cudaMemcpyAsync(c->d_tables, c->h_tables, (size_t)S * c->max_blocks * 4,
                             cudaMemcpyHostToDevice, st));
    return 0;
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
    int rc = copy_inputs(c, T, S, S);
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
    cudaError_t e = cudaStreamSynchronize(c->stream);
    cudaFree(kv);
    if (!rc && e != cudaSuccess) rc = cuda_error(e, __FILE__, __LINE__, "warm-up step");
    return rc;
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
            return 0;
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
        TRY(copy_inputs(c, B, B, B));
        AttentionParams ap = {.n_heads = c->heads,
                              .n_kv_heads = c->kvh,
                              .hd = c->hd,
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
        CUDA_TRY(cudaStreamSynchronize(c->stream));
        cudaGraph_t g;
        CUDA_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
        int rc = run_model(c, &m);
        cudaError_t e = cudaStreamEndCapture(c->stream, &g);
        if (rc) return rc;
        if (e != cudaSuccess) return cuda_error(e, __FILE__, __LINE__, "graph capture");
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
        const int pen = r->repetition_penalty != 1.0f || r->frequency_penalty != 0.0f ||
                        r->presence_penalty != 0.0f;
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
    CUDA_TRY(cudaMemcpyAsync(c->d_rows, c->h_rows, (size_t)in->num_logits * sizeof(CudaSamplingRow),
                             cudaMemcpyHostToDevice, st));
    if (nid)
        CUDA_TRY(
            cudaMemcpyAsync(c->d_hist, c->h_hist, (size_t)nid * 4, cudaMemcpyHostToDevice, st));
    return 0;
}

static int cuda_forward(Backend *b, const StepInputs *in, StepOutputs *out) {
    CudaBackend *c = b->ctx;
    int rc = validate(c, in);
    if (rc) return rc;
    CUDA_TRY(cudaSetDevice(c->dev)); /* the engine may step on another thread than create's */
    const int T = in->num_tokens, S = in->num_seqs, n = in->num_logits;
    const int decode = in->max_seqlen_q == 1; /* one new token per sequence */
    prof_begin(c);
    /* stage the inputs in pinned memory (tables repacked to this backend's row stride) */
    memcpy(c->h_ids, in->input_ids, (size_t)T * 4);
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
    if (bi >= 0 && identity) {
        const int B = c->buckets[bi];
        pad_lanes(c, S, B);
        PROF(c, PC_INPUTS);
        TRY(copy_inputs(c, B, B, B));
        PROF(c, PC_GRAPH);
        CUDA_TRY(cudaGraphLaunch(c->graphs[bi], c->stream));
    } else {
        PROF(c, PC_INPUTS);
        TRY(copy_inputs(c, T, S, n));
        ModelLaunch m = {.T = T,
                         .S = S,
                         .max_q = in->max_seqlen_q,
                         .max_k = in->max_seqlen_k,
                         .num_logits = n,
                         .decode = decode,
                         .parts = 0,
                         .kv = c->d_kv,
                         .num_blocks = c->num_blocks};
        TRY(run_model(c, &m));
    }
    if (n == 0) {
        PROF(c, PC_INPUTS); /* the end mark */
        CUDA_TRY(cudaStreamSynchronize(c->stream));
        prof_end(c, decode, T);
        return 0;
    }
    PROF(c, PC_SAMPLER);
    TRY(stage_sampling(c, in));
    TRY(sampler_cuda(c->logits, n, c->V, c->d_rows, c->d_hist, c->d_tok, c->d_lp, c->d_top,
                     c->d_tlp, c->d_sampler_scratch, c->stream));
    cudaStream_t st = c->stream;
    CUDA_TRY(cudaMemcpyAsync(c->h_tok, c->d_tok, (size_t)n * 4, cudaMemcpyDeviceToHost, st));
    int any_lp = 0;
    for (int i = 0; i < n; i++)
        any_lp |= in->sampling[i].num_logprobs >= 0;
    if (any_lp) {
        CUDA_TRY(cudaMemcpyAsync(c->h_lp, c->d_lp, (size_t)n * 4, cudaMemcpyDeviceToHost, st));
        CUDA_TRY(cudaMemcpyAsync(c->h_top, c->d_top, (size_t)n * CUDA_SAMPLER_MAX_LOGPROBS * 4,
                                 cudaMemcpyDeviceToHost, st));
        CUDA_TRY(cudaMemcpyAsync(c->h_tlp, c->d_tlp, (size_t)n * CUDA_SAMPLER_MAX_LOGPROBS * 4,
                                 cudaMemcpyDeviceToHost, st));
    }
    if (out->logits) /* golden tests only: the whole rows cross to the host */
        CUDA_TRY(cudaMemcpyAsync(out->logits, c->logits, (size_t)n * c->V * 4,
                                 cudaMemcpyDeviceToHost, st));
    PROF(c, PC_SAMPLER); /* the end mark */
    CUDA_TRY(cudaStreamSynchronize(st));
    prof_end(c, decode, T);
    memcpy(out->token_ids, c->h_tok, (size_t)n * 4);
    for (int i = 0; i < n && any_lp; i++) {
        const int k = in->sampling[i].num_logprobs;
        if (k < 0) continue;
        if (out->logprobs) out->logprobs[i] = c->h_lp[i];
        for (int j = 0; j < k && j < CUDA_SAMPLER_MAX_LOGPROBS; j++) {
            if (out->top_ids)
                out->top_ids[(size_t)i * CVLLM_MAX_LOGPROBS + j] =
                    c->h_top[(size_t)i * CUDA_SAMPLER_MAX_LOGPROBS + j];
            if (out->top_logprobs)
                out->top_logprobs[(size_t)i * CVLLM_MAX_LOGPROBS + j] =
                    c->h_tlp[(size_t)i * CUDA_SAMPLER_MAX_LOGPROBS + j];
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- registry entry */

int bench_cuda_ops(int argc, char **argv); /* bench_cuda.c */

const BackendEntry backend_cuda_entry = {.name = "cuda",
                                         .create = backend_cuda_create,
                                         .probe = cuda_probe,
                                         .bench_ops = bench_cuda_ops};
