/* openai_request.h: the body of an OpenAI request (POST /v1/completions, /v1/chat/completions)
 * parsed and checked into an OaiRequest. Pure: no engine, no tokenizer; every problem a client can
 * cause becomes an OaiError (HTTP status, the offending field, a message), never a crash. The
 * checks that need the model (prompt length, vocabulary, max_model_len) are the server's. */
#ifndef CVLLM_SERVER_OPENAI_REQUEST_H
#define CVLLM_SERVER_OPENAI_REQUEST_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"

/* The most choices one request may ask for (n times the number of prompts). */
#define OAI_MAX_CHOICES 256
/* The most stop strings / stop token ids per request. */
#define OAI_MAX_STOP 64

typedef struct {
    int status;        /* HTTP status: 400, 401, 404, 413, 500, 503 */
    char param[64];    /* the request field at fault, "" if none */
    char code[48];     /* OpenAI's error code ("model_not_found", ...), "" if none */
    char message[512];
} OaiError;

/* Fills e and returns -1 (so that `return oai_error(...)` reads naturally). */
int oai_error(OaiError *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

typedef enum { OAI_COMPLETIONS = 0, OAI_CHAT } OaiEndpoint;

typedef struct {
    char *text; /* text prompt (NUL-terminated, valid UTF-8), or NULL: */
    size_t len;
    int32_t *ids; /* token-id prompt */
    int num_ids;
} OaiPrompt;

typedef enum { OAI_TOOLS_NONE = 0, OAI_TOOLS_AUTO } OaiToolChoice;

typedef struct {
    OaiEndpoint endpoint;
    char *model;              /* NULL: not given (the served model) */
    /* completions */
    OaiPrompt *prompts;
    int num_prompts;
    int echo;
    /* chat */
    json_t *messages;         /* array of message objects, content flattened to strings or null */
    json_t *tools;            /* NULL or the array of tools as given */
    json_t *template_kwargs;  /* NULL or the chat_template_kwargs object */
    int add_generation_prompt;
    int continue_final_message;
    OaiToolChoice tool_choice; /* AUTO when tools are given (unless "none") */
    /* both */
    int max_tokens;           /* 0: not given (completions: 16; chat: what max_model_len leaves) */
    CvllmSamplingParams params; /* stop / stop_token_ids point into the arrays below */
    char **stop;
    int num_stop;
    int32_t *stop_token_ids;
    int num_stop_token_ids;
    int n;
    int stream, include_usage;
    int logprobs;             /* -1: none; else the number of top log-probs per token (0..20) */
} OaiRequest;

/* Parses body (len bytes, not necessarily NUL-terminated). Returns 0, or -1 with err filled
 * (status 400) and r left empty (nothing to free). */
int oai_request_parse(OaiEndpoint ep, const char *body, size_t len, OaiRequest *r, OaiError *err);
void oai_request_free(OaiRequest *r);


/* Parses a JSON body into an object: 400 for invalid UTF-8, malformed JSON or a non-object. */
json_t *oai_parse_body(const char *body, size_t len, OaiError *err);

#endif
