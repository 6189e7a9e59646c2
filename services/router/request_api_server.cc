#include "services/router/request_api_server.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "services/common/request_log.h"
#include "services/router/request_prep.h"

namespace pdserve::router {

namespace api = services::api;
// Ordered: a schema's property order is the order the constrained output writes them in.
using json = nlohmann::ordered_json;

namespace {

RequestOutcome OutcomeForStatus(int http_status) {
  if (http_status == 429) return RequestOutcome::kRejected;
  if (http_status == 503) return RequestOutcome::kUnavailable;
  if (http_status == 504) return RequestOutcome::kTimeout;
  if (http_status >= 400 && http_status < 500) return RequestOutcome::kClientError;
  return RequestOutcome::kError;
}

FinishReason FinishFor(const std::string& reason) {
  if (reason == "stop" || reason == "tool_calls") return FinishReason::kStop;
  if (reason == "length") return FinishReason::kLength;
  return FinishReason::kNone;
}

// A JSON Schema given as text, parsed keeping its property order; nullopt when it is not JSON.
std::optional<json> SchemaJson(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

}  // namespace

std::optional<ApiError> ApiSubmitToParsed(const api::Submit& m, ParsedRequest* out) {
  // The submission becomes the JSON body the HTTP API would have received, so both fronts run
  // one validator (ranges, unsupported features, error messages and params).
  json body = {{"model", m.model}};
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  switch (m.kind) {
    case api::PromptKind::kTokenIds: body["prompt"] = m.prompt_ids; break;
    case api::PromptKind::kText: body["prompt"] = m.prompt_text; break;
    case api::PromptKind::kChat: {
      endpoint = ApiEndpoint::kChat;
      json messages = json::array();
      for (const auto& cm : m.messages) {
        json j = {{"role", cm.role}, {"content", cm.content ? json(*cm.content) : json(nullptr)}};
        if (!cm.tool_calls.empty()) {
          json calls = json::array();
          for (const auto& tc : cm.tool_calls)
            calls.push_back({{"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
          j["tool_calls"] = std::move(calls);
        }
        messages.push_back(std::move(j));
      }
      body["messages"] = std::move(messages);
      if (m.thinking) body["thinking"] = *m.thinking;
      break;
    }
  }
  const api::Sampling& s = m.sampling;
  if (s.max_tokens) body["max_tokens"] = *s.max_tokens;
  if (s.temperature) body["temperature"] = *s.temperature;
  if (s.top_p) body["top_p"] = *s.top_p;
  if (s.top_k) body["top_k"] = *s.top_k;
  if (s.min_p) body["min_p"] = *s.min_p;
  if (s.presence_penalty) body["presence_penalty"] = *s.presence_penalty;
  if (s.frequency_penalty) body["frequency_penalty"] = *s.frequency_penalty;
  if (s.repetition_penalty) body["repetition_penalty"] = *s.repetition_penalty;
  if (s.seed) body["seed"] = *s.seed;
  if (!m.stop.empty()) body["stop"] = m.stop;
  if (!m.stop_token_ids.empty()) body["stop_token_ids"] = m.stop_token_ids;
  body["ignore_eos"] = m.ignore_eos;
  body["skip_special_tokens"] = m.skip_special_tokens;
  if (m.logprobs) {
    if (endpoint == ApiEndpoint::kChat) {
      body["logprobs"] = true;
      body["top_logprobs"] = m.top_logprobs;
    } else {
      body["logprobs"] = m.top_logprobs;  // completions: the number of alternatives
    }
  } else if (m.top_logprobs > 0) {
    return ApiError::BadRequest("'top_logprobs' requires 'logprobs': true", "top_logprobs");
  }
  if (!m.user.empty()) body["user"] = m.user;
  if (m.n != 1) body["n"] = m.n;
  if (!m.logit_bias.empty()) {
    json bias = json::object();
    for (const LogitBias& b : m.logit_bias) {
      // Repeated ids add up, as SamplingParams::logit_bias does; the map keeps one entry each.
      const std::string key = std::to_string(b.token);
      bias[key] = (bias.contains(key) ? bias[key].get<double>() : 0.0) + b.bias;
    }
    body["logit_bias"] = std::move(bias);
  }
  if (!m.tools.empty()) {
    if (m.kind != api::PromptKind::kChat)
      return ApiError::BadRequest("'tools' are only supported with chat messages", "tools");
    json tools = json::array();
    for (size_t i = 0; i < m.tools.size(); ++i) {
      const api::Tool& t = m.tools[i];
      json f = {{"name", t.name}};
      if (!t.description.empty()) f["description"] = t.description;
      if (!t.parameters.empty()) {
        auto params = SchemaJson(t.parameters);
        if (!params)
          return ApiError::BadRequest("tools[" + std::to_string(i) + "].function.parameters is not JSON", "tools");
        f["parameters"] = std::move(*params);
      }
      tools.push_back({{"type", "function"}, {"function", std::move(f)}});
    }
    body["tools"] = std::move(tools);
  }
  switch (m.tool_choice.mode) {
    case api::ToolChoiceMode::kAuto: break;  // the default, with or without tools
    case api::ToolChoiceMode::kNone: body["tool_choice"] = "none"; break;
    case api::ToolChoiceMode::kRequired: body["tool_choice"] = "required"; break;
    case api::ToolChoiceMode::kFunction:
      body["tool_choice"] = {{"type", "function"}, {"function", {{"name", m.tool_choice.function}}}};
      break;
  }
  const api::ResponseFormat& rf = m.response_format;
  switch (rf.type) {
    case api::ResponseFormatType::kText: break;
    case api::ResponseFormatType::kJsonObject: body["response_format"] = {{"type", "json_object"}}; break;
    case api::ResponseFormatType::kJsonSchema: {
      auto schema = SchemaJson(rf.text);
      if (!schema)
        return ApiError::BadRequest("response_format.json_schema.schema: json_schema: not valid JSON",
                                    "response_format");
      body["response_format"] = {{"type", "json_schema"},
                                 {"json_schema", {{"name", "response"}, {"schema", std::move(*schema)},
                                                  {"strict", rf.strict}}}};
      break;
    }
    case api::ResponseFormatType::kRegex: body["response_format"] = {{"type", "regex"}, {"regex", rf.text}}; break;
    case api::ResponseFormatType::kGrammar:
      body["response_format"] = {{"type", "grammar"}, {"grammar", rf.text}};
      break;
  }
  body["stream"] = true;
  try {
    return ParseRequestJson(endpoint, body, out);
  } catch (const json::exception& e) {
    return ApiError::BadRequest(std::string("malformed request: ") + e.what());
  }
}

bool RequestApiServer::Session::started() const {
  for (const auto& g : gens)
    if (!g->finished() && !g->has_first_token()) return false;
  return true;
}

bool RequestApiServer::Session::finished() const {
  for (const auto& g : gens)
    if (!g->finished()) return false;
  return true;
}

void RequestApiServer::Session::Cancel(std::string_view reason) {
  for (auto& g : gens) g->Cancel(reason);
}

RequestApiServer::RequestApiServer(Context context) : ctx_(context) {}

Result<std::unique_ptr<RequestApiServer>> RequestApiServer::Start(Context context) {
  if (!context.config || !context.tokenizer || !context.chat_template || !context.core || !context.metrics)
    return Status::InvalidArgument("RequestApiServer needs every part of its context");
  std::unique_ptr<RequestApiServer> server(new RequestApiServer(context));
  RequestApiServer* self = server.get();
  services::ControlChannelOptions co;
  co.kind = services::ControlChannelOptions::Kind::kRouterBind;
  co.endpoint = context.config->request_endpoint;
  co.tick_interval = context.config->disconnect_poll;
  co.name = "request-api";
  co.zmtp_heartbeat_ms = static_cast<int>(context.config->request_keepalive.count());
  // The handlers run on the channel's thread, which starts before channel_ is assigned: they
  // reach the channel through the mailbox, set under its lock below.
  co.on_unreachable = [self](std::string_view peer) { self->DropPeer(std::string(peer)); };
  co.on_wake = [self] { self->OnWake(); };
  std::unique_lock<std::mutex> lock(server->mailbox_->mu);
  PDSERVE_ASSIGN_OR_RETURN(
      server->channel_,
      services::ControlChannel::Start(
          co, [self](std::string_view peer, std::string_view payload) { self->OnMessage(peer, payload); },
          [self](Clock::time_point now) { self->Timers(now); }, context.curve));
  server->mailbox_->channel = server->channel_.get();
  server->channel_for_handlers_ = server->channel_.get();
  lock.unlock();
  GetLogger("router")->info("ZeroMQ request API on {}", server->channel_->endpoint());
  return server;
}

RequestApiServer::~RequestApiServer() {
  if (!channel_) return;
  // The channel thread owns the sessions: ask it to end them (503 to each client, abort to
  // the workers) and wait until it did, then stop the channel (its linger sends the replies).
  {
    std::unique_lock<std::mutex> lock(mailbox_->mu);
    mailbox_->stop = true;
    channel_->Wake();
    mailbox_->cv.wait_for(lock, std::chrono::seconds(5), [&] { return mailbox_->stopped; });
    mailbox_->channel = nullptr;  // listeners no longer wake it
  }
  channel_.reset();
}

void RequestApiServer::Send(const std::string& peer, const api::Message& message) {
  auto bytes = api::EncodeMessage(message);
  if (!bytes.ok()) {
    GetLogger("router")->error("cannot encode a request API {}: {}", api::MessageName(message),
                               bytes.status().ToString());
    return;
  }
  last_sent_[peer] = Clock::now();
  channel_for_handlers_->Send(peer, std::move(bytes).value());
}

void RequestApiServer::SendError(const std::string& peer, uint64_t client_id, const ApiError& e) {
  Send(peer, api::Error{client_id, static_cast<uint32_t>(e.http_status), e.type, e.code, e.param, e.message});
}

void RequestApiServer::OnWake() {
  bool stop;
  {
    std::lock_guard<std::mutex> lock(mailbox_->mu);
    ready_.swap(mailbox_->ready);
    stop = mailbox_->stop && !mailbox_->stopped;
  }
  for (uint64_t key : ready_) Drain(key);
  ready_.clear();
  if (stop) Shutdown();
}

void RequestApiServer::Shutdown() {
  // Every request of this front ends with a 503, as HTTP streams do.
  const ApiError e = ApiError::Unavailable("the router is shutting down", "shutting_down");
  for (auto& [key, s] : sessions_) {
    s.Cancel("router shutting down");
    SendError(s.peer, s.client_id, e);
    ctx_.metrics->CountRequest(RequestOutcome::kUnavailable);
  }
  sessions_.clear();
  by_client_.clear();
  {
    std::lock_guard<std::mutex> lock(mailbox_->mu);
    mailbox_->stopped = true;
  }
  mailbox_->cv.notify_all();
}

void RequestApiServer::OnMessage(std::string_view peer_view, std::string_view payload) {
  const auto arrival = Clock::now();
  const std::string peer(peer_view);
  {
    std::lock_guard<std::mutex> lock(mailbox_->mu);
    if (mailbox_->stop) return SendError(peer, 0, ApiError::Unavailable("the router is shutting down", "shutting_down"));
  }
  auto decoded = api::DecodeMessage(payload);
  if (!decoded.ok()) {
    ctx_.metrics->request_api_malformed.Increment();
    GetLogger("router")->debug("request API: malformed message ({} bytes): {}", payload.size(),
                               decoded.status().ToString());
    return SendError(peer, 0,
                     ApiError::BadRequest("the message is not a valid request API message: " +
                                              decoded.status().message(),
                                          {}, "malformed_message"));
  }
  api::Message& msg = decoded.value();
  if (auto* submit = std::get_if<api::Submit>(&msg)) return HandleSubmit(peer, std::move(*submit), arrival);
  if (auto* abort = std::get_if<api::Abort>(&msg)) return HandleAbort(peer, *abort);
  if (auto* ping = std::get_if<api::Ping>(&msg)) return Send(peer, api::Pong{ping->nonce});
  ctx_.metrics->request_api_malformed.Increment();
  SendError(peer, 0,
            ApiError::BadRequest(fmt::format("'{}' is a message the router sends, not one it accepts (send submit, "
                                             "abort or ping)",
                                             api::MessageName(msg)),
                                 {}, "unexpected_message"));
}

void RequestApiServer::HandleSubmit(const std::string& peer, api::Submit m, Clock::time_point arrival) {
  auto reject = [&](const ApiError& e) {
    SendError(peer, m.request_id, e);
    ctx_.metrics->CountRequest(OutcomeForStatus(e.http_status));
  };
  // First, as the HTTP front's pre-routing check: an unauthenticated submit is not validated.
  if (ctx_.auth) {
    const auto verdict = ctx_.auth->CheckKey(m.api_key);
    if (verdict != ApiKeyAuth::Verdict::kAllowed) {
      GetLogger("router")->debug("request API: submit {} refused: {} API key", m.request_id,
                                 verdict == ApiKeyAuth::Verdict::kMissing ? "no" : "a wrong");
      return reject(ApiError::Unauthorized(verdict == ApiKeyAuth::Verdict::kMissing
                                               ? "Missing API key: set the submit message's apiKey"
                                               : "Incorrect API key provided"));
    }
  }
  if (by_client_.count({peer, m.request_id}))
    return reject(ApiError::BadRequest(fmt::format("request id {} is already in flight on this connection", m.request_id),
                                       "requestId", "duplicate_request_id"));
  ParsedRequest pr;
  if (auto e = ApiSubmitToParsed(m, &pr)) return reject(*e);
  const bool chat = pr.endpoint == ApiEndpoint::kChat;
  const std::string tag = NewRequestTag(chat);
  services::RequestLog rlog("router", tag);
  PreparedRequest prep;
  if (auto e = PrepareRequest(*ctx_.config, *ctx_.tokenizer, *ctx_.chat_template, pr, tag, arrival, &prep)) {
    rlog.Debug("rejected: {}", e->message);
    return reject(*e);
  }
  auto submitted = SubmitChoices(*ctx_.core, prep);
  if (!submitted.ok()) {
    rlog.Debug("not dispatched: {}", submitted.status().ToString());
    return reject(SubmitError(submitted.status(), tag, chat));
  }
  ctx_.metrics->queue_time.Observe(std::chrono::duration<double>(Clock::now() - arrival).count());
  ctx_.metrics->prompt_tokens.Increment(prep.prompt_tokens);
  const uint64_t key = next_key_++;
  Session s;
  s.peer = peer;
  s.client_id = m.request_id;
  s.deadline = arrival + ctx_.config->request_timeout;
  s.first_deadline = std::min(s.deadline, arrival + ctx_.config->first_token_timeout);
  const uint32_t max_tokens = submitted.value()[0]->max_tokens();
  std::weak_ptr<Mailbox> weak = mailbox_;
  for (auto& request : submitted.value()) {
    s.gens.push_back(std::make_unique<GenerationSession>(ctx_.core, request, *ctx_.tokenizer, prep.session,
                                                         ctx_.metrics));
    s.gens.back()->SetListener([weak, key] {
      if (auto mb = weak.lock()) {
        std::lock_guard<std::mutex> lock(mb->mu);
        mb->ready.push_back(key);
        if (mb->channel) mb->channel->Wake();
      }
    });
  }
  sessions_.emplace(key, std::move(s));
  by_client_[{peer, m.request_id}] = key;
  Send(peer, api::Accepted{m.request_id, tag, prep.prompt_tokens, max_tokens});
  Drain(key);  // events that arrived before the listeners were set
}

void RequestApiServer::HandleAbort(const std::string& peer, const api::Abort& abort) {
  auto it = by_client_.find({peer, abort.request_id});
  if (it == by_client_.end()) return;  // finished already, or never existed: nothing to do
  const uint64_t key = it->second;
  Session& s = sessions_.at(key);
  // Every choice still running ends with an abort output.
  for (uint32_t i = 0; i < s.gens.size(); ++i) {
    GenerationSession& g = *s.gens[i];
    if (g.finished()) continue;
    g.Cancel(abort.reason.empty() ? "aborted by the client" : abort.reason);
    api::Output out;
    out.request_id = s.client_id;
    out.index = i;
    out.finish = FinishReason::kAbort;
    out.prompt_tokens = g.prompt_tokens();
    out.completion_tokens = g.completion_tokens();
    out.reasoning_tokens = g.reasoning_tokens();
    Send(peer, out);
  }
  ctx_.metrics->CountRequest(RequestOutcome::kCancelled);
  services::RequestLog("router", s.tag()).Info("aborted by the client");
  End(key);
}

void RequestApiServer::DropPeer(const std::string& peer) {
  last_sent_.erase(peer);
  std::vector<uint64_t> keys;
  for (auto it = by_client_.lower_bound({peer, 0}); it != by_client_.end() && it->first.first == peer; ++it)
    keys.push_back(it->second);
  for (uint64_t key : keys) {
    Session& s = sessions_.at(key);
    s.Cancel("client disconnected");
    ctx_.metrics->CountRequest(RequestOutcome::kCancelled);
    services::RequestLog("router", s.tag()).Info("client disconnected");
    End(key);
  }
}

void RequestApiServer::End(uint64_t key) {
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return;
  by_client_.erase({it->second.peer, it->second.client_id});
  sessions_.erase(it);  // an unfinished GenerationSession cancels its request
}

void RequestApiServer::SendStep(Session& s, uint32_t index, SessionStep& step) {
  GenerationSession& g = *s.gens[index];
  const bool done = step.finished && step.error.ok();
  // A chat choice reports its parsed fields; text the parser holds back shows up later.
  const bool chat = g.parses_chat();
  if (step.tokens.empty() && (chat ? step.chat.empty() : step.text.empty()) && !done) return;
  api::Output out;
  out.request_id = s.client_id;
  out.index = index;
  if (chat) {
    out.text = std::move(step.chat.content);
    out.reasoning_text = std::move(step.chat.reasoning_content);
    for (auto& d : step.chat.tool_calls) {
      api::ToolCallDelta t;
      t.index = static_cast<uint32_t>(d.index);
      if (d.name) {
        t.name = std::move(*d.name);
        t.id = g.tool_call_ids().at(static_cast<size_t>(d.index));
      }
      t.arguments = std::move(d.arguments);
      out.tool_calls.push_back(std::move(t));
    }
  } else {
    out.text = std::move(step.text);
  }
  out.tokens.reserve(step.tokens.size());
  bool any_logprob = false;
  for (const auto& t : step.tokens) any_logprob |= t.logprob.has_value();
  for (const auto& t : step.tokens) {
    out.tokens.push_back(t.id);
    if (any_logprob) out.logprobs.push_back(t.logprob.value_or(services::TokenLogprob{}));
  }
  if (done) {
    out.finish = FinishFor(step.finish_reason);
    out.tool_calls_finish = step.finish_reason == "tool_calls";
    out.prompt_tokens = g.prompt_tokens();
    out.completion_tokens = g.completion_tokens();
    out.reasoning_tokens = g.reasoning_tokens();
  }
  s.sent_tokens |= !out.tokens.empty();
  Send(s.peer, out);
}

void RequestApiServer::Drain(uint64_t key) {
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return;  // ended; a late wake-up
  Session& s = it->second;
  for (uint32_t i = 0; i < s.gens.size(); ++i) {
    GenerationSession& g = *s.gens[i];
    if (g.finished()) continue;
    auto step = g.Next(Clock::now());  // never blocks: the deadline has passed
    if (!step) continue;
    const bool before_output = !s.sent_tokens;
    SendStep(s, i, *step);
    if (!step->finished || step->error.ok()) continue;
    // One failed choice fails the request, as over HTTP.
    const ApiError e = ApiError::FromStatus(step->error, s.tag());
    s.Cancel("another choice of the request failed");
    SendError(s.peer, s.client_id, e);
    // As over HTTP: a failure before any output has its status's outcome; after, "error".
    ctx_.metrics->CountRequest(before_output ? OutcomeForStatus(e.http_status) : RequestOutcome::kError);
    services::RequestLog("router", s.tag()).Warn("failed: {}", step->error.ToString());
    return End(key);
  }
  if (s.finished()) {
    ctx_.metrics->CountRequest(RequestOutcome::kOk);
    End(key);
  }
}

void RequestApiServer::Timers(Clock::time_point now) {
  std::vector<uint64_t> expired;
  std::map<std::string, bool> peers;
  for (auto& [key, s] : sessions_) {
    peers[s.peer] = true;
    if (now >= s.deadline || (!s.started() && now >= s.first_deadline)) expired.push_back(key);
  }
  for (uint64_t key : expired) {
    Session& s = sessions_.at(key);
    const bool first = !s.started();
    s.Cancel("router-side deadline");
    SendError(s.peer, s.client_id,
              ApiError::Timeout(fmt::format("{} (request id {})",
                                            first ? "no first token within the router's deadline"
                                                  : "the request exceeded the router's deadline",
                                            s.tag())));
    ctx_.metrics->CountRequest(RequestOutcome::kTimeout);
    End(key);
  }
  // Keepalive probes: a client that is gone makes the send fail (DropPeer).
  for (auto it = last_sent_.begin(); it != last_sent_.end();) {
    if (!peers.count(it->first)) {
      it = last_sent_.erase(it);
      continue;
    }
    if (now - it->second >= ctx_.config->request_keepalive) Send(it->first, api::Keepalive{});
    ++it;
  }
}

}  // namespace pdserve::router
