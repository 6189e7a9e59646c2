#include "common/kv_layout.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

TEST(KvLayoutTest, DeepSeekFp8SizesMatchTheModelSpec) {
  KvLayout layout = KvLayout::DeepSeekV32(61, 64);
  ASSERT_TRUE(layout.Validate().ok());
  const uint64_t latent_rope = layout.ComponentBytesPerToken(KvComponent::kLatentCodes) +
                               layout.ComponentBytesPerToken(KvComponent::kLatentScales) +
                               layout.ComponentBytesPerToken(KvComponent::kRope);
  const uint64_t indexer = layout.ComponentBytesPerToken(KvComponent::kIndexCodes) +
                           layout.ComponentBytesPerToken(KvComponent::kIndexScales);
  EXPECT_EQ(latent_rope, 656u);
  EXPECT_EQ(indexer, 132u);
  EXPECT_EQ(layout.TokenBytesPerLayer(), 788u);
  // B = 64 is a multiple of 16: no padding at all.
  EXPECT_EQ(layout.SlabBytes(), 788u * 64);
  EXPECT_EQ(layout.BlockBytes(), 788u * 64 * 61);
}

TEST(KvLayoutTest, OffsetsAreLayerComponentTokenMajor) {
  KvLayout layout = KvLayout::DeepSeekV32(3, 16);
  const uint64_t slab = layout.SlabBytes();
  EXPECT_EQ(layout.Offset(0, KvComponent::kLatentCodes, 0), 0u);
  EXPECT_EQ(layout.Offset(0, KvComponent::kLatentCodes, 1), 512u);
  EXPECT_EQ(layout.Offset(0, KvComponent::kLatentScales, 0), 512u * 16);
  EXPECT_EQ(layout.Offset(0, KvComponent::kRope, 2), 512u * 16 + 16u * 16 + 2 * 128);
  EXPECT_EQ(layout.Offset(2, KvComponent::kIndexScales, 15), 2 * slab + slab - 4);
}

TEST(KvLayoutTest, SmallBlocksArePaddedPerComponent) {
  KvLayout layout = KvLayout::DeepSeekV32(1, 1);
  // Each component array starts 64-byte aligned.
  for (KvComponent c : kAllKvComponents) {
    EXPECT_EQ(layout.ComponentOffset(c) % KvLayout::kComponentAlign, 0u) << KvComponentName(c);
  }
  EXPECT_EQ(layout.SlabBytes(), 512u + 64 + 128 + 128 + 64);
}

TEST(KvLayoutTest, FormatsChangeTheLatentSize) {
  KvLayout layout = KvLayout::DeepSeekV32(1, 16);
  layout.latent_format = KvLatentFormat::kBf16;
  EXPECT_EQ(layout.ComponentBytesPerToken(KvComponent::kLatentCodes), 1024u);
  EXPECT_EQ(layout.ComponentBytesPerToken(KvComponent::kLatentScales), 0u);
  layout.latent_format = KvLatentFormat::kInt8PerToken;
  EXPECT_EQ(layout.ComponentBytesPerToken(KvComponent::kLatentCodes), 512u);
  EXPECT_EQ(layout.ComponentBytesPerToken(KvComponent::kLatentScales), 4u);
  layout.index_head_dim = 0;
  EXPECT_EQ(layout.ComponentBytesPerToken(KvComponent::kIndexScales), 0u);
  EXPECT_TRUE(layout.Validate().ok());
}

TEST(KvLayoutTest, ValidateRejectsBadLayouts) {
  KvLayout good = KvLayout::DeepSeekV32(2, 16);
  KvLayout bad = good;
  bad.num_layers = 0;
  EXPECT_EQ(bad.Validate().code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.tokens_per_block = 0;
  EXPECT_EQ(bad.Validate().code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.kv_lora_rank = 500;  // not a multiple of the scale group
  EXPECT_EQ(bad.Validate().code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.latent_format = static_cast<KvLatentFormat>(9);
  EXPECT_EQ(bad.Validate().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(good.SameTokenFormat(good.WithTokensPerBlock(128)));
  bad = good;
  bad.qk_rope_head_dim = 32;
  EXPECT_FALSE(good.SameTokenFormat(bad));
}

}  // namespace
}  // namespace pdserve
