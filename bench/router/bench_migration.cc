// bench_migration: what a request migration costs the client (docs/router.md, "Migration").
//
// A real pdserve-router with real engine workers (pdserve-colocated, or pdserve-prefill +
// two pdserve-decode over UCX tcp when the machine has a network device) on the tiny model.
// One greedy stream of `before` + 64 tokens; after `before` tokens the worker producing them
// fails in one of two ways:
//   drain   POST /admin/drain with a 1 ms timeout: the worker aborts the job and deregisters,
//           so the router moves the request at once (the cost of the move itself: abort,
//           dispatch, the new prefill of prompt + delivered tokens);
//   kill    SIGKILL: the router only notices when the heartbeats stop (heartbeat interval
//           100 ms, timeout 800 ms here), then moves it.
// Reported per case: the stream's stall (the longest gap between two SSE events), the median
// gap otherwise (the inter-token latency), the extra latency (stall - median gap), and the
// end-to-end time against the same request uninterrupted. The output is checked against the
// uninterrupted run's (it must be identical). Every case starts fresh processes.
//
// Run: cmake --build build --target bench_migration && build/bin/bench_migration [--reps N]
// Writes bench/results/migration.{json,md}.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
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

// One router and its workers, started fresh.
class Cluster {
 public:
  Cluster(std::string bin, std::string dir, std::string model) : bin_(std::move(bin)), dir_(std::move(dir)), model_(std::move(model)) {}
  Status Start(bool disaggregated) {
    const std::string ready = dir_ + "/router.ready";
    std::remove(ready.c_str());
    PDSERVE_ASSIGN_OR_RETURN(router_, ChildProcess::Spawn({bin_ + "/pdserve-router", "--port", "0", "--control",
                                                           "tcp://127.0.0.1:*", "--ready-file", ready,
                                                           "--heartbeat-interval-ms", "100", "--heartbeat-timeout-ms",
                                                           "800", "--log-level", "warn"},
                                                          dir_ + "/router.log"));
    PDSERVE_ASSIGN_OR_RETURN(json r, services::testing::WaitForReadyFile(ready, router_.get(), 60s));
    port_ = r["http_port"].get<int>();
    const std::string control = r["control_endpoint"].get<std::string>();
    std::vector<std::pair<std::string, std::string>> workers;
    if (disaggregated) {
      workers = {{"p0", "prefill"}, {"d0", "decode"}, {"d1", "decode"}};
    } else {
      workers = {{"c0", "colocated"}, {"c1", "colocated"}};
    }
    for (const auto& [id, role] : workers) {
      const std::string wr = dir_ + "/" + id + ".ready";
      std::remove(wr.c_str());
      PDSERVE_ASSIGN_OR_RETURN(
          auto child, ChildProcess::Spawn({bin_ + "/pdserve-" + role, "--router", control, "--worker-id", id, "--model",
                                           model_, "--model-name", "pdserve", "--ready-file", wr, "--register-retry-ms",
                                           "50", "--kv-gib", "0.0625", "--threads", "1", "--log-level", "warn"},
                                          dir_ + "/" + id + ".log", {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo"}));
      PDSERVE_RETURN_IF_ERROR(services::testing::WaitForReadyFile(wr, child.get(), 60s).status());
      workers_[id] = std::move(child);
    }
    const size_t n = workers.size();
    if (!testing::WaitFor([&] { return Workers().size() == n; }, 30s))
      return Status::Unavailable("the workers did not register");
    return Status::Ok();
  }
  json Workers() {
    auto r = testing::HttpGet(port_, "/admin/workers", 2s);
    if (r.status != 200) return json::array();
    return json::parse(r.body, nullptr, false).value("workers", json::array());
  }
  // The decode / colocated worker that holds the one running request.
  std::string Holder() {
    for (const auto& w : Workers())
      if (w["role"] != "prefill" && w["outstanding_requests"].get<int64_t>() > 0) return w["id"].get<std::string>();
    return "";
  }
  ChildProcess* worker(const std::string& id) { return workers_.at(id).get(); }
  int port() const { return port_; }

 private:
  std::string bin_, dir_, model_;
  std::unique_ptr<ChildProcess> router_;
  std::map<std::string, std::unique_ptr<ChildProcess>> workers_;
  int port_ = 0;
};

struct StreamStats {
  std::string text;
  bool error = false;
  double stall_s = 0, median_gap_s = 0, e2e_s = 0;
};

StreamStats Summarize(const testing::SseReply& r) {
  StreamStats s;
  std::vector<double> gaps;
  for (size_t i = 0; i < r.events.size(); ++i) {
    json j = json::parse(r.events[i], nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("error")) s.error = true;
    if (j.contains("choices"))
      for (const auto& c : j["choices"])
        if (c.contains("text")) s.text += c["text"].get<std::string>();
    if (i > 0) gaps.push_back(r.arrival_seconds[i] - r.arrival_seconds[i - 1]);
  }
  if (!gaps.empty()) {
    s.stall_s = *std::max_element(gaps.begin(), gaps.end());
    std::sort(gaps.begin(), gaps.end());
    s.median_gap_s = gaps[gaps.size() / 2];
  }
  if (!r.arrival_seconds.empty()) s.e2e_s = r.arrival_seconds.back();
  return s;
}

std::string Body(int max_tokens) {
  // A ~40-token prompt of ids (no tokenizer involved); greedy, every token forced.
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(1000 + 37 * i);
  return json{{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
              {"ignore_eos", true}, {"stream", true}}
      .dump();
}

// Streams one request; after `before` events runs `fault` (if any) on another thread.
StreamStats Stream(Cluster& c, int max_tokens, int before, const std::function<void()>& fault) {
  std::atomic<int> events{0};
  std::thread faulter;
  if (fault) {
    faulter = std::thread([&] {
      testing::WaitFor([&] { return events.load() >= before; }, 60s, 1ms);
      fault();
    });
  }
  auto r = testing::HttpPostSse(c.port(), "/v1/completions", Body(max_tokens), 120s, [&](const std::string&) {
    events.fetch_add(1);
    return true;
  });
  if (faulter.joinable()) faulter.join();
  return Summarize(r);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
  BlockTerminationSignals();
  const std::string bin = bench::BinDir();
  const std::string dir = testing::MakeTempDir("pdserve-bench-migration");
  const std::string model = dir + "/tiny";
  const std::string make = bin + "/pdserve make-model --preset tiny --vocab 128815 --seed 3 --out " + model + " > " +
                           dir + "/make-model.log 2>&1";
  if (std::system(make.c_str()) != 0) {
    std::fprintf(stderr, "bench_migration: %s failed\n", make.c_str());
    return 1;
  }
  std::vector<bool> modes = {false};
  if (std::filesystem::exists("/sys/class/net")) modes.push_back(true);
  constexpr int kAfter = 64;
  json rows = json::array();
  std::string md =
      "# Request migration cost\n\nOne greedy stream (40-token prompt) on the tiny model; after `before` tokens the "
      "worker producing it is drained with a 1 ms timeout (it aborts and deregisters: the router moves the request "
      "at once) or killed (SIGKILL: noticed after the heartbeat timeout, 800 ms here, interval 100 ms). stall = the "
      "longest gap between SSE events; extra = stall - median gap; e2e against the same request uninterrupted. "
      "Median of " +
      std::to_string(reps) + " runs, fresh processes each; " + bench::MachineName() +
      ", 1 engine thread per worker, loopback.\n\n"
      "| mode | fault | before | stall ms | median gap ms | extra ms | e2e ms | uninterrupted e2e ms | output |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  for (bool disaggregated : modes) {
    for (const char* fault : {"drain", "kill"}) {
      for (int before : {8, 64, 256}) {
        std::vector<double> stall, gap, extra, e2e, base_e2e;
        bool identical = true;
        for (int rep = 0; rep < reps; ++rep) {
          Cluster c(bin, dir, model);
          if (Status s = c.Start(disaggregated); !s.ok()) {
            std::fprintf(stderr, "bench_migration: %s\n", s.ToString().c_str());
            return 1;
          }
          const StreamStats base = Stream(c, before + kAfter, 0, nullptr);
          std::string holder;
          const StreamStats got = Stream(c, before + kAfter, before, [&] {
            testing::WaitFor([&] { return !(holder = c.Holder()).empty(); }, 3s, 5ms);
            if (holder.empty()) return;
            if (std::string(fault) == "kill") {
              c.worker(holder)->Kill();
            } else {
              testing::HttpPost(c.port(), "/admin/drain", json{{"worker_id", holder}, {"timeout_ms", 1}}.dump());
            }
          });
          if (holder.empty() || got.error || base.error) {  // e.g. the stream ended before the fault
            std::fprintf(stderr, "bench_migration: %s %s before=%d: run skipped (holder '%s', error %d)\n",
                         disaggregated ? "disaggregated" : "colocated", fault, before, holder.c_str(), got.error);
            continue;
          }
          identical = identical && got.text == base.text;
          stall.push_back(got.stall_s * 1e3);
          gap.push_back(got.median_gap_s * 1e3);
          extra.push_back((got.stall_s - got.median_gap_s) * 1e3);
          e2e.push_back(got.e2e_s * 1e3);
          base_e2e.push_back(base.e2e_s * 1e3);
        }
        if (stall.empty()) continue;
        auto median = [](std::vector<double> v) {
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        const char* mode = disaggregated ? "disaggregated" : "colocated";
        json row = {{"mode", mode},           {"fault", fault},        {"tokens_before", before},
                    {"tokens_after", kAfter}, {"stall_ms", median(stall)}, {"median_gap_ms", median(gap)},
                    {"extra_ms", median(extra)}, {"e2e_ms", median(e2e)}, {"uninterrupted_e2e_ms", median(base_e2e)},
                    {"output_identical", identical}, {"reps", static_cast<int>(stall.size())}};
        rows.push_back(row);
        md += fmt::format("| {} | {} | {} | {:.1f} | {:.2f} | {:.1f} | {:.0f} | {:.0f} | {} |\n", mode, fault, before,
                          median(stall), median(gap), median(extra), median(e2e), median(base_e2e),
                          identical ? "identical" : "DIFFERS");
        std::fprintf(stderr, "%s %s before=%d: extra %.1f ms\n", mode, fault, before, median(extra));
      }
    }
  }
  json out = {{"benchmark", "migration"}, {"machine", bench::MachineName()}, {"commit", bench::GitRevision()},
              {"heartbeat_interval_ms", 100}, {"heartbeat_timeout_ms", 800}, {"rows", rows}};
  bench::WriteResults("migration", out, md);
  return 0;
}
