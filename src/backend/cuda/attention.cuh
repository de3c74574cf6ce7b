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

/* The prefill on Hopper's warpgroup mma (attention_prefill_wg.cu): whether it takes p (an sm_90a
 * build on a 9.0 device, head_dim 128, 16-bit products; CVLLM_CUDA_PREFILL_WG=0: never), and
 * its launch. */
int attention_prefill_wg_supported(const AttentionParams *p);
int attention_prefill_wg_cuda(const AttentionParams *p, cudaStream_t stream);

#endif
