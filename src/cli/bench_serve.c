/* bench_serve.c: `cvllm bench serve --base-url URL`: a load generator for any OpenAI-compatible
 * server, in the manner of `vllm bench serve`. The workload is `bench throughput`'s (nano-vllm's
 * bench.py by default: random.seed(0), prompts of randint(100, 1024) random ids, max_tokens
 * randint(100, 1024), ignore_eos) or a JSONL file of prompts. Requests are sent at a Poisson
 * --request-rate (default: all at once) and at most --max-concurrency at a time, each streamed
 * (SSE) through libcurl's multi interface on one thread. Reports vLLM's figures: request and
 * token throughput, and mean / median / p99 of time to first token (TTFT), time per output token
 * after the first (TPOT) and inter-token latency (ITL: the gaps between streamed chunks). */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench/pyrandom.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common.h"
#include "server/sbuf.h"

static const char USAGE[] =
    "usage: cvllm bench serve --base-url URL [options]\n"
    "  --base-url URL                the server, e.g. http://127.0.0.1:8000\n"
    "  --endpoint PATH               /v1/completions (default) or /v1/chat/completions\n"
    "  --model NAME                  default: the first of GET /v1/models\n"
    "  --api-key KEY                 sent as 'Authorization: Bearer KEY'\n"
    "workload (random token-id prompts as `bench throughput`, or a file):\n"
    "  --num-seqs N (256)  --max-input-len N (1024)  --max-output-len N (1024)\n"
    "  --input-len N --output-len M  fixed lengths instead; --num-prompts N = --num-seqs\n"
    "  --dataset-path FILE.jsonl     one {\"prompt\": text or ids, \"max_tokens\": N} a line\n"
    "  --temperature F (0.6)         sampling temperature of every request\n"
    "load:\n"
    "  --request-rate R (inf)        requests per second, Poisson arrivals (inf: all at once)\n"
    "  --max-concurrency N           at most N requests in flight (default: no limit)\n"
    "  --seed N (0)                  seed of the arrival times\n"
    "  --output text|json            --quiet: no progress bar\n";

typedef struct {
    int idx;
    CURL *h;
    char *body;
    struct curl_slist *hdrs;
    SBuf buf;
    double t_start, t_first, t_last, latency;
    double *itl;
    int nitl, capitl;
    int text_chunks, usage_out, usage_in;
    int got_done, failed;
    char err[256];
} Req;

typedef struct {
    int n;
    char **bodies;    /* the request bodies (JSON) */
    int *prompt_lens; /* known for id prompts; 0 otherwise (then usage's prompt_tokens) */
} Work;

static double percentile(double *v, int n, double p) { /* numpy's linear interpolation */
    if (n == 0) return 0;
    double pos = p / 100.0 * (n - 1);
    int lo = (int)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    double mean, median, std, p99;
} Summary;

static Summary summarize(double *v, int n) {
    Summary s = {0, 0, 0, 0};
    if (n == 0) return s;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double sum = 0, sq = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    s.mean = sum / n;
    for (int i = 0; i < n; i++) sq += (v[i] - s.mean) * (v[i] - s.mean);
    s.std = sqrt(sq / n);
    s.median = percentile(v, n, 50);
    s.p99 = percentile(v, n, 99);
    return s;
}

/* One SSE event's data. */
static void on_event(Req *r, const char *data, size_t n) {
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        r->got_done = 1;
        return;
    }
    json_t *o = json_loadb(data, n, 0, NULL);
    if (!o) return;
    json_t *err = json_object_get(o, "error");
    if (err) {
        json_t *m = json_object_get(err, "message");
        snprintf(r->err, sizeof r->err, "%s", json_is_string(m) ? json_string_value(m) : "error event");
        r->failed = 1;
    }
    json_t *c0 = json_array_get(json_object_get(o, "choices"), 0);
    const char *text = NULL;
    if (c0) {
        json_t *t = json_object_get(c0, "text");
        json_t *d = json_object_get(c0, "delta");
        if (!json_is_string(t) && d) {
            t = json_object_get(d, "content");
            if (!json_is_string(t) || !json_string_length(t)) t = json_object_get(d, "reasoning_content");
        }
        if (json_is_string(t) && json_string_length(t)) text = json_string_value(t);
    }
    if (text) {
        double now = now_seconds();
        if (r->text_chunks == 0) r->t_first = now;
        else {
            if (r->nitl >= r->capitl) {
                r->capitl = r->capitl ? 2 * r->capitl : 64;
                r->itl = xrealloc(r->itl, (size_t)r->capitl * sizeof *r->itl);
            }
            r->itl[r->nitl++] = now - r->t_last;
        }
        r->t_last = now;
        r->text_chunks++;
    }
    json_t *u = json_object_get(o, "usage");
    if (json_is_object(u)) {
        json_t *ct = json_object_get(u, "completion_tokens"), *pt = json_object_get(u, "prompt_tokens");
        if (json_is_integer(ct)) r->usage_out = (int)json_integer_value(ct);
        if (json_is_integer(pt)) r->usage_in = (int)json_integer_value(pt);
    }
    json_decref(o);
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *ud) {
    Req *r = ud;
    size_t n = size * nmemb;
    sbuf_add(&r->buf, p, n);
    for (;;) {
        long end = sbuf_find(r->buf.s, r->buf.len, "\n\n");
        if (end < 0) break;
        /* each line "data: ..." of the event */
        size_t i = 0;
        while (i < (size_t)end) {
            size_t j = i;
            while (j < (size_t)end && r->buf.s[j] != '\n') j++;
            size_t l = j - i;
            const char *line = r->buf.s + i;
            if (l && line[l - 1] == '\r') l--;
            if (l >= 5 && !memcmp(line, "data:", 5)) {
                size_t k = 5;
                while (k < l && line[k] == ' ') k++;
                on_event(r, line + k, l - k);
            }
            i = j + 1;
        }
        sbuf_consume(&r->buf, (size_t)end + 2);
    }
    return n;
}

static void req_setup(Req *r, const char *url, const char *api_key, const char *body) {
    r->h = curl_easy_init();
    r->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    r->hdrs = curl_slist_append(r->hdrs, "Accept: text/event-stream");
    if (api_key) {
        char *h = xmalloc(strlen(api_key) + 32);
        sprintf(h, "Authorization: Bearer %s", api_key);
        r->hdrs = curl_slist_append(r->hdrs, h);
        free(h);
    }
    curl_easy_setopt(r->h, CURLOPT_URL, url);
    curl_easy_setopt(r->h, CURLOPT_HTTPHEADER, r->hdrs);
    curl_easy_setopt(r->h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(r->h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(r->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(r->h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(r->h, CURLOPT_PRIVATE, r);
    curl_easy_setopt(r->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(r->h, CURLOPT_TCP_NODELAY, 1L);
    r->t_start = now_seconds();
}

static void req_finish(Req *r, CURLcode code) {
    long status = 0;
    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &status);
    if (code != CURLE_OK) {
        r->failed = 1;
        snprintf(r->err, sizeof r->err, "%s", curl_easy_strerror(code));
    } else if (status != 200) {
        r->failed = 1;
        /* the body was an error object, not SSE: keep its start */
        snprintf(r->err, sizeof r->err, "HTTP %ld: %.200s", status, r->buf.s ? r->buf.s : "");
    } else if (!r->got_done && !r->failed) {
        r->failed = 1;
        snprintf(r->err, sizeof r->err, "the stream ended without data: [DONE]");
    } else if (r->text_chunks == 0 && !r->failed) {
        r->failed = 1;
        snprintf(r->err, sizeof r->err, "no text was streamed");
    }
    curl_slist_free_all(r->hdrs);
    r->hdrs = NULL;
    curl_easy_cleanup(r->h);
    r->h = NULL;
}

static char *fetch_model(const char *base, const char *api_key) {
    char *url = xmalloc(strlen(base) + 16);
    sprintf(url, "%s/v1/models", base);
    Req r = {0};
    req_setup(&r, url, api_key, "");
    curl_easy_setopt(r.h, CURLOPT_HTTPGET, 1L);
    CURLcode c = curl_easy_perform(r.h);
    long status = 0;
    curl_easy_getinfo(r.h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(r.hdrs);
    curl_easy_cleanup(r.h);
    free(url);
    char *model = NULL;
    if (c != CURLE_OK) fprintf(stderr, "cvllm bench serve: GET /v1/models: %s\n", curl_easy_strerror(c));
    else {
        json_t *o = json_loadb(r.buf.s ? r.buf.s : "", r.buf.len, 0, NULL);
        json_t *id = json_object_get(json_array_get(json_object_get(o, "data"), 0), "id");
        if (json_is_string(id)) model = xstrdup(json_string_value(id));
        else fprintf(stderr, "cvllm bench serve: GET /v1/models: HTTP %ld, no model in the answer\n", status);
        json_decref(o);
    }
    sbuf_free(&r.buf);
    return model;
}

static char *make_body(int chat, const char *model, json_t *prompt, int max_tokens, double temperature,
                       int ignore_eos) {
    json_t *o = json_pack("{s:s,s:f,s:b,s:{s:b}}", "model", model, "temperature", temperature, "stream", 1,
                          "stream_options", "include_usage", 1);
    if (chat) {
        json_object_set_new(o, "messages", json_pack("[{s:s,s:O}]", "role", "user", "content", prompt));
        json_object_set_new(o, "max_completion_tokens", json_integer(max_tokens));
    } else {
        json_object_set(o, "prompt", prompt);
        json_object_set_new(o, "max_tokens", json_integer(max_tokens));
    }
    if (ignore_eos) json_object_set_new(o, "ignore_eos", json_true());
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static int load_dataset(const char *path, int chat, const char *model, double temperature, Work *w) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cvllm bench serve: %s: cannot open\n", path);
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, capw = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len <= 1) continue;
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        json_t *p = json_object_get(o, "prompt");
        json_t *mt = json_object_get(o, "max_tokens");
        if (!mt) mt = json_object_get(o, "output_len");
        if (!p || (!json_is_string(p) && !json_is_array(p)) || (chat && !json_is_string(p))) {
            fprintf(stderr, "cvllm bench serve: %s:%d: needs \"prompt\" (%s)\n", path, lineno,
                    chat ? "a string for chat" : "a string or token ids");
            json_decref(o);
            free(line);
            fclose(f);
            return -1;
        }
        int max_tokens = json_is_integer(mt) ? (int)json_integer_value(mt) : 256;
        char *body = make_body(chat, model, p, max_tokens, temperature, 0);
        if (w->n >= capw) {
            capw = capw ? 2 * capw : 64;
            w->bodies = xrealloc(w->bodies, (size_t)capw * sizeof *w->bodies);
            w->prompt_lens = xrealloc(w->prompt_lens, (size_t)capw * sizeof *w->prompt_lens);
        }
        w->prompt_lens[w->n] = json_is_array(p) ? (int)json_array_size(p) : 0;
        w->bodies[w->n++] = body;
        json_decref(o);
    }
    free(line);
    fclose(f);
    if (w->n == 0) {
        fprintf(stderr, "cvllm bench serve: %s: no prompts\n", path);
        return -1;
    }
    return 0;
}

static void progress(int done, int total, double t0) {
    int width = 40, filled = total ? done * width / total : width;
    fprintf(stderr, "\r[");
    for (int i = 0; i < width; i++) fputc(i < filled ? '#' : ' ', stderr);
    fprintf(stderr, "] %d/%d  %.1f s ", done, total, now_seconds() - t0);
}

int bench_serve(int argc, char **argv) {
    const char *base = NULL, *endpoint = "/v1/completions", *model_arg = NULL, *api_key = NULL, *dataset = NULL;
    long long num_seqs = 256, max_in = 1024, max_out = 1024, in_len = 0, out_len = 0, maxc = 0, seed = 0;
    double rate = INFINITY, temperature = 0.6;
    int json_out = 0, quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        struct { const char *name; long long *dst; long long lo; } ints[] = {
            {"--num-seqs", &num_seqs, 1}, {"--num-prompts", &num_seqs, 1}, {"--max-input-len", &max_in, 100},
            {"--max-output-len", &max_out, 100}, {"--input-len", &in_len, 1}, {"--output-len", &out_len, 1},
            {"--max-concurrency", &maxc, 1}, {"--seed", &seed, 0}};
        int matched = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
            if (strcmp(a, ints[k].name)) continue;
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, ints[k].lo, 1 << 24, ints[k].dst) < 0) return 2;
            matched = 1;
        }
        if (matched) continue;
        if (!strcmp(a, "--base-url")) { if (!(base = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--endpoint")) { if (!(endpoint = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--model")) { if (!(model_arg = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--api-key")) { if (!(api_key = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--dataset-path")) { if (!(dataset = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--temperature")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_float(a, v, 0, 1e6, &temperature) < 0) return 2;
        } else if (!strcmp(a, "--request-rate")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (strcmp(v, "inf") && cli_float(a, v, 1e-6, 1e9, &rate) < 0) return 2;
        } else if (!strcmp(a, "--output")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (strcmp(v, "json") && strcmp(v, "text")) { fprintf(stderr, "cvllm bench serve: --output: text or json\n"); return 2; }
            json_out = !strcmp(v, "json");
        } else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { printf("%s", USAGE); return 0; }
        else { fprintf(stderr, "cvllm bench serve: unknown argument '%s'\n\n%s", a, USAGE); return 2; }
    }
    if (!base) { fprintf(stderr, "%s", USAGE); return 2; }
    if ((in_len > 0) != (out_len > 0)) { fprintf(stderr, "cvllm bench serve: give both --input-len and --output-len\n"); return 2; }
    int chat = strstr(endpoint, "chat") != NULL;
    if (chat && !dataset) { fprintf(stderr, "cvllm bench serve: the chat endpoint needs text prompts (--dataset-path)\n"); return 2; }
    size_t bl = strlen(base);
    char *baseurl = xstrdup(base);
    while (bl > 0 && baseurl[bl - 1] == '/') baseurl[--bl] = 0;

    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) { rl.rlim_cur = rl.rlim_max; setrlimit(RLIMIT_NOFILE, &rl); }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = 1;
    Work w = {0};
    Req *reqs = NULL;
    double *arrival = NULL;
    char *url = xmalloc(bl + strlen(endpoint) + 2);
    sprintf(url, "%s%s%s", baseurl, endpoint[0] == '/' ? "" : "/", endpoint);
    char *model = model_arg ? xstrdup(model_arg) : fetch_model(baseurl, api_key);
    if (!model) goto done;
    if (dataset) {
        if (load_dataset(dataset, chat, model, temperature, &w) < 0) goto done;
    } else {
        BenchWorkload bw;
        if (in_len > 0) bench_workload_fixed(&bw, (int)num_seqs, (int)in_len, (int)out_len);
        else bench_workload_nanovllm(&bw, (int)num_seqs, (int)max_in, (int)max_out);
        w.n = bw.num_seqs;
        w.bodies = xmalloc((size_t)w.n * sizeof *w.bodies);
        w.prompt_lens = xmalloc((size_t)w.n * sizeof *w.prompt_lens);
        for (int i = 0; i < w.n; i++) {
            json_t *p = json_array();
            for (int k = 0; k < bw.prompt_lens[i]; k++) json_array_append_new(p, json_integer(bw.prompts[i][k]));
            w.bodies[i] = make_body(0, model, p, bw.max_tokens[i], temperature, 1);
            w.prompt_lens[i] = bw.prompt_lens[i];
            json_decref(p);
        }
        bench_workload_free(&bw);
    }
    /* A test request first (not timed), as vllm bench serve does: the endpoint answers. */
    {
        Req t = {0};
        req_setup(&t, url, api_key, w.bodies[0]);
        CURLcode c = curl_easy_perform(t.h);
        req_finish(&t, c);
        sbuf_free(&t.buf);
        free(t.itl);
        if (t.failed) {
            fprintf(stderr, "cvllm bench serve: the test request to %s failed: %s\n", url, t.err);
            goto done;
        }
    }
    /* arrival times: exponential gaps at the rate (Poisson process) */
    arrival = xcalloc((size_t)w.n, sizeof *arrival);
    uint64_t st = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 1; i < w.n && isfinite(rate); i++) {
        st ^= st << 13; st ^= st >> 7; st ^= st << 17;
        double u = ((st >> 11) + 0.5) / 9007199254740992.0;
        arrival[i] = arrival[i - 1] - log(u) / rate;
    }
    reqs = xcalloc((size_t)w.n, sizeof *reqs);
    CURLM *m = curl_multi_init();
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)(maxc ? maxc + 8 : w.n + 8));
    int show = !quiet && isatty(2);
    int next = 0, inflight = 0, finished = 0;
    double t0 = now_seconds();
    while (finished < w.n) {
        double now = now_seconds() - t0;
        while (next < w.n && arrival[next] <= now && (maxc == 0 || inflight < maxc)) {
            Req *r = &reqs[next];
            r->idx = next;
            req_setup(r, url, api_key, w.bodies[next]);
            curl_multi_add_handle(m, r->h);
            next++;
            inflight++;
        }
        int running;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            Req *r = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            CURLcode code = msg->data.result;
            r->latency = now_seconds() - r->t_start;
            curl_multi_remove_handle(m, r->h);
            req_finish(r, code);
            inflight--;
            finished++;
            if (show) progress(finished, w.n, t0);
        }
        int timeout = 100;
        if (next < w.n && (maxc == 0 || inflight < maxc)) {
            double wait = (arrival[next] - (now_seconds() - t0)) * 1000;
            if (wait < timeout) timeout = wait < 0 ? 0 : (int)wait;
        }
        curl_multi_poll(m, NULL, 0, timeout, NULL);
    }
    double duration = now_seconds() - t0;
    if (show) fputc('\n', stderr);
    curl_multi_cleanup(m);

    /* figures */
    double *ttft = xmalloc((size_t)w.n * sizeof(double)), *tpot = xmalloc((size_t)w.n * sizeof(double));
    double *e2el = xmalloc((size_t)w.n * sizeof(double));
    int nitl = 0, completed = 0, ntpot = 0, failed = 0;
    int64_t total_in = 0, total_out = 0;
    for (int i = 0; i < w.n; i++) nitl += reqs[i].nitl;
    double *itl = xmalloc((size_t)(nitl ? nitl : 1) * sizeof(double));
    nitl = 0;
    json_t *errors = json_array();
    for (int i = 0; i < w.n; i++) {
        Req *r = &reqs[i];
        if (r->failed) {
            failed++;
            if (json_array_size(errors) < 10) json_array_append_new(errors, json_string(r->err));
            continue;
        }
        int out = r->usage_out > 0 ? r->usage_out : r->text_chunks;
        double lat = r->latency, first = r->t_first - r->t_start;
        ttft[completed] = first;
        e2el[completed] = lat;
        if (out > 1) tpot[ntpot++] = (lat - first) / (out - 1);
        for (int k = 0; k < r->nitl; k++) itl[nitl++] = r->itl[k];
        total_out += out;
        total_in += r->usage_in > 0 ? r->usage_in : w.prompt_lens[i];
        completed++;
    }
    Summary s_ttft = summarize(ttft, completed), s_tpot = summarize(tpot, ntpot), s_itl = summarize(itl, nitl),
            s_e2el = summarize(e2el, completed);
    if (json_out) {
        char date[32];
        time_t tt = time(NULL);
        strftime(date, sizeof date, "%Y%m%d-%H%M%S", gmtime(&tt));
        json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s,s:i,s:o,s:o,s:f,s:i,s:i,s:I,s:I,s:f,s:f,s:f}",
                              "date", date, "backend", "openai", "base_url", baseurl, "endpoint", endpoint,
                              "model_id", model, "num_prompts", w.n, "request_rate",
                              isfinite(rate) ? json_real(rate) : json_string("inf"), "max_concurrency",
                              maxc ? json_integer(maxc) : json_null(), "duration", duration, "completed",
                              completed, "failed", failed, "total_input_tokens", (json_int_t)total_in,
                              "total_output_tokens", (json_int_t)total_out, "request_throughput",
                              completed / duration, "output_throughput", total_out / duration,
                              "total_token_throughput", (total_in + total_out) / duration);
        struct { const char *n; Summary *s; } ms[] = {{"ttft", &s_ttft}, {"tpot", &s_tpot}, {"itl", &s_itl}, {"e2el", &s_e2el}};
        for (int k = 0; k < 4; k++) {
            char key[32];
            snprintf(key, sizeof key, "mean_%s_ms", ms[k].n); json_object_set_new(o, key, json_real(ms[k].s->mean * 1000));
            snprintf(key, sizeof key, "median_%s_ms", ms[k].n); json_object_set_new(o, key, json_real(ms[k].s->median * 1000));
            snprintf(key, sizeof key, "std_%s_ms", ms[k].n); json_object_set_new(o, key, json_real(ms[k].s->std * 1000));
            snprintf(key, sizeof key, "p99_%s_ms", ms[k].n); json_object_set_new(o, key, json_real(ms[k].s->p99 * 1000));
        }
        json_object_set_new(o, "errors", errors);
        errors = NULL;
        char *s = json_dumps(o, JSON_COMPACT);
        puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("============ Serving Benchmark Result ============\n");
        printf("%-40s %d\n", "Successful requests:", completed);
        if (failed) printf("%-40s %d\n", "Failed requests:", failed);
        if (maxc) printf("%-40s %lld\n", "Maximum request concurrency:", maxc);
        if (isfinite(rate)) printf("%-40s %.2f\n", "Request rate (req/s):", rate);
        printf("%-40s %.2f\n", "Benchmark duration (s):", duration);
        printf("%-40s %lld\n", "Total input tokens:", (long long)total_in);
        printf("%-40s %lld\n", "Total generated tokens:", (long long)total_out);
        printf("%-40s %.2f\n", "Request throughput (req/s):", completed / duration);
        printf("%-40s %.2f\n", "Output token throughput (tok/s):", total_out / duration);
        printf("%-40s %.2f\n", "Total Token throughput (tok/s):", (total_in + total_out) / duration);
        struct { const char *title, *n; Summary *s; } ms[] = {
            {"---------------Time to First Token----------------", "TTFT", &s_ttft},
            {"-----Time per Output Token (excl. 1st token)------", "TPOT", &s_tpot},
            {"---------------Inter-token Latency----------------", "ITL", &s_itl}};
        for (int k = 0; k < 3; k++) {
            printf("%s\n", ms[k].title);
            char l[64];
            snprintf(l, sizeof l, "Mean %s (ms):", ms[k].n); printf("%-40s %.2f\n", l, ms[k].s->mean * 1000);
            snprintf(l, sizeof l, "Median %s (ms):", ms[k].n); printf("%-40s %.2f\n", l, ms[k].s->median * 1000);
            snprintf(l, sizeof l, "P99 %s (ms):", ms[k].n); printf("%-40s %.2f\n", l, ms[k].s->p99 * 1000);
        }
        printf("==================================================\n");
        for (size_t k = 0; k < json_array_size(errors); k++)
            fprintf(stderr, "error: %s\n", json_string_value(json_array_get(errors, k)));
    }
    json_decref(errors);
    free(ttft);
    free(tpot);
    free(e2el);
    free(itl);
    rc = completed > 0 ? 0 : 1;
done:
    if (reqs)
        for (int i = 0; i < w.n; i++) {
            sbuf_free(&reqs[i].buf);
            free(reqs[i].itl);
        }
    free(reqs);
    free(arrival);
    for (int i = 0; i < w.n; i++) free(w.bodies[i]);
    free(w.bodies);
    free(w.prompt_lens);
    free(model);
    free(url);
    free(baseurl);
    curl_global_cleanup();
    return rc;
}
