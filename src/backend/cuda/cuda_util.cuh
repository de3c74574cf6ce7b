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

/* 2^x by the special-function unit alone (ex2.approx.ftz: about 2 ulp, a result below 2^-126
 * flushed to 0, 2^-inf = 0), for softmax weights 2^(s - max) with s - max <= 0. exp2f adds a
 * range check, a halving and a squaring around the same instruction to keep denormal results
 * (five instructions a weight instead of one; weights under 2^-126 of the row's largest add
 * nothing to an f32 sum whose largest term is 1). */
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Programmatic dependent launch (sm_90 and later): a kernel launched by pdl_launch may be
 * scheduled while the kernel before it on the stream is still running; it must call pdl_wait()
 * before its first global memory access (read or write), which returns once the kernel before
 * has completed and its writes are visible. pdl_trigger() tells the hardware that the kernel after
 * may be launched now: its blocks become resident only after every block of this one has started
 * (so nothing of this kernel waits for them), and then wait in pdl_wait(). What is hidden is the
 * launch and scheduling of the next kernel (a few us at each of the ~300 kernel boundaries of a
 * batch-1 decode step). In a CUDA graph the edges become programmatic ones. Kernels that are not
 * launched by pdl_launch (cuBLASLt's, NCCL's) order as usual. Below sm_90 both are no-ops and the
 * launch attribute is not set. CVLLM_CUDA_PDL=0 turns it off. */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* pdl_launch sets the programmatic attribute where cuda_pdl_enabled() (kernels.h) says so. */
template <typename... KArgs, typename... Args>
static inline cudaError_t pdl_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                     cudaStream_t stream, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = cuda_pdl_enabled() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
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
