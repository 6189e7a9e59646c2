// Results of the load generator as JSON and markdown (bench/results/<name>.{json,md}).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/loadgen/driver.h"
#include "bench/loadgen/stats.h"

namespace pdserve::loadgen {

struct SweepPoint {
  double request_rate = 0;  // <= 0: all at once
  int max_concurrency = 0;  // 0: unlimited
  RunSummary all;
  std::vector<std::pair<std::string, RunSummary>> by_kind;  // when the dataset has several kinds
};

nlohmann::json SweepPointJson(const SweepPoint& p);
// One markdown table: a row per sweep point and kind.
std::string SweepMarkdown(const std::vector<SweepPoint>& points);

nlohmann::json SoakJson(const SoakResult& r, const RunSummary& s);

}  // namespace pdserve::loadgen
