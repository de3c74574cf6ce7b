/* test_scheduler.c: the scheduler driven by a fake model.
 *
 * The fake model keeps a fake KV cache: a cell per slot holding (token id, position). Each step
 * writes the cells of the tokens it computes through the block table (skipping prefix-hit tokens,
 * as the model runner does with slot -1), checks that every cell of the sequence's context holds
 * the right (token, position) before "sampling", and then returns a deterministic function of the
 * sequence's tokens. A wrong block table, a hit on a block with other contents, a write into a
 * shared block or a lost block would all fail these checks; a wrong resume or chunking would make
 * the token stream differ from the reference (the same function applied without any cache). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/scheduler.h"

/* ---------------------------------------------------------------------------------------------
 * Harness */

typedef struct {
    int32_t tok, pos;
} KvCell;

typedef int32_t (*FakeModel)(const Sequence *s, void *ctx);

typedef struct {
    int bs, num_blocks;
    BlockManager *bm;
    Scheduler *s;
    SchedulerConfig cfg;
    KvCell *kv;       /* [num_blocks * bs] */
    int *written_at;  /* [num_blocks * bs] step that last wrote the slot */
    int step;
    FakeModel model;
    void *model_ctx;
    Sequence **seqs;  /* all sequences added, for the admission log */
    int nseqs;
    int64_t admissions[256]; /* ids in admission order */
    int nadmissions;
} Harness;

/* Default fake model: tokens in [100, 150), a hash of all the sequence's tokens. */
static int32_t hash_model(const Sequence *s, void *ctx) {
    (void)ctx;
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < s->num_tokens; i++) h = (h ^ (uint64_t)(uint32_t)s->token_ids[i]) * 1099511628211ULL;
    return 100 + (int32_t)(h % 50);
}

static int eos_ids[2] = {2, 3};

static void harness_init(Harness *h, int num_blocks, int bs, int caching, int max_seqs, int budget,
                         int max_model_len) {
    memset(h, 0, sizeof(*h));
    h->bs = bs;
    h->num_blocks = num_blocks;
    h->bm = block_manager_create(num_blocks, bs, caching);
    h->cfg = (SchedulerConfig){.max_num_seqs = max_seqs, .max_num_batched_tokens = budget,
                               .max_model_len = max_model_len, .eos_token_ids = eos_ids,
                               .num_eos_token_ids = 2};
    h->s = scheduler_create(&h->cfg, h->bm);
    h->kv = calloc((size_t)num_blocks * bs, sizeof(KvCell));
    for (int i = 0; i < num_blocks * bs; i++) h->kv[i].tok = h->kv[i].pos = -1;
    h->written_at = calloc((size_t)num_blocks * bs, sizeof(int));
    h->model = hash_model;
    h->seqs = calloc(256, sizeof(Sequence *));
}

static void harness_free(Harness *h) {
    for (int i = 0; i < h->nseqs; i++) sequence_destroy(h->seqs[i]);
    free(h->seqs);
    scheduler_destroy(h->s);
    block_manager_destroy(h->bm);
    free(h->kv);
    free(h->written_at);
}

static SamplingParams sp(int max_tokens) {
    return (SamplingParams){.temperature = 0, .top_p = 1, .seed = -1, .max_tokens = max_tokens,
                            .ignore_eos = 0};
}

static Sequence *add(Harness *h, const int32_t *prompt, int n, const SamplingParams *p) {
    Sequence *s = sequence_create(h->nseqs, prompt, n, p);
    h->seqs[h->nseqs++] = s;
    scheduler_add(h->s, s);
    return s;
}

typedef struct {
    int rc, n, is_prefill;
    Sequence *refused;
    Sequence *batch[64];
    int scheduled[64];
} StepResult;

/* One engine step: schedule, fake forward with KV checks, postprocess. */
static StepResult harness_step(Harness *h) {
    StepResult r;
    memset(&r, 0, sizeof(r));
    SeqStatus before[256];
    for (int i = 0; i < h->nseqs; i++) before[i] = h->seqs[i]->status;
    Sequence **batch;
    r.rc = scheduler_schedule(h->s, &batch, &r.n, &r.is_prefill, &r.refused);
    if (r.rc < 0) return r;
    h->step++;
    for (int i = 0; i < h->nseqs; i++)
        if (before[i] == SEQ_WAITING && h->seqs[i]->status == SEQ_RUNNING)
            h->admissions[h->nadmissions++] = h->seqs[i]->id;
    int32_t tokens[64];
    assert_true(r.n <= 64);
    int total = 0;
    for (int i = 0; i < r.n; i++) {
        Sequence *s = batch[i];
        r.batch[i] = s;
        r.scheduled[i] = s->num_scheduled_tokens;
        assert_int_equal(s->status, SEQ_RUNNING);
        int start = s->num_computed_tokens, len = s->num_scheduled_tokens, end = start + len;
        if (!r.is_prefill) {
            assert_int_equal(len, 1);
            assert_int_equal(start, s->num_tokens - 1);
        }
        assert_true(len >= 1 && end <= s->num_tokens);
        assert_true(s->num_blocks >= blocks_for_tokens(end, h->bs));
        total += len;
        for (int p = start; p < end; p++) {
            int blk = s->block_table[p / h->bs];
            int slot = blk * h->bs + p % h->bs;
            if (p < s->num_hit_tokens) { /* prefix hit: the K/V is there (written by an earlier
                                            step, or earlier in this step's batch) */
                assert_int_equal(h->kv[slot].tok, s->token_ids[p]);
                assert_int_equal(h->kv[slot].pos, p);
                continue;
            }
            assert_int_not_equal(h->written_at[slot], h->step);       /* one writer per step */
            h->written_at[slot] = h->step;
            h->kv[slot].tok = s->token_ids[p];
            h->kv[slot].pos = p;
        }
        tokens[i] = -1;
        if (end == s->num_tokens) {
            for (int p = 0; p < end; p++) { /* attention reads the whole context */
                int slot = s->block_table[p / h->bs] * h->bs + p % h->bs;
                if (h->kv[slot].tok != s->token_ids[p] || h->kv[slot].pos != p)
                    fail_msg("seq %lld pos %d: cache holds (%d, %d), want (%d, %d)",
                             (long long)s->id, p, h->kv[slot].tok, h->kv[slot].pos,
                             s->token_ids[p], p);
            }
            tokens[i] = h->model(s, h->model_ctx);
        }
    }
    assert_true(total <= h->cfg.max_num_batched_tokens);
    assert_true(r.n <= h->cfg.max_num_seqs);
    scheduler_postprocess(h->s, batch, r.n, tokens);
    return r;
}

/* Steps until everything finished; returns the number of steps. */
static int harness_run(Harness *h, int max_steps) {
    int steps = 0;
    while (!scheduler_is_finished(h->s)) {
        StepResult r = harness_step(h);
        assert_true(r.rc == 0 || r.rc == CVLLM_ENOMEM);
        assert_true(++steps < max_steps);
    }
    assert_int_equal(block_manager_num_free(h->bm), h->num_blocks);
    return steps;
}

/* The same tokens without any cache or scheduler. */
static void reference_generate(const int32_t *prompt, int n, const SamplingParams *p,
                               int max_model_len, int32_t *out, int *out_n) {
    SamplingParams q = *p;
    Sequence *s = sequence_create(0, prompt, n, &q);
    for (;;) {
        int32_t t = hash_model(s, NULL);
        sequence_append_token(s, t);
        int stop = (!p->ignore_eos && (t == 2 || t == 3));
        if (sequence_num_completion_tokens(s) >= p->max_tokens) stop = 1;
        if (max_model_len > 0 && s->num_tokens >= max_model_len) stop = 1;
        if (stop) break;
    }
    memcpy(out, s->token_ids, (size_t)s->num_tokens * sizeof(int32_t));
    *out_n = s->num_tokens;
    sequence_destroy(s);
}

static void assert_matches_reference(const Sequence *s, int max_model_len) {
    int32_t want[512];
    int n;
    reference_generate(s->token_ids, s->num_prompt_tokens, &s->params, max_model_len, want, &n);
    assert_int_equal(s->num_tokens, n);
    assert_memory_equal(s->token_ids, want, (size_t)n * sizeof(int32_t));
}

static void iota(int32_t *x, int n, int base) {
    for (int i = 0; i < n; i++) x[i] = base + i;
}

/* ---------------------------------------------------------------------------------------------
 * Tests */

static void test_prefill_before_decode(void **state) {
    (void)state;
    Harness h;
    harness_init(&h, 64, 4, 1, 8, 64, 1000);
    int32_t pa[5], pb[7], pc[3];
    iota(pa, 5, 10), iota(pb, 7, 20), iota(pc, 3, 30);
    SamplingParams p = sp(5);
    Sequence *a = add(&h, pa, 5, &p), *b = add(&h, pb, 7, &p);
    StepResult r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 2 && r.batch[0] == a && r.batch[1] == b);
    assert_int_equal(r.scheduled[0], 5);
    assert_int_equal(r.scheduled[1], 7);
    Sequence *c = add(&h, pc, 3, &p);
    r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 1 && r.batch[0] == c && r.scheduled[0] == 3);
    r = harness_step(&h);
    assert_true(!r.is_prefill && r.n == 3);
    assert_true(r.batch[0] == a && r.batch[1] == b && r.batch[2] == c);
    harness_run(&h, 100);
    assert_matches_reference(a, 1000);
    assert_matches_reference(b, 1000);
    assert_matches_reference(c, 1000);
    harness_free(&h);
}

static void test_max_num_seqs(void **state) {
    (void)state;
    Harness h;
    harness_init(&h, 64, 4, 1, 2, 64, 1000);
    int32_t pr[4];
    iota(pr, 4, 10);
    SamplingParams p2 = sp(2), p5 = sp(5);
    Sequence *a = add(&h, pr, 4, &p2), *b = add(&h, pr, 4, &p5), *c = add(&h, pr, 4, &p5);
    StepResult r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 2);
    assert_int_equal(scheduler_num_waiting(h.s), 1);
    r = harness_step(&h); /* c still waits: running is at max_num_seqs */
    assert_true(!r.is_prefill && r.n == 2);
    assert_int_equal(a->status, SEQ_FINISHED); /* max_tokens 2 */
    assert_int_equal(a->finish_reason, CVLLM_FINISH_LENGTH);
    r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 1 && r.batch[0] == c);
    harness_run(&h, 100);
    assert_matches_reference(b, 1000);
    assert_matches_reference(c, 1000);
    harness_free(&h);
}

static void test_token_budget(void **state) {
    (void)state;
    Harness h;
    harness_init(&h, 64, 4, 1, 8, 10, 1000);
    int32_t pa[6], pb[6];
    iota(pa, 6, 10), iota(pb, 6, 40);
    SamplingParams p = sp(4);
    Sequence *a = add(&h, pa, 6, &p), *b = add(&h, pb, 6, &p);
    StepResult r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 2 && r.scheduled[0] == 6 && r.scheduled[1] == 4);
    r = harness_step(&h); /* b's unfinished prefill continues before anything else */
    assert_true(r.is_prefill && r.n == 1 && r.batch[0] == b && r.scheduled[0] == 2);
    r = harness_step(&h);
    assert_true(!r.is_prefill && r.n == 2);
    harness_run(&h, 100);
    assert_matches_reference(a, 1000);
    assert_matches_reference(b, 1000);
    harness_free(&h);

    /* Decode: no more sequences than the token budget. */
    harness_init(&h, 64, 4, 1, 8, 2, 1000);
    int32_t one[1] = {5};
    Sequence *x = add(&h, one, 1, &p), *y = add(&h, one, 1, &p), *z = add(&h, one, 1, &p);
    r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 2);
    r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 1 && r.batch[0] == z);
    r = harness_step(&h);
    assert_true(!r.is_prefill && r.n == 2 && r.batch[0] == x && r.batch[1] == y);
    harness_run(&h, 100);
    assert_matches_reference(x, 1000);
    assert_matches_reference(z, 1000);
    harness_free(&h);
}

static void test_chunked_prefill(void **state) {
    (void)state;
    int32_t prompt[37];
    for (int i = 0; i < 37; i++) prompt[i] = (i * 31 + 7) % 97;
    SamplingParams p = sp(10);
    p.ignore_eos = 1;
    /* Chunked: 8, 8, 8, 8, 5, then decode. */
    Harness h;
    harness_init(&h, 64, 4, 1, 8, 8, 1000);
    Sequence *s = add(&h, prompt, 37, &p);
    const int chunks[5] = {8, 8, 8, 8, 5};
    for (int i = 0; i < 5; i++) {
        StepResult r = harness_step(&h);
        assert_true(r.is_prefill && r.n == 1 && r.scheduled[0] == chunks[i]);
        assert_int_equal(s->num_tokens, i < 4 ? 37 : 38); /* a token only after the last chunk */
    }
    StepResult r = harness_step(&h);
    assert_true(!r.is_prefill && r.n == 1);
    harness_run(&h, 100);
    int32_t chunked[64];
    int n = s->num_tokens;
    memcpy(chunked, s->token_ids, (size_t)n * sizeof(int32_t));
    harness_free(&h);
    /* Unchunked: the same stream. */
    harness_init(&h, 64, 4, 1, 8, 64, 1000);
    s = add(&h, prompt, 37, &p);
    r = harness_step(&h);
    assert_true(r.is_prefill && r.scheduled[0] == 37);
    harness_run(&h, 100);
    assert_int_equal(s->num_tokens, n);
    assert_memory_equal(s->token_ids, chunked, (size_t)n * sizeof(int32_t));
    assert_matches_reference(s, 1000);
    harness_free(&h);

    /* A chunk that stops one token short: the last prompt token is computed by a decode step. */
    harness_init(&h, 64, 4, 1, 8, 8, 1000);
    int32_t pa[16], pb[9];
    iota(pa, 16, 1), iota(pb, 9, 50);
    Sequence *a = add(&h, pa, 16, &p), *b = add(&h, pb, 9, &p);
    r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 1 && r.batch[0] == a);
    r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 1 && r.batch[0] == a);
    r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 1 && r.batch[0] == b && r.scheduled[0] == 8);
    assert_int_equal(b->num_computed_tokens, 8);
    assert_int_equal(b->num_tokens, 9);
    r = harness_step(&h);
    assert_true(!r.is_prefill && r.n == 2);
    harness_run(&h, 100);
    assert_matches_reference(a, 1000);
    assert_matches_reference(b, 1000);
    harness_free(&h);
}

static void run_preemption(int caching) {
    /* bs 4, 6 blocks. a, b: prompts of 8 (2 blocks each), 12 tokens each to generate (5 blocks at
     * the end). c waits (max_num_seqs 2). Blocks run out while both grow: b, the newest, is
     * preempted, goes back to the head of waiting (before c), and is resumed after a finishes,
     * re-prefilled over its prompt and the tokens it had generated. */
    Harness h;
    harness_init(&h, 6, 4, caching, 2, 64, 1000);
    int32_t pa[8], pb[8], pc[8];
    iota(pa, 8, 10), iota(pb, 8, 30), iota(pc, 8, 60);
    SamplingParams p = sp(12);
    p.ignore_eos = 1;
    Sequence *a = add(&h, pa, 8, &p), *b = add(&h, pb, 8, &p), *c = add(&h, pc, 8, &p);
    int preempted_at = -1, resumed = 0;
    for (int step = 0; step < 200 && !scheduler_is_finished(h.s); step++) {
        int b_running = b->status == SEQ_RUNNING;
        int b_generated = sequence_num_completion_tokens(b);
        StepResult r = harness_step(&h);
        assert_int_equal(r.rc, 0);
        if (b_running && b->status == SEQ_WAITING) {
            preempted_at = step;
            assert_int_equal(b->num_blocks, 0);
            assert_int_equal(b->num_computed_tokens, 0);
            assert_int_equal(sequence_num_completion_tokens(b), b_generated); /* kept */
            assert_true(a->status == SEQ_RUNNING && c->status == SEQ_WAITING);
            assert_int_equal(scheduler_num_waiting(h.s), 2);
        }
        if (preempted_at >= 0 && !resumed && b->status == SEQ_RUNNING) {
            resumed = 1;
            assert_true(r.is_prefill);
            assert_int_equal(a->status, SEQ_FINISHED);
            /* re-prefilled over prompt + generated tokens (minus any prefix-cache hit) */
            assert_true(b->num_tokens > b->num_prompt_tokens);
            int i = r.batch[0] == b ? 0 : 1;
            assert_true(r.batch[i] == b);
            int before = 8 + b_generated, hit = b->num_hit_tokens;
            assert_int_equal(r.scheduled[i], before - (hit < before - 1 ? hit : before - 1));
            if (!caching) assert_int_equal(b->num_hit_tokens, 0);
        }
    }
    assert_true(preempted_at >= 0 && resumed);
    assert_true(scheduler_is_finished(h.s));
    assert_true(scheduler_num_preemptions(h.s) >= 1);
    assert_true(b->num_preemptions >= 1);
    assert_int_equal(a->num_preemptions, 0);
    /* b was resumed before c was first admitted (head of waiting) */
    int b_second = -1, c_first = -1, nb = 0;
    for (int i = 0; i < h.nadmissions; i++) {
        if (h.admissions[i] == b->id && ++nb == 2) b_second = i;
        if (h.admissions[i] == c->id && c_first < 0) c_first = i;
    }
    assert_true(b_second >= 0 && c_first > b_second);
    assert_matches_reference(a, 1000);
    assert_matches_reference(b, 1000);
    assert_matches_reference(c, 1000);
    assert_int_equal(block_manager_num_free(h.bm), 6);
    harness_free(&h);
}

static void test_preemption(void **state) {
    (void)state;
    run_preemption(1);
    run_preemption(0);
}

static void test_self_preemption(void **state) {
    (void)state;
    /* 3 blocks of 4. a: 6 tokens (2 blocks, room up to 8), b: 4 tokens (1 block, full). After the
     * prefill b needs a second block first: b is the newest, so it preempts itself. */
    Harness h;
    harness_init(&h, 3, 4, 1, 4, 64, 1000);
    int32_t pa[6], pb[4];
    iota(pa, 6, 10), iota(pb, 4, 40);
    SamplingParams p = sp(3);
    p.ignore_eos = 1;
    Sequence *a = add(&h, pa, 6, &p), *b = add(&h, pb, 4, &p);
    StepResult r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 2);
    assert_int_equal(block_manager_num_free(h.bm), 0);
    r = harness_step(&h);
    assert_true(!r.is_prefill && r.n == 1 && r.batch[0] == a);
    assert_int_equal(b->status, SEQ_WAITING);
    assert_int_equal(scheduler_num_preemptions(h.s), 1);
    harness_run(&h, 100);
    assert_matches_reference(a, 1000);
    assert_matches_reference(b, 1000);
    harness_free(&h);
}

static void test_refuse_too_big(void **state) {
    (void)state;
    Harness h;
    harness_init(&h, 4, 4, 1, 4, 64, 1000);
    int32_t big[17], small[4];
    iota(big, 17, 1), iota(small, 4, 50);
    SamplingParams p = sp(3);
    Sequence *x = add(&h, small, 4, &p);
    StepResult r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 1);
    Sequence *a = add(&h, big, 17, &p), *b = add(&h, small, 4, &p);
    r = harness_step(&h); /* refused at once, even with x running */
    assert_int_equal(r.rc, CVLLM_ENOMEM);
    assert_true(r.refused == a);
    assert_int_equal(a->status, SEQ_FINISHED);
    assert_int_equal(a->finish_reason, CVLLM_FINISH_ERROR);
    assert_int_equal(a->num_blocks, 0);
    assert_int_equal(scheduler_num_waiting(h.s), 1);
    r = harness_step(&h);
    assert_true(r.rc == 0 && r.is_prefill && r.n == 1 && r.batch[0] == b);
    harness_run(&h, 100);
    assert_matches_reference(x, 1000);
    assert_matches_reference(b, 1000);
    assert_int_equal(block_manager_num_free(h.bm), 4);
    harness_free(&h);
}

/* Scripted model: the completion tokens come from a per-sequence script. */
static int32_t scripts[8][8] = {
    {5, 2, 9, 9, 9, 9, 9, 9},  /* eos 2 */
    {5, 2, 9, 9, 9, 9, 9, 9},  /* eos ignored */
    {5, 7, 9, 9, 9, 9, 9, 9},  /* stop id 7 */
    {5, 6, 8, 9, 9, 9, 9, 9},  /* max_tokens 3 */
    {5, 6, 8, 9, 9, 9, 9, 9},  /* max_model_len */
    {3, 9, 9, 9, 9, 9, 9, 9},  /* the second eos id */
};

static int32_t script_model(const Sequence *s, void *ctx) {
    (void)ctx;
    return scripts[s->id][sequence_num_completion_tokens(s)];
}

static void test_stop_conditions(void **state) {
    (void)state;
    Harness h;
    harness_init(&h, 64, 4, 1, 8, 64, 10);
    h.model = script_model;
    int32_t pr[8];
    iota(pr, 8, 10);
    int32_t stop7[1] = {7};
    SamplingParams p0 = sp(8), p1 = sp(4), p2 = sp(8), p3 = sp(3), p4 = sp(100), p5 = sp(8);
    p1.ignore_eos = 1;
    p2.stop_token_ids = stop7;
    p2.num_stop_token_ids = 1;
    Sequence *s[6];
    s[0] = add(&h, pr, 6, &p0);
    s[1] = add(&h, pr, 6, &p1);
    s[2] = add(&h, pr, 6, &p2);
    s[3] = add(&h, pr, 6, &p3);
    s[4] = add(&h, pr, 8, &p4);
    s[5] = add(&h, pr, 6, &p5);
    harness_run(&h, 100);
    const CvllmFinishReason want_reason[6] = {CVLLM_FINISH_STOP, CVLLM_FINISH_LENGTH,
                                              CVLLM_FINISH_STOP, CVLLM_FINISH_LENGTH,
                                              CVLLM_FINISH_LENGTH, CVLLM_FINISH_STOP};
    const int want_completion[6] = {2, 4, 2, 3, 2, 1};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(s[i]->status, SEQ_FINISHED);
        assert_int_equal(s[i]->finish_reason, want_reason[i]);
        assert_int_equal(sequence_num_completion_tokens(s[i]), want_completion[i]);
        assert_int_equal(s[i]->num_blocks, 0);
    }
    assert_int_equal(s[1]->token_ids[7], 2); /* eos kept in the stream, generation went on */
    assert_int_equal(s[4]->num_tokens, 10);
    assert_int_equal(scheduler_num_running(h.s), 0);
    harness_free(&h);
}

static void test_abort(void **state) {
    (void)state;
    Harness h;
    harness_init(&h, 8, 4, 1, 1, 64, 1000);
    int32_t pr[6];
    iota(pr, 6, 10);
    SamplingParams p = sp(8);
    Sequence *a = add(&h, pr, 6, &p), *b = add(&h, pr, 6, &p);
    StepResult r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 1 && r.batch[0] == a);
    assert_int_equal(block_manager_num_free(h.bm), 6);
    scheduler_remove(h.s, b); /* waiting */
    assert_int_equal(b->status, SEQ_FINISHED);
    assert_int_equal(b->finish_reason, CVLLM_FINISH_ABORT);
    assert_int_equal(scheduler_num_waiting(h.s), 0);
    scheduler_remove(h.s, a); /* running */
    assert_int_equal(a->status, SEQ_FINISHED);
    assert_int_equal(a->finish_reason, CVLLM_FINISH_ABORT);
    assert_int_equal(scheduler_num_running(h.s), 0);
    assert_int_equal(block_manager_num_free(h.bm), 8);
    assert_true(scheduler_is_finished(h.s));
    scheduler_remove(h.s, a); /* twice: no effect */
    r = harness_step(&h);
    assert_true(r.rc == 0 && r.n == 0);
    harness_free(&h);
}

static void test_prefix_cache_across_requests(void **state) {
    (void)state;
    Harness h;
    harness_init(&h, 32, 4, 1, 8, 64, 1000);
    int32_t pr[14];
    iota(pr, 14, 10);
    SamplingParams p = sp(5);
    p.ignore_eos = 1;
    Sequence *a = add(&h, pr, 12, &p);
    harness_run(&h, 100);
    Sequence *b = add(&h, pr, 12, &p); /* the whole prompt hits */
    StepResult r = harness_step(&h);
    assert_true(r.is_prefill && r.n == 1 && r.scheduled[0] == 1);
    assert_int_equal(b->num_hit_tokens, 12);
    assert_int_equal(b->first_hit_tokens, 11);
    harness_run(&h, 100);
    Sequence *c = add(&h, pr, 14, &p); /* 3 blocks hit, 2 tokens computed */
    r = harness_step(&h);
    assert_true(r.is_prefill && r.scheduled[0] == 2);
    assert_int_equal(c->first_hit_tokens, 12);
    harness_run(&h, 100);
    assert_memory_equal(a->token_ids, b->token_ids, (size_t)a->num_tokens * sizeof(int32_t));
    assert_matches_reference(a, 1000);
    assert_matches_reference(b, 1000);
    assert_matches_reference(c, 1000);
    /* The generated tokens' blocks were committed too: a prompt equal to a's whole stream (17
     * tokens: 4 full blocks) hits the 4 blocks, including the one filled by generated tokens. */
    Sequence *d = add(&h, a->token_ids, 16, &p);
    harness_step(&h);
    assert_int_equal(d->num_hit_tokens, 16);
    harness_run(&h, 100);
    harness_free(&h);
}

static void test_random_stress(void **state) {
    (void)state;
    uint64_t rs = 12345;
#define RND(n) ((int)((rs = rs * 6364136223846793005ULL + 1442695040888963407ULL) >> 33) % (n))
    int64_t total_preemptions = 0;
    for (int config = 0; config < 24; config++) {
        int caching = config % 2, budgets[3] = {8, 16, 64};
        Harness h;
        harness_init(&h, 18, 4, caching, 2 + config % 5, budgets[config % 3], 1000);
        int32_t prefixes[3][24];
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 24; j++) prefixes[i][j] = RND(40) + 10;
        int to_add = 40, added = 0, steps = 0;
        while (added < to_add || !scheduler_is_finished(h.s)) {
            while (added < to_add && RND(3) == 0) {
                int32_t prompt[48];
                int shared = RND(25), n = shared + 1 + RND(16);
                for (int j = 0; j < n; j++)
                    prompt[j] = j < shared ? prefixes[RND(1) + added % 3][j] : RND(40) + 10;
                SamplingParams p = sp(1 + RND(20));
                p.ignore_eos = RND(2);
                add(&h, prompt, n, &p);
                added++;
            }
            StepResult r = harness_step(&h);
            assert_int_equal(r.rc, 0); /* 40 + 20 tokens = 15 blocks: always fits */
            assert_true(++steps < 5000);
        }
        for (int i = 0; i < h.nseqs; i++) {
            assert_int_equal(h.seqs[i]->status, SEQ_FINISHED);
            assert_matches_reference(h.seqs[i], 1000);
        }
        assert_int_equal(block_manager_num_free(h.bm), 18);
        total_preemptions += scheduler_num_preemptions(h.s);
        if (caching) assert_true(block_manager_hits(h.bm) > 0);
        harness_free(&h);
    }
    assert_true(total_preemptions > 10);
#undef RND
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_before_decode),
        cmocka_unit_test(test_max_num_seqs),
        cmocka_unit_test(test_token_budget),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_self_preemption),
        cmocka_unit_test(test_refuse_too_big),
        cmocka_unit_test(test_stop_conditions),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_prefix_cache_across_requests),
        cmocka_unit_test(test_random_stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
