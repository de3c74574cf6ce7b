/* sampler.h: the CPU backend's sampler: one token from one row of logits, with the semantics
 * every backend shares (stated in backend.h). Order (as vLLM): penalties (repetition over prompt
 * and output ids, then frequency and presence over output ids), temperature, then top-k, top-p,
 * min-p filters over the softmax, renormalize, draw with the uniform cvllm_uniform(seed,
 * output index) (philox.h), so a seeded request gives the same tokens whatever else is in the
 * batch and on every device; with no filter, the exponential race instead (one uniform an id,
 * philox.h). temperature 0 = greedy argmax (lowest id on ties), which draws nothing. Tokens are ordered by probability, ties by lower id: top-k keeps exactly k; top-p the
 * shortest prefix reaching top_p (at least one); min-p drops p < min_p * p_max. O(vocab)
 * expected: no sort (quickselect for the top-k / top-p boundary). Log-probs: log_softmax of the
 * raw logits (before penalties and temperature) for the sampled id and the top k. */
#ifndef CVLLM_BACKEND_CPU_SAMPLER_H
#define CVLLM_BACKEND_CPU_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/philox.h"

/* Samples row's next id from logits [vocab] (overwritten). scratch: sampler_scratch_bytes(vocab)
 * bytes, or NULL (allocates). When row->num_logprobs >= 0, *logprob gets the sampled id's
 * log-prob and top_ids / top_lp [row->num_logprobs] the best ones. */
int32_t sampler_sample(float *logits, int vocab, const SamplingRow *row, void *scratch,
                       float *logprob, int32_t *top_ids, float *top_lp);
/* Bytes sampler_sample needs as scratch for a vocabulary. */
size_t sampler_scratch_bytes(int vocab);

#if defined(__x86_64__)
/* The vocabulary-wide passes with AVX2 (sampler_avx2.c; sampler_sample uses them when the CPU
 * backend's ISA is AVX2 or better): the lowest id of the largest value, NaNs never winning
 * (all NaN: 0); and w[i] = exp((x[i] - m) * inv_t), exactly 0 for NaN and for arguments below
 * -87, returning the sum of w; and the exponential race of sampler.c's race() (the id of the
 * largest fma(-t2, log2(-ln u_i), x_i), lowest id on ties, NaN never; x[imax] finite). */
int32_t sampler_argmax_avx2(const float *x, int n);
double sampler_weights_avx2(const float *x, float *w, int n, float m, float inv_t);
int32_t sampler_race_avx2(const float *x, int vocab, float t2, CvllmRaceKey k, int imax);
/* Test hook: the race's u, E = -ln(u) and log2(E) of ids i0 .. i0 + 7, as the race computes them. */
void sampler_race_probe_avx2(CvllmRaceKey k, uint32_t i0, float u[8], float big_e[8], float l2[8]);
#endif

#endif
