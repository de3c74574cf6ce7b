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
    int32_t *input_rows;    /* [max_num_tokens]: a pending token's row in the step before, or -1 */
    SamplingRow *sampling;  /* [max_num_seqs] */
    /* Submitted steps not yet collected, oldest first (at most 2: the engine submits a step,
     * then collects the one before). A backend without submit runs each step at submit into
     * its slot's outputs (the pending ids taken from the slot before). */
    struct Flight {
        int n, native;          /* native: by Backend.submit (else run at submit) */
        int *row_of_seq;        /* [max_num_seqs]: seq i's row in logits, or -1 */
        Sequence **seqs;        /* [max_num_seqs] (the logits hook) */
        int32_t *out_ids;       /* [max_num_seqs] */
        float *out_logprobs;    /* [max_num_seqs] */
        int32_t *out_top_ids;   /* [max_num_seqs, CVLLM_MAX_LOGPROBS] */
        float *out_top_lp;      /* same */
        float *logits;          /* [max_num_seqs, vocab] in logits mode, else NULL */
    } fl[2];
    int fl_head, fl_count, last_slot; /* last_slot: the slot submitted last, or -1 */
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
    r->input_rows = xmalloc(T * sizeof(int32_t));
    r->sampling = xcalloc(S, sizeof(SamplingRow));
    for (int k = 0; k < 2; k++) {
        struct Flight *f = &r->fl[k];
        f->row_of_seq = xmalloc(S * sizeof(int));
        f->seqs = xmalloc(S * sizeof(Sequence *));
        f->out_ids = xmalloc(S * sizeof(int32_t));
        f->out_logprobs = xmalloc(S * sizeof(float));
        f->out_top_ids = xmalloc(S * CVLLM_MAX_LOGPROBS * sizeof(int32_t));
        f->out_top_lp = xmalloc(S * CVLLM_MAX_LOGPROBS * sizeof(float));
    }
    r->last_slot = -1;
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
    free(r->input_rows);
    free(r->sampling);
    for (int k = 0; k < 2; k++) {
        struct Flight *f = &r->fl[k];
        free(f->row_of_seq);
        free(f->seqs);
        free(f->out_ids);
        free(f->out_logprobs);
        free(f->out_top_ids);
        free(f->out_top_lp);
        free(f->logits);
    }
    free(r);
}

/* Shared by prefill and decode: seq i computes tokens [start_i, start_i + len_i); row_of_seq[i]
 * gets its logits row or -1. A pending token (Sequence.num_pending) goes as input_rows[t] = the
 * row it is sampled in by the step before, input_ids[t] = 0. */
static const StepInputs *prepare(ModelRunner *r, Sequence **seqs, int n, int is_prefill,
                                 int *row_of_seq) {
    CHECK(n >= 1 && n <= r->max_num_seqs, "batch of %d sequences (limit %d)", n, r->max_num_seqs);
    int bs = r->block_size, t = 0, max_q = 0, max_k = 0, num_logits = 0, any_penalty = 0;
    int any_rows = 0;
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
        const int first_pending = s->num_tokens - s->num_pending;
        for (int p = start; p < end; p++, t++) {
            const int pending = p >= first_pending;
            r->input_ids[t] = pending ? 0 : s->token_ids[p];
            r->input_rows[t] = pending ? s->sample_row : -1;
            any_rows |= pending;
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
            CHECK(!sampling_row_has_penalty(row) || !s->num_pending,
                  "seq %lld: penalties over a pending token", (long long)s->id);
            row_of_seq[i] = num_logits;
            r->logits_indices[num_logits++] = t - 1;
        } else {
            row_of_seq[i] = -1;
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
        .input_rows = any_rows ? r->input_rows : NULL,
    };
    return &r->in;
}

const StepInputs *model_runner_prepare_prefill(ModelRunner *r, Sequence **seqs, int n) {
    return prepare(r, seqs, n, 1, r->fl[0].row_of_seq);
}

const StepInputs *model_runner_prepare_decode(ModelRunner *r, Sequence **seqs, int n) {
    return prepare(r, seqs, n, 0, r->fl[0].row_of_seq);
}

static StepOutputs outputs_of(ModelRunner *r, struct Flight *f) {
    if (r->hook && !f->logits)
        f->logits = xmalloc((size_t)r->max_num_seqs * r->vocab_size * sizeof(float));
    return (StepOutputs){.token_ids = f->out_ids,
                         .logprobs = f->out_logprobs,
                         .top_ids = f->out_top_ids,
                         .top_logprobs = f->out_top_lp,
                         .logits = r->hook ? f->logits : NULL};
}

int model_runner_submit(ModelRunner *r, Sequence **seqs, int n, int is_prefill) {
    CHECK(r->fl_count < 2, "a third step submitted before one was collected");
    const int k = (r->fl_head + r->fl_count) % 2;
    struct Flight *f = &r->fl[k];
    StepInputs *in = (StepInputs *)prepare(r, seqs, n, is_prefill, f->row_of_seq);
    f->n = n;
    memcpy(f->seqs, seqs, (size_t)n * sizeof(Sequence *));
    Backend *b = r->backend;
    int rc = 0;
    double t0 = now_seconds();
    f->native = b->submit && !r->hook; /* logits mode: forward, which copies the rows out */
    if (f->native) {
        rc = b->submit(b, in);
    } else { /* at once: the pending ids are known, the step before ran at its submit */
        if (in->input_rows) {
            const struct Flight *prev = r->last_slot >= 0 ? &r->fl[r->last_slot] : NULL;
            if (!prev) rc = cvllm_errorf(CVLLM_EINVAL, "a pending token but no step before");
            for (int t = 0; t < in->num_tokens && rc == 0; t++)
                if (in->input_rows[t] >= 0) r->input_ids[t] = prev->out_ids[in->input_rows[t]];
            in->input_rows = NULL;
        }
        StepOutputs so = outputs_of(r, f);
        if (rc == 0) rc = b->forward(b, in, &so);
    }
    r->forward_s += now_seconds() - t0;
    if (rc < 0) return rc;
    for (int i = 0; i < n; i++) seqs[i]->sample_row = f->row_of_seq[i];
    r->fl_count++;
    r->last_slot = k;
    return 0;
}

int model_runner_collect(ModelRunner *r, SampledToken *out) {
    CHECK(r->fl_count > 0, "nothing submitted to collect");
    struct Flight *f = &r->fl[r->fl_head];
    r->fl_head = (r->fl_head + 1) % 2;
    r->fl_count--;
    int rc = 0;
    if (f->native) {
        StepOutputs so = outputs_of(r, f);
        double t0 = now_seconds();
        rc = r->backend->collect(r->backend, &so);
        r->forward_s += now_seconds() - t0;
    }
    if (rc < 0) return rc;
    for (int i = 0; i < f->n; i++) {
        int row = f->row_of_seq[i];
        out[i] = (SampledToken){.token = -1};
        if (row < 0) continue;
        if (r->hook)
            r->hook(r->hook_ctx, f->seqs[i], f->logits + (size_t)row * r->vocab_size,
                    r->vocab_size);
        out[i].token = f->out_ids[row];
        out[i].logprob = f->out_logprobs[row];
        out[i].top_ids = f->out_top_ids + (size_t)row * CVLLM_MAX_LOGPROBS;
        out[i].top_logprobs = f->out_top_lp + (size_t)row * CVLLM_MAX_LOGPROBS;
    }
    return 0;
}

int model_runner_run(ModelRunner *r, Sequence **seqs, int n, int is_prefill, SampledToken *out) {
    int rc = model_runner_submit(r, seqs, n, is_prefill);
    return rc < 0 ? rc : model_runner_collect(r, out);
}

double model_runner_forward_seconds(const ModelRunner *r) { return r->forward_s; }

void model_runner_set_logits_hook(ModelRunner *r, LogitsHook fn, void *ctx) {
    r->hook = fn;
    r->hook_ctx = ctx;
}
