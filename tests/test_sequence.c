/* test_sequence.c: Sequence lifecycle and its per-request generator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "engine/sequence.h"

static SamplingParams default_params(void) {
    return (SamplingParams){.temperature = 0, .top_p = 1, .top_k = 0, .min_p = 0, .seed = -1,
                            .max_tokens = 16};
}

static void test_create_copies_prompt_and_stop_ids(void **state) {
    (void)state;
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    int32_t stops[2] = {7, 8};
    SamplingParams p = default_params();
    p.stop_token_ids = stops;
    p.num_stop_token_ids = 2;
    Sequence *s = sequence_create(42, prompt, 5, &p);
    prompt[0] = 99;
    stops[0] = 99;
    assert_int_equal(s->id, 42);
    assert_int_equal(s->status, SEQ_WAITING);
    assert_int_equal(s->num_tokens, 5);
    assert_int_equal(s->num_prompt_tokens, 5);
    assert_int_equal(s->token_ids[0], 1);
    assert_int_equal(s->params.num_stop_token_ids, 2);
    assert_int_equal(s->params.stop_token_ids[0], 7);
    assert_int_equal(s->num_cached_tokens, 0);
    assert_int_equal(s->num_blocks, 0);
    assert_int_equal(sequence_num_completion_tokens(s), 0);
    sequence_destroy(s);
    sequence_destroy(NULL);
}

static void test_append_grows(void **state) {
    (void)state;
    int32_t prompt[3] = {1, 2, 3};
    SamplingParams p = default_params();
    Sequence *s = sequence_create(0, prompt, 3, &p);
    for (int i = 0; i < 1000; i++) sequence_append_token(s, 100 + i);
    assert_int_equal(s->num_tokens, 1003);
    assert_int_equal(sequence_num_completion_tokens(s), 1000);
    assert_int_equal(s->token_ids[2], 3);
    assert_int_equal(s->token_ids[1002], 1099);
    sequence_destroy(s);
}

static void test_rng_deterministic_and_in_range(void **state) {
    (void)state;
    int32_t prompt[1] = {1};
    SamplingParams p = default_params();
    p.seed = 1234;
    Sequence *a = sequence_create(0, prompt, 1, &p);
    Sequence *b = sequence_create(1, prompt, 1, &p); /* same seed, other id */
    p.seed = 1235;
    Sequence *c = sequence_create(2, prompt, 1, &p);
    double sum = 0;
    int differ = 0;
    const int n = 100000;
    for (int i = 0; i < n; i++) {
        double x = sequence_next_uniform(a), y = sequence_next_uniform(b), z = sequence_next_uniform(c);
        assert_true(x >= 0.0 && x < 1.0);
        assert_true(x == y);
        differ += x != z;
        sum += x;
    }
    assert_true(differ > n - 10);
    double mean = sum / n; /* sd of the mean: 0.2887 / sqrt(n) = 0.0009 */
    assert_true(mean > 0.495 && mean < 0.505);
    /* Re-seeding restarts the stream. */
    sequence_seed_rng(a, 1234);
    sequence_seed_rng(c, 1234);
    for (int i = 0; i < 10; i++) assert_true(sequence_next_uniform(a) == sequence_next_uniform(c));
    sequence_destroy(a);
    sequence_destroy(b);
    sequence_destroy(c);
}

static void test_splitmix_expansion_known_value(void **state) {
    (void)state;
    /* splitmix64 from state 0: first output 0xe220a8397b1dcdaf (reference value from Vigna's
     * splitmix64.c). */
    int32_t prompt[1] = {1};
    SamplingParams p = default_params();
    p.seed = 0;
    Sequence *s = sequence_create(0, prompt, 1, &p);
    assert_true(s->rng[0] == 0xe220a8397b1dcdafULL);
    sequence_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_copies_prompt_and_stop_ids),
        cmocka_unit_test(test_append_grows),
        cmocka_unit_test(test_rng_deterministic_and_in_range),
        cmocka_unit_test(test_splitmix_expansion_known_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
