/* fuzz_config.c: config_parse on arbitrary text (the input split at the first NUL byte into
 * config.json and generation_config.json) must parse or fail with a negative code, and a parsed
 * config must satisfy the invariants the engine relies on. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    size_t first = strlen(text);
    const char *gen = first < size ? text + first + 1 : NULL;
    ModelConfig c;
    if (config_parse(text, gen, &c) == 0) {
        if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 ||
            c.num_hidden_layers <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
            c.num_attention_heads % c.num_key_value_heads != 0 || c.head_dim <= 0 ||
            c.head_dim % 2 != 0 || !(c.rope_theta > 0) || !(c.rms_norm_eps > 0) ||
            c.max_position_embeddings <= 0 || c.num_eos_token_ids < 0 ||
            c.num_eos_token_ids > CONFIG_MAX_EOS || c.bos_token_id >= c.vocab_size)
            __builtin_trap();
        for (int i = 0; i < c.num_eos_token_ids; i++)
            if (c.eos_token_ids[i] < 0 || c.eos_token_ids[i] >= c.vocab_size) __builtin_trap();
    }
    free(text);
    return 0;
}
