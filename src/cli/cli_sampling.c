/* cli_sampling.c: the sampling options shared by complete and chat (see cli_sampling.h). */
#include "cli/cli_sampling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_util.h"
#include "common.h"
#include "tokenizer/tokenizer.h"

const char CLI_SAMPLING_OPTIONS_HELP[] =
    "sampling options:\n"
    "  --max-tokens N                  tokens to generate at most (-1: what the context leaves)\n"
    "  --temperature F                 0 = greedy\n"
    "  --top-p F  --top-k N  --min-p F  filters (top-k 0 or -1: off)\n"
    "  --seed N                        the request's ids then depend only on N\n"
    "  --presence-penalty F  --frequency-penalty F   in [-2, 2], on generated tokens\n"
    "  --repetition-penalty F          > 0 (1: off), on prompt and generated tokens\n"
    "  --ignore-eos                    do not stop at the end-of-sequence token\n"
    "  --stop STR                      stop string, repeatable (cut from the output)\n"
    "  --include-stop-str-in-output    keep the matched stop string\n"
    "  --stop-token-ids 1,2            stop at these ids\n"
    "  --logprobs N                    log-probabilities of each token and the top N (0..20)\n";

void cli_sampling_init(CliSampling *s, const CvllmSamplingParams *defaults) {
    memset(s, 0, sizeof *s);
    s->p = *defaults;
}

void cli_sampling_free(CliSampling *s) {
    free(s->stops);
    free(s->stop_ids);
    memset(s, 0, sizeof *s);
}

int cli_parse_sampling_option(int argc, char **argv, int *i, CliSampling *s) {
    const char *a = argv[*i], *v;
    long long n;
    double f;
    CvllmSamplingParams *p = &s->p;
    if (!strcmp(a, "--ignore-eos")) {
        p->ignore_eos = 1;
        return 1;
    }
    if (!strcmp(a, "--include-stop-str-in-output")) {
        p->include_stop_str_in_output = 1;
        return 1;
    }
    static const char *const valued[] = {"--max-tokens", "--temperature", "--top-p", "--top-k",
                                         "--min-p", "--seed", "--stop", "--stop-token-ids",
                                         "--presence-penalty", "--frequency-penalty",
                                         "--repetition-penalty", "--logprobs"};
    int known = 0;
    for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(a, valued[k]);
    if (!known) return 0;
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (!strcmp(a, "--max-tokens")) {
        if (cli_int(a, v, -1, INT32_MAX, &n) < 0) return -1;
        if (n == 0) {
            fprintf(stderr, "cvllm: --max-tokens: must be >= 1, or -1 for what the context leaves\n");
            return -1;
        }
        p->max_tokens = (int)n;
    } else if (!strcmp(a, "--temperature")) {
        if (cli_float(a, v, 0, 1e6, &f) < 0) return -1;
        p->temperature = (float)f;
    } else if (!strcmp(a, "--top-p")) {
        if (cli_float(a, v, 1e-9, 1, &f) < 0) return -1;
        p->top_p = (float)f;
    } else if (!strcmp(a, "--top-k")) {
        if (cli_int(a, v, -1, INT32_MAX, &n) < 0) return -1;
        p->top_k = (int)n;
    } else if (!strcmp(a, "--min-p")) {
        if (cli_float(a, v, 0, 1, &f) < 0) return -1;
        p->min_p = (float)f;
    } else if (!strcmp(a, "--seed")) {
        if (cli_int(a, v, 0, INT64_MAX, &n) < 0) return -1;
        p->seed = n;
    } else if (!strcmp(a, "--presence-penalty")) {
        if (cli_float(a, v, -2, 2, &f) < 0) return -1;
        p->presence_penalty = (float)f;
    } else if (!strcmp(a, "--frequency-penalty")) {
        if (cli_float(a, v, -2, 2, &f) < 0) return -1;
        p->frequency_penalty = (float)f;
    } else if (!strcmp(a, "--repetition-penalty")) {
        if (cli_float(a, v, 1e-6, 1e6, &f) < 0) return -1;
        p->repetition_penalty = (float)f;
    } else if (!strcmp(a, "--logprobs")) {
        if (cli_int(a, v, 0, CVLLM_MAX_LOGPROBS, &n) < 0) return -1;
        p->logprobs = (int)n;
    } else if (!strcmp(a, "--stop")) {
        if (!v[0] || !utf8_valid(v, strlen(v))) {
            fprintf(stderr, "cvllm: --stop: expected a non-empty string of valid UTF-8\n");
            return -1;
        }
        DA_PUSH(s->stops, s->num_stops, s->cap_stops, (char *)v);
        p->stop = (const char *const *)s->stops;
        p->num_stop = s->num_stops;
    } else { /* --stop-token-ids */
        int32_t *ids = NULL;
        int k = cli_ids(a, v, &ids);
        if (k < 0) return -1;
        free(s->stop_ids);
        s->stop_ids = ids;
        p->stop_token_ids = ids;
        p->num_stop_token_ids = k;
    }
    return 1;
}
