/* gemm_mma.cu: the matrix products of decode steps (tens to hundreds of tokens) on the tensor
 * cores without cuBLASLt: y[T, N] = x[T, K] @ W[N, K]^T, bf16 / f16 in, f32 accumulation, y in
 * f32, in the inputs' dtype (the f32 sums rounded once) or added to an f32 y; the semantics of
 * gemm_cuda, gemm_cuda_to and gemm_cuda_acc. CPU twin: matmul_cpu (as gemm_cuda).
 *
 * Why a kernel of our own: a decode product reads a few MB of weights (qwen3-0.6b: 4-13 MB), a
 * microsecond or two at the memory's rate, but a cuBLASLt kernel costs ~5.5 us or more whatever
 * its tile (docs/BENCHMARKS.md, rounds 11-13): it cannot start before the kernel ahead of it has
 * ended, and its first bytes then arrive a memory latency later. This kernel is launched with
 * programmatic dependent launch (cuda_util.cuh): it says at once that the kernel after it may be
 * scheduled (pdl_trigger), and it starts loading its weights, which no kernel of the step writes,
 * before it waits for the kernel ahead (pdl_wait); only the activations x (and an accumulated y)
 * are read after the wait.
 *
 * Tiling: a block computes a BM x BN tile of y (BM tokens, BN rows of W) over a range of K, in
 * steps of BK = 64 (a 128-byte row of each operand a step), STAGES steps in flight by cp.async
 * (16-byte chunks, the chunk c of row r at position c ^ (r & 7) of its 128-byte row, so that the
 * ldmatrix reads of 8 rows hit 8 different bank groups). Each warp takes a WM x 32 piece (WM =
 * min(BM, 64)), mma.sync m16n8k16 from ldmatrix fragments. The grid is (N tiles, splits, T
 * tiles): where the tiles alone would leave SMs idle, K is split over up to 8 blocks of a thread
 * block cluster, which add their partial tiles through distributed shared memory in a fixed order
 * (split 0 first), so a result does not depend on timing: the same bits at every run. */
#include <cooperative_groups.h>
#include <stdlib.h>

#include "backend/cuda/cuda_util.cuh"

namespace cg = cooperative_groups;

#define MMA_BK 64
#define MMA_MAX_SPLIT 8

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0; /* 0: the 16 bytes are zeros, nothing is read */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(n)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
template <typename C>
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2]);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float d[4], const uint32_t a[4],
                                                        const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float d[4], const uint32_t a[4],
                                                 const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* The element offset of (row r, 16-byte chunk c) in a tile of 64-element rows. */
__device__ __forceinline__ int swz(int r, int c) {
    return r * MMA_BK + ((c ^ (r & 7)) << 3);
}

template <int BM, int BN> struct MmaShape {
    static constexpr int WM = BM < 64 ? BM : 64; /* a warp's rows (tokens) */
    static constexpr int WGM = BM / WM, WGN = BN / 32, THREADS = WGM * WGN * 32;
    static constexpr int MI = WM / 16, NI = 4; /* m16 and n8 tiles a warp */
    static constexpr int STAGE = (BM + BN) * MMA_BK; /* elements a stage */
    /* steps in flight: 3 where a stage is 32 KB (two blocks an SM), else 4 */
    static constexpr int STAGES = BM + BN >= 256 ? 3 : 4;
    static constexpr int RED_LD = BN + 4; /* f32 row of the split reduction's tile */
    static constexpr size_t SMEM = (size_t)STAGES * STAGE * 2 > (size_t)BM * RED_LD * 4
                                       ? (size_t)STAGES * STAGE * 2
                                       : (size_t)BM * RED_LD * 4;
};

/* y's element (t, n) from the sum v: stored (rounded to Y) or, with accum (Y = float), added */
template <typename Y> __device__ __forceinline__ void mma_store(Y *y, float v, bool accum) {
    *y = from_f32<Y>(accum ? to_f32(*y) + v : v);
}

template <typename C, typename Y, int BM, int BN>
__global__ void __launch_bounds__(MmaShape<BM, BN>::THREADS)
    gemm_mma_kernel(Y *__restrict__ y, int64_t ldy, const C *__restrict__ x,
                    const C *__restrict__ w, int T, int N, int K, bool accum) {
    using S = MmaShape<BM, BN>;
    extern __shared__ __align__(128) unsigned char mma_smem[];
    C *sm = (C *)mma_smem;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.z * BM;
    const int split = blockIdx.y, splits = gridDim.y;
    const int nk = K / MMA_BK, k_lo = split * nk / splits, k_hi = (split + 1) * nk / splits;
    const int steps = k_hi - k_lo;

    /* a stage's W tile (BN rows) then its x tile (BM rows) */
    auto load_w = [&](int step, int slot) {
        C *d = sm + slot * S::STAGE + BM * MMA_BK;
        const int k = (k_lo + step) * MMA_BK;
        for (int i = tid; i < BN * 8; i += S::THREADS) {
            const int r = i >> 3, c = i & 7, n = n0 + r;
            cp_async16(d + swz(r, c), w + (int64_t)(n < N ? n : 0) * K + k + c * 8, n < N);
        }
    };
    auto load_x = [&](int step, int slot) {
        C *d = sm + slot * S::STAGE;
        const int k = (k_lo + step) * MMA_BK;
        for (int i = tid; i < BM * 8; i += S::THREADS) {
            const int r = i >> 3, c = i & 7, t = m0 + r;
            cp_async16(d + swz(r, c), x + (int64_t)(t < T ? t : 0) * K + k + c * 8, t < T);
        }
    };

    pdl_trigger();
    /* the weights of the first stages before the wait: nothing in the step writes them. The
     * groups committed below hold them with the first stage's x, so the waits stay in order. */
#pragma unroll
    for (int s = 0; s < S::STAGES - 1; s++)
        if (s < steps) load_w(s, s);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < S::STAGES - 1; s++) {
        if (s < steps) load_x(s, s);
        cp_async_commit();
    }

    const int wm = warp / S::WGN, wn = warp % S::WGN;
    float acc[S::MI][S::NI][4];
#pragma unroll
    for (int i = 0; i < S::MI; i++)
#pragma unroll
        for (int j = 0; j < S::NI; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = 0.0f;

    for (int step = 0; step < steps; step++) {
        cp_async_wait<S::STAGES - 2>();
        __syncthreads(); /* the stage is in; every warp is done with the slot refilled below */
        const int next = step + S::STAGES - 1;
        if (next < steps) {
            load_w(next, next % S::STAGES);
            load_x(next, next % S::STAGES);
        }
        cp_async_commit();
        const C *sa = sm + (step % S::STAGES) * S::STAGE, *sb = sa + BM * MMA_BK;
        /* fragments of k16 slice kk + 1 are loaded while the mma of slice kk run */
        uint32_t a[2][S::MI][4], b[2][S::NI][2];
        auto frags = [&](int kk, int f) {
#pragma unroll
            for (int i = 0; i < S::MI; i++) {
                const int r = wm * S::WM + i * 16 + (lane & 15);
                ldmatrix_x4(a[f][i], sa + swz(r, kk * 2 + (lane >> 4)));
            }
#pragma unroll
            for (int j = 0; j < S::NI; j += 2) {
                const int r = wn * 32 + j * 8 + (lane & 7) + ((lane >> 4) << 3);
                uint32_t q[4];
                ldmatrix_x4(q, sb + swz(r, kk * 2 + ((lane >> 3) & 1)));
                b[f][j][0] = q[0], b[f][j][1] = q[1], b[f][j + 1][0] = q[2], b[f][j + 1][1] = q[3];
            }
        };
        frags(0, 0);
#pragma unroll
        for (int kk = 0; kk < MMA_BK / 16; kk++) {
            if (kk + 1 < MMA_BK / 16) frags(kk + 1, (kk + 1) & 1);
#pragma unroll
            for (int i = 0; i < S::MI; i++)
#pragma unroll
                for (int j = 0; j < S::NI; j++)
                    mma16816<C>(acc[i][j], a[kk & 1][i], b[kk & 1][j]);
        }
    }
    cp_async_wait<0>();

    /* a thread's sums: rows g, g + 8 of each m16 tile, columns 2 t4, 2 t4 + 1 of each n8 tile */
    const int g = lane >> 2, t4 = lane & 3;
    if (splits == 1) {
#pragma unroll
        for (int i = 0; i < S::MI; i++)
#pragma unroll
            for (int j = 0; j < S::NI; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = m0 + wm * S::WM + i * 16 + g + (e >> 1) * 8;
                    const int n = n0 + wn * 32 + j * 8 + t4 * 2 + (e & 1);
                    if (t < T && n < N) mma_store(&y[(int64_t)t * ldy + n], acc[i][j][e], accum);
                }
        return;
    }
    /* splits > 1: each block's partial tile in its shared memory; block r of the cluster adds
     * the r-th share of the tile's elements over blocks 0, 1, ... in turn and stores them */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* clusters: sm_90 (gemm_mma_supported) */
    __syncthreads(); /* every warp is done with the last stage before it is overwritten */
    float *red = (float *)mma_smem;
#pragma unroll
    for (int i = 0; i < S::MI; i++)
#pragma unroll
        for (int j = 0; j < S::NI; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = wm * S::WM + i * 16 + g + h * 8, c = wn * 32 + j * 8 + t4 * 2;
                *(float2 *)&red[r * S::RED_LD + c] = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    constexpr int Q = BN / 4; /* float4s a row */
    for (int q = split * S::THREADS + tid; q < BM * Q; q += splits * S::THREADS) {
        const int r = q / Q, c = (q % Q) * 4, t = m0 + r;
        if (t >= T) continue;
        float4 u[MMA_MAX_SPLIT]; /* every block's part requested at once, then added in order */
#pragma unroll
        for (int s = 0; s < MMA_MAX_SPLIT; s++)
            if (s < splits)
                u[s] = *(const float4 *)cluster.map_shared_rank(&red[r * S::RED_LD + c], s);
        float4 v = u[0];
#pragma unroll
        for (int s = 1; s < MMA_MAX_SPLIT; s++)
            if (s < splits) v.x += u[s].x, v.y += u[s].y, v.z += u[s].z, v.w += u[s].w;
        const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (n0 + c + e < N) mma_store(&y[(int64_t)t * ldy + n0 + c + e], vv[e], accum);
    }
    cluster.sync(); /* no block leaves while another still reads its shared memory */
#endif
}

/* ------------------------------------------------------------------------------------ host */

/* Whether the current device has thread block clusters (compute capability 9.0 or later) */
static int has_clusters(void) {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return major >= 9;
}

extern "C" int gemm_mma_supported(DType adt, int T, int K, const void *d_x, const void *d_w) {
    return (adt == DTYPE_BF16 || adt == DTYPE_F16) && T >= 1 && K >= MMA_BK && K % MMA_BK == 0 &&
           ((uintptr_t)d_x & 15) == 0 && ((uintptr_t)d_w & 15) == 0 && has_clusters();
}

static int num_sms(void) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
        cudaGetLastError();
        return 132;
    }
    return n;
}

/* CVLLM_CUDA_MMA_SPLIT=N: every product split over N blocks (1..8), for measuring; unset: the
 * blocks the tiles leave (below) */
static int env_split(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("CVLLM_CUDA_MMA_SPLIT");
        v = e && *e ? atoi(e) : 0;
        if (v < 0 || v > MMA_MAX_SPLIT) v = 0;
    }
    return v;
}

template <typename C, typename Y, int BM, int BN>
static cudaError_t launch_mma(Y *y, int64_t ldy, const C *x, const C *w, int T, int N, int K,
                              bool accum, cudaStream_t st) {
    using S = MmaShape<BM, BN>;
    auto kern = gemm_mma_kernel<C, Y, BM, BN>;
    static unsigned attr_set = 0; /* devices 0..31 whose limit is raised for this kernel */
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev >= 32 || !(attr_set >> dev & 1)) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)S::SMEM);
        if (e != cudaSuccess) return e;
        if (dev < 32) attr_set |= 1u << dev;
    }
    const int nt = (N + BN - 1) / BN, mt = (T + BM - 1) / BM, nk = K / MMA_BK;
    /* splits: enough blocks for about one a SM (room is left for the next kernel's blocks,
     * which programmatic launch schedules beside them), at most 8 (a portable cluster) and at
     * least 2 steps of K a block */
    int splits = env_split();
    if (!splits) {
        splits = num_sms() / (nt * mt);
        if (splits > nk / 2) splits = nk / 2;
    }
    if (splits > nk) splits = nk;
    if (splits > MMA_MAX_SPLIT) splits = MMA_MAX_SPLIT;
    if (splits < 1) splits = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(nt, splits, mt);
    cfg.blockDim = dim3(S::THREADS);
    cfg.dynamicSmemBytes = S::SMEM;
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
    return cudaLaunchKernelEx(&cfg, kern, y, ldy, x, w, T, N, K, accum);
}

template <typename C, typename Y>
static cudaError_t mma_dispatch(Y *y, int64_t ldy, const void *x, const void *w, int T, int N,
                                int K, bool accum, cudaStream_t st) {
    const C *xc = (const C *)x, *wc = (const C *)w;
    /* 64 rows of W a block (more blocks) for N <= 2048 (qwen3-0.6b's o and down), else 128;
     * CVLLM_CUDA_MMA_BN=64 or 128 takes one for every product, for measuring */
    static int bn = -1;
    if (bn < 0) {
        const char *e = getenv("CVLLM_CUDA_MMA_BN");
        bn = e && *e ? atoi(e) : 0;
    }
    const bool narrow = bn == 64 || (bn != 128 && N <= 2048);
    if (T <= 32)
        return narrow ? launch_mma<C, Y, 32, 64>(y, ldy, xc, wc, T, N, K, accum, st)
                      : launch_mma<C, Y, 32, 128>(y, ldy, xc, wc, T, N, K, accum, st);
    if (T <= 64)
        return narrow ? launch_mma<C, Y, 64, 64>(y, ldy, xc, wc, T, N, K, accum, st)
                      : launch_mma<C, Y, 64, 128>(y, ldy, xc, wc, T, N, K, accum, st);
    return narrow ? launch_mma<C, Y, 128, 64>(y, ldy, xc, wc, T, N, K, accum, st)
                  : launch_mma<C, Y, 128, 128>(y, ldy, xc, wc, T, N, K, accum, st);
}

extern "C" int gemm_mma_cuda(void *d_y, DType ydt, int accumulate, int64_t ldy, const void *d_x,
                             const void *d_w, DType adt, int T, int N, int K,
                             cudaStream_t stream) {
    if (T <= 0 || N <= 0) return 0;
    if (!gemm_mma_supported(adt, T, K, d_x, d_w) || (ydt != DTYPE_F32 && ydt != adt) ||
        (accumulate && ydt != DTYPE_F32))
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda gemm_mma: dtype %d, T %d, K %d, output %d%s not supported",
                            (int)adt, T, K, (int)ydt, accumulate ? " accumulated" : "");
    const bool acc = accumulate != 0;
    cudaError_t e;
    if (adt == DTYPE_BF16)
        e = ydt == DTYPE_F32
                ? mma_dispatch<__nv_bfloat16>((float *)d_y, ldy, d_x, d_w, T, N, K, acc, stream)
                : mma_dispatch<__nv_bfloat16>((__nv_bfloat16 *)d_y, ldy, d_x, d_w, T, N, K, acc,
                                              stream);
    else
        e = ydt == DTYPE_F32
                ? mma_dispatch<__half>((float *)d_y, ldy, d_x, d_w, T, N, K, acc, stream)
                : mma_dispatch<__half>((__half *)d_y, ldy, d_x, d_w, T, N, K, acc, stream);
    CUDA_TRY(e);
    return 0;
}
