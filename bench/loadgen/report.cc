#include "bench/loadgen/report.h"

#include <cmath>
#include <cstdio>

namespace pdserve::loadgen {

namespace {
std::string RateText(double rate) {
  if (!(rate > 0) || std::isinf(rate)) return "inf";
  char b[32];
  std::snprintf(b, sizeof(b), "%g", rate);
  return b;
}
std::string Row(const SweepPoint& p, const std::string& kind, const RunSummary& s) {
  char b[512];
  std::snprintf(b, sizeof(b),
                "| %s | %s | %s | %zu/%zu | %.2f | %.0f | %.0f / %.0f | %.1f / %.1f | %.1f | %.0f | %.2f | %.0f%% |\n",
                RateText(p.request_rate).c_str(), p.max_concurrency ? std::to_string(p.max_concurrency).c_str() : "-",
                kind.c_str(), s.completed, s.requests, s.request_throughput, s.output_token_throughput,
                s.ttft.p50 * 1e3, s.ttft.p99 * 1e3, s.tpot.p50 * 1e3, s.tpot.p99 * 1e3, s.itl.p99 * 1e3,
                s.e2e.p50 * 1e3, s.goodput, s.slo_attainment * 100);
  return b;
}
}  // namespace

nlohmann::json SweepPointJson(const SweepPoint& p) {
  nlohmann::json j = {{"request_rate", p.request_rate > 0 && !std::isinf(p.request_rate) ? nlohmann::json(p.request_rate)
                                                                                         : nlohmann::json("inf")},
                      {"max_concurrency", p.max_concurrency},
                      {"all", ToJson(p.all)}};
  for (const auto& [kind, s] : p.by_kind) j["by_kind"][kind] = ToJson(s);
  return j;
}

std::string SweepMarkdown(const std::vector<SweepPoint>& points) {
  std::string md =
      "| rate req/s | concurrency | requests | done | req/s | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL "
      "p99 ms | e2e p50 ms | goodput req/s | SLO met |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& p : points) {
    md += Row(p, "all", p.all);
    for (const auto& [kind, s] : p.by_kind) md += Row(p, kind, s);
  }
  bool cache_reported = false;
  for (const auto& p : points) cache_reported = cache_reported || p.all.prompt_tokens > 0;
  if (!cache_reported) return md;
  md += "\nPrefix cache (usage.prompt_tokens_details.cached_tokens; reusable: tokens of each prompt an earlier "
        "request of the run computed or generated, what a cluster-wide cache could supply):\n\n| rate req/s | "
        "concurrency | requests | prompt tokens | cached | cached share | reusable | cached / reusable |\n"
        "|---|---|---|---|---|---|---|---|\n";
  auto cache_row = [&](const SweepPoint& p, const std::string& kind, const RunSummary& s) {
    char b[512];
    std::snprintf(b, sizeof(b), "| %s | %s | %s | %lld | %lld | %.1f%% | %lld | %s |\n", RateText(p.request_rate).c_str(),
                  p.max_concurrency ? std::to_string(p.max_concurrency).c_str() : "-", kind.c_str(),
                  static_cast<long long>(s.prompt_tokens), static_cast<long long>(s.cached_tokens),
                  s.prompt_tokens ? 100.0 * static_cast<double>(s.cached_tokens) / static_cast<double>(s.prompt_tokens) : 0.0,
                  static_cast<long long>(s.reusable_tokens),
                  s.hit_rate_of_ideal >= 0 ? (std::to_string(static_cast<int>(std::lround(s.hit_rate_of_ideal * 100))) + "%").c_str()
                                           : "-");
    md += b;
  };
  for (const auto& p : points) {
    cache_row(p, "all", p.all);
    for (const auto& [kind, s] : p.by_kind) cache_row(p, kind, s);
  }
  return md;
}

nlohmann::json SoakJson(const SoakResult& r, const RunSummary& s) {
  nlohmann::json j = {{"duration_s", r.duration_s}, {"summary", ToJson(s)}};
  for (const auto& series : r.rss) {
    nlohmann::json samples = nlohmann::json::array();
    for (size_t i = 0; i < series.t_s.size(); ++i) samples.push_back({series.t_s[i], series.rss_kib[i]});
    j["rss"][series.name] = {{"pid", series.pid},
                             {"baseline_kib", series.baseline_kib},
                             {"final_max_kib", series.final_max_kib},
                             {"growth_kib", series.growth_kib()},
                             {"samples_t_s_kib", samples}};
  }
  return j;
}

}  // namespace pdserve::loadgen
