/* cmd_tokenize.c: placeholder until the command lands. */
#include <stdio.h>
#include "cli/commands.h"
int cmd_tokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "not implemented\n"); return 1; }
int cmd_detokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "not implemented\n"); return 1; }
