/* jinja_filters.c: the filters ({{ x | name }}, {{ x | name(args) }}) and tests ({{ x is name }})
 * of @huggingface/jinja 0.5.11, ported from runtime.ts's applyFilter and Environment.TESTS. As in
 * HF, a filter is chosen by the operand's type first ("abc" | first is an error, not "a"), and
 * anything HF rejects is an error here too, with the template position. */
#include <math.h>
#include <string.h>

#include "common.h"
#include "tokenizer/jinja.h"

#define FAIL(r, pos, ...) jinja_fail(&(r)->c, CVLLM_EINVAL, pos, __VA_ARGS__)

static int name_is(const char *s, size_t n, const char *w) { return n == strlen(w) && memcmp(s, w, n) == 0; }

/* ---- tests ---- */

int jinja_test(JRender *r, const char *name, size_t n, JValue *v, JValue *arg, int nargs, size_t pos) {
#define IS(w) name_is(name, n, w)
    if (IS("boolean")) return v->kind == JV_BOOL;
    if (IS("callable")) return v->kind == JV_FUNC;
    if (IS("odd") || IS("even")) {
        if (v->kind != JV_INT) FAIL(r, pos, "cannot test %.*s on %s", (int)n, name, jv_type_name(v));
        return (fmod(v->num, 2) != 0) == IS("odd");
    }
    if (IS("false")) return v->kind == JV_BOOL && !v->b;
    if (IS("true")) return v->kind == JV_BOOL && v->b;
    if (IS("none")) return v->kind == JV_NONE;
    if (IS("string")) return v->kind == JV_STR;
    if (IS("number")) return v->kind == JV_INT || v->kind == JV_FLOAT;
    if (IS("integer")) return v->kind == JV_INT;
    if (IS("iterable")) return (v->kind == JV_LIST && !(v->flags & JV_F_TUPLE)) || v->kind == JV_STR;
    if (IS("mapping")) return v->kind == JV_DICT;
    if (IS("sequence")) return v->kind == JV_LIST || v->kind == JV_DICT || v->kind == JV_STR;
    if (IS("lower") || IS("upper")) {
        if (v->kind != JV_STR) return 0;
        JBuf b;
        jbuf_init(&b, &r->c);
        js_case(&b, v->str, IS("upper"));
        return b.n == v->str.n && memcmp(b.s, v->str.s, b.n) == 0;
    }
    if (IS("defined")) return v->kind != JV_UNDEF;
    if (IS("undefined")) return v->kind == JV_UNDEF;
    if (IS("equalto") || IS("eq")) {
        if (nargs < 2 || !arg) FAIL(r, pos, "test '%.*s' needs an argument (only supported in selectattr)", (int)n, name);
        return jv_strict_eq(v, arg);
    }
#undef IS
    jinja_fail(&r->c, CVLLM_EUNSUPPORTED, pos, "unknown test '%.*s'", (int)n, name);
}

/* ---- filters ---- */

static JValue *tojson(JRender *r, JValue *v, const JJsonOpts *o, size_t pos) {
    JBuf b;
    jbuf_init(&b, &r->c);
    jv_to_json(&r->c, &b, v, o, 0, pos);
    return jv_strref(r->c.arena, jbuf_str(&b));
}

static JValue *join(JRender *r, JValue *v, JStr sep, size_t pos) {
    JBuf b;
    jbuf_init(&b, &r->c);
    if (v->kind == JV_STR) {
        size_t n;
        JStr *cp = jinja_code_points(r, v->str, &n);
        for (size_t i = 0; i < n; i++) {
            if (i) jbuf_put(&b, sep.s, sep.n);
            jbuf_put(&b, cp[i].s, cp[i].n);
        }
    } else {
        for (size_t i = 0; i < v->list->n; i++) {
            if (i) jbuf_put(&b, sep.s, sep.n);
            jv_raw_print(&r->c, &b, v->list->v[i], pos);
        }
    }
    return jv_strref(r->c.arena, jbuf_str(&b));
}

static int raw_truthy(const JValue *v) { /* JS truthiness of v.value */
    return v->kind == JV_LIST || v->kind == JV_DICT || v->kind == JV_NS || v->kind == JV_FUNC || jv_truthy(v);
}

static JValue *filter_plain(JRender *r, JValue *v, const JNode *f, JEnv *env) {
    JArena *A = r->c.arena;
    const char *name = f->str.s;
    size_t n = f->str.n, pos = f->pos;
#define IS(w) name_is(name, n, w)
    if (IS("safe")) return v;
    if (IS("tojson")) return tojson(r, v, &(JJsonOpts){.undefined_as_null = 1}, pos);
    if (v->kind == JV_LIST) {
        JList *l = v->list;
        if (IS("list")) return v;
        /* HF returns a raw JS undefined here, which breaks nearly every later use: an error */
        if ((IS("first") || IS("last")) && l->n == 0) FAIL(r, pos, "'%.*s' of an empty list", (int)n, name);
        if (IS("first")) return l->v[0];
        if (IS("last")) return l->v[l->n - 1];
        if (IS("length")) return jv_int(A, (double)l->n);
        if (IS("reverse") || IS("sort") || IS("unique")) {
            JValue *out = jv_list(A);
            if (IS("reverse")) {
                for (size_t i = l->n; i-- > 0;) jlist_push(A, out->list, l->v[i]);
            } else if (IS("sort")) {
                SortEntry *e = jarena_alloc(A, (l->n + 1) * sizeof(SortEntry));
                for (size_t i = 0; i < l->n; i++) e[i] = (SortEntry){l->v[i], l->v[i]};
                jinja_sort_entries(r, e, l->n, 0, 0, pos);
                for (size_t i = 0; i < l->n; i++) jlist_push(A, out->list, e[i].item);
            } else {
                for (size_t i = 0; i < l->n; i++) {
                    int seen = 0;
                    for (size_t j = 0; j < out->list->n && !seen; j++)
                        seen = jv_strict_eq(out->list->v[j], l->v[i]) ||
                               (jinja_num_like(l->v[i]) && l->v[i]->kind != JV_BOOL && isnan(l->v[i]->num) &&
                                out->list->v[j]->kind == l->v[i]->kind && isnan(out->list->v[j]->num));
                    if (!seen) jlist_push(A, out->list, l->v[i]);
                }
            }
            return out;
        }
        if (IS("join")) return join(r, v, (JStr){"", 0}, pos);
        if (IS("string")) return tojson(r, v, &(JJsonOpts){0}, pos);
        FAIL(r, pos, "unknown filter '%.*s' for a list", (int)n, name);
    }
    if (v->kind == JV_STR) {
        if (IS("length")) return jv_int(A, (double)js_utf16_len(v->str));
        if (IS("upper") || IS("lower")) {
            JBuf b;
            jbuf_init(&b, &r->c);
            js_case(&b, v->str, IS("upper"));
            return jv_strref(A, jbuf_str(&b));
        }
        if (IS("title") || IS("capitalize")) return jinja_str_title(r, v->str, IS("capitalize"));
        if (IS("trim")) return jv_strref(A, js_trim(v->str, 1, 1));
        if (IS("indent")) return jinja_str_indent(r, v->str, 4, 0, 0);
        if (IS("join") || IS("string")) return v;
        if (IS("int")) {
            double x = js_parse_number(v->str, 1);
            return jv_int(A, isnan(x) ? 0 : x);
        }
        if (IS("float")) {
            double x = js_parse_number(v->str, 0);
            return jv_float(A, isnan(x) ? 0 : x);
        }
        FAIL(r, pos, "unknown filter '%.*s' for a string", (int)n, name);
    }
    if (v->kind == JV_INT || v->kind == JV_FLOAT) {
        if (IS("abs")) return v->kind == JV_INT ? jv_int(A, fabs(v->num)) : jv_float(A, fabs(v->num));
        if (IS("int")) return jv_int(A, floor(v->num));
        if (IS("float")) return jv_float(A, v->num);
        if (IS("string")) {
            JBuf b;
            jbuf_init(&b, &r->c);
            jv_print(&r->c, &b, v, pos);
            return jv_strref(A, jbuf_str(&b));
        }
        FAIL(r, pos, "unknown filter '%.*s' for a number", (int)n, name);
    }
    if (v->kind == JV_DICT) {
        if (IS("items")) return jinja_dict_items(r, v);
        if (IS("length")) return jv_int(A, (double)v->dict->n);
        JValue *m = jinja_builtin_member(r, v, f->str);
        if (m) {
            JList none = {0};
            return jinja_call_builtin(r, m, &none, pos);
        }
        FAIL(r, pos, "unknown filter '%.*s' for a dict", (int)n, name);
    }
    if (v->kind == JV_BOOL) {
        if (IS("bool")) return v;
        if (IS("int")) return jv_int(A, v->b);
        if (IS("float")) return jv_float(A, v->b);
        if (IS("string")) return jv_str(A, v->b ? "true" : "false", v->b ? 4 : 5);
        FAIL(r, pos, "unknown filter '%.*s' for a boolean", (int)n, name);
    }
    (void)env;
    FAIL(r, pos, "cannot apply filter '%.*s' to %s", (int)n, name, jv_type_name(v));
#undef IS
}

static JValue *filter_call(JRender *r, JValue *v, const JNode *f, JEnv *env) {
    JArena *A = r->c.arena;
    const char *name = f->str.s;
    size_t n = f->str.n, pos = f->pos;
    JList args = {0};
    JDict kw = {0};
#define IS(w) name_is(name, n, w)
#define ARG(i, key) (args.n > (i) ? args.v[i] : jinja_kwarg(&kw, key))
    if (IS("selectattr") || IS("rejectattr")) {
        if (v->kind != JV_LIST) FAIL(r, pos, "cannot apply filter '%.*s' to %s", (int)n, name, jv_type_name(v));
        for (size_t i = 0; i < v->list->n; i++)
            if (v->list->v[i]->kind != JV_DICT && v->list->v[i]->kind != JV_NS)
                FAIL(r, pos, "'%.*s' can only be applied to a list of objects", (int)n, name);
        for (size_t i = 0; i < f->l1.n; i++)
            if (f->l1.v[i]->kind != N_STR) FAIL(r, f->l1.v[i]->pos, "arguments of '%.*s' must be string literals", (int)n, name);
        if (f->l1.n < 1) FAIL(r, pos, "'%.*s' needs an attribute name", (int)n, name);
        JStr attr = f->l1.v[0]->str;
        const JNode *test = f->l1.n > 1 ? f->l1.v[1] : NULL;
        JValue *arg = f->l1.n > 2 ? jv_strref(A, f->l1.v[2]->str) : NULL;
        JValue *out = jv_list(A);
        for (size_t i = 0; i < v->list->n; i++) {
            JValue *a = jdict_get(v->list->v[i]->dict, attr.s, attr.n);
            int res = !a ? 0 : test ? jinja_test(r, test->str.s, test->str.n, a, arg, arg ? 2 : 1, test->pos) : jv_truthy(a);
            if (res == IS("selectattr")) jlist_push(A, out->list, v->list->v[i]);
        }
        return out;
    }
    jinja_eval_args(r, &f->l1, env, &args, &kw);
    if (IS("tojson")) {
        JValue *ind = jinja_kwarg(&kw, "indent"), *ea = jinja_kwarg(&kw, "ensure_ascii"), *sk = jinja_kwarg(&kw, "sort_keys");
        JValue *sep = jinja_kwarg(&kw, "separators");
        if (ind && ind->kind != JV_INT && ind->kind != JV_NONE) FAIL(r, pos, "tojson: indent must be an integer");
        if (ind && ind->kind == JV_INT && (ind->num < 0 || ind->num > 64)) FAIL(r, pos, "tojson: indent out of range");
        if (ea && ea->kind != JV_BOOL) FAIL(r, pos, "tojson: ensure_ascii must be a boolean");
        if (sk && sk->kind != JV_BOOL) FAIL(r, pos, "tojson: sort_keys must be a boolean");
        JJsonOpts o = {.undefined_as_null = 1};
        o.indent = ind && ind->kind == JV_INT ? (int)ind->num : 0;
        o.ensure_ascii = ea && ea->b;
        o.sort_keys = sk && sk->b;
        if (sep && sep->kind != JV_NONE) {
            if (sep->kind != JV_LIST || sep->list->n != 2 || sep->list->v[0]->kind != JV_STR || sep->list->v[1]->kind != JV_STR)
                FAIL(r, pos, "tojson: separators must be a tuple of two strings");
            o.item_sep = jarena_strndup(A, sep->list->v[0]->str.s, sep->list->v[0]->str.n);
            o.key_sep = jarena_strndup(A, sep->list->v[1]->str.s, sep->list->v[1]->str.n);
        }
        return tojson(r, v, &o, pos);
    }
    if (IS("join")) {
        if (v->kind != JV_STR && v->kind != JV_LIST) FAIL(r, pos, "cannot apply filter 'join' to %s", jv_type_name(v));
        JValue *sep = ARG(0, "separator");
        if (sep && sep->kind != JV_STR) FAIL(r, pos, "join: separator must be a string");
        return join(r, v, sep ? sep->str : (JStr){"", 0}, pos);
    }
    if (IS("int") || IS("float")) {
        int integer = IS("int");
        JValue *def = ARG(0, "default");
        if (!def) def = integer ? jv_int(A, 0) : jv_float(A, 0);
        if (v->kind == JV_STR) {
            double x = js_parse_number(v->str, integer);
            return isnan(x) ? def : integer ? jv_int(A, x) : jv_float(A, x);
        }
        if (v->kind == JV_INT || v->kind == JV_FLOAT) return v;
        if (v->kind == JV_BOOL) return integer ? jv_int(A, v->b) : jv_float(A, v->b);
        FAIL(r, pos, "cannot apply filter '%.*s' to %s", (int)n, name, jv_type_name(v));
    }
    if (IS("default") || IS("d")) {
        if (IS("d")) FAIL(r, pos, "cannot apply filter 'd' to %s", jv_type_name(v));
        JValue *def = args.n > 0 ? args.v[0] : jv_str(A, "", 0);
        JValue *boolean = ARG(1, "boolean");
        if (boolean && boolean->kind != JV_BOOL) FAIL(r, pos, "default: the boolean flag must be a boolean");
        return v->kind == JV_UNDEF || (boolean && boolean->b && !jv_truthy(v)) ? def : v;
    }
    if (v->kind == JV_LIST) {
        if (IS("sort")) {
            JValue *rev = ARG(0, "reverse"), *cs = ARG(1, "case_sensitive"), *attr = ARG(2, "attribute");
            if (rev && rev->kind != JV_BOOL) FAIL(r, pos, "sort: reverse must be a boolean");
            if (cs && cs->kind != JV_BOOL) FAIL(r, pos, "sort: case_sensitive must be a boolean");
            if (attr && attr->kind != JV_STR && attr->kind != JV_INT && attr->kind != JV_NONE)
                FAIL(r, pos, "sort: attribute must be a string, integer, or none");
            JStr path = {0};
            char num[32];
            if (attr && attr->kind == JV_INT) js_number_str(attr->num, num), path = (JStr){num, strlen(num)};
            if (attr && attr->kind == JV_STR) path = attr->str;
            size_t cnt = v->list->n;
            SortEntry *e = jarena_alloc(A, (cnt + 1) * sizeof(SortEntry));
            for (size_t i = 0; i < cnt; i++)
                e[i] = (SortEntry){attr && attr->kind != JV_NONE ? jinja_attribute_path(r, v->list->v[i], path) : v->list->v[i], v->list->v[i]};
            jinja_sort_entries(r, e, cnt, cs && cs->b, rev && rev->b, pos);
            JValue *out = jv_list(A);
            for (size_t i = 0; i < cnt; i++) jlist_push(A, out->list, e[i].item);
            return out;
        }
        if (IS("map")) {
            JValue *attr = jinja_kwarg(&kw, "attribute"), *def = jinja_kwarg(&kw, "default");
            if (!attr) FAIL(r, pos, "unsupported: map without attribute=...");
            if (attr->kind != JV_STR) FAIL(r, pos, "map: attribute must be a string");
            JValue *out = jv_list(A);
            for (size_t i = 0; i < v->list->n; i++) {
                JValue *it = v->list->v[i];
                if (it->kind != JV_DICT && it->kind != JV_NS) FAIL(r, pos, "map: items must be objects");
                JValue *x = jinja_attribute_path(r, it, attr->str);
                jlist_push(A, out->list, x->kind == JV_UNDEF && def ? def : x);
            }
            return out;
        }
        FAIL(r, pos, "unknown filter '%.*s' for a list", (int)n, name);
    }
    if (v->kind == JV_STR) {
        if (IS("indent")) {
            JValue *w = ARG(0, "width"), *first = ARG(1, "first"), *blank = ARG(2, "blank");
            if (w && w->kind != JV_INT) FAIL(r, pos, "indent: width must be an integer");
            if (w && w->num > 1024) FAIL(r, pos, "indent: width too large");
            return jinja_str_indent(r, v->str, w ? w->num : 4, first && raw_truthy(first), blank && raw_truthy(blank));
        }
        if (IS("replace")) {
            JValue *kwv = jv_dict(A, JV_DICT);
            kwv->flags = JV_F_KWARGS;
            *kwv->dict = kw;
            jlist_push(A, &args, kwv);
            return jinja_call_builtin(r, jv_func(A, JF_S_REPLACE, v), &args, pos);
        }
        FAIL(r, pos, "unknown filter '%.*s' for a string", (int)n, name);
    }
    if (v->kind == JV_DICT) {
        JValue *m = jinja_builtin_member(r, v, f->str);
        if (m && m->kind == JV_FUNC) {
            if (kw.n) {
                JValue *kwv = jv_dict(A, JV_DICT);
                kwv->flags = JV_F_KWARGS;
                *kwv->dict = kw;
                jlist_push(A, &args, kwv);
            }
            return jinja_call_builtin(r, m, &args, pos);
        }
        FAIL(r, pos, "unknown filter '%.*s' for a dict", (int)n, name);
    }
    FAIL(r, pos, "cannot apply filter '%.*s' to %s", (int)n, name, jv_type_name(v));
#undef ARG
#undef IS
}

JValue *jinja_filter(JRender *r, JValue *operand, const JNode *filter, JEnv *env) {
    return filter->flag ? filter_call(r, operand, filter, env) : filter_plain(r, operand, filter, env);
}
