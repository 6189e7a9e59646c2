// EngineHost: what the three engine-backed worker roles (colocated_worker.h, prefill_worker.h,
// decode_worker.h) share: the engine over this DP unit's model instance, for prefill and decode
// the UCX transport (and for decode the KV region the engine's block pool lives in), the
// engine-worker metrics, the attached WorkerAgent, the worker's identity for registration
// (capacity, compatibility hash), and the translations between control messages and engine
// requests and events.
//
// Ownership: the host owns transport, region and engine; a role owns what only it uses (sender,
// receiver, threads) and tears down its part first, calling StopEngine() / DestroyEngine() at
// the point of its own order (see each role's destructor). The model instance is borrowed and
// must outlive the host.
// Thread-safety: SetAgent / Send / AgentMetrics lock agent_mu_ and may run on any thread; the
// rest is read-only after Create or thread-safe through the engine.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <prometheus/registry.h>

#include "engine/engine.h"
#include "common/kv_layout.h"
#include "kvtransfer/transport.h"
#include "services/worker/agent/worker_agent.h"
#include "services/worker/agent/worker_metrics.h"
#include "services/worker/worker_config.h"
#include "services/worker/worker_grammars.h"
#include "services/worker/worker_hooks.h"

namespace pdserve::services::worker {

class ModelInstance;

// Model identity (config.json bytes, the weights' fingerprint, model name) + KV layout: equal
// hashes mean any prefill worker may write into any decode worker's blocks.
uint64_t CompatibilityHash(const std::string& config_json, uint64_t weights_fingerprint, const std::string& model_name,
                           const KvLayout& layout);

class EngineHost {
 public:
  // `config` is this DP rank's (ForDpRank). Prefill and decode get a UCX transport and a KV
  // region allocated by it, over which the engine builds its pool (so the transfer layer
  // registers the pool once): a decode worker receives prompts' KV into it, and both roles
  // receive pulled prefixes and send cached blocks from it. `hooks` are the tests' fault injection (worker_hooks.h).
  // Errors: the engine's (bad model dir), the transport's (UCX unavailable), the fingerprint's.
  static Result<std::unique_ptr<EngineHost>> Create(const WorkerServiceConfig& config,
                                                    std::shared_ptr<prometheus::Registry> registry,
                                                    ModelInstance* instance, const WorkerHooks& hooks);
  ~EngineHost();
  EngineHost(const EngineHost&) = delete;
  EngineHost& operator=(const EngineHost&) = delete;

  const WorkerServiceConfig& config() const { return config_; }
  engine::Engine& engine() { return *engine_; }
  // False once DestroyEngine ran (late callbacks of a role's teardown check it).
  bool has_engine() const { return engine_ != nullptr; }
  const engine::Engine& engine() const { return *engine_; }
  kvtransfer::Transport* transport() { return transport_.get(); }
  kvtransfer::LocalRegion* region() { return region_.get(); }
  // The engine pool's block layout, which kvtransfer moves as is (kept past DestroyEngine).
  const KvLayout& kv_layout() const { return kv_layout_; }
  EngineWorkerMetrics* metrics() { return metrics_.get(); }
  uint64_t compat_hash() const { return compat_hash_; }
  // The engine's prefix-cache namespace (0: the cache is off): KV computed by an engine of an
  // equal namespace may join this one's cache (RegisterMsg::kv_namespace).
  uint64_t kv_namespace() const {
    return engine_->prefix_cache_enabled() ? engine_->prefix_cache_namespace() : 0;
  }
  std::string transfer_address() const { return transport_ ? transport_->address() : std::string(); }

  // Teardown steps a role calls in its own order: stop the engine's loop (no more steps or
  // events), then destroy it (aborting what is left).
  void StopEngine();
  void DestroyEngine();

  // Where events go. Any thread; nullptr detaches (events are then dropped).
  void SetAgent(WorkerAgent* agent);
  // The agent's metrics (nullptr when detached).
  WorkerMetrics* AgentMetrics();
  // Records an engine event's queue time (the first event of a request carries it).
  void ObserveQueueTime(const engine::TokenEvent& ev);
  void Send(TokenEventMsg ev);
  void SendKvReserved(KvReservedMsg reserved);
  void SendKvPull(KvPullMsg pull);
  void SendKvPushFailed(KvPushFailedMsg failed);

  WorkerCapacity Capacity() const;
  // The engine's load; refreshes the engine metrics (with the decode receiver's quarantined
  // blocks, 0 for other roles).
  WorkerLoad Load(uint32_t quarantined_blocks);
  // Unavailable while the engine's current step has run past config.step_stall_timeout.
  Status Health() const;
  // Ok, or why the engine stopped for good (its multi-rank group broke).
  Status failure() const { return engine_->failure(); }
  // InvalidArgument when `job` was placed on another DP rank of this instance.
  Status CheckDpRank(const JobMsg& job) const;

  // What the engine samples a job with: the job's parameters less the stop strings (the router
  // matches those on the detokenized stream).
  static SamplingParams EngineSampling(const SamplingParams& job_sampling);
  // Sets `ro->constraint` from the job's constraint (nothing when it has none), compiled over
  // this model's vocabulary. Errors: WorkerGrammars::Compile's (InvalidArgument: the client's).
  Status ApplyConstraint(const JobMsg& job, engine::RequestOptions* ro);
  // Compiles the job's constraint into the grammar cache ahead of StartJob (the agent's
  // preparer thread runs it: WorkerHandler::PrepareJob), so ApplyConstraint then finds it there.
  // OK for a job without a constraint. Errors: WorkerGrammars::Compile's. Thread-safe.
  Status PrepareConstraint(const JobMsg& job);
  // The engine options every role starts a job with: EngineSampling, ApplyConstraint, and
  // `on_event` for the job's engine events. Errors: ApplyConstraint's.
  Result<engine::RequestOptions> JobOptions(const JobMsg& job, std::function<void(const engine::TokenEvent&)> on_event);
  // The control event for a streamed engine event of `job` (colocated, decode): the token (unless
  // `skip_token`) and, on the finishing event, reason, error and usage. nullopt when there is
  // nothing to send (no token, not finished).
  static std::optional<TokenEventMsg> StreamEvent(const JobMsg& job, const engine::TokenEvent& ev, bool skip_token);
  // An error or abort event ending `job` (logged when an error).
  TokenEventMsg EndEvent(const JobMsg& job, FinishReason finish, const Status& error) const;
  // Sends `job`'s EndEvent unless `*ended` says one went out already; sets it.
  void SendEndOnce(const JobMsg& job, bool* ended, FinishReason finish, const Status& error);
  static TokenLogprob ToLogprob(const engine::TokenEvent& ev);

 private:
  EngineHost(const WorkerServiceConfig& config, std::shared_ptr<prometheus::Registry> registry, ModelInstance* instance);
  Status Init(const WorkerHooks& hooks);

  const WorkerServiceConfig config_;
  ModelInstance* const instance_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<EngineWorkerMetrics> metrics_;
  uint64_t compat_hash_ = 0;
  KvLayout kv_layout_;
  std::unique_ptr<WorkerGrammars> grammars_;

  std::mutex agent_mu_;
  WorkerAgent* agent_ = nullptr;

  // Destroyed last to first: engine (if the role has not yet), region, transport.
  std::unique_ptr<kvtransfer::Transport> transport_;
  std::unique_ptr<kvtransfer::LocalRegion> region_;
  std::unique_ptr<engine::Engine> engine_;
};

}  // namespace pdserve::services::worker
