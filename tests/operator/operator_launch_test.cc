// The launcher as an operator uses it: the README's documented launch on a checkout without
// models/ (it must chat through the real tokenizer), a model that cannot chat refused at
// start-up, supervision (a killed worker restarted while its stream migrates, a drained worker
// leaving the pool, a crash loop stopped at its cap while the cluster keeps serving), and two
// workers with different weights refused as a pair.
//
// To add a case: start a cluster with StartCluster (operator_util.h) from a YAML written into a
// MakeTempDir, prove the fault fired (a pid changed, a log line, a metric), then assert the
// recovery.
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/testing/child_process.h"
#include "services/testing/http_test_client.h"
#include "tests/operator/operator_util.h"

namespace pdserve::operator_test {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using services::testing::ChildProcess;
using services::testing::HttpGet;
using services::testing::HttpPost;
using services::testing::HttpPostSse;
using services::testing::MakeTempDir;
using services::testing::WaitFor;

// The text and finish reason of an SSE completion stream; "" finish when it did not end well.
struct StreamOutcome {
  std::string text;
  std::string finish;
  int completion_tokens = -1;
  std::vector<std::string> errors;
};
StreamOutcome ReadStream(const services::testing::SseReply& r, bool chat) {
  StreamOutcome out;
  for (const std::string& e : r.events) {
    if (e == "[DONE]") continue;
    const json j = json::parse(e, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("error")) out.errors.push_back(j["error"].dump());
    if (j.contains("usage") && j["usage"].is_object()) out.completion_tokens = j["usage"]["completion_tokens"];
    if (!j.contains("choices")) continue;
    for (const json& c : j["choices"]) {
      if (chat && c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string())
        out.text += c["delta"]["content"].get<std::string>();
      if (!chat && c.contains("text")) out.text += c["text"].get<std::string>();
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) out.finish = c["finish_reason"];
    }
  }
  return out;
}

double MetricSum(int port, const std::string& name_and_labels) {
  const std::string body = HttpGet(port, "/metrics").body;
  double sum = 0;
  size_t at = 0;
  while ((at = body.find(name_and_labels, at)) != std::string::npos) {
    if (at == 0 || body[at - 1] == '\n') {
      const size_t sp = body.find(' ', at);
      sum += std::stod(body.substr(sp + 1, body.find('\n', sp) - sp - 1));
    }
    at += name_and_labels.size();
  }
  return sum;
}

// A launcher topology of echo (protocol test) workers on ephemeral ports.
std::string EchoClusterYaml(const std::string& workers, const std::string& cluster_extra = "") {
  const int control = services::testing::FreeTcpPort();
  return "cluster:\n  name: op\n  bin_dir: " + std::string(PDSERVE_BIN_DIR) +
         "\n  stop_grace_ms: 5000\n  ready_timeout_ms: 60000\n" + cluster_extra +
         "router:\n  port: 0\n  control_endpoint: tcp://127.0.0.1:" + std::to_string(control) +
         "\n  model_name: pdserve\n  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 1000\n"
         "workers:\n" + workers;
}

// The README: `pdserve-launch deploy/local/cluster.yaml` on a checkout without models/, then a
// chat request. The launcher must make a model whose vocabulary covers the tokenizer.
TEST(OperatorLaunchTest, DocumentedLaunchFromEmptyModelsChatsThroughTheRealTokenizer) {
  if (!std::filesystem::exists("/sys/class/net"))
    GTEST_SKIP() << "SKIPPED LOUDLY: no /sys/class/net here, so UCX tcp has no device for the prefill/decode KV "
                    "transfer of the documented topology";
  const std::string dir = MakeTempDir("pdserve-op-readme");
  std::filesystem::create_directories(dir + "/deploy/local");
  std::filesystem::copy_file(std::string(PDSERVE_SOURCE_DIR) + "/deploy/local/cluster.yaml",
                             dir + "/deploy/local/cluster.yaml");
  ASSERT_FALSE(std::filesystem::exists(dir + "/models"));
  const std::string ready = dir + "/launch.ready";
  // As documented: run from the checkout's root (here: a copy of its deploy/ without models/).
  auto launch = ChildProcess::Spawn({"/bin/sh", "-c",
                                     "cd '" + dir + "' && exec '" + Bin("pdserve-launch") +
                                         "' deploy/local/cluster.yaml --ready-file '" + ready + "'"},
                                    dir + "/launch.log");
  ASSERT_TRUE(launch.ok());
  auto r = services::testing::WaitForReadyFile(ready, launch->get(), 180s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const int port = (*r)["http_port"];
  EXPECT_EQ(port, 8000);  // the documented port
  std::ifstream cfg(dir + "/models/demo-tiny-v128k/config.json");
  const json model = json::parse(cfg, nullptr, false);
  ASSERT_FALSE(model.is_discarded()) << "the launcher made no model in models/demo-tiny-v128k";
  EXPECT_GE(model["vocab_size"].get<int>(), 128815) << "the generated model cannot hold the tokenizer's ids";

  const std::string body =
      R"({"model":"pdserve-demo-tiny","messages":[{"role":"user","content":"Tell me about disaggregated serving."}],)"
      R"("max_tokens":12,"temperature":0,"stream":true,"stream_options":{"include_usage":true}})";
  const auto sse = HttpPostSse(port, "/v1/chat/completions", body, 120s);
  EXPECT_EQ(sse.status, 200) << sse.raw;
  const StreamOutcome chat = ReadStream(sse, /*chat=*/true);
  EXPECT_TRUE(chat.errors.empty()) << chat.errors.front();
  EXPECT_EQ(chat.finish, "length") << sse.raw << (*launch)->Log();
  EXPECT_EQ(chat.completion_tokens, 12);
  EXPECT_FALSE(chat.text.empty());
  // The ZeroMQ request API of the same topology, through `pdserve client` as documented.
  const CommandResult client = RunCommand(Bin("pdserve") + " client --endpoint tcp://127.0.0.1:8001 --chat 'Hi there' "
                                          "--max-tokens 4 --temperature 0");
  EXPECT_EQ(client.status, 0) << client.output;
  EXPECT_NE(client.output.find("finish length"), std::string::npos) << client.output;

  (*launch)->Signal(SIGINT);
  EXPECT_EQ((*launch)->WaitExit(60s), std::optional<int>(0)) << (*launch)->Log();
}

// A cluster whose model cannot hold the tokenizer's ids must not come up and then fail every
// chat request: the router refuses the workers, the launcher stops with the reason.
TEST(OperatorLaunchTest, ModelSmallerThanTheTokenizerIsRefusedAtStartUp) {
  const std::string dir = MakeTempDir("pdserve-op-vocab");
  const std::string cfg = dir + "/cluster.yaml";
  WriteFile(cfg, EchoClusterYaml("  - {name: c, role: colocated, args: ['--threads', '1', '--kv-gib', '0.0625']}\n",
                                 "  model_dir: " + dir + "/model\n  generate_model: {preset: tiny, seed: 1, vocab: 0}\n"));
  auto launch = ChildProcess::Spawn({Bin("pdserve-launch"), cfg}, dir + "/launch.log");
  ASSERT_TRUE(launch.ok());
  EXPECT_EQ((*launch)->WaitExit(120s), std::optional<int>(1)) << (*launch)->Log();
  const std::string log = (*launch)->Log();
  EXPECT_NE(log.find("the model's vocabulary (1024 tokens) is smaller than the router's tokenizer"), std::string::npos)
      << log;
  EXPECT_NE(log.find("c-0 (pid"), std::string::npos) << log;  // the refused worker's exit is the reason
}

// restart: on-failure. A worker killed mid-stream: the stream migrates and completes exactly,
// the launcher restarts the worker, and the pool is whole again.
TEST(OperatorLaunchTest, KilledWorkerIsRestartedWhileItsStreamMigrates) {
  const std::string dir = MakeTempDir("pdserve-op-restart");
  const std::string cfg = dir + "/cluster.yaml";
  WriteFile(cfg, EchoClusterYaml("  - {name: c, role: colocated, type: echo, count: 2, restart: on-failure, "
                                 "restart_backoff_ms: 200, args: ['--token-delay-us', '30000']}\n"));
  LaunchedCluster c = StartCluster(dir, cfg);
  ASSERT_TRUE(c.launcher);
  ASSERT_TRUE(WaitFor([&] { return HealthyWorkers(c.http_port, "colocated") == 2; }, 30s));
  const double migrated_before = MetricSum(c.http_port, "pdserve_router_migrations_total{outcome=\"migrated\"");

  services::testing::SseReply sse;
  std::thread client([&] {
    sse = HttpPostSse(c.http_port, "/v1/completions",
                      R"({"model":"pdserve","prompt":[1000,2000,3000],"max_tokens":60,"stream":true,)"
                      R"("stream_options":{"include_usage":true}})",
                      60s);
  });
  // The worker holding the stream, once it has streamed a few tokens.
  std::string victim;
  ASSERT_TRUE(WaitFor([&] {
    const json w = json::parse(HttpGet(c.http_port, "/v1/workers").body, nullptr, false);
    if (w.is_discarded()) return false;
    for (const json& e : w["data"])
      if (e["load"]["outstanding_requests"].get<int>() > 0) victim = e["id"];
    return !victim.empty();
  }, 10s));
  std::this_thread::sleep_for(300ms);  // let it stream some tokens first (the token delay is 30 ms)
  const pid_t old_pid = c.ReadyNow()["pids"][victim].get<pid_t>();
  ASSERT_EQ(kill(old_pid, SIGKILL), 0);
  client.join();

  // The fault fired: the router migrated the stream...
  EXPECT_GT(MetricSum(c.http_port, "pdserve_router_migrations_total{outcome=\"migrated\""), migrated_before);
  const StreamOutcome out = ReadStream(sse, /*chat=*/false);
  EXPECT_TRUE(out.errors.empty()) << sse.raw;
  EXPECT_EQ(out.finish, "length") << sse.raw;
  EXPECT_EQ(out.completion_tokens, 60) << sse.raw;
  // ...and the launcher restarted the victim under the same name, with a new pid.
  ASSERT_TRUE(WaitFor([&] {
    const json now = c.ReadyNow();
    return now.contains("pids") && now["pids"].contains(victim) && now["pids"][victim].get<pid_t>() != old_pid;
  }, 20s)) << c.launcher->Log();
  EXPECT_TRUE(WaitFor([&] { return HealthyWorkers(c.http_port, "colocated") == 2; }, 20s));
  EXPECT_EQ(c.ReadyNow()["instances"][victim]["restarts"], 1);
  EXPECT_NE(c.launcher->Log().find(victim + " (pid " + std::to_string(old_pid) + ") was killed by signal 9"),
            std::string::npos)
      << c.launcher->Log();
  EXPECT_TRUE(c.launcher->Running());
  c.launcher->Signal(SIGTERM);
  EXPECT_EQ(c.launcher->WaitExit(30s), std::optional<int>(0)) << c.launcher->Log();
}

// A worker drained through the router's admin API exits 0 and leaves the pool: the launcher
// neither restarts it (on-failure) nor stops the cluster.
TEST(OperatorLaunchTest, DrainedWorkerLeavesThePoolAndTheClusterStaysUp) {
  const std::string dir = MakeTempDir("pdserve-op-drain");
  const std::string cfg = dir + "/cluster.yaml";
  WriteFile(cfg, EchoClusterYaml("  - {name: c, role: colocated, type: echo, count: 2}\n"));
  LaunchedCluster c = StartCluster(dir, cfg);
  ASSERT_TRUE(c.launcher);
  ASSERT_TRUE(WaitFor([&] { return HealthyWorkers(c.http_port, "colocated") == 2; }, 30s));
  const pid_t drained = c.ready["pids"]["c-1"].get<pid_t>();
  ASSERT_EQ(HttpPost(c.http_port, "/admin/drain", R"({"worker_id":"c-1","timeout_ms":10000})").status, 200);
  ASSERT_TRUE(WaitFor([&] { return kill(drained, 0) != 0; }, 20s)) << "the drained worker did not exit";
  ASSERT_TRUE(WaitFor([&] { return c.launcher->Log().find("c-1 (pid") != std::string::npos; }, 10s));
  std::this_thread::sleep_for(1500ms);  // longer than the restart backoff: nothing may come back
  EXPECT_NE(c.launcher->Log().find("it stays down (drained: it left the pool)"), std::string::npos) << c.launcher->Log();
  EXPECT_EQ(c.ReadyNow()["instances"]["c-1"]["state"], "left");
  EXPECT_FALSE(c.ReadyNow()["pids"].contains("c-1"));
  EXPECT_EQ(HealthyWorkers(c.http_port, "colocated"), 1);
  EXPECT_TRUE(c.launcher->Running());
  auto reply = HttpPost(c.http_port, "/v1/completions", R"({"model":"pdserve","prompt":[1,2,3],"max_tokens":4})");
  EXPECT_EQ(reply.status, 200) << reply.body;
  c.launcher->Signal(SIGINT);
  EXPECT_EQ(c.launcher->WaitExit(30s), std::optional<int>(0)) << c.launcher->Log();
}

// A worker that crashes at every restart is given up after max_restarts failures in a row; the
// rest of the cluster keeps serving and the launcher keeps running.
TEST(OperatorLaunchTest, CrashLoopStopsAtTheCapAndTheClusterKeepsServing) {
  const std::string dir = MakeTempDir("pdserve-op-crashloop");
  // A bin dir whose flaky worker serves once, then crashes at every later start.
  const std::string bin = dir + "/bin";
  std::filesystem::create_directories(bin);
  for (const char* b : {"pdserve-router", "pdserve-echo-worker"})
    std::filesystem::create_symlink(Bin(b), bin + "/" + b);
  WriteFile(bin + "/flaky-worker",
            "#!/bin/sh\nif [ -e \"$FLAKY_MARKER\" ]; then echo 'flaky-worker: crashing on purpose' >&2; exit 7; fi\n"
            "touch \"$FLAKY_MARKER\"\nexec '" + Bin("pdserve-echo-worker") + "' \"$@\"\n");
  chmod((bin + "/flaky-worker").c_str(), 0755);
  const int control = services::testing::FreeTcpPort();
  const std::string cfg = dir + "/cluster.yaml";
  WriteFile(cfg, "cluster:\n  bin_dir: " + bin + "\n  stop_grace_ms: 5000\n  ready_timeout_ms: 60000\n"
                 "router:\n  port: 0\n  control_endpoint: tcp://127.0.0.1:" + std::to_string(control) +
                 "\n  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 1000\n"
                 "workers:\n"
                 "  - {name: steady, role: colocated, type: echo}\n"
                 "  - {name: flaky, role: colocated, type: echo, binary: flaky-worker, restart: always, "
                 "restart_backoff_ms: 100, restart_max_backoff_ms: 400, max_restarts: 3, "
                 "env: {FLAKY_MARKER: '" + dir + "/served-once'}}\n");
  LaunchedCluster c = StartCluster(dir, cfg);
  ASSERT_TRUE(c.launcher);
  ASSERT_TRUE(WaitFor([&] { return HealthyWorkers(c.http_port, "colocated") == 2; }, 30s));
  ASSERT_EQ(kill(c.ready["pids"]["flaky-0"].get<pid_t>(), SIGKILL), 0);
  ASSERT_TRUE(WaitFor([&] { return c.launcher->Log().find("giving up on it") != std::string::npos; }, 30s))
      << c.launcher->Log();
  const std::string log = c.launcher->Log();
  EXPECT_NE(log.find("flaky-worker: crashing on purpose"), std::string::npos) << log;  // the restarts really failed
  EXPECT_NE(log.find("4 failed runs in a row, the cap (max_restarts 3)"), std::string::npos) << log;
  const json now = c.ReadyNow();
  EXPECT_EQ(now["instances"]["flaky-0"]["state"], "gave_up");
  EXPECT_EQ(now["instances"]["flaky-0"]["restarts"], 3);
  EXPECT_TRUE(c.launcher->Running());
  EXPECT_TRUE(WaitFor([&] { return HealthyWorkers(c.http_port, "colocated") == 1; }, 10s));
  auto reply = HttpPost(c.http_port, "/v1/completions", R"({"model":"pdserve","prompt":[1,2,3],"max_tokens":4})");
  EXPECT_EQ(reply.status, 200) << reply.body;
  c.launcher->Signal(SIGTERM);
  EXPECT_EQ(c.launcher->WaitExit(30s), std::optional<int>(0)) << c.launcher->Log();
}

// Prefill and decode workers with the same config.json but other weights must not pair: the
// second to register is refused, naming the compatibility hash.
TEST(OperatorLaunchTest, WorkersWithOtherWeightsButTheSameConfigDoNotPair) {
  if (!std::filesystem::exists("/sys/class/net"))
    GTEST_SKIP() << "SKIPPED LOUDLY: no /sys/class/net here, so UCX tcp has no device for prefill/decode workers";
  const std::string model_a = services::testing::CachedTestModel(PDSERVE_BIN_DIR, "tiny", 128815, 3);
  const std::string model_b = services::testing::CachedTestModel(PDSERVE_BIN_DIR, "tiny", 128815, 4);
  ASSERT_FALSE(model_a.empty() || model_b.empty());
  std::ifstream ca(model_a + "/config.json"), cb(model_b + "/config.json");
  ASSERT_EQ(std::string(std::istreambuf_iterator<char>(ca), {}), std::string(std::istreambuf_iterator<char>(cb), {}))
      << "the two models must differ only in their weights";
  const std::string dir = MakeTempDir("pdserve-op-identity");
  const int control = services::testing::FreeTcpPort();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(control);
  auto router = ChildProcess::Spawn({Bin("pdserve-router"), "--port", "0", "--control", endpoint, "--ready-file",
                                     dir + "/router.ready"},
                                    dir + "/router.log");
  ASSERT_TRUE(router.ok());
  auto router_ready = services::testing::WaitForReadyFile(dir + "/router.ready", router->get(), 30s);
  ASSERT_TRUE(router_ready.ok());
  const int router_port = (*router_ready)["http_port"];
  const std::vector<std::string> ucx = {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo"};
  auto worker = [&](const std::string& binary, const std::string& id, const std::string& model) {
    return ChildProcess::Spawn({Bin(binary), "--router", endpoint, "--worker-id", id, "--model", model, "--threads", "1",
                                "--kv-gib", "0.0625", "--ready-file", dir + "/" + id + ".ready"},
                               dir + "/" + id + ".log", ucx);
  };
  auto prefill = worker("pdserve-prefill", "p0", model_a);
  ASSERT_TRUE(prefill.ok());
  ASSERT_TRUE(services::testing::WaitForReadyFile(dir + "/p0.ready", prefill->get(), 60s).ok());
  ASSERT_TRUE(WaitFor([&] { return (*router)->Log().find("p0") != std::string::npos; }, 20s));
  auto other = worker("pdserve-decode", "d-other", model_b);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->WaitExit(60s), std::optional<int>(3)) << (*other)->Log();
  EXPECT_NE((*other)->Log().find("compatibility hash"), std::string::npos) << (*other)->Log();
  // The same weights pair: that decode worker registers and stays.
  auto same = worker("pdserve-decode", "d-same", model_a);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(WaitFor([&] { return HealthyWorkers(router_port, "decode") == 1; }, 60s)) << (*same)->Log();
  (*same)->Signal(SIGTERM);
  (*prefill)->Signal(SIGTERM);
  EXPECT_EQ((*same)->WaitExit(30s), std::optional<int>(0));
  EXPECT_EQ((*prefill)->WaitExit(30s), std::optional<int>(0));
}

}  // namespace
}  // namespace pdserve::operator_test
