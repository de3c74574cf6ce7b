/* sampler.c: one token from one row of logits (see sampler.h for the order of the filters).
 *
 * Cost: greedy is one pass. Temperature (and min-p) alone is three passes over the vocabulary, no
 * sort. Only top-k / top-p need the most probable tokens in order; they are found by partial
 * selection (quickselect) and only the selected prefix is sorted: top-k sorts k tokens; top-p
 * sorts a growing prefix (64, 256, 1024, ... tokens) until its mass reaches top_p, so a peaked
 * distribution over a 151,936-token vocabulary sorts a few dozen tokens, not all of them.
 *
 * Order of tokens: by probability, highest first, ties broken by the lower id (a total order), so
 * top-k keeps exactly k tokens (at a tie at the k-th place, the lower ids) and top-k = 1 or a tiny
 * top-p give the same token as greedy.
 *
 * Probabilities are exp((logit - max) / temperature) in float (in [0, 1], no overflow) with sums
 * in double; renormalization is folded into the draw (u is scaled by the kept mass). */
#include "engine/sampler.h"

#include <math.h>

#include "common.h"

size_t sampler_scratch_bytes(int vocab) { return (size_t)vocab * (sizeof(float) + sizeof(int)); }

/* ---------------------------------------------------------------------------------------------
 * Greedy */

static int32_t argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i; /* strict: the lowest id wins ties */
    return best;
}

/* ---------------------------------------------------------------------------------------------
 * Partial selection over token ids, ordered by (prob desc, id asc) */

static inline int better(const float *p, int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); }

static inline void swap_int(int *a, int *b) {
    int t = *a;
    *a = *b;
    *b = t;
}

/* Reorders idx[0, n) so that its k best tokens come first (in no particular order). */
static void select_best(const float *p, int *idx, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi && k > lo && k <= hi) {
        /* median of three as pivot, moved to hi */
        int mid = lo + (hi - lo) / 2;
        if (better(p, idx[mid], idx[lo])) swap_int(&idx[mid], &idx[lo]);
        if (better(p, idx[hi], idx[lo])) swap_int(&idx[hi], &idx[lo]);
        if (better(p, idx[mid], idx[hi])) swap_int(&idx[mid], &idx[hi]);
        int pivot = idx[hi], store = lo;
        for (int i = lo; i < hi; i++)
            if (better(p, idx[i], pivot)) swap_int(&idx[i], &idx[store++]);
        swap_int(&idx[store], &idx[hi]);
        /* idx[lo, store) better than pivot, idx[store] = pivot, idx(store, hi] worse */
        if (store == k || store + 1 == k) return;
        if (store > k) hi = store - 1;
        else lo = store + 1;
    }
}

/* Sorts idx[0, n) best first. qsort has no context argument, hence the thread-local pointer. */
static _Thread_local const float *tl_sort_p;

static int cmp_best(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (better(tl_sort_p, x, y)) return -1;
    if (better(tl_sort_p, y, x)) return 1;
    return 0;
}

static void sort_best(const float *p, int *idx, int n) {
    tl_sort_p = p;
    qsort(idx, (size_t)n, sizeof(int), cmp_best);
}

/* ---------------------------------------------------------------------------------------------
 * Sampling */

int32_t sampler_sample(float *logits, int vocab, const SamplingParams *p, Sequence *seq,
                       void *scratch) {
    CHECK(vocab > 0, "vocab %d", vocab);
    if (!(p->temperature > 0.0f)) return argmax(logits, vocab);

    void *owned = NULL;
    if (!scratch) scratch = owned = xmalloc(sampler_scratch_bytes(vocab));
    float *prob = scratch;                 /* [vocab] unnormalized probabilities */
    int *idx = (int *)(prob + vocab);      /* [vocab] token ids, best first once sorted */

    /* Temperature and softmax (unnormalized: the max token has weight 1). */
    int imax = argmax(logits, vocab);
    float m = logits[imax];
    if (!isfinite(m)) { /* all -inf (or +inf / NaN): nothing to draw from; fall back to greedy */
        free(owned);
        return imax;
    }
    float inv_t = 1.0f / p->temperature;
    double total = 0.0;
    for (int i = 0; i < vocab; i++) {
        float e = expf((logits[i] - m) * inv_t);
        if (!(e >= 0.0f)) e = 0.0f; /* NaN logits never win */
        prob[i] = e;
        total += e;
    }

    int use_top_k = p->top_k > 0 && p->top_k < vocab;
    int use_top_p = p->top_p > 0.0f && p->top_p < 1.0f;
    float min_w = p->min_p > 0.0f ? p->min_p * prob[imax] : 0.0f; /* weights below are dropped */
    int32_t token = imax;
    double u = sequence_next_uniform(seq);

    if (!use_top_k && !use_top_p) {
        /* No ordering needed: draw over all tokens kept by min-p, in id order. */
        double kept = 0.0;
        if (min_w > 0.0f) {
            for (int i = 0; i < vocab; i++)
                if (prob[i] >= min_w) kept += prob[i];
        } else {
            kept = total;
        }
        double target = u * kept, cum = 0.0;
        for (int i = 0; i < vocab; i++) {
            if (prob[i] < min_w || prob[i] <= 0.0f) continue;
            token = i;
            cum += prob[i];
            if (cum > target) break;
        }
        free(owned);
        return token;
    }

    for (int i = 0; i < vocab; i++) idx[i] = i;
    int n; /* candidates: idx[0, n), sorted best first */
    double mass = 0.0;
    if (use_top_k) {
        n = p->top_k;
        select_best(prob, idx, vocab, n);
        sort_best(prob, idx, n);
        for (int i = 0; i < n; i++) mass += prob[idx[i]];
    } else {
        n = vocab;
        mass = total;
    }
    if (use_top_p) {
        /* Smallest prefix whose mass reaches top_p of the (top-k) mass; at least one token. */
        double need = (double)p->top_p * mass, cum = 0.0;
        int sorted = use_top_k ? n : 0, keep = 0;
        for (;;) {
            while (keep < sorted) {
                cum += prob[idx[keep++]];
                if (cum >= need) break;
            }
            if (cum >= need || sorted == n) break;
            int want = sorted ? sorted * 4 : 64;
            if (want > n) want = n;
            select_best(prob, idx + sorted, n - sorted, want - sorted);
            sort_best(prob, idx + sorted, want - sorted);
            sorted = want;
        }
        if (keep < 1) keep = 1;
        n = keep;
        mass = cum;
    }
    if (min_w > 0.0f) {
        /* Sorted best first: the kept tokens are a prefix (the best one always stays). */
        int keep = 1;
        double kept = prob[idx[0]];
        while (keep < n && prob[idx[keep]] >= min_w) kept += prob[idx[keep++]];
        n = keep;
        mass = kept;
    }
    double target = u * mass, cum = 0.0;
    token = idx[0];
    for (int i = 0; i < n; i++) {
        if (prob[idx[i]] <= 0.0f) break;
        token = idx[i];
        cum += prob[idx[i]];
        if (cum > target) break;
    }
    free(owned);
    return token;
}
