/* test_config.c: config.json / generation_config.json parsing: transformers 4.x and 5.x layouts,
 * defaults per architecture, eos from generation_config.json, and every refusal (each must be a
 * negative code with a message naming the file and field, never a crash). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "model/config.h"

/* Qwen/Qwen3-0.6B config.json as transformers 4.51 wrote it. */
static const char *QWEN3_4X =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, "
    "\"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151645, "
    "\"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024, "
    "\"initializer_range\": 0.02, \"intermediate_size\": 3072, \"max_position_embeddings\": 40960, "
    "\"max_window_layers\": 28, \"model_type\": \"qwen3\", \"num_attention_heads\": 16, "
    "\"num_hidden_layers\": 28, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, "
    "\"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, "
    "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": "
    "\"4.51.0\", \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";

/* The same model as transformers 5.x writes it (dtype, rope_parameters, layer_types). */
static const char *QWEN3_5X =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, "
    "\"bos_token_id\": 151643, \"dtype\": \"bfloat16\", \"eos_token_id\": 151645, "
    "\"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024, "
    "\"intermediate_size\": 3072, \"layer_types\": [\"full_attention\", \"full_attention\"], "
    "\"max_position_embeddings\": 40960, \"model_type\": \"qwen3\", \"num_attention_heads\": 16, "
    "\"num_hidden_layers\": 2, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, "
    "\"rope_parameters\": {\"rope_theta\": 1000000, \"rope_type\": \"default\"}, "
    "\"tie_word_embeddings\": true, \"transformers_version\": \"5.0.0\", \"vocab_size\": 151936}";

/* meta-llama/Llama-3.2-1B style, 4.x rope_scaling llama3. */
static const char *LLAMA_4X =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"bos_token_id\": "
    "128000, \"eos_token_id\": [128001, 128008, 128009], \"head_dim\": 64, \"hidden_act\": "
    "\"silu\", \"hidden_size\": 2048, \"intermediate_size\": 8192, \"max_position_embeddings\": "
    "131072, \"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 32, "
    "\"num_hidden_layers\": 16, \"num_key_value_heads\": 8, \"pretraining_tp\": 1, "
    "\"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, "
    "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, \"rope_type\": "
    "\"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": "
    "\"bfloat16\", \"vocab_size\": 128256}";

/* Minimal Qwen2: everything optional left out. */
static const char *QWEN2_MIN =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"vocab_size\": 1000, \"hidden_size\": 64, "
    "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4}";

/* Parses base with `key` replaced by the JSON `value` (NULL: key removed). */
static int parse_with(const char *base, const char *key, const char *value, const char *gen,
                      ModelConfig *c) {
    json_t *root = json_loads(base, 0, NULL);
    assert_non_null(root);
    if (value) {
        json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        json_object_set_new(root, key, v);
    } else {
        json_object_del(root, key);
    }
    char *text = json_dumps(root, 0);
    json_decref(root);
    int rc = config_parse(text, gen, c);
    free(text);
    return rc;
}

/* Asserts an error with the given code whose message contains `needle`. */
#define ASSERT_ERR(expr, code, needle)                                                             \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != (code) || !strstr(cvllm_last_error(), (needle)))                                \
            fail_msg("expected %d containing \"%s\", got %d: %s", (code), (needle), rc_,           \
                     cvllm_last_error());                                                          \
    } while (0)

static void test_qwen3_4x(void **state) {
    (void)state;
    ModelConfig c;
    assert_int_equal(config_parse(QWEN3_4X, NULL, &c), 0);
    assert_int_equal(c.arch, ARCH_QWEN3);
    assert_string_equal(c.arch_name, "Qwen3ForCausalLM");
    assert_int_equal(c.vocab_size, 151936);
    assert_int_equal(c.hidden_size, 1024);
    assert_int_equal(c.intermediate_size, 3072);
    assert_int_equal(c.num_hidden_layers, 28);
    assert_int_equal(c.num_attention_heads, 16);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.head_dim, 128);
    assert_true(fabsf(c.rms_norm_eps - 1e-6f) < 1e-12f);
    assert_true(c.rope_theta == 1000000.0);
    assert_int_equal(c.rope_type, ROPE_DEFAULT);
    assert_int_equal(c.max_position_embeddings, 40960);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.attention_bias, 0);
    assert_int_equal(c.o_proj_bias, 0);
    assert_int_equal(c.qk_norm, 1);
    assert_int_equal(c.mlp_bias, 0);
    assert_int_equal(c.torch_dtype, DTYPE_BF16);
    assert_int_equal(c.bos_token_id, 151643);
    assert_int_equal(c.num_eos_token_ids, 1);
    assert_int_equal(c.eos_token_ids[0], 151645);
}

static void test_qwen3_5x(void **state) {
    (void)state;
    ModelConfig c;
    assert_int_equal(config_parse(QWEN3_5X, NULL, &c), 0);
    assert_int_equal(c.num_hidden_layers, 2);
    assert_true(c.rope_theta == 1000000.0);
    assert_int_equal(c.rope_type, ROPE_DEFAULT);
    assert_int_equal(c.torch_dtype, DTYPE_BF16);
    assert_int_equal(c.qk_norm, 1);
    /* rope_parameters wins over a stale top-level rope_theta */
    assert_int_equal(parse_with(QWEN3_5X, "rope_theta", "5", NULL, &c), 0);
    assert_true(c.rope_theta == 1000000.0);
    /* rope_parameters without rope_theta falls back on the top level, then 10000 */
    assert_int_equal(parse_with(QWEN3_5X, "rope_parameters", "{\"rope_type\": \"default\"}", NULL, &c), 0);
    assert_true(c.rope_theta == 10000.0);
    /* the per-layer-type form */
    assert_int_equal(parse_with(QWEN3_5X, "rope_parameters",
                                "{\"full_attention\": {\"rope_type\": \"linear\", \"factor\": 2, "
                                "\"rope_theta\": 20000}}",
                                NULL, &c),
                     0);
    assert_int_equal(c.rope_type, ROPE_LINEAR);
    assert_true(c.rope_factor == 2.0 && c.rope_theta == 20000.0);
}

static void test_llama_rope(void **state) {
    (void)state;
    ModelConfig c;
    assert_int_equal(config_parse(LLAMA_4X, NULL, &c), 0);
    assert_int_equal(c.arch, ARCH_LLAMA);
    assert_int_equal(c.qk_norm, 0);
    assert_int_equal(c.rope_type, ROPE_LLAMA3);
    assert_true(c.rope_theta == 500000.0);
    assert_true(c.rope_factor == 32.0);
    assert_true(c.rope_low_freq_factor == 1.0 && c.rope_high_freq_factor == 4.0);
    assert_int_equal(c.rope_original_max_position, 8192);
    assert_int_equal(c.num_eos_token_ids, 3);
    assert_int_equal(c.eos_token_ids[2], 128009);
    /* 4.x "type" instead of "rope_type" */
    assert_int_equal(parse_with(LLAMA_4X, "rope_scaling", "{\"type\": \"linear\", \"factor\": 4}", NULL, &c), 0);
    assert_int_equal(c.rope_type, ROPE_LINEAR);
    assert_true(c.rope_factor == 4.0 && c.rope_theta == 500000.0);
    /* 5.x rope_parameters llama3 */
    assert_int_equal(parse_with(LLAMA_4X, "rope_parameters",
                                "{\"rope_type\": \"llama3\", \"rope_theta\": 100000, \"factor\": 8, "
                                "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                                "\"original_max_position_embeddings\": 256}",
                                NULL, &c),
                     0);
    assert_int_equal(c.rope_type, ROPE_LLAMA3);
    assert_true(c.rope_theta == 100000.0 && c.rope_factor == 8.0);
    assert_int_equal(c.rope_original_max_position, 256);
    /* Llama reads attention_bias: all four projections */
    assert_int_equal(parse_with(LLAMA_4X, "attention_bias", "true", NULL, &c), 0);
    assert_int_equal(c.attention_bias, 1);
    assert_int_equal(c.o_proj_bias, 1);
    /* a default-type rope_scaling */
    assert_int_equal(parse_with(LLAMA_4X, "rope_scaling", "{\"rope_type\": \"default\"}", NULL, &c), 0);
    assert_int_equal(c.rope_type, ROPE_DEFAULT);
}

static void test_defaults(void **state) {
    (void)state;
    ModelConfig c;
    assert_int_equal(config_parse(QWEN2_MIN, NULL, &c), 0);
    assert_int_equal(c.arch, ARCH_QWEN2);
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.attention_bias, 1); /* Qwen2: always q/k/v bias */
    assert_int_equal(c.o_proj_bias, 0);
    assert_int_equal(c.qk_norm, 0);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_true(fabsf(c.rms_norm_eps - 1e-6f) < 1e-12f);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.rope_type, ROPE_DEFAULT);
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_int_equal(c.torch_dtype, DTYPE_F32);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.num_eos_token_ids, 0);
    /* explicit nulls mean "unset" too */
    assert_int_equal(parse_with(QWEN2_MIN, "num_key_value_heads", "null", NULL, &c), 0);
    assert_int_equal(c.num_key_value_heads, 4);
    /* Qwen2 ignores attention_bias (hard-coded bias=True) */
    assert_int_equal(parse_with(QWEN2_MIN, "attention_bias", "false", NULL, &c), 0);
    assert_int_equal(c.attention_bias, 1);
    /* no architectures: model_type decides */
    assert_int_equal(parse_with(QWEN2_MIN, "architectures", NULL, NULL, &c), CVLLM_EFORMAT);
    const char *llama_mt = "{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 8, "
                           "\"intermediate_size\": 8, \"num_hidden_layers\": 1, "
                           "\"num_attention_heads\": 2}";
    assert_int_equal(config_parse(llama_mt, NULL, &c), 0);
    assert_int_equal(c.arch, ARCH_LLAMA);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_int_equal(c.attention_bias, 0);
    /* float16 in torch_dtype */
    assert_int_equal(parse_with(QWEN2_MIN, "torch_dtype", "\"float16\"", NULL, &c), 0);
    assert_int_equal(c.torch_dtype, DTYPE_F16);
}

static void test_generation_eos(void **state) {
    (void)state;
    ModelConfig c;
    assert_int_equal(config_parse(QWEN3_4X, "{\"eos_token_id\": [151645, 151643], \"bos_token_id\": 151643}", &c), 0);
    assert_int_equal(c.num_eos_token_ids, 2);
    assert_int_equal(c.eos_token_ids[0], 151645);
    assert_int_equal(c.eos_token_ids[1], 151643);
    assert_int_equal(config_parse(QWEN3_4X, "{\"eos_token_id\": 7}", &c), 0);
    assert_int_equal(c.num_eos_token_ids, 1);
    assert_int_equal(c.eos_token_ids[0], 7);
    /* no eos in generation_config: config.json's stays */
    assert_int_equal(config_parse(QWEN3_4X, "{\"do_sample\": true}", &c), 0);
    assert_int_equal(c.num_eos_token_ids, 1);
    assert_int_equal(c.eos_token_ids[0], 151645);
    ASSERT_ERR(config_parse(QWEN3_4X, "{\"eos_token_id\": \"x\"}", &c), CVLLM_EFORMAT,
               "generation_config.json: eos_token_id");
    ASSERT_ERR(config_parse(QWEN3_4X, "{\"eos_token_id\": [1, -2]}", &c), CVLLM_EFORMAT,
               "generation_config.json: eos_token_id[1]");
    ASSERT_ERR(config_parse(QWEN3_4X, "[", &c), CVLLM_EFORMAT, "generation_config.json: invalid JSON");
    ASSERT_ERR(config_parse(QWEN3_4X, "{\"eos_token_id\": 999999}", &c), CVLLM_EFORMAT,
               "not below vocab_size");
    ASSERT_ERR(config_parse(QWEN3_4X, "{\"eos_token_id\": [1,2,3,4,5,6,7,8,9]}", &c),
               CVLLM_EUNSUPPORTED, "at most");
}

static void test_errors(void **state) {
    (void)state;
    ModelConfig c;
    ASSERT_ERR(config_parse("{\"architectures\": ", NULL, &c), CVLLM_EFORMAT,
               "config.json: invalid JSON");
    ASSERT_ERR(config_parse("", NULL, &c), CVLLM_EFORMAT, "config.json: invalid JSON");
    ASSERT_ERR(config_parse("[1, 2]", NULL, &c), CVLLM_EFORMAT, "top level");
    ASSERT_ERR(config_parse("{\"a\": 1, \"a\": 2}", NULL, &c), CVLLM_EFORMAT, "invalid JSON");
    ASSERT_ERR(parse_with(QWEN3_4X, "architectures", "[\"MistralForCausalLM\"]", NULL, &c),
               CVLLM_EUNSUPPORTED, "config.json: architecture 'MistralForCausalLM' is not supported");
    ASSERT_ERR(parse_with(QWEN3_4X, "architectures", "[]", NULL, &c), CVLLM_EFORMAT, "architectures");
    ASSERT_ERR(parse_with(QWEN3_4X, "architectures", "\"Qwen3ForCausalLM\"", NULL, &c),
               CVLLM_EFORMAT, "architectures");
    ASSERT_ERR(parse_with(LLAMA_4X, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4}", NULL, &c),
               CVLLM_EUNSUPPORTED, "rope_scaling.rope_type 'yarn' is not supported");
    ASSERT_ERR(parse_with(LLAMA_4X, "rope_scaling", "{\"type\": \"dynamic\", \"factor\": 4}", NULL, &c),
               CVLLM_EUNSUPPORTED, "rope_scaling.type 'dynamic'");
    ASSERT_ERR(parse_with(QWEN3_5X, "rope_parameters", "{\"rope_type\": \"longrope\"}", NULL, &c),
               CVLLM_EUNSUPPORTED, "rope_parameters.rope_type 'longrope'");
    ASSERT_ERR(parse_with(LLAMA_4X, "rope_scaling", "{\"factor\": 4}", NULL, &c), CVLLM_EFORMAT,
               "neither rope_type nor type");
    ASSERT_ERR(parse_with(LLAMA_4X, "rope_scaling", "[1]", NULL, &c), CVLLM_EFORMAT,
               "rope_scaling must be an object");
    ASSERT_ERR(parse_with(LLAMA_4X, "rope_scaling",
                          "{\"rope_type\": \"llama3\", \"factor\": 8, \"high_freq_factor\": 4, "
                          "\"original_max_position_embeddings\": 8192}",
                          NULL, &c),
               CVLLM_EFORMAT, "missing field rope_scaling.low_freq_factor");
    ASSERT_ERR(parse_with(LLAMA_4X, "rope_scaling",
                          "{\"rope_type\": \"llama3\", \"factor\": 8, \"high_freq_factor\": 1, "
                          "\"low_freq_factor\": 1, \"original_max_position_embeddings\": 8192}",
                          NULL, &c),
               CVLLM_EFORMAT, "high_freq_factor");
    ASSERT_ERR(parse_with(LLAMA_4X, "rope_scaling", "{\"rope_type\": \"linear\"}", NULL, &c),
               CVLLM_EFORMAT, "missing field rope_scaling.factor");
    ASSERT_ERR(parse_with(LLAMA_4X, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": -1}", NULL, &c),
               CVLLM_EFORMAT, "must be positive");
    /* bad field types */
    ASSERT_ERR(parse_with(QWEN3_4X, "hidden_size", "\"1024\"", NULL, &c), CVLLM_EFORMAT,
               "config.json: hidden_size must be an integer, got a string");
    ASSERT_ERR(parse_with(QWEN3_4X, "num_hidden_layers", "28.5", NULL, &c), CVLLM_EFORMAT,
               "num_hidden_layers must be an integer");
    ASSERT_ERR(parse_with(QWEN3_4X, "tie_word_embeddings", "\"yes\"", NULL, &c), CVLLM_EFORMAT,
               "tie_word_embeddings must be true or false");
    ASSERT_ERR(parse_with(QWEN3_4X, "rms_norm_eps", "\"small\"", NULL, &c), CVLLM_EFORMAT,
               "rms_norm_eps must be a number");
    ASSERT_ERR(parse_with(QWEN3_4X, "rope_theta", "[]", NULL, &c), CVLLM_EFORMAT,
               "rope_theta must be a number");
    ASSERT_ERR(parse_with(QWEN3_4X, "eos_token_id", "{}", NULL, &c), CVLLM_EFORMAT,
               "config.json: eos_token_id must be an integer or a list");
    ASSERT_ERR(parse_with(QWEN3_4X, "torch_dtype", "\"float64\"", NULL, &c), CVLLM_EUNSUPPORTED,
               "torch_dtype 'float64'");
    ASSERT_ERR(parse_with(QWEN3_4X, "vocab_size", "4294967296", NULL, &c), CVLLM_EFORMAT,
               "out of range");
    /* missing and zero / negative sizes */
    ASSERT_ERR(parse_with(QWEN3_4X, "vocab_size", NULL, NULL, &c), CVLLM_EFORMAT,
               "config.json: missing field vocab_size");
    ASSERT_ERR(parse_with(QWEN3_4X, "hidden_size", "0", NULL, &c), CVLLM_EFORMAT,
               "config.json: hidden_size (0) must be in");
    ASSERT_ERR(parse_with(QWEN3_4X, "intermediate_size", "-5", NULL, &c), CVLLM_EFORMAT,
               "intermediate_size (-5)");
    ASSERT_ERR(parse_with(QWEN3_4X, "num_hidden_layers", "0", NULL, &c), CVLLM_EFORMAT,
               "num_hidden_layers (0)");
    ASSERT_ERR(parse_with(QWEN3_4X, "num_key_value_heads", "0", NULL, &c), CVLLM_EFORMAT,
               "num_key_value_heads (0)");
    ASSERT_ERR(parse_with(QWEN3_4X, "head_dim", "0", NULL, &c), CVLLM_EFORMAT, "head_dim (0)");
    ASSERT_ERR(parse_with(QWEN3_4X, "head_dim", "127", NULL, &c), CVLLM_EFORMAT, "must be even");
    ASSERT_ERR(parse_with(QWEN3_4X, "max_position_embeddings", "0", NULL, &c), CVLLM_EFORMAT,
               "max_position_embeddings (0)");
    ASSERT_ERR(parse_with(QWEN3_4X, "rms_norm_eps", "0", NULL, &c), CVLLM_EFORMAT, "rms_norm_eps");
    ASSERT_ERR(parse_with(QWEN3_4X, "rms_norm_eps", "1e-60", NULL, &c), CVLLM_EFORMAT,
               "rms_norm_eps"); /* found by fuzz_config: underflows to 0 as a float */
    ASSERT_ERR(parse_with(QWEN3_4X, "rope_theta", "-1", NULL, &c), CVLLM_EFORMAT,
               "rope_theta (-1) must be positive");
    ASSERT_ERR(parse_with(QWEN3_4X, "bos_token_id", "151936", NULL, &c), CVLLM_EFORMAT,
               "bos_token_id (151936)");
    /* heads */
    const char *q3_kv3 = "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 10, "
                         "\"hidden_size\": 64, \"intermediate_size\": 8, \"num_hidden_layers\": 1, "
                         "\"num_attention_heads\": 8, \"num_key_value_heads\": 3}";
    ASSERT_ERR(config_parse(q3_kv3, NULL, &c), CVLLM_EFORMAT,
               "config.json: num_key_value_heads (3) must divide num_attention_heads (8)");
    ASSERT_ERR(parse_with(QWEN2_MIN, "num_attention_heads", "5", NULL, &c), CVLLM_EFORMAT,
               "does not divide hidden_size");
    ASSERT_ERR(parse_with(QWEN2_MIN, "num_key_value_heads", "8", NULL, &c), CVLLM_EFORMAT,
               "num_key_value_heads (8) must be in [1, 4]");
    /* math we do not implement */
    ASSERT_ERR(parse_with(LLAMA_4X, "mlp_bias", "true", NULL, &c), CVLLM_EUNSUPPORTED, "mlp_bias");
    ASSERT_ERR(parse_with(LLAMA_4X, "hidden_act", "\"gelu\"", NULL, &c), CVLLM_EUNSUPPORTED,
               "hidden_act 'gelu'");
    ASSERT_ERR(parse_with(QWEN3_4X, "use_sliding_window", "true", NULL, &c), CVLLM_EUNSUPPORTED,
               "use_sliding_window");
    ASSERT_ERR(parse_with(QWEN3_5X, "layer_types", "[\"full_attention\", \"sliding_attention\"]", NULL, &c),
               CVLLM_EUNSUPPORTED, "layer_types[1]");
    ASSERT_ERR(parse_with(QWEN3_4X, "partial_rotary_factor", "0.5", NULL, &c), CVLLM_EUNSUPPORTED,
               "partial_rotary_factor");
}

static char *make_dir(void) {
    char tmpl[] = "/tmp/cvllm_test_config_XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return xstrdup(d);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char *p = path_join(dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(p);
}

static void remove_dir(char *dir) {
    const char *names[] = {"config.json", "generation_config.json"};
    for (int i = 0; i < 2; i++) {
        char *p = path_join(dir, names[i]);
        unlink(p);
        free(p);
    }
    rmdir(dir);
    free(dir);
}

static void test_load(void **state) {
    (void)state;
    ModelConfig c;
    char *dir = make_dir();
    ASSERT_ERR(config_load(dir, &c), CVLLM_EIO, "config.json");
    ASSERT_ERR(config_load("/nonexistent/model", &c), CVLLM_EIO, "/nonexistent/model");
    write_text(dir, "config.json", QWEN3_4X);
    assert_int_equal(config_load(dir, &c), 0);
    assert_int_equal(c.num_eos_token_ids, 1);
    write_text(dir, "generation_config.json", "{\"bos_token_id\": 151643, \"eos_token_id\": [151645, 151643]}");
    assert_int_equal(config_load(dir, &c), 0);
    assert_int_equal(c.num_eos_token_ids, 2);
    assert_int_equal(c.eos_token_ids[1], 151643);
    write_text(dir, "generation_config.json", "{not json");
    ASSERT_ERR(config_load(dir, &c), CVLLM_EFORMAT, "generation_config.json");
    assert_non_null(strstr(cvllm_last_error(), dir)); /* the folder is named too */
    write_text(dir, "config.json", "{\"architectures\": [\"GPT2LMHeadModel\"]}");
    ASSERT_ERR(config_load(dir, &c), CVLLM_EUNSUPPORTED, "GPT2LMHeadModel");
    remove_dir(dir);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_config: config_load blocked on a special file\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

/* config_load(dir) fails at once with code and a message that names dir exactly once. */
static void expect_load_error(const char *dir, int code, const char *needle) {
    ModelConfig c;
    alarm(10);
    int rc = config_load(dir, &c);
    alarm(0);
    if (rc != code || !strstr(cvllm_last_error(), needle) || count(cvllm_last_error(), dir) != 1)
        fail_msg("expected %d containing \"%s\" and %s once, got %d: %s", code, needle, dir, rc,
                 cvllm_last_error());
}

/* config.json and generation_config.json as special files, over their cap, or with a number
 * out of range: an error at once, naming the file (and the folder once). */
static void test_load_files(void **state) {
    (void)state;
    signal(SIGALRM, on_alarm);
    char *dir = make_dir(), *cfg = path_join(dir, "config.json"),
         *gen = path_join(dir, "generation_config.json");
    const char *files[] = {cfg, gen};
    write_text(dir, "config.json", QWEN3_4X);
    for (int i = 0; i < 2; i++) {
        const char *p = files[i];
        unlink(p);
        assert_int_equal(mkfifo(p, 0644), 0);
        expect_load_error(dir, CVLLM_EIO, "a FIFO (named pipe), not a regular file");
        unlink(p);
        assert_int_equal(symlink("/dev/zero", p), 0);
        expect_load_error(dir, CVLLM_EIO, "a character device, not a regular file");
        unlink(p);
        assert_int_equal(symlink("/dev/urandom", p), 0);
        expect_load_error(dir, CVLLM_EIO, "a character device, not a regular file");
        unlink(p);
        assert_int_equal(symlink(p, p), 0);
        expect_load_error(dir, CVLLM_EIO, "symbolic links");
        unlink(p);
        assert_int_equal(symlink("../blobs/x", p), 0);
        expect_load_error(dir, CVLLM_EIO, "a symbolic link to a missing file");
        unlink(p);
        assert_int_equal(mkdir(p, 0755), 0);
        expect_load_error(dir, CVLLM_EIO, "a directory, not a regular file");
        rmdir(p);
        FILE *f = fopen(p, "wb"); /* sparse, 5 MiB: over the 4 MiB cap */
        assert_non_null(f);
        assert_int_equal(ftruncate(fileno(f), (off_t)5 << 20), 0);
        fclose(f);
        expect_load_error(dir, CVLLM_EIO, "too large");
        unlink(p);
        write_text(dir, "config.json", QWEN3_4X);
    }
    /* valid JSON, a number too large for any field: the field is named */
    write_text(dir, "generation_config.json", "{\"eos_token_id\": [151645, 1000000000000000000000]}");
    expect_load_error(dir, CVLLM_EFORMAT,
                      "generation_config.json: eos_token_id[1] (1000000000000000000000) is out of range");
    unlink(gen);
    write_text(dir, "config.json", "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": "
                                   "99999999999999999999999}");
    expect_load_error(dir, CVLLM_EFORMAT, "config.json: vocab_size (99999999999999999999999) is out of range");
    expect_load_error("/nonexistent/model", CVLLM_EIO, "no such folder");
    unlink(cfg);
    expect_load_error(dir, CVLLM_EIO, "no config.json");
    free(cfg), free(gen);
    remove_dir(dir);
}

static void test_dtype_helpers(void **state) {
    (void)state;
    assert_int_equal(dtype_size(DTYPE_F32), 4);
    assert_int_equal(dtype_size(DTYPE_F16), 2);
    assert_int_equal(dtype_size(DTYPE_BF16), 2);
    assert_string_equal(dtype_name(DTYPE_BF16), "bf16");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_4x),       cmocka_unit_test(test_qwen3_5x),
        cmocka_unit_test(test_llama_rope),     cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_generation_eos), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_load),           cmocka_unit_test(test_dtype_helpers),
        cmocka_unit_test(test_load_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
