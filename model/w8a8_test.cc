// W8A8 in the engine: ApplyLinear's INT8 path (bitwise equal to quantize + the int64 reference
// GEMM), W8A8 checkpoints used in place from the mapping (no BF16 detour), and the accuracy of
// a converted model against the BF16 engine on the tiny presets and `small`: per-layer cos-sim
// >= 0.99, last-position logits cos-sim >= 0.99 (on `small` with the routing pinned, see
// PresetCase), top-1 agreement over 100 teacher-forced greedy steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "kernels/quantize.h"
#include "kernels/ref/gemm_int8_ref.h"
#include "model/convert.h"
#include "model/convert_accuracy.h"
#include "model/model.h"
#include "model/test_hooks.h"
#include "model/test_util.h"
#include "model/weights.h"

namespace pdserve::model {
namespace {

using testing::TempDir;

TEST(W8A8LinearTest, ApplyLinearInt8EqualsQuantizeThenReferenceGemm) {
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ThreadPool pool(2);
  for (auto [m, n_in, n_out] : {std::tuple<int64_t, int64_t, int64_t>{1, 300, 70}, {5, 128, 33}, {40, 515, 96}}) {
    std::vector<float> w(static_cast<size_t>(n_out * n_in)), x(static_cast<size_t>(m * n_in));
    for (auto& v : w) v = dist(rng) * 0.1f;
    for (auto& v : x) v = dist(rng);
    const Linear lin = QuantizeToInt8Linear(w.data(), n_out, n_in);
    ASSERT_TRUE(lin.is_int8());
    std::vector<float> y(static_cast<size_t>(m * n_out)), ref(y.size());
    ApplyLinear(lin, x.data(), m, y.data(), &pool);
    std::vector<int8_t> xq(x.size());
    std::vector<float> xs(static_cast<size_t>(m));
    kernels::QuantizeRowsInt8Ref(x.data(), m, n_in, n_in, xq.data(), n_in, xs.data());
    kernels::GemmInt8Ref(xq.data(), xs.data(), m, n_in, lin.int8, ref.data(), n_out);
    ASSERT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0) << m;
  }
}

TEST(W8A8LinearTest, GroupedCallsEqualSeparateApplyLinear) {
  // An MoE layer's gate/up calls: shared x per expert, zero-token experts, a BF16 call mixed in.
  std::mt19937 rng(6);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t D = 96, I = 40;
  auto rand_vec = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = dist(rng);
    return v;
  };
  std::vector<Linear> gate, up;
  for (int e = 0; e < 4; ++e) {
    const auto g = rand_vec(I * D), u = rand_vec(I * D);
    gate.push_back(QuantizeToInt8Linear(g.data(), I, D));
    up.push_back(QuantizeToInt8Linear(u.data(), I, D));
  }
  const auto wb = rand_vec(I * D);
  Linear bf16;
  bf16.owned_bf16.resize(wb.size());
  for (size_t i = 0; i < wb.size(); ++i) bf16.owned_bf16[i] = F32ToBf16Bits(wb[i]);
  bf16.view = {DType::kBF16, bf16.owned_bf16.data(), I, D, D};
  // 700 rows: above the size at which the activations are quantized in parallel.
  for (const auto& rows : {std::vector<int64_t>{3, 0, 20, 1}, std::vector<int64_t>{3, 0, 700, 13}}) {
    std::vector<std::vector<float>> x, y, ref;
    std::vector<LinearCall> calls;
    for (int e = 0; e < 4; ++e) x.push_back(rand_vec(std::max<int64_t>(rows[e], 1) * D));
    y.resize(9);
    ref.resize(9);
    for (int e = 0; e < 4; ++e)
      for (int which = 0; which < 2; ++which) {
        const size_t at = static_cast<size_t>(2 * e + which);
        y[at].assign(static_cast<size_t>(std::max<int64_t>(rows[e], 1) * I), -7.0f);
        calls.push_back({which == 0 ? &gate[e] : &up[e], x[e].data(), rows[e], y[at].data()});
      }
    y[8].assign(static_cast<size_t>(rows[2] * I), -7.0f);
    calls.push_back({&bf16, x[2].data(), rows[2], y[8].data()});
    ThreadPool pool(2);
    ApplyLinearGrouped(calls.data(), static_cast<int64_t>(calls.size()), &pool);
    for (size_t c = 0; c < calls.size(); ++c) {
      ref[c].assign(y[c].size(), -7.0f);
      if (calls[c].m > 0) ApplyLinear(*calls[c].w, calls[c].x, calls[c].m, ref[c].data(), &pool);
      ASSERT_EQ(std::memcmp(y[c].data(), ref[c].data(), y[c].size() * 4), 0) << "call " << c;
    }
  }
}

TEST(W8A8LoadTest, Int8WeightsAreUsedInPlaceFromTheCheckpoint) {
  TempDir d("w8_inplace");
  MakeModelOptions mo;
  mo.out_dir = d / "fp8";
  mo.dtype = "fp8";
  ASSERT_TRUE(MakeModel(mo).ok());
  ConvertOptions o;
  o.in_dir = mo.out_dir;
  o.out_dir = d / "w8";
  ASSERT_TRUE(Convert(o).ok());
  auto w = ModelWeights::Load(o.out_dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->config().weight_format, "w8a8_int8");
  for (int64_t l = 0; l < (*w)->config().num_hidden_layers; ++l) {
    const LayerWeights& L = (*w)->layer(l);
    for (const Linear* lin : {&L.q_b, &L.o, &L.idx_wq_b}) {
      EXPECT_TRUE(lin->is_int8());
      EXPECT_TRUE(lin->owned_i8.empty() && lin->owned_bf16.empty());  // a view into the mapping
    }
    EXPECT_FALSE(L.kv_b.is_int8());
    EXPECT_FALSE(L.q_a.is_int8());
    if (L.is_moe) {
      EXPECT_TRUE(L.experts[0].down.is_int8() && L.shared.gate.is_int8());
      EXPECT_FALSE(L.router.is_int8());
    } else {
      EXPECT_FALSE(L.dense.gate.is_int8());
    }
  }
}

TEST(W8A8MoeTest, GroupedExpertsEqualThePerExpertPath) {
  // The MoE forward runs all experts of a layer (routed and shared) as one pass of two grouped
  // calls (INT8 GEMMs for W8A8, BF16 output-block tasks otherwise); one Mlp per expert (the
  // previous structure) must give the same bits, for BF16 and W8A8 checkpoints: prompt rows on
  // both GEMM paths (experts with more and fewer than 8 rows), then decode steps with 1-2 rows
  // per expert.
  for (const char* preset : {"tiny", "tiny2"})
    for (bool w8 : {true, false}) {
    TempDir d(std::string("w8_grouped_") + preset);
    MakeModelOptions mo;
    mo.preset = preset;
    mo.out_dir = d / "bf16";
    ASSERT_TRUE(MakeModel(mo).ok());
    ConvertOptions o;
    o.in_dir = mo.out_dir;
    o.out_dir = d / "w8";
    ASSERT_TRUE(Convert(o).ok());
    ThreadPool pool(2);
    auto m = Model::Load(w8 ? o.out_dir : mo.out_dir, &pool);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ((*m)->weights().layer(1).experts[0].gate.is_int8(), w8);
    const int64_t V = (*m)->config().vocab_size;
    auto run = [&](bool per_expert, ForwardTrace* trace) {
      TEST_SetPerExpertMoe(per_expert);
      std::vector<int32_t> prompt;
      for (int i = 0; i < 70; ++i) prompt.push_back((i * 37 + 5) % 900);
      SequenceKvCache cache((*m)->config());
      std::vector<float> logits(static_cast<size_t>(V)), all;
      ForwardOptions fo;
      fo.trace = trace;
      EXPECT_TRUE((*m)->Forward(prompt.data(), static_cast<int64_t>(prompt.size()), &cache, logits.data(), fo).ok());
      all = logits;
      for (int step = 0; step < 4; ++step) {
        const int32_t t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        EXPECT_TRUE((*m)->Forward(&t, 1, &cache, logits.data()).ok());
        all.insert(all.end(), logits.begin(), logits.end());
      }
      TEST_SetPerExpertMoe(false);
      return all;
    };
    ForwardTrace grouped_trace, per_expert_trace;
    const auto grouped = run(false, &grouped_trace);
    const auto per_expert = run(true, &per_expert_trace);
    ASSERT_EQ(grouped.size(), per_expert.size());
    EXPECT_EQ(std::memcmp(grouped.data(), per_expert.data(), grouped.size() * 4), 0) << preset << " w8 " << w8;
    ASSERT_EQ(grouped_trace.hidden.size(), per_expert_trace.hidden.size());
    EXPECT_EQ(std::memcmp(grouped_trace.hidden.data(), per_expert_trace.hidden.data(), grouped_trace.hidden.size() * 4), 0)
        << preset << " w8 " << w8;
  }
}

// A fresh tiny checkpoint written under `dir`, loaded.
Result<std::unique_ptr<Model>> LoadTinyModel(const TempDir& dir, ThreadPool* pool) {
  MakeModelOptions mo;
  mo.preset = "tiny";
  mo.out_dir = dir.path();
  PDSERVE_RETURN_IF_ERROR(MakeModel(mo));
  return Model::Load(dir.path(), pool);
}

// `prompt` through `m` from an empty cache with options `fo`: the logits; the call's status
// in *status.
std::vector<float> ForwardPrompt(const Model& m, const std::vector<int32_t>& prompt, const ForwardOptions& fo,
                                 Status* status) {
  SequenceKvCache cache(m.config());
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  *status = m.Forward(prompt.data(), static_cast<int64_t>(prompt.size()), &cache, logits.data(), fo);
  return logits;
}

TEST(ForcedExpertsTest, OwnChoicesReproduceTheRunAndOthersChangeIt) {
  // ForwardOptions::forced_experts: feeding a model its own traced expert choices gives the same
  // bits (the weights are its own scores), other choices change the output, bad input is refused.
  TempDir d("forced_experts");
  ThreadPool pool(2);
  auto m = LoadTinyModel(d, &pool);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = (*m)->config();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back((i * 53 + 7) % 1000);
  const int64_t S = static_cast<int64_t>(prompt.size()), top_k = c.num_experts_per_tok;
  auto run = [&](const std::vector<int32_t>* forced, ForwardTrace* trace, Status* status) {
    ForwardOptions fo;
    fo.trace = trace;
    fo.forced_experts = forced;
    return ForwardPrompt(**m, prompt, fo, status);
  };
  Status st;
  ForwardTrace t0, t1;
  const auto free_logits = run(nullptr, &t0, &st);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(static_cast<int64_t>(t0.experts.size()), c.num_hidden_layers * S * top_k);
  EXPECT_EQ(t0.experts[0], -1);                           // layer 0 is dense
  EXPECT_GE(t0.experts[static_cast<size_t>(S * top_k)], 0);  // layer 1 is MoE
  const auto own = run(&t0.experts, &t1, &st);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(std::memcmp(own.data(), free_logits.data(), own.size() * 4), 0);
  EXPECT_EQ(t1.experts, t0.experts);
  std::vector<int32_t> other = t0.experts;
  for (int64_t i = S * top_k; i < static_cast<int64_t>(other.size()); ++i)
    if (other[i] >= 0) other[i] = static_cast<int32_t>((other[i] + 3) % c.n_routed_experts);
  ForwardTrace t2;
  const auto changed = run(&other, &t2, &st);
  ASSERT_TRUE(st.ok());
  EXPECT_NE(std::memcmp(changed.data(), free_logits.data(), changed.size() * 4), 0);
  EXPECT_EQ(t2.experts[static_cast<size_t>(S * top_k)], other[static_cast<size_t>(S * top_k)]);
  std::vector<int32_t> bad = t0.experts;
  bad[static_cast<size_t>(S * top_k)] = static_cast<int32_t>(c.n_routed_experts);
  run(&bad, nullptr, &st);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("forced expert id"), std::string::npos) << st.ToString();
  bad.pop_back();
  run(&bad, nullptr, &st);
  EXPECT_FALSE(st.ok());
}

TEST(ForcedLayerInputsTest, OwnTraceReproducesTheRunAndEachLayerStartsFromItsSlot) {
  // ForwardOptions::forced_layer_inputs: a model fed its own traced residual stream computes
  // the same bits; a change to slot l reaches layer l's output and later ones, not earlier ones;
  // a wrong size is refused.
  TempDir d("forced_inputs");
  ThreadPool pool(2);
  auto m = LoadTinyModel(d, &pool);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = (*m)->config();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back((i * 71 + 3) % 1000);
  const int64_t S = static_cast<int64_t>(prompt.size()), D = c.hidden_size, L = c.num_hidden_layers;
  ASSERT_GE(L, 3);
  auto run = [&](const std::vector<float>* inputs, ForwardTrace* trace, Status* status) {
    ForwardOptions fo;
    fo.trace = trace;
    fo.forced_layer_inputs = inputs;
    return ForwardPrompt(**m, prompt, fo, status);
  };
  Status st;
  ForwardTrace t0, t1, t2;
  const auto free_logits = run(nullptr, &t0, &st);
  ASSERT_TRUE(st.ok());
  const auto own = run(&t0.hidden, &t1, &st);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(std::memcmp(own.data(), free_logits.data(), own.size() * 4), 0);
  EXPECT_EQ(t1.hidden, t0.hidden);
  auto slot = [&](const ForwardTrace& t, int64_t l) {
    return std::vector<float>(t.hidden.begin() + l * S * D, t.hidden.begin() + (l + 1) * S * D);
  };
  std::vector<float> edited = t0.hidden;
  for (int64_t i = 2 * S * D; i < 3 * S * D; ++i) edited[static_cast<size_t>(i)] *= 1.5f;  // layer 2's input
  run(&edited, &t2, &st);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(slot(t2, 1), slot(t0, 1));  // layer 0's output
  EXPECT_EQ(slot(t2, 2), slot(t0, 2));  // layer 1's output: the edit replaces it only as layer 2's input
  EXPECT_NE(slot(t2, 3), slot(t0, 3));  // layer 2's output
  edited.pop_back();
  run(&edited, nullptr, &st);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("forced layer inputs"), std::string::npos) << st.ToString();
}

struct PresetCase {
  const char* preset;
  const char* dtype;  // the reference checkpoint's format
  // Free-running floors. 0.99 (the gate) where the model allows it; `small`'s random
  // router turns INT8-sized perturbations into expert flips (docs/quantization.md: Gaussian
  // noise of the same RMS does the same), so its free-running figures get regression floors
  // and the 0.99 gate applies to the pinned run, which isolates the INT8 arithmetic.
  double min_cos = 0.99;
  // Decode steps: the issue asks for the agreement to be reported; these floors (well under
  // the observed figures, docs/quantization.md) catch a broken path, not noise. Random models
  // have small top-1 margins and an indexer whose top-k flips under noise.
  double min_mean_step_cos = 0.97;
  int64_t min_top1 = 75;
};

class W8A8AccuracyTest : public ::testing::TestWithParam<PresetCase> {};

TEST_P(W8A8AccuracyTest, CloseToTheBf16Engine) {
  const PresetCase pc = GetParam();
  TempDir d(std::string("w8_acc_") + pc.preset + pc.dtype);
  MakeModelOptions mo;
  mo.preset = pc.preset;
  mo.dtype = pc.dtype;
  mo.out_dir = d / "ref";
  mo.seed = 1234;
  ASSERT_TRUE(MakeModel(mo).ok());
  ConvertOptions o;
  o.in_dir = mo.out_dir;
  o.out_dir = d / "w8";
  ASSERT_TRUE(Convert(o).ok());
  ThreadPool pool(2);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 48; ++i) prompt.push_back((i * 131 + 17) % 997);
  auto r = CompareW8A8(mo.out_dir, o.out_dir, prompt, 100, &pool);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::string layers;
  for (double c : r->layer_cos) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%.5f ", c);
    layers += buf;
  }
  std::string isolated;
  for (double c : r->isolated_layer_cos) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%.5f ", c);
    isolated += buf;
  }
  std::printf("[ W8A8 %s/%s ] per-layer cos alone (reference inputs): %s\n", pc.preset, pc.dtype, isolated.c_str());
  std::printf("[ W8A8 %s/%s ] per-layer cos: %s| logits cos %.5f | top-1 agreement %lld/%lld (teacher-forced), "
              "step logits cos min %.4f mean %.4f | free-run identical for %lld steps | prompt expert flips %lld/%lld | "
              "pinned choices: per-layer min cos %.5f, logits cos %.5f\n",
              pc.preset, pc.dtype, layers.c_str(), r->logits_cos, static_cast<long long>(r->top1_agree),
              static_cast<long long>(r->steps), r->min_step_logits_cos, r->mean_step_logits_cos,
              static_cast<long long>(r->free_run_prefix), static_cast<long long>(r->expert_flips),
              static_cast<long long>(r->expert_slots), r->pinned_min_layer_cos, r->pinned_logits_cos);
  RecordProperty("logits_cos", std::to_string(r->logits_cos));
  RecordProperty("top1_agree", std::to_string(r->top1_agree));
  EXPECT_GE(r->min_layer_cos, pc.min_cos);
  EXPECT_GE(r->logits_cos, pc.min_cos);
  EXPECT_GE(r->isolated_min_layer_cos, 0.99);
  EXPECT_GE(r->pinned_min_layer_cos, 0.99);
  EXPECT_GE(r->pinned_logits_cos, 0.99);
  EXPECT_GT(r->expert_slots, 0);
  EXPECT_GE(r->mean_step_logits_cos, pc.min_mean_step_cos);
  EXPECT_GE(r->top1_agree, pc.min_top1);
}

INSTANTIATE_TEST_SUITE_P(Presets, W8A8AccuracyTest,
                         ::testing::Values(PresetCase{"tiny", "bf16"}, PresetCase{"tiny2", "bf16"},
                                           PresetCase{"tiny", "fp8"},
                                           PresetCase{"small", "bf16", 0.98, 0.95, 50}),
                         [](const auto& info) { return std::string(info.param.preset) + "_" + info.param.dtype; });

}  // namespace
}  // namespace pdserve::model
