/* jinja_value.c: the arena, error unwinding, buffers, and the value type of the Jinja engine, with
 * the JavaScript behaviour @huggingface/jinja inherits: Number::toString for printing numbers,
 * FloatValue's "1.0" rule, JSON.stringify escaping for tojson, JS loose (==) and strict (===)
 * equality, JS whitespace (\s, trim) and UTF-16 lengths. */
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <utf8proc.h>

#include "common.h"
#include "tokenizer/jinja.h"

/* ---- arena ---- */

struct JArenaBlock {
    JArenaBlock *next;
    size_t used, cap;
    max_align_t data[];
};

void *jarena_alloc(JArena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->used + n > a->head->cap) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        if (a->limit && a->total + cap > a->limit && a->ctx)
            jinja_fail(a->ctx, CVLLM_ENOMEM, JINJA_NOPOS, "template used more than %zu bytes of memory",
                       a->limit);
        JArenaBlock *b = xmalloc(sizeof(JArenaBlock) + cap);
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
        a->total += cap;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

char *jarena_strndup(JArena *a, const char *s, size_t n) {
    char *p = jarena_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    return p;
}

void jarena_free(JArena *a) {
    JArenaBlock *b = a->head;
    while (b) {
        JArenaBlock *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->total = 0;
}

void jinja_fail(JCtx *c, int code, size_t pos, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos != JINJA_NOPOS && c->src) {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < pos && i < c->src_len; i++) {
            if (c->src[i] == '\n') line++, col = 1;
            else col++;
        }
        cvllm_errorf(code, "chat template, line %zu, column %zu: %s", line, col, msg);
    } else {
        cvllm_errorf(code, "chat template: %s", msg);
    }
    longjmp(c->jb, code);
}

/* ---- buffers ---- */

void jbuf_init(JBuf *b, JCtx *c) {
    b->c = c;
    b->cap = 64;
    b->n = 0;
    b->s = jarena_alloc(c->arena, b->cap);
}

void jbuf_put(JBuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        if (b->c->max_output && b->n + n > b->c->max_output)
            jinja_fail(b->c, CVLLM_ENOMEM, JINJA_NOPOS, "output longer than %zu bytes", b->c->max_output);
        size_t cap = b->cap * 2;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = jarena_alloc(b->c->arena, cap);
        memcpy(p, b->s, b->n);
        b->s = p;
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
void jbuf_puts(JBuf *b, const char *s) { jbuf_put(b, s, strlen(s)); }
void jbuf_putc(JBuf *b, char ch) { jbuf_put(b, &ch, 1); }
JStr jbuf_str(const JBuf *b) { return (JStr){b->s, b->n}; }

/* ---- values ---- */

JValue jv_undefined = {.kind = JV_UNDEF}, jv_none = {.kind = JV_NONE};
JValue jv_true = {.kind = JV_BOOL, .b = 1}, jv_false = {.kind = JV_BOOL, .b = 0};

static JValue *jv_new(JArena *a, JvKind k) {
    JValue *v = jarena_alloc(a, sizeof(JValue));
    v->kind = k;
    return v;
}
JValue *jv_bool(int b) { return b ? &jv_true : &jv_false; }
JValue *jv_int(JArena *a, double x) { JValue *v = jv_new(a, JV_INT); v->num = x; return v; }
JValue *jv_float(JArena *a, double x) { JValue *v = jv_new(a, JV_FLOAT); v->num = x; return v; }
JValue *jv_str(JArena *a, const char *s, size_t n) {
    JValue *v = jv_new(a, JV_STR);
    v->str = (JStr){jarena_strndup(a, s, n), n};
    return v;
}
JValue *jv_strref(JArena *a, JStr s) { JValue *v = jv_new(a, JV_STR); v->str = s; return v; }
JValue *jv_list(JArena *a) { JValue *v = jv_new(a, JV_LIST); v->list = jarena_alloc(a, sizeof(JList)); return v; }
JValue *jv_dict(JArena *a, JvKind kind) { JValue *v = jv_new(a, kind); v->dict = jarena_alloc(a, sizeof(JDict)); return v; }
JValue *jv_func(JArena *a, JFunc fn, JValue *self) {
    JValue *v = jv_new(a, JV_FUNC);
    v->fn = fn;
    v->self = self;
    return v;
}

void jlist_push(JArena *a, JList *l, JValue *v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4;
        JValue **p = jarena_alloc(a, cap * sizeof(JValue *));
        if (l->n) memcpy(p, l->v, l->n * sizeof(JValue *));
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

JValue *jdict_get(const JDict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].n == n && memcmp(d->keys[i].s, k, n) == 0) return d->vals[i];
    return NULL;
}

void jdict_set(JArena *a, JDict *d, JStr k, JValue *v) {
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].n == k.n && memcmp(d->keys[i].s, k.s, k.n) == 0) {
            d->vals[i] = v;
            return;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 4;
        JStr *keys = jarena_alloc(a, cap * sizeof(JStr));
        JValue **vals = jarena_alloc(a, cap * sizeof(JValue *));
        if (d->n) {
            memcpy(keys, d->keys, d->n * sizeof(JStr));
            memcpy(vals, d->vals, d->n * sizeof(JValue *));
        }
        d->keys = keys;
        d->vals = vals;
        d->cap = cap;
    }
    d->keys[d->n] = k;
    d->vals[d->n++] = v;
}

int jv_truthy(const JValue *v) {
    switch (v->kind) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v->b;
    case JV_INT: case JV_FLOAT: return v->num != 0 && !isnan(v->num);
    case JV_STR: return v->str.n > 0;
    case JV_LIST: return v->list->n > 0;
    case JV_DICT: return v->dict->n > 0;
    default: return 1; /* namespaces and functions: JS objects are truthy */
    }
}

const char *jv_type_name(const JValue *v) {
    switch (v->kind) {
    case JV_UNDEF: return "UndefinedValue";
    case JV_NONE: return "NullValue";
    case JV_BOOL: return "BooleanValue";
    case JV_INT: return "IntegerValue";
    case JV_FLOAT: return "FloatValue";
    case JV_STR: return "StringValue";
    case JV_LIST: return v->flags & JV_F_TUPLE ? "TupleValue" : "ArrayValue";
    case JV_DICT: return v->flags & JV_F_KWARGS ? "KeywordArgumentsValue" : "ObjectValue";
    case JV_NS: return "NamespaceValue";
    default: return "FunctionValue";
    }
}

/* ---- printing ---- */

void js_number_str(double v, char *buf) {
    if (isnan(v)) { strcpy(buf, "NaN"); return; }
    if (v == 0) { strcpy(buf, "0"); return; }
    if (isinf(v)) { strcpy(buf, v < 0 ? "-Infinity" : "Infinity"); return; }
    char *p = buf;
    if (v < 0) *p++ = '-', v = -v;
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v) break;
    }
    char d[24];
    int k = 0;
    const char *q = tmp;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') d[k++] = *q;
    int n = atoi(q + 1) + 1;
    while (k > 1 && d[k - 1] == '0') k--;
    if (k <= n && n <= 21) {
        memcpy(p, d, (size_t)k), p += k;
        for (int i = k; i < n; i++) *p++ = '0';
    } else if (0 < n && n <= 21) {
        memcpy(p, d, (size_t)n), p += n;
        *p++ = '.';
        memcpy(p, d + n, (size_t)(k - n)), p += k - n;
    } else if (-6 < n && n <= 0) {
        *p++ = '0', *p++ = '.';
        for (int i = 0; i < -n; i++) *p++ = '0';
        memcpy(p, d, (size_t)k), p += k;
    } else {
        *p++ = d[0];
        if (k > 1) *p++ = '.', memcpy(p, d + 1, (size_t)(k - 1)), p += k - 1;
        p += sprintf(p, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    }
    *p = 0;
}

static void print_float(JBuf *b, double v) {
    char buf[400];
    if (v == 0 && signbit(v)) jbuf_puts(b, "-0.0");
    else if (isfinite(v) && fmod(v, 1.0) == 0 && fabs(v) < 1e21) snprintf(buf, sizeof buf, "%.1f", v), jbuf_puts(b, buf);
    else js_number_str(v, buf), jbuf_puts(b, buf);
}

void jv_print(JCtx *c, JBuf *b, const JValue *v, size_t pos) {
    char buf[32];
    switch (v->kind) {
    case JV_UNDEF: case JV_NONE: return;
    case JV_BOOL: jbuf_puts(b, v->b ? "true" : "false"); return;
    case JV_INT: js_number_str(v->num, buf); jbuf_puts(b, buf); return;
    case JV_FLOAT: print_float(b, v->num); return;
    case JV_STR: jbuf_put(b, v->str.s, v->str.n); return;
    case JV_LIST: case JV_DICT: case JV_NS: {
        JJsonOpts o = {0};
        jv_to_json(c, b, v, &o, 0, pos);
        return;
    }
    default:
        jinja_fail(c, CVLLM_EUNSUPPORTED, pos, "unsupported: printing a function (macro or method)");
    }
}

void jv_raw_print(JCtx *c, JBuf *b, const JValue *v, size_t pos) {
    char buf[32];
    switch (v->kind) {
    case JV_UNDEF: case JV_NONE: return;
    case JV_INT: case JV_FLOAT: js_number_str(v->num, buf); jbuf_puts(b, buf); return;
    case JV_LIST:
        for (size_t i = 0; i < v->list->n; i++) {
            if (i) jbuf_putc(b, ',');
            const JValue *e = v->list->v[i];
            if (e->kind == JV_NONE) jbuf_puts(b, "null");
            else if (e->kind == JV_UNDEF) jbuf_puts(b, "undefined");
            else jv_print(c, b, e, pos);
        }
        return;
    case JV_DICT: case JV_NS: jbuf_puts(b, "[object Map]"); return;
    default: jv_print(c, b, v, pos);
    }
}

/* JSON.stringify of a string (+ makeAsciiSafe when ensure_ascii). */
static void json_string(JBuf *b, JStr s, int ensure_ascii) {
    char t[16];
    jbuf_putc(b, '"');
    for (size_t i = 0; i < s.n;) {
        unsigned char ch = (unsigned char)s.s[i];
        if (ch == '"') jbuf_puts(b, "\\\""), i++;
        else if (ch == '\\') jbuf_puts(b, "\\\\"), i++;
        else if (ch == '\n') jbuf_puts(b, "\\n"), i++;
        else if (ch == '\r') jbuf_puts(b, "\\r"), i++;
        else if (ch == '\t') jbuf_puts(b, "\\t"), i++;
        else if (ch == '\b') jbuf_puts(b, "\\b"), i++;
        else if (ch == '\f') jbuf_puts(b, "\\f"), i++;
        else if (ch < 0x20) snprintf(t, sizeof t, "\\u%04x", ch), jbuf_puts(b, t), i++;
        else if (ch < 0x7f || !ensure_ascii) jbuf_putc(b, (char)ch), i++;
        else {
            uint32_t cp;
            i += utf8_next(s.s, s.n, i, &cp);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(t, sizeof t, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(t, sizeof t, "\\u%04x", cp);
            }
            jbuf_puts(b, t);
        }
    }
    jbuf_putc(b, '"');
}

/* An approximation of String.prototype.localeCompare for sort_keys: case-insensitive first. */
static int locale_cmp(JStr a, JStr b) {
    size_t n = a.n < b.n ? a.n : b.n;
    for (size_t i = 0; i < n; i++) {
        int x = (unsigned char)a.s[i], y = (unsigned char)b.s[i];
        int lx = x >= 'A' && x <= 'Z' ? x + 32 : x, ly = y >= 'A' && y <= 'Z' ? y + 32 : y;
        if (lx != ly) return lx - ly;
    }
    if (a.n != b.n) return a.n < b.n ? -1 : 1;
    for (size_t i = 0; i < n; i++)
        if (a.s[i] != b.s[i]) return (unsigned char)b.s[i] - (unsigned char)a.s[i];
    return 0;
}

void jv_to_json(JCtx *c, JBuf *b, const JValue *v, const JJsonOpts *o, int depth, size_t pos) {
    char buf[32];
    if (depth > 1000) jinja_fail(c, CVLLM_EINVAL, pos, "value nested too deeply for tojson");
    switch (v->kind) {
    case JV_NONE: jbuf_puts(b, "null"); return;
    case JV_UNDEF: jbuf_puts(b, o->undefined_as_null ? "null" : "undefined"); return;
    case JV_BOOL: jbuf_puts(b, v->b ? "true" : "false"); return;
    case JV_INT: case JV_FLOAT:
        if (!isfinite(v->num)) jbuf_puts(b, "null");
        else js_number_str(v->num, buf), jbuf_puts(b, buf);
        return;
    case JV_STR: json_string(b, v->str, o->ensure_ascii); return;
    default: break;
    }
    if (v->kind == JV_FUNC || (v->flags & (JV_F_TUPLE | JV_F_KWARGS)))
        jinja_fail(c, CVLLM_EINVAL, pos, "cannot convert %s to JSON", jv_type_name(v));
    const char *isep = o->item_sep ? o->item_sep : o->indent ? "," : ", ";
    const char *ksep = o->key_sep ? o->key_sep : ": ";
    size_t n = v->kind == JV_LIST ? v->list->n : v->dict->n;
    int ind = o->indent > 0 && n > 0;
    #define PAD(d) do { jbuf_putc(b, '\n'); for (int _i = 0; _i < (d) * o->indent; _i++) jbuf_putc(b, ' '); } while (0)
    if (v->kind == JV_LIST) {
        jbuf_putc(b, '[');
        for (size_t i = 0; i < n; i++) {
            if (i) jbuf_puts(b, isep);
            if (ind) PAD(depth + 1);
            jv_to_json(c, b, v->list->v[i], o, depth + 1, pos);
        }
        if (ind) PAD(depth);
        jbuf_putc(b, ']');
        return;
    }
    size_t *order = jarena_alloc(c->arena, (n + 1) * sizeof(size_t));
    for (size_t i = 0; i < n; i++) order[i] = i;
    if (o->sort_keys) /* insertion sort: stable, dicts are small */
        for (size_t i = 1; i < n; i++)
            for (size_t j = i; j > 0 && locale_cmp(v->dict->keys[order[j - 1]], v->dict->keys[order[j]]) > 0; j--) {
                size_t t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
            }
    jbuf_putc(b, '{');
    for (size_t i = 0; i < n; i++) {
        if (i) jbuf_puts(b, isep);
        if (ind) PAD(depth + 1);
        json_string(b, v->dict->keys[order[i]], o->ensure_ascii);
        jbuf_puts(b, ksep);
        jv_to_json(c, b, v->dict->vals[order[i]], o, depth + 1, pos);
    }
    if (ind) PAD(depth);
    jbuf_putc(b, '}');
    #undef PAD
}

/* ---- equality ---- */

static int is_object(const JValue *v) {
    return v->kind == JV_LIST || v->kind == JV_DICT || v->kind == JV_NS || v->kind == JV_FUNC;
}

int jv_strict_eq(const JValue *a, const JValue *b) {
    if (is_object(a) || is_object(b)) return a == b;
    int na = a->kind == JV_INT || a->kind == JV_FLOAT, nb = b->kind == JV_INT || b->kind == JV_FLOAT;
    if (na && nb) return a->num == b->num;
    if (a->kind != b->kind) return 0;
    switch (a->kind) {
    case JV_BOOL: return a->b == b->b;
    case JV_STR: return a->str.n == b->str.n && memcmp(a->str.s, b->str.s, a->str.n) == 0;
    default: return 1; /* undefined, null */
    }
}

int jv_loose_eq(JCtx *c, const JValue *a, const JValue *b, size_t pos) {
    if (is_object(a) && is_object(b)) return a == b;
    int nul_a = a->kind == JV_UNDEF || a->kind == JV_NONE, nul_b = b->kind == JV_UNDEF || b->kind == JV_NONE;
    if (nul_a || nul_b) return nul_a && nul_b;
    if (is_object(a) || is_object(b)) { /* ToPrimitive(object) is a string */
        const JValue *obj = is_object(a) ? a : b, *prim = is_object(a) ? b : a;
        JBuf s;
        jbuf_init(&s, c);
        jv_raw_print(c, &s, obj, pos);
        JValue tmp = {.kind = JV_STR, .str = jbuf_str(&s)};
        return jv_loose_eq(c, &tmp, prim, pos);
    }
    if (a->kind == b->kind || ((a->kind == JV_INT || a->kind == JV_FLOAT) && (b->kind == JV_INT || b->kind == JV_FLOAT)))
        return jv_strict_eq(a, b);
    /* mixed primitives: everything goes to numbers */
    double x = a->kind == JV_BOOL ? a->b : a->kind == JV_STR ? js_to_number(a->str) : a->num;
    double y = b->kind == JV_BOOL ? b->b : b->kind == JV_STR ? js_to_number(b->str) : b->num;
    return x == y;
}

/* ---- UTF-8 and JavaScript string helpers ---- */

size_t utf8_next(const char *s, size_t n, size_t i, uint32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
        *cp = 0xFFFD;
        return 1;
    }
    *cp = (uint32_t)c;
    return (size_t)k;
}

static int js_is_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

size_t js_space_len(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    unsigned char ch = (unsigned char)s[i];
    if (ch < 0x80) return js_is_space(ch) ? 1 : 0;
    uint32_t cp;
    size_t k = utf8_next(s, n, i, &cp);
    return cp != 0xFFFD && js_is_space(cp) ? k : 0;
}

size_t js_space_len_before(const char *s, size_t i) {
    if (i == 0) return 0;
    unsigned char ch = (unsigned char)s[i - 1];
    if (ch < 0x80) return js_is_space(ch) ? 1 : 0;
    for (size_t k = 2; k <= 3 && k <= i; k++) {
        uint32_t cp;
        if (utf8_next(s, i, i - k, &cp) == k && cp != 0xFFFD) return js_is_space(cp) ? k : 0;
    }
    return 0;
}

JStr js_trim(JStr s, int left, int right) {
    size_t a = 0, b = s.n, k;
    if (left)
        while (a < b && (k = js_space_len(s.s, b, a)) > 0) a += k;
    if (right)
        while (b > a && (k = js_space_len_before(s.s, b)) > 0 && b - k >= a) b -= k;
    return (JStr){s.s + a, b - a};
}

size_t js_utf16_len(JStr s) {
    size_t n = 0;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        i += utf8_next(s.s, s.n, i, &cp);
        n += cp >= 0x10000 ? 2 : 1;
    }
    return n;
}

void js_case(JBuf *b, JStr s, int upper) {
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        size_t k = utf8_next(s.s, s.n, i, &cp);
        if (cp < 0x80) {
            char ch = s.s[i];
            if (upper && ch >= 'a' && ch <= 'z') ch -= 32;
            if (!upper && ch >= 'A' && ch <= 'Z') ch += 32;
            jbuf_putc(b, ch);
        } else if (upper && cp == 0xDF) {
            jbuf_puts(b, "SS");
        } else {
            utf8proc_int32_t m = upper ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp);
            utf8proc_uint8_t t[4];
            jbuf_put(b, (const char *)t, (size_t)utf8proc_encode_char(m, t));
        }
        i += k;
    }
}

double js_to_number(JStr s) {
    s = js_trim(s, 1, 1);
    if (s.n == 0) return 0;
    char tmp[128];
    if (s.n >= sizeof tmp) return NAN;
    memcpy(tmp, s.s, s.n);
    tmp[s.n] = 0;
    const char *p = tmp;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X' || p[1] == 'o' || p[1] == 'O' || p[1] == 'b' || p[1] == 'B')) {
        int base = (p[1] | 32) == 'x' ? 16 : (p[1] | 32) == 'o' ? 8 : 2;
        double v = 0;
        if (!p[2]) return NAN;
        for (p += 2; *p; p++) {
            int d = *p >= '0' && *p <= '9' ? *p - '0' : (*p | 32) >= 'a' && (*p | 32) <= 'f' ? (*p | 32) - 'a' + 10 : 99;
            if (d >= base) return NAN;
            v = v * base + d;
        }
        return v;
    }
    int neg = *p == '-';
    if (*p == '+' || *p == '-') p++;
    if (strcmp(p, "Infinity") == 0) return neg ? -INFINITY : INFINITY;
    const char *q = p;
    int digits = 0;
    while (*q >= '0' && *q <= '9') q++, digits++;
    if (*q == '.') for (q++; *q >= '0' && *q <= '9'; q++) digits++;
    if (!digits) return NAN;
    if (*q == 'e' || *q == 'E') {
        q++;
        if (*q == '+' || *q == '-') q++;
        if (!(*q >= '0' && *q <= '9')) return NAN;
        while (*q >= '0' && *q <= '9') q++;
    }
    if (*q) return NAN;
    return strtod(tmp, NULL);
}
