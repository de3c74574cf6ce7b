/* main.c: the cvllm command: dispatches to a subcommand (src/cli/cmd_*.c). */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cvllm.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} COMMANDS[] = {
    {"complete", cmd_complete, "generate completions for prompts (ids or text)"},
    {"chat", cmd_chat, "interactive chat with the model's chat template"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (completions, chat, streaming, metrics)"},
    {"bench", cmd_bench, "benchmarks: bench throughput MODEL_DIR, bench serve --base-url URL"},
    {"mkmodel", cmd_mkmodel, "write a seeded random-weight model folder"},
    {"tokenize", cmd_tokenize, "text -> token ids"},
    {"detokenize", cmd_detokenize, "token ids -> text"},
    {"template", cmd_template, "render the chat template for messages"},
    {"worker", cmd_worker, "a tensor-parallel rank on another host (--connect HOST:PORT --rank R)"},
};

static void usage(FILE *f) {
    fprintf(f, "cvllm %s: a vLLM-style LLM inference engine in C\n\nusage: cvllm COMMAND [ARGS]\n\n",
            cvllm_version());
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(f, "  %-11s %s\n", COMMANDS[i].name, COMMANDS[i].help);
    fprintf(f, "\n  cvllm --version    version and compiled backends\n"
               "  cvllm COMMAND --help for a command's options\n");
}

int main(int argc, char **argv) {
    int wrc = cvllm_worker_main(); /* a tensor-parallel rank started by an engine: runs it */
    if (wrc >= 0) return wrc;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("cvllm %s (backends: %s)\n%s\n", cvllm_version(), cvllm_backends(),
               cvllm_backends_report());
        return 0;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(argv[1], COMMANDS[i].name)) return COMMANDS[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "cvllm: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
