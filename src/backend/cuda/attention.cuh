/* attention.cuh: what attention.cu and attention_prefill_wg.cu share: an output element's store,
 * 16-bit pairs, an fp8 cache's dequantization into 16-bit tiles, the lazy max rule's threshold,
 * and the wgmma prefill's entry points. */
#ifndef CVLLM_BACKEND_CUDA_ATTENTION_CUH
#define CVLLM_BACKEND_CUDA_ATTENTION_CUH

#include "backend/cuda/cuda_util.cuh"

/* The running max of a row moves only where a tile's max passes it by more than this (log2
 * units): attention.cu's decode kernels (where the rule is explained) and both prefill kernels. */
#define DTC_LAZY 8.0f

/* out[i] = v in the output's dtype (bf16 / f16 rounded to nearest, or f32) */
__device__ __forceinline__ void store_out(void *out, DType adt, int64_t i, float v) {
    if (adt == DTYPE_BF16)
        ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn(v);
    else if (adt == DTYPE_F16)
        ((__half *)out)[i] = __float2half_rn(v);
    else
        ((float *)out)[i] = v;
}

/* a and b rounded to C, a in the low half */
template <typename C> __device__ __forceinline__ uint32_t pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b); /* .x (a) in the low half */
    return *(uint32_t *)&v;
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *(uint32_t *)&v;
}

/* 8 fp8 e4m3 values (raw) times scale, rounded to C, as 16 bytes */
template <typename C> __device__ __forceinline__ uint4 fp8x8_to(uint2 raw, float scale) {
    const __nv_fp8x2_storage_t *p2 = (const __nv_fp8x2_storage_t *)&raw;
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 v = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(p2[i], __NV_E4M3)));
        w[i] = pack2<C>(v.x * scale, v.y * scale);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* A 16-row m-tile's step of the prefill's online softmax, by a warp, over NS n8 columns of raw
 * scores in an mma accumulator's layout (mma.sync's, or a warp's rows of wgmma's): sc[n][e] is
 * row g (e < 2) or g + 8 of the m-tile (positions pos0, pos0 + 8), key k0 + 8 n + 2 t4 + (e & 1)
 * (g = lane / 4, t4 = lane % 4). Where edge (warp-uniform), keys past a row's position are masked.
 * The running max m (log2 units, sl2 = scale * log2 e) moves only where the tile's passes it by
 * more than DTC_LAZY (the decode kernels' lazy rule: weights up to 2^DTC_LAZY, and most tiles
 * rescale nothing; key 0 is visible to every row, so the max is finite from the first tile on).
 * Returns in c the factors the caller's O rows are to be multiplied by (1: unchanged), updates
 * the rows' partial sums l (a quarter of a row's: reduced over the quad at the end) and writes
 * the weights rounded to C as the A fragments of P V, pf[k] for keys 16 k .. 16 k + 15. */
template <typename C, int NS>
__device__ __forceinline__ void prefill_softmax_step(float (&sc)[NS][4], uint32_t (&pf)[NS / 2][4],
                                                     float (&m)[2], float (&l)[2], float (&c)[2],
                                                     float sl2, bool edge, int k0, int pos0,
                                                     int t4) {
    if (edge) {
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (k0 + n * 8 + 2 * t4 + (e & 1) > pos0 + (e < 2 ? 0 : 8)) sc[n][e] = -INFINITY;
    }
    float mx0 = -INFINITY, mx1 = -INFINITY; /* the raw scores' max */
#pragma unroll
    for (int n = 0; n < NS; n++) {
        mx0 = fmaxf(mx0, fmaxf(sc[n][0], sc[n][1]));
        mx1 = fmaxf(mx1, fmaxf(sc[n][2], sc[n][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float o0 = m[0], o1 = m[1];
    if (mx0 * sl2 > o0 + DTC_LAZY) m[0] = mx0 * sl2;
    if (mx1 * sl2 > o1 + DTC_LAZY) m[1] = mx1 * sl2;
    c[0] = o0 == -INFINITY ? 0.0f : fast_exp2(o0 - m[0]);
    c[1] = o1 == -INFINITY ? 0.0f : fast_exp2(o1 - m[1]);
    const float ms0 = m[0] == -INFINITY ? 0.0f : m[0], ms1 = m[1] == -INFINITY ? 0.0f : m[1];
    float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
    for (int n = 0; n < NS; n++) {
        const float p0 = fast_exp2(fmaf(sc[n][0], sl2, -ms0));
        const float p1 = fast_exp2(fmaf(sc[n][1], sl2, -ms0));
        const float p2 = fast_exp2(fmaf(sc[n][2], sl2, -ms1));
        const float p3 = fast_exp2(fmaf(sc[n][3], sl2, -ms1));
        rs0 += p0 + p1;
        rs1 += p2 + p3;
        /* row g, keys 2 t4, 2 t4 + 1 (+8 if n is odd); then row g + 8 */
        pf[n / 2][(n & 1) * 2 + 0] = pack2<C>(p0, p1);
        pf[n / 2][(n & 1) * 2 + 1] = pack2<C>(p2, p3);
    }
    l[0] = l[0] * c[0] + rs0;
    l[1] = l[1] * c[1] + rs1;
}

/* The prefill on Hopper's warpgroup mma (attention_prefill_wg.cu): whether it takes p, one the
 * tensor-core prefill takes (attention_prefill_uses_tc: 16-bit products, q's rows 16-byte
 * aligned), given an sm_90a build on a 9.0 device, head_dim 128 and 16-byte aligned caches
 * (CVLLM_CUDA_PREFILL_WG=0: never); and its launch. */
int attention_prefill_wg_supported(const AttentionParams *p);
int attention_prefill_wg_cuda(const AttentionParams *p, cudaStream_t stream);

#endif
