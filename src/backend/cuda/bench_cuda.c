/* bench_cuda.c: `cvllm bench ops --device cuda [gemm|attention|decode|sampler|all]`: the CUDA
 * backend's own figures on this GPU, timed with CUDA events (median of repeats after a warm-up):
 *   gemm       the qwen3-0.6b products (bf16 in, f32 out, as gemm_cuda routes them: gemv.cu or
 *              cuBLASLt) at T tokens: TFLOP/s, GB/s; up to 256 tokens also as a decode step runs
 *              them (in a CUDA graph, weights from memory and from L2), and so through
 *              gemm_mma.cu and (Hopper) gemm_tma.cu
 *   gemm-algos the decode-sized products with each of cuBLASLt's first 16 algorithms (not in all)
 *   attention  paged decode attention (16 heads / 8 kv heads, head_dim 128, bf16 and fp8 cache)
 *              at batch B over a context of C tokens, each sequence its own cache blocks: GB/s of
 *              K/V read; prefill attention of one sequence
 *   decode     a whole decode step of a synthetic qwen3-0.6b (random bf16 weights, one buffer
 *              shared by every tensor) through the backend itself, with and without CUDA graphs
 *   sampler    sampler_cuda alone on 256, 128, 64, 8 and 1 rows of 151,936 random logits:
 *              greedy, temperature 0.6 (the one-block, race, staged and in-place kernels)
 * Reached only through the backend registry (BackendEntry.bench_ops). */
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "common.h"

#define BCHECK(x)                                                                                  \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench: %s: %s\n", #x, cudaGetErrorString(e_));                        \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
#define BOK(x)                                                                                     \
    do {                                                                                           \
        if ((x) != 0) {                                                                            \
            fprintf(stderr, "bench: %s: %s\n", #x, cvllm_last_error());                            \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void fill_random_bf16(void *d, size_t n) {
    uint16_t *h = xmalloc(n * 2);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = f32_to_bf16(((float)(s >> 40) / 16777216.0f - 0.5f) * 0.1f);
    }
    cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice);
    free(h);
}

/* median milliseconds of reps launches of what fn enqueues */
typedef int (*LaunchFn)(void *ctx, cudaStream_t st);
static float time_ms(LaunchFn fn, void *ctx, cudaStream_t st, int reps) {
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    for (int i = 0; i < 3; i++)
        fn(ctx, st);
    float *t = xmalloc(reps * sizeof(float));
    for (int i = 0; i < reps; i++) {
        cudaEventRecord(a, st);
        fn(ctx, st);
        cudaEventRecord(b, st);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&t[i], a, b);
    }
    qsort(t, reps, sizeof(float), cmp_float);
    float med = t[reps / 2];
    free(t);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return med;
}

/* ---------------------------------------------------------------- gemm */

typedef struct {
    CudaGemm *g;
    float *y;
    void *x, *w;
    int T, N, K;
    int mma; /* 1: gemm_mma_cuda, 2: gemm_tma_cuda instead of gemm_cuda */
} GemmCtx;
static int gemm_launch(void *ctx, cudaStream_t st) {
    GemmCtx *c = ctx;
    if (c->mma == 1)
        return gemm_mma_cuda(c->y, DTYPE_F32, 0, c->N, c->x, c->w, DTYPE_BF16, c->T, c->N, c->K,
                             st);
    if (c->mma == 2)
        return gemm_tma_cuda(c->y, DTYPE_F32, 0, c->N, c->x, c->w, DTYPE_BF16, c->T, c->N, c->K,
                             st);
    return gemm_cuda(c->g, c->y, c->N, c->x, c->w, DTYPE_BF16, c->T, c->N, c->K, st);
}

/* Microseconds a product as a decode step runs it: GEMM_GRAPH products of c's shape captured in
 * one CUDA graph (no host time between them), product i reading weight slice i % nw of w (nw
 * slices of N x K apart: weights from memory, not L2, where nw slices outgrow it), the graph's
 * median replay over the count; -1 if the capture fails. */
#define GEMM_GRAPH 20
static float gemm_graph_us(const GemmCtx *c, int nw, cudaStream_t st) {
    cudaGraph_t graph;
    cudaGraphExec_t exec = NULL;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1;
    int rc = 0;
    for (int i = 0; i < GEMM_GRAPH && !rc; i++) {
        GemmCtx ci = *c;
        ci.w = (char *)c->w + (size_t)(i % nw) * c->N * c->K * 2;
        rc = gemm_launch(&ci, st);
    }
    if (cudaStreamEndCapture(st, &graph) != cudaSuccess || rc) {
        cudaGetLastError();
        return -1;
    }
    cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    float t[9];
    cudaGraphLaunch(exec, st); /* warm */
    for (int r = 0; r < 9; r++) {
        cudaEventRecord(a, st);
        cudaGraphLaunch(exec, st);
        cudaEventRecord(b, st);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&t[r], a, b);
    }
    qsort(t, 9, sizeof(float), cmp_float);
    cudaEventDestroy(a), cudaEventDestroy(b);
    cudaGraphExecDestroy(exec);
    return t[4] * 1000.0f / GEMM_GRAPH;
}

static int bench_gemm(cudaStream_t st) {
    const int shapes[][2] = {
        {4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}, {151936, 1024}};
    const char *names[] = {"qkv", "o_proj", "gate_up", "down", "lm_head"};
    const int Ts[] = {1, 8, 16, 32, 64, 128, 256, 2048, 8192};
    void *ws, *x, *w;
    float *y;
    BCHECK(cudaMalloc(&ws, 32 << 20));
    BCHECK(cudaMalloc(&x, (size_t)8192 * 3072 * 2));
    BCHECK(cudaMalloc(&w, (size_t)151936 * 1024 * 2));
    BCHECK(
        cudaMalloc((void **)&y, (size_t)8192 * 151936 * 4 / 4)); /* lm_head only up to 2048 rows */
    fill_random_bf16(x, (size_t)8192 * 3072);
    fill_random_bf16(w, (size_t)151936 * 1024);
    CudaGemm *g;
    BOK(gemm_create(&g, ws, 32 << 20));
    gemm_set_mma_max_t(g, 0);
    gemm_set_tma_max_t(g, 0);
    const int tma = gemm_tma_supported(DTYPE_BF16, 64, 1024, x, w);
    printf("gemm (bf16 in, f32 accumulate and out; T <= 4: gemv.cu, else cuBLASLt): one launch "
           "between events (its host time included): ms, TFLOP/s, GB/s of weights | %d in a CUDA "
           "graph, each its own weights (from memory, not L2): us a product, GB/s of weights | the same "
           "graph with every product on one slice of weights (in L2): us | the first graph "
           "through gemm_mma.cu | through gemm_tma.cu\n",
           GEMM_GRAPH);
    for (int si = 0; si < 5; si++)
        for (int ti = 0; ti < 9; ti++) {
            const int T = Ts[ti], N = shapes[si][0], K = shapes[si][1];
            if (si == 4 && T > 2048) continue;
            GemmCtx c = {g, y, x, w, T, N, K, 0};
            float ms = time_ms(gemm_launch, &c, st, 20);
            /* as many weight slices as the buffer holds, up to one a product */
            int nw = (int)((size_t)151936 * 1024 / ((size_t)N * K));
            nw = nw > GEMM_GRAPH ? GEMM_GRAPH : nw < 1 ? 1 : nw;
            const float us = T <= 256 ? gemm_graph_us(&c, nw, st) : -1;
            /* every product of the graph on the same weights, found in L2 after the first: what
             * any scheme that fetches a product's weights ahead of it could gain at most
             * (lm_head's do not fit) */
            const float us_l2 = T > 4 && T <= 256 && si < 4 ? gemm_graph_us(&c, 1, st) : -1;
            /* the same product by gemm_mma.cu (T > 4: gemv.cu's sizes stay there) */
            GemmCtx cm = c;
            cm.mma = 1;
            const float us_mma = T > 4 && T <= 256 ? gemm_graph_us(&cm, nw, st) : -1;
            cm.mma = 2;
            const float us_tma = tma && T > 4 && T <= 256 ? gemm_graph_us(&cm, nw, st) : -1;
            const float us_tma_l2 = us_tma > 0 && si < 4 ? gemm_graph_us(&cm, 1, st) : -1;
            printf("  %-8s T %5d  [%6d x %4d]  %8.4f ms  %7.1f TFLOP/s  %7.0f GB/s", names[si], T,
                   N, K, ms, 2.0 * T * N * K / (ms * 1e9), (double)N * K * 2 / (ms * 1e6));
            if (us > 0)
                printf(" | graph %7.2f us  %6.0f GB/s", us, (double)N * K * 2 / (us * 1e3));
            if (us_l2 > 0) printf(" | in L2 %7.2f us", us_l2);
            if (us_mma > 0)
                printf(" | mma %7.2f us  %6.0f GB/s  %6.1f TFLOP/s", us_mma,
                       (double)N * K * 2 / (us_mma * 1e3), 2.0 * T * N * K / (us_mma * 1e6));
            if (us_tma > 0)
                printf(" | tma %7.2f us  %6.0f GB/s  %6.1f TFLOP/s", us_tma,
                       (double)N * K * 2 / (us_tma * 1e3), 2.0 * T * N * K / (us_tma * 1e6));
            if (us_tma_l2 > 0) printf(" | tma in L2 %7.2f us", us_tma_l2);
            printf("\n");
        }
    gemm_destroy(g);
    cudaFree(ws), cudaFree(x), cudaFree(w), cudaFree(y);
    return 0;
}

/* gemm-algos: the decode-sized products with each of cuBLASLt's first GEMM_RANKS algorithms for
 * the shape (the heuristic's order), timed as a decode step runs them (gemm_graph_us). */
#define GEMM_RANKS 16
static int bench_gemm_algos(cudaStream_t st) {
    const int shapes[][2] = {
        {4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}, {151936, 1024}};
    const char *names[] = {"qkv", "o_proj", "gate_up", "down", "lm_head"};
    const int Ts[] = {8, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256};
    const int nT = (int)(sizeof Ts / sizeof Ts[0]);
    void *ws, *x, *w;
    float *y;
    BCHECK(cudaMalloc(&ws, 32 << 20));
    BCHECK(cudaMalloc(&x, (size_t)256 * 3072 * 2));
    BCHECK(cudaMalloc(&w, (size_t)151936 * 1024 * 2));
    BCHECK(cudaMalloc((void **)&y, (size_t)256 * 151936 * 4));
    fill_random_bf16(x, (size_t)256 * 3072);
    fill_random_bf16(w, (size_t)151936 * 1024);
    CudaGemm *g[GEMM_RANKS];
    for (int r = 0; r < GEMM_RANKS; r++) {
        BOK(gemm_create(&g[r], ws, 32 << 20));
        BOK(gemm_set_algo_rank(g[r], r));
        gemm_set_mma_max_t(g[r], 0); /* every product through cuBLASLt */
        gemm_set_tma_max_t(g[r], 0);
    }
    const int lm_all = cuda_env_flag("CVLLM_BENCH_GEMM_ALL", 0);
    printf("gemm-algos: cuBLASLt's first %d algorithms a decode-sized product (bf16 in, f32 out), "
           "%d in a CUDA graph, each its own weights: us a product\n",
           GEMM_RANKS, GEMM_GRAPH);
    for (int si = 0; si < 5; si++)
        for (int ti = 0; ti < nT; ti++) {
            const int T = Ts[ti], N = shapes[si][0], K = shapes[si][1];
            const int core = T == 8 || T == 16 || T == 32 || T == 64 || T == 128 || T == 256;
            if (!lm_all && si < 4 && !core)
                continue; /* every decode bucket for lm_head only (CVLLM_BENCH_GEMM_ALL=1: all) */
            int nw = (int)((size_t)151936 * 1024 / ((size_t)N * K));
            nw = nw > GEMM_GRAPH ? GEMM_GRAPH : nw < 1 ? 1 : nw;
            float first = -1, best = -1;
            int best_r = -1;
            for (int r = 0; r < GEMM_RANKS; r++) {
                GemmCtx c = {g[r], y, x, w, T, N, K, 0};
                if (gemm_launch(&c, st) != 0 || cudaStreamSynchronize(st) != cudaSuccess) {
                    cudaGetLastError();
                    break; /* fewer algorithms than r + 1 */
                }
                const float us = gemm_graph_us(&c, nw, st);
                char desc[160];
                gemm_algo_desc(g[r], T, N, K, N, DTYPE_BF16, desc, sizeof desc);
                printf("  %-8s T %4d  [%6d x %4d]  #%-2d %8.2f us  %6.0f GB/s  %s\n", names[si], T,
                       N, K, r, us, (double)N * K * 2 / (us * 1e3), desc);
                if (us > 0 && r == 0) first = us;
                if (us > 0 && (best < 0 || us < best)) best = us, best_r = r;
            }
            printf("  %-8s T %4d  best #%d %.2f us against #0 %.2f us (%.1f%%)\n", names[si], T,
                   best_r, best, first, first > 0 ? 100.0 * (first - best) / first : 0.0);
        }
    for (int r = 0; r < GEMM_RANKS; r++)
        gemm_destroy(g[r]);
    cudaFree(ws), cudaFree(x), cudaFree(w), cudaFree(y);
    return 0;
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    AttentionParams p;
    int parts, decode;
    void *ws;
} AttnCtx;
static int attn_launch(void *ctx, cudaStream_t st) {
    AttnCtx *c = ctx;
    return c->decode ? attention_decode_cuda(&c->p, c->parts, c->ws, st)
                     : attention_prefill_cuda(&c->p, st);
}

/* Does the cache's layout cost bandwidth? The decode kernel at batches from the middle of
 * bench.py's run (600 .. 1999 keys, bf16), the same bytes three ways: the cache as the backend
 * lays it out ([block][token][kv head][head_dim]: a kv head's key rows are 256-byte runs 2 KiB
 * apart), with each sequence's blocks scattered or consecutive; and as 8 times the sequences of
 * one kv head each (n_kv_heads 1, group 2: a block's rows of a head are one 4 KiB run, the layout
 * [block][kv head][token][head_dim] would give). Then the same bytes read as an fp8 cache (a kv
 * head's rows 128-byte runs 1 KiB apart, or one 2 KiB run a block). `tokens`: the cache's
 * capacity in token rows of every kv head. */
static void bench_attention_layout(const AttentionParams *base, void *k, void *v, void *ws,
                                   int64_t tokens, cudaStream_t st) {
    const int nkv = base->n_kv_heads, hd = base->hd, bs = base->block_size, Bmax = 256;
    const int mbs = 2048 / bs; /* table columns: contexts < 2000 */
    int32_t *dt = NULL, *dcu = NULL, *dctx = NULL;
    const size_t nseq = (size_t)Bmax * nkv;
    if (cudaMalloc((void **)&dt, nseq * mbs * 4) || cudaMalloc((void **)&dcu, (nseq + 1) * 4) ||
        cudaMalloc((void **)&dctx, nseq * 4)) {
        printf("layout probe: out of memory\n");
        cudaFree(dt), cudaFree(dcu), cudaFree(dctx);
        return;
    }
    int32_t *ht = xmalloc(nseq * mbs * 4), *hcu = xmalloc((nseq + 1) * 4),
            *hctx = xmalloc(nseq * 4);
    const int Bs[] = {64, 256};
    for (int f8 = 0; f8 < 2; f8++) /* the bf16 cache, then its bytes read as fp8 codes */
        for (int bm = 0; bm < 6; bm++) {
            const int bi = bm / 3, mode = bm % 3;
            if (bm == 0)
                printf("decode attention, the cache's layout (%s, contexts 600 .. 1999, one "
                       "partition):\n",
                       f8 ? "fp8 e4m3: a kv head's key rows 128-byte runs 1 KiB apart" : "bf16");
            /* mode 0: as laid out, blocks scattered; 1: consecutive; 2: one kv head a sequence */
            const int B = Bs[bi], per = mode == 2 ? nkv : 1, ns = B * per;
            const int64_t nblocks = tokens / bs / (mode == 2 ? 1 : nkv); /* blocks of this view */
            int64_t keys = 0;
            for (int i = 0; i < B; i++) {
                const int c = 600 + (int)(((int64_t)i * 2654435761u) % 1400);
                for (int h = 0; h < per; h++)
                    hctx[i * per + h] = c;
                keys += c;
            }
            for (int i = 0; i <= ns; i++)
                hcu[i] = i;
            for (int i = 0; i < ns; i++)
                for (int j = 0; j < mbs; j++) {
                    const int64_t n = (int64_t)i * mbs + j;
                    ht[n] = (int32_t)(mode == 1 ? n % nblocks : (n * 7919) % nblocks);
                }
            cudaMemcpy(dt, ht, (size_t)ns * mbs * 4, cudaMemcpyHostToDevice);
            cudaMemcpy(dcu, hcu, (size_t)(ns + 1) * 4, cudaMemcpyHostToDevice);
            cudaMemcpy(dctx, hctx, (size_t)ns * 4, cudaMemcpyHostToDevice);
            AttnCtx a = {.p = *base, .decode = 1, .ws = ws, .parts = 1};
            a.p.k_cache = k, a.p.v_cache = v;
            if (f8) a.p.kvdt = DTYPE_FP8_E4M3; /* the same bytes as twice the codes */
            a.p.block_tables = dt, a.p.cu_seqlens_q = dcu, a.p.context_lens = dctx;
            a.p.max_blocks_per_seq = mbs, a.p.num_seqs = ns, a.p.max_seqlen_k = 1999;
            a.p.cache_rows = mode == 2 ? tokens : tokens / nkv;
            if (mode == 2) a.p.n_kv_heads = 1, a.p.n_heads = base->n_heads / nkv;
            const float ms = time_ms(attn_launch, &a, st, 20);
            static const char *names[] = {"[block][token][head], scattered blocks",
                                          "[block][token][head], consecutive blocks",
                                          "one kv head a sequence ([block][head][token])"};
            printf("  B %3d  %-46s %8.4f ms  %7.0f GB/s\n", B, names[mode], ms,
                   2.0 * keys * nkv * hd * (f8 ? 1 : 2) / (ms * 1e6));
        }
    free(ht), free(hcu), free(hctx);
    cudaFree(dt), cudaFree(dcu), cudaFree(dctx);
}

static int bench_attention(int num_sms, cudaStream_t st) {
    /* a cache of 64 x 8192 tokens; up to 256 sequences (tables of random blocks) */
    const int nh = 16, nkv = 8, hd = 128, bs = 16, Cmax = 8192, Bmax = 256;
    const int nblocks = 64 * Cmax / bs;
    void *k, *v, *q, *out, *ws;
    int32_t *tables, *cu, *ctx;
    const size_t cache = (size_t)nblocks * bs * nkv * hd;
    BCHECK(cudaMalloc(&k, cache * 2));
    BCHECK(cudaMalloc(&v, cache * 2));
    BCHECK(cudaMalloc(&q, (size_t)Cmax * (nh + 2 * nkv) * hd * 4));
    BCHECK(cudaMalloc(&out, (size_t)Cmax * nh * hd * 2));
    BCHECK(cudaMalloc(&ws, (size_t)(Bmax + 4 * num_sms) * nh * (hd + 2) * 4 * 2));
    fill_random_bf16(k, cache);
    fill_random_bf16(v, cache);
    cudaMemset(q, 0, (size_t)Cmax * (nh + 2 * nkv) * hd * 4);
    int32_t *ht = xmalloc((size_t)Bmax * (Cmax / bs) * 4), hcu[Bmax + 1], hctx[Bmax];
    for (int i = 0; i < Bmax * (Cmax / bs); i++)
        ht[i] = (int32_t)(((int64_t)i * 7919) % nblocks);
    BCHECK(cudaMalloc((void **)&tables, (size_t)Bmax * (Cmax / bs) * 4));
    BCHECK(cudaMalloc((void **)&cu, (Bmax + 1) * 4));
    BCHECK(cudaMalloc((void **)&ctx, Bmax * 4));
    int32_t *order;
    BCHECK(cudaMalloc((void **)&order, Bmax * 4));
    int32_t ht0[Cmax / bs]; /* one sequence's table (prefill) */
    memcpy(ht0, ht, sizeof ht0);
    /* C = 0: mixed contexts, 100 .. 8191 keys (256 sequences: 100 .. 2047, bench.py's spread; a
     * batch in flight, where a long context whose blocks start late is the tail). C = -1: a
     * batch in the middle of bench.py's run (600 .. 1999 keys), longest first, with the
     * partitions a decode graph captured for 4096 tokens chooses. Each case fills the tables
     * itself (below). */
    const int Bs[] = {1, 16, 32, 64, 128, 256}, Cs[] = {512, 2048, 8192, 0, -1};
    /* what every case shares (a bf16 cache, one query a sequence; the cases set the rest) */
    const AttentionParams base = {.q = q,
                                  .ldq = (nh + 2 * nkv) * hd,
                                  .out = out,
                                  .adt = DTYPE_BF16,
                                  .k_cache = k,
                                  .v_cache = v,
                                  .cache_rows = (int64_t)nblocks * bs,
                                  .kvdt = DTYPE_BF16,
                                  .k_scale = 1.0f,
                                  .v_scale = 1.0f,
                                  .n_heads = nh,
                                  .n_kv_heads = nkv,
                                  .hd = hd,
                                  .block_size = bs,
                                  .scale = 0.088f,
                                  .cu_seqlens_q = cu,
                                  .context_lens = ctx,
                                  .block_tables = tables,
                                  .max_blocks_per_seq = Cmax / bs,
                                  .max_seqlen_q = 1};
    for (int f8 = 0; f8 < 2; f8++) { /* the bf16 cache, then the same bytes read as fp8 */
        const int es = f8 ? 1 : 2;
        printf(
            "decode attention (16 heads / 8 kv heads, head_dim 128, %s cache, block 16): ms, GB/s "
            "of K+V (context: each sequence's, or the mean of mixed ones)\n",
            f8 ? "fp8 e4m3" : "bf16");
        for (int bi = 0; bi < 6; bi++)
            for (int ci = 0; ci < 5; ci++) {
                const int B = Bs[bi], mid = Cs[ci] < 0;
                if ((Cs[ci] <= 0 && B == 1) || (B == 256 && Cs[ci] > 512) ||
                    ((B == 32 || B == 128) && !mid))
                    continue;
                const int span = mid ? 1400 : B == 256 ? 1948 : 8092, c0 = mid ? 600 : 100;
                int64_t keys = 0;
                for (int i = 0; i <= B; i++)
                    hcu[i] = i;
                for (int i = 0; i < B; i++)
                    keys += hctx[i] =
                        Cs[ci] > 0 ? Cs[ci] : c0 + (int)(((int64_t)i * 2654435761u) % span);
                const int C = (int)(keys / B); /* the mean */
                int maxc = 0;
                for (int i = 0; i < B; i++)
                    maxc = hctx[i] > maxc ? hctx[i] : maxc;
                /* every sequence its own cache blocks, scattered (as a real batch's: two
                 * sequences sharing blocks would read each other's K/V from L2) */
                const int mb = (maxc + bs - 1) / bs;
                if ((int64_t)B * mb > nblocks) continue;
                for (int i = 0; i < B; i++)
                    for (int j = 0; j < mb; j++)
                        ht[(size_t)i * (Cmax / bs) + j] =
                            (int32_t)(((int64_t)(i * mb + j) * 7919) % nblocks);
                cudaMemcpy(tables, ht, (size_t)B * (Cmax / bs) * 4, cudaMemcpyHostToDevice);
                cudaMemcpy(cu, hcu, (B + 1) * 4, cudaMemcpyHostToDevice);
                cudaMemcpy(ctx, hctx, B * 4, cudaMemcpyHostToDevice);
                AttnCtx a = {.p = base, .decode = 1, .ws = ws};
                a.p.kvdt = f8 ? DTYPE_FP8_E4M3 : DTYPE_BF16;
                a.p.num_seqs = B;
                a.p.max_seqlen_k = maxc;
                AttentionParams graph = a.p; /* mid: as a graph captured for 4096 tokens */
                if (mid) graph.max_seqlen_k = 4096;
                a.parts = attention_decode_num_parts(&graph, num_sms);
                float ms = 0;
                if (!mid) {
                    ms = time_ms(attn_launch, &a, st, 20);
                    printf("  B %3d  context %5d  parts %2d  %8.4f ms  %7.0f GB/s\n", B, C,
                           a.parts, ms, 2.0 * B * C * nkv * hd * es / (ms * 1e6));
                }
                if (Cs[ci] <= 0) { /* mixed: the backend's launch order, longest context first */
                    int32_t ord[Bmax];
                    uint64_t keys[Bmax];
                    attention_decode_order(hctx, B, keys, ord);
                    cudaMemcpy(order, ord, B * 4, cudaMemcpyHostToDevice);
                    a.p.seq_order = order;
                    ms = time_ms(attn_launch, &a, st, 20);
                    printf("  B %3d  context %5d  parts %2d  %8.4f ms  %7.0f GB/s  longest first\n",
                           B, C, a.parts, ms, 2.0 * B * C * nkv * hd * es / (ms * 1e6));
                    attention_decode_fold(ord, B, 0, (int32_t *)keys);
                    cudaMemcpy(order, ord, B * 4, cudaMemcpyHostToDevice);
                    ms = time_ms(attn_launch, &a, st, 20);
                    printf("  B %3d  context %5d  parts %2d  %8.4f ms  %7.0f GB/s  folded\n", B,
                           C, a.parts, ms, 2.0 * B * C * nkv * hd * es / (ms * 1e6));
                    a.p.seq_order = NULL;
                }
            }
    }
    bench_attention_layout(&base, k, v, ws, (int64_t)nblocks * bs * nkv, st);
    printf("prefill attention (one sequence, causal, same heads): ms, TFLOP/s\n");
    cudaMemcpy(tables, ht0, (size_t)(Cmax / bs) * 4, cudaMemcpyHostToDevice);
    const int Ps[] = {512, 2048, 8192};
    for (int pi = 0; pi < 3; pi++) {
        const int P = Ps[pi];
        hcu[0] = 0, hcu[1] = P, hctx[0] = P;
        cudaMemcpy(cu, hcu, 2 * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(ctx, hctx, 4, cudaMemcpyHostToDevice);
        AttnCtx a = {.p = base, .decode = 0};
        a.p.num_seqs = 1;
        a.p.max_seqlen_q = a.p.max_seqlen_k = P;
        float ms = time_ms(attn_launch, &a, st, 5);
        printf("  tokens %5d  %8.3f ms  %6.2f TFLOP/s\n", P, ms,
               4.0 * nh * hd * (double)P * P / 2 / (ms * 1e9));
    }
    free(ht);
    cudaFree(k), cudaFree(v), cudaFree(q), cudaFree(out), cudaFree(ws), cudaFree(tables),
        cudaFree(cu), cudaFree(ctx), cudaFree(order);
    return 0;
}

/* ---------------------------------------------------------------- a whole decode step */

static const char *QWEN3_06B =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 151936, \"hidden_size\": 1024,"
    " \"intermediate_size\": 3072, \"num_hidden_layers\": 28, \"num_attention_heads\": 16,"
    " \"num_key_value_heads\": 8, \"head_dim\": 128, \"rms_norm_eps\": 1e-6, \"rope_theta\": "
    "1000000,"
    " \"max_position_embeddings\": 40960, \"tie_word_embeddings\": true, \"torch_dtype\": "
    "\"bfloat16\"}";

static int bench_decode(void) {
    ModelConfig cfg;
    BOK(config_parse(QWEN3_06B, NULL, &cfg));
    const int H = cfg.hidden_size, I = cfg.intermediate_size, L = cfg.num_hidden_layers;
    const size_t big = (size_t)cfg.vocab_size * H;
    uint16_t *buf = xmalloc(big * 2), *ones = xmalloc((size_t)I * 2);
    uint64_t s = 0x853C49E6748FEA9Bull;
    for (size_t i = 0; i < big; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        buf[i] = f32_to_bf16(((float)(s >> 40) / 16777216.0f - 0.5f) * 0.1f);
    }
    for (int i = 0; i < I; i++)
        ones[i] = f32_to_bf16(1.0f);
    ModelWeights w = {0};
    w.layers = xcalloc((size_t)L, sizeof(LayerWeights));
#define T2(r, c) ((Tensor){buf, DTYPE_BF16, (r), (c)})
#define V1(n) ((Tensor){ones, DTYPE_BF16, 1, (n)})
    w.embed_tokens = w.lm_head = T2(cfg.vocab_size, H);
    w.norm = V1(H);
    const int qd = cfg.num_attention_heads * cfg.head_dim,
              kvd = cfg.num_key_value_heads * cfg.head_dim;
    for (int l = 0; l < L; l++) {
        LayerWeights *lw = &w.layers[l];
        lw->input_layernorm = lw->post_attention_layernorm = V1(H);
        lw->q_norm = lw->k_norm = V1(cfg.head_dim);
        lw->q_proj = T2(qd, H), lw->k_proj = lw->v_proj = T2(kvd, H), lw->o_proj = T2(H, qd);
        lw->gate_proj = lw->up_proj = T2(I, H), lw->down_proj = T2(H, I);
    }
    const int C = 512, bs = 16, Bs[] = {1, 8, 16, 64, 128, 256};
    printf("decode step, synthetic qwen3-0.6b (bf16, tied lm_head), context %d, sampling greedy "
           "included: ms per step, tokens/s\n",
           C);
    for (int eager = 0; eager < 2; eager++) {
        BackendOptions o = {.max_num_tokens = 2048,
                            .max_num_seqs = 256,
                            .max_model_len = 4096,
                            .block_size = bs,
                            .enforce_eager = eager,
                            .tp_size = 1,
                            .verbose = 1};
        const BackendEntry *be = backend_find("cuda");
        Backend *b;
        double t0 = now_seconds();
        BOK(be->create(&cfg, &w, &o, &b));
        const int nb = 256 * (C / bs + 1);
        KVCacheSpec spec = {.num_blocks = nb, .block_size = bs, .dtype = DTYPE_BF16};
        b->kv_budget_bytes(b);
        BOK(b->init_kv_cache(b, &spec));
        BOK(b->warmup(b));
        printf("  %s: start-up (upload, warm-up, KV, graphs) %.2f s\n", eager ? "eager" : "graphs",
               now_seconds() - t0);
        for (int bi = 0; bi < 6; bi++) {
            const int B = Bs[bi], mb = C / bs + 1;
            int32_t *ids = xcalloc(B, 4), *pos = xmalloc(B * 4), *cu = xmalloc((B + 1) * 4),
                    *ctx = xmalloc(B * 4), *tab = xmalloc((size_t)B * mb * 4), *li = xmalloc(B * 4);
            int64_t *slot = xmalloc(B * 8);
            SamplingRow *rows = xcalloc(B, sizeof *rows);
            for (int i = 0; i < B; i++) {
                pos[i] = C - 1, cu[i] = i, ctx[i] = C, li[i] = i;
                for (int j = 0; j < mb; j++)
                    tab[i * mb + j] = i * mb + j;
                slot[i] = (int64_t)tab[i * mb + (C - 1) / bs] * bs + (C - 1) % bs;
                rows[i] = (SamplingRow){
                    .temperature = 0, .top_p = 1, .repetition_penalty = 1, .num_logprobs = -1};
            }
            cu[B] = B;
            StepInputs in = {.num_tokens = B,
                             .num_seqs = B,
                             .input_ids = ids,
                             .positions = pos,
                             .slot_mapping = slot,
                             .cu_seqlens_q = cu,
                             .cu_seqlens_k = NULL,
                             .max_seqlen_q = 1,
                             .max_seqlen_k = C,
                             .context_lens = ctx,
                             .block_tables = tab,
                             .max_blocks_per_seq = mb,
                             .logits_indices = li,
                             .num_logits = B,
                             .sampling = rows};
            int32_t *cuk = xmalloc((B + 1) * 4);
            for (int i = 0; i <= B; i++)
                cuk[i] = i * C;
            in.cu_seqlens_k = cuk;
            int32_t *tok = xmalloc(B * 4);
            StepOutputs out = {.token_ids = tok};
            for (int i = 0; i < 3; i++)
                BOK(b->forward(b, &in, &out));
            const int reps = 30;
            float *t = xmalloc(reps * sizeof(float));
            for (int i = 0; i < reps; i++) {
                double a = now_seconds();
                BOK(b->forward(b, &in, &out));
                t[i] = (float)((now_seconds() - a) * 1e3);
            }
            qsort(t, reps, sizeof(float), cmp_float);
            printf("    B %3d  %7.3f ms  %8.0f tokens/s\n", B, t[reps / 2], B * 1e3 / t[reps / 2]);
            free(ids), free(pos), free(cu), free(ctx), free(tab), free(li), free(slot), free(rows),
                free(cuk), free(tok), free(t);
        }
        b->destroy(b);
    }
    free(w.layers), free(buf), free(ones);
    return 0;
}

/* ---------------------------------------------------------------- the sampler alone */

typedef struct {
    const void *logits;
    DType ldt;
    const CudaSamplingRow *rows;
    const int32_t *ids;
    int32_t *tok;
    float *lp;
    int32_t *top;
    float *tlp;
    void *scratch;
    int n, V;
    const CudaSamplingRow *hrows; /* NULL: the one-block kernel whatever the rows */
} SamplerCtx;
static int sampler_launch(void *ctx, cudaStream_t st) {
    SamplerCtx *c = ctx;
    return sampler_cuda(c->logits, c->ldt, c->n, c->V, c->rows, c->hrows, c->ids, c->tok, c->lp,
                        c->top, c->tlp, c->scratch, st);
}

/* sampler_cuda on 256, 128, 64, 8 and 1 rows of 151,936 random logits (Qwen3's vocabulary), f32
 * and bf16: greedy, and temperature 0.6 alone (no top-k / top-p / min-p / penalties / log-probs);
 * the one-block kernel, the race kernel the engine takes there, the choice without it
 * (CVLLM_CUDA_SAMPLER=norace) and the in-place cluster kernel (=cluster, up to 16 rows) */
static int bench_sampler(cudaStream_t st) {
    const int n = 256, V = 151936;
    const size_t nl = (size_t)n * V;
    float *h = xmalloc(nl * 4);
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < nl; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = ((float)(s >> 40) / 16777216.0f - 0.5f) * 20.0f; /* uniform in [-10, 10) */
    }
    float *logits, *lp, *tlp;
    int32_t *ids, *tok, *top;
    CudaSamplingRow *rows;
    void *scratch;
    BCHECK(cudaMalloc((void **)&logits, nl * 4));
    BCHECK(cudaMalloc((void **)&rows, n * sizeof *rows));
    BCHECK(cudaMalloc((void **)&ids, 4));
    BCHECK(cudaMalloc((void **)&tok, n * 4));
    BCHECK(cudaMalloc((void **)&lp, n * 4));
    BCHECK(cudaMalloc((void **)&top, (size_t)n * CUDA_SAMPLER_MAX_LOGPROBS * 4));
    BCHECK(cudaMalloc((void **)&tlp, (size_t)n * CUDA_SAMPLER_MAX_LOGPROBS * 4));
    BCHECK(cudaMalloc(&scratch, sampler_cuda_scratch_bytes(n, V)));
    BCHECK(cudaMemset(scratch, 0, sampler_cuda_scratch_bytes(n, V)));
    BCHECK(cudaMemcpy(logits, h, nl * 4, cudaMemcpyHostToDevice));
    uint16_t *hb = xmalloc(nl * 2); /* the same values rounded to bf16 (none is NaN) */
    for (size_t i = 0; i < nl; i++) {
        uint32_t u;
        memcpy(&u, &h[i], 4);
        hb[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    }
    void *logits16;
    BCHECK(cudaMalloc(&logits16, nl * 2));
    BCHECK(cudaMemcpy(logits16, hb, nl * 2, cudaMemcpyHostToDevice));
    free(h), free(hb);
    CudaSamplingRow *hr = xcalloc(n, sizeof *hr);
    printf("sampler (rows x %d logits, no top-k / top-p / min-p / penalties / log-probs): "
           "ms per call\n",
           V);
    const float temps[] = {0.0f, 0.6f};
    const int ns[] = {256, 128, 64, 8, 1};
    for (int ni = 0; ni < 5; ni++)
        for (int ti = 0; ti < 2; ti++) {
            const int m = ns[ni];
            for (int i = 0; i < m; i++)
                hr[i] = (CudaSamplingRow){.temperature = temps[ti],
                                          .top_p = 1,
                                          .repetition_penalty = 1,
                                          .num_logprobs = -1,
                                          .seed = 1234,
                                          .draw_index = (uint64_t)i};
            BCHECK(cudaMemcpy(rows, hr, m * sizeof *hr, cudaMemcpyHostToDevice));
            /* the one-block kernel (no host rows), the engine's choice (the race kernel), the
             * choice without it (CVLLM_CUDA_SAMPLER=norace: the staged cluster kernel within a
             * wave, else the one-block kernel), the in-place cluster kernel (up to 16 rows) */
            static const char *const kname[4] = {"block", "race", "norace", "in-place"};
            static const char *const kenv[4] = {NULL, NULL, "norace", "cluster"};
            for (int bf = 0; bf < 2; bf++)
                for (int kind = 0; kind < (m <= 16 ? 4 : 3); kind++) {
                    SamplerCtx c = {bf ? logits16 : (const void *)logits,
                                    bf ? DTYPE_BF16 : DTYPE_F32,
                                    rows, ids, tok, lp, top, tlp, scratch, m, V, kind ? hr : NULL};
                    if (kenv[kind]) setenv("CVLLM_CUDA_SAMPLER", kenv[kind], 1);
                    float ms = time_ms(sampler_launch, &c, st, 20);
                    unsetenv("CVLLM_CUDA_SAMPLER");
                    printf("  rows %3d  temperature %.1f  %-4s %-8s %8.4f ms  %7.0f GB/s of "
                           "logits read once\n",
                           m, temps[ti], bf ? "bf16" : "f32", kname[kind], ms,
                           (double)m * V * (bf ? 2 : 4) / (ms * 1e6));
                }
        }
    free(hr);
    cudaFree(logits), cudaFree(logits16), cudaFree(rows), cudaFree(ids), cudaFree(tok),
        cudaFree(lp), cudaFree(top), cudaFree(tlp), cudaFree(scratch);
    return 0;
}

int bench_cuda_ops(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "all";
    char desc[256];
    const BackendEntry *be = backend_find("cuda");
    if (!be || !be->probe(desc, sizeof desc)) {
        fprintf(stderr, "cvllm bench ops --device cuda: %s\n", be ? desc : "not compiled in");
        return 1;
    }
    printf("%s\n", desc);
    struct cudaDeviceProp p;
    BCHECK(cudaGetDeviceProperties(&p, 0));
    cudaStream_t st;
    BCHECK(cudaStreamCreate(&st));
    int rc = 0, any = 0;
    if (!strcmp(what, "all") || !strcmp(what, "gemm")) any = 1, rc |= bench_gemm(st);
    if (!strcmp(what, "gemm-algos")) any = 1, rc |= bench_gemm_algos(st);
    if (!strcmp(what, "all") || !strcmp(what, "attention"))
        any = 1, rc |= bench_attention(p.multiProcessorCount, st);
    if (!strcmp(what, "all") || !strcmp(what, "decode")) any = 1, rc |= bench_decode();
    if (!strcmp(what, "all") || !strcmp(what, "sampler")) any = 1, rc |= bench_sampler(st);
    cudaStreamDestroy(st);
    if (!any) {
        fprintf(stderr,
                "usage: cvllm bench ops --device cuda "
                "[gemm|gemm-algos|attention|decode|sampler|all]\n");
        return 2;
    }
    return rc;
}
