#include "services/control/control_channel.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <set>
#include <vector>

#include <optional>

#include <zmq.h>

#include "common/logging.h"

namespace pdserve::services {

namespace {

// Closes a zmq socket / context on scope exit (all on the owner thread).
struct ZmqContext {
  void* ctx = zmq_ctx_new();
  ~ZmqContext() {
    if (ctx) zmq_ctx_term(ctx);
  }
};
struct ZmqSocket {
  void* sock = nullptr;
  ~ZmqSocket() {
    if (sock) zmq_close(sock);
  }
};

std::string ZmqError(const char* what) { return std::string(what) + ": " + zmq_strerror(zmq_errno()); }

Status SetIntOption(void* sock, int option, int value, const char* name) {
  if (zmq_setsockopt(sock, option, &value, sizeof(value)) != 0)
    return Status::Internal(ZmqError((std::string("zmq_setsockopt ") + name).c_str()));
  return Status::Ok();
}

// Reads one message (all its frames). Returns false when nothing is pending.
bool ReceiveFrames(void* sock, std::vector<std::string>* frames) {
  frames->clear();
  while (true) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    const int flags = frames->empty() ? ZMQ_DONTWAIT : 0;  // later frames are already here
    if (zmq_msg_recv(&msg, sock, flags) < 0) {
      zmq_msg_close(&msg);
      return !frames->empty();
    }
    frames->emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    const bool more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
    if (!more) return true;
  }
}

Status SetKeyOption(void* sock, int option, const std::string& z85_key, const char* name) {
  // A Z85 key is passed as its 40 characters plus the terminating NUL (41 bytes).
  if (zmq_setsockopt(sock, option, z85_key.c_str(), z85_key.size() + 1) != 0)
    return Status::Internal(ZmqError((std::string("zmq_setsockopt ") + name).c_str()));
  return Status::Ok();
}

// The well-known endpoint libzmq sends ZAP (authentication) requests to, per context.
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";

// Answers one ZAP request (RFC 27): 200 when the CURVE client key is in `allowed`, else 400.
// Returns the refused client's key (Z85) and address, or nothing when it was accepted.
std::optional<std::pair<std::string, std::string>> AnswerZapRequest(void* zap, const std::set<std::string>& allowed,
                                                                    const std::vector<std::string>& request) {
  // version, request id, domain, address, identity, mechanism, credentials...
  std::string status = "400", text = "malformed ZAP request", user;
  std::optional<std::pair<std::string, std::string>> refused;
  if (request.size() >= 7 && request[0] == "1.0" && request[5] == "CURVE" && request[6].size() == 32) {
    char z85[41];
    zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(request[6].data()), 32);
    if (allowed.count(z85)) {
      status = "200";
      text = "OK";
      user = z85;
    } else {
      text = "client key not allowed";
      refused.emplace(z85, request[3]);
    }
  } else {
    refused.emplace("(no CURVE key)", request.size() > 3 ? request[3] : "");
  }
  const std::string request_id = request.size() > 1 ? request[1] : "";
  const std::string reply[] = {"1.0", request_id, status, text, user, ""};
  for (size_t i = 0; i < 6; ++i)
    zmq_send(zap, reply[i].data(), reply[i].size(), i + 1 < 6 ? ZMQ_SNDMORE : 0);
  return refused;
}

}  // namespace

ControlChannel::ControlChannel(ControlChannelOptions options, MessageHandler on_message, TickHandler on_tick,
                               CurveOptions curve)
    : options_(std::move(options)),
      on_message_(std::move(on_message)),
      on_tick_(std::move(on_tick)),
      curve_(std::move(curve)) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

Result<std::unique_ptr<ControlChannel>> ControlChannel::Start(ControlChannelOptions options,
                                                              MessageHandler on_message,
                                                              TickHandler on_tick, CurveOptions curve) {
  if (options.endpoint.empty()) return Status::InvalidArgument("control channel endpoint is empty");
  if (!on_message) return Status::InvalidArgument("control channel needs a message handler");
  if (options.tick_interval.count() <= 0) return Status::InvalidArgument("tick_interval must be positive");
  std::unique_ptr<ControlChannel> channel(
      new ControlChannel(std::move(options), std::move(on_message), std::move(on_tick), std::move(curve)));
  if (channel->wake_fd_ < 0) return Status::Internal(std::string("eventfd: ") + std::strerror(errno));

  std::promise<std::pair<Status, std::string>> ready;
  auto ready_future = ready.get_future();
  ControlChannel* self = channel.get();
  channel->thread_ = std::jthread([self, &ready](std::stop_token st) {
    self->Run(st, [&ready](Status s, std::string endpoint) { ready.set_value({std::move(s), std::move(endpoint)}); });
  });
  auto [status, endpoint] = ready_future.get();
  if (!status.ok()) return status;  // the thread has ended; the destructor joins it
  channel->endpoint_ = std::move(endpoint);
  return channel;
}

ControlChannel::~ControlChannel() {
  if (thread_.joinable()) {
    thread_.request_stop();
    Wake();
    thread_.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ControlChannel::Send(std::string peer, std::string payload) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    outbox_.emplace_back(std::move(peer), std::move(payload));
  }
  Wake();
}

void ControlChannel::Wake() {
  const uint64_t one = 1;
  // EAGAIN means the counter is already non-zero: the owner will wake anyway.
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

void ControlChannel::Run(std::stop_token stop, std::function<void(Status, std::string)> ready) {
  auto log = GetLogger("control");
  ZmqContext context;
  ZmqSocket zap;  // closed after `socket` (declared first): libzmq may still ask it during close
  ZmqSocket socket;
  const CurveOptions& curve = curve_;
  const std::set<std::string> allowed(curve.allowed_client_keys.begin(), curve.allowed_client_keys.end());
  const bool is_router = options_.kind == ControlChannelOptions::Kind::kRouterBind;
  {
    Status s;
    if (!context.ctx) s = Status::Internal(ZmqError("zmq_ctx_new"));
    if (s.ok()) {
      socket.sock = zmq_socket(context.ctx, is_router ? ZMQ_ROUTER : ZMQ_DEALER);
      if (!socket.sock) s = Status::Internal(ZmqError("zmq_socket"));
    }
    // Unlimited queues: token events must never be dropped for a slow peer; a dead peer is
    // removed by the heartbeat timeout, which bounds what can pile up.
    if (s.ok()) s = SetIntOption(socket.sock, ZMQ_LINGER, 0, "ZMQ_LINGER");
    if (s.ok()) s = SetIntOption(socket.sock, ZMQ_SNDHWM, 0, "ZMQ_SNDHWM");
    if (s.ok()) s = SetIntOption(socket.sock, ZMQ_RCVHWM, 0, "ZMQ_RCVHWM");
    if (s.ok() && is_router) s = SetIntOption(socket.sock, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY");
    if (s.ok() && options_.zmtp_heartbeat_ms > 0) {
      s = SetIntOption(socket.sock, ZMQ_HEARTBEAT_IVL, options_.zmtp_heartbeat_ms, "ZMQ_HEARTBEAT_IVL");
      if (s.ok()) s = SetIntOption(socket.sock, ZMQ_HEARTBEAT_TIMEOUT, 3 * options_.zmtp_heartbeat_ms, "ZMQ_HEARTBEAT_TIMEOUT");
    }
    if (s.ok() && !is_router) {
      s = SetIntOption(socket.sock, ZMQ_IMMEDIATE, 1, "ZMQ_IMMEDIATE");
      if (s.ok()) s = SetIntOption(socket.sock, ZMQ_RECONNECT_IVL, 100, "ZMQ_RECONNECT_IVL");
      if (s.ok()) s = SetIntOption(socket.sock, ZMQ_RECONNECT_IVL_MAX, 1000, "ZMQ_RECONNECT_IVL_MAX");
    }
    if (s.ok() && curve.enabled) {
      if (is_router) {
        if (!allowed.empty()) {
          // The ZAP handler must be bound before the ROUTER accepts its first connection.
          zap.sock = zmq_socket(context.ctx, ZMQ_REP);
          if (!zap.sock || zmq_bind(zap.sock, kZapEndpoint) != 0) s = Status::Internal(ZmqError("ZAP handler"));
          if (s.ok()) s = SetIntOption(zap.sock, ZMQ_LINGER, 0, "ZMQ_LINGER");
          if (s.ok() && zmq_setsockopt(socket.sock, ZMQ_ZAP_DOMAIN, "pdserve", 7) != 0)
            s = Status::Internal(ZmqError("zmq_setsockopt ZMQ_ZAP_DOMAIN"));
        }
        if (s.ok()) s = SetIntOption(socket.sock, ZMQ_CURVE_SERVER, 1, "ZMQ_CURVE_SERVER");
      } else {
        s = SetKeyOption(socket.sock, ZMQ_CURVE_SERVERKEY, curve.server_public_key, "ZMQ_CURVE_SERVERKEY");
        if (s.ok()) s = SetKeyOption(socket.sock, ZMQ_CURVE_PUBLICKEY, curve.own.public_key, "ZMQ_CURVE_PUBLICKEY");
      }
      if (s.ok()) s = SetKeyOption(socket.sock, ZMQ_CURVE_SECRETKEY, curve.own.secret_key, "ZMQ_CURVE_SECRETKEY");
    }
    std::string endpoint = options_.endpoint;
    if (s.ok()) {
      const int rc = is_router ? zmq_bind(socket.sock, endpoint.c_str()) : zmq_connect(socket.sock, endpoint.c_str());
      if (rc != 0) {
        const int err = zmq_errno();
        const std::string msg = ZmqError(is_router ? "zmq_bind" : "zmq_connect") + " (" + endpoint + ")";
        s = err == EADDRINUSE ? Status::Unavailable(msg) : Status::InvalidArgument(msg);
      }
    }
    if (s.ok() && is_router) {
      char buf[256];
      size_t len = sizeof(buf);
      if (zmq_getsockopt(socket.sock, ZMQ_LAST_ENDPOINT, buf, &len) == 0) endpoint.assign(buf, strnlen(buf, len));
    }
    const bool ok = s.ok();
    ready(std::move(s), endpoint);
    if (!ok) return;
  }

  std::vector<std::string> frames;
  std::set<std::string> refused_keys;  // logged once each
  std::deque<std::pair<std::string, std::string>> outgoing;
  auto next_tick = std::chrono::steady_clock::now() + options_.tick_interval;
  while (!stop.stop_requested()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      outgoing.swap(outbox_);
    }
    for (auto& [peer, payload] : outgoing) {
      bool sent;
      if (is_router) {
        sent = zmq_send(socket.sock, peer.data(), peer.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
               zmq_send(socket.sock, payload.data(), payload.size(), ZMQ_DONTWAIT) >= 0;
      } else {
        sent = zmq_send(socket.sock, payload.data(), payload.size(), ZMQ_DONTWAIT) >= 0;
      }
      if (!sent) {
        const int err = zmq_errno();
        dropped_.fetch_add(1, std::memory_order_relaxed);
        log->debug("{}: dropped a message ({})", options_.name, zmq_strerror(err));
        if (is_router && err == EHOSTUNREACH && options_.on_unreachable) options_.on_unreachable(peer);
      }
    }
    outgoing.clear();

    const auto now = std::chrono::steady_clock::now();
    const long timeout_ms =
        std::max<long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - now).count());
    zmq_pollitem_t items[3] = {{socket.sock, 0, ZMQ_POLLIN, 0},
                               {nullptr, wake_fd_, ZMQ_POLLIN, 0},
                               {zap.sock, 0, ZMQ_POLLIN, 0}};
    if (zmq_poll(items, zap.sock ? 3 : 2, timeout_ms) < 0 && zmq_errno() != EINTR) {
      log->error("{}: zmq_poll failed: {}", options_.name, zmq_strerror(zmq_errno()));
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t counter;
      [[maybe_unused]] ssize_t n = read(wake_fd_, &counter, sizeof(counter));
    }
    if (zap.sock && (items[2].revents & ZMQ_POLLIN)) {
      for (int i = 0; i < 64 && ReceiveFrames(zap.sock, &frames); ++i) {
        auto refused = AnswerZapRequest(zap.sock, allowed, frames);
        if (!refused) continue;
        refused_.fetch_add(1, std::memory_order_relaxed);
        // A refused worker retries every reconnect interval: log each key once.
        if (refused_keys.insert(refused->first).second)
          log->warn("{}: refused a CURVE client from {} (key {} is not in the allowed list)", options_.name,
                    refused->second, refused->first);
      }
    }
    // A batch bounded in count and in time (it ends once a tick is due), so that under a flood
    // of messages, or with slow handlers on a starved CPU, timers (heartbeats) still run and
    // queued sends still leave every tick interval. caught_up_ tells the tick whether messages
    // were left waiting.
    caught_up_ = false;
    const auto batch_start = std::chrono::steady_clock::now();
    int handled = 0;
    for (; handled < 1024; ++handled) {
      if (handled > 0 && std::chrono::steady_clock::now() >= next_tick) break;
      if (!ReceiveFrames(socket.sock, &frames)) {
        caught_up_ = true;
        break;
      }
      received_.fetch_add(1, std::memory_order_relaxed);
      if (is_router) {
        if (frames.size() != 2) {
          log->warn("{}: dropped a message with {} frames (expected identity + payload)", options_.name, frames.size());
          continue;
        }
        on_message_(frames[0], frames[1]);
      } else {
        if (frames.size() != 1) {
          log->warn("{}: dropped a message with {} frames (expected 1)", options_.name, frames.size());
          continue;
        }
        on_message_(std::string_view(), frames[0]);
      }
    }
    if (const auto took = std::chrono::steady_clock::now() - batch_start; took > std::chrono::seconds(1))
      log->warn("{}: handling {} messages took {} ms (a slow handler or a starved thread)", options_.name, handled,
                std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
    if (options_.on_wake) options_.on_wake();
    if (on_tick_ && std::chrono::steady_clock::now() >= next_tick) {
      on_tick_(std::chrono::steady_clock::now());
      next_tick = std::chrono::steady_clock::now() + options_.tick_interval;
    } else if (!on_tick_ && std::chrono::steady_clock::now() >= next_tick) {
      next_tick = std::chrono::steady_clock::now() + options_.tick_interval;
    }
  }
  // Last words (a worker's Deregister, a router's aborts) get a short linger to leave; then the
  // socket and the context are closed here, on the owner thread.
  {
    std::lock_guard<std::mutex> lock(mu_);
    outgoing.swap(outbox_);
  }
  for (auto& [peer, payload] : outgoing) {
    if (is_router) {
      if (zmq_send(socket.sock, peer.data(), peer.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
        zmq_send(socket.sock, payload.data(), payload.size(), ZMQ_DONTWAIT);
    } else {
      zmq_send(socket.sock, payload.data(), payload.size(), ZMQ_DONTWAIT);
    }
  }
  if (!outgoing.empty()) {
    [[maybe_unused]] Status s = SetIntOption(socket.sock, ZMQ_LINGER, 200, "ZMQ_LINGER");
  }
}

}  // namespace pdserve::services
