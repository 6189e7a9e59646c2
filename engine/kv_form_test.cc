// What the prefix cache relies on (docs/prefix-cache.md, "Which blocks are interchangeable"):
// beyond the first prefill chunk, a position's KV bytes depend only on the tokens up to it, not
// on how its rows were cut into model calls (a prompt chunk on the grid, a chunk cut anywhere,
// or one decode row at a time). Positions inside the first chunk depend on that chunk being one
// non-absorbed prefill call, which a cached prefix always covers whole.
// To add a case: run the same tokens through Model::Forward with another cut and compare.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "engine/engine_test_util.h"
#include "model/kv_cache.h"

namespace pdserve::engine {
namespace {

using testing::TinyModel;

// Runs `tokens` through one SequenceKvCache in calls of the given lengths (summing to the size).
std::unique_ptr<model::SequenceKvCache> RunCuts(const std::vector<int32_t>& tokens, const std::vector<int64_t>& cuts,
                                                KvLatentFormat latent) {
  const model::Model& m = TinyModel();
  auto cache = std::make_unique<model::SequenceKvCache>(m.config(), 16, latent);
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  int64_t at = 0;
  for (int64_t n : cuts) {
    PDSERVE_CHECK(m.Forward(&tokens[static_cast<size_t>(at)], n, cache.get(), logits.data()).ok());
    at += n;
  }
  PDSERVE_CHECK(at == static_cast<int64_t>(tokens.size()));
  return cache;
}

// First position in [from, to) whose KV bytes (any layer, any component) differ, or -1.
int64_t FirstDifference(model::SequenceKvCache& a, model::SequenceKvCache& b, int64_t from, int64_t to) {
  const KvLayout& l = a.layout();
  const model::KvSequenceRef ra = a.Ref(), rb = b.Ref();
  for (int64_t p = from; p < to; ++p)
    for (uint32_t layer = 0; layer < l.num_layers; ++layer)
      for (KvComponent c : kAllKvComponents) {
        const uint64_t n = l.ComponentBytesPerToken(c);
        if (n && std::memcmp(ra.Field(layer, c, p), rb.Field(layer, c, p), n) != 0) return p;
      }
  return -1;
}

TEST(KvFormTest, KvBeyondTheFirstChunkDoesNotDependOnTheCuts) {
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(200);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 1024);
  for (KvLatentFormat f : {KvLatentFormat::kFp8Blockwise, KvLatentFormat::kBf16, KvLatentFormat::kInt8PerToken}) {
    // Grid of 48: [0,48) [48,96) [96,144) [144,192) [192,200).
    auto grid = RunCuts(tokens, {48, 48, 48, 48, 8}, f);
    // The first chunk, then cuts off the grid.
    auto odd = RunCuts(tokens, {48, 16, 70, 3, 1, 62}, f);
    // The first chunk, then one row at a time (decode).
    std::vector<int64_t> rows = {48};
    rows.resize(200 - 48 + 1, 1);
    auto decode = RunCuts(tokens, rows, f);
    EXPECT_EQ(FirstDifference(*grid, *odd, 0, 200), -1) << LatentFormatName(f);
    EXPECT_EQ(FirstDifference(*grid, *decode, 0, 200), -1) << LatentFormatName(f);
  }
}

TEST(KvFormTest, TheFirstChunkIsAnotherForm) {
  // The same positions computed by a first chunk (non-absorbed prefill) and by later calls
  // (absorbed) differ: a cached prefix must cover the first chunk whole or not at all.
  std::mt19937 rng(4);
  std::vector<int32_t> tokens(96);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 1024);
  auto whole = RunCuts(tokens, {96}, KvLatentFormat::kFp8Blockwise);
  auto split = RunCuts(tokens, {32, 64}, KvLatentFormat::kFp8Blockwise);
  EXPECT_EQ(FirstDifference(*whole, *split, 0, 32), -1);
  EXPECT_NE(FirstDifference(*whole, *split, 32, 96), -1);
}

}  // namespace
}  // namespace pdserve::engine
