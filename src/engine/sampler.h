/* sampler.h: one token from one row of logits. Order (as vLLM): temperature, then top-k, top-p,
 * min-p filters over the softmax, renormalize, draw with the sequence's own generator (so a seeded
 * request gives the same tokens whatever else is in the batch). temperature 0 = greedy argmax
 * (lowest id on ties), which draws nothing. Tokens are ordered by probability, ties by lower id:
 * top-k keeps exactly k; top-p the shortest prefix reaching top_p (at least one); min-p drops
 * p < min_p * p_max. O(vocab) expected: no sort (quickselect for the top-k / top-p boundary). */
#ifndef CVLLM_ENGINE_SAMPLER_H
#define CVLLM_ENGINE_SAMPLER_H

#include "engine/sequence.h"

/* logits [vocab] may be overwritten. scratch: [vocab] floats + [vocab] ints, or NULL (allocates). */
int32_t sampler_sample(float *logits, int vocab, const SamplingParams *p, Sequence *seq,
                       void *scratch);
/* Bytes sampler_sample needs as scratch for a vocabulary. */
size_t sampler_scratch_bytes(int vocab);

#if defined(__x86_64__)
/* The vocabulary-wide passes with AVX2 (sampler_avx2.c; sampler_sample uses them when the CPU
 * backend's ISA is AVX2 or better): the lowest id of the largest value, NaNs never winning
 * (all NaN: 0); and w[i] = exp((x[i] - m) * inv_t), exactly 0 for NaN and for arguments below
 * -87, returning the sum of w. */
int32_t sampler_argmax_avx2(const float *x, int n);
double sampler_weights_avx2(const float *x, float *w, int n, float m, float inv_t);
#endif

#endif
