/* cmd_serve.c: `cvllm serve MODEL_DIR`: the OpenAI-compatible server (src/server/). */
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common.h"
#include "server/server.h"

static const char USAGE[] =
    "usage: cvllm serve MODEL_DIR [options] [engine options]\n"
    "  --host ADDR (127.0.0.1)  --port N (8000; 0: any free port)\n"
    "  --api-key KEY                 require 'Authorization: Bearer KEY' on /v1/*\n"
    "  --served-model-name NAME      the model's name in the API (default: MODEL_DIR)\n"
    "  --reasoning-parser qwen3      <think>...</think> text -> reasoning_content\n"
    "  --tool-call-parser hermes|none  <tool_call>{...}</tool_call> -> tool_calls (default hermes)\n"
    "  --enable-auto-tool-choice     accepted for vLLM compatibility (tool_choice auto is on)\n"
    "  --max-body-bytes BYTES (32M)  larger request bodies get 413\n"
    "  --max-queue-len N (4096)      engine requests waiting beyond --max-num-seqs; more get 503\n"
    "  --max-connections N (4096)    --shutdown-timeout SECONDS (30)\n"
    "  --port-file PATH              write the bound port there once listening\n"
    "Endpoints: POST /v1/completions /v1/chat/completions /tokenize /detokenize;\n"
    "GET /v1/models /health /metrics /version, / (live view) and /live.json.\n"
    "SIGTERM or SIGINT: stop accepting, finish the requests in flight, exit 0.\n";

int cmd_serve(int argc, char **argv) {
    ServerOptions o;
    server_options_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long n;
        double f;
        int r = cli_parse_engine_option(argc, argv, &i, &o.engine);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("%s\n%s", USAGE, CLI_ENGINE_OPTIONS_HELP);
            return 0;
        } else if (!strcmp(a, "--host")) {
            if (!(o.host = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--port")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 0, 65535, &n) < 0) return 2;
            o.port = (int)n;
        } else if (!strcmp(a, "--api-key")) {
            if (!(o.api_key = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--served-model-name")) {
            if (!(o.served_model_name = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--reasoning-parser")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (strcmp(v, "qwen3")) { fprintf(stderr, "cvllm serve: --reasoning-parser: only qwen3\n"); return 2; }
            o.reasoning_parser = 1;
        } else if (!strcmp(a, "--tool-call-parser")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (strcmp(v, "hermes") && strcmp(v, "none")) { fprintf(stderr, "cvllm serve: --tool-call-parser: hermes or none\n"); return 2; }
            o.tool_parser = !strcmp(v, "hermes");
        } else if (!strcmp(a, "--enable-auto-tool-choice")) {
            /* vLLM needs it for tool_choice "auto"; here auto is always available */
        } else if (!strcmp(a, "--max-body-bytes")) {
            int64_t b;
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if ((b = parse_bytes(v)) < 1024) { fprintf(stderr, "cvllm serve: --max-body-bytes: at least 1k\n"); return 2; }
            o.max_body_bytes = (size_t)b;
        } else if (!strcmp(a, "--max-queue-len")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 0, 1 << 24, &n) < 0) return 2;
            o.max_queue_len = (int)n;
        } else if (!strcmp(a, "--max-connections")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 1, 1 << 20, &n) < 0) return 2;
            o.max_connections = (int)n;
        } else if (!strcmp(a, "--shutdown-timeout")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_float(a, v, 0, 1e6, &f) < 0) return 2;
            o.shutdown_timeout = f;
        } else if (!strcmp(a, "--port-file")) {
            if (!(o.port_file = cli_value(argc, argv, &i))) return 2;
        } else if (a[0] != '-' && !o.model_dir) {
            o.model_dir = a;
        } else {
            fprintf(stderr, "cvllm serve: unknown argument '%s'\n\n%s", a, USAGE);
            return 2;
        }
    }
    if (!o.model_dir) {
        fprintf(stderr, "%s", USAGE);
        return 2;
    }
    return server_main(&o);
}
