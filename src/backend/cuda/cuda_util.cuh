/* cuda_util.cuh: what the .cu files share: element loads/stores for the three dtypes (and the
 * KV cache's fourth, fp8 e4m3), warp reductions, and the error hook (common.h is C, so the two
 * functions used are declared here). */
#ifndef CVLLM_BACKEND_CUDA_UTIL_CUH
#define CVLLM_BACKEND_CUDA_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/kernels.h"
#include "cvllm.h"

extern "C" int cvllm_errorf(int code, const char *fmt, ...);

/* Element conversions: every type is widened to f32 for arithmetic. */
__device__ __forceinline__ float to_f32(float x) {
    return x;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
    return __bfloat162float(x);
}
__device__ __forceinline__ float to_f32(__half x) {
    return __half2float(x);
}
template <typename T> __device__ __forceinline__ T from_f32(float x);
/* round to nearest even, as torch's .to(bfloat16) and the CPU's f32_to_bf16 */
template <> __device__ __forceinline__ float from_f32<float>(float x) {
    return x;
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x) {
    return __float2half_rn(x);
}

/* fp8 e4m3 (a KV cache type only): the conversions vLLM's fp8 cache uses, round to nearest even
 * with saturation to +-448 on the way down (CPU twins: f32_to_fp8_e4m3, fp8_e4m3_to_f32 in
 * common.c, bit for bit). */
__device__ __forceinline__ float to_f32(__nv_fp8_e4m3 x) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(x.__x, __NV_E4M3)));
}
template <> __device__ __forceinline__ __nv_fp8_e4m3 from_f32<__nv_fp8_e4m3>(float x) {
    __nv_fp8_e4m3 r;
    r.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    return r;
}
template <typename C> struct IsFp8 {
    static constexpr bool value = false;
};
template <> struct IsFp8<__nv_fp8_e4m3> {
    static constexpr bool value = true;
};
/* A KV cache element to and from f32 with its per-tensor scale (vLLM: stored = e4m3(x / scale),
 * read = f32(stored) * scale). Only fp8 is scaled; the other types ignore scale. */
template <typename C> __device__ __forceinline__ C cache_from_f32(float x, float scale) {
    if constexpr (IsFp8<C>::value)
        return from_f32<C>(x / scale);
    else
        return from_f32<C>(x);
}
template <typename C> __device__ __forceinline__ float cache_to_f32(C x, float scale) {
    if constexpr (IsFp8<C>::value)
        return to_f32(x) * scale;
    else
        return to_f32(x);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Calls f.template operator()<T>() with T the C++ type of dt. */
#define DISPATCH_DTYPE(dt, T, ...)                                                                 \
    do {                                                                                           \
        if ((dt) == DTYPE_BF16) {                                                                  \
            typedef __nv_bfloat16 T;                                                               \
            __VA_ARGS__;                                                                           \
        } else if ((dt) == DTYPE_F16) {                                                            \
            typedef __half T;                                                                      \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            typedef float T;                                                                       \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
    } while (0)
/* The same over the KV cache's types: DISPATCH_DTYPE's three and fp8 e4m3. */
#define DISPATCH_KV_DTYPE(dt, T, ...)                                                              \
    do {                                                                                           \
        if ((dt) == DTYPE_FP8_E4M3) {                                                              \
            typedef __nv_fp8_e4m3 T;                                                               \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            DISPATCH_DTYPE(dt, T, __VA_ARGS__);                                                    \
        }                                                                                          \
    } while (0)

#endif
