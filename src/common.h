/* common.h: what every module uses. CHECK for broken invariants (always on, aborts with file/line),
 * a thread-local "last error" for anything the outside world can cause (bad files, bad requests),
 * checked allocation, timing. Errors from outside are never aborts: functions return a negative
 * CVLLM_E* code and set the message with cvllm_errorf(). */
#ifndef CVLLM_COMMON_H
#define CVLLM_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cvllm.h" /* error codes CVLLM_OK / CVLLM_E* */

/* Broken invariant = bug: print where and why, then abort. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Sets this thread's last error message (printf-style) and returns code (a negative CVLLM_E*). */
int cvllm_errorf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current error message with "ctx: " (for adding context while unwinding); returns code. */
int cvllm_error_wrap(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Allocation that aborts on out-of-memory (the only failure we do not recover from). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/* Growable arrays: DA_PUSH(arr, len, cap, value). */
#define DA_PUSH(arr, len, cap, value)                                                              \
    do {                                                                                           \
        if ((len) >= (cap)) {                                                                      \
            (cap) = (cap) ? 2 * (cap) : 16;                                                        \
            (arr) = xrealloc((arr), (size_t)(cap) * sizeof(*(arr)));                               \
        }                                                                                          \
        (arr)[(len)++] = (value);                                                                  \
    } while (0)

/* Monotonic wall clock in seconds. */
double now_seconds(void);

/* Reads a whole file into a NUL-terminated buffer. Returns NULL and sets the error on failure. */
char *read_file(const char *path, size_t *len_out);

/* Joins a folder and a file name into a new string ("dir/name"). */
char *path_join(const char *dir, const char *name);

/* Parses "123", "2G", "512M", "64k" (powers of 1024) into bytes; returns -1 on bad input. */
int64_t parse_bytes(const char *s);

/* bf16 / f16 <-> f32 conversions (round-to-nearest-even on the way down). */
static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
static inline uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN */
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

#endif
