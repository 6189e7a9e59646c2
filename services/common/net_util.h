// Small socket and address helpers shared by the services' listeners.
//
// Listen vs advertised addresses (docs/configuration.md "Addresses"): a service binds its
// sockets on a *listen* host (an address of one interface, or a wildcard meaning all of them)
// and tells others an *advertised* host they can reach it on (the router's ready file and
// control endpoint, a worker's RegisterMsg). On one machine both are usually 127.0.0.1; across
// hosts a service listens on 0.0.0.0 or its interface address and advertises that address.
// Nothing here assumes loopback: a wildcard listen host is advertised as an address of a real
// interface (AdvertisedHost).
//
// Thread-safety: pure functions (they read the interface list of the calling process's network
// namespace).
#pragma once

#include <string>

#include "common/status.h"

namespace pdserve::services {

// Why HOST:PORT cannot be listened on, found by trying to bind it the way our listeners do
// (SO_REUSEADDR, no SO_REUSEPORT): "address in use (another process listens there)",
// "cannot assign requested address (no interface has HOST)", or the OS error text. Used to turn a
// library's bare "bind failed" into a message an operator can act on.
std::string DescribeListenFailure(const std::string& host, int port);

// True for a listen host that means every interface: "", "0.0.0.0", "::", "[::]", "*".
bool IsWildcardHost(const std::string& host);

// True for a host only this machine reaches: "localhost", 127.0.0.0/8, "::1".
bool IsLoopbackHost(const std::string& host);

// An interface and its IPv4 address.
struct InterfaceAddress {
  std::string interface;  // "eth0"
  std::string address;    // "10.213.7.3"
};

// The IPv4 address of this host on `network`: an interface name ("eth0") or an IPv4 subnet in
// CIDR form ("10.213.7.0/24": the first up interface with an address inside it). The subnet form
// lets one setting serve hosts whose interfaces are named differently (an MPI group's ranks).
// Errors: InvalidArgument (a malformed CIDR), NotFound (no such interface, or no IPv4 address
// on it / in the subnet; the message lists the interfaces there are).
Result<InterfaceAddress> FindInterfaceAddress(const std::string& network);

// The host others should dial to reach a service listening on `listen`: `advertise` when set;
// else `listen` when it names one address; else (a wildcard) the first IPv4 address of an up,
// non-loopback interface, or the host name when there is none.
std::string AdvertisedHost(const std::string& listen, const std::string& advertise);

// `endpoint` ("tcp://HOST:PORT") with HOST replaced by `host` (IPv6 hosts get brackets);
// other schemes (ipc://, inproc://) come back unchanged.
std::string EndpointWithHost(const std::string& endpoint, const std::string& host);

// The HOST of "tcp://HOST:PORT" ("" for other schemes; brackets of an IPv6 host removed).
std::string EndpointHost(const std::string& endpoint);

}  // namespace pdserve::services
