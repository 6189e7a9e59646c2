#include "kvtransfer/testing/inproc_transport.h"

#include <cstring>
#include <future>

#include <fmt/format.h>

namespace pdserve::kvtransfer::testing {

// One transport as seen by the others: its registered memory and a way to reach its thread.
struct InProcFabric::Node {
  std::mutex mu;
  bool alive = true;
  std::map<uint64_t, std::pair<uint8_t*, uint64_t>> regions;  // id -> (data, size)
  uint64_t next_region = 1;
  InProcTransport* owner = nullptr;
};

std::shared_ptr<InProcFabric::Node> InProcFabric::Find(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(address);
  return it == nodes_.end() ? nullptr : it->second.lock();
}

class InProcTransport::Region final : public LocalRegion {
 public:
  Region(InProcTransport* owner, uint64_t id, uint8_t* data, uint64_t size,
         std::unique_ptr<uint8_t[]> storage)
      : owner_(owner), id_(id), storage_(std::move(storage)) {
    desc_.base_address = reinterpret_cast<uint64_t>(data);
    desc_.length = size;
    desc_.packed_key.assign(reinterpret_cast<const char*>(&id_), sizeof(id_));
  }
  ~Region() override { owner_->UnregisterRegion(id_); }
  uint8_t* data() const override { return reinterpret_cast<uint8_t*>(desc_.base_address); }
  uint64_t size() const override { return desc_.length; }
  const RemoteRegionDesc& remote_desc() const override { return desc_; }

 private:
  InProcTransport* const owner_;
  const uint64_t id_;
  std::unique_ptr<uint8_t[]> storage_;
  RemoteRegionDesc desc_;
};

Result<std::unique_ptr<InProcTransport>> InProcTransport::Create(
    std::shared_ptr<InProcFabric> fabric) {
  auto node = std::make_shared<InProcFabric::Node>();
  std::string address;
  {
    std::lock_guard<std::mutex> lock(fabric->mu_);
    address = fmt::format("inproc:{}", fabric->next_id_++);
    fabric->nodes_[address] = node;
  }
  auto transport = std::unique_ptr<InProcTransport>(new InProcTransport(fabric, node, address));
  {
    std::lock_guard<std::mutex> lock(node->mu);
    node->owner = transport.get();
  }
  return transport;
}

InProcTransport::InProcTransport(std::shared_ptr<InProcFabric> fabric,
                                 std::shared_ptr<InProcFabric::Node> node, std::string address)
    : fabric_(std::move(fabric)), node_(std::move(node)), address_(std::move(address)) {
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

InProcTransport::~InProcTransport() {
  {
    std::lock_guard<std::mutex> lock(node_->mu);
    node_->alive = false;
    node_->owner = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(fabric_->mu_);
    fabric_->nodes_.erase(address_);
  }
  thread_.request_stop();
  thread_.join();
}

void InProcTransport::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void InProcTransport::Loop(std::stop_token stop) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto ready = [&] {
      return !tasks_.empty() || (!held_.empty() && !hold_writes_) || stop.stop_requested();
    };
    if (!held_.empty()) {
      Deadline earliest = held_.front().deadline;
      for (const Batch& b : held_) earliest = std::min(earliest, b.deadline);
      cv_.wait_until(lock, stop, earliest, ready);
    } else {
      cv_.wait(lock, stop, ready);
    }
    const bool stopping = stop.stop_requested();
    if (stopping) killed_ = true;
    std::deque<std::function<void()>> tasks;
    tasks.swap(tasks_);
    std::deque<Batch> batches;
    const bool hold = hold_writes_ && !killed_;
    if (!hold) batches.swap(held_);
    lock.unlock();
    for (auto& task : tasks) task();
    for (Batch& b : batches) RunBatch(b);
    lock.lock();
    const Deadline now = Clock::now();
    std::deque<Batch> expired;
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->deadline <= now) {
        expired.push_back(std::move(*it));
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
    if (!expired.empty()) {
      lock.unlock();
      for (Batch& b : expired) {
        {
          std::lock_guard<std::mutex> guard(mu_);
          stats_.pending_batches--;
        }
        b.done(Status::DeadlineExceeded(
            fmt::format("inproc RMA batch to {} still held at its deadline", b.peer)));
      }
      lock.lock();
    }
    if (stopping && tasks_.empty() && held_.empty()) return;
  }
}

void InProcTransport::RunBatch(Batch& batch) {
  Status status;
  uint64_t bytes = 0;
  bool killed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    killed = killed_;
    if (!killed && batch.kind == RmaKind::kWrite && hold_writes_) {
      held_.push_back(std::move(batch));
      return;
    }
  }
  std::shared_ptr<InProcFabric::Node> target = killed ? nullptr : fabric_->Find(batch.peer);
  if (killed) {
    status = Status::Cancelled("inproc transport shut down or killed");
  } else if (target == nullptr) {
    status = Status::Unavailable(fmt::format("inproc peer {} is gone", batch.peer));
  } else {
    std::lock_guard<std::mutex> lock(target->mu);
    uint64_t id = 0;
    if (!target->alive) {
      status = Status::Unavailable(fmt::format("inproc peer {} is dead", batch.peer));
    } else if (batch.region.packed_key.size() != sizeof(id)) {
      status = Status::InvalidArgument("malformed inproc region key");
    } else {
      std::memcpy(&id, batch.region.packed_key.data(), sizeof(id));
      auto it = target->regions.find(id);
      if (it == target->regions.end()) {
        status = Status::InvalidArgument(fmt::format("peer {} has no region {}", batch.peer, id));
      } else {
        const uint64_t base = reinterpret_cast<uint64_t>(it->second.first);
        for (const RmaOp& op : batch.ops) {
          if (!RangeWithin(op.remote_address, op.length, base, it->second.second)) {
            status = Status::InvalidArgument("RMA outside the peer's registered region");
            break;
          }
          auto* remote = reinterpret_cast<uint8_t*>(op.remote_address);
          if (batch.kind == RmaKind::kWrite) {
            std::memcpy(remote, op.local, op.length);
          } else {
            std::memcpy(op.local, remote, op.length);
          }
          bytes += op.length;
        }
      }
    }
  }
  if (status.code() == StatusCode::kUnavailable) FailPeer(batch.peer, status);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.pending_batches--;
    (batch.kind == RmaKind::kWrite ? stats_.bytes_written : stats_.bytes_read) += bytes;
    if (status.ok()) {
      if (peers_.insert(batch.peer).second) stats_.peers++, stats_.remote_keys++;
    }
  }
  batch.done(status);
}

void InProcTransport::FailPeer(const std::string& peer, const Status& status) {
  std::vector<PeerFailureHandler> handlers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (peers_.erase(peer) > 0) stats_.peers--, stats_.remote_keys--;
    for (const Client& c : clients_) {
      if (c.on_peer_failure) handlers.push_back(c.on_peer_failure);
    }
  }
  for (auto& h : handlers) h(peer, status);
}

void InProcTransport::Deliver(uint16_t channel, std::string sender, std::string payload) {
  MessageHandler handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (killed_) return;
    stats_.messages_received++;
    handler = clients_[channel].on_message;
  }
  if (handler) handler(sender, payload);
}

Result<std::unique_ptr<LocalRegion>> InProcTransport::AllocateRegion(uint64_t bytes) {
  auto storage = std::unique_ptr<uint8_t[]>(new (std::nothrow) uint8_t[bytes]());  // zeroed
  if (!storage) return Status::ResourceExhausted(fmt::format("cannot allocate {} bytes", bytes));
  uint8_t* data = storage.get();
  std::lock_guard<std::mutex> lock(node_->mu);
  const uint64_t id = node_->next_region++;
  node_->regions[id] = {data, bytes};
  std::lock_guard<std::mutex> guard(mu_);
  stats_.registered_regions++;
  return std::unique_ptr<LocalRegion>(new Region(this, id, data, bytes, std::move(storage)));
}

Result<std::unique_ptr<LocalRegion>> InProcTransport::RegisterRegion(void* data, uint64_t bytes) {
  if (data == nullptr) return Status::InvalidArgument("null region");
  std::lock_guard<std::mutex> lock(node_->mu);
  const uint64_t id = node_->next_region++;
  node_->regions[id] = {static_cast<uint8_t*>(data), bytes};
  std::lock_guard<std::mutex> guard(mu_);
  stats_.registered_regions++;
  return std::unique_ptr<LocalRegion>(
      new Region(this, id, static_cast<uint8_t*>(data), bytes, nullptr));
}

void InProcTransport::UnregisterRegion(uint64_t id) {
  std::lock_guard<std::mutex> lock(node_->mu);
  node_->regions.erase(id);
  std::lock_guard<std::mutex> guard(mu_);
  stats_.registered_regions--;
}

Status InProcTransport::RegisterClient(uint16_t channel, MessageHandler on_message,
                                       PeerFailureHandler on_peer_failure) {
  if (channel >= kMaxChannels) return Status::InvalidArgument("channel out of range");
  std::lock_guard<std::mutex> lock(mu_);
  clients_[channel] = Client{std::move(on_message), std::move(on_peer_failure)};
  return Status::Ok();
}

void InProcTransport::UnregisterClient(uint16_t channel) {
  if (channel >= kMaxChannels) return;
  if (std::this_thread::get_id() == thread_.get_id()) {
    std::lock_guard<std::mutex> lock(mu_);
    clients_[channel] = Client{};
    return;
  }
  std::promise<void> done;
  Post([&] {
    std::lock_guard<std::mutex> lock(mu_);
    clients_[channel] = Client{};
    done.set_value();
  });
  done.get_future().wait();
}

Status InProcTransport::Submit(RmaKind kind, std::string_view peer,
                               const RemoteRegionDesc& region, std::vector<RmaOp> ops,
                               Deadline deadline, DoneCallback done) {
  for (const RmaOp& op : ops) {
    if (!RangeWithin(op.remote_address, op.length, region.base_address, region.length)) {
      return Status::InvalidArgument(fmt::format(
          "RMA {:#x}+{} is outside the region {:#x}+{}", op.remote_address, op.length,
          region.base_address, region.length));
    }
    if (op.local == nullptr && op.length > 0) return Status::InvalidArgument("null local buffer");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.pending_batches++;
  }
  auto batch = std::make_shared<Batch>(
      Batch{kind, std::string(peer), region, std::move(ops), deadline, std::move(done)});
  Post([this, batch] { RunBatch(*batch); });
  return Status::Ok();
}

Status InProcTransport::SendMessage(std::string_view peer, uint16_t channel, std::string payload,
                                    bool flush_writes_first, Deadline deadline,
                                    DoneCallback done) {
  if (channel >= kMaxChannels) return Status::InvalidArgument("channel out of range");
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.pending_messages++;
  }
  // Writes run in submission order on this thread and complete synchronously, so a message
  // queued after them is always flushed.
  Post([this, peer = std::string(peer), channel, payload = std::move(payload),
        done = std::move(done)]() mutable {
    Status status;
    bool killed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      killed = killed_;
    }
    std::shared_ptr<InProcFabric::Node> target = killed ? nullptr : fabric_->Find(peer);
    if (killed) {
      status = Status::Cancelled("inproc transport shut down or killed");
    } else if (target == nullptr) {
      status = Status::Unavailable(fmt::format("inproc peer {} is gone", peer));
    } else {
      std::lock_guard<std::mutex> lock(target->mu);
      if (!target->alive || target->owner == nullptr) {
        status = Status::Unavailable(fmt::format("inproc peer {} is dead", peer));
      } else {
        InProcTransport* owner = target->owner;
        owner->Post([owner, channel, sender = address_, payload = std::move(payload)]() mutable {
          owner->Deliver(channel, std::move(sender), std::move(payload));
        });
      }
    }
    if (status.code() == StatusCode::kUnavailable) FailPeer(peer, status);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.pending_messages--;
      if (status.ok()) stats_.messages_sent++;
    }
    if (done) done(status);
  });
  return Status::Ok();
}

void InProcTransport::Connect(std::string_view peer) {
  Post([this, peer = std::string(peer)] {
    std::shared_ptr<InProcFabric::Node> target = fabric_->Find(peer);
    bool alive = false;
    if (target != nullptr) {
      std::lock_guard<std::mutex> lock(target->mu);
      alive = target->alive;
    }
    if (!alive) {
      FailPeer(peer, Status::Unavailable(fmt::format("inproc peer {} is gone", peer)));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (peers_.insert(peer).second) stats_.peers++, stats_.remote_keys++;
  });
}

void InProcTransport::Disconnect(std::string_view peer) {
  Post([this, peer = std::string(peer)] {
    std::lock_guard<std::mutex> lock(mu_);
    if (peers_.erase(peer) > 0) stats_.peers--, stats_.remote_keys--;
  });
}

TransportStats InProcTransport::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void InProcTransport::Kill() {
  {
    std::lock_guard<std::mutex> lock(node_->mu);
    node_->alive = false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    killed_ = true;
  }
  cv_.notify_all();
}

void InProcTransport::HoldWrites(bool hold) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    hold_writes_ = hold;
  }
  cv_.notify_all();
}

}  // namespace pdserve::kvtransfer::testing
