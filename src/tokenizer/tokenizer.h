/* tokenizer.h: Hugging Face tokenizer.json (byte-level BPE as used by Qwen2/Qwen3/Llama 3) and
 * tokenizer_config.json, in C. Results are identical to @huggingface/tokenizers (tokenizers.js).
 *
 * Supported: model BPE (vocab, merges as "a b" or ["a","b"], ignore_merges, unk_token,
 * byte_fallback=false); normalizer null / NFC / NFD / NFKC / NFKD / Sequence of these; pre_tokenizer
 * null / Split (Regex or String; Isolated or Removed; invert) / ByteLevel (add_prefix_space,
 * use_regex) / Sequence, with ByteLevel last; decoder null / ByteLevel; added tokens with lstrip,
 * rstrip, single_word (Rust semantics) and normalized. Anything else in the file is refused at load
 * with CVLLM_EUNSUPPORTED and a message naming it. Malformed files give CVLLM_EFORMAT.
 *
 * Invalid UTF-8 input to tokenizer_encode is an error: it returns CVLLM_EINVAL and the message
 * (cvllm_last_error) gives the offset of the first bad byte. Nothing is guessed or replaced.
 *
 * A Tokenizer is immutable after loading: encode/decode may run from several threads at once. */
#ifndef CVLLM_TOKENIZER_H
#define CVLLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;

/* Loads dir/tokenizer.json and, if present, dir/tokenizer_config.json. Returns 0, or
 * CVLLM_EIO / CVLLM_EFORMAT / CVLLM_EUNSUPPORTED with the message set and *out = NULL.
 * Qwen3's 11 MB tokenizer.json loads in ~150-200 ms (`cvllm bench tokenize`). */
int tokenizer_load(const char *dir, Tokenizer **out);
/* Loads from in-memory JSON texts (config_json, NUL-terminated, may be NULL). Same returns. */
int tokenizer_load_from_strings(const char *tokenizer_json, size_t len, const char *config_json,
                                Tokenizer **out);
void tokenizer_free(Tokenizer *t); /* accepts NULL */

/* Encodes text (UTF-8, len bytes, may contain NUL) without adding special tokens
 * (add_special_tokens=False); special/added tokens that appear in the text are matched.
 * Returns the number of ids (>= 0) with *ids malloc'd (never NULL, even for 0 ids), or
 * CVLLM_EINVAL for invalid UTF-8 with *ids = NULL. */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids);
/* Decodes ids to UTF-8 text (malloc'd, NUL-terminated); skip_special drops special tokens (and
 * tokenizer_config's additional_special_tokens). Bytes that do not form valid UTF-8 become U+FFFD
 * as in the HF decoder (one per maximal invalid subpart, like TextDecoder). Applies
 * clean_up_tokenization_spaces when the config asks for it (tokenizers.js default: true when the
 * config does not say; Qwen3 says false). Ids >= tokenizer_vocab_size (a model's padding ids: its
 * vocabulary may be larger than the tokenizer's) decode as nothing, as in Hugging Face. Returns
 * NULL and sets the error for a negative id. */
char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n, int skip_special);
/* Same, and stores the text's length in *out_len (if not NULL): the text may contain U+0000. */
char *tokenizer_decode_len(const Tokenizer *t, const int32_t *ids, int n, int skip_special,
                           size_t *out_len);

/* 1 if s[0..len) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF): the one
 * check every input path uses (engine stop strings, CLI options, the server's request bodies). */
int utf8_valid(const char *s, size_t len);
int tokenizer_vocab_size(const Tokenizer *t);      /* highest id + 1, added tokens included */
const char *tokenizer_id_to_token(const Tokenizer *t, int32_t id); /* raw token string or NULL */
int32_t tokenizer_token_to_id(const Tokenizer *t, const char *token); /* -1 if absent */
int tokenizer_is_special(const Tokenizer *t, int32_t id);
/* From tokenizer_config.json (NULL / -1 when absent). */
const char *tokenizer_chat_template(const Tokenizer *t);
const char *tokenizer_bos_token(const Tokenizer *t);
const char *tokenizer_eos_token(const Tokenizer *t);
const char *tokenizer_pad_token(const Tokenizer *t);
int32_t tokenizer_eos_id(const Tokenizer *t);
int32_t tokenizer_bos_id(const Tokenizer *t);

/* Streaming detokenization: feed ids one at a time, get back only complete UTF-8 text. The
 * concatenated output equals tokenizer_decode of all ids, except that clean_up_tokenization_spaces
 * (off for Qwen3) is not applied. The stream keeps a pointer to t. */
typedef struct DetokStream DetokStream;
DetokStream *detok_stream_create(const Tokenizer *t, int skip_special);
/* Appends id; returns the newly completed text (malloc'd, possibly ""; "" for an id past the
 * tokenizer's vocabulary), or NULL for a negative id. */
char *detok_stream_push(DetokStream *s, int32_t id);
/* Returns whatever is left (an incomplete character at the end becomes U+FFFD). malloc'd. */
char *detok_stream_flush(DetokStream *s);
void detok_stream_free(DetokStream *s);

#endif
