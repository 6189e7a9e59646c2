// TcpProxy: a loopback TCP forwarder that tests put between two processes to cut the network
// between them without killing either. Clients connect to port(); each connection is forwarded
// to `target_port` on 127.0.0.1.
//
// Partition(true) stops moving bytes in both directions while every connection stays open, as a
// network partition does to established TCP connections: nothing is lost, the bytes wait (in
// the kernel's buffers) and arrive late once Partition(false) heals it, like retransmissions.
// New connections are accepted during a partition but carry nothing until it heals.
//
// Thread-safety: Partition and port may be called from any thread. Owns one thread, stopped
// and joined (all sockets closed) by the destructor.
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include "common/status.h"

namespace pdserve::services::testing {

class TcpProxy {
 public:
  static Result<std::unique_ptr<TcpProxy>> Start(int target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  void Partition(bool cut) { partitioned_.store(cut); }

 private:
  TcpProxy(int listen_fd, int port, int target_port, int wake_read, int wake_write);
  void Loop(std::stop_token stop);

  const int listen_fd_;
  const int port_;
  const int target_port_;
  const int wake_read_, wake_write_;  // a pipe: the destructor wakes the loop's poll
  std::atomic<bool> partitioned_{false};
  std::jthread thread_;  // last: stops before the descriptors close
};

}  // namespace pdserve::services::testing
