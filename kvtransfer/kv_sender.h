// KvSender: the prefill side of a KV transfer. For each request it checks the descriptor the
// decode side sent, writes the KV of the tokens this rank is assigned straight into the
// decode blocks (one-sided), layer by layer as the caller finishes computing them, and ends
// with a completion notice that the decode side verifies and acknowledges.
//
// Usage per request: Start(descriptor, rank, source) -> WriteLayers(l) after each layer (or
// group of layers) is computed; it returns at once, the writes overlap the next layer's
// compute -> Finish() (blocks until the decode side acknowledged) or Abort(). Every Start must
// be paired with a Finish or an Abort.
//
// Guarantees:
//  * Nothing is written before Start validated the descriptor (every block inside the
//    advertised region, overflow-safe; writer ranges tile the request) and the source.
//  * A rank not named in descriptor.writers writes nothing (replicated copies: one writer).
//  * The request reaches exactly one terminal status within its deadline (descriptor's
//    transfer_timeout from Start): OK only after the decode side verified the bytes; the
//    decode's verdict otherwise (kDataLoss on digest mismatch, its abort reason);
//    kUnavailable (connection failed), kDeadlineExceeded, or the caller's Abort reason.
//  * On failure no write of the request is in flight when Finish/Abort return, the decode
//    side is told (abort, or ack of its abort), and the connection is dropped when the peer
//    looks dead (kUnavailable / kDeadlineExceeded) and no other request uses it.
//
// Threading: methods may be called from any thread (one thread per request at a time is
// expected). Acks and aborts from the decode side are handled on the transport's thread; one
// internal std::jthread handles deadlines and peer failures. WriteLayers plans and hashes on
// the caller's thread (about 1 ms per 26 MB layer).
// Ownership: the transport is borrowed and must outlive the sender; the source blocks must
// stay valid and unchanged until Finish/Abort returns.
// Errors from Start: kInvalidArgument (bad descriptor or source), kDeadlineExceeded (its lease
// already expired), kAlreadyExists (request id active).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>

#include "common/status.h"
#include "kvtransfer/kv_descriptor.h"
#include "kvtransfer/kv_wire.h"
#include "kvtransfer/transfer_plan.h"
#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer {

struct SenderStats {
  uint32_t active_requests = 0;
  uint32_t inflight_batches = 0;
  uint64_t completed = 0;
  uint64_t failed = 0;
  uint64_t bytes_submitted = 0;
  uint64_t writes_submitted = 0;  // merged writes handed to the transport
};

// How far one started request got (for overlap accounting: how much of a prompt's KV landed
// while the prompt was still computing).
struct SenderProgress {
  uint32_t layers_queued = 0;
  uint64_t bytes_submitted = 0;
  uint64_t bytes_written = 0;  // of write batches the transport reported complete
};

class KvSender {
 public:
  static Result<std::unique_ptr<KvSender>> Create(Transport* transport);
  ~KvSender();
  KvSender(const KvSender&) = delete;
  KvSender& operator=(const KvSender&) = delete;

  Status Start(const KvDescriptor& descriptor, uint32_t rank, KvSource source);
  // Queues the writes of layers [first_layer, first_layer + num_layers); each layer once.
  // Returns the request's failure if it already failed, kFailedPrecondition for an unknown
  // request or a layer queued twice, kOutOfRange for a layer beyond the layout.
  Status WriteLayers(uint64_t request_id, uint32_t first_layer, uint32_t num_layers = 1);
  // Queues the layers not yet written, waits for the writes, sends the completion notice and
  // waits for the decode side's verdict. Returns the terminal status and forgets the request.
  Status Finish(uint64_t request_id);
  // Stops the request (if not yet terminal), tells the decode side, and returns once none of
  // its writes is in flight. Forgets the request.
  void Abort(uint64_t request_id, const Status& reason);

  // Errors: kNotFound for a request not started (or already finished / aborted).
  Result<SenderProgress> Progress(uint64_t request_id) const;

  SenderStats Stats() const;

 private:
  struct Request;
  struct Inbox {
    bool is_failure = false;
    std::string peer;
    std::string payload;
    Status failure;
  };

  explicit KvSender(Transport* transport);
  void Loop(std::stop_token stop);
  std::shared_ptr<Request> Find(uint64_t request_id) const;
  // mu_ held.
  void Fail(Request& r, const Status& status);
  void MaybeFinishFailure(Request& r);
  void OnBatchDone(const std::shared_ptr<Request>& r, uint64_t bytes, const Status& status);
  void HandleMessage(const std::string& peer, const TransferMessage& m);
  void Send(const Request& r, TransferMessage::Kind kind, const Status& status,
            bool flush_writes_first, DoneCallback done);
  Status QueueLayers(const std::shared_ptr<Request>& r, uint32_t first_layer, uint32_t num_layers);

  Transport* const transport_;

  mutable std::mutex mu_;
  std::condition_variable_any cv_;       // wakes the service thread
  std::condition_variable_any done_cv_;  // wakes Finish / Abort
  std::deque<Inbox> inbox_;
  bool wake_ = false;
  std::map<uint64_t, std::shared_ptr<Request>> requests_;
  SenderStats stats_;
  std::jthread thread_;  // last member: stopped and joined first
};

}  // namespace pdserve::kvtransfer
