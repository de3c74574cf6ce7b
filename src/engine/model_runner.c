/* model_runner.c: step inputs for the backend (the contract is in backend.h), and what it
 * sampled. */
#include "engine/model_runner.h"

#include <string.h>

#include "common.h"

struct ModelRunner {
    Backend *backend; /* borrowed */
    int vocab_size, block_size, max_model_len, max_num_seqs, max_num_tokens, max_blocks_per_seq;
    /* Step inputs, sized for the limits (see StepInputs for shapes). */
    int32_t *input_ids, *positions, *cu_seqlens_q, *cu_seqlens_k, *context_lens, *block_tables;
    int64_t *slot_mapping;
    int32_t *logits_indices;
    int *logits_row_of_seq; /* [max_num_seqs]: row in logits, or -1 */
    SamplingRow *sampling;  /* [max_num_seqs] */
    int32_t *out_ids;       /* [max_num_seqs] */
    float *out_logprobs;    /* [max_num_seqs] */
    int32_t *out_top_ids;   /* [max_num_seqs, CVLLM_MAX_LOGPROBS] */
    float *out_top_lp;      /* same */
    float *logits;          /* [max_num_seqs, vocab] in logits mode, else NULL */
    StepInputs in;
    LogitsHook hook;
    void *hook_ctx;
    double forward_s; /* wall time inside the backend's forward, summed */
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
    r->sampling = xcalloc(S, sizeof(SamplingRow));
    r->out_ids = xmalloc(S * sizeof(int32_t));
    r->out_logprobs = xmalloc(S * sizeof(float));
    r->out_top_ids = xmalloc(S * CVLLM_MAX_LOGPROBS * sizeof(int32_t));
    r->out_top_lp = xmalloc(S * CVLLM_MAX_LOGPROBS * sizeof(float));
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
    free(r->sampling);
    free(r->out_ids);
    free(r->out_logprobs);
    free(r->out_top_ids);
    free(r->out_top_lp);
    free(r->logits);
    free(r);
}

/* Shared by prefill and decode: seq i computes tokens [start_i, start_i + len_i). */
static const StepInputs *prepare(ModelRunner *r, Sequence **seqs, int n, int is_prefill) {
    CHECK(n >= 1 && n <= r->max_num_seqs, "batch of %d sequences (limit %d)", n, r->max_num_seqs);
    int bs = r->block_size, t = 0, max_q = 0, max_k = 0, num_logits = 0, any_penalty = 0;
    r->cu_seqlens_q[0] = r->cu_seqlens_k[0] = 0;
    /* block-table rows as wide as the batch's longest table, not max_model_len's (at 40,960
     * tokens that would be 2,560 entries a row, most of them padding, written every step) */
    int width = 1;
    for (int i = 0; i < n; i++)
        if (seqs[i]->num_blocks > width) width = seqs[i]->num_blocks;
    CHECK(width <= r->max_blocks_per_seq, "a block table of %d blocks (limit %d)", width,
          r->max_blocks_per_seq);
    for (int i = 0; i < n; i++) {
        Sequence *s = seqs[i];
        int start = is_prefill ? s->num_computed_tokens : s->num_tokens - 1;
        CHECK(is_prefill || s->num_computed_tokens == s->num_tokens - 1,
              "seq %lld in a decode step with %d of %d tokens computed", (long long)s->id,
              s->num_computed_tokens, s->num_tokens);
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
        int32_t *row = r->block_tables + (size_t)i * width;
        memcpy(row, s->block_table, (size_t)s->num_blocks * sizeof(int32_t));
        for (int b = s->num_blocks; b < width; b++) row[b] = -1;
        if (end == s->num_tokens) {
            const SamplingParams *p = &s->params;
            SamplingRow *row = &r->sampling[num_logits];
            *row = (SamplingRow){.temperature = p->temperature,
                                 .top_p = p->top_p,
                                 .top_k = p->top_k,
                                 .min_p = p->min_p,
                                 .presence_penalty = p->presence_penalty,
                                 .frequency_penalty = p->frequency_penalty,
                                 .repetition_penalty = p->repetition_penalty,
                                 .seed = p->seed,
                                 .num_logprobs = p->num_logprobs,
                                 .prompt_ids = s->token_ids,
                                 .num_prompt = s->num_prompt_tokens,
                                 .output_ids = s->token_ids + s->num_prompt_tokens,
                                 .num_output = s->num_tokens - s->num_prompt_tokens};
            any_penalty |= sampling_row_has_penalty(row);
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
        .max_blocks_per_seq = width,
        .logits_indices = r->logits_indices,
        .num_logits = num_logits,
        .sampling = r->sampling,
        .any_penalty = any_penalty,
    };
    return &r->in;
}

const StepInputs *model_runner_prepare_prefill(ModelRunner *r, Sequence **seqs, int n) {
    return prepare(r, seqs, n, 1);
}

const StepInputs *model_runner_prepare_decode(ModelRunner *r, Sequence **seqs, int n) {
    return prepare(r, seqs, n, 0);
}

int model_runner_run(ModelRunner *r, Sequence **seqs, int n, int is_prefill, SampledToken *out) {
    const StepInputs *in = is_prefill ? model_runner_prepare_prefill(r, seqs, n)
                                      : model_runner_prepare_decode(r, seqs, n);
    StepOutputs so = {.token_ids = r->out_ids,
                      .logprobs = r->out_logprobs,
                      .top_ids = r->out_top_ids,
                      .top_logprobs = r->out_top_lp,
                      .logits = r->hook ? r->logits : NULL};
    double t0 = now_seconds();
    int rc = r->backend->forward(r->backend, in, &so);
    r->forward_s += now_seconds() - t0;
    if (rc < 0) return rc;
    for (int i = 0; i < n; i++) {
        int row = r->logits_row_of_seq[i];
        out[i] = (SampledToken){.token = -1};
        if (row < 0) continue;
        if (r->hook)
            r->hook(r->hook_ctx, seqs[i], r->logits + (size_t)row * r->vocab_size, r->vocab_size);
        out[i].token = r->out_ids[row];
        out[i].logprob = r->out_logprobs[row];
        out[i].top_ids = r->out_top_ids + (size_t)row * CVLLM_MAX_LOGPROBS;
        out[i].top_logprobs = r->out_top_lp + (size_t)row * CVLLM_MAX_LOGPROBS;
    }
    return 0;
}

double model_runner_forward_seconds(const ModelRunner *r) { return r->forward_s; }

void model_runner_set_logits_hook(ModelRunner *r, LogitsHook fn, void *ctx) {
    r->hook = fn;
    r->hook_ctx = ctx;
    if (fn && !r->logits) r->logits = xmalloc((size_t)r->max_num_seqs * r->vocab_size * sizeof(float));
}
