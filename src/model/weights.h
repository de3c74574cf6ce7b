/* weights.h: the model's tensors, named and shape-checked against the config, kept in their stored
 * dtype (bf16 / f16 / f32) and pointing into the mmapped safetensors. Hugging Face names:
 *   model.embed_tokens.weight, model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
 *   self_attn.{q,k}_norm, post_attention_layernorm, mlp.{gate,up,down}_proj}.weight,
 *   q/k/v_proj.bias (Qwen2, attention_bias), model.norm.weight, lm_head.weight (unless tied). */
#ifndef CVLLM_MODEL_WEIGHTS_H
#define CVLLM_MODEL_WEIGHTS_H

#include "model/config.h"
#include "model/safetensors.h"

typedef struct {
    const void *data;   /* NULL if absent (optional tensors) */
    DType dtype;
    int64_t rows, cols; /* 1-D tensors: rows = 1, cols = length; matrices are [out, in] row-major */
} Tensor;

typedef struct {
    Tensor input_layernorm;          /* [hidden] */
    Tensor q_proj, k_proj, v_proj;   /* [heads*head_dim, hidden], [kv_heads*head_dim, hidden] x2 */
    Tensor q_bias, k_bias, v_bias;   /* [heads*head_dim], [kv_heads*head_dim] (attention_bias) */
    Tensor q_norm, k_norm;           /* [head_dim] (qk_norm) */
    Tensor o_proj;                   /* [hidden, heads*head_dim] */
    Tensor o_bias;                   /* [hidden] (cfg->o_proj_bias: Llama/Qwen3 attention_bias) */
    Tensor post_attention_layernorm; /* [hidden] */
    Tensor gate_proj, up_proj;       /* [intermediate, hidden] */
    Tensor down_proj;                /* [hidden, intermediate] */
} LayerWeights;

typedef struct {
    Tensor embed_tokens;  /* [vocab, hidden] */
    LayerWeights *layers; /* [num_hidden_layers], owned */
    Tensor norm;          /* [hidden] */
    Tensor lm_head;       /* [vocab, hidden]; = embed_tokens when tied */
    SafeTensors *st;      /* owned: the mapping the pointers live in */
} ModelWeights;

/* Binds every tensor the config requires, checking name, dtype (f32/f16/bf16) and shape; an
 * error names the tensor with expected and actual ("missing tensor model.norm.weight",
 * "...k_proj.weight: expected shape [256, 1024], got [512, 1024]"). Tensors the config does not
 * need are ignored (a tied model's lm_head.weight). Takes ownership of st on success; on
 * failure st stays the caller's and *w is zeroed. */
int weights_bind(const ModelConfig *cfg, SafeTensors *st, ModelWeights *w);
/* safetensors_open(model_dir) + weights_bind against cfg (from config_load). */
int weights_load(const char *model_dir, const ModelConfig *cfg, ModelWeights *w);
void weights_free(ModelWeights *w); /* accepts zeroed */

#endif
