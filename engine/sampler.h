// Sampler: turns one sequence's fp32 logits into the next token, as SamplingParams
// (common/sampling_params.h) ask.
//
// Order of operations (as vLLM applies them):
//   1. logprobs, when asked, from the raw model distribution (log_softmax of the logits);
//   2. logit_bias added to its tokens' logits; then penalties: repetition (multiplicative, on
//      every token seen in prompt + output: logit / r if positive, logit * r otherwise), then
//      frequency (- f * count in output) and presence (- p if the token occurs in the output);
//   3. temperature == 0: greedy argmax (lowest id on ties), done;
//   4. logits / temperature; top-k (the k largest, lowest id on ties); top-p (the smallest
//      prefix, in descending probability, whose mass reaches top_p); min-p (drop tokens whose
//      probability is below min_p times the largest); sample from what is left.
// Randomness is a pure function of (seed, index of the generated token), so a request with a
// seed produces the same output however it is batched, preempted or recomputed.
// Thread-safety: Sampler is stateless apart from scratch: one instance per thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/sampling_params.h"
#include "common/status.h"

namespace pdserve::engine {

// What penalties need to know about a sequence: token counts of the output, and whether a
// token occurs in the prompt. Updated incrementally as tokens are generated.
class PenaltyState {
 public:
  void SetPrompt(const std::vector<int32_t>& prompt);
  void AddOutput(int32_t token) { ++output_counts_[token]; }
  const std::unordered_map<int32_t, int32_t>& output_counts() const { return output_counts_; }
  const std::vector<int32_t>& prompt_unique() const { return prompt_unique_; }

 private:
  std::unordered_map<int32_t, int32_t> output_counts_;
  std::vector<int32_t> prompt_unique_;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                              // of `token` (when logprobs was set)
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first
};

// The uniform draw in [0, 1) for generated token `index` of a sequence seeded `seed`.
double SampleUniform(uint64_t seed, int64_t index);

class Sampler {
 public:
  // Samples from logits[vocab] (modified in place: penalties, temperature). `index` is the
  // number of tokens the sequence generated so far. REQUIRES: params.Validate(vocab).ok().
  SampleResult Sample(float* logits, int64_t vocab, const SamplingParams& params, const PenaltyState& penalties,
                      uint64_t seed, int64_t index);

 private:
  std::vector<int32_t> order_;
  std::vector<float> probs_;
};

}  // namespace pdserve::engine
