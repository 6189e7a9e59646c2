// ListeningClock: lets a silence timeout count only the time its owner was able to listen.
//
// A control thread declares a peer dead after `timeout` without a message from it. If that
// thread is itself stalled (descheduled on an oversubscribed machine, stopped, or busy with a
// long batch of messages), the peer's messages wait unread in the socket while the wall clock
// runs: judged by wall time alone, every peer looks silent for as long as the stall lasted
// (docs/control-plane.md, "Liveness"). The owner calls Tick() from its periodic timer; the time
// between two ticks beyond `max_step` is the owner's own stall, and Tick returns it so the owner
// pushes every peer's last-heard time forward by that much.
//
// Thread-safety: none (one owner thread).
#pragma once

#include <chrono>

namespace pdserve::services {

class ListeningClock {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ListeningClock(Clock::duration max_step) : max_step_(max_step) {}

  // The part of the time since the previous Tick that the owner was not listening (zero on
  // the first tick and whenever ticks came at most max_step apart).
  Clock::duration Tick(Clock::time_point now) {
    Clock::duration stalled{0};
    if (last_ != Clock::time_point{} && now - last_ > max_step_) stalled = now - last_ - max_step_;
    last_ = now;
    return stalled;
  }

 private:
  const Clock::duration max_step_;
  Clock::time_point last_{};
};

}  // namespace pdserve::services
