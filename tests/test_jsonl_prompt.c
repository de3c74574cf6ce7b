/* test_jsonl_prompt.c: one line of a `complete --prompt-file` file -> a request's fields
 * (src/cli/jsonl_prompt.c): every field, the defaults a line leaves alone, and every refusal, each
 * with its line number and a message for a person (NUL characters, ranges, types, numbers too
 * large for JSON). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "cli/jsonl_prompt.h"
#include "common.h"

static CvllmSamplingParams defaults(void) {
    CvllmSamplingParams d;
    cvllm_sampling_params_default(&d);
    return d;
}

static void test_fields(void **state) {
    (void)state;
    const char *line = "{\"prompt_token_ids\": [1, 2, 2147483647], \"max_tokens\": 5, \"temperature\": 0, "
                       "\"top_p\": 0.5, \"top_k\": -1, \"min_p\": 1, \"seed\": 7, \"ignore_eos\": true, "
                       "\"stop\": [\"a\", \"\\u00e9\"], \"stop_token_ids\": [9, 0]}";
    JsonlPrompt p = {.params = defaults()};
    assert_int_equal(jsonl_prompt_parse(line, strlen(line), 1, &p), 0);
    assert_null(p.prompt);
    assert_int_equal(p.num_prompt_ids, 3);
    assert_int_equal(p.prompt_ids[2], INT32_MAX);
    assert_int_equal(p.params.max_tokens, 5);
    assert_true(p.params.temperature == 0.0f && p.params.top_p == 0.5f && p.params.min_p == 1.0f);
    assert_int_equal(p.params.top_k, -1);
    assert_int_equal(p.params.seed, 7);
    assert_int_equal(p.params.ignore_eos, 1);
    assert_int_equal(p.has_stops, 1);
    assert_int_equal(p.num_stops, 2);
    assert_string_equal(p.stops[1], "\xc3\xa9");
    assert_ptr_equal(p.params.stop_token_ids, p.stop_ids);
    assert_int_equal(p.params.num_stop_token_ids, 2);
    jsonl_prompt_free(&p);
    assert_null(p.params.stop_token_ids);
    jsonl_prompt_free(&p); /* twice is fine */

    /* a line sets only what it names; "stop" may be one string */
    int32_t cli_stop[1] = {42};
    CvllmSamplingParams d = defaults();
    d.max_tokens = 9;
    d.stop_token_ids = cli_stop;
    d.num_stop_token_ids = 1;
    JsonlPrompt q = {.params = d};
    line = "{\"prompt\": \"hello\", \"stop\": \"\\n\"}";
    assert_int_equal(jsonl_prompt_parse(line, strlen(line), 1, &q), 0);
    assert_string_equal(q.prompt, "hello");
    assert_int_equal(q.params.max_tokens, 9);
    assert_ptr_equal(q.params.stop_token_ids, cli_stop);
    assert_int_equal(q.num_stops, 1);
    assert_string_equal(q.stops[0], "\n");
    jsonl_prompt_free(&q);
    assert_ptr_equal(q.params.stop_token_ids, cli_stop); /* not ours: left alone */

    /* > 0 but below the smallest float: kept positive, not rounded to a refused 0 (fuzz_jsonl) */
    JsonlPrompt t = {.params = defaults()};
    line = "{\"prompt\": \"x\", \"top_p\": 9e-93, \"repetition_penalty\": 1e-300}";
    assert_int_equal(jsonl_prompt_parse(line, strlen(line), 1, &t), 0);
    assert_true(t.params.top_p > 0.0f && t.params.repetition_penalty > 0.0f);
    jsonl_prompt_free(&t);
}

static void test_refusals(void **state) {
    (void)state;
    static const struct { const char *line; size_t len; const char *msg; } cases[] = {
        {"{\"prompt\": \"a\\u0000b\"}", 0, "line 7: contains a NUL character"},
        {"{\"prompt\": \"a\0b\"}", 15, "line 7: contains a NUL character"},
        {"{\"prompt\": \"x\", \"stop\": \"\\u0000\"}", 0, "line 7: contains a NUL character"},
        {"{\"prompt\": \"x\", \"min_p\": 2}", 0, "line 7: \"min_p\" must be a number in [0, 1], got 2"},
        {"{\"prompt\": \"x\", \"min_p\": -0.5}", 0, "line 7: \"min_p\""},
        {"{\"prompt\": \"x\", \"temperature\": -1}", 0, "line 7: \"temperature\" must be a number in [0, 1e6]"},
        {"{\"prompt\": \"x\", \"temperature\": 2e6}", 0, "line 7: \"temperature\""},
        {"{\"prompt\": \"x\", \"temperature\": 1e999}", 0, "line 7: temperature (1e999) is out of range"},
        {"{\"prompt\": \"x\", \"top_p\": 0}", 0, "line 7: \"top_p\" must be a number in (0, 1], got 0"},
        {"{\"prompt\": \"x\", \"top_p\": 1.01}", 0, "line 7: \"top_p\""},
        {"{\"prompt\": \"x\", \"top_p\": \"1\"}", 0, "line 7: \"top_p\" must be a number"},
        {"{\"prompt\": \"x\", \"top_k\": -2}", 0, "line 7: \"top_k\""},
        {"{\"prompt\": \"x\", \"max_tokens\": 0}", 0, "line 7: \"max_tokens\" must be in [1, 2147483647]"},
        {"{\"prompt\": \"x\", \"max_tokens\": 2147483648}", 0, "line 7: \"max_tokens\""},
        {"{\"prompt\": \"x\", \"max_tokens\": 5.0}", 0, "line 7: \"max_tokens\" must be an integer"},
        {"{\"prompt\": \"x\", \"seed\": -1}", 0, "line 7: \"seed\" must be >= 0"},
        {"{\"prompt\": \"x\", \"seed\": 99999999999999999999}", 0, "line 7: seed (99999999999999999999) is out of range"},
        {"{\"prompt_token_ids\": [1, 99999999999999999999]}", 0, "line 7: prompt_token_ids[1] (99999999999999999999) is out of range"},
        {"{\"prompt_token_ids\": [1, -1]}", 0, "line 7: \"prompt_token_ids\"[1] is not a token id"},
        {"{\"prompt_token_ids\": [1, 2147483648]}", 0, "line 7: \"prompt_token_ids\"[1] is not a token id"},
        {"{\"prompt_token_ids\": [1.5]}", 0, "line 7: \"prompt_token_ids\"[0] is not a token id"},
        {"{\"prompt_token_ids\": []}", 0, "line 7: \"prompt_token_ids\" is empty"},
        {"{\"prompt_token_ids\": \"1,2\"}", 0, "line 7: \"prompt_token_ids\" must be an array"},
        {"{\"prompt\": \"x\", \"stop_token_ids\": [-3]}", 0, "line 7: \"stop_token_ids\"[0] is not a token id"},
        {"{\"prompt\": \"x\", \"stop\": [\"a\", 1]}", 0, "line 7: \"stop\"[1] is not a string"},
        {"{\"prompt\": \"x\", \"stop\": 3}", 0, "line 7: \"stop\" must be a string or an array"},
        {"{\"prompt\": \"x\", \"ignore_eos\": 1}", 0, "line 7: \"ignore_eos\" must be true or false"},
        {"{\"prompt\": 3}", 0, "line 7: \"prompt\" must be a string"},
        {"{\"prompt\": \"x\", \"prompt_token_ids\": [1]}", 0, "line 7: give \"prompt\" or \"prompt_token_ids\", not both"},
        {"{\"max_tokens\": 3}", 0, "line 7: needs \"prompt\" or \"prompt_token_ids\""},
        {"{\"prompt\": \"x\", \"n\": 2}", 0, "line 7: unknown field \"n\""},
        {"{\"prompt\": \"x\", \"prompt\": \"y\"}", 0, "line 7: invalid JSON"},
        {"[\"x\"]", 0, "line 7: not a JSON object"},
        {"not json", 0, "line 7: invalid JSON at column"},
        {"{\"prompt\": \"\\ud800\"}", 0, "line 7: invalid JSON"},
        {"{\"prompt\": \"\xff\"}", 0, "line 7: invalid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].line);
        JsonlPrompt p = {.params = defaults()};
        int rc = jsonl_prompt_parse(cases[i].line, len, 7, &p);
        if (rc != CVLLM_EINVAL || !strstr(cvllm_last_error(), cases[i].msg) ||
            strncmp(cvllm_last_error(), "line 7: ", 8) != 0 || strstr(cvllm_last_error(), "JSON_"))
            fail_msg("case %zu (%s): rc %d, message: %s (expected: %s)", i, cases[i].line, rc,
                     cvllm_last_error(), cases[i].msg);
        jsonl_prompt_free(&p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
