/* elementwise.cu: the per-token kernels between the matrix products. Each mirrors a CPU function
 * (named at the launcher in kernels.h and below) with the same arithmetic in f32; only the order
 * of the sums of squares differs (a block reduction instead of a loop).
 *   embedding_cuda        <- cpu_to_f32 of an embed_tokens row (cpu_forward); a tensor-parallel
 *                            rank holds rows [v0, v0 + nv) and writes zeros for the others
 *   vocab_shards_to_rows_cuda <- the row-major [rows, V] logits of cpu_forward, from the ranks'
 *                            [ranks][rows][Vs] lm_head slices (tensor parallelism)
 *   residual_rmsnorm_cuda <- residual_norm (backend_cpu.c): x += add; rmsnorm_cpu
 *   add_bias_cuda         <- matmul_rows_scalar's "+ bias[n]"
 *   qk_norm_rope_cuda     <- qk_rope_store_job: rmsnorm_cpu per head, rope_cos_sin_cpu,
 * rope_apply_cpu
 *   store_kvcache_cuda    <- qk_rope_store_job's store (slot -1: nothing written; an fp8 cache
 *                            gets f32_to_fp8_e4m3(x / scale), bit for bit)
 *   silu_mul_cuda         <- silu_mul_cpu
 *   gather_rows_cuda      <- the logits_indices rows of cpu_forward
 *   copy_segments_cuda    <- memcpy of each segment */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/qk_norm_rope.cuh"

extern "C" int cuda_error(cudaError_t e, const char *file, int line, const char *what) {
    return cvllm_errorf(CVLLM_EBACKEND, "cuda backend: %s:%d: %s: %s (%s)", file, line, what,
                        cudaGetErrorString(e), cudaGetErrorName(e));
}

extern "C" int cuda_env_flag(const char *name, int dflt) {
    const char *e = getenv(name);
    return !e || !*e ? dflt : strcmp(e, "0") != 0;
}

extern "C" int cuda_device_cc(void) {
    static int v = -1;
    if (v < 0) {
        int dev = 0, major = 0, minor = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
            cudaGetLastError();
            major = minor = 0;
        }
        v = major * 10 + minor;
    }
    return v;
}

extern "C" int cuda_device_sms(void) {
    static int v = -1;
    if (v < 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            v <= 0) {
            cudaGetLastError();
            v = 132;
        }
    }
    return v;
}

extern "C" int cuda_pdl_enabled(void) {
    static int v = -1;
    if (v < 0) v = cuda_env_flag("CVLLM_CUDA_PDL", 1) && cuda_device_cc() >= 90;
    return v;
}

/* ------------------------------------------------------------------ embedding */

template <typename T>
__global__ void embedding_kernel(float *x, const T *embed, const int32_t *ids, int H, int v0,
                                 int nv) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    const int id = ids[t] - v0;
    float *y = x + (int64_t)t * H;
    if (id < 0 || id >= nv) { /* another rank's row: this rank adds nothing */
        for (int i = threadIdx.x; i < H; i += blockDim.x)
            y[i] = 0.0f;
        return;
    }
    const T *row = embed + (int64_t)id * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        y[i] = to_f32(row[i]);
}

extern "C" int embedding_cuda(float *d_x, const void *d_embed, DType edt, const int32_t *d_ids,
                              int T, int H, int v0, int nv, cudaStream_t stream) {
    if (T <= 0) return 0;
    DISPATCH_DTYPE(edt, E,
                   pdl_launch(embedding_kernel<E>, T, 256, 0, stream, d_x, (const E *)d_embed, d_ids,
                              H, v0, nv));
    CUDA_LAUNCH_TRY();
    return 0;
}

/* ------------------------------------------------------------------ residual + rmsnorm */

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
__device__ float block_sum(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : 0.0f;
    return warp_sum(v);
}

template <typename A>
__global__ void residual_rmsnorm_kernel(float *x, const float *add, const float *w, A *h, int H,
                                        float eps) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = blockIdx.x;
    float *xr = x + t * H;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float v = xr[i];
        if (add) {
            v += add[t * H + i];
            xr[i] = v;
        }
        ss += v * v;
    }
    if (!h) return;
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        h[t * H + i] = from_f32<A>((xr[i] * r) * w[i]);
}

/* Four elements of A stored at once (p aligned to 4 * sizeof(A)). */
template <typename A> struct alignas(4 * sizeof(A)) Vec4 {
    A v[4];
};
template <typename A>
__device__ __forceinline__ void store4(A *p, float a, float b, float c, float d) {
    Vec4<A> o;
    o.v[0] = from_f32<A>(a), o.v[1] = from_f32<A>(b), o.v[2] = from_f32<A>(c);
    o.v[3] = from_f32<A>(d);
    *(Vec4<A> *)p = o;
}

/* The same with a float4 a thread (H % 4 == 0, H <= 4096, rows 16-byte aligned): the row's
 * values stay in registers between the sum and the scaling, and the loads are 16 bytes (the
 * kernel above: 4-byte loads and the row read twice). */
template <typename A>
__global__ void residual_rmsnorm4_kernel(float *x, const float *add, const float *w, A *h, int H,
                                         float eps) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = blockIdx.x;
    const int i = threadIdx.x * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < H) {
        v = *(const float4 *)(x + t * H + i);
        if (add) {
            const float4 a = *(const float4 *)(add + t * H + i);
            v.x += a.x, v.y += a.y, v.z += a.z, v.w += a.w;
            *(float4 *)(x + t * H + i) = v;
        }
    }
    if (!h) return;
    const float ss = block_sum((v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w));
    const float r = 1.0f / sqrtf(ss / (float)H + eps);
    if (i < H) {
        const float4 wv = *(const float4 *)(w + i);
        store4<A>(h + t * H + i, (v.x * r) * wv.x, (v.y * r) * wv.y, (v.z * r) * wv.z,
                  (v.w * r) * wv.w);
    }
}

/* The same with a warp a row (H = 128 NV, NV <= 8, rows 16-byte aligned): lane l holds the row's
 * float4s l, l + 32, .. (NV of them, all loaded before any is used: 16 NV bytes in flight a lane,
 * where the block-a-row kernel above has 16), and the sum is the warp's shuffles alone, no block
 * barrier; RMS_WARPS rows a block. */
#define RMS_WARPS 2
template <typename A, int NV>
__global__ void __launch_bounds__(32 * RMS_WARPS)
    residual_rmsnorm_warp_kernel(float *x, const float *add, const float *w, A *h, int T,
                                 float eps) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = (int64_t)blockIdx.x * RMS_WARPS + (threadIdx.x >> 5);
    if (t >= T) return;
    const int lane = threadIdx.x & 31, H = 128 * NV;
    float4 v[NV], wv[NV]; /* w's too: loaded after the sum, each would wait behind the stores
                            * to h before it (h may alias w, as far as the compiler knows) */
#pragma unroll
    for (int k = 0; k < NV; k++)
        v[k] = *(const float4 *)(x + t * H + (k * 32 + lane) * 4);
    if (h) /* without h (the residual sum alone) w may be NULL */
#pragma unroll
        for (int k = 0; k < NV; k++)
            wv[k] = __ldg((const float4 *)(w + (k * 32 + lane) * 4));
    if (add) {
        float4 a[NV];
#pragma unroll
        for (int k = 0; k < NV; k++)
            a[k] = *(const float4 *)(add + t * H + (k * 32 + lane) * 4);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            v[k].x += a[k].x, v[k].y += a[k].y, v[k].z += a[k].z, v[k].w += a[k].w;
            *(float4 *)(x + t * H + (k * 32 + lane) * 4) = v[k];
        }
    }
    if (!h) return;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++)
        ss += (v[k].x * v[k].x + v[k].y * v[k].y) + (v[k].z * v[k].z + v[k].w * v[k].w);
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)H + eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int i = (k * 32 + lane) * 4;
        store4<A>(h + t * H + i, (v[k].x * r) * wv[k].x, (v[k].y * r) * wv[k].y,
                  (v[k].z * r) * wv[k].z, (v[k].w * r) * wv[k].w);
    }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
static int act_bytes(DType adt) { return adt == DTYPE_F32 ? 4 : 2; } /* bf16, f16, f32 */

/* CVLLM_CUDA_EW=0: the elementwise kernels before the warp-a-row norm and the 8-wide SiLU (read
 * at each call, for measuring) */
static bool ew_wide(void) {
    const char *e = getenv("CVLLM_CUDA_EW");
    return !(e && strcmp(e, "0") == 0);
}

extern "C" int residual_rmsnorm_cuda(float *d_x, const float *d_add, const float *d_w, void *d_h,
                                     DType adt, int T, int H, float eps, cudaStream_t stream) {
    if (T <= 0 || (!d_add && !d_h)) return 0; /* nothing to do (the last layer's, where the down
                                               * product added into x itself): no launch */
    const bool vec = aligned16(d_x) && aligned16(d_add) && aligned16(d_w) &&
                     ((uintptr_t)d_h & (4 * act_bytes(adt) - 1)) == 0;
    const int blocks = (T + RMS_WARPS - 1) / RMS_WARPS;
    if (vec && (H == 512 || H == 1024) && ew_wide()) {
        DISPATCH_DTYPE(adt, A, {
            auto k = H == 512 ? residual_rmsnorm_warp_kernel<A, 4>
                              : residual_rmsnorm_warp_kernel<A, 8>;
            pdl_launch(k, blocks, 32 * RMS_WARPS, 0, stream, d_x, d_add, d_w, (A *)d_h, T, eps);
        });
    } else if (H % 4 == 0 && H <= 4096 && vec) {
        const int threads = (H / 4 + 31) / 32 * 32;
        DISPATCH_DTYPE(adt, A,
                       pdl_launch(residual_rmsnorm4_kernel<A>, T, threads, 0, stream, d_x, d_add,
                                  d_w, (A *)d_h, H, eps));
    } else {
        const int threads = H >= 1024 ? 1024 : (H + 31) / 32 * 32;
        DISPATCH_DTYPE(adt, A,
                       pdl_launch(residual_rmsnorm_kernel<A>, T, threads, 0, stream, d_x, d_add,
                                  d_w, (A *)d_h, H, eps));
    }
    CUDA_LAUNCH_TRY();
    return 0;
}

/* ------------------------------------------------------------------ bias */

__global__ void add_bias_kernel(float *y, int64_t ld, const float *bias, int N) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = blockIdx.x;
    for (int n = threadIdx.x; n < N; n += blockDim.x)
        y[t * ld + n] += bias[n];
}

extern "C" int add_bias_cuda(float *d_y, int64_t ld, const float *d_bias, int T, int N,
                             cudaStream_t stream) {
    if (T <= 0) return 0;
    pdl_launch(add_bias_kernel, T, 256, 0, stream, d_y, ld, d_bias, N);
    CUDA_LAUNCH_TRY();
    return 0;
}

/* ------------------------------------------------------------------ q/k norm + rope */

/* A block per token, a warp per head (q heads then k heads). */
__global__ void qk_norm_rope_kernel(float *qkv, int64_t ld, const int32_t *positions,
                                    const float *inv_freq, const float *q_norm, const float *k_norm,
                                    int n_heads, int n_kv_heads, int hd, float eps) {
    const int64_t t = blockIdx.x;
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float pos = (float)positions[t];
    for (int h = warp; h < n_heads + n_kv_heads; h += nw) { /* k heads follow the q heads */
        float *v = qkv + t * ld + (int64_t)h * hd;
        norm_rope_head<float>(v, v, NULL, h < n_heads ? q_norm : k_norm, inv_freq, pos, hd, eps,
                              1.0f);
    }
}

extern "C" int qk_norm_rope_cuda(float *d_qkv, int64_t ld, const int32_t *d_positions,
                                 const float *d_inv_freq, const float *d_q_norm,
                                 const float *d_k_norm, int T, int n_heads, int n_kv_heads, int hd,
                                 float eps, cudaStream_t stream) {
    if (T <= 0) return 0;
    qk_norm_rope_kernel<<<T, 256, 0, stream>>>(d_qkv, ld, d_positions, d_inv_freq, d_q_norm,
                                               d_k_norm, n_heads, n_kv_heads, hd, eps);
    CUDA_LAUNCH_TRY();
    return 0;
}

/* An fp8 cache's scales divide on the way in: they must be positive and finite. */
static int check_kv_scales(DType kvdt, float k_scale, float v_scale) {
    if (kvdt == DTYPE_FP8_E4M3 && !(k_scale > 0.0f && k_scale <= 3.0e38f && v_scale > 0.0f &&
                                    v_scale <= 3.0e38f))
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda backend: fp8 KV cache scales k %g, v %g (must be > 0; 1.0 "
                            "without calibration)",
                            (double)k_scale, (double)v_scale);
    return 0;
}

/* qk_norm_rope_kernel and store_kvcache_kernel in one launch (the step's hot path): a block per
 * token, a warp per head: q heads normed and rotated in place, k heads normed, rotated, written
 * back and stored to the cache, v heads stored (slot -1: nothing stored). HD: head_dim 64 or 128
 * (hd), with the token's rotation table (cos, sin of each pair's angle, formed as norm_rope_head
 * forms it) made once by the block's first HD threads (blockDim >= HD) and shared by its heads
 * through norm_rope_head_cs (bit for bit norm_rope_head's results); 0: any hd, each head
 * computing its own angles (a prefill step's kernel spent most of its time in cosf / sinf that
 * way: 16,384 tokens of qwen3-0.6b, 236 us a layer over an fp8 cache, 2.1 TB/s, against 147 us
 * with the table; Nsight Compute, H200, 2026-11-27). */
template <typename C, int HD, typename Q, typename S>
__global__ void qk_norm_rope_store_kernel(float *qkv, int64_t ld, const S *src,
                                          const int32_t *positions, const float *inv_freq,
                                          const float *q_norm, const float *k_norm, int n_heads,
                                          int n_kv_heads, int hd, float eps, C *kc, C *vc,
                                          const int64_t *slots, float k_scale, float v_scale,
                                          Q *q16, int64_t ldq16) {
    __shared__ float2 cs[HD ? HD / 2 : 1];
    const int64_t t = blockIdx.x;
    /* the step's inputs, not the kernel ahead's outputs: read before the wait */
    const float pos = (float)positions[t];
    const int64_t slot = slots[t];
    const int x = threadIdx.x;
    if constexpr (HD > 0) {
        if (x < HD) rope_table_entry<HD>(cs, x, pos, inv_freq[x % (HD / 2)]);
    }
    pdl_wait();
    pdl_trigger();
    if (HD) __syncthreads();
    const int d = HD > 0 ? HD : hd; /* a constant where the table is used */
    const int warp = x >> 5, nw = blockDim.x >> 5, kv_dim = n_kv_heads * d;
    for (int h = warp; h < n_heads + 2 * n_kv_heads; h += nw) {
        /* k heads follow the q heads, v the k; the raw values at v, f32 ones written back at
         * vb (v itself where the rows are f32) */
        const S *v = src + t * ld + (int64_t)h * d;
        float *vb = qkv ? qkv + t * ld + (int64_t)h * d : NULL;
        if (h >= n_heads + n_kv_heads) {
            if (slot >= 0)
                store_head<C, S>(v, vc + slot * kv_dim + (int64_t)(h - n_heads - n_kv_heads) * d, d,
                                 v_scale);
            continue;
        }
        const bool is_k = h >= n_heads;
        const float *w = is_k ? k_norm : q_norm;
        if (!is_k && q16) { /* q rounded to the attention's type, the row left as it was */
            Q *qd = q16 + t * ldq16 + (int64_t)h * d;
            if constexpr (HD > 0)
                norm_rope_head_cs<Q, HD, S>(v, NULL, qd, NULL, w, cs, eps, 1.0f);
            else
                norm_rope_head<Q, S>(v, NULL, qd, w, inv_freq, pos, hd, eps, 1.0f);
            continue;
        }
        C *dst = is_k && slot >= 0 ? kc + slot * kv_dim + (int64_t)(h - n_heads) * d : NULL;
        float *back = q16 ? NULL : vb; /* with q16, k goes to the cache alone */
        if constexpr (HD > 0)
            norm_rope_head_cs<C, HD, S>(v, back, dst, NULL, w, cs, eps, k_scale);
        else
            norm_rope_head<C, S>(v, back, dst, w, inv_freq, pos, hd, eps, k_scale);
    }
}

extern "C" int qk_norm_rope_store_cuda(float *d_qkv, int64_t ld, const void *d_src, DType srcdt,
                                       const int32_t *d_positions, const float *d_inv_freq,
                                       const float *d_q_norm, const float *d_k_norm, int T,
                                       int n_heads, int n_kv_heads, int hd, float eps,
                                       void *d_k_cache, void *d_v_cache, DType kvdt, float k_scale,
                                       float v_scale, const int64_t *d_slot_mapping, void *d_q16,
                                       DType q16dt, int64_t ldq16, cudaStream_t stream) {
    int rc = check_kv_scales(kvdt, k_scale, v_scale);
    if (rc) return rc;
    if (d_q16 && ((q16dt != DTYPE_BF16 && q16dt != DTYPE_F16) || ldq16 % 8 || !aligned16(d_q16)))
        return cvllm_errorf(CVLLM_EINVAL, "cuda qk_norm_rope_store: q16 of dtype %d, row of %lld",
                            (int)q16dt, (long long)ldq16);
    if (d_src && srcdt != DTYPE_BF16 && srcdt != DTYPE_F16)
        return cvllm_errorf(CVLLM_EINVAL, "cuda qk_norm_rope_store: 16-bit rows of dtype %d",
                            (int)srcdt);
    if (!d_src && !d_qkv) return cvllm_errorf(CVLLM_EINVAL, "cuda qk_norm_rope_store: no rows");
    if (d_src && !d_qkv && !d_q16) /* q would go nowhere */
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda qk_norm_rope_store: 16-bit rows, no f32 rows or q16");
    if (T <= 0) return 0;
    /* a decode step (a few blocks): a warp per head; a prefill: 256 threads a token (measured
     * faster there, 2026-11-22) */
    int threads = T <= 512 ? 32 * (n_heads + 2 * n_kv_heads) : 256;
    if (threads > 1024) threads = 1024;
    /* the rotation table needs a thread for each of its HD entries */
    const int HD = (hd == 64 || hd == 128) && threads >= hd ? hd : 0;
    auto launch = [&](auto cz, auto qz, auto sz) {
        typedef decltype(cz) C;
        typedef decltype(qz) Q;
        typedef decltype(sz) S;
        auto kern = HD == 128  ? qk_norm_rope_store_kernel<C, 128, Q, S>
                    : HD == 64 ? qk_norm_rope_store_kernel<C, 64, Q, S>
                               : qk_norm_rope_store_kernel<C, 0, Q, S>;
        pdl_launch(kern, T, threads, 0, stream, d_qkv, ld,
                   d_src ? (const S *)d_src : (const S *)(const void *)d_qkv, d_positions,
                   d_inv_freq, d_q_norm, d_k_norm, n_heads, n_kv_heads, hd, eps, (C *)d_k_cache,
                   (C *)d_v_cache, d_slot_mapping, k_scale, v_scale, (Q *)d_q16, ldq16);
    };
    /* a model's 16-bit rows come with q16 of the same type, or none: Q follows S there */
    const bool qh = d_q16 ? q16dt == DTYPE_F16 : d_src && srcdt == DTYPE_F16;
    if (d_src && srcdt == DTYPE_BF16 && !qh)
        DISPATCH_KV_DTYPE(kvdt, C, launch(C(), __nv_bfloat16(), __nv_bfloat16()));
    else if (d_src && srcdt == DTYPE_F16 && qh)
        DISPATCH_KV_DTYPE(kvdt, C, launch(C(), __half(), __half()));
    else if (d_src)
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda qk_norm_rope_store: rows of dtype %d with a q16 of %d",
                            (int)srcdt, (int)q16dt);
    else if (qh)
        DISPATCH_KV_DTYPE(kvdt, C, launch(C(), __half(), float()));
    else /* bf16, or no q16 (the pointer NULL) */
        DISPATCH_KV_DTYPE(kvdt, C, launch(C(), __nv_bfloat16(), float()));
    CUDA_LAUNCH_TRY();
    return 0;
}

/* ------------------------------------------------------------------ copy_segments */

/* The segments' words as one index space, a thread a word (16 bytes where a one-run segment's
 * ends allow, else 4; rows: 4), so that every load of host memory over PCIe is in flight at
 * once: a thread's word is one round trip, not one a segment (a step's inputs are ~9 segments).
 * Launched with a thread for every word where it can be (up to COPY_SEG_MAX_BLOCKS blocks). */
#define COPY_SEG_MAX_BLOCKS 512
struct CopyPlan {
    int64_t first[COPY_SEGMENTS_MAX + 1]; /* segment i's words: first[i] .. first[i + 1] - 1 */
    int64_t n16[COPY_SEGMENTS_MAX]; /* one run: its 16-byte words (the rest 4-byte); rows: 0 */
};
__device__ __forceinline__ void copy_word(const CopySegments &c, const CopyPlan &pl, int i,
                                          int64_t k) {
    if (c.rows[i] > 1) {
        const int64_t wpr = c.bytes[i] / 4, r = k / wpr, w = k - r * wpr;
        ((uint32_t *)((char *)c.dst[i] + r * c.dst_pitch[i]))[w] =
            ((const uint32_t *)((const char *)c.src[i] + r * c.src_pitch[i]))[w];
    } else if (k < pl.n16[i]) {
        ((uint4 *)c.dst[i])[k] = ((const uint4 *)c.src[i])[k];
    } else {
        const int64_t o = pl.n16[i] * 16 + (k - pl.n16[i]) * 4;
        *(uint32_t *)((char *)c.dst[i] + o) = *(const uint32_t *)((const char *)c.src[i] + o);
    }
}
/* Launched programmatically (pdl_launch) after a step's sampler, which triggers at its start:
 * every word but the pending token ids is read from host memory and stored while the sampler
 * runs (no kernel before it in the stream reads these arrays then: the sampler does not, and it
 * was launched in full order, so every kernel before it has ended), and only the ids the sampler
 * writes (ids_from) are read after the wait. The word of id k (segment 0, one 4-byte word each) is
 * thread k's first, where the grid has a thread for each id (copy_segments_cuda sees to it). */
__global__ void copy_segments_kernel(CopySegments c, CopyPlan pl) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x,
                  k0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t nids = c.ids_from ? pl.first[1] : 0;
    int32_t id0 = 0; /* id word k0's staged value, where k0 < nids */
    if (k0 < nids) id0 = ((const int32_t *)c.src[0])[k0];
    for (int64_t k = k0; k < pl.first[c.n]; k += stride) {
        int i = 0;
        while (k >= pl.first[i + 1])
            i++;
        if (k == k0 && k0 < nids) {
            if (id0 >= 0) ((int32_t *)c.dst[0])[k0] = id0;
        } else {
            copy_word(c, pl, i, k - pl.first[i]);
        }
    }
    pdl_wait();
    if (k0 < nids && id0 < 0) ((int32_t *)c.dst[0])[k0] = c.ids_from[-(int64_t)id0 - 1];
}

extern "C" int copy_segments_cuda(const CopySegments *segs, cudaStream_t stream) {
    if (segs->n < 0 || segs->n > COPY_SEGMENTS_MAX)
        return cvllm_errorf(CVLLM_EINVAL, "copy_segments: %d segments (at most %d)", segs->n,
                            COPY_SEGMENTS_MAX);
    CopyPlan pl = {};
    for (int i = 0; i < segs->n; i++) {
        const int rows = segs->rows[i] > 1 ? segs->rows[i] : 1;
        if (segs->bytes[i] % 4 || ((uintptr_t)segs->src[i] | (uintptr_t)segs->dst[i]) & 3 ||
            (rows > 1 && (segs->src_pitch[i] % 4 || segs->dst_pitch[i] % 4)))
            return cvllm_errorf(CVLLM_EINVAL,
                                "copy_segments: segment %d of %lld bytes is not in 4-byte words",
                                i, (long long)segs->bytes[i]);
        if (rows > 1 && i == 0 && segs->ids_from)
            return cvllm_errorf(CVLLM_EINVAL, "copy_segments: token ids in rows");
        /* the ids (ids_from) by 4-byte words: a substitution a word */
        const bool v16 = rows == 1 && !(i == 0 && segs->ids_from) &&
                         (((uintptr_t)segs->src[i] | (uintptr_t)segs->dst[i]) & 15) == 0;
        pl.n16[i] = v16 ? segs->bytes[i] / 16 : 0;
        const int64_t words = rows > 1 ? segs->bytes[i] / 4 * rows
                                       : pl.n16[i] + (segs->bytes[i] - pl.n16[i] * 16) / 4;
        pl.first[i + 1] = pl.first[i] + words;
    }
    const int64_t words = pl.first[segs->n];
    if (words == 0) return 0;
    int64_t blocks = (words + 255) / 256;
    if (blocks > COPY_SEG_MAX_BLOCKS) blocks = COPY_SEG_MAX_BLOCKS;
    if (segs->ids_from && blocks * 256 < pl.first[1]) blocks = (pl.first[1] + 255) / 256;
    if (blocks > INT32_MAX)
        return cvllm_errorf(CVLLM_EINVAL, "copy_segments: %lld token ids", (long long)pl.first[1]);
    /* CVLLM_CUDA_INPUTS_PDL=0: launched in full order (measuring) */
    static int pdl = -1;
    if (pdl < 0) pdl = cuda_env_flag("CVLLM_CUDA_INPUTS_PDL", 1);
    if (pdl)
        CUDA_TRY(pdl_launch(copy_segments_kernel, (int)blocks, 256, 0, stream, *segs, pl));
    else
        copy_segments_kernel<<<(int)blocks, 256, 0, stream>>>(*segs, pl);
    CUDA_LAUNCH_TRY();
    return 0;
}

/* ------------------------------------------------------------------ store_kvcache */

template <typename C>
__global__ void store_kvcache_kernel(const float *k, const float *v, int64_t ld, C *kc, C *vc,
                                     const int64_t *slots, int kv_dim, float k_scale,
                                     float v_scale) {
    const int64_t t = blockIdx.x;
    const int64_t slot = slots[t];
    if (slot < 0) return; /* already cached (a prefix-cache hit) or a padding lane */
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kc[slot * kv_dim + i] = cache_from_f32<C>(k[t * ld + i], k_scale);
        vc[slot * kv_dim + i] = cache_from_f32<C>(v[t * ld + i], v_scale);
    }
}

extern "C" int store_kvcache_cuda(const float *d_k, const float *d_v, int64_t ld, void *d_k_cache,
                                  void *d_v_cache, DType kvdt, float k_scale, float v_scale,
                                  const int64_t *d_slot_mapping, int T, int kv_dim,
                                  cudaStream_t stream) {
    int rc = check_kv_scales(kvdt, k_scale, v_scale);
    if (rc) return rc;
    if (T <= 0) return 0;
    DISPATCH_KV_DTYPE(kvdt, C,
                      store_kvcache_kernel<C><<<T, 256, 0, stream>>>(
                          d_k, d_v, ld, (C *)d_k_cache, (C *)d_v_cache, d_slot_mapping, kv_dim,
                          k_scale, v_scale));
    CUDA_LAUNCH_TRY();
    return 0;
}

/* ------------------------------------------------------------------ silu * mul */

template <typename A, typename G> __global__ void silu_mul_kernel(A *g, const G *gu, int I) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= I) return;
    const float a = to_f32(gu[t * 2 * I + i]), u = to_f32(gu[t * 2 * I + I + i]);
    g[t * I + i] = from_f32<A>(a / (1.0f + expf(-a)) * u);
}

/* Four elements of G from p (aligned to 4 * sizeof(G)) as f32 */
__device__ __forceinline__ float4 load4(const float *p) { return *(const float4 *)p; }
template <typename G> __device__ __forceinline__ float4 load4(const G *p) {
    const Vec4<G> v = *(const Vec4<G> *)p;
    return make_float4(to_f32(v.v[0]), to_f32(v.v[1]), to_f32(v.v[2]), to_f32(v.v[3]));
}

/* The same four elements a thread (I % 4 == 0, rows aligned to 4 elements): 16-byte (f32) or
 * 8-byte (16-bit gu) loads */
template <typename A, typename G> __global__ void silu_mul4_kernel(A *g, const G *gu, int I) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = blockIdx.y;
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= I) return;
    const float4 a = load4(gu + t * 2 * I + i), u = load4(gu + t * 2 * I + I + i);
    store4<A>(g + t * I + i, a.x / (1.0f + expf(-a.x)) * u.x, a.y / (1.0f + expf(-a.y)) * u.y,
              a.z / (1.0f + expf(-a.z)) * u.z, a.w / (1.0f + expf(-a.w)) * u.w);
}

/* Eight elements a thread from a 16-bit gu (I % 8 == 0, rows 16-byte aligned): one 16-byte load
 * of the gate's and one of the up's, one 16-byte store; the arithmetic of the kernels above */
template <typename A> struct alignas(16) Vec8 {
    A v[8];
};
template <typename A> __global__ void silu_mul8_kernel(A *g, const A *gu, int I) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = blockIdx.y;
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= I) return;
    const Vec8<A> a = *(const Vec8<A> *)(gu + t * 2 * I + i),
                  u = *(const Vec8<A> *)(gu + t * 2 * I + I + i);
    Vec8<A> o;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float x = to_f32(a.v[j]);
        o.v[j] = from_f32<A>(x / (1.0f + expf(-x)) * to_f32(u.v[j]));
    }
    *(Vec8<A> *)(g + t * I + i) = o;
}

template <typename A, typename G>
static void launch_silu_mul(A *g, const G *gu, int T, int I, cudaStream_t stream) {
    if constexpr (sizeof(G) == 2 && std::is_same<A, G>::value) {
        if (I % 8 == 0 && aligned16(gu) && aligned16(g) && ew_wide()) {
            pdl_launch(silu_mul8_kernel<A>, dim3((I / 8 + 127) / 128, T), 128, 0, stream, g, gu,
                       I);
            return;
        }
    }
    if (I % 4 == 0 && ((uintptr_t)gu & (4 * sizeof(G) - 1)) == 0 &&
        ((uintptr_t)g & (4 * sizeof(A) - 1)) == 0)
        pdl_launch(silu_mul4_kernel<A, G>, dim3((I / 4 + 255) / 256, T), 256, 0, stream, g, gu, I);
    else
        pdl_launch(silu_mul_kernel<A, G>, dim3((I + 255) / 256, T), 256, 0, stream, g, gu, I);
}

extern "C" int silu_mul_cuda(void *d_g, DType adt, const void *d_gu, DType gudt, int T, int I,
                             cudaStream_t stream) {
    if (T <= 0) return 0;
    if (gudt != DTYPE_F32 && gudt != adt)
        return cvllm_errorf(CVLLM_EINVAL, "cuda silu_mul: gate/up of dtype %d for a dtype %d output",
                            (int)gudt, (int)adt);
    if (gudt == DTYPE_F32)
        DISPATCH_DTYPE(adt, A, launch_silu_mul((A *)d_g, (const float *)d_gu, T, I, stream));
    else
        DISPATCH_DTYPE(adt, A, launch_silu_mul((A *)d_g, (const A *)d_gu, T, I, stream));
    CUDA_LAUNCH_TRY();
    return 0;
}

/* ------------------------------------------------------------------ gather */

__global__ void gather_rows_kernel(float *y, const float *x, const int32_t *idx, int H) {
    pdl_wait();
    pdl_trigger();
    const int64_t i = blockIdx.x, src = idx[i];
    for (int c = threadIdx.x; c < H; c += blockDim.x)
        y[i * H + c] = x[src * H + c];
}

extern "C" int gather_rows_cuda(float *d_y, const float *d_x, const int32_t *d_idx, int n, int H,
                                cudaStream_t stream) {
    if (n <= 0) return 0;
    pdl_launch(gather_rows_kernel, n, 256, 0, stream, d_y, d_x, d_idx, H);
    CUDA_LAUNCH_TRY();
    return 0;
}

/* ------------------------------------------------------------------ vocabulary shards */

/* dst[i, r * Vs + j] = src[r][i][j] for r * Vs + j < V: one block per (row, rank). */
__global__ void vocab_shards_to_rows_kernel(float *dst, const float *src, int n, int V, int Vs) {
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.x, r = blockIdx.y;
    const float *s = src + ((int64_t)r * n + i) * Vs;
    float *d = dst + (int64_t)i * V + (int64_t)r * Vs;
    const int m = V - r * Vs < Vs ? V - r * Vs : Vs;
    for (int j = threadIdx.x; j < m; j += blockDim.x)
        d[j] = s[j];
}

extern "C" int vocab_shards_to_rows_cuda(float *d_dst, const float *d_src, int n, int V, int Vs,
                                         int ranks, cudaStream_t stream) {
    if (n <= 0) return 0;
    pdl_launch(vocab_shards_to_rows_kernel, dim3(n, ranks), 256, 0, stream, d_dst, d_src, n, V,
               Vs);
    CUDA_LAUNCH_TRY();
    return 0;
}

/* ------------------------------------------------------------------ conversion */

template <typename T> __global__ void convert_f32_kernel(T *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = from_f32<T>(src[i]);
}

extern "C" int convert_f32_cuda(void *d_dst, DType dt, const float *d_src, int64_t n,
                                cudaStream_t stream) {
    if (n <= 0) return 0;
    int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    DISPATCH_KV_DTYPE(dt, T,
                      convert_f32_kernel<T><<<blocks, 256, 0, stream>>>((T *)d_dst, d_src, n));
    CUDA_LAUNCH_TRY();
    return 0;
}

template <typename T> __global__ void convert_to_f32_kernel(float *dst, const T *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = to_f32(src[i]);
}

extern "C" int convert_to_f32_cuda(float *d_dst, const void *d_src, DType dt, int64_t n,
                                   cudaStream_t stream) {
    if (n <= 0) return 0;
    int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    DISPATCH_KV_DTYPE(dt, T,
                      convert_to_f32_kernel<T>
                      <<<blocks, 256, 0, stream>>>(d_dst, (const T *)d_src, n));
    CUDA_LAUNCH_TRY();
    return 0;
}
