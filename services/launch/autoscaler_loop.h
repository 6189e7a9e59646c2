// AutoscalerLoop: the launcher's SLO autoscaler (ClusterConfig::autoscaler, docs/planner.md
// "Autoscaling"). Every interval it scrapes the router's GET /metrics, keeps the scrapes of the
// last window, turns them into a planner::WindowObservation (TTFT, inter-token latency as TPOT,
// queue-time percentiles over the window; requests finished; waiting / running now), asks
// planner::AutoscalerPolicy, and acts through the launcher's hooks:
//
//   scale up    Launcher::ScaleGroup(group, count + 1): a new process, which loads, registers
//               and takes work;
//   scale down  the least loaded ready worker of the group (GET /admin/workers) is drained
//               through the router (POST /admin/drain, drain_timeout): no new placements, its
//               streams finish, it deregisters and exits 0, and the launcher lets it go.
//
// Every decision is counted (pdserve_planner_decisions_total{pool,action}); changes and
// blocked ones are logged on the launcher's output, holds at debug level (logger "planner").
// Exposes pdserve_planner_* on its own /metrics (metrics_port).
//
// Thread-safety: Poll only from the launcher's main thread (it calls the launcher's hooks).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "common/status.h"
#include "planner/autoscaler.h"
#include "planner/metrics_window.h"
#include "services/common/metrics.h"
#include "services/launch/cluster_config.h"

namespace httplib {
class Client;
}

namespace pdserve::launch {

class AutoscalerLoop {
 public:
  using Clock = std::chrono::steady_clock;
  struct Hooks {
    std::function<uint32_t(const std::string& group)> live;  // processes counted towards the group's size
    std::function<Status(const std::string& group, uint32_t count)> scale_to;  // Launcher::ScaleGroup
    // The worker `id` (an instance name) was asked to drain: count it out of its group.
    std::function<void(const std::string& id)> draining;
    std::function<void(const std::string& line)> say;  // the launcher's output
  };

  // Starts the metrics exposer on settings.metrics_host:settings.metrics_port and reads the
  // router at router_host:router_port (its advertised address). With router.api_keys_file set,
  // the loop calls the router with the file's first key. Errors: Unavailable (cannot listen),
  // NotFound / InvalidArgument (the key file).
  static Result<std::unique_ptr<AutoscalerLoop>> Create(const ClusterConfig& config, std::string router_host,
                                                        int router_port, Hooks hooks);

  // One tick when the interval has passed since the last (cheap otherwise).
  void Poll(Clock::time_point now);
  int metrics_port() const { return exposer_->port(); }

 private:
  struct Scrape {
    Clock::time_point at;
    std::optional<planner::HistogramCounts> ttft, itl, queue;
    double finished = 0, waiting = 0, running = 0;
  };
  AutoscalerLoop(const ClusterConfig& config, std::string router_host, int router_port, Hooks hooks);
  std::optional<Scrape> ScrapeRouter(Clock::time_point now);
  planner::WindowObservation Observe(const Scrape& now, const Scrape& then) const;
  void Apply(const planner::ScaleDecision& d);
  // The ready worker of `group` with the fewest outstanding requests (id "" when none), and
  // that number.
  std::pair<std::string, int64_t> LeastLoaded(const std::string& group);
  // A client of the router's HTTP front (timeouts set, the API key when there is one).
  std::unique_ptr<httplib::Client> RouterClient() const;

  // Immutable after construction.
  AutoscalerSettings settings_;
  std::map<std::string, bool> multi_rank_;  // group -> runs a plan (drained by ScaleGroup)
  std::string host_;
  int port_ = 0;
  std::string api_key_;  // "" without router.api_keys_file
  Hooks hooks_;
  // Owned by the main thread.
  planner::AutoscalerPolicy policy_;
  std::deque<Scrape> scrapes_;
  Clock::time_point next_tick_{};
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* decisions_ = nullptr;
  prometheus::Family<prometheus::Gauge>* workers_ = nullptr;
  prometheus::Family<prometheus::Gauge>* observed_ = nullptr;
  prometheus::Counter* scrape_failures_ = nullptr;
  std::unique_ptr<services::MetricsExposer> exposer_;
};

}  // namespace pdserve::launch
