/* mma.cuh: the tensor-core and asynchronous-copy instructions the kernel files share
 * (attention.cu, gemm_mma.cu, gemm_tma.cu): mma.sync m16n8k16 with f32 accumulators, cp.async of
 * 16 bytes and its groups, ldmatrix of four 8 x 8 matrices, shared-memory addresses, and Hopper's
 * warpgroup mma (wgmma). */
#ifndef CVLLM_BACKEND_CUDA_MMA_CUH
#define CVLLM_BACKEND_CUDA_MMA_CUH

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/cuda_util.cuh"

/* c += a (16 x 16, row) * b (16 x 8, col), f32 accumulators */
template <typename C>
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                        uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float c[4], const uint32_t a[4], uint32_t b0,
                                                 uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16 bytes from global src to shared dst, the first src_bytes of them read (the rest zeros) */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* until at most N of this thread's groups are in flight */
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* y's element from the sum v: stored (rounded to Y) or, with accum (Y = float), added */
template <typename Y> __device__ __forceinline__ void store_sum(Y *y, float v, bool accum) {
    *y = from_f32<Y>(accum ? to_f32(*y) + v : v);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* thread block clusters: sm_90 */
/* K split over the blocks of a cluster (gemm_mma.cu, gemm_tma.cu): every block keeps its partial
 * tile in its shared memory (red: rows x cols f32, row stride ld) and, once the cluster has synced,
 * block split of splits adds the split-th share of the tile's float4s over blocks 0, 1, ... in
 * turn (every part requested at once), so that a sum does not depend on timing, and stores row r,
 * columns c .. c + 3 at y[(m0 + r) * ldy + n0 + c ..] (rows past T, columns past N: not stored).
 * The caller syncs the cluster again before a block leaves. */
template <int MAXS, typename Y>
__device__ __forceinline__ void cluster_split_store(const float *red, int ld, int rows, int cols,
                                                    int split, int splits, int tid, int nthreads,
                                                    Y *y, int64_t ldy, int m0, int n0, int T,
                                                    int N, bool accum) {
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int q4 = cols / 4; /* float4s a row */
    for (int q = split * nthreads + tid; q < rows * q4; q += splits * nthreads) {
        const int r = q / q4, c = (q % q4) * 4, t = m0 + r;
        if (t >= T) continue;
        float4 u[MAXS];
#pragma unroll
        for (int s = 0; s < MAXS; s++)
            if (s < splits)
                u[s] = *(const float4 *)cluster.map_shared_rank((float *)&red[r * ld + c], s);
        float4 v = u[0];
#pragma unroll
        for (int s = 1; s < MAXS; s++)
            if (s < splits) v.x += u[s].x, v.y += u[s].y, v.z += u[s].z, v.w += u[s].w;
        const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (n0 + c + e < N) store_sum(&y[(int64_t)t * ldy + n0 + c + e], vv[e], accum);
    }
}
#endif

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* four 8 x 8 matrices of 16-bit elements: lane L gives the address of row L % 8 of matrix L / 8;
 * r[i] is matrix i's fragment (a thread's row g = lane / 4, columns 2 (lane % 4) and + 1) */
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
/* the same, each matrix transposed */
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* Host side of the split-K products (gemm_mma.cu, gemm_tma.cu): their arguments (supported: the
 * caller's *_supported(adt, T, K, x, w); y of ydt, f32 or adt, f32 to accumulate into; rows of y
 * ldy elements apart, at least N), 0 or the error named for who. */
static inline int own_gemm_args(const char *who, int supported, DType ydt, DType adt,
                                int accumulate, int64_t ldy, int T, int N, int K) {
    if (supported && (ydt == DTYPE_F32 || ydt == adt) && !(accumulate && ydt != DTYPE_F32) &&
        ldy >= N)
        return 0;
    return cvllm_errorf(CVLLM_EINVAL,
                        "cuda %s: dtype %d, T %d, N %d, K %d, output %d (rows %lld apart)%s not "
                        "supported",
                        who, (int)adt, T, N, K, (int)ydt, (long long)ldy,
                        accumulate ? " accumulated" : "");
}

/* A measuring switch's forced
 * split (CVLLM_CUDA_MMA_SPLIT, CVLLM_CUDA_TMA_SPLIT): N in 1..maxs, else 0 (unset or out of
 * range: split_k_count's own choice). */
static inline int split_k_env(const char *name, int maxs) {
    const char *e = getenv(name);
    const int v = e && *e ? atoi(e) : 0;
    return v >= 1 && v <= maxs ? v : 0;
}
/* The K splits of a product whose tiles make nt x mt blocks of nk steps of K each: forced (> 0,
 * for measuring) or enough for about a block an SM (room is left for the next kernel's blocks,
 * which programmatic launch schedules beside them), at least 2 steps a block; at most maxs (a
 * portable cluster: 8) and nk. */
static inline int split_k_count(int nt, int mt, int nk, int forced, int maxs) {
    int splits = forced;
    if (splits <= 0) {
        splits = cuda_device_sms() / (nt * mt);
        if (splits > nk / 2) splits = nk / 2;
    }
    if (splits > nk) splits = nk;
    if (splits > maxs) splits = maxs;
    return splits < 1 ? 1 : splits;
}
/* Launches kern over (nt, splits, mt) blocks of threads, the splits of a tile one thread block
 * cluster, with smem bytes of dynamic shared memory (past 48 KiB a kernel opts in, once a device:
 * attr_set, the caller's bits for devices 0..31) and programmatic launch where cuda_pdl_enabled(). */
template <typename Kern, typename... Args>
static cudaError_t split_k_launch(Kern kern, unsigned *attr_set, int nt, int splits, int mt,
                                  int threads, size_t smem, cudaStream_t st, Args... args) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev >= 32 || !(*attr_set >> dev & 1)) {
        cudaError_t e =
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        if (dev < 32) *attr_set |= 1u << dev;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(nt, splits, mt);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[2];
    int na = 0;
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = 1;
    attr[na].val.clusterDim.y = splits;
    attr[na].val.clusterDim.z = 1;
    na++;
    if (cuda_pdl_enabled()) {
        attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = na;
    return cudaLaunchKernelEx(&cfg, kern, args...);
}

/* Hopper's warpgroup mma (sm_90a): D[64 x 128] += A[64 x 16] B[16 x 128]^T, A and B K-major in
 * shared memory, read through descriptors: the tiles' 128-byte rows swizzled by 128 bytes (the
 * 16-byte chunk c of row r at c ^ (r % 8): gemm_mma.cu's swz(), the copy engine's SWIZZLE_128B),
 * 8-row groups 1024 bytes apart, from a 1024-byte aligned base; a k16 slice further along the rows
 * starts 32 bytes later. */
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3ffff) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) |
           (1ull << 62);
}
template <typename C>
__device__ __forceinline__ void wgmma_m64n128k16(float d[64], uint64_t da, uint64_t db);
template <typename C>
__device__ __forceinline__ void wgmma_m64n64k16(float d[32], uint64_t da, uint64_t db);
/* the same with A from registers (a warp's 16 rows of A[64 x 16] as mma.sync's A fragment, the
 * layout of an m64nNk16 accumulator's pair of n8 columns) and B MN-major ("transposed": B[16 x
 * 128] with its 128 columns contiguous in shared memory, 128-byte swizzled rows of 64 columns, the
 * descriptor's LBO the distance between those 64-column halves, SBO between 8-row groups) */
template <typename C>
__device__ __forceinline__ void wgmma_m64n128k16_rt(float d[64], const uint32_t a[4], uint64_t db);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* the instruction for element type TY ("bf16" or "f16"), d += A B^T */
/* The f32 accumulators of an m64n64 (32 a thread) and an m64n128 (64) wgmma as asm operands
 * (d[i] is %i) and the instruction's list of them. */
#define WGMMA_D32_OPS                                                                              \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),        \
    "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),     \
    "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),     \
    "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WGMMA_D64_OPS                                                                              \
    WGMMA_D32_OPS,                                                                                 \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]),     \
    "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]),     \
    "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]),     \
    "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),     \
    "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WGMMA_D32_LIST                                                                             \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "       \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_D64_LIST                                                                             \
    WGMMA_D32_LIST ", "                                                                            \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, "       \
    "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_M64N128K16(TY)                                                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" WGMMA_D64_LIST    \
                 "}, %64, %65, p, 1, 1, 0, 0;\n}"                                                  \
                 : WGMMA_D64_OPS                                                                   \
                 : "l"(da), "l"(db))
template <>
__device__ __forceinline__ void wgmma_m64n128k16<__nv_bfloat16>(float d[64], uint64_t da,
                                                                uint64_t db) {
    WGMMA_M64N128K16("bf16");
}
template <>
__device__ __forceinline__ void wgmma_m64n128k16<__half>(float d[64], uint64_t da, uint64_t db) {
    WGMMA_M64N128K16("f16");
}
/* the same with N = 64: D[64 x 64], 32 sums a thread */
#define WGMMA_M64N64K16(TY)                                                                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" WGMMA_D32_LIST      \
                 "}, %32, %33, p, 1, 1, 0, 0;\n}"                                                  \
                 : WGMMA_D32_OPS                                                                   \
                 : "l"(da), "l"(db))
template <>
__device__ __forceinline__ void wgmma_m64n64k16<__nv_bfloat16>(float d[32], uint64_t da,
                                                               uint64_t db) {
    WGMMA_M64N64K16("bf16");
}
template <>
__device__ __forceinline__ void wgmma_m64n64k16<__half>(float d[32], uint64_t da, uint64_t db) {
    WGMMA_M64N64K16("f16");
}
/* the register-A, B-transposed form (wgmma_m64n128k16_rt) */
#define WGMMA_M64N128K16_RT(TY)                                                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" WGMMA_D64_LIST    \
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"                                    \
                 : WGMMA_D64_OPS                                                                   \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db))
template <>
__device__ __forceinline__ void wgmma_m64n128k16_rt<__nv_bfloat16>(float d[64], const uint32_t a[4],
                                                                   uint64_t db) {
    WGMMA_M64N128K16_RT("bf16");
}
template <>
__device__ __forceinline__ void wgmma_m64n128k16_rt<__half>(float d[64], const uint32_t a[4],
                                                            uint64_t db) {
    WGMMA_M64N128K16_RT("f16");
}
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_proxy_fence() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit_wait() {
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
/* until at most N of the warpgroup's committed groups are in flight */
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
#else
template <typename C>
__device__ __forceinline__ void wgmma_m64n128k16(float *, uint64_t, uint64_t) {
    __trap(); /* compiled for sm_90 without the "a" features: never launched there */
}
template <typename C> __device__ __forceinline__ void wgmma_m64n64k16(float *, uint64_t, uint64_t) {
    __trap();
}
template <typename C>
__device__ __forceinline__ void wgmma_m64n128k16_rt(float *, const uint32_t *, uint64_t) {
    __trap();
}
__device__ __forceinline__ void wgmma_fence() {}
__device__ __forceinline__ void wgmma_proxy_fence() {}
__device__ __forceinline__ void wgmma_commit_wait() {}
__device__ __forceinline__ void wgmma_commit() {}
template <int N> __device__ __forceinline__ void wgmma_wait() {}
#endif

#endif
