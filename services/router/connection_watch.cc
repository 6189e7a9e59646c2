#include "services/router/connection_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

#include <httplib.h>

namespace pdserve::router {

namespace {
int PortOf(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}
std::string AddrOf(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof(buf));
  if (a.ss_family == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof(buf));
  return buf;
}
}  // namespace

ConnectionWatch ConnectionWatch::ForRequest(const httplib::Request& req) {
  ConnectionWatch w;
  if (req.remote_port <= 0 || req.local_port <= 0) return w;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return w;
  while (dirent* ent = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(ent->d_name, &end, 10);
    if (end == ent->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t llen = sizeof(local), plen = sizeof(peer);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &llen) != 0) continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &plen) != 0) continue;
    if (PortOf(local) == req.local_port && PortOf(peer) == req.remote_port && AddrOf(peer) == req.remote_addr) {
      w.fd_ = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return w;
}

bool ConnectionWatch::PeerClosed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace pdserve::router
