/* matmul_packed_avx2.c: y[T, N] = x[T, K] @ W^T + bias over bf16 weights packed by
 * matmul_pack_bf16 (panels of 16 rows, [K][16] each; see ops.h for the layout and why).
 *
 * Per k a panel gives one 32-byte load: shifted left by 16 it is rows 0-7, ANDed with
 * 0xffff0000 rows 8-15, as f32; x[t][k] is broadcast. Every output element is the chain
 * acc = fma(x[t][k], w[n][k], acc) for k = 0 .. K-1 starting from 0, then acc + bias[n]: the same
 * whatever T, the tile or the thread's panel range, so results are batch invariant.
 *   T == 1 (batch-1 decode, memory-bound): two panels at a time (4 FMA chains, 2 streams).
 *   T > 1: tiles of up to 6 tokens x 1 panel (12 accumulators); the panel (K * 32 bytes) stays
 *   in L1/L2 while the token tiles walk it. */
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
    for (int64_t i = 0; i < nvalid; i++) y[i] = a->bias ? tmp[i] + a->bias[n0 + i] : tmp[i];
}

/* TT tokens (t0 ..) x the panel starting at row n0. The accumulators are named variables, not an
 * array: with an array GCC stores all twelve to the stack on every iteration of the k loop. */
#define TILE_ACC(t)                                                                                \
    const float *x##t = a->x + (int64_t)(t0 + (TT > t ? t : 0)) * a->ldx;                          \
    __m256 c##t##0 = _mm256_setzero_ps(), c##t##1 = _mm256_setzero_ps();
#define TILE_FMA(t)                                                                                \
    if (TT > t) {                                                                                  \
        __m256 xv = _mm256_broadcast_ss(x##t + k);                                                 \
        c##t##0 = _mm256_fmadd_ps(xv, w0, c##t##0);                                                \
        c##t##1 = _mm256_fmadd_ps(xv, w1, c##t##1);                                                \
    }
#define TILE_STORE(t)                                                                              \
    if (TT > t) store_row(a, t0 + t, n0, N, c##t##0, c##t##1);

INLINE void tile(const MatmulArgs *a, int t0, int64_t n0, int64_t N, const int TT) {
    const int64_t K = a->K;
    const uint16_t *p = a->wp + (n0 / 16) * K * 16;
    const __m256i himask = _mm256_set1_epi32((int)0xffff0000u);
    TILE_ACC(0) TILE_ACC(1) TILE_ACC(2) TILE_ACC(3) TILE_ACC(4) TILE_ACC(5)
    for (int64_t k = 0; k < K; k++) {
        __m256i v = _mm256_load_si256((const __m256i *)(p + k * 16));
        __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        __m256 w1 = _mm256_castsi256_ps(_mm256_and_si256(v, himask));
        TILE_FMA(0) TILE_FMA(1) TILE_FMA(2) TILE_FMA(3) TILE_FMA(4) TILE_FMA(5)
    }
    TILE_STORE(0) TILE_STORE(1) TILE_STORE(2) TILE_STORE(3) TILE_STORE(4) TILE_STORE(5)
}
#undef TILE_ACC
#undef TILE_FMA
#undef TILE_STORE

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

#define DEFINE_TILE(TT)                                                                            \
    static void tile_##TT(const MatmulArgs *a, int t0, int64_t n0, int64_t N) {                    \
        tile(a, t0, n0, N, TT);                                                                    \
    }
DEFINE_TILE(1) DEFINE_TILE(2) DEFINE_TILE(3) DEFINE_TILE(4) DEFINE_TILE(5) DEFINE_TILE(6)
#undef DEFINE_TILE

void matmul_rows_packed_avx2(const MatmulArgs *a, int64_t n0, int64_t n1) {
    typedef void (*TileFn)(const MatmulArgs *, int, int64_t, int64_t);
    static const TileFn by_t[7] = {0, tile_1, tile_2, tile_3, tile_4, tile_5, tile_6};
    CHECK(n0 % 16 == 0, "packed matmul rows start at %lld, not a panel boundary", (long long)n0);
    const int64_t N = n1; /* columns past n1 are not written (n1 is a panel boundary or N) */
    int64_t n = n0;
    if (a->T == 1) {
        for (; n + 32 <= n1; n += 32) tile_1x2(a, n, N);
        for (; n < n1; n += 16) tile_1(a, 0, n, N);
        return;
    }
    /* ceil(T / 6) tiles of as even sizes as possible (16 tokens: 6 + 5 + 5, not 6 + 6 + 4): the
     * smaller tiles keep fewer accumulators busy per panel load. (Prefetching the next panel
     * while the first tile runs, and cutting k in blocks that stay in L1, both measured no
     * faster here: the tiles run at the FMA rate with the weights streamed from memory.) */
    const int tiles = (a->T + 5) / 6, base = a->T / tiles, extra = a->T % tiles;
    for (; n < n1; n += 16)
        for (int i = 0, t = 0; i < tiles; i++) {
            const int tt = base + (i < extra);
            by_t[tt](a, t, n, N);
            t += tt;
        }
}
