/* cli_util.h: option parsing shared by the cvllm commands (vLLM's option names), and the readers of
 * the files the commands take (JSON-lines prompt files, JSON files).
 *
 * Rules every command follows: a bad option or value is a usage error (the message starts with
 * "cvllm: OPTION: ", exit code 2); numbers are plain decimals (no spaces, no '+', no hex); id lists
 * are decimal ids separated by single commas, nothing else ("1,2,3"); an engine option is refused
 * here whenever the engine would refuse its value, so that the same mistake always exits 2. */
#ifndef CVLLM_CLI_UTIL_H
#define CVLLM_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "args.h"
#include "cvllm.h"

/* If argv[*i] is an engine option (--device, --max-model-len, --max-num-seqs,
 * --max-num-batched-tokens, --block-size, --kv-cache-memory, --kv-cache-dtype, --no-enable-prefix-caching,
 * --enable-prefix-caching, --threads, --gpu-memory-utilization, --quiet), consumes it (and its
 * value) and returns 1; returns 0 if it is not one; returns -1 after printing an error (a usage
 * error: the caller exits 2). */
int cli_parse_engine_option(int argc, char **argv, int *i, CvllmEngineOptions *o);
/* Help text for those options. */
extern const char CLI_ENGINE_OPTIONS_HELP[];

/* Calls fn(arg, line, len, lineno) for each non-empty line of the file at path (its "\n" / "\r\n"
 * removed; the line may hold NUL bytes, len counts them; lineno from 1), stopping at the first
 * nonzero return, which it returns. path must be a regular file (never a directory or a FIFO:
 * see file_open_regular), or "-" for standard input when allow_stdin. Returns CVLLM_EIO with the
 * message set (starting with the path) when the file cannot be read. */
typedef int (*CliLineFn)(void *arg, const char *line, size_t len, long lineno);
int cli_each_line(const char *path, int allow_stdin, CliLineFn fn, void *arg);

/* Parses one line of a JSON-lines file as any JSON value (a key given twice is refused). Returns
 * NULL with the message set, "line N: ...": invalid JSON, a number out of range (named by its key),
 * or "line N: contains a NUL character" for a raw NUL byte and for a \u0000 escape alike (one rule
 * for every JSON-lines input). */
struct json_t *cli_jsonl_parse(const char *line, size_t len, long lineno);

#endif
