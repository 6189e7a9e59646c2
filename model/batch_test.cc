// Batched forward tests: every sequence of a mixed batch (prefill chunks at 0, chunks after a
// cached prefix on both GEMM paths, decode rows, per-row recompute runs) gets bitwise the
// logits and KV bytes it gets when run alone, for every KV format and paged block layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "model/model.h"
#include "model/test_util.h"

namespace pdserve::model {
namespace {

using testing::TempDir;

struct Step {
  int64_t n;
  RowGrouping grouping;
};

// A paged pool with shuffled blocks for several sequences.
struct TestPool {
  KvLayout layout;
  std::vector<uint8_t> bytes;
  std::vector<std::vector<int32_t>> tables;
  TestPool(const KvLayout& l, const std::vector<int64_t>& capacities, uint32_t seed) : layout(l) {
    int64_t total = 0;
    for (int64_t c : capacities) total += layout.BlocksForTokens(c);
    bytes.assign(static_cast<size_t>(total * layout.BlockBytes()), 0);
    std::vector<int32_t> ids(static_cast<size_t>(total));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    size_t next = 0;
    for (int64_t c : capacities) {
      tables.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(next),
                          ids.begin() + static_cast<std::ptrdiff_t>(next + layout.BlocksForTokens(c)));
      next += static_cast<size_t>(layout.BlocksForTokens(c));
    }
  }
  KvSequenceRef Ref(size_t s) {
    return {bytes.data(), &layout, tables[s].data(), static_cast<int64_t>(tables[s].size()) * layout.block_tokens};
  }
};

std::vector<uint8_t> KvBytes(const KvSequenceRef& ref, int64_t n_tokens) {
  std::vector<uint8_t> out;
  for (int64_t l = 0; l < ref.layout->num_layers; ++l)
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int c = 0; c < kNumKvComponents; ++c) {
        const auto comp = static_cast<KvComponent>(c);
        const uint8_t* p = ref.Field(l, comp, t);
        out.insert(out.end(), p, p + ref.layout->ComponentBytesPerToken(comp));
      }
  return out;
}

class BatchTest : public ::testing::TestWithParam<std::tuple<std::string, KvLatentFormat, KvIndexFormat>> {};

TEST_P(BatchTest, MixedBatchEqualsEachSequenceAlone) {
  const auto [preset, lf, xf] = GetParam();
  TempDir d("batch_" + preset);
  MakeModelOptions o;
  o.preset = preset;
  o.out_dir = d.path();
  o.seed = 11;
  ASSERT_TRUE(MakeModel(o).ok());
  ThreadPool pool(2);
  auto m = Model::Load(d.path(), &pool);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& cfg = (*m)->config();
  const int64_t V = cfg.vocab_size;
  // Each sequence's steps; round r of the batched run holds step r of every sequence.
  const std::vector<std::vector<Step>> plans = {
      {{20, RowGrouping::kChunk}, {1, RowGrouping::kPerRow}, {1, RowGrouping::kPerRow}},
      {{12, RowGrouping::kChunk}, {12, RowGrouping::kChunk}, {1, RowGrouping::kPerRow}},
      {{30, RowGrouping::kChunk}, {5, RowGrouping::kChunk}},
      {{10, RowGrouping::kChunk}, {3, RowGrouping::kPerRow}, {9, RowGrouping::kPerRow}},
      {{3, RowGrouping::kChunk}, {1, RowGrouping::kPerRow}},
      {{1, RowGrouping::kChunk}, {2, RowGrouping::kPerRow}},
      {{9, RowGrouping::kChunk}},
  };
  const size_t n_seq = plans.size();
  std::vector<std::vector<int32_t>> tokens(n_seq);
  std::vector<int64_t> totals;
  std::mt19937 rng(3);
  for (size_t s = 0; s < n_seq; ++s) {
    int64_t total = 0;
    for (const Step& st : plans[s]) total += st.n;
    for (int64_t i = 0; i < total; ++i) tokens[s].push_back(static_cast<int32_t>(rng() % V));
    totals.push_back(total);
  }
  const KvLayout layout = KvLayout::ForConfig(cfg, 5, lf, xf);

  // Alone: one sequence per call, identity-ordered pool of its own.
  std::vector<std::vector<std::vector<float>>> alone_logits(n_seq);
  std::vector<std::vector<uint8_t>> alone_kv(n_seq);
  for (size_t s = 0; s < n_seq; ++s) {
    TestPool p(layout, {totals[s]}, 1);
    int64_t start = 0;
    for (const Step& st : plans[s]) {
      std::vector<float> logits(static_cast<size_t>(V));
      BatchSequence q{&tokens[s][start], st.n, start, p.Ref(0), st.grouping, logits.data(), nullptr};
      ASSERT_TRUE((*m)->ForwardBatch(std::span<const BatchSequence>(&q, 1)).ok());
      alone_logits[s].push_back(logits);
      start += st.n;
    }
    alone_kv[s] = KvBytes(p.Ref(0), totals[s]);
  }

  // Batched: all sequences' round-r steps in one call, shuffled blocks.
  TestPool p(layout, totals, 9);
  std::vector<int64_t> start(n_seq, 0);
  std::vector<std::vector<float>> logits(n_seq, std::vector<float>(static_cast<size_t>(V)));
  for (size_t round = 0;; ++round) {
    std::vector<BatchSequence> batch;
    std::vector<size_t> who;
    for (size_t s = 0; s < n_seq; ++s) {
      if (round >= plans[s].size()) continue;
      const Step& st = plans[s][round];
      batch.push_back({&tokens[s][start[s]], st.n, start[s], p.Ref(s), st.grouping, logits[s].data(), nullptr});
      who.push_back(s);
    }
    if (batch.empty()) break;
    ASSERT_TRUE((*m)->ForwardBatch(batch).ok());
    for (size_t i = 0; i < who.size(); ++i) {
      const size_t s = who[i];
      EXPECT_EQ(logits[s], alone_logits[s][round]) << "sequence " << s << " round " << round;
      start[s] += plans[s][round].n;
    }
  }
  for (size_t s = 0; s < n_seq; ++s) EXPECT_EQ(KvBytes(p.Ref(s), totals[s]), alone_kv[s]) << "sequence " << s;
}

INSTANTIATE_TEST_SUITE_P(
    Formats, BatchTest,
    ::testing::Values(std::make_tuple("tiny", KvLatentFormat::kFp8Blockwise, KvIndexFormat::kFp8),
                      std::make_tuple("tiny2", KvLatentFormat::kFp8Blockwise, KvIndexFormat::kFp8),
                      std::make_tuple("tiny", KvLatentFormat::kBf16, KvIndexFormat::kInt8),
                      std::make_tuple("tiny2", KvLatentFormat::kInt8PerToken, KvIndexFormat::kFp8)));

// The contiguous cache's block size never changes a number; other KV formats stay close to
// the reference's fp8 form.
TEST(BatchFormatsTest, BlockSizeInvariantAndFormatsClose) {
  TempDir d("batch_blocks");
  MakeModelOptions o;
  o.out_dir = d.path();
  ASSERT_TRUE(MakeModel(o).ok());
  ThreadPool pool(2);
  auto m = Model::Load(d.path(), &pool);
  ASSERT_TRUE(m.ok());
  const ModelConfig& cfg = (*m)->config();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 33; ++i) prompt.push_back((i * 53 + 7) % static_cast<int32_t>(cfg.vocab_size));
  auto run = [&](int64_t block, KvLatentFormat lf, KvIndexFormat xf) {
    SequenceKvCache cache(cfg, block, lf, xf);
    std::vector<float> logits(static_cast<size_t>(cfg.vocab_size)), all;
    EXPECT_TRUE((*m)->Forward(prompt.data(), static_cast<int64_t>(prompt.size()), &cache, logits.data()).ok());
    all = logits;
    for (int step = 0; step < 4; ++step) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      EXPECT_TRUE((*m)->Forward(&next, 1, &cache, logits.data()).ok());
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  };
  const auto ref = run(64, KvLatentFormat::kFp8Blockwise, KvIndexFormat::kFp8);
  EXPECT_EQ(run(1, KvLatentFormat::kFp8Blockwise, KvIndexFormat::kFp8), ref);
  EXPECT_EQ(run(7, KvLatentFormat::kFp8Blockwise, KvIndexFormat::kFp8), ref);
  EXPECT_EQ(run(1000, KvLatentFormat::kFp8Blockwise, KvIndexFormat::kFp8), ref);
  // The other formats: bf16 keeps the latent before the fp8 round trip, C8 quantizes it with
  // a finer step (amax/127 vs e4m3's 3 mantissa bits), so C8 lands much closer to bf16 than
  // the reference's fp8 form does. Prompt logits only (later greedy tokens may differ).
  auto cosine = [&](const std::vector<float>& a, const std::vector<float>& b) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < static_cast<size_t>(cfg.vocab_size); ++i)
      ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
    return ab / std::sqrt(aa * bb);
  };
  const auto bf16 = run(16, KvLatentFormat::kBf16, KvIndexFormat::kFp8);
  const auto c8 = run(16, KvLatentFormat::kInt8PerToken, KvIndexFormat::kFp8);
  const auto c8_i8 = run(16, KvLatentFormat::kInt8PerToken, KvIndexFormat::kInt8);
  EXPECT_GT(cosine(bf16, c8), 0.999);
  EXPECT_GT(cosine(c8, c8_i8), 0.99);
  EXPECT_GT(cosine(ref, bf16), 0.9);
  EXPECT_GT(cosine(ref, c8_i8), 0.9);
}

// The indexer's two routes give the same model: a traced forward scores every key exactly
// (the trace records the scores), an untraced one selects from certified fp32 scores and
// rescores only keys near the cut (kernels/indexer.h). Prompts and contexts well past
// index_topk, every key format: logits and selections bitwise equal.
TEST(BatchIndexerTest, CertifiedSelectionEqualsExactScoring) {
  for (KvIndexFormat xf : {KvIndexFormat::kFp8, KvIndexFormat::kInt8}) {
    TempDir d("batch_indexer");
    MakeModelOptions o;
    o.preset = "tiny";
    o.out_dir = d.path();
    o.seed = 5;
    ASSERT_TRUE(MakeModel(o).ok());
    ThreadPool pool(2);
    auto m = Model::Load(d.path(), &pool);
    ASSERT_TRUE(m.ok());
    const ModelConfig& cfg = (*m)->config();
    ASSERT_LT(cfg.index_topk, 40);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 90; ++i) prompt.push_back((i * 37 + 11) % static_cast<int32_t>(cfg.vocab_size));
    auto run = [&](bool traced, std::vector<int32_t>* decode_topk) {
      SequenceKvCache cache(cfg, 16, KvLatentFormat::kFp8Blockwise, xf);
      ForwardTrace trace;
      ForwardOptions opt;
      if (traced) opt.trace = &trace;
      std::vector<float> logits(static_cast<size_t>(cfg.vocab_size)), all;
      // Two chunks (the second in the absorbed form), then decode steps.
      EXPECT_TRUE((*m)->Forward(prompt.data(), 50, &cache, logits.data(), opt).ok());
      EXPECT_TRUE((*m)->Forward(prompt.data() + 50, 40, &cache, logits.data(), opt).ok());
      all = logits;
      for (int step = 0; step < 5; ++step) {
        const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        EXPECT_TRUE((*m)->Forward(&next, 1, &cache, logits.data(), opt).ok());
        all.insert(all.end(), logits.begin(), logits.end());
        if (traced) decode_topk->insert(decode_topk->end(), trace.topk.begin(), trace.topk.end());
      }
      return all;
    };
    std::vector<int32_t> topk;
    const auto exact = run(true, &topk);
    EXPECT_EQ(run(false, nullptr), exact) << "index format " << static_cast<int>(xf);
    // The decode selections really chose among more keys than index_topk.
    EXPECT_GT(*std::max_element(topk.begin(), topk.end()), cfg.index_topk);
  }
}

}  // namespace
}  // namespace pdserve::model
