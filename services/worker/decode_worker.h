// DecodeWorker: the decode role of a disaggregated cluster (docs/services.md).
//
//   Job -> Engine::ReserveImport (blocks of a pool that lives in a region registered with the
//   UCX transport) + KvReceiver::Reserve with exactly those blocks (the receiver "allocates"
//   them through ImportAllocator) -> KvReserved(descriptor). When the receiver reports the
//   transfer complete (digest verified) and the router relayed the first token:
//   KvReceiver::HandOver + Engine::CommitImport; engine events from output index 1 on ->
//   TokenEvents. A transfer that fails (lease, deadline, dead prefill, digest) fails the job;
//   its blocks go back to the engine only when the receiver's quarantine ends
//   (ImportAllocator::Free -> Engine::Abort).
//
//   A colocated job (the router's decode-side hit, docs/router.md): the prompt is mostly in
//   this worker's prefix cache already, so the engine runs the whole request as a colocated
//   worker would (Engine::AddRequest maps the cached prefix and computes the rest); every event
//   is streamed, the first token too. No transfer is involved.
//
// Threading: as EngineWorker, plus one receiver-event thread (a std::jthread member stopped in
// the destructor). `mu_` guards the job table; it is never held while the receiver might call
// back (ImportAllocator uses its own lock).
#pragma once

#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "kvtransfer/kv_receiver.h"
#include "kvtransfer/kv_sender.h"
#include "services/worker/engine_worker.h"
#include "services/worker/import_allocator.h"
#include "services/worker/kv_pusher.h"

namespace pdserve::services::worker {

class DecodeWorker final : public EngineWorker {
 public:
  // Errors: KvReceiver::Create's.
  static Result<std::unique_ptr<DecodeWorker>> Create(std::unique_ptr<EngineHost> host);
  // The pusher and its sender (no write reads the pool after them), the receiver thread, then
  // the engine's loop, the engine (aborts what is left, freeing imported blocks), then the
  // receiver (waits out quarantines) and the allocator; the host last.
  ~DecodeWorker() override;

  Status StartJob(const JobMsg& job) override;
  Status CommitFirstToken(const FirstTokenMsg& first) override;
  void AbortJob(uint64_t request_id, std::string_view reason) override;
  // A prefill worker pulls a prefix this worker's cache holds (a conversation's previous turn,
  // prompt and reply, lives here): KvPusher writes it (docs/prefix-cache.md "Pulls").
  Status PushKv(const KvPushMsg& push) override { return pusher_->Push(push); }

 protected:
  uint32_t QuarantinedBlocks() override { return receiver_ ? receiver_->Stats().quarantined_blocks : 0; }

 private:
  struct Job {
    JobMsg msg;
    engine::RequestId engine_id = 0;
    bool ended = false;  // the finishing event was sent
    bool transfer_done = false;
    std::optional<int32_t> first_token;
    std::string constraint_state;  // the prefill's matcher state after first_token (may be empty)
    bool committed = false;
    std::chrono::steady_clock::time_point reserved_at{};
    bool local = false;  // a colocated job: computed here, nothing imported
  };

  explicit DecodeWorker(std::unique_ptr<EngineHost> host) : EngineWorker(std::move(host)) {}
  void OnEngineEvent(uint64_t request_id, const engine::TokenEvent& ev);
  Status StartLocalJob(const JobMsg& job);
  // Ends a job with an error / abort event (once); mu_ held.
  void EndLocked(Job& job, FinishReason finish, const Status& error);
  // Hands the imported KV to the engine once the transfer is verified and the first token is
  // here. Never called with mu_ held (it calls the receiver).
  void TryCommit(uint64_t request_id);
  void ReceiverLoop(std::stop_token stop);
  void OnImportFreed(uint64_t request_id);

  std::unique_ptr<ImportAllocator> allocator_;
  std::unique_ptr<kvtransfer::KvReceiver> receiver_;
  std::unique_ptr<kvtransfer::KvSender> push_sender_;  // writes pulled prefixes out of the pool
  std::unique_ptr<KvPusher> pusher_;

  std::mutex mu_;
  std::unordered_map<uint64_t, Job> jobs_;  // by router request id

  std::jthread receiver_thread_;
};

}  // namespace pdserve::services::worker
