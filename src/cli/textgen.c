/* textgen.c: incremental text and stop strings over an engine request. */
#include "cli/textgen.h"

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

void textgen_init(TextStream *ts, int64_t request_id, const Tokenizer *tok, char **stops,
                  int num_stops) {
    memset(ts, 0, sizeof *ts);
    ts->request_id = request_id;
    ts->detok = tok ? detok_stream_create(tok, 1) : NULL;
    ts->stops = stops;
    ts->num_stops = num_stops;
    for (int i = 0; i < num_stops; i++)
        if (strlen(stops[i]) > ts->max_stop_len) ts->max_stop_len = strlen(stops[i]);
    append(ts, "", 0);
}

void textgen_free(TextStream *ts) {
    if (!ts) return;
    detok_stream_free(ts->detok);
    free(ts->text);
    ts->detok = NULL;
    ts->text = NULL;
}

/* Finds the earliest stop string that ends in the text added since old_len. */
static int find_stop(const TextStream *ts, size_t old_len, size_t *at) {
    size_t from = old_len > ts->max_stop_len ? old_len - ts->max_stop_len : 0;
    int found = 0;
    for (int i = 0; i < ts->num_stops; i++) {
        size_t sl = strlen(ts->stops[i]);
        if (sl == 0) continue;
        const char *p = memmem(ts->text + from, ts->len - from, ts->stops[i], sl);
        if (p && (!found || (size_t)(p - ts->text) < *at)) {
            *at = (size_t)(p - ts->text);
            found = 1;
        }
    }
    return found;
}

int textgen_update(CvllmEngine *e, TextStream *ts) {
    if (ts->done || !ts->detok) return 0;
    const int32_t *ids;
    int n;
    CvllmFinishReason finish;
    int rc = cvllm_engine_peek(e, ts->request_id, &ids, &n, &finish);
    if (rc < 0) return rc;
    size_t old_len = ts->len;
    for (; ts->num_ids_seen < n; ts->num_ids_seen++) {
        char *piece = detok_stream_push(ts->detok, ids[ts->num_ids_seen]);
        if (!piece) return CVLLM_EINVAL;
        append(ts, piece, strlen(piece));
        free(piece);
    }
    size_t at;
    if (ts->num_stops && find_stop(ts, old_len, &at)) {
        ts->len = at;
        ts->text[at] = '\0';
        if (ts->streamed > at) ts->streamed = at;
        ts->done = 1;
        if (finish == CVLLM_FINISH_NONE) cvllm_engine_finish_request(e, ts->request_id, CVLLM_FINISH_STOP);
        return 0;
    }
    if (finish != CVLLM_FINISH_NONE) {
        char *rest = detok_stream_flush(ts->detok);
        if (rest) {
            append(ts, rest, strlen(rest));
            free(rest);
        }
        if (ts->num_stops && find_stop(ts, old_len, &at)) {
            ts->len = at;
            ts->text[at] = '\0';
        }
        ts->done = 1;
    }
    return 0;
}

void textgen_streamable(TextStream *ts, const char **start, size_t *n) {
    size_t end = ts->len;
    if (!ts->done && ts->max_stop_len > 0) {
        end = ts->len > ts->max_stop_len - 1 ? ts->len - (ts->max_stop_len - 1) : 0;
        while (end > 0 && end < ts->len && ((unsigned char)ts->text[end] & 0xC0) == 0x80) end--;
    }
    if (end < ts->streamed) end = ts->streamed;
    *start = ts->text + ts->streamed;
    *n = end - ts->streamed;
    ts->streamed = end;
}
