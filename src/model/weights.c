/* weights.c: bind the Hugging Face tensor names the config requires to Tensor views into the
 * mmapped safetensors, checking dtype and exact shape. Extra tensors in the file are ignored
 * (e.g. lm_head.weight of a tied model, rotary inv_freq buffers of old checkpoints). */
#include "model/weights.h"

#include <string.h>

#include "common.h"

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    int k = snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && k < (int)cap; d++)
        k += snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < (int)cap) snprintf(buf + k, cap - k, "]");
}

/* Binds tensor `name` of shape [rows, cols] (rows < 0: 1-D [cols]) into *out. */
static int bind(const SafeTensors *st, const char *name, int64_t rows, int64_t cols, Tensor *out) {
    const StTensor *t = safetensors_find(st, name);
    if (!t) return cvllm_errorf(CVLLM_EFORMAT, "missing tensor %s", name);
    int ndim = rows < 0 ? 1 : 2;
    int64_t want[2] = {rows < 0 ? cols : rows, cols};
    int ok = t->ndim == ndim && t->shape[0] == want[0] && (ndim == 1 || t->shape[1] == want[1]);
    if (!ok) {
        char exp[64], got[128];
        format_shape(exp, sizeof exp, ndim, want);
        format_shape(got, sizeof got, t->ndim, t->shape);
        return cvllm_errorf(CVLLM_EFORMAT, "%s: expected shape %s, got %s", name, exp, got);
    }
    /* dtype is F32/F16/BF16 by construction: safetensors refuses the rest. */
    out->data = t->data;
    out->dtype = t->dtype;
    out->rows = rows < 0 ? 1 : rows;
    out->cols = cols;
    return 0;
}

static int bind_layer(const ModelConfig *c, const SafeTensors *st, int i, LayerWeights *l) {
    const int64_t H = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    const int64_t QD = (int64_t)c->num_attention_heads * D, KD = (int64_t)c->num_key_value_heads * D;
    char n[128];
    int rc;
#define BIND(suffix, rows, cols, dst)                                                              \
    do {                                                                                           \
        snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix);                                    \
        if ((rc = bind(st, n, rows, cols, dst)) < 0) return rc;                                    \
    } while (0)
    BIND("input_layernorm.weight", -1, H, &l->input_layernorm);
    BIND("self_attn.q_proj.weight", QD, H, &l->q_proj);
    BIND("self_attn.k_proj.weight", KD, H, &l->k_proj);
    BIND("self_attn.v_proj.weight", KD, H, &l->v_proj);
    BIND("self_attn.o_proj.weight", H, QD, &l->o_proj);
    if (c->attention_bias) {
        BIND("self_attn.q_proj.bias", -1, QD, &l->q_bias);
        BIND("self_attn.k_proj.bias", -1, KD, &l->k_bias);
        BIND("self_attn.v_proj.bias", -1, KD, &l->v_bias);
    }
    if (c->o_proj_bias) BIND("self_attn.o_proj.bias", -1, H, &l->o_bias);
    if (c->qk_norm) {
        BIND("self_attn.q_norm.weight", -1, D, &l->q_norm);
        BIND("self_attn.k_norm.weight", -1, D, &l->k_norm);
    }
    BIND("post_attention_layernorm.weight", -1, H, &l->post_attention_layernorm);
    BIND("mlp.gate_proj.weight", I, H, &l->gate_proj);
    BIND("mlp.up_proj.weight", I, H, &l->up_proj);
    BIND("mlp.down_proj.weight", H, I, &l->down_proj);
#undef BIND
    return 0;
}

int weights_bind(const ModelConfig *cfg, SafeTensors *st, ModelWeights *w) {
    memset(w, 0, sizeof *w);
    const int64_t V = cfg->vocab_size, H = cfg->hidden_size;
    LayerWeights *layers = xcalloc((size_t)cfg->num_hidden_layers, sizeof *layers);
    Tensor embed = {0}, norm = {0}, lm_head = {0};
    int rc = bind(st, "model.embed_tokens.weight", V, H, &embed);
    for (int i = 0; i < cfg->num_hidden_layers && rc == 0; i++)
        rc = bind_layer(cfg, st, i, &layers[i]);
    if (rc == 0) rc = bind(st, "model.norm.weight", -1, H, &norm);
    if (rc == 0) {
        if (cfg->tie_word_embeddings)
            lm_head = embed; /* a stored lm_head.weight is ignored, as transformers does */
        else
            rc = bind(st, "lm_head.weight", V, H, &lm_head);
    }
    if (rc < 0) {
        free(layers);
        return rc;
    }
    w->embed_tokens = embed;
    w->layers = layers;
    w->norm = norm;
    w->lm_head = lm_head;
    w->st = st;
    return 0;
}

int weights_load(const char *model_dir, const ModelConfig *cfg, ModelWeights *w) {
    memset(w, 0, sizeof *w);
    SafeTensors *st;
    int rc = safetensors_open(model_dir, &st);
    if (rc < 0) return rc;
    rc = weights_bind(cfg, st, w);
    if (rc < 0) {
        safetensors_close(st);
        return cvllm_error_wrap(rc, "%s", model_dir);
    }
    return 0;
}

void weights_free(ModelWeights *w) {
    if (!w) return;
    free(w->layers);
    safetensors_close(w->st);
    memset(w, 0, sizeof *w);
}
