/* textgen.h: text on top of the engine's token streams: incremental detokenization of a request's
 * output and stop strings (the stop text is cut from the output, as in vLLM; the request is
 * finished with CVLLM_FINISH_STOP). Also tells how much text is safe to stream: text that could
 * still be the start of a stop string is held back. */
#ifndef CVLLM_CLI_TEXTGEN_H
#define CVLLM_CLI_TEXTGEN_H

#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    int64_t request_id;
    DetokStream *detok;     /* owned; NULL without a tokenizer */
    char *text;             /* output text so far (stop text cut), owned */
    size_t len, cap;
    size_t streamed;        /* bytes of text already handed out by textgen_streamable */
    char **stops;           /* borrowed */
    int num_stops;
    size_t max_stop_len;
    int num_ids_seen;
    int done;
} TextStream;

void textgen_init(TextStream *ts, int64_t request_id, const Tokenizer *tok, char **stops,
                  int num_stops);
void textgen_free(TextStream *ts);
/* Pulls the request's new tokens, extends the text, applies stop strings (finishing the request
 * on a match). Call after every engine step. Returns 0 or a negative code (bad id). */
int textgen_update(CvllmEngine *e, TextStream *ts);
/* Text that can be shown now: [*start, *start + *n) of ts->text; marks it streamed. */
void textgen_streamable(TextStream *ts, const char **start, size_t *n);

#endif
