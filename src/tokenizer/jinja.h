/* jinja.h: internals of the Jinja chat-template engine behind chat_template.h, layered as
 *   jinja_lexer.c    source -> tokens (HF's preprocessing: trim_blocks, lstrip_blocks, {%- -%})
 *   jinja_parser.c   tokens -> AST (JNode), same grammar and precedence as @huggingface/jinja
 *   jinja_value.c    arena, buffers, the value type (JValue), JS-compatible printing / JSON / ==
 *   jinja_eval.c     the interpreter: scopes, statements, operators, macros
 *   jinja_builtins.c member access, slicing, string / dict methods, globals (namespace, range)
 *   jinja_filters.c  filters and tests
 * The reference is @huggingface/jinja 0.5.11 (tests/js): its values are JavaScript values, so
 * numbers are doubles, strings print like JS, `==` is JS loose equality, and so on; we copy that.
 *
 * Memory: everything made while compiling or rendering lives in one arena (JArena) freed at the
 * end, so errors can unwind with longjmp (jinja_fail) without leaking. Limits (memory, output
 * size, loop iterations, nesting depth) turn runaway templates into errors. */
#ifndef CVLLM_JINJA_H
#define CVLLM_JINJA_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *s;
    size_t n;
} JStr;

/* ---- arena and errors ---- */

typedef struct JArenaBlock JArenaBlock;
typedef struct JCtx JCtx;

typedef struct {
    JArenaBlock *head;
    size_t total; /* bytes allocated so far */
    size_t limit; /* fail (jinja_fail) beyond this; 0: no limit */
    JCtx *ctx;
} JArena;

/* The error context shared by lexer, parser and interpreter. */
struct JCtx {
    jmp_buf jb;
    JArena *arena;
    const char *src; /* original template source, for line:column in messages */
    size_t src_len;
    size_t max_output; /* any buffer longer than this fails */
};

/* Sets the error message "line L, column C: <fmt>" (pos = byte offset into the original source;
 * (size_t)-1: no position) and longjmps to ctx->jb with code. */
_Noreturn void jinja_fail(JCtx *c, int code, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define JINJA_NOPOS ((size_t)-1)

void *jarena_alloc(JArena *a, size_t n); /* zeroed */
char *jarena_strndup(JArena *a, const char *s, size_t n);
void jarena_free(JArena *a); /* frees all blocks; the arena can be reused */

/* A byte buffer in the arena; fails when longer than ctx->max_output. Always NUL-terminated. */
typedef struct {
    JCtx *c;
    char *s;
    size_t n, cap;
} JBuf;
void jbuf_init(JBuf *b, JCtx *c);
void jbuf_put(JBuf *b, const char *s, size_t n);
void jbuf_puts(JBuf *b, const char *s);
void jbuf_putc(JBuf *b, char ch);
JStr jbuf_str(const JBuf *b);

/* ---- lexer ---- */

typedef enum {
    T_TEXT, T_NUM, T_STR, T_IDENT, T_EQUALS, T_LPAREN, T_RPAREN, T_OPEN_STMT, T_CLOSE_STMT,
    T_OPEN_EXPR, T_CLOSE_EXPR, T_LBRACKET, T_RBRACKET, T_LBRACE, T_RBRACE, T_COMMA, T_DOT,
    T_COLON, T_PIPE, T_ADD, T_MUL, T_POW, T_CMP, T_UNARY, T_COMMENT,
} JTokType;

typedef struct {
    JTokType type;
    JStr val;   /* decoded text (string literals unescaped) */
    size_t pos; /* byte offset in the original source */
} JToken;

/* Tokenizes src with @huggingface/jinja's settings (lstrip_blocks, trim_blocks). */
void jinja_tokenize(JCtx *c, const char *src, size_t n, JToken **out, size_t *count);
const char *jinja_token_name(JTokType t);

/* ---- AST ---- */

typedef enum {
    /* statements */
    N_IF, N_FOR, N_SET, N_MACRO, N_BREAK, N_CONTINUE, N_COMMENT,
    /* expressions */
    N_INT, N_FLOAT, N_STR, N_IDENT, N_ARRAY, N_TUPLE, N_OBJECT, N_MEMBER, N_SLICE, N_CALL,
    N_BINARY, N_UNARY, N_FILTER, N_TEST, N_SELECT, N_TERNARY, N_KWARG,
} JNodeKind;

typedef enum {
    OP_AND, OP_OR, OP_NOT, OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE, OP_IN, OP_NOT_IN,
    OP_ADD, OP_SUB, OP_CONCAT, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
} JOp;

typedef struct JNode JNode;
typedef struct {
    JNode **v;
    size_t n, cap;
} JNodeList;

struct JNode {
    JNodeKind kind;
    size_t pos;
    JOp op;         /* N_BINARY, N_UNARY */
    JStr str;       /* N_STR value; N_IDENT / N_FILTER / N_TEST / N_KWARG / N_MACRO name */
    double num;     /* N_INT, N_FLOAT */
    int flag;       /* N_MEMBER: computed; N_TEST: negated; N_FILTER: called with (args) */
    JNode *a, *b, *c; /* children: see jinja_parser.c for each kind */
    JNodeList l1, l2; /* bodies, arguments, items, object keys (l1) and values (l2) */
};

/* Parses tokens into a program (list of statements). Fails via jinja_fail. */
JNodeList jinja_parse(JCtx *c, const JToken *toks, size_t n);

/* ---- values ---- */

typedef enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_FUNC,
} JvKind;

enum { JV_F_TUPLE = 1, JV_F_KWARGS = 2 }; /* list that is a tuple; dict of keyword arguments */

typedef struct JValue JValue;
typedef struct {
    JValue **v;
    size_t n, cap;
} JList;
typedef struct {
    JStr *keys;
    JValue **vals;
    size_t n, cap;
} JDict;

typedef enum {
    JF_MACRO, JF_NAMESPACE, JF_RAISE, JF_RANGE, JF_STRFTIME,
    JF_S_UPPER, JF_S_LOWER, JF_S_STRIP, JF_S_TITLE, JF_S_CAPITALIZE, JF_S_RSTRIP, JF_S_LSTRIP,
    JF_S_STARTSWITH, JF_S_ENDSWITH, JF_S_SPLIT, JF_S_REPLACE,
    JF_D_GET, JF_D_ITEMS, JF_D_KEYS, JF_D_VALUES, JF_D_DICTSORT,
} JFunc;

struct JValue {
    JvKind kind;
    int flags;
    int b;        /* JV_BOOL */
    double num;   /* JV_INT, JV_FLOAT (JS numbers: both are doubles) */
    JStr str;     /* JV_STR (UTF-8) */
    JList *list;  /* JV_LIST */
    JDict *dict;  /* JV_DICT, JV_NS */
    JFunc fn;     /* JV_FUNC */
    JValue *self; /* JV_FUNC method: the receiver */
    const JNode *macro;
};

extern JValue jv_undefined, jv_none, jv_true, jv_false;

JValue *jv_bool(int b);
JValue *jv_int(JArena *a, double v);
JValue *jv_float(JArena *a, double v);
JValue *jv_str(JArena *a, const char *s, size_t n); /* copies */
JValue *jv_strref(JArena *a, JStr s);               /* no copy: s must outlive the render */
JValue *jv_list(JArena *a);
JValue *jv_dict(JArena *a, JvKind kind); /* JV_DICT or JV_NS */
JValue *jv_func(JArena *a, JFunc fn, JValue *self);
void jlist_push(JArena *a, JList *l, JValue *v);
JValue *jdict_get(const JDict *d, const char *k, size_t n); /* NULL if absent */
void jdict_set(JArena *a, JDict *d, JStr k, JValue *v);     /* keeps insertion order */

int jv_truthy(const JValue *v);
const char *jv_type_name(const JValue *v); /* HF's names: "StringValue", ... */

/* JS Number::toString. buf >= 32 bytes. */
void js_number_str(double v, char *buf);
/* RuntimeValue.toString() (what {{ v }} prints). Fails for functions and tuples. */
void jv_print(JCtx *c, JBuf *b, const JValue *v, size_t pos);
/* String(v.value) in JS (used by ~, + with strings and join); null/undefined print as "". */
void jv_raw_print(JCtx *c, JBuf *b, const JValue *v, size_t pos);

typedef struct {
    int indent; /* 0: none */
    int ensure_ascii, sort_keys;
    const char *item_sep, *key_sep; /* NULL: defaults */
    int undefined_as_null;
} JJsonOpts;
void jv_to_json(JCtx *c, JBuf *b, const JValue *v, const JJsonOpts *o, int depth, size_t pos);

int jv_loose_eq(JCtx *c, const JValue *a, const JValue *b, size_t pos);  /* JS == on .value */
int jv_strict_eq(const JValue *a, const JValue *b);                      /* JS === on .value */

/* ---- UTF-8 / JavaScript string helpers ---- */
size_t utf8_next(const char *s, size_t n, size_t i, uint32_t *cp); /* bytes of the char at i */
size_t js_space_len(const char *s, size_t n, size_t i);   /* JS \s at i: its byte length or 0 */
size_t js_space_len_before(const char *s, size_t i);      /* JS \s ending at i: length or 0 */
JStr js_trim(JStr s, int left, int right);
size_t js_utf16_len(JStr s);
void js_case(JBuf *b, JStr s, int upper); /* toUpperCase / toLowerCase */
double js_to_number(JStr s);              /* Number("...") */

/* ---- interpreter ---- */

typedef struct JEnv JEnv;
struct JEnv {
    JEnv *parent;
    JDict vars;
};

typedef struct {
    JCtx c;
    JEnv *globals;
    int64_t iterations, max_iterations;
    int depth, max_depth;
} JRender;

/* Renders program into out. Fails via jinja_fail. */
void jinja_render(JRender *r, const JNodeList *program, JBuf *out);
JValue *jinja_eval(JRender *r, const JNode *n, JEnv *env);
JValue *jinja_env_lookup(JRender *r, JEnv *env, const char *name, size_t n);
void jinja_env_set(JRender *r, JEnv *env, JStr name, JValue *v);
/* Evaluates call arguments HF's way: positional values, then keyword args in one dict. */
void jinja_eval_args(JRender *r, const JNodeList *args, JEnv *env, JList *pos, JDict *kw);
/* Calls a function value with args (a trailing JV_F_KWARGS dict holds keyword arguments). */
JValue *jinja_call(JRender *r, JValue *fn, JList *args, JEnv *env, size_t pos);

/* jinja_builtins.c / jinja_filters.c */
JValue *jinja_filter(JRender *r, JValue *operand, const JNode *filter, JEnv *env);
int jinja_test(JRender *r, const char *name, size_t n, JValue *operand, JValue *arg, int nargs,
               size_t pos);
JValue *jinja_call_builtin(JRender *r, JValue *fn, JList *args, size_t pos);
JValue *jinja_member(JRender *r, JValue *obj, JValue *prop, size_t pos);
JValue *jinja_slice(JRender *r, JValue *obj, JValue *start, JValue *stop, JValue *step,
                    size_t pos);
JValue *jinja_dict_keys(JRender *r, JValue *d);
JValue *jinja_dict_items(JRender *r, JValue *d);

/* helpers shared by jinja_builtins.c and jinja_filters.c */
typedef struct {
    JValue *key; /* what is compared */
    JValue *item;
} SortEntry;
JValue *jinja_builtin_member(JRender *r, JValue *obj, JStr name); /* str/list/dict methods; NULL */
JStr *jinja_code_points(JRender *r, JStr s, size_t *count);       /* Array.from(str) */
void jinja_sort_entries(JRender *r, SortEntry *v, size_t n, int case_sensitive, int reverse, size_t pos);
JValue *jinja_attribute_path(JRender *r, JValue *item, JStr path); /* "a.b.0" */
JValue *jinja_str_title(JRender *r, JStr s, int capitalize_only);
JValue *jinja_str_indent(JRender *r, JStr s, double width, int first, int blank);
double js_parse_number(JStr s, int integer); /* parseInt(s, 10) / parseFloat(s); NaN if none */
JValue *jinja_kwarg(JDict *kw, const char *name);
int jinja_num_like(const JValue *v); /* int, float or bool */

#endif
