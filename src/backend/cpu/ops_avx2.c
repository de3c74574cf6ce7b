/* ops_avx2.c: the AVX2 + FMA attention (one token's query heads of one kv head) and the sum
 * the bandwidth benchmark uses. Same contracts as the reference code in ops.c; the summation
 * order differs (8 lanes, 4 accumulators). */
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

/* q.k over one key row, four accumulators */
static inline float dot_row(const float *q, const float *k, int hd) {
    const int hd32 = hd & ~31, hd8 = hd & ~7;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i < hd32; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(k + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 16), _mm256_loadu_ps(k + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 24), _mm256_loadu_ps(k + i + 24), s3);
    }
    for (; i < hd8; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), s0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < hd; i++) s += q[i] * k[i];
    return s;
}

/* 8 cache elements at p as f32: f32 loaded, bf16 widened (a shift of the zero-extended halves). */
static inline __m256 load8_kv(const void *p, int bf16) {
    if (!bf16) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* q.k over one key row (f32 or bf16), four accumulators */
static inline float dot_row_kv(const float *q, const void *k, int bf16, int hd) {
    if (!bf16) return dot_row(q, k, hd);
    const uint16_t *kb = k;
    const int hd32 = hd & ~31, hd8 = hd & ~7;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i < hd32; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8_kv(kb + i, 1), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8_kv(kb + i + 8, 1), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 16), load8_kv(kb + i + 16, 1), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 24), load8_kv(kb + i + 24, 1), s3);
    }
    for (; i < hd8; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8_kv(kb + i, 1), s0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < hd; i++) {
        union { uint32_t u; float f; } v = {.u = (uint32_t)kb[i] << 16};
        s += q[i] * v.f;
    }
    return s;
}

/* Paged attention of one token for the query heads of kv heads kh0 .. kh1 (same contract as
 * attention_cpu in ops.c). The cache row of a slot holds all kv heads side by side, so walking
 * the slots and, per slot, the kv heads of the range reads memory in order (whole blocks of
 * 16 slots for all kv heads) instead of one head's bytes a page apart. q.k with four
 * accumulators; o accumulated in place over the slots (it stays in L1: heads x head_dim floats).
 * The cache holds f32, or bf16 (kv_bf16) widened on the fly: the arithmetic is f32 either way. */
void attention_heads_avx2(const float *q, float *out, int kh0, int kh1, int group,
                          const void *k_cache, const void *v_cache, int kv_bf16,
                          const int32_t *table, int n, int bs, int64_t kv_stride, int hd,
                          float scale, float *scores) {
    const int nh = (kh1 - kh0) * group, hd8 = hd & ~7;
    const size_t es = kv_bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int j0 = 0; j0 < n; j0 += bs) {
        const int64_t base = (int64_t)table[j0 / bs] * bs * kv_stride;
        const int jn = n - j0 < bs ? n - j0 : bs;
        for (int jj = 0; jj < jn; jj++) {
            const char *krow = (const char *)k_cache + (base + jj * kv_stride) * es;
            for (int kvh = kh0; kvh < kh1; kvh++)
                for (int g = 0; g < group; g++) {
                    const int h = (kvh - kh0) * group + g;
                    scores[(int64_t)h * n + j0 + jj] =
                        dot_row_kv(q + (int64_t)h * hd, krow + (size_t)kvh * hd * es, kv_bf16, hd) * scale;
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
    for (int j0 = 0; j0 < n; j0 += bs) {
        const int64_t base = (int64_t)table[j0 / bs] * bs * kv_stride;
        const int jn = n - j0 < bs ? n - j0 : bs;
        for (int jj = 0; jj < jn; jj++) {
            const char *vrow = (const char *)v_cache + (base + jj * kv_stride) * es;
            for (int kvh = kh0; kvh < kh1; kvh++) {
                const char *v = vrow + (size_t)kvh * hd * es;
                for (int g = 0; g < group; g++) {
                    const int h = (kvh - kh0) * group + g;
                    const float pj = scores[(int64_t)h * n + j0 + jj];
                    const __m256 p = _mm256_set1_ps(pj);
                    float *o = out + (int64_t)h * hd;
                    int i = 0;
                    for (; i < hd8; i += 8)
                        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(p, load8_kv(v + i * es, kv_bf16),
                                                                _mm256_loadu_ps(o + i)));
                    for (; i < hd; i++) {
                        float vi;
                        if (kv_bf16) {
                            union { uint32_t u; float f; } cv = {.u = (uint32_t)((const uint16_t *)v)[i] << 16};
                            vi = cv.f;
                        } else {
                            vi = ((const float *)v)[i];
                        }
                        o[i] += pj * vi;
                    }
                }
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
