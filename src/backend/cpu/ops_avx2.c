/* ops_avx2.c: the AVX2 + FMA attention (one token's query heads of a range of kv heads), RMSNorm,
 * exp / silu, and the sum the bandwidth benchmark uses. Same contracts as the reference code in
 * ops.c; sums run in another order (8 lanes, several accumulators), the same for every token. */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/ops.h"

void exp_inplace_avx2(float *x, int64_t n);

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float sum_f32_avx2(const float *x, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(x + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(x + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(x + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(x + i + 24));
    }
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += x[i];
    return s;
}

void rmsnorm_avx2(float *y, const float *x, const float *w, int n, float eps) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8),
                     c = _mm256_loadu_ps(x + i + 16), d = _mm256_loadu_ps(x + i + 24);
        s0 = _mm256_fmadd_ps(a, a, s0);
        s1 = _mm256_fmadd_ps(b, b, s1);
        s2 = _mm256_fmadd_ps(c, c, s2);
        s3 = _mm256_fmadd_ps(d, d, s3);
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 a = _mm256_loadu_ps(x + i);
        s0 = _mm256_fmadd_ps(a, a, s0);
    }
    float ss = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    const __m256 rv = _mm256_set1_ps(r);
    for (i = 0; i + 8 <= n; i += 8) /* (x * r) * w, as the scalar loop */
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv),
                                              _mm256_loadu_ps(w + i)));
    for (; i < n; i++) y[i] = (x[i] * r) * w[i];
}

/* 8 cache elements at p as f32: f32 loaded, bf16 widened (a shift of the zero-extended halves). */
static inline __m256 load8_kv(const void *p, int bf16) {
    if (!bf16) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Paged attention of one token for the query heads of kv heads kh0 .. kh1 (same contract as
 * attention_cpu in ops.c). A cache row (slot) holds all kv heads side by side, so the keys and
 * values are walked a group of 8 slots at a time and, per group, kv head after kv head: memory
 * is read in order, 8 rows at once. (Prefetching the next group's rows by hand measured slower
 * at 16 sequences and no faster at one.)
 *   q.k: 8 slots at once, one accumulator per slot over head_dim, reduced together by a
 *        transposing add tree: every slot's score is the same sum in the same order wherever it
 *        falls in a group (a short last group repeats its last row and drops the extra lanes).
 *   p.v: o[h] += p[j] * v[j] for j in order, a group's 8 slots per load/store of o (o stays in
 *        L1: heads x head_dim floats); the same fused chain whatever the grouping.
 * The cache holds f32, or bf16 (kv_bf16) widened on the fly: the arithmetic is f32 either way. */
#define SLOTS 8

/* lane s of the result = the sum of the 8 lanes of a[s] */
static inline __m256 reduce8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                               __m256 a6, __m256 a7) {
    const __m256 h01 = _mm256_hadd_ps(a0, a1), h23 = _mm256_hadd_ps(a2, a3);
    const __m256 h45 = _mm256_hadd_ps(a4, a5), h67 = _mm256_hadd_ps(a6, a7);
    const __m256 q0 = _mm256_hadd_ps(h01, h23), q1 = _mm256_hadd_ps(h45, h67);
    /* q0 = [s0 s1 s2 s3 (lanes 0-3 half) | s0 s1 s2 s3 (lanes 4-7 half)], q1 likewise s4..s7 */
    const __m256 lo = _mm256_permute2f128_ps(q0, q1, 0x20), hi = _mm256_permute2f128_ps(q0, q1, 0x31);
    return _mm256_add_ps(lo, hi);
}

static inline float kv_elem(const void *row, int bf16, int i) {
    if (!bf16) return ((const float *)row)[i];
    union { uint32_t u; float f; } v = {.u = (uint32_t)((const uint16_t *)row)[i] << 16};
    return v.f;
}

/* Rows of slots j0 .. j0+m (m <= SLOTS) of one layer's cache, the last repeated up to SLOTS. */
static inline void group_rows(const char **rows, const void *cache, const int32_t *table, int j0,
                              int m, int bs, size_t row_bytes) {
    for (int s = 0; s < SLOTS; s++) {
        const int j = j0 + (s < m ? s : m - 1);
        rows[s] = (const char *)cache + ((size_t)table[j / bs] * bs + j % bs) * row_bytes;
    }
}

/* The inner loops, one copy per cache dtype (BF16 a constant) and out of line, so that the
 * eight row pointers, eight accumulators and q/p stay in registers. */
#define KV_ROW(r, e) load8_kv((r) + (size_t)(e)*es, bf16)
#define DEFINE_GROUP_KERNELS(SUFFIX, BF16)                                                         \
    /* lane s = q . row s over [0, hd8) */                                                         \
    static __attribute__((noinline)) __m256 qk_group_##SUFFIX(const float *qh,                     \
                                                              const char *const *rows, size_t off, \
                                                              int hd8) {                           \
        const int bf16 = BF16;                                                                     \
        const size_t es = bf16 ? 2 : 4;                                                            \
        const char *r0 = rows[0] + off, *r1 = rows[1] + off, *r2 = rows[2] + off,                  \
                   *r3 = rows[3] + off, *r4 = rows[4] + off, *r5 = rows[5] + off,                  \
                   *r6 = rows[6] + off, *r7 = rows[7] + off;                                       \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,     \
               a7 = a0;                                                                            \
        for (int i = 0; i < hd8; i += 8) {                                                         \
            const __m256 qv = _mm256_loadu_ps(qh + i);                                             \
            a0 = _mm256_fmadd_ps(qv, KV_ROW(r0, i), a0);                                           \
            a1 = _mm256_fmadd_ps(qv, KV_ROW(r1, i), a1);                                           \
            a2 = _mm256_fmadd_ps(qv, KV_ROW(r2, i), a2);                                           \
            a3 = _mm256_fmadd_ps(qv, KV_ROW(r3, i), a3);                                           \
            a4 = _mm256_fmadd_ps(qv, KV_ROW(r4, i), a4);                                           \
            a5 = _mm256_fmadd_ps(qv, KV_ROW(r5, i), a5);                                           \
            a6 = _mm256_fmadd_ps(qv, KV_ROW(r6, i), a6);                                           \
            a7 = _mm256_fmadd_ps(qv, KV_ROW(r7, i), a7);                                           \
        }                                                                                          \
        return reduce8x8(a0, a1, a2, a3, a4, a5, a6, a7);                                          \
    }                                                                                              \
    /* o[0, hd8) += p[s] * row s, s = 0..7 in order */                                             \
    static __attribute__((noinline)) void pv_group_##SUFFIX(float *o, const float *p,              \
                                                            const char *const *rows, size_t off,   \
                                                            int hd8) {                             \
        const int bf16 = BF16;                                                                     \
        const size_t es = bf16 ? 2 : 4;                                                            \
        const char *r0 = rows[0] + off, *r1 = rows[1] + off, *r2 = rows[2] + off,                  \
                   *r3 = rows[3] + off, *r4 = rows[4] + off, *r5 = rows[5] + off,                  \
                   *r6 = rows[6] + off, *r7 = rows[7] + off;                                       \
        const __m256 p0 = _mm256_set1_ps(p[0]), p1 = _mm256_set1_ps(p[1]),                         \
                     p2 = _mm256_set1_ps(p[2]), p3 = _mm256_set1_ps(p[3]),                         \
                     p4 = _mm256_set1_ps(p[4]), p5 = _mm256_set1_ps(p[5]),                         \
                     p6 = _mm256_set1_ps(p[6]), p7 = _mm256_set1_ps(p[7]);                         \
        for (int i = 0; i < hd8; i += 8) {                                                         \
            __m256 acc = _mm256_loadu_ps(o + i);                                                   \
            acc = _mm256_fmadd_ps(p0, KV_ROW(r0, i), acc);                                         \
            acc = _mm256_fmadd_ps(p1, KV_ROW(r1, i), acc);                                         \
            acc = _mm256_fmadd_ps(p2, KV_ROW(r2, i), acc);                                         \
            acc = _mm256_fmadd_ps(p3, KV_ROW(r3, i), acc);                                         \
            acc = _mm256_fmadd_ps(p4, KV_ROW(r4, i), acc);                                         \
            acc = _mm256_fmadd_ps(p5, KV_ROW(r5, i), acc);                                         \
            acc = _mm256_fmadd_ps(p6, KV_ROW(r6, i), acc);                                         \
            acc = _mm256_fmadd_ps(p7, KV_ROW(r7, i), acc);                                         \
            _mm256_storeu_ps(o + i, acc);                                                          \
        }                                                                                          \
    }
DEFINE_GROUP_KERNELS(f32, 0)
DEFINE_GROUP_KERNELS(bf16, 1)
#undef DEFINE_GROUP_KERNELS
#undef KV_ROW

void attention_heads_avx2(const float *q, float *out, int kh0, int kh1, int group,
                          const void *k_cache, const void *v_cache, int kv_bf16,
                          const int32_t *table, int n, int bs, int64_t kv_stride, int hd,
                          float scale, float *scores) {
    const int nh = (kh1 - kh0) * group, hd8 = hd & ~7;
    const size_t es = kv_bf16 ? sizeof(uint16_t) : sizeof(float), row_bytes = (size_t)kv_stride * es;
    __m256 (*qk_group)(const float *, const char *const *, size_t, int) =
        kv_bf16 ? qk_group_bf16 : qk_group_f32;
    void (*pv_group)(float *, const float *, const char *const *, size_t, int) =
        kv_bf16 ? pv_group_bf16 : pv_group_f32;
    const char *rows[SLOTS];
    for (int j0 = 0; j0 < n; j0 += SLOTS) {
        const int m = n - j0 < SLOTS ? n - j0 : SLOTS;
        group_rows(rows, k_cache, table, j0, m, bs, row_bytes);
        for (int kvh = kh0; kvh < kh1; kvh++) {
            const size_t off = (size_t)kvh * hd * es;
            for (int g = 0; g < group; g++) {
                const int h = (kvh - kh0) * group + g;
                const float *qh = q + (int64_t)h * hd;
                float d[SLOTS];
                _mm256_storeu_ps(d, qk_group(qh, rows, off, hd8));
                float *sc = scores + (int64_t)h * n + j0;
                for (int s = 0; s < m; s++) {
                    float v = d[s];
                    for (int i = hd8; i < hd; i++) v += qh[i] * kv_elem(rows[s] + off, kv_bf16, i);
                    sc[s] = v * scale;
                }
            }
        }
    }
    for (int h = 0; h < nh; h++) {
        float *sc = scores + (int64_t)h * n, mx = -INFINITY;
        for (int j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
        for (int j = 0; j < n; j++) sc[j] -= mx;
        exp_inplace_avx2(sc, n);
    }
    for (int i = 0; i < nh * hd; i++) out[i] = 0.0f;
    for (int j0 = 0; j0 < n; j0 += SLOTS) {
        const int m = n - j0 < SLOTS ? n - j0 : SLOTS;
        group_rows(rows, v_cache, table, j0, m, bs, row_bytes);
        for (int kvh = kh0; kvh < kh1; kvh++) {
            const size_t off = (size_t)kvh * hd * es;
            for (int g = 0; g < group; g++) {
                const int h = (kvh - kh0) * group + g;
                const float *p = scores + (int64_t)h * n + j0;
                float *o = out + (int64_t)h * hd;
                if (m == SLOTS) {
                    pv_group(o, p, rows, off, hd8);
                } else {
                    for (int i = 0; i < hd8; i += 8) {
                        const size_t e = off + (size_t)i * es;
                        __m256 acc = _mm256_loadu_ps(o + i);
                        for (int s = 0; s < m; s++)
                            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[s]), load8_kv(rows[s] + e, kv_bf16), acc);
                        _mm256_storeu_ps(o + i, acc);
                    }
                }
                for (int i = hd8; i < hd; i++)
                    for (int s = 0; s < m; s++) o[i] = fmaf(p[s], kv_elem(rows[s] + off, kv_bf16, i), o[i]);
            }
        }
    }
    for (int h = 0; h < nh; h++) {
        const float *sc = scores + (int64_t)h * n;
        float sum = 0.0f;
        for (int j = 0; j < n; j++) sum += sc[j];
        const float inv = 1.0f / sum;
        float *o = out + (int64_t)h * hd;
        for (int i = 0; i < hd; i++) o[i] *= inv;
    }
}
#undef SLOTS

/* ---------------------------------------------------------------- exp and silu
 * exp(x) as Cephes' expf: n = round(x * log2(e)), r = x - n * ln2 (ln2 split in two, each step
 * fused), a degree-5 polynomial times r^2 plus r + 1, scaled by 2^n; within 2 ulp of expf over
 * [-87.3, 88.7] (inputs are clamped there). The vector and scalar versions do the same fused
 * operations in the same order, so an element's value does not depend on whether it fell in a
 * vector or in the tail (batch invariance). */
#define EXP_HI 88.7228f
#define EXP_LO -87.3365f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1 0.693359375f
#define EXP_C2 -2.12194440e-4f
static const float EXP_P[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline __m256 exp_avx2(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C1), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_C2), r);
    __m256 y = _mm256_set1_ps(EXP_P[0]);
    for (int i = 1; i < 6; i++) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P[i]));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

float exp_avx2_scalar(float x) {
    x = fminf(fmaxf(x, EXP_LO), EXP_HI);
    float n = nearbyintf(x * EXP_LOG2E);
    float r = fmaf(-n, EXP_C1, x);
    r = fmaf(-n, EXP_C2, r);
    float y = EXP_P[0];
    for (int i = 1; i < 6; i++) y = fmaf(y, r, EXP_P[i]);
    y = fmaf(y, r * r, r + 1.0f);
    union { uint32_t u; float f; } e = {.u = (uint32_t)((int32_t)n + 127) << 23};
    return y * e.f;
}

void exp_inplace_avx2(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp_avx2(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) x[i] = exp_avx2_scalar(x[i]);
}

void silu_mul_avx2(float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 d = _mm256_add_ps(one, exp_avx2(_mm256_sub_ps(zero, x)));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, d), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + exp_avx2_scalar(-g[i])) * u[i];
}
