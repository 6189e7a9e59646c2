#include "services/testing/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace pdserve::services::testing {
namespace {

Status Errno(const std::string& what) { return Status::Internal(what + ": " + std::strerror(errno)); }

// Writes all of buf (the peer socket is blocking; loopback peers drain quickly).
bool WriteAll(int fd, const char* buf, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, buf, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    buf += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

Result<std::unique_ptr<TcpProxy>> TcpProxy::Start(int target_port) {
  if (target_port <= 0 || target_port > 65535)
    return Status::InvalidArgument("TcpProxy: bad target port " + std::to_string(target_port));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("TcpProxy: socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Status s = Errno("TcpProxy: bind/listen");
    ::close(fd);
    return s;
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    Status s = Errno("TcpProxy: pipe");
    ::close(fd);
    return s;
  }
  return std::unique_ptr<TcpProxy>(new TcpProxy(fd, ntohs(addr.sin_port), target_port, pipe_fds[0], pipe_fds[1]));
}

TcpProxy::TcpProxy(int listen_fd, int port, int target_port, int wake_read, int wake_write)
    : listen_fd_(listen_fd), port_(port), target_port_(target_port), wake_read_(wake_read), wake_write_(wake_write) {
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

TcpProxy::~TcpProxy() {
  thread_.request_stop();
  const char byte = 0;
  [[maybe_unused]] ssize_t n = ::write(wake_write_, &byte, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

void TcpProxy::Loop(std::stop_token stop) {
  struct Pair {
    int client, target;
  };
  std::vector<Pair> pairs;
  std::vector<char> buf(64 * 1024);
  std::vector<pollfd> fds;
  while (!stop.stop_requested()) {
    const bool cut = partitioned_.load();
    fds.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    fds.push_back({wake_read_, POLLIN, 0});
    if (!cut) {
      for (const Pair& p : pairs) {
        fds.push_back({p.client, POLLIN, 0});
        fds.push_back({p.target, POLLIN, 0});
      }
    }
    // While cut, readable connections are left unread (their bytes wait); a short timeout
    // notices the heal.
    if (::poll(fds.data(), fds.size(), cut ? 10 : 100) < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) {
      char drain[16];
      while (::read(wake_read_, drain, sizeof(drain)) > 0) {
      }
    }
    if (fds[0].revents & POLLIN) {
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client >= 0) {
        const int target = ConnectLoopback(target_port_);
        if (target < 0) {
          ::close(client);
        } else {
          const int one = 1;
          ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          pairs.push_back({client, target});
        }
      }
    }
    if (cut) continue;
    // fds[2 + 2i] / fds[3 + 2i] belong to pairs[i] (pairs accepted above are polled next round).
    std::vector<bool> closed(pairs.size(), false);
    for (size_t i = 0; i + 2 < fds.size(); ++i) {
      const size_t pi = i / 2;
      if (closed[pi] || !(fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const int from = (i % 2 == 0) ? pairs[pi].client : pairs[pi].target;
      const int to = (i % 2 == 0) ? pairs[pi].target : pairs[pi].client;
      const ssize_t r = ::recv(from, buf.data(), buf.size(), MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (r <= 0 || !WriteAll(to, buf.data(), static_cast<size_t>(r))) closed[pi] = true;
    }
    for (size_t pi = closed.size(); pi-- > 0;) {
      if (!closed[pi]) continue;
      ::close(pairs[pi].client);
      ::close(pairs[pi].target);
      pairs.erase(pairs.begin() + static_cast<std::ptrdiff_t>(pi));
    }
  }
  for (const Pair& p : pairs) {
    ::close(p.client);
    ::close(p.target);
  }
}

}  // namespace pdserve::services::testing
