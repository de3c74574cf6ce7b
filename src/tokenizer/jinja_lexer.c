/* jinja_lexer.c: template source -> tokens, a port of @huggingface/jinja's lexer.ts.
 *
 * HF first rewrites the source with regexes (drop one trailing newline; lstrip_blocks: spaces and
 * tabs before "{%", "{#" or "{-" at a line start; trim_blocks: the newline after "%}", "#}" or
 * "-}"; remove transformers' {% generation %} tags), then scans it. We do the same rewrites but
 * keep, for every byte that survives, its offset in the original source so that error messages
 * can say line:column. Whitespace is JavaScript's \s (ASCII plus the Unicode spaces). */
#include <string.h>

#include "common.h"
#include "tokenizer/jinja.h"

typedef struct {
    char *s;
    size_t *map; /* map[i]: offset in the original source of s[i] */
    size_t n;
} PBuf;

static PBuf pbuf_new(JArena *a, size_t cap) {
    PBuf p = {jarena_alloc(a, cap + 1), jarena_alloc(a, (cap + 1) * sizeof(size_t)), 0};
    return p;
}
static void pbuf_push(PBuf *p, const PBuf *in, size_t i) {
    p->s[p->n] = in->s[i];
    p->map[p->n++] = in->map[i];
}

static int is_line_start(const PBuf *p, size_t i) {
    if (i == 0) return 1;
    char c = p->s[i - 1];
    if (c == '\n' || c == '\r') return 1;
    /* U+2028 / U+2029 (E2 80 A8 / E2 80 A9) are line terminators for JS's ^ in multiline mode */
    return i >= 3 && (unsigned char)p->s[i - 3] == 0xE2 && (unsigned char)p->s[i - 2] == 0x80 &&
           ((unsigned char)c == 0xA8 || (unsigned char)c == 0xA9);
}

/* template.replace(/^[ \t]*({[#%-])/gm, "$1") */
static PBuf lstrip_blocks(JArena *a, const PBuf *in) {
    PBuf o = pbuf_new(a, in->n);
    size_t i = 0;
    while (i < in->n) {
        if (is_line_start(in, i)) {
            size_t j = i;
            while (j < in->n && (in->s[j] == ' ' || in->s[j] == '\t')) j++;
            if (j + 1 < in->n && in->s[j] == '{' && strchr("#%-", in->s[j + 1]) && in->s[j + 1]) {
                pbuf_push(&o, in, j);
                pbuf_push(&o, in, j + 1);
                i = j + 2;
                continue;
            }
        }
        pbuf_push(&o, in, i++);
    }
    return o;
}

/* template.replace(/([#%-]})\n/g, "$1") */
static PBuf trim_blocks(JArena *a, const PBuf *in) {
    PBuf o = pbuf_new(a, in->n);
    size_t i = 0;
    while (i < in->n) {
        if (i + 2 < in->n && in->s[i] && strchr("#%-", in->s[i]) && in->s[i + 1] == '}' &&
            in->s[i + 2] == '\n') {
            pbuf_push(&o, in, i);
            pbuf_push(&o, in, i + 1);
            i += 3;
            continue;
        }
        pbuf_push(&o, in, i++);
    }
    return o;
}

static size_t skip_ws(const PBuf *p, size_t i) {
    size_t k;
    while (i < p->n && (k = js_space_len(p->s, p->n, i)) > 0) i += k;
    return i;
}

/* Matches "{%" -? \s* (end)?generation \s* -? "%}" at i; returns the end or 0. */
static size_t match_generation(const PBuf *p, size_t i, int *lstrip, int *rstrip) {
    if (i + 2 > p->n || p->s[i] != '{' || p->s[i + 1] != '%') return 0;
    size_t j = i + 2;
    *lstrip = j < p->n && p->s[j] == '-';
    if (*lstrip) j++;
    j = skip_ws(p, j);
    if (j + 3 <= p->n && memcmp(p->s + j, "end", 3) == 0 &&
        !(j + 10 <= p->n && memcmp(p->s + j, "generation", 10) == 0))
        j += 3;
    if (!(j + 10 <= p->n && memcmp(p->s + j, "generation", 10) == 0)) return 0;
    j = skip_ws(p, j + 10);
    *rstrip = j < p->n && p->s[j] == '-';
    if (*rstrip) j++;
    if (!(j + 2 <= p->n && p->s[j] == '%' && p->s[j + 1] == '}')) return 0;
    return j + 2;
}

/* template.replace(/(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs,
 *                  (_, before, l, r, after) => (l ? "" : before) + (r ? "" : after)) */
static PBuf strip_generation(JArena *a, const PBuf *in) {
    PBuf o = pbuf_new(a, in->n);
    size_t i = 0, guard = 0; /* output offset where the last match ended */
    while (i < in->n) {
        int l, r;
        size_t end = match_generation(in, i, &l, &r);
        if (!end) {
            pbuf_push(&o, in, i++);
            continue;
        }
        if (l) { /* drop the whitespace run before the tag (not before the last match) */
            size_t k;
            while (o.n > guard && (k = js_space_len_before(o.s, o.n)) > 0 && o.n - k >= guard)
                o.n -= k;
        }
        size_t after = skip_ws(in, end);
        if (!r)
            for (size_t k = end; k < after; k++) pbuf_push(&o, in, k);
        i = after;
        guard = o.n;
    }
    return o;
}

const char *jinja_token_name(JTokType t) {
    static const char *names[] = {
        "text", "number", "string", "identifier", "'='", "'('", "')'", "'{%'", "'%}'", "'{{'",
        "'}}'", "'['", "']'", "'{'", "'}'", "','", "'.'", "':'", "'|'", "additive operator",
        "multiplicative operator", "'**'", "comparison operator", "unary operator", "comment"};
    return names[t];
}

typedef struct {
    JCtx *c;
    PBuf p;
    size_t i;
    JToken *v;
    size_t n, cap;
} Lexer;

static void push_tok(Lexer *L, JTokType t, const char *s, size_t n, size_t at) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 64;
        JToken *v = jarena_alloc(L->c->arena, cap * sizeof(JToken));
        if (L->n) memcpy(v, L->v, L->n * sizeof(JToken));
        L->v = v;
        L->cap = cap;
    }
    size_t pos = at < L->p.n ? L->p.map[at] : (L->p.n ? L->p.map[L->p.n - 1] + 1 : 0);
    L->v[L->n++] = (JToken){t, {s, n}, pos};
}

static size_t here(const Lexer *L) {
    return L->i < L->p.n ? L->p.map[L->i] : (L->p.n ? L->p.map[L->p.n - 1] + 1 : 0);
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static int is_word(char ch) {
    return is_digit(ch) || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
}

static int hexval(char ch) {
    if (is_digit(ch)) return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static void put_utf8(JBuf *b, uint32_t cp) {
    char t[4];
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* a lone surrogate prints as U+FFFD */
    if (cp < 0x80) {
        jbuf_putc(b, (char)cp);
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 0x3F));
        jbuf_put(b, t, 2);
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F));
        jbuf_put(b, t, 3);
    } else {
        t[0] = (char)(0xF0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[3] = (char)(0x80 | (cp & 0x3F));
        jbuf_put(b, t, 4);
    }
}

/* A quoted string literal: escapes \n \t \r \b \f \v \' \" \\ \xHH \uHHHH (a \u surrogate pair
 * makes one character). */
static void lex_string(Lexer *L) {
    size_t start_i = L->i, start = here(L);
    char q = L->p.s[L->i++];
    JBuf b;
    jbuf_init(&b, L->c);
    uint32_t pending_hi = 0;
    for (;;) {
        if (L->i >= L->p.n) jinja_fail(L->c, CVLLM_EFORMAT, start, "unterminated string literal");
        char ch = L->p.s[L->i];
        if (ch == q) break;
        uint32_t unit = 0;
        int is_unit = 0;
        if (ch == '\\') {
            size_t at = here(L);
            if (++L->i >= L->p.n) jinja_fail(L->c, CVLLM_EFORMAT, at, "unterminated string literal");
            char e = L->p.s[L->i++];
            if (e == 'x' || e == 'u') {
                int len = e == 'x' ? 2 : 4;
                for (int k = 0; k < len; k++) {
                    int h = L->i + k < L->p.n ? hexval(L->p.s[L->i + k]) : -1;
                    if (h < 0) jinja_fail(L->c, CVLLM_EFORMAT, at, "invalid \\%c escape", e);
                    unit = unit * 16 + (uint32_t)h;
                }
                L->i += (size_t)len;
                is_unit = 1;
            } else {
                const char *from = "ntrbfv'\"\\", *to = "\n\t\r\b\f\v'\"\\";
                const char *f = strchr(from, e);
                if (!f || !e) jinja_fail(L->c, CVLLM_EFORMAT, at, "unexpected escaped character '%c'", e);
                if (pending_hi) { put_utf8(&b, pending_hi); pending_hi = 0; }
                jbuf_putc(&b, to[f - from]);
            }
        } else {
            if (pending_hi) { put_utf8(&b, pending_hi); pending_hi = 0; }
            jbuf_putc(&b, ch);
            L->i++;
        }
        if (is_unit) {
            if (pending_hi && unit >= 0xDC00 && unit <= 0xDFFF) {
                put_utf8(&b, 0x10000 + ((pending_hi - 0xD800) << 10) + (unit - 0xDC00));
                pending_hi = 0;
            } else {
                if (pending_hi) put_utf8(&b, pending_hi);
                pending_hi = 0;
                if (unit >= 0xD800 && unit <= 0xDBFF) pending_hi = unit;
                else put_utf8(&b, unit);
            }
        }
    }
    if (pending_hi) put_utf8(&b, pending_hi);
    L->i++; /* closing quote */
    push_tok(L, T_STR, b.s, b.n, start_i);
}

/* Consumes digits; HF fails when a token runs into the end of the input. */
static void consume_digits(Lexer *L) {
    while (L->i < L->p.n && is_digit(L->p.s[L->i])) {
        L->i++;
        if (L->i >= L->p.n) jinja_fail(L->c, CVLLM_EFORMAT, here(L), "unexpected end of template");
    }
}

static void strip_trailing_ws(Lexer *L) {
    if (L->n == 0 || L->v[L->n - 1].type != T_TEXT) return;
    JToken *t = &L->v[L->n - 1];
    t->val = js_trim(t->val, 0, 1);
    if (t->val.n == 0) L->n--;
}

static const struct { const char *seq; JTokType type; } TABLE[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR},
    {"(", T_LPAREN}, {")", T_RPAREN}, {"{", T_LBRACE}, {"}", T_RBRACE}, {"[", T_LBRACKET},
    {"]", T_RBRACKET}, {",", T_COMMA}, {".", T_DOT}, {":", T_COLON}, {"|", T_PIPE},
    {"<=", T_CMP}, {">=", T_CMP}, {"==", T_CMP}, {"!=", T_CMP}, {"<", T_CMP}, {">", T_CMP},
    {"+", T_ADD}, {"-", T_ADD}, {"~", T_ADD}, {"**", T_POW}, {"*", T_MUL}, {"//", T_MUL},
    {"/", T_MUL}, {"%", T_MUL}, {"=", T_EQUALS},
};

static int at_seq(const Lexer *L, const char *seq) {
    size_t k = strlen(seq);
    return L->i + k <= L->p.n && memcmp(L->p.s + L->i, seq, k) == 0;
}

void jinja_tokenize(JCtx *c, const char *src, size_t n, JToken **out, size_t *count) {
    JArena *a = c->arena;
    PBuf p0 = pbuf_new(a, n);
    memcpy(p0.s, src, n);
    for (size_t i = 0; i < n; i++) p0.map[i] = i;
    p0.n = n;
    if (p0.n > 0 && p0.s[p0.n - 1] == '\n') p0.n--;
    PBuf p1 = lstrip_blocks(a, &p0);
    PBuf p2 = trim_blocks(a, &p1);
    Lexer L = {c, strip_generation(a, &p2), 0, NULL, 0, 0};
    const char *s = L.p.s;
    size_t len = L.p.n;
    int curly = 0;

    while (L.i < len) {
        JTokType last = L.n ? L.v[L.n - 1].type : T_CLOSE_STMT;
        if (L.n == 0 || last == T_CLOSE_STMT || last == T_CLOSE_EXPR || last == T_COMMENT) {
            size_t st = L.i;
            while (L.i < len && !(s[L.i] == '{' && L.i + 1 < len &&
                                  (s[L.i + 1] == '%' || s[L.i + 1] == '{' || s[L.i + 1] == '#')))
                L.i++;
            if (L.i > st) {
                push_tok(&L, T_TEXT, s + st, L.i - st, st);
                continue;
            }
        }
        if (at_seq(&L, "{#")) {
            size_t st = L.i;
            L.i += 2;
            int strip_before = L.i < len && s[L.i] == '-';
            if (strip_before) L.i++;
            size_t cs = L.i;
            while (!(L.i + 1 < len && s[L.i] == '#' && s[L.i + 1] == '}')) {
                if (L.i + 2 >= len) jinja_fail(c, CVLLM_EFORMAT, L.p.map[st], "unclosed comment {# ... #}");
                L.i++;
            }
            size_t ce = L.i;
            int strip_after = ce > cs && s[ce - 1] == '-';
            if (strip_before) strip_trailing_ws(&L);
            push_tok(&L, T_COMMENT, s + cs, ce - cs - (size_t)strip_after, st);
            L.i += 2;
            if (strip_after) L.i = skip_ws(&L.p, L.i);
            continue;
        }
        if (at_seq(&L, "{%-")) {
            strip_trailing_ws(&L);
            push_tok(&L, T_OPEN_STMT, "{%", 2, L.i);
            L.i += 3;
            continue;
        }
        if (at_seq(&L, "{{-")) {
            strip_trailing_ws(&L);
            push_tok(&L, T_OPEN_EXPR, "{{", 2, L.i);
            curly = 0;
            L.i += 3;
            continue;
        }
        /* whitespace inside tags */
        while (L.i < len) {
            size_t k = js_space_len(s, len, L.i);
            if (!k) break;
            L.i += k;
            if (L.i >= len) jinja_fail(c, CVLLM_EFORMAT, here(&L), "unexpected end of template");
        }
        if (at_seq(&L, "-%}")) {
            push_tok(&L, T_CLOSE_STMT, "%}", 2, L.i);
            L.i = skip_ws(&L.p, L.i + 3);
            continue;
        }
        if (at_seq(&L, "-}}")) {
            push_tok(&L, T_CLOSE_EXPR, "}}", 2, L.i);
            L.i = skip_ws(&L.p, L.i + 3);
            continue;
        }
        if (L.i >= len) jinja_fail(c, CVLLM_EFORMAT, here(&L), "unexpected end of template");
        char ch = s[L.i];
        if (ch == '-' || ch == '+') {
            JTokType lt = L.v[L.n - 1].type; /* L.n > 0 here: text mode ran first */
            if (lt == T_TEXT) jinja_fail(c, CVLLM_EFORMAT, here(&L), "unexpected character '%c'", ch);
            if (!(lt == T_IDENT || lt == T_NUM || lt == T_STR || lt == T_RPAREN || lt == T_RBRACKET)) {
                size_t st = L.i++;
                size_t ds = L.i;
                consume_digits(&L);
                int has_num = L.i > ds;
                if (has_num && L.i + 1 < len && s[L.i] == '.' && is_digit(s[L.i + 1])) {
                    L.i++;
                    consume_digits(&L);
                }
                push_tok(&L, has_num ? T_NUM : T_UNARY, s + st, has_num ? L.i - st : 1, st);
                continue;
            }
        }
        int matched = 0;
        for (size_t k = 0; k < sizeof(TABLE) / sizeof(TABLE[0]); k++) {
            if (TABLE[k].type == T_CLOSE_EXPR && curly > 0) continue;
            if (!at_seq(&L, TABLE[k].seq)) continue;
            size_t sl = strlen(TABLE[k].seq);
            push_tok(&L, TABLE[k].type, s + L.i, sl, L.i);
            if (TABLE[k].type == T_OPEN_EXPR) curly = 0;
            else if (TABLE[k].type == T_LBRACE) curly++;
            else if (TABLE[k].type == T_RBRACE) curly--;
            L.i += sl;
            matched = 1;
            break;
        }
        if (matched) continue;
        if (ch == '\'' || ch == '"') {
            lex_string(&L);
            continue;
        }
        if (is_digit(ch)) {
            size_t st = L.i;
            consume_digits(&L);
            if (L.v[L.n - 1].type != T_DOT && L.i + 1 < len && s[L.i] == '.' && is_digit(s[L.i + 1])) {
                L.i++;
                consume_digits(&L);
            }
            push_tok(&L, T_NUM, s + st, L.i - st, st);
            continue;
        }
        if (is_word(ch)) {
            size_t st = L.i;
            while (L.i < len && is_word(s[L.i])) {
                L.i++;
                if (L.i >= len) jinja_fail(c, CVLLM_EFORMAT, here(&L), "unexpected end of template");
            }
            push_tok(&L, T_IDENT, s + st, L.i - st, st);
            continue;
        }
        if ((unsigned char)ch >= 0x80 || ch < 0x20)
            jinja_fail(c, CVLLM_EFORMAT, here(&L), "unexpected character (byte 0x%02x)", (unsigned char)ch);
        jinja_fail(c, CVLLM_EFORMAT, here(&L), "unexpected character '%c'", ch);
    }
    *out = L.v;
    *count = L.n;
}
