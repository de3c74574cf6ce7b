/* matmul_packed_avx2.c: y[T, N] = x[T, K] @ W^T + bias over bf16 weights packed by
 * matmul_pack_bf16 (panels of 16 rows, [K][16] each; see ops.h for the layout and why).
 *
 * Per k a panel gives one 32-byte load: shifted left by 16 it is rows 0-7, ANDed with
 * 0xffff0000 rows 8-15, as f32; x[t][k] is broadcast. Every output element is the chain
 * acc = fma(x[t][k], w[n][k], acc) for k = 0 .. K-1 starting from 0, then acc + bias[n]: the same
 * whatever T, the tile or the thread's panel range, so results are batch invariant.
 *   T == 1 (batch-1 decode, memory-bound): two panels at a time (4 FMA chains, 2 streams).
 *   T > 1: tiles of up to 6 tokens x 1 panel (12 accumulators); the panel (K * 32 bytes) stays
 *   in L1/L2 while the token tiles walk it. The tiles read x interleaved ([K][tile] per tile,
 *   matmul_interleave_x_avx2), so that one pointer walks all of a tile's broadcasts.
 *
 * The T > 1 inner loop is inline assembly. Per k it is 1 load, 2 integer ops, TT broadcasts and
 * 2*TT FMAs; what GCC and clang made of the same loop in intrinsics added 7 address and loop
 * instructions per k (separate pointers per token, spills of the base pointers), or reordered the
 * FMAs into the 132 form. On this project's 2-core Zen 3 VM, where the host's other work shares
 * the cores, the intrinsics loop ran at 66% and 81% of the FMA peak in two runs, the assembly at
 * 84% and 95% in the same minutes (/tmp harness, 6-token tile, K = 1024, the two alternating);
 * at quiet moments both reach the peak. */
#include <immintrin.h>

#include "backend/cpu/ops.h"
#include "common.h"

#define INLINE static inline __attribute__((always_inline))

/* Writes one token's 16 outputs (lo = rows n0..n0+7, hi = n0+8..n0+15) to y row t, columns
 * n0 .. min(n0 + 16, N). The accumulators are passed by value: taking their address would make
 * the compiler spill them to the stack on every iteration of the k loop. */
INLINE void store_row(const MatmulArgs *a, int t, int64_t n0, int64_t N, __m256 lo, __m256 hi) {
    const int64_t nvalid = N - n0 < 16 ? N - n0 : 16;
    float *y = a->y + (int64_t)t * a->ldy + n0;
    if (nvalid == 16 && !a->bias) {
        _mm256_storeu_ps(y, lo);
        _mm256_storeu_ps(y + 8, hi);
        return;
    }
    float tmp[16];
    _mm256_storeu_ps(tmp, lo);
    _mm256_storeu_ps(tmp + 8, hi);
    for (int64_t i = 0; i < nvalid; i++)
        y[i] = a->bias ? tmp[i] + a->bias[n0 + i] : tmp[i];
}

/* ---------------------------------------------------------------- T == 1 */

/* One token x one panel (the last odd panel of a T == 1 range). */
static void tile_1x1(const MatmulArgs *a, int64_t n0, int64_t N) {
    const int64_t K = a->K;
    const uint16_t *p = a->wp + (n0 / 16) * K * 16;
    const __m256i himask = _mm256_set1_epi32((int)0xffff0000u);
    __m256 c0 = _mm256_setzero_ps(), c1 = c0;
    for (int64_t k = 0; k < K; k++) {
        __m256 xv = _mm256_broadcast_ss(a->x + k);
        __m256i v = _mm256_load_si256((const __m256i *)(p + k * 16));
        c0 = _mm256_fmadd_ps(xv, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), c0);
        c1 = _mm256_fmadd_ps(xv, _mm256_castsi256_ps(_mm256_and_si256(v, himask)), c1);
    }
    store_row(a, 0, n0, N, c0, c1);
}

/* One token x two panels (n0, n0 + 16): four independent chains, two streams. */
static void tile_1x2(const MatmulArgs *a, int64_t n0, int64_t N) {
    const int64_t K = a->K;
    const uint16_t *p = a->wp + (n0 / 16) * K * 16, *q = p + K * 16;
    const __m256i himask = _mm256_set1_epi32((int)0xffff0000u);
    const float *x = a->x;
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, q0 = p0, q1 = p0;
    for (int64_t k = 0; k < K; k++) {
        __m256 xv = _mm256_broadcast_ss(x + k);
        __m256i v = _mm256_load_si256((const __m256i *)(p + k * 16));
        __m256i u = _mm256_load_si256((const __m256i *)(q + k * 16));
        p0 = _mm256_fmadd_ps(xv, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), p0);
        p1 = _mm256_fmadd_ps(xv, _mm256_castsi256_ps(_mm256_and_si256(v, himask)), p1);
        q0 = _mm256_fmadd_ps(xv, _mm256_castsi256_ps(_mm256_slli_epi32(u, 16)), q0);
        q1 = _mm256_fmadd_ps(xv, _mm256_castsi256_ps(_mm256_and_si256(u, himask)), q1);
    }
    store_row(a, 0, n0, N, p0, p1);
    store_row(a, 0, n0 + 16, N, q0, q1);
}

/* ---------------------------------------------------------------- T > 1: token tiles */

/* ceil(T / 6) tiles of as even sizes as possible (16 tokens: 6 + 5 + 5, not 6 + 6 + 4): the
 * smaller tiles keep fewer accumulators busy per panel load. */
static int num_tiles(int T) {
    return (T + 5) / 6;
}

int matmul_packed_tile(int T, int i, int *t0) {
    const int tiles = num_tiles(T), base = T / tiles, extra = T % tiles;
    *t0 = i * base + (i < extra ? i : extra);
    return base + (i < extra);
}

/* c[j] lane i = r[i] lane j (an 8 x 8 transpose). */
static inline void transpose8(const __m256 r[8], __m256 c[8]) {
    const __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]), a1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 a2 = _mm256_unpacklo_ps(r[2], r[3]), a3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 a4 = _mm256_unpacklo_ps(r[4], r[5]), a5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 a6 = _mm256_unpacklo_ps(r[6], r[7]), a7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
    const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
    const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
    const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
    c[0] = _mm256_permute2f128_ps(b0, b4, 0x20);
    c[1] = _mm256_permute2f128_ps(b1, b5, 0x20);
    c[2] = _mm256_permute2f128_ps(b2, b6, 0x20);
    c[3] = _mm256_permute2f128_ps(b3, b7, 0x20);
    c[4] = _mm256_permute2f128_ps(b0, b4, 0x31);
    c[5] = _mm256_permute2f128_ps(b1, b5, 0x31);
    c[6] = _mm256_permute2f128_ps(b2, b6, 0x31);
    c[7] = _mm256_permute2f128_ps(b3, b7, 0x31);
}

/* Blocks of 8 k are transposed in registers and stored 8 lanes a k at dst + k * tt, in increasing
 * k, so that the lanes past tt are overwritten by the next k's store; a block is done this way
 * only while its last store stays inside the tile's [K][tt] (masked stores are slow on Zen 3), the
 * rest one element at a time. Only moves floats: the values are x's, bit for bit. */
void matmul_interleave_x_avx2(const float *x, int64_t ldx, int T, int64_t K, float *xi) {
    const int tiles = num_tiles(T);
    for (int i = 0; i < tiles; i++) {
        int t0;
        const int tt = matmul_packed_tile(T, i, &t0);
        float *dst = xi + (int64_t)t0 * K;
        int64_t k = 0;
        for (; (k + 7) * tt + 8 <= K * tt; k += 8) {
            __m256 r[8], c[8];
            for (int t = 0; t < 8; t++)
                r[t] =
                    t < tt ? _mm256_loadu_ps(x + (int64_t)(t0 + t) * ldx + k) : _mm256_setzero_ps();
            transpose8(r, c);
            for (int j = 0; j < 8; j++)
                _mm256_storeu_ps(dst + (k + j) * tt, c[j]);
        }
        for (; k < K; k++)
            for (int t = 0; t < tt; t++)
                dst[k * tt + t] = x[(int64_t)(t0 + t) * ldx + k];
    }
}

/* One k of a TT-token tile, in assembly: J is the k within the unrolled pair. ymm12 / ymm13 =
 * the panel's rows 0-7 / 8-15 as f32, ymm14 the broadcast x[t][k]; c<t>0 / c<t>1 accumulate
 * token t. The FMAs are written acc += x * w, each accumulator a register of its own. */
#define ASM_W(J)                                                                                   \
    "vmovdqa " #J "*32(%[p]), %%ymm12\n\t"                                                         \
    "vpand %%ymm12, %[m], %%ymm13\n\t"                                                             \
    "vpslld $16, %%ymm12, %%ymm12\n\t"
#define ASM_T(J, TT, t)                                                                            \
    "vbroadcastss " #J "*" #TT "*4+" #t "*4(%[x]), %%ymm14\n\t"                                    \
    "vfmadd231ps %%ymm12, %%ymm14, %[c" #t "0]\n\t"                                                \
    "vfmadd231ps %%ymm13, %%ymm14, %[c" #t "1]\n\t"
#define ASM_TOKS_1(J, TT) ASM_T(J, TT, 0)
#define ASM_TOKS_2(J, TT) ASM_TOKS_1(J, TT) ASM_T(J, TT, 1)
#define ASM_TOKS_3(J, TT) ASM_TOKS_2(J, TT) ASM_T(J, TT, 2)
#define ASM_TOKS_4(J, TT) ASM_TOKS_3(J, TT) ASM_T(J, TT, 3)
#define ASM_TOKS_5(J, TT) ASM_TOKS_4(J, TT) ASM_T(J, TT, 4)
#define ASM_TOKS_6(J, TT) ASM_TOKS_5(J, TT) ASM_T(J, TT, 5)
#define ASM_STEP(J, TT) ASM_W(J) ASM_TOKS_##TT(J, TT)

/* The last k when K is odd, in intrinsics (the same operation as the assembly's FMAs). */
#define TAIL_T(t)                                                                                  \
    if (ntok > t) {                                                                                \
        __m256 xv = _mm256_broadcast_ss(x + t);                                                    \
        c##t##0 = _mm256_fmadd_ps(xv, w0, c##t##0);                                                \
        c##t##1 = _mm256_fmadd_ps(xv, w1, c##t##1);                                                \
    }
#define STORE_T(t)                                                                                 \
    if (ntok > t) store_row(a, t0 + t, n0, N, c##t##0, c##t##1);

/* PF: the first tile of a panel brings the panel in from memory; it prefetches 4 KB (128 k) ahead
 * in it, one line per iteration (panels are contiguous, so the end of one prefetches the start of
 * the next). Measured on 2 threads, T = 16, weights streamed, against no prefetch: +7-11% for the
 * shapes of qkv, o_proj, down and the LM head; 2 KB ahead gave +2-10%, 8 KB +3-9%, 0.5-1 KB less.
 * The other tiles find the panel in L1/L2. */
#define ASM_PF_0 ""
#define ASM_PF_1 "prefetcht0 4096(%[p])\n\t"

/* TT tokens (t0 ..; xi = their interleaved [K][TT] block) x the panel starting at row n0. */
/* clang-format off */
#define DEFINE_TILE(TT, PF, NAME)                                                                  \
    static void NAME(const MatmulArgs *a, const float *xi, int t0, int64_t n0, int64_t N) {        \
        const int ntok = TT;                                                                       \
        const int64_t K = a->K, K2 = K & ~(int64_t)1;                                              \
        const uint16_t *p = a->wp + (n0 / 16) * K * 16;                                            \
        const float *x = xi;                                                                       \
        const __m256i himask = _mm256_set1_epi32((int)0xffff0000u);                                \
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;   \
        __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;                   \
        if (K2) {                                                                                  \
            const uint16_t *pe = p + K2 * 16;                                                      \
            __asm__("1:\n\t" ASM_STEP(0, TT) ASM_STEP(1, TT) ASM_PF_##PF                         \
                    "add $64, %[p]\n\t"                                                            \
                    "add $" #TT "*8, %[x]\n\t"                                                     \
                    "cmp %[pe], %[p]\n\t"                                                          \
                    "jb 1b\n\t"                                                                    \
                    : [c00] "+x"(c00), [c01] "+x"(c01), [c10] "+x"(c10), [c11] "+x"(c11),          \
                      [c20] "+x"(c20), [c21] "+x"(c21), [c30] "+x"(c30), [c31] "+x"(c31),          \
                      [c40] "+x"(c40), [c41] "+x"(c41), [c50] "+x"(c50), [c51] "+x"(c51),          \
                      [p] "+r"(p), [x] "+r"(x)                                                     \
                    : [pe] "r"(pe), [m] "x"(himask)                                                \
                    : "xmm12", "xmm13", "xmm14", "cc", "memory");                                  \
        }                                                                                          \
        if (K & 1) {                                                                               \
            __m256i v = _mm256_load_si256((const __m256i *)p);                                     \
            __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));                             \
            __m256 w1 = _mm256_castsi256_ps(_mm256_and_si256(v, himask));                          \
            TAIL_T(0) TAIL_T(1) TAIL_T(2) TAIL_T(3) TAIL_T(4) TAIL_T(5)                            \
        }                                                                                          \
        STORE_T(0) STORE_T(1) STORE_T(2) STORE_T(3) STORE_T(4) STORE_T(5)                          \
    }
DEFINE_TILE(1, 0, tile_1) DEFINE_TILE(2, 0, tile_2) DEFINE_TILE(3, 0, tile_3)
DEFINE_TILE(4, 0, tile_4) DEFINE_TILE(5, 0, tile_5) DEFINE_TILE(6, 0, tile_6)
DEFINE_TILE(1, 1, tile_pf_1) DEFINE_TILE(2, 1, tile_pf_2) DEFINE_TILE(3, 1, tile_pf_3)
DEFINE_TILE(4, 1, tile_pf_4) DEFINE_TILE(5, 1, tile_pf_5) DEFINE_TILE(6, 1, tile_pf_6)
/* clang-format on */
#undef DEFINE_TILE

                void matmul_rows_packed_avx2(const MatmulArgs *a, int64_t n0, int64_t n1) {
    typedef void (*TileFn)(const MatmulArgs *, const float *, int, int64_t, int64_t);
    static const TileFn by_t[7] = {0, tile_1, tile_2, tile_3, tile_4, tile_5, tile_6};
    static const TileFn first[7] = {0,         tile_pf_1, tile_pf_2, tile_pf_3,
                                    tile_pf_4, tile_pf_5, tile_pf_6};
    CHECK(n0 % 16 == 0, "packed matmul rows start at %lld, not a panel boundary", (long long)n0);
    const int64_t N = n1; /* columns past n1 are not written (n1 is a panel boundary or N) */
    int64_t n = n0;
    if (a->T == 1) {
        for (; n + 32 <= n1; n += 32)
            tile_1x2(a, n, N);
        for (; n < n1; n += 16)
            tile_1x1(a, n, N);
        return;
    }
    /* (Prefetching the next panel while the tiles run, and cutting k in blocks that stay in L1,
     * both measured no faster here.) */
    const float *xi = a->xi;
    float *own = NULL;
    if (!xi) { /* no interleaved copy provided (tests, one-off calls): make one */
        own = xmalloc((size_t)a->T * (size_t)a->K * sizeof(float));
        matmul_interleave_x_avx2(a->x, a->ldx, a->T, a->K, own);
        xi = own;
    }
    const int tiles = num_tiles(a->T);
    for (; n < n1; n += 16)
        for (int i = 0; i < tiles; i++) {
            int t0;
            const int tt = matmul_packed_tile(a->T, i, &t0);
            (i == 0 ? first : by_t)[tt](a, xi + (int64_t)t0 * a->K, t0, n, N);
        }
    free(own);
}
