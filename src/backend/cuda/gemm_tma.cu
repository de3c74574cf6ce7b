/* gemm_tma.cu: the matrix products of decode steps (tens to hundreds of tokens) on Hopper's
 * tensor cores, fed by the tensor copy engine: y[T, N] = x[T, K] @ W[N, K]^T, bf16 / f16 in, f32
 * accumulation, y in f32, in the inputs' dtype (the f32 sums rounded once) or added to an f32 y;
 * the semantics of gemm_cuda, gemm_cuda_to and gemm_cuda_acc. CPU twin: matmul_cpu (as
 * gemm_cuda).
 *
 * Why: a cuBLASLt product of a decode step costs ~5-8 us whatever its size (docs/BENCHMARKS.md,
 * rounds 11-14), since it cannot start before the kernel ahead of it ends; gemm_mma.cu starts
 * early (programmatic launch) but its loads (cp.async from every thread, a barrier a step) keep
 * its tensor cores at a fraction of cuBLASLt's rate above 32 tokens. Here the loads are the copy
 * engine's, as in cuBLASLt's own Hopper kernels, with the programmatic launch kept.
 *
 * A block computes y's tile of BT tokens x TG_BW rows of W over a range of K: the product is
 * taken transposed (y^T = W x^T), so that W's rows are wgmma's M (64 a warpgroup, two consumer
 * warpgroups) and the tokens its N (BT: 64, or 128 above 64 tokens). One producer warp asks the
 * copy engine for each K step's tiles (64 elements of K: a 128-byte row of each operand, swizzled
 * by 128 bytes, as wgmma's descriptors read them) into a few stages (TgShape), each with a "full"
 * mbarrier (the copy's bytes) and an
 * "empty" one (the consumer warps' arrivals once their wgmma have read it). Programmatic launch:
 * the block says at once that the kernel after it may be scheduled, and the producer asks for the
 * first stages' weights, which no kernel of a step writes, before it waits for the kernel ahead
 * (griddepcontrol.wait); the activations x only after. Rows of x past T and of W past N arrive as
 * zeros (the copy engine's fill) and are never stored.
 *
 * Where the tiles alone would leave SMs idle, K is split over up to 8 blocks of a thread block
 * cluster, whose partial tiles are added in block order through distributed shared memory
 * (cluster_split_store, as gemm_mma.cu), so a result does not depend on timing: the same bits at
 * every run. Without a split the sums are stored from the registers.
 *
 * gemm_cuda sends it the products with N <= K (qwen3's o and down) of 17-64 tokens
 * (gemm_set_tma_max_t, CVLLM_CUDA_TMA_MAX_T): there it is 1-1.5 us a product ahead of cuBLASLt.
 * Elsewhere it loses (docs/BENCHMARKS.md, round 26): its main loop is ahead of cuBLASLt by 1-3 us
 * a decode product, but the split's sums through shared memory cost more than that as the tile's
 * tokens grow, and qkv / gate_up split little. */
#include <cooperative_groups.h>
#include <stdlib.h>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/tma.cuh"

namespace cg = cooperative_groups;

#define TG_BK 64        /* elements of K a stage: a 128-byte row of each operand */
#define TG_BW 128       /* rows of W a block: two consumer warpgroups of 64 */
#define TG_MAX_SPLIT 8  /* blocks of a cluster that split K (a portable cluster) */
#define TG_THREADS 288  /* two consumer warpgroups and the producer warp */
#define TG_W_BYTES (TG_BW * TG_BK * 2)
#define TG_RED_LD (TG_BW + 4) /* f32 row (a token's) of the partial tile in shared memory */

/* BT tokens a block (wgmma's N: 64 or 128); stages to ~96 KB, so that two blocks fit an SM and
 * the next product's blocks can start beside this one's */
template <int BT> struct TgShape {
    static constexpr int X_BYTES = BT * TG_BK * 2, STAGE = TG_W_BYTES + X_BYTES;
    static constexpr int ST = BT == 64 ? 4 : 3;
    static constexpr int SMEM = ST * STAGE + 1024; /* the stages, from a 1024-byte boundary */
    static_assert(BT * TG_RED_LD * 4 <= ST * STAGE, "the partial tile fits the stages");
};

template <typename C, typename Y, int BT>
__global__ void __launch_bounds__(TG_THREADS, 2)
    gemm_tma_kernel(const __grid_constant__ CUtensorMap wmap,
                    const __grid_constant__ CUtensorMap xmap, Y *__restrict__ y, int64_t ldy, int T,
                    int N, int K, bool accum) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = TgShape<BT>;
    constexpr int TG_ST = S::ST, TG_STAGE = S::STAGE;
    extern __shared__ __align__(1024) unsigned char tg_smem[];
    __shared__ __align__(8) uint64_t full[TG_ST], empty[TG_ST];
    const uint32_t raw = smem_addr(tg_smem), base = (raw + 1023u) & ~1023u;
    float *red = (float *)(tg_smem + (base - raw));
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n0 = blockIdx.x * TG_BW, m0 = blockIdx.z * BT;
    const int split = blockIdx.y, splits = gridDim.y;
    const int nk = K / TG_BK, k_lo = split * nk / splits, steps = (split + 1) * nk / splits - k_lo;

    pdl_trigger();
    if (tid == 0) { /* the maps' first use is not kept waiting for them */
        asm volatile("prefetch.tensormap [%0];" ::"l"((const void *)&wmap) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"((const void *)&xmap) : "memory");
        for (int i = 0; i < TG_ST; i++) {
            mbar_init(smem_addr(&full[i]), 1);
            mbar_init(smem_addr(&empty[i]), 8); /* lane 0 of each consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    float d[BT / 2]; /* a consumer's sums (see below) */
#pragma unroll
    for (int i = 0; i < BT / 2; i++)
        d[i] = 0.0f;
    if (warp == 8) { /* the producer */
        if (lane == 0) {
            const uint64_t wpol = l2_evict_first(), xpol = l2_evict_last();
            const int pre = steps < TG_ST ? steps : TG_ST;
            for (int s = 0; s < pre; s++) { /* weights: nothing in the step writes them */
                const uint32_t st = base + s * TG_STAGE, bar = smem_addr(&full[s]);
                mbar_expect_tx(bar, TG_STAGE);
                tma_load_2d(st, &wmap, (k_lo + s) * TG_BK, n0, bar, wpol);
            }
            pdl_wait();
            for (int s = 0; s < pre; s++)
                tma_load_2d(base + s * TG_STAGE + TG_W_BYTES, &xmap, (k_lo + s) * TG_BK, m0,
                            smem_addr(&full[s]), xpol);
            for (int s = pre; s < steps; s++) {
                const int slot = s % TG_ST;
                const uint32_t st = base + slot * TG_STAGE, bar = smem_addr(&full[slot]);
                mbar_wait(smem_addr(&empty[slot]), ((s / TG_ST) & 1) ^ 1);
                mbar_expect_tx(bar, TG_STAGE);
                tma_load_2d(st, &wmap, (k_lo + s) * TG_BK, n0, bar, wpol);
                tma_load_2d(st + TG_W_BYTES, &xmap, (k_lo + s) * TG_BK, m0, bar, xpol);
            }
        }
        pdl_wait();
    } else { /* the consumers: warpgroup wg takes W's rows 64 wg .. 64 wg + 63 */
        pdl_wait();
        const int wg = warp >> 2;
        for (int s = 0; s < steps; s++) {
            const int slot = s % TG_ST;
            mbar_wait(smem_addr(&full[slot]), (s / TG_ST) & 1);
            const uint32_t wa = base + slot * TG_STAGE + wg * 64 * 128,
                           xb = base + slot * TG_STAGE + TG_W_BYTES;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < TG_BK / 16; kk++) {
                if constexpr (BT == 128)
                    wgmma_m64n128k16<C>(d, wgmma_desc(wa + kk * 32), wgmma_desc(xb + kk * 32));
                else
                    wgmma_m64n64k16<C>(d, wgmma_desc(wa + kk * 32), wgmma_desc(xb + kk * 32));
            }
            wgmma_commit();
            wgmma_wait<0>(); /* the stage is read: the producer may refill it */
            if (lane == 0) mbar_arrive(smem_addr(&empty[slot]));
        }
    }
    /* d[4 j + e]: W's row r0 (+ 8 for e >= 2) of the tile, token 8 j + 2 t4 (+ 1 for odd e) */
    constexpr int NJ = BT / 8;
    const int g = lane >> 2, t4 = lane & 3, r0 = (warp >> 2) * 64 + 16 * (warp & 3) + g;
    if (splits == 1) { /* the sums are the tile's: stored from the registers (32-byte pieces) */
        if (warp == 8) return;
        const int tn = T - m0 < BT ? T - m0 : BT; /* the tile's tokens */
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int tt = 8 * j + 2 * t4 + (e & 1), n = n0 + r0 + 8 * (e >> 1);
                if (tt < tn && n < N)
                    store_sum(y + (int64_t)(m0 + tt) * ldy + n, d[4 * j + e], accum);
            }
        return;
    }
    /* split K: the partial tile as red[token][row] over the stages, once every consumer is done
     * with them, then added over the cluster's blocks (cluster_split_store) */
    if (warp < 8) {
        asm volatile("bar.sync 1, 256;" ::: "memory");
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                red[(8 * j + 2 * t4 + (e & 1)) * TG_RED_LD + r0 + 8 * (e >> 1)] = d[4 * j + e];
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    cluster_split_store<TG_MAX_SPLIT>(red, TG_RED_LD, BT, TG_BW, split, splits, tid, TG_THREADS, y,
                                      ldy, m0, n0, T, N, accum);
    cluster.sync(); /* no block leaves while another reads its shared memory */
#else
    __trap(); /* compiled without sm_90a's instructions: never launched there */
#endif
}

/* ------------------------------------------------------------------------------------ host */

#ifdef CVLLM_SM90A /* the build has sm_90a machine code (CMakeLists.txt) */
#define TG_HOST_SM90A 1
#else
#define TG_HOST_SM90A 0
#endif

extern "C" int gemm_tma_supported(DType adt, int T, int K, const void *d_x, const void *d_w) {
    return TG_HOST_SM90A && (adt == DTYPE_BF16 || adt == DTYPE_F16) && T >= 1 && K >= TG_BK &&
           K % TG_BK == 0 && ((uintptr_t)d_x & 15) == 0 && ((uintptr_t)d_w & 15) == 0 &&
           cuda_device_cc() == 90;
}

template <typename C, typename Y, int BT>
static int launch_tma(Y *y, int64_t ldy, const void *x, const void *w, DType adt, int T, int N,
                      int K, bool accum, cudaStream_t st) {
    auto kern = gemm_tma_kernel<C, Y, BT>;
    constexpr int SMEM = TgShape<BT>::SMEM;
    CUtensorMap wm, xm;
    int rc = tma_map_2d(&wm, w, N, K, adt, TG_BW);
    if (!rc) rc = tma_map_2d(&xm, x, T, K, adt, BT);
    if (rc) return rc;
    const int nt = (N + TG_BW - 1) / TG_BW, mt = (T + BT - 1) / BT, nk = K / TG_BK;
    /* CVLLM_CUDA_TMA_SPLIT=N (1..8) takes N splits for every product, for measuring */
    static int env_split = -1;
    if (env_split < 0) env_split = split_k_env("CVLLM_CUDA_TMA_SPLIT", TG_MAX_SPLIT);
    static unsigned attr_set = 0; /* devices whose shared-memory limit is raised (split_k_launch) */
    const int splits = split_k_count(nt, mt, nk, env_split, TG_MAX_SPLIT);
    CUDA_TRY(split_k_launch(kern, &attr_set, nt, splits, mt, TG_THREADS, SMEM, st, wm, xm, y, ldy,
                            T, N, K, accum));
    return 0;
}

template <int BT>
static int tma_dispatch(void *d_y, DType ydt, int64_t ldy, const void *d_x, const void *d_w,
                        DType adt, int T, int N, int K, bool acc, cudaStream_t st) {
    if (adt == DTYPE_BF16)
        return ydt == DTYPE_F32
                   ? launch_tma<__nv_bfloat16, float, BT>((float *)d_y, ldy, d_x, d_w, adt, T, N,
                                                          K, acc, st)
                   : launch_tma<__nv_bfloat16, __nv_bfloat16, BT>(
                         (__nv_bfloat16 *)d_y, ldy, d_x, d_w, adt, T, N, K, acc, st);
    return ydt == DTYPE_F32
               ? launch_tma<__half, float, BT>((float *)d_y, ldy, d_x, d_w, adt, T, N, K, acc, st)
               : launch_tma<__half, __half, BT>((__half *)d_y, ldy, d_x, d_w, adt, T, N, K, acc,
                                                st);
}

extern "C" int gemm_tma_cuda(void *d_y, DType ydt, int accumulate, int64_t ldy, const void *d_x,
                             const void *d_w, DType adt, int T, int N, int K, cudaStream_t stream) {
    if (T <= 0 || N <= 0) return 0;
    const int rc = own_gemm_args("gemm_tma", gemm_tma_supported(adt, T, K, d_x, d_w), ydt, adt,
                                 accumulate, ldy, T, N, K);
    if (rc) return rc;
    const bool acc = accumulate != 0;
    if (T <= 64) return tma_dispatch<64>(d_y, ydt, ldy, d_x, d_w, adt, T, N, K, acc, stream);
    return tma_dispatch<128>(d_y, ydt, ldy, d_x, d_w, adt, T, N, K, acc, stream);
}
