#include "services/router/router_server.h"

#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "common/mapped_file.h"
#include "services/common/metrics.h"
#include "services/common/net_util.h"
#include "services/common/process_util.h"
#include "services/common/request_log.h"
#include "services/router/api_error.h"
#include "services/router/connection_watch.h"
#include "services/router/generation_session.h"
#include "services/router/openai_request.h"
#include "services/router/openai_response.h"
#include "services/router/request_api_server.h"
#include "services/router/request_prep.h"
#include "services/router/workers_view.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::router {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

RequestOutcome OutcomeFor(int http_status) {
  if (http_status == 429) return RequestOutcome::kRejected;
  if (http_status == 503) return RequestOutcome::kUnavailable;
  if (http_status == 504) return RequestOutcome::kTimeout;
  if (http_status >= 400 && http_status < 500) return RequestOutcome::kClientError;
  return RequestOutcome::kError;
}

// httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into the shared
// library): a burst of clients overflows it and some connections are reset. Linux lets a
// listening socket's backlog be raised by calling listen() again.
class HttpServer : public httplib::Server {
 public:
  bool RaiseBacklog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
};

// How a wait for output ended: with a step, or without one (the client left, the deadline
// passed, the router is shutting down).
enum class WaitEnd { kStep, kDisconnected, kTimeout, kShutdown };

// Waits for the next session step, checking the client, the deadline and shutdown before every
// wait and at least every `poll` (a poll() without timeout costs about a microsecond, far less
// than a token). On kTimeout / kShutdown / kDisconnected the session is cancelled.
WaitEnd WaitStep(GenerationSession& session, const ConnectionWatch& watch, Clock::time_point deadline,
                 std::chrono::milliseconds poll, const std::atomic<bool>& stopping, SessionStep* out) {
  while (true) {
    if (stopping.load()) {
      session.Cancel("router shutting down");
      return WaitEnd::kShutdown;
    }
    if (watch.PeerClosed()) {
      session.Cancel("client disconnected");
      return WaitEnd::kDisconnected;
    }
    if (Clock::now() >= deadline) {
      session.Cancel("router-side deadline");
      return WaitEnd::kTimeout;
    }
    if (auto step = session.Next(std::min(deadline, Clock::now() + poll))) {
      *out = std::move(*step);
      return WaitEnd::kStep;
    }
  }
}

// The error a wait that ended without output answers with: 504 with `timeout_message`, or 503
// for a router shutting down. nullopt for kDisconnected (nobody is left to answer) and kStep.
std::optional<ApiError> WaitEndError(WaitEnd end, const std::string& timeout_message) {
  switch (end) {
    case WaitEnd::kTimeout: return ApiError::Timeout(timeout_message);
    case WaitEnd::kShutdown: return ApiError::Unavailable("the router is shutting down", "shutting_down");
    case WaitEnd::kStep:
    case WaitEnd::kDisconnected: break;
  }
  return std::nullopt;
}

std::string RequestDeadlineMessage(const std::string& tag) {
  return fmt::format("the request exceeded the router's deadline (request id {})", tag);
}

void Append(SessionStep* into, SessionStep&& step) {
  into->text += step.text;
  for (auto& t : step.tokens) into->tokens.push_back(std::move(t));
  if (step.finished) {
    into->finished = true;
    into->finish_reason = std::move(step.finish_reason);
    into->error = std::move(step.error);
  }
}

// Everything a streaming reply needs after the handler returned.
struct StreamState {
  std::shared_ptr<GenerationSession> session;
  std::unique_ptr<ResponseBuilder> builder;
  std::optional<SessionStep> pending;  // output received before the reply started
  ConnectionWatch watch;
  Clock::time_point deadline;
  RouterMetrics* metrics = nullptr;
  std::chrono::milliseconds poll{};
  const std::atomic<bool>* stopping = nullptr;
  bool chat = false;
  bool include_usage = false;
  bool logprobs = false;
  bool sent_role = false;
  bool done = false;
  bool counted = false;

  void Count(RequestOutcome outcome) {
    if (!counted) metrics->CountRequest(outcome);
    counted = true;
  }
};

// The chunked content provider of a streaming reply: writes the next SSE events (the role
// chunk first for chat, then each step's text, then the finish or error event and [DONE]).
// False closes the connection.
bool WriteNextEvents(StreamState& state, httplib::DataSink& sink) {
  if (state.done) {
    sink.done();
    return true;
  }
  std::string out;
  if (state.chat && !state.sent_role) {
    out += SseEvent(state.builder->RoleChunk());
    state.sent_role = true;
  }
  SessionStep step;
  if (state.pending) {
    step = std::move(*state.pending);
    state.pending.reset();
  } else {
    const WaitEnd end = WaitStep(*state.session, state.watch, state.deadline, state.poll, *state.stopping, &step);
    if (end == WaitEnd::kDisconnected) {
      state.Count(RequestOutcome::kCancelled);
      return false;  // closes the connection
    }
    if (auto e = WaitEndError(end, RequestDeadlineMessage(state.builder->id()))) {
      out += SseEvent(e->ToJson());
      out += kSseDone;
      state.Count(OutcomeFor(e->http_status));
      state.done = true;
      const bool ok = sink.write(out.data(), out.size());
      sink.done();
      return ok;
    }
  }
  // Tokens that render no text (a skipped special token, a partial character) produce no
  // chunk unless their logprobs were asked for.
  if (!step.text.empty() || (state.logprobs && !step.tokens.empty()))
    out += SseEvent(state.builder->Chunk(step.text, step.tokens, std::nullopt));
  if (step.finished) {
    if (!step.error.ok()) {
      const ApiError e = ApiError::FromStatus(step.error, state.builder->id());
      out += SseEvent(e.ToJson());
      state.Count(RequestOutcome::kError);
      services::RequestLog("router", state.builder->id()).Warn("failed mid-stream: {}", step.error.ToString());
    } else {
      out += SseEvent(state.builder->Chunk("", {}, step.finish_reason));
      if (state.include_usage)
        out += SseEvent(state.builder->UsageChunk(state.session->prompt_tokens(), state.session->completion_tokens()));
      state.Count(RequestOutcome::kOk);
    }
    out += kSseDone;
    state.done = true;
  }
  if (!out.empty() && !sink.write(out.data(), out.size())) {
    state.session->Cancel("client disconnected");
    state.Count(RequestOutcome::kCancelled);
    return false;
  }
  if (state.done) sink.done();
  return true;
}

}  // namespace

Result<std::unique_ptr<RouterServer>> RouterServer::Start(RouterConfig config) {
  PDSERVE_RETURN_IF_ERROR(config.Validate());
  signal(SIGPIPE, SIG_IGN);
  auto log = GetLogger("router");
  std::unique_ptr<RouterServer> s(new RouterServer(std::move(config)));
  const RouterConfig& c = s->config_;
  // Key files first: a typo fails at once, before the tokenizer loads.
  if (!c.api_keys_file.empty()) {
    PDSERVE_ASSIGN_OR_RETURN(ApiKeyAuth auth, ApiKeyAuth::LoadFile(c.api_keys_file));
    log->info("API key authentication on: {} key(s) from '{}'", auth.key_count(), c.api_keys_file);
    s->auth_.emplace(std::move(auth));
  }
  services::CurveOptions control_curve;
  if (!c.control_curve_secret_key_file.empty()) {
    PDSERVE_ASSIGN_OR_RETURN(control_curve, services::LoadServerCurveOptions(c.control_curve_secret_key_file,
                                                                             c.control_curve_allowed_clients_file));
    log->info("control plane: CURVE on ({})", control_curve.allowed_client_keys.empty()
                                                   ? std::string("any worker key pair")
                                                   : fmt::format("{} allowed worker key(s)",
                                                                 control_curve.allowed_client_keys.size()));
  }

  services::CurveOptions request_curve;
  if (!c.request_curve_secret_key_file.empty()) {
    PDSERVE_ASSIGN_OR_RETURN(request_curve, services::LoadServerCurveOptions(c.request_curve_secret_key_file,
                                                                             c.request_curve_allowed_clients_file));
    log->info("request API: CURVE on ({})", request_curve.allowed_client_keys.empty()
                                                ? std::string("any client key pair")
                                                : fmt::format("{} allowed client key(s)",
                                                              request_curve.allowed_client_keys.size()));
  }

  const std::string tok_dir = c.tokenizer_dir.empty() ? tokenizer::DefaultTokenizerDir() : c.tokenizer_dir;
  auto tok = tokenizer::Tokenizer::Load(tok_dir);
  if (!tok.ok()) return tok.status().WithContext("loading the tokenizer from '" + tok_dir + "'");
  s->tokenizer_ = std::move(tok).value();
  auto tmpl = tokenizer::ChatTemplate::FromConfig(s->tokenizer_->config());
  if (!tmpl.ok()) return tmpl.status().WithContext("chat template");
  s->chat_template_.emplace(std::move(tmpl).value());

  PDSERVE_ASSIGN_OR_RETURN(RoutingPolicy prefill_policy, ParseRoutingPolicy(c.routing.prefill_policy));
  PDSERVE_ASSIGN_OR_RETURN(RoutingPolicy decode_policy, ParseRoutingPolicy(c.routing.decode_policy));
  PDSERVE_ASSIGN_OR_RETURN(RoutingPolicy colocated_policy, ParseRoutingPolicy(c.routing.colocated_policy));
  if (prefill_policy == RoutingPolicy::kKvCapacityAware)
    return Status::InvalidArgument("router.routing.prefill_policy cannot be kv_capacity_aware (prefill holds no KV)");
  RouterCoreOptions co;
  co.control_endpoint = c.control_endpoint;
  co.model_name = c.model_name;
  co.compat_hash = c.compat_hash;
  co.tokenizer_vocab_size = static_cast<uint32_t>(s->tokenizer_->id_limit());
  co.heartbeat_interval = c.heartbeat_interval;
  co.heartbeat_timeout = c.heartbeat_timeout;
  co.mode = c.routing.mode == "disaggregated" ? ServingMode::kDisaggregated
            : c.routing.mode == "colocated"   ? ServingMode::kColocated
                                              : ServingMode::kAuto;
  co.prefill_policy = prefill_policy;
  co.decode_policy = decode_policy;
  co.colocated_policy = colocated_policy;
  co.default_max_tokens = c.default_max_tokens;
  co.max_outstanding_requests = c.max_outstanding_requests;
  co.max_migrations = c.max_migrations;
  co.stall_timeout = c.stall_timeout;
  co.control_curve = std::move(control_curve);

  s->registry_ = std::make_shared<prometheus::Registry>();
  s->metrics_ = std::make_unique<RouterMetrics>(s->registry_);
  PDSERVE_ASSIGN_OR_RETURN(s->core_, RouterCore::Start(co, s->metrics_.get()));

  s->http_ = std::make_unique<HttpServer>();
  const size_t threads = static_cast<size_t>(c.http_threads);
  s->http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s->http_->set_payload_max_length(static_cast<size_t>(c.max_body_bytes));
  s->http_->set_tcp_nodelay(true);
  s->http_->set_read_timeout(c.http_read_timeout);
  s->http_->set_write_timeout(std::chrono::seconds(30));
  s->InstallRoutes();
  // httplib's default socket options add SO_REUSEPORT, with which a second router binds the same
  // port and the kernel splits the connections between the two. SO_REUSEADDR alone still lets a
  // restarted router take its port back from TIME_WAIT, and refuses a port another process owns.
  s->http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  if (c.port == 0) {
    s->port_ = s->http_->bind_to_any_port(c.host);
  } else {
    s->port_ = s->http_->bind_to_port(c.host, c.port) ? c.port : -1;
  }
  if (s->port_ <= 0)
    return Status::Unavailable(fmt::format("cannot listen on {}:{} (HTTP): {}", c.host, c.port,
                                           services::DescribeListenFailure(c.host, c.port)));
  if (!static_cast<HttpServer*>(s->http_.get())->RaiseBacklog(1024))
    log->warn("cannot raise the HTTP listen backlog: bursts of connections may be refused");
  httplib::Server* server = s->http_.get();
  s->listener_ = std::jthread([server, done = &s->listener_done_] {
    server->listen_after_bind();
    done->store(true);
  });
  // What clients and workers dial (docs/configuration.md "Addresses"): the listen addresses, with
  // a wildcard host (or every host, given router.advertise_host) replaced by the advertised one.
  auto advertised = [&c](const std::string& endpoint) {
    const std::string host = services::EndpointHost(endpoint);
    if (c.advertise_host.empty() && !services::IsWildcardHost(host)) return endpoint;
    return services::EndpointWithHost(endpoint, services::AdvertisedHost(host, c.advertise_host));
  };
  const std::string http_host = services::AdvertisedHost(c.host, c.advertise_host);
  const std::string control_advertised = advertised(s->core_->control_endpoint());
  log->info("serving model '{}' on http://{}:{} (listening on {}; control {}{}, routing {}: prefill {}, decode {}, "
            "colocated {})",
            c.model_name, http_host, s->port_, c.host, control_advertised,
            control_advertised == s->core_->control_endpoint() ? "" : " bound as " + s->core_->control_endpoint(),
            c.routing.mode, c.routing.prefill_policy, c.routing.decode_policy, c.routing.colocated_policy);
  if (!c.request_endpoint.empty()) {
    RequestApiServer::Context rc{&s->config_, s->tokenizer_.get(), &*s->chat_template_, s->core_.get(),
                                 s->metrics_.get(), s->auth_ ? &*s->auth_ : nullptr, std::move(request_curve)};
    PDSERVE_ASSIGN_OR_RETURN(s->request_api_, RequestApiServer::Start(rc));
  }
  if (!c.ready_file.empty()) {
    // The endpoints others dial; `host` is the advertised HTTP host.
    json ready = {{"http_port", s->port_},
                  {"host", http_host},
                  {"control_endpoint", control_advertised},
                  {"pid", getpid()}};
    if (s->request_api_) ready["request_endpoint"] = advertised(s->request_api_->endpoint());
    PDSERVE_RETURN_IF_ERROR(WriteStringToFile(c.ready_file, ready.dump()));
  }
  return s;
}

RouterServer::RouterServer(RouterConfig config) : config_(std::move(config)) {}

RouterServer::~RouterServer() {
  stopping_ = true;
  // httplib's stop() does nothing until listen_after_bind() has started its loop: a stop that
  // comes first (a signal in the router's first moments) would leave the listener in accept()
  // for ever. So repeat it until the listener thread has returned.
  if (http_ && listener_.joinable()) {
    while (!listener_done_.load()) {
      http_->stop();  // stops accepting; waits for handlers, which see stopping_
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (listener_.joinable()) listener_.join();
  http_.reset();
  request_api_.reset();
  core_.reset();
}

std::string RouterServer::request_endpoint() const { return request_api_ ? request_api_->endpoint() : std::string(); }

void RouterServer::ReplyError(httplib::Response& res, const ApiError& error, bool count) {
  res.status = error.http_status;
  res.set_content(error.Body(), "application/json");
  if (error.http_status == 429) res.set_header("Retry-After", std::to_string(config_.retry_after_s));
  if (count) metrics_->CountRequest(OutcomeFor(error.http_status));
}

bool RouterServer::Authorize(const httplib::Request& req, httplib::Response& res) {
  if (!auth_) return true;
  for (const auto& open : config_.auth_exempt_paths)
    if (req.path == open) return true;
  const auto verdict = auth_->Check(req.get_header_value("Authorization"));
  if (verdict == ApiKeyAuth::Verdict::kAllowed) return true;
  res.set_header("WWW-Authenticate", "Bearer");
  ReplyError(res, ApiError::Unauthorized(verdict == ApiKeyAuth::Verdict::kMissing
                                             ? "Missing API key: send the header 'Authorization: Bearer KEY'"
                                             : "Incorrect API key provided"));
  return false;
}

void RouterServer::InstallRoutes() {
  httplib::Server& h = *http_;
  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return Authorize(req, res) ? httplib::Server::HandlerResponse::Unhandled
                               : httplib::Server::HandlerResponse::Handled;
  });
  h.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(ApiEndpoint::kCompletions, req, res);
  });
  h.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(ApiEndpoint::kChat, req, res);
  });
  h.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { HandleModels(res); });
  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) { HandleHealth(res); });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(services::SerializeMetrics(*registry_), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (config_.admin_api) {
    h.Get("/admin/workers", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(DumpJson(json{{"workers", core_->WorkersJson()}}), "application/json");
    });
    h.Post("/admin/drain", [this](const httplib::Request& req, httplib::Response& res) { HandleDrain(req, res); });
    h.Get("/v1/workers", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(DumpJson(WorkersView(core_->WorkerSnapshot(), Clock::now(), config_.heartbeat_interval)),
                      "application/json");
    });
  }
  // Everything httplib answers by itself (unknown path 404, body too large 413, bad request
  // line 400, ...) still gets an OpenAI-shaped body.
  h.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                   httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    switch (res.status) {
      case 404: e = ApiError::NotFound("no route for " + req.method + " " + req.path); break;
      case 413:
        e = ApiError::TooLarge(fmt::format("the request body exceeds {} bytes", config_.max_body_bytes));
        metrics_->CountRequest(RequestOutcome::kClientError);
        break;
      default:
        e = ApiError{res.status, res.status >= 500 ? "internal_error" : "invalid_request_error",
                     fmt::format("HTTP {}", res.status), {}, {}};
    }
    res.set_content(e.Body(), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  h.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    GetLogger("router")->error("handler exception: {}", what);
    const std::string id = res.get_header_value("X-Request-Id");
    ReplyError(res, ApiError::Internal("internal error: " + what, id.empty() ? "-" : id));
  });
}

void RouterServer::HandleHealth(httplib::Response& res) {
  const ClusterHealth h = core_->Health();
  json body = {{"status", h.ready ? "ready" : "not_ready"},
               {"workers", {{"prefill", h.prefill}, {"decode", h.decode}, {"colocated", h.colocated},
                            {"draining", h.draining}}}};
  res.status = h.ready && !stopping_ ? 200 : 503;
  res.set_content(body.dump(), "application/json");
}

void RouterServer::HandleModels(httplib::Response& res) {
  json model = {{"id", config_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "pdserve"}};
  res.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(), "application/json");
}

void RouterServer::HandleDrain(const httplib::Request& req, httplib::Response& res) {
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::exception& e) {
    return ReplyError(res, ApiError::BadRequest("the request body is not valid JSON"), false);
  }
  if (!body.is_object() || !body.contains("worker_id") || !body["worker_id"].is_string())
    return ReplyError(res, ApiError::BadRequest("'worker_id' (string) is required", "worker_id"), false);
  uint32_t timeout_ms = 0;
  if (body.contains("timeout_ms")) {
    if (!body["timeout_ms"].is_number_unsigned())
      return ReplyError(res, ApiError::BadRequest("'timeout_ms' must be a non-negative integer", "timeout_ms"), false);
    timeout_ms = body["timeout_ms"].get<uint32_t>();
  }
  Status s = core_->DrainWorker(body["worker_id"].get<std::string>(), timeout_ms);
  if (!s.ok()) return ReplyError(res, ApiError::NotFound(s.message()), false);
  res.set_content(R"({"status":"draining"})", "application/json");
}

// One generation request on its way through HandleGenerate's phases.
struct RouterServer::GenerateCall {
  GenerateCall(ApiEndpoint endpoint_in, Clock::time_point arrival_in)
      : endpoint(endpoint_in),
        chat(endpoint_in == ApiEndpoint::kChat),
        tag(NewRequestTag(chat)),
        arrival(arrival_in),
        log("router", tag) {}

  const ApiEndpoint endpoint;
  const bool chat;
  const std::string tag;
  const Clock::time_point arrival;
  const services::RequestLog log;
  ParsedRequest request;
  std::shared_ptr<GenerationSession> session;  // set by Admit
  ConnectionWatch watch;
  Clock::time_point deadline{};  // of the whole request
};

void RouterServer::HandleGenerate(ApiEndpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  GenerateCall call(endpoint, Clock::now());
  res.set_header("X-Request-Id", call.tag);
  if (!Admit(call, req, res)) return;
  SessionStep first;
  if (!AwaitFirstOutput(call, res, &first)) return;
  // Built at the first output: its "created" time is the reply's.
  auto builder = std::make_unique<ResponseBuilder>(call.endpoint, call.tag, config_.model_name,
                                                   call.request.include_usage, call.request.logprobs, *tokenizer_);
  if (call.request.stream) {
    ReplyStream(call, std::move(first), std::move(builder), res);
  } else {
    ReplyWhole(call, std::move(first), *builder, res);
  }
}

bool RouterServer::Admit(GenerateCall& call, const httplib::Request& req, httplib::Response& res) {
  if (auto err = ParseRequest(call.endpoint, req.body, &call.request)) {
    call.log.Debug("rejected: {}", err->message);
    ReplyError(res, *err);
    return false;
  }
  PreparedRequest prepared;
  if (auto err = PrepareRequest(config_, *tokenizer_, *chat_template_, call.request, call.tag, call.arrival, &prepared)) {
    call.log.Debug("rejected: {}", err->message);
    ReplyError(res, *err);
    return false;
  }
  auto submitted = core_->Submit(prepared.spec);
  if (!submitted.ok()) {
    call.log.Debug("not dispatched: {}", submitted.status().ToString());
    ReplyError(res, SubmitError(submitted.status(), call.tag, call.chat));
    return false;
  }
  metrics_->queue_time.Observe(std::chrono::duration<double>(Clock::now() - call.arrival).count());
  metrics_->prompt_tokens.Increment(prepared.prompt_tokens);

  call.session = std::make_shared<GenerationSession>(core_.get(), std::move(submitted).value(), *tokenizer_,
                                                     std::move(prepared.session), metrics_.get());
  call.watch = ConnectionWatch::ForRequest(req);
  if (!call.watch.found())
    call.log.Debug("client socket not found ({}:{} -> port {}): hang-ups are noticed at the next write",
                   req.remote_addr, req.remote_port, req.local_port);
  call.deadline = call.arrival + config_.request_timeout;
  return true;
}

bool RouterServer::CollectOutput(GenerateCall& call, Clock::time_point deadline, bool until_first_token,
                                 std::string_view phase, const std::string& timeout_message, SessionStep* into,
                                 httplib::Response& res) {
  while (!into->finished && !(until_first_token && call.session->has_first_token())) {
    SessionStep step;
    const WaitEnd end = WaitStep(*call.session, call.watch, deadline, config_.disconnect_poll, stopping_, &step);
    if (end == WaitEnd::kStep) {
      Append(into, std::move(step));
      continue;
    }
    if (end == WaitEnd::kDisconnected) {
      call.log.Info("client disconnected{}", phase);
      metrics_->CountRequest(RequestOutcome::kCancelled);
    } else {
      if (end == WaitEnd::kTimeout) call.log.Warn("{}", timeout_message);
      ReplyError(res, *WaitEndError(end, timeout_message));
    }
    return false;
  }
  return true;
}

bool RouterServer::AwaitFirstOutput(GenerateCall& call, httplib::Response& res, SessionStep* first) {
  // The first token or the first error decides the HTTP status.
  const auto first_deadline = std::min(call.deadline, call.arrival + config_.first_token_timeout);
  if (!CollectOutput(call, first_deadline, true, " before the first token",
                     fmt::format("no first token within the router's deadline (request id {})", call.tag), first,
                     res))
    return false;
  if (first->finished && !first->error.ok()) {
    call.log.Warn("failed before the first token: {}", first->error.ToString());
    ReplyError(res, ApiError::FromStatus(first->error, call.tag));
    return false;
  }
  return true;
}

void RouterServer::ReplyWhole(GenerateCall& call, SessionStep first, ResponseBuilder& builder,
                              httplib::Response& res) {
  SessionStep all = std::move(first);
  if (!CollectOutput(call, call.deadline, false, "", RequestDeadlineMessage(call.tag), &all, res)) return;
  if (!all.error.ok()) {
    call.log.Warn("failed: {}", all.error.ToString());
    return ReplyError(res, ApiError::FromStatus(all.error, call.tag));
  }
  const GenerationSession& session = *call.session;
  res.set_content(DumpJson(builder.Full(all.text, all.tokens, all.finish_reason, session.prompt_tokens(),
                                        session.completion_tokens())),
                  "application/json");
  metrics_->CountRequest(RequestOutcome::kOk);
  call.log.Debug("done: {} prompt + {} completion tokens, {}", session.prompt_tokens(), session.completion_tokens(),
                 all.finish_reason);
}

void RouterServer::ReplyStream(GenerateCall& call, SessionStep first, std::unique_ptr<ResponseBuilder> builder,
                               httplib::Response& res) {
  auto state = std::make_shared<StreamState>();
  state->session = call.session;
  state->builder = std::move(builder);
  state->pending = std::move(first);
  state->watch = call.watch;
  state->deadline = call.deadline;
  state->metrics = metrics_.get();
  state->poll = config_.disconnect_poll;
  state->stopping = &stopping_;
  state->chat = call.chat;
  state->include_usage = call.request.include_usage;
  state->logprobs = call.request.logprobs;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [state](size_t, httplib::DataSink& sink) { return WriteNextEvents(*state, sink); },
      [state](bool) {
        // The response is gone (written, or the connection dropped before the provider ran).
        if (!state->session->finished()) state->session->Cancel("client disconnected");
        state->Count(RequestOutcome::kCancelled);
      });
}

}  // namespace pdserve::router
