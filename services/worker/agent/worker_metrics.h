// WorkerMetrics: every metric a worker process exports (all worker roles share them), defined
// here and nowhere else. Constant labels role="prefill|decode|colocated" and worker="<id>" on
// every series, so one Prometheus query spans all workers of a role.
//
//   pdserve_worker_jobs_total{outcome}             jobs by how they ended: finished, stopped by
//                                                  abort (aborted), failed (error), refused at
//                                                  start (rejected)
//   pdserve_worker_registrations_total             successful registrations with a router
//   pdserve_worker_router_lost_total               router silences / restarts noticed
//   pdserve_worker_prompt_tokens_total             prompt tokens accepted in jobs
//   pdserve_worker_generated_tokens_total          tokens sent in token events
//   pdserve_worker_running_requests                gauges from the handler's load, refreshed
//   pdserve_worker_waiting_requests                every heartbeat
//   pdserve_worker_queued_tokens
//   pdserve_worker_kv_blocks{state=used|free}
//   pdserve_worker_registered                      1 while registered with a router
//   pdserve_worker_queue_time_seconds              job arrival -> first scheduled (engine)
//   pdserve_worker_kv_transfer_bytes_total         KV bytes written (prefill) / received
//                                                  (decode) by the KV transfer layer
//   pdserve_worker_kv_transfer_seconds             reservation -> transfer complete, per request
//   pdserve_worker_kv_transfer_failures_total      transfers that failed or timed out
// The last four are fed by the engine-backed services (the echo test worker leaves them 0).
//
// Thread-safety: prometheus-cpp metrics are thread-safe.
#pragma once

#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "services/control/control_messages.h"

namespace pdserve::services {

class WorkerMetrics {
  // Families first: members are initialized in declaration order and each family is
  // registered once.
  prometheus::Family<prometheus::Counter>& jobs_family_;
  prometheus::Family<prometheus::Gauge>& kv_family_;

 public:
  WorkerMetrics(prometheus::Registry& registry, WorkerRole role, const std::string& worker_id);

  prometheus::Counter& jobs_finished;
  prometheus::Counter& jobs_aborted;
  prometheus::Counter& jobs_failed;
  prometheus::Counter& jobs_rejected;
  prometheus::Counter& registrations;
  prometheus::Counter& router_lost;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generated_tokens;
  prometheus::Gauge& running;
  prometheus::Gauge& waiting;
  prometheus::Gauge& queued_tokens;
  prometheus::Gauge& kv_blocks_used;
  prometheus::Gauge& kv_blocks_free;
  prometheus::Gauge& registered;
  prometheus::Histogram& queue_time;
  prometheus::Counter& kv_transfer_bytes;
  prometheus::Histogram& kv_transfer_seconds;
  prometheus::Counter& kv_transfer_failures;

  void SetLoad(const WorkerLoad& load);

 private:
  WorkerMetrics(prometheus::Registry& registry, const prometheus::Labels& constant_labels);
};

}  // namespace pdserve::services
