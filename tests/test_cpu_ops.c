/* test_cpu_ops.c: every CPU kernel (scalar reference and each fast variant this CPU runs) against
 * a slow, obvious version written here, on random inputs of awkward sizes.
 *
 * Tolerances: the matmul error is measured against sum_k |x_k w_k| (the natural bound for a
 * reordered f32 sum): |y - ref| <= 1e-5 * sum|x w| + 1e-30. The reference accumulates in double.
 * rmsnorm / rope / attention: relative 2e-5 against double-precision formulas. Thread counts 1
 * and 2 must agree bit for bit, and so must a token computed alone or inside a batch.
 * fp8 e4m3 conversions: exact, against a brute-force nearest-even search over the 127 finite
 * magnitudes, and (in a CUDA build) bit for bit against the host path of CUDA's cuda_fp8.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "common.h"

#ifdef CVLLM_HAVE_CUDA
#include <cuda_fp8.h> /* its __host__ conversions: the software twin of the device's cvt */
#endif

/* ---------------------------------------------------------------- helpers */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / (1ull << 23)) - 1.0);
}

static void *random_weights(DType dt, int64_t n, float scale) {
    void *w = xmalloc((size_t)n * dtype_size(dt));
    for (int64_t i = 0; i < n; i++) {
        float v = frand() * scale;
        if (dt == DTYPE_BF16) ((uint16_t *)w)[i] = f32_to_bf16(v);
        else if (dt == DTYPE_F16) ((uint16_t *)w)[i] = f32_to_f16(v);
        else ((float *)w)[i] = v;
    }
    return w;
}

static double weight_at(const void *w, DType dt, int64_t i) {
    if (dt == DTYPE_BF16) return bf16_to_f32(((const uint16_t *)w)[i]);
    if (dt == DTYPE_F16) return f16_to_f32(((const uint16_t *)w)[i]);
    return ((const float *)w)[i];
}

static const CpuIsa ALL_ISAS[] = {CPU_ISA_SCALAR, CPU_ISA_AVX2, CPU_ISA_AVX512};
static int isa_available(CpuIsa isa) { return isa <= cpu_isa_best(); }

/* ---------------------------------------------------------------- thread pool */

typedef struct {
    int *count; /* [tasks] */
    int *thread_ok;
    int nth;
} PoolJob;

static void pool_task(void *ctx, int64_t task, int thread) {
    PoolJob *j = ctx;
    __atomic_fetch_add(&j->count[task], 1, __ATOMIC_RELAXED);
    if (thread < 0 || thread >= j->nth) *j->thread_ok = 0;
}

/* every task runs exactly once per job, across more jobs than the 16-bit generation counter
 * can number (it wraps) */
static void test_threadpool_each_task_once(void **state) {
    (void)state;
    ThreadPool *pool = threadpool_create(3);
    assert_int_equal(threadpool_size(pool), 3);
    int count[37] = {0}, ok = 1;
    PoolJob j = {count, &ok, 3};
    const int jobs = 70000;
    for (int r = 0; r < jobs; r++) threadpool_run(pool, pool_task, &j, 1 + r % 37);
    for (int t = 0; t < 37; t++) {
        int expect = 0;
        for (int r = 0; r < jobs; r++) expect += t < 1 + r % 37;
        assert_int_equal(count[t], expect);
    }
    assert_true(ok);
    threadpool_run(pool, pool_task, &j, 0); /* no tasks: returns */
    threadpool_destroy(pool);
    threadpool_destroy(NULL);
}

/* ---------------------------------------------------------------- matmul */

/* packed: bf16 weights through matmul_pack_bf16 and the packed AVX2 kernel */
static void check_matmul_p(CpuIsa isa, DType dt, int T, int64_t K, int64_t N, int with_bias,
                           int packed) {
    float *x = xmalloc((size_t)(T * K) * sizeof(float));
    for (int64_t i = 0; i < T * K; i++) x[i] = frand();
    void *w = random_weights(dt, N * K, 0.5f);
    float *bias = NULL;
    if (with_bias) {
        bias = xmalloc((size_t)N * sizeof(float));
        for (int64_t n = 0; n < N; n++) bias[n] = frand();
    }
    float *y = xmalloc((size_t)(T * N) * sizeof(float));
    float *y1 = xmalloc((size_t)N * sizeof(float));
    MatmulArgs a = {.x = x, .ldx = K, .T = T, .w = w, .wdt = dt, .K = K, .bias = bias, .y = y,
                    .ldy = N};
    uint16_t *wp = NULL;
    if (packed) {
        Tensor tw = {w, dt, N, K};
        a.wp = wp = matmul_pack_bf16(&tw);
    }
    /* split the rows in two awkward ranges to exercise the tile remainders (packed: at a panel
     * boundary, as the thread split does) */
    int64_t mid = packed ? N / 3 / 16 * 16 : N / 3;
    matmul_rows(isa, &a, 0, mid);
    matmul_rows(isa, &a, mid, N);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        for (int64_t n = 0; n < N; n++) {
            double ref = with_bias ? bias[n] : 0.0, mag = with_bias ? fabs(bias[n]) : 0.0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)x[t * K + k] * weight_at(w, dt, n * K + k);
                ref += p;
                mag += fabs(p);
            }
            double err = fabs(y[t * N + n] - ref) / (mag + 1e-30);
            if (err > worst) worst = err;
        }
        /* the same token alone gives bit-identical rows */
        MatmulArgs a1 = a;
        a1.x = x + t * K;
        a1.T = 1;
        a1.y = y1;
        matmul_rows(isa, &a1, 0, N);
        for (int64_t n = 0; n < N; n++)
            if (y1[n] != y[t * N + n])
                fail_msg("%s dtype %d T=%d K=%lld N=%lld: token %d alone %.9g, in batch %.9g",
                         cpu_isa_name(isa), dt, T, (long long)K, (long long)N, t, y1[n],
                         y[t * N + n]);
    }
    if (worst > 1e-5)
        fail_msg("%s%s dtype %d T=%d K=%lld N=%lld: worst relative error %.3g > 1e-5",
                 cpu_isa_name(isa), packed ? " packed" : "", dt, T, (long long)K, (long long)N,
                 worst);
    free(wp);
    free(x);
    free(w);
    free(bias);
    free(y);
    free(y1);
}

static void check_matmul(CpuIsa isa, DType dt, int T, int64_t K, int64_t N, int with_bias) {
    check_matmul_p(isa, dt, T, K, N, with_bias, 0);
}

/* The packed bf16 panels (AVX2): partial last panels, several panels per thread range, T from 1
 * to past two 6-token tiles, bias; each token alone bit-identical to the batch. */
static void test_matmul_packed(void **state) {
    (void)state;
    if (!isa_available(CPU_ISA_AVX2)) skip();
    static const int Ts[] = {1, 2, 5, 6, 7, 12, 13, 16, 37};
    static const int64_t Ks[] = {1, 7, 16, 67, 130};
    static const int64_t Ns[] = {1, 15, 16, 17, 48, 67, 100};
    int runs = 0;
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++, runs++)
                check_matmul_p(CPU_ISA_AVX2, DTYPE_BF16, Ts[ti], Ks[ki], Ns[ni], (int)(ni & 1), 1);
    /* the packing itself: lane (r0, r8, r1, r9, ...) of each k, zero rows past N */
    uint16_t w[20 * 3];
    for (int i = 0; i < 60; i++) w[i] = (uint16_t)(i + 1);
    Tensor t = {w, DTYPE_BF16, 20, 3};
    uint16_t *p = matmul_pack_bf16(&t);
    assert_int_equal(p[0], w[0 * 3 + 0]);  /* panel 0, k 0, row 0 */
    assert_int_equal(p[1], w[8 * 3 + 0]);  /* row 8 */
    assert_int_equal(p[2], w[1 * 3 + 0]);  /* row 1 */
    assert_int_equal(p[16 + 3], w[9 * 3 + 1]); /* k 1, row 9 */
    assert_int_equal(p[3 * 16 + 0], w[16 * 3 + 0]); /* panel 1, k 0, row 16 */
    assert_int_equal(p[3 * 16 + 1], 0);            /* row 24 does not exist */
    free(p);
    print_message("packed matmul: %d configurations\n", runs);
}

static void test_matmul_all_paths(void **state) {
    (void)state;
    static const int Ts[] = {1, 2, 3, 4, 5, 7, 8, 13, 16, 37};
    static const int64_t Ks[] = {1, 7, 8, 17, 67, 130};
    static const int64_t Ns[] = {1, 5, 31, 67};
    static const DType dts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    int runs = 0, prefetch = cpu_matmul_prefetch();
    for (int i = 0; i < 3; i++) {
        if (!isa_available(ALL_ISAS[i])) continue;
        cpu_matmul_set_prefetch(!prefetch); /* the other batch-1 variant, then the default */
        for (int d = 0; d < 3; d++)
            for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
                for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
                    check_matmul(ALL_ISAS[i], dts[d], 1, Ks[ki], Ns[ni], 0);
        cpu_matmul_set_prefetch(prefetch);
        for (int d = 0; d < 3; d++)
            for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++)
                for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
                    for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++) {
                        check_matmul(ALL_ISAS[i], dts[d], Ts[ti], Ks[ki], Ns[ni], (int)(ni & 1));
                        runs++;
                    }
    }
    print_message("matmul: %d configurations, best isa %s\n", runs, cpu_isa_name(cpu_isa_best()));
}

/* matmul_cpu / gate_up_silu_cpu: 1 and 2 threads agree bit for bit, multi-part jobs split right */
static void test_matmul_threads_identical(void **state) {
    (void)state;
    const int T = 9;
    const int64_t K = 75, N0 = 203, N1 = 49, I = 131;
    float *x = xmalloc(T * K * sizeof(float));
    for (int64_t i = 0; i < T * K; i++) x[i] = frand();
    Tensor w0 = {random_weights(DTYPE_BF16, N0 * K, 0.5f), DTYPE_BF16, N0, K};
    Tensor w1 = {random_weights(DTYPE_F16, N1 * K, 0.5f), DTYPE_F16, N1, K};
    Tensor wg = {random_weights(DTYPE_BF16, I * K, 0.5f), DTYPE_BF16, I, K};
    Tensor wu = {random_weights(DTYPE_BF16, I * K, 0.5f), DTYPE_BF16, I, K};
    float *out[2][4], *xpb = xmalloc(T * K * sizeof(float));
    for (int r = 0; r < 2; r++) { /* r = 0: 1 thread, no permute buffer; r = 1: 2 threads, one */
        ThreadPool *pool = threadpool_create(r + 1);
        out[r][0] = xmalloc(T * N0 * sizeof(float));
        out[r][1] = xmalloc(T * N1 * sizeof(float));
        out[r][2] = xmalloc(T * I * sizeof(float));
        out[r][3] = xmalloc(T * I * sizeof(float));
        MatmulPart parts[2] = {{&w0, NULL, out[r][0], N0, NULL}, {&w1, NULL, out[r][1], N1, NULL}};
        matmul_cpu(pool, x, K, T, parts, 2, r ? xpb : NULL);
        gate_up_silu_cpu(pool, x, T, &wg, &wu, NULL, NULL, out[r][2], out[r][3], r ? xpb : NULL);
        threadpool_destroy(pool);
    }
    assert_memory_equal(out[0][0], out[1][0], T * N0 * sizeof(float));
    assert_memory_equal(out[0][1], out[1][1], T * N1 * sizeof(float));
    assert_memory_equal(out[0][2], out[1][2], T * I * sizeof(float));
    /* the parts and the fused gate/up agree with single matmuls */
    float *y = xmalloc(T * I * sizeof(float)), *u = xmalloc(T * I * sizeof(float));
    MatmulArgs a = {.x = x, .ldx = K, .T = T, .w = w1.data, .wdt = DTYPE_F16, .K = K, .y = y,
                    .ldy = N1};
    matmul_rows(cpu_isa_get(), &a, 0, N1);
    assert_memory_equal(y, out[0][1], T * N1 * sizeof(float));
    a.w = wg.data;
    a.wdt = DTYPE_BF16;
    a.ldy = I;
    matmul_rows(cpu_isa_get(), &a, 0, I);
    a.w = wu.data;
    a.y = u;
    matmul_rows(cpu_isa_get(), &a, 0, I);
    for (int64_t i = 0; i < T * I; i++) {
        double ref = y[i] / (1.0 + exp(-(double)y[i])) * u[i];
        assert_true(fabs(out[0][2][i] - ref) <= 2e-6 * fabs(ref) + 1e-7);
    }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 4; i++) free(out[r][i]);
    free(y);
    free(u);
    free(x);
    free(xpb);
    free((void *)w0.data);
    free((void *)w1.data);
    free((void *)wg.data);
    free((void *)wu.data);
}

/* ---------------------------------------------------------------- small ops */

static void test_rmsnorm(void **state) {
    (void)state;
    static const int ns[] = {1, 7, 48, 128, 1000, 1024};
    const CpuIsa saved = cpu_isa_get();
    for (size_t i = 0; i < sizeof ALL_ISAS / sizeof *ALL_ISAS; i++) {
        if (!isa_available(ALL_ISAS[i])) continue;
        cpu_isa_set(ALL_ISAS[i]);
        for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
            int n = ns[c];
            float *x = xmalloc(n * sizeof(float)), *w = xmalloc(n * sizeof(float)),
                  *y = xmalloc(n * sizeof(float));
            for (int k = 0; k < n; k++) x[k] = 3.0f * frand(), w[k] = frand();
            rmsnorm_cpu(y, x, w, n, 1e-6f);
            double ss = 0;
            for (int k = 0; k < n; k++) ss += (double)x[k] * x[k];
            double r = 1.0 / sqrt(ss / n + 1e-6);
            for (int k = 0; k < n; k++) {
                double ref = x[k] * r * w[k];
                if (!(fabs(y[k] - ref) <= 2e-6 * (fabs(x[k] * r) + 1e-30)))
                    fail_msg("%s rmsnorm n=%d: y[%d] = %.9g, want %.9g", cpu_isa_name(ALL_ISAS[i]),
                             n, k, y[k], ref);
            }
            rmsnorm_cpu(x, x, w, n, 1e-6f); /* in place */
            assert_memory_equal(x, y, n * sizeof(float));
            free(x);
            free(w);
            free(y);
        }
    }
    cpu_isa_set(saved);
}

/* transformers' rope math written out in double: default, linear and llama3 */
static double ref_inv_freq(const ModelConfig *cfg, int d, int i) {
    double f = 1.0 / pow(cfg->rope_theta, 2.0 * i / d);
    if (cfg->rope_type == ROPE_LINEAR) return f / cfg->rope_factor;
    if (cfg->rope_type == ROPE_LLAMA3) {
        double wavelen = 2 * M_PI / f, old = cfg->rope_original_max_position;
        double lo_w = old / cfg->rope_low_freq_factor, hi_w = old / cfg->rope_high_freq_factor;
        if (wavelen < hi_w) return f;                       /* high frequency: kept */
        if (wavelen > lo_w) return f / cfg->rope_factor;    /* low frequency: scaled */
        double s = (old / wavelen - cfg->rope_low_freq_factor) /
                   (cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
        return (1 - s) * f / cfg->rope_factor + s * f;      /* in between: interpolated */
    }
    return f;
}

static void check_rope(const ModelConfig *cfg, int d) {
    const int half = d / 2, heads = 3;
    float inv[256], cs[256], sn[256];
    rope_inv_freq_cpu(cfg, d, inv);
    int bands[3] = {0};
    for (int i = 0; i < half; i++) {
        double ref = ref_inv_freq(cfg, d, i);
        assert_true(fabs(inv[i] - ref) <= 2e-6 * ref);
        double base = 1.0 / pow(cfg->rope_theta, 2.0 * i / d);
        bands[ref == base ? 0 : fabs(ref * cfg->rope_factor - base) < 1e-12 * base ? 1 : 2]++;
    }
    if (cfg->rope_type == ROPE_LLAMA3) /* the test's sizes reach all three bands */
        assert_true(bands[0] > 0 && bands[1] > 0 && bands[2] > 0);
    static const int positions[] = {0, 1, 5, 63};
    for (size_t p = 0; p < sizeof positions / sizeof *positions; p++) {
        int pos = positions[p];
        float x[3 * 256], y[3 * 256];
        for (int i = 0; i < heads * d; i++) x[i] = y[i] = frand();
        rope_cos_sin_cpu(pos, inv, half, cs, sn);
        rope_apply_cpu(y, heads, d, cs, sn);
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < half; i++) {
                /* rotate the pair (x[i], x[i + d/2]) by pos * inv_freq[i] */
                double ang = pos * ref_inv_freq(cfg, d, i), a = x[h * d + i],
                       b = x[h * d + i + half];
                double r0 = a * cos(ang) - b * sin(ang), r1 = b * cos(ang) + a * sin(ang);
                assert_true(fabs(y[h * d + i] - r0) <= 2e-5);
                assert_true(fabs(y[h * d + i + half] - r1) <= 2e-5);
            }
    }
}

static void test_rope_default_linear_llama3(void **state) {
    (void)state;
    ModelConfig cfg = {.rope_theta = 10000.0, .rope_type = ROPE_DEFAULT};
    check_rope(&cfg, 16);
    check_rope(&cfg, 128);
    cfg.rope_theta = 1000000.0;
    check_rope(&cfg, 64);
    cfg.rope_type = ROPE_LINEAR;
    cfg.rope_factor = 4.0;
    check_rope(&cfg, 32);
    cfg.rope_type = ROPE_LLAMA3;
    cfg.rope_theta = 500000.0;
    cfg.rope_factor = 8.0;
    cfg.rope_low_freq_factor = 1.0;
    cfg.rope_high_freq_factor = 4.0;
    cfg.rope_original_max_position = 8192;
    check_rope(&cfg, 128);
    /* a short original context pushes most bands into scaling */
    cfg.rope_original_max_position = 64;
    check_rope(&cfg, 64);
}

static void test_silu_mul(void **state) {
    (void)state;
    float g[101], u[101], g0[101];
    for (int i = 0; i < 101; i++) g0[i] = g[i] = 10.0f * frand(), u[i] = frand();
    silu_mul_cpu(g, u, 101);
    for (int i = 0; i < 101; i++) {
        double ref = g0[i] / (1.0 + exp(-(double)g0[i])) * u[i];
        assert_true(fabs(g[i] - ref) <= 1e-6 * fabs(ref) + 1e-30);
    }
}

/* The AVX2 exp: within 2 ulp-ish (3e-7 relative) of exp over its range, the vector lanes equal
 * the scalar twin bit for bit, and silu_mul_avx2 matches the formula. */
static void test_exp_silu_avx2(void **state) {
    (void)state;
    if (!isa_available(CPU_ISA_AVX2)) skip();
    enum { N = 20011 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = y[i] = -87.0f + 175.0f * (float)i / (N - 1);
    x[0] = y[0] = 0.0f;
    x[1] = y[1] = -1e-8f;
    exp_inplace_avx2(y, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double ref = exp((double)x[i]), err = fabs(y[i] - ref) / ref;
        if (err > worst) worst = err;
        float s = exp_avx2_scalar(x[i]);
        if (memcmp(&s, &y[i], sizeof s))
            fail_msg("exp(%.9g): vector %.9g, scalar twin %.9g", x[i], y[i], s);
    }
    if (worst > 3e-7) fail_msg("exp: worst relative error %.3g", worst);
    assert_true(exp_avx2_scalar(-1000.0f) < 1e-37f); /* clamped: softmax of a far-off score */
    float g[101], u[101], g0[101];
    for (int i = 0; i < 101; i++) g0[i] = g[i] = 10.0f * frand(), u[i] = frand();
    silu_mul_avx2(g, u, 101);
    for (int i = 0; i < 101; i++) {
        double ref = g0[i] / (1.0 + exp(-(double)g0[i])) * u[i];
        assert_true(fabs(g[i] - ref) <= 1e-6 * fabs(ref) + 1e-30);
    }
    print_message("exp: worst relative error %.3g\n", worst);
}

/* ---------------------------------------------------------------- fp8 e4m3 */

/* The value of code c from the format's definition (sign, 4 exponent bits bias 7, 3 mantissa
 * bits; exponent 0: subnormal; 0x7f / 0xff: NaN). */
static double fp8_value(int c) {
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    const double v = e == 0 ? ldexp(m, -9) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

/* The nearest finite code by brute force, a tie to the even code; beyond 448 (and +-inf): 448
 * (satfinite); NaN: 0x7f. */
static uint8_t fp8_ref_encode(float x) {
    if (isnan(x)) return 0x7f;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const double a = fabs((double)x);
    if (isinf(x)) return sign | 0x7e;
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c <= 0x7e; c++) {
        const double d = fabs(a - fp8_value(c));
        if (d < bd || (d == bd && !(c & 1))) bd = d, best = c;
    }
    return sign | (uint8_t)best;
}

static uint32_t xorshift32(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

static void test_fp8_decode(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        const float got = fp8_e4m3_to_f32((uint8_t)c);
        const double want = fp8_value(c);
        if (isnan(want)) {
            assert_true(isnan(got));
            assert_int_equal(f32_to_fp8_e4m3(got), 0x7f);
            continue;
        }
        if ((double)got != want || !!signbit(got) != (c >= 0x80))
            fail_msg("code %#04x: got %a, want %a", c, got, want);
        assert_int_equal(f32_to_fp8_e4m3(got), c); /* every finite code round-trips */
    }
    assert_true(fp8_e4m3_to_f32(0x7e) == 448.0f && fp8_e4m3_to_f32(0x01) == 0x1p-9f);
}

/* The floats where rounding decides: specials, every midpoint between neighbouring codes and
 * the floats next to it, both signs; then n random ones (half of them in e4m3's range). */
static int fp8_test_floats(float *x, int n_rand) {
    int n = 0;
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 448.0f, 464.0f,
                              0x1.d00002p+8f, 480.0f, 1e30f, FLT_MAX, 0x1p-10f, 0x1.000002p-10f,
                              0x1.fffffep-11f, 0x1p-9f, 0x1.8p-9f, 0x1p-6f, 0x1.ep-7f, 1e-45f};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++)
        x[n++] = specials[i], x[n++] = -specials[i];
    for (int c = 0; c < 0x7e; c++) {
        const float a = (float)fp8_value(c), b = (float)fp8_value(c + 1), mid = (a + b) / 2;
        const float near[5] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY), a, b};
        for (int k = 0; k < 5; k++)
            x[n++] = near[k], x[n++] = -near[k];
    }
    for (int i = 0; i < n_rand; i++) {
        uint32_t u = xorshift32();
        if (i & 1) u = (u & 0x807fffffu) | ((116u + xorshift32() % 21u) << 23); /* 2^-11 .. 2^9 */
        memcpy(&x[n++], &u, 4);
    }
    return n;
}

static void test_fp8_encode(void **state) {
    (void)state;
    const int n_rand = 1 << 18;
    float *x = xmalloc((size_t)(n_rand + 2048) * sizeof(float));
    const int n = fp8_test_floats(x, n_rand);
    for (int i = 0; i < n; i++) {
        const uint8_t got = f32_to_fp8_e4m3(x[i]), want = fp8_ref_encode(x[i]);
        if (got != want) fail_msg("encode %a (%.9g): got %#04x, want %#04x", x[i], x[i], got, want);
    }
    /* the rules, spelled out */
    assert_int_equal(f32_to_fp8_e4m3(464.0f), 0x7e);            /* a tie at the top: 448 */
    assert_int_equal(f32_to_fp8_e4m3(-1e9f), 0xfe);              /* saturated, not NaN */
    assert_int_equal(f32_to_fp8_e4m3(INFINITY), 0x7e);
    assert_int_equal(f32_to_fp8_e4m3(0x1p-10f), 0x00);           /* a tie to zero */
    assert_int_equal(f32_to_fp8_e4m3(-0x1.000002p-10f), 0x81);   /* just above: the subnormal */
    assert_int_equal(f32_to_fp8_e4m3(0x1.8p-9f), 0x02);          /* 1.5 subnormal ulps: even */
    assert_int_equal(f32_to_fp8_e4m3(1.0625f), 0x38);            /* 1 + 1/16: a tie, even */
    assert_int_equal(f32_to_fp8_e4m3(1.1875f), 0x3a);            /* 1 + 3/16: a tie, even */
    assert_int_equal(f32_to_fp8_e4m3(-NAN), 0x7f);
#ifdef CVLLM_HAVE_CUDA
    /* CUDA's own (host) conversion, the device's software twin: the floats above, then every
     * float of magnitude 2^-11 .. 2^9 whose low 6 mantissa bits are 0, 1 or 63 (every pattern
     * of the high bits: each rounding boundary and the floats on both sides of it), both signs */
    for (int i = 0; i < n; i++) {
        const uint8_t got = f32_to_fp8_e4m3(x[i]);
        const uint8_t want = __nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3);
        if (got != want) fail_msg("encode %a: got %#04x, CUDA %#04x", x[i], got, want);
    }
    int64_t checked = 0;
    for (uint32_t e = 116; e <= 136; e++)
        for (uint32_t hi = 0; hi < (1u << 17); hi++)
            for (int k = 0; k < 6; k++) {
                const uint32_t lo = k % 3 == 0 ? 0 : k % 3 == 1 ? 1 : 0x3f;
                const uint32_t u = (uint32_t)(k / 3) << 31 | e << 23 | hi << 6 | lo;
                float f;
                memcpy(&f, &u, 4);
                const uint8_t got = f32_to_fp8_e4m3(f);
                const uint8_t want = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
                if (got != want) fail_msg("encode %a: got %#04x, CUDA %#04x", f, got, want);
                checked++;
            }
    for (int c = 0; c < 256; c++) {
        const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
        const float want = f16_to_f32(h.x), got = fp8_e4m3_to_f32((uint8_t)c);
        if (isnan(want) ? !isnan(got) : memcmp(&want, &got, 4) != 0)
            fail_msg("decode %#04x: got %a, CUDA %a", c, got, want);
    }
    printf("    fp8: %d + %lld floats encoded as cuda_fp8.h's host conversion\n", n,
           (long long)checked);
#endif
    free(x);
}

/* ---------------------------------------------------------------- paged attention */

/* Naive attention over contiguous per-sequence K/V: kc[s][j][kvh][d]. */
static void naive_attention(const float *q, const float *kc, const float *vc, int n_keys, int H,
                            int KVH, int d, float *out) {
    double sc[512];
    for (int h = 0; h < H; h++) {
        int kvh = h / (H / KVH);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < n_keys; j++) {
            double s = 0;
            for (int i = 0; i < d; i++) s += (double)q[h * d + i] * kc[(j * KVH + kvh) * d + i];
            sc[j] = s / sqrt((double)d);
            if (sc[j] > mx) mx = sc[j];
        }
        for (int j = 0; j < n_keys; j++) sum += (sc[j] = exp(sc[j] - mx));
        for (int i = 0; i < d; i++) {
            double o = 0;
            for (int j = 0; j < n_keys; j++) o += sc[j] * vc[(j * KVH + kvh) * d + i];
            out[h * d + i] = (float)(o / sum);
        }
    }
}

/* decode_only: one new token per sequence (few tasks: the kv heads get split across threads) */
/* kvdt: the cache's type; bf16 / fp8 e4m3 (scales k 0.75, v 1.25) caches hold values the
 * reference reads rounded the same way (fp8: f32(code) * scale), so the tolerance is unchanged */
static void check_attention_kv(CpuIsa isa, int H, int KVH, int d, int bs, int decode_only,
                               DType kvdt) {
    const int bf16 = kvdt == DTYPE_BF16, fp8 = kvdt == DTYPE_FP8_E4M3;
    const float ks = 0.75f, vs = 1.25f;
    enum { S = 3 };
    const int ctx[S] = {1, 37, 70};
    int new_toks[S] = {1, 5, 70}; /* decode, chunk, full prefill */
    if (decode_only) new_toks[1] = new_toks[2] = 1;
    const int num_blocks = 64, mbps = 32, kvd = KVH * d;
    int T = 0;
    for (int s = 0; s < S; s++) T += new_toks[s];
    float *kcache = xcalloc((size_t)num_blocks * bs * kvd, sizeof(float));
    float *vcache = xcalloc((size_t)num_blocks * bs * kvd, sizeof(float));
    float *kc[S], *vc[S];
    int32_t tables[S * 32];
    /* shuffled physical blocks */
    int perm[64];
    for (int i = 0; i < num_blocks; i++) perm[i] = i;
    for (int i = num_blocks - 1; i > 0; i--) {
        int j = (int)((frand() + 1.0f) * 0.5f * (i + 1)) % (i + 1), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    int used = 0;
    for (int s = 0; s < S; s++) {
        kc[s] = xmalloc((size_t)ctx[s] * kvd * sizeof(float));
        vc[s] = xmalloc((size_t)ctx[s] * kvd * sizeof(float));
        for (int i = 0; i < mbps; i++) tables[s * mbps + i] = -1;
        for (int b = 0; b * bs < ctx[s]; b++) tables[s * mbps + b] = perm[used++];
        for (int j = 0; j < ctx[s]; j++) {
            int64_t slot = (int64_t)tables[s * mbps + j / bs] * bs + j % bs;
            for (int i = 0; i < kvd; i++) {
                float k = frand(), v = frand();
                if (bf16) k = bf16_to_f32(f32_to_bf16(k)), v = bf16_to_f32(f32_to_bf16(v));
                if (fp8) /* the values an fp8 cache reads back */
                    k = fp8_e4m3_to_f32(f32_to_fp8_e4m3(k / ks)) * ks,
                    v = fp8_e4m3_to_f32(f32_to_fp8_e4m3(v / vs)) * vs;
                kc[s][j * kvd + i] = kcache[slot * kvd + i] = k;
                vc[s][j * kvd + i] = vcache[slot * kvd + i] = v;
            }
        }
    }
    assert_true(used <= num_blocks);
    const size_t ncache = (size_t)num_blocks * bs * kvd;
    uint16_t *kb = xmalloc(ncache * sizeof(uint16_t)), *vb = xmalloc(ncache * sizeof(uint16_t));
    for (size_t i = 0; i < ncache; i++) kb[i] = f32_to_bf16(kcache[i]), vb[i] = f32_to_bf16(vcache[i]);
    uint8_t *k8 = xmalloc(ncache), *v8 = xmalloc(ncache); /* exact: the values are codes * scale */
    for (size_t i = 0; i < ncache; i++)
        k8[i] = f32_to_fp8_e4m3(kcache[i] / ks), v8[i] = f32_to_fp8_e4m3(vcache[i] / vs);
    float *q = xmalloc((size_t)T * H * d * sizeof(float));
    for (int i = 0; i < T * H * d; i++) q[i] = 2.0f * frand();
    int32_t *pos = xmalloc(T * sizeof(int32_t)), *tseq = xmalloc(T * sizeof(int32_t));
    for (int s = 0, t = 0; s < S; s++)
        for (int i = 0; i < new_toks[s]; i++, t++) {
            pos[t] = ctx[s] - new_toks[s] + i + 1; /* the keys token t attends to */
            tseq[t] = s;
        }
    float *out[2], *ref = xmalloc((size_t)H * d * sizeof(float));
    for (int r = 0; r < 2; r++) {
        ThreadPool *pool = threadpool_create(r + 1);
        float *scratch = xmalloc(2 * 1024 * sizeof(float)); /* threads x heads * context */
        out[r] = xmalloc((size_t)T * H * d * sizeof(float));
        AttentionArgs a = {.q = q, .out = out[r],
                           .k_cache = bf16 ? (void *)kb : fp8 ? (void *)k8 : kcache,
                           .v_cache = bf16 ? (void *)vb : fp8 ? (void *)v8 : vcache,
                           .kv_dtype = kvdt, .k_scale = ks, .v_scale = vs,
                           .num_tokens = T, .n_heads = H, .n_kv_heads = KVH, .head_dim = d,
                           .block_size = bs, .scale = 1.0f / sqrtf((float)d), .num_keys = pos,
                           .token_seq = tseq, .block_tables = tables, .max_blocks_per_seq = mbps,
                           .scratch = scratch, .scratch_stride = 1024};
        CpuIsa prev = cpu_isa_get();
        cpu_isa_set(isa);
        attention_cpu(pool, &a);
        cpu_isa_set(prev);
        threadpool_destroy(pool);
        free(scratch);
    }
    assert_memory_equal(out[0], out[1], (size_t)T * H * d * sizeof(float));
    double worst = 0;
    for (int t = 0; t < T; t++) {
        int s = tseq[t];
        naive_attention(q + (int64_t)t * H * d, kc[s], vc[s], pos[t], H, KVH, d, ref);
        for (int i = 0; i < H * d; i++) {
            double e = fabs(out[0][(int64_t)t * H * d + i] - ref[i]) / (fabs(ref[i]) + 1e-2);
            if (e > worst) worst = e;
        }
    }
    if (worst > 2e-5)
        fail_msg("%s attention H=%d KVH=%d d=%d bs=%d kv %s: worst rel error %.3g", cpu_isa_name(isa),
                 H, KVH, d, bs, dtype_name(kvdt), worst);
    free(kb);
    free(vb);
    free(k8);
    free(v8);
    for (int s = 0; s < S; s++) free(kc[s]), free(vc[s]);
    free(kcache);
    free(vcache);
    free(q);
    free(pos);
    free(tseq);
    free(out[0]);
    free(out[1]);
    free(ref);
}

static void check_attention(CpuIsa isa, int H, int KVH, int d, int bs, int decode_only) {
    check_attention_kv(isa, H, KVH, d, bs, decode_only, DTYPE_F32);
    check_attention_kv(isa, H, KVH, d, bs, decode_only, DTYPE_BF16);
    check_attention_kv(isa, H, KVH, d, bs, decode_only, DTYPE_FP8_E4M3);
}

static void test_paged_attention(void **state) {
    (void)state;
    for (int i = 0; i < 3; i++) {
        if (!isa_available(ALL_ISAS[i])) continue;
        for (int dec = 0; dec < 2; dec++) {
            check_attention(ALL_ISAS[i], 4, 2, 16, 16, dec); /* GQA */
            check_attention(ALL_ISAS[i], 4, 1, 13, 8, dec);  /* MQA, odd head_dim */
            check_attention(ALL_ISAS[i], 2, 2, 64, 5, dec);  /* MHA, block size 5 */
            check_attention(ALL_ISAS[i], 8, 4, 8, 4, dec);   /* 4 kv heads: split 2 or 4 ways */
            check_attention(ALL_ISAS[i], 6, 2, 24, 16, dec); /* groups of 3: a pair and one */
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threadpool_each_task_once),
        cmocka_unit_test(test_matmul_all_paths),
        cmocka_unit_test(test_matmul_packed),
        cmocka_unit_test(test_matmul_threads_identical),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope_default_linear_llama3),
        cmocka_unit_test(test_silu_mul),
        cmocka_unit_test(test_exp_silu_avx2),
        cmocka_unit_test(test_paged_attention),
        cmocka_unit_test(test_fp8_decode),
        cmocka_unit_test(test_fp8_encode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
