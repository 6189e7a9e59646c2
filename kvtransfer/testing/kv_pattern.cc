#include "kvtransfer/testing/kv_pattern.h"

#include <cstring>

#include <fmt/format.h>

namespace pdserve::kvtransfer::testing {

namespace {
uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

void PatternBytes(uint64_t seed, uint64_t request_id, uint32_t layer, KvComponent component,
                  uint32_t token, uint8_t* out, uint64_t n) {
  uint64_t state = seed * 0x100000001b3ull ^ (request_id << 20) ^
                   (static_cast<uint64_t>(layer) << 40) ^
                   (static_cast<uint64_t>(component) << 56) ^ token;
  SplitMix(state);
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = SplitMix(state);
    std::memcpy(out + i, &v, 8);
  }
  if (i < n) {
    const uint64_t v = SplitMix(state);
    std::memcpy(out + i, &v, n - i);
  }
}

SourceCache::SourceCache(const KvLayout& layout, std::vector<TokenRange> held, uint64_t seed,
                         uint64_t request_id, bool fill) {
  source_.layout = layout;
  uint64_t blocks = 0;
  for (const TokenRange& r : held) blocks += layout.BlocksForTokens(r.size());
  size_ = blocks * layout.BlockBytes();
  storage_.reset(new uint8_t[size_ > 0 ? size_ : 1]());
  uint8_t* next = storage_.get();
  for (const TokenRange& r : held) {
    if (r.empty()) continue;
    SourceRun run;
    run.tokens = r;
    for (uint64_t b = 0; b < layout.BlocksForTokens(r.size()); ++b) {
      run.blocks.push_back(next);
      next += layout.BlockBytes();
    }
    if (fill) {
      for (uint32_t t = r.begin; t < r.end; ++t) {
        const uint32_t local = t - r.begin;
        uint8_t* block = const_cast<uint8_t*>(run.blocks[local / layout.tokens_per_block]);
        for (uint32_t l = 0; l < layout.num_layers; ++l) {
          for (KvComponent c : kAllKvComponents) {
            const uint64_t n = layout.ComponentBytesPerToken(c);
            if (n == 0) continue;
            PatternBytes(seed, request_id, l, c, t,
                         block + layout.Offset(l, c, local % layout.tokens_per_block), n);
          }
        }
      }
    }
    source_.runs.push_back(std::move(run));
  }
}

Status CheckDestination(const KvDescriptor& d, const uint8_t* region_data,
                        const std::vector<TokenRange>& ranges, uint64_t seed) {
  const KvLayout& layout = d.layout;
  std::vector<uint8_t> expected;
  for (const TokenRange& r : ranges) {
    for (uint32_t t = r.begin; t < r.end; ++t) {
      const uint8_t* block = region_data + (d.block_addresses[t / layout.tokens_per_block] -
                                            d.region.base_address);
      for (uint32_t l = 0; l < layout.num_layers; ++l) {
        for (KvComponent c : kAllKvComponents) {
          const uint64_t n = layout.ComponentBytesPerToken(c);
          if (n == 0) continue;
          expected.resize(n);
          PatternBytes(seed, d.request_id, l, c, t, expected.data(), n);
          const uint8_t* got = block + layout.Offset(l, c, t % layout.tokens_per_block);
          if (std::memcmp(got, expected.data(), n) != 0) {
            return Status::DataLoss(fmt::format("request {}: token {} layer {} {} differs",
                                                d.request_id, t, l, KvComponentName(c)));
          }
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace pdserve::kvtransfer::testing
