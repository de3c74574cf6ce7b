/* ops.c: reference kernels of the CPU backend and the run-time choice of their fast variants.
 * The scalar code here is the readable definition of each op; matmul_avx2.c / ops_avx2.c must
 * agree with it (tests/test_cpu_ops.c). Threaded jobs are cut into tasks (row chunks, (token, head)
 * pairs) that the pool hands out one by one, so a core stolen by another process slows a step
 * down instead of stalling it. */
#include "backend/cpu/ops.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"

/* ================================================================ instruction-set dispatch */

static int g_isa = -1; /* -1 = not chosen yet */

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
/* F16C through CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports does not know it. */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

CpuIsa cpu_isa_best(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma") && cpu_has_f16c())
        return CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c())
        return CPU_ISA_AVX2;
#endif
    return CPU_ISA_SCALAR;
}

CpuIsa cpu_isa_set(CpuIsa isa) {
    CpuIsa best = cpu_isa_best();
    g_isa = isa > best ? best : isa;
    return (CpuIsa)g_isa;
}

CpuIsa cpu_isa_get(void) {
    if (g_isa < 0) {
        const char *e = getenv("CVLLM_CPU_ISA");
        CpuIsa want = cpu_isa_best();
        if (e && !strcmp(e, "scalar")) want = CPU_ISA_SCALAR;
        if (e && !strcmp(e, "avx2")) want = CPU_ISA_AVX2;
        if (e && !strcmp(e, "avx512")) want = CPU_ISA_AVX512;
        cpu_isa_set(want);
    }
    return (CpuIsa)g_isa;
}

static int on_cached = -1; /* cpu_matmul_prefetch: every thread computes the same value */

void cpu_matmul_set_prefetch(int on) { __atomic_store_n(&on_cached, on ? 1 : 0, __ATOMIC_RELAXED); }

int cpu_matmul_prefetch(void) {
    int on = __atomic_load_n(&on_cached, __ATOMIC_RELAXED);
    if (on < 0) {
        const char *e = getenv("CVLLM_CPU_PREFETCH");
        if (e && *e) {
            on = strcmp(e, "0") != 0;
        } else {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_cpu_init();
            on = __builtin_cpu_is("intel") ? 1 : 0;
#else
            on = 0;
#endif
        }
        __atomic_store_n(&on_cached, on, __ATOMIC_RELAXED);
    }
    return on;
}

const char *cpu_isa_name(CpuIsa isa) {
    switch (isa) {
    case CPU_ISA_AVX2: return "avx2";
    case CPU_ISA_AVX512: return "avx512";
    default: return "scalar";
    }
}

/* ================================================================ element conversion */


void cpu_to_f32(float *out, const void *src, DType dt, int64_t off, int64_t n) {
    if (dt == DTYPE_F32) {
        memcpy(out, (const float *)src + off, (size_t)n * sizeof(float));
    } else if (dt == DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32(s[i]);
    } else if (dt == DTYPE_FP8_E4M3) {
        const uint8_t *s = (const uint8_t *)src + off;
        for (int64_t i = 0; i < n; i++) out[i] = fp8_e4m3_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++) out[i] = f16_to_f32(s[i]);
    }
}

/* ================================================================ matmul */

void matmul_rows_scalar(const MatmulArgs *a, int64_t n0, int64_t n1) {
    const int64_t K = a->K;
    for (int t = 0; t < a->T; t++) {
        const float *x = a->x + t * a->ldx;
        for (int64_t n = n0; n < n1; n++) {
            float acc = 0.0f;
            if (a->wdt == DTYPE_BF16) {
                const uint16_t *w = (const uint16_t *)a->w + n * K;
                for (int64_t k = 0; k < K; k++) acc += x[k] * bf16_to_f32(w[k]);
            } else if (a->wdt == DTYPE_F16) {
                const uint16_t *w = (const uint16_t *)a->w + n * K;
                for (int64_t k = 0; k < K; k++) acc += x[k] * f16_to_f32(w[k]);
            } else {
                const float *w = (const float *)a->w + n * K;
                for (int64_t k = 0; k < K; k++) acc += x[k] * w[k];
            }
            a->y[t * a->ldy + n] = acc + (a->bias ? a->bias[n] : 0.0f);
        }
    }
}

void matmul_rows(CpuIsa isa, const MatmulArgs *a, int64_t n0, int64_t n1) {
#if defined(__x86_64__)
    if (isa == CPU_ISA_AVX2 && a->wp) {
        matmul_rows_packed_avx2(a, n0, n1);
        return;
    }
    if (isa == CPU_ISA_AVX512) {
        matmul_rows_avx512(a, n0, n1);
        return;
    }
    if (isa == CPU_ISA_AVX2) {
        matmul_rows_avx2(a, n0, n1);
        return;
    }
#endif
    matmul_rows_scalar(a, n0, n1);
}

size_t matmul_packed_bytes(const Tensor *w) {
    return (size_t)((w->rows + 15) / 16) * (size_t)w->cols * 16 * sizeof(uint16_t);
}

void matmul_pack_bf16_into(const Tensor *w, uint16_t *p) {
    CHECK(w->dtype == DTYPE_BF16 && w->data, "packing a %s tensor", w->data ? "non-bf16" : "missing");
    const int64_t N = w->rows, K = w->cols, np = (N + 15) / 16;
    const uint16_t *src = w->data;
    for (int64_t pi = 0; pi < np; pi++) {
        uint16_t *panel = p + pi * K * 16;
        for (int r = 0; r < 16; r++) {
            int64_t n = pi * 16 + r;
            int lane = r < 8 ? 2 * r : 2 * (r - 8) + 1; /* (r0, r8, r1, r9, ..., r7, r15) */
            if (n < N)
                for (int64_t k = 0; k < K; k++) panel[k * 16 + lane] = src[n * K + k];
            else
                for (int64_t k = 0; k < K; k++) panel[k * 16 + lane] = 0;
        }
    }
}

uint16_t *matmul_pack_bf16(const Tensor *w) {
    const size_t bytes = matmul_packed_bytes(w);
    uint16_t *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    CHECK(p != NULL, "out of memory packing a [%lld, %lld] matrix", (long long)w->rows,
          (long long)w->cols);
    matmul_pack_bf16_into(w, p);
    return p;
}

void *cpu_alloc_huge(size_t bytes, size_t *mapped) {
    const size_t huge = (size_t)2 << 20, len = (bytes + huge - 1) / huge * huge;
    /* map one huge page more, then trim the unaligned head and the tail */
    char *raw = mmap(NULL, len + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
    const size_t head = (size_t)(p - raw); /* < huge, so the tail below is never empty */
    if (head) munmap(raw, head);
    munmap(p + len, huge - head);
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE); /* a hint: without it only speed is lost */
#endif
    *mapped = len;
    return p;
}

void cpu_free_huge(void *p, size_t mapped) {
    if (p) munmap(p, mapped);
}

/* Rows per work chunk, about 8 chunks per thread so that the atomic hand-out evens out, at most
 * 528 rows. Packed weights: whole 16-row panels, as many per chunk as give every thread the
 * same number of chunks where the panels allow it (o_proj's 64 panels on 2 threads: 16 chunks of
 * 4, not 11 chunks of 96 rows of which the last is short). Row-major: a multiple of every
 * kernel's row tile (24) and of 16. */
static int64_t matmul_chunk_rows(int64_t N, int nth, int packed) {
    if (packed) {
        const int64_t panels = (N + 15) / 16, want = (int64_t)nth * 8;
        int64_t per = (panels + want - 1) / want;
        if (per > 33) per = 33;
        return per * 16;
    }
    int64_t c = N / ((int64_t)nth * 8);
    c = (c + 47) / 48 * 48;
    if (c < 48) c = 48;
    if (c > 528) c = 528;
    return c;
}

typedef struct {
    CpuIsa isa;
    const float *x, *xp, *xi;
    int64_t ldx;
    int T;
    const MatmulPart *parts;
    int num_parts;
    int64_t chunk;
    int64_t part_chunks[CPU_MATMUL_MAX_PARTS + 1]; /* prefix sums of chunks per part */
} MatmulJob;

static void matmul_job(void *ctx, int64_t c, int thread) {
    MatmulJob *j = ctx;
    int p = 0;
    while (c >= j->part_chunks[p + 1]) p++;
    const MatmulPart *pt = &j->parts[p];
    int64_t n0 = (c - j->part_chunks[p]) * j->chunk;
    int64_t n1 = n0 + j->chunk < pt->w->rows ? n0 + j->chunk : pt->w->rows;
    MatmulArgs a = {.x = j->x, .ldx = j->ldx, .T = j->T, .w = pt->w->data, .wdt = pt->w->dtype,
                    .K = pt->w->cols, .bias = pt->bias, .y = pt->y, .ldy = pt->ldy, .xp = j->xp,
                    .wp = pt->wp, .xi = j->xi};
    matmul_rows(j->isa, &a, n0, n1);
}

/* The AVX2 bf16 kernels read x rearranged: the row-major ones permuted (xp), the packed ones
 * interleaved per token tile when T > 1 (xi). Made once here for all threads into xp_buf; with
 * no buffer, or when a call has both kinds of weights, the kernels make their own copies. */
static void prepare_x(CpuIsa isa, const float *x, int64_t ldx, int T, int64_t K, int rowmajor_bf16,
                      int packed, float *xp_buf, const float **xp, const float **xi) {
    *xp = *xi = NULL;
#if defined(__x86_64__)
    if (isa != CPU_ISA_AVX2 || !xp_buf || (rowmajor_bf16 && packed)) return;
    if (rowmajor_bf16) {
        matmul_permute_x_avx2(x, ldx, T, K, xp_buf);
        *xp = xp_buf;
    } else if (packed && T > 1) {
        matmul_interleave_x_avx2(x, ldx, T, K, xp_buf);
        *xi = xp_buf;
    }
#else
    (void)x, (void)ldx, (void)T, (void)K, (void)rowmajor_bf16, (void)packed, (void)xp_buf;
#endif
}

void matmul_cpu(ThreadPool *pool, const float *x, int64_t ldx, int T, const MatmulPart *parts,
                int num_parts, float *xp_buf) {
    CHECK(num_parts >= 1 && num_parts <= CPU_MATMUL_MAX_PARTS, "num_parts %d", num_parts);
    MatmulJob j = {.isa = cpu_isa_get(), .x = x, .ldx = ldx, .T = T, .parts = parts,
                   .num_parts = num_parts};
    int64_t maxN = 0;
    for (int p = 0; p < num_parts; p++) {
        CHECK(parts[p].w->cols == parts[0].w->cols, "part %d has K %lld, part 0 has %lld", p,
              (long long)parts[p].w->cols, (long long)parts[0].w->cols);
        if (parts[p].w->rows > maxN) maxN = parts[p].w->rows;
    }
    int rowmajor_bf16 = 0, any_packed = 0, all_packed = 1;
    for (int p = 0; p < num_parts; p++) {
        rowmajor_bf16 |= parts[p].w->dtype == DTYPE_BF16 && !parts[p].wp;
        any_packed |= parts[p].wp != NULL;
        all_packed &= parts[p].wp != NULL;
    }
    prepare_x(j.isa, x, ldx, T, parts[0].w->cols, rowmajor_bf16, any_packed, xp_buf, &j.xp, &j.xi);
    j.chunk = matmul_chunk_rows(maxN, threadpool_size(pool), all_packed && j.isa == CPU_ISA_AVX2);
    j.part_chunks[0] = 0;
    for (int p = 0; p < num_parts; p++)
        j.part_chunks[p + 1] = j.part_chunks[p] + (parts[p].w->rows + j.chunk - 1) / j.chunk;
    threadpool_run(pool, matmul_job, &j, j.part_chunks[num_parts]);
}

typedef struct {
    CpuIsa isa;
    const float *x, *xp, *xi;
    int T;
    const Tensor *wg, *wu;
    const uint16_t *wgp, *wup;
    float *g, *u;
    int64_t chunk, num_chunks;
} GateUpJob;

static void gate_up_job(void *ctx, int64_t c, int thread) {
    GateUpJob *j = ctx;
    const int64_t I = j->wg->rows, K = j->wg->cols;
    int64_t n0 = c * j->chunk, n1 = n0 + j->chunk < I ? n0 + j->chunk : I;
    MatmulArgs a = {.x = j->x, .ldx = K, .T = j->T, .w = j->wg->data, .wdt = j->wg->dtype, .K = K,
                    .y = j->g, .ldy = I, .xp = j->xp, .wp = j->wgp, .xi = j->xi};
    matmul_rows(j->isa, &a, n0, n1);
    a.w = j->wu->data;
    a.wdt = j->wu->dtype;
    a.wp = j->wup;
    a.y = j->u;
    matmul_rows(j->isa, &a, n0, n1);
    for (int t = 0; t < j->T; t++) {
#if defined(__x86_64__)
        if (j->isa != CPU_ISA_SCALAR) {
            silu_mul_avx2(j->g + t * I + n0, j->u + t * I + n0, n1 - n0);
            continue;
        }
#endif
        silu_mul_cpu(j->g + t * I + n0, j->u + t * I + n0, n1 - n0);
    }
}

void gate_up_silu_cpu(ThreadPool *pool, const float *x, int T, const Tensor *wg, const Tensor *wu,
                      const uint16_t *wgp, const uint16_t *wup, float *g, float *u, float *xp_buf) {
    CHECK(wg->rows == wu->rows && wg->cols == wu->cols, "gate [%lld, %lld] vs up [%lld, %lld]",
          (long long)wg->rows, (long long)wg->cols, (long long)wu->rows, (long long)wu->cols);
    GateUpJob j = {.isa = cpu_isa_get(), .x = x, .T = T, .wg = wg, .wu = wu, .wgp = wgp,
                   .wup = wup, .g = g, .u = u};
    prepare_x(j.isa, x, wg->cols, T, wg->cols,
              (wg->dtype == DTYPE_BF16 && !wgp) || (wu->dtype == DTYPE_BF16 && !wup),
              wgp || wup, xp_buf, &j.xp, &j.xi);
    j.chunk = matmul_chunk_rows(wg->rows, threadpool_size(pool), wgp && wup && j.isa == CPU_ISA_AVX2);
    j.num_chunks = (wg->rows + j.chunk - 1) / j.chunk;
    threadpool_run(pool, gate_up_job, &j, j.num_chunks);
}

/* ================================================================ small ops */

void rmsnorm_cpu(float *y, const float *x, const float *w, int n, float eps) {
#if defined(__x86_64__)
    if (cpu_isa_get() >= CPU_ISA_AVX2) {
        rmsnorm_avx2(y, x, w, n, eps);
        return;
    }
#endif
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
}

void silu_mul_cpu(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void rope_inv_freq_cpu(const ModelConfig *cfg, int head_dim, float *inv_freq) {
    const int half = head_dim / 2;
    const float theta = (float)cfg->rope_theta;
    for (int i = 0; i < half; i++) {
        /* transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in f32 */
        float e = (float)(2 * i) / (float)head_dim;
        inv_freq[i] = 1.0f / powf(theta, e);
    }
    if (cfg->rope_type == ROPE_LINEAR) {
        for (int i = 0; i < half; i++) inv_freq[i] = inv_freq[i] / (float)cfg->rope_factor;
    } else if (cfg->rope_type == ROPE_LLAMA3) {
        /* transformers _compute_llama3_parameters: long wavelengths are divided by factor,
         * short ones kept, the band between interpolated smoothly. */
        const double factor = cfg->rope_factor, lo = cfg->rope_low_freq_factor,
                     hi = cfg->rope_high_freq_factor, old = cfg->rope_original_max_position;
        const double lo_wavelen = old / lo, hi_wavelen = old / hi;
        for (int i = 0; i < half; i++) {
            double f = inv_freq[i], wavelen = 2.0 * M_PI / f;
            double r = wavelen > lo_wavelen ? f / factor : f;
            if (!(wavelen < hi_wavelen) && !(wavelen > lo_wavelen)) {
                double smooth = (old / wavelen - lo) / (hi - lo);
                r = (1.0 - smooth) * r / factor + smooth * r;
            }
            inv_freq[i] = (float)r;
        }
    }
}

void rope_cos_sin_cpu(int pos, const float *inv_freq, int half, float *cos_out, float *sin_out) {
    for (int i = 0; i < half; i++) {
        float angle = (float)pos * inv_freq[i];
        cos_out[i] = cosf(angle);
        sin_out[i] = sinf(angle);
    }
}

void rope_apply_cpu(float *x, int n_heads, int head_dim, const float *cos_t, const float *sin_t) {
    const int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            /* q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q[half:], q[:half]) */
            float a = v[i], b = v[i + half];
            v[i] = a * cos_t[i] - b * sin_t[i];
            v[i + half] = b * cos_t[i] + a * sin_t[i];
        }
    }
}

/* ================================================================ paged attention */

float dot_f32_scalar(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void axpy_f32_scalar(float *y, float alpha, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += alpha * x[i];
}

/* hd elements of the cache at element offset off, as f32 (widened into buf for bf16; for fp8
 * e4m3 dequantized into buf as vLLM reads them: f32(stored) * scale). */
static const float *kv_row(const void *cache, DType dt, float scale, int64_t off, int hd,
                           float *buf) {
    if (dt == DTYPE_F32) return (const float *)cache + off;
    if (dt == DTYPE_FP8_E4M3) {
        const uint8_t *src = (const uint8_t *)cache + off;
        for (int i = 0; i < hd; i++) buf[i] = fp8_e4m3_to_f32(src[i]) * scale;
        return buf;
    }
    const uint16_t *src = (const uint16_t *)cache + off;
    for (int i = 0; i < hd; i++) buf[i] = bf16_to_f32(src[i]);
    return buf;
}

typedef struct {
    const AttentionArgs *a;
    int use_avx2;
    int parts; /* tasks per token: the kv heads split in this many ranges */
} AttentionJob;

/* Token t, query heads of kv heads kh0 .. kh1. The reference path: one head after the other. */
static void attention_task(const AttentionArgs *a, int use_avx2, float *scores, int t, int kh0,
                           int kh1) {
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const int64_t kv_stride = (int64_t)a->n_kv_heads * hd;
    const int s = a->token_seq[t], n = a->num_keys[t], bs = a->block_size;
    const int32_t *table = a->block_tables + (int64_t)s * a->max_blocks_per_seq;
    const float *q = a->q + ((int64_t)t * a->n_heads + (int64_t)kh0 * group) * hd;
    float *out = a->out + ((int64_t)t * a->n_heads + (int64_t)kh0 * group) * hd;
#if defined(__x86_64__)
    if (use_avx2) {
        attention_heads_avx2(q, out, kh0, kh1, group, a->k_cache, a->v_cache,
                             a->kv_dtype == DTYPE_BF16, table,
                             n, bs, kv_stride, hd, a->scale, scores);
        return;
    }
#endif
    float row[CPU_MAX_HEAD_DIM]; /* one head's K or V row widened from bf16 / fp8 */
    CHECK(hd <= CPU_MAX_HEAD_DIM, "head_dim %d", hd);
    for (int hh = 0; hh < (kh1 - kh0) * group; hh++) {
        const int kvh = kh0 + hh / group;
        const float *qh = q + (int64_t)hh * hd;
        float *o = out + (int64_t)hh * hd;
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) {
            int64_t slot = (int64_t)table[j / bs] * bs + j % bs;
            const float *k = kv_row(a->k_cache, a->kv_dtype, a->k_scale,
                                    slot * kv_stride + (int64_t)kvh * hd, hd, row);
            float sc = dot_f32_scalar(qh, k, hd) * a->scale;
            scores[j] = sc;
            if (sc > mx) mx = sc;
        }
        float sum = 0.0f;
        for (int j = 0; j < n; j++) {
            scores[j] = expf(scores[j] - mx);
            sum += scores[j];
        }
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int j = 0; j < n; j++) {
            int64_t slot = (int64_t)table[j / bs] * bs + j % bs;
            const float *v = kv_row(a->v_cache, a->kv_dtype, a->v_scale,
                                    slot * kv_stride + (int64_t)kvh * hd, hd, row);
            axpy_f32_scalar(o, scores[j], v, hd);
        }
        const float inv = 1.0f / sum;
        for (int i = 0; i < hd; i++) o[i] *= inv;
    }
}

static void attention_job(void *ctx, int64_t task, int thread) {
    AttentionJob *j = ctx;
    const AttentionArgs *a = j->a;
    float *scores = a->scratch + (int64_t)thread * a->scratch_stride;
    const int t = (int)(task / j->parts), part = (int)(task % j->parts);
    const int kh0 = part * a->n_kv_heads / j->parts, kh1 = (part + 1) * a->n_kv_heads / j->parts;
    attention_task(a, j->use_avx2, scores, t, kh0, kh1);
}

void attention_cpu(ThreadPool *pool, const AttentionArgs *a) {
    CHECK(a->n_kv_heads > 0 && a->n_heads % a->n_kv_heads == 0, "heads %d, kv heads %d",
          a->n_heads, a->n_kv_heads);
    /* A task is one token's heads, split in ranges of kv heads only as far as it takes to give
     * every thread two tasks (one decoding sequence still uses all threads). Each head's
     * arithmetic is the same whatever the split. */
    CHECK(a->kv_dtype == DTYPE_F32 || a->kv_dtype == DTYPE_BF16 ||
              (a->kv_dtype == DTYPE_FP8_E4M3 && a->k_scale > 0 && a->v_scale > 0),
          "KV cache of %s, scales %g / %g", dtype_name(a->kv_dtype), a->k_scale, a->v_scale);
    /* an fp8 cache takes the scalar path (the reference; no AVX2 variant) */
    AttentionJob j = {.a = a,
                      .use_avx2 = cpu_isa_get() >= CPU_ISA_AVX2 && a->kv_dtype != DTYPE_FP8_E4M3,
                      .parts = 1};
    const int want = 2 * threadpool_size(pool);
    while (j.parts < a->n_kv_heads && (int64_t)a->num_tokens * j.parts < want) j.parts *= 2;
    if (j.parts > a->n_kv_heads) j.parts = a->n_kv_heads;
    threadpool_run(pool, attention_job, &j, (int64_t)a->num_tokens * j.parts);
}
