/* engine_overhead.c: the engine's own time per step (scheduling, block manager, model runner's
 * inputs, outputs), with the backend's forward replaced by one that returns at once (fixed ids):
 * what the GPU waits for between two steps. 256 requests of 100..599 prompt tokens, greedy,
 * EOS ignored, on the CPU backend's bookkeeping (no model math runs).
 *
 *   gcc -O2 -D_GNU_SOURCE -std=gnu11 -I include -I src tests/tools/engine_overhead.c \
 *       -o /tmp/engine_overhead build/libcvllm_core.a \
 *       $(pkg-config --libs libpcre2-8 jansson libxxhash libutf8proc) -lpthread -lm
 *   /tmp/engine_overhead MODEL_DIR MAX_TOKENS MAX_MODEL_LEN   (e.g. the qwen3-0.6b preset 1000 40960) */
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "common.h"
#include "cvllm.h"
#include "engine/engine_internal.h"

static int instant_forward(Backend *b, const StepInputs *in, StepOutputs *out) {
    (void)b;
    for (int i = 0; i < in->num_logits; i++)
        out->token_ids[i] = 100 + i % 300;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: engine_overhead MODEL_DIR MAX_TOKENS MAX_MODEL_LEN\n");
        return 2;
    }
    CvllmEngineOptions o;
    cvllm_engine_options_default(&o);
    o.device = CVLLM_DEVICE_CPU;
    o.verbose = 0;
    o.max_num_seqs = 256;
    o.max_model_len = atoi(argv[3]);
    o.kv_cache_memory = 6LL << 30;
    o.kv_cache_dtype = CVLLM_KV_DTYPE_BF16;
    CvllmEngine *e;
    if (cvllm_engine_create(argv[1], &o, &e) < 0) {
        fprintf(stderr, "%s\n", cvllm_last_error());
        return 1;
    }
    engine_backend(e)->forward = instant_forward;
    CvllmSamplingParams p;
    cvllm_sampling_params_default(&p);
    p.temperature = 0, p.ignore_eos = 1, p.max_tokens = atoi(argv[2]);
    int32_t ids[600];
    for (int i = 0; i < 600; i++)
        ids[i] = (i * 7) % 500;
    for (int r = 0; r < 256; r++)
        cvllm_engine_add_request(e, ids, 100 + (r * 13) % 500, &p);
    double t0 = now_seconds();
    int steps = 0;
    while (cvllm_engine_has_unfinished(e)) {
        const CvllmRequestOutput *outs;
        int n;
        cvllm_engine_step(e, &outs, &n);
        steps++;
    }
    double dt = now_seconds() - t0;
    printf("%d steps in %.3f s: %.1f us a step\n", steps, dt, dt / steps * 1e6);
    cvllm_engine_destroy(e);
    return 0;
}
