// pdserve-loadgen: an OpenAI-API load generator for pdserve clusters (docs/benchmarks.md).
//
//   pdserve-loadgen [--url http://127.0.0.1:8000 | --ready-file F] [--endpoint completions|chat]
//                   [--model NAME] [--dataset random|long|mixed] [--num-requests N]
//                   [--input-len N] [--output-len N] [--range-ratio R]
//                   [--long-input-len N] [--long-output-len N] [--long-fraction F]
//                   [--request-rates 1,2,inf] [--concurrency 0,16] [--warmup N]
//                   [--slo-ttft-ms T] [--slo-tpot-ms T] [--seed S] [--label L] [--name NAME]
//                   (exit 1 when a sweep point completed no request)
//   pdserve-loadgen --mode soak --streams 1000 --seconds 300 [--watch name=pid,...]
//                   [--rss-growth-limit-mib M] ...            (exit 1 unless every stream
//                   completed and no watched RSS grew past the limit)
//
// --ready-file reads pdserve-launch's ready file: the router's port and every process's pid
// (the soak watches them all). Results go to bench/results/<name>.{json,md}.
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

namespace {

using namespace pdserve::loadgen;
using nlohmann::json;

const char* kOptions[] = {"url", "ready-file", "endpoint", "model", "dataset", "num-requests", "input-len",
                          "output-len", "range-ratio", "long-input-len", "long-output-len", "long-fraction",
                          "request-rates", "concurrency", "warmup", "slo-ttft-ms", "slo-tpot-ms", "seed",
                          "label", "name", "mode", "streams", "seconds", "watch", "rss-growth-limit-mib",
                          "token-lo", "token-hi", "timeout-s"};

int Fail(const std::string& msg) {
  std::fprintf(stderr, "pdserve-loadgen: %s\n", msg.c_str());
  return 2;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  std::map<std::string, std::string> a;
  for (int i = 1; i < argc; ++i) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0) return Fail("unexpected argument '" + key + "'");
    key = key.substr(2);
    if (std::find(std::begin(kOptions), std::end(kOptions), key) == std::end(kOptions))
      return Fail("unknown option --" + key);
    if (i + 1 >= argc) return Fail("--" + key + " needs a value");
    if (!a.emplace(key, argv[++i]).second) return Fail("--" + key + " given twice");
  }
  auto str = [&](const char* k, const char* def) { return a.count(k) ? a[k] : std::string(def); };
  std::string bad;
  auto num = [&](const char* k, double def) {
    if (!a.count(k)) return def;
    char* end = nullptr;
    const double v = std::strtod(a[k].c_str(), &end);
    if (end == a[k].c_str() || *end) bad = k;
    return v;
  };

  Target target;
  target.model = str("model", "pdserve");
  const std::string endpoint = str("endpoint", "completions");
  if (endpoint != "completions" && endpoint != "chat") return Fail("--endpoint must be completions or chat");
  target.chat = endpoint == "chat";
  target.timeout = std::chrono::seconds(static_cast<int64_t>(num("timeout-s", 600)));
  std::vector<WatchedProcess> watch;
  if (a.count("ready-file")) {
    std::ifstream in(a["ready-file"]);
    const json r = json::parse(in, nullptr, false);
    if (r.is_discarded() || !r.contains("http_port")) return Fail("cannot read a ready file at " + a["ready-file"]);
    target.port = r["http_port"].get<int>();
    if (r.contains("pids"))
      for (const auto& [name, pid] : r["pids"].items()) watch.push_back({name, pid.get<pid_t>()});
  } else {
    const std::string url = str("url", "http://127.0.0.1:8000");
    const size_t hs = url.find("://"), colon = url.rfind(':');
    if (hs == std::string::npos || colon <= hs) return Fail("--url must look like http://HOST:PORT, got '" + url + "'");
    target.host = url.substr(hs + 3, colon - hs - 3);
    target.port = std::atoi(url.c_str() + colon + 1);
  }
  for (const auto& w : Split(str("watch", ""))) {
    const size_t eq = w.find('=');
    if (eq == std::string::npos) return Fail("--watch takes name=pid,... got '" + w + "'");
    watch.push_back({w.substr(0, eq), static_cast<pid_t>(std::atoi(w.c_str() + eq + 1))});
  }

  DatasetOptions d;
  d.name = str("dataset", "random");
  d.num_requests = static_cast<int64_t>(num("num-requests", 100));
  d.input_len = static_cast<int64_t>(num("input-len", 128));
  d.output_len = static_cast<int64_t>(num("output-len", 64));
  d.range_ratio = num("range-ratio", 0.5);
  d.long_input_len = static_cast<int64_t>(num("long-input-len", 2048));
  d.long_output_len = static_cast<int64_t>(num("long-output-len", 16));
  d.long_fraction = num("long-fraction", 0.1);
  d.token_lo = static_cast<int32_t>(num("token-lo", 100));
  d.token_hi = static_cast<int32_t>(num("token-hi", 1000));
  d.chat = target.chat;
  d.seed = static_cast<uint64_t>(num("seed", 0));
  Slo slo{num("slo-ttft-ms", 1000) / 1e3, num("slo-tpot-ms", 100) / 1e3};
  const std::string mode = str("mode", "sweep");
  const std::string label = str("label", "");
  const int warmup = static_cast<int>(num("warmup", 4));
  const int streams = static_cast<int>(num("streams", 200));
  const double seconds = num("seconds", 20);
  const double rss_limit_mib = num("rss-growth-limit-mib", 64);
  if (!bad.empty()) return Fail("--" + bad + " is not a number");
  if (mode != "sweep" && mode != "soak") return Fail("--mode must be sweep or soak");
  const std::string name = str("name", mode == "soak" ? "loadgen_soak" : "loadgen");

  auto specs = MakeDataset(d);
  if (!specs.ok()) return Fail(specs.status().ToString());
  json out = {{"machine", pdserve::bench::MachineName()},
              {"commit", pdserve::bench::GitRevision()},
              {"label", label},
              {"endpoint", endpoint},
              {"target", target.host + ":" + std::to_string(target.port)},
              {"dataset",
               {{"name", d.name}, {"num_requests", d.num_requests}, {"input_len", d.input_len},
                {"output_len", d.output_len}, {"range_ratio", d.range_ratio}, {"long_input_len", d.long_input_len},
                {"long_output_len", d.long_output_len}, {"long_fraction", d.long_fraction}, {"seed", d.seed}}},
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

  // Warm-up (not measured): a few requests of the same shapes.
  if (warmup > 0) {
    std::vector<RequestSpec> w(specs.value().begin(),
                               specs.value().begin() + std::min<int64_t>(warmup, d.num_requests));
    for (auto& s : w) s.arrival_s = 0;
    RunLoad(target, w, 2);
  }
  std::vector<SweepPoint> points;
  for (const auto& rate_text : Split(str("request-rates", "inf")))
    for (const auto& conc_text : Split(str("concurrency", "0"))) {
      SweepPoint p;
      p.request_rate = rate_text == "inf" ? INFINITY : std::atof(rate_text.c_str());
      p.max_concurrency = std::atoi(conc_text.c_str());
      std::vector<RequestSpec> run = specs.value();
      AssignPoissonArrivals(&run, p.request_rate, d.seed);
      std::fprintf(stderr, "pdserve-loadgen: rate %s, concurrency %d, %zu requests...\n", rate_text.c_str(),
                   p.max_concurrency, run.size());
      const auto records = RunLoad(target, run, p.max_concurrency);
      p.all = Summarize(records, slo);
      if (d.name == "mixed")
        for (const char* kind : {"short", "long"}) p.by_kind.emplace_back(kind, Summarize(records, slo, kind));
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
