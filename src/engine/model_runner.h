/* model_runner.h: turns a scheduled batch of sequences into the backend's flat step inputs
 * (nano-vllm's ModelRunner: prepare_prefill / prepare_decode), runs the backend and samples.
 * All buffers are sized once at creation from the engine limits; nothing is allocated per step. */
#ifndef CVLLM_ENGINE_MODEL_RUNNER_H
#define CVLLM_ENGINE_MODEL_RUNNER_H

#include "backend/backend.h"
#include "engine/sequence.h"

typedef struct ModelRunner ModelRunner;

/* max_num_tokens: the most new tokens a step may carry; max_num_seqs: the most sequences. */
ModelRunner *model_runner_create(Backend *backend, int vocab_size, int block_size,
                                 int max_model_len, int max_num_seqs, int max_num_tokens);
void model_runner_destroy(ModelRunner *r); /* accepts NULL */

/* Packs the new tokens of seqs (num_scheduled_tokens each, starting at num_cached_tokens) back to
 * back: input_ids, positions, slot_mapping (-1 for tokens inside prefix-cache hit blocks),
 * cu_seqlens_q/k, block_tables, and a logits row for each sequence whose chunk reaches its end. */
const StepInputs *model_runner_prepare_prefill(ModelRunner *r, Sequence **seqs, int n);
/* One token per sequence: its last token, at position num_tokens - 1. */
const StepInputs *model_runner_prepare_decode(ModelRunner *r, Sequence **seqs, int n);

/* Runs one step and writes tokens[i] = the sampled token of seqs[i], or -1 when seqs[i] computed
 * a prefill chunk that does not reach its last token. Returns 0 or the backend's error code. */
int model_runner_run(ModelRunner *r, Sequence **seqs, int n, int is_prefill, int32_t *tokens);

/* Called for each sequence with logits, before sampling (tests, logprobs). */
typedef void (*LogitsHook)(void *ctx, const Sequence *seq, const float *logits, int vocab);
void model_runner_set_logits_hook(ModelRunner *r, LogitsHook fn, void *ctx);

/* The logits of the last run for seqs[i] (NULL if it had none), [vocab]: for tests. Note the
 * sampler may have modified them (temperature > 0). */
const float *model_runner_last_logits(const ModelRunner *r, int i);

#endif
