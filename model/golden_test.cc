// The engine against the Python reference's committed dumps (tests/golden/<name>/, made by
// tests/reference/make_golden.py from `pdserve make-model` checkpoints). For each golden:
//   * the reference's own top-k selections fed in: every layer's hidden states and the
//     last-position logits at cos-sim >= 0.999;
//   * unforced: hidden cos >= 0.999 per layer, identical top-k sets, and the 20-step greedy
//     continuation equal token for token (logits cos >= 0.999 at every step).
// To add a golden: add it to make_golden.py's preset table, regenerate, list it below.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "common/npy.h"
#include "kernels/rope.h"
#include "model/forward_variants.h"
#include "model/test_util.h"
#include "model/tools/dump_compare.h"
#include "model/tools/greedy_run.h"
#include "model/tools/make_model.h"

namespace pdserve::model {
namespace {

using testing::TempDir;

struct Golden {
  std::string dir;
  nlohmann::json index;
  std::vector<int32_t> prompt;
};

Golden LoadGolden(const std::string& name) {
  Golden g;
  g.dir = "tests/golden/" + name;
  auto text = ReadFileToString(g.dir + "/index.json");
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  g.index = nlohmann::json::parse(text.ok() ? *text : "{}");
  for (const auto& t : g.index["prompt_tokens"]) g.prompt.push_back(t.get<int32_t>());
  return g;
}

std::unique_ptr<Model> MakeAndLoad(const Golden& g, const TempDir& dir, ThreadPool* pool) {
  const auto& src = g.index["source"];
  MakeModelOptions o;
  o.preset = src["preset"];
  o.dtype = src["dtype"];
  o.seed = src["seed"];
  o.out_dir = dir / "model";
  EXPECT_TRUE(MakeModel(o).ok());
  auto m = Model::Load(o.out_dir, pool);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, ForcedSelectionsMatchEveryLayer) {
  const Golden g = LoadGolden(GetParam());
  TempDir tmp("golden_forced_" + GetParam());
  ThreadPool pool(2);
  auto model = MakeAndLoad(g, tmp, &pool);
  ASSERT_TRUE(model);
  auto topk = ReadNpy(g.dir + "/topk.npy");
  ASSERT_TRUE(topk.ok());
  std::vector<int32_t> forced(topk->i32(), topk->i32() + topk->numel());
  auto run = RunGreedy(*model, g.prompt, 1, &forced);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  auto hidden = ReadNpy(g.dir + "/hidden.npy");
  auto logits = ReadNpy(g.dir + "/step_logits.npy");
  ASSERT_TRUE(hidden.ok() && logits.ok());
  ASSERT_EQ(static_cast<int64_t>(run->prefill.hidden.size()), hidden->numel());
  const int64_t rows = hidden->shape[0], per_row = hidden->shape[1] * hidden->shape[2];
  auto cosine = [](const float* a, const float* b, int64_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
    return ab / std::sqrt(aa * bb);
  };
  for (int64_t l = 0; l < rows; ++l)
    EXPECT_GE(cosine(run->prefill.hidden.data() + l * per_row, hidden->f32() + l * per_row, per_row), 0.999)
        << "hidden row " << l;
  EXPECT_GE(cosine(run->prefill_logits.data(), logits->f32(), logits->shape[1]), 0.999);
}

TEST_P(GoldenTest, GreedyContinuationMatchesTokenForToken) {
  const Golden g = LoadGolden(GetParam());
  TempDir tmp("golden_greedy_" + GetParam());
  ThreadPool pool(2);
  auto model = MakeAndLoad(g, tmp, &pool);
  ASSERT_TRUE(model);
  const int64_t steps = static_cast<int64_t>(g.index["output_tokens"].size());
  auto run = RunGreedy(*model, g.prompt, steps);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  ASSERT_TRUE(WriteDump(tmp / "dump", model->config(), *run).ok());
  CompareThresholds th;  // defaults: hidden/logits cos >= 0.999, top-k overlap >= 0.99
  th.topk_overlap = 1.0;
  auto report = CompareDumps(tmp / "dump", g.dir, th);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->passed) << report->ToString();
  EXPECT_EQ(report->steps_compared, 20);
  EXPECT_EQ(report->decode_steps_compared, 19);  // the reference's topk_decode.npy, checked too
  EXPECT_EQ(report->first_token_mismatch, -1) << report->ToString();
  // The engine's experts.npy (the routed experts of the prompt, ascending) against the
  // reference's: the same choices on every MoE layer, none on dense ones.
  for (int64_t l = 0; l < model->config().num_hidden_layers; ++l) {
    const double overlap = report->rows[static_cast<size_t>(l + 1)].expert_overlap;
    if (model->config().IsMoeLayer(l)) EXPECT_EQ(overlap, 1.0) << "layer " << l << "\n" << report->ToString();
    else EXPECT_EQ(overlap, -1.0) << "layer " << l;
  }
}

// The accuracy tooling catches a real numerics bug: with the indexer's RoPE in MLA's
// (interleaved) layout, the comparison fails and names layer 0 as the first bad row.
TEST(GoldenFaultTest, IndexerRopeLayoutBugIsCaughtAtLayerZero) {
  const Golden g = LoadGolden("tiny");
  TempDir tmp("golden_fault");
  ThreadPool pool(2);
  auto model = MakeAndLoad(g, tmp, &pool);
  ASSERT_TRUE(model);
  SetIndexerRopeVariant(kernels::ApplyRopeInterleaved);  // the bug: MLA's layout in the indexer
  auto run = RunGreedy(*model, g.prompt, 20);
  SetIndexerRopeVariant(nullptr);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  ASSERT_TRUE(WriteDump(tmp / "dump", model->config(), *run).ok());
  auto report = CompareDumps(tmp / "dump", g.dir, CompareThresholds{});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->passed);
  EXPECT_EQ(report->first_failure.rfind("layer 0 ", 0), 0u) << report->ToString();
  // And the correct variant passes again right after.
  auto good = RunGreedy(*model, g.prompt, 20);
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(WriteDump(tmp / "good", model->config(), *good).ok());
  auto again = CompareDumps(tmp / "good", g.dir, CompareThresholds{});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->passed) << again->ToString();
}

INSTANTIATE_TEST_SUITE_P(Goldens, GoldenTest, ::testing::Values("tiny", "tiny-fp8", "tiny2"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace pdserve::model
