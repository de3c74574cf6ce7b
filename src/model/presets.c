/* presets.c: named model shapes and the architecture names (see presets.h). */
#include "model/presets.h"

#include <string.h>

static const ModelPreset PRESETS[] = {
    {"qwen3-0.6b", "exactly Qwen/Qwen3-0.6B's shapes (~1.2 GB)", ARCH_QWEN3, 151936, 1024, 3072,
     28, 16, 8, 128, 1e-6, 1000000, 40960, 1, 0, DTYPE_BF16, 151643, 151645, {151645, 151643}, 2,
     ROPE_DEFAULT, 0},
    {"qwen3-8b", "exactly Qwen/Qwen3-8B's shapes (~16.4 GB)", ARCH_QWEN3, 151936, 4096, 12288,
     36, 32, 8, 128, 1e-6, 1000000, 40960, 0, 0, DTYPE_BF16, 151643, 151645, {151645, 151643}, 2,
     ROPE_DEFAULT, 0},
    {"tiny", "Qwen3, Qwen3 vocab, hidden 64, 2 layers (~20 MB)", ARCH_QWEN3, 151936, 64, 128, 2,
     4, 2, 32, 1e-6, 1000000, 40960, 1, 0, DTYPE_BF16, 151643, 151645, {151645, 151643}, 2,
     ROPE_DEFAULT, 0},
    {"test-qwen3", "Qwen3, vocab 512, head_dim 24, untied, f32", ARCH_QWEN3, 512, 64, 128, 2, 4,
     2, 24, 1e-6, 1000000, 4096, 0, 0, DTYPE_F32, 1, 2, {2}, 1, ROPE_DEFAULT, 0},
    {"test-qwen2", "Qwen2, vocab 512, q/k/v bias, MQA (1 kv head), tied, f32", ARCH_QWEN2, 512, 64,
     160, 2, 4, 1, 16, 1e-6, 10000, 4096, 1, 1, DTYPE_F32, 1, 2, {2, 3}, 2, ROPE_DEFAULT, 0},
    {"test-llama", "Llama, vocab 512, llama3 rope, untied, f16", ARCH_LLAMA, 512, 64, 128, 2, 4, 2,
     16, 1e-5, 500000, 2048, 0, 0, DTYPE_F16, 1, 2, {2}, 1, ROPE_LLAMA3, 256},
};
#define NUM_PRESETS ((int)(sizeof PRESETS / sizeof PRESETS[0]))

const ModelPreset *model_presets(int *n) {
    *n = NUM_PRESETS;
    return PRESETS;
}

const ModelPreset *model_preset_find(const char *name) {
    for (int i = 0; i < NUM_PRESETS; i++)
        if (!strcmp(PRESETS[i].name, name)) return &PRESETS[i];
    return NULL;
}

static const char *const ARCH_CLASSES[] = {"Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"};
static const char *const ARCH_TYPES[] = {"qwen3", "qwen2", "llama"};

const char *model_arch_class(ModelArch a) { return ARCH_CLASSES[a]; }
const char *model_arch_type(ModelArch a) { return ARCH_TYPES[a]; }

void model_preset_config(const ModelPreset *p, ModelConfig *c) {
    memset(c, 0, sizeof *c);
    c->arch = p->arch;
    c->arch_name = model_arch_class(p->arch);
    c->vocab_size = p->vocab;
    c->hidden_size = p->hidden;
    c->intermediate_size = p->inter;
    c->num_hidden_layers = p->layers;
    c->num_attention_heads = p->heads;
    c->num_key_value_heads = p->kv_heads;
    c->head_dim = p->head_dim;
    c->rms_norm_eps = (float)p->eps;
    c->rope_theta = p->theta;
    c->rope_type = p->rope;
    if (p->rope == ROPE_LLAMA3) {
        c->rope_factor = 8;
        c->rope_low_freq_factor = 1;
        c->rope_high_freq_factor = 4;
        c->rope_original_max_position = p->rope_original_max;
    }
    c->max_position_embeddings = p->max_pos;
    c->tie_word_embeddings = p->tie;
    c->attention_bias = p->arch == ARCH_QWEN2 || p->attention_bias;
    c->o_proj_bias = p->arch != ARCH_QWEN2 && p->attention_bias;
    c->qk_norm = p->arch == ARCH_QWEN3;
    c->torch_dtype = p->dtype;
    c->bos_token_id = p->bos;
    for (int i = 0; i < p->n_gen_eos; i++) c->eos_token_ids[i] = p->gen_eos[i];
    c->num_eos_token_ids = p->n_gen_eos;
}
