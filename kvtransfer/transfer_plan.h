// Transfer planning: which local bytes go to which remote addresses, and the digest that
// proves they arrived.
//
// A prefill rank's KV lives in its own blocks (KvSource, its own tokens_per_block); the decode
// blocks are named by a KvDescriptor (the decode tokens_per_block). PlanWrites walks the
// tokens a rank is assigned, for a range of layers, and emits one write per maximal run that
// is contiguous on both sides: a (layer, component) array slice bounded by the source and
// destination block boundaries. Writes are then sorted by destination and merged whenever both
// source and destination continue exactly where the previous write ended (with equal block
// sizes, one layer of one block becomes one write; whole blocks of adjacent blocks become one).
// Chunking to the transport's preferred size happens in the transport.
//
// Digest (sent in the completion notice, recomputed by the decode side):
//   layer_digest(l) = XXH3-64 of the concatenation, for c in component order, for t in the
//                     rank's token ranges in increasing order, of the bytes of (l, c, t)
//   digest          = XXH3-64 of the little-endian uint64 array [layer_digest(0..L-1)]
// It depends only on the bytes and the token ranges, not on either side's block size.
//
// Thread-safety: pure functions over caller-owned memory.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kvtransfer/kv_descriptor.h"
#include "common/kv_layout.h"

namespace pdserve::kvtransfer {

// Tokens [tokens.begin, tokens.end) of the sequence, held in `blocks`: token t is in
// blocks[(t - tokens.begin) / B] at slot (t - tokens.begin) % B.
struct SourceRun {
  TokenRange tokens;
  std::vector<const uint8_t*> blocks;
};

// The KV a prefill rank holds (e.g. its context-parallel slice), in its own block layout.
struct KvSource {
  KvLayout layout;
  std::vector<SourceRun> runs;  // sorted by tokens.begin, disjoint
};

struct PlannedWrite {
  const uint8_t* src = nullptr;
  uint64_t dst_address = 0;
  uint64_t length = 0;
};

struct WritePlan {
  std::vector<PlannedWrite> writes;  // sorted by dst_address, merged
  uint64_t bytes = 0;
};

// kInvalidArgument unless `source` has a valid layout with the same token format as
// `dst_layout`, sorted disjoint runs with enough non-null blocks, and holds every token of
// `ranges`.
Status ValidateSource(const KvSource& source, const KvLayout& dst_layout,
                      const std::vector<TokenRange>& ranges);

// Writes for layers [first_layer, first_layer + num_layers) of the tokens in `ranges`.
// REQUIRES: ValidateSource(source, dst.layout, ranges).ok(), dst.Validate().ok(), ranges
// within [0, dst.num_tokens).
WritePlan PlanWrites(const KvSource& source, const KvDescriptor& dst,
                     const std::vector<TokenRange>& ranges, uint32_t first_layer,
                     uint32_t num_layers);

// Merges writes that are contiguous on both sides (sorts by destination first).
void MergeAdjacentWrites(std::vector<PlannedWrite>* writes);

// Digest of one layer of `ranges`, read from the prefill side's blocks.
uint64_t SourceLayerDigest(const KvSource& source, const std::vector<TokenRange>& ranges,
                           uint32_t layer);
// Digest of one layer of `ranges`, read from the decode blocks of `dst`, where `region_data`
// is the local mapping of dst.region.base_address. REQUIRES: dst.Validate().ok().
uint64_t DestinationLayerDigest(const KvDescriptor& dst, const uint8_t* region_data,
                                const std::vector<TokenRange>& ranges, uint32_t layer);
uint64_t CombineLayerDigests(const std::vector<uint64_t>& layer_digests);

// Bytes a rank writes for `ranges` over every layer of `layout`.
uint64_t BytesForRanges(const KvLayout& layout, const std::vector<TokenRange>& ranges);

}  // namespace pdserve::kvtransfer
