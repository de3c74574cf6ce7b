/* test_chat_template.c: unit tests of the Jinja chat-template engine. Expected strings were produced
 * by @huggingface/jinja 0.5.11 (new Template(src).render(vars), see tests/templates/render_ref.mjs)
 * with vars = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", ...}]};
 * the end-to-end comparison over whole templates is tests/test_chat_template_ref.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "tokenizer/chat_template.h"

static const char *VARS =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}";

/* Renders src with VARS (and limits, when given); returns the output (malloc'd) or NULL with *code. */
static char *render_lim(const char *src, const ChatTemplateLimits *lim, int *code) {
    ChatTemplate *t = NULL;
    json_t *vars = json_loads(VARS, 0, NULL);
    char *out = NULL;
    *code = chat_template_compile(src, &t);
    if (*code == 0) *code = chat_template_render_ex(t, vars, lim, &out, NULL);
    chat_template_free(t);
    json_decref(vars);
    return out;
}
static char *render(const char *src, int *code) { return render_lim(src, NULL, code); }

static void expect_render(const char *src, const char *want) {
    int code;
    char *got = render(src, &code);
    if (!got) fail_msg("render failed (%d): %s\n  template: %s", code, cvllm_last_error(), src);
    if (strcmp(got, want) != 0) fail_msg("template: %s\n  want: [%s]\n  got:  [%s]", src, want, got);
    free(got);
}

/* Expects an error whose message contains every given fragment. */
static void expect_error(const char *src, int want_code, const char *frag1, const char *frag2) {
    int code;
    char *got = render(src, &code);
    if (got) fail_msg("template: %s\n  expected an error, got [%s]", src, got);
    if (want_code && code != want_code) fail_msg("template: %s\n  code %d, want %d (%s)", src, code, want_code, cvllm_last_error());
    const char *msg = cvllm_last_error();
    if ((frag1 && !strstr(msg, frag1)) || (frag2 && !strstr(msg, frag2)))
        fail_msg("template: %s\n  message [%s] lacks [%s] / [%s]", src, msg, frag1, frag2 ? frag2 : "");
}

static void test_arithmetic_and_printing(void **state) {
    (void)state;
    expect_render("{{ 1 + 2 * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 7 / 2 }}|"
                  "{{ 6 / 2 }}|{{ 1.0 }}|{{ 1.5 + 1 }}|{{ 0.1 + 0.2 }}|{{ 10 ** 21 }}|{{ 2 ** -1 }}",
                  "7|3|-4|1|-1|1024|3.5|3.0|1.0|2.5|0.30000000000000004|1e+21|0.5");
    expect_render("{{ 100000000000000000000 }}|{{ 10 ** 22 }}|{{ 0.000001 }}|{{ 0.0000001 }}|"
                  "{{ -0.0 }}|{{ 1 / 3 }}|{{ 2.5 * 4 }}|{{ 10 / 4 * 2 }}|{{ 9007199254740993 }}",
                  "100000000000000000000|1e+22|0.000001|1e-7|-0.0|0.3333333333333333|10.0|5.0|"
                  "9007199254740992");
    expect_render("{{ 'a' + 1.0 }}|{{ [1, 'x', 2.0, [3, 4.0]] ~ '' }}|{{ {'a': 1} ~ '' }}", "a1|1,x,2.0,[3, 4]|[object Map]");
}

static void test_comparisons_and_logic(void **state) {
    (void)state;
    expect_render("{{ 1 == 1.0 }}|{{ '1' == 1 }}|{{ true == 1 }}|{{ none == undefined_x }}|{{ [1] == [1] }}|"
                  "{{ 'a' != 'b' }}|{{ 0 == '' }}|{{ [1] == '1' }}",
                  "true|true|true|true|false|true|true|true");
    expect_render("{{ [1, 2] + [3] }}|{{ (1, 2) is sequence }}|{{ [1,2] is iterable }}|{{ 'ab' in 'cabd' }}|"
                  "{{ 2 in [1, 2.0] }}|{{ 'x' in {'x': 1} }}|{{ 'q' not in undefined_x }}",
                  "[1, 2, 3]|true|true|true|true|true|true");
    expect_render("{{ 'a\\tb\\u00e9\\x41' }}|{{ \"it's\" }}|{{ 'con' 'cat' }}|{{ not 1 == 2 }}|{{ - 3 }}|{{ -(2) }}|"
                  "{{ 1 if 0 }}|{{ 'yes' if [] else 'no' }}|{{ [] or 'empty' }}|{{ 'a' and 'b' }}",
                  "a\tb\xc3\xa9" "A|it's|concat|true|-3|-2||no|empty|b");
}

static void test_undefined_semantics(void **state) {
    (void)state;
    expect_render("{{ x }}|{{ x.y }}|{{ x is defined }}|{{ none.foo }}|{{ x | default('d') }}|"
                  "{{ '' | default('e', true) }}|{{ 0 | default('z') }}",
                  "||false||d|e|0");
    expect_render("{{ x.y.z | default('deep') }}|{{ messages[0].content }}|{{ messages[-1]['role'] }}|{{ messages[5] }}",
                  "deep|hi|assistant|");
}

static void test_loops_and_scopes(void **state) {
    (void)state;
    expect_render("{%- for i in [1, 2, 3] -%} {{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
                  "{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}; {% endfor %}",
                  "10truefalse332; 21falsefalse321; 32falsetrue310; ");
    expect_render("{% for i in [] %}x{% else %}empty{% endfor %}|{% for i in [1,2,3,4] if i is even %}{{ i }}"
                  "{{ loop.length }}{% endfor %}|{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}|"
                  "{% for k in {'z': 1, 'a': 2} %}{{ k }}{% endfor %}",
                  "empty|2242|a=1,b=2,|za");
    /* HF drops the output of an iteration cut by continue/break, and runs else if none completed */
    expect_render("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}|"
                  "{% for x in [1,2,3] %}a{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}|"
                  "{% for x in [1] %}q{% continue %}{% else %}E{% endfor %}",
                  "13|a1|E");
    expect_render("{% set x = 5 %}{% for i in [1] %}{% set x = 7 %}{{ x }}{% endfor %}{{ x }}|"
                  "{% macro f() %}{{ y }}{% endmacro %}{% set y = 3 %}{{ f() }}|{% if true %}{% set z = 1 %}{% endif %}{{ z }}",
                  "75|3|1");
    expect_render("{{ range(5) }}|{{ range(1, 10, 3) | list }}|{{ range(3, 0, -1) | join }}|{{ (1, 2) | length }}",
                  "[0, 1, 2, 3, 4]|[1, 4, 7]|321|2");
}

static void test_set_namespace_macro(void **state) {
    (void)state;
    expect_render("{% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}|{{ ns }}|{% set a, b = 1, 2 %}"
                  "{{ a }}{{ b }}|{% set blk %}  inner {{ a }} {% endset %}[{{ blk }}]",
                  "2|{\"a\": 2}|12|[  inner 1 ]");
    expect_render("{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|"
                  "{{ m(1, c='y') }}|{{ m('q', b=none) }}",
                  "1-2-x|1-3-x|1-2-y|q--x");
}

static void test_whitespace_control(void **state) {
    (void)state;
    expect_render("  {%- if true %}  a  {% endif -%}  |  {{- 'b' -}}  |{# comment #}  {#- c -#}  d", "  a  |b|d");
    /* trim_blocks + lstrip_blocks, and the one trailing newline HF drops */
    expect_render("{% if x %}\n  text\n{% endif %}\nline\n  {% if true %}\nyes\n  {% endif %}\nend\n", "line\nyes\nend");
    expect_render("{%- generation -%}  gen  {% endgeneration %} after", "gen   after");
}

static void test_string_methods(void **state) {
    (void)state;
    expect_render("{{ 'Hello World'.upper() }}|{{ 'Hello'.lower() }}|{{ '  s  '.strip() }}|{{ 'xxhixx'.strip('x') }}|"
                  "{{ 'a,b,,c'.split(',') }}|{{ '  a  b c '.split() }}|{{ 'a b c d'.split(' ', 1) }}|"
                  "{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'ab'.replace('', '-') }}|{{ 'hello world-foo_bar'.title() }}|"
                  "{{ 'hELLO'.capitalize() }}",
                  "HELLO WORLD|hello|s|xxhixx|[\"a\", \"b\", \"\", \"c\"]|[\"a\", \"b\", \"c\"]|[\"a\", \"b c d\"]|bba|"
                  "-a-b-|Hello World-Foo_bar|HELLO");
    expect_render("{{ 'abc'.startswith('a') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'h\xc3\xa9llo'.length }}|"
                  "{{ '\xf0\x9f\x98\x80" "a' | length }}|{{ 'abc'[0] }}{{ 'abc'[-1] }}|{{ 'abcdef'[1:4] }}|{{ 'abcdef'[::2] }}|"
                  "{{ 'h\xc3\xa9llo\xf0\x9f\x98\x80'[::-1] }}|{{ [1,2,3,4,5][-2:] }}|{{ [1,2,3][5:] }}|{{ [1,2,3,4][::-2] }}",
                  "truetrue|5|3|ac|bcd|ace|\xf0\x9f\x98\x80oll\xc3\xa9h|[4, 5]|[]|[4, 2]");
}

static void test_filters(void **state) {
    (void)state;
    expect_render("{{ {'a': '\xc3\xa9', 'b': [1, 2.5, none, true, '\"q\"\\n']} | tojson }}|{{ [1, {'a': []}, {}] | tojson(indent=2) }}|"
                  "{{ '\xc3\xa9\xf0\x9f\x98\x80' | tojson(ensure_ascii=true) }}|"
                  "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=(',', ':')) }}|{{ x | tojson }}|{{ 1.0 | tojson }}",
                  "{\"a\": \"\xc3\xa9\", \"b\": [1, 2.5, null, true, \"\\\"q\\\"\\n\"]}|[\n  1,\n  {\n    \"a\": []\n  },\n  {}\n]|"
                  "\"\\u00e9\\ud83d\\ude00\"|{\"a\":2,\"b\":1}|null|1");
    expect_render("{{ [3, 1, 2] | sort }}|{{ ['b', 'A', 'c'] | sort }}|{{ [1, 2, 2, 1] | unique }}|{{ [1, 2] | reverse }}|"
                  "{{ [1, 2] | first }}{{ [1, 2] | last }}|{{ ['a', 'b'] | join(', ') }}|{{ 'abc' | join('-') }}|"
                  "{{ '12abc' | int }}|{{ 'x' | int }}|{{ '3.5e1x' | float }}|{{ 3.7 | int }}|{{ -3 | abs }}|{{ 5 | float }}|"
                  "{{ true | int }}|{{ 2.0 | string }}",
                  "[1, 2, 3]|[\"A\", \"b\", \"c\"]|[1, 2]|[2, 1]|12|a, b|a-b-c|12|0|35.0|3|3|5.0|1|2.0");
    expect_render("{{ {'b': 2, 'a': 1} | dictsort }}|{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('z', 'd') }}{{ {'a': 1}.get('z') }}|"
                  "{{ {'a': 1}.keys() }}{{ {'a': 1}.values() }}|{{ {'a': 1} | items }}|{{ {'a': 1, 'b': 2} | length }}",
                  "[[\"a\", 1], [\"b\", 2]]|1d|[\"a\"][1]|[[\"a\", 1]]|2");
    expect_render("{{ [{'a': 1, 'b': 'x'}, {'a': 0}, {'b': 'y'}] | selectattr('a') | list | length }}|"
                  "{{ [{'a': 1}, {'a': 2}] | map(attribute='a') | join(',') }}|"
                  "{{ [{'n': {'v': 3}}, {'n': {}}] | map(attribute='n.v', default=0) | list }}|"
                  "{{ [{'r': 'u'}, {'r': 'a'}] | rejectattr('r', 'equalto', 'u') | list }}|{{ [{'x': 2}, {'x': 1}] | sort(attribute='x') }}",
                  "1|1,2|[3, 0]|[{\"r\": \"a\"}]|[{\"x\": 1}, {\"x\": 2}]");
    expect_render("{{ 'x' | indent(2, true) }}|{{ 'a\\n\\nb' | indent }}|{{ 'a\\nb' | indent(first=true, blank=true, width=1) }}|"
                  "{{ '  x ' | trim }}|{{ 'a-b' | replace('-', '+') }}|{{ 'abc' | upper | lower }}|{{ 'x' | safe }}",
                  "  x|a\n\n    b| a\n b|x|a+b|abc|x");
}

static void test_tests(void **state) {
    (void)state;
    expect_render("{{ 1 is odd }}{{ 2 is even }}{{ 'a' is string }}{{ 1 is number }}{{ 1.5 is integer }}{{ {} is mapping }}"
                  "{{ none is none }}{{ true is boolean }}{{ x is undefined }}{{ 'abc' is lower }}{{ 1 is not none }}"
                  "{{ [1] is sequence }}",
                  "truetruetruetruefalsetruetruetruetruetruetruetrue");
}

static void test_errors_name_construct_and_position(void **state) {
    (void)state;
    expect_error("line1\n{% call foo() %}x{% endcall %}", CVLLM_EUNSUPPORTED, "line 2, column 4", "call");
    expect_error("{{ f(*args) }}", CVLLM_EUNSUPPORTED, "column 6", "unpacking");
    expect_error("{% with x = 1 %}{% endwith %}", CVLLM_EUNSUPPORTED, "line 1, column 1", "'with'");
    expect_error("ab\n  {{ x | frobnicate }}", 0, "line 2, column 10", "frobnicate");
    expect_error("{{ 1 + none }}", 0, "column 6", "null");
    expect_error("{{ 'a' < 'b' }}", 0, "column 8", "unknown operator");
    expect_error("{{ [] | first }}", 0, "column 9", "empty list");
}

static void test_errors_raise_exception(void **state) {
    (void)state;
    expect_error("{% if messages[0].role == 'user' %}{{ raise_exception('Roles must alternate: ' ~ messages | length) }}{% endif %}",
                 CVLLM_EINVAL, "Roles must alternate: 2", "column 39");
}

static void test_errors_unclosed(void **state) {
    (void)state;
    expect_error("x\n{% if x %}abc", CVLLM_EFORMAT, "line 2, column 4", "unclosed 'if'");
    expect_error("{% for a in b %}{% endif %}", CVLLM_EFORMAT, "column 17", "endif");
    expect_error("{{ x", CVLLM_EFORMAT, "end of template", NULL);
    expect_error("{{ 'abc }}", CVLLM_EFORMAT, "unterminated string", NULL);
    expect_error("{# comment", CVLLM_EFORMAT, "unclosed comment", NULL);
    expect_error("{% macro m() %}x", CVLLM_EFORMAT, "unclosed 'macro'", NULL);
    expect_error("{{ (1, 2 }}", CVLLM_EFORMAT, "expected ')'", NULL);
    expect_error("{% set x = 1 %}{% endfor %}", CVLLM_EFORMAT, "endfor", NULL);
}

static void test_limits(void **state) {
    (void)state;
    ChatTemplateLimits lim;
    chat_template_limits_default(&lim);
    lim.max_iterations = 1000;
    lim.max_output = 1 << 16;
    int code;
    char *out = render_lim("{% for i in range(100) %}{% for j in range(100) %}x{% endfor %}{% endfor %}", &lim, &code);
    assert_null(out);
    assert_non_null(strstr(cvllm_last_error(), "iterations"));
    out = render_lim("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                     &lim, &code);
    assert_null(out);
    assert_int_equal(code, CVLLM_ENOMEM);
    out = render_lim("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", &lim, &code);
    assert_null(out);
    assert_non_null(strstr(cvllm_last_error(), "deeper"));
}

static void test_variables_from_json(void **state) {
    (void)state;
    ChatTemplate *t;
    assert_int_equal(chat_template_compile("{{ obj | tojson }}|{{ n }}|{{ f }}|{{ flag }}|{{ nothing is none }}", &t), 0);
    /* JSON.parse + Object.entries: 2.0 is an integer, index-like keys come first */
    json_t *vars = json_loads("{\"obj\": {\"b\": 1, \"2\": 2, \"1\": 3}, \"n\": 2.0, \"f\": 2.5, \"flag\": true, \"nothing\": null}", 0, NULL);
    char *out;
    assert_int_equal(chat_template_render(t, vars, &out), 0);
    assert_string_equal(out, "{\"1\": 3, \"2\": 2, \"b\": 1}|2|2.5|true|true");
    free(out);
    json_decref(vars);
    vars = json_loads("{\"true\": 1}", 0, NULL); /* HF refuses to redeclare its globals */
    assert_true(chat_template_render(t, vars, &out) < 0);
    json_decref(vars);
    chat_template_free(t);
    chat_template_free(NULL);
}

/* The shapes every template relies on, checked before a render, each refusal naming the element. */
static void check_inputs(const char *messages, const char *tools, const char *want) {
    json_t *m = json_loads(messages, JSON_DECODE_ANY, NULL), *t = tools ? json_loads(tools, JSON_DECODE_ANY, NULL) : NULL;
    assert_non_null(m);
    int rc = chat_template_check_inputs(m, t);
    if (want ? rc != CVLLM_EINVAL || !strstr(cvllm_last_error(), want) : rc != 0)
        fail_msg("%s / %s: rc %d, %s (expected %s)", messages, tools ? tools : "-", rc,
                 rc ? cvllm_last_error() : "", want ? want : "success");
    json_decref(m);
    json_decref(t);
}

static void test_check_inputs(void **state) {
    (void)state;
    check_inputs("[]", NULL, NULL);
    check_inputs("[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": null, "
                 "\"tool_calls\": [{\"function\": {\"name\": \"f\"}}]}, {\"role\": \"ipython\", \"content\": "
                 "{\"ok\": true}}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}]",
                 "[{\"type\": \"function\"}]", NULL);
    check_inputs("{\"role\": \"user\"}", NULL, "messages must be an array of messages, got an object");
    check_inputs("[\"hi\"]", NULL, "messages[0] must be an object, got a string");
    check_inputs("[{\"role\": \"user\"}, {\"content\": \"x\"}]", NULL, "messages[1]: \"role\" must be a string, got none");
    check_inputs("[{\"role\": 3}]", NULL, "messages[0]: \"role\" must be a string, got a number");
    check_inputs("[{\"role\": \"a\", \"tool_calls\": {}}]", NULL, "messages[0]: \"tool_calls\" must be an array");
    check_inputs("[]", "{\"not\": \"array\"}", "tools must be an array of tool definitions, got an object");
    check_inputs("[]", "[{}, 1]", "tools[1] must be an object, got a number");
}

static void test_llama3_style_template_compiles(void **state) {
    (void)state;
    size_t n;
    char *src = read_file("tests/templates/llama3_style.jinja", &n);
    assert_non_null(src);
    ChatTemplate *t;
    assert_int_equal(chat_template_compile(src, &t), 0);
    json_t *vars = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"Hello?\"}], \"bos_token\": \"<s>\","
                              " \"add_generation_prompt\": true}", 0, NULL);
    char *out;
    assert_int_equal(chat_template_render(t, vars, &out), 0);
    assert_non_null(strstr(out, "<s><|start_header_id|>system<|end_header_id|>\n\n"));
    assert_non_null(strstr(out, "Hello? [first] [greeting:Hello?] [question #1, odd]<|eot_id|><|start_header_id|>assistant"));
    free(out);
    json_decref(vars);
    chat_template_free(t);
    free(src);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arithmetic_and_printing),
        cmocka_unit_test(test_comparisons_and_logic),
        cmocka_unit_test(test_undefined_semantics),
        cmocka_unit_test(test_loops_and_scopes),
        cmocka_unit_test(test_set_namespace_macro),
        cmocka_unit_test(test_whitespace_control),
        cmocka_unit_test(test_string_methods),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_tests),
        cmocka_unit_test(test_errors_name_construct_and_position),
        cmocka_unit_test(test_errors_raise_exception),
        cmocka_unit_test(test_errors_unclosed),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_variables_from_json),
        cmocka_unit_test(test_llama3_style_template_compiles),
        cmocka_unit_test(test_check_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
