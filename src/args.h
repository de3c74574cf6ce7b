/* args.h: strict parsing of command-line values, shared by the commands (src/cli/) and the
 * backends' own benchmark entries (`cvllm bench ops`), which parse their arguments themselves.
 * Each prints "cvllm: NAME: ..." on bad input and returns -1 (a usage error: exit 2). */
#ifndef CVLLM_ARGS_H
#define CVLLM_ARGS_H

#include <stdint.h>

/* Value of option argv[*i] (advances *i); prints an error and returns NULL if missing. */
const char *cli_value(int argc, char **argv, int *i);
/* Strict integer / float parsing; print "cvllm: NAME: ..." and return -1 on bad input. */
int cli_int(const char *name, const char *s, long long lo, long long hi, long long *out);
int cli_float(const char *name, const char *s, double lo, double hi, double *out);
/* Parses a list of integers in [lo, hi] (0 <= lo, hi <= INT32_MAX), "1,2,3": decimal numbers
 * separated by single commas, no spaces, at least one. Returns the count with *out malloc'd, or -1
 * (message printed). */
int cli_int_list(const char *name, const char *s, long long lo, long long hi, int32_t **out);
/* cli_int_list of token ids (0 .. INT32_MAX): --prompt-ids, --stop-token-ids, --ids. */
int cli_ids(const char *name, const char *s, int32_t **out);
/* The CPU cores the thread pools use by default (online processors); --threads may not exceed it. */
int cli_num_cores(void);

#endif
