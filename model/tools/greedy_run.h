// GreedyRun: a prompt prefill followed by greedy decoding on one Model, recording what the
// accuracy tooling needs, and the dump directory format shared with the Python reference.
//
// Dump layout (float32 / int32 .npy + index.json), S = prompt length, L = layers, K = index_topk:
//   hidden.npy        [L+1, S, D]  row 0 embedding, row l the fp32 residual sum after layer l-1
//   index_scores.npy  [L, S, S]    indexer prefill scores, -inf where not causal
//   topk.npy          [L, S, K]    prefill selections, ascending, -1 padded
//   step_logits.npy   [steps, V]   logits of every greedy step (row 0 from the prefill)
//   topk_decode.npy   [steps-1, L, K] selections of each decode step
//   index.json        {"prompt_tokens": [...], "output_tokens": [...], "producer": ...}
// Thread-safety: functions are reentrant; the Model's pool is used by RunGreedy.
#pragma once

#include <string>
#include <vector>

#include "common/op_profile.h"
#include "model/model.h"

namespace pdserve::model {

// The greedy choice: the first index of the largest logit (ties go to the lower id). One
// definition for the greedy runs and the accuracy tools, so they agree on ties.
int32_t GreedyToken(const std::vector<float>& logits);

struct GreedyRun {
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  ForwardTrace prefill;              // hidden, index_scores, topk of the prompt
  std::vector<float> prefill_logits; // [V] logits of the last prompt position
  std::vector<float> step_logits;    // [steps, V]
  std::vector<int32_t> topk_decode;  // [steps-1, L, K]
  double prefill_seconds = 0, decode_seconds = 0;
};

// The storage formats of a run's KV cache (model/kv_layout.h); the default is the reference's
// (fp8 latent, fp8 indexer keys). int8 latent = the C8 cache, int8 index = the A8C8 indexer.
struct KvCacheFormats {
  KvLatentFormat latent = KvLatentFormat::kFp8Blockwise;
  KvIndexFormat index = KvIndexFormat::kFp8;
};

// Greedy decoding (argmax, lowest id on ties) of max_new tokens; no stop on EOS.
// forced_topk, when non-null ([L, S, K]), replaces the prompt's indexer selections.
// profile, when non-null, receives the op profile of the prefill and of every decode step
// (model/profile_ops.h); each decode step's argmax counts as its sampling.
// Errors: those of Model::Forward.
Result<GreedyRun> RunGreedy(const Model& model, const std::vector<int32_t>& prompt, int64_t max_new,
                            const std::vector<int32_t>* forced_topk = nullptr, const KvCacheFormats& kv = {},
                            OpProfile* profile = nullptr);

// Writes `run` in the dump layout above. Errors: Internal on I/O failure.
Status WriteDump(const std::string& dir, const ModelConfig& config, const GreedyRun& run);

}  // namespace pdserve::model
