/* version.c: version and compiled backends. */
#include "cvllm.h"

const char *cvllm_version(void) { return CVLLM_VERSION; }
const char *cvllm_backends(void) {
#ifdef CVLLM_HAVE_CUDA
    return "cpu,cuda";
#else
    return "cpu";
#endif
}
