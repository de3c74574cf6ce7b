/* sequence.h: one request as the engine sees it (nano-vllm's Sequence): its token ids (prompt then
 * generated), how many of them already have K/V in the cache, its block table and its sampling
 * parameters.
 *
 * Invariants: num_computed_tokens <= num_tokens; the block table covers every token whose KV is or
 * will be written this step. */
#ifndef CVLLM_ENGINE_SEQUENCE_H
#define CVLLM_ENGINE_SEQUENCE_H

#include <stdint.h>

#include "cvllm.h"

typedef enum { SEQ_WAITING = 0, SEQ_RUNNING, SEQ_FINISHED } SeqStatus;

typedef struct {
    float temperature; /* 0 = greedy */
    float top_p;       /* 1 = off */
    int top_k;         /* <= 0 = off */
    float min_p;       /* 0 = off */
    float presence_penalty, frequency_penalty; /* 0 = off */
    float repetition_penalty;                  /* 1 = off */
    uint64_t seed;     /* key of the sampler's uniforms (the engine draws one for unseeded requests) */
    int num_logprobs;  /* -1 = none */
    int max_tokens;
    int ignore_eos;
    int32_t *stop_token_ids; /* owned */
    int num_stop_token_ids;
} SamplingParams;

/* Token counters of a sequence (all in tokens, from its first token):
 *   num_prompt_tokens <= num_tokens: the prompt, then the generated ids;
 *   num_computed_tokens: the leading tokens whose K/V is in the cache (computed by a finished step,
 *     or found in the prefix cache); a step computes [num_computed_tokens, num_computed_tokens +
 *     num_scheduled_tokens) and samples a new token only if that reaches num_tokens;
 *   num_hit_tokens: the leading tokens in prefix-cache hit blocks at the last allocation: their
 *     K/V is never written by this sequence (slot -1), since others may share the blocks;
 *   first_hit_tokens: num_hit_tokens of the first admission (reported as num_cached_tokens). */
typedef struct Sequence {
    int64_t id;
    SeqStatus status;
    int32_t *token_ids;       /* [num_tokens] prompt then generated, owned */
    int num_tokens, cap_tokens;
    int num_prompt_tokens;
    int num_computed_tokens;
    int num_hit_tokens;
    int first_hit_tokens;
    int num_scheduled_tokens; /* new tokens to compute in the current step (set by the scheduler) */
    int32_t *block_table;     /* [num_blocks] physical block ids, owned */
    int num_blocks, cap_blocks;
    int num_registered_blocks; /* block manager bookkeeping: leading blocks of block_table whose
                                  hash is registered in the prefix cache */
    int num_marked_blocks;     /* block manager bookkeeping: leading registered blocks already
                                  hittable (written by a step scheduled before or now) */
    int num_preemptions;      /* times this sequence was preempted (0 at its first admission) */
    /* Asynchronous scheduling (engine.c): a step is scheduled while the one before still runs,
     * so the token that step samples is appended as a placeholder (-1) and its value filled in
     * when the step's results arrive. num_pending: 1 while the last token is such a placeholder;
     * sample_row: the logits row of this sequence in the step submitted last (model runner),
     * which the next step reads the id from; in_flight: submitted steps holding it, not yet
     * collected (the engine frees a request only at 0). */
    int num_pending;
    int sample_row;
    int in_flight;
    SamplingParams params;
    CvllmFinishReason finish_reason;
    int32_t stop_token_id;    /* the EOS / stop id that finished it, or -1 */
    int64_t arrival;          /* submission order */
    void *owner;              /* the engine's per-request state (outputs, text), or NULL */
} Sequence;

/* Copies prompt and params (including the stop ids). Status SEQ_WAITING. */
Sequence *sequence_create(int64_t id, const int32_t *prompt, int n, const SamplingParams *p);
void sequence_destroy(Sequence *s); /* accepts NULL */
void sequence_append_token(Sequence *s, int32_t token);
int sequence_num_completion_tokens(const Sequence *s);
/* Removes a pending placeholder token (its value will not be kept). */
void sequence_drop_pending(Sequence *s);
/* Number of blocks needed to hold n tokens. */
static inline int blocks_for_tokens(int n, int block_size) { return (n + block_size - 1) / block_size; }

#endif
