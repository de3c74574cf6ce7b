/* server.c: `cvllm serve` (see server.h for the threads). A Job is one HTTP generation request:
 * its parsed body, its prompts as ids, and one Choice per engine request (n per prompt). The
 * engine's output callback fills the Choices under the Job's mutex; the connection thread reads
 * them to build the response or the SSE chunks. A Job is reference-counted: one reference for the
 * connection (or its stream) and one per engine request not yet finished, so neither side frees
 * what the other still uses. */
#include "server/server.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "server/http.h"
#include "server/live_view.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/reasoning_parser.h"
#include "server/sbuf.h"
#include "server/tool_parser.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

typedef struct Server Server;
typedef struct Job Job;

typedef struct {
    Job *job;
    int index, prompt_idx, sub; /* sub: which of the prompt's n */
    int64_t engine_id;
    int submitted;
    /* engine side (written by on_output under job->mu) */
    SBuf text;
    int32_t *ids;
    float *lp;
    int32_t *top_ids;
    float *top_lp;
    int nids, cap;
    int num_prompt, num_cached;
    CvllmFinishReason finish;
    char *stop_str;
    int32_t stop_id;
    char *error;
    int done;
    double t_last;
    /* connection side */
    size_t text_sent;
    int ids_sent, started, final_sent, calls_sent;
    int64_t text_offset;
    ReasoningStream rs;
    ToolStream ts;
} Choice;

struct Job {
    Server *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    OaiRequest req;
    int max_tokens;
    int nchoices, num_active;
    Choice *ch;
    int nprompts;
    int32_t **pids;
    int *plen;
    char **ptext; /* echo: the prompts' text */
    size_t *ptext_len;
    char *id;
    long created;
    double t_arrival;
    int fd;
    double next_fd_check; /* when to poll the client's socket again */
    SBuf out;
    int done_sent, use_tools, use_reasoning;
    Job *prev, *next;
    int listed;
};

struct Server {
    const ServerOptions *o;
    CvllmEngine *e;
    const Tokenizer *tok;
    ChatTemplate *tmpl;
    const char *model_name;
    int max_model_len, vocab;
    Metrics metrics;
    HttpServer *http;
    pthread_mutex_t mu; /* jobs list */
    Job *jobs;
    atomic_int inflight; /* engine requests submitted and not finished */
    atomic_int shutting_down;
    atomic_int engine_failed;
    pthread_mutex_t owners_mu;
    int64_t *owners;
    int num_blocks;
    long started;
};

/* ---------------------------------------------------------------- jobs */

static Job *job_new(Server *s, OaiRequest *req) {
    Job *j = xcalloc(1, sizeof *j);
    j->srv = s;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->refs = 1;
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->created = (long)time(NULL);
    j->t_arrival = now_seconds();
    j->fd = -1;
    j->id = oai_random_id(j->req.endpoint == OAI_CHAT ? "chatcmpl-" : "cmpl-");
    return j;
}

static void job_free(Job *j) {
    for (int i = 0; i < j->nchoices; i++) {
        Choice *c = &j->ch[i];
        sbuf_free(&c->text);
        free(c->ids);
        free(c->lp);
        free(c->top_ids);
        free(c->top_lp);
        free(c->stop_str);
        free(c->error);
        reasoning_free(&c->rs);
        tool_stream_free(&c->ts);
    }
    free(j->ch);
    for (int i = 0; i < j->nprompts; i++) {
        free(j->pids[i]);
        if (j->ptext) free(j->ptext[i]);
    }
    free(j->pids);
    free(j->plen);
    free(j->ptext);
    free(j->ptext_len);
    free(j->id);
    sbuf_free(&j->out);
    oai_request_free(&j->req);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

static void job_unref(Job *j) {
    pthread_mutex_lock(&j->mu);
    int r = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (r == 0) job_free(j);
}

static void job_list_add(Server *s, Job *j) {
    pthread_mutex_lock(&s->mu);
    j->next = s->jobs;
    if (s->jobs) s->jobs->prev = j;
    s->jobs = j;
    j->listed = 1;
    pthread_mutex_unlock(&s->mu);
}

static void job_list_remove(Server *s, Job *j) {
    pthread_mutex_lock(&s->mu);
    if (j->listed) {
        if (j->prev) j->prev->next = j->next;
        else s->jobs = j->next;
        if (j->next) j->next->prev = j->prev;
        j->listed = 0;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Aborts the Job's unfinished engine requests (their final outputs arrive at the next step). */
static void job_abort(Job *j) {
    int64_t *ids = xmalloc((size_t)(j->nchoices + 1) * sizeof *ids);
    int n = 0;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->nchoices; i++)
        if (j->ch[i].submitted && !j->ch[i].done && j->ch[i].engine_id >= 0) ids[n++] = j->ch[i].engine_id;
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < n; i++) cvllm_engine_abort_request(j->srv->e, ids[i]);
    free(ids);
}

/* The engine thread's callback: copy what the step produced, wake the connection. */
static void on_output(void *user, const CvllmRequestOutput *o) {
    Choice *c = user;
    Job *j = c->job;
    Server *s = j->srv;
    double now = now_seconds();
    int last = o->finish_reason != CVLLM_FINISH_NONE;
    pthread_mutex_lock(&j->mu);
    if (o->new_text_len) sbuf_add(&c->text, o->new_text, o->new_text_len);
    int nn = o->num_new_tokens;
    if (nn > 0 && o->num_tokens >= nn) {
        if (c->nids + nn > c->cap) {
            c->cap = (c->nids + nn) * 2;
            c->ids = xrealloc(c->ids, (size_t)c->cap * sizeof *c->ids);
            if (j->req.logprobs >= 0) {
                c->lp = xrealloc(c->lp, (size_t)c->cap * sizeof *c->lp);
                size_t k = (size_t)(j->req.logprobs > 0 ? j->req.logprobs : 1);
                c->top_ids = xrealloc(c->top_ids, (size_t)c->cap * k * sizeof *c->top_ids);
                c->top_lp = xrealloc(c->top_lp, (size_t)c->cap * k * sizeof *c->top_lp);
            }
        }
        int base = o->num_tokens - nn;
        memcpy(c->ids + c->nids, o->token_ids + base, (size_t)nn * sizeof(int32_t));
        if (j->req.logprobs >= 0) {
            int k = j->req.logprobs;
            for (int i = 0; i < nn; i++) {
                c->lp[c->nids + i] = o->logprobs ? o->logprobs[base + i] : 0.0f;
                for (int t = 0; t < k; t++) {
                    int have = o->top_logprob_ids && t < o->num_top_logprobs;
                    size_t src = (size_t)(base + i) * (size_t)o->num_top_logprobs + (size_t)t;
                    c->top_ids[(size_t)(c->nids + i) * k + t] = have ? o->top_logprob_ids[src] : c->ids[c->nids + i];
                    c->top_lp[(size_t)(c->nids + i) * k + t] = have ? o->top_logprobs[src] : c->lp[c->nids + i];
                }
            }
        }
        if (c->nids == 0) metrics_observe_ttft(&s->metrics, now - j->t_arrival);
        else metrics_observe_itl(&s->metrics, now - c->t_last);
        c->t_last = now;
        c->nids += nn;
        metrics_add_tokens(&s->metrics, 0, nn);
    }
    if (c->num_prompt == 0 && o->num_prompt_tokens > 0) metrics_add_tokens(&s->metrics, o->num_prompt_tokens, 0);
    c->num_prompt = o->num_prompt_tokens;
    c->num_cached = o->num_cached_tokens;
    if (last && !c->done) {
        c->finish = o->finish_reason;
        if (o->stop_reason) c->stop_str = xstrdup(o->stop_reason);
        c->stop_id = o->stop_token_id;
        if (o->error) c->error = xstrdup(o->error);
        c->done = 1;
        j->num_active--;
        atomic_fetch_sub(&s->inflight, 1);
        metrics_observe_finished(&s->metrics, o->finish_reason, now - j->t_arrival, c->num_prompt, c->nids);
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (last) job_unref(j);
}

/* ---------------------------------------------------------------- preparing a request */

static const char *finish_name(CvllmFinishReason r) {
    const char *n = cvllm_finish_reason_name(r);
    return n ? n : "stop";
}

/* A negative engine code -> HTTP status. */
static int status_of(int code) {
    switch (code) {
    case CVLLM_EINVAL: case CVLLM_ENOMEM: case CVLLM_EUNSUPPORTED: return 400;
    case CVLLM_ESHUTDOWN: return 503;
    default: return 500;
    }
}

static int render_chat(Server *s, OaiRequest *rq, char **out, size_t *out_len, OaiError *err) {
    if (!s->tmpl)
        return oai_error(err, 400, "messages", "the model %s has no chat template: use /v1/completions", s->model_name);
    json_t *vars = json_object();
    if (rq->template_kwargs) json_object_update(vars, rq->template_kwargs);
    json_object_set(vars, "messages", rq->messages);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(rq->add_generation_prompt));
    if (rq->tools) json_object_set(vars, "tools", rq->tools);
    if (tokenizer_bos_token(s->tok) && !json_object_get(vars, "bos_token"))
        json_object_set_new(vars, "bos_token", json_string(tokenizer_bos_token(s->tok)));
    if (tokenizer_eos_token(s->tok) && !json_object_get(vars, "eos_token"))
        json_object_set_new(vars, "eos_token", json_string(tokenizer_eos_token(s->tok)));
    ChatTemplateLimits lim;
    chat_template_limits_default(&lim);
    lim.max_output = 16u << 20;
    lim.max_memory = 256u << 20;
    lim.max_iterations = 1000000;
    int rc = chat_template_render_ex(s->tmpl, vars, &lim, out, out_len);
    json_decref(vars);
    if (rc < 0) return oai_error(err, 400, "messages", "chat template: %s", cvllm_last_error());
    if (rq->continue_final_message) {
        /* end the prompt right after the last message's content (no end-of-turn) */
        json_t *lastm = json_array_get(rq->messages, json_array_size(rq->messages) - 1);
        json_t *content = json_object_get(lastm, "content");
        size_t cl = json_string_length(content);
        if (json_is_string(content) && cl > 0 && cl <= *out_len) {
            const char *cs = json_string_value(content);
            for (size_t p = *out_len - cl + 1; p-- > 0;)
                if (!memcmp(*out + p, cs, cl)) {
                    *out_len = p + cl;
                    (*out)[*out_len] = 0;
                    break;
                }
        }
    }
    return 0;
}

static int context_error(Server *s, OaiError *err, const char *param, int plen, int max_tokens) {
    oai_error(err, 400, param,
              "This model's maximum context length is %d tokens. However, you requested %d tokens "
              "(%d in the prompt, %d in the completion). Please reduce the length of the prompt "
              "or completion.",
              s->max_model_len, plen + max_tokens, plen, max_tokens);
    snprintf(err->code, sizeof err->code, "context_length_exceeded");
    return -1;
}

/* Model name, prompts -> ids, lengths, max_tokens, choices. */
static int job_prepare(Server *s, Job *j, OaiError *err) {
    OaiRequest *rq = &j->req;
    if (rq->model && strcmp(rq->model, s->model_name)) {
        oai_error(err, 400, "model", "The model `%s` does not exist.", rq->model);
        snprintf(err->code, sizeof err->code, "model_not_found");
        return -1;
    }
    if (rq->endpoint == OAI_CHAT) {
        char *text = NULL;
        size_t len = 0;
        if (render_chat(s, rq, &text, &len, err) < 0) return -1;
        j->nprompts = 1;
        j->pids = xcalloc(1, sizeof *j->pids);
        j->plen = xcalloc(1, sizeof *j->plen);
        int n = tokenizer_encode(s->tok, text, len, &j->pids[0]);
        free(text);
        if (n < 0) return oai_error(err, 400, "messages", "%s", cvllm_last_error());
        j->plen[0] = n;
        j->use_tools = rq->tools && rq->tool_choice == OAI_TOOLS_AUTO && s->o->tool_parser;
        j->use_reasoning = s->o->reasoning_parser;
    } else {
        j->nprompts = rq->num_prompts;
        j->pids = xcalloc((size_t)j->nprompts, sizeof *j->pids);
        j->plen = xcalloc((size_t)j->nprompts, sizeof *j->plen);
        if (rq->echo) {
            j->ptext = xcalloc((size_t)j->nprompts, sizeof *j->ptext);
            j->ptext_len = xcalloc((size_t)j->nprompts, sizeof *j->ptext_len);
        }
        for (int i = 0; i < j->nprompts; i++) {
            OaiPrompt *p = &rq->prompts[i];
            if (p->text) {
                if (!s->tok) return oai_error(err, 400, "prompt", "the model has no tokenizer: send token ids");
                int n = tokenizer_encode(s->tok, p->text, p->len, &j->pids[i]);
                if (n < 0) return oai_error(err, 400, "prompt", "%s", cvllm_last_error());
                j->plen[i] = n;
                if (rq->echo) {
                    j->ptext[i] = xmalloc(p->len + 1);
                    memcpy(j->ptext[i], p->text, p->len + 1);
                    j->ptext_len[i] = p->len;
                }
            } else {
                for (int k = 0; k < p->num_ids; k++)
                    if (p->ids[k] >= s->vocab)
                        return oai_error(err, 400, "prompt", "token id %d is outside the vocabulary (%d)", p->ids[k], s->vocab);
                j->pids[i] = xmalloc((size_t)p->num_ids * sizeof(int32_t));
                memcpy(j->pids[i], p->ids, (size_t)p->num_ids * sizeof(int32_t));
                j->plen[i] = p->num_ids;
                if (rq->echo) {
                    if (!s->tok) return oai_error(err, 400, "echo", "echo of token ids needs the model's tokenizer");
                    j->ptext[i] = tokenizer_decode_len(s->tok, p->ids, p->num_ids, rq->params.skip_special_tokens, &j->ptext_len[i]);
                    if (!j->ptext[i]) return oai_error(err, 400, "prompt", "%s", cvllm_last_error());
                }
            }
        }
    }
    for (int i = 0; i < rq->num_stop_token_ids; i++)
        if (rq->stop_token_ids[i] >= s->vocab)
            return oai_error(err, 400, "stop_token_ids", "stop token id %d is outside the vocabulary (%d)", rq->stop_token_ids[i], s->vocab);
    const char *pparam = rq->endpoint == OAI_CHAT ? "messages" : "prompt";
    int longest = 0;
    for (int i = 0; i < j->nprompts; i++) {
        if (j->plen[i] == 0) return oai_error(err, 400, pparam, "the prompt is empty (no tokens)");
        if (j->plen[i] >= s->max_model_len) {
            oai_error(err, 400, pparam,
                      "This model's maximum context length is %d tokens. However, your request has "
                      "%d input tokens. Please reduce the length of the input.",
                      s->max_model_len, j->plen[i]);
            snprintf(err->code, sizeof err->code, "context_length_exceeded");
            return -1;
        }
        if (j->plen[i] > longest) longest = j->plen[i];
    }
    j->max_tokens = rq->max_tokens;
    if (j->max_tokens == 0) {
        j->max_tokens = rq->endpoint == OAI_CHAT ? s->max_model_len - longest : 16;
        if (longest + j->max_tokens > s->max_model_len) j->max_tokens = s->max_model_len - longest;
    } else if (longest + j->max_tokens > s->max_model_len) {
        return context_error(s, err, "max_tokens", longest, j->max_tokens);
    }
    j->nchoices = j->nprompts * rq->n;
    j->ch = xcalloc((size_t)j->nchoices, sizeof *j->ch);
    for (int i = 0; i < j->nchoices; i++) {
        Choice *c = &j->ch[i];
        c->job = j;
        c->index = i;
        c->prompt_idx = i / rq->n;
        c->sub = i % rq->n;
        c->engine_id = -1;
        c->stop_id = -1;
        reasoning_init(&c->rs);
        tool_stream_init(&c->ts);
    }
    return 0;
}

static int job_submit(Server *s, Job *j, OaiError *err) {
    if (atomic_load(&s->shutting_down)) return oai_error(err, 503, NULL, "the server is shutting down");
    int limit = s->o->engine.max_num_seqs + s->o->max_queue_len;
    int cur = atomic_fetch_add(&s->inflight, j->nchoices);
    if (cur + j->nchoices > limit) {
        atomic_fetch_sub(&s->inflight, j->nchoices);
        return oai_error(err, 503, NULL, "the server's queue is full (%d requests in flight, limit %d); retry later", cur, limit);
    }
    for (int i = 0; i < j->nchoices; i++) {
        Choice *c = &j->ch[i];
        CvllmRequest r;
        memset(&r, 0, sizeof r);
        r.prompt_token_ids = j->pids[c->prompt_idx];
        r.num_prompt_tokens = j->plen[c->prompt_idx];
        r.params = j->req.params;
        r.params.max_tokens = j->max_tokens;
        if (r.params.seed >= 0 && c->sub > 0) r.params.seed = (int64_t)(((uint64_t)r.params.seed + (uint64_t)c->sub) & INT64_MAX);
        r.on_output = on_output;
        r.user = c;
        pthread_mutex_lock(&j->mu);
        j->refs++;
        j->num_active++;
        c->submitted = 1;
        pthread_mutex_unlock(&j->mu);
        int64_t id = cvllm_engine_submit(s->e, &r);
        if (id < 0) {
            oai_error(err, status_of((int)id), NULL, "%s", cvllm_last_error());
            pthread_mutex_lock(&j->mu);
            j->refs--;
            j->num_active--;
            c->submitted = 0;
            pthread_mutex_unlock(&j->mu);
            atomic_fetch_sub(&s->inflight, j->nchoices - i);
            job_abort(j);
            return -1;
        }
        pthread_mutex_lock(&j->mu);
        c->engine_id = id;
        pthread_mutex_unlock(&j->mu);
    }
    return 0;
}

/* ---------------------------------------------------------------- responses */

static json_t *stop_reason_json(const Choice *c) {
    if (c->stop_str) return json_string(c->stop_str);
    if (c->finish == CVLLM_FINISH_STOP && c->stop_id >= 0) {
        /* vLLM reports a stop_token_ids match, not EOS */
        for (int i = 0; i < c->job->req.num_stop_token_ids; i++)
            if (c->job->req.stop_token_ids[i] == c->stop_id) return json_integer(c->stop_id);
    }
    return json_null();
}

static OaiLogprobs choice_lp(const Choice *c) {
    OaiLogprobs l = {c->ids, c->lp, c->top_ids, c->top_lp, c->job->req.logprobs};
    return l;
}

static void usage_totals(Job *j, int64_t *p, int64_t *g, int64_t *cached) {
    *p = *g = *cached = 0;
    for (int i = 0; i < j->nprompts; i++) *p += j->plen[i];
    for (int i = 0; i < j->nchoices; i++) {
        *g += j->ch[i].nids;
        if (j->ch[i].sub == 0) *cached += j->ch[i].num_cached;
    }
}

/* Splits a finished choice's text into reasoning / content / tool calls (whole text). */
static void chat_split(Job *j, Choice *c, const char *text, size_t len, int final, SBuf *reasoning,
                       SBuf *content) {
    SBuf mid = {0};
    if (j->use_reasoning) reasoning_feed(&c->rs, text, len, final, reasoning, &mid);
    else sbuf_add(&mid, text, len);
    if (j->use_tools) tool_stream_feed(&c->ts, mid.s ? mid.s : "", mid.len, final, content);
    else sbuf_add(content, mid.s ? mid.s : "", mid.len);
    sbuf_free(&mid);
}

static json_t *build_response(Server *s, Job *j) {
    json_t *choices = json_array();
    for (int i = 0; i < j->nchoices; i++) {
        Choice *c = &j->ch[i];
        json_t *lp = json_null();
        OaiLogprobs l = choice_lp(c);
        if (j->req.endpoint == OAI_COMPLETIONS) {
            SBuf text = {0};
            if (j->req.echo) sbuf_add(&text, j->ptext[c->prompt_idx], j->ptext_len[c->prompt_idx]);
            sbuf_add(&text, c->text.s ? c->text.s : "", c->text.len);
            if (j->req.logprobs >= 0) {
                int64_t off = 0;
                lp = oai_logprobs_completion(s->tok, &l, 0, c->nids, &off);
            }
            json_array_append_new(choices, json_pack("{s:i,s:s%,s:o,s:s,s:o,s:n}", "index", c->index, "text",
                                                     text.s ? text.s : "", text.len, "logprobs", lp,
                                                     "finish_reason", finish_name(c->finish), "stop_reason",
                                                     stop_reason_json(c), "prompt_logprobs"));
            sbuf_free(&text);
        } else {
            SBuf reasoning = {0}, content = {0};
            chat_split(j, c, c->text.s ? c->text.s : "", c->text.len, 1, &reasoning, &content);
            int ncalls = c->ts.num_calls;
            if (j->req.logprobs >= 0) lp = oai_logprobs_chat(s->tok, &l, 0, c->nids);
            json_t *msg = json_pack("{s:s,s:o,s:o,s:o}", "role", "assistant", "content",
                                    content.len || !ncalls ? json_stringn(content.s ? content.s : "", content.len) : json_null(),
                                    "reasoning_content",
                                    reasoning.len ? json_stringn(reasoning.s, reasoning.len) : json_null(),
                                    "tool_calls", oai_tool_calls(c->ts.calls, 0, ncalls, 0));
            json_array_append_new(choices, json_pack("{s:i,s:o,s:o,s:s,s:o}", "index", c->index, "message", msg,
                                                     "logprobs", lp, "finish_reason",
                                                     ncalls ? "tool_calls" : finish_name(c->finish),
                                                     "stop_reason", stop_reason_json(c)));
            sbuf_free(&reasoning);
            sbuf_free(&content);
        }
    }
    int64_t p, g, cached;
    usage_totals(j, &p, &g, &cached);
    return json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", j->id, "object",
                     j->req.endpoint == OAI_CHAT ? "chat.completion" : "text_completion", "created",
                     (json_int_t)j->created, "model", s->model_name, "choices", choices, "usage",
                     oai_usage(p, g, cached));
}

static json_t *chunk_base(Server *s, Job *j) {
    json_t *o = json_pack("{s:s,s:s,s:I,s:s}", "id", j->id, "object",
                          j->req.endpoint == OAI_CHAT ? "chat.completion.chunk" : "text_completion",
                          "created", (json_int_t)j->created, "model", s->model_name);
    return o;
}

static void emit_chunk(Server *s, Job *j, json_t *choice) {
    json_t *o = chunk_base(s, j);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (j->req.include_usage) json_object_set_new(o, "usage", json_null());
    oai_sse_append(&j->out, o);
}

/* Formats whatever the choices gained since the last call into j->out (under j->mu). */
static void produce(Server *s, Job *j) {
    int all_final = 1;
    for (int i = 0; i < j->nchoices; i++) {
        Choice *c = &j->ch[i];
        if (c->final_sent) continue;
        int final = c->done;
        const char *nt = (c->text.s ? c->text.s : "") + c->text_sent;
        size_t nl = c->text.len - c->text_sent;
        c->text_sent = c->text.len;
        int from = c->ids_sent, to = c->nids;
        c->ids_sent = c->nids;
        int want_lp = j->req.logprobs >= 0 && to > from;
        OaiLogprobs l = choice_lp(c);
        if (final && c->finish == CVLLM_FINISH_ERROR) {
            OaiError e;
            oai_error(&e, 500, NULL, "%s", c->error ? c->error : "the engine failed");
            oai_sse_append(&j->out, oai_error_body(&e));
        }
        if (j->req.endpoint == OAI_COMPLETIONS) {
            SBuf text = {0};
            if (!c->started) {
                c->started = 1;
                if (j->req.echo) sbuf_add(&text, j->ptext[c->prompt_idx], j->ptext_len[c->prompt_idx]);
            }
            sbuf_add(&text, nt, nl);
            if (text.len || want_lp || final) {
                json_t *lp = want_lp ? oai_logprobs_completion(s->tok, &l, from, to, &c->text_offset) : json_null();
                json_t *ch = json_pack("{s:i,s:s%,s:o,s:o,s:o}", "index", c->index, "text", text.s ? text.s : "",
                                       text.len, "logprobs", lp, "finish_reason",
                                       final ? json_string(finish_name(c->finish)) : json_null(),
                                       "stop_reason", final ? stop_reason_json(c) : json_null());
                if (ch) emit_chunk(s, j, ch);
            }
            sbuf_free(&text);
        } else {
            if (!c->started) {
                c->started = 1;
                emit_chunk(s, j, json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", c->index, "delta", "role",
                                           "assistant", "content", "", "logprobs", "finish_reason"));
            }
            SBuf reasoning = {0}, content = {0};
            int calls_before = c->ts.num_calls;
            chat_split(j, c, nt, nl, final, &reasoning, &content);
            int ncalls = c->ts.num_calls;
            if (reasoning.len || content.len || ncalls > calls_before || want_lp || final) {
                json_t *delta = json_object();
                if (reasoning.len) json_object_set_new(delta, "reasoning_content", json_stringn(reasoning.s, reasoning.len));
                if (content.len) json_object_set_new(delta, "content", json_stringn(content.s, content.len));
                if (ncalls > calls_before) json_object_set_new(delta, "tool_calls", oai_tool_calls(c->ts.calls, calls_before, ncalls, 1));
                json_t *lp = want_lp ? oai_logprobs_chat(s->tok, &l, from, to) : json_null();
                const char *fr = ncalls ? "tool_calls" : finish_name(c->finish);
                json_t *ch = json_pack("{s:i,s:o,s:o,s:o}", "index", c->index, "delta", delta, "logprobs", lp,
                                       "finish_reason", final ? json_string(fr) : json_null());
                if (final && ch) json_object_set_new(ch, "stop_reason", stop_reason_json(c));
                if (ch) emit_chunk(s, j, ch);
            }
            sbuf_free(&reasoning);
            sbuf_free(&content);
        }
        if (final) c->final_sent = 1;
        else all_final = 0;
    }
    if (all_final && !j->done_sent) {
        if (j->req.include_usage) {
            int64_t p, g, cached;
            usage_totals(j, &p, &g, &cached);
            json_t *o = chunk_base(s, j);
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", oai_usage(p, g, cached));
            oai_sse_append(&j->out, o);
        }
        sbuf_adds(&j->out, "data: [DONE]\n\n");
        j->done_sent = 1;
    }
}

static void add_ms(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_nsec += (long)ms * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Under j->mu, after a wait: 1 if the client has gone away (its socket is polled at most every
 * 100 ms, however often the Job is signalled). */
static int client_gone(Job *j) {
    double now = now_seconds();
    if (now < j->next_fd_check) return 0;
    j->next_fd_check = now + 0.1;
    return http_fd_closed(j->fd);
}

static ssize_t stream_read(void *cls, char *buf, size_t max) {
    Job *j = cls;
    Server *s = j->srv;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->out.len) {
            size_t n = j->out.len < max ? j->out.len : max;
            memcpy(buf, j->out.s, n);
            sbuf_consume(&j->out, n);
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->done_sent) {
            pthread_mutex_unlock(&j->mu);
            return HTTP_STREAM_END;
        }
        produce(s, j);
        if (j->out.len || j->done_sent) continue;
        struct timespec ts;
        add_ms(&ts, 100);
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (client_gone(j)) {
            pthread_mutex_unlock(&j->mu);
            return HTTP_STREAM_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    Job *j = cls;
    job_abort(j);
    job_list_remove(j->srv, j);
    job_unref(j);
}

/* ---------------------------------------------------------------- handlers */

static void reply_error(HttpRequest *r, const OaiError *e) { http_reply_json(r, e->status, oai_error_body(e)); }

static void handle_generate(Server *s, HttpRequest *r, OaiEndpoint ep) {
    OaiError err;
    OaiRequest rq;
    if (oai_request_parse(ep, r->body, r->body_len, &rq, &err) < 0) {
        reply_error(r, &err);
        return;
    }
    Job *j = job_new(s, &rq);
    j->fd = http_fd(r);
    if (job_prepare(s, j, &err) < 0 || job_submit(s, j, &err) < 0) {
        reply_error(r, &err);
        job_unref(j);
        return;
    }
    job_list_add(s, j);
    if (j->req.stream) {
        /* the stream owns the connection's reference now */
        if (http_reply_stream(r, 200, "text/event-stream; charset=utf-8", stream_read, stream_free, j) < 0) {
            /* stream_free has run (or will) */
        }
        return;
    }
    int gone = 0;
    pthread_mutex_lock(&j->mu);
    while (j->num_active > 0) {
        struct timespec ts;
        add_ms(&ts, 100);
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (j->num_active > 0 && client_gone(j)) {
            gone = 1;
            break;
        }
    }
    pthread_mutex_unlock(&j->mu);
    if (gone) {
        job_abort(j);
        http_reply(r, 499, "text/plain", xstrdup(""), 0);
    } else {
        const char *error = NULL;
        for (int i = 0; i < j->nchoices; i++)
            if (j->ch[i].finish == CVLLM_FINISH_ERROR) error = j->ch[i].error ? j->ch[i].error : "the engine failed";
        if (error) {
            oai_error(&err, 500, NULL, "%s", error);
            reply_error(r, &err);
        } else {
            http_reply_json(r, 200, build_response(s, j));
        }
    }
    job_list_remove(s, j);
    job_unref(j);
}

static void handle_models(Server *s, HttpRequest *r) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:s,s:n,s:i}", "id", s->model_name, "object", "model", "created",
                          (json_int_t)s->started, "owned_by", "cvllm", "root", s->o->model_dir, "parent",
                          "max_model_len", s->max_model_len);
    http_reply_json(r, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

static void handle_tokenize(Server *s, HttpRequest *r) {
    OaiError err;
    json_t *root = oai_parse_body(r->body, r->body_len, &err);
    if (!root) { reply_error(r, &err); return; }
    int32_t *ids = NULL;
    int n = -1;
    if (!s->tok) { oai_error(&err, 400, NULL, "the model has no tokenizer"); goto fail; }
    json_t *model = json_object_get(root, "model");
    if (json_is_string(model) && strcmp(json_string_value(model), s->model_name)) {
        oai_error(&err, 400, "model", "The model `%s` does not exist.", json_string_value(model));
        snprintf(err.code, sizeof err.code, "model_not_found");
        goto fail;
    }
    if (json_object_get(root, "messages")) {
        OaiRequest rq;
        if (oai_request_parse(OAI_CHAT, r->body, r->body_len, &rq, &err) < 0) goto fail;
        char *text = NULL;
        size_t len = 0;
        int rc = render_chat(s, &rq, &text, &len, &err);
        oai_request_free(&rq);
        if (rc < 0) goto fail;
        n = tokenizer_encode(s->tok, text, len, &ids);
        free(text);
    } else {
        json_t *p = json_object_get(root, "prompt");
        if (!json_is_string(p)) { oai_error(&err, 400, "prompt", "'prompt' (a string) or 'messages' is required"); goto fail; }
        n = tokenizer_encode(s->tok, json_string_value(p), json_string_length(p), &ids);
    }
    if (n < 0) { oai_error(&err, 400, "prompt", "%s", cvllm_last_error()); goto fail; }
    json_t *toks = json_array(), *strs = json_is_true(json_object_get(root, "return_token_strs")) ? json_array() : json_null();
    for (int i = 0; i < n; i++) {
        json_array_append_new(toks, json_integer(ids[i]));
        if (json_is_array(strs)) {
            const char *t = tokenizer_id_to_token(s->tok, ids[i]);
            json_array_append_new(strs, t && json_string(t) ? json_string(t) : json_string(""));
        }
    }
    free(ids);
    json_decref(root);
    http_reply_json(r, 200, json_pack("{s:i,s:i,s:o,s:o}", "count", n, "max_model_len", s->max_model_len, "tokens", toks,
                                      "token_strs", strs));
    return;
fail:
    free(ids);
    json_decref(root);
    reply_error(r, &err);
}

static void handle_detokenize(Server *s, HttpRequest *r) {
    OaiError err;
    json_t *root = oai_parse_body(r->body, r->body_len, &err);
    if (!root) { reply_error(r, &err); return; }
    json_t *t = json_object_get(root, "tokens");
    if (!s->tok) { oai_error(&err, 400, NULL, "the model has no tokenizer"); goto fail; }
    if (!json_is_array(t)) { oai_error(&err, 400, "tokens", "'tokens' must be an array of token ids"); goto fail; }
    size_t n = json_array_size(t);
    int32_t *ids = xmalloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(t, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= s->vocab) {
            free(ids);
            oai_error(&err, 400, "tokens", "tokens[%zu] must be a token id in [0, %d)", i, s->vocab);
            goto fail;
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    size_t len = 0;
    char *text = tokenizer_decode_len(s->tok, ids, (int)n, 0, &len);
    free(ids);
    if (!text) { oai_error(&err, 400, "tokens", "%s", cvllm_last_error()); goto fail; }
    json_decref(root);
    http_reply_json(r, 200, json_pack("{s:s%}", "prompt", text, len));
    free(text);
    return;
fail:
    json_decref(root);
    reply_error(r, &err);
}

static void handle_metrics(Server *s, HttpRequest *r) {
    CvllmStats st;
    cvllm_engine_get_stats(s->e, &st);
    SBuf out = {0};
    metrics_render(&s->metrics, &st, s->model_name, &out);
    http_reply(r, 200, "text/plain; version=0.0.4; charset=utf-8", out.s ? out.s : xstrdup(""), out.len);
}

static void handle_live(Server *s, HttpRequest *r) {
    CvllmStats st;
    pthread_mutex_lock(&s->owners_mu);
    int n = cvllm_engine_block_owners(s->e, s->owners, s->num_blocks);
    if (n > s->num_blocks) n = s->num_blocks;
    cvllm_engine_get_stats(s->e, &st);
    LiveRequest *reqs = NULL;
    int nreq = 0, cap = 0;
    double now = now_seconds();
    pthread_mutex_lock(&s->mu);
    for (Job *j = s->jobs; j; j = j->next) {
        pthread_mutex_lock(&j->mu);
        for (int i = 0; i < j->nchoices; i++) {
            Choice *c = &j->ch[i];
            if (!c->submitted || c->done || c->engine_id < 0) continue;
            LiveRequest lr = {c->engine_id, j->plen[c->prompt_idx], c->nids, c->num_cached, j->max_tokens, now - j->t_arrival};
            DA_PUSH(reqs, nreq, cap, lr);
        }
        pthread_mutex_unlock(&j->mu);
    }
    pthread_mutex_unlock(&s->mu);
    SBuf out = {0};
    live_view_json(&out, s->owners, n, reqs, nreq, &st, cvllm_engine_block_size(s->e), s->model_name, now);
    pthread_mutex_unlock(&s->owners_mu);
    free(reqs);
    http_reply(r, 200, "application/json", out.s ? out.s : xstrdup("{}"), out.len);
}

static int key_ok(Server *s, HttpRequest *r) {
    const char *want = s->o->api_key;
    if (!want) return 1;
    const char *h = http_header(r, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    h += 7;
    size_t a = strlen(h), b = strlen(want);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(h[i] ^ want[i]);
    return diff == 0;
}

static void on_http(void *cls, HttpRequest *r) {
    Server *s = cls;
    OaiError err;
    const char *u = r->url, *m = r->method;
    int get = !strcmp(m, "GET") || !strcmp(m, "HEAD"), post = !strcmp(m, "POST");
    if (!strncmp(u, "/v1/", 4) && !key_ok(s, r)) {
        oai_error(&err, 401, NULL, "Incorrect or missing API key: send 'Authorization: Bearer KEY'");
        snprintf(err.code, sizeof err.code, "invalid_api_key");
        reply_error(r, &err);
        return;
    }
    struct { const char *path; int is_post; } routes[] = {
        {"/v1/completions", 1}, {"/v1/chat/completions", 1}, {"/tokenize", 1}, {"/detokenize", 1},
        {"/v1/models", 0}, {"/health", 0}, {"/metrics", 0}, {"/", 0}, {"/live.json", 0}, {"/version", 0}};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(u, routes[i].path)) continue;
        if (routes[i].is_post ? !post : !get) {
            oai_error(&err, 405, NULL, "method %s not allowed on %s", m, u);
            reply_error(r, &err);
            return;
        }
        switch (i) {
        case 0: handle_generate(s, r, OAI_COMPLETIONS); return;
        case 1: handle_generate(s, r, OAI_CHAT); return;
        case 2: handle_tokenize(s, r); return;
        case 3: handle_detokenize(s, r); return;
        case 4: handle_models(s, r); return;
        case 5:
            if (atomic_load(&s->shutting_down) || atomic_load(&s->engine_failed)) {
                oai_error(&err, 503, NULL, "shutting down");
                reply_error(r, &err);
            } else http_reply(r, 200, "text/plain", xstrdup(""), 0);
            return;
        case 6: handle_metrics(s, r); return;
        case 7: http_reply(r, 200, "text/html; charset=utf-8", xstrdup(LIVE_VIEW_PAGE), strlen(LIVE_VIEW_PAGE)); return;
        case 8: handle_live(s, r); return;
        case 9: http_reply_json(r, 200, json_pack("{s:s}", "version", cvllm_version())); return;
        }
    }
    oai_error(&err, 404, NULL, "no such endpoint: %s %s", m, u);
    reply_error(r, &err);
}

/* ---------------------------------------------------------------- main */

typedef struct {
    Server *s;
    int rc;
} EngineThread;

static void *engine_main(void *arg) {
    EngineThread *t = arg;
    t->rc = cvllm_engine_run(t->s->e);
    if (t->rc < 0) {
        fprintf(stderr, "cvllm serve: the engine stopped: %s\n", cvllm_last_error());
        atomic_store(&t->s->engine_failed, 1);
        kill(getpid(), SIGTERM);
    }
    return NULL;
}

void server_options_default(ServerOptions *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->tool_parser = 1;
    o->max_body_bytes = 32u << 20;
    o->max_queue_len = 4096;
    o->max_connections = 4096;
    o->shutdown_timeout = 30;
    cvllm_engine_options_default(&o->engine);
}

static void raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* Waits up to seconds for the engine thread; a second SIGTERM / SIGINT cuts the wait short. */
static int join_engine(pthread_t th, double seconds, sigset_t *set) {
    double end = now_seconds() + seconds;
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        if (pthread_timedjoin_np(th, NULL, &ts) == 0) return 0;
        struct timespec zero = {0, 0};
        if (sigtimedwait(set, NULL, &zero) > 0 || now_seconds() > end) return -1;
    }
}

int server_main(const ServerOptions *o) {
    signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    raise_fd_limit();

    Server *s = xcalloc(1, sizeof *s);
    s->o = o;
    s->started = (long)time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->owners_mu, NULL);
    metrics_init(&s->metrics);
    int rc = 1;
    if (cvllm_engine_create(o->model_dir, &o->engine, &s->e) < 0) {
        fprintf(stderr, "cvllm serve: %s\n", cvllm_last_error());
        goto out;
    }
    s->tok = cvllm_engine_tokenizer(s->e);
    s->model_name = o->served_model_name ? o->served_model_name : o->model_dir;
    s->max_model_len = cvllm_engine_max_model_len(s->e);
    s->vocab = cvllm_engine_vocab_size(s->e);
    if (s->tok && tokenizer_chat_template(s->tok) &&
        chat_template_compile(tokenizer_chat_template(s->tok), &s->tmpl) < 0) {
        fprintf(stderr, "cvllm serve: warning: the chat template does not compile (%s); "
                        "/v1/chat/completions will refuse requests\n", cvllm_last_error());
        s->tmpl = NULL;
    }
    s->num_blocks = cvllm_engine_block_owners(s->e, NULL, 0);
    s->owners = xcalloc((size_t)(s->num_blocks > 0 ? s->num_blocks : 1), sizeof *s->owners);

    EngineThread et = {s, 0};
    pthread_t th;
    if (pthread_create(&th, NULL, engine_main, &et) != 0) {
        fprintf(stderr, "cvllm serve: cannot start the engine thread\n");
        goto out;
    }
    HttpOptions ho = {o->host, o->port, o->max_body_bytes, o->max_connections, 600};
    s->http = http_start(&ho, on_http, s);
    if (!s->http) {
        cvllm_engine_shutdown(s->e, 0);
        pthread_join(th, NULL);
        goto out;
    }
    int port = http_port(s->http);
    fprintf(stderr, "cvllm serve: %s on http://%s:%d (max_model_len %d, %d KV blocks of %d tokens)\n",
            s->model_name, o->host, port, s->max_model_len, s->num_blocks, cvllm_engine_block_size(s->e));
    if (o->port_file) {
        FILE *f = fopen(o->port_file, "w");
        if (f) {
            fprintf(f, "%d\n", port);
            fclose(f);
        }
    }
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "cvllm serve: %s: draining (%.0f s at most)\n", sig == SIGINT ? "SIGINT" : "SIGTERM", o->shutdown_timeout);
    atomic_store(&s->shutting_down, 1);
    http_quiesce(s->http);
    cvllm_engine_shutdown(s->e, 1);
    if (join_engine(th, o->shutdown_timeout, &set) < 0) {
        fprintf(stderr, "cvllm serve: aborting the requests still running\n");
        pthread_mutex_lock(&s->mu);
        Job *js[1024];
        int nj = 0;
        for (Job *j = s->jobs; j && nj < 1024; j = j->next) js[nj++] = j;
        for (int i = 0; i < nj; i++) {
            pthread_mutex_lock(&js[i]->mu);
            js[i]->refs++;
            pthread_mutex_unlock(&js[i]->mu);
        }
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < nj; i++) {
            job_abort(js[i]);
            job_unref(js[i]);
        }
        cvllm_engine_shutdown(s->e, 0);
        pthread_join(th, NULL);
    }
    /* let the connections write their last bytes */
    for (int i = 0; i < 50 && http_active_requests(s->http) > 0; i++) usleep(100000);
    http_stop(s->http);
    rc = atomic_load(&s->engine_failed) ? 1 : 0;
    fprintf(stderr, "cvllm serve: stopped\n");
out:
    cvllm_engine_destroy(s->e);
    chat_template_free(s->tmpl);
    metrics_destroy(&s->metrics);
    free(s->owners);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->owners_mu);
    free(s);
    return rc;
}
