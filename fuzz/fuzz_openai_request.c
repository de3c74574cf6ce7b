/* fuzz_openai_request.c: the server's request parser on arbitrary bodies (both endpoints) must
 * accept or refuse with a 400 and a message, and an accepted request must satisfy what the server
 * relies on. The same bytes, as model output, go through the tool-call and reasoning parsers
 * whole and split at a point taken from the input: both ways must give the same result. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"
#include "server/reasoning_parser.h"
#include "server/tool_parser.h"

static void check_request(const OaiRequest *r) {
    if (r->n < 1 || r->n > OAI_MAX_CHOICES || r->logprobs < -1 || r->logprobs > CVLLM_MAX_LOGPROBS ||
        r->max_tokens < 0 || r->num_stop > OAI_MAX_STOP || r->num_stop_token_ids > OAI_MAX_STOP ||
        r->params.num_stop != r->num_stop || !(r->params.top_p > 0 && r->params.top_p <= 1) ||
        !(r->params.temperature >= 0))
        __builtin_trap();
    if (r->endpoint == OAI_COMPLETIONS) {
        if (r->num_prompts < 1 || r->num_prompts * r->n > OAI_MAX_CHOICES) __builtin_trap();
        for (int i = 0; i < r->num_prompts; i++) {
            const OaiPrompt *p = &r->prompts[i];
            if (!p->text == !p->ids) __builtin_trap();
            if (p->ids && p->num_ids < 1) __builtin_trap();
            if (p->text && !utf8_valid(p->text, p->len)) __builtin_trap();
        }
    } else {
        if (!json_is_array(r->messages) || json_array_size(r->messages) < 1) __builtin_trap();
        for (size_t i = 0; i < json_array_size(r->messages); i++) {
            json_t *c = json_object_get(json_array_get(r->messages, i), "content");
            if (c && !json_is_null(c) && !json_is_string(c)) __builtin_trap();
        }
    }
    for (int i = 0; i < r->num_stop; i++)
        if (!r->stop[i][0]) __builtin_trap();
}

static void parsers(const uint8_t *data, size_t size) {
    size_t cut = size ? data[0] % (size + 1) : 0;
    const char *t = (const char *)data;
    SBuf c1 = {0}, c2 = {0}, r1 = {0}, r2 = {0};
    ToolStream a, b;
    tool_stream_init(&a);
    tool_stream_init(&b);
    tool_stream_feed(&a, t, size, 1, &c1);
    tool_stream_feed(&b, t, cut, 0, &c2);
    tool_stream_feed(&b, t + cut, size - cut, 1, &c2);
    if (c1.len != c2.len || (c1.len && memcmp(c1.s, c2.s, c1.len)) || a.num_calls != b.num_calls) __builtin_trap();
    tool_stream_free(&a);
    tool_stream_free(&b);
    sbuf_clear(&c1);
    sbuf_clear(&c2);
    ReasoningStream x, y;
    reasoning_init(&x);
    reasoning_init(&y);
    reasoning_feed(&x, t, size, 1, &r1, &c1);
    reasoning_feed(&y, t, cut, 0, &r2, &c2);
    reasoning_feed(&y, t + cut, size - cut, 1, &r2, &c2);
    if (c1.len != c2.len || r1.len != r2.len || (c1.len && memcmp(c1.s, c2.s, c1.len)) ||
        (r1.len && memcmp(r1.s, r2.s, r1.len)) || c1.len + r1.len > size)
        __builtin_trap();
    reasoning_free(&x);
    reasoning_free(&y);
    sbuf_free(&c1);
    sbuf_free(&c2);
    sbuf_free(&r1);
    sbuf_free(&r2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int ep = 0; ep < 2; ep++) {
        OaiRequest r;
        OaiError e;
        if (oai_request_parse((OaiEndpoint)ep, (const char *)data, size, &r, &e) == 0) {
            check_request(&r);
            oai_request_free(&r);
        } else if (e.status != 400 || !e.message[0]) {
            __builtin_trap();
        }
    }
    parsers(data, size);
    return 0;
}
