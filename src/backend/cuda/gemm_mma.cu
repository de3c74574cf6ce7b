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
 * min(BM, 64)), mma.sync m16n8k16 from ldmatrix fragments; above 32 tokens, where the build has
 * sm_90a code and the device is 9.0, each warpgroup takes 64 tokens by BN = 128 with wgmma
 * (m64n128k16, both operands read from the swizzled stages through descriptors; measured faster
 * than the mma.sync loop there, still slower than cuBLASLt: docs/BENCHMARKS.md round 14). The
 * grid is (N tiles, splits, T tiles): where the tiles alone would leave SMs idle, K is split over
 * up to 8 blocks of a thread block cluster, which add their partial tiles through distributed
 * shared memory in a fixed order (split 0 first), so a result does not depend on timing: the same
 * bits at every run. */
#include <cooperative_groups.h>
#include <stdlib.h>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/mma.cuh"

namespace cg = cooperative_groups;

#define MMA_BK 64
#define MMA_MAX_SPLIT 8

/* The element offset of (row r, 16-byte chunk c) in a tile of 64-element rows. */
__device__ __forceinline__ int swz(int r, int c) {
    return r * MMA_BK + ((c ^ (r & 7)) << 3);
}

template <int BM, int BN> struct MmaShape {
    static constexpr int WM = BM < 64 ? BM : 64; /* a warp's rows (tokens) */
    static constexpr int WGM = BM / WM, WGN = BN / 32, THREADS = WGM * WGN * 32;
    static constexpr int MI = WM / 16, NI = 4;       /* m16 and n8 tiles a warp */
    static constexpr int STAGE = (BM + BN) * MMA_BK; /* elements a stage */
    /* steps in flight: 3 where a stage is 32 KB (two blocks an SM), else 4 */
    static constexpr int STAGES = BM + BN >= 256 ? 3 : 4;
    static constexpr int RED_LD = BN + 4; /* f32 row of the split reduction's tile */
    static constexpr size_t SMEM = (size_t)STAGES * STAGE * 2 > (size_t)BM *RED_LD * 4
                                       ? (size_t)STAGES *STAGE * 2
                                       : (size_t)BM *RED_LD * 4;
};

/* WG: the product by wgmma (a warpgroup a 64 tokens, BN = 128), else by mma.sync */
template <typename C, typename Y, int BM, int BN, bool WG>
__global__ void __launch_bounds__(MmaShape<BM, BN>::THREADS)
    gemm_mma_kernel(Y *__restrict__ y, int64_t ldy, const C *__restrict__ x,
                    const C *__restrict__ w, int T, int N, int K, bool accum) {
    using S = MmaShape<BM, BN>;
    static_assert(!WG || (BN == 128 && BM % 64 == 0), "a warpgroup: 64 tokens x 128 rows of W");
    extern __shared__ __align__(128) unsigned char mma_smem[];
    /* wgmma's swizzle is by address: the stages from a 1024-byte boundary (SMEM has room) */
    const uint32_t pad = WG ? (1024u - (smem_addr(mma_smem) & 1023u)) & 1023u : 0u;
    C *sm = (C *)(mma_smem + pad);
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
            cp_async16(d + swz(r, c), w + (int64_t)(n < N ? n : 0) * K + k + c * 8,
                       n < N ? 16 : 0); /* 0: zeros */
        }
    };
    auto load_x = [&](int step, int slot) {
        C *d = sm + slot * S::STAGE;
        const int k = (k_lo + step) * MMA_BK;
        for (int i = tid; i < BM * 8; i += S::THREADS) {
            const int r = i >> 3, c = i & 7, t = m0 + r;
            cp_async16(d + swz(r, c), x + (int64_t)(t < T ? t : 0) * K + k + c * 8, t < T ? 16 : 0);
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
    /* wgmma's sums: rows 16 (warp % 4) + g (+ 8) of the warpgroup's 64 tokens, columns 8 j +
     * 2 t4 (+ 1): d[4 j + e]; mma.sync's: acc[m16 tile][n8 tile][e] */
    float d[WG ? 64 : 1] = {};
    float acc[WG ? 1 : S::MI][WG ? 1 : S::NI][4] = {};

    for (int step = 0; step < steps; step++) {
        cp_async_wait<S::STAGES - 2>();
        /* wgmma reads shared memory through the async proxy: cp.async's writes made visible */
        if constexpr (WG) wgmma_proxy_fence();
        __syncthreads(); /* the stage is in; every warp is done with the slot refilled below */
        const int next = step + S::STAGES - 1;
        if (next < steps) {
            load_w(next, next % S::STAGES);
            load_x(next, next % S::STAGES);
        }
        cp_async_commit();
        const C *sa = sm + (step % S::STAGES) * S::STAGE, *sb = sa + BM * MMA_BK;
        if constexpr (WG) {
            const uint32_t xa = smem_addr(sa) + (warp >> 2) * 64 * 128, wb = smem_addr(sb);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < MMA_BK / 16; kk++)
                wgmma_m64n128k16<C>(d, wgmma_desc(xa + kk * 32), wgmma_desc(wb + kk * 32));
            wgmma_commit_wait();
            continue;
        }
        /* fragments of k16 slice kk + 1 are loaded while the mma of slice kk run */
        uint32_t a[2][S::MI][4], b[2][S::NI][2];
        auto frags = [&](int kk, int f) {
#pragma unroll
            for (int i = 0; i < S::MI; i++) {
                const int r = wm * S::WM + i * 16 + (lane & 15);
                ldsm_x4(smem_addr(sa + swz(r, kk * 2 + (lane >> 4))), a[f][i]);
            }
#pragma unroll
            for (int j = 0; j < S::NI; j += 2) {
                const int r = wn * 32 + j * 8 + (lane & 7) + ((lane >> 4) << 3);
                uint32_t q[4];
                ldsm_x4(smem_addr(sb + swz(r, kk * 2 + ((lane >> 3) & 1))), q);
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
                    mma16816<C>(acc[i][j], a[kk & 1][i], b[kk & 1][j][0], b[kk & 1][j][1]);
        }
    }
    cp_async_wait<0>();

    /* f(row, column, sum) for each of the thread's sums (tile coordinates): mma.sync's rows g,
     * g + 8 of each m16 tile, columns 2 t4, 2 t4 + 1 of each n8 tile; wgmma's as d says */
    const int g = lane >> 2, t4 = lane & 3;
    auto each = [&](auto f) {
        if constexpr (WG) {
#pragma unroll
            for (int j = 0; j < 16; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    f(64 * (warp >> 2) + 16 * (warp & 3) + g + 8 * (e >> 1),
                      8 * j + 2 * t4 + (e & 1), d[4 * j + e]);
        } else {
#pragma unroll
            for (int i = 0; i < S::MI; i++)
#pragma unroll
                for (int j = 0; j < S::NI; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        f(wm * S::WM + i * 16 + g + (e >> 1) * 8,
                          wn * 32 + j * 8 + t4 * 2 + (e & 1), acc[i][j][e]);
        }
    };
    if (splits == 1) {
        each([&](int r, int c, float v) {
            const int t = m0 + r, n = n0 + c;
            if (t < T && n < N) store_sum(&y[(int64_t)t * ldy + n], v, accum);
        });
        return;
    }
    /* splits > 1: each block's partial tile in its shared memory; block r of the cluster adds
     * the r-th share of the tile's elements over blocks 0, 1, ... in turn and stores them */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* clusters: sm_90 (gemm_mma_supported) */
    __syncthreads(); /* every warp is done with the last stage before it is overwritten */
    float *red = (float *)mma_smem;
    each([&](int r, int c, float v) { red[r * S::RED_LD + c] = v; });
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    cluster_split_store<MMA_MAX_SPLIT>(red, S::RED_LD, BM, BN, split, splits, tid, S::THREADS, y,
                                       ldy, m0, n0, T, N, accum);
    cluster.sync(); /* no block leaves while another still reads its shared memory */
#endif
}

/* ------------------------------------------------------------------------------------ host */

/* CVLLM_SM90A: the build has sm_90a machine code (CMakeLists.txt); without it no wgmma */
#ifdef CVLLM_SM90A
#define MMA_HOST_WGMMA 1
#else
#define MMA_HOST_WGMMA 0
#endif

/* thread block clusters: compute capability 9.0 or later */
extern "C" int gemm_mma_supported(DType adt, int T, int K, const void *d_x, const void *d_w) {
    return (adt == DTYPE_BF16 || adt == DTYPE_F16) && T >= 1 && K >= MMA_BK && K % MMA_BK == 0 &&
           ((uintptr_t)d_x & 15) == 0 && ((uintptr_t)d_w & 15) == 0 && cuda_device_cc() >= 90;
}

/* CVLLM_CUDA_MMA_SPLIT=N: every product split over N blocks (1..8), for measuring; unset: the
 * blocks the tiles leave (below) */
static int env_split(void) {
    static int v = -1;
    if (v < 0) v = split_k_env("CVLLM_CUDA_MMA_SPLIT", MMA_MAX_SPLIT);
    return v;
}

template <typename C, typename Y, int BM, int BN, bool WG = false>
static cudaError_t launch_mma(Y *y, int64_t ldy, const C *x, const C *w, int T, int N, int K,
                              bool accum, cudaStream_t st) {
    using S = MmaShape<BM, BN>;
    auto kern = gemm_mma_kernel<C, Y, BM, BN, WG>;
    const size_t smem = S::SMEM + (WG ? 1024 : 0);
    static unsigned attr_set = 0; /* devices whose shared-memory limit is raised (split_k_launch) */
    const int nt = (N + BN - 1) / BN, mt = (T + BM - 1) / BM, nk = K / MMA_BK;
    const int splits = split_k_count(nt, mt, nk, env_split(), MMA_MAX_SPLIT);
    return split_k_launch(kern, &attr_set, nt, splits, mt, S::THREADS, smem, st, y, ldy, x, w, T,
                          N, K, accum);
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
    /* CVLLM_CUDA_MMA_WG=0: mma.sync at every size; else wgmma above 32 tokens */
    static int wg = -1;
    if (wg < 0) /* the sm_90a machine code (CMakeLists.txt) runs on 9.0 alone */
        wg = cuda_env_flag("CVLLM_CUDA_MMA_WG", 1) && cuda_device_cc() == 90 && MMA_HOST_WGMMA;
    if (wg && T > 32)
        return T <= 64 ? launch_mma<C, Y, 64, 128, true>(y, ldy, xc, wc, T, N, K, accum, st)
                       : launch_mma<C, Y, 128, 128, true>(y, ldy, xc, wc, T, N, K, accum, st);
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
                             const void *d_w, DType adt, int T, int N, int K, cudaStream_t stream) {
    if (T <= 0 || N <= 0) return 0;
    const int rc = own_gemm_args("gemm_mma", gemm_mma_supported(adt, T, K, d_x, d_w), ydt, adt,
                                 accumulate, ldy, T, N, K);
    if (rc) return rc;
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
