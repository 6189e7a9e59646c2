// The SLO autoscaler in pdserve-launch against a real cluster (router + engine prefill / decode
// workers of the tiny model, KV over UCX tcp) and a load step. Both pools start at 1 (bounds
// [1, 2]); four trickle streams run the whole time:
//
//   1. the load step: clients sending 1500-token prompts push TTFT over its SLO, and two dozen
//      concurrent streams push the decode batch, hence TPOT (the tiny model's step is its
//      128815-row LM head, linear in the batch), over its SLO: both pools grow 1 -> 2;
//   2. the step ends, the trickle alone is far under both SLOs: both pools shrink 2 -> 1, each
//      by draining its least loaded worker through the router; when the decode worker drained
//      still holds trickle streams (timing decides), it finishes them.
//
// Every request of the run must complete whole: status 200, every token, [DONE]; the router
// counts no other outcome than ok. The scale-ups and scale-downs are proved before anything is
// asserted about them: the launcher's pdserve_planner_decisions_total{pool,action} counts them,
// the router's GET /admin/workers shows the pools' sizes, the launcher's log the drained worker's
// load.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/testing/child_process.h"
#include "services/testing/http_test_client.h"

namespace pdserve::launch {
namespace {

using namespace std::chrono_literals;
using services::testing::ChildProcess;
using services::testing::WaitFor;

struct Tally {
  std::atomic<int> ok{0}, failed{0};
  std::mutex mu;
  std::string first_error;
  void Fail(const std::string& e) {
    ++failed;
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.empty()) first_error = e;
  }
};

// One streamed completion of `prompt_len` token ids and exactly `max_tokens` tokens; a stream
// that ends early, errors or misses [DONE] is a failure.
void Stream(int port, int prompt_len, int max_tokens, int seed, Tally* tally) {
  nlohmann::json prompt = nlohmann::json::array();
  for (int i = 0; i < prompt_len; ++i) prompt.push_back(100 + (seed * 131 + i * 7) % 900);
  const nlohmann::json body = {{"model", "pdserve"},   {"prompt", prompt},          {"max_tokens", max_tokens},
                               {"temperature", 0},     {"ignore_eos", true},        {"stream", true},
                               {"stream_options", {{"include_usage", true}}}};
  const auto r = services::testing::HttpPostSse(port, "/v1/completions", body.dump(), 120s);
  int completion = -1;
  const bool done = r.done;
  for (const auto& e : r.events) {
    const auto j = nlohmann::json::parse(e, nullptr, false);
    if (j.is_discarded() || j.contains("error")) return tally->Fail("error event: " + e);
    if (j.contains("usage") && j["usage"].is_object()) completion = j["usage"]["completion_tokens"].get<int>();
  }
  if (r.status != 200 || !done || completion != max_tokens)
    return tally->Fail("status " + std::to_string(r.status) + ", done " + std::to_string(done) + ", tokens " +
                       std::to_string(completion) + " of " + std::to_string(max_tokens) + " " + r.error + r.raw.substr(0, 200));
  ++tally->ok;
}

double Metric(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return -1;
}

int Workers(int port, const std::string& role) {
  const auto j = nlohmann::json::parse(services::testing::HttpGet(port, "/admin/workers").body, nullptr, false);
  if (j.is_discarded() || !j.contains("workers")) return -1;
  int n = 0;
  for (const auto& w : j["workers"])
    if (w.value("role", "") == role && w.value("state", "") == "ready") ++n;
  return n;
}

TEST(AutoscalerE2eTest, PoolsFollowALoadStepAndDrainsFinishTheirStreams) {
  if (!std::filesystem::exists("/sys/class/net")) GTEST_SKIP() << "no /sys/class/net: UCX tcp has no device";
  const std::string bin = PDSERVE_BIN_DIR;
  // The router's tokenizer has 128815 ids: a larger random vocabulary would sample ids the
  // router refuses to stream.
  const std::string model = services::testing::CachedTestModel(bin, "tiny", 128815, 3);
  ASSERT_FALSE(model.empty());
  const std::string dir = services::testing::MakeTempDir("pdserve-autoscaler");
  const std::string cfg = dir + "/cluster.yaml";
  const std::string worker =
      "type: engine, args: [--threads, '1', --kv-gib, '0.25'], "
      "env: {UCX_TLS: tcp, UCX_NET_DEVICES: lo, PDSERVE_NUM_THREADS: '1'}";
  std::ofstream(cfg) << "cluster:\n  name: autoscaler-test\n  bin_dir: " << bin << "\n  model_dir: " << model
                     << "\n  generate_model: {enabled: false}\n  stop_grace_ms: 8000\n  ready_timeout_ms: 90000\n"
                     << "router:\n  port: 0\n  control_endpoint: tcp://127.0.0.1:" << services::testing::FreeTcpPort()
                     << "\n  model_name: pdserve\n"
                     << "workers:\n"
                     << "  - {name: prefill, role: prefill, count: 1, " << worker << "}\n"
                     << "  - {name: decode, role: decode, count: 1, " << worker << "}\n"
                     << "autoscaler:\n  interval_ms: 250\n  window_ms: 2000\n  percentile: 0.9\n"
                     << "  slo: {ttft_ms: 1500, tpot_ms: 120}\n  scale_up_after: 2\n  scale_down_after: 4\n"
                     << "  low_water: 0.6\n  cooldown_ms: 3000\n  min_requests: 2\n  drain_timeout_ms: 120000\n"
                     << "  pools:\n    prefill: {group: prefill, min: 1, max: 2}\n"
                     << "    decode: {group: decode, min: 1, max: 2}\n";
  const std::string ready = dir + "/launch.ready";
  auto launch = ChildProcess::Spawn({bin + "/pdserve-launch", cfg, "--ready-file", ready}, dir + "/launch.log");
  ASSERT_TRUE(launch.ok());
  // The launcher's children run in process groups of their own: a failed assertion must stop
  // the launcher with SIGTERM (it stops them), never leave them to the SIGKILL of ~ChildProcess.
  struct StopLauncher {
    ChildProcess* p;
    ~StopLauncher() {
      if (p->WaitExit(0ms)) return;
      p->Signal(SIGTERM);
      p->WaitExit(60s);
    }
  } stop_launcher{launch->get()};
  auto r = services::testing::WaitForReadyFile(ready, launch->get(), 120s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const int port = (*r)["http_port"];
  const int planner_port = (*r)["planner_metrics_port"];
  auto decisions = [&](const std::string& pool, const std::string& action) {
    return Metric(services::testing::HttpGet(planner_port, "/metrics").body,
                  "pdserve_planner_decisions_total{action=\"" + action + "\",pool=\"" + pool + "\"}");
  };
  ASSERT_TRUE(WaitFor([&] { return Workers(port, "decode") == 1 && Workers(port, "prefill") == 1; }, 30s));
  // Every series exists from the start, at zero.
  ASSERT_EQ(decisions("prefill", "scale_up"), 0);
  ASSERT_EQ(decisions("decode", "scale_down"), 0);

  // The trickle: four streams at a time, for the whole run.
  Tally trickle, step;
  std::atomic<bool> stop_trickle{false}, stop_step{false};
  std::vector<std::jthread> trickle_threads, step_threads;
  struct StopAll {  // destroyed before the threads: a failed assertion does not hang the joins
    std::atomic<bool>* a;
    std::atomic<bool>* b;
    ~StopAll() { *a = *b = true; }
  } stop_all{&stop_trickle, &stop_step};
  for (int t = 0; t < 4; ++t)
    trickle_threads.emplace_back([&, t] {
      for (int i = 0; !stop_trickle; ++i) Stream(port, 32, 300, t * 1000 + i, &trickle);
    });

  // 1. The load step: six clients sending 1500-token prompts back to back (prefill), 24 clients
  //    holding 200-token streams (decode).
  for (int t = 0; t < 6; ++t)
    step_threads.emplace_back([&, t] {
      for (int i = 0; !stop_step; ++i) Stream(port, 1500, 4, 500 + t * 100 + i, &step);
    });
  for (int t = 0; t < 24; ++t)
    step_threads.emplace_back([&, t] {
      for (int i = 0; !stop_step; ++i) Stream(port, 32, 200, 9000 + t * 100 + i, &step);
    });
  const bool grew = WaitFor([&] {
    return decisions("prefill", "scale_up") >= 1 && decisions("decode", "scale_up") >= 1 &&
           Workers(port, "prefill") == 2 && Workers(port, "decode") == 2;
  }, 120s);
  stop_step = true;
  step_threads.clear();  // joins: each client finishes the request it is in
  ASSERT_TRUE(grew) << "the pools did not grow under the load step: prefill scale_up "
                    << decisions("prefill", "scale_up") << ", decode scale_up " << decisions("decode", "scale_up")
                    << ", ready prefill " << Workers(port, "prefill") << ", decode " << Workers(port, "decode") << "\n"
                    << (*launch)->Log();

  // 2. Back to the trickle: both pools shrink, by draining.
  const bool shrank = WaitFor([&] {
    return decisions("prefill", "scale_down") >= 1 && decisions("decode", "scale_down") >= 1 &&
           Workers(port, "prefill") == 1 && Workers(port, "decode") == 1;
  }, 120s);
  stop_trickle = true;
  trickle_threads.clear();
  ASSERT_TRUE(shrank) << "the pools did not shrink after the load step: prefill scale_down "
                      << decisions("prefill", "scale_down") << ", decode scale_down "
                      << decisions("decode", "scale_down") << "\n" << (*launch)->Log();

  // No request failed. (How many trickle requests fit in the run depends on the machine's speed;
  // that some ran beside the load step and the drains is what matters here.)
  EXPECT_EQ(trickle.failed, 0) << trickle.first_error;
  EXPECT_EQ(step.failed, 0) << step.first_error;
  EXPECT_GT(trickle.ok, 0);
  EXPECT_GT(step.ok, 24);
  const std::string router_metrics = services::testing::HttpGet(port, "/metrics").body;
  for (const char* outcome : {"client_error", "rejected", "unavailable", "timeout", "cancelled", "error"})
    EXPECT_LE(Metric(router_metrics, std::string("pdserve_router_requests_total{outcome=\"") + outcome + "\"}"), 0)
        << outcome;
  const std::string log = (*launch)->Log();
  const size_t drain = log.find("autoscaler: decode pool (group 'decode') scale_down 2 -> 1: draining decode-");
  ASSERT_NE(drain, std::string::npos) << log;
  const size_t load = log.find(" (the least loaded: ", drain);
  ASSERT_NE(load, std::string::npos);
  // Whether the decode worker still held a stream when the autoscaler drained it depends on
  // timing (the trickle's streams are short): when it did, those streams finished (no failure
  // above). That a drain never cuts a stream is proven deterministically by
  // WorkerFaultTest.ScaleUpAndDrainUnderSteadyLoadFailNothing, which drains only once the router
  // counts requests outstanding on the worker.
  if (std::stoi(log.substr(load + 20)) == 0)
    std::fprintf(stderr, "note: the drained decode worker held no stream this run: %s\n",
                 log.substr(drain, 200).c_str());
  EXPECT_NE(log.find("left the pool"), std::string::npos);
  EXPECT_NE(log.find("autoscaler: prefill pool (group 'prefill') scale_up 1 -> 2"), std::string::npos);
  EXPECT_NE(log.find("autoscaler: decode pool (group 'decode') scale_up 1 -> 2"), std::string::npos);
  EXPECT_NE(log.find("autoscaler: prefill pool (group 'prefill') scale_down 2 -> 1: draining prefill-"),
            std::string::npos);

  // The run's decisions, for the test log.
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);)
    if ((line.find("autoscaler:") != std::string::npos && line.find("hold") == std::string::npos) ||
        line.find("left the pool") != std::string::npos || line.find("scaling group") != std::string::npos)
      std::printf("%s\n", line.c_str());
  std::printf("requests: trickle %d, load step %d, none failed\n", trickle.ok.load(), step.ok.load());
  (*launch)->Signal(SIGTERM);
  EXPECT_EQ((*launch)->WaitExit(30s), std::optional<int>(0)) << (*launch)->Log();
}

}  // namespace
}  // namespace pdserve::launch
