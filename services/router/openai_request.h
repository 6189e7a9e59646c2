// OpenAI request parsing and validation for POST /v1/completions and /v1/chat/completions.
//
// Parsing checks shapes, types and ranges of every field that matters and refuses features the
// cluster does not implement (n != 1, best_of != 1, echo, suffix, logit_bias, tools,
// non-text response_format) with a 400 naming the `param`, instead of silently ignoring them.
// Unknown keys are ignored, as OpenAI-compatible servers commonly do. Checks that need the
// tokenizer or the workers (vocabulary, context length, model name) happen in the server.
//
// Supported fields (both endpoints unless noted): model, max_tokens, max_completion_tokens
// (chat), temperature [0, 2], top_p (0, 1], top_k (-1/0 off, or >= 1), min_p [0, 1],
// presence_penalty / frequency_penalty [-2, 2], repetition_penalty (0, 10], seed, stop (string
// or list of up to 16), stop_token_ids, ignore_eos, skip_special_tokens, n (1), stream,
// stream_options.include_usage, user, logprobs (completions: 0..20; chat: bool with
// top_logprobs 0..20), prompt (completions: string, [string], [ids], [[ids]]), messages (chat),
// thinking / chat_template_kwargs.thinking (chat; DeepSeek-V3.2 thinking mode).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "services/control/control_messages.h"
#include "services/router/api_error.h"
#include "tokenizer/chat_template.h"

namespace pdserve::router {

enum class ApiEndpoint { kCompletions, kChat };

struct ParsedRequest {
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  std::string model;
  // Completions: exactly one of prompt_text / prompt_ids is set. Chat: messages.
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  std::vector<tokenizer::ChatMessage> messages;
  tokenizer::ChatTemplateOptions chat_options;
  std::optional<uint32_t> max_tokens;
  // Sampling without max_tokens and stop ids (the server resolves those).
  services::SamplingSpec sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  uint32_t top_logprobs = 0;
  std::string user;
};

inline constexpr size_t kMaxStopSequences = 16;
inline constexpr size_t kMaxStopSequenceBytes = 1024;
inline constexpr uint32_t kMaxTopLogprobs = 20;

// Parses a request body. On error returns the OpenAI-shaped 400 to send.
std::optional<ApiError> ParseRequest(ApiEndpoint endpoint, std::string_view body, ParsedRequest* out);
std::optional<ApiError> ParseRequestJson(ApiEndpoint endpoint, const nlohmann::json& body, ParsedRequest* out);

}  // namespace pdserve::router
