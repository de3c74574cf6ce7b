/* sampler.c: one token from one row of logits (see sampler.h for the order of the steps).
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
 * the kept mass). Without a filter (top-k, top-p, min-p) there is no draw by u: the token wins
 * the exponential race (philox.h), one uniform an id. */
#include "backend/cpu/sampler.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "backend/philox.h"
#include "common.h"

/* scratch: w [vocab] floats, idx [vocab] ints, raw [vocab] floats (a copy of the logits, kept for
 * the log-probs when penalties change them) */
size_t sampler_scratch_bytes(int vocab) { return (size_t)vocab * (2 * sizeof(float) + sizeof(int)); }

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
 * Penalties and log-probs */

/* vLLM's penalties, in place: repetition (each distinct id of prompt and output: a positive logit
 * divided by it, a negative one multiplied), then frequency (times the id's count in the output)
 * and presence (once if the id is in the output), subtracted. cnt: [vocab] ints, all zero on entry
 * and on return. */
static void apply_penalties(float *logits, const SamplingRow *r, int vocab, int *cnt) {
    const int32_t *ids[2] = {r->prompt_ids, r->output_ids};
    const int n[2] = {r->num_prompt, r->num_output};
    const int OUT = 1 << 30; /* flag bits above the output count */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < n[k]; i++) {
            int32_t t = ids[k][i];
            if (t < 0 || t >= vocab) continue;
            if (k == 1) cnt[t] = (cnt[t] | OUT) + 1;
            else cnt[t] |= 1 << 29; /* seen in the prompt */
        }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < n[k]; i++) {
            int32_t t = ids[k][i];
            if (t < 0 || t >= vocab || cnt[t] == 0) continue; /* applied already */
            float x = logits[t];
            if (r->repetition_penalty != 1.0f)
                x = x > 0.0f ? x / r->repetition_penalty : x * r->repetition_penalty;
            if (cnt[t] & OUT) {
                int count = cnt[t] & ((1 << 29) - 1);
                x -= r->frequency_penalty * (float)count + r->presence_penalty;
            }
            logits[t] = x;
            cnt[t] = 0;
        }
}

/* log(sum exp(x)) over the row, NaNs skipped; -inf if every logit is -inf or NaN. */
static double log_sum_exp(const float *x, int vocab) {
    float m = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (x[i] > m) m = x[i];
    if (!isfinite(m)) return m;
    double s = 0.0;
    for (int i = 0; i < vocab; i++)
        if (!isnan(x[i])) s += exp((double)x[i] - m);
    return m + log(s);
}

/* The k best ids of x (value desc, id asc; NaN never), as log-probs x - lse. */
static void top_logprobs(const float *x, int vocab, double lse, int k, int32_t *ids, float *lp) {
    int n = 0;
    for (int i = 0; i < vocab && k > 0; i++) {
        if (isnan(x[i])) continue;
        if (n == k && !(x[i] > x[ids[n - 1]])) continue; /* ties: the lower id, seen first, stays */
        int j = n < k ? n++ : k - 1;
        while (j > 0 && x[i] > x[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    for (int j = 0; j < n; j++) lp[j] = (float)((double)x[ids[j]] - lse);
    for (int j = n; j < k; j++) ids[j] = -1, lp[j] = -INFINITY;
}

/* ---------------------------------------------------------------------------------------------
 * Sampling */

static int32_t sample_filtered(float *logits, int vocab, const SamplingRow *p, float *w, int *idx);

int32_t sampler_sample(float *logits, int vocab, const SamplingRow *p, void *scratch,
                       float *logprob, int32_t *top_ids, float *top_lp) {
    CHECK(vocab > 0, "vocab %d", vocab);
    void *owned = NULL;
    if (!scratch) scratch = owned = xcalloc(1, sampler_scratch_bytes(vocab));
    float *w = scratch;                 /* [vocab] unnormalized probabilities */
    int *idx = (int *)(w + vocab);      /* [vocab] token ids, reordered by selection; penalty counts */
    float *raw = (float *)(idx + vocab); /* [vocab] the logits before penalties (log-probs only) */
    const int penalties = sampling_row_has_penalty(p);
    const float *lp_src = logits;
    double lse = 0.0;
    if (p->num_logprobs >= 0) {
        lse = log_sum_exp(logits, vocab);
        int k = p->num_logprobs < CVLLM_MAX_LOGPROBS ? p->num_logprobs : CVLLM_MAX_LOGPROBS;
        if (k > 0) top_logprobs(logits, vocab, lse, k, top_ids, top_lp);
        if (penalties) {
            memcpy(raw, logits, (size_t)vocab * sizeof(float));
            lp_src = raw;
        }
    }
    if (penalties) {
        memset(idx, 0, (size_t)vocab * sizeof(int));
        apply_penalties(logits, p, vocab, idx);
    }
    int32_t token = sample_filtered(logits, vocab, p, w, idx);
    if (p->num_logprobs >= 0 && logprob) *logprob = (float)((double)lp_src[token] - lse);
    free(owned);
    return token;
}

/* The exponential race over penalized logits (no filter; philox.h): the id of the largest key
 * x_i - T ln(-ln u_i), computed as fma(-(T ln 2), log2(E_i), x_i) with E_i = -ln(u_i) (the CUDA
 * sampler's form), the lowest id on ties, NaN never. A key is at most x_i - T ln 2 * LMIN, LMIN
 * the smallest log2(-ln(u)) of any uniform, so an id whose bound does not beat the best key so far
 * cannot win and its uniform is not computed: the same token as the full pass, faster where the
 * logits are peaked. imax: the argmax (a finite logit), whose key starts the race. With AVX2,
 * sampler_race_avx2: the same race and uniforms with its own vector log (a few ulp from logf /
 * log2f), so the token may differ only where two keys are within a few ulp of each other. */
static float race_key(const CvllmRaceKey *k, float t2, float x, int i) {
    return fmaf(-t2, log2f(-logf(cvllm_race_uniform(*k, (uint32_t)i))), x);
}

static int32_t race(const float *x, int vocab, const SamplingRow *p, int imax) {
    const CvllmRaceKey k = cvllm_race_key(p->seed, (uint64_t)p->num_output);
    const float t2 = cvllm_race_t2(p->temperature);
#if defined(__x86_64__)
    if (cpu_isa_get() >= CPU_ISA_AVX2) return sampler_race_avx2(x, vocab, t2, k, imax);
#endif
    const float lmin = log2f(-logf(1.0f - 5.9604644775390625e-8f)); /* u = 1 - 2^-24 */
    int32_t tok = imax;
    float best = race_key(&k, t2, x[imax], imax);
    for (int i = 0; i < vocab; i++) {
        if (!(fmaf(-t2, lmin, x[i]) >= best)) continue; /* cannot win (or NaN) */
        const float key = race_key(&k, t2, x[i], i);
        if (key > best || (key == best && i < tok)) best = key, tok = i;
    }
    return tok;
}

/* Temperature, filters and the draw over penalized logits. */
static int32_t sample_filtered(float *logits, int vocab, const SamplingRow *p, float *w, int *idx) {
    if (!(p->temperature > 0.0f)) return argmax(logits, vocab);

    int imax = argmax(logits, vocab);
    float m = logits[imax];
    if (!isfinite(m)) return imax; /* all -inf (or +inf): nothing to weigh; greedy */
    const int use_top_k = p->top_k > 0 && p->top_k < vocab;
    const int use_top_p = p->top_p > 0.0f && p->top_p < 1.0f;
    if (!use_top_k && !use_top_p && !(p->min_p > 0.0f)) return race(logits, vocab, p, imax);

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
    double target = cvllm_uniform(p->seed, (uint64_t)p->num_output) * kept, cum = 0.0;
    int32_t token = imax;
    for (int i = 0; i < vocab; i++) {
        if (!(w[i] > 0.0f && w[i] >= min_w && (bound < 0 || !better(w, bound, i)))) continue;
        token = i;
        cum += w[i];
        if (cum > target) break;
    }
    return token;
}
