#include "services/router/routing_policy.h"

#include <string>

namespace pdserve::router {

Result<RoutingPolicy> ParseRoutingPolicy(std::string_view name) {
  if (name == "round_robin") return RoutingPolicy::kRoundRobin;
  if (name == "least_outstanding_tokens") return RoutingPolicy::kLeastOutstandingTokens;
  if (name == "kv_capacity_aware") return RoutingPolicy::kKvCapacityAware;
  return Status::InvalidArgument("unknown routing policy '" + std::string(name) +
                                 "' (round_robin, least_outstanding_tokens, kv_capacity_aware)");
}

const char* RoutingPolicyName(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kRoundRobin: return "round_robin";
    case RoutingPolicy::kLeastOutstandingTokens: return "least_outstanding_tokens";
    case RoutingPolicy::kKvCapacityAware: return "kv_capacity_aware";
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
  if (policy == RoutingPolicy::kLeastOutstandingTokens) {
    for (size_t k = 0; k < n; ++k) {
      const size_t i = at(k);
      if (best < 0 || c[i].outstanding_tokens < c[static_cast<size_t>(best)].outstanding_tokens) best = static_cast<int>(i);
    }
    return best;
  }
  // kv_capacity_aware: first among those where the whole request fits, else where the prompt fits.
  for (int pass = 0; pass < 2 && best < 0; ++pass) {
    for (size_t k = 0; k < n; ++k) {
      const size_t i = at(k);
      const int64_t need = pass == 0 ? c[i].blocks_for_request : c[i].blocks_for_prompt;
      if (c[i].kv_blocks_free < need) continue;
      if (best < 0) {
        best = static_cast<int>(i);
        continue;
      }
      const auto& b = c[static_cast<size_t>(best)];
      const int64_t left_i = c[i].kv_blocks_free - need;
      const int64_t left_b = b.kv_blocks_free - (pass == 0 ? b.blocks_for_request : b.blocks_for_prompt);
      if (left_i > left_b || (left_i == left_b && c[i].outstanding_tokens < b.outstanding_tokens))
        best = static_cast<int>(i);
    }
  }
  return best;
}

}  // namespace pdserve::router
