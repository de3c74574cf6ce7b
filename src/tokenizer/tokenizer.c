/* tokenizer.c: loading tokenizer.json / tokenizer_config.json into a Tokenizer, the hash tables
 * behind it, and the small accessors. Encoding lives in tok_encode.c / tok_pretok.c, decoding in
 * tok_decode.c.
 *
 * Semantics follow @huggingface/tokenizers (tokenizers.js, the test reference): added tokens
 * override vocabulary entries with the same content, duplicate merges keep the last rank, the
 * "skip special" set also holds tokenizer_config's additional_special_tokens, and
 * clean_up_tokenization_spaces defaults to true when the config does not say. Anything the file
 * names that we do not implement is refused with CVLLM_EUNSUPPORTED and a message, never ignored. */
#include <jansson.h>
#include <pthread.h>
#include <string.h>
#include <xxhash.h>

#include "common.h"
#include "tokenizer/tok_internal.h"

/* ---------------------------------------------------------------- hash tables */

uint64_t tok_hash(const void *p, size_t len) {
    uint64_t h = XXH3_64bits(p, len);
    return h ? h : 1;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

void strmap_init(StrMap *m, size_t expected) {
    memset(m, 0, sizeof(*m));
    m->cap = pow2_at_least(expected * 2 + 1);
    m->slots = xcalloc(m->cap, sizeof(StrSlot));
    m->arena_cap = 1024 + expected * 8;
    m->arena = xmalloc(m->arena_cap);
}

void strmap_free(StrMap *m) {
    free(m->slots);
    free(m->arena);
    memset(m, 0, sizeof(*m));
}

static size_t strmap_find(const StrMap *m, uint64_t h, const char *key, size_t len) {
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    while (m->slots[i].hash) {
        const StrSlot *s = &m->slots[i];
        if (s->hash == h && s->len == len && memcmp(m->arena + s->off, key, len) == 0) return i;
        i = (i + 1) & mask;
    }
    return i;
}

static void strmap_grow(StrMap *m) {
    StrSlot *old = m->slots;
    size_t old_cap = m->cap;
    m->cap *= 2;
    m->slots = xcalloc(m->cap, sizeof(StrSlot));
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].hash) continue;
        size_t j = (size_t)old[i].hash & (m->cap - 1);
        while (m->slots[j].hash) j = (j + 1) & (m->cap - 1);
        m->slots[j] = old[i];
    }
    free(old);
}

uint32_t strmap_put(StrMap *m, const char *key, size_t len, int32_t val) {
    uint64_t h = tok_hash(key, len);
    size_t i = strmap_find(m, h, key, len);
    if (m->slots[i].hash) {
        m->slots[i].val = val;
        return m->slots[i].off;
    }
    if (m->arena_len + len + 1 > m->arena_cap) {
        while (m->arena_len + len + 1 > m->arena_cap) m->arena_cap *= 2;
        m->arena = xrealloc(m->arena, m->arena_cap);
    }
    uint32_t off = (uint32_t)m->arena_len;
    memcpy(m->arena + off, key, len);
    m->arena[off + len] = 0;
    m->arena_len += len + 1;
    m->slots[i] = (StrSlot){h, off, (uint32_t)len, val, 0};
    if (++m->count * 2 > m->cap) strmap_grow(m);
    return off;
}

int32_t strmap_get_h(const StrMap *m, const char *key, size_t len, uint64_t h) {
    if (!m->cap) return -1;
    size_t i = strmap_find(m, h, key, len);
    return m->slots[i].hash ? m->slots[i].val : -1;
}

int32_t strmap_get(const StrMap *m, const char *key, size_t len) {
    return strmap_get_h(m, key, len, tok_hash(key, len));
}

void strmap_prefetch(const StrMap *m, uint64_t h) {
    __builtin_prefetch(&m->slots[(size_t)h & (m->cap - 1)]);
}

static void mergemap_init(MergeMap *mm, size_t expected) {
    mm->cap = pow2_at_least(expected * 2 + 1);
    mm->count = 0;
    mm->slots = xcalloc(mm->cap, sizeof(MergeSlot));
}

static void mergemap_put(MergeMap *mm, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = mm->cap - 1, i = tok_merge_slot(key, mask);
    while (mm->slots[i].key && mm->slots[i].key != key) i = (i + 1) & mask;
    if (!mm->slots[i].key) mm->count++;
    /* duplicates: the last one wins, as in tokenizers.js's Map */
    mm->slots[i] = (MergeSlot){key, rank, merged};
}

/* ---------------------------------------------------------------- the byte-level map */

static uint16_t g_b2c[256];
static int16_t g_c2b[324];
static pthread_once_t g_map_once = PTHREAD_ONCE_INIT;

/* The GPT-2 map: printable Latin-1 bytes map to themselves, the other 68 to U+0100.. in order. */
static void byte_map_fill(void) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        g_b2c[b] = printable ? (uint16_t)b : (uint16_t)(256 + n++);
    }
    for (int c = 0; c < 324; c++) g_c2b[c] = -1;
    for (int b = 0; b < 256; b++) g_c2b[g_b2c[b]] = (int16_t)b;
}

static void byte_map_init(void) { pthread_once(&g_map_once, byte_map_fill); }

int tok_cp_to_byte(uint32_t cp) { return cp < 324 ? g_c2b[cp] : -1; }

/* ---------------------------------------------------------------- JSON helpers */

static int json_flag(json_t *obj, const char *key, int def) {
    json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

/* A token in tokenizer_config.json: "str" or {"content": "str", ...}. */
static char *config_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? xstrdup(json_string_value(v)) : NULL;
}

/* ---------------------------------------------------------------- component parsers */

static int parse_normalizer(Tokenizer *t, json_t *n) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: normalizer has no \"type\"");
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(n, "normalizers"), *x;
        size_t i;
        if (!json_is_array(arr))
            return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: Sequence normalizer without list");
        json_array_foreach(arr, i, x) {
            int rc = parse_normalizer(t, x);
            if (rc < 0) return rc;
        }
        return 0;
    }
    NormForm f = !strcmp(type, "NFC")    ? NORM_NFC
                 : !strcmp(type, "NFD")  ? NORM_NFD
                 : !strcmp(type, "NFKC") ? NORM_NFKC
                 : !strcmp(type, "NFKD") ? NORM_NFKD
                                         : NORM_NONE;
    if (f == NORM_NONE)
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "tokenizer.json: normalizer type \"%s\" is not supported (supported: "
                            "NFC, NFD, NFKC, NFKD, a Sequence of these, or null)",
                            type);
    t->norms = xrealloc(t->norms, (size_t)(t->n_norms + 1) * sizeof(NormForm));
    t->norms[t->n_norms++] = f;
    return 0;
}

static const char *GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_step(Tokenizer *t, const char *pattern, int literal, SplitBehavior b) {
    SplitStep s = {.behavior = b};
    int rc = tok_regex_compile(pattern, literal, &s.code, &s.jit);
    if (rc < 0) return rc;
    t->steps = xrealloc(t->steps, (size_t)(t->n_steps + 1) * sizeof(SplitStep));
    t->steps[t->n_steps++] = s;
    return 0;
}

static int parse_pre_tokenizer(Tokenizer *t, json_t *p) {
    if (!p || json_is_null(p)) return 0;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: pre_tokenizer has no \"type\"");
    if (t->byte_level)
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "tokenizer.json: pre_tokenizer \"%s\" after ByteLevel is not supported",
                            type);
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers"), *x;
        size_t i;
        if (!json_is_array(arr))
            return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: Sequence pre_tokenizer without list");
        json_array_foreach(arr, i, x) {
            int rc = parse_pre_tokenizer(t, x);
            if (rc < 0) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        t->byte_level = 1;
        t->add_prefix_space = json_flag(p, "add_prefix_space", 0);
        t->bl_level = t->n_steps;
        if (json_flag(p, "use_regex", 1)) return add_step(t, GPT2_PATTERN, 0, SPLIT_INVERT_MATCHES);
        return 0;
    }
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *rx = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        int invert = json_flag(p, "invert", 0);
        if (!rx && !lit)
            return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: Split pattern needs Regex or String");
        SplitBehavior b;
        if (invert) b = SPLIT_INVERT_MATCHES;
        else if (beh && !strcmp(beh, "Removed")) b = lit ? SPLIT_ISOLATED : SPLIT_REMOVED;
        else if (!beh || !strcmp(beh, "Isolated")) b = SPLIT_ISOLATED;
        else
            return cvllm_errorf(CVLLM_EUNSUPPORTED,
                                "tokenizer.json: Split behavior \"%s\" is not supported (supported: "
                                "Isolated, Removed)",
                                beh);
        return add_step(t, rx ? rx : lit, rx == NULL, b);
    }
    return cvllm_errorf(CVLLM_EUNSUPPORTED,
                        "tokenizer.json: pre_tokenizer type \"%s\" is not supported (supported: "
                        "Split, ByteLevel, Sequence)",
                        type);
}

static int32_t get_sym_h(Tokenizer *t, const char *s, size_t len, uint64_t h) {
    int32_t id = strmap_get_h(&t->vocab, s, len, h);
    if (id >= 0) return id;
    strmap_put(&t->vocab, s, len, t->n_syms);
    return t->n_syms++;
}


/* Merges resolve three strings each (left, right, left+right) in a 300K-slot table: almost every
 * lookup is a cache miss, so they go in batches whose slots are prefetched first. */
#define MERGE_BATCH 16

static int parse_merges(Tokenizer *t, const TokJson *tj) {
    mergemap_init(&t->merges, tj->n_merges);
    size_t cap = 4096, used;
    char *cat = xmalloc(cap);
    uint64_t ha[MERGE_BATCH], hb[MERGE_BATCH], hm[MERGE_BATCH];
    size_t off[MERGE_BATCH];
    for (size_t i0 = 0; i0 < tj->n_merges; i0 += MERGE_BATCH) {
        size_t nb = tj->n_merges - i0 < MERGE_BATCH ? tj->n_merges - i0 : MERGE_BATCH;
        used = 0;
        for (size_t k = 0; k < nb; k++) {
            const MergeStr *m = &tj->merges[i0 + k];
            const char *a = tj->m_arena + m->a_off, *b = tj->m_arena + m->b_off;
            if (used + m->a_len + m->b_len > cap) {
                cap = 2 * (used + m->a_len + m->b_len);
                cat = xrealloc(cat, cap);
            }
            off[k] = used;
            memcpy(cat + used, a, m->a_len);
            memcpy(cat + used + m->a_len, b, m->b_len);
            used += m->a_len + m->b_len;
            ha[k] = tok_hash(a, m->a_len);
            hb[k] = tok_hash(b, m->b_len);
            hm[k] = tok_hash(cat + off[k], m->a_len + m->b_len);
            strmap_prefetch(&t->vocab, ha[k]);
            strmap_prefetch(&t->vocab, hb[k]);
            strmap_prefetch(&t->vocab, hm[k]);
        }
        for (size_t k = 0; k < nb; k++) {
            const MergeStr *m = &tj->merges[i0 + k];
            int32_t sa = get_sym_h(t, tj->m_arena + m->a_off, m->a_len, ha[k]);
            int32_t sb = get_sym_h(t, tj->m_arena + m->b_off, m->b_len, hb[k]);
            int32_t sm = get_sym_h(t, cat + off[k], m->a_len + m->b_len, hm[k]);
            mergemap_put(&t->merges, sa, sb, (int32_t)(i0 + k), sm);
        }
    }
    free(cat);
    return 0;
}

static int parse_added(Tokenizer *t, json_t *arr) {
    size_t i;
    json_t *a;
    t->added = xcalloc(json_array_size(arr) + 1, sizeof(AddedTok));
    json_array_foreach(arr, i, a) {
        json_t *content = json_object_get(a, "content"), *id = json_object_get(a, "id");
        if (!json_is_string(content) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (1 << 26))
            return cvllm_errorf(CVLLM_EFORMAT,
                                "tokenizer.json: added_tokens[%zu] needs a string \"content\" and an "
                                "integer \"id\" in [0, 2^26)",
                                i);
        AddedTok *at = &t->added[t->n_added++];
        at->len = json_string_length(content);
        at->content = xmalloc(at->len + 1);
        memcpy(at->content, json_string_value(content), at->len + 1);
        at->id = (int32_t)json_integer_value(id);
        at->special = (uint8_t)json_flag(a, "special", 0);
        at->lstrip = (uint8_t)json_flag(a, "lstrip", 0);
        at->rstrip = (uint8_t)json_flag(a, "rstrip", 0);
        at->single_word = (uint8_t)json_flag(a, "single_word", 0);
        at->normalized = (uint8_t)json_flag(a, "normalized", !at->special);
        if (at->len == 0 || tok_utf8_check(at->content, at->len) != 0)
            return cvllm_errorf(CVLLM_EFORMAT,
                                "tokenizer.json: added_tokens[%zu] content is empty or not UTF-8", i);
    }
    return 0;
}

static int cmp_added_len(const void *x, const void *y, void *ctx) {
    const AddedTok *a = ctx;
    int i = *(const int *)x, j = *(const int *)y;
    return a[j].len != a[i].len ? (a[j].len > a[i].len ? 1 : -1) : i - j;
}

static void matcher_add(AddedMatcher *m, const char *s, int idx) {
    uint8_t b = (uint8_t)s[0];
    m->by_first[b] = xrealloc(m->by_first[b], (size_t)(m->n_by_first[b] + 1) * sizeof(int));
    m->by_first[b][m->n_by_first[b]++] = idx;
}

static int build_added(Tokenizer *t) {
    for (int i = 0; i < t->n_added; i++) {
        AddedTok *a = &t->added[i];
        int32_t old = strmap_get(&t->vocab, a->content, a->len);
        if (old >= 0 && old != a->id && old < t->vocab_size) t->id_verbatim[old] = 1;
        strmap_put(&t->vocab, a->content, a->len, a->id);
        t->id_verbatim[a->id] = 1;
        if (a->special) t->id_special[a->id] = t->id_skip[a->id] = 1;
        strmap_put(&t->added_map, a->content, a->len, i);
        if (a->normalized && t->n_norms) {
            a->ncontent = tok_normalize(t, a->content, a->len, &a->nlen);
            if (!a->ncontent) return CVLLM_EINVAL;
            if (a->nlen == 0) continue;
            strmap_put(&t->added_map, a->ncontent, a->nlen, i);
            matcher_add(&t->match_norm, a->ncontent, i);
            t->has_norm_added = 1;
        } else {
            matcher_add(&t->match_raw, a->content, i);
        }
    }
    for (int b = 0; b < 256; b++) {
        if (t->match_raw.n_by_first[b])
            qsort_r(t->match_raw.by_first[b], (size_t)t->match_raw.n_by_first[b], sizeof(int),
                    cmp_added_len, t->added);
        if (t->match_norm.n_by_first[b])
            qsort_r(t->match_norm.by_first[b], (size_t)t->match_norm.n_by_first[b], sizeof(int),
                    cmp_added_len, t->added);
    }
    return 0;
}

/* Per-id strings and the bytes each id decodes to. */
static void build_id_tables(Tokenizer *t, const uint32_t *id_off) {
    t->id_to_str = xcalloc((size_t)t->vocab_size, sizeof(char *));
    t->id_len = xcalloc((size_t)t->vocab_size, sizeof(uint32_t));
    for (int32_t id = 0; id < t->vocab_size; id++) {
        if (id_off[id] == UINT32_MAX) continue;
        t->id_to_str[id] = t->vocab.arena + id_off[id];
        t->id_len[id] = (uint32_t)strlen(t->id_to_str[id]);
    }
    size_t total = 0;
    for (int32_t id = 0; id < t->vocab_size; id++) total += t->id_len[id];
    t->dec_arena = xmalloc(total + 1);
    t->dec_off = xmalloc(((size_t)t->vocab_size + 1) * sizeof(uint32_t));
    size_t pos = 0;
    for (int32_t id = 0; id < t->vocab_size; id++) {
        t->dec_off[id] = (uint32_t)pos;
        const char *s = t->id_to_str[id];
        if (!s) continue;
        if (!t->decoder_byte_level || t->id_verbatim[id]) {
            memcpy(t->dec_arena + pos, s, t->id_len[id]);
            pos += t->id_len[id];
            continue;
        }
        for (size_t i = 0; i < t->id_len[id];) {
            int n;
            uint32_t cp = tok_utf8_next(s + i, &n);
            int b = tok_cp_to_byte(cp);
            t->dec_arena[pos++] = (char)(b < 0 ? 0 : b); /* tokenizers.js: unknown char -> 0 */
            i += (size_t)n;
        }
    }
    t->dec_off[t->vocab_size] = (uint32_t)pos;
}

static int parse_config(Tokenizer *t, const char *config_json) {
    t->clean_up_spaces = 1;
    if (!config_json) return 0;
    json_t *cfg = cvllm_json_parse(config_json, strlen(config_json), 0, "tokenizer_config.json");
    if (!cfg) return CVLLM_EFORMAT;
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return cvllm_errorf(CVLLM_EFORMAT, "tokenizer_config.json: not a JSON object");
    }
    t->bos_token = config_token(cfg, "bos_token");
    t->eos_token = config_token(cfg, "eos_token");
    t->pad_token = config_token(cfg, "pad_token");
    t->clean_up_spaces = json_flag(cfg, "clean_up_tokenization_spaces", 1);
    json_t *ct = json_object_get(cfg, "chat_template"), *x;
    size_t i;
    if (json_is_string(ct)) t->chat_template = xstrdup(json_string_value(ct));
    else if (json_is_array(ct)) {
        json_array_foreach(ct, i, x) {
            const char *name = json_string_value(json_object_get(x, "name"));
            const char *tpl = json_string_value(json_object_get(x, "template"));
            if (name && tpl && !strcmp(name, "default")) t->chat_template = xstrdup(tpl);
        }
    }
    json_array_foreach(json_object_get(cfg, "additional_special_tokens"), i, x) {
        const char *s = json_string_value(x);
        if (!s && json_is_object(x)) s = json_string_value(json_object_get(x, "content"));
        int32_t id = s ? strmap_get(&t->vocab, s, strlen(s)) : -1;
        if (id >= 0 && id < t->vocab_size) t->id_skip[id] = 1;
    }
    json_decref(cfg);
    return 0;
}

/* ---------------------------------------------------------------- load */

static int load_json(Tokenizer *t, const TokJson *tj) {
    json_t *root = tj->root;
    if (!json_is_object(root)) return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: not an object");
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: missing \"model\" object");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type ? strcmp(type, "BPE") != 0 : !tj->has_merges)
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "tokenizer.json: model type \"%s\" is not supported (only BPE)",
                            type ? type : "(none)");
    if (!tj->has_vocab || !tj->has_merges)
        return cvllm_errorf(CVLLM_EFORMAT,
                            "tokenizer.json: BPE model needs a \"vocab\" object and a \"merges\" list");
    if (json_flag(model, "byte_fallback", 0))
        return cvllm_errorf(CVLLM_EUNSUPPORTED, "tokenizer.json: BPE byte_fallback=true is not supported");
    const char *suffix = json_string_value(json_object_get(model, "end_of_word_suffix"));
    const char *prefix = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    if ((suffix && *suffix) || (prefix && *prefix))
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "tokenizer.json: BPE end_of_word_suffix / continuing_subword_prefix are "
                            "not supported");
    t->ignore_merges = json_flag(model, "ignore_merges", 0);

    int rc;
    if ((rc = parse_normalizer(t, json_object_get(root, "normalizer"))) < 0) return rc;
    if ((rc = parse_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"))) < 0) return rc;
    json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec)) {
        const char *dt = json_string_value(json_object_get(dec, "type"));
        if (!dt || strcmp(dt, "ByteLevel") != 0)
            return cvllm_errorf(CVLLM_EUNSUPPORTED,
                                "tokenizer.json: decoder type \"%s\" is not supported (only ByteLevel "
                                "or null)",
                                dt ? dt : "(none)");
        t->decoder_byte_level = 1;
    }

    /* vocabulary (already in t->vocab, see tok_json.c) */
    int32_t max_id = -1;
    for (size_t i = 0; i < tj->n_vocab; i++)
        if (tj->vocab_id[i] > max_id) max_id = tj->vocab_id[i];
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added))
        return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: \"added_tokens\" is not a list");
    if ((rc = parse_added(t, added)) < 0) return rc;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    t->vocab_size = max_id + 1;
    t->n_syms = t->vocab_size;
    uint32_t *id_off = xmalloc(((size_t)t->vocab_size + 1) * sizeof(uint32_t));
    memset(id_off, 0xff, ((size_t)t->vocab_size + 1) * sizeof(uint32_t));
    for (size_t i = 0; i < tj->n_vocab; i++) id_off[tj->vocab_id[i]] = tj->vocab_off[i];
    t->id_verbatim = xcalloc((size_t)t->vocab_size, 1);
    t->id_skip = xcalloc((size_t)t->vocab_size, 1);
    t->id_special = xcalloc((size_t)t->vocab_size, 1);
    strmap_init(&t->added_map, (size_t)t->n_added * 2 + 4);
    if ((rc = build_added(t)) < 0) {
        free(id_off);
        return rc;
    }
    for (int i = 0; i < t->n_added; i++)
        id_off[t->added[i].id] = strmap_put(&t->vocab, t->added[i].content, t->added[i].len, t->added[i].id);

    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    t->unk_id = unk ? strmap_get(&t->vocab, unk, strlen(unk)) : -1;
    if (t->unk_id >= t->vocab_size) t->unk_id = -1;

    if ((rc = parse_merges(t, tj)) < 0) {
        free(id_off);
        return rc;
    }
    for (int b = 0; b < 256; b++) {
        char buf[4];
        int n = tok_utf8_put(t->byte_level ? g_b2c[b] : (uint32_t)b, buf);
        t->byte_sym[b] = strmap_get(&t->vocab, buf, (size_t)n);
    }
    if (t->ignore_merges && t->byte_level) {
        strmap_init(&t->raw_vocab, tj->n_vocab);
        char *buf = xmalloc(4096);
        for (int32_t id = 0; id < t->vocab_size; id++) {
            if (id_off[id] == UINT32_MAX) continue;
            const char *s = t->vocab.arena + id_off[id];
            size_t n = 0, ok = 1;
            for (size_t i = 0; s[i] && ok && n < 4096;) {
                int k, b = tok_cp_to_byte(tok_utf8_next(s + i, &k));
                if (b < 0) ok = 0;
                buf[n++] = (char)b;
                i += (size_t)k;
            }
            if (ok && n < 4096) strmap_put(&t->raw_vocab, buf, n, id);
        }
        free(buf);
    }
    build_id_tables(t, id_off);
    free(id_off);
    return 0;
}

int tokenizer_load_from_strings(const char *tokenizer_json, size_t len, const char *config_json,
                                Tokenizer **out) {
    *out = NULL;
    byte_map_init();
    Tokenizer *t = xcalloc(1, sizeof(Tokenizer));
    t->unk_id = -1;
    TokJson tj;
    int rc = tok_json_parse(tokenizer_json, len, t, &tj);
    if (rc >= 0) rc = load_json(t, &tj);
    tok_json_free(&tj);
    if (rc >= 0) rc = parse_config(t, config_json);
    if (rc < 0) {
        tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* Reads dir/name if it exists (*text = NULL if not); 0 or a negative code with the message set. */
static int read_optional(const char *dir, const char *name, size_t max_bytes, char **text) {
    char *path = path_join(dir, name);
    size_t len = 0;
    int rc = path_probe(path);
    *text = NULL;
    if (rc > 0 && !(*text = file_read(path, max_bytes, &len))) rc = CVLLM_EIO;
    if (*text && strlen(*text) != len) { /* kept as a C string: a NUL would cut it silently */
        rc = cvllm_errorf(CVLLM_EFORMAT, "%s: contains a NUL character", path);
        free(*text);
        *text = NULL;
    }
    free(path);
    return rc < 0 ? rc : 0;
}

/* Messages name the folder once: "DIR/tokenizer.json: ..." for reading, "DIR: tokenizer.json: ..."
 * for the contents. */
int tokenizer_load(const char *dir, Tokenizer **out) {
    *out = NULL;
    char *path = path_join(dir, "tokenizer.json");
    size_t len;
    char *json = file_read(path, FILE_MAX_TOKENIZER, &len);
    free(path);
    if (!json) return CVLLM_EIO;
    char *cfg = NULL;
    int rc = read_optional(dir, "tokenizer_config.json", FILE_MAX_TOKENIZER_CONFIG, &cfg);
    if (rc == 0) {
        rc = tokenizer_load_from_strings(json, len, cfg, out);
        if (rc < 0) cvllm_error_wrap(rc, "%s", dir);
    }
    free(json);
    free(cfg);
    if (rc < 0) return rc;
    /* transformers 5 saves the template beside the config, in chat_template.jinja */
    if (!(*out)->chat_template) {
        rc = read_optional(dir, "chat_template.jinja", FILE_MAX_TOKENIZER_CONFIG, &(*out)->chat_template);
        if (rc < 0) {
            tokenizer_free(*out);
            *out = NULL;
            return rc;
        }
    }
    return 0;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    strmap_free(&t->vocab);
    strmap_free(&t->raw_vocab);
    strmap_free(&t->added_map);
    free(t->merges.slots);
    free(t->id_to_str);
    free(t->id_len);
    for (int i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].code);
    free(t->steps);
    free(t->norms);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].ncontent);
    }
    free(t->added);
    for (int b = 0; b < 256; b++) {
        free(t->match_raw.by_first[b]);
        free(t->match_norm.by_first[b]);
    }
    free(t->id_verbatim);
    free(t->id_skip);
    free(t->id_special);
    free(t->dec_arena);
    free(t->dec_off);
    free(t->chat_template);
    free(t->bos_token);
    free(t->eos_token);
    free(t->pad_token);
    free(t);
}

/* ---------------------------------------------------------------- accessors */

int tokenizer_vocab_size(const Tokenizer *t) { return t->vocab_size; }

const char *tokenizer_id_to_token(const Tokenizer *t, int32_t id) {
    return id >= 0 && id < t->vocab_size ? t->id_to_str[id] : NULL;
}

int32_t tokenizer_token_to_id(const Tokenizer *t, const char *token) {
    int32_t id = strmap_get(&t->vocab, token, strlen(token));
    return id < t->vocab_size ? id : -1;
}

int tokenizer_is_special(const Tokenizer *t, int32_t id) {
    return id >= 0 && id < t->vocab_size && t->id_special[id];
}

const char *tokenizer_chat_template(const Tokenizer *t) { return t->chat_template; }
const char *tokenizer_bos_token(const Tokenizer *t) { return t->bos_token; }
const char *tokenizer_eos_token(const Tokenizer *t) { return t->eos_token; }
const char *tokenizer_pad_token(const Tokenizer *t) { return t->pad_token; }

int32_t tokenizer_eos_id(const Tokenizer *t) {
    return t->eos_token ? tokenizer_token_to_id(t, t->eos_token) : -1;
}

int32_t tokenizer_bos_id(const Tokenizer *t) {
    return t->bos_token ? tokenizer_token_to_id(t, t->bos_token) : -1;
}
