#include "common/sampling_params.h"

#include <cmath>

namespace pdserve {

namespace {
std::string Range(const char* what, double v) { return std::string(what) + " = " + std::to_string(v); }
}  // namespace

Status SamplingParams::Validate(int64_t vocab_size) const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    return Status::InvalidArgument(Range("temperature", temperature) + " must be a finite number >= 0");
  if (top_k < -1) return Status::InvalidArgument(Range("top_k", top_k) + " must be -1, 0 (off) or >= 1");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return Status::InvalidArgument(Range("top_p", top_p) + " must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return Status::InvalidArgument(Range("min_p", min_p) + " must be in [0, 1]");
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return Status::InvalidArgument(Range("presence_penalty", presence_penalty) + " must be in [-2, 2]");
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return Status::InvalidArgument(Range("frequency_penalty", frequency_penalty) + " must be in [-2, 2]");
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    return Status::InvalidArgument(Range("repetition_penalty", repetition_penalty) + " must be > 0");
  if (max_tokens < 1) return Status::InvalidArgument(Range("max_tokens", max_tokens) + " must be >= 1");
  if (resumed_output < 0)
    return Status::InvalidArgument(Range("resumed_output", resumed_output) + " must be >= 0");
  if (logprobs && (*logprobs < 0 || *logprobs > kMaxLogprobs))
    return Status::InvalidArgument(Range("logprobs", *logprobs) + " must be in [0, " + std::to_string(kMaxLogprobs) + "]");
  for (int32_t t : stop_token_ids)
    if (t < 0 || t >= vocab_size)
      return Status::InvalidArgument("stop token id " + std::to_string(t) + " outside the vocabulary [0, " +
                                     std::to_string(vocab_size) + ")");
  if (logit_bias.size() > kMaxLogitBias)
    return Status::InvalidArgument("logit_bias has " + std::to_string(logit_bias.size()) + " entries, at most " +
                                   std::to_string(kMaxLogitBias) + " are allowed");
  for (const LogitBias& b : logit_bias) {
    if (b.token < 0 || b.token >= vocab_size)
      return Status::InvalidArgument("logit_bias token id " + std::to_string(b.token) + " outside the vocabulary [0, " +
                                     std::to_string(vocab_size) + ")");
    if (!(b.bias >= -100.0f && b.bias <= 100.0f))
      return Status::InvalidArgument(Range("logit_bias", b.bias) + " for token " + std::to_string(b.token) +
                                     " must be in [-100, 100]");
  }
  for (const std::string& s : stop)
    if (s.empty()) return Status::InvalidArgument("empty stop string");
  return Status::Ok();
}

}  // namespace pdserve
