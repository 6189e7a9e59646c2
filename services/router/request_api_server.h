// RequestApiServer: the router's ZeroMQ request API (proto/request_api.capnp,
// docs/request-api.md), next to the HTTP front (router_server.h) and sharing everything behind
// it: validation (openai_request.h, via ApiSubmitToParsed), preparation (request_prep.h),
// routing and dispatch (RouterCore), output shaping (GenerationSession: detokenizer, stop
// strings, max_tokens), metrics (the same pdserve_router_* series and outcomes) and error
// codes (ApiError; each error reply carries the HTTP status the HTTP API would have sent).
//
// Threads: one. A ControlChannel (a ROUTER socket at router.request_endpoint) and its owner
// thread do everything of this front: decode and validate submissions, submit them, drain each
// request's events when its ActiveRequest signals (ActiveRequest::SetListener wakes the channel:
// no thread waits per request, no hop between an I/O thread and a worker thread), send outputs,
// and run the timers (first-token and request deadlines, client keepalive probes) on its tick.
//
// A client that disappears: sending to it fails (its connection is closed; ROUTER_MANDATORY)
// and the channel reports the peer unreachable; its requests are cancelled on every worker.
// A client that waits for a first token gets a keepalive message every
// router.request_keepalive_ms, so its disappearance is noticed then, not only at the next
// token. ZMTP heartbeats close connections whose host vanished without closing TCP.
//
// Authentication: with router.api_keys_file (Context::auth) every submit must carry one of the
// keys in apiKey; otherwise it gets the HTTP front's 401 (invalid_request_error,
// invalid_api_key), is counted as HTTP 401s are (outcome client_error), and nothing else of it
// is looked at. Abort and ping need no key: a request id is looked up under the sending
// connection's routing id (by_client_), so a connection can only abort requests it submitted,
// which passed the check. The ROUTER refuses a second connection claiming a routing id in use
// (no ZMQ_ROUTER_HANDOVER), so a peer cannot take over another's id. With
// router.request_curve_secret_key_file (Context::curve) the socket is a CURVE server
// (control_channel.h): a client without the router's public key, or whose key is not in
// request_curve_allowed_clients_file, never completes the handshake and sends nothing here.
//
// Malformed input (undecodable bytes, a server-side message kind, a wrong protocol version)
// gets an error reply (request id 0 when it cannot be attributed, code malformed_message or
// unexpected_message), is counted in pdserve_router_request_api_malformed_total, and the
// server keeps serving.
//
// Thread-safety: Start / destruction from one thread; nothing else is public.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "services/control/control_channel.h"
#include "services/request_api/request_api_codec.h"
#include "services/router/api_auth.h"
#include "services/router/api_error.h"
#include "services/router/generation_session.h"
#include "services/router/openai_request.h"
#include "services/router/router_config.h"
#include "services/router/router_core.h"
#include "services/router/router_metrics.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::router {

// Validates a submission exactly as the HTTP API validates the equivalent JSON body (token ids
// or text: /v1/completions; messages: /v1/chat/completions); the errors are the same.
std::optional<ApiError> ApiSubmitToParsed(const services::api::Submit& submit, ParsedRequest* out);

class RequestApiServer {
 public:
  struct Context {
    const RouterConfig* config = nullptr;
    const tokenizer::Tokenizer* tokenizer = nullptr;
    const tokenizer::ChatTemplate* chat_template = nullptr;
    RouterCore* core = nullptr;
    RouterMetrics* metrics = nullptr;
    const ApiKeyAuth* auth = nullptr;  // null: no API keys required (outlives the server)
    services::CurveOptions curve;      // disabled: plain TCP
  };

  // Binds config->request_endpoint. Errors: InvalidArgument (endpoint), Unavailable (in use).
  static Result<std::unique_ptr<RequestApiServer>> Start(Context context);
  // Ends every request of this front (clients get a 503 error reply, workers an abort).
  ~RequestApiServer();
  RequestApiServer(const RequestApiServer&) = delete;
  RequestApiServer& operator=(const RequestApiServer&) = delete;

  const std::string& endpoint() const { return channel_->endpoint(); }

 private:
  using Clock = std::chrono::steady_clock;
  // Shared with ActiveRequest listeners (control thread), which may outlive the server by a
  // moment: they queue the key and wake the channel while it exists.
  struct Mailbox {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<uint64_t> ready;            // session keys with events
    services::ControlChannel* channel = nullptr;
    bool stop = false;                      // the destructor asks the channel thread to finish
    bool stopped = false;                   // ... and it did
  };
  // One submitted request: its n choices, each a GenerationSession (choice i: gens[i]).
  struct Session {
    std::string peer;
    uint64_t client_id = 0;
    std::vector<std::unique_ptr<GenerationSession>> gens;
    Clock::time_point first_deadline, deadline;
    bool sent_tokens = false;

    const std::string& tag() const { return gens[0]->tag(); }
    bool started() const;   // every choice has its first token or finished
    bool finished() const;  // every choice finished
    void Cancel(std::string_view reason);
  };

  explicit RequestApiServer(Context context);
  // Channel-thread handlers.
  void OnMessage(std::string_view peer, std::string_view payload);
  void OnWake();
  void Shutdown();
  void HandleSubmit(const std::string& peer, services::api::Submit submit, Clock::time_point arrival);
  void HandleAbort(const std::string& peer, const services::api::Abort& abort);
  void DropPeer(const std::string& peer);
  void Drain(uint64_t key);
  void Timers(Clock::time_point now);
  // Sends what choice `index` of the session produced in `step` (nothing when it is empty).
  void SendStep(Session& s, uint32_t index, SessionStep& step);
  // Ends a session: forgets it (its GenerationSessions must be finished or are cancelled).
  void End(uint64_t key);
  void Send(const std::string& peer, const services::api::Message& message);
  void SendError(const std::string& peer, uint64_t client_id, const ApiError& error);

  const Context ctx_;
  std::shared_ptr<Mailbox> mailbox_ = std::make_shared<Mailbox>();

  // Channel thread only.
  std::unordered_map<uint64_t, Session> sessions_;
  std::map<std::pair<std::string, uint64_t>, uint64_t> by_client_;
  std::unordered_map<std::string, Clock::time_point> last_sent_;  // peers with sessions
  uint64_t next_key_ = 1;

  std::vector<uint64_t> ready_;  // scratch

  std::unique_ptr<services::ControlChannel> channel_;  // last: its thread stops first
  // The same channel for the handlers: valid until the channel's destructor has joined its
  // thread (channel_ itself is already null while it does).
  services::ControlChannel* channel_for_handlers_ = nullptr;
};

}  // namespace pdserve::router
