/* tool_parser.h: tool calls in the model's output, in the Hermes format Qwen3's chat template
 * teaches (vLLM's `hermes` parser): <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>.
 * Text before the first call is content; text after it, other than further calls, is dropped
 * (as vLLM does). A call whose JSON does not parse stays in the content as text. A call cut off
 * at the end of the output is parsed as far as it goes (valid JSON needed). Streaming and
 * whole-text parsing are the same code; a streamed call is reported whole once its closing tag
 * (or the end of the output) arrives. */
#ifndef CVLLM_SERVER_TOOL_PARSER_H
#define CVLLM_SERVER_TOOL_PARSER_H

#include "server/sbuf.h"

typedef struct {
    char *name;
    char *arguments; /* a JSON text (Python json.dumps spacing) */
} ToolCall;

typedef struct {
    int state;         /* 0 text, 1 inside a call, 2 after a call */
    SBuf hold;         /* undecided text, or the call being read */
    ToolCall *calls;   /* every call found so far */
    int num_calls, cap_calls;
} ToolStream;

void tool_stream_init(ToolStream *s);
void tool_stream_free(ToolStream *s);
/* Feeds text; appends decided content to *content; new calls are appended to s->calls. Returns
 * the number of calls found by this feed. */
int tool_stream_feed(ToolStream *s, const char *text, size_t n, int final, SBuf *content);
/* Parses one call body ({"name": ..., "arguments": ...}); 0 and *out filled, or -1. */
int tool_call_parse(const char *body, size_t n, ToolCall *out);

#endif
