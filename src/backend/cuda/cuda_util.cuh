/* cuda_util.cuh: what the .cu files share: element loads/stores for the three dtypes, warp
 * reductions, and the error hook (common.h is C, so the two functions used are declared here). */
#ifndef CVLLM_BACKEND_CUDA_UTIL_CUH
#define CVLLM_BACKEND_CUDA_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

#endif
