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

TEST(ClusterConfigTest, HostsPlaceTheRouterAndTheGroups) {
  auto c = ClusterConfig::Parse(R"(
cluster: {router_host: a, network: 10.9.0.0/24}
router: {host: 0.0.0.0, control_endpoint: "tcp://0.0.0.0:7100"}
hosts:
  - {name: a, address: 10.9.0.2, run: [ip, netns, exec, ns-a]}
  - {name: b, address: 10.9.0.3, network: eth1, run: local}
  - {name: c, address: 10.9.0.4, ssh_target: me@node-c}
  - {name: d, address: 10.9.0.5, run: ssh, shared_files: true}
workers:
  - {name: p, role: prefill, count: 3, hosts: [b, c]}
  - {name: d, role: decode, host: c}
  - {name: dp, role: decode, plan: 'dp=2,ep=2', hosts: [c, d]}
)");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->hosts.size(), 4u);
  EXPECT_EQ(c->hosts[0].run, HostConfig::Run::kPrefix);
  EXPECT_EQ(c->hosts[0].prefix, (std::vector<std::string>{"ip", "netns", "exec", "ns-a"}));
  EXPECT_TRUE(c->hosts[0].shared_files);
  EXPECT_EQ(c->hosts[1].run, HostConfig::Run::kLocal);
  EXPECT_EQ(c->hosts[2].run, HostConfig::Run::kSsh);  // the default
  EXPECT_FALSE(c->hosts[2].shared_files);
  EXPECT_EQ(c->hosts[2].ssh_target, "me@node-c");
  EXPECT_TRUE(c->hosts[3].shared_files);
  EXPECT_EQ(c->router_host, "a");
  // One-rank processes go round the group's hosts; an MPI instance starts from its first.
  EXPECT_EQ(c->HostOf(c->workers[0], 0)->name, "b");
  EXPECT_EQ(c->HostOf(c->workers[0], 1)->name, "c");
  EXPECT_EQ(c->HostOf(c->workers[0], 2)->name, "b");
  EXPECT_EQ(c->workers[1].hosts, std::vector<std::string>{"c"});
  EXPECT_EQ(c->HostOf(c->workers[2], 0)->name, "c");
  EXPECT_EQ(c->NetworkOf(c->hosts[1]), "eth1");
  EXPECT_EQ(c->NetworkOf(c->hosts[0]), "10.9.0.0/24");
  // Without an inventory nothing is placed.
  auto one = ClusterConfig::Parse("workers: [{role: decode}]");
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->multi_host());
  EXPECT_EQ(one->HostOf(one->workers[0], 0), nullptr);
}

TEST(ClusterConfigTest, HostErrorsSayWhatToChange) {
  const std::string hosts = R"(
hosts:
  - {name: a, address: 10.9.0.2, run: local}
  - {name: b, address: 10.9.0.3, run: [ip, netns, exec, b]}
  - {name: c, address: 10.9.0.4, run: [ip, netns, exec, c], network: eth0}
)";
  const std::string wild = "router: {host: 0.0.0.0, control_endpoint: 'tcp://0.0.0.0:7000'}\n";
  for (const auto& [yaml, want] : std::vector<std::pair<std::string, std::string>>{
           {wild + "workers: [{role: decode, host: x}]" + hosts, "workers[0].hosts: no host 'x'"},
           {wild + "cluster: {router_host: z}\nworkers: [{role: decode}]" + hosts, "cluster.router_host: no host 'z'"},
           {wild + "workers: [{role: decode, host: b, hosts: [c]}]" + hosts, "give `host` or `hosts`, not both"},
           // Loopback addresses are unreachable from the other hosts.
           {"workers: [{role: decode, host: b}]" + hosts, "router.control_endpoint tcp://127.0.0.1:7000 is a loopback"},
           {"router: {control_endpoint: 'tcp://0.0.0.0:7000'}\ncluster: {router_host: b}\nworkers: [{role: decode}]" +
                hosts,
            "router.host 127.0.0.1 is a loopback address"},
           // An MPI instance over hosts: even ranks, one network.
           {wild + "workers: [{role: decode, plan: 'dp=3', hosts: [b, c]}]" + hosts, "3 MPI ranks do not spread evenly"},
           {wild + "workers: [{role: decode, plan: 'dp=2', hosts: [b, c]}]" + hosts, "need one `network`"},
           {wild + "workers: [{role: decode}]\nhosts: [{name: a, address: 1.2.3.4}, {name: a, address: 1.2.3.5}]",
            "hosts[1].name 'a' is used twice"},
           {wild + "workers: [{role: decode}]\nhosts: [{name: a}]", "hosts[0].address must be"},
           {wild + "workers: [{role: decode}]\nhosts: [{name: a, address: x, run: telnet}]", "hosts[0].run must be ssh"},
           {wild + "workers: [{role: decode}]\nhosts: [{name: a, address: x, run: []}]", "needs at least a command"},
           {wild + "workers: [{role: decode}]\nhosts: [{name: a, address: x, colour: red}]", "hosts[0].colour"},
           // A router on a host that shares no files is found by its fixed port.
           {"router: {host: 0.0.0.0, port: 0, control_endpoint: 'tcp://0.0.0.0:7000'}\ncluster: {router_host: s}\n"
            "workers: [{role: decode}]\nhosts: [{name: s, address: 10.0.0.9}]",
            "router.port must be fixed"},
       }) {
    auto bad = ClusterConfig::Parse(yaml);
    ASSERT_FALSE(bad.ok()) << yaml;
    EXPECT_NE(bad.status().ToString().find(want), std::string::npos) << bad.status().ToString() << "\n wants " << want;
  }
  // A local host may keep loopback addresses.
  EXPECT_TRUE(ClusterConfig::Parse("cluster: {router_host: a}\nworkers: [{role: decode, host: a}]" + hosts).ok());
}

TEST(ClusterConfigTest, ShippedTopologiesParse) {
  for (const char* f : {"/deploy/local/cluster.yaml", "/deploy/local/echo-cluster.yaml"}) {
    auto c = ClusterConfig::LoadFile(std::string(PDSERVE_SOURCE_DIR) + f);
    ASSERT_TRUE(c.ok()) << f << ": " << c.status().ToString();
    EXPECT_EQ(c->router.port, 8000);
  }
  // The two-node example (docs/deploy.md "Many hosts"): the router and prefill where the launcher
  // runs, the decode worker on the other node over ssh, serving on one subnet.
  auto two = ClusterConfig::LoadFile(std::string(PDSERVE_SOURCE_DIR) + "/deploy/multihost/cluster.yaml");
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  ASSERT_EQ(two->hosts.size(), 2u);
  EXPECT_EQ(two->router_host, "node-a");
  EXPECT_EQ(two->FindHost("node-a")->run, HostConfig::Run::kLocal);
  EXPECT_EQ(two->FindHost("node-b")->run, HostConfig::Run::kSsh);
  EXPECT_EQ(two->HostOf(two->workers[1], 0)->name, "node-b");
  EXPECT_EQ(two->NetworkOf(*two->FindHost("node-b")), "10.0.0.0/24");
  EXPECT_EQ(two->router.host, "0.0.0.0");
  auto local = ClusterConfig::LoadFile(std::string(PDSERVE_SOURCE_DIR) + "/deploy/local/cluster.yaml").value();
  ASSERT_EQ(local.workers.size(), 2u);
  EXPECT_EQ(local.workers[0].role, services::WorkerRole::kPrefill);
  EXPECT_EQ(local.workers[1].role, services::WorkerRole::kDecode);
}

}  // namespace
}  // namespace pdserve::launch
