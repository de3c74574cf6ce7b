/* cli_util.h: option parsing shared by the cvllm commands (vLLM's option names).
 *
 * Rules every command follows: a bad option or value is a usage error (the message starts with
 * "cvllm: OPTION: ", exit code 2); numbers are plain decimals (no spaces, no '+', no hex); id lists
 * are decimal ids separated by single commas, nothing else ("1,2,3"); an engine option is refused
 * here whenever the engine would refuse its value, so that the same mistake always exits 2. */
#ifndef CVLLM_CLI_UTIL_H
#define CVLLM_CLI_UTIL_H

#include <stdint.h>

#include "cvllm.h"

/* If argv[*i] is an engine option (--device, --max-model-len, --max-num-seqs,
 * --max-num-batched-tokens, --block-size, --kv-cache-memory, --kv-cache-dtype, --no-enable-prefix-caching,
 * --enable-prefix-caching, --threads, --gpu-memory-utilization, --quiet), consumes it (and its
 * value) and returns 1; returns 0 if it is not one; returns -1 after printing an error (a usage
 * error: the caller exits 2). */
int cli_parse_engine_option(int argc, char **argv, int *i, CvllmEngineOptions *o);
/* Help text for those options. */
extern const char CLI_ENGINE_OPTIONS_HELP[];

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
