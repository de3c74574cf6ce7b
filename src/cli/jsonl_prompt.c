/* jsonl_prompt.c: one --prompt-file line -> a request's fields (see jsonl_prompt.h). The JSON is
 * read by cli_jsonl_parse (NUL characters, numbers out of range and syntax errors get their one
 * message each); the checks below give the same ranges as the command line's options. */
#include "cli/jsonl_prompt.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "cli/cli_util.h"
#include "common.h"

void jsonl_prompt_free(JsonlPrompt *p) {
    if (!p) return;
    free(p->prompt);
    free(p->prompt_ids);
    free(p->stop_ids);
    for (int i = 0; i < p->num_stops; i++) free(p->stops[i]);
    free(p->stops);
    if (p->params.stop_token_ids == p->stop_ids) {
        p->params.stop_token_ids = NULL;
        p->params.num_stop_token_ids = 0;
    }
    p->prompt = NULL;
    p->prompt_ids = NULL;
    p->stop_ids = NULL;
    p->stops = NULL;
    p->num_prompt_ids = p->num_stops = p->has_stops = 0;
}

/* A list of token ids (0 .. INT32_MAX) into a malloc'd array; -1 with the message set. */
static int id_array(json_t *v, long lineno, const char *key, int32_t **out, int *n_out) {
    if (!json_is_array(v))
        return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"%s\" must be an array of token ids", lineno, key);
    size_t n = json_array_size(v);
    if (n > INT32_MAX)
        return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"%s\" has too many ids", lineno, key);
    int32_t *ids = xmalloc((n ? n : 1) * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(ids);
            return cvllm_errorf(CVLLM_EINVAL,
                                "line %ld: \"%s\"[%zu] is not a token id (an integer in [0, %d])",
                                lineno, key, i, INT32_MAX);
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    *out = ids;
    *n_out = (int)n;
    return 0;
}

static int set_stops(JsonlPrompt *p, json_t *v, long lineno) {
    if (!json_is_string(v) && !json_is_array(v))
        return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"stop\" must be a string or an array of strings",
                            lineno);
    size_t n = json_is_string(v) ? 1 : json_array_size(v);
    for (size_t i = 0; json_is_array(v) && i < n; i++)
        if (!json_is_string(json_array_get(v, i)))
            return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"stop\"[%zu] is not a string", lineno, i);
    p->stops = xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        p->stops[i] = xstrdup(json_string_value(json_is_string(v) ? v : json_array_get(v, i)));
    p->num_stops = (int)n;
    p->has_stops = 1;
    return 0;
}

/* Integer fields: range and where they go. */
static int set_int(JsonlPrompt *p, const char *key, json_t *v, long lineno) {
    if (!json_is_integer(v))
        return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"%s\" must be an integer", lineno, key);
    json_int_t x = json_integer_value(v);
    if (!strcmp(key, "max_tokens")) {
        if (x < 1 || x > INT32_MAX)
            return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"max_tokens\" must be in [1, %d], got %lld",
                                lineno, INT32_MAX, (long long)x);
        p->params.max_tokens = (int)x;
    } else if (!strcmp(key, "top_k")) {
        if (x < -1 || x > INT32_MAX)
            return cvllm_errorf(CVLLM_EINVAL,
                                "line %ld: \"top_k\" must be -1 or 0 (off) or positive, got %lld",
                                lineno, (long long)x);
        p->params.top_k = (int)x;
    } else if (!strcmp(key, "logprobs")) {
        if (x < 0 || x > CVLLM_MAX_LOGPROBS)
            return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"logprobs\" must be in [0, %d], got %lld",
                                lineno, CVLLM_MAX_LOGPROBS, (long long)x);
        p->params.logprobs = (int)x;
    } else { /* seed */
        if (x < 0)
            return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"seed\" must be >= 0, got %lld", lineno,
                                (long long)x);
        p->params.seed = x;
    }
    return 0;
}

/* Number fields, with the ranges of --temperature, --top-p and --min-p. */
static int set_float(JsonlPrompt *p, const char *key, json_t *v, long lineno) {
    if (!json_is_number(v))
        return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"%s\" must be a number", lineno, key);
    double x = json_number_value(v);
    if (!strcmp(key, "temperature")) {
        if (!(x >= 0 && x <= 1e6))
            return cvllm_errorf(CVLLM_EINVAL,
                                "line %ld: \"temperature\" must be a number in [0, 1e6] (0: greedy), "
                                "got %g", lineno, x);
        p->params.temperature = (float)x;
    } else if (!strcmp(key, "top_p")) {
        if (!(x > 0 && x <= 1))
            return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"top_p\" must be a number in (0, 1], got %g",
                                lineno, x);
        p->params.top_p = fmaxf((float)x, FLT_MIN); /* 1e-50 is > 0 but rounds to 0.0f */
    } else if (!strcmp(key, "presence_penalty") || !strcmp(key, "frequency_penalty")) {
        if (!(x >= -2 && x <= 2))
            return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"%s\" must be a number in [-2, 2], got %g",
                                lineno, key, x);
        if (key[0] == 'p') p->params.presence_penalty = (float)x;
        else p->params.frequency_penalty = (float)x;
    } else if (!strcmp(key, "repetition_penalty")) {
        if (!(x > 0 && x <= 1e6))
            return cvllm_errorf(CVLLM_EINVAL,
                                "line %ld: \"repetition_penalty\" must be a number > 0, got %g",
                                lineno, x);
        p->params.repetition_penalty = fmaxf((float)x, FLT_MIN);
    } else { /* min_p */
        if (!(x >= 0 && x <= 1))
            return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"min_p\" must be a number in [0, 1], got %g",
                                lineno, x);
        p->params.min_p = (float)x;
    }
    return 0;
}

static int parse_fields(JsonlPrompt *p, json_t *o, long lineno) {
    if (!json_is_object(o))
        return cvllm_errorf(CVLLM_EINVAL, "line %ld: not a JSON object", lineno);
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(o, key, v) {
        if (!strcmp(key, "prompt")) {
            if (!json_is_string(v))
                return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"prompt\" must be a string", lineno);
            p->prompt = xstrdup(json_string_value(v)); /* no NUL inside: cli_jsonl_parse refuses it */
        } else if (!strcmp(key, "prompt_token_ids")) {
            rc = id_array(v, lineno, key, &p->prompt_ids, &p->num_prompt_ids);
            if (rc == 0 && p->num_prompt_ids == 0)
                rc = cvllm_errorf(CVLLM_EINVAL, "line %ld: \"prompt_token_ids\" is empty", lineno);
        } else if (!strcmp(key, "stop_token_ids")) {
            int n = 0;
            if ((rc = id_array(v, lineno, key, &p->stop_ids, &n)) == 0) {
                p->params.stop_token_ids = p->stop_ids;
                p->params.num_stop_token_ids = n;
            }
        } else if (!strcmp(key, "stop")) {
            rc = set_stops(p, v, lineno);
        } else if (!strcmp(key, "ignore_eos") || !strcmp(key, "include_stop_str_in_output")) {
            if (!json_is_boolean(v))
                return cvllm_errorf(CVLLM_EINVAL, "line %ld: \"%s\" must be true or false", lineno, key);
            if (key[0] == 'i' && key[1] == 'g') p->params.ignore_eos = json_is_true(v);
            else p->params.include_stop_str_in_output = json_is_true(v);
        } else if (!strcmp(key, "max_tokens") || !strcmp(key, "top_k") || !strcmp(key, "seed") ||
                   !strcmp(key, "logprobs")) {
            rc = set_int(p, key, v, lineno);
        } else if (!strcmp(key, "temperature") || !strcmp(key, "top_p") || !strcmp(key, "min_p") ||
                   !strcmp(key, "presence_penalty") || !strcmp(key, "frequency_penalty") ||
                   !strcmp(key, "repetition_penalty")) {
            rc = set_float(p, key, v, lineno);
        } else {
            return cvllm_errorf(CVLLM_EINVAL, "line %ld: unknown field \"%s\"", lineno, key);
        }
        if (rc < 0) return rc;
    }
    if (!p->prompt && !p->prompt_ids)
        return cvllm_errorf(CVLLM_EINVAL, "line %ld: needs \"prompt\" or \"prompt_token_ids\"", lineno);
    if (p->prompt && p->prompt_ids)
        return cvllm_errorf(CVLLM_EINVAL, "line %ld: give \"prompt\" or \"prompt_token_ids\", not both",
                            lineno);
    return 0;
}

int jsonl_prompt_parse(const char *line, size_t len, long lineno, JsonlPrompt *p) {
    json_t *o = cli_jsonl_parse(line, len, lineno);
    if (!o) return CVLLM_EINVAL;
    int rc = parse_fields(p, o, lineno);
    json_decref(o);
    return rc < 0 ? CVLLM_EINVAL : 0;
}
