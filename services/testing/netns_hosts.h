// NetnsHosts: a test bed of "hosts" on this machine for the multi-host tests: network namespaces
// on a bridge, each with its own address on a private subnet (scripts/netns_hosts.sh makes and
// removes them; docs/deploy.md "A test bed of hosts"). Processes started with Exec(i) + argv
// run on host i: their own loopback and interfaces, real TCP to the other hosts.
//
// Names carry this process's pid (in base 36) and a counter, so parallel tests never collide;
// the destructor removes every process, namespace and link of the bed, and a bed whose test
// died without it is removed by the next bed's `up` (the script's gc).
//
// Thread-safety: one test thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve::services::testing {

class NetnsHosts {
 public:
  struct Host {
    std::string netns;      // "pdmh1a2b3-h0"
    std::string address;    // "10.213.47.2"
    std::string interface;  // "eth0"
  };

  // Makes `n` hosts with `script` (scripts/netns_hosts.sh). Errors: Unavailable with the reason
  // when namespaces cannot be made here (not root, no CAP_NET_ADMIN, no `ip`): tests skip with
  // it, loudly; Internal with the script's output when it failed otherwise.
  static Result<std::unique_ptr<NetnsHosts>> Create(const std::string& script, int n);
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  const std::vector<Host>& hosts() const { return hosts_; }
  const Host& host(size_t i) const { return hosts_.at(i); }
  const std::string& prefix() const { return prefix_; }
  const std::string& subnet() const { return subnet_; }                  // "10.213.47.0/24"
  const std::string& bridge_address() const { return bridge_address_; }  // the root namespace's
  // The command prefix that runs a command on host i: {"ip", "netns", "exec", <netns>}.
  std::vector<std::string> Exec(size_t i) const;
  // The root-namespace end of host i's link (a bridge port).
  std::string LinkOf(size_t i) const;
  // Cuts host i off the bridge (its link down: no frame in or out) or heals it.
  Status SetLinkUp(size_t i, bool up);

  // Runs argv to completion; its stdout + stderr. Errors: Internal (non-zero exit, with the
  // output), Unavailable (exit status 2 of netns_hosts.sh: cannot make namespaces here).
  static Result<std::string> Run(const std::vector<std::string>& argv);

 private:
  NetnsHosts() = default;
  std::string script_;
  std::string prefix_;
  std::string subnet_;
  std::string bridge_address_;
  std::vector<Host> hosts_;
};

}  // namespace pdserve::services::testing
