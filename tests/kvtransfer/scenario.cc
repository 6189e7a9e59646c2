#include "tests/kvtransfer/scenario.h"

#include <random>

namespace pdserve::kvtransfer::testing {

KvLayout ScenarioLayout(uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 1);
  KvLayout l;
  l.num_layers = 1 + rng() % 4;
  const uint32_t ranks[] = {128, 256, 512};
  l.kv_lora_rank = ranks[rng() % 3];
  l.qk_rope_head_dim = (rng() % 2) ? 64 : 32;
  l.index_head_dim = (rng() % 4 == 0) ? 0 : 128;
  l.latent_format = static_cast<KvLatentFormat>(rng() % 3);
  l.index_format = static_cast<KvIndexFormat>(rng() % 2);
  l.latent_scale_group = 128;
  const uint32_t blocks[] = {16, 32, 64, 128};
  l.tokens_per_block = blocks[rng() % 4];
  return l;
}

RequestScenario MakeRequestScenario(uint64_t seed, uint64_t index, uint32_t cp,
                                    bool replicated) {
  std::mt19937_64 rng(seed * 1000003 + index);
  const KvLayout decode = ScenarioLayout(seed);
  const uint32_t b = decode.tokens_per_block;
  RequestScenario s;
  switch (index % 4) {
    case 0: s.num_tokens = 1; break;
    case 1: s.num_tokens = 2 * b + 1 + static_cast<uint32_t>(rng() % (b - 1)); break;
    case 2: s.num_tokens = 1 + static_cast<uint32_t>(rng() % 300); break;
    default: s.num_tokens = 2000 + static_cast<uint32_t>(rng() % 600); break;
  }
  const uint32_t prefill_blocks[] = {16, 32, 64, 128, b};
  s.prefill_layout = decode.WithTokensPerBlock(prefill_blocks[rng() % 5]);
  for (uint32_t r = 0; r < cp; ++r) {
    if (replicated) {
      s.holdings.push_back({TokenRange{0, s.num_tokens}});
    } else {
      TokenRange slice = ContiguousCpSlice(s.num_tokens, cp, r);
      s.holdings.push_back(slice.empty() ? std::vector<TokenRange>{}
                                         : std::vector<TokenRange>{slice});
    }
  }
  return s;
}

}  // namespace pdserve::kvtransfer::testing
