/* cmd_mkmodel.c: `cvllm mkmodel --preset NAME --seed N [--tokenizer DIR] [--dtype D] OUT_DIR`
 * writes a Hugging Face-layout model folder with seeded random weights: config.json (as
 * transformers 5.x writes it, plus the 4.x rope fields), generation_config.json,
 * model.safetensors and the tokenizer files copied from --tokenizer.
 *
 * Weights: each tensor has its own splitmix64 stream seeded from (seed, tensor name), so the
 * bytes do not depend on chunking. Matrices ~ N(0, 1/fan_in) (Irwin-Hall approximation: the
 * sum of four 16-bit uniforms), which is 0.02-ish at Hugging Face sizes and keeps q.k scores,
 * MLP activations and logits O(1) at every size; norm weights 1 + N(0, 0.05) (non-unit so a
 * missed norm weight shows); biases N(0, 0.05). The file is written in chunks, so the
 * 1.2 GB qwen3-0.6b preset needs a few MB of memory. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/safetensors.h"

typedef ModelPreset Preset; /* the one table: src/model/presets.c */

static const char *TORCH_DTYPES[] = {"float32", "float16", "bfloat16"};

/* ---- random numbers --------------------------------------------------------------------------- */

static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ~N(0, 1): Irwin-Hall sum of four 16-bit uniforms, centered and scaled to unit variance. */
static inline float normalish(uint64_t *s) {
    uint64_t r = splitmix64(s);
    uint32_t sum = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) +
                   (uint32_t)((r >> 32) & 0xffff) + (uint32_t)(r >> 48);
    /* each (u + 0.5) / 65536 ~ U(0,1); sum of 4 has mean 2 and variance 1/3 */
    return ((float)sum + 2.0f) * (1.0f / 65536.0f) * 1.7320508f - 2.0f * 1.7320508f;
}

static uint64_t name_hash(const char *s) { /* FNV-1a */
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* ---- the tensor list ------------------------------------------------------------------------- */

typedef enum { INIT_MATRIX, INIT_NORM, INIT_BIAS } InitKind;

typedef struct {
    StTensor spec; /* name, dtype, shape */
    InitKind init;
} Spec;

typedef struct {
    Spec *v;
    int n, cap;
} SpecList;

static void add(SpecList *l, DType dt, InitKind init, int64_t rows, int64_t cols, const char *fmt,
                int layer) {
    char name[128];
    snprintf(name, sizeof name, fmt, layer);
    Spec s = {{.name = xstrdup(name), .dtype = dt, .ndim = rows < 0 ? 1 : 2}, init};
    if (rows < 0) s.spec.shape[0] = cols;
    else s.spec.shape[0] = rows, s.spec.shape[1] = cols;
    DA_PUSH(l->v, l->n, l->cap, s);
}

/* Same names, order and shapes as a transformers state_dict of the model. */
static void build_specs(const Preset *p, DType dt, SpecList *l) {
    const int64_t H = p->hidden, I = p->inter, QD = (int64_t)p->heads * p->head_dim,
                  KD = (int64_t)p->kv_heads * p->head_dim, D = p->head_dim;
    int qk_norm = p->arch == ARCH_QWEN3, qkv_bias = p->arch == ARCH_QWEN2 || p->attention_bias,
        o_bias = p->arch != ARCH_QWEN2 && p->attention_bias;
    add(l, dt, INIT_MATRIX, p->vocab, H, "model.embed_tokens.weight", 0);
    for (int i = 0; i < p->layers; i++) {
        add(l, dt, INIT_NORM, -1, H, "model.layers.%d.input_layernorm.weight", i);
        add(l, dt, INIT_MATRIX, QD, H, "model.layers.%d.self_attn.q_proj.weight", i);
        if (qkv_bias) add(l, dt, INIT_BIAS, -1, QD, "model.layers.%d.self_attn.q_proj.bias", i);
        add(l, dt, INIT_MATRIX, KD, H, "model.layers.%d.self_attn.k_proj.weight", i);
        if (qkv_bias) add(l, dt, INIT_BIAS, -1, KD, "model.layers.%d.self_attn.k_proj.bias", i);
        add(l, dt, INIT_MATRIX, KD, H, "model.layers.%d.self_attn.v_proj.weight", i);
        if (qkv_bias) add(l, dt, INIT_BIAS, -1, KD, "model.layers.%d.self_attn.v_proj.bias", i);
        add(l, dt, INIT_MATRIX, H, QD, "model.layers.%d.self_attn.o_proj.weight", i);
        if (o_bias) add(l, dt, INIT_BIAS, -1, H, "model.layers.%d.self_attn.o_proj.bias", i);
        if (qk_norm) {
            add(l, dt, INIT_NORM, -1, D, "model.layers.%d.self_attn.q_norm.weight", i);
            add(l, dt, INIT_NORM, -1, D, "model.layers.%d.self_attn.k_norm.weight", i);
        }
        add(l, dt, INIT_NORM, -1, H, "model.layers.%d.post_attention_layernorm.weight", i);
        add(l, dt, INIT_MATRIX, I, H, "model.layers.%d.mlp.gate_proj.weight", i);
        add(l, dt, INIT_MATRIX, I, H, "model.layers.%d.mlp.up_proj.weight", i);
        add(l, dt, INIT_MATRIX, H, I, "model.layers.%d.mlp.down_proj.weight", i);
    }
    add(l, dt, INIT_NORM, -1, H, "model.norm.weight", 0);
    if (!p->tie) add(l, dt, INIT_MATRIX, p->vocab, H, "lm_head.weight", 0);
}

static int64_t numel(const StTensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* Generates one tensor's values in chunks and appends them to w. */
static int write_tensor(StWriter *w, const Spec *s, uint64_t seed, float *fbuf, void *obuf,
                        size_t chunk) {
    uint64_t st = splitmix64(&seed) ^ name_hash(s->spec.name);
    int64_t n = numel(&s->spec);
    float mean = 0, std;
    switch (s->init) {
    case INIT_MATRIX: std = 1.0f / sqrtf((float)s->spec.shape[s->spec.ndim - 1]); break;
    case INIT_NORM: mean = 1.0f, std = 0.05f; break;
    default: std = 0.05f; break;
    }
    for (int64_t done = 0; done < n;) {
        size_t m = (size_t)(n - done < (int64_t)chunk ? n - done : (int64_t)chunk);
        for (size_t i = 0; i < m; i++) fbuf[i] = mean + std * normalish(&st);
        const void *out = fbuf;
        if (s->spec.dtype == DTYPE_BF16) {
            uint16_t *o = obuf;
            for (size_t i = 0; i < m; i++) o[i] = f32_to_bf16(fbuf[i]);
            out = o;
        } else if (s->spec.dtype == DTYPE_F16) {
            uint16_t *o = obuf;
            for (size_t i = 0; i < m; i++) o[i] = f32_to_f16(fbuf[i]);
            out = o;
        }
        int rc = safetensors_writer_append(w, out, m * dtype_size(s->spec.dtype));
        if (rc < 0) return rc;
        done += (int64_t)m;
    }
    return 0;
}

/* ---- json files ------------------------------------------------------------------------------ */

static json_t *rope_dict(const Preset *p, int with_theta) {
    json_t *r = json_object();
    if (with_theta) json_object_set_new(r, "rope_theta", json_real(p->theta));
    if (p->rope == ROPE_LLAMA3) {
        json_object_set_new(r, "rope_type", json_string("llama3"));
        json_object_set_new(r, "factor", json_real(8.0));
        json_object_set_new(r, "low_freq_factor", json_real(1.0));
        json_object_set_new(r, "high_freq_factor", json_real(4.0));
        json_object_set_new(r, "original_max_position_embeddings", json_integer(p->rope_original_max));
    } else {
        json_object_set_new(r, "rope_type", json_string("default"));
    }
    return r;
}

static json_t *config_json(const Preset *p, DType dt) {
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", model_arch_class(p->arch)));
    json_object_set_new(c, "model_type", json_string(model_arch_type(p->arch)));
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    json_object_set_new(c, "bos_token_id", json_integer(p->bos));
    json_object_set_new(c, "eos_token_id", json_integer(p->eos));
    json_object_set_new(c, "dtype", json_string(TORCH_DTYPES[dt]));
    json_object_set_new(c, "head_dim", json_integer(p->head_dim));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hidden_size", json_integer(p->hidden));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "intermediate_size", json_integer(p->inter));
    json_object_set_new(c, "max_position_embeddings", json_integer(p->max_pos));
    json_object_set_new(c, "num_attention_heads", json_integer(p->heads));
    json_object_set_new(c, "num_hidden_layers", json_integer(p->layers));
    json_object_set_new(c, "num_key_value_heads", json_integer(p->kv_heads));
    json_object_set_new(c, "rms_norm_eps", json_real(p->eps));
    /* 5.x reads rope_parameters; 4.x reads rope_theta and rope_scaling (written only when not
     * default: 4.x's default is null, and 5.x prefers a non-null rope_scaling when present). */
    json_object_set_new(c, "rope_parameters", rope_dict(p, 1));
    json_object_set_new(c, "rope_theta", json_real(p->theta));
    if (p->rope != ROPE_DEFAULT) json_object_set_new(c, "rope_scaling", rope_dict(p, 0));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(p->tie));
    json_object_set_new(c, "transformers_version", json_string("5.0.0"));
    json_object_set_new(c, "use_cache", json_true());
    json_object_set_new(c, "vocab_size", json_integer(p->vocab));
    if (p->arch == ARCH_LLAMA) {
        json_object_set_new(c, "attention_bias", json_boolean(p->attention_bias));
        json_object_set_new(c, "mlp_bias", json_false());
        json_object_set_new(c, "pretraining_tp", json_integer(1));
    } else {
        if (p->arch == ARCH_QWEN3)
            json_object_set_new(c, "attention_bias", json_boolean(p->attention_bias));
        json_t *lt = json_array();
        for (int i = 0; i < p->layers; i++) json_array_append_new(lt, json_string("full_attention"));
        json_object_set_new(c, "layer_types", lt);
        json_object_set_new(c, "max_window_layers", json_integer(p->layers));
        json_object_set_new(c, "sliding_window", json_null());
        json_object_set_new(c, "use_sliding_window", json_false());
    }
    return c;
}

static json_t *generation_json(const Preset *p) {
    json_t *g = json_object();
    json_object_set_new(g, "bos_token_id", json_integer(p->bos));
    if (p->n_gen_eos == 1) {
        json_object_set_new(g, "eos_token_id", json_integer(p->gen_eos[0]));
    } else {
        json_t *a = json_array();
        for (int i = 0; i < p->n_gen_eos; i++) json_array_append_new(a, json_integer(p->gen_eos[i]));
        json_object_set_new(g, "eos_token_id", a);
    }
    json_object_set_new(g, "transformers_version", json_string("5.0.0"));
    return g;
}

static int write_json(const char *dir, const char *name, json_t *j) {
    char *path = path_join(dir, name);
    /* sorted keys and 2-space indent, as transformers' to_json_file writes them */
    int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    json_decref(j);
    if (rc != 0) rc = cvllm_errorf(CVLLM_EIO, "cannot write %s: %s", path, strerror(errno));
    free(path);
    return rc;
}

/* ---- files ----------------------------------------------------------------------------------- */

static int copy_file(const char *src, const char *dst) {
    size_t len;
    char *buf = file_read(src, FILE_MAX_TOKENIZER, &len); /* regular files only */
    if (!buf) return CVLLM_EIO;
    FILE *f = fopen(dst, "wb");
    int rc = 0;
    if (!f || fwrite(buf, 1, len, f) != len) rc = cvllm_errorf(CVLLM_EIO, "cannot write %s", dst);
    if (f && fclose(f) != 0 && rc == 0) rc = cvllm_errorf(CVLLM_EIO, "cannot write %s", dst);
    free(buf);
    return rc;
}

static const char *TOKENIZER_FILES[] = {
    "tokenizer.json",   "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json",       "merges.txt",            "tokenizer.model",         "chat_template.jinja",
    "chat_template.json",
};
#define NUM_TOKENIZER_FILES (sizeof TOKENIZER_FILES / sizeof *TOKENIZER_FILES)

/* Before anything is written: DIR/tokenizer.json must be a readable regular file, and every other
 * tokenizer file present a regular file too. */
static int check_tokenizer(const char *from) {
    for (size_t i = 0; i < NUM_TOKENIZER_FILES; i++) {
        char *src = path_join(from, TOKENIZER_FILES[i]);
        int have = i == 0 ? 1 : path_probe(src), fd = -1;
        if (have > 0) fd = file_open_regular(src, FILE_MAX_TOKENIZER, NULL);
        free(src);
        if (have < 0 || (have > 0 && fd < 0)) return cvllm_error_wrap(CVLLM_EIO, "--tokenizer");
        if (have > 0) close(fd);
    }
    return 0;
}

/* Copies the tokenizer files present in `from`; appends their names to `copied`. */
static int copy_tokenizer(const char *from, const char *out_dir, char *copied, size_t cap) {
    for (size_t i = 0; i < NUM_TOKENIZER_FILES; i++) {
        char *src = path_join(from, TOKENIZER_FILES[i]), *dst = path_join(out_dir, TOKENIZER_FILES[i]);
        int rc = path_probe(src);
        if (rc > 0 && (rc = copy_file(src, dst)) == 0) {
            size_t k = strlen(copied);
            snprintf(copied + k, cap - k, " %s", TOKENIZER_FILES[i]);
        }
        free(src);
        free(dst);
        if (rc < 0) return rc;
    }
    return 0;
}

/* Removes the temporary folder and what make_model wrote in it (plain files only). */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = path_join(dir, e->d_name);
        unlink(p);
        free(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* Moves the finished model from tmp to out: one rename when out does not exist; file by file into
 * an existing folder (its other files are left alone, as before). */
static int commit(const char *tmp, const char *out, int out_exists) {
    if (!out_exists) {
        if (rename(tmp, out) != 0) return cvllm_errorf(CVLLM_EIO, "cannot create %s: %s", out, strerror(errno));
        return 0;
    }
    DIR *d = opendir(tmp);
    if (!d) return cvllm_errorf(CVLLM_EIO, "%s: %s", tmp, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *from = path_join(tmp, e->d_name), *to = path_join(out, e->d_name);
        if (rename(from, to) != 0) rc = cvllm_errorf(CVLLM_EIO, "cannot write %s: %s", to, strerror(errno));
        free(from);
        free(to);
    }
    closedir(d);
    if (rc == 0) rmdir(tmp);
    return rc;
}

/* out's parent folder must exist (nothing is created but out itself); out, if it exists, must be a
 * folder. Sets *out_exists and, in *tmp, a new hidden folder beside out to write into. */
static int prepare_output(const char *out, int *out_exists, char **tmp) {
    *tmp = NULL;
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;
    char *name = xmalloc(n + 1);
    memcpy(name, out, n);
    name[n] = '\0';
    char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    char *parent = slash ? (slash == name ? xstrdup("/") : strndup(name, (size_t)(slash - name))) : xstrdup(".");
    struct stat sb;
    int rc = path_probe(parent);
    if (rc < 0) {
        cvllm_error_wrap(rc, "cannot create %s", out);
    } else if (rc == 0) {
        rc = cvllm_errorf(CVLLM_EIO, "cannot create %s: its parent folder %s does not exist", out, parent);
    } else if ((rc = 0, stat(parent, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        rc = cvllm_errorf(CVLLM_EIO, "cannot create %s: %s is not a folder", out, parent);
    } else if ((*out_exists = path_probe(out)) < 0) {
        rc = CVLLM_EIO;
    } else if (*out_exists && (stat(out, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        rc = cvllm_errorf(CVLLM_EIO, "%s exists and is not a folder", out);
    } else {
        char *t = xmalloc(strlen(parent) + strlen(base) + 32);
        sprintf(t, "%s/.%s.tmp-XXXXXX", parent, base);
        if (!mkdtemp(t)) {
            rc = cvllm_errorf(CVLLM_EIO, "cannot create a folder in %s: %s", parent, strerror(errno));
            free(t);
        } else {
            mode_t mask = umask(0); /* mkdtemp makes it 0700: give it the mode mkdir would */
            umask(mask);
            chmod(t, 0755 & ~mask);
            *tmp = t;
        }
    }
    free(name);
    free(parent);
    return rc;
}

/* ---- the command ----------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f, "usage: cvllm mkmodel --preset NAME [--seed N] [--tokenizer DIR] "
               "[--dtype bf16|f16|f32] OUT_DIR\n\n"
               "Writes a Hugging Face model folder with seeded random weights.\n\npresets:\n");
    int np;
    const ModelPreset *presets = model_presets(&np);
    for (int i = 0; i < np; i++) fprintf(f, "  %-11s %s\n", presets[i].name, presets[i].what);
}

/* Writes the model into dir (a new, empty folder); describes it in summary. */
static int make_model(const Preset *p, DType dt, uint64_t seed, const char *tok, const char *dir,
                      char *summary, size_t cap) {
    int rc;
    if ((rc = write_json(dir, "config.json", config_json(p, dt))) < 0) return rc;
    if ((rc = write_json(dir, "generation_config.json", generation_json(p))) < 0) return rc;

    SpecList l = {0};
    build_specs(p, dt, &l);
    StTensor *specs = xmalloc((size_t)l.n * sizeof *specs);
    int64_t params = 0;
    for (int i = 0; i < l.n; i++) {
        specs[i] = l.v[i].spec;
        params += numel(&specs[i]);
    }
    char *path = path_join(dir, "model.safetensors");
    StWriter *w = NULL;
    const size_t chunk = 1 << 18;
    float *fbuf = xmalloc(chunk * sizeof *fbuf);
    uint16_t *obuf = xmalloc(chunk * sizeof *obuf);
    double t0 = now_seconds();
    rc = safetensors_writer_begin(path, specs, l.n, &w);
    for (int i = 0; i < l.n && rc == 0; i++) rc = write_tensor(w, &l.v[i], seed, fbuf, obuf, chunk);
    if (w) {
        int rc2 = safetensors_writer_finish(w);
        if (rc == 0) rc = rc2;
    }
    struct stat sb;
    if (rc == 0 && stat(path, &sb) == 0)
        snprintf(summary, cap,
                 "  model.safetensors: %d tensors, %lld parameters, %lld bytes (%s) in %.1f s\n"
                 "  config.json, generation_config.json\n",
                 l.n, (long long)params, (long long)sb.st_size, dtype_name(dt), now_seconds() - t0);
    free(fbuf);
    free(obuf);
    free(path);
    free(specs);
    for (int i = 0; i < l.n; i++) free(l.v[i].spec.name);
    free(l.v);
    if (rc == 0 && tok) {
        char copied[512] = "";
        rc = copy_tokenizer(tok, dir, copied, sizeof copied);
        size_t k = strlen(summary);
        if (rc == 0) snprintf(summary + k, cap - k, "  tokenizer:%s\n", copied);
    }
    return rc;
}

/* Checks the tokenizer and the output folder first, writes everything into a temporary folder
 * beside OUT_DIR and moves it into place at the end: a failure leaves nothing behind. */
static int make_model_folder(const Preset *p, DType dt, uint64_t seed, const char *tok, const char *out) {
    int out_exists = 0, rc = tok ? check_tokenizer(tok) : 0;
    char *tmp = NULL, summary[1024] = "";
    if (rc == 0) rc = prepare_output(out, &out_exists, &tmp);
    if (rc == 0) rc = make_model(p, dt, seed, tok, tmp, summary, sizeof summary);
    if (rc == 0) rc = commit(tmp, out, out_exists);
    if (tmp && (rc < 0 || out_exists)) remove_tree(tmp); /* on success: already renamed or emptied */
    free(tmp);
    if (rc == 0)
        printf("wrote %s (preset %s, %s, seed %llu)\n%s", out, p->name, model_arch_class(p->arch),
               (unsigned long long)seed, summary);
    return rc;
}

int cmd_mkmodel(int argc, char **argv) {
    const char *preset = NULL, *tok = NULL, *dtype = NULL, *out = NULL;
    uint64_t seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--preset") && has_val) {
            preset = argv[++i];
        } else if (!strcmp(a, "--tokenizer") && has_val) {
            tok = argv[++i];
        } else if (!strcmp(a, "--dtype") && has_val) {
            dtype = argv[++i];
        } else if (!strcmp(a, "--seed") && has_val) {
            long long v;
            if (cli_int(a, argv[++i], 0, INT64_MAX, &v) < 0) return 2; /* plain decimals only */
            seed = (uint64_t)v;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "cvllm mkmodel: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!out) {
            out = a;
        } else {
            fprintf(stderr, "cvllm mkmodel: one OUT_DIR only ('%s' and '%s')\n", out, a);
            return 2;
        }
    }
    if (!preset || !out) {
        fprintf(stderr, "cvllm mkmodel: %s is required\n", !preset ? "--preset" : "OUT_DIR");
        usage(stderr);
        return 2;
    }
    const Preset *p = model_preset_find(preset);
    if (!p) {
        fprintf(stderr, "cvllm mkmodel: unknown preset '%s'\n", preset);
        usage(stderr);
        return 2;
    }
    DType dt = p->dtype;
    if (dtype) {
        if (!strcmp(dtype, "bf16") || !strcmp(dtype, "bfloat16")) dt = DTYPE_BF16;
        else if (!strcmp(dtype, "f16") || !strcmp(dtype, "float16")) dt = DTYPE_F16;
        else if (!strcmp(dtype, "f32") || !strcmp(dtype, "float32")) dt = DTYPE_F32;
        else {
            fprintf(stderr, "cvllm mkmodel: --dtype must be bf16, f16 or f32, got '%s'\n", dtype);
            return 2;
        }
    }
    int rc = make_model_folder(p, dt, seed, tok, out);
    if (rc < 0) {
        fprintf(stderr, "cvllm mkmodel: %s\n", cvllm_last_error());
        return 1;
    }
    return 0;
}
