/* gemv.cu: the matrix products of a few tokens (decode at small batches) without cuBLASLt:
 * y[t, n] = sum_k x[t, k] * W[n, k] for t < T <= 8, bf16 / f16 in, f32 accumulation and out.
 * CPU twin: matmul_cpu (as gemm_cuda, which calls this for small T).
 *
 * At T = 1..4 a product is a pass over W, so the kernel is built to stream W at the memory's
 * rate: a block of 256 threads takes 2 rows of W, 128 threads a row, each thread 16-byte loads of
 * 8 elements every 1024 columns (several in flight), the T rows of x read through the cache; the
 * row's partial sums meet by shuffles and shared memory. cuBLASLt's kernels at T = 1 reached about
 * 530 GB/s on the qkv product of qwen3-0.6b (docs/BENCHMARKS.md), a few microseconds of
 * weights in about 16 us. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_util.cuh"

#define GEMV_THREADS 256
#define GEMV_ROWS 2 /* rows of W per block */
#define GEMV_TPR (GEMV_THREADS / GEMV_ROWS)

template <typename C> __device__ __forceinline__ void unpack8(const uint4 &u, float f[8]) {
    const C *e = (const C *)&u;
#pragma unroll
    for (int i = 0; i < 8; i++)
        f[i] = to_f32(e[i]);
}

/* The weights do not depend on the kernel before: a block asks L2 for the start of its rows
 * before it waits for that kernel (pdl_wait), so that its first loads find them there. How much:
 * pf bytes of each row, at most GEMV_PREFETCH_BUDGET / N (gemv_prefetch_bytes), so that what all
 * the rows ask for stays well inside the 50 MB L2: whole rows at qwen3-8b's K = 4096 (1,056
 * resident blocks of 8 rows of 8 KB, 67 MB) outgrew it and were read twice (its batch-1 decode
 * 195 -> 164 tok/s, H200, 2026-11-23), while qwen3-0.6b's rows (2-6 KB) fit whole. Thread i of n
 * takes the 128-byte lines i, i + n, ... */
#define GEMV_PREFETCH_BUDGET (16 << 20)
template <typename C>
__device__ __forceinline__ void prefetch_row(const C *row, int pf, int i, int n) {
    const char *b = (const char *)row;
    for (int o = i * 128; o < pf; o += n * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(b + o));
}
static int gemv_prefetch_bytes(int N, int K, int elem) {
    const long long row = (long long)K * elem, share = (long long)GEMV_PREFETCH_BUDGET / N;
    return (int)(row < share ? row : share);
}

/* y's element: the sum v (rounded to Y), or with accum y + v (Y = float) */
template <typename Y> __device__ __forceinline__ void gemv_store(Y *y, float v, bool accum) {
    *y = from_f32<Y>(accum ? to_f32(*y) + v : v);
}

template <typename C, int TT, typename Y>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_kernel(Y *__restrict__ y, int64_t ldy, const C *__restrict__ x,
                const C *__restrict__ w, int N, int K, int pf, bool accum) {
    const int sub = threadIdx.x / GEMV_TPR, j = threadIdx.x % GEMV_TPR;
    const int n = blockIdx.x * GEMV_ROWS + sub;
    if (n < N) prefetch_row(w + (int64_t)n * K, pf, j, GEMV_TPR);
    pdl_wait();
    pdl_trigger();
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++)
        acc[t] = 0.0f;
    if (n < N) {
        const C *wr = w + (int64_t)n * K;
#pragma unroll 4
        for (int k = j * 8; k < K; k += GEMV_TPR * 8) {
            float wf[8], xf[8];
            unpack8<C>(__ldg((const uint4 *)(wr + k)), wf);
#pragma unroll
            for (int t = 0; t < TT; t++) {
                unpack8<C>(__ldg((const uint4 *)(x + (int64_t)t * K + k)), xf);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    acc[t] += wf[i] * xf[i];
            }
        }
    }
    __shared__ float part[GEMV_THREADS / 32][TT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < TT; t++) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) part[warp][t] = v;
    }
    __syncthreads();
    constexpr int WPR = GEMV_TPR / 32; /* warps per row */
    if (j < TT && n < N) {
        float v = 0.0f;
#pragma unroll
        for (int i = 0; i < WPR; i++)
            v += part[sub * WPR + i][j];
        gemv_store(&y[(int64_t)j * ldy + n], v, accum);
    }
}

/* The same product with a warp per row of W (8 rows a block): each lane's 16-byte loads every
 * 256 columns unrolled, no shared memory; for the tall matrices (qkv, gate/up, lm_head). */
template <typename C, int TT, typename Y>
__global__ void __launch_bounds__(256)
    gemv_warp_kernel(Y *__restrict__ y, int64_t ldy, const C *__restrict__ x,
                     const C *__restrict__ w, int N, int K, int pf, bool accum) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (n < N) prefetch_row(w + (int64_t)n * K, pf, lane, 32);
    pdl_wait();
    pdl_trigger();
    if (n >= N) return; /* a whole warp: nothing below synchronizes the block */
    const C *wr = w + (int64_t)n * K;
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++)
        acc[t] = 0.0f;
#pragma unroll 4
    for (int k = lane * 8; k < K; k += 256) {
        float wf[8], xf[8];
        unpack8<C>(__ldg((const uint4 *)(wr + k)), wf);
#pragma unroll
        for (int t = 0; t < TT; t++) {
            unpack8<C>(__ldg((const uint4 *)(x + (int64_t)t * K + k)), xf);
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[t] += wf[i] * xf[i];
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        const float v = warp_sum(acc[t]);
        if (lane == t) gemv_store(&y[(int64_t)t * ldy + n], v, accum);
    }
}

/* One token's gate/up product with silu_mul_kernel folded in: W is [2N, K] (the gate rows, then the
 * up rows); warp n takes gate row n and up row N + n (gemv_warp_kernel's loop and sums for each, so
 * both dots are that kernel's bit for bit), rounds them to C first where the unfused pair's
 * product would write C (round16: the backend's fusion "gu16"), and writes g[n] =
 * adt(silu(gate) * up), as silu_mul_kernel does: a launch fewer a layer at batch 1, and no
 * gate/up row written and read back. */
template <typename C>
__global__ void __launch_bounds__(256)
    gemv_silu_pair_kernel(C *__restrict__ g, const C *__restrict__ x, const C *__restrict__ w,
                          int N, int K, int pf, bool round16) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (n < N) {
        prefetch_row(w + (int64_t)n * K, pf, lane, 32);
        prefetch_row(w + (int64_t)(N + n) * K, pf, lane, 32);
    }
    pdl_wait();
    pdl_trigger();
    if (n >= N) return;
    const C *gr = w + (int64_t)n * K, *ur = w + (int64_t)(N + n) * K;
    float ag = 0.0f, au = 0.0f;
#pragma unroll 4
    for (int k = lane * 8; k < K; k += 256) {
        float gf[8], uf[8], xf[8];
        unpack8<C>(__ldg((const uint4 *)(gr + k)), gf);
        unpack8<C>(__ldg((const uint4 *)(ur + k)), uf);
        unpack8<C>(__ldg((const uint4 *)(x + k)), xf);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            ag += gf[i] * xf[i];
            au += uf[i] * xf[i];
        }
    }
    ag = warp_sum(ag);
    au = warp_sum(au);
    if (round16) ag = to_f32(from_f32<C>(ag)), au = to_f32(from_f32<C>(au));
    if (lane == 0) g[n] = from_f32<C>(ag / (1.0f + expf(-ag)) * au);
}

/* CVLLM_CUDA_GEMV: "wide" (2 rows a block), "warp" (a warp per row) or unset: a warp per row when
 * N >= 2048, else wide. */
static int gemv_use_warp(int N) {
    static int v = -2;
    if (v == -2) {
        const char *e = getenv("CVLLM_CUDA_GEMV");
        v = e && !strcmp(e, "wide") ? 0 : e && !strcmp(e, "warp") ? 1 : -1;
    }
    return v >= 0 ? v : N >= 2048;
}

extern "C" int gemv_cuda_supported(DType adt, int T, int K, const void *d_x, const void *d_w) {
    return (adt == DTYPE_BF16 || adt == DTYPE_F16) && T >= 1 && T <= 8 && K % 8 == 0 &&
           ((uintptr_t)d_x & 15) == 0 && ((uintptr_t)d_w & 15) == 0;
}

template <typename C, typename Y>
static void launch_gemv(Y *y, bool acc, int64_t ldy, const void *x, const void *w, int T, int N,
                        int K, cudaStream_t st) {
    const int warp = gemv_use_warp(N);
    const dim3 grid(warp ? (N + 7) / 8 : (N + GEMV_ROWS - 1) / GEMV_ROWS);
    const C *xc = (const C *)x, *wc = (const C *)w;
    const int pf = gemv_prefetch_bytes(N, K, (int)sizeof(C));
    switch (T) {
#define GEMV_CASE(TT)                                                                              \
    case TT:                                                                                       \
        if (warp)                                                                                  \
            pdl_launch(gemv_warp_kernel<C, TT, Y>, grid, 256, 0, st, y, ldy, xc, wc, N, K, pf,     \
                       acc);                                                                       \
        else                                                                                       \
            pdl_launch(gemv_kernel<C, TT, Y>, grid, GEMV_THREADS, 0, st, y, ldy, xc, wc, N, K, pf, \
                       acc);                                                                       \
        break;
        GEMV_CASE(1)
        GEMV_CASE(2)
        GEMV_CASE(3)
        GEMV_CASE(4)
        GEMV_CASE(5)
        GEMV_CASE(6)
        GEMV_CASE(7)
        GEMV_CASE(8)
#undef GEMV_CASE
    default:
        break;
    }
}

extern "C" int gemv_cuda(float *d_y, int64_t ldy, const void *d_x, const void *d_w, DType adt,
                         int T, int N, int K, cudaStream_t stream) {
    return gemv_cuda_out(d_y, DTYPE_F32, 0, ldy, d_x, d_w, adt, T, N, K, stream);
}

extern "C" int gemv_cuda_out(void *d_y, DType ydt, int accumulate, int64_t ldy, const void *d_x,
                             const void *d_w, DType adt, int T, int N, int K,
                             cudaStream_t stream) {
    if (!gemv_cuda_supported(adt, T, K, d_x, d_w) || (ydt != DTYPE_F32 && ydt != adt) ||
        (accumulate && ydt != DTYPE_F32))
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda gemv: dtype %d, T %d, K %d, output %d%s not supported", (int)adt,
                            T, K, (int)ydt, accumulate ? " accumulated" : "");
    const bool acc = accumulate != 0;
    if (adt == DTYPE_BF16) {
        if (ydt == DTYPE_F32)
            launch_gemv<__nv_bfloat16>((float *)d_y, acc, ldy, d_x, d_w, T, N, K, stream);
        else
            launch_gemv<__nv_bfloat16>((__nv_bfloat16 *)d_y, acc, ldy, d_x, d_w, T, N, K, stream);
    } else {
        if (ydt == DTYPE_F32)
            launch_gemv<__half>((float *)d_y, acc, ldy, d_x, d_w, T, N, K, stream);
        else
            launch_gemv<__half>((__half *)d_y, acc, ldy, d_x, d_w, T, N, K, stream);
    }
    CUDA_LAUNCH_TRY();
    return 0;
}

template <typename C>
static void launch_silu_pair(void *g, const void *x, const void *w, int N, int K, bool round16,
                             cudaStream_t st) {
    pdl_launch(gemv_silu_pair_kernel<C>, dim3((N + 7) / 8), 256, 0, st, (C *)g, (const C *)x,
               (const C *)w, N, K, gemv_prefetch_bytes(2 * N, K, (int)sizeof(C)), round16);
}

extern "C" int gemv_silu_pair_cuda(void *d_g, const void *d_x, const void *d_w, DType adt,
                                   DType gudt, int N, int K, cudaStream_t stream) {
    if (!gemv_cuda_supported(adt, 1, K, d_x, d_w))
        return cvllm_errorf(CVLLM_EINVAL, "cuda gemv silu pair: dtype %d, K %d not supported",
                            (int)adt, K);
    if (gudt != DTYPE_F32 && gudt != adt)
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda gemv silu pair: gate/up of dtype %d for a dtype %d model",
                            (int)gudt, (int)adt);
    const bool r16 = gudt != DTYPE_F32;
    if (adt == DTYPE_BF16)
        launch_silu_pair<__nv_bfloat16>(d_g, d_x, d_w, N, K, r16, stream);
    else
        launch_silu_pair<__half>(d_g, d_x, d_w, N, K, r16, stream);
    CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int gemv_silu_pair_one_wave(DType adt, int N, int num_sms) {
    int per_sm = 0;
    const cudaError_t e =
        adt == DTYPE_BF16
            ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                  &per_sm, gemv_silu_pair_kernel<__nv_bfloat16>, 256, 0)
            : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_silu_pair_kernel<__half>,
                                                            256, 0);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (N + 7) / 8 <= (int64_t)per_sm * num_sms;
}
