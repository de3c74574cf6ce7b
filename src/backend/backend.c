/* backend.c: the registry of compiled backends. The engine and the CLI find a backend here by
 * device choice or name; nothing above this file names a backend's create function. */
#include "backend/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "common.h"

#ifdef CVLLM_HAVE_CUDA
extern const BackendEntry backend_cuda_entry; /* backend/cuda/ */
#endif

static const BackendEntry *const REGISTRY[] = {
#ifdef CVLLM_HAVE_CUDA
    &backend_cuda_entry,
#endif
    &backend_cpu_entry,
};

int step_inputs_check(const StepInputs *in, const StepLimits *l) {
    const int T = in->num_tokens, S = in->num_seqs;
    if (T < 1 || T > l->max_num_tokens)
        return cvllm_errorf(CVLLM_EINVAL, "step of %d tokens (backend sized for 1..%d)", T,
                            l->max_num_tokens);
    if (S < 1 || S > l->max_num_seqs || S > T)
        return cvllm_errorf(CVLLM_EINVAL, "step of %d sequences (max %d, tokens %d)", S,
                            l->max_num_seqs, T);
    if (in->num_logits < 0 || in->num_logits > T || in->num_logits > l->max_num_seqs)
        return cvllm_errorf(CVLLM_EINVAL, "%d logits rows for %d tokens (max %d)", in->num_logits,
                            T, l->max_num_seqs);
    if (in->cu_seqlens_q[0] != 0 || in->cu_seqlens_q[S] != T)
        return cvllm_errorf(CVLLM_EINVAL, "cu_seqlens_q spans %d..%d, expected 0..%d",
                            in->cu_seqlens_q[0], in->cu_seqlens_q[S], T);
    if (in->cu_seqlens_k[0] != 0)
        return cvllm_errorf(CVLLM_EINVAL, "cu_seqlens_k starts at %d", in->cu_seqlens_k[0]);
    const int64_t slots = (int64_t)l->num_blocks * l->block_size;
    int max_q = 0, max_k = 0;
    for (int s = 0; s < S; s++) {
        const int q0 = in->cu_seqlens_q[s], q1 = in->cu_seqlens_q[s + 1], ctx = in->context_lens[s];
        if (q1 <= q0 || ctx < q1 - q0 || in->cu_seqlens_k[s + 1] - in->cu_seqlens_k[s] != ctx)
            return cvllm_errorf(CVLLM_EINVAL, "seq %d: %d new tokens, %d keys, cu_seqlens_k %d", s,
                                q1 - q0, ctx, in->cu_seqlens_k[s + 1] - in->cu_seqlens_k[s]);
        if (ctx > l->max_model_len)
            return cvllm_errorf(CVLLM_EINVAL, "seq %d: context of %d tokens (max_model_len %d)", s,
                                ctx, l->max_model_len);
        if (q1 - q0 > max_q) max_q = q1 - q0;
        if (ctx > max_k) max_k = ctx;
        const int nblk = (ctx + l->block_size - 1) / l->block_size;
        if (nblk > in->max_blocks_per_seq || (l->max_table_blocks && nblk > l->max_table_blocks))
            return cvllm_errorf(CVLLM_EINVAL, "seq %d: %d tokens need %d blocks, table has %d", s,
                                ctx, nblk, in->max_blocks_per_seq);
        const int32_t *tab = in->block_tables + (int64_t)s * in->max_blocks_per_seq;
        for (int i = 0; i < nblk; i++)
            if (tab[i] < 0 || tab[i] >= l->num_blocks)
                return cvllm_errorf(CVLLM_EINVAL, "seq %d: block table entry %d is %d (of %d)", s,
                                    i, tab[i], l->num_blocks);
        for (int t = q0; t < q1; t++) {
            if (in->input_rows && in->input_rows[t] < -1)
                return cvllm_errorf(CVLLM_EINVAL, "token %d: input row %d", t, in->input_rows[t]);
            if (in->input_ids[t] < 0 || in->input_ids[t] >= l->vocab_size)
                return cvllm_errorf(CVLLM_EINVAL, "token %d: id %d outside the vocabulary (%d)", t,
                                    in->input_ids[t], l->vocab_size);
            if (in->positions[t] < 0 || in->positions[t] >= ctx)
                return cvllm_errorf(CVLLM_EINVAL, "token %d: position %d outside its context %d",
                                    t, in->positions[t], ctx);
            if (in->slot_mapping[t] < -1 || in->slot_mapping[t] >= slots)
                return cvllm_errorf(CVLLM_EINVAL, "token %d: slot %lld outside the cache (%lld)", t,
                                    (long long)in->slot_mapping[t], (long long)slots);
        }
    }
    if (in->max_seqlen_q != max_q || in->max_seqlen_k != max_k)
        return cvllm_errorf(CVLLM_EINVAL, "max_seqlen_q %d / max_seqlen_k %d, the sequences give "
                                          "%d / %d",
                            in->max_seqlen_q, in->max_seqlen_k, max_q, max_k);
    for (int i = 0; i < in->num_logits; i++) {
        if (in->logits_indices[i] < 0 || in->logits_indices[i] >= T)
            return cvllm_errorf(CVLLM_EINVAL, "logits row %d is token %d of %d", i,
                                in->logits_indices[i], T);
        const SamplingRow *r = &in->sampling[i];
        if (r->num_logprobs > CVLLM_MAX_LOGPROBS || r->num_prompt < 0 || r->num_output < 0)
            return cvllm_errorf(CVLLM_EINVAL, "sampling row %d: bad logprobs or history", i);
    }
    return 0;
}

const BackendEntry *const *backend_registry(int *n) {
    *n = (int)(sizeof REGISTRY / sizeof REGISTRY[0]);
    return REGISTRY;
}

const BackendEntry *backend_find(const char *name) {
    for (size_t i = 0; i < sizeof REGISTRY / sizeof REGISTRY[0]; i++)
        if (!strcmp(REGISTRY[i]->name, name)) return REGISTRY[i];
    return NULL;
}

const char *cvllm_backends(void) {
    static char buf[64];
    if (!buf[0])
        for (size_t i = 0; i < sizeof REGISTRY / sizeof REGISTRY[0]; i++) {
            if (i) strcat(buf, ",");
            strcat(buf, REGISTRY[i]->name);
        }
    return buf;
}

const char *cvllm_backends_report(void) {
    static char buf[1024];
    if (!buf[0])
        for (size_t i = 0; i < sizeof REGISTRY / sizeof REGISTRY[0]; i++) {
            char desc[256] = "";
            REGISTRY[i]->probe(desc, sizeof desc);
            size_t len = strlen(buf);
            snprintf(buf + len, sizeof buf - len, "%s%s", len ? "\n" : "", desc);
        }
    return buf;
}

int backend_create(CvllmDevice device, const ModelConfig *cfg, const ModelWeights *w,
                   const BackendOptions *o, Backend **out) {
    *out = NULL;
    char desc[256] = "";
    if (device == CVLLM_DEVICE_AUTO) {
        for (size_t i = 0; i < sizeof REGISTRY / sizeof REGISTRY[0]; i++)
            if (REGISTRY[i]->probe(desc, sizeof desc)) return REGISTRY[i]->create(cfg, w, o, out);
        return cvllm_errorf(CVLLM_EBACKEND, "no backend can run here");
    }
    const char *name = device == CVLLM_DEVICE_CUDA ? "cuda" : "cpu";
    const BackendEntry *be = backend_find(name);
    if (!be)
        return cvllm_errorf(CVLLM_EBACKEND,
                            "this cvllm was built without the %s backend (compiled backends: %s); "
                            "use --device cpu",
                            strcmp(name, "cuda") ? name : "CUDA", cvllm_backends());
    if (!be->probe(desc, sizeof desc))
        return cvllm_errorf(CVLLM_EBACKEND, "--device %s: %s", name, desc);
    return be->create(cfg, w, o, out);
}

/* ---------------------------------------------------------------------------------------------
 * Tensor-parallel workers (include/cvllm.h) */

int cvllm_worker_run(const char *addr, int rank, int device_id, const char *model_dir,
                     double timeout_s) {
    for (size_t i = 0; i < sizeof REGISTRY / sizeof REGISTRY[0]; i++)
        if (REGISTRY[i]->worker_main)
            return REGISTRY[i]->worker_main(addr, rank, device_id, model_dir, timeout_s);
    fprintf(stderr, "cvllm worker: this cvllm was built without tensor parallelism (CUDA and NCCL; "
                    "compiled backends: %s)\n",
            cvllm_backends());
    return 1;
}

int cvllm_worker_main(void) {
    const char *spec = getenv(CVLLM_TP_WORKER_ENV);
    if (!spec || !*spec) return -1;
    char addr[300];
    int rank = -1, dev = -1;
    if (sscanf(spec, "%299s %d %d", addr, &rank, &dev) != 3 || rank < 1 || dev < 0) {
        fprintf(stderr, "cvllm worker: CVLLM_TP_WORKER=\"%s\" is not \"HOST:PORT RANK DEVICE\"\n",
                spec);
        return 2;
    }
    /* not inherited by whatever this process starts */
    unsetenv(CVLLM_TP_WORKER_ENV);
    return cvllm_worker_run(addr, rank, dev, NULL, 30.0); /* rank 0 listens already */
}
