#include "kvtransfer/transfer_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kvtransfer/testing/kv_pattern.h"

namespace pdserve::kvtransfer {
namespace {

using testing::CheckDestination;
using testing::SourceCache;

// A decode pool in plain memory plus a descriptor over (possibly shuffled) blocks.
struct DestPool {
  std::vector<uint8_t> memory;
  KvDescriptor d;
  DestPool(const KvLayout& layout, uint32_t num_tokens, bool shuffle, std::mt19937_64& rng) {
    const uint64_t blocks = layout.BlocksForTokens(num_tokens);
    const uint64_t pool_blocks = blocks * 2 + 1;
    memory.assign(pool_blocks * layout.BlockBytes(), 0);
    d.request_id = 5;
    d.decode_address = "decode";
    d.layout = layout;
    d.region = {reinterpret_cast<uint64_t>(memory.data()), memory.size(), "key"};
    d.num_tokens = num_tokens;
    std::vector<uint32_t> ids(pool_blocks);
    for (uint32_t i = 0; i < pool_blocks; ++i) ids[i] = i;
    if (shuffle) std::shuffle(ids.begin(), ids.end(), rng);
    for (uint64_t i = 0; i < blocks; ++i) {
      d.block_ids.push_back(ids[i]);
      d.block_addresses.push_back(d.region.base_address + ids[i] * layout.BlockBytes());
    }
    d.transfer_timeout_ms = 1000;
  }
  void Apply(const WritePlan& plan) {
    for (const PlannedWrite& w : plan.writes) {
      ASSERT_TRUE(RangeWithin(w.dst_address, w.length, d.region.base_address, d.region.length));
      std::memcpy(reinterpret_cast<uint8_t*>(w.dst_address), w.src, w.length);
    }
  }
};

KvLayout RandomLayout(std::mt19937_64& rng) {
  KvLayout l;
  l.num_layers = 1 + rng() % 4;
  l.kv_lora_rank = 64u << (rng() % 4);
  l.qk_rope_head_dim = 16u << (rng() % 3);
  l.index_head_dim = (rng() % 4 == 0) ? 0 : 32u << (rng() % 3);
  l.latent_format = static_cast<KvLatentFormat>(rng() % 3);
  l.index_format = static_cast<KvIndexFormat>(rng() % 2);
  l.latent_scale_group = 64;
  const uint32_t sizes[] = {1, 3, 16, 32, 64, 128};
  l.tokens_per_block = sizes[rng() % 6];
  return l;
}

TEST(TransferPlanTest, RandomLayoutsCopyByteExactAcrossBlockSizes) {
  std::mt19937_64 rng(1234);
  for (int iter = 0; iter < 60; ++iter) {
    KvLayout src_layout = RandomLayout(rng);
    ASSERT_TRUE(src_layout.Validate().ok());
    const uint32_t sizes[] = {1, 5, 16, 64, 128};
    KvLayout dst_layout = src_layout.WithTokensPerBlock(sizes[rng() % 5]);
    const uint32_t lengths[] = {1, dst_layout.tokens_per_block + 1, 200, 777};
    const uint32_t n = lengths[rng() % 4];
    const uint32_t cp = 1 + rng() % 4;
    DestPool pool(dst_layout, n, rng() % 2, rng);
    for (uint32_t rank = 0; rank < cp; ++rank) {
      TokenRange slice = ContiguousCpSlice(n, cp, rank);
      if (slice.empty()) continue;
      SourceCache cache(src_layout, {slice}, 99, 5);
      ASSERT_TRUE(ValidateSource(cache.source(), dst_layout, {slice}).ok());
      uint64_t bytes = 0;
      std::vector<uint64_t> src_digests, dst_digests;
      for (uint32_t l = 0; l < src_layout.num_layers; ++l) {
        WritePlan plan = PlanWrites(cache.source(), pool.d, {slice}, l, 1);
        pool.Apply(plan);
        bytes += plan.bytes;
        src_digests.push_back(SourceLayerDigest(cache.source(), {slice}, l));
      }
      for (uint32_t l = 0; l < src_layout.num_layers; ++l) {
        dst_digests.push_back(DestinationLayerDigest(pool.d, pool.memory.data(), {slice}, l));
      }
      EXPECT_EQ(bytes, BytesForRanges(dst_layout, {slice}));
      EXPECT_EQ(CombineLayerDigests(src_digests), CombineLayerDigests(dst_digests))
          << "iter " << iter << " src " << src_layout.ToString() << " dst B "
          << dst_layout.tokens_per_block;
    }
    Status ok = CheckDestination(pool.d, pool.memory.data(), {{0, n}}, 99);
    ASSERT_TRUE(ok.ok()) << "iter " << iter << ": " << ok.ToString() << " src "
                         << src_layout.ToString() << " dst B " << dst_layout.tokens_per_block
                         << " n " << n << " cp " << cp;
  }
}

TEST(TransferPlanTest, EqualBlockSizesWriteOneSlabPerBlockAndLayer) {
  std::mt19937_64 rng(1);
  KvLayout layout = KvLayout::DeepSeekV32(3, 16);
  DestPool pool(layout, 64, /*shuffle=*/true, rng);
  SourceCache cache(layout, {{0, 64}}, 1, 5);
  WritePlan plan = PlanWrites(cache.source(), pool.d, {{0, 64}}, 1, 1);
  // 4 blocks, one layer: one write per block (the 5 components merged).
  EXPECT_EQ(plan.writes.size(), 4u);
  for (const PlannedWrite& w : plan.writes) EXPECT_EQ(w.length, layout.SlabBytes());
}

TEST(TransferPlanTest, AdjacentWholeBlocksCoalesce) {
  std::mt19937_64 rng(1);
  KvLayout layout = KvLayout::DeepSeekV32(3, 16);
  DestPool pool(layout, 64, /*shuffle=*/false, rng);  // blocks 0..3, adjacent
  SourceCache cache(layout, {{0, 64}}, 1, 5);
  WritePlan plan = PlanWrites(cache.source(), pool.d, {{0, 64}}, 0, 3);
  ASSERT_EQ(plan.writes.size(), 1u);
  EXPECT_EQ(plan.writes[0].length, 4 * layout.BlockBytes());
  // A partial last block cannot be written whole: 3 whole blocks + per-component pieces.
  SourceCache partial(layout, {{0, 60}}, 1, 5);
  plan = PlanWrites(partial.source(), pool.d, {{0, 60}}, 0, 3);
  EXPECT_EQ(plan.writes.front().length, 3 * layout.BlockBytes() + 12 * 512);
  EXPECT_EQ(plan.bytes, BytesForRanges(layout, {{0, 60}}));
}

TEST(TransferPlanTest, DigestDetectsASingleFlippedByte) {
  std::mt19937_64 rng(3);
  KvLayout layout = KvLayout::DeepSeekV32(2, 32);
  DestPool pool(layout, 50, true, rng);
  SourceCache cache(layout, {{0, 50}}, 1, 5);
  pool.Apply(PlanWrites(cache.source(), pool.d, {{0, 50}}, 0, 2));
  const uint64_t good = DestinationLayerDigest(pool.d, pool.memory.data(), {{0, 50}}, 1);
  EXPECT_EQ(good, SourceLayerDigest(cache.source(), {{0, 50}}, 1));
  uint8_t* byte = reinterpret_cast<uint8_t*>(pool.d.block_addresses[1]) +
                  layout.Offset(1, KvComponent::kIndexScales, 3);
  *byte ^= 1;
  EXPECT_NE(good, DestinationLayerDigest(pool.d, pool.memory.data(), {{0, 50}}, 1));
}

TEST(TransferPlanTest, ValidateSourceRejectsMissingTokensAndOtherFormats) {
  KvLayout layout = KvLayout::DeepSeekV32(2, 16);
  SourceCache cache(layout, {{0, 40}}, 1, 5);
  EXPECT_TRUE(ValidateSource(cache.source(), layout.WithTokensPerBlock(64), {{0, 40}}).ok());
  EXPECT_EQ(ValidateSource(cache.source(), layout, {{0, 41}}).code(),
            StatusCode::kInvalidArgument);
  KvLayout other = layout;
  other.latent_format = KvLatentFormat::kBf16;
  EXPECT_EQ(ValidateSource(cache.source(), other, {{0, 40}}).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::kvtransfer
