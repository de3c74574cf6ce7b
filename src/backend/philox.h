/* philox.h: the sampler's uniforms, counter-based (Philox4x32-10, Salmon et al., "Parallel random
 * numbers: as easy as 1, 2, 3", SC 2011). A sampled token's uniform is a pure function of the
 * request's seed and the index of the token in its output, so that a seeded request draws the
 * same numbers whatever its batch, after a preemption, and on every device: this header is
 * included by the CPU sampler and compiled by nvcc for the CUDA one (bit-identical: integer
 * arithmetic, then one exact conversion to double).
 *
 * key = (seed low 32 bits, seed high 32 bits); counter = (index low, index high, 0, 0);
 * u = ((((uint64)x0 << 32) | x1) >> 11) * 2^-53, in [0, 1). The known-answer vector of the
 * Random123 distribution (ctr 0, key 0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8) is tested. */
#ifndef CVLLM_BACKEND_PHILOX_H
#define CVLLM_BACKEND_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define CVLLM_HD __host__ __device__ __forceinline__
#else
#define CVLLM_HD static inline
#endif

CVLLM_HD void cvllm_philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0];
        uint64_t p1 = (uint64_t)0xCD9E8D57u * ctr[2];
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t n0 = hi1 ^ ctr[1] ^ k0, n2 = hi0 ^ ctr[3] ^ k1;
        ctr[0] = n0;
        ctr[1] = lo1;
        ctr[2] = n2;
        ctr[3] = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

/* The uniform in [0, 1) of output token `index` of a request seeded with `seed`. */
CVLLM_HD double cvllm_uniform(uint64_t seed, uint64_t index) {
    uint32_t c[4] = {(uint32_t)index, (uint32_t)(index >> 32), 0u, 0u};
    cvllm_philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    uint64_t bits = ((uint64_t)c[0] << 32) | c[1];
    return (double)(bits >> 11) * (1.0 / 9007199254740992.0);
}

/* The exponential race (rows with a temperature and no top-k, top-p or min-p: backend.h): token
 * id i of the draw of output token `index` gets the uniform u_i = cvllm_race_uniform(key, i),
 * key = cvllm_race_key(seed, index) (Philox's two words that cvllm_uniform leaves unused, so a
 * draw's uniforms are still a pure function of seed and index), and the row's token is the id of
 * the largest x_i - T * log(-log(u_i)) (the Gumbel-max trick, as vLLM and nano-vllm sample: the
 * softmax(x / T) distribution exactly, in one pass over the row with no maximum or sum first).
 * u_i: one round of a 32-bit mixing hash ("lowbias32", C. Wellons) of i under the key, its top
 * 24 bits made odd: an exact f32 in [2^-24, 1 - 2^-24]. */
typedef struct {
    uint32_t k0, k1;
} CvllmRaceKey;

CVLLM_HD CvllmRaceKey cvllm_race_key(uint64_t seed, uint64_t index) {
    uint32_t c[4] = {(uint32_t)index, (uint32_t)(index >> 32), 0u, 0u};
    cvllm_philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    CvllmRaceKey k = {c[2], c[3]};
    return k;
}

/* the hash of id i under the key (the GPU's race kernel forms u from it its own way: sampler.cu) */
CVLLM_HD uint32_t cvllm_race_hash(CvllmRaceKey k, uint32_t i) {
    uint32_t x = i * 0x9E3779B1u + k.k0;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x ^ k.k1;
}

CVLLM_HD float cvllm_race_uniform(CvllmRaceKey k, uint32_t i) {
    return (float)((cvllm_race_hash(k, i) >> 8) | 1u) * 5.9604644775390625e-8f; /* 2^-24 */
}

/* T ln 2, the factor of log2(-ln u_i) in a key, key = fma(-(T ln 2), log2(-ln u_i), x_i): the CPU
 * and every GPU kernel round it the same way, so their keys are computed from the same float. */
CVLLM_HD float cvllm_race_t2(float temperature) {
    return temperature * 0.693147182f; /* ln 2 as a float */
}

#endif
