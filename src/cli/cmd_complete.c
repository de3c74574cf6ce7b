/* cmd_complete.c: `cvllm complete MODEL_DIR`: completions for prompts given as text or token ids,
 * on the command line or in a JSON-lines file, printed as text or as one JSON array. */
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/jsonl_prompt.h"
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

/* Applies one --prompt-file line's fields to r (jsonl_prompt.c). Errors go to r->error (the request
 * is refused, the others go on). */
static void parse_line(Req *r, const char *line, size_t len, long lineno) {
    JsonlPrompt j = {.params = r->p};
    int rc = jsonl_prompt_parse(line, len, lineno, &j);
    if (rc < 0) set_error(r, "%s", cvllm_last_error());
    r->text = j.prompt; /* kept on error too: the refusal names its prompt */
    r->ids = j.prompt_ids;
    r->n = j.num_prompt_ids;
    j.prompt = NULL, j.prompt_ids = NULL;
    if (rc == 0) {
        r->p = j.params; /* its stop_token_ids: the line's (moved below) or r->stop_ids */
        if (j.stop_ids) free(r->stop_ids), r->stop_ids = j.stop_ids, j.stop_ids = NULL;
        if (j.has_stops) {
            for (int i = 0; i < r->num_stops; i++) free(r->stops[i]);
            free(r->stops);
            r->stops = j.stops, r->num_stops = j.num_stops;
            j.stops = NULL, j.num_stops = 0;
        }
    }
    jsonl_prompt_free(&j);
}

typedef struct {
    ReqList *l;
    const CvllmSamplingParams *d;
    char **stops;
    int num_stops;
} PromptFile;

static int prompt_file_line(void *arg, const char *line, size_t len, long lineno) {
    PromptFile *f = arg;
    parse_line(new_req(f->l, f->d, f->stops, f->num_stops), line, len, lineno);
    return 0;
}

/* Reads a --prompt-file (a regular file: cli_each_line); -1 with the message printed. */
static int read_prompt_file(ReqList *l, const char *path, const CvllmSamplingParams *d, char **stops, int num_stops) {
    PromptFile f = {l, d, stops, num_stops};
    if (cli_each_line(path, 0, prompt_file_line, &f) < 0) {
        fprintf(stderr, "cvllm complete: --prompt-file: %s\n", cvllm_last_error());
        return -1;
    }
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
            rc = 1; /* a file that cannot be read: a runtime error, as in every command */
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
