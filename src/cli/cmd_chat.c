/* cmd_chat.c: `cvllm chat MODEL_DIR`: an interactive chat. Each user line is appended to the
 * conversation, the model's own chat template renders it, and the reply streams as it is
 * generated. Works with a pipe too (one user message per line; no prompts are printed). */
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_sampling.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

static const char USAGE[] =
    "usage: cvllm chat MODEL_DIR [options] [engine options]\n"
    "  --system TEXT                 a system message first\n"
    "  --chat-template-kwargs JSON   extra template variables, e.g. '{\"enable_thinking\": false}'\n"
    "  sampling options (below); defaults: --max-tokens -1 (what the context leaves),\n"
    "  --temperature 0.7 --top-p 0.8 --top-k 20 (Qwen3's recommended values)\n"
    "Type a message and press Enter; an empty line or end of input quits. A line of spaces is\n"
    "ignored. Invalid UTF-8 or a NUL byte in a line is an error (the line is not sent).\n"
    "Exit code: 0, or 1 if any turn failed.\n";

int cmd_chat(int argc, char **argv) {
    CvllmEngineOptions eo;
    cvllm_engine_options_default(&eo);
    eo.verbose = 0;
    CvllmSamplingParams p;
    cvllm_sampling_params_default(&p);
    p.max_tokens = -1; /* what the context leaves, as vLLM */
    p.temperature = 0.7f;
    p.top_p = 0.8f;
    p.top_k = 20;
    CliSampling cs;
    cli_sampling_init(&cs, &p);
    const char *model_dir = NULL, *system = NULL, *kwargs_text = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_parse_engine_option(argc, argv, &i, &eo);
        if (r == 0) r = cli_parse_sampling_option(argc, argv, &i, &cs);
        if (r < 0) { cli_sampling_free(&cs); return 2; }
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { printf("%s\n%s\n%s", USAGE, CLI_SAMPLING_OPTIONS_HELP, CLI_ENGINE_OPTIONS_HELP); cli_sampling_free(&cs); return 0; }
        else if (!strcmp(a, "--system")) { if (!(system = cli_value(argc, argv, &i))) { cli_sampling_free(&cs); return 2; } }
        else if (!strcmp(a, "--chat-template-kwargs")) { if (!(kwargs_text = cli_value(argc, argv, &i))) { cli_sampling_free(&cs); return 2; } }
        else if (a[0] != '-' && !model_dir) model_dir = a;
        else { fprintf(stderr, "cvllm chat: unknown argument '%s'\n\n%s", a, USAGE); cli_sampling_free(&cs); return 2; }
    }
    p = cs.p;
    if (!model_dir) { fprintf(stderr, "%s", USAGE); cli_sampling_free(&cs); return 2; }

    int rc = 1, failed_turns = 0;
    Tokenizer *tok = NULL;
    ChatTemplate *tmpl = NULL;
    CvllmEngine *e = NULL;
    json_t *vars = json_object(), *messages = json_array();
    char *line = NULL;
    size_t cap = 0;
    if (kwargs_text) {
        json_error_t jerr;
        json_t *kw = json_loads(kwargs_text, 0, &jerr);
        if (!json_is_object(kw)) {
            fprintf(stderr, "cvllm chat: --chat-template-kwargs must be a JSON object (%s)\n", kw ? "wrong type" : jerr.text);
            json_decref(kw);
            rc = 2;
            goto done;
        }
        json_object_update(vars, kw);
        json_decref(kw);
    }
    if (tokenizer_load(model_dir, &tok) < 0) { fprintf(stderr, "cvllm chat: %s\n", cvllm_last_error()); goto done; }
    if (!tokenizer_chat_template(tok)) {
        fprintf(stderr, "cvllm chat: %s has no chat_template in tokenizer_config.json\n", model_dir);
        goto done;
    }
    if (chat_template_compile(tokenizer_chat_template(tok), &tmpl) < 0) {
        fprintf(stderr, "cvllm chat: chat template: %s\n", cvllm_last_error());
        goto done;
    }
    if (cvllm_engine_create(model_dir, &eo, &e) < 0) { fprintf(stderr, "cvllm chat: %s\n", cvllm_last_error()); goto done; }
    json_object_set(vars, "messages", messages);
    json_object_set_new(vars, "add_generation_prompt", json_true());
    if (tokenizer_bos_token(tok)) json_object_set_new(vars, "bos_token", json_string(tokenizer_bos_token(tok)));
    if (tokenizer_eos_token(tok)) json_object_set_new(vars, "eos_token", json_string(tokenizer_eos_token(tok)));
    if (system) json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "system", "content", system));
    int interactive = isatty(0);
    if (interactive) fprintf(stderr, "cvllm chat: %s (empty line or Ctrl-D quits)\n", model_dir);
    for (;;) {
        if (interactive) { fputs("\n> ", stdout); fflush(stdout); }
        ssize_t len = getline(&line, &cap, stdin);
        if (len < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) break; /* an empty line quits */
        if (strlen(line) != (size_t)len) {
            fprintf(stderr, "cvllm chat: the line contains a NUL byte; not sent\n");
            failed_turns++;
            continue;
        }
        int blank = 1;
        for (ssize_t k = 0; k < len && blank; k++) blank = line[k] == ' ' || line[k] == '\t';
        if (blank) continue;
        json_t *msg = json_pack("{s:s,s:s}", "role", "user", "content", line);
        if (!msg) { /* jansson refuses invalid UTF-8 */
            fprintf(stderr, "cvllm chat: the line is not valid UTF-8; not sent\n");
            failed_turns++;
            continue;
        }
        json_array_append_new(messages, msg);
        char *prompt = NULL;
        if (chat_template_render(tmpl, vars, &prompt) < 0) { fprintf(stderr, "cvllm chat: chat template: %s\n", cvllm_last_error()); goto done; }
        CvllmRequest q = {.prompt = prompt, .prompt_len = strlen(prompt), .params = p};
        int64_t id = cvllm_engine_submit(e, &q);
        free(prompt);
        if (id < 0) {
            /* e.g. the conversation outgrew max_model_len: say so and forget the last message */
            fprintf(stderr, "cvllm chat: %s\n", cvllm_last_error());
            json_array_remove(messages, json_array_size(messages) - 1);
            failed_turns++;
            continue;
        }
        json_t *reply = NULL;
        while (cvllm_engine_has_unfinished(e)) {
            const CvllmRequestOutput *outs;
            int n;
            cvllm_engine_step(e, &outs, &n);
            for (int k = 0; k < n; k++) {
                fwrite(outs[k].new_text, 1, outs[k].new_text_len, stdout);
                fflush(stdout);
                if (outs[k].finish_reason == CVLLM_FINISH_NONE) continue;
                if (outs[k].error) {
                    fprintf(stderr, "\ncvllm chat: %s\n", outs[k].error);
                    failed_turns++;
                } else {
                    reply = json_pack("{s:s,s:s%}", "role", "assistant", "content", outs[k].text,
                                      outs[k].text_len);
                }
            }
        }
        fputc('\n', stdout);
        fflush(stdout);
        if (reply) json_array_append_new(messages, reply);
        else json_array_remove(messages, json_array_size(messages) - 1);
    }
    rc = failed_turns ? 1 : 0;
done:
    free(line);
    json_decref(messages);
    json_decref(vars);
    cvllm_engine_destroy(e);
    chat_template_free(tmpl);
    tokenizer_free(tok);
    cli_sampling_free(&cs);
    return rc;
}
