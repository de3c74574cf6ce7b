/* sampler.c: one token from one row of logits (see sampler.h for the order of the filters).
 *
 * Order of tokens: by probability, highest first, ties broken by the lower id. This is a total
 * order, so every filter keeps a well-defined set: top-k keeps exactly k tokens (on a tie at the
 * k-th place, the lower ids), top-p keeps the shortest prefix of this order whose mass reaches
 * top_p (at least one token), min-p keeps tokens with p >= min_p * p_max. Top-k = 1 and a tiny
 * top-p therefore give the greedy token.
 *
 * Cost: nothing is sorted. Each filter only needs the boundary of its set (the worst token it
 * keeps): top-k finds it by quickselect, top-p by a quickselect weighted by probability mass, both
 * O(vocab) expected. The draw then walks the vocabulary in id order over the kept tokens (a token
 * is kept if it is the boundary or better, and passes min-p); the distribution is the filtered,
 * renormalized one whatever the walking order.
 *
 * Numbers: weights are exp((logit - max) / temperature) in float (in [0, 1]: no overflow; the max
 * token has weight 1), sums in double; renormalization is folded into the draw (u is scaled by
 * the kept mass). */
#include "engine/sampler.h"

#include <math.h>

#include "backend/cpu/ops.h"
#include "common.h"


size_t sampler_scratch_bytes(int vocab) { return (size_t)vocab * (sizeof(float) + sizeof(int)); }

/* ---------------------------------------------------------------------------------------------
 * Greedy */

static int32_t argmax(const float *x, int n) {
#if defined(__x86_64__)
    if (cpu_isa_get() >= CPU_ISA_AVX2) return sampler_argmax_avx2(x, n);
#endif
    int best = -1;
    for (int i = 0; i < n; i++) /* strict: the lowest id wins ties; NaNs never win */
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best; /* all NaN: 0 */
}

/* ---------------------------------------------------------------------------------------------
 * Selection over token ids in the order (weight desc, id asc) */

static inline int better(const float *w, int a, int b) { return w[a] > w[b] || (w[a] == w[b] && a < b); }

static inline void swap_int(int *a, int *b) {
    int t = *a;
    *a = *b;
    *b = t;
}

/* Partitions idx[lo, hi] around a median-of-three pivot: idx[lo, p) better, idx[p] the pivot,
 * idx(p, hi] worse. Returns p. */
static int partition(const float *w, int *idx, int lo, int hi) {
    int mid = lo + (hi - lo) / 2;
    if (better(w, idx[mid], idx[lo])) swap_int(&idx[mid], &idx[lo]);
    if (better(w, idx[hi], idx[lo])) swap_int(&idx[hi], &idx[lo]);
    if (better(w, idx[mid], idx[hi])) swap_int(&idx[mid], &idx[hi]);
    int pivot = idx[hi], store = lo;
    for (int i = lo; i < hi; i++)
        if (better(w, idx[i], pivot)) swap_int(&idx[i], &idx[store++]);
    swap_int(&idx[store], &idx[hi]);
    return store;
}

/* Reorders idx[0, n) so that its k best come first (any order); returns the worst of them. */
static int select_top_k(const float *w, int *idx, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int p = partition(w, idx, lo, hi);
        if (p == k - 1) return idx[p];
        if (p > k - 1) hi = p - 1;
        else lo = p + 1;
    }
    return idx[k - 1];
}

/* Over idx[0, n): the worst token of the shortest best-first prefix whose weight reaches need
 * (the last token if rounding keeps it from being reached). */
static int select_top_p(const float *w, int *idx, int n, double need) {
    int lo = 0, hi = n - 1;
    double cum = 0.0; /* weight of idx[0, lo): all better than idx[lo, hi] */
    while (lo < hi) {
        int p = partition(w, idx, lo, hi);
        double better_mass = 0.0;
        for (int i = lo; i < p; i++) better_mass += w[idx[i]];
        if (cum + better_mass >= need) {
            hi = p - 1; /* cum < need, so better_mass > 0 and p > lo */
            continue;
        }
        cum += better_mass + w[idx[p]];
        if (cum >= need || p == hi) return idx[p];
        lo = p + 1;
    }
    return idx[lo];
}

/* ---------------------------------------------------------------------------------------------
 * Sampling */

int32_t sampler_sample(float *logits, int vocab, const SamplingParams *p, Sequence *seq,
                       void *scratch) {
    CHECK(vocab > 0, "vocab %d", vocab);
    if (!(p->temperature > 0.0f)) return argmax(logits, vocab);

    int imax = argmax(logits, vocab);
    float m = logits[imax];
    if (!isfinite(m)) return imax; /* all -inf (or +inf): nothing to weigh; greedy */

    void *owned = NULL;
    if (!scratch) scratch = owned = xmalloc(sampler_scratch_bytes(vocab));
    float *w = scratch;               /* [vocab] unnormalized probabilities */
    int *idx = (int *)(w + vocab);    /* [vocab] token ids, reordered by selection */

    /* Temperature and softmax (unnormalized). */
    float inv_t = 1.0f / p->temperature;
    double total = 0.0;
#if defined(__x86_64__)
    if (cpu_isa_get() >= CPU_ISA_AVX2) total = sampler_weights_avx2(logits, w, vocab, m, inv_t);
    else
#endif
        for (int i = 0; i < vocab; i++) {
            float e = expf((logits[i] - m) * inv_t);
            if (!(e >= 0.0f)) e = 0.0f; /* NaN logits never win */
            w[i] = e;
            total += e;
        }

    /* Top-k, then top-p over the top-k set: bound = the worst token kept (-1 = no bound). */
    int bound = -1;
    int use_top_k = p->top_k > 0 && p->top_k < vocab;
    int use_top_p = p->top_p > 0.0f && p->top_p < 1.0f;
    if (use_top_k || use_top_p) {
        for (int i = 0; i < vocab; i++) idx[i] = i;
        int n = vocab;
        double mass = total;
        if (use_top_k) {
            bound = select_top_k(w, idx, vocab, p->top_k);
            n = p->top_k;
            mass = 0.0;
            for (int i = 0; i < n; i++) mass += w[idx[i]];
        }
        if (use_top_p) bound = select_top_p(w, idx, n, (double)p->top_p * mass);
    }

    /* Min-p (relative to the best token, whose weight is 1), then the draw in id order. */
    float min_w = p->min_p > 0.0f ? p->min_p * w[imax] : 0.0f;
    double kept = 0.0;
    if (bound < 0 && min_w == 0.0f)
        kept = total; /* no filter: every token with a weight is kept */
    else
        for (int i = 0; i < vocab; i++)
            if (w[i] > 0.0f && w[i] >= min_w && (bound < 0 || !better(w, bound, i))) kept += w[i];
    double target = sequence_next_uniform(seq) * kept, cum = 0.0;
    int32_t token = imax;
    for (int i = 0; i < vocab; i++) {
        if (!(w[i] > 0.0f && w[i] >= min_w && (bound < 0 || !better(w, bound, i)))) continue;
        token = i;
        cum += w[i];
        if (cum > target) break;
    }
    free(owned);
    return token;
}
