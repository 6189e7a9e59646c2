// RequestClient: a small C++ client of the router's ZeroMQ request API
// (proto/request_api.capnp, docs/request-api.md). One DEALER socket connected to
// router.request_endpoint; requests are streamed one at a time through a callback.
//
//   auto client = RequestClient::Connect("tcp://127.0.0.1:7100").value();
//   services::api::Submit req;
//   req.model = "pdserve";
//   req.kind = services::api::PromptKind::kText;
//   req.prompt_text = "Hello";
//   req.sampling.max_tokens = 16;
//   auto done = client->Generate(req, [](const services::api::Output& o) {
//     std::fputs(o.text.c_str(), stdout);
//     return true;  // false aborts the request
//   });
//
// Errors from the router come back as a Status (its code from the HTTP status the HTTP API
// would have used: 400 InvalidArgument, 404 NotFound, 429 ResourceExhausted, 503 Unavailable,
// 504 DeadlineExceeded, else Internal) and the full error (type, code, param) in last_error().
// Destroying the client closes its connection: the router aborts whatever it still ran for it.
//
// Thread-safety: none; one thread uses a client (the socket is not thread-safe). Use one
// client per thread for concurrent requests.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/common/request_api_codec.h"

namespace pdserve::client {

struct ClientOptions {
  // Longest silence from the router during a request before Generate gives up (the router
  // sends keepalives to a waiting client, so silence means the router is gone).
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

struct Completion {
  std::string tag;                 // the router's request id (its logs, the workers' logs)
  std::vector<int32_t> tokens;     // every token received (hidden stop tokens excluded)
  std::string text;
  services::api::Finish finish = services::api::Finish::kNone;
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
};

// Called for every output event; return false to abort the request.
using OutputCallback = std::function<bool(const services::api::Output&)>;

// The Status for an error reply (see above); the message carries type, code and param.
Status StatusFromApiError(const services::api::Error& error);

class RequestClient {
 public:
  // Errors: InvalidArgument (bad endpoint), Internal (ZeroMQ).
  static Result<std::unique_ptr<RequestClient>> Connect(const std::string& endpoint, ClientOptions options = {});
  ~RequestClient();
  RequestClient(const RequestClient&) = delete;
  RequestClient& operator=(const RequestClient&) = delete;

  // Streams one request to its end. request.request_id 0: the client numbers it. When the
  // callback returns false the client sends abort and waits for the router's final event
  // (finish kAbort). Errors: the router's error reply (see above), DeadlineExceeded (silence
  // beyond options.timeout), Internal (socket).
  Result<Completion> Generate(services::api::Submit request, const OutputCallback& on_output = nullptr);
  // Round trip to the router. Errors: DeadlineExceeded, Internal.
  Status Ping(std::chrono::milliseconds timeout);

  // The last error reply received (Generate failures, malformed-message replies).
  const std::optional<services::api::Error>& last_error() const { return last_error_; }

  // Low level (tests and tools): one frame out; the next decoded message in.
  Status SendRaw(const std::string& bytes);
  Status Send(const services::api::Message& message);
  // Errors: DeadlineExceeded (nothing within timeout), InvalidArgument (undecodable reply).
  Result<services::api::Message> Receive(std::chrono::milliseconds timeout);

 private:
  RequestClient() = default;
  struct ContextDeleter {
    void operator()(void* context) const;
  };
  struct SocketDeleter {
    void operator()(void* socket) const;
  };

  ClientOptions options_;
  std::unique_ptr<void, ContextDeleter> context_;  // terminated after the socket closed
  std::unique_ptr<void, SocketDeleter> socket_;
  uint64_t next_id_ = 1;
  std::optional<services::api::Error> last_error_;
};

}  // namespace pdserve::client
