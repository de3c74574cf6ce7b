/* sequence.h: one request as the engine sees it (nano-vllm's Sequence): its token ids (prompt then
 * generated), how many of them already have K/V in the cache, its block table and its sampling
 * parameters.
 *
 * Invariants: num_cached_tokens <= num_tokens; the block table covers every token whose KV is or
 * will be written this step; a step computes tokens [num_cached_tokens, num_cached_tokens +
 * num_scheduled_tokens) and samples a new token only if that range reaches num_tokens. */
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
    int64_t seed;      /* -1 = unseeded (the engine seeds the rng) */
    int max_tokens;
    int ignore_eos;
    int32_t *stop_token_ids; /* owned */
    int num_stop_token_ids;
} SamplingParams;

typedef struct Sequence {
    int64_t id;
    SeqStatus status;
    int32_t *token_ids;       /* [num_tokens] prompt then generated, owned */
    int num_tokens, cap_tokens;
    int num_prompt_tokens;
    int num_cached_tokens;    /* tokens whose K/V is in the cache (computed or prefix hit) */
    int num_hit_tokens;       /* tokens covered by prefix-cache hit blocks at the last allocate;
                                 their K/V must never be written (slot -1) */
    int num_prefix_cached;    /* reported num_cached_tokens of the first admission */
    int num_scheduled_tokens; /* new tokens to compute in the current step (set by the scheduler) */
    int32_t *block_table;     /* [num_blocks] physical block ids, owned */
    int num_blocks, cap_blocks;
    int num_hashed_blocks;    /* leading blocks of block_table whose hash is registered in the
                                 prefix cache (hits, then commits); block manager bookkeeping */
    int num_preemptions;      /* times this sequence was preempted (0 at its first admission) */
    SamplingParams params;
    uint64_t rng[4];          /* per-request generator state (xoshiro256**) */
    CvllmFinishReason finish_reason;
    int64_t arrival;          /* submission order */
} Sequence;

/* Copies prompt and params (including the stop ids). Status SEQ_WAITING; the generator is seeded
 * with params.seed, or from the id when seed < 0 (the engine may re-seed it). */
Sequence *sequence_create(int64_t id, const int32_t *prompt, int n, const SamplingParams *p);
void sequence_destroy(Sequence *s); /* accepts NULL */
void sequence_append_token(Sequence *s, int32_t token);
int sequence_num_completion_tokens(const Sequence *s);
/* Number of blocks needed to hold n tokens. */
static inline int blocks_for_tokens(int n, int block_size) { return (n + block_size - 1) / block_size; }

/* Seeds the generator (splitmix64 expansion of seed). */
void sequence_seed_rng(Sequence *s, uint64_t seed);
/* Uniform in [0, 1) from the sequence's own generator. */
double sequence_next_uniform(Sequence *s);

#endif
