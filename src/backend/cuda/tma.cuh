/* tma.cuh: the tensor copy engine (TMA) as the kernel files use it (attention.cu's decode kernels,
 * gemm_tma.cu): mbarriers, 2-D tile copies into shared memory, and the host's tensor maps. */
#ifndef CVLLM_BACKEND_CUDA_TMA_CUH
#define CVLLM_BACKEND_CUDA_TMA_CUH

#include <cuda.h> /* CUtensorMap: the driver entry point is found at run time (tma.cu) */
#include <stdint.h>

#include "backend/cuda/kernels.h"

/* The map of a row-major 2-D tensor [rows, cols] of dt (16-bit elements, or fp8 codes as bytes)
 * at base, in boxes of box_rows rows x 128 bytes (the 128-byte swizzle's span: 64 elements of 16
 * bits), swizzled by 128 bytes; rows past the end read as zeros. Kept in a table by address,
 * shape and box (any thread), so that an eager step does not encode its maps again. */
int tma_map_2d(CUtensorMap *out, const void *base, int64_t rows, int64_t cols, DType dt,
               int box_rows);

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* until the barrier's phase of this parity has completed */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n"
                 "}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
/* box (x, y) of the 2-D tensor map into shared memory at dst, completing on bar */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int x, int y,
                                            uint32_t bar, uint64_t policy) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
                 "l"((const void *)map), "r"(x), "r"(y), "r"(bar), "l"(policy)
                 : "memory");
}
/* L2 policies for the copies' cache hint */
__device__ __forceinline__ uint64_t l2_evict_first() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}
__device__ __forceinline__ uint64_t l2_evict_last() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}
#endif

#endif
