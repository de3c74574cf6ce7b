/* fuzz_template.c: libFuzzer target for the Jinja chat-template engine. Compiles arbitrary bytes as
 * a template and renders it with a small fixed set of variables (a conversation with a tool call,
 * tools, flags). Tight limits (output, memory, loop iterations, depth) turn runaway templates into
 * errors; any crash, sanitizer report or hang is a bug. Seeds: fuzz/corpus/fuzz_template/. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "tokenizer/chat_template.h"

static const char *VARS =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi <think>x</think> \\u00e9\\ud83d\\ude00\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"r\", \"tool_calls\": [{\"function\":"
    " {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true], \"b\": \"s\"}}}]},"
    " {\"role\": \"tool\", \"content\": \"{\\\"ok\\\": 1}\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"enable_thinking\": false, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *vars;
    if (!vars) vars = json_loads(VARS, 0, NULL);
    ChatTemplate *t = NULL;
    if (chat_template_compile_n((const char *)data, size, &t) == 0) {
        ChatTemplateLimits lim;
        chat_template_limits_default(&lim);
        lim.max_output = 1 << 20;
        lim.max_memory = 64u << 20;
        lim.max_iterations = 20000;
        lim.max_depth = 200;
        char *out = NULL;
        size_t n;
        if (chat_template_render_ex(t, vars, &lim, &out, &n) == 0) free(out);
    }
    chat_template_free(t);
    return 0;
}
