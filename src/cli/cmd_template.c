/* cmd_template.c: `cvllm template`, renders a model's chat template for a conversation and prints
 * the prompt exactly (no newline added). Needs only MODEL_DIR/tokenizer_config.json:
 * chat_template is a string, or a list of {name, template} (the one named "default" is used);
 * bos_token / eos_token are strings or {"content": ...} objects (absent or null: not defined).
 *
 *   cvllm template MODEL_DIR --messages M.json [--tools T.json] [--add-generation-prompt]
 *                  [--chat-template-kwargs JSON]
 * Variables: messages, tools (if given), add_generation_prompt, bos_token, eos_token, then every
 * key of --chat-template-kwargs (which wins on a clash, as in transformers).
 * Exit codes: 0 ok, 1 runtime error (files, JSON, template errors), 2 usage. */
#include <jansson.h>
#include <string.h>

#include "cli/commands.h"
#include "common.h"
#include "tokenizer/chat_template.h"

static void template_usage(FILE *f) {
    fprintf(f, "usage: cvllm template MODEL_DIR --messages M.json [--tools T.json]\n"
               "                      [--add-generation-prompt] [--chat-template-kwargs JSON]\n"
               "  MODEL_DIR                    folder with tokenizer_config.json (chat_template)\n"
               "  --messages M.json            the conversation: a JSON array of messages\n"
               "  --tools T.json               tool definitions: a JSON array (variable `tools`)\n"
               "  --add-generation-prompt      set add_generation_prompt to true\n"
               "  --chat-template-kwargs JSON  a JSON object; each key becomes a variable,\n"
               "                               e.g. '{\"enable_thinking\": false}'\n"
               "Prints the rendered prompt exactly, without an added newline.\n");
}

/* A JSON file (a regular file: file_read), or NULL with the message printed. */
static json_t *load_json_file(const char *path, size_t max_bytes, size_t flags) {
    size_t len;
    char *text = file_read(path, max_bytes, &len);
    json_t *j = text ? cvllm_json_parse(text, len, JSON_DECODE_ANY | flags, path) : NULL;
    if (!j) fprintf(stderr, "cvllm template: %s\n", cvllm_last_error());
    free(text);
    return j;
}

/* bos_token / eos_token: a string or {"content": "..."}; NULL if absent. */
static json_t *special_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? json_incref(v) : NULL;
}

static const char *find_template(json_t *cfg) {
    json_t *t = json_object_get(cfg, "chat_template");
    if (json_is_string(t)) return json_string_value(t);
    if (json_is_array(t)) {
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e) {
            json_t *name = json_object_get(e, "name"), *src = json_object_get(e, "template");
            if (json_is_string(name) && strcmp(json_string_value(name), "default") == 0 && json_is_string(src))
                return json_string_value(src);
        }
    }
    return NULL;
}

int cmd_template(int argc, char **argv) {
    const char *model_dir = NULL, *messages_path = NULL, *tools_path = NULL, *kwargs_text = NULL;
    int add_generation_prompt = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            template_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--add-generation-prompt")) {
            add_generation_prompt = 1;
        } else if (!strcmp(a, "--messages") || !strcmp(a, "--tools") || !strcmp(a, "--chat-template-kwargs")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "cvllm template: %s needs a value\n", a);
                template_usage(stderr);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--messages")) messages_path = v;
            else if (!strcmp(a, "--tools")) tools_path = v;
            else kwargs_text = v;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "cvllm template: unknown option %s\n", a);
            template_usage(stderr);
            return 2;
        } else if (!model_dir) {
            model_dir = a;
        } else {
            fprintf(stderr, "cvllm template: unexpected argument %s\n", a);
            template_usage(stderr);
            return 2;
        }
    }
    if (!model_dir || !messages_path) {
        fprintf(stderr, "cvllm template: %s is required\n", !model_dir ? "MODEL_DIR" : "--messages");
        template_usage(stderr);
        return 2;
    }
    json_t *kwargs = NULL;
    if (kwargs_text) {
        kwargs = cvllm_json_parse(kwargs_text, strlen(kwargs_text), JSON_DECODE_ANY | JSON_ALLOW_NUL,
                                  "--chat-template-kwargs");
        if (!json_is_object(kwargs)) {
            if (kwargs) fprintf(stderr, "cvllm template: --chat-template-kwargs must be a JSON object\n");
            else fprintf(stderr, "cvllm template: %s\n", cvllm_last_error());
            json_decref(kwargs);
            template_usage(stderr);
            return 2;
        }
    }

    int rc = 1;
    char *cfg_path = path_join(model_dir, "tokenizer_config.json");
    json_t *cfg = load_json_file(cfg_path, FILE_MAX_TOKENIZER_CONFIG, 0);
    json_t *vars = json_object(), *messages = NULL, *tools = NULL;
    ChatTemplate *t = NULL;
    char *out = NULL;
    size_t out_len = 0;
    const char *src = cfg ? find_template(cfg) : NULL;
    char *jinja_src = NULL; /* transformers 5 keeps the template in chat_template.jinja */
    if (!cfg) goto done;
    if (!src) {
        char *jinja_path = path_join(model_dir, "chat_template.jinja");
        int have = path_probe(jinja_path);
        if (have > 0) src = jinja_src = file_read(jinja_path, FILE_MAX_TOKENIZER_CONFIG, NULL);
        free(jinja_path);
        if (have < 0 || (have > 0 && !src)) {
            fprintf(stderr, "cvllm template: %s\n", cvllm_last_error());
            goto done;
        }
    }
    if (!src) {
        fprintf(stderr, "cvllm template: %s has no chat_template (a string, or a list with a "
                        "\"default\" entry) and %s/chat_template.jinja is absent\n", cfg_path, model_dir);
        goto done;
    }
    if (!(messages = load_json_file(messages_path, FILE_MAX_DEFAULT, JSON_ALLOW_NUL))) goto done;
    if (tools_path && !(tools = load_json_file(tools_path, FILE_MAX_DEFAULT, JSON_ALLOW_NUL))) goto done;
    if (chat_template_check_inputs(messages, NULL) < 0) {
        fprintf(stderr, "cvllm template: %s: %s\n", messages_path, cvllm_last_error());
        goto done;
    }
    json_t *no_messages = json_array();
    int tools_rc = chat_template_check_inputs(no_messages, tools);
    json_decref(no_messages);
    if (tools_rc < 0) {
        fprintf(stderr, "cvllm template: %s: %s\n", tools_path, cvllm_last_error());
        goto done;
    }
    json_object_set(vars, "messages", messages);
    if (tools) json_object_set(vars, "tools", tools);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    json_t *bos = special_token(cfg, "bos_token"), *eos = special_token(cfg, "eos_token");
    if (bos) json_object_set_new(vars, "bos_token", bos);
    if (eos) json_object_set_new(vars, "eos_token", eos);
    if (kwargs) json_object_update(vars, kwargs);

    if (chat_template_compile(src, &t) < 0 || chat_template_render_ex(t, vars, NULL, &out, &out_len) < 0) {
        fprintf(stderr, "cvllm template: %s\n", cvllm_last_error());
        goto done;
    }
    fwrite(out, 1, out_len, stdout);
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    free(jinja_src);
    free(out);
    chat_template_free(t);
    json_decref(messages);
    json_decref(tools);
    json_decref(vars);
    json_decref(cfg);
    json_decref(kwargs);
    free(cfg_path);
    return rc;
}
