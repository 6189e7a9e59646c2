#include "kvtransfer/transfer_plan.h"

#include <algorithm>

#include <fmt/format.h>
// Inlined XXH3 compiles with this target's AVX2 (about 1.5x the generic libxxhash build).
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace pdserve::kvtransfer {

namespace {

// Finds the run holding `token` (runs sorted by begin); nullptr if none.
const SourceRun* FindRun(const KvSource& source, uint32_t token) {
  auto it = std::upper_bound(source.runs.begin(), source.runs.end(), token,
                             [](uint32_t t, const SourceRun& run) { return t < run.tokens.begin; });
  if (it == source.runs.begin()) return nullptr;
  --it;
  return token < it->tokens.end ? &*it : nullptr;
}

// Calls fn(component, src_ptr, n_tokens, dst_block_index, dst_slot) for every maximal piece
// of one layer of `ranges` contiguous in both the source and the destination block layouts,
// in canonical (component, token) order. dst_tokens_per_block == 0 means "no destination".
template <typename Fn>
void ForEachSourcePiece(const KvSource& source, uint32_t dst_tokens_per_block,
                        const std::vector<TokenRange>& ranges, uint32_t layer, Fn&& fn) {
  const KvLayout& sl = source.layout;
  const uint32_t sb = sl.tokens_per_block;
  for (KvComponent c : kAllKvComponents) {
    const uint64_t bytes_per_token = sl.ComponentBytesPerToken(c);
    if (bytes_per_token == 0) continue;
    for (const TokenRange& range : ranges) {
      uint32_t t = range.begin;
      while (t < range.end) {
        const SourceRun* run = FindRun(source, t);
        PDSERVE_CHECK(run != nullptr, "token not held by the source (ValidateSource not run?)");
        const uint32_t local = t - run->tokens.begin;
        const uint32_t sblock = local / sb;
        const uint32_t sslot = local % sb;
        uint32_t n = std::min({range.end - t, run->tokens.end - t, sb - sslot});
        uint32_t dblock = 0;
        uint32_t dslot = 0;
        if (dst_tokens_per_block != 0) {
          dblock = t / dst_tokens_per_block;
          dslot = t % dst_tokens_per_block;
          n = std::min(n, dst_tokens_per_block - dslot);
        }
        const uint8_t* src = run->blocks[sblock] + sl.Offset(layer, c, sslot);
        fn(c, src, n, dblock, dslot);
        t += n;
      }
    }
  }
}

}  // namespace

Status ValidateSource(const KvSource& source, const KvLayout& dst_layout,
                      const std::vector<TokenRange>& ranges) {
  PDSERVE_RETURN_IF_ERROR(source.layout.Validate());
  if (!source.layout.SameTokenFormat(dst_layout)) {
    return Status::InvalidArgument(fmt::format("source layout {} and destination layout {} differ",
                                               source.layout.ToString(), dst_layout.ToString()));
  }
  uint32_t previous_end = 0;
  for (size_t i = 0; i < source.runs.size(); ++i) {
    const SourceRun& run = source.runs[i];
    if (run.tokens.empty() || (i > 0 && run.tokens.begin < previous_end)) {
      return Status::InvalidArgument("source runs must be non-empty, sorted and disjoint");
    }
    previous_end = run.tokens.end;
    if (run.blocks.size() < source.layout.BlocksForTokens(run.tokens.size())) {
      return Status::InvalidArgument(fmt::format("source run [{}, {}) has {} blocks, needs {}",
                                                 run.tokens.begin, run.tokens.end,
                                                 run.blocks.size(),
                                                 source.layout.BlocksForTokens(run.tokens.size())));
    }
    for (const uint8_t* block : run.blocks) {
      if (block == nullptr) return Status::InvalidArgument("null source block");
    }
  }
  for (const TokenRange& range : ranges) {
    uint32_t t = range.begin;
    while (t < range.end) {
      const SourceRun* run = FindRun(source, t);
      if (run == nullptr) {
        return Status::InvalidArgument(fmt::format("source does not hold token {}", t));
      }
      t = run->tokens.end;
    }
  }
  return Status::Ok();
}

WritePlan PlanWrites(const KvSource& source, const KvDescriptor& dst,
                     const std::vector<TokenRange>& ranges, uint32_t first_layer,
                     uint32_t num_layers) {
  WritePlan plan;
  const KvLayout& dl = dst.layout;
  for (uint32_t layer = first_layer; layer < first_layer + num_layers; ++layer) {
    ForEachSourcePiece(source, dl.tokens_per_block, ranges, layer,
                       [&](KvComponent c, const uint8_t* src, uint32_t n, uint32_t dblock,
                           uint32_t dslot) {
                         const uint64_t length = n * dl.ComponentBytesPerToken(c);
                         plan.writes.push_back(
                             {src, dst.block_addresses[dblock] + dl.Offset(layer, c, dslot),
                              length});
                         plan.bytes += length;
                       });
  }
  MergeAdjacentWrites(&plan.writes);
  return plan;
}

void MergeAdjacentWrites(std::vector<PlannedWrite>* writes) {
  std::sort(writes->begin(), writes->end(), [](const PlannedWrite& a, const PlannedWrite& b) {
    return a.dst_address < b.dst_address;
  });
  size_t out = 0;
  for (size_t i = 0; i < writes->size(); ++i) {
    const PlannedWrite& w = (*writes)[i];
    if (out > 0) {
      PlannedWrite& last = (*writes)[out - 1];
      if (last.dst_address + last.length == w.dst_address && last.src + last.length == w.src) {
        last.length += w.length;
        continue;
      }
    }
    (*writes)[out++] = w;
  }
  writes->resize(out);
}

uint64_t SourceLayerDigest(const KvSource& source, const std::vector<TokenRange>& ranges,
                           uint32_t layer) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  ForEachSourcePiece(source, 0, ranges, layer,
                     [&](KvComponent c, const uint8_t* src, uint32_t n, uint32_t, uint32_t) {
                       XXH3_64bits_update(&state, src,
                                          n * source.layout.ComponentBytesPerToken(c));
                     });
  return XXH3_64bits_digest(&state);
}

uint64_t DestinationLayerDigest(const KvDescriptor& dst, const uint8_t* region_data,
                                const std::vector<TokenRange>& ranges, uint32_t layer) {
  const KvLayout& dl = dst.layout;
  const uint32_t b = dl.tokens_per_block;
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (KvComponent c : kAllKvComponents) {
    const uint64_t bytes_per_token = dl.ComponentBytesPerToken(c);
    if (bytes_per_token == 0) continue;
    for (const TokenRange& range : ranges) {
      for (uint32_t t = range.begin; t < range.end;) {
        const uint32_t slot = t % b;
        const uint32_t n = std::min(range.end - t, b - slot);
        const uint64_t offset = dst.block_addresses[t / b] - dst.region.base_address;
        XXH3_64bits_update(&state, region_data + offset + dl.Offset(layer, c, slot),
                           n * bytes_per_token);
        t += n;
      }
    }
  }
  return XXH3_64bits_digest(&state);
}

uint64_t CombineLayerDigests(const std::vector<uint64_t>& layer_digests) {
  std::vector<uint8_t> bytes(layer_digests.size() * 8);
  for (size_t i = 0; i < layer_digests.size(); ++i) {
    for (int k = 0; k < 8; ++k) bytes[i * 8 + k] = static_cast<uint8_t>(layer_digests[i] >> (8 * k));
  }
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t BytesForRanges(const KvLayout& layout, const std::vector<TokenRange>& ranges) {
  uint64_t tokens = 0;
  for (const TokenRange& r : ranges) tokens += r.size();
  return tokens * layout.TokenBytesPerLayer() * layout.num_layers;
}

}  // namespace pdserve::kvtransfer
