/* block_manager.c: CPU bookkeeping of the paged KV cache (nano-vllm's BlockManager).
 *
 * Data layout (all carved at create, nothing allocated per step):
 *   blocks[num_blocks]             ref count, registered hash, free-list links, hash-chain link
 *   tokens[num_blocks * block_size] the token ids a registered block holds (hit confirmation)
 *   buckets[num_buckets]           hash -> first block of a chain (chained through Block.hnext)
 *
 * Free list: a doubly linked FIFO. New blocks are taken from the head. A freed block that carries
 * a hash goes to the tail, so it stays findable in the prefix cache as long as possible; a freed
 * block without a hash (partial, or never computed) goes to the head, since it has nothing to keep.
 * A hit on a free block takes it out of the middle of the list (O(1) with the links).
 *
 * Hash map: several blocks may carry the same hash (a real collision, a forced one in tests, or
 * two sequences that computed the same prefix in the same step). A lookup walks the chain and
 * accepts a block only if its hash, the previous block's hash, its position in the sequence and
 * its block_size token ids all match; it prefers a block already in use (that costs no free block).
 *
 * Chained hash of block i of a sequence (block_hash):
 *   h(-1) = 0 (BLOCK_HASH_ROOT)
 *   h(i)  = XXH64(seed 0, bytes = le64(h(i-1)) || le32(t[i*bs]) || ... || le32(t[i*bs + bs-1]))
 * (little-endian encoding, so the value does not depend on the host). */
#include "engine/block_manager.h"

#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "common.h"

#define BLOCK_HASH_ROOT 0ULL /* the "previous hash" of a sequence's first block */

typedef struct {
    int ref;                /* sequences using the block; 0 = on the free list */
    int has_hash;           /* registered in the hash map */
    uint64_t hash;          /* chained hash (valid if has_hash) */
    uint64_t prev_hash;     /* hash of the block before it in the sequence that registered it */
    int pos;                /* its index in that sequence's block table */
    int free_prev, free_next; /* free-list links (-1 = none) */
    int hnext;              /* next block in the same hash bucket (-1 = none) */
    int64_t ready_step;     /* registered block: the step that writes (or wrote) its K/V;
                               BLOCK_NOT_READY until a step is scheduled to write it */
} Block;

#define BLOCK_NOT_READY INT64_MAX

struct BlockManager {
    int num_blocks, block_size, enable_prefix_caching;
    Block *blocks;      /* [num_blocks], owned */
    int32_t *tokens;    /* [num_blocks * block_size], owned */
    int *buckets;       /* [num_buckets], owned */
    uint64_t bucket_mask;
    int free_head, free_tail, num_free;
    BlockHashFn hash_fn;
    int64_t queries, hits, query_tokens, hit_tokens;
    int64_t step;       /* the step being scheduled (block_manager_begin_step) */
};

/* ---------------------------------------------------------------------------------------------
 * Hash */

uint64_t block_hash(uint64_t prev_hash, const int32_t *tokens, int n) {
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    unsigned char buf[256];
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(prev_hash >> (8 * i));
    XXH64_update(&st, buf, 8);
    int len = 0;
    for (int i = 0; i < n; i++) {
        uint32_t t = (uint32_t)tokens[i];
        buf[len++] = (unsigned char)t;
        buf[len++] = (unsigned char)(t >> 8);
        buf[len++] = (unsigned char)(t >> 16);
        buf[len++] = (unsigned char)(t >> 24);
        if (len == (int)sizeof(buf)) {
            XXH64_update(&st, buf, (size_t)len);
            len = 0;
        }
    }
    if (len) XXH64_update(&st, buf, (size_t)len);
    return XXH64_digest(&st);
}

void block_manager_set_hash_fn(BlockManager *bm, BlockHashFn fn) { bm->hash_fn = fn ? fn : block_hash; }

/* ---------------------------------------------------------------------------------------------
 * Lifecycle */

BlockManager *block_manager_create(int num_blocks, int block_size, int enable_prefix_caching) {
    CHECK(num_blocks > 0 && block_size > 0, "num_blocks %d, block_size %d", num_blocks, block_size);
    BlockManager *bm = xcalloc(1, sizeof(*bm));
    bm->num_blocks = num_blocks;
    bm->block_size = block_size;
    bm->enable_prefix_caching = enable_prefix_caching;
    bm->blocks = xcalloc((size_t)num_blocks, sizeof(Block));
    bm->tokens = xcalloc((size_t)num_blocks * (size_t)block_size, sizeof(int32_t));
    size_t nb = 16;
    while (nb < (size_t)num_blocks) nb *= 2;
    bm->buckets = xmalloc(nb * sizeof(int));
    for (size_t i = 0; i < nb; i++) bm->buckets[i] = -1;
    bm->bucket_mask = nb - 1;
    for (int i = 0; i < num_blocks; i++) {
        Block *b = &bm->blocks[i];
        b->free_prev = i - 1;
        b->free_next = i + 1 < num_blocks ? i + 1 : -1;
        b->hnext = -1;
    }
    bm->free_head = 0;
    bm->free_tail = num_blocks - 1;
    bm->num_free = num_blocks;
    bm->hash_fn = block_hash;
    return bm;
}

void block_manager_destroy(BlockManager *bm) {
    if (!bm) return;
    free(bm->blocks);
    free(bm->tokens);
    free(bm->buckets);
    free(bm);
}

/* ---------------------------------------------------------------------------------------------
 * Free list */

static void free_list_unlink(BlockManager *bm, int id) {
    Block *b = &bm->blocks[id];
    if (b->free_prev >= 0) bm->blocks[b->free_prev].free_next = b->free_next;
    else bm->free_head = b->free_next;
    if (b->free_next >= 0) bm->blocks[b->free_next].free_prev = b->free_prev;
    else bm->free_tail = b->free_prev;
    b->free_prev = b->free_next = -1;
    bm->num_free--;
}

static void free_list_push_tail(BlockManager *bm, int id) {
    Block *b = &bm->blocks[id];
    b->free_next = -1;
    b->free_prev = bm->free_tail;
    if (bm->free_tail >= 0) bm->blocks[bm->free_tail].free_next = id;
    else bm->free_head = id;
    bm->free_tail = id;
    bm->num_free++;
}

static void free_list_push_head(BlockManager *bm, int id) {
    Block *b = &bm->blocks[id];
    b->free_prev = -1;
    b->free_next = bm->free_head;
    if (bm->free_head >= 0) bm->blocks[bm->free_head].free_prev = id;
    else bm->free_tail = id;
    bm->free_head = id;
    bm->num_free++;
}

/* ---------------------------------------------------------------------------------------------
 * Hash map */

static void map_insert(BlockManager *bm, int id) {
    Block *b = &bm->blocks[id];
    uint64_t k = b->hash & bm->bucket_mask;
    b->hnext = bm->buckets[k];
    bm->buckets[k] = id;
    b->has_hash = 1;
}

static void map_remove(BlockManager *bm, int id) {
    Block *b = &bm->blocks[id];
    int *link = &bm->buckets[b->hash & bm->bucket_mask];
    while (*link != id) {
        CHECK(*link >= 0, "block %d not in its hash bucket", id);
        link = &bm->blocks[*link].hnext;
    }
    *link = b->hnext;
    b->hnext = -1;
    b->has_hash = 0;
}

/* The block registered for (hash, prev_hash, pos, tokens), preferring one in use; -1 if none. */
static int map_lookup(const BlockManager *bm, uint64_t hash, uint64_t prev_hash, int pos,
                      const int32_t *tokens) {
    int found = -1;
    for (int id = bm->buckets[hash & bm->bucket_mask]; id >= 0; id = bm->blocks[id].hnext) {
        const Block *b = &bm->blocks[id];
        if (b->hash != hash || b->prev_hash != prev_hash || b->pos != pos) continue;
        if (b->ready_step > bm->step) continue; /* its K/V comes in a later step */
        if (memcmp(bm->tokens + (size_t)id * bm->block_size, tokens,
                   (size_t)bm->block_size * sizeof(int32_t)) != 0)
            continue;
        if (b->ref > 0) return id;
        if (found < 0) found = id;
    }
    return found;
}

/* Registers block id as full block pos of a sequence (prev = the hash of block pos-1). */
static void register_block(BlockManager *bm, int id, uint64_t prev, int pos, const int32_t *t,
                           int64_t ready_step) {
    Block *b = &bm->blocks[id];
    CHECK(!b->has_hash && b->ref == 1, "registering block %d (pos %d): has_hash %d, ref %d", id,
          pos, b->has_hash, b->ref);
    memcpy(bm->tokens + (size_t)id * bm->block_size, t, (size_t)bm->block_size * sizeof(int32_t));
    b->hash = bm->hash_fn(prev, t, bm->block_size);
    b->prev_hash = prev;
    b->pos = pos;
    b->ready_step = ready_step;
    map_insert(bm, id);
}

/* ---------------------------------------------------------------------------------------------
 * Allocation */

/* Takes the free-list head for new content: drops its stale hash, ref = 1. */
static int take_new_block(BlockManager *bm) {
    int id = bm->free_head;
    CHECK(id >= 0, "no free block (call can_allocate / can_append first)");
    free_list_unlink(bm, id);
    Block *b = &bm->blocks[id];
    CHECK(b->ref == 0, "free block %d has ref %d", id, b->ref);
    if (b->has_hash) map_remove(bm, id);
    b->ref = 1;
    return id;
}

static void table_reserve(Sequence *seq, int n) {
    if (seq->cap_blocks >= n) return;
    int cap = seq->cap_blocks ? seq->cap_blocks : 8;
    while (cap < n) cap *= 2;
    seq->block_table = xrealloc(seq->block_table, (size_t)cap * sizeof(int32_t));
    seq->cap_blocks = cap;
}

/* Looks up full block i of seq (prev = hash of block i-1, or BLOCK_HASH_ROOT). Returns the hit
 * block or -1, and the block's hash in *hash. */
static int prefix_lookup(const BlockManager *bm, const Sequence *seq, int i, uint64_t prev,
                         uint64_t *hash) {
    const int32_t *t = seq->token_ids + (size_t)i * bm->block_size;
    *hash = bm->hash_fn(prev, t, bm->block_size);
    return map_lookup(bm, *hash, prev, i, t);
}

int block_manager_can_allocate(const BlockManager *bm, const Sequence *seq) {
    int need = blocks_for_tokens(seq->num_tokens, bm->block_size);
    if (bm->enable_prefix_caching) {
        int nfull = seq->num_tokens / bm->block_size;
        uint64_t prev = BLOCK_HASH_ROOT, h;
        for (int i = 0; i < nfull; i++, prev = h) {
            int id = prefix_lookup(bm, seq, i, prev, &h);
            if (id < 0) break;
            if (bm->blocks[id].ref > 0) need--; /* shared: no free block consumed */
        }
    }
    return need <= bm->num_free;
}

void block_manager_allocate(BlockManager *bm, Sequence *seq) {
    CHECK(seq->num_blocks == 0, "seq %lld already has %d blocks", (long long)seq->id,
          seq->num_blocks);
    int bs = bm->block_size;
    int total = blocks_for_tokens(seq->num_tokens, bs);
    table_reserve(seq, total);
    /* Hits first (they are the leading blocks), so that a hit free block leaves the free list
     * before new blocks are taken from its head. Partial blocks are never looked up. */
    int hits = 0, looked_up = 0;
    if (bm->enable_prefix_caching) {
        int nfull = seq->num_tokens / bs;
        uint64_t prev = BLOCK_HASH_ROOT, h;
        for (int i = 0; i < nfull; i++, prev = h) {
            looked_up++;
            int id = prefix_lookup(bm, seq, i, prev, &h);
            if (id < 0) break; /* first miss: every following block is new */
            Block *b = &bm->blocks[id];
            if (b->ref == 0) free_list_unlink(bm, id);
            b->ref++;
            seq->block_table[hits++] = id;
        }
    }
    for (int i = hits; i < total; i++) seq->block_table[i] = take_new_block(bm);
    seq->num_blocks = total;
    seq->num_registered_blocks = hits;
    seq->num_marked_blocks = hits; /* a hit's K/V was written by a step scheduled already */
    /* The new full blocks are registered now, not once computed, so that a request admitted
     * later in the same step finds them: they become hittable when a step is scheduled to write
     * them (block_manager_mark_scheduled), since within a step every K/V store of a layer
     * precedes that layer's attention reads. */
    if (bm->enable_prefix_caching) {
        int nfull = seq->num_tokens / bs;
        for (int i = hits; i < nfull; i++) {
            uint64_t prev = i ? bm->blocks[seq->block_table[i - 1]].hash : BLOCK_HASH_ROOT;
            register_block(bm, seq->block_table[i], prev, i, seq->token_ids + (size_t)i * bs,
                           BLOCK_NOT_READY);
        }
        if (nfull > hits) seq->num_registered_blocks = nfull;
    }
    seq->num_hit_tokens = hits * bs;
    int last = seq->num_tokens > 0 ? seq->num_tokens - 1 : 0;
    seq->num_computed_tokens = seq->num_hit_tokens < last ? seq->num_hit_tokens : last;
    bm->queries += looked_up;
    bm->hits += hits;
    bm->query_tokens += seq->num_tokens;
    bm->hit_tokens += seq->num_hit_tokens;
}

void block_manager_begin_step(BlockManager *bm, int64_t step) { bm->step = step; }

/* Only the blocks past seq's watermark: the ones before it became hittable at an earlier step
 * (or now) and stay so, since ready_step only goes back (block_manager_forget_step) for blocks
 * marked in a step that failed, and a failed step's sequences are all deallocated. (Walking the
 * whole table every step was a third of the engine's host time on the default benchmark
 * workload.) */
void block_manager_mark_scheduled(BlockManager *bm, Sequence *seq, int end) {
    int full = end / bm->block_size;
    if (full > seq->num_registered_blocks) full = seq->num_registered_blocks;
    for (int i = seq->num_marked_blocks; i < full; i++) {
        Block *b = &bm->blocks[seq->block_table[i]];
        if (b->ready_step > bm->step) b->ready_step = bm->step;
    }
    if (full > seq->num_marked_blocks) seq->num_marked_blocks = full;
}

void block_manager_forget_step(BlockManager *bm, int64_t step) {
    for (int id = 0; id < bm->num_blocks; id++) {
        Block *b = &bm->blocks[id];
        if (b->has_hash && b->ready_step == step) b->ready_step = BLOCK_NOT_READY;
    }
}

void block_manager_deallocate(BlockManager *bm, Sequence *seq) {
    /* Last block first: the tail of a chain is evicted before its head (a chain is only reachable
     * through its first blocks, so keeping those longest keeps the most reachable). */
    for (int i = seq->num_blocks - 1; i >= 0; i--) {
        int id = seq->block_table[i];
        Block *b = &bm->blocks[id];
        CHECK(b->ref > 0, "block %d of seq %lld has ref %d", id, (long long)seq->id, b->ref);
        if (--b->ref == 0) {
            if (b->has_hash && b->ready_step == BLOCK_NOT_READY) map_remove(bm, id); /* no K/V */
            if (b->has_hash) free_list_push_tail(bm, id);
            else free_list_push_head(bm, id);
        }
    }
    seq->num_blocks = 0;
    seq->num_registered_blocks = 0;
    seq->num_marked_blocks = 0;
    seq->num_computed_tokens = 0;
    seq->num_hit_tokens = 0;
}

int block_manager_can_append(const BlockManager *bm, const Sequence *seq) {
    int need = blocks_for_tokens(seq->num_tokens, bm->block_size) - seq->num_blocks;
    return need <= 0 || need <= bm->num_free;
}

void block_manager_append(BlockManager *bm, Sequence *seq) {
    int total = blocks_for_tokens(seq->num_tokens, bm->block_size);
    table_reserve(seq, total);
    while (seq->num_blocks < total) seq->block_table[seq->num_blocks++] = take_new_block(bm);
}

void block_manager_commit(BlockManager *bm, Sequence *seq) {
    if (!bm->enable_prefix_caching) return;
    int bs = bm->block_size;
    int computed = seq->num_computed_tokens < seq->num_tokens ? seq->num_computed_tokens : seq->num_tokens;
    int full = computed / bs;
    if (full > seq->num_blocks) full = seq->num_blocks;
    for (int i = seq->num_registered_blocks; i < full; i++) {
        uint64_t prev = BLOCK_HASH_ROOT;
        if (i > 0) {
            const Block *pb = &bm->blocks[seq->block_table[i - 1]];
            CHECK(pb->has_hash, "block %d before pos %d has no hash", seq->block_table[i - 1], i);
            prev = pb->hash;
        }
        register_block(bm, seq->block_table[i], prev, i, seq->token_ids + (size_t)i * bs, bm->step);
    }
    if (full > seq->num_registered_blocks) seq->num_registered_blocks = full;
}

/* ---------------------------------------------------------------------------------------------
 * Queries */

int block_manager_num_free(const BlockManager *bm) { return bm->num_free; }
int block_manager_num_blocks(const BlockManager *bm) { return bm->num_blocks; }
int block_manager_block_size(const BlockManager *bm) { return bm->block_size; }

int block_manager_ref_count(const BlockManager *bm, int block_id) {
    CHECK(block_id >= 0 && block_id < bm->num_blocks, "block id %d of %d", block_id, bm->num_blocks);
    return bm->blocks[block_id].ref;
}

int block_manager_block_hash(const BlockManager *bm, int block_id, uint64_t *hash) {
    CHECK(block_id >= 0 && block_id < bm->num_blocks, "block id %d of %d", block_id, bm->num_blocks);
    const Block *b = &bm->blocks[block_id];
    if (!b->has_hash) return 0;
    if (hash) *hash = b->hash;
    return 1;
}

int64_t block_manager_queries(const BlockManager *bm) { return bm->queries; }
int64_t block_manager_hits(const BlockManager *bm) { return bm->hits; }
int64_t block_manager_query_tokens(const BlockManager *bm) { return bm->query_tokens; }
int64_t block_manager_hit_tokens(const BlockManager *bm) { return bm->hit_tokens; }
int block_manager_num_cached_free(const BlockManager *bm) {
    int n = 0;
    for (int id = bm->free_head; id >= 0; id = bm->blocks[id].free_next) n += bm->blocks[id].has_hash;
    return n;
}
