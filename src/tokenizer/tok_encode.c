/* tok_encode.c: text -> ids. The pipeline of tokenizers.js's Tokenizer.encode_text:
 *   1. validate UTF-8 once (invalid input is CVLLM_EINVAL, never guessed);
 *   2. split out added tokens that are matched on the raw text (longest match at the first position
 *      where any matches), then apply their lstrip/rstrip to the neighbouring text;
 *   3. per remaining section: normalizer (NFC etc. via utf8proc), then the normalized added tokens;
 *   4. per piece: the regex pre-tokenizer (tok_pretok.c), then byte-level BPE.
 * BPE is the classic "merge the lowest-ranked adjacent pair, leftmost first" with a binary heap and a
 * linked list over the symbols, on int ids only (no strings, no allocation per word once the scratch
 * buffers have grown). Words up to 255 bytes are cached per call, which is what makes English fast.
 *
 * single_word follows the Rust crate (the neighbours of the match must not be alphanumeric or '_');
 * tokenizers.js ignores the flag. */
#include <string.h>
#include <utf8proc.h>

#include "common.h"
#include "tokenizer/tok_internal.h"

#define CACHE_MAX_WORD 255

struct EncodeCtx {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    /* BPE scratch */
    int32_t *sym, *prv, *nxt;
    uint64_t *heap;
    size_t cap, heap_cap;
    /* word cache: open addressing over (hash, key, ids) */
    uint64_t *c_hash;
    uint32_t *c_koff, *c_ioff;
    uint16_t *c_klen, *c_n;
    size_t c_cap, c_count;
    char *c_keys;
    size_t c_keys_len, c_keys_cap;
    IdVec c_ids;
};

static void idvec_push(IdVec *v, int32_t id) { DA_PUSH(v->v, v->n, v->cap, id); }

static void ctx_init(EncodeCtx *c, size_t text_len) {
    memset(c, 0, sizeof(*c));
    c->md = pcre2_match_data_create(1, NULL);
    size_t want = text_len / 16;
    c->c_cap = 256;
    while (c->c_cap < want && c->c_cap < (1u << 20)) c->c_cap <<= 1;
    c->c_hash = xcalloc(c->c_cap, sizeof(uint64_t));
    c->c_koff = xmalloc(c->c_cap * sizeof(uint32_t));
    c->c_ioff = xmalloc(c->c_cap * sizeof(uint32_t));
    c->c_klen = xmalloc(c->c_cap * sizeof(uint16_t));
    c->c_n = xmalloc(c->c_cap * sizeof(uint16_t));
}

static void ctx_free(EncodeCtx *c) {
    pcre2_match_data_free(c->md);
    pcre2_match_context_free(c->mctx);
    pcre2_jit_stack_free(c->jstack);
    free(c->sym);
    free(c->prv);
    free(c->nxt);
    free(c->heap);
    free(c->c_hash);
    free(c->c_koff);
    free(c->c_ioff);
    free(c->c_klen);
    free(c->c_n);
    free(c->c_keys);
    free(c->c_ids.v);
}

pcre2_match_data *tok_ctx_match_data(EncodeCtx *ctx, const SplitStep *s) {
    (void)s;
    return ctx->md;
}

pcre2_match_context *tok_ctx_match_context(EncodeCtx *ctx) { return ctx->mctx; }

/* Called after PCRE2_ERROR_JIT_STACKLIMIT: gives the JIT a larger stack (up to 64 MiB). */
int tok_ctx_grow_jit_stack(EncodeCtx *ctx) {
    if (ctx->jstack) return 0;
    ctx->jstack = pcre2_jit_stack_create(1 << 16, 64 << 20, NULL);
    ctx->mctx = pcre2_match_context_create(NULL);
    if (!ctx->jstack || !ctx->mctx) return 0;
    pcre2_jit_stack_assign(ctx->mctx, NULL, ctx->jstack);
    return 1;
}

/* ---------------------------------------------------------------- BPE */

static int merge_lookup(const MergeMap *mm, int32_t a, int32_t b, int32_t *merged) {
    if (a < 0 || b < 0) return -1;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = mm->cap - 1, i = tok_merge_slot(key, mask);
    while (mm->slots[i].key) {
        if (mm->slots[i].key == key) {
            *merged = mm->slots[i].merged;
            return mm->slots[i].rank;
        }
        i = (i + 1) & mask;
    }
    return -1;
}

static void heap_push(EncodeCtx *c, size_t *n, uint64_t v) {
    if (*n >= c->heap_cap) {
        c->heap_cap = c->heap_cap ? 2 * c->heap_cap : 64;
        c->heap = xrealloc(c->heap, c->heap_cap * sizeof(uint64_t));
    }
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (c->heap[p] <= v) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = v;
}

static uint64_t heap_pop(EncodeCtx *c, size_t *n) {
    uint64_t top = c->heap[0], v = c->heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= *n) break;
        if (l + 1 < *n && c->heap[l + 1] < c->heap[l]) l++;
        if (v <= c->heap[l]) break;
        c->heap[i] = c->heap[l];
        i = l;
    }
    if (*n) c->heap[i] = v;
    return top;
}

static void push_pair(const Tokenizer *t, EncodeCtx *c, size_t *hn, int32_t pos) {
    int32_t nx = c->nxt[pos], merged;
    if (nx < 0) return;
    int rank = merge_lookup(&t->merges, c->sym[pos], c->sym[nx], &merged);
    if (rank >= 0) heap_push(c, hn, ((uint64_t)(uint32_t)rank << 32) | (uint32_t)pos);
}

/* BPE over the n symbols in c->sym; appends the resulting ids to out. */
static void bpe_symbols(const Tokenizer *t, EncodeCtx *c, int32_t n, IdVec *out) {
    size_t hn = 0;
    for (int32_t i = 0; i < n; i++) {
        c->prv[i] = i - 1;
        c->nxt[i] = i + 1 < n ? i + 1 : -1;
    }
    for (int32_t i = 0; i + 1 < n; i++) push_pair(t, c, &hn, i);
    while (hn) {
        uint64_t top = heap_pop(c, &hn);
        int32_t pos = (int32_t)(uint32_t)top, rank = (int32_t)(top >> 32), merged;
        int32_t nx = c->nxt[pos];
        if (c->sym[pos] == INT32_MIN || nx < 0) continue;
        if (merge_lookup(&t->merges, c->sym[pos], c->sym[nx], &merged) != rank) continue; /* stale */
        c->sym[pos] = merged;
        c->sym[nx] = INT32_MIN;
        c->nxt[pos] = c->nxt[nx];
        if (c->nxt[nx] >= 0) c->prv[c->nxt[nx]] = pos;
        if (c->prv[pos] >= 0) push_pair(t, c, &hn, c->prv[pos]);
        push_pair(t, c, &hn, pos);
    }
    for (int32_t i = 0; i >= 0; i = c->nxt[i]) {
        int32_t s = c->sym[i];
        if (s >= 0 && s < t->vocab_size && t->id_to_str[s]) idvec_push(out, s);
        else if (t->unk_id >= 0) idvec_push(out, t->unk_id); /* no unk: dropped, as in HF */
    }
}

static void ensure_scratch(EncodeCtx *c, size_t n) {
    if (n <= c->cap) return;
    c->cap = n + n / 2 + 64;
    c->sym = xrealloc(c->sym, c->cap * sizeof(int32_t));
    c->prv = xrealloc(c->prv, c->cap * sizeof(int32_t));
    c->nxt = xrealloc(c->nxt, c->cap * sizeof(int32_t));
}

static void bpe_uncached(const Tokenizer *t, EncodeCtx *c, const char *w, size_t len, IdVec *out) {
    if (t->ignore_merges) {
        int32_t id = t->byte_level ? strmap_get(&t->raw_vocab, w, len) : strmap_get(&t->vocab, w, len);
        if (id >= 0 && id < t->vocab_size) {
            idvec_push(out, id);
            return;
        }
    }
    ensure_scratch(c, len);
    int32_t n = 0;
    if (t->byte_level) {
        for (size_t i = 0; i < len; i++) c->sym[n++] = t->byte_sym[(uint8_t)w[i]];
    } else {
        for (size_t i = 0; i < len;) {
            int k;
            tok_utf8_next(w + i, &k);
            c->sym[n++] = strmap_get(&t->vocab, w + i, (size_t)k);
            i += (size_t)k;
        }
    }
    bpe_symbols(t, c, n, out);
}

static void cache_grow(EncodeCtx *c) {
    size_t old_cap = c->c_cap;
    uint64_t *oh = c->c_hash;
    uint32_t *ok = c->c_koff, *oi = c->c_ioff;
    uint16_t *ol = c->c_klen, *on = c->c_n;
    c->c_cap *= 2;
    c->c_hash = xcalloc(c->c_cap, sizeof(uint64_t));
    c->c_koff = xmalloc(c->c_cap * sizeof(uint32_t));
    c->c_ioff = xmalloc(c->c_cap * sizeof(uint32_t));
    c->c_klen = xmalloc(c->c_cap * sizeof(uint16_t));
    c->c_n = xmalloc(c->c_cap * sizeof(uint16_t));
    for (size_t i = 0; i < old_cap; i++) {
        if (!oh[i]) continue;
        size_t j = (size_t)oh[i] & (c->c_cap - 1);
        while (c->c_hash[j]) j = (j + 1) & (c->c_cap - 1);
        c->c_hash[j] = oh[i];
        c->c_koff[j] = ok[i];
        c->c_ioff[j] = oi[i];
        c->c_klen[j] = ol[i];
        c->c_n[j] = on[i];
    }
    free(oh);
    free(ok);
    free(oi);
    free(ol);
    free(on);
}

void tok_bpe_word(const Tokenizer *t, EncodeCtx *c, const char *w, size_t len, IdVec *out) {
    if (len == 0) return;
    if (len == 1 && t->byte_level) { /* one byte: its symbol, no merges possible */
        int32_t s = t->byte_sym[(uint8_t)w[0]];
        if (s >= 0 && s < t->vocab_size) idvec_push(out, s);
        else if (t->unk_id >= 0) idvec_push(out, t->unk_id);
        return;
    }
    if (len > CACHE_MAX_WORD) {
        bpe_uncached(t, c, w, len, out);
        return;
    }
    uint64_t h = tok_hash(w, len);
    size_t mask = c->c_cap - 1, i = (size_t)h & mask;
    while (c->c_hash[i]) {
        if (c->c_hash[i] == h && c->c_klen[i] == len && !memcmp(c->c_keys + c->c_koff[i], w, len)) {
            const int32_t *ids = c->c_ids.v + c->c_ioff[i];
            for (int k = 0; k < c->c_n[i]; k++) idvec_push(out, ids[k]);
            return;
        }
        i = (i + 1) & mask;
    }
    size_t before = out->n;
    bpe_uncached(t, c, w, len, out);
    size_t n = out->n - before;
    if (c->c_keys_len + len > UINT32_MAX / 2 || c->c_ids.n + n > UINT32_MAX / 2) return;
    if (c->c_keys_len + len > c->c_keys_cap) {
        c->c_keys_cap = 2 * (c->c_keys_len + len) + 4096;
        c->c_keys = xrealloc(c->c_keys, c->c_keys_cap);
    }
    memcpy(c->c_keys + c->c_keys_len, w, len);
    c->c_hash[i] = h;
    c->c_koff[i] = (uint32_t)c->c_keys_len;
    c->c_klen[i] = (uint16_t)len;
    c->c_ioff[i] = (uint32_t)c->c_ids.n;
    c->c_n[i] = (uint16_t)n;
    c->c_keys_len += len;
    for (size_t k = 0; k < n; k++) idvec_push(&c->c_ids, out->v[before + k]);
    if (++c->c_count * 2 > c->c_cap) cache_grow(c);
}

/* ---------------------------------------------------------------- normalizer */

/* 1 when form f may change text: ASCII is invariant under every form; below U+0300 (lead bytes
 * < 0xCC) nothing composes or has a canonical singleton, so NFC leaves such text alone. */
static int norm_may_change(NormForm f, const char *text, size_t len) {
    const uint8_t *s = (const uint8_t *)text;
    uint8_t limit = f == NORM_NFC ? 0xCC : 0x80;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (!(w & 0x8080808080808080ull)) continue; /* 8 ASCII bytes */
        for (int k = 0; k < 8; k++)
            if (s[i + k] >= limit) return 1;
    }
    for (; i < len; i++)
        if (s[i] >= limit) return 1;
    return 0;
}

int tok_normalize_needed(const Tokenizer *t, const char *text, size_t len) {
    for (int k = 0; k < t->n_norms; k++)
        if (norm_may_change(t->norms[k], text, len)) return 1;
    return 0;
}

char *tok_normalize(const Tokenizer *t, const char *text, size_t len, size_t *out_len) {
    char *cur = xmalloc(len + 1);
    memcpy(cur, text, len);
    cur[len] = 0;
    size_t cur_len = len;
    for (int k = 0; k < t->n_norms; k++) {
        NormForm f = t->norms[k];
        if (!norm_may_change(f, cur, cur_len)) continue;
        int opts = UTF8PROC_STABLE |
                   (f == NORM_NFC || f == NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                   (f == NORM_NFKC || f == NORM_NFKD ? UTF8PROC_COMPAT : 0);
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)cur_len,
                                          &dst, (utf8proc_option_t)opts);
        free(cur);
        if (n < 0) {
            cvllm_errorf(CVLLM_EINVAL, "tokenizer: normalization failed: %s", utf8proc_errmsg(n));
            return NULL;
        }
        cur = (char *)dst;
        cur_len = (size_t)n;
    }
    *out_len = cur_len;
    return cur;
}

/* ---------------------------------------------------------------- added tokens */

typedef struct {
    size_t start, len;
    int added; /* index into t->added, or -1 for text */
} Section;

static int is_word_cp(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

static uint32_t prev_cp(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80) i--;
    int n;
    return tok_utf8_next(s + i, &n);
}

static int single_word_ok(const char *s, size_t len, size_t start, size_t end) {
    int n;
    if (start > 0 && is_word_cp(prev_cp(s, start))) return 0;
    if (end < len && is_word_cp(tok_utf8_next(s + end, &n))) return 0;
    return 1;
}

/* Splits s[0..len) into text and added-token sections (tokenizers.js's DictionarySplitter). */
static void split_added(const Tokenizer *t, const AddedMatcher *m, int normalized, const char *s,
                        size_t len, Section **secs, size_t *n, size_t *cap) {
    size_t start = 0, i = 0;
    while (i < len) {
        uint8_t b = (uint8_t)s[i];
        int found = -1;
        for (int k = 0; k < m->n_by_first[b]; k++) {
            const AddedTok *a = &t->added[m->by_first[b][k]];
            const char *c = normalized ? a->ncontent : a->content;
            size_t cl = normalized ? a->nlen : a->len;
            if (cl <= len - i && !memcmp(s + i, c, cl) &&
                (!a->single_word || single_word_ok(s, len, i, i + cl))) {
                found = m->by_first[b][k];
                if (i > start) DA_PUSH(*secs, *n, *cap, ((Section){start, i - start, -1}));
                DA_PUSH(*secs, *n, *cap, ((Section){i, cl, found}));
                i += cl;
                start = i;
                break;
            }
        }
        if (found < 0) i++;
    }
    if (start < len) DA_PUSH(*secs, *n, *cap, ((Section){start, len - start, -1}));
}

/* lstrip / rstrip: trim JS whitespace off the neighbouring text sections. */
static void apply_strips(const Tokenizer *t, const char *s, Section *secs, size_t n) {
    for (size_t k = 0; k < n; k++) {
        if (secs[k].added < 0) continue;
        const AddedTok *a = &t->added[secs[k].added];
        if (a->lstrip && k > 0 && secs[k - 1].added < 0) {
            Section *p = &secs[k - 1];
            while (p->len > 0) {
                size_t e = p->start + p->len, i = e - 1;
                while (i > p->start && ((uint8_t)s[i] & 0xC0) == 0x80) i--;
                int cn;
                if (!tok_is_js_space(tok_utf8_next(s + i, &cn))) break;
                p->len = i - p->start;
            }
        }
        if (a->rstrip && k + 1 < n && secs[k + 1].added < 0) {
            Section *q = &secs[k + 1];
            while (q->len > 0) {
                int cn;
                if (!tok_is_js_space(tok_utf8_next(s + q->start, &cn))) break;
                q->start += (size_t)cn;
                q->len -= (size_t)cn;
            }
        }
    }
}

/* A text section that happens to equal an added token's (normalized) content is that token. */
static int whole_added(const Tokenizer *t, const char *s, size_t len) {
    int32_t idx = strmap_get(&t->added_map, s, len);
    return idx >= 0 ? t->added[idx].id : -1;
}

static int encode_text_section(const Tokenizer *t, EncodeCtx *ctx, const char *s, size_t len,
                               IdVec *out) {
    int id = whole_added(t, s, len);
    if (id >= 0) {
        idvec_push(out, id);
        return 0;
    }
    size_t nlen = len;
    char *owned = NULL; /* the normalized copy, when normalization can change the text */
    if (tok_normalize_needed(t, s, len)) {
        owned = tok_normalize(t, s, len, &nlen);
        if (!owned) return CVLLM_EINVAL;
    }
    const char *norm = owned ? owned : s;
    int rc = 0;
    if (!t->has_norm_added) {
        rc = tok_pretokenize_and_bpe(t, ctx, norm, nlen, out);
    } else {
        Section *secs = NULL;
        size_t n = 0, cap = 0;
        split_added(t, &t->match_norm, 1, norm, nlen, &secs, &n, &cap);
        apply_strips(t, norm, secs, n);
        for (size_t k = 0; k < n && rc >= 0; k++) {
            const char *p = norm + secs[k].start;
            if (secs[k].len == 0) continue;
            id = secs[k].added >= 0 ? t->added[secs[k].added].id : whole_added(t, p, secs[k].len);
            if (id >= 0) idvec_push(out, id);
            else rc = tok_pretokenize_and_bpe(t, ctx, p, secs[k].len, out);
        }
        free(secs);
    }
    free(owned);
    return rc;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids) {
    *ids = NULL;
    if (!text && len) return cvllm_errorf(CVLLM_EINVAL, "tokenizer_encode: NULL text");
    long bad = tok_utf8_check(text, len);
    if (bad) {
        size_t at = (size_t)(-bad - 1);
        return cvllm_errorf(CVLLM_EINVAL,
                            "tokenizer: input is not valid UTF-8 (bad byte 0x%02x at offset %zu)",
                            (uint8_t)text[at], at);
    }
    if (len > (size_t)INT32_MAX / 2)
        return cvllm_errorf(CVLLM_EINVAL, "tokenizer: input of %zu bytes is too long", len);
    EncodeCtx ctx;
    ctx_init(&ctx, len);
    IdVec out = {0};
    Section *secs = NULL;
    size_t n = 0, cap = 0;
    split_added(t, &t->match_raw, 0, text, len, &secs, &n, &cap);
    apply_strips(t, text, secs, n);
    int rc = 0;
    for (size_t k = 0; k < n && rc >= 0; k++) {
        if (secs[k].len == 0) continue;
        if (secs[k].added >= 0) idvec_push(&out, t->added[secs[k].added].id);
        else rc = encode_text_section(t, &ctx, text + secs[k].start, secs[k].len, &out);
    }
    free(secs);
    ctx_free(&ctx);
    if (rc < 0) {
        free(out.v);
        return rc;
    }
    *ids = out.v ? out.v : xmalloc(sizeof(int32_t));
    return (int)out.n;
}
