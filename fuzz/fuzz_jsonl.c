/* fuzz_jsonl.c: the JSON-lines prompt reader of `cvllm complete --prompt-file` (jsonl_prompt_parse,
 * through cli_jsonl_parse and cvllm_json_parse, whose error paths name out-of-range numbers by
 * scanning the text backwards). Each input is one line. A line must parse into a request that
 * satisfies every range the command line enforces, or be refused with a message that starts with
 * its line number; never a crash, a leak or a read outside the line. Seeds: fuzz/corpus/fuzz_jsonl/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/jsonl_prompt.h"
#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a heap copy of exactly `size` bytes (no NUL after it): overreads hit the redzone */
    char *line = malloc(size ? size : 1);
    memcpy(line, data, size);
    CvllmSamplingParams d;
    cvllm_sampling_params_default(&d);
    int32_t cli_stop[2] = {5, 6};
    d.stop_token_ids = cli_stop;
    d.num_stop_token_ids = 2;
    JsonlPrompt p = {.params = d};
    int rc = jsonl_prompt_parse(line, size, 12, &p);
    if (rc == 0) {
        const CvllmSamplingParams *s = &p.params;
        CHECK((p.prompt != NULL) != (p.prompt_ids != NULL), "prompt and ids");
        CHECK(!p.prompt_ids || p.num_prompt_ids > 0, "empty prompt ids");
        for (int i = 0; i < p.num_prompt_ids; i++) CHECK(p.prompt_ids[i] >= 0, "negative id");
        CHECK(s->max_tokens >= 1 && s->top_k >= -1 && (s->seed >= 0 || s->seed == d.seed), "ints");
        CHECK(s->temperature >= 0 && s->temperature <= 1e6f, "temperature %g", s->temperature);
        CHECK(s->top_p > 0 && s->top_p <= 1 && s->min_p >= 0 && s->min_p <= 1, "top_p / min_p");
        CHECK(s->stop_token_ids == (p.stop_ids ? p.stop_ids : cli_stop), "stop ids pointer");
        for (int i = 0; i < s->num_stop_token_ids; i++) CHECK(s->stop_token_ids[i] >= 0, "stop id");
        CHECK(p.has_stops || p.num_stops == 0, "stops");
        for (int i = 0; i < p.num_stops; i++) CHECK(p.stops[i] != NULL, "stop string");
        /* no NUL inside a prompt: it would be cut when used as a C string */
        CHECK(!p.prompt || memchr(line, 0, size) == NULL, "a NUL byte was accepted");
    } else {
        CHECK(rc == CVLLM_EINVAL, "code %d", rc);
        CHECK(strncmp(cvllm_last_error(), "line 12: ", 9) == 0, "message: %s", cvllm_last_error());
    }
    jsonl_prompt_free(&p);
    free(line);
    return 0;
}
