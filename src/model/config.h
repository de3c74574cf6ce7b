/* config.h: the model's config.json and generation_config.json, reduced to what changes the math.
 * Reads both transformers 4.x (rope_theta, rope_scaling at top level) and 5.x
 * (rope_parameters: {rope_type, rope_theta, ...}) layouts. */
#ifndef CVLLM_MODEL_CONFIG_H
#define CVLLM_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef enum { ARCH_QWEN3 = 0, ARCH_QWEN2, ARCH_LLAMA } ModelArch;
/* DTYPE_FP8_E4M3: KV cache elements only (--kv-cache-dtype fp8), never weights: safetensors
 * and config.json accept f32 / f16 / bf16 alone. */
typedef enum { DTYPE_F32 = 0, DTYPE_F16, DTYPE_BF16, DTYPE_FP8_E4M3 } DType;
typedef enum { ROPE_DEFAULT = 0, ROPE_LINEAR, ROPE_LLAMA3 } RopeType;

#define CONFIG_MAX_EOS 8

typedef struct {
    ModelArch arch;
    const char *arch_name;      /* "Qwen3ForCausalLM", ... (static string) */
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;    /* defaults to num_attention_heads */
    int head_dim;               /* defaults to hidden_size / num_attention_heads */
    float rms_norm_eps;
    double rope_theta;
    RopeType rope_type;
    double rope_factor;         /* linear / llama3 */
    double rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int rope_original_max_position; /* llama3 */
    int max_position_embeddings;
    int tie_word_embeddings;
    int attention_bias;         /* q/k/v projections carry a bias (Qwen2: always) */
    int o_proj_bias;            /* o_proj carries a bias (Llama/Qwen3 with attention_bias; never Qwen2) */
    int qk_norm;                /* per-head RMSNorm on q and k (Qwen3) */
    int mlp_bias;               /* must be 0 (refused otherwise) */
    DType torch_dtype;          /* the dtype named by config.json (informative) */
    int bos_token_id;           /* -1 if none */
    int eos_token_ids[CONFIG_MAX_EOS]; /* from generation_config.json, else config.json */
    int num_eos_token_ids;
} ModelConfig;

/* Parses model_dir/config.json and (if present) model_dir/generation_config.json.
 * Returns 0 or a negative CVLLM_E* code with a message naming the file and field. */
int config_load(const char *model_dir, ModelConfig *cfg);
/* Parses config.json text (for tests and fuzzing); generation config optional (NULL). */
int config_parse(const char *config_json, const char *generation_json, ModelConfig *cfg);

const char *dtype_name(DType t); /* "f32", "f16", "bf16", "fp8_e4m3" */
size_t dtype_size(DType t);      /* bytes per element */

#endif
