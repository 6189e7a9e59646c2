#include "services/common/net_util.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pdserve::services {

std::string DescribeListenFailure(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return std::string("cannot resolve the host: ") + gai_strerror(rc);
  int err = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int sock = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (sock < 0) {
      err = errno;
      continue;
    }
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    const bool bound = bind(sock, a->ai_addr, a->ai_addrlen) == 0 && listen(sock, 1) == 0;
    err = bound ? 0 : errno;
    close(sock);
    if (bound) break;
  }
  freeaddrinfo(found);
  if (err == 0) return "the port is free now (it was taken, or the bind failed for another reason)";
  if (err == EADDRINUSE) return "address in use (another process listens there)";
  if (err == EADDRNOTAVAIL) return "cannot assign requested address (no interface has this host address)";
  if (err == EACCES) return "permission denied (ports below 1024 need privileges)";
  return std::strerror(err);
}

}  // namespace pdserve::services
