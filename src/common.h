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
/* Prefixes the current error message with "ctx: " (for adding context while unwinding); returns code.
 * A message that already starts with ctx (followed by ':' or '/', as "DIR: ..." or "DIR/file: ...")
 * is left as it is, so that a path named by a loader is not named twice by its caller. */
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

/* ---- files from the outside world ------------------------------------------------------------
 * Every loader and every file the CLI reads goes through these. Only regular files are read: the
 * type is checked with stat() before the open (a FIFO would block the open, /dev/zero or
 * /dev/urandom would never end), the open is non-blocking, and fstat() after it must find the same
 * regular file (a swap in between is refused). A file larger than the caller's cap is refused
 * before any byte is read. Messages start with the path: "PATH: is a directory, not a file". */

/* Caps for the files of a model folder (generous: real ones are far smaller). */
#define FILE_MAX_CONFIG ((size_t)4 << 20)      /* config.json, generation_config.json */
#define FILE_MAX_TOKENIZER ((size_t)256 << 20) /* tokenizer.json (Qwen3's: 11 MB) */
#define FILE_MAX_TOKENIZER_CONFIG ((size_t)64 << 20) /* tokenizer_config.json, chat templates */
#define FILE_MAX_INDEX ((size_t)64 << 20)      /* model.safetensors.index.json */
#define FILE_MAX_DEFAULT ((size_t)1 << 30)     /* read_file */

/* Whether path exists: 1 yes, 0 no (ENOENT / ENOTDIR), or a negative code with the message set when
 * it cannot be told (a symlink loop, a dangling symlink, no permission on the folder). */
int path_probe(const char *path);

/* Opens the regular file path for reading (read-only, close-on-exec) if it holds at most max_bytes.
 * Returns the descriptor (>= 0) and its size in *size_out, or CVLLM_EIO with the message set (a
 * missing, unreadable or special file, or one over the cap). */
int file_open_regular(const char *path, size_t max_bytes, size_t *size_out);

/* Reads a whole regular file of at most max_bytes into a NUL-terminated buffer (*len_out: its
 * length; the file may contain NUL bytes). Returns NULL and sets the error on failure. */
char *file_read(const char *path, size_t max_bytes, size_t *len_out);

/* file_read with FILE_MAX_DEFAULT. */
char *read_file(const char *path, size_t *len_out);

/* Parses JSON text[0..len) with jansson's flags. On failure returns NULL with CVLLM_EFORMAT and a
 * message for a person, prefixed "what: ": the line and column of a syntax error ("invalid JSON at
 * line L column C: ..."; just the column for one-line text); a number too large for jansson named by
 * its key ("eos_token_id (99999999999999999999) is out of range"); and, for a raw NUL byte or a
 * \u0000 escape without JSON_ALLOW_NUL, "contains a NUL character". */
struct json_t *cvllm_json_parse(const char *text, size_t len, size_t flags, const char *what);

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

/* fp8 e4m3 (OCP "E4M3FN", torch.float8_e4m3fn: sign, 4 exponent bits with bias 7, 3 mantissa
 * bits; no infinities; 0x7f / 0xff are NaN; largest finite 448) <-> f32, bit for bit what CUDA's
 * __nv_cvt_fp8_to_halfraw and __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) give (vLLM's
 * conversions for an fp8 KV cache): round to nearest even, a finite value beyond 448 and +-inf
 * saturate to +-448, |x| <= 2^-10 gives a signed zero, every NaN gives 0x7f. */
float fp8_e4m3_to_f32(uint8_t b);
uint8_t f32_to_fp8_e4m3(float f);

#endif
