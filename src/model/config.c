/* config.c: config.json + generation_config.json -> ModelConfig.
 *
 * Mirrors what transformers does for Qwen3ForCausalLM, Qwen2ForCausalLM and LlamaForCausalLM
 * (defaults from Qwen3Config / Qwen2Config / LlamaConfig), for both the 4.x layout (top-level
 * rope_theta, rope_scaling {type|rope_type, ...}) and the 5.x layout (rope_parameters
 * {rope_type, rope_theta, ...}). Anything that would change the math and that we do not
 * implement (sliding window, yarn, mlp_bias, a non-silu activation) is refused by name rather
 * than silently ignored. Every message names the file and the field. */
#include "model/config.h"
#include "model/presets.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "common.h"

/* Sizes past these are refused so that products of them (vocab * hidden, heads * head_dim)
 * stay far from int overflow in the engine. */
#define CONFIG_MAX_DIM (1 << 20)
#define CONFIG_MAX_VOCAB (1 << 24)
#define CONFIG_MAX_LAYERS 4096

const char *dtype_name(DType t) {
    switch (t) {
    case DTYPE_F32: return "f32";
    case DTYPE_F16: return "f16";
    case DTYPE_BF16: return "bf16";
    case DTYPE_FP8_E4M3: return "fp8_e4m3";
    }
    return "?";
}

size_t dtype_size(DType t) {
    switch (t) {
    case DTYPE_F32: return 4;
    case DTYPE_F16: return 2;
    case DTYPE_BF16: return 2;
    case DTYPE_FP8_E4M3: return 1;
    }
    return 0;
}

/* ---- typed field access ------------------------------------------------------------------- */

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Field lookup where an explicit null means "absent" (transformers writes null for unset). */
static json_t *field(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

/* Reads an integer field into *out; absent -> def (or an error if required). */
static int get_int(json_t *obj, const char *file, const char *key, int required, int def, int *out) {
    json_t *v = field(obj, key);
    if (!v) {
        if (required) return cvllm_errorf(CVLLM_EFORMAT, "%s: missing field %s", file, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return cvllm_errorf(CVLLM_EFORMAT, "%s: %s must be an integer, got %s", file, key,
                            json_type_name(v));
    json_int_t x = json_integer_value(v);
    if (x < INT32_MIN || x > INT32_MAX)
        return cvllm_errorf(CVLLM_EFORMAT, "%s: %s (%lld) is out of range", file, key, (long long)x);
    *out = (int)x;
    return 0;
}

/* Reads a number (integer or real) field; absent -> def (or an error if required). */
static int get_num(json_t *obj, const char *file, const char *prefix, const char *key, int required,
                   double def, double *out) {
    json_t *v = field(obj, key);
    if (!v) {
        if (required)
            return cvllm_errorf(CVLLM_EFORMAT, "%s: missing field %s%s", file, prefix, key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return cvllm_errorf(CVLLM_EFORMAT, "%s: %s%s must be a number, got %s", file, prefix, key,
                            json_type_name(v));
    *out = json_number_value(v);
    if (!isfinite(*out))
        return cvllm_errorf(CVLLM_EFORMAT, "%s: %s%s is not finite", file, prefix, key);
    return 0;
}

static int get_bool(json_t *obj, const char *file, const char *key, int def, int *out) {
    json_t *v = field(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return cvllm_errorf(CVLLM_EFORMAT, "%s: %s must be true or false, got %s", file, key,
                            json_type_name(v));
    *out = json_is_true(v);
    return 0;
}

/* Optional string field: *out = NULL when absent. */
static int get_str(json_t *obj, const char *file, const char *prefix, const char *key,
                   const char **out) {
    json_t *v = field(obj, key);
    *out = NULL;
    if (!v) return 0;
    if (!json_is_string(v))
        return cvllm_errorf(CVLLM_EFORMAT, "%s: %s%s must be a string, got %s", file, prefix, key,
                            json_type_name(v));
    *out = json_string_value(v);
    return 0;
}

/* eos_token_id: an integer, a list of integers, or null (leaves *n unchanged = "not given"). */
static int get_eos(json_t *obj, const char *file, int *ids, int *n, int *given) {
    json_t *v = field(obj, "eos_token_id");
    *given = 0;
    if (!v) return 0;
    *given = 1;
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < 0 || x > INT32_MAX)
            return cvllm_errorf(CVLLM_EFORMAT, "%s: eos_token_id (%lld) is out of range", file,
                                (long long)x);
        ids[0] = (int)x;
        *n = 1;
        return 0;
    }
    if (!json_is_array(v))
        return cvllm_errorf(CVLLM_EFORMAT,
                            "%s: eos_token_id must be an integer or a list of integers, got %s",
                            file, json_type_name(v));
    size_t cnt = json_array_size(v);
    if (cnt > CONFIG_MAX_EOS)
        return cvllm_errorf(CVLLM_EUNSUPPORTED, "%s: eos_token_id lists %zu ids (at most %d)", file,
                            cnt, CONFIG_MAX_EOS);
    for (size_t i = 0; i < cnt; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return cvllm_errorf(CVLLM_EFORMAT,
                                "%s: eos_token_id[%zu] must be a non-negative integer", file, i);
        ids[i] = (int)json_integer_value(e);
    }
    *n = (int)cnt;
    return 0;
}

static json_t *parse_json(const char *text, const char *file, int *rc) {
    json_t *root = cvllm_json_parse(text, strlen(text), JSON_REJECT_DUPLICATES, file);
    if (!root) {
        *rc = CVLLM_EFORMAT;
        return NULL;
    }
    if (!json_is_object(root)) {
        *rc = cvllm_errorf(CVLLM_EFORMAT, "%s: expected a JSON object at the top level, got %s",
                           file, json_type_name(root));
        json_decref(root);
        return NULL;
    }
    return root;
}

/* ---- architecture and rope ---------------------------------------------------------------- */

/* indexed by ModelArch; the names come from the one table in presets.c */
static const struct {
    ModelArch arch;
    int max_pos_default;
} ARCHS[] = {
    {ARCH_QWEN3, 32768},
    {ARCH_QWEN2, 32768},
    {ARCH_LLAMA, 2048},
};
#define NUM_ARCHS ((int)(sizeof ARCHS / sizeof ARCHS[0]))

static int parse_arch(json_t *root, const char *file, int *which) {
    json_t *a = field(root, "architectures");
    if (!a) { /* old or hand-written configs: fall back on model_type */
        const char *mt;
        int rc = get_str(root, file, "", "model_type", &mt);
        if (rc < 0) return rc;
        if (!mt) return cvllm_errorf(CVLLM_EFORMAT, "%s: missing field architectures", file);
        for (int i = 0; i < NUM_ARCHS; i++)
            if (!strcmp(mt, model_arch_type(ARCHS[i].arch))) return *which = i, 0;
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "%s: model_type '%s' is not supported (qwen3, qwen2, llama)", file, mt);
    }
    if (!json_is_array(a) || json_array_size(a) == 0 || !json_is_string(json_array_get(a, 0)))
        return cvllm_errorf(CVLLM_EFORMAT, "%s: architectures must be a non-empty list of strings",
                            file);
    const char *name = json_string_value(json_array_get(a, 0));
    for (int i = 0; i < NUM_ARCHS; i++)
        if (!strcmp(name, model_arch_class(ARCHS[i].arch))) return *which = i, 0;
    return cvllm_errorf(CVLLM_EUNSUPPORTED,
                        "%s: architecture '%s' is not supported (Qwen3ForCausalLM, "
                        "Qwen2ForCausalLM, LlamaForCausalLM)",
                        file, name);
}

/* rope: 5.x rope_parameters wins over 4.x rope_scaling; rope_theta from the rope dict or the top
 * level (default 10000, as in every one of the three configs). */
static int parse_rope(json_t *root, const char *file, ModelConfig *c) {
    json_t *rp = field(root, "rope_parameters"), *rs = field(root, "rope_scaling");
    json_t *src = rp ? rp : rs;
    const char *what = rp ? "rope_parameters" : "rope_scaling";
    char prefix[64];
    int rc;
    if (src && !json_is_object(src))
        return cvllm_errorf(CVLLM_EFORMAT, "%s: %s must be an object or null, got %s", file, what,
                            json_type_name(src));
    /* 5.x models with several attention kinds key the dict by layer type. */
    if (src && json_is_object(json_object_get(src, "full_attention"))) {
        src = json_object_get(src, "full_attention");
        what = rp ? "rope_parameters.full_attention" : "rope_scaling.full_attention";
    }
    snprintf(prefix, sizeof prefix, "%s.", what);

    double top_theta;
    if ((rc = get_num(root, file, "", "rope_theta", 0, 10000.0, &top_theta)) < 0) return rc;
    c->rope_theta = top_theta;
    c->rope_type = ROPE_DEFAULT;
    c->rope_factor = 1.0;
    c->rope_low_freq_factor = c->rope_high_freq_factor = 0;
    c->rope_original_max_position = 0;
    if (!src) return 0;
    if ((rc = get_num(src, file, prefix, "rope_theta", 0, top_theta, &c->rope_theta)) < 0) return rc;

    const char *type, *type_key = "rope_type";
    if ((rc = get_str(src, file, prefix, "rope_type", &type)) < 0) return rc;
    if (!type) {
        type_key = "type";
        if ((rc = get_str(src, file, prefix, "type", &type)) < 0) return rc;
    }
    if (!type) {
        if (rp) return 0; /* 5.x rope_parameters with only rope_theta: default */
        return cvllm_errorf(CVLLM_EFORMAT, "%s: %s has neither rope_type nor type", file, what);
    }
    if (!strcmp(type, "default")) return 0;
    if (!strcmp(type, "linear")) {
        c->rope_type = ROPE_LINEAR;
        if ((rc = get_num(src, file, prefix, "factor", 1, 0, &c->rope_factor)) < 0) return rc;
        if (!(c->rope_factor > 0))
            return cvllm_errorf(CVLLM_EFORMAT, "%s: %sfactor (%g) must be positive", file, prefix,
                                c->rope_factor);
        return 0;
    }
    if (!strcmp(type, "llama3")) {
        c->rope_type = ROPE_LLAMA3;
        double orig;
        if ((rc = get_num(src, file, prefix, "factor", 1, 0, &c->rope_factor)) < 0 ||
            (rc = get_num(src, file, prefix, "low_freq_factor", 1, 0, &c->rope_low_freq_factor)) < 0 ||
            (rc = get_num(src, file, prefix, "high_freq_factor", 1, 0, &c->rope_high_freq_factor)) < 0 ||
            (rc = get_num(src, file, prefix, "original_max_position_embeddings", 1, 0, &orig)) < 0)
            return rc;
        if (!(c->rope_factor > 0) || !(c->rope_low_freq_factor > 0))
            return cvllm_errorf(CVLLM_EFORMAT, "%s: %sfactor and low_freq_factor must be positive",
                                file, prefix);
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
            return cvllm_errorf(CVLLM_EFORMAT,
                                "%s: %shigh_freq_factor (%g) must be greater than low_freq_factor (%g)",
                                file, prefix, c->rope_high_freq_factor, c->rope_low_freq_factor);
        if (!(orig >= 1 && orig <= INT32_MAX) || orig != floor(orig))
            return cvllm_errorf(CVLLM_EFORMAT,
                                "%s: %soriginal_max_position_embeddings must be a positive integer",
                                file, prefix);
        c->rope_original_max_position = (int)orig;
        return 0;
    }
    return cvllm_errorf(CVLLM_EUNSUPPORTED,
                        "%s: %s%s '%s' is not supported (default, linear, llama3)", file, prefix,
                        type_key, type);
}

static int parse_dtype(json_t *root, const char *file, DType *out) {
    const char *key = "dtype", *s;
    int rc = get_str(root, file, "", "dtype", &s); /* transformers 5.x */
    if (rc < 0) return rc;
    if (!s) {
        key = "torch_dtype"; /* 4.x */
        if ((rc = get_str(root, file, "", "torch_dtype", &s)) < 0) return rc;
    }
    *out = DTYPE_F32; /* transformers' default */
    if (!s || !strcmp(s, "auto")) return 0;
    if (!strcmp(s, "bfloat16")) *out = DTYPE_BF16;
    else if (!strcmp(s, "float16") || !strcmp(s, "half")) *out = DTYPE_F16;
    else if (!strcmp(s, "float32") || !strcmp(s, "float")) *out = DTYPE_F32;
    else
        return cvllm_errorf(CVLLM_EUNSUPPORTED,
                            "%s: %s '%s' is not supported (bfloat16, float16, float32)", file, key, s);
    return 0;
}

/* ---- the whole config ----------------------------------------------------------------------- */

static int check_range(const char *file, const char *key, int v, int lo, int hi) {
    if (v < lo || v > hi)
        return cvllm_errorf(CVLLM_EFORMAT, "%s: %s (%d) must be in [%d, %d]", file, key, v, lo, hi);
    return 0;
}

static int parse_config(json_t *root, ModelConfig *c) {
    const char *F = "config.json";
    int rc, ai = 0;
    memset(c, 0, sizeof *c);
    if ((rc = parse_arch(root, F, &ai)) < 0) return rc;
    c->arch = ARCHS[ai].arch;
    c->arch_name = model_arch_class(ARCHS[ai].arch);

    if ((rc = get_int(root, F, "vocab_size", 1, 0, &c->vocab_size)) < 0 ||
        (rc = get_int(root, F, "hidden_size", 1, 0, &c->hidden_size)) < 0 ||
        (rc = get_int(root, F, "intermediate_size", 1, 0, &c->intermediate_size)) < 0 ||
        (rc = get_int(root, F, "num_hidden_layers", 1, 0, &c->num_hidden_layers)) < 0 ||
        (rc = get_int(root, F, "num_attention_heads", 1, 0, &c->num_attention_heads)) < 0)
        return rc;
    if ((rc = check_range(F, "vocab_size", c->vocab_size, 1, CONFIG_MAX_VOCAB)) < 0 ||
        (rc = check_range(F, "hidden_size", c->hidden_size, 1, CONFIG_MAX_DIM)) < 0 ||
        (rc = check_range(F, "intermediate_size", c->intermediate_size, 1, CONFIG_MAX_DIM)) < 0 ||
        (rc = check_range(F, "num_hidden_layers", c->num_hidden_layers, 1, CONFIG_MAX_LAYERS)) < 0 ||
        (rc = check_range(F, "num_attention_heads", c->num_attention_heads, 1, 65536)) < 0)
        return rc;

    if ((rc = get_int(root, F, "num_key_value_heads", 0, c->num_attention_heads,
                      &c->num_key_value_heads)) < 0)
        return rc;
    if ((rc = check_range(F, "num_key_value_heads", c->num_key_value_heads, 1,
                          c->num_attention_heads)) < 0)
        return rc;
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return cvllm_errorf(CVLLM_EFORMAT,
                            "%s: num_key_value_heads (%d) must divide num_attention_heads (%d)", F,
                            c->num_key_value_heads, c->num_attention_heads);
    if (!field(root, "head_dim") && c->hidden_size % c->num_attention_heads != 0)
        return cvllm_errorf(CVLLM_EFORMAT,
                            "%s: no head_dim, and num_attention_heads (%d) does not divide "
                            "hidden_size (%d)",
                            F, c->num_attention_heads, c->hidden_size);
    if ((rc = get_int(root, F, "head_dim", 0, c->hidden_size / c->num_attention_heads,
                      &c->head_dim)) < 0)
        return rc;
    if ((rc = check_range(F, "head_dim", c->head_dim, 1, 4096)) < 0) return rc;
    if (c->head_dim % 2 != 0)
        return cvllm_errorf(CVLLM_EFORMAT, "%s: head_dim (%d) must be even for rotary embeddings",
                            F, c->head_dim);
    if ((int64_t)c->num_attention_heads * c->head_dim > CONFIG_MAX_DIM)
        return cvllm_errorf(CVLLM_EFORMAT, "%s: num_attention_heads * head_dim (%lld) is too large",
                            F, (long long)c->num_attention_heads * c->head_dim);

    double eps;
    if ((rc = get_num(root, F, "", "rms_norm_eps", 0, 1e-6, &eps)) < 0) return rc;
    c->rms_norm_eps = (float)eps; /* the float must stay positive too (1e-60 would not) */
    if (!(eps > 0 && eps < 1) || !(c->rms_norm_eps > 0))
        return cvllm_errorf(CVLLM_EFORMAT, "%s: rms_norm_eps (%g) must be in (0, 1)", F, eps);

    if ((rc = parse_rope(root, F, c)) < 0) return rc;
    if (!(c->rope_theta > 0))
        return cvllm_errorf(CVLLM_EFORMAT, "%s: rope_theta (%g) must be positive", F, c->rope_theta);
    double prf;
    if ((rc = get_num(root, F, "", "partial_rotary_factor", 0, 1.0, &prf)) < 0) return rc;
    if (prf != 1.0)
        return cvllm_errorf(CVLLM_EUNSUPPORTED, "%s: partial_rotary_factor %g is not supported", F,
                            prf);

    if ((rc = get_int(root, F, "max_position_embeddings", 0, ARCHS[ai].max_pos_default,
                      &c->max_position_embeddings)) < 0)
        return rc;
    if ((rc = check_range(F, "max_position_embeddings", c->max_position_embeddings, 1,
                          INT32_MAX)) < 0)
        return rc;

    if ((rc = get_bool(root, F, "tie_word_embeddings", 0, &c->tie_word_embeddings)) < 0) return rc;
    int attention_bias;
    if ((rc = get_bool(root, F, "attention_bias", 0, &attention_bias)) < 0) return rc;
    /* Qwen2Attention hard-codes bias=True on q/k/v (and none on o_proj); Llama and Qwen3 put
     * attention_bias on all four projections. */
    c->attention_bias = c->arch == ARCH_QWEN2 ? 1 : attention_bias;
    c->o_proj_bias = c->arch == ARCH_QWEN2 ? 0 : attention_bias;
    c->qk_norm = c->arch == ARCH_QWEN3;
    if ((rc = get_bool(root, F, "mlp_bias", 0, &c->mlp_bias)) < 0) return rc;
    if (c->mlp_bias)
        return cvllm_errorf(CVLLM_EUNSUPPORTED, "%s: mlp_bias true is not supported", F);

    const char *act;
    if ((rc = get_str(root, F, "", "hidden_act", &act)) < 0) return rc;
    if (act && strcmp(act, "silu") != 0)
        return cvllm_errorf(CVLLM_EUNSUPPORTED, "%s: hidden_act '%s' is not supported (silu only)",
                            F, act);

    /* Sliding-window attention changes the math: refuse it rather than ignore it. */
    int sw;
    if ((rc = get_bool(root, F, "use_sliding_window", 0, &sw)) < 0) return rc;
    if (sw)
        return cvllm_errorf(CVLLM_EUNSUPPORTED, "%s: use_sliding_window true is not supported", F);
    json_t *lt = field(root, "layer_types");
    if (lt) {
        if (!json_is_array(lt))
            return cvllm_errorf(CVLLM_EFORMAT, "%s: layer_types must be a list, got %s", F,
                                json_type_name(lt));
        for (size_t i = 0; i < json_array_size(lt); i++) {
            json_t *e = json_array_get(lt, i);
            if (!json_is_string(e) || strcmp(json_string_value(e), "full_attention") != 0)
                return cvllm_errorf(CVLLM_EUNSUPPORTED,
                                    "%s: layer_types[%zu] is not \"full_attention\" (only full "
                                    "attention is supported)",
                                    F, i);
        }
    }

    if ((rc = parse_dtype(root, F, &c->torch_dtype)) < 0) return rc;

    if ((rc = get_int(root, F, "bos_token_id", 0, -1, &c->bos_token_id)) < 0) return rc;
    if ((rc = check_range(F, "bos_token_id", c->bos_token_id, -1, c->vocab_size - 1)) < 0) return rc;
    int given;
    if ((rc = get_eos(root, F, c->eos_token_ids, &c->num_eos_token_ids, &given)) < 0) return rc;
    return 0;
}

int config_parse(const char *config_json, const char *generation_json, ModelConfig *cfg) {
    int rc = 0;
    json_t *root = parse_json(config_json, "config.json", &rc);
    if (!root) return rc;
    ModelConfig c;
    rc = parse_config(root, &c);
    json_decref(root);
    if (rc < 0) return rc;

    if (generation_json) {
        const char *G = "generation_config.json";
        json_t *g = parse_json(generation_json, G, &rc);
        if (!g) return rc;
        int ids[CONFIG_MAX_EOS], n = 0, given = 0, bos = -1;
        rc = get_eos(g, G, ids, &n, &given);
        if (rc == 0 && field(g, "bos_token_id")) {
            rc = get_int(g, G, "bos_token_id", 0, -1, &bos);
            if (rc == 0) rc = check_range(G, "bos_token_id", bos, -1, c.vocab_size - 1);
            if (rc == 0) c.bos_token_id = bos;
        }
        json_decref(g);
        if (rc < 0) return rc;
        if (given) {
            memcpy(c.eos_token_ids, ids, sizeof ids);
            c.num_eos_token_ids = n;
        }
    }
    for (int i = 0; i < c.num_eos_token_ids; i++)
        if (c.eos_token_ids[i] >= c.vocab_size)
            return cvllm_errorf(CVLLM_EFORMAT, "%s: eos_token_id %d is not below vocab_size (%d)",
                                generation_json ? "generation_config.json" : "config.json",
                                c.eos_token_ids[i], c.vocab_size);
    *cfg = c;
    return 0;
}

/* Messages name the file with the folder once: "DIR/config.json: ..." for reading, "DIR: config.json:
 * field ..." for the contents (a caller that adds the folder again is ignored, see
 * cvllm_error_wrap). */
int config_load(const char *model_dir, ModelConfig *cfg) {
    char *path = path_join(model_dir, "config.json");
    char *text = file_read(path, FILE_MAX_CONFIG, NULL);
    if (!text) {
        int rc = CVLLM_EIO; /* file_read's message names the problem, unless the file is absent: */
        if (path_probe(path) == 0)
            rc = path_probe(model_dir) == 0
                     ? cvllm_errorf(CVLLM_EIO, "%s: no such folder", model_dir)
                     : cvllm_errorf(CVLLM_EIO, "%s: no config.json (is it a Hugging Face model folder?)",
                                    model_dir);
        free(path);
        return rc;
    }
    free(path);
    char *gpath = path_join(model_dir, "generation_config.json");
    char *gtext = NULL;
    int rc = path_probe(gpath); /* optional */
    if (rc > 0 && !(gtext = file_read(gpath, FILE_MAX_CONFIG, NULL))) rc = CVLLM_EIO;
    free(gpath);
    if (rc < 0) {
        free(text);
        return rc;
    }
    rc = config_parse(text, gtext, cfg);
    if (rc < 0) cvllm_error_wrap(rc, "%s", model_dir);
    free(text);
    free(gtext);
    return rc;
}
