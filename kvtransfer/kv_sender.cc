#include "kvtransfer/kv_sender.h"

#include <fmt/format.h>

#include "common/logging.h"

namespace pdserve::kvtransfer {

namespace {
constexpr auto kMaxSleep = std::chrono::milliseconds(500);
// Finish waits this long past the deadline before declaring the transport stuck.
constexpr auto kStuckSlack = std::chrono::seconds(5);

int64_t UnixNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

struct KvSender::Request {
  enum class Phase { kWriting, kCompleting, kFailing, kDone };

  KvDescriptor desc;
  uint32_t rank = 0;
  KvSource source;
  std::vector<TokenRange> ranges;  // empty: this rank writes nothing
  Deadline deadline{};
  int64_t deadline_unix_ms = 0;  // the same deadline on the wall clock (sent to the decode side)
  std::vector<uint8_t> layer_queued;
  std::vector<uint64_t> layer_digest;
  uint32_t inflight = 0;
  uint64_t bytes = 0;
  uint64_t bytes_done = 0;
  Phase phase = Phase::kWriting;
  Status status;
  // What to tell the decode side once the writes drained after a failure.
  bool notice_pending = false;
  TransferMessage::Kind notice_kind = TransferMessage::Kind::kAbort;
};

Result<std::unique_ptr<KvSender>> KvSender::Create(Transport* transport) {
  if (transport == nullptr) return Status::InvalidArgument("KvSender needs a transport");
  auto sender = std::unique_ptr<KvSender>(new KvSender(transport));
  KvSender* self = sender.get();
  PDSERVE_RETURN_IF_ERROR(transport->RegisterClient(
      Transport::kChannelToPrefill,
      // Acks and aborts are cheap: handled right on the transport thread (one thread hop
      // less on the latency path).
      [self](std::string_view peer, std::string_view payload) {
        Result<TransferMessage> m = DecodeTransferMessage(payload);
        if (!m.ok()) {
          GetLogger("kvtransfer")->warn("dropping a malformed message: {}",
                                        m.status().ToString());
          return;
        }
        std::lock_guard<std::mutex> lock(self->mu_);
        self->HandleMessage(std::string(peer), m.value());
      },
      [self](std::string_view peer, const Status& status) {
        {
          std::lock_guard<std::mutex> lock(self->mu_);
          self->inbox_.push_back(Inbox{true, std::string(peer), {}, status});
        }
        self->cv_.notify_all();
      }));
  return sender;
}

KvSender::KvSender(Transport* transport) : transport_(transport) {
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

KvSender::~KvSender() {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, r] : requests_) ids.push_back(id);
  }
  for (uint64_t id : ids) Abort(id, Status::Cancelled("KV sender shutting down"));
  transport_->UnregisterClient(Transport::kChannelToPrefill);
  thread_.request_stop();
  thread_.join();
}

std::shared_ptr<KvSender::Request> KvSender::Find(uint64_t request_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(request_id);
  return it == requests_.end() ? nullptr : it->second;
}

Status KvSender::Start(const KvDescriptor& descriptor, uint32_t rank, KvSource source) {
  auto r = std::make_shared<Request>();
  r->desc = descriptor;
  r->rank = rank;
  r->source = std::move(source);
  Status valid = descriptor.Validate();
  if (valid.ok() && UnixNowMs() > descriptor.lease_expiry_unix_ms) {
    valid = Status::DeadlineExceeded(fmt::format(
        "descriptor of request {} arrived after its lease expired", descriptor.request_id));
  }
  const WriterAssignment* writer = valid.ok() ? descriptor.FindWriter(rank) : nullptr;
  if (writer != nullptr) {
    r->ranges = writer->ranges;
    valid = ValidateSource(r->source, descriptor.layout, r->ranges);
  }
  if (!valid.ok()) {
    // Nothing was written; let the decode side free the blocks now rather than at lease end.
    if (!descriptor.decode_address.empty()) {
      Send(*r, TransferMessage::Kind::kAbort, valid, false, nullptr);
    }
    GetLogger("kvtransfer")->warn("rejecting request {} (rank {}): {}", descriptor.request_id,
                                  rank, valid.ToString());
    return valid;
  }
  r->deadline = Clock::now() + std::chrono::milliseconds(descriptor.transfer_timeout_ms);
  r->deadline_unix_ms = UnixNowMs() + descriptor.transfer_timeout_ms;
  r->layer_queued.assign(descriptor.layout.num_layers, 0);
  r->layer_digest.assign(descriptor.layout.num_layers, 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (requests_.count(descriptor.request_id) > 0) {
      return Status::AlreadyExists(
          fmt::format("request {} is already being sent", descriptor.request_id));
    }
    requests_[descriptor.request_id] = r;
    stats_.active_requests++;
    wake_ = true;
  }
  cv_.notify_all();
  if (!r->ranges.empty()) Send(*r, TransferMessage::Kind::kBegin, Status::Ok(), false, nullptr);
  return Status::Ok();
}

Status KvSender::WriteLayers(uint64_t request_id, uint32_t first_layer, uint32_t num_layers) {
  std::shared_ptr<Request> r = Find(request_id);
  if (r == nullptr) {
    return Status::FailedPrecondition(fmt::format("request {} was not started", request_id));
  }
  return QueueLayers(r, first_layer, num_layers);
}

Status KvSender::QueueLayers(const std::shared_ptr<Request>& r, uint32_t first_layer,
                             uint32_t num_layers) {
  const uint32_t total = r->desc.layout.num_layers;
  if (first_layer >= total || num_layers > total - first_layer) {
    return Status::OutOfRange(fmt::format("layers [{}, {}) of a {}-layer layout", first_layer,
                                          first_layer + num_layers, total));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r->phase != Request::Phase::kWriting) {
      return r->status.ok() ? Status::FailedPrecondition("request is completing") : r->status;
    }
    for (uint32_t l = first_layer; l < first_layer + num_layers; ++l) {
      if (r->layer_queued[l]) {
        return Status::FailedPrecondition(fmt::format("layer {} was already written", l));
      }
    }
    for (uint32_t l = first_layer; l < first_layer + num_layers; ++l) r->layer_queued[l] = 1;
  }
  if (r->ranges.empty()) return Status::Ok();
  // Planning and hashing read only immutable request data: no lock.
  WritePlan plan = PlanWrites(r->source, r->desc, r->ranges, first_layer, num_layers);
  std::vector<uint64_t> digests(num_layers, 0);
  if (r->desc.verify_digest) {
    for (uint32_t i = 0; i < num_layers; ++i) {
      digests[i] = SourceLayerDigest(r->source, r->ranges, first_layer + i);
    }
  }
  std::vector<RmaOp> ops;
  ops.reserve(plan.writes.size());
  for (const PlannedWrite& w : plan.writes) {
    ops.push_back(RmaOp{const_cast<uint8_t*>(w.src), w.dst_address, w.length});
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r->phase != Request::Phase::kWriting) return r->status;
    for (uint32_t i = 0; i < num_layers; ++i) r->layer_digest[first_layer + i] = digests[i];
    r->inflight++;
    r->bytes += plan.bytes;
    stats_.inflight_batches++;
    stats_.bytes_submitted += plan.bytes;
    stats_.writes_submitted += ops.size();
  }
  Status submitted =
      transport_->Submit(RmaKind::kWrite, r->desc.decode_address, r->desc.region, std::move(ops),
                         r->deadline, [this, r, bytes = plan.bytes](const Status& status) { OnBatchDone(r, bytes, status); });
  if (!submitted.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    r->inflight--;
    stats_.inflight_batches--;
    Fail(*r, submitted);
    MaybeFinishFailure(*r);
    return submitted;
  }
  return Status::Ok();
}

void KvSender::OnBatchDone(const std::shared_ptr<Request>& r, uint64_t bytes, const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    r->inflight--;
    if (status.ok()) r->bytes_done += bytes;
    stats_.inflight_batches--;
    if (!status.ok()) Fail(*r, status);
    MaybeFinishFailure(*r);
  }
  done_cv_.notify_all();
}

Status KvSender::Finish(uint64_t request_id) {
  std::shared_ptr<Request> r = Find(request_id);
  if (r == nullptr) {
    return Status::FailedPrecondition(fmt::format("request {} was not started", request_id));
  }
  // Queue what the caller did not write yet (contiguous runs of missing layers).
  for (uint32_t l = 0; l < r->desc.layout.num_layers;) {
    bool queued;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued = r->layer_queued[l] != 0;
    }
    if (queued) {
      ++l;
      continue;
    }
    uint32_t end = l + 1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (end < r->desc.layout.num_layers && !r->layer_queued[end]) ++end;
    }
    if (!QueueLayers(r, l, end - l).ok()) break;
    l = end;
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (r->ranges.empty() && r->phase == Request::Phase::kWriting) {
    r->phase = Request::Phase::kDone;  // replica or empty slice: nothing to write
  }
  // Wait for the writes, then send the completion notice (after a flush).
  done_cv_.wait_until(lock, r->deadline + kStuckSlack,
                      [&] { return r->inflight == 0 || r->phase != Request::Phase::kWriting; });
  if (r->phase == Request::Phase::kWriting && r->inflight == 0) {
    r->phase = Request::Phase::kCompleting;
    TransferMessage m;
    m.request_id = r->desc.request_id;
    m.rank = r->rank;
    m.sender_address = transport_->address();
    m.kind = TransferMessage::Kind::kComplete;
    m.blocks_written = r->desc.CountBlocks(r->ranges);
    m.bytes_written = r->bytes;
    m.digest = r->desc.verify_digest ? CombineLayerDigests(r->layer_digest) : 0;
    m.deadline_unix_ms = r->deadline_unix_ms;
    lock.unlock();
    Status sent = transport_->SendMessage(
        r->desc.decode_address, Transport::kChannelToDecode, EncodeTransferMessage(m),
        /*flush_writes_first=*/true, r->deadline, [this, r](const Status& status) {
          if (status.ok()) return;
          {
            std::lock_guard<std::mutex> guard(mu_);
            Fail(*r, status.WithContext("sending the completion notice"));
            MaybeFinishFailure(*r);
          }
          done_cv_.notify_all();
        });
    lock.lock();
    if (!sent.ok()) {
      Fail(*r, sent);
      MaybeFinishFailure(*r);
    }
  }
  if (!done_cv_.wait_until(lock, r->deadline + kStuckSlack,
                           [&] { return r->phase == Request::Phase::kDone; })) {
    // The deadline machinery should have ended it long ago: report, never hang.
    GetLogger("kvtransfer")->error("request {}: transport did not finish in time",
                                   r->desc.request_id);
    r->status = Status::DeadlineExceeded("KV transfer did not terminate by its deadline");
    r->phase = Request::Phase::kDone;
  }
  Status result = r->status;
  if (requests_.erase(request_id) > 0) {
    stats_.active_requests--;
    (result.ok() ? stats_.completed : stats_.failed)++;
  }
  return result;
}

void KvSender::Abort(uint64_t request_id, const Status& reason) {
  std::shared_ptr<Request> r = Find(request_id);
  if (r == nullptr) return;
  std::unique_lock<std::mutex> lock(mu_);
  Fail(*r, reason.ok() ? Status::Aborted("aborted by the prefill side") : reason);
  MaybeFinishFailure(*r);
  done_cv_.wait_until(lock, r->deadline + kStuckSlack,
                      [&] { return r->phase == Request::Phase::kDone; });
  if (requests_.erase(request_id) > 0) {
    stats_.active_requests--;
    (r->status.ok() ? stats_.completed : stats_.failed)++;
  }
}

void KvSender::Fail(Request& r, const Status& status) {
  if (r.phase == Request::Phase::kFailing || r.phase == Request::Phase::kDone) return;
  const bool was_writing = !r.ranges.empty();
  r.phase = Request::Phase::kFailing;
  r.status = status;
  // A dead connection cannot carry a notice; otherwise tell the decode side we stopped.
  r.notice_pending = was_writing && status.code() != StatusCode::kUnavailable;
  r.notice_kind = TransferMessage::Kind::kAbort;
}

void KvSender::MaybeFinishFailure(Request& r) {
  if (r.phase != Request::Phase::kFailing || r.inflight > 0) return;
  r.phase = Request::Phase::kDone;
  const bool peer_suspect = r.status.code() == StatusCode::kUnavailable ||
                            r.status.code() == StatusCode::kDeadlineExceeded;
  bool peer_in_use = false;
  for (const auto& [id, other] : requests_) {
    if (other.get() != &r && other->phase != Request::Phase::kDone &&
        other->desc.decode_address == r.desc.decode_address) {
      peer_in_use = true;
    }
  }
  const std::string peer = r.desc.decode_address;
  Transport* transport = transport_;
  DoneCallback after = nullptr;
  if (peer_suspect && !peer_in_use) {
    after = [transport, peer](const Status&) { transport->Disconnect(peer); };
  }
  if (r.notice_pending) {
    r.notice_pending = false;
    Send(r, r.notice_kind, r.status, /*flush_writes_first=*/true, after);
  } else if (after) {
    after(Status::Ok());
  }
  done_cv_.notify_all();
}

void KvSender::Send(const Request& r, TransferMessage::Kind kind, const Status& status,
                    bool flush_writes_first, DoneCallback done) {
  TransferMessage m;
  m.request_id = r.desc.request_id;
  m.rank = r.rank;
  m.sender_address = transport_->address();
  m.kind = kind;
  m.status = status;
  m.deadline_unix_ms = r.deadline_unix_ms;
  // Notices about a failure get a short deadline of their own: they are best effort.
  const Deadline deadline = kind == TransferMessage::Kind::kBegin
                                ? r.deadline
                                : Clock::now() + std::chrono::seconds(2);
  Status sent = transport_->SendMessage(r.desc.decode_address, Transport::kChannelToDecode,
                                        EncodeTransferMessage(m), flush_writes_first, deadline,
                                        std::move(done));
  if (!sent.ok()) {
    GetLogger("kvtransfer")->warn("request {}: cannot send {}: {}", r.desc.request_id,
                                  TransferMessageKindName(kind), sent.ToString());
  }
}

void KvSender::HandleMessage(const std::string& peer, const TransferMessage& m) {
  auto it = requests_.find(m.request_id);
  if (it == requests_.end()) return;  // late message for a finished request
  Request& r = *it->second;
  if (r.desc.decode_address != peer || r.rank != m.rank) return;
  switch (m.kind) {
    case TransferMessage::Kind::kAck:
      if (r.phase == Request::Phase::kCompleting) {
        r.status = m.status.ok() ? Status::Ok()
                                 : m.status.WithContext("decode side rejected the transfer");
        r.phase = Request::Phase::kDone;
      }
      break;
    case TransferMessage::Kind::kAbort:
      if (r.phase == Request::Phase::kWriting || r.phase == Request::Phase::kCompleting) {
        Fail(r, m.status.WithContext("decode side aborted the transfer"));
        r.notice_pending = true;
        r.notice_kind = TransferMessage::Kind::kAck;  // confirm we stopped writing
        MaybeFinishFailure(r);
      }
      break;
    default:
      break;
  }
  done_cv_.notify_all();
}

void KvSender::Loop(std::stop_token stop) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop.stop_requested()) {
    Deadline next = Clock::now() + kMaxSleep;
    for (const auto& [id, r] : requests_) {
      if (r->phase != Request::Phase::kDone && r->phase != Request::Phase::kFailing) {
        next = std::min(next, r->deadline);
      }
    }
    cv_.wait_until(lock, stop, next, [&] { return !inbox_.empty() || wake_; });
    wake_ = false;
    while (!inbox_.empty()) {
      Inbox item = std::move(inbox_.front());
      inbox_.pop_front();
      if (item.is_failure) {
        for (auto& [id, r] : requests_) {
          if (r->desc.decode_address == item.peer) {
            Fail(*r, Status::Unavailable(fmt::format("decode worker failed: {}",
                                                     item.failure.ToString())));
            MaybeFinishFailure(*r);
          }
        }
        done_cv_.notify_all();
        continue;
      }
      Result<TransferMessage> m = DecodeTransferMessage(item.payload);
      if (!m.ok()) {
        GetLogger("kvtransfer")->warn("dropping a malformed message: {}", m.status().ToString());
        continue;
      }
      HandleMessage(item.peer, m.value());
    }
    const Deadline now = Clock::now();
    for (auto& [id, r] : requests_) {
      if ((r->phase == Request::Phase::kWriting || r->phase == Request::Phase::kCompleting) &&
          now >= r->deadline) {
        Fail(*r, Status::DeadlineExceeded(fmt::format(
                     "request {} rank {}: transfer not acknowledged within {} ms", id, r->rank,
                     r->desc.transfer_timeout_ms)));
        MaybeFinishFailure(*r);
        done_cv_.notify_all();
      }
    }
  }
}

Result<SenderProgress> KvSender::Progress(uint64_t request_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return Status::NotFound(fmt::format("request {} is not being sent", request_id));
  const Request& r = *it->second;
  SenderProgress p;
  for (uint8_t q : r.layer_queued) p.layers_queued += q;
  p.bytes_submitted = r.bytes;
  p.bytes_written = r.bytes_done;
  return p;
}

SenderStats KvSender::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace pdserve::kvtransfer
