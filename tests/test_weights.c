/* test_weights.c: weights_bind against small synthetic folders: a correct Qwen3/Qwen2/Llama
 * folder binds with the right views; a wrong shape names the tensor with expected and actual; a
 * missing tensor is named; tied vs untied lm_head; mixed dtypes. With CVLLM_BIN set, the
 * `cvllm mkmodel` test presets are also loaded end to end (config_load + weights_load). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "model/config.h"
#include "model/weights.h"

#define ASSERT_ERR(expr, code, needle)                                                             \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != (code) || !strstr(cvllm_last_error(), (needle)))                                \
            fail_msg("expected %d containing \"%s\", got %d: %s", (code), (needle), rc_,           \
                     cvllm_last_error());                                                          \
    } while (0)

/* vocab 32, hidden 16, inter 24, 2 layers, 4 heads, 2 kv heads, head_dim 8 (heads*hd = 32 != 16) */
static const char *CFG_QWEN3 =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 32, \"hidden_size\": 16, "
    "\"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
    "\"num_key_value_heads\": 2, \"head_dim\": 8, \"tie_word_embeddings\": false}";
static const char *CFG_QWEN3_TIED =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 32, \"hidden_size\": 16, "
    "\"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
    "\"num_key_value_heads\": 2, \"head_dim\": 8, \"tie_word_embeddings\": true}";
static const char *CFG_QWEN2 =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"vocab_size\": 32, \"hidden_size\": 16, "
    "\"intermediate_size\": 24, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
    "\"num_key_value_heads\": 1, \"tie_word_embeddings\": true}";
static const char *CFG_LLAMA_BIAS =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 32, \"hidden_size\": 16, "
    "\"intermediate_size\": 24, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
    "\"attention_bias\": true}";

/* ---- building a folder's tensor list ---- */

#define MAX_T 64
typedef struct {
    StTensor t[MAX_T];
    char names[MAX_T][96];
    int n;
} TList;

static uint8_t g_zeros[32 * 32 * 4]; /* the largest tensor: [32, 32] f32 */

static void put(TList *l, const char *name, int64_t rows, int64_t cols) {
    assert_true(l->n < MAX_T);
    StTensor *t = &l->t[l->n];
    snprintf(l->names[l->n], sizeof l->names[0], "%s", name);
    *t = (StTensor){.name = l->names[l->n], .dtype = DTYPE_F32, .data = g_zeros};
    if (rows < 0) t->ndim = 1, t->shape[0] = cols;
    else t->ndim = 2, t->shape[0] = rows, t->shape[1] = cols;
    l->n++;
}

/* The tensors a correct folder for c holds (written independently of weights.c's list). */
static void full_list(const ModelConfig *c, TList *l) {
    int64_t H = c->hidden_size, Q = (int64_t)c->num_attention_heads * c->head_dim,
            K = (int64_t)c->num_key_value_heads * c->head_dim, I = c->intermediate_size;
    char n[96];
    l->n = 0;
    put(l, "model.embed_tokens.weight", c->vocab_size, H);
    for (int i = 0; i < c->num_hidden_layers; i++) {
#define P(s, r, k) (snprintf(n, sizeof n, "model.layers.%d.%s", i, s), put(l, n, r, k))
        P("input_layernorm.weight", -1, H);
        P("post_attention_layernorm.weight", -1, H);
        P("self_attn.q_proj.weight", Q, H);
        P("self_attn.k_proj.weight", K, H);
        P("self_attn.v_proj.weight", K, H);
        P("self_attn.o_proj.weight", H, Q);
        if (c->arch == ARCH_QWEN2 || (c->arch != ARCH_QWEN2 && c->attention_bias)) {
            P("self_attn.q_proj.bias", -1, Q);
            P("self_attn.k_proj.bias", -1, K);
            P("self_attn.v_proj.bias", -1, K);
        }
        if (c->arch != ARCH_QWEN2 && c->attention_bias) P("self_attn.o_proj.bias", -1, H);
        if (c->arch == ARCH_QWEN3) {
            P("self_attn.q_norm.weight", -1, c->head_dim);
            P("self_attn.k_norm.weight", -1, c->head_dim);
        }
        P("mlp.gate_proj.weight", I, H);
        P("mlp.up_proj.weight", I, H);
        P("mlp.down_proj.weight", H, I);
#undef P
    }
    put(l, "model.norm.weight", -1, H);
    if (!c->tie_word_embeddings) put(l, "lm_head.weight", c->vocab_size, H);
}

static StTensor *find(TList *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return &l->t[i];
    fail_msg("no tensor %s in the list", name);
    return NULL;
}

static void drop(TList *l, const char *name) {
    StTensor *t = find(l, name);
    int i = (int)(t - l->t);
    memmove(&l->t[i], &l->t[i + 1], (size_t)(l->n - i - 1) * sizeof l->t[0]);
    l->n--;
}

static char *g_dir;

static int setup(void **state) {
    (void)state;
    char tmpl[] = "/tmp/cvllm_test_weights_XXXXXX";
    g_dir = xstrdup(mkdtemp(tmpl));
    return 0;
}

static void rm_rf(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = path_join(dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) rm_rf(p);
        else unlink(p);
        free(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

static int teardown(void **state) {
    (void)state;
    rm_rf(g_dir);
    free(g_dir);
    return 0;
}

/* Writes l to g_dir/model.safetensors and binds it against c. */
static int bind_list(const ModelConfig *c, TList *l, ModelWeights *w) {
    char *p = path_join(g_dir, "model.safetensors");
    assert_int_equal(safetensors_write(p, l->t, l->n), 0);
    free(p);
    return weights_load(g_dir, c, w);
}

static void cfg(const char *json, ModelConfig *c) {
    if (config_parse(json, NULL, c) != 0) fail_msg("config: %s", cvllm_last_error());
}

static void test_qwen3_untied(void **state) {
    (void)state;
    ModelConfig c;
    TList l;
    ModelWeights w;
    cfg(CFG_QWEN3, &c);
    full_list(&c, &l);
    find(&l, "model.embed_tokens.weight")->dtype = DTYPE_BF16; /* mixed dtypes are fine */
    find(&l, "model.layers.1.mlp.up_proj.weight")->dtype = DTYPE_F16;
    assert_int_equal(bind_list(&c, &l, &w), 0);
    assert_non_null(w.st);
    assert_int_equal(w.embed_tokens.dtype, DTYPE_BF16);
    assert_int_equal(w.embed_tokens.rows, 32);
    assert_int_equal(w.embed_tokens.cols, 16);
    assert_non_null(w.lm_head.data);
    assert_ptr_not_equal(w.lm_head.data, w.embed_tokens.data);
    assert_int_equal(w.lm_head.dtype, DTYPE_F32);
    const LayerWeights *L = &w.layers[1];
    assert_int_equal(L->q_proj.rows, 32);
    assert_int_equal(L->q_proj.cols, 16);
    assert_int_equal(L->k_proj.rows, 16);
    assert_int_equal(L->o_proj.rows, 16);
    assert_int_equal(L->o_proj.cols, 32);
    assert_int_equal(L->gate_proj.rows, 24);
    assert_int_equal(L->down_proj.cols, 24);
    assert_int_equal(L->up_proj.dtype, DTYPE_F16);
    assert_non_null(L->q_norm.data);
    assert_int_equal(L->q_norm.rows, 1);
    assert_int_equal(L->q_norm.cols, 8);
    assert_int_equal(L->input_layernorm.rows, 1);
    assert_int_equal(L->input_layernorm.cols, 16);
    assert_null(L->q_bias.data);
    assert_null(L->o_bias.data);
    assert_int_equal(w.norm.cols, 16);
    /* the view points at the stored tensor */
    assert_ptr_equal(L->k_proj.data,
                     safetensors_find(w.st, "model.layers.1.self_attn.k_proj.weight")->data);
    weights_free(&w);
    weights_free(&w); /* zeroed: fine */
}

static void test_tied(void **state) {
    (void)state;
    ModelConfig c;
    TList l;
    ModelWeights w;
    cfg(CFG_QWEN3_TIED, &c);
    full_list(&c, &l);
    assert_int_equal(bind_list(&c, &l, &w), 0);
    assert_ptr_equal(w.lm_head.data, w.embed_tokens.data);
    assert_int_equal(w.lm_head.rows, 32);
    weights_free(&w);
    /* tied, with an lm_head.weight stored anyway (even a wrong one): ignored */
    put(&l, "lm_head.weight", 3, 3);
    assert_int_equal(bind_list(&c, &l, &w), 0);
    assert_ptr_equal(w.lm_head.data, w.embed_tokens.data);
    weights_free(&w);
    /* untied without lm_head.weight */
    cfg(CFG_QWEN3, &c);
    full_list(&c, &l);
    drop(&l, "lm_head.weight");
    ASSERT_ERR(bind_list(&c, &l, &w), CVLLM_EFORMAT, "missing tensor lm_head.weight");
    assert_null(w.layers);
}

static void test_wrong_shape(void **state) {
    (void)state;
    ModelConfig c;
    TList l;
    ModelWeights w;
    cfg(CFG_QWEN3, &c);
    full_list(&c, &l);
    find(&l, "model.layers.1.self_attn.k_proj.weight")->shape[0] = 32;
    ASSERT_ERR(bind_list(&c, &l, &w), CVLLM_EFORMAT,
               "model.layers.1.self_attn.k_proj.weight: expected shape [16, 16], got [32, 16]");
    assert_non_null(strstr(cvllm_last_error(), g_dir));

    full_list(&c, &l);
    StTensor *n = find(&l, "model.norm.weight");
    n->ndim = 2, n->shape[0] = 1, n->shape[1] = 16;
    ASSERT_ERR(bind_list(&c, &l, &w), CVLLM_EFORMAT,
               "model.norm.weight: expected shape [16], got [1, 16]");

    full_list(&c, &l);
    find(&l, "model.layers.0.self_attn.q_norm.weight")->shape[0] = 16; /* head_dim is 8 */
    ASSERT_ERR(bind_list(&c, &l, &w), CVLLM_EFORMAT,
               "model.layers.0.self_attn.q_norm.weight: expected shape [8], got [16]");

    full_list(&c, &l);
    StTensor *e = find(&l, "model.embed_tokens.weight");
    e->ndim = 3, e->shape[0] = 2, e->shape[1] = 16, e->shape[2] = 16;
    ASSERT_ERR(bind_list(&c, &l, &w), CVLLM_EFORMAT,
               "model.embed_tokens.weight: expected shape [32, 16], got [2, 16, 16]");
}

static void test_missing(void **state) {
    (void)state;
    ModelConfig c;
    TList l;
    ModelWeights w;
    cfg(CFG_QWEN3, &c);
    full_list(&c, &l);
    drop(&l, "model.norm.weight");
    ASSERT_ERR(bind_list(&c, &l, &w), CVLLM_EFORMAT, "missing tensor model.norm.weight");
    full_list(&c, &l);
    drop(&l, "model.layers.1.self_attn.k_norm.weight");
    ASSERT_ERR(bind_list(&c, &l, &w), CVLLM_EFORMAT,
               "missing tensor model.layers.1.self_attn.k_norm.weight");
    full_list(&c, &l);
    drop(&l, "model.layers.0.mlp.down_proj.weight");
    ASSERT_ERR(bind_list(&c, &l, &w), CVLLM_EFORMAT, "model.layers.0.mlp.down_proj.weight");
    /* no safetensors at all */
    char *p = path_join(g_dir, "model.safetensors");
    unlink(p);
    free(p);
    ASSERT_ERR(weights_load(g_dir, &c, &w), CVLLM_EIO, "no model.safetensors");
}

static void test_biases(void **state) {
    (void)state;
    ModelConfig c;
    TList l;
    ModelWeights w;
    cfg(CFG_QWEN2, &c);
    full_list(&c, &l);
    assert_int_equal(bind_list(&c, &l, &w), 0);
    assert_non_null(w.layers[0].q_bias.data);
    assert_int_equal(w.layers[0].q_bias.rows, 1);
    assert_int_equal(w.layers[0].q_bias.cols, 16);
    assert_int_equal(w.layers[0].k_bias.cols, 4); /* MQA: one kv head of 4 */
    assert_int_equal(w.layers[0].v_bias.cols, 4);
    assert_null(w.layers[0].o_bias.data);
    assert_null(w.layers[0].q_norm.data);
    weights_free(&w);
    drop(&l, "model.layers.0.self_attn.v_proj.bias");
    ASSERT_ERR(bind_list(&c, &l, &w), CVLLM_EFORMAT,
               "missing tensor model.layers.0.self_attn.v_proj.bias");

    cfg(CFG_LLAMA_BIAS, &c);
    full_list(&c, &l);
    assert_int_equal(bind_list(&c, &l, &w), 0);
    assert_non_null(w.layers[0].o_bias.data);
    assert_int_equal(w.layers[0].o_bias.cols, 16);
    assert_non_null(w.layers[0].q_bias.data);
    assert_null(w.layers[0].k_norm.data);
    weights_free(&w);
    drop(&l, "model.layers.0.self_attn.o_proj.bias");
    ASSERT_ERR(bind_list(&c, &l, &w), CVLLM_EFORMAT, "model.layers.0.self_attn.o_proj.bias");
}

/* weights_bind leaves st with the caller on failure, takes it on success. */
static void test_bind_ownership(void **state) {
    (void)state;
    ModelConfig c;
    TList l;
    ModelWeights w;
    cfg(CFG_QWEN3_TIED, &c);
    full_list(&c, &l);
    drop(&l, "model.norm.weight");
    char *p = path_join(g_dir, "x.safetensors");
    assert_int_equal(safetensors_write(p, l.t, l.n), 0);
    SafeTensors *st;
    assert_int_equal(safetensors_open_file(p, &st), 0);
    ASSERT_ERR(weights_bind(&c, st, &w), CVLLM_EFORMAT, "missing tensor model.norm.weight");
    safetensors_close(st);
    full_list(&c, &l);
    assert_int_equal(safetensors_write(p, l.t, l.n), 0);
    assert_int_equal(safetensors_open_file(p, &st), 0);
    assert_int_equal(weights_bind(&c, st, &w), 0);
    assert_ptr_equal(w.st, st);
    weights_free(&w);
    free(p);
}

/* The folders `cvllm mkmodel` writes load through the real loaders. */
static void test_mkmodel_presets(void **state) {
    (void)state;
    const char *bin = getenv("CVLLM_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        print_message("CVLLM_BIN not set: skipping the mkmodel round trip\n");
        skip();
    }
    const char *presets[] = {"test-qwen3", "test-qwen2", "test-llama"};
    const ModelArch archs[] = {ARCH_QWEN3, ARCH_QWEN2, ARCH_LLAMA};
    const DType dtypes[] = {DTYPE_F32, DTYPE_F32, DTYPE_F16};
    for (int i = 0; i < 3; i++) {
        char *out = path_join(g_dir, presets[i]);
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "'%s' mkmodel --preset %s --seed 5 '%s' >/dev/null", bin,
                 presets[i], out);
        assert_int_equal(system(cmd), 0);
        ModelConfig c;
        ModelWeights w;
        if (config_load(out, &c) != 0) fail_msg("%s: %s", presets[i], cvllm_last_error());
        assert_int_equal(c.arch, archs[i]);
        if (weights_load(out, &c, &w) != 0) fail_msg("%s: %s", presets[i], cvllm_last_error());
        assert_int_equal(w.embed_tokens.dtype, dtypes[i]);
        assert_int_equal(w.embed_tokens.rows, 512);
        if (i == 0) {
            assert_int_equal(c.head_dim, 24);
            assert_int_equal(c.num_eos_token_ids, 1);
            assert_ptr_not_equal(w.lm_head.data, w.embed_tokens.data);
            const float *nw = w.norm.data; /* norm weights are near 1 but not 1 */
            assert_true(nw[0] > 0.7f && nw[0] < 1.3f && nw[0] != 1.0f);
        }
        if (i == 1) {
            assert_int_equal(c.num_key_value_heads, 1);
            assert_non_null(w.layers[0].k_bias.data);
            assert_ptr_equal(w.lm_head.data, w.embed_tokens.data);
            assert_int_equal(c.num_eos_token_ids, 2);
        }
        if (i == 2) {
            assert_int_equal(c.rope_type, ROPE_LLAMA3);
            assert_int_equal(c.rope_original_max_position, 256);
        }
        weights_free(&w);
        free(out);
    }
}

/* Folders written by transformers 5.17 (scripts/gen_golden.py): qwen3 (bf16, untied),
 * qwen2 (f32, 5 shards + index, MQA, biases, tied), llama (f16, llama3 rope_parameters). */
static void test_golden_fixtures(void **state) {
    (void)state;
    const char *dirs[] = {"tests/fixtures/golden/qwen3", "tests/fixtures/golden/qwen2",
                          "tests/fixtures/golden/llama"};
    const ModelArch archs[] = {ARCH_QWEN3, ARCH_QWEN2, ARCH_LLAMA};
    const DType dtypes[] = {DTYPE_BF16, DTYPE_F32, DTYPE_F16};
    int found = 0;
    for (int i = 0; i < 3; i++) {
        char *cj = path_join(dirs[i], "config.json");
        int have = access(cj, R_OK) == 0;
        free(cj);
        if (!have) continue;
        found++;
        ModelConfig c;
        ModelWeights w;
        if (config_load(dirs[i], &c) != 0) fail_msg("%s", cvllm_last_error());
        assert_int_equal(c.arch, archs[i]);
        assert_int_equal(c.torch_dtype, dtypes[i]);
        if (weights_load(dirs[i], &c, &w) != 0) fail_msg("%s", cvllm_last_error());
        assert_int_equal(w.embed_tokens.dtype, dtypes[i]);
        assert_int_equal(w.layers[c.num_hidden_layers - 1].down_proj.cols, c.intermediate_size);
        if (archs[i] == ARCH_QWEN2) {
            assert_non_null(w.layers[0].q_bias.data);
            assert_int_equal(c.num_key_value_heads, 1);
            assert_ptr_equal(w.lm_head.data, w.embed_tokens.data);
            assert_true(c.rope_theta == 1000000.0);
        }
        if (archs[i] == ARCH_LLAMA) {
            assert_int_equal(c.rope_type, ROPE_LLAMA3);
            assert_true(c.rope_factor == 8.0 && c.rope_high_freq_factor == 4.0);
            assert_int_equal(c.rope_original_max_position, 64);
        }
        if (archs[i] == ARCH_QWEN3) assert_non_null(w.layers[0].k_norm.data);
        weights_free(&w);
    }
    if (!found) skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_qwen3_untied, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tied, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_biases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bind_ownership, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mkmodel_presets, setup, teardown),
        cmocka_unit_test(test_golden_fixtures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
