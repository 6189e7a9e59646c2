#include "services/router/routing_policy.h"

#include <algorithm>
#include <string>

namespace pdserve::router {

Result<RoutingPolicy> ParseRoutingPolicy(std::string_view name) {
  if (name == "round_robin") return RoutingPolicy::kRoundRobin;
  if (name == "least_outstanding_tokens") return RoutingPolicy::kLeastOutstandingTokens;
  if (name == "kv_capacity_aware") return RoutingPolicy::kKvCapacityAware;
  if (name == "kv_aware") return RoutingPolicy::kKvAware;
  return Status::InvalidArgument("unknown routing policy '" + std::string(name) +
                                 "' (round_robin, least_outstanding_tokens, kv_capacity_aware, kv_aware)");
}

const char* RoutingPolicyName(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kRoundRobin: return "round_robin";
    case RoutingPolicy::kLeastOutstandingTokens: return "least_outstanding_tokens";
    case RoutingPolicy::kKvCapacityAware: return "kv_capacity_aware";
    case RoutingPolicy::kKvAware: return "kv_aware";
  }
  return "unknown";
}

int ChooseWorker(RoutingPolicy policy, const std::vector<RoutingCandidate>& c, uint64_t* cursor) {
  const size_t n = c.size();
  if (n == 0) return -1;
  const uint64_t start = (*cursor)++;
  // Scan in round-robin order from the cursor so that ties rotate.
  auto at = [&](size_t k) { return static_cast<size_t>((start + k) % n); };
  if (policy == RoutingPolicy::kRoundRobin) return static_cast<int>(at(0));
  int best = -1;
  if (policy == RoutingPolicy::kKvAware) {
    // The tokens the worker would compute for this prompt plus the work it still owes, plus
    // what pulling part of its hit costs.
    auto score = [&](size_t i) {
      return std::max<int64_t>(c[i].prompt_tokens - c[i].predicted_hit_tokens, 0) +
             std::max<int64_t>(c[i].outstanding_tokens - c[i].computed_estimate_tokens, 0) +
             c[i].pulled_tokens / kPulledTokenCostDivisor;
    };
    for (size_t k = 0; k < n; ++k) {
      const size_t i = at(k);
      if (best < 0 || score(i) < score(static_cast<size_t>(best))) best = static_cast<int>(i);
    }
    return best;
  }
  if (policy == RoutingPolicy::kLeastOutstandingTokens) {
    for (size_t k = 0; k < n; ++k) {
      const size_t i = at(k);
      if (best < 0 || c[i].outstanding_tokens < c[static_cast<size_t>(best)].outstanding_tokens) best = static_cast<int>(i);
    }
    return best;
  }
  // kv_capacity_aware: first among those where the whole request fits, else where the prompt
  // fits; the best headroom sets the band, the fewest outstanding tokens within it wins.
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<double> headroom(n, -1.0);  // < 0: does not fit
    double top = -1.0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t left = c[i].kv_blocks_free - (pass == 0 ? c[i].blocks_for_request : c[i].blocks_for_prompt);
      if (left < 0) continue;
      headroom[i] = c[i].kv_blocks_total > 0 ? static_cast<double>(left) / static_cast<double>(c[i].kv_blocks_total)
                                             : static_cast<double>(left);
      top = std::max(top, headroom[i]);
    }
    if (top < 0) continue;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = at(k);
      if (headroom[i] < 0 || headroom[i] < top - kHeadroomBand) continue;
      if (best < 0 || c[i].outstanding_tokens < c[static_cast<size_t>(best)].outstanding_tokens) best = static_cast<int>(i);
    }
    return best;
  }
  return -1;
}

}  // namespace pdserve::router
