// SamplingParams: what a generation request asks of the sampler. One definition for the
// engine (which samples with it), the router <-> worker control protocol (its codec maps the
// wire fields onto this struct) and the router (which fills it from the client's request).
// The sampler's order of operations is in engine/sampler.h.
//
// Thread-safety: a value type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve {

// An additive bias on one token's logit (OpenAI's logit_bias): -100 bans the token in
// practice, +100 all but forces it.
struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;  // [-100, 100]
  bool operator==(const LogitBias&) const = default;
};

struct SamplingParams {
  static constexpr int32_t kMaxLogprobs = 20;      // top-n alternatives per token at most
  static constexpr size_t kMaxLogitBias = 1024;    // logit_bias entries at most

  float temperature = 1.0f;          // >= 0; 0 = greedy
  int32_t top_k = 0;                 // 0 or -1: off; else >= 1
  float top_p = 1.0f;                // (0, 1]
  float min_p = 0.0f;                // [0, 1]
  float presence_penalty = 0.0f;     // [-2, 2]
  float frequency_penalty = 0.0f;    // [-2, 2]
  float repetition_penalty = 1.0f;   // > 0; 1 = off
  std::optional<uint64_t> seed;      // unset: the engine draws one
  int32_t max_tokens = 16;           // >= 1: generated tokens at most
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;     // stop strings: matched by whoever detokenizes (an engine
                                     // with a detokenizer; in the cluster, the router)
  std::vector<LogitBias> logit_bias;  // tokens in the vocabulary; a repeated token's biases add
  std::optional<int32_t> logprobs;   // top-n logprobs per token, n in [0, kMaxLogprobs]; the sampled
                                     // token's logprob is reported whenever this is set
  // A resumed request (the router migrated it from a failed worker): the prompt's last
  // resumed_output tokens are this request's earlier output. They count as output for the
  // penalties, the sampling index (so a seed draws as if never interrupted) and the stop-string
  // window, and are computed as output rows (bitwise the KV decode wrote); max_tokens counts
  // new tokens only. In [0, prompt length).
  int32_t resumed_output = 0;

  // Errors: InvalidArgument naming the field and its allowed range.
  Status Validate(int64_t vocab_size) const;
  bool greedy() const { return temperature == 0.0f; }
  bool has_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
  bool operator==(const SamplingParams&) const = default;
};

}  // namespace pdserve
