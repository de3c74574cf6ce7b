/* cmd_complete.c: placeholder until the command lands. */
#include <stdio.h>
#include "cli/commands.h"
int cmd_complete(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "cvllm complete: not implemented yet\n");
    return 1;
}
