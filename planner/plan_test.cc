// MakePlan end to end on the `small` preset (local profile) and the official DeepSeek-V3.2-Exp
// config (spec-sheet profiles); every bad input gets a clear error, never a crash.
#include "planner/plan.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "model/make_model.h"

namespace pdserve::planner {
namespace {

const std::string kV32 = std::string(PDSERVE_PLANNER_TESTDATA) + "/deepseek-v3.2-exp";

// The `small` preset's config.json in a directory under $TMPDIR, removed when the test ends.
class SmallConfig {
 public:
  SmallConfig() {
    std::string tmpl = std::filesystem::temp_directory_path() / "pdserve-plan-test.XXXXXX";
    PDSERVE_CHECK(mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
    dir_ = tmpl;
    std::ofstream(dir_ + "/config.json") << model::PresetConfig("small", 0).value().ToJson().dump(2);
  }
  ~SmallConfig() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

PlanSpec Quick(const std::string& model) {
  PlanSpec s;
  s.model = model;
  s.workload.num_requests = 60;
  s.search = false;
  return s;
}

TEST(PlanTest, DefaultsOnTheSmallPreset) {
  SmallConfig small;
  PlanSpec s = Quick(small.dir());
  auto r = MakePlan(s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const nlohmann::json j = r->ToJson();
  EXPECT_EQ(j["hardware"]["name"], "local");
  EXPECT_EQ(j["kv_bytes_per_token"].get<double>(), 788.0 * 6);
  EXPECT_GT(j["weight_bytes_per_rank"]["prefill"].get<double>(), 0);
  EXPECT_GT(j["weight_bytes_per_rank"]["decode"].get<double>(), 0);
  EXPECT_GT(j["ttft_p50_s"].get<double>(), 0);
  EXPECT_GT(j["tpot_p50_s"].get<double>(), 0);
  EXPECT_LE(j["ttft_p50_s"].get<double>(), j["ttft_p99_s"].get<double>());
  // One prefill + one decode node of 2 devices: cp = ep = 2 and dp = ep = 2.
  EXPECT_EQ(j["pools"]["prefill"]["plan"], "cp=2,dp=1,ep=2,tp=1");
  EXPECT_EQ(j["pools"]["decode"]["plan"], "cp=1,dp=2,ep=2,tp=1");
  EXPECT_GT(j["pools"]["decode"]["max_decode_batch_per_rank"].get<int64_t>(), 0);
  const std::string md = r->ToMarkdown();
  EXPECT_NE(md.find("Predicted latency"), std::string::npos);
  EXPECT_NE(md.find("max decode batch"), std::string::npos);
}

TEST(PlanTest, SearchFindsASplitAndSweepsTheRatio) {
  SmallConfig small;
  PlanSpec s = Quick(small.dir());
  s.prefill_instances = 1;
  s.decode_instances = 1;
  s.prefill_plan_set = s.decode_plan_set = true;
  s.workload.input_len = 256;
  s.workload.output_len = 16;
  s.workload.rate_rps = 1;
  s.slo = {3.0, 0.2, 0.9};
  s.search = true;
  s.search_instances = 4;
  auto r = MakePlan(s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->sweep.size(), 3u);
  // Prompts dominate this workload: more prefill instances carry more.
  EXPECT_GT(r->sweep[2].max_goodput_rps, r->sweep[0].max_goodput_rps);
  EXPECT_TRUE(r->best_found);
  EXPECT_GT(r->max_goodput_rps, 0);
}

TEST(PlanTest, DeepSeekV32OnTheSeedsCluster) {
  // The seeds' BF16 plan: prefill on 8 A3 nodes (CP over 128 dies), decode on 4 nodes (DP 32
  // with o_proj / lm_head / embedding TP pairs, EP 64).
  PlanSpec s = Quick(kV32);
  s.hardware = "ascend-a3";
  s.weights = "bf16";
  s.prefill_plan_set = s.decode_plan_set = true;
  s.prefill_plan.cp = 128;
  s.prefill_plan.ep = 128;
  s.kv_format = "fp8";
  s.index_format = "";
  s.decode_plan.dp = 32;
  s.decode_plan.tp = 2;
  s.decode_plan.ep = 64;
  s.prefill_instances = s.decode_instances = 1;
  s.workload.input_len = 131072;
  s.workload.output_len = 64;
  s.workload.rate_rps = 0.05;
  s.workload.num_requests = 20;
  auto r = MakePlan(s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->sim.ttft.p50, 0.1);
  EXPECT_GT(r->pools[0].step.indexer_s, 0);
  EXPECT_GT(r->pools[0].step.cp_comm_s, 0);
  EXPECT_GT(r->pools[1].step.ep_comm_s, 0);
  EXPECT_GT(r->pools[1].step.tp_comm_s, 0);
  // On 4 prefill nodes BF16 weights (~55 GiB per die at EP 64) leave no room for a 128K
  // prompt's BF16 KV (86 KB per token): the planner says so.
  s.prefill_plan.cp = 64;
  s.prefill_plan.ep = 64;
  s.kv_format = "bf16";
  s.index_format = "bf16";
  auto four = MakePlan(s);
  ASSERT_FALSE(four.ok());
  EXPECT_EQ(four.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(four.status().message().find("131072-token prompt"), std::string::npos) << four.status().ToString();
  s.prefill_plan.cp = 128;
  s.prefill_plan.ep = 128;
  // The same on this 2-core machine does not fit: a clear message, not a crash.
  s.hardware = "local";
  auto local = MakePlan(s);
  ASSERT_FALSE(local.ok());
  EXPECT_EQ(local.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(local.status().message().find("GiB"), std::string::npos) << local.status().ToString();
}

TEST(PlanTest, BadInputsAreClearErrors) {
  SmallConfig small_config;
  const std::string small = small_config.dir();
  struct Case {
    std::function<void(PlanSpec*)> edit;
    StatusCode code;
    std::string text;
  };
  const std::vector<Case> cases = {
      {[](PlanSpec* s) { s->model = "/no/such/model"; }, StatusCode::kNotFound, "no model config"},
      {[](PlanSpec* s) { s->model = ""; }, StatusCode::kInvalidArgument, "missing --model"},
      {[](PlanSpec* s) { s->hardware = "tpu-v9"; }, StatusCode::kNotFound, "no hardware profile"},
      {[](PlanSpec* s) { s->kv_format = "fp4"; }, StatusCode::kInvalidArgument, "unknown KV latent format"},
      {[](PlanSpec* s) { s->weights = "w8a8"; }, StatusCode::kInvalidArgument, "int8 matmul rate"},
      {[](PlanSpec* s) { s->workload.input_len = 0; }, StatusCode::kInvalidArgument, "input length"},
      {[](PlanSpec* s) { s->workload.rate_rps = 0; }, StatusCode::kInvalidArgument, "request rate"},
      {[](PlanSpec* s) { s->workload.range_ratio = 1.5; }, StatusCode::kInvalidArgument, "range ratio"},
      {[](PlanSpec* s) { s->slo.tpot_s = -1; }, StatusCode::kInvalidArgument, "SLO"},
      {[](PlanSpec* s) { s->limits.prefill_chunk = 4096; }, StatusCode::kInvalidArgument, "prefill_chunk"},
      {[](PlanSpec* s) {
         s->prefill_plan_set = true;
         s->prefill_plan.ep = 3;
         s->prefill_plan.cp = 3;
       },
       StatusCode::kInvalidArgument, "prefill plan"},
      {[](PlanSpec* s) {
         s->prefill_plan_set = true;
         s->prefill_plan.cp = 4;
         s->prefill_nodes = 1;
       },
       StatusCode::kInvalidArgument, "whole instances"},
  };
  for (const auto& c : cases) {
    PlanSpec s = Quick(small);
    c.edit(&s);
    auto r = MakePlan(s);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    EXPECT_NE(r.status().ToString().find(c.text), std::string::npos) << r.status().ToString() << " wants " << c.text;
  }
  // W8A8 cannot shard o_proj over TP.
  PlanSpec s = Quick(kV32);
  s.hardware = "ascend-a3";
  s.weights = "w8a8";
  s.decode_plan_set = true;
  s.decode_plan.dp = 8;
  s.decode_plan.tp = 2;
  s.decode_plan.ep = 16;
  auto r = MakePlan(s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tp=1"), std::string::npos) << r.status().ToString();
}

TEST(PlanTest, SpecFile) {
  SmallConfig small;
  const std::string dir = small.dir();
  const std::string path = dir + "/spec.yaml";
  std::ofstream(path) << "model: " << dir << "\nhardware: local\nmode: colocated\n"
                      << "colocated: {instances: 2, plan: \"dp=1\"}\n"
                      << "workload: {input_len: 64, output_len: 8, rate: 2, num_requests: 50}\n"
                      << "slo: {ttft_ms: 5000, tpot_ms: 500}\nsearch: {enabled: false}\n";
  PlanSpec s;
  ASSERT_TRUE(s.MergeYamlFile(path).ok());
  EXPECT_TRUE(s.colocated);
  EXPECT_EQ(s.colocated_instances, 2);
  EXPECT_EQ(s.workload.input_len, 64);
  EXPECT_DOUBLE_EQ(s.slo.tpot_s, 0.5);
  auto r = MakePlan(s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->pools.size(), 1u);
  EXPECT_EQ(r->pools[0].role, "colocated");
  std::ofstream(path) << "model: x\nworkload: {input_length: 5}\n";
  PlanSpec bad;
  Status st = bad.MergeYamlFile(path);
  EXPECT_NE(st.message().find("workload.input_length: unknown key"), std::string::npos) << st.ToString();
  EXPECT_EQ(PlanSpec{}.MergeYamlFile(dir + "/absent.yaml").code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdserve::planner
