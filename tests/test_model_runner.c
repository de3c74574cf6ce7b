/* test_model_runner.c: the arrays a step hands a backend (the contract in backend.h), checked
 * directly on batches the real scheduler and block manager build: prefill with prefix hits shared
 * in the same step (slot -1 on every hit token), chunked prefill, decode; cu_seqlens_q/k,
 * context_lens, max lengths, block tables (-1 padded), logits rows and their sampling rows. The
 * CPU backend would compute the same logits from several wrong arrays (a shared block rewritten
 * with the same K/V, say), so only a test of the arrays themselves catches those. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/block_manager.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"

#define BS 16
#define MAX_LEN 256
#define MBPS (MAX_LEN / BS)

typedef struct {
    BlockManager *bm;
    Scheduler *s;
    ModelRunner *r;
} Rig;

static void rig_init(Rig *g, int max_batched) {
    g->bm = block_manager_create(64, BS, 1);
    int eos = 0;
    SchedulerConfig sc = {.max_num_seqs = 8, .max_num_batched_tokens = max_batched,
                          .max_model_len = MAX_LEN, .eos_token_ids = &eos, .num_eos_token_ids = 1};
    g->s = scheduler_create(&sc, g->bm);
    g->r = model_runner_create(NULL, 1000, BS, MAX_LEN, 8, 512);
}

static void rig_free(Rig *g) {
    model_runner_destroy(g->r);
    scheduler_destroy(g->s);
    block_manager_destroy(g->bm);
}

static Sequence *seq(int64_t id, const int32_t *t, int n, float temperature, int64_t seed) {
    SamplingParams p = {.temperature = temperature, .top_p = 1, .repetition_penalty = 1,
                        .seed = (uint64_t)seed, .num_logprobs = -1, .max_tokens = 8};
    return sequence_create(id, t, n, &p);
}

/* Every check of a step's inputs against the sequences, from the definitions alone. */
static void check_inputs(const StepInputs *in, Sequence **b, int n, int is_prefill) {
    assert_int_equal(in->is_prefill, is_prefill);
    assert_int_equal(in->num_seqs, n);
    assert_int_equal(in->cu_seqlens_q[0], 0);
    assert_int_equal(in->cu_seqlens_k[0], 0);
    int width = 1; /* rows as wide as the batch's longest block table */
    for (int i = 0; i < n; i++)
        if (b[i]->num_blocks > width) width = b[i]->num_blocks;
    assert_int_equal(in->max_blocks_per_seq, width);
    assert_true(width <= MBPS);
    int t = 0, max_q = 0, max_k = 0, logits = 0;
    for (int i = 0; i < n; i++) {
        Sequence *s = b[i];
        int start = s->num_computed_tokens, len = s->num_scheduled_tokens, end = start + len;
        assert_int_equal(in->cu_seqlens_q[i + 1] - in->cu_seqlens_q[i], len);
        assert_int_equal(in->cu_seqlens_k[i + 1] - in->cu_seqlens_k[i], end);
        assert_int_equal(in->context_lens[i], end);
        if (len > max_q) max_q = len;
        if (end > max_k) max_k = end;
        for (int p = start; p < end; p++, t++) {
            assert_int_equal(in->input_ids[t], s->token_ids[p]);
            assert_int_equal(in->positions[t], p);
            int64_t want = p < s->num_hit_tokens ? -1
                                                  : (int64_t)s->block_table[p / BS] * BS + p % BS;
            assert_int_equal(in->slot_mapping[t], want);
        }
        const int32_t *row = in->block_tables + (size_t)i * width;
        for (int k = 0; k < width; k++)
            assert_int_equal(row[k], k < s->num_blocks ? s->block_table[k] : -1);
        if (end == s->num_tokens) {
            assert_int_equal(in->logits_indices[logits], t - 1);
            const SamplingRow *sr = &in->sampling[logits];
            assert_true(sr->seed == s->params.seed);
            assert_true(sr->temperature == s->params.temperature);
            assert_int_equal(sr->num_output, s->num_tokens - s->num_prompt_tokens);
            assert_int_equal(sr->num_prompt, s->num_prompt_tokens);
            assert_ptr_equal(sr->prompt_ids, s->token_ids);
            logits++;
        }
    }
    assert_int_equal(in->num_tokens, t);
    assert_int_equal(in->cu_seqlens_q[n], t);
    assert_int_equal(in->max_seqlen_q, max_q);
    assert_int_equal(in->max_seqlen_k, max_k);
    assert_int_equal(in->num_logits, logits);
}

static void finish_step(Rig *g, Sequence **b, int n) {
    int32_t tok[8];
    for (int i = 0; i < n; i++)
        tok[i] = b[i]->num_computed_tokens + b[i]->num_scheduled_tokens == b[i]->num_tokens ? 7 : -1;
    scheduler_postprocess(g->s, b, n, tok);
}

/* Seven prompts with a common 48-token prefix in one step: the first computes it, the six others
 * hit its three blocks in the same step (slot -1), and each computes only its own tail. */
static void test_prefill_shared_prefix_same_step(void **state) {
    (void)state;
    Rig g;
    rig_init(&g, 512);
    int32_t t[7][60];
    Sequence *s[7];
    for (int i = 0; i < 7; i++) {
        for (int k = 0; k < 60; k++) t[i][k] = k < 48 ? 100 + k : 500 + 10 * i + k % 10;
        s[i] = seq(i, t[i], 50 + i, 0.7f, 40 + i);
        scheduler_add(g.s, s[i]);
    }
    Sequence **b;
    int n, pre;
    assert_int_equal(scheduler_schedule(g.s, &b, &n, &pre, NULL), 0);
    assert_int_equal(n, 7);
    assert_int_equal(s[0]->num_hit_tokens, 0);
    for (int i = 1; i < 7; i++) {
        assert_int_equal(s[i]->num_hit_tokens, 48);
        assert_int_equal(s[i]->num_scheduled_tokens, 2 + i);
        for (int k = 0; k < 3; k++) assert_int_equal(s[i]->block_table[k], s[0]->block_table[k]);
    }
    const StepInputs *in = model_runner_prepare_prefill(g.r, b, n);
    check_inputs(in, b, n, 1);
    /* the shared blocks are written once, by the first sequence only */
    int writes_in_shared = 0;
    for (int x = 0; x < in->num_tokens; x++)
        if (in->slot_mapping[x] >= 0 && in->slot_mapping[x] / BS == s[0]->block_table[1]) writes_in_shared++;
    assert_int_equal(writes_in_shared, BS);
    finish_step(&g, b, n);
    /* decode: one token each, at position num_tokens - 1 */
    assert_int_equal(scheduler_schedule(g.s, &b, &n, &pre, NULL), 0);
    assert_int_equal(pre, 0);
    in = model_runner_prepare_decode(g.r, b, n);
    check_inputs(in, b, n, 0);
    for (int i = 0; i < n; i++) assert_int_equal(in->sampling[i].num_output, 1);
    for (int i = 0; i < 7; i++) {
        scheduler_finish(g.s, s[i], CVLLM_FINISH_ABORT);
        sequence_destroy(s[i]);
    }
    assert_int_equal(block_manager_num_free(g.bm), 64);
    rig_free(&g);
}

/* A 70-token prompt in chunks of 32: no logits row until the last chunk; keys grow chunk by
 * chunk; a request admitted after the first chunk hits only the blocks computed so far. */
static void test_chunked_prefill(void **state) {
    (void)state;
    Rig g;
    rig_init(&g, 32);
    int32_t t[70];
    for (int k = 0; k < 70; k++) t[k] = 10 + k;
    Sequence *a = seq(0, t, 70, 0, 1), *c = NULL;
    scheduler_add(g.s, a);
    Sequence **b;
    int n, pre, chunk = 0;
    while (a->num_computed_tokens < 69) {
        assert_int_equal(scheduler_schedule(g.s, &b, &n, &pre, NULL), 0);
        assert_true(pre);
        const StepInputs *in = model_runner_prepare_prefill(g.r, b, n);
        check_inputs(in, b, n, 1);
        if (chunk == 0) {
            assert_int_equal(in->num_logits, 0);
            assert_int_equal(in->cu_seqlens_k[1], 32);
        }
        finish_step(&g, b, n);
        if (chunk++ == 0) {
            c = seq(1, t, 60, 0, 2); /* same first 60 tokens */
            scheduler_add(g.s, c);
        }
    }
    /* c was admitted in the step of a's second chunk: it hits blocks 0-1 (written in the first
     * step) and blocks 2-3 (written by that same step), not block 3 before it was scheduled */
    assert_true(c->num_hit_tokens >= 32);
    scheduler_finish(g.s, a, CVLLM_FINISH_ABORT);
    scheduler_finish(g.s, c, CVLLM_FINISH_ABORT);
    sequence_destroy(a);
    sequence_destroy(c);
    rig_free(&g);
}

/* A prompt whose every block is a hit (the same 48 tokens again): its last token is recomputed for
 * its logits, inside a shared block, so its slot is -1 (the K/V is there already). */
static void test_full_hit_writes_nothing(void **state) {
    (void)state;
    Rig g;
    rig_init(&g, 512);
    int32_t t[48];
    for (int k = 0; k < 48; k++) t[k] = 3 + k;
    Sequence *a = seq(0, t, 48, 0, 1), *c = seq(1, t, 48, 0, 2);
    scheduler_add(g.s, a);
    scheduler_add(g.s, c);
    Sequence **b;
    int n, pre;
    assert_int_equal(scheduler_schedule(g.s, &b, &n, &pre, NULL), 0);
    assert_int_equal(n, 2);
    assert_int_equal(c->num_hit_tokens, 48);
    assert_int_equal(c->num_scheduled_tokens, 1);
    const StepInputs *in = model_runner_prepare_prefill(g.r, b, n);
    check_inputs(in, b, n, 1);
    assert_int_equal(in->num_tokens, 49);
    assert_int_equal(in->slot_mapping[48], -1);
    assert_int_equal(in->positions[48], 47);
    assert_int_equal(in->cu_seqlens_k[2] - in->cu_seqlens_k[1], 48);
    scheduler_finish(g.s, a, CVLLM_FINISH_ABORT);
    scheduler_finish(g.s, c, CVLLM_FINISH_ABORT);
    sequence_destroy(a);
    sequence_destroy(c);
    rig_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_shared_prefix_same_step),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_full_hit_writes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
