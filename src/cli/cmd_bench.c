/* cmd_bench.c: placeholder until the command lands. */
#include <stdio.h>
#include "cli/commands.h"
int cmd_bench(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "cvllm bench: not implemented yet\n");
    return 1;
}
