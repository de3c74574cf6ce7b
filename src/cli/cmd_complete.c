/* cmd_complete.c: `cvllm complete MODEL_DIR`: completions for prompts given as text or token ids,
 * on the command line or in a JSON-lines file, printed as text or as one JSON array. */
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/textgen.h"
#include "common.h"
#include "tokenizer/tokenizer.h"

static const char USAGE[] =
    "usage: cvllm complete MODEL_DIR [prompts] [sampling] [engine options]\n"
    "prompts (repeatable, kept in order):\n"
    "  --prompt TEXT              a text prompt (needs tokenizer.json in MODEL_DIR)\n"
    "  --prompt-ids 1,2,3         a prompt as token ids (separated by commas, no spaces)\n"
    "  --prompt-file F.jsonl      one request a line: {\"prompt\": \"...\"} or\n"
    "                             {\"prompt_token_ids\": [...]}, plus any sampling field below\n"
    "sampling (defaults for every request; fields in --prompt-file lines override):\n"
    "  --max-tokens N (16)  --temperature F (1.0; 0 = greedy)  --top-p F (1)  --top-k N (off)\n"
    "  --min-p F (0)  --seed N  --ignore-eos  --stop STR (repeatable)  --stop-token-ids 1,2\n"
    "output:\n"
    "  --output text|json         json: one array in submission order, each {prompt_token_ids,\n"
    "                             token_ids, text, finish_reason, num_cached_tokens} or {error}\n";

typedef struct {
    char *text;           /* prompt text or NULL */
    int32_t *ids;         /* prompt ids (owned) */
    int n;
    CvllmSamplingParams p;
    int32_t *stop_ids;    /* owned */
    char **stops;         /* owned */
    int num_stops;
    char *error;          /* refused: the reason (owned) */
    int64_t id;
    TextStream ts;
} Req;

typedef struct {
    Req *reqs;
    int n, cap;
} ReqList;

static const char *finish_name(CvllmFinishReason r) {
    switch (r) {
    case CVLLM_FINISH_STOP: return "stop";
    case CVLLM_FINISH_LENGTH: return "length";
    case CVLLM_FINISH_ABORT: return "abort";
    default: return NULL;
    }
}

static Req *new_req(ReqList *l, const CvllmSamplingParams *defaults, char **stops, int num_stops) {
    Req r = {0};
    r.p = *defaults;
    r.id = -1;
    if (num_stops) {
        r.stops = xcalloc((size_t)num_stops, sizeof(char *));
        for (int i = 0; i < num_stops; i++) r.stops[i] = xstrdup(stops[i]);
        r.num_stops = num_stops;
    }
    if (defaults->num_stop_token_ids) {
        r.stop_ids = xmalloc((size_t)defaults->num_stop_token_ids * sizeof(int32_t));
        memcpy(r.stop_ids, defaults->stop_token_ids, (size_t)defaults->num_stop_token_ids * sizeof(int32_t));
        r.p.stop_token_ids = r.stop_ids;
    }
    DA_PUSH(l->reqs, l->n, l->cap, r);
    return &l->reqs[l->n - 1];
}

static void set_error(Req *r, const char *fmt, const char *detail) {
    char buf[2048];
    snprintf(buf, sizeof buf, fmt, detail);
    free(r->error);
    r->error = xstrdup(buf);
}

/* Applies one --prompt-file line's fields to r. Errors go to r->error (the request is refused,
 * the others go on). */
static void parse_line(Req *r, const char *line, int lineno) {
    char ctx[64];
    snprintf(ctx, sizeof ctx, "line %d", lineno);
    json_error_t jerr;
    json_t *o = json_loads(line, 0, &jerr);
    if (!o || !json_is_object(o)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s: not a JSON object (%s)", ctx, o ? "wrong type" : jerr.text);
        set_error(r, "%s", msg);
        json_decref(o);
        return;
    }
    const char *key;
    json_t *v;
    char msg[512];
    msg[0] = 0;
    json_object_foreach(o, key, v) {
        if (!strcmp(key, "prompt")) {
            if (!json_is_string(v)) { snprintf(msg, sizeof msg, "%s: \"prompt\" must be a string", ctx); break; }
            r->text = xstrdup(json_string_value(v));
        } else if (!strcmp(key, "prompt_token_ids") || !strcmp(key, "stop_token_ids")) {
            int is_prompt = key[0] == 'p';
            if (!json_is_array(v)) { snprintf(msg, sizeof msg, "%s: \"%s\" must be an array of ids", ctx, key); break; }
            size_t n = json_array_size(v);
            int32_t *ids = xmalloc((n ? n : 1) * sizeof(int32_t));
            for (size_t i = 0; i < n && !msg[0]; i++) {
                json_t *x = json_array_get(v, i);
                if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
                    snprintf(msg, sizeof msg, "%s: \"%s\"[%zu] is not a token id", ctx, key, i);
                else ids[i] = (int32_t)json_integer_value(x);
            }
            if (msg[0]) { free(ids); break; }
            if (is_prompt) { free(r->ids); r->ids = ids; r->n = (int)n; }
            else { free(r->stop_ids); r->stop_ids = ids; r->p.stop_token_ids = ids; r->p.num_stop_token_ids = (int)n; }
        } else if (!strcmp(key, "stop")) {
            json_t *arr = json_is_string(v) ? json_pack("[O]", v) : json_incref(v);
            if (!json_is_array(arr)) { json_decref(arr); snprintf(msg, sizeof msg, "%s: \"stop\" must be a string or an array of strings", ctx); break; }
            for (int i = 0; i < r->num_stops; i++) free(r->stops[i]);
            free(r->stops);
            r->num_stops = (int)json_array_size(arr);
            r->stops = xcalloc((size_t)r->num_stops + 1, sizeof(char *));
            for (int i = 0; i < r->num_stops; i++) {
                json_t *s = json_array_get(arr, (size_t)i);
                r->stops[i] = xstrdup(json_is_string(s) ? json_string_value(s) : "");
                if (!json_is_string(s)) snprintf(msg, sizeof msg, "%s: \"stop\" entries must be strings", ctx);
            }
            json_decref(arr);
            if (msg[0]) break;
        } else if (!strcmp(key, "ignore_eos")) {
            if (!json_is_boolean(v)) { snprintf(msg, sizeof msg, "%s: \"ignore_eos\" must be true or false", ctx); break; }
            r->p.ignore_eos = json_is_true(v);
        } else if (!strcmp(key, "max_tokens") || !strcmp(key, "top_k") || !strcmp(key, "seed")) {
            if (!json_is_integer(v)) { snprintf(msg, sizeof msg, "%s: \"%s\" must be an integer", ctx, key); break; }
            json_int_t x = json_integer_value(v);
            if (key[0] == 'm') {
                if (x < 1 || x > INT32_MAX) { snprintf(msg, sizeof msg, "%s: \"max_tokens\" must be >= 1", ctx); break; }
                r->p.max_tokens = (int)x;
            } else if (key[0] == 't') {
                if (x < -1 || x > INT32_MAX) { snprintf(msg, sizeof msg, "%s: \"top_k\" must be -1 or >= 0", ctx); break; }
                r->p.top_k = (int)x;
            } else {
                if (x < 0) { snprintf(msg, sizeof msg, "%s: \"seed\" must be >= 0", ctx); break; }
                r->p.seed = x;
            }
        } else if (!strcmp(key, "temperature") || !strcmp(key, "top_p") || !strcmp(key, "min_p")) {
            if (!json_is_number(v)) { snprintf(msg, sizeof msg, "%s: \"%s\" must be a number", ctx, key); break; }
            float x = (float)json_number_value(v);
            if (!strcmp(key, "temperature")) r->p.temperature = x;
            else if (!strcmp(key, "top_p")) r->p.top_p = x;
            else r->p.min_p = x;
        } else {
            snprintf(msg, sizeof msg, "%s: unknown field \"%s\"", ctx, key);
            break;
        }
    }
    if (!msg[0] && !r->text && !r->ids)
        snprintf(msg, sizeof msg, "%s: needs \"prompt\" or \"prompt_token_ids\"", ctx);
    if (!msg[0] && r->text && r->ids)
        snprintf(msg, sizeof msg, "%s: give \"prompt\" or \"prompt_token_ids\", not both", ctx);
    if (msg[0]) set_error(r, "%s", msg);
    json_decref(o);
}

static int read_prompt_file(ReqList *l, const char *path, const CvllmSamplingParams *d, char **stops, int num_stops) {
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "cvllm complete: cannot open --prompt-file %s\n", path); return -1; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        parse_line(new_req(l, d, stops, num_stops), line, lineno);
    }
    free(line);
    fclose(f);
    return 0;
}

static json_t *ids_json(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

int cmd_complete(int argc, char **argv) {
    CvllmEngineOptions eo;
    cvllm_engine_options_default(&eo);
    CvllmSamplingParams d;
    cvllm_sampling_params_default(&d);
    const char *model_dir = NULL;
    int json_out = 0, rc = 2, any_error = 0;
    char **stops = NULL;
    int num_stops = 0, cap_stops = 0;
    int32_t *stop_ids = NULL;
    ReqList l = {0};
    /* Prompts are collected in a first pass as raw argv indices, so that sampling flags given
     * after them still apply. */
    int *prompt_args = xcalloc((size_t)argc, sizeof(int));
    int num_prompt_args = 0;
    Tokenizer *tok = NULL;
    CvllmEngine *e = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long n;
        double f;
        int r = cli_parse_engine_option(argc, argv, &i, &eo);
        if (r < 0) goto done;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("%s\n%s", USAGE, CLI_ENGINE_OPTIONS_HELP);
            rc = 0;
            goto done;
        } else if (!strcmp(a, "--prompt") || !strcmp(a, "--prompt-ids") || !strcmp(a, "--prompt-file")) {
            if (!cli_value(argc, argv, &i)) goto done;
            prompt_args[num_prompt_args++] = i - 1;
        } else if (!strcmp(a, "--max-tokens")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 1, INT32_MAX, &n) < 0) goto done;
            d.max_tokens = (int)n;
        } else if (!strcmp(a, "--temperature")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_float(a, v, 0, 1e6, &f) < 0) goto done;
            d.temperature = (float)f;
        } else if (!strcmp(a, "--top-p")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_float(a, v, 1e-9, 1, &f) < 0) goto done;
            d.top_p = (float)f;
        } else if (!strcmp(a, "--top-k")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, -1, INT32_MAX, &n) < 0) goto done;
            d.top_k = (int)n;
        } else if (!strcmp(a, "--min-p")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_float(a, v, 0, 1, &f) < 0) goto done;
            d.min_p = (float)f;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 0, INT64_MAX, &n) < 0) goto done;
            d.seed = n;
        } else if (!strcmp(a, "--ignore-eos")) {
            d.ignore_eos = 1;
        } else if (!strcmp(a, "--stop")) {
            if (!(v = cli_value(argc, argv, &i))) goto done;
            DA_PUSH(stops, num_stops, cap_stops, (char *)v);
        } else if (!strcmp(a, "--stop-token-ids")) {
            if (!(v = cli_value(argc, argv, &i))) goto done;
            free(stop_ids);
            int k = cli_ids(a, v, &stop_ids);
            if (k < 0) goto done;
            d.stop_token_ids = stop_ids;
            d.num_stop_token_ids = k;
        } else if (!strcmp(a, "--output")) {
            if (!(v = cli_value(argc, argv, &i))) goto done;
            if (!strcmp(v, "json")) json_out = 1;
            else if (!strcmp(v, "text")) json_out = 0;
            else { fprintf(stderr, "cvllm complete: --output: expected text or json, got '%s'\n", v); goto done; }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "cvllm complete: unknown option '%s'\n\n%s", a, USAGE);
            goto done;
        } else if (!model_dir) {
            model_dir = a;
        } else {
            fprintf(stderr, "cvllm complete: unexpected argument '%s'\n", a);
            goto done;
        }
    }
    if (!model_dir || num_prompt_args == 0) {
        fprintf(stderr, "%s", USAGE);
        goto done;
    }
    for (int k = 0; k < num_prompt_args; k++) {
        int i = prompt_args[k];
        if (!strcmp(argv[i], "--prompt")) {
            new_req(&l, &d, stops, num_stops)->text = xstrdup(argv[i + 1]);
        } else if (!strcmp(argv[i], "--prompt-ids")) {
            Req *r = new_req(&l, &d, stops, num_stops);
            if ((r->n = cli_ids("--prompt-ids", argv[i + 1], &r->ids)) < 0) goto done;
        } else if (read_prompt_file(&l, argv[i + 1], &d, stops, num_stops) < 0) {
            goto done;
        }
    }
    rc = 1;
    /* The tokenizer is optional for id prompts: without it, "text" is null. */
    int need_tok = 0;
    for (int i = 0; i < l.n; i++) need_tok |= l.reqs[i].text != NULL || l.reqs[i].num_stops > 0;
    char *tok_path = path_join(model_dir, "tokenizer.json");
    int have_tok = access(tok_path, R_OK) == 0;
    free(tok_path);
    if (have_tok || need_tok) {
        if (tokenizer_load(model_dir, &tok) < 0) {
            fprintf(stderr, "cvllm complete: %s\n", cvllm_last_error());
            goto done;
        }
    }
    if (cvllm_engine_create(model_dir, &eo, &e) < 0) {
        fprintf(stderr, "cvllm complete: %s\n", cvllm_last_error());
        goto done;
    }
    for (int i = 0; i < l.n; i++) {
        Req *r = &l.reqs[i];
        if (r->error) continue;
        if (r->text) {
            int n = tokenizer_encode(tok, r->text, strlen(r->text), &r->ids);
            if (n < 0) { set_error(r, "%s", cvllm_last_error()); continue; }
            r->n = n;
        }
        r->id = cvllm_engine_add_request(e, r->ids, r->n, &r->p);
        if (r->id < 0) { set_error(r, "%s", cvllm_last_error()); continue; }
        textgen_init(&r->ts, r->id, tok, r->stops, r->num_stops);
    }
    /* Stream to stdout when there is one text request and plain output. */
    Req *stream = NULL;
    if (!json_out && l.n == 1 && l.reqs[0].id >= 0 && tok) {
        stream = &l.reqs[0];
        if (stream->text) fputs(stream->text, stdout);
    }
    while (cvllm_engine_has_unfinished(e)) {
        int s = cvllm_engine_step(e);
        if (s < 0) {
            fprintf(stderr, "cvllm complete: %s\n", cvllm_last_error());
            goto done;
        }
        for (int i = 0; i < l.n; i++)
            if (l.reqs[i].id >= 0 && textgen_update(e, &l.reqs[i].ts) < 0) {
                fprintf(stderr, "cvllm complete: %s\n", cvllm_last_error());
                goto done;
            }
        if (stream) {
            const char *p;
            size_t n;
            textgen_streamable(&stream->ts, &p, &n);
            fwrite(p, 1, n, stdout);
            fflush(stdout);
        }
    }
    json_t *arr = json_array();
    for (int i = 0; i < l.n; i++) {
        Req *r = &l.reqs[i];
        if (r->error) {
            any_error = 1;
            json_t *o = json_pack("{s:s}", "error", r->error);
            if (r->ids) json_object_set_new(o, "prompt_token_ids", ids_json(r->ids, r->n));
            else if (r->text) json_object_set_new(o, "prompt", json_string(r->text));
            json_array_append_new(arr, o);
            if (!json_out) fprintf(stderr, "cvllm complete: request %d refused: %s\n", i, r->error);
            continue;
        }
        CvllmOutput out;
        if (cvllm_engine_take_output(e, r->id, &out) != 1) {
            fprintf(stderr, "cvllm complete: request %d did not finish\n", i);
            goto done;
        }
        json_t *o = json_object();
        json_object_set_new(o, "prompt_token_ids", ids_json(out.prompt_token_ids, out.num_prompt_tokens));
        json_object_set_new(o, "token_ids", ids_json(out.token_ids, out.num_tokens));
        json_object_set_new(o, "text", tok ? json_stringn(r->ts.text, r->ts.len) : json_null());
        const char *fr = finish_name(out.finish_reason);
        json_object_set_new(o, "finish_reason", fr ? json_string(fr) : json_null());
        json_object_set_new(o, "num_cached_tokens", json_integer(out.num_cached_tokens));
        json_array_append_new(arr, o);
        if (!json_out && r != stream) {
            if (tok) {
                if (r->text) fputs(r->text, stdout);
                fwrite(r->ts.text, 1, r->ts.len, stdout);
            } else {
                for (int k = 0; k < out.num_tokens; k++) printf("%s%d", k ? "," : "", out.token_ids[k]);
            }
            fputc('\n', stdout);
        }
        cvllm_output_free(&out);
    }
    if (stream) {
        const char *p;
        size_t n;
        textgen_streamable(&stream->ts, &p, &n);
        fwrite(p, 1, n, stdout);
        fputc('\n', stdout);
    }
    if (json_out) {
        char *s = json_dumps(arr, JSON_COMPACT | JSON_ENSURE_ASCII);
        puts(s);
        free(s);
    }
    json_decref(arr);
    rc = any_error ? 1 : 0;
done:
    for (int i = 0; i < l.n; i++) {
        Req *r = &l.reqs[i];
        free(r->text);
        free(r->ids);
        free(r->stop_ids);
        free(r->error);
        for (int k = 0; k < r->num_stops; k++) free(r->stops[k]);
        free(r->stops);
        if (r->id >= 0) textgen_free(&r->ts);
    }
    free(l.reqs);
    free(stops);
    free(stop_ids);
    free(prompt_args);
    cvllm_engine_destroy(e);
    tokenizer_free(tok);
    fflush(stdout);
    return rc;
}
