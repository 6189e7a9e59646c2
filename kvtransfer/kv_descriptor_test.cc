#include "kvtransfer/kv_descriptor.h"

#include <gtest/gtest.h>

#include <limits>

namespace pdserve::kvtransfer {
namespace {

KvDescriptor MakeDescriptor(uint32_t num_tokens) {
  KvDescriptor d;
  d.request_id = 7;
  d.decode_address = "peer";
  d.layout = KvLayout::DeepSeekV32(2, 16);
  d.num_tokens = num_tokens;
  const uint64_t blocks = d.layout.BlocksForTokens(num_tokens);
  d.region.base_address = 0x10000;
  d.region.length = (blocks + 2) * d.layout.BlockBytes();
  for (uint32_t i = 0; i < blocks; ++i) {
    d.block_ids.push_back(i + 1);
    d.block_addresses.push_back(d.region.base_address + (i + 1) * d.layout.BlockBytes());
  }
  d.writers = {WriterAssignment{0, {{0, num_tokens}}}};
  d.transfer_timeout_ms = 1000;
  return d;
}

TEST(RangeWithinTest, OverflowSafe) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  EXPECT_TRUE(RangeWithin(100, 10, 100, 10));
  EXPECT_FALSE(RangeWithin(100, 11, 100, 10));
  EXPECT_FALSE(RangeWithin(99, 1, 100, 10));
  EXPECT_TRUE(RangeWithin(110, 0, 100, 10));
  EXPECT_FALSE(RangeWithin(111, 0, 100, 10));
  EXPECT_FALSE(RangeWithin(max - 1, 4, max - 10, 10));  // wraps around 2^64
  EXPECT_FALSE(RangeWithin(105, max, 100, 10));
  EXPECT_TRUE(RangeWithin(max - 5, 5, max - 10, 10));
}

TEST(KvDescriptorTest, ValidDescriptorPasses) {
  KvDescriptor d = MakeDescriptor(33);
  EXPECT_TRUE(d.Validate().ok()) << d.Validate().ToString();
  EXPECT_EQ(d.CountBlocks({{0, 33}}), 3u);
  EXPECT_EQ(d.CountBlocks({{0, 1}, {15, 17}}), 2u);
  EXPECT_EQ(d.CountBlocks({{3, 5}, {6, 7}}), 1u);
}

TEST(KvDescriptorTest, RejectsBlocksOutsideTheRegion) {
  KvDescriptor d = MakeDescriptor(40);
  d.block_addresses[1] = d.region.base_address + d.region.length - 8;
  EXPECT_EQ(d.Validate().code(), StatusCode::kInvalidArgument);
  d = MakeDescriptor(40);
  d.block_addresses[0] = std::numeric_limits<uint64_t>::max() - 100;  // would wrap
  EXPECT_EQ(d.Validate().code(), StatusCode::kInvalidArgument);
  d = MakeDescriptor(40);
  d.block_addresses[0] = d.region.base_address - 1;
  EXPECT_EQ(d.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(KvDescriptorTest, RejectsInconsistentDescriptors) {
  KvDescriptor d = MakeDescriptor(40);
  d.block_addresses[1] = d.block_addresses[0] + 8;  // overlapping blocks
  EXPECT_EQ(d.Validate().code(), StatusCode::kInvalidArgument);
  d = MakeDescriptor(40);
  d.block_ids.pop_back();
  d.block_addresses.pop_back();
  EXPECT_EQ(d.Validate().code(), StatusCode::kInvalidArgument);
  d = MakeDescriptor(40);
  d.block_ids[1] = d.block_ids[0];
  EXPECT_EQ(d.Validate().code(), StatusCode::kInvalidArgument);
  d = MakeDescriptor(40);
  d.writers = {WriterAssignment{0, {{0, 20}}}, WriterAssignment{1, {{19, 40}}}};  // overlap
  EXPECT_EQ(d.Validate().code(), StatusCode::kInvalidArgument);
  d.writers = {WriterAssignment{0, {{0, 20}}}, WriterAssignment{1, {{21, 40}}}};  // gap
  EXPECT_EQ(d.Validate().code(), StatusCode::kInvalidArgument);
  d.writers = {WriterAssignment{0, {{0, 20}}}, WriterAssignment{1, {{20, 40}}}};
  EXPECT_TRUE(d.Validate().ok());
  d.transfer_timeout_ms = 0;
  EXPECT_EQ(d.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(AssignWritersTest, ContextParallelSlicesWriteThemselves) {
  const uint32_t n = 1000;
  std::vector<std::vector<TokenRange>> holdings;
  for (uint32_t r = 0; r < 4; ++r) holdings.push_back({ContiguousCpSlice(n, 4, r)});
  auto writers = AssignWriters(n, holdings);
  ASSERT_TRUE(writers.ok());
  ASSERT_EQ(writers->size(), 4u);
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ((*writers)[r].rank, r);
    EXPECT_EQ((*writers)[r].ranges, holdings[r]);
  }
  EXPECT_TRUE(ValidateWriterAssignment(n, writers.value()).ok());
}

TEST(AssignWritersTest, ReplicatedCopiesHaveExactlyOneWriter) {
  // Ranks 0 and 1 both hold everything (replicated latent); rank 2 holds a copy of the tail.
  auto writers = AssignWriters(100, {{{0, 100}}, {{0, 100}}, {{50, 100}}});
  ASSERT_TRUE(writers.ok());
  ASSERT_EQ(writers->size(), 1u);
  EXPECT_EQ((*writers)[0].rank, 0u);
  EXPECT_EQ((*writers)[0].ranges, (std::vector<TokenRange>{{0, 100}}));
  // Rank 0 holds only the head: rank 1 writes the rest.
  writers = AssignWriters(100, {{{0, 30}}, {{0, 100}}});
  ASSERT_TRUE(writers.ok());
  ASSERT_EQ(writers->size(), 2u);
  EXPECT_EQ((*writers)[1].ranges, (std::vector<TokenRange>{{30, 100}}));
}

TEST(AssignWritersTest, UncoveredTokensAreAnError) {
  EXPECT_EQ(AssignWriters(100, {{{0, 30}}, {{40, 100}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignWriters(100, {{{0, 130}}}).status().code(), StatusCode::kInvalidArgument);
}

TEST(ContiguousCpSliceTest, TilesTheSequence) {
  for (uint32_t n : {1u, 2u, 3u, 17u, 4096u}) {
    uint32_t next = 0;
    for (uint32_t r = 0; r < 4; ++r) {
      TokenRange s = ContiguousCpSlice(n, 4, r);
      EXPECT_EQ(s.begin, next);
      next = s.end;
    }
    EXPECT_EQ(next, n);
  }
}

}  // namespace
}  // namespace pdserve::kvtransfer
