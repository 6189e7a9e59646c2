// ServiceMetrics: the metrics of the engine-backed worker services beyond the common
// WorkerMetrics (services/worker/agent/worker_metrics.h, owned by the WorkerAgent, which these
// services also feed: queue time, KV transfer bytes / seconds / failures). Defined here and
// nowhere else; constant labels role and worker as in WorkerMetrics.
//
//   pdserve_worker_engine_steps_total            engine steps run
//   pdserve_worker_engine_preemptions_total      requests preempted for KV blocks
//   pdserve_worker_engine_held_kv_blocks         prefill: blocks held for a KV transfer
//   pdserve_worker_engine_awaiting_kv_requests   decode: reservations waiting for their KV
//   pdserve_worker_kv_quarantined_blocks         decode: blocks of aborted transfers not yet
//                                                reusable (a writer may still write)
//   pdserve_worker_kv_transfers_total{outcome}   transfers by outcome (ok | failed)
//   pdserve_worker_kv_layers_streamed_total      prefill: layers whose KV writes were queued
//                                                during the prompt's forward (layer streaming)
//   pdserve_worker_kv_stream_landed_bytes_total  prefill: KV bytes already written to the
//                                                decode worker when the forward ended
//   pdserve_worker_kv_transfer_tail_seconds      prefill: first token sampled -> KV verified by
//                                                the decode side (what the transfer adds to TTFT)
//
// Thread-safety: prometheus-cpp metrics are thread-safe; Refresh is called by one thread at a
// time (the agent's heartbeat).
#pragma once

#include <cstdint>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "engine/engine.h"
#include "services/control/control_messages.h"

namespace pdserve::services::worker {

class ServiceMetrics {
  prometheus::Family<prometheus::Counter>& transfers_family_;

 public:
  ServiceMetrics(prometheus::Registry& registry, WorkerRole role, const std::string& worker_id);

  prometheus::Counter& steps;
  prometheus::Counter& preemptions;
  prometheus::Gauge& held_blocks;
  prometheus::Gauge& awaiting_kv;
  prometheus::Gauge& quarantined_blocks;
  prometheus::Counter& transfers_ok;
  prometheus::Counter& transfers_failed;
  prometheus::Counter& layers_streamed;
  prometheus::Counter& stream_landed_bytes;
  prometheus::Histogram& transfer_tail;

  // Counters advance by the growth of the engine's cumulative stats since the last call.
  void Refresh(const engine::EngineStats& stats, uint32_t quarantined);

 private:
  int64_t last_steps_ = 0, last_preemptions_ = 0;
};

}  // namespace pdserve::services::worker
