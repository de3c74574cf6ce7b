/* attention.cu: paged attention over the KV cache, read through the block tables.
 * CPU twin: attention_cpu (src/backend/cpu/ops.c, the scalar attention_task): token t of sequence
 * s attends to keys 0 .. pos(t) of s, key j at slot block_tables[s][j / bs] * bs + j % bs,
 * out = softmax(q . K * scale) @ V with query head h on kv head h / (n_heads / n_kv_heads).
 * Here the softmax is computed online (running max and sum, rescaled as keys arrive), which is
 * the same function with a different rounding order.
 *
 * Decode (one query per sequence): a block of 4 warps per (sequence, kv head, chunk of up to 4 of
 * its query heads, partition of the context). A warp's lanes are cut into groups of
 * LANES = head_dim / VEC lanes, each lane holding VEC elements of a K or V row (16-byte loads of
 * bf16 / f16 / f32, 8-byte loads of an fp8 cache: 8 elements a lane as with bf16, so the lane
 * layout and registers are bf16's and the bytes half), so a warp reads 32 / LANES keys at a time;
 * an fp8 element is dequantized in registers (f32(stored) * k_scale or v_scale, the CPU twin's
 * arithmetic exactly); each lane group keeps its own softmax state (scores in log2 units: one
 * exp2 a weight), merged across the warp by shuffles and across warps in shared memory. When
 * sequences x kv heads would leave the GPU idle (small batches, long contexts), the context is
 * split into partitions whose states are written to a workspace and merged by a second kernel.
 *
 * Prefill (varlen, causal, cached prefix): a block of 128 threads per (32-query tile, query head,
 * sequence); key tiles of 32 are staged (as f32) in shared memory with the query tile, each
 * thread owns a row's 8 scores and a quarter of its output, and the row's softmax state is kept
 * by the four threads that share the row. The keys come from the cache (written by
 * store_kvcache_cuda first), so a prefix-cache hit or an earlier chunk is read like any key.
 * An fp8 cache is dequantized as it is read (the tensor-core kernel: into bf16 / f16 tiles).
 * On a 9.0 device with head_dim 128 and 16-bit products, attention_prefill_wg.cu's warpgroup
 * kernel takes the prefill instead (attention_prefill_cuda below). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/qk_norm_rope.cuh"
#include "backend/cuda/tma.cuh"

#define DEC_WARPS 4
#define DEC_QH 4 /* query heads per decode block, at most (a block takes min(group, 4), 3 as 4) */
#define DEC_U 4  /* key groups a warp loads before it computes on them (loads in flight) */
#define DEC_TAB 256 /* block-table entries a decode block stages in shared memory at a time */
#define PRE_BQ 32
#define PRE_BK 32

/* The sequence of decode launch position z: its record's (AttentionParams.dec_rec), else
 * seq_order's, else z itself. */
__device__ __forceinline__ int dec_seq(const AttentionParams &p, int z) {
    return p.dec_rec ? p.dec_rec[(int64_t)z * DEC_REC_INTS] : p.seq_order ? p.seq_order[z] : z;
}

/* Loads N elements of type C at p (aligned to N * sizeof(C) bytes, N * sizeof(C) a multiple of
 * 16 or less than 16) into f[] (fp8: times scale). */
template <typename C, int N>
__device__ __forceinline__ void load_vec(const C *p, float *f, float scale) {
    constexpr int BYTES = N * (int)sizeof(C);
    if constexpr (BYTES % 16 == 0) {
        constexpr int E = 16 / (int)sizeof(C);
#pragma unroll
        for (int c = 0; c < N / E; c++) {
            uint4 u = *(const uint4 *)(p + c * E);
            const C *e = (const C *)&u;
#pragma unroll
            for (int i = 0; i < E; i++)
                f[c * E + i] = cache_to_f32(e[i], scale);
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++)
            f[i] = cache_to_f32(p[i], scale);
    }
}

/* N elements of C held in registers (a vector load's bytes) to f32: cache_to_f32 of each; fp8
 * two at a time (cvt.f16x2.e4m3x2 on sm_89 and later, exact either way). */
template <typename C, int N>
__device__ __forceinline__ void cvt_vec(const void *raw, float *f, float scale) {
    if constexpr (IsFp8<C>::value) {
        const __nv_fp8x2_storage_t *p2 = (const __nv_fp8x2_storage_t *)raw;
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            const float2 v = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(p2[i], __NV_E4M3)));
            f[2 * i] = v.x * scale, f[2 * i + 1] = v.y * scale;
        }
    } else {
        const C *e = (const C *)raw;
#pragma unroll
        for (int i = 0; i < N; i++)
            f[i] = to_f32(e[i]);
    }
}

/* The register type of a B-byte vector load (16: uint4, 8: uint2). */
template <int B> struct VecLoad {
    typedef uint4 T;
};
template <> struct VecLoad<8> {
    typedef uint2 T;
};

/* ================================================================== decode */

template <typename C, int HD> struct DecShape {
    /* elements per load: 16 bytes, at most 8 (fp8: 8-byte loads, see the top) */
    static constexpr int VEC0 = 16 / (int)sizeof(C) < 8 ? 16 / (int)sizeof(C) : 8;
    static constexpr int VEC = HD / VEC0 > 32 ? HD / 32 : (VEC0 > HD ? HD : VEC0);
    static constexpr int LANES = HD / VEC; /* lanes per key: a power of two <= 32 */
    static constexpr int KPW = 32 / LANES; /* keys per warp at a time */
};

/* query heads per decode block for a GQA group: 1, 2 or 4 */
static __host__ __device__ __forceinline__ int dec_qh(int group) {
    return group <= 2 ? group : DEC_QH;
}

/* f(row) with token t's raw qkv row, a fused decode prologue's input: f32 at p.q, or the model's
 * 16-bit type at p.qkv16 (AttentionParams.qkv16) */
template <typename F>
__device__ __forceinline__ void with_raw_row(const AttentionParams &p, int64_t t, F &&f) {
    if (!p.qkv16)
        f(p.q + t * p.ldq);
    else if (p.qkv16dt == DTYPE_BF16)
        f((const __nv_bfloat16 *)p.qkv16 + t * p.ldq);
    else
        f((const __half *)p.qkv16 + t * p.ldq);
}

/* qk_norm_rope_store_kernel's work for one decode block's heads (the raw qkv row of token t):
 * its nh query heads from h0 normed and rotated into sm_q, and, where has_last (the block's
 * partition holds the sequence's last key, the token's own), the token's k head kvh normed,
 * rotated and stored with its v head at slots[t] (none if negative). A warp a head; not inlined,
 * so that the main loop's registers are allocated as without it. */
template <typename C, int HD, int QH, typename S>
__device__ __noinline__ void decode_qk_prologue(const S *row, float pos, int64_t slot,
                                                float (*sm_q)[HD], int nh, const float *q_norm,
                                                const float *k_norm, const float *inv_freq,
                                                float eps, int hd, int q_off, int k_off, int v_off,
                                                C *kc, C *vc, float k_scale, float v_scale) {
    const int warp = threadIdx.x >> 5;
    const int items = nh + (slot >= 0 ? 2 : 0);
    for (int it = warp; it < items; it += DEC_WARPS) {
        if (it < nh)
            norm_rope_head<float, S>(row + q_off + it * hd, sm_q[it], NULL, q_norm, inv_freq, pos,
                                     hd, eps, 1.0f);
        else if (it == nh)
            norm_rope_head<C, S>(row + k_off, NULL, kc, k_norm, inv_freq, pos, hd, eps, k_scale);
        else
            store_head<C, S>(row + v_off, vc, hd, v_scale);
    }
}

/* The end of both decode kernels: the warps' (max, sum, accumulator) states of the block's nh
 * query heads from h0 (sm_m, sm_l [DEC_WARPS][QH], sm_acc [DEC_WARPS][QH][HD], hd elements of each
 * in use) merged, the accumulator times out_scale, and written: token t's output row (nothing
 * if t < 0) when the context is one partition, else partition part's state in ws for the merge
 * kernel. */
template <int QH, int HD>
__device__ __forceinline__ void decode_merge_store(const AttentionParams &p,
                                                   const float (*sm_m)[QH],
                                                   const float (*sm_l)[QH],
                                                   const float (*sm_acc)[QH][HD], int nh, int hd,
                                                   int h0, int t, int s, int part, int num_parts,
                                                   float *ws, float out_scale) {
    for (int i = threadIdx.x; i < nh * hd; i += blockDim.x) {
        const int h = i / hd, d = i % hd;
        float M = -INFINITY;
        for (int w = 0; w < DEC_WARPS; w++)
            M = fmaxf(M, sm_m[w][h]);
        float L = 0.0f, A = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < DEC_WARPS; w++) {
                const float f = exp2f(sm_m[w][h] - M);
                L += sm_l[w][h] * f;
                A += sm_acc[w][h][d] * f;
            }
        A *= out_scale;
        const int head = h0 + h;
        if (num_parts == 1) {
            if (t >= 0)
                store_out(p.out, p.adt, (int64_t)t * p.n_heads * hd + (int64_t)head * hd + d,
                          L > 0.0f ? A / L : 0.0f);
        } else {
            const int64_t r = ((int64_t)s * p.n_heads + head) * num_parts + part;
            float *ml = ws, *wacc = ws + (int64_t)p.num_seqs * p.n_heads * num_parts * 2;
            if (d == 0) ml[2 * r] = M, ml[2 * r + 1] = L;
            wacc[r * hd + d] = A;
        }
    }
}

/* A decode block's chunk of keys from cs on (cs < j1): up to DEC_TAB blocks' worth, to j1 at most.
 * Returns its end (ce); b0: the block of key cs, nb: the chunk's block-table entries (b0 ..). */
__device__ __forceinline__ int dec_chunk(int cs, int j1, int bs, int &b0, int &nb) {
    b0 = cs / bs;
    const int ce = min(j1, (b0 + DEC_TAB) * bs);
    nb = (ce - 1) / bs - b0 + 1;
    return ce;
}

/* The block-table entries of a decode block's chunk from cs on (dec_chunk), into sm_tab, once
 * every thread is done with the last ones. Returns the chunk's end (ce); b0 is the block of key cs
 * (entry i of sm_tab: block b0 + i). */
__device__ __forceinline__ int dec_stage_table(int32_t *sm_tab, const int32_t *table, int cs,
                                               int j1, int bs, int &b0) {
    int nb;
    const int ce = dec_chunk(cs, j1, bs, b0, nb);
    __syncthreads(); /* the previous chunk's entries are no longer read */
    for (int i = threadIdx.x; i < nb; i += blockDim.x)
        sm_tab[i] = table[b0 + i];
    __syncthreads();
    return ce;
}

/* MINB: the blocks per SM the registers are limited for (1: the compiler's choice, 146 registers
 * at QH 2 and head_dim 128, 3 blocks an SM; 4: at most 128 registers) */
template <typename C, int HD, int QH, int MINB, bool FUSE>
__global__ void __launch_bounds__(DEC_WARPS * 32, MINB)
    attention_decode_kernel(AttentionParams p, int num_parts, float *ws) {
    pdl_wait();
    pdl_trigger();
    using S = DecShape<C, HD>;
    constexpr int VEC = S::VEC, LANES = S::LANES, KPW = S::KPW, U = DEC_U;
    const int part = blockIdx.x, s = dec_seq(p, blockIdx.z);
    const int group = p.n_heads / p.n_kv_heads, chunks = (group + QH - 1) / QH;
    const int kvh = blockIdx.y / chunks, chunk = blockIdx.y % chunks;
    const int h0 = kvh * group + chunk * QH;
    const int nh = min(QH, group - chunk * QH);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gi = lane / LANES, li = lane % LANES;
    const int ctx = p.context_lens[s];
    /* this sequence's context in num_parts even partitions (multiples of 32 keys), so that a
     * graph captured for the longest context still spreads a short one over every block */
    const int part_size = max(32, ((ctx + num_parts - 1) / num_parts + 31) / 32 * 32);
    const int j0 = part * part_size, j1 = min(ctx, j0 + part_size);
    const int t = p.cu_seqlens_q[s + 1] - 1; /* the sequence's query token */
    /* hd: the real head_dim, HD the kernel's (the next size up): elements past hd are zeros
     * in q, k and v, so they add nothing; 16-byte loads only when hd == HD */
    const int hd = p.hd;
    const bool full = hd == HD;
    const int64_t kv_stride = (int64_t)p.n_kv_heads * hd;
    const int32_t *table = p.block_tables + (int64_t)s * p.max_blocks_per_seq;
    const C *kc = (const C *)p.k_cache, *vc = (const C *)p.v_cache;
    const float ks = p.k_scale, vs = p.v_scale; /* fp8 only */
    /* scores in log2 units (q . k * scale * log2 e), so that each weight is one exp2f (expf is
     * several instructions more, and the kernel issues an instruction most cycles) */
    const float scale2 = p.scale * 1.44269504088896341f;

    /* FUSE (p.positions set): the raw qkv row; this block's query heads normed and rotated into
     * shared memory, and, in the partition holding the last key, the token's k and v stored. A
     * separate instantiation: the code added to the kernel without it cost the default workload
     * 3.5% (spills in the 128-register GQA-pair kernel; H200, 2026-11-23) */
    __shared__ float sm_q[FUSE ? QH : 1][FUSE ? HD : 1];
    bool fused = false;
    if constexpr (FUSE) {
        fused = t >= 0 && j0 < j1;
        if (fused) {
            const int64_t slot = j0 <= ctx - 1 && ctx - 1 < j1 ? p.slots[t] : -1;
            const int64_t at = slot < 0 ? 0 : slot * kv_stride + (int64_t)kvh * hd;
            with_raw_row(p, t, [&](auto row) {
                decode_qk_prologue<C, HD, QH>(row, (float)p.positions[t], slot, sm_q, nh, p.q_norm,
                                              p.k_norm, p.inv_freq, p.eps, hd, h0 * hd,
                                              (p.n_heads + kvh) * hd,
                                              (p.n_heads + p.n_kv_heads + kvh) * hd,
                                              (C *)p.k_cache + at, (C *)p.v_cache + at, ks, vs);
            });
        }
        __syncthreads(); /* block-uniform; the stores are visible to the block */
    }

    float q[QH][VEC], acc[QH][VEC], m[QH], l[QH];
#pragma unroll
    for (int h = 0; h < QH; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            acc[h][v] = 0.0f;
            const bool in = h < nh && t >= 0 && li * VEC + v < hd;
            if constexpr (FUSE)
                q[h][v] = in && fused ? sm_q[h][li * VEC + v] : 0.0f;
            else
                q[h][v] = in ? p.q[(int64_t)t * p.ldq + (int64_t)(h0 + h) * hd + li * VEC + v]
                             : 0.0f;
        }
    }
    /* online softmax update of the QH heads with one lane group's key (k, v in f32) */
    auto update = [&](const float *k, const float *v, bool valid) {
#pragma unroll
        for (int h = 0; h < QH; h++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < VEC; e++)
                d += q[h][e] * k[e];
#pragma unroll
            for (int o = LANES / 2; o > 0; o >>= 1)
                d += __shfl_xor_sync(0xffffffffu, d, o);
            if (!valid) continue;
            const float sc = d * scale2;
            const float mn = fmaxf(m[h], sc);
            const float corr = exp2f(m[h] - mn); /* m = -inf (first key): 0 */
            const float pe = exp2f(sc - mn);
            l[h] = l[h] * corr + pe;
#pragma unroll
            for (int e = 0; e < VEC; e++)
                acc[h][e] = acc[h][e] * corr + pe * v[e];
            m[h] = mn;
        }
    };
    bool done = false;
    constexpr int VB = VEC * (int)sizeof(C);
    typedef typename VecLoad<VB>::T LT;
    if constexpr (VB == 16 || VB == 8)
        if (full) {
            /* a lane's VEC elements are one 16-byte load (all but f32 at head_dim 256; fp8: one
             * 8-byte load). The partition's block-table entries are staged in shared memory
             * (DEC_TAB at a time), and a warp's loads for its next U key groups are issued before
             * it computes on the current ones, so that neither the table lookup nor the K/V load
             * is a round trip the warp
             * waits for. */
            __shared__ int32_t sm_tab[DEC_TAB];
            const int bs = p.block_size, step = DEC_WARPS * KPW * U;
            /* a shift and a mask for the usual power-of-two block sizes (a division else) */
            const bool pow2 = (bs & (bs - 1)) == 0;
            const int bs_shift = __ffs(bs) - 1;
            for (int cs = j0; cs < j1;) {
                int b0;
                const int ce = dec_stage_table(sm_tab, table, cs, j1, bs, b0);
                LT kr[U], vr[U];
                auto load = [&](int jb_, LT *kr_, LT *vr_) {
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        const int j = jb_ + u * KPW + gi;
                        if (j < ce) {
                            const int b = pow2 ? j >> bs_shift : j / bs;
                            const int r = pow2 ? j & (bs - 1) : j % bs;
                            const int64_t slot = (int64_t)sm_tab[b - b0] * bs + r;
                            const int64_t off = slot * kv_stride + (int64_t)kvh * hd + li * VEC;
                            kr_[u] = *(const LT *)(kc + off);
                            vr_[u] = *(const LT *)(vc + off);
                        } else {
                            kr_[u] = LT{};
                            vr_[u] = LT{};
                        }
                    }
                };
                int jb = cs + warp * KPW * U;
                if (jb < ce) load(jb, kr, vr);
                for (; jb < ce; jb += step) {
                    LT kn[U], vn[U];
                    if (jb + step < ce) load(jb + step, kn, vn);
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        float k[VEC], v[VEC];
                        cvt_vec<C, VEC>(&kr[u], k, ks);
                        cvt_vec<C, VEC>(&vr[u], v, vs);
                        update(k, v, jb + u * KPW + gi < ce);
                    }
#pragma unroll
                    for (int u = 0; u < U; u++)
                        kr[u] = kn[u], vr[u] = vn[u];
                }
                cs = ce;
            }
            done = true;
        }
    if (!done) {
        /* the loop bound is the same for the whole warp (the shuffles need every lane): a lane
         * group past the end computes on zeros and throws the result away. A warp loads U groups of
         * KPW keys (its U * KPW consecutive keys) before computing on them, so that U loads of K
         * and of V per lane are in flight at once. */
        for (int jb = j0 + warp * KPW * U; jb < j1; jb += DEC_WARPS * KPW * U) {
            float k[U][VEC], v[U][VEC];
            bool valid[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = jb + u * KPW + gi;
                valid[u] = j < j1;
                if (valid[u]) {
                    const int64_t slot =
                        (int64_t)table[j / p.block_size] * p.block_size + j % p.block_size;
                    const int64_t off = slot * kv_stride + (int64_t)kvh * hd + li * VEC;
                    if (full) {
                        load_vec<C, VEC>(kc + off, k[u], ks);
                        load_vec<C, VEC>(vc + off, v[u], vs);
                    } else {
#pragma unroll
                        for (int e = 0; e < VEC; e++) {
                            const bool in = li * VEC + e < hd;
                            k[u][e] = in ? cache_to_f32(kc[off + e], ks) : 0.0f;
                            v[u][e] = in ? cache_to_f32(vc[off + e], vs) : 0.0f;
                        }
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        k[u][e] = v[u][e] = 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int h = 0; h < QH; h++) {
                    float d = 0.0f;
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        d += q[h][e] * k[u][e];
#pragma unroll
                    for (int o = LANES / 2; o > 0; o >>= 1)
                        d += __shfl_xor_sync(0xffffffffu, d, o);
                    if (!valid[u]) continue;
                    const float sc = d * scale2;
                    const float mn = fmaxf(m[h], sc);
                    const float corr = exp2f(m[h] - mn); /* m = -inf (first key): 0 */
                    const float pe = exp2f(sc - mn);
                    l[h] = l[h] * corr + pe;
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        acc[h][e] = acc[h][e] * corr + pe * v[u][e];
                    m[h] = mn;
                }
        }
    }
    /* merge the lane groups of the warp (the lanes of a group stay apart: xor offsets >= LANES) */
#pragma unroll
    for (int o = LANES; o < 32; o <<= 1) {
#pragma unroll
        for (int h = 0; h < QH; h++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[h], o);
            const float lo = __shfl_xor_sync(0xffffffffu, l[h], o);
            const float mn = fmaxf(m[h], mo);
            const float a = mn == -INFINITY ? 0.0f : exp2f(m[h] - mn);
            const float b = mn == -INFINITY ? 0.0f : exp2f(mo - mn);
            l[h] = l[h] * a + lo * b;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[h][e], o);
                acc[h][e] = acc[h][e] * a + ao * b;
            }
            m[h] = mn;
        }
    }
    /* merge the warps */
    __shared__ float sm_m[DEC_WARPS][QH], sm_l[DEC_WARPS][QH];
    __shared__ float sm_acc[DEC_WARPS][QH][HD];
    if (gi == 0) {
#pragma unroll
        for (int h = 0; h < QH; h++) {
            if (li == 0) sm_m[warp][h] = m[h], sm_l[warp][h] = l[h];
#pragma unroll
            for (int e = 0; e < VEC; e++)
                sm_acc[warp][h][li * VEC + e] = acc[h][e];
        }
    }
    __syncthreads();
    decode_merge_store<QH, HD>(p, sm_m, sm_l, sm_acc, nh, hd, h0, t, s, part, num_parts, ws, 1.0f);
}

/* Merges the partitions of each (sequence, query head): a block per pair, a thread per element.
 * The partitions' maxima and sums are read once, by the threads in turn, into shared memory (the
 * weights exp2(m_i - M)); then each thread's sum over the partitions has no load that waits for
 * another (a loop that read m_i, then its sum and accumulator, one partition after the other,
 * was a chain of dependent L2 round trips: 32 partitions at batch 1). */
#define MERGE_MAX_PARTS 64
__global__ void attention_decode_merge_kernel(AttentionParams p, int num_parts, const float *ws) {
    pdl_wait();
    pdl_trigger();
    const int h = blockIdx.x, s = blockIdx.y, HD = p.hd;
    const int t = p.cu_seqlens_q[s + 1] - 1;
    if (t < 0) return;
    const int64_t r0 = ((int64_t)s * p.n_heads + h) * num_parts;
    const float *ml = ws, *wacc = ws + (int64_t)p.num_seqs * p.n_heads * num_parts * 2;
    __shared__ float sm_m[MERGE_MAX_PARTS], sm_l[MERGE_MAX_PARTS], sm_f[MERGE_MAX_PARTS];
    __shared__ float sm_red[2];
    for (int i = threadIdx.x; i < num_parts; i += blockDim.x) {
        sm_m[i] = ml[2 * (r0 + i)];
        sm_l[i] = ml[2 * (r0 + i) + 1];
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* one warp: the maximum, the weights, the total */
        float M = -INFINITY;
        for (int i = threadIdx.x; i < num_parts; i += 32)
            M = fmaxf(M, sm_m[i]);
        M = warp_max(M);
        float L = 0.0f;
        for (int i = threadIdx.x; i < num_parts; i += 32) {
            /* the states' maxima are log2-scaled; an empty partition (-inf) weighs 0 */
            const float f = M == -INFINITY || sm_m[i] == -INFINITY ? 0.0f : exp2f(sm_m[i] - M);
            sm_f[i] = f;
            L += sm_l[i] * f;
        }
        L = warp_sum(L);
        if (threadIdx.x == 0) sm_red[0] = L;
    }
    __syncthreads();
    const float L = sm_red[0];
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float A = 0.0f;
#pragma unroll 8
        for (int i = 0; i < num_parts; i++)
            A += sm_f[i] == 0.0f ? 0.0f : wacc[(r0 + i) * HD + d] * sm_f[i];
        store_out(p.out, p.adt, (int64_t)t * p.n_heads * HD + (int64_t)h * HD + d,
                  L > 0.0f ? A / L : 0.0f);
    }
}

extern "C" int attention_cuda_supported(int hd) {
    return hd >= 2 && hd <= 256 && hd % 2 == 0;
}

extern "C" size_t attention_decode_ws_bytes(int num_seqs, int n_heads, int hd, int num_parts) {
    if (num_parts <= 1) return 0;
    return (size_t)num_seqs * n_heads * num_parts * (hd + 2) * sizeof(float);
}

/* The blocks an SM holds of the tensor-core decode kernel (its __launch_bounds__): 3 (166
 * registers at bf16 / head_dim 128, no spills) or, for an fp8 cache at head_dim 128, 4 (128
 * registers, 8 bytes spilled: its default workload 3.5% faster, the bf16 one's 4% slower at 4;
 * H200, 2026-11-23). */
static __host__ __device__ constexpr int dtc_blocks_per_sm(bool fp8, int hd) {
    return fp8 && hd == 128 ? 4 : 3;
}

/* The pipelined decode kernel (below): the bytes of one warp's stage, of a block's dynamic
 * shared memory */
static __host__ __device__ constexpr int dtc_stage_bytes(int kv_bytes, int hd) {
    return 2 * 16 * hd * kv_bytes;
}
static __host__ __device__ constexpr int dtc_smem_bytes(int kv_bytes, int hd, int st) {
    return st * DEC_WARPS * dtc_stage_bytes(kv_bytes, hd);
}
/* The tensor-core decode kernel's shared-memory pipeline, stages a warp: 2 for an fp8 cache, 0
 * (K and V loaded into registers by each step) for bf16 / f16; CVLLM_CUDA_DEC_ST=0, 2 or 3 sets
 * it for every dtype. Measured on an H200 (2026-11-23, default workload, output tok/s): fp8
 * 29,173 / 29,240 in registers, 31,002 / 30,981 with 2 stages, 30,975 / 30,764 with 3; bf16
 * 23,653 / 23,617 in registers, 22,704 / 22,709 with 2, 19,547 / 19,568 with 3. */
static int dec_stages(DType kvdt) {
    static int v = -2;
    if (v == -2) {
        const char *e = getenv("CVLLM_CUDA_DEC_ST");
        v = e && *e ? atoi(e) : -1;
        if (v != -1 && v != 2 && v != 3) v = 0;
    }
    return v >= 0 ? v : kvdt == DTYPE_FP8_E4M3 ? 2 : 0;
}
/* the blocks an SM holds of the pipelined kernel: as many as 220 KiB of shared memory hold (each
 * its stages and about 2 KiB of its own), at most 4 */
static __host__ __device__ constexpr int dtc_pipe_blocks_per_sm(int kv_bytes, int hd, int st) {
    const int n = 220 * 1024 / (dtc_smem_bytes(kv_bytes, hd, st) + 2048);
    return n > 4 ? 4 : n;
}

/* The tensor-core decode kernel (below) takes these shapes unless CVLLM_CUDA_DEC_TC=0. */
static int decode_tc_on(void) {
    static int v = -1;
    if (v < 0) v = cuda_env_flag("CVLLM_CUDA_DEC_TC", 1);
    return v;
}
extern "C" int attention_decode_uses_tc(const AttentionParams *p) {
    const int group = p->n_kv_heads > 0 ? p->n_heads / p->n_kv_heads : 0;
    return decode_tc_on() && (p->hd == 64 || p->hd == 128) && group >= 1 && group <= 8 &&
           (p->kvdt == DTYPE_BF16 || p->kvdt == DTYPE_F16 || p->kvdt == DTYPE_FP8_E4M3);
}
static int decode_tc_launch(const AttentionParams *p, int num_parts, float *ws,
                            cudaStream_t stream);
static int dtma_stages(void);
static __host__ __device__ constexpr int dtma_blocks_per_sm(int hd, int st);

extern "C" int attention_decode_num_parts(const AttentionParams *p, int num_sms) {
    const int group = p->n_heads / p->n_kv_heads, qh = dec_qh(group),
              tc = attention_decode_uses_tc(p);
    /* blocks per (sequence, kv head): the tensor-core kernel takes the whole group */
    const int chunks = tc ? 1 : (group + qh - 1) / qh;
    const int64_t blocks = (int64_t)p->num_seqs * p->n_kv_heads * chunks;
    /* a wave of the blocks an SM holds (the SIMT kernel about 4; the tensor-core one its
     * register budget, 3 or 4: aiming at 3 rather than 4 gave the bf16 default workload +0.5%,
     * H200, 2026-11-23): a grid of one or two waves at mid-size batches leaves SMs idle in its
     * last wave */
    const int kvb = p->kvdt == DTYPE_FP8_E4M3 ? 1 : 2;
    const int st = dec_stages(p->kvdt);
    const int tma16 = attention_decode_uses_tma(p) && kvb == 2; /* fp8: the pipeline's count */
    const int per_sm = !tc    ? 4
                       : tma16 ? dtma_blocks_per_sm(p->hd, dtma_stages())
                       : st    ? dtc_pipe_blocks_per_sm(kvb, p->hd, st)
                               : dtc_blocks_per_sm(p->kvdt == DTYPE_FP8_E4M3, p->hd);
    /* An fp8 cache's tensor-core kernel counts 2 blocks an SM here, not the 4 it holds: a block
     * streams half the bytes a key of a 16-bit cache's, so a partition's fixed costs (the
     * prologue, the first tile's latency, the partition state and the merge) weigh twice as
     * much, and fewer, longer partitions win. H200, 2026-11-26 (CVLLM_CUDA_DEC_SLOTS, output
     * tok/s): the default workload 35,633 / 35,603 at 2 against 35,096 / 35,030 at 4 (35,597 /
     * 35,466 at 1, 35,423 / 35,384 at 3); 64 x 1000/1000 22,685 against 20,792; 32 x 1000/1000
     * 15,003 against 14,126; 256 x 562/523 and batch 1 unchanged. The bf16 kernel at 2: unchanged
     * (32 and 64 x 1000/1000, the default workload). CVLLM_CUDA_DEC_SLOTS=N counts N for every
     * kernel (a fraction allowed: 0.5 counts half a block an SM). */
    static float slots_env = -1.0f;
    if (slots_env < 0.0f) {
        const char *e = getenv("CVLLM_CUDA_DEC_SLOTS");
        const double v = e && *e ? atof(e) : 0.0;
        slots_env = v > 0.0 ? (float)v : 0.0f;
    }
    const float wave = slots_env > 0.0f ? slots_env : tc && kvb == 1 ? 2.0f : (float)per_sm;
    const int64_t slots = (int64_t)(wave * (float)num_sms);
    /* slots / blocks rounded to the nearest: rounded up, a grid just short of a wave doubled its
     * blocks (32 sequences of an fp8 cache: 2 partitions of 500 keys where 1 of 1,000 is 8%
     * faster), and fewer, longer partitions win from 8 sequences up. H200, 2026-11-26, 1000/1000
     * output tok/s by partitions a sequence (wave 0.25 / 0.5 / 1 / 2 as CVLLM_CUDA_DEC_SLOTS):
     * fp8 at 4 sequences 2,861 (2) / 2,939 (3) / 3,002 (5) / 3,121 (9); 8: 5,529 (1) / 6,020 (2) /
     * 6,094 (3) / 6,006 (5); 16: 10,563 (1) / 10,523 (1) / 10,645 (2) / 10,420 (3); 32: 16,901 /
     * 16,899 / 16,812 (1) / 15,578 (2); bf16 at 16 sequences 8,849 (2), 9,064 (3), 8,715 (4). The
     * default workload's fp8 run is equal at each wave (its batches are large). */
    int want = (int)((slots + blocks / 2) / blocks);
    const int by_ctx = (p->max_seqlen_k + 255) / 256; /* >= 256 keys a part */
    if (want > by_ctx) want = by_ctx;
    /* at most 16 (an fp8 cache: 32): a graph is captured for max_model_len, so short contexts
     * leave most partitions empty, and each partition's state is merged (64 cost batch-1 decode
     * 6%, 2026-11-22). H200, 2026-11-26, output tok/s with at most 32 / 16 / 8
     * (CVLLM_CUDA_DEC_PARTS_MAX=N, 1..MERGE_MAX_PARTS, for every cache): batch 1, 16/1024 1,195 / 1,216 /
     * 1,231 (fp8 1,107 / 1,129 / 1,133); 1000/1000 1,097 / 1,157 / 1,147 (fp8 1,037 / 1,066 /
     * 1,046); 8000/500 817 / 839 at 32 / 16 (fp8 830 / 790: its blocks stream half the bytes, and
     * 128 of them one an SM do not fill the memory); 2 x 1000/1000 1,943 / 2,023 / 2,059 (fp8
     * 1,925 / 1,918 / 1,907) */
    static int parts_env = -1;
    if (parts_env < 0) {
        const char *e = getenv("CVLLM_CUDA_DEC_PARTS_MAX");
        const int v = e && *e ? atoi(e) : 0;
        parts_env = v >= 1 && v <= MERGE_MAX_PARTS ? v : 0;
    }
    const int parts_max = parts_env ? parts_env : kvb == 1 ? 32 : 16;
    if (want > parts_max) want = parts_max;
    return want < 1 ? 1 : want;
}

/* The GQA-pair decode kernel is limited to 128 registers (4 blocks an SM) unless
 * CVLLM_CUDA_DEC_OCC=1 (the compiler's 146 registers, 3 blocks). Measured on an H200, 2026-11-22:
 * 64 x 8192 2.74 -> 3.19 TB/s, the 256 x 562/523 workload +11%, bench.py's +3%. */
static int dec_occupancy4(void) {
    static int v = -1;
    if (v < 0) v = !cuda_env_flag("CVLLM_CUDA_DEC_OCC", 0);
    return v;
}

template <typename C, int HD, bool FUSE>
static void launch_decode_f(const AttentionParams &p, int num_parts, float *ws,
                            cudaStream_t stream) {
    const int group = p.n_heads / p.n_kv_heads, qh = dec_qh(group);
    const int chunks = (group + qh - 1) / qh;
    dim3 grid(num_parts, p.n_kv_heads * chunks, p.num_seqs);
    const int threads = DEC_WARPS * 32;
    if (qh == 1)
        pdl_launch(attention_decode_kernel<C, HD, 1, 1, FUSE>, grid, threads, 0, stream, p,
                   num_parts, ws);
    else if (qh == 2 && dec_occupancy4())
        pdl_launch(attention_decode_kernel<C, HD, 2, 4, FUSE>, grid, threads, 0, stream, p,
                   num_parts, ws);
    else if (qh == 2)
        pdl_launch(attention_decode_kernel<C, HD, 2, 1, FUSE>, grid, threads, 0, stream, p,
                   num_parts, ws);
    else
        pdl_launch(attention_decode_kernel<C, HD, 4, 1, FUSE>, grid, threads, 0, stream, p,
                   num_parts, ws);
}
template <typename C, int HD>
static void launch_decode(const AttentionParams &p, int num_parts, float *ws, cudaStream_t stream) {
    if (p.positions)
        launch_decode_f<C, HD, true>(p, num_parts, ws, stream);
    else
        launch_decode_f<C, HD, false>(p, num_parts, ws, stream);
}

/* the kernel size for a head_dim: the next of 16, 32, 64, 128, 256 */
static int padded_hd(int hd) {
    int h = 16;
    while (h < hd)
        h *= 2;
    return h;
}
#define DISPATCH_HD(hd, HDC, ...)                                                                  \
    switch (padded_hd(hd)) {                                                                       \
    case 16: {                                                                                     \
        constexpr int HDC = 16;                                                                    \
        __VA_ARGS__;                                                                               \
        break;                                                                                     \
    }                                                                                              \
    case 32: {                                                                                     \
        constexpr int HDC = 32;                                                                    \
        __VA_ARGS__;                                                                               \
        break;                                                                                     \
    }                                                                                              \
    case 64: {                                                                                     \
        constexpr int HDC = 64;                                                                    \
        __VA_ARGS__;                                                                               \
        break;                                                                                     \
    }                                                                                              \
    case 128: {                                                                                    \
        constexpr int HDC = 128;                                                                   \
        __VA_ARGS__;                                                                               \
        break;                                                                                     \
    }                                                                                              \
    case 256: {                                                                                    \
        constexpr int HDC = 256;                                                                   \
        __VA_ARGS__;                                                                               \
        break;                                                                                     \
    }                                                                                              \
    default:                                                                                       \
        break;                                                                                     \
    }

static int check_params(const AttentionParams *p) {
    if (!attention_cuda_supported(p->hd) || p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads)
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "cuda attention: head_dim %d with %d heads / %d kv heads (supported: "
                            "an even head_dim up to 256, heads a multiple of kv heads)",
                            p->hd, p->n_heads, p->n_kv_heads);
    if (p->positions && !(p->slots && p->inv_freq))
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda attention: the raw qkv rows need slots and inv_freq");
    if (p->qkv16 && !(p->positions && (p->qkv16dt == DTYPE_BF16 || p->qkv16dt == DTYPE_F16)))
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda attention: 16-bit qkv rows (dtype %d) without positions",
                            (int)p->qkv16dt);
    if (p->kvdt == DTYPE_FP8_E4M3 && !(p->k_scale > 0.0f && p->v_scale > 0.0f))
        return cvllm_errorf(CVLLM_EINVAL,
                            "cuda attention: fp8 KV cache scales k %g, v %g (must be > 0; 1.0 "
                            "without calibration)",
                            (double)p->k_scale, (double)p->v_scale);
    return 0;
}

/* How far (log2 units) a tile's largest score may pass a head's running max before the max is
 * moved: below that the old max stays, so the weights of the tile are at most 2^DTC_LAZY (fine in
 * f32 sums and in the 16-bit P: f16 to 65504) and the accumulators need no rescaling. Once a
 * sequence's first keys are in, a later key rarely beats the max by 2^8, so most steps skip the
 * 4 * head_dim / 16 multiplications a thread and their shuffles (FlashAttention-3's lazy
 * rescaling). The result is the same sums divided by the same total, only relative to another
 * max; CVLLM_CUDA_DEC_LAZY=0 moves the max at every step as before (a test compares them). */
/* DTC_LAZY: attention.cuh */
static int g_dec_lazy = -1; /* attention_decode_set_lazy's; -1: the environment's */
extern "C" void attention_decode_set_lazy(int on) {
    g_dec_lazy = on < 0 ? -1 : on != 0;
}
static float dec_lazy(void) {
    static int env = -1;
    if (env < 0) env = cuda_env_flag("CVLLM_CUDA_DEC_LAZY", 1);
    return (g_dec_lazy >= 0 ? g_dec_lazy : env) ? DTC_LAZY : 0.0f;
}

extern "C" int attention_decode_cuda(const AttentionParams *p_in, int num_parts, void *d_ws,
                                     cudaStream_t stream) {
    int rc = check_params(p_in);
    if (rc) return rc;
    AttentionParams pl = *p_in;
    pl.dec_lazy = dec_lazy();
    const AttentionParams *p = &pl;
    if (p->num_seqs <= 0) return 0;
    if (num_parts < 1) num_parts = 1;
    if (num_parts > MERGE_MAX_PARTS)
        return cvllm_errorf(CVLLM_EINVAL, "cuda attention: %d partitions (at most %d)", num_parts,
                            MERGE_MAX_PARTS);
    if (num_parts > 1 && !d_ws)
        return cvllm_errorf(CVLLM_EINVAL, "cuda attention: %d partitions need a workspace",
                            num_parts);
    float *ws = (float *)d_ws;
    if (attention_decode_uses_tc(p)) {
        if ((rc = decode_tc_launch(p, num_parts, ws, stream))) return rc;
    } else
        DISPATCH_KV_DTYPE(
            p->kvdt, C,
            DISPATCH_HD(p->hd, HDC, launch_decode<C, HDC>(*p, num_parts, ws, stream)));
    CUDA_LAUNCH_TRY();
    if (num_parts > 1) {
        dim3 grid(p->n_heads, p->num_seqs);
        const int threads = p->hd < 32 ? 32 : p->hd;
        pdl_launch(attention_decode_merge_kernel, grid, threads, 0, stream, *p, num_parts, ws);
        CUDA_LAUNCH_TRY();
    }
    return 0;
}

/* ================================================================== prefill */

template <int HD> struct PreSmem {
    static constexpr int LD = HD + 1; /* padded rows: the 8 rows a warp reads hit 8 banks */
    static constexpr size_t BYTES =
        ((size_t)(PRE_BQ + 2 * PRE_BK) * LD + (size_t)PRE_BQ * (PRE_BK + 1)) * sizeof(float);
};

template <typename C, int HD>
__global__ void __launch_bounds__(128) attention_prefill_kernel(AttentionParams p) {
    constexpr int LD = PreSmem<HD>::LD, ND = HD / 4;
    extern __shared__ float smem[];
    float *Qs = smem, *Ks = Qs + PRE_BQ * LD, *Vs = Ks + PRE_BK * LD, *Ps = Vs + PRE_BK * LD;
    const int s = blockIdx.z, h = blockIdx.y, tile0 = blockIdx.x * PRE_BQ;
    const int q0 = p.cu_seqlens_q[s], qlen = p.cu_seqlens_q[s + 1] - q0;
    if (tile0 >= qlen) return;
    const int ctx = p.context_lens[s], kvh = h / (p.n_heads / p.n_kv_heads);
    const int rows = min(PRE_BQ, qlen - tile0);
    const int hd = p.hd; /* <= HD: the columns past it stay zero in Qs, Ks, Vs */
    const int64_t kv_stride = (int64_t)p.n_kv_heads * hd;
    const int32_t *table = p.block_tables + (int64_t)s * p.max_blocks_per_seq;
    const C *kc = (const C *)p.k_cache, *vc = (const C *)p.v_cache;
    const int r = threadIdx.x >> 2, c = threadIdx.x & 3;
    const int pos = ctx - qlen + tile0 + r;     /* this row's position: it sees keys 0 .. pos */
    const int kmax = ctx - qlen + tile0 + rows; /* keys the tile needs */

    for (int i = threadIdx.x; i < PRE_BQ * HD; i += blockDim.x) {
        const int rr = i / HD, d = i % HD;
        Qs[rr * LD + d] = rr < rows && d < hd
                              ? p.q[(int64_t)(q0 + tile0 + rr) * p.ldq + (int64_t)h * hd + d]
                              : 0.0f;
    }
    float o[ND], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int k = 0; k < ND; k++)
        o[k] = 0.0f;

    for (int kt = 0; kt < kmax; kt += PRE_BK) {
        __syncthreads(); /* the previous tile's K/V/P are no longer read */
        for (int i = threadIdx.x; i < PRE_BK * HD; i += blockDim.x) {
            const int j = i / HD, d = i % HD, key = kt + j;
            float kv = 0.0f, vv = 0.0f;
            if (key < kmax && d < hd) {
                const int64_t slot =
                    (int64_t)table[key / p.block_size] * p.block_size + key % p.block_size;
                kv = cache_to_f32(kc[slot * kv_stride + (int64_t)kvh * hd + d], p.k_scale);
                vv = cache_to_f32(vc[slot * kv_stride + (int64_t)kvh * hd + d], p.v_scale);
            }
            Ks[j * LD + d] = kv;
            Vs[j * LD + d] = vv;
        }
        __syncthreads();
        float sc[PRE_BK / 4], mt = -INFINITY;
#pragma unroll
        for (int i = 0; i < PRE_BK / 4; i++) {
            const int j = c + 4 * i, key = kt + j;
            float d = 0.0f;
#pragma unroll 8
            for (int e = 0; e < HD; e++)
                d += Qs[r * LD + e] * Ks[j * LD + e];
            sc[i] = (key <= pos && key < kmax && r < rows) ? d * p.scale : -INFINITY;
            mt = fmaxf(mt, sc[i]);
        }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float mn = fmaxf(m, mt);
        const float corr = mn == -INFINITY ? 0.0f : expf(m - mn);
        float ps = 0.0f;
#pragma unroll
        for (int i = 0; i < PRE_BK / 4; i++) {
            const float pe = sc[i] == -INFINITY ? 0.0f : expf(sc[i] - mn);
            Ps[r * (PRE_BK + 1) + c + 4 * i] = pe;
            ps += pe;
        }
        ps += __shfl_xor_sync(0xffffffffu, ps, 1);
        ps += __shfl_xor_sync(0xffffffffu, ps, 2);
        l = l * corr + ps;
        m = mn;
        __syncwarp(); /* a row's P is written and read by the four lanes that share it */
#pragma unroll
        for (int k = 0; k < ND; k++) {
            const int d = c + 4 * k;
            float a = o[k] * corr;
#pragma unroll 8
            for (int j = 0; j < PRE_BK; j++)
                a += Ps[r * (PRE_BK + 1) + j] * Vs[j * LD + d];
            o[k] = a;
        }
    }
    if (r < rows) {
        const int64_t base = (int64_t)(q0 + tile0 + r) * p.n_heads * hd + (int64_t)h * hd;
#pragma unroll
        for (int k = 0; k < ND; k++)
            if (c + 4 * k < hd)
                store_out(p.out, p.adt, base + c + 4 * k, l > 0.0f ? o[k] / l : 0.0f);
    }
}

template <typename C, int HD>
static int launch_prefill(const AttentionParams &p, cudaStream_t stream) {
    const size_t smem = PreSmem<HD>::BYTES;
    static int attr_set = 0; /* per instantiation; the limit is a property of the function */
    if (smem > 48 * 1024 && !attr_set) {
        CUDA_TRY(cudaFuncSetAttribute(attention_prefill_kernel<C, HD>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = 1;
    }
    dim3 grid((p.max_seqlen_q + PRE_BQ - 1) / PRE_BQ, p.n_heads, p.num_seqs);
    attention_prefill_kernel<C, HD><<<grid, 128, smem, stream>>>(p);
    return 0;
}

/* ================================================================== prefill, tensor cores
 *
 * For a bf16 / f16 cache and head_dim 64 or 128 (qwen3, llama, qwen2 sizes): flash-attention 2
 * on mma.sync.m16n8k16 (bf16 / f16 operands, f32 accumulation). A block of 4 warps takes 128
 * queries of one (sequence, query head), each warp two m-tiles of 16 rows (over a 16-bit cache:
 * prefill_mt2), or 64 queries, a warp one m-tile, or with 8 warps the same 64 queries of two
 * query heads of one GQA group, which read the same K/V tiles (over an fp8 cache: prefill_pairs).
 * Q is rounded once to the cache's dtype (as the model's own activations are); with one m-tile
 * its fragments stay in registers, with two they are read from shared memory at each k-step (64
 * fewer registers: the 64 keys of a tile are taken as two sub-tiles of 32, S and its softmax
 * for one before the next, so that both m-tiles' O fit beside them). The running max moves by
 * the decode kernels' lazy rule (DTC_LAZY), so most tiles rescale nothing. Key tiles
 * of 64 are copied (cp.async, two stages: the next tile's copies overlap this tile's products)
 * to shared memory from the cache through the block table; S = Q K^T and the
 * online softmax (exp2, scale folded in) stay in registers, P is rounded to the cache's dtype and
 * multiplied by V (ldmatrix.trans) into f32 accumulators. The heaviest query tile of a sequence
 * (its last) is started first. Rounding q and P to 16 bits makes this kernel agree with the f32
 * CPU twin to about 1e-2 (bf16) / 2e-3 (f16) of the output's range, the same as the product
 * kernels do; CVLLM_CUDA_ATTN_SIMT=1 forces the SIMT kernel above (to measure the difference).
 * An fp8 cache (KV) is read with plain 8-byte loads, dequantized (times k_scale / v_scale) and
 * rounded to the model's 16-bit type C as it is written to the same shared-memory tiles (cp.async
 * cannot convert): tile i + 1's loads into registers are issued before tile i is computed on and
 * converted into their stage at the next iteration's top. */

#define TC_BQ 64
#define TC_BK 64

/* C: the 16-bit type of the products (the cache's, or the model's for an fp8 cache); KV: the
 * cache's element type (C, or __nv_fp8_e4m3); HB: the query heads of a block (1, or 2 of one GQA
 * group: 8 warps, each K/V tile copied once for both heads); MT: the 16-row m-tiles a warp takes
 * (1, or 2 with HB = 1: a block of 128 queries, each K fragment and V fragment read from shared
 * memory once for both m-tiles, two independent chains of products a warp; Q stays in a shared
 * tile of its own, its fragments read by ldmatrix at each k-step instead of held in registers).
 * One head and one m-tile over a 16-bit cache: at most 168 registers, for 3 blocks an SM. */
template <typename C, typename KV, int HD, int HB, int MT>
__global__ void __launch_bounds__(128 * HB, HB == 1 && MT == 1 && !IsFp8<KV>::value ? 3 : 1)
    attention_prefill_tc_kernel(AttentionParams p) {
    constexpr int LD = HD + 8;       /* row stride in elements: 16-byte rows, conflict-free reads */
    constexpr int KD = HD / 16;      /* k-steps of Q K^T */
    constexpr int ND = HD / 8;       /* n-tiles of O */
    constexpr int KS = MT > 1 ? 32 : TC_BK; /* keys of a sub-tile (below) */
    constexpr int NS = KS / 8;              /* n-tiles of a sub-tile's S */
    constexpr int CH = HD / 8;       /* 16-byte chunks per row */
    constexpr int TILE = TC_BK * LD; /* elements of one K or V tile */
    constexpr int NT = 128 * HB;     /* threads */
    constexpr int BQ = TC_BQ * MT;   /* queries of a head a block takes */
    static_assert(HB == 1 || HB == 2, "the Q tiles go through stage 1's two tiles");
    static_assert(MT == 1 || (MT == 2 && HB == 1), "two m-tiles a warp: one head a block");
    extern __shared__ __align__(16) unsigned char tc_smem[];
    C *const sbase = (C *)tc_smem; /* stage st: K at sbase + st * 2 * TILE, V after it */
    /* the warp's query head (h) and its rows of the head's tile (r0); kvh, the block's kv head,
     * from the block's first head: uniform, as the K/V addresses should be */
    const int s = blockIdx.z, warp = threadIdx.x >> 5, hw = HB > 1 ? warp / 4 : 0;
    const int h = blockIdx.y * HB + hw;
    const int q0 = p.cu_seqlens_q[s], qlen = p.cu_seqlens_q[s + 1] - q0;
    const int ntiles = (qlen + BQ - 1) / BQ;
    if ((int)blockIdx.x >= ntiles) return;
    const int tile0 = (ntiles - 1 - (int)blockIdx.x) * BQ; /* the longest tile first */
    const int ctx = p.context_lens[s], kvh = blockIdx.y * HB / (p.n_heads / p.n_kv_heads);
    const int rows = min(BQ, qlen - tile0);
    const int64_t kv_stride = (int64_t)p.n_kv_heads * HD;
    const int32_t *table = p.block_tables + (int64_t)s * p.max_blocks_per_seq;
    const KV *kc = (const KV *)p.k_cache, *vc = (const KV *)p.v_cache;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int base = ctx - qlen + tile0; /* position of the tile's row 0: it sees keys 0..base */
    const int kmax = base + rows;        /* keys the tile needs */
    const int r0 = (HB > 1 ? warp % 4 : warp) * 16 * MT;

    /* the Q tiles of the block's heads (f32 -> C), one after the other, through stage 1's
     * buffers (TC_BQ rows each: one tile's room), then into registers; MT = 2: into the Q tile
     * after the stages, where they stay */
    C *const Qs = sbase + (MT > 1 ? 4 : 2) * TILE;
    for (int i = threadIdx.x; i < HB * BQ * (HD / 4); i += blockDim.x) {
        const int hr = i / (HD / 4), hh = HB > 1 ? hr / TC_BQ : 0, r = hr - hh * TC_BQ;
        const int d = (i % (HD / 4)) * 4;
        uint2 u = make_uint2(0, 0);
        if (p.q16) { /* already rounded (qk_norm_rope_store_cuda's d_q16) */
            if (r < rows)
                u = *(const uint2 *)((const C *)p.q16 + (int64_t)(q0 + tile0 + r) * p.ldq16 +
                                     (int64_t)(blockIdx.y * HB + hh) * HD + d);
        } else {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < rows)
                v = *(const float4 *)(p.q + (int64_t)(q0 + tile0 + r) * p.ldq +
                                      (int64_t)(blockIdx.y * HB + hh) * HD + d);
            u.x = pack2<C>(v.x, v.y);
            u.y = pack2<C>(v.z, v.w);
        }
        *(uint2 *)&Qs[hr * LD + d] = u;
    }
    __syncthreads();
    uint32_t qf[MT > 1 ? 1 : KD][4];
    if constexpr (MT == 1) {
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            const C *a = &Qs[(hw * TC_BQ + r0 + g) * LD + kk * 16 + 2 * t4];
            qf[kk][0] = *(const uint32_t *)a;
            qf[kk][1] = *(const uint32_t *)(a + 8 * LD);
            qf[kk][2] = *(const uint32_t *)(a + 8);
            qf[kk][3] = *(const uint32_t *)(a + 8 * LD + 8);
        }
    }
    /* MT = 2: lane L's row of the ldmatrix x4 that reads m-tile mt's A fragment at k-step kk
     * (matrices: rows 0-7 / 8-15 at columns 0-7, then at 8-15) */
    const uint32_t qa = smem_addr(&Qs[(r0 + (lane & 15)) * LD + (lane >> 4) * 8]);
    (void)qa;
    float o[MT][ND][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int d = 0; d < ND; d++)
            o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.0f;
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
    const float sl2 = p.scale * 1.4426950408889634f; /* scores in log2 units */
    const int warp_last = base + r0 + 16 * MT - 1;    /* the warp's last row position */

    /* key tiles through two shared-memory stages: tile i + 1's copies are in flight while tile i
     * is computed on (keys past kmax zero-filled). A 16-bit cache: cp.async. An fp8 cache: a
     * thread's loads of tile i + 1 into registers (kr, vr: 8 of K and 8 of V at head_dim 128) are
     * issued before tile i is computed on, and converted into their stage at the top of the next
     * iteration, before its barrier (that stage's tile, i - 1, was done with at this one's) */
    /* the cache row (slot) of key: the block size a power of two (every size the engine allows)
     * by a shift and a mask, else by a division (a uniform branch) */
    const int bsz = p.block_size, bsh = (bsz & (bsz - 1)) == 0 ? __ffs(bsz) - 1 : -1;
    auto slot_of = [&](int key) -> int64_t {
        const int blk = bsh >= 0 ? key >> bsh : key / bsz;
        return (int64_t)table[blk] * bsz + (key - blk * bsz);
    };
    constexpr int PER = IsFp8<KV>::value ? TC_BK * CH / NT : 1;
    uint2 kr[PER], vr[PER];
    (void)kr, (void)vr;
    auto load_fp8 = [&](int kt) {
#pragma unroll
        for (int u = 0; u < PER; u++) {
            const int i = threadIdx.x + u * NT, j = i / CH, c8 = (i % CH) * 8, key = kt + j;
            kr[u] = vr[u] = make_uint2(0, 0);
            if (key < kmax) {
                const int64_t off = slot_of(key) * kv_stride + (int64_t)kvh * HD + c8;
                kr[u] = *(const uint2 *)(kc + off);
                vr[u] = *(const uint2 *)(vc + off);
            }
        }
    };
    auto store_fp8 = [&](int st) {
        C *K = sbase + st * 2 * TILE, *V = K + TILE;
#pragma unroll
        for (int u = 0; u < PER; u++) {
            const int i = threadIdx.x + u * NT, j = i / CH, c8 = (i % CH) * 8;
            *(uint4 *)&K[j * LD + c8] = fp8x8_to<C>(kr[u], p.k_scale);
            *(uint4 *)&V[j * LD + c8] = fp8x8_to<C>(vr[u], p.v_scale);
        }
    };
    auto issue = [&](int kt, int st) { /* a 16-bit cache */
        C *K = sbase + st * 2 * TILE, *V = K + TILE;
        for (int i = threadIdx.x; i < TC_BK * CH; i += blockDim.x) {
            const int j = i / CH, c8 = (i % CH) * 8, key = kt + j;
            int64_t off = 0;
            const int sz = key < kmax ? 16 : 0;
            if (sz) off = slot_of(key) * kv_stride + (int64_t)kvh * HD + c8;
            const uint32_t ks = (uint32_t)__cvta_generic_to_shared(&K[j * LD + c8]);
            const uint32_t vs = (uint32_t)__cvta_generic_to_shared(&V[j * LD + c8]);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ks),
                         "l"(kc + off), "r"(sz));
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(vs),
                         "l"(vc + off), "r"(sz));
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    const int ntk = (kmax + TC_BK - 1) / TC_BK;
    if constexpr (IsFp8<KV>::value)
        load_fp8(0);
    else
        issue(0, 0);
    for (int it = 0; it < ntk; it++) {
        const int kt = it * TC_BK, st = it & 1;
        if constexpr (IsFp8<KV>::value) {
            store_fp8(st); /* tile it, loaded during the last iteration (or before the loop) */
            __syncthreads(); /* every thread's stores of it; every warp done with it - 1 */
            if (it + 1 < ntk) load_fp8(kt + TC_BK);
        } else {
            __syncthreads(); /* stage st ^ 1 (the previous tile, or Q) is no longer read */
            if (it + 1 < ntk)
                issue(kt + TC_BK, st ^ 1);
            else
                asm volatile("cp.async.commit_group;\n" ::); /* an empty group: the count stays */
            asm volatile("cp.async.wait_group 1;\n" ::);     /* this thread's copies of tile it */
            __syncthreads();                                 /* everyone's */
        }
        if (kt > warp_last) continue; /* every key past every row of this warp (warp-uniform) */
        const C *Ks = sbase + st * 2 * TILE, *Vs = Ks + TILE;
        /* the tile in sub-tiles of KS keys: S, its softmax and P V of one before the next (KS = 32
         * with two m-tiles a warp, so that their scores fit the registers beside O) */
#pragma unroll
        for (int ks = 0; ks < TC_BK; ks += KS) {
            if (kt + ks > warp_last) break; /* warp-uniform */
            float sc[MT][NS][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < NS; n++)
                    sc[mt][n][0] = sc[mt][n][1] = sc[mt][n][2] = sc[mt][n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KD; kk++) {
                uint32_t af[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if constexpr (MT == 1) {
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            af[mt][e] = qf[kk][e];
                    } else {
                        /* no memory clobber (as mma.cuh's ldsm_x4 has): Q is not written again */
                        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                                     : "=r"(af[mt][0]), "=r"(af[mt][1]), "=r"(af[mt][2]),
                                       "=r"(af[mt][3])
                                     : "r"(qa + (uint32_t)((mt * 16 * LD + kk * 16) * sizeof(C))));
                    }
                }
#pragma unroll
                for (int n = 0; n < NS; n++) {
                    const C *b = &Ks[(ks + n * 8 + g) * LD + kk * 16 + 2 * t4];
                    const uint32_t b0 = *(const uint32_t *)b, b1 = *(const uint32_t *)(b + 8);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
                        mma16816<C>(sc[mt][n], af[mt], b0, b1);
                }
            }
            uint32_t pf[MT][KS / 16][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const int pos0 = base + r0 + mt * 16 + g;
                float c[2];
                prefill_softmax_step<C, NS>(sc[mt], pf[mt], m[mt], l[mt], c, sl2,
                                            kt + ks + KS - 1 > base + r0 + mt * 16, kt + ks, pos0,
                                            t4);
                if (__any_sync(0xffffffffu, c[0] != 1.0f || c[1] != 1.0f)) {
#pragma unroll
                    for (int d = 0; d < ND; d++) {
                        o[mt][d][0] *= c[0], o[mt][d][1] *= c[0];
                        o[mt][d][2] *= c[1], o[mt][d][3] *= c[1];
                    }
                }
            }
#pragma unroll
            for (int kc16 = 0; kc16 < KS / 16; kc16++)
#pragma unroll
                for (int d = 0; d < ND; d += 2) {
                    const int key = ks + kc16 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                    const int col = d * 8 + (lane >> 4) * 8;
                    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(&Vs[key * LD + col]);
                    uint32_t b0, b1, b2, b3;
                    asm volatile(
                        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                        : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                        : "r"(addr));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816<C>(o[mt][d], pf[mt][kc16], b0, b1);
                        mma16816<C>(o[mt][d + 1], pf[mt][kc16], b2, b3);
                    }
                }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            l[mt][i] += __shfl_xor_sync(0xffffffffu, l[mt][i], 1);
            l[mt][i] += __shfl_xor_sync(0xffffffffu, l[mt][i], 2);
        }
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = r0 + mt * 16 + g + half * 8;
            if (r >= rows) continue;
            const float inv = l[mt][half] > 0.0f ? 1.0f / l[mt][half] : 0.0f;
            const int64_t ob =
                (int64_t)(q0 + tile0 + r) * p.n_heads * HD + (int64_t)h * HD + 2 * t4;
#pragma unroll
            for (int d = 0; d < ND; d++) {
                store_out(p.out, p.adt, ob + d * 8, o[mt][d][half * 2] * inv);
                store_out(p.out, p.adt, ob + d * 8 + 1, o[mt][d][half * 2 + 1] * inv);
            }
        }
    }
}

template <typename C, typename KV, int HD, int HB, int MT>
static int launch_prefill_tc_hb(const AttentionParams &p, cudaStream_t stream) {
    /* two stages of K and V (69,632 bytes at head_dim 128); MT = 2: and the Q tile, 104,448 */
    const size_t smem = (size_t)(4 * TC_BK + (MT > 1 ? TC_BQ * MT : 0)) * (HD + 8) * sizeof(C);
    static int attr_set = 0; /* per instantiation */
    if (smem > 48 * 1024 && !attr_set) {
        CUDA_TRY(cudaFuncSetAttribute(attention_prefill_tc_kernel<C, KV, HD, HB, MT>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = 1;
    }
    dim3 grid((p.max_seqlen_q + TC_BQ * MT - 1) / (TC_BQ * MT), p.n_heads / HB, p.num_seqs);
    attention_prefill_tc_kernel<C, KV, HD, HB, MT><<<grid, 128 * HB, smem, stream>>>(p);
    return 0;
}

/* Whether the prefill blocks take two query heads of a GQA group (sharing every K/V tile, so
 * each tile is loaded and converted once): over an fp8 cache, where the group's size is even and
 * the grid of pairs still has a block for every SM. There the kernel holds 2 blocks of 4 warps an
 * SM (244 registers) and a pair block 1 of 8 (224): the same warps, half the tiles' loads and
 * conversions (H200, 2026-11-26: `--kv-cache-dtype fp8 --num-seqs 64 --input-len 2048
 * --output-len 1` 285,875 total tok/s against 260,943). Over a 16-bit cache a block of 4 warps
 * takes 168 registers, 3 blocks an SM, and pairs would leave 1 of 8 warps (the same workload
 * 271,000 against 283,500). CVLLM_CUDA_PREFILL_HB2=0: never; 2: wherever the group allows, any
 * cache (the tests' way to reach the pairs with small grids and 16-bit caches). */
static int prefill_pairs(const AttentionParams &p) {
    const char *e = getenv("CVLLM_CUDA_PREFILL_HB2");
    const int mode = e && *e ? atoi(e) : 1;
    if (mode == 0 || (p.n_heads / p.n_kv_heads) % 2) return 0;
    if (mode >= 2) return 1;
    if (p.kvdt != DTYPE_FP8_E4M3) return 0;
    const int64_t pair_blocks =
        (int64_t)((p.max_seqlen_q + TC_BQ - 1) / TC_BQ) * (p.n_heads / 2) * p.num_seqs;
    return pair_blocks >= cuda_device_sms();
}

/* Whether a warp takes two m-tiles (blocks of 128 queries of one head): over a 16-bit cache (240
 * registers, 2 blocks an SM: H200, 2026-11-26, `--num-seqs 64 --input-len 2048 --output-len 1`
 * 306,700 total tok/s against 301,400 with one m-tile); not over an fp8 cache, whose tile loads
 * held in registers then spill (276,800 against 289,000 with the pairs).
 * CVLLM_CUDA_PREFILL_MT=1: never; 2: any cache (the tests' way to reach it over fp8). */
static int prefill_mt2(const AttentionParams &p) {
    const char *e = getenv("CVLLM_CUDA_PREFILL_MT");
    const int mode = e && *e ? atoi(e) : 0;
    if (mode == 1) return 0;
    return mode == 2 || p.kvdt != DTYPE_FP8_E4M3;
}

template <typename C, typename KV, int HD>
static int launch_prefill_tc(const AttentionParams &p, cudaStream_t stream) {
    if (prefill_mt2(p)) return launch_prefill_tc_hb<C, KV, HD, 1, 2>(p, stream);
    return prefill_pairs(p) ? launch_prefill_tc_hb<C, KV, HD, 2, 1>(p, stream)
                            : launch_prefill_tc_hb<C, KV, HD, 1, 1>(p, stream);
}

template <typename C, typename KV>
static int launch_prefill_tc_hd(const AttentionParams &p, cudaStream_t stream) {
    return p.hd == 64 ? launch_prefill_tc<C, KV, 64>(p, stream)
                      : launch_prefill_tc<C, KV, 128>(p, stream);
}

static int force_simt(void) {
    static int v = -1;
    if (v < 0) v = cuda_env_flag("CVLLM_CUDA_ATTN_SIMT", 0);
    return v;
}

extern "C" DType attention_prefill_tc_dtype(const AttentionParams *p) {
    return p->kvdt == DTYPE_FP8_E4M3 ? p->adt : p->kvdt;
}

extern "C" int attention_prefill_uses_tc(const AttentionParams *p) {
    const int c16 = p->kvdt == DTYPE_BF16 || p->kvdt == DTYPE_F16 ||
                    (p->kvdt == DTYPE_FP8_E4M3 && (p->adt == DTYPE_BF16 || p->adt == DTYPE_F16));
    const int q_ok = p->q16 ? p->ldq16 % 8 == 0 && ((uintptr_t)p->q16 & 15) == 0
                            : p->ldq % 4 == 0 && ((uintptr_t)p->q & 15) == 0;
    return c16 && (p->hd == 64 || p->hd == 128) && q_ok && !force_simt();
}

extern "C" int attention_prefill_cuda(const AttentionParams *p, cudaStream_t stream) {
    int rc = check_params(p);
    if (rc) return rc;
    if (p->num_seqs <= 0 || p->max_seqlen_q <= 0) return 0;
    if (p->q16 && !attention_prefill_uses_tc(p))
        return cvllm_errorf(CVLLM_EINVAL, "cuda attention: a 16-bit q where the tensor-core "
                                          "prefill does not run (attention_prefill_uses_tc)");
    if (attention_prefill_uses_tc(p)) {
        if (attention_prefill_wg_supported(p)) return attention_prefill_wg_cuda(p, stream);
        if (p->kvdt == DTYPE_BF16)
            rc = launch_prefill_tc_hd<__nv_bfloat16, __nv_bfloat16>(*p, stream);
        else if (p->kvdt == DTYPE_F16)
            rc = launch_prefill_tc_hd<__half, __half>(*p, stream);
        else if (p->adt == DTYPE_BF16) /* fp8: the products in the model's dtype */
            rc = launch_prefill_tc_hd<__nv_bfloat16, __nv_fp8_e4m3>(*p, stream);
        else
            rc = launch_prefill_tc_hd<__half, __nv_fp8_e4m3>(*p, stream);
        if (rc) return rc;
        CUDA_LAUNCH_TRY();
        return 0;
    }
    DISPATCH_KV_DTYPE(p->kvdt, C,
                      DISPATCH_HD(p->hd, HDC, rc = launch_prefill<C, HDC>(*p, stream)));
    if (rc) return rc;
    CUDA_LAUNCH_TRY();
    return 0;
}

/* ================================================================== decode, tensor cores
 *
 * For a bf16 / f16 / fp8 cache, head_dim 64 or 128 and GQA groups of up to 8 query heads: the
 * same grid, partitions, launch order, fused prologue and workspace as the SIMT decode kernel
 * above, but a block takes every query head of its kv head and the products run on mma.sync
 * m16n8k16 (bf16 operands for a bf16 cache, f16 for f16 and fp8: e4m3 converts to f16
 * exactly), f32 accumulation. A warp takes 16 keys at a time:
 *   S^T (16 keys x 8 heads) = K Q^T: K is the A operand (16 keys, no padding), Q^T the B
 *     operand (its 8 columns the group's heads, zeros past it), head_dim / 16 k-steps in two
 *     accumulator chains; Q's fragments are built once, q times the softmax scale in log2 units
 *     (times k_scale for fp8), rounded to the operand type;
 *   O^T (head_dim x 8 heads) += V^T (head_dim x 16 keys) P^T: head_dim / 16 m-tiles, one k-step;
 *     P^T's B fragment is S^T's accumulator fragment (rounded to the operand type) transposed
 *     by two movmatrix, and a thread's heads in S^T (2 t4, 2 t4 + 1) are its columns of O^T,
 *     so a rescale needs no exchange either.
 * Neither product cares in which order it sums head_dim, so each thread's K fragment is one
 * contiguous run of a key's row (head_dim / 4 elements: 16-byte loads straight from the cache,
 * or, with the pipeline (an fp8 cache), from the warp's shared-memory stage that cp.async filled
 * while it computed on the one before), and its V fragment a contiguous run of head_dim / 8
 * elements of each of its four keys, paired across keys with byte permutes (prmt). An fp8 value
 * is converted two at a time (cvt.rn.f16x2.e4m3x2); v_scale is applied to the output. The
 * per-key work of the SIMT kernel (a dot product's FMAs and shuffles, an exp2, head_dim / 8 FMAs
 * a lane a head) becomes a few tensor-core instructions a tile, so the kernel's instruction count
 * per byte falls (the SIMT kernel is near its issue limit with an fp8 cache). Like the
 * tensor-core prefill, q and P rounded to 16 bits make it agree with the f32 CPU twin to about
 * 1e-2 (bf16) / 2e-3 (f16, fp8) of the output's range. CVLLM_CUDA_DEC_TC=0: the SIMT kernel. */

#define DTC_MAX_GROUP 8

template <typename KV> struct DecTcOperand {
    typedef KV T;
};
template <> struct DecTcOperand<__nv_fp8_e4m3> {
    typedef __half T;
};

__device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
/* the two e4m3 values in the low (HI = 0) or high (HI = 1) 16 bits of v as f16x2 (exact). sm_89
 * on: one cvt of that half of v (the high one by the operand's half select, no shift) */
template <int HI> __device__ __forceinline__ uint32_t e4m3x2_to_h2(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t d;
    if constexpr (HI)
        asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(d) : "r"(v));
    else
        asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(d) : "r"(v));
    return d;
#else
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)((HI ? v >> 16 : v) & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | (uint32_t)h.y << 16;
#endif
}
__device__ __forceinline__ uint32_t e4m3x2_lo(uint32_t v) { return e4m3x2_to_h2<0>(v); }
__device__ __forceinline__ uint32_t e4m3x2_hi(uint32_t v) { return e4m3x2_to_h2<1>(v); }
/* the 8 x 8 matrix of 16-bit values whose fragment a thread holds (row lane / 4, columns
 * 2 (lane % 4) + 0..1, as ldmatrix gives it), transposed: the same fragment of the transpose */
__device__ __forceinline__ uint32_t movmatrix_t(uint32_t a) {
    uint32_t d;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
    return d;
}

/* n 32-bit words from p (n * 4 bytes, aligned to that or to 16) */
template <int N> __device__ __forceinline__ void load_words(const void *p, uint32_t *w) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N / 4; i++) {
            const uint4 u = ((const uint4 *)p)[i];
            w[4 * i] = u.x, w[4 * i + 1] = u.y, w[4 * i + 2] = u.z, w[4 * i + 3] = u.w;
        }
    } else {
        static_assert(N == 2, "8-byte runs");
        const uint2 u = *(const uint2 *)p;
        w[0] = u.x, w[1] = u.y;
    }
}

/* The shared-memory pipeline of the decode kernel (ST > 0): each warp has ST stages of its own,
 * a stage the K rows then the V rows of its 16 keys (16 x RB bytes each, RB = a row's bytes),
 * filled by cp.async while the warp computes on an earlier stage; ST - 1 stages are in flight.
 * The 16-byte chunks of a row are swizzled (chunk c of row r stored at dtc_swz) so that the
 * fragment reads below (K: a thread's KWORDS-word run of a row; V: its VWORDS-word run of four
 * rows) fall in distinct banks for 8 consecutive lanes. */
template <int CPR> __device__ __forceinline__ int dtc_swz_k(int r, int c) {
    if constexpr (CPR == 16) return c ^ (((c >> 3) & 1) << 1) ^ (r & 1);
    else if constexpr (CPR == 8) return c ^ (r & 1);
    else return c;
}
template <int CPR> __device__ __forceinline__ int dtc_swz_v(int r, int c) {
    if constexpr (CPR == 16) return c ^ ((r >> 1) & 1) ^ (((r >> 2) & 1) << 2);
    else if constexpr (CPR == 8) return c ^ (((r >> 1) & 3) << 1);
    else return c;
}

/* The tensor copy engine (TMA) of the decode kernels below ("decode, tensor cores, TMA" tells
 * how they use it): tile shapes, mbarriers, the copies, ldmatrix and the 128-byte swizzle. */
#define DTMA_ROWB 128 /* bytes of a tile row (64 elements of 16 bits, or 128 fp8 codes): the
                       * swizzle's span */
/* a stage's bytes: K then V, each head_dim / 64 boxes of 16 rows x 128 bytes */
static __host__ __device__ constexpr int dtma_stage_bytes(int hd) {
    return 2 * (hd / 64) * 16 * DTMA_ROWB;
}
/* the copy engine's stages start at a multiple of this many bytes of shared memory (the 128-byte
 * swizzle repeats every 8 rows of 128 bytes): a kernel whose stages it fills asks for this much
 * more dynamic shared memory, and rounds its base up */
#define DTMA_ALIGN 1024
/* a block's dynamic shared memory: its warps' stages and the alignment's slack */
static __host__ __device__ constexpr int dtma_smem_bytes(int hd, int st) {
    return DEC_WARPS * st * dtma_stage_bytes(hd) + DTMA_ALIGN;
}
/* the blocks an SM holds: as many as 220 KiB of shared memory hold (each also about 6 KiB of
 * static shared memory), at most 4 */
static __host__ __device__ constexpr int dtma_blocks_per_sm(int hd, int st) {
    const int n = 220 * 1024 / (dtma_smem_bytes(hd, st) + 6 * 1024);
    return n > 4 ? 4 : n;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* A warp's n stage barriers, one arrival each (lane 0's, as it asks for a tile), made visible to
 * the copy engine before the warp goes on; returns the L2 policy of the copies (evict first: the
 * K/V stream is read once a step, the weights the products read next stay) */
__device__ __forceinline__ uint64_t dtma_warp_init(uint64_t *bars, int n) {
    if ((threadIdx.x & 31) == 0) {
        for (int i = 0; i < n; i++)
            mbar_init(smem_addr(&bars[i]), 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    return l2_evict_first();
}
#endif
/* the byte offset in a K or V tile of key r's 16-byte chunk c (8 dims: 8 c .. 8 c + 7) */
__device__ __forceinline__ uint32_t dtma_at(int r, int c) {
    return (uint32_t)((c >> 3) * 16 * DTMA_ROWB + r * DTMA_ROWB + (((c & 7) ^ (r & 7)) << 4));
}

/* One 16-key step's online softmax, shared by both tensor-core decode kernels. S^T's accumulator
 * fragment sc as the products leave it: keys jb + g (sc[0], sc[1]) and jb + 8 + g (sc[2], sc[3])
 * of heads 2 t4 (sc[0], sc[2]) and 2 t4 + 1 (sc[1], sc[3]), masked here past ce. mrow[e], lrow[e]:
 * head 2 t4 + e's running max (log2 units, the same in the 8 lanes of a t4) and this thread's
 * part of its sum; where a max moves (a warp-wide vote) O^T's accumulators o are rescaled: their
 * columns are this thread's heads too, so the factors are its own. Out: P^T's B fragments pb0
 * (keys jb + 2 t4 + 0..1 of head g) and pb1 (keys + 8), the weights rounded to M: S^T's
 * fragments transposed by movmatrix. lazy: how far a tile's largest score may pass a head's max
 * before it moves (0: whenever it grows). */
template <typename M, int MT>
__device__ __forceinline__ void dtc_softmax_step(float (&sc)[4], int jb, int ce, int g,
                                                 float lazy, float (&mrow)[2], float (&lrow)[2],
                                                 float (&o)[MT][4], uint32_t &pb0,
                                                 uint32_t &pb1) {
    if (jb + g >= ce) sc[0] = sc[1] = -INFINITY;
    if (jb + 8 + g >= ce) sc[2] = sc[3] = -INFINITY;
    float tmax[2] = {fmaxf(sc[0], sc[2]), fmaxf(sc[1], sc[3])};
    /* the max moves when this tile passes it by more than lazy (mrow = -inf: any finite score).
     * The 8 lanes of a t4 share mrow, so whether any head's tile max passes it is a vote on each
     * lane's own scores; only then (rarely, with lazy) are their maxima exchanged */
    const bool rescale =
        __any_sync(0xffffffffu, tmax[0] > mrow[0] + lazy || tmax[1] > mrow[1] + lazy);
    float corr[2] = {1.0f, 1.0f};
    if (rescale) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
#pragma unroll
            for (int off = 4; off < 32; off <<= 1)
                tmax[e] = fmaxf(tmax[e], __shfl_xor_sync(0xffffffffu, tmax[e], off));
            if (tmax[e] > mrow[e] + lazy)
                corr[e] = fast_exp2(mrow[e] - tmax[e]), mrow[e] = tmax[e]; /* 2^-inf = 0 */
        }
    }
    float pr[4];
#pragma unroll
    for (int i = 0; i < 4; i++) /* mrow = -inf: no key of this head yet */
        pr[i] = mrow[i & 1] == -INFINITY ? 0.0f : fast_exp2(sc[i] - mrow[i & 1]);
    lrow[0] = lrow[0] * corr[0] + (pr[0] + pr[2]);
    lrow[1] = lrow[1] * corr[1] + (pr[1] + pr[3]);
    if (rescale) {
#pragma unroll
        for (int i = 0; i < MT; i++)
            o[i][0] *= corr[0], o[i][1] *= corr[1], o[i][2] *= corr[0], o[i][3] *= corr[1];
    }
    pb0 = movmatrix_t(pack2<M>(pr[0], pr[1]));
    pb1 = movmatrix_t(pack2<M>(pr[2], pr[3]));
}

/* What both tensor-core decode kernels know of their block: its partition, sequence and kv head,
 * the group of query heads from h0, its keys j0 .. j1 - 1 of ctx, the token t whose query it reads
 * (< 0: a padding lane) and the sequence's block-table row; fused: with FUSE, whether it runs the
 * prologue (dtc_prologue: sm_q gets the block's normed and rotated query heads, and the block
 * holding the sequence's last key stores it). */
struct DtcBlock {
    int part, s, group, kvh, h0, ctx, j0, j1, t;
    bool fused;
    const int32_t *table;
    const int32_t *rec; /* the launch position's record (AttentionParams.dec_rec), or NULL */
    int pos; /* with rec: the token's position (positions[t]); its slot: rec + DEC_REC_SLOT */
};
template <bool FUSE>
__device__ __forceinline__ DtcBlock dtc_setup(const AttentionParams &p, int num_parts) {
    DtcBlock b;
    b.part = blockIdx.x;
    b.group = p.n_heads / p.n_kv_heads, b.kvh = blockIdx.y, b.h0 = b.kvh * b.group;
    b.rec = p.dec_rec ? p.dec_rec + (int64_t)blockIdx.z * DEC_REC_INTS : NULL;
    if (b.rec) { /* one 16-byte load: s, context, t, position */
        const int4 r = *reinterpret_cast<const int4 *>(b.rec);
        b.s = r.x, b.ctx = r.y, b.t = r.z, b.pos = r.w;
    } else {
        b.s = dec_seq(p, blockIdx.z), b.ctx = p.context_lens[b.s];
        b.t = p.cu_seqlens_q[b.s + 1] - 1, b.pos = 0;
    }
    /* partitions of whole 64-key rounds of the block's 4 warps (at batch 1 a graph's 32
     * partitions of a 1,000-key context were 32 keys each: half of every block's warps idle) */
    const int part_size = max(64, ((b.ctx + num_parts - 1) / num_parts + 63) / 64 * 64);
    b.j0 = b.part * part_size, b.j1 = min(b.ctx, b.j0 + part_size);
    b.table = p.block_tables + (int64_t)b.s * p.max_blocks_per_seq;
    b.fused = FUSE && b.t >= 0 && b.j0 < b.j1;
    return b;
}
/* The fused prologue's inputs that no kernel of the step writes, read before pdl_wait
 * (dtc_pre_wait): the token's position and slot (where the block's partition holds the sequence's
 * last key, else -1), and thread x's inv_freq entry and norm weights; dtc_pre_store turns them into
 * the block's DtcRope tables, so that after the wait only the qkv rows remain to be read. row: the
 * key and value the prologue stores, kept for the copy-engine kernels, which put them into the
 * stage of the tile holding that key once it has landed (dtc_patch_last). */
struct DtcPre {
    float pos, invf, qw, kw;
    int64_t slot;
};
template <typename KV, int HD> struct DtcRope {
    float2 cs[HD / 2];
    float w[2][HD];
    __align__(16) KV row[2][HD];
};
template <int HD, bool FUSE>
__device__ __forceinline__ DtcPre dtc_pre_load(const AttentionParams &p, const DtcBlock &b) {
    DtcPre d = {0.0f, 0.0f, 0.0f, 0.0f, -1};
    if constexpr (FUSE) {
        if (b.fused) {
            const int x = threadIdx.x;
            d.pos = (float)(b.rec ? b.pos : p.positions[b.t]);
            if (b.j0 <= b.ctx - 1 && b.ctx - 1 < b.j1)
                d.slot =
                    b.rec ? *reinterpret_cast<const int64_t *>(b.rec + DEC_REC_SLOT) : p.slots[b.t];
            if (x < HD) {
                d.invf = p.inv_freq[x % (HD / 2)];
                if (p.q_norm) d.qw = p.q_norm[x];
                if (p.k_norm) d.kw = p.k_norm[x];
            }
        }
    }
    return d;
}
/* thread x < HD / 2: cs[x]'s cosine, x < HD: cs[x - HD / 2]'s sine (the angle as norm_rope_head
 * forms it), and the weights */
template <typename KV, int HD, bool FUSE>
__device__ __forceinline__ void dtc_pre_store(const DtcPre &d, const DtcBlock &b,
                                              DtcRope<KV, HD> &r) {
    if constexpr (FUSE) {
        const int x = threadIdx.x;
        if (b.fused && x < HD) {
            rope_table_entry<HD>(r.cs, x, d.pos, d.invf);
            r.w[0][x] = d.qw, r.w[1][x] = d.kw;
        }
    }
}
/* decode_qk_prologue's work from the tables: the nh query heads into sm_q and, where slot >= 0,
 * the key and value stored at slot (at kc / vc) and kept in r.row. A warp a head; not inlined. */
template <typename KV, int HD, typename S>
__device__ __noinline__ void dtc_qk_prologue(const S *row, int64_t slot, float (*sm_q)[HD], int nh,
                                             bool qn, bool kn, DtcRope<KV, HD> *r, float eps,
                                             int q_off, int k_off, int v_off, KV *kc, KV *vc,
                                             float k_scale, float v_scale) {
    const int warp = threadIdx.x >> 5;
    const int items = nh + (slot >= 0 ? 2 : 0);
    for (int it = warp; it < items; it += DEC_WARPS) {
        if (it < nh)
            norm_rope_head_cs<float, HD, S>(row + q_off + it * HD, sm_q[it], NULL, NULL,
                                            qn ? r->w[0] : NULL, r->cs, eps, 1.0f);
        else if (it == nh)
            norm_rope_head_cs<KV, HD, S>(row + k_off, NULL, kc, r->row[0], kn ? r->w[1] : NULL,
                                         r->cs, eps, k_scale);
        else
            for (int i = threadIdx.x & 31; i < HD; i += 32)
                vc[i] = r->row[1][i] = cache_from_f32<KV>(to_f32(row[v_off + i]), v_scale);
    }
}
/* With FUSE, where b.fused: the block's query heads into sm_q and, where its partition holds the
 * sequence's last key (slot >= 0, from dtc_pre_load), that key and value stored; every thread
 * waits. The tables of dtc_pre_store are read after a barrier. A kernel that reads the cache by
 * its threads' loads (cp.async included) reads the stored row after the final barrier; one whose
 * copy engine reads it (an async proxy that this store is not ordered with) patches the row into
 * its stage instead (dtc_patch_last), so no proxy fence waits for the store here. */
template <typename KV, int HD, bool FUSE>
__device__ __forceinline__ void dtc_prologue(const AttentionParams &p, const DtcBlock &b,
                                             float (*sm_q)[HD], DtcRope<KV, HD> &r,
                                             int64_t slot) {
    if constexpr (FUSE) {
        __syncthreads(); /* dtc_pre_store's tables */
        if (b.fused) {
            const int64_t at =
                slot < 0 ? 0 : slot * ((int64_t)p.n_kv_heads * HD) + (int64_t)b.kvh * HD;
            with_raw_row(p, b.t, [&](auto row) {
                dtc_qk_prologue<KV, HD>(
                    row, slot, sm_q, b.group, p.q_norm != NULL, p.k_norm != NULL, &r, p.eps,
                    b.h0 * HD, (p.n_heads + b.kvh) * HD, (p.n_heads + p.n_kv_heads + b.kvh) * HD,
                    (KV *)p.k_cache + at, (KV *)p.v_cache + at, p.k_scale, p.v_scale);
            });
        }
        __syncthreads();
    }
}
/* Whether a block may ask the copy engine for its first ST - 1 rounds of tiles before
 * dtc_prologue, which then overlaps their fetch: whenever it has keys (a tile holding the key the
 * prologue stores gets it from DtcRope.row once it lands: dtc_patch_last).
 *
 * dtc_pre_wait: the copy-engine kernels with FUSE do their setup (dtc_setup, dtc_pre_load, the
 * table entries, the barriers, dtc_pre_store) and ask for those first tiles before pdl_wait, so
 * that where the kernel is scheduled before the one ahead of it has ended (a decode graph's edge
 * from the qkv product at its launch completion, graph_edges.c) they overlap that kernel's end.
 * What they read there no kernel of the step writes: the inputs (context lengths, the launch
 * order, the query rows' bounds, the block tables, positions and slots: copied before the step's
 * first kernel), the weights, and cache rows of earlier steps; the one row a step writes into a
 * sequence's context is its last key, stored by this kernel's own prologue after the wait (with
 * FUSE; without it, by the kernel ahead, so a kernel without FUSE reads nothing before the wait). */
__device__ __forceinline__ bool dtc_early(const DtcBlock &b) { return b.j0 < b.j1; }
/* The key the prologue stored (DtcRope.row) written into row r of a copy-engine stage that holds
 * K and, hb bytes on, V, each in dtma_at's layout (the fp8 kernel's one 128-byte box is the
 * same), by lanes 0 .. 2 CH - 1 (CH: a row's 16-byte chunks). The warp fences and syncs after. */
template <typename KV, int HD>
__device__ __forceinline__ void dtc_patch_last(char *stage, int hb, int r,
                                               const DtcRope<KV, HD> &rope) {
    constexpr int CH = HD * (int)sizeof(KV) / 16;
    const int lane = threadIdx.x & 31;
    if (lane < 2 * CH) {
        const int kv = lane / CH, c = lane % CH;
        *(uint4 *)(stage + kv * hb + dtma_at(r, c)) = ((const uint4 *)rope.row[kv])[c];
    }
}
/* Q^T's B fragments (column g: head h0 + g, zeros past the group), q times qscale rounded to
 * M: k-step ks takes dims dim(ks, e), e = 0, 1 in qa0 and e = 2, 3 in qa2 (the order in which
 * the kernel's K fragments hold the dims). q: sm_q's rows with FUSE, else token t's heads. */
template <typename M, int HD, bool FUSE, typename Dim>
__device__ __forceinline__ void dtc_q_frags(const AttentionParams &p, const DtcBlock &b,
                                            const float *sm_q, float qscale,
                                            uint32_t (&qa0)[HD / 16], uint32_t (&qa2)[HD / 16],
                                            Dim dim) {
    const int g = (threadIdx.x & 31) >> 2;
    const bool in = g < b.group && b.t >= 0 && (!FUSE || b.fused);
    const float *qrow = FUSE ? sm_q + (in ? g : 0) * HD
                             : p.q + (int64_t)(in ? b.t : 0) * p.ldq +
                                   (int64_t)(b.h0 + (in ? g : 0)) * HD;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            v[e] = in ? qrow[dim(ks, e)] * qscale : 0.0f;
        qa0[ks] = pack2<M>(v[0], v[1]);
        qa2[ks] = pack2<M>(v[2], v[3]);
    }
}
/* The end of both tensor-core decode kernels: each warp's states (head 2 t4 + e's running max
 * mrow[e] and this thread's part of its sum lrow[e], as dtc_softmax_step keeps them; O^T's
 * accumulators: element e of m-tile i is head 2 t4 + (e & 1), dim dim(i, e)) into sm_m, sm_l and
 * sm_acc ([DEC_WARPS][DTC_MAX_GROUP][HD]; free for it), then merged and written by
 * decode_merge_store, the output times out_scale. */
template <int HD, typename Dim>
__device__ __forceinline__ void dtc_finish(const AttentionParams &p, const DtcBlock &b,
                                           const float (&o)[HD / 16][4], const float (&mrow)[2],
                                           float (&lrow)[2], float (*sm_acc)[DTC_MAX_GROUP][HD],
                                           int num_parts, float *ws, float out_scale, Dim dim) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    __shared__ float sm_m[DEC_WARPS][DTC_MAX_GROUP], sm_l[DEC_WARPS][DTC_MAX_GROUP];
#pragma unroll
    for (int e = 0; e < 2; e++) {
#pragma unroll
        for (int off = 4; off < 32; off <<= 1)
            lrow[e] += __shfl_xor_sync(0xffffffffu, lrow[e], off);
        if (g == 0 && 2 * t4 + e < b.group) sm_m[warp][2 * t4 + e] = mrow[e], sm_l[warp][2 * t4 + e] = lrow[e];
    }
#pragma unroll
    for (int i = 0; i < HD / 16; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int h = 2 * t4 + (e & 1);
            if (h < b.group) sm_acc[warp][h][dim(i, e)] = o[i][e];
        }
    __syncthreads();
    decode_merge_store<DTC_MAX_GROUP, HD>(p, sm_m, sm_l, sm_acc, b.group, HD, b.h0, b.t, b.s,
                                          b.part, num_parts, ws, out_scale);
}

/* MINB: the blocks per SM the registers are limited for (dtc_blocks_per_sm). ST: 0, K and V
 * loaded into registers by each step; else the stages of the shared-memory pipeline above,
 * filled by cp.async, or with TM (an fp8 cache at head_dim 128: a row is 128 bytes, the copy
 * engine's swizzle span; sm_90) by the tensor copy engine as in attention_decode_tma_kernel
 * below: one 2-D copy a matrix a stage (kmap, vmap), the 128-byte swizzle in place of dtc_swz_k /
 * dtc_swz_v (the same fragment reads stay conflict-free: 8 lanes read 8 distinct chunks). */
template <typename KV, int HD, bool FUSE, int MINB, int ST, bool TM>
__global__ void __launch_bounds__(DEC_WARPS * 32, MINB)
    attention_decode_tc_kernel(AttentionParams p, int num_parts, float *ws,
                               const __grid_constant__ CUtensorMap kmap,
                               const __grid_constant__ CUtensorMap vmap) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
    if constexpr (TM) return; /* never launched below sm_90 */
#endif
    static_assert(!TM || (ST > 0 && HD * sizeof(KV) == DTMA_ROWB), "TMA: 128-byte rows");
    /* TM with FUSE: its setup and first tiles before pdl_wait (dtc_pre_wait) */
    constexpr bool PRE = TM && FUSE;
    if constexpr (!PRE) pdl_wait(), pdl_trigger();
    typedef typename DecTcOperand<KV>::T M;
    constexpr bool F8 = IsFp8<KV>::value;
    constexpr int KSTEPS = HD / 16;               /* k-steps of S; also the m-tiles of O^T */
    constexpr int KDIMS = HD / 4, VDIMS = HD / 8; /* a thread's run of a K row, of a V row */
    constexpr int KWORDS = KDIMS * (int)sizeof(KV) / 4, VWORDS = VDIMS * (int)sizeof(KV) / 4;
    __shared__ float sm_q[FUSE ? DTC_MAX_GROUP : 1][FUSE ? HD : 1];
    __shared__ __align__(16) char sm_rope_b[FUSE ? sizeof(DtcRope<KV, HD>) : 16];
    DtcRope<KV, HD> &sm_rope = *reinterpret_cast<DtcRope<KV, HD> *>(sm_rope_b);
    const DtcBlock B = dtc_setup<FUSE>(p, num_parts);
    const DtcPre pre = dtc_pre_load<HD, FUSE>(p, B);
    const int kvh = B.kvh, j0 = B.j0, j1 = B.j1;
    const int32_t *table = B.table;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const int64_t kv_stride = (int64_t)p.n_kv_heads * HD;
    const KV *kc = (const KV *)p.k_cache, *vc = (const KV *)p.v_cache;
    __shared__ int32_t sm_tab[DEC_TAB];
    const int bs = p.block_size;
    const bool pow2 = (bs & (bs - 1)) == 0;
    const int bs_shift = __ffs(bs) - 1;
    /* TM: a barrier a stage; the warp's steps in earlier chunks (the stages' phases go on) */
    __shared__ __align__(8) uint64_t sm_bar[TM ? DEC_WARPS : 1][TM ? ST : 1];
    int base = 0;
    uint64_t policy = 0;
    (void)sm_bar, (void)policy; /* (below sm_90: unused) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (TM) policy = dtma_warp_init(sm_bar[warp], ST);
#endif
    /* a row's bytes and 16-byte chunks; chunk c of row r in a stage: the 128-byte swizzle of the
     * copy engine, or dtc_swz_* */
    constexpr int RB = HD * (int)sizeof(KV), CPR = RB / 16;
    auto swz_k = [](int r, int c) { return TM ? c ^ (r & 7) : dtc_swz_k<CPR>(r, c); };
    auto swz_v = [](int r, int c) { return TM ? c ^ (r & 7) : dtc_swz_v<CPR>(r, c); };
    /* the pipeline's fragment reads in a stage: row g's chunks of K (keys jb + g; jb + 8 + g
     * at 8 rows more) and rows 2 t4 + e's chunk of V (keys jb + 2 t4 + e; + 8 likewise) */
    constexpr int KCH = KWORDS >= 4 ? KWORDS / 4 : 1, VCH = VWORDS >= 4 ? VWORDS / 4 : 1;
    int koff[KCH], voff[2][VCH];
    if constexpr (ST > 0) {
#pragma unroll
        for (int k = 0; k < KCH; k++)
            koff[k] = g * RB + swz_k(g, t4 * KCH + k) * 16;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int r = 2 * t4 + e;
#pragma unroll
            for (int k = 0; k < VCH; k++) /* VWORDS < 4 (8 bytes): half of chunk g / 2 */
                voff[e][k] = 16 * RB + r * RB +
                             (VWORDS >= 4 ? swz_v(r, g * VCH + k) * 16
                                          : swz_v(r, g >> 1) * 16 + (g & 1) * 8);
        }
    }
    (void)koff, (void)voff;
    /* the keys of a chunk, cs .. ce - 1: their block-table entries in sm_tab (entry i: block
     * b0 + i) */
    int cs = j0, ce = j0, b0 = 0;
    auto row = [&](int j) -> int64_t { /* key j's row offset in the cache (j < ce) */
        const int b = pow2 ? j >> bs_shift : j / bs;
        const int r = pow2 ? j & (bs - 1) : j % bs;
        return ((int64_t)sm_tab[b - b0] * bs + r) * kv_stride + (int64_t)kvh * HD;
    };
    /* the warp's stages (ST > 0) */
    char *wst = NULL;
    if constexpr (ST > 0) {
        extern __shared__ uint4 dtc_dsm[];
        /* TM: the stages aligned for the copy engine's swizzle, by an offset from the shared
         * array itself: a pointer rebuilt from an integer loses its state space, and every
         * fragment read became a generic load (ld.v4 instead of ld.shared.v4) */
        char *dsm = (char *)dtc_dsm;
        if constexpr (TM)
            dsm += (DTMA_ALIGN - (smem_addr(dtc_dsm) & (DTMA_ALIGN - 1))) & (DTMA_ALIGN - 1);
        wst = dsm + warp * ST * dtc_stage_bytes(sizeof(KV), HD);
    }
    /* the pipeline (ST > 0): step `it` of this warp (keys jb = cs + warp * 16 + it * 64)
     * copied into stage it % ST; a step past ce copies nothing but still commits a group,
     * so that the count of groups is the count of steps */
    /* TM: lane 0 asks the copy engine for step it's tile, keys jb .., of cache block `entry` (b
     * the keys' block in the sequence) */
    [[maybe_unused]] auto tma_tile = [&](int it, int jb, int b, int entry) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        const int sl = (base + it) % (ST > 0 ? ST : 1), y = entry * bs + (jb - b * bs);
        const uint32_t st = smem_addr(wst + sl * dtc_stage_bytes(sizeof(KV), HD)),
                       bar = smem_addr(&sm_bar[warp][sl]);
        mbar_expect_tx(bar, dtc_stage_bytes(sizeof(KV), HD));
        tma_load_2d(st, &kmap, kvh * HD, y, bar, policy);
        tma_load_2d(st + 16 * RB, &vmap, kvh * HD, y, bar, policy);
#endif
    };
    auto issue = [&](int it) {
        const int jb = cs + warp * 16 + it * DEC_WARPS * 16;
        if constexpr (TM) { /* the whole tile (rows past ce too: see the wait) */
            if (jb < ce && lane == 0) {
                const int b = pow2 ? jb >> bs_shift : jb / bs;
                tma_tile(it, jb, b, sm_tab[b - b0]);
            }
            return;
        }
        if (jb < ce) {
            char *st = wst + (it % (ST > 0 ? ST : 1)) * dtc_stage_bytes(sizeof(KV), HD);
#pragma unroll
            for (int i = 0; i < CPR; i++) {
                const int q = lane + 32 * i, kv = q / (16 * CPR), r = (q / CPR) % 16,
                          c = q % CPR;
                const int j = jb + r;
                const KV *src =
                    (kv ? vc : kc) + (j < ce ? row(j) : 0) + c * (16 / (int)sizeof(KV));
                const int at = kv ? 16 * RB + r * RB + swz_v(r, c) * 16
                                  : r * RB + swz_k(r, c) * 16;
                cp_async16(st + at, src, j < ce ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    /* a chunk begins: its table entries staged, its first ST - 1 steps asked for */
    auto start_chunk = [&]() {
        ce = dec_stage_table(sm_tab, table, cs, j1, bs, b0);
        if constexpr (ST > 0) {
#pragma unroll
            for (int i = 0; i < ST - 1; i++)
                issue(i);
        }
    };
    /* TM: the first chunk's first tiles are asked for before the prologue, so that the copy
     * engine fetches them while the block norms and rotates its queries (dtc_early) */
    bool started = false;
    /* TM, 2 stages, a record (AttentionParams.dec_rec) and the first partition: each warp asks for
     * its first tile (keys 16 warp ..: DEC_REC_TAB entries cover the 4 warps' at a block size of
     * 16 or more) from the record's table entries at once; the first chunk's entries, loaded into
     * registers meanwhile, reach sm_tab after the prologue, which does not read them. So the
     * first tiles wait for one load (the record), not for the order, the context, the table and
     * two barriers. */
    constexpr int RT = (DEC_TAB + DEC_WARPS * 32 - 1) / (DEC_WARPS * 32);
    static_assert(DEC_REC_TAB >= DEC_WARPS, "a record holds the 4 warps' first blocks");
    [[maybe_unused]] int32_t rtab[RT];
    [[maybe_unused]] int rnb = 0;
    bool rec_first = false;
    if constexpr (TM && ST == 2) {
        rec_first = B.rec && j0 == 0 && dtc_early(B);
        if (rec_first) {
            cs = 0, ce = dec_chunk(0, j1, bs, b0, rnb);
#pragma unroll
            for (int i = 0; i < RT; i++) {
                const int k = threadIdx.x + i * DEC_WARPS * 32;
                rtab[i] = k < rnb ? table[k] : 0;
            }
            const int jb = warp * 16;
            if (jb < ce && lane == 0) {
                const int b = pow2 ? jb >> bs_shift : jb / bs;
                tma_tile(0, jb, b, B.rec[DEC_REC_TAB0 + b]);
            }
        }
    }
    if constexpr (TM)
        if (!rec_first && dtc_early(B)) start_chunk(), started = true;
    dtc_pre_store<KV, HD, FUSE>(pre, B, sm_rope);
    if constexpr (PRE) pdl_wait(), pdl_trigger();
    dtc_prologue<KV, HD, FUSE>(p, B, (float(*)[HD])sm_q, sm_rope, pre.slot);
    if constexpr (TM && ST == 2) {
        if (rec_first) { /* the first chunk's entries (its first tiles asked for above) */
#pragma unroll
            for (int i = 0; i < RT; i++) {
                const int k = threadIdx.x + i * DEC_WARPS * 32;
                if (k < rnb) sm_tab[k] = rtab[i];
            }
            __syncthreads();
            started = true;
        }
    }
    /* TM: the key the prologue stored (its row in the cache is not ordered with the copy engine's
     * reads), where this block holds it */
    [[maybe_unused]] const int last = TM && pre.slot >= 0 ? B.ctx - 1 : -1; /* TM only */
    const float qscale = p.scale * 1.44269504088896341f * (F8 ? p.k_scale : 1.0f);
    /* Q's fragments: step ks, dims KDIMS * t4 + 4 ks + 0..3 (a thread's K run) */
    uint32_t qa0[KSTEPS], qa2[KSTEPS];
    dtc_q_frags<M, HD, FUSE>(p, B, &sm_q[0][0], qscale, qa0, qa2,
                             [&](int ks, int e) { return KDIMS * t4 + 4 * ks + e; });
    float o[KSTEPS][4];
#pragma unroll
    for (int i = 0; i < KSTEPS; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    /* heads 2 t4 + e: running max (log2 units), this thread's part of the sum */
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    const float lazy = p.dec_lazy;

    while (cs < j1) {
        if (!started) start_chunk();
        started = false;
        int it = 0;
        for (int jb = cs + warp * 16; jb < ce; jb += DEC_WARPS * 16, it++) {
            /* K: keys jb + g and jb + 8 + g, dims KDIMS * t4 ..; V: keys jb + 2 t4 + {0, 1, 8,
             * 9}, dims VDIMS * g .. (zeros past ce) */
            uint32_t kw[2][KWORDS], vw[4][VWORDS];
            if constexpr (ST > 0) {
                issue(it + ST - 1);
                const int sl = TM ? (base + it) % ST : it % ST;
                const char *st = wst + sl * dtc_stage_bytes(sizeof(KV), HD);
                if constexpr (TM) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                    mbar_wait(smem_addr(&sm_bar[warp][sl]), ((base + it) / ST) & 1);
                    const bool patch = last >= jb && last < jb + 16;
                    if (jb + 16 > ce || patch) {
                        char *sw = (char *)st;
                        /* V's rows past the context zeroed (K's are masked) */
                        for (int r = ce - jb + (lane >> 3); r < 16; r += 4)
                            *(uint4 *)(sw + 16 * RB + r * RB + (lane & 7) * 16) =
                                make_uint4(0u, 0u, 0u, 0u);
                        if (patch) dtc_patch_last<KV, HD>(sw, 16 * RB, last - jb, sm_rope);
                        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                        __syncwarp();
                    }
#endif
                } else {
                    cp_async_wait<ST - 1>(); /* this thread's copies of step it have landed */
                    __syncwarp();            /* and every lane's */
                }
                /* rows g + 8 n and 2 t4 + e + 8 h: the offsets of rows g and 2 t4 + e (the
                 * swizzles repeat every 8 rows) plus 8 rows, a constant */
#pragma unroll
                for (int n = 0; n < 2; n++)
#pragma unroll
                    for (int k = 0; k < KCH; k++)
                        load_words<KWORDS / KCH>(st + n * 8 * RB + koff[k],
                                                 &kw[n][k * (KWORDS / KCH)]);
#pragma unroll
                for (int n = 0; n < 4; n++)
#pragma unroll
                    for (int k = 0; k < VCH; k++)
                        load_words<VWORDS / VCH>(st + (n >> 1) * 8 * RB + voff[n & 1][k],
                                                 &vw[n][k * (VWORDS / VCH)]);
                __syncwarp(); /* read before the stage is refilled (issued at step it + 1) */
            } else {
#pragma unroll
                for (int n = 0; n < 2; n++) {
                    const int j = jb + 8 * n + g;
                    if (j < ce)
                        load_words<KWORDS>(kc + row(j) + KDIMS * t4, kw[n]);
                    else
#pragma unroll
                        for (int w = 0; w < KWORDS; w++)
                            kw[n][w] = 0u;
                }
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    const int j = jb + 2 * t4 + (n & 1) + (n >> 1) * 8;
                    if (j < ce)
                        load_words<VWORDS>(vc + row(j) + VDIMS * g, vw[n]);
                    else
#pragma unroll
                        for (int w = 0; w < VWORDS; w++)
                            vw[n][w] = 0u;
                }
            }
            /* S^T (16 keys x 8 heads) = K Q^T: A rows g, g + 8 are keys jb + g, jb + 8 + g
             * (k-step ks: dims dim(ks, 0..1) in a0 / a1, dim(ks, 2..3) in a2 / a3), B Q's
             * fragments; even and odd k-steps in two accumulators (two dependent chains) */
            float stc[2][4] = {};
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                uint32_t a[4];
                if constexpr (F8) {
                    a[0] = e4m3x2_lo(kw[0][ks]), a[1] = e4m3x2_lo(kw[1][ks]);
                    a[2] = e4m3x2_hi(kw[0][ks]), a[3] = e4m3x2_hi(kw[1][ks]);
                } else {
                    a[0] = kw[0][2 * ks], a[1] = kw[1][2 * ks];
                    a[2] = kw[0][2 * ks + 1], a[3] = kw[1][2 * ks + 1];
                }
                mma16816<M>(stc[ks & 1], a, qa0[ks], qa2[ks]);
            }
            float sc[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[e] = stc[0][e] + stc[1][e];
            uint32_t pb0, pb1;
            dtc_softmax_step<M>(sc, jb, ce, g, lazy, mrow, lrow, o, pb0, pb1);
#pragma unroll
            for (int i = 0; i < KSTEPS; i++) {
                /* m-tile i: rows g / g + 8 are dims VDIMS g + 2 i / + 1 */
                uint32_t a[4];
                if constexpr (F8) {
                    const int w = i >> 1;
                    const uint32_t sel = i & 1 ? 0x7362u : 0x5140u;
                    const uint32_t lo = byte_perm(vw[0][w], vw[1][w], sel),
                                   hi = byte_perm(vw[2][w], vw[3][w], sel);
                    a[0] = e4m3x2_lo(lo), a[1] = e4m3x2_hi(lo);
                    a[2] = e4m3x2_lo(hi), a[3] = e4m3x2_hi(hi);
                } else {
                    a[0] = byte_perm(vw[0][i], vw[1][i], 0x5410u);
                    a[1] = byte_perm(vw[0][i], vw[1][i], 0x7632u);
                    a[2] = byte_perm(vw[2][i], vw[3][i], 0x5410u);
                    a[3] = byte_perm(vw[2][i], vw[3][i], 0x7632u);
                }
                mma16816<M>(o[i], a, pb0, pb1);
            }
        }
        if constexpr (ST > 0 && !TM) cp_async_wait<0>(); /* the empty groups past ce */
        base += it;
        cs = ce;
    }
    /* merge the warps (with the pipeline, the accumulators go where the stages were, once every
     * warp is done with its own) */
    constexpr int AW = ST > 0 ? 1 : DEC_WARPS;
    __shared__ float sm_acc_s[AW][ST > 0 ? 1 : DTC_MAX_GROUP][ST > 0 ? 1 : HD];
    float(*sm_acc)[DTC_MAX_GROUP][HD] = (float(*)[DTC_MAX_GROUP][HD])sm_acc_s;
    if constexpr (ST > 0) {
        extern __shared__ uint4 dtc_dsm[];
        static_assert(dtc_smem_bytes(sizeof(KV), HD, ST) >=
                          DEC_WARPS * DTC_MAX_GROUP * HD * (int)sizeof(float),
                      "the stages hold the accumulators");
        sm_acc = (float(*)[DTC_MAX_GROUP][HD])dtc_dsm;
        __syncthreads();
    }
    /* rows g / g + 8 of m-tile i are dims VDIMS g + 2 i / + 1; an fp8 cache's v_scale, left out
     * of the products, applies to the output */
    dtc_finish<HD>(p, B, o, mrow, lrow, sm_acc, num_parts, ws, F8 ? p.v_scale : 1.0f,
                   [&](int i, int e) { return VDIMS * g + 2 * i + (e >> 1); });
}

template <typename KV, int HD, bool FUSE, int MINB, int ST>
__global__ void __launch_bounds__(DEC_WARPS * 32, MINB)
    attention_decode_tma_kernel(AttentionParams p, int num_parts, float *ws,
                                const __grid_constant__ CUtensorMap kmap,
                                const __grid_constant__ CUtensorMap vmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (!FUSE) pdl_wait(), pdl_trigger(); /* FUSE: dtc_pre_wait */
    typedef KV M;
    constexpr int KSTEPS = HD / 16; /* k-steps of S; also the m-tiles of O^T */
    constexpr int SB = dtma_stage_bytes(HD), HB = SB / 2;
    __shared__ float sm_q[FUSE ? DTC_MAX_GROUP : 1][FUSE ? HD : 1];
    __shared__ __align__(16) char sm_rope_b[FUSE ? sizeof(DtcRope<KV, HD>) : 16];
    DtcRope<KV, HD> &sm_rope = *reinterpret_cast<DtcRope<KV, HD> *>(sm_rope_b);
    const DtcBlock B = dtc_setup<FUSE>(p, num_parts);
    const DtcPre pre = dtc_pre_load<HD, FUSE>(p, B);
    const int kvh = B.kvh, j0 = B.j0, j1 = B.j1;
    const int32_t *table = B.table;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    /* the warp's stages (aligned for the swizzle) and their barriers */
    extern __shared__ uint8_t dtma_dsm[];
    const uint32_t dsm0 = (smem_addr(dtma_dsm) + (DTMA_ALIGN - 1u)) & ~(DTMA_ALIGN - 1u);
    const uint32_t wst = dsm0 + (uint32_t)(warp * ST * SB);
    __shared__ __align__(8) uint64_t sm_bar[DEC_WARPS][ST];
    const uint64_t policy = dtma_warp_init(sm_bar[warp], ST);
    /* ldmatrix row addresses: lane L gives row L % 8 of matrix L / 8. V's: key (L % 8) + 8
     * ((L / 8) >> 1), chunk (L / 8) & 1 of the m-tile */
    const int lm = lane >> 3, lkey = (lane & 7) + 8 * (lm >> 1), lch = lm & 1;
    /* K's: matrix L / 8 is key (L % 8) + 8 ((L / 8) & 1), chunk (L / 8) >> 1, so that the four
     * come in the order of K's A fragment (keys 0..7 / 8..15 of the first 8 dims, then of the
     * next 8) */
    const int kkey = (lane & 7) + 8 * (lm & 1), kch = lm >> 1;

    __shared__ int32_t sm_tab[DEC_TAB];
    const int bs = p.block_size;
    const bool pow2 = (bs & (bs - 1)) == 0;
    const int bs_shift = __ffs(bs) - 1;
    uint32_t issued = 0, used = 0; /* the warp's tiles asked for, computed on */
    /* the keys of a chunk, cs .. ce - 1: their block-table entries in sm_tab (entry i: block
     * b0 + i) */
    int cs = j0, ce = j0, b0 = 0;
    /* the tile of keys jb .. jb + 15 (jb < ce, a multiple of 16: within one cache block) */
    auto issue = [&](int jb) {
        if (lane == 0) {
            const int b = pow2 ? jb >> bs_shift : jb / bs; /* (a division: ~25 instructions) */
            const int y = sm_tab[b - b0] * bs + (jb - b * bs);
            const uint32_t st = wst + (issued % ST) * SB,
                           bar = smem_addr(&sm_bar[warp][issued % ST]);
            mbar_expect_tx(bar, SB);
#pragma unroll
            for (int h = 0; h < HD / 64; h++) {
                tma_load_2d(st + h * 16 * DTMA_ROWB, &kmap, kvh * HD + 64 * h, y, bar, policy);
                tma_load_2d(st + HB + h * 16 * DTMA_ROWB, &vmap, kvh * HD + 64 * h, y, bar,
                            policy);
            }
        }
        issued++;
    };
    /* a chunk begins: its table entries staged, its first ST - 1 tiles asked for */
    auto start_chunk = [&]() {
        ce = dec_stage_table(sm_tab, table, cs, j1, bs, b0);
#pragma unroll
        for (int i = 0; i < ST - 1; i++)
            if (cs + warp * 16 + i * DEC_WARPS * 16 < ce) issue(cs + warp * 16 + i * DEC_WARPS * 16);
    };
    /* the first chunk's first tiles are fetched while the prologue runs (dtc_early) */
    bool started = false;
    if (dtc_early(B)) start_chunk(), started = true;
    dtc_pre_store<KV, HD, FUSE>(pre, B, sm_rope);
    if constexpr (FUSE) pdl_wait(), pdl_trigger();
    dtc_prologue<KV, HD, FUSE>(p, B, (float(*)[HD])sm_q, sm_rope, pre.slot);
    /* the key the prologue stored, where this block holds it (dtc_patch_last) */
    const int last = pre.slot >= 0 ? B.ctx - 1 : -1;
    /* Q's fragments: step ks, dims 16 ks + 2 t4 + 0..1 (qa0) and + 8 (qa2), as ldmatrix gives K */
    uint32_t qa0[KSTEPS], qa2[KSTEPS];
    dtc_q_frags<M, HD, FUSE>(p, B, &sm_q[0][0], p.scale * 1.44269504088896341f, qa0, qa2,
                             [&](int ks, int e) { return 16 * ks + 2 * t4 + (e & 1) + 8 * (e >> 1); });
    float o[KSTEPS][4];
#pragma unroll
    for (int i = 0; i < KSTEPS; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    /* heads 2 t4 + e: running max (log2 units), this thread's part of the sum */
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    const float lazy = p.dec_lazy;

    while (cs < j1) {
        if (!started) start_chunk();
        started = false;
        for (int jb = cs + warp * 16; jb < ce; jb += DEC_WARPS * 16) {
            const int ahead = jb + (ST - 1) * DEC_WARPS * 16;
            if (ahead < ce) issue(ahead); /* into the stage computed on last step */
            const uint32_t st = wst + (used % ST) * SB;
            mbar_wait(smem_addr(&sm_bar[warp][used % ST]), (used / ST) & 1);
            used++;
            const bool patch = last >= jb && last < jb + 16;
            if (jb + 16 > ce || patch) { /* rows past the context: V's zeroed (K's are masked) */
                for (int i = lane; i < (HD / 64) * 16 * 8; i += 32) {
                    const int r = (i >> 3) & 15;
                    if (jb + r >= ce)
                        *(uint4 *)__cvta_shared_to_generic(st + HB + (i >> 7) * 16 * DTMA_ROWB +
                                                           r * DTMA_ROWB + (i & 7) * 16) =
                            make_uint4(0u, 0u, 0u, 0u);
                }
                if (patch)
                    dtc_patch_last<KV, HD>((char *)__cvta_shared_to_generic(st), HB, last - jb,
                                           sm_rope);
                /* ordinary stores that ldmatrix reads next, and that a copy overwrites later */
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                __syncwarp();
            }
            /* S^T (16 keys x 8 heads) = K Q^T: ldmatrix gives K's A fragment (keys 0..7 then
             * 8..15 of dims 16 ks .., then of dims 16 ks + 8 ..); two accumulator chains */
            float stc[2][4] = {};
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                uint32_t a[4]; /* (keys 0..7, dims 16 ks ..), (8..15, ..), (0..7, + 8), (8..15, + 8) */
                ldsm_x4(st + dtma_at(kkey, 2 * ks + kch), a);
                mma16816<M>(stc[ks & 1], a, qa0[ks], qa2[ks]);
            }
            float sc[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[e] = stc[0][e] + stc[1][e];
            uint32_t pb0, pb1;
            dtc_softmax_step<M>(sc, jb, ce, g, lazy, mrow, lrow, o, pb0, pb1);
#pragma unroll
            for (int i = 0; i < KSTEPS; i++) {
                /* m-tile i: rows g / g + 8 are dims 16 i + g / + 8 */
                uint32_t a[4];
                /* transposed: (keys 0..7, dims 16 i ..), (0..7, + 8), (8..15, ..), (8..15, + 8)
                 * become A's a0 .. a3 (dims 16 i + g / + 8 g, keys 2 t4 / 8 + 2 t4) */
                ldsm_x4_t(st + HB + dtma_at(lkey, 2 * i + lch), a);
                mma16816<M>(o[i], a, pb0, pb1);
            }
            __syncwarp(); /* every lane's reads of the stage done before it is asked for again */
        }
        cs = ce;
    }
    /* merge the warps: the accumulators go where the stages were, once every warp is done with
     * its own; rows g / g + 8 of m-tile i are dims 16 i + g / + 8 */
    static_assert(DEC_WARPS * ST * SB >= DEC_WARPS * DTC_MAX_GROUP * HD * (int)sizeof(float),
                  "the stages hold the accumulators");
    __syncthreads();
    dtc_finish<HD>(p, B, o, mrow, lrow,
                   (float(*)[DTC_MAX_GROUP][HD])__cvta_shared_to_generic(dsm0), num_parts, ws,
                   1.0f, [&](int i, int e) { return 16 * i + g + 8 * (e >> 1); });
#endif
}

/* CVLLM_CUDA_DEC_TMA: the TMA kernel's stages a warp (0: off; 3; anything else, or unset: 2).
 * Measured on an H100 (2026-11-25, default workload, output tok/s): 2 stages 19,746 / 19,796 /
 * 19,774, 3 stages 19,767 / 19,800 / 19,635; fp8 cache 26,845 with 2, 26,468 with 3. */
static int dtma_stages(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("CVLLM_CUDA_DEC_TMA");
        v = e && *e ? atoi(e) : 2;
        if (v != 0 && v != 3) v = 2;
    }
    return v;
}
/* compute capability >= 9.0 on the current device, asked once */
static int dtma_device_ok(void) {
    return cuda_device_cc() >= 90;
}
extern "C" int attention_decode_uses_tma(const AttentionParams *p) {
    const bool c16 = p->kvdt == DTYPE_BF16 || p->kvdt == DTYPE_F16;
    const bool f8 = p->kvdt == DTYPE_FP8_E4M3 && p->hd == 128 && dec_stages(p->kvdt) > 0;
    return attention_decode_uses_tc(p) && dtma_stages() > 0 && dtma_device_ok() && (c16 || f8) &&
           p->block_size % 16 == 0 && p->cache_rows > 0 &&
           ((int64_t)p->n_kv_heads * p->hd * (f8 ? 1 : 2)) % 16 == 0 &&
           ((uintptr_t)p->k_cache | (uintptr_t)p->v_cache) % 16 == 0;
}

/* the maps of this layer's K and V caches */
static int dtma_kv_maps(const AttentionParams &p, int hd, CUtensorMap *km, CUtensorMap *vm) {
    const int64_t cols = (int64_t)p.n_kv_heads * hd;
    const int rc = tma_map_2d(km, p.k_cache, p.cache_rows, cols, p.kvdt, 16);
    return rc ? rc : tma_map_2d(vm, p.v_cache, p.cache_rows, cols, p.kvdt, 16);
}

/* Launches the shared-memory decode kernel K with SMEM bytes of dynamic shared memory (past 48
 * KiB a kernel must opt in: once per kernel) over (parts, kv heads, sequences). */
template <auto K, int SMEM>
static int launch_decode_smem(const AttentionParams &p, int num_parts, float *ws,
                              const CUtensorMap &km, const CUtensorMap &vm, cudaStream_t stream) {
    static bool init = false;
    if (!init) {
        cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
        init = true;
    }
    dim3 grid(num_parts, p.n_kv_heads, p.num_seqs);
    pdl_launch(K, grid, DEC_WARPS * 32, SMEM, stream, p, num_parts, ws, km, vm);
    return 0;
}

template <typename KV, int HD, bool FUSE, int ST>
static int launch_decode_tma_st(const AttentionParams &p, int num_parts, float *ws,
                                cudaStream_t stream) {
    CUtensorMap km, vm;
    if (int rc = dtma_kv_maps(p, HD, &km, &vm)) return rc;
    constexpr int MINB = dtma_blocks_per_sm(HD, ST);
    return launch_decode_smem<attention_decode_tma_kernel<KV, HD, FUSE, MINB, ST>,
                              dtma_smem_bytes(HD, ST)>(p, num_parts, ws, km, vm, stream);
}
template <typename KV, int HD>
static int launch_decode_tma(const AttentionParams &p, int num_parts, float *ws,
                             cudaStream_t stream) {
    const int st = dtma_stages();
    if (p.positions)
        return st == 3 ? launch_decode_tma_st<KV, HD, true, 3>(p, num_parts, ws, stream)
                       : launch_decode_tma_st<KV, HD, true, 2>(p, num_parts, ws, stream);
    return st == 3 ? launch_decode_tma_st<KV, HD, false, 3>(p, num_parts, ws, stream)
                   : launch_decode_tma_st<KV, HD, false, 2>(p, num_parts, ws, stream);
}

template <typename KV, int HD, bool FUSE>
static int launch_decode_tc_f(const AttentionParams &p, int num_parts, float *ws,
                              cudaStream_t stream) {
    constexpr int MINB = dtc_blocks_per_sm(IsFp8<KV>::value, HD);
    const CUtensorMap none = {};
    dim3 grid(num_parts, p.n_kv_heads, p.num_seqs);
    pdl_launch(attention_decode_tc_kernel<KV, HD, FUSE, MINB, 0, false>, grid, DEC_WARPS * 32, 0,
               stream, p, num_parts, ws, none, none);
    return 0;
}
/* the pipelined kernel (TM: its stages filled by the copy engine): its blocks an SM as its shared
 * memory allows, at most 4 */
template <typename KV, int HD, bool FUSE, int ST, bool TM>
static int launch_decode_tc_st(const AttentionParams &p, int num_parts, float *ws,
                               cudaStream_t stream) {
    CUtensorMap km = {}, vm = {};
    if constexpr (TM)
        if (int rc = dtma_kv_maps(p, HD, &km, &vm)) return rc;
    constexpr int MINB = dtc_pipe_blocks_per_sm(sizeof(KV), HD, ST);
    return launch_decode_smem<attention_decode_tc_kernel<KV, HD, FUSE, MINB, ST, TM>,
                              dtc_smem_bytes(sizeof(KV), HD, ST) + (TM ? DTMA_ALIGN : 0)>(
        p, num_parts, ws, km, vm, stream);
}
template <typename KV, int HD, bool FUSE>
static int launch_decode_tc_fuse(const AttentionParams &p, int num_parts, float *ws,
                                 cudaStream_t stream) {
    const int st = dec_stages(p.kvdt);
    if constexpr (IsFp8<KV>::value && HD == 128) /* 128-byte rows: the copy engine can fill */
        if (attention_decode_uses_tma(&p))
            return st == 3 ? launch_decode_tc_st<KV, HD, FUSE, 3, true>(p, num_parts, ws, stream)
                           : launch_decode_tc_st<KV, HD, FUSE, 2, true>(p, num_parts, ws, stream);
    if (st == 2) return launch_decode_tc_st<KV, HD, FUSE, 2, false>(p, num_parts, ws, stream);
    if (st == 3) return launch_decode_tc_st<KV, HD, FUSE, 3, false>(p, num_parts, ws, stream);
    return launch_decode_tc_f<KV, HD, FUSE>(p, num_parts, ws, stream);
}
template <typename KV, int HD>
static int launch_decode_tc(const AttentionParams &p, int num_parts, float *ws,
                            cudaStream_t stream) {
    return p.positions ? launch_decode_tc_fuse<KV, HD, true>(p, num_parts, ws, stream)
                       : launch_decode_tc_fuse<KV, HD, false>(p, num_parts, ws, stream);
}

static int decode_tc_launch(const AttentionParams *p, int num_parts, float *ws,
                            cudaStream_t stream) {
    if (attention_decode_uses_tma(p) && p->kvdt != DTYPE_FP8_E4M3) {
        if (p->kvdt == DTYPE_BF16)
            return p->hd == 128 ? launch_decode_tma<__nv_bfloat16, 128>(*p, num_parts, ws, stream)
                                : launch_decode_tma<__nv_bfloat16, 64>(*p, num_parts, ws, stream);
        return p->hd == 128 ? launch_decode_tma<__half, 128>(*p, num_parts, ws, stream)
                            : launch_decode_tma<__half, 64>(*p, num_parts, ws, stream);
    }
    if (p->kvdt == DTYPE_BF16)
        return p->hd == 128 ? launch_decode_tc<__nv_bfloat16, 128>(*p, num_parts, ws, stream)
                            : launch_decode_tc<__nv_bfloat16, 64>(*p, num_parts, ws, stream);
    if (p->kvdt == DTYPE_F16)
        return p->hd == 128 ? launch_decode_tc<__half, 128>(*p, num_parts, ws, stream)
                            : launch_decode_tc<__half, 64>(*p, num_parts, ws, stream);
    return p->hd == 128 ? launch_decode_tc<__nv_fp8_e4m3, 128>(*p, num_parts, ws, stream)
                        : launch_decode_tc<__nv_fp8_e4m3, 64>(*p, num_parts, ws, stream);
}
