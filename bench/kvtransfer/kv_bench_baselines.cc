#include "bench/kvtransfer/kv_bench_baselines.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace pdserve::bench::kv {

namespace {
using Clock = std::chrono::steady_clock;

bool WriteAll(int fd, const void* data, uint64_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, std::min<uint64_t>(n, 1 << 30), 0);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<uint64_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, uint64_t n) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<uint64_t>(r);
  }
  return true;
}

[[noreturn]] void ServeAndExit(int listen_fd) {
  const int fd = accept(listen_fd, nullptr, nullptr);
  std::vector<uint8_t> buffer(8 << 20);
  while (fd >= 0) {
    uint64_t n = 0;
    if (!ReadAll(fd, &n, sizeof(n))) break;
    while (n > 0) {
      const ssize_t r = recv(fd, buffer.data(), std::min<uint64_t>(n, buffer.size()), 0);
      if (r <= 0) _exit(0);
      n -= static_cast<uint64_t>(r);
    }
    const uint8_t ack = 1;
    if (!WriteAll(fd, &ack, 1)) break;
  }
  _exit(0);
}
}  // namespace

double MemcpySeconds(uint8_t* dst, const uint8_t* src, uint64_t bytes, int reps) {
  std::memcpy(dst, src, bytes);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(dst, src, bytes);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    dst[i % bytes] ^= 1;  // keep the copies observable
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Result<std::unique_ptr<LoopbackTcp>> LoopbackTcp::Start() {
  const int listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listen_fd < 0 || bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd, 1) != 0 ||
      getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::Internal("cannot listen on loopback");
  }
  const pid_t child = fork();
  if (child < 0) return Status::Internal("fork failed");
  if (child == 0) ServeAndExit(listen_fd);
  close(listen_fd);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return Status::Internal("cannot connect on loopback");
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return std::unique_ptr<LoopbackTcp>(new LoopbackTcp(fd, child));
}

LoopbackTcp::~LoopbackTcp() {
  close(fd_);
  int status = 0;
  waitpid(child_, &status, 0);  // the child exits when the connection closes
}

Result<double> LoopbackTcp::Seconds(const uint8_t* src, uint64_t bytes, int reps) {
  std::vector<double> t;
  for (int i = 0; i <= reps; ++i) {  // the first run warms up
    const auto t0 = Clock::now();
    uint8_t ack = 0;
    if (!WriteAll(fd_, &bytes, sizeof(bytes)) || !WriteAll(fd_, src, bytes) ||
        !ReadAll(fd_, &ack, 1)) {
      return Status::Unavailable("loopback TCP receiver went away");
    }
    if (i > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace pdserve::bench::kv
