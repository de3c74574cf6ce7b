/* block_manager.h: CPU bookkeeping of the paged KV cache (no device memory here): a pool of
 * num_blocks blocks of block_size tokens, a free list, ref counts, and the prefix cache.
 *
 * Prefix caching: the hash of a full block i of a sequence is XXH64 over (hash of block i-1, or 0
 * for the first block) followed by the block's token ids (exact byte layout in block_manager.c). A
 * lookup hit is confirmed by comparing token ids, and also the previous block's hash and the
 * block's position (a colliding hash with other tokens, or the same tokens in another context, is
 * a miss). Lookups stop at the first miss. Partial blocks are never looked up or shared.
 *
 * When is a registered block a hit? The full blocks of a prompt are registered when they are
 * allocated, but found only once a step has been scheduled to write their K/V
 * (block_manager_mark_scheduled), from that step on: a request admitted later in the same step
 * hits them (the backend contract: every K/V store of a layer precedes that layer's attention
 * reads), a request admitted before the chunk that writes them does not. Blocks filled by decoding
 * are registered after the step that computed them (block_manager_commit). A registered block that
 * no step wrote loses its hash when freed. Freed blocks keep their hash (and stay findable) until they are
 * taken for reuse: new blocks come from the head of a FIFO free list, freed hashed blocks go to
 * its tail (a sequence's blocks last first), freed blocks without a hash to its head. */
#ifndef CVLLM_ENGINE_BLOCK_MANAGER_H
#define CVLLM_ENGINE_BLOCK_MANAGER_H

#include <stdint.h>

#include "engine/sequence.h"

typedef struct BlockManager BlockManager;
typedef uint64_t (*BlockHashFn)(uint64_t prev_hash, const int32_t *tokens, int n);

BlockManager *block_manager_create(int num_blocks, int block_size, int enable_prefix_caching);
void block_manager_destroy(BlockManager *bm); /* accepts NULL */

/* The default chained hash (XXH64). */
uint64_t block_hash(uint64_t prev_hash, const int32_t *tokens, int n);
/* Replaces the hash function (tests force collisions with it). */
void block_manager_set_hash_fn(BlockManager *bm, BlockHashFn fn);

/* True if the free blocks suffice for all of seq's current tokens (prefix hits counted as needing
 * no new block only when the hit block is in use by another sequence). */
int block_manager_can_allocate(const BlockManager *bm, const Sequence *seq);
/* Builds seq's block table for all its tokens, reusing prefix-cache hits (ref count + 1). Sets
 * seq->num_hit_tokens (= hit blocks * block_size) and seq->num_computed_tokens =
 * min(num_hit_tokens, num_tokens - 1) (the last token is always computed to get logits).
 * Requires can_allocate. */
void block_manager_allocate(BlockManager *bm, Sequence *seq);
/* Releases seq's blocks (ref count - 1; a block returns to the free list at 0, keeping its hash);
 * clears the table and sets num_computed_tokens = num_hit_tokens = 0. */
void block_manager_deallocate(BlockManager *bm, Sequence *seq);
/* True if seq (whose last token is about to be computed) can get the block that token needs. */
int block_manager_can_append(const BlockManager *bm, const Sequence *seq);
/* Makes the block table cover seq->num_tokens tokens (allocates a block at a boundary). */
void block_manager_append(BlockManager *bm, Sequence *seq);
/* Called after a step computed seq's K/V up to seq->num_computed_tokens: registers the hash of
 * every block that is now full and computed and not yet registered (prefix caching on). */
void block_manager_commit(BlockManager *bm, Sequence *seq);
/* The scheduler's step counter: lookups during this step find blocks written up to this step. */
void block_manager_begin_step(BlockManager *bm, int64_t step);
/* seq is scheduled to compute its tokens up to end (exclusive) in the current step: its
 * registered blocks that end by then become hittable from this step on. */
void block_manager_mark_scheduled(BlockManager *bm, Sequence *seq, int end);
/* The step failed: blocks it was to write are no longer hittable. Every sequence of that step
 * must then be deallocated (mark_scheduled keeps a per-sequence watermark of marked blocks). */
void block_manager_forget_step(BlockManager *bm, int64_t step);

int block_manager_num_free(const BlockManager *bm);
int block_manager_num_blocks(const BlockManager *bm);
int block_manager_block_size(const BlockManager *bm); /* tokens per block */
int block_manager_ref_count(const BlockManager *bm, int block_id);   /* for tests */
int block_manager_block_hash(const BlockManager *bm, int block_id, uint64_t *hash); /* 1 if set */
int64_t block_manager_queries(const BlockManager *bm); /* full blocks looked up (hits + first miss) */
int64_t block_manager_hits(const BlockManager *bm);
int64_t block_manager_query_tokens(const BlockManager *bm); /* tokens of allocated sequences */
int64_t block_manager_hit_tokens(const BlockManager *bm);   /* of which prefix-cache hits */
int block_manager_num_cached_free(const BlockManager *bm);  /* free blocks keeping a hash */

#endif
