// Prefix cache units (no model forward): the chained block hash and its namespace, the cache
// index (parent and token checks, duplicates, collisions, stale entries, LRU order) and the
// refcounted BlockPool around it (eviction only of idle blocks, only when the free list runs
// short; tails before prefixes). To add a case: build a pool with TestLayout and drive
// Allocate / Register / Free / MatchPrefix as the scheduler does.
#include "engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>

#include "engine/block_hash.h"
#include "engine/block_pool.h"
#include "engine/engine_test_util.h"

namespace pdserve::engine {
namespace {

std::vector<int32_t> Iota(int64_t n, int32_t from = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(BlockHashTest, ChainDependsOnEveryEarlierTokenAndTheNamespace) {
  const std::vector<int32_t> a = Iota(64);
  std::vector<int32_t> b = a;
  b[3] = 1000;  // a change in block 0 of 16 tokens
  std::vector<uint64_t> ha, hb, hc;
  ExtendChain(7, a, 16, 4, &ha);
  ExtendChain(7, b, 16, 4, &hb);
  ExtendChain(8, a, 16, 4, &hc);
  ASSERT_EQ(ha.size(), 4u);
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_NE(ha[j], hb[j]) << j;  // every later block's name changes too
    EXPECT_NE(ha[j], hc[j]) << j;
  }
  // Same tokens at the same position after the same parent: the same name.
  std::vector<int32_t> c = a;
  c[50] = 999;  // block 3 only
  std::vector<uint64_t> h2;
  ExtendChain(7, c, 16, 4, &h2);
  EXPECT_EQ(std::vector<uint64_t>(h2.begin(), h2.begin() + 3), std::vector<uint64_t>(ha.begin(), ha.begin() + 3));
  EXPECT_NE(h2[3], ha[3]);
  // Extending piece by piece gives the chain computed at once.
  std::vector<uint64_t> step;
  ExtendChain(7, a, 16, 1, &step);
  ExtendChain(7, a, 16, 3, &step);
  ExtendChain(7, a, 16, 4, &step);
  EXPECT_EQ(step, ha);
  // The definition: XXH3-64 of [parent LE64 | tokens LE32], also beyond the inline buffer.
  EXPECT_EQ(ha[0], ChainBlockHash(7, std::span<const int32_t>(a).subspan(0, 16)));
  const std::vector<int32_t> big = Iota(1000);
  std::vector<uint64_t> hbig;
  ExtendChain(5, big, 500, 2, &hbig);
  EXPECT_EQ(hbig[1], ChainBlockHash(hbig[0], std::span<const int32_t>(big).subspan(500, 500)));
  EXPECT_NE(ChainBlockHash(5, std::span<const int32_t>(big).subspan(0, 300)),
            ChainBlockHash(5, std::span<const int32_t>(big).subspan(0, 301)));
}

TEST(BlockHashTest, NamespaceSeparatesEveryKvFormat) {
  const model::ModelConfig& c = testing::TinyModel().config();
  KvNamespaceInputs base;
  base.config = &c;
  base.layout = model::KvLayoutFor(c, 16);
  base.first_chunk_tokens = 32;
  const uint64_t ns = KvNamespace(base);
  EXPECT_EQ(ns, KvNamespace(base));  // stable
  std::vector<KvNamespaceInputs> others(8, base);
  others[0].layout = model::KvLayoutFor(c, 16, KvLatentFormat::kBf16);
  others[1].layout = model::KvLayoutFor(c, 16, KvLatentFormat::kInt8PerToken);
  others[2].layout = model::KvLayoutFor(c, 16, KvLatentFormat::kFp8Blockwise, KvIndexFormat::kInt8);
  others[3].layout = model::KvLayoutFor(c, 32);
  others[4].first_chunk_tokens = 64;
  others[5].model_identity = 42;
  others[6].tp = 2;
  others[7].cp = 2;
  std::vector<uint64_t> seen = {ns};
  for (const KvNamespaceInputs& o : others) {
    const uint64_t h = KvNamespace(o);
    for (uint64_t s : seen) EXPECT_NE(h, s);
    seen.push_back(h);
  }
}

TEST(PrefixCacheTest, FindChecksParentAndTokensNotOnlyTheHash) {
  PrefixCache c(8);
  const std::vector<int32_t> t = Iota(4), u = Iota(4, 10);
  int32_t dropped = 0;
  const auto a = c.Register(0, /*hash=*/111, PrefixCache::Root(5), t, &dropped);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(dropped, -1);
  const auto b = c.Register(1, 222, *a, u, &dropped);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(c.Find(111, PrefixCache::Root(5), t), a);
  EXPECT_EQ(c.Find(222, *a, u), b);
  EXPECT_FALSE(c.Find(111, PrefixCache::Root(6), t));  // another namespace
  EXPECT_FALSE(c.Find(111, PrefixCache::Root(5), u));  // other tokens under the same name
  EXPECT_FALSE(c.Find(222, PrefixCache::Root(5), u));  // another parent
  EXPECT_FALSE(c.Find(333, *a, u));
  // The same content again: the earlier entry answers, the new block stays private.
  EXPECT_EQ(c.Register(2, 222, *a, u, &dropped), b);
  EXPECT_FALSE(c.registered(2));
  // Other content under a live name (a hash collision): refused.
  EXPECT_FALSE(c.Register(3, 222, *a, t, &dropped).has_value());
  EXPECT_FALSE(c.registered(3));
  EXPECT_EQ(c.n_registered(), 2);
}

TEST(PrefixCacheTest, LruEvictsOldestParkedAndStaleChildrenNeverMatch) {
  PrefixCache c(8);
  int32_t dropped = 0;
  const std::vector<int32_t> t = Iota(4);
  const auto p = c.Register(0, 1, PrefixCache::Root(9), t, &dropped);
  const auto k = c.Register(1, 2, *p, t, &dropped);
  const auto q = c.Register(2, 3, PrefixCache::Root(9), Iota(4, 50), &dropped);
  ASSERT_TRUE(p && k && q);
  c.Park(0);  // oldest
  c.Park(2);
  c.Park(1);  // newest
  EXPECT_EQ(c.n_parked(), 3);
  c.Unpark(2);  // taken again: no longer evictable
  EXPECT_EQ(c.EvictOldest(), 0);
  EXPECT_EQ(c.evictions(), 1);
  EXPECT_FALSE(c.registered(0));
  // Block 0 comes back with the same name and content: a new generation, so the old child
  // (registered under the old parent) does not match below it ...
  const auto p2 = c.Register(0, 1, PrefixCache::Root(9), t, &dropped);
  ASSERT_TRUE(p2);
  EXPECT_NE(p2->generation, p->generation);
  EXPECT_FALSE(c.Find(2, *p2, t));
  // ... and a new child takes the stale child's name (the idle stale block is handed back).
  const auto k2 = c.Register(3, 2, *p2, t, &dropped);
  ASSERT_TRUE(k2);
  EXPECT_EQ(dropped, 1);
  EXPECT_FALSE(c.registered(1));
  EXPECT_EQ(c.Find(2, *p2, t), k2);
  EXPECT_EQ(c.n_parked(), 0);
  EXPECT_EQ(c.EvictOldest(), -1);
}

KvLayout TestLayout(int64_t block_tokens) {
  KvLayout l;
  l.num_layers = 1;
  l.kv_lora_rank = 128;
  l.qk_rope_head_dim = 64;
  l.index_head_dim = 128;
  l.tokens_per_block = static_cast<uint32_t>(block_tokens);
  return l;
}

// Registers `ids` as the chain of `tokens` (B tokens a block) under namespace 1.
std::vector<CachedBlockId> RegisterChain(BlockPool* pool, const std::vector<int32_t>& ids,
                                         const std::vector<int32_t>& tokens, std::vector<uint64_t>* hashes) {
  const auto B = static_cast<int64_t>(pool->layout().tokens_per_block);
  hashes->clear();
  ExtendChain(1, tokens, B, static_cast<int64_t>(ids.size()), hashes);
  std::vector<CachedBlockId> out;
  CachedBlockId parent = PrefixCache::Root(1);
  for (size_t j = 0; j < ids.size(); ++j) {
    auto id = pool->Register(ids[j], (*hashes)[j], parent,
                             std::span<const int32_t>(tokens).subspan(j * static_cast<size_t>(B), static_cast<size_t>(B)));
    EXPECT_TRUE(id.has_value());
    out.push_back(*id);
    parent = *id;
  }
  return out;
}

TEST(BlockPoolPrefixTest, RefcountsEvictOnlyIdleBlocksOnlyWhenShortTailFirst) {
  const KvLayout l = TestLayout(4);
  auto created = BlockPool::Create(l, 8 * static_cast<int64_t>(l.BlockBytes()));
  ASSERT_TRUE(created.ok());
  BlockPool& pool = **created;
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.Allocate(4, &a).ok());
  const std::vector<int32_t> tokens = Iota(16);
  std::vector<uint64_t> hashes;
  RegisterChain(&pool, a, tokens, &hashes);
  EXPECT_EQ(pool.n_cached(), 4);
  EXPECT_EQ(pool.n_cached_idle(), 0);
  EXPECT_EQ(pool.n_free(), 4);
  // A second holder maps the first three blocks.
  std::vector<CachedBlockId> hit;
  EXPECT_EQ(pool.MatchPrefix(PrefixCache::Root(1), hashes, tokens, 3, &hit), 3);
  ASSERT_EQ(hit.size(), 3u);
  for (size_t j = 0; j < 3; ++j) EXPECT_EQ(hit[j].block, a[j]);
  // The first holder lets go: block 3 (only its) goes idle, 0..2 stay in use.
  pool.Free(a);
  EXPECT_EQ(pool.n_cached_idle(), 1);
  EXPECT_EQ(pool.n_free(), 5);
  // The free list is used before any cached block is evicted.
  std::vector<int32_t> b;
  ASSERT_TRUE(pool.Allocate(4, &b).ok());
  EXPECT_EQ(pool.evictions(), 0);
  EXPECT_EQ(pool.n_cached(), 4);
  // Short now: the idle block is evicted; blocks in use never are.
  std::vector<int32_t> c;
  ASSERT_TRUE(pool.Allocate(1, &c).ok());
  EXPECT_EQ(c[0], a[3]);
  EXPECT_EQ(pool.evictions(), 1);
  EXPECT_EQ(pool.Allocate(1, &c).code(), StatusCode::kResourceExhausted);
  // The second holder lets go too: its blocks are parked tail first, so block 2 goes before 0.
  std::vector<int32_t> held;
  for (const CachedBlockId& h : hit) held.push_back(h.block);
  pool.Free(held);
  EXPECT_EQ(pool.n_cached_idle(), 3);
  std::vector<int32_t> d;
  ASSERT_TRUE(pool.Allocate(1, &d).ok());
  EXPECT_EQ(d[0], a[2]);
  // Blocks 0 and 1 are still a usable prefix; the lookup stops at the evicted block 2.
  hit.clear();
  EXPECT_EQ(pool.MatchPrefix(PrefixCache::Root(1), hashes, tokens, 4, &hit), 2);
  pool.Free(std::vector<int32_t>{hit[0].block, hit[1].block});
  // Everything back: nothing leaked, and EvictIdle empties the cache.
  pool.Free(b);
  pool.Free(c);
  pool.Free(d);
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
  EXPECT_EQ(pool.EvictIdle(), 2);
  EXPECT_EQ(pool.n_cached(), 0);
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
  std::vector<int32_t> all;
  ASSERT_TRUE(pool.Allocate(8, &all).ok());
  pool.Free(all);
}

TEST(BlockPoolPrefixTest, MatchStopsAtFirstMissAndChecksTokens) {
  const KvLayout l = TestLayout(4);
  auto created = BlockPool::Create(l, 8 * static_cast<int64_t>(l.BlockBytes()));
  ASSERT_TRUE(created.ok());
  BlockPool& pool = **created;
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.Allocate(3, &a).ok());
  const std::vector<int32_t> tokens = Iota(12);
  std::vector<uint64_t> hashes;
  RegisterChain(&pool, a, tokens, &hashes);
  pool.Free(a);
  // Another prompt that differs in block 1 matches block 0 only.
  std::vector<int32_t> other = tokens;
  other[5] = 77;
  std::vector<uint64_t> oh;
  ExtendChain(1, other, 4, 3, &oh);
  std::vector<CachedBlockId> hit;
  EXPECT_EQ(pool.MatchPrefix(PrefixCache::Root(1), oh, other, 3, &hit), 1);
  // The right names with the wrong tokens (what a hash collision would look like) match nothing.
  std::vector<CachedBlockId> none;
  EXPECT_EQ(pool.MatchPrefix(PrefixCache::Root(1), hashes, other, 3, &none), 1);  // block 0 is equal
  EXPECT_EQ(pool.MatchPrefix(PrefixCache::Root(2), hashes, tokens, 3, &none), 0);
  pool.Free(std::vector<int32_t>{hit[0].block});
  pool.Free(std::vector<int32_t>{none[0].block});
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
}

}  // namespace
}  // namespace pdserve::engine
