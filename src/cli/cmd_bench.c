/* cmd_bench.c: `cvllm bench throughput|tokenize|ops`. throughput reproduces nano-vllm's bench.py
 * by default (random.seed(0); 256 prompts of randint(100, 1024) ids in [0, 10000]; max_tokens
 * randint(100, 1024); temperature 0.6; ignore_eos) and times it as bench.py does: the wall time of
 * the whole generate call, after start-up and one warm-up request. */
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "bench/pyrandom.h"
#include "cli/cli_util.h"
#include "backend/backend.h"
#include "cli/commands.h"
#include "common.h"

static const char USAGE[] =
    "usage: cvllm bench throughput MODEL_DIR [options] [engine options]\n"
    "       cvllm bench tokenize MODEL_DIR [--file F] [--repeat N]\n"
    "       cvllm bench ops [options]      CPU kernels and memory bandwidth\n"
    "       cvllm bench serve --base-url URL [options]   load generator for an OpenAI server\n"
    "throughput options:\n"
    "  --num-seqs N (256)  --max-input-len N (1024)  --max-output-len N (1024)\n"
    "  --input-len N --output-len M   fixed lengths instead (as vLLM's benchmark)\n"
    "  --temperature F (0.6)  --output text|json\n";

static void progress(int done, int total, double t0, int64_t tokens) {
    int width = 40, filled = total ? done * width / total : width;
    double el = now_seconds() - t0;
    fprintf(stderr, "\r[");
    for (int i = 0; i < width; i++) fputc(i < filled ? '#' : ' ', stderr);
    fprintf(stderr, "] %d/%d  %.1f s  %.1f tok/s ", done, total, el, el > 0 ? tokens / el : 0.0);
}

static int bench_throughput(int argc, char **argv) {
    CvllmEngineOptions eo;
    cvllm_engine_options_default(&eo);
    /* timed after start-up: the KV cache's first-touch page faults belong to start-up, as the
     * allocation of a GPU's cache does (they were up to 10% of a 16-sequence run here) */
    eo.prefault_kv_cache = 1;
    const char *model_dir = NULL;
    long long num_seqs = 256, max_in = 1024, max_out = 1024, in_len = 0, out_len = 0;
    double temperature = 0.6;
    int json_out = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = cli_parse_engine_option(argc, argv, &i, &eo);
        if (r < 0) return 2;
        if (r > 0) continue;
        struct { const char *name; long long *dst; } ints[] = {
            {"--num-seqs", &num_seqs}, {"--max-input-len", &max_in}, {"--max-output-len", &max_out},
            {"--input-len", &in_len}, {"--output-len", &out_len}};
        int matched = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
            if (strcmp(a, ints[k].name)) continue;
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 1, 1 << 24, ints[k].dst) < 0) return 2;
            matched = 1;
        }
        if (matched) continue;
        if (!strcmp(a, "--temperature")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_float(a, v, 0, 1e6, &temperature) < 0) return 2;
        } else if (!strcmp(a, "--output")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (strcmp(v, "json") && strcmp(v, "text")) { fprintf(stderr, "cvllm bench: --output: text or json\n"); return 2; }
            json_out = !strcmp(v, "json");
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("%s\n%s", USAGE, CLI_ENGINE_OPTIONS_HELP);
            return 0;
        } else if (a[0] != '-' && !model_dir) {
            model_dir = a;
        } else {
            fprintf(stderr, "cvllm bench throughput: unknown argument '%s'\n\n%s", a, USAGE);
            return 2;
        }
    }
    if (!model_dir) { fprintf(stderr, "%s", USAGE); return 2; }
    if ((in_len > 0) != (out_len > 0)) {
        fprintf(stderr, "cvllm bench throughput: give both --input-len and --output-len\n");
        return 2;
    }
    if (max_in < 100 || max_out < 100) {
        fprintf(stderr, "cvllm bench throughput: --max-input-len and --max-output-len must be >= 100 "
                        "(bench.py draws lengths from [100, max])\n");
        return 2;
    }
    BenchWorkload w;
    if (in_len > 0) bench_workload_fixed(&w, (int)num_seqs, (int)in_len, (int)out_len);
    else bench_workload_nanovllm(&w, (int)num_seqs, (int)max_in, (int)max_out);

    CvllmEngine *e = NULL;
    if (cvllm_engine_create(model_dir, &eo, &e) < 0) {
        fprintf(stderr, "cvllm bench: %s\n", cvllm_last_error());
        bench_workload_free(&w);
        return 1;
    }
    int rc = 1;
    if (cvllm_engine_vocab_size(e) <= 10000) {
        fprintf(stderr, "cvllm bench: the workload draws token ids in [0, 10000] (as nano-vllm's "
                        "bench.py) but %s has a vocabulary of %d\n", model_dir, cvllm_engine_vocab_size(e));
        goto done;
    }
    /* Warm-up: one short request, as bench.py's llm.generate(["Benchmark: "], SamplingParams()). */
    {
        int32_t warm[4] = {1, 2, 3, 4};
        CvllmSamplingParams p;
        cvllm_sampling_params_default(&p);
        CvllmOutput out;
        const int32_t *pp = warm;
        int len = 4;
        if (cvllm_generate(e, 1, &pp, &len, &p, &out) < 0 || out.request_id < 0 || out.error) {
            fprintf(stderr, "cvllm bench: warm-up failed: %s\n", out.error ? out.error : cvllm_last_error());
            cvllm_output_free(&out);
            goto done;
        }
        cvllm_output_free(&out);
    }
    int64_t *ids = xmalloc((size_t)w.num_seqs * sizeof(int64_t));
    int show = isatty(2);
    double t0 = now_seconds();
    for (int i = 0; i < w.num_seqs; i++) {
        CvllmSamplingParams p;
        cvllm_sampling_params_default(&p);
        p.temperature = (float)temperature;
        p.ignore_eos = 1;
        p.max_tokens = w.max_tokens[i];
        ids[i] = cvllm_engine_add_request(e, w.prompts[i], w.prompt_lens[i], &p);
        if (ids[i] < 0) {
            fprintf(stderr, "cvllm bench: request %d refused: %s\n", i, cvllm_last_error());
            free(ids);
            goto done;
        }
    }
    int64_t out_tokens = 0;
    int finished = 0;
    while (cvllm_engine_has_unfinished(e)) {
        int g = cvllm_engine_step(e, NULL, NULL);
        if (g < 0) {
            fprintf(stderr, "\ncvllm bench: %s\n", cvllm_last_error());
            free(ids);
            goto done;
        }
        out_tokens += g;
        if (show) {
            CvllmStats st;
            cvllm_engine_get_stats(e, &st);
            finished = w.num_seqs - st.num_running - st.num_waiting;
            progress(finished, w.num_seqs, t0, out_tokens);
        }
    }
    double elapsed = now_seconds() - t0;
    if (show) fputc('\n', stderr);
    free(ids);
    CvllmStats st;
    cvllm_engine_get_stats(e, &st);
    double out_tps = w.total_output_tokens / elapsed;
    double tot_tps = (w.total_prompt_tokens + w.total_output_tokens) / elapsed;
    if (json_out) {
        json_t *o = json_pack("{s:i,s:I,s:I,s:f,s:f,s:f,s:i,s:i,s:s}", "num_seqs", w.num_seqs,
                              "prompt_tokens", (json_int_t)w.total_prompt_tokens, "output_tokens",
                              (json_int_t)w.total_output_tokens, "elapsed_s", elapsed,
                              "output_tok_per_s", out_tps, "total_tok_per_s", tot_tps,
                              "peak_kv_blocks_used", st.peak_kv_blocks_used, "num_kv_blocks",
                              st.num_kv_blocks, "device", cvllm_engine_device_name(e));
        char *s = json_dumps(o, JSON_COMPACT);
        puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("Sequences: %d, prompt tokens: %lld, output tokens: %lld\n", w.num_seqs,
               (long long)w.total_prompt_tokens, (long long)w.total_output_tokens);
        printf("Time: %.2fs, Throughput: %.2f output tok/s, %.2f total tok/s\n", elapsed, out_tps, tot_tps);
        printf("Peak KV blocks used: %d of %d, preemptions: %lld, device: %s\n", st.peak_kv_blocks_used,
               st.num_kv_blocks, (long long)st.num_preemptions, cvllm_engine_device_name(e));
    }
    rc = 0;
done:
    cvllm_engine_destroy(e);
    bench_workload_free(&w);
    return rc;
}

/* `bench ops [--device NAME] ...`: the named backend's own op benchmarks (default cpu). */
static int bench_ops(int argc, char **argv) {
    const char *device = "cpu";
    char **rest = xcalloc((size_t)argc + 1, sizeof(char *));
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--device")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "cvllm bench ops: --device needs a value\n");
                free(rest);
                return 2;
            }
            device = argv[++i];
        } else {
            rest[n++] = argv[i];
        }
    }
    const BackendEntry *be = backend_find(device);
    int rc;
    if (!be || !be->bench_ops) {
        fprintf(stderr, "cvllm bench ops: no op benchmarks for device '%s' (compiled backends: %s)\n",
                device, cvllm_backends());
        rc = 2;
    } else {
        rc = be->bench_ops(n, rest);
    }
    free(rest);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fprintf(argc < 2 ? stderr : stdout, "%s", USAGE);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "throughput")) return bench_throughput(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tokenize")) return bench_tokenize(argc - 1, argv + 1);
    if (!strcmp(argv[1], "ops")) return bench_ops(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) return bench_serve(argc - 1, argv + 1);
    fprintf(stderr, "cvllm bench: unknown benchmark '%s'\n\n%s", argv[1], USAGE);
    return 2;
}
