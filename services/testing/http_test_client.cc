#include "services/testing/http_test_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string_view>

#include <httplib.h>

#include "services/testing/sse_parser.h"

namespace pdserve::services::testing {

namespace {
using Clock = std::chrono::steady_clock;

std::unique_ptr<httplib::Client> MakeClient(const std::string& host, int port, std::chrono::milliseconds timeout) {
  auto cli = std::make_unique<httplib::Client>(host, port);
  cli->set_connection_timeout(std::chrono::seconds(5));
  cli->set_read_timeout(timeout);
  cli->set_write_timeout(timeout);
  cli->set_tcp_nodelay(true);
  return cli;
}

HttpReply ToReply(const httplib::Result& r) {
  HttpReply out;
  if (!r) {
    out.error = httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  out.body = r->body;
  for (const auto& [k, v] : r->headers) out.headers[k] = v;
  return out;
}
}  // namespace

HttpReply HttpGet(int port, const std::string& path, std::chrono::milliseconds timeout) {
  return HttpGet("127.0.0.1", port, path, timeout);
}

HttpReply HttpGet(const std::string& host, int port, const std::string& path, std::chrono::milliseconds timeout) {
  auto cli = MakeClient(host, port, timeout);
  return ToReply(cli->Get(path));
}

HttpReply HttpPost(int port, const std::string& path, const std::string& body, std::chrono::milliseconds timeout,
                   const std::string& content_type) {
  auto cli = MakeClient("127.0.0.1", port, timeout);
  return ToReply(cli->Post(path, body, content_type));
}

SseReply HttpPostSse(int port, const std::string& path, const std::string& body, std::chrono::milliseconds timeout,
                     const std::function<bool(const std::string&)>& on_event) {
  return HttpPostSse("127.0.0.1", port, path, body, timeout, on_event);
}

SseReply HttpPostSse(const std::string& host, int port, const std::string& path, const std::string& body,
                     std::chrono::milliseconds timeout, const std::function<bool(const std::string&)>& on_event) {
  SseReply out;
  auto cli = MakeClient(host, port, timeout);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  const auto t0 = Clock::now();
  req.response_handler = [&](const httplib::Response& res) {
    out.status = res.status;
    return true;
  };
  SseParser parser;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    out.raw.append(data, len);
    parser.Feed(std::string_view(data, len), [&](std::string_view event) {
      if (out.cancelled) return;
      if (event == "[DONE]") {
        out.done = true;
        return;
      }
      out.events.emplace_back(event);
      out.arrival_seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      if (on_event && !on_event(out.events.back())) out.cancelled = true;
    });
    return !out.cancelled;
  };
  auto r = cli->send(req);
  if (!r && !out.cancelled) out.error = httplib::to_string(r.error());
  return out;
}

RawHttpConnection::RawHttpConnection(int port) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Close();
}

RawHttpConnection::~RawHttpConnection() { Close(); }

bool RawHttpConnection::SendAll(const std::string& data) {
  size_t off = 0;
  while (fd_ >= 0 && off < data.size()) {
    const ssize_t n = send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return fd_ >= 0;
}

std::string RawHttpConnection::ReadUntil(const std::string& needle, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (fd_ >= 0 && received_.find(needle) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) break;
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) break;
    received_.append(buf, static_cast<size_t>(n));
  }
  return received_;
}

void RawHttpConnection::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace pdserve::services::testing
