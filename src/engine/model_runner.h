/* model_runner.h: turns a scheduled batch of sequences into the backend's flat step inputs
 * (nano-vllm's ModelRunner: prepare_prefill / prepare_decode), with one sampling row per sequence
 * that reaches its last token, and runs the backend, which samples. All buffers are sized once at
 * creation from the engine limits; nothing is allocated per step. */
#ifndef CVLLM_ENGINE_MODEL_RUNNER_H
#define CVLLM_ENGINE_MODEL_RUNNER_H

#include "backend/backend.h"
#include "engine/sequence.h"

typedef struct ModelRunner ModelRunner;

/* max_num_tokens: the most new tokens a step may carry; max_num_seqs: the most sequences. */
ModelRunner *model_runner_create(Backend *backend, int vocab_size, int block_size,
                                 int max_model_len, int max_num_seqs, int max_num_tokens);
void model_runner_destroy(ModelRunner *r); /* accepts NULL */

/* Packs the new tokens of seqs (num_scheduled_tokens each, starting at num_computed_tokens) back
 * to back: input_ids, positions, slot_mapping (-1 for tokens inside prefix-cache hit blocks),
 * cu_seqlens_q/k, context_lens, max lengths, block_tables, and a logits row with its sampling
 * parameters for each sequence whose chunk reaches its end. */
const StepInputs *model_runner_prepare_prefill(ModelRunner *r, Sequence **seqs, int n);
/* One token per sequence: its last token, at position num_tokens - 1. */
const StepInputs *model_runner_prepare_decode(ModelRunner *r, Sequence **seqs, int n);

/* What a run sampled for one sequence of the batch. */
typedef struct {
    int32_t token;          /* -1: a prefill chunk that does not reach its last token */
    float logprob;          /* params.num_logprobs >= 0 only */
    const int32_t *top_ids; /* [params.num_logprobs] */
    const float *top_logprobs;
} SampledToken;

/* Runs one step; out[i] is what seqs[i] sampled (valid until the next run). Returns 0 or the
 * backend's error code. The same as submit then collect. */
int model_runner_run(ModelRunner *r, Sequence **seqs, int n, int is_prefill, SampledToken *out);

/* Asynchronous steps: submit prepares a step and hands it to the backend (Backend.submit; a
 * backend without it runs the step at once), setting each sequence's sample_row (its logits row,
 * or -1); a sequence's pending token (num_pending) is read on the device from the row the step
 * before sampled it in. At most two steps are submitted and not collected. collect waits for
 * the oldest submitted step: out[i] for its seqs[i] (valid until the next collect). Both return
 * 0 or the backend's error code (a step whose submit failed is not collected). */
int model_runner_submit(ModelRunner *r, Sequence **seqs, int n, int is_prefill);
int model_runner_collect(ModelRunner *r, SampledToken *out);

/* Wall seconds spent inside the backend's forward over all runs (the engine's host profile). */
double model_runner_forward_seconds(const ModelRunner *r);

/* Logits mode (golden tests): the backend also copies each logits row out, and fn is called
 * with each sampled sequence's raw logits [vocab] after the step (at collect). NULL: off. */
typedef void (*LogitsHook)(void *ctx, const Sequence *seq, const float *logits, int vocab);
void model_runner_set_logits_hook(ModelRunner *r, LogitsHook fn, void *ctx);

#endif
