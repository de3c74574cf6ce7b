/* pyrandom.h: CPython's `random` module generator (MT19937 seeded as random.seed(int) does) and
 * the draws benchmarks need (randint), so that cvllm's benchmark workloads are exactly the ones
 * nano-vllm's bench.py produces with `random.seed(0)`. */
#ifndef CVLLM_BENCH_PYRANDOM_H
#define CVLLM_BENCH_PYRANDOM_H

#include <stdint.h>

typedef struct {
    uint32_t mt[624];
    int index;
} PyRandom;

/* random.seed(seed) for a non-negative integer seed below 2^64. */
void pyrandom_seed(PyRandom *r, uint64_t seed);
/* random.getrandbits(k) for 1 <= k <= 32. */
uint32_t pyrandom_getrandbits(PyRandom *r, int k);
/* random.randint(a, b): uniform in [a, b], with CPython's rejection sampling. */
int64_t pyrandom_randint(PyRandom *r, int64_t a, int64_t b);

/* nano-vllm bench.py's workload: for each of num_seqs sequences a prompt of
 * randint(100, max_input_len) ids each randint(0, 10000); then for each sequence
 * max_tokens = randint(100, max_output_len). Arrays are malloc'd (prompts[i] too). */
typedef struct {
    int num_seqs;
    int32_t **prompts;
    int *prompt_lens;
    int *max_tokens;
    int64_t total_prompt_tokens, total_output_tokens;
} BenchWorkload;

void bench_workload_nanovllm(BenchWorkload *w, int num_seqs, int max_input_len, int max_output_len);
/* Fixed lengths (vLLM's --input-len/--output-len): random ids from the same generator. */
void bench_workload_fixed(BenchWorkload *w, int num_seqs, int input_len, int output_len);
void bench_workload_free(BenchWorkload *w);

#endif
