/* jsonl_prompt.h: one line of a `cvllm complete --prompt-file` JSON-lines file -> the fields of a
 * request. A line is a JSON object: {"prompt": "..."} or {"prompt_token_ids": [...]}, plus any of
 * max_tokens, temperature, top_p, top_k, min_p, seed, ignore_eos, stop, stop_token_ids,
 * presence_penalty, frequency_penalty, repetition_penalty, logprobs, include_stop_str_in_output. Every value
 * is checked here, with the ranges the command line uses, so that a bad line is refused with its
 * line number ("line 3: \"top_p\" must be a number in (0, 1], got 0") before it reaches the engine. */
#ifndef CVLLM_CLI_JSONL_PROMPT_H
#define CVLLM_CLI_JSONL_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"

typedef struct {
    char *prompt;               /* "prompt" (owned), or NULL */
    int32_t *prompt_ids;        /* "prompt_token_ids" (owned), or NULL */
    int num_prompt_ids;
    CvllmSamplingParams params; /* in: the defaults; out: with the line's fields applied (when the
                                   line sets stop_token_ids, params.stop_token_ids = stop_ids) */
    int32_t *stop_ids;          /* the line's stop_token_ids (owned), or NULL */
    char **stops;               /* the line's "stop" strings (owned) when has_stops */
    int num_stops, has_stops;
} JsonlPrompt;

/* Parses line[0..len) (may hold NUL bytes; lineno names it in messages) over the defaults in
 * p->params (the other fields zero). Returns 0, or CVLLM_EINVAL with the message set ("line N:
 * ..."). Either way p holds what was parsed: free it with jsonl_prompt_free. */
int jsonl_prompt_parse(const char *line, size_t len, long lineno, JsonlPrompt *p);
void jsonl_prompt_free(JsonlPrompt *p); /* frees the owned fields, keeps params */

#endif
