// pdserve-launch as a real process: it starts a router and echo workers (protocol test
// workers), serves, and stops every process on SIGTERM; a dying child or a missing binary stops
// everything with exit 1.
#include <signal.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/common/process_util.h"
#include "services/testing/child_process.h"
#include "services/testing/http_test_client.h"

namespace pdserve::launch {
namespace {

using namespace std::chrono_literals;
using services::testing::ChildProcess;
using services::testing::WaitFor;

std::string WriteConfig(const std::string& dir, const std::string& workers, const std::string& cluster_extra = "") {
  const int control = services::testing::FreeTcpPort();
  const std::string path = dir + "/cluster.yaml";
  std::ofstream out(path);
  out << "cluster:\n  name: test\n  bin_dir: " << PDSERVE_BIN_DIR << "\n  stop_grace_ms: 5000\n  ready_timeout_ms: 60000\n"
      << cluster_extra
      << "router:\n  port: 0\n  control_endpoint: tcp://127.0.0.1:" << control
      << "\n  model_name: pdserve\n  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 1500\n"
      << "workers:\n" << workers;
  return path;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

TEST(LaunchTest, StartsServesAndStopsEveryProcessOnSigterm) {
  const std::string dir = services::testing::MakeTempDir("pdserve-launch");
  const std::string cfg = WriteConfig(dir,
                                      "  - {name: p, role: prefill, type: echo}\n"
                                      "  - {name: d, role: decode, type: echo}\n"
                                      "  - {name: c, role: colocated, type: echo, count: 2}\n");
  const std::string ready = dir + "/launch.ready";
  auto launch = ChildProcess::Spawn({std::string(PDSERVE_BIN_DIR) + "/pdserve-launch", cfg, "--ready-file", ready},
                                    dir + "/launch.log");
  ASSERT_TRUE(launch.ok());
  auto r = services::testing::WaitForReadyFile(ready, launch->get(), 30s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const int port = (*r)["http_port"];
  // The ready file means the router is ready (a prefill and a decode worker registered); the
  // colocated pair may still be registering on a loaded machine.
  nlohmann::json health;
  EXPECT_TRUE(WaitFor([&] {
    health = nlohmann::json::parse(services::testing::HttpGet(port, "/health").body);
    return health["status"] == "ready" && health["workers"]["prefill"] == 1 && health["workers"]["decode"] == 1 &&
           health["workers"]["colocated"] == 2;
  }, 10s)) << health.dump();
  auto reply = services::testing::HttpPost(port, "/v1/completions",
                                           R"({"model":"pdserve","prompt":[1000,2000,3000],"max_tokens":4})");
  EXPECT_EQ(reply.status, 200) << reply.body;
  std::vector<pid_t> pids;
  for (const auto& [name, pid] : (*r)["pids"].items()) pids.push_back(pid.get<pid_t>());
  EXPECT_EQ(pids.size(), 5u);  // router + 4 workers
  (*launch)->Signal(SIGTERM);
  EXPECT_EQ((*launch)->WaitExit(20s), std::optional<int>(0)) << (*launch)->Log();
  for (pid_t p : pids) EXPECT_FALSE(Alive(p)) << p;
  const std::string log = (*launch)->Log();
  EXPECT_NE(log.find("[router]"), std::string::npos);  // forwarded output
  EXPECT_NE(log.find("[c-1]"), std::string::npos);
  EXPECT_NE(log.find("all processes stopped"), std::string::npos);
}

// An engine decode group with a plan: one mpirun, two DP ranks registering on their own; the
// launcher is ready only once both did, and SIGTERM stops every rank.
TEST(LaunchTest, MultiRankDecodeInstance) {
  if (!std::filesystem::exists("/sys/class/net")) GTEST_SKIP() << "no /sys/class/net: UCX tcp has no device";
  const std::string dir = services::testing::MakeTempDir("pdserve-launch-dp");
  const std::string env =
      "env: {UCX_TLS: tcp, UCX_NET_DEVICES: lo, OMPI_MCA_pml: ob1, OMPI_MCA_btl: 'self,vader,tcp', "
      "OMPI_MCA_btl_tcp_if_include: lo, OMPI_MCA_oob_tcp_if_include: lo, OMPI_MCA_mpi_yield_when_idle: '1'}";
  const std::string cfg = WriteConfig(dir,
                                      "  - {name: p, role: prefill, args: ['--threads', '1', '--kv-gib', '0.0625'], " +
                                          env + "}\n  - {name: d, role: decode, plan: 'dp=2,ep=2', args: ['--threads', "
                                          "'1', '--kv-gib', '0.0625'], " + env + "}\n",
                                      "  model_dir: " + dir + "/model\n");
  const std::string ready = dir + "/launch.ready";
  auto launch = ChildProcess::Spawn({std::string(PDSERVE_BIN_DIR) + "/pdserve-launch", cfg, "--ready-file", ready},
                                    dir + "/launch.log");
  ASSERT_TRUE(launch.ok());
  auto r = services::testing::WaitForReadyFile(ready, launch->get(), 90s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const int port = (*r)["http_port"];
  const auto health = nlohmann::json::parse(services::testing::HttpGet(port, "/health").body);
  EXPECT_EQ(health["workers"]["decode"], 2) << health.dump();
  auto reply = services::testing::HttpPost(port, "/v1/completions",
                                           R"({"model":"pdserve","prompt":[10,20,30,40],"max_tokens":4})", 60s);
  EXPECT_EQ(reply.status, 200) << reply.body << (*launch)->Log();
  (*launch)->Signal(SIGTERM);
  EXPECT_EQ((*launch)->WaitExit(30s), std::optional<int>(0)) << (*launch)->Log();
  EXPECT_TRUE(WaitFor([] { return std::system("pgrep -f '[p]dserve-decode .*--plan' > /dev/null") != 0; }, 10s))
      << "a decode rank outlived the launcher";
  // The ranks drained and exited 0, and so did mpirun (it turns a signal of its own into an
  // abort with status 1: the launcher stops an instance through its ranks).
  EXPECT_EQ((*launch)->Log().find("while stopping"), std::string::npos) << (*launch)->Log();
}

TEST(LaunchTest, ADyingWorkerStopsTheClusterLoudly) {
  const std::string dir = services::testing::MakeTempDir("pdserve-launch-fail");
  const std::string cfg = WriteConfig(dir,
                                      "  - {name: good, role: colocated, type: echo}\n"
                                      "  - {name: bad, role: colocated, type: echo, args: ['--no-such-flag']}\n");
  auto launch = ChildProcess::Spawn({std::string(PDSERVE_BIN_DIR) + "/pdserve-launch", cfg}, dir + "/launch.log");
  ASSERT_TRUE(launch.ok());
  EXPECT_EQ((*launch)->WaitExit(30s), std::optional<int>(1)) << (*launch)->Log();
  const std::string log = (*launch)->Log();
  EXPECT_NE(log.find("bad-0 (pid"), std::string::npos) << log;
  EXPECT_NE(log.find("exited with status 2"), std::string::npos) << log;
}

TEST(LaunchTest, MissingBinaryIsNamedBeforeAnythingStarts) {
  const std::string dir = services::testing::MakeTempDir("pdserve-launch-missing");
  const std::string cfg = WriteConfig(dir, "  - {name: x, role: decode, binary: pdserve-not-built, type: echo}\n");
  auto launch = ChildProcess::Spawn({std::string(PDSERVE_BIN_DIR) + "/pdserve-launch", cfg}, dir + "/launch.log");
  ASSERT_TRUE(launch.ok());
  EXPECT_EQ((*launch)->WaitExit(10s), std::optional<int>(1));
  const std::string log = (*launch)->Log();
  EXPECT_NE(log.find("pdserve-not-built"), std::string::npos) << log;
  EXPECT_EQ(log.find("[router]"), std::string::npos) << log;  // nothing was started
}

}  // namespace
}  // namespace pdserve::launch
