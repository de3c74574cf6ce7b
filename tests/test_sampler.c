/* test_sampler.c: greedy, temperature, top-k, top-p, min-p; frequency checks on a small
 * distribution and exact agreement with a slow full-sort reference on a Qwen3-sized vocabulary. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/sampler.h"
#include "backend/philox.h"

/* The sampler takes one row's parameters; a request's successive draws are the uniforms
 * (seed, 0), (seed, 1), ...: "Sequence" here is that counter. */
typedef SamplingRow SamplingParams;
typedef struct {
    uint64_t seed;
    int n;
} Sequence;

static SamplingParams params(float t, int k, float p, float min_p, int64_t seed) {
    return (SamplingParams){.temperature = t, .top_k = k, .top_p = p, .min_p = min_p,
                            .seed = (uint64_t)seed, .repetition_penalty = 1.0f,
                            .num_logprobs = -1};
}

static Sequence *make_seq(const SamplingParams *p) {
    Sequence *s = calloc(1, sizeof *s);
    s->seed = p->seed;
    return s;
}
#define sequence_destroy free
static double sequence_next_uniform(Sequence *s) { return cvllm_uniform(s->seed, (uint64_t)s->n++); }

/* One draw for s with parameters p (its next uniform). */
static int32_t sample_with(float *x, int vocab, const SamplingParams *p, Sequence *s, void *scratch) {
    SamplingRow r = *p;
    r.seed = s->seed;
    r.num_output = s->n++;
    return sampler_sample(x, vocab, &r, scratch, NULL, NULL, NULL);
}

static uint64_t g_state = 88172645463325252ULL;
static double rnd(void) { /* xorshift64 for test data */
    g_state ^= g_state << 13;
    g_state ^= g_state >> 7;
    g_state ^= g_state << 17;
    return (double)(g_state >> 11) * 0x1.0p-53;
}

static int32_t sample_copy(const float *logits, int vocab, const SamplingParams *p, Sequence *s) {
    float *x = malloc((size_t)vocab * sizeof(float));
    memcpy(x, logits, (size_t)vocab * sizeof(float));
    int32_t t = sample_with(x, vocab, p, s, NULL);
    free(x);
    return t;
}

/* ---------------------------------------------------------------------------------------------
 * Slow reference: full sort by (prob desc, id asc), filters on the sorted list, the same u; with
 * no filter, the race over every key. */

static const float *ref_p;
static int ref_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (ref_p[x] != ref_p[y]) return ref_p[x] > ref_p[y] ? -1 : 1;
    return x < y ? -1 : 1;
}

/* Without a filter (top-k, top-p, min-p): the exponential race (philox.h), slowly: every key in
 * double, the largest key's id (the lowest on ties), the uniforms of draw (seed, index). */
static int32_t reference_race(const float *logits, int vocab, const SamplingParams *p,
                              uint64_t seed, uint64_t index) {
    const CvllmRaceKey k = cvllm_race_key(seed, index);
    int32_t tok = -1;
    double best = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        if (isnan(logits[i])) continue;
        const double u = cvllm_race_uniform(k, (uint32_t)i);
        const double key = logits[i] - (double)p->temperature * log(-log(u));
        if (tok < 0 || key > best) best = key, tok = i;
    }
    return tok < 0 ? 0 : tok;
}

static int32_t reference_sample(const float *logits, int vocab, const SamplingParams *p, double u,
                                uint64_t seed, uint64_t index) {
    if (!(p->top_k > 0 && p->top_k < vocab) && !(p->top_p > 0 && p->top_p < 1) &&
        !(p->min_p > 0))
        return reference_race(logits, vocab, p, seed, index);
    float m = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > m) m = logits[i];
    float *prob = malloc((size_t)vocab * sizeof(float));
    int *idx = malloc((size_t)vocab * sizeof(int));
    for (int i = 0; i < vocab; i++) {
        prob[i] = expf((logits[i] - m) * (1.0f / p->temperature));
        idx[i] = i;
    }
    ref_p = prob;
    qsort(idx, (size_t)vocab, sizeof(int), ref_cmp);
    int n = vocab;
    if (p->top_k > 0 && p->top_k < vocab) n = p->top_k;
    if (p->top_p > 0 && p->top_p < 1) {
        double mass = 0, cum = 0;
        for (int i = 0; i < n; i++) mass += prob[idx[i]];
        int keep = 0;
        while (keep < n && cum < p->top_p * mass) cum += prob[idx[keep++]];
        n = keep < 1 ? 1 : keep;
    }
    /* kept set: the first n in sorted order that pass min-p (p_max weight is 1) */
    char *in = calloc((size_t)vocab, 1);
    for (int i = 0; i < n; i++)
        if (prob[idx[i]] >= p->min_p && prob[idx[i]] > 0) in[idx[i]] = 1;
    /* the draw walks the kept tokens in id order */
    double mass = 0;
    for (int i = 0; i < vocab; i++)
        if (in[i]) mass += prob[i];
    double cum = 0, target = u * mass;
    int32_t tok = -1;
    for (int i = 0; i < vocab; i++) {
        if (!in[i]) continue;
        tok = i;
        cum += prob[i];
        if (cum > target) break;
    }
    free(in);
    free(prob);
    free(idx);
    return tok;
}

/* ---------------------------------------------------------------------------------------------
 * Tests */

static void test_greedy_lowest_id_on_ties(void **state) {
    (void)state;
    float logits[6] = {1, 3, 2, 3, -1, 3};
    SamplingParams p = params(0, 0, 1, 0, 7);
    Sequence *s = make_seq(&p);
    assert_int_equal(sample_copy(logits, 6, &p, s), 1);
    float neg[3] = {-INFINITY, -5, -5};
    assert_int_equal(sample_copy(neg, 3, &p, s), 1);
    sequence_destroy(s);
}

/* Philox4x32-10: the known-answer vectors of the Random123 distribution; the uniforms are a
 * pure function of (seed, index), in [0, 1), distinct across seeds and indices, mean 1/2. */
static void test_philox_uniforms(void **state) {
    (void)state;
    uint32_t c[4] = {0, 0, 0, 0};
    cvllm_philox4x32_10(c, 0, 0);
    assert_true(c[0] == 0x6627e8d5u && c[1] == 0xe169c58du && c[2] == 0xbc57ac4cu && c[3] == 0x9b00dbd8u);
    uint32_t d[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    cvllm_philox4x32_10(d, 0xffffffffu, 0xffffffffu);
    assert_true(d[0] == 0x408f276du && d[1] == 0x41c83b0eu && d[2] == 0xa20bc7c6u && d[3] == 0x6d5451fdu);
    double sum = 0;
    int differ = 0;
    const int n = 100000;
    for (int i = 0; i < n; i++) {
        double x = cvllm_uniform(1234, (uint64_t)i), y = cvllm_uniform(1234, (uint64_t)i),
               z = cvllm_uniform(1235, (uint64_t)i);
        assert_true(x >= 0.0 && x < 1.0);
        assert_true(x == y);
        differ += x != z;
        sum += x;
    }
    assert_true(differ > n - 10);
    double mean = sum / n; /* sd of the mean: 0.2887 / sqrt(n) = 0.0009 */
    assert_true(mean > 0.495 && mean < 0.505);
    assert_true(cvllm_uniform(7, 0) != cvllm_uniform(7, 1ULL << 32)); /* the index's high word counts */
}

/* vLLM's penalties: repetition divides positive / multiplies negative logits of every id seen in
 * the prompt or the output (once per id), frequency subtracts count x penalty and presence the
 * penalty once, for output ids only. Greedy then shows the effect. */
static void test_penalties(void **state) {
    (void)state;
    const int V = 8;
    float base[8] = {2.0f, 1.9f, -1.0f, 0.5f, 0.4f, 0.0f, -3.0f, 1.0f};
    int32_t prompt[2] = {0, 2}, output[3] = {1, 1, 3};
    SamplingRow r = params(0, 0, 1, 0, 1);
    r.prompt_ids = prompt, r.num_prompt = 2, r.output_ids = output, r.num_output = 3;
    float x[8];
    /* repetition 2: 0 -> 1.0, 1 -> 0.95, 2 -> -2.0, 3 -> 0.25; argmax becomes 7 (1.0 ties 0: lower id 0) */
    r.repetition_penalty = 2.0f;
    memcpy(x, base, sizeof x);
    assert_int_equal(sampler_sample(x, V, &r, NULL, NULL, NULL, NULL), 0);
    assert_true(x[0] == 1.0f && x[1] == 0.95f && x[2] == -2.0f && x[3] == 0.25f && x[4] == 0.4f);
    /* frequency 0.5: id 1 (twice) -> 0.9, id 3 -> 0.0; presence 0.25 on top */
    r.repetition_penalty = 1.0f;
    r.frequency_penalty = 0.5f;
    r.presence_penalty = 0.25f;
    memcpy(x, base, sizeof x);
    assert_int_equal(sampler_sample(x, V, &r, NULL, NULL, NULL, NULL), 0);
    assert_true(fabsf(x[1] - 0.65f) < 1e-6f && fabsf(x[3] + 0.25f) < 1e-6f && x[0] == 2.0f && x[2] == -1.0f);
    /* a large presence penalty moves greedy off a repeated id */
    r.frequency_penalty = 0.0f;
    r.presence_penalty = 2.0f;
    float y[8] = {0.0f, 3.0f, -1.0f, 0.5f, 0.4f, 0.0f, -3.0f, 2.5f};
    assert_int_equal(sampler_sample(y, V, &r, NULL, NULL, NULL, NULL), 7);
}

/* Log-probs: log_softmax of the raw logits (before penalties and temperature), the sampled id's
 * and the top k best first, ties by lower id. */
static void test_logprobs(void **state) {
    (void)state;
    const int V = 6;
    float base[6] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, NAN};
    double lse = 0;
    for (int i = 0; i < 5; i++) lse += exp(base[i]);
    lse = log(lse);
    SamplingRow r = params(0, 0, 1, 0, 1);
    r.num_logprobs = 3;
    int32_t prompt[1] = {1};
    r.prompt_ids = prompt, r.num_prompt = 1;
    r.repetition_penalty = 4.0f; /* moves greedy from 1 to 3, not the log-probs */
    float x[6], lp;
    int32_t top[3];
    float tlp[3];
    memcpy(x, base, sizeof x);
    int32_t tok = sampler_sample(x, V, &r, NULL, &lp, top, tlp);
    assert_int_equal(tok, 3);
    assert_true(fabs(lp - (3.0 - lse)) < 1e-5);
    assert_int_equal(top[0], 1);
    assert_int_equal(top[1], 3);
    assert_int_equal(top[2], 2);
    assert_true(fabs(tlp[0] - (3.0 - lse)) < 1e-5 && fabs(tlp[2] - (2.0 - lse)) < 1e-5);
    /* temperature does not change them either */
    r.temperature = 0.5f;
    r.repetition_penalty = 1.0f;
    memcpy(x, base, sizeof x);
    tok = sampler_sample(x, V, &r, NULL, &lp, top, tlp);
    assert_true(fabs(lp - (base[tok] - lse)) < 1e-5);
}

static void fill_random(float *x, int n, int quantize) {
    for (int i = 0; i < n; i++) {
        double v = rnd() * 8 - 4;
        x[i] = quantize ? (float)floor(v * 2) / 2 : (float)v; /* quantized: many ties */
    }
}

static int argmax_ref(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void test_top_k1_and_tiny_top_p_equal_greedy(void **state) {
    (void)state;
    enum { V = 1000 };
    float logits[V];
    SamplingParams pk = params(1.0f, 1, 1, 0, 1), pp = params(0.7f, 0, 1e-6f, 0, 2);
    Sequence *sk = make_seq(&pk), *sp = make_seq(&pp);
    for (int trial = 0; trial < 200; trial++) {
        fill_random(logits, V, trial % 2);
        int g = argmax_ref(logits, V);
        assert_int_equal(sample_copy(logits, V, &pk, sk), g);
        assert_int_equal(sample_copy(logits, V, &pp, sp), g);
    }
    sequence_destroy(sk);
    sequence_destroy(sp);
}

/* Draws n tokens over a 4-token vocabulary and returns the chi-square statistic against want. */
static double chi_square(const float *logits, const SamplingParams *p, const double *want, int n,
                         int *counts) {
    Sequence *s = make_seq(p);
    memset(counts, 0, 4 * sizeof(int));
    for (int i = 0; i < n; i++) counts[sample_copy(logits, 4, p, s)]++;
    sequence_destroy(s);
    double chi = 0;
    for (int i = 0; i < 4; i++) {
        if (want[i] == 0) {
            assert_int_equal(counts[i], 0);
            continue;
        }
        double e = want[i] * n;
        chi += (counts[i] - e) * (counts[i] - e) / e;
    }
    return chi;
}

#define CHI2_DF3_P001 16.27 /* chi-square, 3 degrees of freedom, p = 0.001 */

static void test_temperature_frequencies(void **state) {
    (void)state;
    const double q[4] = {0.5, 0.3, 0.15, 0.05};
    float logits[4];
    for (int i = 0; i < 4; i++) logits[i] = (float)log(q[i]) + 1.5f; /* offset: softmax-invariant */
    const int n = 40000;
    int counts[4];
    const float temps[3] = {1.0f, 0.5f, 2.0f};
    int top_count[3];
    for (int t = 0; t < 3; t++) {
        double want[4], z = 0;
        for (int i = 0; i < 4; i++) z += want[i] = pow(q[i], 1.0 / temps[t]);
        for (int i = 0; i < 4; i++) want[i] /= z;
        SamplingParams p = params(temps[t], 0, 1, 0, 1000 + t);
        double chi = chi_square(logits, &p, want, n, counts);
        if (chi > CHI2_DF3_P001)
            print_error("T=%g counts %d %d %d %d chi2 %.2f\n", temps[t], counts[0], counts[1],
                        counts[2], counts[3], chi);
        assert_true(chi < CHI2_DF3_P001);
        top_count[t] = counts[0];
    }
    assert_true(top_count[1] > top_count[0] && top_count[0] > top_count[2]); /* sharper when cold */
}

static void test_filters_frequencies(void **state) {
    (void)state;
    const double q[4] = {0.5, 0.3, 0.15, 0.05};
    float logits[4];
    for (int i = 0; i < 4; i++) logits[i] = (float)log(q[i]);
    const double two[4] = {0.625, 0.375, 0, 0}, three[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
    int counts[4];
    SamplingParams cases[5] = {
        params(1, 2, 1, 0, 11),       /* top-k 2 */
        params(1, 0, 0.75f, 0, 12),   /* top-p: 0.5 < 0.75 <= 0.8 */
        params(1, 0, 1, 0.5f, 13),    /* min-p: keep p >= 0.25 */
        params(1, 3, 1, 0, 14),       /* top-k 3 */
        params(1, 0, 1, 0.2f, 15),    /* min-p: keep p >= 0.1 */
    };
    const double *want[5] = {two, two, two, three, three};
    for (int c = 0; c < 5; c++) {
        double chi = chi_square(logits, &cases[c], want[c], 20000, counts);
        if (chi > CHI2_DF3_P001)
            print_error("case %d counts %d %d %d %d chi2 %.2f\n", c, counts[0], counts[1],
                        counts[2], counts[3], chi);
        assert_true(chi < CHI2_DF3_P001);
    }
    /* top-p over a top-k: top-k 3 renormalizes to {0.526, 0.316, 0.158}; top-p 0.8 needs 2. */
    SamplingParams kp = params(1, 3, 0.8f, 0, 16);
    double chi = chi_square(logits, &kp, two, 20000, counts);
    assert_true(chi < CHI2_DF3_P001);
}

static void test_seeds(void **state) {
    (void)state;
    enum { V = 50, N = 200 };
    float logits[V];
    fill_random(logits, V, 0);
    SamplingParams p = params(1.0f, 0, 0.95f, 0, 123);
    Sequence *a = make_seq(&p), *b = make_seq(&p);
    p.seed = 124;
    Sequence *c = make_seq(&p);
    int differ = 0;
    for (int i = 0; i < N; i++) {
        int32_t x = sample_copy(logits, V, &p, a), y = sample_copy(logits, V, &p, b),
                z = sample_copy(logits, V, &p, c);
        assert_int_equal(x, y);
        differ += x != z;
    }
    assert_true(differ > N / 2);
    sequence_destroy(a);
    sequence_destroy(b);
    sequence_destroy(c);
}

static void test_matches_reference_on_large_vocab(void **state) {
    (void)state;
    const int V = 151936;
    float *logits = malloc((size_t)V * sizeof(float));
    void *scratch = malloc(sampler_scratch_bytes(V));
    SamplingParams cases[] = {
        params(1.0f, 0, 1, 0, 1),         params(0.8f, 0, 0.9f, 0, 2),
        params(1.0f, 50, 1, 0, 3),        params(0.7f, 50, 0.9f, 0.05f, 4),
        params(1.0f, 0, 1, 0.1f, 5),      params(1.3f, 0, 0.99f, 0, 6),
        params(1.0f, 20000, 0.5f, 0, 7),  params(0.6f, 1, 1, 0, 8),
        params(0.6f, 0, 1, 0, 9),         params(2.0f, 0, 1, 0, 10),
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        Sequence *s = make_seq(&cases[c]);
        for (int trial = 0; trial < 5; trial++) {
            /* peaked (a few large logits) or flat (many comparable ones) */
            double scale = trial % 2 ? 3.0 : 12.0;
            for (int i = 0; i < V; i++) logits[i] = (float)((rnd() - 0.5) * scale);
            Sequence probe = *s; /* same generator state: the same u */
            double u = sequence_next_uniform(&probe);
            int32_t want = reference_sample(logits, V, &cases[c], u, s->seed, (uint64_t)s->n);
            float *x = malloc((size_t)V * sizeof(float));
            memcpy(x, logits, (size_t)V * sizeof(float));
            int32_t got = sample_with(x, V, &cases[c], s, scratch);
            free(x);
            if (got != want) print_error("case %zu trial %d: got %d want %d\n", c, trial, got, want);
            assert_int_equal(got, want);
        }
        sequence_destroy(s);
    }
    free(scratch);
    free(logits);
}

/* NaN and -inf logits are never drawn, +-0 and ties resolve to the lowest id, for the vector
 * passes (sampler_avx2.c) and the scalar ones alike, at every offset within an 8-lane chunk. */
static void test_edge_values(void **state) {
    (void)state;
    const CpuIsa best = cpu_isa_best(), was = cpu_isa_get(); /* the group's ISA, restored */
    for (int isa = CPU_ISA_SCALAR; isa <= (int)best; isa++) {
        cpu_isa_set((CpuIsa)isa);
        for (int at = 0; at < 19; at++) {
            const int V = 37;
            float x[37];
            for (int i = 0; i < V; i++) x[i] = (i % 3 == 0) ? NAN : -INFINITY;
            x[at] = 2.0f;
            x[(at + 11) % V] = 2.0f; /* a tie further on */
            x[(at + 5) % V] = 1.0f;
            SamplingParams g = params(0, 0, 1, 0, 1);
            Sequence *s = make_seq(&g);
            const int lo = at < (at + 11) % V ? at : (at + 11) % V;
            assert_int_equal(sample_copy(x, V, &g, s), lo);
            SamplingParams t = params(1.0f, 0, 1, 0, 9);
            for (int d = 0; d < 50; d++) {
                const int32_t tok = sample_copy(x, V, &t, s);
                assert_true(tok == at || tok == (at + 11) % V || tok == (at + 5) % V);
            }
            sequence_destroy(s);
        }
        float first_nan[9] = {NAN, 1, 5, 5, 2, 3, 4, 0, 1};
        SamplingParams g = params(0, 0, 1, 0, 1);
        Sequence *s = make_seq(&g);
        assert_int_equal(sample_copy(first_nan, 9, &g, s), 2); /* a NaN first does not win */
        float all_nan[3] = {NAN, NAN, NAN};
        assert_int_equal(sample_copy(all_nan, 3, &g, s), 0);
        sequence_destroy(s);
    }
    cpu_isa_set(was);
}

#if defined(__x86_64__)
/* The vector weights directly: exp within 2 ulp of expf, exactly 0 for NaN, -inf and arguments
 * below -87, the sum of what it wrote. */
static void test_avx2_weights(void **state) {
    (void)state;
    if (cpu_isa_best() < CPU_ISA_AVX2) skip();
    enum { N = 45 };
    float x[N], w[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i % 7) - 3.0f + 0.37f * (float)i;
    x[3] = NAN, x[12] = -INFINITY, x[20] = -200.0f, x[44] = NAN;
    const float m = 20.0f, inv_t = 1.0f / 0.6f;
    double total = sampler_weights_avx2(x, w, N, m, inv_t), sum = 0;
    for (int i = 0; i < N; i++) {
        sum += w[i];
        if (i == 3 || i == 12 || i == 20 || i == 44) {
            assert_true(w[i] == 0.0f);
            continue;
        }
        const float want = expf((x[i] - m) * inv_t);
        if (!(fabsf(w[i] - want) <= 3.0f * (nextafterf(want, INFINITY) - want))) print_error("i %d x %g w %.9g want %.9g\n", i, x[i], w[i], want);
        assert_true(fabsf(w[i] - want) <= 3.0f * (nextafterf(want, INFINITY) - want));
    }
    assert_true(fabs(total - sum) <= 1e-12 * sum);
    assert_int_equal(sampler_argmax_avx2(x, N), 41); /* 6 - 3 + 0.37 * 41 = 18.17 */
}

/* Error of got in units of the f32 spacing at want (the exact value, in double). */
static double ulps(float got, double want) {
    const float w = fabsf((float)want);
    return fabs((double)got - want) / (double)(nextafterf(w, INFINITY) - w);
}

/* The vector race's numbers (sampler_race_probe_avx2): uniforms bit-identical to
 * cvllm_race_uniform for ids 0 .. 100000 under a few keys, E = -ln(u) within 2 ulp of the exact
 * value and log2(E) within 3.5 ulp of the exact log2 of that E, also at the ends of the range (the
 * ids of key (0, 0) whose uniforms are 2^-24 and 1 - 2^-24, where E = 2^-24 decides the race;
 * bounds: 1.7 and 3.1 ulp measured over all 2^23 uniforms, sampler_avx2.c),
 * and no log2(E) below that of 1 - 2^-24 (the race's pruning bound). */
static void test_avx2_race_numbers(void **state) {
    (void)state;
    if (cpu_isa_best() < CPU_ISA_AVX2) skip();
    const CvllmRaceKey keys[] = {{0, 0}, {0xffffffffu, 0xffffffffu}, cvllm_race_key(1, 0),
                                 cvllm_race_key(12345, 77), cvllm_race_key(~0ull, 1u << 20)};
    const uint32_t id_lo = 0, id_hi = 20396300; /* key (0, 0): u = 2^-24, 1 - 2^-24 */
    assert_true(cvllm_race_uniform(keys[0], id_lo) == 0x1p-24f);
    assert_true(cvllm_race_uniform(keys[0], id_hi) == 1.0f - 0x1p-24f);
    float u[8], e[8], l2[8], lmin;
    sampler_race_probe_avx2(keys[0], id_hi, u, e, l2);
    assert_true(u[0] == 1.0f - 0x1p-24f);
    lmin = l2[0];
    assert_true(ulps(e[0], -log(1.0 - 0x1p-24)) <= 2.0 && ulps(lmin, log2((double)e[0])) <= 3.5);
    double worst_e = 0, worst_l = 0;
    for (size_t c = 0; c < sizeof(keys) / sizeof(keys[0]); c++)
        for (uint32_t i0 = 0; i0 <= 100000 + (c == 0 ? 8 : 0); i0 += 8) {
            const uint32_t at = c == 0 && i0 > 100000 ? id_hi : i0; /* the extremes once */
            sampler_race_probe_avx2(keys[c], at, u, e, l2);
            for (int l = 0; l < 8; l++) {
                const float want = cvllm_race_uniform(keys[c], at + (uint32_t)l);
                if (memcmp(&u[l], &want, sizeof want))
                    print_error("key %zu id %u: u %a want %a\n", c, at + l, u[l], want);
                assert_memory_equal(&u[l], &want, sizeof want);
                const double de = ulps(e[l], -log((double)want)), dl = ulps(l2[l], log2((double)e[l]));
                worst_e = de > worst_e ? de : worst_e;
                worst_l = dl > worst_l ? dl : worst_l;
                assert_true(de <= 2.0 && dl <= 3.5);
                assert_true(l2[l] >= lmin);
            }
        }
    print_message("race numbers: E within %.2f ulp, log2 E within %.2f ulp\n", worst_e, worst_l);
}

/* One race draw (no filter) of a copy of x with the given ISA. */
static int32_t race_draw(const float *x, int vocab, float t, uint64_t seed, int index, CpuIsa isa,
                         float *copy) {
    cpu_isa_set(isa);
    memcpy(copy, x, (size_t)vocab * sizeof(float));
    SamplingRow r = {.temperature = t, .top_p = 1.0f, .seed = seed, .num_output = index,
                     .repetition_penalty = 1.0f, .num_logprobs = -1};
    return sampler_sample(copy, vocab, &r, NULL, NULL, NULL, NULL);
}

/* A row (V ids, all -inf but two) whose race is an exact tie decided by the id rule: the argmax
 * hi = the last id, x = base, and an id lo < hi with a smaller logit whose key rounds to the
 * same float: key = fma(-t2, log2(E), x) is rounded to multiples of q = ulp(base), about t2 / 32,
 * and both exact keys lie within q / 4 of that multiple, far beyond any few-ulp log error. Both
 * races must return lo (lowest id on ties, even below the argmax whose key starts the race). */
static int exact_tie_row(float *x, int V, float t, uint64_t seed, uint64_t index) {
    const CvllmRaceKey k = cvllm_race_key(seed, index);
    const double t2 = (double)cvllm_race_t2(t);
    const double q = ldexp(1.0, (int)floor(log2(t2)) - 5), base = q * 12582912.0; /* 1.5 2^23 q */
    for (int hi = V - 1; hi > 0; hi--) {
        const double lhi = log2(-log((double)cvllm_race_uniform(k, (uint32_t)hi)));
        const double r = base - t2 * lhi, key = base + q * nearbyint((r - base) / q);
        if (!(fabs(r - key) < 0.25 * q)) continue;
        for (int lo = 0; lo < hi; lo++) {
            const double llo = log2(-log((double)cvllm_race_uniform(k, (uint32_t)lo)));
            if (!(llo < lhi - 2.0)) continue; /* its logit clearly below base */
            const double xlo = base + q * nearbyint((key + t2 * llo - base) / q);
            if (!(fabs(xlo - t2 * llo - key) < 0.25 * q)) continue;
            for (int i = 0; i < V; i++) x[i] = i % 3 ? -INFINITY : NAN;
            x[hi] = (float)base, x[lo] = (float)xlo; /* multiples of q in [2^23 q, 2^24 q): exact */
            return lo;
        }
    }
    return -1;
}

/* The AVX2 race (sampler_race_avx2) against the scalar one: its log is within a few ulp of
 * logf / log2f, so the tokens may differ only where the two best keys are that close: at most 1%
 * of the draws (flat and peaked rows, NaN and -inf sprinkled, ties at the max, logits near 1e7
 * whose keys round to integers so that ids tie, vocabularies with a tail of every length mod 8),
 * and never where the winner is certain (one finite id; one id far above the rest; an exact tie). */
static void test_avx2_race_matches_scalar(void **state) {
    (void)state;
    if (cpu_isa_best() < CPU_ISA_AVX2) skip();
    const CpuIsa was = cpu_isa_get();
    const int vocabs[] = {151936, 37, 1001};
    const float temps[] = {0.6f, 1.0f, 2.0f, 1e-3f};
    float *x = malloc(151936 * sizeof(float)), *copy = malloc(151936 * sizeof(float));
    int draws = 0, differ = 0;
    for (int vi = 0; vi < 3; vi++) {
        const int V = vocabs[vi], per_row = V > 10000 ? 4 : 12;
        for (int ti = 0; ti < 4; ti++)
            for (int kind = 0; kind < 8; kind++) { /* flat / peaked x plain / holes / ties / coarse */
                const double scale = kind % 2 ? 12.0 : 3.0;
                float m = -INFINITY;
                for (int i = 0; i < V; i++) {
                    x[i] = (float)((rnd() - 0.5) * scale);
                    if (kind / 2 == 3) /* keys rounded to integers: exact ties between ids */
                        x[i] = 1e7f + floorf((float)(rnd() * scale));
                    const double h = rnd();
                    if (kind / 2 == 1 && h < 0.1) x[i] = h < 0.05 ? NAN : -INFINITY;
                    m = x[i] > m ? x[i] : m;
                }
                if (kind / 2 == 1) x[0] = NAN, x[V - 1] = -INFINITY;
                if (kind / 2 == 2) /* the max tied three times, one in the tail */
                    x[V / 3] = x[V / 2] = x[V - 2] = m + 0.5f;
                for (int d = 0; d < per_row; d++, draws++) {
                    const uint64_t seed = 1000u * (unsigned)vi + 10u * (unsigned)ti + (unsigned)kind;
                    const int32_t a = race_draw(x, V, temps[ti], seed, d, CPU_ISA_SCALAR, copy);
                    const int32_t b = race_draw(x, V, temps[ti], seed, d, CPU_ISA_AVX2, copy);
                    assert_true(b >= 0 && b < V && !isnan(x[b]) && x[b] > -INFINITY);
                    if (a != b && differ++ < 10)
                        print_message("V %d T %g kind %d draw %d: scalar %d avx2 %d\n", V,
                                      temps[ti], kind, d, a, b);
                }
            }
        /* certain winners: one finite id (at every offset of a group and in the tail), or one id
         * at 60, the rest in [-6, 6] (T <= 2: the others' keys at most 6 + 2 ln2 24 < 40, its
         * own at least 60 - 2 ln2 4.1 > 54) */
        for (int at = 0; at < V; at += V > 100 ? V / 17 + 1 : 1)
            for (int ti = 0; ti < 4; ti++) {
                for (int i = 0; i < V; i++) x[i] = i % 5 ? -INFINITY : NAN;
                x[at] = (float)(rnd() * 4.0 - 2.0);
                assert_int_equal(race_draw(x, V, temps[ti], 7, at, CPU_ISA_AVX2, copy), at);
                assert_int_equal(race_draw(x, V, temps[ti], 7, at, CPU_ISA_SCALAR, copy), at);
                for (int i = 0; i < V; i++) x[i] = (float)((rnd() - 0.5) * 12.0);
                x[at] = 60.0f;
                assert_int_equal(race_draw(x, V, temps[ti], 8, at, CPU_ISA_AVX2, copy), at);
                assert_int_equal(race_draw(x, V, temps[ti], 8, at, CPU_ISA_SCALAR, copy), at);
            }
        for (int ti = 0; ti < 4; ti++) /* exact ties, the lower id below the argmax */
            for (int d = 0; d < 3; d++) {
                const int lo = exact_tie_row(x, V, temps[ti], 11, (uint64_t)d);
                assert_true(lo >= 0);
                assert_int_equal(race_draw(x, V, temps[ti], 11, d, CPU_ISA_SCALAR, copy), lo);
                assert_int_equal(race_draw(x, V, temps[ti], 11, d, CPU_ISA_AVX2, copy), lo);
            }
    }
    print_message("race avx2 vs scalar: %d of %d draws differ\n", differ, draws);
    assert_true(differ * 100 <= draws);
    cpu_isa_set(was);
    free(x);
    free(copy);
}
#endif

/* Every test again on the scalar passes (CVLLM_CPU_ISA=scalar), when the CPU has vector ones. */
static int use_scalar(void **state) {
    (void)state;
    cpu_isa_set(CPU_ISA_SCALAR);
    return 0;
}
static int use_best(void **state) {
    (void)state;
    cpu_isa_set(cpu_isa_best());
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edge_values),
#if defined(__x86_64__)
        cmocka_unit_test(test_avx2_weights),
        cmocka_unit_test(test_avx2_race_numbers),
        cmocka_unit_test(test_avx2_race_matches_scalar),
#endif
        cmocka_unit_test(test_greedy_lowest_id_on_ties),
        cmocka_unit_test(test_philox_uniforms),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_top_k1_and_tiny_top_p_equal_greedy),
        cmocka_unit_test(test_temperature_frequencies),
        cmocka_unit_test(test_filters_frequencies),
        cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_matches_reference_on_large_vocab),
    };
    int rc = cmocka_run_group_tests_name("best isa", tests, use_best, NULL);
    if (cpu_isa_best() != CPU_ISA_SCALAR) rc |= cmocka_run_group_tests_name("scalar", tests, use_scalar, use_best);
    return rc;
}
