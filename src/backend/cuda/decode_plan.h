/* decode_plan.h: how the decode attention splits a step's keys into work items (plain C: the
 * CUDA backend builds a plan on the host every decode step; tests/test_decode_plan.c checks it
 * without a GPU).
 *
 * Every sequence's context is cut into items of `part` keys (its last item shorter; a sequence
 * with no keys still gets one, empty, item), and a fixed grid of grid_x blocks per (kv head,
 * head chunk) walks the items (block b: items b, b + grid_x, ...). The grid never changes, so a
 * CUDA graph captured once runs every step's plan: the plan is data in device memory. `part` is
 * chosen per step from the total context so that there are about DECODE_PLAN_ITEMS_PER_BLOCK
 * items per block: long and short sequences alike end up in items of the same size, and no block
 * is left with one long sequence while the others idle (the tail of a one-block-per-sequence
 * grid). The partial softmax states of a sequence with more than one item are merged by a second
 * kernel; a sequence of one item is written out directly.
 *
 * Layout of the int32 array (decode_plan_ints(max_seqs, cap) of them):
 *   [0] n_items  [1] part  [2] cap  [3] max_seqs
 *   [4 .. 4 + max_seqs]                       item_off: sequence s has items item_off[s] .. item_off[s + 1] - 1
 *   [5 + max_seqs .. 5 + max_seqs + cap - 1]  item_seq: the sequence of each item
 * Item i of sequence s covers keys (i - item_off[s]) * part .. min(ctx, that + part) - 1. */
#ifndef CVLLM_BACKEND_CUDA_DECODE_PLAN_H
#define CVLLM_BACKEND_CUDA_DECODE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#define DECODE_PLAN_HEADER 4
#define DECODE_PLAN_MIN_PART 64 /* keys: an item's fixed cost (table staging, merges) stays small */
#define DECODE_PLAN_ITEMS_PER_BLOCK 8
#define DECODE_PLAN_BLOCKS_PER_SM 4 /* the decode kernel's occupancy (4 warps, <= 128 registers) */

/* The grid's x size: enough blocks of every (kv head, chunk) unit to fill num_sms SMs once. */
int decode_plan_grid_x(int units, int num_sms);
/* The most items a plan for at most max_seqs sequences can hold. */
int decode_plan_capacity(int max_seqs, int grid_x);
/* Ints in a plan array. */
size_t decode_plan_ints(int max_seqs, int cap);
/* Ints of a built plan's array that carry data: the header, offsets and its n_items items. */
size_t decode_plan_used_ints(const int32_t *plan);
/* Builds the plan of S sequences (ctx[s] keys each; S <= max_seqs) into plan. Returns n_items. */
int decode_plan_build(int32_t *plan, const int32_t *ctx, int S, int max_seqs, int grid_x);

#endif
