/* backend.h: the one interface between the engine and the math. A backend owns its copy/view of
 * the weights, the KV cache and its activation workspace; the engine hands it flat per-step inputs
 * (built by the model runner, host arrays) with each sequence's sampling parameters, and gets back
 * the sampled token ids (and log-probabilities when asked): logits stay on the device. The engine
 * never includes a device header and never reaches a backend's internals; it finds backends
 * through the registry (backend.c). CPU and CUDA implement this same struct of function pointers.
 *
 * KV cache layout (one allocation): [2 (k,v), num_layers, num_blocks, block_size, kv_heads, head_dim]
 * where kv_heads is this backend's share (a tensor-parallel rank holds a part of the heads).
 * Physical slot of a token = block * block_size + offset.
 *
 * Contract of forward (the CUDA kernels read exactly these arrays; the CPU reference honours them
 * the same way, and tests/test_model_runner.c checks what the model runner builds):
 *  - tokens of sequence s: rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) of input_ids / positions;
 *  - sequence s attends over its first seqlen_k = cu_seqlens_k[s+1] - cu_seqlens_k[s] keys
 *    (= context_lens[s]), the last (cu_seqlens_q[s+1] - cu_seqlens_q[s]) of them being its new
 *    tokens, causally; every key is read from the cache through block_tables row s;
 *  - slot_mapping[t] >= 0: the K/V of token t is written there; -1: not written (its block is a
 *    prefix-cache hit, possibly shared, and already holds it or gets it in this same step);
 *  - within a layer, every K/V store of the step precedes every attention read of that layer (a
 *    sequence may read blocks that another sequence of the same step writes);
 *  - max_seqlen_q / max_seqlen_k bound the per-sequence lengths (kernels size grids by them);
 *  - one sampled id per logits row; sampling row i samples for token row logits_indices[i].
 *
 * Sampling semantics (every backend): logits -> penalties (repetition on prompt+output ids,
 * presence/frequency on output ids, as vLLM) -> temperature -> top-k -> top-p -> min-p ->
 * renormalize -> draw with the uniform u = cvllm_uniform(seed, output_index) (src/backend/philox.h:
 * Philox4x32-10, counter-based, so a request's draws depend neither on its batch nor the device).
 * With a temperature and no filter (top-k, top-p, min-p), the token is instead the winner of the
 * exponential race (the Gumbel-max trick, as vLLM and nano-vllm sample): the largest
 * x_i - T ln(-ln u_i) over the penalized logits x, u_i = cvllm_race_uniform(cvllm_race_key(seed,
 * output_index), i), lowest id on ties: the same distribution, in one pass over the row.
 * Temperature 0: argmax (lowest id on ties, NaN never wins). Log-probs: log_softmax of the raw
 * logits (before penalties and temperature), the sampled id's and the top k (best first, ties by
 * lower id). */
#ifndef CVLLM_BACKEND_H
#define CVLLM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"
#include "model/config.h"
#include "model/weights.h"

typedef struct {
    int num_blocks;
    int block_size;
    DType dtype;       /* element type of the cache (CPU: f32 or bf16; CUDA: bf16 or f16) */
    int prefault;      /* CPU: touch all of it now, not at each block's first use */
} KVCacheSpec;

/* One logits row's sampling parameters (see the semantics above). */
typedef struct {
    float temperature;        /* 0: greedy */
    float top_p;              /* 1: off */
    int top_k;                /* <= 0: off */
    float min_p;              /* 0: off */
    float presence_penalty, frequency_penalty; /* 0: off */
    float repetition_penalty; /* 1: off */
    uint64_t seed;            /* key of the uniforms */
    int num_logprobs;         /* -1: none; 0..CVLLM_MAX_LOGPROBS: sampled id's + top k */
    /* The sequence's ids so far (penalties only; host memory, valid during forward):
     * prompt_ids[num_prompt] then output_ids[num_output]; the id sampled now is output number
     * num_output (its uniform's counter). */
    const int32_t *prompt_ids;
    int num_prompt;
    const int32_t *output_ids;
    int num_output;
} SamplingRow;

/* whether sampling with these penalties reads the prompt/output ids (any penalty at all) */
static inline int sampling_has_penalty(float repetition, float frequency, float presence) {
    return repetition != 1.0f || frequency != 0.0f || presence != 0.0f;
}
/* the same for a row (else its prompt/output ids are not read) */
static inline int sampling_row_has_penalty(const SamplingRow *r) {
    return sampling_has_penalty(r->repetition_penalty, r->frequency_penalty, r->presence_penalty);
}

/* One step's inputs, all host arrays (the CUDA backend copies them to the device).
 * Prefill packs sequences back to back without padding (varlen); decode has one token per seq. */
typedef struct {
    int is_prefill;
    int num_tokens;                /* new tokens in this step */
    int num_seqs;
    const int32_t *input_ids;      /* [num_tokens] */
    const int32_t *positions;      /* [num_tokens] */
    const int64_t *slot_mapping;   /* [num_tokens]: KV slot to write, -1 = do not write */
    const int32_t *cu_seqlens_q;   /* [num_seqs+1] */
    const int32_t *cu_seqlens_k;   /* [num_seqs+1] */
    int max_seqlen_q, max_seqlen_k;
    const int32_t *context_lens;   /* [num_seqs]: keys of the seq (= its seqlen_k) */
    const int32_t *block_tables;   /* [num_seqs, max_blocks_per_seq], -1 padded */
    int max_blocks_per_seq;
    const int32_t *logits_indices; /* [num_logits]: token rows whose next token is sampled */
    int num_logits;
    const SamplingRow *sampling;   /* [num_logits] */
    int any_penalty;               /* some row has a penalty (else prompt/output ids unused) */
    /* submit only (asynchronous scheduling), NULL otherwise: input_rows[t] >= 0 says that token
     * t's id is the one the step submitted before this one sampled in logits row input_rows[t],
     * not known to the host yet (input_ids[t] is then 0 and ignored); -1: input_ids[t]. */
    const int32_t *input_rows;     /* [num_tokens] */
} StepInputs;

/* Where forward puts its results (host arrays, [num_logits] rows). */
typedef struct {
    int32_t *token_ids;     /* sampled ids */
    float *logprobs;        /* [num_logits]: the sampled id's log-prob (rows with num_logprobs >= 0) */
    int32_t *top_ids;       /* [num_logits, CVLLM_MAX_LOGPROBS]: the top num_logprobs of each row */
    float *top_logprobs;    /* same shape */
    float *logits;          /* NULL, or [num_logits, vocab]: the raw f32 logits are also copied
                             * here (golden tests only: on a GPU it is a large copy) */
} StepOutputs;

typedef struct {
    int num_threads;   /* CPU: 0 = all cores */
    int device_id;     /* CUDA */
    int max_num_tokens; /* the largest num_tokens a step may carry (workspace sizing) */
    int max_num_seqs;
    int max_model_len;
    int block_size;    /* the engine's block size (graph capture sizes block tables by it) */
    double gpu_memory_utilization; /* 0: unset (backend default) */
    int enforce_eager; /* GPU: no CUDA graphs */
    int tp_rank, tp_size; /* tensor parallelism (tp_size 1: none); the engine makes rank 0 */
    const char *tp_addr;  /* rank 0's listening address "HOST:PORT" (NULL: 127.0.0.1, a free port) */
    int tp_local_ranks;   /* ranks started on this host (0: all); the others join from elsewhere */
    const char *model_dir; /* the model folder (tensor-parallel workers load their own share) */
    int verbose;       /* start-up report lines on stderr */
} BackendOptions;

typedef struct Backend Backend;
struct Backend {
    const char *name;  /* "cpu", "cuda" */
    void *ctx;         /* the backend's own state */
    int broken;        /* set by the backend when no later step can run (a tensor-parallel rank
                        * lost): the engine then fails every request and stops */
    /* Runs the model over one step: writes K/V of the new tokens into the cache (slot_mapping),
     * samples one id per logits row into out. Returns 0 or a negative code with the message set. */
    int (*forward)(Backend *b, const StepInputs *in, StepOutputs *out);
    /* Optional (NULL: none), both or neither: the same step as forward, in two calls, so that
     * the host prepares the next step while the device runs this one. submit enqueues the step
     * and returns (it copies what it needs of in first; out->logits is never asked); collect
     * waits for the oldest submitted step not yet collected and writes its results. At most
     * two steps are submitted and not collected; a submit that fails enqueues nothing. */
    int (*submit)(Backend *b, const StepInputs *in);
    int (*collect)(Backend *b, StepOutputs *out);
    /* Bytes of one KV block (K and V, all layers) for this backend's share of the heads. */
    int64_t (*kv_block_bytes)(Backend *b, int block_size, DType dtype);
    /* The cache dtype for CVLLM_KV_DTYPE_AUTO (CPU: f32; GPU: the model's dtype). */
    DType (*kv_default_dtype)(Backend *b);
    /* Bytes this backend can give to the KV cache by default (after weights and the activation
     * peak): CPU min(2 GiB, what fits in RAM); GPU gpu_memory_utilization * total - in use. */
    int64_t (*kv_budget_bytes)(Backend *b);
    /* Allocates the KV cache (once). */
    int (*init_kv_cache)(Backend *b, const KVCacheSpec *spec);
    /* Optional (NULL: nothing to do): after init_kv_cache, before the first step: warm-up, and
     * CUDA graph capture for decode batches of up to max_num_seqs sequences. */
    int (*warmup)(Backend *b);
    void (*destroy)(Backend *b);
};

/* The environment variable that makes a process a tensor-parallel rank started by rank 0:
 * "HOST:PORT RANK DEVICE" (set by src/backend/cuda/tp.c, read by cvllm_worker_main). */
#define CVLLM_TP_WORKER_ENV "CVLLM_TP_WORKER"

/* What a backend was sized for, to check a step against (step_inputs_check). */
typedef struct {
    int max_num_tokens, max_num_seqs, max_model_len, vocab_size;
    int num_blocks, block_size; /* the KV cache */
    int max_table_blocks;       /* the widest block-table row the backend can take; 0: no limit */
} StepLimits;

/* Checks a step against the contract above and the backend's limits, before any kernel reads it
 * (token ids reach it from requests): 0, or CVLLM_EINVAL with a message naming what is wrong.
 * Every backend's forward calls it first. */
int step_inputs_check(const StepInputs *in, const StepLimits *l);

/* ---------------------------------------------------------------------------------------------
 * Registry (backend.c): the engine and the CLI reach backends only through these. */
typedef struct {
    const char *name;  /* "cpu", "cuda" */
    /* Creates the backend over weights (borrowed: must outlive the backend). */
    int (*create)(const ModelConfig *cfg, const ModelWeights *w, const BackendOptions *o,
                  Backend **out);
    /* 1 if a device for it is present; writes a one-line description (e.g. the GPU's name, or
     * why not) into desc. */
    int (*probe)(char *desc, size_t n);
    /* `cvllm bench ops --device NAME ...`: the backend's own op benchmarks (argv[0] = "ops").
     * Returns an exit code (0, 1 runtime error, 2 usage). NULL: none. */
    int (*bench_ops)(int argc, char **argv);
    /* A tensor-parallel worker process (NULL: none): joins the group of rank 0 at addr as rank on
     * GPU device_id (trying for timeout_s), with the model folder rank 0 names (or model_dir).
     * Returns an exit code. */
    int (*worker_main)(const char *addr, int rank, int device_id, const char *model_dir,
                       double timeout_s);
} BackendEntry;

/* The compiled backends, in order of preference for --device auto (cuda, then cpu). */
const BackendEntry *const *backend_registry(int *n);
/* The entry named name, or NULL (not compiled in). */
const BackendEntry *backend_find(const char *name);
/* Creates the backend for a device choice: AUTO = the first compiled backend whose probe finds
 * a device. A device that is not compiled in or not present is a clear error. */
int backend_create(CvllmDevice device, const ModelConfig *cfg, const ModelWeights *w,
                   const BackendOptions *o, Backend **out);

#endif
