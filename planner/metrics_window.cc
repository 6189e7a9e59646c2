#include "planner/metrics_window.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>

namespace pdserve::planner {

namespace {

double ParseValue(std::string_view s) {
  if (s == "+Inf" || s == "Inf") return std::numeric_limits<double>::infinity();
  if (s == "-Inf") return -std::numeric_limits<double>::infinity();
  if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  return std::strtod(std::string(s).c_str(), nullptr);
}

// The value of label `key` in a "{a="x",b="y"}" text ("" when absent).
std::string LabelValue(const std::string& labels, const std::string& key) {
  const std::string pat = key + "=\"";
  size_t p = labels.find(pat);
  if (p == std::string::npos) return "";
  p += pat.size();
  const size_t e = labels.find('"', p);
  return e == std::string::npos ? "" : labels.substr(p, e - p);
}

}  // namespace

MetricsText MetricsText::Parse(std::string_view text) {
  MetricsText m;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    Line l;
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    if (space == std::string_view::npos) continue;
    if (brace != std::string_view::npos && brace < space) {
      const size_t close = line.find('}', brace);
      if (close == std::string_view::npos) continue;
      l.name = std::string(line.substr(0, brace));
      l.labels = std::string(line.substr(brace, close - brace + 1));
    } else {
      l.name = std::string(line.substr(0, line.find(' ')));
    }
    l.value = ParseValue(line.substr(space + 1));
    m.lines_.push_back(std::move(l));
  }
  return m;
}

std::optional<HistogramCounts> MetricsText::Histogram(const std::string& name) const {
  std::map<double, double> buckets;
  HistogramCounts h;
  bool found = false;
  for (const Line& l : lines_) {
    if (l.name == name + "_bucket") {
      buckets[ParseValue(LabelValue(l.labels, "le"))] += l.value;
      found = true;
    } else if (l.name == name + "_count") {
      h.count += l.value;
    } else if (l.name == name + "_sum") {
      h.sum += l.value;
    }
  }
  if (!found) return std::nullopt;
  for (const auto& [le, c] : buckets) {
    h.bounds.push_back(le);
    h.cumulative.push_back(c);
  }
  return h;
}

std::optional<double> MetricsText::Sample(const std::string& name, const std::string& label_filter) const {
  double sum = 0;
  bool found = false;
  for (const Line& l : lines_)
    if (l.name == name && (label_filter.empty() || l.labels.find(label_filter) != std::string::npos)) {
      sum += l.value;
      found = true;
    }
  if (!found) return std::nullopt;
  return sum;
}

std::optional<HistogramCounts> Difference(const HistogramCounts& before, const HistogramCounts& after) {
  if (before.bounds != after.bounds || after.count < before.count) return std::nullopt;
  HistogramCounts d;
  d.bounds = after.bounds;
  d.count = after.count - before.count;
  d.sum = after.sum - before.sum;
  for (size_t i = 0; i < after.cumulative.size(); ++i) {
    const double v = after.cumulative[i] - before.cumulative[i];
    if (v < 0) return std::nullopt;
    d.cumulative.push_back(v);
  }
  return d;
}

double Quantile(const HistogramCounts& h, double q) {
  if (h.cumulative.empty() || h.cumulative.back() <= 0) return std::numeric_limits<double>::quiet_NaN();
  const double total = h.cumulative.back();
  const double rank = q * total;
  double prev_bound = 0, prev_count = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    if (h.cumulative[i] >= rank) {
      if (std::isinf(h.bounds[i])) return prev_bound;  // beyond the last finite bucket
      const double in_bucket = h.cumulative[i] - prev_count;
      const double f = in_bucket > 0 ? (rank - prev_count) / in_bucket : 0;
      return prev_bound + (h.bounds[i] - prev_bound) * f;
    }
    prev_bound = std::isinf(h.bounds[i]) ? prev_bound : h.bounds[i];
    prev_count = h.cumulative[i];
  }
  return prev_bound;
}

}  // namespace pdserve::planner
