/* sampler_avx2.c: the passes over the vocabulary that dominate a sampled token's cost, with
 * AVX2 + FMA (sampler.c calls them when the CPU has it; same contracts as its scalar code):
 *   argmax: the lowest id among the largest values; NaNs never win (all NaN: 0).
 *   weights: w[i] = exp((x[i] - m) * inv_t) with the CPU backend's vector exp (within 2 ulp of
 *           expf); arguments below -87 (weights under 2^-125 of the best token's: -inf logits
 *           among them) and NaN logits weigh exactly 0; returns the sum of w in double.
 *   race: the exponential race (philox.h) with the same uniforms bit for bit and a vector log
 *           within a few ulp of logf / log2f: the scalar race's token except where two keys are
 *           within a few ulp of each other.
 * The results depend only on the row, never on the batch, so seeded draws stay reproducible. */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/sampler.h"
#include "backend/philox.h"

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

/* ---------------------------------------------------------------- the exponential race
 * Key of id i: fma(-t2, log2(E_i), x_i), E_i = -ln(u_i), u_i = cvllm_race_uniform(key, i), as the
 * scalar race (sampler.c), 8 ids at a time, one a lane.
 *
 * Uniforms: the same 32-bit integer hash lane-wise (mullo is the low 32 bits of the product, as
 * uint32_t's *), then (x >> 8) | 1 < 2^24 converted exactly and scaled by 2^-24 exactly: the
 * scalar function's floats bit for bit.
 *
 * Logs: u in [2^-24, 1 - 2^-24] and E in [2^-24, 16.7) are normal, positive and finite, so no
 * special cases. x = 2^e m with m in [sqrt(1/2), sqrt(2)) (musl's trick: the exponent of the bits
 * minus those of sqrt(1/2)), ln(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 3 - 2 sqrt(2) < 0.172,
 * by a true division, as 2s + s z (2/3 + z (2/5 + z (2/7 + z 2/9))), z = s^2 < 0.0295: the series
 * cut after z^4 leaves under z^5 / 10 < 3e-9 relative. This is accurate RELATIVE to ln(m) even
 * for m near 1, where -ln(u) is tiny and decides the race (1 - 2^-24 has E = 2^-24, log2 E = -24;
 * a polynomial in m - 1 with absolute error would lose it): m - 1 is exact (Sterbenz), m + 1 and
 * the division round once each (s within 1 ulp), and 2s plus a correction under 1% of it is one
 * fused rounding: ln(m) within about 1.5 ulp. Then
 *   ln x   = e ln2_hi + (e ln2_lo + ln m) (ln2_hi has 9 bits: e ln2_hi is exact; fused), and
 *   log2 x = e + ln(m) log2(e) (fused); e != 0 only where |ln x| > 0.34 and |log2 x| > 0.5, so
 * neither sum cancels more than a factor 2. Over all 2^23 uniforms (exhaustively, against double):
 * E within 1.7 ulp of -ln(u) and log2(E) within 3.1 ulp of the exact log2 of that E (logf and
 * log2f: within 0.8 by the same measure; test_sampler checks 2 and 3.5). */
#define RACE_LN2_HI 0.693359375f
#define RACE_LN2_LO -2.12194440e-4f
#define RACE_LOG2E 1.44269504088896341f
#define RACE_M_LO_BITS 0x3f3504f3 /* sqrt(1/2) in f32 */
#define RACE_U_MAX (1.0f - 5.9604644775390625e-8f) /* the largest uniform, 1 - 2^-24 */

/* The uniforms of 8 ids, given ic = id * 0x9E3779B1 in each lane (mod 2^32). */
static inline __m256 race_uniform8(__m256i ic, __m256i k0, __m256i k1) {
    __m256i x = _mm256_add_epi32(ic, k0);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846ca68bu));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_xor_si256(x, k1);
    x = _mm256_or_si256(_mm256_srli_epi32(x, 8), _mm256_set1_epi32(1));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(x), _mm256_set1_ps(5.9604644775390625e-8f));
}

/* x (normal, positive, finite) = 2^e m, m in [sqrt(1/2), sqrt(2)): returns ln(m), *e = e. */
static inline __m256 race_log_parts(__m256 x, __m256 *e) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i ei = _mm256_srai_epi32(_mm256_sub_epi32(bits, _mm256_set1_epi32(RACE_M_LO_BITS)), 23);
    const __m256 m = _mm256_castsi256_ps(_mm256_sub_epi32(bits, _mm256_slli_epi32(ei, 23)));
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 s = _mm256_div_ps(_mm256_sub_ps(m, one), _mm256_add_ps(m, one));
    const __m256 z = _mm256_mul_ps(s, s);
    __m256 p = _mm256_set1_ps(2.0f / 9.0f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.0f / 7.0f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.0f / 5.0f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.0f / 3.0f));
    *e = _mm256_cvtepi32_ps(ei);
    return _mm256_fmadd_ps(_mm256_mul_ps(s, z), p, _mm256_add_ps(s, s)); /* 2s + small, one rounding */
}

/* E = -ln(u) into *ev, and returns log2(E). */
static inline __m256 race_log2e8(__m256 u, __m256 *ev) {
    __m256 e;
    __m256 lm = race_log_parts(u, &e);
    const __m256 ln_u = _mm256_fmadd_ps(e, _mm256_set1_ps(RACE_LN2_HI),
                                        _mm256_fmadd_ps(e, _mm256_set1_ps(RACE_LN2_LO), lm));
    const __m256 big_e = _mm256_sub_ps(_mm256_setzero_ps(), ln_u);
    *ev = big_e;
    lm = race_log_parts(big_e, &e);
    return _mm256_fmadd_ps(lm, _mm256_set1_ps(RACE_LOG2E), e);
}

/* The 8 keys of ids with ic = id * 0x9E3779B1, logits xv; nt2 = -t2. */
static inline __m256 race_keys8(__m256 xv, __m256i ic, __m256i k0, __m256i k1, __m256 nt2) {
    __m256 big_e;
    return _mm256_fmadd_ps(nt2, race_log2e8(race_uniform8(ic, k0, k1), &big_e), xv);
}

#define RACE_GOLDEN ((int)0x9E3779B1u)

void sampler_race_probe_avx2(CvllmRaceKey k, uint32_t i0, float u[8], float big_e[8], float l2[8]) {
    const __m256i ic = _mm256_mullo_epi32(
        _mm256_add_epi32(_mm256_set1_epi32((int)i0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
        _mm256_set1_epi32(RACE_GOLDEN));
    const __m256 uv = race_uniform8(ic, _mm256_set1_epi32((int)k.k0), _mm256_set1_epi32((int)k.k1));
    __m256 ev;
    const __m256 lv = race_log2e8(uv, &ev);
    _mm256_storeu_ps(u, uv);
    _mm256_storeu_ps(big_e, ev);
    _mm256_storeu_ps(l2, lv);
}

/* One group of 8 ids: lane l keeps the best (key desc, id asc) of its ids, in best / best_id;
 * NaN keys compare false and never enter. Returns whether any lane changed. */
static inline int race_update(__m256 key, __m256i id, __m256 *best, __m256i *best_id) {
    const __m256 gt = _mm256_cmp_ps(key, *best, _CMP_GT_OQ);
    const __m256 eq = _mm256_cmp_ps(key, *best, _CMP_EQ_OQ);
    const __m256 lower = _mm256_castsi256_ps(_mm256_cmpgt_epi32(*best_id, id));
    const __m256 take = _mm256_or_ps(gt, _mm256_and_ps(eq, lower));
    if (!_mm256_movemask_ps(take)) return 0;
    *best = _mm256_blendv_ps(*best, key, take);
    *best_id = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(*best_id), _mm256_castsi256_ps(id), take));
    return 1;
}

/* The largest lane of v (no NaN), in every lane. */
static inline __m256 race_hmax(__m256 v) {
    v = _mm256_max_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_max_ps(v, _mm256_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm256_max_ps(v, _mm256_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
}

/* Pruning: a key is at most the bound fma(-t2, lmin, x), lmin = this code's log2(E) of the
 * largest uniform (E = 2^-24: log2 E = -24, while the next uniform, 1 - 3 2^-24, has log2 E near
 * -22.4, far beyond any rounding, so lmin is this code's smallest log2 E of all uniforms and fma
 * rounds monotonically). A group whose 8 bounds are all below the best key so far (gbest, a key
 * some id has) cannot hold the winner and its uniforms are not computed: the same token as
 * computing every key. The tail (vocab % 8) runs the same code on a copy padded with NaN logits
 * (never winning), so every id's key is the same function of (x, id) wherever it falls. */
int32_t sampler_race_avx2(const float *x, int vocab, float t2, CvllmRaceKey k, int imax) {
    const __m256i k0 = _mm256_set1_epi32((int)k.k0), k1 = _mm256_set1_epi32((int)k.k1);
    const __m256i golden = _mm256_set1_epi32(RACE_GOLDEN);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 nt2 = _mm256_set1_ps(-t2);
    __m256 ignored;
    const __m256 lmin = race_log2e8(_mm256_set1_ps(RACE_U_MAX), &ignored);
    /* The race starts at imax's key (a finite logit, so a finite key) in every lane. */
    __m256i best_id = _mm256_set1_epi32(imax);
    __m256 best = race_keys8(_mm256_set1_ps(x[imax]), _mm256_mullo_epi32(best_id, golden), k0, k1, nt2);
    __m256 gbest = best;
    __m256i ic = _mm256_mullo_epi32(lane, golden); /* id * 0x9E3779B1, stepped by 8 ids */
    const __m256i ic_step = _mm256_set1_epi32((int)(8u * 0x9E3779B1u));
    int i = 0;
    for (; i + 8 <= vocab; i += 8, ic = _mm256_add_epi32(ic, ic_step)) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        if (!_mm256_movemask_ps(_mm256_cmp_ps(_mm256_fmadd_ps(nt2, lmin, xv), gbest, _CMP_GE_OQ)))
            continue; /* no id can win (NaN bounds compare false) */
        const __m256i id = _mm256_add_epi32(_mm256_set1_epi32(i), lane);
        if (race_update(race_keys8(xv, ic, k0, k1, nt2), id, &best, &best_id)) gbest = race_hmax(best);
    }
    if (i < vocab) {
        float pad[8];
        for (int l = 0; l < 8; l++) pad[l] = i + l < vocab ? x[i + l] : NAN;
        const __m256i id = _mm256_add_epi32(_mm256_set1_epi32(i), lane);
        race_update(race_keys8(_mm256_loadu_ps(pad), ic, k0, k1, nt2), id, &best, &best_id);
    }
    float bk[8];
    int32_t bi[8];
    _mm256_storeu_ps(bk, best);
    _mm256_storeu_si256((__m256i *)bi, best_id);
    int32_t tok = bi[0];
    float key = bk[0];
    for (int l = 1; l < 8; l++)
        if (bk[l] > key || (bk[l] == key && bi[l] < tok)) key = bk[l], tok = bi[l];
    return tok;
}
