// ImpairedLink: delay and random loss on one host's link of a NetnsHosts bed, in user space.
//
// What `tc qdisc add dev eth0 root netem delay 20ms loss 1%` does, for kernels built without
// sch_netem (this project's CI VM has none; `tc` itself works). The host's bridge port is taken
// off the bridge and a second veth pair put in its place; a relay thread moves every Ethernet
// frame between the two with AF_PACKET sockets, holding each for `delay` and dropping each with
// probability `loss`, in both directions. Frames keep their GSO metadata (PACKET_VNET_HDR), so
// large TCP segments pass whole as they do through the bridge. Everything the host sends or
// receives crosses the relay: to every other host and to the root namespace.
//
// Thread-safety: one test thread creates and destroys it; the relay thread is its own.
// Destruction stops the relay and puts the host's port back on the bridge.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "services/testing/netns_hosts.h"

namespace pdserve::services::testing {

class ImpairedLink {
 public:
  struct Options {
    std::chrono::microseconds delay{20000};  // each way
    double loss = 0.01;                      // each way, per frame
    size_t limit_frames = 4096;              // frames held per direction (netem's limit is 1000)
    uint64_t seed = 1;
  };
  struct Counters {
    uint64_t forwarded = 0;
    uint64_t dropped = 0;  // by the loss draw
    uint64_t overflow = 0; // past limit_frames
  };

  // Errors: Internal (an `ip` command or a socket failed; nothing is left changed).
  static Result<std::unique_ptr<ImpairedLink>> Insert(NetnsHosts* bed, size_t host, const Options& options);
  ~ImpairedLink();
  ImpairedLink(const ImpairedLink&) = delete;
  ImpairedLink& operator=(const ImpairedLink&) = delete;

  Counters counters() const;

 private:
  ImpairedLink() = default;
  void Relay(std::stop_token stop);

  NetnsHosts* bed_ = nullptr;
  size_t host_ = 0;
  Options options_;
  std::string port_;   // the host's bridge port (its veth end in the root namespace)
  std::string inner_;  // the relay's end of the new pair; its peer sits on the bridge
  std::string outer_;
  int port_fd_ = -1, inner_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: wakes the relay to stop
  std::atomic<uint64_t> forwarded_{0}, dropped_{0}, overflow_{0};
  std::jthread relay_;
};

}  // namespace pdserve::services::testing
