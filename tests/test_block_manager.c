/* test_block_manager.c: the block manager's lifecycles (allocate, prefix hits, chained hashes,
 * collisions, append, commit, deallocate, eviction of freed blocks, can_allocate accounting). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "engine/block_manager.h"

#define BS 4

static Sequence *make_seq(int64_t id, const int32_t *toks, int n) {
    SamplingParams p = {.temperature = 0, .top_p = 1, .seed = -1, .max_tokens = 16};
    return sequence_create(id, toks, n, &p);
}

/* What the engine does for a prefill of the whole sequence: the scheduler marks its tokens as
 * scheduled in this step, the step computes the KV, postprocess commits the blocks. */
static void compute_all(BlockManager *bm, Sequence *s) {
    block_manager_mark_scheduled(bm, s, s->num_tokens);
    s->num_computed_tokens = s->num_tokens;
    block_manager_commit(bm, s);
}

static void test_allocate(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(10, BS, 1);
    int32_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    Sequence *s = make_seq(0, t, 10);
    assert_true(block_manager_can_allocate(bm, s));
    block_manager_allocate(bm, s);
    assert_int_equal(s->num_blocks, 3);
    assert_int_equal(block_manager_num_free(bm), 7);
    assert_int_equal(s->num_computed_tokens, 0);
    assert_int_equal(s->num_hit_tokens, 0);
    for (int i = 0; i < 3; i++) { /* the full blocks are registered at once, the partial not */
        assert_int_equal(block_manager_ref_count(bm, s->block_table[i]), 1);
        assert_int_equal(block_manager_block_hash(bm, s->block_table[i], NULL), i < 2);
    }
    assert_int_equal(block_manager_queries(bm), 1); /* 2 full blocks; the first one missed */
    assert_int_equal(block_manager_hits(bm), 0);
    block_manager_deallocate(bm, s);
    assert_int_equal(block_manager_num_free(bm), 10);
    assert_int_equal(s->num_blocks, 0);
    sequence_destroy(s);
    block_manager_destroy(bm);
}

/* A prompt's full blocks are registered when allocated, but found by a lookup only from the step
 * that is scheduled to write them on (a request admitted later in that step shares them); blocks
 * filled by generated tokens are registered once computed (commit). */
static void test_hash_registration_and_readiness(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(12, BS, 1);
    int32_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    Sequence *s = make_seq(0, t, 10), *same = make_seq(1, t, 10), *later = make_seq(2, t, 10);
    block_manager_begin_step(bm, 1);
    block_manager_allocate(bm, s);
    uint64_t h;
    uint64_t h0 = block_hash(0, t, BS);
    assert_int_equal(block_manager_block_hash(bm, s->block_table[0], &h), 1);
    assert_true(h == h0);
    assert_int_equal(block_manager_block_hash(bm, s->block_table[1], &h), 1);
    assert_true(h == block_hash(h0, t + 4, BS)); /* chained on block 0's hash */
    assert_int_equal(block_manager_block_hash(bm, s->block_table[2], &h), 0); /* partial */
    /* not scheduled yet: no hit */
    block_manager_allocate(bm, same);
    assert_int_equal(same->num_hit_tokens, 0);
    block_manager_deallocate(bm, same);
    /* a chunk of 6 tokens scheduled in step 1: block 0 becomes hittable in step 1, block 1 not */
    block_manager_mark_scheduled(bm, s, 6);
    block_manager_allocate(bm, later);
    assert_int_equal(later->num_hit_tokens, 4);
    assert_int_equal(later->block_table[0], s->block_table[0]);
    block_manager_deallocate(bm, later);
    /* step 2 schedules the rest: both full blocks are hits from then on */
    block_manager_begin_step(bm, 2);
    block_manager_mark_scheduled(bm, s, 10);
    s->num_computed_tokens = 10;
    block_manager_commit(bm, s);
    block_manager_allocate(bm, later);
    assert_int_equal(later->num_hit_tokens, 8);
    block_manager_deallocate(bm, later);
    /* The block filled by generated tokens gets its hash once its KV is computed. */
    sequence_append_token(s, 11);
    sequence_append_token(s, 12); /* 12 tokens: block 2 full, but tokens 10, 11 not computed */
    block_manager_commit(bm, s);
    assert_int_equal(block_manager_block_hash(bm, s->block_table[2], NULL), 0);
    s->num_computed_tokens = 12;
    block_manager_commit(bm, s);
    assert_int_equal(block_manager_block_hash(bm, s->block_table[2], &h), 1);
    int32_t b2[4] = {9, 10, 11, 12};
    assert_true(h == block_hash(block_hash(h0, t + 4, BS), b2, BS));
    block_manager_deallocate(bm, s);
    sequence_destroy(s);
    sequence_destroy(same);
    sequence_destroy(later);
    block_manager_destroy(bm);
}

/* A registered block that no step wrote is dropped when freed (nothing to find there), and a
 * failed step's blocks stop being hits. */
static void test_unwritten_blocks_forgotten(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(8, BS, 1);
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    Sequence *a = make_seq(0, t, 8), *b = make_seq(1, t, 8);
    block_manager_begin_step(bm, 1);
    block_manager_allocate(bm, a);
    int b0 = a->block_table[0];
    block_manager_deallocate(bm, a); /* preempted before any step wrote it */
    assert_int_equal(block_manager_block_hash(bm, b0, NULL), 0);
    block_manager_allocate(bm, a);
    block_manager_mark_scheduled(bm, a, 8);
    block_manager_forget_step(bm, 1); /* the step failed */
    block_manager_allocate(bm, b);
    assert_int_equal(b->num_hit_tokens, 0);
    block_manager_deallocate(bm, a);
    block_manager_deallocate(bm, b);
    sequence_destroy(a);
    sequence_destroy(b);
    block_manager_destroy(bm);
}

/* A preempted sequence admitted again is marked afresh: its blocks of the first life were taken
 * by another sequence meanwhile, so the new ones become hittable only when a step of the second
 * life is scheduled to write them (mark_scheduled's per-sequence watermark starts over). */
static void test_marks_start_over_after_preemption(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(3, BS, 1);
    int32_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, u[9] = {11, 12, 13, 14, 15, 16, 17, 18, 19};
    Sequence *a = make_seq(0, t, 9), *other = make_seq(1, u, 9), *same = make_seq(2, t, 9);
    block_manager_begin_step(bm, 1);
    block_manager_allocate(bm, a);
    block_manager_mark_scheduled(bm, a, 8); /* both full blocks scheduled in step 1 */
    assert_int_equal(a->num_marked_blocks, 2);
    block_manager_deallocate(bm, a); /* preempted */
    assert_int_equal(a->num_marked_blocks, 0);
    block_manager_begin_step(bm, 2);
    block_manager_allocate(bm, other); /* takes every block: a's cached ones are evicted */
    assert_int_equal(other->num_hit_tokens, 0);
    block_manager_deallocate(bm, other);
    block_manager_begin_step(bm, 3);
    block_manager_allocate(bm, a); /* the second life: no hit, its full blocks not yet written */
    assert_int_equal(a->num_hit_tokens, 0);
    assert_int_equal(a->num_marked_blocks, 0);
    block_manager_mark_scheduled(bm, a, 9);
    assert_int_equal(a->num_marked_blocks, 2);
    block_manager_deallocate(bm, a); /* its blocks stay cached: step 3 writes them */
    block_manager_allocate(bm, same);
    assert_int_equal(same->num_hit_tokens, 8);
    block_manager_deallocate(bm, same);
    sequence_destroy(a);
    sequence_destroy(other);
    sequence_destroy(same);
    block_manager_destroy(bm);
}

static void test_hash_is_xxh64_of_le_bytes(void **state) {
    (void)state;
    /* Different prev hash or tokens give different values; the function is deterministic. */
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
    assert_true(block_hash(0, a, 4) == block_hash(0, a, 4));
    assert_true(block_hash(0, a, 4) != block_hash(1, a, 4));
    assert_true(block_hash(0, a, 4) != block_hash(0, b, 4));
    /* Long blocks (more than one internal chunk) hash consistently. */
    int32_t big[300];
    for (int i = 0; i < 300; i++) big[i] = i * 7919;
    uint64_t h1 = block_hash(5, big, 300);
    big[299]++;
    assert_true(h1 != block_hash(5, big, 300));
}

static void test_prefix_hit_ref_count(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(10, BS, 1);
    int32_t ta[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    int32_t tb[11] = {1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22};
    Sequence *a = make_seq(0, ta, 10), *b = make_seq(1, tb, 11);
    block_manager_allocate(bm, a);
    compute_all(bm, a);
    assert_int_equal(block_manager_num_free(bm), 7);
    assert_true(block_manager_can_allocate(bm, b));
    block_manager_allocate(bm, b);
    assert_int_equal(b->block_table[0], a->block_table[0]);
    assert_int_equal(b->block_table[1], a->block_table[1]);
    assert_int_not_equal(b->block_table[2], a->block_table[2]);
    assert_int_equal(block_manager_ref_count(bm, a->block_table[0]), 2);
    assert_int_equal(block_manager_ref_count(bm, a->block_table[1]), 2);
    assert_int_equal(block_manager_ref_count(bm, b->block_table[2]), 1);
    assert_int_equal(b->num_hit_tokens, 8);
    assert_int_equal(b->num_computed_tokens, 8);
    assert_int_equal(block_manager_num_free(bm), 6);
    /* a: 2 queries (miss at the first), b: 2 queries, 2 hits */
    assert_int_equal(block_manager_queries(bm), 3);
    assert_int_equal(block_manager_hits(bm), 2);
    /* Deallocate frees only at ref count 0. */
    block_manager_deallocate(bm, a);
    assert_int_equal(block_manager_ref_count(bm, b->block_table[0]), 1);
    assert_int_equal(block_manager_ref_count(bm, b->block_table[1]), 1);
    assert_int_equal(block_manager_num_free(bm), 7); /* only a's private block 2 */
    block_manager_deallocate(bm, b);
    assert_int_equal(block_manager_ref_count(bm, b->block_table[0]), 0);
    assert_int_equal(block_manager_num_free(bm), 10);
    sequence_destroy(a);
    sequence_destroy(b);
    block_manager_destroy(bm);
}

static void test_full_prompt_hit_recomputes_last_token(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(10, BS, 1);
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    Sequence *a = make_seq(0, t, 8), *b = make_seq(1, t, 8);
    block_manager_allocate(bm, a);
    compute_all(bm, a);
    block_manager_allocate(bm, b);
    assert_int_equal(b->num_blocks, 2);
    assert_int_equal(b->num_hit_tokens, 8);
    assert_int_equal(b->num_computed_tokens, 7);
    assert_int_equal(block_manager_num_free(bm), 8);
    /* After the step, commit has nothing new; the next token needs a new block. */
    b->num_computed_tokens = 8;
    block_manager_commit(bm, b);
    sequence_append_token(b, 9);
    assert_true(block_manager_can_append(bm, b));
    block_manager_append(bm, b);
    assert_int_equal(b->num_blocks, 3);
    assert_int_equal(block_manager_ref_count(bm, b->block_table[2]), 1);
    block_manager_deallocate(bm, a);
    block_manager_deallocate(bm, b);
    assert_int_equal(block_manager_num_free(bm), 10);
    sequence_destroy(a);
    sequence_destroy(b);
    block_manager_destroy(bm);
}

static void test_chained_hash_separates_contexts(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(10, BS, 1);
    int32_t ta[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t tb[8] = {9, 9, 9, 9, 5, 6, 7, 8}; /* same second block, other first block */
    int32_t tc[8] = {5, 6, 7, 8, 5, 6, 7, 8}; /* a's second block at position 0 */
    Sequence *a = make_seq(0, ta, 8), *b = make_seq(1, tb, 8), *c = make_seq(2, tc, 8);
    block_manager_allocate(bm, a);
    compute_all(bm, a);
    block_manager_allocate(bm, b);
    assert_int_equal(b->num_hit_tokens, 0);
    assert_int_equal(block_manager_hits(bm), 0);
    compute_all(bm, b);
    uint64_t ha, hb;
    assert_true(block_manager_block_hash(bm, a->block_table[1], &ha));
    assert_true(block_manager_block_hash(bm, b->block_table[1], &hb));
    assert_true(ha != hb);
    assert_int_not_equal(a->block_table[1], b->block_table[1]);
    block_manager_allocate(bm, c);
    assert_int_equal(c->num_hit_tokens, 0);
    assert_int_equal(block_manager_hits(bm), 0);
    block_manager_deallocate(bm, a);
    block_manager_deallocate(bm, b);
    block_manager_deallocate(bm, c);
    sequence_destroy(a);
    sequence_destroy(b);
    sequence_destroy(c);
    block_manager_destroy(bm);
}

static uint64_t constant_hash(uint64_t prev, const int32_t *tokens, int n) {
    (void)prev;
    (void)tokens;
    (void)n;
    return 42;
}

static void test_forced_collision_rejected_by_tokens(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(10, BS, 1);
    block_manager_set_hash_fn(bm, constant_hash);
    int32_t ta[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t tb[8] = {10, 11, 12, 13, 14, 15, 16, 17};
    int32_t tr[8] = {1, 2, 3, 4, 1, 2, 3, 4}; /* a's first block repeated at position 1 */
    Sequence *a = make_seq(0, ta, 8), *b = make_seq(1, tb, 8), *a2 = make_seq(2, ta, 8),
             *r = make_seq(3, tr, 8);
    block_manager_allocate(bm, a);
    compute_all(bm, a);
    uint64_t h;
    assert_true(block_manager_block_hash(bm, a->block_table[0], &h) && h == 42);
    int64_t q0 = block_manager_queries(bm);
    block_manager_allocate(bm, b);
    assert_int_equal(b->num_hit_tokens, 0);
    assert_int_not_equal(b->block_table[0], a->block_table[0]);
    assert_int_not_equal(b->block_table[0], a->block_table[1]);
    assert_int_equal(block_manager_queries(bm) - q0, 1); /* stopped at the first miss */
    assert_int_equal(block_manager_hits(bm), 0);
    compute_all(bm, b); /* two more blocks under hash 42 */
    block_manager_allocate(bm, a2); /* same tokens: the colliding entries are skipped */
    assert_int_equal(a2->num_hit_tokens, 8);
    assert_int_equal(a2->block_table[0], a->block_table[0]);
    assert_int_equal(a2->block_table[1], a->block_table[1]);
    /* Same tokens at another position (other context) is not a hit either. */
    block_manager_allocate(bm, r);
    assert_int_equal(r->num_hit_tokens, 4);
    assert_int_not_equal(r->block_table[1], a->block_table[0]);
    Sequence *all[4] = {a, b, a2, r};
    for (int i = 0; i < 4; i++) {
        block_manager_deallocate(bm, all[i]);
        sequence_destroy(all[i]);
    }
    assert_int_equal(block_manager_num_free(bm), 10);
    block_manager_destroy(bm);
}

static void test_append_at_boundary(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(3, BS, 1);
    int32_t t[4] = {1, 2, 3, 4};
    Sequence *s = make_seq(0, t, 4);
    block_manager_allocate(bm, s);
    assert_int_equal(s->num_blocks, 1);
    assert_true(block_manager_can_append(bm, s));
    block_manager_append(bm, s); /* 4 tokens fit in 1 block */
    assert_int_equal(s->num_blocks, 1);
    assert_int_equal(block_manager_num_free(bm), 2);
    for (int tok = 5; tok <= 12; tok++) {
        sequence_append_token(s, tok);
        assert_true(block_manager_can_append(bm, s));
        block_manager_append(bm, s);
        assert_int_equal(s->num_blocks, blocks_for_tokens(tok, BS));
    }
    assert_int_equal(s->num_blocks, 3);
    assert_int_equal(block_manager_num_free(bm), 0);
    sequence_append_token(s, 13); /* needs a 4th block: none free */
    assert_false(block_manager_can_append(bm, s));
    block_manager_deallocate(bm, s);
    assert_int_equal(block_manager_num_free(bm), 3);
    sequence_destroy(s);
    block_manager_destroy(bm);
}

static void test_freed_blocks_keep_hash_and_hit(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(10, BS, 1);
    int32_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    Sequence *a = make_seq(0, t, 9), *b = make_seq(1, t, 9);
    block_manager_allocate(bm, a);
    compute_all(bm, a);
    int b0 = a->block_table[0], b1 = a->block_table[1];
    block_manager_deallocate(bm, a);
    assert_int_equal(block_manager_num_free(bm), 10);
    assert_int_equal(block_manager_ref_count(bm, b0), 0);
    assert_true(block_manager_block_hash(bm, b0, NULL));
    assert_true(block_manager_block_hash(bm, b1, NULL));
    assert_true(block_manager_can_allocate(bm, b));
    block_manager_allocate(bm, b);
    assert_int_equal(b->block_table[0], b0);
    assert_int_equal(b->block_table[1], b1);
    assert_int_equal(b->num_hit_tokens, 8);
    assert_int_equal(b->num_computed_tokens, 8);
    assert_int_equal(block_manager_ref_count(bm, b0), 1);
    assert_int_equal(block_manager_num_free(bm), 7);
    block_manager_deallocate(bm, b);
    sequence_destroy(a);
    sequence_destroy(b);
    block_manager_destroy(bm);
}

static void test_reused_free_block_loses_hash(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(4, BS, 1);
    int32_t ta[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t tb[16];
    for (int i = 0; i < 16; i++) tb[i] = 100 + i;
    Sequence *a = make_seq(0, ta, 8), *b = make_seq(1, tb, 16), *a2 = make_seq(2, ta, 8);
    block_manager_allocate(bm, a);
    compute_all(bm, a);
    int b0 = a->block_table[0], b1 = a->block_table[1];
    block_manager_deallocate(bm, a);
    block_manager_allocate(bm, b); /* needs the whole pool: a's blocks are reused */
    assert_int_equal(b->num_hit_tokens, 0);
    uint64_t h;
    /* reused: a's hashes are gone (b registered its own) */
    assert_true(!block_manager_block_hash(bm, b0, &h) || h != block_hash(0, ta, BS));
    assert_true(!block_manager_block_hash(bm, b1, &h) || h != block_hash(block_hash(0, ta, BS), ta + 4, BS));
    /* a's freed blocks went to the tail: the never-used blocks were taken first. */
    assert_int_equal(b->block_table[2], b1);
    assert_int_equal(b->block_table[3], b0);
    block_manager_deallocate(bm, b); /* b never computed: no hashes */
    block_manager_allocate(bm, a2);
    assert_int_equal(a2->num_hit_tokens, 0);
    assert_int_equal(block_manager_hits(bm), 0);
    block_manager_deallocate(bm, a2);
    sequence_destroy(a);
    sequence_destroy(b);
    sequence_destroy(a2);
    block_manager_destroy(bm);
}

static void test_lru_order_of_free_list(void **state) {
    (void)state;
    /* The oldest freed hashed block is reused first; unhashed freed blocks before any hashed. */
    BlockManager *bm = block_manager_create(4, BS, 1);
    int32_t ta[4] = {1, 2, 3, 4}, tb[4] = {5, 6, 7, 8}, tc[3] = {9, 9, 9}, td[4] = {7, 7, 7, 7};
    Sequence *a = make_seq(0, ta, 4), *b = make_seq(1, tb, 4), *c = make_seq(2, tc, 3),
             *d = make_seq(3, td, 4), *a2 = make_seq(4, ta, 4), *b2 = make_seq(5, tb, 4);
    block_manager_allocate(bm, a);
    compute_all(bm, a);
    block_manager_allocate(bm, b);
    compute_all(bm, b);
    block_manager_allocate(bm, c);
    compute_all(bm, c); /* partial block: no hash */
    block_manager_deallocate(bm, a);
    block_manager_deallocate(bm, b);
    block_manager_deallocate(bm, c);
    /* a, b, c took blocks 0, 1, 2. Free list now: c's unhashed block 2 at the head, then the
     * never-used 3, then a's 0 and b's 1 (hashed, to the tail in the order they were freed). */
    block_manager_allocate(bm, d);
    assert_int_equal(d->block_table[0], 2);
    compute_all(bm, d);
    /* a and b are still cached */
    block_manager_allocate(bm, a2);
    assert_int_equal(a2->num_hit_tokens, 4);
    block_manager_allocate(bm, b2);
    assert_int_equal(b2->num_hit_tokens, 4);
    Sequence *all[6] = {a, b, c, d, a2, b2};
    for (int i = 0; i < 6; i++) {
        block_manager_deallocate(bm, all[i]);
        sequence_destroy(all[i]);
    }
    block_manager_destroy(bm);
}

static void test_can_allocate_when_short(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(3, BS, 1);
    int32_t ta[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t tx[4] = {50, 51, 52, 53};
    int32_t tc[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    int32_t tother[8] = {11, 12, 13, 14, 15, 16, 17, 18};
    Sequence *a = make_seq(0, ta, 8), *x = make_seq(1, tx, 4), *c = make_seq(2, tc, 9),
             *a2 = make_seq(3, ta, 8), *o = make_seq(4, tother, 8), *a3 = make_seq(5, ta, 8);
    block_manager_allocate(bm, a);
    compute_all(bm, a);
    /* 1 free block: another 2-block prompt does not fit, the same prompt (in-use hits) does */
    assert_false(block_manager_can_allocate(bm, o));
    assert_true(block_manager_can_allocate(bm, a3));
    block_manager_allocate(bm, a3);
    assert_int_equal(block_manager_num_free(bm), 1);
    block_manager_deallocate(bm, a3);
    block_manager_deallocate(bm, a);
    block_manager_allocate(bm, x); /* takes the never-used block; a's 2 blocks stay cached */
    assert_int_equal(block_manager_num_free(bm), 2);
    /* Hits on free blocks consume free blocks: 2 hits + 1 new block > 2 free. */
    assert_false(block_manager_can_allocate(bm, c));
    assert_true(block_manager_can_allocate(bm, a2));
    block_manager_allocate(bm, a2);
    assert_int_equal(a2->num_hit_tokens, 8);
    assert_int_equal(a2->num_computed_tokens, 7);
    assert_int_equal(block_manager_num_free(bm), 0);
    Sequence *all[6] = {a, x, c, a2, o, a3};
    for (int i = 0; i < 6; i++) {
        block_manager_deallocate(bm, all[i]);
        sequence_destroy(all[i]);
    }
    assert_int_equal(block_manager_num_free(bm), 3);
    block_manager_destroy(bm);
}

static void test_queries_and_hits(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(20, BS, 1);
    int32_t t[14];
    for (int i = 0; i < 14; i++) t[i] = i + 1;
    Sequence *a = make_seq(0, t, 14); /* 3 full blocks + 2 tokens */
    block_manager_allocate(bm, a);
    assert_int_equal(block_manager_queries(bm), 1); /* first lookup misses: stop */
    compute_all(bm, a);
    Sequence *b = make_seq(1, t, 14);
    block_manager_allocate(bm, b); /* 3 hits; the partial block is never looked up */
    assert_int_equal(block_manager_queries(bm), 4);
    assert_int_equal(block_manager_hits(bm), 3);
    assert_int_equal(b->num_hit_tokens, 12);
    assert_int_equal(b->num_computed_tokens, 12);
    int32_t t2[14];
    memcpy(t2, t, sizeof(t));
    t2[5] = 99; /* second block differs */
    Sequence *c = make_seq(2, t2, 14);
    block_manager_allocate(bm, c); /* hit, miss */
    assert_int_equal(block_manager_queries(bm), 6);
    assert_int_equal(block_manager_hits(bm), 4);
    assert_int_equal(c->num_hit_tokens, 4);
    Sequence *all[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        block_manager_deallocate(bm, all[i]);
        sequence_destroy(all[i]);
    }
    block_manager_destroy(bm);
}

static void test_prefix_caching_off(void **state) {
    (void)state;
    BlockManager *bm = block_manager_create(10, BS, 0);
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    Sequence *a = make_seq(0, t, 8), *b = make_seq(1, t, 8);
    block_manager_allocate(bm, a);
    compute_all(bm, a);
    assert_int_equal(block_manager_block_hash(bm, a->block_table[0], NULL), 0);
    block_manager_allocate(bm, b);
    assert_int_equal(b->num_hit_tokens, 0);
    assert_int_equal(b->num_computed_tokens, 0);
    assert_int_equal(block_manager_queries(bm), 0);
    assert_int_equal(block_manager_num_free(bm), 6);
    block_manager_deallocate(bm, a);
    block_manager_deallocate(bm, b);
    sequence_destroy(a);
    sequence_destroy(b);
    block_manager_destroy(bm);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allocate),
        cmocka_unit_test(test_hash_registration_and_readiness),
        cmocka_unit_test(test_unwritten_blocks_forgotten),
        cmocka_unit_test(test_marks_start_over_after_preemption),
        cmocka_unit_test(test_hash_is_xxh64_of_le_bytes),
        cmocka_unit_test(test_prefix_hit_ref_count),
        cmocka_unit_test(test_full_prompt_hit_recomputes_last_token),
        cmocka_unit_test(test_chained_hash_separates_contexts),
        cmocka_unit_test(test_forced_collision_rejected_by_tokens),
        cmocka_unit_test(test_append_at_boundary),
        cmocka_unit_test(test_freed_blocks_keep_hash_and_hit),
        cmocka_unit_test(test_reused_free_block_loses_hash),
        cmocka_unit_test(test_lru_order_of_free_list),
        cmocka_unit_test(test_can_allocate_when_short),
        cmocka_unit_test(test_queries_and_hits),
        cmocka_unit_test(test_prefix_caching_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
