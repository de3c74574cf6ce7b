/* scheduler.h: which sequences run in the next step (nano-vllm's Scheduler, plus chunked prefill).
 *
 * Policy, once per step:
 *  1. Prefill first. Running sequences whose prefill is unfinished (a chunked long prompt, or a
 *     resumed preempted one) continue first, then waiting ones are admitted in FIFO order while
 *     running < max_num_seqs, the token budget (max_num_batched_tokens) lasts and
 *     block_manager_can_allocate says yes. A prompt longer than the budget left is chunked: it gets
 *     what is left, and continues next step. If any prefill work was scheduled, that is the step.
 *  2. Otherwise decode: every running sequence gets one token. If the block manager cannot give a
 *     sequence the block it needs, the newest running sequence is preempted (blocks freed, status
 *     back to waiting at the head of the queue, recomputed later; possibly the sequence itself).
 *
 * A running sequence with num_computed_tokens == num_tokens - 1 is decode-ready (this includes a prefill
 * chunk that stopped one token short of the end: its last token is computed by a decode step).
 *
 * postprocess() appends the sampled tokens, checks stops (EOS unless ignore_eos, stop token ids,
 * max_tokens, max_model_len), commits computed blocks to the prefix cache, and finishes sequences
 * (status SEQ_FINISHED, blocks released, removed from running). */
#ifndef CVLLM_ENGINE_SCHEDULER_H
#define CVLLM_ENGINE_SCHEDULER_H

#include "engine/block_manager.h"
#include "engine/sequence.h"

typedef struct {
    int max_num_seqs;
    int max_num_batched_tokens;
    int max_model_len;
    const int *eos_token_ids;
    int num_eos_token_ids;
} SchedulerConfig;

typedef struct Scheduler Scheduler;

Scheduler *scheduler_create(const SchedulerConfig *cfg, BlockManager *bm); /* bm borrowed */
void scheduler_destroy(Scheduler *s); /* accepts NULL; does not free sequences */

/* Queues seq (status SEQ_WAITING) at the tail of the waiting queue. The scheduler borrows it. */
void scheduler_add(Scheduler *s, Sequence *seq);
/* Removes a waiting or running sequence (abort): releases its blocks, status SEQ_FINISHED,
 * finish_reason CVLLM_FINISH_ABORT. No effect on a finished one. If it is in the batch of the step
 * in flight, postprocess skips it (it is no longer running). */
void scheduler_remove(Scheduler *s, Sequence *seq);
int scheduler_is_finished(const Scheduler *s);
int scheduler_num_running(const Scheduler *s);
int scheduler_num_waiting(const Scheduler *s);
int64_t scheduler_num_preemptions(const Scheduler *s);
int64_t scheduler_current_step(const Scheduler *s); /* the number of the last scheduled step */
/* The i-th running sequence (admission order), or NULL. */
Sequence *scheduler_running_at(const Scheduler *s, int i);
/* Finishes a waiting or running sequence with reason (a stop string, an abort): blocks released,
 * removed from its queue, a pending placeholder token dropped. No effect on a finished one. */
void scheduler_finish(Scheduler *s, Sequence *seq, CvllmFinishReason reason);

/* Chooses the next step. Fills *batch (owned by the scheduler, valid until the next call) with n
 * sequences, each with num_scheduled_tokens set and its block table covering the tokens it will
 * write. Returns 0 with n = 0 if there is nothing to run. Returns CVLLM_ENOMEM if a waiting
 * sequence can never fit (its blocks exceed the whole cache): that sequence is finished with
 * CVLLM_FINISH_ERROR (the message is this thread's last error) and *refused set to it so that the engine can report it, n = 0, and nothing
 * else changed in a way that matters: call again to schedule the rest. (Also when nothing runs and
 * the cache still cannot take the head of waiting.) */
int scheduler_schedule(Scheduler *s, Sequence ***batch, int *n, int *is_prefill, Sequence **refused);

/* tokens[i] is the token sampled for batch[i], or -1 when batch[i] computed a prefill chunk that
 * did not reach its last token. Advances num_computed_tokens by num_scheduled_tokens for each.
 * The same as scheduler_advance then scheduler_resolve. */
void scheduler_postprocess(Scheduler *s, Sequence **batch, int n, const int32_t *tokens);

/* Asynchronous scheduling splits postprocess in two, so that the next step can be scheduled
 * before this one's tokens are known. advance (once the step is submitted): num_computed_tokens
 * advanced and blocks committed; each running sequence with samples[i] gets a placeholder token
 * (-1, num_pending 1) and is finished with "length" when that token reaches max_tokens or
 * max_model_len (the length is known before the value). resolve (once the tokens are known):
 * fills each placeholder still pending with tokens[i], and finishes with "stop" on an EOS or
 * stop id (also a sequence already finished by length, as postprocess would have). A sequence
 * finished in between (abort, stop string: scheduler_finish) loses its placeholder. */
void scheduler_advance(Scheduler *s, Sequence **batch, int n, const int *samples);
void scheduler_resolve(Scheduler *s, Sequence **batch, int n, const int32_t *tokens);

#endif
