// Scenario: the deterministic description of a multi-process transfer test, computed
// identically by the decode helper, every prefill helper and the test from (seed, request):
// the KV layout (random dimensions and dtypes, fixed per seed because one decode pool has one
// layout), each request's length and prefill block size, and which tokens each prefill rank
// holds (context-parallel slices, or full replicas).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "kvtransfer/kv_descriptor.h"
#include "common/kv_layout.h"

namespace pdserve::kvtransfer::testing {

struct RequestScenario {
  uint32_t num_tokens = 0;
  KvLayout prefill_layout;                        // the decode layout with another block size
  std::vector<std::vector<TokenRange>> holdings;  // per prefill rank
};

// The decode-side layout for a seed (random formats, dims, layers, block size).
KvLayout ScenarioLayout(uint64_t seed);
// Request `index` of a run: lengths cycle through 1 token, a partial last block, a random
// length and a long sequence.
RequestScenario MakeRequestScenario(uint64_t seed, uint64_t index, uint32_t cp, bool replicated);
// Tokens the longest request of a run may have (sizes the decode pool).
constexpr uint32_t kMaxScenarioTokens = 2600;

}  // namespace pdserve::kvtransfer::testing
