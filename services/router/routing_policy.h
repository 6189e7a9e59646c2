// Routing policies: which worker of a role gets the next request.
//
//   round_robin               the next eligible worker in turn
//   least_outstanding_tokens  the eligible worker with the fewest outstanding tokens: prompt
//                             tokens not yet prefilled plus output tokens still owed, as the
//                             router accounts them per assignment (so the choice reacts at
//                             once, not a heartbeat later); ties go round-robin
//   kv_capacity_aware         (decode / colocated) among the eligible workers where the whole
//                             request (prompt + max_tokens) fits (when it fits nowhere: where
//                             the prompt fits), the KV headroom decides: the share of its pool
//                             a worker has left after this request. Workers within
//                             kHeadroomBand of the best headroom count as equal and the fewest
//                             outstanding tokens wins among them (ties go round-robin), so
//                             while every cache has room this balances the work, and a cache
//                             running short stops getting requests
//   kv_aware                  (prefill / colocated) the eligible worker with the least work
//                             before this request's first token: the prompt tokens it would
//                             still compute after its predicted prefix-cache hit (KvIndex,
//                             kv_index.h) plus its outstanding tokens, less the prompt tokens
//                             it has probably computed of them already (PrefillPace,
//                             prefill_pace.h); ties go round-robin. Decode workers take the
//                             whole prompt's KV from the transfer (no lookup), so the decode
//                             side keeps its own policy
//
// Eligible: ready (not draining) and prompt_tokens < max_context_tokens. Free blocks are the
// worker's last heartbeat minus what the router assigned since (WorkerRegistry).
//
// Thread-safety: pure function; the round-robin cursor is the caller's.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::router {

enum class RoutingPolicy { kRoundRobin, kLeastOutstandingTokens, kKvCapacityAware, kKvAware };

// Errors: InvalidArgument for an unknown name.
Result<RoutingPolicy> ParseRoutingPolicy(std::string_view name);
const char* RoutingPolicyName(RoutingPolicy policy);

// kv_capacity_aware: headroom shares closer than this (a tenth of a pool) are equal.
inline constexpr double kHeadroomBand = 0.1;

struct RoutingCandidate {
  int64_t outstanding_tokens = 0;
  int64_t kv_blocks_free = 0;     // estimate
  int64_t kv_blocks_total = 0;    // the worker's pool (0: unknown; headroom is then in blocks)
  int64_t blocks_for_request = 0; // prompt + max_tokens
  int64_t blocks_for_prompt = 0;
  int64_t prompt_tokens = 0;         // kv_aware: the request's prompt
  int64_t predicted_hit_tokens = 0;  // kv_aware: of those, predicted cached on this worker
  int64_t pulled_tokens = 0;         // kv_aware: of those, pulled from another worker first
  // kv_aware: of outstanding_tokens, the prompt tokens the worker has probably computed by now
  // (PrefillPace::TokensLeft)
  int64_t computed_estimate_tokens = 0;
};

// kv_aware: what a pulled token costs next to a computed one. Moving a token's KV is far
// cheaper than computing it (CPU: ~500x, a GPU cluster over RDMA: ~25-50x); 1/16 keeps a worker
// that holds the prefix itself ahead of an equally loaded one that would pull it, and lets a
// puller win once the holder's queue is longer than a sixteenth of the prefix.
inline constexpr int64_t kPulledTokenCostDivisor = 16;

// Index of the chosen candidate, or -1 when none can take the request (kv_capacity_aware only:
// no candidate can hold even the prompt). `cursor` is advanced for round-robin and ties.
int ChooseWorker(RoutingPolicy policy, const std::vector<RoutingCandidate>& candidates, uint64_t* cursor);

}  // namespace pdserve::router
