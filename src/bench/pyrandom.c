/* pyrandom.c: MT19937 exactly as CPython's _randommodule.c seeds and draws it. */
#include "bench/pyrandom.h"

#include "common.h"

#define MT_N 624
#define MT_M 397

static void init_genrand(PyRandom *r, uint32_t s) {
    r->mt[0] = s;
    for (int i = 1; i < MT_N; i++)
        r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
    r->index = MT_N;
}

static void init_by_array(PyRandom *r, const uint32_t *key, int len) {
    init_genrand(r, 19650218u);
    int i = 1, j = 0;
    for (int k = MT_N > len ? MT_N : len; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1664525u)) + key[j] +
                   (uint32_t)j;
        i++, j++;
        if (i >= MT_N) { r->mt[0] = r->mt[MT_N - 1]; i = 1; }
        if (j >= len) j = 0;
    }
    for (int k = MT_N - 1; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1566083941u)) - (uint32_t)i;
        i++;
        if (i >= MT_N) { r->mt[0] = r->mt[MT_N - 1]; i = 1; }
    }
    r->mt[0] = 0x80000000u;
    r->index = MT_N;
}

void pyrandom_seed(PyRandom *r, uint64_t seed) {
    /* CPython splits abs(seed) into 32-bit words, least significant first; 0 -> one word 0. */
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    init_by_array(r, key, key[1] ? 2 : 1);
}

static uint32_t genrand_uint32(PyRandom *r) {
    static const uint32_t mag01[2] = {0u, 0x9908b0dfu};
    if (r->index >= MT_N) {
        int kk;
        uint32_t y;
        for (kk = 0; kk < MT_N - MT_M; kk++) {
            y = (r->mt[kk] & 0x80000000u) | (r->mt[kk + 1] & 0x7fffffffu);
            r->mt[kk] = r->mt[kk + MT_M] ^ (y >> 1) ^ mag01[y & 1u];
        }
        for (; kk < MT_N - 1; kk++) {
            y = (r->mt[kk] & 0x80000000u) | (r->mt[kk + 1] & 0x7fffffffu);
            r->mt[kk] = r->mt[kk + (MT_M - MT_N)] ^ (y >> 1) ^ mag01[y & 1u];
        }
        y = (r->mt[MT_N - 1] & 0x80000000u) | (r->mt[0] & 0x7fffffffu);
        r->mt[MT_N - 1] = r->mt[MT_M - 1] ^ (y >> 1) ^ mag01[y & 1u];
        r->index = 0;
    }
    uint32_t y = r->mt[r->index++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    return y;
}

uint32_t pyrandom_getrandbits(PyRandom *r, int k) {
    CHECK(k >= 1 && k <= 32, "getrandbits(%d) supports 1..32 bits", k);
    return genrand_uint32(r) >> (32 - k);
}

int64_t pyrandom_randint(PyRandom *r, int64_t a, int64_t b) {
    CHECK(b >= a && b - a < (int64_t)UINT32_MAX, "randint(%lld, %lld)", (long long)a, (long long)b);
    uint64_t n = (uint64_t)(b - a + 1);
    int k = 0;
    while ((n >> k) != 0) k++; /* n.bit_length() */
    uint32_t v = pyrandom_getrandbits(r, k);
    while (v >= n) v = pyrandom_getrandbits(r, k);
    return a + (int64_t)v;
}

static void workload_alloc(BenchWorkload *w, int num_seqs) {
    w->num_seqs = num_seqs;
    w->prompts = xcalloc((size_t)num_seqs, sizeof *w->prompts);
    w->prompt_lens = xcalloc((size_t)num_seqs, sizeof *w->prompt_lens);
    w->max_tokens = xcalloc((size_t)num_seqs, sizeof *w->max_tokens);
    w->total_prompt_tokens = w->total_output_tokens = 0;
}

void bench_workload_nanovllm(BenchWorkload *w, int num_seqs, int max_input_len, int max_output_len) {
    PyRandom r;
    pyrandom_seed(&r, 0);
    workload_alloc(w, num_seqs);
    for (int i = 0; i < num_seqs; i++) {
        int len = (int)pyrandom_randint(&r, 100, max_input_len);
        w->prompts[i] = xmalloc((size_t)len * sizeof(int32_t));
        for (int j = 0; j < len; j++) w->prompts[i][j] = (int32_t)pyrandom_randint(&r, 0, 10000);
        w->prompt_lens[i] = len;
        w->total_prompt_tokens += len;
    }
    for (int i = 0; i < num_seqs; i++) {
        w->max_tokens[i] = (int)pyrandom_randint(&r, 100, max_output_len);
        w->total_output_tokens += w->max_tokens[i];
    }
}

void bench_workload_fixed(BenchWorkload *w, int num_seqs, int input_len, int output_len) {
    PyRandom r;
    pyrandom_seed(&r, 0);
    workload_alloc(w, num_seqs);
    for (int i = 0; i < num_seqs; i++) {
        w->prompts[i] = xmalloc((size_t)input_len * sizeof(int32_t));
        for (int j = 0; j < input_len; j++) w->prompts[i][j] = (int32_t)pyrandom_randint(&r, 0, 10000);
        w->prompt_lens[i] = input_len;
        w->max_tokens[i] = output_len;
        w->total_prompt_tokens += input_len;
        w->total_output_tokens += output_len;
    }
}

void bench_workload_free(BenchWorkload *w) {
    if (!w || !w->prompts) return;
    for (int i = 0; i < w->num_seqs; i++) free(w->prompts[i]);
    free(w->prompts);
    free(w->prompt_lens);
    free(w->max_tokens);
    w->prompts = NULL;
}
