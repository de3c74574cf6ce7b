/* backend.h: the one interface between the engine and the math. A backend owns its copy/view of
 * the weights, the KV cache and its activation workspace; the engine hands it flat per-step inputs
 * (built by the model runner) and gets back logits on the host. The engine never includes a
 * device header: CPU and CUDA implement this same struct of function pointers.
 *
 * KV cache layout (one allocation): [2 (k,v), num_layers, num_blocks, block_size, kv_heads, head_dim]
 * Physical slot of a token = block * block_size + offset. */
#ifndef CVLLM_BACKEND_H
#define CVLLM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/weights.h"

typedef struct {
    int num_blocks;
    int block_size;
    DType dtype;       /* element type of the cache (CPU: f32 or bf16) */
    int prefault;      /* touch all of it now, not at each block's first use */
} KVCacheSpec;

/* One step's inputs, all host arrays (the CUDA backend copies them to the device).
 * Prefill packs sequences back to back without padding (varlen); decode has one token per seq.
 * For sequence s: its new tokens are input_ids[cu_seqlens_q[s] .. cu_seqlens_q[s+1]), at positions
 * positions[...]; it attends causally over cu_seqlens_k[s+1]-cu_seqlens_k[s] keys (cached prefix
 * + new tokens), the last ones being the new tokens, all read through its block table. */
typedef struct {
    int is_prefill;
    int num_tokens;                /* new tokens in this step */
    int num_seqs;
    const int32_t *input_ids;      /* [num_tokens] */
    const int32_t *positions;      /* [num_tokens] */
    const int64_t *slot_mapping;   /* [num_tokens]: KV slot to write, -1 = do not write (cached) */
    const int32_t *cu_seqlens_q;   /* [num_seqs+1] */
    const int32_t *cu_seqlens_k;   /* [num_seqs+1] */
    int max_seqlen_q, max_seqlen_k;
    const int32_t *context_lens;   /* [num_seqs]: keys seen by the seq's last new token */
    const int32_t *block_tables;   /* [num_seqs, max_blocks_per_seq], -1 padded */
    int max_blocks_per_seq;
    const int32_t *logits_indices; /* [num_logits]: token rows whose logits are wanted */
    int num_logits;
} StepInputs;

typedef struct {
    int num_threads;   /* CPU: 0 = all cores */
    int device_id;     /* CUDA */
    int max_num_tokens; /* the largest num_tokens a step may carry (workspace sizing) */
    int max_num_seqs;
    int max_model_len;
} BackendOptions;

typedef struct Backend Backend;
struct Backend {
    const char *name;  /* "cpu", "cuda" */
    void *ctx;         /* the backend's own state */
    /* Runs the model over one step: writes K/V of the new tokens into the cache (slot_mapping),
     * and fills logits [num_logits, vocab] (host, f32) for the rows in logits_indices.
     * Returns 0 or a negative code with the message set. */
    int (*forward)(Backend *b, const StepInputs *in, float *logits);
    /* Bytes of device/host memory this backend can still give to the KV cache (after weights and
     * workspace); the engine sizes num_blocks from it when no explicit budget is given. */
    int64_t (*available_kv_bytes)(Backend *b);
    /* Allocates the KV cache (once). */
    int (*init_kv_cache)(Backend *b, const KVCacheSpec *spec);
    void (*destroy)(Backend *b);
};

/* Creates the CPU backend over weights (borrowed: must outlive the backend). */
int backend_cpu_create(const ModelConfig *cfg, const ModelWeights *w, const BackendOptions *o,
                       Backend **out);
/* Creates the CUDA backend (returns CVLLM_EBACKEND when not compiled in). */
int backend_cuda_create(const ModelConfig *cfg, const ModelWeights *w, const BackendOptions *o,
                        Backend **out);

#endif
