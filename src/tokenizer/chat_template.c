/* chat_template.c: the public face of the Jinja engine (chat_template.h). Compiling tokenizes and
 * parses into an AST kept in the template's arena; rendering converts the JSON variables into
 * values the way @huggingface/jinja receives them from JavaScript (integral numbers are integers,
 * object keys that are array indices come first, as Object.entries orders them), declares the
 * globals HF declares, and runs the interpreter in a per-render arena freed at the end. */
#include <string.h>

#include "common.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"

struct ChatTemplate {
    JArena arena; /* tokens and AST */
    JNodeList program;
    char *src; /* copy of the source: AST strings point into the arena, messages quote lines */
    size_t src_len;
};

void chat_template_free(ChatTemplate *t) {
    if (!t) return;
    jarena_free(&t->arena);
    free(t->src);
    free(t);
}

int chat_template_compile_n(const char *source, size_t n, ChatTemplate **out) {
    *out = NULL;
    if (!source) return cvllm_errorf(CVLLM_EINVAL, "chat template: no source");
    ChatTemplate *volatile t = xcalloc(1, sizeof(ChatTemplate));
    t->src = xmalloc(n + 1);
    memcpy(t->src, source, n);
    t->src[n] = 0;
    t->src_len = n;
    JCtx c = {0};
    c.arena = &t->arena;
    c.src = t->src;
    c.src_len = n;
    t->arena.ctx = &c;
    t->arena.limit = (size_t)1 << 30;
    int code = setjmp(c.jb);
    if (code) {
        chat_template_free(t);
        return code;
    }
    JToken *toks;
    size_t ntok;
    jinja_tokenize(&c, t->src, n, &toks, &ntok);
    t->program = jinja_parse(&c, toks, ntok);
    t->arena.ctx = NULL;
    *out = t;
    return CVLLM_OK;
}

int chat_template_compile(const char *source, ChatTemplate **out) {
    return chat_template_compile_n(source, source ? strlen(source) : 0, out);
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

int chat_template_check_inputs(const json_t *messages, const json_t *tools) {
    if (!json_is_array(messages))
        return cvllm_errorf(CVLLM_EINVAL, "messages must be an array of messages, got %s",
                            json_kind(messages));
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const json_t *m = json_array_get(messages, i), *role, *calls;
        if (!json_is_object(m))
            return cvllm_errorf(CVLLM_EINVAL, "messages[%zu] must be an object, got %s", i, json_kind(m));
        role = json_object_get(m, "role");
        if (!json_is_string(role))
            return cvllm_errorf(CVLLM_EINVAL, "messages[%zu]: \"role\" must be a string, got %s", i,
                                role ? json_kind(role) : "none");
        calls = json_object_get(m, "tool_calls");
        if (calls && !json_is_array(calls) && !json_is_null(calls))
            return cvllm_errorf(CVLLM_EINVAL, "messages[%zu]: \"tool_calls\" must be an array, got %s", i,
                                json_kind(calls));
    }
    if (!tools) return 0;
    if (!json_is_array(tools))
        return cvllm_errorf(CVLLM_EINVAL, "tools must be an array of tool definitions, got %s",
                            json_kind(tools));
    for (size_t i = 0; i < json_array_size(tools); i++)
        if (!json_is_object(json_array_get(tools, i)))
            return cvllm_errorf(CVLLM_EINVAL, "tools[%zu] must be an object, got %s", i,
                                json_kind(json_array_get(tools, i)));
    return 0;
}

void chat_template_limits_default(ChatTemplateLimits *l) {
    l->max_output = (size_t)64 << 20;
    l->max_memory = (size_t)1 << 30;
    l->max_iterations = 10 * 1000 * 1000;
    l->max_depth = 400;
}

/* "0", "17": keys that JS objects list first, in numeric order. */
static int array_index_key(const char *k, size_t n, double *v) {
    if (n == 0 || n > 10 || (n > 1 && k[0] == '0')) return 0;
    double x = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9') return 0;
        x = x * 10 + (k[i] - '0');
    }
    *v = x;
    return x < 4294967295.0;
}

static JValue *from_json(JRender *r, json_t *j) {
    JArena *A = r->c.arena;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        JValue *d = jv_dict(A, JV_DICT);
        size_t n = json_object_size(j), k = 0, nidx = 0;
        const char **keys = jarena_alloc(A, (n + 1) * sizeof(char *));
        double *num = jarena_alloc(A, (n + 1) * sizeof(double));
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) { /* array-index keys first, ascending (insertion sort) */
            double x;
            if (array_index_key(key, strlen(key), &x)) {
                size_t p = nidx++;
                for (; p > 0 && num[p - 1] > x; p--) keys[p] = keys[p - 1], num[p] = num[p - 1];
                keys[p] = key;
                num[p] = x;
            }
        }
        k = nidx;
        json_object_foreach(j, key, v) {
            double x;
            if (!array_index_key(key, strlen(key), &x)) keys[k++] = key;
        }
        for (size_t i = 0; i < k; i++) {
            size_t kl = strlen(keys[i]);
            jdict_set(A, d->dict, (JStr){jarena_strndup(A, keys[i], kl), kl}, from_json(r, json_object_get(j, keys[i])));
        }
        return d;
    }
    case JSON_ARRAY: {
        JValue *l = jv_list(A);
        for (size_t i = 0; i < json_array_size(j); i++) jlist_push(A, l->list, from_json(r, json_array_get(j, i)));
        return l;
    }
    case JSON_STRING: return jv_str(A, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int(A, (double)json_integer_value(j));
    case JSON_REAL: {
        double x = json_real_value(j);
        return x == (double)(long long)x ? jv_int(A, x) : jv_float(A, x);
    }
    case JSON_TRUE: return &jv_true;
    case JSON_FALSE: return &jv_false;
    default: return &jv_none;
    }
}

static JStr S(const char *s) { return (JStr){s, strlen(s)}; }

/* Declares HF's globals, then the variables (redeclaring one is an error, as in HF), and renders. */
static void declare_and_render(JRender *r, const ChatTemplate *t, json_t *vars, JBuf *b) {
    if (vars && !json_is_object(vars)) jinja_fail(&r->c, CVLLM_EINVAL, JINJA_NOPOS, "variables must be a JSON object");
    JEnv *g = jarena_alloc(r->c.arena, sizeof(JEnv));
    jinja_env_set(r, g, S("namespace"), jv_func(r->c.arena, JF_NAMESPACE, NULL));
    jinja_env_set(r, g, S("false"), &jv_false);
    jinja_env_set(r, g, S("true"), &jv_true);
    jinja_env_set(r, g, S("none"), &jv_none);
    jinja_env_set(r, g, S("raise_exception"), jv_func(r->c.arena, JF_RAISE, NULL));
    jinja_env_set(r, g, S("range"), jv_func(r->c.arena, JF_RANGE, NULL));
    jinja_env_set(r, g, S("strftime_now"), jv_func(r->c.arena, JF_STRFTIME, NULL));
    jinja_env_set(r, g, S("True"), &jv_true);
    jinja_env_set(r, g, S("False"), &jv_false);
    jinja_env_set(r, g, S("None"), &jv_none);
    if (vars) {
        const char *key;
        json_t *v;
        json_object_foreach(vars, key, v) {
            size_t kl = strlen(key);
            if (jdict_get(&g->vars, key, kl))
                jinja_fail(&r->c, CVLLM_EINVAL, JINJA_NOPOS, "variable already declared: %s", key);
            jinja_env_set(r, g, (JStr){jarena_strndup(r->c.arena, key, kl), kl}, from_json(r, v));
        }
    }
    r->globals = g;
    jbuf_init(b, &r->c);
    jinja_render(r, &t->program, b);
}

int chat_template_render_ex(const ChatTemplate *t, json_t *vars, const ChatTemplateLimits *lim,
                            char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    ChatTemplateLimits def;
    if (!lim) chat_template_limits_default(&def), lim = &def;
    JArena arena = {0};
    JRender r;
    memset(&r, 0, sizeof r);
    r.c.arena = &arena;
    r.c.src = t->src;
    r.c.src_len = t->src_len;
    r.c.max_output = lim->max_output;
    r.max_iterations = lim->max_iterations;
    r.max_depth = lim->max_depth;
    arena.ctx = &r.c;
    arena.limit = lim->max_memory;
    int code = setjmp(r.c.jb);
    if (code) {
        jarena_free(&arena);
        return code;
    }
    JBuf b;
    declare_and_render(&r, t, vars, &b);
    *out = xmalloc(b.n + 1);
    memcpy(*out, b.s, b.n + 1);
    if (out_len) *out_len = b.n;
    jarena_free(&arena);
    return CVLLM_OK;
}

int chat_template_render(const ChatTemplate *t, json_t *vars, char **out) {
    return chat_template_render_ex(t, vars, NULL, out, NULL);
}
