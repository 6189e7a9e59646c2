// OpenAI request parsing and validation for POST /v1/completions and /v1/chat/completions.
//
// Parsing checks shapes, types and ranges of every field that matters and refuses features the
// cluster does not implement (best_of other than 1 or n, echo, suffix) with a 400 naming the
// `param`, instead of silently ignoring them. Unknown keys are ignored, as OpenAI-compatible
// servers commonly do. Checks that need the tokenizer or the workers (vocabulary, context
// length, model name, the prompt a constraint follows) happen in request_prep.h.
//
// Supported fields (both endpoints unless noted): model, max_tokens, max_completion_tokens
// (chat), temperature [0, 2], top_p (0, 1], top_k (-1/0 off, or >= 1), min_p [0, 1],
// presence_penalty / frequency_penalty [-2, 2], repetition_penalty (0, 10], seed, stop (string
// or list of up to 16), stop_token_ids, ignore_eos, skip_special_tokens, n [1, kMaxChoices],
// logit_bias ({"token id": bias in [-100, 100]}), stream, stream_options.include_usage, user,
// return_token_ids (vLLM's extension),
// logprobs (completions: 0..20; chat: bool with top_logprobs 0..20), prompt (completions:
// string, [string], [ids], [[ids]]), messages (chat), thinking / chat_template_kwargs.thinking /
// chat_template_kwargs.enable_thinking (chat; the thinking switch), tools and tool_choice
// (chat), and the output constraint (docs/structured-output.md), one of:
//   response_format {"type": "text" | "json_object"}
//   response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
//   response_format {"type": "regex", "regex": "..."}        pdserve extension
//   response_format {"type": "grammar", "grammar": "..."}    pdserve extension (EBNF)
//   guided_json (a schema, or its text), guided_regex, guided_grammar, guided_choice (a list
//   of strings): vLLM's spellings.
// A schema's property order is kept (the body is read as ordered JSON): it is the order the
// output writes the properties in. Schemas, regexes and grammars are checked here; their
// errors name the field and, for schemas, the keyword and its JSON pointer.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "grammar/constraint.h"
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
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  uint32_t top_logprobs = 0;
  // vLLM's return_token_ids: the reply carries the prompt's token ids and each choice's
  // generated ids (openai_response.h), so a client can continue the conversation by ids.
  bool return_token_ids = false;
  std::string user;
  // Choices to generate (n); each is its own job (request_prep.h).
  uint32_t n = 1;
  // The output constraint from response_format / guided_* (kNone: free text). Tool-call
  // grammars and the thinking prefix are added by request_prep.h, which sees the prompt.
  grammar::Constraint constraint;
  std::string constraint_param;  // the request field the constraint came from
  // Chat: chat_options.tools and chat_options.tool_choice hold tools / tool_choice.
};

inline constexpr size_t kMaxStopSequences = 16;
inline constexpr size_t kMaxStopSequenceBytes = 1024;
inline constexpr uint32_t kMaxTopLogprobs = 20;
// n: each choice is a job of its own, so the cap bounds what one request may occupy.
inline constexpr uint32_t kMaxChoices = 16;

// Parses a request body. On error returns the OpenAI-shaped 400 to send.
std::optional<ApiError> ParseRequest(ApiEndpoint endpoint, std::string_view body, ParsedRequest* out);
std::optional<ApiError> ParseRequestJson(ApiEndpoint endpoint, const nlohmann::ordered_json& body, ParsedRequest* out);

}  // namespace pdserve::router
