// OpenAI response bodies: full responses, streaming chunks (server-sent events), usage and
// logprobs in the shapes of the OpenAI API for /v1/completions ("text_completion") and
// /v1/chat/completions ("chat.completion" / "chat.completion.chunk"), for one choice or n.
//
// Chat messages carry what the output parser found (generation_session.h): content,
// reasoning_content (DeepSeek's thinking, as vLLM and SGLang name it) and tool_calls (each
// {"id": "call_...", "type": "function", "function": {"name", "arguments"}}); content is null
// when the reply is only tool calls. Usage of chat replies has
// completion_tokens_details.reasoning_tokens.
//
// Streaming: chat streams start with a chunk per choice carrying delta {"role": "assistant"};
// delta chunks follow, each for one choice (its "index"), with the content and
// reasoning_content pieces, and tool_calls pieces: a call's first piece has its index, id,
// type and function.name (arguments ""), later ones the next arguments text; a chunk with an
// empty delta / text and the finish_reason ends each choice; with
// stream_options.include_usage every chunk has "usage": null and one last chunk has
// "choices": [] and the usage of all choices; the stream ends with "data: [DONE]". An error
// after the stream started is sent as `data: {"error": {...}}` followed by [DONE].
//
// Token ids (return_token_ids, vLLM's extension; ReturnTokenIds): completions choices carry
// "prompt_token_ids" and "token_ids" (every generated id, a stop token too); chat replies carry
// "prompt_token_ids" at the top and "token_ids" in each choice. Streaming: a completions choice's
// first chunk and the first chat role chunk carry "prompt_token_ids"; every choice chunk carries
// the "token_ids" that arrived with it (a chunk is sent for ids whose text is still held back).
//
// Thread-safety: a ResponseBuilder belongs to one request (it tracks each choice's completions
// text offset for logprobs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "services/router/api_error.h"
#include "services/router/generation_session.h"
#include "services/router/openai_request.h"
#include "tokenizer/chat_output_parser.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::router {

// Everything one choice produced, for a whole (non-streaming) reply.
struct ChoiceOutput {
  std::string text;                                 // the raw text (completions; chat without parser)
  std::vector<OutputToken> tokens;                  // for logprobs
  std::string finish_reason;
  const tokenizer::ParsedMessage* message = nullptr;  // chat: the parsed message
  std::vector<std::string> tool_call_ids;           // ids of message->tool_calls
  std::vector<int32_t> token_ids;                   // every generated id (return_token_ids)
};

struct UsageCounts {
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  std::optional<uint32_t> reasoning_tokens;  // chat: completion_tokens_details.reasoning_tokens
  uint32_t cached_tokens = 0;                 // prompt_tokens_details.cached_tokens (prefix cache)
};

class ResponseBuilder {
 public:
  ResponseBuilder(ApiEndpoint endpoint, std::string id, std::string model, bool include_usage, bool logprobs,
                  const tokenizer::Tokenizer& tokenizer, uint32_t n = 1);

  // REQUIRES: choices.size() == n.
  nlohmann::json Full(const std::vector<ChoiceOutput>& choices, const UsageCounts& usage);
  // Chat only: the first chunk of choice `index` (delta.role).
  nlohmann::json RoleChunk(uint32_t index) const;
  // A chunk of choice `index` with what `step` produced (chat: step.chat, whose new tool calls
  // are named by `tool_call_ids`; completions: step.text), ending the choice with
  // `finish_reason` when set. Completions logprobs advance the choice's text offset.
  nlohmann::json Chunk(uint32_t index, const SessionStep& step, const std::vector<std::string>& tool_call_ids,
                       const std::optional<std::string>& finish_reason);
  // Whether `step` has anything a chunk would show (text, a delta, or logprobs asked for).
  bool HasOutput(const SessionStep& step) const;
  nlohmann::json UsageChunk(const UsageCounts& usage) const;
  // Turns on the token ids in every body and chunk built from now on.
  void ReturnTokenIds(std::vector<int32_t> prompt_token_ids);

  const std::string& id() const { return id_; }

 private:
  nlohmann::json Logprobs(uint32_t index, const std::vector<OutputToken>& tokens);
  nlohmann::json Base(const char* object) const;
  nlohmann::json Message(const ChoiceOutput& choice) const;

  const ApiEndpoint endpoint_;
  const std::string id_;
  const std::string model_;
  const int64_t created_;
  const bool include_usage_;
  const bool logprobs_;
  const tokenizer::Tokenizer& tokenizer_;
  std::vector<size_t> text_offset_;  // per choice, completions logprobs: offset of the next token's text
  bool return_token_ids_ = false;
  std::vector<int32_t> prompt_token_ids_;
  std::vector<bool> sent_prompt_ids_;  // per choice (completions streams): its first chunk went out
};

nlohmann::json UsageJson(const UsageCounts& usage);
// "data: <json>\n\n"
std::string SseEvent(const nlohmann::json& payload);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace pdserve::router
