/* jinja_builtins.c: what @huggingface/jinja 0.5.11 provides beyond the grammar: member access
 * (dict keys and methods, list / string indexing and methods), slicing, and the
 * global functions namespace(), raise_exception(), range(), strftime_now().
 *
 * Each follows runtime.ts closely, including its quirks, since byte-identical output is the goal:
 * str.strip() ignores its argument, a list has no methods but .length, strings index by UTF-16
 * unit but slice by code point, and so on.
 * Whatever HF rejects is an error here too (with the template position). */
#include <math.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "tokenizer/jinja.h"

#define FAIL(r, pos, ...) jinja_fail(&(r)->c, CVLLM_EINVAL, pos, __VA_ARGS__)

static int name_is(const char *s, size_t n, const char *w) { return n == strlen(w) && memcmp(s, w, n) == 0; }

/* ---- member access ---- */

JValue *jinja_dict_keys(JRender *r, JValue *d) {
    JValue *l = jv_list(r->c.arena);
    for (size_t i = 0; i < d->dict->n; i++) jlist_push(r->c.arena, l->list, jv_strref(r->c.arena, d->dict->keys[i]));
    return l;
}

JValue *jinja_dict_items(JRender *r, JValue *d) {
    JArena *A = r->c.arena;
    JValue *l = jv_list(A);
    for (size_t i = 0; i < d->dict->n; i++) {
        JValue *p = jv_list(A);
        jlist_push(A, p->list, jv_strref(A, d->dict->keys[i]));
        jlist_push(A, p->list, d->dict->vals[i]);
        jlist_push(A, l->list, p);
    }
    return l;
}

static const struct { const char *name; JFunc fn; } STR_METHODS[] = {
    {"upper", JF_S_UPPER}, {"lower", JF_S_LOWER}, {"strip", JF_S_STRIP}, {"title", JF_S_TITLE},
    {"capitalize", JF_S_CAPITALIZE}, {"rstrip", JF_S_RSTRIP}, {"lstrip", JF_S_LSTRIP},
    {"startswith", JF_S_STARTSWITH}, {"endswith", JF_S_ENDSWITH}, {"split", JF_S_SPLIT},
    {"replace", JF_S_REPLACE},
}, DICT_METHODS[] = {
    {"get", JF_D_GET}, {"items", JF_D_ITEMS}, {"keys", JF_D_KEYS}, {"values", JF_D_VALUES},
    {"dictsort", JF_D_DICTSORT},
};

/* obj.name for the built-in methods / properties (NULL if none). */
JValue *jinja_builtin_member(JRender *r, JValue *obj, JStr name) {
    JArena *A = r->c.arena;
    if (obj->kind == JV_STR) {
        if (name_is(name.s, name.n, "length")) return jv_int(A, (double)js_utf16_len(obj->str));
        for (size_t i = 0; i < sizeof STR_METHODS / sizeof *STR_METHODS; i++)
            if (name_is(name.s, name.n, STR_METHODS[i].name)) return jv_func(A, STR_METHODS[i].fn, obj);
    } else if (obj->kind == JV_LIST) {
        if (name_is(name.s, name.n, "length")) return jv_int(A, (double)obj->list->n);
    } else if (obj->kind == JV_DICT) {
        for (size_t i = 0; i < sizeof DICT_METHODS / sizeof *DICT_METHODS; i++)
            if (name_is(name.s, name.n, DICT_METHODS[i].name)) return jv_func(A, DICT_METHODS[i].fn, obj);
    }
    return NULL;
}

/* The code point containing UTF-16 unit idx (a lone surrogate becomes U+FFFD). */
static JValue *string_at(JRender *r, JStr s, double idx) {
    double len = (double)js_utf16_len(s);
    if (idx < 0) idx += len;
    if (!(idx >= 0 && idx < len)) return &jv_undefined;
    size_t u = 0;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        size_t k = utf8_next(s.s, s.n, i, &cp);
        size_t units = cp >= 0x10000 ? 2 : 1;
        if ((double)(u + units) > idx) return units == 1 ? jv_str(r->c.arena, s.s + i, k) : jv_str(r->c.arena, "\xEF\xBF\xBD", 3);
        u += units;
        i += k;
    }
    return &jv_undefined;
}

JValue *jinja_member(JRender *r, JValue *obj, JValue *prop, size_t pos) {
    if (obj->kind == JV_DICT || obj->kind == JV_NS) {
        if (prop->kind != JV_STR) FAIL(r, pos, "cannot access a dict member with a non-string key: got %s", jv_type_name(prop));
        JValue *v = jdict_get(obj->dict, prop->str.s, prop->str.n);
        if (!v && obj->kind == JV_DICT) v = jinja_builtin_member(r, obj, prop->str);
        return v ? v : &jv_undefined;
    }
    if (obj->kind == JV_LIST || obj->kind == JV_STR) {
        if (prop->kind == JV_INT) {
            double idx = trunc(prop->num);
            if (obj->kind == JV_STR) return string_at(r, obj->str, idx);
            double n = (double)obj->list->n;
            if (idx < 0) idx += n;
            return idx >= 0 && idx < n ? obj->list->v[(size_t)idx] : &jv_undefined;
        }
        if (prop->kind == JV_STR) {
            JValue *v = jinja_builtin_member(r, obj, prop->str);
            return v ? v : &jv_undefined;
        }
        FAIL(r, pos, "cannot index %s with %s", jv_type_name(obj), jv_type_name(prop));
    }
    if (prop->kind != JV_STR) FAIL(r, pos, "cannot access a member with a non-string key: got %s", jv_type_name(prop));
    return &jv_undefined;
}

/* Splits a string into its code points (Array.from(str)). */
JStr *jinja_code_points(JRender *r, JStr s, size_t *count) {
    JStr *v = jarena_alloc(r->c.arena, (s.n + 1) * sizeof(JStr));
    size_t n = 0;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp;
        size_t k = utf8_next(s.s, s.n, i, &cp);
        v[n++] = (JStr){s.s + i, k};
        i += k;
    }
    *count = n;
    return v;
}

JValue *jinja_slice(JRender *r, JValue *obj, JValue *st, JValue *sp, JValue *sz, size_t pos) {
    if (obj->kind != JV_LIST && obj->kind != JV_STR) FAIL(r, pos, "slice object must be a list or string: got %s", jv_type_name(obj));
    if ((st->kind != JV_INT && st->kind != JV_UNDEF) || (sp->kind != JV_INT && sp->kind != JV_UNDEF) ||
        (sz->kind != JV_INT && sz->kind != JV_UNDEF))
        FAIL(r, pos, "slice bounds must be integers");
    size_t ncp = 0;
    JStr *cps = obj->kind == JV_STR ? jinja_code_points(r, obj->str, &ncp) : NULL;
    double L = obj->kind == JV_STR ? (double)ncp : (double)obj->list->n;
    double step = sz->kind == JV_UNDEF ? 1 : sz->num, start, stop;
    int dir = step > 0 ? 1 : step < 0 ? -1 : 0;
    if (dir >= 0) {
        start = st->kind == JV_UNDEF ? 0 : st->num;
        start = start < 0 ? fmax(L + start, 0) : fmin(start, L);
        stop = sp->kind == JV_UNDEF ? L : sp->num;
        stop = stop < 0 ? fmax(L + stop, 0) : fmin(stop, L);
    } else {
        start = st->kind == JV_UNDEF ? L - 1 : st->num;
        start = start < 0 ? fmax(L + start, -1) : fmin(start, L - 1);
        stop = sp->kind == JV_UNDEF ? -1 : sp->num;
        stop = stop < -1 ? fmax(L + stop, -1) : fmin(stop, L - 1);
    }
    JValue *out = jv_list(r->c.arena);
    JBuf b;
    jbuf_init(&b, &r->c);
    for (double i = start; dir != 0 && dir * i < dir * stop; i += step) {
        if (obj->kind == JV_STR) jbuf_put(&b, cps[(size_t)i].s, cps[(size_t)i].n);
        else jlist_push(r->c.arena, out->list, obj->list->v[(size_t)i]);
    }
    return obj->kind == JV_STR ? jv_strref(r->c.arena, jbuf_str(&b)) : out;
}

/* ---- comparisons and sorting ---- */

int jinja_num_like(const JValue *v) { return v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL; }

static int compare_values(JRender *r, const JValue *a, const JValue *b, int case_sensitive, size_t pos) {
    if (a->kind == JV_NONE && b->kind == JV_NONE) return 0;
    if (a->kind == JV_UNDEF && b->kind == JV_UNDEF) return 0;
    if (a->kind == JV_NONE || b->kind == JV_NONE || a->kind == JV_UNDEF || b->kind == JV_UNDEF)
        FAIL(r, pos, "cannot compare %s with %s", jv_type_name(a), jv_type_name(b));
    if (jinja_num_like(a) && jinja_num_like(b)) {
        double x = a->kind == JV_BOOL ? a->b : a->num, y = b->kind == JV_BOOL ? b->b : b->num;
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (strcmp(jv_type_name(a), jv_type_name(b)) != 0)
        FAIL(r, pos, "cannot compare different types: %s and %s", jv_type_name(a), jv_type_name(b));
    if (a->kind != JV_STR) FAIL(r, pos, "cannot compare type %s", jv_type_name(a));
    JStr x = a->str, y = b->str;
    if (!case_sensitive) {
        JBuf bx, by;
        jbuf_init(&bx, &r->c);
        jbuf_init(&by, &r->c);
        js_case(&bx, x, 0);
        js_case(&by, y, 0);
        x = jbuf_str(&bx);
        y = jbuf_str(&by);
    }
    size_t n = x.n < y.n ? x.n : y.n;
    int c = n ? memcmp(x.s, y.s, n) : 0;
    if (c) return c < 0 ? -1 : 1;
    return x.n < y.n ? -1 : x.n > y.n ? 1 : 0;
}


/* Stable merge sort (V8's Array.prototype.sort is stable). */
void jinja_sort_entries(JRender *r, SortEntry *v, size_t n, int cs, int reverse, size_t pos) {
    if (n < 2) return;
    SortEntry *tmp = jarena_alloc(r->c.arena, n * sizeof(SortEntry));
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c = compare_values(r, v[j].key, v[i].key, cs, pos);
                if (reverse) c = -c;
                tmp[k++] = c < 0 ? v[j++] : v[i++];
            }
            while (i < mid) tmp[k++] = v[i++];
            while (j < hi) tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof(SortEntry));
    }
}

/* getAttributeValue: "a.b.0" through dicts, namespaces and lists. */
JValue *jinja_attribute_path(JRender *r, JValue *item, JStr path) {
    JValue *v = item;
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < path.n && path.s[j] != '.') j++;
        JStr part = {path.s + i, j - i};
        if (v->kind == JV_DICT || v->kind == JV_NS) {
            JValue *x = jdict_get(v->dict, part.s, part.n);
            v = x ? x : &jv_undefined;
        } else if (v->kind == JV_LIST) {
            size_t k = 0;
            while (k < part.n && js_space_len(part.s, part.n, k)) k += js_space_len(part.s, part.n, k);
            int neg = k < part.n && part.s[k] == '-';
            if (k < part.n && (part.s[k] == '-' || part.s[k] == '+')) k++;
            double idx = 0;
            int digits = 0;
            while (k < part.n && part.s[k] >= '0' && part.s[k] <= '9') idx = idx * 10 + (part.s[k++] - '0'), digits++;
            if (!digits || neg || idx >= (double)v->list->n) return &jv_undefined;
            v = v->list->v[(size_t)idx];
        } else {
            return &jv_undefined;
        }
        if (j >= path.n) return v;
        i = j + 1;
    }
}

/* ---- string helpers ---- */

static JValue *str_replace(JRender *r, JStr s, JStr old, JStr new_, double count) {
    if (count == 0) return jv_strref(r->c.arena, s);
    double remaining = count < 0 || isnan(count) ? INFINITY : count;
    JBuf b;
    jbuf_init(&b, &r->c);
    if (old.n == 0) { /* (?=) with the u flag: before every code point and at the end */
        for (size_t i = 0;;) {
            if (remaining > 0) jbuf_put(&b, new_.s, new_.n), remaining--;
            if (i >= s.n) break;
            uint32_t cp;
            size_t k = utf8_next(s.s, s.n, i, &cp);
            jbuf_put(&b, s.s + i, k);
            i += k;
        }
    } else {
        size_t i = 0;
        while (i < s.n) {
            const char *hit = remaining > 0 ? memmem(s.s + i, s.n - i, old.s, old.n) : NULL;
            if (!hit) break;
            jbuf_put(&b, s.s + i, (size_t)(hit - (s.s + i)));
            jbuf_put(&b, new_.s, new_.n);
            remaining--;
            i = (size_t)(hit - s.s) + old.n;
        }
        jbuf_put(&b, s.s + i, s.n - i);
    }
    return jv_strref(r->c.arena, jbuf_str(&b));
}

JValue *jinja_str_title(JRender *r, JStr s, int capitalize_only) {
    JBuf b;
    jbuf_init(&b, &r->c);
    if (capitalize_only) { /* charAt(0).toUpperCase() + slice(1) */
        if (s.n == 0) return jv_strref(r->c.arena, s);
        uint32_t cp;
        size_t k = utf8_next(s.s, s.n, 0, &cp);
        if (cp >= 0x10000) return jv_strref(r->c.arena, s);
        js_case(&b, (JStr){s.s, k}, 1);
        jbuf_put(&b, s.s + k, s.n - k);
        return jv_strref(r->c.arena, jbuf_str(&b));
    }
    for (size_t i = 0; i < s.n; i++) { /* value.replace(/\b\w/g, c => c.toUpperCase()) */
        char ch = s.s[i];
        char prev = i ? s.s[i - 1] : ' ';
        int w = (prev >= 'a' && prev <= 'z') || (prev >= 'A' && prev <= 'Z') || (prev >= '0' && prev <= '9') || prev == '_';
        if (!w && ch >= 'a' && ch <= 'z') ch -= 32;
        jbuf_putc(&b, ch);
    }
    return jv_strref(r->c.arena, jbuf_str(&b));
}

JValue *jinja_str_indent(JRender *r, JStr s, double width, int first, int blank) {
    JBuf b;
    jbuf_init(&b, &r->c);
    if (width < 0) width = 0;
    size_t i = 0, line = 0;
    for (;;) {
        const char *nl = memchr(s.s + i, '\n', s.n - i);
        size_t e = nl ? (size_t)(nl - s.s) : s.n;
        if (!((!first && line == 0) || (!blank && e == i)))
            for (double k = 0; k < width; k++) jbuf_putc(&b, ' ');
        jbuf_put(&b, s.s + i, e - i);
        if (!nl) break;
        jbuf_putc(&b, '\n');
        i = e + 1;
        line++;
    }
    return jv_strref(r->c.arena, jbuf_str(&b));
}

/* parseInt(s, 10) / parseFloat(s); NaN when no number starts the string. */
double js_parse_number(JStr s, int integer) {
    s = js_trim(s, 1, 0);
    char tmp[128];
    size_t k = 0, i = 0;
    if (i < s.n && (s.s[i] == '+' || s.s[i] == '-')) tmp[k++] = s.s[i++];
    if (!integer && s.n - i >= 8 && memcmp(s.s + i, "Infinity", 8) == 0) return tmp[0] == '-' && k ? -INFINITY : INFINITY;
    size_t digits = 0;
    while (i < s.n && s.s[i] >= '0' && s.s[i] <= '9' && k < 100) tmp[k++] = s.s[i++], digits++;
    if (!integer) {
        if (i < s.n && s.s[i] == '.' && k < 100) {
            tmp[k++] = s.s[i++];
            while (i < s.n && s.s[i] >= '0' && s.s[i] <= '9' && k < 100) tmp[k++] = s.s[i++], digits++;
        }
        if (digits && i + 1 < s.n && (s.s[i] == 'e' || s.s[i] == 'E')) {
            size_t j = i + 1;
            if (j < s.n && (s.s[j] == '+' || s.s[j] == '-')) j++;
            if (j < s.n && s.s[j] >= '0' && s.s[j] <= '9') {
                while (i < j) tmp[k++] = s.s[i++];
                while (i < s.n && s.s[i] >= '0' && s.s[i] <= '9' && k < 120) tmp[k++] = s.s[i++];
            }
        }
    }
    if (!digits) return NAN;
    tmp[k] = 0;
    return integer ? trunc(strtod(tmp, NULL)) : strtod(tmp, NULL);
}

static JValue *str_split(JRender *r, JStr s, JList *args, size_t pos) {
    JArena *A = r->c.arena;
    JValue *sep = args->n > 0 ? args->v[0] : &jv_none, *ms = args->n > 1 ? args->v[1] : NULL;
    if (sep->kind != JV_STR && sep->kind != JV_NONE) FAIL(r, pos, "split(): sep must be a string or none");
    if (ms && ms->kind != JV_INT) FAIL(r, pos, "split(): maxsplit must be an integer");
    double maxsplit = ms ? ms->num : -1;
    JValue *out = jv_list(A);
    if (sep->kind == JV_NONE) {
        JStr t = js_trim(s, 1, 0);
        size_t i = 0;
        while (i < t.n) {
            size_t k;
            while (i < t.n && (k = js_space_len(t.s, t.n, i)) > 0) i += k;
            if (i >= t.n) break;
            size_t st = i;
            while (i < t.n && js_space_len(t.s, t.n, i) == 0) i += utf8_next(t.s, t.n, i, &(uint32_t){0});
            if (maxsplit != -1 && (double)out->list->n >= maxsplit) {
                jlist_push(A, out->list, jv_strref(A, (JStr){t.s + st, t.n - st}));
                break;
            }
            jlist_push(A, out->list, jv_strref(A, (JStr){t.s + st, i - st}));
        }
        return out;
    }
    JStr p = sep->str;
    if (p.n == 0) FAIL(r, pos, "split(): empty separator");
    size_t i = 0;
    for (;;) {
        const char *hit = memmem(s.s + i, s.n - i, p.s, p.n);
        size_t e = hit ? (size_t)(hit - s.s) : s.n;
        jlist_push(A, out->list, jv_strref(A, (JStr){s.s + i, e - i}));
        if (!hit) break;
        i = e + p.n;
    }
    double n = (double)out->list->n;
    if (maxsplit != -1 && n > maxsplit) { /* result.push(result.splice(maxsplit).join(sep)) */
        double k = maxsplit < 0 ? fmax(n + maxsplit, 0) : maxsplit;
        JStr first = out->list->v[(size_t)k]->str, last = out->list->v[out->list->n - 1]->str;
        out->list->n = (size_t)k;
        jlist_push(A, out->list, jv_strref(A, (JStr){first.s, (size_t)(last.s + last.n - first.s)}));
    }
    return out;
}

static int starts_ends(JRender *r, JStr s, JList *args, int ends, size_t pos) {
    if (args->n == 0) FAIL(r, pos, "%s() requires an argument", ends ? "endswith" : "startswith");
    JValue *p = args->v[0];
    JValue **pats = &p;
    size_t np = 1;
    if (p->kind == JV_LIST) pats = p->list->v, np = p->list->n;
    else if (p->kind != JV_STR) FAIL(r, pos, "%s() argument must be a string or tuple of strings", ends ? "endswith" : "startswith");
    for (size_t i = 0; i < np; i++) {
        if (pats[i]->kind != JV_STR) FAIL(r, pos, "%s() tuple elements must be strings", ends ? "endswith" : "startswith");
        JStr q = pats[i]->str;
        if (q.n <= s.n && memcmp(ends ? s.s + s.n - q.n : s.s, q.s, q.n) == 0) return 1;
    }
    return 0;
}

/* ---- global functions and methods ---- */

static JDict *take_kwargs(JList *args) {
    if (args->n && args->v[args->n - 1]->kind == JV_DICT && (args->v[args->n - 1]->flags & JV_F_KWARGS))
        return args->v[--args->n]->dict;
    return NULL;
}

JValue *jinja_kwarg(JDict *kw, const char *name) { return kw ? jdict_get(kw, name, strlen(name)) : NULL; }

static JValue *fn_namespace(JRender *r, JList *args, size_t pos) {
    JArena *A = r->c.arena;
    JList a = *args;
    JDict *kw = take_kwargs(&a);
    if (a.n > 1) FAIL(r, pos, "namespace expected at most 1 argument, got %zu", a.n);
    JValue *ns = jv_dict(A, JV_NS);
    if (a.n == 1) {
        JValue *src = a.v[0];
        if (src->kind == JV_DICT) {
            for (size_t i = 0; i < src->dict->n; i++) jdict_set(A, ns->dict, src->dict->keys[i], src->dict->vals[i]);
        } else if (src->kind == JV_LIST) {
            for (size_t i = 0; i < src->list->n; i++) {
                JValue *pair = src->list->v[i], *k = NULL, *v = NULL;
                if (pair->kind == JV_LIST && pair->list->n == 2) k = pair->list->v[0], v = pair->list->v[1];
                if (pair->kind == JV_STR) {
                    size_t n;
                    JStr *cp = jinja_code_points(r, pair->str, &n);
                    if (n == 2) k = jv_strref(A, cp[0]), v = jv_strref(A, cp[1]);
                }
                if (!k) FAIL(r, pos, "namespace expected an object or an iterable of [key, value] pairs");
                if (k->kind != JV_STR) FAIL(r, pos, "namespace keys must be strings");
                jdict_set(A, ns->dict, k->str, v);
            }
        } else {
            FAIL(r, pos, "'%s' object is not iterable", jv_type_name(src));
        }
    }
    for (size_t i = 0; kw && i < kw->n; i++) jdict_set(A, ns->dict, kw->keys[i], kw->vals[i]);
    return ns;
}

static JValue *fn_range(JRender *r, JList *args, size_t pos) {
    JArena *A = r->c.arena;
    if (args->n < 1 || args->n > 3) FAIL(r, pos, "range() takes 1 to 3 numeric arguments");
    for (size_t i = 0; i < args->n; i++)
        if (args->v[i]->kind != JV_INT && args->v[i]->kind != JV_FLOAT) FAIL(r, pos, "range() arguments must be numbers");
    double start = 0, stop = args->v[0]->num, step = 1;
    if (args->n >= 2) start = args->v[0]->num, stop = args->v[1]->num;
    if (args->n == 3) step = args->v[2]->num;
    if (step == 0) FAIL(r, pos, "range() step must not be zero");
    JValue *l = jv_list(A);
    for (double i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (r->max_iterations && (int64_t)l->list->n >= r->max_iterations) FAIL(r, pos, "range() too long");
        jlist_push(A, l->list, i == floor(i) ? jv_int(A, i) : jv_float(A, i));
    }
    return l;
}

static JValue *fn_strftime(JRender *r, JList *args, size_t pos) {
    if (args->n < 1 || args->v[0]->kind != JV_STR) FAIL(r, pos, "strftime_now() needs a format string");
    static const char *months[] = {"January", "February", "March", "April", "May", "June", "July",
                                   "August", "September", "October", "November", "December"};
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    JStr f = args->v[0]->str;
    JBuf b;
    jbuf_init(&b, &r->c);
    char t[16];
    for (size_t i = 0; i < f.n; i++) {
        if (f.s[i] != '%' || i + 1 >= f.n || !strchr("YmdbBHM%", f.s[i + 1]) || !f.s[i + 1]) {
            jbuf_putc(&b, f.s[i]);
            continue;
        }
        switch (f.s[++i]) {
        case 'Y': snprintf(t, sizeof t, "%d", tm.tm_year + 1900); break;
        case 'm': snprintf(t, sizeof t, "%02d", tm.tm_mon + 1); break;
        case 'd': snprintf(t, sizeof t, "%02d", tm.tm_mday); break;
        case 'b': snprintf(t, sizeof t, "%.3s", months[tm.tm_mon]); break;
        case 'B': snprintf(t, sizeof t, "%s", months[tm.tm_mon]); break;
        case 'H': snprintf(t, sizeof t, "%02d", tm.tm_hour); break;
        case 'M': snprintf(t, sizeof t, "%02d", tm.tm_min); break;
        default: snprintf(t, sizeof t, "%%"); break;
        }
        jbuf_puts(&b, t);
    }
    return jv_strref(r->c.arena, jbuf_str(&b));
}

static JValue *dict_sort(JRender *r, JValue *d, JList *args, size_t pos) {
    JArena *A = r->c.arena;
    JList a = *args;
    JDict *kw = take_kwargs(&a);
    JValue *cs = a.n > 0 ? a.v[0] : jinja_kwarg(kw, "case_sensitive"), *by = a.n > 1 ? a.v[1] : jinja_kwarg(kw, "by");
    JValue *rev = a.n > 2 ? a.v[2] : jinja_kwarg(kw, "reverse");
    if (cs && cs->kind != JV_BOOL) FAIL(r, pos, "case_sensitive must be a boolean");
    if (rev && rev->kind != JV_BOOL) FAIL(r, pos, "reverse must be a boolean");
    if (by && (by->kind != JV_STR || !(name_is(by->str.s, by->str.n, "key") || name_is(by->str.s, by->str.n, "value"))))
        FAIL(r, pos, "by must be either 'key' or 'value'");
    int by_value = by && name_is(by->str.s, by->str.n, "value");
    JValue *items = jinja_dict_items(r, d);
    size_t n = items->list->n;
    SortEntry *e = jarena_alloc(A, (n + 1) * sizeof(SortEntry));
    for (size_t i = 0; i < n; i++) e[i] = (SortEntry){items->list->v[i]->list->v[by_value], items->list->v[i]};
    jinja_sort_entries(r, e, n, cs && cs->b, rev && rev->b, pos);
    for (size_t i = 0; i < n; i++) items->list->v[i] = e[i].item;
    return items;
}

JValue *jinja_call_builtin(JRender *r, JValue *fn, JList *args, size_t pos) {
    JArena *A = r->c.arena;
    JValue *self = fn->self;
    switch (fn->fn) {
    case JF_NAMESPACE: return fn_namespace(r, args, pos);
    case JF_RANGE: return fn_range(r, args, pos);
    case JF_STRFTIME: return fn_strftime(r, args, pos);
    case JF_RAISE: {
        JBuf b;
        jbuf_init(&b, &r->c);
        JValue tmp = {.kind = JV_LIST, .list = args};
        jv_raw_print(&r->c, &b, &tmp, pos);
        jinja_fail(&r->c, CVLLM_EINVAL, pos, "raise_exception: %s", b.s);
    }
    case JF_S_UPPER: case JF_S_LOWER: {
        JBuf b;
        jbuf_init(&b, &r->c);
        js_case(&b, self->str, fn->fn == JF_S_UPPER);
        return jv_strref(A, jbuf_str(&b));
    }
    case JF_S_STRIP: return jv_strref(A, js_trim(self->str, 1, 1)); /* HF ignores the chars argument */
    case JF_S_LSTRIP: return jv_strref(A, js_trim(self->str, 1, 0));
    case JF_S_RSTRIP: return jv_strref(A, js_trim(self->str, 0, 1));
    case JF_S_TITLE: return jinja_str_title(r, self->str, 0);
    case JF_S_CAPITALIZE: return jinja_str_title(r, self->str, 1);
    case JF_S_STARTSWITH: return jv_bool(starts_ends(r, self->str, args, 0, pos));
    case JF_S_ENDSWITH: return jv_bool(starts_ends(r, self->str, args, 1, pos));
    case JF_S_SPLIT: return str_split(r, self->str, args, pos);
    case JF_S_REPLACE: {
        if (args->n < 2) FAIL(r, pos, "replace() requires at least two arguments");
        if (args->v[0]->kind != JV_STR || args->v[1]->kind != JV_STR) FAIL(r, pos, "replace() arguments must be strings");
        JValue *count = &jv_none;
        if (args->n > 2) {
            count = args->v[2];
            if (count->kind == JV_DICT && (count->flags & JV_F_KWARGS)) {
                JValue *c = jinja_kwarg(count->dict, "count");
                count = c ? c : &jv_none;
            }
        }
        if (count->kind != JV_INT && count->kind != JV_NONE) FAIL(r, pos, "replace() count must be an integer or none");
        return str_replace(r, self->str, args->v[0]->str, args->v[1]->str, count->kind == JV_INT ? count->num : -1);
    }
    case JF_D_GET: {
        if (args->n < 1 || args->v[0]->kind != JV_STR)
            FAIL(r, pos, "dict key must be a string: got %s", args->n ? jv_type_name(args->v[0]) : "nothing");
        JValue *v = jdict_get(self->dict, args->v[0]->str.s, args->v[0]->str.n);
        return v ? v : args->n > 1 ? args->v[1] : &jv_none;
    }
    case JF_D_ITEMS: return jinja_dict_items(r, self);
    case JF_D_KEYS: return jinja_dict_keys(r, self);
    case JF_D_VALUES: {
        JValue *l = jv_list(A);
        for (size_t i = 0; i < self->dict->n; i++) jlist_push(A, l->list, self->dict->vals[i]);
        return l;
    }
    case JF_D_DICTSORT: return dict_sort(r, self, args, pos);
    default: FAIL(r, pos, "cannot call this function");
    }
}

