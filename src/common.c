/* common.c: error messages, checked allocation, small file and parsing helpers. */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char g_error[2048];

int cvllm_errorf(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    return code;
}

int cvllm_error_wrap(int code, const char *fmt, ...) {
    char prefix[1024], old[sizeof g_error];
    size_t n;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    n = strlen(prefix);
    size_t k = n; /* already named: "DIR: ..." or "DIR/file: ..." (DIR given with or without a '/') */
    while (k > 1 && prefix[k - 1] == '/') k--;
    if (k > 0 && strncmp(g_error, prefix, k) == 0 && (g_error[k] == ':' || g_error[k] == '/'))
        return code;
    memcpy(old, g_error, sizeof old);
    if (n > sizeof g_error - 3) n = sizeof g_error - 3;
    memcpy(g_error, prefix, n);
    memcpy(g_error + n, ": ", 2);
    size_t rest = strlen(old);
    if (rest > sizeof g_error - n - 3) rest = sizeof g_error - n - 3;
    memcpy(g_error + n + 2, old, rest);
    g_error[n + 2 + rest] = '\0';
    return code;
}

const char *cvllm_last_error(void) { return g_error; }

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    CHECK(p != NULL, "out of memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    CHECK(p != NULL, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    CHECK(q != NULL, "out of memory reallocating %zu bytes", n);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    memcpy(d, s, n);
    return d;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- files ------------------------------------------------------------------------------------ */

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "a special file";
}

static void format_size(char *buf, size_t cap, uint64_t n) {
    if (n >= (1u << 20) && n % (1u << 20) == 0) snprintf(buf, cap, "%llu MiB", (unsigned long long)(n >> 20));
    else snprintf(buf, cap, "%llu bytes", (unsigned long long)n);
}

static int too_large(const char *path, uint64_t size, size_t max_bytes) {
    char lim[64];
    format_size(lim, sizeof lim, max_bytes);
    return cvllm_errorf(CVLLM_EIO, "%s: too large (%llu bytes or more; the limit for this file is %s)",
                        path, (unsigned long long)size, lim);
}

int path_probe(const char *path) {
    struct stat sb;
    if (stat(path, &sb) == 0) return 1;
    int e = errno;
    if (e == ENOENT || e == ENOTDIR) {
        if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode))
            return cvllm_errorf(CVLLM_EIO, "%s: a symbolic link to a missing file", path);
        return 0;
    }
    return cvllm_errorf(CVLLM_EIO, "%s: %s", path, strerror(e));
}

int file_open_regular(const char *path, size_t max_bytes, size_t *size_out) {
    struct stat before, after;
    if (stat(path, &before) != 0) {
        int e = errno;
        if (e == ENOENT && lstat(path, &after) == 0 && S_ISLNK(after.st_mode))
            return cvllm_errorf(CVLLM_EIO, "%s: a symbolic link to a missing file", path);
        return cvllm_errorf(CVLLM_EIO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(before.st_mode))
        return cvllm_errorf(CVLLM_EIO, "%s: %s, not a regular file", path, file_kind(before.st_mode));
    if ((uint64_t)before.st_size > max_bytes) return too_large(path, (uint64_t)before.st_size, max_bytes);
    /* O_NONBLOCK: should a FIFO have been swapped in since the stat, the open does not block */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return cvllm_errorf(CVLLM_EIO, "%s: %s", path, strerror(errno));
    if (fstat(fd, &after) != 0 || !S_ISREG(after.st_mode) || after.st_dev != before.st_dev ||
        after.st_ino != before.st_ino) {
        close(fd);
        return cvllm_errorf(CVLLM_EIO, "%s: replaced while being opened", path);
    }
    if ((uint64_t)after.st_size > max_bytes) {
        close(fd);
        return too_large(path, (uint64_t)after.st_size, max_bytes);
    }
    if (size_out) *size_out = (size_t)after.st_size;
    return fd;
}

char *file_read(const char *path, size_t max_bytes, size_t *len_out) {
    size_t size;
    int fd = file_open_regular(path, max_bytes, &size);
    if (fd < 0) return NULL;
    /* Read one byte past the expected size: a file that grew (or a /proc file whose size reads 0)
     * is read to its end, and never past the cap. */
    const size_t limit = max_bytes < SIZE_MAX - 2 ? max_bytes + 1 : SIZE_MAX - 2;
    size_t cap = size < limit ? size + 1 : limit, len = 0;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (len == cap) {
            if (cap >= limit) break;
            cap = cap > limit / 2 ? limit : (cap < 4096 ? 4096 : 2 * cap);
            if (cap > limit) cap = limit;
            buf = xrealloc(buf, cap + 1);
        }
        ssize_t got = read(fd, buf + len, cap - len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int e = errno;
            close(fd);
            free(buf);
            cvllm_errorf(CVLLM_EIO, "%s: %s", path, strerror(e));
            return NULL;
        }
        if (got == 0) break;
        len += (size_t)got;
    }
    close(fd);
    if (len > max_bytes) {
        free(buf);
        too_large(path, len, max_bytes);
        return NULL;
    }
    buf[len] = '\0';
    if (len_out) *len_out = len;
    return buf;
}

char *read_file(const char *path, size_t *len_out) { return file_read(path, FILE_MAX_DEFAULT, len_out); }

/* ---- JSON --------------------------------------------------------------------------------------- */

/* t[i] is the closing quote of a string: the index of its opening quote (or -1). */
static long string_start_back(const char *t, long i) {
    for (i--; i >= 0; i--) {
        if (t[i] != '"') continue;
        long k = i - 1, bs = 0;
        while (k >= 0 && t[k] == '\\') k--, bs++;
        if (bs % 2 == 0) return i;
    }
    return -1;
}

static long skip_space_back(const char *t, long i) {
    while (i >= 0 && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) i--;
    return i;
}

/* If t[i] (after whitespace, going back) is the ':' of a member, copies its key into out. */
static int member_key_back(const char *t, long i, char *out, size_t cap) {
    i = skip_space_back(t, i);
    if (i < 0 || t[i] != ':') return 0;
    i = skip_space_back(t, i - 1);
    if (i < 0 || t[i] != '"') return 0;
    long open = string_start_back(t, i);
    if (open < 0) return 0;
    size_t n = (size_t)(i - open - 1);
    if (n >= cap) n = cap - 1;
    memcpy(out, t + open + 1, n);
    out[n] = '\0';
    return 1;
}

/* Names the value that starts at t[start] (valid JSON before it): "key", "key[3]", or "". */
static void value_name(const char *t, long start, char *out, size_t cap) {
    out[0] = '\0';
    if (member_key_back(t, start - 1, out, cap)) return;
    /* an array element: find the enclosing '[' (counting the elements before ours) */
    long i = start - 1, depth = 0, index = 0;
    for (; i >= 0; i--) {
        char c = t[i];
        if (c == '"') {
            if ((i = string_start_back(t, i)) < 0) return;
        } else if (c == ']' || c == '}') {
            depth++;
        } else if (c == '[' || c == '{') {
            if (depth == 0) break;
            depth--;
        } else if (c == ',' && depth == 0) {
            index++;
        }
    }
    if (i < 0 || t[i] != '[') return;
    char key[128];
    if (member_key_back(t, i - 1, key, sizeof key)) snprintf(out, cap, "%s[%ld]", key, index);
    else snprintf(out, cap, "[%ld]", index);
}

struct json_t *cvllm_json_parse(const char *text, size_t len, size_t flags, const char *what) {
    if (memchr(text, 0, len)) {
        cvllm_errorf(CVLLM_EFORMAT, "%s: contains a NUL character", what);
        return NULL;
    }
    json_error_t err;
    json_t *j = json_loadb(text, len, flags, &err);
    if (j) return j;
    enum json_error_code code = json_error_code(&err);
    if (code == json_error_null_character || code == json_error_null_byte_in_key) {
        cvllm_errorf(CVLLM_EFORMAT, "%s: contains a NUL character", what);
        return NULL;
    }
    long pos = err.position > 0 && (size_t)err.position <= len ? err.position : -1;
    if (code == json_error_numeric_overflow && pos > 0) {
        long start = pos;
        while (start > 0 && strchr("0123456789+-.eE", text[start - 1])) start--;
        char name[160], num[48];
        int n = (int)(pos - start) < 40 ? (int)(pos - start) : 40;
        snprintf(num, sizeof num, "%.*s%s", n, text + start, pos - start > 40 ? "..." : "");
        value_name(text, start, name, sizeof name);
        if (name[0])
            cvllm_errorf(CVLLM_EFORMAT, "%s: %s (%s) is out of range", what, name, num);
        else
            cvllm_errorf(CVLLM_EFORMAT, "%s: the number %s is out of range", what, num);
        return NULL;
    }
    if (memchr(text, '\n', len))
        cvllm_errorf(CVLLM_EFORMAT, "%s: invalid JSON at line %d column %d: %s", what, err.line,
                     err.column, err.text);
    else
        cvllm_errorf(CVLLM_EFORMAT, "%s: invalid JSON at column %d: %s", what, err.column, err.text);
    return NULL;
}

char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = xmalloc(a + b + 2);
    memcpy(p, dir, a);
    size_t k = a;
    if (a > 0 && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

int64_t parse_bytes(const char *s) {
    /* a plain decimal number: no sign, spaces, hex, inf or nan (strtod would take them) */
    if (!s || !((*s >= '0' && *s <= '9') || (*s == '.' && s[1] >= '0' && s[1] <= '9'))) return -1;
    for (const char *p = s; *p && !strchr("kKmMgGtTiIbB", *p); p++)
        if (!((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '-' || *p == '+'))
            return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0)) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end != '\0') return -1;
    double r = v * mul;
    if (r > 9.0e18) return -1;
    return (int64_t)r;
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalize */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) { mant <<= 1; exp--; }
            mant &= 0x3ffu;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
    union { uint32_t u; float f; } v = {.u = bits};
    return v.f;
}

float fp8_e4m3_to_f32(uint8_t b) {
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24, exp = (b >> 3) & 0xfu, mant = b & 0x7u;
    union { uint32_t u; float f; } v;
    if (exp == 0xf && mant == 0x7) {
        v.u = sign | 0x7fc00000u; /* NaN */
    } else if (exp == 0) {        /* zero or subnormal: mant * 2^-9, exact */
        v.f = (float)mant * 0x1p-9f;
        v.u |= sign;
    } else {
        v.u = sign | ((exp - 7 + 127) << 23) | (mant << 20);
    }
    return v.f;
}

uint8_t f32_to_fp8_e4m3(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    const uint32_t a = v.u & 0x7fffffffu;
    const uint8_t sign = (uint8_t)((v.u >> 24) & 0x80u);
    if (a > 0x7f800000u) return 0x7f;              /* NaN (canonical, sign dropped as CUDA's) */
    if (a > 0x43e80000u) return sign | 0x7e;       /* above 464 = 448 + half an ulp: 448 */
    if (a <= 0x3a800000u) return sign;             /* |x| <= 2^-10, half the smallest subnormal */
    const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t r, rem, half;
    if (e >= 121) { /* normal in e4m3 (|x| >= 2^-6): keep 3 of the 23 mantissa bits */
        r = ((e - 120) << 3) | ((a >> 20) & 0x7u);
        rem = a & 0xfffffu;
        half = 0x80000u;
    } else { /* subnormal in e4m3: |x| / 2^-9 rounded to an integer 1 .. 8 (8: 2^-6, normal) */
        const uint32_t shift = 141 - e; /* 21 .. 24 */
        r = mant >> shift;
        rem = mant & ((1u << shift) - 1);
        half = 1u << (shift - 1);
    }
    if (rem > half || (rem == half && (r & 1))) r++; /* may carry into the exponent: right */
    return (uint8_t)(sign | r);
}

uint16_t f32_to_f16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    uint32_t x = v.u, sign = (x >> 16) & 0x8000u;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = 1u << (shift - 1);
        uint32_t r = mant >> shift, rem = mant & ((1u << shift) - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(sign | r);
}
