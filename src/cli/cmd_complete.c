/* cmd_complete.c: `cvllm complete MODEL_DIR`: completions for prompts given as text or token ids,
 * on the command line or in a JSON-lines file, printed as text or as one JSON array. */
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_sampling.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/jsonl_prompt.h"
#include "common.h"

static const char USAGE[] =
    "usage: cvllm complete MODEL_DIR [prompts] [sampling] [engine options]\n"
    "prompts (repeatable, kept in order):\n"
    "  --prompt TEXT              a text prompt (needs tokenizer.json in MODEL_DIR)\n"
    "  --prompt-ids 1,2,3         a prompt as token ids (separated by commas, no spaces)\n"
    "  --prompt-file F.jsonl      one request a line: {\"prompt\": \"...\"} or\n"
    "                             {\"prompt_token_ids\": [...]}, plus any sampling field below\n"
    "sampling: defaults for every request (max_tokens 16, temperature 1); fields in\n"
    "  --prompt-file lines override them (see below)\n"
    "output:\n"
    "  --output text|json         json: one array in submission order, each {prompt_token_ids,\n"
    "                             token_ids, text, finish_reason, num_cached_tokens[, logprobs,\n"
    "                             top_logprobs]} or {error}\n";

typedef struct {
    char *text;           /* prompt text or NULL */
    int32_t *ids;         /* prompt ids (owned) */
    int n;
    CvllmSamplingParams p;
    int32_t *stop_ids;    /* owned */
    char **stops;         /* owned */
    int num_stops;
    char *error;          /* refused or failed: the reason (owned) */
    int64_t id;
    json_t *result;       /* the finished request's JSON object */
    int streamed;         /* text already printed (the streamed request) */
} Req;

typedef struct {
    Req *reqs;
    int n, cap;
} ReqList;

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

/* The JSON result of a finished request. */
static json_t *result_json(const CvllmRequestOutput *o, int have_tok) {
    json_t *r = json_object();
    json_object_set_new(r, "prompt_token_ids", ids_json(o->prompt_token_ids, o->num_prompt_tokens));
    json_object_set_new(r, "token_ids", ids_json(o->token_ids, o->num_tokens));
    json_object_set_new(r, "text", have_tok && o->text ? json_stringn(o->text, o->text_len) : json_null());
    const char *fr = cvllm_finish_reason_name(o->finish_reason);
    json_object_set_new(r, "finish_reason", fr ? json_string(fr) : json_null());
    json_object_set_new(r, "num_cached_tokens", json_integer(o->num_cached_tokens));
    if (o->logprobs) {
        json_t *lp = json_array(), *top = json_array();
        for (int t = 0; t < o->num_tokens; t++) {
            json_array_append_new(lp, json_real(o->logprobs[t]));
            json_t *row = json_array();
            for (int k = 0; k < o->num_top_logprobs; k++)
                json_array_append_new(row, json_pack("[i,f]", (json_int_t)o->top_logprob_ids[t * o->num_top_logprobs + k],
                                                     (double)o->top_logprobs[t * o->num_top_logprobs + k]));
            json_array_append_new(top, row);
        }
        json_object_set_new(r, "logprobs", lp);
        json_object_set_new(r, "top_logprobs", top);
    }
    return r;
}

int cmd_complete(int argc, char **argv) {
    CvllmEngineOptions eo;
    cvllm_engine_options_default(&eo);
    CvllmSamplingParams defaults;
    cvllm_sampling_params_default(&defaults);
    CliSampling cs;
    cli_sampling_init(&cs, &defaults);
    const char *model_dir = NULL;
    int json_out = 0, rc = 2, any_error = 0;
    ReqList l = {0};
    /* Prompts are collected in a first pass as raw argv indices, so that sampling flags given
     * after them still apply. */
    int *prompt_args = xcalloc((size_t)argc, sizeof(int));
    int num_prompt_args = 0;
    CvllmEngine *e = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = cli_parse_engine_option(argc, argv, &i, &eo);
        if (r < 0) goto done;
        if (r > 0) continue;
        r = cli_parse_sampling_option(argc, argv, &i, &cs);
        if (r < 0) goto done;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("%s\n%s\n%s", USAGE, CLI_SAMPLING_OPTIONS_HELP, CLI_ENGINE_OPTIONS_HELP);
            rc = 0;
            goto done;
        } else if (!strcmp(a, "--prompt") || !strcmp(a, "--prompt-ids") || !strcmp(a, "--prompt-file")) {
            if (!cli_value(argc, argv, &i)) goto done;
            prompt_args[num_prompt_args++] = i - 1;
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
            new_req(&l, &cs.p, cs.stops, cs.num_stops)->text = xstrdup(argv[i + 1]);
        } else if (!strcmp(argv[i], "--prompt-ids")) {
            Req *r = new_req(&l, &cs.p, cs.stops, cs.num_stops);
            if ((r->n = cli_ids("--prompt-ids", argv[i + 1], &r->ids)) < 0) goto done;
        } else if (read_prompt_file(&l, argv[i + 1], &cs.p, cs.stops, cs.num_stops) < 0) {
            rc = 1; /* a file that cannot be read: a runtime error, as in every command */
            goto done;
        }
    }
    rc = 1;
    if (cvllm_engine_create(model_dir, &eo, &e) < 0) {
        fprintf(stderr, "cvllm complete: %s\n", cvllm_last_error());
        goto done;
    }
    int have_tok = cvllm_engine_tokenizer(e) != NULL;
    for (int i = 0; i < l.n; i++) {
        Req *r = &l.reqs[i];
        if (r->error) continue;
        CvllmRequest q = {.prompt_token_ids = r->ids, .num_prompt_tokens = r->n, .params = r->p,
                          .user = r};
        if (r->text) {
            q.prompt = r->text;
            q.prompt_len = strlen(r->text);
        }
        q.params.stop = (const char *const *)r->stops;
        q.params.num_stop = r->num_stops;
        r->id = cvllm_engine_submit(e, &q);
        if (r->id < 0) set_error(r, "%s", cvllm_last_error());
    }
    /* Stream to stdout when there is one text request and plain output. */
    Req *stream = NULL;
    if (!json_out && l.n == 1 && l.reqs[0].id >= 0 && have_tok) {
        stream = &l.reqs[0];
        if (stream->text) fputs(stream->text, stdout);
    }
    int step_failed = 0;
    while (cvllm_engine_has_unfinished(e)) {
        const CvllmRequestOutput *outs;
        int n;
        if (cvllm_engine_step(e, &outs, &n) < 0) step_failed = 1; /* the failed requests say why */
        for (int k = 0; k < n; k++) {
            const CvllmRequestOutput *o = &outs[k];
            Req *r = NULL;
            for (int i = 0; i < l.n && !r; i++)
                if (l.reqs[i].id == o->request_id) r = &l.reqs[i];
            if (!r) continue;
            if (r == stream && o->new_text_len) {
                fwrite(o->new_text, 1, o->new_text_len, stdout);
                fflush(stdout);
            }
            if (o->finish_reason == CVLLM_FINISH_NONE) continue;
            if (o->error) set_error(r, "%s", o->error);
            r->result = result_json(o, have_tok);
        }
    }
    (void)step_failed;
    json_t *arr = json_array();
    for (int i = 0; i < l.n; i++) {
        Req *r = &l.reqs[i];
        if (r->error) {
            any_error = 1;
            json_t *o = json_pack("{s:s}", "error", r->error);
            if (r->ids) json_object_set_new(o, "prompt_token_ids", ids_json(r->ids, r->n));
            else if (r->text) json_object_set_new(o, "prompt", json_string(r->text));
            json_array_append_new(arr, o);
            if (!json_out) fprintf(stderr, "cvllm complete: request %d %s: %s\n", i,
                                   r->id < 0 ? "refused" : "failed", r->error);
            continue;
        }
        if (!r->result) {
            fprintf(stderr, "cvllm complete: request %d did not finish\n", i);
            goto done;
        }
        json_array_append(arr, r->result);
        if (!json_out && r != stream) {
            json_t *text = json_object_get(r->result, "text");
            if (json_is_string(text)) {
                if (r->text) fputs(r->text, stdout);
                fwrite(json_string_value(text), 1, json_string_length(text), stdout);
            } else {
                json_t *ids = json_object_get(r->result, "token_ids");
                for (size_t k = 0; k < json_array_size(ids); k++)
                    printf("%s%lld", k ? "," : "", (long long)json_integer_value(json_array_get(ids, k)));
            }
            fputc('\n', stdout);
        }
    }
    if (stream && !stream->error) fputc('\n', stdout);
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
        json_decref(r->result);
    }
    free(l.reqs);
    cli_sampling_free(&cs);
    free(prompt_args);
    cvllm_engine_destroy(e);
    fflush(stdout);
    return rc;
}
