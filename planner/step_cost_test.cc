// StepCostModel: each part against arithmetic done here by hand on a synthetic profile whose
// rates are round numbers, plus the scaling laws the model must keep (indexer quadratic in the
// prompt, sparse attention linear past top-k, communication only where the plan splits work).
#include "planner/step_cost.h"

#include <gtest/gtest.h>

#include "model/make_model.h"
#include "planner/plan.h"

namespace pdserve::planner {
namespace {

HardwareProfile Synthetic() {
  auto p = HardwareProfile::Parse(R"(
name: synthetic
device: {memory_gib: 80, memory_bandwidth_gbs: 1000, matmul_tflops: {bf16: 100, int8: 200}, gemv_tflops: {bf16: 50},
         attention_tflops: 10, indexer_tflops: 20}
node: {devices: 8, intra: {bandwidth_gbs: 100, latency_us: 5}, inter: {bandwidth_gbs: 10, latency_us: 20}}
kv_transfer: {bandwidth_gbs: 10, latency_us: 100}
runtime: {step_overhead_us: 100, row_overhead_us: 1}
)", "synthetic");
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.value();
}

struct Fixture {
  HardwareProfile hw = Synthetic();
  ModelShape shape;
  explicit Fixture(const model::ModelConfig& c, WeightFormat w = WeightFormat::kBf16)
      : shape(ModelShape::Create(c, w, KvFormat::kFp8, KvFormat::kFp8).value()) {}
};

model::ModelConfig V32() {
  return LoadModelConfig(std::string(PDSERVE_PLANNER_TESTDATA) + "/deepseek-v3.2-exp").value();
}

TEST(StepCostTest, DecodeBatchOneIsTheWeightsReadOnce) {
  Fixture f(model::PresetConfig("small", 0).value());
  StepCostModel m(f.shape, f.hw, comm::ParallelPlan{});
  const StepCost c = m.Decode(1, 100);
  // Batch 1 reads every projection once: bytes / 1000 GB/s (2 FLOPs per 2-byte weight at 50
  // TFLOP/s is far below the memory time).
  double bytes = 0;
  for (const auto& w : f.shape.attention) bytes += w.Bytes();
  bytes *= f.shape.layers();
  for (const auto& w : f.shape.dense_ffn) bytes += w.Bytes() * f.shape.n_dense_layers;
  for (const auto& w : f.shape.shared_ffn) bytes += w.Bytes() * f.shape.n_moe_layers;
  EXPECT_NEAR(c.linear_s, bytes / 1e12, 1e-9);
  // 8 of 64 experts touched per MoE layer, each read once.
  const double expert = static_cast<double>(f.shape.routed.n_out) * f.shape.routed.n_in * 2;
  EXPECT_NEAR(c.experts_s, 8 * expert / 1e12 * f.shape.n_moe_layers, 1e-9);
  EXPECT_NEAR(c.lm_head_s, f.shape.lm_head.Bytes() / 1e12, 1e-12);
  EXPECT_NEAR(c.overhead_s, 100e-6 + 1e-6, 1e-12);
  EXPECT_EQ(c.ep_comm_s + c.tp_comm_s + c.cp_comm_s + c.dp_sync_s, 0);
  EXPECT_NEAR(c.total_s, c.linear_s + c.experts_s + c.attention_s + c.indexer_s + c.lm_head_s + c.overhead_s, 1e-12);
}

TEST(StepCostTest, AttentionAndIndexerScaling) {
  Fixture f(V32());
  StepCostModel m(f.shape, f.hw, comm::ParallelPlan{});
  // Absorbed sparse attention for one decode row at context c > K: H x K x (2 (Lkv + dr) + 2 Lkv)
  // FLOPs per layer at 10 TFLOP/s (the W_uk / W_uv absorption is the kv_b GEMM, in linear_s).
  const double H = 128, K = 2048;
  const double flops = H * K * (2.0 * 576 + 2.0 * 512) * 61;
  EXPECT_NEAR(m.Decode(1, 100000).attention_s, flops / 10e12, 1e-9);
  // Past top-k the attention stops growing; the indexer grows with the context.
  EXPECT_NEAR(m.Decode(1, 50000).attention_s, m.Decode(1, 100000).attention_s, 1e-12);
  EXPECT_GT(m.Decode(1, 100000).indexer_s, 1.9 * m.Decode(1, 50000).indexer_s);
  // A prompt's indexer is quadratic: 2 IH ID n(n+1)/2 FLOPs per layer.
  const StepCost p1 = m.Prompt(32768), p2 = m.Prompt(65536);
  EXPECT_NEAR(p2.indexer_s / p1.indexer_s, 4.0, 0.01);
  EXPECT_NEAR(p1.indexer_s, 2.0 * 64 * 128 * (32768.0 * 32769 / 2) * 61 / 20e12, 1e-6);
  // Its attention is linear once rows select K keys.
  EXPECT_LT(p2.attention_s / p1.attention_s, 2.1);
}

TEST(StepCostTest, CommunicationFollowsThePlan) {
  Fixture f(V32(), WeightFormat::kW8a8);
  comm::ParallelPlan cp;
  cp.cp = 8;
  cp.ep = 8;
  StepCostModel prefill(f.shape, f.hw, cp);
  const StepCost c = prefill.Prompt(16384);
  EXPECT_GT(c.cp_comm_s, 0);
  EXPECT_GT(c.ep_comm_s, 0);
  EXPECT_EQ(c.tp_comm_s, 0);
  // The CP gather moves (cp-1)/cp of every layer's KV records to each rank.
  const double bytes = 16384.0 * 7 / 8 * 788;
  EXPECT_NEAR(c.cp_comm_s, (7 * 5e-6 + bytes / 100e9) * 61, 1e-9);
  // Compute splits over the CP ranks: 8 ranks take ~1/8 of one rank's indexer time.
  StepCostModel one(f.shape, f.hw, comm::ParallelPlan{});
  EXPECT_NEAR(one.Prompt(16384).indexer_s / c.indexer_s, 8.0, 0.01);
  // Decode with DP and a TP pair: TP reductions, EP exchange, the DP vote. A 16-rank EP group
  // spans two 8-device nodes and takes the slower link.
  comm::ParallelPlan dec;
  dec.dp = 8;
  dec.tp = 2;
  dec.ep = 16;
  Fixture g(V32());
  StepCostModel dm(g.shape, g.hw, dec);
  const StepCost s = dm.Decode(16, 4096);
  EXPECT_GT(s.tp_comm_s, 0);
  EXPECT_GT(s.ep_comm_s, 0);
  EXPECT_GT(s.dp_sync_s, 0);
  comm::ParallelPlan dec8 = dec;
  dec8.dp = 4;
  dec8.ep = 8;
  StepCostModel dm8(g.shape, g.hw, dec8);
  EXPECT_LT(dm8.Decode(16, 4096).ep_comm_s, s.ep_comm_s);  // intra-node links are faster
  // More experts per rank are touched by more routed rows.
  EXPECT_LT(dm.Decode(1, 4096).experts_s, dm.Decode(64, 4096).experts_s);
}

TEST(StepCostTest, ExpandedFirstChunk) {
  Fixture f(model::PresetConfig("small", 0).value());
  HardwareProfile expanded = f.hw;
  expanded.first_chunk_expanded = true;
  StepCostModel absorbed(f.shape, f.hw, comm::ParallelPlan{}), exp(f.shape, expanded, comm::ParallelPlan{});
  // Only a first chunk of > 1 token changes form.
  EXPECT_NE(exp.Prompt(256).attention_s, absorbed.Prompt(256).attention_s);
  EXPECT_EQ(exp.Decode(4, 300).attention_s, absorbed.Decode(4, 300).attention_s);
  EXPECT_EQ(exp.Unit({StepItem{256, 256, true}}, 256).attention_s,
            absorbed.Unit({StepItem{256, 256, true}}, 256).attention_s);
}

}  // namespace
}  // namespace pdserve::planner
