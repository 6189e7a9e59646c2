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
#include "services/router/choice_set.h"
#include "services/router/connection_watch.h"
#include "services/router/generation_session.h"
#include "services/router/openai_request.h"
#include "services/router/openai_response.h"
#include "services/router/request_api_server.h"
#include "services/router/request_prep.h"
#include "services/router/tokenize_api.h"
#include "services/router/http_thread_pool.h"
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

// HTTP threads beyond max_outstanding_requests: connections that are not admitted requests
// (scrapes, health checks, 429 replies, idle keep-alive clients).
constexpr size_t kSpareHttpThreads = 64;

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

// Waits for the next steps of the request's choices, checking the client, the deadline and
// shutdown before every wait and at least every `poll` (a poll() without timeout costs about a
// microsecond, far less than a token). On kTimeout / kShutdown / kDisconnected every choice is
// cancelled.
WaitEnd WaitSteps(ChoiceSet& choices, const ConnectionWatch& watch, Clock::time_point deadline,
                  std::chrono::milliseconds poll, const std::atomic<bool>& stopping,
                  std::vector<std::pair<uint32_t, SessionStep>>* out) {
  while (true) {
    if (stopping.load()) {
      choices.Cancel("router shutting down");
      return WaitEnd::kShutdown;
    }
    if (watch.PeerClosed()) {
      choices.Cancel("client disconnected");
      return WaitEnd::kDisconnected;
    }
    if (Clock::now() >= deadline) {
      choices.Cancel("router-side deadline");
      return WaitEnd::kTimeout;
    }
    *out = choices.Next(std::min(deadline, Clock::now() + poll));
    if (!out->empty()) return WaitEnd::kStep;
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

// The first choice that ended with an error, if any.
const SessionStep* FailedStep(const std::vector<SessionStep>& steps) {
  for (const SessionStep& s : steps)
    if (s.finished && !s.error.ok()) return &s;
  return nullptr;
}

UsageCounts Usage(const ChoiceSet& choices, bool chat) {
  UsageCounts u{choices.prompt_tokens(), choices.completion_tokens(), std::nullopt, choices.cached_prompt_tokens()};
  if (chat) u.reasoning_tokens = choices.reasoning_tokens();
  return u;
}

// Everything a streaming reply needs after the handler returned.
struct StreamState {
  std::shared_ptr<ChoiceSet> choices;
  std::unique_ptr<ResponseBuilder> builder;
  std::optional<std::vector<SessionStep>> pending;  // output received before the reply started
  ConnectionWatch watch;
  Clock::time_point deadline;
  RouterMetrics* metrics = nullptr;
  std::chrono::milliseconds poll{};
  const std::atomic<bool>* stopping = nullptr;
  bool chat = false;
  bool include_usage = false;
  bool sent_role = false;
  bool done = false;
  bool counted = false;

  void Count(RequestOutcome outcome) {
    if (!counted) metrics->CountRequest(outcome);
    counted = true;
  }
};

// The chunked content provider of a streaming reply: writes the next SSE events (the role
// chunk of each choice first for chat, then each step's output, each choice's finish chunk,
// then the usage and [DONE], or an error event and [DONE]). False closes the connection.
bool WriteNextEvents(StreamState& state, httplib::DataSink& sink) {
  if (state.done) {
    sink.done();
    return true;
  }
  std::string out;
  ChoiceSet& choices = *state.choices;
  if (state.chat && !state.sent_role) {
    for (uint32_t i = 0; i < choices.size(); ++i) out += SseEvent(state.builder->RoleChunk(i));
    state.sent_role = true;
  }
  std::vector<std::pair<uint32_t, SessionStep>> steps;
  if (state.pending) {
    for (uint32_t i = 0; i < state.pending->size(); ++i) steps.emplace_back(i, std::move((*state.pending)[i]));
    state.pending.reset();
  } else {
    const WaitEnd end = WaitSteps(choices, state.watch, state.deadline, state.poll, *state.stopping, &steps);
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
  for (auto& [index, step] : steps) {
    const std::vector<std::string>& ids = choices.choice(index).tool_call_ids();
    // Tokens that render no text (a skipped special token, a partial character, a possible
    // marker the parser holds back) produce no chunk unless their logprobs were asked for.
    if (state.builder->HasOutput(step)) out += SseEvent(state.builder->Chunk(index, step, ids, std::nullopt));
    if (!step.finished) continue;
    if (!step.error.ok()) {
      const ApiError e = ApiError::FromStatus(step.error, state.builder->id());
      out += SseEvent(e.ToJson());
      state.Count(RequestOutcome::kError);
      services::RequestLog("router", state.builder->id()).Warn("failed mid-stream: {}", step.error.ToString());
      choices.Cancel("another choice of the request failed");
      out += kSseDone;
      state.done = true;
      break;
    }
    out += SseEvent(state.builder->Chunk(index, SessionStep{}, ids, step.finish_reason));
  }
  if (!state.done && choices.finished()) {
    if (state.include_usage) out += SseEvent(state.builder->UsageChunk(Usage(choices, state.chat)));
    state.Count(RequestOutcome::kOk);
    out += kSseDone;
    state.done = true;
  }
  if (!out.empty() && !sink.write(out.data(), out.size())) {
    choices.Cancel("client disconnected");
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
  co.decode_local_prefill_tokens = static_cast<uint32_t>(c.routing.decode_local_prefill_tokens);
  co.pull_min_tokens = static_cast<uint32_t>(c.routing.pull_min_tokens);
  co.default_max_tokens = c.default_max_tokens;
  co.max_outstanding_requests = c.max_outstanding_requests;
  co.max_migrations = c.max_migrations;
  co.stall_timeout = c.stall_timeout;
  co.control_curve = std::move(control_curve);

  s->registry_ = std::make_shared<prometheus::Registry>();
  s->metrics_ = std::make_unique<RouterMetrics>(s->registry_);
  PDSERVE_ASSIGN_OR_RETURN(s->core_, RouterCore::Start(co, s->metrics_.get()));

  s->http_ = std::make_unique<HttpServer>();
  // A stream holds its connection's thread: the pool grows past the admitted requests' bound
  // (http_thread_pool.h), so scrapes, health checks and 429 replies always find a thread.
  const size_t warm = static_cast<size_t>(c.http_threads);
  const size_t max = std::max(warm, size_t{c.max_outstanding_requests} + kSpareHttpThreads);
  s->http_->new_task_queue = [warm, max] { return new HttpThreadPool(warm, max); };
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
  // vLLM serves these at the root, SGLang and others under /v1: both spellings work.
  for (const char* path : {"/v1/tokenize", "/tokenize"})
    h.Post(path, [this](const httplib::Request& req, httplib::Response& res) { HandleTokenize(req, res, true); });
  for (const char* path : {"/v1/detokenize", "/detokenize"})
    h.Post(path, [this](const httplib::Request& req, httplib::Response& res) { HandleTokenize(req, res, false); });
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

void RouterServer::HandleTokenize(const httplib::Request& req, httplib::Response& res, bool tokenize) {
  json out;
  std::optional<ApiError> e;
  if (tokenize) {
    // The largest context a request could get: that of the roomiest ready output worker.
    std::optional<uint32_t> max_model_len;
    for (const WorkerEntry& w : core_->WorkerSnapshot())
      if (!w.draining && w.role != services::WorkerRole::kPrefill)
        max_model_len = std::max(max_model_len.value_or(0), w.capacity.max_context_tokens);
    e = Tokenize(config_, *tokenizer_, *chat_template_, req.body, max_model_len, &out);
  } else {
    e = Detokenize(config_, *tokenizer_, req.body, &out);
  }
  // Not generation requests: not counted in pdserve_router_requests_total.
  if (e) return ReplyError(res, *e, false);
  res.set_content(DumpJson(out), "application/json");
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
  std::shared_ptr<ChoiceSet> choices;  // set by Admit
  std::vector<int32_t> prompt_token_ids;  // set by Admit when the request asks for token ids
  ConnectionWatch watch;
  Clock::time_point deadline{};  // of the whole request
};

void RouterServer::HandleGenerate(ApiEndpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  GenerateCall call(endpoint, Clock::now());
  res.set_header("X-Request-Id", call.tag);
  if (!Admit(call, req, res)) return;
  std::vector<SessionStep> first;
  if (!AwaitFirstOutput(call, res, &first)) return;
  // Built at the first output: its "created" time is the reply's.
  auto builder = std::make_unique<ResponseBuilder>(call.endpoint, call.tag, config_.model_name,
                                                   call.request.include_usage, call.request.logprobs, *tokenizer_,
                                                   static_cast<uint32_t>(call.choices->size()));
  if (call.request.return_token_ids) builder->ReturnTokenIds(std::move(call.prompt_token_ids));
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
  if (call.request.return_token_ids) call.prompt_token_ids = prepared.spec.prompt;
  auto submitted = SubmitChoices(*core_, prepared);
  if (!submitted.ok()) {
    call.log.Debug("not dispatched: {}", submitted.status().ToString());
    ReplyError(res, SubmitError(submitted.status(), call.tag, call.chat));
    return false;
  }
  metrics_->queue_time.Observe(std::chrono::duration<double>(Clock::now() - call.arrival).count());
  metrics_->prompt_tokens.Increment(prepared.prompt_tokens);

  std::vector<std::unique_ptr<GenerationSession>> sessions;
  for (auto& request : submitted.value())
    sessions.push_back(std::make_unique<GenerationSession>(core_.get(), std::move(request), *tokenizer_,
                                                           prepared.session, metrics_.get()));
  call.choices = std::make_shared<ChoiceSet>(std::move(sessions));
  call.watch = ConnectionWatch::ForRequest(req);
  if (!call.watch.found())
    call.log.Debug("client socket not found ({}:{} -> port {}): hang-ups are noticed at the next write",
                   req.remote_addr, req.remote_port, req.local_port);
  call.deadline = call.arrival + config_.request_timeout;
  return true;
}

bool RouterServer::CollectOutput(GenerateCall& call, Clock::time_point deadline, bool until_first_token,
                                 std::string_view phase, const std::string& timeout_message,
                                 std::vector<SessionStep>* into, httplib::Response& res) {
  into->resize(call.choices->size());
  while (!call.choices->finished() && !(until_first_token && call.choices->started())) {
    // Waiting for first tokens: one failed choice decides the reply.
    if (until_first_token && FailedStep(*into)) return true;
    std::vector<std::pair<uint32_t, SessionStep>> steps;
    const WaitEnd end = WaitSteps(*call.choices, call.watch, deadline, config_.disconnect_poll, stopping_, &steps);
    if (end == WaitEnd::kStep) {
      for (auto& [index, step] : steps) AppendStep(&(*into)[index], std::move(step));
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

bool RouterServer::AwaitFirstOutput(GenerateCall& call, httplib::Response& res, std::vector<SessionStep>* first) {
  // The first token of every choice, or the first error, decides the HTTP status.
  const auto first_deadline = std::min(call.deadline, call.arrival + config_.first_token_timeout);
  if (!CollectOutput(call, first_deadline, true, " before the first token",
                     fmt::format("no first token within the router's deadline (request id {})", call.tag), first,
                     res))
    return false;
  if (const SessionStep* failed = FailedStep(*first)) {
    call.log.Warn("failed before the first token: {}", failed->error.ToString());
    call.choices->Cancel("another choice of the request failed");
    ReplyError(res, ApiError::FromStatus(failed->error, call.tag));
    return false;
  }
  return true;
}

void RouterServer::ReplyWhole(GenerateCall& call, std::vector<SessionStep> first, ResponseBuilder& builder,
                              httplib::Response& res) {
  std::vector<SessionStep> all = std::move(first);
  if (!CollectOutput(call, call.deadline, false, "", RequestDeadlineMessage(call.tag), &all, res)) return;
  if (const SessionStep* failed = FailedStep(all)) {
    call.log.Warn("failed: {}", failed->error.ToString());
    call.choices->Cancel("another choice of the request failed");
    return ReplyError(res, ApiError::FromStatus(failed->error, call.tag));
  }
  const ChoiceSet& choices = *call.choices;
  std::vector<ChoiceOutput> outputs(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    outputs[i].text = std::move(all[i].text);
    outputs[i].tokens = std::move(all[i].tokens);
    outputs[i].token_ids = std::move(all[i].token_ids);
    outputs[i].finish_reason = all[i].finish_reason;
    outputs[i].message = choices.choice(i).message();
    outputs[i].tool_call_ids = choices.choice(i).tool_call_ids();
  }
  res.set_content(DumpJson(builder.Full(outputs, Usage(choices, call.chat))), "application/json");
  metrics_->CountRequest(RequestOutcome::kOk);
  call.log.Debug("done: {} choice(s), {} prompt + {} completion tokens, {}", choices.size(), choices.prompt_tokens(),
                 choices.completion_tokens(), all[0].finish_reason);
}

void RouterServer::ReplyStream(GenerateCall& call, std::vector<SessionStep> first,
                               std::unique_ptr<ResponseBuilder> builder, httplib::Response& res) {
  auto state = std::make_shared<StreamState>();
  state->choices = call.choices;
  state->builder = std::move(builder);
  state->pending = std::move(first);
  state->watch = call.watch;
  state->deadline = call.deadline;
  state->metrics = metrics_.get();
  state->poll = config_.disconnect_poll;
  state->stopping = &stopping_;
  state->chat = call.chat;
  state->include_usage = call.request.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [state](size_t, httplib::DataSink& sink) { return WriteNextEvents(*state, sink); },
      [state](bool) {
        // The response is gone (written, or the connection dropped before the provider ran).
        if (!state->choices->finished()) state->choices->Cancel("client disconnected");
        state->Count(RequestOutcome::kCancelled);
      });
}

}  // namespace pdserve::router
