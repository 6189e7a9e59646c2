// HTTP helpers for tests and benchmarks (at 127.0.0.1, or at a given host): plain requests, server-sent-event streams read as
// they arrive (with per-event arrival times and early cancellation = a client disconnect),
// and a raw socket connection for half-sent requests and abrupt hang-ups.
//
// Thread-safety: free functions; one RawHttpConnection per thread.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace pdserve::services::testing {

struct HttpReply {
  int status = 0;          // 0: no response (error says why)
  std::string body;
  std::map<std::string, std::string> headers;
  std::string error;
};

HttpReply HttpGet(int port, const std::string& path,
                  std::chrono::milliseconds timeout = std::chrono::seconds(10));
// The same at HOST:port (another host of a multi-host test bed).
HttpReply HttpGet(const std::string& host, int port, const std::string& path,
                  std::chrono::milliseconds timeout = std::chrono::seconds(10));
HttpReply HttpPost(int port, const std::string& path, const std::string& body,
                   std::chrono::milliseconds timeout = std::chrono::seconds(30),
                   const std::string& content_type = "application/json");

struct SseReply {
  int status = 0;
  std::vector<std::string> events;         // payloads of "data:" lines, in order
  std::vector<double> arrival_seconds;     // per event, since the request was sent
  bool done = false;                       // saw "data: [DONE]"
  bool cancelled = false;                  // on_event asked to stop
  std::string raw;                         // everything received (error bodies)
  std::string error;
};

// POSTs and reads the SSE stream. on_event(payload) may return false to hang up at once.
SseReply HttpPostSse(int port, const std::string& path, const std::string& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60),
                     const std::function<bool(const std::string&)>& on_event = nullptr);

SseReply HttpPostSse(const std::string& host, int port, const std::string& path, const std::string& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60),
                     const std::function<bool(const std::string&)>& on_event = nullptr);

// A raw TCP connection to 127.0.0.1:port.
class RawHttpConnection {
 public:
  explicit RawHttpConnection(int port);
  ~RawHttpConnection();
  RawHttpConnection(const RawHttpConnection&) = delete;
  RawHttpConnection& operator=(const RawHttpConnection&) = delete;
  bool connected() const { return fd_ >= 0; }
  bool SendAll(const std::string& data);
  // Reads until `needle` was received or the timeout passes; returns everything read so far.
  std::string ReadUntil(const std::string& needle, std::chrono::milliseconds timeout);
  void Close();

 private:
  int fd_ = -1;
  std::string received_;
};

}  // namespace pdserve::services::testing
