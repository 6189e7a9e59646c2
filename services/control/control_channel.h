// ControlChannel: one ZeroMQ socket of the control plane and the one thread that owns it.
//
// The router binds a ROUTER socket; each worker connects a DEALER socket to it. ZeroMQ sockets
// are not thread-safe, so the context and the socket are created, used and closed on the
// channel's own std::jthread and nowhere else. Other threads hand messages over with Send(),
// which appends to a locked queue and wakes the owner through an eventfd polled next to the
// socket (an inproc socket shared by the producers would itself be touched by many threads).
//
// Handlers run on the owner thread: on_message for every received message (peer = the
// ROUTER's routing id of the sender; empty on a DEALER), on_tick every tick_interval (timers:
// heartbeats, expiry). They must not block; they may call Send().
//
// Delivery: messages to one peer leave in Send() order. A message to a peer the ROUTER does
// not know (gone) is dropped and counted. A DEALER drops messages while it has no connection
// (ZMQ_IMMEDIATE): the control plane never replays stale heartbeats or token events to a
// router that restarted; workers notice the silence and register again.
//
// Security (Start's `curve`, docs/operations.md): with CURVE enabled the ROUTER is a CURVE server
// and every DEALER must present the router's public key and a key pair of its own; with an
// allowed-clients list the ROUTER also runs a ZAP handler (on the owner thread, polled with the
// socket) that refuses every other client key. A refused or mismatched peer never completes the
// handshake, so no message of it ever reaches on_message; its DEALER keeps retrying quietly.
//
// Thread-safety: Send, Wake, endpoint, dropped_messages: any thread. Destruction: not from a
// handler.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "common/status.h"
#include "services/common/curve_keys.h"

namespace pdserve::services {

struct ControlChannelOptions {
  enum class Kind { kRouterBind, kDealerConnect };
  Kind kind = Kind::kDealerConnect;
  // "tcp://HOST:PORT"; a ROUTER may bind "tcp://HOST:*" (an ephemeral port, see endpoint()).
  std::string endpoint;
  std::chrono::milliseconds tick_interval{50};
  std::string name = "control";  // in log lines
  // ROUTER only: called on the owner thread when a message cannot be delivered because the
  // peer is gone (its connection closed: ZMQ_ROUTER_MANDATORY's EHOSTUNREACH). Front-ends use
  // it to abort the requests of a client that disappeared (services/router/request_api_server.h).
  std::function<void(std::string_view peer)> on_unreachable = nullptr;
  // > 0: ZMTP heartbeats on every connection (ZMQ_HEARTBEAT_IVL, timeout 3x): a peer whose
  // host vanished without closing its TCP connection is disconnected after that long.
  int zmtp_heartbeat_ms = 0;
  // Called on the owner thread after every wake-up (Wake(), a Send(), a message, a tick), after
  // the received messages were handled: lets a front drive its own work on this thread -- and
  // send from it -- without a thread hop per event (services/router/request_api_server.h).
  std::function<void()> on_wake = nullptr;
};

class ControlChannel {
 public:
  using MessageHandler = std::function<void(std::string_view peer, std::string_view payload)>;
  using TickHandler = std::function<void(std::chrono::steady_clock::time_point now)>;

  // Starts the owner thread and waits until the socket is bound / connecting.
  // Errors: InvalidArgument (bad endpoint), Unavailable (the address is in use), Internal.
  // `curve` (disabled: plain TCP) is separate from `options` so that brace-initialized
  // options stay valid. Keys are checked when loaded (curve_keys.h); a bad one here: Internal.
  static Result<std::unique_ptr<ControlChannel>> Start(ControlChannelOptions options,
                                                       MessageHandler on_message,
                                                       TickHandler on_tick = nullptr,
                                                       CurveOptions curve = {});
  // Stops and joins the owner thread; unsent messages are dropped (linger 0).
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Queues one message (peer ignored on a DEALER). Never blocks on the network.
  void Send(std::string peer, std::string payload);
  // Wakes the owner thread (runs on_wake soon). Any thread; cheap (an eventfd write).
  void Wake();

  // The endpoint actually bound/connected ("tcp://127.0.0.1:41234").
  const std::string& endpoint() const { return endpoint_; }
  uint64_t dropped_messages() const { return dropped_.load(std::memory_order_relaxed); }
  uint64_t received_messages() const { return received_.load(std::memory_order_relaxed); }
  // ROUTER with an allowed-clients list: CURVE handshakes refused by the ZAP handler.
  uint64_t refused_handshakes() const { return refused_.load(std::memory_order_relaxed); }
  // Owner thread only (handlers): whether the last receive pass handled every message that had
  // reached the socket (false: the bounded batch stopped with more waiting). Silence timeouts
  // must not fire while the peer's messages may sit unread in our own backlog.
  bool caught_up() const { return caught_up_; }

 private:
  ControlChannel(ControlChannelOptions options, MessageHandler on_message, TickHandler on_tick, CurveOptions curve);
  void Run(std::stop_token stop, std::function<void(Status, std::string)> ready);

  const ControlChannelOptions options_;
  const MessageHandler on_message_;
  const TickHandler on_tick_;
  const CurveOptions curve_;
  std::string endpoint_;
  int wake_fd_ = -1;  // eventfd; closed in the destructor after the thread is joined

  std::mutex mu_;
  std::deque<std::pair<std::string, std::string>> outbox_;
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> received_{0};
  std::atomic<uint64_t> refused_{0};
  bool caught_up_ = true;  // owner thread

  std::jthread thread_;  // last: joined before the members it uses go away
};

}  // namespace pdserve::services
