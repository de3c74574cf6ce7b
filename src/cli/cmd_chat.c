/* cmd_chat.c: placeholder until the command lands. */
#include <stdio.h>
#include "cli/commands.h"
int cmd_chat(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "cvllm chat: not implemented yet\n");
    return 1;
}
