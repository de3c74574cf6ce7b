/* sampler.cu: sampling on the device, one block of 1024 threads per logits row. The semantics are
 * backend.h's (the CPU sampler's): penalties (repetition over prompt + output ids, then frequency
 * and presence over output ids, as vLLM), temperature, top-k, top-p over the top-k set, min-p
 * relative to the best token, renormalize, draw with u = cvllm_uniform(seed, output index)
 * (philox.h, the same integer arithmetic as on the CPU). Temperature 0: argmax, lowest id on ties,
 * NaN never wins (all NaN: 0), one pass over the row. Log-probs: log_softmax of the raw logits.
 * Rows with a temperature and no filter (top-k, top-p, min-p) take the winner of the exponential
 * race instead of the draw: one pass, no maximum or mass before it (race_key below); rows that
 * also have no penalties or log-probs go to the race kernel, a row over many blocks.
 *
 * Order of tokens: weight descending, ties by lower id (a total order, as the CPU's). Nothing is
 * sorted: each filter needs only the boundary of its set (the worst token it keeps), found by a
 * radix select over the bits of the weights (non-negative floats order as their bit patterns):
 * top-k by counts, top-p by probability mass; ties at the boundary are resolved in id order (the
 * n-th tied id, found as the draw finds its token, with counts for masses). Masses are sums of
 * weights in fixed point (w * 2^44 as 64-bit integers), so every sum is exact and independent of
 * the order in which the threads add it: the result is the same at every run. The draw takes the
 * first kept token, in id order, whose cumulated mass exceeds u * kept, like the CPU's loop, in a
 * fixed number of block-wide steps: the passes over a row give each warp one contiguous range of
 * ids (a 32nd of the vocabulary; its lanes take 4 consecutive ids each, one float4 where the row
 * is 16-byte aligned, 128 ids a warp load, so loads stay coalesced); the kept-mass pass sums each
 * range's mass separately; a scan over the 32 range masses names the range holding u * kept;
 * one block-wide prefix sum over that range alone (a contiguous piece of it a thread) names the
 * piece, and the piece's thread walks it to the token.
 *
 * Penalties need per-token counts: d_scratch holds an int32 [rows, vocab] table, zero between
 * calls (the kernel adds the row's ids, then clears exactly those entries; the race kernel's calls
 * use its start for each row's best word and count, cleared the same way). The logits are never
 * written: penalized values are computed where they are read. */
#include <string.h>

#include <cooperative_groups.h>
#include <type_traits>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/philox.h"

/* sampler_pdl_note: the sampler kernels are launched in full stream order (every kernel before
 * them has ended when they start) and trigger their dependents at once, so that the next step's
 * input copy (copy_segments_cuda, launched programmatically) reads its host words while the
 * sampler runs; it waits for the sampler only for the ids the sampler writes. Every kernel that
 * pdl_launch launches waits (pdl_wait) before it touches what the kernel before it writes. */
#define SAMPLER_THREADS 1024
#define FIX_SCALE 17592186044416.0f /* 2^44: a weight in [0, 1] as an integer; vocab < 2^19 */
#define PROMPT_BIT 0x40000000
#define FULL_MASK 0xffffffffu

namespace cg = cooperative_groups;

/* A row of logits read as f32: L = float, or uint16_t for bf16 (the model's own logits, as
 * transformers and vLLM compute them in a bf16 run: half the bytes; widened exactly). The type
 * is the kernel's template parameter, so the f32 kernel's loads are as they were. */
template <typename L> __device__ __forceinline__ float widen(L v) {
    if constexpr (sizeof(L) == 2) return __uint_as_float((uint32_t)v << 16);
    else return v;
}
/* four bf16 values (two 32-bit words, lower ids in the low halves) as f32 */
__device__ __forceinline__ float4 widen4(uint2 u) {
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}
template <typename L> struct Logits {
    const L *p;
    __device__ __forceinline__ float operator[](int64_t i) const {
        return widen(p[i]);
    }
    /* ids i .. i + 3 (i a multiple of 4, the row aligned: aligned()) */
    __device__ __forceinline__ float4 load4(int64_t i) const {
        if constexpr (sizeof(L) == 2) {
            return widen4(__ldg(reinterpret_cast<const uint2 *>(p + i)));
        } else {
            return __ldg(reinterpret_cast<const float4 *>(p + i));
        }
    }
    __device__ __forceinline__ bool aligned() const {
        return ((uintptr_t)p & (4 * sizeof(L) - 1)) == 0;
    }
};

/* ids [lo, hi) of a row copied into shared memory (the staged cluster kernel), read by id as
 * Logits reads the row: s[0] is id lo, and lo is a multiple of 8, so a quad is 16-byte (f32) or
 * 8-byte (bf16) aligned in s. */
template <typename L> struct Staged {
    const L *s;
    int lo;
    __device__ __forceinline__ float operator[](int64_t i) const {
        return widen(s[i - lo]);
    }
    __device__ __forceinline__ float4 load4(int64_t i) const {
        if constexpr (sizeof(L) == 2) {
            return widen4(*reinterpret_cast<const uint2 *>(s + (i - lo)));
        } else {
            return *reinterpret_cast<const float4 *>(s + (i - lo));
        }
    }
    __device__ __forceinline__ bool aligned() const {
        return true;
    }
};

template <typename L> struct Row {
    Logits<L> x;
    const int32_t *cnt; /* penalty counts or NULL */
    float rep, freq, pres;
};

/* The penalized logit of id i whose raw logit is v. PEN = false: the row has no penalties (R.cnt
 * is NULL), known where the pass is compiled, so the pass has no per-token branch on it. */
template <bool PEN = true, typename RR>
__device__ __forceinline__ float eff_logit(const RR &R, float v, int i) {
    if (PEN && R.cnt) {
        const int c = R.cnt[i];
        if (c) {
            const int n = c & (PROMPT_BIT - 1);
            if (R.rep != 1.0f) v = v > 0.0f ? v / R.rep : v * R.rep;
            if (n) v -= R.freq * (float)n + R.pres; /* as the CPU's apply_penalties */
        }
    }
    return v;
}

/* ------------------------------------------------------------------ block reductions */

struct ArgMax {
    float v;
    int i; /* -1: none */
};
/* a beats b: a real value above b's, or equal with a lower id; NaN and none never win */
__device__ __forceinline__ bool am_better(ArgMax a, ArgMax b) {
    if (a.i < 0 || isnan(a.v)) return false;
    if (b.i < 0 || isnan(b.v)) return true;
    return a.v > b.v || (a.v == b.v && a.i < b.i);
}

__device__ ArgMax block_argmax(ArgMax a) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        ArgMax b = {__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)};
        if (am_better(b, a)) a = b;
    }
    __syncthreads();
    if (lane == 0) sv[warp] = a.v, si[warp] = a.i;
    __syncthreads();
    a.v = sv[lane];
    a.i = lane < (int)(blockDim.x >> 5) ? si[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
        ArgMax b = {__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)};
        if (am_better(b, a)) a = b;
    }
    return a;
}

template <typename T> __device__ T block_sum_t(T v) {
    __shared__ T part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? part[lane] : (T)0;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float block_max_f(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? part[lane] : -INFINITY;
    return warp_max(v);
}

__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ int warp_max_i(int v) {
    for (int o = 16; o > 0; o >>= 1)
        v = max(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
/* Inclusive prefix sum over the warp in lane order. */
__device__ __forceinline__ unsigned long long warp_scan_u64(unsigned long long v) {
    const int lane = threadIdx.x & 31;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long n = __shfl_up_sync(FULL_MASK, v, o);
        if (lane >= o) v += n;
    }
    return v;
}

/* Inclusive prefix sum over the block in thread order; *total gets the block's sum. */
__device__ unsigned long long block_scan(unsigned long long v, unsigned long long *total) {
    __shared__ unsigned long long part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    __syncthreads();
    if (lane == 31) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        unsigned long long w = lane < nw ? part[lane] : 0ull;
        for (int o = 1; o < 32; o <<= 1) {
            unsigned long long n = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += n;
        }
        part[lane] = w; /* inclusive over warps */
    }
    __syncthreads();
    if (warp > 0) v += part[warp - 1];
    *total = part[nw - 1];
    return v;
}

/* ------------------------------------------------------------------ the exponential race */

/* Rows with a temperature and no filter (top-k, top-p, min-p) take the token whose key
 * x - T ln(-ln u_i) is largest (philox.h: u_i = cvllm_race_uniform(key, i)), the lowest id on
 * ties, NaN never; every kernel computes the key with race_key, so every kernel gives every row
 * the same token. As T ln(E) = (T ln 2) log2(E): key = fma(-(T ln 2), log2(E), x), E = -ln(u).
 * The CPU computes the same with logf and log2f: a draw differs from the CPU's only where two
 * keys lie within rounding (~1e-7) of each other. */

/* ln(u) for a normal positive u, within a few ulp relative, also near u = 1, where E = -ln(u)
 * is small and decides the race (the fast lg2 intrinsic is accurate only absolutely there):
 * u = 2^e m, m in [2/3, 4/3); ln(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 1/5, as
 * s (2 + s^2 (2/3 + s^2 (2/5 + s^2 (2/7 + s^2 2/9)))) (the next term is below 1e-8 of it). */
__device__ __forceinline__ float rcp_approx(float x) { /* x normal: within 1 ulp */
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float race_ln(float u) {
    const uint32_t b = __float_as_uint(u);
    const uint32_t eb = (b - 0x3f2aaaabu) & 0xff800000u; /* e << 23, two's complement */
    const float m = __uint_as_float(b - eb);
    const float e = (float)((int32_t)eb >> 23);
    const float sv = (m - 1.0f) * rcp_approx(m + 1.0f);
    const float s2 = sv * sv;
    float p = fmaf(s2, 2.0f / 9.0f, 2.0f / 7.0f);
    p = fmaf(s2, p, 0.4f);
    p = fmaf(s2, p, 2.0f / 3.0f);
    p = fmaf(s2, p, 2.0f);
    return fmaf(e, 0.693147182f, sv * p);
}
__device__ __forceinline__ float lg2_approx(float x) { /* x normal and positive */
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
/* cvllm_race_uniform on the GPU, the same floats, one ALU operation an id fewer: the race
 * kernel is bound by its ALU pipe (75% busy, Nsight Compute, H200 2026-12-04), where the CPU's
 * form spends a shift, an or and an integer-to-float conversion on ((h >> 8) | 1) 2^-24 (h:
 * cvllm_race_hash). Here (h >> 9) + 0x3f800000, the bits of f = 1 + (h >> 9) 2^-23 (one
 * LEA.HI: mad.hi by 2^23), then f - (1 - 2^-24) = (2 (h >> 9) + 1) 2^-24 = ((h >> 8) | 1)
 * 2^-24: one exact subtraction (an odd multiple of 2^-24 below 1). And w = 1 - u = (2^24 - 1 -
 * 2 (h >> 9)) 2^-24 is the same with ~h (~h >> 9 = 2^23 - 1 - (h >> 9)): the not folds into
 * the hash's last xor. (The hash's shifts as high words of products, IMAD.HI on the FMA pipe,
 * made the kernel 4% slower: BENCHMARKS round 36.) The sampler tests compare the draws with the
 * CPU's: a build with 2^22 for 2^23 failed test_sampler_race and three others (H200). */
__device__ __forceinline__ float race_odd(uint32_t h) { /* (2 (h >> 9) + 1) 2^-24 */
    uint32_t r;
    asm("mad.hi.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(h), "r"(1u << 23), "r"(0x3f800000u));
    return __uint_as_float(r) - 0.99999994039535522f; /* 1 - 2^-24 */
}
__device__ __forceinline__ float race_u(CvllmRaceKey k, uint32_t i) { /* u_i */
    return race_odd(cvllm_race_hash(k, i));
}
__device__ __forceinline__ float race_w(CvllmRaceKey k, uint32_t i) { /* 1 - u_i */
    return race_odd(~cvllm_race_hash(k, i));
}
/* x's key; t2 = T ln 2 (cvllm_race_t2) */
__device__ __forceinline__ float race_key(float x, float t2, CvllmRaceKey k, int i) {
    return fmaf(-t2, lg2_approx(-race_ln(race_u(k, (uint32_t)i))), x);
}
/* A race candidate as one orderable word: the key's bits (ordered as floats; NaN excluded by the
 * caller) above the complement of the id, so that the larger word is the larger key, then the
 * lower id. 0: no candidate (no real key packs to 0). */
__device__ __forceinline__ unsigned long long race_pack(float key, int i) {
    uint32_t b = __float_as_uint(key);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)b << 32) | (0xffffffffu - (uint32_t)i);
}
__device__ __forceinline__ int race_id(unsigned long long w) {
    return (int)(0xffffffffu - (uint32_t)w);
}
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long u = __shfl_xor_sync(FULL_MASK, v, o);
        v = u > v ? u : v;
    }
    return v;
}
/* The block's largest word (every thread gets it). */
__device__ unsigned long long block_max_u64(unsigned long long v) {
    __shared__ unsigned long long part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max_u64(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    return warp_max_u64(lane < (int)(blockDim.x >> 5) ? part[lane] : 0ull);
}

/* ------------------------------------------------------------------ warp ranges */

/* The vocabulary as blockDim / 32 contiguous ranges, range w = [w * len, min((w + 1) * len,
 * vocab)) for warp w: len is a multiple of 4 (so a range's quads of ids are 16-byte aligned where
 * the row is); the last range is shorter, and with a small vocabulary the last ones are empty. */
__device__ __forceinline__ int range_len(int vocab) {
    const int nw = blockDim.x >> 5;
    return ((vocab + nw - 1) / nw + 3) & ~3;
}
/* The same over the slice [lo0, hi0) of the row's ids (the cluster kernel's block: lo0 a multiple
 * of 4): range w is [lo0 + w * len, min(lo0 + (w + 1) * len, hi0)), len = range_len(hi0 - lo0). */
__device__ __forceinline__ void range_bounds(int lo0, int hi0, int w, int *lo, int *hi) {
    const int len = range_len(hi0 - lo0);
    *lo = min(lo0 + w * len, hi0);
    *hi = min(*lo + len, hi0);
}

/* f(v, i) for each id i of range w with its raw logit v, called by the lanes of warp w: lane l
 * takes ids base + 128 u + 4 l .. + 3 for u < 4 (512 ids a step, the 4 quads loaded before any is
 * used). reverse: the steps from the end of the range (a second pass over a row then starts with
 * what the first read last, which L2 is likeliest to still hold: a guess, not measured). The order
 * of the calls differs from id order: f must only add exact (integer) amounts or take maxima. */
template <typename X, typename F>
__device__ __forceinline__ void for_range(const X &x, int lo0, int hi0, int w, bool reverse,
                                          F &&f) {
    int lo, hi;
    range_bounds(lo0, hi0, w, &lo, &hi);
    if (lo >= hi) return;
    const int lane = threadIdx.x & 31;
    const bool vec = x.aligned();
    const int steps = (hi - lo + 511) >> 9;
    for (int s = 0; s < steps; s++) {
        const int base = lo + ((reverse ? steps - 1 - s : s) << 9);
        if (vec && base + 512 <= hi) { /* warp-uniform: the whole step, 4 float4 loads a lane */
            float4 q[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                q[u] = x.load4(base + 128 * u + 4 * lane);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int i = base + 128 * u + 4 * lane;
                f(q[u].x, i), f(q[u].y, i + 1), f(q[u].z, i + 2), f(q[u].w, i + 3);
            }
        } else { /* the range's last step, or a row that is not 16-byte aligned */
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int i = base + 128 * u + 4 * lane;
                if (i >= hi) continue;
                if (vec && i + 4 <= hi) {
                    const float4 q = x.load4(i);
                    f(q.x, i), f(q.y, i + 1), f(q.z, i + 2), f(q.w, i + 3);
                } else {
                    for (int j = 0; j < 4 && i + j < hi; j++)
                        f(x[i + j], i + j);
                }
            }
        }
    }
}

/* The exponential race over the slice [lo, hi) of a row (the whole row in sampler_kernel, a
 * block's slice in the cluster kernels): the block's best race word (race_pack; 0: no key that is
 * not NaN), every thread gets it. value(v, i): the logit the key is taken of (the raw logit v, or
 * the penalized one). */
template <typename X, typename V>
__device__ __forceinline__ unsigned long long block_race(const X &x, int lo, int hi,
                                                         const CudaSamplingRow &P, V &&value) {
    const CvllmRaceKey k = cvllm_race_key(P.seed, P.draw_index);
    unsigned long long best = 0;
    for_range(x, lo, hi, threadIdx.x >> 5, false, [&](float v, int i) {
        const float key = race_key(value(v, i), cvllm_race_t2(P.temperature), k, i);
        if (!isnan(key)) {
            const unsigned long long w = race_pack(key, i);
            best = w > best ? w : best;
        }
    });
    return block_max_u64(best);
}

/* After a for_range pass in which each thread added its amounts into mine (and took the largest id
 * it saw into last): lane l of every warp holds range l's total (own) and the inclusive sum through
 * range l (incl); total and last are the block's. Same values in every warp. */
struct Ranges {
    unsigned long long own, incl, total;
    int last;
};
__device__ Ranges range_totals(unsigned long long mine, int last) {
    __shared__ unsigned long long ws[32];
    __shared__ int wl[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    mine = warp_sum_u64(mine);
    last = warp_max_i(last);
    __syncthreads(); /* a previous call's readers are done */
    if (lane == 0) ws[warp] = mine, wl[warp] = last;
    __syncthreads();
    Ranges t;
    t.own = lane < nw ? ws[lane] : 0ull;
    t.incl = warp_scan_u64(t.own);
    t.total = __shfl_sync(FULL_MASK, t.incl, 31);
    t.last = warp_max_i(lane < nw ? wl[lane] : -1);
    return t;
}

/* The range in which the running sum first exceeds target (-1 if the total does not), and in
 * *before the sum of the ranges below it. */
__device__ __forceinline__ int range_of(const Ranges &t, unsigned long long target,
                                        unsigned long long *before) {
    const unsigned m = __ballot_sync(FULL_MASK, t.incl > target);
    const int w = m ? __ffs(m) - 1 : -1;
    *before = __shfl_sync(FULL_MASK, t.incl - t.own, w < 0 ? 0 : w);
    return w;
}

/* The first id of range w at which the running sum of amount(v, i) (in id order from the range's
 * start) exceeds target; -1 if none. The range is cut into one contiguous piece a thread: one
 * block scan over the pieces' sums names the piece, whose thread walks it again. */
template <typename X, typename F>
__device__ int range_find(const X &x, int lo0, int hi0, int w, unsigned long long target,
                          F &&amount) {
    __shared__ int found;
    int lo, hi;
    range_bounds(lo0, hi0, w, &lo, &hi);
    const int per = (hi - lo + (int)blockDim.x - 1) / (int)blockDim.x;
    const int a = min(lo + (int)threadIdx.x * per, hi), b = min(a + per, hi);
    unsigned long long s = 0;
    for (int i = a; i < b; i++)
        s += amount(x[i], i);
    if (threadIdx.x == 0) found = -1; /* ordered before the finder's store by block_scan */
    unsigned long long tot;
    const unsigned long long incl = block_scan(s, &tot);
    if (incl > target && incl - s <= target) { /* one thread: the piece holding target */
        unsigned long long c = incl - s;
        for (int i = a; i < b; i++) {
            c += amount(x[i], i);
            if (c > target) {
                found = i;
                break;
            }
        }
    }
    __syncthreads();
    const int res = found;
    __syncthreads();
    return res;
}

/* ------------------------------------------------------------------ the kernel */

template <typename L> struct Sampling {
    Row<L> R;
    int vocab;
    float m, inv_t, min_w;
    /* a boundary: token i is inside iff key(i) > bkey || (key(i) == bkey && i <= bid);
     * bid = INT_MAX and bkey = 0: everything */
    uint32_t k_key;
    int k_id;
    uint32_t p_key;
    int p_id;
};

/* The weight of id i whose raw logit is v: exp((logit - max) / T), in [0, 1]. */
template <bool PEN = true, typename SS>
__device__ __forceinline__ float weight(const SS &S, float v, int i) {
    float e = expf((eff_logit<PEN>(S.R, v, i) - S.m) * S.inv_t);
    return e >= 0.0f ? e : 0.0f; /* NaN logits never win */
}
__device__ __forceinline__ uint32_t wkey(float w) {
    return __float_as_uint(w);
}
/* w * 2^44 truncated: the product is exact in f32 (a power of two, w in [0, 1]), so this is the
 * integer (unsigned long long)((double)w * 2^44), with one conversion instead of two. */
__device__ __forceinline__ unsigned long long wfix(float w) {
    return __float2ull_rz(w * FIX_SCALE);
}
__device__ __forceinline__ bool inside(uint32_t key, int i, uint32_t bkey, int bid) {
    return key > bkey || (key == bkey && i <= bid);
}
template <typename SS> __device__ __forceinline__ bool in_topk(const SS &S, uint32_t key, int i) {
    return inside(key, i, S.k_key, S.k_id);
}
/* kept by the last filters: a positive weight, min-p, inside the top-p (within top-k) boundary */
template <typename SS> __device__ __forceinline__ bool kept_w(const SS &S, float w, int i) {
    return w > 0.0f && w >= S.min_w && inside(wkey(w), i, S.p_key, S.p_id);
}

/* The rank-th (1-based) lowest id among tokens with key == v inside the top-k set (-1: fewer). */
template <typename SS> __device__ int nth_tied_id(const SS &S, uint32_t v, int rank) {
    if (rank < 1) return -1;
    auto tied = [&](float x, int i) -> unsigned long long {
        const uint32_t k = wkey(weight(S, x, i));
        return k == v && in_topk(S, k, i) ? 1ull : 0ull;
    };
    unsigned long long mine = 0;
    for_range(S.R.x, 0, S.vocab, threadIdx.x >> 5, false,
              [&](float x, int i) { mine += tied(x, i); });
    const Ranges t = range_totals(mine, -1);
    const unsigned long long target = (unsigned long long)(rank - 1);
    unsigned long long before;
    const int w = range_of(t, target, &before);
    if (w < 0) return -1;
    return range_find(S.R.x, 0, S.vocab, w, target - before, tied);
}

/* Radix select over the keys of the tokens inside the top-k set, 8 bits at a time from the top.
 * by_mass = 0: the token of rank `need` (1-based) by count; 1: the shortest prefix whose mass
 * reaches `need`. Returns the boundary key and (through *cum_above) the count or mass of the
 * tokens whose key is above it. */
template <typename SS>
__device__ uint32_t radix_select(const SS &S, int by_mass, unsigned long long need,
                                 unsigned long long *cum_above) {
    __shared__ unsigned long long hist[256];
    __shared__ uint32_t sh_prefix;
    __shared__ unsigned long long sh_cum;
    uint32_t prefix = 0, mask = 0;
    unsigned long long cum = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += blockDim.x)
            hist[d] = 0;
        __syncthreads();
        for_range(S.R.x, 0, S.vocab, threadIdx.x >> 5, false, [&](float x, int i) {
            const float w = weight(S, x, i);
            const uint32_t k = wkey(w);
            if ((k & mask) != prefix || !in_topk(S, k, i)) return;
            atomicAdd(&hist[(k >> shift) & 255], by_mass ? wfix(w) : 1ull);
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            /* from the best digit down, the first where the running total reaches need; if none
             * does (rounding), the worst non-empty digit. run: the total above digit d. */
            unsigned long long run = cum, run_last = cum;
            int d = 255, last = -1;
            for (; d >= 0; d--) {
                if (hist[d]) {
                    if (run + hist[d] >= need) break;
                    last = d, run_last = run;
                }
                run += hist[d];
            }
            if (d < 0) d = last < 0 ? 0 : last, run = run_last;
            sh_prefix = prefix | ((uint32_t)d << shift);
            sh_cum = run;
        }
        __syncthreads();
        prefix = sh_prefix;
        cum = sh_cum;
        mask |= 255u << shift;
        __syncthreads();
    }
    *cum_above = cum;
    return prefix;
}

template <typename L>
__global__ void __launch_bounds__(SAMPLER_THREADS)
    sampler_kernel(const L *logits, int vocab, const CudaSamplingRow *rows, const int32_t *ids,
                   int32_t *token_out, float *logprob_out, int32_t *top_ids, float *top_lp,
                   int32_t *counts) {
    pdl_trigger(); /* sampler_pdl_note */
    const int r = blockIdx.x;
    const CudaSamplingRow P = rows[r];
    Sampling<L> S;
    S.vocab = vocab;
    S.R.x = {logits + (int64_t)r * vocab};
    S.R.cnt = NULL;
    S.R.rep = P.repetition_penalty;
    S.R.freq = P.frequency_penalty;
    S.R.pres = P.presence_penalty;
    int32_t *cnt = counts + (int64_t)r * vocab;
    const int nids = P.num_prompt + P.num_output;
    const int32_t *rid = ids + P.ids_offset;

    /* penalties: the counts of this row's ids */
    if (P.has_penalty) {
        for (int i = threadIdx.x; i < nids; i += blockDim.x) {
            const int id = rid[i];
            if (id < 0 || id >= vocab) continue;
            if (i < P.num_prompt)
                atomicOr(&cnt[id], PROMPT_BIT);
            else
                atomicAdd(&cnt[id], 1);
        }
        __syncthreads();
        S.R.cnt = cnt;
    }

    /* log-probs of the raw logits */
    __shared__ int chosen[CUDA_SAMPLER_MAX_LOGPROBS];
    double lse = 0.0; /* log(sum exp(x)), NaNs skipped, in double as the CPU's log_sum_exp */
    const int nlp =
        P.num_logprobs > CUDA_SAMPLER_MAX_LOGPROBS ? CUDA_SAMPLER_MAX_LOGPROBS : P.num_logprobs;
    if (P.num_logprobs >= 0) {
        float mx = -INFINITY;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x)
            mx = fmaxf(mx, S.R.x[i]);
        mx = block_max_f(mx);
        double se = 0.0;
        if (isfinite(mx))
            for (int i = threadIdx.x; i < vocab; i += blockDim.x)
                if (!isnan(S.R.x[i])) se += exp((double)S.R.x[i] - (double)mx);
        se = block_sum_t<double>(se);
        lse = isfinite(mx) ? (double)mx + log(se) : (double)mx;
        for (int k = 0; k < nlp; k++) {
            ArgMax a = {-INFINITY, -1};
            for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
                bool taken = false;
                for (int c = 0; c < k; c++)
                    taken |= chosen[c] == i;
                ArgMax b = {S.R.x[i], i};
                if (!taken && am_better(b, a)) a = b;
            }
            a = block_argmax(a);
            if (threadIdx.x == 0) { /* fewer real values than k: id -1, log-prob -inf */
                chosen[k] = a.i;
                top_ids[(int64_t)r * CUDA_SAMPLER_MAX_LOGPROBS + k] = a.i;
                top_lp[(int64_t)r * CUDA_SAMPLER_MAX_LOGPROBS + k] =
                    a.i < 0 ? -INFINITY : (float)((double)S.R.x[a.i] - lse);
            }
            __syncthreads();
        }
    }

    /* greedy, or the argmax the weights are relative to */
    const int warp = threadIdx.x >> 5;
    ArgMax a = {-INFINITY, -1};
    auto exact_argmax = [&]() {
        for_range(S.R.x, 0, vocab, warp, false, [&](float v, int i) {
            const ArgMax b = {eff_logit(S.R, v, i), i};
            if (am_better(b, a)) a = b;
        });
        a = block_argmax(a);
    };
    if (S.R.cnt) {
        exact_argmax();
    } else {
        /* Without penalties, one compare an id: a thread meets its ids in increasing order
         * (for_range, not reversed), so a strictly larger value keeps the lowest id of a tie, and
         * NaN never compares larger. A thread whose values are all -inf or NaN reports none, so
         * the block's argmax is am_better's whenever some value is above -inf; where none is,
         * the exact pass decides (a row of -inf and NaN). */
        float bv = -INFINITY;
        int bi = -1;
        for_range(S.R.x, 0, vocab, warp, false, [&](float v, int i) {
            if (v > bv) bv = v, bi = i;
        });
        a = block_argmax(ArgMax{bv, bi});
        if (a.i < 0) {
            a = ArgMax{-INFINITY, -1};
            exact_argmax();
        }
    }
    const int imax = a.i < 0 ? 0 : a.i;
    int tok = imax;
    const bool use_k = P.top_k > 0 && P.top_k < vocab;
    const bool use_p = P.top_p > 0.0f && P.top_p < 1.0f;
    if (P.temperature > 0.0f && isfinite(a.v) && a.i >= 0 && !use_k && !use_p &&
        !(P.min_p > 0.0f)) {
        /* no filter: the exponential race over the penalized logits */
        const unsigned long long best = block_race(
            S.R.x, 0, vocab, P, [&](float v, int i) { return eff_logit(S.R, v, i); });
        tok = race_id(best); /* the argmax's key is finite: best is not 0 */
    } else if (P.temperature > 0.0f && isfinite(a.v) && a.i >= 0) {
        S.m = a.v;
        S.inv_t = 1.0f / P.temperature;
        S.k_key = 0;
        S.k_id = INT_MAX;
        uint32_t bkey = 0;
        int bid = INT_MAX;
        if (use_k) {
            unsigned long long above;
            const uint32_t v = radix_select(S, 0, (unsigned long long)P.top_k, &above);
            const int id = nth_tied_id(S, v, (int)((unsigned long long)P.top_k - above));
            S.k_key = bkey = v;
            S.k_id = bid = id < 0 ? INT_MAX : id;
        }
        if (use_p) {
            unsigned long long mass = 0;
            for_range(S.R.x, 0, vocab, warp, false, [&](float v, int i) {
                const float w = weight(S, v, i);
                if (in_topk(S, wkey(w), i)) mass += wfix(w);
            });
            mass = block_sum_t<unsigned long long>(mass);
            const unsigned long long need = (unsigned long long)((double)P.top_p * (double)mass);
            unsigned long long above;
            const uint32_t v = radix_select(S, 1, need, &above);
            const unsigned long long wv = wfix(__uint_as_float(v));
            long long rank = wv ? (long long)((need > above ? need - above + wv - 1 : 0) / wv) : 1;
            if (rank < 1) rank = 1;
            const int id = nth_tied_id(S, v, (int)rank);
            bkey = v;
            bid = id < 0 ? INT_MAX : id;
        }
        S.p_key = bkey;
        S.p_id = bid;
        S.min_w = P.min_p > 0.0f ? P.min_p * 1.0f : 0.0f; /* min_p * w[imax], w[imax] = 1 */

        /* kept mass, range by range (from the ranges' ends: see for_range), then the draw in id
         * order: the range holding the target, then the token inside it */
        unsigned long long mine = 0;
        int last = -1;
        auto kept_pass = [&](auto pen) { /* a filter is on here: kept_w */
            for_range(S.R.x, 0, vocab, warp, true, [&](float v, int i) {
                const float w = weight<decltype(pen)::value>(S, v, i);
                if (kept_w(S, w, i)) mine += wfix(w), last = max(last, i);
            });
        };
        if (S.R.cnt)
            kept_pass(std::true_type());
        else
            kept_pass(std::false_type());
        const Ranges t = range_totals(mine, last); /* t.last: the last kept id, the fallback if
                                                      rounding never reaches u */
        const unsigned long long kept = t.total;
        if (kept > 0) {
            const double u = cvllm_uniform(P.seed, P.draw_index);
            const unsigned long long target = (unsigned long long)(u * (double)kept);
            unsigned long long before;
            const int w = range_of(t, target, &before);
            int found = -1;
            if (w >= 0)
                found = range_find(S.R.x, 0, vocab, w, target - before, [&](float v, int i) {
                    const float wt = weight(S, v, i);
                    return kept_w(S, wt, i) ? wfix(wt) : 0ull;
                });
            tok = found >= 0 ? found : (t.last >= 0 ? t.last : imax);
        }
    }
    if (threadIdx.x == 0) {
        token_out[r] = tok;
        logprob_out[r] = P.num_logprobs >= 0 ? (float)((double)S.R.x[tok] - lse) : 0.0f;
    }
    /* leave the counts as found: zero */
    if (P.has_penalty) {
        __syncthreads();
        for (int i = threadIdx.x; i < nids; i += blockDim.x) {
            const int id = rid[i];
            if (id >= 0 && id < vocab) cnt[id] = 0;
        }
    }
}

/* ------------------------------------------------------------------ the cluster kernels */

/* Rows with none of the filters that need the whole row in one block (penalties, top-k, top-p,
 * log-probs): a row over a thread-block cluster of SAMPLER_CLUSTER blocks (sm_90), block c taking
 * the c-th slice of the ids (cluster_slice: a multiple of 8 long, cut into its warp ranges as
 * above). The blocks exchange their argmax, then their kept masses, through distributed shared
 * memory; the block whose slice holds u * kept finds the token in it. Sums are the same exact
 * integers in the same id order as sampler_kernel's, so every row gets sampler_kernel's token,
 * bit for bit (test_sampler_cluster).
 *
 * Two kernels: the staged one (where a row is 16-byte aligned, up to a wave of rows:
 * sampler_choice) first copies its slice into shared memory with every copy in flight at once
 * (cp.async), and its passes read it there: the row leaves device memory once, where one block a
 * row reads it twice with a float4 a lane in flight (~74 us a row alone, Nsight Compute,
 * batch-1 decode on an H200, 2026-11-23). The other reads the row in place and takes at most
 * SAMPLER_CLUSTER_MAX_ROWS rows (rows that are not aligned). */
#define SAMPLER_CLUSTER 8
#define SAMPLER_CLUSTER_MAX_ROWS 16
#define SAMPLER_STAGED_THREADS 512 /* two blocks an SM: 64 registers a thread */
#define SAMPLER_STAGE_MAX (112 * 1024) /* a slice's bytes: two blocks an SM (228 KB) */

__host__ __device__ __forceinline__ int cluster_slice(int vocab, int nc) {
    return ((vocab + nc - 1) / nc + 7) & ~7;
}

template <typename L, typename X>
__device__ void cluster_sample(const X &x, int lo, int hi, const CudaSamplingRow &P, int vocab,
                               int r, int32_t *token_out, float *logprob_out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::cluster_group cluster = cg::this_cluster();
    const int c = (int)cluster.block_rank(), nc = (int)cluster.num_blocks();
    const int warp = threadIdx.x >> 5;
    Sampling<L> S;
    S.vocab = vocab;
    S.R.cnt = NULL;
    __shared__ float sh_v;
    __shared__ int sh_i, sh_last;
    __shared__ unsigned long long sh_kept;

    /* the argmax: each block's, then the cluster's (the same in every block: a total order) */
    /* exact: am_better an id; else one compare an id, as sampler_kernel's pass without
     * penalties (none where no value is above -inf: then the exact pass, in every block) */
    auto cluster_argmax = [&](bool exact) {
        ArgMax a = {-INFINITY, -1};
        if (exact)
            for_range(x, lo, hi, warp, false, [&](float v, int i) {
                const ArgMax b = {v, i};
                if (am_better(b, a)) a = b;
            });
        else
            for_range(x, lo, hi, warp, false, [&](float v, int i) {
                if (v > a.v) a.v = v, a.i = i;
            });
        a = block_argmax(a);
        if (threadIdx.x == 0) sh_v = a.v, sh_i = a.i;
        cluster.sync();
        /* lane k reads block k's (every load at once), then the warp's argmax */
        const int lane = threadIdx.x & 31;
        ArgMax g = {-INFINITY, -1};
        if (lane < nc)
            g = ArgMax{*cluster.map_shared_rank(&sh_v, lane),
                       *cluster.map_shared_rank(&sh_i, lane)};
        for (int o = 16; o > 0; o >>= 1) {
            const ArgMax b = {__shfl_xor_sync(FULL_MASK, g.v, o),
                              __shfl_xor_sync(FULL_MASK, g.i, o)};
            if (am_better(b, g)) g = b;
        }
        cluster.sync(); /* every block has read the others' argmax */
        return g;
    };
    ArgMax g = cluster_argmax(false);
    if (g.i < 0) g = cluster_argmax(true);
    const int imax = g.i < 0 ? 0 : g.i;
    int tok = imax;
    bool writer = c == 0;
    const bool live = P.temperature > 0.0f && isfinite(g.v) && g.i >= 0; /* in every block */
    if (live && !(P.min_p > 0.0f)) {
        /* no filter: the exponential race, each block's best word, then the cluster's */
        const unsigned long long best =
            block_race(x, lo, hi, P, [](float v, int) { return v; });
        if (threadIdx.x == 0) sh_kept = best;
        cluster.sync();
        const int lane = threadIdx.x & 31;
        unsigned long long w = lane < nc ? *cluster.map_shared_rank(&sh_kept, lane) : 0ull;
        cluster.sync(); /* every block has read the others' words */
        w = warp_max_u64(w);
        tok = race_id(w); /* the argmax's key is finite: w is not 0 */
    } else if (live) { /* min-p: the draw over the kept tokens */
        S.m = g.v;
        S.inv_t = 1.0f / P.temperature;
        S.k_key = S.p_key = 0;
        S.k_id = S.p_id = INT_MAX;
        S.min_w = P.min_p * 1.0f;
        unsigned long long mine = 0;
        int last = -1;
        for_range(x, lo, hi, warp, true, [&](float v, int i) {
            const float w = weight<false>(S, v, i);
            if (kept_w(S, w, i)) mine += wfix(w), last = max(last, i);
        });
        const Ranges t = range_totals(mine, last);
        if (threadIdx.x == 0) sh_kept = t.total, sh_last = t.last;
        cluster.sync();
        /* lane k reads block k's mass and last kept id; the masses' running sums over the
         * blocks in order (the lanes past nc add 0) */
        const int lane = threadIdx.x & 31;
        unsigned long long mass = 0;
        int glast = -1;
        if (lane < nc)
            mass = *cluster.map_shared_rank(&sh_kept, lane),
            glast = *cluster.map_shared_rank(&sh_last, lane);
        cluster.sync(); /* every block has read the others' masses */
        glast = warp_max_i(glast);
        const unsigned long long incl = warp_scan_u64(mass);
        const unsigned long long kept = __shfl_sync(FULL_MASK, incl, 31);
        if (kept > 0) {
            const double u = cvllm_uniform(P.seed, P.draw_index);
            const unsigned long long target = (unsigned long long)(u * (double)kept);
            /* the block holding target: the first whose running sum passes it */
            const unsigned m = __ballot_sync(FULL_MASK, incl > target);
            const int owner = m ? __ffs(m) - 1 : -1;
            const unsigned long long before =
                __shfl_sync(FULL_MASK, incl - mass, owner < 0 ? 0 : owner);
            tok = glast >= 0 ? glast : imax; /* rounding never reaching u: the last kept id */
            writer = owner == c || (owner < 0 && c == 0);
            if (owner == c) {
                unsigned long long b2;
                const int w = range_of(t, target - before, &b2);
                if (w >= 0) {
                    const int found =
                        range_find(x, lo, hi, w, target - before - b2, [&](float v, int i) {
                            const float wt = weight<false>(S, v, i);
                            return kept_w(S, wt, i) ? wfix(wt) : 0ull;
                        });
                    if (found >= 0) tok = found;
                }
            }
        }
    }
    if (writer && threadIdx.x == 0) {
        token_out[r] = tok;
        logprob_out[r] = 0.0f;
    }
#else
    (void)x, (void)lo, (void)hi, (void)P, (void)vocab, (void)r, (void)token_out,
        (void)logprob_out;
#endif
}

/* The row in place (rows that are not 16-byte aligned; at most SAMPLER_CLUSTER_MAX_ROWS). */
template <typename L>
__global__ void __launch_bounds__(SAMPLER_THREADS)
    sampler_cluster_kernel(const L *logits, int vocab, const CudaSamplingRow *rows,
                           int32_t *token_out, float *logprob_out) {
    pdl_trigger(); /* sampler_pdl_note */
    const int r = blockIdx.y, nc = (int)gridDim.x, slice = cluster_slice(vocab, nc);
    const int lo = min((int)blockIdx.x * slice, vocab), hi = min(lo + slice, vocab);
    cluster_sample<L>(Logits<L>{logits + (int64_t)r * vocab}, lo, hi, rows[r], vocab, r,
                      token_out, logprob_out);
}

/* The slice copied into shared memory first (dynamic, its bytes): vocab * sizeof(L) and logits
 * 16-byte aligned, so every slice is a whole number of 16-byte pieces. */
template <typename L>
__global__ void __launch_bounds__(SAMPLER_STAGED_THREADS, 2)
    sampler_staged_kernel(const L *logits, int vocab, const CudaSamplingRow *rows,
                          int32_t *token_out, float *logprob_out) {
    pdl_trigger(); /* sampler_pdl_note */
    extern __shared__ __align__(16) unsigned char stage[];
    const int r = blockIdx.y, nc = (int)gridDim.x, slice = cluster_slice(vocab, nc);
    const int lo = min((int)blockIdx.x * slice, vocab), hi = min(lo + slice, vocab);
    const char *src = reinterpret_cast<const char *>(logits + (int64_t)r * vocab + lo);
    const int bytes = (hi - lo) * (int)sizeof(L);
    for (int o = (int)threadIdx.x * 16; o < bytes; o += (int)blockDim.x * 16)
        cp_async16(stage + o, src + o, 16);
    cp_async_commit();
    const CudaSamplingRow P = rows[r];
    cp_async_wait<0>();
    __syncthreads();
    cluster_sample<L>(Staged<L>{reinterpret_cast<const L *>(stage), lo}, lo, hi, P, vocab, r,
                      token_out, logprob_out);
}

/* ------------------------------------------------------------------ the race kernel */

/* Rows with no penalties, log-probs or filters (greedy, or a temperature alone: the exponential
 * race) need no maximum, sum or draw before their token: one pass over the row, any part of which
 * any block may take. A block of RACE_THREADS takes RACE_PPB pieces of RACE_IDS ids of a row in
 * turn (a thread 4 quads a piece, every load of a piece in flight before any is used, and issued
 * before the piece before is raced), each thread keeps its best key above -inf (its ids in
 * increasing order: a strictly larger key keeps the lowest id; NaN never), the block its best word
 * (race_pack), which it adds to the row's word in d_best by atomicMax before counting itself done;
 * the row's last block (the threadFenceReduction pattern) writes the token and sets the row's word
 * and count back to 0 (zero between calls, as the scratch's contract says). A row with no key
 * above -inf (every logit -inf or NaN) takes greedy's token, the lowest id that is not NaN, from a
 * scan by that last block (0 if all are NaN). The row leaves memory once, in as many blocks as it
 * has RACE_PPB pieces (13 a Qwen3 row), with no cluster and no barrier between blocks. With a
 * temperature, a whole piece's ids get their exact key only where a bound allows them to win
 * (race_whole_pruned: one log an id, not two; CVLLM_CUDA_SAMPLER=noprune: every key). Every row
 * gets sampler_kernel's token. */
#define RACE_THREADS 256
#define RACE_IDS (RACE_THREADS * 16)
#define RACE_PPB 3 /* pieces a block (CVLLM_CUDA_RACE_PPB; 1: 0.081 against 0.065 ms, 256 rows) */

/* A thread's best key above -inf (and its id) over its ids of [lo, hi): those of the quads q
 * (loaded by the caller: a whole aligned piece) or, for a partial piece, read here. */
template <bool NOISE, typename L>
__device__ __forceinline__ void race_piece(const Logits<L> &x, const float4 *q, bool whole,
                                           int lo, int hi, float t2, CvllmRaceKey k, float *bk,
                                           int *bi) {
    auto take = [&](float v, int i) {
        const float key = NOISE ? race_key(v, t2, k, i) : v;
        if (key > *bk) *bk = key, *bi = i;
    };
    if (whole) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int i = lo + 4 * ((int)threadIdx.x + RACE_THREADS * u);
            take(q[u].x, i), take(q[u].y, i + 1), take(q[u].z, i + 2), take(q[u].w, i + 3);
        }
    } else { /* the row's last piece, or a row that is not aligned */
        for (int i = lo + (int)threadIdx.x; i < hi; i += RACE_THREADS)
            take(x[i], i);
    }
}

/* race_piece for a whole piece with a temperature, pruned (the same best key and id, exactly):
 * most ids cannot win, and a bound tells which without the key's two logs. As -ln(u) >= 1 - u
 * = w (exact in f32 for our u), a key x - T ln(-ln u) is at most x - T ln(w): ub = fma(-t2,
 * lg2(w), x), one log an id. race_key's own roundings (race_ln within a few ulp, lg2_approx
 * within 2 ulp, each fma half an ulp) keep a computed key below ub + t2 2^-16 + (|ub| + |key|)
 * 2^-24; the slack below is four times that or more. A thread takes the exact key of its
 * largest bound, the warp the largest of those keys (th: a key that exists, so the row's best is
 * at least th), and only the ids whose bound reaches th - slack get their exact key, one after
 * another (few: their logits read again): the row's winner is among them, and any id that ties
 * th (the lowest id wins a tie). */
template <typename L>
__device__ __forceinline__ void race_whole_pruned(const Logits<L> &x, const float4 *q, int lo,
                                                  float t2, CvllmRaceKey k, float *bk, int *bi) {
    const int base = lo + 4 * (int)threadIdx.x; /* the thread's ids: race_piece's order */
    auto id_of = [&](int j) { return base + 4 * RACE_THREADS * (j >> 2) + (j & 3); };
    float ub[16], top = -INFINITY;
    int tj = -1;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const float v[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const float w = race_w(k, (uint32_t)id_of(4 * u + c));
            ub[4 * u + c] = fmaf(-t2, lg2_approx(w), v[c]);
            if (ub[4 * u + c] > top) top = ub[4 * u + c], tj = 4 * u + c;
        }
    }
    float b = *bk; /* the thread's best of the pieces before (lower ids) */
    int bid = *bi;
    if (tj >= 0) { /* ub above -inf: its logit too */
        const float key = race_key(x[id_of(tj)], t2, k, id_of(tj));
        if (key > b) b = key, bid = id_of(tj);
    }
    float th = b;
    for (int o = 16; o > 0; o >>= 1)
        th = fmaxf(th, __shfl_xor_sync(FULL_MASK, th, o));
    /* th -inf: no key above -inf in the warp; +inf: tj is this thread's first +inf logit, and no
     * finite logit's key reaches +inf (the caller's bound on t) */
    if (th > -INFINITY && th < INFINITY) {
        const float cut = th - fmaf(t2, 6.103515625e-05f /* 2^-14 */,
                                    fmaf(fabsf(th), 9.5367431640625e-07f /* 2^-20 */, 1e-37f));
        unsigned m = 0;
#pragma unroll
        for (int j = 0; j < 16; j++)
            if (ub[j] >= cut) m |= 1u << j;
        m &= ~(1u << tj);
        while (m) {
            const int j = __ffs(m) - 1, i = id_of(j);
            m &= m - 1;
            const float key = race_key(x[i], t2, k, i);
            if (key > b || (key == b && i < bid)) b = key, bid = i;
        }
    }
    *bk = b, *bi = bid;
}

template <typename L>
__global__ void __launch_bounds__(RACE_THREADS)
    sampler_race_kernel(const L *logits, int vocab, const CudaSamplingRow *rows,
                        int32_t *token_out, float *logprob_out, unsigned long long *d_best,
                        unsigned int *d_done, bool prune, int ppb) {
    pdl_trigger(); /* sampler_pdl_note */
    __shared__ int last;
    __shared__ unsigned long long word;
    __shared__ float sh_t;
    __shared__ uint64_t sh_seed, sh_index;
    const int r = blockIdx.y;
    const Logits<L> x = {logits + (int64_t)r * vocab};
    /* pieces [p0, p1) of the row, each piece's loads issued before the piece before is raced */
    const int np = (vocab + RACE_IDS - 1) / RACE_IDS, p0 = (int)blockIdx.x * ppb,
              p1 = min(p0 + ppb, np);
    const bool aligned = x.aligned();
    auto whole = [&](int p) { return aligned && (p + 1) * RACE_IDS <= vocab; };
    auto load = [&](int p, float4 *q) {
#pragma unroll
        for (int u = 0; u < 4; u++)
            q[u] = x.load4(p * RACE_IDS + 4 * ((int)threadIdx.x + RACE_THREADS * u));
    };
    /* the first piece's loads, then the row's parameters by one thread (one read a block) */
    float4 q[4];
    if (whole(p0)) load(p0, q);
    if (threadIdx.x == 0)
        sh_t = rows[r].temperature, sh_seed = rows[r].seed, sh_index = rows[r].draw_index;
    __syncthreads();
    const float t = sh_t;
    const CvllmRaceKey k = t > 0.0f ? cvllm_race_key(sh_seed, sh_index) : CvllmRaceKey{0, 0};
    float bk = -INFINITY;
    int bi = -1;
    for (int p = p0; p < p1; p++) {
        const int lo = p * RACE_IDS, hi = min(lo + RACE_IDS, vocab);
        const bool w = whole(p), wn = p + 1 < p1 && whole(p + 1);
        float4 qn[4];
        if (wn) load(p + 1, qn);
        if (t > 0.0f && t <= 1e29f && w && prune) /* t: no finite bound or key overflows */
            race_whole_pruned(x, q, lo, cvllm_race_t2(t), k, &bk, &bi);
        else if (t > 0.0f)
            race_piece<true>(x, q, w, lo, hi, cvllm_race_t2(t), k, &bk, &bi);
        else
            race_piece<false>(x, q, w, lo, hi, 0.0f, k, &bk, &bi);
        if (wn)
#pragma unroll
            for (int u = 0; u < 4; u++)
                q[u] = qn[u];
    }
    const unsigned long long best = block_max_u64(bi >= 0 ? race_pack(bk, bi) : 0ull);
    if (threadIdx.x == 0) {
        if (best) atomicMax(&d_best[r], best);
        __threadfence(); /* the word before the count */
        last = atomicAdd(&d_done[r], 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return; /* the row's last block only, from here */
    __threadfence();
    if (threadIdx.x == 0) word = atomicExch(&d_best[r], 0ull), d_done[r] = 0;
    __syncthreads();
    int tok;
    if (word) {
        tok = race_id(word);
    } else { /* every logit -inf or NaN: the lowest id that is not NaN (each thread's first) */
        int f = -1;
        for (int i = (int)threadIdx.x; i < vocab && f < 0; i += RACE_THREADS)
            if (!isnan(x[i])) f = i;
        const unsigned long long w = block_max_u64(f >= 0 ? 0xffffffffull - (unsigned)f : 0ull);
        tok = w ? (int)(0xffffffffull - w) : 0;
    }
    if (threadIdx.x == 0) token_out[r] = tok, logprob_out[r] = 0.0f;
}

/* Which kernel takes the rows: 0 sampler_kernel, 1 sampler_cluster_kernel, 2 the staged one, 3 the
 * race kernel. Rows (host copies) with penalties, top-k, top-p or log-probs need sampler_kernel; a
 * GPU without clusters (compute capability below 9.0) too. Rows that are all greedy or a
 * temperature alone go to the race kernel. Others (min-p among them) to the cluster kernels: the
 * staged kernel takes as many rows as one wave of its blocks holds (two an SM: 33 rows on 132
 * SMs): its blocks copy, then compute, in step, so each further wave costs a whole block's time
 * (H200, `bench ops sampler`, temperature 0.6, f32: 64 rows 0.051 ms against the one-block
 * kernel's 0.035, 256 rows 0.146 against 0.097; 8 rows 0.018 against 0.033).
 * CVLLM_CUDA_SAMPLER=block: always sampler_kernel; =cluster: never the staged or the race kernel;
 * =norace: never the race kernel (the choice before it). */
static int sampler_choice(const void *d_logits, size_t esize, int vocab,
                          const CudaSamplingRow *rows, int n) {
    const char *e = getenv("CVLLM_CUDA_SAMPLER"); /* read at each call: the tests switch it */
    const int mode = cuda_device_cc() < 90 || (e && strcmp(e, "block") == 0) ? 0
                     : e && strcmp(e, "cluster") == 0                        ? 1
                     : e && strcmp(e, "norace") == 0                         ? 2
                                                                             : 3;
    if (!mode || !rows) return 0;
    int race = mode == 3;
    for (int r = 0; r < n; r++) {
        const CudaSamplingRow *P = &rows[r];
        if (P->has_penalty || P->num_logprobs >= 0 || (P->top_k > 0) ||
            (P->top_p > 0.0f && P->top_p < 1.0f))
            return 0;
        if (P->min_p > 0.0f) race = 0;
    }
    if (race) return 3;
    if (mode >= 2 && ((uintptr_t)d_logits & 15) == 0 && ((size_t)vocab * esize) % 16 == 0 &&
        (size_t)cluster_slice(vocab, SAMPLER_CLUSTER) * esize <= SAMPLER_STAGE_MAX &&
        n * SAMPLER_CLUSTER <= 2 * cuda_device_sms())
        return 2;
    return n <= SAMPLER_CLUSTER_MAX_ROWS ? 1 : 0;
}

template <typename L>
static int launch_cluster(int staged, const L *logits, int n, int vocab,
                          const CudaSamplingRow *d_rows, int32_t *d_token, float *d_logprob,
                          cudaStream_t stream) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(SAMPLER_CLUSTER, n);
    cfg.blockDim = dim3(staged ? SAMPLER_STAGED_THREADS : SAMPLER_THREADS);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = SAMPLER_CLUSTER;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (!staged) {
        CUDA_TRY(cudaLaunchKernelEx(&cfg, sampler_cluster_kernel<L>, logits, vocab, d_rows,
                                    d_token, d_logprob));
        return 0;
    }
    static int attr_set = 0; /* per instantiation; the limit is a property of the function */
    if (!attr_set) {
        CUDA_TRY(cudaFuncSetAttribute(sampler_staged_kernel<L>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      SAMPLER_STAGE_MAX));
        attr_set = 1;
    }
    cfg.dynamicSmemBytes = (size_t)cluster_slice(vocab, SAMPLER_CLUSTER) * sizeof(L);
    CUDA_TRY(cudaLaunchKernelEx(&cfg, sampler_staged_kernel<L>, logits, vocab, d_rows, d_token,
                                d_logprob));
    return 0;
}

/* The scratch: the penalty counts (sampler_kernel: int32 [rows, vocab]) or, in the race kernel's
 * calls, each row's word and count (u64 [rows] then u32 [rows]) at its start; zero between calls. */
extern "C" size_t sampler_cuda_scratch_bytes(int rows, int vocab) {
    const size_t counts = (size_t)rows * (size_t)vocab * sizeof(int32_t);
    const size_t race = (size_t)rows * (sizeof(unsigned long long) + sizeof(unsigned int));
    return counts > race ? counts : race;
}

template <typename L>
static int launch_race(const L *logits, int n, int vocab, const CudaSamplingRow *d_rows,
                       int32_t *d_token, float *d_logprob, void *d_scratch, cudaStream_t stream) {
    unsigned long long *best = (unsigned long long *)d_scratch;
    unsigned int *done = (unsigned int *)(best + n);
    const char *e = getenv("CVLLM_CUDA_SAMPLER"); /* =noprune: every id's key (measuring) */
    const bool prune = !(e && strcmp(e, "noprune") == 0);
    const char *pe = getenv("CVLLM_CUDA_RACE_PPB"); /* pieces a block (measuring) */
    const int ppb = pe && atoi(pe) > 0 ? atoi(pe) : RACE_PPB;
    const int np = (vocab + RACE_IDS - 1) / RACE_IDS;
    const dim3 grid((unsigned)((np + ppb - 1) / ppb), (unsigned)n);
    sampler_race_kernel<L><<<grid, RACE_THREADS, 0, stream>>>(logits, vocab, d_rows, d_token,
                                                              d_logprob, best, done, prune, ppb);
    CUDA_LAUNCH_TRY();
    return 0;
}

extern "C" int sampler_cuda(const void *d_logits, DType ldt, int n, int vocab,
                            const CudaSamplingRow *d_rows, const CudaSamplingRow *h_rows,
                            const int32_t *d_ids, int32_t *d_token, float *d_logprob,
                            int32_t *d_top_ids, float *d_top_logprobs, void *d_scratch,
                            cudaStream_t stream) {
    if (n <= 0) return 0;
    if (ldt != DTYPE_F32 && ldt != DTYPE_BF16)
        return cvllm_errorf(CVLLM_EUNSUPPORTED, "cuda sampler: logits of dtype %d", (int)ldt);
    const int bf16 = ldt == DTYPE_BF16;
    if (vocab >= (1 << 19))
        return cvllm_errorf(CVLLM_EUNSUPPORTED, "cuda sampler: vocabulary of %d (at most 524287)",
                            vocab);
    const int kind = sampler_choice(d_logits, bf16 ? 2 : 4, vocab, h_rows, n);
    if (kind == 3)
        return bf16 ? launch_race((const uint16_t *)d_logits, n, vocab, d_rows, d_token, d_logprob,
                                  d_scratch, stream)
                    : launch_race((const float *)d_logits, n, vocab, d_rows, d_token, d_logprob,
                                  d_scratch, stream);
    if (kind)
        return bf16 ? launch_cluster(kind == 2, (const uint16_t *)d_logits, n, vocab, d_rows,
                                     d_token, d_logprob, stream)
                    : launch_cluster(kind == 2, (const float *)d_logits, n, vocab, d_rows,
                                     d_token, d_logprob, stream);
    if (bf16)
        sampler_kernel<<<n, SAMPLER_THREADS, 0, stream>>>(
            (const uint16_t *)d_logits, vocab, d_rows, d_ids, d_token, d_logprob, d_top_ids,
            d_top_logprobs, (int32_t *)d_scratch);
    else
        sampler_kernel<<<n, SAMPLER_THREADS, 0, stream>>>(
            (const float *)d_logits, vocab, d_rows, d_ids, d_token, d_logprob, d_top_ids,
            d_top_logprobs, (int32_t *)d_scratch);
    CUDA_LAUNCH_TRY();
    return 0;
}
