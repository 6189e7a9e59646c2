#include "services/worker/engine_host.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "common/mapped_file.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "model/fingerprint.h"
#include "services/common/request_log.h"
#include "services/worker/model_instance.h"

namespace pdserve::services::worker {

uint64_t CompatibilityHash(const std::string& config_json, uint64_t weights_fingerprint, const std::string& model_name,
                           const KvLayout& layout) {
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

EngineHost::EngineHost(const WorkerServiceConfig& config, std::shared_ptr<prometheus::Registry> registry,
                       ModelInstance* instance)
    : config_(config), instance_(instance), registry_(std::move(registry)) {}

Result<std::unique_ptr<EngineHost>> EngineHost::Create(const WorkerServiceConfig& config,
                                                       std::shared_ptr<prometheus::Registry> registry,
                                                       ModelInstance* instance, const WorkerHooks& hooks) {
  std::unique_ptr<EngineHost> h(new EngineHost(config, std::move(registry), instance));
  PDSERVE_RETURN_IF_ERROR(h->Init(hooks));
  return h;
}

Status EngineHost::Init(const WorkerHooks& hooks) {
  if (registry_) metrics_ = std::make_unique<EngineWorkerMetrics>(*registry_, config_.role, config_.worker_id);
  PDSERVE_ASSIGN_OR_RETURN(std::string config_json, ReadFileToString(config_.model_dir + "/config.json"));
  engine::EngineOptions eo;
  eo.group = instance_->group();
  eo.kv_cache_gib = config_.kv_cache_gib;
  eo.block_tokens = config_.block_tokens;
  if (config_.max_seqs > 0) eo.scheduler.max_num_seqs = config_.max_seqs;
  // The weights themselves, not only config.json: a prefill and a decode worker with the same
  // config but other weights must not pair (model/fingerprint.h), nor share cached KV.
  PDSERVE_ASSIGN_OR_RETURN(const uint64_t fingerprint, model::WeightsFingerprint(config_.model_dir));
  eo.prefix_cache = config_.prefix_cache;
  // One tier per engine: workers started with the same flags get their own directories.
  if (!config_.prefix_cache_disk_dir.empty()) {
    eo.prefix_cache_disk_dir = config_.prefix_cache_disk_dir + "/" + config_.worker_id;
    eo.prefix_cache_disk_bytes = static_cast<int64_t>(config_.prefix_cache_disk_gib * (1ull << 30));
  }
  eo.model_identity = CompatibilityHash(config_json, fingerprint, config_.model_name, KvLayout{});
  eo.layer_fault_hook = hooks.layer_fault;
  if (config_.role != WorkerRole::kColocated) {
    kvtransfer::UcxTransportOptions to;
    to.context.tls = config_.ucx_tls;
    to.context.net_devices = config_.ucx_net_devices;
    PDSERVE_ASSIGN_OR_RETURN(auto transport, kvtransfer::UcxTransport::Create(to));
    transport_ = std::move(transport);
  }
  if (config_.role != WorkerRole::kColocated) {
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
  const KvLayout& layout = engine_->pool().layout();
  compat_hash_ = CompatibilityHash(config_json, fingerprint, config_.model_name, layout);
  kv_layout_ = layout;
  grammars_ = std::make_unique<WorkerGrammars>(config_.tokenizer_dir, instance_->model().config().vocab_size);
  return Status::Ok();
}

Result<engine::RequestOptions> EngineHost::JobOptions(const JobMsg& job,
                                                      std::function<void(const engine::TokenEvent&)> on_event) {
  engine::RequestOptions ro;
  ro.sampling = EngineSampling(job.sampling);
  PDSERVE_RETURN_IF_ERROR(ApplyConstraint(job, &ro));
  ro.on_event = std::move(on_event);
  return ro;
}

Status EngineHost::ApplyConstraint(const JobMsg& job, engine::RequestOptions* ro) {
  if (!job.constraint.active()) return Status::Ok();
  PDSERVE_ASSIGN_OR_RETURN(ro->constraint.compiled, grammars_->Compile(job.constraint));
  ro->constraint.spec = job.constraint;
  return Status::Ok();
}

Status EngineHost::PrepareConstraint(const JobMsg& job) {
  if (!job.constraint.active()) return Status::Ok();
  return grammars_->Compile(job.constraint).status();
}

EngineHost::~EngineHost() {
  SetAgent(nullptr);
  DestroyEngine();
  region_.reset();
  transport_.reset();
}

void EngineHost::StopEngine() {
  if (engine_) engine_->Stop();
}

void EngineHost::DestroyEngine() {
  StopEngine();
  engine_.reset();
}

void EngineHost::SetAgent(WorkerAgent* agent) {
  std::lock_guard<std::mutex> lock(agent_mu_);
  agent_ = agent;
}

WorkerMetrics* EngineHost::AgentMetrics() {
  std::lock_guard<std::mutex> lock(agent_mu_);
  return agent_ ? agent_->metrics() : nullptr;
}

void EngineHost::ObserveQueueTime(const engine::TokenEvent& ev) {
  if (ev.queue_seconds < 0) return;
  if (WorkerMetrics* wm = AgentMetrics()) wm->queue_time.Observe(ev.queue_seconds);
}

void EngineHost::SendEndOnce(const JobMsg& job, bool* ended, FinishReason finish, const Status& error) {
  if (*ended) return;
  *ended = true;
  Send(EndEvent(job, finish, error));
}

void EngineHost::Send(TokenEventMsg ev) {
  std::lock_guard<std::mutex> lock(agent_mu_);
  if (agent_) agent_->SendTokenEvent(std::move(ev));
}

void EngineHost::SendKvReserved(KvReservedMsg reserved) {
  std::lock_guard<std::mutex> lock(agent_mu_);
  if (agent_) agent_->SendKvReserved(std::move(reserved));
}

void EngineHost::SendKvPull(KvPullMsg pull) {
  std::lock_guard<std::mutex> lock(agent_mu_);
  if (agent_) agent_->SendKvPull(std::move(pull));
}

void EngineHost::SendKvPushFailed(KvPushFailedMsg failed) {
  std::lock_guard<std::mutex> lock(agent_mu_);
  if (agent_) agent_->SendKvPushFailed(std::move(failed));
}

WorkerCapacity EngineHost::Capacity() const {
  WorkerCapacity c;
  c.max_batch = static_cast<uint32_t>(config_.max_seqs > 0 ? config_.max_seqs : 64);
  c.kv_blocks_total = static_cast<uint32_t>(engine_->pool().n_blocks());
  c.kv_blocks_free = static_cast<uint32_t>(engine_->pool().n_free());
  c.block_tokens = static_cast<uint32_t>(engine_->pool().layout().tokens_per_block);
  c.max_context_tokens = static_cast<uint32_t>(engine_->max_sequence_length());
  c.dp_ranks = static_cast<uint32_t>(instance_->dp_size());
  c.prefix_tier_blocks = static_cast<uint32_t>(
      std::min<int64_t>(engine_->prefix_cache_disk_tier_blocks(), std::numeric_limits<uint32_t>::max()));
  return c;
}

WorkerLoad EngineHost::Load(uint32_t quarantined_blocks) {
  const engine::EngineStats s = engine_->Stats();
  WorkerLoad load;
  load.running = static_cast<uint32_t>(s.running + s.awaiting_kv);
  load.waiting = static_cast<uint32_t>(s.waiting);
  load.queued_tokens = static_cast<uint64_t>(s.queued_tokens);
  load.kv_blocks_free = static_cast<uint32_t>(s.blocks_free);
  load.kv_blocks_total = static_cast<uint32_t>(s.blocks_total);
  if (metrics_)
    metrics_->Refresh({s.steps, s.preemptions, s.blocks_held, s.awaiting_kv, quarantined_blocks, s.prefix_lookup_tokens,
                       s.prefix_hit_tokens, s.prefix_computed_tokens, s.prefix_cached_blocks, s.prefix_evictions,
                       s.prefix_pulled_tokens, s.prefix_pushed_tokens, s.prefix_tier_blocks, s.prefix_tier_bytes, s.prefix_tier_stored_blocks,
                       s.prefix_tier_stored_bytes, s.prefix_tier_restored_tokens, s.prefix_tier_evictions,
                       s.prefix_tier_corrupt_files});
  return load;
}

Status EngineHost::Health() const {
  if (config_.step_stall_timeout.count() == 0) return Status::Ok();
  const double stuck = engine_->CurrentStepSeconds();
  if (stuck * 1000 <= static_cast<double>(config_.step_stall_timeout.count())) return Status::Ok();
  return Status::Unavailable(fmt::format("the engine's step has run for {:.1f} s (step_stall_timeout_ms {})", stuck,
                                         config_.step_stall_timeout.count()));
}

Status EngineHost::CheckDpRank(const JobMsg& job) const {
  // Every DP rank of an instance registers on its own: a job for another rank was mis-routed
  // (or is stale), and running it here would mix two ranks' requests and caches.
  if (job.dp_rank == static_cast<uint32_t>(instance_->dp_rank())) return Status::Ok();
  return Status::InvalidArgument("job for DP rank " + std::to_string(job.dp_rank) + " reached " + config_.worker_id +
                                 ", DP rank " + std::to_string(instance_->dp_rank()) + " of " +
                                 std::to_string(instance_->dp_size()));
}

SamplingParams EngineHost::EngineSampling(const SamplingParams& job_sampling) {
  SamplingParams p = job_sampling;
  // Stop strings are matched by the router on the detokenized stream (it aborts the job);
  // the engine has no detokenizer here.
  p.stop.clear();
  return p;
}

TokenLogprob EngineHost::ToLogprob(const engine::TokenEvent& ev) {
  TokenLogprob lp;
  lp.logprob = ev.logprob;
  for (const auto& [t, v] : ev.top_logprobs) lp.top.push_back({t, v});
  return lp;
}

std::optional<TokenEventMsg> EngineHost::StreamEvent(const JobMsg& job, const engine::TokenEvent& ev, bool skip_token) {
  TokenEventMsg msg;
  msg.request_id = job.request_id;
  if (ev.token >= 0 && !skip_token) {
    msg.first_index = static_cast<uint32_t>(ev.index);
    msg.tokens.push_back(ev.token);
    if (job.sampling.logprobs) msg.logprobs.push_back(ToLogprob(ev));
  } else {
    msg.first_index = static_cast<uint32_t>(std::max<int64_t>(ev.index, 0));
  }
  if (!ev.finished) {
    if (msg.tokens.empty()) return std::nullopt;
    return msg;
  }
  msg.finish = ev.reason;
  msg.error = ev.error;
  if (msg.finish == FinishReason::kError && msg.error.ok()) msg.error = Status::Internal("engine error");
  msg.prompt_tokens = static_cast<uint32_t>(ev.prompt_tokens);
  msg.completion_tokens = static_cast<uint32_t>(ev.output_tokens);
  msg.cached_prompt_tokens = static_cast<uint32_t>(ev.cached_prompt_tokens);
  msg.stop_string = ev.stop_string;
  return msg;
}

TokenEventMsg EngineHost::EndEvent(const JobMsg& job, FinishReason finish, const Status& error) const {
  TokenEventMsg ev;
  ev.request_id = job.request_id;
  ev.finish = finish;
  ev.error = error;
  ev.prompt_tokens = static_cast<uint32_t>(job.prompt.size());
  if (!error.ok()) RequestLog("worker", job.request_tag).Warn("job {} failed: {}", job.request_id, error.ToString());
  return ev;
}

}  // namespace pdserve::services::worker
