/* args.c: strict parsing of command-line values (see args.h). */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "cvllm: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

/* Plain decimal text: an optional '-' then a digit (strtoll / strtod also take spaces and '+'). */
static int plain_number(const char *s) {
    if (*s == '-') s++;
    return (*s >= '0' && *s <= '9') || (*s == '.' && s[1] >= '0' && s[1] <= '9');
}

int cli_int(const char *name, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = plain_number(s) ? strtoll(s, &end, 10) : 0;
    if (!plain_number(s) || errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "cvllm: %s: expected an integer in [%lld, %lld], got '%s'\n", name, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_float(const char *name, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = plain_number(s) ? strtod(s, &end) : 0;
    if (!plain_number(s) || errno || end == s || *end || !isfinite(v) || v < lo || v > hi ||
        strpbrk(s, "xX")) {
        fprintf(stderr, "cvllm: %s: expected a number in [%g, %g], got '%s'\n", name, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_int_list(const char *name, const char *s, long long lo, long long hi, int32_t **out) {
    CHECK(lo >= 0 && hi <= INT32_MAX, "cli_int_list: range [%lld, %lld]", lo, hi);
    int n = 0, cap = 0;
    int32_t *v = NULL;
    const char *p = s;
    for (;;) {
        const char *d = p;
        long long x = 0;
        while (*p >= '0' && *p <= '9' && x <= hi) x = x * 10 + (*p++ - '0');
        if (p == d || x < lo || x > hi || (*p && *p != ',')) {
            if (p > d && (x < lo || x > hi))
                fprintf(stderr, "cvllm: %s: %.*s is outside [%lld, %lld]\n", name,
                        (int)strspn(d, "0123456789"), d, lo, hi);
            else
                fprintf(stderr, "cvllm: %s: expected numbers separated by commas, like 1,2,3 "
                                "(no spaces), got '%s'\n", name, s);
            free(v);
            return -1;
        }
        DA_PUSH(v, n, cap, (int32_t)x);
        if (!*p) break;
        p++; /* the comma: a number must follow */
    }
    *out = v;
    return n;
}

int cli_ids(const char *name, const char *s, int32_t **out) {
    return cli_int_list(name, s, 0, INT32_MAX, out);
}

int cli_num_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN); /* what threadpool_create uses for "all cores" */
    return n > 0 ? (int)(n < 4096 ? n : 4096) : 1;
}

