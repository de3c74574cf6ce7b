/* cmd_template.c: placeholder until the command lands. */
#include <stdio.h>
#include "cli/commands.h"
int cmd_template(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "cvllm template: not implemented yet\n");
    return 1;
}
