/* sbuf.h: a growable byte string (the server's text buffers). */
#ifndef CVLLM_SERVER_SBUF_H
#define CVLLM_SERVER_SBUF_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

typedef struct {
    char *s; /* NUL-terminated when not NULL */
    size_t len, cap;
} SBuf;

static inline void sbuf_reserve(SBuf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    b->s = xrealloc(b->s, cap);
    b->cap = cap;
}
static inline void sbuf_add(SBuf *b, const char *s, size_t n) {
    if (n == 0 || n > (size_t)PTRDIFF_MAX) return; /* (the bound also quiets GCC's -Wstringop-overflow) */
    sbuf_reserve(b, n);
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}
static inline void sbuf_adds(SBuf *b, const char *s) { sbuf_add(b, s, strlen(s)); }
static inline void sbuf_printf(SBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void sbuf_printf(SBuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    sbuf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}
/* Drops the first n bytes. */
static inline void sbuf_consume(SBuf *b, size_t n) {
    if (n >= b->len) { b->len = 0; if (b->s) b->s[0] = 0; return; }
    memmove(b->s, b->s + n, b->len - n);
    b->len -= n;
    b->s[b->len] = 0;
}
static inline void sbuf_clear(SBuf *b) { b->len = 0; if (b->s) b->s[0] = 0; }
static inline void sbuf_free(SBuf *b) { free(b->s); b->s = NULL; b->len = b->cap = 0; }

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag (text to hold back
 * while streaming, as it may become the tag). */
static inline size_t sbuf_tag_prefix_suffix(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    for (size_t k = (n < t - 1 ? n : t - 1); k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}
/* Position of tag in s[0..n), or -1. */
static inline long sbuf_find(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    if (t > n) return -1;
    for (size_t i = 0; i + t <= n; i++)
        if (s[i] == tag[0] && !memcmp(s + i, tag, t)) return (long)i;
    return -1;
}

#endif
