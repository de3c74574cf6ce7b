/* text_stream.h: a request's output text, built as its tokens arrive: incremental
 * detokenization (never splitting a multi-byte character), stop strings (the earliest match is
 * cut from the text, with the matched string kept only if asked, as in vLLM), and how much text
 * can be released now: text that could still be the start of a stop string is held back. */
#ifndef CVLLM_ENGINE_TEXT_STREAM_H
#define CVLLM_ENGINE_TEXT_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

typedef struct {
    DetokStream *detok;     /* owned */
    char *text;             /* output text so far (cut at a stop string), NUL-terminated, owned */
    size_t len, cap;
    size_t released;        /* bytes of text handed out so far */
    char **stops;           /* owned copies */
    int num_stops;
    size_t max_stop_len;
    int include_stop;
    int matched;            /* index of the stop string that matched, or -1 */
    int done;               /* no more text: a stop matched or the request finished */
} TextStream;

/* stops: num_stops strings (copied). */
void text_stream_init(TextStream *ts, const Tokenizer *tok, int skip_special,
                      const char *const *stops, int num_stops, int include_stop);
void text_stream_free(TextStream *ts); /* accepts zeroed */
/* Adds the text of ids; finished: the request ends with them (the detokenizer is flushed).
 * Returns 1 if a stop string matched now (the text is cut; the request must stop), else 0. */
int text_stream_push(TextStream *ts, const int32_t *ids, int n, int finished);
/* Releases the text that can be shown now; returns how many bytes were released by this call
 * (they end at ts->text + ts->released). */
size_t text_stream_release(TextStream *ts);

#endif
