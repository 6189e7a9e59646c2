// Metrics plumbing shared by every service (prometheus-cpp). Each service defines its metric
// families in one file (router_metrics.h, worker_metrics.h) on a prometheus::Registry and
// exposes it either through its own HTTP server (the router's GET /metrics, via
// SerializeMetrics) or through a MetricsExposer (workers).
//
// Naming: pdserve_<module>_<what>_<unit>, `_total` on counters, base units (seconds, bytes),
// low-cardinality labels only (role, worker, outcome, state); docs/router.md lists them all.
//
// Thread-safety: prometheus-cpp metrics and registries are thread-safe; MetricsExposer serves
// on its own threads and is destroyed by its owner.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <prometheus/exposer.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/status.h"

namespace pdserve::services {

class MetricsExposer {
 public:
  // Serves `registry` at http://BIND/metrics. bind_address is "HOST:PORT"; port 0 picks a free
  // one (see port()). Errors: Unavailable (cannot listen there).
  static Result<std::unique_ptr<MetricsExposer>> Start(const std::string& bind_address,
                                                       std::shared_ptr<prometheus::Registry> registry);
  // Stops serving. Takes milliseconds, not civetweb's 2 s listener poll (see metrics.cc).
  ~MetricsExposer();
  MetricsExposer(const MetricsExposer&) = delete;
  MetricsExposer& operator=(const MetricsExposer&) = delete;
  int port() const { return port_; }
  // "HOST:PORT" with the resolved port.
  const std::string& address() const { return address_; }

 private:
  MetricsExposer() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::string address_;
};

// The Prometheus text exposition of everything in `registry`.
std::string SerializeMetrics(prometheus::Registry& registry);

// Histogram buckets (seconds) for request-scale latencies (1 ms .. 10 min).
prometheus::Histogram::BucketBoundaries RequestLatencyBuckets();
// Histogram buckets (seconds) for per-token latencies (100 us .. 10 s).
prometheus::Histogram::BucketBoundaries TokenLatencyBuckets();

}  // namespace pdserve::services
