/* cmd_worker.c: `cvllm worker`, one tensor-parallel rank started by hand (on another host): it
 * joins the group of an engine started with --tensor-parallel-size N --tp-addr HOST:PORT
 * --tp-local-ranks K, loads its share of the model and runs until that engine ends.
 *
 *   cvllm worker --connect HOST:PORT --rank R [--device-id D] [--model DIR] [--timeout S]
 * Exit codes: 0 the engine ended the group, 1 runtime error (rank 0 gone, GPU, model), 2 usage. */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cli/commands.h"
#include "cvllm.h"

static void worker_usage(FILE *f) {
    fprintf(f, "usage: cvllm worker --connect HOST:PORT --rank R [--device-id D] [--model DIR]\n"
               "                    [--timeout S]\n"
               "  --connect HOST:PORT  the address rank 0 listens on (its --tp-addr)\n"
               "  --rank R             this process's rank, 1 .. tensor-parallel size - 1\n"
               "  --device-id D        the GPU of this host to use (default 0)\n"
               "  --model DIR          the model folder here (default: the path rank 0 uses)\n"
               "  --timeout S          seconds to keep trying to reach rank 0 (default 120)\n"
               "Start one per GPU of this host; ranks 0 .. K-1 are the engine's own host's.\n");
}

int cmd_worker(int argc, char **argv) {
    const char *addr = NULL, *model = NULL, *v;
    long long rank = -1, dev = 0, timeout = 120;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            worker_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--connect")) {
            if (!(addr = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--model")) {
            if (!(model = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--rank")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 1, 63, &rank) < 0) return 2;
        } else if (!strcmp(a, "--timeout")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 1, 86400, &timeout) < 0) return 2;
        } else if (!strcmp(a, "--device-id")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_int(a, v, 0, 1023, &dev) < 0) return 2;
        } else {
            fprintf(stderr, "cvllm worker: unknown option '%s'\n", a);
            worker_usage(stderr);
            return 2;
        }
    }
    if (!addr || rank < 1) {
        fprintf(stderr, "cvllm worker: --connect and --rank are required\n");
        worker_usage(stderr);
        return 2;
    }
    const char *colon = strrchr(addr, ':');
    if (!colon || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1)) {
        fprintf(stderr, "cvllm worker: --connect: expected HOST:PORT, got '%s'\n", addr);
        return 2;
    }
    return cvllm_worker_run(addr, (int)rank, (int)dev, model, (double)timeout);
}
