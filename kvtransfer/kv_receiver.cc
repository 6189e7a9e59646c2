#include "kvtransfer/kv_receiver.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/logging.h"
#include "kvtransfer/transfer_plan.h"

namespace pdserve::kvtransfer {

namespace {
constexpr size_t kMaxFinishedRemembered = 4096;

int64_t UnixNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
constexpr auto kMaxSleep = std::chrono::milliseconds(500);
// Completions of at most this many bytes are verified on the transport thread.
constexpr uint64_t kInlineVerifyBytes = 1 << 20;
}  // namespace

struct KvReceiver::Writer {
  enum class Phase { kIdle, kWriting, kQuiet };
  uint32_t rank = 0;
  std::vector<TokenRange> ranges;
  Phase phase = Phase::kIdle;
  std::string address;  // known once it began
  Deadline deadline{};  // kWriting: begin + transfer_timeout
  bool verified = false;
};

struct KvReceiver::Request {
  KvDescriptor descriptor;
  TransferState state = TransferState::kReserved;
  Status status;
  Deadline lease_expiry{};
  Deadline quarantine_until{};  // kAborted: earliest release for writers that never began
  std::vector<Writer> writers;
  bool released = false;  // blocks gone (to the allocator or the caller); erase me
  int verifying = 0;      // a thread hashes its blocks without the lock: do not release
};

Result<std::unique_ptr<KvReceiver>> KvReceiver::Create(Transport* transport,
                                                       ReceiverBlockPool pool,
                                                       KvReceiverOptions options) {
  if (transport == nullptr || pool.region == nullptr || pool.allocator == nullptr) {
    return Status::InvalidArgument("KvReceiver needs a transport, a region and an allocator");
  }
  PDSERVE_RETURN_IF_ERROR(pool.layout.Validate());
  const uint64_t block_bytes = pool.layout.BlockBytes();
  const uint64_t blocks = pool.allocator->num_blocks();
  if (blocks != 0 && (block_bytes > (~0ull) / blocks ||
                      !RangeWithin(pool.first_block_offset, block_bytes * blocks, 0,
                                   pool.region->size()))) {
    return Status::InvalidArgument(fmt::format(
        "{} blocks of {} bytes from offset {} do not fit the {}-byte region", blocks,
        block_bytes, pool.first_block_offset, pool.region->size()));
  }
  auto receiver = std::unique_ptr<KvReceiver>(new KvReceiver(transport, pool, options));
  KvReceiver* self = receiver.get();
  PDSERVE_RETURN_IF_ERROR(transport->RegisterClient(
      Transport::kChannelToDecode,
      [self](std::string_view peer, std::string_view payload) { self->OnMessage(peer, payload); },
      [self](std::string_view peer, const Status& status) {
        {
          std::lock_guard<std::mutex> lock(self->mu_);
          self->inbox_.push_back(Inbox{true, std::string(peer), {}, status});
        }
        self->cv_.notify_all();
      }));
  return receiver;
}

KvReceiver::KvReceiver(Transport* transport, ReceiverBlockPool pool, KvReceiverOptions options)
    : transport_(transport), pool_(pool), options_(options) {
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

KvReceiver::~KvReceiver() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, r] : requests_) {
      AbortLocked(*r, Status::Cancelled("KV receiver shutting down"));
    }
    wake_ = true;
  }
  cv_.notify_all();
  const Deadline bound = Clock::now() + options_.transfer_timeout + 2 * options_.quarantine_grace;
  if (!WaitUntilIdle(bound).ok()) {
    GetLogger("kvtransfer")->error("KvReceiver: writers still unaccounted for at shutdown");
  }
  transport_->UnregisterClient(Transport::kChannelToDecode);
  thread_.request_stop();
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, r] : requests_) {
    if (!r->released && r->state != TransferState::kHandedOver) {
      pool_.allocator->Free(r->descriptor.block_ids);
    }
  }
}

Result<KvDescriptor> KvReceiver::Reserve(uint64_t request_id, uint32_t num_tokens,
                                         std::vector<WriterAssignment> writers,
                                         std::optional<std::chrono::milliseconds> lease,
                                         std::optional<std::chrono::milliseconds> timeout) {
  if (num_tokens == 0) return Status::InvalidArgument("a request needs at least one token");
  PDSERVE_RETURN_IF_ERROR(ValidateWriterAssignment(num_tokens, writers));
  const uint64_t num_blocks = pool_.layout.BlocksForTokens(num_tokens);
  if (num_blocks > pool_.allocator->num_blocks()) {
    return Status::ResourceExhausted(fmt::format("{} tokens need {} blocks, the pool has {}",
                                                 num_tokens, num_blocks,
                                                 pool_.allocator->num_blocks()));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (requests_.count(request_id) > 0) {
    return Status::AlreadyExists(fmt::format("request {} already holds blocks", request_id));
  }
  PDSERVE_ASSIGN_OR_RETURN(std::vector<uint32_t> blocks,
                           pool_.allocator->Allocate(static_cast<uint32_t>(num_blocks)));
  const std::chrono::milliseconds lease_ms = lease.value_or(options_.lease);
  auto r = std::make_unique<Request>();
  KvDescriptor& d = r->descriptor;
  d.request_id = request_id;
  d.decode_address = transport_->address();
  d.layout = pool_.layout;
  d.region = pool_.region->remote_desc();
  d.num_tokens = num_tokens;
  d.block_ids = std::move(blocks);
  const uint64_t base = d.region.base_address + pool_.first_block_offset;
  for (uint32_t id : d.block_ids) d.block_addresses.push_back(base + id * pool_.layout.BlockBytes());
  d.writers = std::move(writers);
  d.transfer_timeout_ms = static_cast<uint32_t>(timeout.value_or(options_.transfer_timeout).count());
  d.lease_expiry_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch() + lease_ms)
                               .count();
  d.verify_digest = options_.verify_digest;
  r->lease_expiry = Clock::now() + lease_ms;
  for (const WriterAssignment& w : d.writers) {
    Writer writer;
    writer.rank = w.rank;
    writer.ranges = w.ranges;
    r->writers.push_back(std::move(writer));
  }
  KvDescriptor copy = d;
  requests_[request_id] = std::move(r);
  wake_ = true;
  lock.unlock();
  cv_.notify_all();
  return copy;
}

Result<TransferState> KvReceiver::State(uint64_t request_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(request_id);
  if (it != requests_.end()) return it->second->state;
  for (const auto& [id, status] : finished_) {
    if (id == request_id) return status.ok() ? TransferState::kHandedOver : TransferState::kAborted;
  }
  return Status::NotFound(fmt::format("request {} is unknown", request_id));
}

Status KvReceiver::RequestStatus(uint64_t request_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(request_id);
  if (it != requests_.end()) return it->second->status;
  for (const auto& [id, status] : finished_) {
    if (id == request_id) return status;
  }
  return Status::NotFound(fmt::format("request {} is unknown", request_id));
}

std::vector<ReceiverEvent> KvReceiver::TakeEvents() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ReceiverEvent> out(events_.begin(), events_.end());
  events_.clear();
  return out;
}

bool KvReceiver::WaitForEvents(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return events_cv_.wait_until(lock, deadline, [&] { return !events_.empty(); });
}

Result<std::vector<uint32_t>> KvReceiver::HandOver(uint64_t request_id) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end() || it->second->released) {
    return Status::NotFound(fmt::format("request {} holds no blocks", request_id));
  }
  Request& r = *it->second;
  if (r.state != TransferState::kComplete) {
    return Status::FailedPrecondition(fmt::format("request {} is {}, not complete", request_id,
                                                  TransferStateName(r.state)));
  }
  SetState(r, TransferState::kHandedOver, Status::Ok());
  std::vector<uint32_t> blocks = r.descriptor.block_ids;
  RememberFinished(request_id, Status::Ok());
  requests_.erase(it);
  events_cv_.notify_all();
  return blocks;
}

Status KvReceiver::Abort(uint64_t request_id, const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(request_id);
    if (it == requests_.end() || IsTerminal(it->second->state)) {
      return Status::NotFound(fmt::format("request {} is not active", request_id));
    }
    AbortLocked(*it->second, reason.ok() ? Status::Aborted("aborted by the decode side") : reason);
    wake_ = true;
  }
  cv_.notify_all();
  return Status::Ok();
}

Status KvReceiver::WaitUntilIdle(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (events_cv_.wait_until(lock, deadline, [&] { return requests_.empty(); })) {
    return Status::Ok();
  }
  return Status::DeadlineExceeded(
      fmt::format("{} requests still hold KV blocks", requests_.size()));
}

ReceiverStats KvReceiver::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ReceiverStats s = stats_;
  for (const auto& [id, r] : requests_) {
    if (r->released) continue;
    s.active_requests++;
    s.held_blocks += static_cast<uint32_t>(r->descriptor.block_ids.size());
    if (r->state == TransferState::kAborted) {
      s.quarantined_blocks += static_cast<uint32_t>(r->descriptor.block_ids.size());
    }
  }
  return s;
}

void KvReceiver::Loop(std::stop_token stop) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop.stop_requested()) {
    cv_.wait_until(lock, stop, NextTimer(), [&] { return !inbox_.empty() || wake_; });
    wake_ = false;
    while (!inbox_.empty()) {
      Inbox item = std::move(inbox_.front());
      inbox_.pop_front();
      if (item.is_failure) {
        HandlePeerFailure(item.peer, item.failure);
        continue;
      }
      Result<TransferMessage> m = DecodeTransferMessage(item.payload);
      if (!m.ok()) {
        GetLogger("kvtransfer")->warn("dropping a malformed message from a peer: {}",
                                      m.status().ToString());
        continue;
      }
      HandleMessage(item.peer, m.value(), lock);
    }
    CheckTimers(Clock::now());
  }
}

void KvReceiver::OnMessage(std::string_view peer, std::string_view payload) {
  Result<TransferMessage> m = DecodeTransferMessage(payload);
  if (!m.ok()) {
    GetLogger("kvtransfer")->warn("dropping a malformed message from a peer: {}",
                                  m.status().ToString());
    return;
  }
  // Handled on the transport thread, except completions that need hashing many bytes: those
  // would stall the transport, and go to the service thread.
  const bool heavy = m->kind == TransferMessage::Kind::kComplete && options_.verify_digest &&
                     m->bytes_written > kInlineVerifyBytes;
  std::unique_lock<std::mutex> lock(mu_);
  if (heavy) {
    inbox_.push_back(Inbox{false, std::string(peer), std::string(payload), {}});
    lock.unlock();
    cv_.notify_all();
    return;
  }
  HandleMessage(std::string(peer), m.value(), lock);
}

void KvReceiver::HandleMessage(const std::string& peer, const TransferMessage& m,
                               std::unique_lock<std::mutex>& lock) {
  using Kind = TransferMessage::Kind;
  auto it = requests_.find(m.request_id);
  if (it == requests_.end() || it->second->released) {
    Status known = Status::NotFound(fmt::format("request {} is unknown", m.request_id));
    for (const auto& [id, status] : finished_) {
      if (id == m.request_id) {
        known = status.ok() ? Status::Aborted(fmt::format("request {} already handed over", id))
                            : status;
      }
    }
    if (m.kind == Kind::kBegin) Reply(peer, m.request_id, m.rank, Kind::kAbort, known);
    if (m.kind == Kind::kComplete) Reply(peer, m.request_id, m.rank, Kind::kAck, known);
    return;
  }
  Request& r = *it->second;
  Writer* w = nullptr;
  for (Writer& candidate : r.writers) {
    if (candidate.rank == m.rank) w = &candidate;
  }
  if (w == nullptr) {
    if (m.kind == Kind::kBegin || m.kind == Kind::kComplete) {
      Reply(peer, m.request_id, m.rank, m.kind == Kind::kBegin ? Kind::kAbort : Kind::kAck,
            Status::InvalidArgument(fmt::format("rank {} is not a writer of request {}", m.rank,
                                                m.request_id)));
    }
    return;
  }
  const Deadline now = Clock::now();
  if (w->phase == Writer::Phase::kIdle && (m.kind == Kind::kBegin || m.kind == Kind::kComplete)) {
    w->phase = Writer::Phase::kWriting;
    w->address = peer;
    const auto timeout = std::chrono::milliseconds(r.descriptor.transfer_timeout_ms);
    w->deadline = now + timeout;
    if (m.deadline_unix_ms > 0) {
      // The writer's own deadline, if earlier (e.g. its begin waited in a queue), less a
      // margin so that an accepted completion's ack reaches the writer before it gives up.
      const int64_t margin_ms = std::min<int64_t>(50, timeout.count() / 10);
      const int64_t left_ms = m.deadline_unix_ms - UnixNowMs() - margin_ms;
      w->deadline = std::min(w->deadline, now + std::chrono::milliseconds(left_ms));
    }
    transport_->Connect(peer);  // so that its death is reported
    if (r.state == TransferState::kReserved) SetState(r, TransferState::kWriting, Status::Ok());
  }
  switch (m.kind) {
    case Kind::kBegin:
      if (r.state == TransferState::kAborted) Reply(peer, r.descriptor.request_id, m.rank, Kind::kAbort, r.status);
      break;
    case Kind::kComplete: {
      if (w->verified || r.state == TransferState::kComplete) break;  // duplicate
      w->phase = Writer::Phase::kQuiet;  // it wrote all it will write
      if (now >= w->deadline && r.state != TransferState::kAborted) {
        // Too late: the writer has given up by now (its deadline is never later than ours),
        // so both sides must agree that this transfer failed.
        AbortLocked(r, Status::DeadlineExceeded(fmt::format(
                           "completion of rank {} arrived after its deadline", m.rank)));
      }
      if (r.state == TransferState::kAborted) {
        Reply(peer, m.request_id, m.rank, Kind::kAck, r.status);
        ReleaseIfQuiet(r, now);
        break;
      }
      // Hash outside the lock; `verifying` keeps the request (and its blocks) from being
      // released meanwhile, and nobody writes the blocks of this writer any more.
      r.verifying++;
      lock.unlock();
      Status verdict = Verify(r, *w, m);
      lock.lock();
      r.verifying--;
      if (r.state == TransferState::kAborted) {
        Reply(peer, m.request_id, m.rank, Kind::kAck, r.status);
        ReleaseIfQuiet(r, Clock::now());
        break;
      }
      Reply(peer, m.request_id, m.rank, Kind::kAck, verdict);
      if (!verdict.ok()) {
        stats_.digest_failures++;
        AbortLocked(r, verdict);
        break;
      }
      w->verified = true;
      if (std::all_of(r.writers.begin(), r.writers.end(),
                      [](const Writer& x) { return x.verified; })) {
        SetState(r, TransferState::kComplete, Status::Ok());
      }
      break;
    }
    case Kind::kAbort:
      w->phase = Writer::Phase::kQuiet;  // a writer flushes before it sends `abort`
      // Also when kComplete: the writer reports failure (e.g. our ack reached it too late),
      // and both sides must agree while the blocks are still ours.
      if (r.state == TransferState::kReserved || r.state == TransferState::kWriting ||
          r.state == TransferState::kComplete) {
        AbortLocked(r, m.status.WithContext(fmt::format("prefill rank {}", m.rank)));
      } else {
        ReleaseIfQuiet(r, now);
      }
      break;
    case Kind::kAck:  // the writer stopped after our abort
      w->phase = Writer::Phase::kQuiet;
      ReleaseIfQuiet(r, now);
      break;
  }
}

void KvReceiver::HandlePeerFailure(const std::string& peer, const Status& status) {
  const Deadline now = Clock::now();
  for (auto& [id, r] : requests_) {
    if (r->released) continue;
    bool affected = false;
    for (Writer& w : r->writers) {
      if (w.phase == Writer::Phase::kWriting && w.address == peer) {
        w.phase = Writer::Phase::kQuiet;  // its connection is gone: it cannot write any more
        affected = true;
      }
    }
    if (!affected) continue;
    if (r->state == TransferState::kReserved || r->state == TransferState::kWriting) {
      AbortLocked(*r, Status::Unavailable(fmt::format("prefill writer {} failed: {}",
                                                      PeerName(peer), status.ToString())));
    } else {
      ReleaseIfQuiet(*r, now);
    }
  }
}

Status KvReceiver::Verify(const Request& r, const Writer& w, const TransferMessage& m) {
  const KvDescriptor& d = r.descriptor;
  const uint64_t bytes = BytesForRanges(d.layout, w.ranges);
  const uint32_t blocks = d.CountBlocks(w.ranges);
  if (m.bytes_written != bytes || m.blocks_written != blocks) {
    return Status::DataLoss(fmt::format(
        "request {} rank {}: completion reports {} bytes in {} blocks, expected {} in {}",
        d.request_id, w.rank, m.bytes_written, m.blocks_written, bytes, blocks));
  }
  if (!d.verify_digest) return Status::Ok();
  std::vector<uint64_t> layers(d.layout.num_layers);
  for (uint32_t l = 0; l < d.layout.num_layers; ++l) {
    layers[l] = DestinationLayerDigest(d, pool_.region->data(), w.ranges, l);
  }
  const uint64_t digest = CombineLayerDigests(layers);
  if (digest != m.digest) {
    return Status::DataLoss(fmt::format(
        "request {} rank {}: digest {:016x} of the received KV does not match the sender's "
        "{:016x} (torn or partial transfer)",
        d.request_id, w.rank, digest, m.digest));
  }
  return Status::Ok();
}

void KvReceiver::SetState(Request& r, TransferState state, const Status& status) {
  PDSERVE_CHECK(IsValidTransition(r.state, state), "invalid KV request state transition");
  GetLogger("kvtransfer")->debug("request {}: {} -> {} {}", r.descriptor.request_id,
                                 TransferStateName(r.state), TransferStateName(state),
                                 status.ToString());
  r.state = state;
  r.status = status;
  if (state == TransferState::kComplete || state == TransferState::kAborted) {
    (state == TransferState::kComplete ? stats_.completed : stats_.aborted)++;
    events_.push_back(ReceiverEvent{r.descriptor.request_id, state, status});
    events_cv_.notify_all();
  }
}

void KvReceiver::AbortLocked(Request& r, const Status& status) {
  if (IsTerminal(r.state)) return;
  SetState(r, TransferState::kAborted, status);
  const Deadline now = Clock::now();
  r.quarantine_until = now + options_.quarantine_grace;
  for (Writer& w : r.writers) {
    if (w.phase == Writer::Phase::kWriting) {
      Reply(w.address, r.descriptor.request_id, w.rank, TransferMessage::Kind::kAbort, status);
    }
  }
  ReleaseIfQuiet(r, now);
}

void KvReceiver::ReleaseIfQuiet(Request& r, Deadline now) {
  if (r.state != TransferState::kAborted || r.released || r.verifying > 0) return;
  for (const Writer& w : r.writers) {
    switch (w.phase) {
      case Writer::Phase::kQuiet:
        break;
      case Writer::Phase::kIdle:
        if (now < r.quarantine_until) return;
        break;
      case Writer::Phase::kWriting:
        // It stops writing by its own deadline at the latest.
        if (now < std::max(r.quarantine_until, w.deadline + options_.quarantine_grace)) return;
        break;
    }
  }
  pool_.allocator->Free(r.descriptor.block_ids);
  r.released = true;
  RememberFinished(r.descriptor.request_id, r.status);
}

void KvReceiver::CheckTimers(Deadline now) {
  for (auto& [id, rp] : requests_) {
    Request& r = *rp;
    if (r.released) continue;
    if (r.state == TransferState::kReserved || r.state == TransferState::kWriting) {
      for (const Writer& w : r.writers) {
        if (w.phase == Writer::Phase::kIdle && now >= r.lease_expiry) {
          AbortLocked(r, Status::Aborted(fmt::format(
                             "lease of request {} expired before prefill rank {} began", id,
                             w.rank)));
          break;
        }
        if (w.phase == Writer::Phase::kWriting && now >= w.deadline) {
          AbortLocked(r, Status::DeadlineExceeded(fmt::format(
                             "prefill rank {} did not complete request {} within {} ms", w.rank,
                             id, r.descriptor.transfer_timeout_ms)));
          break;
        }
      }
    }
    ReleaseIfQuiet(r, now);
  }
  bool erased = false;
  for (auto it = requests_.begin(); it != requests_.end();) {
    if (it->second->released) {
      it = requests_.erase(it);
      erased = true;
    } else {
      ++it;
    }
  }
  if (erased) events_cv_.notify_all();
}

Deadline KvReceiver::NextTimer() const {
  const Deadline now = Clock::now();
  Deadline next = now + kMaxSleep;
  for (const auto& [id, r] : requests_) {
    if (r->released) return now;
    switch (r->state) {
      case TransferState::kReserved:
      case TransferState::kWriting:
        for (const Writer& w : r->writers) {
          next = std::min(next, w.phase == Writer::Phase::kWriting ? w.deadline : r->lease_expiry);
        }
        break;
      case TransferState::kAborted:
        next = std::min(next, r->quarantine_until);
        for (const Writer& w : r->writers) {
          if (w.phase == Writer::Phase::kWriting) {
            next = std::min(next, std::max(r->quarantine_until,
                                           w.deadline + options_.quarantine_grace));
          }
        }
        break;
      default:
        break;
    }
  }
  return next;
}

void KvReceiver::Reply(const std::string& peer, uint64_t request_id, uint32_t rank,
                       TransferMessage::Kind kind, const Status& status) {
  if (peer.empty()) return;
  TransferMessage m;
  m.request_id = request_id;
  m.rank = rank;
  m.sender_address = transport_->address();
  m.kind = kind;
  m.status = status;
  Status sent = transport_->SendMessage(peer, Transport::kChannelToPrefill,
                                        EncodeTransferMessage(m), /*flush_writes_first=*/false,
                                        Clock::now() + options_.transfer_timeout, nullptr);
  if (!sent.ok()) {
    GetLogger("kvtransfer")->warn("cannot send {} to {}: {}", TransferMessageKindName(kind),
                                  PeerName(peer), sent.ToString());
  }
}

void KvReceiver::RememberFinished(uint64_t request_id, const Status& status) {
  finished_.emplace_back(request_id, status);
  if (finished_.size() > kMaxFinishedRemembered) finished_.pop_front();
}

}  // namespace pdserve::kvtransfer
