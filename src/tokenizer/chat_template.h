/* chat_template.h: renders a model's Jinja chat template (the subset the Qwen2/2.5/3, Llama 3 and
 * Mistral templates use) identically to @huggingface/jinja. An unsupported construct is an error
 * naming the construct and its line:column, never a silent wrong render. */
#ifndef CVLLM_CHAT_TEMPLATE_H
#define CVLLM_CHAT_TEMPLATE_H

#include <jansson.h>

typedef struct ChatTemplate ChatTemplate;

/* Parses template source. Returns 0 or a negative code (message with line:column). */
int chat_template_compile(const char *source, ChatTemplate **out);
void chat_template_free(ChatTemplate *t); /* accepts NULL */

/* Renders with the variables of a JSON object (messages, tools, add_generation_prompt, bos_token,
 * eos_token, enable_thinking, ...: every key becomes a template variable). *out is malloc'd. */
int chat_template_render(const ChatTemplate *t, json_t *vars, char **out);

#endif
