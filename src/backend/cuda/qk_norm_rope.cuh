/* qk_norm_rope.cuh: one head of one token through the per-head RMSNorm (Qwen3's q_norm / k_norm)
 * and the rotary embedding, by one warp; and a v head's store to the cache. The arithmetic of
 * qk_rope_store_job (backend_cpu.c: rmsnorm_cpu per head, rope_cos_sin_cpu, rope_apply_cpu) in f32.
 * Two kernels use it, so that they agree bit for bit: qk_norm_rope_store_kernel (elementwise.cu,
 * every token of a step) and the decode attention kernel when it takes the raw qkv rows itself
 * (attention.cu, AttentionParams.positions set: a decode step without the separate launch; the
 * tensor-core decode kernels through norm_rope_head_cs, the same arithmetic from tables). */
#ifndef CVLLM_BACKEND_CUDA_QK_NORM_ROPE_CUH
#define CVLLM_BACKEND_CUDA_QK_NORM_ROPE_CUH

#include "backend/cuda/cuda_util.cuh"

/* src: the head's hd raw values (S: f32, or the qkv product's 16-bit output with fusion "qkv16",
 * widened exactly); w: the norm's weights (NULL: no norm); the rotated values go to dst (f32, may
 * be src: each lane reads its pair before it writes it, and the sum of squares is complete before
 * any write) and / or cache (C, stored as cache_from_f32(x, scale)); either may be NULL. Called by
 * all 32 lanes of a warp. */
template <typename C, typename S = float>
__device__ __forceinline__ void norm_rope_head(const S *src, float *dst, C *cache, const float *w,
                                               const float *inv_freq, float pos, int hd, float eps,
                                               float scale) {
    const int lane = threadIdx.x & 31, half = hd / 2;
    float r = 1.0f;
    if (w) {
        float ss = 0.0f;
        for (int i = lane; i < hd; i += 32)
            ss += to_f32(src[i]) * to_f32(src[i]);
        ss = warp_sum(ss);
        r = 1.0f / sqrtf(ss / (float)hd + eps);
    }
    for (int i = lane; i < half; i += 32) {
        float a = to_f32(src[i]), b = to_f32(src[i + half]);
        if (w) {
            a = (a * r) * w[i];
            b = (b * r) * w[i + half];
        }
        /* the angle in f32 as transformers (and rope_cos_sin_cpu) forms it */
        const float angle = pos * inv_freq[i];
        const float c = cosf(angle), s = sinf(angle);
        const float x0 = a * c - b * s, x1 = b * c + a * s;
        if (dst) {
            dst[i] = x0;
            dst[i + half] = x1;
        }
        if (cache) {
            cache[i] = cache_from_f32<C>(x0, scale);
            cache[i + half] = cache_from_f32<C>(x1, scale);
        }
    }
}

/* Entry x < HD of a token's rotation table for norm_rope_head_cs, by thread x: x < HD / 2 the
 * cosine of pair x's angle, else the sine of pair x - HD / 2's (invf: inv_freq[x % (HD / 2)]), the
 * angle formed as norm_rope_head forms it, so that the table's results are its bit for bit. */
template <int HD>
__device__ __forceinline__ void rope_table_entry(float2 *cs, int x, float pos, float invf) {
    const float angle = pos * invf;
    if (x < HD / 2) cs[x].x = cosf(angle);
    else cs[x - HD / 2].y = sinf(angle);
}

/* norm_rope_head for a head_dim HD known at compile time (a multiple of 64), its inputs from
 * tables made before the head's values exist: cs[i] = (cosf(pos * inv_freq[i]), sinf(...))
 * (rope_table_entry), the norm's weights w (NULL: no norm); the head's values are read once,
 * into registers. Bit for bit norm_rope_head's results: the same operations in the same order
 * (the sum of squares lane by lane over i = lane, lane + 32, .., then across the warp). The rotated
 * values go to dst (f32) and / or to cache and cache2 (C); any may be NULL. S: as norm_rope_head's.
 */
template <typename C, int HD, typename S = float>
__device__ __forceinline__ void norm_rope_head_cs(const S *src, float *dst, C *cache, C *cache2,
                                                  const float *w, const float2 *cs, float eps,
                                                  float scale) {
    static_assert(HD % 64 == 0, "pairs of 32 lanes");
    constexpr int N = HD / 32, half = HD / 2;
    const int lane = threadIdx.x & 31;
    float v[N];
#pragma unroll
    for (int k = 0; k < N; k++)
        v[k] = to_f32(src[lane + 32 * k]);
    float r = 1.0f;
    if (w) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < N; k++)
            ss += v[k] * v[k];
        ss = warp_sum(ss);
        r = 1.0f / sqrtf(ss / (float)HD + eps);
    }
#pragma unroll
    for (int k = 0; k < N / 2; k++) {
        const int i = lane + 32 * k;
        float a = v[k], b = v[k + N / 2];
        if (w) {
            a = (a * r) * w[i];
            b = (b * r) * w[i + half];
        }
        const float c = cs[i].x, s = cs[i].y;
        const float x0 = a * c - b * s, x1 = b * c + a * s;
        if (dst) {
            dst[i] = x0;
            dst[i + half] = x1;
        }
        if (cache || cache2) {
            const C c0 = cache_from_f32<C>(x0, scale), c1 = cache_from_f32<C>(x1, scale);
            if (cache) cache[i] = c0, cache[i + half] = c1;
            if (cache2) cache2[i] = c0, cache2[i + half] = c1;
        }
    }
}

/* A v head's hd values (S: as norm_rope_head's) to the cache, by the lanes of a warp. */
template <typename C, typename S = float>
__device__ __forceinline__ void store_head(const S *src, C *cache, int hd, float scale) {
    for (int i = threadIdx.x & 31; i < hd; i += 32)
        cache[i] = cache_from_f32<C>(to_f32(src[i]), scale);
}

#endif
