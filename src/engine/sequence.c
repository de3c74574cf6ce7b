/* sequence.c: one request's token ids and block table. (Its random numbers are counter-based,
 * keyed by params.seed: see src/backend/philox.h.) */
#include "engine/sequence.h"

#include <string.h>

#include "common.h"

/* ---------------------------------------------------------------------------------------------
 * Lifecycle */

Sequence *sequence_create(int64_t id, const int32_t *prompt, int n, const SamplingParams *p) {
    CHECK(n >= 0, "prompt length %d", n);
    CHECK(p != NULL, "sampling params are NULL");
    Sequence *s = xcalloc(1, sizeof(*s));
    s->id = id;
    s->status = SEQ_WAITING;
    s->cap_tokens = n > 0 ? n + 16 : 16;
    s->token_ids = xmalloc((size_t)s->cap_tokens * sizeof(int32_t));
    if (n > 0) memcpy(s->token_ids, prompt, (size_t)n * sizeof(int32_t));
    s->num_tokens = n;
    s->num_prompt_tokens = n;
    s->params = *p;
    s->params.stop_token_ids = NULL;
    if (p->num_stop_token_ids > 0) {
        CHECK(p->stop_token_ids != NULL, "%d stop ids but no array", p->num_stop_token_ids);
        s->params.stop_token_ids = xmalloc((size_t)p->num_stop_token_ids * sizeof(int32_t));
        memcpy(s->params.stop_token_ids, p->stop_token_ids,
               (size_t)p->num_stop_token_ids * sizeof(int32_t));
    } else {
        s->params.num_stop_token_ids = 0;
    }
    s->finish_reason = CVLLM_FINISH_NONE;
    s->arrival = id;
    s->stop_token_id = -1;
    s->sample_row = -1;
    return s;
}

void sequence_destroy(Sequence *s) {
    if (!s) return;
    free(s->token_ids);
    free(s->block_table);
    free(s->params.stop_token_ids);
    free(s);
}

void sequence_append_token(Sequence *s, int32_t token) {
    DA_PUSH(s->token_ids, s->num_tokens, s->cap_tokens, token);
}

int sequence_num_completion_tokens(const Sequence *s) { return s->num_tokens - s->num_prompt_tokens; }

void sequence_drop_pending(Sequence *s) {
    s->num_tokens -= s->num_pending;
    s->num_pending = 0;
}
