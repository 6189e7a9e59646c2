// ConnectionWatch: tells an HTTP handler that its client has hung up while the handler is
// still waiting for tokens, so the request is aborted on every worker at once instead of
// computing for nobody until the next write fails.
//
// cpp-httplib 0.11 does not give handlers their socket. The watch finds it: the one socket of
// this process whose local and peer addresses are the request's (local_port, remote_addr,
// remote_port), scanning /proc/self/fd once per request (Linux). It then polls it for
// POLLRDHUP / POLLHUP / POLLERR without reading, so pipelined bytes are left alone. If the
// socket cannot be found, PeerClosed() is always false and the router falls back to noticing
// the hang-up on its next write.
//
// Thread-safety: used by the one thread serving the request; the socket stays open while that
// thread runs the handler or its content provider (httplib closes it afterwards).
#pragma once

#include <string>

namespace httplib {
struct Request;
}

namespace pdserve::router {

class ConnectionWatch {
 public:
  ConnectionWatch() = default;
  static ConnectionWatch ForRequest(const httplib::Request& request);
  bool found() const { return fd_ >= 0; }
  // True once the peer closed or reset the connection.
  bool PeerClosed() const;

 private:
  int fd_ = -1;
};

}  // namespace pdserve::router
