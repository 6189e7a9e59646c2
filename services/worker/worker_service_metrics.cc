#include "services/worker/worker_service_metrics.h"

namespace pdserve::services::worker {
namespace {
prometheus::Labels Constant(WorkerRole role, const std::string& worker_id) {
  return {{"role", WorkerRoleName(role)}, {"worker", worker_id}};
}
}  // namespace

ServiceMetrics::ServiceMetrics(prometheus::Registry& registry, WorkerRole role, const std::string& worker_id)
    : transfers_family_(prometheus::BuildCounter()
                            .Name("pdserve_worker_kv_transfers_total")
                            .Help("KV transfers by outcome (prefill: written and verified; decode: received)")
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
                                                                         0.05, 0.1, 0.2, 0.5, 1, 2, 5})) {}

void ServiceMetrics::Refresh(const engine::EngineStats& s, uint32_t quarantined) {
  if (s.steps > last_steps_) steps.Increment(static_cast<double>(s.steps - last_steps_));
  if (s.preemptions > last_preemptions_) preemptions.Increment(static_cast<double>(s.preemptions - last_preemptions_));
  last_steps_ = s.steps;
  last_preemptions_ = s.preemptions;
  held_blocks.Set(static_cast<double>(s.blocks_held));
  awaiting_kv.Set(static_cast<double>(s.awaiting_kv));
  quarantined_blocks.Set(quarantined);
}

}  // namespace pdserve::services::worker
