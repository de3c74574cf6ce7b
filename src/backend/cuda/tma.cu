/* tma.cu: the tensor maps of the copy engine's 2-D tiles (tma.cuh), encoded by the driver's
 * cuTensorMapEncodeTiled, found through the runtime (no link to the driver library), and kept in
 * one hash table for the process (engines on several threads may launch at once: a mutex). */
#include <pthread.h>
#include <string.h>

#include "backend/cuda/cuda_util.cuh"
#include "backend/cuda/tma.cuh"

typedef CUresult (*EncodeTiledFn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                  const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                  const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* a decode step's maps: 2 x layers K / V caches, 4 x layers weights, a few activations a batch
 * size. The table is open-addressed by a hash of the key (TMA_SLOTS slots, at most TMA_MAPS
 * entries in it); once full it is emptied, and every map is encoded again when next asked for
 * (callers keep copies, never pointers into it). */
#define TMA_MAPS 1024
#define TMA_SLOTS 2048 /* a power of two, twice TMA_MAPS: probes stay short */
#define TMA_ROWB 128   /* bytes of a box row: the 128-byte swizzle's span */

typedef struct {
    const void *base; /* NULL: an empty slot */
    int64_t rows, cols;
    DType dt;
    int box_rows;
    CUtensorMap map;
} MapEntry;

static uint64_t map_hash(const void *base, int64_t rows, int64_t cols, DType dt, int box_rows) {
    uint64_t h = (uint64_t)(uintptr_t)base;
    const uint64_t parts[4] = {(uint64_t)rows, (uint64_t)cols, (uint64_t)dt, (uint64_t)box_rows};
    for (int i = 0; i < 4; i++)
        h = (h ^ parts[i]) * 0x100000001b3ull + (h >> 29);
    return h ^ (h >> 32);
}

static int map_locked(CUtensorMap *out, const void *base, int64_t rows, int64_t cols, DType dt,
                      int box_rows) {
    static MapEntry table[TMA_SLOTS];
    static int n = 0;
    static EncodeTiledFn encode = NULL;
    uint32_t i = (uint32_t)map_hash(base, rows, cols, dt, box_rows) & (TMA_SLOTS - 1);
    for (; table[i].base; i = (i + 1) & (TMA_SLOTS - 1))
        if (table[i].base == base && table[i].rows == rows && table[i].cols == cols &&
            table[i].dt == dt && table[i].box_rows == box_rows) {
            *out = table[i].map;
            return 0;
        }
    if (!encode) {
        cudaDriverEntryPointQueryResult q;
        void *fn = NULL;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !fn)
            return cvllm_errorf(CVLLM_EBACKEND, "cuda backend: the driver has no "
                                                "cuTensorMapEncodeTiled");
        encode = (EncodeTiledFn)fn;
    }
    const int es = dt == DTYPE_FP8_E4M3 ? 1 : 2; /* fp8: the codes as bytes */
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)cols * es};
    const cuuint32_t box[2] = {(cuuint32_t)(TMA_ROWB / es), (cuuint32_t)box_rows},
                     estr[2] = {1, 1};
    CUtensorMap m;
    const CUresult r = encode(
        &m,
        dt == DTYPE_BF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        : dt == DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                          : CU_TENSOR_MAP_DATA_TYPE_UINT8,
        2, (void *)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return cvllm_errorf(CVLLM_EBACKEND,
                            "cuda backend: cuTensorMapEncodeTiled failed (%d) for a tensor of "
                            "%lld x %lld",
                            (int)r, (long long)rows, (long long)cols);
    if (n == TMA_MAPS) { /* full: start again (the slot i found above is no longer meaningful) */
        memset(table, 0, sizeof table);
        n = 0;
        i = (uint32_t)map_hash(base, rows, cols, dt, box_rows) & (TMA_SLOTS - 1);
    }
    n++;
    table[i] = (MapEntry){base, rows, cols, dt, box_rows, m};
    *out = m;
    return 0;
}

int tma_map_2d(CUtensorMap *out, const void *base, int64_t rows, int64_t cols, DType dt,
               int box_rows) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    const int rc = map_locked(out, base, rows, cols, dt, box_rows);
    pthread_mutex_unlock(&mu);
    return rc;
}
