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
// would have used: 400 InvalidArgument, 401 PermissionDenied, 404 NotFound, 429
// ResourceExhausted, 503 Unavailable, 504 DeadlineExceeded, else Internal) and the full error (type, code, param) in last_error().
// Destroying the client closes its connection: the router aborts whatever it still ran for it.
//
// Security (docs/request-api.md, "Authentication"): ClientOptions::api_key goes into every
// submit (the router's api_keys_file); ClientOptions::curve makes the connection a CURVE client
// of a router with request_curve_secret_key_file (its public key, and a key pair of the client's
// own: from a file when the router lists allowed client keys, else a fresh one per connection).
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
#include "services/common/curve_keys.h"
#include "services/request_api/request_api_codec.h"

namespace pdserve::client {

struct ClientOptions {
  // Longest silence from the router during a request before Generate gives up (the router
  // sends keepalives to a waiting client, so silence means the router is gone).
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Longest wait for a connection to the router before a send fails (nothing listens there, or
  // it refused this client's CURVE keys); a live router accepts within milliseconds.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(5)};
  // Sent in every Generate whose request has no api_key of its own. Empty: none.
  std::string api_key;
  // enabled: CURVE with the router's public key (server_public_key) and `own` (see
  // CurveClientOptions). Disabled: plain TCP.
  services::CurveOptions curve;
};

// The key of an API key file: exactly one key, '#' comment lines and blank lines ignored,
// surrounding whitespace trimmed (the router's api_keys_file format, one line of it).
// Errors: NotFound, InvalidArgument (no key, several keys; naming the file).
Result<std::string> ReadApiKeyFile(const std::string& path);
// CURVE settings for a client: the router's public key file and, optionally, the client's own
// secret key file ("" = a fresh key pair, enough when the router accepts any client key).
// Errors: as services::ReadCurveKeyFile / ReadCurveSecretKeyFile; InvalidArgument when libzmq
// has no CURVE.
Result<services::CurveOptions> CurveClientOptions(const std::string& server_public_key_file,
                                                 const std::string& secret_key_file = "");

// A tool call a chat choice made, assembled from its deltas.
struct CompletedToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

// One choice of a request (Submit::n of them).
struct CompletedChoice {
  std::vector<int32_t> tokens;     // every token received (hidden stop tokens excluded)
  std::string text;                // completions: the text; chat: the message content
  std::string reasoning;           // chat: the reasoning content
  std::vector<CompletedToolCall> tool_calls;  // chat
  FinishReason finish = FinishReason::kNone;
  bool tool_calls_finish = false;  // finish kStop with tool calls ("tool_calls")
  uint32_t completion_tokens = 0;
  uint32_t reasoning_tokens = 0;
};

struct Completion {
  std::string tag;                 // the router's request id (its logs, the workers' logs)
  // Choice 0's output (the whole request when n is 1).
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;  // all choices together
  std::vector<CompletedChoice> choices;  // by index
};

// Called for every output event; return false to abort the request.
using OutputCallback = std::function<bool(const services::api::Output&)>;

// The Status for an error reply (see above); the message carries type, code and param.
Status StatusFromApiError(const services::api::Error& error);

class RequestClient {
 public:
  // Errors: InvalidArgument (bad endpoint, incomplete CURVE options), Internal (ZeroMQ).
  // With CURVE, a handshake the router refuses is not an error here: the socket keeps
  // retrying and requests time out (options.timeout), as ZeroMQ gives no refusal to report.
  static Result<std::unique_ptr<RequestClient>> Connect(const std::string& endpoint, ClientOptions options = {});
  ~RequestClient();
  RequestClient(const RequestClient&) = delete;
  RequestClient& operator=(const RequestClient&) = delete;

  // Streams one request to its end: every one of its request.n choices finished. request_id 0:
  // the client numbers it. When the callback returns false the client sends abort and waits
  // for the router's final events (finish kAbort). Errors: the router's error reply (see above), DeadlineExceeded (silence
  // beyond options.timeout, or no connection within options.connect_timeout), Internal.
  Result<Completion> Generate(services::api::Submit request, const OutputCallback& on_output = nullptr);
  // Round trip to the router. Errors: DeadlineExceeded, Internal.
  Status Ping(std::chrono::milliseconds timeout);

  // The last error reply received (Generate failures, malformed-message replies).
  const std::optional<services::api::Error>& last_error() const { return last_error_; }

  // Low level (tests and tools): one frame out; the next decoded message in. Sending waits at
  // most options.connect_timeout for a connection (DeadlineExceeded).
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
