/* ops_avx2.c: the AVX2 + FMA attention (one token's query heads of one kv head) and the sum
 * the bandwidth benchmark uses. Same contracts as the reference code in ops.c; the summation
 * order differs (8 lanes, 4 accumulators). */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/ops.h"

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

/* Paged attention of `group` query heads sharing one kv head (same contract as attention_cpu in
 * ops.c, for one token): each K row is fetched once for the whole group; o is accumulated in
 * registers 64 columns at a time over all keys (no load/store of o per key). */
void attention_group_avx2(const float *q, float *out, int group, const float *k_cache,
                          const float *v_cache, const int32_t *table, int n, int bs,
                          int64_t kv_stride, int hd, float scale, float *scores) {
    for (int j0 = 0; j0 < n; j0 += bs) {
        const float *kb = k_cache + (int64_t)table[j0 / bs] * bs * kv_stride;
        const int jn = n - j0 < bs ? n - j0 : bs;
        for (int jj = 0; jj < jn; jj++) {
            const float *k = kb + jj * kv_stride;
            if (jj + 2 < jn)
                for (int l = 0; l < hd; l += 16) _mm_prefetch((const char *)(k + 2 * kv_stride + l), _MM_HINT_T0);
            for (int g = 0; g < group; g++) scores[(int64_t)g * n + j0 + jj] = dot_row(q + g * hd, k, hd) * scale;
        }
    }
    for (int g = 0; g < group; g++) {
        float *sc = scores + (int64_t)g * n, *o = out + g * hd;
        float mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
        for (int j = 0; j < n; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        const float inv = 1.0f / sum;
        int c = 0;
        for (; c + 64 <= hd; c += 64) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (int j0 = 0; j0 < n; j0 += bs) {
                const float *vb = v_cache + (int64_t)table[j0 / bs] * bs * kv_stride + c;
                const int jn = n - j0 < bs ? n - j0 : bs;
                for (int jj = 0; jj < jn; jj++) {
                    const float *v = vb + jj * kv_stride;
                    const __m256 p = _mm256_set1_ps(sc[j0 + jj]);
                    a0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v), a0);
                    a1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8), a1);
                    a2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 16), a2);
                    a3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 24), a3);
                    a4 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 32), a4);
                    a5 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 40), a5);
                    a6 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 48), a6);
                    a7 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 56), a7);
                }
            }
            const __m256 vi = _mm256_set1_ps(inv);
            _mm256_storeu_ps(o + c, _mm256_mul_ps(a0, vi));
            _mm256_storeu_ps(o + c + 8, _mm256_mul_ps(a1, vi));
            _mm256_storeu_ps(o + c + 16, _mm256_mul_ps(a2, vi));
            _mm256_storeu_ps(o + c + 24, _mm256_mul_ps(a3, vi));
            _mm256_storeu_ps(o + c + 32, _mm256_mul_ps(a4, vi));
            _mm256_storeu_ps(o + c + 40, _mm256_mul_ps(a5, vi));
            _mm256_storeu_ps(o + c + 48, _mm256_mul_ps(a6, vi));
            _mm256_storeu_ps(o + c + 56, _mm256_mul_ps(a7, vi));
        }
        for (; c < hd; c++) { /* head_dim not a multiple of 64: the rest column by column */
            float a = 0.0f;
            for (int j = 0; j < n; j++)
                a += sc[j] * v_cache[((int64_t)table[j / bs] * bs + j % bs) * kv_stride + c];
            o[c] = a * inv;
        }
    }
}
