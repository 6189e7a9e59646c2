// bench_cluster [--model DIR] [--prompts 256,1024,2048] [--max-tokens 16] [--reps 3]
//               [--threads 2] [--modes single,colocated,pd-stream,pd-whole]
//
// Low-load latency of the serving cluster (docs/services.md, "Performance"): one request at
// a time, greedy, `max-tokens` output tokens, prompts of random token ids (the same prompts in
// every mode), after one warm-up request per mode. Modes:
//   single     the Engine in this process (no router, no HTTP): the floor;
//   colocated  pdserve-router + pdserve-colocated;
//   pd-stream  pdserve-router + pdserve-prefill + pdserve-decode, KV over UCX tcp (loopback),
//              each layer's KV written as soon as the prefill computed it;
//   pd-whole   the same with --kv-stream-layers false (all layers after the forward).
// Client-side TTFT (request sent -> first streamed text) and TPOT ((last text - first text) /
// (tokens - 1)), medians over `reps`. For the P/D modes also the prefill worker's transfer
// tail (first token sampled -> KV verified by the decode worker, its
// pdserve_worker_kv_transfer_tail_seconds histogram), i.e. what the KV transfer adds to TTFT.
// Every worker gets `threads` compute threads; the P/D workers share the machine's cores.
// Writes bench/results/cluster.{json,md}.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench/common/bench_util.h"
#include "engine/engine.h"
#include "services/common/process_util.h"
#include "services/testing/child_process.h"
#include "services/testing/http_test_client.h"

namespace {

using namespace pdserve;
using namespace std::chrono_literals;
using nlohmann::json;
using services::testing::ChildProcess;

std::vector<int64_t> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) out.push_back(std::stoll(part));
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Sum and count of a histogram in a /metrics text (-1 when absent).
std::pair<double, double> HistogramSumCount(const std::string& text, const std::string& name) {
  double sum = -1, count = -1;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto value = [&] { return std::stod(line.substr(line.rfind(' ') + 1)); };
    if (line.rfind(name + "_sum", 0) == 0) sum = value();
    if (line.rfind(name + "_count", 0) == 0) count = value();
  }
  return {sum, count};
}

struct Sample {
  double ttft = 0, tpot = 0;
  bool ok = false;
};

struct Cluster {
  std::unique_ptr<ChildProcess> router;
  std::map<std::string, std::unique_ptr<ChildProcess>> workers;
  std::map<std::string, int> metrics_ports;
  int http_port = 0;
  std::string control;
};

Result<Cluster> StartCluster(const std::string& dir, const std::string& model, int threads,
                             const std::vector<std::pair<std::string, std::vector<std::string>>>& workers) {
  const std::string bin = bench::BinDir();
  std::filesystem::create_directories(dir);
  Cluster c;
  const std::string ready = dir + "/router.ready";
  PDSERVE_ASSIGN_OR_RETURN(c.router, ChildProcess::Spawn({bin + "/pdserve-router", "--port", "0", "--control",
                                                          "tcp://127.0.0.1:*", "--ready-file", ready, "--log-level",
                                                          "warn"},
                                                         dir + "/router.log"));
  PDSERVE_ASSIGN_OR_RETURN(json r, services::testing::WaitForReadyFile(ready, c.router.get(), 120s));
  c.http_port = r["http_port"].get<int>();
  c.control = r["control_endpoint"].get<std::string>();
  for (const auto& [id, role_args] : workers) {
    const std::string wready = dir + "/" + id + ".ready";
    std::vector<std::string> argv = {bin + "/pdserve-" + role_args[0], "--router", c.control, "--worker-id", id,
                                     "--model", model, "--model-name", "pdserve", "--ready-file", wready,
                                     "--register-retry-ms", "50", "--kv-gib", "0.5", "--threads",
                                     std::to_string(threads), "--log-level", "warn"};
    argv.insert(argv.end(), role_args.begin() + 1, role_args.end());
    PDSERVE_ASSIGN_OR_RETURN(auto p, ChildProcess::Spawn(argv, dir + "/" + id + ".log",
                                                         {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo"}));
    PDSERVE_ASSIGN_OR_RETURN(json wr, services::testing::WaitForReadyFile(wready, p.get(), 120s));
    c.metrics_ports[id] = wr["metrics_port"].get<int>();
    c.workers[id] = std::move(p);
  }
  return c;
}

std::string Body(const std::vector<int32_t>& prompt, int max_tokens) {
  json b = {{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
            {"ignore_eos", true}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  return b.dump();
}

Sample Streamed(int port, const std::vector<int32_t>& prompt, int max_tokens) {
  const auto r = services::testing::HttpPostSse(port, "/v1/completions", Body(prompt, max_tokens), 600s);
  Sample s;
  double first = -1, last = -1;
  int tokens = 0;
  for (size_t i = 0; i < r.events.size(); ++i) {
    json j = json::parse(r.events[i], nullptr, false);
    if (j.is_discarded() || j.contains("error")) continue;
    if (j.contains("usage") && !j["usage"].is_null()) tokens = j["usage"]["completion_tokens"].get<int>();
    bool text = false;
    for (const auto& ch : j["choices"])
      if (ch.contains("text") && !ch["text"].get<std::string>().empty()) text = true;
    if (!text) continue;
    if (first < 0) first = r.arrival_seconds[i];
    last = r.arrival_seconds[i];
  }
  s.ok = r.status == 200 && first >= 0 && tokens == max_tokens;
  s.ttft = first;
  s.tpot = tokens > 1 ? (last - first) / (tokens - 1) : 0;
  return s;
}

Sample SingleProcess(engine::Engine* eng, const std::vector<int32_t>& prompt, int max_tokens) {
  engine::RequestOptions ro;
  ro.sampling.temperature = 0;
  ro.sampling.max_tokens = max_tokens;
  std::vector<double> at;
  const auto t0 = bench::Clock::now();
  ro.on_event = [&](const engine::TokenEvent& ev) {
    if (ev.token >= 0) at.push_back(bench::SecondsSince(t0));
  };
  Sample s;
  if (!eng->AddRequest(prompt, ro).ok()) return s;
  while (eng->Step()) {
  }
  s.ok = static_cast<int>(at.size()) == max_tokens;
  if (!at.empty()) s.ttft = at.front();
  if (at.size() > 1) s.tpot = (at.back() - at.front()) / static_cast<double>(at.size() - 1);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir = std::filesystem::exists("models") ? "models/small" : "../models/small";
  std::vector<int64_t> prompts = {256, 1024, 2048};
  int max_tokens = 16, reps = 3, threads = 2;
  std::string modes_arg = "single,colocated,pd-stream,pd-whole";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model_dir = v;
    else if (k == "--prompts") prompts = ParseList(v);
    else if (k == "--max-tokens") max_tokens = std::stoi(v);
    else if (k == "--reps") reps = std::stoi(v);
    else if (k == "--threads") threads = std::stoi(v);
    else if (k == "--modes") modes_arg = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (!std::filesystem::exists(model_dir + "/config.json")) {
    std::fprintf(stderr, "no model at %s: make one with `pdserve make-model --preset small --vocab 129280 --out %s` (the router refuses a vocabulary smaller than its tokenizer)\n",
                 model_dir.c_str(), model_dir.c_str());
    return 2;
  }
  model_dir = std::filesystem::absolute(model_dir).string();
  std::vector<std::string> modes;
  {
    std::stringstream ss(modes_arg);
    std::string m;
    while (std::getline(ss, m, ',')) modes.push_back(m);
  }
  services::BlockTerminationSignals();
  const std::string dir = services::testing::MakeTempDir("pdserve-bench-cluster");

  // The same prompts everywhere: random ids below the vocabulary, one set per length.
  auto config = json::parse(services::ReadFile(model_dir + "/config.json").value());
  const int vocab = config["vocab_size"].get<int>();
  std::mt19937 rng(11);
  std::map<int64_t, std::vector<std::vector<int32_t>>> prompt_sets;
  for (int64_t n : prompts)
    for (int r = 0; r <= reps; ++r) {  // [0] is the warm-up
      std::vector<int32_t> p(static_cast<size_t>(n));
      for (auto& t : p) t = static_cast<int32_t>(100 + rng() % static_cast<uint32_t>(vocab - 100));
      prompt_sets[n].push_back(std::move(p));
    }

  auto loadavg = [] {
    auto t = services::ReadFile("/proc/loadavg");
    return t.ok() ? std::stod(t.value()) : -1.0;
  };
  const double load_before = loadavg();
  json results = json::array();
  for (const std::string& mode : modes) {
    std::fprintf(stderr, "mode %s ...\n", mode.c_str());
    std::unique_ptr<engine::Engine> eng;
    Cluster cluster;
    std::string prefill_id;
    if (mode == "single") {
      engine::EngineOptions eo;
      eo.model_dir = model_dir;
      eo.threads = threads;
      eo.kv_cache_gib = 0.5;
      auto e = engine::Engine::Create(eo);
      if (!e.ok()) {
        std::fprintf(stderr, "%s\n", e.status().ToString().c_str());
        return 1;
      }
      eng = std::move(*e);
    } else {
      std::vector<std::pair<std::string, std::vector<std::string>>> w;
      if (mode == "colocated") {
        w = {{"c0", {"colocated"}}};
      } else if (mode == "pd-stream" || mode == "pd-whole") {
        prefill_id = "p0";
        // The decode's lease must cover the prompt's whole prefill (the stream begins with the
        // last chunk), which takes tens of seconds for long prompts of this preset here.
        w = {{"p0", {"prefill", "--kv-stream-layers", mode == "pd-stream" ? "true" : "false"}},
             {"d0", {"decode", "--kv-lease-ms", "600000", "--kv-transfer-timeout-ms", "120000"}}};
      } else {
        std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
        return 2;
      }
      auto c = StartCluster(dir + "/" + mode, model_dir, threads, w);
      if (!c.ok()) {
        std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
        return 1;
      }
      cluster = std::move(*c);
      // Until every worker registered, requests fail: retry the warm-up.
      if (!services::testing::WaitFor(
              [&] { return Streamed(cluster.http_port, prompt_sets.begin()->second[0], 2).ok; }, 60s, 200ms)) {
        std::fprintf(stderr, "the %s cluster does not serve\n", mode.c_str());
        return 1;
      }
    }
    auto run = [&](const std::vector<int32_t>& p) {
      return eng ? SingleProcess(eng.get(), p, max_tokens) : Streamed(cluster.http_port, p, max_tokens);
    };
    for (int64_t n : prompts) {
      const auto& set = prompt_sets[n];
      run(set[0]);  // warm-up at this length
      std::pair<double, double> tail0{0, 0};
      auto prefill_metrics = [&] {
        return services::testing::HttpGet(cluster.metrics_ports[prefill_id], "/metrics", 5s).body;
      };
      if (!prefill_id.empty())
        tail0 = HistogramSumCount(prefill_metrics(), "pdserve_worker_kv_transfer_tail_seconds");
      std::vector<double> ttft, tpot;
      int failed = 0;
      for (int r = 1; r <= reps; ++r) {
        const Sample s = run(set[static_cast<size_t>(r)]);
        if (!s.ok) {
          ++failed;
          continue;
        }
        ttft.push_back(s.ttft);
        tpot.push_back(s.tpot);
      }
      json row = {{"mode", mode},       {"prompt_tokens", n},           {"max_tokens", max_tokens},
                  {"reps", reps},       {"failed", failed},             {"ttft_ms", Median(ttft) * 1e3},
                  {"tpot_ms", Median(tpot) * 1e3}};
      if (!prefill_id.empty()) {
        const auto tail1 = HistogramSumCount(prefill_metrics(), "pdserve_worker_kv_transfer_tail_seconds");
        const double count = tail1.second - tail0.second;
        row["transfer_tail_ms_mean"] = count > 0 ? (tail1.first - tail0.first) / count * 1e3 : -1;
      }
      std::fprintf(stderr, "  %s\n", row.dump().c_str());
      results.push_back(row);
    }
  }

  std::ostringstream md;
  md << "# Cluster latency at low load (`small` preset, one request at a time)\n\n"
     << "Greedy, " << max_tokens << " output tokens, median of " << reps << " prompts per length after a warm-up; "
     << threads << " compute threads per worker (P/D workers share the machine); KV over UCX tcp on loopback. "
     << "Machine: " << bench::MachineName() << ", commit " << bench::GitRevision()
     << "; 1-minute load average " << load_before << " before, " << loadavg() << " after (other jobs share the cores).\n\n"
     << "| mode | prompt tokens | TTFT ms | TPOT ms | KV transfer tail ms |\n|---|---:|---:|---:|---:|\n";
  for (const json& r : results) {
    char line[256];
    std::snprintf(line, sizeof(line), "| %s | %lld | %.1f | %.2f | %s |\n", r["mode"].get<std::string>().c_str(),
                  static_cast<long long>(r["prompt_tokens"].get<int64_t>()), r["ttft_ms"].get<double>(),
                  r["tpot_ms"].get<double>(),
                  r.contains("transfer_tail_ms_mean")
                      ? std::to_string(r["transfer_tail_ms_mean"].get<double>()).substr(0, 6).c_str()
                      : "-");
    md << line;
  }
  md << "\nKV transfer tail: first token sampled on the prefill worker -> its KV verified by the decode "
        "worker (the prefill's pdserve_worker_kv_transfer_tail_seconds, mean).\n";
  json out = {{"machine", bench::MachineName()}, {"commit", bench::GitRevision()}, {"model", model_dir},
              {"threads", threads}, {"load_average_before", load_before}, {"load_average_after", loadavg()},
              {"results", results}};
  bench::WriteResults("cluster", out, md.str());
  return 0;
}
