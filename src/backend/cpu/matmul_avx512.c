/* matmul_avx512.c: the matmul of matmul_avx2.c with 16-lane AVX-512F vectors (used on CPUs that
 * have AVX-512F/BW/VL/DQ). Same scheme and the same per-element operation order rule: one
 * 16-lane accumulator per output element over K chunks of 16, a fixed horizontal reduction, a
 * scalar tail. Tiles: T == 1 walks 8 weight rows; T > 1 uses 4 tokens x 6 rows (24 accumulators
 * + 6 widened weights + 1 activation of the 32 zmm registers). The even/odd bf16 trick of
 * matmul_avx2.c (4 tokens x 4 rows, x permuted in blocks of 32) was measured on a Xeon and lost
 * 5-15% at T = 16 and in prefill: with 32 registers the wider row reuse matters more. */
#include <immintrin.h>

#include "backend/cpu/ops.h"
#include "common.h"

#define INLINE static inline __attribute__((always_inline))

INLINE __m512 load_w16(const void *w, int64_t i, DType dt) {
    if (dt == DTYPE_BF16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    if (dt == DTYPE_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
    return _mm512_loadu_ps((const float *)w + i);
}

INLINE float load_w1(const void *w, int64_t i, DType dt) {
    if (dt == DTYPE_BF16) return bf16_to_f32(((const uint16_t *)w)[i]);
    if (dt == DTYPE_F16) return _cvtsh_ss(((const uint16_t *)w)[i]);
    return ((const float *)w)[i];
}

INLINE float hsum16(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE void tile(const MatmulArgs *a, int t0, int64_t n0, const int TT, const int RR,
                 const DType dt, const int PF) {
    const int64_t K = a->K, K16 = K & ~(int64_t)15;
    const float *x[4];
    __m512 acc[4][8];
    for (int t = 0; t < TT; t++) {
        x[t] = a->x + (int64_t)(t0 + t) * a->ldx;
        for (int r = 0; r < RR; r++) acc[t][r] = _mm512_setzero_ps();
    }
    /* PF: prefetch the next tile's contiguous rows while this one is consumed (see avx2) */
    const char *pf = (const char *)a->w + (n0 + RR) * K * (dt == DTYPE_F32 ? 4 : 2);
    const int64_t pf_step = RR * 16 * (dt == DTYPE_F32 ? 4 : 2);
    for (int64_t k = 0; k < K16; k += 16) {
        if (TT == 1) {
            if (PF)
                for (int64_t b = 0; b < pf_step; b += 64)
                    _mm_prefetch(pf + k / 16 * pf_step + b, _MM_HINT_T0);
            /* widen each weight chunk right where it is used: 8 + 1 registers */
            __m512 xv = _mm512_loadu_ps(x[0] + k);
            for (int r = 0; r < RR; r++)
                acc[0][r] = _mm512_fmadd_ps(xv, load_w16(a->w, (n0 + r) * K + k, dt), acc[0][r]);
            continue;
        }
        __m512 w[8];
        for (int r = 0; r < RR; r++) w[r] = load_w16(a->w, (n0 + r) * K + k, dt);
        for (int t = 0; t < TT; t++) {
            __m512 xv = _mm512_loadu_ps(x[t] + k);
            for (int r = 0; r < RR; r++) acc[t][r] = _mm512_fmadd_ps(xv, w[r], acc[t][r]);
        }
    }
    for (int t = 0; t < TT; t++) {
        for (int r = 0; r < RR; r++) {
            float s = hsum16(acc[t][r]);
            for (int64_t k = K16; k < K; k++) s += x[t][k] * load_w1(a->w, (n0 + r) * K + k, dt);
            if (a->bias) s += a->bias[n0 + r];
            a->y[(int64_t)(t0 + t) * a->ldy + n0 + r] = s;
        }
    }
}

#define DEFINE_TILES(SUF, DT)                                                                      \
    static void tile_1x8_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 1, 8, DT, 0); } \
    static void tile_1x8pf_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 1, 8, DT, 1); } \
    static void tile_1x1_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 1, 1, DT, 0); } \
    static void tile_2x1_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 2, 1, DT, 0); } \
    static void tile_3x1_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 3, 1, DT, 0); } \
    static void tile_4x1_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 4, 1, DT, 0); } \
    static void tile_1x6_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 1, 6, DT, 0); } \
    static void tile_2x6_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 2, 6, DT, 0); } \
    static void tile_3x6_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 3, 6, DT, 0); } \
    static void tile_4x6_##SUF(const MatmulArgs *a, int t0, int64_t n0) { tile(a, t0, n0, 4, 6, DT, 0); } \
    static void rows_##SUF(const MatmulArgs *a, int64_t n0, int64_t n1) {                          \
        typedef void (*TileFn)(const MatmulArgs *, int, int64_t);                                   \
        static const TileFn by_t6[5] = {0, tile_1x6_##SUF, tile_2x6_##SUF, tile_3x6_##SUF,          \
                                        tile_4x6_##SUF};                                            \
        static const TileFn by_t1[5] = {0, tile_1x1_##SUF, tile_2x1_##SUF, tile_3x1_##SUF,          \
                                        tile_4x1_##SUF};                                            \
        int64_t n = n0;                                                                             \
        if (a->T == 1) {                                                                            \
            if (cpu_matmul_prefetch())                                                              \
                for (; n + 8 <= n1; n += 8) tile_1x8pf_##SUF(a, 0, n);                              \
            else                                                                                    \
                for (; n + 8 <= n1; n += 8) tile_1x8_##SUF(a, 0, n);                                \
            for (; n < n1; n++) tile_1x1_##SUF(a, 0, n);                                            \
            return;                                                                                 \
        }                                                                                           \
        for (; n + 6 <= n1; n += 6)                                                                 \
            for (int t = 0; t < a->T; t += 4) by_t6[a->T - t < 4 ? a->T - t : 4](a, t, n);          \
        for (; n < n1; n++)                                                                         \
            for (int t = 0; t < a->T; t += 4) by_t1[a->T - t < 4 ? a->T - t : 4](a, t, n);          \
    }

DEFINE_TILES(bf16, DTYPE_BF16)
DEFINE_TILES(f16, DTYPE_F16)
DEFINE_TILES(f32, DTYPE_F32)

void matmul_rows_avx512(const MatmulArgs *a, int64_t n0, int64_t n1) {
    switch (a->wdt) {
    case DTYPE_BF16: rows_bf16(a, n0, n1); break;
    case DTYPE_F16: rows_f16(a, n0, n1); break;
    default: rows_f32(a, n0, n1); break;
    }
}
