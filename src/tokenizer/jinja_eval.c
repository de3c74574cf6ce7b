/* jinja_eval.c: the interpreter, a port of @huggingface/jinja's runtime.ts Interpreter.
 *
 * Statements write into one output buffer; break / continue travel up as a status (HF throws,
 * and drops the output of the interrupted iteration: so do we, by truncating the buffer).
 * Scoping follows HF: a for loop gets one child scope (its variables vanish after the loop),
 * set writes to the current scope, if has no scope, and a macro body runs in a child of the
 * *caller's* scope (HF passes the calling environment). Binary operators follow HF's order of
 * checks exactly, since that order decides results such as "a" + [1] == "a1". */
#include <math.h>
#include <string.h>

#include "common.h"
#include "tokenizer/jinja.h"

enum { ST_OK = 0, ST_BREAK = 1, ST_CONTINUE = 2 };

static int exec_block(JRender *r, const JNodeList *body, JEnv *env, JBuf *out);

static int name_is(JStr s, const char *w) { return s.n == strlen(w) && memcmp(s.s, w, s.n) == 0; }
static JStr S(const char *s) { return (JStr){s, strlen(s)}; }

static JEnv *env_new(JRender *r, JEnv *parent) {
    JEnv *e = jarena_alloc(r->c.arena, sizeof(JEnv));
    e->parent = parent;
    return e;
}

JValue *jinja_env_lookup(JRender *r, JEnv *env, const char *name, size_t n) {
    /* every HF Environment defines its own `namespace` */
    if (n == 9 && memcmp(name, "namespace", 9) == 0) {
        JValue *v = jdict_get(&env->vars, name, n);
        return v ? v : jv_func(r->c.arena, JF_NAMESPACE, NULL);
    }
    for (JEnv *e = env; e; e = e->parent) {
        JValue *v = jdict_get(&e->vars, name, n);
        if (v) return v;
    }
    return &jv_undefined;
}

void jinja_env_set(JRender *r, JEnv *env, JStr name, JValue *v) { jdict_set(r->c.arena, &env->vars, name, v); }

static const char *op_name(JOp op) {
    static const char *names[] = {"and", "or", "not", "==", "!=", "<", ">", "<=", ">=", "in", "not in",
                                  "+", "-", "~", "*", "/", "//", "%", "**"};
    return names[op];
}

static int is_num(const JValue *v) { return v->kind == JV_INT || v->kind == JV_FLOAT; }

static JValue *eval_binary(JRender *r, const JNode *n, JEnv *env) {
    JArena *A = r->c.arena;
    JValue *l = jinja_eval(r, n->a, env);
    if (n->op == OP_AND) return jv_truthy(l) ? jinja_eval(r, n->b, env) : l;
    if (n->op == OP_OR) return jv_truthy(l) ? l : jinja_eval(r, n->b, env);
    JValue *rv = jinja_eval(r, n->b, env);
    if (n->op == OP_EQ) return jv_bool(jv_loose_eq(&r->c, l, rv, n->pos));
    if (n->op == OP_NE) return jv_bool(!jv_loose_eq(&r->c, l, rv, n->pos));
    if (l->kind == JV_UNDEF || rv->kind == JV_UNDEF) {
        if (rv->kind == JV_UNDEF && (n->op == OP_IN || n->op == OP_NOT_IN)) return jv_bool(n->op == OP_NOT_IN);
        jinja_fail(&r->c, CVLLM_EINVAL, n->pos, "cannot perform operation '%s' on undefined values", op_name(n->op));
    }
    if (l->kind == JV_NONE || rv->kind == JV_NONE)
        jinja_fail(&r->c, CVLLM_EINVAL, n->pos, "cannot perform operation '%s' on null values", op_name(n->op));
    if (n->op == OP_CONCAT) {
        JBuf b;
        jbuf_init(&b, &r->c);
        jv_raw_print(&r->c, &b, l, n->pos);
        jv_raw_print(&r->c, &b, rv, n->pos);
        return jv_strref(A, jbuf_str(&b));
    }
    int lnl = is_num(l) || l->kind == JV_BOOL, rnl = is_num(rv) || rv->kind == JV_BOOL;
    if (n->op == OP_POW && lnl && rnl) {
        double a = l->kind == JV_BOOL ? l->b : l->num, b = rv->kind == JV_BOOL ? rv->b : rv->num;
        if (a == 0 && b < 0) jinja_fail(&r->c, CVLLM_EINVAL, n->pos, "0.0 cannot be raised to a negative power");
        double res = pow(a, b);
        if (!isfinite(res)) jinja_fail(&r->c, CVLLM_EINVAL, n->pos, "exponentiation result is not a finite real number");
        return l->kind == JV_FLOAT || rv->kind == JV_FLOAT || b < 0 ? jv_float(A, res) : jv_int(A, res);
    } else if (is_num(l) && is_num(rv)) {
        double a = l->num, b = rv->num;
        int fl = l->kind == JV_FLOAT || rv->kind == JV_FLOAT;
        switch (n->op) {
        case OP_ADD: return fl ? jv_float(A, a + b) : jv_int(A, a + b);
        case OP_SUB: return fl ? jv_float(A, a - b) : jv_int(A, a - b);
        case OP_MUL: return fl ? jv_float(A, a * b) : jv_int(A, a * b);
        case OP_DIV: return jv_float(A, a / b);
        case OP_FLOORDIV: return fl ? jv_float(A, floor(a / b)) : jv_int(A, floor(a / b));
        case OP_MOD: return fl ? jv_float(A, fmod(a, b)) : jv_int(A, fmod(a, b));
        case OP_LT: return jv_bool(a < b);
        case OP_GT: return jv_bool(a > b);
        case OP_GE: return jv_bool(a >= b);
        case OP_LE: return jv_bool(a <= b);
        default: break;
        }
    } else if (l->kind == JV_LIST && rv->kind == JV_LIST) {
        if (n->op == OP_ADD) {
            JValue *res = jv_list(A);
            for (size_t i = 0; i < l->list->n; i++) jlist_push(A, res->list, l->list->v[i]);
            for (size_t i = 0; i < rv->list->n; i++) jlist_push(A, res->list, rv->list->v[i]);
            return res;
        }
    } else if (rv->kind == JV_LIST) {
        if (n->op == OP_IN || n->op == OP_NOT_IN) {
            int found = 0;
            for (size_t i = 0; i < rv->list->n && !found; i++) found = jv_strict_eq(rv->list->v[i], l);
            return jv_bool(found == (n->op == OP_IN));
        }
    }
    if ((l->kind == JV_STR || rv->kind == JV_STR) && n->op == OP_ADD) {
        JBuf b;
        jbuf_init(&b, &r->c);
        jv_raw_print(&r->c, &b, l, n->pos);
        jv_raw_print(&r->c, &b, rv, n->pos);
        return jv_strref(A, jbuf_str(&b));
    }
    if (l->kind == JV_STR && rv->kind == JV_STR && (n->op == OP_IN || n->op == OP_NOT_IN)) {
        int found = l->str.n == 0 || memmem(rv->str.s, rv->str.n, l->str.s, l->str.n) != NULL;
        return jv_bool(found == (n->op == OP_IN));
    }
    if (l->kind == JV_STR && rv->kind == JV_DICT && (n->op == OP_IN || n->op == OP_NOT_IN)) {
        int found = jdict_get(rv->dict, l->str.s, l->str.n) != NULL;
        return jv_bool(found == (n->op == OP_IN));
    }
    jinja_fail(&r->c, CVLLM_EINVAL, n->pos, "unknown operator '%s' between %s and %s", op_name(n->op),
               jv_type_name(l), jv_type_name(rv));
}

void jinja_eval_args(JRender *r, const JNodeList *args, JEnv *env, JList *pos, JDict *kw) {
    for (size_t i = 0; i < args->n; i++)
        if (args->v[i]->kind != N_KWARG) jlist_push(r->c.arena, pos, jinja_eval(r, args->v[i], env));
    for (size_t i = 0; i < args->n; i++) {
        const JNode *a = args->v[i];
        if (a->kind != N_KWARG) continue;
        if (jdict_get(kw, a->str.s, a->str.n))
            jinja_fail(&r->c, CVLLM_EINVAL, a->pos, "got multiple values for keyword argument '%.*s'",
                       (int)a->str.n, a->str.s);
        jdict_set(r->c.arena, kw, a->str, jinja_eval(r, a->a, env));
    }
}

/* Does the macro body read `kwargs` / `varargs` (HF binds them only then)? */
static int refers_to(const JNode *n, const char *name) {
    if (!n) return 0;
    if (n->kind == N_IDENT && name_is(n->str, name)) return 1;
    if (refers_to(n->a, name) || refers_to(n->b, name) || refers_to(n->c, name)) return 1;
    for (size_t i = 0; i < n->l1.n; i++) if (refers_to(n->l1.v[i], name)) return 1;
    for (size_t i = 0; i < n->l2.n; i++) if (refers_to(n->l2.v[i], name)) return 1;
    return 0;
}

static int macro_special(const JNode *m, const char *name) {
    for (size_t i = 0; i < m->l1.n; i++) {
        if (name_is(m->l1.v[i]->str, name)) return 0; /* declared as a parameter */
        if (m->l1.v[i]->kind == N_KWARG && refers_to(m->l1.v[i]->a, name)) return 1;
    }
    for (size_t i = 0; i < m->l2.n; i++) if (refers_to(m->l2.v[i], name)) return 1;
    return 0;
}

static JValue *call_macro(JRender *r, JValue *fn, JList *args, JEnv *env, size_t pos) {
    JArena *A = r->c.arena;
    const JNode *m = fn->macro;
    JEnv *scope = env_new(r, env);
    size_t npos = args->n;
    JDict *kw = NULL;
    if (npos && args->v[npos - 1]->kind == JV_DICT && (args->v[npos - 1]->flags & JV_F_KWARGS))
        kw = args->v[--npos]->dict;
    char *used = kw ? jarena_alloc(A, kw->n + 1) : NULL;
    const JNode *pending[64];
    size_t npending = 0;
    for (size_t i = 0; i < m->l1.n; i++) {
        const JNode *p = m->l1.v[i];
        JValue *v = i < npos ? args->v[i] : NULL;
        if (!v && kw)
            for (size_t k = 0; k < kw->n; k++)
                if (!used[k] && kw->keys[k].n == p->str.n && !memcmp(kw->keys[k].s, p->str.s, p->str.n)) {
                    v = kw->vals[k];
                    used[k] = 1;
                    break;
                }
        if (!v && p->kind == N_KWARG) {
            if (npending == 64) jinja_fail(&r->c, CVLLM_EUNSUPPORTED, p->pos, "more than 64 default parameters");
            pending[npending++] = p;
        }
        jinja_env_set(r, scope, p->str, v ? v : &jv_undefined);
    }
    if (macro_special(m, "kwargs")) {
        JValue *d = jv_dict(A, JV_DICT);
        for (size_t k = 0; kw && k < kw->n; k++) if (!used[k]) jdict_set(A, d->dict, kw->keys[k], kw->vals[k]);
        jinja_env_set(r, scope, S("kwargs"), d);
    } else {
        for (size_t k = 0; kw && k < kw->n; k++)
            if (!used[k])
                jinja_fail(&r->c, CVLLM_EINVAL, pos, "macro '%.*s' takes no keyword argument '%.*s'",
                           (int)m->str.n, m->str.s, (int)kw->keys[k].n, kw->keys[k].s);
    }
    if (macro_special(m, "varargs")) {
        JValue *l = jv_list(A);
        for (size_t i = m->l1.n; i < npos; i++) jlist_push(A, l->list, args->v[i]);
        jinja_env_set(r, scope, S("varargs"), l);
    } else if (npos > m->l1.n) {
        jinja_fail(&r->c, CVLLM_EINVAL, pos, "macro '%.*s' takes not more than %zu argument(s)",
                   (int)m->str.n, m->str.s, m->l1.n);
    }
    for (size_t i = 0; i < npending; i++) jinja_env_set(r, scope, pending[i]->str, jinja_eval(r, pending[i]->a, scope));
    JBuf b;
    jbuf_init(&b, &r->c);
    if (exec_block(r, &m->l2, scope, &b) != ST_OK)
        jinja_fail(&r->c, CVLLM_EUNSUPPORTED, pos, "unsupported: break/continue escaping a macro");
    return jv_strref(A, jbuf_str(&b));
}

JValue *jinja_call(JRender *r, JValue *fn, JList *args, JEnv *env, size_t pos) {
    if (fn->kind != JV_FUNC)
        jinja_fail(&r->c, CVLLM_EINVAL, pos, "cannot call something that is not a function: got %s", jv_type_name(fn));
    if (fn->fn == JF_MACRO) return call_macro(r, fn, args, env, pos);
    return jinja_call_builtin(r, fn, args, pos);
}

static JValue *eval_inner(JRender *r, const JNode *n, JEnv *env) {
    JArena *A = r->c.arena;
    switch (n->kind) {
    case N_INT: return jv_int(A, n->num);
    case N_FLOAT: return jv_float(A, n->num);
    case N_STR: return jv_strref(A, n->str);
    case N_IDENT: return jinja_env_lookup(r, env, n->str.s, n->str.n);
    case N_ARRAY: case N_TUPLE: {
        JValue *l = jv_list(A);
        if (n->kind == N_TUPLE) l->flags = JV_F_TUPLE;
        for (size_t i = 0; i < n->l1.n; i++) jlist_push(A, l->list, jinja_eval(r, n->l1.v[i], env));
        return l;
    }
    case N_OBJECT: {
        JValue *d = jv_dict(A, JV_DICT);
        for (size_t i = 0; i < n->l1.n; i++) {
            JValue *k = jinja_eval(r, n->l1.v[i], env);
            if (k->kind != JV_STR)
                jinja_fail(&r->c, CVLLM_EINVAL, n->l1.v[i]->pos, "dict keys must be strings: got %s", jv_type_name(k));
            jdict_set(A, d->dict, k->str, jinja_eval(r, n->l2.v[i], env));
        }
        return d;
    }
    case N_CALL: {
        JValue *args = jv_list(A), *kw = jv_dict(A, JV_DICT);
        kw->flags = JV_F_KWARGS;
        jinja_eval_args(r, &n->l1, env, args->list, kw->dict);
        if (kw->dict->n) jlist_push(A, args->list, kw);
        JValue *fn = jinja_eval(r, n->a, env);
        return jinja_call(r, fn, args->list, env, n->a->pos);
    }
    case N_MEMBER: {
        JValue *obj = jinja_eval(r, n->a, env), *prop;
        if (n->flag && n->b->kind == N_SLICE) {
            const JNode *s = n->b;
            JValue *st = s->a ? jinja_eval(r, s->a, env) : &jv_undefined;
            JValue *sp = s->b ? jinja_eval(r, s->b, env) : &jv_undefined;
            JValue *sz = s->c ? jinja_eval(r, s->c, env) : &jv_undefined;
            return jinja_slice(r, obj, st, sp, sz, n->pos);
        }
        if (n->flag) prop = jinja_eval(r, n->b, env);
        else if (n->b->kind == N_INT) prop = jv_int(A, n->b->num);
        else prop = jv_strref(A, n->b->str);
        return jinja_member(r, obj, prop, n->pos);
    }
    case N_UNARY: {
        JValue *v = jinja_eval(r, n->a, env);
        if (n->op == OP_NOT) return jv_bool(!jv_truthy(v));
        double sign = n->op == OP_SUB ? -1 : 1;
        if (v->kind == JV_FLOAT) return jv_float(A, sign * v->num);
        if (v->kind == JV_INT) return jv_int(A, sign * v->num);
        if (v->kind == JV_BOOL) return jv_int(A, sign * v->b);
        jinja_fail(&r->c, CVLLM_EINVAL, n->pos, "unknown operator '%s' for %s", op_name(n->op), jv_type_name(v));
    }
    case N_BINARY: return eval_binary(r, n, env);
    case N_FILTER: return jinja_filter(r, jinja_eval(r, n->a, env), n, env);
    case N_TEST: {
        JValue *v = jinja_eval(r, n->a, env);
        int res = jinja_test(r, n->str.s, n->str.n, v, NULL, 1, n->pos);
        return jv_bool(n->flag ? !res : res);
    }
    case N_SELECT: return jv_truthy(jinja_eval(r, n->b, env)) ? jinja_eval(r, n->a, env) : &jv_undefined;
    case N_TERNARY:
        return jinja_eval(r, jv_truthy(jinja_eval(r, n->a, env)) ? n->b : n->c, env);
    default:
        jinja_fail(&r->c, CVLLM_EFORMAT, n->pos, "unexpected syntax here (keyword argument or statement)");
    }
}

JValue *jinja_eval(JRender *r, const JNode *n, JEnv *env) {
    if (++r->depth > r->max_depth)
        jinja_fail(&r->c, CVLLM_EINVAL, n->pos, "template recursion or nesting deeper than %d", r->max_depth);
    JValue *v = eval_inner(r, n, env);
    r->depth--;
    return v;
}

static void bind_target(JRender *r, const JNode *target, JValue *v, JEnv *env, const char *what) {
    if (target->kind == N_IDENT) {
        jinja_env_set(r, env, target->str, v);
        return;
    }
    if (v->kind != JV_LIST)
        jinja_fail(&r->c, CVLLM_EINVAL, target->pos, "cannot unpack non-iterable type %s in %s", jv_type_name(v), what);
    if (v->list->n != target->l1.n)
        jinja_fail(&r->c, CVLLM_EINVAL, target->pos, "too %s items to unpack in %s",
                   target->l1.n > v->list->n ? "few" : "many", what);
    for (size_t i = 0; i < target->l1.n; i++) {
        if (target->l1.v[i]->kind != N_IDENT)
            jinja_fail(&r->c, CVLLM_EINVAL, target->l1.v[i]->pos, "cannot unpack to a non-identifier in %s", what);
        jinja_env_set(r, env, target->l1.v[i]->str, v->list->v[i]);
    }
}

static void exec_set(JRender *r, const JNode *n, JEnv *env) {
    JValue *rhs;
    if (n->b) {
        rhs = jinja_eval(r, n->b, env);
    } else {
        JBuf b;
        jbuf_init(&b, &r->c);
        if (exec_block(r, &n->l1, env, &b) != ST_OK)
            jinja_fail(&r->c, CVLLM_EUNSUPPORTED, n->pos, "unsupported: break/continue inside a set block");
        rhs = jv_strref(r->c.arena, jbuf_str(&b));
    }
    const JNode *t = n->a;
    if (t->kind == N_IDENT || t->kind == N_TUPLE) {
        bind_target(r, t, rhs, env, "set");
    } else if (t->kind == N_MEMBER) {
        JValue *obj = jinja_eval(r, t->a, env);
        if (obj->kind != JV_NS)
            jinja_fail(&r->c, CVLLM_EINVAL, t->pos, "cannot assign an attribute of a non-namespace (%s)", jv_type_name(obj));
        if (t->flag || t->b->kind != N_IDENT)
            jinja_fail(&r->c, CVLLM_EUNSUPPORTED, t->pos, "unsupported: assignment to a subscript; use ns.name = ...");
        jdict_set(r->c.arena, obj->dict, t->b->str, rhs);
    } else {
        jinja_fail(&r->c, CVLLM_EINVAL, t->pos, "invalid left-hand side in set");
    }
}

static int exec_for(JRender *r, const JNode *n, JEnv *env, JBuf *out) {
    JArena *A = r->c.arena;
    JEnv *scope = env_new(r, env);
    const JNode *test = NULL;
    JValue *it;
    if (n->b->kind == N_SELECT) {
        it = jinja_eval(r, n->b->a, scope);
        test = n->b->b;
    } else {
        it = jinja_eval(r, n->b, scope);
    }
    if (it->kind == JV_DICT) it = jinja_dict_keys(r, it);
    if (it->kind != JV_LIST)
        jinja_fail(&r->c, CVLLM_EINVAL, n->b->pos, "expected a list or dict in for loop: got %s", jv_type_name(it));
    JList items = {0};
    for (size_t i = 0; i < it->list->n; i++) {
        JValue *cur = it->list->v[i];
        if (n->a->kind == N_TUPLE && (cur->kind != JV_LIST || (cur->flags & JV_F_TUPLE)))
            jinja_fail(&r->c, CVLLM_EINVAL, n->a->pos, "cannot unpack non-iterable type %s", jv_type_name(cur));
        if (test) {
            JEnv *ls = env_new(r, scope);
            bind_target(r, n->a, cur, ls, "for");
            if (!jv_truthy(jinja_eval(r, test, ls))) continue;
        }
        jlist_push(A, &items, cur);
    }
    int no_iteration = 1;
    for (size_t i = 0; i < items.n; i++) {
        if (r->max_iterations && ++r->iterations > r->max_iterations)
            jinja_fail(&r->c, CVLLM_EINVAL, n->pos, "more than %lld loop iterations", (long long)r->max_iterations);
        JValue *loop = jv_dict(A, JV_DICT);
        jdict_set(A, loop->dict, S("index"), jv_int(A, (double)i + 1));
        jdict_set(A, loop->dict, S("index0"), jv_int(A, (double)i));
        jdict_set(A, loop->dict, S("revindex"), jv_int(A, (double)(items.n - i)));
        jdict_set(A, loop->dict, S("revindex0"), jv_int(A, (double)(items.n - i - 1)));
        jdict_set(A, loop->dict, S("first"), jv_bool(i == 0));
        jdict_set(A, loop->dict, S("last"), jv_bool(i == items.n - 1));
        jdict_set(A, loop->dict, S("length"), jv_int(A, (double)items.n));
        jdict_set(A, loop->dict, S("previtem"), i > 0 ? items.v[i - 1] : &jv_undefined);
        jdict_set(A, loop->dict, S("nextitem"), i + 1 < items.n ? items.v[i + 1] : &jv_undefined);
        jinja_env_set(r, scope, S("loop"), loop);
        bind_target(r, n->a, items.v[i], scope, "for");
        size_t mark = out->n;
        int st = exec_block(r, &n->l1, scope, out);
        if (st != ST_OK) {
            out->n = mark; /* HF drops the interrupted iteration's output */
            out->s[mark] = 0;
            if (st == ST_BREAK) break;
            continue;
        }
        no_iteration = 0;
    }
    if (no_iteration) return exec_block(r, &n->l2, scope, out);
    return ST_OK;
}

static int exec_block(JRender *r, const JNodeList *body, JEnv *env, JBuf *out) {
    for (size_t i = 0; i < body->n; i++) {
        const JNode *n = body->v[i];
        int st = ST_OK;
        switch (n->kind) {
        case N_IF: st = exec_block(r, jv_truthy(jinja_eval(r, n->a, env)) ? &n->l1 : &n->l2, env, out); break;
        case N_FOR:
            if (++r->depth > r->max_depth)
                jinja_fail(&r->c, CVLLM_EINVAL, n->pos, "template nesting deeper than %d", r->max_depth);
            st = exec_for(r, n, env, out);
            r->depth--;
            break;
        case N_SET: exec_set(r, n, env); break;
        case N_MACRO: {
            JValue *m = jv_func(r->c.arena, JF_MACRO, NULL);
            m->macro = n;
            jinja_env_set(r, env, n->str, m);
            break;
        }
        case N_BREAK: return ST_BREAK;
        case N_CONTINUE: return ST_CONTINUE;
        case N_COMMENT: break;
        default: {
            JValue *v = jinja_eval(r, n, env);
            if (v->kind != JV_NONE && v->kind != JV_UNDEF) jv_print(&r->c, out, v, n->pos);
        }
        }
        if (st != ST_OK) return st;
    }
    return ST_OK;
}

void jinja_render(JRender *r, const JNodeList *program, JBuf *out) {
    if (exec_block(r, program, r->globals, out) != ST_OK)
        jinja_fail(&r->c, CVLLM_EINVAL, JINJA_NOPOS, "break or continue outside of a loop");
}
