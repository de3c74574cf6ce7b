/* openai_response.c: OpenAI's response shapes (see openai_response.h). */
#include "server/openai_response.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

json_t *oai_error_body(const OaiError *e) {
    const char *type = e->status >= 500 ? "server_error"
                       : e->status == 401 ? "authentication_error"
                                          : "invalid_request_error";
    return json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->message, "type", type, "param",
                     e->param[0] ? json_string(e->param) : json_null(), "code",
                     e->code[0] ? json_string(e->code) : json_null());
}

json_t *oai_usage(int64_t p, int64_t c, int64_t cached) {
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)p, "completion_tokens",
                     (json_int_t)c, "total_tokens", (json_int_t)(p + c), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)cached);
}

/* splitmix64 over a counter seeded from /dev/urandom (ids need to be unique, not secret) */
static _Atomic uint64_t g_id_state;
static pthread_once_t g_id_once = PTHREAD_ONCE_INIT;
static void id_seed(void) {
    uint64_t s = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd >= 0) {
        uint64_t r;
        if (read(fd, &r, sizeof r) == sizeof r) s ^= r;
        close(fd);
    }
    atomic_store(&g_id_state, s);
}
static uint64_t id_next(void) {
    uint64_t z = atomic_fetch_add(&g_id_state, 0x9e3779b97f4a7c15ull) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

char *oai_random_id(const char *prefix) {
    pthread_once(&g_id_once, id_seed);
    size_t n = strlen(prefix);
    char *s = xmalloc(n + 33);
    memcpy(s, prefix, n);
    snprintf(s + n, 33, "%016llx%016llx", (unsigned long long)id_next(), (unsigned long long)id_next());
    return s;
}

static double clamp_lp(float x) { return isfinite(x) ? x : -9999.0; }

/* The text of one token, decoded alone (U+FFFD for a partial character, as vLLM shows it). */
static json_t *token_str(const Tokenizer *tok, int32_t id) {
    size_t len = 0;
    char *s = tok ? tokenizer_decode_len(tok, &id, 1, 0, &len) : NULL;
    json_t *j;
    if (s) j = json_stringn(s, len);
    else {
        char buf[32];
        snprintf(buf, sizeof buf, "token_id:%d", id);
        j = json_string(buf);
    }
    free(s);
    return j ? j : json_string("");
}

static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

json_t *oai_logprobs_completion(const Tokenizer *tok, const OaiLogprobs *l, int from, int to,
                                int64_t *text_offset) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int i = from; i < to; i++) {
        json_t *t = token_str(tok, l->ids[i]);
        json_array_append_new(offs, json_integer(*text_offset));
        *text_offset += (int64_t)utf8_chars(json_string_value(t));
        json_array_append_new(lps, json_real(clamp_lp(l->lp[i])));
        json_t *top = json_object();
        for (int k = 0; k < l->k; k++) {
            json_t *ts = token_str(tok, l->top_ids[(size_t)i * l->k + k]);
            if (!json_object_get(top, json_string_value(ts)))
                json_object_set_new(top, json_string_value(ts),
                                    json_real(clamp_lp(l->top_lp[(size_t)i * l->k + k])));
            json_decref(ts);
        }
        if (!json_object_get(top, json_string_value(t)))
            json_object_set_new(top, json_string_value(t), json_real(clamp_lp(l->lp[i])));
        json_array_append_new(tops, top);
        json_array_append_new(tokens, t);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs",
                     tops, "text_offset", offs);
}

static json_t *bytes_of(json_t *s) {
    json_t *a = json_array();
    const unsigned char *p = (const unsigned char *)json_string_value(s);
    size_t n = json_string_length(s);
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(p[i]));
    return a;
}

json_t *oai_logprobs_chat(const Tokenizer *tok, const OaiLogprobs *l, int from, int to) {
    json_t *content = json_array();
    for (int i = from; i < to; i++) {
        json_t *t = token_str(tok, l->ids[i]), *top = json_array();
        for (int k = 0; k < l->k; k++) {
            json_t *ts = token_str(tok, l->top_ids[(size_t)i * l->k + k]);
            json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", ts, "logprob",
                                                 clamp_lp(l->top_lp[(size_t)i * l->k + k]), "bytes",
                                                 bytes_of(ts)));
        }
        json_array_append_new(content, json_pack("{s:o,s:f,s:o,s:o}", "token", t, "logprob",
                                                 clamp_lp(l->lp[i]), "bytes", bytes_of(t),
                                                 "top_logprobs", top));
    }
    return json_pack("{s:o,s:n}", "content", content, "refusal");
}

json_t *oai_tool_calls(const ToolCall *calls, int from, int to, int with_index) {
    json_t *a = json_array();
    for (int i = from; i < to; i++) {
        char *id = oai_random_id("chatcmpl-tool-");
        json_t *c = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function",
                              "name", calls[i].name, "arguments", calls[i].arguments);
        free(id);
        if (!c) continue; /* a name or arguments that is not valid UTF-8 cannot happen: the
                           * text came from the engine as UTF-8 */
        if (with_index) json_object_set_new(c, "index", json_integer(i));
        json_array_append_new(a, c);
    }
    return a;
}

void oai_sse_append(SBuf *out, json_t *chunk) {
    char *s = json_dumps(chunk, JSON_COMPACT);
    json_decref(chunk);
    sbuf_adds(out, "data: ");
    if (s) sbuf_adds(out, s);
    sbuf_adds(out, "\n\n");
    free(s);
}
