/* test_kv.c - the KV block manager on its own (engine/serve/kv.h): reservation
 * and freeing, forks sharing blocks, copy-on-write of a shared partial block,
 * the prefix cache's publish, lookup and LRU eviction, running out of blocks.
 *
 * Expected values come from the contract in kv.h worked out by hand for
 * small pools (block ids are handed out lowest first from a fresh pool). */
#include <stdint.h>

#include "base/err.h"
#include "engine/serve/kv.h"
#include "tests/unit/test.h"

static kv_stats stats(const kv_pool *p)
{
    kv_stats s;
    kv_get_stats(p, &s);
    return s;
}

/* Reserves tokens [from, from + n) of t and marks them written, expecting no copy. */
static int grow(kv_pool *p, kv_table *t, int32_t from, int32_t n)
{
    int32_t src = -1, dst = -1;
    int rc = kv_reserve(p, t, from, n, &src, &dst);
    if (rc < 0)
        return rc;
    if (rc != 0)
        return rd_fail(RD_EINVAL, "grow: unexpected copy %d -> %d", src, dst);
    kv_written(p, t, from, n);
    return 0;
}

/* Deterministic prompt tokens: salt picks the sequence. */
static void fill_prompt(int32_t *p, int32_t n, int32_t salt)
{
    for (int32_t i = 0; i < n; i++)
        p[i] = 100 * salt + i;
}

static void test_create_bad_args(void)
{
    kv_pool *p = (kv_pool *)1;
    CHECK(kv_create(0, 16, &p) == RD_EINVAL && p == NULL, "0 blocks accepted");
    CHECK(kv_create(4, 0, &p) == RD_EINVAL && p == NULL, "block size 0 accepted");
    CHECK(kv_create(-3, 16, &p) == RD_EINVAL, "negative blocks accepted");
    kv_destroy(NULL);
}

static void test_reserve_free_accounting(void)
{
    kv_pool *p;
    CHECK_OK(kv_create(8, 4, &p));
    kv_stats s = stats(p);
    CHECK(s.block_size == 4 && s.blocks_total == 8 && s.blocks_used == 0 && s.peak_used == 0, "fresh pool %d/%d",
          s.blocks_used, s.blocks_total);

    kv_table t = {0};
    int32_t src = -1, dst = -1;
    /* 5 tokens need 2 blocks of 4, lowest ids first. */
    CHECK(kv_reserve(p, &t, 0, 5, &src, &dst) == 0, "reserve 5");
    CHECK(t.n == 2 && t.ids[0] == 0 && t.ids[1] == 1, "table n %d ids %d %d", t.n, t.ids[0], t.ids[1]);
    CHECK(stats(p).blocks_used == 2, "used %d after 5 tokens", stats(p).blocks_used);
    kv_written(p, &t, 0, 5);
    s = stats(p);
    /* 5 of 8 slots hold a token. */
    CHECK(s.peak_used == 2 && fabs(s.waste - 3.0 / 8) < 1e-12 && fabs(s.waste_at_peak - 3.0 / 8) < 1e-12,
          "peak %d waste %g at peak %g", s.peak_used, s.waste, s.waste_at_peak);

    /* Tokens 5..7 fit the second block: nothing new. Token 8 opens a third. */
    CHECK(kv_reserve(p, &t, 5, 3, &src, &dst) == 0 && t.n == 2, "reserve within the last block took %d", t.n);
    kv_written(p, &t, 5, 3);
    CHECK(kv_reserve(p, &t, 8, 1, &src, &dst) == 0 && t.n == 3 && t.ids[2] == 2, "third block: n %d", t.n);
    kv_written(p, &t, 8, 1);
    s = stats(p);
    CHECK(s.blocks_used == 3 && s.peak_used == 3 && fabs(s.waste - 3.0 / 12) < 1e-12, "used %d peak %d waste %g",
          s.blocks_used, s.peak_used, s.waste);
    /* A multi-block reservation at once. */
    CHECK(kv_reserve(p, &t, 9, 10, &src, &dst) == 0 && t.n == 5, "19 tokens: n %d", t.n);
    CHECK(src == -1 && dst == -1, "a private table asked for a copy %d -> %d", src, dst);
    /* The peak is judged when slots are written, not when they are reserved. */
    CHECK(stats(p).peak_used == 3, "peak %d before the writes", stats(p).peak_used);
    kv_written(p, &t, 9, 10);
    CHECK(stats(p).peak_used == 5, "peak %d after the writes", stats(p).peak_used);

    kv_free_seq(p, &t);
    CHECK(t.n == 0 && t.cap == 0 && t.ids == NULL, "freed table n %d cap %d", t.n, t.cap);
    s = stats(p);
    CHECK(s.blocks_used == 0 && s.blocks_cached == 0 && s.waste == 0.0 && s.peak_used == 5,
          "after free: used %d cached %d waste %g peak %d", s.blocks_used, s.blocks_cached, s.waste, s.peak_used);
    /* Freed blocks are reused: the whole pool is available again. */
    CHECK(kv_reserve(p, &t, 0, 32, &src, &dst) == 0 && t.n == 8, "whole pool after free: n %d", t.n);
    CHECK(stats(p).blocks_used == 8, "used %d", stats(p).blocks_used);
    kv_free_seq(p, &t);
    kv_free_seq(p, &t); /* freeing an empty table is harmless */
    CHECK(stats(p).blocks_used == 0, "used %d", stats(p).blocks_used);
    kv_destroy(p);
}

static void test_out_of_blocks(void)
{
    kv_pool *p;
    CHECK_OK(kv_create(4, 4, &p));
    kv_table a = {0}, b = {0}, c = {0};
    int32_t src = -1, dst = -1;
    CHECK_OK(grow(p, &a, 0, 12)); /* 3 blocks */
    /* 8 tokens need 2 blocks, 1 is left: refused, nothing taken. */
    CHECK(kv_reserve(p, &b, 0, 8, &src, &dst) == RD_ENOMEM, "over-reservation accepted");
    CHECK(b.n == 0 && stats(p).blocks_used == 3, "refusal took blocks: n %d used %d", b.n, stats(p).blocks_used);
    CHECK_OK(grow(p, &b, 0, 4)); /* the last block */
    CHECK(kv_reserve(p, &a, 12, 1, &src, &dst) == RD_ENOMEM && a.n == 3, "a grew past a full pool");
    CHECK(kv_reserve(p, &c, 0, 1, &src, &dst) == RD_ENOMEM && c.n == 0, "c got a block from a full pool");
    /* Within an already reserved block nothing is needed, even when the pool is full. */
    CHECK(kv_reserve(p, &b, 2, 2, &src, &dst) == 0, "reserving inside a held block failed");

    /* Copy-on-write needs a free block too: with the pool full it is refused and the share stays. */
    kv_free_seq(p, &b);
    kv_table f = {0};
    CHECK_OK(grow(p, &b, 0, 2)); /* b: 1 block, half full */
    CHECK_OK(kv_fork(p, &b, &f));
    int32_t shared = b.ids[0];
    CHECK(kv_reserve(p, &f, 2, 1, &src, &dst) == RD_ENOMEM, "copy made with no free block");
    CHECK(f.n == 1 && f.ids[0] == shared && stats(p).blocks_used == 4, "refused copy changed f: n %d id %d used %d",
          f.n, f.ids[0], stats(p).blocks_used);
    kv_free_seq(p, &a);
    kv_free_seq(p, &b);
    kv_free_seq(p, &f);
    kv_free_seq(p, &c);
    CHECK(stats(p).blocks_used == 0, "leaked %d blocks", stats(p).blocks_used);
    kv_destroy(p);
}

static void test_fork_refcounts(void)
{
    kv_pool *p;
    CHECK_OK(kv_create(8, 4, &p));
    kv_table par = {0}, c1 = {0}, c2 = {0};
    CHECK_OK(grow(p, &par, 0, 6)); /* blocks 0 (full) and 1 (2 of 4) */
    CHECK_OK(kv_fork(p, &par, &c1));
    CHECK_OK(kv_fork(p, &par, &c2));
    CHECK(c1.n == 2 && c2.n == 2 && c1.ids[0] == par.ids[0] && c2.ids[1] == par.ids[1], "forks do not share");
    CHECK(stats(p).blocks_used == 2, "a fork took blocks: used %d", stats(p).blocks_used);
    CHECK(kv_fork(p, &par, &c1) == RD_EINVAL && c1.n == 2, "fork into a held table");
    /* Blocks stay in use until their last holder lets go, in any order. */
    kv_free_seq(p, &par);
    CHECK(stats(p).blocks_used == 2, "freeing the parent freed shared blocks: used %d", stats(p).blocks_used);
    kv_free_seq(p, &c2);
    CHECK(stats(p).blocks_used == 2, "freeing one fork freed shared blocks: used %d", stats(p).blocks_used);
    kv_free_seq(p, &c1);
    CHECK(stats(p).blocks_used == 0, "last holder gone, used %d", stats(p).blocks_used);
    /* Forking an empty table is an empty table. */
    kv_table e = {0}, e2 = {0};
    CHECK_OK(kv_fork(p, &e, &e2));
    CHECK(e2.n == 0, "fork of empty has %d blocks", e2.n);
    kv_free_seq(p, &e2);
    kv_destroy(p);
}

static void test_copy_on_write(void)
{
    kv_pool *p;
    CHECK_OK(kv_create(8, 4, &p));
    kv_table par = {0}, c1 = {0}, c2 = {0};
    CHECK_OK(grow(p, &par, 0, 6)); /* a prompt of 6: block 0 full, block 1 partial (2 slots) */
    CHECK_OK(kv_fork(p, &par, &c1));
    CHECK_OK(kv_fork(p, &par, &c2));
    const int32_t full = par.ids[0], partial = par.ids[1];

    /* c1 writes token 6 into the shared partial block: it gets a private copy. */
    int32_t src = -1, dst = -1;
    CHECK(kv_reserve(p, &c1, 6, 1, &src, &dst) == 1, "no copy for a write into a shared block");
    CHECK(src == partial && dst != partial && dst != full, "copy %d -> %d (partial %d)", src, dst, partial);
    CHECK(c1.ids[1] == dst && c1.ids[0] == full && par.ids[1] == partial && c2.ids[1] == partial,
          "tables after the copy: c1 %d %d par %d c2 %d", c1.ids[0], c1.ids[1], par.ids[1], c2.ids[1]);
    kv_stats s = stats(p);
    /* The copy holds the 2 slots of the original: 3 blocks, 4 + 2 + 2 slots filled before the write. */
    CHECK(s.blocks_used == 3 && fabs(s.waste - 4.0 / 12) < 1e-12, "used %d waste %g", s.blocks_used, s.waste);
    kv_written(p, &c1, 6, 1);

    /* c2 also shares it (with the parent): a second copy. */
    src = dst = -1;
    CHECK(kv_reserve(p, &c2, 6, 1, &src, &dst) == 1 && src == partial && c2.ids[1] == dst && dst != c1.ids[1],
          "second copy %d -> %d", src, dst);
    /* Now the parent holds the partial block alone: it writes in place. */
    src = dst = -1;
    CHECK(kv_reserve(p, &par, 6, 1, &src, &dst) == 0 && par.ids[1] == partial && src == -1,
          "the last holder copied (%d -> %d)", src, dst);
    /* A write that starts a new block copies nothing, though the full block stays shared. */
    kv_table c3 = {0};
    kv_table q = {0};
    CHECK_OK(grow(p, &q, 0, 8)); /* two full blocks */
    CHECK_OK(kv_fork(p, &q, &c3));
    src = dst = -1;
    CHECK(kv_reserve(p, &c3, 8, 1, &src, &dst) == 0 && c3.n == 3 && c3.ids[1] == q.ids[1], "boundary write copied");
    kv_free_seq(p, &par);
    kv_free_seq(p, &c1);
    kv_free_seq(p, &c2);
    kv_free_seq(p, &c3);
    kv_free_seq(p, &q);
    CHECK(stats(p).blocks_used == 0, "leaked %d", stats(p).blocks_used);
    kv_destroy(p);
}

/* A sequence computes prompt[0, n) into t and publishes its full blocks under salt. */
static int compute_and_publish(kv_pool *p, kv_prefix *h, const int32_t *prompt, int32_t n, uint64_t salt,
                               kv_table *t)
{
    int hit = kv_prefix_lookup(p, h, prompt, n, salt, t);
    if (hit < 0)
        return hit;
    int32_t bs = stats(p).block_size, done = hit * bs, published = hit;
    int rc = grow(p, t, done, n - done);
    if (rc)
        return rc;
    kv_prefix_publish(p, h, prompt, t, n, salt, &published);
    return published;
}

static void test_prefix_publish_lookup(void)
{
    kv_pool *p;
    CHECK_OK(kv_create(16, 4, &p));
    int32_t prompt[13], other[13];
    fill_prompt(prompt, 13, 1);
    kv_prefix h = {0};
    kv_table t = {0};
    /* 13 tokens: 3 full blocks leave a token to compute; all 3 are published. */
    CHECK(compute_and_publish(p, &h, prompt, 13, 7, &t) == 3, "published");
    CHECK(h.n == 3 && h.salt == 7, "hashed %d blocks under %llu", h.n, (unsigned long long)h.salt);

    /* Another request with the same prompt and salt takes the 3 blocks. */
    kv_prefix h2 = {0};
    kv_table t2 = {0};
    CHECK(kv_prefix_lookup(p, &h2, prompt, 13, 7, &t2) == 3, "lookup of the same prompt");
    CHECK(t2.ids[0] == t.ids[0] && t2.ids[1] == t.ids[1] && t2.ids[2] == t.ids[2], "hit other blocks");
    CHECK(stats(p).blocks_used == 4, "a hit on held blocks took new ones: used %d", stats(p).blocks_used);
    kv_free_seq(p, &t2);

    /* A 12-token prompt hashes only 2 blocks (the last block must be computed for its logits). */
    kv_prefix h3 = {0};
    CHECK(kv_prefix_lookup(p, &h3, prompt, 12, 7, &t2) == 2 && h3.n == 2, "12 tokens: %d hashed", h3.n);
    kv_free_seq(p, &t2);
    kv_prefix_free(&h3);

    /* Another weight version (salt) finds nothing; h2 is rehashed in place. */
    CHECK(kv_prefix_lookup(p, &h2, prompt, 13, 8, &t2) == 0 && h2.salt == 8, "another salt hit");
    kv_free_seq(p, &t2);
    /* A prompt differing in block 1 shares only block 0 (the hashes chain). */
    memcpy(other, prompt, sizeof other);
    other[5] = 9999;
    kv_prefix_free(&h3);
    CHECK(kv_prefix_lookup(p, &h3, other, 13, 7, &t2) == 1 && t2.ids[0] == t.ids[0], "diverging prompt");
    kv_free_seq(p, &t2);
    kv_prefix_free(&h3);
    /* Same tokens from block 1 on but a different block 0: no hit at all. */
    memcpy(other, prompt, sizeof other);
    other[0] = 4242;
    CHECK(kv_prefix_lookup(p, &h3, other, 13, 7, &t2) == 0, "a later block matched without its parent");
    kv_free_seq(p, &t2);
    kv_prefix_free(&h3);

    /* Publishing under another salt than the hashes' does nothing. */
    kv_prefix hx = {0};
    int32_t px[9];
    fill_prompt(px, 9, 2);
    kv_table tx = {0};
    CHECK(kv_prefix_lookup(p, &hx, px, 9, 7, &tx) == 0, "fresh prompt hit");
    CHECK_OK(grow(p, &tx, 0, 9));
    int32_t pub = 0;
    kv_prefix_publish(p, &hx, px, &tx, 9, 8, &pub);
    CHECK(pub == 0, "published %d under a stale salt", pub);
    /* Only blocks the computed tokens complete are published. */
    kv_prefix_publish(p, &hx, px, &tx, 7, 7, &pub);
    CHECK(pub == 1, "7 computed tokens published %d blocks", pub);
    kv_prefix_publish(p, &hx, px, &tx, 9, 7, &pub);
    CHECK(pub == 2, "9 computed tokens published %d blocks", pub);
    kv_free_seq(p, &tx);
    kv_table ty = {0};
    CHECK(kv_prefix_lookup(p, &hx, px, 9, 7, &ty) == 2, "partly published prompt");
    /* A lookup wants an empty table. */
    CHECK(kv_prefix_lookup(p, &hx, px, 9, 7, &ty) == RD_EINVAL, "lookup into a full table");
    kv_free_seq(p, &ty);

    kv_free_seq(p, &t);
    kv_stats s = stats(p);
    /* Cached blocks nobody holds count as free. */
    CHECK(s.blocks_used == 0 && s.blocks_cached == 5, "idle: used %d cached %d", s.blocks_used, s.blocks_cached);
    /* A hit brings a cached block back with its contents: 3 full blocks, no waste. */
    CHECK(kv_prefix_lookup(p, &h, prompt, 13, 7, &t) == 3, "idle prefix missed");
    s = stats(p);
    CHECK(s.blocks_used == 3 && s.blocks_cached == 2 && s.waste == 0.0, "after the hit: used %d cached %d waste %g",
          s.blocks_used, s.blocks_cached, s.waste);
    kv_free_seq(p, &t);

    /* Same block 1 after a different block 0: its own chain link, published and found whole. */
    memcpy(other, prompt, sizeof other);
    other[0] = 4242;
    kv_prefix_free(&h3);
    CHECK(compute_and_publish(p, &h3, other, 13, 7, &t2) == 3, "second chain not published");
    kv_free_seq(p, &t2);
    CHECK(kv_prefix_lookup(p, &h3, other, 13, 7, &t2) == 3, "second chain: %d blocks", t2.n);
    kv_free_seq(p, &t2);
    kv_prefix_free(&h3);
    kv_prefix_free(&h);
    kv_prefix_free(&h2);
    kv_prefix_free(&hx);
    CHECK(h.hashes == NULL && h.n == 0, "kv_prefix_free left %d hashes", h.n);
    kv_destroy(p);
}

/* Cached blocks are evicted least recently freed first, and only when the
 * free stack is empty; a hit takes a block off the list. */
static void test_prefix_lru_eviction(void)
{
    kv_pool *p;
    CHECK_OK(kv_create(6, 2, &p));
    int32_t pr[4][3];
    kv_prefix h[4] = {{0}};
    kv_table t[4] = {{0}};
    for (int i = 0; i < 3; i++) {
        fill_prompt(pr[i], 3, 10 + i); /* 3 tokens: block 0 full (published), block 1 partial */
        CHECK(compute_and_publish(p, &h[i], pr[i], 3, 1, &t[i]) == 1, "prompt %d not published", i);
    }
    CHECK(stats(p).blocks_used == 6, "used %d", stats(p).blocks_used);
    /* Freed in the order 1, 2, 0: that is the eviction order. */
    int32_t cached[3] = {t[0].ids[0], t[1].ids[0], t[2].ids[0]};
    kv_free_seq(p, &t[1]);
    kv_free_seq(p, &t[2]);
    kv_free_seq(p, &t[0]);
    kv_stats s = stats(p);
    CHECK(s.blocks_used == 0 && s.blocks_cached == 3, "used %d cached %d", s.blocks_used, s.blocks_cached);

    /* The three uncached blocks go first: no eviction, every prefix still hits. */
    kv_table big = {0};
    CHECK_OK(grow(p, &big, 0, 6));
    CHECK(stats(p).blocks_cached == 3, "took a cached block while free ones were left");
    for (int j = 0; j < 3; j++)
        CHECK(big.ids[j] != cached[0] && big.ids[j] != cached[1] && big.ids[j] != cached[2], "evicted early");
    /* One more block evicts prompt 1's (freed first). */
    CHECK_OK(grow(p, &big, 6, 2));
    CHECK(big.ids[3] == cached[1], "evicted %d, want %d (least recently freed)", big.ids[3], cached[1]);
    CHECK(kv_prefix_lookup(p, &h[1], pr[1], 3, 1, &t[1]) == 0, "evicted prefix still hits");
    /* A hit on prompt 0 takes its block back into use, off the list... */
    CHECK(kv_prefix_lookup(p, &h[0], pr[0], 3, 1, &t[0]) == 1 && t[0].ids[0] == cached[0], "prompt 0 missed");
    s = stats(p);
    CHECK(s.blocks_used == 5 && s.blocks_cached == 1, "after the hit: used %d cached %d", s.blocks_used,
          s.blocks_cached);
    /* ...so the next eviction is prompt 2's, though prompt 0's was freed later. */
    CHECK_OK(grow(p, &big, 8, 2));
    CHECK(big.ids[4] == cached[2], "evicted %d, want %d", big.ids[4], cached[2]);
    CHECK(kv_prefix_lookup(p, &h[2], pr[2], 3, 1, &t[2]) == 0, "evicted prefix 2 still hits");
    /* Prompt 0's block is held: nothing is left to give. */
    int32_t src, dst;
    CHECK(kv_reserve(p, &big, 10, 1, &src, &dst) == RD_ENOMEM, "a held cached block was evicted");
    /* Freed again it rejoins the list and is the one evicted next. */
    kv_free_seq(p, &t[0]);
    CHECK(stats(p).blocks_cached == 1, "cached %d", stats(p).blocks_cached);
    CHECK_OK(grow(p, &big, 10, 2));
    CHECK(big.ids[5] == cached[0] && stats(p).blocks_cached == 0, "last eviction took %d", big.ids[5]);
    CHECK(kv_prefix_lookup(p, &h[0], pr[0], 3, 1, &t[0]) == 0, "evicted prefix 0 still hits");
    /* An evicted block republished under a new prefix serves that one. */
    kv_free_seq(p, &big);
    fill_prompt(pr[3], 3, 20);
    CHECK(compute_and_publish(p, &h[3], pr[3], 3, 1, &t[3]) == 1, "republish");
    kv_free_seq(p, &t[3]);
    CHECK(kv_prefix_lookup(p, &h[3], pr[3], 3, 1, &t[3]) == 1, "republished prefix missed");
    for (int i = 0; i < 4; i++) {
        kv_free_seq(p, &t[i]);
        kv_prefix_free(&h[i]);
    }
    CHECK(stats(p).blocks_used == 0, "leaked %d", stats(p).blocks_used);
    kv_destroy(p);
}

/* kv_prefix_flush: unused cached blocks become plain free blocks, held ones
 * are unpublished (free, not cached, when let go); lookups miss after it. */
static void test_prefix_flush(void)
{
    kv_pool *p;
    CHECK_OK(kv_create(16, 4, &p));
    int32_t prompt[13], other[9];
    fill_prompt(prompt, 13, 3);
    fill_prompt(other, 9, 4);
    kv_prefix h = {0}, h2 = {0}, h3 = {0};
    kv_table t = {0}, t2 = {0}, t3 = {0};
    CHECK(compute_and_publish(p, &h, prompt, 13, 7, &t) == 3, "published");
    kv_free_seq(p, &t);
    CHECK(compute_and_publish(p, &h2, other, 9, 7, &t2) == 2, "published, held");
    CHECK(stats(p).blocks_cached == 3 && stats(p).blocks_used == 3, "cached %d used %d", stats(p).blocks_cached,
          stats(p).blocks_used);
    CHECK(kv_prefix_flush(p) == 5, "flushed entries");
    CHECK(stats(p).blocks_cached == 0 && stats(p).blocks_used == 3, "after: cached %d used %d",
          stats(p).blocks_cached, stats(p).blocks_used);
    CHECK(kv_prefix_lookup(p, &h, prompt, 13, 7, &t) == 0, "flushed prefix hit");
    kv_free_seq(p, &t);
    CHECK(kv_prefix_lookup(p, &h3, other, 9, 7, &t3) == 0, "flushed held prefix hit");
    kv_free_seq(p, &t3);
    kv_free_seq(p, &t2);
    CHECK(stats(p).blocks_cached == 0 && stats(p).blocks_used == 0, "held blocks came back cached");
    /* Every block can be taken again, and publishing works after a flush. */
    CHECK(compute_and_publish(p, &h, prompt, 13, 7, &t) == 3, "republished");
    kv_free_seq(p, &t);
    kv_prefix_free(&h3); /* it holds other's hashes */
    CHECK(kv_prefix_lookup(p, &h3, prompt, 13, 7, &t3) == 3, "hit after republishing");
    kv_free_seq(p, &t3);
    kv_table all = {0};
    CHECK(grow(p, &all, 0, 64) == 0 && stats(p).blocks_used == 16, "the whole pool");
    kv_free_seq(p, &all);
    kv_prefix_free(&h);
    kv_prefix_free(&h2);
    kv_prefix_free(&h3);
    kv_destroy(p);
}

int main(void)
{
    RUN(test_create_bad_args);
    RUN(test_reserve_free_accounting);
    RUN(test_out_of_blocks);
    RUN(test_fork_refcounts);
    RUN(test_copy_on_write);
    RUN(test_prefix_publish_lookup);
    RUN(test_prefix_lru_eviction);
    RUN(test_prefix_flush);
    TEST_EXIT();
}
