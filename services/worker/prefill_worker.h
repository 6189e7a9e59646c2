// PrefillWorker: the prefill role of a disaggregated cluster (docs/services.md).
//
//   Job(descriptor) -> Engine::AddRequest(max_tokens 1, hold_kv). With layer streaming
//   (kv_stream_layers, default) the engine's KV export hooks start the KvSender over the
//   request's blocks and queue each layer's writes as soon as the forward computed it, so the
//   transfer overlaps the remaining layers; once the first token is sampled the transfer thread
//   finishes it (flush, completion notice, the decode's verdict), releases the held blocks and
//   sends the first token (index 0). Without streaming the transfer thread writes every layer
//   after the forward.
//
// Safety: once the sender started, the request's blocks stay held by the engine whatever way
// the request ends (engine KvExportHooks contract) and are released only by the transfer
// thread after KvSender::Finish or Abort returned, so no write ever reads a block given to
// another request. A job ending early (error mid-layers, abort, nothing to decode) is queued to
// the transfer thread for that abort + release: the engine thread never waits on the network.
//
// Threading: as EngineWorker, plus one transfer thread and one abort thread (std::jthread
// members stopped in the destructor). `mu_` guards the job table and both queues. The router's
// aborts reach the KvSender through the abort thread: KvSender::Abort returns only once no
// write of the request is in flight, which, with the decode host cut off the network (no
// reset, just silence), is the transfer's deadline; the agent's control thread, which delivers
// the abort, must keep heartbeating meanwhile.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "kvtransfer/kv_descriptor.h"
#include "kvtransfer/kv_sender.h"
#include "services/worker/engine_worker.h"
#include "services/worker/kv_pusher.h"
#include "services/worker/prefix_puller.h"

namespace pdserve::services::worker {

class PrefillWorker final : public EngineWorker {
 public:
  // `hooks.wrap_sender_transport` (tests) wraps the transport the sender writes through.
  // Errors: KvSender::Create's.
  static Result<std::unique_ptr<PrefillWorker>> Create(std::unique_ptr<EngineHost> host, const WorkerHooks& hooks);
  // The puller (its thread submits jobs) and the pusher, the transfer and abort threads, then the
  // engine's loop, then the sender (it aborts its requests and returns once none of their writes,
  // which read the engine's pool, is in flight), then the engine; the host last.
  ~PrefillWorker() override;

  Status StartJob(const JobMsg& job) override;
  void AbortJob(uint64_t request_id, std::string_view reason) override;
  // Pulls (docs/prefix-cache.md "Pulls"): this worker's cached blocks written for another
  // worker (KvPusher, through this worker's sender), and the holder's failure to write a pull
  // this worker asked for (PrefixPuller).
  Status PushKv(const KvPushMsg& push) override { return pusher_->Push(push); }
  void PullFailed(const KvPushFailedMsg& failed) override;
  // The engine's load plus the jobs waiting for their pull (not in the engine yet): each counts
  // as waiting, with the prompt tokens left to compute once the pull lands, and its one token.
  WorkerLoad CurrentLoad() override;

 private:
  struct Job {
    JobMsg msg;
    engine::RequestId engine_id = 0;
    bool ended = false;  // the finishing event was sent
    std::optional<kvtransfer::KvDescriptor> descriptor;
    bool sender_started = false;    // KvSender::Start succeeded: writes may be in flight
    Status stream_status;           // the stream's Start failure, if any
    bool cancel_requested = false;  // the router aborted while the prompt computed
    std::chrono::steady_clock::time_point stream_began_at{}, sampled_at{};
    int32_t token = -1;
    FinishReason engine_reason = FinishReason::kNone;
    TokenLogprob logprob;
    std::string constraint_state;  // a constrained request's matcher state after the token
    uint32_t cached_prompt_tokens = 0;  // of the prompt, supplied by the prefix cache
    // A job with a pull waits for it (PrefixPuller) before the engine gets it.
    bool pulling = false;
    std::optional<engine::RequestOptions> pending_options;
  };

  explicit PrefillWorker(std::unique_ptr<EngineHost> host) : EngineWorker(std::move(host)) {}
  void OnEngineEvent(uint64_t request_id, const engine::TokenEvent& ev);
  // Hands the job's prompt to the engine (mu_ held). Errors: Engine::AddRequest's.
  Status SubmitLocked(Job& job);
  // The job's pull ended (adopted or failed): submit it, unless it was aborted meanwhile.
  void OnPullDone(uint64_t request_id);
  // Ends a job with an error / abort event (once); mu_ held.
  void EndLocked(Job& job, FinishReason finish, const Status& error);
  // The prefill's single engine event (mu_ held; may erase the job).
  void Sampled(Job& job, const engine::TokenEvent& ev);
  // KV export hooks (engine step thread, mu_ not held).
  void StreamBegin(uint64_t request_id, const std::vector<int32_t>& blocks);
  void StreamLayer(uint64_t request_id, int64_t layer);
  // A job that will not transfer: release its blocks now, or (writes may be in flight) hand it
  // to the transfer thread to abort them first. mu_ held; may erase the job.
  void RetireLocked(Job& job);
  kvtransfer::KvSource SourceFor(const std::vector<int32_t>& blocks, uint32_t num_tokens);
  void TransferLoop(std::stop_token stop);
  void RunTransfer(uint64_t request_id);
  void AbortLoop(std::stop_token stop);

  std::unique_ptr<kvtransfer::Transport> send_transport_;  // tests' wrapper over the host's, if any
  std::unique_ptr<kvtransfer::KvSender> sender_;
  std::unique_ptr<KvPusher> pusher_;      // writes through sender_
  std::unique_ptr<PrefixPuller> puller_;  // receives into the engine's pool

  std::mutex mu_;
  std::condition_variable_any cv_;          // transfer queue
  std::unordered_map<uint64_t, Job> jobs_;  // by router request id
  std::deque<uint64_t> transfers_;          // first token sampled (or job ended): KV to send or abort
  std::condition_variable_any abort_cv_;    // abort queue
  std::deque<uint64_t> aborts_;             // the router aborted: stop the request's writes

  std::jthread transfer_thread_;
  std::jthread abort_thread_;
};

}  // namespace pdserve::services::worker
