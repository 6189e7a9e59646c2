// Sharding math for tensor parallelism: which slice of a dimension a TP rank owns. Pure
// functions, no MPI (the weight loader and the tests use them directly).
//
// Conventions (weights in torch layout [out_features, in_features]):
//   * Even split: n items over `parts` ranks; the first n % parts ranks get one extra, so any
//     two shards differ by at most one and rank order equals index order (an all-gather in rank
//     order reassembles the full dimension).
//   * Vocabulary (lm_head rows and embedding rows): an even split of vocab_size. lm_head gives
//     each rank logits for its vocab slice -> TensorParallel::GatherColumns; the embedding gives
//     each rank the rows of the ids it owns, zeros elsewhere -> TensorParallel::AllReduceSum.
//   * o_proj "input-sharded" (Megatron's row-parallel): rank r holds W[:, in_shard] where the
//     input features are the attention output of its heads (HeadShard: whole heads only, since
//     attention heads are split the same way); its product is a partial [n x hidden] that the
//     TP group sums (AllReduceSum).
//   * o_proj "output-sharded" (column-parallel): rank r holds W[out_shard, :] with the full
//     input; its product is [n x out_shard], assembled with GatherColumns.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace pdserve::comm {

// The half-open index range [begin, end).
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool Contains(int64_t i) const { return i >= begin && i < end; }
  bool operator==(const ShardRange&) const = default;
};

// REQUIRES: n >= 0, parts >= 1, 0 <= index < parts.
ShardRange EvenShard(int64_t n, int parts, int index);

// The rank that owns item i of an EvenShard split. REQUIRES: 0 <= i < n.
int EvenShardOwner(int64_t n, int parts, int64_t i);

// Whole attention heads of rank `index`, and the matching o_proj input columns
// [heads.begin * head_dim, heads.end * head_dim). REQUIRES: n_heads % parts == 0.
ShardRange HeadShard(int64_t n_heads, int parts, int index);
ShardRange HeadColumnShard(int64_t n_heads, int64_t head_dim, int parts, int index);

}  // namespace pdserve::comm
