// InProcTransport: a Transport between objects of one process (memcpy for RMA), for unit tests
// of the protocol above it. Not a replacement for UcxTransport: nothing crosses a process.
// Part of pdserve_kvtransfer_testing (linked by tests and benchmarks, never by a shipped binary).
//
// Transports that share an InProcFabric can reach each other by address ("inproc:<n>").
// Fault injection: Kill() simulates a crashed peer (everything to or from it fails with
// kUnavailable, peers get their failure handlers called); HoldWrites(true) keeps outgoing RMA
// batches queued (a stalled network) until released or their deadline passes.
//
// Threading: one std::jthread per transport runs all callbacks and handlers (see Transport).
// Ownership: the fabric is shared (std::shared_ptr); regions must be destroyed before their
// transport.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stop_token>
#include <string>
#include <thread>

#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer::testing {

class InProcFabric {
 public:
  InProcFabric() = default;

 private:
  friend class InProcTransport;
  struct Node;
  std::shared_ptr<Node> Find(const std::string& address);

  std::mutex mu_;
  std::map<std::string, std::weak_ptr<Node>> nodes_;
  uint64_t next_id_ = 1;
};

class InProcTransport final : public Transport {
 public:
  static Result<std::unique_ptr<InProcTransport>> Create(std::shared_ptr<InProcFabric> fabric);
  ~InProcTransport() override;

  std::string_view backend_name() const override { return "inproc"; }
  const std::string& address() const override { return address_; }
  Result<std::unique_ptr<LocalRegion>> AllocateRegion(uint64_t bytes) override;
  Result<std::unique_ptr<LocalRegion>> RegisterRegion(void* data, uint64_t bytes) override;
  Status RegisterClient(uint16_t channel, MessageHandler on_message,
                        PeerFailureHandler on_peer_failure) override;
  void UnregisterClient(uint16_t channel) override;
  Status Submit(RmaKind kind, std::string_view peer, const RemoteRegionDesc& region,
                std::vector<RmaOp> ops, Deadline deadline, DoneCallback done) override;
  Status SendMessage(std::string_view peer, uint16_t channel, std::string payload,
                     bool flush_writes_first, Deadline deadline, DoneCallback done) override;
  void Connect(std::string_view peer) override;
  void Disconnect(std::string_view peer) override;
  TransportStats Stats() const override;

  // Fault injection (see the file comment).
  void Kill();
  void HoldWrites(bool hold);

 private:
  class Region;
  struct Batch {
    RmaKind kind;
    std::string peer;
    RemoteRegionDesc region;
    std::vector<RmaOp> ops;
    Deadline deadline;
    DoneCallback done;
  };
  struct Client {
    MessageHandler on_message;
    PeerFailureHandler on_peer_failure;
  };

  InProcTransport(std::shared_ptr<InProcFabric> fabric, std::shared_ptr<InProcFabric::Node> node,
                  std::string address);
  void Post(std::function<void()> task);
  void Loop(std::stop_token stop);
  // I/O thread only.
  void RunBatch(Batch& batch);
  void FailPeer(const std::string& peer, const Status& status);
  void Deliver(uint16_t channel, std::string sender, std::string payload);
  void UnregisterRegion(uint64_t id);

  const std::shared_ptr<InProcFabric> fabric_;
  const std::shared_ptr<InProcFabric::Node> node_;
  const std::string address_;

  mutable std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<std::function<void()>> tasks_;
  std::deque<Batch> held_;  // I/O thread only once queued
  bool hold_writes_ = false;
  bool killed_ = false;
  Client clients_[kMaxChannels];
  std::set<std::string> peers_;  // I/O thread only
  TransportStats stats_;         // guarded by mu_
  std::jthread thread_;          // last: joined first
};

}  // namespace pdserve::kvtransfer::testing
