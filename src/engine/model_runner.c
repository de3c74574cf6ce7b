/* model_runner.c: step inputs for the backend, and sampling of its logits. */
#include "engine/model_runner.h"

#include <string.h>

#include "common.h"
#include "engine/sampler.h"

struct ModelRunner {
    Backend *backend; /* borrowed */
    int vocab_size, block_size, max_model_len, max_num_seqs, max_num_tokens, max_blocks_per_seq;
    /* Step inputs, sized for the limits (see StepInputs for shapes). */
    int32_t *input_ids, *positions, *cu_seqlens_q, *cu_seqlens_k, *context_lens, *block_tables;
    int64_t *slot_mapping;
    int32_t *logits_indices;
    int *logits_row_of_seq; /* [max_num_seqs]: row in logits, or -1 */
    float *logits;          /* [max_num_seqs, vocab] */
    void *sampler_scratch;
    StepInputs in;
    LogitsHook hook;
    void *hook_ctx;
};

ModelRunner *model_runner_create(Backend *backend, int vocab_size, int block_size,
                                 int max_model_len, int max_num_seqs, int max_num_tokens) {
    ModelRunner *r = xcalloc(1, sizeof *r);
    r->backend = backend;
    r->vocab_size = vocab_size;
    r->block_size = block_size;
    r->max_model_len = max_model_len;
    r->max_num_seqs = max_num_seqs;
    r->max_num_tokens = max_num_tokens;
    r->max_blocks_per_seq = blocks_for_tokens(max_model_len, block_size);
    size_t T = (size_t)max_num_tokens, S = (size_t)max_num_seqs;
    r->input_ids = xmalloc(T * sizeof(int32_t));
    r->positions = xmalloc(T * sizeof(int32_t));
    r->slot_mapping = xmalloc(T * sizeof(int64_t));
    r->cu_seqlens_q = xmalloc((S + 1) * sizeof(int32_t));
    r->cu_seqlens_k = xmalloc((S + 1) * sizeof(int32_t));
    r->context_lens = xmalloc(S * sizeof(int32_t));
    r->block_tables = xmalloc(S * (size_t)r->max_blocks_per_seq * sizeof(int32_t));
    r->logits_indices = xmalloc(S * sizeof(int32_t));
    r->logits_row_of_seq = xmalloc(S * sizeof(int));
    r->logits = xmalloc(S * (size_t)vocab_size * sizeof(float));
    r->sampler_scratch = xmalloc(sampler_scratch_bytes(vocab_size));
    return r;
}

void model_runner_destroy(ModelRunner *r) {
    if (!r) return;
    free(r->input_ids);
    free(r->positions);
    free(r->slot_mapping);
    free(r->cu_seqlens_q);
    free(r->cu_seqlens_k);
    free(r->context_lens);
    free(r->block_tables);
    free(r->logits_indices);
    free(r->logits_row_of_seq);
    free(r->logits);
    free(r->sampler_scratch);
    free(r);
}

/* Shared by prefill and decode: seq i computes tokens [start_i, start_i + len_i). */
static const StepInputs *prepare(ModelRunner *r, Sequence **seqs, int n, int is_prefill) {
    CHECK(n >= 1 && n <= r->max_num_seqs, "batch of %d sequences (limit %d)", n, r->max_num_seqs);
    int bs = r->block_size, t = 0, max_q = 0, max_k = 0, num_logits = 0;
    r->cu_seqlens_q[0] = r->cu_seqlens_k[0] = 0;
    for (int i = 0; i < n; i++) {
        Sequence *s = seqs[i];
        int start = is_prefill ? s->num_cached_tokens : s->num_tokens - 1;
        int len = is_prefill ? s->num_scheduled_tokens : 1;
        int end = start + len;
        CHECK(len >= 1 && end <= s->num_tokens, "seq %lld: tokens [%d, %d) of %d", (long long)s->id,
              start, end, s->num_tokens);
        CHECK(blocks_for_tokens(end, bs) <= s->num_blocks, "seq %lld: %d tokens but %d blocks",
              (long long)s->id, end, s->num_blocks);
        CHECK(t + len <= r->max_num_tokens, "step of %d tokens (limit %d)", t + len,
              r->max_num_tokens);
        for (int p = start; p < end; p++, t++) {
            r->input_ids[t] = s->token_ids[p];
            r->positions[t] = p;
            r->slot_mapping[t] = p < s->num_hit_tokens
                                     ? -1 /* K/V already there, in a block others may share */
                                     : (int64_t)s->block_table[p / bs] * bs + p % bs;
        }
        r->cu_seqlens_q[i + 1] = t;
        r->cu_seqlens_k[i + 1] = r->cu_seqlens_k[i] + end;
        r->context_lens[i] = end;
        if (len > max_q) max_q = len;
        if (end > max_k) max_k = end;
        int32_t *row = r->block_tables + (size_t)i * r->max_blocks_per_seq;
        memcpy(row, s->block_table, (size_t)s->num_blocks * sizeof(int32_t));
        for (int b = s->num_blocks; b < r->max_blocks_per_seq; b++) row[b] = -1;
        if (end == s->num_tokens) {
            r->logits_row_of_seq[i] = num_logits;
            r->logits_indices[num_logits++] = t - 1;
        } else {
            r->logits_row_of_seq[i] = -1;
        }
    }
    r->in = (StepInputs){
        .is_prefill = is_prefill,
        .num_tokens = t,
        .num_seqs = n,
        .input_ids = r->input_ids,
        .positions = r->positions,
        .slot_mapping = r->slot_mapping,
        .cu_seqlens_q = r->cu_seqlens_q,
        .cu_seqlens_k = r->cu_seqlens_k,
        .max_seqlen_q = max_q,
        .max_seqlen_k = max_k,
        .context_lens = r->context_lens,
        .block_tables = r->block_tables,
        .max_blocks_per_seq = r->max_blocks_per_seq,
        .logits_indices = r->logits_indices,
        .num_logits = num_logits,
    };
    return &r->in;
}

const StepInputs *model_runner_prepare_prefill(ModelRunner *r, Sequence **seqs, int n) {
    return prepare(r, seqs, n, 1);
}

const StepInputs *model_runner_prepare_decode(ModelRunner *r, Sequence **seqs, int n) {
    return prepare(r, seqs, n, 0);
}

int model_runner_run(ModelRunner *r, Sequence **seqs, int n, int is_prefill, int32_t *tokens) {
    const StepInputs *in = is_prefill ? model_runner_prepare_prefill(r, seqs, n)
                                      : model_runner_prepare_decode(r, seqs, n);
    int rc = r->backend->forward(r->backend, in, r->logits);
    if (rc < 0) return rc;
    for (int i = 0; i < n; i++) {
        int row = r->logits_row_of_seq[i];
        if (row >= 0 && r->hook)
            r->hook(r->hook_ctx, seqs[i], r->logits + (size_t)row * r->vocab_size, r->vocab_size);
        tokens[i] = row < 0 ? -1
                            : sampler_sample(r->logits + (size_t)row * r->vocab_size, r->vocab_size,
                                             &seqs[i]->params, seqs[i], r->sampler_scratch);
    }
    return 0;
}

void model_runner_set_logits_hook(ModelRunner *r, LogitsHook fn, void *ctx) {
    r->hook = fn;
    r->hook_ctx = ctx;
}

const float *model_runner_last_logits(const ModelRunner *r, int i) {
    if (i < 0 || i >= r->in.num_seqs || r->logits_row_of_seq[i] < 0) return NULL;
    return r->logits + (size_t)r->logits_row_of_seq[i] * r->vocab_size;
}
