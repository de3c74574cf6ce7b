/* scheduler.c: which sequences run in the next step (nano-vllm's Scheduler plus chunked prefill).
 * The policy is stated in scheduler.h; this file follows it line by line.
 *
 * waiting: a ring-buffer deque (FIFO admission; preempted sequences return at the head).
 * running: an array in admission order (the last one is the newest, the first to be preempted).
 * batch:   the step's sequences, owned here, valid until the next scheduler_schedule().
 *
 * A running sequence is "in prefill" while num_computed_tokens < num_tokens - 1; one with
 * num_computed_tokens == num_tokens - 1 needs exactly its last token computed, which is a decode
 * (this includes a prefill chunk that stopped one token short: it finishes in the decode step). */
#include "engine/scheduler.h"

#include <string.h>

#include "common.h"

struct Scheduler {
    SchedulerConfig cfg;
    int *eos;            /* [cfg.num_eos_token_ids], owned copy (cfg.eos_token_ids points here) */
    BlockManager *bm;    /* borrowed */
    Sequence **waiting;  /* ring buffer [wcap], sequences borrowed */
    int whead, wlen, wcap;
    Sequence **running;  /* [rlen], admission order, borrowed */
    int rlen, rcap;
    Sequence **batch;    /* [blen], the last schedule's result */
    int blen, bcap;
    int64_t num_preemptions;
    int64_t step;        /* steps scheduled so far */
};

/* ---------------------------------------------------------------------------------------------
 * Lifecycle */

Scheduler *scheduler_create(const SchedulerConfig *cfg, BlockManager *bm) {
    CHECK(cfg && bm, "cfg %p, bm %p", (const void *)cfg, (void *)bm);
    CHECK(cfg->max_num_seqs > 0 && cfg->max_num_batched_tokens > 0,
          "max_num_seqs %d, max_num_batched_tokens %d", cfg->max_num_seqs,
          cfg->max_num_batched_tokens);
    Scheduler *s = xcalloc(1, sizeof(*s));
    s->cfg = *cfg;
    if (cfg->num_eos_token_ids > 0) {
        s->eos = xmalloc((size_t)cfg->num_eos_token_ids * sizeof(int));
        memcpy(s->eos, cfg->eos_token_ids, (size_t)cfg->num_eos_token_ids * sizeof(int));
    } else {
        s->cfg.num_eos_token_ids = 0;
    }
    s->cfg.eos_token_ids = s->eos;
    s->bm = bm;
    return s;
}

void scheduler_destroy(Scheduler *s) {
    if (!s) return;
    free(s->eos);
    free(s->waiting);
    free(s->running);
    free(s->batch);
    free(s);
}

/* ---------------------------------------------------------------------------------------------
 * Waiting deque and running list */

static Sequence **waiting_at(Scheduler *s, int i) { return &s->waiting[(s->whead + i) % s->wcap]; }

static void waiting_grow(Scheduler *s) {
    if (s->wlen < s->wcap) return;
    int cap = s->wcap ? 2 * s->wcap : 16;
    Sequence **w = xmalloc((size_t)cap * sizeof(*w));
    for (int i = 0; i < s->wlen; i++) w[i] = *waiting_at(s, i);
    free(s->waiting);
    s->waiting = w;
    s->whead = 0;
    s->wcap = cap;
}

static void waiting_push_back(Scheduler *s, Sequence *seq) {
    waiting_grow(s);
    *waiting_at(s, s->wlen++) = seq;
}

static void waiting_push_front(Scheduler *s, Sequence *seq) {
    waiting_grow(s);
    s->whead = (s->whead + s->wcap - 1) % s->wcap;
    s->waiting[s->whead] = seq;
    s->wlen++;
}

static Sequence *waiting_pop_front(Scheduler *s) {
    CHECK(s->wlen > 0, "waiting queue empty");
    Sequence *seq = s->waiting[s->whead];
    s->whead = (s->whead + 1) % s->wcap;
    s->wlen--;
    return seq;
}

/* Removes seq from waiting (order kept). 1 if it was there. */
static int waiting_remove(Scheduler *s, Sequence *seq) {
    for (int i = 0; i < s->wlen; i++) {
        if (*waiting_at(s, i) != seq) continue;
        for (int j = i; j + 1 < s->wlen; j++) *waiting_at(s, j) = *waiting_at(s, j + 1);
        s->wlen--;
        return 1;
    }
    return 0;
}

/* Removes seq from running (admission order kept). 1 if it was there. */
static int running_remove(Scheduler *s, Sequence *seq) {
    for (int i = 0; i < s->rlen; i++) {
        if (s->running[i] != seq) continue;
        memmove(&s->running[i], &s->running[i + 1], (size_t)(s->rlen - i - 1) * sizeof(Sequence *));
        s->rlen--;
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Queue operations */

void scheduler_add(Scheduler *s, Sequence *seq) {
    CHECK(seq->num_tokens >= 1, "seq %lld has no tokens (the engine validates prompts)",
          (long long)seq->id);
    seq->status = SEQ_WAITING;
    seq->num_scheduled_tokens = 0;
    waiting_push_back(s, seq);
}

static void finish(Scheduler *s, Sequence *seq, CvllmFinishReason reason) {
    seq->status = SEQ_FINISHED;
    seq->finish_reason = reason;
    seq->num_scheduled_tokens = 0;
    block_manager_deallocate(s->bm, seq);
}

void scheduler_remove(Scheduler *s, Sequence *seq) { scheduler_finish(s, seq, CVLLM_FINISH_ABORT); }

int scheduler_is_finished(const Scheduler *s) { return s->wlen == 0 && s->rlen == 0; }
int scheduler_num_running(const Scheduler *s) { return s->rlen; }
int scheduler_num_waiting(const Scheduler *s) { return s->wlen; }
int64_t scheduler_num_preemptions(const Scheduler *s) { return s->num_preemptions; }
int64_t scheduler_current_step(const Scheduler *s) { return s->step; }
Sequence *scheduler_running_at(const Scheduler *s, int i) { return i >= 0 && i < s->rlen ? s->running[i] : NULL; }

/* ---------------------------------------------------------------------------------------------
 * Scheduling */

static void batch_push(Scheduler *s, Sequence *seq, int num_tokens) {
    seq->num_scheduled_tokens = num_tokens;
    block_manager_mark_scheduled(s->bm, seq, seq->num_computed_tokens + num_tokens);
    DA_PUSH(s->batch, s->blen, s->bcap, seq);
}

/* Frees seq's blocks and puts it back at the head of waiting; it is recomputed (prompt and the
 * tokens generated so far) when readmitted. */
static void preempt(Scheduler *s, Sequence *seq) {
    CHECK(running_remove(s, seq), "preempting seq %lld that is not running", (long long)seq->id);
    block_manager_deallocate(s->bm, seq);
    seq->status = SEQ_WAITING;
    seq->num_scheduled_tokens = 0;
    seq->num_preemptions++;
    s->num_preemptions++;
    waiting_push_front(s, seq);
}

/* Takes the head of waiting out and finishes it as refused (it can never fit the cache). */
static int refuse_head(Scheduler *s, Sequence **refused) {
    Sequence *seq = waiting_pop_front(s);
    int need = blocks_for_tokens(seq->num_tokens, block_manager_block_size(s->bm));
    finish(s, seq, CVLLM_FINISH_ERROR);
    if (refused) *refused = seq;
    return cvllm_errorf(CVLLM_ENOMEM,
                        "request %lld needs %d KV-cache blocks for its %d tokens, but the whole "
                        "cache has %d; shorten the prompt or give the KV cache more memory",
                        (long long)seq->id, need, seq->num_tokens, block_manager_num_blocks(s->bm));
}

int scheduler_schedule(Scheduler *s, Sequence ***batch, int *n, int *is_prefill, Sequence **refused) {
    s->blen = 0;
    block_manager_begin_step(s->bm, ++s->step);
    *batch = NULL; /* set on return: the array may grow while the batch is built */
    *n = 0;
    *is_prefill = 0;
    if (refused) *refused = NULL;
    int budget = s->cfg.max_num_batched_tokens;
    int block_size = block_manager_block_size(s->bm), pool = block_manager_num_blocks(s->bm);

    /* 1a. Unfinished prefills (chunked prompts, resumed sequences) continue first. */
    for (int i = 0; i < s->rlen && budget > 0; i++) {
        Sequence *seq = s->running[i];
        if (seq->num_computed_tokens >= seq->num_tokens - 1) continue; /* decode-ready */
        int left = seq->num_tokens - seq->num_computed_tokens;
        int take = left < budget ? left : budget;
        batch_push(s, seq, take);
        budget -= take;
    }

    /* 1b. Admit waiting sequences in FIFO order. A sequence that can never fit is refused only
     * before anything was admitted in this call (so that no admitted sequence is left unscheduled);
     * otherwise admission stops and the refusal comes at the next call. */
    int admitted = 0;
    while (s->wlen > 0 && budget > 0 && s->rlen < s->cfg.max_num_seqs) {
        Sequence *seq = *waiting_at(s, 0);
        if (seq->num_pending) break; /* preempted with a token not yet known: after it is */
        if (blocks_for_tokens(seq->num_tokens, block_size) > pool) {
            if (admitted) break;
            s->blen = 0;
            return refuse_head(s, refused);
        }
        if (!block_manager_can_allocate(s->bm, seq)) {
            if (s->rlen == 0) { /* nothing will ever free a block for it */
                s->blen = 0;
                return refuse_head(s, refused);
            }
            break; /* FIFO: wait until running sequences free blocks */
        }
        waiting_pop_front(s);
        admitted++;
        block_manager_allocate(s->bm, seq);
        if (seq->num_preemptions == 0) seq->first_hit_tokens = seq->num_computed_tokens;
        seq->status = SEQ_RUNNING;
        DA_PUSH(s->running, s->rlen, s->rcap, seq);
        int left = seq->num_tokens - seq->num_computed_tokens;
        int take = left < budget ? left : budget;
        batch_push(s, seq, take);
        budget -= take;
    }
    if (s->blen > 0) {
        *batch = s->batch;
        *n = s->blen;
        *is_prefill = 1;
        return 0;
    }

    /* 2. Decode: one token per running sequence, preempting the newest when blocks run out. */
    budget = s->cfg.max_num_batched_tokens;
    for (int i = 0; i < s->rlen && s->blen < budget; i++) {
        Sequence *seq = s->running[i];
        int self_preempted = 0;
        while (!block_manager_can_append(s->bm, seq)) {
            Sequence *victim = s->running[s->rlen - 1];
            preempt(s, victim);
            if (victim == seq) {
                self_preempted = 1;
                break;
            }
        }
        if (self_preempted) break; /* it was the newest: nothing runs after it */
        block_manager_append(s->bm, seq);
        batch_push(s, seq, 1);
    }
    *batch = s->batch;
    *n = s->blen;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Postprocess */

static int contains(const int *ids, int n, int32_t tok) {
    for (int i = 0; i < n; i++)
        if (ids[i] == tok) return 1;
    return 0;
}

static int contains32(const int32_t *ids, int n, int32_t tok) {
    for (int i = 0; i < n; i++)
        if (ids[i] == tok) return 1;
    return 0;
}

static int is_stop(const Scheduler *s, const Sequence *seq, int32_t tok) {
    const SamplingParams *p = &seq->params;
    return (!p->ignore_eos && contains(s->cfg.eos_token_ids, s->cfg.num_eos_token_ids, tok)) ||
           contains32(p->stop_token_ids, p->num_stop_token_ids, tok);
}

void scheduler_advance(Scheduler *s, Sequence **batch, int n, const int *samples) {
    for (int i = 0; i < n; i++) {
        Sequence *seq = batch[i];
        if (seq->status != SEQ_RUNNING) continue; /* finished between schedule and now */
        seq->num_computed_tokens += seq->num_scheduled_tokens;
        CHECK(seq->num_computed_tokens <= seq->num_tokens, "seq %lld: cached %d > tokens %d",
              (long long)seq->id, seq->num_computed_tokens, seq->num_tokens);
        block_manager_commit(s->bm, seq);
        if (!samples[i]) {
            CHECK(seq->num_computed_tokens < seq->num_tokens,
                  "seq %lld reached its last token but got no sampled token", (long long)seq->id);
            continue;
        }
        CHECK(seq->num_computed_tokens == seq->num_tokens && !seq->num_pending,
              "seq %lld samples with %d of %d tokens computed (%d pending)", (long long)seq->id,
              seq->num_computed_tokens, seq->num_tokens, seq->num_pending);
        sequence_append_token(seq, -1);
        seq->num_pending = 1;
        const SamplingParams *p = &seq->params;
        if ((p->max_tokens > 0 && sequence_num_completion_tokens(seq) >= p->max_tokens) ||
            (s->cfg.max_model_len > 0 && seq->num_tokens >= s->cfg.max_model_len)) {
            running_remove(s, seq);
            finish(s, seq, CVLLM_FINISH_LENGTH); /* the placeholder stays: resolve fills it */
        }
    }
}

void scheduler_resolve(Scheduler *s, Sequence **batch, int n, const int32_t *tokens) {
    for (int i = 0; i < n; i++) {
        Sequence *seq = batch[i];
        if (!seq->num_pending || tokens[i] < 0) continue; /* nothing sampled, or dropped */
        const int32_t tok = tokens[i];
        seq->token_ids[seq->num_tokens - 1] = tok;
        seq->num_pending = 0;
        if (!is_stop(s, seq, tok)) continue;
        seq->stop_token_id = tok;
        if (seq->status == SEQ_FINISHED) /* at its length: a stop id still names the reason */
            seq->finish_reason = CVLLM_FINISH_STOP;
        else /* running, or preempted meanwhile */
            scheduler_finish(s, seq, CVLLM_FINISH_STOP);
    }
}

void scheduler_postprocess(Scheduler *s, Sequence **batch, int n, const int32_t *tokens) {
    int *samples = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) samples[i] = tokens[i] >= 0;
    scheduler_advance(s, batch, n, samples);
    scheduler_resolve(s, batch, n, tokens);
    free(samples);
}

void scheduler_finish(Scheduler *s, Sequence *seq, CvllmFinishReason reason) {
    if (seq->status == SEQ_FINISHED) return;
    sequence_drop_pending(seq); /* a placeholder whose value will not be kept */
    if (!waiting_remove(s, seq)) CHECK(running_remove(s, seq), "seq %lld is neither waiting nor "
                                       "running", (long long)seq->id);
    finish(s, seq, reason);
}
