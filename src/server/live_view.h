/* live_view.h: GET / (a page drawing the engine's KV block pool as a grid, the running and
 * waiting requests, tokens/s and the prefix-cache hit rate) and GET /live.json (the data it polls:
 * the block owners run-length encoded, the requests, the engine's counters). */
#ifndef CVLLM_SERVER_LIVE_VIEW_H
#define CVLLM_SERVER_LIVE_VIEW_H

#include <stdint.h>

#include "cvllm.h"
#include "server/sbuf.h"

typedef struct {
    int64_t id;          /* engine request id */
    int prompt_tokens;
    int generated;
    int cached_tokens;
    int max_tokens;
    double age;          /* seconds since it arrived */
} LiveRequest;

/* The page (static HTML + JS, no external resources). */
extern const char LIVE_VIEW_PAGE[];
/* Appends the JSON snapshot. owners[num_blocks] as cvllm_engine_block_owners gives them.
 * A request holding blocks is listed as running, one holding none as waiting. */
void live_view_json(SBuf *out, const int64_t *owners, int num_blocks, const LiveRequest *reqs,
                    int num_reqs, const CvllmStats *st, int block_size, const char *model,
                    double now);

#endif
