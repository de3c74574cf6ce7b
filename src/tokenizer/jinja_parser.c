/* jinja_parser.c: tokens -> AST, a port of @huggingface/jinja's parser.ts (same grammar, same
 * precedence, from loosest to tightest:
 *   ternary / select (x if c else y, x if c) < or < and < not < comparisons and in / not in
 *   < + - ~ < * / // % < ** < is [not] test < | filter < unary + - < call / member / primary).
 * Node layouts (see JNode in jinja.h):
 *   N_IF a=test l1=body l2=else       N_FOR a=target b=iterable l1=body l2=else
 *   N_SET a=target b=value|NULL l1=block body   N_MACRO str=name l1=params l2=body
 *   N_MEMBER a=object b=property flag=computed  N_SLICE a=start b=stop c=step (NULL: omitted)
 *   N_CALL a=callee l1=args   N_FILTER a=operand str=name flag=has (args) l1=args
 *   N_TEST a=operand str=name flag=negated   N_SELECT a=value b=condition
 *   N_TERNARY a=condition b=then c=else   N_KWARG str=name a=value
 *   N_ARRAY / N_TUPLE l1=items   N_OBJECT l1=keys l2=values
 * Constructs HF parses but we do not run ({% call %}, {% filter %}, * and ** unpacking in calls)
 * are errors naming the construct and its position. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "tokenizer/jinja.h"

#define MAX_PARSE_DEPTH 200

typedef struct {
    JCtx *c;
    const JToken *t;
    size_t n, i;
    int depth;
} Parser;

static size_t end_pos(const Parser *P) { return P->c->src_len; }
static size_t pos_at(const Parser *P, size_t i) { return i < P->n ? P->t[i].pos : end_pos(P); }

static JNode *new_node(Parser *P, JNodeKind k, size_t pos) {
    JNode *n = jarena_alloc(P->c->arena, sizeof(JNode));
    n->kind = k;
    n->pos = pos;
    return n;
}

static void list_push(Parser *P, JNodeList *l, JNode *n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4;
        JNode **v = jarena_alloc(P->c->arena, cap * sizeof(JNode *));
        if (l->n) memcpy(v, l->v, l->n * sizeof(JNode *));
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
}

static int is(const Parser *P, JTokType t) { return P->i < P->n && P->t[P->i].type == t; }
static int str_is(JStr s, const char *w) { return s.n == strlen(w) && memcmp(s.s, w, s.n) == 0; }
static int is_ident_at(const Parser *P, size_t i, const char *name) {
    return i < P->n && P->t[i].type == T_IDENT && str_is(P->t[i].val, name);
}
static int is_ident(const Parser *P, const char *name) { return is_ident_at(P, P->i, name); }

/* {% name ... where name is one of the NULL-terminated names */
static int is_stmt(const Parser *P, const char *const *names) {
    if (!is(P, T_OPEN_STMT)) return 0;
    for (; *names; names++)
        if (is_ident_at(P, P->i + 1, *names)) return 1;
    return 0;
}

static _Noreturn void fail_here(Parser *P, const char *what) {
    if (P->i >= P->n) jinja_fail(P->c, CVLLM_EFORMAT, end_pos(P), "%s, got the end of the template", what);
    const JToken *t = &P->t[P->i];
    jinja_fail(P->c, CVLLM_EFORMAT, t->pos, "%s, got %s '%.*s'", what, jinja_token_name(t->type),
               (int)(t->val.n > 40 ? 40 : t->val.n), t->val.s);
}

static const JToken *expect(Parser *P, JTokType t, const char *what) {
    if (!is(P, t)) fail_here(P, what);
    return &P->t[P->i++];
}
static void expect_ident(Parser *P, const char *name, const char *what) {
    if (!is_ident(P, name)) fail_here(P, what);
    P->i++;
}

static void enter(Parser *P) {
    if (++P->depth > MAX_PARSE_DEPTH)
        jinja_fail(P->c, CVLLM_EFORMAT, pos_at(P, P->i), "template nested too deeply (> %d levels)",
                   MAX_PARSE_DEPTH);
}

static JNode *parse_any(Parser *P);
static JNode *parse_expression(Parser *P);
static JNode *parse_primary(Parser *P);

/* Statements until one of stop opens; fails at the end of input naming the open block. */
static void parse_body(Parser *P, JNodeList *body, const char *const *stop, const char *block,
                       size_t open_pos) {
    while (!is_stmt(P, stop)) {
        if (P->i >= P->n)
            jinja_fail(P->c, CVLLM_EFORMAT, open_pos, "unclosed '%s' block: expected {%% %s %%}",
                       block, stop[0]);
        list_push(P, body, parse_any(P));
    }
}

static void expect_end(Parser *P, const char *name) {
    expect(P, T_OPEN_STMT, "expected '{%'");
    char what[64];
    snprintf(what, sizeof what, "expected '%s'", name);
    expect_ident(P, name, what);
    expect(P, T_CLOSE_STMT, "expected '%}'");
}

static JNode *parse_sequence(Parser *P, int primary) {
    size_t pos = pos_at(P, P->i);
    JNode *first = primary ? parse_primary(P) : parse_expression(P);
    if (!is(P, T_COMMA)) return first;
    JNode *tup = new_node(P, N_TUPLE, pos);
    list_push(P, &tup->l1, first);
    while (is(P, T_COMMA)) {
        P->i++;
        list_push(P, &tup->l1, primary ? parse_primary(P) : parse_expression(P));
    }
    return tup;
}

/* Arguments "( ... )" of a call (params=0) or of a macro declaration (params=1). */
static void parse_args(Parser *P, JNodeList *args, int params) {
    expect(P, T_LPAREN, "expected '('");
    int saw_kw = 0;
    while (!is(P, T_RPAREN)) {
        if (is(P, T_POW) || (is(P, T_MUL) && str_is(P->t[P->i].val, "*")))
            jinja_fail(P->c, CVLLM_EUNSUPPORTED, P->t[P->i].pos,
                       "unsupported construct: argument unpacking with '%.*s'",
                       (int)P->t[P->i].val.n, P->t[P->i].val.s);
        size_t pos = pos_at(P, P->i);
        JNode *arg = parse_expression(P);
        if (is(P, T_EQUALS)) {
            P->i++;
            if (arg->kind != N_IDENT)
                jinja_fail(P->c, CVLLM_EFORMAT, pos, "expected an identifier before '='");
            JNode *kw = new_node(P, N_KWARG, pos);
            kw->str = arg->str;
            kw->a = parse_expression(P);
            arg = kw;
        }
        if (params) {
            if (arg->kind != N_IDENT && arg->kind != N_KWARG)
                jinja_fail(P->c, CVLLM_EFORMAT, pos, "expected an identifier for a macro parameter");
            for (size_t k = 0; k < args->n; k++)
                if (args->v[k]->str.n == arg->str.n && !memcmp(args->v[k]->str.s, arg->str.s, arg->str.n))
                    jinja_fail(P->c, CVLLM_EFORMAT, pos, "duplicate parameter name '%.*s'",
                               (int)arg->str.n, arg->str.s);
        }
        if (arg->kind == N_KWARG) saw_kw = 1;
        else if (saw_kw)
            jinja_fail(P->c, CVLLM_EFORMAT, pos, params ? "non-default argument follows default argument"
                                                       : "positional argument follows keyword argument");
        list_push(P, args, arg);
        if (is(P, T_COMMA)) P->i++;
        if (P->i >= P->n) fail_here(P, "expected ')'");
    }
    P->i++;
}

static JNode *parse_member(Parser *P, JNode *obj) {
    while (is(P, T_DOT) || is(P, T_LBRACKET)) {
        size_t pos = P->t[P->i].pos;
        int computed = P->t[P->i++].type == T_LBRACKET;
        JNode *m = new_node(P, N_MEMBER, pos);
        m->a = obj;
        m->flag = computed;
        if (computed) {
            JNode *parts[3] = {0};
            size_t np = 0;
            int slice = 0;
            while (!is(P, T_RBRACKET)) {
                if (P->i >= P->n) fail_here(P, "expected ']'");
                if (np == 3) jinja_fail(P->c, CVLLM_EFORMAT, pos, "a slice takes at most 3 parts");
                if (is(P, T_COLON)) {
                    parts[np++] = NULL;
                    P->i++;
                    slice = 1;
                } else {
                    parts[np++] = parse_expression(P);
                    if (is(P, T_COLON)) {
                        P->i++;
                        slice = 1;
                    }
                }
            }
            if (np == 0) jinja_fail(P->c, CVLLM_EFORMAT, pos, "empty subscript []");
            if (slice) {
                JNode *s = new_node(P, N_SLICE, pos);
                s->a = parts[0];
                s->b = parts[1];
                s->c = parts[2];
                m->b = s;
            } else {
                m->b = parts[0];
            }
            expect(P, T_RBRACKET, "expected ']'");
        } else {
            JNode *prop = parse_primary(P);
            if (prop->kind != N_IDENT && prop->kind != N_INT)
                jinja_fail(P->c, CVLLM_EFORMAT, prop->pos, "expected an identifier or integer after '.'");
            m->b = prop;
        }
        obj = m;
    }
    return obj;
}

static JNode *parse_call(Parser *P, JNode *callee) {
    JNode *call = new_node(P, N_CALL, pos_at(P, P->i));
    call->a = callee;
    parse_args(P, &call->l1, 0);
    JNode *e = parse_member(P, call);
    if (is(P, T_LPAREN)) e = parse_call(P, e);
    return e;
}

static JNode *parse_call_member(Parser *P) {
    JNode *m = parse_member(P, parse_primary(P));
    if (is(P, T_LPAREN)) return parse_call(P, m);
    return m;
}

static JNode *parse_unary_sign(Parser *P) {
    if ((is(P, T_UNARY) || is(P, T_ADD)) &&
        (str_is(P->t[P->i].val, "-") || str_is(P->t[P->i].val, "+"))) {
        enter(P);
        JNode *u = new_node(P, N_UNARY, P->t[P->i].pos);
        u->op = P->t[P->i++].val.s[0] == '-' ? OP_SUB : OP_ADD;
        u->a = parse_unary_sign(P);
        P->depth--;
        return u;
    }
    return parse_call_member(P);
}

static JNode *parse_filter(Parser *P) {
    JNode *operand = parse_unary_sign(P);
    while (is(P, T_PIPE)) {
        P->i++;
        JNode *name = parse_primary(P);
        if (name->kind != N_IDENT) jinja_fail(P->c, CVLLM_EFORMAT, name->pos, "expected a filter name after '|'");
        JNode *f = new_node(P, N_FILTER, name->pos);
        f->a = operand;
        f->str = name->str;
        if (is(P, T_LPAREN)) {
            f->flag = 1;
            parse_args(P, &f->l1, 0);
            if (is(P, T_DOT) || is(P, T_LBRACKET) || is(P, T_LPAREN))
                jinja_fail(P->c, CVLLM_EUNSUPPORTED, pos_at(P, P->i),
                           "unsupported construct: member access or call on a filter call");
        }
        operand = f;
    }
    return operand;
}

static JNode *parse_test(Parser *P) {
    JNode *operand = parse_filter(P);
    while (is_ident(P, "is")) {
        P->i++;
        int negate = is_ident(P, "not");
        if (negate) P->i++;
        JNode *name = parse_primary(P);
        if (name->kind != N_IDENT) jinja_fail(P->c, CVLLM_EFORMAT, name->pos, "expected a test name after 'is'");
        JNode *t = new_node(P, N_TEST, name->pos);
        t->a = operand;
        t->str = name->str;
        t->flag = negate;
        operand = t;
    }
    return operand;
}

static JNode *binary(Parser *P, JOp op, size_t pos, JNode *l, JNode *r) {
    JNode *b = new_node(P, N_BINARY, pos);
    b->op = op;
    b->a = l;
    b->b = r;
    return b;
}

static JNode *parse_power(Parser *P) {
    JNode *l = parse_test(P);
    while (is(P, T_POW)) {
        size_t pos = P->t[P->i++].pos;
        l = binary(P, OP_POW, pos, l, parse_test(P));
    }
    return l;
}

static JNode *parse_multiplicative(Parser *P) {
    JNode *l = parse_power(P);
    while (is(P, T_MUL)) {
        const JToken *t = &P->t[P->i++];
        JOp op = str_is(t->val, "*") ? OP_MUL : str_is(t->val, "/") ? OP_DIV
               : str_is(t->val, "//") ? OP_FLOORDIV : OP_MOD;
        l = binary(P, op, t->pos, l, parse_power(P));
    }
    return l;
}

static JNode *parse_additive(Parser *P) {
    JNode *l = parse_multiplicative(P);
    while (is(P, T_ADD)) {
        const JToken *t = &P->t[P->i++];
        JOp op = t->val.s[0] == '+' ? OP_ADD : t->val.s[0] == '-' ? OP_SUB : OP_CONCAT;
        l = binary(P, op, t->pos, l, parse_multiplicative(P));
    }
    return l;
}

static JNode *parse_comparison(Parser *P) {
    JNode *l = parse_additive(P);
    for (;;) {
        size_t pos = pos_at(P, P->i);
        JOp op;
        if (is_ident(P, "not") && is_ident_at(P, P->i + 1, "in")) {
            op = OP_NOT_IN;
            P->i += 2;
        } else if (is_ident(P, "in")) {
            op = OP_IN;
            P->i++;
        } else if (is(P, T_CMP)) {
            JStr v = P->t[P->i++].val;
            op = str_is(v, "==") ? OP_EQ : str_is(v, "!=") ? OP_NE : str_is(v, "<") ? OP_LT
               : str_is(v, ">") ? OP_GT : str_is(v, "<=") ? OP_LE : OP_GE;
        } else {
            return l;
        }
        l = binary(P, op, pos, l, parse_additive(P));
    }
}

static JNode *parse_not(Parser *P) {
    if (is_ident(P, "not")) {
        enter(P);
        JNode *u = new_node(P, N_UNARY, P->t[P->i++].pos);
        u->op = OP_NOT;
        u->a = parse_not(P);
        P->depth--;
        return u;
    }
    return parse_comparison(P);
}

static JNode *parse_and(Parser *P) {
    JNode *l = parse_not(P);
    while (is_ident(P, "and")) {
        size_t pos = P->t[P->i++].pos;
        l = binary(P, OP_AND, pos, l, parse_not(P));
    }
    return l;
}

static JNode *parse_or(Parser *P) {
    JNode *l = parse_and(P);
    while (is_ident(P, "or")) {
        size_t pos = P->t[P->i++].pos;
        l = binary(P, OP_OR, pos, l, parse_and(P));
    }
    return l;
}

static JNode *parse_expression(Parser *P) {
    enter(P);
    JNode *a = parse_or(P);
    if (is_ident(P, "if")) {
        size_t pos = P->t[P->i++].pos;
        JNode *test = parse_or(P);
        if (is_ident(P, "else")) {
            P->i++;
            JNode *t = new_node(P, N_TERNARY, pos);
            t->a = test;
            t->b = a;
            t->c = parse_expression(P);
            a = t;
        } else {
            JNode *s = new_node(P, N_SELECT, pos);
            s->a = a;
            s->b = test;
            a = s;
        }
    }
    P->depth--;
    return a;
}

static JNode *parse_primary(Parser *P) {
    if (P->i >= P->n) fail_here(P, "expected an expression");
    const JToken *t = &P->t[P->i++];
    switch (t->type) {
    case T_NUM: {
        int is_float = memchr(t->val.s, '.', t->val.n) != NULL;
        JNode *n = new_node(P, is_float ? N_FLOAT : N_INT, t->pos);
        char tmp[64];
        size_t k = t->val.n < sizeof tmp - 1 ? t->val.n : sizeof tmp - 1;
        memcpy(tmp, t->val.s, k);
        tmp[k] = 0;
        n->num = t->val.n < sizeof tmp - 1 ? strtod(tmp, NULL) : (tmp[0] == '-' ? -1.0 / 0.0 : 1.0 / 0.0);
        return n;
    }
    case T_STR: {
        JNode *n = new_node(P, N_STR, t->pos);
        n->str = t->val;
        if (is(P, T_STR)) { /* adjacent literals concatenate */
            JBuf b;
            jbuf_init(&b, P->c);
            jbuf_put(&b, t->val.s, t->val.n);
            while (is(P, T_STR)) jbuf_put(&b, P->t[P->i].val.s, P->t[P->i].val.n), P->i++;
            n->str = jbuf_str(&b);
        }
        return n;
    }
    case T_IDENT: {
        JNode *n = new_node(P, N_IDENT, t->pos);
        n->str = t->val;
        return n;
    }
    case T_LPAREN: {
        JNode *e = parse_sequence(P, 0);
        expect(P, T_RPAREN, "expected ')'");
        return e;
    }
    case T_LBRACKET: {
        JNode *arr = new_node(P, N_ARRAY, t->pos);
        while (!is(P, T_RBRACKET)) {
            list_push(P, &arr->l1, parse_expression(P));
            if (is(P, T_COMMA)) P->i++;
        }
        P->i++;
        return arr;
    }
    case T_LBRACE: {
        JNode *obj = new_node(P, N_OBJECT, t->pos);
        while (!is(P, T_RBRACE)) {
            list_push(P, &obj->l1, parse_expression(P));
            expect(P, T_COLON, "expected ':' in a dict literal");
            list_push(P, &obj->l2, parse_expression(P));
            if (is(P, T_COMMA)) P->i++;
        }
        P->i++;
        return obj;
    }
    default:
        P->i--;
        fail_here(P, "expected an expression");
    }
}

static const char *const STOP_IF[] = {"endif", "elif", "else", NULL};
static const char *const STOP_ENDIF[] = {"endif", NULL};
static const char *const STOP_FOR[] = {"endfor", "else", NULL};
static const char *const STOP_ENDFOR[] = {"endfor", NULL};
static const char *const STOP_MACRO[] = {"endmacro", NULL};
static const char *const STOP_SET[] = {"endset", NULL};

static JNode *parse_if(Parser *P, size_t pos) {
    JNode *n = new_node(P, N_IF, pos);
    n->a = parse_expression(P);
    expect(P, T_CLOSE_STMT, "expected '%}' after the if condition");
    parse_body(P, &n->l1, STOP_IF, "if", pos);
    if (is_stmt(P, (const char *const[]){"elif", NULL})) {
        size_t epos = P->t[P->i + 1].pos;
        P->i += 2;
        enter(P);
        list_push(P, &n->l2, parse_if(P, epos));
        P->depth--;
    } else if (is_stmt(P, (const char *const[]){"else", NULL})) {
        P->i += 2;
        expect(P, T_CLOSE_STMT, "expected '%}' after else");
        parse_body(P, &n->l2, STOP_ENDIF, "if", pos);
    }
    return n;
}

static JNode *parse_statement(Parser *P) {
    size_t open_pos = P->t[P->i].pos;
    P->i++; /* {% */
    if (!is(P, T_IDENT)) fail_here(P, "expected a statement name after '{%'");
    const JToken *name = &P->t[P->i++];
    size_t pos = name->pos;
    JNode *n;
    enter(P);
    if (str_is(name->val, "set")) {
        n = new_node(P, N_SET, pos);
        n->a = parse_sequence(P, 0);
        if (is(P, T_EQUALS)) {
            P->i++;
            n->b = parse_sequence(P, 0);
        } else {
            expect(P, T_CLOSE_STMT, "expected '=' or '%}' in set");
            parse_body(P, &n->l1, STOP_SET, "set", pos);
            P->i++;
            expect_ident(P, "endset", "expected 'endset'");
        }
        expect(P, T_CLOSE_STMT, "expected '%}'");
    } else if (str_is(name->val, "if")) {
        n = parse_if(P, pos);
        expect_end(P, "endif");
    } else if (str_is(name->val, "for")) {
        n = new_node(P, N_FOR, pos);
        n->a = parse_sequence(P, 1);
        if (n->a->kind != N_IDENT && n->a->kind != N_TUPLE)
            jinja_fail(P->c, CVLLM_EFORMAT, n->a->pos, "expected a loop variable or tuple");
        expect_ident(P, "in", "expected 'in' after the loop variable");
        n->b = parse_expression(P);
        expect(P, T_CLOSE_STMT, "expected '%}' after the for header");
        parse_body(P, &n->l1, STOP_FOR, "for", pos);
        if (is_stmt(P, (const char *const[]){"else", NULL})) {
            P->i += 2;
            expect(P, T_CLOSE_STMT, "expected '%}' after else");
            parse_body(P, &n->l2, STOP_ENDFOR, "for", pos);
        }
        expect_end(P, "endfor");
    } else if (str_is(name->val, "macro")) {
        n = new_node(P, N_MACRO, pos);
        JNode *id = parse_primary(P);
        if (id->kind != N_IDENT) jinja_fail(P->c, CVLLM_EFORMAT, id->pos, "expected a macro name");
        n->str = id->str;
        parse_args(P, &n->l1, 1);
        expect(P, T_CLOSE_STMT, "expected '%}' after the macro header");
        parse_body(P, &n->l2, STOP_MACRO, "macro", pos);
        expect_end(P, "endmacro");
    } else if (str_is(name->val, "break") || str_is(name->val, "continue")) {
        n = new_node(P, name->val.s[0] == 'b' ? N_BREAK : N_CONTINUE, pos);
        expect(P, T_CLOSE_STMT, "expected '%}'");
    } else if (str_is(name->val, "call") || str_is(name->val, "filter")) {
        jinja_fail(P->c, CVLLM_EUNSUPPORTED, pos, "unsupported construct: {%% %.*s %%} block",
                   (int)name->val.n, name->val.s);
    } else if (name->val.n >= 3 && (!memcmp(name->val.s, "end", 3) || str_is(name->val, "elif") ||
                                     str_is(name->val, "else"))) {
        jinja_fail(P->c, CVLLM_EFORMAT, open_pos, "unexpected {%% %.*s %%} (no matching open block)",
                   (int)(name->val.n > 40 ? 40 : name->val.n), name->val.s);
    } else {
        jinja_fail(P->c, CVLLM_EUNSUPPORTED, open_pos, "unsupported or unknown statement '%.*s'",
                   (int)(name->val.n > 40 ? 40 : name->val.n), name->val.s);
    }
    P->depth--;
    return n;
}

static JNode *parse_any(Parser *P) {
    const JToken *t = &P->t[P->i];
    switch (t->type) {
    case T_COMMENT: {
        P->i++;
        return new_node(P, N_COMMENT, t->pos);
    }
    case T_TEXT: {
        JNode *n = new_node(P, N_STR, t->pos);
        n->str = t->val;
        P->i++;
        return n;
    }
    case T_OPEN_STMT:
        return parse_statement(P);
    case T_OPEN_EXPR: {
        P->i++;
        JNode *e = parse_expression(P);
        expect(P, T_CLOSE_EXPR, "expected '}}'");
        return e;
    }
    default:
        fail_here(P, "unexpected token");
    }
}

JNodeList jinja_parse(JCtx *c, const JToken *toks, size_t n) {
    Parser P = {c, toks, n, 0, 0};
    JNodeList prog = {0};
    while (P.i < P.n) list_push(&P, &prog, parse_any(&P));
    return prog;
}
