// CpSplit: which prompt positions each context-parallel rank prefills (pure math, no MPI).
//
// Causal attention makes position p cost about p+1 key visits, so contiguous equal chunks are
// uneven: with cp ranks the last rank would do ~(2cp-1)x the work of the first. The split used
// here is the zig-zag one: cut the prompt into 2*cp near-equal chunks (EvenShard: the first
// seq_len % (2cp) chunks are one token longer) and give rank r chunk r and chunk 2*cp-1-r. An
// early (cheap) chunk pairs with a late (expensive) one, and for chunk size s every pair costs
//   s*(s*r + (s+1)/2) + s*(s*(2cp-1-r) + (s+1)/2) = s*s*(2cp-1) + s*(s+1),
// the same for every r. The rounding of uneven lengths leaves a difference of at most a few
// chunk-lengths of work (well under 1% for prompts of a few hundred tokens per rank).
//
// Each rank's local order is "chunk r, then chunk 2cp-1-r", both ascending: every per-token
// buffer a CP rank holds (hidden states, local latent records) is in that order, and
// CpRecordGather turns the ranks' local records into the full sequence in position order. The
// last position (whose logits sample the first token) lives on rank 0 (chunk 2cp-1).
//
// With a sparse (top-k) attention the per-query cost is capped at top-k keys once p >= top-k,
// which only flattens the curve: the split stays balanced; the indexer scoring itself keeps the
// full causal cost.
//
// Thread-safety: value type.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "comm/shard.h"

namespace pdserve::comm {

class CpSplit {
 public:
  // REQUIRES: seq_len >= 0, cp_size >= 1.
  CpSplit(int64_t seq_len, int cp_size);

  int64_t seq_len() const { return seq_len_; }
  int cp_size() const { return cp_size_; }
  int n_chunks() const { return 2 * cp_size_; }

  // Chunk c in [0, 2*cp) of the prompt.
  ShardRange Chunk(int c) const { return EvenShard(seq_len_, n_chunks(), c); }
  // {chunk r, chunk 2cp-1-r}: the positions rank r prefills, in its local order.
  std::array<ShardRange, 2> RankChunks(int rank) const;
  int64_t RankTokens(int rank) const;
  std::vector<int64_t> RankPositions(int rank) const;

  // The rank that prefills position `pos`, and the index of `pos` in that rank's local order.
  int OwnerOf(int64_t pos) const;
  int64_t LocalIndexOf(int64_t pos) const;

  // Causal attention work of the rank: sum over its positions p of (p + 1).
  int64_t RankCausalWork(int rank) const;

 private:
  int64_t seq_len_;
  int cp_size_;
};

}  // namespace pdserve::comm
