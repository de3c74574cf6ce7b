/* live_view.c: the live view's JSON (see live_view.h); the page is live_view_page.inc. */
#include "server/live_view.h"

#include <jansson.h>
#include <stdlib.h>

const char LIVE_VIEW_PAGE[] =
#include "server/live_view_page.inc"
    ;

static int blocks_of(const int64_t *owners, int n, int64_t id) {
    int k = 0;
    for (int i = 0; i < n; i++) k += owners[i] == id;
    return k;
}

void live_view_json(SBuf *out, const int64_t *owners, int num_blocks, const LiveRequest *reqs,
                    int num_reqs, const CvllmStats *st, int block_size, const char *model,
                    double now) {
    json_t *runs = json_array(); /* [owner, count] pairs in block order */
    for (int i = 0; i < num_blocks;) {
        int j = i;
        while (j < num_blocks && owners[j] == owners[i]) j++;
        json_array_append_new(runs, json_pack("[I,i]", (json_int_t)owners[i], j - i));
        i = j;
    }
    json_t *running = json_array(), *waiting = json_array();
    for (int i = 0; i < num_reqs; i++) {
        int b = blocks_of(owners, num_blocks, reqs[i].id);
        json_t *r = json_pack("{s:I,s:i,s:i,s:i,s:i,s:i,s:f}", "id", (json_int_t)reqs[i].id,
                              "prompt_tokens", reqs[i].prompt_tokens, "generated", reqs[i].generated,
                              "cached_tokens", reqs[i].cached_tokens, "max_tokens",
                              reqs[i].max_tokens, "blocks", b, "age_s", reqs[i].age);
        json_array_append_new(b > 0 ? running : waiting, r);
    }
    int held = 0, cached = 0;
    for (int i = 0; i < num_blocks; i++) {
        held += owners[i] >= 0;
        cached += owners[i] == -2;
    }
    json_t *o = json_pack(
        "{s:s,s:f,s:i,s:i,s:i,s:i,s:o,s:o,s:o,s:{s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}}", "model",
        model, "time", now, "block_size", block_size, "num_blocks", num_blocks, "blocks_held", held,
        "blocks_cached", cached, "blocks", runs, "running", running, "waiting", waiting, "stats",
        "num_running", st->num_running, "num_waiting", st->num_waiting, "prefix_cache_queries",
        (json_int_t)st->prefix_cache_queries, "prefix_cache_hits",
        (json_int_t)st->prefix_cache_hits, "generated_tokens", (json_int_t)st->generated_tokens,
        "prompt_tokens_computed", (json_int_t)st->prompt_tokens_computed, "num_preemptions",
        (json_int_t)st->num_preemptions, "num_steps", (json_int_t)st->num_steps, "requests_added",
        (json_int_t)st->requests_added, "requests_finished", (json_int_t)st->requests_finished);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    sbuf_adds(out, s ? s : "{}");
    free(s);
}
