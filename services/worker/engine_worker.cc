#include "services/worker/engine_worker.h"

#include "common/logging.h"
#include "services/worker/colocated_worker.h"
#include "services/worker/decode_worker.h"
#include "services/worker/model_instance.h"
#include "services/worker/prefill_worker.h"

namespace pdserve::services::worker {

Result<std::unique_ptr<EngineWorker>> EngineWorker::Create(const WorkerServiceConfig& config,
                                                           std::shared_ptr<prometheus::Registry> registry,
                                                           ModelInstance* instance, const WorkerHooks& hooks) {
  PDSERVE_ASSIGN_OR_RETURN(std::unique_ptr<EngineHost> host,
                           EngineHost::Create(config, std::move(registry), instance, hooks));
  EngineHost* h = host.get();
  std::unique_ptr<EngineWorker> worker;
  switch (config.role) {
    case WorkerRole::kColocated:
      worker = std::make_unique<ColocatedWorker>(std::move(host));
      h->engine().Start();
      break;
    case WorkerRole::kPrefill: {
      PDSERVE_ASSIGN_OR_RETURN(worker, PrefillWorker::Create(std::move(host), hooks));
      break;
    }
    case WorkerRole::kDecode: {
      PDSERVE_ASSIGN_OR_RETURN(worker, DecodeWorker::Create(std::move(host)));
      break;
    }
  }
  worker->kv_events_hook_ = hooks.kv_events;
  const KvLayout& layout = h->engine().pool().layout();
  GetLogger("worker")->info("{} worker {}: model {} ({}), KV {} blocks of {} tokens, compat hash {:016x}{}; {}; {}",
                            WorkerRoleName(config.role), config.worker_id, config.model_dir, layout.ToString(),
                            h->engine().pool().n_blocks(), layout.tokens_per_block, h->compat_hash(),
                            h->transport() ? ", KV transfer over UCX" : "", instance->Describe(),
                            instance->model().weights().PackedSummary());
  return worker;
}

KvEventsMsg TakeEngineKvEvents(engine::Engine* e, bool full) {
  engine::KvEventBatch batch = e->TakeKvEvents(full);
  KvEventsMsg m;
  m.reset = batch.reset;
  m.block_tokens = static_cast<uint32_t>(e->pool().layout().tokens_per_block);
  m.first_chunk_tokens = static_cast<uint32_t>(e->prefix_cache_first_chunk_tokens());
  m.stored = std::move(batch.stored);
  m.removed = std::move(batch.removed);
  return m;
}

std::optional<KvEventsMsg> EngineWorker::TakeKvEvents(bool full) {
  if (host_->kv_namespace() == 0) return std::nullopt;  // no prefix cache: nothing to publish
  KvEventsMsg m = TakeEngineKvEvents(&host_->engine(), full);
  if (m.reset && !full)
    GetLogger("worker")->info("worker {}: the KV event backlog overflowed; sending the whole set ({} blocks)",
                              host_->config().worker_id, m.stored.size());
  if (kv_events_hook_) kv_events_hook_(&m);
  return m;
}

}  // namespace pdserve::services::worker
