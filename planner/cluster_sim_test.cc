// ClusterSim: one request alone against the step costs added by hand; queueing against an
// M/D/1 formula; colocated steps slowed by prompt chunks; determinism.
#include "planner/cluster_sim.h"

#include <cmath>

#include <gtest/gtest.h>

#include "model/make_model.h"

namespace pdserve::planner {
namespace {

HardwareProfile Profile() {
  return HardwareProfile::Parse(R"(
name: sim
device: {memory_gib: 80, memory_bandwidth_gbs: 1000, matmul_tflops: {bf16: 100}, attention_tflops: 10, indexer_tflops: 20}
node: {devices: 8, intra: {bandwidth_gbs: 100, latency_us: 5}, inter: {bandwidth_gbs: 10, latency_us: 20}}
kv_transfer: {bandwidth_gbs: 1, latency_us: 100}
runtime: {step_overhead_us: 100, request_overhead_ms: 2, pd_overhead_ms: 1, token_delivery_us: 50}
)", "sim").value();
}

struct Env {
  HardwareProfile hw = Profile();
  ModelShape shape = ModelShape::Create(model::PresetConfig("small", 0).value(), WeightFormat::kBf16, KvFormat::kFp8,
                                        KvFormat::kFp8).value();
  StepCostModel one{shape, hw, comm::ParallelPlan{}};

  ClusterSpec Disagg(int64_t p, int64_t d) const {
    ClusterSpec s;
    s.prefill = {p, comm::ParallelPlan{}, 0};
    s.decode = {d, comm::ParallelPlan{}, 0};
    return s;
  }
  SimResult Run(const ClusterSpec& s, const Workload& w) const {
    return SimulateCluster(s, w, &one, &one, &one, hw, shape);
  }
};

TEST(ClusterSimTest, OneRequestAloneIsTheSumOfItsSteps) {
  Env e;
  Workload w;
  w.input_len = 200;
  w.output_len = 5;
  w.num_requests = 10;
  w.rate_rps = 1e-3;  // far apart: nothing queues
  const SimResult r = e.Run(e.Disagg(1, 1), w);
  ASSERT_EQ(r.completed, 10);
  const double prefill = e.one.Prompt(200).total_s;
  const double bytes = 200.0 * static_cast<double>(e.shape.KvBytesPerToken());
  const double tail = 100e-6 + std::max(bytes / 6 / 1e9, bytes / 1e9 - prefill * 5 / 6);
  EXPECT_NEAR(r.ttft.p50, 2e-3 + 1e-3 + prefill + tail + 50e-6, 1e-9);
  // Decode steps of one row at contexts 200..203, one per output token after the first; the
  // first waits for nothing.
  double decode = 0;
  for (int64_t i = 0; i < 4; ++i) decode += e.one.Unit({StepItem{1, 200 + i, true}}, 1).total_s;
  EXPECT_NEAR(r.tpot.p50, decode / 4, 1e-9);
  EXPECT_NEAR(r.mean_decode_batch, 1.0, 1e-12);
  // Colocated: the prompt's step samples the first token; no transfer, no reservation.
  ClusterSpec c;
  c.colocated = true;
  c.colocated_pool = {1, comm::ParallelPlan{}, 0};
  const SimResult rc = e.Run(c, w);
  EXPECT_NEAR(rc.ttft.p50, 2e-3 + prefill + 50e-6, 1e-9);
}

TEST(ClusterSimTest, PrefillQueueMatchesMD1) {
  // Prompts of one chunk at utilization 0.7 on one prefill instance: mean wait of an M/D/1
  // queue rho S / (2 (1 - rho)), within the sampling noise of 4000 requests.
  Env e;
  Workload w;
  w.input_len = 128;
  w.output_len = 2;
  w.num_requests = 4000;
  w.warmup = 200;
  const double S = e.one.Prompt(128).total_s;
  w.rate_rps = 0.7 / S;
  ClusterSpec s = e.Disagg(1, 4);
  s.limits.max_step_tokens = 128;  // one prompt per step: a plain FIFO server
  const SimResult r = e.Run(s, w);
  const double rho = 0.7;
  EXPECT_NEAR(r.queue.mean, rho * S / (2 * (1 - rho)), 0.15 * rho * S / (2 * (1 - rho)));
  EXPECT_NEAR(r.throughput_rps, w.rate_rps, 0.05 * w.rate_rps);
  EXPECT_NEAR(r.prefill_busy, rho, 0.05);
}

TEST(ClusterSimTest, ColocatedDecodeSlowsDownUnderPromptChunks) {
  Env e;
  Workload w;
  w.input_len = 1024;
  w.output_len = 64;
  w.num_requests = 300;
  w.rate_rps = 0.6 / e.one.Prompt(1024).total_s;
  ClusterSpec c;
  c.colocated = true;
  c.colocated_pool = {2, comm::ParallelPlan{}, 0};
  const SimResult col = e.Run(c, w);
  const SimResult dis = e.Run(e.Disagg(1, 1), w);
  EXPECT_GT(col.tpot.p90, 1.5 * dis.tpot.p90);
  // Same seed, same answer.
  const SimResult again = e.Run(c, w);
  EXPECT_EQ(again.ttft.p50, col.ttft.p50);
  EXPECT_EQ(again.tpot.p99, col.tpot.p99);
  // The goodput counts requests within both SLOs.
  EXPECT_NEAR(dis.Goodput(1e9, 1e9), dis.throughput_rps, 1e-9);
  EXPECT_EQ(dis.Goodput(1e-9, 1e9), 0);
}

TEST(ClusterSimTest, PercentileInterpolatesLikeNumpy) {
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({5}, 0.99), 5);
  EXPECT_NEAR(Percentile({0, 10}, 0.9), 9.0, 1e-12);
  EXPECT_EQ(Percentile({}, 0.5), 0);
}

}  // namespace
}  // namespace pdserve::planner
