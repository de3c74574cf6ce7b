/* engine_internal.h: hooks into the engine for tests and tools; not part of the public API. */
#ifndef CVLLM_ENGINE_INTERNAL_H
#define CVLLM_ENGINE_INTERNAL_H

#include "cvllm.h"

/* Called with each request's logits [vocab] before its token is sampled (temperature 0 leaves
 * them untouched). request_id is the id add_request returned. */
typedef void (*EngineLogitsFn)(void *ctx, int64_t request_id, const float *logits, int vocab);
void engine_set_logits_hook(CvllmEngine *e, EngineLogitsFn fn, void *ctx);

/* The engine's backend (tests replace its functions to inject failures). */
struct Backend;
struct Backend *engine_backend(CvllmEngine *e);
/* Decides again whether asynchronous scheduling is on (after a test gave the backend submit). */
void engine_refresh_async(CvllmEngine *e);

#endif
