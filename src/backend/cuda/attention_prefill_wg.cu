/* attention_prefill_wg.cu: the prefill attention on Hopper's warpgroup mma (sm_90a), head_dim 128.
 * The same function as attention.cu's tensor-core prefill (varlen, causal, cached prefix, keys read
 * from the paged cache through the block tables, an fp8 cache dequantized into 16-bit tiles; the
 * CPU twin is attention_cpu) with the same roundings: q and the softmax weights rounded to the
 * 16-bit type C of the products, f32 sums, the lazy running max (DTC_LAZY).
 *
 * A block of two warpgroups takes 128 queries of one head (64 a warpgroup) and walks the keys in
 * tiles of 64. The tiles live in shared memory as wgmma reads them: rows of 64 elements (128
 * bytes) swizzled by 128 bytes (16-byte chunk c of row r at c ^ r % 8), a head's 128 dimensions
 * as two such regions of 64 rows (8 KB each). Q (rows = queries) and K (rows = keys) are
 * K-major operands of S = Q K^T (wgmma m64n64k16, eight k-steps over the dimensions); V is laid
 * out exactly as K and read "transposed" (MN-major) as the B operand of O += P V, whose A, the
 * softmax weights P, stays in registers: an m64n64 accumulator's pairs of n8 columns are an
 * m64k16 A fragment (wgmma m64n128k16, four k-steps over the keys). Every thread of the block
 * copies its share of the next tile (a 16-bit cache by cp.async; fp8 into registers, converted
 * and stored after the current tile's products) while the warpgroups compute on the current one:
 * two stages. Two blocks an SM (128 registers a thread), so that one block's start, with no tile
 * yet to compute on, overlaps the other's products. */
#include <stdlib.h>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/mma.cuh"

#define WG_HD 128 /* head_dim */
#define WG_BQ 128 /* queries a block: two warpgroups of 64 */
#define WG_BK 64  /* keys a tile */
#define WG_ST 2   /* stages of K and V tiles */
#define WG_REGION (64 * 128)           /* 64 rows of 64 dimensions (128 bytes) */
#define WG_TILE (2 * WG_REGION)        /* 64 rows of 128 dimensions: Q's of a warpgroup, K or V */
#define WG_Q_BYTES (2 * WG_TILE)       /* the block's 128 query rows */
#define WG_SMEM (WG_Q_BYTES + WG_ST * 2 * WG_TILE + 1024) /* Q, the stages, alignment */

/* byte offset of row r's 16-byte chunk cc (8 elements, 0..15) in a 64-row tile */
__device__ __forceinline__ uint32_t wg_swz(int r, int cc) {
    return (uint32_t)((cc >> 3) * WG_REGION + r * 128 + (((cc & 7) ^ (r & 7)) << 4));
}

/* a descriptor of an MN-major operand at shared address saddr, 128-byte swizzle: lbo bytes between
 * its 64-column halves, sbo between 8-row groups (a build with the two exchanged fails
 * test_attention_prefill: H200, 2026-11-27) */
__device__ __forceinline__ uint64_t wg_desc_mn(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3ffff) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

/* S[64 x 64] = Q K^T of a warpgroup's 64 queries (at qb) and a tile's 64 keys (at kb): eight
 * k-steps of 16 dimensions; sc[n][e] as prefill_softmax_step reads it (the accumulator's n8
 * columns) */
template <typename C>
__device__ __forceinline__ void wg_scores(float (&sc)[8][4], uint32_t qb, uint32_t kb) {
#pragma unroll
    for (int n = 0; n < 8; n++)
        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < WG_HD / 16; kk++) {
        const uint32_t off = (uint32_t)((kk >> 2) * WG_REGION + (kk & 3) * 32);
        wgmma_m64n64k16<C>(&sc[0][0], wgmma_desc(qb + off), wgmma_desc(kb + off));
    }
    wgmma_commit();
    wgmma_wait<0>();
}

/* MINB: the blocks an SM holds (1: 170 registers; 2: 128, two blocks' 194 KB of shared memory,
 * so that one block's start and end overlap the other's products; over an fp8 cache 40 bytes of
 * spill stores, the 16-bit caches none). Two (the default): 64 x 2,048 prefill +4.9% over fp8,
 * +6.5% over bf16; the fp8 default workload's prefill attention 73.8 against 88.1 ms, +0.3% over
 * the run (H200, 2026-11-27, docs/BENCHMARKS.md round 32). */
template <typename C, typename KV, int MINB>
__global__ void __launch_bounds__(256, MINB) attention_prefill_wg_kernel(AttentionParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    const uint32_t raw = smem_addr(wg_smem), sbase = (raw + 1023u) & ~1023u;
    unsigned char *const sm = wg_smem + (sbase - raw);
    const int s = blockIdx.z, h = blockIdx.y, tid = threadIdx.x;
    const int q0 = p.cu_seqlens_q[s], qlen = p.cu_seqlens_q[s + 1] - q0;
    const int ntiles = (qlen + WG_BQ - 1) / WG_BQ;
    if ((int)blockIdx.x >= ntiles) return;
    const int tile0 = (ntiles - 1 - (int)blockIdx.x) * WG_BQ; /* the longest tile first */
    const int ctx = p.context_lens[s], kvh = h / (p.n_heads / p.n_kv_heads);
    const int rows = min(WG_BQ, qlen - tile0);
    const int64_t kv_stride = (int64_t)p.n_kv_heads * WG_HD;
    const int32_t *table = p.block_tables + (int64_t)s * p.max_blocks_per_seq;
    const KV *kc = (const KV *)p.k_cache, *vc = (const KV *)p.v_cache;
    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int base = ctx - qlen + tile0; /* position of the tile's row 0: it sees keys 0..base */
    const int kmax = base + rows;        /* keys the block needs */
    const int r0 = wg * 64 + warp * 16;  /* the warp's first row */
    const int ntk = (kmax + WG_BK - 1) / WG_BK; /* the block's key tiles */
    /* the warpgroup's: up to its last row's position (none where it has no queries) */
    const int wg_ntk = wg * 64 < rows ? min(ntk, (base + wg * 64 + 63) / WG_BK + 1) : 0;

    const int bsz = p.block_size, bsh = (bsz & (bsz - 1)) == 0 ? __ffs(bsz) - 1 : -1;
    /* a tile's copies: thread tid takes chunks tid, tid + 256, .. of the 64 x 16 chunks of K and
     * of V (16 consecutive threads a key's 128 dimensions). Every address is formed before any
     * load is issued and no load is behind a branch, so that a thread's loads are in flight
     * together: a key past kmax reads key kmax - 1 (zeros stored instead, or copied as zeros). */
    constexpr int PER = WG_BK * 16 / 256;
    auto chunk_offsets = [&](int kt, int64_t (&off)[PER]) {
        int32_t blk[PER];
#pragma unroll
        for (int u = 0; u < PER; u++) {
            const int key = min(kt + ((tid + u * 256) >> 4), kmax - 1);
            const int b = bsh >= 0 ? key >> bsh : key / bsz;
            blk[u] = table[b];
            off[u] = key - b * bsz; /* the key's row within its cache block, for now */
        }
#pragma unroll
        for (int u = 0; u < PER; u++)
            off[u] = ((int64_t)blk[u] * bsz + off[u]) * kv_stride + (int64_t)kvh * WG_HD +
                     ((tid + u * 256) & 15) * 8;
    };
    uint2 kr[IsFp8<KV>::value ? PER : 1], vr[IsFp8<KV>::value ? PER : 1];
    (void)kr, (void)vr;
    auto stage_of = [&](int st) -> uint32_t { return (uint32_t)(WG_Q_BYTES + st * 2 * WG_TILE); };
    auto load_fp8 = [&](int kt) {
        int64_t off[PER];
        chunk_offsets(kt, off);
#pragma unroll
        for (int u = 0; u < PER; u++) {
            kr[u] = *(const uint2 *)(kc + off[u]);
            vr[u] = *(const uint2 *)(vc + off[u]);
        }
    };
    auto store_fp8 = [&](int kt, int st) {
        unsigned char *const ks = sm + stage_of(st), *const vs = ks + WG_TILE;
#pragma unroll
        for (int u = 0; u < PER; u++) {
            const int i = tid + u * 256, j = i >> 4, cc = i & 15;
            const bool in = kt + j < kmax;
            const uint4 z = make_uint4(0, 0, 0, 0);
            *(uint4 *)(ks + wg_swz(j, cc)) = in ? fp8x8_to<C>(kr[u], p.k_scale) : z;
            *(uint4 *)(vs + wg_swz(j, cc)) = in ? fp8x8_to<C>(vr[u], p.v_scale) : z;
        }
    };
    auto issue16 = [&](int kt, int st) {
        const uint32_t ks = sbase + stage_of(st), vs = ks + WG_TILE;
        int64_t off[PER];
        chunk_offsets(kt, off);
#pragma unroll
        for (int u = 0; u < PER; u++) {
            const int i = tid + u * 256, j = i >> 4, cc = i & 15;
            const int sz = kt + j < kmax ? 16 : 0;
            const uint32_t o = wg_swz(j, cc);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ks + o),
                         "l"(kc + off[u]), "r"(sz));
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(vs + o),
                         "l"(vc + off[u]), "r"(sz));
        }
        cp_async_commit();
    };

    /* tile 0's copies first, then Q (f32 rounded to C, or q16 as it is) into the warpgroups'
     * 64-row tiles, every row's loads before its stores (rows past the tile's read row 0, stored
     * as zeros) */
    if constexpr (IsFp8<KV>::value)
        load_fp8(0);
    else
        issue16(0, 0);
    constexpr int QU = WG_BQ * 16 / 256;
    if (p.q16) { /* already rounded (qk_norm_rope_store_cuda's d_q16): 16 bytes a piece */
        uint4 qv[QU];
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int i = tid + u * 256, r = i >> 4, cc = i & 15;
            qv[u] = *(const uint4 *)((const C *)p.q16 +
                                     (int64_t)(q0 + tile0 + (r < rows ? r : 0)) * p.ldq16 +
                                     (int64_t)h * WG_HD + cc * 8);
        }
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int i = tid + u * 256, r = i >> 4, cc = i & 15;
            *(uint4 *)(sm + (r >> 6) * WG_TILE + wg_swz(r & 63, cc)) =
                r < rows ? qv[u] : make_uint4(0, 0, 0, 0);
        }
    } else {
        float4 qa[QU], qb4[QU];
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int i = tid + u * 256, r = i >> 4, cc = i & 15;
            const float *src = p.q + (int64_t)(q0 + tile0 + (r < rows ? r : 0)) * p.ldq +
                               (int64_t)h * WG_HD + cc * 8;
            qa[u] = *(const float4 *)src;
            qb4[u] = *(const float4 *)(src + 4);
        }
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int i = tid + u * 256, r = i >> 4, cc = i & 15;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r < rows)
                v = make_uint4(pack2<C>(qa[u].x, qa[u].y), pack2<C>(qa[u].z, qa[u].w),
                               pack2<C>(qb4[u].x, qb4[u].y), pack2<C>(qb4[u].z, qb4[u].w));
            *(uint4 *)(sm + (r >> 6) * WG_TILE + wg_swz(r & 63, cc)) = v;
        }
    }

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; i++)
        o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* rows g, g + 8 of the warp's */
    const float sl2 = p.scale * 1.4426950408889634f; /* scores in log2 units */
    const uint32_t qb = sbase + (uint32_t)(wg * WG_TILE);
    for (int it = 0; it < ntk; it++) {
        const int kt = it * WG_BK, st = it & 1;
        if constexpr (IsFp8<KV>::value) {
            store_fp8(kt, st); /* tile it, loaded during the last iteration (or before the loop) */
            wgmma_proxy_fence(); /* these stores (and Q's) before wgmma's reads */
            __syncthreads();     /* every thread's stores; every warpgroup done with tile it - 1 */
            if (it + 1 < ntk) load_fp8(kt + WG_BK);
        } else {
            __syncthreads(); /* stage st ^ 1 (tile it - 1) is no longer read */
            if (it + 1 < ntk)
                issue16(kt + WG_BK, st ^ 1);
            else
                cp_async_commit(); /* an empty group: the count stays */
            cp_async_wait<1>();    /* this thread's copies of tile it */
            wgmma_proxy_fence();   /* those and Q's stores before wgmma's reads */
            __syncthreads();       /* everyone's */
        }
        if (it >= wg_ntk) continue; /* warpgroup-uniform */
        const uint32_t kb = sbase + stage_of(st), vb = kb + WG_TILE;
        float sc[8][4];
        wg_scores<C>(sc, qb, kb);
        uint32_t pf[4][4]; /* P's A fragments, a k-step of 16 keys each */
        float c[2];
        prefill_softmax_step<C, 8>(sc, pf, m, l, c, sl2, kt + WG_BK - 1 > base + r0, kt,
                                   base + r0 + g, t4);
        if (__any_sync(0xffffffffu, c[0] != 1.0f || c[1] != 1.0f)) {
#pragma unroll
            for (int d = 0; d < 16; d++) {
                o[4 * d] *= c[0], o[4 * d + 1] *= c[0];
                o[4 * d + 2] *= c[1], o[4 * d + 3] *= c[1];
            }
        }
        wgmma_fence();
#pragma unroll
        for (int k16 = 0; k16 < WG_BK / 16; k16++)
            wgmma_m64n128k16_rt<C>(o, pf[k16], wg_desc_mn(vb + k16 * 2048, WG_REGION, 1024));
        wgmma_commit();
        wgmma_wait<0>();
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = r0 + g + half * 8;
        if (r >= rows) continue;
        const float inv = l[half] > 0.0f ? 1.0f / l[half] : 0.0f;
        const int64_t ob =
            (int64_t)(q0 + tile0 + r) * p.n_heads * WG_HD + (int64_t)h * WG_HD + 2 * t4;
#pragma unroll
        for (int d = 0; d < 16; d++) {
            store_out(p.out, p.adt, ob + d * 8, o[4 * d + half * 2] * inv);
            store_out(p.out, p.adt, ob + d * 8 + 1, o[4 * d + half * 2 + 1] * inv);
        }
    }
#else
    (void)p;
    __trap(); /* an sm_90a kernel: never launched elsewhere (attention_prefill_wg_supported) */
#endif
}

#ifdef CVLLM_SM90A /* the build has sm_90a machine code (CMakeLists.txt) */
#define WG_HOST_SM90A 1
#else
#define WG_HOST_SM90A 0
#endif

int attention_prefill_wg_supported(const AttentionParams *p) {
    const char *e = getenv("CVLLM_CUDA_PREFILL_WG");
    if (e && *e == '0') return 0;
    return WG_HOST_SM90A && cuda_device_cc() == 90 && p->hd == WG_HD &&
           ((uintptr_t)p->k_cache & 15) == 0 && ((uintptr_t)p->v_cache & 15) == 0;
}

/* CVLLM_CUDA_PREFILL_WG_MINB: the kernel's blocks an SM (1 or 2; default WG_MINB_DEFAULT, see
 * the kernel) */
#define WG_MINB_DEFAULT 2
static int wg_minb(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("CVLLM_CUDA_PREFILL_WG_MINB");
        v = e && *e ? atoi(e) : WG_MINB_DEFAULT;
        if (v != 1 && v != 2) v = WG_MINB_DEFAULT;
    }
    return v;
}

template <typename C, typename KV, int MINB>
static int launch_wg_b(const AttentionParams &p, cudaStream_t stream) {
    auto kern = attention_prefill_wg_kernel<C, KV, MINB>;
    static int attr_set = 0; /* per instantiation */
    if (!attr_set) {
        CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM));
        attr_set = 1;
    }
    dim3 grid((p.max_seqlen_q + WG_BQ - 1) / WG_BQ, p.n_heads, p.num_seqs);
    kern<<<grid, 256, WG_SMEM, stream>>>(p);
    CUDA_LAUNCH_TRY();
    return 0;
}
template <typename C, typename KV>
static int launch_wg(const AttentionParams &p, cudaStream_t stream) {
    return wg_minb() == 2 ? launch_wg_b<C, KV, 2>(p, stream) : launch_wg_b<C, KV, 1>(p, stream);
}

int attention_prefill_wg_cuda(const AttentionParams *p, cudaStream_t stream) {
    if (p->kvdt == DTYPE_BF16) return launch_wg<__nv_bfloat16, __nv_bfloat16>(*p, stream);
    if (p->kvdt == DTYPE_F16) return launch_wg<__half, __half>(*p, stream);
    if (p->adt == DTYPE_BF16) return launch_wg<__nv_bfloat16, __nv_fp8_e4m3>(*p, stream);
    return launch_wg<__half, __nv_fp8_e4m3>(*p, stream);
}
