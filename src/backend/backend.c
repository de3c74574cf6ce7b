/* backend.c: the registry of compiled backends. The engine and the CLI find a backend here by
 * device choice or name; nothing above this file names a backend's create function. */
#include "backend/backend.h"

#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "common.h"

#ifdef CVLLM_HAVE_CUDA
extern const BackendEntry backend_cuda_entry; /* backend/cuda/ */
#endif

static const BackendEntry *const REGISTRY[] = {
#ifdef CVLLM_HAVE_CUDA
    &backend_cuda_entry,
#endif
    &backend_cpu_entry,
};

const BackendEntry *const *backend_registry(int *n) {
    *n = (int)(sizeof REGISTRY / sizeof REGISTRY[0]);
    return REGISTRY;
}

const BackendEntry *backend_find(const char *name) {
    for (size_t i = 0; i < sizeof REGISTRY / sizeof REGISTRY[0]; i++)
        if (!strcmp(REGISTRY[i]->name, name)) return REGISTRY[i];
    return NULL;
}

const char *cvllm_backends(void) {
    static char buf[64];
    if (!buf[0])
        for (size_t i = 0; i < sizeof REGISTRY / sizeof REGISTRY[0]; i++) {
            if (i) strcat(buf, ",");
            strcat(buf, REGISTRY[i]->name);
        }
    return buf;
}

const char *cvllm_backends_report(void) {
    static char buf[1024];
    if (!buf[0])
        for (size_t i = 0; i < sizeof REGISTRY / sizeof REGISTRY[0]; i++) {
            char desc[256] = "";
            REGISTRY[i]->probe(desc, sizeof desc);
            size_t len = strlen(buf);
            snprintf(buf + len, sizeof buf - len, "%s%s", len ? "\n" : "", desc);
        }
    return buf;
}

int backend_create(CvllmDevice device, const ModelConfig *cfg, const ModelWeights *w,
                   const BackendOptions *o, Backend **out) {
    *out = NULL;
    char desc[256] = "";
    if (device == CVLLM_DEVICE_AUTO) {
        for (size_t i = 0; i < sizeof REGISTRY / sizeof REGISTRY[0]; i++)
            if (REGISTRY[i]->probe(desc, sizeof desc)) return REGISTRY[i]->create(cfg, w, o, out);
        return cvllm_errorf(CVLLM_EBACKEND, "no backend can run here");
    }
    const char *name = device == CVLLM_DEVICE_CUDA ? "cuda" : "cpu";
    const BackendEntry *be = backend_find(name);
    if (!be)
        return cvllm_errorf(CVLLM_EBACKEND,
                            "this cvllm was built without the %s backend (compiled backends: %s); "
                            "use --device cpu",
                            strcmp(name, "cuda") ? name : "CUDA", cvllm_backends());
    if (!be->probe(desc, sizeof desc))
        return cvllm_errorf(CVLLM_EBACKEND, "--device %s: %s", name, desc);
    return be->create(cfg, w, o, out);
}
