/* cli_util.c: shared option parsing and input-file reading for the cvllm commands. */
#include "cli/cli_util.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

const char CLI_ENGINE_OPTIONS_HELP[] =
    "engine options:\n"
    "  --device auto|cpu|cuda         backend (default auto: cuda if compiled and present)\n"
    "  --max-model-len N              longest sequence (default: the model's, lowered to fit the KV cache)\n"
    "  --max-num-seqs N               sequences running at once (default 256)\n"
    "  --max-num-batched-tokens N     tokens per step; longer prompts are chunked (default 16384)\n"
    "  --block-size N                 tokens per KV block: 16, 32, 64, 128 or 256 (default 16)\n"
    "  --kv-cache-memory BYTES        KV cache budget, e.g. 2G, 512M (CPU default 2G)\n"
    "  --kv-cache-dtype auto|float32|bfloat16|fp8  KV cache elements (auto: float32 on the CPU;\n"
    "                                 fp8 = fp8_e4m3, scales 1.0)\n"
    "  --gpu-memory-utilization F     GPU: fraction of device memory (default 0.9)\n"
    "  --enforce-eager                GPU: no CUDA graphs\n"
    "  --[no-]async-scheduling        schedule the next step while the device runs this one\n"
    "                                 (default: on for CUDA on one GPU)\n"
    "  --tensor-parallel-size N, -tp N  GPU: split the model over N GPUs, one process each (default 1)\n"
    "  --tp-addr HOST:PORT            tensor parallel: where rank 0 listens (default 127.0.0.1, any port)\n"
    "  --tp-local-ranks K             tensor parallel: ranks started on this host (default: all; the\n"
    "                                 others join with `cvllm worker --connect HOST:PORT --rank R`)\n"
    "  --no-enable-prefix-caching     turn automatic prefix caching off\n"
    "  --threads N                    CPU threads, at most the cores (default 0: all cores)\n"
    "  --quiet                        no start-up report on stderr\n";

int cli_each_line(const char *path, int allow_stdin, CliLineFn fn, void *arg) {
    FILE *f = stdin;
    if (!allow_stdin || strcmp(path, "-") != 0) {
        int fd = file_open_regular(path, FILE_MAX_DEFAULT, NULL);
        if (fd < 0) return CVLLM_EIO;
        if (!(f = fdopen(fd, "rb"))) {
            int rc = cvllm_errorf(CVLLM_EIO, "%s: %s", path, strerror(errno));
            close(fd);
            return rc;
        }
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int rc = 0;
    while (rc == 0 && (n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
        line[n] = '\0';
        if (n == 0) continue;
        rc = fn(arg, line, (size_t)n, lineno);
    }
    if (rc == 0 && ferror(f)) rc = cvllm_errorf(CVLLM_EIO, "%s: read error", path);
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

json_t *cli_jsonl_parse(const char *line, size_t len, long lineno) {
    char what[32];
    snprintf(what, sizeof what, "line %ld", lineno);
    return cvllm_json_parse(line, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, what);
}

int cli_parse_engine_option(int argc, char **argv, int *i, CvllmEngineOptions *o) {
    const char *a = argv[*i], *v;
    long long n;
    double f;
    if (!strcmp(a, "--no-enable-prefix-caching")) { o->enable_prefix_caching = 0; return 1; }
    if (!strcmp(a, "--enable-prefix-caching")) { o->enable_prefix_caching = 1; return 1; }
    if (!strcmp(a, "--quiet")) { o->verbose = 0; return 1; }
    if (!strcmp(a, "--enforce-eager")) { o->enforce_eager = 1; return 1; }
    if (!strcmp(a, "--async-scheduling")) { o->async_scheduling = 1; return 1; }
    if (!strcmp(a, "--no-async-scheduling")) { o->async_scheduling = -1; return 1; }
    if (!strcmp(a, "--device")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!strcmp(v, "auto")) o->device = CVLLM_DEVICE_AUTO;
        else if (!strcmp(v, "cpu")) o->device = CVLLM_DEVICE_CPU;
        else if (!strcmp(v, "cuda")) o->device = CVLLM_DEVICE_CUDA;
        else { fprintf(stderr, "cvllm: --device: expected auto, cpu or cuda, got '%s'\n", v); return -1; }
        return 1;
    }
    if (!strcmp(a, "--kv-cache-memory")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        int64_t b = parse_bytes(v);
        if (b <= 0) { fprintf(stderr, "cvllm: --kv-cache-memory: expected bytes like 2G, 512M or 1048576, got '%s'\n", v); return -1; }
        o->kv_cache_memory = b;
        return 1;
    }
    if (!strcmp(a, "--kv-cache-dtype")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!strcmp(v, "auto")) o->kv_cache_dtype = CVLLM_KV_DTYPE_AUTO;
        else if (!strcmp(v, "float32") || !strcmp(v, "f32")) o->kv_cache_dtype = CVLLM_KV_DTYPE_F32;
        else if (!strcmp(v, "bfloat16") || !strcmp(v, "bf16")) o->kv_cache_dtype = CVLLM_KV_DTYPE_BF16;
        else if (!strcmp(v, "fp8") || !strcmp(v, "fp8_e4m3")) o->kv_cache_dtype = CVLLM_KV_DTYPE_FP8;
        else { fprintf(stderr, "cvllm: --kv-cache-dtype: expected auto, float32, bfloat16 or fp8, got '%s'\n", v); return -1; }
        return 1;
    }
    if (!strcmp(a, "--gpu-memory-utilization")) {
        if (!(v = cli_value(argc, argv, i)) || cli_float(a, v, 0.01, 1.0, &f) < 0) return -1;
        o->gpu_memory_utilization = f;
        return 1;
    }
    if (!strcmp(a, "--block-size")) { /* what the engine takes: a power of two in 16..256 */
        static const char *const SIZES[] = {"16", "32", "64", "128", "256"};
        if (!(v = cli_value(argc, argv, i))) return -1;
        for (size_t k = 0; k < sizeof SIZES / sizeof *SIZES; k++)
            if (!strcmp(v, SIZES[k])) return o->block_size = atoi(v), 1;
        fprintf(stderr, "cvllm: --block-size: expected 16, 32, 64, 128 or 256, got '%s'\n", v);
        return -1;
    }
    if (!strcmp(a, "--threads")) { /* more threads than cores would only be slower (150x at 1000) */
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (cli_int(a, v, 0, cli_num_cores(), &n) < 0) {
            fprintf(stderr, "cvllm: --threads: this machine has %d cores (0: all of them)\n", cli_num_cores());
            return -1;
        }
        o->num_threads = (int)n;
        return 1;
    }
    if (!strcmp(a, "--tp-addr")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        const char *colon = strrchr(v, ':');
        if (!colon || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1)) {
            fprintf(stderr, "cvllm: --tp-addr: expected HOST:PORT, got '%s'\n", v);
            return -1;
        }
        o->tp_addr = v;
        return 1;
    }
    struct { const char *name; int *field; long long lo, hi; } ints[] = {
        {"--tensor-parallel-size", &o->tensor_parallel_size, 1, 64},
        {"-tp", &o->tensor_parallel_size, 1, 64},
        {"--tp-local-ranks", &o->tp_local_ranks, 1, 64},
        {"--max-model-len", &o->max_model_len, 1, INT32_MAX},
        {"--max-num-seqs", &o->max_num_seqs, 1, 1 << 20},
        {"--max-num-batched-tokens", &o->max_num_batched_tokens, 1, 1 << 24},
    };
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        if (strcmp(a, ints[k].name)) continue;
        if (!(v = cli_value(argc, argv, i)) || cli_int(a, v, ints[k].lo, ints[k].hi, &n) < 0) return -1;
        *ints[k].field = (int)n;
        return 1;
    }
    return 0;
}
