#include "services/testing/impaired_link.h"

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

namespace pdserve::services::testing {

namespace {

using Clock = std::chrono::steady_clock;

// An AF_PACKET socket on `ifname` receiving every frame (promiscuous), with virtio-net headers
// so GSO frames pass whole. -1 and *error on failure.
int OpenPacketSocket(const std::string& ifname, std::string* error) {
  const int fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, htons(ETH_P_ALL));
  if (fd < 0) {
    *error = std::string("AF_PACKET socket: ") + std::strerror(errno);
    return -1;
  }
  const int ifindex = static_cast<int>(if_nametoindex(ifname.c_str()));
  int one = 1;
  sockaddr_ll addr{};
  addr.sll_family = AF_PACKET;
  addr.sll_protocol = htons(ETH_P_ALL);
  addr.sll_ifindex = ifindex;
  packet_mreq mr{};
  mr.mr_ifindex = ifindex;
  mr.mr_type = PACKET_MR_PROMISC;
  if (ifindex == 0 || setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one)) != 0 ||
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof(mr)) != 0) {
    *error = "AF_PACKET on " + ifname + ": " + std::strerror(errno);
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

Result<std::unique_ptr<ImpairedLink>> ImpairedLink::Insert(NetnsHosts* bed, size_t host, const Options& options) {
  std::unique_ptr<ImpairedLink> l(new ImpairedLink());
  l->bed_ = bed;
  l->host_ = host;
  l->options_ = options;
  l->port_ = bed->LinkOf(host);
  l->inner_ = bed->prefix() + "i" + std::to_string(host);
  l->outer_ = bed->prefix() + "o" + std::to_string(host);
  const std::string bridge = bed->prefix() + "br";
  auto undo = [&l] { (void)NetnsHosts::Run({"ip", "link", "del", l->inner_}); };
  for (const std::vector<std::string>& cmd :
       std::vector<std::vector<std::string>>{{"ip", "link", "add", l->inner_, "type", "veth", "peer", "name", l->outer_},
                                             {"ip", "link", "set", l->outer_, "master", bridge},
                                             {"ip", "link", "set", l->outer_, "up"},
                                             {"ip", "link", "set", l->inner_, "up"}}) {
    if (auto r = NetnsHosts::Run(cmd); !r.ok()) {
      undo();
      return r.status();
    }
  }
  std::string error;
  l->port_fd_ = OpenPacketSocket(l->port_, &error);
  if (l->port_fd_ >= 0) l->inner_fd_ = OpenPacketSocket(l->inner_, &error);
  if (l->inner_fd_ < 0) {
    if (l->port_fd_ >= 0) close(l->port_fd_);
    l->port_fd_ = -1;
    undo();
    return Status::Internal(error);
  }
  l->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  l->relay_ = std::jthread([p = l.get()](std::stop_token stop) { p->Relay(stop); });
  // From here on the host's frames take the relay: its port leaves the bridge.
  if (auto r = NetnsHosts::Run({"ip", "link", "set", l->port_, "nomaster"}); !r.ok()) return r.status();
  return l;
}

ImpairedLink::~ImpairedLink() {
  (void)NetnsHosts::Run({"ip", "link", "set", port_, "master", bed_->prefix() + "br"});
  if (relay_.joinable()) {
    relay_.request_stop();
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    relay_.join();
  }
  for (int fd : {port_fd_, inner_fd_, wake_fd_})
    if (fd >= 0) close(fd);
  (void)NetnsHosts::Run({"ip", "link", "del", inner_});
}

ImpairedLink::Counters ImpairedLink::counters() const {
  return {forwarded_.load(std::memory_order_relaxed), dropped_.load(std::memory_order_relaxed),
          overflow_.load(std::memory_order_relaxed)};
}

void ImpairedLink::Relay(std::stop_token stop) {
  struct Frame {
    Clock::time_point due;
    std::vector<char> bytes;  // virtio-net header + Ethernet frame
  };
  // [0]: host -> bridge (read on the port, written to the inner end); [1]: the way back.
  std::deque<Frame> queue[2];
  const int from[2] = {port_fd_, inner_fd_};
  const int to[2] = {inner_fd_, port_fd_};
  std::mt19937_64 rng(options_.seed);
  std::uniform_real_distribution<double> draw(0.0, 1.0);
  std::vector<char> buf(65536 + 256);
  while (!stop.stop_requested()) {
    // Sleep until a frame arrives or the next one is due.
    int timeout_ms = -1;
    const auto now = Clock::now();
    for (const auto& q : queue)
      if (!q.empty()) {
        const auto wait = std::chrono::ceil<std::chrono::milliseconds>(q.front().due - now).count();
        const int w = static_cast<int>(std::max<int64_t>(0, wait));
        timeout_ms = timeout_ms < 0 ? w : std::min(timeout_ms, w);
      }
    pollfd fds[3] = {{from[0], POLLIN, 0}, {from[1], POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 3, timeout_ms) < 0 && errno != EINTR) break;
    for (int d = 0; d < 2; ++d) {
      if (!(fds[d].revents & POLLIN)) continue;
      while (true) {
        sockaddr_ll from_addr{};
        socklen_t len = sizeof(from_addr);
        const ssize_t n = recvfrom(from[d], buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from_addr), &len);
        if (n <= 0) break;
        if (from_addr.sll_pkttype == PACKET_OUTGOING) continue;  // our own write on this interface
        if (draw(rng) < options_.loss) {
          dropped_.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        if (queue[d].size() >= options_.limit_frames) {
          overflow_.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        queue[d].push_back({Clock::now() + options_.delay, std::vector<char>(buf.begin(), buf.begin() + n)});
      }
    }
    const auto sent_at = Clock::now();
    for (int d = 0; d < 2; ++d) {
      while (!queue[d].empty() && queue[d].front().due <= sent_at) {
        const auto& f = queue[d].front().bytes;
        if (send(to[d], f.data(), f.size(), 0) >= 0) forwarded_.fetch_add(1, std::memory_order_relaxed);
        queue[d].pop_front();
      }
    }
  }
}

}  // namespace pdserve::services::testing
