#include "services/worker/agent/worker_metrics.h"

#include "services/common/metrics.h"

namespace pdserve::services {

namespace {
using prometheus::Labels;

prometheus::Family<prometheus::Counter>& Counter(prometheus::Registry& r, const char* name, const char* help,
                                                  const Labels& labels) {
  return prometheus::BuildCounter().Name(name).Help(help).Labels(labels).Register(r);
}
prometheus::Family<prometheus::Gauge>& Gauge(prometheus::Registry& r, const char* name, const char* help,
                                              const Labels& labels) {
  return prometheus::BuildGauge().Name(name).Help(help).Labels(labels).Register(r);
}
}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& r, WorkerRole role, const std::string& worker_id)
    : WorkerMetrics(r, Labels{{"role", WorkerRoleName(role)}, {"worker", worker_id}}) {}

WorkerMetrics::WorkerMetrics(prometheus::Registry& r, const prometheus::Labels& l)
    : jobs_family_(Counter(r, "pdserve_worker_jobs_total", "Jobs by outcome", l)),
      kv_family_(Gauge(r, "pdserve_worker_kv_blocks", "KV cache blocks by state", l)),
      kv_events_family_(Counter(r, "pdserve_worker_kv_event_hashes_total",
                                "Prefix-cache block hashes sent to the router in KV events", l)),
      jobs_finished(jobs_family_.Add({{"outcome", "finished"}})),
      jobs_aborted(jobs_family_.Add({{"outcome", "aborted"}})),
      jobs_failed(jobs_family_.Add({{"outcome", "error"}})),
      jobs_rejected(jobs_family_.Add({{"outcome", "rejected"}})),
      registrations(Counter(r, "pdserve_worker_registrations_total", "Successful registrations with a router", l).Add({})),
      router_lost(Counter(r, "pdserve_worker_router_lost_total", "Router silences or restarts noticed", l).Add({})),
      prompt_tokens(Counter(r, "pdserve_worker_prompt_tokens_total", "Prompt tokens accepted in jobs", l).Add({})),
      generated_tokens(Counter(r, "pdserve_worker_generated_tokens_total", "Tokens sent in token events", l).Add({})),
      running(Gauge(r, "pdserve_worker_running_requests", "Requests in the running batch", l).Add({})),
      waiting(Gauge(r, "pdserve_worker_waiting_requests", "Requests queued, not yet scheduled", l).Add({})),
      queued_tokens(Gauge(r, "pdserve_worker_queued_tokens", "Prompt tokens to compute plus output tokens owed", l).Add({})),
      kv_blocks_used(kv_family_.Add({{"state", "used"}})),
      kv_blocks_free(kv_family_.Add({{"state", "free"}})),
      registered(Gauge(r, "pdserve_worker_registered", "1 while registered with a router", l).Add({})),
      queue_time(prometheus::BuildHistogram()
                     .Name("pdserve_worker_queue_time_seconds")
                     .Help("Job arrival to first scheduled step")
                     .Labels(l)
                     .Register(r)
                     .Add({}, RequestLatencyBuckets())),
      kv_transfer_bytes(Counter(r, "pdserve_worker_kv_transfer_bytes_total", "KV bytes moved by the transfer layer", l).Add({})),
      kv_transfer_seconds(prometheus::BuildHistogram()
                              .Name("pdserve_worker_kv_transfer_seconds")
                              .Help("KV reservation to transfer complete, per request")
                              .Labels(l)
                              .Register(r)
                              .Add({}, RequestLatencyBuckets())),
      kv_transfer_failures(
          Counter(r, "pdserve_worker_kv_transfer_failures_total", "KV transfers that failed or timed out", l).Add({})),
      kv_event_stored(kv_events_family_.Add({{"kind", "stored"}})),
      kv_event_removed(kv_events_family_.Add({{"kind", "removed"}})),
      kv_event_resets(Counter(r, "pdserve_worker_kv_event_resets_total",
                              "KV events sent with the whole set of cached block hashes", l).Add({})) {}

void WorkerMetrics::SetLoad(const WorkerLoad& load) {
  running.Set(load.running);
  waiting.Set(load.waiting);
  queued_tokens.Set(static_cast<double>(load.queued_tokens));
  kv_blocks_free.Set(load.kv_blocks_free);
  kv_blocks_used.Set(load.kv_blocks_total >= load.kv_blocks_free ? load.kv_blocks_total - load.kv_blocks_free : 0);
}

namespace {
prometheus::Labels Constant(WorkerRole role, const std::string& worker_id) {
  return {{"role", WorkerRoleName(role)}, {"worker", worker_id}};
}
}  // namespace

EngineWorkerMetrics::EngineWorkerMetrics(prometheus::Registry& registry, WorkerRole role, const std::string& worker_id)
    : transfers_family_(prometheus::BuildCounter()
                            .Name("pdserve_worker_kv_transfers_total")
                            .Help("KV transfers by outcome (prefill: written and verified; decode: received)")
                            .Labels(Constant(role, worker_id))
                            .Register(registry)),
      pulls_family_(prometheus::BuildCounter()
                        .Name("pdserve_worker_kv_pulls_total")
                        .Help("Prefix pulls this worker asked another worker for, by outcome (adopted | failed)")
                        .Labels(Constant(role, worker_id))
                        .Register(registry)),
      pushes_family_(prometheus::BuildCounter()
                         .Name("pdserve_worker_kv_pushes_total")
                         .Help("Prefix pulls this worker served by writing its cached blocks, by outcome (ok | failed)")
                         .Labels(Constant(role, worker_id))
                         .Register(registry)),
      steps(prometheus::BuildCounter()
                .Name("pdserve_worker_engine_steps_total")
                .Help("Engine steps run")
                .Labels(Constant(role, worker_id))
                .Register(registry)
                .Add({})),
      preemptions(prometheus::BuildCounter()
                      .Name("pdserve_worker_engine_preemptions_total")
                      .Help("Requests preempted for KV blocks")
                      .Labels(Constant(role, worker_id))
                      .Register(registry)
                      .Add({})),
      held_blocks(prometheus::BuildGauge()
                      .Name("pdserve_worker_engine_held_kv_blocks")
                      .Help("KV blocks held for a transfer (prefill)")
                      .Labels(Constant(role, worker_id))
                      .Register(registry)
                      .Add({})),
      awaiting_kv(prometheus::BuildGauge()
                      .Name("pdserve_worker_engine_awaiting_kv_requests")
                      .Help("Reservations waiting for their KV (decode)")
                      .Labels(Constant(role, worker_id))
                      .Register(registry)
                      .Add({})),
      quarantined_blocks(prometheus::BuildGauge()
                             .Name("pdserve_worker_kv_quarantined_blocks")
                             .Help("KV blocks of aborted transfers not yet reusable (decode)")
                             .Labels(Constant(role, worker_id))
                             .Register(registry)
                             .Add({})),
      transfers_ok(transfers_family_.Add({{"outcome", "ok"}})),
      transfers_failed(transfers_family_.Add({{"outcome", "failed"}})),
      layers_streamed(prometheus::BuildCounter()
                          .Name("pdserve_worker_kv_layers_streamed_total")
                          .Help("Layers whose KV writes were queued during the prompt's forward (prefill)")
                          .Labels(Constant(role, worker_id))
                          .Register(registry)
                          .Add({})),
      stream_landed_bytes(prometheus::BuildCounter()
                              .Name("pdserve_worker_kv_stream_landed_bytes_total")
                              .Help("KV bytes written to the decode worker before the prompt's forward ended (prefill)")
                              .Labels(Constant(role, worker_id))
                              .Register(registry)
                              .Add({})),
      transfer_tail(prometheus::BuildHistogram()
                        .Name("pdserve_worker_kv_transfer_tail_seconds")
                        .Help("First token sampled -> KV verified by the decode worker (prefill)")
                        .Labels(Constant(role, worker_id))
                        .Register(registry)
                        .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                                                         0.05, 0.1, 0.2, 0.5, 1, 2, 5})),
      prefix_lookup_tokens(prometheus::BuildCounter()
                               .Name("pdserve_prefix_cache_lookup_tokens_total")
                               .Help("Prompt tokens looked up in the prefix cache")
                               .Labels(Constant(role, worker_id))
                               .Register(registry)
                               .Add({})),
      prefix_hit_tokens(prometheus::BuildCounter()
                            .Name("pdserve_prefix_cache_hit_tokens_total")
                            .Help("Prompt tokens whose KV the prefix cache supplied")
                            .Labels(Constant(role, worker_id))
                            .Register(registry)
                            .Add({})),
      prefix_computed_tokens(prometheus::BuildCounter()
                                 .Name("pdserve_prefix_cache_computed_tokens_total")
                                 .Help("Looked-up prompt tokens the prefix cache did not have (computed)")
                                 .Labels(Constant(role, worker_id))
                                 .Register(registry)
                                 .Add({})),
      prefix_cached_blocks(prometheus::BuildGauge()
                               .Name("pdserve_prefix_cache_blocks")
                               .Help("KV blocks registered in the prefix cache (in use or idle)")
                               .Labels(Constant(role, worker_id))
                               .Register(registry)
                               .Add({})),
      prefix_evictions(prometheus::BuildCounter()
                           .Name("pdserve_prefix_cache_evictions_total")
                           .Help("Cached KV blocks evicted to make room")
                           .Labels(Constant(role, worker_id))
                           .Register(registry)
                           .Add({})),
      prefix_pulled_tokens(prometheus::BuildCounter()
                               .Name("pdserve_prefix_cache_pulled_tokens_total")
                               .Help("Tokens of KV blocks pulled from another worker into this prefix cache")
                               .Labels(Constant(role, worker_id))
                               .Register(registry)
                               .Add({})),
      prefix_pushed_tokens(prometheus::BuildCounter()
                               .Name("pdserve_prefix_cache_pushed_tokens_total")
                               .Help("Tokens of cached KV blocks this worker wrote for another worker's pull")
                               .Labels(Constant(role, worker_id))
                               .Register(registry)
                               .Add({})),
      pulls_adopted(pulls_family_.Add({{"outcome", "adopted"}})),
      pulls_failed(pulls_family_.Add({{"outcome", "failed"}})),
      pushes_ok(pushes_family_.Add({{"outcome", "ok"}})),
      pushes_failed(pushes_family_.Add({{"outcome", "failed"}})),
      tier_blocks(prometheus::BuildGauge()
                  .Name("pdserve_prefix_cache_tier_blocks")
                  .Help("KV block files held by the prefix cache disk tier")
                  .Labels(Constant(role, worker_id))
                  .Register(registry)
                  .Add({})),
      tier_bytes(prometheus::BuildGauge()
                  .Name("pdserve_prefix_cache_tier_bytes")
                  .Help("Bytes of the prefix cache disk tier files")
                  .Labels(Constant(role, worker_id))
                  .Register(registry)
                  .Add({})),
      tier_stored_blocks(prometheus::BuildCounter()
                  .Name("pdserve_prefix_cache_tier_stored_blocks_total")
                  .Help("Evicted cached KV blocks written to the disk tier")
                  .Labels(Constant(role, worker_id))
                  .Register(registry)
                  .Add({})),
      tier_stored_bytes(prometheus::BuildCounter()
                  .Name("pdserve_prefix_cache_tier_stored_bytes_total")
                  .Help("Bytes written to the prefix cache disk tier")
                  .Labels(Constant(role, worker_id))
                  .Register(registry)
                  .Add({})),
      tier_restored_tokens(prometheus::BuildCounter()
                  .Name("pdserve_prefix_cache_tier_restored_tokens_total")
                  .Help("Tokens of cached KV blocks read back from the disk tier")
                  .Labels(Constant(role, worker_id))
                  .Register(registry)
                  .Add({})),
      tier_evictions(prometheus::BuildCounter()
                  .Name("pdserve_prefix_cache_tier_evictions_total")
                  .Help("Disk tier files deleted to stay within its bound")
                  .Labels(Constant(role, worker_id))
                  .Register(registry)
                  .Add({})),
      tier_corrupt_files(prometheus::BuildCounter()
                  .Name("pdserve_prefix_cache_tier_corrupt_files_total")
                  .Help("Damaged disk tier files found and deleted (their KV recomputed)")
                  .Labels(Constant(role, worker_id))
                  .Register(registry)
                  .Add({})) {}

void EngineWorkerMetrics::Refresh(const EngineLoadSnapshot& s) {
  auto advance = [](prometheus::Counter& c, int64_t now, int64_t last) {
    if (now > last) c.Increment(static_cast<double>(now - last));
  };
  advance(steps, s.steps, last_.steps);
  advance(preemptions, s.preemptions, last_.preemptions);
  advance(prefix_lookup_tokens, s.prefix_lookup_tokens, last_.prefix_lookup_tokens);
  advance(prefix_hit_tokens, s.prefix_hit_tokens, last_.prefix_hit_tokens);
  advance(prefix_computed_tokens, s.prefix_computed_tokens, last_.prefix_computed_tokens);
  advance(prefix_evictions, s.prefix_evictions, last_.prefix_evictions);
  advance(prefix_pulled_tokens, s.prefix_pulled_tokens, last_.prefix_pulled_tokens);
  advance(prefix_pushed_tokens, s.prefix_pushed_tokens, last_.prefix_pushed_tokens);
  advance(tier_stored_blocks, s.tier_stored_blocks, last_.tier_stored_blocks);
  advance(tier_stored_bytes, s.tier_stored_bytes, last_.tier_stored_bytes);
  advance(tier_restored_tokens, s.tier_restored_tokens, last_.tier_restored_tokens);
  advance(tier_evictions, s.tier_evictions, last_.tier_evictions);
  advance(tier_corrupt_files, s.tier_corrupt_files, last_.tier_corrupt_files);
  last_ = s;
  prefix_cached_blocks.Set(static_cast<double>(s.prefix_cached_blocks));
  tier_blocks.Set(static_cast<double>(s.tier_blocks));
  tier_bytes.Set(static_cast<double>(s.tier_bytes));
  held_blocks.Set(static_cast<double>(s.blocks_held));
  awaiting_kv.Set(static_cast<double>(s.awaiting_kv));
  quarantined_blocks.Set(s.quarantined_blocks);
}

}  // namespace pdserve::services
