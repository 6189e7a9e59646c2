// RouterServer: pdserve-router as a library object (the binary is a thin main; tests run it
// in-process or as a process).
//
// HTTP (cpp-httplib), all errors OpenAI-shaped (api_error.h), X-Request-Id on every reply:
//   POST /v1/completions, /v1/chat/completions   streaming (SSE) and not
//   GET  /v1/models                              the one served model
//   POST /v1/tokenize, /v1/detokenize            vLLM's shapes (tokenize_api.h); also at
//                                                /tokenize and /detokenize
//   GET  /health                                 200 {"status":"ready",...} with >= 1 prefill
//                                                and >= 1 decode worker, or >= 1 colocated;
//                                                503 otherwise
//   GET  /metrics                                Prometheus text (router_metrics.h)
//   GET  /admin/workers, POST /admin/drain {"worker_id": ..., "timeout_ms": ...}
//   GET  /v1/workers                             workers_view.h (with router.admin_api)
// With router.request_endpoint it also serves the ZeroMQ request API (request_api_server.h),
// which checks the same API keys (auth_) on every submit.
// With router.api_keys_file every path but router.auth_exempt_paths needs
// `Authorization: Bearer KEY` (401 invalid_api_key otherwise, checked before routing). Every 429
// carries Retry-After (router.retry_after_s).
//
// A generation request: parse and validate, apply the chat template, tokenize, Submit to
// RouterCore (routing + dispatch), then wait for the first token or the first error before
// answering, so routing / capacity / worker failures that happen before any output get a real
// HTTP status (429, 503, ...). After that the reply is streamed (SSE) or collected. Deadlines:
// router.first_token_timeout and router.request_timeout (504, or an error event mid-stream). A
// client that hangs up is noticed within router.disconnect_poll (ConnectionWatch) or at the
// next write, and its request is aborted on every worker.
//
// Threads: httplib's pool (router.http_threads; a streaming request holds one), the listener
// std::jthread, and RouterCore's control thread. Destruction stops new connections, makes
// waiting handlers give up (503 / error event), joins everything.
// The process ignores SIGPIPE from Start() on (a vanished client must not kill the router).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <prometheus/registry.h>

#include "common/status.h"
#include "services/router/api_auth.h"
#include "services/router/router_config.h"
#include "services/router/router_core.h"
#include "services/router/router_metrics.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace pdserve::router {

enum class ApiEndpoint;
struct ApiError;
class RequestApiServer;
class ResponseBuilder;
struct SessionStep;

class RouterServer {
 public:
  // Loads the tokenizer, binds the control endpoint and the HTTP port, starts serving.
  // Errors: the tokenizer's (NotFound, InvalidArgument), InvalidArgument (config),
  // Unavailable (a port is in use).
  static Result<std::unique_ptr<RouterServer>> Start(RouterConfig config);
  ~RouterServer();
  RouterServer(const RouterServer&) = delete;
  RouterServer& operator=(const RouterServer&) = delete;

  int http_port() const { return port_; }
  const std::string& control_endpoint() const { return core_->control_endpoint(); }
  // The ZeroMQ request API's bound endpoint (docs/request-api.md); empty when it is off.
  std::string request_endpoint() const;
  RouterCore& core() { return *core_; }
  RouterMetrics& metrics() { return *metrics_; }
  const RouterConfig& config() const { return config_; }

 private:
  explicit RouterServer(RouterConfig config);
  void InstallRoutes();
  // A generation request, in phases (router_server.cc): Admit (parse, prepare, submit),
  // AwaitFirstOutput (the first token or error picks the HTTP status), then ReplyWhole or
  // ReplyStream. Each phase that fails has answered in `res` (or the client is gone).
  struct GenerateCall;
  void HandleGenerate(ApiEndpoint endpoint, const httplib::Request& req, httplib::Response& res);
  bool Admit(GenerateCall& call, const httplib::Request& req, httplib::Response& res);
  // Each phase handles the request's n choices (ChoiceSet); `first` / `into` hold one step per
  // choice.
  bool AwaitFirstOutput(GenerateCall& call, httplib::Response& res, std::vector<SessionStep>* first);
  void ReplyWhole(GenerateCall& call, std::vector<SessionStep> first, ResponseBuilder& builder,
                  httplib::Response& res);
  void ReplyStream(GenerateCall& call, std::vector<SessionStep> first, std::unique_ptr<ResponseBuilder> builder,
                   httplib::Response& res);
  // The one wait of the non-streaming phases: appends each choice's output to (*into)[choice]
  // until every choice finished (or, `until_first_token`, has its first token, or one failed).
  // False when the wait ended without output first: the client left (counted, `phase` in the
  // log), `deadline` passed (504 `timeout_message`) or the router is stopping (503).
  bool CollectOutput(GenerateCall& call, std::chrono::steady_clock::time_point deadline, bool until_first_token,
                     std::string_view phase, const std::string& timeout_message, std::vector<SessionStep>* into,
                     httplib::Response& res);
  void HandleHealth(httplib::Response& res);
  void HandleModels(httplib::Response& res);
  // POST /v1/tokenize (tokenize) or /v1/detokenize.
  void HandleTokenize(const httplib::Request& req, httplib::Response& res, bool tokenize);
  void HandleDrain(const httplib::Request& req, httplib::Response& res);
  void ReplyError(httplib::Response& res, const ApiError& error, bool count = true);
  // True when the request may go on; else the 401 is in `res`.
  bool Authorize(const httplib::Request& req, httplib::Response& res);

  const RouterConfig config_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::optional<tokenizer::ChatTemplate> chat_template_;
  std::optional<ApiKeyAuth> auth_;  // set when router.api_keys_file is
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<RouterMetrics> metrics_;
  std::unique_ptr<RouterCore> core_;
  std::unique_ptr<RequestApiServer> request_api_;  // router.request_endpoint; before core_ dies
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> listener_done_{false};  // listen_after_bind() returned
  int port_ = 0;
  std::jthread listener_;  // runs http_->listen_after_bind(); stopped by http_->stop()
};

}  // namespace pdserve::router
