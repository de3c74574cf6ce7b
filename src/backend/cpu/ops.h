/* ops.h: the CPU backend's kernels. Each op has a portable C reference (readable, the one every
 * other backend is checked against) and, where it matters for speed, AVX2 (+FMA/F16C) and
 * AVX-512 variants in *_avx2.c / *_avx512.c, chosen at run time by cpu_isa_get().
 *
 * Numerics: all arithmetic in f32. Weights stay in their stored dtype (bf16 / f16 / f32) and are
 * widened on the fly inside the kernels. Every fast matmul computes each output element with the
 * same operation sequence whatever the tile, the thread split or the number of tokens T, so a
 * token's result does not depend on what else is in the batch or on the thread count. */
#ifndef CVLLM_BACKEND_CPU_OPS_H
#define CVLLM_BACKEND_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/threadpool.h"
#include "model/config.h"
#include "model/weights.h"

/* ---------------------------------------------------------------- instruction-set dispatch */

typedef enum { CPU_ISA_SCALAR = 0, CPU_ISA_AVX2, CPU_ISA_AVX512 } CpuIsa;

/* The best variant this CPU and this build support. */
CpuIsa cpu_isa_best(void);
/* The variant in use: CVLLM_CPU_ISA=scalar|avx2|avx512 if set (capped at cpu_isa_best), else
 * the best. */
CpuIsa cpu_isa_get(void);
/* Forces a variant (tests, benchmarks); capped at cpu_isa_best(). Returns the one now in use. */
CpuIsa cpu_isa_set(CpuIsa isa);
const char *cpu_isa_name(CpuIsa isa);
/* Whether the batch-1 matmul issues software prefetches: CVLLM_CPU_PREFETCH=0|1 if set, else on
 * for Intel CPUs (measured +13-30% GB/s) and off elsewhere (Zen 3: -10-25%). */
int cpu_matmul_prefetch(void);
void cpu_matmul_set_prefetch(int on); /* tests, benchmarks */

/* ---------------------------------------------------------------- element conversion */

/* out[0..n) = f32(src[off .. off+n)) for a bf16 / f16 / f32 / fp8 e4m3 array (fp8: scale 1). */
void cpu_to_f32(float *out, const void *src, DType dt, int64_t off, int64_t n);

/* ---------------------------------------------------------------- matmul */

/* y[t, n] = sum_k x[t, k] * W[n, k] (+ bias[n]) for t < T and n0 <= n < n1.
 * x: [T, K] f32 with row stride ldx; W: [N, K] row-major in dtype wdt; y row stride ldy. */
typedef struct {
    const float *x;
    int64_t ldx;
    int T;
    const void *w;
    DType wdt;
    int64_t K;
    const float *bias; /* [N] or NULL */
    float *y;
    int64_t ldy;
    const float *xp; /* AVX2 + bf16 only: x permuted by matmul_permute_x_avx2 ([T, K]), or NULL
                      * to let the kernel make the copy itself */
    const uint16_t *wp; /* AVX2 + bf16 only: W packed by matmul_pack_bf16, or NULL */
    const float *xi;    /* packed kernel, T > 1: x interleaved by matmul_interleave_x_avx2, or
                         * NULL to let the kernel make the copy itself */
} MatmulArgs;

void matmul_rows_scalar(const MatmulArgs *a, int64_t n0, int64_t n1);
void matmul_rows_avx2(const MatmulArgs *a, int64_t n0, int64_t n1);   /* matmul_avx2.c */
/* xp[T, K] = x with every full block of 16 floats reordered evens then odds (tail as is). */
void matmul_permute_x_avx2(const float *x, int64_t ldx, int T, int64_t K, float *xp);
void matmul_rows_avx512(const MatmulArgs *a, int64_t n0, int64_t n1); /* matmul_avx512.c */
/* The variant for isa (the packed AVX2 kernel when isa is AVX2 and a->wp is set). */
void matmul_rows(CpuIsa isa, const MatmulArgs *a, int64_t n0, int64_t n1);

/* Packed bf16 panels, for the AVX2 kernels. A bf16 W [N, K] is repacked once at load into
 * ceil(N/16) panels of [K][16]: panel p holds rows 16p .. 16p+15 and, for each k, their 16
 * weights in the lane order (r0, r8, r1, r9, ..., r7, r15), so that one 32-byte load widened by a
 * shift gives rows 0-7 and by an AND rows 8-15 as f32. A panel is one contiguous stream (the
 * row-major kernels read 8 rows at once: 8 streams 2K bytes apart, which Zen 3's prefetchers
 * serve at about half the bandwidth), and x is broadcast one element at a time, so a tile of
 * 6 tokens x 16 rows keeps 12 accumulators busy (~115 GFLOP/s on 2 Zen 3 cores vs ~65).
 * Every output element is one FMA chain over k = 0 .. K-1 from 0, then + bias: the same for
 * every T and tile (batch invariance). Rows past N are zero. */
uint16_t *matmul_pack_bf16(const Tensor *w); /* 64-byte aligned; free() it */
/* The same into caller memory (64-byte aligned) of matmul_packed_bytes(w) bytes. */
size_t matmul_packed_bytes(const Tensor *w);
void matmul_pack_bf16_into(const Tensor *w, uint16_t *dst);

/* Anonymous memory on a 2 MB boundary, zeroed, with transparent huge pages asked for (THP in
 * "madvise" mode grants them only to 2 MB-aligned ranges of MADV_HUGEPAGE memory): streaming
 * the weights or the KV cache then takes a TLB miss per 2 MB instead of per 4 KB, and a first
 * touch costs one fault per 2 MB. *mapped receives the length to give cpu_free_huge. NULL if
 * the memory cannot be had. */
void *cpu_alloc_huge(size_t bytes, size_t *mapped);
void cpu_free_huge(void *p, size_t mapped);
/* n0 must be a multiple of 16 (panel boundary); n1 a multiple of 16 or N. */
void matmul_rows_packed_avx2(const MatmulArgs *a, int64_t n0, int64_t n1); /* matmul_packed_avx2.c */
/* The packed kernel's token tiles for T > 1: ceil(T / 6) tiles of as even sizes as possible, in
 * token order. Tile i starts at token *t0; returns its size. */
int matmul_packed_tile(int T, int i, int *t0);
/* xi[T * K]: for each tile (t0, tt), x rows t0 .. t0+tt-1 stored [K][tt] at xi + t0 * K. */
void matmul_interleave_x_avx2(const float *x, int64_t ldx, int T, int64_t K, float *xi);

/* y[T, N] = x[T, K] @ W^T (+ bias): one job over up to CPU_MATMUL_MAX_PARTS weight matrices that
 * share x (q/k/v), rows split over the pool's threads. xp_buf: T*K floats of scratch for the
 * AVX2 bf16 kernels' permuted copy of x (NULL: each kernel call makes its own). */
#define CPU_MATMUL_MAX_PARTS 3
typedef struct {
    const Tensor *w;   /* [N, K] */
    const float *bias; /* [N] f32 or NULL */
    float *y;          /* [T, ldy] */
    int64_t ldy;
    const uint16_t *wp; /* w packed by matmul_pack_bf16, or NULL */
} MatmulPart;
void matmul_cpu(ThreadPool *pool, const float *x, int64_t ldx, int T, const MatmulPart *parts,
                int num_parts, float *xp_buf);
/* g[T, I] = silu(x @ Wg^T) * (x @ Wu^T), the two matmuls and the gating fused per row chunk;
 * u[T, I] is scratch. wgp / wup: the packed weights or NULL. */
void gate_up_silu_cpu(ThreadPool *pool, const float *x, int T, const Tensor *wg, const Tensor *wu,
                      const uint16_t *wgp, const uint16_t *wup, float *g, float *u, float *xp_buf);

/* ---------------------------------------------------------------- small ops (reference) */

/* y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] for i < n (y may alias x). With AVX2 the sum of
 * squares runs in 4 x 8 lanes (rmsnorm_avx2): another order than the scalar loop's, the same
 * for every token. */
void rmsnorm_cpu(float *y, const float *x, const float *w, int n, float eps);
void rmsnorm_avx2(float *y, const float *x, const float *w, int n, float eps); /* ops_avx2.c */
/* g[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u. */
void silu_mul_cpu(float *g, const float *u, int64_t n);

/* Rotary embedding (Hugging Face rotate_half convention: element i pairs with i + head_dim/2).
 * inv_freq[i] = theta^(-2i/head_dim), then scaled per cfg->rope_type (linear: / factor;
 * llama3: transformers' _compute_llama3_parameters). inv_freq has head_dim/2 entries. */
void rope_inv_freq_cpu(const ModelConfig *cfg, int head_dim, float *inv_freq);
/* cos[i] = cos(pos * inv_freq[i]), sin[i] likewise, i < half (the angle is formed in f32, as
 * transformers does). */
void rope_cos_sin_cpu(int pos, const float *inv_freq, int half, float *cos_out, float *sin_out);
/* Rotates each of n_heads heads of x [n_heads, head_dim] in place. */
void rope_apply_cpu(float *x, int n_heads, int head_dim, const float *cos_t, const float *sin_t);

/* ---------------------------------------------------------------- paged attention */

#define CPU_MAX_HEAD_DIM 512 /* the backend refuses larger heads at create */

/* Causal attention of the step's new tokens over each sequence's keys, read from the KV cache
 * through the block table. Token t of sequence s (cu_seqlens_q[s] <= t < cu_seqlens_q[s+1])
 * attends to the keys 0..num_keys[t]-1 of its sequence; key j lives in cache slot
 * block_tables[s * max_blocks_per_seq + j / block_size] * block_size + j % block_size.
 * out[t, h, :] = softmax_j(q[t,h,:] . K[j, h/group, :] * scale) @ V[j, h/group, :]. */
typedef struct {
    const float *q;       /* [T, n_heads * head_dim] */
    float *out;           /* [T, n_heads * head_dim] */
    const void *k_cache;  /* this layer's keys: [num_blocks * block_size, n_kv_heads * head_dim] */
    const void *v_cache;  /* likewise values */
    DType kv_dtype;       /* the cache's elements: f32, bf16 or fp8 e4m3; arithmetic is f32 */
    float k_scale, v_scale; /* fp8 only (vLLM's per-tensor scales): element = f32(stored) *
                             * scale; must be > 0 (1.0 without calibration) */
    int num_tokens, n_heads, n_kv_heads, head_dim, block_size;
    float scale;
    const int32_t *num_keys;     /* [T] */
    const int32_t *token_seq;    /* [T]: the sequence of each token */
    const int32_t *block_tables; /* [num_seqs, max_blocks_per_seq] */
    int max_blocks_per_seq;
    float *scratch;         /* [nth, scratch_stride]: per-thread scores */
    int64_t scratch_stride; /* >= n_heads * longest context (max num_keys[t]) */
} AttentionArgs;
void attention_cpu(ThreadPool *pool, const AttentionArgs *a);

/* Vector helpers of the reference attention. */
float dot_f32_scalar(const float *a, const float *b, int n);
void axpy_f32_scalar(float *y, float alpha, const float *x, int n); /* y += alpha * x */
/* The AVX2 attention of one token's query heads of kv heads kh0 .. kh1 (group query heads
 * each): q / out [(kh1-kh0)*group, hd] (that token's rows, from head kh0*group on);
 * k_cache/v_cache: the layer's [slots, kv_stride]; n keys read through table.
 * scores: [(kh1-kh0)*group * n] scratch. */
void attention_heads_avx2(const float *q, float *out, int kh0, int kh1, int group,
                          const void *k_cache, const void *v_cache, int kv_bf16,
                          const int32_t *table, int n, int bs, int64_t kv_stride, int hd,
                          float scale, float *scores);
/* AVX2 exp (Cephes' expf polynomial, within 2 ulp of expf; the scalar twin gives bit-identical
 * values) and silu(g) * u with it. */
float exp_avx2_scalar(float x);
void exp_inplace_avx2(float *x, int64_t n);
void silu_mul_avx2(float *g, const float *u, int64_t n);
/* sum of x[0..n): used by the bandwidth benchmark. */
float sum_f32_avx2(const float *x, int64_t n);

#endif
