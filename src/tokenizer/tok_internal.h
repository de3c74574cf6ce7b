/* tok_internal.h: the Tokenizer struct and the helpers shared by the tokenizer's .c files
 * (tokenizer.c: loading, hash tables; tok_json.c: fast tokenizer.json scan; tok_pretok.c: UTF-8 and
 * regex split; tok_encode.c: added tokens, normalizer, BPE; tok_decode.c: decoding and streaming).
 * Not part of the public API.
 *
 * Symbols ("syms"): every string the BPE model can produce gets an int32 id. Strings of the
 * vocabulary (and added tokens, which override a vocabulary entry with the same content, as
 * tokenizers.js does) use their token id; strings that only appear as a merge result or a merge
 * operand but are not in the vocabulary get "virtual" ids >= vocab_size. A virtual sym left at the
 * end of BPE becomes unk_id, or is dropped when there is no unk token (as in HF). */
#ifndef CVLLM_TOK_INTERNAL_H
#define CVLLM_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* String -> int32 map over an arena (open addressing, linear probing, power-of-two size). */
typedef struct {
    uint64_t hash; /* 0 = empty slot */
    uint32_t off;  /* key offset in arena */
    uint32_t len;  /* key length */
    int32_t val;
    uint32_t pad;
} StrSlot; /* one cache line access per probe */

typedef struct {
    StrSlot *slots; /* [cap] */
    size_t cap, count;
    char *arena; /* owned; keys NUL-terminated */
    size_t arena_len, arena_cap;
} StrMap;

void strmap_init(StrMap *m, size_t expected);
void strmap_free(StrMap *m);
/* Inserts or overwrites key -> val. Returns the arena offset of the stored key. */
uint32_t strmap_put(StrMap *m, const char *key, size_t len, int32_t val);
/* Returns the value for key, or -1 when absent. */
int32_t strmap_get(const StrMap *m, const char *key, size_t len);
int32_t strmap_get_h(const StrMap *m, const char *key, size_t len, uint64_t h); /* h = tok_hash */
void strmap_prefetch(const StrMap *m, uint64_t h); /* a hint before a batch of lookups */
uint64_t tok_hash(const void *p, size_t len); /* never 0 */

/* (left sym, right sym) -> (rank, merged sym). */
typedef struct {
    uint64_t key;   /* ((uint64_t)left << 32 | right) + 1; 0 = empty */
    int32_t rank;
    int32_t merged;
} MergeSlot;

typedef struct {
    MergeSlot *slots; /* [cap] */
    size_t cap, count;
} MergeMap;

static inline size_t tok_merge_slot(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 29) & mask;
}

typedef enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_INVERT_MATCHES } SplitBehavior;

typedef struct {
    pcre2_code *code; /* owned */
    int jit;          /* 1 when JIT-compiled */
    SplitBehavior behavior;
} SplitStep;

typedef struct {
    char *content; /* owned, UTF-8 */
    size_t len;
    char *ncontent; /* owned: content after the normalizer (matched when normalized=1) */
    size_t nlen;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} AddedTok;

/* Table of added-token contents for longest-match scanning. */
typedef struct {
    int *by_first[256]; /* indices into Tokenizer.added, longest first; owned */
    int n_by_first[256];
} AddedMatcher;

typedef enum { NORM_NONE = 0, NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD } NormForm;

struct Tokenizer {
    /* model */
    StrMap vocab;           /* token string -> id (added tokens override), plus virtual syms */
    int32_t vocab_size;     /* highest real id + 1 */
    int32_t n_syms;         /* vocab_size + number of virtual syms */
    char **id_to_str;       /* [vocab_size] points into vocab.arena or NULL for holes */
    uint32_t *id_len;       /* [vocab_size] */
    MergeMap merges;
    int32_t unk_id;         /* -1: none */
    int ignore_merges;
    /* pre-tokenization */
    int byte_level;         /* a ByteLevel pre-tokenizer ends the chain */
    int add_prefix_space;   /* ByteLevel add_prefix_space */
    int bl_level;           /* index of the first step that belongs to ByteLevel (its use_regex) */
    SplitStep *steps;       /* [n_steps] regex splits, in order (ByteLevel use_regex adds one) */
    int n_steps;
    int32_t byte_sym[256];  /* byte-level: sym of the char that byte b maps to (or -1) */
    StrMap raw_vocab;       /* byte-level + ignore_merges: raw bytes -> id */
    /* normalizer: a sequence of Unicode normalization forms */
    NormForm *norms;
    int n_norms;
    /* added tokens */
    AddedTok *added;
    int n_added;
    AddedMatcher match_raw;  /* tokens matched before normalization */
    AddedMatcher match_norm; /* normalized tokens, matched after normalization */
    int has_norm_added;
    StrMap added_map;        /* content (and normalized content) -> index into added */
    /* decoding */
    int decoder_byte_level;  /* 1: ByteLevel decoder; 0: no decoder (tokens joined with " ") */
    uint8_t *id_verbatim;    /* [vocab_size] 1: added token content, emitted as is */
    uint8_t *id_skip;        /* [vocab_size] 1: dropped by skip_special */
    uint8_t *id_special;     /* [vocab_size] 1: special added token */
    char *dec_arena;         /* byte-decoded token bytes */
    uint32_t *dec_off;       /* [vocab_size + 1] offsets into dec_arena */
    int clean_up_spaces;
    /* tokenizer_config.json */
    char *chat_template, *bos_token, *eos_token, *pad_token;
};

/* The GPT-2 byte-level map, inverse direction: code point -> byte, or -1. */
int tok_cp_to_byte(uint32_t cp);

/* Returns 0 when s[0..len) is valid UTF-8 (no overlongs, surrogates or code points > U+10FFFF),
 * else -(offset of the first bad byte + 1). */
long tok_utf8_check(const char *s, size_t len);
/* Decodes one code point of valid UTF-8 at s; stores its byte length in *n. */
uint32_t tok_utf8_next(const char *s, int *n);
int tok_utf8_put(uint32_t cp, char *out); /* writes 1-4 bytes, returns the count */

/* Compiles an Oniguruma pattern (tokenizer.json "Regex") after rewriting it the way tokenizers.js
 * does (\s = White_Space, (?i:...) = ASCII case folding). literal: pattern is a plain string. */
int tok_regex_compile(const char *pattern, int literal, pcre2_code **out, int *jit);

/* Growable id array. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} IdVec;

/* Encoding scratch (one per encode call). */
typedef struct EncodeCtx EncodeCtx;
/* Runs the pre-tokenizer steps on text[0..len) and BPE on each piece, appending to out. */
int tok_pretokenize_and_bpe(const Tokenizer *t, EncodeCtx *ctx, const char *text, size_t len,
                            IdVec *out);
/* BPE of one pre-token (raw bytes) appended to out (cached). */
void tok_bpe_word(const Tokenizer *t, EncodeCtx *ctx, const char *w, size_t len, IdVec *out);
pcre2_match_data *tok_ctx_match_data(EncodeCtx *ctx, const SplitStep *s);
pcre2_match_context *tok_ctx_match_context(EncodeCtx *ctx);
/* After PCRE2_ERROR_JIT_STACKLIMIT: installs a larger JIT stack once; returns 1 if it did. */
int tok_ctx_grow_jit_stack(EncodeCtx *ctx);

/* Applies the normalizer chain; returns a malloc'd NUL-terminated text (a copy when there is no
 * normalizer) and its length in *out_len, or NULL with the error set. text must be valid UTF-8. */
char *tok_normalize(const Tokenizer *t, const char *text, size_t len, size_t *out_len);
/* 0 when the normalizer chain certainly leaves text unchanged (a cheap byte scan). */
int tok_normalize_needed(const Tokenizer *t, const char *text, size_t len);

/* tokenizer.json split by tok_json.c: model.vocab went straight into t->vocab, model.merges into a
 * list of string pairs, everything else into the jansson tree root. */
typedef struct {
    uint32_t a_off, a_len, b_off, b_len; /* into TokJson.m_arena */
} MergeStr;

typedef struct {
    json_t *root;                    /* owned; "model" lacks vocab/merges when has_* is set */
    int has_vocab, has_merges;
    uint32_t *vocab_off;             /* [n_vocab] key offsets in t->vocab.arena */
    int32_t *vocab_id;               /* [n_vocab] */
    size_t n_vocab, cap_vocab, n_vocab_id, cap_vocab_id;
    MergeStr *merges;                /* [n_merges], in file order (= rank) */
    size_t n_merges, cap_merges;
    char *m_arena;
    size_t m_len, m_cap;
} TokJson;

/* Parses tokenizer.json; initialises and fills t->vocab. Returns 0 or CVLLM_EFORMAT. */
int tok_json_parse(const char *s, size_t len, Tokenizer *t, TokJson *out);
void tok_json_free(TokJson *j);

/* Whitespace as JavaScript's String.prototype.trim sees it. */
int tok_is_js_space(uint32_t cp);

#endif
