// BatchSequence: one sequence's share of a batched forward step (Model::ForwardBatch).
//
// A step runs rows of several sequences together: prompt chunks and decode tokens mixed. Each
// row's numbers are bitwise the same as when its sequence runs alone with the same chunking,
// whatever else is in the batch. The only batch-dependent choice in the arithmetic is the GEMM
// path, picked by the number of rows m of a call (kernels/gemm.h: m <= kGemmSmallMMax streams
// the weights, larger m uses the tiled path, with a different summation order). So every row
// belongs to a "row group", the set of rows that would share a GEMM call if run alone, and the
// batched forward gives each row the path its group's size selects:
//   RowGrouping::kChunk   the n_tokens rows form one group (a prompt chunk, or Model::Forward);
//                         dense projections use the tiled path iff n_tokens > 8, and each
//                         routed expert iff more than 8 of the chunk's rows chose it.
//   RowGrouping::kPerRow  every row is its own group (a decode token; also generated tokens
//                         recomputed after a preemption, so their KV is bitwise the KV the
//                         decode steps wrote).
// (W8A8 weights, kernels/gemm_int8.h, give the same bits on either path, so the grouping is
// harmless there.)
// Attention form: a kChunk at start 0 with n_tokens > 1 uses the reference's non-absorbed
// prefill attention; everything else the absorbed form over the latent cache.
#pragma once

#include <cstdint>

#include "model/kv_layout.h"

namespace pdserve::model {

struct ForwardOptions;

enum class RowGrouping : uint8_t { kChunk, kPerRow };

struct BatchSequence {
  const int32_t* tokens = nullptr;  // the new tokens, n_tokens of them
  int64_t n_tokens = 0;
  int64_t start = 0;                // position of tokens[0]; the cache holds [0, start)
  KvSequenceRef kv;                 // REQUIRES: kv.capacity_tokens >= start + n_tokens
  RowGrouping grouping = RowGrouping::kChunk;
  float* logits = nullptr;          // when set: the last row's fp32 logits [vocab_size]
  const ForwardOptions* options = nullptr;  // trace / forced top-k (tools and tests)
};

// Work counters of one ForwardBatch call, for bandwidth accounting (benchmarks, metrics).
struct BatchStats {
  int64_t rows = 0;
  int64_t routed_expert_runs = 0;  // (layer, routed expert) pairs that ran on >= 1 row
  int64_t kv_bytes_read = 0;       // indexer keys scored + latent/rope records gathered
};

}  // namespace pdserve::model
