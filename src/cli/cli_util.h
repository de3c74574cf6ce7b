/* cli_util.h: option parsing shared by the commands that run a model (vLLM's option names). */
#ifndef CVLLM_CLI_UTIL_H
#define CVLLM_CLI_UTIL_H

#include <stdint.h>

#include "cvllm.h"

/* If argv[*i] is an engine option (--device, --max-model-len, --max-num-seqs,
 * --max-num-batched-tokens, --block-size, --kv-cache-memory, --kv-cache-dtype, --no-enable-prefix-caching,
 * --enable-prefix-caching, --threads, --gpu-memory-utilization, --quiet), consumes it (and its
 * value) and returns 1; returns 0 if it is not one; returns -1 after printing an error. */
int cli_parse_engine_option(int argc, char **argv, int *i, CvllmEngineOptions *o);
/* Help text for those options. */
extern const char CLI_ENGINE_OPTIONS_HELP[];

/* Value of option argv[*i] (advances *i); prints an error and returns NULL if missing. */
const char *cli_value(int argc, char **argv, int *i);
/* Strict integer / float parsing; print "cvllm: NAME: ..." and return -1 on bad input. */
int cli_int(const char *name, const char *s, long long lo, long long hi, long long *out);
int cli_float(const char *name, const char *s, double lo, double hi, double *out);
/* Parses "1,2,3" into a malloc'd array; returns the count or -1 (message printed). */
int cli_ids(const char *name, const char *s, int32_t **out);

#endif
