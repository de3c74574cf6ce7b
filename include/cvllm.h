/* cvllm.h: the public C API of cvllm, a vLLM-style LLM inference engine.
 *
 * One thread owns an engine and runs its steps; any thread may add and abort requests (a locked
 * inbox that each step drains). Each step reports, per request that changed, a step output: the
 * new token ids, the new text (when the engine has a tokenizer), log-probabilities when asked,
 * and the finish reason. A request is released once its final output has been delivered.
 *
 * Typical use, one thread:
 *   CvllmEngineOptions o; cvllm_engine_options_default(&o);
 *   CvllmEngine *e; if (cvllm_engine_create("path/to/model", &o, &e) < 0) puts(cvllm_last_error());
 *   CvllmSamplingParams p; cvllm_sampling_params_default(&p); p.max_tokens = 32;
 *   int64_t id = cvllm_engine_add_request(e, ids, n, &p);   // < 0: refused, see cvllm_last_error()
 *   while (cvllm_engine_has_unfinished(e)) {
 *       const CvllmRequestOutput *outs; int n;
 *       if (cvllm_engine_step(e, &outs, &n) < 0) break;
 *       for (int i = 0; i < n; i++) fwrite(outs[i].new_text, 1, outs[i].new_text_len, stdout);
 *   }
 *   cvllm_engine_destroy(e);
 *
 * A server: one thread calls cvllm_engine_run(e) (steps while there is work, sleeps when idle,
 * returns after cvllm_engine_shutdown); connection threads call cvllm_engine_submit with a
 * callback (called on the engine thread, once per step output of that request) and
 * cvllm_engine_abort_request.
 *
 * Functions that can fail because of their input return a negative CVLLM_E* code and set a
 * message readable with cvllm_last_error() (thread-local). */
#ifndef CVLLM_H
#define CVLLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    CVLLM_OK = 0,
    CVLLM_EINVAL = -1,       /* bad argument or request */
    CVLLM_EIO = -2,          /* file missing or unreadable */
    CVLLM_EFORMAT = -3,      /* file malformed (config, safetensors, tokenizer) */
    CVLLM_EUNSUPPORTED = -4, /* valid but not supported (architecture, rope_scaling, ...) */
    CVLLM_ENOMEM = -5,       /* a memory or KV-cache budget too small */
    CVLLM_EBACKEND = -6,     /* backend failure (device error, backend not compiled) */
    CVLLM_ESHUTDOWN = -7,    /* the engine is shutting down: no new requests */
};

/* The most log-probabilities a request may ask for per token (OpenAI's top_logprobs limit). */
#define CVLLM_MAX_LOGPROBS 20

/* The message of the last error on this thread ("" if none). */
const char *cvllm_last_error(void);
/* Version string, e.g. "0.1.0". */
const char *cvllm_version(void);
/* Comma-separated list of compiled backends, e.g. "cpu" or "cpu,cuda". */
const char *cvllm_backends(void);
/* One line per compiled backend: its name and whether it can run here, e.g.
 * "cuda: NVIDIA H200 (sm_90, 139.8 GiB)" or "cuda: no GPU found". Static storage. */
const char *cvllm_backends_report(void);

/* Tensor parallelism runs one process per GPU: the engine's process is rank 0 and starts the
 * others by running its own executable again with CVLLM_TP_WORKER set in the environment (the
 * rest of the environment inherited). A program that creates engines with tensor_parallel_size
 * > 1 therefore calls cvllm_worker_main() first thing in main: in such a process it runs the
 * worker and returns its exit code (>= 0), to be returned from main; elsewhere it returns -1 at
 * once. */
int cvllm_worker_main(void);
/* `cvllm worker`: joins as rank the group whose rank 0 listens at addr ("HOST:PORT"), trying for
 * up to timeout_s seconds, on GPU device_id, loading the model folder rank 0 names (model_dir
 * NULL) or model_dir. Returns an exit code (0 once rank 0 ends the group normally). */
int cvllm_worker_run(const char *addr, int rank, int device_id, const char *model_dir,
                     double timeout_s);

typedef enum { CVLLM_DEVICE_AUTO = 0, CVLLM_DEVICE_CPU, CVLLM_DEVICE_CUDA } CvllmDevice;
/* Element type of the KV cache. AUTO: f32 on the CPU (the reference: exact f32 attention), the
 * model's dtype on a GPU. FP8: e4m3 with per-tensor k/v scales of 1.0 (vLLM's fp8 / fp8_e4m3
 * without calibrated scales): a quarter of f32's bytes, half of bf16's; attention math stays f32. */
typedef enum {
    CVLLM_KV_DTYPE_AUTO = 0,
    CVLLM_KV_DTYPE_F32,
    CVLLM_KV_DTYPE_BF16,
    CVLLM_KV_DTYPE_FP8
} CvllmKvDtype;

typedef struct {
    CvllmDevice device;
    int max_model_len;          /* 0: the model's max_position_embeddings */
    int max_num_seqs;           /* sequences running at once (default 256) */
    int max_num_batched_tokens; /* tokens per step (default 16384); longer prompts are chunked */
    int block_size;             /* tokens per KV block, 16..256 (default 16) */
    int64_t kv_cache_memory;    /* bytes for the KV cache; 0: the backend's default (CPU: 2 GiB or
                                 * what fits; GPU: from gpu_memory_utilization) */
    CvllmKvDtype kv_cache_dtype;
    double gpu_memory_utilization; /* GPU: fraction of device memory to use; 0: default (0.9).
                                    * Refused by the CPU backend. */
    int enforce_eager;          /* GPU: no CUDA graphs */
    int enable_prefix_caching;  /* default 1 */
    int num_threads;            /* CPU threads; 0: all cores */
    int prefault_kv_cache;      /* 1: touch the whole KV cache at start-up, so that no step pays
                                 * first-touch page faults (CPU). `bench throughput` sets it. */
    int load_tokenizer;         /* 1 (default): load tokenizer.json from the model folder if it
                                 * is there, for text prompts, text outputs and stop strings */
    int verbose;                /* 1: print the start-up report on stderr (default 1) */
    int tensor_parallel_size;   /* GPUs the model is split over (default 1); > 1: one worker
                                 * process per extra GPU (see cvllm_worker_main) */
    const char *tp_addr;        /* tensor parallelism: rank 0 listens here, "HOST:PORT" (NULL:
                                 * 127.0.0.1, a free port); ranks on other hosts connect to it */
    int tp_local_ranks;         /* ranks started on this host, 0: all (the others are started by
                                 * hand: `cvllm worker --connect HOST:PORT --rank R`) */
    int async_scheduling;       /* 0 (default): on where the backend runs steps asynchronously
                                 * (CUDA, one GPU or several): the next step is scheduled and
                                 * submitted while the device runs this one, and a request that
                                 * stops at EOS or a stop id or string has one more token computed
                                 * and dropped; 1: on (a backend without it computes each step at
                                 * once); -1: off. Steps of requests with penalties and logits mode
                                 * always run one at a time. */
} CvllmEngineOptions;

typedef struct {
    float temperature;        /* 0: greedy (default 1.0) */
    float top_p;              /* (0,1], default 1 */
    int top_k;                /* 0 or -1: off */
    float min_p;              /* 0: off */
    float presence_penalty;   /* [-2, 2], 0: off; on generated tokens (as vLLM) */
    float frequency_penalty;  /* [-2, 2], 0: off; on generated tokens */
    float repetition_penalty; /* > 0, 1: off; on prompt and generated tokens */
    int64_t seed;             /* -1: from the engine's generator; otherwise the request's ids
                               * depend only on the seed, neither on the batch nor the device */
    int max_tokens;           /* default 16 */
    int ignore_eos;           /* 1: do not stop at EOS ids */
    const int32_t *stop_token_ids; /* copied by add_request */
    int num_stop_token_ids;
    const char *const *stop;  /* stop strings (valid UTF-8; need a tokenizer), copied */
    int num_stop;
    int include_stop_str_in_output; /* keep the matched stop string in the text */
    int logprobs;             /* -1: none (default); k in 0..CVLLM_MAX_LOGPROBS: each token's
                               * log-probability under the model (raw logits) and the top k */
    int skip_special_tokens;  /* text without special tokens (default 1) */
} CvllmSamplingParams;

typedef enum {
    CVLLM_FINISH_NONE = 0, /* still running */
    CVLLM_FINISH_STOP,     /* EOS, a stop token id or a stop string */
    CVLLM_FINISH_LENGTH,   /* max_tokens or max_model_len reached */
    CVLLM_FINISH_ABORT,    /* aborted by the caller */
    CVLLM_FINISH_ERROR,    /* the engine could not run it: see CvllmRequestOutput.error */
} CvllmFinishReason;
/* "stop", "length", "abort", "error", or NULL for NONE. */
const char *cvllm_finish_reason_name(CvllmFinishReason r);

/* What one step changed for one request. Every pointer is borrowed: valid until the next
 * cvllm_engine_step (or, in a callback, until the callback returns). */
typedef struct {
    int64_t request_id;
    void *user;                       /* CvllmRequest.user */
    const int32_t *prompt_token_ids;  /* [num_prompt_tokens] */
    int num_prompt_tokens;
    int num_cached_tokens;            /* prompt tokens served from the prefix cache */
    const int32_t *token_ids;         /* [num_tokens]: every generated id so far */
    int num_tokens;
    int num_new_tokens;               /* the last num_new_tokens of token_ids are new */
    /* Text (NULL without a tokenizer): released text never splits a UTF-8 character and never
     * shows text that may still turn out to start a stop string. */
    const char *text;                 /* all the text released so far (NUL-terminated) */
    size_t text_len;
    const char *new_text;             /* = text + text_len - new_text_len */
    size_t new_text_len;
    /* logprobs >= 0 only: [num_tokens] and [num_tokens][num_top_logprobs] (best first) */
    const float *logprobs;
    const int32_t *top_logprob_ids;
    const float *top_logprobs;
    int num_top_logprobs;
    CvllmFinishReason finish_reason;  /* NONE while running; set on the request's last output */
    const char *stop_reason;          /* the matched stop string, or NULL */
    int32_t stop_token_id;            /* the EOS / stop id that finished it, or -1 */
    const char *error;                /* FINISH_ERROR: the reason; otherwise NULL */
} CvllmRequestOutput;

typedef void (*CvllmOutputFn)(void *user, const CvllmRequestOutput *out);

/* A request for cvllm_engine_submit. */
typedef struct {
    const int32_t *prompt_token_ids; /* the prompt as ids (copied), or NULL: */
    int num_prompt_tokens;
    const char *prompt;              /* the prompt as text (needs the tokenizer; no special tokens
                                      * are added) */
    size_t prompt_len;
    CvllmSamplingParams params;
    CvllmOutputFn on_output;         /* NULL, or called on the engine thread inside each step
                                      * that has an output for this request; it must not call the
                                      * engine, except cvllm_engine_abort_request */
    void *user;
} CvllmRequest;

typedef struct {
    int num_running, num_waiting;
    int num_kv_blocks, kv_blocks_used, kv_blocks_free, peak_kv_blocks_used;
    int kv_blocks_cached;         /* free blocks that still hold a findable prefix */
    int64_t prefix_cache_queries; /* prompt tokens looked up in the prefix cache */
    int64_t prefix_cache_hits;    /* of which found */
    int64_t num_preemptions;
    int64_t prompt_tokens_computed, generated_tokens;
    int64_t num_steps;
    int64_t requests_added, requests_finished;
} CvllmStats;

typedef struct CvllmEngine CvllmEngine;

void cvllm_engine_options_default(CvllmEngineOptions *o);
void cvllm_sampling_params_default(CvllmSamplingParams *p);

/* Loads the Hugging Face model folder and allocates the KV cache. On error returns < 0, *out NULL. */
int cvllm_engine_create(const char *model_dir, const CvllmEngineOptions *o, CvllmEngine **out);
void cvllm_engine_destroy(CvllmEngine *e); /* accepts NULL; the engine must not be running */

/* Queues a request (any thread). Everything that can be wrong with it is checked now: returns
 * its id (>= 0) or a negative code with the reason in cvllm_last_error(), and nothing queued. */
int64_t cvllm_engine_submit(CvllmEngine *e, const CvllmRequest *r);
/* cvllm_engine_submit of a prompt of ids, no callback. */
int64_t cvllm_engine_add_request(CvllmEngine *e, const int32_t *prompt, int n,
                                 const CvllmSamplingParams *p);
/* Aborts a queued or running request (any thread): its last output, at the next step, has
 * CVLLM_FINISH_ABORT and its KV blocks are freed. Unknown or finished ids are ignored. */
int cvllm_engine_abort_request(CvllmEngine *e, int64_t request_id);

/* Engine thread. Drains the inbox, runs one scheduler step (a prefill or a decode batch) and
 * returns the number of tokens generated (>= 0) or a negative code (the backend failed: the
 * step's requests finish with CVLLM_FINISH_ERROR). *outs (may be NULL) receives the step's
 * outputs, one per request that changed, valid until the next step. */
int cvllm_engine_step(CvllmEngine *e, const CvllmRequestOutput **outs, int *num_outs);
/* Engine thread: requests queued, waiting or running (the inbox included). */
int cvllm_engine_has_unfinished(CvllmEngine *e);
/* Engine thread: steps while there is work, sleeps while there is none, until
 * cvllm_engine_shutdown. Returns 0, or a negative code if a step failed. */
int cvllm_engine_run(CvllmEngine *e);
/* Any thread: new submissions are refused (CVLLM_ESHUTDOWN); cvllm_engine_run returns once the
 * requests in flight have finished (drain = 1) or at once, after aborting them (drain = 0). */
void cvllm_engine_shutdown(CvllmEngine *e, int drain);

/* Blocking batch generation on the calling thread (which must own the engine): adds all
 * requests, steps until done, fills outs[i] in submission order. A refused request gets
 * outs[i].request_id < 0 and outs[i].error set; the others still run. Returns 0 or a negative
 * code if the engine itself failed. */
typedef struct {
    int64_t request_id;
    int32_t *prompt_token_ids; /* owned */
    int num_prompt_tokens;
    int32_t *token_ids;        /* owned */
    int num_tokens;
    char *text;                /* owned; NULL without a tokenizer */
    size_t text_len;
    CvllmFinishReason finish_reason;
    int num_cached_tokens;
    char *error;               /* owned; refused or failed */
} CvllmOutput;
int cvllm_generate(CvllmEngine *e, int n, const int32_t *const *prompts, const int *lens,
                   const CvllmSamplingParams *params, CvllmOutput *outs);
void cvllm_output_free(CvllmOutput *o);

/* Any thread: counters as of the last step. */
void cvllm_engine_get_stats(CvllmEngine *e, CvllmStats *s);
/* Any thread: the KV block pool as of the last step, for a live view: owner[b] = the request id
 * holding block b (the oldest, if shared), -1 free, -2 free but holding a cached prefix.
 * Fills at most n entries; returns the number of blocks. */
int cvllm_engine_block_owners(CvllmEngine *e, int64_t *owner, int n);

/* Model facts (any thread). */
int cvllm_engine_vocab_size(const CvllmEngine *e);
int cvllm_engine_max_model_len(const CvllmEngine *e);
int cvllm_engine_block_size(const CvllmEngine *e);
const char *cvllm_engine_device_name(const CvllmEngine *e);
/* The tokenizer loaded with the model (NULL if none): a `const struct Tokenizer *` for the
 * tokenizer API in src/tokenizer/tokenizer.h. */
const void *cvllm_engine_tokenizer(const CvllmEngine *e);

#ifdef __cplusplus
}
#endif
#endif
