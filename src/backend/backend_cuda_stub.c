/* backend_cuda_stub.c: stands in for the CUDA backend in builds without it (CVLLM_CUDA=OFF), so
 * that `--device cuda` is a clear error rather than a link failure. */
#ifndef CVLLM_HAVE_CUDA
#include "backend/backend.h"
#include "common.h"

int backend_cuda_create(const ModelConfig *cfg, const ModelWeights *w, const BackendOptions *o,
                        Backend **out) {
    (void)cfg, (void)w, (void)o;
    *out = NULL;
    return cvllm_errorf(CVLLM_EBACKEND,
                        "this cvllm was built without the CUDA backend (compiled backends: %s); "
                        "use --device cpu",
                        cvllm_backends());
}
#endif
