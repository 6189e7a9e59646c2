#include "kvtransfer/ucx/ucx_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>

#include <fmt/format.h>

#include "common/logging.h"
#include "kvtransfer/ucx/ucx_status.h"
#include "kvtransfer/ucx/ucx_transport_internal.h"

namespace pdserve::kvtransfer {

namespace {
constexpr auto kCloseGiveUp = std::chrono::seconds(2);
constexpr auto kMaxSleep = std::chrono::milliseconds(100);

// Envelope of every active message: [u32 little-endian address length][address][payload].
std::string MakeEnvelope(const std::string& address, const std::string& payload) {
  std::string out(4 + address.size() + payload.size(), '\0');
  const uint32_t n = static_cast<uint32_t>(address.size());
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 4, address.data(), address.size());
  std::memcpy(out.data() + 4 + address.size(), payload.data(), payload.size());
  return out;
}
}  // namespace

std::string ShortAddress(const std::string& address) { return PeerName(address); }

class UcxTransport::Region final : public LocalRegion {
 public:
  Region(UcxTransport* owner, uint64_t id, const RegisteredRegion& registered)
      : owner_(owner), id_(id) {
    desc_.base_address = reinterpret_cast<uint64_t>(registered.data());
    desc_.length = registered.size();
    desc_.packed_key = registered.packed_key();
  }
  ~Region() override {
    owner_->RunSync([this] {
      owner_->regions_.erase(id_);
      owner_->counters_.registered_regions--;
    });
  }
  uint8_t* data() const override { return reinterpret_cast<uint8_t*>(desc_.base_address); }
  uint64_t size() const override { return desc_.length; }
  const RemoteRegionDesc& remote_desc() const override { return desc_; }

 private:
  UcxTransport* const owner_;
  const uint64_t id_;
  RemoteRegionDesc desc_;
};

// ---------------------------------------------------------------------------------------------
// Creation and the public (any-thread) API.

Result<std::unique_ptr<UcxTransport>> UcxTransport::Create(const UcxTransportOptions& options) {
  if (options.max_chunk_bytes == 0 || options.max_inflight_ops == 0) {
    return Status::InvalidArgument("max_chunk_bytes and max_inflight_ops must be positive");
  }
  // UCX 1.13's tcp transport connects a new endpoint with a blocking connect() on the I/O
  // thread: to a host that stopped answering (a cut link: no reset, ARP fails) that holds every
  // peer's transfers for the ARP timeout (3 s), again for each endpoint tried. Non-blocking
  // connects (unless UCX_TCP_CONN_NB says otherwise) keep the other peers moving
  // (tests/multihost DecodeHostCutOffMidTransferRetriesExactly).
  // (A transport-level setting: ucp_config_modify takes it without the TCP_ prefix.)
  UcxContextOptions context_options = options.context;
  if (std::getenv("UCX_TCP_CONN_NB") == nullptr) context_options.defaults.emplace("CONN_NB", "y");
  PDSERVE_ASSIGN_OR_RETURN(std::unique_ptr<UcxContext> context, UcxContext::Create(context_options));
  PDSERVE_ASSIGN_OR_RETURN(std::unique_ptr<UcxWorker> worker, UcxWorker::Create(context.get()));
  const int event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (event_fd < 0 || epoll_fd < 0) {
    if (event_fd >= 0) close(event_fd);
    if (epoll_fd >= 0) close(epoll_fd);
    return Status::Internal("cannot create the UCX transport's eventfd / epoll");
  }
  for (int fd : {worker->event_fd(), event_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(event_fd);
      close(epoll_fd);
      return Status::Internal("epoll_ctl on the UCX worker fd failed");
    }
  }
  return std::unique_ptr<UcxTransport>(
      new UcxTransport(options, std::move(context), std::move(worker), event_fd, epoll_fd));
}

UcxTransport::UcxTransport(const UcxTransportOptions& options, std::unique_ptr<UcxContext> context,
                           std::unique_ptr<UcxWorker> worker, int event_fd, int epoll_fd)
    : options_(options),
      context_(std::move(context)),
      worker_(std::move(worker)),
      address_(worker_->address()),
      event_fd_(event_fd),
      epoll_fd_(epoll_fd) {
  // Active-message handlers, one per channel; registered before the I/O thread starts.
  static_assert(kMaxChannels <= 16);
  for (uint16_t channel = 0; channel < kMaxChannels; ++channel) {
    ucp_am_handler_param_t param{};
    param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    param.id = channel;
    param.cb = &UcxTransport::OnAmReceived;
    am_args_[channel] = AmArg{this, channel};
    param.arg = &am_args_[channel];
    param.flags = UCP_AM_FLAG_WHOLE_MSG;
    ucs_status_t status = ucp_worker_set_am_recv_handler(worker_->get(), &param);
    PDSERVE_CHECK(status == UCS_OK, "ucp_worker_set_am_recv_handler failed");
  }
  ucp_am_handler_param_t write_param{};
  write_param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                           UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  write_param.id = kAmWriteId;
  write_param.cb = &UcxTransport::OnAmWrite;
  write_param.arg = this;
  write_param.flags = UCP_AM_FLAG_WHOLE_MSG;
  PDSERVE_CHECK(ucp_worker_set_am_recv_handler(worker_->get(), &write_param) == UCS_OK,
                "ucp_worker_set_am_recv_handler failed");
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

UcxTransport::~UcxTransport() {
  thread_.request_stop();
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(event_fd_, &one, sizeof(one));
  thread_.join();
  PDSERVE_CHECK(regions_.empty(), "a LocalRegion outlived its UcxTransport");
  peers_.clear();
  worker_.reset();
  context_.reset();
  close(event_fd_);
  close(epoll_fd_);
}

void UcxTransport::Post(std::function<void()> command) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(command));
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(event_fd_, &one, sizeof(one));
}

void UcxTransport::RunSync(const std::function<void()>& fn) {
  if (std::this_thread::get_id() == io_thread_id_) {
    fn();
    return;
  }
  std::promise<void> done;
  Post([&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

Result<std::unique_ptr<LocalRegion>> UcxTransport::AllocateRegion(uint64_t bytes) {
  Result<std::unique_ptr<LocalRegion>> result = Status::Internal("not run");
  RunSync([&] {
    auto registered = RegisteredRegion::Allocate(context_.get(), bytes);
    if (!registered.ok()) {
      result = registered.status();
      return;
    }
    const uint64_t id = next_region_id_++;
    auto region = std::make_unique<Region>(this, id, *registered.value());
    regions_[id] = std::move(registered).value();
    counters_.registered_regions++;
    result = std::unique_ptr<LocalRegion>(std::move(region));
  });
  return result;
}

Result<std::unique_ptr<LocalRegion>> UcxTransport::RegisterRegion(void* data, uint64_t bytes) {
  Result<std::unique_ptr<LocalRegion>> result = Status::Internal("not run");
  RunSync([&] {
    auto registered = RegisteredRegion::Register(context_.get(), data, bytes);
    if (!registered.ok()) {
      result = registered.status();
      return;
    }
    const uint64_t id = next_region_id_++;
    auto region = std::make_unique<Region>(this, id, *registered.value());
    regions_[id] = std::move(registered).value();
    counters_.registered_regions++;
    result = std::unique_ptr<LocalRegion>(std::move(region));
  });
  return result;
}

Status UcxTransport::RegisterClient(uint16_t channel, MessageHandler on_message,
                                    PeerFailureHandler on_peer_failure) {
  if (channel >= kMaxChannels) return Status::InvalidArgument("channel out of range");
  RunSync([&] { clients_[channel] = Client{std::move(on_message), std::move(on_peer_failure)}; });
  return Status::Ok();
}

void UcxTransport::UnregisterClient(uint16_t channel) {
  if (channel >= kMaxChannels) return;
  RunSync([&] { clients_[channel] = Client{}; });
}

Status UcxTransport::Submit(RmaKind kind, std::string_view peer, const RemoteRegionDesc& region,
                            std::vector<RmaOp> ops, Deadline deadline, DoneCallback done) {
  for (const RmaOp& op : ops) {
    if (!RangeWithin(op.remote_address, op.length, region.base_address, region.length)) {
      return Status::InvalidArgument(fmt::format(
          "RMA {:#x}+{} is outside the remote region {:#x}+{}", op.remote_address, op.length,
          region.base_address, region.length));
    }
    if (op.local == nullptr && op.length > 0) return Status::InvalidArgument("null local buffer");
  }
  if (region.packed_key.empty()) return Status::InvalidArgument("remote region without a key");
  auto batch = std::make_shared<Batch>();
  batch->kind = kind;
  batch->region = region;
  batch->ops = std::move(ops);
  batch->deadline = deadline;
  batch->done = std::move(done);
  counters_.pending_batches++;
  Post([this, batch, address = std::string(peer)] {
    Status error;
    std::shared_ptr<Peer> p = GetPeer(address, &error);
    active_batches_.push_back(batch);
    if (p == nullptr) {
      batch->status = error;
      FinishBatchIfDone(batch);
      return;
    }
    batch->peer = p;
    p->batches_submitted++;
    p->queue.push_back(batch);
  });
  return Status::Ok();
}

Status UcxTransport::SendMessage(std::string_view peer, uint16_t channel, std::string payload,
                                 bool flush_writes_first, Deadline deadline, DoneCallback done) {
  if (channel >= kMaxChannels) return Status::InvalidArgument("channel out of range");
  auto message = std::make_shared<Message>();
  message->channel = channel;
  message->envelope = MakeEnvelope(address_, payload);
  message->flush_first = flush_writes_first;
  message->deadline = deadline;
  message->done = std::move(done);
  counters_.pending_messages++;
  Post([this, message, address = std::string(peer)] {
    Status error;
    std::shared_ptr<Peer> p = GetPeer(address, &error);
    active_messages_.push_back(message);
    if (p == nullptr) {
      FinishMessage(message, error);
      return;
    }
    message->peer = p;
    message->after_batches = message->flush_first ? p->batches_submitted : 0;
    p->messages.push_back(message);
  });
  return Status::Ok();
}

void UcxTransport::Connect(std::string_view peer) {
  Post([this, address = std::string(peer)] {
    Status error;
    if (GetPeer(address, &error) != nullptr) return;
    for (const Client& c : clients_) {
      if (c.on_peer_failure) c.on_peer_failure(address, error);
    }
  });
}

void UcxTransport::Disconnect(std::string_view peer) {
  Post([this, address = std::string(peer)] {
    auto it = peers_.find(address);
    if (it == peers_.end()) return;
    ResetPeer(it->second, Status::Cancelled("disconnected"), /*notify=*/false);
  });
}

TransportStats UcxTransport::Stats() const {
  TransportStats s;
  s.registered_regions = counters_.registered_regions.load();
  s.peers = counters_.peers.load();
  s.remote_keys = counters_.remote_keys.load();
  s.inflight_ops = counters_.inflight_ops.load();
  s.pending_batches = counters_.pending_batches.load();
  s.pending_messages = counters_.pending_messages.load();
  s.bytes_written = counters_.bytes_written.load();
  s.bytes_read = counters_.bytes_read.load();
  s.messages_sent = counters_.messages_sent.load();
  s.messages_received = counters_.messages_received.load();
  s.rejected_writes = counters_.rejected_writes.load();
  return s;
}

// ---------------------------------------------------------------------------------------------
// The I/O thread.

void UcxTransport::Loop(std::stop_token stop) {
  io_thread_id_ = std::this_thread::get_id();
  ucp_worker_h worker = worker_->get();
  const auto busy_poll = std::chrono::microseconds(options_.busy_poll_us);
  Deadline last_activity = Clock::now();
  while (!stop.stop_requested()) {
    bool did = RunCommands();
    for (auto& [address, peer] : peers_) did |= Pump(*peer);
    for (int i = 0; i < 256 && ucp_worker_progress(worker) > 0; ++i) did = true;
    if (!failed_peers_.empty()) {
      std::vector<std::shared_ptr<Peer>> failed;
      failed.swap(failed_peers_);
      for (auto& peer : failed) {
        ResetPeer(peer, Status::Unavailable(fmt::format("peer {} failed: {}",
                                                        ShortAddress(peer->address),
                                                        peer->endpoint_error.ToString())),
                  /*notify=*/true);
      }
      did = true;
    }
    const Deadline now = Clock::now();
    CheckDeadlines(now);
    did |= ProgressClosing(false);
    if (did) {
      last_activity = now;
      continue;
    }
    if (now - last_activity < busy_poll) {
      // Poll a little longer for a quick reply, but let runnable threads (hashing, the other
      // side's progress thread) have the core: there are few.
      std::this_thread::yield();
      continue;
    }
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;
    auto sleep = std::min<Clock::duration>(NextDeadline() - now, kMaxSleep);
    if (!closing_.empty()) sleep = std::min<Clock::duration>(sleep, std::chrono::milliseconds(1));
    const int timeout_ms = static_cast<int>(std::max<int64_t>(
        0, std::chrono::ceil<std::chrono::milliseconds>(sleep).count()));
    epoll_event events[4];
    epoll_wait(epoll_fd_, events, 4, timeout_ms);
    uint64_t drained;
    while (read(event_fd_, &drained, sizeof(drained)) > 0) {
    }
  }
  Shutdown();
}

bool UcxTransport::RunCommands() {
  std::deque<std::function<void()>> commands;
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands.swap(commands_);
  }
  for (auto& command : commands) command();
  return !commands.empty();
}

std::shared_ptr<UcxTransport::Peer> UcxTransport::GetPeer(const std::string& address,
                                                          Status* error) {
  auto it = peers_.find(address);
  if (it != peers_.end()) return it->second;
  auto peer = std::make_shared<Peer>();
  peer->owner = this;
  peer->self = peer;
  peer->address = address;
  // Peers without peer error handling (shared memory) make the PEER-mode attempt fail with a
  // UCX error log line: try it only until it failed once.
  const bool try_peer_mode = !peer_mode_unreachable_ || !options_.allow_no_error_handling;
  auto ep = UcxEndpoint::Create(worker_.get(), address, try_peer_mode,
                                options_.allow_no_error_handling, &UcxTransport::OnEndpointError,
                                peer.get());
  if (!ep.ok()) {
    *error = ep.status().WithContext(fmt::format("connecting to {}", ShortAddress(address)));
    return nullptr;
  }
  peer->ep = std::move(ep).value();
  if (try_peer_mode && !peer->ep->peer_error_handling()) peer_mode_unreachable_ = true;
  peer->am_writes = options_.write_protocol == WriteProtocol::kActiveMessage ||
                    (options_.write_protocol == WriteProtocol::kAuto && !peer->ep->native_rma());
  peers_[address] = peer;
  counters_.peers++;
  return peer;
}

void UcxTransport::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  std::shared_ptr<Peer> self = peer->self.lock();
  if (self == nullptr || self->failed) return;
  self->endpoint_error = FromUcsStatus(status, "endpoint error");
  peer->owner->failed_peers_.push_back(std::move(self));
}

void UcxTransport::ResetPeer(std::shared_ptr<Peer> peer, const Status& status, bool notify) {
  if (peer->failed) return;
  peer->failed = true;
  peer->reset_status = status;
  auto it = peers_.find(peer->address);
  if (it != peers_.end() && it->second == peer) {
    peers_.erase(it);
    counters_.peers--;
  }
  for (auto& b : peer->queue) {
    if (b->status.ok()) b->status = status;
  }
  std::deque<std::shared_ptr<Batch>> queued;
  queued.swap(peer->queue);
  for (auto& b : queued) FinishBatchIfDone(b);
  std::deque<std::shared_ptr<Message>> messages;
  messages.swap(peer->messages);
  for (auto& m : messages) FinishMessage(m, status);
  // Messages being flushed / sent end now; their UCX requests end with the endpoint.
  for (auto& m : active_messages_) {
    if (m->peer == peer) FinishMessage(m, status);
  }
  if (peer->inflight == 0) {
    counters_.remote_keys -= peer->rkeys.size();
    peer->rkeys.clear();  // before the endpoint goes, as UCX requires
  }
  const bool can_force = peer->ep->peer_error_handling();
  ucs_status_ptr_t request = peer->ep->StartClose();
  closing_.push_back(Closing{request, peer, Clock::now() + kCloseGiveUp});
  if (!can_force && peer->inflight > 0) {
    // Without peer error handling (shared memory) UCX cannot cancel RMA: an op still
    // outstanding means the peer died mid-operation and the op fell back to messages it will
    // never answer. End those batches now; late completions are ignored (OnRmaDone).
    AbandonInflight(*peer);
  }
  GetLogger("kvtransfer")->debug("reset peer {}: {}", ShortAddress(peer->address),
                                 status.ToString());
  if (notify) {
    for (const Client& c : clients_) {
      if (c.on_peer_failure) c.on_peer_failure(peer->address, status);
    }
  }
}

bool UcxTransport::ProgressClosing(bool force_all) {
  bool did = false;
  const Deadline now = Clock::now();
  for (auto it = closing_.begin(); it != closing_.end();) {
    Closing& c = *it;
    const bool done = c.request == nullptr || ucp_request_check_status(c.request) != UCS_INPROGRESS;
    const bool give_up = now >= c.give_up || force_all;
    if (!done && !give_up) {
      ++it;
      continue;
    }
    if (done && c.request != nullptr) ucp_request_free(c.request);
    if (!done) {
      GetLogger("kvtransfer")->warn("closing the endpoint to {} did not finish; abandoning it",
                                    ShortAddress(c.peer->address));
    }
    Peer& peer = *c.peer;
    // A forced close completes outstanding RMA with UCS_ERR_CANCELED; anything left is ended.
    AbandonInflight(peer);
    counters_.remote_keys -= peer.rkeys.size();
    peer.rkeys.clear();
    peer.ep.reset();
    it = closing_.erase(it);
    did = true;
  }
  return did;
}

void UcxTransport::AbandonInflight(Peer& peer) {
  for (auto& b : active_batches_) {
    if (b->peer.get() == &peer && !b->finished && b->inflight > 0) {
      counters_.inflight_ops -= b->inflight;
      peer.inflight -= b->inflight;
      b->inflight = 0;
      if (b->status.ok()) b->status = peer.reset_status;
      FinishBatchIfDone(b);
    }
  }
}

void UcxTransport::CheckDeadlines(Deadline now) {
  std::vector<std::shared_ptr<Peer>> to_reset;
  for (auto& b : active_batches_) {
    if (b->finished || now < b->deadline) continue;
    if (b->status.ok()) {
      b->status = Status::DeadlineExceeded(fmt::format(
          "RMA batch to {} unfinished at its deadline ({} of {} ops issued)",
          b->peer ? ShortAddress(b->peer->address) : std::string("?"), b->next_op,
          b->ops.size()));
    }
    if (b->inflight > 0 && b->peer && !b->peer->failed) to_reset.push_back(b->peer);
    FinishBatchIfDone(b);
  }
  for (auto& m : active_messages_) {
    if (m->stage == Message::Stage::kDone || now < m->deadline) continue;
    const bool in_ucx =
        m->stage == Message::Stage::kFlushing || m->stage == Message::Stage::kSending;
    FinishMessage(m, Status::DeadlineExceeded("message unsent at its deadline"));
    if (in_ucx && m->peer && !m->peer->failed) to_reset.push_back(m->peer);
  }
  for (auto& peer : to_reset) {
    GetLogger("kvtransfer")->debug("peer {}: {} RMA ops and {} queued messages at a deadline",
                                   ShortAddress(peer->address), peer->inflight,
                                   peer->messages.size());
    ResetPeer(peer, Status::Unavailable("peer reset: an operation on it missed its deadline"),
              /*notify=*/true);
  }
  std::erase_if(active_batches_, [](const auto& b) { return b->finished; });
  std::erase_if(active_messages_,
                [](const auto& m) { return m->stage == Message::Stage::kDone; });
}

Deadline UcxTransport::NextDeadline() const {
  Deadline next = Deadline::max();
  for (const auto& b : active_batches_) {
    if (!b->finished) next = std::min(next, b->deadline);
  }
  for (const auto& m : active_messages_) {
    if (m->stage != Message::Stage::kDone) next = std::min(next, m->deadline);
  }
  return next;
}

void UcxTransport::Shutdown() {
  RunCommands();
  std::vector<std::shared_ptr<Peer>> peers;
  for (auto& [address, peer] : peers_) peers.push_back(peer);
  for (auto& peer : peers) {
    ResetPeer(peer, Status::Cancelled("UCX transport shutting down"), /*notify=*/false);
  }
  const Deadline give_up = Clock::now() + kCloseGiveUp;
  while (!closing_.empty() && Clock::now() < give_up) {
    ucp_worker_progress(worker_->get());
    ProgressClosing(false);
  }
  ProgressClosing(true);
  for (auto& b : active_batches_) {
    if (b->status.ok()) b->status = Status::Cancelled("UCX transport shutting down");
    b->inflight = 0;
    FinishBatchIfDone(b);
  }
  for (auto& m : active_messages_) FinishMessage(m, Status::Cancelled("UCX transport shut down"));
  active_batches_.clear();
  active_messages_.clear();
  if (!regions_.empty()) {
    GetLogger("kvtransfer")->error("{} registered regions outlive the UCX transport",
                                   regions_.size());
  }
}

}  // namespace pdserve::kvtransfer
