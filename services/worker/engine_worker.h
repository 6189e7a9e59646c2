// EngineWorker: an engine-backed worker of the control plane (docs/services.md,
// docs/control-plane.md), as the worker's main() sees it: registration data, the agent
// attachment, load and health. Create() picks the role:
//
//   ColocatedWorker (colocated_worker.h)  jobs run whole on this engine
//   PrefillWorker   (prefill_worker.h)    prompts computed here, their KV written into a decode
//                                         worker's blocks, the first token reported
//   DecodeWorker    (decode_worker.h)     KV reserved and received here, then decoded
//
// Every role holds an EngineHost (engine_host.h): the engine, the transport and the translation
// between control messages and engine requests. Multi-rank instances (ModelInstance,
// docs/services.md "Multi-rank workers"): one EngineWorker per DP unit, on the unit's leader;
// its engine steps through the unit's RankGroup, and a job placed on another DP rank is refused.
//
// Threading: WorkerHandler calls run on the WorkerAgent's thread and never block; engine events
// arrive on the engine's step thread; roles may run threads of their own (documented there).
// The agent is attached after construction and must be detached (SetAgent(nullptr)) or
// destroyed before the worker.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <prometheus/registry.h>

#include "services/worker/agent/worker_agent.h"
#include "services/worker/engine_host.h"
#include "services/worker/worker_config.h"
#include "services/worker/worker_hooks.h"

namespace pdserve::services::worker {

class ModelInstance;

// The engine's prefix-cache events as the control message (KvEventsMsg): the hashes with the
// engine's hit rule (block size, first chunk). `full`: the whole set (reset). Any thread.
KvEventsMsg TakeEngineKvEvents(engine::Engine* engine, bool full);

class EngineWorker : public WorkerHandler {
 public:
  // The worker of config.role. `instance` (the model, and for a multi-rank instance this DP
  // unit's group; its leader) must outlive the worker; `config` is this DP rank's (ForDpRank).
  // Errors: EngineHost::Create's, the role's (KV receiver / sender set-up).
  static Result<std::unique_ptr<EngineWorker>> Create(const WorkerServiceConfig& config,
                                                      std::shared_ptr<prometheus::Registry> registry,
                                                      ModelInstance* instance, const WorkerHooks& hooks = {});
  ~EngineWorker() override = default;
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  // Where events go. Any thread; nullptr detaches (events are then dropped).
  void SetAgent(WorkerAgent* agent) { host_->SetAgent(agent); }
  // Registration data for WorkerAgentOptions.
  WorkerCapacity Capacity() const { return host_->Capacity(); }
  uint64_t compat_hash() const { return host_->compat_hash(); }
  uint64_t kv_namespace() const { return host_->kv_namespace(); }
  std::string transfer_address() const { return host_->transfer_address(); }
  // Ok, or why the engine stopped for good (its multi-rank group broke): the process should exit.
  Status failure() const { return host_->failure(); }

  WorkerLoad CurrentLoad() override { return host_->Load(QuarantinedBlocks()); }
  Status Health() override { return host_->Health(); }
  // A constrained job's grammar is compiled off the agent's thread (the first one also builds
  // the vocabulary: about a second).
  bool NeedsPreparation(const JobMsg& job) override { return job.constraint.active(); }
  Status PrepareJob(const JobMsg& job) override { return host_->PrepareConstraint(job); }
  // The engine's prefix-cache events with its hit rule (block size, first chunk); nullopt with
  // the cache off.
  std::optional<KvEventsMsg> TakeKvEvents(bool full) override;

 protected:
  explicit EngineWorker(std::unique_ptr<EngineHost> host) : host_(std::move(host)) {}
  // Decode: KV blocks of aborted transfers not yet reusable.
  virtual uint32_t QuarantinedBlocks() { return 0; }

  // Destroyed after the role's own members (declared in the derived class), which each role's
  // destructor tears down in its order first.
  std::unique_ptr<EngineHost> host_;

 private:
  std::function<void(KvEventsMsg*)> kv_events_hook_;  // WorkerHooks::kv_events (tests)
};

}  // namespace pdserve::services::worker
