/* test_server_units.c: the server's pure pieces without a model: OpenAI request parsing and its
 * errors, the Hermes tool-call parser and the qwen3 reasoning parser (whole text and streamed
 * byte by byte give the same split), response shapes, SSE framing, metrics text, the live view's
 * JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "server/live_view.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"
#include "server/openai_response.h"
#include "server/reasoning_parser.h"
#include "server/tool_parser.h"

static int parse(OaiEndpoint ep, const char *body, OaiRequest *r, OaiError *e) {
    return oai_request_parse(ep, body, strlen(body), r, e);
}

static void expect_400(OaiEndpoint ep, const char *body, const char *param) {
    OaiRequest r;
    OaiError e;
    int rc = parse(ep, body, &r, &e);
    if (rc == 0) {
        oai_request_free(&r);
        fail_msg("accepted: %s", body);
    }
    assert_int_equal(e.status, 400);
    if (param && strcmp(e.param, param)) fail_msg("%s: param '%s', expected '%s' (%s)", body, e.param, param, e.message);
}

static void test_completions_prompts(void **state) {
    OaiRequest r;
    OaiError e;
    assert_int_equal(parse(OAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"hi\"}", &r, &e), 0);
    assert_int_equal(r.num_prompts, 1);
    assert_string_equal(r.prompts[0].text, "hi");
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n, 1);
    assert_int_equal(r.max_tokens, 0);
    assert_int_equal(r.logprobs, -1);
    assert_true(r.params.temperature == 1.0f);
    oai_request_free(&r);
    assert_int_equal(parse(OAI_COMPLETIONS, "{\"prompt\":[\"a\",[1,2,3],\"b\"],\"n\":2}", &r, &e), 0);
    assert_int_equal(r.num_prompts, 3);
    assert_int_equal(r.prompts[1].num_ids, 3);
    assert_int_equal(r.prompts[1].ids[2], 3);
    assert_string_equal(r.prompts[2].text, "b");
    assert_int_equal(r.n, 2);
    oai_request_free(&r);
    assert_int_equal(parse(OAI_COMPLETIONS, "{\"prompt\":[5,6],\"max_tokens\":7.0,\"temperature\":0,"
                                            "\"top_p\":0.5,\"top_k\":3,\"min_p\":0.1,\"seed\":42,"
                                            "\"stop\":[\"x\",\"yy\"],\"stop_token_ids\":[9],\"ignore_eos\":true,"
                                            "\"logprobs\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                                            "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1}",
                           &r, &e),
                     0);
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.params.temperature == 0.0f);
    assert_int_equal(r.params.top_k, 3);
    assert_int_equal(r.params.seed, 42);
    assert_int_equal(r.params.num_stop, 2);
    assert_string_equal(r.params.stop[1], "yy");
    assert_int_equal(r.params.num_stop_token_ids, 1);
    assert_int_equal(r.params.logprobs, 2);
    assert_true(r.params.ignore_eos);
    assert_true(r.stream && r.include_usage);
    assert_true(r.params.repetition_penalty > 1.09f);
    oai_request_free(&r);
    /* > 0 but below the smallest float: kept positive, not rounded to a refused 0 */
    assert_int_equal(parse(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"top_p\":9e-93,\"repetition_penalty\":1e-300}",
                           &r, &e),
                     0);
    assert_true(r.params.top_p > 0.0f && r.params.repetition_penalty > 0.0f);
    oai_request_free(&r);
}

static void test_request_errors(void **state) {
    expect_400(OAI_COMPLETIONS, "{\"prompt\":", NULL);
    expect_400(OAI_COMPLETIONS, "[1,2]", NULL);
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"\xff\"}", NULL);
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"\\ud800\"}", NULL);
    expect_400(OAI_COMPLETIONS, "{}", "prompt");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":3}", "prompt");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":[]}", "prompt");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":[1,-2]}", "prompt");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":[[]]}", "prompt");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"model\":5}", "model");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"temperature\":\"hot\"}", "temperature");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"temperature\":-1}", "temperature");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"top_p\":0}", "top_p");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":1.5}", "max_tokens");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"n\":0}", "n");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"n\":100000}", "n");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"stream\":1}", "stream");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"stop\":[1]}", "stop");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"stop_token_ids\":\"x\"}", "stop_token_ids");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":21}", "logprobs");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":1,\"echo\":true}", "echo");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", "stream_options");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"presence_penalty\":3}", "presence_penalty");
    expect_400(OAI_COMPLETIONS, "{\"prompt\":\"a\",\"repetition_penalty\":0}", "repetition_penalty");
    expect_400(OAI_CHAT, "{\"messages\":[]}", "messages");
    expect_400(OAI_CHAT, "{\"messages\":\"hi\"}", "messages");
    expect_400(OAI_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages");
    expect_400(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages");
    expect_400(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "messages");
    expect_400(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}", "tool_choice");
    expect_400(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}", "tools");
    expect_400(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "top_logprobs");
    expect_400(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":[]}", "chat_template_kwargs");
    expect_400(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":-1}", "max_completion_tokens");
}

static void test_chat_request(void **state) {
    OaiRequest r;
    OaiError e;
    const char *b = "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":"
                    "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
                    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                    "\"max_tokens\":5,\"max_completion_tokens\":9,\"logprobs\":true,\"top_logprobs\":3,"
                    "\"chat_template_kwargs\":{\"enable_thinking\":false},\"unknown_field\":1}";
    assert_int_equal(parse(OAI_CHAT, b, &r, &e), 0);
    assert_int_equal(json_array_size(r.messages), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(r.messages, 1), "content")), "a\nb");
    assert_non_null(r.tools);
    assert_int_equal(r.tool_choice, OAI_TOOLS_AUTO);
    assert_int_equal(r.max_tokens, 9);
    assert_int_equal(r.logprobs, 3);
    assert_true(json_is_false(json_object_get(r.template_kwargs, "enable_thinking")));
    assert_true(r.add_generation_prompt);
    oai_request_free(&r);
    assert_int_equal(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\"}", &r, &e), 0);
    assert_int_equal(r.tool_choice, OAI_TOOLS_NONE);
    oai_request_free(&r);
    assert_int_equal(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"Hel\"}],\"continue_final_message\":true,\"add_generation_prompt\":false}", &r, &e), 0);
    assert_true(r.continue_final_message && !r.add_generation_prompt);
    oai_request_free(&r);
}

/* whole-text and byte-by-byte streaming give the same content and calls */
static void tools_both_ways(const char *text, const char *want_content, int want_calls, const char *name0,
                            const char *args0) {
    for (int mode = 0; mode < 2; mode++) {
        ToolStream ts;
        tool_stream_init(&ts);
        SBuf content = {0};
        size_t n = strlen(text);
        if (mode == 0) tool_stream_feed(&ts, text, n, 1, &content);
        else {
            for (size_t i = 0; i < n; i++) tool_stream_feed(&ts, text + i, 1, 0, &content);
            tool_stream_feed(&ts, "", 0, 1, &content);
        }
        if (strcmp(content.s ? content.s : "", want_content))
            fail_msg("mode %d: content '%s', want '%s'", mode, content.s ? content.s : "", want_content);
        assert_int_equal(ts.num_calls, want_calls);
        if (want_calls) {
            assert_string_equal(ts.calls[0].name, name0);
            assert_string_equal(ts.calls[0].arguments, args0);
        }
        sbuf_free(&content);
        tool_stream_free(&ts);
    }
}

static void test_tool_parser(void **state) {
    tools_both_ways("no calls here < <tool", "no calls here < <tool", 0, NULL, NULL);
    tools_both_ways("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
                    "Let me check.\n", 1, "get_weather", "{\"city\": \"Paris\", \"days\": 2}");
    tools_both_ways("<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
                    "", 2, "a", "{}");
    tools_both_ways("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"q\\\": 1}\"}", "", 1, "f", "{\"q\": 1}");
    tools_both_ways("x<tool_call>not json</tool_call>y", "x<tool_call>not json</tool_call>y", 0, NULL, NULL);
    tools_both_ways("<tool_call>{\"name\": \"\xc3\xa9t\xc3\xa9\", \"arguments\": {\"v\": \"\xe2\x82\xac\"}}</tool_call>",
                    "", 1, "\xc3\xa9t\xc3\xa9", "{\"v\": \"\xe2\x82\xac\"}");
}

static void reasoning_both_ways(const char *text, const char *want_r, const char *want_c) {
    for (int mode = 0; mode < 2; mode++) {
        ReasoningStream rs;
        reasoning_init(&rs);
        SBuf r = {0}, c = {0};
        size_t n = strlen(text);
        if (mode == 0) reasoning_feed(&rs, text, n, 1, &r, &c);
        else {
            for (size_t i = 0; i < n; i++) reasoning_feed(&rs, text + i, 1, 0, &r, &c);
            reasoning_feed(&rs, "", 0, 1, &r, &c);
        }
        assert_string_equal(r.s ? r.s : "", want_r);
        assert_string_equal(c.s ? c.s : "", want_c);
        sbuf_free(&r);
        sbuf_free(&c);
        reasoning_free(&rs);
    }
}

static void test_reasoning_parser(void **state) {
    reasoning_both_ways("<think>\nhmm\n</think>\n\nThe answer", "\nhmm\n", "\n\nThe answer");
    reasoning_both_ways("plain answer <thin", "", "plain answer <thin");
    reasoning_both_ways("<think>cut off mid-thought </thi", "cut off mid-thought </thi", "");
    reasoning_both_ways("<think></think>x</think>", "", "x</think>");
}

static void test_shapes(void **state) {
    OaiError e;
    oai_error(&e, 400, "temperature", "bad %d", 1);
    json_t *j = oai_error_body(&e);
    json_t *err = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(err, "message")), "bad 1");
    assert_string_equal(json_string_value(json_object_get(err, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(err, "param")), "temperature");
    assert_true(json_is_null(json_object_get(err, "code")));
    SBuf out = {0};
    oai_sse_append(&out, j);
    assert_true(!strncmp(out.s, "data: {\"error\":", 15));
    assert_true(out.len > 2 && !strcmp(out.s + out.len - 2, "\n\n"));
    sbuf_free(&out);
    json_t *u = oai_usage(5, 7, 2);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 12);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")), 2);
    json_decref(u);
    char *a = oai_random_id("cmpl-"), *b = oai_random_id("cmpl-");
    assert_int_equal(strlen(a), 5 + 32);
    assert_string_not_equal(a, b);
    free(a);
    free(b);
    ToolCall c = {"f", "{}"};
    json_t *tc = oai_tool_calls(&c, 0, 1, 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(tc, 0), "index")), 0);
    assert_string_equal(json_string_value(json_object_get(json_array_get(tc, 0), "type")), "function");
    json_decref(tc);
    assert_true(utf8_valid("\xe2\x82\xac", 3));
    assert_false(utf8_valid("\xe2\x82", 2));
    assert_false(utf8_valid("\xc0\x80", 2));
    assert_false(utf8_valid("\xed\xa0\x80", 3));
}

static void test_metrics_text(void **state) {
    Metrics m;
    metrics_init(&m);
    metrics_observe_ttft(&m, 0.03);
    metrics_observe_itl(&m, 0.02);
    metrics_observe_finished(&m, CVLLM_FINISH_LENGTH, 1.2, 10, 5);
    metrics_add_tokens(&m, 10, 5);
    CvllmStats st = {0};
    st.num_running = 2;
    st.num_kv_blocks = 100;
    st.kv_blocks_used = 25;
    st.prefix_cache_queries = 40;
    st.prefix_cache_hits = 16;
    SBuf out = {0};
    metrics_render(&m, &st, "my\"model", &out);
    const char *want[] = {"cvllm:num_requests_running{model_name=\"my\\\"model\"} 2\n",
                          "cvllm:num_requests_waiting{model_name=\"my\\\"model\"} 0\n",
                          "cvllm:kv_cache_usage_perc{model_name=\"my\\\"model\"} 0.25\n",
                          "cvllm:prefix_cache_queries_total{model_name=\"my\\\"model\"} 40\n",
                          "cvllm:prefix_cache_hits_total{model_name=\"my\\\"model\"} 16\n",
                          "cvllm:prompt_tokens_total{model_name=\"my\\\"model\"} 10\n",
                          "cvllm:generation_tokens_total{model_name=\"my\\\"model\"} 5\n",
                          "cvllm:num_preemptions_total{model_name=\"my\\\"model\"} 0\n",
                          "cvllm:time_to_first_token_seconds_bucket{model_name=\"my\\\"model\",le=\"0.04\"} 1\n",
                          "cvllm:time_to_first_token_seconds_bucket{model_name=\"my\\\"model\",le=\"0.02\"} 0\n",
                          "cvllm:inter_token_latency_seconds_count{model_name=\"my\\\"model\"} 1\n",
                          "cvllm:e2e_request_latency_seconds_bucket{model_name=\"my\\\"model\",le=\"+Inf\"} 1\n",
                          "# TYPE cvllm:e2e_request_latency_seconds histogram\n",
                          "cvllm:request_success_total{model_name=\"my\\\"model\",finished_reason=\"length\"} 1\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out.s, want[i])) fail_msg("missing: %s\n%s", want[i], out.s);
    sbuf_free(&out);
    metrics_destroy(&m);
}

static void test_live_json(void **state) {
    int64_t owners[] = {-1, -1, 7, 7, -2, 9, -1};
    LiveRequest reqs[] = {{7, 20, 3, 0, 16, 1.0}, {8, 5, 0, 0, 16, 0.5}};
    CvllmStats st = {0};
    SBuf out = {0};
    live_view_json(&out, owners, 7, reqs, 2, &st, 16, "m", 12.5);
    json_t *o = json_loads(out.s, 0, NULL);
    assert_non_null(o);
    assert_int_equal(json_integer_value(json_object_get(o, "num_blocks")), 7);
    assert_int_equal(json_integer_value(json_object_get(o, "blocks_held")), 3);
    assert_int_equal(json_integer_value(json_object_get(o, "blocks_cached")), 1);
    assert_int_equal(json_array_size(json_object_get(o, "blocks")), 5);
    assert_int_equal(json_array_size(json_object_get(o, "running")), 1);
    assert_int_equal(json_array_size(json_object_get(o, "waiting")), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(o, "running"), 0), "blocks")), 2);
    json_decref(o);
    sbuf_free(&out);
    assert_non_null(strstr(LIVE_VIEW_PAGE, "/live.json"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completions_prompts), cmocka_unit_test(test_request_errors),
        cmocka_unit_test(test_chat_request),        cmocka_unit_test(test_tool_parser),
        cmocka_unit_test(test_reasoning_parser),    cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_metrics_text),        cmocka_unit_test(test_live_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
