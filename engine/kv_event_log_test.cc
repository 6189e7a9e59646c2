// Prefix-cache events (engine/kv_event_log.h, docs/prefix-cache.md "Events"): the log keeps the
// net change per hash and overflows into a whole-set resync; a mirror that applies the batches
// of a BlockPool under random churn (registrations, duplicates, evictions under a tiny pool,
// EvictIdle) always equals the cache's real contents; and an Engine's events name exactly the
// blocks it cached, by the chain hash of their tokens (the hash the router computes), through
// eviction, ClearPrefixCache and re-registration.
// To add a case: drive the pool or the engine, apply TakeKvEvents(false) to a Mirror, and
// compare it with TakeKvEvents(true) (the real set).
#include "engine/kv_event_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "engine/block_hash.h"
#include "engine/block_pool.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace pdserve::engine {
namespace {

using testing::EventCollector;
using testing::RunUntilIdle;
using testing::TinyModel;

std::set<uint64_t> AsSet(const std::vector<uint64_t>& v) { return {v.begin(), v.end()}; }

// What a reader of the events believes the cache holds.
struct Mirror {
  std::set<uint64_t> hashes;
  int resets = 0;
  void Apply(const KvEventBatch& b) {
    if (b.reset) {
      hashes.clear();
      ++resets;
    }
    for (uint64_t h : b.removed) hashes.erase(h);
    for (uint64_t h : b.stored) hashes.insert(h);
  }
};

TEST(KvEventLogTest, KeepsTheNetChangePerHashAndOverflowsIntoAResync) {
  KvEventLog log(4);
  log.Stored(1);
  log.Stored(2);
  log.Removed(2);  // came and went: listed as removed (harmless to a reader that never saw it)
  log.Removed(3);
  log.Stored(3);   // replaced: cached again
  KvEventBatch b;
  log.Take(&b);
  EXPECT_EQ(AsSet(b.stored), (std::set<uint64_t>{1, 3}));
  EXPECT_EQ(AsSet(b.removed), (std::set<uint64_t>{2}));
  EXPECT_FALSE(b.reset);
  KvEventBatch empty;
  log.Take(&empty);
  EXPECT_TRUE(empty.empty());
  // Five distinct hashes do not fit in four: everything pending is dropped, the overflow stays.
  for (uint64_t h = 10; h < 15; ++h) log.Stored(h);
  EXPECT_TRUE(log.overflowed());
  EXPECT_EQ(log.overflows(), 1);
  log.Stored(20);  // ignored until the reader resyncs
  log.Clear();
  EXPECT_FALSE(log.overflowed());
  KvEventBatch after;
  log.Take(&after);
  EXPECT_TRUE(after.empty());
}

// A pool of `n_blocks` blocks of `block_tokens` in the tiny model's layout.
std::unique_ptr<BlockPool> TinyPool(int64_t block_tokens, int64_t n_blocks) {
  const KvLayout l = model::KvLayoutFor(TinyModel().config(), block_tokens);
  auto created = BlockPool::Create(l, n_blocks * static_cast<int64_t>(l.BlockBytes()));
  PDSERVE_CHECK(created.ok(), created.status().ToString());
  return std::move(created).value();
}

// A sequence as the scheduler holds one: its blocks (mapped hits, then allocated) registered
// in order while the chain holds.
struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
};

TEST(BlockPoolEventsTest, AMirrorOfTheEventsFollowsTheCacheUnderChurn) {
  constexpr int64_t B = 4;
  auto owned = TinyPool(B, 12);
  BlockPool& pool = *owned;
  constexpr uint64_t kNs = 9;
  std::mt19937 rng(3);
  // Few prefix families over a small alphabet: duplicates, shared prefixes, re-registrations.
  std::vector<std::vector<int32_t>> families;
  for (int f = 0; f < 10; ++f) {
    std::vector<int32_t> t(16);
    for (auto& x : t) x = static_cast<int32_t>(rng() % 5);
    families.push_back(t);
  }
  Mirror mirror;
  std::vector<Seq> live;
  int64_t stored_seen = 0, removed_seen = 0;
  for (int step = 0; step < 20000; ++step) {
    const uint32_t op = rng() % 10;
    if (op < 5) {
      Seq s;
      const auto& fam = families[rng() % families.size()];
      const int64_t n_blocks = 1 + static_cast<int64_t>(rng() % 4);
      s.tokens.assign(fam.begin(), fam.begin() + n_blocks * B);
      if (rng() % 3 == 0) s.tokens[static_cast<size_t>(rng() % s.tokens.size())] = static_cast<int32_t>(rng() % 5);
      std::vector<uint64_t> hashes;
      ExtendChain(kNs, s.tokens, B, n_blocks, &hashes);
      std::vector<CachedBlockId> hit;
      const int64_t m = pool.MatchPrefix(PrefixCache::Root(kNs), hashes, s.tokens, n_blocks, &hit);
      for (const CachedBlockId& h : hit) s.blocks.push_back(h.block);
      if (!pool.Allocate(n_blocks - m, &s.blocks).ok()) {
        pool.Free(s.blocks);
        continue;
      }
      CachedBlockId parent = m == 0 ? PrefixCache::Root(kNs) : hit.back();
      for (int64_t j = m; j < n_blocks; ++j) {
        auto id = pool.Register(s.blocks[static_cast<size_t>(j)], hashes[static_cast<size_t>(j)], parent,
                                std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(j * B), B));
        if (!id) break;
        parent = *id;
      }
      live.push_back(std::move(s));
    } else if (op < 8 && !live.empty()) {
      const size_t k = rng() % live.size();
      pool.Free(live[k].blocks);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else if (op == 8) {
      const KvEventBatch b = pool.TakeKvEvents(false);
      stored_seen += static_cast<int64_t>(b.stored.size());
      removed_seen += static_cast<int64_t>(b.removed.size());
      mirror.Apply(b);
      ASSERT_EQ(static_cast<int64_t>(mirror.hashes.size()), pool.n_cached()) << "step " << step;
    } else if (rng() % 8 == 0) {
      pool.EvictIdle();
    }
    if (step % 97 == 0) {
      mirror.Apply(pool.TakeKvEvents(false));
      const KvEventBatch full = pool.TakeKvEvents(true);
      ASSERT_TRUE(full.reset);
      EXPECT_EQ(mirror.hashes, AsSet(full.stored)) << "step " << step;
      EXPECT_EQ(static_cast<int64_t>(full.stored.size()), pool.n_cached());
      EXPECT_TRUE(pool.TakeKvEvents(false).empty());  // the snapshot consumed the backlog
    }
  }
  EXPECT_GT(pool.evictions(), 500);  // the tiny pool evicted for real
  EXPECT_GT(stored_seen, 500);
  EXPECT_GT(removed_seen, 500);
  for (Seq& s : live) pool.Free(s.blocks);
  pool.EvictIdle();
  mirror.Apply(pool.TakeKvEvents(false));
  EXPECT_TRUE(mirror.hashes.empty());
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
}

TEST(BlockPoolEventsTest, ABacklogLargerThanThePoolBecomesOneSnapshot) {
  constexpr int64_t B = 4;
  auto owned = TinyPool(B, 16);  // the log holds at most 16 distinct hashes
  BlockPool& pool = *owned;
  // 40 distinct one-block prompts registered and evicted one after another, nobody reading.
  for (int32_t k = 0; k < 40; ++k) {
    const std::vector<int32_t> t = {k, k, k, k};
    std::vector<uint64_t> h;
    ExtendChain(1, t, B, 1, &h);
    std::vector<int32_t> b;
    ASSERT_TRUE(pool.Allocate(1, &b).ok());
    ASSERT_TRUE(pool.Register(b[0], h[0], PrefixCache::Root(1), t).has_value());
    pool.Free(b);
  }
  EXPECT_EQ(pool.kv_event_overflows(), 1);
  const KvEventBatch b = pool.TakeKvEvents(false);
  EXPECT_TRUE(b.reset);
  EXPECT_TRUE(b.removed.empty());
  EXPECT_EQ(static_cast<int64_t>(b.stored.size()), pool.n_cached());
  EXPECT_EQ(pool.n_cached(), 16);  // the 16 most recent
  // Back to increments after the resync.
  pool.EvictIdle();
  const KvEventBatch after = pool.TakeKvEvents(false);
  EXPECT_FALSE(after.reset);
  EXPECT_EQ(AsSet(after.removed), AsSet(b.stored));
}

// The engine (tiny model, blocks of 16, first chunk 32).
constexpr int64_t kBlock = 16;
constexpr int64_t kChunk = 32;

std::unique_ptr<Engine> MakeEngine(int64_t n_blocks) {
  EngineOptions o;
  o.block_tokens = kBlock;
  const KvLayout l = model::KvLayoutFor(TinyModel().config(), kBlock, o.latent_format);
  o.kv_cache_gib = static_cast<double>(n_blocks * l.BlockBytes()) / (1ull << 30);
  o.scheduler.max_num_seqs = 8;
  o.scheduler.max_step_tokens = 128;
  o.scheduler.prefill_chunk = kChunk;
  o.seed = 5;
  auto e = Engine::Create(o, &TinyModel());
  PDSERVE_CHECK(e.ok(), e.status().ToString());
  return std::move(e).value();
}

struct Generated {
  std::vector<int32_t> tokens;  // prompt ++ output
  int64_t cached = 0;
};

Generated Generate(Engine* e, const std::vector<int32_t>& prompt, int32_t max_tokens) {
  EventCollector ev;
  RequestOptions ro;
  ro.sampling.temperature = 0.0f;
  ro.sampling.max_tokens = max_tokens;
  ro.on_event = ev.Callback();
  auto id = e->AddRequest(prompt, ro);
  PDSERVE_CHECK(id.ok(), id.status().ToString());
  PDSERVE_CHECK(RunUntilIdle(e));
  Generated r;
  r.tokens = prompt;
  const std::vector<int32_t> out = ev.Tokens(*id);
  r.tokens.insert(r.tokens.end(), out.begin(), out.end());
  r.cached = ev.Last(*id)->cached_prompt_tokens;
  return r;
}

std::vector<int32_t> Random(std::mt19937* rng, int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = static_cast<int32_t>((*rng)() % 1000);
  return v;
}

// The chain names of the full blocks a finished request computed (prompt and all of its
// output but the last token), as anyone can compute them from the tokens.
std::set<uint64_t> ChainOf(const Engine& e, const Generated& r) {
  const int64_t computed = static_cast<int64_t>(r.tokens.size()) - 1;
  std::vector<uint64_t> h;
  ExtendChain(e.prefix_cache_namespace(), r.tokens, kBlock, computed / kBlock, &h);
  return AsSet(h);
}

TEST(EngineKvEventsTest, EventsNameTheCachedBlocksByTheirTokensThroughEvictionAndClear) {
  std::mt19937 rng(21);
  auto e = MakeEngine(24);
  ASSERT_TRUE(e->prefix_cache_enabled());
  EXPECT_EQ(e->prefix_cache_first_chunk_tokens(), kChunk);
  Mirror mirror;
  mirror.Apply(e->TakeKvEvents(true));  // what a worker sends when it registers
  EXPECT_TRUE(mirror.hashes.empty());
  // One request: its 6 full blocks (100 prompt + 4 computed output tokens) are stored.
  const Generated a = Generate(e.get(), Random(&rng, 100), 5);
  const KvEventBatch first = e->TakeKvEvents(false);
  EXPECT_EQ(AsSet(first.stored), ChainOf(*e, a));
  EXPECT_EQ(first.stored.size(), 6u);
  EXPECT_TRUE(first.removed.empty());
  mirror.Apply(first);
  // A hit stores nothing new for the shared blocks.
  std::vector<int32_t> q(a.tokens.begin(), a.tokens.begin() + 90);
  const std::vector<int32_t> more = Random(&rng, 20);
  q.insert(q.end(), more.begin(), more.end());
  const Generated warm = Generate(e.get(), q, 3);
  EXPECT_EQ(warm.cached, 80);  // 5 whole blocks of the 90 shared tokens
  const KvEventBatch second = e->TakeKvEvents(false);
  for (uint64_t h : second.stored) EXPECT_FALSE(mirror.hashes.count(h));
  mirror.Apply(second);
  EXPECT_EQ(mirror.hashes.size(), static_cast<size_t>(e->Stats().prefix_cached_blocks));
  for (uint64_t h : ChainOf(*e, warm)) EXPECT_TRUE(mirror.hashes.count(h));
  // ClearPrefixCache: everything removed.
  const std::set<uint64_t> before = mirror.hashes;
  e->ClearPrefixCache();
  const KvEventBatch cleared = e->TakeKvEvents(false);
  EXPECT_TRUE(cleared.stored.empty());
  EXPECT_EQ(AsSet(cleared.removed), before);
  mirror.Apply(cleared);
  EXPECT_TRUE(mirror.hashes.empty());
  // The same request again registers the same names again.
  const Generated again = Generate(e.get(), std::vector<int32_t>(a.tokens.begin(), a.tokens.begin() + 100), 5);
  EXPECT_EQ(again.cached, 0);
  EXPECT_EQ(again.tokens, a.tokens);
  const KvEventBatch re = e->TakeKvEvents(false);
  EXPECT_EQ(AsSet(re.stored), ChainOf(*e, a));
  mirror.Apply(re);
  // Eviction under the tiny pool: other prompts push A's blocks out; the mirror follows.
  for (int k = 0; k < 6; ++k) {
    Generate(e.get(), Random(&rng, 120), 4);
    mirror.Apply(e->TakeKvEvents(false));
    ASSERT_EQ(mirror.hashes.size(), static_cast<size_t>(e->Stats().prefix_cached_blocks)) << k;
  }
  EXPECT_GT(e->Stats().prefix_evictions, 0);
  for (uint64_t h : ChainOf(*e, a)) EXPECT_FALSE(mirror.hashes.count(h));  // LRU: the oldest went first
  const KvEventBatch full = e->TakeKvEvents(true);
  EXPECT_EQ(AsSet(full.stored), mirror.hashes);
  // Nothing leaked.
  e->ClearPrefixCache();
  EXPECT_EQ(e->pool().n_free(), e->pool().n_blocks());
  mirror.Apply(e->TakeKvEvents(false));
  EXPECT_TRUE(mirror.hashes.empty());
}

}  // namespace
}  // namespace pdserve::engine
