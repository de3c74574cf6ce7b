/* tok_json.c: a fast path for the two big parts of tokenizer.json.
 *
 * jansson needs ~500 ms for Qwen3's 11 MB tokenizer.json (one malloc'd json_t per vocab entry and
 * merge). This scanner walks the top level and the "model" object itself, parses model.vocab
 * straight into the Tokenizer's hash table and model.merges into a compact list, and hands every
 * other (small) value to jansson, so the rest of the loader still works on a json_t tree.
 * Malformed JSON gives CVLLM_EFORMAT with the line and column. */
#include <string.h>

#include "common.h"
#include "tokenizer/tok_internal.h"

typedef struct {
    const char *s, *p, *end;
    char *buf; /* decoded string scratch */
    size_t cap;
} Scan;

static int scan_error(Scan *sc, const char *what) {
    size_t line = 1, col = 1;
    for (const char *q = sc->s; q < sc->p && q < sc->end; q++) {
        if (*q == '\n') line++, col = 1;
        else col++;
    }
    return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: invalid JSON at line %zu column %zu: %s", line,
                        col, what);
}

static void skip_ws(Scan *sc) {
    while (sc->p < sc->end && (*sc->p == ' ' || *sc->p == '\n' || *sc->p == '\r' || *sc->p == '\t'))
        sc->p++;
}

static int hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

/* Parses a JSON string at sc->p into sc->buf (NUL-terminated); returns its length or < 0. */
static long scan_string(Scan *sc) {
    if (sc->p >= sc->end || *sc->p != '"') return scan_error(sc, "expected a string");
    sc->p++;
    size_t n = 0;
    for (;;) {
        const char *q = sc->p;
        while (q < sc->end && *q != '"' && *q != '\\' && (uint8_t)*q >= 0x20) q++;
        size_t run = (size_t)(q - sc->p);
        if (n + run + 8 > sc->cap) {
            sc->cap = 2 * (n + run + 8);
            sc->buf = xrealloc(sc->buf, sc->cap);
        }
        memcpy(sc->buf + n, sc->p, run);
        n += run;
        sc->p = q;
        if (q >= sc->end) return scan_error(sc, "unterminated string");
        if (*q == '"') {
            sc->p++;
            break;
        }
        if ((uint8_t)*q < 0x20) return scan_error(sc, "control character in string");
        if (q + 1 >= sc->end) return scan_error(sc, "unterminated escape");
        char e = q[1];
        sc->p = q + 2;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            sc->buf[n++] = map[simple - "\"\\/bfnrt"];
            continue;
        }
        uint32_t cp, lo;
        if (e != 'u' || sc->p + 4 > sc->end || hex4(sc->p, &cp) < 0) return scan_error(sc, "bad escape");
        sc->p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (sc->p + 6 > sc->end || sc->p[0] != '\\' || sc->p[1] != 'u' || hex4(sc->p + 2, &lo) < 0 ||
                lo < 0xDC00 || lo > 0xDFFF)
                return scan_error(sc, "lone surrogate in \\u escape");
            sc->p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return scan_error(sc, "lone surrogate in \\u escape");
        }
        n += (size_t)tok_utf8_put(cp, sc->buf + n);
    }
    sc->buf[n] = 0;
    if (tok_utf8_check(sc->buf, n) != 0) return scan_error(sc, "string is not valid UTF-8");
    return (long)n;
}

/* Skips any JSON value (validated loosely: jansson re-parses the ones we keep). */
static int skip_value(Scan *sc) {
    int depth = 0;
    do {
        skip_ws(sc);
        if (sc->p >= sc->end) return scan_error(sc, "unexpected end of input");
        char c = *sc->p;
        if (c == '"') {
            if (scan_string(sc) < 0) return CVLLM_EFORMAT;
        } else if (c == '{' || c == '[') {
            depth++;
            sc->p++;
        } else if (c == '}' || c == ']') {
            if (--depth < 0) return scan_error(sc, "unbalanced bracket");
            sc->p++;
        } else if (c == ',' || c == ':') {
            sc->p++;
        } else {
            const char *q = sc->p;
            while (q < sc->end && strchr("-+.0123456789eEtruefalsn", *q)) q++;
            if (q == sc->p) return scan_error(sc, "unexpected character");
            sc->p = q;
        }
        skip_ws(sc);
    } while (depth > 0);
    return 0;
}

/* Iterates the members of an object: calls fn(key, keylen) with sc->p at the value; fn must
 * consume the value. */
typedef int (*MemberFn)(Scan *sc, const char *key, size_t klen, void *arg);

static int scan_object(Scan *sc, MemberFn fn, void *arg) {
    skip_ws(sc);
    if (sc->p >= sc->end || *sc->p != '{') return scan_error(sc, "expected an object");
    sc->p++;
    skip_ws(sc);
    if (sc->p < sc->end && *sc->p == '}') {
        sc->p++;
        return 0;
    }
    for (;;) {
        skip_ws(sc);
        long kl = scan_string(sc);
        if (kl < 0) return (int)kl;
        char *key = xmalloc((size_t)kl + 1);
        memcpy(key, sc->buf, (size_t)kl + 1);
        skip_ws(sc);
        if (sc->p >= sc->end || *sc->p != ':') {
            free(key);
            return scan_error(sc, "expected ':'");
        }
        sc->p++;
        skip_ws(sc);
        int rc = fn(sc, key, (size_t)kl, arg);
        free(key);
        if (rc < 0) return rc;
        skip_ws(sc);
        if (sc->p < sc->end && *sc->p == ',') {
            sc->p++;
            continue;
        }
        if (sc->p < sc->end && *sc->p == '}') {
            sc->p++;
            return 0;
        }
        return scan_error(sc, "expected ',' or '}'");
    }
}

/* Parses the value at sc->p with jansson and stores it as obj[key]. */
static int keep_value(Scan *sc, json_t *obj, const char *key) {
    const char *start = sc->p;
    int rc = skip_value(sc);
    if (rc < 0) return rc;
    json_error_t err;
    json_t *v = json_loadb(start, (size_t)(sc->p - start), JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!v && json_error_code(&err) == json_error_numeric_overflow) { /* valid JSON: name the field */
        char what[300];
        snprintf(what, sizeof what, "tokenizer.json: %.200s", key);
        json_decref(cvllm_json_parse(start, (size_t)(sc->p - start), JSON_DECODE_ANY | JSON_ALLOW_NUL, what));
        return CVLLM_EFORMAT;
    }
    if (!v) {
        sc->p = start + (err.position > 0 ? err.position : 0);
        return scan_error(sc, err.text);
    }
    json_object_set_new(obj, key, v);
    return 0;
}

typedef struct {
    TokJson *out;
    Tokenizer *t;
} Ctx;

static int vocab_member(Scan *sc, const char *key, size_t klen, void *arg) {
    Ctx *c = arg;
    const char *q = sc->p;
    int neg = q < sc->end && *q == '-';
    if (neg) q++;
    int64_t v = 0;
    const char *d0 = q;
    while (q < sc->end && *q >= '0' && *q <= '9' && v < (1 << 30)) v = v * 10 + (*q++ - '0');
    if (q == d0 || neg || v >= (1 << 26) || (q < sc->end && strchr(".eE0123456789", *q)))
        return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: vocab entry \"%s\" has a bad id", key);
    sc->p = q;
    TokJson *o = c->out;
    uint32_t off = strmap_put(&c->t->vocab, key, klen, (int32_t)v);
    DA_PUSH(o->vocab_off, o->n_vocab, o->cap_vocab, off);
    DA_PUSH(o->vocab_id, o->n_vocab_id, o->cap_vocab_id, (int32_t)v);
    return 0;
}

static void merge_push(TokJson *o, const char *a, size_t la, const char *b, size_t lb) {
    if (o->m_len + la + lb + 2 > o->m_cap) {
        o->m_cap = 2 * (o->m_len + la + lb + 2) + 4096;
        o->m_arena = xrealloc(o->m_arena, o->m_cap);
    }
    MergeStr m = {(uint32_t)o->m_len, (uint32_t)la, (uint32_t)(o->m_len + la + 1), (uint32_t)lb};
    memcpy(o->m_arena + o->m_len, a, la);
    o->m_arena[o->m_len + la] = 0;
    memcpy(o->m_arena + o->m_len + la + 1, b, lb);
    o->m_arena[o->m_len + la + 1 + lb] = 0;
    o->m_len += la + lb + 2;
    DA_PUSH(o->merges, o->n_merges, o->cap_merges, m);
}

static int scan_merges(Scan *sc, TokJson *o) {
    skip_ws(sc);
    if (sc->p >= sc->end || *sc->p != '[') return scan_error(sc, "\"merges\" is not a list");
    sc->p++;
    skip_ws(sc);
    if (sc->p < sc->end && *sc->p == ']') {
        sc->p++;
        return 0;
    }
    char *first = NULL;
    size_t cap_first = 0;
    for (size_t i = 0;; i++) {
        skip_ws(sc);
        if (sc->p < sc->end && *sc->p == '"') { /* "a b": split(" ", 2) as tokenizers.js does */
            long n = scan_string(sc);
            if (n < 0) return (int)n;
            char *sp = memchr(sc->buf, ' ', (size_t)n);
            if (!sp) return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: merge %zu \"%s\" has no space", i, sc->buf);
            char *b = sp + 1, *sp2 = memchr(b, ' ', (size_t)(sc->buf + n - b));
            merge_push(o, sc->buf, (size_t)(sp - sc->buf), b, sp2 ? (size_t)(sp2 - b) : (size_t)(sc->buf + n - b));
        } else if (sc->p < sc->end && *sc->p == '[') { /* ["a", "b"] */
            sc->p++;
            skip_ws(sc);
            long la = scan_string(sc);
            if (la < 0) return (int)la;
            if ((size_t)la + 1 > cap_first) first = xrealloc(first, cap_first = (size_t)la + 1);
            memcpy(first, sc->buf, (size_t)la + 1);
            skip_ws(sc);
            if (sc->p >= sc->end || *sc->p != ',') {
                free(first);
                return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: merge %zu is not a pair of strings", i);
            }
            sc->p++;
            skip_ws(sc);
            long lb = scan_string(sc);
            skip_ws(sc);
            if (lb < 0 || sc->p >= sc->end || *sc->p != ']') {
                free(first);
                return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: merge %zu is not a pair of strings", i);
            }
            sc->p++;
            merge_push(o, first, (size_t)la, sc->buf, (size_t)lb);
        } else {
            free(first);
            return cvllm_errorf(CVLLM_EFORMAT, "tokenizer.json: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", i);
        }
        skip_ws(sc);
        if (sc->p < sc->end && *sc->p == ',') {
            sc->p++;
            continue;
        }
        free(first);
        if (sc->p < sc->end && *sc->p == ']') {
            sc->p++;
            return 0;
        }
        return scan_error(sc, "expected ',' or ']' in merges");
    }
}

static int model_member(Scan *sc, const char *key, size_t klen, void *arg) {
    Ctx *c = arg;
    if (!strcmp(key, "vocab") && sc->p < sc->end && *sc->p == '{') {
        c->out->has_vocab = 1;
        return scan_object(sc, vocab_member, c);
    }
    if (!strcmp(key, "merges") && sc->p < sc->end && *sc->p == '[') {
        c->out->has_merges = 1;
        return scan_merges(sc, c->out);
    }
    return keep_value(sc, json_object_get(c->out->root, "model"), key);
}

static int root_member(Scan *sc, const char *key, size_t klen, void *arg) {
    Ctx *c = arg;
    if (!strcmp(key, "model") && sc->p < sc->end && *sc->p == '{') {
        json_object_set_new(c->out->root, "model", json_object());
        return scan_object(sc, model_member, c);
    }
    return keep_value(sc, c->out->root, key);
}

int tok_json_parse(const char *s, size_t len, Tokenizer *t, TokJson *out) {
    memset(out, 0, sizeof(*out));
    out->root = json_object();
    strmap_init(&t->vocab, len / 48 + 1024);
    Scan sc = {.s = s, .p = s, .end = s + len};
    Ctx c = {out, t};
    int rc = scan_object(&sc, root_member, &c);
    if (rc >= 0) {
        skip_ws(&sc);
        if (sc.p != sc.end) rc = scan_error(&sc, "text after the top-level object");
    }
    free(sc.buf);
    return rc;
}

void tok_json_free(TokJson *j) {
    json_decref(j->root);
    free(j->vocab_off);
    free(j->vocab_id);
    free(j->merges);
    free(j->m_arena);
    memset(j, 0, sizeof(*j));
}
