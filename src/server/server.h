/* server.h: `cvllm serve`: an OpenAI-compatible HTTP server over the engine's public API.
 *
 * Threads: the main thread loads the model, starts the engine thread (cvllm_engine_run) and the
 * HTTP layer (libmicrohttpd: one listening thread, one thread per connection), then waits for
 * SIGTERM / SIGINT. A connection thread parses and checks a request, renders the chat template,
 * tokenizes, submits one engine request per choice (cvllm_engine_submit, thread-safe) and waits
 * on its Job's condition variable; the engine thread's output callback copies each step's new
 * ids, text and log-probs into the Job and signals it. The connection thread formats the
 * response (or the SSE chunks) itself, so the engine thread never waits on a client. A client
 * that disconnects is noticed within 100 ms (its socket is polled while waiting) and its
 * requests are aborted, which frees their KV blocks at the next step. */
#ifndef CVLLM_SERVER_SERVER_H
#define CVLLM_SERVER_SERVER_H

#include <stddef.h>

#include "cvllm.h"

typedef struct {
    const char *model_dir;
    const char *host;              /* default 127.0.0.1 */
    int port;                      /* default 8000; 0: any free port (printed) */
    const char *api_key;           /* NULL: no key needed */
    const char *served_model_name; /* NULL: the model folder */
    int reasoning_parser;          /* 1: qwen3 (<think>...</think> -> reasoning_content) */
    int tool_parser;               /* 1: hermes (default), 0: none */
    size_t max_body_bytes;         /* 413 above (default 32 MiB) */
    int max_queue_len;             /* engine requests waiting beyond max_num_seqs; 503 above */
    int max_connections;
    double shutdown_timeout;       /* seconds to drain on SIGTERM before aborting (default 30) */
    const char *port_file;         /* if set, the bound port is written there once listening */
    CvllmEngineOptions engine;
} ServerOptions;

void server_options_default(ServerOptions *o);
/* Runs until SIGTERM or SIGINT; returns the exit code (0 after a clean shutdown). */
int server_main(const ServerOptions *o);

#endif
