/* openai_response.h: OpenAI's response shapes: error objects, usage, log-probabilities (the
 * completions and the chat forms), tool calls, ids, and Server-Sent Events framing. */
#ifndef CVLLM_SERVER_OPENAI_RESPONSE_H
#define CVLLM_SERVER_OPENAI_RESPONSE_H

#include <jansson.h>
#include <stdint.h>

#include "server/openai_request.h"
#include "server/sbuf.h"
#include "server/tool_parser.h"
#include "tokenizer/tokenizer.h"

/* {"error": {"message", "type", "param", "code"}}: type "invalid_request_error" for 4xx,
 * "authentication_error" for 401, "server_error" for 5xx; param and code null when empty. */
json_t *oai_error_body(const OaiError *e);
/* {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details": {"cached_tokens"}} */
json_t *oai_usage(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);
/* prefix + 32 random hex digits ("cmpl-", "chatcmpl-", "chatcmpl-tool-"); malloc'd */
char *oai_random_id(const char *prefix);

/* Log-probabilities of tokens [from, to) of a choice: ids[i], lp[i], and the top k of each
 * (top_ids / top_lp, k per token). tok decodes each id alone (as vLLM shows tokens). */
typedef struct {
    const int32_t *ids;
    const float *lp;
    const int32_t *top_ids;
    const float *top_lp;
    int k;
} OaiLogprobs;
/* Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; *text_offset is the
 * offset (in characters) of the first token, advanced past the last. */
json_t *oai_logprobs_completion(const Tokenizer *tok, const OaiLogprobs *l, int from, int to,
                                int64_t *text_offset);
/* Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null} */
json_t *oai_logprobs_chat(const Tokenizer *tok, const OaiLogprobs *l, int from, int to);

/* [{"id", "type": "function", "function": {"name", "arguments"}}] for calls [from, to); with
 * index set (streaming deltas) when with_index. */
json_t *oai_tool_calls(const ToolCall *calls, int from, int to, int with_index);

/* Appends "data: <compact JSON>\n\n" and drops the reference. */
void oai_sse_append(SBuf *out, json_t *chunk);

#endif
