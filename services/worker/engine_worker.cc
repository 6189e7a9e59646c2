// EngineWorker: construction, the colocated role, events and load (engine_worker.h). The decode
// and prefill halves are in engine_worker_decode.cc and engine_worker_prefill.cc.
#include "services/worker/engine_worker.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "common/logging.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "model/fingerprint.h"
#include "services/common/process_util.h"
#include "services/common/request_log.h"
#include "services/worker/import_allocator.h"
#include "services/worker/model_instance.h"

namespace pdserve::services::worker {

Result<kvtransfer::KvLayout> ToTransferLayout(const engine::KvLayout& l) {
  kvtransfer::KvLayout t;
  t.num_layers = static_cast<uint32_t>(l.num_layers);
  t.kv_lora_rank = static_cast<uint32_t>(l.latent_dim);
  t.qk_rope_head_dim = static_cast<uint32_t>(l.rope_dim);
  t.index_head_dim = static_cast<uint32_t>(l.index_dim);
  t.tokens_per_block = static_cast<uint32_t>(l.block_tokens);
  switch (l.latent_format) {
    case model::KvLatentFormat::kFp8Blockwise: t.latent_format = kvtransfer::LatentFormat::kFp8Blockwise; break;
    case model::KvLatentFormat::kBf16: t.latent_format = kvtransfer::LatentFormat::kBf16; break;
    case model::KvLatentFormat::kInt8PerToken: t.latent_format = kvtransfer::LatentFormat::kInt8PerToken; break;
  }
  t.indexer_format = l.index_format == model::KvIndexFormat::kInt8 ? kvtransfer::IndexerFormat::kInt8
                                                                    : kvtransfer::IndexerFormat::kFp8;
  PDSERVE_RETURN_IF_ERROR(t.Validate());
  // The two descriptions must agree byte for byte; a block size is the cheapest full check.
  if (static_cast<int64_t>(t.BlockBytes()) != l.BlockBytes() ||
      static_cast<int64_t>(t.TokenBytesPerLayer()) != l.TokenBytesPerLayer())
    return Status::InvalidArgument("engine layout " + l.ToString() + " and transfer layout " + t.ToString() +
                                   " disagree");
  return t;
}

uint64_t CompatibilityHash(const std::string& config_json, uint64_t weights_fingerprint, const std::string& model_name,
                           const engine::KvLayout& layout) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64: stable across processes and builds
  auto mix = [&h](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  };
  mix(config_json);
  mix(std::string_view(reinterpret_cast<const char*>(&weights_fingerprint), sizeof(weights_fingerprint)));
  mix(model_name);
  mix(layout.ToString());
  return h == 0 ? 1 : h;
}

EngineWorker::EngineWorker(const WorkerServiceConfig& config, std::shared_ptr<prometheus::Registry> registry,
                           ModelInstance* instance)
    : config_(config), instance_(instance), registry_(std::move(registry)) {}

Result<std::unique_ptr<EngineWorker>> EngineWorker::Create(const WorkerServiceConfig& config,
                                                           std::shared_ptr<prometheus::Registry> registry,
                                                           ModelInstance* instance) {
  std::unique_ptr<EngineWorker> w(new EngineWorker(config, std::move(registry), instance));
  PDSERVE_RETURN_IF_ERROR(w->Init());
  return w;
}

Status EngineWorker::Init() {
  if (registry_) metrics_ = std::make_unique<ServiceMetrics>(*registry_, config_.role, config_.worker_id);
  PDSERVE_ASSIGN_OR_RETURN(std::string config_json, ReadFile(config_.model_dir + "/config.json"));
  engine::EngineOptions eo;
  eo.group = instance_->group();
  eo.kv_cache_gib = config_.kv_cache_gib;
  eo.block_tokens = config_.block_tokens;
  if (config_.max_seqs > 0) eo.scheduler.max_num_seqs = config_.max_seqs;
  eo.test_fail_export_at_layer = config_.test_fail_prefill_at_layer;
  if (config_.role != WorkerRole::kColocated) {
    kvtransfer::UcxTransportOptions to;
    to.context.tls = config_.ucx_tls;
    to.context.net_devices = config_.ucx_net_devices;
    PDSERVE_ASSIGN_OR_RETURN(auto transport, kvtransfer::UcxTransport::Create(to));
    transport_ = std::move(transport);
  }
  if (config_.role == WorkerRole::kDecode) {
    // The whole pool is one region registered once with the transport (allocated by it, so
    // shared-memory peers can map it); the engine builds its block pool over it.
    const uint64_t bytes = static_cast<uint64_t>(config_.kv_cache_gib * (1ull << 30)) / 4096 * 4096;
    PDSERVE_ASSIGN_OR_RETURN(region_, transport_->AllocateRegion(bytes));
    if (reinterpret_cast<uintptr_t>(region_->data()) % 4096 != 0)
      return Status::Internal("the transport's KV region is not 4 KiB aligned");
    eo.kv_memory = region_->data();
    eo.kv_memory_bytes = static_cast<int64_t>(region_->size());
  }
  PDSERVE_ASSIGN_OR_RETURN(engine_, engine::Engine::Create(eo, &instance_->model()));
  const engine::KvLayout& layout = engine_->pool().layout();
  // The weights themselves, not only config.json: a prefill and a decode worker with the same
  // config but other weights must not pair (model/fingerprint.h).
  PDSERVE_ASSIGN_OR_RETURN(const uint64_t fingerprint, model::WeightsFingerprint(config_.model_dir));
  compat_hash_ = CompatibilityHash(config_json, fingerprint, config_.model_name, layout);
  PDSERVE_ASSIGN_OR_RETURN(transfer_layout_, ToTransferLayout(layout));
  if (config_.role == WorkerRole::kDecode) {
    allocator_ = std::make_unique<ImportAllocator>(&engine_->pool(),
                                                   [this](uint64_t request_id) { OnImportFreed(request_id); });
    kvtransfer::ReceiverBlockPool pool;
    pool.region = region_.get();
    pool.first_block_offset = static_cast<uint64_t>(engine_->pool().base() - region_->data());
    pool.layout = transfer_layout_;
    pool.allocator = allocator_.get();
    kvtransfer::KvReceiverOptions ro;
    ro.lease = config_.kv_lease;
    ro.transfer_timeout = config_.kv_transfer_timeout;
    PDSERVE_ASSIGN_OR_RETURN(receiver_, kvtransfer::KvReceiver::Create(transport_.get(), pool, ro));
    receiver_thread_ = std::jthread([this](std::stop_token st) { ReceiverLoop(st); });
  } else if (config_.role == WorkerRole::kPrefill) {
    kvtransfer::Transport* send_through = transport_.get();
    if (config_.test_tear_kv_writes > 0) {
      tearing_transport_ = std::make_unique<kvtransfer::testing::FaultTransport>(transport_.get());
      tearing_transport_->set_drop_writes(static_cast<int>(config_.test_tear_kv_writes));
      send_through = tearing_transport_.get();
      GetLogger("worker")->warn("TEST ONLY: the first {} KV write batches lose their last write",
                                config_.test_tear_kv_writes);
    }
    PDSERVE_ASSIGN_OR_RETURN(sender_, kvtransfer::KvSender::Create(send_through));
    transfer_thread_ = std::jthread([this](std::stop_token st) { TransferLoop(st); });
  }
  engine_->Start();
  GetLogger("worker")->info("{} worker {}: model {} ({}), KV {} blocks of {} tokens, compat hash {:016x}{}; {}",
                            WorkerRoleName(config_.role), config_.worker_id, config_.model_dir, layout.ToString(),
                            engine_->pool().n_blocks(), layout.block_tokens, compat_hash_,
                            transport_ ? ", KV transfer over UCX" : "", instance_->Describe());
  return Status::Ok();
}

EngineWorker::~EngineWorker() {
  SetAgent(nullptr);
  // Threads first (they use everything below); then stop the engine's loop and the sender
  // (it aborts its requests and returns once none of their writes, which read the engine's
  // pool, is in flight); then the engine (aborts what is left, freeing imported blocks), the
  // receiver (waits out quarantines), region, transport.
  transfer_thread_ = {};
  receiver_thread_ = {};
  if (engine_) engine_->Stop();
  sender_.reset();
  tearing_transport_.reset();
  engine_.reset();
  receiver_.reset();
  allocator_.reset();
  region_.reset();
  transport_.reset();
}

void EngineWorker::SetAgent(WorkerAgent* agent) {
  std::lock_guard<std::mutex> lock(agent_mu_);
  agent_ = agent;
}

std::string EngineWorker::transfer_address() const { return transport_ ? transport_->address() : std::string(); }

WorkerCapacity EngineWorker::Capacity() const {
  WorkerCapacity c;
  c.max_batch = static_cast<uint32_t>(config_.max_seqs > 0 ? config_.max_seqs : 64);
  c.kv_blocks_total = static_cast<uint32_t>(engine_->pool().n_blocks());
  c.kv_blocks_free = static_cast<uint32_t>(engine_->pool().n_free());
  c.block_tokens = static_cast<uint32_t>(engine_->pool().layout().block_tokens);
  c.max_context_tokens = static_cast<uint32_t>(engine_->max_sequence_length());
  c.dp_ranks = static_cast<uint32_t>(instance_->dp_size());
  return c;
}

Status EngineWorker::Health() {
  if (config_.step_stall_timeout.count() == 0) return Status::Ok();
  const double stuck = engine_->CurrentStepSeconds();
  if (stuck * 1000 <= static_cast<double>(config_.step_stall_timeout.count())) return Status::Ok();
  return Status::Unavailable(fmt::format("the engine's step has run for {:.1f} s (step_stall_timeout_ms {})", stuck,
                                         config_.step_stall_timeout.count()));
}

WorkerLoad EngineWorker::CurrentLoad() {
  const engine::EngineStats s = engine_->Stats();
  WorkerLoad load;
  load.running = static_cast<uint32_t>(s.running + s.awaiting_kv);
  load.waiting = static_cast<uint32_t>(s.waiting);
  load.queued_tokens = static_cast<uint64_t>(s.queued_tokens);
  load.kv_blocks_free = static_cast<uint32_t>(s.blocks_free);
  load.kv_blocks_total = static_cast<uint32_t>(s.blocks_total);
  uint32_t quarantined = receiver_ ? receiver_->Stats().quarantined_blocks : 0;
  if (metrics_) metrics_->Refresh(s, quarantined);
  return load;
}

engine::SamplingParams EngineWorker::ToSampling(const SamplingSpec& spec) const {
  engine::SamplingParams p;
  p.temperature = spec.temperature;
  p.top_p = spec.top_p;
  p.top_k = spec.top_k;
  p.min_p = spec.min_p;
  p.repetition_penalty = spec.repetition_penalty;
  p.presence_penalty = spec.presence_penalty;
  p.frequency_penalty = spec.frequency_penalty;
  p.seed = spec.seed;
  p.max_tokens = static_cast<int32_t>(std::min<uint32_t>(spec.max_tokens, 1u << 30));
  p.stop_token_ids = spec.stop_token_ids;
  // Stop strings are matched by the router on the detokenized stream (it aborts the job);
  // the engine has no detokenizer here.
  if (spec.logprobs) p.logprobs = static_cast<int32_t>(std::min<uint32_t>(spec.top_logprobs, 20));
  p.resumed_output = static_cast<int32_t>(std::min<uint32_t>(spec.resumed_output, 1u << 30));
  return p;
}

WorkerMetrics* EngineWorker::AgentMetrics() {
  std::lock_guard<std::mutex> lock(agent_mu_);
  return agent_ ? agent_->metrics() : nullptr;
}

void EngineWorker::Send(TokenEventMsg ev) {
  std::lock_guard<std::mutex> lock(agent_mu_);
  if (agent_) agent_->SendTokenEvent(std::move(ev));
}

void EngineWorker::EndLocked(Job& job, FinishReason finish, const Status& error) {
  if (job.ended) return;
  job.ended = true;
  TokenEventMsg ev;
  ev.request_id = job.msg.request_id;
  ev.finish = finish;
  ev.error = error;
  ev.prompt_tokens = static_cast<uint32_t>(job.msg.prompt.size());
  if (!error.ok()) RequestLog("worker", job.msg.request_tag).Warn("job {} failed: {}", job.msg.request_id, error.ToString());
  Send(std::move(ev));
}

namespace {
FinishReason ToFinish(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kNone: return FinishReason::kNone;
    case engine::FinishReason::kStop: return FinishReason::kStop;
    case engine::FinishReason::kLength: return FinishReason::kLength;
    case engine::FinishReason::kAbort: return FinishReason::kAbort;
    case engine::FinishReason::kError: return FinishReason::kError;
  }
  return FinishReason::kError;
}
TokenLogprob ToLogprob(const engine::TokenEvent& ev) {
  TokenLogprob lp;
  lp.logprob = ev.logprob;
  for (const auto& [t, v] : ev.top_logprobs) lp.top.push_back({t, v});
  return lp;
}
}  // namespace

Status EngineWorker::StartJob(const JobMsg& job) {
  // Every DP rank of an instance registers on its own: a job for another rank was mis-routed
  // (or is stale), and running it here would mix two ranks' requests and caches.
  if (job.dp_rank != static_cast<uint32_t>(instance_->dp_rank()))
    return Status::InvalidArgument("job for DP rank " + std::to_string(job.dp_rank) + " reached " + config_.worker_id +
                                   ", DP rank " + std::to_string(instance_->dp_rank()) + " of " +
                                   std::to_string(instance_->dp_size()));
  switch (job.phase) {
    case JobPhase::kDecode:
      if (config_.role != WorkerRole::kDecode) break;
      return StartDecode(job);
    case JobPhase::kPrefill:
      if (config_.role != WorkerRole::kPrefill) break;
      return StartPrefill(job);
    case JobPhase::kColocated: {
      if (config_.role != WorkerRole::kColocated) break;
      const uint64_t rid = job.request_id;
      engine::RequestOptions ro;
      ro.sampling = ToSampling(job.sampling);
      ro.on_event = [this, rid](const engine::TokenEvent& ev) { OnEngineEvent(rid, ev); };
      std::lock_guard<std::mutex> lock(mu_);  // the first event must find the job
      PDSERVE_ASSIGN_OR_RETURN(engine::RequestId id, engine_->AddRequest(job.prompt, std::move(ro)));
      Job& j = jobs_[rid];
      j.msg = job;
      j.engine_id = id;
      return Status::Ok();
    }
  }
  return Status::InvalidArgument(std::string("a ") + WorkerRoleName(config_.role) + " worker does not run " +
                                 JobPhaseName(job.phase) + " jobs");
}

void EngineWorker::OnEngineEvent(uint64_t request_id, const engine::TokenEvent& ev) {
  if (ev.queue_seconds >= 0) {
    if (WorkerMetrics* wm = AgentMetrics()) wm->queue_time.Observe(ev.queue_seconds);
  }
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(request_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (job.msg.phase == JobPhase::kPrefill) {
    if (!ev.finished) return;  // max_tokens 1: the token comes with the finish
    PrefillSampled(job, ev);   // may erase the job
    return;
  }
  if (job.ended) {
    if (ev.finished) jobs_.erase(it);
    return;
  }
  TokenEventMsg msg;
  msg.request_id = request_id;
  // Decode: the prefill's token (CommitImport re-emits it) is output index 0, or resumed_output
  // for a migrated request; the router has it.
  const bool skip_token =
      job.msg.phase == JobPhase::kDecode && ev.index == static_cast<int64_t>(job.msg.sampling.resumed_output);
  if (ev.token >= 0 && !skip_token) {
    msg.first_index = static_cast<uint32_t>(ev.index);
    msg.tokens.push_back(ev.token);
    if (job.msg.sampling.logprobs) msg.logprobs.push_back(ToLogprob(ev));
  } else {
    msg.first_index = static_cast<uint32_t>(std::max<int64_t>(ev.index, 0));
  }
  if (ev.finished) {
    msg.finish = ToFinish(ev.reason);
    msg.error = ev.error;
    if (msg.finish == FinishReason::kError && msg.error.ok()) msg.error = Status::Internal("engine error");
    msg.prompt_tokens = static_cast<uint32_t>(ev.prompt_tokens);
    msg.completion_tokens = static_cast<uint32_t>(ev.output_tokens);
    msg.stop_string = ev.stop_string;
    job.ended = true;
    jobs_.erase(it);
  } else if (msg.tokens.empty()) {
    return;
  }
  lock.unlock();
  Send(std::move(msg));
}

void EngineWorker::AbortJob(uint64_t request_id, std::string_view reason) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(request_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  RequestLog("worker", job.msg.request_tag).Info("abort job {}: {}", request_id, reason);
  if (job.msg.phase == JobPhase::kColocated) {
    (void)engine_->Abort(job.engine_id);  // its abort event ends the job
    return;
  }
  if (job.msg.phase == JobPhase::kDecode) {
    AbortDecode(lock, job);
    return;
  }
  AbortPrefill(lock, job);
}

}  // namespace pdserve::services::worker
