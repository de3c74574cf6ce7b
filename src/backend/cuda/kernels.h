/* kernels.h: the CUDA backend's kernels, as C launchers (defined extern "C" in the .cu files next
 * to this one). Each launcher enqueues its kernel(s) on `stream`, checks the launch, and mirrors a
 * CPU function of src/backend/cpu/ops.c (named in each .cu file's opening comment); the twins are
 * compared in tests/test_cuda_kernels.c.
 *
 * Conventions: d_* are device pointers; `adt` is the activation dtype of the matrix-product
 * inputs (the model's dtype: bf16, f16 or f32); the residual stream, the q/k/v rows and every
 * matrix-product output are f32; the KV cache holds `kvdt` (bf16, f16, f32 or fp8 e4m3). Shapes
 * are in the comments, row-major.
 *
 * fp8 e4m3 cache (--kv-cache-dtype fp8), scales as vLLM defines them: one k_scale and one
 * v_scale per cache tensor, stored = e4m3(x / scale) (round to nearest even, saturated to +-448:
 * __nv_cvt_float_to_fp8 with __NV_SATFINITE), read = f32(stored) * scale. Without calibrated
 * scales (all cvllm has) both are 1.0, vLLM's default. The other cache types ignore the scales. Launchers return 0, or a negative CVLLM_E* code with the message set (a
 * launch failure or an unsupported shape: never an abort). */
#ifndef CVLLM_BACKEND_CUDA_KERNELS_H
#define CVLLM_BACKEND_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks a CUDA runtime call; on failure sets the error message (file, line, call, CUDA's text)
 * and returns CVLLM_EBACKEND from the enclosing function. */
#define CUDA_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return cuda_error(e_, __FILE__, __LINE__, #call);                   \
    } while (0)
/* After a launch: the launch's own error (bad configuration, no kernel image). */
#define CUDA_LAUNCH_TRY() CUDA_TRY(cudaGetLastError())
int cuda_error(cudaError_t e, const char *file, int line, const char *what);
/* A switch in the environment: dflt where `name` is unset or empty, 0 where it is "0", else 1.
 * The CUDA backend's switches for measuring (README) read through it, each once. */
int cuda_env_flag(const char *name, int dflt);
/* The current device's compute capability as major * 10 + minor (0: unknown), asked once a
 * process (a process drives one GPU; tensor parallelism starts one process a rank). */
int cuda_device_cc(void);
/* The current device's SM count, asked once a process as cuda_device_cc (132 where the query
 * fails). */
int cuda_device_sms(void);
/* Whether kernels are launched with programmatic dependent launch (cuda_util.cuh's pdl_launch:
 * compute capability 9.0 or later, CVLLM_CUDA_PDL not 0); decided once a process. */
int cuda_pdl_enabled(void);

/* ---------------------------------------------------------------- elementwise (elementwise.cu) */

/* x[t, :] = f32(embed[ids[t] - v0, :]) for t < T where v0 <= ids[t] < v0 + nv, else zeros (a
 * tensor-parallel rank holds the rows [v0, v0 + nv) of the vocabulary; one GPU: 0, V).
 * CPU: cpu_to_f32 over embed_tokens rows. */
int embedding_cuda(float *d_x, const void *d_embed, DType edt, const int32_t *d_ids, int T, int H,
                   int v0, int nv, cudaStream_t stream);

/* dst [n, V] from src [ranks][n][Vs]: rank r's slice holds columns [r * Vs, r * Vs + Vs) (the last
 * one cut at V). CPU: the logits rows of cpu_forward (one device: lm_head's output as it is). */
int vocab_shards_to_rows_cuda(float *d_dst, const float *d_src, int n, int V, int Vs, int ranks,
                              cudaStream_t stream);

/* x[t] += add[t] (add may be NULL); h[t] = adt((x[t] * rsqrt(mean(x[t]^2) + eps)) * w).
 * x, add: [T, H] f32; w: [H] f32; h: [T, H] of adt.   CPU: residual_norm (backend_cpu.c) =
 * the loop x += y then rmsnorm_cpu. h may be NULL (the add alone; with add NULL too, nothing is
 * launched). */
int residual_rmsnorm_cuda(float *d_x, const float *d_add, const float *d_w, void *d_h, DType adt,
                          int T, int H, float eps, cudaStream_t stream);

/* qk_norm_rope_cuda then store_kvcache_cuda (k at column n_heads*hd, v after it, of the same
 * rows) in one launch; the qkv rows hold the normed, rotated q and k afterwards, as with the two.
 * With d_q16 (a prefill whose attention rounds q to 16 bits: AttentionParams.q16), the q heads go
 * there instead, rounded to q16dt (bf16 or f16; token t's at d_q16 + t * ldq16 elements, 16-byte
 * aligned rows), and the qkv rows are left as they were (k goes to the cache only): half q's bytes
 * written, and none of k's. With d_src (fusion "qkv16": the qkv product's output in the model's
 * 16-bit type srcdt, rows of ld elements) the raw values are read there, widened exactly, and the
 * normed q and k go to d_qkv's f32 rows (NULL: none; then d_q16 must be set, of srcdt's type).
 * CPU: qk_rope_store_job. */
int qk_norm_rope_store_cuda(float *d_qkv, int64_t ld, const void *d_src, DType srcdt,
                            const int32_t *d_positions, const float *d_inv_freq,
                            const float *d_q_norm, const float *d_k_norm, int T, int n_heads,
                            int n_kv_heads, int hd, float eps, void *d_k_cache, void *d_v_cache,
                            DType kvdt, float k_scale, float v_scale, const int64_t *d_slot_mapping,
                            void *d_q16, DType q16dt, int64_t ldq16, cudaStream_t stream);

/* y[t, n] += bias[n], y: [T, ld] (first N columns).   CPU: the bias of matmul_rows_scalar. */
int add_bias_cuda(float *d_y, int64_t ld, const float *d_bias, int T, int N, cudaStream_t stream);

/* In place on qkv [T, ld] f32 (q at column 0: n_heads heads of hd; k at column n_heads*hd:
 * n_kv_heads heads): Qwen3's per-head RMSNorm (q_norm/k_norm [hd] f32, both NULL: none), then
 * rotary embedding at positions[t] with inv_freq [hd/2] (rotate_half convention).
 * CPU: qk_rope_store_job's rmsnorm_cpu + rope_cos_sin_cpu + rope_apply_cpu. */
int qk_norm_rope_cuda(float *d_qkv, int64_t ld, const int32_t *d_positions, const float *d_inv_freq,
                      const float *d_q_norm, const float *d_k_norm, int T, int n_heads,
                      int n_kv_heads, int hd, float eps, cudaStream_t stream);

/* k_cache[slot[t]] = kvdt(k[t]), v_cache[slot[t]] = kvdt(v[t]) for slot[t] >= 0 (-1: nothing
 * written); fp8: kvdt(k[t] / k_scale), kvdt(v[t] / v_scale), the scales > 0 (else CVLLM_EINVAL).
 * k, v: rows of [T, ld] f32 (pointers at their first column); caches [slots, kv_dim].
 * CPU: the store of qk_rope_store_job. */
int store_kvcache_cuda(const float *d_k, const float *d_v, int64_t ld, void *d_k_cache,
                       void *d_v_cache, DType kvdt, float k_scale, float v_scale,
                       const int64_t *d_slot_mapping, int T, int kv_dim, cudaStream_t stream);

/* g[t, i] = adt(silu(gu[t, i]) * gu[t, I + i]), gu: [T, 2I] of gudt (f32 or adt; gate then up),
 * g: [T, I].   CPU: silu_mul_cpu. */
int silu_mul_cuda(void *d_g, DType adt, const void *d_gu, DType gudt, int T, int I,
                  cudaStream_t stream);

/* y[i, :] = x[idx[i], :] for i < n; x, y: [*, H] f32.   CPU: the logits_indices loop of
 * cpu_forward. */
int gather_rows_cuda(float *d_y, const float *d_x, const int32_t *d_idx, int n, int H,
                     cudaStream_t stream);

/* Up to 8 copies in one launch (a step's input arrays from pinned, device-mapped host memory to
 * the device: a copy engine's operation costs a few microseconds each, a launch one): seg i
 * copies bytes[i] (a multiple of 4; src, dst 4-byte aligned) from src[i] to dst[i]; where
 * rows[i] > 1, rows[i] such runs, the r-th from src[i] + r * src_pitch[i] to dst[i] + r *
 * dst_pitch[i] (pitches multiples of 4; the block tables' used columns). With ids_from,
 * segment 0 is int32 token ids (one run) and a negative one, -(r + 1), is written as
 * ids_from[r] instead (a token the step before sampled in row r: asynchronous steps). CPU:
 * memcpy of each run, then that substitution. */
#define COPY_SEGMENTS_MAX 10
typedef struct {
    const void *src[COPY_SEGMENTS_MAX];
    void *dst[COPY_SEGMENTS_MAX];
    int64_t bytes[COPY_SEGMENTS_MAX];
    int rows[COPY_SEGMENTS_MAX]; /* 0 or 1: one run */
    int64_t src_pitch[COPY_SEGMENTS_MAX], dst_pitch[COPY_SEGMENTS_MAX];
    int n;
    const int32_t *ids_from;
} CopySegments;
int copy_segments_cuda(const CopySegments *segs, cudaStream_t stream);

/* dst[i] = dt(src[i]) (f32 -> bf16 / f16 / f32 / fp8 e4m3 unscaled): tests and weight-free
 * conversions. CPU: f32_to_bf16, f32_to_f16, f32_to_fp8_e4m3 (common.h). */
int convert_f32_cuda(void *d_dst, DType dt, const float *d_src, int64_t n, cudaStream_t stream);
/* dst[i] = f32(src[i]), src of dt (fp8 unscaled): the kernels' read conversion, for the tests.
 * CPU: cpu_to_f32. */
int convert_to_f32_cuda(float *d_dst, const void *d_src, DType dt, int64_t n, cudaStream_t stream);

/* ---------------------------------------------------------------- attention */

/* What both attention kernels read (the step's device arrays; see backend.h's contract). */
typedef struct {
    const float *q; /* [T, ldq] f32: token t's heads at q + t*ldq, n_heads x hd */
    int64_t ldq;
    /* prefill, optional: q already rounded to the products' type (the cache's dtype; an fp8
     * cache's: adt) as the tensor-core kernels round it, [T, ldq16] (16-byte aligned rows;
     * qk_norm_rope_store_cuda's d_q16); q is then not read. Only where
     * attention_prefill_uses_tc(p) (else attention_prefill_cuda refuses it). */
    const void *q16;
    int64_t ldq16;
    void *out; /* [T, n_heads * hd] of adt */
    DType adt;
    const void *k_cache, *v_cache; /* this layer's [num_blocks * block_size, n_kv_heads * hd] */
    int64_t cache_rows;            /* num_blocks * block_size (0: not known; no TMA decode) */
    DType kvdt;
    float k_scale, v_scale; /* fp8 cache only: key = f32(stored) * k_scale (> 0; 1.0 without
                             * calibration, vLLM's default); ignored for the other types */
    int n_heads, n_kv_heads, hd, block_size;
    float scale;
    int num_seqs;
    const int32_t *cu_seqlens_q; /* [num_seqs + 1] */
    const int32_t *context_lens; /* [num_seqs]: keys of each sequence (0: a padding lane) */
    const int32_t *block_tables; /* [num_seqs, max_blocks_per_seq] */
    int max_blocks_per_seq;
    int max_seqlen_q, max_seqlen_k; /* bounds: grids are sized by them */
    /* decode: the order in which the sequences' blocks are launched ([num_seqs], a permutation:
     * longest context first, so that the blocks that start last are short ones), or NULL */
    const int32_t *seq_order;
    /* decode, optional, in place of seq_order (not read where this is set): each launch
     * position's sequence and facts in one record, so that a block's first tiles wait for one
     * load instead of three dependent ones (the order, then the context length and query token,
     * then the block table), and the prologue's token position and slot for none after it:
     * DEC_REC_INTS words a position, attention_decode_records' (below). NULL: the order and the
     * arrays above. */
    const int32_t *dec_rec;
    /* decode, optional (positions non-NULL): q is the qkv product's raw rows (q heads, then k,
     * then v heads, each hd wide) and the kernel does qk_norm_rope_store_cuda's work for the
     * step's tokens itself: each block norms and rotates its query heads (q_norm; NULL: no norm),
     * and the block(s) whose partition holds a sequence's last key norm and rotate its k head
     * (k_norm), and store k and v at slots[t] (skipped where slots[t] < 0) before they read it.
     * The same arithmetic as the separate launch (qk_norm_rope.cuh), bit for bit; the cache is
     * written through k_cache / v_cache. NULL: q is already normed and rotated, the cache
     * already holds the keys. */
    const int32_t *positions; /* [T] */
    /* with positions, optional: the raw rows in the model's 16-bit type qkv16dt (bf16 / f16; the
     * qkv product's output with fusion "qkv16"), ldq elements apart; q is then not read */
    const void *qkv16;
    DType qkv16dt;
    const int64_t *slots;     /* [T] */
    const float *inv_freq;    /* [hd / 2] */
    const float *q_norm, *k_norm;
    float eps;
    /* set by attention_decode_cuda itself (a caller's value is ignored): the tensor-core decode
     * kernels' lazy-rescale threshold (attention.cu, DTC_LAZY; 0: off) */
    float dec_lazy;
} AttentionParams;

/* Whether the kernels support this head_dim: any even one up to 256 (the kernels are built for
 * 16, 32, 64, 128 and 256; another runs in the next size up, its extra columns zero). */
int attention_cuda_supported(int hd);

/* Decode: one query token per sequence (the last token of each sequence's rows).
 * A block takes (sequence, kv head, up to 4 of its query heads, partition of the context);
 * lanes split head_dim in 16-byte loads; each sequence's context is split evenly in num_parts
 * partitions whose partial softmax states a second kernel merges (num_parts 1: no merge). The
 * blocks of sequence seq_order[i] are the i-th to be launched (with seq_order: see above).
 * attention_decode_num_parts picks the count from the grid size and max_seqlen_k (a graph is
 * captured with the count for max_model_len); workspace: attention_decode_ws_bytes.
 * CPU: attention_cpu (the scalar attention_task). */
size_t attention_decode_ws_bytes(int num_seqs, int n_heads, int hd, int num_parts);
int attention_decode_num_parts(const AttentionParams *p, int num_sms);
/* Whether attention_decode_cuda takes the tensor-core kernel for p's shapes (bf16 / f16 / fp8
 * cache, head_dim 64 or 128, GQA groups up to 8; CVLLM_CUDA_DEC_TC=0: never): q and the softmax
 * weights rounded to 16 bits (about 1e-2 of the output's range for bf16, 2e-3 otherwise). */
int attention_decode_uses_tc(const AttentionParams *p);
/* Whether attention_decode_cuda takes the tensor-core kernel that reads K/V by the tensor copy
 * engine (TMA): uses_tc, a bf16 / f16 cache, block_size a multiple of 16, cache_rows set, sm_90 or
 * later, CVLLM_CUDA_DEC_TMA not 0. */
int attention_decode_uses_tma(const AttentionParams *p);
int attention_decode_cuda(const AttentionParams *p, int num_parts, void *d_ws, cudaStream_t stream);
/* Tests: the decode kernels' lazy rescaling on (1, the default unless CVLLM_CUDA_DEC_LAZY=0) or
 * off (0: the running max moves whenever a tile's scores pass it); -1: back to the environment's
 * choice. For the launches that follow (a captured graph keeps what it was captured with). */
void attention_decode_set_lazy(int on);
/* The backend's seq_order (host code, backend_cuda.c): the S lanes by context length, longest
 * first (ties: lower index first), so that the blocks that start last, when the GPU runs out of
 * blocks to start, are the shortest (a long context starting late was a step's tail); a context
 * of 0 or less counts as 0. scratch: S 64-bit words. */
void attention_decode_order(const int32_t *ctx, int S, uint64_t *scratch, int32_t *order);
/* An order of S lanes folded, in place, but for its last `tail` (0 <= tail <= S), which stay
 * where they are: order[0], order[S - tail - 1], order[1], order[S - tail - 2], .., then
 * order[S - tail] .. order[S - 1] (of a longest-first order: the longest, the shortest of the
 * folded ones, the second longest, .., and last the `tail` shortest, longest first; the
 * backend's order for an fp8 cache, whose blocks of a wave then end at different times, and whose
 * launch ends on short blocks). scratch: S words. */
void attention_decode_fold(int32_t *order, int S, int tail, int32_t *scratch);
/* The decode records of AttentionParams.dec_rec (host code, backend_cuda.c), DEC_REC_INTS words a
 * launch position i (16-byte aligned): s = order[i], context_lens[s], the query token t =
 * cu_seqlens_q[s + 1] - 1, positions[t] (0 where positions is NULL or t < 0); the sequence's
 * block-table entries 0 .. DEC_REC_TAB - 1 (0 past its context's blocks): those of the keys a
 * first partition's warps ask for first (block_size >= 16); slots[t] as an int64 in words 8-9 (-1
 * where slots is NULL or t < 0), words 10-11 zero. */
#define DEC_REC_INTS 12
#define DEC_REC_TAB 4
#define DEC_REC_TAB0 4 /* the word of block-table entry 0 */
#define DEC_REC_SLOT 8 /* the word of the slot (two words) */
void attention_decode_records(const int32_t *order, int S, const int32_t *context_lens,
                              const int32_t *cu_seqlens_q, const int32_t *positions,
                              const int64_t *slots, const int32_t *block_tables,
                              int max_blocks_per_seq, int block_size, int32_t *rec);

/* Prefill (varlen, causal, cached prefix read through the block table): flash-attention style,
 * a block per (32-query tile, query head, sequence), keys in 32-key shared-memory tiles with an
 * online softmax. CPU: attention_cpu. */
int attention_prefill_cuda(const AttentionParams *p, cudaStream_t stream);
/* Whether attention_prefill_cuda takes the tensor-core kernel for p (a bf16 / f16 cache, or an
 * fp8 cache with a bf16 / f16 adt; head_dim 64 or 128, 16-byte aligned q (or q16) rows,
 * CVLLM_CUDA_ATTN_SIMT unset): q and the softmax weights are then rounded to the cache's dtype
 * (fp8: adt's; the dequantized keys and values too, exact with scales 1.0) (flash-attention's
 * arithmetic), within about 1e-2 (bf16) or 2e-3 (f16) of the f32 twin instead of f32 rounding. */
int attention_prefill_uses_tc(const AttentionParams *p);
/* The 16-bit type those kernels compute in (q16's type): the cache's dtype, an fp8 cache's adt. */
DType attention_prefill_tc_dtype(const AttentionParams *p);

/* ---------------------------------------------------------------- matrix products (gemm.c) */

typedef struct CudaGemm CudaGemm;
/* A cuBLASLt handle with a workspace of ws_bytes (device memory owned by the caller). */
int gemm_create(CudaGemm **out, void *d_ws, size_t ws_bytes);
void gemm_destroy(CudaGemm *g);
/* y[T, N] (row stride ldy, f32) = x[T, K] (adt, row stride K) @ W[N, K]^T (adt): adt in, f32
 * accumulation (bf16/f16 on the tensor cores; f32 exactly, no TF32). CPU: matmul_cpu. */
int gemm_cuda(CudaGemm *g, float *d_y, int64_t ldy, const void *d_x, const void *d_w, DType adt,
              int T, int N, int K, cudaStream_t stream);
/* The same with y of ydt: f32 (gemm_cuda) or adt (the f32 sums rounded to it once, as
 * transformers' bf16 nn.Linear writes them). CPU: matmul_cpu, then the rounding. */
int gemm_cuda_to(CudaGemm *g, void *d_y, DType ydt, int64_t ldy, const void *d_x, const void *d_w,
                 DType adt, int T, int N, int K, cudaStream_t stream);
/* y[T, N] (f32) += x @ W^T: each sum added to y once, in f32 (a residual stream updated in place:
 * the product's output is not written and read back). CPU: matmul_cpu, then the add. */
int gemm_cuda_acc(CudaGemm *g, float *d_y, int64_t ldy, const void *d_x, const void *d_w,
                  DType adt, int T, int N, int K, cudaStream_t stream);
/* Plans made from now on take the heuristic's rank-th algorithm (0: its first, the default;
 * bench ops gemm-algos). A plan whose product has no rank-th one fails. */
int gemm_set_algo_rank(CudaGemm *g, int rank);
/* The cuBLASLt configuration of the plan for this product into buf (bench); -1 if none. */
int gemm_algo_desc(CudaGemm *g, int T, int N, int K, int64_t ldy, DType adt, char *buf, size_t n);
/* Products of gemv_max_t < T <= max_t tokens and N <= K go to gemm_mma.cu from now on (0:
 * none); the default is CVLLM_CUDA_MMA_MAX_T's. */
void gemm_set_mma_max_t(CudaGemm *g, int max_t);
/* Products of up to max_t tokens with N <= K that neither gemv.cu nor gemm_mma.cu takes go to
 * gemm_tma.cu from now on, where it can run them (0: none, every one to cuBLASLt); the default is
 * CVLLM_CUDA_TMA_MAX_T's (64). */
void gemm_set_tma_max_t(CudaGemm *g, int max_t);

/* y[T, N] = x[T, K] @ W[N, K]^T on the tensor cores without cuBLASLt (gemm_mma.cu), for decode
 * sizes: bf16 / f16, K a multiple of 64, x and W 16-byte aligned (gemm_mma_supported); y of ydt
 * (f32 or adt) or, with accumulate (f32 y), y += the sums; gemm_cuda's semantics. Launched with
 * programmatic dependent launch; the same bits at every run. */
int gemm_mma_supported(DType adt, int T, int K, const void *d_x, const void *d_w);
int gemm_mma_cuda(void *d_y, DType ydt, int accumulate, int64_t ldy, const void *d_x,
                  const void *d_w, DType adt, int T, int N, int K, cudaStream_t stream);

/* The same product fed by the tensor copy engine (gemm_tma.cu): Hopper (compute capability 9.0,
 * a build with sm_90a code) only, bf16 / f16, K a multiple of 64, x and W 16-byte aligned
 * (gemm_tma_supported); gemm_mma_cuda's semantics, programmatic launch, the same bits at every
 * run. */
int gemm_tma_supported(DType adt, int T, int K, const void *d_x, const void *d_w);
int gemm_tma_cuda(void *d_y, DType ydt, int accumulate, int64_t ldy, const void *d_x,
                  const void *d_w, DType adt, int T, int N, int K, cudaStream_t stream);

/* y[T, N] (row stride ldy, f32) = x[T, K] @ W[N, K]^T for a few tokens (gemv.cu): bf16 / f16,
 * T <= 8, K a multiple of 8, x and W 16-byte aligned (gemv_cuda_supported). gemm_cuda takes it
 * for T <= CVLLM_CUDA_GEMV_MAX_T (default 4; 0: never). CPU: matmul_cpu. */
int gemv_cuda_supported(DType adt, int T, int K, const void *d_x, const void *d_w);
int gemv_cuda(float *d_y, int64_t ldy, const void *d_x, const void *d_w, DType adt, int T, int N,
              int K, cudaStream_t stream);
/* The same with y of ydt (f32 or adt, as gemm_cuda_to); accumulate (f32 y only): y += the sums,
 * as gemm_cuda_acc. */
int gemv_cuda_out(void *d_y, DType ydt, int accumulate, int64_t ldy, const void *d_x,
                  const void *d_w, DType adt, int T, int N, int K, cudaStream_t stream);

/* One token's gate/up product with the SiLU folded in (gemv.cu; batch-1 decode): W [2N, K] of adt
 * (the gate rows, then the up rows), x [K] of adt, g [N] of adt = adt(silu(W[:N] x) * (W[N:] x)),
 * the two dots rounded to gudt first (DTYPE_F32: not; or adt): gemv_cuda_out (a warp a row) into
 * a gudt gate/up row then silu_mul_cuda, bit for bit, in one launch. Same requirements as
 * gemv_cuda at T = 1; another gudt is refused. CPU: matmul_cpu then silu_mul_cpu. */
int gemv_silu_pair_cuda(void *d_g, const void *d_x, const void *d_w, DType adt, DType gudt, int N,
                        int K, cudaStream_t stream);
/* Whether gemv_silu_pair_cuda's grid (a block per 8 of the N outputs) is resident at once on
 * num_sms SMs. The backend takes it only then: with more, its last wave runs on part of the GPU
 * (H200, qwen3-8b, I = 12288: 1,536 blocks, 2.3 waves, batch-1 decode 193.4 tok/s against 195.8
 * for the unfused pair's 3,072 blocks; qwen3-0.6b, 384 blocks: 913 against 883). */
int gemv_silu_pair_one_wave(DType adt, int N, int num_sms);

/* ---------------------------------------------------------------- sampling (sampler.cu) */

/* One row's parameters on the device (built from backend.h's SamplingRow). */
typedef struct {
    float temperature, top_p, min_p;
    int top_k;
    float presence_penalty, frequency_penalty, repetition_penalty;
    int num_logprobs; /* -1: none */
    uint64_t seed;
    uint64_t draw_index; /* the uniform's counter: the output index of the token drawn now */
    int64_t ids_offset;  /* penalties: prompt ids then output ids at ids[ids_offset ..] */
    int num_prompt, num_output;
    int has_penalty;
} CudaSamplingRow;

#define CUDA_SAMPLER_MAX_LOGPROBS 20

/* Bytes of scratch for rows of vocab (the penalty counts: int32 [rows, vocab], zero between
 * calls: the kernel leaves them as it found them). */
size_t sampler_cuda_scratch_bytes(int rows, int vocab);
/* For each row r < n of logits [n, vocab] of ldt, f32 or bf16 (never modified; read as f32):
 * token[r], logprob[r] (the sampled
 * id's log-softmax of the raw logits), top_ids/top_logprobs [n, CUDA_SAMPLER_MAX_LOGPROBS] (the
 * first num_logprobs filled). Semantics of backend.h: penalties, temperature, top-k, top-p,
 * min-p, draw with cvllm_uniform(seed, draw_index), or without a filter the exponential race
 * keyed by (seed, draw_index); temperature 0: argmax. d_scratch zeroed once before the first
 * call (the kernels leave it zeroed). CPU: the CPU sampler. */
/* h_rows: the host's copy of d_rows, or NULL (then one block a row): with it, rows that are all
 * greedy or a temperature alone go to the race kernel (a row over many blocks), and up to a wave
 * of rows with min-p but none of penalties, top-k, top-p or log-probs run over thread-block
 * clusters of 8 blocks (sm_90; the same tokens either way; CVLLM_CUDA_SAMPLER=block: never). */
int sampler_cuda(const void *d_logits, DType ldt, int n, int vocab, const CudaSamplingRow *d_rows,
                 const CudaSamplingRow *h_rows, const int32_t *d_ids, int32_t *d_token,
                 float *d_logprob, int32_t *d_top_ids, float *d_top_logprobs, void *d_scratch,
                 cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
