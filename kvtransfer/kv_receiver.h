// KvReceiver: the decode side of a KV transfer. It reserves blocks for a request, hands out the
// KvDescriptor that lets prefill ranks write into them, tracks each request through the
// TransferState machine (transfer_state.h), verifies completion notices, and gives the blocks
// either to the caller (HandOver) or back to the allocator (abort), never while a writer may
// still be writing into them.
//
// Protocol (messages on Transport::kChannelToDecode / kChannelToPrefill, kv_wire.h):
//   Reserve -> descriptor (control plane) -> each writer rank: `begin`, one-sided writes,
//   flush, `complete{blocks, bytes, digest}` -> the receiver checks counts (and the digest
//   over its own memory when verify_digest) and answers `ack{status}`; when every writer of
//   the request is verified the request is kComplete and an event is queued: the caller
//   learns completions from TakeEvents / WaitForEvents, without looking at blocks.
// Leases and deadlines: a request still kReserved after its lease is aborted (kAborted); a
// writer that began and has not completed within transfer_timeout aborts the request
// (kDeadlineExceeded); a writer whose connection fails aborts it (kUnavailable); a digest or
// count mismatch aborts it (kDataLoss). Aborting sends `abort` to every writer that began.
// Quarantine: blocks of an aborted request return to the allocator once every writer is
// quiet: it completed, acknowledged the abort, failed, or (never began / stopped answering)
// quarantine_grace passed after its last possible write (its own deadline).
//
// Threading: public methods may be called from any thread. Messages are handled on the
// transport's thread, except completions whose verification hashes more than 1 MB; those, the
// leases, deadlines and peer failures are handled by one internal std::jthread (the service
// thread).
// Ownership: the transport, region and allocator are borrowed and must outlive the receiver.
// The destructor aborts unfinished requests and waits (bounded by the quarantine rules) until
// their blocks are released.
// Errors: Reserve -> kInvalidArgument (bad writers / size), kAlreadyExists (id in use),
// kResourceExhausted (no blocks); HandOver -> kNotFound, kFailedPrecondition (not complete).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <vector>

#include "common/status.h"
#include "kvtransfer/block_allocator.h"
#include "kvtransfer/kv_descriptor.h"
#include "kvtransfer/kv_wire.h"
#include "kvtransfer/transfer_state.h"
#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer {

struct KvReceiverOptions {
  std::chrono::milliseconds lease{10'000};
  std::chrono::milliseconds transfer_timeout{10'000};
  std::chrono::milliseconds quarantine_grace{1'000};
  bool verify_digest = true;
};

// The engine's block pool as the receiver sees it: block b occupies
// [first_block_offset + b * layout.BlockBytes(), +BlockBytes()) of `region`.
struct ReceiverBlockPool {
  LocalRegion* region = nullptr;
  uint64_t first_block_offset = 0;
  KvLayout layout;
  BlockAllocator* allocator = nullptr;
};

// Reported once per request, when it becomes kComplete or kAborted.
struct ReceiverEvent {
  uint64_t request_id = 0;
  TransferState state = TransferState::kReserved;
  Status status;
};

struct ReceiverStats {
  uint32_t active_requests = 0;     // holding blocks (including quarantined ones)
  uint32_t held_blocks = 0;         // blocks of active requests
  uint32_t quarantined_blocks = 0;  // blocks of aborted requests not yet released
  uint64_t completed = 0;
  uint64_t aborted = 0;
  uint64_t digest_failures = 0;
};

class KvReceiver {
 public:
  static Result<std::unique_ptr<KvReceiver>> Create(Transport* transport, ReceiverBlockPool pool,
                                                    KvReceiverOptions options = {});
  ~KvReceiver();
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  // Allocates the blocks of a `num_tokens` request written by `writers` and returns its
  // descriptor (state kReserved). `lease` (default options.lease) bounds the wait for the
  // writers' `begin`; `transfer_timeout` (default options.transfer_timeout) bounds each
  // writer's begin..complete, which with layer streaming spans the prefill's compute of the
  // request: size it from the prompt length.
  Result<KvDescriptor> Reserve(
      uint64_t request_id, uint32_t num_tokens, std::vector<WriterAssignment> writers,
      std::optional<std::chrono::milliseconds> lease = std::nullopt,
      std::optional<std::chrono::milliseconds> transfer_timeout = std::nullopt);

  // The current state and status of a request (kNotFound for unknown / long-finished ids).
  Result<TransferState> State(uint64_t request_id) const;
  Status RequestStatus(uint64_t request_id) const;

  // Events since the last call (non-blocking).
  std::vector<ReceiverEvent> TakeEvents();
  // Waits until an event is queued (true) or the deadline passes (false).
  bool WaitForEvents(Deadline deadline);

  // kComplete -> kHandedOver: the caller now owns (and later frees) the returned block ids, in
  // token order.
  Result<std::vector<uint32_t>> HandOver(uint64_t request_id);
  // Aborts a request that is not terminal (kNotFound otherwise).
  Status Abort(uint64_t request_id, const Status& reason);

  // Waits until no request holds blocks, or the deadline (kDeadlineExceeded).
  Status WaitUntilIdle(Deadline deadline);

  ReceiverStats Stats() const;

 private:
  struct Writer;
  struct Request;
  struct Inbox {
    bool is_failure = false;
    std::string peer;
    std::string payload;
    Status failure;
  };

  KvReceiver(Transport* transport, ReceiverBlockPool pool, KvReceiverOptions options);
  void Loop(std::stop_token stop);
  // Transport thread: decodes and handles a message (or queues it for the service thread).
  void OnMessage(std::string_view peer, std::string_view payload);
  // mu_ held (transport or service thread).
  void HandleMessage(const std::string& peer, const TransferMessage& m,
                     std::unique_lock<std::mutex>& lock);
  void HandlePeerFailure(const std::string& peer, const Status& status);
  Status Verify(const Request& request, const Writer& writer, const TransferMessage& m);
  void SetState(Request& request, TransferState state, const Status& status);
  void AbortLocked(Request& request, const Status& status);
  void ReleaseIfQuiet(Request& request, Deadline now);
  void CheckTimers(Deadline now);
  Deadline NextTimer() const;
  void Reply(const std::string& peer, uint64_t request_id, uint32_t rank,
             TransferMessage::Kind kind, const Status& status);
  void RememberFinished(uint64_t request_id, const Status& status);

  Transport* const transport_;
  const ReceiverBlockPool pool_;
  const KvReceiverOptions options_;

  mutable std::mutex mu_;
  std::condition_variable_any cv_;         // wakes the service thread
  std::condition_variable_any events_cv_;  // wakes WaitForEvents / WaitUntilIdle
  std::deque<Inbox> inbox_;
  bool wake_ = false;  // timers changed: the service thread recomputes its sleep
  std::map<uint64_t, std::unique_ptr<Request>> requests_;
  std::deque<std::pair<uint64_t, Status>> finished_;  // recent terminal statuses, bounded
  std::deque<ReceiverEvent> events_;
  ReceiverStats stats_;
  std::jthread thread_;  // last member: stopped and joined first
};

}  // namespace pdserve::kvtransfer
