/* commands.h: the cvllm subcommands. Each takes argc/argv after the command name
 * (argv[0] = command name) and returns the process exit code (0 ok, 1 runtime error, 2 usage). */
#ifndef CVLLM_CLI_COMMANDS_H
#define CVLLM_CLI_COMMANDS_H

int cmd_complete(int argc, char **argv);   /* cmd_complete.c */
int cmd_chat(int argc, char **argv);       /* cmd_chat.c */
int cmd_bench(int argc, char **argv);      /* cmd_bench.c */
int cmd_mkmodel(int argc, char **argv);    /* cmd_mkmodel.c */
int cmd_tokenize(int argc, char **argv);   /* cmd_tokenize.c */
int cmd_detokenize(int argc, char **argv); /* cmd_tokenize.c */
int cmd_template(int argc, char **argv);   /* cmd_template.c */
int cmd_serve(int argc, char **argv);      /* cmd_serve.c */
int cmd_worker(int argc, char **argv);     /* cmd_worker.c */

/* `cvllm bench` sub-benchmarks (argv[0] = the benchmark's name). */
int bench_tokenize(int argc, char **argv); /* bench_tokenize.c */
int bench_serve(int argc, char **argv);    /* bench_serve.c */

#endif
