#include "services/launch/cluster_config.h"

#include <gtest/gtest.h>

namespace pdserve::launch {
namespace {

TEST(ClusterConfigTest, ParsesGroupsAndDefaults) {
  auto c = ClusterConfig::Parse(R"(
cluster:
  model_dir: /tmp/m
  generate_model: {enabled: false}
router:
  port: 0
  control_endpoint: tcp://127.0.0.1:7100
  model_name: x
workers:
  - role: prefill
  - name: dec
    role: decode
    count: 2
    metrics_port: 9200
    args: ["--threads", "1"]
    env: {OMP_NUM_THREADS: "1"}
  - name: e
    role: colocated
    type: custom
    binary: my-worker
  - name: abs
    role: decode
    type: custom
    binary: /opt/w/bin/worker
)");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model_dir, "/tmp/m");
  EXPECT_FALSE(c->generate_model.enabled);
  EXPECT_EQ(c->router.model_name, "x");
  ASSERT_EQ(c->workers.size(), 4u);
  EXPECT_EQ(c->workers[0].name, "prefill");
  EXPECT_EQ(ClusterConfig::BinaryName(c->workers[0]), "pdserve-prefill");
  EXPECT_EQ(c->workers[1].count, 2u);
  EXPECT_EQ(c->workers[1].metrics_port, 9200);
  EXPECT_EQ(c->workers[1].args, (std::vector<std::string>{"--threads", "1"}));
  EXPECT_EQ(c->workers[1].env.at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(c->workers[2].type, "custom");
  EXPECT_EQ(ClusterConfig::BinaryName(c->workers[2]), "my-worker");
  EXPECT_EQ(ClusterConfig::BinaryName(c->workers[3]), "/opt/w/bin/worker");
  EXPECT_EQ(c->stop_grace.count(), 10000);
}

TEST(ClusterConfigTest, Errors) {
  auto err = [](const char* yaml) { return ClusterConfig::Parse(yaml).status(); };
  EXPECT_FALSE(err("workers: []").ok());  // nothing to run
  EXPECT_NE(err("workers: [{role: router}]").message().find("workers[0].role"), std::string::npos);
  EXPECT_NE(err("workers: [{role: decode, typo: 1}]").message().find("workers[0].typo"), std::string::npos);
  EXPECT_FALSE(err("workers: [{role: decode}, {role: decode}]").ok());  // duplicate names
  EXPECT_FALSE(err("router: {control_endpoint: 'tcp://127.0.0.1:*'}\nworkers: [{role: decode}]").ok());
  EXPECT_FALSE(err("extra: 1\nworkers: [{role: decode}]").ok());
  EXPECT_FALSE(err("workers: [{role: decode, mpi_ranks: 0}]").ok());
  EXPECT_NE(err("workers: [{role: decode, plan: 'dp=two'}]").message().find("workers[0].plan"), std::string::npos);
  EXPECT_NE(err("workers: [{role: decode, plan: 'dp=2', mpi_ranks: 3}]").message().find("cp * dp * tp = 2"),
            std::string::npos);
  EXPECT_NE(err("workers: [{role: decode, type: custom, binary: w, plan: 'dp=2'}]").message().find("only engine"),
            std::string::npos);
  // A custom worker names its executable; no test worker type is built in.
  EXPECT_NE(err("workers: [{role: decode, type: custom}]").message().find("workers[0].binary is required"),
            std::string::npos);
  EXPECT_NE(err("workers: [{role: decode, type: echo}]").message().find("workers[0].type"), std::string::npos);
  // Two processes of two DP ranks need 4 metrics ports.
  EXPECT_FALSE(err("workers: [{role: decode, plan: 'dp=2', count: 2, metrics_port: 65533}]").ok());
  EXPECT_TRUE(ClusterConfig::Parse("workers: [{role: decode, plan: 'dp=2', count: 2, metrics_port: 65532}]").ok());
}

TEST(ClusterConfigTest, PlanGivesTheRanksAndTheRegistrations) {
  auto c = ClusterConfig::Parse("workers: [{role: decode, plan: 'dp=2,ep=2'}, {role: prefill, plan: 'cp=2,tp=2'}]");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->workers[0].mpi_ranks, 2u);
  EXPECT_EQ(c->workers[0].registrations(), 2u);
  EXPECT_EQ(c->workers[1].mpi_ranks, 4u);
  EXPECT_EQ(c->workers[1].registrations(), 1u);
}

TEST(ClusterConfigTest, Autoscaler) {
  const std::string base = R"(
cluster: {model_dir: /tmp/m, generate_model: {enabled: false}}
router: {port: 0, control_endpoint: "tcp://127.0.0.1:7100"}
workers:
  - {name: p, role: prefill, count: 2}
  - {name: d, role: decode}
)";
  auto c = ClusterConfig::Parse(base + R"(autoscaler:
  interval_ms: 500
  window_ms: 4000
  slo: {ttft_ms: 1500, tpot_ms: 40}
  scale_down_after: 6
  pools:
    prefill: {group: p, min: 1, max: 4}
    decode: {group: d, max: 3}
)");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const AutoscalerSettings& a = c->autoscaler;
  EXPECT_TRUE(a.enabled);
  EXPECT_EQ(a.interval.count(), 500);
  EXPECT_EQ(a.window.count(), 4000);
  EXPECT_DOUBLE_EQ(a.policy.slo_ttft_s, 1.5);
  EXPECT_DOUBLE_EQ(a.policy.slo_tpot_s, 0.04);
  EXPECT_EQ(a.policy.scale_down_after, 6);
  ASSERT_EQ(a.policy.pools.size(), 2u);
  EXPECT_EQ(a.policy.pools[0].kind, planner::PoolKind::kPrefill);
  EXPECT_EQ(a.policy.pools[0].max, 4u);
  EXPECT_EQ(a.policy.pools[1].group, "d");
  EXPECT_EQ(a.policy.pools[1].min, 1u);
  // Without the section nothing scales.
  EXPECT_FALSE(ClusterConfig::Parse(base)->autoscaler.enabled);
  // Errors name the key.
  for (const auto& [yaml, want] : std::vector<std::pair<std::string, std::string>>{
           {"autoscaler: {pools: {prefill: {group: x}}}", "no worker group 'x'"},
           {"autoscaler: {pools: {decode: {group: p}}}", "has role prefill, not decode"},
           {"autoscaler: {pools: {prefill: {group: p, max: 1}}}", "outside [min, max]"},
           {"autoscaler: {pools: {}}", "no pool to scale"},
           {"autoscaler: {window_ms: 100, pools: {prefill: {group: p, max: 2}}}", "window_ms >= interval_ms"},
           {"autoscaler: {slo: {ttft_ms: 0}, pools: {prefill: {group: p, max: 2}}}", "ttft_ms and tpot_ms must be > 0"},
           {"autoscaler: {colour: red}", "colour"},
       }) {
    auto bad = ClusterConfig::Parse(base + yaml);
    ASSERT_FALSE(bad.ok()) << yaml;
    EXPECT_NE(bad.status().ToString().find(want), std::string::npos) << bad.status().ToString() << " wants " << want;
  }
  // A scale-down drains through the router's admin API.
  std::string no_admin = base;
  no_admin.replace(no_admin.find("port: 0,"), 8, "port: 0, admin_api: false,");
  auto bad = ClusterConfig::Parse(no_admin + "autoscaler: {pools: {prefill: {group: p, max: 2}}}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("needs router.admin_api"), std::string::npos) << bad.status().ToString();
}

TEST(ClusterConfigTest, ShippedTopologiesParse) {
  for (const char* f : {"/deploy/local/cluster.yaml", "/deploy/local/echo-cluster.yaml"}) {
    auto c = ClusterConfig::LoadFile(std::string(PDSERVE_SOURCE_DIR) + f);
    ASSERT_TRUE(c.ok()) << f << ": " << c.status().ToString();
    EXPECT_EQ(c->router.port, 8000);
  }
  auto local = ClusterConfig::LoadFile(std::string(PDSERVE_SOURCE_DIR) + "/deploy/local/cluster.yaml").value();
  ASSERT_EQ(local.workers.size(), 2u);
  EXPECT_EQ(local.workers[0].role, services::WorkerRole::kPrefill);
  EXPECT_EQ(local.workers[1].role, services::WorkerRole::kDecode);
}

}  // namespace
}  // namespace pdserve::launch
