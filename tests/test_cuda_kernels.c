/* test_cuda_kernels.c: every CUDA kernel against its CPU twin (src/backend/cpu/ops.c), on random
 * non-zero inputs, with outputs poisoned (NaN bytes) before each launch so that an element the
 * kernel forgot is caught. Label "gpu": without a CUDA device it prints "skipped: no GPU" and
 * exits 77 (ctest counts that as skipped).
 *
 * Tolerances (relative to the largest |reference|, the worst element reported on failure):
 *   f32 outputs of f32 arithmetic in another order (norms, rope, attention, f32 products): 2e-5
 *   (rope at positions past 8k: 1e-4, the angle's f32 rounding is amplified by |pos|);
 *   bf16/f16-input products vs the same inputs widened on the CPU: 1e-4 (only the sum's order
 *   differs); outputs rounded to bf16: 8e-3 (half a bf16 ulp is 2^-9 = 2e-3 of the value, plus
 *   the rounding of values at the edge); f16 outputs 1e-3.
 * An fp8 e4m3 KV cache (3 mantissa bits) is compared without that loss: the stores bit for bit
 * against f32_to_fp8_e4m3(x / scale), the conversions of every code and of ties, subnormals and
 * overflow bit for bit against common.c's, and attention against the CPU twin reading the same
 * quantized cache with the same scales (so at the f32 / bf16 / f16 tolerances above).
 * The sampler is compared draw for draw with a slow sort-based sampler written here from
 * backend.h's semantics (same Philox uniforms; rows without a filter: the exponential race with
 * the same per-id uniforms, keys in double): greedy ids and log-probs must match; sampled ids
 * may differ only where the uniform falls within rounding of a boundary, or two race keys lie
 * within rounding (counted, at most 1%), and the empirical distribution of 4000 draws is within
 * total-variation 0.05 of the exact one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/sampler.h"
#include "backend/cpu/threadpool.h"
#include "backend/cuda/graph_edges.h"
#include "backend/cuda/kernels.h"
#include "backend/philox.h"
#include "common.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_));                  \
    } while (0)
#define OK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) fail_msg("%s -> %d: %s", #call, rc_, cvllm_last_error());                         \
    } while (0)

static ThreadPool *g_pool;
/* CVLLM_TEST_SMALL=1 (compute-sanitizer runs): leave out the contexts past 8k */
static int small_run(void) {
    const char *e = getenv("CVLLM_TEST_SMALL");
    return e && *e ? atoi(e) : 0;
}
static cudaStream_t g_stream;

/* ---------------------------------------------------------------- helpers */

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / (1ull << 23)) - 1.0);
}
static int irand(int n) {
    return (int)(((frand() + 1.0f) * 0.5f) * n) % n;
}

/* v rounded to dt and back (what the device sees of an f32 value stored in dt) */
static float round_to(DType dt, float v) {
    if (dt == DTYPE_BF16) return bf16_to_f32(f32_to_bf16(v));
    if (dt == DTYPE_F16) return f16_to_f32(f32_to_f16(v));
    if (dt == DTYPE_FP8_E4M3) return fp8_e4m3_to_f32(f32_to_fp8_e4m3(v));
    return v;
}
static void *pack(DType dt, const float *x, int64_t n) { /* host array of dt */
    void *p = xmalloc((size_t)n * dtype_size(dt));
    for (int64_t i = 0; i < n; i++) {
        if (dt == DTYPE_BF16)
            ((uint16_t *)p)[i] = f32_to_bf16(x[i]);
        else if (dt == DTYPE_F16)
            ((uint16_t *)p)[i] = f32_to_f16(x[i]);
        else if (dt == DTYPE_FP8_E4M3)
            ((uint8_t *)p)[i] = f32_to_fp8_e4m3(x[i]);
        else
            ((float *)p)[i] = x[i];
    }
    return p;
}
static void unpack(DType dt, const void *p, float *x, int64_t n) {
    cpu_to_f32(x, p, dt, 0, n);
}

static void *dev_upload(const void *h, size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static void *dev_poisoned(size_t bytes) {
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 1));
    CK(cudaMemset(d, 0xFF, bytes)); /* NaN in f32, bf16 and f16 */
    return d;
}
static void dev_download(void *h, const void *d, size_t bytes) {
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* max |a - ref| / max |ref| over n; fails (with the worst element) above tol or on a NaN. */
static double compare(const char *what, const float *a, const float *ref, int64_t n, double tol) {
    double maxref = 0, maxd = 0;
    int64_t worst = 0;
    for (int64_t i = 0; i < n; i++)
        maxref = fmax(maxref, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (isnan(a[i]) != isnan(ref[i])) d = INFINITY;
        if (d > maxd || isnan(d)) maxd = isnan(d) ? INFINITY : d, worst = i;
    }
    double rel = maxref > 0 ? maxd / maxref : maxd;
    if (!(rel <= tol))
        fail_msg("%s: relative error %.3g > %.3g (element %lld: got %.9g, want %.9g)", what, rel,
                 tol, (long long)worst, a[worst], ref[worst]);
    return rel;
}
static double tol_for(DType dt, double f32_tol) {
    return dt == DTYPE_BF16 ? 8e-3 : dt == DTYPE_F16 ? 1e-3 : f32_tol;
}
static const DType DTYPES[3] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
/* the KV cache's: DTYPES and fp8 e4m3 */
static const DType KV_DTYPES[4] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32, DTYPE_FP8_E4M3};

/* ---------------------------------------------------------------- small ops */

static void test_embedding(void **state) {
    (void)state;
    const int V = 301, H = 136, T = 37;
    for (int di = 0; di < 3; di++) {
        DType dt = DTYPES[di];
        float *e = xmalloc((size_t)V * H * sizeof(float));
        for (int i = 0; i < V * H; i++)
            e[i] = frand();
        void *eh = pack(dt, e, (int64_t)V * H);
        int32_t ids[T];
        for (int t = 0; t < T; t++)
            ids[t] = irand(V);
        ids[0] = V - 1;
        void *de = dev_upload(eh, (size_t)V * H * dtype_size(dt));
        int32_t *dids = dev_upload(ids, sizeof ids);
        float *dx = dev_poisoned((size_t)T * H * sizeof(float));
        float *got = xmalloc((size_t)T * H * sizeof(float)),
              *ref = xmalloc((size_t)T * H * sizeof(float));
        /* the whole vocabulary, then a tensor-parallel rank's rows [v0, v0 + nv) (its table
         * holds only those): the other ids give zeros */
        const int shards[3][2] = {{0, V}, {120, 100}, {200, V - 200}};
        for (int k = 0; k < 3; k++) {
            const int v0 = shards[k][0], nv = shards[k][1];
            const char *rows = (const char *)de + (size_t)v0 * H * dtype_size(dt);
            OK(embedding_cuda(dx, rows, dt, dids, T, H, v0, nv, g_stream));
            dev_download(got, dx, (size_t)T * H * sizeof(float));
            int inside = 0;
            for (int t = 0; t < T; t++) {
                if (ids[t] >= v0 && ids[t] < v0 + nv) {
                    cpu_to_f32(ref + (int64_t)t * H, eh, dt, (int64_t)ids[t] * H, H);
                    inside++;
                } else {
                    memset(ref + (int64_t)t * H, 0, (size_t)H * sizeof(float));
                }
            }
            assert_true(inside > 0 && (k == 0 || inside < T));
            compare("embedding", got, ref, (int64_t)T * H, 0.0);
        }
        cudaFree(de), cudaFree(dids), cudaFree(dx);
        free(e), free(eh), free(got), free(ref);
    }
}

/* The ranks' lm_head slices [ranks][n][Vs] into [n, V] rows (V not a multiple of the ranks: the
 * last slice is cut; its padding columns must not land anywhere). */
static void test_vocab_shards_to_rows(void **state) {
    (void)state;
    const int n = 5, V = 1001;
    for (int ranks = 1; ranks <= 8; ranks *= 2) {
        const int Vs = (V + ranks - 1) / ranks;
        const int64_t ns = (int64_t)ranks * n * Vs;
        float *src = xmalloc(ns * sizeof(float)), *got = xmalloc((size_t)n * V * sizeof(float)),
              *ref = xmalloc((size_t)n * V * sizeof(float));
        for (int64_t i = 0; i < ns; i++)
            src[i] = frand();
        for (int r = 0; r < ranks; r++)
            for (int i = 0; i < n; i++)
                for (int j = 0; j < Vs && r * Vs + j < V; j++)
                    ref[(int64_t)i * V + r * Vs + j] = src[((int64_t)r * n + i) * Vs + j];
        float *ds = dev_upload(src, ns * sizeof(float));
        float *dd = dev_poisoned((size_t)n * V * sizeof(float));
        OK(vocab_shards_to_rows_cuda(dd, ds, n, V, Vs, ranks, g_stream));
        dev_download(got, dd, (size_t)n * V * sizeof(float));
        compare("vocab shards to rows", got, ref, (int64_t)n * V, 0.0);
        cudaFree(ds), cudaFree(dd);
        free(src), free(got), free(ref);
    }
}

static void test_residual_rmsnorm(void **state) {
    (void)state;
    /* 1022 and 5120: the one-element kernel (H % 4 != 0, H > 4096); 512, 1024: the warp a row
     * kernel, then (CVLLM_CUDA_EW=0) the 16-byte block a row one; the rest that one. T 19: the
     * warp kernel's last block has 1 row of its 2. with_add 2: the residual sum alone (no h, no
     * w: the last layer's call) */
    const int Hs[] = {96, 512, 1000, 1024, 2048, 2560, 4096, 1022, 5120}, T = 19;
    for (int hi = 0; hi < 9 * 2; hi++)
        for (int di = 0; di < 3; di++)
            for (int with_add = 0; with_add < 3; with_add++) {
                const int H = Hs[hi % 9];
                if (hi >= 9) setenv("CVLLM_CUDA_EW", "0", 1);
                const DType dt = DTYPES[di];
                const int64_t n = (int64_t)T * H;
                float *x = xmalloc(n * sizeof(float)), *add = xmalloc(n * sizeof(float)),
                      *w = xmalloc(H * sizeof(float)), *ref = xmalloc(n * sizeof(float)),
                      *xref = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
                for (int64_t i = 0; i < n; i++)
                    x[i] = 3 * frand(), add[i] = frand();
                for (int i = 0; i < H; i++)
                    w[i] = 1 + 0.5f * frand();
                float *dx = dev_upload(x, n * sizeof(float)),
                      *dadd = dev_upload(add, n * sizeof(float)),
                      *dw = dev_upload(w, H * sizeof(float));
                void *dh = dev_poisoned(n * dtype_size(dt));
                const int alone = with_add == 2;
                OK(residual_rmsnorm_cuda(dx, with_add ? dadd : NULL, alone ? NULL : dw,
                                         alone ? NULL : dh, dt, T, H, 1e-6f, g_stream));
                memcpy(xref, x, n * sizeof(float));
                for (int t = 0; t < T; t++) {
                    float *xr = xref + (int64_t)t * H;
                    if (with_add)
                        for (int i = 0; i < H; i++)
                            xr[i] += add[(int64_t)t * H + i];
                    rmsnorm_cpu(ref + (int64_t)t * H, xr, w, H, 1e-6f);
                }
                void *hh = xmalloc(n * dtype_size(dt));
                dev_download(hh, dh, n * dtype_size(dt));
                unpack(dt, hh, got, n);
                if (!alone) compare("rmsnorm h", got, ref, n, tol_for(dt, 2e-5));
                dev_download(got, dx, n * sizeof(float));
                compare("residual x", got, xref, n, 0.0);
                unsetenv("CVLLM_CUDA_EW");
                cudaFree(dx), cudaFree(dadd), cudaFree(dw), cudaFree(dh);
                free(x), free(add), free(w), free(ref), free(xref), free(got), free(hh);
            }
}

static void test_qk_norm_rope(void **state) {
    (void)state;
    const int hds[] = {16, 32, 64, 128, 256};
    ModelConfig cfg = {.rope_theta = 1000000.0, .rope_type = ROPE_DEFAULT};
    for (int hi = 0; hi < 5; hi++)
        for (int norm = 0; norm < 2; norm++) {
            /* T 600 at head_dim 128: a prefill's launch (256 threads a token, not a warp a
             * head) */
            const int hd = hds[hi], nh = 6, nkv = 2, T = hi == 3 ? 600 : 23;
            const int64_t ld = (int64_t)(nh + 2 * nkv) * hd + 8; /* a padded row */
            const int64_t n = T * ld;
            float *qkv = xmalloc(n * sizeof(float)), *ref = xmalloc(n * sizeof(float)),
                  *got = xmalloc(n * sizeof(float));
            float qn[256], kn[256], inv[128], cs[128], sn[128];
            for (int64_t i = 0; i < n; i++)
                qkv[i] = 2 * frand();
            for (int i = 0; i < hd; i++)
                qn[i] = 1 + 0.3f * frand(), kn[i] = 1 + 0.3f * frand();
            rope_inv_freq_cpu(&cfg, hd, inv);
            int32_t pos[T];
            for (int t = 0; t < T; t++)
                pos[t] = t < 5 ? t : irand(12000);
            float *d = dev_upload(qkv, n * sizeof(float)),
                  *dinv = dev_upload(inv, sizeof(float) * hd / 2),
                  *dqn = dev_upload(qn, sizeof(float) * hd),
                  *dkn = dev_upload(kn, sizeof(float) * hd);
            int32_t *dpos = dev_upload(pos, sizeof pos);
            OK(qk_norm_rope_cuda(d, ld, dpos, dinv, norm ? dqn : NULL, norm ? dkn : NULL, T, nh,
                                 nkv, hd, 1e-6f, g_stream));
            memcpy(ref, qkv, n * sizeof(float));
            for (int t = 0; t < T; t++) {
                float *q = ref + t * ld, *k = q + (int64_t)nh * hd;
                if (norm) {
                    for (int h = 0; h < nh; h++)
                        rmsnorm_cpu(q + h * hd, q + h * hd, qn, hd, 1e-6f);
                    for (int h = 0; h < nkv; h++)
                        rmsnorm_cpu(k + h * hd, k + h * hd, kn, hd, 1e-6f);
                }
                rope_cos_sin_cpu(pos[t], inv, hd / 2, cs, sn);
                rope_apply_cpu(q, nh, hd, cs, sn);
                rope_apply_cpu(k, nkv, hd, cs, sn);
            }
            dev_download(got, d, n * sizeof(float));
            compare("qk_norm_rope", got, ref, n, 1e-4);
            { /* the fused launch of the step: the same rows, and k / v stored at the slots */
                const DType kdt = KV_DTYPES[(hi + norm) % 4];
                const int fp8 = kdt == DTYPE_FP8_E4M3;
                const float ks = fp8 ? 0.5f : 1.0f, vs = fp8 ? 1.5f : 1.0f;
                /* nslots prime (47, 1201): the slots (t * 5) % nslots are distinct */
                const int kvd = nkv * hd, nslots = 2 * T + 1;
                int64_t slot[T];
                for (int t = 0; t < T; t++)
                    slot[t] = t % 4 == 1 ? -1 : (t * 5) % nslots;
                float *d2 = dev_upload(qkv, n * sizeof(float));
                int64_t *dslot = dev_upload(slot, sizeof slot);
                const size_t cb = (size_t)nslots * kvd * dtype_size(kdt);
                void *kc = dev_poisoned(cb), *vc = dev_poisoned(cb);
                OK(qk_norm_rope_store_cuda(d2, ld, NULL, DTYPE_F32, dpos, dinv, norm ? dqn : NULL,
                                           norm ? dkn : NULL, T, nh, nkv, hd, 1e-6f, kc, vc, kdt,
                                           ks, vs, dslot, NULL, DTYPE_BF16, 0, g_stream));
                float *got2 = xmalloc(n * sizeof(float));
                dev_download(got2, d2, n * sizeof(float));
                compare("qk_norm_rope_store rows", got2, ref, n, 1e-4);
                void *kh = xmalloc(cb), *vh = xmalloc(cb);
                dev_download(kh, kc, cb);
                dev_download(vh, vc, cb);
                float *kf = xmalloc((size_t)nslots * kvd * 4),
                      *vf = xmalloc((size_t)nslots * kvd * 4);
                unpack(kdt, kh, kf, (int64_t)nslots * kvd);
                unpack(kdt, vh, vf, (int64_t)nslots * kvd);
                float *gk = xmalloc((size_t)T * 2 * kvd * 4),
                      *wk = xmalloc((size_t)T * 2 * kvd * 4);
                int64_t m = 0;
                for (int t = 0; t < T; t++) {
                    if (slot[t] < 0) continue;
                    memcpy(gk + m, kf + slot[t] * kvd, (size_t)kvd * 4);
                    memcpy(gk + m + kvd, vf + slot[t] * kvd, (size_t)kvd * 4);
                    for (int i = 0; i < kvd; i++) {
                        wk[m + i] = round_to(kdt, ref[t * ld + (int64_t)nh * hd + i]);
                        wk[m + kvd + i] = round_to(kdt, ref[t * ld + (int64_t)(nh + nkv) * hd + i]);
                        if (fp8) { /* the device's own k row (1e-4 from ref's) quantized: exact */
                            const float k = got2[t * ld + (int64_t)nh * hd + i],
                                        v = got2[t * ld + (int64_t)(nh + nkv) * hd + i];
                            gk[m + i] = (float)((uint8_t *)kh)[slot[t] * kvd + i];
                            gk[m + kvd + i] = (float)((uint8_t *)vh)[slot[t] * kvd + i];
                            wk[m + i] = (float)f32_to_fp8_e4m3(k / ks);
                            wk[m + kvd + i] = (float)f32_to_fp8_e4m3(v / vs);
                        }
                    }
                    m += 2 * kvd;
                }
                if (fp8) /* codes, exactly */
                    compare("qk_norm_rope_store fp8 cache codes", gk, wk, m, 0.0);
                else
                    compare("qk_norm_rope_store cache", gk, wk, m, tol_for(kdt, 1e-4));
                { /* q to a 16-bit buffer (a prefill's d_q16): q as the rows above hold it,
                   * rounded; the same cache bytes; the rows left as they were */
                    const DType qdt = norm ? DTYPE_BF16 : DTYPE_F16;
                    const int64_t ld16 = ((int64_t)nh * hd + 7) / 8 * 8 + 8; /* padded */
                    float *d3 = dev_upload(qkv, n * sizeof(float));
                    void *kc3 = dev_poisoned(cb), *vc3 = dev_poisoned(cb);
                    void *dq16 = dev_poisoned((size_t)T * ld16 * 2);
                    OK(qk_norm_rope_store_cuda(d3, ld, NULL, DTYPE_F32, dpos, dinv,
                                               norm ? dqn : NULL, norm ? dkn : NULL, T, nh, nkv, hd,
                                               1e-6f, kc3, vc3, kdt, ks, vs, dslot, dq16, qdt, ld16,
                                               g_stream));
                    uint16_t *q16 = xmalloc((size_t)T * ld16 * 2);
                    dev_download(q16, dq16, (size_t)T * ld16 * 2);
                    for (int t = 0; t < T; t++)
                        for (int i = 0; i < nh * hd; i++) {
                            const float x = got2[t * ld + i];
                            const uint16_t want =
                                qdt == DTYPE_BF16 ? f32_to_bf16(x) : f32_to_f16(x);
                            if (q16[t * ld16 + i] != want)
                                fail_msg("qk_norm_rope_store q16 (hd %d): token %d, %d: %04x, "
                                         "expected %04x",
                                         hd, t, i, q16[t * ld16 + i], want);
                        }
                    float *rows = xmalloc(n * sizeof(float));
                    dev_download(rows, d3, n * sizeof(float));
                    if (memcmp(rows, qkv, n * sizeof(float)))
                        fail_msg("qk_norm_rope_store q16 (hd %d): the qkv rows changed", hd);
                    void *kh3 = xmalloc(cb), *vh3 = xmalloc(cb);
                    dev_download(kh3, kc3, cb);
                    dev_download(vh3, vc3, cb);
                    for (int t = 0; t < T; t++) /* the slots' rows: the same bytes */
                        if (slot[t] >= 0) {
                            const size_t o = (size_t)slot[t] * kvd * dtype_size(kdt),
                                         rb = (size_t)kvd * dtype_size(kdt);
                            if (memcmp((char *)kh3 + o, (char *)kh + o, rb) ||
                                memcmp((char *)vh3 + o, (char *)vh + o, rb))
                                fail_msg("qk_norm_rope_store q16 (hd %d): token %d's cache row "
                                         "differs",
                                         hd, t);
                        }
                    cudaFree(d3), cudaFree(kc3), cudaFree(vc3), cudaFree(dq16);
                    free(q16), free(rows), free(kh3), free(vh3);
                }
                /* the qkv product's rows in a 16-bit type (fusion "qkv16"): the same bytes as
                 * from f32 rows of the same values (the normed q and k, the cache, q16) */
                for (int wq = 0; wq < 2; wq++) { /* 0: q, k to f32 rows; 1: q to q16 */
                    const DType sdt = norm ? DTYPE_F16 : DTYPE_BF16;
                    const int64_t ld16 = ((int64_t)nh * hd + 7) / 8 * 8 + 8, qb = T * ld16 * 2;
                    float *r16 = xmalloc(n * sizeof(float));
                    for (int64_t i = 0; i < n; i++)
                        r16[i] = round_to(sdt, qkv[i]);
                    void *h16 = pack(sdt, r16, n);
                    float *da = dev_upload(r16, n * sizeof(float)),
                          *db = dev_poisoned(n * sizeof(float));
                    void *ds = dev_upload(h16, n * 2), *kca = dev_poisoned(cb),
                         *vca = dev_poisoned(cb), *kcb = dev_poisoned(cb), *vcb = dev_poisoned(cb),
                         *qa = wq ? dev_poisoned(qb) : NULL, *qbb = wq ? dev_poisoned(qb) : NULL;
                    OK(qk_norm_rope_store_cuda(da, ld, NULL, DTYPE_F32, dpos, dinv,
                                               norm ? dqn : NULL, norm ? dkn : NULL, T, nh, nkv, hd,
                                               1e-6f, kca, vca, kdt, ks, vs, dslot, qa, sdt, ld16,
                                               g_stream));
                    OK(qk_norm_rope_store_cuda(wq ? NULL : db, ld, ds, sdt, dpos, dinv,
                                               norm ? dqn : NULL, norm ? dkn : NULL, T, nh, nkv, hd,
                                               1e-6f, kcb, vcb, kdt, ks, vs, dslot, qbb, sdt, ld16,
                                               g_stream));
                    char *ha = xmalloc(cb > (size_t)qb ? cb : (size_t)qb),
                         *hb = xmalloc(cb > (size_t)qb ? cb : (size_t)qb);
                    const void *pairs[3][2] = {{kca, kcb}, {vca, vcb}, {qa, qbb}};
                    for (int k = 0; k < (wq ? 3 : 2); k++) {
                        const size_t bytes = k < 2 ? cb : (size_t)qb;
                        dev_download(ha, pairs[k][0], bytes);
                        dev_download(hb, pairs[k][1], bytes);
                        if (memcmp(ha, hb, bytes))
                            fail_msg("qk_norm_rope_store %s rows (hd %d, q16 %d): the %s differ",
                                     dtype_name(sdt), hd, wq,
                                     k == 0   ? "k caches"
                                     : k == 1 ? "v caches"
                                              : "q16 rows");
                    }
                    if (!wq) { /* the normed q and k columns of every row */
                        float *ra = xmalloc(n * sizeof(float)), *rb = xmalloc(n * sizeof(float));
                        dev_download(ra, da, n * sizeof(float));
                        dev_download(rb, db, n * sizeof(float));
                        for (int t = 0; t < T; t++)
                            if (memcmp(ra + t * ld, rb + t * ld,
                                       (size_t)(nh + nkv) * hd * sizeof(float)))
                                fail_msg("qk_norm_rope_store %s rows (hd %d): token %d's normed "
                                         "q / k differ",
                                         dtype_name(sdt), hd, t);
                        free(ra), free(rb);
                    }
                    cudaFree(da), cudaFree(db), cudaFree(ds), cudaFree(kca), cudaFree(vca);
                    cudaFree(kcb), cudaFree(vcb), cudaFree(qa), cudaFree(qbb);
                    free(r16), free(h16), free(ha), free(hb);
                }
                cudaFree(d2), cudaFree(dslot), cudaFree(kc), cudaFree(vc);
                free(got2), free(kh), free(vh), free(kf), free(vf), free(gk), free(wk);
            }
            cudaFree(d), cudaFree(dinv), cudaFree(dqn), cudaFree(dkn), cudaFree(dpos);
            free(qkv), free(ref), free(got);
        }
}

/* Every cache type; fp8 with scales k 0.75, v 2 (and 1, vLLM's default) over values up to 400
 * (so that x / 0.75 saturates at 448) down to subnormals, checked code for code. */
static void test_store_kvcache(void **state) {
    (void)state;
    for (int di = 0; di < 5; di++) {
        const DType dt = KV_DTYPES[di < 4 ? di : 3];
        const int fp8 = dt == DTYPE_FP8_E4M3;
        const float ks = di == 3 ? 0.75f : 1.0f, vs = di == 3 ? 2.0f : 1.0f;
        const int T = 41, kvd = 2 * 64, slots = 97;
        const int64_t ld = 3 * kvd;
        float *kv = xmalloc((size_t)T * ld * sizeof(float));
        for (int64_t i = 0; i < T * ld; i++) /* fp8: magnitudes 400 .. 1e-4 */
            kv[i] = fp8 ? 400.0f * frand() * powf(10.0f, -6.5f * (i % 7) / 6.0f) : frand();
        int64_t slot[T];
        for (int t = 0; t < T; t++)
            slot[t] = t % 3 == 0 ? -1 : (t * 7) % slots; /* distinct */
        float *dkv = dev_upload(kv, (size_t)T * ld * sizeof(float));
        int64_t *dslot = dev_upload(slot, sizeof slot);
        const size_t cb = (size_t)slots * kvd * dtype_size(dt);
        void *kc = dev_poisoned(cb), *vc = dev_poisoned(cb);
        OK(store_kvcache_cuda(dkv + kvd, dkv + 2 * kvd, ld, kc, vc, dt, ks, vs, dslot, T, kvd,
                              g_stream));
        void *hk = xmalloc(cb), *hv = xmalloc(cb);
        dev_download(hk, kc, cb);
        dev_download(hv, vc, cb);
        float *fk = xmalloc((size_t)slots * kvd * 4), *fv = xmalloc((size_t)slots * kvd * 4);
        unpack(dt, hk, fk, (int64_t)slots * kvd);
        unpack(dt, hv, fv, (int64_t)slots * kvd);
        int written[97] = {0}, saturated = 0;
        for (int t = 0; t < T; t++) {
            if (slot[t] < 0) continue;
            written[slot[t]] = 1;
            for (int i = 0; i < kvd; i++) {
                const float k = kv[t * ld + kvd + i], v = kv[t * ld + 2 * kvd + i];
                if (fp8) { /* the stored code: e4m3(x / scale) */
                    const uint8_t gk = ((uint8_t *)hk)[slot[t] * kvd + i],
                                  gv = ((uint8_t *)hv)[slot[t] * kvd + i];
                    if (gk != f32_to_fp8_e4m3(k / ks) || gv != f32_to_fp8_e4m3(v / vs))
                        fail_msg("fp8 store (scales %g, %g): k %.9g -> %#04x (want %#04x), v %.9g "
                                 "-> %#04x (want %#04x)",
                                 ks, vs, k, gk, f32_to_fp8_e4m3(k / ks), v, gv,
                                 f32_to_fp8_e4m3(v / vs));
                    saturated += (gk & 0x7f) == 0x7e;
                } else {
                    assert_true(fk[slot[t] * kvd + i] == round_to(dt, k));
                    assert_true(fv[slot[t] * kvd + i] == round_to(dt, v));
                }
            }
        }
        if (di == 3) assert_true(saturated > 0); /* the range was exercised */
        for (int s = 0; s < slots; s++) /* a slot of -1 writes nothing: the poison is intact */
            if (!written[s])
                for (int i = 0; i < kvd; i++)
                    assert_true(isnan(fk[s * kvd + i]) && isnan(fv[s * kvd + i]));
        cudaFree(dkv), cudaFree(dslot), cudaFree(kc), cudaFree(vc);
        free(kv), free(hk), free(hv), free(fk), free(fv);
    }
    /* an fp8 store refuses a scale that is not positive */
    assert_true(store_kvcache_cuda(NULL, NULL, 0, NULL, NULL, DTYPE_FP8_E4M3, 0.0f, 1.0f, NULL, 1,
                                   1, g_stream) == CVLLM_EINVAL);
}

/* The fp8 conversions: every code decoded as fp8_e4m3_to_f32 does, and the encoding of special
 * values, every midpoint between neighbouring codes and the floats next to it, and random floats
 * of every exponent, code for code as f32_to_fp8_e4m3 (a NaN may come back as either NaN code). */
static void test_fp8_conversions(void **state) {
    (void)state;
    uint8_t codes[256];
    for (int i = 0; i < 256; i++)
        codes[i] = (uint8_t)i;
    float dec[256];
    void *dc = dev_upload(codes, 256);
    float *dd = dev_poisoned(256 * sizeof(float));
    OK(convert_to_f32_cuda(dd, dc, DTYPE_FP8_E4M3, 256, g_stream));
    dev_download(dec, dd, sizeof dec);
    for (int i = 0; i < 256; i++) {
        const float want = fp8_e4m3_to_f32((uint8_t)i);
        if (isnan(want) ? !isnan(dec[i]) : memcmp(&dec[i], &want, 4) != 0)
            fail_msg("decode %#04x: got %a, want %a", i, dec[i], want);
    }
    cudaFree(dc), cudaFree(dd);

    const int n_rand = 1 << 20;
    float *x = xmalloc((size_t)(n_rand + 4096) * sizeof(float));
    int n = 0;
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 448.0f, -448.0f,
                              464.0f, -464.0f, 465.0f, 480.0f, 1e30f, -3.4e38f, 0x1p-10f,
                              -0x1p-10f, 0x1p-9f, 0x1.8p-9f, 0x1p-6f, 0x1.cp-7f, 1e-30f, 1e-45f};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++)
        x[n++] = specials[i];
    for (int c = 0; c < 126; c++) { /* positive codes 0 .. 0x7e: the midpoints to the next */
        const float a = fp8_e4m3_to_f32((uint8_t)c), b = fp8_e4m3_to_f32((uint8_t)(c + 1));
        const float mid = (a + b) / 2; /* exact in f32 */
        const float near[5] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY), a, b};
        for (int k = 0; k < 5; k++)
            x[n++] = near[k], x[n++] = -near[k];
    }
    for (int i = 0; i < n_rand; i++) { /* random bits: every exponent, NaNs included */
        g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
        uint32_t u = (uint32_t)(g_rng >> 32);
        if (i & 1) /* half of them in e4m3's range: 2^-11 .. 2^9 */
            u = (u & 0x807fffffu) | ((uint32_t)(116 + (g_rng & 0xffff) % 21) << 23);
        memcpy(&x[n++], &u, 4);
    }
    uint8_t *got = xmalloc(n);
    float *dx = dev_upload(x, (size_t)n * sizeof(float));
    void *dg = dev_poisoned(n);
    OK(convert_f32_cuda(dg, DTYPE_FP8_E4M3, dx, n, g_stream));
    dev_download(got, dg, n);
    int nan_sign = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t want = f32_to_fp8_e4m3(x[i]);
        if (isnan(x[i])) {
            if ((got[i] & 0x7f) != 0x7f) fail_msg("encode NaN: got %#04x", got[i]);
            nan_sign += got[i] != want;
        } else if (got[i] != want) {
            fail_msg("encode %a (%.9g): got %#04x, want %#04x", x[i], x[i], got[i], want);
        }
    }
    printf("    fp8 e4m3: 256 codes decoded, %d floats encoded as the CPU's%s\n", n,
           nan_sign ? " (a NaN's sign kept by the device: 0xff)" : "");
    cudaFree(dx), cudaFree(dg);
    free(x), free(got);
}

static void test_silu_mul_gather_bias(void **state) {
    (void)state;
    const int T = 13, H = 200;
    /* gu in f32, then in the output's dtype (the gate/up product's "gu16" output) */
    for (int ci = 0; ci < 18; ci++) {
        const DType dt = DTYPES[ci % 3], gudt = ci < 9 ? DTYPE_F32 : dt;
        /* the one-element kernel, the 4-wide one, the 8-wide one (a 16-bit gu of the output's
         * dtype; f32 gu: 4-wide again) */
        const int Is[3] = {771, 772, 776}, I = Is[ci % 9 / 3];
        float *gu = xmalloc((size_t)T * 2 * I * 4), *ref = xmalloc((size_t)T * I * 4),
              *got = xmalloc((size_t)T * I * 4);
        for (int64_t i = 0; i < (int64_t)T * 2 * I; i++)
            gu[i] = round_to(gudt, 6 * frand());
        for (int t = 0; t < T; t++) {
            memcpy(ref + (int64_t)t * I, gu + (int64_t)t * 2 * I, I * 4);
            silu_mul_cpu(ref + (int64_t)t * I, gu + (int64_t)t * 2 * I + I, I);
        }
        void *guh = pack(gudt, gu, (int64_t)T * 2 * I);
        void *dgu = dev_upload(guh, (size_t)T * 2 * I * dtype_size(gudt));
        void *dg = dev_poisoned((size_t)T * I * dtype_size(dt));
        OK(silu_mul_cuda(dg, dt, dgu, gudt, T, I, g_stream));
        void *hg = xmalloc((size_t)T * I * dtype_size(dt));
        dev_download(hg, dg, (size_t)T * I * dtype_size(dt));
        unpack(dt, hg, got, (int64_t)T * I);
        compare("silu_mul", got, ref, (int64_t)T * I, tol_for(dt, 2e-6));
        cudaFree(dgu), cudaFree(dg);
        free(gu), free(guh), free(ref), free(got), free(hg);
    }
    /* a 16-bit gu for another output dtype is refused */
    assert_int_not_equal(silu_mul_cuda(NULL, DTYPE_F32, NULL, DTYPE_BF16, 1, 4, g_stream), 0);
    /* gather + bias */
    float *x = xmalloc((size_t)T * H * 4), *bias = xmalloc(H * 4),
          *ref = xmalloc((size_t)T * H * 4), *got = xmalloc((size_t)T * H * 4);
    for (int i = 0; i < T * H; i++)
        x[i] = frand();
    for (int i = 0; i < H; i++)
        bias[i] = frand();
    int32_t idx[5] = {12, 0, 5, 5, 7};
    float *dx = dev_upload(x, (size_t)T * H * 4), *db = dev_upload(bias, H * 4),
          *dy = dev_poisoned((size_t)5 * H * 4);
    int32_t *didx = dev_upload(idx, sizeof idx);
    OK(gather_rows_cuda(dy, dx, didx, 5, H, g_stream));
    for (int i = 0; i < 5; i++)
        memcpy(ref + i * H, x + idx[i] * H, H * 4);
    dev_download(got, dy, (size_t)5 * H * 4);
    compare("gather", got, ref, 5 * H, 0.0);
    OK(add_bias_cuda(dx, H, db, T, H - 3, g_stream)); /* the first N = H - 3 columns */
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++)
            ref[t * H + i] = x[t * H + i] + (i < H - 3 ? bias[i] : 0.0f);
    dev_download(got, dx, (size_t)T * H * 4);
    compare("add_bias", got, ref, T * H, 0.0);
    cudaFree(dx), cudaFree(db), cudaFree(dy), cudaFree(didx);
    free(x), free(bias), free(ref), free(got);
}

/* ---------------------------------------------------------------- graph edges (graph_edges.c) */

/* An MLP chain as a decode graph has it (cuBLASLt products, each followed by a kernel of ours
 * launched with programmatic dependent launch), captured, its edges moved as the decode graphs'
 * default mode moves them: the four edges out of the products are moved, every programmatic edge
 * of the graph then leaves its upstream kernel's launch-completion port, and 20 replays give
 * exactly the eager run's bytes (each replay first poisons the intermediates, so a kernel that
 * read one before the product writing it had finished would see NaNs). CVLLM_TEST_GRAPH_MODE=3
 * (GRAPH_EDGES_LIBRARY: the edges into cuBLASLt's kernels moved too) must fail: those kernels do
 * not wait (2026-11-26, H200: replay 0 differed). */
static void mlp_chain(CudaGemm *g, float *x, const void *w_norm, void *h, void *gu, void *gm,
                      const void *wgu, const void *wd, int T, int H, int I) {
    for (int l = 0; l < 2; l++) {
        OK(residual_rmsnorm_cuda(x, NULL, w_norm, h, DTYPE_BF16, T, H, 1e-6f, g_stream));
        OK(gemm_cuda_to(g, gu, DTYPE_BF16, 2 * I, h, wgu, DTYPE_BF16, T, 2 * I, H, g_stream));
        OK(silu_mul_cuda(gm, DTYPE_BF16, gu, DTYPE_BF16, T, I, g_stream));
        OK(gemm_cuda_acc(g, x, H, gm, wd, DTYPE_BF16, T, H, I, g_stream));
    }
    OK(residual_rmsnorm_cuda(x, NULL, w_norm, h, DTYPE_BF16, T, H, 1e-6f, g_stream));
    /* a kernel of ours after one of ours: that edge is not moved (mode 1) */
    OK(silu_mul_cuda(gm, DTYPE_BF16, h, DTYPE_BF16, T, H / 2, g_stream));
}

static void test_graph_edges(void **state) {
    (void)state;
    if (!cuda_pdl_enabled()) {
        printf("  skipped: no programmatic launch here (compute capability < 9.0 or "
               "CVLLM_CUDA_PDL=0)\n");
        return;
    }
    const char *me = getenv("CVLLM_TEST_GRAPH_MODE");
    const int mode = me && *me ? atoi(me) : GRAPH_EDGES_LC;
    void *ws = NULL;
    CK(cudaMalloc(&ws, 32 << 20));
    CudaGemm *g = NULL;
    OK(gemm_create(&g, ws, 32 << 20));
    gemm_set_mma_max_t(g, 0); /* every product through cuBLASLt */
    gemm_set_tma_max_t(g, 0);
    const int T = 64, H = 1024, I = 1536;
    float *x = xmalloc((size_t)T * H * 4), *wn = xmalloc(H * 4);
    float *wgu = xmalloc((size_t)2 * I * H * 4), *wd = xmalloc((size_t)H * I * 4);
    for (int64_t i = 0; i < (int64_t)T * H; i++)
        x[i] = 2 * frand();
    for (int i = 0; i < H; i++)
        wn[i] = 1 + 0.3f * frand();
    for (int64_t i = 0; i < (int64_t)2 * I * H; i++)
        wgu[i] = 0.05f * frand();
    for (int64_t i = 0; i < (int64_t)H * I; i++)
        wd[i] = 0.05f * frand();
    void *hwgu = pack(DTYPE_BF16, wgu, (int64_t)2 * I * H), *hwd = pack(DTYPE_BF16, wd,
                                                                          (int64_t)H * I);
    float *dx0 = dev_upload(x, (size_t)T * H * 4), *dx = dev_poisoned((size_t)T * H * 4);
    float *dwn = dev_upload(wn, H * 4);
    void *dwgu = dev_upload(hwgu, (size_t)2 * I * H * 2), *dwd = dev_upload(hwd, (size_t)H * I * 2);
    void *dh = dev_poisoned((size_t)T * H * 2), *dgu = dev_poisoned((size_t)T * 2 * I * 2),
         *dgm = dev_poisoned((size_t)T * I * 2);
    const size_t xb = (size_t)T * H * 4, hb = (size_t)T * H * 2;
    float *ref_x = xmalloc(xb), *got_x = xmalloc(xb);
    void *ref_h = xmalloc(hb), *got_h = xmalloc(hb);
    const size_t gb = (size_t)T * (H / 2) * 2; /* the last kernel's output, in dgm */
    void *ref_g = xmalloc(gb), *got_g = xmalloc(gb);
    /* eager (plans made here, outside the capture) */
    CK(cudaMemcpyAsync(dx, dx0, xb, cudaMemcpyDeviceToDevice, g_stream));
    mlp_chain(g, dx, dwn, dh, dgu, dgm, dwgu, dwd, T, H, I);
    dev_download(ref_x, dx, xb);
    dev_download(ref_h, dh, hb);
    dev_download(ref_g, dgm, gb);
    for (int64_t i = 0; i < (int64_t)T * H; i++)
        assert_false(isnan(ref_x[i]));
    /* the graph: inputs reset and intermediates poisoned, then the chain */
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
    CK(cudaMemcpyAsync(dx, dx0, xb, cudaMemcpyDeviceToDevice, g_stream));
    CK(cudaMemsetAsync(dh, 0xFF, hb, g_stream));
    CK(cudaMemsetAsync(dgu, 0xFF, (size_t)T * 2 * I * 2, g_stream));
    CK(cudaMemsetAsync(dgm, 0xFF, (size_t)T * I * 2, g_stream));
    mlp_chain(g, dx, dwn, dh, dgu, dgm, dwgu, dwd, T, H, I);
    CK(cudaStreamEndCapture(g_stream, &graph));
    int moved = 0;
    OK(cuda_graph_edges_launch_completion(graph, mode, 0, &moved));
    /* four products followed by a kernel of ours: those four edges moved (mode 1: those alone,
     * the edge between the last two kernels, both ours, stays at the programmatic port) */
    if (mode == GRAPH_EDGES_LC ? moved != 4 : moved < 4)
        fail_msg("graph edges: %d moved, want %s4", moved, mode == GRAPH_EDGES_LC ? "" : ">= ");
    size_t ne = 0;
    CK(cudaGraphGetEdges(graph, NULL, NULL, NULL, &ne));
    cudaGraphNode_t *from = xmalloc(ne * sizeof *from), *to = xmalloc(ne * sizeof *to);
    cudaGraphEdgeData *ed = xmalloc(ne * sizeof *ed);
    CK(cudaGraphGetEdges(graph, from, to, ed, &ne));
    int lc = 0, kept = 0;
    for (size_t i = 0; i < ne; i++)
        if (ed[i].type == cudaGraphDependencyTypeProgrammatic) {
            if (ed[i].from_port == cudaGraphKernelNodePortLaunchCompletion)
                lc++;
            else if (ed[i].from_port == cudaGraphKernelNodePortProgrammatic)
                kept++;
            else
                fail_msg("graph edges: a programmatic edge from port %d", ed[i].from_port);
        }
    assert_int_equal(lc, moved);
    if (mode == GRAPH_EDGES_LC) assert_int_equal(kept, 1);
    free(from), free(to), free(ed);
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 20; rep++) {
        CK(cudaGraphLaunch(exec, g_stream));
        dev_download(got_x, dx, xb);
        dev_download(got_h, dh, hb);
        dev_download(got_g, dgm, gb);
        if (memcmp(got_x, ref_x, xb) || memcmp(got_h, ref_h, hb) || memcmp(got_g, ref_g, gb))
            fail_msg("graph edges (mode %d, %d moved): replay %d differs from the eager run",
                     mode, moved, rep);
    }
    printf("  graph edges: %d programmatic edges at launch completion (mode %d), 20 replays "
           "equal to the eager run\n", moved, mode);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    gemm_destroy(g);
    cudaFree(ws), cudaFree(dx0), cudaFree(dx), cudaFree(dwn), cudaFree(dwgu), cudaFree(dwd);
    cudaFree(dh), cudaFree(dgu), cudaFree(dgm);
    free(x), free(wn), free(wgu), free(wd), free(hwgu), free(hwd);
    free(ref_x), free(got_x), free(ref_h), free(got_h), free(ref_g), free(got_g);
}

/* ---------------------------------------------------------------- matrix products */

static void test_gemm(void **state) {
    (void)state;
    void *ws = NULL;
    CK(cudaMalloc(&ws, 32 << 20));
    CudaGemm *g = NULL;
    OK(gemm_create(&g, ws, 32 << 20));
    /* T <= 4 with K % 8 == 0 runs in gemv.cu (T 1..4, K 1024, 3072, 2048; N >= 2048 a warp per
     * row, odd N of both kinds); {2, 96, 100}: K not a multiple of 8, cuBLASLt; the rest
     * cuBLASLt, among them the decode shapes of T 8..256 (odd N and T included) */
    const int shapes[][3] = {{1, 1024, 1024},  {3, 4096, 1024}, {17, 3072, 1024}, {64, 512, 96},
                             {257, 1000, 320}, {5, 151936, 64}, {1000, 96, 128},  {2, 1024, 3072},
                             {4, 6144, 1024},  {1, 1023, 2048}, {2, 96, 100},     {2, 2049, 2048},
                             {8, 1024, 2048},  {40, 1024, 3072}, {128, 1000, 2048}, {200, 4096, 1024},
                             {256, 1024, 3072}, {33, 6144, 1024}, {9, 1030, 1024}};
    /* path 0: gemm_cuda (cuBLASLt above the GEMV's sizes); path 1: gemm_mma_cuda for every
     * shape of T > 4 it takes (K a multiple of 64, bf16 / f16: split over the blocks of a
     * cluster, T over several tiles at 257 and 1000, N not a multiple of the tile; above 32
     * tokens its wgmma kernel on a 9.0 device with the sm_90a build); path 2: gemm_tma_cuda for
     * every shape it takes (the same, of any T, on a 9.0 device with the sm_90a build: tiles of
     * 128 tokens, T past a tile at 200, 256, 257 and 1000) */
    gemm_set_mma_max_t(g, 0);
    gemm_set_tma_max_t(g, 0);
    typedef int (*ProductFn)(void *, DType, int, int64_t, const void *, const void *, DType, int,
                             int, int, cudaStream_t);
    const ProductFn own[3] = {NULL, gemm_mma_cuda, gemm_tma_cuda};
    if (!gemm_tma_supported(DTYPE_BF16, 64, 1024, NULL, NULL))
        printf("  gemm_tma.cu not run: no 9.0 device or no sm_90a code in this build\n");
    for (int path = 0; path < 3; path++)
    for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++)
        for (int di = 0; di < 3; di++) {
            const int T = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            if (path == 1 && (T <= 4 || !gemm_mma_supported(DTYPES[di], T, K, NULL, NULL)))
                continue;
            if (path == 2 && !gemm_tma_supported(DTYPES[di], T, K, NULL, NULL)) continue;
            const DType dt = DTYPES[di];
            const int64_t ldy = N + (si & 1) * 5;
            float *x = xmalloc((size_t)T * K * 4), *w = xmalloc((size_t)N * K * 4);
            for (int64_t i = 0; i < (int64_t)T * K; i++)
                x[i] = round_to(dt, frand());
            for (int64_t i = 0; i < (int64_t)N * K; i++)
                w[i] = round_to(dt, 0.5f * frand());
            void *xh = pack(dt, x, (int64_t)T * K), *wh = pack(dt, w, (int64_t)N * K);
            void *dxh = dev_upload(xh, (size_t)T * K * dtype_size(dt)),
                 *dwh = dev_upload(wh, (size_t)N * K * dtype_size(dt));
            float *ref = xmalloc((size_t)T * N * 4), *gotc = xmalloc((size_t)T * N * 4);
            MatmulArgs a = {
                .x = x, .ldx = K, .T = T, .w = w, .wdt = DTYPE_F32, .K = K, .y = ref, .ldy = N};
            matmul_rows_scalar(&a, 0, N);
            /* f32 output (gemm_cuda), the inputs' dtype (gemm_cuda_to, the "gu16" product), then
             * added to an f32 y (gemm_cuda_acc, the "res" products: y0 + the product) */
            float *y0 = xmalloc((size_t)T * ldy * 4), *ref0 = xmalloc((size_t)T * N * 4);
            for (int64_t i = 0; i < (int64_t)T * ldy; i++)
                y0[i] = 4 * frand();
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N; n++)
                    ref0[(int64_t)t * N + n] = y0[(int64_t)t * ldy + n] + ref[(int64_t)t * N + n];
            for (int oi = 0; oi < 3; oi++) {
                if (oi == 1 && dt == DTYPE_F32) continue;
                const DType ydt = oi == 1 ? dt : DTYPE_F32;
                const size_t ys = dtype_size(ydt);
                void *dy = oi == 2 ? dev_upload(y0, (size_t)T * ldy * 4)
                                   : dev_poisoned((size_t)T * ldy * ys);
                if (path)
                    OK(own[path](dy, ydt, oi == 2, ldy, dxh, dwh, dt, T, N, K, g_stream));
                else if (oi == 2)
                    OK(gemm_cuda_acc(g, dy, ldy, dxh, dwh, dt, T, N, K, g_stream));
                else if (oi == 1)
                    OK(gemm_cuda_to(g, dy, ydt, ldy, dxh, dwh, dt, T, N, K, g_stream));
                else
                    OK(gemm_cuda(g, dy, ldy, dxh, dwh, dt, T, N, K, g_stream));
                char *got = xmalloc((size_t)T * ldy * ys);
                dev_download(got, dy, (size_t)T * ldy * ys);
                for (int t = 0; t < T; t++)
                    unpack(ydt, got + (size_t)t * ldy * ys, gotc + (int64_t)t * N, N);
                if (path && oi == 0) { /* the same bits again (the splits add in a fixed order) */
                    void *dy2 = dev_poisoned((size_t)T * ldy * ys);
                    char *got2 = xmalloc((size_t)T * ldy * ys);
                    OK(own[path](dy2, ydt, 0, ldy, dxh, dwh, dt, T, N, K, g_stream));
                    dev_download(got2, dy2, (size_t)T * ldy * ys);
                    for (int t = 0; t < T; t++)
                        if (memcmp(got + (size_t)t * ldy * ys, got2 + (size_t)t * ldy * ys,
                                   (size_t)N * ys))
                            fail_msg("gemm_%s [%d,%d]x[%d,%d]^T: row %d differs between runs",
                                     path == 1 ? "mma" : "tma", T, K, N, K, t);
                    cudaFree(dy2);
                    free(got2);
                }
                char what[96];
                snprintf(what, sizeof what, "gemm%s %s [%d,%d]x[%d,%d]^T -> %s%s",
                         path == 1 ? " (mma)" : path == 2 ? " (tma)" : "", dtype_name(dt), T, K, N,
                         K, dtype_name(ydt),
                         oi == 2 ? " (+= y)" : "");
                compare(what, gotc, oi == 2 ? ref0 : ref, (int64_t)T * N,
                        dt == DTYPE_F32 ? 2e-5 : oi == 1 ? tol_for(dt, 0) : 1e-4);
                cudaFree(dy);
                free(got);
            }
            free(y0), free(ref0);
            cudaFree(dxh), cudaFree(dwh);
            free(x), free(w), free(xh), free(wh), free(ref), free(gotc);
        }
    /* an output dtype that is neither f32 nor the inputs' is refused (cuBLASLt and GEMV paths),
     * and so is a 16-bit output accumulated */
    assert_int_not_equal(
        gemm_cuda_to(g, ws, DTYPE_F16, 64, ws, ws, DTYPE_BF16, 16, 64, 64, g_stream), 0);
    assert_int_not_equal(
        gemv_cuda_out(ws, DTYPE_F16, 0, 64, ws, ws, DTYPE_BF16, 1, 64, 64, g_stream), 0);
    assert_int_not_equal(
        gemv_cuda_out(ws, DTYPE_BF16, 1, 64, ws, ws, DTYPE_BF16, 1, 64, 64, g_stream), 0);
    for (int path = 1; path < 3; path++) { /* gemm_mma_cuda, gemm_tma_cuda */
        assert_int_not_equal(own[path](ws, DTYPE_F16, 0, 64, ws, ws, DTYPE_BF16, 16, 64, 64,
                                       g_stream), 0);
        assert_int_not_equal(own[path](ws, DTYPE_BF16, 1, 64, ws, ws, DTYPE_BF16, 16, 64, 64,
                                       g_stream), 0);
        assert_int_not_equal( /* K not a multiple of 64 */
            own[path](ws, DTYPE_F32, 0, 64, ws, ws, DTYPE_BF16, 16, 64, 96, g_stream), 0);
        assert_int_not_equal( /* rows of y closer than N */
            own[path](ws, DTYPE_F32, 0, 32, ws, ws, DTYPE_BF16, 16, 64, 64, g_stream), 0);
    }
    gemm_destroy(g);
    cudaFree(ws);
}

/* gemv_silu_pair_cuda against gemv_cuda_out + silu_mul_cuda (bit for bit where gemv_cuda also
 * takes a warp a row: 2N >= 2048; else within a bf16 step) and the CPU (matmul, the two dots
 * rounded to the gate/up dtype, then silu_mul's formula, rounded to the dtype), with an f32 and a
 * 16-bit gate/up (the backend's "gu16"); N odd, K down to 64. A gate/up dtype that is neither is
 * refused. */
static void test_gemv_silu_pair(void **state) {
    (void)state;
    const int shapes[][2] = {{3072, 1024}, {2048, 1024}, {1025, 64}, {512, 3072}, {100, 2048}};
    for (int si = 0; si < 5; si++)
        for (int di = 0; di < 4; di++) {
            const int N = shapes[si][0], K = shapes[si][1];
            const DType dt = DTYPES[di % 2], gudt = di < 2 ? DTYPE_F32 : dt;
            const size_t es = dtype_size(dt), ges = dtype_size(gudt);
            float *w = xmalloc((size_t)2 * N * K * 4), *x = xmalloc((size_t)K * 4);
            for (int64_t i = 0; i < (int64_t)2 * N * K; i++)
                w[i] = round_to(dt, 0.5f * frand());
            for (int i = 0; i < K; i++)
                x[i] = round_to(dt, frand());
            void *wh = pack(dt, w, (int64_t)2 * N * K), *xh = pack(dt, x, K);
            void *dw = dev_upload(wh, (size_t)2 * N * K * es), *dx = dev_upload(xh, (size_t)K * es);
            void *dg = dev_poisoned((size_t)N * es), *dg2 = dev_poisoned((size_t)N * es);
            void *dgu = dev_poisoned((size_t)2 * N * ges);
            OK(gemv_silu_pair_cuda(dg, dx, dw, dt, gudt, N, K, g_stream));
            OK(gemv_cuda_out(dgu, gudt, 0, 2 * N, dx, dw, dt, 1, 2 * N, K, g_stream));
            OK(silu_mul_cuda(dg2, dt, dgu, gudt, 1, N, g_stream));
            void *h1 = xmalloc((size_t)N * es), *h2 = xmalloc((size_t)N * es);
            float *g1 = xmalloc((size_t)N * 4), *g2 = xmalloc((size_t)N * 4),
                  *gu = xmalloc((size_t)2 * N * 4), *ref = xmalloc((size_t)N * 4);
            dev_download(h1, dg, (size_t)N * es);
            dev_download(h2, dg2, (size_t)N * es);
            unpack(dt, h1, g1, N);
            unpack(dt, h2, g2, N);
            char what[96];
            snprintf(what, sizeof what, "gemv silu pair %s [2 x %d x %d] gate/up %s",
                     dtype_name(dt), N, K, dtype_name(gudt));
            if (2 * N >= 2048) {
                if (memcmp(h1, h2, (size_t)N * es)) compare(what, g1, g2, N, 0.0);
            } else {
                compare(what, g1, g2, N, 1e-2);
            }
            MatmulArgs a = {
                .x = x, .ldx = K, .T = 1, .w = w, .wdt = DTYPE_F32, .K = K, .y = gu, .ldy = 2 * N};
            matmul_rows_scalar(&a, 0, 2 * N);
            for (int i = 0; i < 2 * N; i++)
                gu[i] = round_to(gudt, gu[i]);
            for (int i = 0; i < N; i++)
                ref[i] = round_to(dt, gu[i] / (1.0f + expf(-gu[i])) * gu[N + i]);
            snprintf(what, sizeof what, "gemv silu pair %s [2 x %d x %d] gate/up %s vs CPU",
                     dtype_name(dt), N, K, dtype_name(gudt));
            compare(what, g1, ref, N, 1e-2);
            cudaFree(dw), cudaFree(dx), cudaFree(dg), cudaFree(dg2), cudaFree(dgu);
            free(w), free(x), free(wh), free(xh), free(h1), free(h2), free(g1), free(g2), free(gu),
                free(ref);
        }
    {
        void *ws = dev_poisoned(1 << 16);
        assert_int_not_equal(
            gemv_silu_pair_cuda(ws, ws, ws, DTYPE_BF16, DTYPE_F16, 64, 64, g_stream), 0);
        cudaFree(ws);
    }
    /* one wave: a block (256 threads) per 8 outputs, at most 8 blocks an SM */
    assert_true(gemv_silu_pair_one_wave(DTYPE_BF16, 8, 1));
    assert_false(gemv_silu_pair_one_wave(DTYPE_BF16, 72, 1));
    assert_false(gemv_silu_pair_one_wave(DTYPE_F16, 72, 1));
}

/* copy_segments_cuda from pinned, device-mapped host memory (the backend's step inputs): segments
 * of 4 to 280,004 bytes, 16-byte aligned or not, into a poisoned buffer; the bytes between the
 * segments stay poisoned. And a size that is not in 4-byte words is refused. */
static void test_copy_segments(void **state) {
    (void)state;
    const int64_t sizes[8] = {4, 12, 16, 20, 4004, 280004, 64, 36};
    const int64_t soff[8] = {0, 4, 16, 36, 256, 8192, 4, 300004}; /* byte offsets, some unaligned */
    const int64_t total = 310000, dsz = 8 * 300016;
    uint8_t *h = NULL;
    CK(cudaMallocHost((void **)&h, total));
    for (int64_t i = 0; i < total; i++)
        h[i] = (uint8_t)(i * 131 + 7);
    void *hd = NULL;
    CK(cudaHostGetDevicePointer(&hd, h, 0));
    uint8_t *d = dev_poisoned(dsz);
    CopySegments g = {.n = 8};
    int64_t doff[8];
    for (int i = 0; i < 8; i++) {
        doff[i] = (int64_t)i * 300016 + (i % 2) * 4; /* every other one not 16-byte aligned */
        g.src[i] = (const uint8_t *)hd + soff[i];
        g.dst[i] = d + doff[i];
        g.bytes[i] = sizes[i];
    }
    OK(copy_segments_cuda(&g, g_stream));
    uint8_t *got = xmalloc(dsz);
    dev_download(got, d, dsz);
    for (int i = 0; i < 8; i++) {
        if (memcmp(got + doff[i], h + soff[i], sizes[i]))
            fail_msg("copy_segments: segment %d (%lld bytes) differs", i, (long long)sizes[i]);
        const int64_t end = doff[i] + sizes[i], next = i + 1 < 8 ? doff[i + 1] : dsz;
        for (int64_t k = end; k < next; k++)
            if (got[k] != 0xFF) fail_msg("copy_segments: byte %lld past segment %d written",
                                         (long long)k, i);
    }
    g.bytes[3] = 6;
    assert_int_not_equal(copy_segments_cuda(&g, g_stream), 0);
    /* ids_from: segment 0's -(r + 1) become ids_from[r] (asynchronous steps: the ids the step
     * before sampled, read where the sampler wrote them), the other segments copied as they are */
    int32_t *ids = (int32_t *)h, *from = (int32_t *)(h + 200000);
    for (int t = 0; t < 300; t++) ids[t] = t % 3 == 1 ? -(t % 7) - 1 : 1000 + t;
    for (int r = 0; r < 7; r++) from[r] = 50000 + r;
    CopySegments gi = {.n = 2, .ids_from = (const int32_t *)((uint8_t *)hd + 200000)};
    gi.src[0] = hd, gi.dst[0] = d, gi.bytes[0] = 300 * 4;
    gi.src[1] = hd, gi.dst[1] = d + 4096, gi.bytes[1] = 300 * 4;
    OK(copy_segments_cuda(&gi, g_stream));
    dev_download(got, d, 8192);
    const int32_t *gid = (const int32_t *)got, *raw = (const int32_t *)(got + 4096);
    for (int t = 0; t < 300; t++) {
        const int32_t want = t % 3 == 1 ? 50000 + t % 7 : 1000 + t;
        if (gid[t] != want)
            fail_msg("copy_segments ids_from: id %d is %d, not %d", t, gid[t], want);
        if (raw[t] != ids[t]) fail_msg("copy_segments ids_from: segment 1 word %d changed", t);
    }
    /* rows (the block tables' used columns): rows[i] runs of bytes[i], src_pitch / dst_pitch
     * apart, beside ids with ids_from and a one-run segment; the bytes between the rows and
     * past the last one untouched */
    CK(cudaMemset(d, 0xFF, 1 << 20));
    const int nr = 257, rb = 20;                  /* rows of 5 words */
    const int64_t sp = 64, dp = 1028, d2 = 65536; /* pitches; where the rows go on the device */
    CopySegments gr = {.n = 3, .ids_from = (const int32_t *)((uint8_t *)hd + 200000)};
    gr.src[0] = hd, gr.dst[0] = d, gr.bytes[0] = 300 * 4;
    gr.src[1] = (const uint8_t *)hd + 4096, gr.dst[1] = d + d2, gr.bytes[1] = rb;
    gr.rows[1] = nr, gr.src_pitch[1] = sp, gr.dst_pitch[1] = dp;
    gr.src[2] = (const uint8_t *)hd + 100000, gr.dst[2] = d + 4096, gr.bytes[2] = 4000;
    OK(copy_segments_cuda(&gr, g_stream));
    uint8_t *got2 = xmalloc(1 << 20);
    dev_download(got2, d, 1 << 20);
    for (int t = 0; t < 300; t++)
        if (((const int32_t *)got2)[t] != (t % 3 == 1 ? 50000 + t % 7 : 1000 + t))
            fail_msg("copy_segments rows: id %d wrong", t);
    if (memcmp(got2 + 4096, h + 100000, 4000)) fail_msg("copy_segments rows: segment 2 differs");
    for (int64_t k = d2; k < d2 + nr * dp + 64; k++) {
        const int64_t r = (k - d2) / dp, c = (k - d2) % dp;
        const uint8_t want = r < nr && c < rb ? h[4096 + r * sp + c] : 0xFF;
        if (got2[k] != want)
            fail_msg("copy_segments rows: byte %lld (row %lld, column %lld) is %d, not %d",
                     (long long)k, (long long)r, (long long)c, got2[k], want);
    }
    gr.dst_pitch[1] = 1026; /* not in words */
    assert_int_not_equal(copy_segments_cuda(&gr, g_stream), 0);
    free(got2);
    cudaFree(d);
    cudaFreeHost(h);
    free(got);
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    int n_heads, n_kv_heads, hd, block_size;
    DType kvdt, adt;
    int num_seqs;
    int ctx[8], qlen[8]; /* per sequence: keys, new tokens (the last qlen of the keys) */
    int decode;          /* qlen all 1: also through the decode kernel */
    int parts;           /* decode: forced partition count, 0 = the launcher's choice */
    float k_scale, v_scale; /* fp8 cache: its scales (0: 1.0) */
    float ramp; /* > 0: key j of a sequence of ctx keys scaled by 1 + ramp * j / ctx, so that
                 * the scores' max keeps rising along the context */
} AttnCase;

/* Block tables [S, maxblk] for sequences of ctx[s] keys in blocks of bs: the cache's
 * *num_blocks blocks (those in use and 3 more) in a random permutation, entries past a
 * sequence's last block -1. */
static int32_t *random_tables(const int *ctx, int S, int bs, int maxblk, int *num_blocks) {
    int nb = 3;
    for (int s = 0; s < S; s++)
        nb += (ctx[s] + bs - 1) / bs;
    int32_t *perm = xmalloc(nb * sizeof(int32_t));
    for (int i = 0; i < nb; i++)
        perm[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int32_t *tables = xmalloc((size_t)S * maxblk * sizeof(int32_t));
    int used = 0;
    for (int s = 0; s < S; s++)
        for (int b = 0; b < maxblk; b++)
            tables[s * maxblk + b] = b < (ctx[s] + bs - 1) / bs ? perm[used++] : -1;
    free(perm);
    *num_blocks = nb;
    return tables;
}

static void run_attention_case(const AttnCase *c) {
    const int S = c->num_seqs, hd = c->hd, nh = c->n_heads, nkv = c->n_kv_heads, bs = c->block_size;
    int T = 0, maxq = 0, maxk = 0, maxblk = 0;
    for (int s = 0; s < S; s++) {
        T += c->qlen[s];
        if (c->qlen[s] > maxq) maxq = c->qlen[s];
        if (c->ctx[s] > maxk) maxk = c->ctx[s];
        if ((c->ctx[s] + bs - 1) / bs > maxblk) maxblk = (c->ctx[s] + bs - 1) / bs;
    }
    maxblk += 1; /* a padded column: -1 */
    int num_blocks;
    int32_t *tables = random_tables(c->ctx, S, bs, maxblk, &num_blocks);
    /* the cache, random everywhere, as the device type */
    const int64_t kvs = (int64_t)nkv * hd, cache_n = (int64_t)num_blocks * bs * kvs;
    float *kf = xmalloc(cache_n * 4), *vf = xmalloc(cache_n * 4);
    for (int64_t i = 0; i < cache_n; i++)
        kf[i] = round_to(c->kvdt, frand()), vf[i] = round_to(c->kvdt, frand());
    for (int s = 0; c->ramp > 0 && s < S; s++)
        for (int j = 0; j < c->ctx[s]; j++) {
            const int64_t row = (int64_t)tables[s * maxblk + j / bs] * bs + j % bs;
            const float f = 1.0f + c->ramp * (float)j / (float)c->ctx[s];
            for (int64_t i = row * kvs; i < (row + 1) * kvs; i++)
                kf[i] = round_to(c->kvdt, kf[i] * f);
        }
    /* decode: the rows of a sequence's last block past its context hold NaN (a cache block's
     * other rows are never read as keys; a kernel that loads them must keep them out of the
     * output, 0 * NaN included). The CPU twin reads no such row. */
    for (int s = 0; c->decode && s < S; s++)
        for (int j = c->ctx[s]; j % bs; j++) {
            const int64_t row = (int64_t)tables[s * maxblk + j / bs] * bs + j % bs;
            for (int64_t i = row * kvs; i < (row + 1) * kvs; i++)
                kf[i] = vf[i] = NAN;
        }
    void *kh = pack(c->kvdt, kf, cache_n), *vh = pack(c->kvdt, vf, cache_n);
    /* queries in a padded qkv-like buffer */
    const int64_t ldq = (int64_t)(nh + 2 * nkv) * hd;
    float *q = xmalloc((size_t)T * ldq * 4), *qc = xmalloc((size_t)T * nh * hd * 4);
    for (int64_t i = 0; i < T * ldq; i++)
        q[i] = 2 * frand();
    for (int t = 0; t < T; t++)
        memcpy(qc + (int64_t)t * nh * hd, q + t * ldq, (size_t)nh * hd * 4);
    int32_t cu[9] = {0}, *nkeys = xmalloc(T * 4), *tseq = xmalloc(T * 4);
    for (int s = 0; s < S; s++) {
        cu[s + 1] = cu[s] + c->qlen[s];
        for (int i = 0; i < c->qlen[s]; i++) {
            nkeys[cu[s] + i] = c->ctx[s] - c->qlen[s] + i + 1; /* causal: keys up to its own */
            tseq[cu[s] + i] = s;
        }
    }
    /* CPU reference (an fp8 cache: the twin reads the same codes with the same scales) */
    const int fp8 = c->kvdt == DTYPE_FP8_E4M3;
    const float ks = c->k_scale > 0 ? c->k_scale : 1.0f, vs = c->v_scale > 0 ? c->v_scale : 1.0f;
    float *ref = xmalloc((size_t)T * nh * hd * 4);
    float *scratch = xmalloc((size_t)threadpool_size(g_pool) * nh * (maxk + 1) * 4);
    AttentionArgs aa = {.q = qc,
                        .out = ref,
                        .k_cache = fp8 ? kh : (void *)kf,
                        .v_cache = fp8 ? vh : (void *)vf,
                        .kv_dtype = fp8 ? DTYPE_FP8_E4M3 : DTYPE_F32,
                        .k_scale = ks,
                        .v_scale = vs,
                        .num_tokens = T,
                        .n_heads = nh,
                        .n_kv_heads = nkv,
                        .head_dim = hd,
                        .block_size = bs,
                        .scale = 1.0f / sqrtf((float)hd),
                        .num_keys = nkeys,
                        .token_seq = tseq,
                        .block_tables = tables,
                        .max_blocks_per_seq = maxblk,
                        .scratch = scratch,
                        .scratch_stride = (int64_t)nh * (maxk + 1)};
    attention_cpu(g_pool, &aa);
    /* device */
    const size_t cb = cache_n * dtype_size(c->kvdt), ob = (size_t)T * nh * hd * dtype_size(c->adt);
    void *dk = dev_upload(kh, cb), *dv = dev_upload(vh, cb);
    float *dq = dev_upload(q, (size_t)T * ldq * 4);
    int32_t *dcu = dev_upload(cu, sizeof(int32_t) * (S + 1)),
            *dtab = dev_upload(tables, (size_t)S * maxblk * 4);
    int32_t ctxs[8];
    for (int s = 0; s < S; s++)
        ctxs[s] = c->ctx[s];
    int32_t *dctx = dev_upload(ctxs, sizeof(int32_t) * S);
    AttentionParams p = {.q = dq,
                         .ldq = ldq,
                         .adt = c->adt,
                         .k_cache = dk,
                         .v_cache = dv,
                         .cache_rows = (int64_t)num_blocks * bs,
                         .kvdt = c->kvdt,
                         .k_scale = ks,
                         .v_scale = vs,
                         .n_heads = nh,
                         .n_kv_heads = nkv,
                         .hd = hd,
                         .block_size = bs,
                         .scale = 1.0f / sqrtf((float)hd),
                         .num_seqs = S,
                         .cu_seqlens_q = dcu,
                         .context_lens = dctx,
                         .block_tables = dtab,
                         .max_blocks_per_seq = maxblk,
                         .max_seqlen_q = maxq,
                         .max_seqlen_k = maxk};
    float *got = xmalloc((size_t)T * nh * hd * 4);
    void *oh = xmalloc(ob);
    char what[160];
    /* kinds: 0 prefill; decode: 1 in sequence order, 2 the blocks launched in another order
     * (p.seq_order: the sequences reversed, as the backend's longest-first order may), 3 that
     * order by records (p.dec_rec: the same bytes as 2) */
    int32_t order[8], rec[8 * DEC_REC_INTS];
    for (int s = 0; s < S; s++)
        order[s] = S - 1 - s;
    attention_decode_records(order, S, ctxs, cu, NULL, NULL, tables, maxblk, bs, rec);
    int32_t *dorder = dev_upload(order, sizeof(int32_t) * S),
            *drec = dev_upload(rec, sizeof(int32_t) * S * DEC_REC_INTS);
    void *oh_order = xmalloc(ob);
    for (int kind = 0; kind < (c->decode ? 4 : 1); kind++) {
        p.out = dev_poisoned(ob);
        void *ws = NULL;
        if (kind == 0) {
            OK(attention_prefill_cuda(&p, g_stream));
        } else {
            int parts = c->parts ? c->parts : attention_decode_num_parts(&p, 132);
            ws = dev_poisoned(attention_decode_ws_bytes(S, nh, hd, parts) + 4);
            p.seq_order = kind == 2 ? dorder : NULL;
            p.dec_rec = kind == 3 ? drec : NULL;
            OK(attention_decode_cuda(&p, parts, ws, g_stream));
            p.seq_order = NULL, p.dec_rec = NULL;
        }
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaGetLastError());
        dev_download(oh, p.out, ob);
        if (kind == 2) memcpy(oh_order, oh, ob);
        unpack(c->adt, oh, got, (int64_t)T * nh * hd);
        snprintf(what, sizeof what,
                 "%s attention hd %d heads %d/%d bs %d kv %s (scales %g %g) out %s seqs %d ctx0 %d "
                 "q0 %d",
                 kind ? "decode" : "prefill", hd, nh, nkv, bs, dtype_name(c->kvdt), ks, vs,
                 dtype_name(c->adt), S, c->ctx[0], c->qlen[0]);
        if (kind == 2) strncat(what, " (reversed launch order)", sizeof what - strlen(what) - 1);
        if (kind == 3) {
            strncat(what, " (reversed, by records)", sizeof what - strlen(what) - 1);
            if (memcmp(oh, oh_order, ob)) fail_msg("%s: the output differs from seq_order's", what);
        }
        double tol = tol_for(c->adt, 2e-5);
        /* the tensor-core prefill rounds q and the softmax weights to the cache's 16-bit type
         * (fp8: to the model's, adt, and the dequantized keys and values too); the tensor-core
         * decode to the cache's (fp8: to f16, which holds e4m3 exactly) */
        const int tc = kind == 0 ? attention_prefill_uses_tc(&p) : attention_decode_uses_tc(&p);
        if (tc) {
            const DType t16dt = kind == 0 ? (fp8 ? c->adt : c->kvdt) : (fp8 ? DTYPE_F16 : c->kvdt);
            const double t16 = t16dt == DTYPE_BF16 ? 2e-2 : 4e-3;
            if (tol < t16) tol = t16;
            strncat(what, kind && attention_decode_uses_tma(&p) ? " (tensor cores, TMA)"
                                                                : " (tensor cores)",
                    sizeof what - strlen(what) - 1);
        }
        const double rel = compare(what, got, ref, (int64_t)T * nh * hd, tol);
        if (tc) printf("    %s: %.2e\n", what, rel);
        if (kind == 0 && tc) { /* q already rounded (AttentionParams.q16): the very same bytes */
            const int64_t ld16 = (int64_t)nh * hd + 8; /* a padded row */
            float *qr = xcalloc((size_t)T * ld16, 4);
            for (int t = 0; t < T; t++)
                memcpy(qr + t * ld16, q + (int64_t)t * ldq, (size_t)nh * hd * 4);
            void *qh = pack(attention_prefill_tc_dtype(&p), qr, T * ld16);
            void *dq16 = dev_upload(qh, (size_t)T * ld16 * 2);
            void *out1 = p.out, *oh2 = xmalloc(ob);
            p.out = dev_poisoned(ob);
            p.q16 = dq16, p.ldq16 = ld16;
            OK(attention_prefill_cuda(&p, g_stream));
            CK(cudaStreamSynchronize(g_stream));
            dev_download(oh2, p.out, ob);
            if (memcmp(oh, oh2, ob)) fail_msg("%s: with q16 the output differs", what);
            p.q16 = NULL, p.ldq16 = 0;
            cudaFree(p.out), cudaFree(dq16);
            p.out = out1;
            free(qr), free(qh), free(oh2);
        }
        if (kind == 0 && c->kvdt == DTYPE_F32) { /* no tensor cores: a q16 is refused */
            p.q16 = dq, p.ldq16 = (int64_t)nh * hd;
            assert_int_not_equal(attention_prefill_cuda(&p, g_stream), 0);
            p.q16 = NULL, p.ldq16 = 0;
        }
        if (kind && c->ramp > 0) {
            /* the lazy rule (the default) against the running max moved at every step: the same
             * products, only the weights rounded relative to another max (a 16-bit step each) */
            void *out1 = p.out;
            p.out = dev_poisoned(ob);
            p.seq_order = kind == 2 ? dorder : NULL;
            p.dec_rec = kind == 3 ? drec : NULL;
            attention_decode_set_lazy(0);
            OK(attention_decode_cuda(&p, c->parts ? c->parts : attention_decode_num_parts(&p, 132),
                                     ws, g_stream));
            attention_decode_set_lazy(1);
            p.seq_order = NULL, p.dec_rec = NULL;
            CK(cudaStreamSynchronize(g_stream));
            float *got2 = xmalloc((size_t)T * nh * hd * 4);
            dev_download(oh, p.out, ob);
            unpack(c->adt, oh, got2, (int64_t)T * nh * hd);
            strncat(what, ", lazy vs every step", sizeof what - strlen(what) - 1);
            const double lt = !tc ? 1e-6 : c->kvdt == DTYPE_BF16 ? 1e-2 : 2e-3;
            printf("    %s: %.2e\n", what, compare(what, got, got2, (int64_t)T * nh * hd, lt));
            free(got2);
            cudaFree(p.out);
            p.out = out1;
        }
        cudaFree(p.out);
        cudaFree(ws);
    }
    cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dcu), cudaFree(dtab), cudaFree(dctx),
        cudaFree(dorder), cudaFree(drec);
    free(oh_order);
    free(tables), free(kf), free(vf), free(kh), free(vh), free(q), free(qc),
        free(nkeys), free(tseq), free(ref), free(scratch), free(got), free(oh);
}

static void prefill_cases(void) {
    /* GQA ratios 1, 2, 3, 8 and MQA; odd lengths; cached prefixes (qlen < ctx); block boundaries */
    const int heads[][2] = {{4, 4}, {8, 4}, {6, 2}, {16, 2}, {8, 1}};
    const int hds[] = {16, 32, 64, 128, 256, 24, 80}; /* and two head_dims between the sizes */
    const int bss[] = {16, 1, 7, 32, 64, 128, 256};
    for (int hi = 0; hi < 5; hi++)
        for (int di = 0; di < 7; di++) {
            /* CVLLM_TEST_SMALL=2 (racecheck, which is slow): every GQA shape at head_dim 128 */
            if (small_run() > 1 && di != 3) continue;
            AttnCase c = {.n_heads = heads[hi][0],
                          .n_kv_heads = heads[hi][1],
                          .hd = hds[di],
                          .block_size = bss[(hi + di) % 7],
                          .kvdt = DTYPES[(hi + di) % 3],
                          .adt = DTYPES[hi % 3],
                          .num_seqs = 4,
                          .ctx = {33, 1, 100, 257},
                          .qlen = {33, 1, 37, 64}};
            run_attention_case(&c);
        }
    /* an fp8 cache: every head_dim, GQA shape and output type (bf16 / f16 out at head_dim 64 and
     * 128: the tensor-core kernel; f32 out: the SIMT kernel), scales 1 and not */
    for (int hi = 0; hi < 5; hi++)
        for (int di = 0; di < 7; di++) {
            if (small_run() > 1 && di != 3) continue;
            AttnCase c = {.n_heads = heads[hi][0],
                          .n_kv_heads = heads[hi][1],
                          .hd = hds[di],
                          .block_size = bss[(hi + di + 3) % 7],
                          .kvdt = DTYPE_FP8_E4M3,
                          .adt = DTYPES[(hi + di) % 3],
                          .num_seqs = 4,
                          .ctx = {33, 1, 100, 257},
                          .qlen = {33, 1, 37, 64},
                          .k_scale = di % 2 ? 0.75f : 1.0f,
                          .v_scale = di % 2 ? 1.25f : 1.0f};
            run_attention_case(&c);
        }
    /* every block size the engine allows (16..256), with f32 out so the tolerance is tight */
    for (int bs = 16; bs <= 256; bs *= 2) {
        AttnCase c = {.n_heads = 8,
                      .n_kv_heads = 2,
                      .hd = 128,
                      .block_size = bs,
                      .kvdt = DTYPE_BF16,
                      .adt = DTYPE_F32,
                      .num_seqs = 3,
                      .ctx = {bs, bs + 1, 3 * bs - 1},
                      .qlen = {bs, 2, bs + 3}};
        run_attention_case(&c);
    }
    /* over a bf16 and an fp8 cache: (ramp 0) query tiles past the first 128 rows, a last tile of a
     * few rows, over a cached prefix and not (the two m-tiles of a warp each meet a tile's causal
     * edge); (ramp 1) keys scaled up along the context (AttnCase.ramp): a row's max passes its
     * running max by more than the lazy threshold again and again, so the accumulators'
     * rescaling is exercised (random keys alone move the max by a few log2 units, past the first
     * tile never that far) */
    for (int v = 0; v < 4; v++) {
        const int f8 = v & 1, ramp = v >> 1;
        AttnCase c = {.n_heads = 16,
                      .n_kv_heads = 8,
                      .hd = 128,
                      .block_size = 16,
                      .kvdt = f8 ? DTYPE_FP8_E4M3 : DTYPE_BF16,
                      .adt = f8 || ramp ? DTYPE_BF16 : DTYPE_F16,
                      .num_seqs = ramp ? 2 : 3,
                      .ctx = {131, 400, 259},
                      .qlen = {131, 333, 200}};
        if (ramp) {
            c.ctx[0] = c.qlen[0] = 700, c.ctx[1] = 300, c.qlen[1] = 150;
            c.ramp = 6.0f;
        }
        run_attention_case(&c);
    }
    /* a context past 8k: a chunk of 300 new tokens over a cached prefix of 8000 */
    if (small_run()) return;
    AttnCase big = {.n_heads = 16,
                    .n_kv_heads = 8,
                    .hd = 128,
                    .block_size = 16,
                    .kvdt = DTYPE_BF16,
                    .adt = DTYPE_F32,
                    .num_seqs = 2,
                    .ctx = {8300, 513},
                    .qlen = {300, 513}};
    run_attention_case(&big);
    big.kvdt = DTYPE_FP8_E4M3, big.adt = DTYPE_BF16; /* the tensor-core kernel over fp8 */
    run_attention_case(&big);
}

/* Every case as the launcher chooses (head_dim 128 on a 9.0 device: the warpgroup kernel,
 * attention_prefill_wg.cu; else blocks of one query head, or over an fp8 cache of two of a GQA
 * group where the grid of pairs is large enough), then without the warpgroup kernel
 * (CVLLM_CUDA_PREFILL_WG=0): with pairs wherever the group's size is even
 * (CVLLM_CUDA_PREFILL_HB2=2: the small grids and 16-bit caches here would otherwise not take
 * them), with two m-tiles a warp over any cache (CVLLM_CUDA_PREFILL_MT=2: blocks of 128 queries;
 * the launcher's choice over 16-bit caches), and with one m-tile a warp (=1). */
static void test_attention_prefill(void **state) {
    (void)state;
    static const char *names[] = {"", "the launcher's choice", "query-head pairs",
                                  "two m-tiles a warp, any cache", "one m-tile a warp"};
    static const char *mt[] = {"", "", "1", "2", "1"};
    for (int mode = 1; mode <= 4; mode++) {
        printf("  prefill blocks: %s\n", names[mode]);
        setenv("CVLLM_CUDA_PREFILL_WG", mode == 1 ? "1" : "0", 1);
        setenv("CVLLM_CUDA_PREFILL_HB2", mode == 2 ? "2" : "1", 1);
        setenv("CVLLM_CUDA_PREFILL_MT", mt[mode], 1);
        prefill_cases();
    }
    unsetenv("CVLLM_CUDA_PREFILL_WG");
    unsetenv("CVLLM_CUDA_PREFILL_HB2");
    unsetenv("CVLLM_CUDA_PREFILL_MT");
}

static void test_attention_decode(void **state) {
    (void)state;
    const int heads[][2] = {{4, 4}, {8, 4}, {6, 2}, {16, 2}, {8, 1}, {32, 8}};
    const int hds[] = {16, 32, 64, 128, 256, 24, 80};
    const int bss[] = {16, 32, 64, 128, 256, 1, 7};
    const int parts[] = {0, 1, 3, 64};
    for (int hi = 0; hi < 6; hi++)
        for (int di = 0; di < 7; di++) {
            /* CVLLM_TEST_SMALL=2 (racecheck, which is slow): every GQA shape at head_dim 128 */
            if (small_run() > 1 && di != 3) continue;
            AttnCase c = {.n_heads = heads[hi][0],
                          .n_kv_heads = heads[hi][1],
                          .hd = hds[di],
                          .block_size = bss[(hi + di) % 7],
                          .kvdt = DTYPES[(hi + 2 * di) % 3],
                          .adt = DTYPE_F32,
                          .num_seqs = 5,
                          .ctx = {1, 17, 300, 1000, 33},
                          .qlen = {1, 1, 1, 1, 1},
                          .decode = 1,
                          .parts = parts[(hi + di) % 4]};
            run_attention_case(&c);
        }
    /* an fp8 cache: every GQA shape and head_dim, split and not, scales 1 and not */
    for (int hi = 0; hi < 6; hi++)
        for (int di = 0; di < 7; di++) {
            if (small_run() > 1 && di != 3) continue;
            AttnCase c = {.n_heads = heads[hi][0],
                          .n_kv_heads = heads[hi][1],
                          .hd = hds[di],
                          .block_size = bss[(hi + di + 2) % 7],
                          .kvdt = DTYPE_FP8_E4M3,
                          .adt = hi % 3 == 2 ? DTYPE_BF16 : DTYPE_F32,
                          .num_seqs = 5,
                          .ctx = {1, 17, 300, 1000, 33},
                          .qlen = {1, 1, 1, 1, 1},
                          .decode = 1,
                          .parts = parts[(hi + di + 1) % 4],
                          .k_scale = hi % 2 ? 0.75f : 1.0f,
                          .v_scale = hi % 2 ? 1.25f : 1.0f};
            run_attention_case(&c);
        }
    /* contexts past 8k, split and not, every block size */
    if (small_run()) return;
    for (int bs = 16; bs <= 256; bs *= 2)
        for (int pi = 0; pi < 3; pi++) {
            AttnCase c = {.n_heads = 16,
                          .n_kv_heads = 8,
                          .hd = 128,
                          .block_size = bs,
                          .kvdt = DTYPE_BF16,
                          .adt = pi == 2 ? DTYPE_BF16 : DTYPE_F32,
                          .num_seqs = 3,
                          .ctx = {8193 + bs, 9000, 5},
                          .qlen = {1, 1, 1},
                          .decode = 1,
                          .parts = pi == 0 ? 1 : 0};
            run_attention_case(&c);
            c.kvdt = DTYPE_FP8_E4M3;
            run_attention_case(&c);
        }
}

/* The tensor-core decode kernels' lazy rescaling (the running max kept until a tile passes it by
 * 2^8): keys whose scores keep rising along the context (ramp: the max moves several times; with
 * random keys the first tile sets it and it rarely moves again), against the CPU twin and, each
 * decode launch, against the same launch with the max moved at every step (run_attention_case);
 * every cache type, head_dim 64 and 128, groups of 2 and 8, one partition and several. The ramp
 * stays moderate (scores to about 30 log2 units) because q rounded to 16 bits moves large scores
 * by more than the tolerances allow (the tensor-core prefill too). */
static void test_attention_decode_lazy(void **state) {
    (void)state;
    const int heads[][2] = {{16, 8}, {8, 1}};
    const DType kvdts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_FP8_E4M3};
    attention_decode_set_lazy(1);
    for (int ci = 0; ci < 12; ci++) {
        AttnCase c = {.n_heads = heads[ci % 2][0],
                      .n_kv_heads = heads[ci % 2][1],
                      .hd = ci % 4 < 2 ? 128 : 64,
                      .block_size = 16,
                      .kvdt = kvdts[ci % 3],
                      .adt = DTYPE_F32,
                      .num_seqs = 4,
                      .ctx = {1000, 77, 2100, 300},
                      .qlen = {1, 1, 1, 1},
                      .decode = 1,
                      .parts = ci < 6 ? 1 : 0,
                      .ramp = 9.0f};
        run_attention_case(&c);
    }
    attention_decode_set_lazy(-1);
}

/* The decode kernel fed the raw qkv rows (AttentionParams.positions set) against the two
 * launches it replaces (qk_norm_rope_store_cuda, then the decode kernel on the rotated rows), on
 * copies of the same cache: the outputs and the whole caches must be equal byte for byte. Every
 * GQA shape (query heads per block 1, 2, 4; a group of 8 = two blocks per kv head storing the
 * same row), padded head_dims, every cache type (fp8 with scales), norms on and off, partitions
 * 1, several and the launcher's choice, a padding lane (no keys, slot -1) and a context of one. */
static void test_attention_decode_fused(void **state) {
    (void)state;
    const int heads[][2] = {{16, 8}, {8, 4}, {6, 2}, {32, 8}, {8, 1}, {4, 4}};
    const int hds[] = {128, 64, 24, 128, 80, 32};
    const int parts_[] = {0, 1, 3, 64};
    ModelConfig cfg = {.rope_theta = 1000000.0, .rope_type = ROPE_DEFAULT};
    for (int ci = 0; ci < 24; ci++) {
        const int hi = ci % 6, nh = heads[hi][0], nkv = heads[hi][1], hd = hds[hi];
        const DType kdt = KV_DTYPES[(ci / 6 + hi) % 4];
        const int norm = ci % 2 == 0, fp8 = kdt == DTYPE_FP8_E4M3, bs = ci % 3 == 2 ? 7 : 16;
        const int parts = parts_[(ci / 2) % 4];
        const DType adt = ci % 3 == 0 ? DTYPE_F32 : DTYPE_BF16;
        const float ks = fp8 && ci % 2 ? 0.75f : 1.0f, vs = fp8 && ci % 2 ? 1.25f : 1.0f;
        enum { S = 6 };
        const int ctx[S] = {1, 17, 300, 1000, 0, 33}; /* lane 4: padding */
        int maxblk = 0, num_blocks;
        for (int s = 0; s < S; s++)
            if ((ctx[s] + bs - 1) / bs > maxblk) maxblk = (ctx[s] + bs - 1) / bs;
        int32_t *tables = random_tables(ctx, S, bs, maxblk, &num_blocks);
        int32_t pos[S], cu[S + 1] = {0};
        int64_t slot[S];
        for (int s = 0; s < S; s++) {
            cu[s + 1] = s + 1;
            pos[s] = ctx[s] > 0 ? ctx[s] - 1 : 0;
            slot[s] = ctx[s] > 0 ? (int64_t)tables[s * maxblk + (ctx[s] - 1) / bs] * bs +
                                       (ctx[s] - 1) % bs
                                 : -1;
        }
        const int64_t kvd = (int64_t)nkv * hd, cache_n = (int64_t)num_blocks * bs * kvd;
        const size_t cb = (size_t)cache_n * dtype_size(kdt);
        float *kf = xmalloc(cache_n * 4), *vf = xmalloc(cache_n * 4);
        for (int64_t i = 0; i < cache_n; i++)
            kf[i] = frand(), vf[i] = frand();
        void *kh = pack(kdt, kf, cache_n), *vh = pack(kdt, vf, cache_n);
        const int64_t ld = (int64_t)(nh + 2 * nkv) * hd + 8; /* a padded row */
        /* a third of the cases also fused from the rows in a 16-bit type (fusion "qkv16"; q
         * unread), their values representable in it */
        const DType sdt = ci % 3 == 1 ? (ci % 2 ? DTYPE_F16 : DTYPE_BF16) : DTYPE_F32;
        /* and every case fused once more by records in a shuffled launch order (p.dec_rec) */
        const int wr = sdt == DTYPE_F32 ? 2 : 3, ways = wr + 1;
        float *qkv = xmalloc((size_t)S * ld * 4);
        for (int64_t i = 0; i < S * ld; i++)
            qkv[i] = round_to(sdt, 2 * frand());
        void *qkv16 = sdt == DTYPE_F32 ? NULL : pack(sdt, qkv, S * ld);
        float qn[256], kn[256], inv[128];
        for (int i = 0; i < hd; i++)
            qn[i] = 1 + 0.3f * frand(), kn[i] = 1 + 0.3f * frand();
        rope_inv_freq_cpu(&cfg, hd, inv);
        float *dinv = dev_upload(inv, sizeof(float) * hd / 2),
              *dqn = dev_upload(qn, sizeof(float) * hd), *dkn = dev_upload(kn, sizeof(float) * hd);
        int32_t *dpos = dev_upload(pos, sizeof pos), *dcu = dev_upload(cu, sizeof cu),
                *dctx = dev_upload(ctx, sizeof ctx),
                *dtab = dev_upload(tables, (size_t)S * maxblk * 4);
        int64_t *dslot = dev_upload(slot, sizeof slot);
        const int32_t order[S] = {3, 4, 0, 5, 2, 1};
        int32_t rec[S * DEC_REC_INTS];
        attention_decode_records(order, S, ctx, cu, pos, slot, tables, maxblk, bs, rec);
        int32_t *drec = dev_upload(rec, sizeof rec);
        AttentionParams p = {.ldq = ld,
                             .adt = adt,
                             .kvdt = kdt,
                             .cache_rows = (int64_t)num_blocks * bs,
                             .k_scale = ks,
                             .v_scale = vs,
                             .n_heads = nh,
                             .n_kv_heads = nkv,
                             .hd = hd,
                             .block_size = bs,
                             .scale = 1.0f / sqrtf((float)hd),
                             .num_seqs = S,
                             .cu_seqlens_q = dcu,
                             .context_lens = dctx,
                             .block_tables = dtab,
                             .max_blocks_per_seq = maxblk,
                             .max_seqlen_q = 1,
                             .max_seqlen_k = 1000};
        const int np = parts ? parts : attention_decode_num_parts(&p, 132);
        const size_t ob = (size_t)S * nh * hd * dtype_size(adt);
        void *out[4], *kc[4], *vc[4], *ho[4], *hk[4], *hv[4];
        /* 0: the two launches, 1: the fused kernel, 2: fused from the 16-bit rows, wr: fused by
         * records */
        for (int way = 0; way < ways; way++) {
            const int w16 = way == 2 && way != wr; /* fused from the 16-bit rows */
            float *dq =
                w16 ? dev_poisoned((size_t)S * ld * 4) : dev_upload(qkv, (size_t)S * ld * 4);
            void *dq16 = w16 ? dev_upload(qkv16, (size_t)S * ld * 2) : NULL;
            kc[way] = dev_upload(kh, cb), vc[way] = dev_upload(vh, cb);
            out[way] = dev_poisoned(ob);
            void *ws = dev_poisoned(attention_decode_ws_bytes(S, nh, hd, np) + 4);
            AttentionParams pw = p;
            pw.q = dq, pw.out = out[way], pw.k_cache = kc[way], pw.v_cache = vc[way];
            if (way == 0) {
                OK(qk_norm_rope_store_cuda(dq, ld, NULL, DTYPE_F32, dpos, dinv, norm ? dqn : NULL,
                                           norm ? dkn : NULL, S, nh, nkv, hd, 1e-6f, kc[way],
                                           vc[way], kdt, ks, vs, dslot, NULL, DTYPE_BF16, 0,
                                           g_stream));
            } else {
                pw.positions = dpos, pw.slots = dslot, pw.inv_freq = dinv;
                pw.q_norm = norm ? dqn : NULL, pw.k_norm = norm ? dkn : NULL, pw.eps = 1e-6f;
                if (w16) pw.qkv16 = dq16, pw.qkv16dt = sdt;
                if (way == wr) pw.dec_rec = drec;
            }
            OK(attention_decode_cuda(&pw, np, ws, g_stream));
            CK(cudaStreamSynchronize(g_stream));
            CK(cudaGetLastError());
            ho[way] = xmalloc(ob), hk[way] = xmalloc(cb), hv[way] = xmalloc(cb);
            dev_download(ho[way], out[way], ob);
            dev_download(hk[way], kc[way], cb);
            dev_download(hv[way], vc[way], cb);
            cudaFree(dq), cudaFree(dq16), cudaFree(ws), cudaFree(out[way]), cudaFree(kc[way]);
            cudaFree(vc[way]);
        }
        for (int way = 1; way < ways; way++) {
            char what[200];
            snprintf(what, sizeof what,
                     "fused decode%s: heads %d/%d hd %d bs %d kv %s out %s norm %d parts %d",
                     way == wr  ? " by records"
                     : way == 2 ? " from 16-bit rows"
                                : "",
                     nh, nkv, hd, bs, dtype_name(kdt), dtype_name(adt), norm, np);
            if (memcmp(hk[0], hk[way], cb) || memcmp(hv[0], hv[way], cb))
                fail_msg("%s: the caches differ", what);
            if (memcmp(hk[0], kh, cb) == 0) fail_msg("%s: no key was stored", what);
            if (memcmp(ho[0], ho[way], ob)) {
                float *a = xmalloc((size_t)S * nh * hd * 4), *b = xmalloc((size_t)S * nh * hd * 4);
                unpack(adt, ho[way], a, (int64_t)S * nh * hd);
                unpack(adt, ho[0], b, (int64_t)S * nh * hd);
                compare(what, a, b, (int64_t)S * nh * hd, 0.0);
                fail_msg("%s: the outputs differ (NaN bytes?)", what);
            }
        }
        for (int way = 0; way < ways; way++)
            free(ho[way]), free(hk[way]), free(hv[way]);
        free(qkv16);
        cudaFree(dinv), cudaFree(dqn), cudaFree(dkn), cudaFree(dpos), cudaFree(dcu), cudaFree(dctx),
            cudaFree(dtab), cudaFree(dslot), cudaFree(drec);
        free(tables), free(kf), free(vf), free(kh), free(vh), free(qkv);
    }
}

/* ---------------------------------------------------------------- sampler */

typedef struct {
    float temperature, top_p, min_p;
    int top_k;
    float pres, freq, rep;
    int num_logprobs;
    uint64_t seed, index;
    const int32_t *ids;
    int num_prompt, num_output;
} RefRow;

static const float *g_w; /* qsort context */
static int by_weight(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (g_w[i] != g_w[j]) return g_w[i] > g_w[j] ? -1 : 1;
    return i - j;
}

/* backend.h's semantics, slowly: penalties, temperature, sort, top-k, top-p, min-p, draw in id
 * order; with no filter, the exponential race instead of the draw. *p_out: the exact probability
 * of each token (for the distribution test), or NULL. */
static int ref_sample(const float *raw, int V, const RefRow *r, double *p_out) {
    float *x = xmalloc(V * 4), *w = xmalloc(V * 4);
    int *idx = xmalloc(V * sizeof(int));
    memcpy(x, raw, V * 4);
    if (r->num_prompt + r->num_output > 0) {
        int *cnt = xcalloc(V, sizeof(int));
        char *seen = xcalloc(V, 1);
        for (int i = 0; i < r->num_prompt + r->num_output; i++) {
            seen[r->ids[i]] = 1;
            if (i >= r->num_prompt) cnt[r->ids[i]]++;
        }
        for (int i = 0; i < V; i++) {
            if (!seen[i]) continue;
            if (r->rep != 1.0f) x[i] = x[i] > 0 ? x[i] / r->rep : x[i] * r->rep;
            if (cnt[i]) x[i] -= r->freq * (float)cnt[i] + r->pres;
        }
        free(cnt), free(seen);
    }
    int imax = -1;
    for (int i = 0; i < V; i++)
        if (!isnan(x[i]) && (imax < 0 || x[i] > x[imax])) imax = i;
    if (imax < 0) imax = 0;
    int tok = imax;
    if (p_out) memset(p_out, 0, V * sizeof(double));
    if (r->temperature > 0 && isfinite(x[imax])) {
        const float m = x[imax], inv_t = 1.0f / r->temperature;
        for (int i = 0; i < V; i++) {
            float e = expf((x[i] - m) * inv_t);
            w[i] = e >= 0 ? e : 0;
            idx[i] = i;
        }
        g_w = w;
        qsort(idx, V, sizeof(int), by_weight);
        int n = V;
        if (r->top_k > 0 && r->top_k < V) n = r->top_k;
        if (r->top_p > 0 && r->top_p < 1) {
            double mass = 0, cum = 0;
            for (int i = 0; i < n; i++)
                mass += w[idx[i]];
            const double need = r->top_p * mass;
            int j = 0;
            for (; j < n; j++) {
                cum += w[idx[j]];
                if (cum >= need) break;
            }
            n = j < n ? j + 1 : n;
        }
        char *keep = xcalloc(V, 1);
        const float min_w = r->min_p > 0 ? r->min_p : 0;
        for (int i = 0; i < n; i++)
            if (w[idx[i]] > 0 && w[idx[i]] >= min_w) keep[idx[i]] = 1;
        double kept = 0;
        for (int i = 0; i < V; i++)
            if (keep[i]) kept += w[i];
        if (p_out)
            for (int i = 0; i < V; i++)
                p_out[i] = keep[i] ? w[i] / kept : 0;
        const double target = cvllm_uniform(r->seed, r->index) * kept;
        double cum = 0;
        for (int i = 0; i < V; i++) {
            if (!keep[i]) continue;
            tok = i;
            cum += w[i];
            if (cum > target) break;
        }
        if (!(r->top_k > 0 && r->top_k < V) && !(r->top_p > 0 && r->top_p < 1) &&
            !(r->min_p > 0)) { /* no filter: the exponential race (philox.h), keys in double */
            const CvllmRaceKey k = cvllm_race_key(r->seed, r->index);
            double best = -INFINITY;
            tok = -1;
            for (int i = 0; i < V; i++) {
                if (isnan(x[i])) continue;
                const double key =
                    x[i] - (double)r->temperature * log(-log((double)cvllm_race_uniform(k, i)));
                if (tok < 0 || key > best) best = key, tok = i;
            }
            if (tok < 0) tok = imax;
        }
        free(keep);
    } else if (p_out) {
        p_out[tok] = 1;
    }
    free(x), free(w), free(idx);
    return tok;
}

/* The CPU backend's sampler (src/backend/cpu/sampler.c) on the same row: its uniform's counter
 * is num_output, so a row's index is its output count. */
static int cpu_sample(const float *raw, int V, const RefRow *r, float *lp, int32_t *top,
                      float *tlp) {
    static const int32_t none[1] = {0};
    float *x = xmalloc((size_t)V * 4);
    memcpy(x, raw, (size_t)V * 4);
    CHECK(!r->ids || (uint64_t)r->num_output == r->index, "index %llu, num_output %d",
          (unsigned long long)r->index, r->num_output);
    SamplingRow s = {.temperature = r->temperature,
                     .top_p = r->top_p,
                     .top_k = r->top_k,
                     .min_p = r->min_p,
                     .presence_penalty = r->pres,
                     .frequency_penalty = r->freq,
                     .repetition_penalty = r->rep,
                     .seed = r->seed,
                     .num_logprobs = r->num_logprobs,
                     .prompt_ids = r->ids ? r->ids : none,
                     .num_prompt = r->num_prompt,
                     .output_ids = r->ids ? r->ids + r->num_prompt : none,
                     .num_output = (int)r->index};
    float l = 0;
    int t = sampler_sample(x, V, &s, NULL, &l, top, tlp);
    if (lp) *lp = l;
    free(x);
    return t;
}

/* run_sampler hands sampler_cuda the host rows (so that few plain rows take the cluster kernel)
 * when set; else NULL (the one-block kernel for every row) */
static int g_sampler_host_rows;
/* run_sampler hands sampler_cuda bf16 logits (the top halves of the f32 values, which the caller
 * rounded to bf16 first: round_bf16) when set */
static int g_sampler_bf16;

/* x rounded to bf16 precision in place (to nearest even; NaN and infinities kept) */
static void round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x7fffu + ((u >> 16) & 1)) & 0xffff0000u;
        memcpy(&x[i], &u, 4);
    }
}

static void run_sampler(const float *logits, int n, int V, const RefRow *rr, int32_t *tok,
                        float *lp, int32_t *top_ids, float *top_lp) {
    CudaSamplingRow *rows = xcalloc(n, sizeof *rows);
    int64_t nid = 0;
    for (int r = 0; r < n; r++)
        nid += rr[r].num_prompt + rr[r].num_output;
    int32_t *ids = xmalloc((nid + 1) * 4);
    nid = 0;
    for (int r = 0; r < n; r++) {
        const RefRow *a = &rr[r];
        rows[r] = (CudaSamplingRow){.temperature = a->temperature,
                                    .top_p = a->top_p,
                                    .min_p = a->min_p,
                                    .top_k = a->top_k,
                                    .presence_penalty = a->pres,
                                    .frequency_penalty = a->freq,
                                    .repetition_penalty = a->rep,
                                    .num_logprobs = a->num_logprobs,
                                    .seed = a->seed,
                                    .draw_index = a->index,
                                    .ids_offset = nid,
                                    .num_prompt = a->num_prompt,
                                    .num_output = a->num_output,
                                    .has_penalty = a->num_prompt + a->num_output > 0};
        memcpy(ids + nid, a->ids, (size_t)(a->num_prompt + a->num_output) * 4);
        nid += a->num_prompt + a->num_output;
    }
    void *dl;
    if (g_sampler_bf16) {
        uint16_t *h = xmalloc((size_t)n * V * 2);
        for (int64_t i = 0; i < (int64_t)n * V; i++) {
            uint32_t u;
            memcpy(&u, &logits[i], 4);
            h[i] = (uint16_t)(u >> 16);
        }
        dl = dev_upload(h, (size_t)n * V * 2);
        free(h);
    } else {
        dl = dev_upload(logits, (size_t)n * V * 4);
    }
    CudaSamplingRow *drows = dev_upload(rows, n * sizeof *rows);
    int32_t *dids = dev_upload(ids, (nid + 1) * 4);
    int32_t *dtok = dev_poisoned(n * 4),
            *dtop = dev_poisoned((size_t)n * CUDA_SAMPLER_MAX_LOGPROBS * 4);
    float *dlp = dev_poisoned(n * 4),
          *dtlp = dev_poisoned((size_t)n * CUDA_SAMPLER_MAX_LOGPROBS * 4);
    void *scratch = NULL;
    CK(cudaMalloc(&scratch, sampler_cuda_scratch_bytes(n, V)));
    CK(cudaMemset(scratch, 0, sampler_cuda_scratch_bytes(n, V)));
    OK(sampler_cuda(dl, g_sampler_bf16 ? DTYPE_BF16 : DTYPE_F32, n, V, drows,
                    g_sampler_host_rows ? rows : NULL, dids, dtok, dlp, dtop, dtlp, scratch,
                    g_stream));
    dev_download(tok, dtok, n * 4);
    dev_download(lp, dlp, n * 4);
    if (top_ids) dev_download(top_ids, dtop, (size_t)n * CUDA_SAMPLER_MAX_LOGPROBS * 4);
    if (top_lp) dev_download(top_lp, dtlp, (size_t)n * CUDA_SAMPLER_MAX_LOGPROBS * 4);
    /* the scratch is left zeroed */
    int32_t *sc = xmalloc(sampler_cuda_scratch_bytes(n, V));
    dev_download(sc, scratch, sampler_cuda_scratch_bytes(n, V));
    for (int64_t i = 0; i < (int64_t)n * V; i++)
        if (sc[i]) fail_msg("sampler scratch left %d at %lld", sc[i], (long long)i);
    free(sc);
    cudaFree(dl), cudaFree(drows), cudaFree(dids), cudaFree(dtok), cudaFree(dtop), cudaFree(dlp),
        cudaFree(dtlp), cudaFree(scratch);
    free(rows), free(ids);
}

static void test_sampler_rows(void **state) {
    (void)state;
    const int Vs[] = {1000, 151936};
    for (int vi = 0; vi < 4; vi++) { /* 2, 3: bf16 logits */
        const int V = Vs[vi % 2], n = 48;
        g_sampler_bf16 = vi >= 2;
        float *logits = xmalloc((size_t)n * V * 4);
        for (int64_t i = 0; i < (int64_t)n * V; i++)
            logits[i] = 4 * frand();
        if (g_sampler_bf16) round_bf16(logits, (int64_t)n * V); /* the references see these */
        /* ties, -inf, NaN in some rows */
        for (int i = 0; i < V; i += 3)
            logits[1 * V + i] = 1.0f;
        logits[1 * V + 10] = logits[1 * V + 20] = 7.0f;
        logits[2 * V + 5] = NAN;
        logits[2 * V + 7] = -INFINITY;
        for (int i = 0; i < V; i++)
            logits[3 * V + i] = NAN;
        int32_t hist[64];
        for (int i = 0; i < 64; i++)
            hist[i] = irand(V);
        hist[5] = hist[6] = hist[7]; /* repeated ids */
        RefRow rr[48];
        const float temps[] = {0, 0.7f, 1.0f, 1.3f}, tps[] = {1, 0.9f, 0.5f, 1e-6f};
        const int tks[] = {0, 1, 5, 50};
        for (int r = 0; r < n; r++) {
            rr[r] = (RefRow){.temperature = temps[r % 4],
                             .top_p = tps[(r / 4) % 4],
                             .top_k = tks[(r / 16) % 3 + (r % 5 == 0)],
                             .min_p = r % 7 == 3 ? 0.05f : 0,
                             .rep = 1,
                             .num_logprobs = r % 6 == 0 ? -1 : (r % 21),
                             .seed = 1234 + r,
                             .index = r * 3};
            if (r % 4 == 1 || r % 8 == 0) {
                rr[r].rep = 1.2f, rr[r].freq = 0.5f, rr[r].pres = 0.3f;
                rr[r].ids = hist, rr[r].num_prompt = 20, rr[r].num_output = 44;
                rr[r].index = 44; /* the draw's counter is the output count */
            }
        }
        int32_t tok[48], top[48 * CUDA_SAMPLER_MAX_LOGPROBS];
        float lp[48], tlp[48 * CUDA_SAMPLER_MAX_LOGPROBS];
        run_sampler(logits, n, V, rr, tok, lp, top, tlp);
        int mism = 0, mism_cpu = 0;
        for (int r = 0; r < n; r++) {
            const float *x = logits + (int64_t)r * V;
            const int want = ref_sample(x, V, &rr[r], NULL);
            /* the CPU backend's own sampler: same id, log-prob and top ids */
            float clp = 0, ctlp[CVLLM_MAX_LOGPROBS];
            int32_t ctop[CVLLM_MAX_LOGPROBS];
            const int cwant = cpu_sample(x, V, &rr[r], &clp, ctop, ctlp);
            if (tok[r] != cwant) {
                if (rr[r].temperature == 0)
                    fail_msg("V %d row %d (greedy): got %d, the CPU sampler %d", V, r, tok[r],
                             cwant);
                mism_cpu++;
                printf("  note: V %d row %d sampled %d, CPU sampler %d\n", V, r, tok[r], cwant);
            } else if (rr[r].num_logprobs >= 0 && r != 2 && r != 3) {
                if (fabsf(lp[r] - clp) > 1e-4f * fmaxf(1, fabsf(clp)))
                    fail_msg("V %d row %d: logprob %g, CPU sampler %g", V, r, lp[r], clp);
                for (int k = 0; k < rr[r].num_logprobs; k++)
                    if (top[r * CUDA_SAMPLER_MAX_LOGPROBS + k] != ctop[k])
                        fail_msg("V %d row %d: top %d is %d, CPU sampler %d", V, r, k,
                                 top[r * CUDA_SAMPLER_MAX_LOGPROBS + k], ctop[k]);
            }
            if (tok[r] != want) {
                if (rr[r].temperature == 0)
                    fail_msg("V %d row %d (greedy): got %d, want %d", V, r, tok[r], want);
                mism++;
                printf("  note: V %d row %d sampled %d, reference %d\n", V, r, tok[r], want);
            }
            if (rr[r].num_logprobs < 0) continue;
            /* log-probs of the raw logits (rows without NaN) */
            if (r == 2 || r == 3) continue;
            double mx = -INFINITY, se = 0;
            for (int i = 0; i < V; i++)
                mx = fmax(mx, x[i]);
            for (int i = 0; i < V; i++)
                se += exp((double)x[i] - mx);
            const double lse = mx + log(se);
            if (fabs(lp[r] - (x[tok[r]] - lse)) > 1e-4 * fmax(1, fabs(x[tok[r]] - lse)))
                fail_msg("V %d row %d: logprob %g, want %g", V, r, lp[r], x[tok[r]] - lse);
            int *idx = xmalloc(V * sizeof(int));
            for (int i = 0; i < V; i++)
                idx[i] = i;
            g_w = x;
            qsort(idx, V, sizeof(int), by_weight);
            for (int k = 0; k < rr[r].num_logprobs && k < CUDA_SAMPLER_MAX_LOGPROBS; k++) {
                if (top[r * CUDA_SAMPLER_MAX_LOGPROBS + k] != idx[k])
                    fail_msg("V %d row %d: top %d is %d, want %d", V, r, k,
                             top[r * CUDA_SAMPLER_MAX_LOGPROBS + k], idx[k]);
                assert_true(fabs(tlp[r * CUDA_SAMPLER_MAX_LOGPROBS + k] - (x[idx[k]] - lse)) <
                            1e-4);
            }
            free(idx);
        }
        printf("  sampler V %d%s: %d of %d rows differ from the reference, %d from the CPU "
               "sampler\n", V, g_sampler_bf16 ? " (bf16 logits)" : "", mism, n, mism_cpu);
        assert_true(mism <= 1 && mism_cpu <= 1);
        free(logits);
    }
    g_sampler_bf16 = 0;
}

static void test_sampler_distribution(void **state) {
    (void)state;
    /* one distribution, 4000 draws (rows with draw indices 0..3999): each draw against the
     * reference, and the histogram against the exact probabilities */
    const int V = 64, n = small_run() > 1 ? 128 : 4000; /* racecheck runs: a few rows */
    float base[64];
    for (int i = 0; i < V; i++)
        base[i] = 2 * frand();
    base[3] = base[4]; /* a tie */
    const struct {
        float t, p, mp;
        int k;
    } cfgs[] = {{1.0f, 1, 0, 0}, {0.8f, 0.9f, 0, 20}, {1.5f, 0.7f, 0.1f, 0}, {1.0f, 1, 0, 7}};
    float *logits = xmalloc((size_t)n * V * 4);
    for (int r = 0; r < n; r++)
        memcpy(logits + (int64_t)r * V, base, sizeof base);
    for (int ci = 0; ci < 4; ci++) {
        RefRow *rr = xcalloc(n, sizeof *rr);
        for (int r = 0; r < n; r++)
            rr[r] = (RefRow){.temperature = cfgs[ci].t,
                             .top_p = cfgs[ci].p,
                             .min_p = cfgs[ci].mp,
                             .top_k = cfgs[ci].k,
                             .rep = 1,
                             .num_logprobs = -1,
                             .seed = 99,
                             .index = r};
        int32_t *tok = xmalloc(n * 4);
        float *lp = xmalloc(n * 4);
        run_sampler(logits, n, V, rr, tok, lp, NULL, NULL);
        double p[64], emp[64] = {0}, emp_cpu[64] = {0}, tv = 0, tv_cpu = 0;
        int mism = 0, mism_cpu = 0;
        for (int r = 0; r < n; r++) {
            int want = ref_sample(base, V, &rr[r], r == 0 ? p : NULL);
            int cwant = cpu_sample(base, V, &rr[r], NULL, NULL, NULL);
            mism += tok[r] != want;
            mism_cpu += tok[r] != cwant;
            emp[tok[r]] += 1.0 / n;
            emp_cpu[cwant] += 1.0 / n;
        }
        for (int i = 0; i < V; i++)
            tv += 0.5 * fabs(emp[i] - p[i]), tv_cpu += 0.5 * fabs(emp[i] - emp_cpu[i]);
        printf(
            "  sampler distribution %d: TV distance %.4f to the exact one, %.4f to the CPU "
            "sampler's draws; %d of %d draws differ from the reference, %d from the CPU sampler\n",
            ci, tv, tv_cpu, mism, n, mism_cpu);
        if (n >= 4000) assert_true(tv < 0.05);
        assert_true(mism <= n / 100 && mism_cpu <= n / 100);
        free(rr), free(tok), free(lp);
    }
    free(logits);
}

/* The draw and the n-th tied id of top-k / top-p search the vocabulary by warp ranges (sampler.cu:
 * 32 ranges of len ids, a multiple of 4; inside the range that holds the target, one contiguous
 * piece of per ids a thread). Rows whose only kept tokens sit at the edges of ranges and pieces,
 * and ties cut by top-k / top-p, have weights of exactly 1: the draw is exact, so it must be the
 * reference's. Odd vocabularies make rows that are not 16-byte aligned and a last partial quad;
 * the rest are benchmark-like rows (temperature 0.6 alone), min-p, penalties and greedy. */
static void test_sampler_ranges(void **state) {
    (void)state;
    const int Vs[] = {33, 1001, 5000, 151936};
    int32_t hist[30];
    for (int vi = 0; vi < 4; vi++) {
        const int V = Vs[vi], n = small_run() > 1 ? 16 : 64; /* racecheck runs: fewer rows */
        const int len = ((V + 31) / 32 + 3) & ~3, per = (len + 1023) / 1024;
        for (int i = 0; i < 30; i++)
            hist[i] = irand(V);
        float *logits = xmalloc((size_t)n * V * 4);
        for (int64_t i = 0; i < (int64_t)n * V; i++)
            logits[i] = 4 * frand();
        RefRow rr[64];
        int exact[64] = {0};
        for (int r = 0; r < n; r++) {
            float *x = logits + (int64_t)r * V;
            rr[r] = (RefRow){.temperature = 0.6f,
                             .top_p = 1,
                             .rep = 1,
                             .num_logprobs = -1,
                             .seed = 4321 + r,
                             .index = (uint64_t)r * 7};
            int ties = 0;
            switch (r % 8) {
            case 0:
            case 1: /* kept: tokens at range and piece edges (all of them, or some), weight 1 */
                for (int i = 0; i < V; i++)
                    x[i] = -INFINITY;
                for (int w = 0; w < 32; w++) {
                    const int lo = w * len,
                              e[5] = {lo - 1, lo, lo + per - 1, lo + per, lo + len - 1};
                    for (int k = 0; k < 5; k++)
                        if (e[k] >= 0 && e[k] < V && (r % 8 == 0 || (w * 5 + k) % 3 == 0))
                            x[e[k]] = 2.0f;
                }
                x[V - 1] = 2.0f;
                exact[r] = 1;
                break;
            case 2: /* one kept token, the last id */
                for (int i = 0; i < V; i++)
                    x[i] = -INFINITY;
                x[V - 1] = 1.0f;
                exact[r] = 1;
                break;
            case 3: /* top-k cuts ties at the best weight */
                for (int i = 0; i < V; i += 7)
                    x[i] = 5.0f, ties++;
                rr[r].top_k = ties / 2 + 1;
                exact[r] = 1;
                break;
            case 4: /* top-p cuts ties at the best weight (0.3 of the mass is within the ties) */
                for (int i = 1; i < V; i += 5)
                    x[i] = 5.0f;
                rr[r].top_p = 0.3f;
                exact[r] = 1;
                break;
            case 5: /* min-p and penalties */
                rr[r].min_p = 0.02f;
                rr[r].rep = 1.2f, rr[r].freq = 0.5f, rr[r].pres = 0.3f;
                rr[r].ids = hist, rr[r].num_prompt = 10, rr[r].num_output = 20;
                rr[r].index = 20; /* the draw's counter is the output count */
                break;
            case 6:
                rr[r].temperature = 0;
                break;
            default: /* temperature alone */
                break;
            }
        }
        int32_t tok[64];
        float lp[64];
        run_sampler(logits, n, V, rr, tok, lp, NULL, NULL);
        int mism = 0, mism_cpu = 0;
        for (int r = 0; r < n; r++) {
            const float *x = logits + (int64_t)r * V;
            const int want = ref_sample(x, V, &rr[r], NULL);
            const int cwant = cpu_sample(x, V, &rr[r], NULL, NULL, NULL);
            if (tok[r] != want && (exact[r] || rr[r].temperature == 0))
                fail_msg("V %d row %d (case %d): got %d, want %d", V, r, r % 8, tok[r], want);
            if (tok[r] != want) {
                mism++;
                printf("  note: V %d row %d sampled %d, reference %d\n", V, r, tok[r], want);
            }
            if (tok[r] != cwant) {
                mism_cpu++;
                printf("  note: V %d row %d sampled %d, CPU sampler %d\n", V, r, tok[r], cwant);
            }
        }
        printf("  sampler ranges V %d: %d of %d rows differ from the reference, %d from the CPU "
               "sampler\n",
               V, mism, n, mism_cpu);
        assert_true(mism <= 1 && mism_cpu <= 1);
        free(logits);
    }
}

/* The race kernel (rows that are greedy or a temperature alone: the exponential race, a row over
 * many blocks, their best words joined by atomicMax) against the one-block kernel (no host rows)
 * and the cluster kernels (CVLLM_CUDA_SAMPLER=norace) on the same rows: the same token for every
 * row, log-prob 0, the scratch left zeroed (run_sampler); and against the reference (keys in
 * double) and the CPU sampler, which may differ only where two keys are within rounding. Rows:
 * random, greedy, the best logit tied across blocks' pieces, NaN and -inf among the logits, all
 * NaN (0), all -inf (0), +inf twice (the lower id), a tiny and a large temperature, every key
 * equal but for rounding (the race kernel's pruning keeps every id a candidate and settles ties
 * by the exact keys), logits near 1e6 (its slack relative to them); vocabularies of one partial
 * piece, unaligned rows, exactly one piece, one piece and one id, and Qwen3's; f32 and bf16
 * logits. */
static void test_sampler_race(void **state) {
    (void)state;
    const int Vs[] = {7, 33, 1001, 4096, 4097, 151936};
    for (int vi = 0; vi < 6; vi++)
        for (int rep = 0; rep < 4; rep++) {
            const int V = Vs[vi], n = rep == 0 ? 1 : rep == 1 ? 10 : V > 5000 ? 40 : 300;
            if (small_run() > 1 && V > 5000) continue;
            float *logits = xmalloc((size_t)n * V * 4);
            for (int64_t i = 0; i < (int64_t)n * V; i++)
                logits[i] = 4 * frand();
            RefRow *rr = xcalloc(n, sizeof *rr);
            static const float temps[12] = {0.6f, 0, 0.6f, 1.3f, 1, 0.7f, 0.8f, 1e-3f, 5, 1,
                                            0.6f, 0.9f};
            for (int r = 0; r < n; r++) {
                float *x = logits + (int64_t)r * V;
                const int kind = (r + rep) % 12;
                rr[r] = (RefRow){.temperature = temps[kind],
                                 .top_p = 1,
                                 .rep = 1,
                                 .num_logprobs = -1,
                                 .seed = 7 + 100 * rep + r,
                                 .index = (uint64_t)(r * 5 + rep)};
                if (kind == 2) /* the best logit tied, across pieces */
                    for (int i = 0; i < V; i += 97)
                        x[i] = 5.0f;
                if (kind == 3)
                    for (int i = 1; i < V; i += 3)
                        x[i] = i % 2 ? NAN : -INFINITY;
                if (kind == 4)
                    for (int i = 0; i < V; i++)
                        x[i] = NAN;
                if (kind == 5)
                    for (int i = 0; i < V; i++)
                        x[i] = -INFINITY;
                if (kind == 6) x[V / 2] = x[V - 1] = INFINITY;
                if (kind == 10) { /* every key 1 but for rounding: every id near the best */
                    const CvllmRaceKey k = cvllm_race_key(rr[r].seed, rr[r].index);
                    for (int i = 0; i < V; i++)
                        x[i] = (float)(1.0 + (double)rr[r].temperature *
                                                 log(-log((double)cvllm_race_uniform(k, i))));
                }
                if (kind == 11) /* large logits: the bound's slack relative to them */
                    for (int i = 0; i < V; i++)
                        x[i] += 1e6f;
            }
            g_sampler_bf16 = rep % 2;
            if (g_sampler_bf16) round_bf16(logits, (int64_t)n * V);
            int32_t *tok[3];
            float *lp[3];
            static const char *const way_env[3] = {NULL, NULL, "norace"};
            for (int way = 0; way < 3; way++) { /* block, race (the default), cluster */
                tok[way] = xmalloc(n * 4), lp[way] = xmalloc(n * 4);
                g_sampler_host_rows = way > 0;
                if (way_env[way]) setenv("CVLLM_CUDA_SAMPLER", way_env[way], 1);
                run_sampler(logits, n, V, rr, tok[way], lp[way], NULL, NULL);
                unsetenv("CVLLM_CUDA_SAMPLER");
            }
            g_sampler_host_rows = g_sampler_bf16 = 0;
            int mism = 0, mism_cpu = 0;
            for (int r = 0; r < n; r++) {
                for (int way = 1; way < 3; way++) {
                    if (tok[way][r] != tok[0][r])
                        fail_msg("race sampler (%s) V %d rows %d row %d (kind %d, %s): token %d, "
                                 "the one-block kernel's %d",
                                 way == 1 ? "race kernel" : "cluster kernels", V, n, r,
                                 (r + rep) % 12, rep % 2 ? "bf16" : "f32", tok[way][r], tok[0][r]);
                    if (lp[way][r] != 0.0f) fail_msg("race sampler: log-prob %g", lp[way][r]);
                }
                const float *x = logits + (int64_t)r * V;
                const int want = ref_sample(x, V, &rr[r], NULL);
                const int cwant = cpu_sample(x, V, &rr[r], NULL, NULL, NULL);
                const int kind = (r + rep) % 12;
                if (tok[1][r] != want && (kind == 1 || kind == 4 || kind == 5 || kind == 6))
                    fail_msg("race sampler V %d row %d (kind %d): token %d, want %d", V, r, kind,
                             tok[1][r], want);
                if (kind >= 10) continue; /* keys within rounding (near 1e6 too): the kernels'
                                           * equality above */
                mism += tok[1][r] != want;
                mism_cpu += tok[1][r] != cwant;
            }
            printf("  race sampler V %d rows %d%s: %d differ from the reference, %d from the CPU "
                   "sampler\n",
                   V, n, rep % 2 ? " (bf16)" : "", mism, mism_cpu);
            assert_true(mism <= 1 && mism_cpu <= 1);
            for (int way = 0; way < 3; way++)
                free(tok[way]), free(lp[way]);
            free(rr), free(logits);
        }
}

/* The cluster kernels (rows with temperature / min-p only: a row over 8 blocks) against the
 * one-block kernel on the same rows: the same token for every row, and log-prob 0. The staged
 * kernel (the default where a row is 16-byte aligned: V a multiple of 4 in f32, of 8 in bf16; as
 * many rows as one wave holds, 24 of them on 96 SMs or more) and the in-place one
 * (CVLLM_CUDA_SAMPLER=cluster, or rows not aligned; up to 16 rows). Rows put the kept tokens at
 * the edges of the blocks' slices and of their warp ranges (16 and 32 warps), keep only the
 * first or the last id, tie the best logit across slices
 * (greedy: the lowest id), mix in NaN and -inf, or are all NaN; vocabularies smaller than the
 * cluster's 8 slices of 8 ids, and Qwen3's. Every row's draw is repeated with 8 seeds, 24 rows in
 * two of them. */
static void test_sampler_cluster(void **state) {
    (void)state;
    const int Vs[] = {7, 33, 1001, 1000, 5000, 151936};
    for (int vi = 0; vi < 6; vi++)
        for (int rep = 0; rep < 8; rep++) {
            const int V = Vs[vi], n = rep == 5 ? 1 : rep >= 6 ? 24 : 16;
            const int slice = ((V + 7) / 8 + 7) & ~7;
            float *logits = xmalloc((size_t)n * V * 4);
            for (int64_t i = 0; i < (int64_t)n * V; i++)
                logits[i] = 4 * frand();
            RefRow rr[48];
            for (int r = 0; r < n; r++) {
                float *x = logits + (int64_t)r * V;
                rr[r] = (RefRow){.temperature = 0.6f,
                                 .top_p = 1,
                                 .rep = 1,
                                 .num_logprobs = -1,
                                 .seed = 99 + 1000 * rep + r,
                                 .index = (uint64_t)(r * 3 + rep)};
                const int kind = (r + rep) % 8;
                if (kind <= 2) { /* only some ids kept, all of weight 1 */
                    for (int i = 0; i < V; i++)
                        x[i] = -INFINITY;
                    if (kind == 0) /* slice and range edges */
                        for (int c = 0; c < 8; c++)
                            for (int nw = 16; nw <= 32; nw += 16) {
                                const int len = ((slice + nw - 1) / nw + 3) & ~3;
                                for (int w = 0; w < nw; w++) {
                                    const int lo = c * slice + w * len;
                                    const int e[4] = {lo - 1, lo, lo + 1, lo + len - 1};
                                    for (int k = 0; k < 4; k++)
                                        if (e[k] >= 0 && e[k] < V && (w + k + rep) % 3 == 0)
                                            x[e[k]] = 2.0f;
                                }
                            }
                    if (kind == 1) x[V - 1] = 2.0f;
                    if (kind == 2) x[0] = 2.0f;
                } else if (kind == 3) { /* greedy, the best logit tied in every slice */
                    rr[r].temperature = 0;
                    for (int c = 7; c >= 0; c--)
                        if (c * slice + 1 < V) x[c * slice + 1] = 9.0f;
                } else if (kind == 4) {
                    rr[r].min_p = 0.05f;
                    rr[r].temperature = 1.0f;
                } else if (kind == 5) { /* NaN and -inf among the logits */
                    for (int i = 0; i < V; i += 3)
                        x[i] = i % 2 ? NAN : -INFINITY;
                    rr[r].temperature = 2.0f;
                } else if (kind == 6) { /* all NaN: token 0 */
                    for (int i = 0; i < V; i++)
                        x[i] = NAN;
                }
            }
            int32_t tok[3][48];
            float lp[3][48];
            g_sampler_bf16 = rep % 2; /* bf16 logits (every kernel) */
            if (g_sampler_bf16) round_bf16(logits, (int64_t)n * V);
            for (int way = 0; way < 3; way++) { /* block, staged (where aligned), in place */
                g_sampler_host_rows = way > 0;
                if (way == 2) setenv("CVLLM_CUDA_SAMPLER", "cluster", 1);
                run_sampler(logits, n, V, rr, tok[way], lp[way], NULL, NULL);
                unsetenv("CVLLM_CUDA_SAMPLER");
            }
            g_sampler_host_rows = g_sampler_bf16 = 0;
            for (int way = 1; way < 3; way++)
                for (int r = 0; r < n; r++) {
                    if (tok[way][r] != tok[0][r])
                        fail_msg("cluster sampler (%s) V %d rows %d row %d (kind %d, %s): token "
                                 "%d, the one-block kernel's %d",
                                 way == 1 ? "default" : "in place", V, n, r, (r + rep) % 8,
                                 rep % 2 ? "bf16" : "f32", tok[way][r], tok[0][r]);
                    if (lp[way][r] != 0.0f)
                        fail_msg("cluster sampler: log-prob %g", lp[way][r]);
                }
            free(logits);
        }
}

/* The decode attention's launch order (host code): the lanes by context length, longest first,
 * ties in lane order, against a sort of (2^31 - 1 - length, lane) pairs: ties, contexts of 0 and
 * below, one lane, lengths of one to four bytes; and that order folded (attention_decode_fold,
 * the fp8 cache's), odd and even counts. */
static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}
static void test_decode_order(void **state) {
    (void)state;
    enum { SMAX = 300 };
    int32_t ctx[SMAX], order[SMAX];
    uint64_t keys[SMAX], ref[SMAX];
    const int32_t spans[] = {1, 3, 200, 40960, 1 << 20, INT32_MAX};
    uint64_t s = 12345;
    for (int trial = 0; trial < 60; trial++) {
        const int S = trial % 10 == 0 ? 1 : 1 + (int)(s % SMAX);
        const int32_t span = spans[trial % 6];
        for (int i = 0; i < S; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            ctx[i] = (int32_t)(s % (uint64_t)span);
            if (s % 17 == 0) ctx[i] = -(int32_t)(s % 5); /* a padded lane */
        }
        for (int i = 0; i < S; i++) {
            const int64_t len = ctx[i] > 0 ? ctx[i] : 0;
            ref[i] = (uint64_t)(INT32_MAX - len) << 32 | (uint32_t)i;
        }
        qsort(ref, (size_t)S, sizeof *ref, cmp_u64);
        attention_decode_order(ctx, S, keys, order);
        for (int i = 0; i < S; i++)
            if (order[i] != (int32_t)(ref[i] & 0xffffffffu))
                fail_msg("trial %d (S %d, span %d): order[%d] = %d, expected %d", trial, S, span,
                         i, order[i], (int)(ref[i] & 0xffffffffu));
        /* folded but for the shortest quarter (or a third, or none), which stays last: the
         * longest, the shortest of the rest, the second longest, .., then the quarter longest
         * first */
        for (int q = 3; q <= 4; q++) {
            int32_t tmp[SMAX];
            memcpy(tmp, order, sizeof(int32_t) * S);
            const int tail = S / q, n = S - tail;
            attention_decode_fold(tmp, S, tail, (int32_t *)keys);
            for (int i = 0; i < S; i++) {
                const int k = i >= n ? i : i % 2 ? n - 1 - i / 2 : i / 2;
                if (tmp[i] != (int32_t)(ref[k] & 0xffffffffu))
                    fail_msg("trial %d (S %d): order folded but for the last %d: [%d] = %d, "
                             "expected %d",
                             trial, S, tail, i, tmp[i], (int)(ref[k] & 0xffffffffu));
            }
        }
        /* folded: the longest, the shortest, the second longest, .. (odd S: the middle last) */
        attention_decode_fold(order, S, 0, (int32_t *)keys);
        /* the records of that order (one token a sequence, tables of 6 columns, block size 16:
         * entry k of sequence s is 100 s + k) */
        if (span <= 40960) {
            enum { MB = 6 };
            int32_t cu[SMAX + 1], pos[SMAX], tab[SMAX * MB], rec[SMAX * DEC_REC_INTS];
            int32_t lim[SMAX];
            int64_t slots[SMAX];
            cu[0] = 0;
            for (int i = 0; i < S; i++) {
                lim[i] = ctx[i] < MB * 16 ? ctx[i] : MB * 16; /* within the 6 columns */
                cu[i + 1] = i + 1, pos[i] = 7 * i + 1;
                slots[i] = ((int64_t)i << 33) + 3 * i; /* past 32 bits */
                for (int k = 0; k < MB; k++)
                    tab[i * MB + k] = 100 * i + k;
            }
            attention_decode_records(order, S, lim, cu, trial % 2 ? pos : NULL,
                                     trial % 3 ? slots : NULL, tab, MB, 16, rec);
            for (int i = 0; i < S; i++) {
                const int32_t *r = rec + i * DEC_REC_INTS, s = order[i];
                const int nb = lim[s] > 0 ? (lim[s] + 15) / 16 : 0;
                int ok =
                    r[0] == s && r[1] == lim[s] && r[2] == s && r[3] == (trial % 2 ? 7 * s + 1 : 0);
                for (int k = 0; k < DEC_REC_TAB; k++)
                    ok = ok && r[DEC_REC_TAB0 + k] == (k < nb ? 100 * s + k : 0);
                int64_t sl;
                memcpy(&sl, r + DEC_REC_SLOT, sizeof sl);
                ok = ok && sl == (trial % 3 ? ((int64_t)s << 33) + 3 * s : -1) && !r[10] && !r[11];
                if (!ok)
                    fail_msg("trial %d: record %d (sequence %d, context %d): %d %d %d %d | %d %d "
                             "%d %d",
                             trial, i, s, lim[s], r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
            }
        }
        for (int i = 0; i < S; i++) {
            const int k = i % 2 ? S - 1 - i / 2 : i / 2;
            if (order[i] != (int32_t)(ref[k] & 0xffffffffu))
                fail_msg("trial %d (S %d): folded order[%d] = %d, expected %d", trial, S, i,
                         order[i], (int)(ref[k] & 0xffffffffu));
        }
    }
}

/* attention_decode_num_parts (host code): a wave of slots (the blocks an SM takes: 2 for an fp8
 * cache's tensor-core kernel, 264 on 132 SMs; 3 for bf16's, 396) over the grid's blocks (a
 * sequence and kv head each), rounded to the nearest, at least 1, at most 32 over an fp8 cache
 * (16 over bf16) and one part per 256 keys of context. Rounded up instead, 4 sequences would get
 * 9 partitions over an fp8 cache and 32 sequences 2. */
static void test_decode_parts(void **state) {
    (void)state;
    AttentionParams p = {.n_heads = 16,
                         .n_kv_heads = 8,
                         .hd = 128,
                         .kvdt = DTYPE_FP8_E4M3,
                         .block_size = 16,
                         .max_seqlen_k = 40960};
    const int seqs[] = {1, 2, 4, 8, 16, 32, 48, 256}, want[] = {32, 17, 8, 4, 2, 1, 1, 1};
    for (size_t i = 0; i < sizeof seqs / sizeof *seqs; i++) {
        p.num_seqs = seqs[i];
        const int got = attention_decode_num_parts(&p, 132);
        if (got != want[i])
            fail_msg("%d sequences: %d partitions, expected %d", seqs[i], got, want[i]);
    }
    p.kvdt = DTYPE_BF16; /* 1 sequence: 49.5 rounded to 50, then the cap; 16: 3.09 to 3 */
    p.num_seqs = 1;
    assert_int_equal(attention_decode_num_parts(&p, 132), 16);
    p.num_seqs = 16;
    assert_int_equal(attention_decode_num_parts(&p, 132), 3);
    p.kvdt = DTYPE_FP8_E4M3;
    p.num_seqs = 1;
    p.max_seqlen_k = 1000; /* 4 parts of >= 256 keys */
    assert_int_equal(attention_decode_num_parts(&p, 132), 4);
}

int main(void) {
    /* CVLLM_TEST_FILTER=test_attention* (a cmocka glob on the whole name): for sanitizer runs */
    if (getenv("CVLLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CVLLM_TEST_FILTER"));
    /* host code first: it runs without a GPU too */
    const struct CMUnitTest host_tests[] = {cmocka_unit_test(test_decode_order),
                                            cmocka_unit_test(test_decode_parts)};
    if (cmocka_run_group_tests_name("host", host_tests, NULL, NULL)) return 1;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        printf("skipped: no GPU\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("GPU: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
    g_pool = threadpool_create(0);
    cudaStreamCreate(&g_stream);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_vocab_shards_to_rows),
        cmocka_unit_test(test_residual_rmsnorm),
        cmocka_unit_test(test_qk_norm_rope),
        cmocka_unit_test(test_store_kvcache),
        cmocka_unit_test(test_fp8_conversions),
        cmocka_unit_test(test_silu_mul_gather_bias),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_graph_edges),
        cmocka_unit_test(test_copy_segments),
        cmocka_unit_test(test_gemv_silu_pair),
        cmocka_unit_test(test_attention_prefill),
        cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_attention_decode_lazy),
        cmocka_unit_test(test_attention_decode_fused),
        cmocka_unit_test(test_sampler_rows),
        cmocka_unit_test(test_sampler_distribution),
        cmocka_unit_test(test_sampler_ranges),
        cmocka_unit_test(test_sampler_cluster),
        cmocka_unit_test(test_sampler_race),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cudaStreamDestroy(g_stream);
    threadpool_destroy(g_pool);
    return rc;
}
