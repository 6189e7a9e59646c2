#include "services/router/prefill_pace.h"

#include <algorithm>
#include <cmath>

namespace pdserve::router {

void PrefillPace::Opened(int64_t tokens, Clock::time_point now) {
  if (open_jobs_ == 0) mark_ = now;  // idle until now: busy time starts here
  open_jobs_ += 1;
  open_tokens_ += tokens;
}

void PrefillPace::Closed(int64_t tokens, bool served, Clock::time_point now) {
  open_jobs_ = std::max<int64_t>(open_jobs_ - 1, 0);
  open_tokens_ = std::max<int64_t>(open_tokens_ - tokens, 0);
  if (!served) return;
  const double busy = std::chrono::duration<double>(now - mark_).count();
  if (busy > 0) {
    served_tokens_ = kKeep * served_tokens_ + static_cast<double>(tokens);
    busy_seconds_ = kKeep * busy_seconds_ + busy;
  }
  mark_ = now;
}

int64_t PrefillPace::TokensLeft(Clock::time_point now) const {
  const double pace = tokens_per_second();
  if (pace <= 0 || open_jobs_ == 0) return open_tokens_;
  const double busy = std::max(0.0, std::chrono::duration<double>(now - mark_).count());
  const double done = std::min(static_cast<double>(open_tokens_), pace * busy);
  return open_tokens_ - static_cast<int64_t>(std::floor(done));
}

}  // namespace pdserve::router
