// EngineWorker: the engine-backed worker services (docs/services.md). One class serves the
// three roles of the control plane (docs/control-plane.md) over one engine::Engine:
//
//   colocated  Job -> Engine::AddRequest; every engine TokenEvent -> a control TokenEvent.
//   decode     Job -> Engine::ReserveImport (blocks of a pool that lives in a region registered
//              with the UCX transport) + KvReceiver::Reserve with exactly those blocks (the
//              receiver "allocates" them through ImportAllocator) -> KvReserved(descriptor).
//              When the receiver reports the transfer complete (digest verified) and the router
//              relayed the first token: KvReceiver::HandOver + Engine::CommitImport; engine
//              events from output index 1 on -> TokenEvents. A transfer that fails (lease,
//              deadline, dead prefill, digest) fails the job; its blocks go back to the engine
//              only when the receiver's quarantine ends (ImportAllocator::Free -> Engine::Abort).
//   prefill    Job(descriptor) -> Engine::AddRequest(max_tokens 1, hold_kv). With layer streaming
//              (kv_stream_layers, default) the engine's KV export hooks start the KvSender
//              over the request's blocks and queue each layer's writes as soon as the forward
//              computed it, so the transfer overlaps the remaining layers; once the first
//              token is sampled the transfer thread finishes it (flush, completion notice, the
//              decode's verdict), releases the held blocks and sends the first token (index
//              0). Without streaming the transfer thread writes every layer after the forward.
//
// Multi-rank instances (ModelInstance, docs/services.md "Multi-rank workers"): one EngineWorker
// per DP unit, on the unit's leader; its engine steps through the unit's RankGroup, and a job
// placed on another DP rank is refused.
//
// Threading: WorkerHandler calls run on the WorkerAgent's thread and never block (engine and
// receiver calls only queue work); engine events arrive on the engine's step thread; the
// decode role runs one receiver-event thread, the prefill role one transfer thread (both
// std::jthread members stopped in the destructor). `mu_` guards the job table; it is never
// held while the receiver might call back (ImportAllocator uses its own lock).
// Ownership: the worker owns the transport, region, receiver/sender and engine (destroyed in
// the reverse order of their dependencies); the agent is attached after construction and must
// be detached (SetAgent(nullptr)) or destroyed before the worker.
// Errors: Create -> the engine's / transport's errors (bad model dir, UCX unavailable).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include <prometheus/registry.h>

#include "engine/engine.h"
#include "kvtransfer/kv_receiver.h"
#include "kvtransfer/kv_sender.h"
#include "kvtransfer/testing/fault_transport.h"
#include "kvtransfer/transport.h"
#include "services/common/worker_agent.h"
#include "services/worker/worker_config.h"
#include "services/worker/worker_service_metrics.h"

namespace pdserve::services::worker {

class ImportAllocator;
class ModelInstance;

// The engine's block layout as kvtransfer describes it (field-for-field; same bytes).
// Errors: InvalidArgument when the two layouts would disagree on a block's size.
Result<kvtransfer::KvLayout> ToTransferLayout(const engine::KvLayout& layout);
// Model identity (config.json bytes, the weights' fingerprint, model name) + KV layout: equal
// hashes mean any prefill worker may write into any decode worker's blocks.
uint64_t CompatibilityHash(const std::string& config_json, uint64_t weights_fingerprint, const std::string& model_name,
                           const engine::KvLayout& layout);

class EngineWorker final : public WorkerHandler {
 public:
  // `instance` (the model, and for a multi-rank instance this DP unit's group; its leader)
  // must outlive the worker. `config` is this DP rank's (ForDpRank).
  static Result<std::unique_ptr<EngineWorker>> Create(const WorkerServiceConfig& config,
                                                      std::shared_ptr<prometheus::Registry> registry,
                                                      ModelInstance* instance);
  ~EngineWorker() override;
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  // Where events go. Any thread; nullptr detaches (events are then dropped).
  void SetAgent(WorkerAgent* agent);

  // Registration data for WorkerAgentOptions.
  WorkerCapacity Capacity() const;
  uint64_t compat_hash() const { return compat_hash_; }
  std::string transfer_address() const;

  Status StartJob(const JobMsg& job) override;
  Status CommitFirstToken(const FirstTokenMsg& first) override;
  void AbortJob(uint64_t request_id, std::string_view reason) override;
  WorkerLoad CurrentLoad() override;
  // Ok, or why the engine stopped for good (its multi-rank group broke): the process should exit.
  Status failure() const { return engine_->failure(); }
  // Unavailable while the engine's current step has run past config.step_stall_timeout.
  Status Health() override;

 private:
  struct Job {
    JobMsg msg;
    engine::RequestId engine_id = 0;
    bool ended = false;                 // the finishing event was sent
    // decode
    bool transfer_done = false;
    std::optional<int32_t> first_token;
    bool committed = false;
    std::chrono::steady_clock::time_point reserved_at{};
    // prefill
    std::optional<kvtransfer::KvDescriptor> descriptor;
    bool sender_started = false;        // KvSender::Start succeeded: writes may be in flight
    Status stream_status;               // the stream's Start failure, if any
    bool cancel_requested = false;      // the router aborted while the prompt computed
    std::chrono::steady_clock::time_point stream_began_at{}, sampled_at{};
    int32_t token = -1;
    engine::FinishReason engine_reason = engine::FinishReason::kNone;
    TokenLogprob logprob;
  };

  EngineWorker(const WorkerServiceConfig& config, std::shared_ptr<prometheus::Registry> registry,
               ModelInstance* instance);
  Status Init();
  engine::SamplingParams ToSampling(const SamplingSpec& spec) const;
  void OnEngineEvent(uint64_t request_id, const engine::TokenEvent& ev);
  // The agent's metrics (nullptr when detached); thread-safe to use.
  WorkerMetrics* AgentMetrics();
  void Send(TokenEventMsg ev);
  // Ends a job with an error / abort event (once); mu_ held.
  void EndLocked(Job& job, FinishReason finish, const Status& error);
  // decode
  Status StartDecode(const JobMsg& job);
  // Hands the imported KV to the engine once the transfer is verified and the first token is
  // here. Never called with mu_ held (it calls the receiver).
  void TryCommit(uint64_t request_id);
  void AbortDecode(std::unique_lock<std::mutex>& lock, Job& job);
  void ReceiverLoop(std::stop_token stop);
  void OnImportFreed(uint64_t request_id);
  // prefill
  Status StartPrefill(const JobMsg& job);
  // The prefill's single engine event (mu_ held; may erase the job).
  void PrefillSampled(Job& job, const engine::TokenEvent& ev);
  // KV export hooks (engine step thread, mu_ not held).
  void StreamBegin(uint64_t request_id, const std::vector<int32_t>& blocks);
  void StreamLayer(uint64_t request_id, int64_t layer);
  // A job that will not transfer: release its blocks now, or (writes may be in flight) hand
  // it to the transfer thread to abort them first. mu_ held; may erase the job.
  void RetirePrefillLocked(Job& job);
  kvtransfer::KvSource SourceFor(const std::vector<int32_t>& blocks, uint32_t num_tokens) const;
  void AbortPrefill(std::unique_lock<std::mutex>& lock, Job& job);
  void TransferLoop(std::stop_token stop);
  void RunTransfer(uint64_t request_id);

  const WorkerServiceConfig config_;
  ModelInstance* const instance_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ServiceMetrics> metrics_;
  uint64_t compat_hash_ = 0;
  kvtransfer::KvLayout transfer_layout_;

  std::mutex agent_mu_;
  WorkerAgent* agent_ = nullptr;

  // Destruction order matters: threads first, the engine's loop, the sender (no write may
  // read the engine's pool after it), then the engine (it aborts what is left), receiver,
  // region and transport.
  std::unique_ptr<kvtransfer::Transport> transport_;
  // TEST ONLY (--test-tear-kv-writes): the prefill's sender writes through this wrapper.
  std::unique_ptr<kvtransfer::testing::FaultTransport> tearing_transport_;
  std::unique_ptr<kvtransfer::LocalRegion> region_;
  std::unique_ptr<ImportAllocator> allocator_;
  std::unique_ptr<kvtransfer::KvReceiver> receiver_;
  std::unique_ptr<kvtransfer::KvSender> sender_;
  std::unique_ptr<engine::Engine> engine_;

  std::mutex mu_;
  std::condition_variable_any cv_;                 // transfer queue
  std::unordered_map<uint64_t, Job> jobs_;         // by router request id
  std::deque<uint64_t> transfers_;                 // prefill: first token sampled, KV to send

  std::jthread receiver_thread_;
  std::jthread transfer_thread_;
};

}  // namespace pdserve::services::worker
