/* text_stream.c: incremental text and stop strings of one request (see text_stream.h). */
#include "engine/text_stream.h"

#include <string.h>

#include "common.h"

static void append(TextStream *ts, const char *s, size_t n) {
    if (ts->len + n + 1 > ts->cap) {
        ts->cap = (ts->len + n + 1) * 2;
        ts->text = xrealloc(ts->text, ts->cap);
    }
    memcpy(ts->text + ts->len, s, n);
    ts->len += n;
    ts->text[ts->len] = '\0';
}

void text_stream_init(TextStream *ts, const Tokenizer *tok, int skip_special,
                      const char *const *stops, int num_stops, int include_stop) {
    memset(ts, 0, sizeof *ts);
    ts->detok = detok_stream_create(tok, skip_special);
    ts->matched = -1;
    ts->include_stop = include_stop;
    if (num_stops > 0) {
        ts->stops = xcalloc((size_t)num_stops, sizeof(char *));
        for (int i = 0; i < num_stops; i++) {
            ts->stops[i] = xstrdup(stops[i]);
            size_t l = strlen(stops[i]);
            if (l > ts->max_stop_len) ts->max_stop_len = l;
        }
        ts->num_stops = num_stops;
    }
    append(ts, "", 0);
}

void text_stream_free(TextStream *ts) {
    if (!ts) return;
    detok_stream_free(ts->detok);
    for (int i = 0; i < ts->num_stops; i++) free(ts->stops[i]);
    free(ts->stops);
    free(ts->text);
    memset(ts, 0, sizeof *ts);
}

/* The earliest stop string that ends in the text added since old_len: 1 and its start / index. */
static int find_stop(const TextStream *ts, size_t old_len, size_t *at, int *which) {
    size_t from = old_len > ts->max_stop_len ? old_len - ts->max_stop_len : 0;
    int found = 0;
    for (int i = 0; i < ts->num_stops; i++) {
        size_t sl = strlen(ts->stops[i]);
        if (sl == 0) continue;
        const char *p = memmem(ts->text + from, ts->len - from, ts->stops[i], sl);
        if (p && (!found || (size_t)(p - ts->text) < *at)) {
            *at = (size_t)(p - ts->text);
            *which = i;
            found = 1;
        }
    }
    return found;
}

int text_stream_push(TextStream *ts, const int32_t *ids, int n, int finished) {
    if (ts->done) return 0;
    size_t old_len = ts->len;
    for (int i = 0; i < n; i++) {
        char *piece = detok_stream_push(ts->detok, ids[i]);
        if (piece) append(ts, piece, strlen(piece)); /* no text for an id it cannot decode */
        free(piece);
    }
    if (finished) {
        char *rest = detok_stream_flush(ts->detok);
        if (rest) append(ts, rest, strlen(rest));
        free(rest);
        ts->done = 1;
    }
    size_t at = 0;
    int which = 0;
    if (ts->num_stops && find_stop(ts, old_len, &at, &which)) {
        size_t cut = ts->include_stop ? at + strlen(ts->stops[which]) : at;
        ts->len = cut;
        ts->text[cut] = '\0';
        if (ts->released > cut) ts->released = cut;
        ts->matched = which;
        ts->done = 1;
        return 1;
    }
    return 0;
}

size_t text_stream_release(TextStream *ts) {
    size_t end = ts->len;
    if (!ts->done && ts->max_stop_len > 0) {
        end = ts->len > ts->max_stop_len - 1 ? ts->len - (ts->max_stop_len - 1) : 0;
        while (end > 0 && end < ts->len && ((unsigned char)ts->text[end] & 0xC0) == 0x80) end--;
    }
    if (end <= ts->released) return 0;
    size_t n = end - ts->released;
    ts->released = end;
    return n;
}
