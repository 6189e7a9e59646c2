#include "bench/loadgen/stats.h"

#include <algorithm>
#include <cmath>

namespace pdserve::loadgen {

std::optional<double> Tpot(const RequestRecord& r) {
  if (!r.ok || r.output_tokens < 2 || r.ttft_s < 0 || r.e2e_s < r.ttft_s) return std::nullopt;
  return (r.e2e_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1);
}

double PercentileSorted(const std::vector<double>& sorted, double p) {
  p = std::clamp(p, 0.0, 100.0);
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return PercentileSorted(values, p);
}

LatencyStats Summarize(std::vector<double> values) {
  LatencyStats s;
  s.count = values.size();
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  s.p50 = PercentileSorted(values, 50);
  s.p90 = PercentileSorted(values, 90);
  s.p99 = PercentileSorted(values, 99);
  s.max = values.back();
  return s;
}

nlohmann::json ToJson(const LatencyStats& s) {
  return {{"count", s.count}, {"mean_ms", s.mean * 1e3}, {"p50_ms", s.p50 * 1e3},
          {"p90_ms", s.p90 * 1e3}, {"p99_ms", s.p99 * 1e3}, {"max_ms", s.max * 1e3}};
}

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok || r.ttft_s < 0 || r.ttft_s > slo.ttft_s) return false;
  const auto tpot = Tpot(r);
  return !tpot || *tpot <= slo.tpot_s;
}

RunSummary Summarize(const std::vector<RequestRecord>& records, const Slo& slo, const std::string& kind) {
  RunSummary s;
  double first = INFINITY, last = -INFINITY;
  int64_t out_tokens = 0, in_tokens = 0;
  size_t good = 0;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const auto& r : records) {
    first = std::min(first, r.send_s);
    if (r.ok) last = std::max(last, r.send_s + r.e2e_s);
  }
  for (const auto& r : records) {
    if (!kind.empty() && r.kind != kind) continue;
    ++s.requests;
    if (!r.ok) {
      ++s.failed;
      if (s.first_errors.size() < 5 &&
          std::find(s.first_errors.begin(), s.first_errors.end(), r.error) == s.first_errors.end())
        s.first_errors.push_back(r.error);
      continue;
    }
    ++s.completed;
    out_tokens += r.output_tokens;
    in_tokens += r.prompt_tokens;
    if (r.cached_tokens >= 0) {
      s.prompt_tokens += r.prompt_tokens;
      s.cached_tokens += r.cached_tokens;
      s.reusable_tokens += std::max<int64_t>(r.reusable_tokens, 0);
    }
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
    if (auto t = Tpot(r)) tpot.push_back(*t);
    for (size_t i = 1; i < r.chunk_s.size(); ++i) itl.push_back(r.chunk_s[i] - r.chunk_s[i - 1]);
    if (MeetsSlo(r, slo)) ++good;
  }
  s.duration_s = last > first ? last - first : 0;
  if (s.duration_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / s.duration_s;
    s.output_token_throughput = static_cast<double>(out_tokens) / s.duration_s;
    s.input_token_throughput = static_cast<double>(in_tokens) / s.duration_s;
    s.goodput = static_cast<double>(good) / s.duration_s;
  }
  s.slo_attainment = s.requests ? static_cast<double>(good) / static_cast<double>(s.requests) : 0;
  if (s.reusable_tokens > 0)
    s.hit_rate_of_ideal = static_cast<double>(s.cached_tokens) / static_cast<double>(s.reusable_tokens);
  s.ttft = Summarize(std::move(ttft));
  s.tpot = Summarize(std::move(tpot));
  s.itl = Summarize(std::move(itl));
  s.e2e = Summarize(std::move(e2e));
  return s;
}

nlohmann::json ToJson(const RunSummary& s) {
  return {{"requests", s.requests},
          {"completed", s.completed},
          {"failed", s.failed},
          {"duration_s", s.duration_s},
          {"request_throughput_rps", s.request_throughput},
          {"output_token_throughput_tps", s.output_token_throughput},
          {"input_token_throughput_tps", s.input_token_throughput},
          {"goodput_rps", s.goodput},
          {"slo_attainment", s.slo_attainment},
          {"ttft", ToJson(s.ttft)},
          {"tpot", ToJson(s.tpot)},
          {"itl", ToJson(s.itl)},
          {"e2e", ToJson(s.e2e)},
          {"prefix_cache",
           {{"prompt_tokens", s.prompt_tokens},
            {"cached_tokens", s.cached_tokens},
            {"reusable_tokens", s.reusable_tokens},
            {"hit_rate_of_ideal", s.hit_rate_of_ideal}}},
          {"errors", s.first_errors}};
}

}  // namespace pdserve::loadgen
