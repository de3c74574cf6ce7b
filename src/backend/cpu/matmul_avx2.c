/* matmul_avx2.c: y[T, N] = x[T, K] @ W[N, K]^T with AVX2 + FMA (+ F16C), W in bf16 / f16 / f32.
 *
 * Vectorized along K: each output element owns one 8-lane accumulator, fed by FMAs over K,
 * then reduced horizontally in a fixed order and finished with a scalar tail. Every tile shape
 * of a dtype follows exactly the same sequence per element, so an element's value depends only
 * on its x row and W row: not on T, the tile, or the thread's row range (batch invariance).
 *
 * bf16 (the hot path): one 32-byte load holds 16 weights as 8 u32 lanes (w[2i] low, w[2i+1]
 * high); a shift left by 16 gives the even weights as f32 and an AND with 0xffff0000 the odd
 * ones: two cheap ops per 16 weights instead of zero-extend + shift per 8. For this x is
 * permuted once per call (matmul_permute_x_avx2: each full block of 16 floats stored evens then
 * odds), and each accumulator gets an even FMA then an odd FMA per 16-chunk.
 * Tiles: T == 1 (batch-1 decode, memory-bound) walks 8 weight rows at once (8 FMA chains, 8
 * streams in flight). T > 1 uses 2 tokens x 4 rows with both tokens' x chunks in registers
 * (8 accumulators + 4 x + 2 widened weights + mask = 15 ymm): each weight chunk is loaded and
 * widened once for 2 tokens, and the loads stay under the FMAs. Of the shapes tried on Zen 3
 * (4x3, 3x3, 4x2, 6x2, 5x2, 2x5, with x from memory or registers) this was the fastest, ~70% of
 * the FMA peak in cache; 12-accumulator tiles spill or become load-bound.
 * f16 weights go through vcvtph2ps, f32 are loaded as they are, with 4 tokens x 3 rows tiles. */
#include <immintrin.h>

#include "backend/cpu/ops.h"
#include "common.h"

#define INLINE static inline __attribute__((always_inline))

INLINE __m256 load_w8(const void *w, int64_t i, DType dt) {
    if (dt == DTYPE_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (dt == DTYPE_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    return _mm256_loadu_ps((const float *)w + i);
}

INLINE float load_w1(const void *w, int64_t i, DType dt) {
    if (dt == DTYPE_BF16) return bf16_to_f32(((const uint16_t *)w)[i]);
    if (dt == DTYPE_F16) return _cvtsh_ss(((const uint16_t *)w)[i]);
    return ((const float *)w)[i];
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[t0 .. t0+TT, n0 .. n0+RR) of the product; TT <= 4, RR <= 8 are compile-time constants. */
INLINE void tile(const MatmulArgs *a, int t0, int64_t n0, const int TT, const int RR,
                 const DType dt) {
    const int64_t K = a->K, K8 = K & ~(int64_t)7;
    const float *x[4];
    __m256 acc[4][8];
    for (int t = 0; t < TT; t++) {
        x[t] = a->x + (int64_t)(t0 + t) * a->ldx;
        for (int r = 0; r < RR; r++) acc[t][r] = _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < K8; k += 8) {
        if (TT == 1) { /* widen each weight chunk right where it is used: 8 + 1 registers */
            __m256 xv = _mm256_loadu_ps(x[0] + k);
            for (int r = 0; r < RR; r++)
                acc[0][r] = _mm256_fmadd_ps(xv, load_w8(a->w, (n0 + r) * K + k, dt), acc[0][r]);
            continue;
        }
        __m256 w[8];
        for (int r = 0; r < RR; r++) w[r] = load_w8(a->w, (n0 + r) * K + k, dt);
        for (int t = 0; t < TT; t++) {
            __m256 xv = _mm256_loadu_ps(x[t] + k);
            for (int r = 0; r < RR; r++) acc[t][r] = _mm256_fmadd_ps(xv, w[r], acc[t][r]);
        }
    }
    for (int t = 0; t < TT; t++) {
        for (int r = 0; r < RR; r++) {
            float s = hsum8(acc[t][r]);
            for (int64_t k = K8; k < K; k++) s += x[t][k] * load_w1(a->w, (n0 + r) * K + k, dt);
            if (a->bias) s += a->bias[n0 + r];
            a->y[(int64_t)(t0 + t) * a->ldy + n0 + r] = s;
        }
    }
}


void matmul_permute_x_avx2(const float *x, int64_t ldx, int T, int64_t K, float *xp) {
    const int64_t K16 = K & ~(int64_t)15;
    for (int t = 0; t < T; t++) {
        const float *src = x + (int64_t)t * ldx;
        float *dst = xp + (int64_t)t * K;
        for (int64_t k = 0; k < K16; k += 16) {
            __m256 lo = _mm256_loadu_ps(src + k), hi = _mm256_loadu_ps(src + k + 8);
            /* per 128-bit lane: (x0 x2 x8 x10 | x4 x6 x12 x14), then 64-bit units reordered */
            __m256 ev = _mm256_shuffle_ps(lo, hi, 0x88), od = _mm256_shuffle_ps(lo, hi, 0xDD);
            ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8));
            od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xD8));
            _mm256_storeu_ps(dst + k, ev);
            _mm256_storeu_ps(dst + k + 8, od);
        }
        for (int64_t k = K16; k < K; k++) dst[k] = src[k];
    }
}

/* bf16 tile over permuted activations xp [T, K] (row stride K). */
INLINE void tile_bf16p(const MatmulArgs *a, const float *xp, int t0, int64_t n0, const int TT,
                       const int RR, const int PF) {
    const int64_t K = a->K, K16 = K & ~(int64_t)15;
    const uint16_t *w = a->w;
    const __m256i himask = _mm256_set1_epi32((int)0xffff0000u);
    const float *x[2];
    __m256 acc[2][8];
    for (int t = 0; t < TT; t++) {
        x[t] = xp + (int64_t)(t0 + t) * K;
        for (int r = 0; r < RR; r++) acc[t][r] = _mm256_setzero_ps();
    }
    /* PF (T == 1, memory-bound): the tile's RR rows are one contiguous run of bytes, and while
     * it is consumed the next tile's run is prefetched at the same pace. +13-30% GB/s on a Xeon
     * (one core's own misses cannot cover the latency), -10-25% on Zen 3: see
     * cpu_matmul_prefetch() */
    const char *pf = (const char *)(w + (n0 + RR) * K);
    const int64_t pf_step = RR * 2 * 16; /* bytes of the tile consumed per 16-chunk */
    for (int64_t k = 0; k < K16; k += 16) {
        if (PF)
            for (int64_t b = 0; b < pf_step; b += 64)
                _mm_prefetch(pf + k / 16 * pf_step + b, _MM_HINT_T0);
        for (int r = 0; r < RR; r++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + (n0 + r) * K + k));
            __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, himask));
            for (int t = 0; t < TT; t++) {
                acc[t][r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[t] + k), we, acc[t][r]);
                acc[t][r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[t] + k + 8), wo, acc[t][r]);
            }
        }
    }
    for (int t = 0; t < TT; t++) {
        for (int r = 0; r < RR; r++) {
            float s = hsum8(acc[t][r]);
            for (int64_t k = K16; k < K; k++) s += x[t][k] * bf16_to_f32(w[(n0 + r) * K + k]);
            if (a->bias) s += a->bias[n0 + r];
            a->y[(int64_t)(t0 + t) * a->ldy + n0 + r] = s;
        }
    }
}

#define P(TT, RR)                                                                                  \
    static void tp_##TT##x##RR(const MatmulArgs *a, int t0, int64_t n0) {                          \
        tile_bf16p(a, a->xp, t0, n0, TT, RR, 0);                                                   \
    }
P(1, 8) P(2, 4) P(1, 4) P(2, 1) P(1, 1)
#undef P
static void tp_1x8_pf(const MatmulArgs *a, int t0, int64_t n0) { tile_bf16p(a, a->xp, t0, n0, 1, 8, 1); }

static void rows_bf16p(const MatmulArgs *a, int64_t n0, int64_t n1) {
    int64_t n = n0;
    if (a->T == 1) {
        if (cpu_matmul_prefetch())
            for (; n + 8 <= n1; n += 8) tp_1x8_pf(a, 0, n);
        else
            for (; n + 8 <= n1; n += 8) tp_1x8(a, 0, n);
        for (; n < n1; n++) tp_1x1(a, 0, n);
        return;
    }
    const int T2 = a->T & ~1;
    for (; n + 4 <= n1; n += 4) {
        for (int t = 0; t < T2; t += 2) tp_2x4(a, t, n);
        if (T2 < a->T) tp_1x4(a, T2, n);
    }
    for (; n < n1; n++) {
        for (int t = 0; t < T2; t += 2) tp_2x1(a, t, n);
        if (T2 < a->T) tp_1x1(a, T2, n);
    }
}

#define DEFINE_TILES(SUF, DT)                                                                      \
    static void tile_1x8_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 1, 8, DT); } \
    static void tile_1x1_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 1, 1, DT); } \
    static void tile_2x1_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 2, 1, DT); } \
    static void tile_3x1_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 3, 1, DT); } \
    static void tile_4x1_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 4, 1, DT); } \
    static void tile_1x3_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 1, 3, DT); } \
    static void tile_2x3_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 2, 3, DT); } \
    static void tile_3x3_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 3, 3, DT); } \
    static void tile_4x3_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 4, 3, DT); } \
    static void rows_##SUF(const MatmulArgs *a, int64_t n0, int64_t n1) {                          \
        typedef void (*TileFn)(const MatmulArgs *, int, int64_t);                                   \
        static const TileFn by_t3[5] = {0, tile_1x3_##SUF, tile_2x3_##SUF, tile_3x3_##SUF,          \
                                        tile_4x3_##SUF};                                            \
        static const TileFn by_t1[5] = {0, tile_1x1_##SUF, tile_2x1_##SUF, tile_3x1_##SUF,          \
                                        tile_4x1_##SUF};                                            \
        int64_t n = n0;                                                                             \
        if (a->T == 1) {                                                                            \
            for (; n + 8 <= n1; n += 8) tile_1x8_##SUF(a, 0, n);                                    \
            for (; n < n1; n++) tile_1x1_##SUF(a, 0, n);                                            \
            return;                                                                                 \
        }                                                                                           \
        for (; n + 3 <= n1; n += 3)                                                                 \
            for (int t = 0; t < a->T; t += 4) by_t3[a->T - t < 4 ? a->T - t : 4](a, t, n);          \
        for (; n < n1; n++)                                                                         \
            for (int t = 0; t < a->T; t += 4) by_t1[a->T - t < 4 ? a->T - t : 4](a, t, n);          \
    }

DEFINE_TILES(f16, DTYPE_F16)
DEFINE_TILES(f32, DTYPE_F32)

void matmul_rows_avx2(const MatmulArgs *a, int64_t n0, int64_t n1) {
    switch (a->wdt) {
    case DTYPE_BF16:
        if (a->xp) {
            rows_bf16p(a, n0, n1);
        } else { /* no permuted copy provided (tests, one-off calls): make one */
            MatmulArgs b = *a;
            float *xp = xmalloc((size_t)a->T * (size_t)a->K * sizeof(float));
            matmul_permute_x_avx2(a->x, a->ldx, a->T, a->K, xp);
            b.xp = xp;
            rows_bf16p(&b, n0, n1);
            free(xp);
        }
        break;
    case DTYPE_F16: rows_f16(a, n0, n1); break;
    default: rows_f32(a, n0, n1); break;
    }
}
