/* openai_request.c: OpenAI request bodies -> OaiRequest, with OpenAI's (and vLLM's) field names,
 * defaults and ranges. Unknown fields are ignored (clients send extras); null means "not given";
 * a field of the wrong type or out of range is a 400 naming the field. */
#include "server/openai_request.h"

#include "tokenizer/tokenizer.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

int oai_error(OaiError *e, int status, const char *param, const char *fmt, ...) {
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->code[0] = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}


json_t *oai_parse_body(const char *body, size_t len, OaiError *err) {
    if (!utf8_valid(body, len)) {
        oai_error(err, 400, NULL, "the request body is not valid UTF-8");
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) {
        oai_error(err, 400, NULL, "malformed JSON at line %d column %d: %s", jerr.line, jerr.column,
                  jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        oai_error(err, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* ---- typed field access: 0 = absent (or null), 1 = set, -1 = error (err filled) ---- */

static json_t *field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static int get_bool(json_t *o, const char *key, int *out, OaiError *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return oai_error(err, 400, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 1;
}

static int get_int(json_t *o, const char *key, long long lo, long long hi, long long *out,
                   OaiError *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else return oai_error(err, 400, key, "'%s' must be an integer", key);
    if (x < lo || x > hi)
        return oai_error(err, 400, key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
    *out = x;
    return 1;
}

static int get_float(json_t *o, const char *key, double lo, double hi, int lo_open, double *out,
                     OaiError *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return oai_error(err, 400, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        return oai_error(err, 400, key, "'%s' must be in %c%g, %g], got %g", key, lo_open ? '(' : '[',
                         lo, hi, x);
    *out = x;
    return 1;
}

/* A JSON array of integers -> malloc'd int32 array (each in [lo, hi]). */
static int int_array(json_t *a, const char *key, long long lo, long long hi, int max_n,
                     int32_t **out, int *n_out, OaiError *err) {
    size_t n = json_array_size(a);
    if ((int)n > max_n && max_n > 0)
        return oai_error(err, 400, key, "'%s' has %zu entries (at most %d)", key, n, max_n);
    int32_t *ids = xmalloc((n ? n : 1) * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi) {
            free(ids);
            return oai_error(err, 400, key, "'%s'[%zu] must be an integer in [%lld, %lld]", key, i,
                             lo, hi);
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    *out = ids;
    *n_out = (int)n;
    return 1;
}

static void prompt_free(OaiPrompt *p) {
    free(p->text);
    free(p->ids);
}

static int add_text_prompt(OaiRequest *r, int *cap, json_t *s) {
    OaiPrompt p = {0};
    p.len = json_string_length(s);
    p.text = xmalloc(p.len + 1);
    memcpy(p.text, json_string_value(s), p.len + 1);
    DA_PUSH(r->prompts, r->num_prompts, *cap, p);
    return 0;
}

static int add_id_prompt(OaiRequest *r, int *cap, json_t *a, OaiError *err) {
    OaiPrompt p = {0};
    if (json_array_size(a) == 0) return oai_error(err, 400, "prompt", "a prompt of token ids is empty");
    if (int_array(a, "prompt", 0, INT32_MAX, 0, &p.ids, &p.num_ids, err) < 0) return -1;
    DA_PUSH(r->prompts, r->num_prompts, *cap, p);
    return 0;
}

/* prompt: a string, an array of strings, an array of ids, or an array of arrays of ids. */
static int parse_prompt(json_t *root, OaiRequest *r, OaiError *err) {
    json_t *p = field(root, "prompt");
    int cap = 0;
    if (!p) return oai_error(err, 400, "prompt", "'prompt' is required");
    if (json_is_string(p)) return add_text_prompt(r, &cap, p);
    if (!json_is_array(p) || json_array_size(p) == 0)
        return oai_error(err, 400, "prompt",
                         "'prompt' must be a string, an array of strings, an array of token ids or "
                         "an array of arrays of token ids (non-empty)");
    json_t *first = json_array_get(p, 0);
    if (json_is_integer(first)) return add_id_prompt(r, &cap, p, err);
    if (json_array_size(p) > OAI_MAX_CHOICES)
        return oai_error(err, 400, "prompt", "at most %d prompts per request", OAI_MAX_CHOICES);
    size_t i;
    json_t *x;
    json_array_foreach(p, i, x) {
        if (json_is_string(x)) add_text_prompt(r, &cap, x);
        else if (json_is_array(x)) {
            if (add_id_prompt(r, &cap, x, err) < 0) return -1;
        } else
            return oai_error(err, 400, "prompt", "'prompt'[%zu] must be a string or an array of token ids", i);
    }
    return 0;
}

/* A message's content: a string, null, or an array of {"type": "text", "text": ...} parts
 * (joined with "\n", as vLLM's "string" content format does). */
static int flatten_content(json_t *msg, size_t idx, OaiError *err) {
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_null(c) || json_is_string(c)) return 0;
    if (!json_is_array(c))
        return oai_error(err, 400, "messages", "messages[%zu].content must be a string, null or an array of content parts", idx);
    size_t cap = 64, len = 0, i;
    char *s = xmalloc(cap);
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type)) {
            free(s);
            return oai_error(err, 400, "messages", "messages[%zu].content[%zu] must be an object with a 'type'", idx, i);
        }
        if (strcmp(json_string_value(type), "text")) {
            free(s);
            return oai_error(err, 400, "messages", "messages[%zu].content[%zu]: content type '%s' is not supported (text only)",
                             idx, i, json_string_value(type));
        }
        if (!json_is_string(text)) {
            free(s);
            return oai_error(err, 400, "messages", "messages[%zu].content[%zu].text must be a string", idx, i);
        }
        size_t tl = json_string_length(text);
        if (len + tl + 2 > cap) {
            while (len + tl + 2 > cap) cap *= 2;
            s = xrealloc(s, cap);
        }
        if (i > 0) s[len++] = '\n';
        memcpy(s + len, json_string_value(text), tl);
        len += tl;
    }
    json_object_set_new(msg, "content", json_stringn(s, len));
    free(s);
    return 0;
}

static int parse_messages(json_t *root, OaiRequest *r, OaiError *err) {
    json_t *m = field(root, "messages");
    if (!m) return oai_error(err, 400, "messages", "'messages' is required");
    if (!json_is_array(m) || json_array_size(m) == 0)
        return oai_error(err, 400, "messages", "'messages' must be a non-empty array");
    r->messages = json_array();
    size_t i;
    json_t *msg;
    json_array_foreach(m, i, msg) {
        if (!json_is_object(msg))
            return oai_error(err, 400, "messages", "messages[%zu] must be an object", i);
        json_t *role = json_object_get(msg, "role");
        if (!json_is_string(role))
            return oai_error(err, 400, "messages", "messages[%zu].role must be a string", i);
        json_t *copy = json_deep_copy(msg);
        json_array_append_new(r->messages, copy);
        if (flatten_content(copy, i, err) < 0) return -1;
        json_t *tc = json_object_get(copy, "tool_calls");
        if (tc && !json_is_null(tc) && !json_is_array(tc))
            return oai_error(err, 400, "messages", "messages[%zu].tool_calls must be an array", i);
    }
    return 0;
}

static int parse_tools(json_t *root, OaiRequest *r, OaiError *err) {
    json_t *t = field(root, "tools");
    if (t) {
        if (!json_is_array(t)) return oai_error(err, 400, "tools", "'tools' must be an array");
        size_t i;
        json_t *x;
        json_array_foreach(t, i, x) {
            json_t *fn = json_object_get(x, "function");
            if (!json_is_object(x) || !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
                return oai_error(err, 400, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
        }
        if (json_array_size(t) > 0) r->tools = json_incref(t);
    }
    json_t *c = field(root, "tool_choice");
    r->tool_choice = r->tools ? OAI_TOOLS_AUTO : OAI_TOOLS_NONE;
    if (c) {
        if (json_is_string(c) && !strcmp(json_string_value(c), "none")) r->tool_choice = OAI_TOOLS_NONE;
        else if (json_is_string(c) && !strcmp(json_string_value(c), "auto")) {
            if (!r->tools) return oai_error(err, 400, "tool_choice", "tool_choice 'auto' needs 'tools'");
        } else if (json_is_string(c) && !strcmp(json_string_value(c), "required"))
            return oai_error(err, 400, "tool_choice", "tool_choice 'required' needs guided decoding, which cvllm does not have; use 'auto'");
        else if (json_is_object(c))
            return oai_error(err, 400, "tool_choice", "a named tool_choice needs guided decoding, which cvllm does not have; use 'auto'");
        else return oai_error(err, 400, "tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or an object");
    }
    return 0;
}

static int parse_stop(json_t *root, OaiRequest *r, OaiError *err) {
    json_t *s = field(root, "stop");
    if (s) {
        if (json_is_string(s)) {
            if (json_string_length(s) > 0) {
                r->stop = xmalloc(sizeof(char *));
                r->stop[r->num_stop++] = xstrdup(json_string_value(s));
            }
        } else if (json_is_array(s)) {
            if (json_array_size(s) > OAI_MAX_STOP)
                return oai_error(err, 400, "stop", "at most %d stop strings", OAI_MAX_STOP);
            r->stop = xmalloc((json_array_size(s) + 1) * sizeof(char *));
            size_t i;
            json_t *x;
            json_array_foreach(s, i, x) {
                if (!json_is_string(x)) return oai_error(err, 400, "stop", "stop[%zu] must be a string", i);
                if (json_string_length(x) == 0) continue;
                if (strlen(json_string_value(x)) != json_string_length(x))
                    return oai_error(err, 400, "stop", "stop[%zu] contains a NUL character", i);
                r->stop[r->num_stop++] = xstrdup(json_string_value(x));
            }
        } else return oai_error(err, 400, "stop", "'stop' must be a string or an array of strings");
    }
    json_t *ids = field(root, "stop_token_ids");
    if (ids) {
        if (!json_is_array(ids)) return oai_error(err, 400, "stop_token_ids", "'stop_token_ids' must be an array of integers");
        if (int_array(ids, "stop_token_ids", 0, INT32_MAX, OAI_MAX_STOP, &r->stop_token_ids,
                      &r->num_stop_token_ids, err) < 0)
            return -1;
    }
    return 0;
}

static int parse_common(json_t *root, OaiRequest *r, OaiError *err) {
    CvllmSamplingParams *p = &r->params;
    json_t *model = field(root, "model");
    if (model) {
        if (!json_is_string(model)) return oai_error(err, 400, "model", "'model' must be a string");
        r->model = xstrdup(json_string_value(model));
    }
    long long v;
    double f;
    int b, rc;
    /* max_tokens, and chat's newer name max_completion_tokens (which wins) */
    if ((rc = get_int(root, "max_tokens", 1, INT32_MAX, &v, err)) < 0) return -1;
    if (rc) r->max_tokens = (int)v;
    if (r->endpoint == OAI_CHAT) {
        if ((rc = get_int(root, "max_completion_tokens", 1, INT32_MAX, &v, err)) < 0) return -1;
        if (rc) r->max_tokens = (int)v;
    }
    if ((rc = get_float(root, "temperature", 0, 1e6, 0, &f, err)) < 0) return -1;
    if (rc) p->temperature = (float)f;
    if ((rc = get_float(root, "top_p", 0, 1, 1, &f, err)) < 0) return -1;
    if (rc) p->top_p = fmaxf((float)f, FLT_MIN); /* 1e-50 is > 0 but rounds to 0.0f */
    if ((rc = get_int(root, "top_k", -1, INT32_MAX, &v, err)) < 0) return -1;
    if (rc) p->top_k = (int)v;
    if ((rc = get_float(root, "min_p", 0, 1, 0, &f, err)) < 0) return -1;
    if (rc) p->min_p = (float)f;
    if ((rc = get_float(root, "presence_penalty", -2, 2, 0, &f, err)) < 0) return -1;
    if (rc) p->presence_penalty = (float)f;
    if ((rc = get_float(root, "frequency_penalty", -2, 2, 0, &f, err)) < 0) return -1;
    if (rc) p->frequency_penalty = (float)f;
    if ((rc = get_float(root, "repetition_penalty", 0, 1e6, 1, &f, err)) < 0) return -1;
    if (rc) p->repetition_penalty = fmaxf((float)f, FLT_MIN);
    if ((rc = get_int(root, "seed", INT64_MIN, INT64_MAX, &v, err)) < 0) return -1;
    if (rc) p->seed = v < 0 ? (int64_t)((uint64_t)v & INT64_MAX) : v;
    if ((rc = get_int(root, "n", 1, OAI_MAX_CHOICES, &v, err)) < 0) return -1;
    if (rc) r->n = (int)v;
    if ((rc = get_bool(root, "ignore_eos", &b, err)) < 0) return -1;
    if (rc) p->ignore_eos = b;
    if ((rc = get_bool(root, "skip_special_tokens", &b, err)) < 0) return -1;
    if (rc) p->skip_special_tokens = b;
    if ((rc = get_bool(root, "include_stop_str_in_output", &b, err)) < 0) return -1;
    if (rc) p->include_stop_str_in_output = b;
    if ((rc = get_bool(root, "stream", &b, err)) < 0) return -1;
    if (rc) r->stream = b;
    json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so)) return oai_error(err, 400, "stream_options", "'stream_options' must be an object");
        if ((rc = get_bool(so, "include_usage", &b, err)) < 0) return -1;
        if (rc) r->include_usage = b;
        if (!r->stream) return oai_error(err, 400, "stream_options", "'stream_options' is only allowed with 'stream': true");
    }
    if (parse_stop(root, r, err) < 0) return -1;
    if (r->n * (r->endpoint == OAI_COMPLETIONS ? r->num_prompts : 1) > OAI_MAX_CHOICES)
        return oai_error(err, 400, "n", "n times the number of prompts is over %d", OAI_MAX_CHOICES);
    return 0;
}

static int parse_logprobs(json_t *root, OaiRequest *r, OaiError *err) {
    long long v;
    int b, rc;
    if (r->endpoint == OAI_COMPLETIONS) {
        /* completions: logprobs is the number of top log-probs (0..20) */
        if ((rc = get_int(root, "logprobs", 0, CVLLM_MAX_LOGPROBS, &v, err)) < 0) return -1;
        if (rc) r->logprobs = (int)v;
        if ((rc = get_bool(root, "echo", &b, err)) < 0) return -1;
        if (rc) r->echo = b;
        if (r->echo && r->logprobs >= 0)
            return oai_error(err, 400, "echo", "echo with logprobs (prompt log-probabilities) is not supported");
        return 0;
    }
    /* chat: logprobs is a boolean, top_logprobs the number (needs logprobs: true) */
    int lp = 0;
    if ((rc = get_bool(root, "logprobs", &lp, err)) < 0) return -1;
    if ((rc = get_int(root, "top_logprobs", 0, CVLLM_MAX_LOGPROBS, &v, err)) < 0) return -1;
    if (rc && !lp) return oai_error(err, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (lp) r->logprobs = rc ? (int)v : 0;
    return 0;
}

int oai_request_parse(OaiEndpoint ep, const char *body, size_t len, OaiRequest *r, OaiError *err) {
    memset(r, 0, sizeof *r);
    r->endpoint = ep;
    r->n = 1;
    r->logprobs = -1;
    r->add_generation_prompt = 1;
    cvllm_sampling_params_default(&r->params);
    json_t *root = oai_parse_body(body, len, err);
    if (!root) return -1;
    int rc = -1, b, k;
    if (ep == OAI_COMPLETIONS) {
        if (parse_prompt(root, r, err) < 0) goto done;
    } else {
        if (parse_messages(root, r, err) < 0 || parse_tools(root, r, err) < 0) goto done;
        if ((k = get_bool(root, "add_generation_prompt", &b, err)) < 0) goto done;
        if (k) r->add_generation_prompt = b;
        if ((k = get_bool(root, "continue_final_message", &b, err)) < 0) goto done;
        if (k) r->continue_final_message = b;
        /* continue_final_message turns the generation prompt off; both asked for is an error */
        if (r->continue_final_message && r->add_generation_prompt) {
            json_t *agp = field(root, "add_generation_prompt");
            if (agp && json_is_true(agp)) {
                oai_error(err, 400, "continue_final_message", "continue_final_message and add_generation_prompt cannot both be true");
                goto done;
            }
            r->add_generation_prompt = 0;
        }
        json_t *kw = field(root, "chat_template_kwargs");
        if (kw) {
            if (!json_is_object(kw)) {
                oai_error(err, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
                goto done;
            }
            r->template_kwargs = json_incref(kw);
        }
    }
    if (parse_common(root, r, err) < 0 || parse_logprobs(root, r, err) < 0) goto done;
    r->params.stop = (const char *const *)r->stop;
    r->params.num_stop = r->num_stop;
    r->params.stop_token_ids = r->stop_token_ids;
    r->params.num_stop_token_ids = r->num_stop_token_ids;
    r->params.logprobs = r->logprobs;
    rc = 0;
done:
    json_decref(root);
    if (rc < 0) oai_request_free(r);
    return rc;
}

void oai_request_free(OaiRequest *r) {
    free(r->model);
    for (int i = 0; i < r->num_prompts; i++) prompt_free(&r->prompts[i]);
    free(r->prompts);
    json_decref(r->messages);
    json_decref(r->tools);
    json_decref(r->template_kwargs);
    for (int i = 0; i < r->num_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_token_ids);
    OaiEndpoint ep = r->endpoint;
    memset(r, 0, sizeof *r);
    r->endpoint = ep;
}
