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
    assert_int_equal(s->num_computed_tokens, 0);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_copies_prompt_and_stop_ids),
        cmocka_unit_test(test_append_grows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
