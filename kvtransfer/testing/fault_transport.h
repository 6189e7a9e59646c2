// FaultTransport: a Transport decorator for tests that tears transfers on purpose. It forwards
// everything to the wrapped transport, except that while `drop_writes` is positive each RMA
// write batch loses its last op (reported as success), so the decode side receives a partial
// transfer whose completion notice still claims every byte; and with a `write_delay` every RMA
// write batch waits that long (on the submitting thread) before it is issued, so a test can act
// while a transfer is in flight.
//
// Thread-safety: as the wrapped transport; the setters may be called from any thread.
// Ownership: borrows `inner`, which must outlive it.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer::testing {

class FaultTransport final : public Transport {
 public:
  explicit FaultTransport(Transport* inner) : inner_(inner) {}

  // The next `n` write batches each silently lose their last op.
  void set_drop_writes(int n) { drop_writes_.store(n); }
  // Every later write batch is issued `delay` after it was submitted.
  void set_write_delay(std::chrono::milliseconds delay) { write_delay_ms_.store(delay.count()); }

  std::string_view backend_name() const override { return inner_->backend_name(); }
  const std::string& address() const override { return inner_->address(); }
  Result<std::unique_ptr<LocalRegion>> AllocateRegion(uint64_t bytes) override {
    return inner_->AllocateRegion(bytes);
  }
  Result<std::unique_ptr<LocalRegion>> RegisterRegion(void* data, uint64_t bytes) override {
    return inner_->RegisterRegion(data, bytes);
  }
  Status RegisterClient(uint16_t channel, MessageHandler on_message,
                        PeerFailureHandler on_peer_failure) override {
    return inner_->RegisterClient(channel, std::move(on_message), std::move(on_peer_failure));
  }
  void UnregisterClient(uint16_t channel) override { inner_->UnregisterClient(channel); }
  Status Submit(RmaKind kind, std::string_view peer, const RemoteRegionDesc& region,
                std::vector<RmaOp> ops, Deadline deadline, DoneCallback done) override {
    if (kind == RmaKind::kWrite && !ops.empty() && drop_writes_.fetch_sub(1) > 0) {
      ops.pop_back();
    }
    if (const int64_t ms = write_delay_ms_.load(); kind == RmaKind::kWrite && ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return inner_->Submit(kind, peer, region, std::move(ops), deadline, std::move(done));
  }
  Status SendMessage(std::string_view peer, uint16_t channel, std::string payload,
                     bool flush_writes_first, Deadline deadline, DoneCallback done) override {
    return inner_->SendMessage(peer, channel, std::move(payload), flush_writes_first, deadline,
                               std::move(done));
  }
  void Connect(std::string_view peer) override { inner_->Connect(peer); }
  void Disconnect(std::string_view peer) override { inner_->Disconnect(peer); }
  TransportStats Stats() const override { return inner_->Stats(); }

 private:
  Transport* const inner_;
  std::atomic<int> drop_writes_{0};
  std::atomic<int64_t> write_delay_ms_{0};
};

}  // namespace pdserve::kvtransfer::testing
