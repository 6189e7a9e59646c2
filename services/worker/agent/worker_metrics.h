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
//   pdserve_worker_kv_event_hashes_total{kind}     prefix-cache block hashes sent to the router
//                                                  in kvEvents (kind stored | removed)
//   pdserve_worker_kv_event_resets_total           kvEvents sent with the whole set (after each
//                                                  registration, and after a backlog overflow)
//
// EngineWorkerMetrics: the series only engine-backed workers have, on the same registry and
// constant labels (created by EngineHost):
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
//   pdserve_prefix_cache_lookup_tokens_total     prompt tokens looked up in the prefix cache
//   pdserve_prefix_cache_hit_tokens_total        ... found cached (their KV not computed)
//   pdserve_prefix_cache_computed_tokens_total   ... left to compute
//   pdserve_prefix_cache_blocks                  KV blocks registered in the cache (in use or idle)
//   pdserve_prefix_cache_evictions_total         cached blocks evicted to make room
//                                                (docs/prefix-cache.md)
//   pdserve_prefix_cache_pulled_tokens_total     tokens of blocks pulled from another worker and
//                                                adopted into this cache (docs/prefix-cache.md "Pulls")
//   pdserve_prefix_cache_pushed_tokens_total     tokens of cached blocks this worker wrote for pulls
//   pdserve_worker_kv_pulls_total{outcome}       pulls this worker asked for: adopted | failed
//                                                (a failed pull costs a recompute)
//   pdserve_worker_kv_pushes_total{outcome}      pulls this worker served: ok | failed
//   pdserve_prefix_cache_tier_blocks             disk tier: block files held
//   pdserve_prefix_cache_tier_bytes              ... and their bytes
//   pdserve_prefix_cache_tier_stored_blocks_total  ... blocks written (evicted blocks kept)
//   pdserve_prefix_cache_tier_stored_bytes_total   ... bytes written
//   pdserve_prefix_cache_tier_restored_tokens_total  ... tokens of blocks read back on a hit
//   pdserve_prefix_cache_tier_evictions_total    ... files its LRU deleted to stay in bounds
//   pdserve_prefix_cache_tier_corrupt_files_total  ... damaged files found and deleted
//
// Thread-safety: prometheus-cpp metrics are thread-safe; EngineWorkerMetrics::Refresh is
// called by one thread at a time (the agent's heartbeat).
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
  prometheus::Family<prometheus::Counter>& kv_events_family_;

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
  prometheus::Counter& kv_event_stored;
  prometheus::Counter& kv_event_removed;
  prometheus::Counter& kv_event_resets;

  void SetLoad(const WorkerLoad& load);

 private:
  WorkerMetrics(prometheus::Registry& registry, const prometheus::Labels& constant_labels);
};

// The engine snapshot Refresh needs (engine::EngineStats' cumulative and current figures).
struct EngineLoadSnapshot {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t blocks_held = 0;
  int64_t awaiting_kv = 0;
  uint32_t quarantined_blocks = 0;
  int64_t prefix_lookup_tokens = 0, prefix_hit_tokens = 0, prefix_computed_tokens = 0;
  int64_t prefix_cached_blocks = 0, prefix_evictions = 0;
  int64_t prefix_pulled_tokens = 0, prefix_pushed_tokens = 0;
  int64_t tier_blocks = 0, tier_bytes = 0, tier_stored_blocks = 0, tier_stored_bytes = 0;
  int64_t tier_restored_tokens = 0, tier_evictions = 0, tier_corrupt_files = 0;
};

class EngineWorkerMetrics {
  prometheus::Family<prometheus::Counter>& transfers_family_;
  prometheus::Family<prometheus::Counter>& pulls_family_;
  prometheus::Family<prometheus::Counter>& pushes_family_;

 public:
  EngineWorkerMetrics(prometheus::Registry& registry, WorkerRole role, const std::string& worker_id);

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
  prometheus::Counter& prefix_lookup_tokens;
  prometheus::Counter& prefix_hit_tokens;
  prometheus::Counter& prefix_computed_tokens;
  prometheus::Gauge& prefix_cached_blocks;
  prometheus::Counter& prefix_evictions;
  prometheus::Counter& prefix_pulled_tokens;
  prometheus::Counter& prefix_pushed_tokens;
  prometheus::Counter& pulls_adopted;
  prometheus::Counter& pulls_failed;
  prometheus::Counter& pushes_ok;
  prometheus::Counter& pushes_failed;
  prometheus::Gauge& tier_blocks;
  prometheus::Gauge& tier_bytes;
  prometheus::Counter& tier_stored_blocks;
  prometheus::Counter& tier_stored_bytes;
  prometheus::Counter& tier_restored_tokens;
  prometheus::Counter& tier_evictions;
  prometheus::Counter& tier_corrupt_files;

  // Counters advance by the growth of the engine's cumulative figures since the last call.
  void Refresh(const EngineLoadSnapshot& snapshot);

 private:
  EngineLoadSnapshot last_;
};

}  // namespace pdserve::services
