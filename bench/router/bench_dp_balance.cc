// bench_dp_balance: how evenly the router spreads work over the DP ranks of one decode instance
// (docs/router.md "DP ranks") under a skewed workload, per decode routing policy.
//
// A real pdserve-router, one pdserve-prefill and a decode instance `mpirun -n 2 pdserve-decode
// --plan dp=2,ep=2` (two DP ranks registering on their own) on the tiny model, KV over UCX tcp.
// The workload is skewed: `streams` closed-loop clients each send requests back to back for
// `seconds`; one request in four is long (128 output tokens), the rest short (8), with prompts
// of 16 to 200 tokens. Every 50 ms the bench reads GET /v1/workers and, over the two ranks,
// the outstanding tokens (the router's accounting: prompt + output tokens still owed);
// imbalance = max / mean over the ranks, averaged over the samples where the mean is > 0
// (1.0 = perfectly even, 2.0 = one rank holds everything). Also reported: the placements per
// rank and the completed requests.
//
// Run: cmake --build build --target bench_dp_balance && build/bin/bench_dp_balance
//      [--streams N] [--seconds S]
// Writes bench/results/dp_balance.{json,md}.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/common/bench_util.h"
#include "services/common/process_util.h"
#include "services/testing/child_process.h"
#include "services/testing/http_test_client.h"

namespace {

using namespace pdserve;
using namespace pdserve::services;
using namespace std::chrono_literals;
using nlohmann::json;
using testing::ChildProcess;

struct PolicyResult {
  std::string policy;
  double mean_imbalance = 0, p95_imbalance = 0;
  int64_t samples = 0, completed = 0, failed = 0;
  std::map<std::string, int64_t> outstanding_peak;  // per rank
  std::map<std::string, double> placements;        // per rank
};

double PlacementsOf(const std::string& metrics, const std::string& worker) {
  const std::string key = "worker=\"" + worker + "\"";
  for (size_t pos = 0; (pos = metrics.find("pdserve_router_placements_total{", pos)) != std::string::npos; ++pos) {
    const size_t end = metrics.find('\n', pos);
    const std::string line = metrics.substr(pos, end - pos);
    if (line.find(key) != std::string::npos && line.find("role=\"decode\"") != std::string::npos)
      return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return 0;
}

Result<PolicyResult> RunPolicy(const std::string& bin, const std::string& dir, const std::string& model,
                               const std::string& policy, int streams, int seconds) {
  PolicyResult out;
  out.policy = policy;
  const std::string ready = dir + "/router-" + policy + ".ready";
  PDSERVE_ASSIGN_OR_RETURN(auto router,
                           ChildProcess::Spawn({bin + "/pdserve-router", "--port", "0", "--control", "tcp://127.0.0.1:*",
                                                "--ready-file", ready, "--decode-policy", policy, "--log-level", "warn"},
                                               dir + "/router-" + policy + ".log"));
  PDSERVE_ASSIGN_OR_RETURN(json r, testing::WaitForReadyFile(ready, router.get(), 90s));
  const int port = r["http_port"].get<int>();
  const std::string control = r["control_endpoint"].get<std::string>();
  const std::vector<std::string> common = {"--router", control, "--model", model, "--model-name", "pdserve",
                                           "--register-retry-ms", "50", "--kv-gib", "0.0625", "--threads", "1",
                                           "--log-level", "warn"};
  std::vector<std::string> env = testing::LoopbackMpiEnv();
  env.insert(env.end(), {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo"});
  std::vector<std::string> prefill_argv = {bin + "/pdserve-prefill", "--worker-id", "p0", "--ready-file",
                                           dir + "/p0-" + policy + ".ready"};
  prefill_argv.insert(prefill_argv.end(), common.begin(), common.end());
  PDSERVE_ASSIGN_OR_RETURN(auto prefill, ChildProcess::Spawn(prefill_argv, dir + "/p0-" + policy + ".log", env));
  std::vector<std::string> decode_argv = {FindInPath("mpirun"), "-n", "2", bin + "/pdserve-decode", "--plan", "dp=2,ep=2",
                                          "--worker-id", "d", "--ready-file", dir + "/d-" + policy + ".ready"};
  decode_argv.insert(decode_argv.end(), common.begin(), common.end());
  PDSERVE_ASSIGN_OR_RETURN(auto decode, ChildProcess::Spawn(decode_argv, dir + "/d-" + policy + ".log", env));
  PDSERVE_RETURN_IF_ERROR(testing::WaitForReadyFile(dir + "/p0-" + policy + ".ready", prefill.get(), 90s).status());
  for (int k = 0; k < 2; ++k)
    PDSERVE_RETURN_IF_ERROR(
        testing::WaitForReadyFile(dir + "/d-" + policy + ".ready.dp" + std::to_string(k), decode.get(), 90s).status());
  auto workers = [&] {
    auto reply = testing::HttpGet(port, "/v1/workers", 2s);
    return reply.status == 200 ? json::parse(reply.body, nullptr, false) : json();
  };
  if (!testing::WaitFor([&] { json w = workers(); return w.is_object() && w["data"].size() == 3; }, 60s))
    return Status::Unavailable("the workers did not register");

  std::atomic<bool> stop{false};
  std::atomic<int64_t> completed{0}, failed{0};
  std::vector<std::thread> clients;
  for (int s = 0; s < streams; ++s)
    clients.emplace_back([&, s] {
      std::mt19937 rng(static_cast<uint32_t>(1000 + s));
      while (!stop.load()) {
        const int prompt_len = 16 + static_cast<int>(rng() % 185);
        const int max_tokens = rng() % 4 == 0 ? 128 : 8;
        json prompt = json::array();
        for (int i = 0; i < prompt_len; ++i) prompt.push_back(static_cast<int>(rng() % 1000));
        const json body = {{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", max_tokens},
                           {"temperature", 0}, {"ignore_eos", true}};
        auto reply = testing::HttpPost(port, "/v1/completions", body.dump(), 120s);
        (reply.status == 200 ? completed : failed).fetch_add(1);
      }
    });
  std::vector<double> ratios;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(seconds)) {
    std::this_thread::sleep_for(50ms);
    json w = workers();
    if (!w.is_object()) continue;
    std::vector<int64_t> loads;
    for (const auto& e : w["data"]) {
      if (e["role"] != "decode") continue;
      const int64_t v = e["load"]["outstanding_tokens"].get<int64_t>();
      loads.push_back(v);
      int64_t& peak = out.outstanding_peak[e["id"].get<std::string>()];
      peak = std::max(peak, v);
    }
    if (loads.size() != 2) continue;
    const double mean = (loads[0] + loads[1]) / 2.0;
    if (mean > 0) ratios.push_back(static_cast<double>(std::max(loads[0], loads[1])) / mean);
  }
  stop = true;
  for (auto& c : clients) c.join();
  std::sort(ratios.begin(), ratios.end());
  out.samples = static_cast<int64_t>(ratios.size());
  if (!ratios.empty()) {
    double sum = 0;
    for (double x : ratios) sum += x;
    out.mean_imbalance = sum / static_cast<double>(ratios.size());
    out.p95_imbalance = ratios[std::min(ratios.size() - 1, ratios.size() * 95 / 100)];
  }
  out.completed = completed;
  out.failed = failed;
  const std::string metrics = testing::HttpGet(port, "/metrics", 2s).body;
  for (const char* id : {"d-dp0", "d-dp1"}) out.placements[id] = PlacementsOf(metrics, id);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int streams = 16, seconds = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--streams") streams = std::atoi(argv[i + 1]);
    else if (a == "--seconds") seconds = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_dp_balance [--streams N] [--seconds S]\n");
      return 2;
    }
  }
  BlockTerminationSignals();
  const std::string bin = bench::BinDir();
  const std::string dir = testing::MakeTempDir("pdserve-dp-balance");
  const std::string model = dir + "/tiny";
  const std::string make = bin + "/pdserve make-model --preset tiny --vocab 129280 --seed 3 --out " + model + " > " + model + ".log 2>&1";
  if (std::system(make.c_str()) != 0) {
    std::fprintf(stderr, "bench_dp_balance: %s failed\n", make.c_str());
    return 1;
  }
  json results = json::array();
  std::string md = fmt::format(
      "# DP-rank balance (decode instance dp=2,ep=2; {} closed-loop streams, {} s, 1 in 4 requests long)\n\n"
      "| decode policy | imbalance max/mean (mean, p95) | peak outstanding tokens dp0 / dp1 | placements dp0 / dp1 | completed | failed |\n"
      "|---|---|---|---|---|---|\n",
      streams, seconds);
  for (const char* policy : {"round_robin", "least_outstanding_tokens", "kv_capacity_aware"}) {
    auto r = RunPolicy(bin, dir, model, policy, streams, seconds);
    if (!r.ok()) {
      std::fprintf(stderr, "bench_dp_balance: %s: %s\n", policy, r.status().ToString().c_str());
      return 1;
    }
    const PolicyResult& p = r.value();
    results.push_back({{"policy", p.policy}, {"mean_imbalance", p.mean_imbalance}, {"p95_imbalance", p.p95_imbalance},
                       {"samples", p.samples}, {"completed", p.completed}, {"failed", p.failed},
                       {"outstanding_peak", p.outstanding_peak}, {"placements", p.placements}});
    md += fmt::format("| {} | {:.2f}, {:.2f} | {} / {} | {:.0f} / {:.0f} | {} | {} |\n", p.policy, p.mean_imbalance,
                      p.p95_imbalance, p.outstanding_peak.at("d-dp0"), p.outstanding_peak.at("d-dp1"),
                      p.placements.at("d-dp0"), p.placements.at("d-dp1"), p.completed, p.failed);
  }
  bench::WriteResults("dp_balance", {{"streams", streams}, {"seconds", seconds}, {"policies", results}}, md);
  return 0;
}
