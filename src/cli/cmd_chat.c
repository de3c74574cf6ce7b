/* cmd_chat.c: `cvllm chat MODEL_DIR`: an interactive chat. Each user line is appended to the
 * conversation, the model's own chat template renders it, and the reply streams as it is
 * generated. Works with a pipe too (one user message per line; no prompts are printed). */
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/textgen.h"
#include "common.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

static const char USAGE[] =
    "usage: cvllm chat MODEL_DIR [options] [engine options]\n"
    "  --system TEXT                 a system message first\n"
    "  --max-tokens N (1024)  --temperature F (0.7)  --top-p F (0.8)  --top-k N (20)\n"
    "  --min-p F (0)  --seed N\n"
    "  --chat-template-kwargs JSON   extra template variables, e.g. '{\"enable_thinking\": false}'\n"
    "Type a message and press Enter; an empty line or end of input quits.\n";

int cmd_chat(int argc, char **argv) {
    CvllmEngineOptions eo;
    cvllm_engine_options_default(&eo);
    eo.verbose = 0;
    CvllmSamplingParams p;
    cvllm_sampling_params_default(&p);
    p.max_tokens = 1024;
    p.temperature = 0.7f;
    p.top_p = 0.8f;
    p.top_k = 20;
    const char *model_dir = NULL, *system = NULL, *kwargs_text = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long n;
        double f;
        int r = cli_parse_engine_option(argc, argv, &i, &eo);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { printf("%s\n%s", USAGE, CLI_ENGINE_OPTIONS_HELP); return 0; }
        else if (!strcmp(a, "--system")) { if (!(system = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--chat-template-kwargs")) { if (!(kwargs_text = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--max-tokens")) { if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 1, INT32_MAX, &n) < 0) return 2; p.max_tokens = (int)n; }
        else if (!strcmp(a, "--temperature")) { if (!(v = cli_value(argc, argv, &i)) || cli_float(a, v, 0, 1e6, &f) < 0) return 2; p.temperature = (float)f; }
        else if (!strcmp(a, "--top-p")) { if (!(v = cli_value(argc, argv, &i)) || cli_float(a, v, 1e-9, 1, &f) < 0) return 2; p.top_p = (float)f; }
        else if (!strcmp(a, "--top-k")) { if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, -1, INT32_MAX, &n) < 0) return 2; p.top_k = (int)n; }
        else if (!strcmp(a, "--min-p")) { if (!(v = cli_value(argc, argv, &i)) || cli_float(a, v, 0, 1, &f) < 0) return 2; p.min_p = (float)f; }
        else if (!strcmp(a, "--seed")) { if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 0, INT64_MAX, &n) < 0) return 2; p.seed = n; }
        else if (a[0] != '-' && !model_dir) model_dir = a;
        else { fprintf(stderr, "cvllm chat: unknown argument '%s'\n\n%s", a, USAGE); return 2; }
    }
    if (!model_dir) { fprintf(stderr, "%s", USAGE); return 2; }

    int rc = 1;
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
        if (len == 0) { if (interactive) break; else continue; }
        json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "user", "content", line));
        char *prompt = NULL;
        if (chat_template_render(tmpl, vars, &prompt) < 0) { fprintf(stderr, "cvllm chat: chat template: %s\n", cvllm_last_error()); goto done; }
        int32_t *ids = NULL;
        int n = tokenizer_encode(tok, prompt, strlen(prompt), &ids);
        free(prompt);
        if (n < 0) { fprintf(stderr, "cvllm chat: %s\n", cvllm_last_error()); goto done; }
        int64_t id = cvllm_engine_add_request(e, ids, n, &p);
        free(ids);
        if (id < 0) {
            /* e.g. the conversation outgrew max_model_len: say so and forget the last message */
            fprintf(stderr, "cvllm chat: %s\n", cvllm_last_error());
            json_array_remove(messages, json_array_size(messages) - 1);
            continue;
        }
        TextStream ts;
        textgen_init(&ts, id, tok, NULL, 0);
        while (cvllm_engine_has_unfinished(e)) {
            if (cvllm_engine_step(e) < 0 || textgen_update(e, &ts) < 0) {
                fprintf(stderr, "cvllm chat: %s\n", cvllm_last_error());
                textgen_free(&ts);
                goto done;
            }
            const char *s;
            size_t k;
            textgen_streamable(&ts, &s, &k);
            fwrite(s, 1, k, stdout);
            fflush(stdout);
        }
        textgen_update(e, &ts);
        const char *s;
        size_t k;
        textgen_streamable(&ts, &s, &k);
        fwrite(s, 1, k, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        json_array_append_new(messages, json_pack("{s:s,s:s%}", "role", "assistant", "content", ts.text, ts.len));
        CvllmOutput out;
        if (cvllm_engine_take_output(e, id, &out) == 1) cvllm_output_free(&out);
        textgen_free(&ts);
    }
    rc = 0;
done:
    free(line);
    json_decref(messages);
    json_decref(vars);
    cvllm_engine_destroy(e);
    chat_template_free(tmpl);
    tokenizer_free(tok);
    return rc;
}
