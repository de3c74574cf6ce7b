/* sequence.c: one request's token ids, block table and per-request random generator.
 *
 * The generator is xoshiro256** (Blackman & Vigna), its 256-bit state expanded from the 64-bit
 * seed with splitmix64, so that a seeded request draws the same numbers whatever else is in the
 * batch. A request without a seed (seed = -1) is seeded from its id here; the engine may re-seed
 * it with sequence_seed_rng(). */
#include "engine/sequence.h"

#include <string.h>

#include "common.h"

/* ---------------------------------------------------------------------------------------------
 * Lifecycle */

Sequence *sequence_create(int64_t id, const int32_t *prompt, int n, const SamplingParams *p) {
    CHECK(n >= 0, "prompt length %d", n);
    CHECK(p != NULL, "sampling params are NULL");
    Sequence *s = xcalloc(1, sizeof(*s));
    s->id = id;
    s->status = SEQ_WAITING;
    s->cap_tokens = n > 0 ? n + 16 : 16;
    s->token_ids = xmalloc((size_t)s->cap_tokens * sizeof(int32_t));
    if (n > 0) memcpy(s->token_ids, prompt, (size_t)n * sizeof(int32_t));
    s->num_tokens = n;
    s->num_prompt_tokens = n;
    s->params = *p;
    s->params.stop_token_ids = NULL;
    if (p->num_stop_token_ids > 0) {
        CHECK(p->stop_token_ids != NULL, "%d stop ids but no array", p->num_stop_token_ids);
        s->params.stop_token_ids = xmalloc((size_t)p->num_stop_token_ids * sizeof(int32_t));
        memcpy(s->params.stop_token_ids, p->stop_token_ids,
               (size_t)p->num_stop_token_ids * sizeof(int32_t));
    } else {
        s->params.num_stop_token_ids = 0;
    }
    s->finish_reason = CVLLM_FINISH_NONE;
    s->arrival = id;
    sequence_seed_rng(s, p->seed >= 0 ? (uint64_t)p->seed : (uint64_t)id ^ 0x5eed5eed5eed5eedULL);
    return s;
}

void sequence_destroy(Sequence *s) {
    if (!s) return;
    free(s->token_ids);
    free(s->block_table);
    free(s->params.stop_token_ids);
    free(s);
}

void sequence_append_token(Sequence *s, int32_t token) {
    DA_PUSH(s->token_ids, s->num_tokens, s->cap_tokens, token);
}

int sequence_num_completion_tokens(const Sequence *s) { return s->num_tokens - s->num_prompt_tokens; }

/* ---------------------------------------------------------------------------------------------
 * Random numbers: splitmix64 seeding, xoshiro256** generation */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro256ss_next(uint64_t s[4]) {
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

void sequence_seed_rng(Sequence *s, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    /* splitmix64 is a bijection of distinct counters, so the four words cannot all be zero. */
}

double sequence_next_uniform(Sequence *s) {
    /* The top 53 bits give every double in [0, 1) on a 2^-53 grid. */
    return (double)(xoshiro256ss_next(s->rng) >> 11) * 0x1.0p-53;
}
