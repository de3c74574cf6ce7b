/* cli_sampling.h: the sampling options, parsed once for every command that generates (complete,
 * chat) into CvllmSamplingParams (the JSON-lines fields map onto the same struct). */
#ifndef CVLLM_CLI_SAMPLING_H
#define CVLLM_CLI_SAMPLING_H

#include <stdint.h>

#include "cvllm.h"

typedef struct {
    CvllmSamplingParams p; /* p.stop / p.stop_token_ids point into the arrays below */
    char **stops;          /* borrowed from argv */
    int num_stops, cap_stops;
    int32_t *stop_ids;     /* owned */
} CliSampling;

/* p = defaults (e.g. from cvllm_sampling_params_default, then the command's own). */
void cli_sampling_init(CliSampling *s, const CvllmSamplingParams *defaults);
void cli_sampling_free(CliSampling *s);
/* If argv[*i] is a sampling option (--max-tokens, --temperature, --top-p, --top-k, --min-p,
 * --seed, --ignore-eos, --stop, --stop-token-ids, --presence-penalty, --frequency-penalty,
 * --repetition-penalty, --logprobs, --include-stop-str-in-output), consumes it and its value and
 * returns 1; 0 if it is not one; -1 after printing an error (a usage error). */
int cli_parse_sampling_option(int argc, char **argv, int *i, CliSampling *s);
/* Help text for them; the defaults are the command's (max_tokens is shown by the command). */
extern const char CLI_SAMPLING_OPTIONS_HELP[];

#endif
