// CompareDumps on synthetic dumps: the decode-step selections (topk_decode.npy) and the
// min_agreeing_steps tolerance (the golden tests and model_dump_plans_cli cover real dumps).
#include "model/tools/dump_compare.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "model/tools/greedy_run.h"
#include "model/tools/make_model.h"
#include "model/test_util.h"

namespace pdserve::model {
namespace {

using testing::TempDir;

constexpr int64_t kS = 4, kSteps = 3;

GreedyRun MakeRun(const ModelConfig& c) {
  const int64_t L = c.num_hidden_layers, D = c.hidden_size, K = c.index_topk, V = c.vocab_size;
  GreedyRun r;
  r.prompt = {1, 2, 3, 4};
  r.output = {5, 6, 7};
  r.prefill.hidden.resize(static_cast<size_t>((L + 1) * kS * D));
  for (size_t i = 0; i < r.prefill.hidden.size(); ++i) r.prefill.hidden[i] = static_cast<float>((i * 37) % 101) - 50.0f;
  r.prefill.index_scores.assign(static_cast<size_t>(L * kS * kS), 0.0f);
  for (size_t i = 0; i < r.prefill.index_scores.size(); ++i) r.prefill.index_scores[i] = static_cast<float>(i % 7) + 1.0f;
  r.prefill.topk.assign(static_cast<size_t>(L * kS * K), -1);
  for (int64_t row = 0; row < L * kS; ++row) r.prefill.topk[static_cast<size_t>(row * K)] = 0;
  r.step_logits.resize(static_cast<size_t>(kSteps * V));
  for (size_t i = 0; i < r.step_logits.size(); ++i) r.step_logits[i] = static_cast<float>((i * 13) % 29);
  r.topk_decode.resize(static_cast<size_t>((kSteps - 1) * L * K));
  for (size_t i = 0; i < r.topk_decode.size(); ++i) r.topk_decode[i] = static_cast<int32_t>(i % static_cast<size_t>(K));
  return r;
}

class DumpCompareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = PresetConfig("tiny", 0);
    ASSERT_TRUE(c.ok());
    config_ = *c;
    base_ = MakeRun(config_);
    ASSERT_TRUE(WriteDump(tmp_ / "a", config_, base_).ok());
  }
  Result<CompareReport> CompareWith(const GreedyRun& b, const CompareThresholds& th = {}) {
    EXPECT_TRUE(WriteDump(tmp_ / "b", config_, b).ok());
    return CompareDumps(tmp_ / "a", tmp_ / "b", th);
  }

  TempDir tmp_{"dump_compare"};
  ModelConfig config_;
  GreedyRun base_;
};

TEST_F(DumpCompareTest, IdenticalDumpsCompareEveryDecodeStep) {
  auto r = CompareWith(base_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->passed) << r->ToString();
  EXPECT_EQ(r->decode_steps_compared, kSteps - 1);
  EXPECT_EQ(r->decode_topk_overlap, 1.0);
}

TEST_F(DumpCompareTest, DifferentDecodeSelectionsFail) {
  GreedyRun b = base_;
  const int64_t K = config_.index_topk;
  for (int64_t k = 0; k < K; ++k) b.topk_decode[static_cast<size_t>(K + k)] = static_cast<int32_t>(100 + k);  // step 0, layer 1
  auto r = CompareWith(b);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->passed);
  const double total = static_cast<double>(base_.topk_decode.size());
  EXPECT_DOUBLE_EQ(r->decode_topk_overlap, (total - static_cast<double>(K)) / total);
  EXPECT_NE(r->first_failure.find("decode top-k overlap"), std::string::npos) << r->first_failure;
}

TEST_F(DumpCompareTest, TokenDivergenceFailsUnlessAllowedAfterMinAgreeingSteps) {
  GreedyRun b = base_;
  b.output[1] = 9;
  // After the divergence the dumps decode different sequences: their later rows differ freely.
  for (size_t i = static_cast<size_t>(2 * config_.vocab_size); i < b.step_logits.size(); ++i) b.step_logits[i] = -b.step_logits[i];
  auto strict = CompareWith(b);
  ASSERT_TRUE(strict.ok());
  EXPECT_FALSE(strict->passed);
  EXPECT_EQ(strict->first_token_mismatch, 1);
  EXPECT_EQ(strict->first_failure, "greedy token differs at step 1");
  CompareThresholds th;
  th.min_agreeing_steps = 1;
  auto loose = CompareWith(b, th);
  ASSERT_TRUE(loose.ok());
  EXPECT_TRUE(loose->passed) << loose->ToString();
  EXPECT_EQ(loose->decode_steps_compared, 1);  // only the step that consumed the agreeing token 0
  th.min_agreeing_steps = 2;
  auto two = CompareWith(b, th);
  ASSERT_TRUE(two.ok());
  EXPECT_FALSE(two->passed);
}

TEST_F(DumpCompareTest, DumpWithoutDecodeSelectionsSkipsThem) {
  ASSERT_TRUE(WriteDump(tmp_ / "b", config_, base_).ok());
  std::filesystem::remove(tmp_ / "b/topk_decode.npy");
  auto r = CompareDumps(tmp_ / "a", tmp_ / "b", CompareThresholds{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->passed);
  EXPECT_EQ(r->decode_steps_compared, 0);
}

}  // namespace
}  // namespace pdserve::model
