/* tok_pretok.c: UTF-8 helpers and the regex pre-tokenizer (Split / ByteLevel use_regex).
 *
 * tokenizer.json patterns are written for Oniguruma (Rust tokenizers). tokenizers.js rewrites them
 * for JavaScript; we rewrite the same constructs the same way for PCRE2 so that both agree:
 * \s -> \p{White_Space} (PCRE2's UCP \s lacks U+0085), \d -> \p{Nd}, \w -> Oniguruma's word set,
 * \h -> hex digit (PCRE2's \h is horizontal space!), and (?i:...) folds ASCII letters only (PCRE2's
 * caseless mode would also fold U+017F 'ſ' and U+212A 'K'). Everything else is passed through.
 * Patterns are compiled with PCRE2_UTF|PCRE2_UCP and JIT; the text was validated once by the
 * caller, so matching runs without PCRE2's per-call UTF check. */
#include <string.h>

#include "common.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

/* ---------------------------------------------------------------- UTF-8 */

int utf8_valid(const char *s, size_t len) { return tok_utf8_check(s, len) == 0; }

long tok_utf8_check(const char *str, size_t len) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0;
    while (i < len) {
        /* fast path: 8 ASCII bytes at a time */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int n;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) n = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            n = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F; /* no surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else
            return -(long)i - 1;
        if (i + (size_t)n >= len) return -(long)i - 1; /* truncated */
        if (s[i + 1] < lo || s[i + 1] > hi) return -(long)i - 1;
        for (int k = 2; k <= n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return -(long)i - 1;
        i += (size_t)n + 1;
    }
    return 0;
}

uint32_t tok_utf8_next(const char *str, int *n) {
    const uint8_t *s = (const uint8_t *)str;
    if (s[0] < 0x80) {
        *n = 1;
        return s[0];
    }
    if (s[0] < 0xE0) {
        *n = 2;
        return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (s[0] < 0xF0) {
        *n = 3;
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *n = 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

int tok_utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_is_js_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

/* ---------------------------------------------------------------- pattern rewrite */

typedef struct {
    char *s;
    size_t n, cap;
} Buf;

static void buf_put(Buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1) + 64;
        b->s = xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void buf_puts(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

#define WORD_IN_CLASS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"
#define WORD_CHARS WORD_IN_CLASS "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"
#define WORD_CLASS "[" WORD_CHARS "]"

static const char *escape_rewrite(char c, int in_class) {
    switch (c) {
    case 's': return "\\p{White_Space}";
    case 'S': return "\\P{White_Space}";
    case 'd': return "\\p{Nd}";
    case 'D': return "\\P{Nd}";
    case 'h': return in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]";
    case 'a': return "\\x07";
    case 'e': return "\\x1B";
    case 'w': return in_class ? WORD_IN_CLASS : WORD_CLASS;
    }
    if (in_class) return NULL;
    switch (c) {
    case 'H': return "[^0-9A-Fa-f]";
    case 'W': return "[^" WORD_CHARS "]";
    case 'b':
        return "(?:(?<!" WORD_CLASS ")(?=" WORD_CLASS ")|(?<=" WORD_CLASS ")(?!" WORD_CLASS "))";
    case 'B':
        return "(?:(?<!" WORD_CLASS ")(?!" WORD_CLASS ")|(?<=" WORD_CLASS ")(?=" WORD_CLASS "))";
    }
    return NULL;
}

static int is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static char swap_case(char c) { return (char)(c ^ 0x20); }

/* Rewrites an Oniguruma pattern as tokenizers.js does (see the file comment). */
static char *rewrite_pattern(const char *p) {
    Buf b = {0};
    int ci_stack[256], depth = 0, in_class = 0;
    ci_stack[0] = 0;
    buf_puts(&b, "");
    for (size_t i = 0; p[i];) {
        char c = p[i];
        int ci = ci_stack[depth];
        if (c == '\\' && p[i + 1]) {
            const char *r = escape_rewrite(p[i + 1], in_class);
            if (r) buf_puts(&b, r);
            else buf_put(&b, p + i, 2);
            i += 2;
            continue;
        }
        if (in_class) {
            if (c == ']') in_class = 0;
            if (ci && is_alpha(c)) {
                if (p[i + 1] == '-' && is_alpha(p[i + 2])) { /* range a-f -> a-fA-F */
                    char r[6] = {c, '-', p[i + 2], swap_case(c), '-', swap_case(p[i + 2])};
                    buf_put(&b, r, 6);
                    i += 3;
                    continue;
                }
                char r[2] = {c, swap_case(c)};
                buf_put(&b, r, 2);
                i++;
                continue;
            }
            buf_put(&b, &c, 1);
            i++;
            continue;
        }
        if (c == '[') {
            in_class = 1;
            buf_put(&b, &c, 1);
            i++;
            if (p[i] == '^') buf_put(&b, p + i++, 1);
            if (p[i] == ']') buf_put(&b, p + i++, 1); /* a leading ] is literal */
            continue;
        }
        if (c == '(') {
            int new_ci = ci;
            if (!strncmp(p + i, "(?i:", 4)) {
                new_ci = 1;
                buf_puts(&b, "(?:");
                i += 4;
            } else if (!strncmp(p + i, "(?-i:", 5)) {
                new_ci = 0;
                buf_puts(&b, "(?:");
                i += 5;
            } else {
                buf_put(&b, &c, 1);
                i++;
            }
            if (depth < 255) ci_stack[++depth] = new_ci;
            continue;
        }
        if (c == ')') {
            if (depth > 0) depth--;
            buf_put(&b, &c, 1);
            i++;
            continue;
        }
        if (ci && is_alpha(c)) {
            char r[4] = {'[', c, swap_case(c), ']'};
            buf_put(&b, r, 4);
            i++;
            continue;
        }
        buf_put(&b, &c, 1);
        i++;
    }
    return b.s;
}

int tok_regex_compile(const char *pattern, int literal, pcre2_code **out, int *jit) {
    char *rx = literal ? xstrdup(pattern) : rewrite_pattern(pattern);
    int err;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* LITERAL refuses UCP */
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)rx, PCRE2_ZERO_TERMINATED, opts, &err, &off, NULL);
    if (!code) {
        char msg[256];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof(msg));
        int rc = cvllm_errorf(CVLLM_EUNSUPPORTED,
                              "tokenizer.json: cannot compile Split regex \"%s\" (as \"%s\"): %s at "
                              "offset %zu",
                              pattern, rx, msg, (size_t)off);
        free(rx);
        return rc;
    }
    free(rx);
    *jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    *out = code;
    return 0;
}

/* ---------------------------------------------------------------- splitting */

/* Runs the regex of step s over text[0..len) and calls emit for each resulting piece.
 * Matching follows JavaScript's matchAll: after an empty match the search resumes one code
 * point further. */
typedef int (*PieceFn)(const Tokenizer *t, EncodeCtx *ctx, int level, const char *p, size_t n,
                       IdVec *out);

static int split_run(const Tokenizer *t, EncodeCtx *ctx, int level, const char *text, size_t len,
                     IdVec *out, PieceFn emit) {
    const SplitStep *s = &t->steps[level];
    pcre2_match_data *md = tok_ctx_match_data(ctx, s);
    size_t pos = 0, prev = 0;
    while (pos <= len) {
        int rc = s->jit ? pcre2_jit_match(s->code, (PCRE2_SPTR)text, len, pos, 0, md,
                                          tok_ctx_match_context(ctx))
                        : pcre2_match(s->code, (PCRE2_SPTR)text, len, pos, PCRE2_NO_UTF_CHECK, md,
                                      tok_ctx_match_context(ctx));
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && tok_ctx_grow_jit_stack(ctx)) continue; /* retry */
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            char msg[256];
            pcre2_get_error_message(rc, (PCRE2_UCHAR *)msg, sizeof(msg));
            return cvllm_errorf(CVLLM_EINVAL, "tokenizer: regex match failed: %s", msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (s->behavior != SPLIT_INVERT_MATCHES && ms > prev) {
            int e = emit(t, ctx, level + 1, text + prev, ms - prev, out);
            if (e < 0) return e;
        }
        if (me > ms && s->behavior != SPLIT_REMOVED) {
            int e = emit(t, ctx, level + 1, text + ms, me - ms, out);
            if (e < 0) return e;
        }
        prev = me;
        if (me == ms) { /* empty match: step over one code point */
            if (me >= len) break;
            int n;
            tok_utf8_next(text + me, &n);
            pos = me + (size_t)n;
        } else {
            pos = me;
        }
    }
    if (s->behavior != SPLIT_INVERT_MATCHES && prev < len)
        return emit(t, ctx, level + 1, text + prev, len - prev, out);
    return 0;
}

/* Handles one piece at pipeline position `level`: more splitting, or BPE. */
static int piece(const Tokenizer *t, EncodeCtx *ctx, int level, const char *p, size_t n,
                 IdVec *out) {
    if (n == 0) return 0;
    /* ByteLevel's add_prefix_space applies to each piece that reaches it, before its own regex. */
    if (t->add_prefix_space && level == t->bl_level && p[0] != ' ') {
        char *tmp = xmalloc(n + 1);
        tmp[0] = ' ';
        memcpy(tmp + 1, p, n);
        int rc = level < t->n_steps ? split_run(t, ctx, level, tmp, n + 1, out, piece)
                                    : (tok_bpe_word(t, ctx, tmp, n + 1, out), 0);
        free(tmp);
        return rc;
    }
    if (level < t->n_steps) return split_run(t, ctx, level, p, n, out, piece);
    tok_bpe_word(t, ctx, p, n, out);
    return 0;
}

int tok_pretokenize_and_bpe(const Tokenizer *t, EncodeCtx *ctx, const char *text, size_t len,
                            IdVec *out) {
    return piece(t, ctx, 0, text, len, out);
}
