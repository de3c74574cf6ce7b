/* sampler_avx2.c: the two passes over the vocabulary that dominate a sampled token's cost,
 * with AVX2 (sampler.c calls them when the CPU has it; same contracts as its scalar code):
 *   argmax: the lowest id among the largest values; NaNs never win (all NaN: 0).
 *   weights: w[i] = exp((x[i] - m) * inv_t) with the CPU backend's vector exp (within 2 ulp of
 *           expf); arguments below -87 (weights under 2^-125 of the best token's: -inf logits
 *           among them) and NaN logits weigh exactly 0; returns the sum of w in double.
 * The results depend only on the row, never on the batch, so seeded draws stay reproducible. */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/sampler.h"

int32_t sampler_argmax_avx2(const float *x, int n) {
    if (n <= 0) return 0;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(_mm256_loadu_ps(x + i), mv); /* NaN: keeps mv */
    float lanes[8], m;
    _mm256_storeu_ps(lanes, mv);
    m = lanes[0]; /* never NaN: max_ps returns its second operand when either is NaN */
    for (int l = 1; l < 8; l++) m = lanes[l] > m ? lanes[l] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    const __m256 target = _mm256_set1_ps(m);
    for (i = 0; i + 8 <= n; i += 8) {
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
        if (mask) return i + __builtin_ctz((unsigned)mask);
    }
    for (; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}

double sampler_weights_avx2(const float *x, float *w, int n, float m, float inv_t) {
    const __m256 mv = _mm256_set1_ps(m), tv = _mm256_set1_ps(inv_t);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(w + i, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), tv));
    for (; i < n; i++) w[i] = (x[i] - m) * inv_t;
    exp_inplace_avx2(w, n);
    const float lo = -87.0f;
    const __m256 lov = _mm256_set1_ps(lo);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 arg = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv), tv);
        const __m256 e = _mm256_and_ps(_mm256_loadu_ps(w + i), _mm256_cmp_ps(arg, lov, _CMP_GE_OQ));
        _mm256_storeu_ps(w + i, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lanes[4], total;
    _mm256_storeu_pd(lanes, _mm256_add_pd(s0, s1));
    total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i++) {
        if (!((x[i] - m) * inv_t >= lo)) w[i] = 0.0f;
        total += w[i];
    }
    return total;
}
