/* reasoning_parser.c: the qwen3 reasoning parser (see reasoning_parser.h). */
#include "server/reasoning_parser.h"

static const char THINK[] = "<think>", END[] = "</think>";

void reasoning_init(ReasoningStream *s) { memset(s, 0, sizeof *s); }
void reasoning_free(ReasoningStream *s) { sbuf_free(&s->hold); }

void reasoning_feed(ReasoningStream *s, const char *text, size_t n, int final, SBuf *reasoning,
                    SBuf *content) {
    sbuf_add(&s->hold, text, n);
    for (;;) {
        if (s->state == 2) {
            sbuf_add(content, s->hold.s, s->hold.len);
            sbuf_clear(&s->hold);
            return;
        }
        const char *tag = s->state == 0 ? THINK : END;
        SBuf *out = s->state == 0 ? content : reasoning;
        long at = sbuf_find(s->hold.s, s->hold.len, tag);
        if (at >= 0) {
            sbuf_add(out, s->hold.s, (size_t)at);
            sbuf_consume(&s->hold, (size_t)at + strlen(tag));
            s->state++;
            continue;
        }
        size_t keep = final ? 0 : sbuf_tag_prefix_suffix(s->hold.s, s->hold.len, tag);
        sbuf_add(out, s->hold.s, s->hold.len - keep);
        sbuf_consume(&s->hold, s->hold.len - keep);
        return;
    }
}
