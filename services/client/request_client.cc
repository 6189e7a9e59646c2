#include "services/client/request_client.h"

#include <zmq.h>

#include <utility>
#include <variant>

#include "common/mapped_file.h"
#include "services/common/process_util.h"

namespace pdserve::client {

namespace api = services::api;
using Clock = std::chrono::steady_clock;

void RequestClient::ContextDeleter::operator()(void* context) const { zmq_ctx_term(context); }
void RequestClient::SocketDeleter::operator()(void* socket) const { zmq_close(socket); }

namespace {
Status ZmqStatus(const char* what) { return Status::Internal(std::string(what) + ": " + zmq_strerror(zmq_errno())); }
}  // namespace

Status StatusFromApiError(const api::Error& e) {
  std::string msg = e.message;
  std::string detail = e.type;
  if (!e.code.empty()) detail += ", code " + e.code;
  if (!e.param.empty()) detail += ", param " + e.param;
  msg += " [" + detail + "]";
  switch (e.http_status) {
    case 400: return Status::InvalidArgument(msg);
    case 401:
    case 403: return Status::PermissionDenied(msg);
    case 404: return Status::NotFound(msg);
    case 413:
    case 429: return Status::ResourceExhausted(msg);
    case 503: return Status::Unavailable(msg);
    case 504: return Status::DeadlineExceeded(msg);
    default: return Status::Internal(msg);
  }
}

Result<std::string> ReadApiKeyFile(const std::string& path) {
  auto contents = ReadFileToString(path);
  if (!contents.ok()) return Status(contents.status().code(), "cannot read the API key file '" + path + "'");
  std::string key;
  size_t pos = 0;
  const std::string& s = contents.value();
  while (pos <= s.size()) {
    size_t end = s.find('\n', pos);
    if (end == std::string::npos) end = s.size();
    const std::string line = s.substr(pos, end - pos);
    pos = end + 1;
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    if (!key.empty()) return Status::InvalidArgument("the API key file '" + path + "' holds more than one key");
    key = line.substr(b, line.find_last_not_of(" \t\r") - b + 1);
  }
  if (key.empty()) return Status::InvalidArgument("no API key in '" + path + "'");
  return key;
}

Result<services::CurveOptions> CurveClientOptions(const std::string& server_public_key_file,
                                                 const std::string& secret_key_file) {
  if (!services::CurveAvailable()) return Status::InvalidArgument("CURVE is asked for but this libzmq has no CURVE");
  services::CurveOptions o;
  o.enabled = true;
  PDSERVE_ASSIGN_OR_RETURN(o.server_public_key, services::ReadCurveKeyFile(server_public_key_file));
  if (secret_key_file.empty()) {
    PDSERVE_ASSIGN_OR_RETURN(o.own, services::GenerateCurveKeyPair());
  } else {
    PDSERVE_ASSIGN_OR_RETURN(o.own, services::ReadCurveSecretKeyFile(secret_key_file));
  }
  return o;
}

Result<std::unique_ptr<RequestClient>> RequestClient::Connect(const std::string& endpoint, ClientOptions options) {
  if (endpoint.empty()) return Status::InvalidArgument("the request API endpoint is empty");
  std::unique_ptr<RequestClient> c(new RequestClient());
  c->options_ = options;
  c->context_.reset(zmq_ctx_new());
  if (!c->context_) return ZmqStatus("zmq_ctx_new");
  c->socket_.reset(zmq_socket(c->context_.get(), ZMQ_DEALER));
  if (!c->socket_) return ZmqStatus("zmq_socket");
  const int zero = 0, unlimited = 0;
  zmq_setsockopt(c->socket_.get(), ZMQ_LINGER, &zero, sizeof(zero));
  zmq_setsockopt(c->socket_.get(), ZMQ_RCVHWM, &unlimited, sizeof(unlimited));
  zmq_setsockopt(c->socket_.get(), ZMQ_SNDHWM, &unlimited, sizeof(unlimited));
  if (const services::CurveOptions& curve = options.curve; curve.enabled) {
    PDSERVE_RETURN_IF_ERROR(services::CheckCurveKey(curve.server_public_key, "the router's CURVE public key"));
    PDSERVE_RETURN_IF_ERROR(services::CheckCurveKey(curve.own.public_key, "the client's CURVE public key"));
    PDSERVE_RETURN_IF_ERROR(services::CheckCurveKey(curve.own.secret_key, "the client's CURVE secret key"));
    // Z85 keys: 40 characters and the terminating NUL.
    const std::pair<int, const std::string*> keys[] = {{ZMQ_CURVE_SERVERKEY, &curve.server_public_key},
                                                       {ZMQ_CURVE_PUBLICKEY, &curve.own.public_key},
                                                       {ZMQ_CURVE_SECRETKEY, &curve.own.secret_key}};
    for (const auto& [option, key] : keys)
      if (zmq_setsockopt(c->socket_.get(), option, key->c_str(), key->size() + 1) != 0)
        return ZmqStatus("zmq_setsockopt CURVE key");
  }
  if (zmq_connect(c->socket_.get(), endpoint.c_str()) != 0)
    return Status::InvalidArgument("cannot connect to '" + endpoint + "': " + zmq_strerror(zmq_errno()));
  return c;
}

RequestClient::~RequestClient() {
  socket_.reset();
  context_.reset();
}

Status RequestClient::SendRaw(const std::string& bytes) {
  // The send queue is unbounded, so a send only waits while the socket has no connection at all
  // (the router is unreachable, or refused the CURVE handshake): bounded by
  // options.connect_timeout rather than blocking for ever.
  if (zmq_send(socket_.get(), bytes.data(), bytes.size(), ZMQ_DONTWAIT) >= 0) return Status::Ok();
  if (zmq_errno() != EAGAIN) return ZmqStatus("zmq_send");
  zmq_pollitem_t item = {socket_.get(), 0, ZMQ_POLLOUT, 0};
  if (zmq_poll(&item, 1, static_cast<long>(options_.connect_timeout.count())) < 0) return ZmqStatus("zmq_poll");
  if (zmq_send(socket_.get(), bytes.data(), bytes.size(), ZMQ_DONTWAIT) >= 0) return Status::Ok();
  if (zmq_errno() != EAGAIN) return ZmqStatus("zmq_send");
  return Status::DeadlineExceeded("no connection to the router within " +
                                  std::to_string(options_.connect_timeout.count()) +
                                  " ms (nothing listens at the endpoint, or it refused this client's CURVE keys)");
}

Status RequestClient::Send(const api::Message& message) {
  PDSERVE_ASSIGN_OR_RETURN(std::string bytes, api::EncodeMessage(message));
  return SendRaw(bytes);
}

Result<api::Message> RequestClient::Receive(std::chrono::milliseconds timeout) {
  zmq_pollitem_t item = {socket_.get(), 0, ZMQ_POLLIN, 0};
  const int n = zmq_poll(&item, 1, static_cast<long>(timeout.count()));
  if (n < 0) return ZmqStatus("zmq_poll");
  if (n == 0) return Status::DeadlineExceeded("no message from the router within " + std::to_string(timeout.count()) + " ms");
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  if (zmq_msg_recv(&msg, socket_.get(), 0) < 0) {
    zmq_msg_close(&msg);
    return ZmqStatus("zmq_msg_recv");
  }
  std::string bytes(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
  const bool more = zmq_msg_more(&msg);
  zmq_msg_close(&msg);
  while (more) {  // the API sends single frames; drop any extra
    zmq_msg_t extra;
    zmq_msg_init(&extra);
    const int rc = zmq_msg_recv(&extra, socket_.get(), 0);
    const bool again = rc >= 0 && zmq_msg_more(&extra);
    zmq_msg_close(&extra);
    if (!again) break;
  }
  auto decoded = api::DecodeMessage(bytes);
  if (decoded.ok()) {
    if (auto* e = std::get_if<api::Error>(&decoded.value())) last_error_ = *e;
  }
  return decoded;
}

Status RequestClient::Ping(std::chrono::milliseconds timeout) {
  const uint64_t nonce = next_id_++;
  PDSERVE_RETURN_IF_ERROR(Send(api::Ping{nonce}));
  const auto until = Clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return Status::DeadlineExceeded("no pong from the router");
    PDSERVE_ASSIGN_OR_RETURN(api::Message m, Receive(left));
    if (auto* p = std::get_if<api::Pong>(&m); p && p->nonce == nonce) return Status::Ok();
  }
}

Result<Completion> RequestClient::Generate(api::Submit request, const OutputCallback& on_output) {
  if (request.request_id == 0) request.request_id = next_id_++;
  if (request.api_key.empty()) request.api_key = options_.api_key;
  const uint64_t id = request.request_id;
  PDSERVE_RETURN_IF_ERROR(Send(request));
  Completion out;
  out.choices.resize(request.n == 0 ? 1 : request.n);
  size_t open = out.choices.size();
  bool aborting = false;
  while (true) {
    PDSERVE_ASSIGN_OR_RETURN(api::Message m, Receive(options_.timeout));
    if (auto* a = std::get_if<api::Accepted>(&m)) {
      if (a->request_id == id) out.tag = a->tag;
    } else if (auto* o = std::get_if<api::Output>(&m)) {
      if (o->request_id != id) continue;  // a previous request's late event
      if (o->index >= out.choices.size()) return Status::Internal("the router sent an output of an unknown choice");
      CompletedChoice& c = out.choices[o->index];
      c.tokens.insert(c.tokens.end(), o->tokens.begin(), o->tokens.end());
      c.text += o->text;
      c.reasoning += o->reasoning_text;
      for (const auto& d : o->tool_calls) {
        if (d.index >= api::Limits::kMaxListItems) return Status::Internal("the router sent a tool call index out of range");
        if (d.index >= c.tool_calls.size()) c.tool_calls.resize(d.index + 1);
        CompletedToolCall& call = c.tool_calls[d.index];
        if (!d.id.empty()) call.id = d.id;
        if (!d.name.empty()) call.name = d.name;
        call.arguments += d.arguments;
      }
      if (on_output && !aborting && !on_output(*o) && !o->finishing()) {
        aborting = true;
        PDSERVE_RETURN_IF_ERROR(Send(api::Abort{id, "aborted by the client"}));
      }
      if (o->finishing() && c.finish == FinishReason::kNone) {
        c.finish = o->finish;
        c.tool_calls_finish = o->tool_calls_finish;
        c.completion_tokens = o->completion_tokens;
        c.reasoning_tokens = o->reasoning_tokens;
        out.prompt_tokens = o->prompt_tokens;
        out.completion_tokens += o->completion_tokens;
        if (--open == 0) {
          out.tokens = out.choices[0].tokens;
          out.text = out.choices[0].text;
          out.finish = out.choices[0].finish;
          return out;
        }
      }
    } else if (auto* e = std::get_if<api::Error>(&m)) {
      if (e->request_id == id || e->request_id == 0) return StatusFromApiError(*e);
    }
    // pong, keepalive: nothing to do
  }
}

}  // namespace pdserve::client
