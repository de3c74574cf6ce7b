/* chat_template.h: renders a model's Jinja chat template (the subset the Qwen2/2.5/3, Llama 3 and
 * Mistral templates use) identically to @huggingface/jinja. An unsupported construct is an error
 * naming the construct and its line:column, never a silent wrong render.
 * The engine lives in jinja_*.c (see jinja.h for the layering). */
#ifndef CVLLM_CHAT_TEMPLATE_H
#define CVLLM_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

typedef struct ChatTemplate ChatTemplate;

/* Parses template source. Returns 0 or a negative code (message with line:column). */
int chat_template_compile(const char *source, ChatTemplate **out);
/* Same for a source of n bytes that may contain NUL bytes. */
int chat_template_compile_n(const char *source, size_t n, ChatTemplate **out);
void chat_template_free(ChatTemplate *t); /* accepts NULL */

/* Renders with the variables of a JSON object (messages, tools, add_generation_prompt, bos_token,
 * eos_token, enable_thinking, ...: every key becomes a template variable). *out is malloc'd. */
int chat_template_render(const ChatTemplate *t, json_t *vars, char **out);

/* Checks the shapes every chat template relies on, before a render: messages an array of objects,
 * each with a string "role" and, when present, "tool_calls" an array (or null); tools (NULL: none)
 * an array of objects. "content" is left to the template: a string, a list of parts, null, or
 * (Llama 3's ipython role) an object. Returns 0, or CVLLM_EINVAL with a message naming the element
 * ("messages[2]: \"role\" must be a string, got a number"). */
int chat_template_check_inputs(const json_t *messages, const json_t *tools);

/* Guards against runaway templates; exceeding one is an error (CVLLM_ENOMEM / CVLLM_EINVAL). */
typedef struct {
    size_t max_output;      /* bytes of rendered text (and of any intermediate string) */
    size_t max_memory;      /* bytes the renderer may allocate */
    int64_t max_iterations; /* for-loop iterations (all loops together) and range() length */
    int max_depth;          /* expression nesting / macro recursion */
} ChatTemplateLimits;

/* The defaults chat_template_render uses: 64 MiB output, 1 GiB memory, 10M iterations, depth 400. */
void chat_template_limits_default(ChatTemplateLimits *l);
/* chat_template_render with explicit limits; *out_len (if not NULL) gets the length in bytes. */
int chat_template_render_ex(const ChatTemplate *t, json_t *vars, const ChatTemplateLimits *lim,
                            char **out, size_t *out_len);

#endif
