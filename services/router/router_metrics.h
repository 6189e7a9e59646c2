// RouterMetrics: every metric pdserve-router exports (GET /metrics), defined here only.
//
//   pdserve_router_requests_total{outcome}        finished requests: ok, client_error (4xx),
//                                                 rejected (429), unavailable (503), timeout,
//                                                 cancelled (client went away), error (5xx /
//                                                 worker failure mid-request)
//   pdserve_router_ttft_seconds                   request arrival -> first token at the router
//                                                 (the one place TTFT is measured)
//   pdserve_router_inter_token_latency_seconds    gap between consecutive tokens at the router
//   pdserve_router_e2e_latency_seconds            arrival -> last token
//   pdserve_router_queue_time_seconds             arrival -> job dispatched (parse, tokenize,
//                                                 route)
//   pdserve_router_running_requests               first token received, not finished
//   pdserve_router_waiting_requests               dispatched, no first token yet
//   pdserve_router_prompt_tokens_total            prompt tokens of dispatched requests
//   pdserve_router_generation_tokens_total        tokens streamed to clients
//   pdserve_router_workers{role,state}            registered workers (state ready|draining)
//   pdserve_router_worker_removals_total{role,reason}  timeout | deregister | replaced
//   pdserve_router_worker_kv_blocks{role,worker,state}  last heartbeat's free/used blocks
//   pdserve_router_control_errors_total           control messages dropped as malformed
//   pdserve_router_stale_token_events_total       token events dropped because their worker
//                                                 holds no job of the request (late output of a
//                                                 worker the request moved away from, or of an
//                                                 ended request): never reach a client
//   pdserve_router_decode_local_prefills_total    disaggregated requests whose decode worker
//                                                 held most of the prompt and computed the rest
//                                                 itself (docs/router.md "Decode-side hits")
//   pdserve_router_prefix_pulls_total{outcome}     prefill jobs sent with a pull of another
//                                                 worker's cached prefix (planned), and pulls that
//                                                 could not be served (failed: the prompt was
//                                                 computed) (docs/prefix-cache.md "Pulls")
//   pdserve_router_placements_total{role,worker,dp_rank}  jobs the router placed on each worker
//                                                 (every DP rank of an instance is a worker;
//                                                 dp_rank 0 for one-process workers)
//   pdserve_router_request_api_malformed_total    ZeroMQ request API messages refused as
//                                                 malformed or of a wrong kind
//   pdserve_router_migrations_total{role,outcome}  requests whose attempt failed on a worker of
//                                                 `role`: migrated (a new attempt started), or
//                                                 failed: limit (router.max_migrations),
//                                                 no_worker, deadline
//   pdserve_router_prefix_predicted_hit_tokens_total  prompt tokens the router predicted the
//                                                 chosen worker's prefix cache holds (kv_index.h),
//   pdserve_router_prefix_actual_hit_tokens_total     and those its engine actually found, both
//                                                 counted when the worker that computed the
//                                                 prompt reports it (prefill's first token,
//                                                 colocated finish): equal while the index is
//                                                 exact; a gap means stale entries
//
// Thread-safety: prometheus-cpp metrics are thread-safe; UpdateWorkerKv is called from the
// control thread only.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <memory>
#include <string>
#include <string_view>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "services/control/control_messages.h"

namespace pdserve::router {

enum class RequestOutcome { kOk, kClientError, kRejected, kUnavailable, kTimeout, kCancelled, kError };
const char* RequestOutcomeName(RequestOutcome outcome);

class RouterMetrics {
 public:
  explicit RouterMetrics(std::shared_ptr<prometheus::Registry> registry);

  prometheus::Registry& registry() { return *registry_; }

  void CountRequest(RequestOutcome outcome);
  void CountRemoval(services::WorkerRole role, const std::string& reason);
  void CountMigration(services::WorkerRole role, std::string_view outcome);
  void SetWorkers(services::WorkerRole role, size_t ready, size_t draining);
  // Sets (free, used) for a worker; Forget removes its series when it leaves.
  void UpdateWorkerKv(services::WorkerRole role, const std::string& worker, int64_t free, int64_t total);
  void ForgetWorker(const std::string& worker);
  // One job placed on `worker` (nullopt rank: the router did not pin a DP rank).
  void CountPlacement(services::WorkerRole role, const std::string& worker, uint32_t dp_rank);

  prometheus::Histogram& ttft;
  prometheus::Histogram& inter_token_latency;
  prometheus::Histogram& e2e_latency;
  prometheus::Histogram& queue_time;
  prometheus::Gauge& running;
  prometheus::Gauge& waiting;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generation_tokens;
  prometheus::Counter& control_errors;
  prometheus::Counter& stale_token_events;
  prometheus::Counter& request_api_malformed;
  prometheus::Counter& prefix_predicted_hit_tokens;
  prometheus::Counter& prefix_actual_hit_tokens;
  prometheus::Counter& decode_local_prefills;
  prometheus::Counter& prefix_pulls_planned;
  prometheus::Counter& prefix_pulls_failed;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& removals_;
  prometheus::Family<prometheus::Counter>& migrations_;
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Gauge>& kv_blocks_;
  prometheus::Family<prometheus::Counter>& placements_;
  std::mutex mu_;  // kv_series_
  std::map<std::string, std::pair<prometheus::Gauge*, prometheus::Gauge*>> kv_series_;  // worker -> free, used
};

}  // namespace pdserve::router
