/* cmd_mkmodel.c: placeholder until the command lands. */
#include <stdio.h>
#include "cli/commands.h"
int cmd_mkmodel(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "cvllm mkmodel: not implemented yet\n");
    return 1;
}
