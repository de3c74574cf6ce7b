/* presets.h: the one table of model shapes cvllm knows by name (`cvllm mkmodel --preset`, the
 * synthetic models of `bench ops`), and the one table of architectures (their Hugging Face class
 * names and model_type strings, shared with config.c). */
#ifndef CVLLM_MODEL_PRESETS_H
#define CVLLM_MODEL_PRESETS_H

#include "model/config.h"

typedef struct {
    const char *name, *what;
    ModelArch arch;
    int vocab, hidden, inter, layers, heads, kv_heads, head_dim;
    double eps, theta;
    int max_pos, tie, attention_bias;
    DType dtype;
    int bos, eos;                /* config.json */
    int gen_eos[CONFIG_MAX_EOS]; /* generation_config.json */
    int n_gen_eos;
    RopeType rope;               /* llama3: factor 8, low 1, high 4, original max below */
    int rope_original_max;
} ModelPreset;

/* The presets, in the order `mkmodel --help` lists them; *n gets their number. */
const ModelPreset *model_presets(int *n);
/* The preset named name, or NULL. */
const ModelPreset *model_preset_find(const char *name);
/* The ModelConfig a folder written from the preset loads as (config_load's result). */
void model_preset_config(const ModelPreset *p, ModelConfig *c);

/* "Qwen3ForCausalLM", ... and "qwen3", ... of an architecture. */
const char *model_arch_class(ModelArch a);
const char *model_arch_type(ModelArch a);

#endif
