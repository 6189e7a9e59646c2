// pdserve-loadgen: an OpenAI-API load generator for pdserve clusters (docs/benchmarks.md).
//
// Options: pdserve-loadgen --help.
#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench/common/bench_util.h"
#include "bench/loadgen/dataset.h"
#include "bench/loadgen/driver.h"
#include "bench/loadgen/report.h"
#include "services/common/command_line.h"

namespace {

using namespace pdserve::loadgen;
using nlohmann::json;

const pdserve::services::CommandSpec kSpec{
    "pdserve-loadgen",
    "(--url http://HOST:PORT | --ready-file F) [options]",
    "An OpenAI-API load generator for pdserve clusters (docs/benchmarks.md): Poisson request-rate\n"
    "and concurrency sweeps over streaming /v1/completions or /v1/chat/completions, TTFT / TPOT /\n"
    "ITL / e2e percentiles, goodput under an SLO; --mode soak runs concurrent streams and samples\n"
    "the processes' RSS. Results: <out-dir>/<name>.{json,md} (default: the checkout's bench/results).\n"
    "Exit 0; 1 when a sweep point completed no request (or a soak failed); 2 for bad options.",
    {{"url", "URL", "the router, http://HOST:PORT (or --ready-file)"},
     {"ready-file", "F", "pdserve-launch's ready file: the router's port and every pid (soak watches them)"},
     {"endpoint", "E", "completions (default) | chat"},
     {"model", "NAME", "model name sent (default pdserve)"},
     {"dataset", "D", "random (default) | long | mixed | multiturn"},
     {"conversations", "N", "multiturn: conversations (default 8)"},
     {"turns", "N", "multiturn: turns per conversation (default 4)"},
     {"system-len", "N", "multiturn: the shared system prompt's tokens (default 2048)"},
     {"user-len", "N", "multiturn: tokens of each user message (default 64); replies: --output-len"},
     {"num-requests", "N", "requests per sweep point (default 100)"},
     {"input-len", "N", "prompt tokens (default 128)"},
     {"output-len", "N", "output tokens (default 64)"},
     {"range-ratio", "R", "lengths vary uniformly by +-R (default 0.5)"},
     {"long-input-len", "N", "long prompts' tokens (default 2048)"},
     {"long-output-len", "N", "long prompts' output tokens (default 16)"},
     {"long-fraction", "F", "share of long prompts in mixed (default 0.1)"},
     {"request-rates", "LIST", "request rates per second, e.g. 1,2,inf (default inf)"},
     {"concurrency", "LIST", "max concurrent requests per point, 0 = unlimited (default 0)"},
     {"warmup", "N", "unmeasured warm-up requests (default 4)"},
     {"slo-ttft-ms", "T", "SLO on TTFT (default 1000)"},
     {"slo-tpot-ms", "T", "SLO on TPOT (default 100)"},
     {"seed", "S", "dataset and arrival seed (default 0)"},
     {"label", "L", "free text in the report"},
     {"name", "NAME", "results file name (default loadgen / loadgen_soak)"},
     {"out-dir", "DIR", "results directory (default: $PDSERVE_RESULTS_DIR or the checkout's bench/results)"},
     {"mode", "M", "sweep (default) | soak"},
     {"streams", "N", "soak: concurrent streams (default 200)"},
     {"seconds", "S", "soak: duration (default 20)"},
     {"watch", "LIST", "soak: name=pid,... processes whose RSS to sample"},
     {"rss-growth-limit-mib", "M", "soak: allowed RSS growth (default 64)"},
     {"token-lo", "N", "lowest random token id (default 100)"},
     {"token-hi", "N", "highest random token id (default 1000)"},
     {"timeout-s", "S", "per-request timeout (default 600)"}}};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// "1,2.5,inf" -> rates > 0 (inf: all at once). Errors name the bad item.
pdserve::Result<std::vector<double>> ParseRates(const std::string& text) {
  std::vector<double> out;
  for (const std::string& item : Split(text)) {
    if (item == "inf") {
      out.push_back(INFINITY);
      continue;
    }
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !std::isfinite(v) || v <= 0)
      return pdserve::Status::InvalidArgument("--request-rates: '" + item + "' is not a rate > 0 or 'inf'");
    out.push_back(v);
  }
  if (out.empty()) return pdserve::Status::InvalidArgument("--request-rates is empty");
  return out;
}

// "0,16" -> concurrency limits >= 0 (0: unlimited).
pdserve::Result<std::vector<int>> ParseConcurrency(const std::string& text) {
  std::vector<int> out;
  for (const std::string& item : Split(text)) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > 1000000)
      return pdserve::Status::InvalidArgument("--concurrency: '" + item + "' is not a count >= 0 (0: unlimited)");
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) return pdserve::Status::InvalidArgument("--concurrency is empty");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  pdserve::services::CommandLine a;
  if (auto exit_code = pdserve::services::ParseCommandLineOrExit(argc, argv, kSpec, &a)) return *exit_code;
  auto fail = [](const pdserve::Status& s) { return pdserve::services::ReportCommandError(kSpec, s); };
  auto str = [&](const char* k, const char* def) { return a.GetOr(k, def); };
  pdserve::Status bad;
  auto num = [&](const char* k, double def, double lo = 0, double hi = 1e12) {
    auto v = a.GetDouble(k, def, lo, hi);
    if (!v.ok() && bad.ok()) bad = v.status();
    return v.ok() ? v.value() : def;
  };
  if (!a.Has("url") && !a.Has("ready-file"))
    return fail(pdserve::Status::InvalidArgument("give the target: --url http://HOST:PORT or --ready-file F"));
  if (a.Has("url") && a.Has("ready-file")) return fail(pdserve::Status::InvalidArgument("give --url or --ready-file, not both"));

  Target target;
  target.model = str("model", "pdserve");
  const std::string endpoint = str("endpoint", "completions");
  if (endpoint != "completions" && endpoint != "chat")
    return fail(pdserve::Status::InvalidArgument("--endpoint must be completions or chat"));
  target.chat = endpoint == "chat";
  target.timeout = std::chrono::seconds(static_cast<int64_t>(num("timeout-s", 600, 1)));
  std::vector<WatchedProcess> watch;
  if (a.Has("ready-file")) {
    std::ifstream in(*a.Get("ready-file"));
    const json r = json::parse(in, nullptr, false);
    if (r.is_discarded() || !r.contains("http_port"))
      return fail(pdserve::Status::InvalidArgument("cannot read a ready file at " + *a.Get("ready-file")));
    target.port = r["http_port"].get<int>();
    if (r.contains("pids"))
      for (const auto& [name, pid] : r["pids"].items()) watch.push_back({name, pid.get<pid_t>()});
  } else {
    const std::string url = *a.Get("url");
    const size_t hs = url.find("://"), colon = url.rfind(':');
    char* end = nullptr;
    const long port = colon == std::string::npos ? 0 : std::strtol(url.c_str() + colon + 1, &end, 10);
    if (hs == std::string::npos || colon <= hs || end == nullptr || (*end != '\0' && *end != '/') || port <= 0 ||
        port > 65535)
      return fail(pdserve::Status::InvalidArgument("--url must look like http://HOST:PORT, got '" + url + "'"));
    target.host = url.substr(hs + 3, colon - hs - 3);
    target.port = static_cast<int>(port);
  }
  for (const auto& w : Split(str("watch", ""))) {
    if (w.empty()) continue;
    const size_t eq = w.find('=');
    char* end = nullptr;
    const long pid = eq == std::string::npos ? 0 : std::strtol(w.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || *end != '\0' || pid <= 0)
      return fail(pdserve::Status::InvalidArgument("--watch takes name=pid,... got '" + w + "'"));
    watch.push_back({w.substr(0, eq), static_cast<pid_t>(pid)});
  }
  auto rates = ParseRates(str("request-rates", "inf"));
  if (!rates.ok()) return fail(rates.status());
  auto concurrency = ParseConcurrency(str("concurrency", "0"));
  if (!concurrency.ok()) return fail(concurrency.status());

  DatasetOptions d;
  d.name = str("dataset", "random");
  d.num_requests = static_cast<int64_t>(num("num-requests", 100, 1));
  d.input_len = static_cast<int64_t>(num("input-len", 128, 1));
  d.output_len = static_cast<int64_t>(num("output-len", 64, 1));
  d.range_ratio = num("range-ratio", 0.5, 0, 1);
  d.long_input_len = static_cast<int64_t>(num("long-input-len", 2048, 1));
  d.long_output_len = static_cast<int64_t>(num("long-output-len", 16, 1));
  d.long_fraction = num("long-fraction", 0.1, 0, 1);
  d.conversations = static_cast<int64_t>(num("conversations", 8, 1, 1e6));
  d.turns = static_cast<int64_t>(num("turns", 4, 1, 1e4));
  d.system_len = static_cast<int64_t>(num("system-len", 2048, 0, 1e7));
  d.user_len = static_cast<int64_t>(num("user-len", 64, 1, 1e7));
  d.token_lo = static_cast<int32_t>(num("token-lo", 100, 0, INT32_MAX));
  d.token_hi = static_cast<int32_t>(num("token-hi", 1000, 0, INT32_MAX));
  d.chat = target.chat;
  d.seed = static_cast<uint64_t>(num("seed", 0, 0, 9e15));
  Slo slo{num("slo-ttft-ms", 1000, 0) / 1e3, num("slo-tpot-ms", 100, 0) / 1e3};
  const std::string mode = str("mode", "sweep");
  const std::string label = str("label", "");
  const int warmup = static_cast<int>(num("warmup", 4, 0, 1e6));
  const int streams = static_cast<int>(num("streams", 200, 1, 100000));
  const double seconds = num("seconds", 20, 0.1);
  const double rss_limit_mib = num("rss-growth-limit-mib", 64, 0);
  if (!bad.ok()) return fail(bad);
  if (d.token_hi < d.token_lo) return fail(pdserve::Status::InvalidArgument("--token-hi must be >= --token-lo"));
  if (mode != "sweep" && mode != "soak") return fail(pdserve::Status::InvalidArgument("--mode must be sweep or soak"));
  if (auto dir = a.Get("out-dir")) setenv("PDSERVE_RESULTS_DIR", dir->c_str(), 1);
  const std::string name = str("name", mode == "soak" ? "loadgen_soak" : "loadgen");

  auto specs = MakeDataset(d);
  if (!specs.ok()) return fail(specs.status());
  json out = {{"machine", pdserve::bench::MachineName()},
              {"commit", pdserve::bench::GitRevision()},
              {"label", label},
              {"endpoint", endpoint},
              {"target", target.host + ":" + std::to_string(target.port)},
              {"dataset",
               {{"name", d.name}, {"num_requests", d.num_requests}, {"input_len", d.input_len},
                {"output_len", d.output_len}, {"range_ratio", d.range_ratio}, {"long_input_len", d.long_input_len},
                {"long_output_len", d.long_output_len}, {"long_fraction", d.long_fraction}, {"seed", d.seed},
                {"conversations", d.conversations}, {"turns", d.turns}, {"system_len", d.system_len},
                {"user_len", d.user_len}}},
              {"slo", {{"ttft_ms", slo.ttft_s * 1e3}, {"tpot_ms", slo.tpot_s * 1e3}}}};
  char head[1024];
  std::snprintf(head, sizeof(head),
                "# Load generator: %s%s%s\n\nCPU: %s  \nCommit: %s  \nTarget: %s, /v1/%s, model '%s'  \nDataset: %s, "
                "%lld requests, input %lld / output %lld tokens (+-%.0f%%), long prompts %lld tokens -> %lld tokens "
                "(%.0f%% of mixed)  \nSLO: TTFT <= %.0f ms, TPOT <= %.0f ms\n\n",
                name.c_str(), label.empty() ? "" : " - ", label.c_str(), pdserve::bench::MachineName().c_str(),
                pdserve::bench::GitRevision().c_str(), out["target"].get<std::string>().c_str(),
                target.chat ? "chat/completions" : "completions", target.model.c_str(), d.name.c_str(),
                static_cast<long long>(d.num_requests), static_cast<long long>(d.input_len),
                static_cast<long long>(d.output_len), d.range_ratio * 100, static_cast<long long>(d.long_input_len),
                static_cast<long long>(d.long_output_len), d.long_fraction * 100, slo.ttft_s * 1e3, slo.tpot_s * 1e3);
  std::string md = head;
  const bool multiturn = d.name == "multiturn";
  if (multiturn) {
    std::snprintf(head, sizeof(head),
                  "Multi-turn: %lld conversations x %lld turns, a shared system prompt of %lld tokens, user "
                  "messages of %lld tokens, replies of %lld tokens (each turn's prompt: the conversation so far + "
                  "the new message)\n\n",
                  static_cast<long long>(d.conversations), static_cast<long long>(d.turns),
                  static_cast<long long>(d.system_len), static_cast<long long>(d.user_len),
                  static_cast<long long>(d.output_len));
    md += head;
  }

  if (mode == "soak") {
    SoakOptions so;
    so.streams = streams;
    so.seconds = seconds;
    so.watch = watch;
    const SoakResult r = RunSoak(target, specs.value(), so);
    const RunSummary s = Summarize(r.records, slo);
    out["soak"] = SoakJson(r, s);
    out["soak"]["streams"] = streams;
    out["soak"]["rss_growth_limit_mib"] = rss_limit_mib;
    const int idle_streams = static_cast<int>(
        std::count(r.completed_per_stream.begin(), r.completed_per_stream.end(), 0));
    out["soak"]["streams_without_a_completed_request"] = idle_streams;
    bool pass = s.failed == 0 && idle_streams == 0;
    char b[512];
    std::snprintf(b, sizeof(b),
                  "Soak: %d concurrent streams for %.0f s: %zu requests, %zu completed, %zu failed; %d streams without a completed request; %.1f req/s, %.0f "
                  "output tok/s; TTFT p99 %.1f ms, TPOT p99 %.2f ms.\n\n| process | RSS after warm-up MiB | max RSS "
                  "in the last quarter MiB | growth MiB |\n|---|---|---|---|\n",
                  streams, r.duration_s, s.requests, s.completed, s.failed, idle_streams, s.request_throughput,
                  s.output_token_throughput, s.ttft.p99 * 1e3, s.tpot.p99 * 1e3);
    md += b;
    for (const auto& series : r.rss) {
      const bool ok = series.growth_kib() <= static_cast<int64_t>(rss_limit_mib * 1024);
      pass = pass && ok && !series.rss_kib.empty();
      std::snprintf(b, sizeof(b), "| %s (pid %d) | %.1f | %.1f | %.1f%s |\n", series.name.c_str(), series.pid,
                    static_cast<double>(series.baseline_kib) / 1024, static_cast<double>(series.final_max_kib) / 1024,
                    static_cast<double>(series.growth_kib()) / 1024, ok ? "" : " (over the limit)");
      md += b;
    }
    for (const auto& e : s.first_errors) md += "\nerror: " + e;
    md += pass ? "\n**PASS**: every stream completed, RSS growth within " : "\n**FAIL** (limit ";
    md += std::to_string(static_cast<int>(rss_limit_mib)) + " MiB" + (pass ? "\n" : ")\n");
    out["soak"]["pass"] = pass;
    pdserve::bench::WriteResults(name, out, md);
    return pass ? 0 : 1;
  }

  // Warm-up (not measured): a few requests of the same shapes (multiturn: short random prompts,
  // which leave nothing in a prefix cache the conversations could hit).
  if (warmup > 0) {
    std::vector<RequestSpec> w;
    if (multiturn) {
      DatasetOptions wd = d;
      wd.name = "random";
      wd.num_requests = warmup;
      wd.input_len = std::max<int64_t>(8, d.user_len);
      wd.seed = d.seed + 1000003;
      w = MakeDataset(wd).value();
    } else {
      w.assign(specs.value().begin(), specs.value().begin() + std::min<int64_t>(warmup, d.num_requests));
    }
    for (auto& s : w) s.arrival_s = 0;
    RunLoad(target, w, 2);
  }
  std::vector<SweepPoint> points;
  for (const double rate : rates.value())
    for (const int conc : concurrency.value()) {
      SweepPoint p;
      p.request_rate = rate;
      p.max_concurrency = conc;
      std::vector<RequestSpec> run = specs.value();
      if (multiturn && !points.empty()) {
        // Fresh conversations per point: a point must not hit what an earlier one left cached.
        DatasetOptions dp = d;
        dp.seed = d.seed + points.size();
        run = MakeDataset(dp).value();
      }
      AssignPoissonArrivals(&run, p.request_rate, d.seed);
      std::fprintf(stderr, "pdserve-loadgen: rate %g, concurrency %d, %zu requests...\n", rate, p.max_concurrency,
                   run.size());
      const auto records =
          multiturn ? RunConversations(target, run, p.max_concurrency) : RunLoad(target, run, p.max_concurrency);
      p.all = Summarize(records, slo);
      if (d.name == "mixed")
        for (const char* kind : {"short", "long"}) p.by_kind.emplace_back(kind, Summarize(records, slo, kind));
      if (multiturn)
        for (int64_t t = 1; t <= d.turns; ++t) {
          const std::string kind = "turn-" + std::to_string(t);
          p.by_kind.emplace_back(kind, Summarize(records, slo, kind));
        }
      points.push_back(std::move(p));
      out["runs"].push_back(SweepPointJson(points.back()));
    }
  md += SweepMarkdown(points);
  md += "\nTTFT: send -> first text chunk; TPOT: (e2e - TTFT) / (output tokens - 1); ITL: gaps between text chunks; "
        "goodput: completed requests/s within the SLO.\n";
  for (const auto& p : points)
    for (const auto& e : p.all.first_errors) md += "\nerror: " + e + "\n";
  pdserve::bench::WriteResults(name, out, md);
  // A point where nothing completed means the target is broken, not slow: fail the run.
  for (const auto& p : points)
    if (p.all.completed == 0) return 1;
  return 0;
}
