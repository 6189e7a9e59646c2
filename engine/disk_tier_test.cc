// DiskTier on real files in a temporary directory (under $TMPDIR): a stored block reads back
// bitwise; a lookup accepts a block only after its own parent with its own tokens; damaged
// files (bad checksum, truncated, a header of another namespace or layout) are detected,
// counted and deleted; the size bound drops the least recently used files; one tier per
// directory. To add a case: store blocks made by Block(), damage a file with the helpers, and
// check Load's code and stats().
#include "engine/disk_tier.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <cstring>
#include <random>
#include <set>

#include "engine/block_hash.h"
#include "engine/block_pool.h"
#include "model/test_util.h"

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;
using model::testing::TempDir;

KvLayout Layout() { return KvLayout::DeepSeekV32(/*num_layers=*/3, /*tokens_per_block=*/16); }

struct Block {
  uint64_t hash;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> kv;
};

Block MakeBlock(uint64_t hash, uint32_t seed) {
  std::mt19937 rng(seed);
  Block b;
  b.hash = hash;
  b.tokens.resize(Layout().tokens_per_block);
  for (auto& t : b.tokens) t = static_cast<int32_t>(rng() % 50000);
  b.kv.resize(Layout().BlockBytes());
  for (auto& x : b.kv) x = static_cast<uint8_t>(rng());
  return b;
}

std::unique_ptr<DiskTier> MakeTier(const std::string& dir, int64_t max_files, uint64_t ns = 7) {
  const int64_t file = static_cast<int64_t>(DiskTier::kHeaderBytes + 4 * Layout().tokens_per_block + Layout().BlockBytes());
  auto t = DiskTier::Create({dir, max_files * file}, Layout(), ns);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

void FlipByte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(offset);
  f.write(&c, 1);
}

TEST(DiskTierTest, StoredBlocksReadBackBitwiseAfterTheirParent) {
  TempDir dir("disk_tier");
  auto tier = MakeTier(dir.path(), 8);
  ASSERT_TRUE(tier);
  const Block a = MakeBlock(0x1111, 1), b = MakeBlock(0x2222, 2);
  const uint64_t ua = tier->NewUid(), ub = tier->NewUid();
  EXPECT_NE(ua, DiskTier::kRootUid);
  EXPECT_NE(ua, ub);
  ASSERT_TRUE(tier->Store({a.hash, ua, DiskTier::kRootUid, a.tokens}, a.kv.data()).ok());
  ASSERT_TRUE(tier->Store({b.hash, ub, ua, b.tokens}, b.kv.data()).ok());
  EXPECT_TRUE(fs::exists(tier->PathOf(a.hash)));
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(tier->PathOf(b.hash))), tier->file_bytes());
  EXPECT_EQ(tier->stats().blocks, 2);
  EXPECT_EQ(tier->stats().stored_bytes, 2 * tier->file_bytes());

  // The chain: a after the root, b after a, with their own tokens; nothing else.
  EXPECT_EQ(tier->Find(a.hash, DiskTier::kRootUid, a.tokens), ua);
  EXPECT_EQ(tier->Find(b.hash, ua, b.tokens), ub);
  EXPECT_FALSE(tier->Find(b.hash, DiskTier::kRootUid, b.tokens));  // same name, other parent
  EXPECT_FALSE(tier->Find(b.hash, ub, b.tokens));
  std::vector<int32_t> other = b.tokens;
  other[5] ^= 1;
  EXPECT_FALSE(tier->Find(b.hash, ua, other));  // same name and parent, other tokens
  EXPECT_FALSE(tier->Find(0x3333, ua, b.tokens));

  std::vector<uint8_t> kv(Layout().BlockBytes(), 0);
  ASSERT_TRUE(tier->Load(b.hash, ub, kv.data()).ok());
  EXPECT_EQ(kv, b.kv);
  ASSERT_TRUE(tier->Load(a.hash, ua, kv.data()).ok());
  EXPECT_EQ(kv, a.kv);
  EXPECT_EQ(tier->Load(a.hash, ub, kv.data()).code(), StatusCode::kNotFound);  // another uid
  EXPECT_EQ(tier->stats().restored_blocks, 2);
  EXPECT_EQ(tier->stats().corrupt, 0);

  // Storing the same uid again writes nothing; another uid under the name replaces the file.
  ASSERT_TRUE(tier->Store({a.hash, ua, DiskTier::kRootUid, a.tokens}, a.kv.data()).ok());
  EXPECT_EQ(tier->stats().stored_blocks, 2);
  const Block a2 = MakeBlock(0x1111, 3);
  const uint64_t ua2 = tier->NewUid();
  ASSERT_TRUE(tier->Store({a2.hash, ua2, DiskTier::kRootUid, a2.tokens}, a2.kv.data()).ok());
  EXPECT_EQ(tier->stats().blocks, 2);
  EXPECT_FALSE(tier->Find(a.hash, DiskTier::kRootUid, a.tokens));
  ASSERT_TRUE(tier->Load(a2.hash, ua2, kv.data()).ok());
  EXPECT_EQ(kv, a2.kv);

  // The destructor deletes the tier's files.
  const std::string path = tier->PathOf(b.hash);
  tier.reset();
  EXPECT_FALSE(fs::exists(path));
}

TEST(DiskTierTest, DamagedFilesAreDetectedCountedAndDeleted) {
  TempDir dir("disk_tier");
  auto tier = MakeTier(dir.path(), 8);
  ASSERT_TRUE(tier);
  std::vector<uint8_t> kv(Layout().BlockBytes());
  const int64_t kv_offset = static_cast<int64_t>(DiskTier::kHeaderBytes + 4 * Layout().tokens_per_block);
  struct Damage {
    const char* what;
    std::function<void(const std::string&)> apply;
  };
  const std::vector<Damage> damages = {
      {"a flipped KV byte", [&](const std::string& p) { FlipByte(p, kv_offset + 1000); }},
      {"a flipped token byte", [&](const std::string& p) { FlipByte(p, DiskTier::kHeaderBytes + 2); }},
      {"a flipped checksum byte", [&](const std::string& p) { FlipByte(p, 97); }},
      {"a bad magic", [&](const std::string& p) { FlipByte(p, 0); }},
      {"another layout", [&](const std::string& p) { FlipByte(p, 48); }},
      {"a truncated file", [&](const std::string& p) { fs::resize_file(p, fs::file_size(p) - 1); }},
      {"an empty file", [&](const std::string& p) { fs::resize_file(p, 0); }},
      {"a longer file", [&](const std::string& p) { std::ofstream(p, std::ios::app) << "x"; }},
      {"a deleted file", [&](const std::string& p) { fs::remove(p); }},
  };
  int64_t corrupt = 0;
  for (size_t i = 0; i < damages.size(); ++i) {
    const Block b = MakeBlock(0x100 + i, static_cast<uint32_t>(10 + i));
    const uint64_t uid = tier->NewUid();
    ASSERT_TRUE(tier->Store({b.hash, uid, DiskTier::kRootUid, b.tokens}, b.kv.data()).ok());
    damages[i].apply(tier->PathOf(b.hash));
    const Status s = tier->Load(b.hash, uid, kv.data());
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << damages[i].what << ": " << s.ToString();
    EXPECT_EQ(tier->stats().corrupt, ++corrupt) << damages[i].what;
    EXPECT_FALSE(fs::exists(tier->PathOf(b.hash))) << damages[i].what;
    EXPECT_FALSE(tier->Find(b.hash, DiskTier::kRootUid, b.tokens)) << damages[i].what;
    EXPECT_EQ(tier->stats().blocks, 0);
    EXPECT_EQ(tier->stats().bytes, 0);
  }
  EXPECT_EQ(tier->stats().restored_blocks, 0);
}

TEST(DiskTierTest, AFileOfAnotherNamespaceIsRejected) {
  // Two tiers (two engines) whose first blocks have the same name and uid: a file copied from
  // one directory to the other is another namespace's block, and is dropped.
  TempDir d1("disk_tier"), d2("disk_tier");
  auto t1 = MakeTier(d1.path(), 4, /*ns=*/1);
  auto t2 = MakeTier(d2.path(), 4, /*ns=*/2);
  ASSERT_TRUE(t1 && t2);
  const Block b = MakeBlock(0xabc, 4);
  const uint64_t u1 = t1->NewUid(), u2 = t2->NewUid();
  ASSERT_EQ(u1, u2);
  ASSERT_TRUE(t1->Store({b.hash, u1, DiskTier::kRootUid, b.tokens}, b.kv.data()).ok());
  ASSERT_TRUE(t2->Store({b.hash, u2, DiskTier::kRootUid, b.tokens}, b.kv.data()).ok());
  fs::copy_file(t1->PathOf(b.hash), t2->PathOf(b.hash), fs::copy_options::overwrite_existing);
  std::vector<uint8_t> kv(Layout().BlockBytes());
  const Status s = t2->Load(b.hash, u2, kv.data());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.ToString().find("namespace"), std::string::npos) << s.ToString();
  EXPECT_EQ(t2->stats().corrupt, 1);
  // The original still loads.
  ASSERT_TRUE(t1->Load(b.hash, u1, kv.data()).ok());
  EXPECT_EQ(kv, b.kv);
}

TEST(DiskTierTest, TheSizeBoundDropsTheLeastRecentlyUsedFiles) {
  TempDir dir("disk_tier");
  auto tier = MakeTier(dir.path(), 3);
  ASSERT_TRUE(tier);
  std::vector<Block> blocks;
  std::vector<uint64_t> uids;
  for (uint32_t i = 0; i < 3; ++i) {
    blocks.push_back(MakeBlock(0x10 + i, 20 + i));
    uids.push_back(tier->NewUid());
    ASSERT_TRUE(tier->Store({blocks[i].hash, uids[i], DiskTier::kRootUid, blocks[i].tokens}, blocks[i].kv.data()).ok());
  }
  EXPECT_EQ(tier->stats().bytes, 3 * tier->file_bytes());
  // Block 0 is used again (found), so block 1 is now the least recently used.
  EXPECT_TRUE(tier->Find(blocks[0].hash, DiskTier::kRootUid, blocks[0].tokens));
  for (uint32_t i = 3; i < 5; ++i) {
    blocks.push_back(MakeBlock(0x10 + i, 20 + i));
    uids.push_back(tier->NewUid());
    ASSERT_TRUE(tier->Store({blocks[i].hash, uids[i], DiskTier::kRootUid, blocks[i].tokens}, blocks[i].kv.data()).ok());
    EXPECT_LE(tier->stats().bytes, tier->max_bytes());
  }
  // Dropped: 1 then 2 (oldest first); kept: 0, 3, 4.
  EXPECT_EQ(tier->stats().evictions, 2);
  EXPECT_EQ(tier->stats().blocks, 3);
  for (uint32_t i : {1u, 2u}) {
    EXPECT_FALSE(fs::exists(tier->PathOf(blocks[i].hash))) << i;
    EXPECT_FALSE(tier->Find(blocks[i].hash, DiskTier::kRootUid, blocks[i].tokens)) << i;
  }
  std::vector<uint8_t> kv(Layout().BlockBytes());
  for (uint32_t i : {0u, 3u, 4u}) {
    ASSERT_TRUE(tier->Load(blocks[i].hash, uids[i], kv.data()).ok()) << i;
    EXPECT_EQ(kv, blocks[i].kv) << i;
  }
  int64_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) files += e.path().extension() == ".kvblock";
  EXPECT_EQ(files, 3);
}

TEST(DiskTierTest, AFailedWriteIsCountedAndKeepsNothing) {
  TempDir dir("disk_tier");
  const std::string sub = dir / "tier";
  auto tier = MakeTier(sub, 4);
  ASSERT_TRUE(tier);
  fs::remove_all(sub);  // the directory vanishes under the tier
  const Block b = MakeBlock(0x77, 7);
  const Status s = tier->Store({b.hash, tier->NewUid(), DiskTier::kRootUid, b.tokens}, b.kv.data());
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_EQ(tier->stats().write_errors, 1);
  EXPECT_EQ(tier->stats().blocks, 0);
  EXPECT_EQ(tier->stats().stored_blocks, 0);
  EXPECT_FALSE(tier->Find(b.hash, DiskTier::kRootUid, b.tokens));
}

TEST(DiskTierTest, OneTierPerDirectoryAndStaleFilesAreDeleted) {
  TempDir dir("disk_tier");
  fs::create_directories(dir.path());
  std::ofstream(dir.path() + "/00000000000000aa.kvblock") << "left by an earlier run";
  std::ofstream(dir.path() + "/notes.txt") << "not the tier's";
  auto tier = MakeTier(dir.path(), 2);
  ASSERT_TRUE(tier);
  EXPECT_FALSE(fs::exists(dir.path() + "/00000000000000aa.kvblock"));
  EXPECT_TRUE(fs::exists(dir.path() + "/notes.txt"));
  auto second = DiskTier::Create({dir.path(), tier->max_bytes()}, Layout(), 7);
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition) << second.status().ToString();
  tier.reset();
  EXPECT_TRUE(DiskTier::Create({dir.path(), 1 << 30}, Layout(), 7).ok());  // the lock went with it
  EXPECT_EQ(DiskTier::Create({dir.path(), 100}, Layout(), 7).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DiskTier::Create({"", 1 << 30}, Layout(), 7).status().code(), StatusCode::kInvalidArgument);
}

// The pool with a tier: the idle cached blocks Allocate evicts are stored (tail first, so each
// parent's uid is known), a lookup reads them back bitwise after the blocks still in memory, a
// block stored before is not written again, and a disk chain that would end below min_blocks
// is not read at all.
TEST(BlockPoolDiskTierTest, EvictedBlocksComeBackBitwiseAfterTheBlocksInMemory) {
  TempDir dir("pool_tier");
  const KvLayout l = Layout();
  const int64_t bb = static_cast<int64_t>(l.BlockBytes());
  auto created = BlockPool::Create(l, 4 * bb);
  ASSERT_TRUE(created.ok());
  BlockPool& pool = **created;
  auto tier = MakeTier(dir.path(), 64, /*ns=*/1);
  ASSERT_TRUE(tier);
  pool.AttachDiskTier(std::move(tier));
  ASSERT_TRUE(pool.has_disk_tier());

  std::mt19937 rng(5);
  std::vector<int32_t> tokens(48);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 1000);
  std::vector<uint64_t> hashes;
  ExtendChain(1, tokens, 16, 3, &hashes);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.Allocate(3, &a).ok());
  std::vector<std::vector<uint8_t>> bytes(3, std::vector<uint8_t>(static_cast<size_t>(bb)));
  CachedBlockId parent = PrefixCache::Root(1);
  for (size_t j = 0; j < 3; ++j) {
    for (auto& x : bytes[j]) x = static_cast<uint8_t>(rng());
    std::memcpy(pool.base() + a[j] * bb, bytes[j].data(), static_cast<size_t>(bb));
    auto id = pool.Register(a[j], hashes[j], parent, std::span<const int32_t>(tokens).subspan(16 * j, 16));
    ASSERT_TRUE(id);
    parent = *id;
  }
  pool.Free(a);
  // Four blocks wanted: the free one, then the three idle ones (tail first), each stored.
  std::vector<int32_t> b;
  ASSERT_TRUE(pool.Allocate(4, &b).ok());
  EXPECT_EQ(pool.evictions(), 3);
  EXPECT_EQ(pool.disk_tier_stats().stored_blocks, 3);
  for (int32_t id : b) std::memset(pool.base() + id * bb, 0, static_cast<size_t>(bb));
  pool.Free(b);
  EXPECT_EQ(pool.n_cached(), 0);

  // The caller would take no fewer than 4 blocks: nothing is read.
  std::vector<CachedBlockId> hit;
  EXPECT_EQ(pool.MatchPrefix(PrefixCache::Root(1), hashes, tokens, 3, &hit, /*min_blocks=*/4), 0);
  EXPECT_EQ(pool.disk_tier_stats().restored_blocks, 0);
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
  // Another namespace's root finds nothing on disk either.
  EXPECT_EQ(pool.MatchPrefix(PrefixCache::Root(2), hashes, tokens, 3, &hit), 0);
  EXPECT_EQ(pool.MatchPrefix(PrefixCache::Root(1), hashes, tokens, 3, &hit, 3), 3);
  EXPECT_EQ(pool.disk_tier_stats().restored_blocks, 3);
  ASSERT_EQ(hit.size(), 3u);
  for (size_t j = 0; j < 3; ++j)
    EXPECT_EQ(std::memcmp(pool.base() + hit[j].block * bb, bytes[j].data(), static_cast<size_t>(bb)), 0) << j;
  EXPECT_EQ(pool.n_cached(), 3);

  // Evict only the last block again (it is on disk already: not written twice), then look up:
  // two blocks from memory, the third from disk.
  std::vector<int32_t> held;
  for (const CachedBlockId& h : hit) held.push_back(h.block);
  pool.Free(held);
  std::vector<int32_t> c;
  ASSERT_TRUE(pool.Allocate(2, &c).ok());
  EXPECT_EQ(c[1], held[2]);
  EXPECT_EQ(pool.disk_tier_stats().stored_blocks, 3);
  std::memset(pool.base() + c[1] * bb, 0, static_cast<size_t>(bb));
  pool.Free(c);
  hit.clear();
  EXPECT_EQ(pool.MatchPrefix(PrefixCache::Root(1), hashes, tokens, 3, &hit), 3);
  EXPECT_EQ(pool.disk_tier_stats().restored_blocks, 4);
  EXPECT_EQ(hit[0].block, held[0]);
  EXPECT_EQ(hit[1].block, held[1]);
  EXPECT_EQ(std::memcmp(pool.base() + hit[2].block * bb, bytes[2].data(), static_cast<size_t>(bb)), 0);
  held.clear();
  for (const CachedBlockId& h : hit) held.push_back(h.block);
  pool.Free(held);
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
  EXPECT_EQ(pool.EvictIdle(), 3);
  EXPECT_EQ(pool.disk_tier_stats().blocks, 3);  // EvictIdle writes nothing and keeps the files
}

// The cluster's index hears of a name while memory or the tier holds it (docs/prefix-cache.md
// "Events"): a block spilled to disk is no removal, a file the tier's bound deletes is one (when
// memory does not hold the name), and the whole set lists the tier's names too.
TEST(BlockPoolDiskTierTest, EventsCountANameHeldWhileMemoryOrTheTierHasIt) {
  TempDir dir("pool_tier_events");
  const KvLayout l = Layout();
  const int64_t bb = static_cast<int64_t>(l.BlockBytes());
  auto created = BlockPool::Create(l, 4 * bb);
  ASSERT_TRUE(created.ok());
  BlockPool& pool = **created;
  pool.AttachDiskTier(MakeTier(dir.path(), 3, /*ns=*/1));
  EXPECT_EQ(pool.disk_tier_capacity_blocks(), 3);
  std::set<uint64_t> mirror;  // what a reader of the events believes is held
  auto read = [&](bool full) {
    const KvEventBatch b = pool.TakeKvEvents(full);
    if (b.reset) mirror.clear();
    for (uint64_t h : b.removed) mirror.erase(h);
    for (uint64_t h : b.stored) mirror.insert(h);
  };
  std::mt19937 rng(9);
  // Registers a 3-block chain (random tokens and bytes) and frees it: idle cached blocks.
  auto chain = [&]() {
    std::vector<int32_t> tokens(48);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % 1000);
    std::vector<uint64_t> hashes;
    ExtendChain(1, tokens, 16, 3, &hashes);
    std::vector<int32_t> ids;
    EXPECT_TRUE(pool.Allocate(3, &ids).ok());
    CachedBlockId parent = PrefixCache::Root(1);
    for (size_t j = 0; j < 3; ++j) {
      for (int64_t k = 0; k < bb; ++k) pool.base()[ids[j] * bb + k] = static_cast<uint8_t>(rng());
      auto id = pool.Register(ids[j], hashes[j], parent, std::span<const int32_t>(tokens).subspan(16 * j, 16));
      EXPECT_TRUE(id);
      parent = *id;
    }
    pool.Free(ids);
    return std::make_pair(tokens, hashes);
  };
  auto spill_all = [&]() {
    std::vector<int32_t> all;
    ASSERT_TRUE(pool.Allocate(4, &all).ok());
    pool.Free(all);
  };
  const auto [tokens_a, a] = chain();
  read(false);
  EXPECT_EQ(mirror, std::set<uint64_t>(a.begin(), a.end()));
  spill_all();  // all three to disk: still held
  EXPECT_EQ(pool.n_cached(), 0);
  EXPECT_EQ(pool.disk_tier_stats().blocks, 3);
  read(false);
  EXPECT_EQ(mirror, std::set<uint64_t>(a.begin(), a.end()));
  const auto [tokens_b, b] = chain();
  spill_all();  // b's three to disk; the bound (3 files) deletes a's: gone everywhere
  EXPECT_EQ(pool.disk_tier_stats().evictions, 3);
  read(false);
  EXPECT_EQ(mirror, std::set<uint64_t>(b.begin(), b.end()));
  read(true);  // the whole set: the tier's names
  EXPECT_EQ(mirror, std::set<uint64_t>(b.begin(), b.end()));
  // Read back into memory (memory and disk both hold b now), then dropped from memory again.
  std::vector<CachedBlockId> hit;
  ASSERT_EQ(pool.MatchPrefix(PrefixCache::Root(1), b, tokens_b, 3, &hit), 3);
  std::vector<int32_t> held;
  for (const CachedBlockId& h : hit) held.push_back(h.block);
  pool.Free(held);
  EXPECT_EQ(pool.EvictIdle(), 3);
  read(false);
  EXPECT_EQ(mirror, std::set<uint64_t>(b.begin(), b.end()));
  (void)tokens_a;
}

}  // namespace
}  // namespace pdserve::engine
