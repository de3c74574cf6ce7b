/* tool_parser.c: the Hermes tool-call parser (see tool_parser.h). */
#include "server/tool_parser.h"

#include <jansson.h>

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";

void tool_stream_init(ToolStream *s) { memset(s, 0, sizeof *s); }

void tool_stream_free(ToolStream *s) {
    sbuf_free(&s->hold);
    for (int i = 0; i < s->num_calls; i++) {
        free(s->calls[i].name);
        free(s->calls[i].arguments);
    }
    free(s->calls);
    memset(s, 0, sizeof *s);
}

int tool_call_parse(const char *body, size_t n, ToolCall *out) {
    json_t *o = json_loadb(body, n, JSON_DECODE_ANY, NULL);
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    if (!args) args = json_object_get(o, "parameters");
    if (!json_is_object(o) || !json_is_string(name)) {
        json_decref(o);
        return -1;
    }
    out->name = xstrdup(json_string_value(name));
    if (json_is_string(args)) out->arguments = xstrdup(json_string_value(args));
    else if (!args || json_is_null(args)) out->arguments = xstrdup("{}");
    else out->arguments = json_dumps(args, JSON_ENCODE_ANY); /* ", " and ": " as Python's json */
    json_decref(o);
    return 0;
}

/* A finished call body: a call, or (unparseable) text in the content. */
static int finish_call(ToolStream *s, const char *body, size_t n, int closed, SBuf *content) {
    ToolCall c;
    if (tool_call_parse(body, n, &c) == 0) {
        DA_PUSH(s->calls, s->num_calls, s->cap_calls, c);
        s->state = 2;
        return 1;
    }
    if (s->state != 2 || s->num_calls == 0) {
        sbuf_adds(content, OPEN);
        sbuf_add(content, body, n);
        if (closed) sbuf_adds(content, CLOSE);
    }
    s->state = s->num_calls ? 2 : 0;
    return 0;
}

int tool_stream_feed(ToolStream *s, const char *text, size_t n, int final, SBuf *content) {
    int found = 0;
    sbuf_add(&s->hold, text, n);
    for (;;) {
        if (s->state == 1) {
            long at = sbuf_find(s->hold.s, s->hold.len, CLOSE);
            if (at < 0) {
                if (final) {
                    found += finish_call(s, s->hold.s, s->hold.len, 0, content);
                    sbuf_clear(&s->hold);
                }
                return found;
            }
            found += finish_call(s, s->hold.s, (size_t)at, 1, content);
            sbuf_consume(&s->hold, (size_t)at + strlen(CLOSE));
            continue;
        }
        long at = sbuf_find(s->hold.s, s->hold.len, OPEN);
        if (at >= 0) {
            if (s->state == 0) sbuf_add(content, s->hold.s, (size_t)at);
            sbuf_consume(&s->hold, (size_t)at + strlen(OPEN));
            s->state = 1;
            continue;
        }
        size_t keep = final ? 0 : sbuf_tag_prefix_suffix(s->hold.s, s->hold.len, OPEN);
        if (s->state == 0) sbuf_add(content, s->hold.s, s->hold.len - keep);
        sbuf_consume(&s->hold, s->hold.len - keep);
        return found;
    }
}
