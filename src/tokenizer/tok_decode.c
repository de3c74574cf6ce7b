/* tok_decode.c: ids -> text, in one go (tokenizer_decode) or streaming (DetokStream).
 *
 * The ByteLevel decoder maps each token's characters back to bytes (precomputed per id at load,
 * see tokenizer.c) and decodes runs of bytes as UTF-8 the way the WHATWG TextDecoder does (what
 * tokenizers.js uses): every maximal invalid subpart becomes one U+FFFD. Added tokens are emitted
 * verbatim and cut the byte runs, as in tokenizers.js. The streaming decoder holds back an
 * incomplete UTF-8 sequence at the end until the next id completes it (or flush replaces it), so
 * concatenating its output gives exactly tokenizer_decode's text, except that streaming never
 * applies clean_up_tokenization_spaces. */
#include <string.h>

#include "common.h"
#include "tokenizer/tok_internal.h"

typedef struct {
    char *s;
    size_t n, cap;
} Str;

static void str_put(Str *b, const void *p, size_t n) {
    if (n == 0 && b->s) return;
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1) + 32;
        b->s = xrealloc(b->s, b->cap);
    }
    if (n) memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
}

static char *str_take(Str *b) {
    if (!b->s) return xstrdup("");
    return b->s;
}

static const char FFFD[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Decodes bytes as UTF-8 with replacement. When !final, an incomplete (but so far valid)
 * sequence at the end is not decoded; returns the number of bytes consumed. */
static size_t utf8_lossy(const uint8_t *s, size_t n, int final, Str *out) {
    if (n == 0) { /* s may be NULL: no pointer arithmetic on it (fuzz_tokenizer, UBSan) */
        str_put(out, "", 0);
        return 0;
    }
    size_t i = 0, run = 0; /* run: start of pending valid bytes not yet copied */
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            str_put(out, s + run, i - run);
            str_put(out, FFFD, 3);
            run = ++i;
            continue;
        }
        size_t j = i + 1;
        int k = 0, bad = 0;
        for (; k < need; k++, j++) {
            if (j >= n) break;
            uint8_t b = s[j];
            if (b < (k == 0 ? lo : 0x80) || b > (k == 0 ? hi : 0xBF)) {
                bad = 1;
                break;
            }
        }
        if (!bad && k == need) {
            i = j;
            continue;
        }
        str_put(out, s + run, i - run);
        if (!bad && !final) return i; /* incomplete at the end: keep it for later */
        str_put(out, FFFD, 3);
        i = bad ? j : n;
        run = i;
    }
    str_put(out, s + run, i - run);
    return n;
}

static char *replace_all(char *s, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to);
    if (!strstr(s, from)) return s;
    Str out = {0};
    const char *p = s, *q;
    while ((q = strstr(p, from))) {
        str_put(&out, p, (size_t)(q - p));
        str_put(&out, to, tl);
        p = q + fl;
    }
    str_put(&out, p, strlen(p));
    free(s);
    return str_take(&out);
}

/* tokenizers.js clean_up_tokenization (the old transformers rule). */
static char *clean_up(char *s) {
    static const char *rules[][2] = {{" .", "."},     {" ?", "?"},     {" !", "!"},     {" ,", ","},
                                     {" ' ", "'"},    {" n't", "n't"}, {" 'm", "'m"},   {" 's", "'s"},
                                     {" 've", "'ve"}, {" 're", "'re"}};
    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++) s = replace_all(s, rules[i][0], rules[i][1]);
    return s;
}

/* Ids at or past the tokenizer's size are padding rows of the model's embedding (Qwen3: 151,936
 * rows for 151,669 tokens): a model can sample them, and Hugging Face decodes them as nothing, so
 * they are skipped (they do not cut a run of bytes either). Negative ids are errors. */
static int check_id(int32_t id) {
    if (id >= 0) return 0;
    return cvllm_errorf(CVLLM_EINVAL, "tokenizer: token id %d is negative", id);
}

char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n, int skip_special) {
    return tokenizer_decode_len(t, ids, n, skip_special, NULL);
}

char *tokenizer_decode_len(const Tokenizer *t, const int32_t *ids, int n, int skip_special,
                           size_t *out_len) {
    Str out = {0}, bytes = {0};
    int first = 1;
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (check_id(id) < 0) {
            free(out.s);
            free(bytes.s);
            return NULL;
        }
        if (id >= t->vocab_size || (skip_special && t->id_skip[id])) continue;
        const char *d = t->dec_arena + t->dec_off[id];
        size_t dl = t->dec_off[id + 1] - t->dec_off[id];
        if (!t->decoder_byte_level) { /* no decoder: tokens joined with spaces */
            if (!first) str_put(&out, " ", 1);
            str_put(&out, d, dl);
        } else if (t->id_verbatim[id]) {
            utf8_lossy((const uint8_t *)bytes.s, bytes.n, 1, &out);
            bytes.n = 0;
            str_put(&out, d, dl);
        } else {
            str_put(&bytes, d, dl);
        }
        first = 0;
    }
    utf8_lossy((const uint8_t *)bytes.s, bytes.n, 1, &out);
    free(bytes.s);
    if (t->clean_up_spaces) { /* (cleanup works on C strings; text after a NUL is kept as is) */
        size_t head = out.s ? strlen(out.s) : 0;
        if (head == out.n) {
            char *s = clean_up(str_take(&out));
            if (out_len) *out_len = strlen(s);
            return s;
        }
    }
    if (out_len) *out_len = out.n;
    return str_take(&out);
}

/* ---------------------------------------------------------------- streaming */

struct DetokStream {
    const Tokenizer *t;
    int skip_special, first;
    uint8_t pending[8]; /* an incomplete UTF-8 sequence (at most 3 bytes) */
    size_t n_pending;
};

DetokStream *detok_stream_create(const Tokenizer *t, int skip_special) {
    DetokStream *s = xcalloc(1, sizeof(DetokStream));
    s->t = t;
    s->skip_special = skip_special;
    s->first = 1;
    return s;
}

char *detok_stream_push(DetokStream *s, int32_t id) {
    const Tokenizer *t = s->t;
    if (check_id(id) < 0) return NULL;
    Str out = {0};
    if (id >= t->vocab_size || (s->skip_special && t->id_skip[id])) return xstrdup("");
    const char *d = t->dec_arena + t->dec_off[id];
    size_t dl = t->dec_off[id + 1] - t->dec_off[id];
    if (!t->decoder_byte_level) {
        if (!s->first) str_put(&out, " ", 1);
        str_put(&out, d, dl);
    } else if (t->id_verbatim[id]) {
        utf8_lossy(s->pending, s->n_pending, 1, &out);
        s->n_pending = 0;
        str_put(&out, d, dl);
    } else {
        uint8_t small[64], *buf = dl + s->n_pending <= sizeof(small) ? small : xmalloc(dl + s->n_pending);
        memcpy(buf, s->pending, s->n_pending);
        memcpy(buf + s->n_pending, d, dl);
        size_t n = s->n_pending + dl;
        size_t used = utf8_lossy(buf, n, 0, &out);
        CHECK(n - used <= 3, "held back %zu bytes", n - used);
        memcpy(s->pending, buf + used, n - used);
        s->n_pending = n - used;
        if (buf != small) free(buf);
    }
    s->first = 0;
    return str_take(&out);
}

char *detok_stream_flush(DetokStream *s) {
    Str out = {0};
    utf8_lossy(s->pending, s->n_pending, 1, &out);
    s->n_pending = 0;
    return str_take(&out);
}

void detok_stream_free(DetokStream *s) { free(s); }
