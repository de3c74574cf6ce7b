/* test_decode_plan.c: the decode attention's work items (src/backend/cuda/decode_plan.c, plain C,
 * checked here without a GPU): every key of every sequence in exactly one item, items in
 * sequence order, the item size a multiple of 32 of at least DECODE_PLAN_MIN_PART, never more
 * items than the capacity the workspace is sized for, and about DECODE_PLAN_ITEMS_PER_BLOCK
 * items a block when the contexts are long. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cuda/decode_plan.h"

/* Builds the plan of ctx[0..S) into a fresh array with a guard past its end and checks it. */
static int check_plan(const int32_t *ctx, int S, int max_seqs, int grid_x) {
    const int cap = decode_plan_capacity(max_seqs, grid_x);
    const size_t n_ints = decode_plan_ints(max_seqs, cap);
    int32_t *plan = malloc((n_ints + 1) * sizeof *plan);
    assert_non_null(plan);
    for (size_t i = 0; i <= n_ints; i++)
        plan[i] = -7;
    const int n = decode_plan_build(plan, ctx, S, max_seqs, grid_x);
    assert_int_equal(plan[n_ints], -7); /* nothing written past the array */
    assert_int_equal(plan[0], n);
    assert_int_equal(plan[2], cap);
    assert_int_equal(plan[3], max_seqs);
    assert_true(n >= S && n <= cap);
    assert_int_equal(decode_plan_used_ints(plan), DECODE_PLAN_HEADER + max_seqs + 1 + n);
    const int part = plan[1];
    assert_true(part >= DECODE_PLAN_MIN_PART && part % 32 == 0);
    const int32_t *off = plan + DECODE_PLAN_HEADER, *seq = off + max_seqs + 1;
    assert_int_equal(off[0], 0);
    assert_int_equal(off[S], n);
    int64_t W = 0;
    for (int s = 0; s < S; s++) {
        const int k = off[s + 1] - off[s], c = ctx[s] > 0 ? ctx[s] : 0;
        W += c;
        assert_true(k >= 1);
        for (int i = off[s]; i < off[s + 1]; i++)
            assert_int_equal(seq[i], s);
        /* items 0 .. k-1 cover keys i * part .. min(c, (i + 1) * part) - 1: all of them, each
         * item non-empty unless the sequence has no keys */
        assert_true((int64_t)k * part >= c);
        if (c > 0) assert_true((int64_t)(k - 1) * part < c);
        else assert_int_equal(k, 1);
    }
    /* part is the smallest multiple of 32 (and >= the minimum) with W / part <= the target */
    const int64_t target = (int64_t)DECODE_PLAN_ITEMS_PER_BLOCK * grid_x;
    assert_true((int64_t)part * target >= W);
    if (part > DECODE_PLAN_MIN_PART) assert_true((int64_t)(part - 32) * target < W);
    free(plan);
    return n;
}

static void test_shapes(void **state) {
    (void)state;
    const int32_t one[] = {1};
    assert_int_equal(check_plan(one, 1, 1, 1), 1);
    const int32_t empty[] = {0, 0, 0}; /* padding lanes: one empty item each */
    assert_int_equal(check_plan(empty, 3, 8, 66), 3);
    const int32_t mix[] = {1, 17, 300, 1000, 33};
    check_plan(mix, 5, 5, 1);
    check_plan(mix, 5, 5, 3);
    check_plan(mix, 5, 256, 66);
    /* one long sequence: 40,960 keys over 8 x 66 items -> 78 a item -> 96 (a multiple of 32);
     * over 8 x 132 -> 39 -> the minimum, 64 */
    const int32_t lng[] = {40960};
    assert_int_equal(check_plan(lng, 1, 1, 66), (40960 + 95) / 96);
    assert_int_equal(check_plan(lng, 1, 1, 132), 40960 / 64);
}

/* bench.py-like batches: 256 sequences of 100 .. 2048 keys, and of 40,960 each (the capacity
 * bound at its tightest), over grids of 1 .. 200 blocks */
static void test_random(void **state) {
    (void)state;
    srand(12345);
    int32_t ctx[256];
    for (int round = 0; round < 200; round++) {
        const int S = 1 + rand() % 256, grid_x = 1 + rand() % 200;
        for (int s = 0; s < S; s++)
            ctx[s] = round % 5 == 0 ? 40960 : round % 7 == 0 ? 0 : 100 + rand() % 1949;
        const int n = check_plan(ctx, S, 256, grid_x);
        /* long contexts: the items fill the target, not far past it */
        if (round % 5 == 0) assert_true(n <= S + DECODE_PLAN_ITEMS_PER_BLOCK * grid_x);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
