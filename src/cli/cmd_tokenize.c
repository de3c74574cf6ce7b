/* cmd_tokenize.c: `cvllm tokenize` (text -> ids) and `cvllm detokenize` (ids -> text). They need
 * only the tokenizer files of MODEL_DIR (tokenizer.json, optional tokenizer_config.json). No special
 * tokens are added; special tokens written in the text are matched.
 *
 *   cvllm tokenize MODEL_DIR --text T [--output csv|json]
 *   cvllm tokenize MODEL_DIR --input-jsonl F [--output csv|json]   (F: one JSON string per line)
 *   cvllm detokenize MODEL_DIR --ids 1,2,3 [--skip-special-tokens]
 *   cvllm detokenize MODEL_DIR --input-jsonl F [--skip-special-tokens]
 *                                  (F: one JSON id array per line; prints one JSON string per line)
 * Exit codes: 0 ok, 1 runtime error (bad files, invalid UTF-8, a bad line), 2 usage. Ids past the
 * tokenizer's vocabulary (a model's padding ids) decode as no text, as in Hugging Face. */
#include <jansson.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common.h"
#include "tokenizer/tokenizer.h"

static void tokenize_usage(FILE *f) {
    fprintf(f, "usage: cvllm tokenize MODEL_DIR (--text T | --input-jsonl F) [--output csv|json]\n"
               "  --text T          the text to encode (UTF-8)\n"
               "  --input-jsonl F   one JSON string per line ('-' = stdin)\n"
               "  --output csv|json csv (default): ids comma-separated, one line per text;\n"
               "                    json: an id array (with --input-jsonl: an array of id arrays)\n"
               "No special tokens are added; special tokens in the text are matched.\n");
}

static void detokenize_usage(FILE *f) {
    fprintf(f, "usage: cvllm detokenize MODEL_DIR (--ids 1,2,3 | --input-jsonl F) "
               "[--skip-special-tokens]\n"
               "  --ids LIST             token ids separated by commas, no spaces (1,2,3); prints\n"
               "                         the text (ids past the tokenizer's vocabulary: no text)\n"
               "  --input-jsonl F        one JSON id array per line ('-' = stdin); prints one JSON\n"
               "                         string per line\n"
               "  --skip-special-tokens  drop special tokens\n");
}

static void print_ids(const int32_t *ids, int n, int json) {
    if (json) putchar('[');
    for (int i = 0; i < n; i++) printf(i ? (json ? ", %d" : ",%d") : "%d", ids[i]);
    if (json) putchar(']');
}

typedef struct {
    const Tokenizer *t;
    int json, count;
} TokArgs;

static int tokenize_line(void *arg, const char *line, size_t n, long lineno) {
    TokArgs *a = arg;
    json_t *v = cli_jsonl_parse(line, n, lineno); /* refuses a NUL character, raw or \u0000 */
    if (!v) {
        fprintf(stderr, "cvllm tokenize: %s\n", cvllm_last_error());
        return 1;
    }
    if (!json_is_string(v)) {
        fprintf(stderr, "cvllm tokenize: line %ld: not a JSON string\n", lineno);
        json_decref(v);
        return 1;
    }
    int32_t *ids;
    int k = tokenizer_encode(a->t, json_string_value(v), json_string_length(v), &ids);
    json_decref(v);
    if (k < 0) {
        fprintf(stderr, "cvllm tokenize: line %ld: %s\n", lineno, cvllm_last_error());
        return 1;
    }
    if (a->json) fputs(a->count ? ",\n " : "[", stdout);
    print_ids(ids, k, a->json);
    if (!a->json) putchar('\n');
    a->count++;
    free(ids);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL, *jsonl = NULL, *output = "csv";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tokenize_usage(stdout);
            return 0;
        }
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--text") && has_val) text = argv[++i];
        else if (!strcmp(a, "--input-jsonl") && has_val) jsonl = argv[++i];
        else if (!strcmp(a, "--output") && has_val) output = argv[++i];
        else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "cvllm tokenize: unknown option or missing value: %s\n", a);
            tokenize_usage(stderr);
            return 2;
        } else if (!dir) dir = a;
        else {
            fprintf(stderr, "cvllm tokenize: unexpected argument: %s\n", a);
            return 2;
        }
    }
    if (!dir || (!text == !jsonl) || (strcmp(output, "csv") && strcmp(output, "json"))) {
        fprintf(stderr, "cvllm tokenize: need MODEL_DIR and exactly one of --text / --input-jsonl; "
                        "--output is csv or json\n");
        tokenize_usage(stderr);
        return 2;
    }
    Tokenizer *t;
    if (tokenizer_load(dir, &t) < 0) {
        fprintf(stderr, "cvllm tokenize: %s\n", cvllm_last_error());
        return 1;
    }
    int json = !strcmp(output, "json"), rc = 0;
    if (text) {
        int32_t *ids;
        int n = tokenizer_encode(t, text, strlen(text), &ids);
        if (n < 0) {
            fprintf(stderr, "cvllm tokenize: %s\n", cvllm_last_error());
            rc = 1;
        } else {
            print_ids(ids, n, json);
            putchar('\n');
            free(ids);
        }
    } else {
        TokArgs a = {t, json, 0};
        rc = cli_each_line(jsonl, 1, tokenize_line, &a);
        if (rc < 0) fprintf(stderr, "cvllm tokenize: --input-jsonl: %s\n", cvllm_last_error());
        rc = rc != 0;
        if (rc == 0 && json) puts(a.count ? "]" : "[]");
    }
    tokenizer_free(t);
    return rc;
}

/* ---------------------------------------------------------------- detokenize */

typedef struct {
    const Tokenizer *t;
    int skip;
} DetokArgs;

static int detokenize_line(void *arg, const char *line, size_t n, long lineno) {
    DetokArgs *a = arg;
    json_t *v = cli_jsonl_parse(line, n, lineno), *x;
    if (!v) {
        fprintf(stderr, "cvllm detokenize: %s\n", cvllm_last_error());
        return 1;
    }
    if (!json_is_array(v) || json_array_size(v) > INT32_MAX) {
        fprintf(stderr, "cvllm detokenize: line %ld: not a JSON array of token ids\n", lineno);
        json_decref(v);
        return 1;
    }
    size_t k = json_array_size(v), i;
    int32_t *ids = xmalloc((k + 1) * sizeof(int32_t));
    json_array_foreach(v, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            fprintf(stderr, "cvllm detokenize: line %ld: [%zu] is not a token id (an integer in [0, %d])\n",
                    lineno, i, INT32_MAX);
            free(ids);
            json_decref(v);
            return 1;
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    json_decref(v);
    size_t len;
    char *s = tokenizer_decode_len(a->t, ids, (int)k, a->skip, &len);
    free(ids);
    if (!s) {
        fprintf(stderr, "cvllm detokenize: line %ld: %s\n", lineno, cvllm_last_error());
        return 1;
    }
    json_t *js = json_stringn(s, len);
    char *dump = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
    free(s);
    json_decref(js);
    if (!dump) {
        fprintf(stderr, "cvllm detokenize: line %ld: cannot encode the text as JSON\n", lineno);
        return 1;
    }
    puts(dump);
    free(dump);
    return 0;
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL, *ids_arg = NULL, *jsonl = NULL;
    int skip = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            detokenize_usage(stdout);
            return 0;
        }
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--ids") && has_val) ids_arg = argv[++i];
        else if (!strcmp(a, "--input-jsonl") && has_val) jsonl = argv[++i];
        else if (!strcmp(a, "--skip-special-tokens")) skip = 1;
        else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "cvllm detokenize: unknown option or missing value: %s\n", a);
            detokenize_usage(stderr);
            return 2;
        } else if (!dir) dir = a;
        else {
            fprintf(stderr, "cvllm detokenize: unexpected argument: %s\n", a);
            return 2;
        }
    }
    int32_t *ids = NULL;
    int n = 0;
    if (!dir || (!ids_arg == !jsonl)) {
        fprintf(stderr, "cvllm detokenize: need MODEL_DIR and exactly one of --ids / --input-jsonl\n");
        detokenize_usage(stderr);
        return 2;
    }
    if (ids_arg && (n = cli_ids("--ids", ids_arg, &ids)) < 0) return 2;
    Tokenizer *t;
    if (tokenizer_load(dir, &t) < 0) {
        fprintf(stderr, "cvllm detokenize: %s\n", cvllm_last_error());
        free(ids);
        return 1;
    }
    int rc = 0;
    if (ids_arg) {
        size_t len;
        char *s = tokenizer_decode_len(t, ids, n, skip, &len);
        if (!s) {
            fprintf(stderr, "cvllm detokenize: %s\n", cvllm_last_error());
            rc = 1;
        } else {
            fwrite(s, 1, len, stdout);
            putchar('\n');
            free(s);
        }
    } else {
        DetokArgs a = {t, skip};
        rc = cli_each_line(jsonl, 1, detokenize_line, &a);
        if (rc < 0) fprintf(stderr, "cvllm detokenize: --input-jsonl: %s\n", cvllm_last_error());
        rc = rc != 0;
    }
    free(ids);
    tokenizer_free(t);
    return rc;
}
