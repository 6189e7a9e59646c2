// BatchSequence: one sequence's share of a batched forward step (Model::ForwardBatch).
//
// A step runs rows of several sequences together: prompt chunks and decode tokens mixed. Each
// row's numbers are bitwise the same as when its sequence runs alone with the same chunking,
// whatever else is in the batch: every GEMM sums each output in one order for every number of
// rows m (docs/kernels-gemm.md), so all rows of a step share each projection's call, and
// everything else (norms, RoPE, quantization, indexer, top-k, attention) is computed per row.
//   RowGrouping::kChunk   the n_tokens rows are a prompt chunk (or Model::Forward);
//   RowGrouping::kPerRow  every row is an output token (a decode token; also generated tokens
//                         recomputed after a preemption).
//   RowGrouping::kPromptRest  the rows are a prompt's positions [start, start + n_tokens) after
//                         a cached prefix [0, start), in an engine that computes prompts whole
//                         (a CP prefill): they take the form the whole prompt's rows take in a
//                         cold run, so the prefix cache reuses a prefix without changing a bit.
// Attention form: a kChunk at start 0 with n_tokens > 1, and a kPromptRest, use the reference's
// non-absorbed prefill attention (keys expanded from the cached latents of [0, last row]);
// everything else the absorbed form over the latent cache (so recomputed output tokens write
// bitwise the KV the decode steps wrote).
#pragma once

#include <cstdint>

#include "model/kv_layout.h"

namespace pdserve::model {

struct ForwardOptions;

enum class RowGrouping : uint8_t { kChunk, kPerRow, kPromptRest };

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
