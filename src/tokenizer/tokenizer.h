/* tokenizer.h: Hugging Face tokenizer.json (byte-level BPE as used by Qwen2/Qwen3/Llama 3) and
 * tokenizer_config.json, in C. Results are identical to @huggingface/tokenizers.
 * Invalid UTF-8 input is an error (CVLLM_EINVAL), never a guess. */
#ifndef CVLLM_TOKENIZER_H
#define CVLLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;

/* Loads dir/tokenizer.json and, if present, dir/tokenizer_config.json. */
int tokenizer_load(const char *dir, Tokenizer **out);
/* Loads from in-memory JSON texts (config_json may be NULL). */
int tokenizer_load_from_strings(const char *tokenizer_json, size_t len, const char *config_json,
                                Tokenizer **out);
void tokenizer_free(Tokenizer *t); /* accepts NULL */

/* Encodes text (UTF-8, len bytes) without adding special tokens (add_special_tokens=False);
 * special/added tokens that appear in the text are matched. *ids is malloc'd.
 * Returns the number of ids (>= 0) or a negative code. */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids);
/* Decodes ids to UTF-8 text (malloc'd, NUL-terminated); skip_special drops special tokens.
 * Bytes that do not form valid UTF-8 become U+FFFD as in the HF decoder. Returns NULL and sets the
 * error for an id outside the vocabulary. */
char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n, int skip_special);

int tokenizer_vocab_size(const Tokenizer *t);      /* highest id + 1, added tokens included */
const char *tokenizer_id_to_token(const Tokenizer *t, int32_t id); /* raw token string or NULL */
int32_t tokenizer_token_to_id(const Tokenizer *t, const char *token); /* -1 if absent */
int tokenizer_is_special(const Tokenizer *t, int32_t id);
/* From tokenizer_config.json (NULL / -1 when absent). */
const char *tokenizer_chat_template(const Tokenizer *t);
const char *tokenizer_bos_token(const Tokenizer *t);
const char *tokenizer_eos_token(const Tokenizer *t);
int32_t tokenizer_eos_id(const Tokenizer *t);

/* Streaming detokenization: feed ids one at a time, get back only complete UTF-8 text. */
typedef struct DetokStream DetokStream;
DetokStream *detok_stream_create(const Tokenizer *t, int skip_special);
/* Appends id; returns the newly completed text (malloc'd, possibly ""), or NULL on a bad id. */
char *detok_stream_push(DetokStream *s, int32_t id);
/* Returns whatever is left (an incomplete character at the end becomes U+FFFD). malloc'd. */
char *detok_stream_flush(DetokStream *s);
void detok_stream_free(DetokStream *s);

#endif
