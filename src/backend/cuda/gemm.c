/* gemm.c: the matrix products through cuBLASLt. y[T, N] = x[T, K] @ W[N, K]^T, all row-major. In
 * cuBLAS's column-major terms the same memory holds W as A (K x N, lda = K), x as B (K x T,
 * ldb = K) and y as D (N x T, ldd = ldy), and the product is D = A^T * B: the "TN" layout.
 * Inputs in the activation dtype (bf16 / f16 on the tensor cores; f32 with CUBLAS_COMPUTE_32F,
 * never TF32), accumulation in f32, output in f32 (gemm_cuda), in the inputs' dtype
 * (gemm_cuda_to: the f32 sums rounded once) or added to an f32 y (gemm_cuda_acc: beta 1, y as
 * cuBLASLt's C and D). CPU twin: matmul_cpu (ops.c).
 *
 * A plan (descriptors + the heuristic's algorithm) is made once per shape and kept in a small
 * table, so that a step (and a CUDA graph capture) only calls cublasLtMatmul. The workspace is the
 * caller's: no allocation happens in a product. gemm_set_algo_rank takes another of the
 * heuristic's algorithms (`bench ops gemm-algos`: none is faster by more than a few percent at
 * decode sizes, H100 2026-11-25). */
#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/kernels.h"
#include "common.h"

#define GEMM_MAX_PLANS 64
#define GEMM_MAX_ALGOS 32

typedef struct {
    int T, N, K;
    int64_t ldy;
    DType adt, ydt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

struct CudaGemm {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    GemmPlan plans[GEMM_MAX_PLANS];
    int num_plans, next_evict;
    int algo_rank; /* gemm_set_algo_rank: the heuristic's algorithm taken (0: its first) */
    int mma_max_t; /* gemm_set_mma_max_t: the largest T that goes to gemm_mma.cu (0: none) */
    int tma_max_t; /* gemm_set_tma_max_t: the largest T that goes to gemm_tma.cu (0: none) */
};

static int lt_error(cublasStatus_t st, int line, const char *what) {
    return cvllm_errorf(CVLLM_EBACKEND, "cuda backend: gemm.c:%d: %s: cuBLASLt status %d (%s)",
                        line, what, (int)st, cublasLtGetStatusString(st));
}
#define LT_TRY(call)                                                                               \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) return lt_error(st_, __LINE__, #call);                   \
    } while (0)

/* CVLLM_CUDA_MMA_MAX_T: the largest T whose products with N <= K (o and down: few tiles of y,
 * long rows of W, split over clusters) go to gemm_mma.cu (default MMA_MAX_T_DEFAULT; 0: none,
 * every product above the GEMV's sizes to cuBLASLt) */
#define MMA_MAX_T_DEFAULT 16
static int mma_max_t_default(void) {
    const char *e = getenv("CVLLM_CUDA_MMA_MAX_T");
    const int v = e && *e ? atoi(e) : MMA_MAX_T_DEFAULT;
    return v < 0 ? 0 : v;
}

/* CVLLM_CUDA_TMA_MAX_T: the largest T whose products with N <= K (o and down: few tiles of y,
 * long rows of W, split over clusters) go to gemm_tma.cu where gemv.cu and gemm_mma.cu do not take
 * them, on a 9.0 device (default TMA_MAX_T_DEFAULT; 0: none). H200, qwen3-0.6b, o and down of
 * 17-64 tokens there: 24 x 512/512 +3.5%, 48 x 512/512 +1.7%, the fp8 default workload +0.4%;
 * every product of up to 64 tokens there (CVLLM_CUDA_TMA_WIDE=1): -0.6% (docs/BENCHMARKS.md,
 * round 26). */
#define TMA_MAX_T_DEFAULT 64
static int tma_max_t_default(void) {
    const char *e = getenv("CVLLM_CUDA_TMA_MAX_T");
    const int v = e && *e ? atoi(e) : TMA_MAX_T_DEFAULT;
    return v < 0 ? 0 : v;
}

int gemm_create(CudaGemm **out, void *d_ws, size_t ws_bytes) {
    *out = NULL;
    CudaGemm *g = xcalloc(1, sizeof *g);
    cublasStatus_t st = cublasLtCreate(&g->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return lt_error(st, __LINE__, "cublasLtCreate");
    }
    g->ws = d_ws;
    g->ws_bytes = ws_bytes;
    g->mma_max_t = mma_max_t_default();
    g->tma_max_t = tma_max_t_default();
    *out = g;
    return 0;
}

int gemm_set_algo_rank(CudaGemm *g, int rank) {
    if (rank < 0 || rank >= GEMM_MAX_ALGOS)
        return cvllm_errorf(CVLLM_EINVAL, "cuda backend: gemm algorithm rank %d not in 0..%d",
                            rank, GEMM_MAX_ALGOS - 1);
    g->algo_rank = rank;
    return 0;
}

void gemm_set_mma_max_t(CudaGemm *g, int max_t) {
    g->mma_max_t = max_t < 0 ? 0 : max_t;
}

void gemm_set_tma_max_t(CudaGemm *g, int max_t) {
    g->tma_max_t = max_t < 0 ? 0 : max_t;
}

static void plan_free(GemmPlan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->d) cublasLtMatrixLayoutDestroy(p->d);
    memset(p, 0, sizeof *p);
}

void gemm_destroy(CudaGemm *g) {
    if (!g) return;
    for (int i = 0; i < g->num_plans; i++)
        plan_free(&g->plans[i]);
    cublasLtDestroy(g->lt);
    free(g);
}

static cudaDataType_t cuda_type(DType dt) {
    return dt == DTYPE_BF16 ? CUDA_R_16BF : dt == DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* CVLLM_CUDA_LMHEAD_RANKS (measuring): "T:rank,T:rank,..." (T increasing): a product with a
 * vocabulary-sized N (more than LMHEAD_MIN_N rows of W) and T tokens takes the heuristic's
 * algorithm of the rank listed for the first T' >= T (none: the rank of gemm_set_algo_rank). */
#define LMHEAD_MIN_N 32768
static int lmhead_rank(int T, int dflt) {
    const char *e = getenv("CVLLM_CUDA_LMHEAD_RANKS");
    for (const char *p = e; p && *p;) {
        int t = 0, r = 0, n = 0;
        if (sscanf(p, "%d:%d%n", &t, &r, &n) != 2) break;
        if (T <= t) return r >= 0 && r < GEMM_MAX_ALGOS ? r : dflt;
        p += n;
        if (*p == ',') p++;
    }
    return dflt;
}

static int plan_make(CudaGemm *g, GemmPlan *p, int T, int N, int K, int64_t ldy, DType adt,
                     DType ydt) {
    const int rank = N > LMHEAD_MIN_N ? lmhead_rank(T, g->algo_rank) : g->algo_rank;
    memset(p, 0, sizeof *p);
    p->T = T, p->N = N, p->K = K, p->ldy = ldy, p->adt = adt, p->ydt = ydt;
    const cudaDataType_t in = cuda_type(adt);
    const cublasComputeType_t ct = CUBLAS_COMPUTE_32F; /* f32 inputs: exact f32, no TF32 */
    LT_TRY(cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->a, in, K, N, K));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->b, in, K, T, K));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->d, cuda_type(ydt), N, T, ldy));
    cublasLtMatmulPreference_t pref;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->ws_bytes, sizeof g->ws_bytes);
    cublasLtMatmulHeuristicResult_t res[GEMM_MAX_ALGOS];
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->a, p->b, p->d, p->d, pref,
                                            rank + 1, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS)
        return lt_error(st, __LINE__, "cublasLtMatmulAlgoGetHeuristic");
    if (found <= rank)
        return cvllm_errorf(
            CVLLM_EBACKEND,
            "cuda backend: cuBLASLt has %d algorithm(s) for a %s [%d, %d] x [%d, %d]^T "
            "product%s",
            found, dtype_name(adt), T, K, N, K,
            rank ? " (a rank past the first: gemm_set_algo_rank or CVLLM_CUDA_LMHEAD_RANKS)" : "");
    p->algo = res[rank].algo;
    return 0;
}

/* CVLLM_CUDA_GEMV_MAX_T: the largest T that goes to gemv.cu (default 4; 0: none, up to 8). */
static int gemv_max_t(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("CVLLM_CUDA_GEMV_MAX_T");
        v = e && *e ? atoi(e) : 4;
        if (v < 0) v = 0;
        if (v > 8) v = 8;
    }
    return v;
}

/* y (of ydt) = x W^T, or with acc (f32 y) y += x W^T: cuBLASLt's D = A^T B + beta C with C = D */
static int gemm_run(CudaGemm *g, void *d_y, DType ydt, int acc, int64_t ldy, const void *d_x,
                    const void *d_w, DType adt, int T, int N, int K, cudaStream_t stream) {
    if (T <= 0) return 0;
    if (ydt != DTYPE_F32 && ydt != adt)
        return cvllm_errorf(CVLLM_EINVAL, "cuda gemm: a %s product cannot write %s",
                            dtype_name(adt), dtype_name(ydt));
    if (T <= gemv_max_t() && gemv_cuda_supported(adt, T, K, d_x, d_w))
        return gemv_cuda_out(d_y, ydt, acc, ldy, d_x, d_w, adt, T, N, K, stream);
    static int wide = -1; /* CVLLM_CUDA_MMA_WIDE=1: products with N > K too (measuring) */
    if (wide < 0) wide = cuda_env_flag("CVLLM_CUDA_MMA_WIDE", 0);
    if (T <= g->mma_max_t && (N <= K || (wide && N <= 16384)) &&
        gemm_mma_supported(adt, T, K, d_x, d_w))
        return gemm_mma_cuda(d_y, ydt, acc, ldy, d_x, d_w, adt, T, N, K, stream);
    static int tma_wide = -1; /* CVLLM_CUDA_TMA_WIDE=1: products with N > K too (measuring) */
    if (tma_wide < 0) tma_wide = cuda_env_flag("CVLLM_CUDA_TMA_WIDE", 0);
    if (T <= g->tma_max_t && (N <= K || tma_wide) && gemm_tma_supported(adt, T, K, d_x, d_w))
        return gemm_tma_cuda(d_y, ydt, acc, ldy, d_x, d_w, adt, T, N, K, stream);
    GemmPlan *p = NULL;
    for (int i = 0; i < g->num_plans; i++) {
        GemmPlan *q = &g->plans[i];
        if (q->T == T && q->N == N && q->K == K && q->ldy == ldy && q->adt == adt &&
            q->ydt == ydt) {
            p = q;
            break;
        }
    }
    if (!p) {
        if (g->num_plans < GEMM_MAX_PLANS) {
            p = &g->plans[g->num_plans++];
        } else { /* many prefill sizes: reuse the slots in turn */
            p = &g->plans[g->next_evict];
            g->next_evict = (g->next_evict + 1) % GEMM_MAX_PLANS;
            plan_free(p);
        }
        int rc = plan_make(g, p, T, N, K, ldy, adt, ydt);
        if (rc) {
            plan_free(p);
            return rc;
        }
    }
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    LT_TRY(cublasLtMatmul(g->lt, p->op, &alpha, d_w, p->a, d_x, p->b, &beta, d_y, p->d, d_y, p->d,
                          &p->algo, g->ws, g->ws_bytes, stream));
    return 0;
}

int gemm_cuda(CudaGemm *g, float *d_y, int64_t ldy, const void *d_x, const void *d_w, DType adt,
              int T, int N, int K, cudaStream_t stream) {
    return gemm_run(g, d_y, DTYPE_F32, 0, ldy, d_x, d_w, adt, T, N, K, stream);
}

int gemm_cuda_to(CudaGemm *g, void *d_y, DType ydt, int64_t ldy, const void *d_x, const void *d_w,
                 DType adt, int T, int N, int K, cudaStream_t stream) {
    return gemm_run(g, d_y, ydt, 0, ldy, d_x, d_w, adt, T, N, K, stream);
}

int gemm_cuda_acc(CudaGemm *g, float *d_y, int64_t ldy, const void *d_x, const void *d_w,
                  DType adt, int T, int N, int K, cudaStream_t stream) {
    return gemm_run(g, d_y, DTYPE_F32, 1, ldy, d_x, d_w, adt, T, N, K, stream);
}

int gemm_algo_desc(CudaGemm *g, int T, int N, int K, int64_t ldy, DType adt, char *buf, size_t n) {
    for (int i = 0; i < g->num_plans; i++) {
        GemmPlan *q = &g->plans[i];
        if (q->T != T || q->N != N || q->K != K || q->ldy != ldy || q->adt != adt ||
            q->ydt != DTYPE_F32)
            continue;
        int id = -1, tile = -1, splitk = -1, stages = -1, swz = -1, cluster = -1;
        size_t w;
        cublasLtMatmulAlgoConfigGetAttribute(&q->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&q->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                             sizeof tile, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&q->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                             sizeof splitk, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&q->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                             sizeof stages, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&q->algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz,
                                             sizeof swz, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&q->algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                             &cluster, sizeof cluster, &w);
        snprintf(buf, n, "algo %d tile %d splitk %d stages %d swizzle %d cluster %d", id, tile,
                 splitk, stages, swz, cluster);
        return 0;
    }
    snprintf(buf, n, "(no plan)");
    return -1;
}
