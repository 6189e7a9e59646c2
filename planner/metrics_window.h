// Percentiles over a time window from Prometheus histograms, for the autoscaler: a scrape holds
// each histogram's cumulative bucket counts; the difference of two scrapes is the histogram of
// the requests observed between them, and a percentile is read off it by linear interpolation
// inside the bucket that holds it (as Prometheus' histogram_quantile does).
//
// Thread-safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve::planner {

struct HistogramCounts {
  std::vector<double> bounds;    // upper bounds `le`, ascending, +Inf last
  std::vector<double> cumulative;  // observations <= bound
  double count = 0, sum = 0;
};

// The metric families of one Prometheus text exposition: histograms by name (labels merged:
// series of one family are summed bucket by bucket), and gauges / counters by name (summed over
// their series, or only the series whose labels contain `label_filter` in Sample()).
class MetricsText {
 public:
  static MetricsText Parse(std::string_view text);

  std::optional<HistogramCounts> Histogram(const std::string& name) const;
  // Sum of the samples of `name` whose label text contains `label_filter` ("" = all).
  std::optional<double> Sample(const std::string& name, const std::string& label_filter = "") const;

 private:
  struct Line {
    std::string name, labels;
    double value;
  };
  std::vector<Line> lines_;
};

// The histogram of what was observed between `before` and `after` (same buckets). Empty when
// the buckets differ or the counter went backwards (a restarted router).
std::optional<HistogramCounts> Difference(const HistogramCounts& before, const HistogramCounts& after);

// The q-quantile (0 < q < 1) of a histogram, interpolated inside its bucket; NaN when it holds
// no observation. Observations in the +Inf bucket count at the last finite bound.
double Quantile(const HistogramCounts& h, double q);

}  // namespace pdserve::planner
