#include "services/common/net_util.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

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

bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]" || host == "*";
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1" || host == "[::1]";
}

namespace {

// Owns a getifaddrs list.
class IfAddrs {
 public:
  IfAddrs() {
    if (getifaddrs(&list_) != 0) list_ = nullptr;
  }
  ~IfAddrs() {
    if (list_ != nullptr) freeifaddrs(list_);
  }
  IfAddrs(const IfAddrs&) = delete;
  IfAddrs& operator=(const IfAddrs&) = delete;
  const ifaddrs* get() const { return list_; }

 private:
  ifaddrs* list_ = nullptr;
};

std::string Ipv4Text(const sockaddr* a) {
  char text[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, text, sizeof(text));
  return text;
}

uint32_t Ipv4HostOrder(const sockaddr* a) { return ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr); }

std::string InterfaceList(const IfAddrs& ifs) {
  std::set<std::string> seen;
  std::string out;
  for (const ifaddrs* i = ifs.get(); i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const std::string entry = std::string(i->ifa_name) + " " + Ipv4Text(i->ifa_addr);
    if (seen.insert(entry).second) out += (out.empty() ? "" : ", ") + entry;
  }
  return out.empty() ? "none with an IPv4 address" : out;
}

}  // namespace

Result<InterfaceAddress> FindInterfaceAddress(const std::string& network) {
  IfAddrs ifs;
  const size_t slash = network.find('/');
  if (slash == std::string::npos) {
    for (const ifaddrs* i = ifs.get(); i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || network != i->ifa_name) continue;
      return InterfaceAddress{i->ifa_name, Ipv4Text(i->ifa_addr)};
    }
    return Status::NotFound("no interface '" + network + "' with an IPv4 address here (interfaces: " +
                            InterfaceList(ifs) + ")");
  }
  in_addr base{};
  int bits = -1;
  try {
    size_t used = 0;
    bits = std::stoi(network.substr(slash + 1), &used);
    if (used != network.size() - slash - 1) bits = -1;
  } catch (const std::exception&) {
    bits = -1;
  }
  if (bits < 0 || bits > 32 || inet_pton(AF_INET, network.substr(0, slash).c_str(), &base) != 1)
    return Status::InvalidArgument("'" + network + "' is neither an interface name nor an IPv4 subnet (A.B.C.D/N)");
  const uint32_t mask = bits == 0 ? 0 : ~uint32_t{0} << (32 - bits);
  const uint32_t want = ntohl(base.s_addr) & mask;
  for (const ifaddrs* i = ifs.get(); i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    if ((Ipv4HostOrder(i->ifa_addr) & mask) == want) return InterfaceAddress{i->ifa_name, Ipv4Text(i->ifa_addr)};
  }
  return Status::NotFound("no up interface has an address in " + network + " (interfaces: " + InterfaceList(ifs) + ")");
}

std::string AdvertisedHost(const std::string& listen, const std::string& advertise) {
  if (!advertise.empty()) return advertise;
  if (!IsWildcardHost(listen)) return listen;
  IfAddrs ifs;
  for (const ifaddrs* i = ifs.get(); i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    return Ipv4Text(i->ifa_addr);
  }
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') return name;
  return "localhost";  // a machine with no network at all: only local peers can exist
}

std::string EndpointWithHost(const std::string& endpoint, const std::string& host) {
  if (endpoint.rfind("tcp://", 0) != 0) return endpoint;
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon < 6) return endpoint;
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return "tcp://" + (v6 ? "[" + host + "]" : host) + endpoint.substr(colon);
}

std::string EndpointHost(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) != 0) return "";
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon < 6) return "";
  std::string host = endpoint.substr(6, colon - 6);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

}  // namespace pdserve::services
