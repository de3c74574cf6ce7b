/* reasoning_parser.h: `--reasoning-parser qwen3`: the model's "<think>...</think>" text becomes
 * reasoning_content, the rest content. Streaming and whole-text parsing are the same code (the
 * whole text is one feed), so a streamed reply splits exactly as the non-streamed one does.
 * Text before "<think>" is content; after "<think>" everything is reasoning until "</think>"
 * (a reply cut off by max_tokens inside the thinking is all reasoning); only the first block is
 * special. Text that may be the start of a tag is held back until it is decided. */
#ifndef CVLLM_SERVER_REASONING_PARSER_H
#define CVLLM_SERVER_REASONING_PARSER_H

#include "server/sbuf.h"

typedef struct {
    int state; /* 0 before <think>, 1 inside, 2 after </think> */
    SBuf hold; /* undecided text */
} ReasoningStream;

void reasoning_init(ReasoningStream *s);
void reasoning_free(ReasoningStream *s);
/* Feeds n bytes of output text; appends decided text to *reasoning and *content. final = 1 at
 * the end of the output (flushes what was held back). */
void reasoning_feed(ReasoningStream *s, const char *text, size_t n, int final, SBuf *reasoning,
                    SBuf *content);

#endif
