#include "services/router/router_metrics.h"

#include "services/common/metrics.h"

namespace pdserve::router {

const char* RequestOutcomeName(RequestOutcome o) {
  switch (o) {
    case RequestOutcome::kOk: return "ok";
    case RequestOutcome::kClientError: return "client_error";
    case RequestOutcome::kRejected: return "rejected";
    case RequestOutcome::kUnavailable: return "unavailable";
    case RequestOutcome::kTimeout: return "timeout";
    case RequestOutcome::kCancelled: return "cancelled";
    case RequestOutcome::kError: return "error";
  }
  return "error";
}

namespace {
prometheus::Histogram& Hist(prometheus::Registry& r, const char* name, const char* help,
                            const prometheus::Histogram::BucketBoundaries& b) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, b);
}
}  // namespace

RouterMetrics::RouterMetrics(std::shared_ptr<prometheus::Registry> registry)
    : ttft(Hist(*registry, "pdserve_router_ttft_seconds", "Time to first token, measured at the router",
                services::RequestLatencyBuckets())),
      inter_token_latency(Hist(*registry, "pdserve_router_inter_token_latency_seconds",
                               "Gap between consecutive output tokens at the router", services::TokenLatencyBuckets())),
      e2e_latency(Hist(*registry, "pdserve_router_e2e_latency_seconds", "Request arrival to last token",
                       services::RequestLatencyBuckets())),
      queue_time(Hist(*registry, "pdserve_router_queue_time_seconds",
                      "Request arrival to job dispatch (parse, tokenize, route)", services::TokenLatencyBuckets())),
      running(prometheus::BuildGauge()
                  .Name("pdserve_router_running_requests")
                  .Help("Requests that have their first token and are not finished")
                  .Register(*registry)
                  .Add({})),
      waiting(prometheus::BuildGauge()
                  .Name("pdserve_router_waiting_requests")
                  .Help("Dispatched requests still waiting for their first token")
                  .Register(*registry)
                  .Add({})),
      prompt_tokens(prometheus::BuildCounter()
                        .Name("pdserve_router_prompt_tokens_total")
                        .Help("Prompt tokens of dispatched requests")
                        .Register(*registry)
                        .Add({})),
      generation_tokens(prometheus::BuildCounter()
                            .Name("pdserve_router_generation_tokens_total")
                            .Help("Output tokens streamed to clients")
                            .Register(*registry)
                            .Add({})),
      control_errors(prometheus::BuildCounter()
                         .Name("pdserve_router_control_errors_total")
                         .Help("Control-plane messages dropped as malformed")
                         .Register(*registry)
                         .Add({})),
      stale_token_events(prometheus::BuildCounter()
                             .Name("pdserve_router_stale_token_events_total")
                             .Help("Token events dropped: their worker holds no job of the request (it moved "
                                   "elsewhere or ended)")
                             .Register(*registry)
                             .Add({})),
      request_api_malformed(prometheus::BuildCounter()
                                .Name("pdserve_router_request_api_malformed_total")
                                .Help("ZeroMQ request API messages refused as malformed or of a wrong kind")
                                .Register(*registry)
                                .Add({})),
      prefix_predicted_hit_tokens(prometheus::BuildCounter()
                                      .Name("pdserve_router_prefix_predicted_hit_tokens_total")
                                      .Help("Prompt tokens predicted cached on the worker that computed the prompt")
                                      .Register(*registry)
                                      .Add({})),
      prefix_actual_hit_tokens(prometheus::BuildCounter()
                                   .Name("pdserve_router_prefix_actual_hit_tokens_total")
                                   .Help("Prompt tokens the computing worker's prefix cache supplied")
                                   .Register(*registry)
                                   .Add({})),
      decode_local_prefills(prometheus::BuildCounter()
                                .Name("pdserve_router_decode_local_prefills_total")
                                .Help("Disaggregated requests whose decode worker held most of the prompt in its "
                                      "prefix cache and computed the rest itself")
                                .Register(*registry)
                                .Add({})),
      prefix_pulls_planned(prometheus::BuildCounter()
                               .Name("pdserve_router_prefix_pulls_total")
                               .Help("Prefill jobs sent with a pull of another worker's cached prefix (planned), "
                                     "and pulls not served (failed: the prompt was computed)")
                               .Register(*registry)
                               .Add({{"outcome", "planned"}})),
      prefix_pulls_failed(prometheus::BuildCounter()
                              .Name("pdserve_router_prefix_pulls_total")
                              .Help("Prefill jobs sent with a pull of another worker's cached prefix (planned), "
                                    "and pulls not served (failed: the prompt was computed)")
                              .Register(*registry)
                              .Add({{"outcome", "failed"}})),
      registry_(registry),
      requests_(prometheus::BuildCounter()
                    .Name("pdserve_router_requests_total")
                    .Help("Finished requests by outcome")
                    .Register(*registry)),
      removals_(prometheus::BuildCounter()
                    .Name("pdserve_router_worker_removals_total")
                    .Help("Workers removed, by role and reason")
                    .Register(*registry)),
      migrations_(prometheus::BuildCounter()
                      .Name("pdserve_router_migrations_total")
                      .Help("Requests whose attempt failed on a worker, by its role and what followed")
                      .Register(*registry)),
      workers_(prometheus::BuildGauge()
                   .Name("pdserve_router_workers")
                   .Help("Registered workers by role and state")
                   .Register(*registry)),
      kv_blocks_(prometheus::BuildGauge()
                     .Name("pdserve_router_worker_kv_blocks")
                     .Help("KV blocks of each worker from its last heartbeat, by state")
                     .Register(*registry)),
      placements_(prometheus::BuildCounter()
                      .Name("pdserve_router_placements_total")
                      .Help("Jobs placed on each worker (and DP rank, when the router pins one)")
                      .Register(*registry)) {
  // Create every low-cardinality series up front so dashboards see zeros, not gaps.
  for (auto o : {RequestOutcome::kOk, RequestOutcome::kClientError, RequestOutcome::kRejected,
                 RequestOutcome::kUnavailable, RequestOutcome::kTimeout, RequestOutcome::kCancelled,
                 RequestOutcome::kError})
    requests_.Add({{"outcome", RequestOutcomeName(o)}});
  for (auto role : {services::WorkerRole::kPrefill, services::WorkerRole::kDecode, services::WorkerRole::kColocated}) {
    SetWorkers(role, 0, 0);
    migrations_.Add({{"role", services::WorkerRoleName(role)}, {"outcome", "migrated"}});
    for (const char* reason : {"timeout", "deregister", "replaced"})
      removals_.Add({{"role", services::WorkerRoleName(role)}, {"reason", reason}});
  }
}

void RouterMetrics::CountRequest(RequestOutcome outcome) {
  requests_.Add({{"outcome", RequestOutcomeName(outcome)}}).Increment();
}

void RouterMetrics::CountRemoval(services::WorkerRole role, const std::string& reason) {
  removals_.Add({{"role", services::WorkerRoleName(role)}, {"reason", reason}}).Increment();
}

void RouterMetrics::CountMigration(services::WorkerRole role, std::string_view outcome) {
  migrations_.Add({{"role", services::WorkerRoleName(role)}, {"outcome", std::string(outcome)}}).Increment();
}

void RouterMetrics::SetWorkers(services::WorkerRole role, size_t ready, size_t draining) {
  workers_.Add({{"role", services::WorkerRoleName(role)}, {"state", "ready"}}).Set(static_cast<double>(ready));
  workers_.Add({{"role", services::WorkerRoleName(role)}, {"state", "draining"}}).Set(static_cast<double>(draining));
}

void RouterMetrics::UpdateWorkerKv(services::WorkerRole role, const std::string& worker, int64_t free, int64_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kv_series_.find(worker);
  if (it == kv_series_.end()) {
    const std::string r = services::WorkerRoleName(role);
    auto* f = &kv_blocks_.Add({{"role", r}, {"worker", worker}, {"state", "free"}});
    auto* u = &kv_blocks_.Add({{"role", r}, {"worker", worker}, {"state", "used"}});
    it = kv_series_.emplace(worker, std::make_pair(f, u)).first;
  }
  it->second.first->Set(static_cast<double>(free));
  it->second.second->Set(static_cast<double>(total > free ? total - free : 0));
}

void RouterMetrics::ForgetWorker(const std::string& worker) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kv_series_.find(worker);
  if (it == kv_series_.end()) return;
  kv_blocks_.Remove(it->second.first);
  kv_blocks_.Remove(it->second.second);
  kv_series_.erase(it);
}

void RouterMetrics::CountPlacement(services::WorkerRole role, const std::string& worker, uint32_t dp_rank) {
  placements_
      .Add({{"role", services::WorkerRoleName(role)}, {"worker", worker}, {"dp_rank", std::to_string(dp_rank)}})
      .Increment();
}

}  // namespace pdserve::router
