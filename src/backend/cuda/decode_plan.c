/* decode_plan.c: the decode attention's work items (see decode_plan.h). */
#include "backend/cuda/decode_plan.h"

int decode_plan_grid_x(int units, int num_sms) {
    if (units < 1) units = 1;
    if (num_sms < 1) num_sms = 1;
    const int g = (DECODE_PLAN_BLOCKS_PER_SM * num_sms + units - 1) / units;
    return g < 1 ? 1 : g;
}

int decode_plan_capacity(int max_seqs, int grid_x) {
    /* sum over s of max(1, ceil(ctx_s / part)) <= S + W / part <= S + ITEMS_PER_BLOCK * grid_x,
     * since part >= W / (ITEMS_PER_BLOCK * grid_x) (decode_plan_build) */
    return max_seqs + DECODE_PLAN_ITEMS_PER_BLOCK * grid_x;
}

size_t decode_plan_ints(int max_seqs, int cap) {
    return (size_t)DECODE_PLAN_HEADER + (size_t)max_seqs + 1 + (size_t)cap;
}

size_t decode_plan_used_ints(const int32_t *plan) {
    return (size_t)DECODE_PLAN_HEADER + (size_t)plan[3] + 1 + (size_t)plan[0];
}

int decode_plan_build(int32_t *plan, const int32_t *ctx, int S, int max_seqs, int grid_x) {
    int64_t W = 0;
    for (int s = 0; s < S; s++)
        W += ctx[s] > 0 ? ctx[s] : 0;
    const int64_t target = (int64_t)DECODE_PLAN_ITEMS_PER_BLOCK * grid_x;
    int64_t part = (W + target - 1) / target;
    part = (part + 31) / 32 * 32;
    if (part < DECODE_PLAN_MIN_PART) part = DECODE_PLAN_MIN_PART;
    int32_t *off = plan + DECODE_PLAN_HEADER, *seq = off + max_seqs + 1;
    int n = 0;
    for (int s = 0; s < S; s++) {
        off[s] = n;
        const int64_t c = ctx[s] > 0 ? ctx[s] : 0;
        int64_t k = (c + part - 1) / part;
        if (k < 1) k = 1;
        for (int64_t i = 0; i < k; i++)
            seq[n++] = s;
    }
    off[S] = n;
    plan[0] = n;
    plan[1] = (int32_t)part;
    plan[2] = decode_plan_capacity(max_seqs, grid_x);
    plan[3] = max_seqs;
    return n;
}
