/* cvllm.h: the public C API of cvllm, a vLLM-style LLM inference engine.
 *
 * Typical use:
 *   CvllmEngineOptions o; cvllm_engine_options_default(&o);
 *   CvllmEngine *e; if (cvllm_engine_create("path/to/model", &o, &e) < 0) puts(cvllm_last_error());
 *   CvllmSamplingParams p; cvllm_sampling_params_default(&p); p.max_tokens = 32;
 *   int64_t id = cvllm_engine_add_request(e, ids, n, &p);   // < 0: refused, see cvllm_last_error()
 *   while (cvllm_engine_has_unfinished(e)) cvllm_engine_step(e);
 *   CvllmOutput out; cvllm_engine_take_output(e, id, &out); ... cvllm_output_free(&out);
 *   cvllm_engine_destroy(e);
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
    CVLLM_EINVAL = -1,     /* bad argument or request */
    CVLLM_EIO = -2,        /* file missing or unreadable */
    CVLLM_EFORMAT = -3,    /* file malformed (config, safetensors, tokenizer) */
    CVLLM_EUNSUPPORTED = -4, /* valid but not supported (architecture, rope_scaling, ...) */
    CVLLM_ENOMEM = -5,     /* a memory or KV-cache budget too small */
    CVLLM_EBACKEND = -6,   /* backend failure (device error, backend not compiled) */
};

/* The message of the last error on this thread ("" if none). */
const char *cvllm_last_error(void);
/* Version string, e.g. "0.1.0". */
const char *cvllm_version(void);
/* Comma-separated list of compiled backends, e.g. "cpu" or "cpu,cuda". */
const char *cvllm_backends(void);

typedef enum { CVLLM_DEVICE_AUTO = 0, CVLLM_DEVICE_CPU, CVLLM_DEVICE_CUDA } CvllmDevice;
/* Element type of the KV cache. AUTO: f32 on the CPU (the reference: exact f32 attention). */
typedef enum { CVLLM_KV_DTYPE_AUTO = 0, CVLLM_KV_DTYPE_F32, CVLLM_KV_DTYPE_BF16 } CvllmKvDtype;

typedef struct {
    CvllmDevice device;
    int max_model_len;          /* 0: the model's max_position_embeddings */
    int max_num_seqs;           /* sequences running at once (default 256) */
    int max_num_batched_tokens; /* tokens per step (default 16384); longer prompts are chunked */
    int block_size;             /* tokens per KV block, 16..256 (default 16 on CPU) */
    int64_t kv_cache_memory;    /* bytes for the KV cache; 0: default (CPU: 2 GiB or what fits) */
    CvllmKvDtype kv_cache_dtype; /* bf16 halves the cache's bytes; attention math stays f32 */
    double gpu_memory_utilization; /* CUDA: fraction of device memory to use (default 0.9) */
    int enable_prefix_caching;  /* default 1 */
    int num_threads;            /* CPU threads; 0: all cores */
    int prefault_kv_cache;      /* 1: touch the whole KV cache at start-up (CPU: zeroed by every
                                 * thread), so that no step pays first-touch page faults, as a
                                 * GPU's cache is allocated up front; costs start-up time (about
                                 * 0.1-0.3 s a GB). `bench throughput` sets it. Default 0. */
    int verbose;                /* 1: print the KV cache layout at start-up (default 1) */
} CvllmEngineOptions;

typedef struct {
    float temperature;      /* 0: greedy (default 1.0) */
    float top_p;            /* (0,1], default 1 */
    int top_k;              /* 0 or -1: off */
    float min_p;            /* 0: off */
    int64_t seed;           /* -1: from the engine's generator; otherwise reproducible per request */
    int max_tokens;         /* default 16 */
    int ignore_eos;         /* 1: do not stop at EOS ids */
    const int32_t *stop_token_ids; /* copied by add_request */
    int num_stop_token_ids;
} CvllmSamplingParams;

typedef enum {
    CVLLM_FINISH_NONE = 0, /* still running */
    CVLLM_FINISH_STOP,     /* EOS, a stop token id or a stop string */
    CVLLM_FINISH_LENGTH,   /* max_tokens or max_model_len reached */
    CVLLM_FINISH_ABORT,    /* aborted by the caller */
} CvllmFinishReason;

typedef struct {
    int64_t request_id;
    int32_t *prompt_token_ids; /* owned */
    int num_prompt_tokens;
    int32_t *token_ids;        /* generated ids, owned */
    int num_tokens;
    CvllmFinishReason finish_reason;
    int num_cached_tokens;     /* prompt tokens served from the prefix cache */
} CvllmOutput;

typedef struct {
    int num_running, num_waiting;
    int num_kv_blocks, kv_blocks_used, kv_blocks_free, peak_kv_blocks_used;
    int64_t prefix_cache_queries; /* full prompt blocks looked up */
    int64_t prefix_cache_hits;    /* of which found in the cache */
    int64_t num_preemptions;
    int64_t prompt_tokens_computed, generated_tokens;
} CvllmStats;

typedef struct CvllmEngine CvllmEngine;

void cvllm_engine_options_default(CvllmEngineOptions *o);
void cvllm_sampling_params_default(CvllmSamplingParams *p);

/* Loads the Hugging Face model folder and allocates the KV cache. On error returns < 0, *out NULL. */
int cvllm_engine_create(const char *model_dir, const CvllmEngineOptions *o, CvllmEngine **out);
void cvllm_engine_destroy(CvllmEngine *e); /* accepts NULL */

/* Queues a request; returns its id (>= 0) or a negative error code (nothing queued). */
int64_t cvllm_engine_add_request(CvllmEngine *e, const int32_t *prompt, int n,
                                 const CvllmSamplingParams *p);
/* Aborts a queued or running request (it finishes with CVLLM_FINISH_ABORT). */
int cvllm_engine_abort_request(CvllmEngine *e, int64_t request_id);
/* Runs one scheduler step (one prefill or one decode batch). Returns the number of tokens
 * generated in this step (>= 0) or a negative error code. */
int cvllm_engine_step(CvllmEngine *e);
int cvllm_engine_has_unfinished(const CvllmEngine *e);
/* Generated ids so far of a live or finished request (borrowed; valid until the next step). */
int cvllm_engine_peek(const CvllmEngine *e, int64_t request_id, const int32_t **ids, int *n,
                      CvllmFinishReason *finish);
/* Moves a finished request's output to *out (caller frees with cvllm_output_free).
 * Returns 1 if taken, 0 if not finished yet, < 0 if unknown. */
int cvllm_engine_take_output(CvllmEngine *e, int64_t request_id, CvllmOutput *out);
/* Marks a live request finished by the caller (e.g. a stop string matched in the text). */
int cvllm_engine_finish_request(CvllmEngine *e, int64_t request_id, CvllmFinishReason reason);
void cvllm_output_free(CvllmOutput *o);

/* Blocking batch generation: adds all requests, steps until done, fills outs[i] in submission
 * order. A refused request gets outs[i].request_id < 0 and errors[i] (malloc'd) set when errors
 * is not NULL. Returns 0 or a negative code if the engine itself failed. */
int cvllm_generate(CvllmEngine *e, int n, const int32_t *const *prompts, const int *lens,
                   const CvllmSamplingParams *params, CvllmOutput *outs, char **errors);

void cvllm_engine_get_stats(const CvllmEngine *e, CvllmStats *s);

/* Model facts the caller needs (vocab size, max_model_len, eos ids). */
int cvllm_engine_vocab_size(const CvllmEngine *e);
int cvllm_engine_max_model_len(const CvllmEngine *e);
const char *cvllm_engine_device_name(const CvllmEngine *e);

#ifdef __cplusplus
}
#endif
#endif
