// The prefix cache's disk tier in the Engine (tiny preset, blocks of 16 tokens, prefill chunk
// 32, a pool of 24 blocks, the tier in a directory under $TMPDIR): a donor request's blocks are
// pushed out of the pool by filler requests (real evictions, spilled to the tier), then a
// request with the donor's prefix restores them from disk. Its output is bitwise that of a cold
// engine (greedy and seeded sampling), damaged tier files cost a recompute from that block on
// and never a wrong token or a leaked block, and the tier stays within its bound.
// To add a case: Spill() a donor, change the tier's files, run a query and compare with Cold().
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/block_hash.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "model/test_util.h"

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;
using model::testing::TempDir;
using testing::Concat;
using testing::Generate;
using testing::Greedy;
using testing::Output;
using testing::Random;
using testing::ReferenceGreedy;
using testing::Seeded;
using testing::TinyModel;

constexpr int64_t kBlock = testing::kPrefixTestBlock;
constexpr int64_t kChunk = testing::kPrefixTestChunk;
constexpr int64_t kPoolBlocks = 24;

KvLayout Layout() { return model::KvLayoutFor(TinyModel().config(), kBlock, KvLatentFormat::kFp8Blockwise); }

int64_t FileBytes() { return static_cast<int64_t>(DiskTier::kHeaderBytes + 4 * kBlock + Layout().BlockBytes()); }

// The prefix-cache tests' engine with a disk tier in `tier_dir` ("": none) of `tier_files` files.
EngineOptions Options(int64_t n_blocks, const std::string& tier_dir, int64_t tier_files = 256, bool cache = true) {
  EngineOptions o = testing::PrefixTestOptions(n_blocks, cache);
  o.prefix_cache_disk_dir = tier_dir;
  o.prefix_cache_disk_bytes = tier_files * FileBytes();
  return o;
}

std::unique_ptr<Engine> Make(const EngineOptions& o) { return testing::MakeEngine(o); }

Output Cold(const std::vector<int32_t>& prompt, const SamplingParams& p) {
  auto e = Make(Options(256, "", 0, false));
  return Generate(e.get(), prompt, p);
}

// After every request ended: every block is free or an idle cached block, and nothing is left
// once the cache is cleared.
void ExpectNoLeak(Engine* e) {
  const BlockPool& pool = e->pool();
  EXPECT_EQ(pool.n_cached(), pool.n_cached_idle());
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
  EXPECT_EQ(e->Stats().blocks_free, e->Stats().blocks_total);
  e->ClearPrefixCache();
  EXPECT_EQ(pool.n_cached(), 0);
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
}

// The donor's 100-token prefix, the donor (130 tokens) and the query that shares the prefix.
struct Workload {
  std::vector<int32_t> shared, donor, query;
  explicit Workload(uint32_t seed) {
    std::mt19937 rng(seed);
    shared = Random(&rng, 100);
    donor = Concat(shared, Random(&rng, 30));
    query = Concat(shared, Random(&rng, 21));
  }
};

// Runs the donor, then filler requests until the pool has evicted (and the tier stored) every
// block the donor cached. Returns the donor's output.
Output Spill(Engine* e, const Workload& w, const SamplingParams& p) {
  const Output d = Generate(e, w.donor, p);
  // Each filler takes 9 of the 24 blocks; the donor's idle blocks are the least recently used,
  // so five fillers (45 blocks) evict all of them.
  std::mt19937 rng(777);
  for (int i = 0; i < 5; ++i) Generate(e, Random(&rng, 130), Greedy(4));
  return d;
}

// The chain hashes of the donor's full cached blocks (8: 141 computed positions).
std::vector<uint64_t> DonorHashes(const Engine& e, const Workload& w) {
  std::vector<uint64_t> h;
  ExtendChain(e.prefix_cache_namespace(), w.donor, kBlock, 8, &h);
  return h;
}

TEST(EngineDiskTierTest, PrefixesRestoredFromDiskAreBitwiseCold) {
  const Workload w(21);
  for (const SamplingParams& p : {Greedy(12), Seeded(12, 99)}) {
    TempDir dir("engine_tier");
    auto e = Make(Options(kPoolBlocks, dir.path()));
    ASSERT_TRUE(e->prefix_cache_disk_tier());
    Spill(e.get(), w, p);
    const EngineStats before = e->Stats();
    // Every block the donor cached went to disk.
    for (uint64_t h : DonorHashes(*e, w)) EXPECT_TRUE(fs::exists(dir.path() + "/" + DiskTier::FileName(h)));
    EXPECT_GE(before.prefix_tier_stored_blocks, 8);
    EXPECT_GT(before.prefix_evictions, 0);
    EXPECT_EQ(before.prefix_tier_restored_tokens, 0);

    const Output warm = Generate(e.get(), w.query, p);
    const EngineStats after = e->Stats();
    // 100 shared tokens: 6 whole blocks, all read back from disk (none was left in the pool).
    EXPECT_EQ(warm.cached, 96);
    EXPECT_EQ(after.prefix_tier_restored_tokens - before.prefix_tier_restored_tokens, 96);
    const int64_t computed = after.prefix_computed_tokens - before.prefix_computed_tokens;
    EXPECT_EQ(computed, static_cast<int64_t>(w.query.size()) - 96);
    EXPECT_LT(computed, static_cast<int64_t>(w.query.size()));
    EXPECT_EQ(after.prefix_tier_corrupt_files, 0);

    const Output cold = Cold(w.query, p);
    EXPECT_EQ(cold.cached, 0);
    EXPECT_TRUE(warm == cold) << "temperature " << p.temperature;
    if (p.greedy()) {
      EXPECT_EQ(warm.tokens, ReferenceGreedy(TinyModel(), w.query, 12, kChunk));
    }
    // The donor again: its prefix is in the pool now (restored), the rest of its blocks on disk.
    const EngineStats mid = e->Stats();
    const Output again = Generate(e.get(), w.donor, p);
    EXPECT_EQ(again.cached, 128);
    EXPECT_EQ(e->Stats().prefix_tier_restored_tokens - mid.prefix_tier_restored_tokens, 128 - 96);
    EXPECT_TRUE(again == Cold(w.donor, p));
    ExpectNoLeak(e.get());
  }
}

TEST(EngineDiskTierTest, DamagedTierFilesCostARecomputeNeverAWrongToken) {
  const Workload w(22);
  const SamplingParams p = Greedy(12);
  const Output cold = Cold(w.query, p);
  const int64_t kv_offset = static_cast<int64_t>(DiskTier::kHeaderBytes + 4 * kBlock);
  struct Case {
    const char* what;
    int64_t block;           // the donor block whose file is damaged
    int64_t cached;          // what the query then maps: the blocks before it (if >= the first chunk)
    bool truncate;           // else flip a byte at `offset`
    int64_t offset;
  };
  const std::vector<Case> cases = {
      {"a flipped KV byte", 3, 48, false, kv_offset + 77},
      // Block 0 comes back but is less than the first chunk: not taken (it stays cached).
      {"a flipped token byte", 1, 0, false, DiskTier::kHeaderBytes + 5},
      {"a truncated file", 2, 32, true, 0},
      {"a bad header (the layout)", 0, 0, false, 52},
  };
  for (const Case& c : cases) {
    TempDir dir("engine_tier");
    auto e = Make(Options(kPoolBlocks, dir.path()));
    Spill(e.get(), w, p);
    const std::string path = dir.path() + "/" + DiskTier::FileName(DonorHashes(*e, w)[static_cast<size_t>(c.block)]);
    ASSERT_TRUE(fs::exists(path)) << c.what;
    if (c.truncate) {
      fs::resize_file(path, fs::file_size(path) / 2);
    } else {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(c.offset);
      char x = 0;
      f.read(&x, 1);
      x = static_cast<char>(x ^ 0x40);
      f.seekp(c.offset);
      f.write(&x, 1);
    }
    const EngineStats before = e->Stats();
    const Output warm = Generate(e.get(), w.query, p);
    const EngineStats after = e->Stats();
    EXPECT_EQ(after.prefix_tier_corrupt_files - before.prefix_tier_corrupt_files, 1) << c.what;
    EXPECT_FALSE(fs::exists(path)) << c.what;
    EXPECT_EQ(warm.cached, c.cached) << c.what;
    EXPECT_EQ(after.prefix_tier_restored_tokens - before.prefix_tier_restored_tokens, c.block * kBlock) << c.what;
    EXPECT_TRUE(warm == cold) << c.what;
    // Once more: the query's own blocks are cached now, whatever the tier lost.
    EXPECT_TRUE(Generate(e.get(), w.query, p) == cold) << c.what;
    ExpectNoLeak(e.get());
  }
}

TEST(EngineDiskTierTest, TheTierStaysWithinItsBound) {
  const Workload w(23);
  TempDir dir("engine_tier");
  constexpr int64_t kFiles = 10;
  auto e = Make(Options(kPoolBlocks, dir.path(), kFiles));
  Spill(e.get(), w, Greedy(4));
  const EngineStats s = e->Stats();
  // 5 fillers and the donor evicted far more than 10 blocks: the tier kept the latest 10.
  EXPECT_GT(s.prefix_tier_stored_blocks, kFiles);
  EXPECT_EQ(s.prefix_tier_blocks, kFiles);
  EXPECT_EQ(s.prefix_tier_bytes, kFiles * FileBytes());
  EXPECT_EQ(s.prefix_tier_evictions, s.prefix_tier_stored_blocks - kFiles);
  int64_t files = 0;
  for (const auto& f : fs::directory_iterator(dir.path())) files += f.path().extension() == ".kvblock";
  EXPECT_EQ(files, kFiles);
  // The donor was the first to spill, so its first block is gone: the query computes it all.
  EXPECT_FALSE(fs::exists(dir.path() + "/" + DiskTier::FileName(DonorHashes(*e, w)[0])));
  const Output warm = Generate(e.get(), w.query, Greedy(4));
  EXPECT_EQ(warm.cached, 0);
  EXPECT_TRUE(warm == Cold(w.query, Greedy(4)));
  ExpectNoLeak(e.get());
}

TEST(EngineDiskTierTest, AVanishedDirectoryCostsOnlyTheTier) {
  const Workload w(24);
  TempDir dir("engine_tier");
  const std::string tier = dir / "tier";
  auto e = Make(Options(kPoolBlocks, tier));
  fs::remove_all(tier);  // every store fails from now on
  Spill(e.get(), w, Greedy(6));
  const EngineStats s = e->Stats();
  EXPECT_GT(s.prefix_evictions, 0);
  EXPECT_EQ(s.prefix_tier_write_errors, s.prefix_evictions);
  EXPECT_EQ(s.prefix_tier_stored_blocks, 0);
  const Output warm = Generate(e.get(), w.query, Greedy(6));
  EXPECT_EQ(warm.cached, 0);
  EXPECT_TRUE(warm == Cold(w.query, Greedy(6)));
  ExpectNoLeak(e.get());
}

TEST(EngineDiskTierTest, OffWithoutTheCacheOrADirectory) {
  TempDir dir("engine_tier");
  const std::string tier = dir / "tier";
  EXPECT_FALSE(Make(Options(kPoolBlocks, ""))->prefix_cache_disk_tier());
  auto off = Make(Options(kPoolBlocks, tier, 16, /*cache=*/false));
  EXPECT_FALSE(off->prefix_cache_disk_tier());
  EXPECT_FALSE(fs::exists(tier));
  // Two engines cannot share one directory.
  auto a = Make(Options(kPoolBlocks, tier));
  EXPECT_TRUE(a->prefix_cache_disk_tier());
  EXPECT_EQ(Engine::Create(Options(kPoolBlocks, tier), &TinyModel()).status().code(),
            StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pdserve::engine
