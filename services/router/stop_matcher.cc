#include "services/router/stop_matcher.h"

#include <algorithm>

namespace pdserve::router {

std::string StopMatcher::Push(std::string_view text) {
  if (matched_) return {};
  if (stops_.empty()) return std::string(text);
  pending_.append(text);
  // Earliest match wins; among matches at the same place, the longest stop string.
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = pending_.find(s);
    if (at != std::string::npos && (best == std::string::npos || at < best ||
                                    (at == best && s.size() > matched_stop_.size()))) {
      best = at;
      matched_stop_ = s;
    }
  }
  if (best != std::string::npos) {
    matched_ = true;
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix of pending_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(pending_);
  return matched_ ? std::string() : out;
}

}  // namespace pdserve::router
